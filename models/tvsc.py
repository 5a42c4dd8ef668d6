"""Thresholded variational sparse coding (Fallah & Rozell, ICML 2022)."""

import pyro
from torch import nn

from pyro_sparse.nn import ConvDecoder28, DenseDecoder, ObservationModel
from pyro_sparse.plates import data_plate
from pyro_sparse.priors import LinearGenerator, ThresholdedLaplacePrior, fixed_noise_variance


class TVSC(nn.Module):
    r"""
    Codes z = T(s; λ, μ) — base samples s (Laplace or Gaussian) through the
    shifted soft-threshold of Eq. 2 — and a linear or MLP generator:

    .. math::

        s_{ik} \sim \mathrm{Laplace}(0, b_0) \text{ or } \mathcal N(0, \sigma_0^2), \quad
        z_i = \mathcal T_\lambda(s_i), \quad
        x_i \sim \mathcal N(f_\theta(z_i), \sigma^2 I).

    The codes' prior is ``latent_prior``, by default
    :class:`~pyro_sparse.priors.ThresholdedLaplacePrior` (``train``
    takes ``latent_prior="thresholded_laplace"`` or ``"thresholded_normal"``
    and their ``threshold``, ``prior_scale``, ``learn_threshold``,
    ``learn_prior_threshold``, ``amortized_threshold``, ``kl``, ``threshold_concentration`` and
    ``threshold_beta``); its guide is
    :class:`~pyro_sparse.guides.ThresholdedGuide` (``estimator``), and the
    code KL, weighted by β1, is the prior's ``kl`` (the paper's Eq. 5 is
    ``kl="base"``). ``decoder="linear"`` is the dictionary model of Eq. 11-12:
    x ≈ A z with the Frobenius penalty κ‖A‖² per data point, i.e. a
    Normal(0, (2κN)^-1/2) prior on A over N data points, point-estimated;
    with the default σ² = 1/2 the likelihood is -‖x - Az‖² + const, Eq. 12.
    ``transform`` gives the posterior mode (exactly 0 where P(z = 0) > 1/2),
    ``reconstruct`` A E_q[z | x].

    :param tuple hidden_dims: widths of the encoder MLP (and of the MLP
        generator); default one layer of 4G units for the linear generator (the
        widest layer of the paper's Table 3 backbone, 1024 for 16x16 patches:
        one such layer learned faster than the four), else 256.
    :param float beta: β1, weight of the code KL.
    :param str decoder: ``"mlp"``, ``"linear"`` or ``"conv"`` (the encoder and
        generator of the paper's Table 5, for 28x28 images).
    :param float dictionary_penalty: κ of the linear decoder's Frobenius penalty
        (Appendix D: 1e-4 for the variational methods, 1e-3 for FISTA).
    :param bool shared_atom_norm: the linear decoder's atoms share one learned
        norm (:class:`~pyro_sparse.priors.LinearGenerator`), as the
        equal-norm atoms of classical sparse coding: no atom can win patches
        by growing while the others die.  ``False`` is the paper's free atoms
        under the Frobenius penalty alone: a lower Eq. 10 objective on
        patches, but about 40 % of the atoms unused (docs: TVSC results).
    :param float noise_variance: σ² of the Gaussian likelihood; ``train``
        sets it to half the mean feature variance (Eq. 12's 1/2 for
        standardised data) unless given.
    :param latent_prior: a :class:`~pyro_sparse.priors.LatentPrior`;
        ``None`` for the thresholded Laplace with the paper's defaults.
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
    # The conv generator and encoder have their own layers (train refuses hidden_dims with them).
    option_conditions = {"hidden_dims": ("decoder", ("mlp", "linear")), "dictionary_penalty": ("decoder", ("linear",)),
                         "shared_atom_norm": ("decoder", ("linear",))}

    def __init__(
        self,
        num_features,
        latent_dim=64,
        likelihood="gaussian",
        hidden_dims=None,
        beta=1.0,
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
        noise_variance = 0.5 if noise_variance is None else noise_variance
        for name, value in [("beta", beta), ("noise_variance", noise_variance)]:
            if not value > 0:
                raise ValueError(f"{name} must be positive, got {value}")
        self.num_features, self.latent_dim = num_features, latent_dim
        self.observation = ObservationModel(likelihood, num_features, num_batches, dispersion, library)
        self.likelihood = self.observation.likelihood
        if hidden_dims is None:
            hidden_dims = (4 * num_features,) if decoder == "linear" else (256,)
        self.hidden_dims = tuple(hidden_dims)
        self.beta = float(beta)
        self.decoder_kind, self.dictionary_penalty = decoder, float(dictionary_penalty)
        self.noise_variance = float(noise_variance)
        # The linear generator's A is a global site; the MLP and conv ones are networks.
        self.decoder = self.linear_generator = None
        if decoder == "mlp":
            self.decoder = DenseDecoder(num_features, latent_dim, hidden_dims, covariate_dim)
        elif decoder == "conv":
            self.decoder = ConvDecoder28(num_features, latent_dim)
        else:
            self.linear_generator = LinearGenerator(num_features, latent_dim, dictionary_penalty, shared_atom_norm)
        self.site_priors = nn.ModuleDict()
        self.latent_prior = ThresholdedLaplacePrior(latent_dim) if latent_prior is None else latent_prior

    @classmethod
    def data_defaults(cls, summary, likelihood, hyper):
        """Hyperparameters calibrated from the training data: σ² of the linear and conv generators."""
        return fixed_noise_variance(hyper, summary.feature_variances)

    def guide_options(self):
        """What the guide must share with this model: the code KL's weight and the encoder's kind."""
        return {"kl_weight": self.beta, "network": "conv" if self.decoder_kind == "conv" else "mlp"}

    def point_estimate_sites(self, feature_variances):
        if self.decoder_kind != "linear":
            return {}
        return self.linear_generator.point_estimate_sites()

    def generator_output(self, z, dictionary=None, covariates=None):
        if self.decoder_kind == "linear":
            return self.linear_generator(dictionary, z)
        return self.decoder(z, covariates) if self.decoder_kind == "mlp" else self.decoder(z)

    def forward(self, x, num_data=None, covariates=None, library=None):
        dictionary = None
        if self.decoder_kind == "linear":
            dictionary = self.linear_generator.sample_dictionary(x, num_data)
        self.latent_prior.sample_globals(x)
        with data_plate(x, num_data):
            z = self.latent_prior.sample(x, self.beta)
            output = self.generator_output(z, dictionary, covariates)
            variance = x.new_full((self.num_features,), self.noise_variance)
            log_library = self.observation.log_library(x, library, covariates) if self.observation.counts else None
            pyro.sample("x", self.observation(output, variance, log_library, covariates), obs=x)
