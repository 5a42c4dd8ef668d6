"""Recall@k and NDCG@k (Liang et al. 2018) against hand computations, and the fold-in split."""

import math

import numpy as np
import pytest
import scipy.sparse as sp

from pyro_sparse.evaluation import hide_items, ndcg_at_k, recall_at_k


def test_metrics_match_a_hand_computation():
    # Two users, six items.  User 0 holds out items 1 and 4; user 1 item 5.
    scores = np.array([[0.9, 0.8, 0.7, 0.6, 0.5, 0.4],
                       [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]])
    heldout = np.array([[0, 1, 0, 0, 1, 0],
                        [0, 0, 0, 0, 0, 1]], dtype=bool)
    # k = 2: user 0 ranks items 0, 1 (one hit of min(2, 2)); user 1 ranks 5, 4 (one hit of min(2, 1)).
    assert recall_at_k(scores, heldout, k=2) == pytest.approx((1 / 2 + 1 / 1) / 2)
    # NDCG@3: user 0 hits at rank 2 of ideal ranks 1-2; user 1 at rank 1 of ideal rank 1.
    user0 = (1 / math.log2(3)) / (1 + 1 / math.log2(3))
    assert ndcg_at_k(scores, heldout, k=3) == pytest.approx((user0 + 1) / 2)
    # Excluding user 0's item 0 (one it was observed with): its top 3 is items 1, 2, 3, a hit at rank 1.
    exclude = np.zeros_like(heldout)
    exclude[0, 0] = True
    assert ndcg_at_k(scores, heldout, k=3, exclude=exclude) == pytest.approx((1 / (1 + 1 / math.log2(3)) + 1) / 2)
    assert recall_at_k(scores, heldout, k=6) == 1.0  # every held-out item is somewhere in the ranking


def test_a_perfect_ranking_scores_one_and_a_reversed_one_less():
    rng = np.random.default_rng(0)
    heldout = rng.random((20, 30)) < 0.2
    heldout[:, 0] = True  # every user holds out something
    perfect = heldout + rng.random((20, 30)) * 0.5
    assert recall_at_k(perfect, heldout, k=5) == 1.0 and ndcg_at_k(perfect, heldout, k=10) == pytest.approx(1.0)
    assert ndcg_at_k(-perfect, heldout, k=10) < 0.5


def test_hide_items_hides_a_share_of_each_eligible_users_items():
    rng = np.random.default_rng(1)
    X = (rng.random((50, 40)) < 0.3).astype(float)
    X[3] = 0
    X[3, :4] = 1  # four items: below min_items
    rows, observed, heldout = hide_items(X, fraction=0.2, min_items=5, seed=2)
    assert 3 not in rows and rows.size == 49
    for row, seen, held in zip(rows, observed, heldout):
        items = np.flatnonzero(X[row])
        assert held.sum() == max(1, round(0.2 * items.size))
        assert (X[row][held] == 1).all() and (seen[held] == 0).all()
        np.testing.assert_array_equal(seen + held, X[row])
    _, nearly_all_hidden, _ = hide_items(X, fraction=0.95, min_items=5)
    assert (nearly_all_hidden.sum(1) >= 1).all()  # one item is always left to encode the user by
    again = hide_items(sp.csr_matrix(X), fraction=0.2, min_items=5, seed=2)  # sparse input, same seed: same split
    for a, b in zip(again, (rows, observed, heldout)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("call, message", [
    (lambda: recall_at_k(np.zeros((2, 3)), np.ones((2, 4), dtype=bool)), "one shape"),
    (lambda: recall_at_k(np.zeros((2, 3)), np.ones((2, 3), dtype=bool), k=4), "k must be an integer in 1..3"),
    (lambda: ndcg_at_k(np.zeros((2, 3)), np.eye(2, 3, dtype=bool) * [[1], [0]], k=2), "at least one held-out item"),
    (lambda: recall_at_k(np.zeros((2, 3)), np.ones((2, 3), dtype=bool), k=2, exclude=np.zeros(3)), "exclude must have"),
    (lambda: hide_items(np.ones((3, 5)), fraction=1.0), r"fraction .* in \(0, 1\)"),
    (lambda: hide_items(np.ones((3, 5)), min_items=0), "min_items must be an integer >= 2"),
    (lambda: recall_at_k(np.full((1, 4), np.nan), np.array([[1, 1, 0, 0]], dtype=bool), k=2), "NaN"),
])
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()
