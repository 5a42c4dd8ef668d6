"""Devices and numerical precision of the decoder networks (bf16 autocast, TF32)."""

import contextlib

import torch

from pyro_sparse.nn.networks import Decoder

PRECISIONS = ("fp32", "bf16", "tf32")


def check_precision(precision, device):
    """``precision`` if training on ``device`` can use it, else a ValueError saying what to pass instead."""
    if precision not in PRECISIONS:
        raise ValueError(
            "precision must be 'fp32', 'bf16' (decoder networks in bfloat16) or 'tf32' (TensorFloat-32 "
            f"matrix products on CUDA), got {precision!r}"
        )
    device = torch.device(device)
    if precision == "tf32" and device.type != "cuda":
        raise ValueError(
            f"precision='tf32' needs a CUDA device (TensorFloat-32 is a tensor-core format of NVIDIA GPUs), "
            f"this run is on {device.type!r}; use 'fp32', or 'bf16' for a bfloat16 decoder"
        )
    if precision == "bf16" and device.type not in ("cpu", "cuda"):
        raise ValueError(f"precision='bf16' runs on 'cpu' or 'cuda', this run is on {device.type!r}; use 'fp32'")
    if precision == "bf16" and device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 0):
        raise ValueError("precision='bf16' needs a GPU with bfloat16 arithmetic (compute capability 8.0 or newer); use 'fp32'")
    return precision


def set_decoder_precision(module, precision):
    """
    Set the precision of every :class:`Decoder` in ``module`` (``"bf16"``, or
    ``"fp32"``; ``"tf32"`` is a setting of the CUDA backend, not of the
    modules, see :func:`tf32_matmuls`) and return how many there are.
    """
    decoders = [m for m in module.modules() if isinstance(m, Decoder)]
    for decoder in decoders:
        decoder.precision = "bf16" if precision == "bf16" else "fp32"
    return len(decoders)


@contextlib.contextmanager
def tf32_matmuls(precision):
    """
    With ``precision="tf32"``, let CUDA float32 matrix products and cuDNN
    convolutions use TensorFloat-32 (10-bit mantissa, float32 range) inside
    the block, and restore the backend's settings after; other precisions
    change nothing.  The settings are process-wide: every float32 matmul on
    CUDA in the block uses TF32, not only the decoder's.
    """
    if precision != "tf32":
        yield
        return
    # torch's fp32_precision settings; mixing them with the legacy allow_tf32 flags is an error in torch.
    backends = (torch.backends.cuda.matmul, torch.backends.cudnn.conv)
    saved = [backend.fp32_precision for backend in backends]
    try:
        for backend in backends:
            backend.fp32_precision = "tf32"
        yield
    finally:
        for backend, value in zip(backends, saved):
            backend.fp32_precision = value


def resolve_device(device):
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:<index>', got {device!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was requested but CUDA is not available; use device='auto'")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device={str(device)!r} was requested but this machine has {torch.cuda.device_count()} "
                         f"GPU(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return device
