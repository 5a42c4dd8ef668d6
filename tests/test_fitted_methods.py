"""FittedModel's methods: what they encode and decode with, their draws, and the state they leave behind."""

import anndata
import numpy as np
import pandas as pd
import pyro
import pytest
import torch

import pyro_sparse
from pyro_sparse.data import DataError
from pyro_sparse.data.covariates import CovariateSpec
from pyro_sparse.infer.importance import expected_observation
from pyro_sparse.io.anndata import setup_anndata

QUICK = dict(latent_dim=3, hidden_dims=(8,), max_epochs=3, batch_size=20, progress=False, device="cpu", seed=0)


@pytest.fixture(scope="module")
def gaussian():
    return np.random.default_rng(0).normal(size=(40, 6)).astype(np.float32)


def test_the_counterfactual_batch_changes_the_decoder_only():
    rng = np.random.default_rng(0)
    batch = rng.integers(0, 2, 60)
    counts = rng.poisson(20 * np.exp(rng.normal(size=(60, 8)) * 0.5 + batch[:, None] * rng.normal(size=8)))
    obs = pd.DataFrame({"batch": pd.Categorical([f"b{b}" for b in batch])}, index=[f"c{i}" for i in range(60)])
    adata = anndata.AnnData(counts.astype(np.float32), obs=obs)
    fitted = pyro_sparse.train("ssl_dgm", adata, likelihood="poisson", batch_key="batch", **QUICK)
    cells = adata[adata.obs["batch"] == "b0"].copy()
    piece = next(iter(fitted._batches(cells, needs_library=False)))
    other = CovariateSpec.from_config(fitted.config["covariates"]).with_batch(piece.covariates, "b1")
    own_codes = fitted.guide.posterior(piece.x, piece.covariates).mean
    assert not torch.allclose(own_codes, fitted.guide.posterior(piece.x, other).mean)  # the batch reaches the encoder
    mean = expected_observation(fitted.model, fitted.guide, piece.x, own_codes, covariates=other,
                                library=piece.x.new_ones(len(cells)))
    np.testing.assert_allclose(fitted.get_normalized_expression(cells, batch="b1"),
                               (mean / mean.sum(-1, keepdim=True)).numpy(), rtol=1e-5)


def test_sample_posterior_draws_a_learned_threshold_with_each_code(gaussian):
    fitted = pyro_sparse.train("tvsc", gaussian, latent_prior="thresholded_normal", learn_threshold=True, **QUICK)
    draws = fitted.sample_posterior(gaussian[:4], num_samples=3000)
    piece = next(iter(fitted._batches(gaussian[:4], needs_library=False)))
    loc, scale, _, threshold = fitted.guide._encode(piece.x)
    # P(z = 0) under λ ~ q(λ | x), and with λ fixed at its mean, from the guide's law of z given λ.
    marginal = (fitted.guide._codes(loc, scale, threshold.sample((20000,))).sample() == 0).float().mean(0).numpy()
    plug_in = (fitted.guide._codes(loc, scale, threshold.mean).sample((20000,)) == 0).float().mean(0).numpy()
    assert np.abs(plug_in - marginal).max() > 0.05  # the two laws differ here, so the test can tell them apart
    np.testing.assert_allclose((draws == 0).mean(0), marginal, atol=0.04)


def test_encoder_only_methods_take_an_anndata_without_library_sizes():
    counts = np.random.default_rng(0).poisson(20, size=(60, 8)).astype(np.float32)
    obs = pd.DataFrame({"total": counts.sum(1).astype(float)}, index=[f"c{i}" for i in range(60)])
    adata = anndata.AnnData(counts, obs=obs)
    setup_anndata(adata, size_factor_key="total")
    fitted = pyro_sparse.train("vae", adata, likelihood="poisson", **QUICK)
    new = anndata.AnnData(counts[:5].copy())
    new.var_names = adata.var_names
    np.testing.assert_array_equal(fitted.transform(new), fitted.transform(counts[:5]))
    assert fitted.sample_posterior(new, num_samples=2).shape == (2, 5, 3)
    with pytest.raises(DataError, match="total"):
        fitted.reconstruct(new)


@pytest.mark.parametrize("method", ["reconstruct", "get_normalized_expression"])
def test_deterministic_methods_leave_the_random_stream_alone(gaussian, method):
    fitted = pyro_sparse.train("ssl_dgm", gaussian, **QUICK)
    pyro.set_rng_seed(0)
    expected = fitted.sample_posterior(gaussian[:3])
    pyro.set_rng_seed(0)
    first = getattr(fitted, method)(gaussian)
    np.testing.assert_array_equal(fitted.sample_posterior(gaussian[:3]), expected)
    np.testing.assert_array_equal(getattr(fitted, method)(gaussian), first)


def test_write_to_removes_what_an_earlier_fit_left_under_the_same_key(gaussian):
    adata = anndata.AnnData(gaussian.copy())
    pyro_sparse.train("ssl_dgm", adata, latent_prior="correlated", **QUICK).write_to(adata)
    assert {"W_ssl_dgm", "inclusion_probs_ssl_dgm"} <= set(adata.varm) and "latent_correlation_ssl_dgm" in adata.uns
    horseshoe = pyro_sparse.train("ssl_dgm", adata, mask_prior="horseshoe", **QUICK)
    horseshoe.write_to(adata)
    assert "inclusion_probs_ssl_dgm" not in adata.varm
    np.testing.assert_array_equal(adata.varm["W_ssl_dgm"], horseshoe.W_)
    np.testing.assert_array_equal(adata.uns["latent_correlation_ssl_dgm"], horseshoe.latent_correlation_)


def test_loadings_checks_the_number_of_names(gaussian):
    fitted = pyro_sparse.train("ssl_dgm", gaussian, **QUICK)
    for names in (list("abcdefgh"), list("abc")):
        with pytest.raises(ValueError, match=f"got {len(names)} feature names for 6 features"):
            fitted.loadings(names=names)
