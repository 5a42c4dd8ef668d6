"""
Models by name.  An entry pairs a model class with its guide class and ELBO;
adding a model to ``train(model=NAME)`` is adding one entry to ``MODELS``.

A registered model is an ``nn.Module`` whose ``forward(x, num_data)`` is a
Pyro model, with ``site_priors`` (priors of global sites that own fitting
hooks), ``point_estimate_sites(feature_variances)``, ``guide_options()``
(what its guide must share with it, e.g. the z site's scale) and, if its
network decoder should see standardised units, a ``decoder`` ending in a
``FeatureAffine`` named ``output_affine``; its constructor takes
``num_features, latent_dim, likelihood`` and its hyperparameters by keyword.

A model fitted by its own routine rather than SVI (``nmf``) is an
``EstimatorEntry`` instead: its class fits itself and saves and loads
itself through :mod:`pyro_sparse.serialization`.
"""

import inspect
from dataclasses import dataclass

import numpy as np
from pyro.infer import TraceMeanField_ELBO

from pyro_sparse.data import check_constant_features
from pyro_sparse.distributions import SpikeAndSlab
from pyro_sparse.guides import AmortizedNormalGuide, SpikeSlabGuide, ThresholdedGuide
from pyro_sparse.latent_priors import (
    DistributionPrior,
    NormalPrior,
    PseudoInputPrior,
    SpikeSlabPrior,
    ThresholdedLaplacePrior,
    ThresholdedNormalPrior,
)
from pyro_sparse.likelihoods import calibrate_noise_prior
from pyro_sparse.models import OIVAE, TVSC, VAE, VSC, SparseDGM
from pyro_sparse.nmf import FittedNMF
from pyro_sparse.priors import DistributionSitePrior, HorseshoePrior, SpikeSlabLassoPrior


@dataclass(frozen=True)
class ModelEntry:
    """
    A model fitted by SVI: its class, ELBO and default priors.  The guide
    follows from the latent prior (``GUIDES``); ``mask_prior`` is ``None``
    for models without a decoder mask.
    """

    model: type
    elbo: type
    summary: str
    latent_prior: str = "normal"
    mask_prior: str = None


@dataclass(frozen=True)
class EstimatorEntry:
    """
    A model with its own fitting routine: ``estimator.fit(matrix, *,
    latent_dim, likelihood, seed, **hyperparameters)`` returns an object with
    the evaluation interface of :class:`~pyro_sparse.api.FittedModel`
    (``transform``, ``reconstruct``, ``heldout_log_likelihood``, ``W_``,
    ``top_features``, ``save``), and ``estimator.from_saved(config, states,
    history)`` rebuilds one from a model file.
    """

    estimator: type
    summary: str


MODELS = {
    "ssl_dgm": ModelEntry(
        SparseDGM, TraceMeanField_ELBO,
        "sparse VAE with a Spike-and-Slab Lasso decoder mask (Moran et al. 2022)",
        mask_prior="ssl",
    ),
    "vae": ModelEntry(
        VAE, TraceMeanField_ELBO,
        "VAE / beta-VAE with a dense decoder (Kingma & Welling 2014; Higgins et al. 2017)",
    ),
    "vsc": ModelEntry(
        VSC, TraceMeanField_ELBO,
        "variational sparse coding: spike-and-slab codes (Tonolini et al. 2019/2020)",
        latent_prior="spike_slab",
    ),
    "tvsc": ModelEntry(
        TVSC, TraceMeanField_ELBO,
        "thresholded variational sparse coding: soft-thresholded Laplace/Gaussian codes (Fallah & Rozell 2022)",
        latent_prior="thresholded_laplace",
    ),
    "oi_vae": ModelEntry(
        OIVAE, TraceMeanField_ELBO,
        "output-interpretable VAE: group-lasso latent-to-group maps, one generator per group (Ainsworth et al. 2018)",
    ),
    "nmf": EstimatorEntry(
        FittedNMF,
        "non-negative matrix factorisation (scikit-learn), Poisson (KL) or Gaussian (Frobenius) loss",
    ),
}

# Priors of the codes z by name; each class's keyword arguments are the
# prior's hyperparameters, which train() accepts next to the model's.
LATENT_PRIORS = {
    "normal": NormalPrior,
    "spike_slab": SpikeSlabPrior,
    "pseudo_inputs": PseudoInputPrior,
    "thresholded_laplace": ThresholdedLaplacePrior,
    "thresholded_normal": ThresholdedNormalPrior,
}

# Priors of a decoder mask W (G, K) by name, with their hyperparameters likewise.
MASK_PRIORS = {"ssl": SpikeSlabLassoPrior, "horseshoe": HorseshoePrior}

# The guide family of each latent prior (its ``guide_family``) -> guide class.
GUIDES = {"normal": AmortizedNormalGuide, "spike_slab": SpikeSlabGuide, "thresholded": ThresholdedGuide}

# The guide family of a user's distribution, by type (subclasses included);
# any other distribution gets the Gaussian guide.  Add to it to pair a new
# prior with another guide, e.g. ``GUIDE_FAMILIES[MySpikeAndT] = "spike_slab"``.
GUIDE_FAMILIES = {SpikeAndSlab: "spike_slab"}

PRIOR_ARGUMENTS = ("latent_prior", "mask_prior")


def get_entry(name):
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; registered models: {sorted(MODELS)}")
    return MODELS[name]


# Arguments that build() supplies itself rather than the user.
_SUPPLIED = {
    "self", "num_features", "latent_dim", "likelihood", "hidden_dims", "point_estimates", "log1p_input",
    "kl_weight", "network", *PRIOR_ARGUMENTS,
    # what a latent prior shares with its guide (LatentPrior.guide_options)
    "base", "threshold", "learn_threshold", "threshold_kl_weight",
}


def _parameters(cls):
    return inspect.signature(cls.__init__).parameters


def _named(kind, value, registered):
    if value not in registered:
        raise ValueError(f"unknown {kind} {value!r}; registered: {sorted(registered)}, or a Pyro distribution")
    return registered[value]


def _prior_options(prior_class):
    return [p for p in _parameters(prior_class) if p not in {"self", "num_features", "latent_dim"}]


def guide_family(latent_prior):
    """The guide family a built latent prior pairs with."""
    if isinstance(latent_prior, DistributionPrior):
        families = [f for t, f in GUIDE_FAMILIES.items() if issubclass(latent_prior.distribution_type, t)]
        return families[0] if families else "normal"
    return latent_prior.guide_family


def hyperparameter_names(name, latent_prior=None, mask_prior=None):
    """
    The keyword arguments ``train`` accepts for a model with the given priors
    (default: the model's): the model's own, the priors', then the guide's.
    """
    entry = get_entry(name)
    if isinstance(entry, EstimatorEntry):
        supplied = {"matrix", "latent_dim", "likelihood", "seed"}
        return [p for p in inspect.signature(entry.estimator.fit).parameters if p not in supplied]
    names = [p for p in _parameters(entry.model) if p not in _SUPPLIED - {"hidden_dims"}]
    names += [p for p in PRIOR_ARGUMENTS if p in _parameters(entry.model)]
    latent_prior = entry.latent_prior if latent_prior is None else latent_prior
    if isinstance(latent_prior, str):
        prior_class = _named("latent_prior", latent_prior, LATENT_PRIORS)
        names += [p for p in _prior_options(prior_class) if p not in names]
        guides = [GUIDES[prior_class.guide_family]]
    else:
        # A user's distribution: its guide is known once it is built, so any
        # guide's options pass here and build() checks them against that guide.
        guides = list(GUIDES.values())
    mask_prior = entry.mask_prior if mask_prior is None else mask_prior
    if entry.mask_prior is not None and isinstance(mask_prior, str):
        names += [p for p in _prior_options(_named("mask_prior", mask_prior, MASK_PRIORS)) if p not in names]
    for guide in guides:
        names += [p for p in _parameters(guide) if p not in _SUPPLIED and p not in names]
    return names


def resolve_hyperparameters(name, likelihood, summary, hyper):
    """Check the user's hyperparameters and fill in data-calibrated ones."""
    allowed = hyperparameter_names(name, hyper.get("latent_prior"), hyper.get("mask_prior"))
    unknown = sorted(set(hyper) - set(allowed))
    if unknown:
        raise TypeError(f"model {name!r} has no hyperparameter(s) {unknown}; it accepts {allowed}")
    hyper = dict(hyper)
    global_noise = likelihood == "gaussian" and hyper.get("noise", "global") == "global"
    if global_noise and "noise_xi" in allowed and hyper.get("noise_xi") is None:
        check_constant_features(summary)
        nu = hyper.get("noise_nu", _parameters(get_entry(name).model)["noise_nu"].default)
        hyper["noise_xi"] = calibrate_noise_prior(summary.feature_variances, nu)
    if "noise_variance" in allowed and hyper.get("noise_variance") is None:
        # Eq. 12's -‖x - Az‖² is a Gaussian with σ² = 1/2 for unit-variance
        # features; keep that ratio for data in other units.
        hyper["noise_variance"] = 0.5 * float(np.mean(summary.feature_variances)) or 0.5
    if "hidden_dims" in hyper:
        hyper["hidden_dims"] = tuple(int(h) for h in hyper["hidden_dims"])
    return hyper


def _options(cls, hyper):
    return {k: v for k, v in hyper.items() if k in _parameters(cls)}


def build_latent_prior(value, num_features, latent_dim, hyper):
    """A latent prior from a registered name and its hyperparameters in ``hyper``, or from a user's distribution."""
    if not isinstance(value, str):
        return DistributionPrior(value, latent_dim)
    prior_class = _named("latent_prior", value, LATENT_PRIORS)
    sizes = {"num_features": num_features} if "num_features" in _parameters(prior_class) else {}
    return prior_class(latent_dim=latent_dim, **sizes, **_options(prior_class, hyper))


def build_mask_prior(value, num_features, latent_dim, hyper):
    """A (G, K) mask prior from a registered name and its hyperparameters, or from a user's distribution."""
    if not isinstance(value, str):
        return DistributionSitePrior(value, (num_features, latent_dim))
    prior_class = _named("mask_prior", value, MASK_PRIORS)
    return prior_class(num_features, latent_dim, **_options(prior_class, hyper))


def build(name, summary, latent_dim, likelihood, hyper):
    """
    Model, guide and ELBO for a resolved configuration (see
    ``resolve_hyperparameters``) and the training data's ``DataSummary``.
    """
    entry = get_entry(name)
    num_features = summary.num_features
    latent_prior = build_latent_prior(hyper.get("latent_prior", entry.latent_prior), num_features, latent_dim, hyper)
    priors = {"latent_prior": latent_prior}
    if entry.mask_prior is not None:
        priors["mask_prior"] = build_mask_prior(hyper.get("mask_prior", entry.mask_prior), num_features, latent_dim,
                                                hyper)
    model_parameters = _parameters(entry.model)
    model = entry.model(
        num_features,
        latent_dim=latent_dim,
        likelihood=likelihood,
        **priors,
        **{k: v for k, v in hyper.items() if k in model_parameters and k not in PRIOR_ARGUMENTS},
    )
    family = guide_family(latent_prior)
    guide_class = GUIDES[family]
    guide_parameters = _parameters(guide_class)
    prior_parameters = set(_parameters(type(latent_prior)))
    other_guides = {p for g in GUIDES.values() for p in _parameters(g)} - set(guide_parameters) - _SUPPLIED
    stray = sorted(other_guides.intersection(hyper) - set(model_parameters) - prior_parameters)
    if stray:
        raise TypeError(f"hyperparameter(s) {stray} do not apply: latent_prior pairs with the {family!r} guide")
    guide = guide_class(
        num_features,
        latent_dim,
        hidden_dims=model.hidden_dims,
        point_estimates=model.point_estimate_sites(summary.feature_variances),
        log1p_input=likelihood == "multinomial",
        **model.guide_options(),
        **latent_prior.guide_options(),
        **{
            k: v for k, v in hyper.items()
            if k in guide_parameters and k not in _SUPPLIED and k not in model_parameters and k not in prior_parameters
        },
    )
    latent_prior.attach_guide(guide)
    if likelihood == "gaussian":
        # Networks see standardised features; the likelihood stays in data units.
        # Scales are floored at a tenth of the median feature sd: a nearly
        # constant feature (an image border pixel) would otherwise blow up the
        # encoder's inputs and shrink a decoder's variance floor to nothing.
        scale = np.sqrt(summary.feature_variances)
        positive = scale[scale > 0]
        scale = np.maximum(scale, 0.1 * np.median(positive) if positive.size else 1.0)
        guide.input_affine.set(summary.feature_means, scale)
        output_affine = getattr(getattr(model, "decoder", None), "output_affine", None)
        if output_affine is not None:
            output_affine.set(summary.feature_means, scale)
    return model, guide, entry.elbo()
