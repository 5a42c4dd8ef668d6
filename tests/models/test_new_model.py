"""
A model a user adds: one model class and one registration line (the guide
follows from its latent prior), then every part of the library works with it.
"""

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
from torch import nn

import pyro_sparse
from pyro_sparse import registry
from pyro_sparse.data.synthetic import synthetic_sparse_dgm
from pyro_sparse.nn import ObservationModel
from pyro_sparse.plates import data_plate
from pyro_sparse.priors import NormalPrior
from pyro_sparse.svi import MODEL_INTERFACE, SVIModel


class LinearFactors(nn.Module):
    """Probabilistic PCA: z ~ N(0, I), x ~ N(A z + b, I)."""

    def __init__(self, num_features, latent_dim=3, likelihood="gaussian", latent_prior=None, hidden_dims=(16,),
                 covariate_dim=0, num_batches=1):
        super().__init__()
        self.num_features, self.latent_dim, self.hidden_dims = num_features, latent_dim, tuple(hidden_dims)
        self.observation = ObservationModel(likelihood, num_features)
        self.latent_prior = NormalPrior(latent_dim) if latent_prior is None else latent_prior
        self.site_priors = nn.ModuleDict()
        self.loading = nn.Linear(latent_dim, num_features)

    def guide_options(self):
        return {"kl_weight": 1.0}

    def point_estimate_sites(self, feature_variances):
        return {}

    def forward(self, x, num_data=None, covariates=None, library=None):
        self.latent_prior.sample_globals(x)
        with data_plate(x, num_data):
            z = self.latent_prior.sample(x, 1.0)
            pyro.sample("x", dist.Normal(self.loading(z), 1.0).to_event(1), obs=x)


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(registry.MODELS, "linear_factors", SVIModel(LinearFactors, "probabilistic PCA"))


def test_a_registered_model_trains_saves_loads_and_evaluates(registered, tmp_path):
    X = synthetic_sparse_dgm(n=300, rho=0.3, seed=0).X
    fitted = pyro_sparse.train("linear_factors", X, latent_dim=3, max_epochs=30, progress=False, seed=0)
    losses = fitted.history_["train_loss"]
    assert losses[-1] < losses[0]
    fitted.save(tmp_path / "model.pt")
    loaded = pyro_sparse.load(tmp_path / "model.pt")
    np.testing.assert_allclose(loaded.transform(X), fitted.transform(X))
    assert fitted.transform(X).shape == (300, 3) and fitted.reconstruct(X).shape == X.shape
    assert np.isfinite(fitted.heldout_log_likelihood(X[:20], num_samples=8)).all()
    # Any registered latent prior, with the guide it pairs with.
    sparse = pyro_sparse.train("linear_factors", X, latent_dim=3, latent_prior="spike_slab", max_epochs=2,
                               progress=False)
    assert (sparse.sample_posterior(X[:20], 4) == 0).any()


def test_a_model_missing_part_of_the_interface_is_named(monkeypatch):
    class Bare(nn.Module):
        def __init__(self, num_features, latent_dim=3, likelihood="gaussian", latent_prior=None, **layout):
            super().__init__()
            self.latent_dim, self.latent_prior = latent_dim, latent_prior

    monkeypatch.setitem(registry.MODELS, "bare", SVIModel(Bare, "a model without its interface"))
    with pytest.raises(TypeError, match="the model Bare lacks hidden_dims .*site_priors .*observation "):
        pyro_sparse.train("bare", np.random.default_rng(0).normal(size=(20, 4)), batch_size=20, max_epochs=1,
                          progress=False)
    assert set(MODEL_INTERFACE) >= {"site_priors", "point_estimate_sites", "guide_options", "observation"}
