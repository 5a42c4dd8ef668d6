"""Observation models shared by every decoder: p(x_i | decoder output)."""

import numpy as np
import pyro.distributions as dist
import torch

LIKELIHOODS = ("gaussian", "multinomial", "bernoulli")


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


def observation(likelihood, output, noise_variance=None):
    """
    The distribution of one data point's features given the decoder output
    (means for ``gaussian``; logits otherwise), with event shape ``(G,)``.
    """
    if likelihood == "gaussian":
        return dist.Normal(output, noise_variance.sqrt()).to_event(1)
    if likelihood == "bernoulli":
        return dist.Bernoulli(logits=output).to_event(1)
    # Softmax over features with each row's own total count.  torch's
    # Multinomial.log_prob uses the row sums of the value for the multinomial
    # coefficient, so per-row totals are exact; argument validation is off
    # because it would insist on one shared total_count.
    return dist.Multinomial(logits=output, validate_args=False)
