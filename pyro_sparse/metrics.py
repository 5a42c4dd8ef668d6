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
from sklearn.ensemble import GradientBoostingRegressor
from sklearn.utils import check_random_state

__all__ = [
    "importance_matrix",
    "dci_from_importance",
    "dci_disentanglement",
    "match_factors",
    "support_f_score",
    "heldout_nll",
    "mse",
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
