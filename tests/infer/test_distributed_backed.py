"""
Data-parallel training from a backed .h5ad: 2 gloo processes launched by
torchrun, each reading from disk its slice of every global minibatch.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import pyro_sparse
from pyro_sparse import Schedule
from pyro_sparse.data import backed

anndata = pytest.importorskip("anndata")

HERE = os.path.dirname(os.path.abspath(__file__))
# 300 cells in global batches of 40 (20 + 20 rows on the two ranks, the last 10 + 10): 8 steps an epoch.
TINY = dict(likelihood="negative_binomial", latent_dim=3, batch_size=40, hidden_dims=(8,),
            schedule=Schedule(kl_warmup_epochs=1), max_epochs=2, progress=False, device="cpu", seed=0)


def log_reads(patch):
    """
    With ``patch`` (a pytest MonkeyPatch): blocks of 8 rows in windows of 4
    blocks, every code draw at the posterior mean (the -ELBO is deterministic,
    as in test_distributed), and a record of the minibatch slices read from
    disk and of the bytes read from the first of them on.
    """
    patch.setattr(backed, "BLOCK_BYTES", 400)
    patch.setattr(backed, "WINDOW_BYTES", 1600)
    patch.setattr(backed, "PASS_BYTES", 2000)
    patch.setattr(torch.distributions.normal, "_standard_normal",
                  lambda shape, dtype, device: torch.zeros(shape, dtype=dtype, device=device))
    record, read = {"reads": []}, backed.BackedMatrix.read

    def logged(self, positions, likelihood):
        if len(positions) > 2:  # minibatch slices: building the model reads 2 rows first
            record.setdefault("bytes_before", self.bytes_read)
            record["reads"].append(np.asarray(positions).tolist())
        record["matrix"] = self
        return read(self, positions, likelihood)

    patch.setattr(backed.BackedMatrix, "read", logged)
    return record


WORKER = textwrap.dedent(
    """
    import os, sys, warnings
    import anndata, pytest, torch
    import pyro_sparse
    from pyro_sparse import Hardware

    sys.path.insert(0, HERE)
    from test_distributed_backed import TINY, log_reads

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    out, path = sys.argv[1], sys.argv[2]
    record = log_reads(pytest.MonkeyPatch())
    adata = anndata.read_h5ad(path, backed="r")
    fitted = pyro_sparse.train("ssl_dgm", adata, hardware=Hardware(strategy="ddp"), **TINY)
    torch.save(
        {"state": {**fitted.model.state_dict(), **fitted.guide.state_dict()}, "history": fitted.history_,
         "reads": record["reads"], "bytes": record["matrix"].bytes_read - record["bytes_before"]},
        os.path.join(out, f"rank{os.environ['RANK']}.pt"),
    )
    """
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The two ranks' results; one process's on the same file, its reads, and the file's stored bytes."""
    out = tmp_path_factory.mktemp("ddp_backed")
    rng = np.random.default_rng(0)
    counts = sp.random(300, 12, density=0.4, format="csr", random_state=rng, dtype=np.float32)
    counts.data = np.ceil(6 * counts.data)
    every_cell = sp.csr_matrix((np.ones(300, np.float32), (np.arange(300), np.arange(300) % 12)), counts.shape)
    counts = (counts + every_cell).tocsr()
    path = out / "cells.h5ad"
    anndata.AnnData(X=counts).write_h5ad(path)
    script = out / "worker.py"
    script.write_text(WORKER.replace("HERE", repr(HERE)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run([*command, str(script), str(out), str(path)], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(2)]
    with pytest.MonkeyPatch.context() as patch:
        record = log_reads(patch)
        torch.set_num_threads(1)
        adata = anndata.read_h5ad(path, backed="r")
        single = pyro_sparse.train("ssl_dgm", adata, **TINY)
        adata.file.close()
    return ranks, single, record["reads"], counts.nnz * (4 + 4)


def test_each_rank_reads_its_slice_of_every_global_minibatch(runs):
    (rank0, rank1), _, single_reads, _ = runs
    assert len(rank0["reads"]) == len(rank1["reads"]) == len(single_reads) == 16  # 8 steps, 2 epochs
    for first, second, batch in zip(rank0["reads"], rank1["reads"], single_reads):
        assert first + second == batch  # the sorted global batch, cut in two
        assert len(first) == len(second)


def test_ranks_read_about_their_share_of_the_blocks(runs):
    # One process reads each block once an epoch; a rank reads the blocks its slices need.
    (rank0, rank1), _, _, stored_bytes = runs
    epochs = TINY["max_epochs"]
    assert rank0["bytes"] < epochs * stored_bytes and rank1["bytes"] < epochs * stored_bytes
    assert rank0["bytes"] + rank1["bytes"] < 1.5 * epochs * stored_bytes


def test_matches_one_process_on_the_same_file(runs):
    (rank0, rank1), single, _, _ = runs
    for key, value in rank0["state"].items():
        assert torch.equal(value, rank1["state"][key]), key
    expected = {**single.model.state_dict(), **single.guide.state_dict()}
    for key, value in expected.items():
        torch.testing.assert_close(rank0["state"][key], value, rtol=1e-4, atol=1e-4, msg=key)
    assert rank0["history"]["train_loss"] == pytest.approx(single.history_["train_loss"], rel=1e-5)
