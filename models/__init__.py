"""Pyro models, one per file.  Installed as ``pyro_sparse.models``."""

from pyro_sparse.models.ssl_dgm import SparseDGM
from pyro_sparse.models.vae import VAE

__all__ = ["SparseDGM", "VAE"]
