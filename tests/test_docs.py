"""
The documentation's code runs: every tutorial script in ``docs/tutorials/``
and every ```python block of README.md, each in a fresh interpreter with a
time limit, in a temporary directory (the files they write land there).

The README's blocks run in order in one namespace, as a reader would paste
them; a failure's traceback names README.md and the line of the failing
statement.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
TUTORIALS = sorted((DOCS / "tutorials").glob("*.py"))
TIME_LIMIT = 300  # seconds per script; each takes well under a minute of CPU time
# Optional packages a tutorial imports (installed by `make test`); without them it is skipped.
REQUIRES = {"anndata_workflow.py": "anndata"}

# Runs README blocks given as JSON [(first line, code), ...] on stdin, in one
# namespace; padding each block with blank lines makes tracebacks point at the
# README's own line numbers.
RUN_BLOCKS = """
import json, sys
namespace = {"__name__": "__main__"}
for line, code in json.load(sys.stdin):
    exec(compile("\\n" * (line - 1) + code, "README.md", "exec"), namespace)
"""


def _environment():
    # One thread per process: the test suite may run beside other jobs, and
    # small models train fastest on one thread.
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg"}


def _check(result, what):
    if result.returncode != 0:
        pytest.fail(f"{what} failed (exit {result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}")


def readme_python_blocks(text):
    """``(line of the block's first code line, code)`` for each ```python block of a Markdown text."""
    blocks, lines, start = [], text.splitlines(), None
    for number, line in enumerate(lines, start=1):
        if start is None and re.fullmatch(r"```python\s*", line):
            start = number + 1
        elif start is not None and line.strip() == "```":
            blocks.append((start, "\n".join(lines[start - 1:number - 1]) + "\n"))
            start = None
    if start is not None:
        raise ValueError(f"README.md: the ```python block opened on line {start - 1} is never closed")
    return blocks


def test_readme_is_one_page():
    assert len(README.read_text().splitlines()) <= 250


def test_readme_python_blocks_run_in_order(tmp_path):
    blocks = readme_python_blocks(README.read_text())
    assert blocks, "README.md has no ```python blocks"
    result = subprocess.run(
        [sys.executable, "-c", RUN_BLOCKS], input=json.dumps(blocks), capture_output=True, text=True,
        cwd=tmp_path, env=_environment(), timeout=TIME_LIMIT,
    )
    _check(result, "README.md's python blocks")


@pytest.mark.parametrize("script", TUTORIALS, ids=[path.stem for path in TUTORIALS])
def test_tutorial_runs(script, tmp_path):
    if script.name in REQUIRES:
        pytest.importorskip(REQUIRES[script.name])
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=_environment(),
        timeout=TIME_LIMIT,
    )
    _check(result, f"docs/tutorials/{script.name}")


@pytest.mark.parametrize("script", TUTORIALS, ids=[path.stem for path in TUTORIALS])
def test_tutorial_is_in_the_docs(script):
    pages = "\n".join(path.read_text() for path in DOCS.rglob("*.rst"))
    assert f"literalinclude:: {script.name}" in pages or f"literalinclude:: ../tutorials/{script.name}" in pages, (
        f"docs/tutorials/{script.name} is not included in any page of the docs"
    )


def test_readme_block_extraction():
    text = "intro\n```python\na = 1\n```\n\n```bash\nls\n```\n```python\nb = a\n```\n"
    assert readme_python_blocks(text) == [(3, "a = 1\n"), (10, "b = a\n")]
