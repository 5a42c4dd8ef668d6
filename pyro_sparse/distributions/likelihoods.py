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
    The negative binomial with its log-density taken in float64 (and returned
    in the parameters' dtype).  Its terms cancel: lgamma(x + θ) - lgamma(θ) is
    a difference of two values near θ log θ, and at large counts it and
    lgamma(x + 1), x log σ(logits) and θ log σ(-logits) are each far larger
    than their sum, so in float32 the sum carries float32's relative error of
    the largest (4e-3 nats per entry at θ = 1e4; 0.2 at counts of 1e5-1e6);
    a gene whose counts are nearly Poisson has a large inverse dispersion θ.
    """

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        theta, logits, x = self.total_count.double(), self.logits.double(), value.double()
        log_prob = (torch.lgamma(x + theta) - torch.lgamma(theta) - torch.lgamma(x + 1.0)
                    + theta * F.logsigmoid(-logits) + x * F.logsigmoid(logits))
        return log_prob.to(self.logits.dtype)


class Poisson(dist.Poisson):
    r"""
    The Poisson of log rate ℓ, with its log-density x ℓ - e^ℓ - lgamma(x + 1)
    taken in float64 from ℓ itself: at large counts the three terms nearly
    cancel (0.8 nats of float32 error at x = μ = 1e6), and a float32 rate
    e^ℓ underflows below ℓ ≈ -88 (then -inf and NaN gradients) where ℓ does not.
    """

    def __init__(self, log_rate, validate_args=None):
        self.log_rate = log_rate
        super().__init__(log_rate.exp(), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        """The law over a larger batch shape, its log rate expanded alike."""
        new = self._get_checked_instance(Poisson, _instance)
        new.log_rate = self.log_rate.expand(batch_shape)
        return super().expand(batch_shape, _instance=new)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        log_rate, x = self.log_rate.double(), value.double()
        return (x * log_rate - log_rate.exp() - torch.lgamma(x + 1.0)).to(self.log_rate.dtype)


def observation(likelihood, output, noise_variance=None, log_library=None, inverse_dispersion=None,
                zero_logits=None):
    r"""
    The distribution of one data point's features given the decoder output,
    with event shape ``(G,)``: means for ``gaussian``; logits for ``bernoulli``
    and ``multinomial``; for the count likelihoods, log rates f per unit of
    library (not normalised over genes, unlike scVI's softmax) with the
    cell's log library size ℓ as an offset (a GLM offset), so the mean count
    is μ_ig = exp(ℓ_i + f_ig):

    * ``poisson``: x_ig ~ Poisson(μ_ig);
    * ``negative_binomial``: x_ig ~ NB(mean μ_ig, inverse dispersion θ_g),
      variance μ + μ²/θ;
    * ``zinb``: with probability sigmoid(``zero_logits``) an extra zero, else NB
      (one zero-inflation logit per gene, for every cell).

    Each feature's term stands alone (no normaliser over features, unlike the
    multinomial's softmax), so feature subsampling stays unbiased.
    """
    if likelihood in COUNT_LIKELIHOODS:
        log_mean = output + log_library.unsqueeze(-1)
        if likelihood == "poisson":
            return Poisson(log_mean).to_event(1)
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
