"""
Data larger than memory: a CSR matrix in an HDF5 file, read from disk in
pieces.  :class:`BackedMatrix` stands where a :class:`~pyro_sparse.data.Dataset`
holds its matrix in memory (``adata.X`` of ``anndata.read_h5ad(path,
backed="r")``, or a layer of :func:`pyro_sparse.io.anndata.read_backed`), and
models see the same minibatches of dense float32 rows.

Reading.  The row pointers (8 bytes a row) are read once; values and column
indices are read as slices of contiguous rows, one HDF5 read per array (for
rows asked for outside the epoch's blocks, rows less than a block apart
share a slice).  Reading rows
one at a time is slow: a few thousand rows/s against hundreds of thousands
for slices of a few hundred rows (benchmarks/results/backed_data.md).

Shuffling.  Each epoch the rows are cut into blocks of contiguous rows
(about ``BLOCK_BYTES`` stored each); the blocks are shuffled and taken
``window_blocks`` at a time (about ``WINDOW_BYTES``), the rows of each such
window are shuffled and cut into minibatches, and each minibatch is sorted
by row (:func:`block_order`).  Every row is seen once per epoch, as with a
uniform permutation, but a minibatch draws its rows from the blocks of one
window, not from the whole file: where neighbouring rows of the file are
alike (a file sorted by cell type or batch) minibatch means vary more than
under a uniform permutation: for a minibatch of b rows from a window of m
blocks, their variance grows by a factor of about 1 + ρ (b - 1) / m (ρ: the
share of a feature's variance that lies between blocks; at most 1.25 for
b = 512 with the default sizes).  A block is read when a minibatch first needs it
and kept with its window, at most two windows at a time.  Under torchrun
each rank takes a contiguous slice of each sorted global minibatch, so it
reads about its share of each window's blocks.  The block order is drawn
from the minibatch generator, whose state checkpoints hold: a resumed run
sees the order it would have seen.

Checks.  Everything read is checked as data in memory are
(:func:`~pyro_sparse.data.validation.as_matrix`,
:func:`~pyro_sparse.data.validation.check_values`), with the file and rows
in the message.  Feature means and variances come from one streaming pass
over the file (:meth:`BackedMatrix.moments`), which checks every row,
validation rows included.  Before each read the file's size, modification
time and inode are compared with those at the start: a file rewritten or
truncated meanwhile fails with an error naming it, before any of its new
bytes are used (a checkpoint written earlier holds the run up to then).
"""

import collections
import os

import numpy as np
import scipy.sparse as sp
import torch

from pyro_sparse.data.validation import DataError, OnDisk, as_matrix, check_values

BLOCK_BYTES = 2**16  # stored values and column indices per block: one HDF5 read of each array
WINDOW_BYTES = 2**27  # per window of blocks: the rows a minibatch is drawn from
PASS_BYTES = 2**25  # per chunk of a streaming pass


def stored_on_disk(matrix):
    """Whether an AnnData matrix stays in its file: anndata's on-disk sparse datasets and backed dense arrays."""
    sparse_on_disk = getattr(matrix, "format", None) in ("csr", "csc") and hasattr(matrix, "group")
    return sparse_on_disk or (type(matrix).__module__.startswith("h5py") and getattr(matrix, "ndim", 0) == 2)


def _segments(starts, lengths):
    """The indices of the ranges [starts[i], starts[i] + lengths[i]), one after another."""
    lengths = np.asarray(lengths, dtype=np.int64)
    offsets = np.cumsum(lengths) - lengths
    return np.repeat(np.asarray(starts, dtype=np.int64) - offsets, lengths) + np.arange(lengths.sum())


def block_order(num_rows, block_rows, window_blocks, batch_size, generator):
    """
    One epoch's row order for data read in blocks: blocks of ``block_rows``
    contiguous rows shuffled, the rows of every ``window_blocks`` of them
    shuffled together, each minibatch of ``batch_size`` rows sorted.  Returns
    the order (a tensor) and the shuffled block indices.
    """
    num_blocks = -(-num_rows // block_rows)
    blocks = torch.randperm(num_blocks, generator=generator).numpy()
    pieces = []
    for first in range(0, num_blocks, window_blocks):
        starts = blocks[first : first + window_blocks] * block_rows
        rows = _segments(starts, np.minimum(starts + block_rows, num_rows) - starts)
        pieces.append(rows[torch.randperm(len(rows), generator=generator).numpy()])
    order = np.concatenate(pieces)
    for start in range(0, num_rows, batch_size):
        order[start : start + batch_size].sort()
    return torch.from_numpy(order), blocks


class _Store:
    """One CSR group of an open HDF5 file: its row pointers, slices of its values, and the file's identity."""

    def __init__(self, group, shape, where):
        self.shape = shape
        self.path = group.file.filename
        self.where = f"{where} of {self.path!r}"
        self.signature = self._readable_stat()
        expected = group.file.id.get_filesize()  # where the HDF5 file ends, as written
        if self.signature[0] < expected:
            raise DataError(f"the backed file {self.path!r} is truncated: {self.signature[0]} bytes on disk, "
                            f"{expected} written; write it again or copy it whole")
        self.bytes_read = 0  # values, column indices and row pointers read so far
        self._indptr = None
        self._arrays = {name: group[name] for name in ("data", "indices", "indptr")}
        shapes = {name: array.shape for name, array in self._arrays.items()}
        if any(len(shape) != 1 for shape in shapes.values()) or shapes["data"] != shapes["indices"]:
            raise DataError(f"{self.where} is not a valid CSR matrix: its data, indices and indptr must be 1-D, "
                            f"data and indices of one length (got {shapes}); is the file damaged?")
        self.nnz = self._arrays["data"].shape[0]
        self.bytes_per_value = self._arrays["data"].dtype.itemsize + self._arrays["indices"].dtype.itemsize

    def _stat(self):
        status = os.stat(self.path)
        return status.st_size, status.st_mtime_ns, status.st_ino

    def _readable_stat(self):
        try:
            return self._stat()
        except OSError as error:  # moved or deleted after AnnData opened it
            raise DataError(f"the backed file {self.path!r} can no longer be read: {error}") from None

    def check_unchanged(self):
        """Fail if the file is not the one training started with (size, modification time, inode)."""
        now = self._readable_stat()
        if now != self.signature:
            changed = [name for name, old, new in zip(("size", "modification time", "inode"), self.signature, now)
                       if old != new]
            raise DataError(
                f"the backed file {self.path!r} changed while in use ({', '.join(changed)}: size {self.signature[0]} "
                f"-> {now[0]} bytes); was it rewritten or truncated? Train again on the file as it is now "
                "(a checkpoint written before the change holds the run up to then)"
            )

    def _read(self, name, selection):
        array = self._arrays[name]
        if not array.id.valid:
            raise DataError(f"the file of {self.where} is closed; open it again (anndata.read_h5ad(path, backed='r'))")
        try:
            return array[selection]
        except OSError as error:
            raise DataError(f"cannot read {self.where}: {error}; is the file truncated or damaged?") from None

    @property
    def indptr(self):
        """The row pointers as int64, read once and checked against the number of stored values."""
        if self._indptr is None:
            self.check_unchanged()
            indptr = self._read("indptr", slice(None)).astype(np.int64)
            self.bytes_read += indptr.nbytes
            if len(indptr) != self.shape[0] + 1 or indptr[-1] != self.nnz or np.any(np.diff(indptr) < 0):
                raise DataError(
                    f"{self.where} is not a valid CSR matrix ({len(indptr) - 1} row pointers for {self.shape[0]} "
                    f"rows, last {indptr[-1]} for {self.nnz} stored values); is the file damaged?"
                )
            self._indptr = indptr
        return self._indptr

    def values(self, starts, stops):
        """The values and column indices of the value ranges [starts[i], stops[i]), one after another."""
        self.check_unchanged()
        pieces = [(self._read("data", slice(a, b)), self._read("indices", slice(a, b))) for a, b in zip(starts, stops)]
        values, indices = (np.concatenate(parts) for parts in zip(*pieces))
        self.bytes_read += values.nbytes + indices.nbytes
        return values, indices


class BackedMatrix(OnDisk):
    """
    An (N, G) CSR matrix in an HDF5 file, or a sorted subset of its rows,
    read in pieces (see the module's description).  Build one with :meth:`of`.

    :param store: the file's matrix.
    :param rows: the rows of the file this matrix holds, sorted (``None``: all).
    """

    def __init__(self, store, rows=None):
        self.store, self.rows = store, rows
        self.shape = (store.shape[0] if rows is None else len(rows), store.shape[1])
        self.row_bytes = max(store.nnz / max(store.shape[0], 1), 1.0) * store.bytes_per_value  # stored, on average
        self.block_rows = int(np.clip(BLOCK_BYTES // self.row_bytes, 1, max(self.shape[0], 1)))
        self.window_blocks = max(1, int(WINDOW_BYTES // (self.block_rows * self.row_bytes)))
        self._blocks = self._window_of = None  # the epoch's block order, from epoch_order
        self._windows = collections.OrderedDict()

    @classmethod
    def of(cls, matrix, where):
        """The matrix of an AnnData that stays on disk (:func:`stored_on_disk`), named ``where`` in messages."""
        group = getattr(matrix, "group", None)
        if group is None:
            raise DataError(
                f"{where} is stored dense on disk, which pyro_sparse does not read in pieces; load it with "
                "adata = adata.to_memory(), or store it as a CSR matrix (scipy.sparse.csr_matrix)"
            )
        if matrix.format != "csr":
            raise DataError(
                f"{where} is stored on disk as {matrix.format.upper()}, whose rows cannot be read one minibatch at a "
                f"time; store it as CSR ({where} = {where}.tocsr() before writing) or load it with adata.to_memory()"
            )
        if not type(group).__module__.startswith("h5py"):
            raise DataError(f"{where} is in a {type(group).__module__.split('.')[0]} store; backed training reads "
                            ".h5ad (HDF5) files: load it with adata.to_memory() or write it with adata.write_h5ad")
        return cls(_Store(group, tuple(int(size) for size in matrix.shape), where))

    @property
    def bytes_read(self):
        """Bytes read from the file so far, by this matrix and every subset of the same file."""
        return self.store.bytes_read

    def subset(self, positions):
        """The rows ``positions`` (a sorted integer array) as a BackedMatrix of the same file."""
        positions = np.asarray(positions, dtype=np.int64)
        return BackedMatrix(self.store, positions if self.rows is None else self.rows[positions])

    def _file_rows(self, positions):
        return positions if self.rows is None else self.rows[positions]

    # ------------------------------------------------------------ reading

    def read(self, positions, likelihood):
        """Rows ``positions`` (integer array) as a float32 CSR matrix, checked for ``likelihood``."""
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size == 0:
            return sp.csr_matrix((0, self.shape[1]), dtype=np.float32)
        steps = np.diff(positions)
        if np.any(steps < 0):
            order = np.argsort(positions, kind="stable")
            return self.read(positions[order], likelihood)[np.argsort(order)]
        if self._blocks is not None and np.any(steps != 1):
            windows = self._window_of[positions // self.block_rows]
            if len(np.unique(windows)) <= 2:
                return self._from_windows(positions, windows, likelihood)
        return self._read_file_rows(self._file_rows(positions), likelihood, gap_bytes=BLOCK_BYTES)

    def _read_file_rows(self, file_rows, likelihood, gap_bytes=0):
        """
        Sorted rows of the file, checked; rows less than ``gap_bytes`` apart
        are read in one slice, and rows spread over more than ``PASS_BYTES``
        in pieces of about that size, which bounds the memory a read takes.
        """
        indptr = self.store.indptr
        starts, stops = indptr[file_rows], indptr[file_rows + 1]
        piece = starts // max(1, PASS_BYTES // self.store.bytes_per_value)
        if piece[0] != piece[-1]:
            pieces = np.split(file_rows, np.flatnonzero(np.diff(piece)) + 1)
            return sp.vstack([self._read_file_rows(rows, likelihood, gap_bytes) for rows in pieces], format="csr")
        lengths = stops - starts
        breaks = np.flatnonzero(starts[1:] - stops[:-1] > gap_bytes // self.store.bytes_per_value) + 1
        first, last = np.r_[0, breaks], np.r_[breaks - 1, len(file_rows) - 1]
        values, indices = self.store.values(starts[first], stops[last])
        adjacent = starts[1:] == stops[:-1]
        adjacent[breaks - 1] = True
        if not adjacent.all():  # slices that span rows not asked for, or repeat rows: keep the rows asked for
            spans = stops[last] - starts[first]
            in_slice = np.repeat(np.arange(len(first)), last - first + 1)
            begins = (np.cumsum(spans) - spans)[in_slice] + starts - starts[first][in_slice]
            keep = _segments(begins, lengths)
            values, indices = values[keep], indices[keep]
        csr = sp.csr_matrix((values, indices, np.r_[0, np.cumsum(lengths)]), shape=(len(file_rows), self.shape[1]))
        name = f"{self.store.where} (rows {file_rows[0]}-{file_rows[-1]})"
        csr = as_matrix(csr, name)
        check_values(csr, likelihood, name)
        return csr

    def epoch_order(self, batch_size, generator):
        """One epoch's row order (:func:`block_order`); minibatches of it are then read window by window."""
        order, self._blocks = block_order(self.shape[0], self.block_rows, self.window_blocks, batch_size, generator)
        self._window_of = np.empty(len(self._blocks), dtype=np.int64)
        self._window_of[self._blocks] = np.arange(len(self._blocks)) // self.window_blocks
        self._windows.clear()
        return order

    def _from_windows(self, positions, windows, likelihood):
        parts = [self._window(w).rows(positions[windows == w], likelihood) for w in np.unique(windows)]
        if len(parts) == 1:
            return parts[0]
        # A minibatch across two windows: its rows back in the order asked for.
        return sp.vstack(parts, format="csr")[np.argsort(np.argsort(windows, kind="stable"))]

    def _window(self, index):
        if index not in self._windows:
            if len(self._windows) == 2:
                self._windows.popitem(last=False)
            blocks = self._blocks[index * self.window_blocks : (index + 1) * self.window_blocks]
            self._windows[index] = _Window(self, np.sort(blocks))
        self._windows.move_to_end(index)
        return self._windows[index]

    # ------------------------------------------------------------ streaming passes

    def _chunks(self, likelihood):
        """This matrix's rows in chunks of about ``PASS_BYTES``, in file order; every row of the file is checked."""
        num_file_rows = self.store.shape[0]
        chunk = max(1, int(PASS_BYTES // self.row_bytes))
        for first in range(0, num_file_rows, chunk):
            last = min(num_file_rows, first + chunk)
            rows = self._read_file_rows(np.arange(first, last), likelihood)
            if self.rows is None:
                yield rows
                continue
            low, high = np.searchsorted(self.rows, [first, last])
            if high > low:
                yield rows[self.rows[low:high] - first]

    def moments(self, likelihood):
        """
        Feature means and variances (float64) from one pass over the file, which
        checks it for ``likelihood``.  Each chunk's centred sums are combined as
        Chan et al. (1979) do, since E[x²] − E[x]² cancels for values far from 0.
        """
        num_features = self.shape[1]
        count, mean, m2 = 0, np.zeros(num_features), np.zeros(num_features)
        for chunk in self._chunks(likelihood):
            rows = chunk.shape[0]
            if rows == 0:
                continue
            values = chunk.data.astype(np.float64)
            chunk_mean = np.bincount(chunk.indices, values, minlength=num_features) / rows
            stored = np.bincount(chunk.indices, minlength=num_features)  # the rest are implicit zeros
            chunk_m2 = (np.bincount(chunk.indices, (values - chunk_mean[chunk.indices]) ** 2, minlength=num_features)
                        + (rows - stored) * chunk_mean**2)
            delta, total = chunk_mean - mean, count + rows
            mean = mean + delta * rows / total
            m2 = m2 + chunk_m2 + delta**2 * count * rows / total
            count = total
        return mean, m2 / max(count, 1)

    def column_range(self):
        """Each feature's largest and smallest value (implicit zeros included), from one pass over the file."""
        high, low = np.full(self.shape[1], -np.inf), np.full(self.shape[1], np.inf)
        for chunk in self._chunks("gaussian"):
            high = np.maximum(high, chunk.max(0).toarray().ravel())
            low = np.minimum(low, chunk.min(0).toarray().ravel())
        return high, low


class _Window:
    """The rows of one window's blocks, each block read when a minibatch first needs it."""

    def __init__(self, matrix, blocks):
        self.matrix, self.blocks = matrix, blocks
        starts = blocks * matrix.block_rows
        sizes = np.minimum(starts + matrix.block_rows, matrix.shape[0]) - starts
        self.positions = _segments(starts, sizes)
        self.block_first = np.r_[0, np.cumsum(sizes)]  # each block's first row in the window
        self.file_rows = matrix._file_rows(self.positions)
        indptr = matrix.store.indptr
        self.lengths = indptr[self.file_rows + 1] - indptr[self.file_rows]
        self.indptr = np.r_[0, np.cumsum(self.lengths)]
        self.values = np.zeros(self.indptr[-1], dtype=np.float32)
        self.indices = np.zeros(self.indptr[-1], dtype=np.int32 if matrix.shape[1] < 2**31 else np.int64)
        self.loaded = np.zeros(len(blocks), dtype=bool)

    def rows(self, positions, likelihood):
        local = np.searchsorted(self.positions, positions)
        blocks = np.searchsorted(self.blocks, positions // self.matrix.block_rows)
        missing = np.unique(blocks[~self.loaded[blocks]])
        if missing.size:
            rows = _segments(self.block_first[missing], self.block_first[missing + 1] - self.block_first[missing])
            read = self.matrix._read_file_rows(self.file_rows[rows], likelihood)
            # Reading sums a row's repeated column indices (valid CSR): it may hold fewer entries than its slot.
            self.lengths[rows] = np.diff(read.indptr)
            into = _segments(self.indptr[rows], self.lengths[rows])
            self.values[into], self.indices[into] = read.data, read.indices
            self.loaded[missing] = True
        take = _segments(self.indptr[local], self.lengths[local])
        return sp.csr_matrix((self.values[take], self.indices[take], np.r_[0, np.cumsum(self.lengths[local])]),
                             shape=(len(local), self.matrix.shape[1]))
