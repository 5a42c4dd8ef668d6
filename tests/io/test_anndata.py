"""AnnData in and out: layers, var_names, obsm/varm, sparse matrices never densified whole."""

import numpy as np
import pytest
import scipy.sparse as sp

import pyro_sparse
from pyro_sparse import Schedule
from pyro_sparse.data import DataError

anndata = pytest.importorskip("anndata")

QUICK = dict(latent_dim=3, max_epochs=2, batch_size=40, progress=False, hidden_dims=(8,))
NUM_CELLS, NUM_GENES = 120, 6
GENES = [f"gene{j}" for j in "ABCDEF"]


def make_adata(seed=0, num_cells=NUM_CELLS, genes=GENES):
    """Sparse counts in ``layers["counts"]``, their log1p in X; every cell has a count."""
    rng = np.random.default_rng(seed)
    counts = sp.random(num_cells, len(genes), density=0.5, format="csr", random_state=rng, dtype=np.float32)
    counts.data = np.ceil(10 * counts.data)
    cells = np.arange(num_cells)
    counts = (counts + sp.csr_matrix((np.ones(num_cells, np.float32), (cells, cells % len(genes))), counts.shape)).tocsr()
    adata = anndata.AnnData(X=counts.log1p())
    adata.layers["counts"] = counts
    adata.var_names = genes
    return adata


@pytest.fixture(scope="module")
def adata():
    return make_adata()


@pytest.fixture(scope="module")
def fitted(adata):
    return pyro_sparse.train("ssl_dgm", adata, **QUICK)


def test_fits_x_by_default_and_the_named_layer_on_request(adata):
    on_x = pyro_sparse.train("vae", adata, seed=1, **QUICK)
    same_x = pyro_sparse.train("vae", adata.X, seed=1, **QUICK)
    on_layer = pyro_sparse.train("vae", adata, layer="counts", seed=1, **QUICK)
    same_layer = pyro_sparse.train("vae", adata.layers["counts"], seed=1, **QUICK)
    np.testing.assert_array_equal(on_x.transform(adata.X), same_x.transform(adata.X))
    np.testing.assert_array_equal(on_layer.transform(adata.X), same_layer.transform(adata.X))
    np.testing.assert_allclose(on_layer.config["feature_means"], adata.layers["counts"].mean(0).A1, rtol=1e-6)
    assert on_layer.config["layer"] == "counts"
    # transform of an AnnData reads the layer the model was trained on
    np.testing.assert_array_equal(on_layer.transform(adata), on_layer.transform(adata.layers["counts"]))


def test_unknown_layer_names_the_layers_there_are(adata):
    with pytest.raises(DataError, match=r"no layer 'spliced'.*\['counts'\]"):
        pyro_sparse.train("vae", adata, layer="spliced", **QUICK)


def test_layer_without_anndata_is_rejected(adata):
    with pytest.raises(ValueError, match="layer='counts' selects part of an AnnData"):
        pyro_sparse.train("vae", adata.X, layer="counts", **QUICK)


def test_var_names_name_the_features(fitted, adata, tmp_path):
    assert fitted.config["feature_names"] == GENES
    W = np.abs(fitted.W_)
    for k, top in enumerate(fitted.top_features(2)):
        expected = [GENES[j] for j in np.argsort(-W[:, k], kind="stable")[:2] if W[j, k] > 0]
        assert top == expected
    fitted.save(tmp_path / "model.pt")
    assert pyro_sparse.load(tmp_path / "model.pt").top_features(2) == fitted.top_features(2)


def test_nmf_keeps_the_var_names(adata):
    nmf = pyro_sparse.train("nmf", adata, layer="counts", latent_dim=2, likelihood="multinomial")
    assert nmf.config["feature_names"] == GENES
    assert all(name in GENES for top in nmf.top_features(3) for name in top)


def test_write_to_stores_codes_mask_and_inclusion_probabilities(fitted):
    target = make_adata()
    fitted.write_to(target)
    assert target.obsm["X_ssl_dgm"].shape == (NUM_CELLS, 3)
    np.testing.assert_array_equal(target.obsm["X_ssl_dgm"], fitted.transform(target.X))
    assert target.varm["W_ssl_dgm"].shape == (NUM_GENES, 3)
    np.testing.assert_array_equal(target.varm["W_ssl_dgm"], fitted.W_)
    assert target.varm["inclusion_probs_ssl_dgm"].shape == (NUM_GENES, 3)
    np.testing.assert_array_equal(target.varm["inclusion_probs_ssl_dgm"], fitted.inclusion_probs_)


def test_write_to_a_model_without_a_mask_writes_codes_only(adata):
    target = make_adata()
    pyro_sparse.train("vae", adata, **QUICK).write_to(target, key="vae_run1")
    assert target.obsm["X_vae_run1"].shape == (NUM_CELLS, 3)
    assert list(target.varm) == []


def test_sparse_matrix_is_densified_one_minibatch_at_a_time(monkeypatch):
    # More cells than the 1024-row minibatches of transform, so that densifying
    # the whole matrix (or the whole training split) trips the guard.
    adata = make_adata(num_cells=1500)
    densify = sp.csr_matrix.toarray
    densified_rows = []

    def minibatch_toarray(matrix, *args, **kwargs):
        if matrix.shape[0] > 1024:
            raise AssertionError(f"a {matrix.shape} sparse matrix was densified whole")
        densified_rows.append(matrix.shape[0])
        return densify(matrix, *args, **kwargs)

    monkeypatch.setattr(sp.csr_matrix, "toarray", minibatch_toarray)
    with pytest.raises(AssertionError, match="densified whole"):  # the guard itself works
        adata.X.toarray()
    fitted = pyro_sparse.train("ssl_dgm", adata, schedule=Schedule(validation_fraction=0.25), **QUICK)
    fitted.write_to(adata)
    assert adata.obsm["X_ssl_dgm"].shape == (1500, 3)
    assert QUICK["batch_size"] in densified_rows and 1024 in densified_rows


@pytest.mark.parametrize(
    "genes, problem",
    [
        (GENES[::-1], r"orders them differently \(column 0 is 'geneF', the model's feature 0 is 'geneA'\)"),
        (GENES[:5] + ["geneZ"], r"lacks 1 of the model's features, e.g. \['geneF'\]"),
    ],
)
def test_mismatched_var_names_at_transform_are_named(fitted, genes, problem):
    other = make_adata(seed=1)
    other.var_names = genes
    with pytest.raises(DataError, match=problem):
        fitted.transform(other)
    with pytest.raises(DataError, match=problem):
        fitted.write_to(other)


def test_extra_genes_are_reported_and_selecting_the_trained_ones_works(fitted):
    wider = make_adata(seed=1, genes=GENES + ["extra1", "extra2"])
    with pytest.raises(DataError, match=r"has 2 features the model was not trained on.*adata\[:, fitted"):
        fitted.transform(wider)
    selected = wider[:, fitted.config["feature_names"]]
    np.testing.assert_array_equal(fitted.transform(selected), fitted.transform(selected.X))


def test_backed_anndata_trains_and_evaluates_from_disk(adata, tmp_path):
    # Read in blocks by pyro_sparse.data.backed (tests/data/test_backed.py).
    adata.write_h5ad(tmp_path / "cells.h5ad")
    backed = anndata.read_h5ad(tmp_path / "cells.h5ad", backed="r")
    try:
        fitted = pyro_sparse.train("vae", backed, **QUICK)
        np.testing.assert_array_equal(fitted.transform(backed), fitted.transform(adata))
    finally:
        backed.file.close()


def test_the_command_line_reads_h5ad_files_and_their_layers(adata, tmp_path, capsys):
    import json

    from pyro_sparse.interop.cli import main

    path = tmp_path / "cells.h5ad"
    adata.write_h5ad(path)
    out = tmp_path / "run"
    layer = next(iter(adata.layers))
    arguments = ["train", "--model", "vae", "--data", str(path), "--layer", layer, "--out", str(out),
                 "--epochs", "1", "--latent-dim", "2", "--hidden-dims", "8", "--quiet"]
    assert main(arguments) == 0
    config = json.loads((out / "summary.json").read_text())["config"]
    assert config["layer"] == layer and config["feature_names"] == list(adata.var_names)
    path.with_suffix(".bad.h5ad").write_bytes(b"not hdf5")
    assert main([*arguments[:4], str(path.with_suffix(".bad.h5ad")), *arguments[5:]]) == 2
    assert "not a readable .h5ad file" in capsys.readouterr().err
