"""
Top-k ranking metrics of recommenders, with the fold-in protocol of Liang et
al. (2018, Sec. 4.2): hide a share of each held-out user's items, encode the
rest, and rank the items the user has not got by the model's scores (e.g.
``fitted.reconstruct(observed)``, E[x | E_q z]).
"""

import numpy as np


def hide_items(X, fraction=0.2, min_items=5, seed=0):
    """
    The fold-in split: for each row of ``X`` (users x items, non-zero = the
    user has the item) with at least ``min_items`` items, ``fraction`` of them
    (at least one, and one fewer than all; drawn without replacement) are hidden.  Returns ``(rows,
    observed, heldout)``: the indices of those rows, their data with the
    hidden items set to 0, and a boolean array of the hidden items.
    """
    X = X.toarray() if hasattr(X, "toarray") else np.asarray(X)  # scipy.sparse or dense
    if X.ndim != 2:
        raise ValueError(f"X must be a users x items matrix, got shape {X.shape}")
    if not 0 < fraction < 1:
        raise ValueError(f"fraction is the share of each user's items hidden, in (0, 1), got {fraction!r}")
    if not (isinstance(min_items, (int, np.integer)) and not isinstance(min_items, bool) and min_items >= 2):
        raise ValueError(f"min_items must be an integer >= 2 (one item hidden, one left to encode), got {min_items!r}")
    rng = np.random.default_rng(seed)
    rows = np.flatnonzero((X != 0).sum(1) >= min_items)
    observed, heldout = X[rows].copy(), np.zeros((rows.size, X.shape[1]), dtype=bool)
    for row, hidden in zip(observed, heldout):
        items = np.flatnonzero(row)
        # At least one item hidden and one left to encode the user by.
        count = min(max(1, round(fraction * items.size)), items.size - 1)
        hidden[rng.choice(items, size=count, replace=False)] = True
        row[hidden] = 0
    return rows, observed, heldout


def _top_k(scores, heldout, k, exclude):
    scores, heldout = np.array(scores, dtype=float), np.asarray(heldout, dtype=bool)
    if scores.ndim != 2 or scores.shape != heldout.shape:
        raise ValueError(f"scores and heldout must be users x items arrays of one shape, got {scores.shape} and "
                         f"{heldout.shape}")
    if not (isinstance(k, (int, np.integer)) and not isinstance(k, bool) and 1 <= k <= scores.shape[1]):
        raise ValueError(f"k must be an integer in 1..{scores.shape[1]} (the items), got {k!r}")
    if np.isnan(scores).any():
        raise ValueError("scores contain NaN: a NaN has no rank (a diverged model?)")
    if not heldout.any(1).all():
        raise ValueError("every user needs at least one held-out item")
    if exclude is not None:
        exclude = np.asarray(exclude, dtype=bool)
        if exclude.shape != scores.shape:
            raise ValueError(f"exclude must have the scores' shape {scores.shape}, got {exclude.shape}")
        scores[exclude] = -np.inf
    # Stable: ties keep the item order, so results repeat.
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(heldout, top, axis=1), heldout.sum(1)


def recall_at_k(scores, heldout, k=5, exclude=None):
    """
    Mean over users of (held-out items among the k best scored) /
    min(k, held-out items): Liang et al.'s normalised Recall@k, which reaches
    1 for a perfect ranking whatever the number of held-out items.
    ``exclude`` (boolean, the scores' shape): items never ranked, such as
    those the user was observed with.
    """
    hits, count = _top_k(scores, heldout, k, exclude)
    return float(np.mean(hits.sum(1) / np.minimum(k, count)))


def ndcg_at_k(scores, heldout, k=10, exclude=None):
    """
    Mean over users of the normalised discounted cumulative gain of the k
    best scored items, with binary relevance (a held-out item) and the
    discount 1 / log2(rank + 1); the ideal ranking puts min(k, held-out
    items) hits first.  ``exclude`` as in :func:`recall_at_k`.
    """
    hits, count = _top_k(scores, heldout, k, exclude)
    discount = 1 / np.log2(np.arange(2, k + 2))
    ideal = np.cumsum(discount)[np.minimum(k, count) - 1]
    return float(np.mean((hits * discount).sum(1) / ideal))
