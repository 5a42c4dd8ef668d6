"""The linear generator x ≈ A z of sparse coding as a global Pyro site (Fallah & Rozell 2022, Eq. 11-12)."""

import math

import pyro
import pyro.distributions as dist
import torch
from torch.distributions import constraints


class LinearGenerator:
    r"""
    A dictionary A (G x K) shared by all data points, sampled at the global
    site ``"A"``, and the generator output A z_i.

    Eq. 11 adds the Frobenius penalty κ‖A‖² to every data point's loss, i.e.
    N κ ‖A‖² over N data points: minus the log-density, up to a constant, of
    a Normal(0, (2κN)^-1/2) prior on each entry.  Models declare A a point
    estimate (:meth:`point_estimate_sites`), so the guide's Delta makes it the
    penalised MAP dictionary of the paper.

    A model calls :meth:`sample_dictionary` outside its data plate and the
    generator (``self(dictionary, z)``) inside it.

    :param int num_features: G.
    :param int latent_dim: K, the number of atoms.
    :param float penalty: κ.
    """

    site = "A"

    def __init__(self, num_features, latent_dim, penalty):
        if not penalty > 0:
            raise ValueError(f"dictionary_penalty must be positive, got {penalty}")
        self.num_features, self.latent_dim, self.penalty = num_features, latent_dim, float(penalty)

    def point_estimate_sites(self):
        """The site's initial value and support, for a guide's point estimates."""
        # A small random dictionary: exactly zero would make every code useless.
        init = torch.randn(self.num_features, self.latent_dim) / math.sqrt(self.latent_dim)
        return {self.site: (init, constraints.real)}

    def sample_dictionary(self, x, num_data=None):
        """The global site A under its Frobenius prior, for a minibatch ``x`` of ``num_data`` points."""
        scale = (2 * self.penalty * (num_data or x.shape[0])) ** -0.5
        prior = dist.Normal(x.new_zeros(()), scale).expand([self.num_features, self.latent_dim])
        return pyro.sample(self.site, prior.to_event(2))

    def __call__(self, dictionary, z):
        """
        A z for codes ``z`` of shape ``(..., batch, K)``: shape ``(..., batch, G)``.
        ``dictionary`` is (G, K), or (..., 1, G, K) inside plates: A is global,
        so its dim at the data plate's position (that of ``batch``) is 1.
        """
        if dictionary.dim() > 2:
            if dictionary.shape[-3] != 1:
                raise ValueError(
                    f"expected a dictionary of shape (..., 1, G, K) inside the data plate, got {tuple(dictionary.shape)}"
                )
            # With vectorised particles A is (J, 1, G, K) and z (J, B, K): drop
            # the 1 for one matrix product per particle.  Broadcasting it
            # instead would copy A for every data point (B x the memory, ~60x
            # slower at J = 20, B = 100, G = K = 256).
            dictionary = dictionary.squeeze(-3)
        return z @ dictionary.transpose(-1, -2)
