"""Helpers for users' distribution objects."""

import copy

import torch
from torch.distributions import Distribution


def on_device(distribution, device):
    """
    ``distribution`` itself when its tensor attributes (and those of the
    distributions it wraps, e.g. an ``Independent``'s base) are on
    ``device``; else a shallow copy whose are.  ``nn.Module.to`` moves
    parameters and buffers, not the plain tensors of a distribution held by a
    module, so priors built from a user's distribution move them with this.
    """
    moved = {}
    for name, value in vars(distribution).items():
        if isinstance(value, torch.Tensor) and value.device != device:
            moved[name] = value.to(device)
        elif isinstance(value, Distribution) and (inner := on_device(value, device)) is not value:
            moved[name] = inner
    if not moved:
        return distribution
    copied = copy.copy(distribution)
    vars(copied).update(moved)
    return copied
