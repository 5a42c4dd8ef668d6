"""The batch-normalised encoder (``batch_norm``): scVI's encoder, on by default for the NB and ZINB likelihoods."""

import numpy as np
import pytest
import torch
from torch import nn

import pyro_sparse
from pyro_sparse.nn.networks import RowBatchNorm


def test_row_batch_norm_is_batch_norm_over_every_leading_dim():
    torch.manual_seed(0)
    norm, reference = RowBatchNorm(4), nn.BatchNorm1d(4)
    x = torch.randn(3, 5, 4) * 3 + 1
    out = norm(x)
    torch.testing.assert_close(out, reference(x.reshape(15, 4)).reshape(3, 5, 4))
    torch.testing.assert_close(out.reshape(-1, 4).mean(0), torch.zeros(4), atol=1e-5, rtol=0)
    torch.testing.assert_close(norm.running_mean, reference.running_mean)
    torch.testing.assert_close(norm.running_var, reference.running_var)


def test_row_batch_norm_variance_survives_a_large_mean():
    # E[x²] - E[x]² in float32 loses a spread of 0.1 around 1000 (relative 1e-8 of E[x²]).
    torch.manual_seed(0)
    x = 1000.0 + 0.1 * torch.randn(256, 3)
    norm = RowBatchNorm(3, eps=0.0)
    out = norm(x)
    torch.testing.assert_close(out.std(0, unbiased=False), torch.ones(3), atol=1e-3, rtol=0)
    torch.testing.assert_close(norm.running_var, 0.9 + 0.1 * x.double().var(0).float(), atol=1e-5, rtol=1e-3)


def test_a_one_row_training_batch_uses_the_running_statistics():
    norm = RowBatchNorm(3)
    with torch.no_grad():
        norm.running_mean.fill_(2.0)
        norm.running_var.fill_(4.0)
    out = norm(torch.full((1, 3), 4.0))
    torch.testing.assert_close(out, torch.full((1, 3), 2.0 / (4.0 + norm.eps) ** 0.5))
    assert (norm.running_mean == 2.0).all()


@pytest.fixture(scope="module")
def counts():
    return np.random.default_rng(0).poisson(3, size=(301, 20)).astype(np.float32)


@pytest.mark.parametrize("model", ["vae", "ssl_dgm", "tvsc"])
def test_overdispersed_counts_batch_normalise_the_encoder_and_codes_do_not_depend_on_the_batch(model, counts,
                                                                                               tmp_path):
    # 301 rows in batches of 100: the last training batch has one row.
    fitted = pyro_sparse.train(model, counts, likelihood="zinb" if model == "tvsc" else "negative_binomial", latent_dim=2, max_epochs=2,
                               batch_size=100, progress=False)
    assert fitted.config["hyperparameters"]["batch_norm"] is True
    assert any(isinstance(m, RowBatchNorm) for m in fitted.guide.encoder.modules())
    codes = fitted.transform(counts[:40])
    np.testing.assert_allclose(fitted.transform(counts[:1]), codes[:1], atol=1e-5)
    fitted.save(tmp_path / "model.pt")
    np.testing.assert_allclose(pyro_sparse.load(tmp_path / "model.pt").transform(counts[:40]), codes, atol=1e-6)


def test_other_likelihoods_and_explicit_choices_keep_the_plain_encoder(counts):
    gaussian = pyro_sparse.train("vae", np.log1p(counts), latent_dim=2, max_epochs=1, progress=False)
    poisson = pyro_sparse.train("vae", counts, likelihood="poisson", latent_dim=2, max_epochs=1, progress=False)
    off = pyro_sparse.train("vae", counts, likelihood="negative_binomial", batch_norm=False, latent_dim=2,
                            max_epochs=1, progress=False)
    for fitted in (gaussian, poisson, off):
        assert fitted.config["hyperparameters"]["batch_norm"] is False
        assert not any(isinstance(m, RowBatchNorm) for m in fitted.guide.encoder.modules())


def test_files_without_the_option_load_with_the_plain_encoder(counts, tmp_path):
    from pyro_sparse.io import serialization

    fitted = pyro_sparse.train("vae", counts, likelihood="poisson", batch_norm=False, latent_dim=2, max_epochs=1,
                               progress=False)
    fitted.save(tmp_path / "model.pt")
    config, states = serialization.read(tmp_path / "model.pt")
    del config["hyperparameters"]["batch_norm"]  # as written before the option existed
    serialization.write(tmp_path / "old.pt", config, states)
    assert pyro_sparse.load(tmp_path / "old.pt").guide.batch_norm is False


def test_the_conv_encoder_has_no_batch_norm_option():
    from pyro_sparse.guides import AmortizedNormalGuide

    with pytest.raises(ValueError, match="batch_norm need network='mlp'"):
        AmortizedNormalGuide(784, 3, network="conv", batch_norm=True)
