"""``train`` and ``load``: the user-facing entry points."""

import inspect
import warnings

from pyro_sparse import registry
from pyro_sparse.checks import is_count
from pyro_sparse.data import DataError
from pyro_sparse.distributions.likelihoods import check_likelihood
from pyro_sparse.infer.config import TrainingSettings
from pyro_sparse.io import anndata as anndata_io
from pyro_sparse.io import serialization


def train(model="ssl_dgm", data=None, *, latent_dim=5, likelihood="gaussian", max_epochs=200, batch_size=100,
          lr=None, seed=0, device="auto", progress=True, layer=None, batch_key=None, optimization=None,
          schedule=None, checkpointing=None, hardware=None, **hyperparameters):
    """
    Fit a registered model (``pyro_sparse.MODELS``) to ``data`` and return
    its fitted object (:class:`~pyro_sparse.fitted.FittedModel`; for ``nmf``
    a :class:`~pyro_sparse.baselines.nmf.FittedNMF`, without the posterior methods).

    :param str model: a name in ``MODELS``: ``"ssl_dgm"``, ``"vae"``, ``"vsc"``,
        ``"tvsc"``, ``"oi_vae"``, ``"nmf"``.
    :param data: N x G numpy array, torch tensor, pandas DataFrame,
        scipy.sparse matrix (densified one minibatch at a time) or AnnData
        (``adata.X``, or ``adata.layers[layer]``; its ``var_names`` are kept).
    :param int latent_dim: K.
    :param str likelihood: ``"gaussian"``; for counts ``"negative_binomial"``,
        ``"zinb"``, ``"poisson"`` (the library size as an offset) or ``"multinomial"``;
        ``"bernoulli"`` (0/1).
    :param int max_epochs: passes over the data.
    :param int batch_size: data points per step.
    :param float lr: Adam learning rate; ``None``: the model's default (0.01; ``tvsc``: 1e-3).
    :param int seed: seeds torch, numpy, Python and the minibatch order: same
        data, settings and seed give the same fit on the same machine.
    :param device: ``"auto"`` (CUDA if available), ``"cpu"``, ``"cuda"``, ``"cuda:<i>"``.
    :param bool progress: show a progress bar.
    :param str layer: the AnnData layer to fit (overrides :func:`~pyro_sparse.io.anndata.setup_anndata`'s).
    :param str batch_key: an ``adata.obs`` column of batches, a covariate of encoder and decoder, not a factor
        (overrides the registration's; further covariates and library sizes: ``setup_anndata``).
    :param optimization: an :class:`~pyro_sparse.infer.config.Optimization` (global learning rate,
        decay, particles per step).  For ``optimization``, ``schedule`` and ``checkpointing``,
        ``None`` is the model's default: the defaults of the classes, except ``tvsc``'s
        ``Optimization(global_lr=0.1, lr_decay=0.99)`` and
        ``Checkpointing(on_divergence="rollback", spike_factor=10.0)`` (a ``checkpointing`` passed
        replaces that whole object: keep both fields in it to keep the rollback and the spike guard)
        (:func:`pyro_sparse.registry.training_defaults`).
    :param schedule: a :class:`~pyro_sparse.infer.config.Schedule` (KL warm-up, validation, early stopping).
    :param checkpointing: a :class:`~pyro_sparse.infer.config.Checkpointing` (checkpoint files,
        resume, divergence handling).
    :param hardware: a :class:`~pyro_sparse.infer.config.Hardware` (precision, data-parallel strategy).
    :param hyperparameters: the model's options under the papers' names, e.g. for
        ``ssl_dgm`` ``hidden_dims=(50, 50, 50), lambda0=10, lambda1=1``;
        ``latent_prior=`` (a registered name or any Pyro distribution) with that
        prior's options, and ``mask_prior=`` for models with a decoder mask.
        An unknown name fails with the list of valid ones.  Models fitted by
        their own routine (``nmf``) use ``seed`` and ignore the training settings
        (a checkpoint path or ``resume_from``, which they could not honour, is refused).
    """
    entry = registry.get_entry(model)
    likelihood = check_likelihood(likelihood)
    if likelihood not in entry.likelihoods:  # before the data are checked against a likelihood it does not fit
        entry.check_likelihood(likelihood)
    if data is None:
        raise DataError("train() needs data: an (N x G) array, tensor, sparse matrix or AnnData")
    if not is_count(latent_dim):
        raise ValueError(f"latent_dim must be a positive integer, got {latent_dim!r}")
    defaults = registry.training_defaults(model)
    given = {"lr": lr, "optimization": optimization, "schedule": schedule, "checkpointing": checkpointing,
             "hardware": hardware}
    settings = TrainingSettings(
        max_epochs=max_epochs, batch_size=batch_size, seed=seed, device=device, progress=progress,
        **{name: defaults[name] if value is None else value for name, value in given.items()
           if value is not None or name in defaults},
    )
    dataset = anndata_io.training_dataset(data, likelihood, layer, batch_key)
    if likelihood == "gaussian" and dataset.looks_like_counts():
        counts = [name for name in ("negative_binomial", "zinb", "poisson", "multinomial") if name in entry.likelihoods]
        warnings.warn(
            "the data look like raw counts (non-negative integers): the gaussian likelihood treats them as real "
            f"values; for counts use likelihood={counts[0]!r}"
            + (f" (or {', '.join(map(repr, counts[1:]))})" if counts[1:] else ""),
            stacklevel=2,
        )
    # An entry's fit may offer train's own names where an option misspells one (registry: ``keywords``).
    offers = "keywords" in inspect.signature(entry.fit).parameters
    return entry.fit(model, dataset, int(latent_dim), settings, hyperparameters,
                     **({"keywords": _TRAIN_KEYWORDS} if offers else {}))


# train's own argument names, offered where a model option misspells one.
_TRAIN_KEYWORDS = tuple(name for name in inspect.signature(train).parameters if name != "hyperparameters")


def load(path, device="auto", latent_prior=None, mask_prior=None):
    """
    Load a model written by ``fitted.save(path)`` onto ``device`` (``"auto"``:
    CUDA if available, as in ``train``); never executes code from the file.  A model trained with a user's prior object (a distribution or
    factory, which the file records by name only) needs the same object again
    as ``latent_prior=`` / ``mask_prior=``.
    """
    config, states = serialization.read(path)
    history = config.pop("history", {})
    name = config.get("model")
    if name not in registry.MODELS:
        raise serialization.ModelFileError(f"{path!r} describes an unknown model {name!r}")
    priors = {"latent_prior": latent_prior, "mask_prior": mask_prior}
    return registry.MODELS[name].load(path, config, states, history, device, priors)
