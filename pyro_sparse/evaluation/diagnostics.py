"""
Posterior checks with ArviZ: a fitted model's draws as an ``InferenceData``
(arviz 0.x) or ``DataTree`` (arviz >= 1.0), posterior predictive checks of
per-feature statistics, and the Pareto k̂ of the importance ratios.

Draws from an SVI guide are independent draws from q, not a Markov chain:
R-hat and ESS say nothing about them, so none are reported here.  How well
the amortized q(z | x) approximates the posterior is what k̂ measures
(Yao, Vehtari, Simpson & Gelman 2018).
"""

import arviz as az
import numpy as np
import torch
import xarray as xr
from pyro import poutine
from pyro.poutine.util import site_is_subsample

from pyro_sparse.infer.importance import exact_guide_trace, log_importance_weights

# arviz >= 1.0 works on xarray DataTrees, 0.x on its own InferenceData.
ARVIZ_DATATREE = int(az.__version__.split(".")[0]) >= 1

STATISTICS = ("mean", "variance", "zero_fraction")
# PSIS fits a generalised Pareto to the min(S / 5, 3 √S) largest of S ratios, which must be more than 4.
MIN_PSIS_DRAWS = 25


def _check_num_samples(num_samples):
    if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")


def _replicate_counts(probs, totals):
    """
    Multinomial draws with each row's own total count.  The model's site has
    total count 1 (the row totals enter its log_prob only, through the
    observed values), so its own draws would be single counts.
    """
    max_total = int(totals.max())
    categories = torch.multinomial(probs, max_total, replacement=True)
    within_total = torch.arange(max_total, device=probs.device) < totals.unsqueeze(-1)
    return torch.zeros_like(probs).scatter_add_(-1, categories, within_total.to(probs.dtype))


def _predictive_draw(model, guide, x, likelihood, **kwargs):
    """
    One draw of the guide's sites, x replicated by the unconditioned model
    at those values (as :class:`pyro.infer.Predictive` with
    :func:`~pyro.poutine.uncondition`), and log p(x | z, globals): per feature
    when the likelihood factorises over features, per data point otherwise.
    """
    guide_trace = exact_guide_trace(guide, x, **kwargs)
    model_trace = poutine.trace(poutine.replay(poutine.uncondition(model), trace=guide_trace)).get_trace(x, **kwargs)
    observation = model_trace.nodes["x"]
    latents = {
        name: site["value"]
        for name, site in guide_trace.nodes.items()
        if site["type"] == "sample" and not site_is_subsample(site)
    }
    if likelihood == "multinomial":
        return latents, _replicate_counts(observation["fn"].probs, x.sum(-1)), observation["fn"].log_prob(x)
    return latents, observation["value"], observation["fn"].base_dist.log_prob(x)


def _local_dims(name, event_shape, latent_dim):
    """Dimension names of a local site's event: ``latent`` for codes, ArviZ's ``{name}_dim_{i}`` otherwise."""
    if tuple(event_shape) == (latent_dim,):
        return ["latent"]
    return [f"{name}_dim_{axis}" for axis in range(1, len(event_shape) + 1)]


def _global_dims(name, shape, num_features, latent_dim):
    """
    Dimension names of a global site, read from its shape: ``(feature,)`` for
    per-feature values (σ²), ``(latent,)`` for per-code values (a prior's
    thresholds), ``(feature, latent)`` for a (G, K) map (W, a dictionary A).
    Any other shape, and every shape when K = G (then a shape cannot say
    which axis is which), keeps ArviZ's ``{name}_dim_{i}`` rather than a guess.
    """
    known = {} if num_features == latent_dim else {
        (num_features,): ["feature"], (latent_dim,): ["latent"], (num_features, latent_dim): ["feature", "latent"]}
    return known.get(tuple(shape), [f"{name}_dim_{axis}" for axis in range(len(shape))])


@torch.no_grad()
def to_arviz(fitted, X, num_samples=100, feature_names=None, batch_size=256):
    r"""
    Draws of a fitted model on the rows of ``X`` as ArviZ data: an
    ``InferenceData`` under arviz 0.x, an ``xarray.DataTree`` under arviz
    >= 1.0, with one chain of ``num_samples`` draws and the groups

    * ``posterior``: every site of the guide.  Local codes (``z``, and
      ``threshold`` for tvsc with learned thresholds) are exact draws from
      q(z | x_i), dims ``(data_point, latent)``; a latent library size
      (``log_library``) has dims ``(data_point,)``; spike-and-slab and
      thresholded codes have exact zeros.  Global sites that the guide
      point-estimates (``W``, ``sigma2``, a linear dictionary ``A``) are
      latent variables of the model whose q is a point mass, so each draw
      holds the same MAP value (the ``point_estimates`` attribute lists
      them); they are not ``constant_data``, which ArviZ reserves for inputs
      the model does not treat as random.
    * ``posterior_predictive``: ``x`` replicated from p(x | z, globals) at
      each draw, dims ``(data_point, feature)``; multinomial rows keep their
      observed totals.
    * ``log_likelihood``: ``x`` = log p(x_ij | z_i, globals) per data point
      and feature for every likelihood but the multinomial (they factorise
      over features, so the sum over ``feature`` is log p(x_i | z_i) and
      ArviZ's LOO-PIT works per element); the multinomial does not factorise,
      so there it is log p(x_i | z_i) per data point, dims ``(data_point,)``,
      and LOO-PIT, which needs one value per element, does not apply.
    * ``observed_data``: ``x``.

    Replicates are drawn given each point's own codes, z ~ q(z | x_i), so
    they check the fit on the data the model saw.  The predictive and
    log-likelihood groups hold num_samples × N × G values each: pass a
    subset of rows for large data.  For reproducible draws seed first
    (``pyro.set_rng_seed``).

    :param fitted: a :class:`~pyro_sparse.fitted.FittedModel`.
    :param X: (N, G) data: numpy array, torch tensor or scipy.sparse matrix.
    :param int num_samples: draws per data point.
    :param feature_names: G names for the ``feature`` coordinate (default: the
        names the model was trained with, e.g. an AnnData's ``var_names``, else 0..G-1).
    :param int batch_size: rows traced at once.
    """
    _check_num_samples(num_samples)
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    feature_names = _feature_names(fitted, feature_names)
    likelihood = fitted.config["likelihood"]
    observed, replicated, log_likelihood, latents = _draw_batches(fitted, X, num_samples, batch_size)
    if likelihood != "gaussian":  # counts and binary data: integers, so ArviZ plots them as discrete
        observed, replicated = observed.astype(np.int64), replicated.astype(np.int64)
    coords = {
        "chain": [0],
        "draw": np.arange(num_samples),
        "data_point": _row_names(X, observed.shape[0]),
        "feature": feature_names,
        "latent": np.arange(fitted.config["latent_dim"]),
        "latent_other": np.arange(fitted.config["latent_dim"]),  # R's second axis
    }
    return _arviz_data(
        _groups(fitted, latents, observed, replicated, log_likelihood, coords),
        attrs={"inference_library": "pyro", "model": fitted.config["model"], "likelihood": likelihood},
    )


def _row_names(X, num_rows):
    """The ``data_point`` coordinate: an AnnData's ``obs_names`` or a DataFrame's index, else 0..N-1."""
    names = getattr(X, "obs_names", None)
    if names is None and hasattr(X, "columns"):
        names = getattr(X, "index", None)
    names = np.asarray(names) if names is not None else np.arange(num_rows)
    return names if names.shape == (num_rows,) else np.arange(num_rows)


def _feature_names(fitted, feature_names):
    """The ``feature`` coordinate: the given names, those the model was trained with, or 0..G-1."""
    num_features, trained = fitted.num_features, fitted.config.get("feature_names")
    if feature_names is None:
        feature_names = trained or np.arange(num_features)
    feature_names = np.asarray(feature_names)
    if feature_names.shape != (num_features,):
        raise ValueError(f"feature_names must hold {num_features} names, got shape {feature_names.shape}")
    if trained is not None and [str(name) for name in feature_names] != [str(name) for name in trained]:
        raise ValueError("feature_names differ from the names the model was trained with (the columns keep their "
                         "training order): leave feature_names out to use them")
    return feature_names


def _draw_batches(fitted, X, num_samples, batch_size):
    """
    ``num_samples`` predictive draws (:func:`_predictive_draw`) of every batch of rows:
    returns the observed rows (N, G), the replicates (S, N, G), log-likelihoods
    (S, N, G) or (S, N), and ``name -> [draws per batch]`` of the guide's sites
    (a point estimate is kept from the first batch only: it is the same in all).
    """
    likelihood = fitted.config["likelihood"]
    observed, replicates, log_likelihoods, latents = [], [], [], {}
    for batch in fitted._batches(X, batch_size):
        draws = [_predictive_draw(fitted.model, fitted.guide, batch.x, likelihood, **batch.kwargs)
                 for _ in range(num_samples)]
        observed.append(batch.x.cpu().numpy())
        replicates.append(torch.stack([replicate for _, replicate, _ in draws]).cpu().numpy())
        log_likelihoods.append(torch.stack([log_lik for _, _, log_lik in draws]).cpu().numpy())
        for name in draws[0][0]:
            if name in fitted.guide.unconstrained and name in latents:
                continue  # a point estimate: the same in every batch
            latents.setdefault(name, []).append(torch.stack([sites[name] for sites, _, _ in draws]).cpu().numpy())
    return (
        np.concatenate(observed),
        np.concatenate(replicates, axis=1),
        np.concatenate(log_likelihoods, axis=1),
        latents,
    )


def _posterior_variables(latents, point_estimates, num_features, latent_dim):
    """``name -> (dims, draws)`` of the guide's sites: local ones over all rows, global ones once."""
    posterior = {}
    for name, values in latents.items():
        if name in point_estimates:
            posterior[name] = (_global_dims(name, values[0].shape[1:], num_features, latent_dim), values[0])
        else:
            dims = ["data_point"] + _local_dims(name, values[0].shape[2:], latent_dim)
            posterior[name] = (dims, np.concatenate(values, axis=1))
    return posterior


def _groups(fitted, latents, observed, replicated, log_likelihood, coords):
    """The four groups of :func:`to_arviz` as ``xarray.Dataset``s."""
    posterior = _posterior_variables(
        latents, fitted.guide.unconstrained, fitted.num_features, fitted.config["latent_dim"]
    )
    if "latent_correlation" in posterior:
        # The site holds the Cholesky factor L; users read the correlation matrix R = L Lᵀ.
        draws = posterior["latent_correlation"][1].shape[0]
        correlation = np.broadcast_to(fitted.latent_correlation_, (draws, *fitted.latent_correlation_.shape))
        posterior["latent_correlation"] = (["latent", "latent_other"], correlation)
    posterior_attrs = {
        "draws": "independent draws from the amortized guide q(z | x): R-hat and ESS do not apply",
        "point_estimates": " ".join(sorted(fitted.guide.unconstrained)),
        # Factors whose column of W is exactly zero are ignored by the decoder; their draws are meaningless.
        "active_factors": " ".join(str(k) for k in fitted.active_factors_),
    }
    data_dims = ["data_point", "feature"]
    # The multinomial does not factorise over features: one value per data point.
    log_likelihood_dims = ["data_point"] if fitted.config["likelihood"] == "multinomial" else data_dims
    return {
        "posterior": _draws_dataset(posterior, coords, posterior_attrs),
        "posterior_predictive": _draws_dataset({"x": (data_dims, replicated)}, coords),
        "log_likelihood": _draws_dataset({"x": (log_likelihood_dims, log_likelihood)}, coords),
        "observed_data": xr.Dataset({"x": (data_dims, observed)}, coords=_coords(data_dims, coords)),
    }


def _coords(dims, coords):
    return {dim: coords[dim] for dim in dims if dim in coords}


def _draws_dataset(variables, coords, attrs=None):
    """A group of draws: every variable gets leading (chain, draw) axes, one chain of independent draws."""
    data_vars = {name: (["chain", "draw", *dims], values[None]) for name, (dims, values) in variables.items()}
    used = {dim for dims, _ in data_vars.values() for dim in dims}
    return xr.Dataset(data_vars, coords=_coords(used, coords), attrs=attrs or {})


def _arviz_data(groups, attrs):
    if ARVIZ_DATATREE:
        return xr.DataTree.from_dict({"/": xr.Dataset(attrs=attrs), **groups})
    return az.InferenceData(attrs=attrs, **groups)


def predictive_checks(data, statistics=STATISTICS):
    r"""
    Posterior predictive checks of per-feature statistics T: for each
    feature, T of the observed column, the mean and standard deviation of T
    over the replicated data sets, and the posterior predictive p-value
    P(T(x_rep) > T(x)) + ½ P(T(x_rep) = T(x)) (Gelman et al., *Bayesian Data
    Analysis*, Sec. 6.3; ties, common for the zero fraction of counts, count
    half).  A p-value near 0 or 1 means the model does not reproduce T.

    Statistics: ``"mean"`` and ``"variance"`` (over data points, ddof 0) and
    ``"zero_fraction"``, the share of exact zeros (a Gaussian likelihood
    reproduces none in sparse counts or binary data, however sparse its codes).

    :param data: the output of :func:`to_arviz`.
    :returns: ``xarray.Dataset`` with ``observed``, ``replicated_mean``,
        ``replicated_sd`` and ``p_value``, dims ``(statistic, feature)``.
    """
    statistics = (statistics,) if isinstance(statistics, str) else tuple(statistics)
    if not statistics:
        raise ValueError(f"give at least one statistic, from {STATISTICS}")
    unknown = sorted(set(statistics) - set(STATISTICS))
    if unknown:
        raise ValueError(f"unknown statistics {unknown}; choose from {STATISTICS}")
    observed = data["observed_data"]["x"]
    replicated = data["posterior_predictive"]["x"]
    results = []
    for statistic in statistics:
        t_observed = _statistic(statistic, observed)
        t_replicated = _statistic(statistic, replicated)
        results.append(
            xr.Dataset(
                {
                    "observed": t_observed,
                    "replicated_mean": t_replicated.mean(("chain", "draw")),
                    "replicated_sd": t_replicated.std(("chain", "draw")),
                    "p_value": (t_replicated > t_observed).mean(("chain", "draw"))
                    + 0.5 * (t_replicated == t_observed).mean(("chain", "draw")),
                }
            )
        )
    return xr.concat(results, dim=xr.DataArray(list(statistics), dims="statistic"))


def _statistic(name, x):
    x = x.astype(float)
    if name == "mean":
        return x.mean("data_point")
    if name == "variance":
        return x.var("data_point")
    return (x == 0).mean("data_point")


@torch.no_grad()
def pareto_khat(fitted, X, num_samples=500, batch_size=256):
    r"""
    Pareto k̂ of the importance ratios r_s = p(x_i, z_s) / q(z_s | x_i),
    z_s ~ q(z | x_i), one per data point (global sites at their point
    estimates): PSIS (Vehtari, Simpson, Gelman, Yao & Gabry 2024, ArviZ's
    implementation) fits a generalised Pareto distribution to the largest
    ratios, and its shape k̂ says how heavy their tail is.  As a check of a
    variational posterior (Yao et al. 2018): k̂ < 0.5, q is close to the
    posterior of x_i and importance-weighted estimates such as
    ``heldout_log_likelihood`` converge quickly; up to 0.7 they are usable;
    above 0.7 q misses mass of the posterior and those estimates are
    unreliable.  With S draws, k̂ above 1 - 1/log10(S) (0.63 for S = 500)
    already needs more draws than S (Vehtari et al. 2024, Sec. 3.2.3).

    The ratios are those of :func:`~pyro_sparse.infer.importance.log_importance_weights`
    (exact draws of spike-and-slab and thresholded codes); the draws are
    independent, so the relative efficiency is 1.  k̂ is NaN for a point whose
    largest ratios are ties, an atom of q (e.g. the draw with all
    spike-and-slab codes 0): its ratios are bounded, so importance-weighted
    estimates are stable, but the tail has no Pareto shape to estimate.

    :returns: numpy array of shape (N,).
    """
    _check_num_samples(num_samples)
    if num_samples < MIN_PSIS_DRAWS:
        raise ValueError(f"num_samples={num_samples} draws are too few for PSIS: the Pareto fit takes the largest "
                         f"min(S / 5, 3 √S) ratios, and needs more than 4 (use at least {MIN_PSIS_DRAWS}; "
                         "the default 500)")
    log_weights = np.concatenate(
        [
            torch.stack([log_importance_weights(fitted.model, fitted.guide, batch.x, **batch.kwargs)
                         for _ in range(num_samples)], -1)
            .cpu()
            .double()
            .numpy()
            for batch in fitted._batches(X, batch_size)
        ]
    )
    if not np.all(np.isfinite(log_weights) | (log_weights == -np.inf)):
        raise ValueError("the log importance ratios contain NaN or +inf: the model gives the data an invalid density")
    return _psis_khat(log_weights)


def _psis_khat(log_ratios):
    """
    PSIS k̂ of log ratios (N, S) -> (N,), ArviZ's ``psislw`` with relative
    efficiency 1 (independent draws); NaN where the tail has fewer than 5
    distinct ratios above its cut-off (ArviZ returns inf there).
    """
    if ARVIZ_DATATREE:
        # arviz >= 1.0's psislw takes log-likelihoods, whose negatives are the (LOO) log ratios.
        log_likelihoods = xr.DataArray(-log_ratios, dims=("data_point", "draw"))
        _, khat = log_likelihoods.azstats.psislw(dim="draw", r_eff=1.0)
        khat = khat.values
    else:
        _, khat = az.psislw(log_ratios, reff=1.0)
    return np.where(_tied_tail(log_ratios), np.nan, khat)


def _tied_tail(log_ratios):
    """
    Rows whose PSIS tail (the min(S / 5, 3 √S) largest ratios) is mostly one
    repeated value: an atom of q, such as the draw with every spike-and-slab
    code 0, whose ratio is then the largest.  The ratios are bounded there,
    and the Pareto shape of their tail is undefined, not infinite.
    """
    S = log_ratios.shape[-1]
    tail = int(np.ceil(min(0.2 * S, 3 * np.sqrt(S))))
    top = -np.sort(-log_ratios, axis=-1)[..., : tail + 1]
    return (top > top[..., -1:]).sum(-1) <= 4
