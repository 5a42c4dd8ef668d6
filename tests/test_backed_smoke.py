"""
``benchmarks/backed_data.py --quick`` end to end: training from a backed
.h5ad keeps up with training in memory in the same run, and holds a small
part of the file in memory (blocks and windows are shrunk so that the
200,000-cell file is many windows).
"""

import json
import math
import os
import subprocess
import sys

import pytest

pytest.importorskip("anndata")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_backed_data_quick(tmp_path):
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", "backed_data.py"), "--quick", "--out",
         str(tmp_path / "backed_data_quick")],
        cwd=REPO, env=environment, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "backed_data_quick.md").stat().st_size > 0
    results = json.loads((tmp_path / "backed_data_quick.json").read_text())["results"]
    backed, memory = results["backed"], results["memory"]
    in_memory = sum(run["throughput"] for run in memory) / len(memory)
    # A check for a broken reader (rows re-read, the file read whole), not the throughput target (0.8x, measured
    # by the benchmark itself): the suite's other worker shares the cores and slows either run by chance.
    assert backed["throughput"] >= 0.2 * in_memory, (backed["throughput"], in_memory)
    # The in-memory run holds a tenth of the cells; reading the whole file into memory would add
    # about its stored bytes to the backed run's growth after opening the file (obs, all cells, in both runs).
    growth = {run["kind"]: run["peak_rss"] - run["rss_after_open"] for run in (backed, memory[0])}
    assert growth["backed"] <= growth["memory"] + 0.5 * backed["stored_bytes"], (growth, backed["stored_bytes"])
    # The streaming pass reads the row pointers and every value once, an epoch every value once.
    assert backed["bytes_first_pass"] <= 1.1 * backed["stored_bytes"]
    assert backed["bytes_epoch"] == backed["stored_bytes"]
    reading = results["reading"]
    assert all(entry["rows_per_second"] > reading["random_rows"]["rows_per_second"] for entry in reading["blocks"])
    assert all(math.isfinite(entry["variance_ratio"]) for entry in reading["blocks"])
