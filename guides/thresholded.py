"""The inference network of thresholded variational sparse coding (Fallah & Rozell 2022)."""

import math
import warnings

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from torch.nn import functional

from pyro_sparse.checks import positive_number
from pyro_sparse.distributions.thresholded import ESTIMATORS, code_distribution
from pyro_sparse.guides.amortized import AmortizedGuide

# A new amortised gate starts open, P(z != 0) = sigmoid(2) ≈ 0.88 (see ThresholdedGuide).
_INITIAL_GATE_LOGIT = 2.0
# The threshold factor ω while the codes are held dense: with an amortised λ/b ≤ softplus(15) the
# probability of being on stays above 0.98 (Laplace base), and the thresholded laws stay proper (λ > 0).
_DENSE_THRESHOLD_FACTOR = 1e-3


class ThresholdedGuide(AmortizedGuide):
    r"""
    q_φ(z | x): a Laplace or Gaussian base with shift μ_φ(x) and scale from
    log b_φ(x) (Appendix B), whose draws pass through the shifted
    soft-threshold, with the threshold

    * ``amortized_threshold``: λ_φ(x) = b_φ(x) softplus(-ℓ_φ(x)), one more
      encoder output ℓ per coordinate, so that λ/b, and with it the
      probability γ = P(z ≠ 0) of being on, is set by ℓ alone (γ = sigmoid(ℓ)
      for the Laplace base, erfc(softplus(-ℓ)/√2) for the Gaussian) and the
      noise b can be small for a code that is on;
    * ``learn_threshold``: λ ~ q_φ(λ | x) = Gamma(α_φ(x), β_φ(x)), pathwise,
      its log-parameters clamped to [log 1e-6, log 1e6] as in the paper;
    * otherwise the prior's λ0.

    Draws use ``estimator`` (:meth:`ThresholdedDistribution.rsample`: ``"jump"``
    by default, ``"straight_through"`` for the paper's Eq. 4, ``"subgradient"``).
    The scale's output bias starts at log ``prior_scale`` and an amortised
    gate's at ℓ = 2 (γ ≈ 0.88): codes start on and about as noisy as the
    prior, so encoder and generator learn from dense codes first and the KL
    (with its warm-up) switches off the ones it does not pay for, the role
    the λ warm-up plays for FISTA (Appendix D). A gate that starts at the
    prior's γ0 ≈ 0.1 with a random generator instead sits on a plateau for
    several epochs: its jump gradient is proportional to μ, which only
    learns while the code is on.

    For the Laplace base the scale can be multiplied by the warm-up ω of
    Appendix B, which starts at ``scale_warmup_start`` and grows by
    ``scale_warmup_rate`` per iteration up to 1 (the paper: 0.1 and 2e-4).
    It is off by default (start 1): with the jump estimator it only delays
    learning (results of ``benchmarks/sparse_coding_patches.py``).

    With ``threshold_warmup_epochs`` > 0 the codes' threshold is multiplied by
    a factor ω (1e-3: with the amortised threshold every code is then on with
    probability > 0.98) until the KL warm-up ends, then ω rises
    linearly to 1 over that many epochs (``None``: as many as the KL warm-up
    lasts): a continuation in λ like FISTA's
    (Appendix D), so that the generator learns from every code before any
    can be switched off.  An exactly-zero code is absorbing: its generator
    column gets no likelihood gradient, so a sparse mask prunes it and it
    never returns.  Inside ``ssl_dgm`` codes switched off within the first
    5-20 epochs cost seeds whole factors (docs: TVSC results, "Thresholded
    codes inside the sparse VAE"), where the warm-up keeps more factors but
    leaves almost no code off, so it is an option: 0 (the default) is the
    paper's schedule.  Evaluation (``eval()``) always uses the full threshold.

    The base's scale is clamped at ``max_scale_ratio`` × ``prior_scale``
    (default e, the bound of :class:`~pyro_sparse.guides.SpikeSlabGuide`'s
    slab): a posterior wider than its prior only adds noise and KL.  Without
    the bound, the exp of a linear output gave one high-contrast 16×16 patch
    a scale of 432 where the prior's is 0.1; its draws of \|z\| ≈ 1,000
    wrecked the loss (docs: TVSC results).  ``None``: only the clamp of the
    log-scale at ±15.

    :meth:`posterior` (used for codes) takes a learned λ at its posterior
    mean α/β.
    """

    # Model files written before the bound existed clamped the log-scale at 15 only.
    former_defaults = {**AmortizedGuide.former_defaults, "max_scale_ratio": None, "threshold_warmup_epochs": 0.0}
    # The scale warm-up is the Laplace base's (train refuses it with the Gaussian's).
    option_conditions = {**{name: ("latent_prior", ("thresholded_laplace",))
                            for name in ("scale_warmup_start", "scale_warmup_rate")},
                         # Plain codes (threshold=None) have no threshold to estimate through or warm up.
                         **{name: ("threshold", "given") for name in ("estimator", "threshold_warmup_epochs")}}

    def __init__(
        self,
        num_features,
        latent_dim,
        hidden_dims=(256,),
        point_estimates=None,
        log1p_input=False,
        kl_weight=1.0,
        base="laplace",
        threshold=0.25,
        learn_threshold=False,
        amortized_threshold=False,
        threshold_kl_weight=None,
        prior_scale=0.1,
        estimator="jump",
        scale_warmup_start=1.0,
        scale_warmup_rate=2e-4,
        threshold_warmup_epochs=0.0,
        max_scale_ratio=math.e,
        network="mlp",
        covariate_dim=0,
        batch_norm=False,
        latent_library=False,
    ):
        if learn_threshold and amortized_threshold:
            raise ValueError("learn_threshold and amortized_threshold exclude each other")
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
        outputs = 2 + 2 * bool(learn_threshold) + bool(amortized_threshold)
        super().__init__(
            num_features, latent_dim, outputs, hidden_dims, point_estimates, log1p_input, kl_weight, network,
            covariate_dim=covariate_dim, batch_norm=batch_norm, latent_library=latent_library,
        )
        prior_scale = positive_number("prior_scale", prior_scale)
        if not 0 < scale_warmup_start <= 1 or scale_warmup_rate < 0:
            raise ValueError("need 0 < scale_warmup_start <= 1 and scale_warmup_rate >= 0")
        self.base, self.learn_threshold = base, bool(learn_threshold)
        self.amortized_threshold = bool(amortized_threshold)
        self.threshold = None if threshold is None else float(threshold)
        if threshold_kl_weight is not None and not (
                isinstance(threshold_kl_weight, (int, float)) and 0 < threshold_kl_weight < math.inf):
            raise ValueError(f"threshold_kl_weight must be a positive number or None, got {threshold_kl_weight!r}")
        # β2 = β1 / 10 unless given (Fallah & Rozell 2022, Appendix D); the prior's threshold_beta.
        self.threshold_kl_weight = self.kl_weight / 10 if threshold_kl_weight is None else float(threshold_kl_weight)
        self.estimator = estimator
        self.scale_warmup_start, self.scale_warmup_rate = float(scale_warmup_start), float(scale_warmup_rate)
        if threshold_warmup_epochs is not None and not (
                isinstance(threshold_warmup_epochs, (int, float)) and 0 <= threshold_warmup_epochs < math.inf):
            raise ValueError(f"threshold_warmup_epochs must be a number >= 0 or None, got {threshold_warmup_epochs!r}")
        self.threshold_warmup_epochs = None if threshold_warmup_epochs is None else float(threshold_warmup_epochs)
        # Where the ramp starts and how long it lasts, set by check_schedule from the KL warm-up.
        self.threshold_warmup_start_epoch = 0.0
        self.threshold_ramp_epochs = self.threshold_warmup_epochs or 0.0
        self.threshold_warmup = 1.0  # ω, set by schedule() while training
        if max_scale_ratio is not None and not max_scale_ratio > 0:
            raise ValueError(f"max_scale_ratio must be positive (or None), got {max_scale_ratio!r}")
        self.max_scale_ratio = None if max_scale_ratio is None else float(max_scale_ratio)
        bound = 15.0 if max_scale_ratio is None else math.log(prior_scale * self.max_scale_ratio)
        self.max_log_scale = min(15.0, bound)
        self._initialise_output_biases(prior_scale)
        # A buffer, so a fitted or loaded guide evaluates with the value its
        # training ended on (1 for a fresh guide used on its own).
        self.register_buffer("scale_warmup", torch.tensor(1.0))

    @torch.no_grad()
    def _initialise_output_biases(self, prior_scale):
        last = [m for m in self.encoder.modules() if isinstance(m, torch.nn.Linear)][-1]
        K = self.latent_dim
        last.bias[K:2 * K].add_(math.log(prior_scale))
        if self.amortized_threshold:
            last.bias[2 * K:3 * K].add_(_INITIAL_GATE_LOGIT)

    def check_schedule(self, kl_warmup_epochs, max_epochs):
        """Before training: start the threshold warm-up where the KL warm-up ends; warn if it cannot end."""
        self.threshold_warmup_start_epoch = float(kl_warmup_epochs)
        self.threshold_ramp_epochs = float(
            kl_warmup_epochs if self.threshold_warmup_epochs is None else self.threshold_warmup_epochs)
        end = kl_warmup_epochs + self.threshold_ramp_epochs
        if self.threshold_ramp_epochs > 0 and end >= max_epochs:
            warnings.warn(
                f"the threshold warm-up ends at epoch {end:g} (the KL warm-up's {kl_warmup_epochs:g} + "
                f"{self.threshold_ramp_epochs:g} of ramp), not before max_epochs={max_epochs}: "
                "the codes never train at their full threshold; train longer or shorten the warm-ups",
                stacklevel=5,
            )

    def schedule(self, epoch, iteration):
        warmup = min(1.0, self.scale_warmup_start + self.scale_warmup_rate * iteration)
        self.scale_warmup.fill_(warmup if self.base == "laplace" else 1.0)
        if self.threshold_ramp_epochs:
            ramp = (epoch - self.threshold_warmup_start_epoch) / self.threshold_ramp_epochs
            self.threshold_warmup = min(1.0, max(_DENSE_THRESHOLD_FACTOR, ramp))

    def _encode(self, x, covariates=None):
        """(μ, scale, threshold or None, Gamma posterior of λ or None)."""
        outputs = self.encoder_outputs(x, covariates)
        loc, scale = outputs[0], outputs[1].clamp(-15.0, self.max_log_scale).exp() * self.scale_warmup
        threshold = threshold_posterior = None
        if self.amortized_threshold:
            # Clamped like the log-scale: γ stays in (3e-7, 1 - 3e-7), λ > 0.
            threshold = scale * functional.softplus(-outputs[2].clamp(-15.0, 15.0))
        elif self.learn_threshold:
            log_limit = 13.815510557964274  # log 1e6
            concentration = outputs[2].clamp(-log_limit, log_limit).exp()
            rate = outputs[3].clamp(-log_limit, log_limit).exp()
            threshold_posterior = dist.Gamma(concentration, rate)
        elif self.threshold is not None:
            threshold = torch.full_like(loc, self.threshold)
        return loc, scale, threshold, threshold_posterior

    def _codes(self, loc, scale, threshold):
        if threshold is not None and self.training and self.threshold_warmup < 1:
            threshold = threshold * self.threshold_warmup
        return code_distribution(self.base, loc, scale, threshold, self.estimator)

    def posterior(self, x, covariates=None):
        loc, scale, threshold, threshold_posterior = self._encode(x, covariates)
        if threshold_posterior is not None:
            threshold = threshold_posterior.mean
        return self._codes(loc, scale, threshold).to_event(1)

    def sample_local(self, x, covariates=None):
        loc, scale, threshold, threshold_posterior = self._encode(x, covariates)
        if threshold_posterior is not None:
            with poutine.scale(scale=self.threshold_kl_weight):
                threshold = pyro.sample("threshold", threshold_posterior.to_event(1))
        with poutine.scale(scale=self.kl_weight):
            pyro.sample("z", self._codes(loc, scale, threshold).to_event(1))
