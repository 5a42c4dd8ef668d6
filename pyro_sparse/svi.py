"""
A registered Pyro model fitted by SVI: its options, its assembly from names
(model + latent prior + mask prior + the guide the latent prior pairs with),
and the fit.

A model class here is an ``nn.Module`` whose ``forward(x, num_data)`` is a
Pyro model that draws its codes with ``latent_prior.sample_globals(x)`` and,
inside the data plate, ``z = latent_prior.sample(x, kl_weight)``; it has
the members of :data:`MODEL_INTERFACE` (``train`` names any that is
missing; ``models/vae.py`` is the smallest example), and its constructor
takes ``num_features, latent_dim, likelihood, latent_prior`` and its
hyperparameters by keyword.  It may define ``data_defaults(summary,
likelihood, hyper)``, a classmethod returning hyperparameters calibrated from
the training data.  If its decoder should see standardised units it ends in
a ``FeatureAffine`` named ``output_affine``.  A model, prior or guide class
may declare ``former_defaults`` (option -> the value files written before the
option existed were trained with) and ``option_conditions`` (option ->
(setting, values under which it acts, or ``"given"``); ``train`` refuses it
elsewhere when set away from its default).
"""

import hashlib
import inspect
import json
import logging
import math
import warnings

import numpy as np
import pyro
import torch
from pyro.infer import TraceMeanField_ELBO
from torch.distributions import Distribution

from pyro_sparse.checks import is_count
from pyro_sparse.data import DataSummary, check_training_data
from pyro_sparse.data.covariates import CovariateSpec
from pyro_sparse.distributions.likelihoods import COUNT_LIKELIHOODS, LIKELIHOODS
from pyro_sparse.distributions.util import fingerprint
from pyro_sparse.fitted import FittedModel
from pyro_sparse.guides import GUIDE_FAMILIES, GUIDES
from pyro_sparse.infer import checkpoints, distributed
from pyro_sparse.infer.config import Optimization, unknown_options_error
from pyro_sparse.infer.elbo import MaxParticleELBO, kl_terms
from pyro_sparse.infer.loop import TrainingDivergedError, fit
from pyro_sparse.io import serialization
from pyro_sparse.nn import (
    check_library_source,
    check_precision,
    check_step_memory,
    evaluation_mode,
    resolve_device,
    set_decoder_precision,
    tf32_matmuls,
)
from pyro_sparse.priors import LATENT_PRIORS, MASK_PRIORS, DistributionPrior, DistributionSitePrior

logger = logging.getLogger("pyro_sparse")

PRIOR_ARGUMENTS = ("latent_prior", "mask_prior")
# Likelihoods whose encoder is batch-normalised by default (SVIModel._encoder_defaults).
BATCH_NORM_LIKELIHOODS = ("negative_binomial", "zinb")
# Constructor arguments that the assembly supplies itself rather than the user.
_SUPPLIED = {
    "self", "num_features", "latent_dim", "likelihood", "hidden_dims", "point_estimates", "log1p_input",
    "kl_weight", "network", "covariate_dim", "num_batches", "latent_library", *PRIOR_ARGUMENTS,
    # what a latent prior shares with its guide (LatentPrior.guide_options)
    "base", "threshold", "learn_threshold", "threshold_kl_weight",
}
# Network widths: the decoder's (the model's, and the encoder's unless set) and the encoder's.
_WIDTHS = ("hidden_dims", "encoder_hidden_dims")
_CUSTOM = "custom:"


def _parameters(cls):
    return inspect.signature(cls.__init__).parameters


def _named(kind, value, registered):
    if value not in registered:
        raise ValueError(f"unknown {kind} {value!r}; registered: {sorted(registered)}, or a Pyro distribution")
    return registered[value]


def _prior_options(prior_class):
    return [p for p in _parameters(prior_class) if p not in {"self", "num_features", "latent_dim", "feature_names"}]


def _options(cls, hyper):
    return {k: v for k, v in hyper.items() if k in _parameters(cls)}


def _jsonable(value):
    """Plain Python values for the JSON configuration (numpy scalars and arrays, and tensors on any device)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    if isinstance(value, (tuple, list)):
        return [_jsonable(item) for item in value]
    return value


def _custom_label(prior):
    """What the JSON configuration records of a user's prior object (it cannot hold the object)."""
    return _CUSTOM + getattr(prior, "__qualname__", type(prior).__qualname__)


def check_hidden_dims(hidden_dims, name="hidden_dims"):
    if isinstance(hidden_dims, (str, bytes)) or not np.iterable(hidden_dims):
        raise TypeError(f"{name} must be a sequence of layer widths, e.g. (50, 50), got {hidden_dims!r}")
    if not all(is_count(width) for width in hidden_dims):
        raise ValueError(f"{name} must hold positive integer widths, got {tuple(hidden_dims)!r}")
    return tuple(int(width) for width in hidden_dims)


def guide_family(latent_prior):
    """The guide family a built latent prior pairs with."""
    if isinstance(latent_prior, DistributionPrior):
        families = [f for t, f in GUIDE_FAMILIES.items() if issubclass(latent_prior.distribution_type, t)]
        return families[0] if families else "normal"
    return latent_prior.guide_family


def build_latent_prior(value, num_features, latent_dim, hyper):
    """A latent prior from a registered name and its hyperparameters in ``hyper``, or from a user's distribution."""
    if not isinstance(value, str):
        return DistributionPrior(value, latent_dim)
    prior_class = _named("latent_prior", value, LATENT_PRIORS)
    sizes = {"num_features": num_features} if "num_features" in _parameters(prior_class) else {}
    return prior_class(latent_dim=latent_dim, **sizes, **_options(prior_class, hyper))


def build_mask_prior(value, num_features, latent_dim, hyper, feature_names=None):
    """
    A (G, K) mask prior from a registered name and its hyperparameters, or from
    a user's distribution; a prior whose constructor takes ``feature_names``
    gets the data's (e.g. to align gene sets).
    """
    if not isinstance(value, str):
        return DistributionSitePrior(value, (num_features, latent_dim))
    prior_class = _named("mask_prior", value, MASK_PRIORS)
    names = {"feature_names": feature_names} if "feature_names" in _parameters(prior_class) else {}
    return prior_class(num_features, latent_dim, **names, **_options(prior_class, hyper))


def _prior_owners(name):
    """
    Registered priors that take an option ``name``, themselves or through the
    guide they bring, as ``latent_prior='x'`` / ``mask_prior='y'`` phrases.
    """
    owners = [f"latent_prior={k!r}" for k, cls in LATENT_PRIORS.items()
              if name in _prior_options(cls) or name in _parameters(GUIDES[cls.guide_family]) and name not in _SUPPLIED]
    owners += [f"mask_prior={k!r}" for k, cls in MASK_PRIORS.items() if name in _prior_options(cls)]
    return owners


def _belongs(name):
    """Which priors take an option that the model does not, if any."""
    owners = _prior_owners(name)
    return f"{name!r} belongs to {' / '.join(owners)}" if owners else None


# What the assembly and the fit read from a model besides forward(), with what each is.
MODEL_INTERFACE = {
    "latent_dim": "K, the code size",
    "latent_prior": "the LatentPrior its constructor received",
    "hidden_dims": "widths the guide's encoder copies",
    "site_priors": "an nn.ModuleDict of its global sites' priors with fitting hooks (may be empty)",
    "point_estimate_sites": "a method feature_variances -> {site: initial value} of its point-estimated globals",
    "guide_options": "a method returning what its guide must share with it, e.g. {'kl_weight': beta}",
    "observation": "its pyro_sparse.nn.ObservationModel (likelihood, dispersion, library size)",
}


def _check_model_interface(model):
    missing = [f"{name} ({what})" for name, what in MODEL_INTERFACE.items() if not hasattr(model, name)]
    if missing:
        raise TypeError(f"the model {type(model).__name__} lacks " + "; ".join(missing)
                        + "; see pyro_sparse.svi.MODEL_INTERFACE and models/vae.py")


class SVIModel:
    """
    A registry entry for a model fitted by SVI: the model class, its ELBO and
    default priors.  The guide follows from the latent prior
    (:data:`pyro_sparse.guides.GUIDES`); ``mask_prior`` is ``None`` for
    models without a decoder mask.  ``prior_defaults`` maps a registered
    latent prior's name to the options this model gives it where the user
    does not (e.g. a code scale that suits the model rather than the prior's
    own defaults); ``count_networks`` gives the decoder and encoder widths
    (``hidden_dims``, ``encoder_hidden_dims``) for count likelihoods, used when
    the user sets no ``hidden_dims``.
    """

    likelihoods = LIKELIHOODS

    def __init__(self, model, summary, latent_prior="normal", mask_prior=None, elbo=TraceMeanField_ELBO,
                 training_defaults=None, prior_defaults=None, count_networks=None):
        self.model, self.summary, self.elbo = model, summary, elbo
        self.latent_prior, self.mask_prior = latent_prior, mask_prior
        self.prior_defaults = {name: dict(options) for name, options in (prior_defaults or {}).items()}
        # ``hidden_dims`` / ``encoder_hidden_dims`` for count likelihoods when the user sets no ``hidden_dims``.
        self.count_networks = dict(count_networks or {})
        # What ``train`` uses for its settings left at None (``lr`` and config objects).
        self.training_defaults = dict(training_defaults or {})

    # ------------------------------------------------------------ options

    def option_names(self, latent_prior=None, mask_prior=None):
        """
        The keyword arguments ``train`` accepts as hyperparameters with the given
        priors (default: the model's): the model's own, the priors', then the guide's.
        """
        names = [p for p in _parameters(self.model) if p not in _SUPPLIED - {"hidden_dims"}]
        names += ["encoder_hidden_dims"]
        names += [p for p in PRIOR_ARGUMENTS if p in _parameters(self.model)]
        latent_prior = self.latent_prior if latent_prior is None else latent_prior
        if isinstance(latent_prior, str):
            prior_class = _named("latent_prior", latent_prior, LATENT_PRIORS)
            names += [p for p in _prior_options(prior_class) if p not in names]
            guides = [GUIDES[prior_class.guide_family]]
        else:
            # A user's distribution: its guide is known once it is built, so any
            # guide's options pass here and build() checks them against that guide.
            guides = list(GUIDES.values())
        mask_prior = self.mask_prior if mask_prior is None else mask_prior
        if self.mask_prior is not None and isinstance(mask_prior, str):
            names += [p for p in _prior_options(_named("mask_prior", mask_prior, MASK_PRIORS)) if p not in names]
        for guide in guides:
            names += [p for p in _parameters(guide) if p not in _SUPPLIED and p not in names]
        return names

    def check_options(self, name, hyper, keywords=()):
        """
        Reject options the model, its priors and its guide do not take, saying
        where each belongs or which of them, the settings or the caller's own
        ``keywords`` (``train``'s) it misspells.
        """
        allowed = self.option_names(hyper.get("latent_prior"), hyper.get("mask_prior"))
        unknown = sorted(set(hyper) - set(allowed))
        if unknown:
            raise unknown_options_error(name, unknown, allowed, keywords, _belongs)

    def resolve(self, summary, likelihood, hyper, feature_names=None):
        """
        The user's hyperparameters with data-calibrated defaults filled in
        (``model.data_defaults``), and a named mask prior's options as its
        ``resolve_options(hyper, feature_names)`` records them (e.g. gene sets
        aligned to the features, in JSON).
        """
        hyper = {k: v for k, v in hyper.items() if not (k in _WIDTHS and v is None)}  # None: the default
        noise = sorted(k for k in ("noise_nu", "noise_xi", "min_noise_variance", "noise_variance")
                       if hyper.get(k) is not None)
        noise += ["noise"] if hyper.get("noise", "global") != "global" else []
        if likelihood != "gaussian" and noise:
            raise ValueError(f"{noise} set the noise of the gaussian likelihood; the {likelihood} likelihood "
                             "has none: leave them out")
        for name in _WIDTHS:
            if name in hyper:
                hyper[name] = check_hidden_dims(hyper[name], name)
        self._check_conditional_options(hyper)
        if likelihood in COUNT_LIKELIHOODS and "hidden_dims" not in hyper:
            hyper = {**self.count_networks, **hyper}
        if hyper.get("encoder_hidden_dims") == ():
            raise ValueError("encoder_hidden_dims needs at least one hidden layer, e.g. (50,)")
        if "encoder_hidden_dims" in hyper and hyper.get("decoder") == "conv":
            raise ValueError("encoder_hidden_dims sets the MLP encoder's widths; decoder='conv' uses the conv encoder")
        mask_prior = hyper.get("mask_prior", self.mask_prior)
        if self.mask_prior is not None and isinstance(mask_prior, str):
            resolve_options = getattr(_named("mask_prior", mask_prior, MASK_PRIORS), "resolve_options", None)
            hyper = hyper if resolve_options is None else resolve_options(hyper, feature_names)
        data_defaults = getattr(self.model, "data_defaults", None)
        hyper = data_defaults(summary, likelihood, hyper) if data_defaults is not None else hyper
        return self._encoder_defaults(likelihood, hyper)

    def _check_conditional_options(self, hyper):
        """
        Refuse an option set away from its default where it has no effect: a
        class's ``option_conditions`` maps an option to the setting and the
        values of it under which the option acts (e.g. a decoder kind), or
        ``"given"``: whenever the setting is neither None nor empty; or to a
        list of such pairs, any of which lets it act.
        """
        settings = {**self.defaults(hyper), **hyper}

        def acts(setting, values):
            value = settings.get(setting)
            given = value is not None and not (isinstance(value, (tuple, list)) and len(value) == 0)
            return given if values == "given" else value in values

        for cls in self._option_classes(hyper):
            for option, conditions in getattr(cls, "option_conditions", {}).items():
                conditions = conditions if isinstance(conditions, list) else [conditions]
                if option not in hyper or any(acts(setting, values) for setting, values in conditions):
                    continue
                try:
                    differs = bool(hyper[option] != _parameters(cls)[option].default)
                except (TypeError, ValueError):  # e.g. an array, compared elementwise
                    differs = True
                if differs:
                    where = " or ".join(f"{setting} given" if values == "given" else f"{setting} in {list(values)}"
                                        for setting, values in conditions)
                    has = ", ".join(f"{setting}={settings.get(setting)!r}" for setting, _ in conditions)
                    raise ValueError(f"{option}={hyper[option]!r} acts only with {where}; this run has {has}, "
                                     "where it would be ignored: leave it out")

    def _encoder_defaults(self, likelihood, hyper):
        """
        Overdispersed counts (NB, ZINB) get scVI's batch-normalised MLP encoder
        (docs/results/single_cell.rst: higher cell-type accuracy and heldout
        likelihood on CITE-seq; with the Poisson, training was noisier and both
        were lower), unless the encoder is a conv net or the prior encodes
        pseudo-inputs with it.
        """
        latent_prior = hyper.get("latent_prior", self.latent_prior)
        prior_class = LATENT_PRIORS.get(latent_prior) if isinstance(latent_prior, str) else None
        if (likelihood not in BATCH_NORM_LIKELIHOODS or "batch_norm" in hyper or hyper.get("decoder") == "conv"
                or getattr(prior_class, "encodes_inputs", False)):
            return hyper
        return {**hyper, "batch_norm": True}

    def defaults(self, hyper):
        """
        The value of every option ``hyper`` leaves out: the registry's priors,
        the model's ``prior_defaults`` for the latent prior in use and the
        constructors' defaults, routed as :meth:`build` routes options (the
        model's, then the priors', then the guide's).  A model file records them
        beside the user's, so it loads as it was trained after a default changes.
        """
        latent_prior = hyper.get("latent_prior", self.latent_prior)
        mask_prior = hyper.get("mask_prior", self.mask_prior)
        classes = self._option_classes(hyper)
        defaults = {"latent_prior": self.latent_prior}
        if self.mask_prior is not None:
            defaults["mask_prior"] = self.mask_prior
        if isinstance(latent_prior, str):
            defaults.update(self.prior_defaults.get(latent_prior, {}))
        for name in self.option_names(latent_prior, mask_prior):
            owner = next((cls for cls in classes if name in _parameters(cls)), None)
            default = inspect.Parameter.empty if owner is None else _parameters(owner)[name].default
            if name not in defaults and default is not inspect.Parameter.empty:
                defaults[name] = default
        return {k: v for k, v in defaults.items() if k not in hyper}

    def former_defaults(self, hyper):
        """
        The options a file written before they existed leaves out, with the
        value it was trained under: each class's ``former_defaults``.
        """
        former = {}
        for cls in self._option_classes(hyper):
            former.update(getattr(cls, "former_defaults", {}))
        return {k: v for k, v in former.items() if k not in hyper}

    def _option_classes(self, hyper):
        """The classes whose constructors take ``hyper``'s options: the model, the named priors, their guide."""
        latent_prior = hyper.get("latent_prior", self.latent_prior)
        mask_prior = hyper.get("mask_prior", self.mask_prior)
        latent_class = LATENT_PRIORS[latent_prior] if isinstance(latent_prior, str) else None
        mask_class = MASK_PRIORS[mask_prior] if self.mask_prior is not None and isinstance(mask_prior, str) else None
        # A user's latent distribution picks its guide only when built: its guide's defaults stay unrecorded.
        guide_class = GUIDES[latent_class.guide_family] if latent_class is not None else None
        return [cls for cls in (self.model, latent_class, mask_class, guide_class) if cls is not None]

    # ------------------------------------------------------------ assembly

    def build(self, summary, latent_dim, likelihood, hyper, covariates=None, feature_names=None):
        """
        Model, guide and ELBO for resolved hyperparameters (see :meth:`resolve`),
        the training data's :class:`~pyro_sparse.data.DataSummary`, its
        :class:`~pyro_sparse.data.covariates.CovariateSpec` (``None``: no covariates)
        and its feature names (``None``: unnamed).
        """
        layout = {"covariate_dim": 0, "num_batches": 1} if covariates is None else {
            "covariate_dim": covariates.width, "num_batches": covariates.num_batches}
        num_features = summary.num_features
        latent_prior = build_latent_prior(hyper.get("latent_prior", self.latent_prior), num_features, latent_dim,
                                          hyper)
        priors = {"latent_prior": latent_prior}
        if self.mask_prior is not None:
            mask_prior = hyper.get("mask_prior", self.mask_prior)
            priors["mask_prior"] = build_mask_prior(mask_prior, num_features, latent_dim, hyper, feature_names)
        model_parameters = _parameters(self.model)
        model = self.model(
            num_features, latent_dim=latent_dim, likelihood=likelihood, **priors, **layout,
            **{k: v for k, v in hyper.items() if k in model_parameters and k not in PRIOR_ARGUMENTS},
        )
        _check_model_interface(model)
        guide = self._guide(model, latent_prior, summary, likelihood, hyper, layout["covariate_dim"])
        latent_prior.attach_guide(guide)
        for name, prior in model.site_priors.items():
            initialize = getattr(prior, "initialize", None)  # a prior may choose its site's starting point
            if initialize is not None:
                initialize(guide.unconstrained[name])
        if likelihood == "gaussian":
            _standardise(model, guide, summary)
        elif likelihood in COUNT_LIKELIHOODS:
            _start_at_mean_proportions(model, summary)
            _start_latent_library(model, guide, summary)
        return model, guide, self.elbo()

    def _guide(self, model, latent_prior, summary, likelihood, hyper, covariate_dim):
        family = guide_family(latent_prior)
        guide_class = GUIDES[family]
        guide_parameters = _parameters(guide_class)
        model_parameters = _parameters(self.model)
        prior_parameters = set(_parameters(type(latent_prior)))
        other_guides = {p for g in GUIDES.values() for p in _parameters(g)} - set(guide_parameters) - _SUPPLIED
        stray = sorted(other_guides.intersection(hyper) - set(model_parameters) - prior_parameters)
        if stray:
            raise TypeError(f"hyperparameter(s) {stray} do not apply: latent_prior pairs with the {family!r} guide")
        return guide_class(
            summary.num_features,
            model.latent_dim,
            hidden_dims=model.hidden_dims if hyper.get("encoder_hidden_dims") is None else hyper["encoder_hidden_dims"],
            point_estimates={**model.point_estimate_sites(summary.feature_variances),
                             **latent_prior.point_estimate_sites()},
            log1p_input=likelihood == "multinomial" or likelihood in COUNT_LIKELIHOODS,
            covariate_dim=covariate_dim,
            latent_library=model.observation.latent_library,
            **model.guide_options(),
            **latent_prior.guide_options(),
            **{
                k: v for k, v in hyper.items()
                if k in guide_parameters and k not in _SUPPLIED and k not in model_parameters
                and k not in prior_parameters
            },
        )

    def assemble(self, config, device, custom_priors=None):
        """Model, guide and ELBO of a saved configuration; ``custom_priors`` holds the user's prior objects."""
        summary = DataSummary(
            config["num_data"], config["num_features"],
            np.asarray(config["feature_means"]), np.asarray(config["feature_variances"]),
        )
        hyper = {**config["hyperparameters"], **(custom_priors or {})}
        hyper.update(self.former_defaults(hyper))
        covariates = CovariateSpec.from_config(config.get("covariates"))
        model, guide, elbo = self.build(summary, config["latent_dim"], config["likelihood"], hyper, covariates,
                                        config.get("feature_names"))
        # Files written before the precision setting existed were trained in float32.
        set_decoder_precision(model, config["training"].get("precision", "fp32"))
        return model.to(device), guide.to(device), elbo

    # ------------------------------------------------------------ fitting

    def fit(self, name, dataset, latent_dim, settings, hyper, keywords=()):
        """
        Train on ``dataset`` (a validated :class:`~pyro_sparse.data.Dataset`) and
        return a FittedModel.  With ``sparse_restart=n`` (SSL mask priors;
        ``True`` is 1) fit n + 1 times: each fit after the first starts W on
        the previous fit's ``restart_support`` and the last is the one
        returned; its history keeps the earlier fits' per-epoch training
        losses, in order, as ``earlier_fits_train_loss``.  ``keywords``: the
        caller's own argument names, offered where an option misspells one.
        """
        self.check_options(name, hyper, keywords)
        if hyper.get("sparse_restart") and settings.checkpointing.resume_from is not None:
            raise ValueError("sparse_restart fits more than once and cannot resume from a checkpoint: fit again "
                             "without resume_from, or resume a fit made without sparse_restart")
        fitted = self._fit_once(name, dataset, latent_dim, settings, hyper)  # the prior checks sparse_restart
        if hyper.get("sparse_restart"):
            prior = next(p for p in fitted.model.site_priors.values() if hasattr(p, "restart_support"))
            earlier = []
            for _ in range(prior.sparse_restart):
                earlier.append(list(fitted.history_["train_loss"]))
                fitted = self._fit_once(name, dataset, latent_dim, settings,
                                        {**hyper, "initial_support": prior.restart_support(fitted.W_)})
            fitted.history_["earlier_fits_train_loss"] = earlier
        if "W" in fitted.guide.unconstrained and fitted.active_factors_.size == 0:
            warnings.warn(
                "every entry of W is 0 at the end of training: the decoder reads no factor, so the codes carry "
                "nothing and top_features is empty.  The mask prior's penalty outweighed what the data gave each "
                "factor in this many steps: train longer (the penalty ramps in with the KL warm-up), or weaken "
                "the penalty (lambda0 for the SSL prior)", stacklevel=3)
        return fitted

    def _fit_once(self, name, dataset, latent_dim, settings, hyper):
        # Before any work.
        check_library_source(dataset.likelihood, hyper.get("library") == "latent", dataset.library is not None)
        device = resolve_device(settings.device)
        if settings.hardware.strategy == "ddp":
            device = distributed.init_process_group(device)
        check_precision(settings.hardware.precision, device)
        pyro.set_rng_seed(settings.seed)
        generator = torch.Generator().manual_seed(settings.seed)
        train_data, validation_data = dataset.split(settings.schedule.validation_fraction, generator)
        check_training_data(train_data.summary, dataset.likelihood)
        _warn_batch_size(settings.batch_size, train_data.num_data)
        hyper = self.resolve(train_data.summary, dataset.likelihood, hyper, dataset.feature_names)
        hyper = {**self.defaults(hyper), **hyper}
        hyper.setdefault("encoder_hidden_dims", hyper.get("hidden_dims"))  # recorded: the widths the encoder gets
        custom_priors = {k: hyper[k] for k in PRIOR_ARGUMENTS if k in hyper and not isinstance(hyper[k], str)}
        config = self._config(name, dataset, train_data, latent_dim, hyper, custom_priors, settings)
        model, guide, elbo = self.assemble(config, device, custom_priors)
        config["schedule"] = _place_schedules(model, guide, settings)
        elbo = self._check_before_training(name, model, guide, elbo, train_data, settings, device)
        return self._run(config, model, guide, elbo, train_data, validation_data, settings, device, generator)

    def _config(self, name, dataset, train_data, latent_dim, hyper, custom_priors, settings):
        summary = train_data.summary
        config = {
            "model": name,
            "num_features": summary.num_features,
            "latent_dim": int(latent_dim),
            "likelihood": dataset.likelihood,
            "num_data": summary.num_data,
            "feature_means": summary.feature_means.tolist(),
            "feature_variances": summary.feature_variances.tolist(),
            "feature_names": dataset.feature_names,
            "layer": dataset.layer,
            "registration": getattr(dataset, "registration", None),
            "covariates": None if dataset.spec is None else dataset.spec.to_config(),
            "hyperparameters": {
                k: _custom_label(v) if k in custom_priors else _jsonable(v) for k, v in hyper.items()
            },
            # What a file can record of a user's prior object: enough to tell at load whether it is passed again.
            "custom_priors": {k: fingerprint(v) for k, v in hyper.items() if k in custom_priors},
            # The global batch is sliced across the processes: a resumed run
            # must have as many to continue the same sequence of steps.
            "training": {**settings.record(), "processes": distributed.num_processes()
                         if settings.hardware.strategy == "ddp" else 1},
        }
        json.dumps(config)  # fail now, not after training, if a setting cannot be saved
        return config

    def _check_before_training(self, name, model, guide, elbo, train_data, settings, device):
        """Warnings and checks that need the built model; returns the ELBO to train with."""
        K, G = model.latent_dim, train_data.num_features
        # Dense Gaussian codes beyond G dimensions only add unidentifiable
        # directions that collapse to the prior; sparse codes may be overcomplete.
        if K > G and not model.latent_prior.sparse_codes:
            warnings.warn(
                f"latent_dim={K} exceeds the {G} features: {name!r} has dense Gaussian codes and cannot use more "
                f"than {G} dimensions (the rest collapse to the prior and cost time); lower latent_dim, or use "
                "sparse codes (e.g. latent_prior='spike_slab')",
                stacklevel=4,
            )
        if getattr(model, "linear_generator", None) is not None and K > train_data.num_data:
            warnings.warn(
                f"a dictionary of latent_dim={K} atoms is larger than the {train_data.num_data} training points "
                "can support (an atom is learned from the points that use it); use more data or fewer atoms",
                stacklevel=4,
            )
        global_lr = settings.optimization.global_lr
        if global_lr is not None and not guide.unconstrained \
                and global_lr != self.training_defaults.get("optimization", Optimization()).global_lr:
            raise ValueError(f"global_lr={global_lr!r} sets the learning rate of point-estimated global sites (a mask "
                             f"W, a linear dictionary, noise variances), and this {name!r} model has none: leave it "
                             "out of Optimization")
        _log_kl_terms(model, guide, train_data, device)
        precision = settings.hardware.precision
        if precision == "bf16" and set_decoder_precision(model, precision) == 0:
            warnings.warn(
                f"precision='bf16' changes nothing here: this {name!r} model has no decoder network that runs in "
                "bfloat16 (e.g. decoder='linear'); it trains in float32",
                stacklevel=4,
            )
        optimization = settings.optimization
        check_step_memory(model, min(settings.batch_size, train_data.num_data) * optimization.num_particles, device)
        if optimization.num_particles > 1 or optimization.particle_reduction == "max":
            return MaxParticleELBO(
                num_particles=optimization.num_particles,
                particle_reduction=optimization.particle_reduction,
                vectorize_particles=getattr(model, "vectorized_particles", True),
            )
        return elbo

    def _run(self, config, model, guide, elbo, train_data, validation_data, settings, device, generator):
        policy = settings.checkpointing
        run_config = config
        if policy.path is not None or policy.resume_from is not None:
            # A checkpoint records the data's fingerprint, so that a resume on other data is refused.
            hasher = hashlib.sha256()
            for data in (train_data, validation_data):
                if data is not None:
                    data.add_to_hash(hasher)
            run_config = {**config, "data_fingerprint": hasher.hexdigest()}
        resume = None if policy.resume_from is None else checkpoints.load(policy.resume_from, run_config)
        checkpoint = None
        if policy.path is not None and distributed.is_main_process():
            checkpoint = checkpoints.Checkpointer(policy.path, policy.every, run_config)
        strategy = None
        if settings.hardware.strategy == "ddp":
            strategy = distributed.DataParallel(model, guide, elbo)
        try:
            with tf32_matmuls(settings.hardware.precision):
                history = fit(model, guide, elbo, train_data, validation_data=validation_data, settings=settings,
                              device=device, generator=generator, checkpoint=checkpoint, resume=resume,
                              strategy=strategy)
        except TrainingDivergedError as error:
            error.fitted = FittedModel(config, model, guide, error.history)
            raise
        return FittedModel(config, model, guide, history)

    # ------------------------------------------------------------ files

    def load(self, path, config, states, history, device, priors):
        """A FittedModel from a model file's configuration and tensors; ``priors`` as given to ``load``."""
        custom_priors = _custom_priors(path, config, priors)
        device = resolve_device(device)  # outside the try: a bad device is the caller's, not the file's
        try:  # on the CPU: an error moving to the device (out of memory, say) is not the file's either
            model, guide, _ = self.assemble(config, torch.device("cpu"), custom_priors)
            model.load_state_dict(states["model"])
            guide.load_state_dict(states["guide"])
        except (KeyError, TypeError, ValueError, RuntimeError) as error:
            raise serialization.ModelFileError(f"{path!r} does not match the model it describes: {error}") from None
        # Training never saves such a model (a divergence keeps the last good epoch): an altered file.
        broken = [f"{part}.{name}" for part, module in (("model", model), ("guide", guide))
                  for name, value in [*module.named_parameters(), *module.named_buffers()]
                  if value.is_floating_point() and (torch.isnan(value).any() or isinstance(value, torch.nn.Parameter)
                                                    and not torch.isfinite(value).all())]
        if broken:
            raise serialization.ModelFileError(f"{path!r} holds NaN or infinite parameters ({', '.join(broken)}); "
                                               "it was altered or damaged: refit, or load an earlier copy")
        model.to(device)
        guide.to(device)
        if config["training"].get("precision") == "bf16":
            try:
                check_precision("bf16", device)
            except ValueError as error:  # a bf16 fit loaded on a GPU without bfloat16 arithmetic
                warnings.warn(f"{path!r} was trained with a bfloat16 decoder, which this device cannot run ({error}); "
                              "its decoder is evaluated in float32", stacklevel=3)
                set_decoder_precision(model, "fp32")
        model.eval()
        guide.eval()
        return FittedModel(config, model, guide, history)


def _custom_priors(path, config, priors):
    """The user's prior objects a file needs back (it records them by name only)."""
    custom = {}
    for argument, value in priors.items():
        recorded = config.get("hyperparameters", {}).get(argument)
        is_custom = isinstance(recorded, str) and recorded.startswith(_CUSTOM)
        if value is not None and not is_custom:
            raise ValueError(f"{path!r} was not trained with a user-defined {argument}; load it without {argument}=")
        if is_custom:
            if value is None:
                raise ValueError(
                    f"{path!r} was trained with a user-defined {argument} ({recorded[len(_CUSTOM):]}), which a "
                    f"model file cannot hold; pass the same object again: load(path, {argument}=...)"
                )
            if not (isinstance(value, Distribution) or callable(value)):
                raise TypeError(f"{argument} must be a Pyro distribution or a factory, got {value!r}")
            recorded_print = config.get("custom_priors", {}).get(argument)  # files of 2026-11-29 on
            if (_custom_label(value) != recorded if recorded_print is None else fingerprint(value) != recorded_print):
                warnings.warn(
                    f"{path!r} was trained with a user-defined {argument} ({recorded[len(_CUSTOM):]}); the "
                    f"{type(value).__name__} passed differs from it (its class or parameters): the model is evaluated "
                    "with the one passed, so its likelihoods and KL are not those of the fit", stacklevel=3
                )
            custom[argument] = value
    return custom


def _standardise(model, guide, summary):
    """Networks see standardised features; the likelihood stays in data units."""
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


def _start_at_mean_proportions(model, summary):
    """Count decoders give log rates per unit of library: start them at each feature's share of the mean library."""
    output_affine = getattr(getattr(model, "decoder", None), "output_affine", None)
    if output_affine is None:
        return
    means = np.asarray(summary.feature_means, dtype=np.float64)
    floor = means[means > 0].min() / 10 if np.any(means > 0) else 1.0
    proportions = np.maximum(means, floor) / means.sum() if means.sum() > 0 else np.full_like(means, 1 / len(means))
    output_affine.set(np.log(proportions), np.ones_like(means))


def _start_latent_library(model, guide, summary):
    """A latent library's prior and posterior means start at the log of the mean library (Σ_g of the feature means)."""
    total = float(np.sum(summary.feature_means))
    if model.observation.latent_library and total > 0:
        model.observation.start_library(math.log(total))
        guide.start_library(math.log(total))


def _warn_batch_size(batch_size, num_data):
    if batch_size > num_data:
        warnings.warn(
            f"batch_size={batch_size} is larger than the {num_data} training points; "
            f"each step uses all of them (batch_size={num_data})",
            stacklevel=4,
        )


def _place_schedules(model, guide, settings):
    """
    Let the model and guide place their schedules in epochs (``check_schedule``)
    and record them: ``epochs``, the epochs each placed, and ``options``, the
    hyperparameters that only place them as fractions of ``max_epochs``.  A
    resumed run may change ``max_epochs`` and those options, not the epochs.
    """
    placed = {"epochs": {}, "options": []}
    if 0 < settings.max_epochs <= settings.warmup_epochs:
        warnings.warn(
            f"the KL warm-up lasts {settings.warmup_epochs:g} epochs, not less than max_epochs={settings.max_epochs}: "
            "training ends before the objective is the ELBO (the codes' KL and the priors' proximal steps never reach "
            "full weight); lower kl_warmup_epochs or train longer",
            stacklevel=4,
        )
    # Every module that places a schedule (a prior inside the model too, e.g. the SSL's λ0 path).
    for module in (*model.modules(), *guide.modules()):
        check_schedule = getattr(module, "check_schedule", None)
        if check_schedule is not None:
            placed["epochs"].update(check_schedule(settings.warmup_epochs, settings.max_epochs) or {})
            placed["options"] += list(getattr(module, "schedule_options", ()))
    return placed


def _log_kl_terms(model, guide, data, device):
    """Say, once per fit, how each local latent's KL term is computed (closed form or Monte Carlo)."""
    batch = next(iter(data.minibatches(2, device=device, shuffle=False)))
    # A trace draws random numbers, and in training mode updates batch-norm statistics;
    # the fit must not depend on whether it ran.
    with evaluation_mode(model, guide), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        terms = kl_terms(model, guide, batch.x, **batch.kwargs)
    for term in terms:
        logger.info(term.describe())
        if not term.closed_form and getattr(guide, "spike_estimator", None) == "relaxed":
            warnings.warn(
                f"{term.describe()}; relaxed spike-and-slab draws are never exactly 0, so that estimate scores "
                "them by the slab alone: pass spike_estimator='straight_through' for exact draws",
                stacklevel=5,
            )

