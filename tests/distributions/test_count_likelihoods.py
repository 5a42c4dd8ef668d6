"""Count likelihoods with the library size as an offset: densities against scipy, a known dispersion recovered."""

import numpy as np
import pytest
import scipy.stats as st
import torch

import pyro_sparse
from pyro_sparse import Schedule
from pyro_sparse.distributions.likelihoods import observation


@pytest.fixture
def setting():
    generator = torch.Generator().manual_seed(0)
    output = torch.randn(5, 4, generator=generator) - 3  # log proportions
    log_library = torch.log(torch.tensor([100.0, 500.0, 1000.0, 2000.0, 50.0]))
    theta = torch.tensor([0.5, 2.0, 10.0, 100.0])
    zero_logits = torch.tensor([-2.0, 0.0, 1.0, -5.0])
    counts = torch.as_tensor(np.random.default_rng(0).integers(0, 40, size=(5, 4)), dtype=torch.float32)
    return output, log_library, theta, zero_logits, counts


def test_poisson_matches_scipy(setting):
    output, log_library, _, _, counts = setting
    mean = (output + log_library[:, None]).exp()
    ours = observation("poisson", output, log_library=log_library).base_dist.log_prob(counts)
    np.testing.assert_allclose(ours.numpy(), st.poisson.logpmf(counts.numpy(), mean.numpy()), rtol=1e-5, atol=1e-5)


def test_negative_binomial_matches_scipy_with_mean_and_inverse_dispersion(setting):
    output, log_library, theta, _, counts = setting
    mean = (output + log_library[:, None]).exp().numpy()
    distribution = observation("negative_binomial", output, log_library=log_library, inverse_dispersion=theta)
    expected = st.nbinom.logpmf(counts.numpy(), theta.numpy(), theta.numpy() / (theta.numpy() + mean))
    np.testing.assert_allclose(distribution.base_dist.log_prob(counts).numpy(), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(distribution.mean.numpy(), mean, rtol=1e-5)
    np.testing.assert_allclose(distribution.variance.numpy(), mean + mean**2 / theta.numpy(), rtol=1e-4)


def test_zinb_adds_zeros_with_the_gate_probability(setting):
    output, log_library, theta, zero_logits, counts = setting
    mean = (output + log_library[:, None]).exp().numpy()
    p = theta.numpy() / (theta.numpy() + mean)
    gate = torch.sigmoid(zero_logits).numpy()
    nb = st.nbinom.pmf(counts.numpy(), theta.numpy(), p)
    expected = np.log(np.where(counts.numpy() == 0, gate + (1 - gate) * nb, (1 - gate) * nb))
    distribution = observation("zinb", output, log_library=log_library, inverse_dispersion=theta,
                               zero_logits=zero_logits)
    np.testing.assert_allclose(distribution.base_dist.log_prob(counts).numpy(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("likelihood", ["poisson", "negative_binomial", "zinb"])
def test_count_likelihoods_sum_to_one(likelihood, setting):
    output, log_library, theta, zero_logits, _ = setting
    distribution = observation(likelihood, output[:1, :1] + 2, log_library=torch.zeros(1),
                               inverse_dispersion=theta[:1], zero_logits=zero_logits[:1]).base_dist
    support = torch.arange(0, 2000, dtype=torch.float32)[:, None, None]
    assert distribution.log_prob(support).exp().sum().item() == pytest.approx(1.0, abs=1e-4)


def test_a_known_dispersion_is_recovered():
    """Counts with θ = 2 for half of the genes and θ = 50 for the others: the fitted θ order them and land close."""
    rng = np.random.default_rng(1)
    n, g = 1500, 20
    codes = rng.normal(size=(n, 2))
    loadings = rng.normal(scale=0.7, size=(2, g))
    library = rng.integers(800, 1600, size=n)
    proportions = np.exp(codes @ loadings)
    proportions /= proportions.sum(1, keepdims=True)
    mean = library[:, None] * proportions
    theta = np.where(np.arange(g) < g // 2, 2.0, 50.0)
    X = rng.negative_binomial(theta, theta / (theta + mean)).astype(np.float32)
    fitted = pyro_sparse.train("vae", X, likelihood="negative_binomial", latent_dim=2, hidden_dims=(16,),
                               max_epochs=60, batch_size=100, lr=0.02, progress=False, device="cpu",
                               schedule=Schedule(kl_warmup_epochs=5))
    fitted_theta = fitted.model.observation.log_inverse_dispersion.exp().detach().numpy()[0]
    low, high = np.median(fitted_theta[: g // 2]), np.median(fitted_theta[g // 2:])
    assert 1.4 < low < 2.8, fitted_theta
    assert high > 15, fitted_theta


@pytest.mark.parametrize("theta", [1e4, 1e6])
def test_negative_binomial_stays_exact_for_nearly_poisson_genes(theta):
    # Float32 inputs as in training; lgamma(x + θ) - lgamma(θ) cancels in float32 (4e-3 nats at θ = 1e4).
    counts = torch.arange(0.0, 60.0)
    output, log_library = torch.full((60,), -3.0), torch.tensor(np.log(1000.0), dtype=torch.float32)
    theta = torch.full((60,), theta)
    for likelihood in ("negative_binomial", "zinb"):
        distribution = observation(likelihood, output, log_library=log_library, inverse_dispersion=theta,
                                   zero_logits=torch.full((60,), -200.0))
        mean, size = float(np.exp(-3.0) * 1000.0), theta.double().numpy()
        expected = st.nbinom.logpmf(counts.numpy(), size, size / (size + mean))
        ours = distribution.base_dist.log_prob(counts)
        assert ours.dtype == torch.float32
        np.testing.assert_allclose(ours.numpy(), expected, rtol=0, atol=2e-4)


@pytest.mark.parametrize("likelihood", ["poisson", "negative_binomial", "zinb"])
def test_count_densities_stay_exact_at_large_counts(likelihood):
    # Counts of 1e4-1e6 (deep bulk libraries, ADT panels): every term is ~1e6 nats and they nearly cancel,
    # so float32 arithmetic was 0.2 nats off per entry (NB) and 0.8 (Poisson at 1e6).
    counts = torch.tensor([[1e4], [3e4], [1e5], [5e5], [1e6]])  # five cells, one gene
    log_library = counts[:, 0].log() + torch.tensor([0.01, -0.02, 0.0, 0.03, -0.01])
    distribution = observation(likelihood, torch.zeros(5, 1), log_library=log_library,
                               inverse_dispersion=torch.full((1,), 10.0), zero_logits=torch.full((1,), -200.0)).base_dist
    mean = log_library.double().exp().numpy()[:, None]  # the float32 parameters, read exactly
    if likelihood == "poisson":
        expected = st.poisson.logpmf(counts.numpy(), mean)
    else:
        expected = st.nbinom.logpmf(counts.numpy(), 10.0, 10.0 / (10.0 + mean))
    ours = distribution.log_prob(counts)
    assert ours.dtype == torch.float32
    np.testing.assert_allclose(ours.numpy(), expected, rtol=1e-6, atol=1e-3)


@pytest.mark.parametrize("likelihood", ["poisson", "negative_binomial", "zinb"])
def test_count_densities_and_gradients_stay_finite_at_extreme_log_means(likelihood):
    # A gene pushed to a log proportion of -110: e^-110 underflows in float32, the log mean does not.
    output = torch.tensor([-95.0, -110.0, 30.0], requires_grad=True)
    distribution = observation(likelihood, output, log_library=torch.tensor(0.0),
                               inverse_dispersion=torch.full((3,), 10.0), zero_logits=torch.full((3,), -200.0))
    counts = torch.tensor([5.0, 5.0, 5.0])
    log_prob = distribution.base_dist.log_prob(counts)
    log_prob.sum().backward()
    assert torch.isfinite(log_prob).all() and torch.isfinite(output.grad).all()
    if likelihood == "poisson":  # x ℓ - e^ℓ - lgamma(x + 1), and its gradient x - e^ℓ
        expected = 5.0 * output.detach().double() - output.detach().double().exp() - torch.lgamma(torch.tensor(6.0))
        np.testing.assert_allclose(log_prob.detach().numpy(), expected.numpy(), rtol=1e-6)
        np.testing.assert_allclose(output.grad.numpy(), (5.0 - output.detach().double().exp()).numpy(), rtol=1e-6)


def test_poisson_expands_with_its_log_rate():
    distribution = observation("poisson", torch.zeros(3), log_library=torch.tensor(1.0)).base_dist
    expanded = distribution.expand((4, 3))
    assert expanded.log_rate.shape == (4, 3) and expanded.log_prob(torch.ones(4, 3)).shape == (4, 3)
    np.testing.assert_allclose(expanded.log_prob(torch.ones(4, 3)).numpy(), st.poisson.logpmf(1, np.e), rtol=1e-6)


def test_negative_binomial_gradients_match_finite_differences(setting):
    output, log_library, theta, zero_logits, counts = setting
    args = (output.double().requires_grad_(), theta.double().requires_grad_())

    def log_likelihood(output, theta):
        return observation("zinb", output, log_library=log_library.double(), inverse_dispersion=theta,
                           zero_logits=zero_logits.double()).log_prob(counts.double()).sum()

    assert torch.autograd.gradcheck(log_likelihood, args)
