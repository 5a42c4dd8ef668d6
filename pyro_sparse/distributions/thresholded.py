r"""
Thresholded Laplace and Gaussian distributions of Fallah & Rozell, "Variational
Sparse Coding with Learned Thresholding" (ICML 2022).

A base draw :math:`s \sim \mathrm{Laplace}(\mu, b)` (or :math:`\mathcal{N}(\mu,
\sigma^2)`) is passed through the shifted soft-threshold of Eq. 2,

.. math::

    \mathcal{T}(s; \lambda, \mu) = \mathrm{sign}(s - \mu)\max(|s - \mu| - \lambda, 0)
        + \mathbb{I}[|s - \mu| > \lambda]\,\mu,

so :math:`z = 0` when :math:`|s - \mu| \le \lambda` and :math:`z = s -
\mathrm{sign}(s - \mu)\lambda` otherwise: the band :math:`\mu \pm \lambda` is
collapsed onto an exact zero and the two tails are shifted inwards by
:math:`\lambda` to meet at :math:`\mu` (Fig. 2). The resulting law is a
spike-and-slab; :meth:`log_prob` is its density with respect to the mixed
measure (counting measure at 0) + (Lebesgue measure), the same convention as
:class:`~pyro_sparse.distributions.SpikeAndSlab`, with ``gate`` γ the
probability of being non-zero.

Densities (derived in the class docstrings; γ = P(z ≠ 0)):

* Laplace base (Eq. 3, Prop. 3.1, Appendix A): γ = exp(-λ/b) and, for
  z ≠ 0, p(z) = exp(-(``|z - μ|`` + λ)/b) / (2b) = γ Laplace(z; μ, b).
* Normal base: γ = erfc(λ / (σ√2)) and, for z ≠ 0,
  p(z) = N(z + sign(z - μ) λ; μ, σ²) = N(``|z - μ|`` + λ; 0, σ²).

Both have closed-form :meth:`cdf` (the atom plus the base CDF at the
pre-image), :meth:`icdf` (its generalised inverse) and :meth:`entropy` (with
respect to the same mixed measure as :meth:`log_prob`).

**The registered KL is the true KL.** ``kl_divergence`` of two thresholded
laws of the same family is the KL divergence of the thresholded laws (both
are spike-and-slabs on the same mixed measure): closed form for the Laplace
base (:func:`thresholded_laplace_kl`, by Prop. 3.1) and for the Normal base
(:func:`thresholded_normal_kl`, truncated-normal moments). Both hold for
different thresholds in q and p.

**Training objectives.** A prior law built with ``kl_objective`` other than
``"exact"`` makes ``kl_divergence(q, prior)`` return a surrogate instead, so
that the mean-field ELBOs (which call ``kl_divergence(guide_fn, model_fn)``
per site) train with it:

* ``"base"``: the paper's Eq. 5, KL(q(s | x) ‖ p(s)) of the *base* laws
  (Sec. 3.2, Appendix B: "The KL divergence loss is always computed on the
  base distribution"), independent of the thresholds; it is neither the KL
  of the thresholded laws nor a bound on it (Laplace pairs: base 0.268, true
  0.188 for μ = 0.3, b = 0.5, λ = 0.2 against μ = 0, b = 1, λ = 0.5; base
  1.09, true 2.42 for μ = 0.5, b = 0.2, λ = 0.01 against μ = 0, b = √0.1,
  λ = 0.52).
* ``"augmented"`` (Laplace base only): KL(Bernoulli(γ_q) ‖ Bernoulli(γ_p)) +
  KL(Laplace(μ_q, b_q) ‖ Laplace(μ_p, b_p)). By Prop. 3.1 a thresholded
  Laplace draw is z = B v with B ~ Bernoulli(γ) independent of the slab value
  v ~ Laplace(μ, b), the same map for q and p; this is the KL of the pair
  (B, v), an upper bound on the true KL (data-processing inequality), so the
  ELBO stays a lower bound. Unlike the true KL, whose slab term is weighted
  by γ_q, it keeps pulling the location of a coordinate that is switched off
  towards the prior; without that pull the location wanders with the shared
  encoder weights while the code is 0, and switching the code back on is a
  loss spike (``benchmarks/results/sparse_coding_patches.md``).

The Gamma‖Gamma KL of a learned threshold is torch's.
"""

import math

import pyro.distributions
import torch
from pyro.distributions import TorchDistribution
from torch.distributions import Laplace, Normal, constraints
from torch.distributions.kl import kl_divergence, register_kl
from torch.distributions.utils import broadcast_all, lazy_property

from pyro_sparse.distributions.spike_and_slab import ndtr, spike_and_slab_cdf, spike_and_slab_icdf
from pyro_sparse.distributions.spike_slab_lasso import _log1mexp

#: Gradient estimators of :meth:`ThresholdedDistribution.rsample`.
ESTIMATORS = ("jump", "straight_through", "subgradient")

_HALF_LOG_TWO_PI = 0.5 * math.log(2 * math.pi)
_SQRT_HALF = math.sqrt(0.5)
# Beyond t = λ/σ = 1e3 a Gaussian tail's mass and density are 0 in every float type; the moments clamp t there so
# that t² and t·φ(t) stay finite (0, not inf·0 = NaN) when σ is tiny against λ.
_MAX_TAIL_RATIO = 1e3


class ThresholdedDistribution(TorchDistribution):
    r"""
    Common code for a symmetric location-scale base distribution passed
    through the shifted soft-threshold of Eq. 2. Subclasses set
    ``_base_class`` and give the spike mass, the slab density and the
    moments of their base family; this class is not exported, use
    :class:`ThresholdedLaplace` or :class:`ThresholdedNormal`.

    :param torch.Tensor loc: location μ of the base distribution (the centre
        of the threshold band).
    :param torch.Tensor scale: scale (> 0) of the base distribution.
    :param torch.Tensor threshold: threshold λ > 0. May be a reparameterised
        draw from a Gamma posterior; gradient reaches it through the
        threshold map (see :meth:`rsample`).
    :param str estimator: the gradient :meth:`rsample` gives: ``"jump"``
        (default), ``"straight_through"`` (the paper's Eq. 4) or
        ``"subgradient"`` (Appendix C).
    :param str kl_objective: what ``kl_divergence(q, self)`` returns when this
        law is the *second* argument (a prior): ``"exact"`` (default, the KL
        of the thresholded laws), ``"augmented"`` or ``"base"`` (see the
        module docstring).
    """

    arg_constraints = {
        "loc": constraints.real,
        "scale": constraints.positive,
        "threshold": constraints.positive,
    }
    support = constraints.real
    has_rsample = True
    _base_class = None
    _kl_objectives = ("exact", "base")

    def __init__(
        self, loc, scale, threshold, estimator="jump", kl_objective="exact", validate_args=None
    ):
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
        if kl_objective not in self._kl_objectives:
            raise ValueError(
                f"kl_objective of a {type(self).__name__} must be one of {self._kl_objectives}, got {kl_objective!r}"
            )
        self.loc, self.scale, self.threshold = broadcast_all(loc, scale, threshold)
        self.estimator, self.kl_objective = estimator, kl_objective
        super().__init__(self.loc.shape, torch.Size(), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(ThresholdedDistribution, _instance)
        batch_shape = torch.Size(batch_shape)
        ThresholdedDistribution.__init__(
            new,
            self.loc.expand(batch_shape),
            self.scale.expand(batch_shape),
            self.threshold.expand(batch_shape),
            estimator=self.estimator,
            kl_objective=self.kl_objective,
            validate_args=False,
        )
        new._validate_args = self._validate_args
        return new

    @lazy_property
    def base_dist(self):
        """The base distribution of s, whose KL the paper's Eq. 5 uses."""
        return self._base_class(self.loc, self.scale, validate_args=False)

    def _threshold_map(self, s):
        r"""
        Eq. 2 in the equivalent form z = s - sign(s - μ) λ on ``|s - μ|`` > λ,
        z = 0 otherwise. μ enters only through ``sign`` and the comparison,
        both with zero derivative, so ∂z/∂μ at fixed s is 0 (as it is for
        Eq. 2 itself on either branch): μ is reached through s only. (The
        authors' public code adds μ a second time, giving μ a gradient
        1 + 1[z ≠ 0]; that is not reproduced.) The slab branch is written as
        s - sign·λ rather than μ + (s - μ) - sign·λ so that it is exactly zero
        only where s = ±λ, never by rounding.
        """
        d = s - self.loc
        keep = d.abs() > self.threshold
        return torch.where(keep, s - d.sign() * self.threshold, torch.zeros_like(s))

    def sample(self, sample_shape=torch.Size()):
        # The base draw is taken with rsample so that sample() and rsample()
        # consume the generator identically: with the same seed they return
        # bit-identical values.
        with torch.no_grad():
            return self._threshold_map(self.base_dist.rsample(sample_shape))

    def rsample(self, sample_shape=torch.Size()):
        r"""
        Reparameterised draw with the exact hard-thresholded forward value
        (every estimator adds terms that are exactly 0 in the forward pass,
        so the value is bit-identical to :meth:`sample` with the same seed).

        Write s = μ + ε with ε independent of μ. The draw is z = 0 if
        ``|ε|`` ≤ λ, else z = μ + ε - sign(ε) λ: for fixed ε it is *linear*
        in μ with slope 1[z ≠ 0], and it jumps from 0 to μ (either tail lands
        on μ) where ``|ε|`` crosses λ, i.e. where the scale or λ moves the
        band's edge across the draw. So the exact gradient of E f(z) is the
        pathwise one on the slab plus, for the scale and λ, the rate at which
        the edge sweeps over probability mass times the jump f(μ) - f(0);
        that rate is ∂γ/∂(scale, λ), γ = P(z ≠ 0).

        * ``"jump"``: ∂z̃/∂μ = 1[z ≠ 0], ∂z̃/∂scale = 1[z ≠ 0] ∂s/∂scale,
          ∂z̃/∂λ = -sign(ε) 1[z ≠ 0], plus μ ∂γ/∂(scale, λ), which is the jump
          term with f(μ) - f(0) replaced by its first-order estimate
          f'(z) μ: z̃ = z + 1[z ≠ 0](s - sg[s]) + sg[μ](γ - sg[γ]). A
          coordinate the threshold zeroes passes no gradient to μ (its
          exact derivative), so μ cannot drift while the code is 0; its gate
          still learns whether switching on would help.
        * ``"straight_through"`` (Eq. 4): z̃ = T(sg[s]) + (s - sg[s]), so
          ∂z̃/∂μ = 1 and ∂z̃/∂scale = ∂s/∂scale everywhere, including where
          z = 0 (Fig. 1); ∂z̃/∂λ = -sign(ε) on the slab, 0 on the spike. For a
          coordinate that stays 0 the likelihood keeps pushing μ with nothing
          to push back but the KL: the drift that diverges on patches.
        * ``"subgradient"`` (Appendix C): autograd through the threshold
          map, the pathwise part of ``"jump"`` alone; it misses the jump
          term, so a gate only ever closes (Table 2's feature collapse).
        """
        s = self.base_dist.rsample(sample_shape)
        if self.estimator == "subgradient":
            return self._threshold_map(s)
        s_sg = s.detach()
        if self.estimator == "straight_through":
            return self._threshold_map(s_sg) + (s - s_sg)
        z = self._threshold_map(s_sg)
        on = (z != 0).to(s.dtype)
        gate = self.gate
        return z + on * (s - s_sg) + self.loc.detach() * (gate - gate.detach())

    def log_prob(self, value):
        r"""
        Density w.r.t. (counting measure at 0) + (Lebesgue measure): log(1 - γ)
        at ``value == 0`` exactly, the slab density elsewhere. The slab puts no
        mass on the single point 0, so the branches do not mix.
        """
        if self._validate_args:
            self._validate_sample(value)
        value, loc, scale, threshold = broadcast_all(
            value, self.loc, self.scale, self.threshold
        )
        is_zero = value == 0
        # "Double where": log(1 - γ) is -inf where λ/scale underflows, and
        # torch.where's zero upstream gradient times that infinity's
        # derivative is NaN, so the unused branch gets a harmless ratio.
        ratio = torch.where(is_zero, threshold / scale, torch.ones_like(value))
        log_spike = self._log_spike_mass(ratio)
        log_slab = self._log_slab_density(value, loc, scale, threshold)
        return torch.where(is_zero, log_spike, log_slab)

    @property
    def _spike_mass(self):
        """1 - γ = P(z = 0), from the subclass's accurate log."""
        return self._log_spike_mass(self.threshold / self.scale).exp()

    def cdf(self, value):
        r"""
        P(z ≤ value): the slab's mass below ``value`` (the base CDF at the
        pre-image of the tails) plus the atom 1 - γ where ``value`` ≥ 0.
        """
        if self._validate_args:
            self._validate_sample(value)
        return spike_and_slab_cdf(value, self._spike_mass, self._slab_cdf(value))

    def icdf(self, value):
        """The generalised inverse of :meth:`cdf`, exactly 0 on the jump of the atom."""
        zero = torch.zeros_like(self.loc)
        return spike_and_slab_icdf(value, self._spike_mass, self._slab_cdf(zero), self.gate, self._slab_icdf)

    def entropy(self):
        r"""
        Entropy with respect to (counting measure at 0) + (Lebesgue measure),
        the measure of :meth:`log_prob`: -(1 - γ) log(1 - γ) for the atom plus
        -∫ p log p over the slab, whose density p integrates to γ.
        """
        spike = self._spike_mass
        return -torch.special.xlogy(spike, spike) + self._slab_entropy()

    @property
    def mean(self):
        # The slab density depends on z only through |z - μ| (both bases are
        # symmetric about μ and the shift is symmetric), so its first moment
        # is γ μ; the spike contributes 0.
        return self.gate * self.loc

    @property
    def mode(self):
        r"""
        The sparse-code point estimate, with the convention of
        :attr:`SpikeAndSlab.mode`: exactly 0 where the spike mass 1 - γ
        exceeds 1/2, else the mode of the slab part, which is μ for both
        bases (γ Laplace(z; μ, b) and N(``|z - μ|`` + λ; 0, σ²) both decrease in
        ``|z - μ|``; for the Normal base μ is the cusp where the two shifted
        tails meet, a supremum approached but not attained by draws).
        Note that thresholding the base mode, T(μ), is always 0 because the
        band is centred on μ, so it cannot serve as the mode.
        """
        return torch.where(self.gate < 0.5, torch.zeros_like(self.loc), self.loc)

    # Subclass hooks.
    @property
    def gate(self):
        """γ = P(z ≠ 0) = P(``|s - μ|`` > λ)."""
        raise NotImplementedError

    def _log_spike_mass(self, ratio):
        """log(1 - γ) as a function of λ / scale."""
        raise NotImplementedError

    def _log_gate(self, ratio):
        """log γ as a function of λ / scale."""
        raise NotImplementedError

    def _log_slab_density(self, value, loc, scale, threshold):
        raise NotImplementedError

    def _slab_cdf(self, value):
        """The slab's mass below ``value``, in [0, γ]."""
        raise NotImplementedError

    def _slab_icdf(self, mass):
        """Its inverse, for ``mass`` in (0, γ)."""
        raise NotImplementedError

    def _slab_entropy(self):
        """-∫ p log p over the slab (z ≠ 0)."""
        raise NotImplementedError


class ThresholdedLaplace(ThresholdedDistribution):
    r"""
    A Laplace draw :math:`s \sim \mathrm{Laplace}(\mu, b)` passed through the
    shifted soft-threshold of Eq. 2 (Fallah & Rozell 2022, Sec. 3.2).

    By Prop. 3.1 this is exactly a spike-and-slab. The spike mass is
    (Eq. 3) :math:`P(|s - \mu| \le \lambda) = 1 - e^{-\lambda/b}`, so
    :math:`\gamma = e^{-\lambda/b}`. For z ≠ 0 the map is invertible on each
    tail, s = z + sign(z - μ) λ with unit Jacobian and sign(s - μ) =
    sign(z - μ), so

    .. math::

        p(z) = \frac{1}{2b}\exp\Bigl(-\frac{|z - \mu| + \lambda}{b}\Bigr)
             = \gamma\,\mathrm{Laplace}(z; \mu, b),

    the memorylessness of the exponential tails (Appendix A, Eq. 14). Hence
    :math:`\mathrm{Var}(z) = \gamma(\mu^2 + 2b^2) - \gamma^2\mu^2`, the CDF
    is γ times the Laplace CDF plus the atom, and the entropy w.r.t. the mixed
    measure is :math:`-(1 - \gamma)\log(1 - \gamma) - \gamma\log\gamma +
    \gamma(1 + \log 2b)` with :math:`\log\gamma = -\lambda/b`.

    :param torch.Tensor loc: location μ.
    :param torch.Tensor scale: Laplace scale b > 0.
    :param torch.Tensor threshold: threshold λ > 0.
    :param str estimator: see :meth:`rsample`.
    :param str kl_objective: ``"exact"``, ``"augmented"`` or ``"base"`` (module docstring).
    """

    _base_class = Laplace
    _kl_objectives = ("exact", "augmented", "base")

    @property
    def gate(self):
        return torch.exp(-self.threshold / self.scale)

    def _log_gate(self, ratio):
        return -ratio

    def _log_spike_mass(self, ratio):
        return _log1mexp(-ratio)

    def _log_slab_density(self, value, loc, scale, threshold):
        # Written out rather than as log γ + Laplace.log_prob: one expression,
        # finite however small γ is.
        return -((value - loc).abs() + threshold) / scale - torch.log(2 * scale)

    def _slab_cdf(self, value):
        # The slab γ Laplace(μ, b) has mass ½ e^{(z - μ - λ)/b} below z < μ and γ - ½ e^{(μ - z - λ)/b} above μ;
        # written so, neither tail rounds to 0 (Laplace.cdf goes through ½ ± ½(1 - e^{-|z - μ|/b})).
        d, b, t = value - self.loc, self.scale, self.threshold
        left = 0.5 * torch.exp((d.clamp(max=0) - t) / b)
        right = self.gate - 0.5 * torch.exp((-d.clamp(min=0) - t) / b)
        return torch.where(d < 0, left, right)

    def _slab_icdf(self, mass):
        # The inverse of _slab_cdf; each branch's log stays finite on the other branch (γ - mass ≥ γ/2 there).
        b, t = self.scale, self.threshold
        left = self.loc + t + b * torch.log(2 * mass)
        right = self.loc - t - b * torch.log(2 * (self.gate - mass).clamp(min=0))
        return torch.where(mass <= self.gate / 2, left, right)

    def _slab_entropy(self):
        # -∫ γ Lap log(γ Lap) = -γ log γ + γ H(Laplace(μ, b)).
        return self.gate * (self.threshold / self.scale + 1 + torch.log(2 * self.scale))

    @property
    def variance(self):
        # The slab is γ Laplace(μ, b): 2γb² + γ(1 - γ)μ², without E[z²] - E[z]²'s cancellation.
        return self.gate * (2 * self.scale**2 + self._spike_mass * self.loc**2)


class ThresholdedNormal(ThresholdedDistribution):
    r"""
    A Gaussian draw :math:`s \sim \mathcal{N}(\mu, \sigma^2)` passed through
    the shifted soft-threshold of Eq. 2 (Fallah & Rozell 2022, Sec. 3.2, the
    "Thresholded Gaussian").

    The spike mass is :math:`P(|s - \mu| \le \lambda) =
    \mathrm{erf}(\lambda / (\sigma\sqrt 2))`, so :math:`\gamma =
    \mathrm{erfc}(\lambda / (\sigma\sqrt 2))`. For z ≠ 0 the map is
    s = z + sign(z - μ) λ with unit Jacobian on each tail (as for the Laplace
    base), so the mass of each tail is shifted inwards by λ:

    .. math::

        p(z) = \mathcal{N}(z + \mathrm{sign}(z - \mu)\lambda; \mu, \sigma^2)
             = \frac{1}{\sigma\sqrt{2\pi}}
               \exp\Bigl(-\frac{(|z - \mu| + \lambda)^2}{2\sigma^2}\Bigr),

    which integrates to γ. Unlike the Laplace case this is *not* γ times a
    Gaussian: the Gaussian tail is not memoryless, so the slab is a
    Gaussian tail folded onto μ (continuous at μ, with a cusp there). With
    t = λ/σ and φ the standard normal density, the slab's second moment
    about μ is :math:`\sigma^2[(1 + t^2)\gamma - 2t\varphi(t)]`
    (= 2σ²∫_t^∞ (x - t)² φ(x) dx), giving :attr:`variance`. The slab's mass
    below z is Φ((z - μ - λ)/σ) for z < μ (the left tail, shifted) and
    γ - Φ((μ - z - λ)/σ) above μ, giving :meth:`cdf` and :meth:`icdf`. Since
    -log p(z) = ((``|z - μ|`` + λ)/σ)²/2 + log(σ√(2π)) and
    2∫_t^∞ x² φ(x) dx = γ + 2tφ(t), the entropy w.r.t. the mixed measure is

    .. math::

        -(1 - \gamma)\log(1 - \gamma) + t\varphi(t)
        + \gamma\,\tfrac12\log(2\pi e\sigma^2).

    :param torch.Tensor loc: mean μ of the base Gaussian.
    :param torch.Tensor scale: standard deviation σ > 0 of the base Gaussian.
    :param torch.Tensor threshold: threshold λ > 0.
    :param str estimator: see :meth:`rsample`.
    :param str kl_objective: ``"exact"`` or ``"base"``; ``"augmented"`` needs the Laplace's
        memoryless slab (module docstring).
    """

    _base_class = Normal

    @property
    def gate(self):
        return torch.special.erfc(self.threshold / self.scale * _SQRT_HALF)

    def _log_gate(self, ratio):
        # γ = 2 Φ(-t), accurate where erfc underflows.
        return math.log(2.0) + torch.special.log_ndtr(-ratio)

    def _log_spike_mass(self, ratio):
        # log erf(t/√2) rounds to 0 once γ = erfc(t/√2) is below the float's epsilon; log1p(-γ) keeps it.
        # Each branch sees only its own inputs (see _log1mexp: the other's infinite gradient would give NaN).
        far, scaled = ratio > 1, ratio * _SQRT_HALF
        return torch.where(far, torch.log1p(-torch.special.erfc(torch.where(far, scaled, 1.0))),
                           torch.log(torch.special.erf(torch.where(far, 1.0, scaled))))

    def _log_slab_density(self, value, loc, scale, threshold):
        shifted = ((value - loc).abs() + threshold) / scale
        return -0.5 * shifted**2 - torch.log(scale) - _HALF_LOG_TWO_PI

    def _slab_cdf(self, value):
        d = value - self.loc
        t = self.threshold
        left = ndtr((d - t) / self.scale)
        right = self.gate - ndtr((-d - t) / self.scale)
        return torch.where(d < 0, left, right)

    def _slab_icdf(self, mass):
        # Each branch's argument stays in (0, 1) on the other branch too
        # (mass < γ ≤ 1, γ - mass ≥ γ/2 > 0), so the where is NaN-free.
        left = self.loc + self.threshold + self.scale * torch.special.ndtri(mass)
        right = self.loc - self.threshold - self.scale * torch.special.ndtri((self.gate - mass).clamp(min=0))
        return torch.where(mass <= self.gate / 2, left, right)

    def _slab_entropy(self):
        t = (self.threshold / self.scale).clamp(max=_MAX_TAIL_RATIO)
        phi_t = torch.exp(-0.5 * t**2 - _HALF_LOG_TWO_PI)
        return t * phi_t + self.gate * (0.5 + _HALF_LOG_TWO_PI + torch.log(self.scale))

    @property
    def variance(self):
        gate = self.gate
        t = (self.threshold / self.scale).clamp(max=_MAX_TAIL_RATIO)
        phi_t = torch.exp(-0.5 * t**2 - _HALF_LOG_TWO_PI)
        # The bracket cancels for large t; clamp the rounding below zero.
        second_moment = self.scale**2 * ((1 + t**2) * gate - 2 * t * phi_t).clamp(min=0)
        return second_moment + gate * self._spike_mass * self.loc**2  # γ(1 - γ)μ², not E[z²] - E[z]²


def _xlog_ratio(mass, log_q, log_p):
    """mass (log_q - log_p) with 0 log 0 = 0: a "double where", so that logs that are -inf
    where the mass is 0 give neither a NaN value nor a NaN gradient."""
    used = mass > 0
    safe = torch.where(used, log_q - log_p, torch.zeros_like(mass))
    return torch.where(used, mass * safe, torch.zeros_like(mass))


def _slab_mass_kl(q, p):
    """γ_q log(γ_q / γ_p), the slab-mass part of the gates' Bernoulli KL."""
    return _xlog_ratio(q.gate, q._log_gate(q.threshold / q.scale), p._log_gate(p.threshold / p.scale))


def _spike_kl(q, p):
    """(1 - γ_q) log((1 - γ_q) / (1 - γ_p)), the spike part of the gates' Bernoulli KL."""
    ratio_q, ratio_p = q.threshold / q.scale, p.threshold / p.scale
    spike = q._spike_mass
    has_spike = spike > 0
    one = torch.ones_like(ratio_q)
    log_q = q._log_spike_mass(torch.where(has_spike, ratio_q, one))
    log_p = p._log_spike_mass(torch.where(has_spike, ratio_p, one))
    return _xlog_ratio(spike, log_q, log_p)


def thresholded_laplace_kl(q, p):
    r"""
    KL(q ‖ p) between thresholded Laplace laws, elementwise, the KL that
    ``kl_divergence`` returns for this pair. By Prop. 3.1 both are
    spike-and-slabs with Laplace slabs on the same mixed measure, so

    .. math::

        \gamma_q \mathrm{KL}(\mathrm{Lap}_q \| \mathrm{Lap}_p)
        + \gamma_q \log\frac{\gamma_q}{\gamma_p}
        + (1 - \gamma_q)\log\frac{1 - \gamma_q}{1 - \gamma_p},

    with log γ = -λ/b exactly.

    :param ThresholdedLaplace q: the first argument of the KL.
    :param ThresholdedLaplace p: the second argument.
    :returns: the KL, elementwise over the broadcast batch shape.
    """
    return q.gate * kl_divergence(q.base_dist, p.base_dist) + _slab_mass_kl(q, p) + _spike_kl(q, p)


def _normal_pdf(x):
    return torch.exp(-0.5 * x**2 - _HALF_LOG_TWO_PI)


def _abs_moment_of_slab(q, c):
    r"""
    ∫ over z ≠ 0 of ``|z - c|`` q(z) dz for a thresholded Normal q. The slab is
    N(μ + λ, σ²) restricted to z < μ (the left tail shifted right) plus
    N(μ - λ, σ²) restricted to z > μ; each piece is split at c, and
    ∫_a^b (y - c) N(y; m, σ²) dy = σ(φ(α) - φ(β)) + (m - c)(Φ(β) - Φ(α)).
    """
    mu, sigma, lam = q.loc, q.scale, q.threshold
    t = lam / sigma
    below, above = torch.minimum(c, mu), torch.maximum(c, mu)
    # Left piece, mean μ + λ, on (-inf, μ): ∫_{-inf}^{below} (c - y) + ∫_{below}^{μ} (y - c).
    m = mu + lam
    b_lo, b_mu = (below - m) / sigma, -t
    left = (c - m) * ndtr(b_lo) + sigma * _normal_pdf(b_lo)
    left = left + sigma * (_normal_pdf(b_lo) - _normal_pdf(b_mu)) + (m - c) * (ndtr(b_mu) - ndtr(b_lo))
    # Right piece, mean μ - λ, on (μ, inf): ∫_{μ}^{above} (c - y) + ∫_{above}^{inf} (y - c).
    m = mu - lam
    a_mu, a_hi = t, (above - m) / sigma
    right = sigma * _normal_pdf(a_hi) + (m - c) * ndtr(-a_hi)
    right = right - sigma * (_normal_pdf(a_mu) - _normal_pdf(a_hi)) - (m - c) * (ndtr(a_hi) - ndtr(a_mu))
    return left + right


def thresholded_normal_kl(q, p):
    r"""
    KL(q ‖ p) between thresholded Normal laws, elementwise, the KL that
    ``kl_divergence`` returns for this pair. With the slab densities
    :math:`f(z) = \varphi_\sigma(|z - \mu| + \lambda)` (mass γ each),

    .. math::

        (1 - \gamma_q)\log\frac{1 - \gamma_q}{1 - \gamma_p}
        - H_{slab}(q) + \gamma_q \log(\sigma_p\sqrt{2\pi})
        + \frac{S_2 + 2\lambda_p S_1 + \lambda_p^2\gamma_q}{2\sigma_p^2},

    :math:`S_k = \int_{z \neq 0} |z - \mu_p|^k q(z)\,dz`. The q slab is two
    shifted Gaussian tails (N(μ_q ± λ_q, σ_q²) truncated at μ_q), so S_1 is a
    sum of truncated-normal first moments (:func:`_abs_moment_of_slab`) and
    :math:`S_2 = \sigma_q^2[(1 + t_q^2)\gamma_q - 2t_q\varphi(t_q)] + \gamma_q
    (\mu_q - \mu_p)^2`, t = λ/σ; :math:`H_{slab} = t_q\varphi(t_q) +
    \gamma_q\tfrac12\log(2\pi e\sigma_q^2)` (see :class:`ThresholdedNormal`).
    With both thresholds 0 it is the Normal KL.

    :param ThresholdedNormal q: the first argument of the KL.
    :param ThresholdedNormal p: the second argument.
    :returns: the KL, elementwise over the broadcast batch shape.
    """
    gate_q = q.gate
    t_q = (q.threshold / q.scale).clamp(max=_MAX_TAIL_RATIO)
    phi_q = _normal_pdf(t_q)
    second = q.scale**2 * ((1 + t_q**2) * gate_q - 2 * t_q * phi_q) + gate_q * (q.loc - p.loc) ** 2
    first = _abs_moment_of_slab(q, p.loc)
    cross = (second + 2 * p.threshold * first + p.threshold**2 * gate_q) / (2 * p.scale**2)
    slab = -t_q * phi_q - 0.5 * gate_q + gate_q * torch.log(p.scale / q.scale) + cross
    return _spike_kl(q, p) + slab


@register_kl(ThresholdedLaplace, ThresholdedLaplace)
@register_kl(ThresholdedNormal, ThresholdedNormal)
def _kl_thresholded(q, p):
    """The KL of the thresholded laws, or the training surrogate ``p.kl_objective`` names (module docstring)."""
    if p.kl_objective == "base":
        return kl_divergence(q.base_dist, p.base_dist)
    if p.kl_objective == "augmented":
        return kl_divergence(q.base_dist, p.base_dist) + _slab_mass_kl(q, p) + _spike_kl(q, p)
    exact = thresholded_laplace_kl if isinstance(q, ThresholdedLaplace) else thresholded_normal_kl
    return exact(q, p)


# Pyro's wrappers of the plain bases (they have ``.to_event``), same KLs as torch's.
_BASES = {
    "laplace": (ThresholdedLaplace, pyro.distributions.Laplace),
    "gaussian": (ThresholdedNormal, pyro.distributions.Normal),
}


def code_distribution(base, loc, scale, threshold=None, estimator="jump", kl_objective="exact"):
    """
    The code distribution of thresholded VSC for a base family (``"laplace"``
    or ``"gaussian"``): the base through the shifted soft-threshold, or, with
    ``threshold=None``, the plain base (the Laplacian / Gaussian priors the
    paper compares against).
    """
    if base not in _BASES:
        raise ValueError(f"base must be one of {sorted(_BASES)}, got {base!r}")
    thresholded, plain = _BASES[base]
    if threshold is None:
        return plain(loc, scale)
    return thresholded(loc, scale, threshold, estimator=estimator, kl_objective=kl_objective)
