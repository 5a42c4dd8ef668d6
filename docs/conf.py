"""Sphinx configuration of the pyro_sparse documentation (``make docs``)."""

import os
import sys

# The package is installed in the venv (editable); the path makes the build
# work from a plain checkout too.
sys.path.insert(0, os.path.abspath(".."))

from pyro_sparse import __version__  # noqa: E402

project = "pyro_sparse"
author = "pyro_sparse maintainers"
copyright = "2026, pyro_sparse maintainers"
version = release = __version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
]

# Docstrings use reST field lists (:param x:), so no napoleon.
autodoc_member_order = "bysource"
autodoc_default_options = {"show-inheritance": False}
autodoc_typehints = "signature"
autoclass_content = "class"

exclude_patterns = ["_build", "tutorials/*.py"]
templates_path = []
html_static_path = []

html_theme = "furo"
html_title = f"pyro_sparse {release}"
pygments_style = "sphinx"

# The tutorials are plain scripts included with literalinclude; the test suite
# (tests/test_docs.py) runs them, so the docs never show code that fails.
