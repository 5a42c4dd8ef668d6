"""pyro_sparse: sparse deep generative models in Pyro."""

from pyro_sparse.api import load, train
from pyro_sparse.fitted import FittedModel
from pyro_sparse.infer.config import Checkpointing, Hardware, Optimization, Schedule
from pyro_sparse.interop.sklearn import OIVAE, VAE, VSC, SparseVAE, ThresholdedVSC, choose_latent_dim
from pyro_sparse.registry import MODELS
from pyro_sparse.version import __version__

__all__ = [
    "FittedModel", "MODELS", "load", "train", "__version__",
    "Optimization", "Schedule", "Checkpointing", "Hardware",
    "SparseVAE", "VAE", "VSC", "ThresholdedVSC", "OIVAE", "choose_latent_dim",
]
