"""Amortized guides (encoders).  Installed as ``pyro_sparse.guides``."""

from pyro_sparse.guides.amortized import AmortizedGuide
from pyro_sparse.guides.amortized_normal import AmortizedNormalGuide
from pyro_sparse.guides.spike_slab import SpikeSlabGuide
from pyro_sparse.guides.thresholded import ThresholdedGuide

__all__ = ["AmortizedGuide", "AmortizedNormalGuide", "SpikeSlabGuide", "ThresholdedGuide"]
