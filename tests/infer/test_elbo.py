"""MaxParticleELBO: per-data-point max / mean over J particles (Fallah & Rozell 2022, Eq. 6-9)."""

import logging
import threading

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import SVI, TraceMeanField_ELBO
from torch import nn

from pyro_sparse import registry
from pyro_sparse.data import Dataset
from pyro_sparse.infer.config import Schedule, TrainingSettings
from pyro_sparse.infer.elbo import MaxParticleELBO
from pyro_sparse.infer.handlers import scale_local_latents
from pyro_sparse.infer.loop import fit
from pyro_sparse.plates import data_plate

NUM_DATA = 10  # the plate's size; batches are smaller, so sites carry the scale N / B
NOISE = 0.5


class FixedNoiseNormal(dist.Normal):
    """Normal(loc, scale) whose reparameterised draw is loc + scale * eps for a given eps."""

    def __init__(self, loc, scale, eps):
        super().__init__(loc, scale)
        self.eps = eps

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(FixedNoiseNormal, _instance)
        new = super().expand(batch_shape, _instance=new)
        new.eps = self.eps
        return new

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(torch.Size(sample_shape))
        return self.loc.expand(shape) + self.scale.expand(shape) * self.eps.expand(shape)


def model(x, num_data=None):
    w = pyro.sample("w", dist.Normal(0.0, 2.0))  # global, point-estimated by the guide
    with data_plate(x, num_data):
        z = pyro.sample("z", dist.Normal(0.0, 1.0))
        pyro.sample("x", dist.Normal(w * z, NOISE), obs=x)


class Guide(nn.Module):
    """Delta guide on w; q(z_i | x_i) = N(a x_i + b, softplus(c)²), with optional fixed noise."""

    def __init__(self, eps=None):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(1.3))
        self.a = nn.Parameter(torch.tensor(0.6))
        self.b = nn.Parameter(torch.tensor(-0.1))
        self.c = nn.Parameter(torch.tensor(-0.5))
        self.eps = eps

    def q_params(self, x):
        return self.a * x + self.b, nn.functional.softplus(self.c).expand(x.shape)

    def forward(self, x, num_data=None):
        pyro.sample("w", dist.Delta(self.w))
        with data_plate(x, num_data):
            loc, scale = self.q_params(x)
            q = dist.Normal(loc, scale) if self.eps is None else FixedNoiseNormal(loc, scale, self.eps)
            pyro.sample("z", q)


def grads(loss, module):
    return torch.autograd.grad(loss, list(module.parameters()), retain_graph=True)


def assert_same(loss, expected, guide):
    torch.testing.assert_close(loss, expected)
    for g, h in zip(grads(loss, guide), grads(expected, guide)):
        torch.testing.assert_close(g, h)


@pytest.fixture
def x():
    return torch.tensor([1.5, -0.8, 0.3, 2.2])


def manual_terms(guide, x, eps, num_data, kl_factor=1.0):
    """e_ij of Eq. 6 (J, B) and the global term log p(w), computed by hand from eps (J, B)."""
    loc, scale = guide.q_params(x)
    z = loc + scale * eps
    log_lik = dist.Normal(guide.w * z, NOISE).log_prob(x)
    kl = torch.distributions.kl_divergence(dist.Normal(loc, scale), dist.Normal(0.0, 1.0))
    e = num_data / x.shape[0] * (log_lik - kl_factor * kl)
    return e, dist.Normal(0.0, 2.0).log_prob(guide.w)


@pytest.mark.parametrize("reduction", ["max", "mean"])
def test_one_particle_is_trace_mean_field_elbo(x, reduction):
    guide = Guide()
    for num_data in (None, NUM_DATA):
        pyro.set_rng_seed(3)
        loss = MaxParticleELBO(num_particles=1, particle_reduction=reduction).differentiable_loss(
            model, guide, x, num_data
        )
        pyro.set_rng_seed(3)
        expected = TraceMeanField_ELBO().differentiable_loss(model, guide, x, num_data)
        assert_same(loss, expected, guide)


def test_vectorised_mean_is_pyros_vectorised_elbo(x):
    """Same seed, same particle plate: identical draws, so identical values and gradients."""
    guide = Guide()
    pyro.set_rng_seed(5)
    expected = TraceMeanField_ELBO(num_particles=5, vectorize_particles=True, max_plate_nesting=1)
    expected = expected.differentiable_loss(model, guide, x, NUM_DATA)
    for max_plate_nesting in (1, float("inf")):  # given, or guessed (without using up random draws)
        pyro.set_rng_seed(5)
        elbo = MaxParticleELBO(5, "mean", max_plate_nesting=max_plate_nesting)
        assert_same(elbo.differentiable_loss(model, guide, x, NUM_DATA), expected, guide)
        assert elbo.max_plate_nesting == 2  # the particle plate sits at dim -2, left of the data plate


def test_the_guess_logs_nothing_and_other_pyro_lines_stay(x, caplog):
    caplog.set_level(logging.INFO)
    MaxParticleELBO(3, "mean").differentiable_loss(model, Guide(), x, NUM_DATA)
    assert not [r for r in caplog.records if "max_plate_nesting" in r.getMessage()]
    logging.getLogger("pyro.infer.elbo").info("Guessed max_plate_nesting = 9")  # Pyro's own ELBOs still log it
    assert caplog.records[-1].getMessage() == "Guessed max_plate_nesting = 9"


def test_the_guess_is_quiet_only_in_its_own_thread(caplog):
    # Another thread's line still shows while this one guesses (concurrent fits do not silence each other).
    from pyro_sparse.infer import elbo as module

    caplog.set_level(logging.INFO)
    logger = logging.getLogger("pyro.infer.elbo")
    module._GUESSING.active = True
    try:
        logger.info("Guessed max_plate_nesting = 1")
        other = threading.Thread(target=logger.info, args=("Guessed max_plate_nesting = 2",))
        other.start()
        other.join()
    finally:
        module._GUESSING.active = False
    assert [r.getMessage() for r in caplog.records if "max_plate" in r.getMessage()] == ["Guessed max_plate_nesting = 2"]


def test_mean_is_the_average_of_single_particle_losses(x):
    eps = torch.tensor([[0.3, -1.2, 0.8, 0.0], [1.1, 0.4, -0.7, 2.0], [-0.5, 0.9, 1.6, -1.3]])
    guide = Guide(eps)
    loss = MaxParticleELBO(3, "mean", max_plate_nesting=1).differentiable_loss(model, guide, x, NUM_DATA)
    singles = []
    for row in eps:
        guide.eps = row
        singles.append(TraceMeanField_ELBO().differentiable_loss(model, guide, x, NUM_DATA))
    assert_same(loss, torch.stack(singles).mean(), guide)


def guide_at_the_mode(eps, offset=0.0):
    """A guide whose loc is x / w (+ offset): the likelihood then ranks particles by |eps|."""
    guide = Guide(eps)
    with torch.no_grad():
        guide.a.fill_(1 / guide.w.item())
        guide.b.fill_(offset)
    return guide


# Particle j is best for point i where eps_ij is nearest 0 (guide loc at the likelihood's mode):
# the argmax over particles is (0, 1, 2, 0) across the four points.
EPS_MAX = torch.tensor([[0.0, 2.0, -2.0, 0.5], [2.0, 0.0, 1.5, -2.0], [-2.0, 1.5, 0.0, 2.0]])


@pytest.mark.parametrize("kl_factor", [1.0, 0.3])
def test_max_is_taken_per_data_point(x, kl_factor):
    guide = guide_at_the_mode(EPS_MAX)
    with scale_local_latents(kl_factor):  # the training loop's KL warm-up
        loss = MaxParticleELBO(3, "max", max_plate_nesting=1).differentiable_loss(model, guide, x, NUM_DATA)
    e, log_prior = manual_terms(guide, x, EPS_MAX, NUM_DATA, kl_factor)
    assert e.argmax(0).tolist() == [0, 1, 2, 0]  # the case is non-trivial
    expected = -(e.max(0).values.sum() + log_prior)
    assert_same(loss, expected, guide)
    # not the max over particles of whole-batch sums, nor the mean
    assert loss < -(e.sum(1).max() + log_prior) - 1.0
    assert loss < -(e.mean(0).sum() + log_prior) - 1.0
    # the per-point terms themselves
    with scale_local_latents(kl_factor):
        terms = MaxParticleELBO(3, max_plate_nesting=1).particle_terms(model, guide, x, NUM_DATA)
    torch.testing.assert_close(terms.local, e)
    torch.testing.assert_close(terms.global_, log_prior.expand(3))


def test_gradient_flows_through_the_best_particle_only(x):
    """Only the argmax particle of a point reaches the likelihood's gradient."""
    eps = EPS_MAX.clone().requires_grad_()
    guide = guide_at_the_mode(eps, offset=0.05)  # off the mode, so the best particle's gradient is not 0
    MaxParticleELBO(3, "max", max_plate_nesting=1).differentiable_loss(model, guide, x, NUM_DATA).backward()
    best = torch.zeros_like(eps, dtype=torch.bool)
    best[[0, 1, 2, 0], range(4)] = True
    assert torch.all(eps.grad[~best] == 0)
    assert torch.all(eps.grad[best] != 0)


class GlobalLatentGuide(Guide):
    """Adds a global latent u with particle-dependent draws (no analytic KL to its Cauchy prior)."""

    def __init__(self, eps, eps_u):
        super().__init__(eps)
        self.u_loc = nn.Parameter(torch.tensor(0.2))
        self.eps_u = eps_u

    def forward(self, x, num_data=None):
        pyro.sample("u", FixedNoiseNormal(self.u_loc, torch.tensor(0.5), self.eps_u))
        super().forward(x, num_data)


def model_with_global_terms(x, num_data=None):
    u = pyro.sample("u", dist.Cauchy(0.0, 1.0))
    pyro.factor("global_penalty", -3.0 * u**2)  # a factor outside the data plate
    model(x, num_data)


def test_global_terms_are_averaged_not_maxed(x):
    eps_u = torch.tensor([[-3.0], [0.0], [2.0]])  # (J, 1): the particle plate is at dim -2
    guide = GlobalLatentGuide(EPS_MAX, eps_u)
    with torch.no_grad():
        guide.a.fill_(1 / guide.w.item())
        guide.b.zero_()
    elbo = MaxParticleELBO(3, "max", max_plate_nesting=1)
    loss = elbo.differentiable_loss(model_with_global_terms, guide, x, NUM_DATA)
    u = guide.u_loc + 0.5 * eps_u.squeeze(-1)
    g = (
        dist.Cauchy(0.0, 1.0).log_prob(u)  # no KL(Normal || Cauchy): log p(u) - log q(u)
        - dist.Normal(guide.u_loc, 0.5).log_prob(u)
        - 3.0 * u**2
    )
    e, log_prior_w = manual_terms(guide, x, EPS_MAX, NUM_DATA)
    assert g.max() - g.mean() > 1.0  # maxing g would make a visible difference
    expected = -(e.max(0).values.sum() + g.mean() + log_prior_w)
    assert_same(loss, expected, guide)
    terms = elbo.particle_terms(model_with_global_terms, guide, x, NUM_DATA)
    torch.testing.assert_close(terms.global_, g + log_prior_w)


def test_max_bounds_mean_and_loss_api(x):
    guide = Guide()
    pyro.set_rng_seed(0)
    loss_max = MaxParticleELBO(8, "max").differentiable_loss(model, guide, x, NUM_DATA)
    pyro.set_rng_seed(0)
    loss_mean = MaxParticleELBO(8, "mean").differentiable_loss(model, guide, x, NUM_DATA)
    assert loss_max.dim() == 0 and loss_max < loss_mean
    pyro.set_rng_seed(0)
    value = MaxParticleELBO(8, "max").loss(model, guide, x, NUM_DATA)
    assert isinstance(value, float) and value == pytest.approx(loss_max.item())


def test_sequential_particles_match_pyros_sequential_elbo(x):
    guide = Guide()
    pyro.set_rng_seed(2)
    expected = TraceMeanField_ELBO(num_particles=4).differentiable_loss(model, guide, x, NUM_DATA)
    pyro.set_rng_seed(2)
    elbo = MaxParticleELBO(4, "mean", vectorize_particles=False)
    assert_same(elbo.differentiable_loss(model, guide, x, NUM_DATA), expected, guide)
    terms = MaxParticleELBO(4, vectorize_particles=False).particle_terms(model, guide, x, NUM_DATA)
    assert terms.local.shape == (4, 4) and terms.global_.shape == (4,)


def test_works_with_pyro_svi(x):
    guide = Guide()

    def pyro_guide(x, num_data=None):
        pyro.module("guide", guide)
        guide(x, num_data)

    pyro.clear_param_store()
    svi = SVI(model, pyro_guide, pyro.optim.Adam({"lr": 0.05}), MaxParticleELBO(4))
    before = guide.a.item()
    losses = [svi.step(x, NUM_DATA) for _ in range(3)]
    assert all(isinstance(v, float) and torch.isfinite(torch.tensor(v)) for v in losses)
    assert guide.a.item() != before
    pyro.clear_param_store()


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="particle_reduction"):
        MaxParticleELBO(2, "median")
    with pytest.raises(ValueError, match="num_particles"):
        MaxParticleELBO(0)


@pytest.mark.parametrize("reduction", ["max", "mean"])
def test_fits_a_tiny_vsc_in_the_training_loop(reduction):
    generator = torch.Generator().manual_seed(0)
    X = torch.randn(48, 6, generator=generator)
    data = Dataset.from_data(X, "gaussian")
    entry = registry.MODELS["vsc"]
    hyper = entry.resolve(data.summary, "gaussian", {"hidden_dims": (8,), "alpha": 0.2})
    pyro.set_rng_seed(0)
    model_module, guide, _ = entry.build(data.summary, 3, "gaussian", hyper)
    elbo = MaxParticleELBO(num_particles=4, particle_reduction=reduction)
    settings = TrainingSettings(max_epochs=2, batch_size=16, progress=False, schedule=Schedule(kl_warmup_epochs=1))
    history = fit(model_module, guide, elbo, data, settings=settings, generator=generator)
    assert len(history["train_loss"]) == 2
    assert all(torch.isfinite(torch.tensor(history["train_loss"])))
    # one step's per-point terms: minibatch of 16 points, 4 particles, analytic spike-and-slab KL
    x = X[:16]
    terms = elbo.particle_terms(model_module, guide, x, X.shape[0])
    assert terms.local.shape == (4, 16) and torch.isfinite(terms.local).all()


@pytest.mark.parametrize("model_beta, guide_kl_weight", [(4.0, 1.0), (1.0, 0.5)])
def test_a_kl_weight_on_one_side_only_is_refused_before_training(model_beta, guide_kl_weight):
    # TraceMeanField_ELBO weighs a closed-form KL by the guide's scale only: the model's β would be ignored.
    from pyro_sparse.guides import AmortizedNormalGuide
    from pyro_sparse.models import VAE

    X = torch.randn(32, 5, generator=torch.Generator().manual_seed(0))
    data = Dataset.from_data(X, "gaussian")
    model_module = VAE(5, latent_dim=2, hidden_dims=(8,), beta=model_beta)
    guide = AmortizedNormalGuide(5, 2, hidden_dims=(8,), kl_weight=guide_kl_weight,
                                 point_estimates=model_module.point_estimate_sites(torch.ones(5)))
    settings = TrainingSettings(max_epochs=1, batch_size=16, progress=False)
    before = [p.detach().clone() for p in guide.parameters()]
    with pytest.raises(ValueError, match=f"site 'z' is scaled by {model_beta:g} in the model and "
                                         f"{guide_kl_weight:g} in the guide"):
        fit(model_module, guide, TraceMeanField_ELBO(), data, settings=settings)
    assert all(torch.equal(a, b) for a, b in zip(before, guide.parameters()))  # nothing was trained
    guide.kl_weight = model_beta
    assert len(fit(model_module, guide, TraceMeanField_ELBO(), data, settings=settings)["train_loss"]) == 1
