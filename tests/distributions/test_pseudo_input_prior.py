"""The learned pseudo-input prior of VSC (UAI supplement A.3)."""

import numpy as np
import pytest
import torch
from torch.distributions import kl_divergence

import pyro_sparse
from pyro_sparse.data.images import load_digits_images
from pyro_sparse.distributions import SelectedSpikeAndSlab, SpikeAndSlab


def weighted(weights, components):
    """The prior as the pseudo-input prior builds it: kl_divergence is supplement A.3's weighted sum."""
    return SelectedSpikeAndSlab(weights, components, kl_objective="selection_weighted")


def posterior(batch=6, latent=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return SpikeAndSlab(
        torch.rand(batch, latent, generator=g) * 0.98 + 0.01,
        torch.randn(batch, latent, generator=g),
        torch.rand(batch, latent, generator=g) + 0.2,
    ).to_event(1)


def test_one_pseudo_input_at_the_fixed_prior_gives_the_fixed_prior_kl():
    alpha, q = 0.2, posterior()
    components = SpikeAndSlab(torch.full((1, 4), alpha), torch.zeros(1, 4), torch.ones(1, 4))
    selected = weighted(torch.rand(6, 1) + 0.1, components)
    fixed = SpikeAndSlab(torch.full((4,), alpha), 0.0, 1.0).to_event(1)
    torch.testing.assert_close(kl_divergence(q, selected), kl_divergence(q, fixed))
    z = q.sample()
    torch.testing.assert_close(selected.log_prob(z), fixed.log_prob(z))


def test_kl_is_the_selection_weighted_sum_of_component_kls():
    q = posterior(batch=3)
    g = torch.Generator().manual_seed(1)
    components = SpikeAndSlab(torch.rand(5, 4, generator=g) * 0.9 + 0.05, torch.randn(5, 4, generator=g), torch.ones(5, 4))
    weights = torch.rand(3, 5, generator=g)
    selected = weighted(weights, components)
    expected = torch.zeros(3)
    for i in range(3):
        for p in range(5):
            single = SpikeAndSlab(components.gate[p], components.loc[p], components.scale[p]).to_event(1)
            qi = SpikeAndSlab(q.base_dist.gate[i], q.base_dist.loc[i], q.base_dist.scale[i]).to_event(1)
            expected[i] += weights[i, p] / weights[i].sum() * kl_divergence(qi, single)
    torch.testing.assert_close(kl_divergence(q, selected), expected)


def test_only_the_selection_weighted_objective_is_registered_and_it_bounds_the_true_kl():
    # The KL to the mixture has no closed form: by default none (the ELBOs then estimate it by Monte Carlo);
    # the A.3 term, asked for, is an upper bound on it (convexity), here 2-3 times it.
    q = posterior(batch=3)
    g = torch.Generator().manual_seed(2)
    components = SpikeAndSlab(torch.rand(4, 4, generator=g) * 0.9 + 0.05, 2 * torch.randn(4, 4, generator=g),
                              torch.rand(4, 4, generator=g) + 0.5)
    weights = torch.rand(3, 4, generator=g)
    with pytest.raises(NotImplementedError):
        kl_divergence(q, SelectedSpikeAndSlab(weights, components))
    torch.manual_seed(0)
    z = q.sample((100000,))
    exact = (q.log_prob(z) - SelectedSpikeAndSlab(weights, components).log_prob(z)).mean(0)
    bound = kl_divergence(q, weighted(weights, components))
    assert bool((bound > exact + 0.05).all()), (bound, exact)
    with pytest.raises(ValueError, match="kl_objective"):
        SelectedSpikeAndSlab(weights, components, kl_objective="base")
    assert SelectedSpikeAndSlab(weights, components, kl_objective="selection_weighted").expand((2, 3)).kl_objective \
        == "selection_weighted"


def test_log_prob_is_a_normalised_mixture_density():
    # The samples' law is checked in test_distribution_contract.py; here the
    # density integrates to 1 on a grid (the atom is negligible at γ = 1 - 1e-6).
    components = SpikeAndSlab(torch.ones(2, 1) - 1e-6, torch.tensor([[-5.0], [5.0]]), torch.full((2, 1), 0.1))
    selected = SelectedSpikeAndSlab(torch.tensor([[1.0, 3.0]]), components)
    grid = torch.linspace(-8, 8, 20001).reshape(-1, 1, 1)
    mass = selected.log_prob(grid).exp().squeeze(-1).sum() * (grid[1] - grid[0]).item()
    assert mass.item() == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize("scale", [1e-13, 1e-30])
def test_tiny_selection_weights_still_give_a_proper_mixture(scale):
    # Only the weights' ratios count: a common tiny factor must not shrink the mixture (nor its KL).
    components = SpikeAndSlab(torch.full((3, 2), 0.5), torch.randn(3, 2), torch.ones(3, 2))
    weights = torch.tensor([[1.0, 2.0, 5.0]])
    tiny, plain = weighted(weights * scale, components), weighted(weights, components)
    z = torch.randn(4, 1, 2)
    torch.testing.assert_close(tiny.log_prob(z), plain.log_prob(z))
    torch.testing.assert_close(kl_divergence(posterior(batch=1, latent=2), tiny),
                               kl_divergence(posterior(batch=1, latent=2), plain))


def test_a_zero_selection_weight_drops_its_component():
    # Weights are non-negative, so 0 is allowed: its component leaves the density and the KL, and the
    # gradients stay finite (log 0 and 0 · ∞ made every weight's gradient, and the KL, NaN).
    components = SpikeAndSlab(torch.tensor([[1.0, 1.0], [0.5, 0.5], [0.5, 0.5]]), torch.randn(3, 2),
                              torch.ones(3, 2))
    weights = torch.tensor([0.0, 1.0, 0.5], requires_grad=True)
    x = torch.tensor([0.3, 0.0])  # component 0 has no atom: density 0 at x, and an infinite KL from q below
    SelectedSpikeAndSlab(weights, components).log_prob(x).backward()
    densities = components.log_prob(x).sum(-1).exp()
    expected = densities / (weights.detach() * densities).sum() - 1 / weights.detach().sum()
    torch.testing.assert_close(weights.grad, expected)
    q = SpikeAndSlab(torch.tensor([0.3, 0.6]), torch.tensor([0.1, -0.2]), torch.tensor([0.8, 1.1])).to_event(1)
    rest = weighted(weights.detach()[1:], SpikeAndSlab(components.gate[1:], components.loc[1:],
                                                                   components.scale[1:]))
    torch.testing.assert_close(kl_divergence(q, weighted(weights.detach(), components)),
                               kl_divergence(q, rest))
    # A weightless component far likelier than the others must not underflow them (the shift skips it).
    far = SpikeAndSlab(torch.full((2, 1), 0.5), torch.tensor([[0.0], [40.0]]), torch.full((2, 1), 0.1))
    value = torch.tensor([40.0])  # 4e4 nats likelier under the weightless component
    expected = SpikeAndSlab(far.gate[0], far.loc[0], far.scale[0]).log_prob(value)
    torch.testing.assert_close(SelectedSpikeAndSlab(torch.tensor([1.0, 0.0]), far).log_prob(value), expected.sum())


def test_pseudo_input_prior_is_uniform_when_no_selection_score_is_positive():
    # All ReLU scores 0 give every u* = sigmoid(-a b): at a = 70 that is ~6e-16 each, and the mixture must
    # still be the uniform one, not a density that integrates to less than 1.
    from pyro_sparse.priors.latent import PseudoInputPrior

    prior = PseudoInputPrior(6, 2, num_pseudo_inputs=20, selection_sharpness=70.0)
    fitted = pyro_sparse.train("vsc", np.random.default_rng(0).normal(size=(40, 6)).astype("float32"),
                               latent_dim=2, latent_prior="pseudo_inputs", max_epochs=1, batch_size=40, progress=False,
                               device="cpu")  # where the prior above lives
    prior.attach_guide(fitted.guide)
    with torch.no_grad():
        prior.selection[0].weight.zero_()
        prior.selection[0].bias.fill_(-1.0)
    mixture = prior.distribution(torch.randn(3, 6)).mixture_weights
    torch.testing.assert_close(mixture, torch.full((3, 20), 1 / 20))


def test_shape_errors_are_named():
    with pytest.raises(ValueError, match="batch shape"):
        SelectedSpikeAndSlab(torch.ones(3, 5), SpikeAndSlab(torch.full((4, 2), 0.5), 0.0, 1.0))


def test_vsc_trains_with_pseudo_inputs_and_the_prior_sparsity_follows_alpha():
    X = load_digits_images().X[:600]
    mean_gate = {}
    for alpha in (0.02, 0.8):
        fitted = pyro_sparse.train(
            "vsc", X, latent_prior="pseudo_inputs", num_pseudo_inputs=5, alpha=alpha, latent_dim=8,
            max_epochs=10, lr=1e-3, hidden_dims=(32,), progress=False,
        )
        assert fitted.model.latent_prior.pseudo_inputs.shape == (5, 64)
        assert np.isfinite(fitted.history_["train_loss"]).all()
        assert np.isfinite(fitted.heldout_log_likelihood(X[:20], 5)).all()
        with torch.no_grad():
            prior = fitted.model.latent_prior.distribution(torch.as_tensor(X[:10], device=fitted.device))
        assert isinstance(prior, SelectedSpikeAndSlab) and prior.batch_shape == (10,)
        mean_gate[alpha] = prior.components.gate.mean().item()
    # The sparsity term pulls the pseudo-inputs' mean spike probability towards α.
    assert mean_gate[0.02] < mean_gate[0.8] - 0.1, mean_gate


def test_pseudo_inputs_encode_as_counts_when_the_guide_reads_counts():
    # The guide reads log(1 + x): pseudo-inputs mapped through the input affine map alone went below -1 (NaN codes).
    X = np.random.default_rng(0).poisson(3, size=(200, 12)).astype(np.float32)
    fitted = pyro_sparse.train("vsc", X, likelihood="negative_binomial", latent_prior="pseudo_inputs",
                               num_pseudo_inputs=4, latent_dim=3, max_epochs=2, hidden_dims=(8,), progress=False)
    inputs = fitted.guide.inputs_from_unconstrained(torch.full((2, 12), -50.0, device=fitted.device))
    assert (inputs >= 0).all()
    assert np.isfinite(fitted.history_["train_loss"]).all()
    # Their encoder is not batch-normalised (the prior would normalise them as a batch).
    assert fitted.config["hyperparameters"]["batch_norm"] is False
    with pytest.raises(ValueError, match="batch_norm=False"):
        pyro_sparse.train("vsc", X, likelihood="negative_binomial", latent_prior="pseudo_inputs", batch_norm=True,
                          latent_dim=3, max_epochs=1, progress=False)
