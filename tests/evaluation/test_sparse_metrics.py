"""Tests for the sparse-coding metrics of Fallah & Rozell (ICML 2022)."""

import numpy as np
import pytest

from pyro_sparse.evaluation import (
    feature_collapse,
    gradient_snr,
    multi_information,
    posterior_collapse,
    support,
    support_jaccard,
)

N = 2000
# Spread of the kNN estimate across seeds at N = 2000 is about +-0.05 nats;
# the fixed seeds below sit well inside these bounds, so a biased estimator
# (e.g. plain KSG on the raw spike-and-slab codes, which gives 0.1-0.4 nats of
# spurious dependence for K = 4-8) fails while seed noise does not.
_INDEPENDENT_TOL = 0.08
_GAUSSIAN_TOL = 0.1


def _spike_and_slab(rng, n, k, p_on, slab=np.random.Generator.normal):
    return slab(rng, size=(n, k)) * (rng.random((n, k)) < p_on)


def _soft_threshold(x, lam):
    return np.sign(x) * np.maximum(np.abs(x) - lam, 0.0)


def _gaussian(rng, corr, n=N):
    return rng.multivariate_normal(np.zeros(len(corr)), corr, size=n)


def _equicorrelated(k, rho):
    corr = np.full((k, k), rho)
    np.fill_diagonal(corr, 1.0)
    return corr


# ------------------------------------------------------------ multi-information


@pytest.mark.parametrize("m, k", [(2, 3), (3, 2), (4, 5)])
def test_ksg_counts_the_points_strictly_inside_the_radius(m, k):
    # Kraskov et al. (2004), Algorithm 1, written out by brute force: n_j counts the other points strictly
    # within eps_i along coordinate j (the k-th neighbour, which sets eps_i, is on the boundary).
    from scipy.special import digamma

    from pyro_sparse.evaluation.disentanglement import _ksg_total_correlation

    x = _gaussian(np.random.default_rng(m), _equicorrelated(m, 0.5), n=300) * 3
    distances = np.abs(x[:, None, :] - x[None, :, :])
    eps = np.sort(distances.max(-1), axis=1)[:, k]  # column 0 is the point itself
    counts = (distances < eps[:, None, None]).sum(1) - 1  # (n, m), without the point itself
    expected = digamma(k) + (m - 1) * digamma(len(x)) - digamma(counts + 1).sum(1).mean()
    assert _ksg_total_correlation(x, k) == pytest.approx(expected, rel=1e-12)


def test_mi_independent_laplace_is_zero():
    codes = np.random.default_rng(0).laplace(size=(N, 4))
    assert abs(multi_information(codes)) < _INDEPENDENT_TOL


@pytest.mark.parametrize(
    "p_on, slab", [(0.3, np.random.Generator.normal), (0.1, np.random.Generator.laplace)]
)
def test_mi_independent_spike_and_slab_is_zero(p_on, slab):
    # Most entries are exactly 0: the atom must not be mistaken for dependence.
    codes = _spike_and_slab(np.random.default_rng(1), N, 6, p_on, slab)
    assert np.mean(codes == 0) > 0.6
    assert abs(multi_information(codes)) < _INDEPENDENT_TOL


def test_mi_independent_soft_thresholded_is_zero():
    # The thresholded-Gaussian codes of the paper, with independent bases.
    codes = _soft_threshold(np.random.default_rng(2).normal(size=(N, 5)), 1.0)
    assert abs(multi_information(codes)) < _INDEPENDENT_TOL


def test_mi_constant_column_adds_nothing():
    rng = np.random.default_rng(3)
    codes = np.column_stack([rng.laplace(size=(N, 3)), np.zeros(N)])
    assert abs(multi_information(codes)) < _INDEPENDENT_TOL


@pytest.mark.parametrize("k, rho, seed", [(2, 0.8, 4), (3, 0.6, 5), (4, 0.5, 6)])
def test_mi_gaussian_matches_closed_form(k, rho, seed):
    corr = _equicorrelated(k, rho)
    expected = -0.5 * np.linalg.slogdet(corr)[1]
    codes = _gaussian(np.random.default_rng(seed), corr)
    assert multi_information(codes) == pytest.approx(expected, abs=_GAUSSIAN_TOL)


def test_mi_gaussian_closed_form_survives_rescaling_and_monotone_maps():
    # Multi-information is invariant to invertible coordinate-wise maps; the
    # estimator works on ranks, so with the same seed it is exactly invariant.
    corr = np.array([[1.0, 0.7, 0.0], [0.7, 1.0, 0.3], [0.0, 0.3, 1.0]])
    z = _gaussian(np.random.default_rng(7), corr)
    warped = np.column_stack([100.0 * z[:, 0], z[:, 1] ** 3, np.exp(z[:, 2])])
    base = multi_information(z, random_state=1)
    assert multi_information(warped, random_state=1) == base
    assert base == pytest.approx(-0.5 * np.linalg.slogdet(corr)[1], abs=_GAUSSIAN_TOL)


def test_mi_dependent_sparse_codes_are_positive():
    rng = np.random.default_rng(8)
    # Soft-thresholded correlated Gaussians: sparse and dependent.
    thresholded = _soft_threshold(_gaussian(rng, _equicorrelated(4, 0.7)), 1.0)
    assert np.mean(thresholded == 0) > 0.5
    assert multi_information(thresholded) > 0.3
    # A shared on/off gate: dependent through the supports alone.
    gate = rng.random((N, 1)) < 0.3
    assert multi_information(rng.normal(size=(N, 4)) * gate) > 0.5


def _binary_mutual_information(table):
    table = np.asarray(table, dtype=float)
    outer = np.outer(table.sum(axis=1), table.sum(axis=0))
    nonzero = table > 0
    return float(np.sum(table[nonzero] * np.log(table[nonzero] / outer[nonzero])))


@pytest.mark.parametrize(
    "table, tol, seed",
    [
        ([[0.6, 0.1], [0.1, 0.2]], 0.05, 13),  # I(b1; b2) = 0.133 nats
        ([[0.7, 0.0], [0.0, 0.3]], 0.1, 14),  # shared gate: H(0.3) = 0.611 nats
    ],
)
def test_mi_support_only_dependence_matches_closed_form(table, tol, seed):
    # z_i = b_i * s_i with slabs s_i iid Laplace, independent of the gates b:
    # then the multi-information is exactly I(b_1; b_2), all of it carried by
    # the atom at 0. Dithering the zeros with tiny noise instead of the
    # distributional transform recovers only a fraction of it (~0.03 and
    # ~0.37 nats here).
    rng = np.random.default_rng(seed)
    cell = rng.choice(4, size=N, p=np.ravel(table))
    gates = np.column_stack([cell // 2, cell % 2])
    codes = rng.laplace(size=(N, 2)) * gates
    expected = _binary_mutual_information(table)
    assert multi_information(codes) == pytest.approx(expected, abs=tol)


def test_mi_grows_with_correlation():
    rng = np.random.default_rng(9)
    values = [multi_information(_gaussian(rng, _equicorrelated(3, r))) for r in (0.0, 0.4, 0.8)]
    assert values[0] < values[1] < values[2]


def test_mi_reproducible_and_seed_dependent():
    codes = _spike_and_slab(np.random.default_rng(10), 500, 3, 0.3)
    assert multi_information(codes, random_state=3) == multi_information(codes, random_state=3)
    # Tie-breaking is random, so a different seed gives a (slightly) different value.
    assert multi_information(codes, random_state=3) != multi_information(codes, random_state=4)


def test_mi_subsamples_large_inputs():
    codes = np.random.default_rng(11).laplace(size=(3000, 3))
    small = multi_information(codes, max_samples=500, random_state=0)
    assert small == multi_information(codes, max_samples=500, random_state=0)
    assert abs(small) < 0.15


def test_mi_single_dimension_is_zero():
    assert multi_information(np.random.default_rng(12).normal(size=(50, 1))) == 0.0


def test_mi_rejects_bad_input():
    with pytest.raises(ValueError, match="NaN"):
        multi_information(np.array([[0.0, 1.0], [np.nan, 2.0], [1.0, 1.0]]))
    with pytest.raises(ValueError, match="2-D"):
        multi_information(np.zeros(10))
    with pytest.raises(ValueError, match="more than k"):
        multi_information(np.random.default_rng(0).normal(size=(3, 2)), k=3)


# ------------------------------------------------------------ gradient SNR


def test_snr_hand_computed():
    # Parameter 0: draws 1, 3, 2 -> mean 2, sample std 1 -> SNR 2.
    # Parameter 1: draws 0, 2, 4 -> mean 2, sample std 2 -> SNR 1.
    # Parameter 2: always exactly 0 -> 0/0, left out.
    grads = np.array([[1.0, 0.0, 0.0], [3.0, 2.0, 0.0], [2.0, 4.0, 0.0]])
    assert gradient_snr(grads) == pytest.approx(1.5)
    # Population std: sqrt(2/3) and sqrt(8/3) -> SNRs sqrt(6) and sqrt(3/2).
    assert gradient_snr(grads, ddof=0) == pytest.approx((np.sqrt(6.0) + np.sqrt(1.5)) / 2)


def test_snr_ignores_sign_and_flattens_parameter_axes():
    grads = np.random.default_rng(0).normal(loc=0.5, size=(100, 2, 3))
    assert gradient_snr(grads) == pytest.approx(gradient_snr(-grads.reshape(100, 6)))


def test_snr_noiseless_gradient_is_inf_and_all_zero_is_nan():
    assert gradient_snr(np.array([[1.0, 1.0], [1.0, 3.0]])) == np.inf
    assert np.isnan(gradient_snr(np.zeros((5, 3))))


def test_snr_rejects_bad_input():
    with pytest.raises(ValueError, match="at least 2"):
        gradient_snr(np.ones((1, 3)))
    with pytest.raises(ValueError, match="NaN"):
        gradient_snr(np.array([[1.0], [np.nan]]))


# ------------------------------------------------------------ support Jaccard


def test_jaccard_identical_supports_is_one():
    rng = np.random.default_rng(0)
    support = rng.random((4, 6)) < 0.5
    # Different non-zero values, same support in every draw.
    draws = np.stack([support * rng.uniform(0.5, 2.0, size=(4, 6)) for _ in range(5)])
    assert support_jaccard(draws) == pytest.approx(1.0)


def test_jaccard_disjoint_supports_is_zero():
    draws = np.array([[[1.0, 2.0, 0.0, 0.0]], [[0.0, 0.0, -1.0, 3.0]]])
    # Pairing a draw with itself would wrongly give (1 + 0 + 0 + 1) / 4 = 0.5.
    assert support_jaccard(draws) == pytest.approx(0.0)


def test_jaccard_hand_example_three_draws():
    # Point 0: S1 = {0, 1}, S2 = {1, 2}, S3 = {0, 1, 2}
    #   C12 = 1/3, C13 = 2/3, C23 = 2/3 -> mean 5/9.
    # Point 1: every draw uses {3} -> 1.
    draws = np.array(
        [
            [[0.5, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 2.0]],
            [[0.0, -1.0, 3.0, 0.0], [0.0, 0.0, 0.0, 1.0]],
            [[2.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 7.0]],
        ]
    )
    assert support_jaccard(draws, per_point=True) == pytest.approx([5 / 9, 1.0])
    assert support_jaccard(draws) == pytest.approx(7 / 9)


def test_jaccard_never_pairs_different_data_points():
    # Each point is perfectly consistent with itself but uses its own feature;
    # pairing draws across points would drag the score below 1.
    draws = np.zeros((3, 2, 2))
    draws[:, 0, 0] = 1.0
    draws[:, 1, 1] = 1.0
    assert support_jaccard(draws) == pytest.approx(1.0)


def test_jaccard_empty_supports():
    # Two empty supports are identical (1); empty vs non-empty share nothing (0).
    assert support_jaccard(np.zeros((2, 1, 3))) == 1.0
    assert support_jaccard(np.array([[[0.0, 0.0]], [[0.0, 1.0]]])) == 0.0


def test_jaccard_feature_mask():
    draws = np.array([[[1.0, 1.0, 0.0]], [[1.0, 0.0, 1.0]]])
    assert support_jaccard(draws) == pytest.approx(1 / 3)
    # Keeping only features 0 and 1 (e.g. ||a_i||^2 > 0.1): {0, 1} vs {0}.
    assert support_jaccard(draws, features=np.array([True, True, False])) == pytest.approx(0.5)


def test_jaccard_matches_brute_force_across_chunks(monkeypatch):
    rng = np.random.default_rng(1)
    draws = rng.normal(size=(4, 30, 8)) * (rng.random((4, 30, 8)) < 0.4)

    def brute(point):
        sets = [set(np.flatnonzero(draws[j, point])) for j in range(4)]
        values = [
            len(a & b) / len(a | b) if a | b else 1.0
            for m, a in enumerate(sets)
            for n, b in enumerate(sets)
            if m != n
        ]
        return np.mean(values)

    expected = [brute(i) for i in range(30)]
    # A tiny chunk forces several batched blocks, covering the chunk seams.
    monkeypatch.setattr(support, "_JACCARD_CHUNK_ENTRIES", 7 * 16)
    assert support_jaccard(draws, per_point=True) == pytest.approx(expected)


def test_jaccard_rejects_bad_input():
    with pytest.raises(ValueError, match="at least 2 draws"):
        support_jaccard(np.ones((1, 3, 2)))
    with pytest.raises(ValueError, match="3-D|draws, data points"):
        support_jaccard(np.ones((3, 2)))
    with pytest.raises(ValueError, match="boolean"):
        support_jaccard(np.ones((2, 1, 3)), features=np.array([1, 0, 1]))


# ------------------------------------------------------------ collapse (Eqs. 15-16)


def test_posterior_collapse_delta_boundary():
    # 20 data points, eps = 1e-2, delta = 5e-2 -> collapsed iff >= 19 of 20 small.
    kl = np.full((20, 4), 0.001)
    kl[:1, 1] = 1.0  # 19/20 small: exactly 1 - delta, collapsed (inclusive).
    kl[:2, 2] = 1.0  # 18/20 small: not collapsed.
    kl[:, 3] = 5.0  # never small.
    assert posterior_collapse(kl) == pytest.approx(2 / 4)
    # delta = 0 demands every data point: only dimension 0 remains.
    assert posterior_collapse(kl, delta=0.0) == pytest.approx(1 / 4)
    # delta = 0.1 admits 18/20 too.
    assert posterior_collapse(kl, delta=0.1) == pytest.approx(3 / 4)


def test_posterior_collapse_eps_is_inclusive_and_inf_is_not_collapsed():
    kl = np.array([[1e-2, np.inf], [-1e-4, np.inf]])
    assert posterior_collapse(kl) == pytest.approx(0.5)
    assert posterior_collapse(kl, eps=1e-3) == pytest.approx(0.0)


def test_posterior_collapse_rejects_nan():
    with pytest.raises(ValueError, match="NaN"):
        posterior_collapse(np.array([[0.0, np.nan]]))
    with pytest.raises(ValueError, match="delta"):
        posterior_collapse(np.zeros((2, 2)), delta=1.5)


def test_feature_collapse_hand_example():
    # 20 points: dim 0 always 0; dim 1 non-zero once (19/20, collapsed);
    # dim 2 non-zero twice (18/20, not); dim 3 is +-eps, which counts as zero.
    codes = np.zeros((20, 4))
    codes[:1, 1] = -0.5
    codes[:2, 2] = 0.3
    codes[:, 3] = np.where(np.arange(20) % 2, 1e-2, -1e-2)
    assert feature_collapse(codes) == pytest.approx(3 / 4)
    assert feature_collapse(codes, eps=1e-3) == pytest.approx(2 / 4)
    assert feature_collapse(codes, delta=0.1) == pytest.approx(1.0)


def test_feature_collapse_all_zero_codes_fully_collapsed():
    assert feature_collapse(np.zeros((10, 7))) == 1.0
    assert feature_collapse(np.ones((10, 7))) == 0.0
