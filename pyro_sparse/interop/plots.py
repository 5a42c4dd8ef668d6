"""Figures (matplotlib is the optional ``plot`` extra).  Each function returns a Figure."""

import math

import numpy as np
import torch

from pyro_sparse.checks import is_count
from pyro_sparse.fitted import evaluation_data, feature_labels
from pyro_sparse.infer.importance import expected_observation


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("plots need matplotlib: pip install 'pyro-sparse[plot]'") from None
    return plt


def loss_curve(history):
    """Per-epoch training (and validation) loss per data point."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(5, 3.2))
    axis.plot(range(1, len(history["train_loss"]) + 1), history["train_loss"], label="train (-ELBO / N)")
    if history.get("validation_loss"):
        axis.plot(range(1, len(history["validation_loss"]) + 1), history["validation_loss"], label="validation")
    axis.set_xlabel("epoch")
    axis.set_ylabel("loss per data point")
    axis.legend()
    figure.tight_layout()
    return figure


def _mask(W):
    W = np.asarray(W)
    if W.ndim != 2:
        raise ValueError(f"W must be a (features x factors) matrix, got shape {W.shape}")
    return W


def _factor_order(W):
    """
    Features grouped by the factor of their largest ``|W_jk|``, factor by factor,
    strongest first within a factor; features no factor uses come last.
    """
    W = np.abs(W)
    strength = W.max(1)
    group = np.where(strength > 0, W.argmax(1), W.shape[1])
    return np.lexsort((-strength, group))


def mask_heatmap(W, feature_names=None, order_by_factor=True):
    """
    ``|W|`` as a features x factors heatmap; exact zeros are white.  With
    ``order_by_factor`` the rows are grouped by the factor each feature loads
    on most (a sparse W shows as blocks down the diagonal); labels follow the rows.
    """
    plt = _pyplot()
    W = np.abs(_mask(W))
    names = feature_labels(feature_names, W.shape[0])
    order = _factor_order(W) if order_by_factor else np.arange(W.shape[0])
    figure, axis = plt.subplots(figsize=(1.2 + 0.5 * W.shape[1], 1.2 + 0.3 * min(W.shape[0], 60)))
    image = axis.imshow(np.ma.masked_equal(W[order], 0), aspect="auto", cmap="viridis", interpolation="nearest")
    axis.set_xlabel("factor k")
    axis.set_ylabel("feature j")
    axis.set_xticks(range(W.shape[1]))
    if W.shape[0] <= 60:
        axis.set_yticks(range(W.shape[0]), labels=[names[j] for j in order])
    figure.colorbar(image, ax=axis, label="|W_jk|")
    figure.tight_layout()
    return figure


def top_features(W, k=10, feature_names=None):
    """
    One bar chart per factor that any feature uses: W_jk of its ``k``
    features with the largest non-zero ``|W_jk|``, largest on top.
    """
    plt = _pyplot()
    if not is_count(k):
        raise ValueError(f"k must be a positive integer, got {k!r}")
    W = _mask(W)
    names = feature_labels(feature_names, W.shape[0])
    factors = np.flatnonzero(np.abs(W).sum(0) > 0)
    if factors.size == 0:
        raise ValueError("W is identically zero: no factor uses any feature")
    num_columns = min(factors.size, 4)
    num_rows = math.ceil(factors.size / num_columns)
    bar_rows = min(k, W.shape[0])
    figure, axes = plt.subplots(
        num_rows, num_columns, figsize=(3.4 * num_columns, (0.9 + 0.25 * bar_rows) * num_rows), squeeze=False
    )
    for axis, factor in zip(axes.flat, factors):
        column = W[:, factor]
        top = [j for j in np.argsort(-np.abs(column), kind="stable")[:k] if column[j] != 0]
        axis.barh(range(len(top)), column[top], color=np.where(column[top] > 0, "tab:blue", "tab:red"))
        axis.set_yticks(range(len(top)), labels=[str(names[j]) for j in top])
        axis.set_ylim(bar_rows - 0.5, -0.5)
        axis.axvline(0, color="black", linewidth=0.5)
        axis.set_title(f"factor {factor}")
        axis.set_xlabel("W_jk")
    for axis in axes.flat[factors.size :]:
        axis.remove()
    figure.tight_layout()
    return figure


def latent_traversal(fitted, x, image_shape, dims=None, values=(-3, -2, -1, 0, 1, 2, 3)):
    """
    Decoded images E[x | z] with one code coordinate varied at a time: z
    starts at the posterior mode of the data point ``x`` (shape (1, G), e.g.
    ``X[:1]``) and row d of the grid sets z_d to each of ``values``.
    ``image_shape`` is (height, width) with height * width = G; ``dims``
    default to the first ten code dimensions.  All panels share one grey scale.
    """
    plt = _pyplot()
    if not hasattr(fitted, "guide"):
        raise ValueError(f"latent traversals decode codes with a Pyro model; {fitted.config['model']!r} has none")
    image_shape = tuple(int(size) for size in image_shape)
    if len(image_shape) != 2 or math.prod(image_shape) != fitted.num_features:
        raise ValueError(
            f"image_shape must be (height, width) holding the model's {fitted.num_features} features, got {image_shape}"
        )
    point = evaluation_data(x, fitted.config)
    if point.num_data != 1:
        raise ValueError(f"x must be one data point of shape (1, G), e.g. X[:1]; got {point.num_data} rows")
    start = torch.as_tensor(fitted.transform(x), device=fitted.device)
    latent_dim = start.shape[1]
    dims = list(range(min(latent_dim, 10))) if dims is None else list(dims)
    if not dims or not all(is_count(d, minimum=0) and d < latent_dim for d in dims):
        raise ValueError(f"dims must be code dimensions in [0, {latent_dim}) (integers), got {dims}")
    values = torch.as_tensor(np.asarray(values, dtype=np.float32), device=fitted.device).reshape(-1)
    if values.numel() == 0 or not torch.isfinite(values).all():
        raise ValueError(f"values must be one or more finite code values, got {values.tolist()}")
    repeated = point.rows(np.zeros(len(values), dtype=int), fitted.device)
    images = []
    for d in dims:
        codes = start.repeat(len(values), 1)
        codes[:, d] = values
        images.append(expected_observation(fitted.model, fitted.guide, repeated.x, codes, **repeated.kwargs)
                      .cpu().numpy())
    images = np.stack(images).reshape(len(dims), len(values), *image_shape)
    figure, axes = plt.subplots(
        len(dims), len(values), figsize=(0.2 + 0.9 * len(values), 0.3 + 0.9 * len(dims)), squeeze=False
    )
    for row, d in enumerate(dims):
        for column, value in enumerate(values.tolist()):
            axis = axes[row, column]
            axis.imshow(images[row, column], cmap="gray", vmin=images.min(), vmax=images.max())
            axis.set_xticks([])
            axis.set_yticks([])
            if row == 0:
                axis.set_title(f"{value:.2g}", fontsize=8)
        axes[row, 0].set_ylabel(f"z_{d}")
    figure.tight_layout()
    return figure


def sparsity_histograms(codes):
    """
    How sparse the codes (N, K) are: a histogram over data points of the
    fraction of their K codes that are non-zero, and per dimension k the
    fraction of data points whose z_k is non-zero.
    """
    plt = _pyplot()
    codes = np.asarray(codes)
    if codes.ndim != 2:
        raise ValueError(f"codes must be a (data points x dimensions) matrix, got shape {codes.shape}")
    nonzero = codes != 0
    latent_dim = codes.shape[1]
    figure, (per_point, per_dimension) = plt.subplots(1, 2, figsize=(9, 3.2))
    # One bin per possible count of non-zero codes, centred on count / K.
    per_point.hist(nonzero.mean(1), bins=(np.arange(latent_dim + 2) - 0.5) / latent_dim)
    per_point.set_xlabel("fraction of codes non-zero")
    per_point.set_ylabel("data points")
    per_dimension.bar(range(latent_dim), nonzero.mean(0))
    per_dimension.set_ylim(0, 1)
    per_dimension.set_xlabel("code dimension k")
    per_dimension.set_ylabel("fraction of data points with z_k ≠ 0")
    figure.tight_layout()
    return figure
