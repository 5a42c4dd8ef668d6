"""The SVI loop: minibatch gradient steps on -ELBO plus the priors' hooks."""

import copy
import math
import warnings

import torch
from tqdm.auto import tqdm

from pyro_sparse import checkpoints
from pyro_sparse.data import minibatches
from pyro_sparse.evaluation import log_importance_weights
from pyro_sparse.handlers import scale_local_latents


class TrainingDivergedError(RuntimeError):
    """
    The loss or a parameter became NaN or infinite.  ``history`` holds the
    losses up to the last good epoch; :func:`pyro_sparse.train` adds
    ``fitted``, the model as it was then.
    """

    def __init__(self, message, history=None):
        super().__init__(message)
        self.history = history


def _diverged(loop, what):
    return TrainingDivergedError(f"training diverged at epoch {loop.epoch}, step {loop.step}: {what}")


def _check_finite(tensors, what, loop):
    # One device sync for all tensors.
    if not torch.stack([torch.isfinite(t).all() for t in tensors]).all():
        raise _diverged(loop, f"{what} became NaN/inf")


def _differentiable_loss(loss_module, x, num_data, loop):
    try:
        loss = loss_module(x, num_data)
    except ValueError as error:
        # Finite but huge parameters overflow inside the networks; the first
        # to notice is a distribution's argument check.
        if "found invalid values" not in str(error):
            raise
        check = str(error).split(", but found")[0]
        raise _diverged(loop, f"a distribution got arguments outside its support ({check})") from None
    _check_finite([loss], "the loss", loop)
    return loss


def _finish(model, guide, loop, early_stopping):
    if early_stopping and loop.best_state is not None:
        model.load_state_dict(loop.best_state[0])
        guide.load_state_dict(loop.best_state[1])
    model.eval()
    guide.eval()


def _stop_at_last_good(error, advice, last_good, live, checkpoint, early_stopping):
    """Put the run back to ``last_good`` (saved, if checkpointing) and return the error to raise."""
    model, guide = live[:2]
    loop = checkpoints.restore(last_good, *live)
    saved = ""
    if checkpoint is not None:
        checkpoint.save(last_good)
        saved = f" and saved in the checkpoint {str(checkpoint.path)!r}"
    _finish(model, guide, loop, early_stopping)
    return TrainingDivergedError(
        f"{error}; {advice}. The model is back at the end of epoch {loop.epoch}{saved}", history=loop.history
    )


def _roll_back(error, last_good, live, max_rollbacks):
    """Restore ``last_good`` with every learning rate half of what it was when training diverged."""
    optimizer = live[2]
    halved = [group["lr"] / 2 for group in optimizer.param_groups]
    rollbacks = last_good.config["loop"]["rollbacks"] + 1
    loop = checkpoints.restore(last_good, *live)
    loop.rollbacks = rollbacks
    for group, halved_lr in zip(optimizer.param_groups, halved):
        group["lr"] = halved_lr
    warnings.warn(
        f"{error}; rolled back to the end of epoch {loop.epoch} and halved the learning rates to {halved} "
        f"(rollback {rollbacks} of {max_rollbacks})",
        stacklevel=3,
    )
    return loop


class ELBOLoss(torch.nn.Module):
    """-ELBO of ``model``/``guide`` as one module (which DDP can wrap to all-reduce the gradients of both)."""

    def __init__(self, model, guide, elbo):
        super().__init__()
        self.model = model
        self.guide = guide
        self.elbo = elbo

    def forward(self, x, num_data):
        return self.elbo.differentiable_loss(self.model, self.guide, x, num_data)


class SingleProcess:
    """
    Training in one process: whole minibatches and the plain -ELBO.  The
    interface of :class:`~pyro_sparse.distributed.DataParallel`.
    """

    def __init__(self, model, guide, elbo):
        self.loss = ELBOLoss(model, guide, elbo)

    def batches(self, matrix, batch_size, generator, device):
        """(minibatch, weight of its loss) pairs for one epoch."""
        for x in minibatches(matrix, batch_size, generator, device):
            yield x, 1.0

    def mean(self, value):
        """The mean of a float over the processes."""
        return value


def _hooked_sites(model, guide):
    """(prior, parameter) pairs whose prior defines fitting hooks (e.g. an EM step)."""
    return [(prior, guide.unconstrained[name]) for name, prior in model.site_priors.items()]


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
def mean_negative_elbo(model, guide, matrix, batch_size, device):
    """-ELBO per data point (one z draw each), without global prior terms."""
    total = 0.0
    for x in minibatches(matrix, batch_size, device=device, shuffle=False):
        total -= log_importance_weights(model, guide, x).sum().item()
    return total / matrix.shape[0]


def fit(
    model,
    guide,
    elbo,
    train_matrix,
    *,
    validation_matrix=None,
    max_epochs=200,
    batch_size=100,
    lr=0.01,
    global_lr=None,
    lr_decay=1.0,
    device="cpu",
    generator=None,
    progress=False,
    early_stopping=None,
    kl_warmup_epochs=0,
    on_divergence="raise",
    max_rollbacks=3,
    checkpoint=None,
    resume=None,
    strategy=None,
):
    """
    Fit ``model``/``guide`` by stochastic variational inference.

    Each step minimises the full-data -ELBO estimated on one minibatch (the
    data plate scales the batch by N / batch size) with Adam over the
    parameters of both modules.  Around each optimizer step the loop calls
    ``before_step`` / ``after_step`` of every prior in ``model.site_priors`` on
    the guide's point estimate of that site (e.g. the SSL proximal step and
    E-step), giving ``after_step`` Adam's per-coordinate step sizes.

    :param float global_lr: Adam learning rate of the point-estimated global
        sites (a dictionary A, a mask W, noise variances); default ``lr``.  A
        linear dictionary learns at a different pace from the networks (the
        thresholded-VSC paper, Appendix D, gives it a 50x larger rate).
    :param float lr_decay: every learning rate is multiplied by this after
        each epoch (Appendix D of the same paper: 0.99).
    :param float kl_warmup_epochs: the KL term of the local codes is weighted
        from 0 up to 1 linearly over this many epochs (Bowman et al. 2016), so
        the decoder learns to use z before the KL can collapse q(z|x) onto
        the prior; the penalties that priors apply in ``after_step`` (the
        SSL's proximal step and zero test) ramp up alike.
    :param int early_stopping: patience in epochs on the validation loss
        (needs ``validation_matrix``); the best state is restored at the end.
    :param str on_divergence: what to do when the loss or a parameter or
        buffer becomes NaN/inf (checked after every step): ``"raise"`` puts
        the modules back to their state at the end of the last good epoch (the
        best one if early stopping) and raises :class:`TrainingDivergedError`;
        ``"rollback"`` goes back to the start of the epoch, halves every
        learning rate and trains on, at most ``max_rollbacks`` times in a run.
    :param checkpoint: a :class:`~pyro_sparse.checkpoints.Checkpointer` that
        saves the run every ``checkpoint.every`` epochs and when it ends.
    :param resume: a :class:`~pyro_sparse.checkpoints.Snapshot` to go on from.
    :param strategy: a :class:`~pyro_sparse.distributed.DataParallel` to train
        on this rank's share of each minibatch with all-reduced gradients;
        default one process (:class:`SingleProcess`).
    :returns: history dict with per-epoch ``train_loss`` (full -ELBO / N) and
        ``validation_loss`` (-ELBO per validation point).
    """
    if early_stopping and validation_matrix is None:
        raise ValueError("early_stopping needs validation data (set validation_fraction > 0)")
    if on_divergence not in ("raise", "rollback"):
        raise ValueError(f"on_divergence must be 'raise' or 'rollback', got {on_divergence!r}")
    params = list({id(p): p for p in (*model.parameters(), *guide.parameters())}.values())
    global_ids = {id(p) for p in guide.unconstrained.values()}
    groups = [
        {"params": [p for p in params if id(p) not in global_ids], "lr": lr},
        {"params": [p for p in params if id(p) in global_ids], "lr": lr if global_lr is None else global_lr},
    ]
    optimizer = torch.optim.Adam([g for g in groups if g["params"]], foreach=True)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, lr_decay)
    if strategy is None:
        strategy = SingleProcess(model, guide, elbo)
    hooked = _hooked_sites(model, guide)
    for prior, param in hooked:
        prior.update(param)
    live = (model, guide, optimizer, scheduler, generator)
    loop = checkpoints.LoopState() if resume is None else checkpoints.restore(resume, *live)
    # Restored after a divergence, and written to the checkpoint file.
    last_good = checkpoints.capture(loop, *live)
    watched = [t for t in (*params, *model.buffers(), *guide.buffers()) if t.is_floating_point()]
    num_data = train_matrix.shape[0]
    steps_per_epoch = math.ceil(num_data / batch_size)
    kl_warmup_steps = max(1.0, kl_warmup_epochs * steps_per_epoch)
    # Modules with training schedules (e.g. a relaxation slope warm-up) define
    # ``schedule(epoch, iteration)``, called before every step with the
    # fractional epoch and the number of steps taken so far.
    scheduled = [m for m in (model, guide) if hasattr(m, "schedule")]
    bar = tqdm(total=max_epochs, initial=loop.epoch, disable=not progress, desc="epochs")
    while loop.epoch < max_epochs:
        model.train()
        guide.train()
        epoch_loss, num_steps = 0.0, 0
        try:
            for x, weight in strategy.batches(train_matrix, batch_size, generator, device):
                for module in scheduled:
                    module.schedule(loop.step / steps_per_epoch, loop.step)
                optimizer.zero_grad(set_to_none=True)
                warmup = min(1.0, (loop.step + 1) / kl_warmup_steps)
                with scale_local_latents(warmup):
                    loss = weight * _differentiable_loss(strategy.loss, x, num_data, loop)
                loss.backward()
                for prior, param in hooked:
                    prior.before_step(param)
                optimizer.step()
                loop.step += 1
                for prior, param in hooked:
                    step_sizes, group_lr = adam_step_sizes(optimizer, param)
                    prior.after_step(param, step_sizes, group_lr, strength=warmup)
                _check_finite(watched, "a parameter", loop)
                epoch_loss += loss.item()
                num_steps += 1
        except TrainingDivergedError as error:
            if on_divergence == "raise" or loop.rollbacks >= max_rollbacks:
                bar.close()
                advice = (
                    "lower lr, check the data, or pass on_divergence='rollback'"
                    if on_divergence == "raise"
                    else f"{max_rollbacks} rollbacks with halved learning rates did not help; "
                    "lower lr or check the data"
                )
                raise _stop_at_last_good(error, advice, last_good, live, checkpoint, early_stopping) from None
            loop = _roll_back(error, last_good, live, max_rollbacks)
            last_good = checkpoints.capture(loop, *live)
            continue
        scheduler.step()
        loop.history["train_loss"].append(strategy.mean(epoch_loss) / num_steps / num_data)
        if validation_matrix is not None:
            model.eval()
            guide.eval()
            validation_loss = strategy.mean(mean_negative_elbo(model, guide, validation_matrix, batch_size, device))
            loop.history["validation_loss"].append(validation_loss)
            if validation_loss < loop.best_loss:
                loop.best_loss = validation_loss
                loop.best_state = copy.deepcopy((model.state_dict(), guide.state_dict())) if early_stopping else None
                loop.epochs_without_improvement = 0
            else:
                loop.epochs_without_improvement += 1
        loop.epoch += 1
        bar.update()
        stop = bool(early_stopping) and loop.epochs_without_improvement >= early_stopping
        last_good = checkpoints.capture(loop, *live)
        if checkpoint is not None and (stop or loop.epoch == max_epochs or loop.epoch % checkpoint.every == 0):
            checkpoint.save(last_good)
        if stop:
            break
    bar.close()
    _finish(model, guide, loop, early_stopping)
    return loop.history
