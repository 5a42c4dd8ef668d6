"""
Data on disk (pyro_sparse.data.backed): a backed .h5ad is read in blocks and
trains and evaluates as the same data in memory; bad files fail clearly.
"""

import hashlib
import os
import re

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import pyro_sparse
from pyro_sparse import Checkpointing, Schedule
from pyro_sparse.data import DataError, Dataset, backed
from pyro_sparse.data import dataset as dataset_module
from pyro_sparse.data.backed import BackedMatrix, block_order
from pyro_sparse.infer import checkpoints, loop
from pyro_sparse.io import anndata as anndata_io
from pyro_sparse.io import serialization

anndata = pytest.importorskip("anndata")

NUM_CELLS, NUM_GENES = 300, 12
QUICK = dict(likelihood="negative_binomial", latent_dim=3, hidden_dims=(8,), batch_size=40, max_epochs=2,
             progress=False, device="cpu", schedule=Schedule(kl_warmup_epochs=1))


def make_counts(seed=0):
    """Sparse counts; every cell has one."""
    rng = np.random.default_rng(seed)
    counts = sp.random(NUM_CELLS, NUM_GENES, density=0.4, format="csr", random_state=rng, dtype=np.float32)
    counts.data = np.ceil(6 * counts.data)
    cells = np.arange(NUM_CELLS)
    ones = sp.csr_matrix((np.ones(NUM_CELLS, np.float32), (cells, cells % NUM_GENES)), counts.shape)
    return (counts + ones).tocsr()


def write(path, X, **layers):
    adata = anndata.AnnData(X=X, layers=layers)
    adata.var_names = [f"gene{j}" for j in range(X.shape[1])]
    adata.write_h5ad(path)
    return path


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    # Blocks of a few rows, windows of a few blocks, passes of a few chunks: 300 rows make many of each.
    monkeypatch.setattr(backed, "BLOCK_BYTES", 400)
    monkeypatch.setattr(backed, "WINDOW_BYTES", 1600)
    monkeypatch.setattr(backed, "PASS_BYTES", 2000)


@pytest.fixture(scope="module")
def X():
    return make_counts()


@pytest.fixture
def path(tmp_path, X):
    return write(tmp_path / "cells.h5ad", X, counts=X.copy())


@pytest.fixture
def on_disk(path):
    adata = anndata.read_h5ad(path, backed="r")
    yield adata
    adata.file.close()


def test_blocks_windows_and_passes_are_many(on_disk):
    # What the other tests rely on: the small sizes make several blocks a window and several windows.
    matrix = BackedMatrix.of(on_disk.X, "adata.X")
    assert 4 <= matrix.block_rows <= 20 and matrix.window_blocks >= 2
    assert NUM_CELLS / (matrix.block_rows * matrix.window_blocks) >= 3


def test_reads_the_rows_asked_for(on_disk, X):
    matrix = BackedMatrix.of(on_disk.X, "adata.X")
    rng = np.random.default_rng(1)
    contiguous, scattered = np.arange(10, 50), np.sort(rng.choice(NUM_CELLS, 37, replace=False))
    unsorted_with_repeats = rng.integers(0, NUM_CELLS, 50)
    for positions in (contiguous, scattered, unsorted_with_repeats):
        np.testing.assert_array_equal(matrix.read(positions, "negative_binomial").toarray(), X[positions].toarray())
    rows = np.arange(0, NUM_CELLS, 3)[5:60]
    subset = matrix.subset(np.arange(0, NUM_CELLS, 3)).subset(np.arange(5, 60))
    positions = np.arange(len(rows))[::-1]
    np.testing.assert_array_equal(subset.read(positions, "poisson").toarray(), X[rows[positions]].toarray())


def test_an_epoch_reads_each_block_once_through_two_windows_at_most(on_disk, X):
    matrix = BackedMatrix.of(on_disk.X, "adata.X")
    matrix.read(np.arange(1), "negative_binomial")  # the row pointers: read once, before the epoch
    before, batch = matrix.bytes_read, 40
    order = matrix.epoch_order(batch, torch.Generator().manual_seed(0)).numpy()
    np.testing.assert_array_equal(np.sort(order), np.arange(NUM_CELLS))
    for start in range(0, NUM_CELLS, batch):
        positions = order[start : start + batch]
        assert np.all(np.diff(positions) > 0)  # each minibatch sorted
        np.testing.assert_array_equal(matrix.read(positions, "negative_binomial").toarray(), X[positions].toarray())
        assert len(matrix._windows) <= 2
    assert matrix.bytes_read - before == X.nnz * (4 + 4)  # float32 values and int32 indices, each once


def test_an_epoch_reads_rows_that_repeat_a_column_as_their_sum(tmp_path, X):
    # Valid CSR may list a column twice in a row (the entries add up): fewer values come back than the row stores.
    repeated = X.copy()
    for row in range(0, NUM_CELLS, 7):
        start, end = repeated.indptr[row], repeated.indptr[row + 1]
        if end - start > 1:
            repeated.indices[start + 1] = repeated.indices[start]
    assert not repeated.has_canonical_format
    adata = anndata.read_h5ad(write(tmp_path / "repeated.h5ad", repeated), backed="r")
    matrix = BackedMatrix.of(adata.X, "adata.X")
    order = matrix.epoch_order(40, torch.Generator().manual_seed(0)).numpy()
    for start in range(0, NUM_CELLS, 40):
        positions = order[start : start + 40]
        np.testing.assert_array_equal(matrix.read(positions, "negative_binomial").toarray(),
                                      repeated[positions].toarray())
    adata.file.close()


def test_block_order_shuffles_blocks_and_rows_within_windows():
    block_rows, window_blocks, batch = 7, 3, 16
    order, blocks = block_order(200, block_rows, window_blocks, batch, torch.Generator().manual_seed(0))
    again, _ = block_order(200, block_rows, window_blocks, batch, torch.Generator().manual_seed(0))
    other, _ = block_order(200, block_rows, window_blocks, batch, torch.Generator().manual_seed(1))
    order = order.numpy()
    np.testing.assert_array_equal(np.sort(order), np.arange(200))
    assert torch.equal(torch.as_tensor(order), again) and not torch.equal(torch.as_tensor(order), other)
    window_of = np.empty(len(blocks), dtype=int)
    window_of[blocks] = np.arange(len(blocks)) // window_blocks
    windows = window_of[order // block_rows]
    for start in range(0, 200, batch):
        in_batch = windows[start : start + batch]
        assert in_batch.max() - in_batch.min() <= 1  # a minibatch draws from one window, or two at a boundary
    # The rows of one window are shuffled, not in file order.
    first = order[windows == 0]
    assert len(first) == window_blocks * block_rows and not np.all(np.diff(first) > 0)


@pytest.mark.parametrize("validation_fraction", [0.0, 0.25])
def test_summary_statistics_match_in_memory(on_disk, X, validation_fraction):
    disk = anndata_io.training_dataset(on_disk, "negative_binomial")
    memory = Dataset.from_data(X, "negative_binomial")
    disk, _ = disk.split(validation_fraction, torch.Generator().manual_seed(0))
    memory, _ = memory.split(validation_fraction, torch.Generator().manual_seed(0))
    assert disk.summary.num_data == memory.summary.num_data
    np.testing.assert_allclose(disk.summary.feature_means, memory.summary.feature_means, rtol=1e-6)
    np.testing.assert_allclose(disk.summary.feature_variances, memory.summary.feature_variances, rtol=1e-5)


def test_feature_variances_of_values_far_from_zero(tmp_path):
    # sd 1 around 3e7: one-pass E[x²] − E[x]² cancels to 0 in float64; the chunks' centred sums do not.
    values = (3e7 + np.random.default_rng(1).normal(size=(NUM_CELLS, 3))).astype(np.float32)
    adata = anndata.read_h5ad(write(tmp_path / "offset.h5ad", sp.csr_matrix(values)), backed="r")
    disk = anndata_io.training_dataset(adata, "gaussian").summary
    adata.file.close()
    exact = values.astype(np.float64)
    np.testing.assert_allclose(disk.feature_means, exact.mean(0), rtol=1e-12)
    np.testing.assert_allclose(disk.feature_variances, exact.var(0), rtol=1e-6)


def test_same_fit_as_in_memory_with_the_same_minibatch_order(on_disk, X, monkeypatch):
    # Minibatches in memory are drawn by a uniform permutation, on disk in shuffled blocks: with the
    # block order in memory too, the fits agree up to the summary statistics (float64 on disk, float32
    # sums in memory: about 1e-7 apart; measured: at most 6e-6 apart in the parameters after 2 epochs, 5.5
    # with a uniform permutation in memory).
    schedule = Schedule(kl_warmup_epochs=1, validation_fraction=0.2)
    disk = pyro_sparse.train("ssl_dgm", on_disk, **{**QUICK, "schedule": schedule})
    matrix = BackedMatrix.of(on_disk.X, "adata.X")

    def blocks_in_memory(self, batch_size, generator=None):
        return block_order(self.num_data, matrix.block_rows, matrix.window_blocks, batch_size, generator)[0]

    monkeypatch.setattr(Dataset, "epoch_order", blocks_in_memory)
    memory = pyro_sparse.train("ssl_dgm", X, **{**QUICK, "schedule": schedule})
    expected = {**memory.model.state_dict(), **memory.guide.state_dict()}
    for key, value in {**disk.model.state_dict(), **disk.guide.state_dict()}.items():
        torch.testing.assert_close(value, expected[key], rtol=1e-4, atol=1e-5, msg=key)
    for name in ("train_loss", "validation_loss"):
        assert disk.history_[name] == pytest.approx(memory.history_[name], rel=1e-5)


def test_evaluation_methods_read_a_backed_anndata(on_disk, X):
    in_memory = anndata.AnnData(X=X)
    in_memory.var_names = list(on_disk.var_names)
    fitted = pyro_sparse.train("ssl_dgm", in_memory, **QUICK)
    for method in (fitted.transform, fitted.get_latent_representation, fitted.reconstruct,
                   fitted.get_normalized_expression):
        np.testing.assert_array_equal(method(on_disk), method(in_memory))
    torch.manual_seed(0)
    disk = fitted.heldout_log_likelihood(on_disk, num_samples=4)
    torch.manual_seed(0)
    np.testing.assert_array_equal(disk, fitted.heldout_log_likelihood(in_memory, num_samples=4))
    fitted.write_to(on_disk)
    np.testing.assert_array_equal(on_disk.obsm["X_ssl_dgm"], fitted.transform(in_memory))


def test_gaussian_models_check_the_units_of_data_on_disk(tmp_path, X):
    logged = X.log1p()
    path = write(tmp_path / "logged.h5ad", logged)
    fitted = pyro_sparse.train("vae", logged, **{**QUICK, "likelihood": "gaussian"})
    adata = anndata.read_h5ad(path, backed="r")
    np.testing.assert_array_equal(fitted.transform(adata), fitted.transform(logged))
    adata.file.close()
    far = write(tmp_path / "far.h5ad", logged * 1e20)
    adata = anndata.read_h5ad(far, backed="r")
    with pytest.raises(DataError, match="training standard deviations"):
        fitted.transform(adata)
    adata.file.close()


def test_resume_from_a_checkpoint_mid_run(on_disk, tmp_path):
    straight = pyro_sparse.train("ssl_dgm", on_disk, seed=1, **{**QUICK, "max_epochs": 3})
    path = tmp_path / "run.ckpt"
    pyro_sparse.train("ssl_dgm", on_disk, seed=1, checkpointing=Checkpointing(path=path), **{**QUICK, "max_epochs": 1})
    resumed = pyro_sparse.train("ssl_dgm", on_disk, seed=1, checkpointing=Checkpointing(path=path, resume_from=path),
                                **{**QUICK, "max_epochs": 3})
    expected = {**straight.model.state_dict(), **straight.guide.state_dict()}
    for key, value in {**resumed.model.state_dict(), **resumed.guide.state_dict()}.items():
        assert torch.equal(value, expected[key]), key
    assert resumed.history_ == straight.history_


def test_read_backed_keeps_layers_on_disk(path, X):
    adata = anndata_io.read_backed(path)
    assert not sp.issparse(adata.layers["counts"])  # an on-disk dataset, not a matrix in memory
    dataset = anndata_io.training_dataset(adata, "negative_binomial", layer="counts")
    assert isinstance(dataset.matrix, BackedMatrix)
    np.testing.assert_allclose(dataset.summary.feature_means, X.mean(0).A1, rtol=1e-6)
    fitted = pyro_sparse.train("ssl_dgm", adata, layer="counts", **QUICK)
    assert fitted.transform(adata).shape == (NUM_CELLS, 3)


# ---------------------------------------------------------------- bad files


@pytest.mark.parametrize("value, problem", [(2.5, "non-integer values"), (-1.0, "negative values"),
                                            (np.nan, "NaN or infinite values"), (0.0, "1 row with no counts")])
def test_values_that_are_not_counts_fail_in_the_streaming_pass(tmp_path, X, value, problem):
    bad = X.copy()
    if value == 0.0:
        bad[250] = 0  # a cell without counts
        bad.eliminate_zeros()
    else:
        bad.data[bad.indptr[250]] = value
    adata = anndata.read_h5ad(write(tmp_path / "bad.h5ad", bad), backed="r")
    pattern = rf"adata.X of '.*bad.h5ad' \(rows \d+-\d+\) (has|contains) {problem}"
    with pytest.raises(DataError, match=pattern):
        pyro_sparse.train("ssl_dgm", adata, **QUICK)
    with pytest.raises(DataError, match=pattern):  # evaluation checks the rows it reads
        Dataset.from_data(anndata_io.evaluation_data(adata, {"layer": None})[0], "poisson").rows(np.arange(300))
    adata.file.close()


def test_a_truncated_file_fails_clearly(path):
    adata = anndata.read_h5ad(path, backed="r")
    size = os.path.getsize(path)
    os.truncate(path, size // 2)
    # anndata < 0.13 opens X and our reader finds the file short; later ones fail in h5py on opening X.
    truncated = rf"backed file '.*cells.h5ad' (is truncated: {size // 2}|\({size // 2}) bytes on disk"
    with pytest.raises(DataError, match=truncated):
        pyro_sparse.train("ssl_dgm", adata, **QUICK)
    adata.file.close()
    with pytest.raises(DataError, match="cannot open '.*cells.h5ad' as an .h5ad file: .*truncated"):
        anndata_io.read_backed(path)


def test_a_view_of_a_backed_file_warns_that_it_is_in_memory(on_disk):
    with pytest.warns(UserWarning, match=r"adata.X of a view of the backed file '.*cells.h5ad' is in memory"):
        fitted = pyro_sparse.train("ssl_dgm", on_disk[:, :12], **QUICK)
    assert fitted.transform(on_disk[:, :12]).shape == (on_disk.n_obs, QUICK["latent_dim"])


def test_a_file_moved_after_opening_fails_clearly(path, tmp_path):
    adata = anndata.read_h5ad(path, backed="r")
    os.rename(path, tmp_path / "moved.h5ad")
    with pytest.raises(DataError, match=r"backed file '.*cells.h5ad' can no longer be read: .*No such file"):
        pyro_sparse.train("ssl_dgm", adata, **QUICK)
    adata.file.close()


def test_a_file_that_changes_during_training_fails_and_keeps_the_last_checkpoint(on_disk, path, tmp_path,
                                                                                  monkeypatch):
    end_epoch = loop.Trainer._end_epoch

    def then_append(self, *args):
        stop = end_epoch(self, *args)  # the checkpoint of this epoch is written here
        with open(path, "ab") as stream:
            stream.write(b"\0" * 16)  # another process writes to the file
        return stop

    monkeypatch.setattr(loop.Trainer, "_end_epoch", then_append)
    checkpoint = tmp_path / "run.ckpt"
    with pytest.raises(DataError, match=r"backed file '.*cells.h5ad' changed while in use \(size, modification time"):
        pyro_sparse.train("ssl_dgm", on_disk, checkpointing=Checkpointing(path=checkpoint), **QUICK)
    config, _ = serialization.read(checkpoint, checkpoints.CHECKPOINT_FILE)
    assert config["loop"]["epoch"] == 1  # the epoch before the change, intact


def test_a_layer_that_does_not_exist(on_disk):
    with pytest.raises(DataError, match=r"no layer 'spliced'.*\['counts'\]"):
        pyro_sparse.train("ssl_dgm", on_disk, layer="spliced", **QUICK)


def test_a_file_without_X_names_its_layers(tmp_path, X):
    adata = anndata.AnnData(X=None, obs={"cell": [f"c{i}" for i in range(X.shape[0])]},
                            var={"gene": [f"gene{j}" for j in range(X.shape[1])]}, layers={"counts": X.copy()})
    adata.write_h5ad(tmp_path / "no_x.h5ad")
    backed = anndata.read_h5ad(tmp_path / "no_x.h5ad", backed="r")
    with pytest.raises(DataError, match=r"adata.X is empty; pass layer= naming one of adata.layers \['counts'\]"):
        pyro_sparse.train("ssl_dgm", backed)
    backed.file.close()


def test_matrices_on_disk_that_cannot_be_read_by_rows(tmp_path, X):
    csc = anndata.read_h5ad(write(tmp_path / "csc.h5ad", X.tocsc()), backed="r")
    with pytest.raises(DataError, match="adata.X is stored on disk as CSC"):
        pyro_sparse.train("ssl_dgm", csc, **QUICK)
    csc.file.close()
    dense = anndata.read_h5ad(write(tmp_path / "dense.h5ad", X.toarray()), backed="r")
    with pytest.raises(DataError, match=r"adata.X is stored dense on disk.*to_memory\(\)"):
        pyro_sparse.train("ssl_dgm", dense, **QUICK)
    dense.file.close()
    # read_backed reads a dense matrix whole: said, since its point is to keep matrices on disk.
    with pytest.warns(UserWarning, match=r"X of '.*dense.h5ad' is not a sparse matrix, so it is read into memory \(0 MiB\)"):
        anndata_io.read_backed(tmp_path / "dense.h5ad")
    # The fix a message names is for the matrix at fault, a layer here.
    csc_layer = anndata_io.read_backed(write(tmp_path / "csc_layer.h5ad", X, counts=X.tocsc()))
    fix = re.escape("adata.layers['counts'] = adata.layers['counts'].tocsr()")
    with pytest.raises(DataError, match=rf"adata.layers\['counts'\] is stored on disk as CSC.*{fix}"):
        pyro_sparse.train("ssl_dgm", csc_layer, layer="counts", **QUICK)


def test_a_file_whose_csr_arrays_are_not_1d_fails_clearly(path):
    import h5py

    with h5py.File(path, "r+") as file:
        data = file["X/data"][:]
        del file["X/data"]
        file["X/data"] = data.reshape(-1, 1)
    adata = anndata.read_h5ad(path, backed="r")
    with pytest.raises(DataError, match=r"adata.X of .* is not a valid CSR matrix: its data, indices and indptr must"):
        pyro_sparse.train("ssl_dgm", adata, **QUICK)
    adata.file.close()


def test_a_closed_file_and_nmf_fail_clearly(path):
    adata = anndata.read_h5ad(path, backed="r")
    with pytest.raises(DataError, match=r"nmf fits in memory.*to_memory\(\)"):
        pyro_sparse.train("nmf", adata, likelihood="multinomial", latent_dim=2)
    dataset = anndata_io.training_dataset(adata, "negative_binomial")
    adata.file.close()
    with pytest.raises(DataError, match="the file of adata.X of '.*cells.h5ad' is closed"):
        dataset.rows(np.arange(5))


def test_the_fingerprint_a_resume_checks_is_the_matrixs_not_its_storage(on_disk, X, monkeypatch):
    # Read from disk in many chunks, or whole in memory (CSR, CSC, dense): one fingerprint; two rows swapped: another.
    def fingerprint(data):
        hasher = hashlib.sha256()
        Dataset.from_data(data, "poisson").add_to_hash(hasher)
        return hasher.hexdigest()

    on_file = hashlib.sha256()
    anndata_io.training_dataset(on_disk, "poisson").add_to_hash(on_file)
    assert on_file.hexdigest() == fingerprint(X) == fingerprint(X.tocsc())
    assert fingerprint(X[np.r_[1, 0, 2 : X.shape[0]]]) != fingerprint(X)
    assert fingerprint(X.toarray()) == fingerprint(X.toarray().copy())
    # In memory, hashed in blocks of rows; a stored zero is not a value.
    whole = fingerprint(X)
    with_zero = X.copy()
    with_zero.data[0] = 0.0
    stored, dropped = fingerprint(with_zero), fingerprint(sp.csr_matrix(with_zero.toarray()))
    monkeypatch.setattr(dataset_module, "HASH_ROWS", 7)
    assert fingerprint(X) == whole and stored == dropped
