"""The plate over data points, shared by models, guides, priors and inference."""

import pyro
import torch


def data_plate(x, num_data=None):
    """
    The plate over data points for a minibatch ``x`` drawn from ``num_data``
    points.  The loader has already drawn the batch, so the plate only needs
    the sizes: log-densities inside it are scaled by num_data / len(x), which
    makes the minibatch ELBO an unbiased estimate of the full-data ELBO while
    global prior terms count once per step.
    """
    batch = x.shape[0]
    return pyro.plate(
        "data", size=num_data or batch, subsample=torch.arange(batch, device=x.device), dim=-1
    )


def in_data_plate(msg):
    return any(frame.name == "data" for frame in msg["cond_indep_stack"])
