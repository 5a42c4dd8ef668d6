"""The single-cell workflow: raw counts in an AnnData, a batch covariate, registration, counts out."""

import numpy as np
import pytest
import scipy.sparse
import torch

import pyro_sparse
from pyro_sparse.data import DataError
from pyro_sparse.io.anndata import setup_anndata

anndata = pytest.importorskip("anndata")
pandas = pytest.importorskip("pandas")

QUICK = dict(latent_dim=3, hidden_dims=(16,), max_epochs=2, batch_size=50, progress=False, device="cpu")


@pytest.fixture(scope="module")
def adata():
    rng = np.random.default_rng(0)
    n, g = 200, 25
    codes = rng.normal(size=(n, 3))
    loadings = (rng.random((3, g)) < 0.3) * rng.normal(size=(3, g))
    batch = rng.integers(0, 2, n)
    shift = rng.normal(size=g)
    proportions = np.exp(codes @ loadings + batch[:, None] * shift)
    proportions /= proportions.sum(1, keepdims=True)
    library = rng.integers(300, 1500, n)
    counts = rng.poisson(library[:, None] * proportions).astype(np.float32)
    counts[counts.sum(1) == 0, 0] = 1
    obs = pandas.DataFrame({"batch": pandas.Categorical([f"b{b}" for b in batch]),
                            "cell_type": [f"t{k}" for k in codes.argmax(1)],
                            "total": counts.sum(1).astype(float)},
                           index=[f"cell{i}" for i in range(n)])
    data = anndata.AnnData(np.log1p(counts), obs=obs)
    data.var_names = [f"gene{j}" for j in range(g)]
    data.layers["counts"] = counts
    return data


def test_one_call_with_a_batch_key(adata):
    fitted = pyro_sparse.train("ssl_dgm", adata, likelihood="negative_binomial", layer="counts", batch_key="batch",
                               **QUICK)
    assert fitted.config["covariates"]["categorical"] == [["batch", ["b0", "b1"]]]
    codes = fitted.transform(adata)  # reads the same layer and covariates
    assert codes.shape == (200, 3) and np.isfinite(codes).all()
    normalized = fitted.get_normalized_expression(adata[:10], batch="b1", library_size=1e4)
    np.testing.assert_allclose(normalized.sum(1), 1e4, rtol=1e-4)
    assert not np.allclose(normalized, fitted.get_normalized_expression(adata[:10], batch="b0", library_size=1e4))
    table = fitted.loadings()
    assert set(table.columns) == {"feature", "factor", "weight", "inclusion_probability"}
    assert set(table["feature"]) <= set(adata.var_names)


@pytest.mark.parametrize("likelihood", ["gaussian", "bernoulli", "multinomial"])
def test_size_factors_are_refused_where_the_likelihood_has_no_library(adata, likelihood):
    data = adata.copy()
    data.layers["binary"] = (data.layers["counts"] > 0).astype(np.float32)
    setup_anndata(data, layer="binary" if likelihood == "bernoulli" else "counts", size_factor_key="total")
    with pytest.raises(ValueError, match=f"library sizes \\(size_factor_key\\).*the {likelihood} likelihood"):
        pyro_sparse.train("vae", data, likelihood=likelihood, **QUICK)


def test_normalized_expression_needs_a_positive_library_size_and_counts(adata):
    fitted = pyro_sparse.train("vae", adata, likelihood="poisson", layer="counts", **{**QUICK, "max_epochs": 1})
    for bad in (-1.0, 0.0, float("nan"), float("inf"), "1e4", True, np.full(3, 1e4)):
        with pytest.raises(ValueError, match="library_size must be a positive finite number"):
            fitted.get_normalized_expression(adata[:3], library_size=bad)
    np.testing.assert_allclose(fitted.get_normalized_expression(adata[:3], library_size=np.float32(10)).sum(1), 10,
                               rtol=1e-5)
    gaussian = pyro_sparse.train("vae", adata, **{**QUICK, "max_epochs": 1})
    with pytest.raises(ValueError, match="leave library_size out"):
        gaussian.get_normalized_expression(adata[:3], library_size=1e4)
    # The multinomial's expression is proportions too: library_size scales them.
    multinomial = pyro_sparse.train("vae", adata, likelihood="multinomial", layer="counts",
                                    **{**QUICK, "max_epochs": 1})
    np.testing.assert_allclose(multinomial.get_normalized_expression(adata[:3], library_size=1e4).sum(1), 1e4,
                               rtol=1e-5)


def test_registration_is_read_by_train_and_transform(adata, tmp_path):
    data = adata.copy()
    setup_anndata(data, layer="counts", batch_key="batch", continuous_covariate_keys=["total"],
                  size_factor_key="total")
    fitted = pyro_sparse.train("vae", data, likelihood="zinb", **QUICK)
    assert fitted.config["registration"]["size_factor_key"] == "total"
    assert fitted.model.decoder.net[0].in_features == 3 + 2 + 1
    path = tmp_path / "model.pt"
    fitted.save(path)
    loaded = pyro_sparse.load(path, device="cpu")  # where it was fitted: equal to the last bit
    np.testing.assert_allclose(loaded.heldout_log_likelihood(data[:20], 3).shape, (20,))
    np.testing.assert_array_equal(loaded.transform(data), fitted.transform(data))
    fitted.write_to(data)
    assert data.obsm["X_vae"].shape == (200, 3)


def test_bad_registrations_and_new_categories_are_named(adata):
    with pytest.raises(DataError, match="no column 'sample'"):
        pyro_sparse.train("vae", adata, likelihood="poisson", layer="counts", batch_key="sample", **QUICK)
    with pytest.raises(DataError, match="no column 'sample'"):
        setup_anndata(adata.copy(), batch_key="sample")
    with pytest.raises(TypeError, match=r"write categorical_covariate_keys=\['batch'\]"):
        setup_anndata(adata.copy(), categorical_covariate_keys="batch")
    fitted = pyro_sparse.train("vae", adata, likelihood="poisson", layer="counts", batch_key="batch", **QUICK)
    new = adata[:5].copy()
    new.obs["batch"] = pandas.Categorical(["b2"] * 5)
    with pytest.raises(DataError, match=r"categories the model was not trained on: \['b2'\]"):
        fitted.transform(new)
    with pytest.raises(DataError, match="trained with covariates"):
        fitted.transform(adata.layers["counts"])
    with pytest.raises(ValueError, match="batch_key='batch' selects part of an AnnData"):
        pyro_sparse.train("vae", adata.layers["counts"], batch_key="batch", **QUICK)


@pytest.mark.parametrize("likelihood", ["poisson", "negative_binomial", "zinb"])
def test_counts_must_be_counts(adata, likelihood):
    counts = adata.layers["counts"]
    rows = np.flatnonzero((counts == 0).any(1))
    message = f"negative values in {len(rows)} rows \\(e.g. row {rows[0]}\\); the {likelihood} "
    with pytest.raises(DataError, match=message):
        pyro_sparse.train("vae", counts - 1, likelihood=likelihood, **QUICK)
    with pytest.raises(DataError, match="non-integer values in 200 rows"):
        pyro_sparse.train("vae", counts + 0.5, likelihood=likelihood, **QUICK)
    empty = counts.copy()
    empty[3] = 0
    with pytest.raises(DataError, match="1 row with no counts"):
        pyro_sparse.train("vae", empty, likelihood=likelihood, **QUICK)
    # In an AnnData, the layer is named and the rows counted, dense or sparse, at training and at evaluation.
    fitted = pyro_sparse.train("vae", adata, likelihood=likelihood, layer="counts", **{**QUICK, "max_epochs": 1})
    data = adata.copy()
    data.layers["counts"][[4, 7], 1] = 2.5
    for layer in (data.layers["counts"], scipy.sparse.csr_matrix(data.layers["counts"])):
        data.layers["counts"] = layer
        message = r"adata.layers\['counts'\] has non-integer values in 2 rows \(e.g. row 4\)"
        with pytest.raises(DataError, match=message):
            pyro_sparse.train("vae", data, likelihood=likelihood, layer="counts", **QUICK)
        with pytest.raises(DataError, match=message):
            fitted.transform(data)


def test_raw_counts_with_the_gaussian_likelihood_warn(adata):
    with pytest.warns(UserWarning, match="look like raw counts.*negative_binomial"):
        pyro_sparse.train("vae", adata.layers["counts"], **QUICK)
    # nmf fits counts by the multinomial (KL) loss only: the advice names what it accepts.
    with pytest.warns(UserWarning, match=r"for counts use likelihood='multinomial'$"):
        pyro_sparse.train("nmf", adata.layers["counts"], latent_dim=3)


def test_registration_survives_an_h5ad_file(adata, tmp_path):
    # The file gives the key lists back as numpy arrays (float64 when empty).
    data = adata.copy()
    setup_anndata(data, layer="counts", categorical_covariate_keys=["batch"])
    data.write_h5ad(tmp_path / "cells.h5ad")
    read = anndata.read_h5ad(tmp_path / "cells.h5ad")
    fitted = pyro_sparse.train("vae", read, likelihood="poisson", **QUICK)
    assert fitted.config["covariates"]["categorical"] == [["batch", ["b0", "b1"]]]
    assert fitted.config["registration"]["continuous_covariate_keys"] == []


def test_library_sizes_the_model_was_trained_with_are_required(adata):
    data = adata.copy()
    setup_anndata(data, layer="counts", size_factor_key="total")
    fitted = pyro_sparse.train("vae", data, likelihood="poisson", **QUICK)
    # Plain counts would be scored at their row totals instead, silently; the encoder needs no library.
    with pytest.raises(DataError, match=r"library sizes from adata.obs\['total'\]"):
        fitted.reconstruct(data.layers["counts"])
    np.testing.assert_array_equal(fitted.transform(data.layers["counts"]), fitted.transform(data))
    without = data.copy()
    del without.obs["total"]
    with pytest.raises(DataError, match="no column 'total'"):
        fitted.reconstruct(without)


def test_nmf_refuses_covariates(adata):
    with pytest.raises(ValueError, match="'nmf' takes no covariates"):
        pyro_sparse.train("nmf", adata, likelihood="multinomial", layer="counts", batch_key="batch", latent_dim=3)


def test_zinb_normalized_expression_is_the_negative_binomials_without_the_dropout_gate(adata):
    # scVI's convention: the decoder's rate proportions; a gene's dropout probability does not shrink its share.
    fitted = pyro_sparse.train("vae", adata, likelihood="zinb", layer="counts", **{**QUICK, "max_epochs": 1})
    before = fitted.get_normalized_expression(adata[:5])
    with torch.no_grad():
        fitted.model.observation.zero_logits[0] = 8.0  # gene 0 almost always dropped out
    np.testing.assert_allclose(fitted.get_normalized_expression(adata[:5]), before, rtol=1e-6)
