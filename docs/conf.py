"""Sphinx configuration of the pyro_sparse documentation (``make docs``)."""

# Autodoc imports the installed package (``make docs`` installs it editable
# first): ``pyro_sparse.models`` and ``pyro_sparse.guides`` live in models/ and
# guides/ and exist only through the installation's package mapping.
from pyro_sparse import __version__

project = "pyro_sparse"
author = "pyro_sparse maintainers"
copyright = "2026, pyro_sparse maintainers"
version = release = __version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]

# Most docstrings use reST field lists (:param x:); the array-metric and
# sparse-coding modules use numpydoc sections, which napoleon reads.
napoleon_google_docstring = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autoclass_content = "class"

exclude_patterns = ["_build"]
templates_path = []
html_static_path = []

html_theme = "furo"
html_title = f"pyro_sparse {release}"

# The tutorials (tutorials/*.py) are plain scripts shown with literalinclude;
# tests/test_docs.py runs them, and the README's python blocks.
