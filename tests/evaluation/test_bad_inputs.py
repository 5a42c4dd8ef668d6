"""Metrics name bad input (NaN from a diverged fit, malformed arguments) instead of returning a number."""

import numpy as np
import pytest

from pyro_sparse import evaluation
from pyro_sparse.evaluation import collapse, dictionary, disentanglement, support

Z = np.random.default_rng(0).normal(size=(50, 2))
W = np.array([[1.0, 0.0], [0.0, 2.0], [0.5, 0.0]])
TRUTH = np.array([[1, 0], [0, 1], [1, 0]], dtype=bool)

CASES = [
    (lambda: support.support_f_score(np.where(W == 0, np.nan, W), TRUTH, [0, 1]), "W_est contains NaN"),
    (lambda: support.support_f_score(W, np.where(TRUTH, np.nan, 0.0), [0, 1]), "true_support contains NaN"),
    (lambda: evaluation.code_stability([Z, np.full_like(Z, np.nan)]), "NaN or infinite"),
    (lambda: evaluation.code_stability([Z, Z], [TRUTH]), "one support per fit: 2 fits, 1 supports"),
    (lambda: evaluation.code_stability([Z, Z], [TRUTH, TRUTH[:2]]), "same number of features"),
    (lambda: evaluation.code_stability([Z, Z], [TRUTH, np.where(TRUTH, np.nan, 0.0)]), "supports contain NaN"),
    (lambda: evaluation.code_stability([Z[:, 0], Z[:, 0]]), "2-D"),
    (lambda: evaluation.mse([1.0, np.nan], [1.0, 2.0]), "NaN or infinite"),
    (lambda: disentanglement.multi_information(Z, k=2.7), "k must be a positive integer"),
    (lambda: collapse.gradient_snr(np.ones((5, 3)), ddof=-1), "ddof must be a non-negative integer"),
    (lambda: collapse.posterior_collapse(np.zeros((4, 2)), eps=None), "eps must be a number"),
    (lambda: collapse.posterior_collapse(np.array([[-np.inf, 1.0]] * 4)), "contains -inf"),
    (lambda: disentanglement.dci_from_importance(np.array([[0.3], [0.7]])), "at least 2 true factors"),
    (lambda: support.support_jaccard(np.ones((3, 4, 2)), features=np.zeros(2, bool)), "selects no dimension"),
    (lambda: dictionary.code_density(np.zeros((0, 3))), "codes is empty"),
    (lambda: dictionary.dictionary_grid(np.zeros((4, 0))), "dictionary is empty"),
    (lambda: dictionary.dictionary_grid(np.ones((4, 2)), patch_shape=4), "patch_shape must be two positive"),
    (lambda: dictionary.dictionary_grid(np.ones((4, 2)), patch_shape=(-2, -2)), "patch_shape must be two positive"),
]


@pytest.mark.parametrize("call, message", CASES, ids=[message for _, message in CASES])
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_one_statistic_may_be_named_by_itself():
    from pyro_sparse.evaluation.diagnostics import STATISTICS, predictive_checks

    assert "mean" in STATISTICS
    with pytest.raises(ValueError, match=r"unknown statistics \['means'\]"):  # not ['a', 'e', 'm', 'n', 's']
        predictive_checks(None, statistics="means")
