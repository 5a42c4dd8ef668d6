"""Data entering the library: conversion, validation and minibatches."""

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch


class DataError(ValueError):
    """Data that a model cannot be fitted to or evaluated on, with the reason."""


def as_matrix(data, name="data"):
    """
    A 2-D float32 matrix from a numpy array, torch tensor or scipy.sparse
    matrix: dense input becomes a CPU torch tensor, sparse input stays a CSR
    matrix (densified one minibatch at a time, never whole).
    """
    if sp.issparse(data):
        original = sp.csr_matrix(data)
        values, shape = original.data, original.shape
    else:
        if torch.is_tensor(data):
            data = data.detach().cpu().numpy()
        original = np.asarray(data)
        values, shape = original, original.shape
    if not (np.issubdtype(values.dtype, np.number) or values.dtype == bool):
        raise DataError(f"{name} must be numeric, got dtype {values.dtype}")
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
    if sp.issparse(original):
        return original.astype(np.float32)
    return torch.as_tensor(original.astype(np.float32, copy=False))


def check_values(matrix, likelihood, name="data"):
    """Reject values the likelihood gives no density to."""
    values = matrix.data if sp.issparse(matrix) else matrix.numpy()
    if likelihood == "multinomial":
        if np.any(values < 0):
            raise DataError(f"{name} has negative values; the multinomial likelihood needs counts >= 0")
        if np.any(values != np.round(values)):
            raise DataError(f"{name} has non-integer values; the multinomial likelihood needs integer counts")
        row_totals = np.asarray(matrix.sum(1)).ravel()
        if np.any(row_totals == 0):
            raise DataError(
                f"{name} has {int(np.sum(row_totals == 0))} rows with no counts; "
                "the multinomial likelihood needs at least one count per row"
            )
    elif likelihood == "bernoulli" and not np.all((values == 0) | (values == 1)):
        raise DataError(f"{name} has values outside {{0, 1}}; the bernoulli likelihood needs binary data")


def check_constant_features(summary):
    """The Gaussian noise prior is calibrated from feature variances (Appendix C.2): none may be 0."""
    constant = np.flatnonzero(summary.feature_variances == 0)
    if constant.size:
        raise DataError(
            f"{constant.size} feature(s) are constant (zero variance), e.g. {constant[:10].tolist()}; "
            "drop them before fitting a gaussian likelihood"
        )


@dataclass(frozen=True)
class DataSummary:
    """What models need to know about the training data before fitting."""

    num_data: int
    num_features: int
    feature_means: np.ndarray
    feature_variances: np.ndarray

    @classmethod
    def of(cls, matrix):
        if sp.issparse(matrix):
            mean = np.asarray(matrix.mean(0)).ravel()
            variance = np.asarray(matrix.multiply(matrix).mean(0)).ravel() - mean**2
        else:
            variance, mean = torch.var_mean(matrix.double(), dim=0, correction=0)
            mean, variance = mean.numpy(), variance.numpy()
        return cls(matrix.shape[0], matrix.shape[1], mean, np.maximum(variance, 0.0))


def rows(matrix, index, device):
    """Rows ``index`` as a dense float32 tensor on ``device``."""
    if sp.issparse(matrix):
        return torch.as_tensor(matrix[index].toarray(), device=device)
    return matrix[torch.as_tensor(index)].to(device)


def minibatches(matrix, batch_size, generator=None, device="cpu", shuffle=True):
    """Yield dense minibatches of the rows of ``matrix``."""
    num_data = matrix.shape[0]
    order = torch.randperm(num_data, generator=generator) if shuffle else torch.arange(num_data)
    for start in range(0, num_data, batch_size):
        yield rows(matrix, order[start : start + batch_size].numpy(), device)


def split(matrix, validation_fraction, generator):
    """Random train/validation split of the rows."""
    num_data = matrix.shape[0]
    if validation_fraction == 0:
        return matrix, None
    num_validation = max(1, int(round(validation_fraction * num_data)))
    if num_validation >= num_data:
        raise DataError(f"validation_fraction={validation_fraction} leaves no training data")
    order = torch.randperm(num_data, generator=generator).numpy()
    take = (lambda idx: matrix[idx]) if sp.issparse(matrix) else (lambda idx: matrix[torch.as_tensor(idx)])
    return take(np.sort(order[num_validation:])), take(np.sort(order[:num_validation]))
