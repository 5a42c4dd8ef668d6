"""The sparse decoder of the sparse VAE (Moran et al. 2022, Eq. 1) and its memory checks."""

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from pyro_sparse.nn.networks import Decoder, FeatureAffine


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


class MaskedDecoder(Decoder):
    r"""
    The sparse decoder of Moran et al. (2022) Eq. 1: feature j is the j-th
    output of one network f_θ applied to the masked code w_j ⊙ z_i,

    .. math:: \mu_{ij} = f_\theta(w_j \odot z_i)_j .

    All features are evaluated as batched tensors of shape
    ``(features, batch, hidden)``; only row j of the last layer is applied to
    feature j, so the cost is one hidden-layer pass per (data point, feature)
    pair and never G full networks.  Two sizes govern the work:

    * *blocks* of features are computed at a time so that a block's widest
      activation, (features in the block x batch) rows of the widest layer,
      stays in a CPU core's cache (``block_bytes``; on CUDA one block is a
      whole chunk, to keep kernels large);
    * *chunks* of features hold activations that fit ``memory_budget_bytes``;
      when more than one chunk is needed, each is recomputed in the backward
      pass (activation checkpointing), so peak memory is set by the chunk
      size, not by G.

    The columns of the first layer have unit norm.  Without that, the scale of
    W's column k can be traded against column k of the first layer (W·c and
    H1/c give the same likelihood) and the prior on W would only shrink W while
    H1 grows.  ReLU is positively homogeneous, so a global trade remains: W·c
    with the first bias ·c and the next layer ·1/c is the same network, and
    under the SSL prior W shrinks below the spike-and-slab boundary while the
    later layers amplify (measured on binary data: docs/results/synthetic.rst).
    With ``gain="fixed"`` that trade is removed too: every row of the later
    hidden layers has norm √2 (He's gain for ReLU, so activations keep their
    scale) and every row of the output layer norm 1 (weight normalisation
    with a fixed gain, Salimans & Kingma 2016).  Then W·c with every bias ·c
    scales the outputs by c: no layer can make up for a smaller W.

    :param int num_features: G.
    :param int latent_dim: K.
    :param tuple hidden_dims: widths of the hidden layers of f_θ.
    :param int memory_budget_bytes: activation memory one chunk may use.
    :param int block_bytes: size of a compute block's widest activation on CPU
        (float32): about one core's L2 cache.  Measured on a 1 MiB L2 CPU:
        docs/results/speed.rst.
    :param str gain: ``"free"`` (unconstrained later layers) or ``"fixed"`` (their rows' norms
        fixed, above).
    """

    def __init__(self, num_features, latent_dim, hidden_dims, memory_budget_bytes=2**30, block_bytes=2**20,
                 covariate_dim=0, gain="free"):
        super().__init__()
        if gain not in ("free", "fixed"):
            raise ValueError(f"decoder_gain must be 'free' or 'fixed', got {gain!r}")
        self.gain = gain
        if not hidden_dims:
            raise ValueError("the sparse decoder needs at least one hidden layer: hidden_dims=() is not allowed")
        self.num_features, self.latent_dim = num_features, latent_dim
        self.hidden_dims = tuple(hidden_dims)
        self.memory_budget_bytes, self.block_bytes = memory_budget_bytes, block_bytes
        first = nn.Linear(latent_dim, self.hidden_dims[0])
        self.first_weight = first.weight  # (H1, K), used column-normalised
        self.first_bias = first.bias
        # Covariates enter the first layer unmasked: they are not factors, and W does not gate them.
        self.covariate_weight = nn.Parameter(torch.zeros(self.hidden_dims[0], covariate_dim)) if covariate_dim else None
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

    def layer_weights(self, features=None):
        """
        The later hidden layers' (weight, bias) and the output weight (rows ``features``; None: all),
        as the forward pass uses them.
        """
        hidden = [(layer.weight, layer.bias) for layer in self.hidden]
        out_weight = self.out_weight if features is None else self.out_weight[features]
        if self.gain == "free":
            return hidden, out_weight
        hidden = [(math.sqrt(2) * w / w.norm(dim=1, keepdim=True).clamp_min(1e-12), b) for w, b in hidden]
        return hidden, out_weight / out_weight.norm(dim=1, keepdim=True).clamp_min(1e-12)

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

    def block_features(self, batch_size):
        """Features per compute block on CPU for ``batch_size`` codes."""
        return max(1, self.block_bytes // (4 * max(self.hidden_dims) * batch_size))

    def _decode_block(self, z, mask, out_weight, out_bias, first_weight, first_bias, hidden):
        # One masked copy of the batch per feature in the block, as (F * B, K)
        # rows: the layers' outputs are then whole 2-D tensors, not views of
        # one, so the in-place ReLUs need no copy-and-zero-fill in backward
        # (autograd's CopySlices for in-place ops on views): 5-11 % of a decoder step.
        num_features, batch = mask.shape[0], z.shape[0]
        rows = (mask.unsqueeze(1) * z).view(num_features * batch, -1)
        if first_bias.dim() == 1:
            h = torch.relu_(F.linear(rows, first_weight, first_bias))
        else:  # a (B, H1) bias per data point: the covariates' share of the first layer
            h = F.linear(rows, first_weight).view(num_features, batch, -1).add_(first_bias)
            h = torch.relu_(h.view(num_features * batch, -1))
        for weight, bias in hidden:
            h = torch.relu_(F.linear(h, weight, bias))
        # Feature j only needs row j of the last layer: one dot product per (feature, data point), taken
        # elementwise rather than as a bmm with a unit dimension, whose backward is slow on CPU.
        out = torch.linalg.vecdot(h.view(num_features, batch, -1), out_weight.unsqueeze(1)) + out_bias.unsqueeze(-1)
        return out.transpose(0, 1)  # (B, F)

    def _decode_chunk(self, z, mask, out_weight, out_bias, first_weight, first_bias, hidden):
        features = mask.shape[0]
        block = features if z.is_cuda else self.block_features(z.shape[0])
        if block >= features:
            return self._decode_block(z, mask, out_weight, out_bias, first_weight, first_bias, hidden)
        return torch.cat(
            [
                self._decode_block(z, mask[rows], out_weight[rows], out_bias[rows], first_weight, first_bias, hidden)
                for rows in (slice(start, start + block) for start in range(0, features, block))
            ],
            dim=-1,
        )

    def forward(self, z, mask, features=None, covariates=None):
        """
        :param torch.Tensor z: codes, shape ``(..., batch, K)``.
        :param torch.Tensor mask: W, shape ``(G, K)``.
        :param torch.Tensor features: indices of the features to compute
            (feature subsampling); ``None`` for all G.  Only these are decoded.
        :param torch.Tensor covariates: (batch, C), or ``None``.
        :returns: decoder outputs, shape ``(..., batch, G)`` or ``(..., batch, len(features))``.
        """
        batch_shape = z.shape[:-1]
        z = z.reshape(-1, self.latent_dim)
        first_weight = self.normalized_first_weight()
        first_bias = self.first_bias
        if self.covariate_weight is not None and covariates is not None:
            covariates = covariates.expand(*batch_shape, covariates.shape[-1]).reshape(z.shape[0], -1)
            first_bias = torch.addmm(self.first_bias, covariates, self.covariate_weight.T)
        hidden, out_weight = self.layer_weights(features)
        out_bias = self.out_bias
        if features is not None:
            mask, out_bias = mask[features], out_bias[features]
        num_features = mask.shape[0]
        size = self.chunk_size(z.shape[0])
        if size >= num_features:
            out = self._decode_chunk(z, mask, out_weight, out_bias, first_weight, first_bias, hidden)
        else:
            pieces = []
            for start in range(0, num_features, size):
                rows = slice(start, start + size)
                args = (z, mask[rows], out_weight[rows], out_bias[rows], first_weight, first_bias, hidden)
                if torch.is_grad_enabled():
                    pieces.append(checkpoint(self._decode_chunk, *args, use_reentrant=False))
                else:
                    pieces.append(self._decode_chunk(*args))
            out = torch.cat(pieces, dim=-1)
        return self.output_affine(out, features).reshape(*batch_shape, num_features)
