"""
Informative mask priors from gene sets (issue 19, item 4): does an annotation
with errors, given to ``mask_prior="gene_sets"``, recover the true supports of
a sparse nonlinear decoder, and are its wrong memberships flagged at the
stated FDR?

Data: :func:`pyro_sparse.data.synthetic.synthetic_gene_set_counts`, negative
binomial counts of ``--cells`` cells x ``--genes`` genes from ``--sets``
annotated factors plus one unannotated, each driving 20 genes; in each set
20 % of the annotated memberships are wrong and 20 % of the true members are
missing.  The size factors are registered as the observed library
(``setup_anndata(size_factor_key=...)``).  Per seed:

* ``gene_sets``: ``ssl_dgm`` with ``mask_prior="gene_sets"`` (the sets plus
  one free factor); the support is E[γ_jk] > 0.5, column k is set k (no
  matching).  The wrong memberships flagged are the removals that
  ``fitted.gene_set_changes(adata, fdr=FDR)`` calls (Newton et al. 2004's
  Bayesian FDR rule over all annotated memberships, on the posterior
  probability that |w_jk| exceeds the prior's spike/slab crossing): their
  precision and recall against the truly wrong ones, the realised FDR
  (1 - precision) beside the stated FDR and the list's posterior expected
  FDR; likewise the additions it calls (missing members found).
* ``ssl``: the Spike-and-Slab Lasso prior without the annotation (the same K);
  its columns are matched to the true factors by the Hungarian algorithm on
  the overlap of supports (an oracle matching that favours the baseline).

The F score of the annotated factors' supports is 2TP / (2TP + FP + FN) over
the (gene, set) entries; the annotation itself scores 0.8 by construction.
Target: F >= 0.9 with the gene sets.  Adam's step is ``--lr 3e-3``: of 1e-2 (the
``ssl_dgm`` default, Table 6's synthetic setting), 3e-3 and 1e-3 it gave the
lowest training loss (seed 0: 599, 588, 593 after 40 epochs); at 1e-2 whole
set columns die early (seed 2: every set emptied).  The prior's spike rate λ0 = 20 was
chosen on seed 0 against 50 (F 0.91 vs 0.83) and checked on seeds 3-5
(``--first-seed 3``; ``--lambda0`` to compare).  Writes ``gene_set_prior.json`` /
``.md`` to benchmarks/results (``--out``).

    python benchmarks/gene_set_prior.py --seeds 3
    python benchmarks/gene_set_prior.py --quick        # small data, few epochs: a smoke run
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results"
FDR = 0.1
TARGET_F = 0.9


def make_data(seed, cells, genes, sets):
    import anndata
    import pandas as pd

    from pyro_sparse.data.synthetic import synthetic_gene_set_counts
    from pyro_sparse.io.anndata import setup_anndata

    data = synthetic_gene_set_counts(n=cells, num_genes=genes, num_sets=sets, set_size=20 if genes >= 100 else 10,
                                     num_unannotated=1, seed=seed)
    adata = anndata.AnnData(data.X, obs=pd.DataFrame({"size_factor": data.library},
                                                     index=[f"cell{i}" for i in range(cells)]))
    adata.var_names = list(data.feature_names)
    setup_anndata(adata, size_factor_key="size_factor")
    return data, adata


def f_score(estimated, true):
    tp = np.sum(estimated & true)
    return float(2 * tp / (2 * tp + np.sum(estimated & ~true) + np.sum(~estimated & true)))


def oracle_matching(estimated, true):
    """Columns of ``estimated`` for the columns of ``true``, maximising the overlap of supports."""
    from scipy.optimize import linear_sum_assignment

    overlap = (estimated[:, :, None] & true[:, None, :]).sum(0)
    columns, factors = linear_sum_assignment(overlap, maximize=True)
    return columns[np.argsort(factors)]


def fit(adata, prior, data, epochs, seed, hidden_dims, lr, lambda0):
    import pyro_sparse

    num_sets = data.annotation.shape[1]
    options = dict(mask_prior="gene_sets", gene_sets=data.gene_sets(), num_free_factors=1) if prior == "gene_sets" \
        else dict(mask_prior="ssl")
    if prior == "gene_sets" and lambda0 is not None:
        options["lambda0"] = lambda0
    start = time.perf_counter()
    fitted = pyro_sparse.train("ssl_dgm", adata, latent_dim=num_sets + 1, likelihood="negative_binomial",
                               max_epochs=epochs, batch_size=32, lr=lr, seed=seed, progress=False, device="cpu",
                               hidden_dims=hidden_dims, **options)
    return fitted, time.perf_counter() - start


def evaluate(fitted, prior, data, adata, seconds):
    num_sets = data.annotation.shape[1]
    true = data.support[:, :num_sets]
    included = fitted.support_
    result = {"prior": prior, "seconds": seconds, "loss": fitted.history_["train_loss"][-1],
              "f_annotation": f_score(data.annotation, true)}
    if prior != "gene_sets":
        columns = oracle_matching(included, data.support)
        return {**result, "f_sets": f_score(included[:, columns[:num_sets]], true),
                "f_all": f_score(included[:, columns], data.support)}
    estimated = included[:, :num_sets]
    wrong = data.annotation & ~true
    missing = ~data.annotation & true
    changes = fitted.gene_set_changes(adata, fdr=FDR)
    genes, sets = list(data.feature_names), list(data.set_names)

    def called(change):
        table = changes[changes["change"] == change]
        calls = np.zeros_like(wrong)
        calls[[genes.index(g) for g in table["gene"]], [sets.index(s) for s in table["set"]]] = True
        return calls, float(table["error_probability"].mean()) if len(table) else 0.0

    flagged, expected_fdr = called("removed")
    added, added_expected_fdr = called("added")
    hits, found = int(np.sum(flagged & wrong)), int(np.sum(added & missing))
    return {
        **result,
        "f_sets": f_score(estimated, true),
        "wrong": int(wrong.sum()), "wrong_removed": int(np.sum(wrong & ~estimated)),
        "missing": int(missing.sum()), "missing_added": int(np.sum(missing & estimated)),
        "false_additions": int(np.sum(estimated & ~data.annotation & ~true)),
        "flagged": int(flagged.sum()), "flagged_wrong": hits,
        "flag_precision": hits / flagged.sum() if flagged.any() else None,
        "flag_recall": hits / wrong.sum(),
        "realised_fdr": 1 - hits / flagged.sum() if flagged.any() else 0.0,
        "expected_fdr": expected_fdr,
        "added_called": int(added.sum()), "added_called_missing": found,
        "added_realised_fdr": 1 - found / added.sum() if added.any() else 0.0,
        "added_expected_fdr": added_expected_fdr,
    }


def summarise(runs):
    def stat(values):
        values = np.asarray([np.nan if v is None else v for v in values], dtype=float)
        return [float(np.nanmean(values)), float(np.nanstd(values))] if np.isfinite(values).any() else [None, None]

    summary = {}
    for prior in ("gene_sets", "ssl"):
        chosen = [r for r in runs if r["prior"] == prior]
        keys = [k for k in chosen[0] if k not in ("seed", "prior")]
        summary[prior] = {k: stat([r[k] for r in chosen]) for k in keys}
    return summary


def fmt(value, digits=2):
    return "–" if value is None or not np.isfinite(value) else f"{value:.{digits}f}"


def write_markdown(path, results):
    s = results["summary"]
    settings = results["settings"]
    lines = [
        f"# Gene-set mask prior (issue 19, item 4): {settings['cells']} cells x {settings['genes']} genes, "
        f"{settings['sets']} sets + 1 unannotated factor, seeds {results['seeds']}, {settings['epochs']} epochs, "
        f"lr {settings['lr']:g}, λ0 {settings['lambda0'] or 'the prior default'}",
        "",
        "Annotation: 20 % of each set's memberships wrong, 20 % of its true members missing (F = 0.8 as given). "
        f"Stated FDR for flagging wrong memberships: {FDR}. Target: F >= {TARGET_F}.",
        "",
        "| seed | prior | F sets | F annotation | wrong removed | missing added | false additions | flagged | "
        "flag precision | flag recall | realised FDR | expected FDR | additions called (missing among them) | "
        "realised / expected FDR of additions | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["runs"]:
        if r["prior"] == "gene_sets":
            lines.append(
                f"| {r['seed']} | gene_sets | {fmt(r['f_sets'])} | {fmt(r['f_annotation'])} | "
                f"{r['wrong_removed']}/{r['wrong']} | {r['missing_added']}/{r['missing']} | {r['false_additions']} | "
                f"{r['flagged']} | {fmt(r['flag_precision'])} | {fmt(r['flag_recall'])} | {fmt(r['realised_fdr'])} | "
                f"{fmt(r['expected_fdr'], 3)} | {r['added_called']} ({r['added_called_missing']}/{r['missing']}) | "
                f"{fmt(r['added_realised_fdr'])} / {fmt(r['added_expected_fdr'], 3)} | {r['seconds']:.0f} |")
        else:
            lines.append(f"| {r['seed']} | ssl (oracle matching) | {fmt(r['f_sets'])} | {fmt(r['f_annotation'])} | "
                         f"– | – | – | – | – | – | – | – | – | – | {r['seconds']:.0f} |")
    g, b = s["gene_sets"], s["ssl"]
    met = g["f_sets"][0] is not None and g["f_sets"][0] >= TARGET_F
    lines += [
        "",
        "| prior | F sets (mean ± sd) | flag precision | flag recall | realised FDR | realised FDR of additions | "
        "seconds per fit |",
        "|---|---|---|---|---|---|---|",
        f"| gene_sets | {fmt(g['f_sets'][0])} ± {fmt(g['f_sets'][1])} | {fmt(g['flag_precision'][0])} | "
        f"{fmt(g['flag_recall'][0])} | {fmt(g['realised_fdr'][0])} (stated {FDR}) | "
        f"{fmt(g['added_realised_fdr'][0])} (stated {FDR}) | {fmt(g['seconds'][0], 0)} |",
        f"| ssl, no annotation | {fmt(b['f_sets'][0])} ± {fmt(b['f_sets'][1])} | – | – | – | – | "
        f"{fmt(b['seconds'][0], 0)} |",
        "",
        f"Target F >= {TARGET_F}: {'met' if met else 'missed'} (mean F {fmt(g['f_sets'][0])}). "
        f"Total wall time {results['wall_seconds']:.0f} s.",
    ]
    path.write_text("\n".join(lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0, help="data seeds first-seed ... first-seed + seeds - 1")
    parser.add_argument("--lambda0", type=float, default=None,
                        help="spike rate of the gene-set prior (default: GeneSetPrior's)")
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--cells", type=int, default=2000)
    parser.add_argument("--genes", type=int, default=200)
    parser.add_argument("--sets", type=int, default=6)
    parser.add_argument("--lr", type=float, default=3e-3,
                        help="Adam's step; 3e-3 gave the lowest training loss of 1e-2, 3e-3, 1e-3 (docstring)")
    parser.add_argument("--quick", action="store_true", help="1 seed, 400 cells x 60 genes, 3 sets, 2 epochs")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.epochs, args.cells, args.genes, args.sets = 1, 2, 400, 60, 3
    hidden_dims = (8,) if args.quick else (32, 32)
    start = time.perf_counter()
    runs = []
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    for seed in seeds:
        data, adata = make_data(seed, args.cells, args.genes, args.sets)
        for prior in ("gene_sets", "ssl"):
            fitted, seconds = fit(adata, prior, data, args.epochs, seed, hidden_dims, args.lr, args.lambda0)
            runs.append({"seed": seed, **evaluate(fitted, prior, data, adata, seconds)})
            print({k: v for k, v in runs[-1].items() if k in ("seed", "prior", "f_sets", "realised_fdr", "seconds")},
                  flush=True)
    results = {
        "settings": {"cells": args.cells, "genes": args.genes, "sets": args.sets, "epochs": args.epochs,
                     "hidden_dims": list(hidden_dims), "batch_size": 32, "lr": args.lr, "lambda0": args.lambda0,
                     "fdr": FDR, "target_f": TARGET_F},
        "seeds": seeds, "runs": runs, "summary": summarise(runs),
        "wall_seconds": time.perf_counter() - start,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "gene_set_prior_quick" if args.quick else "gene_set_prior"
    if args.first_seed and not args.quick:
        stem += f"_seeds{seeds[0]}-{seeds[-1]}"
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=1, allow_nan=False, default=float))
    write_markdown(args.out / f"{stem}.md", results)


if __name__ == "__main__":
    main()
