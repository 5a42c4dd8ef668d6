"""Built-in data sets: generators written here, no downloads."""

from dataclasses import dataclass

import numpy as np

from pyro_sparse.checks import is_count, positive_number


@dataclass(frozen=True)
class SyntheticData:
    """Data with known truth: ``X`` (N, G), factors ``z`` (N, K), ``support`` (G, K) bool."""

    X: np.ndarray
    z: np.ndarray
    support: np.ndarray


def _integer(name, value, minimum):
    """``value`` as an int if it is an integer >= ``minimum`` (not a bool); else a ValueError naming ``name``."""
    if not is_count(value, minimum):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_noise_variance(noise_variance):
    if not (np.isfinite(noise_variance) and noise_variance >= 0):
        raise ValueError(f"noise_variance must be finite and >= 0, got {noise_variance}")


def _map_seed(seed):
    """The seed of a generator whose map it fixes: a non-negative integer (not None, so heldout data can share it)."""
    if seed is None or isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(
            f"seed must be a non-negative integer, got {seed!r}: it fixes the generator's map, so data drawn "
            "with the same seed (training and heldout, of any n) share it"
        )
    return int(seed)


def synthetic_sparse_dgm(n=1000, rho=0.6, seed=0, noise_variance=0.5):
    r"""
    The synthetic data of Moran et al. (2022), Sec. 2.2 and Eq. 9: two
    factors z_i ~ N(0, C) with unit variances and correlation ρ, and G = 7
    features x_i ~ N(f(z_i), σ² I) with σ² = 0.5 and the sparse map

        f(z) = (z1, 2 z1, 3 z1², 4 z2, 5 z2, 6 sin z2, 7 z1 z2).

    Features 1-3 are anchors of z1, 4-6 of z2, and feature 7 uses both.
    The map is fixed; the seed draws the points, and the same seed with a
    larger n repeats the first rows, so draw heldout points with another seed.

    :returns: :class:`SyntheticData` with float32 ``X`` and ``z``.
    """
    if not -1 < rho < 1:
        raise ValueError(f"rho must be in (-1, 1), got {rho}")
    _integer("n", n, 1)
    _check_noise_variance(noise_variance)
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
    As there, the same seed with a larger n repeats the first rows' codes:
    draw heldout points with another seed.

    :returns: :class:`SyntheticData` with float32 ``X`` and ``z``; the codes'
        support is ``z != 0``.
    """
    if not 0 < active_prob <= 1:
        raise ValueError(f"active_prob must be in (0, 1], got {active_prob}")
    _check_noise_variance(noise_variance)
    seed = _map_seed(seed)
    slab = synthetic_sparse_dgm(n, rho, seed, noise_variance=0.0)
    rng = np.random.default_rng([seed, 1])
    active = rng.random(slab.z.shape) < active_prob
    # Every coordinate of f vanishes when a factor it uses is 0, so f(b ⊙ s)
    # is f(s) on the features whose factors are all active and 0 elsewhere.
    uses_inactive = (slab.support[None] & ~active[:, None, :]).any(-1)
    mean = np.where(uses_inactive, 0.0, slab.X)
    X = mean + rng.normal(scale=np.sqrt(noise_variance), size=mean.shape)
    return SyntheticData(X.astype(np.float32), (slab.z * active).astype(np.float32), slab.support)


# Links of the second generator: each maps a standard-normal factor to a
# signal of comparable scale; several parents add their links.
_LINKS = (
    lambda z: z,
    lambda z: np.sin(2 * z),
    lambda z: z**2 - 1,
    lambda z: np.tanh(2 * z),
    lambda z: np.abs(z) - np.sqrt(2 / np.pi),
)
# The links that determine z (odd and increasing): an anchor's link must be one of them, or its
# feature tells only |z| (z² - 1, |z| - E|z|) or z modulo a fold (sin 2z).
_INVERTIBLE_LINKS = (0, 3)


def random_correlation(num_factors, max_correlation, rng):
    r"""
    A random K x K correlation matrix whose largest absolute off-diagonal entry is
    ``max_correlation``: (1 - s) I + s C, C the normalised Gram matrix of K
    random 2-D directions (strongly correlated in both signs), s scaled to the
    target.  Convex in a PD and a PSD matrix, so positive definite for s < 1:
    for K ≥ 3, directions whose largest \|cos\| is below the target (s > 1; C
    has rank 2, so 1 - s would be an eigenvalue) are drawn again.
    """
    if not 0 <= max_correlation < 1:
        raise ValueError(f"max_correlation must be in [0, 1), got {max_correlation}")
    if num_factors == 1:
        return np.eye(1)
    while True:
        directions = rng.normal(size=(num_factors, 2))
        directions /= np.linalg.norm(directions, axis=1, keepdims=True)
        gram = directions @ directions.T
        off_diagonal = np.abs(gram - np.diag(np.diag(gram))).max()
        if off_diagonal > max_correlation or num_factors == 2:  # 2 x 2: PD whenever s·|cos| = target < 1
            break
    scale = max_correlation / off_diagonal if off_diagonal > 0 else 0.0
    return (1 - scale) * np.eye(num_factors) + scale * gram


def _random_support(num_features, num_factors, anchors_per_factor, max_parents, rng):
    """(G, K) support: ``anchors_per_factor`` one-parent features per factor first, then 1..max_parents parents."""
    support = np.zeros((num_features, num_factors), dtype=bool)
    anchors = num_factors * anchors_per_factor
    support[np.arange(anchors), np.repeat(np.arange(num_factors), anchors_per_factor)] = True
    for j in range(anchors, num_features):
        parents = rng.choice(num_factors, size=rng.integers(1, min(max_parents, num_factors) + 1), replace=False)
        support[j, parents] = True
    return support


def synthetic_correlated_factors(n=2000, num_factors=6, num_features=100, max_correlation=0.6,
                                 anchors_per_factor=2, max_parents=3, likelihood="gaussian", noise_variance=0.5,
                                 anchor_links="shared", factor_zeros=0.0, seed=0):
    r"""
    Correlated factors behind a sparse, nonlinear map, to test identifiability
    beyond Eq. 9: z_i ~ N(0, R) with R a random correlation matrix
    (:func:`random_correlation`), and feature j depends on its parents S_j,

    .. math:: f_j(z) = \sum_{k \in S_j} a_{jk}\, g_{jk}(z_k),

    with g_jk drawn from {z, sin 2z, z² - 1, tanh 2z, ``|z| - E|z|``} and
    weights ``|a_jk|`` ∈ [1, 2] of random sign.  The first ``anchors_per_factor`` features
    of each factor have that factor as their only parent: the anchors that make
    the model identifiable (Moran et al. 2022, Sec. 3, assumption A1: the
    anchors of a factor share one map f_j, and Theorem 1 identifies z_k up to
    an invertible transform only if that map determines z_k).  So with
    ``anchor_links="shared"`` a factor's anchors share one link, z or tanh 2z,
    and one weight; ``"independent"`` draws them as any other feature's (the
    generator before 2026-11-29, whose anchors could tell only ``|z_k|``).  The
    other features have 1 to ``max_parents`` parents.  ``likelihood="gaussian"`` adds noise of
    variance ``noise_variance``; ``"bernoulli"`` draws x_ij ~ Bernoulli(σ(f_j(z_i))).
    ``factor_zeros`` > 0 makes the factors sparse, with that share of exact
    zeros: each z_ik is soft-thresholded, ``sign(u)(|u| − t)₊`` with t the
    quantile of \|N(0, 1)\| at ``factor_zeros``, and rescaled to unit
    variance (the thresholded Gaussian codes of Fallah & Rozell 2022, Eq. 7,
    with correlated u ~ N(0, R)); 0 keeps the dense factors, draw for draw.

    :returns: :class:`SyntheticData` (float32 ``X`` and ``z``, ``support`` (G, K)).
    """
    if likelihood not in ("gaussian", "bernoulli"):
        raise ValueError(f"likelihood must be 'gaussian' or 'bernoulli', got {likelihood!r}")
    if anchor_links not in ("shared", "independent"):
        raise ValueError(f"anchor_links must be 'shared' or 'independent', got {anchor_links!r}")
    _integer("n", n, 1)
    _integer("num_factors", num_factors, 1)
    _integer("max_parents", max_parents, 1)
    # Moran et al. (2022), assumption A1: two anchors per factor identify it.
    _integer("anchors_per_factor (two or more identify a factor)", anchors_per_factor, 2)
    _check_noise_variance(noise_variance)
    if not (isinstance(factor_zeros, (int, float, np.floating)) and 0 <= factor_zeros < 1):
        raise ValueError(f"factor_zeros is the share of exact zeros in each factor, in [0, 1); got {factor_zeros!r}")
    if num_features < num_factors * anchors_per_factor:
        raise ValueError(f"{num_features} features cannot hold {anchors_per_factor} anchors for each of "
                         f"{num_factors} factors")
    structure = np.random.default_rng([_map_seed(seed), 0])  # the map: the same for every n
    correlation = random_correlation(num_factors, max_correlation, structure)
    support = _random_support(num_features, num_factors, anchors_per_factor, max_parents, structure)
    links = structure.integers(len(_LINKS), size=support.shape)
    weights = structure.uniform(1, 2, size=support.shape) * structure.choice([-1, 1], size=support.shape)
    if anchor_links == "shared":  # drawn after the rest, so the other features' maps are those of "independent"
        factor_links = structure.choice(_INVERTIBLE_LINKS, size=num_factors)
        factor_weights = structure.uniform(1, 2, size=num_factors) * structure.choice([-1, 1], size=num_factors)
        for k in range(num_factors):
            anchors = np.arange(k * anchors_per_factor, (k + 1) * anchors_per_factor)
            links[anchors, k], weights[anchors, k] = factor_links[k], factor_weights[k]
    rng = np.random.default_rng([seed, 1, n])
    z = rng.multivariate_normal(np.zeros(num_factors), correlation, size=n)
    if factor_zeros > 0:
        z = _soft_thresholded(z, factor_zeros)
    signal = np.zeros((n, num_features))
    for j, k in zip(*np.nonzero(support)):
        signal[:, j] += weights[j, k] * _LINKS[links[j, k]](z[:, k])
    if likelihood == "gaussian":
        X = signal + rng.normal(scale=np.sqrt(noise_variance), size=signal.shape)
    else:
        X = (rng.random(signal.shape) < 1 / (1 + np.exp(-signal))).astype(np.float64)
    return SyntheticData(X.astype(np.float32), z.astype(np.float32), support)


def _soft_thresholded(u, zeros):
    """sign(u)(|u| − t)₊ / sd for u ~ N(0, 1): t puts a share ``zeros`` at 0, sd is the result's (unit variance)."""
    from scipy.stats import norm

    t = norm.ppf((1 + zeros) / 2)
    # E[(|u| − t)₊²] = 2 ∫_t^∞ (u − t)² φ(u) du = 2 [(1 + t²)(1 − Φ(t)) − t φ(t)].
    second_moment = 2 * ((1 + t**2) * norm.sf(t) - t * norm.pdf(t))
    return np.sign(u) * np.maximum(np.abs(u) - t, 0.0) / np.sqrt(second_moment)


@dataclass(frozen=True)
class SyntheticGeneSets(SyntheticData):
    """
    Counts with known supports and a faulty annotation: ``X`` (N, G) counts,
    ``z`` (N, K), ``support`` (G, K), ``library`` (N,) the size factors,
    ``annotation`` (G, S) the memberships of the S annotated factors' gene
    sets as given (with errors), ``feature_names`` and ``set_names``.
    """

    library: np.ndarray
    annotation: np.ndarray
    feature_names: tuple
    set_names: tuple

    def gene_sets(self):
        """The annotation as ``{set name: [genes]}``."""
        names = np.asarray(self.feature_names)
        return {name: names[column].tolist() for name, column in zip(self.set_names, self.annotation.T)}


# Links of the count generator: those of _LINKS that grow at most linearly,
# so that exp of the signal stays within a few orders of magnitude.
_COUNT_LINKS = tuple(_LINKS[i] for i in (0, 1, 3, 4))


def synthetic_gene_set_counts(n=2000, num_genes=200, num_sets=6, set_size=20, num_unannotated=1,
                              wrong_fraction=0.2, missing_fraction=0.2, library_size=2000.0,
                              inverse_dispersion=10.0, effect=(0.5, 1.0), seed=0):
    r"""
    Negative binomial counts from a sparse nonlinear decoder, with gene sets
    that annotate its supports imperfectly (issue 19, item 4).  Factors
    z_i ~ N(0, I_K), K = ``num_sets`` + ``num_unannotated``; each factor
    drives ``set_size`` genes drawn at random (a gene may have several), and

    .. math::

        x_{ig} \sim \mathrm{NB}\big(\text{mean } \ell_i\, e^{b_g + \sum_{k \in S_g} a_{gk} h_{gk}(z_{ik})},\ \theta\big),

    with baseline proportions e^{b_g} (log-normal, summing to 1), effects
    ``|a_gk|`` uniform in ``effect`` of random sign, links h_gk drawn from
    {z, sin 2z, tanh 2z, ``|z|`` - E``|z|``} and size factors ℓ_i log-normal
    around ``library_size`` (the mean count is ℓ_i times the proportion, as in
    the count likelihoods; give ℓ as the observed library).  The first
    ``num_sets`` factors are annotated: each set keeps its true members
    except a ``missing_fraction`` of them and gains wrong genes (non-members)
    until a ``wrong_fraction`` of its memberships are wrong.

    :returns: :class:`SyntheticGeneSets`; float32 ``X`` and ``z``.
    """
    if not (0 <= wrong_fraction < 1 and 0 <= missing_fraction < 1):
        raise ValueError(f"wrong_fraction and missing_fraction must be in [0, 1), got {wrong_fraction}, "
                         f"{missing_fraction}")
    _integer("n", n, 1)
    _integer("num_sets", num_sets, 1)
    _integer("num_unannotated", num_unannotated, 0)
    if not 0 < set_size < num_genes:
        raise ValueError(f"set_size must be in [1, num_genes={num_genes}), got {set_size}: "
                         "a set needs genes outside it")
    kept = set_size - round(missing_fraction * set_size)
    if round(wrong_fraction * kept / (1 - wrong_fraction)) > num_genes - set_size:
        raise ValueError(f"wrong_fraction={wrong_fraction} needs more wrong genes per set than the "
                         f"{num_genes - set_size} genes outside it")
    if np.shape(effect) != (2,) or not 0 < effect[0] <= effect[1] < np.inf:
        raise ValueError(f"effect must be (low, high) with 0 < low <= high, got {effect!r}: "
                         "a zero effect is no support")
    positive_number("library_size", library_size)
    positive_number("inverse_dispersion", inverse_dispersion)
    num_factors = num_sets + num_unannotated
    structure = np.random.default_rng([_map_seed(seed), 0])
    support = np.zeros((num_genes, num_factors), dtype=bool)
    for k in range(num_factors):
        support[structure.choice(num_genes, size=set_size, replace=False), k] = True
    links = structure.integers(len(_COUNT_LINKS), size=support.shape)
    weights = structure.uniform(*effect, size=support.shape) * structure.choice([-1, 1], size=support.shape)
    baseline = structure.normal(0.0, 0.5, size=num_genes)
    baseline -= np.log(np.exp(baseline).sum())
    annotation = np.zeros((num_genes, num_sets), dtype=bool)
    for k in range(num_sets):
        members, others = np.flatnonzero(support[:, k]), np.flatnonzero(~support[:, k])
        kept = structure.choice(members, size=len(members) - round(missing_fraction * len(members)), replace=False)
        wrong = structure.choice(others, size=round(wrong_fraction * len(kept) / (1 - wrong_fraction)), replace=False)
        annotation[np.concatenate([kept, wrong]), k] = True
    rng = np.random.default_rng([seed, 1, n])
    z = rng.normal(size=(n, num_factors))
    signal = np.zeros((n, num_genes))
    for g, k in zip(*np.nonzero(support)):
        signal[:, g] += weights[g, k] * _COUNT_LINKS[links[g, k]](z[:, k])
    library = library_size * np.exp(rng.normal(0.0, 0.3, size=n))
    mean = library[:, None] * np.exp(baseline + signal)
    X = rng.negative_binomial(inverse_dispersion, inverse_dispersion / (inverse_dispersion + mean))
    return SyntheticGeneSets(
        X.astype(np.float32), z.astype(np.float32), support, library, annotation,
        tuple(f"gene{g:03d}" for g in range(num_genes)), tuple(f"set{k}" for k in range(num_sets)),
    )
