"""``train`` and ``load``: the user-facing entry points."""

import json
import logging
import warnings

import numpy as np
import pyro
import torch

from pyro_sparse import anndata_io, checkpoints, distributed, registry, serialization
from pyro_sparse.data import (
    DataError,
    DataSummary,
    as_matrix,
    check_feature_names,
    check_training_data,
    check_units,
    check_values,
    feature_names_of,
    minibatches,
    split,
)
from pyro_sparse.elbo import MaxParticleELBO, kl_terms
from pyro_sparse.evaluation import expected_observation, importance_log_likelihood
from pyro_sparse.likelihoods import check_likelihood
from pyro_sparse.nn import (
    check_precision,
    check_step_memory,
    set_decoder_precision,
    tf32_matmuls,
)
from pyro_sparse.training import TrainingDivergedError, fit

logger = logging.getLogger("pyro_sparse")

def resolve_device(device):
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:<index>', got {device!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was requested but CUDA is not available; use device='auto'")
    return device


class FittedModel:
    """
    A trained model and guide with numpy accessors.  Learned quantities end in
    an underscore (scikit-learn style); ``W_`` and friends exist for models with
    a decoder mask.
    """

    def __init__(self, config, model, guide, history):
        self.config, self.model, self.guide, self.history_ = config, model, guide, history

    @property
    def device(self):
        return next(self.guide.parameters()).device

    @property
    def num_features(self):
        return self.config["num_features"]

    def _check(self, X):
        if anndata_io.is_anndata(X):
            X = anndata_io.evaluation_data(X, self.config)
        check_feature_names(feature_names_of(X), self.config.get("feature_names"))
        matrix = as_matrix(X, name="X")
        if matrix.shape[1] != self.num_features:
            raise DataError(
                f"X has {matrix.shape[1]} features but the model was trained on {self.num_features}"
            )
        check_values(matrix, self.config["likelihood"], name="X")
        if self.config["likelihood"] == "gaussian":
            check_units(matrix, self.guide.input_affine.loc.cpu(), self.guide.input_affine.scale.cpu())
        return matrix

    def _batches(self, X, batch_size=1024):
        return minibatches(self._check(X), batch_size, device=self.device, shuffle=False)

    @torch.no_grad()
    def transform(self, X, kind="mode"):
        """
        Codes of X, shape (N, K): ``kind="mode"`` the posterior mode per
        coordinate (for sparse-latent models exactly 0 where the spike is more
        probable than the slab), ``kind="mean"`` the posterior mean E_q[z | x].
        For Gaussian posteriors the two coincide.
        """
        if kind not in ("mode", "mean"):
            raise ValueError(f"kind must be 'mode' or 'mean', got {kind!r}")
        return np.concatenate(
            [getattr(self.guide.posterior(x), kind).cpu().numpy() for x in self._batches(X)]
        )

    def _gates(self, x):
        posterior = self.guide.posterior(x).base_dist
        if not hasattr(posterior, "gate"):
            raise AttributeError(f"model {self.config['model']!r} has no spike-and-slab codes")
        return posterior.gate

    @torch.no_grad()
    def spike_probabilities(self, X):
        """For spike-and-slab codes, the probability γ_ij that code j of x_i is non-zero, (N, K)."""
        return np.concatenate([self._gates(x).cpu().numpy() for x in self._batches(X)])

    @torch.no_grad()
    def conditional_samples(self, X, num_samples=1):
        """
        Conditional generation of VSC (ICLR version Sec. 5.3): for each x, codes
        drawn from the prior slab N(0, 1) along only the dimensions the
        recognition model activates for x (γ > 0.5), zero elsewhere, decoded
        to E[x | z].  Shape (num_samples, N, G).
        """
        samples = []
        for x in self._batches(X):
            active = self._gates(x) > 0.5
            draws = [
                expected_observation(self.model, self.guide, x, torch.randn_like(active, dtype=x.dtype) * active)
                for _ in range(num_samples)
            ]
            samples.append(torch.stack(draws).cpu().numpy())
        return np.concatenate(samples, axis=1)

    @torch.no_grad()
    def sample_posterior(self, X, num_samples=1):
        """Draws z ~ q(z | x), shape (num_samples, N, K)."""
        return np.concatenate(
            [self.guide.posterior(x).sample((num_samples,)).cpu().numpy() for x in self._batches(X)], axis=1
        )

    def reconstruct(self, X):
        """E[x | z = E_q[z | x]]: means (gaussian), probabilities (bernoulli, multinomial)."""
        return np.concatenate(
            [expected_observation(self.model, self.guide, x).cpu().numpy() for x in self._batches(X)]
        )

    def heldout_log_likelihood(self, X, num_samples=100):
        """Importance-weighted estimate of log p(x_i) per data point (Burda et al. 2016)."""
        if not _is_count(num_samples):
            raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
        return np.concatenate(
            [
                importance_log_likelihood(self.model, self.guide, x, num_samples).cpu().numpy()
                for x in self._batches(X, batch_size=256)
            ]
        )

    def to_arviz(self, X, num_samples=100, feature_names=None):
        """
        Posterior draws, posterior predictive replicates, element-wise
        log-likelihood and the data of X as ArviZ data (InferenceData, or a
        DataTree under arviz >= 1.0); see :func:`pyro_sparse.diagnostics.to_arviz`.
        """
        # Imported here: arviz is slow to import and only these checks need it.
        from pyro_sparse.diagnostics import to_arviz

        return to_arviz(self, X, num_samples=num_samples, feature_names=feature_names)

    def _point(self, name):
        if name not in self.guide.unconstrained:
            raise AttributeError(f"model {self.config['model']!r} has no global site {name!r}")
        return self.guide.point_estimate(name).detach().cpu().numpy()

    @property
    def W_(self):
        """The decoder mask W, (G, K); entries in the spike are exactly 0."""
        return self._point("W")

    @property
    def sigma2_(self):
        """Per-feature noise variances (gaussian likelihood)."""
        return self._point("sigma2")

    @property
    def inclusion_probs_(self):
        """E[γ_jk | w_jk, η_k] (Eq. 57), (G, K)."""
        return self._prior("W").inclusion_probs.cpu().numpy()

    @property
    def eta_(self):
        """η_k, the share of features each factor is expected to use, (K,)."""
        return self._prior("W").eta.cpu().numpy()

    def _prior(self, name):
        if name not in self.model.site_priors:
            raise AttributeError(f"model {self.config['model']!r} has no prior hooks for {name!r}")
        return self.model.site_priors[name]

    def top_features(self, k=5, names=None):
        """
        For each factor, the ``k`` features with the largest |W_jk| that are
        non-zero, named by ``names`` (default: an AnnData's ``var_names`` if
        the model was trained on one, else the feature indices).
        """
        W = np.abs(self.W_)
        names = names if names is not None else self.config.get("feature_names")
        names = list(names) if names is not None else list(range(W.shape[0]))
        if len(names) != W.shape[0]:
            raise ValueError(f"got {len(names)} names for {W.shape[0]} features")
        tops = []
        for column in W.T:
            order = [j for j in np.argsort(-column, kind="stable")[:k] if column[j] > 0]
            tops.append([names[j] for j in order])
        return tops

    def write_to(self, adata, key=None):
        """
        Store the codes in ``adata.obsm["X_<key>"]`` and, where the model has
        them, W and its inclusion probabilities in ``adata.varm``; ``key``
        defaults to the model's name (see :func:`pyro_sparse.anndata_io.write_to`).
        """
        anndata_io.write_to(self, adata, key)

    def set_precision(self, precision):
        """
        Evaluate the decoder in ``"bf16"`` or ``"fp32"`` from now on and return
        this model.  After ``train`` and ``load`` the decoder runs in the
        precision of the fit (bfloat16 after a ``"bf16"`` fit, else float32),
        so evaluation sees the network that was trained; ``set_precision("fp32")``
        gives exact float32 evaluation.  Files keep the precision of the fit
        (``config["training"]["precision"]``), not this setting.
        """
        if precision not in ("fp32", "bf16"):
            raise ValueError(f"the decoder is evaluated in 'fp32' or 'bf16', got {precision!r} ('tf32' is for training)")
        set_decoder_precision(self.model, check_precision(precision, self.device))
        return self

    def history_frame(self):
        """
        ``history_`` as a pandas DataFrame indexed by epoch: the training loss
        (-ELBO per data point) and, when a validation set was held out, the
        validation loss.
        """
        import pandas as pd  # only this method needs pandas

        return pd.DataFrame({k: v for k, v in self.history_.items() if len(v)}).rename_axis("epoch")

    def save(self, path):
        """Write the model to ``path`` (tensors + JSON; see :mod:`pyro_sparse.serialization`)."""
        serialization.write(
            path,
            {**self.config, "history": self.history_},
            {"model": self.model.state_dict(), "guide": self.guide.state_dict()},
        )


def _is_count(value, minimum=1):
    """An integer (not a bool) of at least ``minimum``."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= minimum


def _check_hidden_dims(hidden_dims):
    if isinstance(hidden_dims, (str, bytes)) or not np.iterable(hidden_dims):
        raise TypeError(f"hidden_dims must be a sequence of layer widths, e.g. (50, 50), got {hidden_dims!r}")
    if not all(_is_count(width) for width in hidden_dims):
        raise ValueError(f"hidden_dims must hold positive integer widths, got {tuple(hidden_dims)!r}")


def _jsonable(value):
    """Plain Python values for the JSON configuration (numpy scalars and arrays included)."""
    if isinstance(value, (tuple, list, np.ndarray, torch.Tensor, np.generic)):
        return np.asarray(value).tolist()
    return value


_CUSTOM = "custom:"


def _custom_label(prior):
    """What the JSON configuration records of a user's prior object (it cannot hold the object)."""
    return _CUSTOM + getattr(prior, "__qualname__", type(prior).__qualname__)


def _assemble(config, device, custom_priors=None):
    """Model, guide and ELBO of a configuration; ``custom_priors`` holds the user's prior objects by argument."""
    summary = DataSummary(
        config["num_data"],
        config["num_features"],
        np.asarray(config["feature_means"]),
        np.asarray(config["feature_variances"]),
    )
    hyper = {**config["hyperparameters"], **(custom_priors or {})}
    model, guide, elbo = registry.build(config["model"], summary, config["latent_dim"], config["likelihood"], hyper)
    # Files written before the precision setting existed were trained in float32.
    set_decoder_precision(model, config["training"].get("precision", "fp32"))
    return model.to(device), guide.to(device), elbo


def _log_kl_terms(model, guide, matrix, device):
    """Say, once per fit, how each local latent's KL term is computed (closed form or Monte Carlo)."""
    x = next(iter(minibatches(matrix, 2, device=device, shuffle=False)))
    # A trace draws random numbers; the fit must not depend on whether it ran.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        terms = kl_terms(model, guide, x)
    for term in terms:
        logger.info(term.describe())
        if not term.closed_form and getattr(guide, "spike_estimator", None) == "relaxed":
            warnings.warn(
                f"{term.describe()}; relaxed spike-and-slab draws are never exactly 0, so that estimate scores "
                "them by the slab alone: pass spike_estimator='straight_through' for exact draws",
                stacklevel=3,
            )


def _warn_early_subsampling(start_epoch, warmup_epochs):
    # The codes are pruned to the ones the data need as the KL weight reaches
    # 1; a subsampled decoder, which learns to use them more slowly per step,
    # can drop one too many, and a code whose column of W is exactly zero
    # rarely comes back: at G = 1000, Bernoulli, |S| = 250, subsampling from
    # epoch 2 of an 8-epoch warm-up lost 1-2 of 10 codes for good, from epoch
    # 12 none at the end (benchmarks/time_to_quality.py).
    if start_epoch < warmup_epochs:
        warnings.warn(
            f"feature subsampling starts at epoch {start_epoch:g}, before the KL warm-up ends "
            f"(epoch {warmup_epochs:g}): codes the sparse decoder drops as they are pruned rarely come back; "
            "set feature_subsample_start_epoch at or after kl_warmup_epochs (a few epochs after is safer)",
            stacklevel=3,
        )


def train(
    model="ssl_dgm",
    data=None,
    *,
    layer=None,
    latent_dim=5,
    likelihood="gaussian",
    max_epochs=200,
    batch_size=100,
    lr=0.01,
    global_lr=None,
    lr_decay=1.0,
    seed=0,
    device="auto",
    precision="fp32",
    progress=True,
    validation_fraction=0.0,
    early_stopping=None,
    kl_warmup_epochs=None,
    num_particles=1,
    particle_reduction="mean",
    on_divergence="raise",
    max_rollbacks=3,
    checkpoint_path=None,
    checkpoint_every=1,
    resume_from=None,
    strategy=None,
    **hyperparameters,
):
    """
    Fit a registered model to ``data`` (N x G: numpy array, torch tensor or
    scipy.sparse matrix) and return a :class:`FittedModel`.

    ``data`` may also be an AnnData (cells x genes): the model is fitted to
    ``adata.X``, or to ``adata.layers[layer]``, and keeps its ``var_names``
    (``fitted.config["feature_names"]``); see :mod:`pyro_sparse.anndata_io`.
    A sparse matrix is densified one minibatch at a time, never whole.

    Model hyperparameters are keyword arguments under the paper's names, e.g.
    for ``ssl_dgm``: ``hidden_dims=(50, 50, 50)``, ``lambda0=10``,
    ``lambda1=1``, ``a=1``, ``b=None`` (= G), ``beta=1``,
    ``prior_covariance=None``, ``noise_nu=3``, ``noise_xi=None`` (calibrated from
    the data, Appendix C.2).  See ``pyro_sparse.registry.MODELS``.

    Every SVI model takes ``latent_prior=`` (the prior of z: a name in
    ``registry.LATENT_PRIORS`` such as ``"spike_slab"``, with that prior's
    hyperparameters as further keywords, e.g. ``alpha=0.3``; or any Pyro
    distribution, or a factory ``f(latent_dim)`` returning one) and
    ``ssl_dgm`` takes ``mask_prior=`` (``"ssl"``, ``"horseshoe"`` or a
    distribution over W); the guide follows the latent prior, and the log
    (logger ``"pyro_sparse"``) says whether each KL term is in closed form
    or a Monte-Carlo estimate.  See :mod:`pyro_sparse.latent_priors`.
    ``model="nmf"`` is fitted by scikit-learn, not SVI: it takes ``data``,
    ``latent_dim``, ``likelihood``, ``seed`` and its own hyperparameters and
    returns a :class:`~pyro_sparse.nmf.FittedNMF` with the same evaluation
    methods; the training-loop arguments do not apply to it.

    ``global_lr`` is the learning rate of the point-estimated global sites
    (W, a linear dictionary A, noise variances; default ``lr``) and
    ``lr_decay`` multiplies every learning rate after each epoch.

    ``kl_warmup_epochs`` (default: a quarter of ``max_epochs``) ramps the KL
    weight of z from 0 to 1 so the decoder learns to use the codes before the
    KL can collapse them; the objective after the warm-up is the paper's.

    ``num_particles`` draws J codes per data point per step;
    ``particle_reduction="mean"`` averages their ELBO terms (the usual J-sample
    estimate), ``"max"`` keeps each data point's best particle (the max-ELBO
    sampling of Fallah & Rozell 2022, Eq. 9; see :class:`~pyro_sparse.elbo.MaxParticleELBO`).

    The loss, parameters and buffers are checked after every step.  If one
    becomes NaN/inf, ``on_divergence="raise"`` raises
    :class:`~pyro_sparse.training.TrainingDivergedError` whose ``fitted`` is
    the model at the end of the last good epoch (the best one with early
    stopping); ``"rollback"`` returns to the start of the epoch, halves every
    learning rate and trains on, up to ``max_rollbacks`` times.

    ``checkpoint_path`` saves the whole training state (modules, optimizer,
    learning-rate schedule, random number generators, history) every
    ``checkpoint_every`` epochs, at the end and on divergence, replacing the
    file atomically.  ``resume_from=path`` goes on from such a file: called
    with the same data and arguments (``max_epochs`` may differ) it ends with
    the same parameters as a run that was never interrupted.  With
    ``max_epochs`` at or below the checkpoint's epoch it returns the saved
    model without training.

    ``strategy="ddp"`` trains data-parallel over :mod:`torch.distributed` in
    every process that torchrun starts (``torchrun --nproc_per_node=N
    script.py``; gloo on CPU, NCCL with one GPU per process): ``batch_size``
    is the global batch, split across the processes, which end with
    identical models; only rank 0 writes the checkpoint.  See
    :mod:`pyro_sparse.distributed`.

    ``precision="bf16"`` runs the decoder network's forward pass (most of a
    step's cost) under :func:`torch.autocast` in bfloat16 on CPU or CUDA and
    casts its outputs back to float32, so the likelihood, KL terms, priors,
    proximal steps and parameters stay float32 (decoder outputs agree with
    float32 to ~0.5 %).  It helps on GPUs and on CPUs with bfloat16
    instructions (AVX512-BF16, AMX), and costs time on CPUs without.
    ``"tf32"`` lets every float32 matrix product and convolution on CUDA
    use TensorFloat-32 during the fit (restored after); it needs CUDA.  The
    fitted model evaluates its decoder (``reconstruct``,
    ``heldout_log_likelihood``, ...) in the precision it was trained in,
    bfloat16 after a ``"bf16"`` fit, float32 otherwise (see
    :meth:`FittedModel.set_precision`); encoders are always float32.  The
    setting is saved in model files and checkpoints.
    """
    entry = registry.get_entry(model)
    likelihood = check_likelihood(likelihood)
    if data is None:
        raise DataError("train() needs data: an (N x G) array, tensor or sparse matrix")
    data, feature_names = anndata_io.training_data(data, layer)
    if feature_names is None:
        feature_names = feature_names_of(data)
    matrix = as_matrix(data)
    check_values(matrix, likelihood)
    if not _is_count(latent_dim):
        raise ValueError(f"latent_dim must be a positive integer, got {latent_dim!r}")
    if "hidden_dims" in hyperparameters:
        _check_hidden_dims(hyperparameters["hidden_dims"])
    if isinstance(entry, registry.EstimatorEntry):
        # Fitted by its own routine: the SVI arguments below do not apply.
        hyper = registry.resolve_hyperparameters(model, likelihood, DataSummary.of(matrix), hyperparameters)
        fitted = entry.estimator.fit(matrix, latent_dim=int(latent_dim), likelihood=likelihood, seed=seed, **hyper)
        fitted.config.update(feature_names=feature_names, layer=layer)
        return fitted
    if not _is_count(batch_size):
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not _is_count(max_epochs):
        raise ValueError(f"max_epochs must be a positive integer, got {max_epochs!r}")
    if not 0 < lr < np.inf:
        raise ValueError(f"lr must be positive and finite, got {lr!r}")
    if global_lr is not None and not global_lr > 0:
        raise ValueError(f"global_lr must be positive or None, got {global_lr!r}")
    if not 0 < lr_decay <= 1:
        raise ValueError(f"lr_decay must be in (0, 1], got {lr_decay!r}")
    if not _is_count(num_particles):
        raise ValueError(f"num_particles must be a positive integer, got {num_particles!r}")
    if particle_reduction not in ("mean", "max"):
        raise ValueError(f"particle_reduction must be 'mean' or 'max', got {particle_reduction!r}")
    if not 0 <= validation_fraction < 1:
        raise ValueError(f"validation_fraction must be in [0, 1), got {validation_fraction}")
    if not isinstance(max_rollbacks, (int, np.integer)) or max_rollbacks < 0:
        raise ValueError(f"max_rollbacks must be a non-negative integer, got {max_rollbacks!r}")
    if not isinstance(checkpoint_every, (int, np.integer)) or checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be a positive integer (epochs), got {checkpoint_every!r}")
    if strategy not in (None, "ddp"):
        raise ValueError(f"strategy must be None (one process) or 'ddp' (launched by torchrun), got {strategy!r}")
    device = resolve_device(device)
    if strategy == "ddp":
        device = distributed.init_process_group(device)
    check_precision(precision, device)
    pyro.set_rng_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    train_matrix, validation_matrix = split(matrix, validation_fraction, generator)
    summary = DataSummary.of(train_matrix)
    check_training_data(summary, likelihood)
    if batch_size > summary.num_data:
        warnings.warn(
            f"batch_size={batch_size} is larger than the {summary.num_data} training points; "
            f"each step uses all of them (batch_size={summary.num_data})",
            stacklevel=2,
        )
    hyper = registry.resolve_hyperparameters(model, likelihood, summary, hyperparameters)
    custom_priors = {k: hyper[k] for k in registry.PRIOR_ARGUMENTS if k in hyper and not isinstance(hyper[k], str)}
    config = {
        "model": model,
        "num_features": summary.num_features,
        "latent_dim": int(latent_dim),
        "likelihood": likelihood,
        "num_data": summary.num_data,
        "feature_means": summary.feature_means.tolist(),
        "feature_variances": summary.feature_variances.tolist(),
        "feature_names": feature_names,
        "layer": layer,
        "hyperparameters": {
            k: _custom_label(v) if k in custom_priors else _jsonable(v) for k, v in hyper.items()
        },
        "training": {
            "max_epochs": _jsonable(max_epochs),
            "batch_size": _jsonable(batch_size),
            "lr": _jsonable(lr),
            "global_lr": _jsonable(global_lr),
            "lr_decay": _jsonable(lr_decay),
            "seed": _jsonable(seed),
            "kl_warmup_epochs": _jsonable(kl_warmup_epochs),
            "num_particles": _jsonable(num_particles),
            "particle_reduction": particle_reduction,
            "precision": precision,
            # The global batch is sliced across the processes: a resumed run
            # must have as many to continue the same sequence of steps.
            "processes": distributed.num_processes() if strategy == "ddp" else 1,
        },
    }
    json.dumps(config)  # fail now, not after training, if a setting cannot be saved
    resume = None if resume_from is None else checkpoints.load(resume_from, config)
    checkpoint = (
        checkpoints.Checkpointer(checkpoint_path, checkpoint_every, config)
        if checkpoint_path is not None and distributed.is_main_process()
        else None
    )
    model_module, guide, elbo = _assemble(config, device, custom_priors)
    # Dense Gaussian codes beyond G dimensions only add unidentifiable
    # directions that collapse to the prior; sparse codes may be overcomplete.
    if latent_dim > summary.num_features and not model_module.latent_prior.sparse_codes:
        warnings.warn(
            f"latent_dim={latent_dim} exceeds the {summary.num_features} features: {model!r} has dense "
            f"Gaussian codes and cannot use more than {summary.num_features} dimensions (the rest collapse to "
            "the prior and cost time); lower latent_dim, or use sparse codes (e.g. latent_prior='spike_slab')",
            stacklevel=2,
        )
    warmup_epochs = max_epochs / 4 if kl_warmup_epochs is None else kl_warmup_epochs
    if getattr(model_module, "feature_subsample_size", None) is not None:
        _warn_early_subsampling(model_module.feature_subsample_start_epoch, warmup_epochs)
    _log_kl_terms(model_module, guide, train_matrix, device)
    if precision == "bf16" and set_decoder_precision(model_module, precision) == 0:
        warnings.warn(
            f"precision='bf16' changes nothing here: this {model!r} model has no decoder network that runs in "
            "bfloat16 (e.g. decoder='linear'); it trains in float32",
            stacklevel=2,
        )
    check_step_memory(model_module, min(batch_size, summary.num_data) * num_particles, device)
    if num_particles > 1 or particle_reduction == "max":
        elbo = MaxParticleELBO(
            num_particles=num_particles,
            particle_reduction=particle_reduction,
            vectorize_particles=getattr(model_module, "vectorized_particles", True),
        )
    try:
        with tf32_matmuls(precision):
            history = fit(
                model_module,
                guide,
                elbo,
                train_matrix,
                validation_matrix=validation_matrix,
                max_epochs=max_epochs,
                batch_size=min(batch_size, train_matrix.shape[0]),
                lr=lr,
                global_lr=global_lr,
                lr_decay=lr_decay,
                device=device,
                generator=generator,
                progress=progress,
                early_stopping=early_stopping,
                kl_warmup_epochs=warmup_epochs,
                on_divergence=on_divergence,
                max_rollbacks=max_rollbacks,
                checkpoint=checkpoint,
                resume=resume,
                strategy=None if strategy is None else distributed.DataParallel(model_module, guide, elbo),
            )
    except TrainingDivergedError as error:
        error.fitted = FittedModel(config, model_module, guide, error.history)
        raise
    return FittedModel(config, model_module, guide, history)


def load(path, device="cpu", latent_prior=None, mask_prior=None):
    """
    Load a model written by :meth:`FittedModel.save`; never executes code
    from the file.  A model trained with a user's prior object (a
    distribution or factory, which the file records by name only) needs the
    same object again as ``latent_prior=`` / ``mask_prior=``.
    """
    config, states = serialization.read(path)
    history = config.pop("history", {})
    custom_priors = {}
    for argument, value in (("latent_prior", latent_prior), ("mask_prior", mask_prior)):
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
            custom_priors[argument] = value
    try:
        entry = registry.get_entry(config["model"])
        if isinstance(entry, registry.EstimatorEntry):
            return entry.estimator.from_saved(config, states, history)
        model, guide, _ = _assemble(config, resolve_device(device), custom_priors)
        model.load_state_dict(states["model"])
        guide.load_state_dict(states["guide"])
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        raise serialization.ModelFileError(
            f"{path!r} does not match the model it describes: {error}"
        ) from None
    model.eval()
    guide.eval()
    return FittedModel(config, model, guide, history)
