"""Variational sparse coding: model, guide schedules, sparse codes, and the API around them."""

import numpy as np
import pyro
import pytest
import torch
from pyro_sparse.guides import SpikeSlabGuide

import pyro_sparse
from pyro_sparse.distributions import SpikeAndSlab
from pyro_sparse.image_datasets import load_digits_images

QUICK = dict(latent_dim=8, max_epochs=3, batch_size=100, lr=1e-3, hidden_dims=(32,), progress=False)


@pytest.fixture(scope="module")
def digits():
    return load_digits_images().X[:600]


@pytest.fixture(scope="module")
def fitted(digits):
    return pyro_sparse.train("vsc", digits, alpha=0.05, **QUICK)


def test_codes_are_sparse_modes_with_means_and_draws(fitted, digits):
    mode = fitted.transform(digits)
    mean = fitted.transform(digits, kind="mean")
    gate = fitted.spike_probabilities(digits)
    assert mode.shape == mean.shape == gate.shape == (600, 8)
    # The mode is exactly 0 where the spike is more probable than the slab, the slab's loc otherwise.
    np.testing.assert_array_equal(mode == 0, gate <= 0.5)
    posterior = fitted.guide.posterior(torch.as_tensor(digits)).base_dist
    np.testing.assert_allclose(mean, (posterior.gate * posterior.loc).detach().numpy(), rtol=1e-5, atol=1e-6)
    draws = fitted.sample_posterior(digits[:50], num_samples=400)
    assert draws.shape == (400, 50, 8)
    np.testing.assert_allclose((draws != 0).mean(0), gate[:50], atol=0.1)  # exact zeros at rate 1 - γ
    with pytest.raises(ValueError, match="kind"):
        fitted.transform(digits, kind="median")


def test_spike_probabilities_need_spike_and_slab_codes(digits):
    vae = pyro_sparse.train("vae", digits, noise="heteroscedastic", **QUICK)
    with pytest.raises(AttributeError, match="no spike-and-slab codes"):
        vae.spike_probabilities(digits)
    np.testing.assert_array_equal(vae.transform(digits), vae.transform(digits, kind="mean"))


def test_elbo_uses_the_registered_spike_slab_kl(fitted, digits, monkeypatch):
    import torch.distributions.kl as kl

    calls = []
    original = kl._KL_REGISTRY[(SpikeAndSlab, SpikeAndSlab)]

    def spy(q, p):
        calls.append(q.batch_shape)
        return original(q, p)

    monkeypatch.setitem(kl._KL_REGISTRY, (SpikeAndSlab, SpikeAndSlab), spy)
    kl._KL_MEMOIZE.clear()
    x = torch.as_tensor(digits[:20])
    pyro.infer.TraceMeanField_ELBO().differentiable_loss(fitted.model, fitted.guide, x)
    kl._KL_MEMOIZE.clear()
    assert calls == [torch.Size([20, 8])]


def test_heldout_likelihood_scores_exact_zeros_with_the_atom(fitted, digits):
    # Relaxed draws are never exactly 0; the estimate must use exact draws, so it
    # agrees with the training objective's scale instead of exploding.
    ll = fitted.heldout_log_likelihood(digits[:30], num_samples=20)
    elbo_per_point = -fitted.history_["train_loss"][-1]
    assert np.isfinite(ll).all()
    assert abs(ll.mean() - elbo_per_point) < 0.25 * abs(elbo_per_point) + 20


def test_slope_and_pretraining_schedules():
    guide = SpikeSlabGuide(
        5, 3, hidden_dims=(4,), slope_start=50, slope_end=200, slope_warmup_epochs=10,
        pretrain_epochs=4, pretrain_ramp_epochs=2,
    )
    assert guide.slope == 200 and guide.slab_weight == 1  # finished outside training
    expected = {0: (50, 0.0), 4: (110, 0.0), 5: (125, 0.5), 6: (140, 1.0), 20: (200, 1.0)}
    for epoch, (slope, weight) in expected.items():
        guide.schedule(epoch)
        assert guide.slope == pytest.approx(slope) and guide.slab_weight == pytest.approx(weight)
        assert guide.posterior(torch.randn(2, 5)).base_dist.slope == pytest.approx(slope)


def test_pretraining_holds_the_slab_at_the_prior():
    guide = SpikeSlabGuide(5, 3, hidden_dims=(4,), pretrain_epochs=2)
    guide.schedule(0.5)
    posterior = guide.posterior(torch.randn(7, 5)).base_dist
    assert (posterior.loc == 0).all() and (posterior.scale == 1).all()
    assert ((posterior.gate > 0) & (posterior.gate <= 1)).all()  # log γ = -ReLU(-v) keeps γ ≤ 1


def test_training_runs_the_schedules(digits, monkeypatch):
    seen = []
    original = SpikeSlabGuide.schedule

    def record(self, epoch, iteration=None):
        original(self, epoch, iteration)
        seen.append((epoch, self.slope.item(), self.slab_weight.item()))

    monkeypatch.setattr(SpikeSlabGuide, "schedule", record)
    pyro_sparse.train(
        "vsc", digits, slope_warmup_epochs=2, pretrain_epochs=1, pretrain_ramp_epochs=1, **QUICK
    )
    assert seen[0] == (0.0, 50.0, 0.0)
    assert seen[-1][0] == pytest.approx(3 - 1 / 6) and seen[-1][1:] == (200.0, 1.0)


def test_an_unfinished_schedule_is_kept_for_evaluation_and_saving(digits, tmp_path):
    # Training that stops mid-warm-up evaluates (and saves) the guide it trained,
    # not one with the schedules jumped to their ends.
    fitted = pyro_sparse.train("vsc", digits, slope_warmup_epochs=30, pretrain_epochs=2, pretrain_ramp_epochs=4, **QUICK)
    assert fitted.guide.slope.item() == pytest.approx(50 + 150 * (3 - 1 / 6) / 30)
    assert fitted.guide.slab_weight.item() == pytest.approx((3 - 1 / 6 - 2) / 4)
    fitted.save(tmp_path / "m.pt")
    loaded = pyro_sparse.load(tmp_path / "m.pt")
    assert loaded.guide.slope.item() == fitted.guide.slope.item()
    np.testing.assert_allclose(loaded.transform(digits), fitted.transform(digits))


def test_smaller_alpha_gives_sparser_codes(digits):
    active = {}
    for alpha in (0.02, 0.5):
        fitted = pyro_sparse.train("vsc", digits, alpha=alpha, seed=0, **{**QUICK, "max_epochs": 15})
        active[alpha] = (fitted.spike_probabilities(digits) > 0.5).mean()
    assert active[0.02] < active[0.5] - 0.1, active


def test_bad_vsc_settings_are_named(digits):
    with pytest.raises(ValueError, match="alpha"):
        pyro_sparse.train("vsc", digits, alpha=0.0, **QUICK)
    with pytest.raises(ValueError, match="slope"):
        pyro_sparse.train("vsc", digits, slope_start=300.0, **QUICK)
    with pytest.raises(TypeError, match="no hyperparameter"):
        pyro_sparse.train("vsc", digits, lambda0=3.0, **QUICK)


def test_conditional_samples_vary_only_active_dimensions(fitted, digits, monkeypatch):
    samples = fitted.conditional_samples(digits[:5], num_samples=3)
    assert samples.shape == (3, 5, 64) and np.isfinite(samples).all()
    # With every dimension switched off, all draws decode the zero code: identical samples.
    monkeypatch.setattr(type(fitted), "_gates", lambda self, x: torch.zeros(len(x), 8))
    still = fitted.conditional_samples(digits[:5], num_samples=3)
    np.testing.assert_allclose(still[0], still[1])
    assert not np.allclose(samples[0], samples[1])


def test_pseudo_input_model_round_trips_through_a_file(digits, tmp_path):
    fitted = pyro_sparse.train("vsc", digits, prior="pseudo_inputs", num_pseudo_inputs=4, **QUICK)
    fitted.save(tmp_path / "vsc.pt")
    loaded = pyro_sparse.load(tmp_path / "vsc.pt")
    np.testing.assert_allclose(loaded.transform(digits), fitted.transform(digits))
    torch.manual_seed(0)
    a = loaded.heldout_log_likelihood(digits[:10], 4)
    torch.manual_seed(0)
    b = fitted.heldout_log_likelihood(digits[:10], 4)
    np.testing.assert_allclose(a, b, rtol=1e-5)


def test_near_constant_pixels_do_not_break_the_likelihood():
    # Digits have border pixels that are (nearly) constant in training; a test
    # image that differs there must not score ±1e5 nats.
    X = load_digits_images().X
    fitted = pyro_sparse.train("vsc", X[:1200], alpha=0.05, **{**QUICK, "max_epochs": 10})
    ll = fitted.heldout_log_likelihood(X[1200:1500], 10)
    assert np.isfinite(ll).all()
    assert np.median(ll) - ll.min() < 2000, (np.median(ll), ll.min())


def test_alpha_one_is_refused_with_the_alternative():
    with pytest.raises(ValueError, match="model='vae'"):
        pyro_sparse.train("vsc", np.random.default_rng(0).normal(size=(50, 4)), alpha=1.0, **QUICK)
