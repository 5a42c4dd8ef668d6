"""The sparse-code variant of the synthetic data: code sparsity, slab moments and the map, against closed forms."""

import numpy as np
import pytest

from pyro_sparse.data.synthetic import synthetic_sparse_codes, synthetic_sparse_dgm

N, ACTIVE_PROB, RHO, NOISE_VARIANCE = 20_000, 0.3, 0.5, 0.5


def eq9_map(z):
    z1, z2 = z[:, 0], z[:, 1]
    return np.stack([z1, 2 * z1, 3 * z1**2, 4 * z2, 5 * z2, 6 * np.sin(z2), 7 * z1 * z2], axis=1)


@pytest.fixture(scope="module")
def data():
    return synthetic_sparse_codes(N, ACTIVE_PROB, RHO, seed=0, noise_variance=NOISE_VARIANCE)


def binomial_bound(p, n, sds=5.0):
    return sds * np.sqrt(p * (1 - p) / n)


def test_each_factor_is_active_independently_with_the_given_probability(data):
    active = data.z != 0
    assert data.X.shape == (N, 7) and data.z.shape == (N, 2)
    np.testing.assert_allclose(active.mean(0), ACTIVE_PROB, atol=binomial_bound(ACTIVE_PROB, N))
    both = ACTIVE_PROB**2
    assert abs((active[:, 0] & active[:, 1]).mean() - both) < binomial_bound(both, N)


def test_active_codes_follow_the_correlated_unit_normal_slab(data):
    slab = data.z[(data.z != 0).all(1)]  # both on: N(0, C) with correlation ρ
    n = len(slab)
    np.testing.assert_allclose(slab.mean(0), 0.0, atol=5 / np.sqrt(n))
    np.testing.assert_allclose(slab.var(0), 1.0, atol=5 * np.sqrt(2 / n))
    # sd of Pearson's r is (1 - ρ²) / √n
    assert abs(np.corrcoef(slab.T)[0, 1] - RHO) < 5 * (1 - RHO**2) / np.sqrt(n)


def test_features_are_eq9_of_the_sparse_codes_plus_white_noise(data):
    residual = data.X - eq9_map(data.z.astype(np.float64))
    np.testing.assert_allclose(residual.mean(0), 0.0, atol=5 * np.sqrt(NOISE_VARIANCE / N))
    np.testing.assert_allclose(residual.var(0), NOISE_VARIANCE, atol=5 * NOISE_VARIANCE * np.sqrt(2 / N))
    # A feature outside a factor's support does not move with it: points with
    # only z2 on have z1's anchors at pure noise, and vice versa.
    only_z2 = (data.z[:, 0] == 0) & (data.z[:, 1] != 0)
    assert abs(np.corrcoef(data.X[only_z2, 0], data.z[only_z2, 1])[0, 1]) < 5 / np.sqrt(only_z2.sum())
    np.testing.assert_array_equal(data.support, synthetic_sparse_dgm(10).support)


def test_always_active_codes_are_the_dense_data_codes():
    dense = synthetic_sparse_dgm(500, RHO, seed=3)
    np.testing.assert_array_equal(synthetic_sparse_codes(500, 1.0, RHO, seed=3).z, dense.z)


@pytest.mark.parametrize("active_prob", [0.0, -0.1, 1.5])
def test_bad_activity_probability_is_refused(active_prob):
    with pytest.raises(ValueError, match="active_prob"):
        synthetic_sparse_codes(10, active_prob)
