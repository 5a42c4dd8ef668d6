"""Priors for sparse deep generative models, as Pyro distributions."""

from pyro_sparse.distributions.spike_slab_lasso import SpikeSlabLasso

__all__ = ["SpikeSlabLasso"]
