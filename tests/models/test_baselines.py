"""The sparse VAE paper's baselines: oi-VAE (group lasso), the horseshoe prior on
W, the SparseVAE-Slab ablation and NMF, each through ``pyro_sparse.train``."""

import math

import numpy as np
import pytest
import scipy.optimize
import scipy.stats
import torch
from sklearn.metrics import roc_auc_score

import pyro_sparse
from pyro_sparse import evaluation
from pyro_sparse.baselines.nmf import FittedNMF
from pyro_sparse.data import DataError
from pyro_sparse.data.synthetic import synthetic_sparse_dgm
from pyro_sparse.distributions import GroupLasso
from pyro_sparse.io.serialization import ModelFileError
from pyro_sparse.models.oi_vae import GroupGenerators
from pyro_sparse.priors import GroupLassoPrior, HorseshoePrior, group_soft_threshold


def norms_of_columns(W):
    """‖W^{(g)}_{·,k}‖ for an oi-VAE's (groups, K, p) weights: a (groups, K) matrix."""
    return np.linalg.norm(W, axis=-1)


def support_auc(W, data, codes):
    """AUC of |W| as a score for the true support, columns matched to the true factors (0.5 is chance)."""
    matching = evaluation.match_factors(codes, data.z)
    truth = np.zeros(W.shape, dtype=bool)
    truth[:, matching] = data.support
    return roc_auc_score(truth.ravel(), np.abs(W).ravel())


# ------------------------------------------------------------- group lasso ---
def test_group_soft_threshold_solves_the_proximal_problem():
    rng = np.random.default_rng(0)
    for dim in (1, 2, 5):
        for _ in range(20):
            w = rng.normal(size=dim) * rng.choice([0.1, 1.0, 3.0])
            t = rng.uniform(0, 2)
            u = group_soft_threshold(torch.tensor(w), torch.tensor(t, dtype=torch.float64)).numpy()

            def objective(x, w=w, t=t):
                return 0.5 * np.sum((x - w) ** 2) + t * np.linalg.norm(x)

            # Optimality: 0 ∈ u - w + t ∂‖u‖.
            if np.linalg.norm(u) > 0:
                np.testing.assert_allclose(u - w + t * u / np.linalg.norm(u), 0, atol=1e-12)
            else:
                assert np.linalg.norm(w) <= t
            numerical = scipy.optimize.minimize(objective, w, method="Nelder-Mead",
                                                options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 20000})
            assert objective(u) <= numerical.fun + 1e-9


def test_group_lasso_density():
    torch.manual_seed(0)
    rate = torch.tensor(1.7)
    # d = 1 is the Laplace density.
    w = torch.linspace(-3, 3, 11).unsqueeze(-1)
    expected = torch.distributions.Laplace(0.0, 1 / rate).log_prob(w.squeeze(-1))
    torch.testing.assert_close(GroupLasso(rate, 1).log_prob(w), expected)
    for dim in (2, 5):
        d = GroupLasso(rate, dim)
        # Normalised: E_q[p / q] = 1 under a wide Gaussian proposal.
        q = torch.distributions.Normal(0.0, 2.0 * (dim + 1) ** 0.5 / rate)
        x = q.sample((100_000, dim))
        ratio = (d.log_prob(x) - q.log_prob(x).sum(-1)).exp()
        assert abs(ratio.mean().item() - 1) < 4 * ratio.std().item() / len(ratio) ** 0.5 + 1e-3
        # Samples: radius ~ Gamma(d, λ), coordinate variance (d + 1) / λ².
        draws = d.sample((20_000,))
        radius = draws.norm(dim=-1).numpy()
        assert scipy.stats.kstest(radius, scipy.stats.gamma(dim, scale=1 / rate.item()).cdf).pvalue > 1e-3
        np.testing.assert_allclose(draws.var(0).numpy(), d.variance.numpy(), rtol=0.05)


def test_group_lasso_hooks_remove_the_penalty_gradient_and_keep_zero_columns():
    torch.manual_seed(1)
    prior = GroupLassoPrior(3, 4, 2, lam=2.0)
    weights = torch.nn.Parameter(torch.randn(3, 4, 2))
    with torch.no_grad():
        weights[0, 1] = 0.0
    (-prior.distribution().log_prob(weights)).backward()
    prior.before_step(weights)
    torch.testing.assert_close(weights.grad, torch.zeros(3, 4, 2))  # only the smooth part (none here) is left

    # A zero column whose averaged gradient stays below λ is kept at zero
    # even if one minibatch's gradient step moved it.
    weights.grad = torch.full((3, 4, 2), 0.5)  # ‖·‖ = 0.71 < λ
    prior.before_step(weights)
    with torch.no_grad():
        weights.sub_(0.1 * weights.grad)
    prior.after_step(weights, torch.full((3, 4, 2), 1e-3), 0.01)
    assert torch.equal(weights[0, 1], torch.zeros(2))
    assert (weights.detach().norm(dim=-1) > 0).sum() == 11


def test_group_generators_route_latents_through_their_columns_only():
    torch.manual_seed(2)
    groups = np.array([0, 0, 1, 1, 1, 2])
    decoder = GroupGenerators(groups, latent_dim=3, group_input_dim=4, hidden_dims=(8, 8))
    weights = torch.randn(3, 3, 4)
    weights[1, 2] = 0.0  # latent 2 does not reach group 1 (features 2, 3, 4)
    z = torch.randn(10, 3)
    moved = z.clone()
    moved[:, 2] += 1.0
    change = (decoder(moved, weights) - decoder(z, weights)).abs().amax(0)
    assert torch.all(change[[2, 3, 4]] == 0)
    assert torch.all(change[[0, 1, 5]] > 0)
    # Particle dimensions in front of the batch pass through.
    assert decoder(torch.randn(2, 10, 3), weights).shape == (2, 10, 6)


@pytest.fixture(scope="module")
def synthetic():
    return synthetic_sparse_dgm(n=300, rho=0.0, seed=0)


@pytest.fixture(scope="module")
def oi_vae(synthetic):
    # λ = 10 on the full-data ELBO (the oi-VAE code's λ = 1 per data point
    # would be λ = N = 300 here).  Over seeds 0-3: 17-27 zero columns of 35, AUC 0.86-1
    # (λ = 100, which the shrink capped at lr needed, now leaves 30-34 columns zero, AUC 0.44-0.81).
    return pyro_sparse.train("oi_vae", synthetic.X, latent_dim=5, max_epochs=40, hidden_dims=(20, 20), lam=10.0,
                             seed=0, progress=False)


def test_oi_vae_recovers_the_support_with_exact_zero_columns(oi_vae, synthetic):
    assert oi_vae.W_.shape == (7, 5, 5)  # singleton groups, K = 5, p = 5
    norms = norms_of_columns(oi_vae.W_)
    assert (norms == 0).sum() >= 5, norms
    assert support_auc(norms, synthetic, oi_vae.transform(synthetic.X)) > 0.8, norms


def test_strong_group_lasso_switches_off_whole_columns(synthetic):
    # The proximal step moves W at most lr = 0.01 a step: 200 steps can switch off columns of norm ~1.
    fitted = pyro_sparse.train("oi_vae", synthetic.X[:200], latent_dim=3, max_epochs=20, batch_size=20,
                               hidden_dims=(10,), lam=5000.0, seed=0, progress=False)
    norms = norms_of_columns(fitted.W_)
    assert (norms == 0).sum() >= 10, norms  # of 21 columns
    assert np.isfinite(fitted.heldout_log_likelihood(synthetic.X[200:300], 5)).all()


@pytest.mark.parametrize("options, message", [
    ({"group_input_dim": True}, "group_input_dim must be a positive integer, got True"),
    ({"groups": ["a", None, "b", "a", "b", "c", "c"]}, "groups must be labels of one kind that sort"),
])
def test_oi_vae_options_are_checked(synthetic, options, message):
    with pytest.raises(ValueError, match=message):
        pyro_sparse.train("oi_vae", synthetic.X, latent_dim=2, max_epochs=1, hidden_dims=(8,), progress=False,
                          **options)


@pytest.mark.parametrize("options, message", [
    ({"num_pseudo_inputs": 2.5}, "num_pseudo_inputs must be a positive integer, got 2.5"),
    ({"selection_sharpness": -60.0}, "selection_sharpness must be a positive finite number"),
    ({"selection_threshold": float("nan")}, "selection_threshold .* must be in \\(0, 1\\), got nan"),
])
def test_pseudo_input_options_are_checked(synthetic, options, message):
    with pytest.raises(ValueError, match=message):
        pyro_sparse.train("vsc", synthetic.X, latent_prior="pseudo_inputs", latent_dim=2, max_epochs=1,
                          hidden_dims=(8,), progress=False, **options)


def test_oi_vae_groups_save_and_load(synthetic, tmp_path):
    X = synthetic.X[:100]
    fitted = pyro_sparse.train("oi_vae", X, latent_dim=2, max_epochs=2, hidden_dims=(6,), group_input_dim=3,
                               groups=[0, 0, 0, 1, 1, 1, 2], seed=0, progress=False)
    assert fitted.W_.shape == (3, 2, 3)
    fitted.save(tmp_path / "oi.pt")
    loaded = pyro_sparse.load(tmp_path / "oi.pt")
    np.testing.assert_array_equal(loaded.W_, fitted.W_)
    np.testing.assert_allclose(loaded.transform(X), fitted.transform(X))
    with pytest.raises(ValueError, match="one label per feature"):
        pyro_sparse.train("oi_vae", X, latent_dim=2, max_epochs=1, groups=[0, 1], progress=False)


# ---------------------------------------------------------------- horseshoe ---
def horseshoe_sweep(w, tau, v, lambda_local, lambda_global, b_local=1.0, b_global=1.0):
    """Eq. 67-70 written out in float64, without any rescaling."""
    G, K = w.shape
    tau = 0.5 * (w**2 / (2 * v) + 1 / lambda_local)
    v = 2 / (G + 3) * ((w**2 / (2 * tau)).sum(0) + 1 / lambda_global)
    lambda_local = 2 / (G * K + 3) * ((1 / tau).sum() + 1 / b_local**2)
    lambda_global = 2 / (K + 3) * ((1 / v).sum() + 1 / b_global**2)
    return tau, v, lambda_local, lambda_global


def inverse_gamma_log_density(x, shape, rate):
    return shape * np.log(rate) - math.lgamma(shape) - (shape + 1) * np.log(x) - rate / x


def horseshoe_log_joint(w, tau, v, lambda_local, lambda_global, b_local=1.0, b_global=1.0):
    """log p(W, τ, v, λ) of Eq. 62-66 (τ, v variances)."""
    return (
        inverse_gamma_log_density(lambda_global, 0.5, 1 / b_global**2)
        + inverse_gamma_log_density(lambda_local, 0.5, 1 / b_local**2)
        + inverse_gamma_log_density(tau, 0.5, 1 / lambda_local).sum()
        + inverse_gamma_log_density(v, 0.5, 1 / lambda_global).sum()
        + scipy.stats.norm(0, np.sqrt(tau * v)).logpdf(w).sum()
    )


def test_each_horseshoe_update_maximises_the_log_joint_over_its_coordinate():
    rng = np.random.default_rng(3)
    w = rng.normal(size=(4, 3)) * np.array([1.0, 0.1, 2.0])
    state = [rng.uniform(0.5, 2, size=(4, 3)), rng.uniform(0.5, 2, size=3), 1.3, 0.7]
    new = horseshoe_sweep(w, *state)

    def argmax(replace):
        # Maximise over the log of one coordinate, the others fixed at their newest values.
        result = scipy.optimize.minimize_scalar(lambda s: -horseshoe_log_joint(w, *replace(np.exp(s))),
                                                bounds=(-20, 20), method="bounded", options={"xatol": 1e-10})
        return np.exp(result.x)

    _, v0, local0, global0 = state
    tau1, v1, local1, global1 = new
    for j, k in [(0, 0), (2, 1), (3, 2)]:
        def with_tau(x, j=j, k=k):
            tau = tau1.copy()
            tau[j, k] = x
            return tau, v0, local0, global0

        np.testing.assert_allclose(argmax(with_tau), tau1[j, k], rtol=1e-5)  # Eq. 67
    for k in range(3):
        def with_v(x, k=k):
            v = v1.copy()
            v[k] = x
            return tau1, v, local0, global0

        np.testing.assert_allclose(argmax(with_v), v1[k], rtol=1e-5)  # Eq. 68
    np.testing.assert_allclose(argmax(lambda x: (tau1, v1, x, global0)), local1, rtol=1e-5)  # Eq. 69
    np.testing.assert_allclose(argmax(lambda x: (tau1, v1, local1, x)), global1, rtol=1e-5)  # Eq. 70


def test_horseshoe_prior_runs_the_paper_sweep_exactly_and_its_variances_converge():
    rng = np.random.default_rng(4)
    w = rng.normal(size=(7, 3)) * np.array([1.0, 0.3, 2.0])
    prior = HorseshoePrior(7, 3)
    state = [np.ones((7, 3)), np.ones(3), 1.0, 1.0]
    log_joints = []
    for sweep in range(30):
        prior.update(torch.tensor(w, dtype=torch.float32))
        state = horseshoe_sweep(w.astype(np.float32).astype(np.float64), *state)
        np.testing.assert_allclose(prior.log_tau.exp().numpy(), state[0], rtol=1e-10)
        np.testing.assert_allclose(prior.log_v.exp().numpy(), state[1], rtol=1e-10)
        np.testing.assert_allclose(prior.log_lambda_local.exp().item(), state[2], rtol=1e-10)
        np.testing.assert_allclose(prior.log_lambda_global.exp().item(), state[3], rtol=1e-10)
        log_joints.append(horseshoe_log_joint(w, *state))
    # Coordinate ascent never lowers the log joint; the joint has no maximum
    # (τ → 0, v → ∞), but the variances τv of W reach a fixed point.
    assert np.all(np.diff(log_joints) >= -1e-6)
    assert prior.log_tau.max().item() < -5
    variances = []
    for _ in range(2):
        for _ in range(1000):  # far beyond the floating-point range of τ and v themselves
            prior.update(torch.tensor(w, dtype=torch.float32))
        variances.append(prior.prior_variance().numpy())
    assert prior.log_tau.max().item() < -200  # τ < e^-200: stored as it is, it would underflow even in float64 soon
    np.testing.assert_allclose(variances[1], variances[0], rtol=1e-5)


def test_horseshoe_variance_stays_exact_in_a_column_with_one_entry():
    # With one non-zero entry in a column v_k shrinks ~4/(G + 3) a sweep and τ_jk grows as fast: stored as
    # float32 numbers, v hit its floor within ~50 sweeps and τ_jk v_k read inf for |w| > 2.6.
    w = np.zeros((20, 2))
    w[0, 0], w[:, 1] = 5.0, np.linspace(-1, 1, 20)
    prior = HorseshoePrior(20, 2)
    state = [np.ones((20, 2)), np.ones(2), 1.0, 1.0]
    for _ in range(120):
        prior.update(torch.tensor(w, dtype=torch.float32))
        state = horseshoe_sweep(w, *state)
    assert state[1][0] < 1e-45  # below float32's range, inside float64's
    finfo = np.finfo(np.float32)  # the zero entries' variances are below float32's range and read as its floor
    np.testing.assert_allclose(prior.prior_variance().numpy(), np.clip(state[0] * state[1], finfo.tiny, finfo.max),
                               rtol=1e-5)


def test_horseshoe_prior_reads_the_earlier_rescaled_layout():
    # Before the log-space buffers, model files held τ/s, v·s, λ_local·s and log s.
    prior = HorseshoePrior(3, 2)
    s = 0.5
    prior.load_state_dict({"tau": torch.full((3, 2), 2.0), "v": torch.full((2,), 3.0),
                           "lambda_local": torch.tensor(4.0), "lambda_global": torch.tensor(5.0),
                           "log_scale": torch.tensor(math.log(s), dtype=torch.float64)})
    np.testing.assert_allclose(prior.prior_variance().numpy(), (2.0 * s) * (3.0 / s), rtol=1e-6)
    assert prior.log_lambda_local.exp().item() == pytest.approx(4.0 / s)
    assert prior.log_lambda_global.exp().item() == pytest.approx(5.0)


def test_horseshoe_hooks_take_the_proximal_step_of_the_gaussian_term():
    torch.manual_seed(5)
    prior = HorseshoePrior(4, 2)
    prior.update(torch.randn(4, 2))
    mask = torch.nn.Parameter(torch.randn(4, 2))
    (-prior.distribution().log_prob(mask)).backward()
    prior.before_step(mask)
    torch.testing.assert_close(mask.grad, torch.zeros(4, 2), atol=1e-5, rtol=0)
    # Uncapped, the step solves argmin_u (u - w)²/(2s) + u²/(2τv).
    step_size = torch.full((4, 2), 0.3)
    variance = prior.prior_variance()
    w = mask.detach().clone()
    with torch.no_grad():
        prior.after_step(mask, step_size, max_shift=100.0)
    torch.testing.assert_close(mask.detach(), w * variance / (variance + step_size))
    # Capped, no entry moves further than two optimizer steps.
    mask = torch.nn.Parameter(torch.full((4, 2), 5.0))
    with torch.no_grad():
        prior.after_step(mask, torch.full((4, 2), 1e6), max_shift=0.01)
    torch.testing.assert_close(mask.detach(), torch.full((4, 2), 4.98))


def fit_mask(synthetic, **hyperparameters):
    return pyro_sparse.train("ssl_dgm", synthetic.X, latent_dim=5, max_epochs=60, hidden_dims=(20, 20), seed=0,
                             progress=False, **hyperparameters)


def off_to_on_support(fitted, synthetic):
    """Mean |w| off the true support over mean |w| on it (columns matched to the true factors)."""
    W = np.abs(fitted.W_)
    matching = evaluation.match_factors(fitted.transform(synthetic.X), synthetic.z)
    truth = np.zeros(W.shape, dtype=bool)
    truth[:, matching] = synthetic.support
    return W[~truth].mean() / W[truth].mean()


@pytest.fixture(scope="module")
def slab_ablation(synthetic):
    # SparseVAE-Slab, Appendix C.4.1 Experiment 1: λ0 = λ1 = 0.001.
    return fit_mask(synthetic, lambda0=0.001, lambda1=0.001)


def test_sparse_vae_slab_ablation_is_the_lasso(slab_ablation):
    # With equal rates the SSL is a Laplace (Lasso) prior: one penalty weight for all entries.
    prior = slab_ablation.model.site_priors["W"]
    torch.testing.assert_close(prior.penalty_weights().cpu(), torch.full((7, 5), 0.001))
    assert (slab_ablation.W_ != 0).all()  # so weak a prior zeroes nothing


def test_horseshoe_training_shrinks_irrelevant_entries(synthetic, slab_ablation):
    fitted = fit_mask(synthetic, mask_prior="horseshoe")
    # Over seeds 0-3, off/on ratio 0.15-0.32 (horseshoe) against 0.36-0.54 (λ0 = λ1 = 0.001).
    assert off_to_on_support(fitted, synthetic) < 0.6 * off_to_on_support(slab_ablation, synthetic), fitted.W_
    assert support_auc(fitted.W_, synthetic, fitted.transform(synthetic.X)) > 0.9, fitted.W_
    # ... at no cost in fit (both ~1.85 after these 60 short epochs).
    mse = {name: evaluation.mse(synthetic.X, f.reconstruct(synthetic.X)) for name, f in [("hs", fitted), ("slab", slab_ablation)]}
    assert mse["hs"] < 1.2 * mse["slab"], mse
    with pytest.raises(AttributeError):
        _ = fitted.eta_  # the horseshoe has no η
    with pytest.raises(AttributeError, match="mask prior \\('ssl' or 'gene_sets'\\), not HorseshoePrior"):
        fitted.support_probability(synthetic.X[:5])


# ---------------------------------------------------------------------- NMF ---
@pytest.fixture(scope="module")
def counts():
    """Poisson counts of rank 3: 400 training and 200 heldout rows, 30 features."""
    rng = np.random.default_rng(6)
    codes = rng.gamma(0.5, 2.0, size=(600, 3))
    components = rng.gamma(0.3, 3.0, size=(3, 30))
    X = rng.poisson(codes @ components + 0.01)
    X = X[X.sum(1) > 0]
    return X[:400], X[400:600]


def test_nmf_transform_and_loadings(counts):
    train, test = counts
    fitted = pyro_sparse.train("nmf", train, latent_dim=3, likelihood="multinomial")
    assert isinstance(fitted, FittedNMF)
    codes = fitted.transform(test)
    assert codes.shape == (len(test), 3) and (codes >= 0).all()
    assert fitted.W_.shape == (30, 3) and (fitted.W_ >= 0).all()
    probabilities = fitted.reconstruct(test)
    np.testing.assert_allclose(probabilities.sum(1), 1.0)
    assert len(fitted.top_features(4)) == 3
    table = fitted.loadings()  # one row per non-zero loading, as ssl_dgm's
    assert list(table.columns) == ["feature", "factor", "weight"] and len(table) == np.count_nonzero(fitted.W_)
    first = table[table.factor == 0].iloc[0]
    assert first.weight == fitted.W_[:, 0].max() and first.feature == fitted.W_[:, 0].argmax()  # indices without names
    assert list(fitted.history_frame().columns) == ["train_loss"] and len(fitted.history_frame()) == 1
    anndata = pytest.importorskip("anndata")
    adata = anndata.AnnData(test.astype(np.float32))
    fitted.write_to(adata)
    np.testing.assert_array_equal(adata.obsm["X_nmf"], codes)
    np.testing.assert_array_equal(adata.varm["W_nmf"], fitted.W_)


def test_nmf_poisson_heldout_likelihood(counts):
    train, test = counts
    fitted = {k: pyro_sparse.train("nmf", train, latent_dim=k, likelihood="multinomial") for k in (1, 3)}
    scores = {k: f.heldout_log_likelihood(test) for k, f in fitted.items()}
    assert all(np.isfinite(s).all() for s in scores.values())
    assert scores[3].mean() > scores[1].mean() + 1.0
    # It is the multinomial likelihood of each row given its total, at the row's fitted code.
    rates = fitted[3].transform(test) @ fitted[3].W_.T
    x = torch.as_tensor(test, dtype=torch.float64)
    expected = torch.distributions.Multinomial(int(x.sum(1)[0]), probs=torch.as_tensor(rates[0])).log_prob(x[0])
    np.testing.assert_allclose(scores[3][0], expected.item(), rtol=1e-8)


def test_nmf_gaussian_heldout_likelihood():
    rng = np.random.default_rng(7)
    X = rng.gamma(2.0, size=(300, 2)) @ rng.gamma(2.0, size=(2, 12)) + rng.normal(scale=0.3, size=(300, 12))
    X = np.clip(X, 0, None).astype(np.float32)  # the precision models work in
    fitted = {k: pyro_sparse.train("nmf", X[:200], latent_dim=k, alpha=0.0) for k in (1, 2)}
    scores = {k: f.heldout_log_likelihood(X[200:]) for k, f in fitted.items()}
    assert scores[2].mean() > scores[1].mean() + 1.0
    # Gaussian with the per-feature training residual variance.
    means = fitted[2].reconstruct(X[200:])
    expected = scipy.stats.norm(means, np.sqrt(fitted[2].noise_variance)).logpdf(X[200:]).sum(1)
    np.testing.assert_allclose(scores[2], expected, rtol=1e-10)
    assert 0.05 < np.median(fitted[2].noise_variance) < 0.2  # noise variance 0.09, before clipping


def test_nmf_save_load_roundtrip(counts, tmp_path):
    train, test = counts
    fitted = pyro_sparse.train("nmf", train, latent_dim=3, likelihood="multinomial", seed=1, alpha=0.5)
    fitted.save(tmp_path / "nmf.pt")
    loaded = pyro_sparse.load(tmp_path / "nmf.pt")
    assert isinstance(loaded, FittedNMF) and loaded.config == fitted.config
    np.testing.assert_array_equal(loaded.W_, fitted.W_)
    np.testing.assert_array_equal(loaded.heldout_log_likelihood(test), fitted.heldout_log_likelihood(test))
    assert loaded.history_ == fitted.history_
    # The file is checked like every model file.
    raw = bytearray((tmp_path / "nmf.pt").read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (tmp_path / "bad.pt").write_bytes(bytes(raw))
    with pytest.raises(ModelFileError):
        pyro_sparse.load(tmp_path / "bad.pt")


def test_nmf_bad_input_is_named(counts):
    train, _ = counts
    with pytest.raises(DataError, match="non-negative"):
        pyro_sparse.train("nmf", -np.abs(train[:, :5]) - 1.0, latent_dim=2)
    for data in ((train > 0).astype(float), train):  # counts too: the likelihood is named before the data's values
        with pytest.raises(ValueError, match="likelihoods.*got 'bernoulli'; fit binary data with likelihood='multi"):
            pyro_sparse.train("nmf", data, latent_dim=2, likelihood="bernoulli")
    with pytest.raises(ValueError, match="got 'poisson'; fit counts with likelihood='multinomial'"):
        pyro_sparse.train("nmf", train, latent_dim=2, likelihood="poisson")
    with pytest.raises(TypeError, match=r"no option\(s\) \['lambda0'\]"):
        pyro_sparse.train("nmf", train, latent_dim=2, likelihood="multinomial", lambda0=3.0)
    for policy in (pyro_sparse.Checkpointing(path="run.ckpt"), pyro_sparse.Checkpointing(resume_from="run.ckpt")):
        with pytest.raises(ValueError, match="writes no checkpoint and resumes none"):
            pyro_sparse.train("nmf", train, latent_dim=2, likelihood="multinomial", checkpointing=policy)
    fitted = pyro_sparse.train("nmf", train, latent_dim=2, likelihood="multinomial")
    with pytest.raises(DataError, match="features"):
        fitted.transform(train[:, :5])
