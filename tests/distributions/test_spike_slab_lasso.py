"""Tests of the marginal Spike-and-Slab Lasso distribution beyond Pyro's contract.

The generic properties (shapes, expand, validation, moments, CDF and
goodness of fit of the samples) are in test_distribution_contract.py. Here:
the density's normalisation by quadrature and its float32 / boundary
behaviour, the variance against quadrature, plates, and the class's own
inclusion probability and adaptive penalty with their gradients.
"""

import math

import numpy as np
import pyro
import pytest
import scipy.integrate
import scipy.stats
import torch
from pyro import poutine

from pyro_sparse.distributions import SpikeSlabLasso


# ----------------------------------------------------------------- helpers ---
def numpy_density(w, eta, lambda0, lambda1):
    """The mixture density, written out with the Laplace normalisers."""
    w = np.abs(np.asarray(w, dtype=np.float64))
    slab = lambda1 / 2.0 * np.exp(-lambda1 * w)
    spike = lambda0 / 2.0 * np.exp(-lambda0 * w)
    return eta * slab + (1.0 - eta) * spike


PARAMS = [
    # eta, lambda0, lambda1
    (0.01, 10.0, 1.0),
    (0.5, 10.0, 1.0),
    (0.99, 10.0, 1.0),
    (0.01, 50.0, 0.5),
    (0.5, 50.0, 2.0),
    (0.99, 50.0, 1.0),
    (0.2, 25.0, 1.0),
]


# --------------------------------------------------------------- log_prob ---
@pytest.mark.parametrize("eta,lambda0,lambda1", PARAMS)
def test_log_prob_integrates_to_one(eta, lambda0, lambda1):
    d = SpikeSlabLasso(torch.tensor(eta, dtype=torch.float64), lambda0, lambda1)

    def density(w):
        return math.exp(d.log_prob(torch.tensor(w, dtype=torch.float64)).item())

    # The density is symmetric: integrate (0, L) and double.  L covers the slab
    # tail up to exp(-60); break points resolve the narrow spike.
    upper = 60.0 / lambda1
    points = [0.1 / lambda0, 1.0 / lambda0, 5.0 / lambda0, 20.0 / lambda0, 1.0 / lambda1]
    half, err = scipy.integrate.quad(density, 0.0, upper, points=points, limit=500, epsabs=1e-12)
    assert err < 1e-8
    assert abs(2 * half - 1.0) < 1e-7

    # A wrong normaliser on either component would break this, so also check
    # each half-line separately (symmetry).
    neg_half, _ = scipy.integrate.quad(
        density, -upper, 0.0, points=[-p for p in points], limit=500, epsabs=1e-12
    )
    assert abs(neg_half - half) < 1e-9


@pytest.mark.parametrize("eta,lambda0,lambda1", PARAMS)
def test_log_prob_trapezoid_on_fine_grid(eta, lambda0, lambda1):
    # Independent of quad: a trapezoid rule on a grid that is fine relative to
    # the spike width 1/lambda0 near zero and coarser in the slab tail.
    d = SpikeSlabLasso(torch.tensor(eta, dtype=torch.float64), lambda0, lambda1)
    inner = np.linspace(0.0, 30.0 / lambda0, 30001)
    outer = np.linspace(30.0 / lambda0, 60.0 / lambda1, 200001)[1:]
    grid = np.concatenate([inner, outer])
    dens = d.log_prob(torch.from_numpy(grid)).exp().numpy()
    total = 2 * scipy.integrate.trapezoid(dens, grid)
    assert abs(total - 1.0) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_log_prob_matches_numpy(dtype):
    eta = np.array([0.01, 0.3, 0.5, 0.99, 1.0, 0.0])
    lambda0 = np.array([10.0, 20.0, 50.0, 10.0, 30.0, 15.0])
    lambda1 = np.array([1.0, 0.5, 2.0, 1.0, 1.0, 0.7])
    w = np.array([[0.0], [1e-3], [-0.05], [0.2], [-1.0], [3.0], [-7.5]])  # (7, 1) x (6,)
    d = SpikeSlabLasso(
        torch.tensor(eta, dtype=dtype),
        torch.tensor(lambda0, dtype=dtype),
        torch.tensor(lambda1, dtype=dtype),
    )
    actual = d.log_prob(torch.tensor(w, dtype=dtype))
    assert actual.shape == (7, 6)
    assert actual.dtype == dtype
    expected = np.log(numpy_density(w, eta, lambda0, lambda1))
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    np.testing.assert_allclose(actual.double().numpy(), expected, rtol=tol, atol=tol)


def test_log_prob_normalisers_explicit():
    # At w = 0 the density is eta*lambda1/2 + (1-eta)*lambda0/2: a check of
    # the normalising constants that does not involve the exponentials at all.
    d = SpikeSlabLasso(torch.tensor(0.25, dtype=torch.float64), 40.0, 2.0)
    expected = math.log(0.25 * 1.0 + 0.75 * 20.0)
    assert d.log_prob(torch.tensor(0.0, dtype=torch.float64)).item() == pytest.approx(
        expected, abs=1e-13
    )
    # Far in the tail the spike is negligible: log(eta * lambda1 / 2) - lambda1 |w|.
    w = 10.0
    expected_tail = math.log(0.25 * 1.0) - 2.0 * w
    assert d.log_prob(torch.tensor(-w, dtype=torch.float64)).item() == pytest.approx(
        expected_tail, abs=1e-12
    )


def test_log_prob_extreme_values_finite():
    d = SpikeSlabLasso(torch.tensor([1e-30, 0.5, 1.0 - 1e-7]), 1000.0, 1.0)
    lp = d.log_prob(torch.tensor([[0.0], [1e3], [-1e3], [1e-8]]))
    assert torch.isfinite(lp).all()
    assert (d.log_prob(torch.tensor([[math.inf], [-math.inf]])) == -math.inf).all()  # not NaN


@pytest.mark.parametrize("eta", [0.0, 1.0])
def test_gradient_of_eta_is_finite_at_its_bounds(eta):
    # d/dη log(η ψ1 + (1-η) ψ0) = (ψ1 - ψ0) / p, finite at η = 0 and 1 (log η there made it NaN).
    eta = torch.tensor(eta, dtype=torch.float64, requires_grad=True)
    w = torch.tensor(0.1, dtype=torch.float64)
    log_p = SpikeSlabLasso(eta, 20.0, 1.0).log_prob(w)
    log_p.backward()
    slab, spike = numpy_density(0.1, 1.0, 20.0, 1.0), numpy_density(0.1, 0.0, 20.0, 1.0)
    assert log_p.item() == pytest.approx(math.log(numpy_density(0.1, eta.item(), 20.0, 1.0)), rel=1e-12)
    assert eta.grad.item() == pytest.approx((slab - spike) / math.exp(log_p.item()), rel=1e-12)


# ------------------------------------------------------------ mean / var ---
@pytest.mark.parametrize("eta,lambda0,lambda1", PARAMS[:4])
def test_mean_variance_match_numerical_moments(eta, lambda0, lambda1):
    d = SpikeSlabLasso(torch.tensor(eta, dtype=torch.float64), lambda0, lambda1)
    assert d.mean.item() == 0.0

    def second_moment_integrand(w):
        return w * w * numpy_density(w, eta, lambda0, lambda1)

    upper = 80.0 / lambda1
    half, _ = scipy.integrate.quad(
        second_moment_integrand, 0.0, upper, points=[1 / lambda0, 10 / lambda0], limit=500
    )
    expected = 2 * eta / lambda1**2 + 2 * (1 - eta) / lambda0**2
    assert d.variance.item() == pytest.approx(expected, rel=1e-12)
    assert d.variance.item() == pytest.approx(2 * half, rel=1e-7)


# ---------------------------------------------------------------- samples ---
def test_sample_no_grad_and_seeded():
    eta = torch.tensor(0.4, requires_grad=True)
    d = SpikeSlabLasso(eta, 10.0, 1.0)
    torch.manual_seed(5)
    a = d.sample((10,))
    torch.manual_seed(5)
    b = d.sample((10,))
    assert not a.requires_grad
    assert torch.equal(a, b)


# ------------------------------------------------------- expand / batching ---
def test_expand_keeps_inclusion_probability():
    # The generic expand contract is in test_distribution_contract.py; this is
    # the class's own method on an expanded instance.
    d = SpikeSlabLasso(torch.tensor([0.1, 0.6, 0.9]), torch.tensor([10.0, 20.0, 40.0]), 1.0)
    e = d.expand((4, 3))
    value = torch.randn(4, 3, generator=torch.Generator().manual_seed(6))
    assert torch.allclose(e.inclusion_probability(value), d.inclusion_probability(value))
    assert torch.allclose(e.penalty_weight(value), d.penalty_weight(value))


def test_plate_and_to_event():
    eta = torch.tensor([0.2, 0.7])
    d = SpikeSlabLasso(eta, 12.0, 1.5)

    def model():
        with pyro.plate("rows", 4, dim=-2), pyro.plate("cols", 2, dim=-1):
            w = pyro.sample("w", d)
        v = pyro.sample("v", SpikeSlabLasso(eta, 12.0, 1.5).expand([3, 2]).to_event(2))
        return w, v

    pyro.set_rng_seed(7)
    trace = poutine.trace(model).get_trace()
    trace.compute_log_prob()
    w_site, v_site = trace.nodes["w"], trace.nodes["v"]
    assert w_site["value"].shape == (4, 2)
    assert w_site["fn"].batch_shape == (4, 2)
    assert torch.allclose(w_site["log_prob"], d.log_prob(w_site["value"]))
    assert v_site["value"].shape == (3, 2)
    assert v_site["fn"].event_shape == (3, 2)
    assert v_site["fn"].batch_shape == ()
    assert v_site["log_prob"].shape == ()
    assert torch.allclose(v_site["log_prob"], d.log_prob(v_site["value"]).sum())
    expected_total = d.log_prob(w_site["value"]).sum() + d.log_prob(v_site["value"]).sum()
    assert torch.allclose(trace.log_prob_sum(), expected_total)


# ---------------------------------------------------------- validate_args ---
@pytest.mark.parametrize("eta", [0.0, 1e-30, 0.5, 1.0])
def test_validate_args_accepts(eta):
    d = SpikeSlabLasso(torch.tensor(eta), 10.0, 1.0, validate_args=True)
    assert torch.isfinite(d.log_prob(torch.tensor([0.0, 0.3, -2.0]))).all()
    # Invalid parameters are accepted silently when validation is off.
    SpikeSlabLasso(torch.tensor(1.5), 10.0, 1.0, validate_args=False)


# ------------------------------------------------- inclusion probability ---
def test_inclusion_probability_matches_numpy():
    eta = np.array([0.01, 0.2, 0.5, 0.9])
    lambda0, lambda1 = 20.0, 1.0
    w = np.array([[0.0], [0.01], [-0.1], [0.2], [0.5], [-2.0]])
    slab = eta * lambda1 / 2 * np.exp(-lambda1 * np.abs(w))
    spike = (1 - eta) * lambda0 / 2 * np.exp(-lambda0 * np.abs(w))
    expected = slab / (slab + spike)
    d = SpikeSlabLasso(torch.tensor(eta), lambda0, lambda1)
    actual = d.inclusion_probability(torch.tensor(w)).numpy()
    np.testing.assert_allclose(actual, expected, rtol=1e-12, atol=1e-15)
    pw = d.penalty_weight(torch.tensor(w)).numpy()
    np.testing.assert_allclose(pw, lambda1 * expected + lambda0 * (1 - expected), rtol=1e-12)


def test_inclusion_probability_extremes():
    d = SpikeSlabLasso(torch.tensor(0.1, dtype=torch.float64), 30.0, 1.0)
    # Large |w| with eta not tiny: essentially surely in the slab.
    assert d.inclusion_probability(torch.tensor(2.0, dtype=torch.float64)).item() > 1 - 1e-12
    assert d.inclusion_probability(torch.tensor(-2.0, dtype=torch.float64)).item() > 1 - 1e-12
    assert d.penalty_weight(torch.tensor(2.0, dtype=torch.float64)).item() == pytest.approx(1.0)
    # w = 0 with small eta: p = eta l1 / (eta l1 + (1 - eta) l0).
    d = SpikeSlabLasso(torch.tensor(0.01, dtype=torch.float64), 30.0, 1.0)
    p0 = d.inclusion_probability(torch.tensor(0.0, dtype=torch.float64)).item()
    assert p0 == pytest.approx(0.01 / (0.01 + 0.99 * 30.0), rel=1e-12)
    assert p0 < 1e-3
    # Monotone in |w|.
    w = torch.linspace(0, 3, 301, dtype=torch.float64)
    p = d.inclusion_probability(w)
    assert (p[1:] >= p[:-1]).all()
    assert torch.allclose(p, d.inclusion_probability(-w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_inclusion_probability_stable(dtype):
    eta = torch.tensor([0.0, 1e-30, 1e-6, 0.5, 1 - 1e-6, 1.0], dtype=dtype)
    w = torch.tensor([[0.0], [1e-6], [1.0], [1e3], [-1e3]], dtype=dtype)
    d = SpikeSlabLasso(eta, 1000.0, 1.0)
    p = d.inclusion_probability(w)
    lam = d.penalty_weight(w)
    assert not torch.isnan(p).any()
    assert not torch.isnan(lam).any()
    assert ((p >= 0) & (p <= 1)).all()
    assert ((lam >= 1.0 - 1e-3) & (lam <= 1000.0 * (1 + 1e-6))).all()
    # eta = 0: never in the slab; eta = 1: always.
    assert (p[:, 0] == 0).all()
    assert (p[:, -1] == 1).all()
    # w = 1e3 is in the slab whenever eta > 0, even eta = 1e-30.
    assert (p[3:, 1:] == 1).all()
    # eta = 1e-30 at w = 0: p ~ eta * l1 / l0, tiny but representable in float64.
    if dtype == torch.float64:
        assert p[0, 1].item() == pytest.approx(1e-30 / 1000.0, rel=1e-9)


# --------------------------------------------------------------- gradient ---
@pytest.mark.parametrize("eta,lambda0,lambda1", [(0.5, 10.0, 1.0), (0.05, 50.0, 1.0),
                                                  (0.9, 20.0, 0.5)])
def test_grad_log_prob_is_minus_penalty_weight(eta, lambda0, lambda1):
    d = SpikeSlabLasso(torch.tensor(eta, dtype=torch.float64), lambda0, lambda1)
    w = torch.linspace(-3.0, 3.0, 601, dtype=torch.float64)
    w = w[w != 0]
    w = torch.cat([w, torch.tensor([1e-8, -1e-8, 5 / lambda0, -5 / lambda0], dtype=torch.float64)])
    w.requires_grad_(True)
    (grad,) = torch.autograd.grad(d.log_prob(w).sum(), w)
    expected = -d.penalty_weight(w.detach()) * w.detach().sign()
    torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-10)

    # Central finite differences, away from the kink at 0.
    x = w.detach()
    x = x[x.abs() > 1e-3]
    h = 1e-6
    fd = (d.log_prob(x + h) - d.log_prob(x - h)) / (2 * h)
    expected = -d.penalty_weight(x) * x.sign()
    torch.testing.assert_close(fd, expected, rtol=1e-6, atol=1e-6)


def test_grad_wrt_parameters_finite():
    eta = torch.tensor([1e-6, 0.5, 1 - 1e-6], dtype=torch.float64, requires_grad=True)
    lambda0 = torch.tensor(20.0, dtype=torch.float64, requires_grad=True)
    lambda1 = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    lp = SpikeSlabLasso(eta, lambda0, lambda1).log_prob(torch.tensor([[0.0], [0.3], [-4.0]],
                                                                   dtype=torch.float64))
    grads = torch.autograd.grad(lp.sum(), [eta, lambda0, lambda1])
    assert all(torch.isfinite(g).all() for g in grads)
    # d/d eta log p = (psi1 - psi0) / p, checked at w = 0.3.
    w = 0.3
    psi1 = numpy_density(w, 1.0, 20.0, 1.0)
    psi0 = numpy_density(w, 0.0, 20.0, 1.0)
    e = eta.detach().numpy()
    (g_eta,) = torch.autograd.grad(
        SpikeSlabLasso(eta, 20.0, 1.0).log_prob(torch.tensor(w, dtype=torch.float64)).sum(), eta
    )
    np.testing.assert_allclose(g_eta.numpy(), (psi1 - psi0) / (e * psi1 + (1 - e) * psi0),
                               rtol=1e-10)


# ------------------------------------------------- posterior of the support ---
@pytest.mark.parametrize("eta,lambda0,lambda1", PARAMS)
def test_inclusion_threshold_is_where_the_slab_becomes_likelier(eta, lambda0, lambda1):
    d = SpikeSlabLasso(torch.tensor(eta, dtype=torch.float64), lambda0, lambda1)
    delta = d.inclusion_threshold
    if delta > 0:
        assert d.inclusion_probability(delta).item() == pytest.approx(0.5, abs=1e-12)
        assert d.inclusion_probability(delta * 0.99) < 0.5 < d.inclusion_probability(delta * 1.01)
    else:  # the slab is likelier everywhere
        assert d.inclusion_probability(torch.tensor(0.0, dtype=torch.float64)) >= 0.5


def test_inclusion_threshold_of_the_lasso_ablation():
    # λ0 = λ1: E[γ | w] = η for every w.
    d = SpikeSlabLasso(torch.tensor([0.3, 0.5, 0.7]), 2.0, 2.0)
    assert d.inclusion_threshold.tolist() == [math.inf, 0.0, 0.0]


CASES = [
    # eta, lambda0, lambda1, loc, scale of the Gaussian likelihood of w
    (0.8, 20.0, 1.0, 0.0, 0.01),
    (0.8, 20.0, 1.0, 0.3, 0.05),
    (0.02, 20.0, 1.0, 0.5, 0.2),
    (0.5, 50.0, 2.0, -0.1, 1.0),
    (0.3, 10.0, 1.0, 3.0, 2.0),
    (0.99, 50.0, 1.0, -0.02, 0.03),
]


@pytest.mark.parametrize("eta,lambda0,lambda1,loc,scale", CASES)
def test_slab_region_probability_against_quadrature(eta, lambda0, lambda1, loc, scale):
    d = SpikeSlabLasso(torch.tensor(eta, dtype=torch.float64), lambda0, lambda1)
    delta = d.inclusion_threshold.item()

    def posterior(w):  # unnormalised: prior times the Gaussian likelihood
        return numpy_density(w, eta, lambda0, lambda1) * math.exp(-0.5 * ((w - loc) / scale) ** 2)

    def mass(low, high):
        points = [p for p in (-delta, 0.0, delta, loc) if low < p < high]
        return scipy.integrate.quad(posterior, low, high, points=points, limit=500, epsabs=0, epsrel=1e-11)[0]

    reach = 40 * scale + 40 / lambda1
    outside = mass(loc - reach - delta, -delta) + mass(delta, loc + reach + delta)
    expected = outside / (outside + mass(-delta, delta))
    assert d.slab_region_probability(loc, scale).item() == pytest.approx(expected, rel=1e-7, abs=1e-15)


@pytest.mark.parametrize("eta,lambda0,lambda1,loc,scale", CASES)
def test_slab_region_probability_gradients_match_finite_differences(eta, lambda0, lambda1, loc, scale):
    # Each of the three interval formulas is fed only its own inputs: an unused
    # one (log 0, ∞ - ∞ at an infinite end) must not turn the gradient into NaN.
    d = SpikeSlabLasso(torch.tensor(eta, dtype=torch.float64), lambda0, lambda1)
    params = (torch.tensor(loc, dtype=torch.float64, requires_grad=True),
              torch.tensor(scale, dtype=torch.float64, requires_grad=True))
    assert torch.autograd.gradcheck(lambda m, s: d.slab_region_probability(m, s), params, eps=1e-7, atol=1e-6)

def test_slab_region_probability_limits():
    d = SpikeSlabLasso(torch.tensor(0.8), 20.0, 1.0)  # float32: E[γ | 0] = 1/6, δ ≈ 0.085
    # Data that pin w at 0 call it out of the support, far below E[γ]'s floor of 1/6 ...
    assert d.slab_region_probability(0.0, 1e-3) < 1e-12
    # ... and data that pin it at 0.3 call it in.
    assert d.slab_region_probability(0.3, 1e-3) > 1 - 1e-6
    # Uninformative data leave the prior's probability of |w| > δ, however wide the likelihood
    # (its Laplace factor grows as e^{λ²s²/2} and must not cancel against the normal CDFs).
    prior_tail = 2 * d.cdf(-d.inclusion_threshold).double()
    for scale in (1e4, 1e6, 1e8, 1e12):
        assert d.slab_region_probability(0.0, scale).item() == pytest.approx(prior_tail.item(), rel=1e-4)
    # Broadcasting and finite values over a range of scales and locations, from a float32 prior.
    loc = torch.linspace(-2, 2, 41)[:, None]
    scale = torch.logspace(-8, 10, 19)
    p = d.slab_region_probability(loc, scale)
    assert p.shape == (41, 19) and p.dtype == torch.float64
    assert torch.isfinite(p).all() and ((p >= 0) & (p <= 1)).all()


@pytest.mark.parametrize("eta, lambda0, expected", [
    (0.0, 20.0, 0.0),   # never in the slab: δ = ∞
    (1.0, 20.0, 1.0),   # always in the slab: δ = 0
    (0.3, 1.0, 0.0),    # the Lasso ablation (λ0 = λ1) with η < 1/2: E[γ] = η < 1/2 everywhere, δ = ∞
    (0.7, 1.0, 1.0),    # ... and with η > 1/2: δ = 0
])
def test_slab_region_probability_at_the_edges(eta, lambda0, expected):
    d = SpikeSlabLasso(torch.tensor([eta, eta], dtype=torch.float64), lambda0, 1.0)
    p = d.slab_region_probability(torch.tensor([0.0, 0.7]), torch.tensor([0.1, 3.0]))
    assert p.tolist() == [expected, expected]
