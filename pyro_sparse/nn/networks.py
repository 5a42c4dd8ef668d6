"""Plain torch networks shared by models and guides (no Pyro here)."""


import contextlib
import contextvars

import torch
import torch.distributed as dist
import torch.distributed.nn as dist_nn
import torch.nn.functional as F
from torch import nn


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


def with_covariates(z, covariates):
    """Codes ``z`` (..., B, K) with the (B, C) covariates appended along the last dim (``None``: z itself)."""
    if covariates is None:
        return z
    return torch.cat([z, covariates.expand(*z.shape[:-1], covariates.shape[-1])], dim=-1)


_ROWS_UNCOUNTED = contextvars.ContextVar("rows_uncounted", default=False)


@contextlib.contextmanager
def rows_uncounted():
    """
    Rows passed through :class:`RowBatchNorm` inside this context add nothing
    to the batch statistics: a distributed rank whose slice of a short last
    batch is empty computes its loss on a placeholder row (weighted 0) that
    must not move the global mean, variance or running statistics.
    """
    token = _ROWS_UNCOUNTED.set(True)
    try:
        yield
    finally:
        _ROWS_UNCOUNTED.reset(token)


class RowBatchNorm(nn.BatchNorm1d):
    """
    Batch normalisation of a (..., C) input whose leading dims are all rows
    (``nn.BatchNorm1d`` would read a second dim as channels).  Under
    distributed training the statistics are those of the global minibatch
    (a differentiable all-reduce of the ranks' sums), so every rank keeps the
    same running statistics and the gradient is the one-process gradient
    (two all-reduces: the mean, then the centred squares).  A
    training batch of one row is normalised with the running statistics: its
    own variance is undefined.  Rows under :func:`rows_uncounted` count for
    nothing.
    """

    def forward(self, x):
        rows = x.reshape(-1, x.shape[-1])
        if not self.training:
            return super().forward(rows).reshape(x.shape)
        counted = 0.0 if _ROWS_UNCOUNTED.get() else 1.0
        stats = torch.cat([rows.sum(0), rows.new_full((1,), rows.shape[0])]) * counted
        if dist.is_available() and dist.is_initialized():
            stats = dist_nn.all_reduce(stats)
        count = stats[-1].detach()
        if count < 2:
            out = F.batch_norm(rows, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
            return out.reshape(x.shape)
        mean = stats[:-1] / count
        # Two passes: E[x²] - E[x]² cancels in float32 when the mean is large against the spread.
        squares = (rows - mean).square().sum(0) * counted
        if dist.is_available() and dist.is_initialized():
            squares = dist_nn.all_reduce(squares)
        variance = squares / count
        with torch.no_grad():
            self.num_batches_tracked += 1
            self.running_mean.lerp_(mean, self.momentum)
            self.running_var.lerp_(variance * count / (count - 1), self.momentum)
        out = (rows - mean) * torch.rsqrt(variance + self.eps) * self.weight + self.bias
        return out.reshape(x.shape)


def mlp(in_dim, hidden_dims, out_dim, batch_norm=False):
    """
    A ReLU multilayer perceptron ``in_dim -> hidden_dims... -> out_dim``;
    ``batch_norm`` normalises each hidden layer before its ReLU, with scVI's
    momentum and epsilon (Lopez et al. 2018); those layers have no bias of
    their own, which the normalisation would cancel (its gradient is rounding
    noise, which Adam scales up to full steps).
    """
    layers, width = [], in_dim
    for hidden in hidden_dims:
        norm = [RowBatchNorm(hidden, eps=1e-3, momentum=0.01)] if batch_norm else []
        layers += [nn.Linear(width, hidden, bias=not batch_norm), *norm, nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, out_dim))
    return nn.Sequential(*layers)


class DenseDecoder(Decoder):
    """
    The VAE decoder: an MLP from K latents (and C covariates, appended) to G
    outputs, then the feature affine map.
    """

    def __init__(self, num_features, latent_dim, hidden_dims, covariate_dim=0):
        super().__init__()
        self.net = mlp(latent_dim + covariate_dim, hidden_dims, num_features)
        self.output_affine = FeatureAffine(num_features)

    def forward(self, z, covariates=None):
        return self.output_affine(self.net(with_covariates(z, covariates)))


class HeteroscedasticDecoder(Decoder):
    """
    An MLP from K latents to a mean and a variance per feature and data point
    (Tonolini et al., supplement A.1: the likelihood network outputs μ and
    log σ²).  The log-variance is clipped, and ``min_variance`` times the
    *average* feature variance is added, one floor for all features, so that a
    feature that is (nearly) constant in the training data cannot drive the
    likelihood to ± infinity on new data.
    """

    def __init__(self, num_features, latent_dim, hidden_dims, min_variance=1e-3, covariate_dim=0):
        super().__init__()
        self.net = mlp(latent_dim + covariate_dim, hidden_dims, 2 * num_features)
        self.output_affine = FeatureAffine(num_features)
        self.min_variance = float(min_variance)

    def forward(self, z, covariates=None):
        raw_loc, log_variance = self.net(with_covariates(z, covariates)).chunk(2, dim=-1)
        scale_squared = self.output_affine.scale**2
        variance = log_variance.clamp(-20.0, 20.0).exp() * scale_squared + self.min_variance * scale_squared.mean()
        return self.output_affine(raw_loc), variance


@contextlib.contextmanager
def evaluation_mode(*modules):
    """
    Run a block with ``modules`` in eval mode (no batch-norm statistics
    updated, no feature subsampling) and put back each one's mode after it.
    """
    modes = [module.training for module in modules]
    for module in modules:
        module.eval()
    try:
        yield
    finally:
        for module, mode in zip(modules, modes):
            module.train(mode)
