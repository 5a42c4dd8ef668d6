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

import copy
import math

import torch
from torch import nn
from torch.distributions import Distribution

from pyro_sparse.distributions.util import is_real_support, on_device, unshared


def own_copy(factory):
    """
    A prior factory that is an ``nn.Module`` is copied: each fit learns its own
    parameters, from the values the user's object holds, and leaves that object
    as it was (shared, a second fit would start where the first ended and move
    the first fit's prior).
    """
    return copy.deepcopy(factory) if isinstance(factory, nn.Module) else factory


def largest_shrink(max_shift, size=1):
    """
    The most a proximal step may shrink a block of ``size`` coordinates (its
    length), given the optimizer's largest move of one coordinate: twice the
    optimizer's largest move of the block (``max_shift``·√size).  Finite, so
    that an entry whose gradient has been ~0 (a tiny Adam second moment, a
    huge step size) is not zeroed in one step before the data speak for it;
    twice the move, so that under a steady gradient (Adam then moves each
    coordinate by exactly ``max_shift``) a penalty larger than the gradient
    still wins instead of stalling the entry where it is.
    """
    return 2.0 * max_shift * math.sqrt(size)


def gradient_averaging_weight(value):
    """The weight of the newest gradient in a zero test's running average, checked to lie in (0, 1]."""
    if isinstance(value, bool) or not 0 < value <= 1:
        raise ValueError(f"gradient_averaging is a running average's weight in (0, 1], got {value!r}")
    return float(value)


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
        ``f(shape)`` returning one; a factory that is an ``nn.Module`` is
        copied (:func:`own_copy`) and its parameters fitted with the model's.  The distribution's plain
        tensors are moved to the model's device when it is used.
    :param tuple shape: the site's shape.
    """

    def __init__(self, prior, shape):
        super().__init__()
        if isinstance(prior, type):
            raise TypeError(f"mask_prior must be a distribution instance or a factory, got the class {prior.__name__}")
        if not (isinstance(prior, Distribution) or callable(prior)):
            raise TypeError(f"mask_prior must be a name, a Pyro distribution or a factory, got {prior!r}")
        self.shape = tuple(shape)
        self.instance, self.factory = (prior, None) if isinstance(prior, Distribution) else (None, own_copy(prior))
        # Where the model lives (Module.to() moves this empty buffer): distribution() moves the user's tensors there.
        self.register_buffer("device_marker", torch.empty(0), persistent=False)
        self.distribution()  # fail at construction, not in the first step

    def distribution(self):
        prior = self.instance if self.factory is None else self.factory(self.shape)
        if not isinstance(prior, Distribution):
            raise TypeError(f"the mask_prior factory must return a Pyro distribution, got {type(prior).__name__}")
        if not is_real_support(prior.support):
            raise ValueError(f"mask_prior {type(prior).__name__} has support {prior.support}; the weights of W are "
                             "real-valued (a prior on their magnitudes is a distribution of |w|, not of w)")
        prior = on_device(prior, self.device_marker.device)
        if self.factory is None:
            self.instance = prior  # moved once, not at every step
        shape = prior.batch_shape + prior.event_shape
        try:
            broadcastable = torch.broadcast_shapes(shape, self.shape) == self.shape
        except RuntimeError:
            broadcastable = False
        event_dims = len(prior.event_shape)
        # An event is one draw of those entries: it must have their shape, not just broadcast to it.
        if not broadcastable or event_dims > len(self.shape) or (
                event_dims and tuple(prior.event_shape) != self.shape[len(self.shape) - event_dims:]):
            raise ValueError(
                f"mask_prior {type(prior).__name__} has batch shape {tuple(prior.batch_shape)} and event shape "
                f"{tuple(prior.event_shape)}, which do not fit the site's shape {tuple(self.shape)} (the batch shape "
                "must broadcast to it and the event shape be its last dims)"
            )
        batch = self.shape[: len(self.shape) - event_dims]
        return unshared(prior).expand(batch).to_event(len(batch))


