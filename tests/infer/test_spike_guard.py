"""Checkpointing(spike_factor=...): a step loss far above the running median is a divergence."""

import warnings

import pytest
import torch

import pyro_sparse
from pyro_sparse import Checkpointing, Schedule
from pyro_sparse.data.synthetic import synthetic_sparse_dgm
from pyro_sparse.infer import loop
from pyro_sparse.infer.loop import TrainingDivergedError

# 200 points in batches of 50: 4 steps per epoch; a window of 8 steps instead of 100.
TINY = dict(latent_dim=3, batch_size=50, hidden_dims=(8,), progress=False, max_epochs=8)
NO_WARMUP = Schedule(kl_warmup_epochs=0)


@pytest.fixture(scope="module")
def X():
    return synthetic_sparse_dgm(n=200, rho=0.3, seed=0).X


@pytest.fixture(autouse=True)
def short_window(monkeypatch):
    monkeypatch.setattr(loop, "SPIKE_WINDOW", 8)


def spike_at(monkeypatch, steps, factor=100.0):
    """Multiply the loss by ``factor`` the first time each of the given optimizer steps is taken."""
    original, pending = loop.Trainer._differentiable_loss, set(steps)

    def spiky(self, batch, num_data):
        loss = original(self, batch, num_data)
        if self.loop.step in pending:
            pending.discard(self.loop.step)
            return loss * factor
        return loss

    monkeypatch.setattr(loop.Trainer, "_differentiable_loss", spiky)


def test_a_spike_is_rolled_back(X, monkeypatch):
    spike_at(monkeypatch, {20})
    with pytest.warns(UserWarning, match=r"step 20: loss spike: .* > 10 x the running median .*; rolled back"):
        fitted = pyro_sparse.train("vae", X, schedule=NO_WARMUP,
                                   checkpointing=Checkpointing(on_divergence="rollback", spike_factor=10), **TINY)
    assert len(fitted.history_["train_loss"]) == 8
    assert max(fitted.history_["train_loss"]) < 10 * min(fitted.history_["train_loss"])
    (event,) = fitted.history_["rollbacks"]
    assert (event["epoch"], event["step"]) == (5, 20) and event["reason"].startswith("loss spike: ")


def test_the_retried_epoch_draws_fresh_noise_reproducibly(X, monkeypatch):
    # A spike that one unlucky draw of the codes caused would come back if the
    # retry replayed the restored random state; two identical runs still agree.
    def run():
        spike_at(monkeypatch, {20})
        states, spiky = [], loop.Trainer._differentiable_loss

        def recording(self, batch, num_data):
            if self.loop.step == 20:
                states.append(torch.get_rng_state())
            return spiky(self, batch, num_data)

        monkeypatch.setattr(loop.Trainer, "_differentiable_loss", recording)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fitted = pyro_sparse.train("vae", X, schedule=NO_WARMUP, seed=3,
                                       checkpointing=Checkpointing(on_divergence="rollback", spike_factor=10),
                                       **{**TINY, "max_epochs": 6})
        return states, fitted

    (first, retry), fitted = run()
    assert not torch.equal(first, retry)
    (again_first, again_retry), again = run()
    assert torch.equal(first, again_first) and torch.equal(retry, again_retry)
    assert again.history_ == fitted.history_


def test_a_spike_raises_by_default_policy(X, monkeypatch):
    spike_at(monkeypatch, {20})
    with pytest.raises(TrainingDivergedError, match="loss spike"):
        pyro_sparse.train("vae", X, schedule=NO_WARMUP, checkpointing=Checkpointing(spike_factor=10), **TINY)


def test_no_check_during_the_kl_warmup_or_without_spike_factor(X, monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a rollback would warn
        # Step 20 is in epoch 5, inside a 6-epoch warm-up; the window restarts after it.
        spike_at(monkeypatch, {20})
        pyro_sparse.train("vae", X, schedule=Schedule(kl_warmup_epochs=6),
                          checkpointing=Checkpointing(on_divergence="rollback", spike_factor=10), **TINY)
        spike_at(monkeypatch, {20})
        pyro_sparse.train("vae", X, schedule=NO_WARMUP, checkpointing=Checkpointing(on_divergence="rollback"),
                          **TINY)


def test_a_loss_below_the_factor_is_no_spike(X, monkeypatch):
    spike_at(monkeypatch, {20}, factor=3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fitted = pyro_sparse.train("vae", X, schedule=NO_WARMUP,
                                   checkpointing=Checkpointing(on_divergence="rollback", spike_factor=10), **TINY)
    assert torch.isfinite(torch.tensor(fitted.history_["train_loss"])).all()
    assert fitted.history_["rollbacks"] == []


@pytest.mark.parametrize("factor", [1.0, 0.5, float("inf")])
def test_spike_factor_must_exceed_one(factor):
    with pytest.raises(ValueError, match="spike_factor must be > 1"):
        Checkpointing(spike_factor=factor)


def test_tvsc_trains_with_the_guard_by_default():
    defaults = pyro_sparse.MODELS["tvsc"].training_defaults
    assert defaults["checkpointing"].on_divergence == "rollback" and defaults["checkpointing"].spike_factor == 10
    assert defaults["lr"] == 1e-3 and defaults["optimization"].global_lr == 0.1


def test_a_resumed_run_judges_spikes_by_the_window_of_the_run(X, monkeypatch, tmp_path):
    # The window of recent losses is part of the checkpoint: 6 steps after resuming, the window of 8 is full
    # (it was before the interruption), so a spike there is rolled back as in the uninterrupted run.
    guard = dict(on_divergence="rollback", spike_factor=10)
    spike_at(monkeypatch, {26})
    with pytest.warns(UserWarning, match="step 26: loss spike"):
        uninterrupted = pyro_sparse.train("vae", X, schedule=NO_WARMUP, checkpointing=Checkpointing(**guard), **TINY)
    path = tmp_path / "run.ckpt"
    pyro_sparse.train("vae", X, schedule=NO_WARMUP, checkpointing=Checkpointing(path=path, **guard),
                      **{**TINY, "max_epochs": 5})
    spike_at(monkeypatch, {26})
    with pytest.warns(UserWarning, match="step 26: loss spike"):
        resumed = pyro_sparse.train("vae", X, schedule=NO_WARMUP,
                                    checkpointing=Checkpointing(resume_from=path, **guard), **TINY)
    assert resumed.history_ == uninterrupted.history_ and len(resumed.history_["rollbacks"]) == 1
    for name, value in uninterrupted.guide.state_dict().items():
        torch.testing.assert_close(resumed.guide.state_dict()[name], value, rtol=0, atol=0)
