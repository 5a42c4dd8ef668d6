"""The SSL prior's sparse start (``initial_support``) and ``sparse_restart`` (refits from the strongest entries)."""

import numpy as np
import pytest
import torch

import pyro_sparse
from pyro_sparse import Checkpointing
from pyro_sparse.data.synthetic import synthetic_sparse_dgm
from pyro_sparse.priors import SpikeSlabLassoPrior

QUICK = dict(latent_dim=3, hidden_dims=(8,), batch_size=100, max_epochs=2, progress=False, device="cpu")


def test_restart_support_keeps_each_features_largest_entry():
    W = torch.tensor([[0.1, -0.9, 0.3],
                      [0.0, 0.0, 0.0],     # an unused feature gets no parent
                      [0.5, 0.5, -0.2],    # a tie: the first of them
                      [-2.0, 0.0, 1.5]])
    expected = np.array([[0, 1, 0], [0, 0, 0], [1, 0, 0], [1, 0, 0]], dtype=bool)
    np.testing.assert_array_equal(SpikeSlabLassoPrior.restart_support(W).numpy(), expected)


def test_initialize_zeroes_w_outside_the_initial_support_and_leaves_a_dense_start_alone():
    support = np.array([[1, 0], [0, 1], [1, 1]], dtype=bool)
    mask = torch.ones(3, 2)
    SpikeSlabLassoPrior(3, 2, initial_support=support).initialize(mask)
    np.testing.assert_array_equal(mask.numpy(), support.astype(np.float32))
    dense = torch.ones(3, 2)
    SpikeSlabLassoPrior(3, 2).initialize(dense)
    assert bool((dense == 1).all())


@pytest.mark.parametrize("support", [np.ones((2, 2)), np.full((3, 2), 0.5)])
def test_an_initial_support_of_the_wrong_shape_or_not_boolean_is_an_error(support):
    with pytest.raises(ValueError, match=r"initial_support must be \(3, 2\) booleans"):
        SpikeSlabLassoPrior(3, 2, initial_support=support)


def test_sparse_restart_starts_the_second_fit_on_the_first_fits_strongest_entries(tmp_path):
    X = synthetic_sparse_dgm(n=200, rho=0.0, seed=0).X
    first = pyro_sparse.train("ssl_dgm", X, seed=3, **QUICK)
    restarted = pyro_sparse.train("ssl_dgm", X, seed=3, sparse_restart=True, **QUICK)
    expected = SpikeSlabLassoPrior.restart_support(first.W_).numpy()
    recorded = np.asarray(restarted.config["hyperparameters"]["initial_support"])
    np.testing.assert_array_equal(recorded, expected)
    assert recorded.sum() <= X.shape[1]  # at most one parent per feature at the start
    # The second fit starts sparse and is the one returned: entries off the start join only through the zero test.
    assert (restarted.W_ != 0).sum() < (first.W_ != 0).sum()
    # The first fit's losses are kept, so the two objectives can be compared.
    assert restarted.history_["earlier_fits_train_loss"] == [first.history_["train_loss"]]
    assert restarted.history_["train_loss"] != first.history_["train_loss"]
    path = tmp_path / "restarted.pt"
    restarted.save(path)
    loaded = pyro_sparse.load(path)
    np.testing.assert_array_equal(loaded.W_, restarted.W_)
    assert loaded.history_["earlier_fits_train_loss"] == [first.history_["train_loss"]]


def test_two_sparse_restarts_start_the_third_fit_on_the_second_fits_strongest_entries(monkeypatch):
    X = synthetic_sparse_dgm(n=200, rho=0.0, seed=0).X
    once = pyro_sparse.train("ssl_dgm", X, seed=3, sparse_restart=1, **QUICK)
    # On these small fits both W's have the same strongest entries, so record which W each restart starts from.
    starts, restart_support = [], SpikeSlabLassoPrior.restart_support
    monkeypatch.setattr(SpikeSlabLassoPrior, "restart_support",
                        staticmethod(lambda W: starts.append(np.asarray(W).copy()) or restart_support(W)))
    twice = pyro_sparse.train("ssl_dgm", X, seed=3, sparse_restart=2, **QUICK)
    assert len(starts) == 2
    np.testing.assert_array_equal(starts[1], once.W_)  # the third fit starts from the second fit's W
    np.testing.assert_array_equal(np.asarray(twice.config["hyperparameters"]["initial_support"]),
                                  restart_support(once.W_).numpy())
    first, second = twice.history_["earlier_fits_train_loss"]
    assert first == once.history_["earlier_fits_train_loss"][0]
    assert second == once.history_["train_loss"]


@pytest.mark.parametrize("restarts", [-1, 1.5, "two"])
def test_sparse_restart_must_be_a_count(restarts):
    X = synthetic_sparse_dgm(n=50, rho=0.0, seed=0).X
    with pytest.raises(ValueError, match="sparse_restart must be a number of restarts"):
        pyro_sparse.train("ssl_dgm", X, sparse_restart=restarts, **QUICK)


def test_sparse_restart_cannot_resume_from_a_checkpoint(tmp_path):
    X = synthetic_sparse_dgm(n=200, rho=0.0, seed=0).X
    with pytest.raises(ValueError, match="sparse_restart fits more than once and cannot resume"):
        pyro_sparse.train("ssl_dgm", X, sparse_restart=True, checkpointing=Checkpointing(resume_from=tmp_path / "x"),
                          **QUICK)


def test_sparse_restart_is_an_option_of_the_ssl_prior_only():
    X = synthetic_sparse_dgm(n=50, rho=0.0, seed=0).X
    with pytest.raises((TypeError, ValueError), match="sparse_restart"):
        pyro_sparse.train("ssl_dgm", X, mask_prior="horseshoe", sparse_restart=True, **QUICK)
