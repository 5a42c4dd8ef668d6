"""The group-lasso prior of the oi-VAE's latent-to-group maps (Ainsworth et al. 2018), fitted by proximal steps."""

import torch

from pyro_sparse.checks import positive_number
from pyro_sparse.distributions import GroupLasso
from pyro_sparse.priors.site import SitePrior, gradient_averaging_weight, largest_shrink


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
    one step size per group), and capped at twice the largest move one step
    may make of the column (:func:`~pyro_sparse.priors.site.largest_shrink`),
    as for :class:`SpikeSlabLassoPrior`.  Likewise a zero column stays
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
        lam = positive_number("lam", lam)
        self.num_groups, self.latent_dim, self.group_dim = num_groups, latent_dim, group_dim
        self.gradient_averaging = gradient_averaging_weight(gradient_averaging)
        self.register_buffer("rate", torch.tensor(lam))
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
        threshold = (rate * step_size.mean(-1, keepdim=True)).clamp_max(largest_shrink(max_shift, weights.shape[-1]))
        weights.copy_(group_soft_threshold(weights, threshold))
        if self._was_zero is not None:
            quiet = torch.linalg.vector_norm(self.average_gradient, dim=-1, keepdim=True) <= rate
            weights.masked_fill_(self._was_zero & quiet, 0.0)
