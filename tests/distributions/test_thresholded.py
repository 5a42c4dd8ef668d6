"""Tests of the thresholded Laplace / Gaussian distributions (Fallah & Rozell 2022).

The generic properties (shapes, expand, validation, log_prob against scipy,
the spike mass and slab law of hard samples, moments, cdf/icdf, entropy) are
in test_distribution_contract.py. Here: hard samples reject the plausible
wrong laws (unshifted tails, the other family's spike mass); log_prob against
quadrature over the mixed measure and its gradients; variance limits and the
mode; the jump, straight-through and subgradient rsample paths against their
exact per-element gradients, and the jump estimator against the exact gradient
of an expectation; the base-family KLs (torch's), the registered KLs of the
thresholded laws against quadrature and Monte Carlo, the training surrogates
(``kl_objective``); and expand of the class's own attributes.
"""

import itertools
import math

import numpy as np
import pytest
import scipy.integrate
import scipy.stats
import torch
import torch.distributions.kl as torch_kl
from torch.distributions import Gamma, Laplace, Normal, kl_divergence

from pyro_sparse.distributions import ThresholdedLaplace, ThresholdedNormal
from pyro_sparse.distributions.thresholded import thresholded_laplace_kl, thresholded_normal_kl

# loc, scale, threshold
PARAMS = [
    (0.0, 1.0, 0.5),
    (1.5, 0.5, 1.0),
    (-2.0, 3.0, 0.2),
    (0.7, 0.2, 0.05),
]
N = 20_000


def f64(x):
    return torch.tensor(x, dtype=torch.float64)


def laplace_gate(loc, scale, lam):
    return math.exp(-lam / scale)


def normal_gate(loc, scale, lam):
    return math.erfc(lam / (scale * math.sqrt(2)))


FAMILIES = [(ThresholdedLaplace, laplace_gate), (ThresholdedNormal, normal_gate)]
FAMILY_IDS = ["laplace", "normal"]


# --------------------------------------------------------------------------
# Sampling: the draws reject the wrong laws (their goodness of fit to the
# right one is in test_distribution_contract.py)
# --------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [ThresholdedLaplace, ThresholdedNormal], ids=FAMILY_IDS)
def test_ks_detects_unshifted_tails(cls):
    # Power check: the non-zeros are the base's tails *shifted inwards*, not
    # the base restricted to |s - μ| > λ, and the test above can tell.
    loc, scale, lam = 0.5, 1.0, 0.8
    torch.manual_seed(2)
    z = cls(f64(loc), f64(scale), f64(lam)).sample((N,))
    nz = z[z != 0].numpy()
    base = scipy.stats.laplace if cls is ThresholdedLaplace else scipy.stats.norm

    def unshifted_cdf(x):
        inner = base.cdf(x, loc, scale)
        lo, hi = base.cdf(loc - lam, loc, scale), base.cdf(loc + lam, loc, scale)
        tail = 1 - (hi - lo)
        return (
            np.where(
                x < loc - lam, inner, np.where(x < loc + lam, lo, inner - (hi - lo))
            )
            / tail
        )

    assert scipy.stats.kstest(nz, unshifted_cdf).pvalue < 1e-6


def test_gate_formulas_are_family_specific():
    # Power check for the zero-fraction test: with λ/σ = 2 the Laplace gate
    # exp(-2) ≈ 0.135 and the Gaussian gate erfc(√2) ≈ 0.046 are far apart, and
    # the Gaussian sampler's zero fraction rejects the Laplace formula.
    loc, scale, lam = 0.0, 1.0, 2.0
    assert laplace_gate(loc, scale, lam) != pytest.approx(
        normal_gate(loc, scale, lam), abs=0.05
    )
    torch.manual_seed(3)
    z = ThresholdedNormal(f64(loc), f64(scale), f64(lam)).sample((N,))
    frac = (z != 0).double().mean().item()
    g = laplace_gate(loc, scale, lam)
    assert abs(frac - g) > 10 * math.sqrt(g * (1 - g) / N)


# --------------------------------------------------------------------------
# log_prob over the mixed measure
# --------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES, ids=FAMILY_IDS)
@pytest.mark.parametrize("loc,scale,lam", PARAMS)
def test_log_prob_integrates_to_one(family, loc, scale, lam):
    cls, gate_fn = family
    d = cls(f64(loc), f64(scale), f64(lam))
    atom = d.log_prob(f64(0.0)).exp().item()
    assert atom == pytest.approx(1 - gate_fn(loc, scale, lam), rel=1e-10)

    def density(x):
        return d.log_prob(f64(x)).exp().item()

    # Split at 0 and μ so the quadrature never evaluates the atom, and at the
    # slab's cusp μ.
    cuts = sorted({0.0, loc})
    edges = [-math.inf, *cuts, math.inf]
    cont = sum(
        scipy.integrate.quad(density, a, b, epsabs=1e-11, epsrel=1e-11)[0]
        for a, b in itertools.pairwise(edges)
    )
    assert cont == pytest.approx(gate_fn(loc, scale, lam), abs=1e-7)
    assert atom + cont == pytest.approx(1.0, abs=1e-7)


@pytest.mark.parametrize("cls", [ThresholdedLaplace, ThresholdedNormal], ids=FAMILY_IDS)
def test_log_prob_gradients_not_nan_when_spike_mass_underflows(cls):
    # float32 λ/scale = 1e-50 underflows to 0, so log(1 - γ) = -inf; the
    # unused spike branch must not poison the slab's gradient.
    loc = torch.tensor(0.0, requires_grad=True)
    scale = torch.tensor(1e30, requires_grad=True)
    lam = torch.tensor(1e-20, requires_grad=True)
    lp = cls(loc, scale, lam).log_prob(torch.tensor([1.0, -3.0])).sum()
    assert torch.isfinite(lp)
    lp.backward()
    for t in (loc, scale, lam):
        assert torch.isfinite(t.grad)


# --------------------------------------------------------------------------
# Moments and mode
# --------------------------------------------------------------------------


def test_normal_variance_limits():
    # λ → 0 recovers the base variance; large λ/σ stays finite and >= 0.
    d = ThresholdedNormal(f64(1.0), f64(2.0), f64(1e-12))
    assert d.variance.item() == pytest.approx(4.0, rel=1e-9)
    d = ThresholdedNormal(
        torch.tensor(1.0), torch.tensor(1.0), torch.tensor([10.0, 40.0])
    )
    assert torch.all(d.variance >= 0) and torch.all(torch.isfinite(d.variance))


def test_normal_moments_and_kl_when_the_tail_ratio_overflows():
    # λ/σ beyond float32's range for its square (σ = 1e-20, or λ = 1e30): the code is 0 with probability 1, so
    # its variance and entropy are 0 and its KL to p is -log(1 - γ_p), not inf·0 = NaN.
    p = ThresholdedNormal(torch.tensor(0.0), torch.tensor(1.0), torch.tensor(0.5))
    for scale, lam in [(1e-20, 1.0), (1.0, 1e30)]:
        q = ThresholdedNormal(torch.tensor(0.3), torch.tensor(scale), torch.tensor(lam))
        assert q.variance.item() == 0.0 and q.entropy().item() == 0.0
        assert kl_divergence(q, p).item() == pytest.approx(-torch.log1p(-p.gate).item(), rel=1e-6)


def test_mode():
    loc = f64([2.0, 2.0, -1.0, -1.0])
    scale = f64([1.0, 1.0, 1.0, 1.0])
    # Laplace: spike mass 1 - exp(-λ/b) > 1/2 iff λ/b > log 2.
    lam = f64([math.log(2) - 0.01, math.log(2) + 0.01, 0.1, 3.0])
    d = ThresholdedLaplace(loc, scale, lam)
    assert torch.equal(d.mode, f64([2.0, 0.0, -1.0, 0.0]))
    # Thresholding the base mode would always give 0: T(μ) = 0.
    assert torch.all(d._threshold_map(loc) == 0)
    # Normal: erf(λ/(σ√2)) > 1/2 iff λ/σ > Φ⁻¹(3/4) ≈ 0.6745.
    q = scipy.stats.norm.ppf(0.75)
    d = ThresholdedNormal(loc, scale, f64([q - 0.01, q + 0.01, 0.1, 3.0]))
    assert torch.equal(d.mode, f64([2.0, 0.0, -1.0, 0.0]))
    # The slab mode is μ: the slab density is largest at z → μ on both sides.
    slab = d.log_prob(loc[:1] + f64([-1e-6, 1e-6, 0.3, -0.3]))
    assert torch.all(slab[:2] > slab[2:])


# --------------------------------------------------------------------------
# rsample: jump (default), straight-through (Eq. 4), subgradient (Appendix C)
# --------------------------------------------------------------------------


def _grads(cls, estimator, seed=5, n=4000):
    loc = torch.linspace(-1, 1, n, dtype=torch.float64).requires_grad_()
    scale = torch.full((n,), 0.7, dtype=torch.float64, requires_grad=True)
    lam = torch.full((n,), 0.6, dtype=torch.float64, requires_grad=True)
    d = cls(loc, scale, lam, estimator=estimator)
    torch.manual_seed(seed)
    z = d.rsample()
    torch.manual_seed(seed)
    s = d.base_dist.sample()
    z.sum().backward()
    return z.detach(), s, loc, scale, lam


def _gate_grads(cls, loc, scale, lam):
    """∂γ/∂scale and ∂γ/∂λ by autograd of the gate formula."""
    scale, lam = scale.detach().clone().requires_grad_(), lam.detach().clone().requires_grad_()
    gate = cls(loc.detach(), scale, lam).gate
    return torch.autograd.grad(gate.sum(), (scale, lam))


@pytest.mark.parametrize("cls", [ThresholdedLaplace, ThresholdedNormal], ids=FAMILY_IDS)
def test_straight_through_gradients(cls):
    z, s, loc, scale, lam = _grads(cls, "straight_through")
    zero = z == 0
    assert 0.1 < zero.double().mean() < 0.9
    # μ is reached once, through s: gradient 1 everywhere, never 1 + 1[z != 0].
    assert torch.equal(loc.grad, torch.ones_like(loc))
    # ∂s/∂scale = (s - μ)/scale for both location-scale bases, also where z = 0.
    ds = (s - loc.detach()) / scale.detach()
    assert torch.allclose(scale.grad, ds, rtol=1e-10, atol=1e-12)
    assert torch.all(scale.grad[zero] != 0)
    # λ: gradient through T_λ(sg[s]): -sign(s - μ) on the slab, 0 on the spike.
    expected = torch.where(zero, torch.zeros_like(s), -torch.sign(s - loc.detach()))
    assert torch.equal(lam.grad, expected)


@pytest.mark.parametrize("cls", [ThresholdedLaplace, ThresholdedNormal], ids=FAMILY_IDS)
def test_subgradient_is_exactly_zero_on_spike(cls):
    z, s, loc, scale, lam = _grads(cls, "subgradient")
    zero = z == 0
    assert zero.any() and (~zero).any()
    for t in (loc, scale, lam):
        assert torch.all(t.grad[zero] == 0)
    assert torch.equal(loc.grad[~zero], torch.ones_like(loc)[~zero])
    ds = (s - loc.detach()) / scale.detach()
    assert torch.allclose(scale.grad[~zero], ds[~zero], rtol=1e-10, atol=1e-12)
    assert torch.equal(lam.grad[~zero], -torch.sign(s - loc.detach())[~zero])


@pytest.mark.parametrize("cls", [ThresholdedLaplace, ThresholdedNormal], ids=FAMILY_IDS)
def test_jump_gradients(cls):
    # The subgradient's pathwise part plus μ ∂γ: the jump 0 -> μ at the band's
    # edge, weighted by the rate at which the edge sweeps over the base's mass.
    z, s, loc, scale, lam = _grads(cls, "jump")
    on = (z != 0).double()
    assert 0.1 < on.mean() < 0.9
    assert torch.equal(loc.grad, on)  # a zeroed coordinate passes nothing to μ: no drift
    gate_scale, gate_lam = _gate_grads(cls, loc, scale, lam)
    ds = (s - loc.detach()) / scale.detach()
    mu = loc.detach()
    assert torch.allclose(scale.grad, on * ds + mu * gate_scale, rtol=1e-10, atol=1e-12)
    assert torch.allclose(lam.grad, -on * torch.sign(s - mu) + mu * gate_lam, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cls", [ThresholdedLaplace, ThresholdedNormal], ids=FAMILY_IDS)
def test_jump_is_unbiased_for_a_linear_loss_and_straight_through_is_not(cls):
    # For f(z) = c z, E f = c γ μ exactly (the slab is symmetric about μ), so
    # its exact gradient is c ∂(γ μ); the jump estimator's first-order jump
    # term is exact here, the straight-through one is not (∂/∂μ = c, not c γ).
    n, c = 400_000, 1.7
    params = [f64(0.8), f64(0.5), f64(0.45)]  # μ, scale, λ
    leaves = [p.clone().requires_grad_() for p in params]
    d = cls(*leaves)
    exact = torch.autograd.grad(c * d.gate * d.loc, leaves)
    for estimator, unbiased in (("jump", True), ("straight_through", False)):
        leaves = [p.clone().requires_grad_() for p in params]
        torch.manual_seed(11)
        z = cls(*[t.expand(n) for t in leaves], estimator=estimator).rsample()
        grads = torch.autograd.grad(c * z.mean(), leaves)
        close = all(abs(g - e) < 0.02 for g, e in zip(grads, exact))
        assert close is unbiased, (estimator, grads, exact)


@pytest.mark.parametrize("cls", [ThresholdedLaplace, ThresholdedNormal], ids=FAMILY_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rsample_forward_equals_hard_threshold(cls, dtype):
    loc = torch.randn(3, 50, dtype=dtype)
    scale = torch.rand(3, 50, dtype=dtype) + 0.1
    lam = torch.rand(3, 50, dtype=dtype) + 0.01
    outs = []
    for estimator in ("jump", "straight_through", "subgradient"):
        d = cls(loc.requires_grad_(), scale.requires_grad_(), lam, estimator=estimator)
        torch.manual_seed(6)
        outs.append(d.rsample((7,)).detach())
    torch.manual_seed(6)
    hard = d.sample((7,))
    torch.manual_seed(6)
    s = d.base_dist.sample((7,))
    d_ = s - loc.detach()
    by_hand = torch.where(d_.abs() > lam, s - torch.sign(d_) * lam, torch.zeros_like(s))
    for out in outs:
        assert torch.equal(out, hard)
    assert torch.equal(hard, by_hand)
    assert (hard == 0).any()


def test_bad_estimator_and_kl_objective_are_named():
    with pytest.raises(ValueError, match="estimator"):
        ThresholdedLaplace(0.0, 1.0, 0.5, estimator="gumbel")
    with pytest.raises(ValueError, match="kl_objective"):
        ThresholdedNormal(0.0, 1.0, 0.5, kl_objective="augmented")  # needs the Laplace's memoryless slab


def test_gamma_threshold_gets_gradient():
    # λ drawn from a Gamma posterior (Sec. 3.2, Appendix B), carrying gradients.
    torch.manual_seed(7)
    alpha = torch.full((200,), 3.0, requires_grad=True)
    rate = torch.full((200,), 6.0, requires_grad=True)
    lam = Gamma(alpha, rate).rsample()
    loc = torch.zeros(200, requires_grad=True)
    z = ThresholdedLaplace(loc, 1.0, lam).rsample()
    (z**2).sum().backward()
    for t in (alpha, rate, loc):
        assert torch.all(torch.isfinite(t.grad)) and t.grad.abs().sum() > 0


# --------------------------------------------------------------------------
# KL divergences
# --------------------------------------------------------------------------


def _mc_kl(q, p, n=100_000, seed=8):
    torch.manual_seed(seed)
    x = q.sample((n,))
    lr = q.log_prob(x) - p.log_prob(x)
    return lr.mean(0), lr.std(0) / math.sqrt(n)


def meyer_kl(m1, b1, m2, b2):
    """Appendix B / Meyer (2021), general form."""
    return (
        math.log(b2 / b1)
        + abs(m1 - m2) / b2
        + (b1 / b2) * math.exp(-abs(m1 - m2) / b1)
        - 1
    )


def test_base_kls_come_from_torch_registry():
    # The paper's Eq. 5 uses the base-family KLs; torch registers all three,
    # so this module must not duplicate them.
    for pair in [(Laplace, Laplace), (Normal, Normal), (Gamma, Gamma)]:
        assert pair in torch_kl._KL_REGISTRY
        assert torch_kl._KL_REGISTRY[pair].__module__ == "torch.distributions.kl"


def _quadrature_kl(q, p):
    """KL over the mixed measure: the atom at 0 plus the slab integral, split at the kinks."""
    zero = f64(0.0)
    atom = (q.log_prob(zero).exp() * (q.log_prob(zero) - p.log_prob(zero))).item()

    def integrand(z):
        z = f64(z)
        log_q, log_p = q.log_prob(z), p.log_prob(z)
        return (log_q.exp() * (log_q - log_p)).item()

    kinks = sorted({q.loc.item(), p.loc.item(), 0.0})
    edges = [kinks[0] - 40.0, *kinks, kinks[-1] + 40.0]
    return atom + sum(
        scipy.integrate.quad(integrand, lo, hi, limit=200, epsabs=1e-12, epsrel=1e-10)[0]
        for lo, hi in zip(edges[:-1], edges[1:])
        if hi > lo
    )


KL_PAIRS = [
    ((0.3, 0.5, 0.2), (0.0, 1.0, 0.5)),
    ((-1.0, 2.0, 3.0), (0.5, 0.7, 0.1)),
    ((1.0, 0.4, 0.05), (1.0, 0.4, 1.0)),
    ((2.0, 1.0, 0.5), (-1.0, 0.5, 0.3)),
    ((0.5, 0.2, 0.01), (0.0, math.sqrt(0.1), 0.52)),  # a sharp, nearly dense posterior against the paper's prior
]


@pytest.mark.parametrize("cls,exact", [(ThresholdedLaplace, thresholded_laplace_kl),
                                       (ThresholdedNormal, thresholded_normal_kl)], ids=FAMILY_IDS)
@pytest.mark.parametrize("q,p", KL_PAIRS)
def test_registered_kl_is_the_kl_of_the_thresholded_laws(cls, exact, q, p):
    # Against quadrature over the mixed measure, also for different thresholds
    # in q and p, and through to_event as the mean-field ELBOs call it.
    dq, dp = cls(*map(f64, q)), cls(*map(f64, p))
    kl = kl_divergence(dq, dp)
    assert torch.equal(kl, exact(dq, dp))
    assert kl.item() == pytest.approx(_quadrature_kl(dq, dp), rel=1e-7, abs=1e-9)
    assert kl.item() != pytest.approx(kl_divergence(dq.base_dist, dp.base_dist).item(), rel=1e-3)
    batch = cls(f64([q[0], p[0]]), f64([q[1], p[1]]), f64([q[2], p[2]]))
    assert torch.allclose(kl_divergence(batch.to_event(1), dp.expand([2]).to_event(1)),
                          kl + kl_divergence(dp, dp))


def test_normal_kl_without_threshold_is_the_normal_kl():
    q, p = (0.7, 0.4), (-0.2, 1.3)
    tiny = f64(1e-12)
    kl = thresholded_normal_kl(ThresholdedNormal(*map(f64, q), tiny), ThresholdedNormal(*map(f64, p), tiny))
    assert kl.item() == pytest.approx(kl_divergence(Normal(*map(f64, q)), Normal(*map(f64, p))).item(), rel=1e-9)


@pytest.mark.parametrize("cls", [ThresholdedLaplace, ThresholdedNormal], ids=FAMILY_IDS)
def test_kl_gradients_finite_at_extreme_gates(cls):
    # Gates that round to 0 or 1 (λ/scale = 1e-3 or 40): no NaN in value or gradient.
    loc = torch.tensor([0.0, 1.0, -2.0], dtype=torch.float64, requires_grad=True)
    lam = torch.tensor([1e-3, 0.5, 40.0], dtype=torch.float64, requires_grad=True)
    q = cls(loc, f64(1.0), lam)
    assert torch.allclose(kl_divergence(q, q), torch.zeros(3, dtype=torch.float64), atol=1e-9)
    kl = kl_divergence(q, cls(f64(0.0), f64(0.5), f64(0.2)))
    assert torch.all(kl >= 0) and torch.all(torch.isfinite(kl))
    kl.sum().backward()
    assert torch.all(torch.isfinite(loc.grad)) and torch.all(torch.isfinite(lam.grad))


@pytest.mark.parametrize("cls", [ThresholdedLaplace, ThresholdedNormal], ids=FAMILY_IDS)
def test_kl_gradients_finite_when_the_gate_rounds_to_one_in_float32(cls):
    # λ/scale = 1e-9: e^{-λ/b} and erfc(λ/(b√2)) round to 1 in float32, so the
    # branch of log(1 - γ) meant for small γ is -inf there; where() must not let
    # its infinite gradient through as NaN (a threshold warm-up starts there).
    lam = torch.tensor([1e-9, 1e-6, 2.0], requires_grad=True)
    loc = torch.tensor([0.5, -1.0, 0.0], requires_grad=True)
    kl = kl_divergence(cls(loc, torch.ones(3), lam), cls(torch.zeros(3), torch.ones(3), torch.full((3,), 0.5)))
    kl.sum().backward()
    assert torch.all(torch.isfinite(kl))
    assert torch.all(torch.isfinite(loc.grad)) and torch.all(torch.isfinite(lam.grad))
    # d/dλ log(1 - γ) is finite and matches float64 at the smallest gate.
    ratio = torch.tensor([1e-9, 1e-3], requires_grad=True)
    exact = ratio.detach().double().requires_grad_()
    cls(torch.zeros(2), torch.ones(2), ratio)._log_spike_mass(ratio).sum().backward()
    cls(torch.zeros(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64), exact)._log_spike_mass(
        exact).sum().backward()
    assert torch.allclose(ratio.grad.double(), exact.grad, rtol=1e-4)


@pytest.mark.parametrize("q,p", KL_PAIRS)
def test_training_surrogates_of_a_prior(q, p):
    # kl_objective of the second argument picks the ELBO's term: the paper's
    # Eq. 5 base KL, or (Laplace) base KL + the gates' Bernoulli KL, which is
    # the KL of (gate, slab value) and so bounds the exact KL from above.
    dq = ThresholdedLaplace(*map(f64, q))
    args = [f64(v) for v in p]
    exact = kl_divergence(dq, ThresholdedLaplace(*args))
    base = kl_divergence(dq, ThresholdedLaplace(*args, kl_objective="base"))
    augmented = kl_divergence(dq, ThresholdedLaplace(*args, kl_objective="augmented"))
    assert torch.equal(base, kl_divergence(dq.base_dist, Laplace(args[0], args[1])))
    gate_q, gate_p = dq.gate, ThresholdedLaplace(*args).gate
    bernoulli = gate_q * torch.log(gate_q / gate_p) + (1 - gate_q) * torch.log((1 - gate_q) / (1 - gate_p))
    assert torch.allclose(augmented, base + bernoulli, rtol=1e-10)
    assert augmented >= exact
    normal = ThresholdedNormal(*map(f64, q))
    assert torch.equal(kl_divergence(normal, ThresholdedNormal(*args, kl_objective="base")),
                       kl_divergence(normal.base_dist, Normal(args[0], args[1])))


@pytest.mark.parametrize(
    "q,p",
    [((0.3, 0.5), (0.0, 1.0)), ((-1.0, 2.0), (0.5, 0.1)), ((1.0, 1.0), (1.0, 1.0))],
)
def test_laplace_kl_matches_meyer_and_monte_carlo(q, p):
    lq, lp = Laplace(f64(q[0]), f64(q[1])), Laplace(f64(p[0]), f64(p[1]))
    kl = kl_divergence(lq, lp).item()
    assert kl == pytest.approx(meyer_kl(*q, *p), rel=1e-12, abs=1e-14)
    mc, se = _mc_kl(lq, lp)
    assert abs(kl - mc.item()) < 5 * se.item() + 1e-12


def test_paper_laplace_kl_with_zero_prior_location():
    # Appendix B's form, prior Laplace(0, b0).
    mu, b, b0 = 0.8, 0.3, 0.1
    paper = abs(mu) / b0 + b * math.exp(-abs(mu) / b) / b0 + math.log(b0 / b) - 1
    kl = kl_divergence(Laplace(f64(mu), f64(b)), Laplace(f64(0.0), f64(b0))).item()
    assert kl == pytest.approx(paper, rel=1e-12)


@pytest.mark.parametrize(
    "q,p,cls",
    [
        ((0.3, 0.5), (0.0, 1.0), Normal),
        ((-1.0, 2.0), (0.5, 1.5), Normal),
        ((3.0, 6.0), (3.0, 3.0 / 0.25), Gamma),
        ((0.8, 2.0), (2.5, 1.0), Gamma),
    ],
)
def test_torch_normal_and_gamma_kl_match_monte_carlo(q, p, cls):
    dq, dp = cls(f64(q[0]), f64(q[1])), cls(f64(p[0]), f64(p[1]))
    kl = kl_divergence(dq, dp).item()
    mc, se = _mc_kl(dq, dp)
    assert abs(kl - mc.item()) < 5 * se.item()


# --------------------------------------------------------------------------
# Plumbing
# --------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [ThresholdedLaplace, ThresholdedNormal], ids=FAMILY_IDS)
@pytest.mark.parametrize("estimator", ["jump", "subgradient"])
def test_expand_keeps_estimator_kl_objective_and_base(cls, estimator):
    # The generic expand contract is in test_distribution_contract.py; these are
    # the class's own attributes and its base distribution.
    d = cls(torch.tensor(0.5), torch.tensor([1.0, 2.0]), 0.3, estimator=estimator, kl_objective="base")
    e = d.expand([4, 2])
    assert e.estimator == estimator and e.kl_objective == "base"
    assert e.base_dist.batch_shape == (4, 2)
    assert torch.equal(e.gate, d.gate.expand(4, 2))


@pytest.mark.parametrize("cls,threshold", [(ThresholdedLaplace, 25.0), (ThresholdedNormal, 7.0)], ids=FAMILY_IDS)
def test_spike_mass_keeps_its_precision_when_the_gate_is_below_epsilon(cls, threshold):
    # log(1 - γ) with γ ~ 1e-11 (Laplace e^-25, Normal erfc(7/√2)), far below float32's epsilon: written as
    # log(erf(.)) or log(-expm1(.)) it rounds to 0, and the spike's KL term then vanishes or turns negative.
    gate = laplace_gate(0.0, 1.0, threshold) if cls is ThresholdedLaplace else normal_gate(0.0, 1.0, threshold)
    d = cls(torch.tensor(0.0), torch.tensor(1.0), torch.tensor(threshold))
    assert d.log_prob(torch.tensor(0.0)).item() == pytest.approx(math.log1p(-gate), rel=1e-5)
    # The KL to a lower threshold is ~1e-11 (Laplace) / 2e-9 (Normal), nearly all of it the spike's term: in
    # float32 it must match float64's.
    def kl(dtype):
        q, p = (cls(*(torch.tensor(v, dtype=dtype) for v in (0.0, 1.0, t))) for t in (threshold, threshold - 1.0))
        return kl_divergence(q, p).item()

    assert kl(torch.float32) == pytest.approx(kl(torch.float64), rel=1e-3)
