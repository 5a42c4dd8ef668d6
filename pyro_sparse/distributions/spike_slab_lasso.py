import math

import torch
from pyro.distributions import TorchDistribution
from torch.distributions import constraints
from torch.distributions.utils import broadcast_all


class SpikeSlabLasso(TorchDistribution):
    r"""
    Spike-and-Slab Lasso prior (Ročková & George 2018), marginalised over the
    indicator: Moran et al. (2022) Eq. 2-4,

    .. math::

        p(w) = \eta\,\psi_1(w) + (1 - \eta)\,\psi_0(w),
        \qquad \psi_s(w) = \frac{\lambda_s}{2} e^{-\lambda_s |w|},

    a mixture of a wide Laplace "slab" (rate ``lambda1``) and a narrow Laplace
    "spike" (rate ``lambda0`` ≫ ``lambda1``), with the Laplace normalisers.

    The CDF is the same mixture of the two Laplace CDFs. There is no
    ``icdf`` (the mixture's quantile solves a transcendental equation) and no
    ``entropy`` (the log of the two-term sum does not integrate in closed form).

    :param torch.Tensor eta: probability of the slab, in [0, 1].
    :param torch.Tensor lambda0: rate of the spike.
    :param torch.Tensor lambda1: rate of the slab.
    """

    arg_constraints = {
        "eta": constraints.unit_interval,
        "lambda0": constraints.positive,
        "lambda1": constraints.positive,
    }
    support = constraints.real
    has_rsample = False

    def __init__(self, eta, lambda0, lambda1, validate_args=None):
        self.eta, self.lambda0, self.lambda1 = broadcast_all(eta, lambda0, lambda1)
        super().__init__(self.eta.shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(SpikeSlabLasso, _instance)
        batch_shape = torch.Size(batch_shape)
        new.eta = self.eta.expand(batch_shape)
        new.lambda0 = self.lambda0.expand(batch_shape)
        new.lambda1 = self.lambda1.expand(batch_shape)
        super(SpikeSlabLasso, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def _log_densities(self, value):
        """log ψ1(w) and log ψ0(w), the slab's and the spike's Laplace log-densities."""
        abs_value = value.abs()
        return (torch.log(self.lambda1 / 2) - self.lambda1 * abs_value,
                torch.log(self.lambda0 / 2) - self.lambda0 * abs_value)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        # log(η ψ1 + (1-η) ψ0) with the larger log ψ of the weighted components factored out, not
        # through log η and log(1-η), whose infinite gradients at η = 0 or 1 (allowed) made η's NaN.
        # The weightless component's term is capped below overflow (its gradient is exact up to there).
        log_psi1, log_psi0 = self._log_densities(value)
        shift = torch.maximum(log_psi1.masked_fill(self.eta == 0, -math.inf),
                              log_psi0.masked_fill(self.eta == 1, -math.inf)).detach().nan_to_num(neginf=0.0)
        cap = math.log(torch.finfo(shift.dtype).max) - 1
        slab, spike = ((log_psi - shift).clamp(max=cap).exp() for log_psi in (log_psi1, log_psi0))
        return shift + torch.log(self.eta * slab + (1 - self.eta) * spike)

    def inclusion_probability(self, value):
        r"""
        Posterior probability that ``value`` came from the slab,
        E[γ | w, η] = η ψ1(w) / (η ψ1(w) + (1-η) ψ0(w))  (Eq. 57).
        Computed from log-densities so it neither under- nor overflows.
        """
        log_psi1, log_psi0 = self._log_densities(value)
        return torch.sigmoid(torch.log(self.eta) + log_psi1 - torch.log1p(-self.eta) - log_psi0)

    def penalty_weight(self, value):
        r"""
        The adaptive lasso weight λ*(w, η) = λ1 E[γ] + λ0 (1 - E[γ]) (Eq. 58):
        the magnitude of ∂/∂|w| of -log p(w), so -log p has slope λ* at w.
        """
        p = self.inclusion_probability(value)
        return self.lambda1 * p + self.lambda0 * (1 - p)

    @property
    def inclusion_threshold(self):
        r"""
        δ, the \|w\| above which the slab is the likelier component
        (E[γ | w] > 1/2): η λ1 e^{-λ1 δ} = (1 - η) λ0 e^{-λ0 δ}, so
        δ = log((1 - η) λ0 / (η λ1)) / (λ0 - λ1), and 0 where the slab wins
        everywhere.  With λ0 = λ1 (the Lasso ablation) E[γ] = η for all w:
        δ = 0 if η ≥ 1/2, else ∞.  The SSL's spike is the narrower component
        (λ0 ≥ λ1); for λ0 < λ1 δ is that of the equal-rate case.
        """
        ratio = torch.log1p(-self.eta) - torch.log(self.eta) + torch.log(self.lambda0 / self.lambda1)
        gap = self.lambda0 - self.lambda1
        lasso = torch.where(self.eta >= 0.5, torch.zeros_like(ratio), torch.full_like(ratio, math.inf))
        return torch.where(gap > 0, (ratio / gap.clamp(min=torch.finfo(gap.dtype).tiny)).clamp(min=0), lasso)

    def slab_region_probability(self, loc, scale):
        r"""
        P(\|w\| > δ | y) for w with this prior and data whose likelihood in w is
        Gaussian, N(w; m, s²) with m = ``loc`` and s = ``scale``: the posterior probability that w
        lies where the slab is the likelier component (:attr:`inclusion_threshold`),
        i.e. that the E-step's support call E[γ | w] > 1/2 holds.  Unlike
        E[γ | y], which stays above η λ1 / (η λ1 + (1 - η) λ0) however
        precisely the data put w at 0, it tends to 0 or 1 as the data grow,
        and to the prior's P(\|w\| > δ) as they fade.

        Closed form: over each half-line a Laplace component times the
        Gaussian is a Gaussian in w up to a factor, e.g. for w ≥ 0
        e^{-λw} N(w; m, s²) = e^{-λm + λ²s²/2} N(w; m - λs², s²), so every
        interval's mass is a difference of normal CDFs
        (:func:`_log_laplace_normal_mass`).  Computed in float64 and returned
        in float64.
        """
        loc, scale, eta, lambda0, lambda1 = broadcast_all(*(
            torch.as_tensor(value, dtype=torch.float64, device=self.eta.device)
            for value in (loc, scale, self.eta, self.lambda0, self.lambda1)
        ))
        threshold = SpikeSlabLasso(eta, lambda0, lambda1).inclusion_threshold
        zero, inf = torch.zeros_like(loc), torch.full_like(loc, math.inf)
        inside, outside = [], []
        for log_weight, rate in ((torch.log(eta), lambda1), (torch.log1p(-eta), lambda0)):
            # w <= 0 is w' = -w >= 0 under N(w'; -m, s²): both half-lines as intervals of |w|.
            for centre in (loc, -loc):
                log_weight_rate = log_weight + torch.log(rate / 2)
                inside.append(log_weight_rate + _log_laplace_normal_mass(rate, centre, scale, zero, threshold))
                outside.append(log_weight_rate + _log_laplace_normal_mass(rate, centre, scale, threshold, inf))
        log_outside = torch.logsumexp(torch.stack(outside), 0)
        # δ = 0 (the slab likelier everywhere) leaves no inside: probability 1, without logsumexp's NaN gradient.
        inside, empty = torch.stack(inside), threshold <= 0
        log_inside = torch.where(empty, -math.inf, torch.logsumexp(torch.where(empty, 0.0, inside), 0))
        return torch.exp(log_outside - torch.logaddexp(log_outside, log_inside))

    def sample(self, sample_shape=torch.Size()):
        shape = self._extended_shape(sample_shape)
        with torch.no_grad():
            in_slab = torch.bernoulli(self.eta.expand(shape)).bool()
            rate = torch.where(in_slab, self.lambda1.expand(shape), self.lambda0.expand(shape))
            # A Laplace(0, 1/rate) draw: exponential magnitude with a random sign.
            magnitude = torch.empty(shape, dtype=rate.dtype, device=rate.device).exponential_()
            sign = torch.randint(0, 2, shape, device=rate.device).to(rate.dtype) * 2 - 1
            return sign * magnitude / rate

    def cdf(self, value):
        r"""
        η F₁(w) + (1 - η) F₀(w), F the Laplace(0, 1/λ) CDFs: with
        :math:`S = P(|W| > |w|) = \eta e^{-\lambda_1|w|} + (1 - \eta) e^{-\lambda_0|w|}`,
        it is S/2 for w < 0 and 1 - S/2 otherwise, which keeps the lower
        tail's relative accuracy.
        """
        if self._validate_args:
            self._validate_sample(value)
        abs_value = value.abs()
        half_tail = 0.5 * (
            self.eta * torch.exp(-self.lambda1 * abs_value) + (1 - self.eta) * torch.exp(-self.lambda0 * abs_value)
        )
        return torch.where(value < 0, half_tail, 1 - half_tail)

    @property
    def mean(self):
        return torch.zeros_like(self.eta)

    @property
    def variance(self):
        # Var of Laplace(0, 1/λ) is 2/λ²; the mixture of zero-mean parts adds them.
        return 2 * self.eta / self.lambda1**2 + 2 * (1 - self.eta) / self.lambda0**2


def _log1mexp(x):
    """
    log(1 - e^x) for x <= 0, accurate near 0 and far below it.  Each branch
    sees only inputs it is accurate on: ``torch.where`` back-propagates 0 × the
    unused branch's gradient, NaN where that is infinite (log1p(-e^x) at
    e^x = 1 in float32, x ≥ -3e-8).
    """
    near_zero = x > -math.log(2)
    return torch.where(near_zero, torch.log(-torch.expm1(torch.where(near_zero, x, -1.0))),
                       torch.log1p(-torch.exp(torch.where(near_zero, -1.0, x))))


def _log_laplace_normal_mass(rate, loc, scale, low, high):
    r"""
    log ∫_low^high e^{-λw} N(w; m, s²) dw for 0 <= low <= high <= ∞ (-inf for an empty interval).

    With μ = m - λs² and u_t = (t - μ)/s the integral is
    e^{-λm + λ²s²/2} (Φ(u_high) - Φ(u_low)).  Where the interval lies in one
    tail of N(μ, s²) the factor and the CDFs would cancel (the factor grows as
    e^{λ²s²/2} for a wide likelihood), so there the tail beyond t is written
    with the scaled complementary error function erfcx: ½ erfcx(\|u_t\|/√2)
    e^{-λt - (t - m)²/2s²}, whose exponent stays bounded.
    """
    empty = ~(low < high)
    high = torch.where(empty, low + 1, high)  # a stand-in; an empty interval's mass is the constant -inf
    shift = loc - rate * scale**2

    # An infinite end is a constant: computed from a finite stand-in and masked, it sends no ∞ · 0 = NaN back.
    def standardised(t):
        infinite = torch.isinf(t)
        return torch.where(infinite, t, (torch.where(infinite, shift, t) - shift) / scale)

    def log_tail(t, u):  # log of the mass beyond t, on the side away from μ; -inf (a constant) at t = ∞
        infinite = torch.isinf(t)
        t, u = torch.where(infinite, loc, t), torch.where(infinite, 0.0, u)
        tail = torch.log(torch.special.erfcx(u.abs() / math.sqrt(2)) / 2) - rate * t - ((t - loc) / scale) ** 2 / 2
        return torch.where(infinite, -math.inf, tail)

    u_low, u_high = standardised(low), standardised(high)

    # Three formulas, one per position of the interval; each is fed only the
    # inputs it is meant for, so that the unused ones (log 0, ∞ - ∞) send no
    # NaN through torch.where's gradient.
    is_upper, is_lower = u_low >= 0, u_high <= 0
    tail_low, tail_high = log_tail(low, u_low), log_tail(high, u_high)
    upper = tail_low + _log1mexp(torch.where(is_upper, tail_high - tail_low, -1.0))
    lower = tail_high + _log1mexp(torch.where(is_lower, tail_low - tail_high, -1.0))
    inside = ~(is_upper | is_lower)
    interval = _log_normal_interval(torch.where(inside, u_low, -1.0), torch.where(inside, u_high, 1.0))
    middle = -rate * loc + (rate * scale) ** 2 / 2 + interval
    mass = torch.where(is_upper, upper, torch.where(is_lower, lower, middle))
    return torch.where(empty, -math.inf, mass)


def _log_normal_interval(low, high):
    """log(Φ(high) - Φ(low)) for low < high, accurate in both tails (an interval above 0 is mirrored below it)."""
    mirror = low > 0
    low, high = torch.where(mirror, -high, low), torch.where(mirror, -low, high)
    log_high, log_low = torch.special.log_ndtr(high), torch.special.log_ndtr(low)
    return log_high + _log1mexp(log_low - log_high)
