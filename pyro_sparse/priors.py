"""
Priors on global sites that own a fitting step of their own.

A prior here is an ``nn.Module`` that builds the Pyro distribution of one
global site (``distribution()``) and may define hooks that the training loop
calls around each optimizer step on the point estimate of that site:

* ``update(param)`` — closed-form updates of the prior's own state (e.g. an
  EM E-step); also called once before training;
* ``before_step(param)`` — may rewrite ``param.grad``;
* ``after_step(param, step_size, max_shift, strength=1)`` — may map the new
  value, e.g. through a proximal operator, given the optimizer's
  per-coordinate step sizes, the largest move one step may make (the
  learning rate) and the weight of the prior's penalty in this step, then
  calls ``update``.  The training loop ramps ``strength`` from 0 to 1 with
  the KL warm-up of the codes: a mask entry zeroed before the decoder has
  learned to use the codes would stay zero for good (its averaged gradient
  never beats the penalty once the codes carry no signal), so the mask's
  penalty is annealed together with the codes' KL.

Priors know nothing of the model they are used in.
"""

import pyro.distributions as dist
import torch
from torch import nn
from torch.distributions import Distribution

from pyro_sparse.distributions import GroupLasso, SpikeSlabLasso


class SitePrior(nn.Module):
    """A prior with the fitting hooks described above; each does nothing unless overridden."""

    def update(self, param):
        pass

    def before_step(self, param):
        pass

    def after_step(self, param, step_size, max_shift, strength=1.0):
        pass


class DistributionSitePrior(SitePrior):
    """
    A user's Pyro distribution as the prior of a point-estimated global site
    of shape ``shape`` (e.g. the (G, K) mask W), with no fitting hooks: its
    log-density enters the MAP objective and its gradient the optimizer
    step, as any other term.

    :param prior: a ``TorchDistribution`` whose shape broadcasts to ``shape``
        (a scalar distribution is applied to every entry), or a factory
        ``f(shape)`` returning one; a factory that is an ``nn.Module`` has
        its parameters fitted with the model's.
    :param tuple shape: the site's shape.
    """

    def __init__(self, prior, shape):
        super().__init__()
        if isinstance(prior, type):
            raise TypeError(f"mask_prior must be a distribution instance or a factory, got the class {prior.__name__}")
        if not (isinstance(prior, Distribution) or callable(prior)):
            raise TypeError(f"mask_prior must be a name, a Pyro distribution or a factory, got {prior!r}")
        self.shape = tuple(shape)
        self.instance, self.factory = (prior, None) if isinstance(prior, Distribution) else (None, prior)
        self.distribution()  # fail at construction, not in the first step

    def distribution(self):
        prior = self.instance if self.factory is None else self.factory(self.shape)
        if not isinstance(prior, Distribution):
            raise TypeError(f"the mask_prior factory must return a Pyro distribution, got {type(prior).__name__}")
        shape = prior.batch_shape + prior.event_shape
        try:
            broadcastable = torch.broadcast_shapes(shape, self.shape) == self.shape
        except RuntimeError:
            broadcastable = False
        if not broadcastable or len(prior.event_shape) > len(self.shape):
            raise ValueError(
                f"mask_prior {type(prior).__name__} has batch shape {tuple(prior.batch_shape)} and event shape "
                f"{tuple(prior.event_shape)}, which do not broadcast to the site's shape {self.shape}"
            )
        event_dims = len(prior.event_shape)
        batch = self.shape[: len(self.shape) - event_dims]
        return prior.expand(batch).to_event(len(batch))


class SpikeSlabLassoPrior(SitePrior):
    r"""
    The SSL prior on a (G, K) mask W with its EM updates (Moran et al. 2022,
    Algorithm 1 and Appendix B.1).

    * E-step: E[γ_jk | w_jk, η_k] (Eq. 57) and
      η_k = (Σ_j E[γ_jk] + a - 1) / (a + b + G - 2), kept as buffers and
      computed in float64 without autograd, so η never underflows to zero by
      rounding alone.
    * M-step for W: the E-step turns the prior term into a weighted lasso
      -Σ λ*_jk |w_jk| with λ* = λ*(w^(t), η^(t)) (Eq. 55, 58).  It is applied
      as a proximal step in the optimizer's own metric: ``before_step``
      removes the lasso's gradient λ*·sign(w) (which autograd put there via
      the SSL log-density) so the optimizer sees only the smooth part, and
      ``after_step`` soft-thresholds the new W by step_size·λ*.  Entries in
      the spike end exactly zero, as in the paper's Fig. 2d, and the penalty
      is weighed against the likelihood in the same units.  (Left inside an
      Adam step instead, a small but consistent penalty gradient moves W at
      the full learning rate and switches off columns before the decoder has
      learned to use them.)

    The loop's loss must be the full -ELBO (data term scaled by N / batch) so
    that gradients and λ* are in the same units.

    :param int num_features: G.
    :param int latent_dim: K.
    :param float lambda0: spike rate (λ0 ≫ λ1).
    :param float lambda1: slab rate.
    :param float a: Beta(a, b) prior on η_k.
    :param float b: Beta(a, b) prior on η_k; ``None`` means G (Appendix C.2).
    :param float gradient_averaging: weight of the newest gradient in the
        running average that decides whether a zero entry may leave zero
        (0.01 averages over about 100 steps).
    """

    def __init__(self, num_features, latent_dim, lambda0=10.0, lambda1=1.0, a=1.0, b=None, gradient_averaging=0.01):
        super().__init__()
        if not (lambda0 > 0 and lambda1 > 0):
            raise ValueError(f"lambda0 and lambda1 must be positive, got {lambda0}, {lambda1}")
        if lambda0 < lambda1:
            raise ValueError(
                f"the spike rate lambda0 ({lambda0}) must be at least the slab rate lambda1 ({lambda1})"
            )
        b = float(num_features) if b is None else float(b)
        if not (a > 0 and b > 0):
            raise ValueError(f"Beta hyperparameters a and b must be positive, got {a}, {b}")
        self.lambda0, self.lambda1, self.a, self.b = float(lambda0), float(lambda1), float(a), b
        self.gradient_averaging = float(gradient_averaging)
        self.num_features = num_features
        self.register_buffer("eta", torch.full((latent_dim,), 0.5))
        self.register_buffer("inclusion_probs", torch.full((num_features, latent_dim), 0.5))
        self.register_buffer("average_gradient", torch.zeros(num_features, latent_dim))
        self.register_buffer("num_steps", torch.zeros((), dtype=torch.long))
        self._was_zero = None

    def _ssl(self, like):
        return SpikeSlabLasso(self.eta.to(like.dtype).expand_as(like), self.lambda0, self.lambda1)

    def distribution(self):
        """The prior of W as a Pyro distribution with event shape (G, K)."""
        return SpikeSlabLasso(self.eta.expand(self.num_features, -1), self.lambda0, self.lambda1).to_event(2)

    def penalty_weights(self):
        """λ* (Eq. 58) from the last E-step."""
        return self.lambda1 * self.inclusion_probs + self.lambda0 * (1 - self.inclusion_probs)

    @torch.no_grad()
    def update(self, mask):
        """E-step (Eq. 57) then the closed-form η update of Algorithm 1."""
        w = mask.detach().double()
        probs = self._ssl(w).inclusion_probability(w)
        new_eta = (probs.sum(0) + self.a - 1) / (self.a + self.b + self.num_features - 2)
        tiny = torch.finfo(self.eta.dtype).tiny
        self.eta.copy_(new_eta.clamp(tiny, 1 - 1e-6))
        self.inclusion_probs.copy_(probs)

    @torch.no_grad()
    def before_step(self, mask):
        # d/dw of -log SSL(w) is exactly λ*(w)·sign(w); leave only the smooth part.
        mask.grad.sub_(self._ssl(mask).penalty_weight(mask) * mask.sign())
        self.num_steps += 1
        self.average_gradient.lerp_(mask.grad.to(self.average_gradient.dtype), max(self.gradient_averaging, 1 / self.num_steps.item()))
        self._was_zero = mask == 0

    @torch.no_grad()
    def after_step(self, mask, step_size, max_shift, strength=1.0):
        # Capped at the optimizer's largest move: where the smooth gradient has
        # been ~0, Adam's step size lr/(sqrt(v)+eps) is huge and an uncapped
        # threshold would zero an entry in one step, before the data could
        # speak for it.
        penalty = strength * self.penalty_weights()
        threshold = (step_size * penalty).clamp_max(max_shift)
        mask.copy_(mask.sign() * (mask.abs() - threshold).clamp_min(0))
        # A zero entry stays zero until the gradient averaged over many steps
        # beats its penalty (the zero test of regularized dual averaging, Xiao
        # 2010).  Tested on one minibatch's gradient instead, spike entries
        # flicker off zero whenever the minibatch noise exceeds λ*.
        if self._was_zero is not None:
            mask.masked_fill_(self._was_zero & (self.average_gradient.abs() <= penalty), 0.0)
        self.update(mask)


def group_soft_threshold(value, threshold):
    r"""
    The proximal operator of t‖·‖₂ over the last dimension,
    argmin_u ½‖u - w‖² + t‖u‖₂ = w · max(0, 1 - t / ‖w‖₂): a group whose norm
    is at most t becomes exactly zero, the others shrink towards zero by t.

    :param torch.Tensor value: w, groups along the last dimension.
    :param threshold: t ≥ 0, broadcastable to ``value.shape[:-1] + (1,)``.
    """
    norm = torch.linalg.vector_norm(value, dim=-1, keepdim=True)
    return value * (1 - threshold / norm.clamp_min(torch.finfo(value.dtype).tiny)).clamp_min(0)


class GroupLassoPrior(SitePrior):
    r"""
    The group-lasso prior of the oi-VAE (Ainsworth et al. 2018) on a
    ``(groups, K, p)`` tensor W whose entry ``W[g, k]`` is column k of the
    latent-to-group matrix W^{(g)} (p x K):

    .. math:: -\log p(W) = \lambda \sum_{g,k} \lVert W^{(g)}_{\cdot,k} \rVert_2 + \text{const},

    so a whole column is switched off at once: latent k then does not reach
    group g.  As the oi-VAE, W gets a *proximal* step (group soft-threshold)
    after each gradient step instead of the penalty's subgradient:
    ``before_step`` removes the penalty's gradient λ w/‖w‖, which autograd
    put there through :class:`~pyro_sparse.distributions.GroupLasso`, and
    ``after_step`` applies :func:`group_soft_threshold`.  The threshold is λ
    times the optimizer's step size, averaged over the p coordinates of a
    column (Adam's metric is per coordinate; the closed-form group prox needs
    one step size per group), and capped at the largest move one step may
    make, as for :class:`SpikeSlabLassoPrior`.  Likewise a zero column stays
    zero until the norm of its gradient averaged over many steps exceeds λ
    (the zero test of regularized dual averaging, Xiao 2010, which is also
    the group lasso's optimality condition at zero); tested on one
    minibatch's gradient, zero columns flicker back whenever the minibatch
    noise exceeds λ.

    λ is the rate of a prior on the full-data ELBO, counted once per step
    like every global prior here; the oi-VAE code adds λ‖·‖ to a loss
    averaged over the minibatch, so its λ is ``lam = N·λ`` here.

    :param int num_groups: number of feature groups.
    :param int latent_dim: K.
    :param int group_dim: p, the rows of each W^{(g)}.
    :param float lam: λ.
    :param float gradient_averaging: weight of the newest gradient in the
        running average used by the zero test.
    """

    def __init__(self, num_groups, latent_dim, group_dim, lam=1.0, gradient_averaging=0.01):
        super().__init__()
        if not lam > 0:
            raise ValueError(f"lam must be positive, got {lam}")
        self.num_groups, self.latent_dim, self.group_dim = num_groups, latent_dim, group_dim
        self.gradient_averaging = float(gradient_averaging)
        self.register_buffer("rate", torch.tensor(float(lam)))
        self.register_buffer("average_gradient", torch.zeros(num_groups, latent_dim, group_dim))
        self.register_buffer("num_steps", torch.zeros((), dtype=torch.long))
        self._was_zero = None

    def distribution(self):
        """The prior of W as a Pyro distribution with event shape (groups, K, p)."""
        return GroupLasso(self.rate, self.group_dim).expand((self.num_groups, self.latent_dim)).to_event(2)

    @torch.no_grad()
    def before_step(self, weights):
        # d/dw of λ‖w‖ is λ w/‖w‖ (0 at w = 0); leave only the smooth part.
        norm = torch.linalg.vector_norm(weights, dim=-1, keepdim=True)
        weights.grad.sub_(self.rate * weights / norm.clamp_min(torch.finfo(norm.dtype).tiny))
        self.num_steps += 1
        weight = max(self.gradient_averaging, 1 / self.num_steps.item())
        self.average_gradient.lerp_(weights.grad.to(self.average_gradient.dtype), weight)
        self._was_zero = norm == 0

    @torch.no_grad()
    def after_step(self, weights, step_size, max_shift, strength=1.0):
        rate = strength * self.rate
        threshold = (rate * step_size.mean(-1, keepdim=True)).clamp_max(max_shift)
        weights.copy_(group_soft_threshold(weights, threshold))
        if self._was_zero is not None:
            quiet = torch.linalg.vector_norm(self.average_gradient, dim=-1, keepdim=True) <= rate
            weights.masked_fill_(self._was_zero & quiet, 0.0)


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
    data) while the products τ_jk v_k converge.  Stored as they are, τ
    underflows within a few hundred steps, after which every τ_jk sits at the
    same floor and the prior loses its local (per-entry) shrinkage.  So this
    class stores the sweep exactly in rescaled coordinates: buffers
    ``tau`` = τ/s, ``v`` = v·s, ``lambda_local`` = λ_local·s (renormalised to
    1 after each sweep) and ``log_scale`` = log s, in which Eq. 67-70 read the
    same except that 1/λ_global and 1/b_local² carry a factor s and Σ 1/v_k a
    factor s.  As s → 0 those terms vanish, as they do in the paper's
    updates.

    As for :class:`SpikeSlabLassoPrior`, the Gaussian term -log N(w; 0, τv)
    enters W by a proximal step in the optimizer's metric rather than by its
    gradient: ``before_step`` removes w/(τv) from the gradient and
    ``after_step`` maps w to w / (1 + s_w/(τv)) for step size s_w, moving it
    at most as far as one optimizer step may.  (Inside Adam, the stiff
    gradient w/(τv) of a small variance makes w oscillate around 0 at the
    learning rate.)

    :param int num_features: G.
    :param int latent_dim: K.
    :param float b_local: scale of the local half-Cauchy.
    :param float b_global: scale of the global half-Cauchy.
    """

    def __init__(self, num_features, latent_dim, b_local=1.0, b_global=1.0):
        super().__init__()
        if not (b_local > 0 and b_global > 0):
            raise ValueError(f"b_local and b_global must be positive, got {b_local}, {b_global}")
        self.num_features, self.latent_dim = num_features, latent_dim
        self.b_local, self.b_global = float(b_local), float(b_global)
        self.register_buffer("tau", torch.ones(num_features, latent_dim))
        self.register_buffer("v", torch.ones(latent_dim))
        self.register_buffer("lambda_local", torch.ones(()))
        self.register_buffer("lambda_global", torch.ones(()))
        self.register_buffer("log_scale", torch.zeros((), dtype=torch.float64))

    def prior_variance(self):
        """τ_jk v_k, the variance of w_jk, (G, K)."""
        finfo = torch.finfo(self.tau.dtype)
        return (self.tau * self.v).clamp(finfo.tiny, finfo.max)

    def distribution(self):
        """The prior of W given τ and v as a Pyro distribution with event shape (G, K)."""
        return dist.Normal(torch.zeros_like(self.tau), self.prior_variance().sqrt()).to_event(2)

    @torch.no_grad()
    def update(self, mask):
        """One sweep of Eq. 67-70 in that order, each using the newest values, then rescaling."""
        finfo = torch.finfo(self.tau.dtype)
        w2 = mask.detach().double() ** 2
        G, K = w2.shape
        s = self.log_scale.exp()
        tau = 0.5 * (w2 / (2 * self.v.double()) + 1 / self.lambda_local.double())
        v = (2 / (G + 3) * ((w2 / (2 * tau)).sum(0) + s / self.lambda_global.double())).clamp_min(finfo.tiny)
        lambda_local = 2 / (G * K + 3) * ((1 / tau).sum() + s / self.b_local**2)
        lambda_global = 2 / (K + 3) * (s * (1 / v).sum() + 1 / self.b_global**2)
        # Rescale so that lambda_local = 1: the drift goes into log_scale only.
        self.tau.copy_(tau * lambda_local)
        self.v.copy_((v / lambda_local).clamp_min(finfo.tiny))
        self.lambda_local.fill_(1.0)
        self.lambda_global.copy_(lambda_global)
        self.log_scale.sub_(lambda_local.log())

    @torch.no_grad()
    def before_step(self, mask):
        # d/dw of -log N(w; 0, τv) is w/(τv); leave only the smooth part.
        mask.grad.sub_(mask / self.prior_variance())

    @torch.no_grad()
    def after_step(self, mask, step_size, max_shift, strength=1.0):
        shrunk = mask / (1 + strength * step_size / self.prior_variance())
        mask.copy_(mask.sign() * torch.maximum(shrunk.abs(), mask.abs() - max_shift))
        self.update(mask)
