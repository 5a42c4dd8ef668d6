"""
Evaluation metrics for synthetic experiments with known ground truth.

These follow the evaluation of the sparse VAE in Moran, Sridhar, Wang & Blei,
"Identifiable deep generative models via sparse decoding" (TMLR 2022): the
DCI disentanglement score of the inferred code against the true factors, an F1
score of the estimated decoder support against the true one, held-out negative
log-likelihood and reconstruction error. Everything here takes numpy arrays
and nothing else, so the metrics can score any model's output.
"""

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.spatial import cKDTree
from scipy.special import digamma
from scipy.stats import norm
from sklearn.ensemble import GradientBoostingRegressor
from sklearn.utils import check_random_state

__all__ = [
    "dci_disentanglement",
    "dci_from_importance",
    "feature_collapse",
    "gradient_snr",
    "heldout_nll",
    "importance_matrix",
    "match_factors",
    "mse",
    "multi_information",
    "posterior_collapse",
    "support_f_score",
    "support_jaccard",
]

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
    z_est = _as_codes(z_est, "z_est")
    z_true = _as_codes(z_true, "z_true")
    if z_est.shape[0] != z_true.shape[0]:
        raise ValueError(
            f"z_est and z_true must have the same number of rows (data points), "
            f"got {z_est.shape[0]} and {z_true.shape[0]}"
        )
    rng = check_random_state(random_state)
    n = z_est.shape[0]
    if n > _MAX_ROWS:
        rows = rng.choice(n, size=_MAX_ROWS, replace=False)
        z_est, z_true = z_est[rows], z_true[rows]
    features = _standardize(z_est)
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
    or surplus) codes neither help nor hurt. With a single factor (J == 1)
    every code with any importance is perfectly disentangled, so the score is
    1.0. If no code has any importance at all the score is 0.0.

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
    J = R.shape[1]
    code_totals = R.sum(axis=1)
    total = code_totals.sum()
    if total == 0:
        return 0.0
    if J == 1:
        return 1.0
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


def support_f_score(W_est, true_support, matching):
    """
    F1 score of an estimated decoder support against the true support.

    As in the synthetic experiments of Moran et al. (TMLR 2022): entry
    ``(g, k)`` of the support says whether feature g depends on factor k. The
    estimated column ``matching[j]`` is compared with true column j; every
    estimated column matched to no true factor is compared with an all-False
    column, so any non-zero entry there is a false positive (a spurious
    factor is not free). Returns ``2 TP / (2 TP + FP + FN)``, or 1.0 when
    both supports are empty.

    Parameters
    ----------
    W_est : array, shape (G, K)
        Estimated mask or loadings (support = non-zero entries), or a boolean
        support directly.
    true_support : array, shape (G, J)
        True support; non-zero / True entries are in the support.
    matching : int array, shape (J,)
        Distinct column indices into W_est, e.g. from ``match_factors``.

    Returns
    -------
    float in [0, 1].
    """
    W_est = np.asarray(W_est)
    true_support = np.asarray(true_support)
    if W_est.ndim != 2:
        raise ValueError(f"W_est must be a 2-D (features x codes) array, got {W_est.ndim}-D")
    if true_support.ndim != 2:
        raise ValueError(f"true_support must be a 2-D (features x factors) array, got {true_support.ndim}-D")
    if W_est.shape[0] != true_support.shape[0]:
        raise ValueError(
            f"W_est and true_support must have the same number of rows (features), "
            f"got {W_est.shape[0]} and {true_support.shape[0]}"
        )
    matching = np.asarray(matching)
    G, K = W_est.shape
    J = true_support.shape[1]
    if matching.ndim != 1 or matching.shape[0] != J:
        raise ValueError(
            f"matching must be a 1-D array with one entry per true factor ({J}), got shape {matching.shape}"
        )
    if not np.issubdtype(matching.dtype, np.integer):
        raise ValueError(f"matching must hold integer column indices, got dtype {matching.dtype}")
    if np.any(matching < 0) or np.any(matching >= K):
        raise ValueError(f"matching has indices outside the {K} columns of W_est: {matching.tolist()}")
    if len(np.unique(matching)) != J:
        raise ValueError(f"matching must map distinct factors to distinct columns, got {matching.tolist()}")

    estimated = W_est != 0
    # Unmatched columns keep an all-False truth, which is what charges their
    # non-zeros as false positives.
    truth = np.zeros((G, K), dtype=bool)
    truth[:, matching] = true_support != 0
    tp = int(np.sum(estimated & truth))
    fp = int(np.sum(estimated & ~truth))
    fn = int(np.sum(~estimated & truth))
    if tp + fp + fn == 0:
        return 1.0
    return 2 * tp / (2 * tp + fp + fn)


def heldout_nll(log_likelihoods):
    """
    Mean negative log-likelihood of held-out data points.

    The held-out fit criterion of Moran et al. (TMLR 2022): the average over
    test points of ``-log p(x_i)`` (or of a bound on it, such as the negative
    ELBO, if that is what is passed). A log-likelihood of ``-inf`` (a point
    the model gives zero density) yields ``inf``, which is the honest answer.

    Parameters
    ----------
    log_likelihoods : 1-D array
        One log-likelihood per held-out data point.

    Returns
    -------
    float
    """
    values = np.asarray(log_likelihoods, dtype=float)
    if values.ndim != 1:
        raise ValueError(f"log_likelihoods must be 1-D (one value per data point), got {values.ndim}-D")
    if values.size == 0:
        raise ValueError("log_likelihoods is empty")
    if np.any(np.isnan(values)):
        raise ValueError(f"log_likelihoods contains {int(np.isnan(values).sum())} NaN values")
    if np.any(values == np.inf):
        raise ValueError("log_likelihoods contains +inf, which no proper density gives")
    return float(-np.mean(values))


def mse(x, x_hat):
    """
    Mean squared error between data and its reconstruction.

    The reconstruction-error criterion reported by Moran et al. (TMLR 2022)
    for Gaussian-likelihood data: ``mean((x - x_hat) ** 2)`` over all entries.
    """
    x = np.asarray(x, dtype=float)
    x_hat = np.asarray(x_hat, dtype=float)
    if x.shape != x_hat.shape:
        raise ValueError(f"x and x_hat must have the same shape, got {x.shape} and {x_hat.shape}")
    if x.size == 0:
        raise ValueError("x is empty")
    return float(np.mean((x - x_hat) ** 2))


# ---------------------------------------------------------------------------
# Sparse-coding metrics of Fallah & Rozell, "Variational Sparse Coding with
# Learned Thresholding" (ICML 2022): multi-information of inferred codes
# (Sec. 4.1.1), gradient signal-to-noise ratio (Sec. 4.1.1, after Rainforth
# et al. 2018), support consistency across posterior draws (Sec. 4.1.2) and
# posterior / feature collapse (Appendix C, Eqs. 15-16).
# ---------------------------------------------------------------------------

# Imported here, with the metrics that need them, because this block was
# appended to the module as a unit.


# kNN estimators cost O(N log N) in low dimension but approach O(N^2 K) for
# the wide codes of a VAE, where a k-d tree degenerates to brute force; the
# estimate's seed-to-seed spread is already a few hundredths of a nat here.
_MI_MAX_ROWS = 5000
# Slack for the ">= 1 - delta" comparison of Eqs. 15-16: 1 - delta and a
# fraction like 19/20 are both rounded, and an exact tie must count as
# collapsed because the paper's inequality is inclusive.
_COLLAPSE_TIE_TOL = 1e-12
# Cap on the (chunk, J, J) intersection array built by support_jaccard.
_JACCARD_CHUNK_ENTRIES = 4_000_000


def _randomized_normal_scores(codes, rng):
    """
    Map each column to standard-normal scores through its randomised ranks.

    This is the empirical version of Rüschendorf's distributional transform
    ("On the distributional transform, Sklar's theorem, and the empirical
    copula process", 2009): ``U = F(z-) + V (F(z) - F(z-))`` with
    ``V ~ U(0, 1)`` independent. Ties (above all the atom of a sparse code at
    exactly 0) are spread uniformly at random over the ranks they share, so
    every column becomes continuous and exactly uniform before ``Phi^{-1}``
    makes it exactly standard normal.
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
    largely cancel, which is why it is ~0 for independent coordinates.
    """
    n, m = x.shape
    tree = cKDTree(x)
    # k + 1 because each point is its own nearest neighbour.
    dist, _ = tree.query(x, k=k + 1, p=np.inf)
    # Strictly inside eps_i: the k-th neighbour itself sits on the boundary.
    radius = np.nextafter(dist[:, -1], 0.0)
    marginal = np.zeros(n)
    for j in range(m):
        column = np.sort(x[:, j])
        # The count includes point i itself, so it is already n_j + 1.
        counts = np.searchsorted(column, x[:, j] + radius, side="right") - np.searchsorted(
            column, x[:, j] - radius, side="left"
        )
        marginal += digamma(counts)
    return float(digamma(k) + (m - 1) * digamma(n) - marginal.mean())


def multi_information(codes, k=3, max_samples=_MI_MAX_ROWS, random_state=0):
    """
    Multi-information ``sum_i h(z_i) - h(z)`` of inferred codes, in nats.

    The redundancy measure of Fallah & Rozell (ICML 2022, Sec. 4.1.1, Table 1
    and Fig. 7), following Bethge (2006), Eichhorn et al. (2009) and Fallah et
    al. (2020). It is the total correlation
    ``KL(p(z) || prod_i p(z_i))``: 0 exactly when the K code coordinates are
    independent, positive otherwise.

    Estimator. A sparse code puts a point mass at 0 on every coordinate, so
    ``h(z_i)`` and ``h(z)`` are both ``-inf`` and cannot be estimated
    separately (kNN entropy estimators, binning, and "tiny dither" schemes
    all return numbers that depend on the arbitrary noise or bin width). The
    difference is still finite, being a KL divergence, and it is invariant
    under any change of each coordinate that does not lose information. So:

    1. Each column is replaced by its randomised rank, i.e. the empirical
       distributional transform of Rüschendorf (2009): ties, above all the
       atom at 0, are broken uniformly at random. The transform adds noise
       that is independent of everything else and can be undone by a
       coordinate-wise map, so by the data-processing inequality applied in
       both directions it leaves the total correlation *unchanged*, while
       every column becomes continuous (its copula; the multi-information is
       the negative copula entropy, Ma & Sun 2011).
    2. Ranks are mapped to standard-normal scores (Gaussianisation), which
       again changes nothing in the target quantity but gives the kNN
       estimator smooth, unbounded marginals, where it is most accurate.
    3. The total correlation is estimated with the kNN estimator of Kraskov,
       Stoegbauer & Grassberger (2004), using ``scipy.spatial.cKDTree`` in
       the max-norm.

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
        Seeds the subsample and the random tie-breaking, so the estimate is
        reproducible.

    Returns
    -------
    float, nats. 0.0 when K == 1.
    """
    codes = _as_codes(codes, "codes")
    k = int(k)
    if k < 1:
        raise ValueError(f"k must be a positive integer, got {k}")
    rng = check_random_state(random_state)
    n = codes.shape[0]
    if max_samples is not None:
        if int(max_samples) <= k:
            raise ValueError(f"max_samples must exceed k ({k}), got {max_samples}")
        if n > max_samples:
            codes = codes[rng.choice(n, size=int(max_samples), replace=False)]
            n = codes.shape[0]
    if n <= k:
        raise ValueError(f"codes needs more than k = {k} rows, got {n}")
    if codes.shape[1] == 1:
        # A single variable shares no information with anything.
        return 0.0
    return _ksg_total_correlation(_randomized_normal_scores(codes, rng), k)


def gradient_snr(gradients, ddof=1):
    """
    Gradient signal-to-noise ratio averaged over parameters.

    Rainforth et al., "Tighter variational bounds are not necessarily better"
    (ICML 2018), as used by Fallah & Rozell (ICML 2022, Sec. 4.1.1, Fig. 4):
    for each scalar parameter theta,
    ``SNR(theta) = |E[grad_theta L] / sigma[grad_theta L]|``, with mean and
    standard deviation taken over repeated stochastic gradient draws (e.g.
    fresh code samples), then averaged over all parameters of a network or
    dictionary.

    A parameter whose gradient is exactly 0 in every draw (a dead unit or an
    unused dictionary atom) has SNR 0/0; it carries no signal to measure, so
    it is left out of the average rather than counted as 0 or as NaN. A
    parameter with zero spread but a non-zero mean has a noiseless gradient,
    SNR = inf, and the result is then inf, which is the honest answer. If
    every parameter is left out the result is NaN.

    Parameters
    ----------
    gradients : array, shape (S, P) or (S, ...)
        S gradient draws; trailing axes (e.g. a dictionary's (D, K)) are
        flattened into P parameters.
    ddof : int
        Delta degrees of freedom of the standard deviation; the default 1 is
        the unbiased sample variance. With the thousands of draws used in the
        paper the choice is immaterial.

    Returns
    -------
    float
    """
    gradients = np.asarray(gradients, dtype=float)
    if gradients.ndim < 2:
        raise ValueError(
            f"gradients must have shape (draws, parameters...), got {gradients.ndim}-D"
        )
    gradients = gradients.reshape(gradients.shape[0], -1)
    if gradients.shape[0] < ddof + 1 or gradients.shape[0] < 2:
        raise ValueError(
            f"need at least 2 (and more than ddof={ddof}) gradient draws, got {gradients.shape[0]}"
        )
    if gradients.shape[1] == 0:
        raise ValueError("gradients has no parameters")
    if not np.all(np.isfinite(gradients)):
        raise ValueError("gradients contains NaN or infinite values")
    mean = gradients.mean(axis=0)
    std = gradients.std(axis=0, ddof=ddof)
    keep = (std > 0) | (mean != 0)
    if not np.any(keep):
        return float("nan")
    with np.errstate(divide="ignore"):
        snr = np.abs(mean[keep]) / std[keep]
    return float(np.mean(snr))


def support_jaccard(codes, features=None, per_point=False):
    """
    Average pairwise Jaccard index of the supports of repeated code draws.

    Fallah & Rozell (ICML 2022), Sec. 4.1.2, Eq. 13 and Fig. 5: for data
    point k and draws ``z^1, ..., z^J ~ q(z | x^k)``, with support
    ``S(z) = {i : z_i != 0}``,

        C(z^m, z^n) = |S(z^m) & S(z^n)| / |S(z^m) | S(z^n)|   (Jaccard, 1912)

    and the point's consistency is ``1 / (J (J - 1)) sum_m sum_{n != m}
    C(z^m, z^n)``, i.e. the mean over all J (J - 1) / 2 unordered pairs of
    *distinct draws of the same point* (C is symmetric). Draws are never
    paired across different data points, and a draw is never paired with
    itself (which would add a spurious 1). Two empty supports are identical,
    so their index is 1. 1 means every draw switches on the same features;
    0 means no two draws share one.

    Parameters
    ----------
    codes : array, shape (J, N, K)
        J draws of the K-dimensional code for each of N data points; a single
        point is shape (J, 1, K).
    features : bool array, shape (K,), or None
        Restrict the supports to these features. The paper keeps only
        features whose dictionary column has ``||a_i||_2^2 > 0.1``, so that
        models that leave many atoms unused are not credited with easy
        consistency: ``features = (A ** 2).sum(axis=0) > 0.1``.
    per_point : bool
        Return the N per-point values (Fig. 5 is their histogram) instead of
        their mean.

    Returns
    -------
    float in [0, 1], or array of shape (N,) if ``per_point``.
    """
    codes = np.asarray(codes, dtype=float)
    if codes.ndim != 3:
        raise ValueError(f"codes must have shape (draws, data points, dimensions), got {codes.ndim}-D")
    J, N, K = codes.shape
    if J < 2:
        raise ValueError(f"need at least 2 draws per data point to form a pair, got {J}")
    if N == 0 or K == 0:
        raise ValueError(f"codes is empty, shape {codes.shape}")
    if np.any(np.isnan(codes)):
        raise ValueError("codes contains NaN, whose support membership is undefined")
    support = codes != 0
    if features is not None:
        features = np.asarray(features)
        if features.shape != (K,) or features.dtype != bool:
            raise ValueError(
                f"features must be a boolean array of shape ({K},), got {features.dtype} {features.shape}"
            )
        support = support[:, :, features]
    # (N, J, K') so that one batched product gives every pair's intersection.
    support = np.ascontiguousarray(support.transpose(1, 0, 2), dtype=float)
    sizes = support.sum(axis=2)
    off_diagonal = ~np.eye(J, dtype=bool)
    values = np.empty(N)
    chunk = max(1, _JACCARD_CHUNK_ENTRIES // (J * J))
    for start in range(0, N, chunk):
        block = support[start : start + chunk]
        inter = block @ block.transpose(0, 2, 1)
        s = sizes[start : start + chunk]
        union = s[:, :, None] + s[:, None, :] - inter
        with np.errstate(divide="ignore", invalid="ignore"):
            index = np.where(union > 0, inter / union, 1.0)
        values[start : start + chunk] = index[:, off_diagonal].mean(axis=1)
    if per_point:
        return values
    return float(values.mean())


def _check_collapse_args(eps, delta):
    if not np.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a finite non-negative threshold, got {eps}")
    if not 0 <= delta <= 1:
        raise ValueError(f"delta must lie in [0, 1], got {delta}")


def _collapsed_fraction(small, delta):
    # Share of data points on which each dimension is "small", compared with
    # 1 - delta inclusively (the ">=" of Eqs. 15-16).
    share = small.mean(axis=0)
    return float(np.mean(share >= (1.0 - delta) - _COLLAPSE_TIE_TOL))


def posterior_collapse(kl_per_dim, eps=1e-2, delta=5e-2):
    """
    Fraction of latent dimensions whose posterior has collapsed to the prior.

    Fallah & Rozell (ICML 2022), Appendix C, Eq. 15, after Lucas et al.,
    "Don't blame the ELBO!" (2019): dimension i is collapsed when
    ``P_x[ KL(q(z_i | x) || p(z_i)) <= eps ] >= 1 - delta``, the probability
    over data points being estimated by the share of the N rows. The paper
    reports the percentage of collapsed dimensions with ``eps = 1e-2`` and
    ``delta = 5e-2`` (Table 2); multiply the result by 100 to compare.

    Parameters
    ----------
    kl_per_dim : array, shape (N, K)
        Per-data-point, per-dimension KL divergences (closed form or Monte
        Carlo; small negative Monte Carlo values are accepted and count as
        <= eps). ``+inf`` is allowed and never counts as collapsed.
    eps, delta : float

    Returns
    -------
    float in [0, 1].
    """
    kl = np.asarray(kl_per_dim, dtype=float)
    if kl.ndim != 2 or kl.shape[0] == 0 or kl.shape[1] == 0:
        raise ValueError(
            f"kl_per_dim must be a non-empty 2-D (data points x dimensions) array, got shape {kl.shape}"
        )
    # NaN KLs come from a diverged run, which the paper reports as NaN rather
    # than as a collapse rate; refusing them keeps that failure visible.
    if np.any(np.isnan(kl)):
        raise ValueError("kl_per_dim contains NaN")
    _check_collapse_args(eps, delta)
    return _collapsed_fraction(kl <= eps, delta)


def feature_collapse(codes, eps=1e-2, delta=5e-2):
    """
    Fraction of latent dimensions that are (almost) always zero.

    Fallah & Rozell (ICML 2022), Appendix C, Eq. 16: dimension i has
    collapsed when ``P_x[ |z_i| <= eps ] >= 1 - delta`` for the inferred
    codes ``z``, the probability over data points being estimated by the
    share of the N rows. Unlike posterior collapse this also catches a
    posterior that differs from the prior but never switches the feature on.
    The paper uses ``eps = 1e-2`` and ``delta = 5e-2`` and reports a
    percentage (Table 2); multiply the result by 100 to compare.

    Parameters
    ----------
    codes : array, shape (N, K)
        One inferred code per data point.
    eps, delta : float

    Returns
    -------
    float in [0, 1].
    """
    codes = np.asarray(codes, dtype=float)
    if codes.ndim != 2 or codes.shape[0] == 0 or codes.shape[1] == 0:
        raise ValueError(
            f"codes must be a non-empty 2-D (data points x dimensions) array, got shape {codes.shape}"
        )
    if not np.all(np.isfinite(codes)):
        raise ValueError("codes contains NaN or infinite values")
    _check_collapse_args(eps, delta)
    return _collapsed_fraction(np.abs(codes) <= eps, delta)
