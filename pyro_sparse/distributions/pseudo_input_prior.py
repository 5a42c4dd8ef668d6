import math

import torch
from pyro.distributions import TorchDistribution
from torch.distributions import Independent, constraints
from torch.distributions.kl import kl_divergence, register_kl

from pyro_sparse.distributions.spike_and_slab import SpikeAndSlab


class SelectedSpikeAndSlab(TorchDistribution):
    r"""
    The learned pseudo-input prior of Variational Sparse Coding (UAI version,
    supplement A.3): P spike-and-slab components — the recognition model's
    encodings of P learned pseudo-inputs — and, per data point, selection
    weights u*(x) over them,

    .. math::

        p(z \mid x) = \sum_p \pi_p(x) \prod_k
            \mathrm{SpikeAndSlab}(z_k; \gamma_{pk}, \mu_{pk}, \sigma_{pk}),
        \qquad \pi_p = u^*_p / \textstyle\sum_{p'} u^*_{p'} .

    We normalise the weights (the paper's u* come from a sharp sigmoid and are
    nearly one-hot) so that ``log_prob`` is the density of a proper mixture.
    The KL from a spike-and-slab posterior to that mixture has no closed
    form: by default none is given (``kl_divergence`` raises
    NotImplementedError and the mean-field ELBOs estimate it by Monte Carlo).
    Built with ``kl_objective="selection_weighted"`` (as the pseudo-input
    prior builds it), ``kl_divergence(q, self)`` returns supplement A.3's
    term Σ_p π_p KL(q ‖ p_p) instead: by convexity an upper bound on the KL
    to the mixture (2-3 times it for spread-out components), so the ELBO
    stays a lower bound of log p(x).

    :attr:`mean` and :attr:`variance` are the mixture's, in closed form; the
    entropy of the mixture has no closed form and is not provided.

    :param torch.Tensor weights: selection weights, shape ``(..., P)``, ≥ 0.
    :param SpikeAndSlab components: batch shape ``(P, K)``.
    :param str kl_objective: ``"exact"`` (no closed form: none registered)
        or ``"selection_weighted"`` (supplement A.3's bound).
    """

    arg_constraints = {"weights": constraints.independent(constraints.nonnegative, 1)}
    support = constraints.independent(constraints.real, 1)
    has_rsample = False

    def __init__(self, weights, components, kl_objective="exact", validate_args=None):
        if not isinstance(components, SpikeAndSlab) or components.batch_shape[:-1] != weights.shape[-1:]:
            raise ValueError("components must be a SpikeAndSlab with batch shape (P, K) matching weights (..., P)")
        if kl_objective not in ("exact", "selection_weighted"):
            raise ValueError(f"kl_objective must be 'exact' or 'selection_weighted', got {kl_objective!r}")
        self.weights, self.components, self.kl_objective = weights, components, kl_objective
        super().__init__(weights.shape[:-1], components.batch_shape[-1:], validate_args=validate_args)
        if self._validate_args and bool((weights.sum(-1) <= 0).any()):
            raise ValueError("the selection weights of a row are all 0: they select no component")

    @property
    def mixture_weights(self):
        return self.weights / self.weights.sum(-1, keepdim=True).clamp_min(torch.finfo(self.weights.dtype).tiny)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(SelectedSpikeAndSlab, _instance)
        batch_shape = torch.Size(batch_shape)
        new.weights = self.weights.expand(batch_shape + self.weights.shape[-1:])
        new.components, new.kl_objective = self.components, self.kl_objective
        super(SelectedSpikeAndSlab, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def log_prob(self, value):
        # Validated here, since the broadcasting below would hide a wrong
        # shape: a (..., 1) value would be scored against all K coordinates.
        if self._validate_args:
            self._validate_sample(value)
        # (..., 1, K) against (P, K): log density of each component, summed over k.
        per_component = self.components.log_prob(value.unsqueeze(-2)).sum(-1)
        # log Σ_p π_p e^{ℓ_p} shifted by max ℓ rather than through log π_p, whose gradient at a
        # zero weight (allowed: weights are non-negative) would turn every weight's gradient NaN.
        # The shift is the largest weighted component's: a weightless one far above it would underflow the rest.
        weights = self.mixture_weights
        largest = per_component.masked_fill(weights == 0, -math.inf).amax(-1, keepdim=True).detach()
        largest = largest.nan_to_num(neginf=0.0)  # every weighted component at -inf: log 0
        cap = math.log(torch.finfo(per_component.dtype).max) - 1  # a weightless term may not overflow (0 · ∞)
        return largest.squeeze(-1) + (weights * (per_component - largest).clamp(max=cap).exp()).sum(-1).log()

    @property
    def mean(self):
        # Σ_p π_p γ_pk μ_pk: (..., P, 1) weights against the (P, K) component means.
        return (self.mixture_weights.unsqueeze(-1) * self.components.mean).sum(-2)

    @property
    def variance(self):
        # Σ_p π_p Var_pk + Σ_p π_p (mean_pk - mean_k)²: no E[z²] - E[z]² cancellation.
        weights = self.mixture_weights.unsqueeze(-1)
        spread = (self.components.mean - self.mean.unsqueeze(-2)) ** 2
        return (weights * (self.components.variance + spread)).sum(-2)

    def sample(self, sample_shape=torch.Size()):
        with torch.no_grad():
            shape = self._extended_shape(sample_shape)
            choice = torch.distributions.Categorical(self.mixture_weights).sample(sample_shape)
            draws = self.components.sample(shape[:-1])  # (..., P, K)
            index = choice[..., None, None].expand(*choice.shape, 1, shape[-1])
            return draws.gather(-2, index).squeeze(-2)


@register_kl(Independent, SelectedSpikeAndSlab)
def _kl_spike_and_slab_to_selected(q, p):
    """Σ_p π_p Σ_k KL(q_k ‖ p_pk) (supplement A.3), for q a spike-and-slab with one event dim, if p asks for it."""
    if p.kl_objective != "selection_weighted" or not isinstance(q.base_dist, SpikeAndSlab) \
            or q.reinterpreted_batch_ndims != 1:
        raise NotImplementedError
    if q.event_shape != p.event_shape:
        raise ValueError(f"KL between codes of different sizes: {tuple(q.event_shape)} and {tuple(p.event_shape)}")
    base = q.base_dist
    expanded = SpikeAndSlab(
        base.gate.unsqueeze(-2), base.loc.unsqueeze(-2), base.scale.unsqueeze(-2), slope=base.slope
    )
    per_component = kl_divergence(expanded, p.components).sum(-1)  # (..., P)
    weights = p.mixture_weights
    # A component of weight 0 drops out, even where its KL is infinite (0 · ∞ would be NaN).
    return torch.where(weights > 0, weights * torch.where(weights > 0, per_component, 0.0), 0.0).sum(-1)
