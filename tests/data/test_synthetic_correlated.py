"""The second synthetic generator: correlated factors, anchors, a sparse nonlinear map."""

import numpy as np
import pytest

from pyro_sparse.data.synthetic import random_correlation, synthetic_correlated_factors


def test_shapes_anchors_and_parents():
    data = synthetic_correlated_factors(n=300, num_factors=5, num_features=60, anchors_per_factor=3, seed=2)
    assert data.X.shape == (300, 60) and data.z.shape == (300, 5) and data.support.shape == (60, 5)
    parents = data.support.sum(1)
    assert parents.min() >= 1 and parents.max() <= 3
    for k in range(5):
        anchors = np.flatnonzero(data.support[:, k] & (parents == 1))
        assert len(anchors) >= 3


@pytest.mark.parametrize("seed", range(6))
def test_a_factors_anchors_share_one_map_that_determines_the_factor(seed):
    # Moran et al. (2022), A1: a factor's anchors share one map f_j; it identifies z_k (Theorem 1)
    # only if it is invertible.  Drawn independently, an anchor could carry z² - 1 or |z|: only |z_k|.
    data = synthetic_correlated_factors(n=500, num_factors=6, num_features=50, noise_variance=0.0, seed=seed)
    for k in range(6):
        first, second = np.flatnonzero(data.support[:, k] & (data.support.sum(1) == 1))[:2]
        np.testing.assert_array_equal(data.X[:, first], data.X[:, second])
        order = np.argsort(data.z[:, k])
        steps = np.diff(data.X[order, first])
        assert (steps >= 0).all() or (steps <= 0).all()  # monotone in z_k
    independent = [synthetic_correlated_factors(n=500, num_factors=6, num_features=50, noise_variance=0.0,
                                                anchor_links="independent", seed=seed) for seed in range(6)]
    assert any(not np.array_equal(d.X[:, 0], d.X[:, 1]) for d in independent)
    # Only the anchors' maps differ between the two: the other features are the same draws.
    np.testing.assert_array_equal(independent[seed].X[:, 12:], data.X[:, 12:])


def test_factors_have_the_drawn_correlation():
    data = synthetic_correlated_factors(n=20_000, num_factors=6, max_correlation=0.8, seed=1)
    empirical = np.corrcoef(data.z.T)
    off_diagonal = np.abs(empirical - np.eye(6)).max()
    assert off_diagonal == pytest.approx(0.8, abs=0.03)


def test_random_correlation_is_a_correlation_matrix():
    R = random_correlation(8, 0.8, np.random.default_rng(0))
    assert np.allclose(np.diag(R), 1) and np.allclose(R, R.T)
    assert np.linalg.eigvalsh(R).min() > 0
    assert np.abs(R - np.eye(8)).max() == pytest.approx(0.8)
    with pytest.raises(ValueError, match="max_correlation"):
        random_correlation(3, 1.0, np.random.default_rng(0))


@pytest.mark.parametrize("num_factors", [1, 2, 3, 4])
def test_few_factors_give_valid_correlations_and_supports(num_factors):
    # Three 2-D directions can all be 60 degrees apart (|cos| 0.5): scaled up to 0.8 their Gram matrix would
    # leave R with a negative eigenvalue (16 % of seeds at K = 3 before they were drawn again).
    for seed in range(200):
        R = random_correlation(num_factors, 0.8, np.random.default_rng(seed))
        assert np.linalg.eigvalsh(R).min() > 0
        assert num_factors == 1 or np.abs(R - np.eye(num_factors)).max() == pytest.approx(0.8)
    data = synthetic_correlated_factors(n=50, num_factors=num_factors, num_features=20, max_parents=3)
    assert data.support.sum(1).max() <= num_factors and data.support.any(1).all()


def test_the_map_is_fixed_by_the_seed_and_bernoulli_is_binary():
    a = synthetic_correlated_factors(n=100, seed=3)
    b = synthetic_correlated_factors(n=200, seed=3)
    np.testing.assert_array_equal(a.support, b.support)
    assert not np.array_equal(synthetic_correlated_factors(n=100, seed=4).support, a.support)
    binary = synthetic_correlated_factors(n=100, likelihood="bernoulli")
    assert set(np.unique(binary.X)) <= {0.0, 1.0}


def test_features_depend_on_their_parents_only():
    data = synthetic_correlated_factors(n=4000, num_factors=4, num_features=30, max_correlation=0.0, seed=5)
    # A feature is independent of a factor outside its support (the factors are independent here).
    for j in range(30):
        for k in range(4):
            if not data.support[j, k]:
                assert abs(np.corrcoef(data.X[:, j], data.z[:, k])[0, 1]) < 0.07


@pytest.mark.parametrize("seed", [None, -1, 1.5, True])
def test_the_generators_that_fix_a_map_by_seed_name_a_bad_seed(seed):
    from pyro_sparse.data.synthetic import synthetic_gene_set_counts, synthetic_sparse_codes

    for generator in (synthetic_correlated_factors, synthetic_gene_set_counts, synthetic_sparse_codes):
        with pytest.raises(ValueError, match="seed must be a non-negative integer"):
            generator(n=10, seed=seed)


@pytest.mark.parametrize("options, message", [
    ({"anchors_per_factor": 1}, "anchors_per_factor \\(two or more identify a factor\\) must be an integer >= 2"),
    ({"noise_variance": -1.0}, "noise_variance must be finite and >= 0"),
    ({"noise_variance": float("nan")}, "noise_variance must be finite and >= 0"),
    ({"max_parents": 0}, "max_parents must be an integer >= 1"),
    ({"num_factors": 0}, "num_factors must be an integer >= 1"),
    ({"n": 2.5}, "n must be an integer >= 1"),
    ({"anchor_links": "same"}, "anchor_links must be 'shared' or 'independent'"),
])
def test_bad_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        synthetic_correlated_factors(**{"n": 10, **options})


@pytest.mark.parametrize("zeros", [0.3, 0.6])
def test_sparse_factors_have_the_share_of_zeros_and_unit_variance(zeros):
    dense = synthetic_correlated_factors(n=40_000, num_factors=3, num_features=30, seed=2)
    sparse = synthetic_correlated_factors(n=40_000, num_factors=3, num_features=30, factor_zeros=zeros, seed=2)
    np.testing.assert_array_equal(sparse.support, dense.support)
    np.testing.assert_allclose((sparse.z == 0).mean(0), zeros, atol=0.01)
    np.testing.assert_allclose(sparse.z.var(0), 1.0, atol=0.03)
    # Each sparse value is its dense draw soft-thresholded: same sign, smaller before the rescaling's factor.
    kept = sparse.z != 0
    assert (np.sign(sparse.z[kept]) == np.sign(dense.z[kept])).all()
    assert (np.abs(dense.z[~kept]) <= np.abs(dense.z[kept]).min() + 1e-6).all()
    np.testing.assert_array_equal(synthetic_correlated_factors(n=100, seed=2, factor_zeros=0.0).X,
                                  synthetic_correlated_factors(n=100, seed=2).X)


@pytest.mark.parametrize("zeros", [-0.1, 1.0, float("nan"), "half"])
def test_factor_zeros_out_of_range_is_named(zeros):
    with pytest.raises(ValueError, match="factor_zeros"):
        synthetic_correlated_factors(n=10, factor_zeros=zeros)
