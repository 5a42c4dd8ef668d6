"""KL to a broadcast prior (pyro_sparse.distributions.expanded_kl)."""

import warnings

import pyro.distributions as dist
import pytest
import torch
from torch.distributions import kl_divergence

import pyro_sparse.distributions  # noqa: F401  (registers the rules)


def test_kl_to_an_expanded_prior_is_the_kl_to_its_base_broadcast():
    q = dist.Normal(torch.randn(5, 3), torch.rand(5, 3) + 0.2)
    p = dist.ExpandedDistribution(dist.Laplace(0.3, 1.5), (3,))
    kl = kl_divergence(q, p)
    assert kl.shape == (5, 3)
    torch.testing.assert_close(kl, kl_divergence(q, dist.Laplace(0.3, 1.5)))
    # Monte Carlo: E_q[log q - log p], with 200k draws per entry.
    torch.manual_seed(0)
    z = q.sample((200_000,))
    mc = (q.log_prob(z) - p.log_prob(z)).mean(0)
    torch.testing.assert_close(kl, mc, atol=0.02, rtol=0.0)


def test_the_joint_batch_shape_and_a_missing_base_kl():
    q = dist.Normal(torch.zeros(3), torch.ones(3))
    p = dist.ExpandedDistribution(dist.Normal(torch.zeros(3), 2.0), (4, 3))
    assert kl_divergence(q, p).shape == (4, 3)
    with pytest.raises(NotImplementedError):  # no KL(Normal || StudentT) in torch: the caller falls back to Monte Carlo
        kl_divergence(q, dist.ExpandedDistribution(dist.StudentT(3.0, 0.0, 1.0), (3,)))


def test_a_delta_against_an_expanded_prior_is_its_negative_log_density_without_ambiguity():
    v = torch.tensor([0.5, -1.0, 2.0])
    p = dist.ExpandedDistribution(dist.Normal(0.0, 1.0), (3,))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when two registered rules tie
        kl = kl_divergence(dist.Delta(v), p)
    torch.testing.assert_close(kl, -dist.Normal(0.0, 1.0).log_prob(v))
