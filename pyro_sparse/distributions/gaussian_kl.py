"""
KL divergences between Gaussians that torch does not register: a full-covariance
Gaussian posterior against a diagonal (independent Normal) prior.
"""

from torch.distributions import Independent, MultivariateNormal, Normal
from torch.distributions.kl import register_kl


# torch's classes, so that Pyro's (their subclasses) and torch's own both dispatch here.
@register_kl(MultivariateNormal, Independent)
def _kl_mvn_diagonal(q, p):
    r"""
    KL(N(μ, L Lᵀ) ‖ N(m, diag s²)) = ½ [Σ_k (L Lᵀ)_kk / s_k² + Σ_k (m_k - μ_k)² / s_k² - K
    + Σ_k log s_k² - log |L Lᵀ|], for ``p`` an :class:`Independent` of one
    :class:`Normal` dimension (``Normal(m, s).to_event(1)``).
    """
    if not isinstance(p.base_dist, Normal) or p.reinterpreted_batch_ndims != 1:
        raise NotImplementedError
    if q.event_shape != p.event_shape:
        raise ValueError(f"KL between Gaussians of different sizes: {tuple(q.event_shape)} and {tuple(p.event_shape)}")
    variance = p.base_dist.scale.pow(2)
    trace = (q.scale_tril.pow(2).sum(-1) / variance).sum(-1)
    mahalanobis = ((p.base_dist.loc - q.loc).pow(2) / variance).sum(-1)
    log_det_q = 2 * q.scale_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    log_det_p = variance.log().sum(-1)
    return 0.5 * (trace + mahalanobis - q.event_shape[0] + log_det_p - log_det_q)
