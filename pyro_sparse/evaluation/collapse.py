"""Collapse diagnostics of codes (Fallah & Rozell 2022, Table 2) and the signal-to-noise ratio of gradients."""

import numpy as np

# Slack for the ">= 1 - delta" comparison of Eqs. 15-16: 1 - delta and a
# fraction like 19/20 are both rounded, and an exact tie must count as
# collapsed because the paper's inequality is inclusive.
_COLLAPSE_TIE_TOL = 1e-12


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
    gradients = _gradient_draws(gradients, ddof)
    mean = gradients.mean(axis=0)
    std = gradients.std(axis=0, ddof=ddof)
    keep = (std > 0) | (mean != 0)
    if not np.any(keep):
        return float("nan")
    with np.errstate(divide="ignore"):
        snr = np.abs(mean[keep]) / std[keep]
    return float(np.mean(snr))


def _gradient_draws(gradients, ddof):
    """Validated gradient draws as a float (S, P) array."""
    if isinstance(ddof, bool) or not isinstance(ddof, (int, np.integer)) or ddof < 0:
        raise ValueError(f"ddof must be a non-negative integer, got {ddof!r}")
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
    return gradients


def _check_collapse_args(eps, delta):
    if not isinstance(eps, (int, float, np.integer, np.floating)) or isinstance(eps, bool):
        raise ValueError(f"eps must be a number (a KL threshold in nats), got {eps!r}")
    if not isinstance(delta, (int, float, np.integer, np.floating)) or isinstance(delta, bool):
        raise ValueError(f"delta must be a number in [0, 1], got {delta!r}")
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
    if np.any(kl == -np.inf):
        raise ValueError("kl_per_dim contains -inf, which no KL divergence is (a broken density?)")
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
