"""Feature subsampling in the sparse DGM: unbiased likelihood and gradients at a fraction of the decoder's cost."""

import warnings

import numpy as np
import pyro
import pytest
import torch
from pyro import poutine

import pyro_sparse
from pyro_sparse import Schedule, evaluation
from pyro_sparse.data.synthetic import synthetic_sparse_dgm
from pyro_sparse.models import SparseDGM

NUM_FEATURES, SUBSET, LATENT, BATCH = 12, 3, 3, 6


def small_model(likelihood, subset=SUBSET):
    pyro.set_rng_seed(0)
    model = SparseDGM(NUM_FEATURES, LATENT, likelihood, hidden_dims=(8, 8), feature_subsample_size=subset)
    values = {
        "W": torch.randn(NUM_FEATURES, LATENT),
        "z": torch.randn(BATCH, LATENT),
        "sigma2": torch.rand(NUM_FEATURES) + 0.5,
    }
    x = torch.randn(BATCH, NUM_FEATURES) if likelihood == "gaussian" else torch.randint(0, 2, (BATCH, NUM_FEATURES))
    return model, values, x.float()


def log_likelihood_and_gradients(model, values, x):
    """The (scaled) log-likelihood site of one pass, and its gradients w.r.t. W and the decoder's parameters."""
    W = values["W"].clone().requires_grad_()
    conditioned = poutine.condition(model, data={**values, "W": W})
    trace = poutine.trace(conditioned).get_trace(x)
    trace.compute_log_prob()
    log_likelihood = trace.nodes["x"]["log_prob_sum"]
    inputs = [W, model.decoder.first_weight, model.decoder.out_weight]
    gradients = torch.autograd.grad(log_likelihood, inputs)
    return log_likelihood.detach(), torch.cat([g.flatten() for g in gradients])


@pytest.mark.parametrize("likelihood", ["gaussian", "bernoulli"])
def test_subsampled_likelihood_and_gradients_are_unbiased(likelihood):
    model, values, x = small_model(likelihood)
    model.eval()
    full_value, full_gradient = log_likelihood_and_gradients(model, values, x)
    model.train()
    draws = [log_likelihood_and_gradients(model, values, x) for _ in range(1000)]
    estimates = torch.stack([d[0] for d in draws])
    gradients = torch.stack([d[1] for d in draws])
    # Subsets differ, so the estimates are random; their mean is the full value.
    assert estimates.std() > 1e-3 * full_value.abs()
    standard_error = estimates.std() / len(draws) ** 0.5
    assert (estimates.mean() - full_value).abs() < 5 * standard_error
    gradient_error = gradients.std(0) / len(draws) ** 0.5
    assert ((gradients.mean(0) - full_gradient).abs() <= 5 * gradient_error + 1e-5).all()
    # Without the G/|S| scale the mean would be |S|/G of the full value: far outside the tolerance.
    assert (full_value * SUBSET / NUM_FEATURES - full_value).abs() > 20 * standard_error


def test_only_subsampled_features_are_decoded():
    model, values, x = small_model("gaussian")
    decoded = []
    decode_block = model.decoder._decode_block

    def counting_decode_block(z, mask, *args):
        decoded.append(mask.shape[0])
        return decode_block(z, mask, *args)

    model.decoder._decode_block = counting_decode_block
    trace = poutine.trace(poutine.condition(model, data=values)).get_trace(x)
    assert sum(decoded) == SUBSET
    assert trace.nodes["x"]["value"].shape == (BATCH, SUBSET)
    assert trace.nodes["x"]["scale"] == NUM_FEATURES / SUBSET
    # The global priors count once, unscaled.
    assert trace.nodes["W"]["scale"] == 1.0 and trace.nodes["sigma2"]["scale"] == 1.0

    decoded.clear()
    model.eval()
    trace = poutine.trace(poutine.condition(model, data=values)).get_trace(x)
    assert sum(decoded) == NUM_FEATURES
    assert torch.equal(trace.nodes["x"]["value"], x) and trace.nodes["x"]["scale"] == 1.0


def test_subsampled_decoder_matches_full_decoder_columns():
    model, values, _ = small_model("gaussian")
    model.decoder.output_affine.set(torch.randn(NUM_FEATURES), torch.rand(NUM_FEATURES) + 0.5)
    features = torch.tensor([7, 2, 11])
    full = model.decoder(values["z"], values["W"])
    # Chunked with checkpointing (a budget of one feature per chunk) as well as in one piece.
    model.decoder.memory_budget_bytes = 1
    assert torch.allclose(model.decoder(values["z"], values["W"], features), full[:, features], atol=1e-6)


def test_subsampling_starts_at_the_scheduled_epoch():
    pyro.set_rng_seed(0)
    model = SparseDGM(NUM_FEATURES, LATENT, hidden_dims=(8, 8), feature_subsample_size=SUBSET,
                      feature_subsample_start_epoch=1.5)
    _, values, x = small_model("gaussian")
    for epoch, visited in [(0.0, NUM_FEATURES), (1.49, NUM_FEATURES), (1.5, SUBSET), (3.0, SUBSET)]:
        model.schedule(epoch, iteration=0)
        trace = poutine.trace(poutine.condition(model, data=values)).get_trace(x)
        assert trace.nodes["x"]["value"].shape[-1] == visited
        assert trace.nodes["x"]["scale"] == NUM_FEATURES / visited


def features_per_training_pass(monkeypatch, **options):
    """How many features each training pass of a small ``train`` run decodes (batches of 100 of 200 points)."""
    visited = []
    original = SparseDGM.visited_features

    def recording(self, device):
        features = original(self, device)
        if self.training:
            visited.append(self.num_features if features is None else len(features))
        return features

    monkeypatch.setattr(SparseDGM, "visited_features", recording)
    train = synthetic_sparse_dgm(n=200, rho=0.0, seed=0)
    pyro_sparse.train("ssl_dgm", train.X, latent_dim=3, batch_size=100, progress=False, feature_subsample_size=4,
                      feature_subsample_start_epoch=1, **options)
    return visited


def test_training_schedules_the_subsampling_start(monkeypatch):
    # Through train(): the loop calls schedule() before each step, so the
    # first epoch decodes every feature and the second only the subset.
    visited = features_per_training_pass(monkeypatch, max_epochs=2)
    # Two steps per epoch; before them, train() traces the model once to report its KL terms.
    assert visited[-4:] == [7, 7, 4, 4] and len(visited) <= 5


def test_the_last_fraction_of_the_epochs_decodes_every_feature_again(monkeypatch):
    visited = features_per_training_pass(monkeypatch, max_epochs=4, feature_subsample_end_fraction=0.25)
    # Epoch 0 on every feature, epochs 1-2 on 4 of them, the last quarter (epoch 3) on every feature again.
    assert visited[-8:] == [7, 7, 4, 4, 4, 4, 7, 7]


def test_counts_of_many_genes_subsample_with_a_full_finish():
    from pyro_sparse.data import DataSummary

    summary = DataSummary(100, 300, np.ones(300), np.ones(300))
    assert SparseDGM.data_defaults(summary, "negative_binomial", {}) == {
        "feature_subsample_size": 128, "feature_subsample_end_fraction": 0.1}
    # A user's own subsampling keeps the user's (default: subsample to the end).
    assert SparseDGM.data_defaults(summary, "negative_binomial", {"feature_subsample_size": 50}) == {
        "feature_subsample_size": 50}


@pytest.mark.parametrize("fraction, size, message", [(1.0, SUBSET, r"in \[0, 1\)"), (-0.1, SUBSET, r"in \[0, 1\)"),
                                                     (0.1, None, "needs feature_subsample_size")])
def test_bad_subsample_end_fraction_is_refused(fraction, size, message):
    with pytest.raises(ValueError, match=message):
        SparseDGM(NUM_FEATURES, feature_subsample_size=size, feature_subsample_end_fraction=fraction)


@pytest.mark.parametrize("start, warns", [(0, True), (1.5, True), (2, False)])
def test_subsampling_before_the_kl_warmup_ends_warns(start, warns):
    train = synthetic_sparse_dgm(n=100, rho=0.0, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pyro_sparse.train("ssl_dgm", train.X, latent_dim=3, max_epochs=1, schedule=Schedule(kl_warmup_epochs=2),
                          progress=False, feature_subsample_size=4, feature_subsample_start_epoch=start)
    early = [w for w in caught if "before the KL warm-up ends" in str(w.message)]
    assert len(early) == int(warns)


@pytest.mark.parametrize("start, size, message", [(-1, SUBSET, ">= 0"), (2, None, "needs feature_subsample_size")])
def test_bad_subsample_start_is_refused(start, size, message):
    with pytest.raises(ValueError, match=message):
        SparseDGM(NUM_FEATURES, feature_subsample_size=size, feature_subsample_start_epoch=start)


def test_subsample_size_of_all_features_is_no_subsampling():
    assert SparseDGM(NUM_FEATURES, feature_subsample_size=NUM_FEATURES).feature_subsample_size is None


@pytest.mark.parametrize("size", [0, NUM_FEATURES + 1, 2.5, True])
def test_bad_subsample_size_is_refused(size):
    with pytest.raises(ValueError, match="feature_subsample_size must be an integer"):
        SparseDGM(NUM_FEATURES, feature_subsample_size=size)


def test_multinomial_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="softmax normaliser"):
        SparseDGM(NUM_FEATURES, likelihood="multinomial", feature_subsample_size=SUBSET)


def fit_synthetic(feature_subsample_size, max_epochs):
    train = synthetic_sparse_dgm(n=1000, rho=0.0, seed=0)
    test = synthetic_sparse_dgm(n=1000, rho=0.0, seed=1)
    fitted = pyro_sparse.train(
        "ssl_dgm", train.X, latent_dim=5, max_epochs=max_epochs, batch_size=100, lr=0.01, seed=0,
        progress=False, feature_subsample_size=feature_subsample_size,
    )
    z = fitted.transform(test.X)
    matching = evaluation.match_factors(z, test.z)
    score = evaluation.support_f_score(fitted.support_, test.support, matching)
    return fitted, test, score


def test_training_with_subsampling_evaluates_all_features():
    fitted, test, _ = fit_synthetic(4, max_epochs=3)
    assert fitted.reconstruct(test.X[:10]).shape == (10, 7)
    assert np.isfinite(fitted.heldout_log_likelihood(test.X[:10])).all()


@pytest.mark.slow
def test_subsampling_recovers_the_support_like_full_training():
    # The paper's synthetic data (Eq. 9) at its Table 6 settings, 4 of 7 features per step.
    _, _, full_score = fit_synthetic(None, max_epochs=200)
    fitted, _, score = fit_synthetic(4, max_epochs=200)
    assert score >= 0.75 and score >= full_score - 0.1, (score, full_score)
    # The 3 extraneous columns are switched off (with subsampling a dead column
    # may keep an entry of |w| ~ 0.01-0.02 after 200 epochs: noisier steps converge more slowly).
    assert (np.abs(fitted.W_) < 0.05).all(axis=0).sum() == 3, fitted.W_


def test_a_prior_given_to_two_models_averages_its_gradients_over_the_same_steps():
    # The zero test averages over G/|S| times more steps; a prior instance used again is not scaled again.
    from pyro_sparse.priors import SpikeSlabLassoPrior

    prior = SpikeSlabLassoPrior(NUM_FEATURES, LATENT, gradient_averaging=0.01)
    for _ in range(2):
        SparseDGM(NUM_FEATURES, LATENT, "gaussian", hidden_dims=(8,), mask_prior=prior, feature_subsample_size=SUBSET)
        assert prior.gradient_averaging * prior.gradient_averaging_scale == pytest.approx(0.01 * SUBSET / NUM_FEATURES)


def test_the_particles_of_a_step_share_one_feature_subset():
    # MaxParticleELBO keeps each point's best of J passes: passes on different subsets would be ranked by how
    # well their subsets happen to fit (on a 100 x 300 count batch the loss fell 4,900 nats below the full-feature value).
    from pyro_sparse.infer.elbo import MaxParticleELBO

    model, values, x = small_model("gaussian")

    def visited():
        trace = poutine.trace(poutine.condition(model, data=values)).get_trace(x)
        return trace.nodes["x"]["value"]

    model.schedule(1.0, iteration=0)
    first = visited()
    assert all(torch.equal(visited(), first) for _ in range(5))
    steps = []
    for step in range(1, 6):
        model.schedule(1.0, iteration=step)
        steps.append(visited())
    assert any(not torch.equal(features, first) for features in steps)

    guide = pyro.infer.autoguide.AutoNormal(poutine.block(model, hide=["W", "sigma2"]))
    conditioned = poutine.condition(model, data={"W": values["W"], "sigma2": values["sigma2"]})
    elbo = MaxParticleELBO(num_particles=8, particle_reduction="max", vectorize_particles=False)

    def mean_loss(subsampling):
        model.train(subsampling)
        losses = []
        for step in range(300):
            model.schedule(1.0, iteration=step)
            losses.append(elbo.loss(conditioned, guide, x))
        return np.mean(losses), np.std(losses) / len(losses) ** 0.5

    full, _ = mean_loss(False)
    subsampled, standard_error = mean_loss(True)
    assert abs(subsampled - full) < 5 * standard_error  # with a subset per pass: 26 nats below, 100 s.e.
