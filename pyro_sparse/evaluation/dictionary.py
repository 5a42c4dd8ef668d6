r"""
Diagnostics of a learned sparse-coding dictionary A (G x K, atoms in columns)
and of codes Z (N x K), as a sparse-coding user reads them (Fallah & Rozell
2022, Sec. 4.1; Olshausen & Field 1996):

* :func:`code_density`: the fraction of non-zero codes, overall and per atom;
* :func:`dead_atoms`: atoms that (almost) no data point uses;
* :func:`coherence`: the largest and the mean absolute cosine between two
  different atoms (mutual coherence; 1 for a repeated atom);
* :func:`dictionary_grid`: the atoms as square image tiles, for a figure;
* :func:`sparse_coding_report`: all of these for given codes, the objective
  of Eq. 10, and FISTA's re-coding of the same data with the same A, which
  scores the dictionary alone.

The objective is the per-point part of Eq. 10 in the scaling of
:func:`~pyro_sparse.baselines.fista.sparse_coding_objective`,
½‖x − Az‖² + λ‖z‖₁, averaged over data points.
"""

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

from pyro_sparse.baselines.fista import fista, sparse_coding_objective


def _matrix(value, name):
    array = np.asarray(value.detach().cpu() if torch.is_tensor(value) else value, dtype=np.float64)
    if array.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array, got shape {array.shape}")
    if array.size == 0:
        raise ValueError(f"{name} is empty: shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} has non-finite values (NaN or inf)")
    return array


def code_density(codes):
    """
    (overall, per_atom): the fraction of exactly non-zero entries of ``codes``
    (N x K), and its (K,) vector of per-atom fractions.
    """
    nonzero = _matrix(codes, "codes") != 0
    return float(nonzero.mean()), nonzero.mean(axis=0)


def dead_atoms(codes, min_usage=0.0):
    """
    Indices of the atoms whose codes are non-zero for at most a fraction
    ``min_usage`` of the data points (0: atoms no point uses).
    """
    if not 0 <= min_usage < 1:
        raise ValueError(f"min_usage must be in [0, 1), got {min_usage!r}")
    return np.flatnonzero(code_density(codes)[1] <= min_usage)


def coherence(dictionary):
    """
    (largest, mean) absolute cosine between two different atoms (columns) of
    ``dictionary``; atoms of zero norm are left out. Low coherence means
    distinct atoms; a repeated atom gives 1.
    """
    A = _matrix(dictionary, "dictionary")
    peak = np.abs(A).max(0)
    A = A[:, peak > 0] / peak[peak > 0]  # first to unit peak, so that no atom's squares underflow
    A = A / np.linalg.norm(A, axis=0)
    if A.shape[1] < 2:
        raise ValueError("coherence needs at least two atoms of non-zero norm")
    cosines = np.abs(A.T @ A)[~np.eye(A.shape[1], dtype=bool)]
    return float(cosines.max()), float(cosines.mean())


def dictionary_grid(dictionary, patch_shape=None, order="norm"):
    """
    The atoms as tiles of one image, for ``matplotlib.pyplot.imshow`` (NaN
    between tiles). Each atom is reshaped (row-major) to ``patch_shape``
    (default: square, G = p²) and scaled to its largest absolute value, so
    the tiles are in [-1, 1]; ``order="norm"`` puts the atoms in decreasing
    norm, as the paper's Figs. 10-17, with atoms of equal norm (to four
    digits; all of them under ``shared_atom_norm``) in their own order, and
    ``None`` keeps their order.
    """
    A = _matrix(dictionary, "dictionary")
    G, K = A.shape
    if patch_shape is None:
        side = math.isqrt(G)
        if side * side != G:
            raise ValueError(f"atoms of {G} pixels are not square patches: pass patch_shape=(height, width)")
        patch_shape = (side, side)
    if not (isinstance(patch_shape, (tuple, list)) and len(patch_shape) == 2 and all(
            isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n > 0 for n in patch_shape)):
        raise ValueError(f"patch_shape must be two positive integers (height, width), got {patch_shape!r}")
    height, width = patch_shape
    if height * width != G:
        raise ValueError(f"patch_shape {tuple(patch_shape)} has {height * width} pixels, the atoms have {G}")
    if order not in ("norm", None):
        raise ValueError(f"order must be 'norm' or None, got {order!r}")
    norms = np.linalg.norm(A, axis=0)
    # Rounded, so that norms equal but for float rounding (shared atom norms) do not reorder the atoms.
    key = np.round(norms / norms.max(), 4) if norms.max() > 0 else norms
    atoms = np.argsort(-key, kind="stable") if order == "norm" else np.arange(K)
    columns = math.ceil(math.sqrt(K))
    rows = math.ceil(K / columns)
    grid = np.full((rows * (height + 1) + 1, columns * (width + 1) + 1), np.nan)
    for position, atom in enumerate(atoms):
        tile = A[:, atom].reshape(height, width)
        largest = np.abs(tile).max()
        r, c = divmod(position, columns)
        top, left = 1 + r * (height + 1), 1 + c * (width + 1)
        grid[top:top + height, left:left + width] = tile / largest if largest > 0 else 0.0
    return grid


@dataclass
class SparseCodingReport:
    """What :func:`sparse_coding_report` measures (objectives averaged over data points)."""

    objective: float  #: ½‖x − Az‖² + λ‖z‖₁ of the given codes
    reconstruction: float  #: ½‖x − Az‖²
    l1: float  #: ‖z‖₁
    density: float  #: fraction of non-zero codes
    atom_usage: np.ndarray  #: (K,) fraction of points using each atom
    dead_atoms: int  #: atoms no point uses
    coherence_max: float  #: :func:`coherence`; NaN with fewer than two atoms of non-zero norm
    coherence_mean: float
    mean_atom_norm: float
    fista_objective: float  #: the same objective with FISTA's codes for the same A
    fista_density: float
    zero_code_objective: float  #: ½‖x‖², the objective of z = 0

    def as_dict(self):
        """JSON-able values (the per-atom usage as a list)."""
        return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in asdict(self).items()}


def sparse_coding_report(X, dictionary, codes, lam, fista_iterations=2000, fista_tol=1e-5):
    """
    :class:`SparseCodingReport` of ``codes`` (N x K) for data ``X`` (N x G)
    and ``dictionary`` (G x K) at sparsity weight ``lam`` (Eq. 10's λ), with
    FISTA's re-coding of ``X`` by the same dictionary (up to
    ``fista_iterations``, relative tolerance ``fista_tol``) and the all-zero
    code for reference.
    """
    X, A, Z = _matrix(X, "X"), _matrix(dictionary, "dictionary"), _matrix(codes, "codes")
    if X.shape[1] != A.shape[0]:
        raise ValueError(f"the data have {X.shape[1]} features (pixels) but the dictionary's atoms have {A.shape[0]}")
    if Z.shape != (X.shape[0], A.shape[1]):
        raise ValueError(f"codes must be (N, K) = {(X.shape[0], A.shape[1])}, got {Z.shape}")
    Xt, At, Zt = (torch.as_tensor(m) for m in (X, A, Z))
    residual = 0.5 * ((Xt - Zt @ At.T) ** 2).sum(1).mean()
    density, usage = code_density(Z)
    # A collapsed dictionary (fewer than two live atoms), the failure this report diagnoses, has no coherence.
    largest, mean = coherence(A) if (np.linalg.norm(A, axis=0) > 0).sum() >= 2 else (float("nan"), float("nan"))
    recoded = fista(Xt, At, lam, num_iterations=fista_iterations, tol=fista_tol)
    return SparseCodingReport(
        objective=float(sparse_coding_objective(Xt, At, Zt, lam).mean()),
        reconstruction=float(residual),
        l1=float(np.abs(Z).sum(1).mean()),
        density=density,
        atom_usage=usage,
        dead_atoms=int((usage == 0).sum()),
        coherence_max=largest,
        coherence_mean=mean,
        mean_atom_norm=float(np.linalg.norm(A, axis=0).mean()),
        fista_objective=float(sparse_coding_objective(Xt, At, recoded, lam).mean()),
        fista_density=float((recoded != 0).double().mean()),
        zero_code_objective=float(0.5 * (X**2).sum(1).mean()),
    )
