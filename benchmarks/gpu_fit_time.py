"""
What a GPU buys: wall-clock seconds of whole fits on each of ``--devices`` in
the same run, for the count models of ``single_cell_counts.py`` (the sparse
VAE's count defaults and the count VAE, NB likelihood, CITE-seq, the same
80/20 split), with the heldout log-likelihood of every fit so that a faster
device or batch size that trains worse shows.

Devices: ``cpu`` (torch's default number of threads: every core of the
machine), ``cpu1`` (one thread, the setting of the other benchmarks),
``cuda`` and ``cuda+tf32`` (``Hardware(precision="tf32")``).  Each fit runs
with each of ``--batch-sizes`` (the library's default is 100; on a GPU a
user would try larger ones).  A one-epoch fit on 200 cells per device and model
runs first, untimed, so that no row carries the process's or the CUDA
context's start-up; times leave out the heldout evaluation.  One fit per
row, so a row has no spread.

    python benchmarks/gpu_fit_time.py --devices cpu,cuda,cuda+tf32 --batch-sizes 100,500
    python benchmarks/gpu_fit_time.py --quick --devices cpu1      # a smoke run (tests)
"""

import argparse
import json
import time
from pathlib import Path

import torch
from single_cell_counts import LATENT_DIM, MODELS, heldout, load, split

import pyro_sparse
from pyro_sparse import Hardware

RESULTS = Path(__file__).parent / "results"
# --devices name -> (train's device, precision, CPU threads: None for torch's default)
DEVICES = {"cpu": ("cpu", "fp32", None), "cpu1": ("cpu", "fp32", 1), "cuda": ("cuda", "fp32", None),
           "cuda+tf32": ("cuda", "tf32", None)}


def fit(model, adata, device, batch_size, epochs, seed):
    name, options = MODELS[model]
    train_device, precision, threads = DEVICES[device]
    default_threads = torch.get_num_threads()
    torch.set_num_threads(threads or default_threads)
    start = time.perf_counter()
    try:
        fitted = pyro_sparse.train(name, adata, likelihood="negative_binomial", layer="counts",
                                   latent_dim=LATENT_DIM, max_epochs=epochs, batch_size=batch_size, seed=seed,
                                   device=train_device, progress=False, hardware=Hardware(precision=precision),
                                   **options)
        if fitted.device.type == "cuda":
            torch.cuda.synchronize(fitted.device)
        return fitted, time.perf_counter() - start
    finally:
        torch.set_num_threads(default_threads)


def markdown(result):
    settings = result["settings"]
    lines = [f"# Fit time by device: citeseq ({'quick, ' if settings['quick'] else ''}{settings['epochs']} epochs, "
             f"seed {settings['seed']})", "", f"Machine: {result['machine']}", "",
             "| model | device | batch size | wall s | s / epoch | heldout LL | speed-up over `cpu` at that batch |",
             "|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        base = next((other["seconds"] for other in result["rows"] if other["model"] == row["model"]
                     and other["device"] == "cpu" and other["batch_size"] == row["batch_size"]), None)
        speedup = "–" if base is None else f"{base / row['seconds']:.2f}×"
        lines.append(f"| {row['model']} | {row['device']} | {row['batch_size']} | {row['seconds']:.1f} | "
                     f"{row['seconds'] / settings['epochs']:.2f} | {row['heldout_ll']:.1f} | {speedup} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", default="cpu,cuda" if torch.cuda.is_available() else "cpu",
                        help=f"comma-separated, of {', '.join(DEVICES)}")
    parser.add_argument("--models", default="vae,ssl_dgm", help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--batch-sizes", default="100")
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="1,500 cells, 2 epochs")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    devices, models = args.devices.split(","), args.models.split(",")
    if not set(devices) <= set(DEVICES):
        parser.error(f"--devices: unknown {sorted(set(devices) - set(DEVICES))}; use {', '.join(DEVICES)}")
    if not set(models) <= set(MODELS):
        parser.error(f"--models: unknown {sorted(set(models) - set(MODELS))}; use {', '.join(MODELS)}")
    if args.quick:
        args.epochs = 2
    adata, _ = load("citeseq", args.quick)
    train, test = split(adata)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    result = {"settings": vars(args), "machine": f"{gpu}; {torch.get_num_threads()} CPU threads; torch "
              f"{torch.__version__}", "rows": []}
    for device in devices:
        for model in models:
            fit(model, adata[train[:200]], device, 100, 1, args.seed)
    for model in models:
        for batch_size in map(int, args.batch_sizes.split(",")):
            for device in devices:
                fitted, seconds = fit(model, adata[train], device, batch_size, args.epochs, args.seed)
                result["rows"].append({"model": model, "device": device, "batch_size": batch_size,
                                       "seconds": seconds, "heldout_ll": heldout(fitted, adata[test])})
                print(result["rows"][-1], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"gpu_fit_time{'_quick' if args.quick else ''}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    stem.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
