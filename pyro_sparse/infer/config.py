"""
How a model is trained: the settings of :func:`pyro_sparse.train`, grouped.

The common knobs (``max_epochs``, ``batch_size``, ``lr``, ``seed``,
``device``, ``progress``) are plain keyword arguments of ``train``; the rest
are fields of four small config objects, each documented here once:

.. code-block:: python

    pyro_sparse.train("ssl_dgm", X, schedule=Schedule(kl_warmup_epochs=8, validation_fraction=0.1),
                      checkpointing=Checkpointing(path="run.ckpt"), hardware=Hardware(precision="bf16"))

Every field is checked when its object is made, so a bad value fails before
any data is read.
"""

import difflib
import math
import os
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from pyro_sparse.checks import is_count
from pyro_sparse.nn.precision import PRECISIONS


def _require(condition, message):
    if not condition:
        raise ValueError(message)


def _real(value):
    """A real number (not a bool, not text)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _plain_numbers(config):
    """A settings object's numpy scalars as Python's (they are recorded as JSON), before any check."""
    for name, value in vars(config).items():
        if isinstance(value, np.generic):
            object.__setattr__(config, name, value.item())


@dataclass(frozen=True)
class Optimization:
    """
    What one gradient step computes.

    :param float global_lr: Adam learning rate of the point-estimated global
        sites (a mask W, a linear dictionary A, noise variances); ``None``
        uses ``lr``.  A linear dictionary learns at another pace than the
        networks (Fallah & Rozell 2022, Appendix D, give it a 50x larger rate).
    :param float lr_decay: every learning rate is multiplied by this after
        each epoch (the same appendix: 0.99).
    :param int num_particles: J code draws per data point and step.
    :param str particle_reduction: ``"mean"`` averages the J particles' ELBO
        terms (the usual J-sample estimate); ``"max"`` keeps each data point's
        best particle, the max-ELBO sampling of Fallah & Rozell (2022, Eq. 9;
        :class:`~pyro_sparse.infer.elbo.MaxParticleELBO`).  With ``ssl_dgm``'s
        feature subsampling the particles of a step share one feature subset,
        so "best" is judged on that subset's terms (the selection still sees
        the subset's noise; ``feature_subsample_size=None`` judges on all).
    """

    global_lr: float = None
    lr_decay: float = 1.0
    num_particles: int = 1
    particle_reduction: str = "mean"

    def __post_init__(self):
        _plain_numbers(self)
        _require(self.global_lr is None or _real(self.global_lr) and 0 < self.global_lr < math.inf,
                 f"global_lr must be positive or None, got {self.global_lr!r}")
        _require(_real(self.lr_decay) and 0 < self.lr_decay <= 1, f"lr_decay must be in (0, 1], got {self.lr_decay!r}")
        _require(is_count(self.num_particles), f"num_particles must be a positive integer, got {self.num_particles!r}")
        _require(self.particle_reduction in ("mean", "max"),
                 f"particle_reduction must be 'mean' or 'max', got {self.particle_reduction!r}")


@dataclass(frozen=True)
class Schedule:
    """
    How training unfolds over epochs.

    :param float kl_warmup_epochs: the KL weight of the local codes rises
        linearly from 0 to 1 over this many epochs (Bowman et al. 2016), so
        the decoder learns to use z before the KL can collapse q(z|x) onto the
        prior; priors with fitting hooks (the SSL's proximal step) ramp their
        penalty alike.  ``None``: a quarter of ``max_epochs``.  After the
        warm-up the objective is the paper's ELBO.
    :param float validation_fraction: share of the data held out to report a
        validation loss each epoch (-ELBO per validation point).
    :param int early_stopping: patience in epochs on the validation loss
        (needs ``validation_fraction > 0``); the best epoch's state is restored.
    """

    kl_warmup_epochs: float = None
    validation_fraction: float = 0.0
    early_stopping: int = None

    def __post_init__(self):
        _plain_numbers(self)
        warmup = self.kl_warmup_epochs
        _require(warmup is None or _real(warmup) and 0 <= warmup < math.inf,
                 f"kl_warmup_epochs must be >= 0 or None, got {self.kl_warmup_epochs!r}")
        _require(_real(self.validation_fraction) and 0 <= self.validation_fraction < 1,
                 f"validation_fraction must be in [0, 1), got {self.validation_fraction!r}")
        _require(self.early_stopping is None or is_count(self.early_stopping),
                 f"early_stopping must be a positive integer (epochs) or None, got {self.early_stopping!r}")
        _require(not self.early_stopping or self.validation_fraction > 0,
                 "early_stopping needs validation data: set validation_fraction > 0")

    def warmup_epochs(self, max_epochs):
        """The KL warm-up length of a run of ``max_epochs`` epochs."""
        return max_epochs / 4 if self.kl_warmup_epochs is None else self.kl_warmup_epochs


@dataclass(frozen=True)
class Checkpointing:
    """
    Saving, resuming and what to do when training diverges.

    :param path: save the whole training state (modules, optimizer,
        learning-rate schedule, random number generators, history) to this
        file every ``every`` epochs, at the end and on divergence, replacing
        it atomically; ``None``: no checkpoints.  A file there that is not a
        checkpoint (a saved model, say) is refused before training.
    :param int every: epochs between checkpoints.
    :param resume_from: go on from a checkpoint written by a run with the same
        data and settings (``max_epochs`` may differ): the run ends with the same
        parameters as one that was never interrupted.  With ``max_epochs`` at or
        below the checkpoint's epoch, the saved model is returned untrained.
    :param str on_divergence: when the loss or a parameter becomes NaN/inf (or the loss spikes, see
        ``spike_factor``),
        ``"raise"`` raises :class:`~pyro_sparse.infer.loop.TrainingDivergedError`
        (its ``fitted`` is the model at the end of the last good epoch, or
        under early stopping at the best validation epoch);
        ``"rollback"`` returns to the start of the epoch, halves every learning
        rate and trains on, up to ``max_rollbacks`` times.
    :param int max_rollbacks: see ``on_divergence``.
    :param float spike_factor: also count as a divergence a step whose loss exceeds
        ``spike_factor`` times the median of the last 100 step losses, once the KL
        warm-up is over (the loss is not yet stationary before); ``None``: only NaN/inf.
    """

    path: object = None
    every: int = 1
    resume_from: object = None
    on_divergence: str = "raise"
    max_rollbacks: int = 3
    spike_factor: float = None

    def __post_init__(self):
        _plain_numbers(self)
        _require(is_count(self.every), f"every must be a positive integer (epochs), got {self.every!r}")
        for name in ("path", "resume_from"):
            value = getattr(self, name)
            _require(value is None or isinstance(value, (str, bytes, os.PathLike)),
                     f"{name} must be a file path (str, bytes or os.PathLike) or None, got {value!r}")
        _require(self.on_divergence in ("raise", "rollback"),
                 f"on_divergence must be 'raise' or 'rollback', got {self.on_divergence!r}")
        _require(is_count(self.max_rollbacks, minimum=0),
                 f"max_rollbacks must be a non-negative integer, got {self.max_rollbacks!r}")
        _require(self.path is not None or self.every == Checkpointing.every,
                 f"every={self.every!r} sets how often the checkpoint file is written, but no path is given: pass "
                 "path=..., or leave every out")
        _require(self.on_divergence == "rollback" or self.max_rollbacks == Checkpointing.max_rollbacks,
                 f"max_rollbacks={self.max_rollbacks!r} acts only with on_divergence='rollback'; this policy raises "
                 "on a divergence: leave it out")
        _require(self.spike_factor is None or _real(self.spike_factor) and 1 < self.spike_factor < math.inf,
                 f"spike_factor must be > 1 or None, got {self.spike_factor!r}")


@dataclass(frozen=True)
class Hardware:
    """
    Numerical precision and parallelism (the device is ``train``'s ``device``).

    :param str precision: ``"fp32"``; ``"bf16"`` runs the decoder networks'
        forward passes under :func:`torch.autocast` in bfloat16 on CPU or CUDA
        and casts their outputs back, so likelihoods, KL terms, priors and
        parameters stay float32 (outputs agree to ~0.5 %; faster on GPUs and
        CPUs with bfloat16 instructions, slower on others); ``"tf32"`` lets
        float32 matrix products on CUDA use TensorFloat-32 during the fit.  A
        fitted model evaluates its decoder in the precision it was trained in
        (:meth:`~pyro_sparse.fitted.FittedModel.set_precision` changes it).
    :param str strategy: ``None`` (one process) or ``"ddp"``: data-parallel
        training over :mod:`torch.distributed` in every process torchrun starts
        (``batch_size`` is then the global batch; only rank 0 writes files; see
        :mod:`pyro_sparse.infer.distributed`).
    """

    precision: str = "fp32"
    strategy: str = None

    def __post_init__(self):
        _require(self.precision in PRECISIONS,
                 "precision must be 'fp32', 'bf16' (decoder networks in bfloat16) or 'tf32' (TensorFloat-32 "
                 f"matrix products on CUDA), got {self.precision!r}")
        _require(self.strategy in (None, "ddp"),
                 f"strategy must be None (one process) or 'ddp' (launched by torchrun), got {self.strategy!r}")


CONFIGS = {"optimization": Optimization, "schedule": Schedule, "checkpointing": Checkpointing, "hardware": Hardware}


# train() keywords of earlier versions whose config field has another name.
_RENAMED = {"checkpoint_path": "path", "checkpoint_every": "every"}


def setting_hint(name):
    """Where a ``train`` keyword that is a field of a config object belongs (for error messages), or None."""
    field_name = _RENAMED.get(name, name)
    owner = next((cls for cls in CONFIGS.values() if field_name in {f.name for f in fields(cls)}), None)
    if owner is None:
        return None
    return f"{name!r} is a setting of {owner.__name__}: pass {owner.__name__.lower()}={owner.__name__}({field_name}=...)"


# Names other libraries use for train's arguments and settings (scikit-learn, PyTorch Lightning, scvi-tools).
OTHER_NAMES = {"epochs": "max_epochs", "n_epochs": "max_epochs", "learning_rate": "lr", "n_components": "latent_dim",
               "n_latent": "latent_dim", "random_state": "seed", "kl_warmup": "kl_warmup_epochs",
               "n_epochs_kl_warmup": "kl_warmup_epochs"}


def unknown_options_error(model, unknown, accepted, keywords=(), belongs=None):
    """
    The TypeError for options ``model`` does not take: where each belongs (a
    setting's config object, or ``belongs(name)``, e.g. another prior), else
    the accepted option, setting or caller's keyword (``train``'s) it misspells.
    """
    settings = [f.name for config in CONFIGS.values() for f in fields(config)]
    hints = []
    for name in unknown:
        hint = setting_hint(name) or (belongs(name) if belongs is not None else None)
        candidates = [*accepted, *keywords, *settings]
        close = ([OTHER_NAMES[name]] if OTHER_NAMES.get(name) in candidates
                 else difflib.get_close_matches(name, candidates, n=1, cutoff=0.8))
        if hint is None and close:
            hint = f"{name!r}: did you mean {close[0]!r}?" + (f" ({setting_hint(close[0])})" if close[0] in settings
                                                               else "")
        hints += [hint] if hint else []
    return TypeError(f"model {model!r} has no option(s) {unknown}" + (f" ({'; '.join(hints)})" if hints else "")
                     + f"; it accepts {accepted}")


@dataclass(frozen=True)
class TrainingSettings:
    """Everything :func:`pyro_sparse.train` was told about how to train, checked once."""

    max_epochs: int = 200
    batch_size: int = 100
    lr: float = 0.01
    seed: int = 0
    device: str = "auto"
    progress: bool = True
    optimization: Optimization = field(default_factory=Optimization)
    schedule: Schedule = field(default_factory=Schedule)
    checkpointing: Checkpointing = field(default_factory=Checkpointing)
    hardware: Hardware = field(default_factory=Hardware)

    def __post_init__(self):
        _plain_numbers(self)  # also because random.seed refuses np.int64
        _require(is_count(self.max_epochs), f"max_epochs must be a positive integer, got {self.max_epochs!r}")
        _require(is_count(self.batch_size), f"batch_size must be a positive integer, got {self.batch_size!r}")
        # numpy's seeds (pyro.set_rng_seed seeds it too) are integers in [0, 2**32).
        _require(is_count(self.seed, minimum=0) and self.seed < 2**32,
                 f"seed must be an integer in [0, 2**32), got {self.seed!r}")
        _require(_real(self.lr) and 0 < self.lr < math.inf, f"lr must be positive and finite, got {self.lr!r}")
        _require(isinstance(self.progress, bool), f"progress must be True or False, got {self.progress!r}")
        object.__setattr__(self, "lr", float(self.lr))
        for name, cls in CONFIGS.items():
            value = getattr(self, name)
            if not isinstance(value, cls):
                raise TypeError(
                    f"{name} must be a {cls.__name__} (from pyro_sparse import {cls.__name__}), got "
                    f"{type(value).__name__}" + (f"; write {name}={cls.__name__}(**...)" if isinstance(value, dict) else "")
                )

    @property
    def warmup_epochs(self):
        return self.schedule.warmup_epochs(self.max_epochs)

    def record(self):
        """The settings that determine the result, as saved with a model (JSON-able)."""
        optimization, schedule = asdict(self.optimization), self.schedule
        return {
            "max_epochs": self.max_epochs, "batch_size": self.batch_size, "lr": self.lr,
            "seed": self.seed, **optimization, "kl_warmup_epochs": schedule.kl_warmup_epochs,
            "validation_fraction": float(schedule.validation_fraction),
            "early_stopping": None if schedule.early_stopping is None else int(schedule.early_stopping),
            "precision": self.hardware.precision,
        }
