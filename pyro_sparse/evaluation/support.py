"""Supports: F-score of a decoder mask's support against the truth, Jaccard similarity of code supports."""

import numpy as np


def support_f_score(W_est, true_support, matching):
    """
    F1 score of an estimated decoder support against the true support.

    As in the synthetic experiments of Moran et al. (TMLR 2022): entry
    ``(g, k)`` of the support says whether feature g depends on factor k. The
    estimated column ``matching[j]`` is compared with true column j; every
    estimated column matched to no true factor is compared with an all-False
    column, so any non-zero entry there is a false positive (a spurious
    factor is not free). Returns ``2 TP / (2 TP + FP + FN)``, or 1.0 when
    both supports are empty.

    Parameters
    ----------
    W_est : array, shape (G, K)
        Estimated mask or loadings (support = non-zero entries), or a boolean
        support directly.
    true_support : array, shape (G, J)
        True support; non-zero / True entries are in the support.
    matching : int array, shape (J,)
        Distinct column indices into W_est, e.g. from ``match_factors``.

    Returns
    -------
    float in [0, 1].
    """
    W_est, true_support = _check_supports(W_est, true_support)
    G, K = W_est.shape
    matching = _check_matching(matching, true_support.shape[1], K)

    estimated = W_est != 0
    # Unmatched columns keep an all-False truth, which is what charges their
    # non-zeros as false positives.
    truth = np.zeros((G, K), dtype=bool)
    truth[:, matching] = true_support != 0
    tp = int(np.sum(estimated & truth))
    fp = int(np.sum(estimated & ~truth))
    fn = int(np.sum(~estimated & truth))
    if tp + fp + fn == 0:
        return 1.0
    return 2 * tp / (2 * tp + fp + fn)


def _check_supports(W_est, true_support):
    W_est = np.asarray(W_est)
    true_support = np.asarray(true_support)
    if W_est.ndim != 2:
        raise ValueError(f"W_est must be a 2-D (features x codes) array, got {W_est.ndim}-D")
    if true_support.ndim != 2:
        raise ValueError(f"true_support must be a 2-D (features x factors) array, got {true_support.ndim}-D")
    if W_est.shape[0] != true_support.shape[0]:
        raise ValueError(
            f"W_est and true_support must have the same number of rows (features), "
            f"got {W_est.shape[0]} and {true_support.shape[0]}"
        )
    for name, array in (("W_est", W_est), ("true_support", true_support)):
        if array.dtype.kind in "fc" and not np.all(np.isfinite(array)):
            raise ValueError(f"{name} contains NaN or infinite values, whose support membership is undefined")
    return W_est, true_support


def _check_matching(matching, J, K):
    """``matching`` as an array of J distinct column indices in 0..K-1."""
    matching = np.asarray(matching)
    if matching.ndim != 1 or matching.shape[0] != J:
        raise ValueError(
            f"matching must be a 1-D array with one entry per true factor ({J}), got shape {matching.shape}"
        )
    if not np.issubdtype(matching.dtype, np.integer):
        raise ValueError(f"matching must hold integer column indices, got dtype {matching.dtype}")
    if np.any(matching < 0) or np.any(matching >= K):
        raise ValueError(f"matching has indices outside the {K} columns of W_est: {matching.tolist()}")
    if len(np.unique(matching)) != J:
        raise ValueError(f"matching must map distinct factors to distinct columns, got {matching.tolist()}")
    return matching


# Cap on the (chunk, J, J) intersection array built by support_jaccard.
_JACCARD_CHUNK_ENTRIES = 4_000_000


def support_jaccard(codes, features=None, per_point=False):
    """
    Average pairwise Jaccard index of the supports of repeated code draws.

    Fallah & Rozell (ICML 2022), Sec. 4.1.2, Eq. 13 and Fig. 5: for data
    point k and draws ``z^1, ..., z^J ~ q(z | x^k)``, with support
    ``S(z) = {i : z_i != 0}``, the Jaccard index (Jaccard, 1912)::

        C(z^m, z^n) = |S(z^m) & S(z^n)| / |S(z^m) | S(z^n)|

    and the point's consistency is ``1 / (J (J - 1)) sum_m sum_{n != m}
    C(z^m, z^n)``, i.e. the mean over all J (J - 1) / 2 unordered pairs of
    *distinct draws of the same point* (C is symmetric). Draws are never
    paired across different data points, and a draw is never paired with
    itself (which would add a spurious 1). Two empty supports are identical,
    so their index is 1. 1 means every draw switches on the same features;
    0 means no two draws share one.

    Parameters
    ----------
    codes : array, shape (J, N, K)
        J draws of the K-dimensional code for each of N data points; a single
        point is shape (J, 1, K).
    features : bool array, shape (K,), or None
        Restrict the supports to these features. The paper keeps only
        features whose dictionary column has ``||a_i||_2^2 > 0.1``, so that
        models that leave many atoms unused are not credited with easy
        consistency: ``features = (A ** 2).sum(axis=0) > 0.1``.
    per_point : bool
        Return the N per-point values (Fig. 5 is their histogram) instead of
        their mean.

    Returns
    -------
    float in [0, 1], or array of shape (N,) if ``per_point``.
    """
    support = _draw_supports(codes, features)
    values = _mean_pairwise_jaccard(support)
    if per_point:
        return values
    return float(values.mean())


def _draw_supports(codes, features):
    """Supports ``codes != 0`` of the (J, N, K) draws, as (N, J, K') floats (K' = selected features)."""
    codes = np.asarray(codes, dtype=float)
    if codes.ndim != 3:
        raise ValueError(f"codes must have shape (draws, data points, dimensions), got {codes.ndim}-D")
    J, N, K = codes.shape
    if J < 2:
        raise ValueError(f"need at least 2 draws per data point to form a pair, got {J}")
    if N == 0 or K == 0:
        raise ValueError(f"codes is empty, shape {codes.shape}")
    if np.any(np.isnan(codes)):
        raise ValueError("codes contains NaN, whose support membership is undefined")
    support = codes != 0
    if features is not None:
        features = np.asarray(features)
        if features.shape != (K,) or features.dtype != bool:
            raise ValueError(
                f"features must be a boolean array of shape ({K},), got {features.dtype} {features.shape}"
            )
        if not features.any():
            raise ValueError("features selects no dimension: there is no support to compare (every atom dead?)")
        support = support[:, :, features]
    # (N, J, K') so that one batched product gives every pair's intersection.
    return np.ascontiguousarray(support.transpose(1, 0, 2), dtype=float)


def _mean_pairwise_jaccard(support):
    """Per data point, the mean Jaccard index over ordered pairs of distinct draws (N,)."""
    N, J, _ = support.shape
    sizes = support.sum(axis=2)
    off_diagonal = ~np.eye(J, dtype=bool)
    values = np.empty(N)
    chunk = max(1, _JACCARD_CHUNK_ENTRIES // (J * J))
    for start in range(0, N, chunk):
        block = support[start : start + chunk]
        inter = block @ block.transpose(0, 2, 1)
        s = sizes[start : start + chunk]
        union = s[:, :, None] + s[:, None, :] - inter
        with np.errstate(divide="ignore", invalid="ignore"):
            index = np.where(union > 0, inter / union, 1.0)
        values[start : start + chunk] = index[:, off_diagonal].mean(axis=1)
    return values
