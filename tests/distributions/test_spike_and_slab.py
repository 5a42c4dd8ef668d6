"""Tests of the VSC spike-and-slab distribution (Tonolini et al.) beyond Pyro's contract.

The generic properties (shapes, expand, validation, the zero fraction and the
slab law of hard samples, moments, cdf/icdf, entropy) are in
test_distribution_contract.py. Here: log_prob against a hand computation in
float32 and at the boundary gates, and against quadrature; the gate and
logits parametrisations; the registered closed-form KL against a Monte-Carlo
estimate (valid because both densities are w.r.t. the same mixed measure);
the relaxed rsample against the hard draw it tends to as the slope grows; the
straight-through rsample's forward values against the hard draw and its
gradients against quadrature; and the Pyro plumbing (TraceMeanField_ELBO,
plate, expand of the class's own attributes).
"""

import itertools
import math

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import scipy.integrate
import scipy.stats
import torch
import torch.distributions.kl as torch_kl
from pyro import poutine
from torch.distributions import constraints, kl_divergence

from pyro_sparse.distributions import SpikeAndSlab

# gate (probability of being non-zero), loc, scale
PARAMS = [
    (0.3, 0.0, 1.0),
    (0.8, 1.5, 0.5),
    (0.05, -2.0, 3.0),
    (0.5, 0.7, 0.2),
    (0.97, -0.4, 1.3),
]


def f64(x):
    return torch.tensor(x, dtype=torch.float64)


def folded_normal_mean(loc, scale):
    """E|X| for X ~ N(loc, scale^2)."""
    return scale * math.sqrt(2 / math.pi) * math.exp(-(loc**2) / (2 * scale**2)) + loc * (
        1 - 2 * scipy.stats.norm.cdf(-loc / scale)
    )


def hand_kl(gq, mq, sq, gp, mp, sp):
    """Supplement C Eq. 9-10 written out in numpy, with the correct Gaussian KL."""
    kl_n = math.log(sp / sq) + (sq**2 + (mq - mp) ** 2) / (2 * sp**2) - 0.5
    spike = 0.0
    if gq > 0:
        spike += gq * math.log(gq / gp)
    if gq < 1:
        spike += (1 - gq) * math.log((1 - gq) / (1 - gp))
    return gq * kl_n + spike


# ---------------------------------------------------------------- samples ---
def test_sample_no_grad_exact_zeros_and_seeded():
    logits = torch.tensor([-1.0, 0.0, 2.0], requires_grad=True)
    loc = torch.tensor(1.0, requires_grad=True)
    d = SpikeAndSlab(gate_logits=logits, loc=loc, scale=0.5)
    torch.manual_seed(4)
    a = d.sample((1000,))
    torch.manual_seed(4)
    b = d.sample((1000,))
    assert not a.requires_grad
    assert torch.equal(a, b)
    assert (a == 0).any() and (a != 0).any()
    # Exact zeros, not tiny numbers.
    assert ((a.abs() > 0) & (a.abs() < 1e-6)).sum() == 0


# --------------------------------------------------------------- log_prob ---
@pytest.mark.parametrize("gate,loc,scale", PARAMS)
def test_continuous_part_integrates_to_gate(gate, loc, scale):
    d = SpikeAndSlab(f64(gate), loc, scale)

    def density(x):
        return math.exp(d.log_prob(f64(x)).item())

    # Integrate over x != 0: the two half-lines, with loc as a break point.
    lo, hi = min(loc, 0.0) - 40 * scale, max(loc, 0.0) + 40 * scale
    pts = [p for p in (loc - scale, loc, loc + scale) if p != 0]
    left, _ = scipy.integrate.quad(density, lo, 0.0, points=[p for p in pts if lo < p < 0],
                                   limit=200, epsabs=1e-13)
    right, _ = scipy.integrate.quad(density, 0.0, hi, points=[p for p in pts if 0 < p < hi],
                                    limit=200, epsabs=1e-13)
    assert left + right == pytest.approx(gate, abs=1e-9)
    # Together with the atom, the total mass is one.
    assert left + right + math.exp(d.log_prob(f64(0.0)).item()) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_log_prob_matches_hand_computation(dtype):
    gate = np.array([0.01, 0.3, 0.5, 0.99, 1.0, 0.0])
    loc = np.array([0.0, -1.0, 2.0, 0.5, 0.0, 1.0])
    scale = np.array([1.0, 0.5, 2.0, 0.1, 3.0, 1.0])
    x = np.array([[0.0], [1e-3], [-0.5], [0.2], [-1.0], [3.0], [-7.5]])  # (7, 1) x (6,)
    d = SpikeAndSlab(torch.tensor(gate, dtype=dtype), torch.tensor(loc, dtype=dtype),
                     torch.tensor(scale, dtype=dtype))
    actual = d.log_prob(torch.tensor(x, dtype=dtype))
    assert actual.shape == (7, 6) and actual.dtype == dtype
    with np.errstate(divide="ignore"):
        slab = np.log(gate) + scipy.stats.norm.logpdf(x, loc, scale)
        expected = np.where(x == 0, np.log1p(-gate), slab)
    tol = 2e-5 if dtype == torch.float32 else 1e-12
    np.testing.assert_allclose(actual.double().numpy(), expected, rtol=tol, atol=tol)


def test_gate_and_logits_parametrisations_agree():
    # |logits| <= 8: beyond that 1 - sigmoid(l) itself loses relative
    # precision in float64, which is the point of the logits form (below).
    logits = f64([-8.0, -5.0, -0.3, 0.0, 1.7, 5.0, 8.0])
    gate = torch.sigmoid(logits)
    a = SpikeAndSlab(gate, 0.4, 1.2)
    b = SpikeAndSlab(gate_logits=logits, loc=0.4, scale=1.2)
    x = f64([[0.0], [0.4], [-2.0], [5.0]])
    torch.testing.assert_close(a.log_prob(x), b.log_prob(x), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(a.gate_logits, logits, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(b.gate, gate)
    torch.testing.assert_close(a.mean, b.mean)
    torch.testing.assert_close(a.variance, b.variance)
    # The logits form is exact where the gate form is not: log(1 - γ) at
    # l = 30 is -softplus(30) = -30 - log1p(e^-30).
    big = SpikeAndSlab(gate_logits=f64([30.0, -30.0]), loc=0.0, scale=1.0)
    lp0 = big.log_prob(f64(0.0))
    torch.testing.assert_close(lp0, f64([-30.0 - math.log1p(math.exp(-30.0)),
                                         -math.log1p(math.exp(-30.0))]), rtol=1e-14, atol=0)
    # In float32, sigmoid(30) rounds to 1, so the gate form gives log(1 - γ)
    # = -inf while the softplus form from logits stays finite and accurate.
    c = SpikeAndSlab(gate_logits=torch.tensor([30.0, -30.0]), loc=0.0, scale=1.0)
    lp = c.log_prob(torch.tensor([[0.0], [1.0]]))
    assert torch.isfinite(lp).all()
    assert lp[0, 0].item() == pytest.approx(-30.0, rel=1e-6)
    assert lp[1, 1].item() == pytest.approx(-30.0 - 0.5 - 0.5 * math.log(2 * math.pi), rel=1e-6)


@pytest.mark.parametrize("param", ["gate", "gate_logits"])
def test_log_prob_gradients_not_nan(param):
    # Each (γ, x) pair separately, so a NaN in one branch of the where cannot
    # hide behind another element. Includes γ at the boundary where the
    # unused branch would be log 0.
    cases = [(0.0, 0.0), (1.0, 1.5), (1e-7, 0.0), (1e-7, 2.0), (1 - 1e-7, 0.0),
             (1 - 1e-7, -1.0), (0.4, 0.0), (0.4, 0.3)]
    for g, x in cases:
        if param == "gate_logits" and g in (0.0, 1.0):
            continue
        raw = f64(g if param == "gate" else math.log(g / (1 - g))).requires_grad_(True)
        loc = f64(0.2).requires_grad_(True)
        scale = f64(0.8).requires_grad_(True)
        d = SpikeAndSlab(loc=loc, scale=scale, **{param: raw})
        lp = d.log_prob(f64(x))
        assert torch.isfinite(lp), (g, x)
        grads = torch.autograd.grad(lp, [raw, loc, scale])
        assert all(torch.isfinite(gr) for gr in grads), (g, x, grads)
        if x == 0:  # the atom does not depend on the slab
            assert grads[1].item() == 0 and grads[2].item() == 0


# --------------------------------------------------------------------- KL ---
KL_PAIRS = [
    # (gate_q, loc_q, scale_q), (gate_p, loc_p, scale_p)
    ((0.3, 0.5, 0.8), (0.5, 0.0, 1.0)),
    ((0.9, -1.0, 0.3), (0.2, 0.0, 1.0)),
    ((0.1, 2.0, 2.0), (0.6, 1.0, 0.5)),
    ((0.6, 0.0, 1.0), (0.6, 0.0, 1.0)),
    ((0.5, 1.0, 1.5), (0.05, -0.5, 2.0)),
]


@pytest.mark.parametrize("q_args,p_args", KL_PAIRS)
def test_kl_matches_monte_carlo(q_args, p_args):
    torch.manual_seed(5)
    n = 300_000
    q = SpikeAndSlab(*(f64(a) for a in q_args))
    p = SpikeAndSlab(*(f64(a) for a in p_args))
    kl = kl_divergence(q, p).item()
    assert kl == pytest.approx(hand_kl(*q_args, *p_args), rel=1e-10, abs=1e-12)
    # Hard samples: both log-densities are w.r.t. the same mixed measure, so
    # E_q[log q - log p] is the KL.
    z = q.sample((n,))
    ratio = q.log_prob(z) - p.log_prob(z)
    sd = ratio.std().item() / math.sqrt(n)
    assert abs(ratio.mean().item() - kl) < 5 * sd + 1e-12, (ratio.mean().item(), kl, sd)


def test_kl_monte_carlo_batched_logits():
    torch.manual_seed(6)
    n = 200_000
    q = SpikeAndSlab(gate_logits=f64([-1.0, 0.5, 2.0]), loc=f64([0.3, -0.7, 1.2]),
                     scale=f64([0.6, 1.4, 0.9]))
    p = SpikeAndSlab(f64(0.25), 0.0, 1.0)
    kl = kl_divergence(q, p)
    assert kl.shape == (3,)
    z = q.sample((n,))
    ratio = q.log_prob(z) - p.log_prob(z)
    sd = ratio.std(0) / math.sqrt(n)
    assert ((ratio.mean(0) - kl).abs() < 5 * sd).all(), (ratio.mean(0), kl)
    # Order matters: KL is asymmetric and the batch shape broadcasts both ways.
    assert kl_divergence(p, q).shape == (3,)
    assert not torch.allclose(kl_divergence(p, q), kl)


def test_kl_matches_paper_eq9_standard_normal_prior():
    # ICLR Eq. 9 / 23: prior α N(0, 1) + (1 - α) δ.
    alpha = 0.2
    gamma, mu, sigma = f64([0.1, 0.5, 0.95]), f64([0.3, -1.0, 2.0]), f64([0.5, 1.0, 0.2])
    neg_kl = (
        gamma * 0.5 * (1 + torch.log(sigma**2) - mu**2 - sigma**2)
        + (1 - gamma) * torch.log((1 - alpha) / (1 - gamma))
        + gamma * torch.log(alpha / gamma)
    )
    kl = kl_divergence(SpikeAndSlab(gamma, mu, sigma), SpikeAndSlab(f64(alpha), 0.0, 1.0))
    torch.testing.assert_close(kl, -neg_kl)


def test_kl_self_is_zero_and_nonnegative():
    torch.manual_seed(7)
    shape = (500,)
    q = SpikeAndSlab(gate_logits=torch.randn(shape, dtype=torch.float64) * 3,
                     loc=torch.randn(shape, dtype=torch.float64),
                     scale=torch.rand(shape, dtype=torch.float64) * 2 + 0.05)
    p = SpikeAndSlab(torch.rand(shape, dtype=torch.float64) * 0.98 + 0.01,
                     torch.randn(shape, dtype=torch.float64),
                     torch.rand(shape, dtype=torch.float64) * 2 + 0.05)
    assert kl_divergence(q, q).abs().max().item() < 1e-12
    assert kl_divergence(p, p).abs().max().item() < 1e-12
    assert (kl_divergence(q, p) >= 0).all()
    assert (kl_divergence(p, q) >= 0).all()
    # Positive whenever anything differs: perturbing each parameter alone.
    base = {"gate": f64(0.4), "loc": f64(0.1), "scale": f64(0.9)}
    for name, delta in [("gate", 0.01), ("loc", 0.01), ("scale", 0.01)]:
        other = dict(base, **{name: base[name] + delta})
        assert kl_divergence(SpikeAndSlab(**base), SpikeAndSlab(**other)).item() > 1e-6, name


def test_kl_of_a_very_narrow_slab_is_finite_in_float32():
    # σ_q / σ_p = 1e-25: the variance ratio underflows to 0 in float32, its log is taken from the scales' logs.
    q = SpikeAndSlab(torch.tensor(0.5), torch.tensor(0.2), torch.tensor(1e-25))
    p = SpikeAndSlab(torch.tensor(0.3), torch.tensor(0.0), torch.tensor(1.0))
    expected = kl_divergence(SpikeAndSlab(f64(0.5), f64(0.2), f64(1e-25)), SpikeAndSlab(f64(0.3), f64(0.0), f64(1.0)))
    torch.testing.assert_close(kl_divergence(q, p).double(), expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("param", ["gate", "gate_logits"])
def test_kl_gate_boundaries(param):
    # γ_q = 0: q is δ0, KL = -log(1 - γ_p). γ_q = 1: q is the slab,
    # KL = KL(N_q || N_p) - log γ_p. Using 0 log 0 = 0; gradients not NaN.
    gp = 0.3
    p = SpikeAndSlab(f64(gp), 0.0, 1.0)
    if param == "gate":
        raw = f64([0.0, 1.0]).requires_grad_(True)
    else:
        raw = f64([-float("inf"), float("inf")]).requires_grad_(True)
    loc = f64(0.5).requires_grad_(True)
    q = SpikeAndSlab(loc=loc, scale=2.0, **{param: raw})
    kl = kl_divergence(q, p)
    kl_n = math.log(1 / 2.0) + (4.0 + 0.25) / 2 - 0.5
    torch.testing.assert_close(kl, f64([-math.log(1 - gp), kl_n - math.log(gp)]))
    grads = torch.autograd.grad(kl.sum(), [raw, loc])
    assert not any(torch.isnan(g).any() for g in grads), grads
    # Support mismatch: p with γ_p = 0 has no slab, so KL(q || p) = inf.
    assert kl_divergence(SpikeAndSlab(f64(0.5)), SpikeAndSlab(f64(0.0))).item() == math.inf


def test_kl_gate_vs_logits_agree():
    logits = f64([-4.0, -0.5, 0.0, 2.5])
    args = {"loc": f64([0.1, -0.3, 1.0, 2.0]), "scale": f64([0.5, 1.0, 1.5, 0.7])}
    p = SpikeAndSlab(f64(0.3), 0.0, 1.0)
    p_logits = SpikeAndSlab(gate_logits=f64(math.log(0.3 / 0.7)), loc=0.0, scale=1.0)
    a = kl_divergence(SpikeAndSlab(torch.sigmoid(logits), **args), p)
    b = kl_divergence(SpikeAndSlab(gate_logits=logits, **args), p_logits)
    torch.testing.assert_close(a, b)


# ------------------------------------------------------- Pyro integration ---
N, J = 4, 3
ALPHA = torch.tensor([0.2, 0.5, 0.8])
X_NOISE = 0.7


def vsc_model(x):
    with pyro.plate("data", N):
        z = pyro.sample("z", SpikeAndSlab(ALPHA, 0.0, 1.0).to_event(1))
        if x is not None:
            pyro.sample("x", dist.Normal(2 * z, X_NOISE).to_event(1), obs=x)


def vsc_guide(x):
    logits = pyro.param("logits", torch.linspace(-1.5, 1.5, N * J).reshape(N, J))
    loc = pyro.param("loc", torch.linspace(-1.0, 1.0, N * J).reshape(N, J).flip(0))
    scale = pyro.param("scale", torch.full((N, J), 0.6), constraint=constraints.positive)
    with pyro.plate("data", N):
        pyro.sample("z", SpikeAndSlab(gate_logits=logits, loc=loc, scale=scale,
                                      slope=200.0).to_event(1))


X_OBS = torch.tensor([[0.0, 1.0, -2.0], [0.5, 0.0, 0.0], [3.0, -1.0, 0.2], [0.0, 0.0, 1.0]])


def guide_dist():
    return SpikeAndSlab(gate_logits=pyro.param("logits"), loc=pyro.param("loc"),
                        scale=pyro.param("scale"))


def test_trace_mean_field_elbo_calls_registered_kl(monkeypatch):
    pyro.clear_param_store()
    key = (SpikeAndSlab, SpikeAndSlab)
    original = torch_kl._KL_REGISTRY[key]
    calls = []

    def spy(q, p):
        calls.append((type(q), type(p), q.batch_shape, p.batch_shape))
        return original(q, p)

    monkeypatch.setitem(torch_kl._KL_REGISTRY, key, spy)
    monkeypatch.setattr(torch_kl, "_KL_MEMOIZE", {})
    elbo = pyro.infer.TraceMeanField_ELBO()
    pyro.set_rng_seed(8)
    loss_registered = elbo.differentiable_loss(vsc_model, vsc_guide, X_OBS)
    assert calls == [(SpikeAndSlab, SpikeAndSlab, (N, J), (N, J))]

    # Without the registration TraceMeanField_ELBO silently falls back to a
    # sampled log q - log p (with a relaxed z, so a different number).
    monkeypatch.delitem(torch_kl._KL_REGISTRY, key)
    monkeypatch.setattr(torch_kl, "_KL_MEMOIZE", {})
    pyro.set_rng_seed(8)
    loss_fallback = elbo.differentiable_loss(vsc_model, vsc_guide, X_OBS)
    assert len(calls) == 1
    assert abs(loss_fallback.item() - loss_registered.item()) > 1e-3


def test_trace_mean_field_elbo_is_likelihood_plus_analytic_kl():
    pyro.clear_param_store()
    elbo = pyro.infer.TraceMeanField_ELBO()
    pyro.set_rng_seed(9)
    loss = elbo.differentiable_loss(vsc_model, vsc_guide, X_OBS)
    # Replay: the ELBO runs the guide first, drawing only z's noise, so the
    # same seed reproduces the same relaxed z.
    pyro.set_rng_seed(9)
    z = poutine.trace(vsc_guide).get_trace(X_OBS).nodes["z"]["value"]
    log_lik = dist.Normal(2 * z, X_NOISE).log_prob(X_OBS).sum()
    kl = kl_divergence(guide_dist(), SpikeAndSlab(ALPHA, 0.0, 1.0)).sum()
    torch.testing.assert_close(loss, -log_lik + kl, rtol=1e-5, atol=1e-5)

    # Gradients reach every guide parameter through the KL and the relaxed z.
    params = [pyro.param(name).unconstrained() for name in ("logits", "loc", "scale")]
    grads = torch.autograd.grad(loss, params)
    for g in grads:
        assert torch.isfinite(g).all() and (g != 0).all()


def test_trace_mean_field_kl_term_matches_monte_carlo():
    # With no observation the loss is exactly the KL part; check it against a
    # hard-sample Monte-Carlo estimate of E_q[log q - log p].
    pyro.clear_param_store()
    loss = pyro.infer.TraceMeanField_ELBO().differentiable_loss(vsc_model, vsc_guide, None)
    torch.manual_seed(10)
    q, p = guide_dist(), SpikeAndSlab(ALPHA, 0.0, 1.0)
    n = 100_000
    with torch.no_grad():
        z = q.sample((n,))
        ratio = (q.log_prob(z) - p.log_prob(z)).sum((-1, -2)).double()
    sd = ratio.std().item() / math.sqrt(n)
    assert abs(loss.item() - ratio.mean().item()) < 5 * sd + 1e-4, (loss, ratio.mean(), sd)


# ----------------------------------------------------------------- rsample ---
def test_relaxed_rsample_tends_to_hard_draw():
    gate, loc, scale = 0.3, 1.0, 0.5
    d = SpikeAndSlab(f64(gate), loc, scale)
    n = 100_000
    torch.manual_seed(11)
    eta = torch.rand(n, dtype=torch.float64)
    eps = torch.randn(n, dtype=torch.float64)
    hard = (eta - 1 + gate >= 0).double() * (loc + scale * eps)
    slopes = [5.0, 50.0, 200.0, 2000.0]
    mad, near_zero = [], []
    for slope in slopes:
        d.slope = slope
        torch.manual_seed(11)  # same (η, ε): rsample draws η first, then ε
        z = d.rsample((n,))
        mad.append((z - hard).abs().mean().item())
        near_zero.append((z.abs() < 1e-3).double().mean().item())
    assert all(a > b for a, b in itertools.pairwise(mad)), mad
    assert mad[-1] < 2e-3
    # For large slopes ∫|sigmoid(c y) - step(y)| dy = 2 log 2 / c, times E|slab|.
    e_abs = folded_normal_mean(loc, scale)
    for slope, m in zip(slopes[2:], mad[2:]):
        assert m == pytest.approx(2 * math.log(2) / slope * e_abs, rel=0.1), (slope, m)
    # The spike becomes a real spike: the fraction of near-zeros → 1 - γ.
    gaps = [abs(f - (1 - gate)) for f in near_zero]
    assert all(a > b for a, b in itertools.pairwise(gaps)), near_zero
    assert gaps[0] > 0.5 and gaps[-1] < 0.01


def test_rsample_shape_and_distribution_at_large_slope():
    torch.manual_seed(12)
    d = SpikeAndSlab(f64([0.2, 0.7]), f64([0.0, -1.0]), 1.0, slope=1e6)
    z = d.rsample((50_000,))
    assert z.shape == (50_000, 2)
    frac0 = (z.abs() < 1e-6).double().mean(0)
    torch.testing.assert_close(frac0, f64([0.8, 0.3]), atol=0.01, rtol=0)


def test_rsample_gradients_finite_and_nonzero():
    torch.manual_seed(13)
    logits = torch.tensor([-0.5, 0.3, 1.0], requires_grad=True)
    loc = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
    scale = torch.tensor([0.4, 1.0, 0.7], requires_grad=True)
    for slope in [50.0, 200.0]:
        d = SpikeAndSlab(gate_logits=logits, loc=loc, scale=scale, slope=slope)
        z = d.rsample((2000,))
        assert z.requires_grad
        grads = torch.autograd.grad((z**2).sum(), [logits, loc, scale])
        for g in grads:
            assert torch.isfinite(g).all() and (g != 0).all(), (slope, grads)
    gate = torch.tensor(0.4, requires_grad=True)
    (g,) = torch.autograd.grad(SpikeAndSlab(gate, 1.0, 1.0).rsample((2000,)).sum(), [gate])
    assert torch.isfinite(g) and g != 0


def test_rsample_pathwise_gradient_of_mean():
    # dE[z]/dμ = E[T(η - 1 + γ)] → γ = d(γ μ)/dμ as the slope grows, and for
    # any slope dE[z]/dγ = μ (sigmoid(cγ) - sigmoid(c(γ - 1))), the derivative
    # of μ ∫_{γ-1}^{γ} sigmoid(c y) dy.
    torch.manual_seed(14)
    n = 400_000
    g0, mu0 = 0.35, 1.5
    gate = f64(g0).requires_grad_(True)
    loc = f64(mu0).requires_grad_(True)
    d = SpikeAndSlab(gate, loc, 0.8, slope=2000.0)
    dgate, dloc = torch.autograd.grad(d.rsample((n,)).mean(), [gate, loc])
    assert abs(dloc.item() - g0) < 5 * math.sqrt(g0 * (1 - g0) / n)

    d.slope = 50.0
    dgate, dloc = torch.autograd.grad(d.rsample((n,)).mean(), [gate, loc])
    c = 50.0
    expected = mu0 * (1 / (1 + math.exp(-c * g0)) - 1 / (1 + math.exp(-c * (g0 - 1))))
    # Per-sample pathwise variance is about c/6 · E[(μ + σ ε)²].
    sd = math.sqrt(c / 6 * (mu0**2 + 0.64) / n)
    assert abs(dgate.item() - expected) < 5 * sd, (dgate, expected, sd)
    assert abs(dloc.item() - g0) < 0.01


# ------------------------------------------- straight-through (Gumbel) ---
def straight_through(*args, temperature=0.5, **kwargs):
    return SpikeAndSlab(*args, spike_estimator="straight_through", temperature=temperature, **kwargs)


def logistic_quad(f):
    """E[f(L)] for a standard logistic L, by quadrature."""
    density = lambda t: 0.25 / math.cosh(t / 2) ** 2
    return scipy.integrate.quad(lambda t: f(t) * density(t), -60, 60, limit=200)[0]


def test_straight_through_draws_are_exactly_spike_or_slab():
    # The forward value is the hard draw: the slab value where
    # logit η + logit γ > 0 (probability γ), exactly 0 elsewhere.
    gate, loc, scale = f64([0.1, 0.5, 0.9]), f64([1.0, -2.0, 0.5]), f64([0.5, 1.0, 2.0])
    d = straight_through(gate, loc, scale, temperature=0.7)
    torch.manual_seed(21)
    z = d.rsample((2000,))
    torch.manual_seed(21)  # the indicator's uniform is drawn first, then ε
    eta = torch.rand(2000, 3, dtype=torch.float64)
    eps = torch.randn(2000, 3, dtype=torch.float64)
    in_slab = torch.logit(eta) + torch.logit(gate) > 0
    assert torch.equal(z, torch.where(in_slab, loc + scale * eps, torch.zeros_like(eps)))
    assert ((z == 0) == ~in_slab).all()


@pytest.mark.parametrize("gate, loc, scale", PARAMS)
def test_straight_through_spike_frequency_and_slab(gate, loc, scale):
    torch.manual_seed(22)
    n = 100_000
    z = straight_through(f64(gate), loc, scale, temperature=1.0).rsample((n,))
    nonzero = z != 0
    frac = nonzero.double().mean().item()
    assert abs(frac - gate) < 5 * math.sqrt(gate * (1 - gate) / n), (frac, gate)
    p = scipy.stats.kstest(z[nonzero].numpy(), scipy.stats.norm(loc, scale).cdf).pvalue
    assert p > 1e-3, p


def test_straight_through_frequency_from_logits_and_extreme_gates():
    torch.manual_seed(23)
    n = 200_000
    logits = f64([-6.0, 0.0, 6.0])
    z = straight_through(gate_logits=logits, temperature=0.5).rsample((n,))
    gate = torch.sigmoid(logits)
    sd = (gate * (1 - gate) / n).sqrt()
    assert ((z != 0).double().mean(0) - gate).abs().lt(5 * sd + 1e-4).all()


@pytest.mark.parametrize("temperature", [1.0, 0.5, 0.1])
def test_straight_through_gradient_reaches_the_spike_logit(temperature):
    # Backward differentiates the Concrete sample s = sigmoid((l + L) / τ),
    # L logistic, in place of the hard b; with ε independent of L,
    # E[∂z/∂l] = μ · E[∂s/∂l] = μ · E[s (1 - s)] / τ (quadrature), and
    # ∂z/∂μ = b, whose mean is γ.  Per-sample gradients via one logit per draw.
    torch.manual_seed(24)
    n, l0, mu, sigma = 200_000, 0.4, 1.5, 0.8
    logits = torch.full((n,), l0, dtype=torch.float64, requires_grad=True)
    loc = torch.full((n,), mu, dtype=torch.float64, requires_grad=True)
    z = straight_through(gate_logits=logits, loc=loc, scale=sigma, temperature=temperature).rsample()
    dlogit, dloc = torch.autograd.grad(z.sum(), [logits, loc])
    assert torch.isfinite(dlogit).all()
    assert (dlogit[z == 0] != 0).any()  # also where the forward value is 0

    def ds_dl(t):
        s = 1 / (1 + math.exp(-(l0 + t) / temperature))
        return s * (1 - s) / temperature

    expected = mu * logistic_quad(ds_dl)
    assert abs(dlogit.mean().item() - expected) < 5 * dlogit.std().item() / math.sqrt(n), (dlogit.mean(), expected)
    gate = 1 / (1 + math.exp(-l0))
    assert abs(dloc.mean().item() - gate) < 5 * math.sqrt(gate * (1 - gate) / n)
    torch.testing.assert_close(dloc, (z != 0).double())


def test_straight_through_gradient_is_nearly_unbiased_at_low_temperature():
    # d E[z] / dl = μ γ (1 - γ); the estimator's mean tends to it as τ → 0.
    torch.manual_seed(25)
    n, l0, mu = 400_000, -1.0, 2.0
    logits = f64(l0).requires_grad_(True)
    z = straight_through(gate_logits=logits, loc=mu, scale=0.5, temperature=0.05).rsample((n,))
    (dlogit,) = torch.autograd.grad(z.mean(), [logits])
    gate = 1 / (1 + math.exp(-l0))
    assert dlogit.item() == pytest.approx(mu * gate * (1 - gate), rel=0.03)


def test_relaxed_estimator_is_the_default_and_ignores_temperature():
    gate, loc, scale = f64([0.3, 0.8]), f64([1.0, -0.5]), f64([0.5, 2.0])
    draws = []
    for kwargs in [{}, {"spike_estimator": "relaxed", "temperature": 0.01}]:
        torch.manual_seed(26)
        draws.append(SpikeAndSlab(gate, loc, scale, slope=70.0, **kwargs).rsample((100,)))
    torch.manual_seed(26)
    eta = torch.rand(100, 2, dtype=torch.float64)
    eps = torch.randn(100, 2, dtype=torch.float64)
    expected = torch.sigmoid(70.0 * (eta - 1 + gate)) * (loc + scale * eps)
    assert torch.equal(draws[0], expected) and torch.equal(draws[1], expected)
    assert SpikeAndSlab(gate).spike_estimator == "relaxed"


def test_straight_through_survives_expand_and_plates():
    d = straight_through(torch.tensor(0.4), 0.5, 1.0, temperature=0.3)
    e = d.expand((4,))
    assert e.spike_estimator == "straight_through" and e.temperature == 0.3
    e.temperature = 0.9
    assert d.temperature == 0.3

    def model():
        with pyro.plate("rows", 500):
            return pyro.sample("z", d)

    site = poutine.trace(model).get_trace().nodes["z"]
    assert site["fn"].spike_estimator == "straight_through" and site["fn"].temperature == 0.3
    assert (site["value"] == 0).any() and (site["value"] != 0).any()


def test_spike_estimator_and_temperature_checked():
    with pytest.raises(ValueError, match="spike_estimator"):
        SpikeAndSlab(torch.tensor(0.5), spike_estimator="gumbel")
    with pytest.raises(ValueError, match="temperature"):
        straight_through(torch.tensor(0.5), temperature=0.0)
    d = straight_through(torch.tensor(0.5))
    with pytest.raises(ValueError, match="temperature"):
        d.temperature = -1.0
    d.temperature = 2
    assert isinstance(d.temperature, float) and d.temperature == 2.0


# ------------------------------------------------------- expand / validate ---
@pytest.mark.parametrize("param", ["gate", "gate_logits"])
def test_expand_keeps_class_parametrisation_slope(param):
    value = f64([0.2, 0.5])
    d = SpikeAndSlab(loc=f64([0.0, 1.0]), scale=2.0, slope=123.0, validate_args=True,
                     **{param: value})
    # Touch both lazy properties, so both are in __dict__: expand must still
    # know which one was given.
    torch.testing.assert_close(torch.sigmoid(d.gate_logits), d.gate)
    assert {"gate", "gate_logits"} <= d.__dict__.keys()
    e = d.expand((4, 2))
    assert type(e) is SpikeAndSlab
    assert e.batch_shape == (4, 2) and e.event_shape == ()
    assert e._param_name == param
    other = "gate_logits" if param == "gate" else "gate"
    assert other not in e.__dict__
    torch.testing.assert_close(getattr(e, param), value.expand(4, 2))
    assert e.slope == 123.0
    assert e._validate_args
    x = f64([[0.0, 0.3], [1.0, 0.0], [-2.0, 4.0], [0.0, 0.0]])
    torch.testing.assert_close(e.log_prob(x), d.log_prob(x))
    assert e.sample((3,)).shape == (3, 4, 2)
    assert e.rsample().shape == (4, 2)
    with pytest.raises(ValueError):
        e.log_prob(f64([[float("nan"), 0.0]] * 4))
    with pytest.raises((ValueError, RuntimeError)):
        d.expand((4, 3))
    # Changing the slope afterwards does not leak between instances.
    e.slope = 7.0
    assert d.slope == 123.0


def test_plate_broadcasts_scalar_distribution():
    d = SpikeAndSlab(torch.tensor(0.4), 0.5, 1.0, slope=80.0)

    def model():
        with pyro.plate("rows", 5, dim=-2), pyro.plate("cols", 3, dim=-1):
            return pyro.sample("z", d)

    pyro.set_rng_seed(15)
    trace = poutine.trace(model).get_trace()
    site = trace.nodes["z"]
    assert isinstance(site["fn"], SpikeAndSlab) and site["fn"].batch_shape == (5, 3)
    assert site["fn"].slope == 80.0
    assert site["value"].shape == (5, 3)
    trace.compute_log_prob()
    torch.testing.assert_close(site["log_prob"], d.log_prob(site["value"]))


@pytest.mark.parametrize("gate", [0.0, 1.0, 0.5])
def test_validate_args_accepts_and_off_is_silent(gate):
    d = SpikeAndSlab(torch.tensor(gate), 0.0, 1.0, validate_args=True)
    assert not torch.isnan(d.log_prob(torch.tensor([0.0, 0.3, -2.0]))).any()
    SpikeAndSlab(torch.tensor(1.5), 0.0, -1.0, validate_args=False)


def test_gate_arguments_and_slope_checked():
    with pytest.raises(ValueError):
        SpikeAndSlab()
    with pytest.raises(ValueError):
        SpikeAndSlab(torch.tensor(0.5), gate_logits=torch.tensor(0.0))
    with pytest.raises(ValueError):
        SpikeAndSlab(torch.tensor(0.5), slope=0.0)
    d = SpikeAndSlab(torch.tensor(0.5))
    with pytest.raises(ValueError):
        d.slope = -1.0
    d.slope = 200
    assert isinstance(d.slope, float) and d.slope == 200.0
