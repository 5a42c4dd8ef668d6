"""The VAE (Kingma & Welling 2014) and β-VAE (Higgins et al. 2017) baselines."""

import pyro
from torch import nn

from pyro_sparse.checks import positive_number
from pyro_sparse.nn import DenseDecoder, HeteroscedasticDecoder, ObservationModel
from pyro_sparse.plates import data_plate
from pyro_sparse.priors import (
    DEFAULT_NOISE_NU,
    NormalPrior,
    calibrated_noise_xi,
    initial_noise_variance,
    noise_prior_options,
    sample_noise_variance,
)


class VAE(nn.Module):
    r"""
    z_i ~ N(0, I_K) (or any ``latent_prior``, a
    :class:`~pyro_sparse.priors.LatentPrior`),  x_i ~ p(x | f_θ(z_i))
    with one dense decoder.  The KL
    term is weighted by ``beta`` (β-VAE; β = 1 is the VAE).  The likelihoods
    and the σ² prior are those of :class:`~pyro_sparse.models.ssl_dgm.SparseDGM`,
    so the two are compared on the same objective.  With
    ``noise="heteroscedastic"`` the decoder outputs a variance per feature and
    data point instead, as the VSC paper's likelihood, so VSC and VAE can be
    compared on that one.  As there, the guide must
    scale its z site by the same β (``AmortizedNormalGuide(kl_weight=beta)``).

    ``covariate_dim`` and ``num_batches`` (set by ``train`` from the data's
    covariates) append covariates to the decoder's input; ``dispersion``
    (``"gene"`` or ``"gene-batch"``) sets the inverse dispersions of the
    ``negative_binomial`` and ``zinb`` likelihoods and ``library``
    (``"observed"`` or ``"latent"``) whether the library size is the data's
    or a latent site (see :class:`~pyro_sparse.nn.ObservationModel`).
    """

    # The global σ² prior and the per-point variance floor (train refuses each with the other noise).
    option_conditions = {"noise_nu": ("noise", ("global",)), "noise_xi": ("noise", ("global",)),
                         "min_noise_variance": ("noise", ("heteroscedastic",))}

    def __init__(
        self,
        num_features,
        latent_dim=5,
        likelihood="gaussian",
        hidden_dims=(50, 50, 50),
        beta=1.0,
        noise="global",
        noise_nu=DEFAULT_NOISE_NU,
        noise_xi=1.0,
        min_noise_variance=1e-3,
        latent_prior=None,
        covariate_dim=0,
        num_batches=1,
        dispersion="gene",
        library="observed",
    ):
        super().__init__()
        self.num_features, self.latent_dim = num_features, latent_dim
        self.observation = ObservationModel(likelihood, num_features, num_batches, dispersion, library)
        self.likelihood = self.observation.likelihood
        if noise not in ("global", "heteroscedastic"):
            raise ValueError(f"noise must be 'global' or 'heteroscedastic', got {noise!r}")
        if noise == "heteroscedastic" and likelihood != "gaussian":
            raise ValueError(f"noise='heteroscedastic' is the gaussian likelihood's; the {likelihood} has no noise")
        self.heteroscedastic = likelihood == "gaussian" and noise == "heteroscedastic"
        self.beta = positive_number("beta", beta)
        self.noise_nu, self.noise_xi = noise_prior_options(noise_nu, noise_xi)
        self.hidden_dims = tuple(hidden_dims)
        if self.heteroscedastic:
            self.decoder = HeteroscedasticDecoder(num_features, latent_dim, hidden_dims, min_noise_variance,
                                                  covariate_dim)
        else:
            self.decoder = DenseDecoder(num_features, latent_dim, hidden_dims, covariate_dim)
        self.site_priors = nn.ModuleDict()
        self.latent_prior = NormalPrior(latent_dim) if latent_prior is None else latent_prior

    @classmethod
    def data_defaults(cls, summary, likelihood, hyper):
        """Hyperparameters calibrated from the training data: ξ of the σ² prior (Appendix C.2)."""
        if likelihood != "gaussian" or hyper.get("noise", "global") != "global":
            return hyper
        return calibrated_noise_xi(hyper, summary.feature_variances)

    def guide_options(self):
        """What the guide must share with this model: the z site's scale."""
        return {"kl_weight": self.beta}

    def point_estimate_sites(self, feature_variances):
        if self.likelihood != "gaussian" or self.heteroscedastic:
            return {}
        return {"sigma2": initial_noise_variance(feature_variances)}

    def forward(self, x, num_data=None, covariates=None, library=None):
        noise_variance = None
        if self.likelihood == "gaussian" and not self.heteroscedastic:
            noise_variance = sample_noise_variance(self.num_features, self.noise_nu, self.noise_xi, x)
        self.latent_prior.sample_globals(x)
        with data_plate(x, num_data):
            z = self.latent_prior.sample(x, self.beta)
            if self.heteroscedastic:
                loc, noise_variance = self.decoder(z, covariates)
            else:
                loc = self.decoder(z, covariates)
            log_library = self.observation.log_library(x, library, covariates) if self.observation.counts else None
            pyro.sample("x", self.observation(loc, noise_variance, log_library, covariates), obs=x)
