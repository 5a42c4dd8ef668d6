"""Linear-probe accuracy: shuffled stratified folds, chance and perfect cases, bad input."""

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import cross_val_score

from pyro_sparse.evaluation import linear_probe_accuracy


def ordered_by_sample(n_per_class=200, seed=0):
    """Codes of 3 classes whose last fifth (a second sample) is shifted by one class spacing; rows in file order."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(3), n_per_class)
    sample = np.tile(np.arange(n_per_class) >= 0.8 * n_per_class, 3).astype(float)
    codes = np.stack([2.0 * labels + 2.0 * sample + rng.normal(0, 0.3, labels.size),
                      sample + rng.normal(0, 0.1, labels.size)], axis=1)
    return codes, labels


def test_rows_in_file_order_are_scored_as_if_shuffled():
    codes, labels = ordered_by_sample()
    contiguous = cross_val_score(LogisticRegression(max_iter=5000), codes, labels, cv=5).mean()
    assert contiguous < 0.9  # the last fold holds only the unseen sample: the ordering, not the codes, is measured
    assert linear_probe_accuracy(codes, labels) > 0.95
    order = np.random.default_rng(1).permutation(len(labels))
    assert linear_probe_accuracy(codes[order], labels[order]) == pytest.approx(linear_probe_accuracy(codes, labels),
                                                                               abs=0.02)


def test_separable_codes_score_one_and_noise_scores_chance():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, size=800)
    assert linear_probe_accuracy(np.eye(4)[labels] * 5 + rng.normal(0, 0.1, (800, 4)), labels) == 1.0
    assert linear_probe_accuracy(rng.normal(size=(800, 4)), labels) == pytest.approx(0.25, abs=0.06)


@pytest.mark.parametrize("codes, labels, message", [
    (np.zeros((10, 2)), np.zeros(9), "codes must be"),
    (np.full((10, 2), np.nan), np.arange(10) % 2, "NaN or inf"),
    (np.zeros((10, 2)), np.zeros(10), "at least 2 distinct labels"),
])
def test_bad_input_names_the_problem(codes, labels, message):
    with pytest.raises(ValueError, match=message):
        linear_probe_accuracy(codes, labels)


def test_a_label_rarer_than_the_folds_is_scored_with_a_warning():
    rng = np.random.default_rng(0)
    labels = np.r_[np.zeros(60), np.ones(60), np.full(3, 2)].astype(int)
    codes = np.eye(3)[labels] * 5 + rng.normal(0, 0.1, (len(labels), 3))
    with pytest.warns(UserWarning, match="least populated class"):
        assert linear_probe_accuracy(codes, labels) > 0.95


def test_the_seed_fixes_the_folds():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, size=300)
    codes = np.eye(3)[labels] + rng.normal(0, 0.8, (300, 3))
    assert linear_probe_accuracy(codes, labels, seed=0) == linear_probe_accuracy(codes, labels, seed=0)
    assert len({linear_probe_accuracy(codes, labels, seed=seed) for seed in range(4)}) > 1


@pytest.mark.parametrize("folds", [1, 2.5, True, 11])
def test_impossible_folds_are_refused(folds):
    labels = np.arange(10) % 2
    with pytest.raises(ValueError, match="folds must be"):
        linear_probe_accuracy(np.zeros((10, 2)), labels, folds=folds)
