"""
Seed stability of factors: do fits from different random seeds find the same
factors?  Factors are matched across each pair of fits with the Hungarian
algorithm, once on the correlation of their codes on the same data and once
on the supports of their decoder masks.
"""

import warnings
from itertools import combinations
from typing import NamedTuple

import numpy as np
from scipy.optimize import linear_sum_assignment

# A code whose posterior mean varies less than this across the data carries
# no information (a collapsed dimension): Burda et al.'s (2016) active units,
# for codes on the N(0, 1) prior's scale; the benchmarks count active codes
# the same way.
ACTIVE_CODE_VARIANCE = 0.01


class FactorStability(NamedTuple):
    """
    ``code_correlation``: mean over pairs of fits of the matched ``|corr|`` of
    their active codes, each pair's sum divided by the larger number of
    active factors (a factor one fit lacks counts 0).  ``support_jaccard``:
    the same for the Jaccard similarity of matched columns of the supports
    (``None`` without supports).  ``pairs``: the per-pair values.
    """

    code_correlation: float
    support_jaccard: float
    pairs: list


def _matched_mean(similarity):
    """Hungarian-matched similarities summed and divided by the larger side (unmatched factors count 0)."""
    if similarity.size == 0:
        return 0.0
    rows, columns = linear_sum_assignment(similarity, maximize=True)
    return float(similarity[rows, columns].sum() / max(similarity.shape))


def _standardized(a):
    """
    Columns at zero mean and unit sd; a constant column (its values, not its
    rounded sd, say so) at 0.  Each column is first divided by its largest
    ``|value|``, so that its sd neither underflows nor overflows.
    """
    peak = np.abs(a).max(0)
    a = a / np.where(peak > 0, peak, 1.0)
    sd = a.std(0)
    constant = (np.ptp(a, axis=0) == 0) | ~(sd > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(constant, 0.0, (a - a.mean(0)) / np.where(constant, 1.0, sd))


def _abs_correlation(a, b):
    # A constant code correlates with nothing (the sd of a constant 0.3 rounds to 6e-17, not 0).
    return np.clip(np.abs(_standardized(a).T @ _standardized(b)) / a.shape[0], 0.0, 1.0)


def _jaccard(a, b):
    """Jaccard similarity of every column of ``a`` with every column of ``b`` (boolean, features x factors)."""
    a, b = a.astype(float), b.astype(float)
    intersection = a.T @ b
    union = a.sum(0)[:, None] + b.sum(0)[None, :] - intersection
    return np.divide(intersection, union, out=np.zeros_like(intersection), where=union > 0)


def active_factors(codes, support=None, min_variance=ACTIVE_CODE_VARIANCE):
    """
    The factors a fit uses: columns of ``support`` (features x factors) with
    at least one feature and a code that varies over the data points (a
    constant code is a bias, not a factor), else codes whose variance across
    the data points exceeds ``min_variance`` (0.01 suits codes of a
    unit-variance prior; set it for codes on another scale).
    """
    if support is not None:
        return np.flatnonzero(np.asarray(support).any(0) & (np.ptp(np.asarray(codes), axis=0) > 0))
    if not (np.isfinite(min_variance) and min_variance >= 0):
        raise ValueError(f"min_variance must be a finite number >= 0, got {min_variance!r}")
    codes = np.asarray(codes)
    return np.flatnonzero((codes.var(0) > min_variance) & (np.ptp(codes, axis=0) > 0))


def code_stability(codes, supports=None, min_variance=ACTIVE_CODE_VARIANCE):
    """
    :class:`FactorStability` of several fits given as arrays: ``codes`` a
    list of (N, K_f) posterior means of the same N data points, ``supports``
    an optional list of (G, K_f) boolean decoder supports (then only factors
    with a non-empty support are compared, else only active codes: variance
    above ``min_variance``, see :func:`active_factors`).
    """
    if len(codes) < 2:
        raise ValueError(f"factor stability compares fits: give at least 2, got {len(codes)}")
    codes = [np.asarray(c, dtype=float) for c in codes]
    if any(c.ndim != 2 for c in codes):
        raise ValueError(f"each fit's codes must be a 2-D (points x factors) array, got shapes {[c.shape for c in codes]}")
    if len({c.shape[0] for c in codes}) != 1:
        raise ValueError("the codes must be of the same data points (equal numbers of rows)")
    if not all(np.all(np.isfinite(c)) for c in codes):
        raise ValueError("the codes contain NaN or infinite values (a diverged fit?)")
    if supports is not None:
        supports = [np.asarray(s) for s in supports]
        if len(supports) != len(codes):
            raise ValueError(f"give one support per fit: {len(codes)} fits, {len(supports)} supports")
        if any(s.dtype.kind in "fc" and not np.all(np.isfinite(s)) for s in supports):
            raise ValueError("the supports contain NaN or infinite values")
        if any(s.ndim != 2 or s.shape[1] != c.shape[1] for s, c in zip(supports, codes)) or len(
                {s.shape[0] for s in supports}) != 1:
            raise ValueError(
                "each support must be a (features x factors) array with its fit's number of factors and all the "
                f"same number of features; got supports {[s.shape for s in supports]} for codes "
                f"{[c.shape for c in codes]}"
            )
        supports = [s.astype(bool) for s in supports]
    active = [active_factors(c, None if supports is None else s, min_variance)
              for c, s in zip(codes, supports or [None] * len(codes))]
    idle = [f for f, a in enumerate(active) if a.size == 0]
    if idle:
        why = ("no column of its support has a feature" if supports is not None
               else f"no code varies by more than min_variance={min_variance:g}; set it for codes on another scale")
        warnings.warn(f"fits {idle} have no active factor ({why}): they agree with nothing", UserWarning,
                      stacklevel=2)
    pairs = []
    for i, j in combinations(range(len(codes)), 2):
        pair = {"fits": (i, j),
                "code_correlation": _matched_mean(_abs_correlation(codes[i][:, active[i]], codes[j][:, active[j]]))}
        if supports is not None:
            pair["support_jaccard"] = _matched_mean(_jaccard(supports[i][:, active[i]], supports[j][:, active[j]]))
        pairs.append(pair)
    jaccard = None if supports is None else float(np.mean([p["support_jaccard"] for p in pairs]))
    return FactorStability(float(np.mean([p["code_correlation"] for p in pairs])), jaccard, pairs)


def factor_stability(fits, X, min_variance=ACTIVE_CODE_VARIANCE):
    """
    :class:`FactorStability` of fitted models (e.g. one per seed) on data
    ``X``: their posterior-mean codes of X, and, where they have a decoder
    mask, its support (``support_``: the non-zero entries of W, with
    E[γ] > 0.5 where the prior gives inclusion probabilities).
    ``min_variance``: as for :func:`code_stability` (fits without a mask).
    """
    codes = [fit.transform(X, kind="mean") for fit in fits]
    supports = [_support(fit) for fit in fits]
    if any(s is None for s in supports):
        supports = None
    return code_stability(codes, supports, min_variance)


def _support(fit):
    try:
        return fit.support_
    except AttributeError:
        pass
    W = getattr(fit, "W_", None)  # loadings without a prior's inclusion probabilities (NMF)
    return W != 0 if W is not None and W.ndim == 2 else None
