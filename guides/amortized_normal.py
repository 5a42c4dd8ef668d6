"""The amortized Gaussian encoder q_φ(z | x) with point masses for global sites."""

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro import poutine
from torch import nn
from torch.distributions import transform_to

from pyro_sparse.nn import FeatureAffine, mlp
from pyro_sparse.handlers import data_plate


class AmortizedNormalGuide(nn.Module):
    r"""
    q_φ(z_i | x_i) = N_K(μ_φ(x_i), diag σ²_φ(x_i))  (Moran et al. 2022, Eq. 6),
    together with Delta (point-mass) guides for the model's global sites, so
    those are MAP-estimated (Eq. 5).

    :param int num_features: G.
    :param int latent_dim: K.
    :param tuple hidden_dims: widths of the encoder MLP.
    :param dict point_estimates: global site name -> (initial value, support);
        each is stored unconstrained and mapped through ``transform_to(support)``.
    :param bool log1p_input: encode log(1 + x) instead of x (for counts).
    :param float kl_weight: scale of the z site; must equal the model's (β-VAE).
    """

    def __init__(
        self,
        num_features,
        latent_dim,
        hidden_dims=(50, 50, 50),
        point_estimates=None,
        log1p_input=False,
        kl_weight=1.0,
    ):
        super().__init__()
        self.num_features, self.latent_dim = num_features, latent_dim
        self.log1p_input, self.kl_weight = log1p_input, float(kl_weight)
        self.input_affine = FeatureAffine(num_features)
        self.encoder = mlp(num_features, hidden_dims, 2 * latent_dim)
        point_estimates = point_estimates or {}
        self.supports = {name: support for name, (_, support) in point_estimates.items()}
        self.unconstrained = nn.ParameterDict(
            {
                name: nn.Parameter(transform_to(support).inv(torch.as_tensor(value, dtype=torch.float32)))
                for name, (value, support) in point_estimates.items()
            }
        )

    def point_estimate(self, name):
        """The current value of a point-estimated global site."""
        return transform_to(self.supports[name])(self.unconstrained[name])

    def encode(self, x):
        """Posterior mean and standard deviation of z given x."""
        h = self.encoder(self.input_affine.inverse(torch.log1p(x) if self.log1p_input else x))
        loc, raw_scale = h.split(self.latent_dim, dim=-1)
        return loc, F.softplus(raw_scale) + 1e-4

    def forward(self, x, num_data=None):
        for name in self.unconstrained:
            value = self.point_estimate(name)
            pyro.sample(name, dist.Delta(value, event_dim=value.dim()))
        with data_plate(x, num_data), poutine.scale(scale=self.kl_weight):
            loc, scale = self.encode(x)
            pyro.sample("z", dist.Normal(loc, scale).to_event(1))
