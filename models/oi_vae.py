"""The output-interpretable VAE (oi-VAE) of Ainsworth, Foti, Lee & Fox (ICML 2018)."""

import itertools
import math

import numpy as np
import pyro
import torch
from torch import nn
from torch.distributions import constraints

from pyro_sparse.checks import is_count, positive_number
from pyro_sparse.nn import Decoder, FeatureAffine, ObservationModel
from pyro_sparse.plates import data_plate
from pyro_sparse.priors import (
    DEFAULT_NOISE_NU,
    GroupLassoPrior,
    NormalPrior,
    calibrated_noise_xi,
    initial_noise_variance,
    noise_prior_options,
    sample_noise_variance,
)


def _stacked_linear(num_groups, in_dim, out_dim):
    """One ``in_dim -> out_dim`` layer per group as (groups, in, out) weights, initialised as ``nn.Linear``."""
    bound = 1 / math.sqrt(in_dim)
    weight = nn.Parameter(torch.empty(num_groups, in_dim, out_dim).uniform_(-bound, bound))
    bias = nn.Parameter(torch.empty(num_groups, 1, out_dim).uniform_(-bound, bound))
    return weight, bias


class GroupGenerators(Decoder):
    r"""
    The oi-VAE decoder: group g's features are the outputs of its own
    generator network applied to its own projection of the code,

    .. math:: x^{(g)} \approx f_{\theta_g}(W^{(g)} z), \qquad W^{(g)} \in \mathbb R^{p \times K}.

    The G generators are evaluated as batched tensors of shape
    ``(groups, batch, hidden)``.  Each generator's first layer has unit-norm
    columns, as in :class:`~pyro_sparse.nn.MaskedDecoder`, so the scale of
    W^{(g)} cannot be traded against the first layer's weights.  (It can
    still be traded against the first bias and the second layer: ReLU is
    positively homogeneous, so W·c, b₁·c and the next layer / c give the same
    output.  The oi-VAE paper's Gaussian prior on the generator weights would
    pin that; like the sparse VAE here, this model has none.)

    :param numpy.ndarray group_of_feature: the group index of each feature, (G,).
    :param int latent_dim: K.
    :param int group_input_dim: p.
    :param tuple hidden_dims: widths of each generator's hidden layers.
    :param int covariate_dim: C, covariates added to every generator's first layer (not through W).
    """

    def __init__(self, group_of_feature, latent_dim, group_input_dim, hidden_dims, covariate_dim=0):
        super().__init__()
        if not hidden_dims:
            raise ValueError("the oi-VAE generators need at least one hidden layer")
        group_of_feature = torch.as_tensor(np.asarray(group_of_feature), dtype=torch.long)
        num_groups = int(group_of_feature.max()) + 1
        # A feature's position inside its group selects its output of the group's generator.
        slot = torch.zeros_like(group_of_feature)
        for g in range(num_groups):
            members = group_of_feature == g
            slot[members] = torch.arange(int(members.sum()))
        self.register_buffer("group_of_feature", group_of_feature)
        self.register_buffer("slot", slot)
        widths = (group_input_dim, *hidden_dims, int(slot.max()) + 1)
        self.layer_weights, self.layer_biases = nn.ParameterList(), nn.ParameterList()
        for in_dim, out_dim in itertools.pairwise(widths):
            weight, bias = _stacked_linear(num_groups, in_dim, out_dim)
            self.layer_weights.append(weight)
            self.layer_biases.append(bias)
        self.output_affine = FeatureAffine(len(group_of_feature))
        self.covariate_weight = (
            nn.Parameter(torch.zeros(num_groups, covariate_dim, hidden_dims[0])) if covariate_dim else None
        )

    def forward(self, z, weights, covariates=None):
        """
        :param torch.Tensor z: codes, shape ``(..., batch, K)``.
        :param torch.Tensor weights: W, shape ``(groups, K, p)``; ``weights[g, k]``
            is column k of W^{(g)}.
        :param torch.Tensor covariates: (batch, C), or ``None``.
        :returns: decoder outputs, shape ``(..., batch, G)``.
        """
        batch_shape = z.shape[:-1]
        h = torch.matmul(z.reshape(1, -1, z.shape[-1]), weights)  # (groups, batch, p)
        first = self.layer_weights[0]
        first = first / torch.linalg.vector_norm(first, dim=-1, keepdim=True).clamp_min(1e-12)
        first_bias = self.layer_biases[0]
        if self.covariate_weight is not None and covariates is not None:
            covariates = covariates.expand(*batch_shape, covariates.shape[-1]).reshape(1, -1, covariates.shape[-1])
            first_bias = first_bias + torch.matmul(covariates, self.covariate_weight)  # (groups, batch, H1)
        last = len(self.layer_weights) - 1
        for index, (weight, bias) in enumerate(zip(self.layer_weights, self.layer_biases)):
            h = torch.baddbmm(first_bias if index == 0 else bias, h, first if index == 0 else weight)
            if index < last:
                h = torch.relu(h)
        out = h[self.group_of_feature, :, self.slot]  # (G, batch)
        return self.output_affine(out.transpose(0, 1)).reshape(*batch_shape, -1)


class OIVAE(nn.Module):
    r"""
    oi-VAE (Ainsworth et al. 2018): z_i ~ N(0, I_K) and, for each group g of
    features, x_i^{(g)} ~ p(x | f_θg(W^{(g)} z_i)), with the group-lasso
    prior -log p(W) = λ Σ_{g,k} ‖W^{(g)}_{·,k}‖₂ + const
    (:class:`~pyro_sparse.priors.GroupLassoPrior`), fitted by a proximal step
    after each gradient step.  A column W^{(g)}_{·,k} that is exactly zero
    means latent k does not reach group g; ``‖W[g, k]‖`` plays the role of
    ``|w_gk|`` in the sparse VAE.  The likelihoods, the σ² prior and β are those
    of :class:`~pyro_sparse.models.ssl_dgm.SparseDGM`.

    For tabular data every feature is its own group (the default), so the
    model has one p x K matrix and one small generator per feature; the
    sparse VAE's mask corresponds to p = 1 with a shared generator.  Table 6
    of Moran et al. (2022) uses λ = 1 and p = 5, the defaults.

    :param int num_features: G.
    :param int latent_dim: K.
    :param str likelihood: ``"gaussian"``, ``"multinomial"`` or ``"bernoulli"``.
    :param tuple hidden_dims: widths of each generator's hidden layers.
    :param float lam: λ, the group-lasso rate on the full-data ELBO.
    :param int group_input_dim: p, the size of each group's projection W^{(g)} z.
    :param groups: a group label per feature (length G); ``None`` makes every
        feature its own group.
    :param float beta: weight of the KL term of z (the guide must match).
    :param float noise_nu: ν of the σ² prior.
    :param float noise_xi: ξ of the σ² prior (calibrated from data by ``train``).
    :param latent_prior: the prior of z, a :class:`~pyro_sparse.priors.LatentPrior`;
        ``None`` for N(0, I_K).
    :param int covariate_dim: C, covariates given with the data (set by ``train``).
    :param int num_batches: categories of the batch covariate (set by ``train``).
    :param str dispersion: inverse dispersion of ``negative_binomial`` / ``zinb``
        per feature (``"gene"``) or per feature and batch (``"gene-batch"``).
    :param str library: ``"observed"`` (the row's total count, or the
        ``size_factor_key`` column) or ``"latent"``: log ℓ_i ~ N(m_b, s_b²) per
        batch, inferred by the guide (:class:`~pyro_sparse.nn.ObservationModel`).
    """

    def __init__(
        self,
        num_features,
        latent_dim=5,
        likelihood="gaussian",
        hidden_dims=(50, 50, 50),
        lam=1.0,
        group_input_dim=5,
        groups=None,
        beta=1.0,
        noise_nu=DEFAULT_NOISE_NU,
        noise_xi=1.0,
        latent_prior=None,
        covariate_dim=0,
        num_batches=1,
        dispersion="gene",
        library="observed",
    ):
        super().__init__()
        if not is_count(group_input_dim):
            raise ValueError(f"group_input_dim must be a positive integer, got {group_input_dim!r}")
        if groups is None:
            group_of_feature = np.arange(num_features)
        else:
            groups = np.asarray(groups)
            if groups.shape != (num_features,):
                raise ValueError(f"groups must give one label per feature ({num_features}), got shape {groups.shape}")
            try:
                _, group_of_feature = np.unique(groups, return_inverse=True)
            except TypeError:  # labels numpy cannot sort: None beside text, text beside numbers
                raise ValueError(f"groups must be labels of one kind that sort (all text or all numbers, no None), "
                                 f"got {sorted({type(g).__name__ for g in groups.tolist()})}") from None
        self.num_features, self.latent_dim = num_features, latent_dim
        self.num_groups, self.group_input_dim = int(group_of_feature.max()) + 1, int(group_input_dim)
        self.observation = ObservationModel(likelihood, num_features, num_batches, dispersion, library)
        self.likelihood = self.observation.likelihood
        self.beta = positive_number("beta", beta)
        self.noise_nu, self.noise_xi = noise_prior_options(noise_nu, noise_xi)
        self.hidden_dims = tuple(hidden_dims)
        self.decoder = GroupGenerators(group_of_feature, latent_dim, self.group_input_dim, self.hidden_dims,
                                       covariate_dim)
        self.site_priors = nn.ModuleDict(
            {"W": GroupLassoPrior(self.num_groups, latent_dim, self.group_input_dim, lam)}
        )
        self.latent_prior = NormalPrior(latent_dim) if latent_prior is None else latent_prior

    # W is a global site: a vectorised particle dim on it would not fit the
    # generators, so particles are drawn one pass at a time.
    vectorized_particles = False

    @classmethod
    def data_defaults(cls, summary, likelihood, hyper):
        """Hyperparameters calibrated from the training data: ξ of the σ² prior (Appendix C.2)."""
        if likelihood != "gaussian":
            return hyper
        return calibrated_noise_xi(hyper, summary.feature_variances)

    def guide_options(self):
        """What the guide must share with this model: the z site's scale."""
        return {"kl_weight": self.beta}

    def point_estimate_sites(self, feature_variances):
        """Global sites to point-estimate: name -> (initial value, support)."""
        # Random columns of norm ~1: identical columns would keep the p rows of
        # each W^{(g)} identical forever.
        initial = torch.randn(self.num_groups, self.latent_dim, self.group_input_dim) / math.sqrt(self.group_input_dim)
        sites = {"W": (initial, constraints.real)}
        if self.likelihood == "gaussian":
            sites["sigma2"] = initial_noise_variance(feature_variances)
        return sites

    def forward(self, x, num_data=None, covariates=None, library=None):
        weights = pyro.sample("W", self.site_priors["W"].distribution())
        noise_variance = None
        if self.likelihood == "gaussian":
            noise_variance = sample_noise_variance(self.num_features, self.noise_nu, self.noise_xi, x)
        self.latent_prior.sample_globals(x)
        with data_plate(x, num_data):
            z = self.latent_prior.sample(x, self.beta)
            output = self.decoder(z, weights, covariates)
            log_library = self.observation.log_library(x, library, covariates) if self.observation.counts else None
            pyro.sample("x", self.observation(output, noise_variance, log_library, covariates), obs=x)
