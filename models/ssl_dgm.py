"""The sparse VAE / sparse deep generative model of Moran, Sridhar, Wang & Blei (TMLR 2022)."""

import warnings

import pyro
import torch
from pyro import poutine
from torch import nn
from torch.distributions import constraints

from pyro_sparse.checks import positive_number
from pyro_sparse.distributions.likelihoods import COUNT_LIKELIHOODS, check_feature_subsample_size
from pyro_sparse.nn import MaskedDecoder, ObservationModel
from pyro_sparse.plates import data_plate
from pyro_sparse.priors import (
    DEFAULT_NOISE_NU,
    NormalPrior,
    SpikeSlabLassoPrior,
    calibrated_noise_xi,
    initial_noise_variance,
    noise_prior_options,
    sample_noise_variance,
)


class SparseDGM(nn.Module):
    r"""
    Sparse DGM (Eq. 1): for data point i and feature j,

    .. math::

        W_{jk} \sim \mathrm{SSL}(\lambda_0, \lambda_1, \eta_k), \quad
        z_i \sim \mathcal N_K(0, \Sigma_z), \quad
        x_{ij} \sim p\big(x \mid f_\theta(w_j \odot z_i)_j\big).

    W is a global site meant to be point-estimated (MAP, Eq. 5); the SSL
    hyperparameters η and E[γ] are EM buffers of ``site_priors["W"]``, updated
    by its hooks between gradient steps (Algorithm 1).  With the Gaussian
    likelihood σ_j² is a global site with the Inverse-Gamma(ν/2, νξ/2) prior
    of Eq. 60.

    :param int num_features: G.
    :param int latent_dim: K.
    :param str likelihood: ``"gaussian"``, ``"multinomial"``, ``"bernoulli"`` or a count likelihood
        (``"poisson"``, ``"negative_binomial"``, ``"zinb"``).
    :param tuple hidden_dims: widths of f_θ's hidden layers (Table 6's three layers of 50; for count
        likelihoods ``train`` defaults to one layer of 50 behind a three-layer encoder,
        ``encoder_hidden_dims``).
    :param mask_prior: the prior of W, a :class:`~pyro_sparse.priors.SitePrior`
        (``train`` builds it from a name: ``"ssl"``, the Spike-and-Slab Lasso
        of Eq. 2 with ``lambda0, lambda1, a, b``, or ``"horseshoe"``, Appendix
        C.4.1); ``None`` for the SSL with the paper's defaults.  The
        SparseVAE-Slab ablation of Appendix C.4.1 is the SSL with
        ``lambda0 == lambda1``: a Lasso prior, E[γ] carries no information,
        and the support is read from the exact zeros of W.
    :param latent_prior: the prior of z, a
        :class:`~pyro_sparse.priors.LatentPrior`; ``None`` for N(0, I_K)
        (Eq. 59; ``train`` builds others from a name, e.g. ``"spike_slab"``
        for codes sparse as well as the mapping).
    :param float beta: weight of the KL term of z (1 is the paper's ELBO).  The
        z site is scaled by β here and must be scaled alike in the guide
        (``kl_weight=beta``; the registry does this), because
        ``TraceMeanField_ELBO`` weighs an analytic KL by the guide's scale.
    :param float noise_nu: ν of the σ² prior.
    :param float noise_xi: ξ of the σ² prior (calibrated from data by ``train``).
    :param int memory_budget_bytes: activation memory of one decoder chunk.
    :param int feature_subsample_size: if set, each training pass decodes and
        scores only this many features, drawn uniformly at random, with their
        log-likelihood scaled by :math:`G/|S|`: an unbiased estimate of the ELBO and
        its gradients at about :math:`|S|/G` of the decoder's cost (the σ² and W
        priors stay global and unscaled).  Evaluation (``model.eval()``) uses
        all features.  Not for the multinomial likelihood, whose softmax
        normaliser couples all features.
    :param float feature_subsample_start_epoch: decode every feature for this
        many epochs, then subsample (the training loop calls :meth:`schedule`
        before each step); ``None``: two epochs after the KL warm-up ends.
        Make it outlast the warm-up: the codes are pruned just after it, and a
        code the sparse decoder drops then rarely comes back (once its column
        of W is exactly zero, W's likelihood gradient there averages to zero).
        For the count likelihoods on 256 or more genes, ``train`` subsamples by
        default: ``max(128, G // 4)`` genes per step (passing
        ``feature_subsample_size=None`` turns it off).  Measured: docs/results/speed.rst,
        "Time to heldout quality".
    :param float feature_subsample_end_fraction: decode every feature again for
        this last fraction of ``max_epochs`` (0: subsample to the end).  The
        :math:`G/|S|`-scaled estimate is unbiased but noisy, and the fit ends where that
        noise leaves it; a few full epochs at the end settle it, as a larger batch
        would.  With ``train``'s default subsampling for counts: 0.1
        (docs/results/single_cell.rst, "Count defaults").
    :param int covariate_dim: C, covariates given with the data (set by ``train``).
    :param int num_batches: categories of the batch covariate (set by ``train``).
    :param str dispersion: ``"gene"`` or ``"gene-batch"``: the inverse
        dispersion of ``negative_binomial`` / ``zinb`` per feature, or per feature and batch.
    :param str decoder_gain: ``"free"`` or ``"fixed"``: whether the scale of f_θ's layers after
        the first is learned, so that W can shrink under its prior while they amplify (ReLU is
        positively homogeneous), or fixed, so that W carries the scale the SSL prior prices
        (:class:`~pyro_sparse.nn.MaskedDecoder`).
    :param str library: ``"observed"`` (the row's total count, or the
        ``size_factor_key`` column) or ``"latent"``: log ℓ_i ~ N(m_b, s_b²) per
        batch, inferred by the guide (:class:`~pyro_sparse.nn.ObservationModel`).

    Covariates enter the decoder's first layer unmasked: they are not factors.
    """

    # Place a schedule as a fraction of max_epochs (see check_schedule): a resumed run may change them.
    schedule_options = ("feature_subsample_end_fraction",)

    def __init__(
        self,
        num_features,
        latent_dim=5,
        likelihood="gaussian",
        hidden_dims=(50, 50, 50),
        mask_prior=None,
        latent_prior=None,
        beta=1.0,
        noise_nu=DEFAULT_NOISE_NU,
        noise_xi=1.0,
        memory_budget_bytes=2**30,
        feature_subsample_size=None,
        feature_subsample_start_epoch=None,
        feature_subsample_end_fraction=0.0,
        covariate_dim=0,
        num_batches=1,
        dispersion="gene",
        library="observed",
        decoder_gain="free",
    ):
        super().__init__()
        self.num_features, self.latent_dim = num_features, latent_dim
        self.observation = ObservationModel(likelihood, num_features, num_batches, dispersion, library)
        self.likelihood = self.observation.likelihood
        self.feature_subsample_size = check_feature_subsample_size(
            feature_subsample_size, num_features, self.likelihood
        )
        if feature_subsample_start_epoch is not None:
            if not feature_subsample_start_epoch >= 0:
                raise ValueError(
                    f"feature_subsample_start_epoch must be >= 0, got {feature_subsample_start_epoch!r}"
                )
            if feature_subsample_size is None:
                raise ValueError("feature_subsample_start_epoch needs feature_subsample_size")
            feature_subsample_start_epoch = float(feature_subsample_start_epoch)
        self.feature_subsample_start_epoch = feature_subsample_start_epoch
        if not 0.0 <= feature_subsample_end_fraction < 1.0:
            raise ValueError(
                f"feature_subsample_end_fraction must be in [0, 1), got {feature_subsample_end_fraction!r}"
            )
        if feature_subsample_end_fraction > 0 and feature_subsample_size is None:
            raise ValueError("feature_subsample_end_fraction needs feature_subsample_size")
        self.feature_subsample_end_fraction = float(feature_subsample_end_fraction)
        self.feature_subsample_end_epoch = float("inf")  # set from max_epochs by check_schedule()
        self.epoch = 0.0  # of training, set by schedule()
        self._step_subset = None  # the subset of the current step, kept by schedule() (outside training: None)
        self.beta = positive_number("beta", beta)
        self.noise_nu, self.noise_xi = noise_prior_options(noise_nu, noise_xi)
        self.hidden_dims = tuple(hidden_dims)
        self.decoder = MaskedDecoder(num_features, latent_dim, hidden_dims, memory_budget_bytes,
                                     covariate_dim=covariate_dim, gain=decoder_gain)
        mask_prior = SpikeSlabLassoPrior(num_features, latent_dim) if mask_prior is None else mask_prior
        if self.feature_subsample_size is not None and hasattr(mask_prior, "gradient_averaging"):
            # A row of W gets a likelihood gradient on |S|/G of the steps,
            # G/|S| times larger: unbiased, but with up to G/|S| times the
            # variance.  The zero test averages over G/|S| times more steps,
            # so its noise (and the rate of false escapes from zero) stays
            # that of full training.  Set, not multiplied: a prior given twice is not scaled twice.
            mask_prior.gradient_averaging_scale = self.feature_subsample_size / num_features
        self.site_priors = nn.ModuleDict({"W": mask_prior})
        self.latent_prior = NormalPrior(latent_dim) if latent_prior is None else latent_prior

    # W is a global (G, K) site: a vectorised particle dim on it would not fit
    # the masked decoder, so particles are drawn one pass at a time.
    vectorized_particles = False

    @classmethod
    def data_defaults(cls, summary, likelihood, hyper):
        """
        Hyperparameters calibrated from the training data: ξ of the σ² prior
        (Appendix C.2); for counts of many genes, feature subsampling.
        """
        if likelihood in COUNT_LIKELIHOODS and "feature_subsample_size" not in hyper and summary.num_features >= 256:
            return {"feature_subsample_end_fraction": 0.1, **hyper,
                    "feature_subsample_size": max(128, summary.num_features // 4)}
        if likelihood != "gaussian":
            return hyper
        return calibrated_noise_xi(hyper, summary.feature_variances)

    def guide_options(self):
        """What the guide must share with this model: the z site's scale."""
        return {"kl_weight": self.beta}

    def point_estimate_sites(self, feature_variances):
        """Global sites to point-estimate: name -> (initial value, support)."""
        sites = {"W": (torch.ones(self.num_features, self.latent_dim), constraints.real)}
        if self.likelihood == "gaussian":
            sites["sigma2"] = initial_noise_variance(feature_variances)
        return sites

    def forward(self, x, num_data=None, covariates=None, library=None):
        mask = pyro.sample("W", self.site_priors["W"].distribution())
        noise_variance = None
        if self.likelihood == "gaussian":
            noise_variance = sample_noise_variance(self.num_features, self.noise_nu, self.noise_xi, x)
        self.latent_prior.sample_globals(x)
        with data_plate(x, num_data):
            z = self.latent_prior.sample(x, self.beta)
            features = self.visited_features(x.device)
            output = self.decoder(z, mask, features, covariates)
            log_library = self.observation.log_library(x, library, covariates) if self.observation.counts else None
            if features is not None:
                x = x[..., features]
                noise_variance = None if noise_variance is None else noise_variance[features]
            # Each visited feature's term counts G/|S| times: over uniform
            # random subsets S the expectation is the sum over all G features.
            with poutine.scale(scale=self.num_features / x.shape[-1]):
                pyro.sample("x", self.observation(output, noise_variance, log_library, covariates, features), obs=x)

    def check_schedule(self, kl_warmup_epochs, max_epochs):
        """
        Before training: start feature subsampling two epochs after the KL
        warm-up unless told otherwise, warn when told to start before it ends,
        and end it ``feature_subsample_end_fraction`` of ``max_epochs`` before
        the end.  Returns that end epoch where it comes before the run's end.
        """
        self.feature_subsample_end_epoch = max_epochs * (1.0 - self.feature_subsample_end_fraction)
        if self.feature_subsample_start_epoch is None:
            self.feature_subsample_start_epoch = kl_warmup_epochs + 2.0
        elif self.feature_subsample_size is not None and self.feature_subsample_start_epoch < kl_warmup_epochs:
            warnings.warn(
                f"feature subsampling starts at epoch {self.feature_subsample_start_epoch:g}, before the KL warm-up "
                f"ends (epoch {kl_warmup_epochs:g}): codes the sparse decoder drops as they are pruned rarely come "
                "back; set feature_subsample_start_epoch at or after kl_warmup_epochs (a few epochs after is safer)",
                stacklevel=5,
            )
        if self.feature_subsample_size is not None and self.feature_subsample_end_fraction > 0:
            return {"feature_subsample_end_epoch": self.feature_subsample_end_epoch}
        return {}  # no end before the run's own: nothing a longer run would move

    def schedule(self, epoch, iteration):
        """
        Called by the training loop before each step with the fractional
        epoch.  Every particle pass of the step visits the same feature subset:
        a max-particle ELBO over passes on different subsets would pick the
        subset that scores best, not the best particle.
        """
        self.epoch = epoch
        self._step_subset = []  # filled by the step's first pass

    def visited_features(self, device):
        """
        The features whose likelihood terms this pass evaluates: a uniform
        random subset of ``feature_subsample_size`` while training from
        ``feature_subsample_start_epoch`` until the last
        ``feature_subsample_end_fraction`` of the epochs, ``None`` (all G)
        otherwise, so evaluation always uses every feature.
        """
        start = self.feature_subsample_start_epoch or 0.0  # None until train() plans it: from the start
        subsampling = (self.feature_subsample_size is not None
                       and start <= self.epoch < self.feature_subsample_end_epoch)
        if not self.training or not subsampling:
            return None
        if self._step_subset:
            return self._step_subset[0]
        features = torch.randperm(self.num_features, device=device)[: self.feature_subsample_size]
        if self._step_subset is not None:
            self._step_subset.append(features)
        return features
