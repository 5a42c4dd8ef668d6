"""
Bad input at every entry point (``train``, ``FittedModel``, the scikit-learn
estimators, the command line, the data set loaders), determinism, and
resource limits.

The property-based tests throw random shapes, dtypes and values at the entry
points.  Each outcome must be either a valid fit (finite outputs of the
documented shapes, from input that meets the documented requirements) or a
``DataError`` / ``ValueError`` / ``TypeError`` raised by the library's own
checks (scikit-learn's, for the estimators) with a message: never an error
from inside torch or pyro, never a silently wrong result.
"""

import os
import random
import traceback
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import sklearn
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import pyro_sparse
import pyro_sparse.guides
import pyro_sparse.models
import pyro_sparse.nn.masked as sparse_nn
from pyro_sparse import Optimization, Schedule
from pyro_sparse.data import (
    DataError,
    DataSummary,
    as_matrix,
    check_training_data,
    check_values,
)
from pyro_sparse.data.dataset import Dataset
from pyro_sparse.data.images import load_digits_images, smiley
from pyro_sparse.data.synthetic import synthetic_sparse_dgm
from pyro_sparse.interop.cli import main
from pyro_sparse.interop.sklearn import OIVAE, VAE, VSC, SparseVAE, ThresholdedVSC
from pyro_sparse.nn import DecoderMemoryError, MaskedDecoder

# Derandomized, so CI sees the same examples on every run; no example database.
settings.register_profile(
    "input-validation",
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=30,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROPERTY = settings.get_profile("input-validation")

TINY = dict(max_epochs=1, batch_size=4, hidden_dims=(3,), progress=False, device="cpu")
SVI_MODELS = ["ssl_dgm", "vae", "vsc", "tvsc", "oi_vae"]
LIKELIHOODS = ["gaussian", "multinomial", "bernoulli"]
LIBRARY = tuple(os.path.dirname(m.__file__) + os.sep for m in (pyro_sparse, pyro_sparse.models, pyro_sparse.guides))
SKLEARN = (os.path.dirname(sklearn.__file__) + os.sep,)


def assert_named_error(error, sources=LIBRARY):
    """A DataError/ValueError/TypeError with a message, raised by the library's own checks."""
    assert isinstance(error, (ValueError, TypeError)), f"{type(error).__name__}: {error}"
    assert str(error)
    origin = traceback.extract_tb(error.__traceback__)[-1].filename
    assert origin.startswith(sources), f"{type(error).__name__} raised in {origin}: {error}"


def dense(X):
    """The values of any accepted input as a numpy array (what the checks see)."""
    if sp.issparse(X):
        return X.toarray()
    if torch.is_tensor(X):
        return (X.float() if X.dtype == torch.bfloat16 else X).numpy()
    return np.asarray(X)


def meets_requirements(X, likelihood, min_rows):
    """
    What the documentation promises a fit needs; a fit from anything else is
    silently wrong.  Models compute in float32: values must be finite and
    neither overflow nor underflow to 0 there, and the likelihood's support is
    judged on the float32 values.
    """
    values = dense(X)
    if values.dtype.kind not in "biuf" or values.ndim != 2 or values.shape[0] < min_rows or values.shape[1] == 0:
        return False
    magnitudes = np.abs(values.astype(np.float64))
    if not (magnitudes <= np.finfo(np.float32).max).all():  # NaN and inf included
        return False
    if ((magnitudes > 0) & (magnitudes < np.finfo(np.float32).tiny)).any():
        return False
    values = values.astype(np.float32)
    if likelihood == "multinomial":
        return (values >= 0).all() and (values == np.round(values)).all() and (values.sum(1) > 0).all()
    if likelihood == "bernoulli":
        return np.isin(values, [0.0, 1.0]).all()
    return True


def assert_valid_outputs(fitted, X, latent_dim):
    n, g = dense(X).shape
    codes = fitted.transform(X)
    assert codes.shape == (n, latent_dim) and np.isfinite(codes).all()
    reconstruction = fitted.reconstruct(X)
    assert reconstruction.shape == (n, g) and np.isfinite(reconstruction).all()
    log_likelihood = fitted.heldout_log_likelihood(X, 2)
    assert log_likelihood.shape == (n,) and np.isfinite(log_likelihood).all()


# ------------------------------------------------------------- strategies ---
SPECIAL_VALUES = [0.0, 1.0, -1.0, 0.5, 2.0, 3.0, 1e-35, 1e30, -1e30, 1e39, np.nan, np.inf, -np.inf]
FINITE = st.floats(-1e3, 1e3).map(lambda value: round(value, 3))
# Half of the arrays hold only moderate numbers, so that valid fits are common.
ELEMENTS = [FINITE, FINITE | st.sampled_from(SPECIAL_VALUES)]
KINDS = ["float64", "counts", "bool", "float32", "tensor", "sparse", "uint8", "float16", "bfloat16", "complex", "object",
         "str"]
ODD_SHAPES = [(), (5,), (3, 2, 2), (0, 3), (4, 0), (1, 3)]


def convert(values, kind):
    """``values`` (float64) as an input of the given kind."""
    with np.errstate(all="ignore"):
        if kind in ("float32", "float16"):
            return values.astype(kind)
        if kind == "counts":  # integers, mostly small and non-negative: valid multinomial data
            return np.nan_to_num(np.abs(values), posinf=5, neginf=5).clip(0, 1e6).round().astype(np.int64)
        if kind == "uint8":
            return np.nan_to_num(values, posinf=1, neginf=0).clip(0, 255).astype(np.uint8)
        if kind == "bool":
            return values > 0.5
        if kind == "complex":
            return values + 1j * values
        if kind == "object":
            return values.astype(object)
        if kind == "str":
            return values.astype(str)
        if kind == "tensor":
            return torch.as_tensor(values)
        if kind == "bfloat16":
            return torch.as_tensor(values).to(torch.bfloat16)
        if kind == "sparse" and values.ndim == 2:
            return sp.csr_matrix(values)
    return values


@st.composite
def inputs(draw, features=st.integers(1, 5), kinds=KINDS):
    # One in six inputs has a shape no model takes.
    odd = draw(st.integers(0, 5)) == 5
    shape = draw(st.sampled_from(ODD_SHAPES)) if odd else (draw(st.integers(2, 10)), draw(features))
    # Every element drawn on its own (no constant fill), so features vary.
    values = draw(hnp.arrays(np.float64, shape, elements=draw(st.sampled_from(ELEMENTS)), fill=st.nothing()))
    return convert(values, draw(st.sampled_from(kinds)))


# ----------------------------------------------------- properties: train() ---
@PROPERTY
@given(
    X=inputs(),
    model=st.sampled_from(SVI_MODELS + ["nmf"]),
    likelihood=st.sampled_from(LIKELIHOODS),
    latent_dim=st.integers(1, 6),
)
def test_train_fits_or_names_the_problem(X, model, likelihood, latent_dim):
    options = {} if model == "nmf" else TINY
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # batch size, latent dimensions, NMF convergence
        try:
            fitted = pyro_sparse.train(model, X, latent_dim=latent_dim, likelihood=likelihood, **options)
        except Exception as error:
            event(f"error: {str(error)[:40]}")
            assert_named_error(error)
            return
        event("fitted")
        assert meets_requirements(X, likelihood, min_rows=1 if model == "nmf" else 2)
        assert_valid_outputs(fitted, X, latent_dim)


GOOD = {
    "gaussian": np.random.default_rng(0).normal(size=(24, 4)),
    "multinomial": np.random.default_rng(0).poisson(3.0, size=(24, 4)) + 1,
    "bernoulli": (np.random.default_rng(0).random((24, 4)) < 0.4).astype(float),
}
FITTED = [("ssl_dgm", "gaussian"), ("vsc", "gaussian"), ("tvsc", "gaussian"), ("oi_vae", "gaussian"),
          ("vae", "multinomial"), ("ssl_dgm", "bernoulli"), ("nmf", "multinomial")]


@pytest.fixture(scope="module")
def fitted_models():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [
            pyro_sparse.train(model, GOOD[likelihood], latent_dim=2, likelihood=likelihood,
                              **({} if model == "nmf" else {**TINY, "max_epochs": 2}))
            for model, likelihood in FITTED
        ]


@PROPERTY
@given(
    X=inputs(features=st.sampled_from([4, 4, 4, 3, 1])),
    which=st.integers(0, len(FITTED) - 1),
    method=st.sampled_from(["transform", "reconstruct", "heldout_log_likelihood"]),
)
def test_evaluation_gives_valid_outputs_or_names_the_problem(fitted_models, X, which, method):
    fitted, likelihood = fitted_models[which], FITTED[which][1]
    try:
        out = getattr(fitted, method)(X)
    except Exception as error:
        event(f"error: {str(error)[:40]}")
        assert_named_error(error)
        return
    event("evaluated")
    assert meets_requirements(X, likelihood, min_rows=1) and dense(X).shape[1] == 4
    n = dense(X).shape[0]
    assert out.shape == {"transform": (n, 2), "reconstruct": (n, 4), "heldout_log_likelihood": (n,)}[method]
    assert np.isfinite(out).all()


@PROPERTY
@given(
    X=inputs(kinds=[kind for kind in KINDS if kind != "bfloat16"]),  # scikit-learn reads arrays, not torch dtypes
    cls=st.sampled_from([SparseVAE, VAE, VSC, ThresholdedVSC, OIVAE]),
)
def test_estimators_fit_or_name_the_problem(X, cls):
    estimator = cls(latent_dim=2, hidden_dims=(3,), max_epochs=1, batch_size=4, device="cpu", random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            codes = estimator.fit_transform(X)
        except Exception as error:
            event(f"error: {str(error)[:40]}")
            assert_named_error(error, LIBRARY + SKLEARN)
            return
    event("fitted")
    values = dense(X).astype(np.float64)  # scikit-learn also converts object arrays of numbers
    assert values.ndim == 2 and values.shape[0] >= 2 and np.isfinite(values).all()
    assert codes.shape == (values.shape[0], 2) and np.isfinite(codes).all()
    assert np.isfinite(estimator.score(X))


# ------------------------------------------------------- named problems ---
@pytest.fixture(scope="module")
def X():
    return synthetic_sparse_dgm(n=60, rho=0.0, seed=0).X


@pytest.mark.parametrize(
    "data, message",
    [
        (np.ones((5, 3)) * (1 + 2j), "complex values"),
        ([[1.0, 2.0], [3.0]], "cannot be read as a matrix"),
        (np.array([["2024-01-01", "2024-01-02"]] * 3, dtype="datetime64[D]"), "numeric"),
        (np.arange(6).reshape(3, 2).astype("timedelta64[s]"), "numeric"),
        (np.array([[1.0, None], [2.0, 3.0]]), "numeric"),
        (np.array([[1.0, 2.0, 3.0]]), "at least 2"),
        (np.ones((6, 3)), "every feature is constant"),
        (np.random.default_rng(0).normal(size=(20, 3)) * 1e20, "rescale"),
        (np.random.default_rng(0).normal(size=(20, 3)) * 1e-20, "rescale"),
    ],
)
def test_bad_training_data_is_named(data, message):
    with pytest.raises(DataError, match=message):
        pyro_sparse.train("vsc", data, **TINY)


def test_the_validation_split_must_leave_two_points():
    data = np.random.default_rng(0).normal(size=(3, 2))
    with pytest.raises(DataError, match="at least 2 must remain"):
        pyro_sparse.train("vae", data, schedule=Schedule(validation_fraction=0.5), **TINY)


def test_counts_beyond_float32_are_named():
    counts = np.random.default_rng(0).poisson(3.0, size=(20, 4)) * 1e16 + 1
    with pytest.raises(DataError, match="rescale"):
        pyro_sparse.train("tvsc", counts, likelihood="multinomial", **TINY)


def test_tensors_without_a_numpy_dtype_are_read(X):
    fitted = pyro_sparse.train("vae", torch.as_tensor(X).to(torch.bfloat16), latent_dim=2, **TINY)
    assert np.isfinite(fitted.transform(torch.as_tensor(X).to(torch.bfloat16))).all()


@pytest.mark.parametrize(
    "settings_, error, message",
    [
        ({"hidden_dims": (0,)}, ValueError, "positive integer widths"),
        ({"hidden_dims": (2.5,)}, ValueError, "positive integer widths"),
        ({"hidden_dims": 4}, TypeError, r"sequence of layer widths, e\.g\. \(50, 50\)"),
        ({"latent_dim": True}, ValueError, "latent_dim must be a positive integer"),
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"lr": float("inf")}, ValueError, "lr must be positive and finite"),
        ({"lr": True}, ValueError, "lr must be positive and finite, got True"),
        ({"progress": "no"}, ValueError, "progress must be True or False, got 'no'"),
        ({"device": "tpu"}, ValueError, "device must be 'auto', 'cpu', 'cuda'"),
        ({"seed": True}, ValueError, r"seed must be an integer in \[0, 2\*\*32\)"),
        ({"seed": -1}, ValueError, "seed must be an integer"),
        ({"seed": "1"}, ValueError, "seed must be an integer"),
        ({"dispersion": "gene-batch"}, ValueError, "dispersion='gene-batch' is for the negative_binomial"),
        ({"beta": float("inf")}, ValueError, "beta must be a positive finite number, got inf"),
        ({"latent_prior": "spike_slab", "alpha": "abc"}, ValueError, r"alpha must be a number in \(0, 1\), got 'abc'"),
    ],
)
def test_bad_settings_are_named(X, settings_, error, message):
    with pytest.raises(error, match=message):
        pyro_sparse.train("ssl_dgm", X, **{**TINY, **settings_})


@pytest.mark.parametrize("model", ["vae", "oi_vae", "vsc"])
def test_an_infinite_kl_weight_is_refused_by_every_model_that_takes_one(X, model):
    # beta = inf diverged at the first step and left an untrained model behind.
    with pytest.raises(ValueError, match="beta must be a positive finite number"):
        pyro_sparse.train(model, X, beta=float("inf"), **TINY)


def test_numpy_scalar_settings_train_and_are_saved_as_numbers(X):
    # np.int64 seeds (e.g. drawn with numpy) crashed in random.seed.
    fitted = pyro_sparse.train("vae", X, latent_dim=2, max_epochs=np.int64(1), batch_size=np.int32(25),
                               seed=np.int64(3), lr=np.float32(0.01), progress=np.bool_(False))
    assert fitted.config["training"]["seed"] == 3 and type(fitted.config["training"]["max_epochs"]) is int


@pytest.mark.parametrize("model, options, named", [
    ("ssl_dgm", {"noise_nu": 5.0}, "'noise_nu'"),
    ("vae", {"noise": "heteroscedastic", "noise_xi": 0.5}, "'noise_xi', 'noise'"),
    ("tvsc", {"noise_variance": 0.3}, "'noise_variance'"),
])
def test_gaussian_noise_options_with_another_likelihood_are_named(X, model, options, named):
    # Recorded and ignored before: the fit was the one without them.
    binary = (X > 0).astype(float)
    with pytest.raises(ValueError, match=rf"\[{named}\] set the noise of the gaussian likelihood"):
        pyro_sparse.train(model, binary, likelihood="bernoulli", **options, **TINY)


@pytest.mark.parametrize("model, options, message", [
    ("vsc", {"noise_variance": 0.3}, r"noise_variance=0.3 acts only with decoder in \['linear', 'conv'\]"),
    ("vsc", {"decoder": "linear", "min_noise_variance": 0.1}, r"acts only with decoder in \['mlp'\]"),
    ("vae", {"noise": "heteroscedastic", "noise_xi": 0.5}, r"noise_xi=0.5 acts only with noise in \['global'\]"),
    ("vae", {"min_noise_variance": 0.1}, r"this run has noise='global', where it would be ignored"),
    ("tvsc", {"latent_prior": "thresholded_normal", "scale_warmup_start": 0.1}, "latent_prior='thresholded_normal'"),
    ("vsc", {"spike_estimator": "straight_through", "slope_start": 10.0}, r"spike_estimator in \['relaxed'\]"),
    ("vsc", {"temperature_start": 2.0}, r"temperature_start=2.0 acts only with spike_estimator"),
    ("tvsc", {"decoder": "conv", "hidden_dims": (32,)}, r"hidden_dims=\(32,\) acts only with decoder"),
    ("ssl_dgm", {"lambda0_path_epochs": 5.0}, "lambda0_path_epochs=5.0 acts only with lambda0_path given"),
    ("ssl_dgm", {"lambda0_path": (), "lambda0_path_epochs": 5.0}, r"this run has lambda0_path=\(\)"),
])
def test_options_that_would_be_ignored_are_named(X, model, options, message):
    # Each was accepted, recorded and had no effect on the fit.
    with pytest.raises(ValueError, match=message):
        pyro_sparse.train(model, X, **{**TINY, **options})


def test_options_where_they_act_and_at_their_defaults_pass(X):
    pyro_sparse.train("vsc", X, decoder="linear", noise_variance=0.3, **TINY)
    pyro_sparse.train("vae", X, noise="heteroscedastic", min_noise_variance=0.1, **TINY)
    pyro_sparse.train("ssl_dgm", X, lambda0_path=(2.0, 5.0), lambda0_path_epochs=1.0, **TINY)
    pyro_sparse.train("vsc", X, spike_estimator="straight_through", temperature_start=2.0, **TINY)
    # An estimator passes every parameter; at its default an option is no choice of the user's.
    pyro_sparse.train("vae", X, noise="heteroscedastic", noise_xi=1.0, **TINY)
    # Widths as an array (compared once read as a tuple).
    pyro_sparse.train("vsc", X, **{**TINY, "hidden_dims": np.array([8, 8])})


def test_the_vae_refuses_heteroscedastic_noise_without_a_gaussian_likelihood():
    from pyro_sparse.models import VAE

    with pytest.raises(ValueError, match="noise='heteroscedastic' is the gaussian likelihood's"):
        VAE(6, 2, likelihood="bernoulli", noise="heteroscedastic")


def test_the_default_noise_passes_with_any_likelihood(X):
    # The VAE estimator passes noise="global" whatever its likelihood.
    pyro_sparse.train("vae", (X > 0).astype(float), likelihood="bernoulli", noise="global", **TINY)


def test_data_given_first_is_named(X):
    with pytest.raises(TypeError, match=r"the data go second: train\(model, data\)"):
        pyro_sparse.train(X)


def test_a_batch_larger_than_the_data_warns_and_trains_full_batch(X):
    with pytest.warns(UserWarning, match="batch_size=1000 is larger than the 60 training points"):
        fitted = pyro_sparse.train("vae", X, **{**TINY, "batch_size": 1000})
    assert len(fitted.history_["train_loss"]) == 1


@pytest.mark.parametrize("model", ["ssl_dgm", "vae", "oi_vae"])
def test_more_latents_than_features_warns_for_dense_codes(X, model):
    with pytest.warns(UserWarning, match="latent_dim=9 exceeds the 7 features"):
        pyro_sparse.train(model, X, **{**TINY, "latent_dim": 9, "batch_size": 20})


@pytest.mark.parametrize("model", ["vsc", "tvsc"])
def test_overcomplete_sparse_codes_are_allowed_silently(X, model):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fitted = pyro_sparse.train(model, X, **{**TINY, "latent_dim": 20, "batch_size": 20})
    assert fitted.transform(X).shape == (60, 20)


def test_constant_features_are_allowed_where_no_variance_is_calibrated():
    binary = (np.random.default_rng(0).random((30, 4)) < 0.5).astype(float)
    binary[:, 0] = 1.0
    fitted = pyro_sparse.train("ssl_dgm", binary, likelihood="bernoulli", **TINY)
    assert np.isfinite(fitted.reconstruct(binary)).all()


def test_data_in_other_units_than_the_training_data_is_named(X):
    fitted = pyro_sparse.train("vae", X, **TINY)
    assert np.isfinite(fitted.transform(X * 1e3)).all()  # far out, but a real answer
    with pytest.raises(DataError, match="training standard deviations from the training mean"):
        fitted.transform(X * 1e15)


# ------------------------------------------------------- feature names ---
def test_dataframe_columns_are_checked_at_evaluation(X, tmp_path):
    pandas = pytest.importorskip("pandas")
    names = [f"gene{j}" for j in range(7)]
    frame = pandas.DataFrame(X, columns=names)
    fitted = pyro_sparse.train("vae", frame, **TINY)
    assert fitted.config["feature_names"] == names
    np.testing.assert_array_equal(fitted.transform(frame), fitted.transform(X))  # unnamed data: not checked
    with pytest.raises(DataError, match="orders them differently \\(column 0 is 'gene1'"):
        fitted.transform(frame[names[1:2] + names[:1] + names[2:]])
    with pytest.raises(DataError, match=r"lacks 1 of the model's features, e.g. \['gene6'\]"):
        fitted.reconstruct(frame[names[:6]])
    with pytest.raises(DataError, match=r"1 features the model was not trained on, e.g. \['extra'\]"):
        fitted.heldout_log_likelihood(frame.assign(extra=1.0))
    fitted.save(tmp_path / "model.pt")
    with pytest.raises(DataError, match="orders them differently"):
        pyro_sparse.load(tmp_path / "model.pt").transform(frame[names[::-1]])
    unnamed = pyro_sparse.train("vae", pandas.DataFrame(X), **TINY)  # integer columns: no names, like scikit-learn
    assert unnamed.config["feature_names"] is None


def test_estimators_check_dataframe_columns(X):
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame(X, columns=list("abcdefg"))
    estimator = SparseVAE(latent_dim=2, hidden_dims=(3,), max_epochs=1, random_state=0).fit(frame)
    with pytest.raises(ValueError, match="feature names should match"):
        estimator.transform(frame[list("gfedcba")])


# -------------------------------------------------------- command line ---
CLI = ["--epochs", "1", "--latent-dim", "2", "--hidden-dims", "4", "--quiet"]


def write_garbage_npz(path):
    path.write_bytes(b"PK\x03\x04 truncated")


@pytest.mark.parametrize(
    "name, write, message",
    [
        ("empty.csv", lambda p: p.write_text(""), "has no data rows"),
        ("header.csv", lambda p: p.write_text("a,b,c\n"), "has no data rows"),
        ("bad.npy", lambda p: p.write_bytes(b"not numpy"), "not an array written by numpy.save"),
        ("bad.npz", write_garbage_npz, "not an archive written by numpy.savez"),
        ("complex.npy", lambda p: np.save(p, np.ones((5, 2)) * 1j), "complex values"),
    ],
)
def test_command_line_names_bad_files(tmp_path, capsys, name, write, message):
    write(tmp_path / name)
    assert main(["train", "--data", str(tmp_path / name), "--out", str(tmp_path / "run"), *CLI]) == 2
    assert message in capsys.readouterr().err


def test_command_line_checks_the_output_folder_before_training(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("pyro_sparse.interop.cli.train", lambda *args, **kwargs: pytest.fail("trained before checking --out"))
    (tmp_path / "a-file").write_text("")
    assert main(["train", "--n", "50", "--out", str(tmp_path / "a-file"), *CLI]) == 2
    assert "a-file" in capsys.readouterr().err


def test_command_line_names_bad_settings(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["train", "--hidden-dims", "50,x", "--out", str(tmp_path / "run")])
    assert "give comma-separated positive widths" in capsys.readouterr().err
    assert main(["train", "--n", "50", "--device", "tpu", "--out", str(tmp_path / "run"), *CLI]) == 2
    assert "device must be" in capsys.readouterr().err


# ---------------------------------------------------- data set loaders ---
@pytest.mark.parametrize(
    "load",
    [lambda: (synthetic_sparse_dgm(n=50).X, "gaussian"), lambda: (smiley(n=50).X, "bernoulli"),
     lambda: (load_digits_images().X, "gaussian")],
    ids=["synthetic", "smiley", "digits"],
)
def test_loaders_give_data_that_passes_validation(load):
    data, likelihood = load()
    matrix = as_matrix(data)
    check_values(matrix, likelihood)
    check_training_data(DataSummary.of(matrix), likelihood)


@pytest.mark.parametrize("arguments", [{"noise_variance": -1.0}, {"noise_variance": float("nan")}, {"n": 2.5}])
def test_synthetic_data_rejects_bad_arguments(arguments):
    with pytest.raises(ValueError):
        synthetic_sparse_dgm(**arguments)


# ------------------------------------------------------------ determinism ---
FAMILIES = [
    ("ssl_dgm", {}),
    ("ssl_dgm", {"mask_prior": "horseshoe"}),
    ("vae", {"schedule": Schedule(validation_fraction=0.2, early_stopping=2)}),
    ("vsc", {"latent_prior": "pseudo_inputs", "num_pseudo_inputs": 4}),
    ("vsc", {"decoder": "linear", "spike_estimator": "straight_through"}),
    ("tvsc", {"learn_threshold": True, "optimization": Optimization(num_particles=3, particle_reduction="max")}),
    ("oi_vae", {}),
]


def _states(fitted):
    return {**{f"model.{k}": v for k, v in fitted.model.state_dict().items()},
            **{f"guide.{k}": v for k, v in fitted.guide.state_dict().items()}}


@pytest.mark.parametrize("model, options", FAMILIES, ids=[f"{m}-{'-'.join(o) or 'default'}" for m, o in FAMILIES])
def test_same_seed_same_fit_on_cpu(X, model, options):
    def run(seed):
        return pyro_sparse.train(model, X, latent_dim=3, seed=seed, **{**TINY, "max_epochs": 3, "batch_size": 16},
                                 **options)

    first = run(7)
    # Whatever the global generators did in between must not matter.
    torch.manual_seed(123)
    np.random.seed(5)
    random.seed(1)
    second, other = run(7), run(8)
    states, again, different = _states(first), _states(second), _states(other)
    assert states.keys() == again.keys()
    for key in states:
        assert torch.equal(states[key], again[key]), key
    assert first.history_ == second.history_
    np.testing.assert_array_equal(first.transform(X), second.transform(X))
    assert any(not torch.equal(states[key], different[key]) for key in states)  # the seed is used


def test_same_seed_same_nmf(X):
    first, second = (pyro_sparse.train("nmf", np.abs(X), latent_dim=3, seed=4) for _ in range(2))
    np.testing.assert_array_equal(first.W_, second.W_)
    np.testing.assert_array_equal(first.transform(np.abs(X)), second.transform(np.abs(X)))


# -------------------------------------------------------- resource limits ---
def test_decoder_memory_estimate_bounds_the_saved_activations():
    """Activations autograd keeps for backward are within the estimate, and the estimate is not loose."""
    decoder = MaskedDecoder(40, 5, (30, 20), memory_budget_bytes=2**40)  # one chunk: nothing recomputed
    z, mask = torch.randn(64, 5), torch.randn(40, 5, requires_grad=True)
    saved = {}

    def pack(tensor):
        saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        decoder(z, mask)
    estimate = decoder.step_memory_bytes(64)
    assert sum(saved.values()) <= estimate <= 3 * sum(saved.values())


@pytest.mark.skipif(sparse_nn.available_memory_bytes("cpu") is None, reason="free memory is unknown on this system")
def test_a_step_that_cannot_fit_in_memory_is_refused_before_training(X, monkeypatch):
    monkeypatch.setattr("pyro_sparse.svi.fit", lambda *args, **kwargs: pytest.fail("training started"))
    # 60 points x 1000 particles x 2^20 hidden units: ~470 GiB for even one feature's activations.
    with pytest.raises(DecoderMemoryError, match=r"lower batch_size \(or num_particles"):
        pyro_sparse.train("ssl_dgm", X, **{**TINY, "batch_size": 60, "hidden_dims": (2**20,)},
                          optimization=Optimization(num_particles=1000))
    # A chunked decoder is refused too when the device has less free memory than one chunk needs.
    monkeypatch.setattr(sparse_nn, "available_memory_bytes", lambda device: 2**10)
    with pytest.raises(DecoderMemoryError, match=r"but cpu has 0\.0 GiB free"):
        pyro_sparse.train("ssl_dgm", X, **{**TINY, "batch_size": 60, "hidden_dims": (64, 64)})


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident set size from /proc")
def test_long_training_does_not_grow_memory(monkeypatch):
    """RSS at the start of each epoch stays flat after warm-up (a graph kept per step grows it ~0.16 MB/epoch)."""
    page = os.sysconf("SC_PAGE_SIZE")
    resident = []
    epoch_batches = Dataset.minibatches

    def recording(self, batch_size, generator=None, device="cpu", shuffle=True):
        if shuffle:  # the training pass, once per epoch
            with open("/proc/self/statm") as stream:
                resident.append(int(stream.read().split()[1]) * page)
        return epoch_batches(self, batch_size, generator, device, shuffle)

    monkeypatch.setattr(Dataset, "minibatches", recording)
    X = np.random.default_rng(0).normal(size=(128, 8)).astype(np.float32)
    pyro_sparse.train("ssl_dgm", X, latent_dim=3, hidden_dims=(64, 64), batch_size=64, max_epochs=200,
                      progress=False, device="cpu")
    assert len(resident) == 200
    growth = max(resident[60:]) - max(resident[30:60])
    assert growth < 8 * 2**20, f"resident memory grew {growth / 2**20:.1f} MiB over 140 epochs"


# ------------------------------------------------------------ data in large units ---
def test_data_in_large_units_trains_like_standardised_data(X):
    fitted = pyro_sparse.train("vae", X * 1e7, **{**TINY, "max_epochs": 2})
    assert np.isfinite(fitted.transform(X * 1e7)).all()


@pytest.mark.parametrize("options", [{"noise_nu": 0.0}, {"noise_xi": -1.0}, {"noise_nu": float("nan")},
                                     {"noise_xi": "1"}])
def test_noise_prior_options_must_be_positive_numbers(options):
    X = np.random.default_rng(0).normal(size=(30, 4)).astype(np.float32)
    with pytest.raises(ValueError, match=f"{next(iter(options))} must be a positive number"):
        pyro_sparse.train("ssl_dgm", X, latent_dim=2, max_epochs=1, progress=False, **options)


def test_the_noise_prior_is_checked_where_it_is_used_not_only_by_train():
    from pyro_sparse.priors.noise import calibrate_noise_prior

    with pytest.raises(ValueError, match="noise_nu must be a positive number"):
        calibrate_noise_prior(np.ones(5), nu=-3.0)
    for model in (pyro_sparse.models.VAE, pyro_sparse.models.SparseDGM, pyro_sparse.models.OIVAE):
        with pytest.raises(ValueError, match="noise_xi must be a positive number"):
            model(5, latent_dim=2, noise_xi=0.0)


@pytest.mark.parametrize("options", [{}, {"latent_prior": "normal"}, {"prior_covariance": np.eye(2)}])
def test_an_lkj_concentration_without_a_learned_correlation_is_an_error(options):
    X = np.random.default_rng(0).normal(size=(30, 4)).astype(np.float32)
    with pytest.raises(ValueError, match=r"lkj_concentration=50.0 acts only with learn_correlation in \[True\]"):
        pyro_sparse.train("vae", X, latent_dim=2, max_epochs=1, progress=False, lkj_concentration=50.0, **options)


@pytest.mark.parametrize("model", ["tvsc", "vsc"])
@pytest.mark.parametrize("options", [{"dictionary_penalty": 0.5}, {"shared_atom_norm": False}])
def test_linear_decoder_options_with_another_decoder_are_an_error(model, options):
    X = np.random.default_rng(0).normal(size=(30, 4)).astype(np.float32)
    with pytest.raises(ValueError, match=rf"{next(iter(options))}=.* acts only with decoder in \['linear'\]"):
        pyro_sparse.train(model, X, latent_dim=2, max_epochs=1, progress=False, **options)
    fitted = pyro_sparse.train(model, X, latent_dim=2, max_epochs=1, progress=False, decoder="linear", **options)
    assert fitted.model.linear_generator is not None
