"""The amortized Gaussian encoder q_φ(z | x) of the VAE and the sparse VAE."""

import pyro.distributions as dist
import torch.nn.functional as F

from pyro_sparse.guides.amortized import AmortizedGuide


class AmortizedNormalGuide(AmortizedGuide):
    r"""
    q_φ(z_i | x_i) = N_K(μ_φ(x_i), diag σ²_φ(x_i))  (Moran et al. 2022, Eq. 6),
    with point masses for the model's global sites (see :class:`AmortizedGuide`).
    """

    def __init__(
        self,
        num_features,
        latent_dim,
        hidden_dims=(50, 50, 50),
        point_estimates=None,
        log1p_input=False,
        kl_weight=1.0,
        network="mlp",
    ):
        super().__init__(num_features, latent_dim, 2, hidden_dims, point_estimates, log1p_input, kl_weight, network)

    def posterior(self, x):
        loc, raw_scale = self.encoder_outputs(x)
        return dist.Normal(loc, F.softplus(raw_scale) + 1e-4).to_event(1)
