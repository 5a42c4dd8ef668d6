"""Plain torch networks shared by models and guides (no Pyro here)."""

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class FeatureAffine(nn.Module):
    """
    A fixed per-feature affine map x -> x * scale + loc (buffers, not
    parameters).  Decoders end with one set to the data's feature means and
    standard deviations, and encoders start with its inverse, so networks
    work on unit-scale numbers whatever the data's units: a
    reparameterisation of the same model family that only conditions the
    optimisation.
    """

    def __init__(self, num_features):
        super().__init__()
        self.register_buffer("loc", torch.zeros(num_features))
        self.register_buffer("scale", torch.ones(num_features))

    @torch.no_grad()
    def set(self, loc, scale):
        self.loc.copy_(torch.as_tensor(loc, dtype=self.loc.dtype))
        self.scale.copy_(torch.as_tensor(scale, dtype=self.scale.dtype).clamp_min(1e-6))

    def forward(self, x, features=None):
        """``features``: the indices among the G features of x's columns (None: all G)."""
        if features is None:
            return torch.addcmul(self.loc, x, self.scale)
        return torch.addcmul(self.loc[features], x, self.scale[features])

    def inverse(self, y):
        return (y - self.loc) / self.scale


class DecoderMemoryError(MemoryError):
    """One training step's decoder activations would not fit in the device's free memory."""


def available_memory_bytes(device):
    """Free memory on ``device``: CUDA's free memory, else the host's MemAvailable (Linux); None if unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as stream:
            for line in stream:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_step_memory(module, batch_size, device):
    """
    Before training: raise :class:`DecoderMemoryError` if the sparse decoders in
    ``module`` would need more memory for one step on ``batch_size`` codes (data
    points times particles) than ``device`` has free, instead of running out of
    memory mid-step.
    """
    decoders = [m for m in module.modules() if isinstance(m, MaskedDecoder)]
    needed = sum(decoder.step_memory_bytes(batch_size) for decoder in decoders)
    available = available_memory_bytes(device) if decoders else None
    if available is not None and needed > available:
        decoder = decoders[0]
        raise DecoderMemoryError(
            f"one training step of the sparse decoder needs about {needed / 2**30:.1f} GiB "
            f"({batch_size} codes x {sum(decoder.hidden_dims)} hidden units x "
            f"{decoder.chunk_size(batch_size)} features per chunk, 8 bytes each, plus outputs), "
            f"but {device} has {available / 2**30:.1f} GiB free; lower batch_size (or num_particles, "
            "hidden_dims, memory_budget_bytes)"
        )


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
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
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


class Decoder(nn.Module):
    """
    Base class of the decoder networks, whose forward passes are most of a
    training step's cost.  With ``precision = "bf16"`` (set by
    :func:`set_decoder_precision`) the forward pass runs under
    :func:`torch.autocast` in bfloat16 -- matrix products and convolutions
    take bfloat16 inputs and accumulate in float32 -- and its outputs are cast
    back to float32, so likelihoods, KL terms, priors and the parameters
    themselves stay float32 (autocast keeps float32 weights and casts copies).
    bfloat16 keeps float32's range with an 8-bit mantissa: outputs carry a
    relative error of order 1e-2.
    """

    precision = "fp32"

    def __call__(self, *args, **kwargs):
        if self.precision != "bf16":
            return super().__call__(*args, **kwargs)
        device_type = next(self.parameters()).device.type
        with torch.autocast(device_type, dtype=torch.bfloat16):
            output = super().__call__(*args, **kwargs)
        if isinstance(output, tuple):
            return tuple(part.float() for part in output)
        return output.float()


def mlp(in_dim, hidden_dims, out_dim):
    """A ReLU multilayer perceptron ``in_dim -> hidden_dims... -> out_dim``."""
    layers, width = [], in_dim
    for hidden in hidden_dims:
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, out_dim))
    return nn.Sequential(*layers)


class MaskedDecoder(Decoder):
    r"""
    The sparse decoder of Moran et al. (2022) Eq. 1: feature j is the j-th
    output of one network f_θ applied to the masked code w_j ⊙ z_i,

    .. math:: \mu_{ij} = f_\theta(w_j \odot z_i)_j .

    All features are evaluated as batched tensors of shape
    ``(features, batch, hidden)``; only row j of the last layer is applied to
    feature j, so the cost is one hidden-layer pass per (data point, feature)
    pair and never G full networks.  Two sizes govern the work:

    * *blocks* of features are computed at a time so that a block's
      activations stay in CPU cache (``block_rows`` rows of ``batch x
      features``; on CUDA one block is a whole chunk, to keep kernels large);
    * *chunks* of features hold activations that fit ``memory_budget_bytes``;
      when more than one chunk is needed, each is recomputed in the backward
      pass (activation checkpointing), so peak memory is set by the chunk
      size, not by G.

    The columns of the first layer have unit norm.  Without that, the scale of
    W can be traded against the first layer (W·c and H1/c give the same
    likelihood) and the prior on W would only shrink W while H1 grows.

    :param int num_features: G.
    :param int latent_dim: K.
    :param tuple hidden_dims: widths of the hidden layers of f_θ.
    :param int memory_budget_bytes: activation memory one chunk may use.
    :param int block_rows: (data point, feature) rows per compute block on CPU.
    """

    def __init__(self, num_features, latent_dim, hidden_dims, memory_budget_bytes=2**30, block_rows=2048):
        super().__init__()
        if not hidden_dims:
            raise ValueError("MaskedDecoder needs at least one hidden layer")
        self.num_features, self.latent_dim = num_features, latent_dim
        self.hidden_dims = tuple(hidden_dims)
        self.memory_budget_bytes, self.block_rows = memory_budget_bytes, block_rows
        first = nn.Linear(latent_dim, self.hidden_dims[0])
        self.first_weight = first.weight  # (H1, K), used column-normalised
        self.first_bias = first.bias
        self.hidden = nn.ModuleList(
            nn.Linear(a, b) for a, b in zip(self.hidden_dims[:-1], self.hidden_dims[1:])
        )
        width = self.hidden_dims[-1]
        bound = 1 / math.sqrt(width)
        self.out_weight = nn.Parameter(torch.empty(num_features, width).uniform_(-bound, bound))
        self.out_bias = nn.Parameter(torch.zeros(num_features))
        self.output_affine = FeatureAffine(num_features)

    def normalized_first_weight(self):
        return self.first_weight / self.first_weight.norm(dim=0, keepdim=True).clamp_min(1e-12)

    def _bytes_per_feature(self, batch_size):
        # float32 activations of every hidden layer, kept for backward, and their gradients.
        return batch_size * sum(self.hidden_dims) * 4 * 2

    def chunk_size(self, batch_size):
        """Features per chunk: activations kept for backward (one block per layer) fit the budget."""
        return max(1, min(self.num_features, self.memory_budget_bytes // max(1, self._bytes_per_feature(batch_size))))

    def step_memory_bytes(self, batch_size):
        """
        Estimated peak memory of one forward and backward pass on
        ``batch_size`` codes: one chunk's activations (at least one feature's,
        whatever the budget) and the (batch, G) outputs with their gradients.
        """
        outputs = batch_size * self.num_features * 4 * 4
        return self.chunk_size(batch_size) * self._bytes_per_feature(batch_size) + outputs

    def _decode_block(self, z, mask, out_weight, out_bias, first_weight):
        # One masked copy of the batch per feature in the block, as (F * B, K)
        # rows: the layers' outputs are then whole 2-D tensors, not views of
        # one, so the in-place ReLUs need no copy-and-zero-fill in backward
        # (autograd's CopySlices for in-place ops on views): 5-11 % of a decoder step.
        num_features, batch = mask.shape[0], z.shape[0]
        h = torch.relu_(F.linear((mask.unsqueeze(1) * z).view(num_features * batch, -1), first_weight, self.first_bias))
        for layer in self.hidden:
            h = torch.relu_(layer(h))
        # Feature j only needs row j of the last layer: a batched (B, H) @ (H, 1).
        out = torch.baddbmm(out_bias[:, None, None], h.view(num_features, batch, -1), out_weight.unsqueeze(-1))
        return out.squeeze(-1).transpose(0, 1)  # (B, F)

    def _decode_chunk(self, z, mask, out_weight, out_bias, first_weight):
        features = mask.shape[0]
        block = features if z.is_cuda else max(1, self.block_rows // z.shape[0])
        if block >= features:
            return self._decode_block(z, mask, out_weight, out_bias, first_weight)
        return torch.cat(
            [
                self._decode_block(z, mask[rows], out_weight[rows], out_bias[rows], first_weight)
                for rows in (slice(start, start + block) for start in range(0, features, block))
            ],
            dim=-1,
        )

    def forward(self, z, mask, features=None):
        """
        :param torch.Tensor z: codes, shape ``(..., batch, K)``.
        :param torch.Tensor mask: W, shape ``(G, K)``.
        :param torch.Tensor features: indices of the features to compute
            (feature subsampling); ``None`` for all G.  Only these are decoded.
        :returns: decoder outputs, shape ``(..., batch, G)`` or ``(..., batch, len(features))``.
        """
        batch_shape = z.shape[:-1]
        z = z.reshape(-1, self.latent_dim)
        first_weight = self.normalized_first_weight()
        out_weight, out_bias = self.out_weight, self.out_bias
        if features is not None:
            mask, out_weight, out_bias = mask[features], out_weight[features], out_bias[features]
        num_features = mask.shape[0]
        size = self.chunk_size(z.shape[0])
        if size >= num_features:
            out = self._decode_chunk(z, mask, out_weight, out_bias, first_weight)
        else:
            pieces = []
            for start in range(0, num_features, size):
                rows = slice(start, start + size)
                args = (z, mask[rows], out_weight[rows], out_bias[rows], first_weight)
                if torch.is_grad_enabled():
                    pieces.append(checkpoint(self._decode_chunk, *args, use_reentrant=False))
                else:
                    pieces.append(self._decode_chunk(*args))
            out = torch.cat(pieces, dim=-1)
        return self.output_affine(out, features).reshape(*batch_shape, num_features)


class DenseDecoder(Decoder):
    """The VAE decoder: an MLP from K latents to G outputs, then the feature affine map."""

    def __init__(self, num_features, latent_dim, hidden_dims):
        super().__init__()
        self.net = mlp(latent_dim, hidden_dims, num_features)
        self.output_affine = FeatureAffine(num_features)

    def forward(self, z):
        return self.output_affine(self.net(z))


class HeteroscedasticDecoder(Decoder):
    """
    An MLP from K latents to a mean and a variance per feature and data point
    (Tonolini et al., supplement A.1: the likelihood network outputs μ and
    log σ²).  The log-variance is clipped, and ``min_variance`` times the
    *average* feature variance is added, one floor for all features, so that a
    feature that is (nearly) constant in the training data cannot drive the
    likelihood to ± infinity on new data.
    """

    def __init__(self, num_features, latent_dim, hidden_dims, min_variance=1e-3):
        super().__init__()
        self.net = mlp(latent_dim, hidden_dims, 2 * num_features)
        self.output_affine = FeatureAffine(num_features)
        self.min_variance = float(min_variance)

    def forward(self, z):
        raw_loc, log_variance = self.net(z).chunk(2, dim=-1)
        scale_squared = self.output_affine.scale**2
        variance = log_variance.clamp(-20.0, 20.0).exp() * scale_squared + self.min_variance * scale_squared.mean()
        return self.output_affine(raw_loc), variance


def _check_image_28(num_features):
    if num_features != 28 * 28:
        raise ValueError(f"the conv networks are for 28x28 images (784 features), got {num_features} features")


class ConvEncoder28(nn.Module):
    """
    The encoder of Fallah & Rozell (2022) Table 5 for 28x28 images: four
    4x4 convolutions (64, 64, 128, 64 channels; strides 2, 2, 1, 2) with
    BatchNorm and ReLU, flattened (64 x 2 x 2) and mapped linearly to
    ``out_dim``.  (The table's garbled last rows list a 128-wide output; we end
    in a linear layer to whatever the guide needs.)
    """

    def __init__(self, num_features, out_dim):
        super().__init__()
        _check_image_28(num_features)

        def block(cin, cout, stride, pad):
            return [nn.Conv2d(cin, cout, 4, stride, pad), nn.BatchNorm2d(cout), nn.ReLU()]

        self.net = nn.Sequential(
            *block(1, 64, 2, 1), *block(64, 64, 2, 1), *block(64, 128, 1, 0), *block(128, 64, 2, 1),
            nn.Flatten(), nn.Linear(64 * 2 * 2, out_dim),
        )

    def forward(self, x):
        batch_shape = x.shape[:-1]
        out = self.net(x.reshape(-1, 1, 28, 28))
        return out.reshape(*batch_shape, -1)


class ConvDecoder28(Decoder):
    """
    The generator of Fallah & Rozell (2022) Table 5: a linear layer to 128
    units, then transposed 4x4 convolutions 128 -> 64 -> 64 -> 1 (4x4 -> 7x7
    -> 14x14 -> 28x28) with BatchNorm and ReLU.  The table's final sigmoid is
    replaced by the feature affine map (standardised units), as for the other
    decoders, so one network serves unit-norm and [0, 1] images and, with a
    Bernoulli likelihood, returns logits.
    """

    def __init__(self, num_features, latent_dim):
        super().__init__()
        _check_image_28(num_features)

        def block(cin, cout, stride, pad):
            return [nn.ConvTranspose2d(cin, cout, 4, stride, pad), nn.BatchNorm2d(cout), nn.ReLU()]

        self.input = nn.Sequential(nn.Linear(latent_dim, 128), nn.ReLU())
        self.net = nn.Sequential(
            *block(128, 128, 2, 0), *block(128, 64, 1, 0), *block(64, 64, 2, 1),
            nn.ConvTranspose2d(64, 1, 4, 2, 1), nn.Flatten(),
        )
        self.output_affine = FeatureAffine(num_features)

    def forward(self, z):
        batch_shape = z.shape[:-1]
        h = self.input(z.reshape(-1, z.shape[-1])).reshape(-1, 128, 1, 1)
        return self.output_affine(self.net(h)).reshape(*batch_shape, -1)
