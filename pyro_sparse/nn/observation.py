"""The observation model of a decoder's output, with the likelihood's own parameters for counts."""

import math

import torch
from torch import nn

from pyro_sparse.distributions.likelihoods import COUNT_LIKELIHOODS, check_likelihood, observation

DISPERSIONS = ("gene", "gene-batch")


class ObservationModel(nn.Module):
    r"""
    p(x_i | decoder output) for one likelihood (see
    :func:`~pyro_sparse.distributions.likelihoods.observation`).  For the
    count likelihoods it holds their parameters, fitted by maximum likelihood
    with the networks (as scVI does): the inverse dispersions θ of
    ``negative_binomial`` and ``zinb``, one per gene (``dispersion="gene"``)
    or per gene and batch (``"gene-batch"``), and the zero-inflation logits of
    ``zinb``, one per gene.  The library size is the offset: each row's total
    count, or the observed ``library`` given with the data (a
    ``size_factor_key``).

    :param str likelihood: a name in ``LIKELIHOODS``.
    :param int num_features: G.
    :param int num_batches: categories of the batch covariate, whose one-hot
        block leads the covariates (1 without one).
    :param str dispersion: ``"gene"`` or ``"gene-batch"``.
    """

    def __init__(self, likelihood, num_features, num_batches=1, dispersion="gene"):
        super().__init__()
        self.likelihood = check_likelihood(likelihood)
        if dispersion not in DISPERSIONS:
            raise ValueError(f"dispersion must be one of {DISPERSIONS}, got {dispersion!r}")
        if dispersion == "gene-batch" and num_batches == 1:
            raise ValueError("dispersion='gene-batch' needs a batch covariate (batch_key)")
        self.num_batches, self.per_batch = num_batches, dispersion == "gene-batch"
        if likelihood in ("negative_binomial", "zinb"):
            rows = num_batches if self.per_batch else 1
            # θ = 10 to start: over-dispersed, but not far from Poisson for the low counts of most genes.
            self.log_inverse_dispersion = nn.Parameter(torch.full((rows, num_features), math.log(10.0)))
        if likelihood == "zinb":
            self.zero_logits = nn.Parameter(torch.full((num_features,), -3.0))

    @property
    def counts(self):
        """Whether the likelihood models raw counts with a library-size offset."""
        return self.likelihood in COUNT_LIKELIHOODS

    def log_library(self, x, library=None):
        """log of each row's library size: the observed one, or the row's total count (before any subsampling)."""
        return (x.sum(-1) if library is None else library).log()

    def inverse_dispersion(self, covariates=None):
        """θ: (G,), or (B, G) per row's batch with ``dispersion="gene-batch"``."""
        log_theta = self.log_inverse_dispersion
        if not self.per_batch:
            return log_theta[0].exp()
        batch = covariates[..., : self.num_batches].argmax(-1)
        return log_theta[batch].exp()

    def forward(self, output, noise_variance=None, log_library=None, covariates=None, features=None):
        """The distribution of x (event shape (G,) or, with ``features``, that subset)."""
        if not self.counts:
            return observation(self.likelihood, output, noise_variance)
        theta = zero_logits = None
        if self.likelihood != "poisson":
            theta = self.inverse_dispersion(covariates)
            theta = theta if features is None else theta[..., features]
        if self.likelihood == "zinb":
            zero_logits = self.zero_logits if features is None else self.zero_logits[features]
        return observation(self.likelihood, output, log_library=log_library, inverse_dispersion=theta,
                           zero_logits=zero_logits)
