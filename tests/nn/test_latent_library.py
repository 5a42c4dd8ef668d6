"""library="latent": each cell's library size a local latent site, log ℓ ~ N(m_b, s_b²) per batch, as scVI's
use_observed_lib_size=False; its prior is fitted and its posterior recovers the cells' log totals."""

import anndata
import numpy as np
import pandas as pd
import pytest
import torch
from pyro import poutine

import pyro_sparse
from pyro_sparse.data.synthetic import synthetic_gene_set_counts
from pyro_sparse.io.anndata import setup_anndata
from pyro_sparse.plates import in_data_plate

QUICK = dict(likelihood="negative_binomial", library="latent", latent_dim=4, progress=False, device="cpu", seed=0)


@pytest.fixture(scope="module")
def data():
    return synthetic_gene_set_counts(n=1000, num_genes=100, num_sets=3, set_size=10, seed=0)


@pytest.mark.parametrize("model", ["ssl_dgm", "vae"])
def test_the_library_is_recovered(data, model):
    fitted = pyro_sparse.train(model, data.X, max_epochs=15, **QUICK)
    log_total = np.log(data.X.sum(1))
    posterior = fitted.guide.library_posterior(torch.as_tensor(data.X)).loc.detach().numpy()
    assert np.corrcoef(posterior, log_total)[0, 1] > 0.95
    np.testing.assert_allclose(fitted.get_latent_library_size(data.X), np.exp(posterior), rtol=1e-5)
    # The fitted prior N(m, s²) matches the cells' log totals (mean 7.67, sd 0.31), from its start at
    # m = log of the mean total (0.05 above the mean log total) and s = 1.
    observation = fitted.model.observation
    assert observation.library_loc.item() == pytest.approx(log_total.mean(), abs=0.03)
    assert observation.library_log_scale.exp().item() == pytest.approx(log_total.std(), abs=0.05)
    expression = fitted.get_normalized_expression(data.X[:5], library_size=1e4)
    np.testing.assert_allclose(expression.sum(1), 1e4, rtol=1e-4)


@pytest.mark.parametrize("model", ["ssl_dgm", "vae", "oi_vae", "vsc", "tvsc"])
def test_every_decoder_model_has_the_site_in_model_and_guide(data, model):
    X = data.X[:200, :40]
    fitted = pyro_sparse.train(model, X, max_epochs=1, hidden_dims=(8,), **QUICK)
    x = torch.as_tensor(X[:10])
    guide_trace = poutine.trace(fitted.guide).get_trace(x)
    model_trace = poutine.trace(poutine.replay(fitted.model, trace=guide_trace)).get_trace(x)
    for trace in (guide_trace, model_trace):
        site = trace.nodes["log_library"]
        assert in_data_plate(site) and site["value"].shape == (10,)
    assert np.isfinite(fitted.heldout_log_likelihood(X[:20], num_samples=5)).all()


def test_a_prior_per_batch_saved_and_loaded(data, tmp_path):
    X = data.X[:400].copy()
    batch = np.where(np.arange(400) % 2 == 0, "a", "b")
    X[batch == "b"] *= 3
    adata = anndata.AnnData(X, obs=pd.DataFrame({"batch": batch}, index=[f"c{i}" for i in range(400)]))
    adata.var_names = list(data.feature_names)
    fitted = pyro_sparse.train("ssl_dgm", adata, batch_key="batch", max_epochs=30, hidden_dims=(16,), **QUICK)
    means = [np.log(X[batch == b].sum(1)).mean() for b in "ab"]
    np.testing.assert_allclose(fitted.model.observation.library_loc.detach().numpy(), means, atol=0.15)
    fitted.save(tmp_path / "model.pt")
    loaded = pyro_sparse.load(tmp_path / "model.pt", device="cpu")
    assert loaded.model.observation.latent_library and loaded.guide.latent_library
    np.testing.assert_allclose(loaded.transform(adata), fitted.transform(adata), rtol=1e-5, atol=1e-6)


def test_an_observed_library_and_a_latent_one_exclude_each_other(data):
    adata = anndata.AnnData(data.X[:100], obs=pd.DataFrame({"sf": data.library[:100]},
                                                           index=[f"c{i}" for i in range(100)]))
    setup_anndata(adata, size_factor_key="sf")
    with pytest.raises(ValueError, match=r"library='latent' infers each cell's library size, but the data also "):
        pyro_sparse.train("vae", adata, max_epochs=1, **QUICK)


@pytest.mark.filterwarnings("ignore::UserWarning")  # counts given to the gaussian likelihood, a small batch
@pytest.mark.parametrize("options, message", [
    ({"likelihood": "gaussian"}, r"library='latent' is for the count likelihoods"),
    ({"library": "inferred"}, r"library must be one of \('observed', 'latent'\)"),
])
def test_bad_options_are_named(data, options, message):
    with pytest.raises(ValueError, match=message):
        pyro_sparse.train("vae", data.X[:50], max_epochs=1, **{**QUICK, **options})


def test_the_site_counts_once_per_cell_and_outside_beta_and_the_warm_up(data):
    from pyro_sparse.infer.handlers import scale_local_latents

    X = data.X[:200, :40]
    fitted = pyro_sparse.train("vae", X, max_epochs=1, hidden_dims=(8,), beta=2.0, **QUICK)
    x = torch.as_tensor(X[:10])
    with scale_local_latents(0.1):
        guide_trace = poutine.trace(fitted.guide).get_trace(x, num_data=200)
        model_trace = poutine.trace(poutine.replay(fitted.model, trace=guide_trace)).get_trace(x, num_data=200)
    for trace in (guide_trace, model_trace):
        assert trace.nodes["log_library"]["scale"] == pytest.approx(20.0)  # N / B: not β, not the warm-up
        assert trace.nodes["z"]["scale"] == pytest.approx(20.0 * 2.0 * 0.1)


def test_get_latent_library_size_needs_a_latent_library(data):
    fitted = pyro_sparse.train("vae", data.X[:100], max_epochs=1, **{**QUICK, "library": "observed"})
    with pytest.raises(AttributeError, match="not trained with library='latent'"):
        fitted.get_latent_library_size(data.X[:100])


def test_the_inferred_library_has_the_data_level_once_the_batch_statistics_settle(data):
    # The encoders are batch-normalised for NB (momentum 0.01, scVI's): outside training they use running
    # statistics, which lag in short fits (150 steps: 0.7 nats high); after 600 steps the level is right.
    fitted = pyro_sparse.train("vae", data.X, max_epochs=60, **QUICK)
    error = np.log(fitted.get_latent_library_size(data.X)) - np.log(data.X.sum(1))
    assert abs(error.mean()) < 0.1 and np.abs(error).mean() < 0.15
