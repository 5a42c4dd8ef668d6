"""
Data-parallel training over :mod:`torch.distributed`.

Every process (rank) holds the whole data set (in memory, or the same file
on disk) and the same modules.  Each epoch all ranks draw the same
permutation (the minibatch generator has the same seed everywhere; for data
on disk, shuffled blocks of rows: :mod:`pyro_sparse.data.backed`), cut it
into the global batches of ``batch_size`` rows a
single process would take, and rank ``r`` takes the ``r``-th of
``world_size`` near-equal slices of each: the data of
:class:`torch.utils.data.DistributedSampler` with ``set_epoch``, but with the
single-process step count.  :class:`~torch.nn.parallel.DistributedDataParallel`
averages the gradients, so every rank takes the same Adam step from the same
parameters, and the priors' hooks (the SSL proximal step and E-step on the
point-estimated W) see identical W and stay identical without communication.

Only the Monte-Carlo draws of the local codes differ from a single process:
each rank draws for its own rows from its own random stream.
"""

import contextlib
import inspect
import math
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from pyro_sparse.infer.loop import ELBOLoss
from pyro_sparse.nn.networks import rows_uncounted

_TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def init_process_group(device):
    """
    Join the process group that torchrun describes in its environment
    variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``;
    ``LOCAL_RANK`` picks the GPU) with NCCL on CUDA and gloo on CPU, unless
    the caller has already initialised one.  Returns this rank's device.
    """
    if device.type == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if local_rank >= torch.cuda.device_count():
            raise ValueError(
                f"strategy='ddp' on CUDA runs one process per GPU, but this is local rank {local_rank} and the "
                f"machine has {torch.cuda.device_count()} GPU(s); launch torchrun with "
                f"--nproc_per_node={torch.cuda.device_count()}, or train with device='cpu'"
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        missing = [name for name in _TORCHRUN_VARIABLES if name not in os.environ]
        if missing:
            raise ValueError(
                f"strategy='ddp' needs the process group that torchrun describes, but {', '.join(missing)} "
                "are not set; launch with `torchrun --nproc_per_node=N -m pyro_sparse train ...` "
                "(or torchrun on your script), or call torch.distributed.init_process_group first"
            )
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device


def no_buffer_sync(ddp_class):
    """DDP's keyword that turns off the buffer sync at each forward: ``broadcast_buffers`` before torch 2.13."""
    renamed = "forward_sync_buffers" in inspect.signature(ddp_class).parameters
    return {"forward_sync_buffers" if renamed else "broadcast_buffers": False}


def num_processes():
    """The processes in the group (1 outside one)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main_process():
    """True outside a process group and on rank 0: the process that writes files."""
    return not dist.is_initialized() or dist.get_rank() == 0


class DataParallel:
    """
    The :class:`~pyro_sparse.infer.loop.SingleProcess` interface for one rank:
    this rank's share of each global minibatch, with gradients averaged over
    the ranks by :class:`~torch.nn.parallel.DistributedDataParallel`.  The
    process group must be initialised (:func:`init_process_group`).
    """

    def __init__(self, model, guide, elbo):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        # Construction broadcasts rank 0's parameters and buffers: all ranks start equal.
        # Buffers (the priors' E-step state, input standardisation) then change only
        # through identical computations on identical parameters, so are not re-sent.
        module = ELBOLoss(model, guide, elbo)
        device = next(module.parameters()).device
        no_sync = no_buffer_sync(DistributedDataParallel)
        self.module = DistributedDataParallel(module, device_ids=[device] if device.type == "cuda" else None, **no_sync)
        if "broadcast_buffers" in no_sync:  # before torch 2.13 that also left the buffers out of construction
            for buffer in module.buffers():
                dist.broadcast(buffer, src=0)
        # Distinct local-code draws on each rank (the minibatch generator stays shared).
        torch.manual_seed(torch.initial_seed() + self.rank)
        self._placeholder = False

    def batches(self, data, batch_size, generator, device):
        """
        This rank's slice of each global batch, weighted by
        ``world_size * len(slice) / len(batch)``.  A rank's loss estimates the
        full-data -ELBO from its slice (the data plate scales it by
        N / len(slice)); with these weights the average of the weighted
        gradients over the ranks equals the single-process gradient of the
        global batch, also when the batch does not split evenly.
        """
        order = data.epoch_order(batch_size, generator)
        for start in range(0, data.num_data, batch_size):
            batch = order[start : start + batch_size]
            share = torch.tensor_split(batch, self.world_size)[self.rank]
            weight = self.world_size * len(share) / len(batch)
            # A last batch smaller than world_size: a rank with no rows must still join the
            # all-reduces, so it computes a loss on a placeholder row, weighs it 0 and keeps
            # it out of the batch-norm statistics.
            self._placeholder = len(share) == 0
            yield data.rows((batch[:1] if self._placeholder else share).numpy(), device), weight
            self._placeholder = False

    def loss(self, x, num_data, **kwargs):
        """
        This rank's -ELBO, or NaN on every rank when any rank's loss failed
        (an argument error or NaN/inf), so that all ranks stop or roll back at
        the same step instead of waiting for each other in the all-reduce.
        """
        try:
            with rows_uncounted() if self._placeholder else contextlib.nullcontext():
                loss = self.module(x, num_data, **kwargs)
        except ValueError:
            self._all_finite(torch.tensor(math.nan))
            raise
        return loss if self._all_finite(loss.detach()) else loss + math.nan

    def mean(self, value):
        total = torch.tensor([float(value)], dtype=torch.float64, device=self._reduce_device)
        dist.all_reduce(total)
        return total.item() / self.world_size

    def _all_finite(self, value):
        finite = torch.isfinite(value).all().to(self._reduce_device, torch.int32).reshape(1)
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        return bool(finite.item())

    @property
    def _reduce_device(self):
        # NCCL reduces CUDA tensors only.
        return next(self.module.parameters()).device
