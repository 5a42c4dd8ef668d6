"""The learned correlation of the codes' Gaussian prior (issue: correlated factors) and the full-covariance guide."""

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from torch.distributions import kl_divergence

import pyro_sparse
from pyro_sparse import Schedule
from pyro_sparse.guides import AmortizedNormalGuide
from pyro_sparse.infer.elbo import kl_terms
from pyro_sparse.priors import CorrelatedNormalPrior, NormalPrior

QUICK = dict(max_epochs=2, batch_size=50, hidden_dims=(8,), progress=False, device="cpu")


def correlated_linear_data(n=1500, rho=0.7, seed=0):
    """Two factors with correlation rho, three noisy anchor features each: the correlation is identifiable."""
    rng = np.random.default_rng(seed)
    z = rng.multivariate_normal([0, 0], [[1, rho], [rho, 1]], size=n)
    loadings = np.array([[1.0, 0], [1.5, 0], [-1.2, 0], [0, 1.0], [0, -1.4], [0, 0.8]])
    return (z @ loadings.T + 0.1 * rng.normal(size=(n, 6))).astype(np.float32)


def test_full_covariance_kl_matches_the_multivariate_normal_kl():
    """The registered KL(MVN || Independent Normal) equals torch's MVN || MVN with a diagonal covariance."""
    generator = torch.Generator().manual_seed(0)
    raw = torch.randn(4, 3, 3, generator=generator)
    scale_tril = raw.tril(-1) + torch.diag_embed(raw.diagonal(dim1=-2, dim2=-1).exp())
    q = dist.MultivariateNormal(torch.randn(4, 3, generator=generator), scale_tril=scale_tril)
    loc, scale = torch.randn(3, generator=generator), torch.rand(3, generator=generator) + 0.5
    p = dist.Normal(loc, scale).to_event(1)
    expected = kl_divergence(q, dist.MultivariateNormal(loc, scale_tril=torch.diag(scale)))
    torch.testing.assert_close(kl_divergence(q, p), expected)
    draws = q.sample((200_000,))
    monte_carlo = (q.log_prob(draws) - p.log_prob(draws)).mean(0)
    torch.testing.assert_close(monte_carlo, expected, atol=0.02, rtol=0.01)


def test_full_covariance_posterior_is_a_valid_cholesky_factor():
    guide = AmortizedNormalGuide(7, 4, hidden_dims=(8,), posterior_covariance="full")
    posterior = guide.posterior(torch.randn(5, 7))
    assert posterior.batch_shape == (5,) and posterior.event_shape == (4,)
    tril = posterior.scale_tril
    assert torch.all(tril.triu(1) == 0) and torch.all(tril.diagonal(dim1=-2, dim2=-1) > 0)
    assert not torch.all(tril.tril(-1) == 0)  # the encoder sets the off-diagonal entries
    with pytest.raises(ValueError, match="posterior_covariance"):
        AmortizedNormalGuide(7, 4, posterior_covariance="banded")


@pytest.mark.parametrize("latent_prior", ["normal", "correlated"])
@pytest.mark.parametrize("posterior_covariance", ["diagonal", "full"])
def test_the_codes_kl_is_in_closed_form(latent_prior, posterior_covariance):
    X = correlated_linear_data(60)
    fitted = pyro_sparse.train("vae", X, latent_dim=3, latent_prior=latent_prior,
                               posterior_covariance=posterior_covariance, **QUICK)
    (term,) = kl_terms(fitted.model, fitted.guide, torch.as_tensor(X[:4]))
    assert term.closed_form


def test_learned_correlation_recovers_the_factor_correlation():
    X = correlated_linear_data()
    fitted = pyro_sparse.train("vae", X, latent_dim=2, latent_prior="correlated", hidden_dims=(), max_epochs=60,
                               batch_size=100, lr=0.02, progress=False, device="cpu", noise_nu=3.0,
                               schedule=Schedule(kl_warmup_epochs=5))
    R = fitted.latent_correlation_
    assert R.shape == (2, 2) and np.allclose(np.diag(R), 1.0)
    assert abs(abs(R[0, 1]) - 0.7) < 0.1, R


def test_identity_prior_pays_for_correlated_codes_and_the_learned_one_does_not():
    """The KL of Eq. 59 with Σ = I charges ½ log(1/(1-ρ²)) per point for codes correlated by ρ; N(0, R) does not."""
    rho, K = 0.8, 2
    R = torch.tensor([[1.0, rho], [rho, 1.0]])
    aggregate = dist.MultivariateNormal(torch.zeros(K), covariance_matrix=R)  # the codes' distribution
    identity = dist.Normal(torch.zeros(K), 1.0).to_event(1)
    correlated = dist.MultivariateNormal(torch.zeros(K), covariance_matrix=R)
    assert kl_divergence(aggregate, identity).item() == pytest.approx(0.5 * np.log(1 / (1 - rho**2)), rel=1e-4)
    assert kl_divergence(aggregate, correlated).item() == pytest.approx(0.0, abs=1e-6)


def test_learned_correlation_is_saved_loaded_and_exported(tmp_path):
    X = correlated_linear_data(200)
    fitted = pyro_sparse.train("ssl_dgm", X, latent_dim=3, latent_prior="correlated", lkj_concentration=1.5,
                               **QUICK)
    path = tmp_path / "model.pt"
    fitted.save(path)
    loaded = pyro_sparse.load(path)
    np.testing.assert_array_equal(loaded.latent_correlation_, fitted.latent_correlation_)
    assert loaded.model.latent_prior.lkj_concentration == 1.5
    anndata = pytest.importorskip("anndata")
    adata = anndata.AnnData(X)
    fitted.write_to(adata)
    np.testing.assert_array_equal(adata.uns["latent_correlation_ssl_dgm"], fitted.latent_correlation_)


def test_fixed_and_identity_priors_report_their_correlation():
    X = correlated_linear_data(100)
    assert np.allclose(pyro_sparse.train("vae", X, latent_dim=2, **QUICK).latent_correlation_, np.eye(2))
    fixed = pyro_sparse.train("vae", X, latent_dim=2, prior_covariance=[[4.0, 1.0], [1.0, 1.0]], **QUICK)
    np.testing.assert_allclose(fixed.latent_correlation_, [[1.0, 0.5], [0.5, 1.0]], rtol=1e-6)
    with pytest.raises(AttributeError, match="no Gaussian prior"):
        pyro_sparse.train("vsc", X, latent_dim=2, **QUICK).latent_correlation_


def test_tensor_options_are_recorded_wherever_they_live():
    # A tensor option (here one that requires grad; on a GPU, one on CUDA) is saved in the JSON configuration
    # as plain numbers: numpy cannot read either kind directly.
    X = correlated_linear_data(100)
    covariance = torch.tensor([[4.0, 1.0], [1.0, 1.0]], requires_grad=True)
    fitted = pyro_sparse.train("vae", X, latent_dim=2, prior_covariance=covariance, **QUICK)
    assert fitted.config["hyperparameters"]["prior_covariance"] == [[4.0, 1.0], [1.0, 1.0]]


def test_correlation_options_are_checked():
    with pytest.raises(ValueError, match="lkj_concentration must be a positive finite number"):
        CorrelatedNormalPrior(3, lkj_concentration=0.0)
    with pytest.raises(ValueError, match="symmetric positive definite"):
        NormalPrior(2, prior_covariance=[[1.0, 2.0], [2.0, 1.0]])
    with pytest.raises(ValueError, match="exclude each other"):
        NormalPrior(2, prior_covariance=np.eye(2), learn_correlation=True)
    with pytest.warns(UserWarning, match="latent_dim=1"):
        prior = CorrelatedNormalPrior(1)
    assert not prior.learn_correlation
    X = correlated_linear_data(60)
    with pytest.raises(TypeError, match="lkj_concentration.*latent_prior='correlated'"):
        pyro_sparse.train("vsc", X, latent_dim=2, lkj_concentration=2.0, **QUICK)


def test_a_learned_correlation_starts_where_asked_and_checks_the_start():
    R = np.array([[1.0, 0.6], [0.6, 1.0]])
    start, _ = CorrelatedNormalPrior(2, initial_correlation=R).point_estimate_sites()["latent_correlation"]
    np.testing.assert_allclose((start @ start.T).numpy(), R, atol=1e-6)
    # Through train, as a warm start from a pilot fit: four Adam steps move R by a few hundredths from its start.
    fitted = pyro_sparse.train("ssl_dgm", correlated_linear_data(100), latent_dim=2, latent_prior="correlated",
                               initial_correlation=R, **QUICK)
    assert abs(fitted.latent_correlation_[0, 1] - 0.6) < 0.1
    np.testing.assert_allclose(fitted.config["hyperparameters"]["initial_correlation"], R)
    with pytest.raises(ValueError, match="initial_correlation is the start of a learned correlation"):
        NormalPrior(2, initial_correlation=R)
    with pytest.raises(ValueError, match="diagonal must be 1"):
        CorrelatedNormalPrior(2, initial_correlation=2 * R)
    with pytest.raises(ValueError, match=r"initial_correlation must be \(3, 3\)"):
        CorrelatedNormalPrior(3, initial_correlation=R)
    with pytest.raises(ValueError, match="initial_correlation must be a symmetric positive definite"):
        CorrelatedNormalPrior(2, initial_correlation=[[1.0, 1.5], [1.5, 1.0]])


def test_lkj_prior_enters_the_objective_once_per_step():
    prior = CorrelatedNormalPrior(3, lkj_concentration=4.0)
    x = torch.zeros(10, 5)
    trace = pyro.poutine.trace(prior.sample_globals).get_trace(x)
    site = trace.nodes["latent_correlation"]
    assert isinstance(site["fn"], dist.LKJCholesky) and not site["cond_indep_stack"]


def test_arviz_export_holds_the_correlation_matrix_and_the_active_factors():
    X = correlated_linear_data(100)
    fitted = pyro_sparse.train("ssl_dgm", X, latent_dim=3, latent_prior="correlated", **QUICK)
    with torch.no_grad():
        fitted.guide.unconstrained["W"][:, 2] = 0.0
    posterior = fitted.to_arviz(X[:8], num_samples=2)["posterior"]
    np.testing.assert_allclose(posterior["latent_correlation"].values[0, 0], fitted.latent_correlation_, rtol=1e-6)
    assert posterior["latent_correlation"]["latent_other"].values.tolist() == [0, 1, 2]
    assert posterior.attrs["active_factors"] == "0 1"
