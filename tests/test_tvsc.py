"""Thresholded variational sparse coding: model/guide pair, schedules, sparse codes."""

import numpy as np
import pyro
import pytest
import torch
from pyro import poutine
from torch.distributions import Bernoulli

import pyro_sparse
from pyro_sparse import Optimization
from pyro_sparse.data import DataError
from pyro_sparse.data.images import load_digits_images
from pyro_sparse.distributions.thresholded import thresholded_laplace_kl
from pyro_sparse.guides import ThresholdedGuide
from pyro_sparse.io import serialization

QUICK = dict(latent_dim=8, max_epochs=3, batch_size=100, lr=1e-3, hidden_dims=(32,), progress=False)
# For tests that feed CPU tensors to the fitted guide and model themselves (QUICK fits on CUDA where there is one).
ON_CPU = {**QUICK, "device": "cpu"}


@pytest.fixture(scope="module")
def digits():
    return load_digits_images().X[:500]


@pytest.mark.parametrize(
    "options",
    [
        dict(latent_prior="thresholded_laplace"),
        dict(latent_prior="thresholded_normal"),
        dict(learn_threshold=True),
        dict(decoder="linear"),
        dict(estimator="subgradient"),
        dict(estimator="straight_through", kl="base"),  # the paper's Eq. 4-5
        dict(amortized_threshold=False, kl="exact"),
    ],
)
def test_variants_train_and_give_exactly_sparse_codes(digits, options):
    fitted = pyro_sparse.train("tvsc", digits, **QUICK, **options)
    assert np.isfinite(fitted.history_["train_loss"]).all()
    codes, gates = fitted.transform(digits), fitted.spike_probabilities(digits)
    # The sparse-code convention: exactly 0 where the spike is more probable.
    np.testing.assert_array_equal(codes == 0, gates < 0.5)
    assert np.isfinite(fitted.heldout_log_likelihood(digits[:20], 4)).all()
    draws = fitted.sample_posterior(digits[:20], 50)
    assert (draws == 0).any() and draws.shape == (50, 20, 8)


def test_laplace_gate_is_prop_3_1(digits):
    fitted = pyro_sparse.train("tvsc", digits, **ON_CPU)
    posterior = fitted.guide.posterior(torch.as_tensor(digits[:30])).base_dist
    expected = torch.exp(-posterior.threshold / posterior.scale)
    np.testing.assert_allclose(fitted.spike_probabilities(digits[:30]), expected.detach().numpy(), rtol=1e-5)


@pytest.mark.parametrize("kl", [None, "exact", "augmented", "base"])
def test_z_kl_is_the_chosen_kl_weighted_by_beta(digits, kl):
    """``kl=None``: the default, the true KL of the thresholded laws."""
    fitted = pyro_sparse.train("tvsc", digits, beta=0.3, **({} if kl is None else {"kl": kl}), **ON_CPU)
    x = torch.as_tensor(digits[:10])
    torch.manual_seed(0)
    guide_trace = poutine.trace(fitted.guide).get_trace(x)
    model_trace = poutine.trace(poutine.replay(fitted.model, trace=guide_trace)).get_trace(x)
    q, p = guide_trace.nodes["z"]["fn"].base_dist, model_trace.nodes["z"]["fn"].base_dist
    exact = thresholded_laplace_kl(q, p)
    base = torch.distributions.kl_divergence(q.base_dist, p.base_dist)
    gates = torch.distributions.kl_divergence(Bernoulli(q.gate), Bernoulli(p.gate))
    expected = {None: exact, "exact": exact, "augmented": base + gates, "base": base}[kl].sum()
    # The paper's base KL ignores thresholds, so it comes with the prior's λ0 in q too.
    assert fitted.guide.amortized_threshold is (kl != "base")
    torch.manual_seed(0)
    loss = pyro.infer.TraceMeanField_ELBO().differentiable_loss(fitted.model, fitted.guide, x)
    loglik = model_trace.nodes["x"]["fn"].log_prob(x).sum()
    torch.testing.assert_close(loss, 0.3 * expected - loglik, rtol=1e-4, atol=1e-3)


def test_amortised_gate_starts_open_at_the_prior_scale(digits):
    guide = ThresholdedGuide(64, 8, hidden_dims=(16,), amortized_threshold=True, prior_scale=0.05)
    guide.input_affine.set(digits.mean(0), digits.std(0) + 1)
    posterior = guide.posterior(torch.as_tensor(digits[:200])).base_dist
    assert 0.8 < posterior.gate.mean() < 0.95  # sigmoid(2) = 0.88
    assert 0.03 < posterior.scale.median() < 0.08


@pytest.mark.parametrize("base", ["laplace", "gaussian"])
def test_the_scale_is_never_wider_than_the_bound(base):
    # A scale of 432 against the prior's 0.1 was seen on one 16x16 patch: draws of |z| ≈ 1e3, a loss of 1e9.
    guide = ThresholdedGuide(5, 3, hidden_dims=(4,), base=base, prior_scale=0.1)
    with torch.no_grad():
        last = [m for m in guide.encoder.modules() if isinstance(m, torch.nn.Linear)][-1]
        last.weight.zero_()
        last.bias.copy_(torch.tensor([0.0] * 3 + [8.0, -2.0, -3.0]))  # μ, log scale; the bound is log(0.1 e) = -1.3
    scale = guide.posterior(torch.randn(2, 5)).base_dist.scale.detach()
    torch.testing.assert_close(scale, torch.tensor([[0.1 * np.e, np.exp(-2.0), np.exp(-3.0)]] * 2).float())
    loose = ThresholdedGuide(5, 3, hidden_dims=(4,), base=base, prior_scale=0.1, max_scale_ratio=None)
    loose.load_state_dict(guide.state_dict())
    assert loose.posterior(torch.randn(2, 5)).base_dist.scale[:, 0].detach().allclose(torch.tensor(np.exp(8.0)).float())
    with pytest.raises(ValueError, match="max_scale_ratio"):
        ThresholdedGuide(5, 3, max_scale_ratio=0.0)


def test_files_from_before_the_scale_bound_and_shared_norms_load_as_trained(digits, tmp_path):
    fitted = pyro_sparse.train("tvsc", digits, decoder="linear", **QUICK)
    assert fitted.guide.max_scale_ratio == pytest.approx(np.e) and fitted.model.linear_generator.shared_atom_norm
    # An older file: trained with free atom norms and no scale bound, and naming neither option.
    old = pyro_sparse.train("tvsc", digits, decoder="linear", shared_atom_norm=False, max_scale_ratio=None, **QUICK)
    old.save(tmp_path / "model.pt")
    config, states = serialization.read(tmp_path / "model.pt")
    del config["hyperparameters"]["max_scale_ratio"], config["hyperparameters"]["shared_atom_norm"]
    serialization.write(tmp_path / "old.pt", config, states)
    loaded = pyro_sparse.load(tmp_path / "old.pt")
    assert loaded.guide.max_scale_ratio is None and loaded.guide.max_log_scale == 15.0
    assert not loaded.model.linear_generator.shared_atom_norm
    torch.testing.assert_close(loaded.guide.point_estimate("A"), old.guide.point_estimate("A"))
    np.testing.assert_array_equal(loaded.transform(digits[:20]), old.transform(digits[:20]))


def test_learned_threshold_has_the_gamma_prior_and_its_own_weight(digits):
    fitted = pyro_sparse.train("tvsc", digits, learn_threshold=True, threshold=0.4, threshold_beta=0.05, **ON_CPU)
    x = torch.as_tensor(digits[:4])
    guide_trace = poutine.trace(fitted.guide).get_trace(x)
    model_trace = poutine.trace(poutine.replay(fitted.model, trace=guide_trace)).get_trace(x)
    prior = model_trace.nodes["threshold"]["fn"].base_dist
    torch.testing.assert_close(prior.mean, torch.full_like(prior.mean, 0.4))  # Gamma(3, 3/λ0)
    assert prior.concentration.eq(3.0).all()
    assert guide_trace.nodes["threshold"]["scale"] == model_trace.nodes["threshold"]["scale"] == 0.05


def test_the_threshold_kl_weight_follows_beta_unless_given(digits, tmp_path):
    # Appendix D: β2 = β1 / 10. A fixed 0.1 was 100x that at beta = 1e-3 (and 10x the codes' own KL weight).
    fitted = pyro_sparse.train("tvsc", digits, learn_threshold=True, beta=1e-3, **ON_CPU)
    x = torch.as_tensor(digits[:4])
    guide_trace = poutine.trace(fitted.guide).get_trace(x)
    model_trace = poutine.trace(poutine.replay(fitted.model, trace=guide_trace)).get_trace(x)
    assert guide_trace.nodes["threshold"]["scale"] == model_trace.nodes["threshold"]["scale"] == pytest.approx(1e-4)
    # A file written when the default was a fixed 0.1 (it recorded only the options given) loads with 0.1.
    fitted.save(tmp_path / "model.pt")
    config, states = serialization.read(tmp_path / "model.pt")
    del config["hyperparameters"]["threshold_beta"]
    serialization.write(tmp_path / "old.pt", config, states)
    assert pyro_sparse.load(tmp_path / "old.pt").model.latent_prior.threshold_beta == 0.1
    assert pyro_sparse.load(tmp_path / "model.pt").model.latent_prior.threshold_beta is None


def test_bad_threshold_kl_weight_of_the_guide_is_named():
    # Used directly, the guide took a negative weight (a KL that rewards moving away from the prior).
    with pytest.raises(ValueError, match="threshold_kl_weight must be a positive number or None, got -1.0"):
        ThresholdedGuide(5, 3, learn_threshold=True, threshold_kl_weight=-1.0)
    assert ThresholdedGuide(5, 3, kl_weight=0.5, learn_threshold=True).threshold_kl_weight == 0.05


def test_laplace_scale_warmup():
    guide = ThresholdedGuide(5, 3, hidden_dims=(4,))
    guide.schedule(0.0, 0)
    assert guide.scale_warmup.item() == 1.0  # off by default
    guide = ThresholdedGuide(5, 3, hidden_dims=(4,), scale_warmup_start=0.1)
    for iteration, expected in [(0, 0.1), (1000, 0.3), (10_000, 1.0)]:
        guide.schedule(0.0, iteration)
        assert guide.scale_warmup.item() == pytest.approx(expected)
    gaussian = ThresholdedGuide(5, 3, hidden_dims=(4,), base="gaussian")
    gaussian.schedule(0.0, 0)
    assert gaussian.scale_warmup.item() == 1.0


def test_threshold_warmup_keeps_codes_dense_until_the_kl_warmup_ends():
    x = torch.randn(200, 5)
    guide = ThresholdedGuide(5, 3, hidden_dims=(4,), amortized_threshold=True, threshold_warmup_epochs=4)
    guide.check_schedule(kl_warmup_epochs=2, max_epochs=10)
    for epoch, omega in [(0.0, 1e-3), (2.0, 1e-3), (3.0, 0.25), (5.0, 0.75), (6.0, 1.0), (9.0, 1.0)]:
        guide.schedule(epoch, 0)
        assert guide.threshold_warmup == pytest.approx(omega)
    guide.schedule(1.0, 0)
    with torch.no_grad():
        held = guide._codes(*guide._encode(x)[:3]).rsample()
        assert held.ne(0).float().mean() > 0.97  # ω = 1e-3: on with probability > 0.98
        guide.eval()  # evaluation uses the full threshold whatever ω is
        dense = guide.posterior(x).base_dist
        torch.testing.assert_close(dense.threshold, guide._encode(x)[2])
    # None: the ramp lasts as long as the KL warm-up; a ramp that cannot end before max_epochs warns.
    guide = ThresholdedGuide(5, 3, hidden_dims=(4,), threshold_warmup_epochs=None)
    guide.check_schedule(kl_warmup_epochs=3, max_epochs=10)
    assert (guide.threshold_ramp_epochs, guide.threshold_warmup_epochs) == (3.0, None)  # the option stays as given
    with pytest.warns(UserWarning, match="threshold warm-up ends at epoch 12"):
        ThresholdedGuide(5, 3, hidden_dims=(4,), threshold_warmup_epochs=None).check_schedule(6, 10)
    with pytest.raises(ValueError, match="threshold_warmup_epochs"):
        ThresholdedGuide(5, 3, hidden_dims=(4,), threshold_warmup_epochs=-1)


def test_linear_decoder_is_a_dictionary_with_a_frobenius_prior(digits):
    fitted = pyro_sparse.train("tvsc", digits, decoder="linear", dictionary_penalty=0.01, **ON_CPU)
    A = fitted.guide.point_estimate("A").detach()
    assert A.shape == (64, 8)
    np.testing.assert_array_equal(fitted.dictionary_, A.numpy())  # the public view of it
    with pytest.raises(AttributeError, match="no linear dictionary .*decoder='linear'"):
        _ = pyro_sparse.train("tvsc", digits, latent_dim=2, hidden_dims=(4,), max_epochs=1, progress=False).dictionary_
    x = torch.as_tensor(digits[:5])
    codes = torch.as_tensor(fitted.transform(digits[:5]), dtype=torch.float32)
    torch.testing.assert_close(fitted.model.generator_output(codes, A), codes @ A.T)
    trace = poutine.trace(fitted.model).get_trace(x, 500)
    # Eq. 11's κ‖A‖² per data point: log prior = -N κ ‖A‖² + const over N = 500 points
    a1, a2 = torch.zeros(64, 8), torch.ones(64, 8)
    prior = trace.nodes["A"]["fn"]
    torch.testing.assert_close(prior.log_prob(a2) - prior.log_prob(a1), torch.tensor(-500 * 0.01 * 64 * 8))


def test_linear_dictionary_with_vectorised_particles(digits):
    max_of_three = Optimization(num_particles=3, particle_reduction="max")
    fitted = pyro_sparse.train("tvsc", digits, decoder="linear", optimization=max_of_three, **QUICK)
    assert np.isfinite(fitted.history_["train_loss"]).all()
    x = torch.as_tensor(digits[:5])
    trace = poutine.trace(pyro.plate("particles", 3, dim=-2)(fitted.model)).get_trace(x)
    assert trace.nodes["A"]["value"].shape == (3, 1, 64, 8)
    assert trace.nodes["x"]["fn"].batch_shape == (3, 5)
    A = torch.randn(3, 1, 64, 8)
    z = torch.randn(3, 5, 8)
    expected = torch.einsum("jgk,jbk->jbg", A[:, 0], z)
    torch.testing.assert_close(fitted.model.generator_output(z, A), expected)


def test_bad_tvsc_settings_are_named(digits):
    for options, message in [
        (dict(latent_prior="thresholded_cauchy"), "latent_prior"),
        (dict(decoder="conv"), "28x28 images"),
        (dict(decoder="transformer"), "decoder"),
        (dict(threshold=0.0), "threshold"),
        (dict(threshold=float("nan")), "threshold"),
        (dict(prior_scale=-0.1), "prior_scale"),
        (dict(learn_threshold=True, threshold_concentration=0.0), "threshold_concentration"),
        (dict(learn_threshold=True, threshold_beta=-1.0), "threshold_beta"),
        (dict(latent_prior="thresholded_normal", kl="augmented"), "kl"),
        (dict(kl="base", amortized_threshold=True), "amortised threshold"),
        (dict(learn_threshold=True, amortized_threshold=True), "exclude each other"),
        (dict(estimator="gumbel"), "estimator"),
    ]:
        quick = {key: value for key, value in QUICK.items() if options.get("decoder") != "conv" or key != "hidden_dims"}
        with pytest.raises(ValueError, match=message):
            pyro_sparse.train("tvsc", digits, **quick, **options)


def test_conv_networks_of_table_5_on_28x28_images():
    X = np.random.default_rng(0).random((64, 784)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    max_of_two = Optimization(num_particles=2, particle_reduction="max")
    conv = {key: value for key, value in QUICK.items() if key != "hidden_dims"}  # the conv networks' own layers
    fitted = pyro_sparse.train("tvsc", X, decoder="conv", optimization=max_of_two, **conv)
    assert np.isfinite(fitted.history_["train_loss"]).all()
    assert type(fitted.guide.encoder).__name__ == "ConvEncoder28"
    assert fitted.reconstruct(X[:5]).shape == (5, 784)
    assert fitted.transform(X[:5]).shape == (5, 8)


@pytest.mark.parametrize("prior, family", [("thresholded_laplace", "Laplace"), ("thresholded_normal", "Normal")])
def test_no_threshold_gives_the_plain_base_priors(digits, prior, family):
    fitted = pyro_sparse.train("tvsc", digits, latent_prior=prior, threshold=None, **ON_CPU)
    posterior = fitted.guide.posterior(torch.as_tensor(digits[:5])).base_dist
    assert type(posterior).__name__ == family
    assert (fitted.transform(digits[:5]) != 0).all()  # dense codes
    assert np.isfinite(fitted.heldout_log_likelihood(digits[:10], 4)).all()
    with pytest.raises(ValueError, match="learn_threshold"):
        pyro_sparse.train("tvsc", digits, threshold=None, learn_threshold=True, **QUICK)


def test_dictionary_larger_than_the_data_warns(digits):
    with pytest.warns(UserWarning, match="larger than the 50 training points"):
        pyro_sparse.train("tvsc", digits[:50], decoder="linear", **{**QUICK, "latent_dim": 64})


def test_shared_atom_norm_keeps_the_atoms_at_one_learned_norm(digits):
    shared = pyro_sparse.train("tvsc", digits, decoder="linear", **QUICK)  # the default
    norms = shared.guide.point_estimate("A").detach().norm(dim=0)
    torch.testing.assert_close(norms, norms.mean().expand_as(norms), rtol=1e-5, atol=0)
    initial = shared.model.linear_generator.point_estimate_sites()["A"][0].norm(dim=0)
    assert abs(norms.mean() - initial.mean()) > 1e-3  # the common norm is learned
    free = pyro_sparse.train("tvsc", digits, decoder="linear", shared_atom_norm=False, **QUICK)
    free = free.guide.point_estimate("A").detach()
    assert free.norm(dim=0).std() > 1e-3


def test_bad_patches_are_named(digits):
    bad = digits.copy()
    bad[3, 5] = np.nan
    with pytest.raises(DataError, match="NaN or infinite"):
        pyro_sparse.train("tvsc", bad, decoder="linear", **QUICK)
    fitted = pyro_sparse.train("tvsc", digits, decoder="linear", **QUICK)
    with pytest.raises(DataError, match="49 features but the model was trained on 64"):
        fitted.transform(digits[:, :49])  # 7x7 patches for an 8x8 dictionary


@pytest.mark.parametrize("options, refused", [
    ({"threshold_beta": 0.5}, "threshold_beta=0.5 acts only with learn_threshold"),
    ({"threshold_concentration": 5.0}, "threshold_concentration=5.0 acts only with learn_threshold in \\[True\\] or "
                                       "learn_prior_threshold in \\[True, None\\]; this run has learn_threshold=False, "
                                       "learn_prior_threshold=False"),
    ({"threshold": None, "amortized_threshold": True}, "amortized_threshold=True acts only with threshold given"),
    ({"threshold": None, "kl": "augmented"}, "kl='augmented' acts only with threshold given"),
    ({"threshold": None, "estimator": "straight_through"}, "estimator='straight_through' acts only with threshold"),
    ({"threshold": None, "threshold_warmup_epochs": 2}, "threshold_warmup_epochs=2 acts only with threshold given"),
])
def test_threshold_options_that_would_be_ignored_are_refused(options, refused):
    X = np.random.default_rng(0).normal(size=(40, 6)).astype(np.float32)
    with pytest.raises(ValueError, match=refused):
        pyro_sparse.train("tvsc", X, latent_dim=2, hidden_dims=(8,), max_epochs=1, progress=False, **options)
