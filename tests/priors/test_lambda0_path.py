"""The λ0 path of the Spike-and-Slab Lasso prior (dynamic posterior exploration) and unused factors."""

import numpy as np
import pytest
import torch

import pyro_sparse
from pyro_sparse import Checkpointing, Schedule
from pyro_sparse.data.synthetic import synthetic_sparse_dgm
from pyro_sparse.priors import SpikeSlabLassoPrior

QUICK = dict(latent_dim=3, hidden_dims=(8,), batch_size=100, progress=False, device="cpu")


def test_the_spike_rate_climbs_the_path_then_stays_at_lambda0():
    prior = SpikeSlabLassoPrior(4, 2, lambda0=50.0, lambda1=1.0, lambda0_path=(2.0, 10.0), lambda0_path_epochs=3)
    rates = []
    for epoch in np.arange(0, 12, 0.5):
        prior.schedule(epoch, 0)
        rates.append(prior.spike_rate.item())
    assert rates == [2.0] * 6 + [10.0] * 6 + [50.0] * 12
    assert prior.penalty_weights().max().item() == pytest.approx(1.0 + 0.5 * 49.0)  # E[γ] = 0.5 before any E-step


def test_without_a_path_the_spike_rate_is_lambda0():
    prior = SpikeSlabLassoPrior(4, 2, lambda0=7.0)
    prior.schedule(100.0, 0)
    assert prior.spike_rate.item() == 7.0


@pytest.mark.parametrize("path", [(5.0, 2.0), (0.5,), (20.0,)])
def test_a_path_must_climb_from_lambda1_to_lambda0(path):
    with pytest.raises(ValueError, match="lambda0_path must increase"):
        SpikeSlabLassoPrior(4, 2, lambda0=10.0, lambda1=1.0, lambda0_path=path)


def test_training_follows_the_path_and_a_resumed_run_keeps_its_rung(tmp_path):
    X = synthetic_sparse_dgm(n=200, rho=0.0, seed=0).X
    options = dict(lambda0=30.0, lambda0_path=(1.0, 3.0), lambda0_path_epochs=1, schedule=Schedule(kl_warmup_epochs=1))
    fitted = pyro_sparse.train("ssl_dgm", X, max_epochs=2, **QUICK, **options)
    assert fitted.model.site_priors["W"].spike_rate.item() == 3.0  # the last step ran in epoch 1
    path = tmp_path / "run.ckpt"
    pyro_sparse.train("ssl_dgm", X, max_epochs=2, checkpointing=Checkpointing(path=path), **QUICK, **options)
    resumed = pyro_sparse.train("ssl_dgm", X, max_epochs=4, checkpointing=Checkpointing(resume_from=path),
                                **QUICK, **options)
    assert resumed.model.site_priors["W"].spike_rate.item() == 30.0
    straight = pyro_sparse.train("ssl_dgm", X, max_epochs=4, **QUICK, **options)
    torch.testing.assert_close(resumed.guide.point_estimate("W"), straight.guide.point_estimate("W"))


def test_unused_factors_read_zero_in_transform():
    X = synthetic_sparse_dgm(n=300, rho=0.0, seed=1).X
    fitted = pyro_sparse.train("ssl_dgm", X, max_epochs=3, **QUICK)
    W = fitted.guide.unconstrained["W"]
    with torch.no_grad():
        W[:, 1] = 0.0  # switch factor 1 off
    assert list(fitted.active_factors_) == [0, 2]
    codes = fitted.transform(X[:20])
    assert np.all(codes[:, 1] == 0) and np.all(codes[:, [0, 2]] != 0)
    with torch.no_grad():
        W[:, 2] = 0.01 * torch.sign(W[:, 2] + 1e-6)  # small but non-zero: in the spike after the E-step
        fitted.model.site_priors["W"].update(W)
    # Outside the support, yet read by the decoder: still in use.
    assert np.all(fitted.W_[:, 2] != 0) and not fitted.support_[:, 2].any()
    assert list(fitted.active_factors_) == [0, 2]
    assert list(pyro_sparse.train("vae", X, max_epochs=1, **QUICK).active_factors_) == [0, 1, 2]


def test_a_path_that_outlasts_training_is_warned_about():
    X = synthetic_sparse_dgm(n=100, rho=0.0, seed=0).X
    with pytest.warns(UserWarning, match=r"lambda0 path \[2.0, 5.0\] ends at epoch 6 .* never reaches lambda0=10"):
        pyro_sparse.train("ssl_dgm", X, max_epochs=2, lambda0_path=(2.0, 5.0), lambda0_path_epochs=3.0, **QUICK)
