"""The prior of the per-feature noise variances σ² of the Gaussian likelihood (Moran et al. 2022, Eq. 60)."""

import numpy as np
import pyro
import torch
from scipy import stats
from torch.distributions import constraints

from pyro_sparse.data.validation import DataError
from pyro_sparse.distributions.likelihoods import InverseGamma

# ν of the σ² prior (Eq. 60): Moran et al. (2022), Appendix C.2, "We set ν = 3".
DEFAULT_NOISE_NU = 3.0


def noise_prior_options(nu, xi):
    """ν and ξ of the σ² prior (Eq. 60) as floats, refused unless both are positive finite numbers."""
    for name, value in (("noise_nu", nu), ("noise_xi", xi)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
                or not (np.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive number (the Inverse-Gamma prior of σ², Eq. 60), "
                             f"got {value!r}")
    return float(nu), float(xi)


def calibrate_noise_prior(feature_variances, nu=DEFAULT_NOISE_NU):
    r"""
    ξ for the σ_j² ~ Inverse-Gamma(ν/2, νξ/2) prior (Moran et al. 2022,
    Eq. 60, Appendix C.2): chosen so that the 5% quantile of the per-feature
    sample variances is the 90% quantile of the prior.  The 90% quantile of
    Inverse-Gamma(α, β) is β / Gamma(α, 1).ppf(0.1), which gives
    ξ = 2 s₅ Gamma(ν/2, 1).ppf(0.1) / ν.
    """
    nu, _ = noise_prior_options(nu, 1.0)
    feature_variances = np.asarray(feature_variances, dtype=float)
    constant = np.flatnonzero(feature_variances == 0)
    if constant.size:
        raise DataError(
            f"{constant.size} feature(s) are constant (zero variance), e.g. {constant[:10].tolist()}; "
            "drop them before fitting a gaussian likelihood"
        )
    s5 = float(np.quantile(feature_variances, 0.05))
    if not s5 > 0:
        raise ValueError(
            "cannot calibrate the noise prior: the 5% quantile of the feature variances "
            f"is {s5}; remove constant features or pass noise_xi explicitly"
        )
    return 2.0 * s5 * stats.gamma.ppf(0.1, nu / 2.0) / nu


def calibrated_noise_xi(hyper, feature_variances):
    """``hyper`` with ``noise_xi`` calibrated from the data (:func:`calibrate_noise_prior`) unless given."""
    if hyper.get("noise_xi") is not None:
        return hyper
    return {**hyper, "noise_xi": calibrate_noise_prior(feature_variances, hyper.get("noise_nu", DEFAULT_NOISE_NU))}


def fixed_noise_variance(hyper, feature_variances):
    """
    ``hyper`` with ``noise_variance`` set unless given: Eq. 12 of Fallah &
    Rozell (2022) is -‖x - Az‖², a Gaussian with σ² = 1/2 for unit-variance
    features; keep that ratio for data in other units.
    """
    if hyper.get("noise_variance") is not None:
        return hyper
    return {**hyper, "noise_variance": 0.5 * float(np.mean(feature_variances)) or 0.5}


def initial_noise_variance(feature_variances):
    """
    The σ² point estimate's starting value and support: half of each feature's
    sample variance, floored so that a constant feature starts finite.
    """
    variance = torch.as_tensor(np.asarray(feature_variances), dtype=torch.float32)
    return (variance / 2).clamp_min(1e-6), constraints.positive


def sample_noise_variance(num_features, nu, xi, like):
    """The global σ² site (Eq. 60), as a tensor on the same device/dtype as ``like``."""
    concentration = like.new_tensor(nu / 2.0)
    rate = like.new_tensor(nu * xi / 2.0)
    prior = InverseGamma(concentration, rate).expand([num_features]).to_event(1)
    return pyro.sample("sigma2", prior)
