"""``hidden_dims`` and ``encoder_hidden_dims``: who sets which network, and the sparse VAE's widths for counts."""

import numpy as np
import pytest
from torch import nn

import pyro_sparse
from pyro_sparse.interop.sklearn import SparseVAE
from pyro_sparse.io import serialization

TINY = dict(latent_dim=2, max_epochs=1, batch_size=100, progress=False, device="cpu")


@pytest.fixture(scope="module")
def counts():
    return np.random.default_rng(0).poisson(3, size=(200, 12)).astype(np.float32)


def encoder_widths(fitted):
    return [m.out_features for m in fitted.guide.encoder.modules() if isinstance(m, nn.Linear)][:-1]


@pytest.mark.parametrize("likelihood", ["negative_binomial", "zinb", "poisson"])
def test_counts_give_the_sparse_vae_one_decoder_layer_behind_three_encoder_layers(counts, likelihood):
    fitted = pyro_sparse.train("ssl_dgm", counts, likelihood=likelihood, **TINY)
    assert fitted.model.hidden_dims == (50,)
    assert encoder_widths(fitted) == [50, 50, 50]
    assert fitted.config["hyperparameters"]["encoder_hidden_dims"] == [50, 50, 50]


def test_other_likelihoods_and_models_keep_table_6_for_both_networks(counts):
    gaussian = pyro_sparse.train("ssl_dgm", np.log1p(counts), **TINY)
    vae = pyro_sparse.train("vae", counts, likelihood="negative_binomial", **TINY)
    for fitted in (gaussian, vae):
        assert fitted.model.hidden_dims == (50, 50, 50)
        assert encoder_widths(fitted) == [50, 50, 50]
        assert fitted.config["hyperparameters"]["encoder_hidden_dims"] == [50, 50, 50]  # what the encoder got


def test_hidden_dims_sets_both_networks_and_encoder_hidden_dims_the_encoder_alone(counts):
    both = pyro_sparse.train("ssl_dgm", counts, likelihood="negative_binomial", hidden_dims=(7, 6), **TINY)
    assert both.model.hidden_dims == (7, 6) and encoder_widths(both) == [7, 6]
    apart = pyro_sparse.train("ssl_dgm", counts, likelihood="negative_binomial", encoder_hidden_dims=(9,), **TINY)
    assert apart.model.hidden_dims == (50,) and encoder_widths(apart) == [9]
    vae = pyro_sparse.train("vae", np.log1p(counts), hidden_dims=(5,), encoder_hidden_dims=(4, 3), **TINY)
    assert vae.model.hidden_dims == (5,) and encoder_widths(vae) == [4, 3]


def test_widths_are_saved_and_files_without_encoder_widths_load_as_before(counts, tmp_path):
    fitted = pyro_sparse.train("ssl_dgm", counts, likelihood="negative_binomial", **TINY)
    fitted.save(tmp_path / "model.pt")
    loaded = pyro_sparse.load(tmp_path / "model.pt")
    assert loaded.model.hidden_dims == (50,) and encoder_widths(loaded) == [50, 50, 50]
    np.testing.assert_allclose(loaded.transform(counts), fitted.transform(counts), atol=1e-6)
    # A file written before the option existed: the encoder had the decoder's widths.
    old = pyro_sparse.train("ssl_dgm", counts, likelihood="negative_binomial", hidden_dims=(8,), **TINY)
    old.save(tmp_path / "old.pt")
    config, states = serialization.read(tmp_path / "old.pt")
    del config["hyperparameters"]["encoder_hidden_dims"]
    serialization.write(tmp_path / "old.pt", config, states)
    np.testing.assert_allclose(pyro_sparse.load(tmp_path / "old.pt").transform(counts), old.transform(counts),
                               atol=1e-6)


@pytest.mark.parametrize("widths, error, message", [
    ("50", TypeError, "encoder_hidden_dims must be a sequence"),
    ((50, 0), ValueError, "encoder_hidden_dims must hold positive integer"),
    ((2.5,), ValueError, "encoder_hidden_dims must hold positive integer"),
    ((), ValueError, "encoder_hidden_dims needs at least one hidden layer"),
])
def test_bad_encoder_widths_are_named(counts, widths, error, message):
    with pytest.raises(error, match=message):
        pyro_sparse.train("ssl_dgm", counts, likelihood="negative_binomial", encoder_hidden_dims=widths, **TINY)


def test_the_conv_encoder_refuses_encoder_widths():
    images = np.random.default_rng(0).random((20, 784)).astype(np.float32)
    with pytest.raises(ValueError, match="decoder='conv' uses the conv encoder"):
        pyro_sparse.train("tvsc", images, decoder="conv", encoder_hidden_dims=(10,), **{**TINY, "batch_size": 10})


def test_a_count_run_resumes_with_the_same_arguments_and_names_a_changed_width(counts, tmp_path):
    from pyro_sparse import Checkpointing, Schedule
    from pyro_sparse.infer.checkpoints import CheckpointError

    options = dict(TINY, likelihood="negative_binomial", schedule=Schedule(kl_warmup_epochs=1))
    pyro_sparse.train("ssl_dgm", counts, checkpointing=Checkpointing(path=tmp_path / "run.ckpt"), **options)
    resumed = pyro_sparse.train("ssl_dgm", counts, checkpointing=Checkpointing(resume_from=tmp_path / "run.ckpt"),
                                **{**options, "max_epochs": 2})
    assert resumed.model.hidden_dims == (50,)
    with pytest.raises(CheckpointError, match=r"hidden_dims: \[50\] in the checkpoint, \[50, 50, 50\] now"):
        pyro_sparse.train("ssl_dgm", counts, checkpointing=Checkpointing(resume_from=tmp_path / "run.ckpt"),
                          hidden_dims=(50, 50, 50), **{**options, "max_epochs": 2})


def test_the_estimators_and_the_cli_reach_the_default_widths(counts, tmp_path):
    estimator = SparseVAE(latent_dim=2, likelihood="negative_binomial", max_epochs=1).fit(counts)
    assert estimator.fitted_.model.hidden_dims == (50,)
    from pyro_sparse.interop.sklearn import ThresholdedVSC

    # hidden_dims=None is the model's own default (it was refused before the widths were resolved in one place)
    assert ThresholdedVSC(latent_dim=2, max_epochs=1).fit(np.log1p(counts)).fitted_.model.hidden_dims == (256,)
    from pyro_sparse.interop.cli import main

    np.save(tmp_path / "logcounts.npy", np.log1p(counts))
    main(["train", "--model", "vae", "--data", str(tmp_path / "logcounts.npy"), "--latent-dim", "2", "--epochs", "1",
          "--hidden-dims", "6", "--encoder-hidden-dims", "5,4", "--out", str(tmp_path / "out"), "--quiet"])
    loaded = pyro_sparse.load(tmp_path / "out" / "model.pt")
    assert loaded.model.hidden_dims == (6,) and encoder_widths(loaded) == [5, 4]
