"""Reduced precision: bfloat16 decoders against float32, TF32 on CUDA, and the setting's round trips."""

import copy

import numpy as np
import pytest
import torch

import pyro_sparse
from pyro_sparse import Checkpointing, Hardware, Schedule
from pyro_sparse.data.synthetic import synthetic_sparse_dgm
from pyro_sparse.infer.checkpoints import CheckpointError
from pyro_sparse.interop.cli import main
from pyro_sparse.interop.sklearn import SparseVAE
from pyro_sparse.nn import (
    ConvDecoder28,
    DenseDecoder,
    HeteroscedasticDecoder,
    MaskedDecoder,
    set_decoder_precision,
    tf32_matmuls,
)

QUICK = {"latent_dim": 3, "max_epochs": 2, "batch_size": 50, "progress": False, "hidden_dims": (8, 8), "device": "cpu"}
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# bfloat16 keeps 8 significant bits: inputs and weights are rounded by up to
# 2^-9 ≈ 2e-3 relative, so decoder outputs agree with float32 to a few 1e-3.
OUTPUT_TOLERANCE = 1e-2


def _decoders():
    torch.manual_seed(0)
    masked_args = (torch.randn(64, 5), torch.rand(30, 5))
    # A budget of 4 features per chunk exercises the checkpointed (recomputed) path.
    chunked = MaskedDecoder(30, 5, (16, 16), memory_budget_bytes=64 * 32 * 8 * 4)
    return {
        "masked": (MaskedDecoder(30, 5, (50, 50, 50)), masked_args),
        "masked_chunked": (chunked, masked_args),
        "dense": (DenseDecoder(30, 5, (50, 50)), (torch.randn(64, 5),)),
        "heteroscedastic": (HeteroscedasticDecoder(30, 5, (50, 50)), (torch.randn(64, 5),)),
        "conv": (ConvDecoder28(784, 8), (torch.randn(16, 8),)),
    }


def _outputs_and_gradients(decoder, args, precision):
    """Outputs, gradients of the inputs and of the parameters of a squared-error loss, all flattened."""
    decoder = copy.deepcopy(decoder)
    set_decoder_precision(decoder, precision)
    args = tuple(arg.detach().clone().requires_grad_() for arg in args)
    output = decoder(*args)
    outputs = output if isinstance(output, tuple) else (output,)
    target = torch.randn(outputs[0].shape, generator=torch.Generator().manual_seed(1))
    sum(((part - target) ** 2).sum() / 2 for part in outputs).backward()
    return outputs, _flat(arg.grad for arg in args), _flat(p.grad for p in decoder.parameters()), decoder


def _flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def _relative_error(approx, exact):
    return ((approx - exact).norm() / exact.norm()).item()


@pytest.mark.parametrize("name", list(_decoders()))
def test_bf16_decoder_outputs_match_float32(name):
    decoder, args = _decoders()[name]
    exact, *_ = _outputs_and_gradients(decoder, args, "fp32")
    approx, _, _, bf16_decoder = _outputs_and_gradients(decoder, args, "bf16")
    for a, e in zip(approx, exact):
        assert a.dtype == torch.float32
        error = _relative_error(a, e)
        # Above float32's rounding (so bfloat16 was used) and within bfloat16's.
        assert 1e-5 < error < OUTPUT_TOLERANCE, error
    assert {p.dtype for p in bf16_decoder.parameters()} == {torch.float32}


@pytest.mark.parametrize("name", list(_decoders()))
def test_bf16_decoder_gradients_match_float32(name):
    """
    Gradients go through every layer twice and through the ReLUs' kinks: a
    pre-activation within bfloat16's rounding of 0 (about one in a thousand)
    switches its unit's whole contribution, and every code gradient sums
    thousands of units (G features x hidden units), so gradients agree to a
    few percent in norm (measured: parameters 0.6-4 %, codes 3-9 %), not to
    the outputs' 0.4 %.  Garbage (a wrong cast or scale) would be off by O(1).
    """
    decoder, args = _decoders()[name]
    _, exact_codes, exact_params, _ = _outputs_and_gradients(decoder, args, "fp32")
    _, approx_codes, approx_params, bf16_decoder = _outputs_and_gradients(decoder, args, "bf16")
    assert 1e-5 < _relative_error(approx_params, exact_params) < 0.1
    assert 1e-5 < _relative_error(approx_codes, exact_codes) < 0.15
    assert all(p.grad.dtype == torch.float32 for p in bf16_decoder.parameters())


def test_bf16_runs_the_layers_in_bfloat16_and_leaves_autocast_off():
    decoder = DenseDecoder(6, 3, (8,))
    seen = []
    decoder.net[0].register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    set_decoder_precision(decoder, "bf16")
    assert decoder(torch.randn(4, 3)).dtype == torch.float32
    set_decoder_precision(decoder, "fp32")
    decoder(torch.randn(4, 3))
    assert seen == [torch.bfloat16, torch.float32]
    set_decoder_precision(decoder, "bf16")
    with pytest.raises(RuntimeError):
        decoder(torch.randn(4, 5))  # wrong latent size: autocast must still be switched off after
    assert not torch.is_autocast_enabled("cpu")


@pytest.fixture(scope="module")
def data():
    return synthetic_sparse_dgm(n=300, rho=0.3, seed=0)


@pytest.fixture(scope="module")
def fits(data):
    settings = {**QUICK, "max_epochs": 15, "batch_size": 100, "hidden_dims": (16, 16)}
    return {
        p: pyro_sparse.train("ssl_dgm", data.X, hardware=Hardware(precision=p), **settings) for p in ("fp32", "bf16")
    }


def test_short_bf16_fit_of_ssl_dgm_ends_close_to_float32(fits):
    fp32, bf16 = (fits[p].history_["train_loss"] for p in ("fp32", "bf16"))
    improvement = fp32[0] - fp32[-1]
    assert improvement > 1.0  # nats per point: the fit moved, so agreement at the end means something
    assert bf16[-1] != fp32[-1]
    # Measured: 0.06 % apart (0.01 nats), against 2.2 nats of progress.
    assert abs(bf16[-1] / fp32[-1] - 1) < 0.02
    assert abs(bf16[-1] - fp32[-1]) < 0.1 * improvement
    fitted = fits["bf16"]
    tensors = [*fitted.model.parameters(), *fitted.guide.parameters(), *fitted.model.buffers(), *fitted.guide.buffers()]
    assert {t.dtype for t in tensors if t.is_floating_point()} == {torch.float32}
    assert fitted.model.decoder.precision == "bf16"
    assert fits["fp32"].model.decoder.precision == "fp32"


def test_precision_is_saved_and_restored(fits, data, tmp_path):
    fitted = fits["bf16"]
    assert fitted.config["training"]["precision"] == "bf16"
    fitted.save(tmp_path / "model.pt")
    loaded = pyro_sparse.load(tmp_path / "model.pt")
    assert loaded.config["training"]["precision"] == "bf16"
    assert loaded.model.decoder.precision == "bf16"
    np.testing.assert_array_equal(loaded.reconstruct(data.X[:20]), fitted.reconstruct(data.X[:20]))


def test_a_bf16_fit_loads_in_float32_where_the_device_cannot_run_bf16(fits, data, tmp_path, monkeypatch):
    # Checked on the load's device (a GPU older than compute capability 8.0 refuses bf16): a warning, a float32 decoder.
    from pyro_sparse import svi

    def refuse(precision, device):
        raise ValueError("precision='bf16' needs a GPU with bfloat16 arithmetic")

    fits["bf16"].save(tmp_path / "model.pt")
    monkeypatch.setattr(svi, "check_precision", refuse)
    with pytest.warns(UserWarning, match="trained with a bfloat16 decoder.*evaluated in float32"):
        loaded = pyro_sparse.load(tmp_path / "model.pt")
    assert loaded.model.decoder.precision == "fp32" and loaded.config["training"]["precision"] == "bf16"
    fp32 = copy.deepcopy(fits["bf16"]).set_precision("fp32")
    np.testing.assert_array_equal(loaded.reconstruct(data.X[:20]), fp32.reconstruct(data.X[:20]))


def test_set_precision_changes_evaluation_only(fits, data):
    fitted = copy.deepcopy(fits["bf16"])
    bf16 = fitted.reconstruct(data.X[:50])
    assert fitted.set_precision("fp32") is fitted
    assert fitted.model.decoder.precision == "fp32"
    fp32 = fitted.reconstruct(data.X[:50])
    assert 1e-5 < _relative_error(torch.as_tensor(bf16), torch.as_tensor(fp32)) < OUTPUT_TOLERANCE
    assert fitted.config["training"]["precision"] == "bf16"
    with pytest.raises(ValueError, match="'tf32' is for training"):
        fitted.set_precision("tf32")


def test_checkpoint_records_precision(data, tmp_path):
    path = tmp_path / "run.ckpt"
    bf16, resume = Hardware(precision="bf16"), Checkpointing(resume_from=path)
    quick = {**QUICK, "schedule": Schedule(kl_warmup_epochs=0.5)}  # extended below: a fixed KL warm-up
    pyro_sparse.train("ssl_dgm", data.X, hardware=bf16, checkpointing=Checkpointing(path=path), **quick)
    resumed = pyro_sparse.train("ssl_dgm", data.X, hardware=bf16, checkpointing=resume, **{**quick, "max_epochs": 3})
    assert len(resumed.history_["train_loss"]) == 3
    with pytest.raises(CheckpointError, match="precision"):
        pyro_sparse.train("ssl_dgm", data.X, hardware=Hardware(precision="fp32"), checkpointing=resume, **quick)


@pytest.mark.parametrize(
    "precision, match",
    [("fp16", "precision must be 'fp32', 'bf16'"), ("BF16", "precision must be"), ("tf32", "needs a CUDA device")],
)
def test_bad_precision_raises_before_training(data, precision, match):
    # A misspelt precision fails when the Hardware is made; tf32 without CUDA when train() sees the device.
    with pytest.raises(ValueError, match=match):
        pyro_sparse.train("ssl_dgm", data.X, hardware=Hardware(precision=precision), **QUICK)
    with pytest.raises(TypeError, match="Hardware"):
        pyro_sparse.train("ssl_dgm", data.X, precision=precision, **QUICK)


def test_bf16_without_a_decoder_network_warns(data):
    with pytest.warns(UserWarning, match="precision='bf16' changes nothing"):
        pyro_sparse.train(
            "vsc", data.X, decoder="linear", hardware=Hardware(precision="bf16"), **{**QUICK, "max_epochs": 1}
        )


def test_tf32_matmuls_sets_and_restores_the_backend_flags():
    # The flags exist in CPU builds too; start from IEEE float32 (cuDNN convolutions default to TF32).
    backends = (torch.backends.cuda.matmul, torch.backends.cudnn.conv)
    saved = [backend.fp32_precision for backend in backends]
    try:
        for backend in backends:
            backend.fp32_precision = "ieee"
        with tf32_matmuls("fp32"):
            assert [backend.fp32_precision for backend in backends] == ["ieee", "ieee"]
        with pytest.raises(KeyError), tf32_matmuls("tf32"):
            assert [backend.fp32_precision for backend in backends] == ["tf32", "tf32"]
            raise KeyError("restored on the way out")
        assert [backend.fp32_precision for backend in backends] == ["ieee", "ieee"]
    finally:
        for backend, value in zip(backends, saved):
            backend.fp32_precision = value


def test_estimator_and_cli_pass_precision_through(data, tmp_path, capsys):
    options = {"hardware": Hardware(precision="bf16")}
    estimator = SparseVAE(latent_dim=3, hidden_dims=(8,), max_epochs=1, model_options=options, device="cpu").fit(data.X)
    assert estimator.get_params()["model_options"]["hardware"].precision == "bf16"
    assert estimator.fitted_.config["training"]["precision"] == "bf16"
    argv = ["train", "--epochs", "1", "--latent-dim", "3", "--hidden-dims", "8", "--quiet", "--n", "200"]
    assert main([*argv, "--device", "cpu", "--precision", "tf32", "--out", str(tmp_path / "a")]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


@needs_cuda
def test_cuda_bf16_fit_matches_float32(data):
    settings = {**QUICK, "max_epochs": 15, "batch_size": 100, "hidden_dims": (16, 16), "device": "cuda"}
    losses = {
        p: pyro_sparse.train("ssl_dgm", data.X, hardware=Hardware(precision=p), **settings).history_["train_loss"][-1]
        for p in ("fp32", "bf16")
    }
    assert abs(losses["bf16"] / losses["fp32"] - 1) < 0.02


@needs_cuda
def test_cuda_tf32_fit_restores_the_backend_flags(data):
    backends = (torch.backends.cuda.matmul, torch.backends.cudnn.conv)
    before = [backend.fp32_precision for backend in backends]
    fitted = pyro_sparse.train("ssl_dgm", data.X, hardware=Hardware(precision="tf32"), **{**QUICK, "device": "cuda"})
    assert fitted.config["training"]["precision"] == "tf32"
    assert fitted.model.decoder.precision == "fp32"
    assert [backend.fp32_precision for backend in backends] == before
