"""Helpers for users' distribution objects."""

import copy
import hashlib

import torch
from pyro.distributions import ExpandedDistribution
from torch.distributions import Distribution, Independent, Transform, constraints
from torch.distributions.mixture_same_family import MixtureSameFamilyConstraint
from torch.distributions.utils import lazy_property


def on_device(obj, device, _seen=None):
    """
    ``obj`` (a distribution or a transform) itself when its tensor attributes,
    and those of the distributions and transforms it holds (an
    ``Independent``'s base, a ``TransformedDistribution``'s transforms), are
    on ``device``; else a shallow copy whose are.  ``nn.Module.to`` moves
    parameters and buffers, not the plain tensors of a distribution held by a
    module, so priors built from a user's distribution move them with this.
    Each object is visited once: a transform and its cached inverse point at
    each other.
    """
    seen = set() if _seen is None else _seen
    if id(obj) in seen:
        return obj
    seen.add(id(obj))
    moved = {}
    for name, value in vars(obj).items():
        if isinstance(value, torch.Tensor) and value.device != device:
            moved[name] = value.to(device)
        elif isinstance(value, (Distribution, Transform)) and (inner := on_device(value, device, seen)) is not value:
            moved[name] = inner
        elif isinstance(value, (list, tuple)) and any(isinstance(v, (Distribution, Transform)) for v in value):
            items = [on_device(v, device, seen) if isinstance(v, (Distribution, Transform)) else v for v in value]
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
    # Wrappers that keep their base's support: Independent's and MixtureSameFamily's.
    while isinstance(support, (constraints.independent, MixtureSameFamilyConstraint)):
        support = support.base_constraint
    return support is constraints.real


def fingerprint(obj):
    """
    A digest of a user's prior: its class and the values of its public tensor
    and number attributes, and of the distributions and transforms it holds
    (not its caches or lazily computed attributes), so that a model
    file can tell whether the prior passed to ``load`` is the one it was
    trained with.  Tensors count by value in float64, whatever their dtype or
    device.  A factory (a function) counts by its name only.
    """
    hasher = hashlib.sha256()
    seen = set()

    def visit(value):
        if isinstance(value, torch.Tensor):
            hasher.update(f"tensor{tuple(value.shape)}".encode())
            hasher.update(value.detach().to("cpu", torch.float64).numpy().tobytes())
        elif value is None or isinstance(value, (bool, int, float, str)):
            hasher.update(repr(value).encode())
        elif isinstance(value, (list, tuple)):
            hasher.update(b"[")
            for item in value:
                visit(item)
            hasher.update(b"]")
        elif isinstance(value, (Distribution, Transform)) and id(value) not in seen:
            seen.add(id(value))
            hasher.update(type(value).__qualname__.encode())
            for name, item in sorted(vars(value).items()):
                # Private attributes are caches (a transform's inverse and last result), except the
                # distributions a MixtureSameFamily keeps privately.
                public = not name.startswith("_") or isinstance(item, Distribution)
                if public and not isinstance(getattr(type(value), name, None), lazy_property):
                    hasher.update(name.encode())
                    visit(item)
        else:
            hasher.update(getattr(value, "__qualname__", type(value).__qualname__).encode())

    visit(obj)
    return hasher.hexdigest()
