"""Disentanglement of codes against known factors: DCI (Eastwood & Williams 2018), factor matching, multi-information."""

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.spatial import cKDTree
from scipy.special import digamma
from scipy.stats import norm
from sklearn.ensemble import GradientBoostingRegressor
from sklearn.utils import check_random_state

# Gradient boosting cost grows linearly in N; importances are stable well
# before this many rows, so larger data sets are subsampled to keep the
# metric cheap enough to run after every fit.
_MAX_ROWS = 2000
_N_ESTIMATORS = 50
_MAX_DEPTH = 3


def _as_codes(array, name):
    array = np.asarray(array, dtype=float)
    if array.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (data points x dimensions) array, got {array.ndim}-D")
    if array.shape[0] < 2 or array.shape[1] == 0:
        raise ValueError(f"{name} needs at least 2 rows and 1 column, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return array


def _standardize(array):
    mean = array.mean(axis=0)
    std = array.std(axis=0)
    # A constant column carries no information; dividing by 1 keeps it at
    # zero instead of producing NaN that would poison the regressor.
    std = np.where(std > 0, std, 1.0)
    return (array - mean) / std


def _paired_codes(z_est, z_true):
    z_est = _as_codes(z_est, "z_est")
    z_true = _as_codes(z_true, "z_true")
    if z_est.shape[0] != z_true.shape[0]:
        raise ValueError(
            f"z_est and z_true must have the same number of rows (data points), "
            f"got {z_est.shape[0]} and {z_true.shape[0]}"
        )
    return z_est, z_true


def importance_matrix(z_est, z_true, random_state=0):
    """
    Importance of each inferred code for predicting each true factor.

    Following Eastwood & Williams, "A framework for the quantitative
    evaluation of disentangled representations" (ICLR 2018), and its
    implementation in disentanglement_lib (Locatello et al., 2019), one
    gradient-boosted tree ensemble is fitted per true factor, regressing that
    factor on all inferred codes; its ``feature_importances_`` form one column
    of the result. Trees make the score insensitive to monotone or other
    coordinate-wise nonlinear reparametrizations of a code.

    Parameters
    ----------
    z_est : array, shape (N, K)
        Inferred codes.
    z_true : array, shape (N, J)
        True generative factors.
    random_state : int, RandomState or None
        Seeds the row subsample (taken when N > 2000) and the regressors.

    Returns
    -------
    R : array, shape (K, J)
        ``R[k, j]`` is the importance of code k for factor j. Each column sums
        to 1, or is all zero when factor j could not be predicted at all
        (e.g. it is constant).
    """
    z_est, z_true = _paired_codes(z_est, z_true)
    rng = check_random_state(random_state)
    n = z_est.shape[0]
    if n > _MAX_ROWS:
        rows = rng.choice(n, size=_MAX_ROWS, replace=False)
        z_est, z_true = z_est[rows], z_true[rows]
    # The codes go in as they are: trees need no scaling, and centring a heavy-tailed code before the
    # regressor's float32 cast would merge its small values into ties.
    features = z_est
    targets = _standardize(z_true)

    K, J = z_est.shape[1], z_true.shape[1]
    R = np.zeros((K, J))
    for j in range(J):
        model = GradientBoostingRegressor(
            n_estimators=_N_ESTIMATORS, max_depth=_MAX_DEPTH, random_state=rng
        )
        model.fit(features, targets[:, j])
        R[:, j] = model.feature_importances_
    return R


def dci_from_importance(R):
    """
    DCI disentanglement score from an importance matrix.

    Eastwood & Williams (ICLR 2018), Sec. 2: with
    ``P[k, j] = R[k, j] / sum_j R[k, j]``, each code's disentanglement is
    ``D_k = 1 - H_J(P[k, :])`` where ``H_J`` is the entropy in base J, and the
    score is ``sum_k rho_k D_k`` with ``rho_k = sum_j R[k, j] / sum R``.

    Codes with zero total importance get weight 0, so unused (e.g. collapsed
    or surplus) codes neither help nor hurt; likewise factors that no code
    predicts at all (a constant factor) are left out of J, so they do not
    widen the entropy's base. A single factor (J == 1) is refused: the
    base-J entropy is undefined there, and any code, even noise, would read
    as perfectly disentangled. If no code has any importance at all the
    score is 0.0.

    Parameters
    ----------
    R : array, shape (K, J)
        Non-negative importances, ``R[k, j]`` for code k and factor j.

    Returns
    -------
    float in [0, 1].
    """
    R = np.asarray(R, dtype=float)
    if R.ndim != 2 or R.shape[0] == 0 or R.shape[1] == 0:
        raise ValueError(f"R must be a non-empty 2-D (codes x factors) array, got shape {R.shape}")
    if not np.all(np.isfinite(R)) or np.any(R < 0):
        raise ValueError("R must contain finite, non-negative importances")
    if R.shape[1] == 1:
        raise ValueError("DCI disentanglement needs at least 2 true factors: with one, the base-J entropy is "
                         "undefined and every code would score 1 (use completeness or informativeness)")
    if not R.any():
        return 0.0
    R = R[:, R.any(axis=0)]  # factors no code predicts (constant ones) are not in J
    J = R.shape[1]
    if J == 1:
        raise ValueError("DCI disentanglement needs at least 2 true factors that vary: all but one are constant")
    code_totals = R.sum(axis=1)
    total = code_totals.sum()
    used = code_totals > 0
    P = R[used] / code_totals[used, None]
    # 0 log 0 is taken as 0 (its limit), so a code relevant to only some
    # factors is not penalised for the others.
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(P > 0, P * np.log(P), 0.0)
    entropy = -plogp.sum(axis=1) / np.log(J)
    D_k = 1.0 - entropy
    rho = code_totals[used] / total
    # Rounding can push the entropy a hair past 1 or below 0.
    return float(np.clip(np.sum(rho * D_k), 0.0, 1.0))


def dci_disentanglement(z_est, z_true, random_state=0):
    """
    DCI disentanglement of inferred codes with respect to true factors.

    Eastwood & Williams, "A framework for the quantitative evaluation of
    disentangled representations" (ICLR 2018), as used to evaluate the sparse
    VAE in Moran et al. (TMLR 2022): ``dci_from_importance`` applied to
    ``importance_matrix(z_est, z_true, random_state)``. 1 means each code
    predicts at most one factor; 0 means every code is equally useful for all
    factors. Surplus codes (K > J) that carry no information get little
    weight and barely affect the score.

    Returns
    -------
    float in [0, 1].
    """
    return dci_from_importance(importance_matrix(z_est, z_true, random_state=random_state))


def match_factors(z_est, z_true, random_state=0):
    """
    Match every true factor to a distinct inferred code.

    The assignment maximises the total gradient-boosting importance
    (``importance_matrix``, Eastwood & Williams 2018) with the Hungarian
    algorithm (Kuhn 1955; ``scipy.optimize.linear_sum_assignment``). Using
    importances rather than correlations matches codes that are nonlinear,
    even non-monotone, functions of a factor (e.g. ``3 z**2``), which
    correlation would miss. The matching is what ``support_f_score`` needs to
    line up estimated and true decoder columns, as in Moran et al. (TMLR 2022).

    Parameters
    ----------
    z_est : array, shape (N, K), with K >= J
    z_true : array, shape (N, J)
    random_state : int, RandomState or None

    Returns
    -------
    matching : int array, shape (J,)
        ``matching[j]`` is the index of the code matched to factor j; the
        entries are distinct.
    """
    z_est = np.asarray(z_est)
    z_true = np.asarray(z_true)
    if z_est.ndim == 2 and z_true.ndim == 2 and z_est.shape[1] < z_true.shape[1]:
        raise ValueError(
            f"cannot match {z_true.shape[1]} true factors to only {z_est.shape[1]} inferred codes; "
            "each factor needs its own code, so z_est needs at least as many columns as z_true"
        )
    R = importance_matrix(z_est, z_true, random_state=random_state)
    factors, codes = linear_sum_assignment(R.T, maximize=True)
    matching = np.empty(R.shape[1], dtype=int)
    matching[factors] = codes
    return matching


# kNN estimators cost O(N log N) in low dimension but approach O(N^2 K) for
# the wide codes of a VAE, where a k-d tree degenerates to brute force; the
# estimate's seed-to-seed spread is already a few hundredths of a nat here.
_MI_MAX_ROWS = 5000


def _randomized_normal_scores(codes, rng):
    """
    Map each column to standard-normal scores through its randomised ranks.

    This is the empirical version of Rüschendorf's distributional transform
    ("On the distributional transform, Sklar's theorem, and the empirical
    copula process", 2009): ``U = F(z-) + V (F(z) - F(z-))`` with
    ``V ~ U(0, 1)`` independent. Ties (above all the atom of a sparse code at
    exactly 0) are spread uniformly at random over the ranks they share, so
    every column becomes continuous and exactly uniform before ``Phi^{-1}``
    makes it exactly standard normal. The added noise is independent of
    everything else and can be undone by a coordinate-wise map, so by the
    data-processing inequality applied in both directions the transform leaves
    the total correlation unchanged (the multi-information is the negative
    copula entropy, Ma & Sun 2011); the normal scores then give the kNN
    estimator smooth, unbounded marginals, where it is most accurate.
    """
    n, k = codes.shape
    scores = np.empty_like(codes)
    # Mid-rank positions (r + 1/2) / n keep Phi^{-1} finite at both ends.
    grid = norm.ppf((np.arange(n) + 0.5) / n)
    for j in range(k):
        # lexsort sorts by the last key first: by value, ties by a random key.
        order = np.lexsort((rng.random(n), codes[:, j]))
        scores[order, j] = grid
    return scores


def _ksg_total_correlation(x, k):
    """
    Kraskov-Stoegbauer-Grassberger estimate of total correlation, in nats.

    Algorithm 1 of Kraskov, Stoegbauer & Grassberger, "Estimating mutual
    information" (Phys. Rev. E 69, 066138, 2004), in its m-variable form
    (their Eq. 9 generalised as in Sec. II.C):
    ``psi(k) + (m - 1) psi(N) - < sum_j psi(n_j + 1) >``, where ``eps_i`` is
    the max-norm distance from point i to its k-th neighbour in the joint
    space and ``n_j`` counts the other points strictly within ``eps_i`` of it
    along coordinate j. Using the joint-space kNN radius for the marginal
    counts makes the biases of the joint and marginal entropy estimates
    largely cancel, which is why it is ~0 for independent coordinates. The
    neighbours are found with ``scipy.spatial.cKDTree`` in the max-norm.
    """
    n, m = x.shape
    tree = cKDTree(x)
    # k + 1 because each point is its own nearest neighbour.
    dist, _ = tree.query(x, k=k + 1, p=np.inf)
    # Strictly inside eps_i: the k-th neighbour itself sits on the boundary.  Counted on the distances
    # |x_i - x_l| themselves: bounds x_i ± r would round back onto the boundary for most |x_i| > eps_i.
    radius = np.nextafter(dist[:, -1], 0.0)
    marginal = np.zeros(n)
    for j in range(m):
        column = x[:, [j]]
        # The count includes point i itself, so it is already n_j + 1.
        counts = cKDTree(column).query_ball_point(column, r=radius, p=np.inf, return_length=True)
        marginal += digamma(counts)
    return float(digamma(k) + (m - 1) * digamma(n) - marginal.mean())


def multi_information(codes, k=3, max_samples=_MI_MAX_ROWS, random_state=0):
    """
    Multi-information ``sum_i h(z_i) - h(z)`` of inferred codes, in nats.

    The redundancy measure of Fallah & Rozell (ICML 2022, Sec. 4.1.1, Table 1
    and Fig. 7), following Bethge (2006), Eichhorn et al. (2009) and Fallah et
    al. (2020): the total correlation ``KL(p(z) || prod_i p(z_i))``, 0 exactly
    when the K code coordinates are independent, positive otherwise.

    Estimator. A sparse code puts a point mass at 0 on every coordinate, so
    ``h(z_i)`` and ``h(z)`` are both ``-inf`` and cannot be estimated
    separately (kNN entropy estimators, binning and "tiny dither" schemes all
    return numbers that depend on the arbitrary noise or bin width); their
    difference is a KL divergence, finite and invariant under any change of
    each coordinate that loses no information. So each column is replaced by
    its randomised rank (ties, above all the atom at 0, broken at random;
    ``_randomized_normal_scores``), mapped to standard-normal scores, and
    the total correlation of the scores is estimated with the kNN estimator of
    Kraskov, Stoegbauer & Grassberger (2004) (``_ksg_total_correlation``).

    The result is ~0 (within about +-0.05 nats at N = 2000) for independent
    coordinates whether they are Gaussian, Laplace or spike-and-slab, and
    matches ``-1/2 log det(corr)`` for Gaussian codes. Like every kNN
    estimator it is biased towards 0 for strongly dependent coordinates and
    in high dimension K, and can come out slightly negative by chance (it is
    not clipped, so averages over runs stay unbiased); compare models at the
    same N and K.

    Parameters
    ----------
    codes : array, shape (N, K)
        One (mean or sampled) code per data point.
    k : int
        Neighbours used by the KSG estimator; 2-4 is the usual range (Kraskov
        et al. 2004). Larger k lowers variance and raises bias.
    max_samples : int or None
        Rows are subsampled (without replacement) to at most this many;
        ``None`` uses all rows.
    random_state : int, RandomState or None
        Seeds the subsample and the random tie-breaking (reproducible estimate).

    Returns
    -------
    float, nats. 0.0 when K == 1.
    """
    codes = _as_codes(codes, "codes")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    k = int(k)
    rng = check_random_state(random_state)
    codes = _subsample_rows(codes, max_samples, k, rng)
    if codes.shape[0] <= k:
        raise ValueError(f"codes needs more than k = {k} rows, got {codes.shape[0]}")
    if codes.shape[1] == 1:
        # A single variable shares no information with anything.
        return 0.0
    return _ksg_total_correlation(_randomized_normal_scores(codes, rng), k)


def _subsample_rows(codes, max_samples, k, rng):
    """At most ``max_samples`` rows drawn without replacement (all rows if ``None``)."""
    if max_samples is None:
        return codes
    if int(max_samples) <= k:
        raise ValueError(f"max_samples must exceed k ({k}), got {max_samples}")
    n = codes.shape[0]
    if n > max_samples:
        codes = codes[rng.choice(n, size=int(max_samples), replace=False)]
    return codes
