"""Importance-weighted log-likelihood and the KL warm-up handler on models with known answers."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer import TraceMeanField_ELBO

from pyro_sparse.infer.handlers import scale_local_latents
from pyro_sparse.infer.importance import (
    expected_observation,
    importance_log_likelihood,
    log_importance_weights,
)
from pyro_sparse.plates import data_plate


def model(x, num_data=None):
    # z ~ N(0, 1), x | z ~ N(z, 1)  =>  x ~ N(0, 2), z | x ~ N(x / 2, 1 / 2)
    pyro.sample("s", dist.Delta(torch.tensor(1.0)))  # a global site, excluded from the weights
    with data_plate(x, num_data):
        z = pyro.sample("z", dist.Normal(0.0, 1.0))
        pyro.sample("x", dist.Normal(z, 1.0), obs=x)


def make_guide(shift=0.0, scale=math.sqrt(0.5)):
    def guide(x, num_data=None):
        pyro.sample("s", dist.Delta(torch.tensor(1.0)))
        with data_plate(x, num_data):
            pyro.sample("z", dist.Normal(x / 2 + shift, scale))

    return guide


def exact_log_marginal(x):
    return dist.Normal(0.0, math.sqrt(2.0)).log_prob(x)


def test_exact_posterior_gives_exact_log_likelihood():
    x = torch.linspace(-3, 3, 7)
    estimate = importance_log_likelihood(model, make_guide(), x, num_samples=3)
    torch.testing.assert_close(estimate, exact_log_marginal(x), atol=1e-5, rtol=0)


def test_importance_weighting_tightens_towards_the_marginal():
    torch.manual_seed(0)
    x = torch.linspace(-2, 2, 5)
    guide = make_guide(shift=0.7, scale=1.2)
    exact = exact_log_marginal(x)
    elbo = torch.stack([log_importance_weights(model, guide, x) for _ in range(4000)]).mean(0)
    iw = importance_log_likelihood(model, guide, x, num_samples=4000)
    assert (elbo < exact - 0.1).all()  # the ELBO of a poor guide is a strict bound
    torch.testing.assert_close(iw, exact, atol=0.05, rtol=0)


def test_weights_ignore_minibatch_scaling():
    x = torch.linspace(-1, 1, 4)
    a = importance_log_likelihood(model, make_guide(), x, num_samples=2)
    b = importance_log_likelihood(lambda x: model(x, num_data=1000), make_guide(), x, num_samples=2)
    torch.testing.assert_close(a, b)


def test_expected_observation_is_the_mean_at_the_posterior_mean():
    x = torch.tensor([1.0, -2.0])
    torch.testing.assert_close(expected_observation(model, make_guide(), x), x / 2)


def test_given_codes_replace_only_z():
    # x | z, t ~ N(z t, 1) with a second local latent t: given codes set z, t stays at its mean.
    def scaled_model(x, num_data=None):
        with data_plate(x, num_data):
            t = pyro.sample("t", dist.Gamma(3.0, 1.0))
            z = pyro.sample("z", dist.Normal(0.0, 1.0))
            pyro.sample("x", dist.Normal(z * t, 1.0), obs=x)

    def scaled_guide(x, num_data=None):
        with data_plate(x, num_data):
            pyro.sample("t", dist.Gamma(torch.full_like(x, 4.0), 2.0))
            pyro.sample("z", dist.Normal(x, 1.0))

    x = torch.tensor([1.0, -2.0])
    codes = torch.tensor([-0.5, 3.0])
    torch.testing.assert_close(expected_observation(scaled_model, scaled_guide, x, codes), codes * 2.0)


def test_the_posterior_of_z_is_built_at_the_other_sites_means():
    # q(z | x, t) depends on a local t (a learned threshold): z's mean is taken under t's mean, every call,
    # not under a random draw of t with its value overwritten afterwards.
    def scaled_model(x, num_data=None):
        with data_plate(x, num_data):
            pyro.sample("t", dist.Gamma(3.0, 1.0))
            z = pyro.sample("z", dist.Normal(0.0, 1.0))
            pyro.sample("x", dist.Normal(z, 1.0), obs=x)

    def scaled_guide(x, num_data=None):
        with data_plate(x, num_data):
            t = pyro.sample("t", dist.Gamma(torch.full_like(x, 4.0), 2.0))  # mean 2
            pyro.sample("z", dist.Normal(x * t, 1.0))

    x = torch.tensor([1.0, -2.0])
    torch.testing.assert_close(expected_observation(scaled_model, scaled_guide, x), x * 2.0)


def test_factors_are_no_part_of_the_likelihood():
    # A pyro.factor (a prior's training penalty) is not in p(x, z): the estimate stays exact.
    def penalised(x, num_data=None):
        pyro.sample("s", dist.Delta(torch.tensor(1.0)))
        with data_plate(x, num_data):
            pyro.factor("penalty", torch.full_like(x, -10.0))
            z = pyro.sample("z", dist.Normal(0.0, 1.0))
            pyro.sample("x", dist.Normal(z, 1.0), obs=x)

    x = torch.linspace(-3, 3, 7)
    torch.testing.assert_close(importance_log_likelihood(penalised, make_guide(), x, num_samples=3),
                               exact_log_marginal(x), atol=1e-5, rtol=0)
    torch.testing.assert_close(expected_observation(penalised, make_guide(), x), x / 2)


@pytest.mark.parametrize("factor", [0.25, 1.0])
def test_kl_warmup_scales_only_the_local_kl(factor):
    x = torch.linspace(-2, 2, 5)
    guide = make_guide(shift=0.3, scale=0.9)
    elbo = TraceMeanField_ELBO()
    losses = {}
    for f in (0.0, factor):
        torch.manual_seed(0)  # the same z draw, so only the KL weight differs
        with scale_local_latents(f):
            losses[f] = elbo.differentiable_loss(model, guide, x)
    kl = torch.distributions.kl_divergence(dist.Normal(x / 2 + 0.3, 0.9), dist.Normal(0.0, 1.0)).sum()
    torch.testing.assert_close(losses[factor] - losses[0.0], factor * kl, rtol=1e-5, atol=1e-5)


def test_kl_warmup_leaves_global_sites_alone():
    def global_model(x):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with data_plate(x):
            pyro.sample("x", dist.Normal(w, 1.0), obs=x)

    trace = poutine.trace(scale_local_latents(0.0)(global_model)).get_trace(torch.zeros(3))
    assert trace.nodes["w"]["scale"] == 1.0
