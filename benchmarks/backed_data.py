"""
Data larger than memory (issue 19, item 5): the subsampled sparse VAE
(``ssl_dgm``, ``likelihood="negative_binomial"``, ``feature_subsample_size``)
trained from a backed ``.h5ad`` (``anndata.read_h5ad(path, backed="r")``,
minibatches read from disk by :mod:`pyro_sparse.data.backed`) against the
same model in memory on a 100k-cell subset, in one run on one machine.

Data: negative binomial counts of N cells x G genes (about 5 % non-zero),
cells of 12 types, each type with its own up-regulated genes, library sizes
log-normal; the file is sorted by cell type, as atlases often are, which is
the worst case for reading in blocks.  The benchmark writes it in chunks of
rows (anndata's sparse ``append``), never holding the dense matrix.

Measured, each training in its own process (one thread) so that its peak RSS
(``VmHWM`` in /proc) is its own: the in-memory run, the backed run, the in-memory
run again (the machine is shared: the in-memory throughput is the mean of the
runs before and after).  Each runs ``train`` as a user calls it and is
stopped after ``--steps`` optimizer steps (a full epoch of 1M cells takes
tens of minutes on a shared 2-core CPU); throughput is cells per second over
the steps after the first ``--warmup-steps``.  The backed run's time to its
first step is the streaming pass (feature means and variances, every value
checked) plus the model's construction; a full epoch's wall time is
extrapolated from it and the throughput.  Bytes read are counted by the
reader (values, column indices, row pointers), and by the kernel
(``/proc/self/io``: ``rchar`` all reads, ``read_bytes`` those from storage
rather than the page cache).

Also measured: rows/s of the two ways to read random minibatches (sorted
random rows, one slice each; the shuffled blocks the backed training uses),
and what blocks cost in randomness: the variance over minibatches of the
cell-type composition under the block order, against a uniform permutation.

    python benchmarks/backed_data.py           # 1,000,000 x 2,000 (a 0.9 GB file in --workdir; ~15 minutes)
    python benchmarks/backed_data.py --quick   # 60,000 x 300 with small blocks (~1 minute; the tests run it)
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results"
CELL_TYPES = 12


def programmes(num_genes, rng):
    """Per cell type, the genes' shares of a cell's counts; and each gene's NB inverse dispersion θ."""
    base = rng.lognormal(-1.0, 1.5, num_genes)
    profiles = np.tile(base / base.sum(), (CELL_TYPES, 1))
    for profile in profiles:
        genes = rng.choice(num_genes, num_genes // 13, replace=False)
        profile[genes] *= rng.lognormal(1.5, 0.5, len(genes))
    profiles /= profiles.sum(1, keepdims=True)
    return profiles.astype(np.float32), rng.lognormal(0.0, 0.5, num_genes).astype(np.float32)


def negative_binomial_rows(types, library, profiles, theta, rng):
    """
    NB(mean = library x profile, θ) counts as a CSR matrix.  Only the non-zero
    entries are drawn one by one: P(x = 0) = (θ / (θ + μ))^θ decides which
    entries are non-zero, and the inverse CDF of the zero-truncated NB (by the
    recurrence P(k + 1) = P(k) (k + θ) / (k + 1) · μ / (θ + μ)) gives their values.
    """
    import scipy.sparse as sp

    mean = library[:, None].astype(np.float32) * profiles[types]
    p = mean / (theta + mean)
    p_zero = np.exp(theta * np.log1p(-p))
    u = rng.random(mean.shape, dtype=np.float32)
    rows, cols = np.nonzero(u > p_zero)
    u = (u[rows, cols] - p_zero[rows, cols]).astype(np.float64)  # uniform on the non-zero mass
    th, pp = theta[cols].astype(np.float64), p[rows, cols].astype(np.float64)
    mass = p_zero[rows, cols] * th * pp  # P(1)
    values, cdf = np.ones(len(rows)), mass.copy()
    open_ = np.flatnonzero(u > cdf)
    while open_.size:
        k, before = values[open_], cdf[open_]
        mass[open_] *= (k + th[open_]) / (k + 1) * pp[open_]
        cdf[open_] += mass[open_]
        values[open_] += 1
        # Rounding can leave the summed masses just below u: stop where they no longer grow.
        open_ = open_[(u[open_] > cdf[open_]) & (cdf[open_] > before)]
    return sp.csr_matrix((values.astype(np.float32), (rows, cols)), shape=mean.shape)


def simulate(path, num_cells, num_genes, library, seed, chunk=10_000):
    """Write the counts to ``path`` as an .h5ad, chunk by chunk; cells sorted by type.  Returns a description."""
    import anndata
    import h5py
    import pandas as pd
    from anndata.io import sparse_dataset, write_elem

    rng = np.random.default_rng(seed)
    profiles, theta = programmes(num_genes, rng)
    types = np.sort(rng.integers(CELL_TYPES, size=num_cells))
    obs = pd.DataFrame({"cell_type": pd.Categorical(types.astype(str))}, index=[f"cell{i}" for i in range(num_cells)])
    var = pd.DataFrame(index=[f"gene{j}" for j in range(num_genes)])
    start_time = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # anndata's notes on string indices
        for start in range(0, num_cells, chunk):
            stop = min(num_cells, start + chunk)
            sizes = rng.lognormal(np.log(library), 0.4, stop - start)
            counts = negative_binomial_rows(types[start:stop], sizes, profiles, theta, rng)
            if start == 0:
                anndata.AnnData(X=counts, obs=obs.iloc[:stop], var=var).write_h5ad(path)
                file = h5py.File(path, "r+")
                X = sparse_dataset(file["X"])
            else:
                X.append(counts)
        del file["obs"]
        write_elem(file, "obs", obs)
        nnz = file["X/data"].shape[0]
        file.close()
    return {"cells": num_cells, "genes": num_genes, "nonzero_fraction": nnz / (num_cells * num_genes),
            "file_bytes": os.path.getsize(path), "stored_values": nnz, "write_seconds": time.perf_counter() - start_time}


# ---------------------------------------------------------------- training, one process each


def memory_status(field):
    """
    ``VmRSS`` (now) or ``VmHWM`` (peak) of this process, in bytes; not
    getrusage's ``ru_maxrss``, which a child started by fork and exec inherits from its parent.
    """
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field + ":"))


def io_counters():
    with open("/proc/self/io") as stream:
        return {key: int(value) for key, value in (line.split(": ") for line in stream)}


class Stop(Exception):
    """Raised from inside the training loop once the timed steps are done."""


def child(args):
    """One training run (``--child memory`` or ``backed``); prints its measurements as JSON."""
    import anndata
    import torch

    import pyro_sparse
    from pyro_sparse import Schedule
    from pyro_sparse.data import Dataset, backed
    from pyro_sparse.infer import loop

    torch.set_num_threads(1)
    backed.BLOCK_BYTES, backed.WINDOW_BYTES, backed.PASS_BYTES = args.block_bytes, args.window_bytes, args.pass_bytes
    warnings.simplefilter("ignore")
    io_start, rss_start = io_counters(), memory_status("VmRSS")
    adata = anndata.read_h5ad(args.file, backed="r")
    rss_opened = memory_status("VmRSS")  # obs read: all cells for both runs
    if args.child == "memory":  # every k-th cell, read by rows (anndata's own subsetting reads the whole file)
        cells = np.arange(0, adata.n_obs, adata.n_obs // args.memory_cells)[: args.memory_cells]
        counts = backed.BackedMatrix.of(adata.X, "adata.X").read(cells, "negative_binomial")
        adata = anndata.AnnData(X=counts, obs=adata.obs.iloc[cells], var=adata.var)
    clock, seen = [], {}
    step, epoch, epoch_order = loop.Trainer._step, loop.Trainer._epoch, Dataset.epoch_order

    def timed_epoch(self, data):
        seen["data"] = data
        seen.setdefault("bytes_before_epoch", getattr(data.matrix, "bytes_read", 0))
        return epoch(self, data)

    def kept_order(self, batch_size, generator=None):
        order = epoch_order(self, batch_size, generator)
        seen.setdefault("order", order)  # the first epoch's
        return order

    def timed_step(self, batch, weight, num_data):
        if not clock:
            clock.append((time.perf_counter(), 0))
        step(self, batch, weight, num_data)
        clock.append((time.perf_counter(), clock[-1][1] + len(batch.x)))
        if len(clock) > args.steps:
            raise Stop

    loop.Trainer._step, loop.Trainer._epoch, Dataset.epoch_order = timed_step, timed_epoch, kept_order
    start = time.perf_counter()
    try:
        pyro_sparse.train(
            "ssl_dgm", adata, likelihood="negative_binomial", latent_dim=args.latent, hidden_dims=(args.hidden,),
            batch_size=args.batch, max_epochs=1000, feature_subsample_size=args.subsample,
            feature_subsample_start_epoch=0, device="cpu", progress=False, seed=0, schedule=Schedule(kl_warmup_epochs=0),
        )
    except Stop:
        pass
    end = time.perf_counter()
    (t0, _), (t1, rows1), (t2, rows2) = clock[0], clock[args.warmup_steps], clock[-1]
    data = seen["data"]
    matrix = data.matrix
    if args.child == "backed":  # the rest of the epoch read without training: the bytes of a whole epoch
        start_rest = time.perf_counter()
        for first in range(rows2, data.num_data, args.batch):
            data.rows(seen["order"][first : first + args.batch].numpy())
        rest_seconds = time.perf_counter() - start_rest
    io_end = io_counters()
    result = {
        "kind": args.child, "cells": seen["data"].num_data, "steps": args.steps,
        "throughput": (rows2 - rows1) / (t2 - t1), "seconds_to_first_step": t0 - start, "wall_seconds": end - start,
        "rss_at_start": rss_start, "rss_after_open": rss_opened, "peak_rss": memory_status("VmHWM"),
        "rchar": io_end["rchar"] - io_start["rchar"], "read_bytes": io_end["read_bytes"] - io_start["read_bytes"],
    }
    if args.child == "backed":
        result.update(bytes_first_pass=seen["bytes_before_epoch"], bytes_epoch=matrix.bytes_read -
                      seen["bytes_before_epoch"], rows_in_steps=rows2, rest_of_epoch_read_seconds=rest_seconds,
                      block_rows=matrix.block_rows, window_blocks=matrix.window_blocks,
                      stored_bytes=matrix.store.nnz * matrix.store.bytes_per_value)
    print(json.dumps(result))


def run_child(kind, args):
    command = [sys.executable, __file__, "--child", kind, "--file", str(args.file)]
    for name in ("steps", "warmup_steps", "batch", "latent", "hidden", "subsample", "memory_cells", "block_bytes",
                 "window_bytes", "pass_bytes"):
        command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          check=False)
    if done.returncode:
        raise RuntimeError(f"the {kind} run failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"  {kind:7s} {result['throughput']:8.0f} cells/s  peak RSS {result['peak_rss'] / 2**30:.2f} GiB", flush=True)
    return result


# ---------------------------------------------------------------- reading and randomness


def reading(args):
    """
    Rows/s of sorted random rows (one slice each) and of the block order at
    each block size of ``--block-sweep``, with the block order's cost in
    randomness: the variance over minibatches of their cell-type composition,
    against a uniform permutation, and its prediction 1 + ρ (b - 1) / m.
    """
    import anndata
    import torch

    from pyro_sparse.data import backed

    adata = anndata.read_h5ad(args.file, backed="r")
    types = adata.obs["cell_type"].cat.codes.to_numpy()
    n, batch, rng = len(types), args.batch, np.random.default_rng(0)
    onehot = np.eye(CELL_TYPES)[types]
    uniform = composition_variance(types[torch.randperm(n, generator=torch.Generator().manual_seed(0)).numpy()], batch)

    def rate(matrix, batches):
        matrix.store.indptr  # read once before the clock starts, as training does
        before, start = matrix.bytes_read, time.perf_counter()
        for positions in batches:
            matrix.read(positions, "negative_binomial")
        rows = sum(len(positions) for positions in batches)
        return {"rows_per_second": rows / (time.perf_counter() - start),
                "bytes_per_row": (matrix.bytes_read - before) / rows}

    backed.BLOCK_BYTES, backed.WINDOW_BYTES = args.block_bytes, args.window_bytes
    matrix = backed.BackedMatrix.of(adata.X, "adata.X")
    results = {"random_rows": rate(matrix, [np.sort(rng.choice(n, batch, replace=False))
                                            for _ in range(args.random_batches)]),
               "uniform_composition_variance": uniform, "blocks": []}
    for block_bytes in args.block_sweep:
        backed.BLOCK_BYTES = block_bytes
        matrix = backed.BackedMatrix.of(adata.X, "adata.X")
        order = matrix.epoch_order(batch, torch.Generator().manual_seed(0)).numpy()
        entry = rate(matrix, [order[s : s + batch] for s in range(0, min(n, args.block_rows_timed), batch)])
        # ρ: the share of the cell-type indicators' variance that lies between blocks.
        block_of = np.arange(n) // matrix.block_rows
        sizes = np.bincount(block_of)
        means = np.stack([np.bincount(block_of, onehot[:, t]) / sizes for t in range(CELL_TYPES)], 1)
        rho = float((means[block_of] - onehot.mean(0)).var(0).sum() / onehot.var(0).sum())
        variance = composition_variance(types[order], batch)
        entry.update(block_bytes=block_bytes, block_rows=matrix.block_rows, window_blocks=matrix.window_blocks,
                     rho=rho, composition_variance=variance, variance_ratio=variance / uniform,
                     predicted_ratio=1 + rho * (batch - 1) / matrix.window_blocks)
        results["blocks"].append(entry)
    return results


def composition_variance(types, batch):
    """Summed over cell types, the variance over full minibatches of the share of that type in a minibatch."""
    full = len(types) // batch
    shares = np.stack([np.bincount(types[i * batch : (i + 1) * batch], minlength=CELL_TYPES) / batch
                       for i in range(full)])
    return float(shares.var(0).sum())


# ---------------------------------------------------------------- report


def markdown(results, args):
    data, memory, backed_run, reads = results["data"], results["memory"], results["backed"], results["reading"]
    memory_rate = float(np.mean([run["throughput"] for run in memory]))
    epoch_seconds = backed_run["seconds_to_first_step"] + data["cells"] / backed_run["throughput"]
    gib = 2**30
    lines = [
        f"Simulated NB counts: {data['cells']:,} cells x {data['genes']:,} genes, {data['nonzero_fraction']:.1%} "
        f"non-zero, {CELL_TYPES} cell types (file sorted by type), file {data['file_bytes'] / gib:.2f} GiB, written in "
        f"{data['write_seconds']:.0f} s.  Model: ssl_dgm, negative_binomial, latent_dim {args.latent}, hidden "
        f"({args.hidden},), feature_subsample_size {args.subsample}, batch {args.batch}; one thread, each run in its "
        f"own process, stopped after {args.steps} steps (throughput over steps {args.warmup_steps + 1}-{args.steps}). "
        f"Blocks of {backed_run['block_rows']} rows, {backed_run['window_blocks']} blocks a window.",
        "",
        "| run | cells | cells/s | peak RSS | RSS after imports | time to first step | read by the reader "
        "| rchar | read from storage |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in [memory[0], backed_run, memory[1]]:
        reader = (f"{(run['bytes_first_pass'] + run['bytes_epoch']) / gib:.2f} GiB" if run["kind"] == "backed"
                  else "-")
        lines.append(
            f"| {run['kind']} | {run['cells']:,} | {run['throughput']:,.0f} | {run['peak_rss'] / gib:.2f} GiB | "
            f"{run['rss_at_start'] / gib:.2f} GiB | {run['seconds_to_first_step']:.1f} s | {reader} | "
            f"{run['rchar'] / gib:.2f} GiB | {run['read_bytes'] / gib:.2f} GiB |"
        )
    ratio = backed_run["throughput"] / memory_rate
    lines += [
        "",
        f"* Throughput: backed {backed_run['throughput']:,.0f} cells/s, in memory {memory_rate:,.0f} cells/s (mean of "
        f"the runs before and after): **{ratio:.2f}x** (target >= 0.8x).",
        f"* Peak RSS of the backed run: **{backed_run['peak_rss'] / gib:.2f} GiB** (target <= 4 GiB), of which "
        f"{backed_run['rss_at_start'] / gib:.2f} GiB after the imports (Python, torch, anndata), before the file "
        "was opened.",
        f"* Bytes read: the streaming pass {backed_run['bytes_first_pass'] / gib:.2f} GiB (row pointers and every "
        f"value once) + one epoch {backed_run['bytes_epoch'] / gib:.2f} GiB ({backed_run['rows_in_steps']:,} cells "
        f"trained, the rest of the epoch read without training in {backed_run['rest_of_epoch_read_seconds']:.0f} s); "
        f"the stored values and indices are {backed_run['stored_bytes'] / gib:.2f} GiB: each block read once.",
        f"* Wall time: streaming pass and model construction {backed_run['seconds_to_first_step']:.1f} s; one epoch of "
        f"{data['cells']:,} cells extrapolated to {epoch_seconds / 60:.1f} min (the {args.steps} steps took "
        f"{backed_run['wall_seconds'] - backed_run['seconds_to_first_step']:.0f} s).",
        "",
        f"Reading random minibatches of {args.batch} rows (no training; windows of "
        f"{args.window_bytes / 2**20:.0f} MiB of stored values), and what the block order costs in randomness: the "
        "variance over minibatches of their cell-type composition, against a uniform permutation "
        f"({reads['uniform_composition_variance']:.2e}, summed over types), measured and predicted "
        "(1 + ρ (b - 1) / m, ρ: the share of the cell-type indicators' variance between blocks, m: blocks a window):",
        "",
        "| reader | rows/s | bytes read per row | rows a block | blocks a window | ρ | variance vs uniform | predicted |",
        "|---|---|---|---|---|---|---|---|",
        f"| sorted random rows, one slice each | {reads['random_rows']['rows_per_second']:,.0f} | "
        f"{reads['random_rows']['bytes_per_row']:,.0f} | 1 | - | - | 1 | 1 |",
    ]
    for entry in reads["blocks"]:
        lines.append(
            f"| blocks of {entry['block_bytes'] / 2**10:.0f} KiB | {entry['rows_per_second']:,.0f} | "
            f"{entry['bytes_per_row']:,.0f} | {entry['block_rows']} | {entry['window_blocks']} | {entry['rho']:.2f} | "
            f"{entry['variance_ratio']:.2f} | {entry['predicted_ratio']:.2f} |"
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small file and small blocks, checked against regressions")
    parser.add_argument("--cells", type=int, default=1_000_000)
    parser.add_argument("--genes", type=int, default=2000)
    parser.add_argument("--library", type=float, default=150.0, help="median counts per cell")
    parser.add_argument("--memory-cells", type=int, default=100_000, help="cells of the in-memory run (every k-th)")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--warmup-steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--latent", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--subsample", type=int, default=250)
    parser.add_argument("--block-bytes", type=int, default=2**16, help="pyro_sparse.data.backed.BLOCK_BYTES in training")
    parser.add_argument("--window-bytes", type=int, default=2**27, help="pyro_sparse.data.backed.WINDOW_BYTES")
    parser.add_argument("--pass-bytes", type=int, default=2**25, help="pyro_sparse.data.backed.PASS_BYTES")
    parser.add_argument("--block-sweep", default="16384,65536,262144", help="BLOCK_BYTES values timed when reading")
    parser.add_argument("--random-batches", type=int, default=40, help="batches of sorted random rows timed")
    parser.add_argument("--block-rows-timed", type=int, default=300_000, help="rows of the block order timed")
    parser.add_argument("--workdir", default=None, help="where the .h5ad is written (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the .h5ad (and reuse one there already)")
    parser.add_argument("--out", default=None, help="results name (default backed_data[_quick])")
    parser.add_argument("--child", choices=("memory", "backed"), help=argparse.SUPPRESS)
    parser.add_argument("--file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    if args.quick:
        args.cells, args.genes, args.library, args.memory_cells = 200_000, 300, 150.0, 20_000
        args.steps, args.warmup_steps, args.batch, args.hidden, args.subsample = 60, 10, 256, 32, 50
        args.block_bytes, args.window_bytes, args.pass_bytes = 2**14, 2**20, 2**18
        args.random_batches, args.block_rows_timed = 10, 30_000
        args.block_sweep = "4096,16384,65536"
    args.block_sweep = [int(size) for size in str(args.block_sweep).split(",")]
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="backed_data_"))
    workdir.mkdir(parents=True, exist_ok=True)
    args.file = workdir / f"counts_{args.cells}x{args.genes}.h5ad"
    try:
        if args.keep and args.file.exists():
            data = json.loads(args.file.with_suffix(".json").read_text())
        else:
            print(f"writing {args.file} ...", flush=True)
            data = simulate(args.file, args.cells, args.genes, args.library, seed=0)
            args.file.with_suffix(".json").write_text(json.dumps(data))
        print(f"  {data['file_bytes'] / 2**30:.2f} GiB, {data['nonzero_fraction']:.1%} non-zero, "
              f"{data['write_seconds']:.0f} s", flush=True)
        results = {"data": data, "reading": reading(args)}
        results["memory"] = [run_child("memory", args)]
        results["backed"] = run_child("backed", args)
        results["memory"].append(run_child("memory", args))
    finally:
        if not args.keep:
            shutil.rmtree(workdir) if args.workdir is None else args.file.unlink(missing_ok=True)
    out = args.out or ("backed_data_quick" if args.quick else "backed_data")
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{out}.json").write_text(json.dumps({"settings": settings, "results": results}, indent=1))
    text = markdown(results, args)
    (RESULTS / f"{out}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
