"""Thresholded variational sparse coding (Fallah & Rozell, ICML 2022)."""

import math

import pyro
import pyro.distributions as dist
from pyro import poutine
from torch import nn

from pyro_sparse.dictionary import LinearGenerator
from pyro_sparse.distributions.thresholded import code_distribution
from pyro_sparse.handlers import data_plate
from pyro_sparse.likelihoods import check_likelihood, observation
from pyro_sparse.nn import ConvDecoder28, DenseDecoder


class TVSC(nn.Module):
    r"""
    Codes z = T(s; λ, μ) — base samples s (Laplace or Gaussian) through the
    shifted soft-threshold of Eq. 2 — and a linear or MLP generator:

    .. math::

        s_{ik} \sim \mathrm{Laplace}(0, b_0) \text{ or } \mathcal N(0, \sigma_0^2), \quad
        z_i = \mathcal T_\lambda(s_i), \quad
        x_i \sim \mathcal N(f_\theta(z_i), \sigma^2 I).

    For the Laplace base, z is exactly spike-and-slab with γ = exp(-λ/b)
    (Prop. 3.1).  The z site's prior is the thresholded base prior and the
    guide's the thresholded base posterior (:class:`~pyro_sparse.guides.ThresholdedGuide`);
    their KL term is, as in the paper's Eq. 5, the KL of the *base*
    distributions, weighted by β1.  With ``learn_threshold`` λ is a local
    latent with a Gamma(α0, α0/λ0) prior (mean λ0; §3.2, Appendix B) and its
    own KL weight β2.  ``decoder="linear"`` is the dictionary model of Eq.
    11-12: x ≈ A z with the Frobenius penalty κ‖A‖² per data point, i.e. a
    Normal(0, (2κN)^-1/2) prior on A over N data points, point-estimated; with the default σ² = 1/2 the likelihood is
    -‖x - Az‖² + const, Eq. 12.

    :param str base: ``"laplace"`` or ``"gaussian"``.
    :param float threshold: λ0; the paper (Appendix D) uses 0.25 for the
        Laplace base and 0.52 for the Gaussian one, which with its prior scales
        give ~10% non-zero codes a priori (exp(-0.25/0.1) ≈ 0.08;
        erfc(0.52/(√0.1·√2)) ≈ 0.10).  ``None`` for no threshold: the plain
        Laplacian / Gaussian priors of the paper's comparisons.
    :param bool learn_threshold: infer λ per data point and dimension.
    :param float threshold_concentration: α0 of the Gamma prior on λ.
    :param float prior_scale: b0 (Laplace) or σ0 (Gaussian) of the base
        prior; default the paper's: b0 = 0.1, σ0 = √0.1 (its Gaussian "spread"
        0.1 is a variance).
    :param float beta: β1, weight of the base KL.
    :param float threshold_beta: β2, weight of the threshold KL.
    :param str decoder: ``"mlp"``, ``"linear"`` or ``"conv"`` (the encoder and
        generator of the paper's Table 5, for 28x28 images).
    :param float dictionary_penalty: κ of the linear decoder's Frobenius penalty.
    :param float noise_variance: σ² of the Gaussian likelihood; ``train``
        sets it to half the mean feature variance (Eq. 12's 1/2 for
        standardised data) unless given.
    """

    # Sparse codes may be overcomplete (more dimensions than features): train() does
    # not warn about latent_dim > G as it does for dense Gaussian codes.
    overcomplete_codes = True

    def __init__(
        self,
        num_features,
        latent_dim=64,
        likelihood="gaussian",
        hidden_dims=(256,),
        base="laplace",
        threshold=0.25,
        learn_threshold=False,
        threshold_concentration=3.0,
        prior_scale=None,
        beta=1.0,
        threshold_beta=0.1,
        decoder="mlp",
        dictionary_penalty=1e-3,
        noise_variance=None,
    ):
        super().__init__()
        if base not in ("laplace", "gaussian"):
            raise ValueError(f"base must be 'laplace' or 'gaussian', got {base!r}")
        if threshold is None and learn_threshold:
            raise ValueError("learn_threshold needs a threshold λ0 for its Gamma prior")
        if decoder not in ("mlp", "linear", "conv"):
            raise ValueError(f"decoder must be 'mlp', 'linear' or 'conv', got {decoder!r}")
        noise_variance = 0.5 if noise_variance is None else noise_variance
        if prior_scale is None:
            prior_scale = 0.1 if base == "laplace" else math.sqrt(0.1)
        for name, value in [("threshold", 1.0 if threshold is None else threshold),
                            ("prior_scale", prior_scale), ("beta", beta),
                            ("threshold_beta", threshold_beta), ("noise_variance", noise_variance),
                            ("threshold_concentration", threshold_concentration)]:
            if not value > 0:
                raise ValueError(f"{name} must be positive, got {value}")
        self.num_features, self.latent_dim = num_features, latent_dim
        self.likelihood = check_likelihood(likelihood)
        self.hidden_dims = tuple(hidden_dims)
        self.base, self.learn_threshold = base, bool(learn_threshold)
        self.threshold = None if threshold is None else float(threshold)
        self.threshold_concentration, self.prior_scale = float(threshold_concentration), float(prior_scale)
        self.beta, self.threshold_beta = float(beta), float(threshold_beta)
        self.decoder_kind, self.dictionary_penalty = decoder, float(dictionary_penalty)
        self.noise_variance = float(noise_variance)
        # The linear generator's A is a global site; the MLP and conv ones are networks.
        self.decoder = self.linear_generator = None
        if decoder == "mlp":
            self.decoder = DenseDecoder(num_features, latent_dim, hidden_dims)
        elif decoder == "conv":
            self.decoder = ConvDecoder28(num_features, latent_dim)
        else:
            self.linear_generator = LinearGenerator(num_features, latent_dim, dictionary_penalty)
        self.site_priors = nn.ModuleDict()

    def guide_options(self):
        """What the guide must share with this model."""
        return {
            "kl_weight": self.beta,
            "base": self.base,
            "threshold": self.threshold,
            "learn_threshold": self.learn_threshold,
            "threshold_kl_weight": self.threshold_beta,
            "network": "conv" if self.decoder_kind == "conv" else "mlp",
        }

    def point_estimate_sites(self, feature_variances):
        if self.decoder_kind != "linear":
            return {}
        return self.linear_generator.point_estimate_sites()

    def generator_output(self, z, dictionary=None):
        if self.decoder_kind == "linear":
            return self.linear_generator(dictionary, z)
        return self.decoder(z)

    def forward(self, x, num_data=None):
        dictionary = None
        if self.decoder_kind == "linear":
            dictionary = self.linear_generator.sample_dictionary(x, num_data)
        with data_plate(x, num_data):
            threshold = None if self.threshold is None else x.new_full((self.latent_dim,), self.threshold)
            if self.learn_threshold:
                rate = self.threshold_concentration / self.threshold
                prior = dist.Gamma(x.new_full((self.latent_dim,), self.threshold_concentration), rate)
                with poutine.scale(scale=self.threshold_beta):
                    threshold = pyro.sample("threshold", prior.to_event(1))
            prior = code_distribution(self.base, x.new_zeros(self.latent_dim), self.prior_scale, threshold)
            with poutine.scale(scale=self.beta):
                z = pyro.sample("z", prior.to_event(1))
            output = self.generator_output(z, dictionary)
            variance = x.new_full((self.num_features,), self.noise_variance)
            pyro.sample("x", observation(self.likelihood, output, variance), obs=x)
