"""The data as models and the training loop see it: validated once, then split and cut into minibatches."""

import functools
import hashlib
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
import torch

from pyro_sparse.data.backed import BackedMatrix
from pyro_sparse.data.validation import DataError, as_matrix, check_values, feature_names_of

# Rows of an in-memory sparse matrix hashed at a time (add_to_hash): a block's copy, not the matrix's.
HASH_ROWS = 65536


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
            # Two passes in float64 over the stored entries; the implicit zeros each add mean².
            entries = matrix.tocoo()
            num_data, num_features = matrix.shape
            mean = np.bincount(entries.col, weights=entries.data.astype(np.float64), minlength=num_features) / num_data
            residuals = entries.data - mean[entries.col]
            zeros = num_data - np.bincount(entries.col, minlength=num_features)
            variance = (np.bincount(entries.col, weights=residuals**2, minlength=num_features) + zeros * mean**2) / num_data
        else:
            variance, mean = torch.var_mean(matrix.double(), dim=0, correction=0)
            mean, variance = mean.numpy(), variance.numpy()
        return cls(matrix.shape[0], matrix.shape[1], mean, np.maximum(variance, 0.0))


class Batch(NamedTuple):
    """
    One minibatch: the (B, G) values ``x``, and where the data have them the
    (B, C) ``covariates`` and the (B,) observed library sizes ``library``.
    Models and guides take ``x`` and the others as keywords (:attr:`kwargs`).
    """

    x: torch.Tensor
    covariates: torch.Tensor = None
    library: torch.Tensor = None

    @property
    def kwargs(self):
        """The keyword arguments of a model or guide call: the covariates and library sizes the data have."""
        return {name: value for name, value in (("covariates", self.covariates), ("library", self.library))
                if value is not None}


class Dataset:
    """
    An (N, G) data matrix checked for one likelihood: a CPU float32 tensor,
    or a CSR matrix that is densified one minibatch at a time and never
    whole, in memory or on disk (a :class:`~pyro_sparse.data.backed.BackedMatrix`,
    read in blocks and checked as it is read).  Build one from user input
    with :meth:`from_data`; the constructor trusts its arguments.

    :param matrix: the values, as :func:`~pyro_sparse.data.validation.as_matrix` returns them.
    :param str likelihood: the observation model the values were checked for.
    :param list feature_names: one name per column, or ``None``.
    :param str layer: the AnnData layer the values came from (``None``: ``adata.X`` or not an AnnData).
    :param covariates: (N, C) float32 tensor of covariates (see
        :class:`~pyro_sparse.data.covariates.CovariateSpec`, given as ``spec``), or ``None``.
    :param library: (N,) float32 tensor of observed library sizes (a
        ``size_factor_key`` column), or ``None``: count models then use each
        row's total count.
    """

    def __init__(self, matrix, likelihood, feature_names=None, layer=None, covariates=None, library=None,
                 spec=None):
        self.matrix, self.likelihood, self.feature_names, self.layer = matrix, likelihood, feature_names, layer
        self.covariates, self.library, self.spec = covariates, library, spec

    @classmethod
    def from_data(cls, data, likelihood, feature_names=None, layer=None, name="data", **annotations):
        """
        Validate ``data`` (array, tensor, DataFrame or scipy.sparse matrix)
        for ``likelihood``; names default to a DataFrame's string columns.
        ``annotations``: ``covariates``, ``library`` and ``spec`` as for the constructor.
        """
        matrix = as_matrix(data, name)
        check_values(matrix, likelihood, name)
        names = feature_names_of(data) if feature_names is None else list(feature_names)
        repeated = [name for name, count in Counter(map(str, names or [])).items() if count > 1]
        if repeated:
            warnings.warn(f"{len(repeated)} feature names repeat (e.g. {repeated[:5]}): the model's feature checks "
                          "and tables (top_features, loadings) cannot tell those features apart; make them unique "
                          "(e.g. adata.var_names_make_unique())", stacklevel=3)
        return cls(matrix, likelihood, names, layer, **annotations)

    def looks_like_counts(self):
        """
        Whether every value is a non-negative integer and some exceed 1 (raw
        counts rather than measurements); for data on disk, judged from the first rows.
        """
        if isinstance(self.matrix, BackedMatrix):
            values = self.matrix.read(np.arange(min(self.num_data, 10_000)), self.likelihood).data
        else:
            values = self.matrix.data if sp.issparse(self.matrix) else self.matrix.numpy()
        return bool(values.size and values.min() >= 0 and values.max() > 1 and np.all(values == np.round(values)))

    @property
    def num_data(self):
        return self.matrix.shape[0]

    @property
    def num_features(self):
        return self.matrix.shape[1]

    @functools.cached_property
    def summary(self):
        """Feature means and variances (float64), computed once (for data on disk, in one pass that checks it)."""
        if isinstance(self.matrix, BackedMatrix):
            return DataSummary(*self.matrix.shape, *self.matrix.moments(self.likelihood))
        return DataSummary.of(self.matrix)

    def add_to_hash(self, hasher):
        """
        Feed the values, in row order, and the covariates and library sizes to
        ``hasher`` (a :mod:`hashlib` object): what a resumed run compares to
        tell the data it started on from other data with the same feature
        means.  A sparse matrix is hashed as its row lengths, column indices
        and values (stored zeros dropped), each stream on its own and read in
        blocks of rows, so the same matrix gives the same hash whole or read
        from disk (one more pass over the file), without a copy of it.
        """
        streams = [hashlib.sha256() for _ in range(3)]
        if isinstance(self.matrix, BackedMatrix):
            chunks = self.matrix._chunks(self.likelihood)
        elif sp.issparse(self.matrix):
            chunks = (self.matrix[start : start + HASH_ROWS] for start in range(0, self.num_data, HASH_ROWS))
        else:
            chunks = [self.matrix]
        for chunk in chunks:
            if sp.issparse(chunk):
                chunk = sp.csr_matrix(chunk, copy=True)  # one block: sorted, unique, non-zero entries
                chunk.sum_duplicates()
                chunk.eliminate_zeros()
                parts = (np.diff(chunk.indptr), chunk.indices.astype(np.int64), chunk.data.astype(np.float32))
            else:
                parts = (None, None, chunk.numpy())
            for stream, part in zip(streams, parts):
                if part is not None:
                    stream.update(np.ascontiguousarray(part))
        for stream in streams:
            hasher.update(stream.digest())
        for values in (self.covariates, self.library):
            if values is not None:
                hasher.update(np.ascontiguousarray(values.numpy()))

    def rows(self, index, device="cpu"):
        """Rows ``index`` (an integer array) as a :class:`Batch` of dense float32 tensors on ``device``."""
        if isinstance(self.matrix, BackedMatrix):
            x = torch.as_tensor(self.matrix.read(index, self.likelihood).toarray(), device=device)
        elif sp.issparse(self.matrix):
            x = torch.as_tensor(self.matrix[index].toarray(), device=device)
        else:
            x = self.matrix[torch.as_tensor(index)].to(device)
        index = torch.as_tensor(index)
        extra = [None if values is None else values[index].to(device) for values in (self.covariates, self.library)]
        return Batch(x, *extra)

    def minibatches(self, batch_size, generator=None, device="cpu", shuffle=True):
        """The rows as :class:`Batch` objects, in an order drawn from ``generator`` (or in order)."""
        order = self.epoch_order(batch_size, generator) if shuffle else torch.arange(self.num_data)
        for start in range(0, self.num_data, batch_size):
            yield self.rows(order[start : start + batch_size].numpy(), device)

    def epoch_order(self, batch_size, generator=None):
        """
        The row order of one epoch, cut into minibatches of ``batch_size`` by
        the caller: a uniform permutation, or for data on disk shuffled blocks
        of rows (:meth:`~pyro_sparse.data.backed.BackedMatrix.epoch_order`).
        """
        if isinstance(self.matrix, BackedMatrix):
            return self.matrix.epoch_order(batch_size, generator)
        return torch.randperm(self.num_data, generator=generator)

    def subset(self, index):
        """The rows ``index`` (sorted integer array) as a new Dataset."""
        if isinstance(self.matrix, BackedMatrix):
            matrix = self.matrix.subset(index)
        else:
            matrix = self.matrix[index] if sp.issparse(self.matrix) else self.matrix[torch.as_tensor(index)]
        extra = [None if values is None else values[torch.as_tensor(index)]
                 for values in (self.covariates, self.library)]
        return Dataset(matrix, self.likelihood, self.feature_names, self.layer, *extra, spec=self.spec)

    def split(self, validation_fraction, generator):
        """(training, validation) rows drawn at random; validation is ``None`` for a fraction of 0."""
        if validation_fraction == 0:
            return self, None
        num_validation = max(1, int(round(validation_fraction * self.num_data)))
        if num_validation >= self.num_data:
            raise DataError(f"validation_fraction={validation_fraction} leaves no training data")
        order = torch.randperm(self.num_data, generator=generator).numpy()
        return self.subset(np.sort(order[num_validation:])), self.subset(np.sort(order[:num_validation]))
