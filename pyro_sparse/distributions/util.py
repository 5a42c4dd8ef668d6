"""Helpers for users' distribution objects."""

import copy
import hashlib

import torch
from pyro.distributions import ExpandedDistribution
from torch.distributions import Distribution, Independent, Transform, constraints
from torch.distributions.mixture_same_family import MixtureSameFamilyConstraint
from torch.distributions.utils import lazy_property


def on_device(obj, device, _moved=None):
    """
    ``obj`` (a distribution or a transform) itself when its tensor attributes,
    and those of the distributions and transforms it holds (an
    ``Independent``'s base, a ``TransformedDistribution``'s transforms), are
    on ``device``; else a shallow copy whose are.  ``nn.Module.to`` moves
    parameters and buffers, not the plain tensors of a distribution held by a
    module, so priors built from a user's distribution move them with this.
    An object held twice is moved once (its copy serves both); a transform
    and its cached inverse, which point at each other, keep that link to the
    original.
    """
    moved_objects = {} if _moved is None else _moved
    if id(obj) in moved_objects:
        return moved_objects[id(obj)]
    moved_objects[id(obj)] = obj  # while inside it: a cycle back to it finds the original
    moved = {}
    for name, value in vars(obj).items():
        if isinstance(value, torch.Tensor) and value.device != device:
            moved[name] = value.to(device)
        elif isinstance(value, (Distribution, Transform)) and (
                inner := on_device(value, device, moved_objects)) is not value:
            moved[name] = inner
        elif isinstance(value, (list, tuple)) and any(isinstance(v, (Distribution, Transform)) for v in value):
            items = [on_device(v, device, moved_objects) if isinstance(v, (Distribution, Transform)) else v
                     for v in value]
            if any(new is not old for new, old in zip(items, value)):
                moved[name] = type(value)(items)
    if moved:
        copied = copy.copy(obj)
        vars(copied).update(moved)
        moved_objects[id(obj)] = copied
    return moved_objects[id(obj)]


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
    A digest of a user's prior: its class, its parameters (``arg_constraints``,
    however they were given: ``probs`` or ``logits``) and the values of its
    other public tensor and number attributes, and the same of the
    distributions and transforms it holds (not caches), so that a model file
    can tell whether the prior passed to ``load`` is the one it was trained
    with.  Tensors count by value in float32, whatever their dtype or device;
    an object held twice counts as two equal ones.  A factory (a function)
    counts by its name only.
    """
    digests = {}

    def digest(value):
        if isinstance(value, torch.Tensor):
            data = value.detach().to("cpu", torch.float32).numpy().tobytes()
            return f"tensor{tuple(value.shape)}:{hashlib.sha256(data).hexdigest()}"
        if value is None or isinstance(value, (bool, int, float, str)):
            return repr(value)
        if isinstance(value, (list, tuple)):
            return "[" + ",".join(digest(item) for item in value) + "]"
        if not isinstance(value, (Distribution, Transform)):
            return getattr(value, "__qualname__", type(value).__qualname__)
        if id(value) in digests:
            return digests[id(value)]
        digests[id(value)] = "cycle"  # while inside it: a transform's cached inverse points back
        parameters = set(getattr(value, "arg_constraints", {}) or {}) if isinstance(value, Distribution) else set()
        parts = [type(value).__qualname__]
        for name in sorted(parameters | set(vars(value))):
            item = getattr(value, name, None) if name in parameters else vars(value)[name]
            # Private attributes are caches (a transform's inverse and last result), except the distributions a
            # MixtureSameFamily keeps privately; lazy ones not among the parameters are computed, not given.
            lazy = isinstance(getattr(type(value), name, None), lazy_property) and name not in parameters
            if (not name.startswith("_") or isinstance(item, Distribution)) and not lazy:
                parts.append(f"{name}={digest(item)}")
        digests[id(value)] = hashlib.sha256("|".join(parts).encode()).hexdigest()
        return digests[id(value)]

    return hashlib.sha256(digest(obj).encode()).hexdigest()
