"""
KL divergences to a broadcast prior.  Pyro broadcasts a distribution without
an ``expand`` of its own (a user's prior, say) as an
:class:`~pyro.distributions.ExpandedDistribution`, for which torch finds no
registered KL, so a closed form registered against the user's class would go
unused.  Broadcasting changes no density: KL(q ‖ expand(p)) = KL(q ‖ p),
broadcast to the joint batch shape.
"""

import torch
from pyro.distributions import Delta, ExpandedDistribution
from torch.distributions import Distribution
from torch.distributions.kl import kl_divergence, register_kl


@register_kl(Distribution, ExpandedDistribution)
def _kl_to_expanded(q, p):
    """KL(q ‖ p.base_dist), broadcast; NotImplementedError (no closed form) if none is registered for the base."""
    kl = kl_divergence(q, p.base_dist)
    return kl.expand(torch.broadcast_shapes(kl.shape, q.batch_shape, p.batch_shape))


@register_kl(Delta, ExpandedDistribution)
def _kl_delta_to_expanded(q, p):
    """As Pyro's KL(Delta ‖ ·) (-log p(v)); registered to settle the tie with the rule above."""
    return -p.log_prob(q.v)
