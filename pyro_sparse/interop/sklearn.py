"""
scikit-learn estimators over :func:`pyro_sparse.train`.

Each class is a thin front for one registered model: ``fit`` calls
``train(model=NAME, data=X, seed=..., **parameters)`` and keeps the
:class:`~pyro_sparse.fitted.FittedModel` it returns in ``fitted_``; every other
method reads from it.  So an estimator and ``train`` fit exactly the same
model, and anything the fitted model offers beyond the scikit-learn interface
(``spike_probabilities``, ``top_features``, ``to_arviz``, ...) is one
attribute away::

    from sklearn.model_selection import GridSearchCV
    search = GridSearchCV(SparseVAE(latent_dim=5, max_epochs=50), {"lambda0": [1.0, 10.0]}, cv=3)
    search.fit(X)                       # picks the λ0 with the best held-out log-likelihood
    codes = search.best_estimator_.transform(X)
    search.best_estimator_.fitted_.top_features(3)

Conventions, as scikit-learn's:

* The constructor stores its arguments and nothing else; they are checked
  when ``fit`` runs.  Each class lists the hyperparameters most often tuned
  (defaults: the model's own) and the main training settings (defaults:
  ``train``'s, except ``progress=False`` and ``random_state=None``);
  everything else ``train`` accepts for the model goes in ``model_options``,
  a dict forwarded to it unchanged, config objects included, e.g.
  ``model_options={"noise_nu": 5, "schedule": Schedule(early_stopping=10,
  validation_fraction=0.1), "hardware": Hardware(precision="bf16")}``.
* ``random_state`` is an int (the ``seed`` of ``train``: same int, same fit
  on the same device), ``None`` or a ``numpy.random.RandomState`` (a seed is
  drawn from it).  ``n_init`` fits with seeds ``seed, seed + 1, ...`` and keeps
  the one of lowest training loss at the end, or, with a validation split
  (each seed draws its own), of lowest -ELBO of the data on all of X; with ``n_init > 1``,
  ``factor_stability_`` says whether those fits found the same factors
  (:func:`~pyro_sparse.evaluation.factor_stability`: matched ``|corr|`` of their
  codes on the training data and Jaccard of their supports).  Note that ``train`` seeds the global random number
  generators of ``random``, numpy and torch.
* Learned attributes end in an underscore and raise
  :class:`~sklearn.exceptions.NotFittedError` before ``fit``.
* ``score(X)`` is the mean importance-weighted log-likelihood per data point
  (higher is better), so model selection maximises it.

How many factors: :func:`choose_latent_dim` fits an estimator with ``n_init``
seeds at each candidate ``latent_dim`` and keeps the largest one whose fits
agree (seed stability, as consensus NMF chooses its rank), since a likelihood
keeps improving with spare factors that differ from seed to seed::

    choice = choose_latent_dim(SparseVAE(n_init=3, random_state=0), X, candidates=range(4, 11))
    choice.latent_dim, choice.table      # the chosen K; per K its stability, active factors, loss
    choice.estimator.transform(X)        # the kept fit at the chosen K

Non-negative matrix factorisation is scikit-learn's own
:class:`sklearn.decomposition.NMF`; ``train("nmf", ...)`` gives it the
likelihood-based evaluation of the other models.
"""

import inspect
import math
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
import torch
from joblib import Parallel, delayed
from sklearn.base import (
    BaseEstimator,
    ClassNamePrefixFeaturesOutMixin,
    TransformerMixin,
    clone,
)
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from pyro_sparse import registry
from pyro_sparse.api import train
from pyro_sparse.evaluation.stability import factor_stability
from pyro_sparse.io.anndata import is_anndata

# train()'s own arguments that the estimator sets from fit's arguments.
_SET_BY_FIT = ("model", "data", "seed")
# train()'s own arguments (not the model's hyperparameters).
_TRAIN_ARGUMENTS = set(inspect.signature(train).parameters)


def _seed(random_state):
    """``train``'s integer seed from a scikit-learn ``random_state``."""
    if isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool):
        return int(random_state)
    return int(check_random_state(random_state).randint(np.iinfo(np.int32).max))


def _named(X, names):
    """Validated X with the DataFrame column names fit was given: ``train`` reads them (e.g. for gene sets)."""
    if names is None:
        return X
    import pandas  # names come only from a DataFrame: pandas is installed

    columns = [str(name) for name in names]
    return pandas.DataFrame.sparse.from_spmatrix(X, columns=columns) if sp.issparse(X) else pandas.DataFrame(
        X, columns=columns)


def _kept_loss(fitted, X):
    """
    The loss per point by which the ``n_init`` fits are ranked: a fit's last
    epoch's training loss (-ELBO), or, when it held out a validation split,
    minus its data points' ELBO on all of X (one importance sample, common
    draws; without the global priors' terms), since each seed draws its own
    split and the fits' training losses are then taken on different rows.
    NaN (a fit whose bound is not finite) ranks last.
    """
    if not fitted.config["training"].get("validation_fraction"):
        loss = fitted.history_["train_loss"][-1]
    else:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            loss = -float(np.mean(fitted.heldout_log_likelihood(X, num_samples=1)))
    return math.inf if math.isnan(loss) else loss


def _fitted_property(name, doc):
    """A learned attribute read from the fitted model, NotFittedError before ``fit``."""

    def get(self):
        check_is_fitted(self)
        return getattr(self.fitted_, name)

    return property(get, doc=doc)


class SVIEstimator(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """
    Base class: a registered model (``_model_name``) fitted by
    :func:`pyro_sparse.train`.  Subclasses only declare their parameters in
    ``__init__`` (scikit-learn reads them from its signature) and the learned
    attributes their model has.
    """

    _model_name = None

    history_ = _fitted_property("history_", "Training history: per-epoch losses and what the loop recorded.")
    active_factors_ = _fitted_property(
        "active_factors_", "Indices of the factors the decoder uses (all K without a decoder mask)."
    )

    def __sklearn_is_fitted__(self):
        # Not any attribute ending in "_": validation sets n_features_in_ before training.
        return "fitted_" in vars(self)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True  # train() densifies sparse input one minibatch at a time
        # The networks compute in float32, so codes are float32 whatever the input's precision.
        tags.transformer_tags.preserves_dtype = ["float32"]
        return tags

    def _validate(self, X, reset):
        if is_anndata(X):
            raise TypeError(
                "the estimators take arrays, sparse matrices or DataFrames, not an AnnData; pass adata.X "
                "(or a layer), or use pyro_sparse.train(model, adata, ...) for layers, covariates and backed files"
            )
        # At least two points: the Gaussian noise prior is calibrated from feature variances.
        return validate_data(
            self, X, reset=reset, accept_sparse=("csr", "csc"), ensure_min_samples=2 if reset else 1
        )

    def fit(self, X, y=None):
        """
        Fit the model to X (N x G; dense or scipy.sparse) with
        :func:`pyro_sparse.train`.  ``y`` is ignored.
        """
        for name in ("fitted_", "init_losses_", "factor_stability_"):  # a failed refit must not leave the fit before
            vars(self).pop(name, None)
        X = self._validate(X, reset=True)
        parameters = self.get_params(deep=False)
        options = dict(parameters.pop("model_options") or {})
        repeated = sorted(set(options) & (set(parameters) | set(_SET_BY_FIT)))
        random_state = parameters.pop("random_state")
        n_init = parameters.pop("n_init")
        if not (isinstance(n_init, (int, np.integer)) and not isinstance(n_init, bool) and n_init >= 1):
            raise ValueError(f"n_init must be a positive integer, got {n_init!r}")
        if repeated:
            raise ValueError(
                f"model_options sets {repeated}, which {type(self).__name__} sets itself; "
                "pass them as constructor parameters (the seed as random_state) instead"
            )
        # A prior's hyperparameter at its default does not apply to another
        # prior (lambda0 with mask_prior="horseshoe"): leave it out.
        chosen = {**parameters, **options}
        applies = registry.get_entry(self._model_name).option_names(chosen.get("latent_prior"), chosen.get("mask_prior"))
        defaults = inspect.signature(type(self).__init__).parameters
        parameters = {
            k: v for k, v in parameters.items()
            if k in applies or k in _TRAIN_ARGUMENTS or v != defaults[k].default
        }
        checkpointing = options.get("checkpointing")
        if n_init > 1 and (getattr(checkpointing, "path", None) or getattr(checkpointing, "resume_from", None)):
            raise ValueError(
                f"n_init={n_init} fits would write (or resume) one checkpoint file; checkpoint with n_init=1, "
                "one estimator per seed (random_state=seed, seed + 1, ...)"
            )
        seed = _seed(random_state)
        if seed + n_init > 2**32:
            raise ValueError(f"random_state={seed} with n_init={n_init} needs seeds up to {seed + n_init - 1}; "
                             "seeds are integers in [0, 2**32)")
        data = _named(X, getattr(self, "feature_names_in_", None))
        fits = [train(model=self._model_name, data=data, seed=seed + i, **parameters, **options)
                for i in range(n_init)]
        # The fit of lowest -ELBO per point, as KMeans keeps its best of n_init; all attributes or none.
        if n_init == 1:
            self.fitted_ = fits[0]
            return self
        losses = [_kept_loss(fitted, data) for fitted in fits]
        stability = factor_stability(fits, X)
        self.fitted_ = fits[int(np.argmin(losses))]
        self.init_losses_ = np.asarray(losses)
        self.factor_stability_ = stability
        return self

    def transform(self, X):
        """Codes of X, (N, latent_dim): the posterior mode (see :meth:`~pyro_sparse.fitted.FittedModel.transform`)."""
        check_is_fitted(self)
        return self.fitted_.transform(self._validate(X, reset=False))

    def reconstruct(self, X):
        """E[x | z = E_q[z | x]], (N, G)."""
        check_is_fitted(self)
        return self.fitted_.reconstruct(self._validate(X, reset=False))

    def score(self, X, y=None):
        """
        Mean importance-weighted estimate of log p(x) per data point of X
        (100 draws each; higher is better); ``y`` is ignored.  Per-point
        values: ``fitted_.heldout_log_likelihood(X)``.
        """
        check_is_fitted(self)
        X = self._validate(X, reset=False)
        # Draws seeded by the fit's seed: scoring is repeatable, and candidates
        # in a model search are compared on common random numbers.
        with torch.random.fork_rng():
            torch.manual_seed(self.fitted_.config["training"]["seed"])
            return float(np.mean(self.fitted_.heldout_log_likelihood(X)))

    def save(self, path):
        """
        Write the fitted model to ``path``; :func:`pyro_sparse.load` reads it
        back as a :class:`~pyro_sparse.fitted.FittedModel` without running code
        from the file, on any device (pickle/joblib keep the whole estimator,
        but loading a pickle runs code, and one of a model fitted on CUDA needs
        CUDA to load).
        """
        check_is_fitted(self)
        self.fitted_.save(path)

    @property
    def _n_features_out(self):
        # Names the output columns (sparsevae0, sparsevae1, ...) for get_feature_names_out.
        check_is_fitted(self)
        return self.fitted_.config["latent_dim"]


_W_DOC = "The decoder mask W: see the model's ``FittedModel.W_``."


class SparseVAE(SVIEstimator):
    """
    Sparse VAE of Moran et al. (2022) (model ``ssl_dgm``): a Spike-and-Slab
    Lasso prior on the per-feature decoder mask W.

    Parameters are those of :func:`pyro_sparse.train` for ``ssl_dgm``
    (``hidden_dims=None``: the model's default for the likelihood).  Only
    the hyperparameters most often tuned are listed; the rest of ``train``'s
    arguments for this model (``mask_prior``, ``prior_covariance``, ``noise_nu``,
    the ``optimization`` / ``schedule`` / ... configs) go in ``model_options``,
    a dict forwarded to ``train``.

    Learned attributes: ``fitted_`` (the :class:`~pyro_sparse.fitted.FittedModel`),
    ``W_`` (G, K), ``inclusion_probs_`` (G, K), ``support_`` (G, K), ``eta_`` (K,), ``history_``,
    ``n_features_in_``.
    """

    _model_name = "ssl_dgm"

    W_ = _fitted_property("W_", "The decoder mask W, (G, K); entries in the spike are exactly 0.")
    inclusion_probs_ = _fitted_property("inclusion_probs_", "E[γ_jk | w_jk, η_k] (Eq. 57), (G, K).")
    support_ = _fitted_property("support_", "Estimated support of W, (G, K): non-zero entries with E[γ_jk] > 0.5.")
    eta_ = _fitted_property("eta_", "η_k, the share of features each factor is expected to use, (K,).")

    def __init__(
        self,
        latent_dim=5,
        *,
        hidden_dims=None,
        lambda0=10.0,
        lambda1=1.0,
        a=1.0,
        b=None,
        beta=1.0,
        likelihood="gaussian",
        max_epochs=200,
        batch_size=100,
        lr=None,
        random_state=None,
        n_init=1,
        device="auto",
        progress=False,
        model_options=None,
    ):
        self.latent_dim = latent_dim
        self.hidden_dims = hidden_dims
        self.lambda0 = lambda0
        self.lambda1 = lambda1
        self.a = a
        self.b = b
        self.beta = beta
        self.likelihood = likelihood
        self.max_epochs = max_epochs
        self.batch_size = batch_size
        self.lr = lr
        self.random_state = random_state
        self.n_init = n_init
        self.device = device
        self.progress = progress
        self.model_options = model_options


class VAE(SVIEstimator):
    """
    VAE / β-VAE with a dense decoder (model ``vae``), the sparse VAE's
    baseline.

    Only the hyperparameters most often tuned are listed; the rest of
    ``train``'s arguments for this model go in ``model_options``, a dict
    forwarded to ``train``.

    Learned attributes: ``fitted_``, ``history_``, ``n_features_in_``.
    """

    _model_name = "vae"

    def __init__(
        self,
        latent_dim=5,
        *,
        hidden_dims=(50, 50, 50),
        beta=1.0,
        noise="global",
        likelihood="gaussian",
        max_epochs=200,
        batch_size=100,
        lr=None,
        random_state=None,
        n_init=1,
        device="auto",
        progress=False,
        model_options=None,
    ):
        self.latent_dim = latent_dim
        self.hidden_dims = hidden_dims
        self.beta = beta
        self.noise = noise
        self.likelihood = likelihood
        self.max_epochs = max_epochs
        self.batch_size = batch_size
        self.lr = lr
        self.random_state = random_state
        self.n_init = n_init
        self.device = device
        self.progress = progress
        self.model_options = model_options


class VSC(SVIEstimator):
    """
    Variational sparse coding (model ``vsc``; Tonolini et al. 2019/2020):
    spike-and-slab codes, exactly 0 where the spike is more probable.

    Only the hyperparameters most often tuned are listed; the rest of
    ``train``'s arguments for this model, including those of the latent
    prior (``alpha``, ``num_pseudo_inputs``, ...) and of its guide
    (``pretrain_epochs``, ``spike_estimator``, ...), go in ``model_options``,
    a dict forwarded to ``train``: e.g. ``VSC(model_options={"alpha": 0.1})``.
    ``fitted_.spike_probabilities(X)`` gives the
    codes' γ.

    Learned attributes: ``fitted_``, ``history_``, ``n_features_in_``.
    """

    _model_name = "vsc"

    def __init__(
        self,
        latent_dim=5,
        *,
        hidden_dims=(400,),
        beta=1.0,
        latent_prior="spike_slab",
        decoder="mlp",
        likelihood="gaussian",
        max_epochs=200,
        batch_size=100,
        lr=None,
        random_state=None,
        n_init=1,
        device="auto",
        progress=False,
        model_options=None,
    ):
        self.latent_dim = latent_dim
        self.hidden_dims = hidden_dims
        self.beta = beta
        self.latent_prior = latent_prior
        self.decoder = decoder
        self.likelihood = likelihood
        self.max_epochs = max_epochs
        self.batch_size = batch_size
        self.lr = lr
        self.random_state = random_state
        self.n_init = n_init
        self.device = device
        self.progress = progress
        self.model_options = model_options


class ThresholdedVSC(SVIEstimator):
    """
    Thresholded variational sparse coding (model ``tvsc``; Fallah & Rozell
    2022): soft-thresholded Laplace or Gaussian codes.

    Only the hyperparameters most often tuned are listed; the rest of
    ``train``'s arguments for this model, including those of the latent
    prior (``threshold``, ``learn_threshold``, ``prior_scale``, ...), go in
    ``model_options``, a dict forwarded to ``train``: e.g.
    ``ThresholdedVSC(latent_prior="thresholded_normal", model_options={"learn_threshold": True})``.

    Learned attributes: ``fitted_``, ``history_``, ``n_features_in_``.
    """

    _model_name = "tvsc"

    def __init__(
        self,
        latent_dim=5,
        *,
        hidden_dims=None,
        latent_prior="thresholded_laplace",
        beta=1.0,
        decoder="mlp",
        likelihood="gaussian",
        max_epochs=200,
        batch_size=100,
        lr=None,
        random_state=None,
        n_init=1,
        device="auto",
        progress=False,
        model_options=None,
    ):
        self.latent_dim = latent_dim
        self.hidden_dims = hidden_dims
        self.latent_prior = latent_prior
        self.beta = beta
        self.decoder = decoder
        self.likelihood = likelihood
        self.max_epochs = max_epochs
        self.batch_size = batch_size
        self.lr = lr
        self.random_state = random_state
        self.n_init = n_init
        self.device = device
        self.progress = progress
        self.model_options = model_options


class OIVAE(SVIEstimator):
    """
    Output-interpretable VAE (model ``oi_vae``; Ainsworth et al. 2018): a
    group-lasso map from the codes to each feature group, one generator per
    group.

    Only the hyperparameters most often tuned are listed; the rest of
    ``train``'s arguments for this model go in ``model_options``, a dict
    forwarded to ``train``.

    Learned attributes: ``fitted_``, ``W_`` (groups, K, p), ``history_``,
    ``n_features_in_``.
    """

    _model_name = "oi_vae"

    W_ = _fitted_property("W_", "The latent-to-group maps, (groups, K, p); W_[g, k] is 0 where k does not reach g.")

    def __init__(
        self,
        latent_dim=5,
        *,
        hidden_dims=(50, 50, 50),
        lam=1.0,
        group_input_dim=5,
        groups=None,
        beta=1.0,
        likelihood="gaussian",
        max_epochs=200,
        batch_size=100,
        lr=None,
        random_state=None,
        n_init=1,
        device="auto",
        progress=False,
        model_options=None,
    ):
        self.latent_dim = latent_dim
        self.hidden_dims = hidden_dims
        self.lam = lam
        self.group_input_dim = group_input_dim
        self.groups = groups
        self.beta = beta
        self.likelihood = likelihood
        self.max_epochs = max_epochs
        self.batch_size = batch_size
        self.lr = lr
        self.random_state = random_state
        self.n_init = n_init
        self.device = device
        self.progress = progress
        self.model_options = model_options


class LatentDimChoice(NamedTuple):
    """
    What :func:`choose_latent_dim` found.  ``latent_dim``: the chosen K;
    ``estimator``: the fitted estimator at that K (the kept fit of its
    ``n_init``); ``estimators``: the fitted estimator at every candidate;
    ``table``: one dict per candidate, in the order given, with its
    ``latent_dim``, ``code_stability`` and ``support_jaccard`` (the
    :class:`~pyro_sparse.evaluation.FactorStability` of its ``n_init`` fits),
    ``active_factors`` (of the kept fit) and ``loss`` (what ``n_init`` ranked
    the kept fit by, per point: its training loss, or with a validation split
    minus its data's ELBO on X).
    """

    latent_dim: int
    estimator: SVIEstimator
    estimators: dict
    table: list


def choose_latent_dim(estimator, X, candidates, *, min_stability=0.9, n_jobs=None):
    """
    Choose the number of factors by seed stability.  ``estimator`` (unfitted,
    with ``n_init`` ≥ 2) is cloned and fitted on ``X`` at each ``latent_dim``
    in ``candidates``; the choice is the largest candidate whose ``n_init``
    fits agree with a matched code ``|corr|`` of at least ``min_stability``
    (:func:`~pyro_sparse.evaluation.factor_stability`), or, where none does,
    the most stable one (ties to the larger).  Spare factors beyond those the
    data support are fitted differently from seed to seed, so stability falls
    past the data's number of factors while the training loss keeps falling:
    the loss alone would choose the largest K.  ``n_jobs``: candidates fitted
    in parallel (joblib; ``None`` one at a time).  Returns a :class:`LatentDimChoice`.
    """
    if not isinstance(estimator, SVIEstimator):
        raise TypeError(f"estimator must be one of pyro_sparse's estimators, got {type(estimator).__name__}")
    n_init = estimator.get_params()["n_init"]
    if not (isinstance(n_init, (int, np.integer)) and n_init >= 2):
        raise ValueError(
            f"choose_latent_dim compares each candidate's n_init fits: the estimator needs n_init >= 2 "
            f"(3 or more advised), got {n_init!r}"
        )
    candidates = list(candidates)
    if not candidates or not all(
        isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k >= 1 for k in candidates
    ):
        raise ValueError(f"candidates must be positive integers (latent_dim values), got {candidates!r}")
    if len(set(candidates)) != len(candidates):
        raise ValueError(f"candidates repeat a latent_dim: {candidates!r}")
    if not (isinstance(min_stability, (int, float, np.number)) and not isinstance(min_stability, bool)
            and 0 < min_stability <= 1):
        raise ValueError(f"min_stability is a matched |corr| in (0, 1], got {min_stability!r}")
    fitted = Parallel(n_jobs=n_jobs)(
        delayed(_fitted_clone)(estimator, int(k), X) for k in candidates
    )
    table = [
        {"latent_dim": int(k), "code_stability": e.factor_stability_.code_correlation,
         "support_jaccard": e.factor_stability_.support_jaccard,
         "active_factors": len(e.active_factors_), "loss": float(e.init_losses_.min())}
        for k, e in zip(candidates, fitted)
    ]
    stable = [row for row in table if row["code_stability"] >= min_stability]
    if stable:
        chosen = max(stable, key=lambda row: row["latent_dim"])
    else:
        chosen = max(table, key=lambda row: (row["code_stability"], row["latent_dim"]))
    estimators = {int(k): e for k, e in zip(candidates, fitted)}
    return LatentDimChoice(chosen["latent_dim"], estimators[chosen["latent_dim"]], estimators, table)


def _fitted_clone(estimator, latent_dim, X):
    return clone(estimator).set_params(latent_dim=latent_dim).fit(X)
