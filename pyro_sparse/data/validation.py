"""Data entering the library: conversion to a matrix and checks of its values."""

import os
import sys
import warnings

import numpy as np
import scipy.sparse as sp
import torch


class DataError(ValueError):
    """Data that a model cannot be fitted to or evaluated on, with the reason."""


class OnDisk:
    """
    A matrix that stays on disk and is read in pieces
    (:class:`~pyro_sparse.data.backed.BackedMatrix`): :func:`as_matrix` passes
    it on and its values are checked as they are read, not by :func:`check_values`.
    """


# Models compute in float32: feature variances beyond this overflow its squares
# of residuals, and below the lower bound (for real-valued data) every
# variance the models store underflows to 0.
VARIANCE_RANGE = (1e-30, 1e30)

# Standardised values of new data beyond this overflow the encoders' float32
# arithmetic (from about 1e20 the likelihoods are no longer finite); long
# before that they mean the data is in other units than the training data.
MAX_STANDARDIZED_VALUE = 1e12


def _values(data, name):
    """The numpy values of a tensor, array, DataFrame or nested list."""
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(data, pandas.DataFrame):
        dtypes = list(data.dtypes)
        if (len(set(dtypes)) > 1 or any(not isinstance(dtype, np.dtype) for dtype in dtypes)) and all(
                pandas.api.types.is_numeric_dtype(dtype) for dtype in dtypes):
            # Nullable columns (Int64, Float64, boolean) hold pandas.NA, and mixed columns (bool beside
            # numbers) have no common numpy type: numpy would read either as objects.
            return data.to_numpy(dtype=np.float64, na_value=np.nan)
    if isinstance(data, np.ma.MaskedArray):
        if np.ma.count_masked(data):
            raise DataError(f"{name} is a masked array with {np.ma.count_masked(data)} masked entries, which the "
                            "models would read as data; fill or impute them (X.filled(value)) first")
        data = data.data
    if torch.is_tensor(data):
        data = data.detach().cpu()
        if data.is_floating_point() and data.dtype not in (torch.float16, torch.float32, torch.float64):
            data = data.float()  # bfloat16 and the float8 types have no numpy dtype
        return data.numpy()
    try:
        return np.asarray(data)
    except (ValueError, TypeError) as error:
        raise DataError(f"{name} cannot be read as a matrix: {error}; are its rows of different lengths?") from None


def _canonical_csr(data, name):
    """
    ``data`` as a CSR matrix whose stored values are its values: column
    indices checked (a damaged file's out-of-range index would make scipy
    write outside the matrix) and duplicate entries summed (the checks read
    the stored values).
    """
    # Duplicates are summed on conversion: not in an integer type they can overflow (bool entries stay a
    # logical or, as scipy sums them: a pair listed twice is still 1).
    if (data.dtype.kind in "iu" or data.dtype == np.float16) and not getattr(data, "has_canonical_format", False):
        data = data.astype(np.float64)
    matrix = sp.csr_matrix(data)
    try:
        matrix.check_format(full_check=True)
    except ValueError as error:
        raise DataError(f"{name} is not a valid sparse matrix ({error}); the data or its file may be damaged") from None
    if not matrix.has_canonical_format:
        matrix = matrix.copy()
        matrix.sum_duplicates()
    return matrix


def as_matrix(data, name="data"):
    """
    A 2-D float32 matrix from a numpy array, torch tensor, pandas DataFrame or
    scipy.sparse matrix: dense input becomes a CPU torch tensor, sparse input
    stays a CSR matrix (densified one minibatch at a time, never whole), a
    matrix on disk (:class:`OnDisk`) stays there.
    """
    if isinstance(data, OnDisk):
        return data
    if isinstance(data, (str, bytes, os.PathLike)):
        raise DataError(f"{name} is a path ({str(data)!r}), not data: read it first (np.load, pandas.read_csv, "
                        "anndata.read_h5ad, or pyro_sparse.io.anndata.read_backed to keep it on disk), or pass the "
                        "file to the command line's --data")
    if torch.is_tensor(data) and data.layout != torch.strided:  # a torch sparse tensor: as scipy's
        if data.dim() != 2:
            raise DataError(f"{name} must be a 2-D (data points x features) matrix, got a {data.dim()}-D sparse tensor")
        if data.layout == torch.sparse_coo and data.dense_dim() > 0:
            raise DataError(f"{name} is a hybrid sparse tensor (dense values per entry); pass data.to_dense() or a "
                            "sparse tensor with one value per entry")
        # Duplicates are summed by coalesce: widen integer counts first, so that they cannot overflow their
        # type (bool entries stay a logical or), and half-precision values reach scipy, which has no float16,
        # as float32.
        coo = data.detach().cpu().to_sparse_coo()
        if coo.dtype in (torch.float16, torch.bfloat16):
            coo = coo.to(torch.float32)
        elif not coo.is_floating_point() and coo.dtype != torch.bool:
            coo = coo.to(torch.float64)
        coo = coo.coalesce()
        data = sp.coo_matrix((coo.values().numpy(), tuple(coo.indices().numpy())), shape=tuple(coo.shape))
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(data, pandas.DataFrame) and data.shape[1] and all(
            isinstance(dtype, pandas.SparseDtype) and dtype.fill_value == 0 for dtype in data.dtypes):
        if any(dtype.subtype == np.float16 for dtype in data.dtypes):  # scipy.sparse has no float16
            data = data.astype(pandas.SparseDtype(np.float32, 0))
        data = data.sparse.to_coo()  # a DataFrame of sparse columns stays sparse
    if sp.issparse(data):
        original = _canonical_csr(data, name)
        values, shape = original.data, original.shape
    else:
        original = _values(data, name)
        values, shape = original, original.shape
    if values.dtype.kind == "c":
        raise DataError(f"{name} has complex values; pass their real part (X.real) or modulus (np.abs(X))")
    if values.dtype.kind not in "biuf":
        raise DataError(
            f"{name} must be numeric, got dtype {values.dtype}; encode categorical columns and fill "
            "missing values, then convert it with np.asarray(X, dtype=float)"
        )
    if len(shape) != 2:
        raise DataError(
            f"{name} must be a 2-D (data points x features) matrix, got {len(shape)}-D; "
            "reshape a single feature with X.reshape(-1, 1) or a single point with X.reshape(1, -1)"
        )
    if shape[0] == 0 or shape[1] == 0:
        raise DataError(f"{name} is empty: shape {tuple(shape)}")
    if not np.all(np.isfinite(values)):
        raise DataError(f"{name} contains NaN or infinite values; remove or impute them first")
    if values.size and np.abs(values).max() > np.finfo(np.float32).max:
        raise DataError(f"{name} has values too large for float32 (|x| > 3.4e38); rescale it first")
    if values.dtype.kind == "f" and values.dtype.itemsize > 4:
        # A non-zero value must not become 0 (and change which likelihoods accept it).
        magnitudes = np.abs(values)
        if np.any((magnitudes > 0) & (magnitudes < np.finfo(np.float32).tiny)):
            raise DataError(f"{name} has non-zero values too small for float32 (|x| < 1.2e-38); rescale it first")
    if sp.issparse(original):
        return original.astype(np.float32)
    matrix = original.astype(np.float32, copy=False)
    # torch shares a writable array's memory; a read-only one (a memory map, a frozen array) is copied.
    return torch.as_tensor(matrix if matrix.flags.writeable else matrix.copy())


def feature_names_of(data):
    """The column names of a pandas DataFrame when all are strings (as scikit-learn), else None."""
    # pandas is never imported here: a DataFrame exists only once its user has imported it.
    pandas = sys.modules.get("pandas")
    if pandas is None or not isinstance(data, pandas.DataFrame):
        return None
    names = list(data.columns)
    return names if all(isinstance(name, str) for name in names) else None


def check_feature_names(names, trained, name="X", selection=None):
    """
    Named features of new data must be the training features, in the training
    order; ``selection`` is the expression that fixes it (default: column
    selection, ``X[fitted.config['feature_names']]``).
    """
    if names is None or trained is None or list(names) == list(trained):
        return
    selection = selection or f"{name}[fitted.config['feature_names']]"
    missing = [feature for feature in trained if feature not in set(names)]
    if missing:
        problem = f"lacks {len(missing)} of the model's features, e.g. {missing[:5]}"
    elif len(names) != len(trained):
        unknown = [feature for feature in names if feature not in set(trained)]
        problem = f"has {len(unknown)} features the model was not trained on, e.g. {unknown[:5]}"
    else:
        j = next(j for j, (new, old) in enumerate(zip(names, trained)) if new != old)
        problem = f"orders them differently (column {j} is {names[j]!r}, the model's feature {j} is {trained[j]!r})"
    raise DataError(
        f"the columns of {name} do not match the features the model was trained on: {name} {problem}; "
        f"select and order them with {selection}"
    )


# float32 holds every integer up to 2^24 exactly, and only every other one beyond.
FLOAT32_EXACT_INTEGERS = 2**24

# Likelihoods whose data are counts: every row needs at least one (its total scales the row).
COUNT_DATA = ("multinomial", "poisson", "negative_binomial", "zinb")


def _rows_where(matrix, test):
    """'k rows (e.g. row i)': the rows of a dense tensor or scipy.sparse matrix holding a value ``test`` flags."""
    if sp.issparse(matrix):
        coo = matrix.tocoo()
        rows = np.unique(coo.row[test(coo.data)])
    else:
        rows = np.flatnonzero(test(matrix.numpy()).any(1))
    return f"{_rows(len(rows))} (e.g. row {int(rows[0])})"


def _rows(count):
    return f"{count} row{'s' if count != 1 else ''}"


def check_values(matrix, likelihood, name="data"):
    """Reject values the likelihood gives no density to (of a matrix on disk: as they are read)."""
    if isinstance(matrix, OnDisk):
        return
    values = matrix.data if sp.issparse(matrix) else matrix.numpy()
    if likelihood in COUNT_DATA:
        if np.any(values < 0):
            raise DataError(f"{name} has negative values in {_rows_where(matrix, lambda v: v < 0)}; the "
                            f"{likelihood} likelihood needs counts >= 0")
        if np.any(values != np.round(values)):
            raise DataError(
                f"{name} has non-integer values in {_rows_where(matrix, lambda v: v != np.round(v))}; the "
                f"{likelihood} likelihood needs integer counts (raw counts, not normalised or log-transformed values)"
            )
        if values.size and values.max() >= FLOAT32_EXACT_INTEGERS:
            warnings.warn(
                f"{name} has counts of {FLOAT32_EXACT_INTEGERS:,} (2^24) or more, which float32, the precision the "
                "models compute in, rounds to a multiple of 2 or more: such counts are fitted rounded, and a "
                "fractional value among them cannot be told from a count",
                UserWarning,
                stacklevel=3,
            )
        row_totals = np.asarray(matrix.sum(1)).ravel()
        if np.any(row_totals == 0):
            raise DataError(
                f"{name} has {_rows(int(np.sum(row_totals == 0)))} with no counts; the {likelihood} likelihood "
                "needs at least one count per row, whose total scales it (drop the empty rows: cells without "
                "counts, e.g. scanpy.pp.filter_cells(adata, min_counts=1), or documents without words)"
            )
    elif likelihood == "bernoulli" and not np.all((values == 0) | (values == 1)):
        raise DataError(f"{name} has values outside {{0, 1}} in {_rows_where(matrix, lambda v: (v != 0) & (v != 1))}; "
                        "the bernoulli likelihood needs binary data")


def check_training_data(summary, likelihood):
    """What every SVI model needs of its training data, beyond valid values."""
    if summary.num_data < 2:
        raise DataError(
            f"the training data has {summary.num_data} data point; a model needs at least 2 "
            "(with validation_fraction > 0, at least 2 must remain for training)"
        )
    largest = float(summary.feature_variances.max())
    if largest == 0:
        raise DataError("every feature is constant (all data points are equal): there is nothing to fit")
    low, high = VARIANCE_RANGE
    if largest > high or (likelihood == "gaussian" and largest < low):
        raise DataError(
            f"the largest feature variance is {largest:.3g}, outside the range [{low:g}, {high:g}] that "
            "float32 training can represent; rescale the data, e.g. divide each feature by its standard deviation"
        )


def check_units(matrix, loc, scale, name="X"):
    """
    New real-valued data must be on the scale of the training data: no value
    more than ``MAX_STANDARDIZED_VALUE`` of the encoder's feature scales from
    its feature means (``loc``, ``scale``: the encoder's input standardisation).
    """
    if isinstance(matrix, OnDisk):
        high, low = matrix.column_range()
    elif sp.issparse(matrix):  # column extremes count the implicit zeros
        high, low = matrix.max(0).toarray().ravel(), matrix.min(0).toarray().ravel()
    else:
        high, low = matrix.amax(0).numpy(), matrix.amin(0).numpy()
    loc, scale = np.asarray(loc, dtype=np.float64), np.asarray(scale, dtype=np.float64)
    distance = np.maximum(np.abs(high - loc), np.abs(low - loc)) / scale
    j = int(np.argmax(distance))
    if distance[j] > MAX_STANDARDIZED_VALUE:
        raise DataError(
            f"{name} has values {distance[j]:.3g} training standard deviations from the training mean "
            f"(feature {j}); give the model data in the units it was trained on"
        )


