"""The Laplace approximation of W's likelihood: its gradient and curvature against autograd's full Hessian."""

import numpy as np
import pyro
import pytest
import torch
from pyro import poutine

import pyro_sparse
from pyro_sparse.data.synthetic import synthetic_sparse_dgm
from pyro_sparse.infer.importance import exact_guide_trace
from pyro_sparse.infer.mask_posterior import mask_log_likelihood_curvature


@pytest.fixture(scope="module")
def fitted():
    data = synthetic_sparse_dgm(n=60, rho=0.0, seed=0)
    fitted = pyro_sparse.train("ssl_dgm", data.X, latent_dim=3, hidden_dims=(6,), max_epochs=3, batch_size=30,
                               seed=0, progress=False, device="cpu")
    fitted.model.double()
    fitted.guide.double()
    return fitted, torch.as_tensor(data.X, dtype=torch.float64)


def log_likelihood(model, guide_trace, x, mask):
    guide_trace.nodes["W"]["value"] = mask
    trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(x)
    return sum(node["fn"].log_prob(node["value"]).sum() for node in trace.nodes.values()
               if node["type"] == "sample" and node["is_observed"])


def test_gradient_and_curvature_are_the_row_blocks_of_the_full_hessian(fitted):
    fitted, x = fitted
    model, guide = fitted.model, fitted.guide
    batch = type("Batch", (), {"x": x, "kwargs": {}})()
    pyro.set_rng_seed(3)
    gradient, curvature = mask_log_likelihood_curvature(model, guide, [batch], num_samples=1)
    pyro.set_rng_seed(3)  # the same draw of the codes
    guide_trace = exact_guide_trace(guide, x)
    mask = guide_trace.nodes["W"]["value"].detach()
    shape = mask.shape

    def as_function(flat):
        return log_likelihood(model, guide_trace, x, flat.reshape(shape))

    flat = mask.reshape(-1).clone()
    hessian = torch.autograd.functional.hessian(as_function, flat)
    full_gradient = torch.autograd.functional.jacobian(as_function, flat)
    torch.testing.assert_close(gradient.reshape(-1), full_gradient, rtol=1e-8, atol=1e-8)
    # Rows of W do not interact (Eq. 1): the Hessian is block-diagonal over features, one K x K block per row.
    rows = torch.arange(flat.numel()) // shape[1]
    assert torch.all(hessian[rows[:, None] != rows[None, :]] == 0)
    blocks = torch.stack([hessian[j * shape[1]:(j + 1) * shape[1], j * shape[1]:(j + 1) * shape[1]]
                          for j in range(shape[0])])
    assert curvature.shape == (*shape, shape[1])
    torch.testing.assert_close(curvature, -blocks, rtol=1e-8, atol=1e-8)
    assert blocks.diagonal(dim1=-2, dim2=-1).ne(0).any() and (blocks - torch.diag_embed(
        blocks.diagonal(dim1=-2, dim2=-1))).ne(0).any()  # the off-diagonal terms are there to be checked


def test_samples_are_averaged(fitted):
    fitted, x = fitted
    batch = type("Batch", (), {"x": x, "kwargs": {}})()
    pyro.set_rng_seed(0)
    one = [mask_log_likelihood_curvature(fitted.model, fitted.guide, [batch], num_samples=1) for _ in range(2)]
    pyro.set_rng_seed(0)
    two = mask_log_likelihood_curvature(fitted.model, fitted.guide, [batch], num_samples=2)
    for k in range(2):
        torch.testing.assert_close(two[k], (one[0][k] + one[1][k]) / 2)


@pytest.mark.parametrize("options, error, message", [
    ({"mask_prior": "horseshoe"}, AttributeError, "needs the Spike-and-Slab Lasso mask prior"),
    ({"likelihood": "multinomial"}, ValueError, "multinomial's softmax couples them"),
])
def test_support_probability_names_what_it_cannot_handle(options, error, message):
    data = synthetic_sparse_dgm(n=40, rho=0.0, seed=0)
    X = data.X if "likelihood" not in options else (data.X > 0).astype("float32") * 3
    fitted = pyro_sparse.train("ssl_dgm", X, latent_dim=2, hidden_dims=(4,), max_epochs=1, batch_size=20,
                               progress=False, device="cpu", **options)
    with pytest.raises(error, match=message):
        fitted.support_probability(X)


def test_support_probability_needs_a_mask():
    data = synthetic_sparse_dgm(n=40, rho=0.0, seed=0)
    fitted = pyro_sparse.train("vae", data.X, latent_dim=2, hidden_dims=(4,), max_epochs=1, batch_size=20,
                               progress=False, device="cpu")
    with pytest.raises(AttributeError, match="has no prior hooks for 'W'"):
        fitted.support_probability(data.X)


def test_support_probability_repeats_and_leaves_the_callers_stream_alone(tmp_path):
    # Its codes are drawn with the fit's seed: calls agree (and a loaded model with them), and the caller's
    # next draw is what it would have been; another fit seed draws other codes.
    data = synthetic_sparse_dgm(n=60, rho=0.0, seed=0)
    options = {"latent_dim": 3, "hidden_dims": (6,), "max_epochs": 3, "batch_size": 30, "progress": False,
               "device": "cpu"}
    fitted = pyro_sparse.train("ssl_dgm", data.X, seed=0, **options)
    torch.manual_seed(11)
    first = fitted.support_probability(data.X, num_samples=2)
    after = torch.rand(3)
    torch.manual_seed(11)
    again = fitted.support_probability(data.X, num_samples=2)
    np.testing.assert_array_equal(torch.rand(3), after)
    np.testing.assert_array_equal(first, again)
    fitted.save(tmp_path / "model.pt")
    np.testing.assert_array_equal(pyro_sparse.load(tmp_path / "model.pt").support_probability(data.X, num_samples=2),
                                  first)
    fitted.config["training"]["seed"] = 1  # same parameters, other draws
    assert not np.array_equal(fitted.support_probability(data.X, num_samples=2), first)


@pytest.mark.filterwarnings("ignore:feature subsampling starts at epoch 0")
def test_support_probability_runs_in_eval_mode_and_puts_the_modes_back():
    data = synthetic_sparse_dgm(n=80, rho=0.0, seed=0)
    fitted = pyro_sparse.train("ssl_dgm", data.X, latent_dim=3, hidden_dims=(6,), max_epochs=2, batch_size=40,
                               feature_subsample_size=3, feature_subsample_start_epoch=0, progress=False, device="cpu")
    pyro.set_rng_seed(1)
    in_eval = fitted.support_probability(data.X)
    fitted.model.train()
    fitted.guide.train()
    pyro.set_rng_seed(1)
    in_train = fitted.support_probability(data.X)
    # In training mode the model would decode 3 of the 7 features: every row must still be scored.
    assert fitted.model.training and fitted.guide.training
    assert (in_train == in_eval).all()


def test_support_probability_uses_each_rows_marginal_and_falls_back_entry_by_entry(monkeypatch):
    """Row 0: a positive definite block (its marginal); row 1: an indefinite block (each entry's own curvature,
    the non-concave entry the prior's tail); row 2: a diagonal block; column 2 switched off (0)."""
    data = synthetic_sparse_dgm(n=40, rho=0.0, seed=0)
    X = data.X[:, :3]
    fitted = pyro_sparse.train("ssl_dgm", X, latent_dim=3, hidden_dims=(4,), max_epochs=1, batch_size=20,
                               seed=0, progress=False, device="cpu")
    prior = fitted._prior("W")
    prior.eta[2] = torch.finfo(prior.eta.dtype).tiny
    gradient = torch.tensor([[1.0, -2.0, 5.0], [0.5, 0.3, 5.0], [-0.4, 0.2, 5.0]], dtype=torch.float64)
    curvature = torch.tensor([[[4.0, 1.5, 9.0], [1.5, 2.0, 9.0], [9.0, 9.0, 1.0]],
                              [[3.0, 5.0, 0.0], [5.0, -1.0, 0.0], [0.0, 0.0, 1.0]],
                              [[2.0, 0.0, 0.0], [0.0, 8.0, 0.0], [0.0, 0.0, 1.0]]], dtype=torch.float64)
    monkeypatch.setattr(pyro_sparse.fitted, "mask_log_likelihood_curvature", lambda *a, **k: (gradient, curvature))
    support = fitted.support_probability(X)

    ssl = prior.distribution().base_dist
    ssl = type(ssl)(*(getattr(ssl, name).double() for name in ("eta", "lambda0", "lambda1")))
    mask = fitted.guide.point_estimate("W").detach().double()
    covariance = torch.linalg.inv(curvature[0, :2, :2])
    diagonal = curvature.diagonal(dim1=-2, dim2=-1)
    loc, scale = mask + gradient / diagonal.abs(), diagonal.abs().rsqrt()
    loc[0, :2], scale[0, :2] = mask[0, :2] + covariance @ gradient[0, :2], covariance.diagonal().sqrt()
    expected = ssl.slab_region_probability(loc, scale)
    expected[1, 1] = (2 * ssl.cdf(-ssl.inclusion_threshold))[1, 1]
    expected[:, 2] = 0.0
    np.testing.assert_allclose(support, expected.numpy(), rtol=1e-10, atol=1e-12)
    # The marginal is wider than the entry's own curvature: the correlated factor can stand in.
    assert covariance[0, 0] > 1 / curvature[0, 0, 0]
