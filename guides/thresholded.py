"""The inference network of thresholded variational sparse coding (Fallah & Rozell 2022)."""

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine

from pyro_sparse.distributions.thresholded import code_distribution
from pyro_sparse.guides.amortized import AmortizedGuide


class ThresholdedGuide(AmortizedGuide):
    r"""
    q_φ(s | x): a Laplace or Gaussian base with shift μ_φ(x) and scale from
    log b_φ(x) (Appendix B), whose draws pass through the shifted
    soft-threshold with the straight-through estimator of Eq. 4; with
    ``learn_threshold`` also q_φ(λ | x) = Gamma(α_φ(x), β_φ(x)), reparameterised
    pathwise, its log-parameters clamped to [log 1e-6, log 1e6] as the paper.

    For the Laplace base the inferred scale is multiplied by the warm-up ω,
    which starts at ``scale_warmup_start`` (0.1) and grows by
    ``scale_warmup_rate`` (2e-4) per iteration up to 1 (Appendix B).

    :meth:`posterior` (used for codes) takes λ at its posterior mean α/β when
    the threshold is learned.
    """

    def __init__(
        self,
        num_features,
        latent_dim,
        hidden_dims=(256,),
        point_estimates=None,
        log1p_input=False,
        kl_weight=1.0,
        base="laplace",
        threshold=0.25,
        learn_threshold=False,
        threshold_kl_weight=0.1,
        straight_through=True,
        scale_warmup_start=0.1,
        scale_warmup_rate=2e-4,
        network="mlp",
    ):
        outputs = 4 if learn_threshold else 2
        super().__init__(
            num_features, latent_dim, outputs, hidden_dims, point_estimates, log1p_input, kl_weight, network
        )
        if not 0 < scale_warmup_start <= 1 or scale_warmup_rate < 0:
            raise ValueError("need 0 < scale_warmup_start <= 1 and scale_warmup_rate >= 0")
        self.base, self.learn_threshold = base, bool(learn_threshold)
        self.threshold = None if threshold is None else float(threshold)
        self.threshold_kl_weight, self.straight_through = float(threshold_kl_weight), bool(straight_through)
        self.scale_warmup_start, self.scale_warmup_rate = float(scale_warmup_start), float(scale_warmup_rate)
        # A buffer, so a fitted or loaded guide evaluates with the value its
        # training ended on (1 for a fresh guide used on its own).
        self.register_buffer("scale_warmup", torch.tensor(1.0))

    def schedule(self, epoch, iteration):
        warmup = min(1.0, self.scale_warmup_start + self.scale_warmup_rate * iteration)
        self.scale_warmup.fill_(warmup if self.base == "laplace" else 1.0)

    def _encode(self, x):
        outputs = self.encoder_outputs(x)
        loc, scale = outputs[0], outputs[1].clamp(-15.0, 15.0).exp() * self.scale_warmup
        threshold_posterior = None
        if self.learn_threshold:
            log_limit = 13.815510557964274  # log 1e6
            concentration = outputs[2].clamp(-log_limit, log_limit).exp()
            rate = outputs[3].clamp(-log_limit, log_limit).exp()
            threshold_posterior = dist.Gamma(concentration, rate)
        return loc, scale, threshold_posterior

    def _codes(self, loc, scale, threshold):
        return code_distribution(self.base, loc, scale, threshold, self.straight_through)

    def _fixed_threshold(self, loc):
        return None if self.threshold is None else torch.full_like(loc, self.threshold)

    def posterior(self, x):
        loc, scale, threshold_posterior = self._encode(x)
        threshold = self._fixed_threshold(loc) if threshold_posterior is None else threshold_posterior.mean
        return self._codes(loc, scale, threshold).to_event(1)

    def sample_local(self, x):
        loc, scale, threshold_posterior = self._encode(x)
        threshold = self._fixed_threshold(loc)
        if threshold_posterior is not None:
            with poutine.scale(scale=self.threshold_kl_weight):
                threshold = pyro.sample("threshold", threshold_posterior.to_event(1))
        with poutine.scale(scale=self.kl_weight):
            pyro.sample("z", self._codes(loc, scale, threshold).to_event(1))
