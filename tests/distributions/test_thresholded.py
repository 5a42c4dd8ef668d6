"""Tests of the thresholded Laplace / Gaussian distributions (Fallah & Rozell 2022).

The generic properties (shapes, expand, validation, log_prob against scipy,
the spike mass and slab law of hard samples, moments, cdf/icdf, entropy) are
in test_distribution_contract.py. Here: hard samples reject the plausible
wrong laws (unshifted tails, the other family's spike mass); log_prob against
quadrature over the mixed measure and its gradients; variance limits and the
mode; the straight-through and subgradient rsample paths against their exact
per-element gradients; the base-family KLs used by the paper's Eq. 5 (torch's)
and the exact thresholded-Laplace KL against Monte Carlo; and expand of the
class's own attributes.
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
from pyro_sparse.distributions.thresholded import thresholded_laplace_kl

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
# rsample: straight-through (Eq. 4) vs subgradient (Appendix C)
# --------------------------------------------------------------------------


def _grads(cls, straight_through, seed=5, n=4000):
    loc = torch.linspace(-1, 1, n, dtype=torch.float64).requires_grad_()
    scale = torch.full((n,), 0.7, dtype=torch.float64, requires_grad=True)
    lam = torch.full((n,), 0.6, dtype=torch.float64, requires_grad=True)
    d = cls(loc, scale, lam, straight_through=straight_through)
    torch.manual_seed(seed)
    z = d.rsample()
    torch.manual_seed(seed)
    s = d.base_dist.sample()
    z.sum().backward()
    return z.detach(), s, loc, scale, lam


@pytest.mark.parametrize("cls", [ThresholdedLaplace, ThresholdedNormal], ids=FAMILY_IDS)
def test_straight_through_gradients(cls):
    z, s, loc, scale, lam = _grads(cls, True)
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
    z, s, loc, scale, lam = _grads(cls, False)
    zero = z == 0
    assert zero.any() and (~zero).any()
    for t in (loc, scale, lam):
        assert torch.all(t.grad[zero] == 0)
    assert torch.equal(loc.grad[~zero], torch.ones_like(loc)[~zero])
    ds = (s - loc.detach()) / scale.detach()
    assert torch.allclose(scale.grad[~zero], ds[~zero], rtol=1e-10, atol=1e-12)
    assert torch.equal(lam.grad[~zero], -torch.sign(s - loc.detach())[~zero])


@pytest.mark.parametrize("cls", [ThresholdedLaplace, ThresholdedNormal], ids=FAMILY_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rsample_forward_equals_hard_threshold(cls, dtype):
    loc = torch.randn(3, 50, dtype=dtype)
    scale = torch.rand(3, 50, dtype=dtype) + 0.1
    lam = torch.rand(3, 50, dtype=dtype)
    d = cls(loc.requires_grad_(), scale.requires_grad_(), lam)
    outs = []
    for st in (True, False):
        d.straight_through = st
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


@pytest.mark.parametrize("cls", [ThresholdedLaplace, ThresholdedNormal], ids=FAMILY_IDS)
def test_registered_kl_is_base_kl_of_eq5(cls):
    # kl_divergence of the thresholded pair is the paper's Eq. 5 base KL
    # (independent of the thresholds), also through to_event as the
    # mean-field ELBOs call it.
    assert (cls, cls) in torch_kl._KL_REGISTRY
    q = cls(f64([0.3, -1.0]), f64([0.5, 2.0]), f64([0.2, 3.0]))
    p = cls(f64(0.0), f64(1.0), f64(0.7))
    base = kl_divergence(q.base_dist, p.base_dist)
    assert torch.equal(kl_divergence(q, p), base)
    assert torch.equal(
        kl_divergence(cls(q.loc, q.scale, f64(9.0)), p), base
    )  # no λ dependence
    assert torch.allclose(
        kl_divergence(q.to_event(1), p.expand([2]).to_event(1)), base.sum()
    )


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


@pytest.mark.parametrize(
    "q,p",
    [
        ((0.3, 0.5, 0.2), (0.0, 1.0, 0.5)),
        ((-1.0, 2.0, 3.0), (0.5, 0.7, 0.1)),
        ((1.0, 0.4, 0.05), (1.0, 0.4, 1.0)),
    ],
)
def test_thresholded_laplace_kl_matches_monte_carlo(q, p):
    dq = ThresholdedLaplace(*map(f64, q))
    dp = ThresholdedLaplace(*map(f64, p))
    kl = thresholded_laplace_kl(dq, dp).item()
    mc, se = _mc_kl(dq, dp, n=50_000)
    assert abs(kl - mc.item()) < 5 * se.item()
    # The KL of the thresholded laws differs from the registered base KL.
    assert kl != pytest.approx(
        kl_divergence(dq.base_dist, dp.base_dist).item(), rel=1e-3
    )


def test_thresholded_laplace_kl_self_zero_and_grads_finite():
    loc = torch.tensor([0.0, 1.0, -2.0], requires_grad=True)
    lam = torch.tensor([1e-3, 0.5, 40.0], requires_grad=True)
    q = ThresholdedLaplace(loc, 1.0, lam)
    assert torch.allclose(thresholded_laplace_kl(q, q), torch.zeros(3), atol=1e-6)
    p = ThresholdedLaplace(0.0, 0.5, 0.2)
    kl = thresholded_laplace_kl(q, p)
    assert torch.all(kl >= 0)
    kl.sum().backward()
    assert torch.all(torch.isfinite(loc.grad)) and torch.all(torch.isfinite(lam.grad))


# --------------------------------------------------------------------------
# Plumbing
# --------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [ThresholdedLaplace, ThresholdedNormal], ids=FAMILY_IDS)
@pytest.mark.parametrize("straight_through", [True, False])
def test_expand_keeps_straight_through_and_base(cls, straight_through):
    # The generic expand contract is in test_distribution_contract.py; this is
    # the class's own attribute and its base distribution.
    d = cls(torch.tensor(0.5), torch.tensor([1.0, 2.0]), 0.3, straight_through=straight_through)
    e = d.expand([4, 2])
    assert e.straight_through is straight_through
    assert e.base_dist.batch_shape == (4, 2)
    assert torch.equal(e.gate, d.gate.expand(4, 2))
