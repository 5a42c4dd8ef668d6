"""Tests of pyro_sparse.sparse_coding: FISTA (Eq. 10 inference) and the dictionary baseline."""

import numpy as np
import pytest
import torch
from sklearn.linear_model import Lasso

from pyro_sparse.baselines.fista import (
    FistaResult,
    fista,
    lambda_warmup_factor,
    learn_dictionary,
    lipschitz_constant,
    soft_threshold,
    sparse_coding_objective,
)

# These problems are tiny; on a shared CPU extra intra-op threads only add contention.
pytestmark = pytest.mark.usefixtures("one_thread")


def _problem(D, K, N=4, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(D, K)) / np.sqrt(D)
    X = rng.normal(size=(N, D))
    return A, X


def _sklearn_codes(A, X, lam):
    # sklearn's Lasso minimises 1/(2 n_samples) ||y - Xw||^2 + alpha ||w||_1; here the
    # "samples" are the D coordinates of one data point, so alpha = lam / D gives the
    # same minimiser as 1/2 ||x - Az||^2 + lam ||z||_1.
    D = A.shape[0]
    out = []
    for x in X:
        model = Lasso(alpha=lam / D, fit_intercept=False, tol=1e-14, max_iter=200_000)
        out.append(model.fit(A, x).coef_)
    return np.stack(out)


# --------------------------------------------------------------------------- objective


def test_objective_matches_formula():
    A, X = _problem(12, 8, N=3)
    Z = np.random.default_rng(1).normal(size=(3, 8))
    lam = 0.7
    expected = 0.5 * ((X - Z @ A.T) ** 2).sum(1) + lam * np.abs(Z).sum(1)
    got = sparse_coding_objective(
        torch.tensor(X), torch.tensor(A), torch.tensor(Z), lam
    )
    assert got.shape == (3,)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12)
    # single point -> scalar
    one = sparse_coding_objective(
        torch.tensor(X[0]), torch.tensor(A), torch.tensor(Z[0]), lam
    )
    assert one.ndim == 0 and np.isclose(float(one), expected[0])


def test_soft_threshold_and_lipschitz():
    v = torch.tensor([-2.0, -0.5, 0.0, 0.3, 1.5])
    np.testing.assert_allclose(
        soft_threshold(v, 0.5).numpy(), [-1.5, 0.0, 0.0, 0.0, 1.0]
    )
    A, _ = _problem(10, 25)
    L = float(lipschitz_constant(torch.tensor(A)))
    assert np.isclose(L, np.linalg.norm(A, 2) ** 2, rtol=1e-10)


# --------------------------------------------------------------------------- FISTA vs sklearn


@pytest.mark.parametrize("D,K,lam", [(30, 20, 0.3), (20, 40, 0.2), (16, 16, 1.0)])
def test_fista_matches_sklearn_lasso(D, K, lam):
    A, X = _problem(D, K, N=4, seed=D + K)
    ref = _sklearn_codes(A, X, lam)
    res = fista(
        torch.tensor(X),
        torch.tensor(A),
        lam,
        num_iterations=20_000,
        tol=1e-10,
        return_info=True,
    )
    assert isinstance(res, FistaResult) and res.converged
    Z = res.codes.numpy()
    assert Z.shape == (4, K)
    np.testing.assert_allclose(Z, ref, atol=1e-4)
    At, Xt = torch.tensor(A), torch.tensor(X)
    obj = sparse_coding_objective(Xt, At, res.codes, lam).numpy()
    obj_ref = sparse_coding_objective(Xt, At, torch.tensor(ref), lam).numpy()
    np.testing.assert_allclose(obj, obj_ref, rtol=1e-4, atol=1e-4)
    assert (obj <= obj_ref + 1e-8).all()  # FISTA is at least as good as sklearn's CD
    # sparsity pattern: exact zeros where the lasso solution is zero
    assert ((Z == 0) == (np.abs(ref) < 1e-8)).mean() > 0.95


def test_fista_float32_close_to_float64():
    A, X = _problem(30, 20, N=6, seed=3)
    z64 = fista(torch.tensor(X), torch.tensor(A), 0.3, num_iterations=5000, tol=1e-9)
    z32 = fista(
        torch.tensor(X, dtype=torch.float32),
        torch.tensor(A, dtype=torch.float32),
        0.3,
        num_iterations=5000,
        tol=1e-6,
    )
    assert z32.dtype == torch.float32 and z64.dtype == torch.float64
    np.testing.assert_allclose(z32.numpy(), z64.numpy(), atol=1e-4)


def test_objective_decreases_to_optimum():
    # FISTA is not a descent method, so check the trajectory "monotonically-ish": the objective
    # after k iterations ends far below the start, is never above the starting value, and the
    # gap to the optimum shrinks by orders of magnitude.
    A, X = _problem(20, 40, N=5, seed=7)
    At, Xt, lam = torch.tensor(A), torch.tensor(X), 0.2
    opt = sparse_coding_objective(
        Xt, At, torch.tensor(_sklearn_codes(A, X, lam)), lam
    ).sum()
    start = sparse_coding_objective(
        Xt, At, torch.zeros(5, 40, dtype=torch.float64), lam
    ).sum()
    values = []
    for k in [1, 2, 5, 10, 20, 50, 100, 200, 500, 2000]:
        Z = fista(Xt, At, lam, num_iterations=k, tol=0)
        values.append(float(sparse_coding_objective(Xt, At, Z, lam).sum()))
    values = np.array(values)
    assert (values <= float(start) + 1e-12).all()
    gaps = values - float(opt)
    assert gaps[-1] < 1e-6 * float(start)
    assert gaps[-1] >= -1e-9  # cannot beat the optimum
    assert gaps[4] < 0.1 * gaps[0] and gaps[7] < 0.01 * gaps[0]
    # allowed non-monotonicity is small: no value exceeds an earlier one by much
    assert np.all(np.diff(values) <= 1e-3 * float(start))


def test_batched_equals_per_row():
    A, X = _problem(25, 30, N=7, seed=11)
    At, Xt = torch.tensor(A), torch.tensor(X)
    lam = 0.15
    batched = fista(Xt, At, lam, num_iterations=300, tol=0)
    rows = torch.stack(
        [fista(Xt[i], At, lam, num_iterations=300, tol=0) for i in range(7)]
    )
    assert rows.shape == batched.shape == (7, 30)
    np.testing.assert_allclose(batched.numpy(), rows.numpy(), atol=1e-12)
    # with a tolerance, the batched solve stops when every row has converged
    b2 = fista(Xt, At, lam, num_iterations=20_000, tol=1e-10)
    r2 = torch.stack(
        [
            fista(Xt[i : i + 1], At, lam, num_iterations=20_000, tol=1e-10)[0]
            for i in range(7)
        ]
    )
    np.testing.assert_allclose(b2.numpy(), r2.numpy(), atol=1e-5)


def test_lambda_zero_orthonormal_is_least_squares():
    rng = np.random.default_rng(5)
    Q, _ = np.linalg.qr(rng.normal(size=(20, 12)))  # orthonormal columns, D > K
    X = rng.normal(size=(6, 20))
    Z = fista(
        torch.tensor(X), torch.tensor(Q), 0.0, num_iterations=50, tol=1e-12
    ).numpy()
    ls = np.linalg.lstsq(Q, X.T, rcond=None)[0].T
    np.testing.assert_allclose(Z, ls, atol=1e-10)
    np.testing.assert_allclose(Z, X @ Q, atol=1e-10)  # = A^T x for orthonormal A
    # and a square orthogonal dictionary reconstructs exactly
    Q2, _ = np.linalg.qr(rng.normal(size=(15, 15)))
    Z2 = fista(torch.tensor(X[:, :15]), torch.tensor(Q2), 0.0, num_iterations=50)
    np.testing.assert_allclose(Z2.numpy() @ Q2.T, X[:, :15], atol=1e-10)


def test_lambda_orthonormal_is_soft_threshold():
    # With orthonormal columns the lasso decouples: z = soft(A^T x, lam).
    rng = np.random.default_rng(6)
    Q, _ = np.linalg.qr(rng.normal(size=(20, 12)))
    X = rng.normal(size=(6, 20))
    Z = fista(torch.tensor(X), torch.tensor(Q), 0.4, num_iterations=50).numpy()
    expected = np.sign(X @ Q) * np.maximum(np.abs(X @ Q) - 0.4, 0)
    np.testing.assert_allclose(Z, expected, atol=1e-10)


def test_warmup_reaches_same_optimum():
    A, X = _problem(20, 40, N=5, seed=13)
    At, Xt, lam = torch.tensor(A), torch.tensor(X), 0.25
    ref = _sklearn_codes(A, X, lam)
    plain = fista(Xt, At, lam, num_iterations=20_000, tol=1e-10)
    warm = fista(
        Xt, At, lam, num_iterations=20_000, tol=1e-10, warmup=100, return_info=True
    )
    assert warm.converged
    np.testing.assert_allclose(warm.codes.numpy(), plain.numpy(), atol=1e-6)
    np.testing.assert_allclose(warm.codes.numpy(), ref, atol=1e-4)
    # the ramp starts at 0.1 * lam: after a ramp-only run the codes are denser than at lam
    ramp_only = fista(Xt, At, lam, num_iterations=0, warmup=100)
    assert (ramp_only != 0).sum() >= (plain != 0).sum()


def test_lambda_warmup_schedule_is_appendix_d():
    assert lambda_warmup_factor(0) == pytest.approx(0.1)
    assert lambda_warmup_factor(4500) == pytest.approx(0.55)
    assert lambda_warmup_factor(9000) == pytest.approx(1.0)
    assert lambda_warmup_factor(100_000) == 1.0
    with pytest.raises(ValueError):
        lambda_warmup_factor(-1)


def test_per_atom_lambda_and_init():
    A, X = _problem(30, 20, N=3, seed=17)
    At, Xt = torch.tensor(A), torch.tensor(X)
    lam = torch.linspace(0.1, 0.6, 20, dtype=torch.float64)
    Z = fista(Xt, At, lam, num_iterations=20_000, tol=1e-11).numpy()
    # sklearn has no per-feature weights; rescale columns: z_j = w_j / lam_j * lam0
    lam0 = 0.3
    scale = lam.numpy() / lam0
    W = _sklearn_codes(A / scale, X, lam0)
    np.testing.assert_allclose(Z, W / scale, atol=1e-4)
    # warm start from the solution stays there
    Z2 = fista(Xt, At, lam, num_iterations=5, tol=0, init=torch.tensor(Z)).numpy()
    np.testing.assert_allclose(Z2, Z, atol=1e-7)


def test_input_validation_and_zero_dictionary():
    A, X = _problem(10, 5)
    with pytest.raises(ValueError):
        fista(torch.tensor(X[:, :9]), torch.tensor(A), 0.1)
    with pytest.raises(ValueError):
        fista(torch.tensor(X), torch.tensor(A), -1.0)
    bad = X.copy()
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match="X has non-finite"):
        fista(bad, A, 0.1)
    with pytest.raises(ValueError, match="X has non-finite"):
        learn_dictionary(bad, 3, 0.1, num_epochs=1)
    with pytest.raises(ValueError, match="dictionary has non-finite"):
        fista(X, np.full_like(A, np.inf), 0.1)
    with pytest.warns(UserWarning, match="larger than the 4 data points"):
        learn_dictionary(X, 8, 0.1, num_epochs=1, batch_size=2)
    Z = fista(torch.tensor(X), torch.zeros(10, 5, dtype=torch.float64), 0.1)
    assert torch.equal(Z, torch.zeros(4, 5, dtype=torch.float64))
    # numpy inputs are accepted
    Znp = fista(X, A, 0.1, num_iterations=100)
    assert isinstance(Znp, torch.Tensor) and Znp.shape == (4, 5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fista_on_cuda_matches_cpu():
    A, X = _problem(64, 128, N=50, seed=19)
    cpu = fista(torch.tensor(X), torch.tensor(A), 0.1, num_iterations=400, tol=0)
    gpu = fista(
        torch.tensor(X).cuda(), torch.tensor(A).cuda(), 0.1, num_iterations=400, tol=0
    )
    assert gpu.device.type == "cuda"
    np.testing.assert_allclose(gpu.cpu().numpy(), cpu.numpy(), atol=1e-9)


# --------------------------------------------------------------------------- dictionary learning


def _synthetic_sparse_data(n=600, d=16, k=24, active=3, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(d, k))
    A /= np.linalg.norm(A, axis=0)
    Z = np.zeros((n, k))
    for i in range(n):
        idx = rng.choice(k, active, replace=False)
        Z[i, idx] = rng.laplace(scale=2.0, size=active)
    return torch.tensor(Z @ A.T, dtype=torch.float32), A


def test_learn_dictionary_reduces_objective():
    X, _ = _synthetic_sparse_data()
    lam = 0.3
    options = dict(
        kappa=1e-3, num_epochs=5, batch_size=50, lr=0.5, warmup=False, fista_iterations=200, fista_tol=1e-4, seed=0
    )
    res = learn_dictionary(X, 24, lam, return_history=True, **options)
    A = res.dictionary
    assert A.shape == (16, 24) and A.dtype == torch.float32
    assert res.steps == 5 * 12
    obj = res.train_objective
    assert obj[-1] < 0.8 * obj[0]
    # compared with the (unit-norm Gaussian) initial dictionary on the full data
    A0 = learn_dictionary(X, 24, lam, num_epochs=0, seed=0)
    f = lambda D: float(
        sparse_coding_objective(X, D, fista(X, D, lam, 300, 1e-4), lam).mean()
    )
    assert f(A) < 0.8 * f(A0)
    # deterministic for a seed
    again = learn_dictionary(X, 24, lam, **options)
    assert torch.equal(A, again)


def test_learn_dictionary_unit_norm_option():
    X, _ = _synthetic_sparse_data(n=200)
    A = learn_dictionary(
        X,
        24,
        0.3,
        kappa=0.0,
        num_epochs=2,
        batch_size=50,
        normalize_columns=True,
        fista_iterations=100,
    )
    np.testing.assert_allclose(A.norm(dim=0).numpy(), 1.0, atol=1e-5)


def test_warmup_prevents_dictionary_collapse():
    # Appendix D: without the lambda warm-up a large lambda zeroes every code at the
    # unit-norm initialisation, so the data term gives no gradient and the Frobenius
    # penalty shrinks every atom; starting from 0.1 * lambda codes are used from the start
    # and the atoms grow instead.
    X, _ = _synthetic_sparse_data(n=300, seed=1)
    lam = 1.05 * float(X.norm(dim=1).max())  # above every |a^T x| for unit-norm atoms a
    kw = {
        "kappa": 1e-2,
        "num_epochs": 5,
        "batch_size": 50,
        "lr": 0.5,
        "fista_iterations": 100,
        "seed": 0,
        "warmup_increment": 0.0,
        "return_history": True,
    }
    cold = learn_dictionary(X, 24, lam, warmup=False, **kw)
    warm = learn_dictionary(X, 24, lam, warmup=True, **kw)
    assert max(cold.code_density) == 0.0
    assert cold.dictionary.norm() < 0.9 * np.sqrt(24)
    assert min(warm.code_density) > 0.0
    assert warm.dictionary.norm() > cold.dictionary.norm()


def test_fista_refuses_a_nan_lam_and_a_misshapen_or_non_finite_init():
    A, X = _problem(6, 4)
    with pytest.raises(ValueError, match="lam must be finite and non-negative"):
        fista(X, A, float("nan"))
    with pytest.raises(ValueError, match=r"init must have the codes' shape \(4, 4\)"):
        fista(X, A, 0.1, init=np.ones((16,)))
    A, X = _problem(6, 3)
    with pytest.raises(ValueError, match=r"init must have the codes' shape \(4, 3\)"):
        fista(X, A, 0.1, init=np.ones((3, 4)))  # (K, N): same size, scrambled if reshaped
    with pytest.raises(ValueError, match="init has non-finite values"):
        fista(X, A, 0.1, init=np.full((4, 3), np.nan))
    np.testing.assert_allclose(fista(X[0], A, 0.1, init=np.zeros(3)).numpy(), fista(X[0], A, 0.1).numpy())


@pytest.mark.parametrize("options, message", [
    ({"init": np.full((6, 3), np.nan)}, "init has non-finite values"),
    ({"kappa": -1.0}, "kappa .* must be >= 0"),
    ({"lr": -0.5}, "lr must be positive"),
    ({"lr_decay": -0.99}, "lr_decay must be in \\(0, 1\\]"),
    ({"warmup_increment": -1.0}, "warmup_increment must be >= 0"),
    ({"lam": np.full(3, 0.1)}, "lam must be one number"),
    ({"X": np.zeros((0, 6))}, "X has no rows"),
])
def test_learn_dictionary_checks_its_start_and_step_options(options, message):
    _, X = _problem(6, 3, N=20)
    options = {"X": X, "lam": 0.1, **options}
    with pytest.raises(ValueError, match=message):
        learn_dictionary(options.pop("X"), 3, options.pop("lam"), num_epochs=1, **options)


@pytest.mark.parametrize("options, message", [
    ({"check_every": 0}, "check_every must be an integer >= 1"),
    ({"lipschitz": -1.0}, "lipschitz must be a positive finite number"),
    ({"lipschitz": float("nan")}, "lipschitz must be a positive finite number"),
    ({"lam": np.full(3, 0.1)}, "lam must be .* broadcastable to the codes' shape \\(4, 5\\), got shape \\(3,\\)"),
    ({"lam": np.full((5, 5), 0.1), "X": 1}, "broadcastable to the codes' shape \\(1, 5\\), got shape \\(5, 5\\)"),
])
def test_fista_checks_its_options(options, message):
    A, X = _problem(10, 5)
    options = {"lam": 0.1, **options}
    X = X[: options.pop("X", len(X))]  # "X": 1 keeps one data point
    with pytest.raises(ValueError, match=message):
        fista(X, A, options.pop("lam"), **options)
