"""Amortized guides (encoders).  Installed as ``pyro_sparse.guides``."""

from pyro_sparse.distributions import SpikeAndSlab
from pyro_sparse.guides.amortized import AmortizedGuide
from pyro_sparse.guides.amortized_normal import AmortizedNormalGuide
from pyro_sparse.guides.spike_slab import SpikeSlabGuide
from pyro_sparse.guides.thresholded import ThresholdedGuide

#: The guide class of each latent prior's family (``LatentPrior.guide_family``).
GUIDES = {"normal": AmortizedNormalGuide, "spike_slab": SpikeSlabGuide, "thresholded": ThresholdedGuide}

#: The guide family of a user's distribution, by type (subclasses included);
#: any other distribution gets the Gaussian guide.  Add to it to pair a new
#: prior with another guide, e.g. ``GUIDE_FAMILIES[MySpikeAndT] = "spike_slab"``.
GUIDE_FAMILIES = {SpikeAndSlab: "spike_slab"}

__all__ = ["GUIDES", "GUIDE_FAMILIES", "AmortizedGuide", "AmortizedNormalGuide", "SpikeSlabGuide", "ThresholdedGuide"]
