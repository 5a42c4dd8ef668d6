"""Tests of SpikeSlabLassoPrior: EM updates of eta and the orthant-wise
proximal hooks around an optimizer step."""

import math

import numpy as np
import pytest
import scipy.optimize
import torch

from pyro_sparse.distributions import SpikeSlabLasso
from pyro_sparse.priors import SpikeSlabLassoPrior


def numpy_inclusion(w, eta, lambda0, lambda1):
    w = np.abs(np.asarray(w, dtype=np.float64))
    slab = eta * lambda1 / 2 * np.exp(-lambda1 * w)
    spike = (1 - eta) * lambda0 / 2 * np.exp(-lambda0 * w)
    return slab / (slab + spike)


# ------------------------------------------------------------------ update ---
def test_update_matches_hand_computation():
    G, K = 4, 3
    lambda0, lambda1, a, b = 15.0, 1.5, 2.0, 3.0
    prior = SpikeSlabLassoPrior(G, K, lambda0=lambda0, lambda1=lambda1, a=a, b=b)
    eta0 = np.array([0.2, 0.5, 0.05])
    prior.eta.copy_(torch.tensor(eta0))
    mask = np.array(
        [[0.0, 0.1, -1.2],
         [0.05, -0.3, 0.0],
         [2.0, 0.0, 0.02],
         [-0.15, 0.6, 0.0]]
    )
    eta_used = prior.eta.double().numpy()  # float32 round trip of eta0
    prior.update(torch.tensor(mask, dtype=torch.float32))

    probs = numpy_inclusion(mask.astype(np.float32), eta_used[None, :], lambda0, lambda1)
    new_eta = (probs.sum(0) + a - 1) / (a + b + G - 2)
    assert prior.inclusion_probs.shape == (G, K)
    assert prior.eta.shape == (K,)
    np.testing.assert_allclose(prior.inclusion_probs.numpy(), probs, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(prior.eta.numpy(), new_eta, rtol=1e-6)

    # A second update uses the new eta.
    eta_used = prior.eta.double().numpy()
    prior.update(torch.tensor(mask, dtype=torch.float32))
    probs2 = numpy_inclusion(mask.astype(np.float32), eta_used[None, :], lambda0, lambda1)
    np.testing.assert_allclose(prior.inclusion_probs.numpy(), probs2, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(prior.eta.numpy(), (probs2.sum(0) + a - 1) / (a + b + G - 2),
                               rtol=1e-6)


def test_update_does_not_touch_autograd():
    prior = SpikeSlabLassoPrior(3, 2)
    mask = torch.nn.Parameter(torch.randn(3, 2))
    prior.update(mask)
    assert not prior.eta.requires_grad
    assert not prior.inclusion_probs.requires_grad
    assert mask.grad is None


def test_initial_state_and_distribution():
    G, K = 5, 2
    prior = SpikeSlabLassoPrior(G, K, lambda0=20.0, lambda1=0.5)
    assert torch.equal(prior.eta, torch.full((K,), 0.5))
    assert torch.equal(prior.inclusion_probs, torch.full((G, K), 0.5))
    buffers = dict(prior.named_buffers())
    assert set(buffers) >= {"eta", "inclusion_probs"}
    prior.eta.copy_(torch.tensor([0.1, 0.8]))
    d = prior.distribution()
    assert d.event_shape == (G, K)
    assert d.batch_shape == ()
    torch.manual_seed(0)
    w = torch.randn(G, K)
    expected = SpikeSlabLasso(torch.tensor([0.1, 0.8]).expand(G, K), 20.0, 0.5).log_prob(w).sum()
    assert torch.allclose(d.log_prob(w), expected)


def test_b_defaults_to_num_features():
    G, K = 6, 2
    prior = SpikeSlabLassoPrior(G, K, a=1.5)
    assert prior.b == float(G)
    explicit = SpikeSlabLassoPrior(G, K, a=1.5, b=G)
    other = SpikeSlabLassoPrior(G, K, a=1.5, b=1.0)
    torch.manual_seed(1)
    mask = torch.randn(G, K) * 0.3
    for p in (prior, explicit, other):
        p.update(mask)
    assert torch.equal(prior.eta, explicit.eta)
    assert not torch.allclose(prior.eta, other.eta)
    probs = prior.inclusion_probs.double()
    expected = (probs.sum(0) + 0.5) / (1.5 + G + G - 2)
    torch.testing.assert_close(prior.eta.double(), expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    "kwargs",
    [dict(lambda0=0.0), dict(lambda0=-1.0), dict(lambda1=0.0), dict(lambda1=-2.0),
     dict(a=0.0), dict(a=-1.0), dict(b=0.0), dict(b=-3.0), dict(lambda0=float("nan")),
     dict(a=float("nan"))],
)
def test_invalid_hyperparameters(kwargs):
    with pytest.raises(ValueError):
        SpikeSlabLassoPrior(4, 2, **kwargs)


# ------------------------------------------------------------ eta stability ---
def test_eta_never_zero_when_probs_underflow():
    G, K = 50, 3
    prior = SpikeSlabLassoPrior(G, K, lambda0=1000.0, lambda1=1.0)
    mask = torch.zeros(G, K)
    # Column 2 has a large-magnitude structure in a few entries; the rest is zero.
    mask[:3, 2] = torch.tensor([50.0, -80.0, 120.0])
    for _ in range(300):
        prior.update(mask)
        assert torch.isfinite(prior.eta).all()
        assert (prior.eta > 0).all()
        assert (prior.eta < 1).all()
    # All-zero columns shrink to the smallest positive float32.
    assert prior.eta[0].item() == pytest.approx(torch.finfo(torch.float32).tiny, rel=1e-6)
    # The column with slab entries converges to the EM fixed point
    # eta = (3 + 47 p0(eta)) / (a + b + G - 2), p0 the inclusion prob at w = 0.
    eta = 0.5
    for _ in range(300):
        eta = (3 + 47 * numpy_inclusion(0.0, eta, 1000.0, 1.0)) / (2 * G - 1)
    assert 3.0 / (2 * G - 1) < eta < 3.1 / (2 * G - 1)
    assert prior.eta[2].item() == pytest.approx(eta, rel=1e-5)
    assert torch.isfinite(prior.distribution().log_prob(mask))
    # Eta exactly zero in the buffer (all probs exactly zero) still gives a
    # positive, finite eta after an update.
    prior.eta.zero_()
    prior.update(mask)
    assert not torch.isnan(prior.inclusion_probs).any()
    assert (prior.eta > 0).all() and torch.isfinite(prior.eta).all()


def test_eta_leaves_its_floor_when_the_column_grows():
    # A column switched off (eta at the float32 floor) whose weights the data
    # then raise: each E-step multiplies eta by about sum_j psi1/psi0 /
    # (a + b + G - 2) (here 5 e^9 / 10 / 99, ~40), so it must climb back.
    # Sum(E[gamma]) + a - 1 evaluated left to right rounds to 0 at a = 1.
    G = 50
    prior = SpikeSlabLassoPrior(G, 2, lambda0=10.0, lambda1=1.0)
    floor = torch.finfo(torch.float32).tiny
    prior.eta.fill_(floor)
    mask = torch.zeros(G, 2)
    mask[:5, 0] = 1.0
    for _ in range(30):
        prior.update(mask)
    assert prior.eta[0].item() > 0.01 and (prior.inclusion_probs[:5, 0] > 0.5).all()
    assert prior.eta[1].item() == pytest.approx(floor, rel=1e-6)  # an empty column stays off


def test_eta_clamped_when_a_below_one():
    # With a < 1 the formula goes negative for an empty column.
    prior = SpikeSlabLassoPrior(10, 2, lambda0=500.0, lambda1=1.0, a=0.5, b=1.0)
    prior.eta.fill_(1e-20)
    prior.update(torch.zeros(10, 2))
    assert (prior.eta > 0).all()
    assert torch.isfinite(prior.eta).all()


def test_eta_below_one_when_all_in_slab():
    # a = b = 1 and every entry in the slab gives eta = 1 by the formula;
    # it must stay below 1 so that log(1 - eta) remains finite.
    G = 4
    prior = SpikeSlabLassoPrior(G, 1, lambda0=50.0, lambda1=1.0, a=1.0, b=1.0)
    mask = torch.full((G, 1), 3.0)
    for _ in range(5):
        prior.update(mask)
    assert (prior.eta < 1).all()
    assert prior.eta.item() > 0.999
    assert torch.isfinite(prior.distribution().log_prob(torch.zeros(G, 1)))


# ------------------------------------------------------------------- hooks ---
# The M-step for W is a proximal step in the optimizer's metric:
#   before_step(W): grad <- grad - lambda*(W, eta) sign(W)   (drop the lasso part
#                   that autograd put there via the SSL log-density);
#   after_step(W, step_size, max_shift): W <- sign(W) max(|W| - min(step_size * lambda*, max_shift), 0) with
#                   lambda* = lambda1 p + lambda0 (1 - p), p the last E-step's
#                   inclusion_probs; then update(W).
LAMBDA0, LAMBDA1 = 20.0, 1.0


def make_prior_and_mask(dtype=torch.float64):
    prior = SpikeSlabLassoPrior(3, 2, lambda0=LAMBDA0, lambda1=LAMBDA1)
    prior.eta.copy_(torch.tensor([0.3, 0.05]))
    mask = torch.nn.Parameter(torch.tensor(
        [[0.0, 0.02],
         [0.5, 0.0],
         [0.0, -0.4]], dtype=dtype))
    return prior, mask


def adam_step_sizes(optimizer, param):
    """Adam's per-coordinate step size lr / (sqrt(v_hat) + eps)."""
    group = optimizer.param_groups[0]
    state = optimizer.state[param]
    v_hat = state["exp_avg_sq"] / (1 - group["betas"][1] ** float(state["step"]))
    return group["lr"] / (v_hat.sqrt() + group["eps"])


def test_penalty_weights_from_last_estep():
    prior, mask = make_prior_and_mask()
    prior.update(mask)
    p = prior.inclusion_probs.double()
    expected = LAMBDA1 * p + LAMBDA0 * (1 - p)
    torch.testing.assert_close(prior.penalty_weights().double(), expected)
    # At the initial state (p = 0.5) the weight is the midpoint.
    fresh = SpikeSlabLassoPrior(3, 2, lambda0=LAMBDA0, lambda1=LAMBDA1)
    torch.testing.assert_close(fresh.penalty_weights(), torch.full((3, 2), (LAMBDA0 + LAMBDA1) / 2))


def test_before_step_hand_computation():
    prior, mask = make_prior_and_mask()
    eta = prior.eta.double().numpy()
    w = mask.detach().numpy()
    grad = np.array([[1.0, -2.0], [3.0, 0.5], [-4.0, 7.0]])
    mask.grad = torch.tensor(grad)
    prior.before_step(mask)
    p = numpy_inclusion(w, eta[None, :], LAMBDA0, LAMBDA1)
    lam = LAMBDA1 * p + LAMBDA0 * (1 - p)
    expected = grad - lam * np.sign(w)
    np.testing.assert_allclose(mask.grad.numpy(), expected, rtol=1e-6, atol=1e-6)
    # Entries exactly at zero keep their gradient.
    assert mask.grad[0, 0].item() == 1.0 and mask.grad[1, 1].item() == 0.5
    assert mask.grad[2, 0].item() == -4.0
    # The weight at w = 0.02 is dominated by the spike, at 0.5 by the slab.
    assert lam[0, 1] > 0.5 * LAMBDA0 and lam[1, 0] < 1.1 * LAMBDA1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_before_step_removes_exactly_the_prior_gradient(dtype):
    # With the loss smooth(W) - log SSL(W; eta), before_step leaves d smooth / dW.
    torch.manual_seed(2)
    prior = SpikeSlabLassoPrior(6, 3, lambda0=LAMBDA0, lambda1=LAMBDA1)
    prior.eta.copy_(torch.tensor([0.7, 0.1, 1e-4]))
    mask = torch.nn.Parameter((torch.randn(6, 3) * 0.5).to(dtype))
    with torch.no_grad():
        mask[::2, 1] = 0.0
    target = torch.randn(6, 3, dtype=dtype)

    def smooth(w):
        return 0.5 * ((w - target) ** 2 * torch.arange(1, 19, dtype=dtype).view(6, 3)).sum()

    (smooth_grad,) = torch.autograd.grad(smooth(mask), mask)
    loss = smooth(mask) - prior.distribution().log_prob(mask)
    loss.backward()
    assert not torch.allclose(mask.grad, smooth_grad)
    prior.before_step(mask)
    # distribution() is float32 (the eta buffer) whatever the dtype of W.
    torch.testing.assert_close(mask.grad, smooth_grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scalar", [False, True])
def test_after_step_soft_threshold(scalar):
    prior, mask = make_prior_and_mask()
    prior.update(mask)                     # the E-step whose lambda* the M-step uses
    lam = prior.penalty_weights().double().numpy()
    eta_before = prior.eta.clone()
    step = 0.01 if scalar else torch.tensor([[0.01, 0.02], [0.001, 0.05], [0.03, 0.004]],
                                             dtype=torch.float64)
    s = np.full((3, 2), step) if scalar else step.numpy()
    new = np.array([[0.3, -0.05], [0.15, 0.001], [-0.2, -0.6]])
    with torch.no_grad():
        mask.copy_(torch.tensor(new))
    prior.after_step(mask, step, float("inf"))
    expected = np.sign(new) * np.maximum(np.abs(new) - s * lam, 0.0)
    np.testing.assert_allclose(mask.detach().numpy(), expected, rtol=1e-6, atol=1e-9)
    # The thresholds cut some entries but not all: exact zeros where |w| <= s lambda*.
    small = np.abs(new) <= s * lam
    assert small.any() and not small.all()
    assert (mask.detach().numpy()[small] == 0.0).all()
    assert (mask.detach().numpy()[~small] != 0.0).all()
    # ... and the E-step was then run on the thresholded W with the previous eta.
    reference = SpikeSlabLassoPrior(3, 2, lambda0=LAMBDA0, lambda1=LAMBDA1)
    reference.eta.copy_(eta_before)
    reference.update(mask.detach())
    assert torch.equal(prior.eta, reference.eta)
    assert torch.equal(prior.inclusion_probs, reference.inclusion_probs)


def test_after_step_zero_step_size_is_identity_on_w():
    prior, mask = make_prior_and_mask()
    before = mask.detach().clone()
    prior.after_step(mask, 0.0, float("inf"))
    assert torch.equal(mask.detach(), before)


def test_after_step_moves_no_entry_further_than_twice_max_shift():
    # Where the smooth gradient has been ~0, Adam's step size is lr/eps; the
    # proximal step must still move each entry by at most twice max_shift (= lr).
    prior, mask = make_prior_and_mask()
    prior.update(mask)
    w = torch.tensor([[2.0, -2.0], [0.5, 0.0], [1.0, -0.01]], dtype=torch.float64)
    with torch.no_grad():
        mask.copy_(w)
    prior.after_step(mask, torch.full((3, 2), 1e6, dtype=torch.float64), 0.05)
    torch.testing.assert_close(mask.detach(), w.sign() * (w.abs() - 0.1).clamp_min(0))


def test_after_step_float32_mask_float64_steps():
    prior, mask = make_prior_and_mask(torch.float32)
    prior.update(mask)
    lam = prior.penalty_weights()
    step = torch.full((3, 2), 0.02, dtype=torch.float64)
    w = torch.tensor([[1.0, -1.0], [0.01, 0.5], [-0.3, 0.0]])
    with torch.no_grad():
        mask.copy_(w)
    prior.after_step(mask, step, float("inf"))
    assert mask.dtype == torch.float32
    expected = w.sign() * (w.abs() - 0.02 * lam).clamp_min(0)
    torch.testing.assert_close(mask.detach(), expected)


def test_sgd_step_equals_proximal_gradient_step():
    # before_step + SGD(lr) + after_step(lr) is one ISTA step on the weighted lasso:
    # W+ = prox_{lr lambda*}(W - lr grad smooth).
    torch.manual_seed(3)
    prior = SpikeSlabLassoPrior(4, 2, lambda0=LAMBDA0, lambda1=LAMBDA1)
    mask = torch.nn.Parameter(torch.randn(4, 2, dtype=torch.float64))
    with torch.no_grad():
        mask[0, 0] = 0.0
    prior.update(mask)
    lam = prior.penalty_weights().double()
    target = torch.randn(4, 2, dtype=torch.float64) * 3
    lr = 0.05
    opt = torch.optim.SGD([mask], lr=lr)
    w0 = mask.detach().clone()
    loss = 0.5 * ((mask - target) ** 2).sum() - prior.distribution().log_prob(mask)
    loss.backward()
    prior.before_step(mask)
    opt.step()
    prior.after_step(mask, lr, float("inf"))
    v = w0 - lr * (w0 - target)
    expected = v.sign() * (v.abs() - lr * lam).clamp_min(0)
    torch.testing.assert_close(mask.detach(), expected, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------ end-to-end proximal ---
def run_proximal(t, c, lambda0, lambda1, w0, steps=2000, a=1.0, b=None, optimizer="adam", max_shift=math.inf):
    """
    Minimise sum_k 0.5 c (w_k - t_k)^2 - log SSL(w_k) with an optimizer + the
    hooks; ``max_shift``: what the training loop passes (the lr), or no cap.
    """
    K = len(t)
    prior = SpikeSlabLassoPrior(1, K, lambda0=lambda0, lambda1=lambda1, a=a, b=b)
    w = torch.nn.Parameter(torch.tensor([w0], dtype=torch.float64))
    t = torch.tensor([t], dtype=torch.float64)
    if optimizer == "adam":
        opt = torch.optim.Adam([w], lr=0.02)
    else:
        opt = torch.optim.SGD([w], lr=0.1 / c)
    prior.update(w)
    for _ in range(steps):
        opt.zero_grad()
        loss = 0.5 * c * ((w - t) ** 2).sum() - prior.distribution().log_prob(w)
        loss.backward()
        prior.before_step(w)
        opt.step()
        step = adam_step_sizes(opt, w) if optimizer == "adam" else opt.param_groups[0]["lr"]
        prior.after_step(w, step, max_shift)
    return w.detach()[0], prior


def test_a_steady_gradient_does_not_stall_the_capped_proximal_step():
    # Noise-free Adam moves an entry by exactly lr per step; a shrink capped at lr only matched that move, so w
    # stopped wherever |gradient| < λ* (1.58 here, from 3) instead of at the stationary point t - λ1/c = 1.
    w, _ = run_proximal([2.0], 1.0, 10.0, 1.0, w0=[3.0], steps=4000, max_shift=0.02)
    assert w[0].item() == pytest.approx(1.0, abs=2e-3)


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_proximal_small_target_is_exactly_zero(optimizer):
    c, lambda0, lambda1 = 1.0, 20.0, 1.0
    t = [0.3, -0.5, 0.9, -0.05]          # c |t| < lambda1 <= lambda*(0)
    w, prior = run_proximal(t, c, lambda0, lambda1, w0=[0.3, -0.5, 0.9, 1.0], steps=600,
                            optimizer=optimizer)
    assert (w == 0.0).all(), w
    assert torch.isfinite(prior.eta).all()


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_proximal_large_target_near_stationary_point(optimizer):
    c, lambda0, lambda1 = 2.0, 20.0, 1.0
    t = [5.0, -6.0, 3.0]
    # Start away from t: at w = t the smooth gradient is exactly 0, Adam's v is 0
    # and its per-coordinate step size lr / eps would make the first threshold huge.
    w0 = [1.2 * x for x in t]
    w, prior = run_proximal(t, c, lambda0, lambda1, w0=w0, steps=1500, optimizer=optimizer)
    assert (w != 0).all()
    assert (w.sign() == torch.tensor(t).sign().double()).all()
    for k, tk in enumerate(t):
        # Stationarity with the lambda* of the last E-step: c (w - t) + lambda* sign(w) = 0.
        lam = prior.penalty_weights()[0, k].double().item()
        assert w[k].item() == pytest.approx(tk - math.copysign(lam, tk) / c, abs=2e-3)

        # And with lambda*(w, eta) at the solution itself (the EM fixed point).
        eta = prior.eta[k].double().item()

        def stationarity(x, eta=eta, tk=tk):
            d = SpikeSlabLasso(torch.tensor(eta, dtype=torch.float64), lambda0, lambda1)
            lam = d.penalty_weight(torch.tensor(x, dtype=torch.float64)).item()
            return c * (x - tk) + lam * math.copysign(1.0, tk)

        lo, hi = sorted([tk / 2, tk])
        root = scipy.optimize.brentq(stationarity, lo, hi, xtol=1e-12)
        assert w[k].item() == pytest.approx(root, abs=2e-3)
        # In the slab lambda* ~ lambda1: the stationary point is t - sign(t) lambda1 / c.
        assert root == pytest.approx(tk - math.copysign(lambda1, tk) / c, abs=1e-3)


def test_proximal_origin_is_a_local_minimum_between_thresholds():
    # lambda1 < c |t| < lambda*(0): from 0 the spike keeps w exactly at 0, while
    # a start in the slab converges to the slab solution t - lambda1 / c.
    c, lambda0, lambda1 = 1.0, 20.0, 1.0
    w_zero, prior = run_proximal([3.0], c, lambda0, lambda1, w0=[0.0], steps=300, b=1000.0)
    assert w_zero.item() == 0.0
    assert prior.penalty_weights()[0, 0].item() > 3.0
    w_slab, _ = run_proximal([3.0], c, lambda0, lambda1, w0=[3.5], steps=1500, b=1.0)
    assert w_slab.item() == pytest.approx(2.0, abs=2e-3)


# ------------------------------------------ zero entries under noisy gradients ---
def fraction_exactly_zero(t, noise, gradient_averaging, steps=2500, tail=500):
    """Adam + hooks on 0.5 (w - t)^2 - log SSL(w) with N(0, noise^2) added to every
    gradient (a minibatch gradient); the share of the last ``tail`` iterates that are 0."""
    torch.manual_seed(0)
    prior = SpikeSlabLassoPrior(1, len(t), lambda0=10.0, lambda1=1.0, gradient_averaging=gradient_averaging)
    w = torch.nn.Parameter(torch.full((1, len(t)), 0.5))
    target = torch.tensor([t])
    optimizer = torch.optim.Adam([w], lr=0.01)
    prior.update(w)
    zero = torch.zeros(len(t))
    for step in range(steps):
        optimizer.zero_grad()
        noisy = (noise * torch.randn_like(w) * w).sum()
        loss = 0.5 * ((w - target) ** 2).sum() + noisy - prior.distribution().log_prob(w)
        loss.backward()
        prior.before_step(w)
        optimizer.step()
        prior.after_step(w, adam_step_sizes(optimizer, w), 0.01)
        if step >= steps - tail:
            zero += (w.detach()[0] == 0).float()
    return zero / tail


def test_spike_entries_stay_exactly_zero_under_minibatch_noise():
    # |t| < lambda0 = 10 but the gradient noise (sd 50) is far above it.
    averaged = fraction_exactly_zero([0.5, -0.5, 0.0], noise=50.0, gradient_averaging=0.01)
    newest_only = fraction_exactly_zero([0.5, -0.5, 0.0], noise=50.0, gradient_averaging=1.0)
    assert (averaged > 0.95).all(), averaged
    assert (newest_only < 0.8).all(), newest_only  # what a one-minibatch zero test gives


def test_zero_entries_leave_zero_when_the_average_gradient_beats_the_penalty():
    # c|t| = 40 > lambda0: the entry must leave zero despite the noise and stay in the slab.
    fraction = fraction_exactly_zero([40.0, -40.0], noise=50.0, gradient_averaging=0.01)
    assert (fraction == 0).all(), fraction


def test_after_step_strength_scales_the_penalty_and_zero_keeps_w():
    """The loop passes the KL warm-up as ``strength``: 0 leaves W alone (no threshold, no zero test)."""
    w = torch.tensor([[0.3, -0.05], [0.15, 0.001], [-0.2, -0.6]], dtype=torch.float64)
    for strength in (0.0, 0.5):
        prior, mask = make_prior_and_mask()
        prior.update(mask)
        lam = prior.penalty_weights().double()
        with torch.no_grad():
            mask.copy_(w)
        prior.after_step(mask, 0.01, float("inf"), strength=strength)
        expected = w.sign() * (w.abs() - 0.01 * strength * lam).clamp_min(0)
        torch.testing.assert_close(mask.detach(), expected)
