"""Priors for sparse deep generative models, as Pyro distributions."""

# Importing these modules also runs their register_kl calls.
from pyro_sparse.distributions import expanded_kl, gaussian_kl  # noqa: F401
from pyro_sparse.distributions.group_lasso import GroupLasso
from pyro_sparse.distributions.pseudo_input_prior import SelectedSpikeAndSlab
from pyro_sparse.distributions.spike_and_slab import SpikeAndSlab
from pyro_sparse.distributions.spike_slab_lasso import SpikeSlabLasso
from pyro_sparse.distributions.thresholded import (
    ThresholdedLaplace,
    ThresholdedNormal,
)

__all__ = [
    "GroupLasso",
    "SelectedSpikeAndSlab",
    "SpikeAndSlab",
    "SpikeSlabLasso",
    "ThresholdedLaplace",
    "ThresholdedNormal",
]
