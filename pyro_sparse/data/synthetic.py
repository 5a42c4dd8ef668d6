"""Built-in data sets: generators written here, no downloads."""

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SyntheticData:
    """Data with known truth: ``X`` (N, G), factors ``z`` (N, K), ``support`` (G, K) bool."""

    X: np.ndarray
    z: np.ndarray
    support: np.ndarray


def synthetic_sparse_dgm(n=1000, rho=0.6, seed=0, noise_variance=0.5):
    r"""
    The synthetic data of Moran et al. (2022), Sec. 2.2 and Eq. 9: two
    factors z_i ~ N(0, C) with unit variances and correlation ρ, and G = 7
    features x_i ~ N(f(z_i), σ² I) with σ² = 0.5 and the sparse map

        f(z) = (z1, 2 z1, 3 z1², 4 z2, 5 z2, 6 sin z2, 7 z1 z2).

    Features 1-3 are anchors of z1, 4-6 of z2, and feature 7 uses both.

    :returns: :class:`SyntheticData` with float32 ``X`` and ``z``.
    """
    if not -1 < rho < 1:
        raise ValueError(f"rho must be in (-1, 1), got {rho}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if not (np.isfinite(noise_variance) and noise_variance >= 0):
        raise ValueError(f"noise_variance must be finite and >= 0, got {noise_variance}")
    rng = np.random.default_rng(seed)
    covariance = np.array([[1.0, rho], [rho, 1.0]])
    z = rng.multivariate_normal(np.zeros(2), covariance, size=n)
    z1, z2 = z[:, 0], z[:, 1]
    mean = np.stack([z1, 2 * z1, 3 * z1**2, 4 * z2, 5 * z2, 6 * np.sin(z2), 7 * z1 * z2], axis=1)
    X = mean + rng.normal(scale=np.sqrt(noise_variance), size=mean.shape)
    support = np.zeros((7, 2), dtype=bool)
    support[[0, 1, 2, 6], 0] = True
    support[[3, 4, 5, 6], 1] = True
    return SyntheticData(X.astype(np.float32), z.astype(np.float32), support)


def synthetic_sparse_codes(n=1000, active_prob=0.3, rho=0.0, seed=0, noise_variance=0.5):
    r"""
    The synthetic data of :func:`synthetic_sparse_dgm` (Moran et al. 2022,
    Eq. 9: the same sparse map f, G = 7 features, σ² = 0.5) with sparse
    codes: each factor is switched on independently with probability
    ``active_prob``,

        z_ik = b_ik s_ik,   b_ik ~ Bernoulli(active_prob),   s_i ~ N(0, C),

    C with unit variances and correlation ρ.  So z_ik is exactly 0 with
    probability 1 - ``active_prob`` and N(0, 1) otherwise, the spike-and-slab
    prior of variational sparse coding (Tonolini et al., ICLR version Eq. 4)
    with α = ``active_prob``; a point with both factors off is pure noise.

    :returns: :class:`SyntheticData` with float32 ``X`` and ``z``; the codes'
        support is ``z != 0``.
    """
    if not 0 < active_prob <= 1:
        raise ValueError(f"active_prob must be in (0, 1], got {active_prob}")
    if not (np.isfinite(noise_variance) and noise_variance >= 0):
        raise ValueError(f"noise_variance must be finite and >= 0, got {noise_variance}")
    slab = synthetic_sparse_dgm(n, rho, seed, noise_variance=0.0)
    rng = np.random.default_rng([seed, 1])
    active = rng.random(slab.z.shape) < active_prob
    # Every coordinate of f vanishes when a factor it uses is 0, so f(b ⊙ s)
    # is f(s) on the features whose factors are all active and 0 elsewhere.
    uses_inactive = (slab.support[None] & ~active[:, None, :]).any(-1)
    mean = np.where(uses_inactive, 0.0, slab.X)
    X = mean + rng.normal(scale=np.sqrt(noise_variance), size=mean.shape)
    return SyntheticData(X.astype(np.float32), (slab.z * active).astype(np.float32), slab.support)
