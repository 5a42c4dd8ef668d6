"""Property-based checks of the data entry point: every input is a valid matrix or a named DataError."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pyro_sparse.data import DataError, Dataset, as_matrix, check_values

dtypes = st.sampled_from([np.float64, np.float32, np.int64, np.int8, np.bool_, np.uint8])
arrays = hnp.arrays(
    dtype=dtypes,
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5),
)


@settings(max_examples=150, deadline=None)
@given(arrays, st.sampled_from(["gaussian", "multinomial", "bernoulli"]))
def test_input_is_a_valid_matrix_or_a_named_error(array, likelihood):
    try:
        matrix = as_matrix(array)
        check_values(matrix, likelihood)
    except DataError as error:
        assert str(error)  # a message, never a bare error from deep inside numpy or torch
        return
    assert matrix.ndim == 2 and matrix.shape[0] > 0 and matrix.shape[1] > 0
    assert matrix.dtype == torch.float32 and torch.isfinite(matrix).all()
    values = matrix.numpy()
    if likelihood == "multinomial":
        assert (values >= 0).all() and (values == np.round(values)).all() and (values.sum(1) > 0).all()
    if likelihood == "bernoulli":
        assert np.isin(values, [0.0, 1.0]).all()


@settings(max_examples=100, deadline=None)
@given(hnp.arrays(np.float64, hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=6)))
def test_non_finite_values_are_always_caught(array):
    try:
        as_matrix(array)
    except DataError as error:
        assert "NaN or infinite" in str(error) or "float32" in str(error)
        magnitudes = np.abs(array)
        float32 = np.finfo(np.float32)
        assert not np.isfinite(array).all() or magnitudes.max() > float32.max or (
            (magnitudes > 0) & (magnitudes < float32.tiny)
        ).any()
    else:
        assert np.isfinite(array.astype(np.float32)).all()


def test_sparse_minibatches_are_dense_rows_in_order():
    dense = np.arange(20, dtype=np.float32).reshape(5, 4)
    batches = list(Dataset(as_matrix(sp.csr_matrix(dense)), "gaussian").minibatches(2, shuffle=False))
    assert [tuple(b.x.shape) for b in batches] == [(2, 4), (2, 4), (1, 4)]
    np.testing.assert_array_equal(torch.cat([b.x for b in batches]).numpy(), dense)


@pytest.mark.parametrize("bad", [np.array([[1, 2], [3, 4]], dtype=object), np.array([["1", "2"]])])
def test_object_and_string_dtypes(bad):
    with pytest.raises(DataError, match="numeric"):
        as_matrix(bad)


def test_sparse_entries_are_checked_as_the_matrix_holds_them():
    # A row listing column 0 twice holds 1 + 1 = 2 there, outside the bernoulli's {0, 1}, though every stored value is 1.
    duplicated = sp.csr_matrix((np.ones(3), np.array([0, 0, 1]), np.array([0, 2, 3])), shape=(2, 3))
    assert duplicated.toarray()[0, 0] == 2
    with pytest.raises(DataError, match="outside"):
        check_values(as_matrix(duplicated), "bernoulli")
    # An out-of-range column index (a damaged file) would make scipy write outside the matrix.
    damaged = sp.csr_matrix((np.ones(2), np.array([0, 1]), np.array([0, 1, 2])), shape=(2, 3))
    damaged.indices[1] = 7
    with pytest.raises(DataError, match="not a valid sparse matrix"):
        as_matrix(damaged)


def test_repeated_sparse_entries_add_up_without_overflowing_their_type():
    # 300 reads of one gene in one cell as 300 uint8 ones: their sum, 300, does not fit in uint8 (300 mod 256 = 44).
    rows, columns = np.r_[np.zeros(300, int), 1], np.r_[np.zeros(300, int), 2]
    counts = np.zeros((2, 3))
    np.add.at(counts, (rows, columns), 1)
    for dtype in (np.uint8, np.int8):
        entries = np.ones(len(rows), dtype)
        np.testing.assert_array_equal(as_matrix(sp.coo_matrix((entries, (rows, columns)), (2, 3))).toarray(), counts)
        tensor = torch.sparse_coo_tensor(np.vstack([rows, columns]), torch.from_numpy(entries), (2, 3))
        np.testing.assert_array_equal(as_matrix(tensor).toarray(), counts)
    # Repeated bool entries stay a logical or, as scipy sums them: binary data from repeated (row, column) pairs.
    entries = np.ones(len(rows), np.bool_)
    binary = as_matrix(sp.coo_matrix((entries, (rows, columns)), (2, 3)))
    np.testing.assert_array_equal(binary.toarray(), counts > 0)
    check_values(binary, "bernoulli")
    tensor = torch.sparse_coo_tensor(np.vstack([rows, columns]), torch.from_numpy(entries), (2, 3))
    np.testing.assert_array_equal(as_matrix(tensor).toarray(), counts > 0)


def test_half_precision_sparse_masked_and_hybrid_input():
    pandas = pytest.importorskip("pandas")
    dense = torch.tensor([[0.0, 2.5, 0.0], [1.0, 0.0, 3.0]])
    for half in (dense.half(), dense.bfloat16()):  # scipy.sparse has no float16
        np.testing.assert_array_equal(as_matrix(half.to_sparse()).toarray(), dense.numpy())
    frame = pandas.DataFrame(dense.numpy().astype(np.float16)).astype(pandas.SparseDtype(np.float16, 0))
    np.testing.assert_array_equal(as_matrix(frame).toarray(), dense.numpy())
    np.testing.assert_array_equal(as_matrix(np.ma.masked_array(dense.numpy())).numpy(), dense.numpy())
    with pytest.raises(DataError, match="masked array with 1 masked entries"):
        as_matrix(np.ma.masked_array(dense.numpy(), mask=[[True, False, False], [False, False, False]]))
    with pytest.raises(DataError, match="hybrid sparse tensor"):
        as_matrix(dense.to_sparse(1))


def test_sparse_and_dense_data_have_the_same_feature_variances():
    # A feature with mean 1000 and sd 0.1: E[x²] - E[x]² in float32 cancels to 0.
    rng = np.random.default_rng(0)
    dense = np.c_[1000 + 0.1 * rng.normal(size=400), rng.normal(size=400)].astype(np.float32)
    dense[::3] = 0.0
    summaries = [Dataset.from_data(data, "gaussian").summary for data in (dense, sp.csr_matrix(dense))]
    np.testing.assert_allclose(summaries[1].feature_variances, summaries[0].feature_variances, rtol=1e-9)
    np.testing.assert_allclose(summaries[1].feature_means, summaries[0].feature_means, rtol=1e-9)


def test_nullable_dataframe_columns_are_read_as_numbers():
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame({"a": [1, 2, 3], "b": [0.5, 1.5, 2.5]}).convert_dtypes()
    np.testing.assert_array_equal(as_matrix(frame).numpy(), [[1, 0.5], [2, 1.5], [3, 2.5]])
    with pytest.raises(DataError, match="NaN"):
        as_matrix(frame.astype({"a": "Int64"}).assign(a=[1, None, 3]))
    # A bool column beside numbers: no common numpy type, still numbers.
    mixed = pandas.DataFrame({"a": [True, False], "b": [1, 0], "c": [0.5, 2.0]})
    np.testing.assert_array_equal(as_matrix(mixed).numpy(), [[1, 1, 0.5], [0, 0, 2.0]])


def test_a_dataframe_of_sparse_columns_stays_sparse():
    pandas = pytest.importorskip("pandas")
    dense = np.array([[0.0, 2.0, 0.0], [1.0, 0.0, 3.0]])
    matrix = as_matrix(pandas.DataFrame.sparse.from_spmatrix(sp.csr_matrix(dense)))
    assert sp.issparse(matrix)
    np.testing.assert_array_equal(matrix.toarray(), dense)
    # Sparse columns whose implicit value is not 0 are read densely, as they hold.
    ones = pandas.DataFrame({"a": pandas.arrays.SparseArray([1.0, 1.0, 0.0], fill_value=1.0)})
    np.testing.assert_array_equal(as_matrix(ones).numpy().ravel(), [1, 1, 0])


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_torch_sparse_tensors_are_read_as_scipy_sparse(layout):
    dense = torch.tensor([[0.0, 2.0, 0.0], [1.0, 0.0, 3.0]])
    tensor = dense.to_sparse() if layout == "coo" else dense.to_sparse_csr()
    matrix = as_matrix(tensor)
    assert sp.issparse(matrix)
    np.testing.assert_array_equal(matrix.toarray(), dense.numpy())
    with pytest.raises(DataError, match="2-D"):
        as_matrix(torch.zeros(2, 2, 2).to_sparse())


def test_a_read_only_array_is_copied_without_a_warning():
    import warnings

    frozen = np.arange(6, dtype=np.float32).reshape(3, 2)
    frozen.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns (once per process) when it wraps a read-only array
        matrix = as_matrix(frozen)
    matrix[0, 0] = 7.0  # writing to the model's copy must not touch the user's array
    assert frozen[0, 0] == 0.0


def test_repeated_feature_names_are_warned_about():
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame(np.arange(8.0).reshape(2, 4), columns=["a", "b", "a", "c"])
    with pytest.warns(UserWarning, match=r"1 feature names repeat \(e.g. \['a'\]\)"):
        Dataset.from_data(frame, "gaussian")
