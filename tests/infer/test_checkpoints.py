"""Divergence handling, checkpoints and resume (pyro_sparse.infer.checkpoints through train())."""

import io
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import asdict, replace

import numpy as np
import pytest
import torch

import pyro_sparse
from pyro_sparse import Checkpointing, Optimization, Schedule
from pyro_sparse.data.synthetic import synthetic_sparse_dgm
from pyro_sparse.infer import checkpoints, loop
from pyro_sparse.infer.checkpoints import CheckpointError
from pyro_sparse.infer.loop import TrainingDivergedError
from pyro_sparse.io import serialization

# 200 points in batches of 50: 4 steps per epoch.  The KL warm-up is given
# explicitly because its default depends on max_epochs.
WARMUP = Schedule(kl_warmup_epochs=2)
TINY = dict(latent_dim=3, batch_size=50, hidden_dims=(8,), schedule=WARMUP, progress=False)


# Bit-for-bit comparisons need the same reduction order in every run.
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def X():
    return synthetic_sparse_dgm(n=200, rho=0.3, seed=0).X


def states(fitted):
    return {**{f"model.{k}": v for k, v in fitted.model.state_dict().items()},
            **{f"guide.{k}": v for k, v in fitted.guide.state_dict().items()}}


def assert_same_state(a, b):
    a, b = states(a), states(b)
    assert a.keys() == b.keys()
    different = [key for key in a if not torch.equal(a[key], b[key])]
    assert not different, f"differ: {different}"


def interrupt_at_step(monkeypatch, step):
    """Make the ``step``-th optimizer step raise KeyboardInterrupt, as a Ctrl-C would."""
    original, calls = torch.optim.Adam.step, [0]

    def step_or_stop(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == step:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", step_or_stop)


def poison_steps(monkeypatch, steps):
    """Fill a parameter with NaN right after each optimizer step whose number is in ``steps``."""
    original, calls = torch.optim.Adam.step, [0]

    def poisoned_step(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        calls[0] += 1
        if calls[0] in steps:
            with torch.no_grad():
                self.param_groups[0]["params"][0].fill_(float("nan"))
        return result

    monkeypatch.setattr(torch.optim.Adam, "step", poisoned_step)


# ------------------------------------------------------------------ resume


RUNS = {
    # SSL prior: E-step buffers, the proximal step's gradient average, per-group lr with decay.
    "ssl_dgm": dict(model="ssl_dgm", optimization=Optimization(global_lr=0.02, lr_decay=0.9)),
    # Horseshoe hyperparameter sweeps; a validation split with early stopping (best state).
    "horseshoe": dict(model="ssl_dgm", mask_prior="horseshoe",
                      schedule=replace(WARMUP, validation_fraction=0.2, early_stopping=5)),
    # Spike-and-slab codes with slope / pre-training schedules and two particles.
    "vsc": dict(model="vsc", slope_warmup_epochs=2, pretrain_epochs=1, optimization=Optimization(num_particles=2)),
    # Thresholded codes with the scale warm-up schedule and a linear dictionary.
    "tvsc": dict(model="tvsc", decoder="linear", optimization=Optimization(global_lr=0.05)),
    # Group lasso on the latent-to-group maps.
    "oi_vae": dict(model="oi_vae", lam=50.0),
}


@pytest.mark.parametrize("run", RUNS, ids=list(RUNS))
def test_interrupted_and_resumed_run_equals_uninterrupted(X, run, tmp_path, monkeypatch):
    settings = {**TINY, "max_epochs": 3, **RUNS[run]}
    uninterrupted = pyro_sparse.train(data=X, **settings)
    path = tmp_path / "run.ckpt"
    with monkeypatch.context() as patch:
        interrupt_at_step(patch, 7)  # the third step of the second epoch
        with pytest.raises(KeyboardInterrupt):
            pyro_sparse.train(data=X, checkpointing=Checkpointing(path=path), **settings)
    resumed = pyro_sparse.train(data=X, checkpointing=Checkpointing(resume_from=path), **settings)
    assert_same_state(resumed, uninterrupted)
    assert resumed.history_ == uninterrupted.history_


def test_checkpoint_holds_the_whole_training_state(X, tmp_path):
    path = tmp_path / "run.ckpt"
    pyro_sparse.train("ssl_dgm", X, max_epochs=3, checkpointing=Checkpointing(path=path, every=2), **TINY)
    payload = torch.load(path, weights_only=True)  # tensors and plain containers only
    assert payload["format"] == "pyro_sparse.checkpoint"
    stored = payload["states"]
    assert {"site_priors.W.eta", "site_priors.W.inclusion_probs", "site_priors.W.num_steps"} <= stored["model"].keys()
    assert {"unconstrained.W", "unconstrained.sigma2"} <= stored["guide"].keys()
    assert {"torch", "numpy", "python", "minibatches"} <= stored["rng"].keys()
    assert {key.split(".", 1)[1] for key in stored["optimizer"]} == {"step", "exp_avg", "exp_avg_sq"}
    config, _ = serialization.read(path, checkpoints.CHECKPOINT_FILE)
    loop = config["loop"]
    assert loop["epoch"] == 3 and loop["step"] == 12  # written at the end, not only every 2 epochs
    assert len(loop["history"]["train_loss"]) == 3
    assert [group["lr"] for group in config["optimizer_groups"]] == [0.01, 0.01]
    assert config["run"]["model"] == "ssl_dgm"


CHILD = """
import json, os, sys, time
import torch
import pyro_sparse
from pyro_sparse import Checkpointing, Schedule
from pyro_sparse.data.synthetic import synthetic_sparse_dgm

torch.set_num_threads(1)
checkpoint, marker, settings = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
settings["schedule"] = Schedule(**settings["schedule"])
original, steps_after_checkpoint = torch.optim.Adam.step, [0]

def step(self, *args, **kwargs):
    # Numerically the same step; once a checkpoint exists the run slows down
    # and, after one more step, tells the test it may kill it mid-epoch.
    result = original(self, *args, **kwargs)
    if os.path.exists(checkpoint):
        steps_after_checkpoint[0] += 1
        if steps_after_checkpoint[0] == 2:
            open(marker, "w").close()
        time.sleep(0.5)
    return result

torch.optim.Adam.step = step
X = synthetic_sparse_dgm(n=200, rho=0.3, seed=0).X
pyro_sparse.train("ssl_dgm", X, checkpointing=Checkpointing(path=checkpoint, every=2), **settings)
"""


def test_sigkill_mid_epoch_then_resume_equals_uninterrupted(X, tmp_path):
    settings = {**TINY, "max_epochs": 5}
    checkpoint, marker, log = tmp_path / "run.ckpt", tmp_path / "killed-here", tmp_path / "child.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with open(log, "w") as output:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(checkpoint), str(marker),
             json.dumps({**settings, "schedule": asdict(settings["schedule"])})],
            env=env, stdout=output, stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 120
            while not marker.exists() and child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert marker.exists(), f"the child never reached the kill point:\n{log.read_text()}"
            child.send_signal(signal.SIGKILL)
        finally:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    config, _ = serialization.read(checkpoint, checkpoints.CHECKPOINT_FILE)
    assert config["loop"]["epoch"] == 2  # killed two steps into the third epoch
    resumed = pyro_sparse.train("ssl_dgm", X, checkpointing=Checkpointing(resume_from=checkpoint), **settings)
    uninterrupted = pyro_sparse.train("ssl_dgm", X, **settings)
    assert_same_state(resumed, uninterrupted)
    assert resumed.history_ == uninterrupted.history_


def test_crash_while_writing_keeps_the_previous_checkpoint(X, tmp_path, monkeypatch):
    path = tmp_path / "run.ckpt"
    pyro_sparse.train("ssl_dgm", X, max_epochs=2, checkpointing=Checkpointing(path=path), **TINY)
    before = path.read_bytes()
    real_save = torch.save

    def write_half_then_fail(obj, stream, *args, **kwargs):
        buffer = io.BytesIO()
        real_save(obj, buffer, *args, **kwargs)
        stream.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        stream.flush()
        raise OSError("No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(torch, "save", write_half_then_fail)
        # A checkpoint that cannot be written costs the checkpoint, not the run.
        with pytest.warns(UserWarning, match=r"checkpoint was not written \(No space left on device\); training goes"):
            finished = pyro_sparse.train("ssl_dgm", X, max_epochs=3,
                                         checkpointing=Checkpointing(path=path, resume_from=path), **TINY)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["run.ckpt"]
    # The old checkpoint still resumes, and extending a run to 3 epochs equals running 3.
    resumed = pyro_sparse.train("ssl_dgm", X, max_epochs=3, checkpointing=Checkpointing(resume_from=path), **TINY)
    uninterrupted = pyro_sparse.train("ssl_dgm", X, max_epochs=3, **TINY)
    assert_same_state(resumed, uninterrupted)
    assert_same_state(finished, uninterrupted)


def test_a_checkpoint_of_another_run_is_refused(X, tmp_path):
    path = tmp_path / "run.ckpt"
    fitted = pyro_sparse.train("ssl_dgm", X, max_epochs=1, checkpointing=Checkpointing(path=path), **TINY)
    cases = [
        (dict(model="vae"), "is of model 'ssl_dgm', this run trains 'vae'"),
        (dict(data=X[:, :6]), "data with 7 features, this data has 6"),
        (dict(data=X[:150]), "200 training points, this run has 150"),
        (dict(schedule=replace(WARMUP, validation_fraction=0.2)), "validation_fraction"),
        (dict(lambda0=20.0), r"different settings \(lambda0: 10.0 in the checkpoint, 20.0 now\)"),
        (dict(seed=1, latent_dim=4), r"different settings \(latent_dim: 3 in the checkpoint, 4 now; seed: 0 in "
                                    r"the checkpoint, 1 now\)"),
        (dict(data=X + 1.0), "different data of the same shape"),
        # Two rows swapped: the same feature means and variances, another run.
        (dict(data=X[np.r_[1, 0, 2:len(X)]]), "different data with the same feature means and variances"),
    ]
    for change, message in cases:
        arguments = {"model": "ssl_dgm", "data": X, "max_epochs": 2, **TINY, **change}
        with pytest.raises(CheckpointError, match=message):
            pyro_sparse.train(checkpointing=Checkpointing(resume_from=path), **arguments)
    fitted.save(tmp_path / "model.pt")
    with pytest.raises(CheckpointError, match="not a pyro_sparse training checkpoint"):
        pyro_sparse.train("ssl_dgm", X, checkpointing=Checkpointing(resume_from=tmp_path / "model.pt"), max_epochs=2,
                          **TINY)
    payload = torch.load(path, weights_only=True)
    payload["states"]["model"]["site_priors.W.eta"] += 0.1
    torch.save(payload, tmp_path / "altered.ckpt")
    with pytest.raises(CheckpointError, match="checksum"):
        pyro_sparse.train("ssl_dgm", X, checkpointing=Checkpointing(resume_from=tmp_path / "altered.ckpt"),
                          max_epochs=2, **TINY)
    with pytest.raises(FileNotFoundError, match="no pyro_sparse training checkpoint"):
        pyro_sparse.train("ssl_dgm", X, checkpointing=Checkpointing(resume_from=tmp_path / "missing.ckpt"),
                          max_epochs=2, **TINY)


def test_a_run_that_stopped_early_resumes_to_the_same_model(X, tmp_path):
    # Relaunching a finished job must return its model, not train on past the stop.
    settings = {**TINY, "max_epochs": 30, "schedule": replace(WARMUP, validation_fraction=0.2, early_stopping=1)}
    path = tmp_path / "run.ckpt"
    stopped = pyro_sparse.train("vae", X, checkpointing=Checkpointing(path=path), **settings)
    assert len(stopped.history_["train_loss"]) < 30
    resumed = pyro_sparse.train("vae", X, checkpointing=Checkpointing(resume_from=path), **settings)
    assert resumed.history_ == stopped.history_
    assert_same_state(resumed, stopped)
    # Early stopping is a setting of the run: adding it on resume would miss the best epoch before the checkpoint.
    without = {**settings, "schedule": replace(WARMUP, validation_fraction=0.2)}
    pyro_sparse.train("vae", X, checkpointing=Checkpointing(path=tmp_path / "plain.ckpt"), **without)
    with pytest.raises(CheckpointError, match=r"early_stopping: None in the checkpoint, 1 now"):
        pyro_sparse.train("vae", X, checkpointing=Checkpointing(resume_from=tmp_path / "plain.ckpt"), **settings)


def test_a_checkpoint_path_that_cannot_be_written_is_named_before_training(X, tmp_path, monkeypatch):
    (tmp_path / "results").write_text("a file, not a folder")
    monkeypatch.setattr(torch.optim.Adam, "step", lambda *args, **kwargs: pytest.fail("trained first"))
    for path in (tmp_path / "results" / "run.ckpt", tmp_path):
        with pytest.raises(OSError, match="cannot write|is a folder"):
            pyro_sparse.train("vae", X, max_epochs=1, checkpointing=Checkpointing(path=path), **TINY)


def test_a_checkpoint_path_holding_a_model_or_another_file_is_refused_before_training(X, tmp_path, monkeypatch):
    # Checkpoints replace the file at their path: a saved model (or any other file) there must survive.
    fitted = pyro_sparse.train("vae", X, max_epochs=1, **TINY)
    fitted.save(tmp_path / "model.pt")
    (tmp_path / "notes.txt").write_text("results")
    saved = {name: (tmp_path / name).read_bytes() for name in ("model.pt", "notes.txt")}
    with monkeypatch.context() as patched:
        patched.setattr(torch.optim.Adam, "step", lambda *args, **kwargs: pytest.fail("trained first"))
        for name in saved:
            with pytest.raises(CheckpointError, match=f"{name}.*not a pyro_sparse checkpoint.*another path"):
                pyro_sparse.train("vae", X, max_epochs=1, checkpointing=Checkpointing(path=tmp_path / name), **TINY)
    assert {name: (tmp_path / name).read_bytes() for name in saved} == saved
    # A checkpoint there (an earlier run's, of another model even) is the path's own file: replaced.
    pyro_sparse.train("vsc", X, max_epochs=1, checkpointing=Checkpointing(path=tmp_path / "run.ckpt"), **TINY)
    pyro_sparse.train("vae", X, max_epochs=2, checkpointing=Checkpointing(path=tmp_path / "run.ckpt"), **TINY)
    config, _ = serialization.read(tmp_path / "run.ckpt", checkpoints.CHECKPOINT_FILE)
    assert config["run"]["model"] == "vae"
    # A dangling link is written through (its target is new), and a bytes path is a path.
    (tmp_path / "latest.ckpt").symlink_to(tmp_path / "runs.ckpt")
    pyro_sparse.train("vae", X, max_epochs=1, checkpointing=Checkpointing(path=os.fsencode(tmp_path / "latest.ckpt")),
                      **TINY)
    assert (tmp_path / "latest.ckpt").is_symlink() and (tmp_path / "runs.ckpt").is_file()


def test_saving_keeps_the_files_permissions(X, tmp_path):
    # The temporary file is private (mkstemp: 0600); the saved model must not be.
    fitted = pyro_sparse.train("vae", X, max_epochs=1, **TINY)
    umask = os.umask(0o022)
    try:
        fitted.save(tmp_path / "new.pt")
        assert (tmp_path / "new.pt").stat().st_mode & 0o777 == 0o644
        (tmp_path / "shared.pt").write_bytes(b"")
        os.chmod(tmp_path / "shared.pt", 0o664)
        fitted.save(tmp_path / "shared.pt")
        assert (tmp_path / "shared.pt").stat().st_mode & 0o777 == 0o664
    finally:
        os.umask(umask)


def test_extending_a_run_keeps_its_kl_warmup(X, tmp_path):
    # The default KL warm-up is max_epochs / 4: extending a 4-epoch run to 8 with the default would restart it
    # at epoch 4 (the KL weight back to 1/2, a threshold warm-up back to dense codes), so it is refused, with
    # the setting that keeps the run's schedule.
    path = tmp_path / "run.ckpt"
    options = {**TINY, "schedule": Schedule()}
    pyro_sparse.train("ssl_dgm", X, max_epochs=4, checkpointing=Checkpointing(path=path), **options)
    with pytest.raises(CheckpointError, match=r"lasts 1 epochs; this one's would last 2 .*kl_warmup_epochs=1\)"):
        pyro_sparse.train("ssl_dgm", X, max_epochs=8, checkpointing=Checkpointing(resume_from=path), **options)
    extended = pyro_sparse.train("ssl_dgm", X, max_epochs=8, checkpointing=Checkpointing(resume_from=path),
                                 **{**TINY, "schedule": Schedule(kl_warmup_epochs=1)})
    assert len(extended.history_["train_loss"]) == 8


def test_extending_a_run_keeps_the_epoch_its_feature_subsampling_ends(tmp_path):
    # feature_subsample_end_fraction places the end at a fraction of max_epochs: extending 2 epochs to 4 with
    # the same fraction would move it (1 -> 2), so it is refused; a fraction that keeps it gives the run that
    # was never interrupted.
    counts = np.random.default_rng(0).poisson(3.0, size=(40, 6)).astype(np.float32)
    options = dict(likelihood="negative_binomial", latent_dim=2, batch_size=10, hidden_dims=(8,), progress=False,
                   schedule=Schedule(kl_warmup_epochs=0), feature_subsample_size=3, feature_subsample_start_epoch=0)
    uninterrupted = pyro_sparse.train("ssl_dgm", counts, max_epochs=4, feature_subsample_end_fraction=0.75, **options)
    path = tmp_path / "run.ckpt"
    pyro_sparse.train("ssl_dgm", counts, max_epochs=2, feature_subsample_end_fraction=0.5,
                      checkpointing=Checkpointing(path=path), **options)
    with pytest.raises(CheckpointError, match=r"feature_subsample_end_epoch is epoch 1; this one's is epoch 2 .*stays epoch 1"):
        pyro_sparse.train("ssl_dgm", counts, max_epochs=4, feature_subsample_end_fraction=0.5,
                          checkpointing=Checkpointing(resume_from=path), **options)
    extended = pyro_sparse.train("ssl_dgm", counts, max_epochs=4, feature_subsample_end_fraction=0.75,
                                 checkpointing=Checkpointing(resume_from=path), **options)
    assert_same_state(extended, uninterrupted)
    # Subsampling to the end (fraction 0) places no epoch: any run may be extended.
    to_the_end = tmp_path / "to_the_end.ckpt"
    pyro_sparse.train("ssl_dgm", counts, max_epochs=2, checkpointing=Checkpointing(path=to_the_end), **options)
    assert_same_state(pyro_sparse.train("ssl_dgm", counts, max_epochs=4, **options),
                      pyro_sparse.train("ssl_dgm", counts, max_epochs=4, checkpointing=Checkpointing(
                          resume_from=to_the_end), **options))
    # ... but switching from subsampling to the end to an end before it changes the run: refused.
    with pytest.raises(CheckpointError, match=r"end_epoch is the run's end; this one's is epoch 2 "):
        pyro_sparse.train("ssl_dgm", counts, max_epochs=4, feature_subsample_end_fraction=0.5,
                          checkpointing=Checkpointing(resume_from=to_the_end), **options)
    # A changed subsample size is named as such (not as an end epoch that max_epochs could move).
    from pyro_sparse.infer import checkpoints

    with pytest.raises(CheckpointError, match=r"different settings \(feature_subsample_size: 3 in the checkpoint, None"):
        pyro_sparse.train("ssl_dgm", counts, max_epochs=2, feature_subsample_end_fraction=0.0,
                          checkpointing=Checkpointing(resume_from=path),
                          **{**options, "feature_subsample_size": None, "feature_subsample_start_epoch": None})
    # Files written before schedules were recorded resume with the same settings.
    run = serialization.read(path, checkpoints.CHECKPOINT_FILE)[0]["run"]
    checkpoints._check_same_run({key: value for key, value in run.items() if key != "schedule"}, run, path)
    # The same end epoch reached by other float products (1 * 0.6 and 2 * 0.3 = 0.6000000000000001) is the same.
    one_epoch = tmp_path / "one_epoch.ckpt"
    pyro_sparse.train("ssl_dgm", counts, max_epochs=1, feature_subsample_end_fraction=0.4,
                      checkpointing=Checkpointing(path=one_epoch), **options)
    pyro_sparse.train("ssl_dgm", counts, max_epochs=2, feature_subsample_end_fraction=0.7,
                      checkpointing=Checkpointing(resume_from=one_epoch), **options)


def test_a_checkpoint_of_a_run_with_other_covariates_is_refused(X, tmp_path):
    anndata = pytest.importorskip("anndata")
    pandas = pytest.importorskip("pandas")
    obs = pandas.DataFrame({"lab": ["a", "b"] * 100, "donor": ["x"] * 50 + ["y"] * 150},
                           index=[str(i) for i in range(200)])
    cells, path = anndata.AnnData(X, obs=obs), tmp_path / "run.ckpt"
    pyro_sparse.train("vae", cells, batch_key="lab", max_epochs=2, checkpointing=Checkpointing(path=path), **TINY)
    with pytest.raises(CheckpointError, match=r"different settings \(covariates: .*'lab'.* in the checkpoint, "
                                              r".*'donor'.* now; registration"):
        pyro_sparse.train("vae", cells, batch_key="donor", max_epochs=4, checkpointing=Checkpointing(resume_from=path),
                          **TINY)
    from pyro_sparse.io.anndata import setup_anndata

    setup_anndata(cells, batch_key="lab", labels_key="donor")  # labels are not training: a run may add them
    resumed = pyro_sparse.train("vae", cells, max_epochs=4, checkpointing=Checkpointing(resume_from=path), **TINY)
    assert len(resumed.history_["train_loss"]) == 4


@pytest.mark.parametrize(
    "old_keyword, setting, message",
    [
        ("on_divergence", dict(on_divergence="ignore"), "on_divergence must be 'raise' or 'rollback'"),
        ("max_rollbacks", dict(on_divergence="rollback", max_rollbacks=-1),
         "max_rollbacks must be a non-negative integer"),
        ("checkpoint_every", dict(every=0), "every must be a positive integer"),
    ],
)
def test_bad_reliability_settings_are_named(X, old_keyword, setting, message):
    with pytest.raises(ValueError, match=message):
        Checkpointing(**setting)
    # The keyword train() took before the settings were grouped points to the config it moved to.
    with pytest.raises(TypeError, match="Checkpointing"):
        pyro_sparse.train("ssl_dgm", X, max_epochs=1, **TINY, **{old_keyword: next(iter(setting.values()))})


# ------------------------------------------------------------------ divergence


def test_nan_parameter_stops_at_that_step_with_the_last_good_model_saved(X, tmp_path, monkeypatch):
    path = tmp_path / "run.ckpt"
    with monkeypatch.context() as patch:
        poison_steps(patch, {6})  # the second step of the second epoch
        with pytest.raises(TrainingDivergedError, match="epoch 1, step 6: a parameter became NaN/inf") as caught:
            pyro_sparse.train("ssl_dgm", X, max_epochs=3, checkpointing=Checkpointing(path=path, every=5), **TINY)
    assert str(path) in str(caught.value)
    # The model is usable and equal to a clean run stopped after the last good epoch.
    after_one_epoch = pyro_sparse.train("ssl_dgm", X, max_epochs=1, **TINY)
    fitted = caught.value.fitted
    assert_same_state(fitted, after_one_epoch)
    assert fitted.history_ == after_one_epoch.history_
    assert np.isfinite(fitted.transform(X)).all()
    # The checkpoint written on divergence holds that state; resuming it (here
    # without the fault) finishes like a run that never diverged.
    resume = Checkpointing(resume_from=path)
    assert_same_state(pyro_sparse.train("ssl_dgm", X, max_epochs=1, checkpointing=resume, **TINY), after_one_epoch)
    resumed = pyro_sparse.train("ssl_dgm", X, max_epochs=3, checkpointing=resume, **TINY)
    assert_same_state(resumed, pyro_sparse.train("ssl_dgm", X, max_epochs=3, **TINY))


@pytest.mark.filterwarnings("ignore:Encountered NaN")
def test_nan_loss_stops_at_that_step(X, monkeypatch):
    original, calls = loop.scale_local_latents, [0]

    def nan_kl_weight(factor):
        calls[0] += 1
        return original(float("nan") if calls[0] == 3 else factor)

    monkeypatch.setattr(loop, "scale_local_latents", nan_kl_weight)
    with pytest.raises(TrainingDivergedError, match="epoch 0, step 2: the loss became NaN/inf"):
        pyro_sparse.train("vae", X, max_epochs=2, **TINY)


def test_overflowing_parameters_are_a_divergence_not_a_torch_traceback(X, monkeypatch):
    original, calls = torch.optim.Adam.step, [0]

    def blow_up(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        calls[0] += 1
        if calls[0] == 2:
            with torch.no_grad():
                for param in self.param_groups[0]["params"]:
                    param.mul_(1e18)  # finite, but the networks' outputs overflow
        return result

    monkeypatch.setattr(torch.optim.Adam, "step", blow_up)
    # Depending on the machine's arithmetic the overflow first shows as a
    # distribution's argument check ("a distribution got arguments outside its
    # support") or as a NaN loss ("the loss became NaN/inf"): the same
    # divergence, reported either way at the step after the blow-up.
    with pytest.raises(TrainingDivergedError, match=r"training diverged at epoch 0, step 2: "):
        pyro_sparse.train("ssl_dgm", X, max_epochs=2, **TINY)


def test_divergence_with_early_stopping_keeps_the_best_epoch(X, monkeypatch):
    # 160 training points: 4 steps per epoch
    settings = {**TINY, "schedule": replace(WARMUP, validation_fraction=0.2, early_stopping=10)}
    with monkeypatch.context() as patch:
        poison_steps(patch, {14})
        with pytest.raises(TrainingDivergedError, match=r"epoch 3.*the model returned is the best validation "
                                                        r"epoch's, epoch \d \(early stopping\)") as caught:
            pyro_sparse.train("vae", X, max_epochs=5, **settings)
    best_of_three = pyro_sparse.train("vae", X, max_epochs=3, **settings)
    assert_same_state(caught.value.fitted, best_of_three)


def test_rollback_halves_the_learning_rates_and_trains_on(X, tmp_path, monkeypatch):
    path = tmp_path / "run.ckpt"
    with monkeypatch.context() as patch:
        poison_steps(patch, {6})
        with pytest.warns(UserWarning,
                          match=r"epoch 1, step 6: a parameter became NaN/inf; rolled back to the end of epoch 0"):
            fitted = pyro_sparse.train(
                "tvsc", X, decoder="linear", lr=0.01, optimization=Optimization(global_lr=0.05), max_epochs=3,
                checkpointing=Checkpointing(path=path, on_divergence="rollback"), **TINY,
            )
    assert len(fitted.history_["train_loss"]) == 3
    assert all(torch.isfinite(v).all() for v in states(fitted).values() if v.is_floating_point())
    config, _ = serialization.read(path, checkpoints.CHECKPOINT_FILE)
    assert [group["lr"] for group in config["optimizer_groups"]] == [0.005, 0.025]
    assert config["loop"]["rollbacks"] == 1 and config["loop"]["step"] == 12
    assert fitted.history_["rollbacks"] == [{"epoch": 1, "step": 6, "reason": "a parameter became NaN/inf"}]


def test_rollback_gives_up_after_max_rollbacks(X, monkeypatch):
    poison_steps(monkeypatch, set(range(1, 100)))
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        with pytest.raises(TrainingDivergedError, match=r"2 rollbacks with halved learning rates.*The run is back at "
                                                        r"the start \(no epoch complete\)") as caught:
            pyro_sparse.train(
                "vae", X, max_epochs=2, checkpointing=Checkpointing(on_divergence="rollback", max_rollbacks=2), **TINY
            )
    assert sum("rolled back" in str(w.message) for w in warned) == 2
    history = caught.value.fitted.history_
    assert history["train_loss"] == []  # no epoch was good: the initial model
    assert [event["epoch"] for event in history["rollbacks"]] == [0, 0]  # the third divergence stopped the run
    assert np.isfinite(caught.value.fitted.transform(X)).all()


def test_a_checkpoint_of_a_run_on_another_number_of_processes_is_refused(X, tmp_path):
    from pyro_sparse.infer import checkpoints

    path = tmp_path / "run.ckpt"
    pyro_sparse.train("ssl_dgm", X, max_epochs=1, checkpointing=Checkpointing(path=path), **TINY)
    config, _ = serialization.read(path, checkpoints.CHECKPOINT_FILE)
    run = config["run"]
    assert run["training"]["processes"] == 1
    on_two = {**run, "training": {**run["training"], "processes": 2}}
    with pytest.raises(CheckpointError, match=r"different settings \(processes: 1 in the checkpoint, 2 now\)"):
        checkpoints._check_same_run(run, on_two, path)


def test_a_checkpoint_that_records_only_the_users_options_resumes(X, tmp_path):
    # Files written before defaults were recorded hold the user's options only;
    # a changed option is still refused.
    from pyro_sparse.infer import checkpoints

    path = tmp_path / "run.ckpt"
    pyro_sparse.train("ssl_dgm", X, max_epochs=1, lambda0=12.0, checkpointing=Checkpointing(path=path), **TINY)
    run = serialization.read(path, checkpoints.CHECKPOINT_FILE)[0]["run"]
    assert run["hyperparameters"]["lambda1"] == 1.0  # a default, recorded
    older = {**run, "hyperparameters": {"lambda0": 12.0}}
    checkpoints._check_same_run(older, run, path)
    changed = {**run, "hyperparameters": {**run["hyperparameters"], "lambda0": 20.0}}
    with pytest.raises(CheckpointError, match=r"different settings \(lambda0: 12.0 in the checkpoint, 20.0 now\)"):
        checkpoints._check_same_run(older, changed, path)
