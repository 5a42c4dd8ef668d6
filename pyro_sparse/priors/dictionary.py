"""The linear generator x ≈ A z of sparse coding as a global Pyro site (Fallah & Rozell 2022, Eq. 11-12)."""

import math

import pyro
import pyro.distributions as dist
import torch
from torch.distributions import constraints, transform_to
from torch.distributions.transforms import Transform

from pyro_sparse.checks import positive_number


class _SharedNormColumns(constraints.Constraint):
    """(..., G, K) matrices whose K columns all have the same Euclidean norm."""

    event_dim = 2

    def check(self, value):
        norms = value.norm(dim=-2)
        return ((norms - norms.mean(-1, keepdim=True)).abs() <= 1e-4 * norms.mean(-1, keepdim=True)).all(-1)


#: The support of a dictionary whose atoms share one norm (:class:`LinearGenerator`, ``shared_atom_norm``).
shared_norm_columns = _SharedNormColumns()


class _ShareColumnNorms(Transform):
    """
    U -> the columns of U rescaled to their root-mean-square norm ‖U‖_F/√K: every
    direction is kept, the common norm is learned through U, ‖A‖_F = ‖U‖_F.
    Not injective (only the directions and ‖U‖_F matter); its inverse is the
    identity on the codomain.
    """

    domain = constraints.independent(constraints.real, 2)
    codomain = shared_norm_columns

    def __eq__(self, other):
        return isinstance(other, _ShareColumnNorms)

    def _call(self, x):
        norms = x.norm(dim=-2, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
        return x / norms * norms.pow(2).mean(-1, keepdim=True).sqrt()

    def _inverse(self, y):
        return y


@transform_to.register(_SharedNormColumns)
def _transform_to_shared_norm_columns(constraint):
    return _ShareColumnNorms()


class LinearGenerator:
    r"""
    A dictionary A (G x K) shared by all data points, sampled at the global
    site ``"A"``, and the generator output A z_i.

    Eq. 11 adds the Frobenius penalty κ‖A‖² to every data point's loss, i.e.
    N κ ‖A‖² over N data points: minus the log-density, up to a constant, of
    a Normal(0, (2κN)^-1/2) prior on each entry.  Models declare A a point
    estimate (:meth:`point_estimate_sites`), so the guide's Delta makes it the
    penalised MAP dictionary of the paper.

    With ``shared_atom_norm`` (the default) the point estimate is restricted to atoms
    (columns) of one common norm, learned like the rest, as the unit-norm
    columns of Olshausen & Field (1996) but with the scale still set by the
    likelihood, the code prior and κ. Under the paper's Frobenius penalty
    alone the atoms used first grow, which makes their codes cheaper under
    the code prior, so they win the patches while the others stay near
    their initial norm, unused; a shared norm leaves the competition to the
    directions (results of ``benchmarks/sparse_coding_patches.py``).

    A model calls :meth:`sample_dictionary` outside its data plate and the
    generator (``self(dictionary, z)``) inside it.

    :param int num_features: G.
    :param int latent_dim: K, the number of atoms.
    :param float penalty: κ.
    :param bool shared_atom_norm: restrict A to atoms of one common norm; ``False``
        leaves each atom's norm to the Frobenius penalty (the paper's).
    """

    site = "A"

    def __init__(self, num_features, latent_dim, penalty, shared_atom_norm=True):
        self.num_features, self.latent_dim = num_features, latent_dim
        self.penalty = positive_number("dictionary_penalty", penalty)
        self.shared_atom_norm = bool(shared_atom_norm)

    def point_estimate_sites(self):
        """The site's initial value and support, for a guide's point estimates."""
        # A small random dictionary: exactly zero would make every code useless.
        init = torch.randn(self.num_features, self.latent_dim) / math.sqrt(self.latent_dim)
        if self.shared_atom_norm:
            return {self.site: (_ShareColumnNorms()(init), shared_norm_columns)}
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
