"""The horseshoe prior of the decoder mask W (Moran et al. 2022, Appendix C.4.1) with closed-form updates."""

import math

import pyro.distributions as dist
import torch

from pyro_sparse.checks import positive_number
from pyro_sparse.priors.site import SitePrior, largest_shrink


class HorseshoePrior(SitePrior):
    r"""
    The horseshoe prior on a (G, K) mask W of Moran et al. (2022), Appendix
    C.4.1, Eq. 61-66, with the half-Cauchy scales written as inverse-Gamma
    mixtures (Ghosh et al. 2019):

    .. math::

        \lambda_\text{global} \sim \mathrm{IG}(\tfrac12, 1/b_\text{global}^2),\quad
        \lambda_\text{local} \sim \mathrm{IG}(\tfrac12, 1/b_\text{local}^2),\quad
        \tau_{jk} \sim \mathrm{IG}(\tfrac12, 1/\lambda_\text{local}),\quad
        v_k \sim \mathrm{IG}(\tfrac12, 1/\lambda_\text{global}),\quad
        w_{jk} \sim \mathcal N(0, \tau_{jk} v_k).

    τ and v are *variances*: by Eq. 61 an IG(½, 1/λ) variable is the square
    of a half-Cauchy scale.  (Eq. 66 prints N(0, τ²v²), which contradicts
    Eq. 61; with it no update below would be closed-form.)  After each
    gradient step the hyperparameters take one sweep of coordinate ascent on
    log p(W, τ, v, λ), each the mode of its inverse-Gamma full conditional:

    .. math::

        \tau_{jk} = \tfrac12\big(w_{jk}^2 / (2 v_k) + 1/\lambda_\text{local}\big) \quad (67)

        v_k = \tfrac{2}{G + 3}\big(\textstyle\sum_j w_{jk}^2 / (2\tau_{jk}) + 1/\lambda_\text{global}\big) \quad (68)

        \lambda_\text{local} = \tfrac{2}{GK + 3}\big(\textstyle\sum_{j,k} 1/\tau_{jk} + 1/b_\text{local}^2\big) \quad (69)

        \lambda_\text{global} = \tfrac{2}{K + 3}\big(\textstyle\sum_k 1/v_k + 1/b_\text{global}^2\big) \quad (70)

    (the text prints 1/b in Eq. 69-70 where Eq. 62-63 give 1/b²; the paper
    sets b = 1, where the two agree).

    **The joint density has no maximum.**  Along τ → sτ, v → v/s,
    λ_local → λ_local/s the prior of W is unchanged (it depends on τv only)
    while log p grows like (GK - 3(K + 1)/2)·log(1/s), so the sweeps drive
    τ → 0 and v → ∞ geometrically (by ~40% a sweep on the paper's synthetic
    data) while the products τ_jk v_k converge; in a column with few
    non-zero entries v_k → 0 and τ_jk → ∞ instead.  Stored as they are, τ
    and v leave the floating-point range within a few hundred steps (and
    then every τ_jk sits at the same floor, or τ_jk v_k reads inf), so this
    class keeps their logarithms in float64 (``log_tau``, ``log_v``,
    ``log_lambda_local``, ``log_lambda_global``) and runs Eq. 67-70 in log
    space with logsumexp: the same sweep, and τ_jk v_k exact however far
    τ and v drift.

    As for :class:`SpikeSlabLassoPrior`, the Gaussian term -log N(w; 0, τv)
    enters W by a proximal step in the optimizer's metric rather than by its
    gradient: ``before_step`` removes w/(τv) from the gradient and
    ``after_step`` maps w to w / (1 + s_w/(τv)) for step size s_w, moving it
    at most twice as far as one optimizer step may
    (:func:`~pyro_sparse.priors.site.largest_shrink`).  (Inside Adam, the stiff
    gradient w/(τv) of a small variance makes w oscillate around 0 at the
    learning rate.)

    :param int num_features: G.
    :param int latent_dim: K.
    :param float b_local: scale of the local half-Cauchy.
    :param float b_global: scale of the global half-Cauchy.
    """

    def __init__(self, num_features, latent_dim, b_local=1.0, b_global=1.0):
        super().__init__()
        self.num_features, self.latent_dim = num_features, latent_dim
        self.b_local, self.b_global = positive_number("b_local", b_local), positive_number("b_global", b_global)
        self.register_buffer("log_tau", torch.zeros(num_features, latent_dim, dtype=torch.float64))
        self.register_buffer("log_v", torch.zeros(latent_dim, dtype=torch.float64))
        self.register_buffer("log_lambda_local", torch.zeros((), dtype=torch.float64))
        self.register_buffer("log_lambda_global", torch.zeros((), dtype=torch.float64))

    def prior_variance(self):
        """τ_jk v_k, the variance of w_jk, (G, K), in float32's range."""
        finfo = torch.finfo(torch.float32)
        return (self.log_tau + self.log_v).exp().clamp(finfo.tiny, finfo.max).float()

    def distribution(self):
        """The prior of W given τ and v as a Pyro distribution with event shape (G, K)."""
        variance = self.prior_variance()
        return dist.Normal(torch.zeros_like(variance), variance.sqrt()).to_event(2)

    @torch.no_grad()
    def update(self, mask):
        """One sweep of Eq. 67-70 in that order, each using the newest values, in log space."""
        log_w2 = (mask.detach().double() ** 2).log()  # -inf where w = 0: logaddexp drops that term
        G, K = log_w2.shape
        half_log_w2 = log_w2 - math.log(2)
        self.log_tau.copy_(math.log(0.5) + torch.logaddexp(half_log_w2 - self.log_v, -self.log_lambda_local))
        self.log_v.copy_(math.log(2 / (G + 3)) + torch.logaddexp(
            torch.logsumexp(half_log_w2 - self.log_tau, 0), -self.log_lambda_global))
        self.log_lambda_local.copy_(math.log(2 / (G * K + 3)) + torch.logaddexp(
            torch.logsumexp(-self.log_tau.flatten(), 0), self.log_lambda_local.new_tensor(-2 * math.log(self.b_local))))
        self.log_lambda_global.copy_(math.log(2 / (K + 3)) + torch.logaddexp(
            torch.logsumexp(-self.log_v, 0), self.log_lambda_global.new_tensor(-2 * math.log(self.b_global))))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Model files of the earlier layout kept τ/s, v·s, λ_local·s and log s (s a common rescaling), not logs.
        if prefix + "tau" in state_dict:
            log_scale = state_dict.pop(prefix + "log_scale").double()
            state_dict[prefix + "log_tau"] = state_dict.pop(prefix + "tau").double().log() + log_scale
            state_dict[prefix + "log_v"] = state_dict.pop(prefix + "v").double().log() - log_scale
            state_dict[prefix + "log_lambda_local"] = state_dict.pop(prefix + "lambda_local").double().log() - log_scale
            state_dict[prefix + "log_lambda_global"] = state_dict.pop(prefix + "lambda_global").double().log()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @torch.no_grad()
    def before_step(self, mask):
        # d/dw of -log N(w; 0, τv) is w/(τv); leave only the smooth part.
        mask.grad.sub_(mask / self.prior_variance())

    @torch.no_grad()
    def after_step(self, mask, step_size, max_shift, strength=1.0):
        shrunk = mask / (1 + strength * step_size / self.prior_variance())
        mask.copy_(mask.sign() * torch.maximum(shrunk.abs(), mask.abs() - largest_shrink(max_shift)))
        self.update(mask)
