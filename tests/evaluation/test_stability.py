"""Seed stability of factors: matched code correlations and support Jaccard across fits."""

import numpy as np
import pytest

from pyro_sparse.evaluation import code_stability


@pytest.fixture
def codes():
    rng = np.random.default_rng(0)
    return rng.normal(size=(500, 3))


def test_the_same_factors_in_another_order_and_sign_are_stable(codes):
    shuffled = -2 * codes[:, [2, 0, 1]] + 1
    support = np.eye(3, dtype=bool).repeat(2, axis=0)
    result = code_stability([codes, shuffled], [support, support[:, [2, 0, 1]]])
    assert result.code_correlation == pytest.approx(1.0)
    assert result.support_jaccard == pytest.approx(1.0)


def test_unrelated_factors_are_not_stable(codes):
    other = np.random.default_rng(1).normal(size=codes.shape)
    assert code_stability([codes, other]).code_correlation < 0.15


def test_a_missing_factor_counts_zero(codes):
    fewer = codes.copy()
    fewer[:, 2] = 0.0  # a collapsed code is not active
    result = code_stability([codes, fewer])
    assert result.code_correlation == pytest.approx(2 / 3)


@pytest.mark.parametrize("value", [0.0, 0.3, 1 / 3, 0.7])
def test_constant_codes_are_no_factors_whatever_their_value(codes, value):
    # A dead code whose column of W still reads features is a bias, not a factor: identical fits agree at 1
    # (its sd rounds to 6e-17 at 0.3; two such columns once scored |corr| = 1, and then 0 against each other).
    support = np.array([[1, 0], [0, 1], [1, 1]], dtype=bool)
    dead = [np.c_[codes[:, 0], np.full(len(codes), value)] for _ in range(2)]
    assert code_stability(dead, [support, support]).code_correlation == pytest.approx(1.0)
    assert code_stability(dead, min_variance=0.0).code_correlation == pytest.approx(1.0)
    # Against a fit whose second code is alive, the dead one is a factor missing: it counts 0.
    alive = np.c_[codes[:, 0], codes[:, 1]]
    assert code_stability([dead[0], alive], [support, support]).code_correlation == pytest.approx(0.5)


def test_rotated_factors_score_below_one(codes):
    angle = np.pi / 6
    rotation = np.array([[np.cos(angle), -np.sin(angle), 0], [np.sin(angle), np.cos(angle), 0], [0, 0, 1]])
    score = code_stability([codes, codes @ rotation]).code_correlation
    assert 0.85 < score < 0.95  # cos 30° = 0.87 for two of the three factors


def test_supports_are_matched_by_jaccard():
    a = np.array([[1, 0], [1, 0], [0, 1], [0, 1]], dtype=bool)
    b = np.array([[0, 1], [0, 1], [1, 0], [0, 0]], dtype=bool)  # swapped, one member lost
    result = code_stability([np.eye(4)[:, :2], np.eye(4)[:, [1, 0]]], [a, b])
    assert result.support_jaccard == pytest.approx((1.0 + 0.5) / 2)


def test_needs_two_fits_of_the_same_points(codes):
    with pytest.raises(ValueError, match="at least 2"):
        code_stability([codes])
    with pytest.raises(ValueError, match="same data points"):
        code_stability([codes, codes[:10]])


def test_codes_on_another_scale_need_their_own_active_cut_off(codes):
    """Codes of sd 0.05 (an NMF's, say) fall under the unit-prior cut-off of 0.01 unless it is set."""
    small = 0.05 * codes
    with pytest.warns(UserWarning, match=r"fits \[0, 1\] have no active factor.*min_variance=0.01"):
        assert code_stability([small, small]).code_correlation == 0.0
    assert code_stability([small, small], min_variance=1e-4).code_correlation == pytest.approx(1.0)
    with pytest.raises(ValueError, match="min_variance"):
        code_stability([codes, codes], min_variance=-1.0)


@pytest.mark.parametrize("scale", [1e-170, 1e160])
def test_codes_of_extreme_scale_correlate_within_zero_and_one(codes, scale):
    # A code's sd underflowed (or overflowed): identical fits scored 9e307 (or 0.5) instead of 1.
    extreme = codes * np.array([1.0, scale, 1.0])
    support = np.ones((3, 3), dtype=bool)
    assert code_stability([extreme, extreme], [support, support]).code_correlation == pytest.approx(1.0)
