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
from pyro_sparse.guides import AmortizedNormalGuide, SpikeSlabGuide, ThresholdedGuide
from pyro_sparse.likelihoods import calibrate_noise_prior
from pyro_sparse.models import OIVAE, TVSC, VAE, VSC, SparseDGM
from pyro_sparse.nmf import FittedNMF


@dataclass(frozen=True)
class ModelEntry:
    model: type
    guide: type
    elbo: type
    summary: str


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
        SparseDGM, AmortizedNormalGuide, TraceMeanField_ELBO,
        "sparse VAE with a Spike-and-Slab Lasso decoder mask (Moran et al. 2022)",
    ),
    "vae": ModelEntry(
        VAE, AmortizedNormalGuide, TraceMeanField_ELBO,
        "VAE / beta-VAE with a dense decoder (Kingma & Welling 2014; Higgins et al. 2017)",
    ),
    "vsc": ModelEntry(
        VSC, SpikeSlabGuide, TraceMeanField_ELBO,
        "variational sparse coding: spike-and-slab codes (Tonolini et al. 2019/2020)",
    ),
    "tvsc": ModelEntry(
        TVSC, ThresholdedGuide, TraceMeanField_ELBO,
        "thresholded variational sparse coding: soft-thresholded Laplace/Gaussian codes (Fallah & Rozell 2022)",
    ),
    "oi_vae": ModelEntry(
        OIVAE, AmortizedNormalGuide, TraceMeanField_ELBO,
        "output-interpretable VAE: group-lasso latent-to-group maps, one generator per group (Ainsworth et al. 2018)",
    ),
    "nmf": EstimatorEntry(
        FittedNMF,
        "non-negative matrix factorisation (scikit-learn), Poisson (KL) or Gaussian (Frobenius) loss",
    ),
}


def get_entry(name):
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; registered models: {sorted(MODELS)}")
    return MODELS[name]


# Arguments that build() supplies itself rather than the user.
_SUPPLIED = {
    "self", "num_features", "latent_dim", "likelihood",
    "hidden_dims", "point_estimates", "log1p_input", "kl_weight", "threshold_kl_weight", "network",
}


def _parameters(cls):
    return inspect.signature(cls.__init__).parameters


def hyperparameter_names(name):
    """The keyword arguments ``train`` accepts for a model: its own, then its guide's."""
    entry = get_entry(name)
    if isinstance(entry, EstimatorEntry):
        supplied = {"matrix", "latent_dim", "likelihood", "seed"}
        return [p for p in inspect.signature(entry.estimator.fit).parameters if p not in supplied]
    model_names = [p for p in _parameters(entry.model) if p not in _SUPPLIED - {"hidden_dims"}]
    guide_names = [p for p in _parameters(entry.guide) if p not in _SUPPLIED and p not in model_names]
    return model_names + guide_names


def resolve_hyperparameters(name, likelihood, summary, hyper):
    """Check the user's hyperparameters and fill in data-calibrated ones."""
    allowed = hyperparameter_names(name)
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


def build(name, summary, latent_dim, likelihood, hyper):
    """
    Model, guide and ELBO for a resolved configuration (see
    ``resolve_hyperparameters``) and the training data's ``DataSummary``.
    """
    entry = get_entry(name)
    model_parameters, guide_parameters = _parameters(entry.model), _parameters(entry.guide)
    model = entry.model(
        summary.num_features,
        latent_dim=latent_dim,
        likelihood=likelihood,
        **{k: v for k, v in hyper.items() if k in model_parameters},
    )
    guide = entry.guide(
        summary.num_features,
        latent_dim,
        hidden_dims=model.hidden_dims,
        point_estimates=model.point_estimate_sites(summary.feature_variances),
        log1p_input=likelihood == "multinomial",
        **model.guide_options(),
        **{k: v for k, v in hyper.items() if k in guide_parameters and k not in model_parameters},
    )
    if hasattr(model, "attach_recognition"):
        model.attach_recognition(guide)
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
