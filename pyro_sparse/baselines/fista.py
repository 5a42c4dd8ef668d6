r"""
MAP sparse coding: FISTA inference and a dictionary-learning baseline.

This is the "FISTA (baseline)" of Fallah & Rozell, *Variational Sparse Coding
with Learned Thresholding* (ICML 2022), Sec. 4.1: codes are MAP estimates under
a Laplacian prior (Eq. 8 turns the expectation over the prior into a max, which
for a Gaussian likelihood and a Laplace prior is the lasso), and the linear
generator ``A`` (the dictionary) is learned by alternating that inference with
gradient steps on ``A`` under a Frobenius-norm penalty (Eq. 10-12).

Objective and its scaling
-------------------------
For one data point ``x`` (length ``D``) and dictionary ``A`` (``D x K``), the
per-point objective used here is

.. math::  E(x, z) = \tfrac12 \|x - A z\|_2^2 + \lambda \|z\|_1 ,

and the dictionary objective adds :math:`\kappa \|A\|_F^2` (Eq. 10). The paper
prints Eq. 10 and the likelihood of Eq. 12 *without* the factor 1/2. We keep the
1/2 because that is the scale the paper's numbers were produced with: in the
authors' released code the FISTA solver minimises ``1/2 ||x - Az||^2 + lam ||z||_1``
(gradient ``A^T (Az - x)``, threshold ``lam / L``), the dictionary step is the
gradient of ``1/2 ||x - Az||^2 + kappa ||A||_F^2``, and the validation loss of
Table 1 is ``0.5 * ||x - Az||^2 + lam * ||z||_1`` -- so "lambda = 20 gives about
10 % non-zero codes" (Sec. 4.1) refers to this scaling. To minimise the
printed form ``||x - Az||^2 + lam ||z||_1`` instead, note that it equals twice
``1/2 ||x - Az||^2 + (lam/2) ||z||_1``: call :func:`fista` with ``lam / 2`` (same
minimiser) and double :func:`sparse_coding_objective`.

FISTA
-----
Beck & Teboulle (2009), constant step: with ``L`` the largest eigenvalue of
``A^T A`` (the Lipschitz constant of the gradient of the smooth part; computed
once per call with :func:`torch.linalg.eigvalsh`), iterate from ``y_1 = z_0``,
``t_1 = 1``::

    z_k     = soft_threshold(y_k - (1/L) A^T (A y_k - x),  lam / L)
    t_{k+1} = (1 + sqrt(1 + 4 t_k^2)) / 2
    y_{k+1} = z_k + ((t_k - 1) / t_{k+1}) (z_k - z_{k-1})

The whole batch is solved at once (rows are independent problems that share
``A``; the ``t`` sequence does not depend on the data, so the batched iterates
are exactly the per-row iterates), on the device and in the dtype of the inputs.

Lambda warm-up
--------------
Appendix D: "For FISTA, we multiply lambda by a warmup parameter omega that
starts at omega(0) = 0.1 and is incremented by 1E-04 each training iteration,
capping at a maximum value of omega(t) = 1.0. We find that this prevents all
dictionary entries from going to zero when training with a Frobenius norm
regularizer." So the paper's warm-up is a *ramp up* of lambda over *dictionary
training iterations* (mini-batch steps), from 0.1 * lambda to lambda (reached
after 9,000 steps) -- not a decay from a larger lambda. It is implemented by
:func:`lambda_warmup_factor` and used by :func:`learn_dictionary` (on by
default, as in the paper): at training step ``t`` the batch's codes are
``fista(X_batch, A, omega(t) * lam)``.

Inside a single :func:`fista` call, ``warmup=W > 0`` applies the same ramp shape
over the first ``W`` FISTA iterations (lambda_k = omega_k * lam with omega_k
going linearly from ``warmup_start`` to 1), a continuation scheme; after the
ramp the momentum is restarted and plain FISTA runs at the target ``lam``, so
the result is the same optimum. This in-solver ramp is *not* something the
paper does; it defaults to off (``warmup=0``), which is the paper's per-batch
inference (a fixed lambda per solve).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from pyro_sparse.checks import is_count, positive_number

__all__ = [
    "DictionaryLearningResult",
    "FistaResult",
    "fista",
    "lambda_warmup_factor",
    "learn_dictionary",
    "lipschitz_constant",
    "soft_threshold",
    "sparse_coding_objective",
]


# --------------------------------------------------------------------------- helpers


def _as_tensor(
    x, *, like: torch.Tensor | None = None, name: str = "input"
) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        t = x
    else:
        t = torch.as_tensor(np.asarray(x))
    if like is not None:
        t = t.to(device=like.device, dtype=like.dtype)
    elif not t.is_floating_point():
        t = t.to(torch.get_default_dtype())
    return t


def soft_threshold(v: torch.Tensor, threshold) -> torch.Tensor:
    """Proximal operator of ``threshold * ||.||_1``: ``sign(v) * max(|v| - threshold, 0)``."""
    return torch.sign(v) * torch.clamp(v.abs() - threshold, min=0.0)


def lipschitz_constant(dictionary: torch.Tensor) -> torch.Tensor:
    """
    Largest eigenvalue of ``A^T A`` (= squared spectral norm of ``A``).

    This is the Lipschitz constant of the gradient of ``1/2 ||x - A z||^2`` in ``z``,
    so ``1/L`` is FISTA's constant step. The eigen-decomposition is taken of the
    smaller of the two Gram matrices ``A^T A`` (K x K) and ``A A^T`` (D x D), which
    have the same non-zero eigenvalues.
    """
    A = dictionary
    gram = A.T @ A if A.shape[1] <= A.shape[0] else A @ A.T
    return torch.linalg.eigvalsh(gram)[-1].clamp(min=0.0)


def _check_problem(X, dictionary, lam):
    A = _as_tensor(dictionary, name="dictionary")
    if A.dtype not in (torch.float32, torch.float64):
        A = A.to(torch.get_default_dtype())
    X = _as_tensor(X, like=A, name="X")
    if A.ndim != 2:
        raise ValueError(f"dictionary must be 2-D (D, K); got shape {tuple(A.shape)}")
    squeeze = X.ndim == 1
    if squeeze:
        X = X.unsqueeze(0)
    if X.ndim != 2 or X.shape[1] != A.shape[0]:
        raise ValueError(
            f"X must have shape (N, D) with D = dictionary.shape[0] = {A.shape[0]}; "
            f"got {tuple(X.shape)}"
        )
    for name, value in (("X", X), ("dictionary", A)):
        if not bool(torch.isfinite(value).all()):
            raise ValueError(f"{name} has non-finite values (NaN or inf)")
    lam_t = _as_tensor(lam, like=A, name="lam")
    if not bool((torch.isfinite(lam_t) & (lam_t >= 0)).all()):
        raise ValueError("lam must be finite and non-negative")
    try:
        broadcastable = lam_t.ndim <= 2 and tuple(torch.broadcast_shapes(lam_t.shape, (X.shape[0], A.shape[1]))) == (
            X.shape[0], A.shape[1])
    except RuntimeError:
        broadcastable = False
    if not broadcastable:
        raise ValueError(f"lam must be a scalar or broadcastable to the codes' shape {(X.shape[0], A.shape[1])}, "
                         f"got shape {tuple(lam_t.shape)}")
    return X, A, lam_t, squeeze


# --------------------------------------------------------------------------- objective


def sparse_coding_objective(X, dictionary, codes, lam) -> torch.Tensor:
    r"""
    Per-point sparse coding energy ``1/2 ||x - A z||^2 + lam ||z||_1`` (the data
    and sparsity terms of Eq. 10, in the 1/2 scaling explained in the module
    docstring; the Frobenius term of Eq. 10 does not depend on the point).

    ``X`` (N, D), ``dictionary`` (D, K), ``codes`` (N, K); ``lam`` a scalar or a
    tensor broadcastable to (N, K) (per-atom or per-point weights). Returns (N,).
    A single point (1-D ``X`` and ``codes``) gives a 0-d tensor.
    """
    X, A, lam_t, squeeze = _check_problem(X, dictionary, lam)
    Z = _as_tensor(codes, like=A, name="codes")
    if Z.ndim == 1:
        Z = Z.unsqueeze(0)
    if Z.shape != (X.shape[0], A.shape[1]):
        raise ValueError(
            f"codes must have shape {(X.shape[0], A.shape[1])}; got {tuple(Z.shape)}"
        )
    residual = X - Z @ A.T
    value = 0.5 * residual.pow(2).sum(-1) + (lam_t * Z.abs()).sum(-1)
    return value[0] if squeeze else value


# --------------------------------------------------------------------------- FISTA


@dataclass
class FistaResult:
    """What :func:`fista` returns with ``return_info=True``."""

    codes: torch.Tensor
    #: FISTA iterations run at the target lambda (the ``warmup`` ramp not counted).
    num_iterations: int
    #: every row met the ``tol`` criterion (always False with ``tol=0``).
    converged: bool
    #: the largest eigenvalue of ``A^T A`` used for the step ``1/L``.
    lipschitz: float


def fista(
    X,
    dictionary,
    lam,
    num_iterations: int = 500,
    tol: float = 1e-4,
    warmup: int = 0,
    *,
    warmup_start: float = 0.1,
    init=None,
    lipschitz: float | None = None,
    check_every: int = 10,
    return_info: bool = False,
):
    r"""
    Solve ``min_z 1/2 ||x - A z||^2 + lam ||z||_1`` for every row ``x`` of ``X`` (Eq. 10's
    inference problem, the MAP estimate of Eq. 8) with FISTA (Beck & Teboulle, 2009).

    Parameters
    ----------
    X : (N, D) tensor (or array); a single (D,) point is accepted and gives (K,).
    dictionary : (D, K) tensor ``A``. ``X`` is moved to its device and dtype
        (float32 or float64; other dtypes are converted to the default dtype).
    lam : non-negative scalar, or tensor broadcastable to (N, K) (per-atom or
        per-point weights).
    num_iterations : maximum number of FISTA iterations at the target ``lam``.
    tol : stop once every row satisfies ``||z_k - z_{k-1}|| <= tol * ||z_k||``
        (relative change; an all-zero row that stays zero counts as converged).
        Checked every ``check_every`` iterations, so that a GPU is not synchronised
        at every step. ``tol=0`` runs exactly ``num_iterations`` iterations.
    warmup : number of extra iterations at the start over which lambda is ramped
        linearly from ``warmup_start * lam`` up to ``lam`` (continuation; see the
        module docstring -- the paper's warm-up is over *training* steps and lives in
        :func:`learn_dictionary`). ``0`` (default) disables it. After the ramp the
        momentum is restarted and up to ``num_iterations`` plain FISTA iterations
        follow, so the optimum reached is that of ``lam``.
    init : optional (N, K) starting codes (default zeros).
    lipschitz : optional precomputed largest eigenvalue of ``A^T A`` (e.g. when the
        same dictionary is used for many batches).
    return_info : also return iteration count, convergence flag and ``L``.

    Returns
    -------
    codes : (N, K) tensor, or :class:`FistaResult` if ``return_info``.
    """
    X, A, lam_t, squeeze = _check_problem(X, dictionary, lam)
    _check_fista_options(num_iterations, warmup, warmup_start)
    if not is_count(check_every):
        raise ValueError(f"check_every must be an integer >= 1, got {check_every!r}")
    if lipschitz is not None:
        positive_number("lipschitz", lipschitz)  # the largest eigenvalue of A^T A
    n, k = X.shape[0], A.shape[1]
    if init is None:
        z = X.new_zeros(n, k)
    else:
        z = _as_tensor(init, like=A, name="init")
        if tuple(z.shape) not in ({(n, k), (k,)} if squeeze else {(n, k)}):
            raise ValueError(f"init must have the codes' shape {(n, k)}, got {tuple(z.shape)}")
        if not bool(torch.isfinite(z).all()):
            raise ValueError("init has non-finite values (NaN or inf)")
        z = z.reshape(n, k).clone()

    L = float(lipschitz) if lipschitz is not None else float(lipschitz_constant(A))
    if L <= 0.0:
        # A = 0: the data term is constant, so the l1 term alone is minimised at z = 0.
        result = FistaResult(X.new_zeros(n, k), 0, True, 0.0)
    else:
        with torch.no_grad():
            z, iterations, converged = _fista_iterations(
                X, A, lam_t, z, 1.0 / L, num_iterations, tol, warmup, warmup_start, check_every
            )
        result = FistaResult(z, max(iterations - warmup, 0), converged, L)
    if squeeze:
        result.codes = result.codes[0]
    return result if return_info else result.codes


def _check_fista_options(num_iterations, warmup, warmup_start):
    if num_iterations < 0 or warmup < 0:
        raise ValueError("num_iterations and warmup must be non-negative")
    if not 0.0 < warmup_start <= 1.0:
        raise ValueError("warmup_start must be in (0, 1]")


def _fista_threshold(lam_t, step, it, warmup, warmup_start):
    """Soft threshold of iteration ``it``: ``lam * step``, ramped up over the first ``warmup`` iterations."""
    if it < warmup:
        # The paper's omega ramp shape (start 0.1, linear, capped at 1), spread over W
        # iterations instead of 9,000 training steps.
        omega = warmup_start + (1.0 - warmup_start) * it / warmup
        return lam_t * (omega * step)
    return lam_t * step


def _converged(z, z_prev, tol) -> bool:
    """Every row satisfies ``||z_k - z_{k-1}|| <= tol * ||z_k||``."""
    change = (z - z_prev).norm(dim=1)
    size = z.norm(dim=1)
    return bool((change <= tol * size).all())


def _fista_iterations(X, A, lam_t, z, step, num_iterations, tol, warmup, warmup_start, check_every):
    """
    The FISTA iterations of the module docstring from ``z``, with step ``1/L``.
    Returns ``(codes, iterations run including the warm-up, converged)``.
    """
    gram = A.T @ A  # (K, K): the gradient A^T(Az - x) = G z - A^T x, batched below
    xa = X @ A  # (N, K) = rows of A^T x, computed once
    z_prev, y, t = z, z, 1.0
    iterations = 0
    total = warmup + num_iterations
    for it in range(total):
        if it == warmup and warmup > 0:
            # Restart the momentum once lambda has reached its target: from here on this is
            # plain FISTA started at a good point, so its O(1/k^2) guarantee for the target
            # problem applies.
            t, y = 1.0, z
        threshold = _fista_threshold(lam_t, step, it, warmup, warmup_start)
        z_new = soft_threshold(y - step * (y @ gram - xa), threshold)
        t_new = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t * t))
        y = z_new + ((t - 1.0) / t_new) * (z_new - z)
        z_prev, z, t = z, z_new, t_new
        iterations = it + 1
        # tol is checked every check_every iterations (and at the last), so that a GPU is
        # not synchronised at every step; tol <= 0 never stops early nor converges.
        due = it >= warmup and tol > 0 and ((it - warmup + 1) % check_every == 0 or it + 1 == total)
        if due and _converged(z, z_prev, tol):
            return z, iterations, True
    return z, iterations, False


# --------------------------------------------------------------------------- dictionary learning


def lambda_warmup_factor(
    step: int, start: float = 0.1, increment: float = 1e-4, maximum: float = 1.0
) -> float:
    """
    The paper's lambda warm-up multiplier for FISTA (Appendix D):
    ``omega(t) = min(start + increment * t, maximum)`` with ``omega(0) = 0.1``,
    ``+1e-4`` per training iteration, capped at 1.0 (reached at ``t = 9000``).
    """
    if step < 0:
        raise ValueError("step must be non-negative")
    return float(min(start + increment * step, maximum))


@dataclass
class DictionaryLearningResult:
    """What :func:`learn_dictionary` returns with ``return_history=True``."""

    dictionary: torch.Tensor
    #: mean over the epoch's batches of ``mean_n E(x_n, z_n) + kappa ||A||_F^2`` with the
    #: lambda in force (omega(t) * lam), evaluated before each batch's dictionary step.
    train_objective: list = field(default_factory=list)
    #: fraction of non-zero codes per epoch.
    code_density: list = field(default_factory=list)
    #: lambda multiplier omega at the end of each epoch.
    warmup_factor: list = field(default_factory=list)
    steps: int = 0


def learn_dictionary(
    X,
    num_atoms: int,
    lam: float,
    *,
    kappa: float = 1e-3,
    num_epochs: int = 10,
    batch_size: int = 100,
    lr: float = 0.5,
    lr_decay: float = 0.99,
    warmup: bool = True,
    warmup_start: float = 0.1,
    warmup_increment: float = 1e-4,
    normalize_columns: bool = False,
    fista_iterations: int = 500,
    fista_tol: float = 1e-4,
    init=None,
    seed: int = 0,
    device=None,
    dtype: torch.dtype | None = None,
    return_history: bool = False,
):
    r"""
    Learn a dictionary by alternating FISTA inference and gradient steps on ``A``
    (the paper's "FISTA (baseline)", Sec. 4.1 and Appendix D) -- a simple baseline.

    For each mini-batch (rows of ``X`` shuffled every epoch, ``seed``-determined):

    1. codes ``Z = fista(X_b, A, omega(t) * lam)`` (MAP inference, Eq. 8/10), with
       ``omega(t) = min(warmup_start + warmup_increment * t, 1)`` the warm-up of
       Appendix D (``warmup=False``: ``omega = 1``);
    2. one gradient step on
       ``mean_b 1/2 ||x - A z||^2 + kappa ||A||_F^2`` (Eq. 10, with ``Z`` held fixed):
       ``A <- A + lr * (R^T Z / B - 2 kappa A)``, ``R = X_b - Z A^T``.

    The paper controls the scale of ``A`` with the Frobenius penalty (Eq. 10-11;
    ``kappa = 1e-3`` for FISTA in Appendix D), not with unit-norm columns: its
    learned atoms have different norms (Fig. 10 sorts them by norm). With
    ``normalize_columns=True`` the columns are instead rescaled to unit norm
    after every step (Olshausen & Field style; then ``kappa`` is normally 0).

    Defaults follow Appendix D where it gives values: batch 100, dictionary
    learning rate 0.5 decayed by 0.99 each epoch, ``kappa = 1e-3``, the lambda
    warm-up above; the paper's run is 80,000 16x16 whitened patches, 256 atoms,
    ``lam = 20``, 300 epochs. ``init`` defaults to Gaussian columns scaled to unit
    norm (``seed``-determined). ``X`` is (N, D); ``device``/``dtype`` default to
    those of ``X`` when it is a tensor (float32 otherwise). Returns ``A`` (D,
    num_atoms), or a :class:`DictionaryLearningResult` with ``return_history``.
    """
    dev, dt = _device_and_dtype(X, device, dtype)
    X = _as_tensor(X).to(device=dev, dtype=dt)
    if X.ndim != 2:
        raise ValueError("X must be 2-D (N, D)")
    n, d = X.shape
    if n == 0:
        raise ValueError("X has no rows: a dictionary is learned from data points")
    if num_atoms < 1 or batch_size < 1 or num_epochs < 0:
        raise ValueError("num_atoms and batch_size must be >= 1, num_epochs >= 0")
    if _as_tensor(lam, name="lam").numel() != 1:
        raise ValueError("lam must be one number: the same weight for every atom and patch")
    if not (math.isfinite(warmup_increment) and warmup_increment >= 0):
        raise ValueError(f"warmup_increment must be >= 0, got {warmup_increment!r}")
    if not 0 < lr_decay <= 1:
        raise ValueError(f"lr_decay must be in (0, 1], got {lr_decay!r}")
    if not bool(torch.isfinite(X).all()):
        raise ValueError("X has non-finite values (NaN or inf)")
    if not (math.isfinite(kappa) and kappa >= 0):
        raise ValueError(f"kappa (the weight of the dictionary's Frobenius penalty) must be >= 0, got {kappa!r}")
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be positive, got {lr!r}")
    if num_atoms > n:
        warnings.warn(f"a dictionary of {num_atoms} atoms is larger than the {n} data points can support "
                      "(an atom is learned from the points that use it); use more data or fewer atoms",
                      stacklevel=2)
    gen = torch.Generator().manual_seed(int(seed))
    A = _initial_dictionary(init, d, num_atoms, gen, dev, dt)
    run = _Training(
        lam, kappa, min(batch_size, n), warmup, warmup_start, warmup_increment,
        normalize_columns, fista_iterations, fista_tol, return_history, dt,
    )
    history = DictionaryLearningResult(dictionary=A)
    step_size = float(lr)
    t = 0
    # Drop the last partial batch, as the paper's training loop does.
    num_batches = n // run.batch_size
    with torch.no_grad():
        for _epoch in range(num_epochs):
            order = torch.randperm(n, generator=gen).to(dev)
            A, t, epoch_obj, epoch_nnz, omega = _train_epoch(X, A, order, t, step_size, run)
            step_size *= lr_decay
            if return_history and num_batches:
                history.train_objective.append(epoch_obj / num_batches)
                history.code_density.append(epoch_nnz / num_batches)
                history.warmup_factor.append(omega)
    if return_history:
        history.dictionary = A
        history.steps = t
        return history
    return A


def _device_and_dtype(X, device, dtype):
    """Those of ``X`` when it is a (float) tensor, else CPU and float32; ``device``/``dtype`` override."""
    if isinstance(X, torch.Tensor):
        dev = torch.device(device) if device is not None else X.device
        dt = dtype or (X.dtype if X.dtype in (torch.float32, torch.float64) else torch.float32)
    else:
        dev = torch.device(device) if device is not None else torch.device("cpu")
        dt = dtype or torch.float32
    return dev, dt


def _initial_dictionary(init, d, num_atoms, gen, dev, dt):
    """``init``, or Gaussian columns scaled to unit norm (drawn in float64 from ``gen``)."""
    if init is None:
        A = torch.randn(d, num_atoms, generator=gen, dtype=torch.float64)
        A = A / A.norm(dim=0, keepdim=True)
        return A.to(device=dev, dtype=dt)
    A = _as_tensor(init).to(device=dev, dtype=dt).clone()
    if A.shape != (d, num_atoms):
        raise ValueError(f"init must have shape {(d, num_atoms)}")
    if not bool(torch.isfinite(A).all()):
        raise ValueError("init has non-finite values (NaN or inf)")
    return A


@dataclass(frozen=True)
class _Training:
    """The fixed settings of one :func:`learn_dictionary` run."""

    lam: float
    kappa: float
    batch_size: int
    warmup: bool
    warmup_start: float
    warmup_increment: float
    normalize_columns: bool
    fista_iterations: int
    fista_tol: float
    track: bool  # accumulate the objective and code density for the history
    dtype: torch.dtype

    def omega(self, t: int) -> float:
        """The lambda multiplier at training step ``t`` (Appendix D warm-up)."""
        return lambda_warmup_factor(t, self.warmup_start, self.warmup_increment) if self.warmup else 1.0


def _train_epoch(X, A, order, t, step_size, run: _Training):
    """
    One pass over the full batches of ``X[order]``: FISTA codes at ``omega(t) * lam``,
    then one gradient step on ``A``. Returns ``(A, t, summed objective, summed code
    density, last omega)``; the sums are 0 unless ``run.track``.
    """
    epoch_obj, epoch_nnz = 0.0, 0.0
    omega = 1.0
    for b in range(X.shape[0] // run.batch_size):
        xb = X[order[b * run.batch_size : (b + 1) * run.batch_size]]
        omega = run.omega(t)
        lam_t = run.lam * omega
        L = float(lipschitz_constant(A))
        z = fista(xb, A, lam_t, run.fista_iterations, run.fista_tol, lipschitz=L)
        residual = xb - z @ A.T
        if run.track:
            obj = 0.5 * residual.pow(2).sum(-1).mean() + lam_t * z.abs().sum(-1).mean()
            epoch_obj += float(obj) + run.kappa * float(A.pow(2).sum())
            epoch_nnz += float((z != 0).to(run.dtype).mean())
        A = _dictionary_step(A, residual, z, step_size, run)
        t += 1
    return A, t, epoch_obj, epoch_nnz, omega


def _dictionary_step(A, residual, z, step_size, run: _Training):
    """
    One gradient step on ``mean_b 1/2||x - Az||^2 + kappa ||A||_F^2``, whose gradient in
    ``A`` is ``-R^T Z / B + 2 kappa A`` (Eq. 10 with the codes fixed, as in the paper's
    alternating scheme); then unit-norm columns if ``run.normalize_columns``.
    """
    A = A + step_size * (residual.T @ z / residual.shape[0] - 2.0 * run.kappa * A)
    if run.normalize_columns:
        A = A / A.norm(dim=0, keepdim=True).clamp(min=torch.finfo(run.dtype).tiny)
    return A
