"""Variational sparse coding (Tonolini, Jensen & Murray-Smith, 2019/2020)."""

import pyro
from pyro import poutine
from torch import nn

from pyro_sparse.distributions import SpikeAndSlab
from pyro_sparse.handlers import data_plate
from pyro_sparse.likelihoods import check_likelihood, observation
from pyro_sparse.nn import DenseDecoder, HeteroscedasticDecoder


class VSC(nn.Module):
    r"""
    Spike-and-slab latent codes with a dense decoder (ICLR version Eq. 4-5):

    .. math::

        z_{ij} \sim \alpha\,\mathcal N(0, 1) + (1 - \alpha)\,\delta_0, \qquad
        x_i \sim \mathcal N\big(\mu_\theta(z_i), \operatorname{diag}\sigma^2_\theta(z_i)\big)

    with the Gaussian likelihood of the paper (the decoder outputs a mean and
    a log-variance per feature, supplement A.1), or Bernoulli / multinomial
    logits.  The prior spike probability α sets the expected share of active
    code dimensions; the guide is :class:`~pyro_sparse.guides.SpikeSlabGuide`,
    and the KL between the two spike-and-slab distributions is the closed
    form registered with ``torch.distributions.kl`` (Eq. 9).

    :param int num_features: G.
    :param int latent_dim: K.
    :param str likelihood: ``"gaussian"``, ``"bernoulli"`` or ``"multinomial"``.
    :param tuple hidden_dims: widths of the decoder (and encoder) MLP.
    :param float alpha: prior probability that a code dimension is non-zero.
    :param float beta: weight of the KL term (1 is the paper's ELBO).
    :param float min_noise_variance: floor of the decoder variance, in
        standardised units (gaussian only).
    """

    def __init__(
        self,
        num_features,
        latent_dim=20,
        likelihood="gaussian",
        hidden_dims=(400,),
        alpha=0.01,
        beta=1.0,
        min_noise_variance=1e-3,
    ):
        super().__init__()
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        if not beta > 0:
            raise ValueError(f"beta must be positive, got {beta}")
        self.num_features, self.latent_dim = num_features, latent_dim
        self.likelihood = check_likelihood(likelihood)
        self.hidden_dims = tuple(hidden_dims)
        self.alpha, self.beta = float(alpha), float(beta)
        if self.likelihood == "gaussian":
            self.decoder = HeteroscedasticDecoder(num_features, latent_dim, hidden_dims, min_noise_variance)
        else:
            self.decoder = DenseDecoder(num_features, latent_dim, hidden_dims)
        self.site_priors = nn.ModuleDict()

    def point_estimate_sites(self, feature_variances):
        return {}

    def latent_prior(self, like):
        return SpikeAndSlab(like.new_full((self.latent_dim,), self.alpha), 0.0, 1.0).to_event(1)

    def forward(self, x, num_data=None):
        with data_plate(x, num_data):
            with poutine.scale(scale=self.beta):
                z = pyro.sample("z", self.latent_prior(x))
            if self.likelihood == "gaussian":
                loc, variance = self.decoder(z)
                pyro.sample("x", observation("gaussian", loc, variance), obs=x)
            else:
                pyro.sample("x", observation(self.likelihood, self.decoder(z)), obs=x)
