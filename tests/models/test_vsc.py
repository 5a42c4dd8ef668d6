"""Variational sparse coding: model, guide schedules, sparse codes, and the API around them."""

import numpy as np
import pyro
import pytest
import torch
from pyro import poutine

import pyro_sparse
from pyro_sparse import Optimization, Schedule
from pyro_sparse.data.images import load_digits_images
from pyro_sparse.distributions import SpikeAndSlab
from pyro_sparse.guides import SpikeSlabGuide

QUICK = dict(latent_dim=8, max_epochs=3, batch_size=100, lr=1e-3, hidden_dims=(32,), progress=False)


@pytest.fixture(scope="module")
def digits():
    return load_digits_images().X[:600]


@pytest.fixture(scope="module")
def fitted(digits):
    # On the CPU: its tests feed the guide and model CPU tensors of their own.
    return pyro_sparse.train("vsc", digits, alpha=0.05, **{**QUICK, "device": "cpu"})


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
        guide.schedule(epoch, 10 * epoch)
        assert guide.slope == pytest.approx(slope) and guide.slab_weight == pytest.approx(weight)
        assert guide.posterior(torch.randn(2, 5)).base_dist.slope == pytest.approx(slope)


def test_pretraining_holds_the_slab_at_the_prior():
    guide = SpikeSlabGuide(5, 3, hidden_dims=(4,), pretrain_epochs=2)
    guide.schedule(0.5, 5)
    posterior = guide.posterior(torch.randn(7, 5)).base_dist
    assert (posterior.loc == 0).all() and (posterior.scale == 1).all()
    assert ((posterior.gate > 0) & (posterior.gate <= 1)).all()  # log γ = -ReLU(-v) keeps γ ≤ 1


def test_extreme_encoder_outputs_keep_the_kl_finite():
    # An encoder driven far out (seen with a linear generator) must not
    # underflow σ² to 0, whose log the KL takes.
    guide = SpikeSlabGuide(5, 3, hidden_dims=(4,))
    with torch.no_grad():
        last = guide.encoder[-1]
        last.weight.zero_()
        last.bias.copy_(torch.tensor([0.0] * 3 + [-1000.0] * 3 + [-1.0] * 3))  # μ, log σ², v
    posterior = guide.posterior(torch.randn(2, 5)).base_dist
    assert (posterior.scale > 0).all() and (posterior.gate > 0.3).all()
    kl = torch.distributions.kl_divergence(posterior, SpikeAndSlab(torch.full((3,), 0.1), 0.0, 1.0))
    assert torch.isfinite(kl).all()


def test_the_slab_is_never_wider_than_the_bound():
    # log σ² = 18 was seen on one Fashion-MNIST image: draws of |z| ≈ 2e4 and a loss of 1e9.
    guide = SpikeSlabGuide(5, 3, hidden_dims=(4,))
    with torch.no_grad():
        last = guide.encoder[-1]
        last.weight.zero_()
        last.bias.copy_(torch.tensor([0.0] * 3 + [18.0, 0.0, -3.0] + [0.0] * 3))  # μ, log σ², v
    log_variance = 2 * guide.posterior(torch.randn(2, 5)).base_dist.scale.log().detach()
    np.testing.assert_allclose(log_variance, [[2.0, 0.0, -3.0]] * 2, atol=1e-5)
    with pytest.raises(ValueError, match="max_log_variance"):
        SpikeSlabGuide(5, 3, max_log_variance=float("nan"))


def test_files_without_the_bound_load_with_the_former_clamp(fitted, tmp_path):
    from pyro_sparse.io import serialization

    fitted.save(tmp_path / "model.pt")
    config, states = serialization.read(tmp_path / "model.pt")
    assert fitted.guide.max_log_variance == 2.0
    # As an older file: no max_log_variance, and (before files recorded defaults) no latent_prior.
    del config["hyperparameters"]["max_log_variance"], config["hyperparameters"]["latent_prior"]
    serialization.write(tmp_path / "old.pt", config, states)
    assert pyro_sparse.load(tmp_path / "old.pt").guide.max_log_variance == 20.0


def test_training_runs_the_schedules(digits, monkeypatch):
    seen = []
    original = SpikeSlabGuide.schedule

    def record(self, epoch, iteration):
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
    with pytest.raises(TypeError, match=r"no option\(s\) \['lambda0'\]"):
        pyro_sparse.train("vsc", digits, lambda0=3.0, **QUICK)


def test_conditional_samples_vary_only_active_dimensions(fitted, digits, monkeypatch):
    samples = fitted.conditional_samples(digits[:5], num_samples=3)
    assert samples.shape == (3, 5, 64) and np.isfinite(samples).all()
    # With every dimension switched off, all draws decode the zero code: identical samples.
    monkeypatch.setattr(type(fitted), "_gates", lambda self, batch: torch.zeros(len(batch.x), 8))
    still = fitted.conditional_samples(digits[:5], num_samples=3)
    np.testing.assert_allclose(still[0], still[1])
    assert not np.allclose(samples[0], samples[1])


def test_conditional_samples_need_the_n01_slab_prior(digits):
    # Sec. 5.3 draws from the prior's N(0, 1) slab: other priors (a thresholded Laplace of scale 0.1, the
    # pseudo-input mixture) have other slabs, which N(0, 1) draws would misrepresent.
    for model, options in (("tvsc", {}), ("vsc", {"latent_prior": "pseudo_inputs", "num_pseudo_inputs": 4})):
        fitted = pyro_sparse.train(model, digits, **options, **QUICK)
        with pytest.raises(AttributeError, match="N\\(0, 1\\) slab of VSC's spike-and-slab prior"):
            fitted.conditional_samples(digits[:5])
        assert np.isfinite(fitted.reconstruct(digits[:5])).all()  # the pseudo-input prior's factor is no x


def test_pseudo_input_model_round_trips_through_a_file(digits, tmp_path):
    fitted = pyro_sparse.train("vsc", digits, latent_prior="pseudo_inputs", num_pseudo_inputs=4, **QUICK)
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
    with pytest.raises(ValueError, match="latent_prior='normal'"):
        pyro_sparse.train("vsc", np.random.default_rng(0).normal(size=(50, 4)), alpha=1.0, **QUICK)


# ------------------------------------------- the spike-and-slab baseline of Fallah & Rozell (2022)


def test_straight_through_guide_draws_exact_codes_and_anneals_the_temperature():
    guide = SpikeSlabGuide(5, 3, hidden_dims=(4,), spike_estimator="straight_through")
    assert guide.temperature == 0.5  # finished outside training
    # Appendix D: τ from 1, times 0.9995 per iteration, floored at 0.5.
    for iteration, expected in [(0, 1.0), (100, 0.9995**100), (1000, 0.9995**1000), (2000, 0.5)]:
        guide.schedule(iteration / 10, iteration)
        assert guide.temperature.item() == pytest.approx(expected)
        assert guide.posterior(torch.randn(2, 5)).base_dist.temperature == pytest.approx(expected)
    trace = poutine.trace(guide).get_trace(torch.randn(400, 5))
    z = trace.nodes["z"]["value"]
    posterior = trace.nodes["z"]["fn"].base_dist
    assert posterior.spike_estimator == "straight_through"
    assert z.requires_grad and (z == 0).any()
    # Training-time draws are exact: zero or the slab value, never shrunk towards 0.
    assert ((z == 0) | (z.abs() > 1e-3)).float().mean() > 0.99


def test_straight_through_training_runs_and_round_trips(digits, tmp_path):
    fitted = pyro_sparse.train("vsc", digits, spike_estimator="straight_through", **QUICK)
    assert np.isfinite(fitted.history_["train_loss"]).all()
    assert fitted.guide.temperature.item() == pytest.approx(0.9995 ** (3 * 6 - 1))  # 6 steps per epoch
    fitted.save(tmp_path / "st.pt")
    loaded = pyro_sparse.load(tmp_path / "st.pt")
    assert loaded.guide.spike_estimator == "straight_through"
    assert loaded.guide.temperature.item() == fitted.guide.temperature.item()
    np.testing.assert_array_equal(loaded.transform(digits), fitted.transform(digits))


def sparse_linear_data(num_data=1000, num_features=16, num_atoms=6, active=0.3, noise=0.05, seed=0):
    """x = A z + noise with unit-norm atoms and spike-and-slab codes, P(z_k != 0) = ``active``."""
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(num_features, num_atoms))
    A /= np.linalg.norm(A, axis=0)
    Z = rng.normal(size=(num_data, num_atoms)) * (rng.random((num_data, num_atoms)) < active)
    X = Z @ A.T + noise * rng.normal(size=(num_data, num_features))
    return X.astype(np.float32), A, Z


# On the CPU: these tests read the dictionary and the traces' tensors themselves.
LINEAR = dict(decoder="linear", spike_estimator="straight_through", hidden_dims=(64,), batch_size=100,
              schedule=Schedule(kl_warmup_epochs=0), progress=False, device="cpu")


def test_linear_vsc_recovers_a_known_dictionary():
    # Max-ELBO particles (Fallah & Rozell, Eq. 9) find every atom on seeds 0-2
    # in 40 epochs; J = 1 needs ~100 epochs and misses one atom on some seeds.
    X, A, _ = sparse_linear_data()
    fitted = pyro_sparse.train("vsc", X, latent_dim=6, alpha=0.3, noise_variance=0.01, lr=2e-2, max_epochs=40,
                               optimization=Optimization(num_particles=5, particle_reduction="max"), seed=0,
                               **LINEAR)
    learned = fitted.guide.point_estimate("A").detach().numpy()
    cosines = np.abs((learned / np.linalg.norm(learned, axis=0)).T @ A)
    assert cosines.max(0).min() > 0.95, cosines.max(0)  # every true atom is found
    codes = fitted.transform(X)
    error = np.mean((X - codes @ learned.T) ** 2)
    assert error < 0.5 * np.mean(X**2), (error, np.mean(X**2))  # far better than the all-zero code
    assert 0.05 < (codes != 0).mean() < 0.4, (codes != 0).mean()  # sparse (the truth: 30%)


def test_linear_vsc_has_tvsc_dictionary_prior_and_fixed_noise():
    X, _, _ = sparse_linear_data(num_data=200)
    fitted = pyro_sparse.train("vsc", X, latent_dim=6, dictionary_penalty=0.01, noise_variance=0.02,
                               max_epochs=1, **LINEAR)
    A = fitted.guide.point_estimate("A").detach()
    x = torch.as_tensor(X[:5])
    trace = poutine.trace(poutine.replay(fitted.model, trace=poutine.trace(fitted.guide).get_trace(x))).get_trace(x, 500)
    # Eq. 11's κ‖A‖² per data point: log prior = -N κ ‖A‖² + const over N = 500 points.
    prior = trace.nodes["A"]["fn"]
    a1, a2 = torch.zeros(16, 6), torch.ones(16, 6)
    torch.testing.assert_close(prior.log_prob(a2) - prior.log_prob(a1), torch.tensor(-500 * 0.01 * 16 * 6))
    likelihood = trace.nodes["x"]["fn"].base_dist
    torch.testing.assert_close(likelihood.loc, trace.nodes["z"]["value"] @ A.T)
    torch.testing.assert_close(likelihood.scale, torch.full((5, 16), 0.02**0.5))
    assert fitted.model.decoder is None and "A" in fitted.guide.unconstrained


def test_linear_vsc_with_vectorised_max_particles():
    X, _, _ = sparse_linear_data(num_data=300)
    max_of_three = Optimization(num_particles=3, particle_reduction="max")
    fitted = pyro_sparse.train("vsc", X, latent_dim=6, optimization=max_of_three, max_epochs=2, **LINEAR)
    assert np.isfinite(fitted.history_["train_loss"]).all()
    x = torch.as_tensor(X[:5])
    particles = pyro.plate("particles", 3, dim=-2)
    guide_trace = poutine.trace(particles(fitted.guide)).get_trace(x)
    trace = poutine.trace(poutine.replay(particles(fitted.model), trace=guide_trace)).get_trace(x)
    assert trace.nodes["A"]["value"].shape == (3, 1, 16, 6)
    assert trace.nodes["z"]["value"].shape == (3, 5, 6)
    assert trace.nodes["x"]["fn"].batch_shape == (3, 5)
    expected = torch.einsum("jgk,jbk->jbg", trace.nodes["A"]["value"][:, 0], trace.nodes["z"]["value"])
    torch.testing.assert_close(trace.nodes["x"]["fn"].base_dist.loc, expected)
    # Mode codes stay exactly sparse.
    codes, gates = fitted.transform(X), fitted.spike_probabilities(X)
    np.testing.assert_array_equal(codes == 0, gates <= 0.5)
    assert np.isfinite(fitted.heldout_log_likelihood(X[:20], 4)).all()


def test_bad_linear_vsc_settings_are_named():
    X, _, _ = sparse_linear_data(num_data=50)
    for options, message in [
        (dict(decoder="conv"), "28x28 images"),
        (dict(decoder="mesh"), "decoder"),
        (dict(decoder="linear", dictionary_penalty=0.0), "dictionary_penalty"),
        (dict(decoder="linear", noise_variance=-1.0), "noise_variance"),
        (dict(spike_estimator="gumbel"), "spike_estimator"),
        (dict(spike_estimator="straight_through", temperature_start=0.4, temperature_end=0.5), "temperature_end <="),
        (dict(spike_estimator="straight_through", temperature_decay=1.5), "temperature_decay"),
    ]:
        quick = {key: value for key, value in {**QUICK, "latent_dim": 3}.items()
                 if options.get("decoder") != "conv" or key != "hidden_dims"}  # the conv networks' own layers
        with pytest.raises(ValueError, match=message):
            pyro_sparse.train("vsc", X, **{**quick, **options})


def test_linear_generator_products_and_bad_shapes():
    from pyro_sparse.priors import LinearGenerator

    generator = LinearGenerator(7, 4, penalty=0.1)
    (init, _), = generator.point_estimate_sites().values()
    assert init.shape == (7, 4)
    A, z = torch.randn(7, 4), torch.randn(5, 4)
    torch.testing.assert_close(generator(A, z), z @ A.T)
    particles_A, particles_z = torch.randn(3, 1, 7, 4), torch.randn(3, 5, 4)  # (J, 1, G, K), (J, B, K)
    expected = torch.einsum("jgk,jbk->jbg", particles_A[:, 0], particles_z)
    torch.testing.assert_close(generator(particles_A, particles_z), expected)
    with pytest.raises(ValueError, match="1, G, K"):
        generator(torch.randn(3, 5, 7, 4), particles_z)
    with pytest.raises(ValueError, match="dictionary_penalty"):
        LinearGenerator(7, 4, penalty=0.0)
