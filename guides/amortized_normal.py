"""The amortized Gaussian encoder q_φ(z | x) of the VAE and the sparse VAE."""

import pyro.distributions as dist
import torch
import torch.nn.functional as F

from pyro_sparse.guides.amortized import AmortizedGuide


class AmortizedNormalGuide(AmortizedGuide):
    r"""
    q_φ(z_i | x_i) = N_K(μ_φ(x_i), Σ_φ(x_i)), with point masses for the
    model's global sites (see :class:`AmortizedGuide`).

    ``posterior_covariance="diagonal"`` is the mean-field Gaussian of Moran et
    al. (2022), Eq. 6: Σ_φ = diag σ²_φ.  ``"full"`` lets the encoder also
    output the strictly lower triangle of a Cholesky factor L_φ (Σ_φ = L_φ
    L_φᵀ), so the posterior can correlate the codes: when the factors
    correlate a priori, their posterior given x is correlated too, and a
    diagonal Σ_φ can make a decoder that mixes correlated codes look better
    than the true sparse one.  Its KL to a Gaussian prior is in closed form.
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
        posterior_covariance="diagonal",
        covariate_dim=0,
        batch_norm=False,
        latent_library=False,
    ):
        if posterior_covariance not in ("diagonal", "full"):
            raise ValueError(f"posterior_covariance must be 'diagonal' or 'full', got {posterior_covariance!r}")
        extra = latent_dim * (latent_dim - 1) // 2 if posterior_covariance == "full" else 0
        super().__init__(num_features, latent_dim, 2, hidden_dims, point_estimates, log1p_input, kl_weight, network,
                         extra_outputs=extra, covariate_dim=covariate_dim, batch_norm=batch_norm,
                         latent_library=latent_library)
        self.posterior_covariance = posterior_covariance
        self.register_buffer("_lower", torch.ones(latent_dim, latent_dim).tril(-1).nonzero().T, persistent=False)

    def posterior(self, x, covariates=None):
        loc, raw_scale, *off_diagonal = self.encoder_outputs(x, covariates)
        scale = F.softplus(raw_scale) + 1e-4
        if self.posterior_covariance == "diagonal":
            return dist.Normal(loc, scale).to_event(1)
        scale_tril = torch.diag_embed(scale)
        if off_diagonal:
            rows, columns = self._lower
            scale_tril[..., rows, columns] = off_diagonal[0]
        return dist.MultivariateNormal(loc, scale_tril=scale_tril)
