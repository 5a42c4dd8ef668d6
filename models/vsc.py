"""Variational sparse coding (Tonolini, Jensen & Murray-Smith, 2019/2020)."""

import pyro
import torch
from pyro import poutine
from torch import nn

from pyro_sparse.dictionary import LinearGenerator
from pyro_sparse.distributions import SelectedSpikeAndSlab, SpikeAndSlab
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

    ``decoder="linear"`` is instead the sparse coding model of the
    spike-and-slab baseline of Fallah & Rozell (2022, Sec. 4.1):
    x_i ~ N(A z_i, σ² I) with a dictionary A under the Frobenius penalty
    κ‖A‖² per data point (their Eq. 11-12), point-estimated, and a fixed
    noise variance σ², exactly as the linear generator of
    :class:`~pyro_sparse.models.TVSC` (:class:`~pyro_sparse.dictionary.LinearGenerator`);
    for Bernoulli / multinomial data A z are the logits.  That baseline draws
    its codes with the guide's ``spike_estimator="straight_through"``.

    :param int num_features: G.
    :param int latent_dim: K.
    :param str likelihood: ``"gaussian"``, ``"bernoulli"`` or ``"multinomial"``.
    :param tuple hidden_dims: widths of the encoder MLP, and of the decoder's
        for ``decoder="mlp"``.
    :param float alpha: prior probability that a code dimension is non-zero.
    :param float beta: weight of the KL term (1 is the paper's ELBO).
    :param float min_noise_variance: floor of the decoder variance, in
        standardised units (gaussian only).
    :param str prior: ``"fixed"`` — SpikeAndSlab(α, 0, 1) — or
        ``"pseudo_inputs"``, the learned prior of the UAI version
        (supplement A.3): ``num_pseudo_inputs`` learned inputs u_p encoded by
        the guide's recognition network, a selection function C_ω(x) (one
        linear layer + ReLU, normalised to unit sum, then
        sigmoid(a(· − b)) with a = ``selection_sharpness``, b =
        ``selection_threshold``) choosing among them per data point, and the
        KL of the pseudo-inputs' mean spike probability to α added per data
        point, which keeps the prior's sparsity at α.  The recognition network
        is attached by the registry (``attach_recognition``).
    :param str decoder: ``"mlp"`` (the paper's) or ``"linear"`` (x ≈ A z).
    :param float dictionary_penalty: κ of the linear decoder's Frobenius penalty.
    :param float noise_variance: σ² of the linear decoder's Gaussian
        likelihood; ``train`` sets it to half the mean feature variance
        unless given (the MLP decoder learns its variances instead).
    """

    # Sparse codes may be overcomplete (more dimensions than features): train() does
    # not warn about latent_dim > G as it does for dense Gaussian codes.
    overcomplete_codes = True

    def __init__(
        self,
        num_features,
        latent_dim=20,
        likelihood="gaussian",
        hidden_dims=(400,),
        alpha=0.01,
        beta=1.0,
        min_noise_variance=1e-3,
        prior="fixed",
        num_pseudo_inputs=20,
        selection_sharpness=60.0,
        selection_threshold=0.5,
        decoder="mlp",
        dictionary_penalty=1e-3,
        noise_variance=None,
    ):
        super().__init__()
        if not 0 < alpha < 1:
            # α = 1 is the VAE limit, but then the spike term (1-γ)log((1-γ)/(1-α))
            # of the KL is infinite for any posterior with γ < 1: use model="vae".
            raise ValueError(f"alpha must be in (0, 1), got {alpha}; for alpha = 1 use model='vae'")
        if not beta > 0:
            raise ValueError(f"beta must be positive, got {beta}")
        if decoder not in ("mlp", "linear"):
            raise ValueError(f"decoder must be 'mlp' or 'linear', got {decoder!r}")
        if prior not in ("fixed", "pseudo_inputs"):
            raise ValueError(f"prior must be 'fixed' or 'pseudo_inputs', got {prior!r}")
        if prior == "pseudo_inputs" and decoder == "linear":
            # The pseudo-inputs live in the standardised units of the MLP decoder's feature map.
            raise ValueError("prior='pseudo_inputs' needs decoder='mlp'; use prior='fixed' with the linear decoder")
        noise_variance = 0.5 if noise_variance is None else float(noise_variance)
        if not noise_variance > 0:
            raise ValueError(f"noise_variance must be positive, got {noise_variance}")
        self.num_features, self.latent_dim = num_features, latent_dim
        self.likelihood = check_likelihood(likelihood)
        self.hidden_dims = tuple(hidden_dims)
        self.alpha, self.beta = float(alpha), float(beta)
        self.decoder_kind, self.noise_variance = decoder, noise_variance
        self.decoder = self.linear_generator = None
        if decoder == "linear":
            self.linear_generator = LinearGenerator(num_features, latent_dim, dictionary_penalty)
        elif self.likelihood == "gaussian":
            self.decoder = HeteroscedasticDecoder(num_features, latent_dim, hidden_dims, min_noise_variance)
        else:
            self.decoder = DenseDecoder(num_features, latent_dim, hidden_dims)
        self.site_priors = nn.ModuleDict()
        self.prior = prior
        if prior == "pseudo_inputs":
            if num_pseudo_inputs < 1:
                raise ValueError(f"num_pseudo_inputs must be positive, got {num_pseudo_inputs}")
            self.pseudo_inputs = nn.Parameter(torch.randn(num_pseudo_inputs, num_features))
            self.selection = nn.Sequential(nn.Linear(num_features, num_pseudo_inputs), nn.ReLU())
            self.selection_sharpness, self.selection_threshold = float(selection_sharpness), float(selection_threshold)
        self._recognition = None

    def attach_recognition(self, guide):
        """Share the guide's recognition network, which encodes the pseudo-inputs."""
        self._recognition = guide.posterior

    def guide_options(self):
        """What the guide must share with this model: the z site's scale."""
        return {"kl_weight": self.beta}

    def point_estimate_sites(self, feature_variances):
        if self.decoder_kind == "linear":
            return self.linear_generator.point_estimate_sites()
        return {}

    def latent_prior(self, x):
        if self.prior == "fixed":
            return SpikeAndSlab(x.new_full((self.latent_dim,), self.alpha), 0.0, 1.0).to_event(1)
        # Supplement A.3: u* = sigmoid(a (u / Σu - b)), u = ReLU(linear(x)).
        scores = self.selection(x)
        scores = scores / scores.sum(-1, keepdim=True).clamp_min(1e-12)
        weights = torch.sigmoid(self.selection_sharpness * (scores - self.selection_threshold))
        # Pseudo-inputs are learned in standardised units and mapped to data units,
        # where the recognition network expects its inputs.
        encoded = self._recognition(self.decoder.output_affine(self.pseudo_inputs)).base_dist
        # The recognition model may give γ = 1 exactly (log γ = -ReLU(-v)); a
        # prior component without an atom would make the KL from any posterior
        # with one infinite.
        gate = encoded.gate.clamp(1e-6, 1 - 1e-6)
        return SelectedSpikeAndSlab(weights, SpikeAndSlab(gate, encoded.loc, encoded.scale))

    def prior_sparsity_penalty(self, prior):
        """KL(Bernoulli(mean spike probability of the pseudo-inputs) ‖ Bernoulli(α)), summed over k."""
        mean_gate = prior.components.gate.mean(0).clamp(1e-6, 1 - 1e-6)
        alpha = torch.as_tensor(self.alpha, dtype=mean_gate.dtype)
        return (
            mean_gate * (mean_gate / alpha).log()
            + (1 - mean_gate) * ((1 - mean_gate) / (1 - alpha).clamp_min(1e-6)).log()
        ).sum()

    def forward(self, x, num_data=None):
        dictionary = None
        if self.decoder_kind == "linear":
            dictionary = self.linear_generator.sample_dictionary(x, num_data)
        with data_plate(x, num_data):
            prior = self.latent_prior(x)
            if self.prior == "pseudo_inputs":
                # Once per data point, so it is weighed like the code's own KL.
                pyro.factor("prior_sparsity", -self.prior_sparsity_penalty(prior).expand(x.shape[:1]))
            with poutine.scale(scale=self.beta):
                z = pyro.sample("z", prior)
            if self.decoder_kind == "linear":
                variance = x.new_full((self.num_features,), self.noise_variance)
                pyro.sample("x", observation(self.likelihood, self.linear_generator(dictionary, z), variance), obs=x)
            elif self.likelihood == "gaussian":
                loc, variance = self.decoder(z)
                pyro.sample("x", observation("gaussian", loc, variance), obs=x)
            else:
                pyro.sample("x", observation(self.likelihood, self.decoder(z)), obs=x)
