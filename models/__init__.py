"""Pyro models, one per file.  Installed as ``pyro_sparse.models``."""

from pyro_sparse.models.oi_vae import OIVAE
from pyro_sparse.models.ssl_dgm import SparseDGM
from pyro_sparse.models.tvsc import TVSC
from pyro_sparse.models.vae import VAE
from pyro_sparse.models.vsc import VSC

__all__ = ["OIVAE", "SparseDGM", "TVSC", "VAE", "VSC"]
