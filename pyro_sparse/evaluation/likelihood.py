"""Held-out fit: negative log-likelihood per data point and reconstruction error."""

import numpy as np


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
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(x_hat))):
        raise ValueError("x or x_hat contains NaN or infinite values")
    return float(np.mean((x - x_hat) ** 2))
