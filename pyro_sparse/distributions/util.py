"""Helpers for users' distribution objects."""

import copy

import torch
from pyro.distributions import ExpandedDistribution
from torch.distributions import Distribution, Independent, Transform, constraints


def on_device(obj, device):
    """
    ``obj`` (a distribution or a transform) itself when its tensor attributes,
    and those of the distributions and transforms it holds (an
    ``Independent``'s base, a ``TransformedDistribution``'s transforms), are
    on ``device``; else a shallow copy whose are.  ``nn.Module.to`` moves
    parameters and buffers, not the plain tensors of a distribution held by a
    module, so priors built from a user's distribution move them with this.
    """
    moved = {}
    for name, value in vars(obj).items():
        if isinstance(value, torch.Tensor) and value.device != device:
            moved[name] = value.to(device)
        elif isinstance(value, (Distribution, Transform)) and (inner := on_device(value, device)) is not value:
            moved[name] = inner
        elif isinstance(value, (list, tuple)) and any(isinstance(v, (Distribution, Transform)) for v in value):
            items = [on_device(v, device) if isinstance(v, (Distribution, Transform)) else v for v in value]
            if any(new is not old for new, old in zip(items, value)):
                moved[name] = type(value)(items)
    if not moved:
        return obj
    copied = copy.copy(obj)
    vars(copied).update(moved)
    return copied


def unshared(obj):
    """
    ``obj`` with fresh copies of its ``Independent`` and ``ExpandedDistribution``
    layers (the distribution they wrap is shared): Pyro's
    ``ExpandedDistribution.expand`` changes the object in place, so what a
    prior hands to Pyro's plates, or expands itself, at every step must be
    its own, not the user's object or the last step's.
    """
    if not isinstance(obj, (Independent, ExpandedDistribution)):
        return obj
    copied = copy.copy(obj)
    copied.base_dist = unshared(obj.base_dist)
    return copied


def is_real_support(support):
    """Whether a support is the whole real line (per coordinate): the support a code z or a mask weight needs."""
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    return support is constraints.real
