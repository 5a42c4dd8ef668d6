"""Priors of model sites that carry parameters or fitting hooks, built on :mod:`pyro_sparse.distributions`."""

from pyro_sparse.priors.dictionary import (
    LinearGenerator,
)
from pyro_sparse.priors.gene_sets import (
    GeneSetPrior,
    align_gene_sets,
    read_gmt,
)
from pyro_sparse.priors.group_lasso import (
    GroupLassoPrior,
    group_soft_threshold,
)
from pyro_sparse.priors.horseshoe import (
    HorseshoePrior,
)
from pyro_sparse.priors.latent import (
    CorrelatedNormalPrior,
    DistributionPrior,
    LatentPrior,
    NormalPrior,
    PseudoInputPrior,
    SpikeSlabPrior,
    ThresholdedLaplacePrior,
    ThresholdedNormalPrior,
    ThresholdedPrior,
)
from pyro_sparse.priors.noise import (
    DEFAULT_NOISE_NU,
    calibrate_noise_prior,
    calibrated_noise_xi,
    fixed_noise_variance,
    initial_noise_variance,
    noise_prior_options,
    sample_noise_variance,
)
from pyro_sparse.priors.site import (
    DistributionSitePrior,
    SitePrior,
)
from pyro_sparse.priors.ssl import (
    SpikeSlabLassoPrior,
)

#: Priors of the codes z by name; each class's keyword arguments are the
#: prior's hyperparameters, which train() accepts next to the model's.
LATENT_PRIORS = {
    "normal": NormalPrior,
    "correlated": CorrelatedNormalPrior,
    "spike_slab": SpikeSlabPrior,
    "pseudo_inputs": PseudoInputPrior,
    "thresholded_laplace": ThresholdedLaplacePrior,
    "thresholded_normal": ThresholdedNormalPrior,
}

#: Priors of a decoder mask W (G, K) by name, with their hyperparameters likewise.
MASK_PRIORS = {"ssl": SpikeSlabLassoPrior, "horseshoe": HorseshoePrior, "gene_sets": GeneSetPrior}

__all__ = [
    "CorrelatedNormalPrior",
    "DEFAULT_NOISE_NU",
    "calibrated_noise_xi",
    "fixed_noise_variance",
    "LATENT_PRIORS",
    "MASK_PRIORS",
    "DistributionPrior",
    "DistributionSitePrior",
    "GeneSetPrior",
    "GroupLassoPrior",
    "HorseshoePrior",
    "LatentPrior",
    "LinearGenerator",
    "NormalPrior",
    "PseudoInputPrior",
    "SitePrior",
    "SpikeSlabLassoPrior",
    "SpikeSlabPrior",
    "ThresholdedLaplacePrior",
    "ThresholdedNormalPrior",
    "ThresholdedPrior",
    "align_gene_sets",
    "calibrate_noise_prior",
    "group_soft_threshold",
    "initial_noise_variance",
    "noise_prior_options",
    "read_gmt",
    "sample_noise_variance",
]
