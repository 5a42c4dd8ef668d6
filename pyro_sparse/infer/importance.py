"""Per-data-point quantities computed from a model/guide pair by tracing (keyword arguments: a minibatch's covariates and library sizes)."""

import math

import torch
from pyro import poutine
from pyro.distributions import ZeroInflatedDistribution
from torch.distributions import Independent

from pyro_sparse.plates import in_data_plate


def forked_rng(x):
    """A block whose random draws leave the caller's stream (CPU, and ``x``'s CUDA device) as it was."""
    devices = [x.device.index if x.device.index is not None else torch.cuda.current_device()] if x.is_cuda else []
    return torch.random.fork_rng(devices=devices)


def local_latent_sites(trace):
    """Names of the trace's latent sites inside the data plate, in the order they were drawn."""
    return [name for name, site in trace.nodes.items()
            if site["type"] == "sample" and in_data_plate(site) and not site["is_observed"]]


def exact_guide_trace(guide, x, **kwargs):
    """
    A trace of the guide on ``x`` whose local sites hold exact draws of their
    distributions: a relaxed (training-time) draw of a spike-and-slab code is
    never exactly 0 and would be scored by the slab density.  Sites are drawn
    in order, and the guide is replayed after each draw that later sites may
    depend on (a learned threshold, then the codes given it), so the trace
    is one draw of the guide's joint law.
    """
    guide_trace = poutine.trace(guide).get_trace(x, **kwargs)
    names = local_latent_sites(guide_trace)
    for position, name in enumerate(names):
        site = guide_trace.nodes[name]
        site["value"] = site["fn"].sample()
        if position + 1 < len(names):
            guide_trace = poutine.trace(poutine.replay(guide, trace=guide_trace)).get_trace(x, **kwargs)
    return guide_trace


def log_importance_weights(model, guide, x, **kwargs):
    r"""
    One draw z ~ q(z | x) per data point and its log weight
    log p(x, z | globals) - log q(z | x), with global sites at the guide's
    values.  Densities are unscaled (no minibatch or β scaling), so the mean
    weight is the ELBO per data point and their log-mean-exp over draws an
    importance-sampling estimate of log p(x).  ``pyro.factor`` terms (a
    prior's training penalty) are no part of p(x, z) and are left out.

    :returns: tensor of shape ``(batch,)``.
    """
    guide_trace = exact_guide_trace(guide, x, **kwargs)
    model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(x, **kwargs)
    log_weight = x.new_zeros(x.shape[0])
    for trace, sign in ((model_trace, 1.0), (guide_trace, -1.0)):
        for name, site in trace.nodes.items():
            if site["type"] != "sample" or not in_data_plate(site) or site["infer"].get("is_auxiliary"):
                continue
            if sign < 0 and site["is_observed"]:
                continue
            log_weight = log_weight + sign * site["fn"].log_prob(site["value"])
    return log_weight


@torch.no_grad()
def importance_log_likelihood(model, guide, x, num_samples=100, **kwargs):
    r"""
    log p(x_i) ≈ log (1/S) Σ_s p(x_i, z_s) / q(z_s | x_i), z_s ~ q(z | x_i):
    the importance-weighted bound (Burda et al. 2016), per data point.  It
    tightens towards log p(x_i) as S grows; it is not a reconstruction error.
    """
    weights = torch.stack([log_importance_weights(model, guide, x, **kwargs) for _ in range(num_samples)])
    return torch.logsumexp(weights, dim=0) - math.log(num_samples)


@torch.no_grad()
def expected_observation(model, guide, x, codes=None, decode_with=None, zero_inflation=True, **kwargs):
    """
    E[x | z, globals]: the model's mean of x given codes z (by default the
    posterior means E_q[z | x]), the posterior means of any other local site
    and the guide's values of the global sites.  ``decode_with``: keyword
    arguments that replace ``kwargs`` in the model only (a counterfactual
    batch: the cell is encoded under its own covariates, decoded under
    these).  ``zero_inflation=False``: for a zero-inflated likelihood the
    mean of the law under its gate (the negative binomial's μ, scVI's
    rate), not (1 - π)μ.  Deterministic: the guide's draws, replaced by
    means, come from a forked RNG, so the caller's random stream is left as
    it was.
    """
    with forked_rng(x):
        # Other local sites (a learned threshold) at their posterior means, and q(z | x) rebuilt from those
        # means (replayed, not merely overwritten: z's law depends on them), as the guide's posterior().
        guide_trace = poutine.trace(guide).get_trace(x, **kwargs)
        for name, site in guide_trace.nodes.items():
            if site["type"] == "sample" and in_data_plate(site) and name != "z":
                site["value"] = site["fn"].mean
        guide_trace = poutine.trace(poutine.replay(guide, trace=guide_trace)).get_trace(x, **kwargs)
        guide_trace.nodes["z"]["value"] = codes if codes is not None else guide_trace.nodes["z"]["fn"].mean
        model_kwargs = kwargs if decode_with is None else {**kwargs, **decode_with}
        model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(x, **model_kwargs)
    fn = model_trace.nodes["x"]["fn"]
    if not zero_inflation:
        inner = fn.base_dist if isinstance(fn, Independent) else fn
        fn = inner.base_dist if isinstance(inner, ZeroInflatedDistribution) else fn
    # detach: torch's lazy properties (a zero-inflated mean) compute with gradients on even under no_grad.
    return fn.mean.detach()
