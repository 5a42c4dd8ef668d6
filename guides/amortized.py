"""The shared part of amortized guides: an encoder for local codes, point masses for globals."""

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro import poutine
from torch import nn
from torch.distributions import transform_to

from pyro_sparse.nn import ConvEncoder28, FeatureAffine, mlp
from pyro_sparse.plates import data_plate


class AmortizedGuide(nn.Module):
    """
    A guide with an encoder network for the local code z_i of each data point
    and Delta (point-mass) guides for the model's global sites, so those are
    MAP-estimated.  Subclasses define ``posterior(x)``: the distribution
    q_φ(z | x) with event shape ``(K,)``, and may override ``sample_local`` when
    a data point has more latent sites than z.

    :param int num_features: G.
    :param int latent_dim: K.
    :param int outputs_per_latent: encoder outputs per latent dimension.
    :param int extra_outputs: further encoder outputs, returned as one last
        piece by :meth:`encoder_outputs`.
    :param tuple hidden_dims: widths of the encoder MLP.
    :param dict point_estimates: global site name -> (initial value, support);
        each is stored unconstrained and mapped through ``transform_to(support)``.
    :param bool log1p_input: encode log(1 + x) instead of x (for counts).
    :param float kl_weight: scale of the z site; must equal the model's (β-VAE),
        because ``TraceMeanField_ELBO`` weighs an analytic KL by the guide's scale.
    :param str network: ``"mlp"`` or ``"conv"`` (28x28 images, Fallah & Rozell Table 5).
    :param int covariate_dim: C, covariates appended to the encoder's input
        (:class:`~pyro_sparse.data.covariates.CovariateSpec`); 0 for none.
    :param bool batch_norm: batch-normalise the MLP encoder's hidden layers,
        as scVI's encoder does (``train`` turns it on for the negative
        binomial and ZINB likelihoods; measured in docs/results/single_cell.rst).  Codes are
        then computed with the running statistics outside training.
    :param bool latent_library: also encode q(log ℓ_i | x_i) = N(m, s²), the
        posterior of the model's latent library size (``library="latent"``;
        ``train`` sets it from the model), with a second encoder of one
        hidden layer, as scVI's library encoder.
    """

    #: the value of options added since, for model files that do not record them.
    former_defaults = {"batch_norm": False}

    def __init__(
        self,
        num_features,
        latent_dim,
        outputs_per_latent,
        hidden_dims,
        point_estimates,
        log1p_input,
        kl_weight,
        network="mlp",
        extra_outputs=0,
        covariate_dim=0,
        batch_norm=False,
        latent_library=False,
    ):
        super().__init__()
        self.num_features, self.latent_dim = num_features, latent_dim
        self.log1p_input, self.kl_weight = log1p_input, float(kl_weight)
        self.input_affine = FeatureAffine(num_features)
        self.output_sizes = [latent_dim] * outputs_per_latent + ([extra_outputs] if extra_outputs else [])
        self.covariate_dim, self.batch_norm = int(covariate_dim), bool(batch_norm)
        if network == "conv":
            if covariate_dim or batch_norm:
                raise ValueError("the conv encoder takes images only: covariates and batch_norm need network='mlp'")
            self.encoder = ConvEncoder28(num_features, sum(self.output_sizes))
        elif network == "mlp":
            self.encoder = mlp(num_features + self.covariate_dim, hidden_dims, sum(self.output_sizes), self.batch_norm)
        else:
            raise ValueError(f"network must be 'mlp' or 'conv', got {network!r}")
        self.latent_library = bool(latent_library)
        if self.latent_library:
            if network != "mlp":
                raise ValueError("a latent library size needs the MLP encoder (network='mlp'), not the conv one")
            self.library_encoder = mlp(num_features + self.covariate_dim, hidden_dims[:1], 2, self.batch_norm)
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

    def inputs_from_unconstrained(self, u):
        """
        Data points the encoder accepts, from unconstrained values in its input
        units (a prior's learned pseudo-inputs): the inverse of its input map,
        with softplus before expm1 when it reads log(1 + x), so they are non-negative.
        """
        x = self.input_affine(u)
        return torch.expm1(F.softplus(x)) if self.log1p_input else x

    def encoder_outputs(self, x, covariates=None):
        """
        The encoder's outputs, split into one (batch, K) tensor per output kind
        (and the extra outputs).  Missing covariates (e.g. a prior's pseudo-inputs) enter as zeros.
        """
        return self.encoder(self._inputs(x, covariates)).split(self.output_sizes, dim=-1)

    def _inputs(self, x, covariates=None):
        inputs = self.input_affine.inverse(torch.log1p(x) if self.log1p_input else x)
        if self.covariate_dim:
            if covariates is None:
                covariates = inputs.new_zeros(*inputs.shape[:-1], self.covariate_dim)
            inputs = torch.cat([inputs, covariates], dim=-1)
        return inputs

    def library_posterior(self, x, covariates=None):
        """q(log ℓ_i | x_i) = N(m, s²) of a latent library size."""
        loc, raw_scale = self.library_encoder(self._inputs(x, covariates)).unbind(-1)
        return dist.Normal(loc, F.softplus(raw_scale) + 1e-4)

    @torch.no_grad()
    def start_library(self, log_mean_library):
        """Start q's mean of log ℓ at the log of the training data's mean library."""
        self.library_encoder[-1].bias[0] = log_mean_library

    def posterior(self, x, covariates=None):
        raise NotImplementedError

    def sample_local(self, x, covariates=None):
        """The data-plate sites of one minibatch; by default the code z ~ q(z | x)."""
        with poutine.scale(scale=self.kl_weight):
            pyro.sample("z", self.posterior(x, covariates))

    def forward(self, x, num_data=None, covariates=None, library=None):
        """The guide of one minibatch; an observed ``library`` is data, so the guide does not use it."""
        for name in self.supports:  # in the model's order (ParameterDict may sort its keys)
            value = self.point_estimate(name)
            pyro.sample(name, dist.Delta(value, event_dim=value.dim()))
        with data_plate(x, num_data):
            self.sample_local(x, covariates)
            if self.latent_library:
                pyro.sample("log_library", self.library_posterior(x, covariates), infer={"kl_warmup": False})
