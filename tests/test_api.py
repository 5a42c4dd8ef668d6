"""The user-facing API: train / FittedModel / save / load, data types and bad input."""

import os
import pickle
import re
import socket
import time
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import pyro_sparse
from pyro_sparse import Optimization, Schedule
from pyro_sparse.data import DataError
from pyro_sparse.data.synthetic import synthetic_sparse_dgm
from pyro_sparse.io.serialization import ModelFileError

QUICK = dict(latent_dim=3, max_epochs=2, batch_size=50, progress=False, hidden_dims=(8, 8))


@pytest.fixture(scope="module")
def data():
    return synthetic_sparse_dgm(n=200, rho=0.3, seed=0)


@pytest.fixture(scope="module")
def fitted(data):
    return pyro_sparse.train("ssl_dgm", data.X, **QUICK)


def test_fitted_attributes_have_documented_shapes(fitted, data):
    n, g = data.X.shape
    assert fitted.transform(data.X).shape == (n, 3)
    assert fitted.W_.shape == (g, 3)
    assert fitted.inclusion_probs_.shape == (g, 3)
    assert ((fitted.inclusion_probs_ >= 0) & (fitted.inclusion_probs_ <= 1)).all()
    assert fitted.eta_.shape == (3,)
    assert fitted.sigma2_.shape == (g,) and (fitted.sigma2_ > 0).all()
    assert len(fitted.history_["train_loss"]) == 2
    assert fitted.reconstruct(data.X).shape == (n, g)
    ll = fitted.heldout_log_likelihood(data.X[:20], num_samples=5)
    assert ll.shape == (20,) and np.isfinite(ll).all()
    assert len(fitted.top_features(2)) == 3


def test_numpy_torch_and_sparse_inputs_agree(data):
    a = pyro_sparse.train("vae", data.X, seed=3, **QUICK)
    b = pyro_sparse.train("vae", torch.as_tensor(data.X), seed=3, **QUICK)
    c = pyro_sparse.train("vae", sp.csr_matrix(data.X), seed=3, **QUICK)
    np.testing.assert_allclose(a.transform(data.X), b.transform(data.X), atol=1e-5)
    np.testing.assert_allclose(a.transform(data.X), c.transform(data.X), atol=1e-4)


def test_same_seed_same_result(data):
    a = pyro_sparse.train("ssl_dgm", data.X, seed=1, **QUICK)
    b = pyro_sparse.train("ssl_dgm", data.X, seed=1, **QUICK)
    np.testing.assert_array_equal(a.W_, b.W_)


@pytest.mark.parametrize("likelihood", ["multinomial", "bernoulli"])
def test_count_and_binary_likelihoods_train(likelihood):
    rng = np.random.default_rng(0)
    if likelihood == "multinomial":
        X = rng.poisson(3.0, size=(120, 10)) + np.eye(10)[rng.integers(0, 10, 120)]
    else:
        X = (rng.random((120, 10)) < 0.3).astype(float)
    fitted = pyro_sparse.train("ssl_dgm", X, likelihood=likelihood, **QUICK)
    assert np.isfinite(fitted.history_["train_loss"]).all()
    probabilities = fitted.reconstruct(X)
    assert ((probabilities >= 0) & (probabilities <= 1)).all()
    if likelihood == "multinomial":
        np.testing.assert_allclose(probabilities.sum(1), 1.0, atol=1e-5)
    with pytest.raises(AttributeError):
        fitted.sigma2_


def test_a_fit_that_switches_every_factor_off_says_so(data, monkeypatch):
    # A short fit can end with W all 0 (seen on MovieLens at 10-20 epochs): said, not left to an empty top_features.
    from pyro_sparse.svi import SVIModel

    fit_once = SVIModel._fit_once

    def zeroed(self, *args, **kwargs):
        fitted = fit_once(self, *args, **kwargs)
        if "W" in fitted.guide.unconstrained:
            with torch.no_grad():
                fitted.guide.unconstrained["W"].zero_()  # W's support is the real line: 0 is 0
        return fitted

    monkeypatch.setattr(SVIModel, "_fit_once", zeroed)
    with pytest.warns(UserWarning, match="every entry of W is 0 at the end of training.*train longer"):
        pyro_sparse.train("ssl_dgm", data.X, **QUICK)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pyro_sparse.train("vae", data.X, **QUICK)  # no mask, nothing to say


def test_save_load_roundtrip(fitted, data, tmp_path):
    path = tmp_path / "model.pt"
    fitted.save(path)
    loaded = pyro_sparse.load(path)
    np.testing.assert_array_equal(loaded.W_, fitted.W_)
    np.testing.assert_array_equal(loaded.eta_, fitted.eta_)
    np.testing.assert_allclose(loaded.transform(data.X), fitted.transform(data.X))
    assert loaded.history_ == fitted.history_


def test_a_file_loads_as_trained_after_defaults_change(fitted, data, tmp_path, monkeypatch):
    # The file records every option, defaults included: the registry's priors and
    # the constructors' values.  Without that, the load below would build the
    # SSL prior with λ0 = 99 and the model with a learned latent correlation.
    from pyro_sparse import registry
    from pyro_sparse.priors import MASK_PRIORS

    recorded = fitted.config["hyperparameters"]
    assert recorded["latent_prior"] == "normal" and recorded["mask_prior"] == "ssl" and recorded["lambda0"] == 10.0
    assert set(registry.get_entry("ssl_dgm").option_names()) <= set(recorded)
    fitted.save(tmp_path / "model.pt")
    ssl = MASK_PRIORS["ssl"].__init__
    monkeypatch.setattr(ssl, "__defaults__", (99.0, *ssl.__defaults__[1:]))
    monkeypatch.setattr(registry.get_entry("ssl_dgm"), "latent_prior", "correlated")
    loaded = pyro_sparse.load(tmp_path / "model.pt")
    assert loaded.model.site_priors["W"].lambda0 == 10.0
    np.testing.assert_array_equal(loaded.transform(data.X), fitted.transform(data.X))
    assert pyro_sparse.train("ssl_dgm", data.X, **QUICK).model.site_priors["W"].lambda0 == 99.0  # the change is live


def test_validation_and_early_stopping(data):
    fitted = pyro_sparse.train(
        "vae", data.X, schedule=Schedule(validation_fraction=0.25, early_stopping=1), **{**QUICK, "max_epochs": 30}
    )
    history = fitted.history_
    assert len(history["validation_loss"]) == len(history["train_loss"]) >= 2
    assert np.isfinite(history["validation_loss"]).all()
    # Each epoch's validation uses the same draws (common random numbers), whatever the RNG's state, and leaves
    # the training stream alone.
    from pyro_sparse.data import Dataset
    from pyro_sparse.infer.loop import mean_negative_elbo

    validation = Dataset.from_data(data.X[:40], "gaussian")
    state = torch.get_rng_state()
    first = mean_negative_elbo(fitted.model, fitted.guide, validation, 10, "cpu", seed=0)
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(123)
    assert mean_negative_elbo(fitted.model, fitted.guide, validation, 10, "cpu", seed=0) == first
    assert mean_negative_elbo(fitted.model, fitted.guide, validation, 10, "cpu", seed=1) != first
    with pytest.raises(ValueError, match="early_stopping needs validation data"):
        Schedule(early_stopping=3)
    with pytest.raises(TypeError, match="Schedule"):
        pyro_sparse.train("vae", data.X, early_stopping=3, **QUICK)


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "X, likelihood, message",
    [
        (np.array([[1.0, np.nan], [0.0, 1.0]]), "gaussian", "NaN or infinite"),
        (np.array([[1.0, np.inf], [0.0, 1.0]]), "gaussian", "NaN or infinite"),
        (np.ones(5), "gaussian", "2-D"),
        (np.ones((0, 4)), "gaussian", "empty"),
        (np.array([["a", "b"], ["c", "d"]]), "gaussian", "numeric"),
        (np.array([[1.0, -2.0], [3.0, 1.0]]), "multinomial", "negative"),
        (np.array([[1.5, 2.0], [3.0, 1.0]]), "multinomial", "non-integer"),
        (np.array([[0.0, 0.0], [3.0, 1.0]]), "multinomial", "no counts"),
        (np.array([[0.0, 2.0], [1.0, 1.0]]), "bernoulli", r"outside \{0, 1\} in 1 row \(e.g. row 0\)"),
    ],
)
def test_bad_data_is_named(X, likelihood, message):
    with pytest.raises(DataError, match=message):
        pyro_sparse.train("ssl_dgm", X, likelihood=likelihood, **QUICK)


def test_counts_beyond_float32_integers_are_warned_about():
    """2^24 + 1 becomes 2^24 in float32: such counts are rounded, and a fraction there passes as a count."""
    import warnings

    from pyro_sparse.data.validation import as_matrix, check_values

    for counts in (np.array([[2.0**24 + 1, 2.0], [3.0, 1.0]]), sp.csr_matrix(np.array([[0.0, 2.0**24 + 0.5], [3.0, 1.0]]))):
        with pytest.warns(UserWarning, match=r"2\^24\) or more"):
            check_values(as_matrix(counts), "poisson", name="X")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_values(as_matrix(np.array([[2.0**24 - 1, 2.0], [3.0, 1.0]])), "poisson", name="X")
        check_values(as_matrix(np.array([[2.0**25, 2.0], [3.0, 1.0]])), "gaussian", name="X")


def test_bad_arguments_are_named(data):
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        pyro_sparse.train("nope", data.X)
    with pytest.raises(ValueError, match="unknown likelihood"):
        pyro_sparse.train("ssl_dgm", data.X, likelihood="gamma")
    with pytest.raises(TypeError, match=r"no option\(s\) \['lamda0'\] \('lamda0': did you mean 'lambda0'\?\)"):
        pyro_sparse.train("ssl_dgm", data.X, lamda0=3.0, **QUICK)
    # train's own arguments and the settings are offered too, the settings with where they belong.
    for model in ("ssl_dgm", "nmf"):
        with pytest.raises(TypeError, match="'max_epoch': did you mean 'max_epochs'"):
            pyro_sparse.train(model, data.X, max_epoch=1)
        with pytest.raises(TypeError, match="'laten_dim': did you mean 'latent_dim'"):
            pyro_sparse.train(model, data.X, laten_dim=3)
        with pytest.raises(TypeError, match=r"did you mean 'kl_warmup_epochs'\? \('kl_warmup_epochs' is a setting of "
                                            r"Schedule"):
            pyro_sparse.train(model, data.X, kl_warmup_epoch=3)
        # Other libraries' names for train's arguments.
        for other, ours in (("epochs", "max_epochs"), ("learning_rate", "lr"), ("n_components", "latent_dim"),
                            ("random_state", "seed")):
            with pytest.raises(TypeError, match=f"'{other}': did you mean '{ours}'"):
                pyro_sparse.train(model, data.X, **{other: 1})
    with pytest.raises(DataError, match=r"data is a path \('cells.csv'\), not data: read it first"):
        pyro_sparse.train("ssl_dgm", "cells.csv")


def test_a_registry_entry_whose_fit_takes_no_keywords_still_trains(data, monkeypatch):
    from pyro_sparse import registry
    from pyro_sparse.baselines.nmf import NMF

    class Entry(NMF):
        def fit(self, name, dataset, latent_dim, settings, hyper):  # the protocol before `keywords`
            return super().fit(name, dataset, latent_dim, settings, hyper)

    monkeypatch.setitem(registry.MODELS, "my_nmf", Entry())
    assert pyro_sparse.train("my_nmf", np.abs(data.X), latent_dim=2).W_.shape == (data.X.shape[1], 2)
    with pytest.raises(ValueError, match="latent_dim"):
        pyro_sparse.train("ssl_dgm", data.X, **{**QUICK, "latent_dim": 0})
    with pytest.raises(DataError, match="needs data"):
        pyro_sparse.train("ssl_dgm")


def test_sample_counts_are_checked(fitted, data):
    for method in (fitted.sample_posterior, fitted.heldout_log_likelihood):
        for bad in (0, -1, 2.5):
            with pytest.raises(ValueError, match=f"num_samples must be a positive integer, got {bad}"):
                method(data.X, num_samples=bad)


def test_a_bad_device_is_named_as_the_callers_not_the_files(fitted, tmp_path):
    fitted.save(tmp_path / "model.pt")
    with pytest.raises(ValueError, match="device must be 'auto', 'cpu', 'cuda'") as error:
        pyro_sparse.load(tmp_path / "model.pt", device="gpu")
    assert not isinstance(error.value, pyro_sparse.io.serialization.ModelFileError)


def test_a_gpu_that_is_not_there_or_full_is_not_called_a_damaged_file(fitted, tmp_path, monkeypatch):
    fitted.save(tmp_path / "model.pt")
    # A machine with one GPU: cuda:7 is named before anything is built.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="device='cuda:7' was requested but this machine has 1 GPU"):
        pyro_sparse.load(tmp_path / "model.pt", device="cuda:7")
    # Moving the loaded model to the device fails (out of memory, say): that error, not "does not match".
    to = torch.nn.Module.to

    def full(module, *args, **kwargs):
        if torch.device(args[0]).type == "meta":
            raise torch.OutOfMemoryError("CUDA out of memory")
        return to(module, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", full)
    with pytest.raises(torch.OutOfMemoryError, match="out of memory"):
        pyro_sparse.load(tmp_path / "model.pt", device="meta")


def test_transform_checks_the_number_of_features(fitted):
    with pytest.raises(DataError, match="has 6 features but the model was trained on 7"):
        fitted.transform(np.zeros((3, 6)))


def test_corrupt_and_altered_files_are_refused(fitted, tmp_path):
    path = tmp_path / "model.pt"
    fitted.save(path)
    raw = path.read_bytes()
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ModelFileError, match="not a readable"):
        pyro_sparse.load(truncated)
    # Change one tensor and save it with torch.save: loadable, but the checksum fails.
    payload = torch.load(path, weights_only=True)
    payload["states"]["guide"]["unconstrained.W"] += 1.0
    altered = tmp_path / "altered.pt"
    torch.save(payload, altered)
    with pytest.raises(ModelFileError, match="checksum"):
        pyro_sparse.load(altered)
    payload = torch.load(path, weights_only=True)
    payload["format_version"] = 99
    future = tmp_path / "future.pt"
    torch.save(payload, future)
    with pytest.raises(ModelFileError, match="format version 99"):
        pyro_sparse.load(future)
    payload["format_version"] = "1"  # the right number as text: named as text
    torch.save(payload, future)
    with pytest.raises(ModelFileError, match="format version '1', this library reads version 1"):
        pyro_sparse.load(future)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_file_with_non_finite_parameters_is_refused_even_with_a_valid_checksum(fitted, tmp_path, value):
    from pyro_sparse.io import serialization

    path = tmp_path / "model.pt"
    fitted.save(path)
    config, states = serialization.read(path)
    states["guide"]["unconstrained.W"][0, 0] = value  # rewritten with a fresh checksum
    serialization.write(path, config, states)
    with pytest.raises(ModelFileError, match=r"holds NaN or infinite parameters \(guide.unconstrained.W\)"):
        pyro_sparse.load(path)


@pytest.mark.parametrize("states", [torch.zeros(3), [1], {"guide": torch.zeros(2)}, {"guide": {"W": [1.0]}},
                                    {"guide": {"W": torch.eye(2).to_sparse()}}])
def test_files_whose_states_are_not_tensors_by_name_fail_the_checksum(fitted, tmp_path, states):
    path = tmp_path / "model.pt"
    fitted.save(path)
    payload = torch.load(path, weights_only=True)
    payload["states"] = states  # edited without the checksum
    torch.save(payload, path)
    with pytest.raises(ModelFileError, match="fails its checksum"):
        pyro_sparse.load(path)


@pytest.mark.parametrize("path", [5, None, ["model.pt"]])
def test_a_path_that_is_not_a_path_is_named(fitted, path):
    for call in (fitted.save, pyro_sparse.load):
        with pytest.raises(TypeError, match=r"a file path is a str or os.PathLike, got " + re.escape(repr(path))):
            call(path)
    if path is not None:  # None is Checkpointing's "no file"
        for name in ("path", "resume_from"):
            with pytest.raises(ValueError, match=f"{name} must be a file path"):
                pyro_sparse.Checkpointing(**{name: path})


def test_save_through_a_link_replaces_its_target_and_takes_bytes_paths(fitted, tmp_path):
    target = tmp_path / "runs" / "model.pt"
    fitted.save(target)
    before = target.read_bytes()
    link = tmp_path / "latest.pt"
    link.symlink_to(target)
    fitted.history_["train_loss"].append(0.0)  # another model file
    try:
        fitted.save(os.fsencode(link))
    finally:
        fitted.history_["train_loss"].pop()
    assert link.is_symlink() and target.read_bytes() != before
    assert pyro_sparse.load(os.fsencode(link)).history_["train_loss"][-1] == 0.0


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned-by-pickle",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_malicious_pickle_is_refused_without_running(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pt"
    with open(path, "wb") as stream:
        pickle.dump({"format": "pyro_sparse.model", "payload": _Exploit()}, stream)
    with pytest.raises(ModelFileError, match="not a readable"):
        pyro_sparse.load(path)
    assert not (tmp_path / "pwned-by-pickle").exists()


def test_save_is_atomic(fitted, tmp_path, monkeypatch):
    path = tmp_path / "model.pt"
    fitted.save(path)
    before = path.read_bytes()

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        fitted.save(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]


@pytest.mark.skipif(os.name != "posix", reason="orphans are found by process id on POSIX systems")
def test_a_writer_killed_before_its_rename_leaves_no_partial_file_behind(fitted, tmp_path, monkeypatch):
    # The next write of the same file removes a partial file of this user's, untouched for an hour, whose process
    # no longer runs; it keeps one of a running process, a recent one (its writer may run in another process
    # namespace), one of another file, and one whose name only starts like its own.  Which process ids run is
    # decided here, not by the machine (a real dead pid may be reused).
    dead, running = 4_000_001, 4_000_002

    def kill(pid, signal):
        if pid != running:
            raise ProcessLookupError(pid)

    monkeypatch.setattr("pyro_sparse.io.serialization.os.kill", kill)
    host, hex32 = socket.gethostname(), "0" * 32
    orphan = tmp_path / f".model.pt.{host}.{dead}.{hex32}.partial"
    kept = [tmp_path / f".model.pt.{host}.{running}.{hex32}.partial",
            tmp_path / f".other.pt.{host}.{dead}.{hex32}.partial",
            tmp_path / f".model.pt.{host}.{dead}.{host}.{dead}.{hex32}.partial"]
    recent = tmp_path / f".model.pt.{host}.{dead}.{'1' * 32}.partial"
    for partial in (orphan, *kept, recent):
        partial.write_bytes(b"half a model")
        if partial != recent:
            os.utime(partial, (time.time() - 7200, time.time() - 7200))
    fitted.save(tmp_path / "model.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["model.pt", recent.name, *(p.name for p in kept)])


def test_constant_feature_is_named_for_gaussian(data):
    X = data.X.copy()
    X[:, 2] = 4.0
    with pytest.raises(DataError, match=r"constant.*\[2\]"):
        pyro_sparse.train("ssl_dgm", X, **QUICK)


def test_values_beyond_float32_are_named():
    X = np.random.default_rng(0).normal(size=(20, 3))
    X[0, 0] = 1e300
    with pytest.raises(DataError, match="too large for float32"):
        pyro_sparse.train("vae", X, **QUICK)


def test_numpy_scalar_settings_can_be_saved(data, tmp_path):
    schedule = Schedule(validation_fraction=np.float32(0.25), early_stopping=np.int64(2))
    fitted = pyro_sparse.train(
        "ssl_dgm", data.X, **{**QUICK, "batch_size": np.int64(50)}, lambda0=np.float32(12.0), schedule=schedule
    )
    fitted.save(tmp_path / "m.pt")
    config = pyro_sparse.load(tmp_path / "m.pt").config
    assert config["hyperparameters"]["lambda0"] == 12.0 and config["training"]["early_stopping"] == 2


@pytest.mark.parametrize(
    "override, message",
    [
        ({"max_epochs": 0}, "max_epochs"),
        ({"lr": 0.0}, "lr must be positive"),
        ({"lambda0": 0.5, "lambda1": 1.0}, "at least the slab rate"),
        ({"prior_covariance": [[1.0, 2.0], [2.0, 1.0]], "latent_dim": 2}, "positive definite"),
    ],
)
def test_bad_settings_are_named(data, override, message):
    with pytest.raises(ValueError, match=message):
        pyro_sparse.train("ssl_dgm", data.X, **{**QUICK, **override})


def test_tiny_validation_fraction_keeps_one_point(data):
    fitted = pyro_sparse.train(
        "vae", data.X[:50], schedule=Schedule(validation_fraction=0.001, early_stopping=2), **QUICK
    )
    assert len(fitted.history_["validation_loss"]) == 2


def test_divergence_stops_with_a_clear_error(data, monkeypatch):
    from pyro_sparse.infer.loop import TrainingDivergedError

    original = torch.optim.Adam.step

    def poisoned_step(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        with torch.no_grad():
            self.param_groups[0]["params"][0].fill_(float("nan"))
        return result

    monkeypatch.setattr(torch.optim.Adam, "step", poisoned_step)
    with pytest.raises(TrainingDivergedError, match="diverged at epoch 0"):
        pyro_sparse.train("ssl_dgm", data.X, **QUICK)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.gpu
def test_cuda_training_matches_the_cpu_api(data):
    fitted = pyro_sparse.train("ssl_dgm", data.X, device="cuda", **QUICK)
    assert fitted.device.type == "cuda"
    assert fitted.transform(data.X).shape == (len(data.X), 3)
    assert np.isfinite(fitted.heldout_log_likelihood(data.X[:10], 3)).all()


@pytest.mark.parametrize("model, reduction", [("ssl_dgm", "max"), ("vae", "mean"), ("vae", "max")])
def test_particles_and_max_elbo_through_train(data, model, reduction):
    optimization = Optimization(num_particles=3, particle_reduction=reduction)
    fitted = pyro_sparse.train(model, data.X, optimization=optimization, **QUICK)
    assert np.isfinite(fitted.history_["train_loss"]).all()
    assert fitted.config["training"]["num_particles"] == 3
    with pytest.raises(ValueError, match="particle_reduction must be 'mean' or 'max'"):
        Optimization(particle_reduction="median")
    with pytest.raises(TypeError, match="Optimization"):
        pyro_sparse.train(model, data.X, particle_reduction="median", **QUICK)


def test_history_becomes_a_dataframe_by_epoch():
    X = synthetic_sparse_dgm(n=100, seed=0).X
    frame = pyro_sparse.train("vae", X, max_epochs=3, progress=False, hidden_dims=(8,)).history_frame()
    assert list(frame.columns) == ["train_loss"] and frame.index.name == "epoch" and len(frame) == 3
    held = pyro_sparse.train("vae", X, max_epochs=2, schedule=Schedule(validation_fraction=0.2), progress=False,
                             hidden_dims=(8,))
    assert list(held.history_frame().columns) == ["train_loss", "validation_loss"]


def test_a_bare_source_folder_is_named_not_a_missing_submodule(tmp_path):
    """Python started in a checkout's root finds pyro_sparse/ without models/ and guides/ (installed beside it)."""
    import shutil
    import subprocess
    import sys

    shutil.copytree(os.path.dirname(pyro_sparse.__file__), tmp_path / "pyro_sparse")
    code = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()];"
            f"sys.path.insert(0, {str(tmp_path)!r}); import pyro_sparse")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert completed.returncode != 0
    assert "only found once installed: install it with `pip install -e .`" in completed.stderr
