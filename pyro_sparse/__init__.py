"""pyro_sparse: sparse deep generative models in Pyro."""

__version__ = "0.1.0"

from pyro_sparse.api import load, train  # noqa: E402
from pyro_sparse.fitted import FittedModel  # noqa: E402
from pyro_sparse.infer.config import Checkpointing, Hardware, Optimization, Schedule  # noqa: E402
from pyro_sparse.interop.sklearn import OIVAE, VAE, VSC, SparseVAE, ThresholdedVSC  # noqa: E402
from pyro_sparse.registry import MODELS  # noqa: E402

__all__ = [
    "FittedModel", "MODELS", "load", "train", "__version__",
    "Optimization", "Schedule", "Checkpointing", "Hardware",
    "SparseVAE", "VAE", "VSC", "ThresholdedVSC", "OIVAE",
]
