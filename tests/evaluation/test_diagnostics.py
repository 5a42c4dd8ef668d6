"""ArviZ export and posterior checks on small models fitted to data with known structure."""

import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine

import pyro_sparse
from pyro_sparse.data import DataError

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)  # arviz 0.x announces its 1.0 refactor on import
    import arviz as az
    import xarray as xr

    from pyro_sparse.evaluation import diagnostics
    from pyro_sparse.evaluation.diagnostics import (
        ARVIZ_DATATREE,
        pareto_khat,
        predictive_checks,
        to_arviz,
    )

GROUPS = {"posterior", "posterior_predictive", "log_likelihood", "observed_data"}


def fit(model, X, likelihood="gaussian", epochs=40, **hyper):
    return pyro_sparse.train(
        model, X, latent_dim=hyper.pop("latent_dim", 1), likelihood=likelihood, max_epochs=epochs,
        batch_size=50, lr=0.03, seed=0, progress=False, device="cpu", **hyper,
    )


@pytest.fixture(scope="module")
def ppca_data():
    # Probabilistic PCA: x = 2 w z + noise.  With linear networks (hidden_dims=())
    # the VAE is this model and its exact posterior is Gaussian, inside q's family.
    rng = np.random.default_rng(0)
    z = rng.normal(size=(200, 1))
    return (2 * z @ rng.normal(size=(1, 5)) + 0.5 * rng.normal(size=(200, 5))).astype(np.float32)


@pytest.fixture(scope="module")
def ppca(ppca_data):
    return fit("vae", ppca_data, epochs=50, hidden_dims=())


@pytest.fixture(scope="module")
def binary_data():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(200, 1))
    logits = 2 * z @ rng.normal(size=(1, 6)) - 1.5
    return (rng.random((200, 6)) < 1 / (1 + np.exp(-logits))).astype(np.float32)


@pytest.fixture(scope="module")
def sparse_vae(ppca_data):
    return fit("ssl_dgm", ppca_data, epochs=10, latent_dim=3, hidden_dims=(8,))


def groups_of(data):
    return set(data.children) if ARVIZ_DATATREE else set(data.groups())


@torch.no_grad()
def model_log_likelihood(fitted, X, data, draw):
    """log p(x_i | z_i, globals) from the model conditioned on one draw of the posterior group."""
    values = {name: torch.as_tensor(data["posterior"][name].values[0, draw]) for name in data["posterior"].data_vars}
    trace = poutine.trace(poutine.condition(fitted.model, data=values)).get_trace(torch.as_tensor(X))
    return trace.nodes["x"]["fn"].log_prob(torch.as_tensor(X)).numpy()


def test_groups_dims_and_coords(sparse_vae, ppca_data):
    names = [f"gene{j}" for j in range(5)]
    data = sparse_vae.to_arviz(ppca_data[:30], num_samples=7, feature_names=names)
    assert isinstance(data, xr.DataTree if ARVIZ_DATATREE else az.InferenceData)
    assert groups_of(data) == GROUPS
    posterior = data["posterior"]
    assert set(posterior.data_vars) == {"z", "W", "sigma2"}
    assert posterior["z"].dims == ("chain", "draw", "data_point", "latent")
    assert posterior["z"].shape == (1, 7, 30, 3)
    assert posterior["W"].dims == ("chain", "draw", "feature", "latent")
    assert posterior["sigma2"].dims == ("chain", "draw", "feature")
    for group in ("posterior_predictive", "log_likelihood"):
        assert data[group]["x"].dims == ("chain", "draw", "data_point", "feature")
        assert data[group]["x"].shape == (1, 7, 30, 5)
    assert data["observed_data"]["x"].dims == ("data_point", "feature")
    np.testing.assert_array_equal(data["observed_data"]["x"].values, ppca_data[:30])
    assert list(data["observed_data"]["feature"].values) == names
    np.testing.assert_array_equal(posterior["data_point"].values, np.arange(30))
    np.testing.assert_array_equal(posterior["latent"].values, np.arange(3))
    # W is point-estimated (a Delta guide): every draw holds the MAP value.
    np.testing.assert_array_equal(posterior["W"].values[0], np.broadcast_to(sparse_vae.W_, (7, 5, 3)))
    assert posterior.attrs["point_estimates"] == "W sigma2"
    assert "R-hat" in posterior.attrs["draws"]


def test_log_likelihood_sums_over_features_to_the_models(sparse_vae, ppca_data):
    X = ppca_data[:40]
    data = to_arviz(sparse_vae, X, num_samples=3)
    summed = data["log_likelihood"]["x"].sum("feature").values[0]
    for draw in range(3):
        np.testing.assert_allclose(summed[draw], model_log_likelihood(sparse_vae, X, data, draw), rtol=1e-5, atol=1e-4)


def test_posterior_predictive_reproduces_the_data_moments(ppca, ppca_data):
    pyro.set_rng_seed(0)
    checks = predictive_checks(to_arviz(ppca, ppca_data, num_samples=100))
    assert checks["p_value"].dims == ("statistic", "feature")
    assert list(checks["statistic"].values) == ["mean", "variance", "zero_fraction"]
    mean, variance = checks.sel(statistic="mean"), checks.sel(statistic="variance")
    scale = np.sqrt(variance["observed"])
    assert (abs(mean["replicated_mean"] - mean["observed"]) < 0.1 * scale).all()
    np.testing.assert_allclose(variance["replicated_mean"], variance["observed"], rtol=0.15)
    assert ((mean["p_value"] > 0.005) & (mean["p_value"] < 0.995)).all()
    # Gaussian data have no exact zeros and neither have the replicates: no evidence either way.
    np.testing.assert_array_equal(checks.sel(statistic="zero_fraction")["p_value"], 0.5)


def test_posterior_predictive_check_fails_for_data_the_model_does_not_describe(ppca, ppca_data):
    # Shifted means, and noise of variance 9 where the model's noise variance is about 0.25.
    noise = np.random.default_rng(3).normal(scale=3.0, size=ppca_data.shape)
    wrong = (ppca_data + 3 + noise).astype(np.float32)
    pyro.set_rng_seed(0)
    checks = predictive_checks(to_arviz(ppca, wrong, num_samples=50))
    for statistic in ("mean", "variance"):
        p_value = checks.sel(statistic=statistic)["p_value"]
        assert ((p_value < 0.01) | (p_value > 0.99)).all()


def test_zero_fraction_check_tells_a_gaussian_from_a_bernoulli_fit(binary_data):
    pyro.set_rng_seed(0)
    bernoulli = predictive_checks(to_arviz(fit("vae", binary_data, "bernoulli", hidden_dims=(8,)), binary_data))
    gaussian = predictive_checks(to_arviz(fit("vae", binary_data, "gaussian", hidden_dims=(8,)), binary_data))
    zeros = bernoulli.sel(statistic="zero_fraction")
    assert (zeros["observed"] > 0.4).all()
    np.testing.assert_allclose(zeros["replicated_mean"], zeros["observed"], atol=0.05)
    assert ((zeros["p_value"] > 0.005) & (zeros["p_value"] < 0.995)).all()
    # A Gaussian never draws an exact 0.
    np.testing.assert_array_equal(gaussian.sel(statistic="zero_fraction")["p_value"], 0.0)


def test_bernoulli_data_are_integers_and_log_likelihood_is_elementwise(binary_data):
    fitted = fit("vae", binary_data, "bernoulli", epochs=2, hidden_dims=(8,))
    data = to_arviz(fitted, binary_data[:20], num_samples=2)
    assert data["observed_data"]["x"].dtype == np.int64
    assert set(np.unique(data["posterior_predictive"]["x"].values)) <= {0, 1}
    np.testing.assert_allclose(
        data["log_likelihood"]["x"].sum("feature").values[0, 1],
        model_log_likelihood(fitted, binary_data[:20], data, 1),
        rtol=1e-5,
    )


def test_multinomial_keeps_row_totals_and_gives_one_log_likelihood_per_point():
    counts = np.random.default_rng(2).poisson(3.0, size=(30, 8)).astype(np.float32)
    counts[:, 0] += 1  # no empty rows
    fitted = fit("vae", counts, "multinomial", epochs=2, hidden_dims=(8,))
    data = to_arviz(fitted, counts, num_samples=4)
    replicated = data["posterior_predictive"]["x"]
    np.testing.assert_array_equal(replicated.sum("feature").values, np.broadcast_to(counts.sum(1), (1, 4, 30)))
    assert data["log_likelihood"]["x"].dims == ("chain", "draw", "data_point")
    np.testing.assert_allclose(
        data["log_likelihood"]["x"].values[0, 2], model_log_likelihood(fitted, counts, data, 2), rtol=1e-5
    )


def test_replicated_counts_are_multinomial():
    torch.manual_seed(0)
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]]).repeat(2000, 1)
    totals = torch.tensor([10.0, 3.0]).repeat(2000)
    draws = diagnostics._replicate_counts(probs, totals)
    np.testing.assert_array_equal(draws.sum(-1), totals)
    for row in range(2):
        expected = dist.Multinomial(int(totals[row]), probs[row])
        np.testing.assert_allclose(draws[row::2].mean(0), expected.mean, atol=0.06)
        np.testing.assert_allclose(draws[row::2].var(0), expected.variance, rtol=0.1)


def test_spike_and_slab_codes_are_exact_draws(ppca_data):
    fitted = fit("vsc", ppca_data, epochs=2, latent_dim=4, hidden_dims=(8,), alpha=0.3)
    X = ppca_data[:50]
    pyro.set_rng_seed(0)
    data = to_arviz(fitted, X, num_samples=200)
    zeros = (data["posterior"]["z"].values[0] == 0).mean(0)
    # P(z_ij = 0) = 1 - γ_ij: a relaxed draw would never be exactly 0.
    np.testing.assert_allclose(zeros.mean(), 1 - fitted.spike_probabilities(X).mean(), atol=0.02)


def test_pareto_khat_is_low_for_a_good_posterior_and_high_for_a_too_narrow_one(ppca, ppca_data, monkeypatch):
    pyro.set_rng_seed(0)
    khat = pareto_khat(ppca, ppca_data, num_samples=300)
    assert khat.shape == (200,)
    # k̂ is itself an estimate from 300 draws: a few of 200 points may cross 0.7 by chance.
    assert np.median(khat) < 0.4
    assert (khat > 0.7).mean() <= 0.02
    fitted_posterior = ppca.guide.posterior

    def too_narrow(x, covariates=None):
        q = fitted_posterior(x, covariates).base_dist
        return dist.Normal(q.loc, q.scale / 5).to_event(1)

    monkeypatch.setattr(ppca.guide, "posterior", too_narrow)
    pyro.set_rng_seed(0)
    assert np.median(pareto_khat(ppca, ppca_data[:30], num_samples=1000)) > 0.7


def test_loo_pit_runs_on_the_elementwise_log_likelihood(ppca, ppca_data):
    data = to_arviz(ppca, ppca_data[:40], num_samples=40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pareto k warnings of LOO with 40 draws
        pit = az.loo_pit(data) if ARVIZ_DATATREE else az.loo_pit(data, y="x")
    values = np.asarray(pit["x"] if ARVIZ_DATATREE else pit)
    assert values.shape == (40, 5)
    assert ((values >= 0) & (values <= 1)).all()


def test_bad_arguments_are_named(ppca, ppca_data):
    with pytest.raises(ValueError, match="num_samples"):
        to_arviz(ppca, ppca_data, num_samples=0)
    with pytest.raises(ValueError, match="num_samples"):
        pareto_khat(ppca, ppca_data, num_samples=2.5)
    with pytest.raises(ValueError, match="num_samples=20 draws are too few for PSIS"):  # gave k̂ = inf everywhere
        pareto_khat(ppca, ppca_data, num_samples=20)
    with pytest.raises(ValueError, match="feature_names"):
        to_arviz(ppca, ppca_data, feature_names=["a"])
    with pytest.raises(DataError, match="features"):
        to_arviz(ppca, ppca_data[:, :3])
    with pytest.raises(ValueError, match="unknown statistics"):
        predictive_checks(to_arviz(ppca, ppca_data[:5], num_samples=2), statistics=["skewness"])


def test_psis_khat_recovers_the_tail_index_of_pareto_ratios():
    # Ratios r ~ Pareto(α) have a tail of shape k = 1/α.
    rng = np.random.default_rng(4)
    for alpha in (5.0, 1.25):
        log_ratios = np.log(rng.pareto(alpha, size=(20, 4000)) + 1)
        np.testing.assert_allclose(diagnostics._psis_khat(log_ratios).mean(), 1 / alpha, atol=0.06)


def test_khat_is_nan_where_the_largest_ratios_are_an_atom_of_q():
    # An atom of q (all spike-and-slab codes 0) repeats the largest ratio: ArviZ's fit finds < 5 ratios above
    # its cut-off and says inf ("q fails badly") although the ratios are bounded.  Continuous heavy tails keep k̂.
    from pyro_sparse.evaluation.diagnostics import _psis_khat

    rng = np.random.default_rng(0)
    heavy = np.log(rng.pareto(1.0 / 0.7, size=(10, 2000)) + 1.0)  # Pareto ratios, k = 0.7
    tied = rng.normal(size=(2, 500))
    tied[:, :150] = tied.max() + 1.0  # 150 draws share the largest ratio (tail of 67)
    khat = _psis_khat(heavy)
    assert not np.any(np.isnan(khat)) and abs(khat.mean() - 0.7) < 0.1
    assert np.all(np.isnan(_psis_khat(tied)))


def test_global_sites_are_named_by_shape_only_where_the_shape_is_unambiguous():
    from pyro_sparse.evaluation.diagnostics import _global_dims

    assert _global_dims("prior_threshold", (3,), 4, 3) == ["latent"]
    assert _global_dims("sigma2", (4,), 4, 3) == ["feature"]
    assert _global_dims("W", (4, 3), 4, 3) == ["feature", "latent"]
    # K = G: a (3,) site may be per code or per feature; it is not given the feature names.
    assert _global_dims("prior_threshold", (3,), 3, 3) == ["prior_threshold_dim_0"]


def test_feature_names_cannot_relabel_the_trained_features(ppca, ppca_data):
    trained = ppca.config.get("feature_names")
    names = [f"g{j}" for j in range(ppca_data.shape[1])]
    if trained is None:  # a model trained without names takes any labels
        assert list(to_arviz(ppca, ppca_data[:5], num_samples=2, feature_names=names)["observed_data"]["feature"].values) == names
    frame = pytest.importorskip("pandas").DataFrame(ppca_data, columns=names)
    named = pyro_sparse.train("vae", frame, latent_dim=2, hidden_dims=(8,), max_epochs=1, progress=False)
    with pytest.raises(ValueError, match="differ from the names the model was trained with"):
        to_arviz(named, frame[:5], num_samples=2, feature_names=names[::-1])


def test_data_points_are_named_by_the_cells_or_the_frame_index(ppca_data):
    pandas = pytest.importorskip("pandas")
    anndata = pytest.importorskip("anndata")
    names = [f"g{j}" for j in range(ppca_data.shape[1])]
    frame = pandas.DataFrame(ppca_data[:6], columns=names, index=[f"cell{i}" for i in range(6)])
    fitted = pyro_sparse.train("vae", frame, latent_dim=2, hidden_dims=(8,), max_epochs=1, batch_size=6,
                               progress=False)
    assert list(to_arviz(fitted, frame, num_samples=2)["observed_data"]["data_point"].values) == list(frame.index)
    cells = anndata.AnnData(frame.to_numpy(), obs=pandas.DataFrame(index=frame.index.str.upper()),
                            var=pandas.DataFrame(index=names))
    data = to_arviz(fitted, cells, num_samples=2)
    assert list(data["posterior"]["data_point"].values) == list(cells.obs_names)
    unnamed = to_arviz(fitted, frame.to_numpy(), num_samples=2)
    assert list(unnamed["observed_data"]["data_point"].values) == list(range(6))
