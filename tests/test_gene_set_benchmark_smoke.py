"""benchmarks/gene_set_prior.py runs end to end in its --quick setting and writes finite results."""

import json
import math
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_gene_set_prior_quick(tmp_path):
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    completed = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", "gene_set_prior.py"), "--quick", "--first-seed", "2", "--lambda0", "30",
         "--out", str(tmp_path)],
        cwd=REPO, env=environment, capture_output=True, text=True, timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    text = (tmp_path / "gene_set_prior_quick.md").read_text()
    assert not re.search(r"\b(nan|inf)\b", text.lower()), text
    results = json.loads((tmp_path / "gene_set_prior_quick.json").read_text())
    assert {run["prior"] for run in results["runs"]} == {"gene_sets", "ssl"}
    assert results["seeds"] == [2] and results["settings"]["lambda0"] == 30.0
    for run in results["runs"]:
        assert 0 <= run["f_sets"] <= 1 and math.isfinite(run["loss"]), run
        assert run["f_annotation"] == 0.8, run  # the generator's 20 % wrong, 20 % missing
    gene_sets = next(run for run in results["runs"] if run["prior"] == "gene_sets")
    assert gene_sets["flagged_wrong"] <= gene_sets["flagged"] and gene_sets["wrong"] > 0
