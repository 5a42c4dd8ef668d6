"""The observation model of a decoder's output, with the likelihood's own parameters for counts."""

import math

import pyro
import pyro.distributions as dist
import torch
from torch import nn

from pyro_sparse.distributions.likelihoods import COUNT_LIKELIHOODS, check_likelihood, observation

DISPERSIONS = ("gene", "gene-batch")
LIBRARIES = ("observed", "latent")


def check_library_source(likelihood, latent, observed):
    """
    An observed library size (``size_factor_key``) is the offset of the count
    likelihoods only, and it and a latent one exclude each other.
    """
    if observed and likelihood not in COUNT_LIKELIHOODS:
        raise ValueError(f"the data give library sizes (size_factor_key), which only the count likelihoods "
                         f"{list(COUNT_LIKELIHOODS)} use; the {likelihood} likelihood would ignore them: register "
                         "the data without size_factor_key")
    if latent and observed:
        raise ValueError("library='latent' infers each cell's library size, but the data also give one "
                         "(size_factor_key): drop one of them")


class ObservationModel(nn.Module):
    r"""
    p(x_i | decoder output) for one likelihood (see
    :func:`~pyro_sparse.distributions.likelihoods.observation`).  For the
    count likelihoods it holds their parameters, fitted by maximum likelihood
    with the networks (as scVI does): the inverse dispersions θ of
    ``negative_binomial`` and ``zinb``, one per gene (``dispersion="gene"``)
    or per gene and batch (``"gene-batch"``), and the zero-inflation logits of
    ``zinb``, one per gene.  The library size ℓ_i is the offset: each row's
    total count, or the observed ``library`` given with the data (a
    ``size_factor_key``); or, with ``library="latent"``, a local latent
    site ``log_library`` ~ N(m_b, s_b²) per batch b, as scVI's
    ``use_observed_lib_size=False`` (Lopez et al. 2018), with the posterior
    given by the guide.  scVI fixes m_b and s_b at the batch's mean and sd
    of log total counts; here they are fitted with the networks (empirical
    Bayes), m_b starting at the log of the mean library.  The KL warm-up
    leaves the site's KL at full weight, as scVI does.

    :param str likelihood: a name in ``LIKELIHOODS``.
    :param int num_features: G.
    :param int num_batches: categories of the batch covariate, whose one-hot
        block leads the covariates (1 without one).
    :param str dispersion: ``"gene"`` or ``"gene-batch"``.
    :param str library: ``"observed"`` or ``"latent"`` (count likelihoods only).
    """

    def __init__(self, likelihood, num_features, num_batches=1, dispersion="gene", library="observed"):
        super().__init__()
        self.likelihood = check_likelihood(likelihood)
        if dispersion not in DISPERSIONS:
            raise ValueError(f"dispersion must be one of {DISPERSIONS}, got {dispersion!r}")
        if library not in LIBRARIES:
            raise ValueError(f"library must be one of {LIBRARIES}, got {library!r}")
        if library == "latent" and self.likelihood not in COUNT_LIKELIHOODS:
            raise ValueError(f"library='latent' is for the count likelihoods {COUNT_LIKELIHOODS}, not "
                             f"likelihood={self.likelihood!r}")
        self.latent_library = library == "latent"
        if self.latent_library:
            # m_b starts at 0 here; train moves it to the log of the mean library (start_library).
            self.library_loc = nn.Parameter(torch.zeros(num_batches))
            self.library_log_scale = nn.Parameter(torch.zeros(num_batches))
        if dispersion != "gene" and self.likelihood not in ("negative_binomial", "zinb"):
            raise ValueError(f"dispersion={dispersion!r} is for the negative_binomial and zinb likelihoods, not "
                             f"likelihood={self.likelihood!r}")
        if dispersion == "gene-batch" and num_batches == 1:
            raise ValueError("dispersion='gene-batch' needs a batch covariate (batch_key) with at least two categories")
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

    def log_library(self, x, library=None, covariates=None):
        """
        log ℓ_i of each row (called inside the data plate): the observed
        library, or the row's total count (before any subsampling); with a
        latent library the sample of the site ``log_library``.
        """
        if not self.latent_library:
            return (x.sum(-1) if library is None else library).log()
        check_library_source(self.likelihood, self.latent_library, library is not None)
        batch = self._batch(covariates, x)
        prior = dist.Normal(self.library_loc[batch], self.library_log_scale[batch].exp())
        return pyro.sample("log_library", prior, infer={"kl_warmup": False})

    @torch.no_grad()
    def start_library(self, log_mean_library):
        """Start the latent library's prior mean m_b at the log of the training data's mean library."""
        self.library_loc.fill_(log_mean_library)

    def _batch(self, covariates, x=None):
        """Each row's batch index (0 for every row without a batch covariate)."""
        if self.num_batches == 1:
            return torch.zeros(x.shape[:-1], dtype=torch.long, device=x.device)
        return covariates[..., : self.num_batches].argmax(-1)

    def inverse_dispersion(self, covariates=None):
        """θ: (G,), or (B, G) per row's batch with ``dispersion="gene-batch"``."""
        log_theta = self.log_inverse_dispersion
        if not self.per_batch:
            return log_theta[0].exp()
        return log_theta[self._batch(covariates)].exp()

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
