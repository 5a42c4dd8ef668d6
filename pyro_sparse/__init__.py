"""pyro_sparse: sparse deep generative models in Pyro."""

__version__ = "0.1.0"

from pyro_sparse.api import FittedModel, load, train  # noqa: E402
from pyro_sparse.estimators import OIVAE, VAE, VSC, SparseVAE, ThresholdedVSC  # noqa: E402
from pyro_sparse.registry import MODELS  # noqa: E402

__all__ = [
    "FittedModel", "MODELS", "load", "train", "__version__",
    "SparseVAE", "VAE", "VSC", "ThresholdedVSC", "OIVAE",
]
