"""Priors for sparse deep generative models, as Pyro distributions."""

# Importing spike_and_slab also runs its register_kl(SpikeAndSlab, SpikeAndSlab).
from pyro_sparse.distributions.spike_and_slab import SpikeAndSlab
from pyro_sparse.distributions.spike_slab_lasso import SpikeSlabLasso

__all__ = ["SpikeAndSlab", "SpikeSlabLasso"]
