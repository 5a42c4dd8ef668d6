"""Pyro effect handlers and plates shared by models, guides and the loop."""

import pyro
import torch
from pyro.poutine.messenger import Messenger


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


class scale_local_latents(Messenger):
    """
    Multiply the scale of every latent (not observed) sample site inside the
    data plate by ``factor``, in the model and the guide alike, so the KL
    term of the local codes is weighted by ``factor`` while the likelihood
    and global priors are not: the KL warm-up of Bowman et al. (2016) and
    Sønderby et al. (2016).
    """

    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def _process_message(self, msg):
        if msg["type"] == "sample" and not msg["is_observed"] and in_data_plate(msg):
            msg["scale"] = msg["scale"] * self.factor
