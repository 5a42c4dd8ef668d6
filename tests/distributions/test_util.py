"""Helpers for users' distribution objects: moving them to a device, and the digest a model file records."""

import pyro.distributions as dist
import pytest
import torch

from pyro_sparse.distributions.util import fingerprint, on_device


def affine(loc=1.0, scale=2.0):
    return dist.transforms.AffineTransform(torch.tensor(loc), torch.tensor(scale))


def test_an_object_held_twice_is_moved_once_and_a_transform_cycle_ends():
    shared = affine()
    moved = on_device(dist.TransformedDistribution(dist.Normal(0.0, 1.0), [shared, shared]), torch.device("meta"))
    assert [t.loc.device.type for t in moved.transforms] == ["meta", "meta"]
    assert moved.transforms[0] is moved.transforms[1]
    assert shared.loc.device.type == "cpu"  # the user's object is left as it was
    used = affine()
    assert used.inv.inv is used  # a transform and its cached inverse point at each other
    assert on_device(dist.TransformedDistribution(dist.Normal(0.0, 1.0), [used]), torch.device("meta"))


def mixture(weights, locs=(-2.0, 2.0)):
    return dist.MixtureSameFamily(dist.Categorical(probs=torch.tensor(weights)), dist.Normal(torch.tensor(locs), 0.5))


@pytest.mark.parametrize("a, b", [
    (lambda: dist.StudentT(3.0, 0.0, 2.0), lambda: dist.StudentT(3.0, 0.0, 2.0)),
    (lambda: dist.Normal(torch.tensor(0.1), 1.0), lambda: dist.Normal(torch.tensor(0.1, dtype=torch.float64), 1.0)),
    (lambda: mixture([0.5, 0.5]), lambda: mixture([0.5, 0.5])),
    (lambda: dist.TransformedDistribution(dist.Normal(0.0, 1.0), [affine()] * 2),
     lambda: dist.TransformedDistribution(dist.Normal(0.0, 1.0), [affine(), affine()])),
], ids=["equal", "dtype", "mixture", "shared"])
def test_equal_priors_have_one_digest_before_and_after_use(a, b):
    first, second = a(), b()
    digest = fingerprint(first)
    first.log_prob(torch.tensor(0.3))  # use caches values (lazy probs, a transform's inverse and last result)
    first.sample()
    assert fingerprint(first) == digest == fingerprint(second)


@pytest.mark.parametrize("a, b", [
    (lambda: dist.StudentT(3.0, 0.0, 2.0), lambda: dist.StudentT(3.0, 0.0, 2.5)),
    (lambda: dist.StudentT(3.0, 0.0, 2.0), lambda: dist.Normal(0.0, 2.0)),
    (lambda: mixture([0.5, 0.5]), lambda: mixture([0.2, 0.8])),  # weights are a Categorical's lazy probs
    (lambda: dist.Categorical(logits=torch.zeros(2)), lambda: dist.Categorical(logits=torch.tensor([0.0, 1.0]))),
    (lambda: mixture([0.5, 0.5]), lambda: mixture([0.5, 0.5], locs=(-2.0, 3.0))),
], ids=["parameter", "class", "mixture weights", "logits", "component"])
def test_different_priors_have_different_digests(a, b):
    assert fingerprint(a()) != fingerprint(b())
