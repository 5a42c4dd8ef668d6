"""Variational sparse coding (Tonolini, Jensen & Murray-Smith, 2019/2020)."""

import pyro
from torch import nn

from pyro_sparse.checks import positive_number
from pyro_sparse.nn import ConvDecoder28, DenseDecoder, HeteroscedasticDecoder, ObservationModel
from pyro_sparse.plates import data_plate
from pyro_sparse.priors import LinearGenerator, SpikeSlabPrior, fixed_noise_variance


class VSC(nn.Module):
    r"""
    Spike-and-slab latent codes with a dense decoder (ICLR version Eq. 4-5):

    .. math::

        z_{ij} \sim \alpha\,\mathcal N(0, 1) + (1 - \alpha)\,\delta_0, \qquad
        x_i \sim \mathcal N\big(\mu_\theta(z_i), \operatorname{diag}\sigma^2_\theta(z_i)\big)

    with the Gaussian likelihood of the paper (the decoder outputs a mean and
    a log-variance per feature, supplement A.1), or Bernoulli / multinomial
    logits.  The prior is ``latent_prior``: by default
    :class:`~pyro_sparse.priors.SpikeSlabPrior` (``train`` takes its
    α as ``alpha``), or the learned pseudo-input prior of the UAI version
    (``latent_prior="pseudo_inputs"``,
    :class:`~pyro_sparse.priors.PseudoInputPrior`).  With either the
    guide is :class:`~pyro_sparse.guides.SpikeSlabGuide`, and the KL between
    the two spike-and-slab distributions is the closed form registered with
    ``torch.distributions.kl`` (Eq. 9).

    ``decoder="linear"`` is instead the sparse coding model of the
    spike-and-slab baseline of Fallah & Rozell (2022, Sec. 4.1):
    x_i ~ N(A z_i, σ² I) with a dictionary A under the Frobenius penalty
    κ‖A‖² per data point (their Eq. 11-12), point-estimated, and a fixed
    noise variance σ², exactly as the linear generator of
    :class:`~pyro_sparse.models.TVSC` (:class:`~pyro_sparse.priors.LinearGenerator`);
    for Bernoulli / multinomial data A z are the logits.  That baseline draws
    its codes with the guide's ``spike_estimator="straight_through"``.
    ``decoder="conv"`` is the convolutional generator of Fallah & Rozell's
    Table 5 for 28x28 images (with a conv encoder), also with the fixed σ².

    :param int num_features: G.
    :param int latent_dim: K.
    :param str likelihood: ``"gaussian"``, ``"bernoulli"`` or ``"multinomial"``.
    :param tuple hidden_dims: widths of the encoder MLP, and of the decoder's
        for ``decoder="mlp"``.
    :param float beta: weight of the KL term (1 is the paper's ELBO).
    :param float min_noise_variance: floor of the MLP decoder's variance, in
        standardised units (gaussian only).
    :param str decoder: ``"mlp"`` (the paper's), ``"linear"`` (x ≈ A z) or ``"conv"``.
    :param float dictionary_penalty: κ of the linear decoder's Frobenius penalty
        (1e-4, Fallah & Rozell's Appendix D for the variational methods).
    :param bool shared_atom_norm: the linear decoder's atoms share one learned
        norm, as in ``tvsc`` (:class:`~pyro_sparse.priors.LinearGenerator`).
    :param float noise_variance: σ² of the linear and conv decoders' Gaussian
        likelihood; ``train`` sets it to half the mean feature variance
        unless given (the MLP decoder learns its variances instead).
    :param latent_prior: a :class:`~pyro_sparse.priors.LatentPrior`;
        ``None`` for SpikeSlabPrior(α = 0.01).
    :param int covariate_dim: C, covariates appended to the MLP generator's
        input (set by ``train``; the linear and conv generators take none).
    :param int num_batches: categories of the batch covariate (set by ``train``).
    :param str dispersion: inverse dispersion of ``negative_binomial`` / ``zinb``
        per feature (``"gene"``) or per feature and batch (``"gene-batch"``).
    :param str library: ``"observed"`` (the row's total count, or the
        ``size_factor_key`` column) or ``"latent"``: log ℓ_i ~ N(m_b, s_b²) per
        batch, inferred by the guide (:class:`~pyro_sparse.nn.ObservationModel`).
    """

    # Model files written before shared atom norms were the default trained free atoms.
    former_defaults = {"shared_atom_norm": False}
    # Options that act only with some decoders (train refuses them elsewhere).
    option_conditions = {"noise_variance": ("decoder", ("linear", "conv")), "min_noise_variance": ("decoder", ("mlp",)),
                         "hidden_dims": ("decoder", ("mlp", "linear")), "dictionary_penalty": ("decoder", ("linear",)),
                         "shared_atom_norm": ("decoder", ("linear",))}

    def __init__(
        self,
        num_features,
        latent_dim=20,
        likelihood="gaussian",
        hidden_dims=(400,),
        beta=1.0,
        min_noise_variance=1e-3,
        decoder="mlp",
        dictionary_penalty=1e-4,
        shared_atom_norm=True,
        noise_variance=None,
        latent_prior=None,
        covariate_dim=0,
        num_batches=1,
        dispersion="gene",
        library="observed",
    ):
        super().__init__()
        if decoder not in ("mlp", "linear", "conv"):
            raise ValueError(f"decoder must be 'mlp', 'linear' or 'conv', got {decoder!r}")
        if covariate_dim and decoder != "mlp":
            raise ValueError(f"covariates enter the MLP generator only, not decoder={decoder!r}")
        noise_variance = 0.5 if noise_variance is None else float(noise_variance)
        if not noise_variance > 0:
            raise ValueError(f"noise_variance must be positive, got {noise_variance}")
        self.num_features, self.latent_dim = num_features, latent_dim
        self.observation = ObservationModel(likelihood, num_features, num_batches, dispersion, library)
        self.likelihood = self.observation.likelihood
        self.hidden_dims = tuple(hidden_dims)
        self.beta = positive_number("beta", beta)
        self.decoder_kind, self.noise_variance = decoder, noise_variance
        self.decoder = self.linear_generator = None
        if decoder == "linear":
            self.linear_generator = LinearGenerator(num_features, latent_dim, dictionary_penalty, shared_atom_norm)
        elif decoder == "conv":
            self.decoder = ConvDecoder28(num_features, latent_dim)
        elif self.likelihood == "gaussian":
            self.decoder = HeteroscedasticDecoder(num_features, latent_dim, hidden_dims, min_noise_variance,
                                                  covariate_dim)
        else:
            self.decoder = DenseDecoder(num_features, latent_dim, hidden_dims, covariate_dim)
        self.site_priors = nn.ModuleDict()
        self.latent_prior = SpikeSlabPrior(latent_dim) if latent_prior is None else latent_prior

    @classmethod
    def data_defaults(cls, summary, likelihood, hyper):
        """Hyperparameters calibrated from the training data: σ² of the linear and conv generators."""
        return fixed_noise_variance(hyper, summary.feature_variances)

    def guide_options(self):
        """What the guide must share with this model: the z site's scale and the encoder's kind."""
        return {"kl_weight": self.beta, "network": "conv" if self.decoder_kind == "conv" else "mlp"}

    def point_estimate_sites(self, feature_variances):
        if self.decoder_kind == "linear":
            return self.linear_generator.point_estimate_sites()
        return {}

    def forward(self, x, num_data=None, covariates=None, library=None):
        dictionary = None
        if self.decoder_kind == "linear":
            dictionary = self.linear_generator.sample_dictionary(x, num_data)
        self.latent_prior.sample_globals(x)
        with data_plate(x, num_data):
            z = self.latent_prior.sample(x, self.beta)
            if self.decoder_kind == "mlp" and self.likelihood == "gaussian":
                output, variance = self.decoder(z, covariates)
            else:
                if self.decoder_kind == "linear":
                    output = self.linear_generator(dictionary, z)
                else:
                    output = self.decoder(z, covariates) if self.decoder_kind == "mlp" else self.decoder(z)
                variance = x.new_full((self.num_features,), self.noise_variance)
            log_library = self.observation.log_library(x, library, covariates) if self.observation.counts else None
            pyro.sample("x", self.observation(output, variance, log_library, covariates), obs=x)
