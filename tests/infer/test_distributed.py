"""Data-parallel training (pyro_sparse.infer.distributed): 2 gloo processes on CPU launched by torchrun."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import pyro_sparse
from pyro_sparse import Hardware, Schedule
from pyro_sparse.data.synthetic import synthetic_sparse_dgm

# 200 points in global batches of 33 (17 + 16 rows on the two ranks, the last
# batch 1 + 1): 7 steps per epoch, 2 epochs.
TINY = dict(latent_dim=3, batch_size=33, hidden_dims=(8,), schedule=Schedule(kl_warmup_epochs=1), max_epochs=2,
            progress=False)

WORKER = textwrap.dedent(
    """
    import os, sys, time
    import torch
    import pyro_sparse
    from pyro_sparse import Checkpointing, Hardware, Schedule
    from pyro_sparse.infer import distributed, loop
    from pyro_sparse.data.synthetic import synthetic_sparse_dgm

    torch.set_num_threads(1)
    out, noise = sys.argv[1], sys.argv[2]
    rank = os.environ["RANK"]
    # "zero_bn": a batch-norm encoder on 199 points, the last global batch one row (rank 1's slice empty).
    n, options = (199, dict(batch_norm=True)) if noise == "zero_bn" else (200, {})
    if noise.startswith("zero"):
        torch.distributions.normal._standard_normal = lambda shape, dtype, device: torch.zeros(
            shape, dtype=dtype, device=device
        )
    else:
        # Rank 1 alone fails at its 6th step (NaN), or its loss spikes at its 12th (the
        # 5th after the warm-up, with a window of 3 steps): both ranks must roll back together.
        loss_of, calls = distributed.ELBOLoss.forward, [0]
        loop.SPIKE_WINDOW = 3

        def failing_on_rank1(self, x, num_data):
            calls[0] += 1
            loss = loss_of(self, x, num_data)
            if rank == "1" and noise == "sampled" and calls[0] == 6:
                return loss * float("nan")
            return loss + 1e7 if rank == "1" and noise == "spike" and calls[0] == 12 else loss

        distributed.ELBOLoss.forward = failing_on_rank1
    X = synthetic_sparse_dgm(n=200, rho=0.3, seed=0).X[:n]
    if noise == "resume":
        # One epoch, then a resume to two: each rank's random state at its first loss after the resume.
        path, states = os.path.join(out, "resumed.pt"), []
        pyro_sparse.train("ssl_dgm", X, hardware=Hardware(strategy="ddp"), device="cpu", seed=0,
                          checkpointing=Checkpointing(path=path), **{**TINY, "max_epochs": 1})
        while not os.path.exists(path):  # rank 1 may finish before rank 0 has written the checkpoint
            time.sleep(0.01)
        forward = distributed.ELBOLoss.forward

        def recording(self, x, num_data):
            states.append(torch.get_rng_state())
            return forward(self, x, num_data)

        distributed.ELBOLoss.forward = recording
        pyro_sparse.train("ssl_dgm", X, hardware=Hardware(strategy="ddp"), device="cpu", seed=0,
                          checkpointing=Checkpointing(path=path, resume_from=path), **TINY)
        torch.save(states[0], os.path.join(out, f"rank{rank}.pt"))
        sys.exit()
    fitted = pyro_sparse.train(
        "ssl_dgm", X, hardware=Hardware(strategy="ddp"), device="cpu", seed=0,
        checkpointing=Checkpointing(path=os.path.join(out, f"checkpoint-rank{rank}.pt"), on_divergence="rollback",
                                    spike_factor=10 if noise == "spike" else None),
        **TINY, **options,
    )
    torch.save(
        {
            "state": {**fitted.model.state_dict(), **fitted.guide.state_dict()},
            "history": fitted.history_,
            "rollbacks": len(fitted.history_["rollbacks"]),
        },
        os.path.join(out, f"rank{rank}.pt"),
    )
    """
)


def torchrun(out, noise):
    """Train on 2 CPU processes; the two ranks' final states and histories, and ``out``."""
    out.mkdir()
    script = out / "worker.py"
    script.write_text(WORKER.replace("TINY", repr(TINY)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run(
        [*command, str(script), str(out), noise], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(2)]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("ddp")


@pytest.fixture(scope="module")
def ranks(tmp):
    return torchrun(tmp / "sampled", "sampled")


def test_ranks_end_identical(ranks):
    # Different data and code draws on each rank, yet all-reduced gradients keep
    # every parameter, and so the SSL prior's proximal step and E-step (η,
    # inclusion probabilities), bit-for-bit equal, also through a rollback
    # after a loss that failed on one rank only.
    rank0, rank1 = ranks
    assert rank0["rollbacks"] == rank1["rollbacks"] == 1
    assert rank0["state"].keys() == rank1["state"].keys()
    different = [key for key in rank0["state"] if not torch.equal(rank0["state"][key], rank1["state"][key])]
    assert not different, f"ranks differ in {different}"
    assert rank0["history"] == rank1["history"]


def test_a_spike_on_one_rank_rolls_back_all_ranks(tmp):
    # Each rank judges the mean loss over the ranks; judging its own would leave
    # rank 0 waiting in the gradient all-reduce while rank 1 rolls back.
    rank0, rank1 = torchrun(tmp / "spike", "spike")
    for rank in (rank0, rank1):
        (event,) = rank["history"]["rollbacks"]
        assert event["step"] == 11 and event["reason"].startswith("loss spike")
    assert rank0["history"] == rank1["history"]
    assert all(torch.equal(rank0["state"][key], rank1["state"][key]) for key in rank0["state"])


def test_ranks_draw_their_own_codes_after_a_resume(tmp):
    # The checkpoint holds rank 0's random streams; restored alone, every rank
    # would draw the same code noise from then on.
    rank0, rank1 = torchrun(tmp / "resume", "resume")
    assert not torch.equal(rank0, rank1)


def test_only_rank0_writes_checkpoints(tmp, ranks):
    assert (tmp / "sampled" / "checkpoint-rank0.pt").exists()
    assert not (tmp / "sampled" / "checkpoint-rank1.pt").exists()


@pytest.mark.parametrize("case", ["zero", "zero_bn"])
def test_matches_single_process(tmp, monkeypatch, case):
    # With every code draw at the posterior mean (standard normal noise 0) the
    # -ELBO is deterministic, so 2 ranks on 17 and 16 rows must take the steps one
    # process takes on the 33-row global batch: the same data, gradients equal up
    # to float32 summation order (measured: at most 2e-6 apart after 14 Adam steps
    # and E-steps; 4e-6 with a last batch of 1 row, where rank 1 weighs its loss 0).
    # It fails when the loss weights are doubled (W moves by 0.05), left at 1 on
    # the uneven slices, or when the ranks draw different permutations; with a
    # batch-norm encoder ("zero_bn") when rank 1's placeholder row for its empty
    # slice of the last batch enters the batch statistics (W moved by 0.02).
    rank0, _ = torchrun(tmp / case, case)
    monkeypatch.setattr(
        torch.distributions.normal, "_standard_normal",
        lambda shape, dtype, device: torch.zeros(shape, dtype=dtype, device=device),
    )
    torch.set_num_threads(1)
    n, options = (199, dict(batch_norm=True)) if case == "zero_bn" else (200, {})
    X = synthetic_sparse_dgm(n=200, rho=0.3, seed=0).X[:n]
    single = pyro_sparse.train("ssl_dgm", X, device="cpu", seed=0, **TINY, **options)
    expected = {**single.model.state_dict(), **single.guide.state_dict()}
    for key, value in expected.items():
        torch.testing.assert_close(rank0["state"][key], value, rtol=1e-4, atol=1e-4, msg=key)
    assert rank0["history"]["train_loss"] == pytest.approx(single.history_["train_loss"], rel=1e-5)


def test_ddp_outside_torchrun_is_a_clear_error(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    X = synthetic_sparse_dgm(n=200, rho=0.3, seed=0).X
    with pytest.raises(ValueError, match="torchrun"):
        pyro_sparse.train("ssl_dgm", X, hardware=Hardware(strategy="ddp"), device="cpu", **TINY)


def test_more_ranks_than_gpus_is_a_clear_error(monkeypatch):
    # torchrun --nproc_per_node=2 on a one-GPU machine: rank 1 has no cuda:1.
    from pyro_sparse.infer.distributed import init_process_group

    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="local rank 1 and the machine has 1 GPU.*--nproc_per_node=1"):
        init_process_group(torch.device("cuda"))


def test_buffer_sync_is_turned_off_under_either_name():
    # torch 2.13 renamed DistributedDataParallel's broadcast_buffers to forward_sync_buffers.
    from torch.nn.parallel import DistributedDataParallel

    from pyro_sparse.infer.distributed import no_buffer_sync

    class Before213:
        def __init__(self, module, device_ids=None, broadcast_buffers=True):
            pass

    assert no_buffer_sync(Before213) == {"broadcast_buffers": False}
    current = "forward_sync_buffers" if torch.__version__ >= "2.13" else "broadcast_buffers"
    assert no_buffer_sync(DistributedDataParallel) == {current: False}
