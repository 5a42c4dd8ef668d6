"""
Training checkpoints: everything :func:`pyro_sparse.infer.loop.fit` needs to go
on with a run as if it had never stopped.

A snapshot holds the model and guide state dicts (parameters and buffers: the
priors' E-step state, the guides' schedule values), Adam's per-parameter
moments and per-group learning rates, the learning-rate schedule, the loop's
counters and history, the early-stopping best state, and the states of every
random number generator a step draws from (torch, CUDA, numpy, Python's
``random`` and the minibatch generator).  Files are written with
:mod:`pyro_sparse.io.serialization`: tensors and JSON only, read with
``torch.load(weights_only=True)``, checksummed, replaced atomically.
"""

import copy
import json
import math
import os
import random
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from pyro_sparse.data.covariates import CovariateSpec
from pyro_sparse.data.validation import DataError
from pyro_sparse.infer.config import Schedule
from pyro_sparse.io import serialization
from pyro_sparse.priors.gene_sets import match_membership

CHECKPOINT_FILE = serialization.FileFormat("pyro_sparse.checkpoint", 1, "pyro_sparse training checkpoint")


class CheckpointError(serialization.ModelFileError):
    """A checkpoint that cannot be read, or that belongs to a different run."""


@dataclass
class LoopState:
    """The training loop's own counters, restored with the modules on resume."""

    epoch: int = 0  # epochs completed
    step: int = 0  # optimizer steps taken
    history: dict = field(default_factory=lambda: {"train_loss": [], "validation_loss": [], "rollbacks": []})
    best_loss: float = math.inf  # best validation loss so far
    best_state: tuple | None = None  # (model, guide) state dicts at best_loss, kept for early stopping
    epochs_without_improvement: int = 0
    rollbacks: int = 0  # divergences recovered from by rolling back
    recent_losses: list = field(default_factory=list)  # the last step losses after the KL warm-up (spike_factor)


@dataclass
class Snapshot:
    """A run's state as JSON-able ``config`` and ``states`` (name -> dict of tensors)."""

    config: dict
    states: dict


def _rng_states(generator):
    numpy_kind, numpy_keys, numpy_position, numpy_has_gauss, numpy_gauss = np.random.get_state()
    python_version, python_state, python_gauss = random.getstate()
    tensors = {
        "torch": torch.get_rng_state(),
        "numpy": torch.from_numpy(numpy_keys.astype(np.int64)),
        "python": torch.tensor(python_state, dtype=torch.int64),
    }
    if generator is not None:
        tensors["minibatches"] = generator.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors.update({f"cuda.{i}": state for i, state in enumerate(torch.cuda.get_rng_state_all())})
    scalars = {
        "numpy": [numpy_kind, numpy_position, numpy_has_gauss, numpy_gauss],
        "python": [python_version, python_gauss],
    }
    return scalars, tensors


def _set_rng_states(scalars, tensors, generator):
    torch.set_rng_state(tensors["torch"])
    numpy_kind, numpy_position, numpy_has_gauss, numpy_gauss = scalars["numpy"]
    numpy_keys = tensors["numpy"].numpy().astype(np.uint32)
    np.random.set_state((numpy_kind, numpy_keys, numpy_position, numpy_has_gauss, numpy_gauss))
    python_version, python_gauss = scalars["python"]
    random.setstate((python_version, tuple(tensors["python"].tolist()), python_gauss))
    if generator is not None:
        generator.set_state(tensors["minibatches"])
    cuda_states = [tensors[f"cuda.{i}"] for i in range(sum(key.startswith("cuda.") for key in tensors))]
    if cuda_states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda_states[: torch.cuda.device_count()])


def capture(loop, model, guide, optimizer, scheduler, generator=None):
    """A :class:`Snapshot` of the run, detached from the live objects."""
    optimizer_state = optimizer.state_dict()
    rng_scalars, rng_tensors = _rng_states(generator)
    config = {
        "loop": {
            "epoch": loop.epoch,
            "step": loop.step,
            "history": {name: list(values) for name, values in loop.history.items()},
            "best_loss": loop.best_loss,
            "epochs_without_improvement": loop.epochs_without_improvement,
            "rollbacks": loop.rollbacks,
            "recent_losses": list(loop.recent_losses),
        },
        # Learning rates, betas, eps, ... per group; JSON keeps Python floats exact.
        "optimizer_groups": optimizer_state["param_groups"],
        "scheduler": copy.deepcopy(scheduler.state_dict()),
        "rng": rng_scalars,
    }
    states = {
        "model": {key: value.detach().clone() for key, value in model.state_dict().items()},
        "guide": {key: value.detach().clone() for key, value in guide.state_dict().items()},
        "optimizer": {
            f"{index}.{name}": value.detach().clone()
            for index, moments in optimizer_state["state"].items()
            for name, value in moments.items()
        },
        "rng": rng_tensors,
    }
    if loop.best_state is not None:
        # Copied when it was taken and never changed since: shared, not cloned.
        states["best_model"], states["best_guide"] = loop.best_state
    return Snapshot(config, states)


def restore(snapshot, model, guide, optimizer, scheduler, generator=None):
    """Load ``snapshot`` into the live objects and return its :class:`LoopState`."""
    config, states = snapshot.config, snapshot.states
    moments = {}
    for key, value in states["optimizer"].items():
        index, name = key.split(".", 1)
        moments.setdefault(int(index), {})[name] = value.clone()
    try:
        model.load_state_dict(states["model"])
        guide.load_state_dict(states["guide"])
        optimizer.load_state_dict({"state": moments, "param_groups": copy.deepcopy(config["optimizer_groups"])})
    except (RuntimeError, ValueError) as error:  # e.g. written by a version with other parameter names
        raise CheckpointError(f"the checkpoint does not fit the model it describes: {error}") from None
    scheduler.load_state_dict(copy.deepcopy(config["scheduler"]))
    _set_rng_states(config["rng"], states["rng"], generator)
    loop = LoopState(**config["loop"])
    # Copied: the same snapshot is restored again if training diverges again.
    loop.history = {name: list(values) for name, values in loop.history.items()}
    loop.recent_losses = list(loop.recent_losses)
    if "best_model" in states:
        loop.best_state = (states["best_model"], states["best_guide"])
    return loop


class Checkpointer:
    """Saves a run to ``path`` every ``every`` epochs, and when the run ends or diverges."""

    def __init__(self, path, every, run_config):
        serialization.check_writable(path)  # not only when the first checkpoint is due
        _check_replaceable(path)
        self.path, self.every, self.run_config = path, every, run_config

    def save(self, snapshot):
        """
        Write ``snapshot``; True if written.  A failed write (a full disk) is a
        warning, not an error: the run goes on, and the file keeps the last
        checkpoint written (writes are atomic).
        """
        try:
            save(self.path, snapshot, self.run_config)
        except OSError as error:
            warnings.warn(f"the checkpoint was not written ({error}); training goes on, and {str(self.path)!r} "
                          "keeps the last checkpoint that was", stacklevel=2)
            return False
        return True


def _check_replaceable(path):
    """
    Refuse a checkpoint path that holds anything but a checkpoint (a saved
    model, another file): checkpoints replace the file at their path, and a
    finished model must not be lost to a run's first checkpoint.
    """
    if not os.path.exists(path):  # nothing there, or a dangling link that the checkpoint is written through
        return
    try:
        serialization.read(path, CHECKPOINT_FILE)
    except (serialization.ModelFileError, OSError) as error:
        raise CheckpointError(
            f"the checkpoint path {str(path)!r} holds a file that is not a pyro_sparse checkpoint ({error}), which "
            "checkpoints would replace: choose another path, or move the file"
        ) from None


def save(path, snapshot, run_config):
    """Write ``snapshot`` to ``path`` atomically, with the configuration of the run it belongs to."""
    serialization.write(path, {"run": run_config, **snapshot.config}, snapshot.states, CHECKPOINT_FILE)


def load(path, run_config):
    """
    The :class:`Snapshot` at ``path``, after checking that it belongs to a run
    configured as ``run_config`` (only ``max_epochs`` may differ: a resumed
    run may be extended or shortened).
    """
    try:
        config, states = serialization.read(path, CHECKPOINT_FILE)
    except serialization.ModelFileError as error:
        raise CheckpointError(str(error)) from None
    _check_same_run(config.pop("run"), run_config, path, states["model"])
    return Snapshot(config, states)


def _gene_set_order(sets, feature_names, model_state):
    """
    The names of ``sets`` ([name, genes] pairs) in the order of a checkpoint's factors, read from its saved
    membership (for checkpoints that recorded the sets as a JSON object, keys sorted); None if they do not match.
    """
    membership = next((v for k, v in model_state.items() if k.endswith("membership")), None)
    if membership is None or feature_names is None:
        return None
    names = [str(name) for name in feature_names]
    columns = [[feature in set(genes) for feature in names] for _, genes in sets]
    order = match_membership(columns, membership.cpu().T.tolist())
    return None if order is None else [sets[k][0] for k in order]


def _check_same_run(saved, current, path, model_state=None):
    # Round-trip through JSON so that tuples, numpy scalars, ... compare as they were saved.
    current = json.loads(json.dumps(current))
    where = f"the checkpoint {str(path)!r}"
    if saved["model"] != current["model"]:
        raise CheckpointError(f"{where} is of model {saved['model']!r}, this run trains {current['model']!r}")
    if saved["num_features"] != current["num_features"]:
        raise CheckpointError(
            f"{where} was trained on data with {saved['num_features']} features, this data has "
            f"{current['num_features']}; resume with the data the run started on"
        )
    if saved["num_data"] != current["num_data"]:
        raise CheckpointError(
            f"{where} was trained on {saved['num_data']} training points, this run has {current['num_data']}; "
            "resume with the data and validation_fraction the run started with"
        )
    # Before the settings: some hyperparameters are calibrated from the data.
    if saved["feature_means"] != current["feature_means"] or saved["feature_variances"] != current["feature_variances"]:
        raise CheckpointError(
            f"{where} was trained on different data of the same shape (feature means or variances differ); "
            "resume with the data the run started on"
        )
    # Gene sets written before they were recorded in order are a JSON object (keys sorted): compared as a
    # mapping, and the order of the factors, which this run records, read from the saved membership.
    if isinstance(saved["hyperparameters"].get("gene_sets"), dict) and "gene_sets" in current["hyperparameters"]:
        sets = current["hyperparameters"]["gene_sets"]
        order = _gene_set_order(sets, current.get("feature_names"), model_state or {})
        if order is not None and order != [name for name, _ in sets]:
            raise CheckpointError(f"{where} holds the gene sets in the factor order {order}; this run passes them "
                                  f"as {[name for name, _ in sets]}: resume with the sets in the checkpoint's order")
        current["hyperparameters"]["gene_sets"] = dict(sets)
    for run in (saved, current):
        run["covariates"] = _covariate_layout(run.get("covariates"))
        if run.get("registration"):  # the AnnData columns training read (labels are for evaluation only)
            run["registration"] = {k: v for k, v in run["registration"].items() if k != "labels_key"}
    changed = [(name, saved[name], current[name]) for name in ("latent_dim", "likelihood", "covariates",
                                                                "registration", "layer")
               if saved.get(name) != current.get(name)]
    # Options that place a schedule as a fraction of max_epochs may change with it, the epochs they place may
    # not; they are compared once every other setting is the same (older files record no schedules).
    placed, placing = (run.get("schedule", {"options": [], "epochs": {}}) for run in (saved, current))
    for part in ("hyperparameters", "training"):
        names = sorted((saved[part].keys() | current[part].keys()) - {"max_epochs", "kl_warmup_epochs",
                                                                      *placed["options"]})
        # Older files record the user's options only, and fewer training settings.
        names = [name for name in names if name in saved[part]]
        changed += [(name, saved[part].get(name), current[part].get(name)) for name in names
                    if saved[part].get(name) != current[part].get(name)]
    different_priors = sorted(name for name, digest in saved.get("custom_priors", {}).items()
                              if current.get("custom_priors", {}).get(name) != digest)
    if different_priors:
        raise CheckpointError(f"{where} was written by a run with another user-defined {', '.join(different_priors)} "
                              "(its class or parameters differ): resume with the prior objects the run started with")
    if changed:
        differences = "; ".join(f"{name}: {old!r} in the checkpoint, {new!r} now" for name, old, new in changed)
        raise CheckpointError(
            f"{where} was written by a run with different settings ({differences}); resume with the settings the "
            "run started with (only max_epochs may change; where you left an option at its default, the default "
            "may have changed since: pass the checkpoint's value)"
        )
    for name in sorted(set(placed["epochs"]) | set(placing["epochs"])) if "schedule" in saved else ():
        before, now = placed["epochs"].get(name), placing["epochs"].get(name)
        # None: the schedule runs to the run's own end (moves with max_epochs). Epochs are products of
        # fractions (30 * (1 - 0.7) is 9.000000000000002), so equal means equal to rounding.
        if None in (before, now) or not math.isclose(before, now, rel_tol=1e-9):
            raise CheckpointError(
                f"{where} was written by a run whose {name} is {_epoch_text(before)}; this one's is "
                f"{_epoch_text(now)} (set by {', '.join(placed['options'] or placing['options'])} as a fraction of "
                f"max_epochs): to change max_epochs, set them so that {name} stays {_epoch_text(before)}"
            )
    # The default KL warm-up (and the threshold warm-up that follows it) lasts max_epochs / 4: a run extended
    # with the default would restart it part-way, so compare the lengths, not the options.
    warmups = [Schedule(kl_warmup_epochs=run["training"].get("kl_warmup_epochs")).warmup_epochs(
        run["training"]["max_epochs"]) for run in (saved, current)]
    if not math.isclose(warmups[0], warmups[1], rel_tol=1e-9):
        raise CheckpointError(
            f"{where} was written by a run whose KL warm-up lasts {warmups[0]:g} epochs; this one's would last "
            f"{warmups[1]:g} (the default is max_epochs / 4): resume with "
            f"schedule=Schedule(kl_warmup_epochs={warmups[0]:g}) to change max_epochs"
        )
    # Last, as the settings name a change more precisely (older checkpoints record no fingerprint).
    if "data_fingerprint" in saved and saved["data_fingerprint"] != current.get("data_fingerprint"):
        raise CheckpointError(
            f"{where} was trained on different data with the same feature means and variances (other values, "
            "rows in another order, or other covariates or library sizes); resume with the data the run started on"
        )


def _epoch_text(epoch):
    """A placed schedule epoch in a message; None: it moves with the run's end."""
    return "the run's end" if epoch is None else f"epoch {epoch:.12g}"


def _covariate_layout(config):
    """A recorded covariate layout in the current format (earlier files wrote it as dicts)."""
    try:
        return None if config is None else json.loads(json.dumps(CovariateSpec.from_config(config).to_config()))
    except DataError:
        return config  # an order earlier files lost: compared as written
