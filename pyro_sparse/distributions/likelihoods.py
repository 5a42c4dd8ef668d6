"""Observation models shared by every decoder: p(x_i | decoder output)."""

import numpy as np
import pyro.distributions as dist
import torch
import torch.nn.functional as F

LIKELIHOODS = ("gaussian", "multinomial", "bernoulli", "poisson", "negative_binomial", "zinb")
# Likelihoods of raw counts with the library size as an offset (see :func:`observation`).
COUNT_LIKELIHOODS = ("poisson", "negative_binomial", "zinb")


def check_likelihood(likelihood):
    if likelihood not in LIKELIHOODS:
        raise ValueError(f"unknown likelihood {likelihood!r}; choose one of {LIKELIHOODS}")
    return likelihood


def check_feature_subsample_size(size, num_features, likelihood):
    r"""
    Validate a feature subsample size (``None``: no subsampling).

    Subsampling features needs a log-likelihood that is a sum of per-feature
    terms; the multinomial's is not:
    log p(x | f) = const + Σ_j x_j f_j - n log Σ_j exp f_j, whose normaliser
    needs every f_j, and the log of an unbiased subset estimate of Σ_j exp f_j
    is a biased estimate of its log (Jensen's inequality).
    """
    if size is None:
        return None
    if likelihood == "multinomial":
        raise ValueError(
            "feature_subsample_size does not apply to the multinomial likelihood: its softmax normaliser "
            "log sum_j exp(f_j) couples all features, so the log-likelihood of a random subset of features, "
            "scaled up, is not an unbiased estimate of the full one; leave feature_subsample_size=None"
        )
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not 1 <= size <= num_features:
        raise ValueError(
            f"feature_subsample_size must be an integer from 1 to the number of features ({num_features}) "
            f"or None, got {size!r}"
        )
    return None if size == num_features else int(size)


class InverseGamma(dist.InverseGamma):
    """
    The Inverse-Gamma with its log density in closed form: torch's, through the
    transformed Gamma, has a gradient that overflows float32 for σ² ≳ 1e13
    (data in large units).
    """

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        a, b = self.concentration, self.rate
        return a * b.log() - torch.lgamma(a) - (a + 1) * value.log() - b / value


class NegativeBinomial(dist.NegativeBinomial):
    r"""
    The negative binomial with lgamma(x + θ) - lgamma(θ) taken in float64.
    In float32 the two terms cancel: each is about θ log θ, so the difference
    carries float32's relative error of θ log θ (4e-3 nats per entry at
    θ = 1e4, 0.6 at θ = 1e6), and a gene whose counts are nearly Poisson has a
    large inverse dispersion θ.  The rest,
    θ log σ(-logits) + x log σ(logits) - lgamma(x + 1), has no cancellation.
    """

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        theta, logits = self.total_count, self.logits
        ratio = torch.lgamma(theta.double() + value.double()) - torch.lgamma(theta.double())
        return (ratio.to(logits.dtype) - torch.lgamma(value + 1.0)
                + theta * F.logsigmoid(-logits) + value * F.logsigmoid(logits))


def observation(likelihood, output, noise_variance=None, log_library=None, inverse_dispersion=None,
                zero_logits=None):
    r"""
    The distribution of one data point's features given the decoder output,
    with event shape ``(G,)``: means for ``gaussian``; logits for ``bernoulli``
    and ``multinomial``; for the count likelihoods, log proportions f with the
    cell's log library size ℓ as an offset (a GLM offset, as in scVI), so the
    mean count is μ_ig = exp(ℓ_i + f_ig):

    * ``poisson``: x_ig ~ Poisson(μ_ig);
    * ``negative_binomial``: x_ig ~ NB(mean μ_ig, inverse dispersion θ_g),
      variance μ + μ²/θ;
    * ``zinb``: with probability sigmoid(``zero_logits``) an extra zero, else NB.

    Each feature's term stands alone (no normaliser over features, unlike the
    multinomial's softmax), so feature subsampling stays unbiased.
    """
    if likelihood in COUNT_LIKELIHOODS:
        log_mean = output + log_library.unsqueeze(-1)
        if likelihood == "poisson":
            return dist.Poisson(log_mean.exp()).to_event(1)
        logits = log_mean - inverse_dispersion.log()
        negative_binomial = NegativeBinomial(total_count=inverse_dispersion, logits=logits)
        if likelihood == "negative_binomial":
            return negative_binomial.to_event(1)
        return dist.ZeroInflatedDistribution(negative_binomial, gate_logits=zero_logits).to_event(1)
    if likelihood == "gaussian":
        return dist.Normal(output, noise_variance.sqrt()).to_event(1)
    if likelihood == "bernoulli":
        return dist.Bernoulli(logits=output).to_event(1)
    # Softmax over features with each row's own total count.  torch's
    # Multinomial.log_prob uses the row sums of the value for the multinomial
    # coefficient, so per-row totals are exact; argument validation is off
    # because it would insist on one shared total_count.
    return dist.Multinomial(logits=output, validate_args=False)
