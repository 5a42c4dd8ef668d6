"""The SVI loop: minibatch gradient steps on -ELBO plus the priors' hooks."""

import copy
import math

import torch
from tqdm.auto import tqdm

from pyro_sparse.data import minibatches
from pyro_sparse.evaluation import log_importance_weights
from pyro_sparse.handlers import scale_local_latents


class TrainingDivergedError(RuntimeError):
    """The loss became NaN or infinite."""


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
        the prior.
    :param int early_stopping: patience in epochs on the validation loss
        (needs ``validation_matrix``); the best state is restored at the end.
    :returns: history dict with per-epoch ``train_loss`` (full -ELBO / N) and
        ``validation_loss`` (-ELBO per validation point).
    """
    if early_stopping and validation_matrix is None:
        raise ValueError("early_stopping needs validation data (set validation_fraction > 0)")
    params = list({id(p): p for p in (*model.parameters(), *guide.parameters())}.values())
    global_ids = {id(p) for p in guide.unconstrained.values()}
    groups = [
        {"params": [p for p in params if id(p) not in global_ids], "lr": lr},
        {"params": [p for p in params if id(p) in global_ids], "lr": lr if global_lr is None else global_lr},
    ]
    optimizer = torch.optim.Adam([g for g in groups if g["params"]], foreach=True)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, lr_decay)
    hooked = _hooked_sites(model, guide)
    for prior, param in hooked:
        prior.update(param)
    num_data = train_matrix.shape[0]
    history = {"train_loss": [], "validation_loss": []}
    best = (math.inf, None)
    epochs_without_improvement = 0
    steps_per_epoch = math.ceil(num_data / batch_size)
    kl_warmup_steps = max(1.0, kl_warmup_epochs * steps_per_epoch)
    step = 0
    # Modules with training schedules (e.g. a relaxation slope warm-up) define
    # ``schedule(epoch, iteration)``, called before every step with the
    # fractional epoch and the number of steps taken so far.
    scheduled = [m for m in (model, guide) if hasattr(m, "schedule")]
    for epoch in tqdm(range(max_epochs), disable=not progress, desc="epochs"):
        model.train()
        guide.train()
        epoch_loss, num_steps = 0.0, 0
        for x in minibatches(train_matrix, batch_size, generator, device):
            for module in scheduled:
                module.schedule(step / steps_per_epoch, step)
            optimizer.zero_grad(set_to_none=True)
            try:
                with scale_local_latents(min(1.0, (step + 1) / kl_warmup_steps)):
                    loss = elbo.differentiable_loss(model, guide, x, num_data)
            except ValueError:
                # Non-finite parameters surface as distribution argument errors.
                if all(torch.isfinite(p).all() for p in params):
                    raise
                loss = torch.tensor(float("nan"))
            if not torch.isfinite(loss):
                raise TrainingDivergedError(
                    f"training diverged at epoch {epoch}: the loss or a parameter became NaN/inf; "
                    "lower lr or check the data"
                )
            loss.backward()
            for prior, param in hooked:
                prior.before_step(param)
            optimizer.step()
            step += 1
            for prior, param in hooked:
                step_sizes, group_lr = adam_step_sizes(optimizer, param)
                prior.after_step(param, step_sizes, group_lr)
            epoch_loss += loss.item()
            num_steps += 1
        scheduler.step()
        history["train_loss"].append(epoch_loss / num_steps / num_data)
        if validation_matrix is None:
            continue
        model.eval()
        guide.eval()
        validation_loss = mean_negative_elbo(model, guide, validation_matrix, batch_size, device)
        history["validation_loss"].append(validation_loss)
        if validation_loss < best[0]:
            state = copy.deepcopy((model.state_dict(), guide.state_dict())) if early_stopping else None
            best = (validation_loss, state)
            epochs_without_improvement = 0
        else:
            epochs_without_improvement += 1
            if early_stopping and epochs_without_improvement >= early_stopping:
                break
    if early_stopping and best[1] is not None:
        model.load_state_dict(best[1][0])
        guide.load_state_dict(best[1][1])
    model.eval()
    guide.eval()
    return history
