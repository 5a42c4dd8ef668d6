"""pyro_sparse: sparse deep generative models in Pyro."""

import importlib.util
import os

# models/ and guides/ sit beside this folder in the source tree and are installed as pyro_sparse.models and
# pyro_sparse.guides; Python started in a checkout's root finds the bare source folder before an installed copy.
if importlib.util.find_spec("pyro_sparse.models") is None:
    raise ImportError(
        f"pyro_sparse was imported from {os.path.dirname(os.path.abspath(__file__))}, a source folder whose models/ "
        "and guides/ are only found once installed: install it with `pip install -e .` in the checkout, or start "
        "Python outside the checkout's root"
    )

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
