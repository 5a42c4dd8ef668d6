"""
The SVI loop: minibatch Adam steps on the full-data -ELBO, with the priors'
fitting hooks around each step, a KL warm-up, divergence handling and
checkpoints.

Each step minimises the full-data -ELBO estimated on one minibatch (the data
plate scales the batch by N / batch size).  Around each optimizer step the
loop calls ``before_step`` / ``after_step`` of every prior in
``model.site_priors`` on the guide's point estimate of that site (e.g. the
SSL proximal step and E-step of Moran et al. 2022, Algorithm 1), giving
``after_step`` Adam's per-coordinate step sizes.  Modules (models, guides
and their submodules, priors included) with training schedules define
``schedule(epoch, iteration)``, called before every step.
"""

import copy
import math
import time
import warnings

import numpy as np
import torch
from pyro import poutine
from tqdm.auto import tqdm

from pyro_sparse.infer import checkpoints
from pyro_sparse.infer.config import TrainingSettings
from pyro_sparse.infer.handlers import scale_local_latents
from pyro_sparse.infer.importance import forked_rng, log_importance_weights

#: Step losses whose median ``Checkpointing.spike_factor`` compares a step's loss with.
SPIKE_WINDOW = 100


class TrainingDivergedError(RuntimeError):
    """
    The loss or a parameter became NaN or infinite, or (with
    ``Checkpointing.spike_factor``) the loss spiked; ``reason`` says which.
    ``history`` holds the losses up to the last good epoch;
    :func:`pyro_sparse.train` adds ``fitted``, the model as it was then.
    """

    def __init__(self, message, history=None, reason=None):
        super().__init__(message)
        self.history = history
        self.reason = reason


class ELBOLoss(torch.nn.Module):
    """-ELBO of ``model``/``guide`` as one module (which DDP can wrap to all-reduce the gradients of both)."""

    def __init__(self, model, guide, elbo):
        super().__init__()
        self.model = model
        self.guide = guide
        self.elbo = elbo

    def forward(self, x, num_data, **kwargs):
        return self.elbo.differentiable_loss(self.model, self.guide, x, num_data, **kwargs)


class SingleProcess:
    """
    Training in one process: whole minibatches and the plain -ELBO.  The
    interface of :class:`~pyro_sparse.infer.distributed.DataParallel`.
    """

    rank = 0  # the interface's process index (DataParallel's rank)

    def __init__(self, model, guide, elbo):
        self.loss = ELBOLoss(model, guide, elbo)

    def batches(self, data, batch_size, generator, device):
        """(:class:`~pyro_sparse.data.dataset.Batch`, weight of its loss) pairs for one epoch of ``data``."""
        for batch in data.minibatches(batch_size, generator, device):
            yield batch, 1.0

    def mean(self, value):
        """The mean of a float over the processes."""
        return value


class Throughput:
    """Rows trained per second, shown in a progress bar's postfix at most every ``interval`` seconds."""

    def __init__(self, bar, interval=2.0):
        self.bar, self.interval = bar, interval
        self.rows, self.since = 0, time.perf_counter()

    def add(self, rows):
        self.rows += rows
        now = time.perf_counter()
        if now - self.since >= self.interval and not self.bar.disable:
            self.bar.set_postfix_str(f"{self.rows / (now - self.since):,.0f} rows/s")
            self.rows, self.since = 0, now


def adam_step_sizes(optimizer, param):
    """
    Adam's per-coordinate step size lr / (sqrt(v̂) + eps) for ``param``, and
    its group's lr: the metric in which a prior's proximal step must be taken
    to match the step the optimizer just made on the smooth part of the loss.
    """
    group = next(g for g in optimizer.param_groups if any(p is param for p in g["params"]))
    state = optimizer.state[param]
    beta2 = group["betas"][1]
    v_hat = state["exp_avg_sq"] / (1 - beta2 ** float(state["step"]))
    return group["lr"] / (v_hat.sqrt() + group["eps"]), group["lr"]


@torch.no_grad()
def mean_negative_elbo(model, guide, data, batch_size, device, seed=0):
    """
    -ELBO per data point of ``data`` (one z draw each), without global prior
    terms.  The draws come from ``seed`` in a forked RNG: every call (each
    epoch's validation) uses the same noise, so epochs are compared on common
    random numbers and early stopping does not chase a lucky draw, and the
    training stream is left as it was.
    """
    total = 0.0
    with forked_rng(torch.empty(0, device=device)):
        torch.manual_seed(seed)
        for batch in data.minibatches(batch_size, device=device, shuffle=False):
            total -= log_importance_weights(model, guide, batch.x, **batch.kwargs).sum().item()
    return total / data.num_data


def _completed(epochs):
    """Where a run with ``epochs`` complete epochs stands, epochs counted from 0 (as ``history_frame``)."""
    return f"the end of epoch {epochs - 1}" if epochs else "the start (no epoch complete)"


def _optimizer(model, guide, settings):
    """Adam over both modules: one group for networks, one for point-estimated global sites (``global_lr``)."""
    params = list({id(p): p for p in (*model.parameters(), *guide.parameters())}.values())
    global_ids = {id(p) for p in guide.unconstrained.values()}
    global_lr = settings.optimization.global_lr
    groups = [
        {"params": [p for p in params if id(p) not in global_ids], "lr": settings.lr},
        {"params": [p for p in params if id(p) in global_ids], "lr": settings.lr if global_lr is None else global_lr},
    ]
    optimizer = torch.optim.Adam([g for g in groups if g["params"]], foreach=True)
    return optimizer, torch.optim.lr_scheduler.ExponentialLR(optimizer, settings.optimization.lr_decay)


def check_site_scales(model, guide, batch):
    """
    Before training: every latent site must carry the same scale in the
    model and the guide.  The ELBO weighs a closed-form KL by the guide's
    scale and a Monte-Carlo one by each side's own, so a KL weight (the
    model's ``beta``, the guide's ``kl_weight``) set on one side only is
    ignored or turns the KL into β log p - log q.  ``train`` sets both; this
    catches a model and guide built by hand.  Traced in eval mode with a
    forked RNG: training sees no side effect.
    """
    modes = model.training, guide.training
    model.eval(), guide.eval()
    try:
        with torch.no_grad(), forked_rng(batch.x):
            # num_data=None: no minibatch factor N/B (the same on both sides), so the scales read as set.
            guide_trace = poutine.trace(guide).get_trace(batch.x, None, **batch.kwargs)
            model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(
                batch.x, None, **batch.kwargs)
    finally:
        model.train(modes[0]), guide.train(modes[1])
    for name, site in model_trace.nodes.items():
        other = guide_trace.nodes.get(name)
        if site["type"] != "sample" or site["is_observed"] or other is None:
            continue
        if not torch.allclose(torch.as_tensor(site["scale"], dtype=torch.float64),
                              torch.as_tensor(other["scale"], dtype=torch.float64)):
            raise ValueError(
                f"site {name!r} is scaled by {float(site['scale']):g} in the model and {float(other['scale']):g} "
                "in the guide: a KL weight (the model's beta, the guide's kl_weight, a prior's threshold_beta) "
                "must be given to both; pyro_sparse.train does this"
            )


class Trainer:
    """
    One SVI run of ``model``/``guide`` under ``elbo``.

    :param TrainingSettings settings: learning rates, epochs, batch size,
        warm-up, early stopping, divergence handling.
    :param device: where minibatches go.
    :param torch.Generator generator: draws the minibatch order.
    :param checkpoint: a :class:`~pyro_sparse.infer.checkpoints.Checkpointer`, or ``None``.
    :param strategy: :class:`SingleProcess` (default) or a
        :class:`~pyro_sparse.infer.distributed.DataParallel`.
    """

    def __init__(self, model, guide, elbo, settings=None, device="cpu", generator=None, checkpoint=None,
                 strategy=None):
        self.model, self.guide, self.settings = model, guide, settings or TrainingSettings()
        self.device, self.generator, self.checkpoint = device, generator, checkpoint
        self.strategy = strategy or SingleProcess(model, guide, elbo)
        self.optimizer, self.scheduler = _optimizer(model, guide, self.settings)
        self.hooked = [(prior, guide.unconstrained[name]) for name, prior in model.site_priors.items()]
        self.scheduled = [m for m in (*model.modules(), *guide.modules()) if hasattr(m, "schedule")]
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        self.watched = [t for t in (*params, *model.buffers(), *guide.buffers()) if t.is_floating_point()]
        self.scales_checked = False

    @property
    def _live(self):
        return self.model, self.guide, self.optimizer, self.scheduler, self.generator

    def fit(self, train_data, validation_data=None, resume=None):
        """
        Train on ``train_data`` (a :class:`~pyro_sparse.data.Dataset`) until
        ``max_epochs`` or early stopping, resuming from a
        :class:`~pyro_sparse.infer.checkpoints.Snapshot` if given.  Returns
        the history: per-epoch ``train_loss`` (the objective / N: the full
        -ELBO after the KL warm-up, its KL weighted down during it) and
        ``validation_loss`` (-ELBO per validation point), and ``rollbacks``,
        one ``{"epoch", "step", "reason"}`` per divergence rolled back.
        """
        settings = self.settings
        for prior, param in self.hooked:
            prior.update(param)
        self.loop = checkpoints.LoopState() if resume is None else checkpoints.restore(resume, *self._live)
        if resume is not None and self.strategy.rank > 0:
            # A checkpoint holds rank 0's random streams: each other rank derives its own from them.
            torch.manual_seed(int(torch.randint(2**62, ())) + self.strategy.rank)
        self.last_good = checkpoints.capture(self.loop, *self._live)  # restored after a divergence
        self.batch_size = min(settings.batch_size, train_data.num_data)
        self.steps_per_epoch = math.ceil(train_data.num_data / self.batch_size)
        self.warmup_steps = max(1.0, settings.warmup_epochs * self.steps_per_epoch)
        bar = tqdm(total=settings.max_epochs, initial=self.loop.epoch, disable=not settings.progress, desc="epochs")
        self.throughput = Throughput(bar)
        try:
            # A run resumed from the checkpoint of one that stopped early has nothing left to train.
            while self.loop.epoch < settings.max_epochs and not self._patience_spent():
                if not self._epoch(train_data):
                    continue  # rolled back: the epoch starts again
                bar.update()
                if self._end_epoch(train_data, validation_data):
                    break
        finally:
            bar.close()
        self._finish()
        return self.loop.history

    def _epoch(self, data):
        """One pass over ``data``; False if it diverged and was rolled back."""
        self.model.train()
        self.guide.train()
        self.epoch_loss, self.num_steps = 0.0, 0
        try:
            for batch, weight in self.strategy.batches(data, self.batch_size, self.generator, self.device):
                self._step(batch, weight, data.num_data)
                # Rows of the global batch (the last may be short), also when this process took a slice.
                self.throughput.add(min(self.batch_size, data.num_data - (self.num_steps - 1) * self.batch_size))
        except TrainingDivergedError as error:
            self._on_divergence(error)
            return False
        return True

    def _step(self, batch, weight, num_data):
        loop = self.loop
        if not self.scales_checked:  # on the first batch: no extra read of the data
            check_site_scales(self.model, self.guide, batch)
            self.scales_checked = True
        for module in self.scheduled:
            module.schedule(loop.step / self.steps_per_epoch, loop.step)
        self.optimizer.zero_grad(set_to_none=True)
        warmup = min(1.0, (loop.step + 1) / self.warmup_steps)
        with scale_local_latents(warmup):
            loss = weight * self._differentiable_loss(batch, num_data)
        self._check_spike(loss.item(), warmup)
        loss.backward()
        for prior, param in self.hooked:
            prior.before_step(param)
        self.optimizer.step()
        loop.step += 1
        for prior, param in self.hooked:
            step_sizes, group_lr = adam_step_sizes(self.optimizer, param)
            prior.after_step(param, step_sizes, group_lr, strength=warmup)
        self._check_finite(self.watched, "a parameter")
        self.epoch_loss += loss.item()
        self.num_steps += 1

    def _differentiable_loss(self, batch, num_data):
        try:
            loss = self.strategy.loss(batch.x, num_data, **batch.kwargs)
        except ValueError as error:
            # Finite but huge parameters overflow inside the networks; the first
            # to notice is a distribution's argument check.
            if "found invalid values" not in str(error):
                raise
            check = str(error).split(", but found")[0]
            raise self._diverged(f"a distribution got arguments outside its support ({check})") from None
        self._check_finite([loss], "the loss")
        return loss

    def _check_spike(self, loss, warmup):
        """A step loss above ``spike_factor`` x the running median after the KL warm-up is a divergence."""
        factor = self.settings.checkpointing.spike_factor
        if factor is None:
            return
        recent = self.loop.recent_losses  # in the loop state: a resumed or rolled-back run judges as it would have
        if warmup < 1:
            recent.clear()
            return
        loss = self.strategy.mean(loss)  # every rank judges the same loss, so all roll back together
        if len(recent) >= SPIKE_WINDOW:
            median = float(np.median(recent[-SPIKE_WINDOW:]))
            if loss > median + (factor - 1) * abs(median):
                raise self._diverged(f"loss spike: {loss:.4g} > {factor:g} x the running median {median:.4g}")
        recent.append(loss)
        del recent[:-SPIKE_WINDOW]

    def _diverged(self, what):
        where = f"epoch {self.loop.epoch}, step {self.loop.step}"
        return TrainingDivergedError(f"training diverged at {where}: {what}", reason=what)

    def _check_finite(self, tensors, what):
        # One device sync for all tensors.
        if not torch.stack([torch.isfinite(t).all() for t in tensors]).all():
            raise self._diverged(f"{what} became NaN/inf")

    def _end_epoch(self, train_data, validation_data):
        """Record the epoch's losses, take a snapshot, checkpoint; True to stop early."""
        loop, strategy = self.loop, self.strategy
        self.scheduler.step()
        loop.history["train_loss"].append(strategy.mean(self.epoch_loss) / self.num_steps / train_data.num_data)
        if validation_data is not None:
            self._validate(validation_data)
        loop.epoch += 1
        stop = self._patience_spent()
        self.last_good = checkpoints.capture(loop, *self._live)
        every = self.checkpoint.every if self.checkpoint is not None else None
        if every is not None and (stop or loop.epoch == self.settings.max_epochs or loop.epoch % every == 0):
            self.checkpoint.save(self.last_good)
        return stop

    def _patience_spent(self):
        patience = self.settings.schedule.early_stopping
        return bool(patience) and self.loop.epochs_without_improvement >= patience

    def _validate(self, validation_data):
        loop = self.loop
        self.model.eval()
        self.guide.eval()
        loss = self.strategy.mean(
            # Each rank its own fixed draws, so that the mean over ranks averages independent ones.
            mean_negative_elbo(self.model, self.guide, validation_data, self.batch_size, self.device,
                               self.settings.seed + self.strategy.rank)
        )
        loop.history["validation_loss"].append(loss)
        if loss < loop.best_loss:
            loop.best_loss = loss
            keep = self.settings.schedule.early_stopping
            loop.best_state = copy.deepcopy((self.model.state_dict(), self.guide.state_dict())) if keep else None
            loop.epochs_without_improvement = 0
        else:
            loop.epochs_without_improvement += 1

    def _on_divergence(self, error):
        """Roll back to the last good epoch with halved learning rates, or stop there and raise."""
        policy = self.settings.checkpointing
        if policy.on_divergence == "raise" or self.loop.rollbacks >= policy.max_rollbacks:
            advice = (
                "lower lr, check the data, or pass checkpointing=Checkpointing(on_divergence='rollback')"
                if policy.on_divergence == "raise"
                else f"{policy.max_rollbacks} rollbacks with halved learning rates did not help; lower lr or "
                "check the data"
            )
            raise self._stop_at_last_good(error, advice) from None
        halved = [group["lr"] / 2 for group in self.optimizer.param_groups]
        rollbacks = self.last_good.config["loop"]["rollbacks"] + 1
        event = {"epoch": self.loop.epoch, "step": self.loop.step, "reason": error.reason}
        self.loop = checkpoints.restore(self.last_good, *self._live)
        self.loop.rollbacks = rollbacks
        self.loop.history.setdefault("rollbacks", []).append(event)  # older checkpoints lack the key
        # Fresh draws for the retried epoch: replaying the restored ones would replay a loss that one
        # unlucky draw of the codes caused.  Derived from the restored state, so a run stays reproducible.
        torch.manual_seed(int(torch.randint(2**62, ())) + rollbacks)
        for group, halved_lr in zip(self.optimizer.param_groups, halved):
            group["lr"] = halved_lr
        warnings.warn(
            f"{error}; rolled back to {_completed(self.loop.epoch)}, halved the learning rates to "
            f"{halved} and drew fresh noise (rollback {rollbacks} of {policy.max_rollbacks})",
            stacklevel=4,
        )
        self.last_good = checkpoints.capture(self.loop, *self._live)

    def _stop_at_last_good(self, error, advice):
        """Put the run back to the last good epoch (saved, if checkpointing) and return the error to raise."""
        self.loop = checkpoints.restore(self.last_good, *self._live)
        saved = ""
        if self.checkpoint is not None and self.checkpoint.save(self.last_good):
            saved = f" and saved in the checkpoint {str(self.checkpoint.path)!r}"
        best = ""
        if self.settings.schedule.early_stopping and self.loop.best_state is not None:
            losses = self.loop.history["validation_loss"]
            best = (f"; the model returned is the best validation epoch's, epoch {losses.index(min(losses))} "
                    "(early stopping)")
        self._finish()
        return TrainingDivergedError(
            f"{error}; {advice}. The run is back at {_completed(self.loop.epoch)}{saved}{best}",
            history=self.loop.history,
        )

    def _finish(self):
        if self.settings.schedule.early_stopping and self.loop.best_state is not None:
            self.model.load_state_dict(self.loop.best_state[0])
            self.guide.load_state_dict(self.loop.best_state[1])
        self.model.eval()
        self.guide.eval()


def fit(model, guide, elbo, train_data, *, validation_data=None, settings=None, device="cpu", generator=None,
        checkpoint=None, resume=None, strategy=None):
    """
    Fit ``model``/``guide`` by SVI on ``train_data`` and return the loss
    history; see :class:`Trainer` for the arguments.
    """
    trainer = Trainer(model, guide, elbo, settings, device, generator, checkpoint, strategy)
    return trainer.fit(train_data, validation_data, resume)
