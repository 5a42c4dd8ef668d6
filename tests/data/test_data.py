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
