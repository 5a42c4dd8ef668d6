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
  z ≠ 0, p(z) = exp(-(|z - μ| + λ)/b) / (2b) = γ Laplace(z; μ, b).
* Normal base: γ = erfc(λ / (σ√2)) and, for z ≠ 0,
  p(z) = N(z + sign(z - μ) λ; μ, σ²) = N(|z - μ| + λ; 0, σ²).

Both have closed-form :meth:`cdf` (the atom plus the base CDF at the
pre-image), :meth:`icdf` (its generalised inverse) and :meth:`entropy` (with
respect to the same mixed measure as :meth:`log_prob`).

**Training objective and the registered KL.** The paper does not use the KL
divergence of these thresholded laws. Its ELBO (Eq. 5) penalises the *base*
distributions, :math:`\beta_1 \mathrm{KL}(q(s \mid x) \| p(s))`, plus, when
the threshold is inferred, a separate :math:`\beta_2 \mathrm{KL}(q(\lambda
\mid x) \| p(\lambda))` between Gamma distributions with prior
:math:`\Gamma(\alpha_0, \alpha_0/\lambda_0)` (Sec. 3.2, Appendix B: "The KL
divergence loss is always computed on the base distribution"). Laplace‖Laplace
(the formula of Meyer 2021 quoted in Appendix B), Normal‖Normal and
Gamma‖Gamma are all registered by torch already, so none is re-registered.

So that Pyro's mean-field ELBOs (which call ``kl_divergence(guide_fn,
model_fn)`` per site) compute Eq. 5, ``kl_divergence`` is registered for
ThresholdedLaplace‖ThresholdedLaplace and ThresholdedNormal‖ThresholdedNormal
to return ``kl_divergence(q.base_dist, p.base_dist)``, independent of the
thresholds (the λ term is the separate Gamma site). **This is the paper's
surrogate, not the KL divergence of the thresholded laws.** The exact KL of
two thresholded Laplace laws, a spike-and-slab KL in closed form by
Prop. 3.1, is :func:`thresholded_laplace_kl`; no exact closed form is given
for the Normal base (its shifted-Gaussian slabs with different centres do not
give one cheaply).
"""

import math

import pyro.distributions
import torch
from pyro.distributions import TorchDistribution
from torch.distributions import Laplace, Normal, constraints
from torch.distributions.kl import kl_divergence, register_kl
from torch.distributions.utils import broadcast_all, lazy_property

from pyro_sparse.distributions.spike_and_slab import ndtr, spike_and_slab_cdf, spike_and_slab_icdf

_HALF_LOG_TWO_PI = 0.5 * math.log(2 * math.pi)
_SQRT_HALF = math.sqrt(0.5)


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
    :param bool straight_through: whether :meth:`rsample` uses the
        straight-through estimator of Eq. 4 (default, the paper's choice) or
        plain autograd through the threshold (the subgradient of Appendix C).
    """

    arg_constraints = {
        "loc": constraints.real,
        "scale": constraints.positive,
        "threshold": constraints.positive,
    }
    support = constraints.real
    has_rsample = True
    _base_class = None

    def __init__(
        self, loc, scale, threshold, straight_through=True, validate_args=None
    ):
        self.loc, self.scale, self.threshold = broadcast_all(loc, scale, threshold)
        self.straight_through = bool(straight_through)
        super().__init__(self.loc.shape, torch.Size(), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(ThresholdedDistribution, _instance)
        batch_shape = torch.Size(batch_shape)
        ThresholdedDistribution.__init__(
            new,
            self.loc.expand(batch_shape),
            self.scale.expand(batch_shape),
            self.threshold.expand(batch_shape),
            straight_through=self.straight_through,
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
        Eq. 2 in the equivalent form z = s - sign(s - μ) λ on |s - μ| > λ,
        z = 0 otherwise. μ enters only through ``sign`` and the comparison,
        both with zero derivative, so ∂z/∂μ at fixed s is 0 (as it is for
        Eq. 2 itself on either branch): in :meth:`rsample` μ is reached once,
        through s. (The authors' public code adds μ a second time, giving μ a
        gradient 1 + 1[z ≠ 0]; that is not reproduced.) The slab branch is
        written as s - sign·λ rather than μ + (s - μ) - sign·λ so that it is
        exactly zero only where s = ±λ, never by rounding.
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
        Reparameterised draw with the exact hard-thresholded forward value.

        With ``straight_through=True`` (Eq. 4),

        .. math:: \tilde z = s + \mathcal{T}_\lambda(\mathrm{sg}[s]) - \mathrm{sg}[s],

        computed as :math:`\mathcal{T}_\lambda(\mathrm{sg}[s]) + (s -
        \mathrm{sg}[s])`: the bracket is exactly 0 in floating point, so the
        forward value is bit-identical to :meth:`sample` (s + T - s need not
        be). Gradients: ∂z̃/∂μ = 1 and ∂z̃/∂scale = ∂s/∂scale everywhere,
        including where z̃ = 0 (the generator's gradient skips the threshold,
        Fig. 1); ∂z̃/∂λ = -sign(s - μ) where z̃ ≠ 0 and 0 where z̃ = 0. The
        paper keeps λ differentiable inside :math:`\mathcal{T}_\lambda` (it
        notes that the second term of Eq. 4 "has no gradient" only when λ is
        fixed to λ0), so a learned threshold gets the pathwise gradient of
        the shift it applies to the surviving coordinates; on the spike the
        threshold map is flat and λ is trained there only by its Gamma KL.

        With ``straight_through=False`` the threshold map is differentiated
        as is (Appendix C's subgradient): z̃ = s - sign(s - μ) λ on the slab,
        so ∂z̃/∂μ = 1, ∂z̃/∂scale = ∂s/∂scale, ∂z̃/∂λ = -sign(s - μ) there, and
        every gradient is exactly 0 where z̃ = 0.
        """
        s = self.base_dist.rsample(sample_shape)
        if not self.straight_through:
            return self._threshold_map(s)
        s_sg = s.detach()
        return self._threshold_map(s_sg) + (s - s_sg)

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
        bases (γ Laplace(z; μ, b) and N(|z - μ| + λ; 0, σ²) both decrease in
        |z - μ|; for the Normal base μ is the cusp where the two shifted
        tails meet, a supremum approached but not attained by draws).
        Note that thresholding the base mode, T(μ), is always 0 because the
        band is centred on μ, so it cannot serve as the mode.
        """
        return torch.where(self.gate < 0.5, torch.zeros_like(self.loc), self.loc)

    # Subclass hooks.
    @property
    def gate(self):
        """γ = P(z ≠ 0) = P(|s - μ| > λ)."""
        raise NotImplementedError

    def _log_spike_mass(self, ratio):
        """log(1 - γ) as a function of λ / scale."""
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
    :param bool straight_through: see :meth:`rsample`.
    """

    _base_class = Laplace

    @property
    def gate(self):
        return torch.exp(-self.threshold / self.scale)

    def _log_spike_mass(self, ratio):
        return torch.log(-torch.expm1(-ratio))

    def _log_slab_density(self, value, loc, scale, threshold):
        # Written out rather than as log γ + Laplace.log_prob: one expression,
        # finite however small γ is.
        return -((value - loc).abs() + threshold) / scale - torch.log(2 * scale)

    def _slab_cdf(self, value):
        return self.gate * self.base_dist.cdf(value)

    def _slab_icdf(self, mass):
        return self.base_dist.icdf((mass / self.gate).clamp(0, 1))

    def _slab_entropy(self):
        # -∫ γ Lap log(γ Lap) = -γ log γ + γ H(Laplace(μ, b)).
        return self.gate * (self.threshold / self.scale + 1 + torch.log(2 * self.scale))

    @property
    def variance(self):
        # E[z²] = γ (μ² + 2b²): the slab is γ Laplace(μ, b).
        gate = self.gate
        return gate * (self.loc**2 + 2 * self.scale**2) - (gate * self.loc) ** 2


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
    -log p(z) = ((|z - μ| + λ)/σ)²/2 + log(σ√(2π)) and
    2∫_t^∞ x² φ(x) dx = γ + 2tφ(t), the entropy w.r.t. the mixed measure is

    .. math::

        -(1 - \gamma)\log(1 - \gamma) + t\varphi(t)
        + \gamma\,\tfrac12\log(2\pi e\sigma^2).

    :param torch.Tensor loc: mean μ of the base Gaussian.
    :param torch.Tensor scale: standard deviation σ > 0 of the base Gaussian.
    :param torch.Tensor threshold: threshold λ > 0.
    :param bool straight_through: see :meth:`rsample`.
    """

    _base_class = Normal

    @property
    def gate(self):
        return torch.special.erfc(self.threshold / self.scale * _SQRT_HALF)

    def _log_spike_mass(self, ratio):
        return torch.log(torch.special.erf(ratio * _SQRT_HALF))

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
        t = self.threshold / self.scale
        phi_t = torch.exp(-0.5 * t**2 - _HALF_LOG_TWO_PI)
        return t * phi_t + self.gate * (0.5 + _HALF_LOG_TWO_PI + torch.log(self.scale))

    @property
    def variance(self):
        gate = self.gate
        t = self.threshold / self.scale
        phi_t = torch.exp(-0.5 * t**2 - _HALF_LOG_TWO_PI)
        # The bracket cancels for large t; clamp the rounding below zero.
        second_moment = self.scale**2 * ((1 + t**2) * gate - 2 * t * phi_t).clamp(min=0)
        return gate * self.loc**2 + second_moment - (gate * self.loc) ** 2


@register_kl(ThresholdedLaplace, ThresholdedLaplace)
@register_kl(ThresholdedNormal, ThresholdedNormal)
def _kl_thresholded_base(q, p):
    """
    The paper's Eq. 5 term KL(q(s | x) ‖ p(s)) between the base distributions,
    registered for the thresholded pair so that the mean-field ELBOs use it.
    Not the KL of the thresholded laws: see :func:`thresholded_laplace_kl`.
    """
    return kl_divergence(q.base_dist, p.base_dist)


def thresholded_laplace_kl(q, p):
    r"""
    Exact KL(q ‖ p) between thresholded Laplace laws, elementwise. By Prop. 3.1
    both are spike-and-slabs with Laplace slabs on the same mixed measure, so

    .. math::

        \gamma_q \mathrm{KL}(\mathrm{Lap}_q \| \mathrm{Lap}_p)
        + \gamma_q \log\frac{\gamma_q}{\gamma_p}
        + (1 - \gamma_q)\log\frac{1 - \gamma_q}{1 - \gamma_p},

    with log γ = -λ/b exactly. This is the divergence of the thresholded
    distributions, which ``kl_divergence`` does *not* return for this pair:
    the registered KL is the paper's Eq. 5 base KL (see the module docstring).

    :param ThresholdedLaplace q: the first argument of the KL.
    :param ThresholdedLaplace p: the second argument.
    :returns: the KL, elementwise over the broadcast batch shape.
    """
    ratio_q = q.threshold / q.scale
    ratio_p = p.threshold / p.scale
    gate_q = torch.exp(-ratio_q)
    one_minus_gate_q = -torch.expm1(-ratio_q)
    kl_slab = kl_divergence(q.base_dist, p.base_dist)
    kl_gate = gate_q * (ratio_p - ratio_q)
    # (1 - γq) log((1 - γq)/(1 - γp)) with the 0 log 0 = 0 convention: where
    # 1 - γq underflows to 0 the logs are replaced by harmless values so that
    # neither the value nor its gradient is NaN.
    use_spike = one_minus_gate_q > 0
    one = torch.ones_like(ratio_q)
    log1m_gate_q = torch.log(-torch.expm1(-torch.where(use_spike, ratio_q, one)))
    log1m_gate_p = torch.log(-torch.expm1(-torch.where(use_spike, ratio_p, one)))
    kl_spike = torch.where(
        use_spike,
        one_minus_gate_q * (log1m_gate_q - log1m_gate_p),
        torch.zeros_like(ratio_q),
    )
    return gate_q * kl_slab + kl_gate + kl_spike


# Pyro's wrappers of the plain bases (they have ``.to_event``), same KLs as torch's.
_BASES = {
    "laplace": (ThresholdedLaplace, pyro.distributions.Laplace),
    "gaussian": (ThresholdedNormal, pyro.distributions.Normal),
}


def code_distribution(base, loc, scale, threshold=None, straight_through=True):
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
    return thresholded(loc, scale, threshold, straight_through=straight_through)
