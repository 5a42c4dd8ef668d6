"""Figures (matplotlib is the optional ``plot`` extra).  Each function returns a Figure."""

import numpy as np


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


def mask_heatmap(W, feature_names=None):
    """|W| as a features x factors heatmap; exact zeros are white."""
    plt = _pyplot()
    W = np.abs(np.asarray(W))
    figure, axis = plt.subplots(figsize=(1.2 + 0.5 * W.shape[1], 1.2 + 0.3 * min(W.shape[0], 60)))
    image = axis.imshow(np.ma.masked_equal(W, 0), aspect="auto", cmap="viridis", interpolation="nearest")
    axis.set_xlabel("factor k")
    axis.set_ylabel("feature j")
    axis.set_xticks(range(W.shape[1]))
    if feature_names is not None and W.shape[0] <= 60:
        axis.set_yticks(range(W.shape[0]), labels=list(feature_names))
    figure.colorbar(image, ax=axis, label="|W_jk|")
    figure.tight_layout()
    return figure
