import numpy as np
import pytest

from pyro_sparse import evaluation
from pyro_sparse.evaluation import (
    dci_disentanglement,
    dci_from_importance,
    disentanglement,
    heldout_nll,
    importance_matrix,
    match_factors,
    mse,
    support_f_score,
)


@pytest.fixture(scope="module")
def z_true():
    return np.random.default_rng(0).normal(size=(1000, 4))


def _nonlinear_codes(z_true, perm, n_noise, seed=1):
    """Coordinate-wise monotone transforms of permuted factors, plus pure noise."""
    rng = np.random.default_rng(seed)
    z = z_true[:, perm]
    maps = [lambda t: t**3, np.tanh, lambda t: np.exp(0.5 * t), lambda t: 2.0 * t - 1.0]
    columns = [maps[i % len(maps)](z[:, i]) for i in range(z.shape[1])]
    columns += [rng.normal(size=z.shape[0]) for _ in range(n_noise)]
    return np.column_stack(columns)


# Normalised 4x4 Hadamard matrix: orthogonal, and every code loads equally on
# every factor, the most entangled rotation there is.
_HADAMARD = 0.5 * np.array(
    [[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]], dtype=float
)


# ---------------------------------------------------------------- DCI from R


def test_dci_identity_is_one():
    assert dci_from_importance(np.eye(3)) == pytest.approx(1.0)


def test_dci_one_code_shared_equally_is_zero():
    assert dci_from_importance(np.array([[1.0, 1.0]])) == pytest.approx(0.0)


def test_dci_hand_computed_mixture():
    # Code 0 is pure (D=1, weight 1/3); code 1 splits evenly (D=0, weight 2/3).
    R = np.array([[1.0, 0.0], [1.0, 1.0]])
    assert dci_from_importance(R) == pytest.approx(1.0 / 3.0)


def test_dci_hand_computed_unequal_split():
    # P = (3/4, 1/4): H_2 = -(0.75 log2 0.75 + 0.25 log2 0.25) = 0.8112781...
    R = np.array([[3.0, 1.0]])
    assert dci_from_importance(R) == pytest.approx(1.0 - 0.8112781244591328)


def test_dci_entropy_uses_base_J():
    # Code 0 half/half over 2 of 3 factors: H_3 = log 2 / log 3, not 1; code 1 pure.  Weights 2/3 and 1/3.
    R = np.array([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    assert dci_from_importance(R) == pytest.approx(2 / 3 * (1.0 - np.log(2) / np.log(3)) + 1 / 3)


def test_dci_leaves_out_factors_no_code_predicts():
    # A constant true factor has an all-zero column: it must not widen the base (codes mixing the two real
    # factors equally score 0, not 1 - log 2 / log 3).
    assert dci_from_importance(np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])) == pytest.approx(0.0)
    rng = np.random.default_rng(0)
    z = rng.normal(size=(1000, 3))
    mixed = z @ np.array([[1.0, 1.0, -1.0], [1.0, -1.0, 1.0], [-1.0, 1.0, 1.0]])
    with_constant = np.c_[z, np.ones(1000)]
    assert dci_disentanglement(mixed, with_constant) == pytest.approx(dci_disentanglement(mixed, z))
    with pytest.raises(ValueError, match="all but one are constant"):
        dci_from_importance(np.array([[1.0, 0.0], [2.0, 0.0]]))


def test_dci_is_invariant_to_a_heavy_tailed_monotone_code():
    # exp(10 z) spans 1e±13: centred before the regressor's float32 cast, its small values merged into ties.
    z = np.random.default_rng(0).normal(size=(1000, 3))
    assert dci_disentanglement(np.exp(10 * z), z) == pytest.approx(dci_disentanglement(z, z), abs=0.02)


def test_dci_unused_codes_get_zero_weight():
    R = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    assert dci_from_importance(R) == pytest.approx(1.0)


def test_dci_all_zero():
    assert dci_from_importance(np.zeros((3, 2))) == 0.0


def test_dci_rejects_negative_importance():
    with pytest.raises(ValueError, match="non-negative"):
        dci_from_importance(np.array([[1.0, -0.1]]))


def test_dci_disentanglement_uses_importance_matrix(monkeypatch):
    monkeypatch.setattr(disentanglement, "importance_matrix", lambda *a, **k: np.array([[1.0, 0.0], [1.0, 1.0]]))
    assert evaluation.dci_disentanglement(np.zeros((5, 2)), np.zeros((5, 2))) == pytest.approx(1.0 / 3.0)


# ------------------------------------------------------- DCI from real codes


@pytest.fixture(scope="module")
def dci_scores(z_true):
    perm = np.array([2, 0, 3, 1])
    aligned = dci_disentanglement(_nonlinear_codes(z_true, perm, n_noise=3), z_true)
    mixed = dci_disentanglement(z_true @ _HADAMARD, z_true)
    return aligned, mixed


def test_dci_high_for_nonlinear_axis_aligned_codes(dci_scores):
    aligned, _ = dci_scores
    assert aligned > 0.8


def test_dci_low_for_rotated_codes(dci_scores):
    _, mixed = dci_scores
    assert mixed < 0.5


def test_dci_orders_aligned_above_rotated(dci_scores):
    aligned, mixed = dci_scores
    assert aligned - mixed > 0.4


def test_importance_matrix_shape_and_columns(z_true):
    z_est = _nonlinear_codes(z_true, np.arange(4), n_noise=2)
    R = importance_matrix(z_est, z_true)
    assert R.shape == (6, 4)
    assert np.all(R >= 0)
    np.testing.assert_allclose(R.sum(axis=0), 1.0)
    # The code built from factor j must dominate factor j's column.
    np.testing.assert_array_equal(R.argmax(axis=0), np.arange(4))


def test_importance_matrix_subsamples_large_n_reproducibly(monkeypatch):
    fitted_rows = []

    class Recording(disentanglement.GradientBoostingRegressor):
        def fit(self, X, y, **kwargs):
            fitted_rows.append(X.shape[0])
            return super().fit(X, y, **kwargs)

    monkeypatch.setattr(disentanglement, "GradientBoostingRegressor", Recording)
    rng = np.random.default_rng(3)
    z_true = rng.normal(size=(5000, 2))
    z_est = np.column_stack([z_true[:, 1], z_true[:, 0] ** 3])
    R1 = importance_matrix(z_est, z_true, random_state=7)
    R2 = importance_matrix(z_est, z_true, random_state=7)
    np.testing.assert_array_equal(R1, R2)
    np.testing.assert_array_equal(R1.argmax(axis=0), [1, 0])
    assert fitted_rows == [2000] * 4


def test_importance_matrix_rejects_row_mismatch_and_nan():
    with pytest.raises(ValueError, match="same number of rows"):
        importance_matrix(np.zeros((10, 2)), np.zeros((9, 2)))
    bad = np.ones((10, 2))
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        importance_matrix(bad, np.ones((10, 1)))


# ------------------------------------------------------------- match_factors


def test_match_factors_recovers_permutation(z_true):
    perm = np.array([2, 0, 3, 1])
    # Code i is a transform of factor perm[i], so factor j sits at code inv[j].
    z_est = _nonlinear_codes(z_true, perm, n_noise=3)
    matching = match_factors(z_est, z_true)
    np.testing.assert_array_equal(matching, np.argsort(perm))


def test_match_factors_non_monotone_relation():
    rng = np.random.default_rng(5)
    z_true = rng.normal(size=(800, 2))
    # 3 z^2 is uncorrelated with z, so a correlation-based matching would fail.
    z_est = np.column_stack([rng.normal(size=800), z_true[:, 1] + 0.1, 3 * z_true[:, 0] ** 2])
    np.testing.assert_array_equal(match_factors(z_est, z_true), [2, 1])


def test_match_factors_needs_enough_codes():
    with pytest.raises(ValueError, match="at least as many columns"):
        match_factors(np.zeros((20, 2)), np.zeros((20, 3)))


# ----------------------------------------------------------- support_f_score


@pytest.fixture
def truth():
    return np.array([[1, 0], [1, 1], [0, 1]], dtype=bool)


def test_support_perfect_with_permutation(truth):
    # True factor 0 lives in column 2, factor 1 in column 0; column 1 is unused.
    W = np.zeros((3, 3))
    W[:, 2] = truth[:, 0] * 0.7
    W[:, 0] = truth[:, 1] * -1.3
    assert support_f_score(W, truth, np.array([2, 0])) == 1.0


def test_support_false_positive_in_unmatched_column(truth):
    W = np.zeros((3, 3))
    W[:, 0] = truth[:, 0]
    W[:, 1] = truth[:, 1]
    W[0, 2] = 0.01  # column 2 is matched to nothing
    # TP = 4, FP = 1, FN = 0 -> 8 / 9
    assert support_f_score(W, truth, [0, 1]) == pytest.approx(8 / 9)


def test_support_false_negative(truth):
    W = truth.astype(float)
    W[1, 1] = 0.0
    # TP = 3, FP = 0, FN = 1 -> 6 / 7
    assert support_f_score(W, truth, [0, 1]) == pytest.approx(6 / 7)


def test_support_accepts_boolean_mask_and_empty_case(truth):
    assert support_f_score(truth, truth, [0, 1]) == 1.0
    empty = np.zeros((3, 2), dtype=bool)
    assert support_f_score(empty, empty, [0, 1]) == 1.0
    assert support_f_score(empty, truth, [0, 1]) == 0.0


def test_support_shape_errors(truth):
    with pytest.raises(ValueError, match="same number of rows"):
        support_f_score(np.ones((4, 2)), truth, [0, 1])
    with pytest.raises(ValueError, match="one entry per true factor"):
        support_f_score(np.ones((3, 3)), truth, [0, 1, 2])
    with pytest.raises(ValueError, match="outside"):
        support_f_score(np.ones((3, 2)), truth, [0, 2])
    with pytest.raises(ValueError, match="distinct"):
        support_f_score(np.ones((3, 2)), truth, [1, 1])
    with pytest.raises(ValueError, match="2-D"):
        support_f_score(np.ones(3), truth, [0, 1])


# ------------------------------------------------------------ nll and mse


def test_heldout_nll():
    assert heldout_nll(np.array([-1.0, -2.0, -3.0])) == pytest.approx(2.0)
    assert heldout_nll([-np.inf, -1.0]) == np.inf


@pytest.mark.parametrize("bad", [np.array([]), np.array([-1.0, np.nan]), np.zeros((2, 2))])
def test_heldout_nll_rejects(bad):
    with pytest.raises(ValueError):
        heldout_nll(bad)


def test_mse():
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    assert mse(x, x) == 0.0
    assert mse(x, x + np.array([[1.0, -1.0], [2.0, 0.0]])) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="same shape"):
        mse(x, x.T[:1])
    with pytest.raises(ValueError, match="empty"):
        mse(np.zeros((0, 2)), np.zeros((0, 2)))
