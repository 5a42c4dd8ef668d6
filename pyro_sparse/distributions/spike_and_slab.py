import math

import torch
from pyro.distributions import RelaxedBernoulliStraightThrough, TorchDistribution
from torch.distributions import constraints
from torch.distributions.kl import register_kl
from torch.distributions.utils import (
    broadcast_all,
    lazy_property,
    logits_to_probs,
    probs_to_logits,
)
from torch.nn.functional import softplus

_HALF_LOG_TWO_PI = 0.5 * math.log(2 * math.pi)
_SQRT_HALF = math.sqrt(0.5)


def ndtr(x):
    """
    The standard normal CDF as erfc(-x/√2)/2, accurate in the lower tail
    (torch.special.ndtr rounds Φ(-11) ≈ 2e-28 to 0 in float64).
    """
    return 0.5 * torch.special.erfc(-x * _SQRT_HALF)


def spike_and_slab_cdf(value, spike_mass, slab_cdf):
    r"""
    CDF of a law on the real line with an atom of mass a = ``spike_mass`` at 0
    and a continuous part of mass 1 - a whose mass below ``value`` is
    ``slab_cdf`` = S(value): F(z) = S(z) + a 1[z ≥ 0], right-continuous at the
    atom. Shared by :class:`SpikeAndSlab` and the thresholded laws.
    """
    return slab_cdf + torch.where(value >= 0, spike_mass, torch.zeros_like(spike_mass))


def spike_and_slab_icdf(u, spike_mass, slab_cdf_at_zero, gate, slab_icdf):
    r"""
    The generalised inverse inf{z : F(z) ≥ u} of :func:`spike_and_slab_cdf`,
    so that ``icdf`` of a uniform draw is a draw of the law: S⁻¹(u) for
    u ≤ S(0), exactly 0 on the jump S(0) < u ≤ S(0) + a, and S⁻¹(u - a) above
    it. ``slab_icdf`` maps slab mass v in (0, γ), γ = ``gate`` = 1 - a, to
    S⁻¹(v); on the jump it is evaluated at the harmless v = γ/2 instead
    (double where), so for γ > 0 neither the value nor its gradient is NaN
    (at γ = 0 the value is 0 and the gradient of γ is NaN: there is no slab).
    The ends are the support's, -∞ at u = 0 and, where there is a slab
    (γ > 0), +∞ at u = 1, where rounding of S(0) + a would otherwise put
    u = 1 on the atom or a finite value.
    """
    below = u <= slab_cdf_at_zero
    on_slab = below | (u > slab_cdf_at_zero + spike_mass)
    v = torch.where(below, u, u - spike_mass)
    v = torch.where(on_slab, v, gate / 2)
    value = torch.where(on_slab, slab_icdf(v), torch.zeros_like(v))
    return torch.where((u >= 1) & (gate > 0), math.inf, torch.where(u <= 0, -math.inf, value))


class SpikeAndSlab(TorchDistribution):
    r"""
    Spike-and-slab distribution of Variational Sparse Coding (Tonolini, Jensen
    & Murray-Smith; ICLR version Eq. 4-5),

    .. math::

        p(z) = \gamma\,\mathcal{N}(z; \mu, \sigma^2) + (1 - \gamma)\,\delta(z),

    a Gaussian "slab" chosen with probability ``gate`` :math:`\gamma` and an
    exact zero (the "spike") otherwise. Note that ``gate`` is the probability of
    being *non-zero*, the opposite convention to
    :class:`~pyro.distributions.ZeroInflatedDistribution`, whose gate is the
    probability of the extra zero; we follow the paper, where γ = 1 recovers a
    plain Gaussian VAE latent.

    :meth:`log_prob` is a density with respect to the mixed measure
    (counting measure at 0) + (Lebesgue measure), so both the point mass and
    the slab have finite log-densities and Monte-Carlo KL estimates between two
    ``SpikeAndSlab`` distributions are valid; :meth:`entropy` is taken with
    respect to the same measure. :meth:`sample` gives hard draws
    with exact zeros. :meth:`rsample` gives reparameterised draws by one of two
    estimators of the spike indicator (see there): ``"relaxed"``, the paper's
    relaxation (UAI supplement B.1 / ICLR Eq. 24), whose draws are almost
    surely non-zero and so are scored by the slab branch of :meth:`log_prob`,
    or ``"straight_through"``, hard Bernoulli(γ) indicators in the forward
    pass with Gumbel-softmax gradients (the spike-and-slab baseline of Fallah
    & Rozell 2022, Sec. 4.1). Either way, train with the closed-form KL
    (registered below, used by :class:`~pyro.infer.TraceMeanField_ELBO`) as
    the papers do, rather than with ``log_prob`` of the draws.

    :param torch.Tensor gate: probability γ of the slab (of being non-zero),
        in [0, 1].
    :param torch.Tensor loc: mean μ of the slab.
    :param torch.Tensor scale: standard deviation σ > 0 of the slab.
    :param torch.Tensor gate_logits: logit of γ; give exactly one of ``gate``
        and ``gate_logits``.
    :param float slope: the constant c of the relaxed step T(y) = sigmoid(c y)
        used by :meth:`rsample` with ``spike_estimator="relaxed"``; a public
        attribute that may be changed during training (the paper warms it up
        from 50 to 200, supplement B.2).
    :param str spike_estimator: how :meth:`rsample` draws the spike indicator:
        ``"relaxed"`` (default) or ``"straight_through"``.
    :param float temperature: the temperature τ of the binary Concrete
        (Gumbel-softmax) relaxation whose gradient the straight-through
        estimator uses; a public attribute like ``slope`` (Fallah & Rozell,
        Appendix D, anneal it from 1 to 0.5, the default).
    """

    arg_constraints = {
        "gate": constraints.unit_interval,
        "gate_logits": constraints.real,
        "loc": constraints.real,
        "scale": constraints.positive,
    }
    support = constraints.real
    has_rsample = True

    def __init__(
        self,
        gate=None,
        loc=0.0,
        scale=1.0,
        *,
        gate_logits=None,
        slope=50.0,
        spike_estimator="relaxed",
        temperature=0.5,
        validate_args=None,
    ):
        if (gate is None) == (gate_logits is None):
            raise ValueError(
                "Either `gate` or `gate_logits` must be specified, but not both."
            )
        # Remember which parametrisation was given: once the lazy properties
        # have been read both names are in __dict__, so __dict__ alone cannot
        # tell expand() which one to carry forward.
        self._param_name = "gate" if gate is not None else "gate_logits"
        param = gate if gate is not None else gate_logits
        param, self.loc, self.scale = broadcast_all(param, loc, scale)
        setattr(self, self._param_name, param)
        if spike_estimator not in ("relaxed", "straight_through"):
            raise ValueError(
                f"spike_estimator must be 'relaxed' or 'straight_through', got {spike_estimator!r}"
            )
        self.spike_estimator = spike_estimator
        self.slope = slope
        self.temperature = temperature
        super().__init__(param.shape, torch.Size(), validate_args=validate_args)

    @property
    def slope(self):
        """The sigmoid slope c of the relaxed step in :meth:`rsample`."""
        return self._slope

    @slope.setter
    def slope(self, value):
        value = float(value)
        if not value > 0:
            raise ValueError(f"Expected slope > 0, got {value}")
        self._slope = value

    @property
    def temperature(self):
        """The temperature τ of the straight-through estimator's relaxation in :meth:`rsample`."""
        return self._temperature

    @temperature.setter
    def temperature(self, value):
        value = float(value)
        if not value > 0:
            raise ValueError(f"Expected temperature > 0, got {value}")
        self._temperature = value

    @lazy_property
    def gate(self):
        return logits_to_probs(self.gate_logits, is_binary=True)

    @lazy_property
    def gate_logits(self):
        return probs_to_logits(self.gate, is_binary=True)

    def _one_minus_gate(self):
        # From logits, sigmoid(-l) keeps 1 - γ accurate when γ is close to 1.
        if self._param_name == "gate_logits":
            return torch.sigmoid(-self.gate_logits)
        return 1 - self.gate

    def _log_gates(self, use_slab, use_spike):
        """
        (log γ, log(1 - γ)), each needed only where its mask is true.

        From logits both are softplus forms, accurate even where γ or 1 - γ
        rounds to 0. From ``gate`` the log's argument is replaced by a harmless
        1 where the term is not needed: torch.where zeroes the upstream
        gradient of the unused branch, but 0 * (d/dγ log γ at γ = 0 = inf) is
        still NaN, so the infinity must never be formed (the "double where"
        trick). Likewise an unused -inf from an infinite logit is replaced by
        0, since a caller's 0 * (-inf) would be NaN.
        """
        if self._param_name == "gate_logits":
            logits = self.gate_logits
            zero = torch.zeros_like(logits)
            return (
                torch.where(use_slab, -softplus(-logits), zero),
                torch.where(use_spike, -softplus(logits), zero),
            )
        gate = self.gate
        log_gate = torch.log(torch.where(use_slab, gate, torch.ones_like(gate)))
        log1m_gate = torch.log1p(-torch.where(use_spike, gate, torch.zeros_like(gate)))
        return log_gate, log1m_gate

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(SpikeAndSlab, _instance)
        batch_shape = torch.Size(batch_shape)
        param = getattr(self, self._param_name).expand(batch_shape)
        SpikeAndSlab.__init__(
            new,
            loc=self.loc.expand(batch_shape),
            scale=self.scale.expand(batch_shape),
            slope=self.slope,
            spike_estimator=self.spike_estimator,
            temperature=self.temperature,
            validate_args=False,
            **{self._param_name: param},
        )
        new._validate_args = self._validate_args
        return new

    def log_prob(self, value):
        r"""
        Density w.r.t. (counting measure at 0) + (Lebesgue measure):
        log(1 - γ) at ``value == 0`` exactly, log γ + log N(value; μ, σ²)
        elsewhere. The Gaussian puts no mass on the single point 0, and the
        point mass has no Lebesgue density, so the two branches do not mix.
        """
        if self._validate_args:
            self._validate_sample(value)
        value, loc, scale = broadcast_all(value, self.loc, self.scale)
        is_zero = value == 0
        log_gate, log1m_gate = self._log_gates(~is_zero, is_zero)
        normal_log_prob = (
            -0.5 * ((value - loc) / scale) ** 2 - scale.log() - _HALF_LOG_TWO_PI
        )
        return torch.where(is_zero, log1m_gate, log_gate + normal_log_prob)

    def sample(self, sample_shape=torch.Size()):
        shape = self._extended_shape(sample_shape)
        with torch.no_grad():
            in_slab = torch.bernoulli(self.gate.expand(shape)).bool()
            slab = torch.normal(self.loc.expand(shape), self.scale.expand(shape))
            return torch.where(in_slab, slab, torch.zeros_like(slab))

    def rsample(self, sample_shape=torch.Size()):
        r"""
        Reparameterised draw z = b (μ + σ ε), ε ~ N(0, 1), whose spike
        indicator b depends on ``spike_estimator``:

        * ``"relaxed"`` (UAI supplement B.1; ICLR Eq. 24):
          b = T(η - 1 + γ), η ~ U(0, 1), with T(y) = sigmoid(slope · y). With
          the hard step T, η ≥ 1 - γ has probability γ, so the indicator is
          Bernoulli(γ) (supplement B.2); the sigmoid makes it differentiable
          in γ and tends to the step as ``slope`` → ∞. Draws are almost
          surely non-zero.
        * ``"straight_through"`` (Fallah & Rozell 2022, Sec. 4.1; Jang et al.
          2017): b is the rounded binary Concrete sample
          sigmoid((logit γ + logit η) / τ), i.e. exactly 1 where
          logit η > -logit γ, which has probability γ, and 0 otherwise, so
          the codes are exactly spike-and-slab distributed; the backward pass
          differentiates the unrounded Concrete sample instead (Pyro's
          :class:`~pyro.distributions.RelaxedBernoulliStraightThrough` at
          ``temperature`` τ).

        The indicator's uniform η is drawn before ε.
        """
        shape = self._extended_shape(sample_shape)
        loc = self.loc
        if self.spike_estimator == "straight_through":
            temperature = torch.tensor(self.temperature, dtype=loc.dtype, device=loc.device)
            spike = RelaxedBernoulliStraightThrough(temperature, logits=self.gate_logits).rsample(sample_shape)
        else:
            eta = torch.rand(shape, dtype=loc.dtype, device=loc.device)
            spike = torch.sigmoid(self.slope * (eta - 1 + self.gate))
        eps = torch.randn(shape, dtype=loc.dtype, device=loc.device)
        return spike * (loc + self.scale * eps)

    def _slab_cdf(self, value):
        """γ Φ((z - μ)/σ): the slab's mass below ``value``."""
        return self.gate * ndtr((value - self.loc) / self.scale)

    def cdf(self, value):
        r"""
        P(z ≤ value) = γ Φ((value - μ)/σ) + (1 - γ) 1[value ≥ 0]: the slab's
        Gaussian CDF plus the atom, right-continuous at 0.
        """
        if self._validate_args:
            self._validate_sample(value)
        return spike_and_slab_cdf(value, self._one_minus_gate(), self._slab_cdf(value))

    def icdf(self, value):
        r"""
        The generalised inverse of :meth:`cdf` (see
        :func:`spike_and_slab_icdf`), exactly 0 for probabilities on the jump
        of the atom.
        """
        gate = self.gate

        def slab_icdf(v):
            return self.loc + self.scale * torch.special.ndtri((v / gate).clamp(0, 1))

        zero = torch.zeros_like(self.loc)
        return spike_and_slab_icdf(value, self._one_minus_gate(), self._slab_cdf(zero), gate, slab_icdf)

    def entropy(self):
        r"""
        Entropy with respect to (counting measure at 0) + (Lebesgue measure),
        the measure of :meth:`log_prob`:

        .. math::

            -\gamma\log\gamma - (1 - \gamma)\log(1 - \gamma)
            + \gamma\,\tfrac12\log(2\pi e\sigma^2),

        the entropy of the indicator plus γ times the slab's differential
        entropy (the atom and the slab live on disjoint sets). With 0 log 0 = 0.
        """
        gate, one_minus_gate = self.gate, self._one_minus_gate()
        log_gate, log1m_gate = self._log_gates(gate > 0, one_minus_gate > 0)
        normal_entropy = 0.5 + _HALF_LOG_TWO_PI + self.scale.log()
        return -gate * log_gate - one_minus_gate * log1m_gate + gate * normal_entropy

    @property
    def mean(self):
        return self.gate * self.loc

    @property
    def mode(self):
        # The mass of the atom (1 - γ) is compared with the slab's probability
        # γ: a code is exactly 0 where the spike is more probable.
        return torch.where(self.gate > 0.5, self.loc, torch.zeros_like(self.loc))

    @property
    def variance(self):
        # γσ² + γ(1 - γ)μ²: E[z²] - E[z]² would cancel for a narrow slab far from 0.
        return self.gate * (self.scale**2 + self._one_minus_gate() * self.loc**2)


def _weighted_log_ratio(weight, log_num, log_den):
    # weight · (log_num - log_den), with 0 · (anything) = 0: the xlogy
    # convention. The masked logs are finite, so the where is NaN-free.
    return torch.where(weight > 0, weight * (log_num - log_den), torch.zeros_like(weight))


@register_kl(SpikeAndSlab, SpikeAndSlab)
def _kl_spike_and_slab(q, p):
    r"""
    Closed-form KL(q ‖ p), elementwise over the batch shape (ICLR Eq. 9 / 23
    for a standard-normal prior; UAI supplement C, Eq. 9-10 in general):

    .. math::

        \gamma_q \mathrm{KL}(\mathcal{N}_q \| \mathcal{N}_p)
        + \gamma_q \log\frac{\gamma_q}{\gamma_p}
        + (1 - \gamma_q) \log\frac{1 - \gamma_q}{1 - \gamma_p}.

    The slab-vs-spike cross terms vanish (supplement C), leaving the
    γ-weighted Gaussian KL plus the Bernoulli KL of the spike indicators.
    (The supplement's Eq. 9 prints σ where σ² is meant; the standard
    Gaussian KL is used here.)
    """
    gate_q = q.gate
    one_minus_gate_q = q._one_minus_gate()
    # Each log ratio is needed only where its weight is non-zero.
    use_slab = gate_q > 0
    use_spike = one_minus_gate_q > 0
    log_gate_q, log1m_gate_q = q._log_gates(use_slab, use_spike)
    log_gate_p, log1m_gate_p = p._log_gates(use_slab, use_spike)

    # log σ_q² / σ_p² from the logs: the ratio itself underflows in float32 once σ_q / σ_p < 1e-22.
    log_var_ratio = 2 * (q.scale.log() - p.scale.log())
    t1 = ((q.loc - p.loc) / p.scale) ** 2
    kl_normal = 0.5 * (log_var_ratio.exp() + t1 - 1 - log_var_ratio)

    return (
        gate_q * kl_normal
        + _weighted_log_ratio(gate_q, log_gate_q, log_gate_p)
        + _weighted_log_ratio(one_minus_gate_q, log1m_gate_q, log1m_gate_p)
    )
