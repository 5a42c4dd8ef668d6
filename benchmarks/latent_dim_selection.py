"""
Choosing K by seed stability (issue 18).  On each data seed of a synthetic
generator (settings of ``synthetic_recovery.py``: its data, network, epochs
and the model "sparse VAE, learned R, 2 sparse restarts"), runs
:func:`pyro_sparse.choose_latent_dim` with ``SparseVAE(n_init=...)`` over the
candidate K and scores the kept fit at every K against the truth: how often
the rule picks the true number of factors, and whether the chosen fit's seed
stability, recovery (matched |corr| of its codes with the true factors, over
the true factors; DCI; F(W)) and heldout NLL beat the generator's fixed K of
``synthetic_recovery.py`` (8 on the second generator, 5 on Eq. 9).  Where K
is below the number of true factors, the missing factors are scored as
constant codes with empty columns of W (all their entries missed).

The stability at the chosen K is the largest of several noisy estimates, so
it is biased upwards; ``--fresh`` refits the K an earlier run chose on each
data seed with ``n_init`` new initialisation seeds and reports their
stability and the kept fit's scores, an estimate free of that selection.

The candidates are fitted in parallel (``--jobs``, one thread each); data
seeds one after another.  Writes ``latent_dim_selection_<generator>.{json,md}``
(``--fresh``: ``..._fresh.{json,md}``)::

    python benchmarks/latent_dim_selection.py --generator correlated --levels 0.8 --seeds 3
    python benchmarks/latent_dim_selection.py --generator correlated --fresh
    python benchmarks/latent_dim_selection.py --generator eq9 --levels 0.8 --seeds 5 --candidates 2,3,4,5
"""

import argparse
import json
import os

import numpy as np
from scipy.optimize import linear_sum_assignment
from synthetic_recovery import MODELS, SETTINGS, SPARSE_RESTARTS_2, correlated_split, synthetic_split

import pyro_sparse
from pyro_sparse import evaluation

TRUE_FACTORS = {"eq9": 2, "correlated": 6}
CANDIDATES = {"eq9": "2,3,4,5", "correlated": "5,6,7,8"}


def truth_recovery(z, true_z):
    """Hungarian-matched |corr| of codes with the true factors, summed and divided by the number of true factors."""
    k = true_z.shape[1]
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = np.nan_to_num(np.abs(np.corrcoef(z.T, true_z.T)[: z.shape[1], z.shape[1]:]))  # constant codes: 0
    rows, columns = linear_sum_assignment(corr, maximize=True)
    return float(corr[rows, columns].sum() / k)


def _split(generator, level, data_seed):
    if generator == "eq9":
        return synthetic_split(level, data_seed)
    return correlated_split(level, data_seed, "gaussian")


def _estimator(data_seed, n_init, epochs, first_seed=0):
    """The benchmark's model; initialisation seeds data_seed * 100 + first_seed, + 1, ..."""
    _, hyper = MODELS[SPARSE_RESTARTS_2]
    return pyro_sparse.SparseVAE(
        hidden_dims=(50, 50, 50), lr=0.01, batch_size=100, max_epochs=epochs, n_init=n_init,
        random_state=data_seed * 100 + first_seed, model_options=hyper,
    )


def run_seed(generator, level, data_seed, candidates, n_init, epochs, jobs):
    """choose_latent_dim on one data seed; one row per candidate K, scored against the truth."""
    train, test = _split(generator, level, data_seed)
    choice = pyro_sparse.choose_latent_dim(_estimator(data_seed, n_init, epochs), train.X, candidates, n_jobs=jobs)
    return [{**row, **scores(choice.estimators[row["latent_dim"]].fitted_, test), "generator": generator,
             "level": level, "data_seed": data_seed, "chosen": row["latent_dim"] == choice.latent_dim}
            for row in choice.table]


def fresh(chosen, n_init, epochs, jobs):
    """
    The chosen K of each (generator, level, data seed) refitted with n_init
    initialisation seeds the choice did not use (data_seed * 100 + n_init, ...).
    """
    from joblib import Parallel, delayed

    def refit(row):
        train, test = _split(row["generator"], row["level"], row["data_seed"])
        estimator = _estimator(row["data_seed"], n_init, epochs, first_seed=n_init)
        estimator.set_params(latent_dim=row["latent_dim"]).fit(train.X)
        stability = estimator.factor_stability_
        return {**{k: row[k] for k in ("generator", "level", "data_seed", "latent_dim")},
                "code_stability": stability.code_correlation, "support_jaccard": stability.support_jaccard,
                "active_factors": len(estimator.active_factors_), **scores(estimator.fitted_, test), "chosen": True}

    return Parallel(n_jobs=jobs)(delayed(refit)(row) for row in chosen)


def scores(fitted, test):
    """A fit's recovery of the truth on the heldout points, and its heldout NLL."""
    z, support = fitted.transform(test.X, kind="mean"), fitted.support_
    missing = test.z.shape[1] - z.shape[1]
    if missing > 0:  # fewer codes than factors: constant codes with empty columns stand for the missing ones
        z = np.hstack([z, np.zeros((len(z), missing))])
        support = np.hstack([support, np.zeros((len(support), missing), dtype=bool)])
    matching = evaluation.match_factors(z, test.z)
    return {
        "truth": truth_recovery(z, test.z), "dci": evaluation.dci_disentanglement(z, test.z),
        "f_score": evaluation.support_f_score(support, test.support, matching),
        "nll": evaluation.heldout_nll(fitted.heldout_log_likelihood(test.X, num_samples=50)),
    }


def _mean(rows, key):
    return float(np.mean([r[key] for r in rows]))


def summary(results, generator, candidates):
    """Markdown: per data seed and K, then the chosen fits against the generator's fixed K."""
    lines = ["| level | data seed | K | chosen | stability (codes) | active | loss | truth | DCI | F(W) | NLL |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(
            f"| {r['level']} | {r['data_seed']} | {r['latent_dim']} | {'**yes**' if r['chosen'] else ''} | "
            f"{r['code_stability']:.3f} | {r['active_factors']} | {r['loss']:.2f} | {r['truth']:.3f} | "
            f"{r['dci']:.3f} | {r['f_score']:.3f} | {r['nll']:.2f} |"
        )
    chosen = [r for r in results if r["chosen"]]
    fixed = [r for r in results if r["latent_dim"] == SETTINGS[generator]["latent_dim"]]
    true_k = [r for r in results if r["latent_dim"] == TRUE_FACTORS[generator]]
    lines += ["", "| | chosen K | true K | fixed K of synthetic_recovery.py |", "|---|---|---|---|"]
    for key, name in [("code_stability", "stability between the n_init fits"), ("truth", "truth recovery"),
                      ("dci", "DCI"), ("f_score", "F(W)"), ("nll", "heldout NLL")]:
        cells = [f"{_mean(rows, key):.3f}" if rows else "–" for rows in (chosen, true_k, fixed)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    picks = [r["latent_dim"] for r in chosen]
    lines += ["", f"Chosen K per data seed: {picks} (true: {TRUE_FACTORS[generator]}; candidates {candidates})."]
    return "\n".join(lines)


def fresh_summary(rows, first):
    """Markdown: the fresh refits of each chosen K beside the choice's own numbers."""
    lines = ["| level | data seed | K | stability: choice's fits / fresh fits | truth | DCI | F(W) | NLL (fresh) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        before = next(c for c in first if (c["level"], c["data_seed"], c["latent_dim"], c["chosen"]) ==
                      (r["level"], r["data_seed"], r["latent_dim"], True))
        lines.append(f"| {r['level']} | {r['data_seed']} | {r['latent_dim']} | {before['code_stability']:.3f} / "
                     f"{r['code_stability']:.3f} | {r['truth']:.3f} | {r['dci']:.3f} | {r['f_score']:.3f} | "
                     f"{r['nll']:.2f} |")
    lines.append(f"| mean | | | {_mean([c for c in first if c['chosen']], 'code_stability'):.3f} / "
                 f"{_mean(rows, 'code_stability'):.3f} | {_mean(rows, 'truth'):.3f} | {_mean(rows, 'dci'):.3f} | "
                 f"{_mean(rows, 'f_score'):.3f} | {_mean(rows, 'nll'):.2f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--generator", choices=sorted(SETTINGS), default="correlated")
    parser.add_argument("--levels", default="0.8", help="comma-separated correlation levels")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--candidates", default=None, help="comma-separated K; default: the generator's")
    parser.add_argument("--n-init", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=None, help="default: the generator's in synthetic_recovery.py")
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--fresh", action="store_true",
                        help="refit the K chosen in the run written to --out with n_init fresh seeds")
    args = parser.parse_args()
    candidates = [int(k) for k in (args.candidates or CANDIDATES[args.generator]).split(",")]
    epochs = args.epochs or SETTINGS[args.generator]["epochs"]
    stem = os.path.join(args.out, f"latent_dim_selection_{args.generator}")
    if args.fresh:
        with open(stem + ".json") as stream:
            first = json.load(stream)
        rows = fresh([r for r in first if r["chosen"]], args.n_init, epochs, args.jobs)
        markdown = (f"# The chosen K refitted with {args.n_init} fresh seeds: `{args.generator}` ({epochs} epochs)\n\n"
                    + fresh_summary(rows, first))
        with open(stem + "_fresh.json", "w") as stream:
            json.dump(rows, stream, indent=1)
        with open(stem + "_fresh.md", "w") as stream:
            stream.write(markdown + "\n")
        print(markdown)
        return
    results = [row for level in (float(v) for v in args.levels.split(",")) for seed in range(args.seeds)
               for row in run_seed(args.generator, level, seed, candidates, args.n_init, epochs, args.jobs)]
    markdown = (f"# Choosing K by seed stability: `{args.generator}` (levels {args.levels}, {args.seeds} data seeds, "
                f"n_init {args.n_init}, {epochs} epochs)\n\n" + summary(results, args.generator, candidates))
    os.makedirs(args.out, exist_ok=True)
    with open(stem + ".json", "w") as stream:
        json.dump(results, stream, indent=1)
    with open(stem + ".md", "w") as stream:
        stream.write(markdown + "\n")
    print(markdown)


if __name__ == "__main__":
    main()
