"""Learning rates by parameter group and their per-epoch decay (pyro_sparse.infer.loop through train())."""

import numpy as np
import pytest
import torch

import pyro_sparse
from pyro_sparse import Optimization, Schedule


@pytest.fixture(scope="module")
def X():
    rng = np.random.default_rng(0)
    codes = rng.laplace(size=(200, 6)) * (rng.random((200, 6)) < 0.3)
    return (codes @ rng.normal(size=(6, 12)) + 0.1 * rng.normal(size=(200, 12))).astype(np.float32)


def fit(X, epochs, **optimization):
    # No KL warm-up: its length depends on max_epochs, so runs of 1 and 2
    # epochs would differ already in the first epoch.
    fitted = pyro_sparse.train("tvsc", X, decoder="linear", latent_dim=6, hidden_dims=(16,), max_epochs=epochs,
                               batch_size=50, lr=1e-2, schedule=Schedule(kl_warmup_epochs=0), progress=False,
                               optimization=Optimization(**optimization))
    encoder = torch.cat([p.detach().flatten() for p in fitted.guide.encoder.parameters()])
    return fitted._point("A"), encoder.cpu().numpy()


def test_global_lr_moves_only_the_global_sites(X):
    frozen_a1, encoder1 = fit(X, 1, global_lr=1e-12)
    frozen_a2, encoder2 = fit(X, 2, global_lr=1e-12)
    np.testing.assert_allclose(frozen_a1, frozen_a2, atol=1e-8)
    assert np.abs(encoder1 - encoder2).max() > 1e-3
    moving_a1, _ = fit(X, 1)
    moving_a2, _ = fit(X, 2)
    assert np.abs(moving_a1 - moving_a2).max() > 1e-3


def test_lr_decay_shrinks_every_group_after_each_epoch(X):
    a1, encoder1 = fit(X, 1, lr_decay=1e-9)
    a2, encoder2 = fit(X, 2, lr_decay=1e-9)
    np.testing.assert_allclose(a1, a2, atol=1e-6)
    np.testing.assert_allclose(encoder1, encoder2, atol=1e-6)


@pytest.mark.parametrize("setting", [dict(global_lr=0.0), dict(global_lr=-1.0), dict(lr_decay=0.0), dict(lr_decay=1.5),
                                     dict(global_lr=True), dict(global_lr="0.1"), dict(lr_decay=None)])
def test_bad_learning_rate_settings_are_named(X, setting):
    with pytest.raises(ValueError, match=next(iter(setting))):
        Optimization(**setting)
    with pytest.raises(TypeError, match="Optimization"):
        pyro_sparse.train("tvsc", X, decoder="linear", latent_dim=6, max_epochs=1, progress=False, **setting)


def test_prior_penalties_ramp_with_the_kl_warmup(X, monkeypatch):
    """after_step gets strength (step + 1) / warm-up steps, capped at 1, like the codes' KL weight."""
    from pyro_sparse.priors import SpikeSlabLassoPrior

    strengths = []
    original = SpikeSlabLassoPrior.after_step

    def recording(self, mask, step_size, max_shift, strength=1.0):
        strengths.append(strength)
        return original(self, mask, step_size, max_shift, strength)

    monkeypatch.setattr(SpikeSlabLassoPrior, "after_step", recording)
    pyro_sparse.train("ssl_dgm", X, latent_dim=3, hidden_dims=(8,), max_epochs=4, batch_size=50,
                      schedule=Schedule(kl_warmup_epochs=2), progress=False)
    np.testing.assert_allclose(strengths, np.minimum(1.0, np.arange(1, 17) / 8))


def test_numpy_numbers_in_every_settings_object_train_and_are_recorded_as_python_numbers(X):
    # They passed the checks and then failed writing the JSON record, after the data had been read.
    fitted = pyro_sparse.train(
        "vae", X[:60], latent_dim=2, hidden_dims=(8,), max_epochs=2, batch_size=30, progress=False,
        optimization=Optimization(num_particles=np.int64(2), lr_decay=np.float32(0.5)),
        schedule=Schedule(kl_warmup_epochs=np.int64(1)),
        checkpointing=pyro_sparse.Checkpointing(spike_factor=np.float64(20.0)),
    )
    record = fitted.config["training"]
    assert (record["num_particles"], record["lr_decay"], record["kl_warmup_epochs"]) == (2, 0.5, 1)
    assert type(record["num_particles"]) is int and type(record["kl_warmup_epochs"]) is int
    for bad in (dict(kl_warmup_epochs=True), dict(kl_warmup_epochs="2"), dict(validation_fraction="0.1")):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Schedule(**bad)


def test_settings_that_would_act_on_nothing_are_refused(X):
    # vsc's MLP decoder has no point-estimated global site for global_lr to act on.
    with pytest.raises(ValueError, match="global_lr=0.5 sets the learning rate of point-estimated global sites"):
        pyro_sparse.train("vsc", X[:60], latent_dim=2, hidden_dims=(8,), max_epochs=1, progress=False,
                          optimization=Optimization(global_lr=0.5))
    # tvsc's own default (global_lr=0.1 for its linear dictionary) stays harmless with its MLP decoder.
    pyro_sparse.train("tvsc", X[:60], latent_dim=2, hidden_dims=(8,), max_epochs=1, progress=False)
    with pytest.raises(ValueError, match="every=5 sets how often the checkpoint file is written"):
        pyro_sparse.Checkpointing(every=5)
    with pytest.raises(ValueError, match="max_rollbacks=5 acts only with on_divergence='rollback'"):
        pyro_sparse.Checkpointing(max_rollbacks=5)


def test_a_kl_warmup_that_outlasts_training_is_warned_about(X):
    with pytest.warns(UserWarning, match="KL warm-up lasts 3 epochs, not less than max_epochs=2"):
        pyro_sparse.train("vae", X, latent_dim=2, hidden_dims=(8,), max_epochs=2, progress=False,
                          schedule=Schedule(kl_warmup_epochs=3))
