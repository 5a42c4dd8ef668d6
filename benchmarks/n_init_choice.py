"""
Which of n_init fits to keep, and where the seed instability of issue 18 lies (second generator).

Six fits (``--fits``; initialisation seeds) of the issue's sparse VAE (learned R, two sparse restarts; the
settings of ``synthetic_recovery.py``) per data seed.  Every split of the six into two sets of three
stands for two ``SparseVAE(n_init=3)`` runs; each set keeps one fit by a rule, and the two kept fits'
``code_stability`` (matched ``|corr|`` of codes on heldout points) and support Jaccard are averaged
over the splits.  Rules: the lowest training loss (what ``n_init`` keeps), the medoid (the fit that
agrees most with the other two, on codes or on supports) and, as an oracle, the best F(W).

Then, per true factor: its matched ``|corr|`` with the truth in each fit and between fits, split by
whether the factor has a monotone anchor (a single-parent feature with link z or tanh 2z).  A factor
whose anchors are all even or non-monotone (z² - 1, |z| - E|z|, sin 2z) is identified by its anchors
only up to those links' symmetries.

    python benchmarks/n_init_choice.py --level 0.6 --data-seeds 0,1        # ~20 min on 2 cores
"""

import argparse
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from itertools import combinations

import numpy as np
from scipy.optimize import linear_sum_assignment

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import synthetic_recovery as sr  # noqa: E402

LINK_NAMES = ("z", "sin 2z", "z² - 1", "tanh 2z", "|z| - E|z|")  # pyro_sparse.data.synthetic._LINKS, in order
MONOTONE = {0, 3}


def fit_all(level, data_seeds, fits, epochs, jobs):
    runs = [(sr.SPARSE_RESTARTS_2, "correlated", level, "gaussian", d, d * fits + i, epochs, False)
            for d in data_seeds for i in range(fits)]
    with ProcessPoolExecutor(jobs) as pool:
        return [row for rows in pool.map(sr.run, runs) for row in rows]


def choice_table(group):
    """Per rule: mean code stability, support Jaccard and F(W) of the fits kept from the two sets of each split."""
    from pyro_sparse.evaluation import code_stability

    n = len(group)
    codes, supports = np.eye(n), np.eye(n)
    for i, j in combinations(range(n), 2):
        pair = code_stability([np.asarray(group[k]["codes"]) for k in (i, j)],
                              [np.asarray(group[k]["support"]) for k in (i, j)])
        codes[i, j] = codes[j, i] = pair.code_correlation
        supports[i, j] = supports[j, i] = pair.support_jaccard
    rules = {
        "lowest loss (n_init)": lambda side: min(side, key=lambda i: group[i]["loss"]),
        "medoid of codes": lambda side: max(side, key=lambda i: sum(codes[i, k] for k in side)),
        "medoid of supports": lambda side: max(side, key=lambda i: sum(supports[i, k] for k in side)),
        "best F(W) (oracle)": lambda side: max(side, key=lambda i: group[i]["f_score"]),
    }
    splits = [(a, tuple(i for i in range(n) if i not in a)) for a in combinations(range(n), n // 2) if 0 in a]
    rows = {"one fit": (codes[np.triu_indices(n, 1)].mean(), supports[np.triu_indices(n, 1)].mean(),
                        np.mean([r["f_score"] for r in group]))}
    for name, rule in rules.items():
        kept = [(rule(a), rule(b)) for a, b in splits]
        rows[name] = (np.mean([codes[i, j] for i, j in kept]), np.mean([supports[i, j] for i, j in kept]),
                      np.mean([group[i]["f_score"] for pair in kept for i in pair]))
    return rows


def factor_table(group, level, data_seed):
    """Per true factor: its anchors' links, matched |corr| with the truth (min, mean) and between fits."""
    from pyro_sparse.data import synthetic

    _, heldout = sr.correlated_split(level, data_seed, "gaussian")
    num_factors = heldout.z.shape[1]
    # The generator's map, drawn as synthetic_correlated_factors draws it; checked against its support.
    structure = np.random.default_rng([synthetic._map_seed(data_seed), 0])
    synthetic.random_correlation(num_factors, level, structure)
    support = synthetic._random_support(heldout.X.shape[1], num_factors, 2, 3, structure)
    links = structure.integers(len(LINK_NAMES), size=support.shape)
    assert np.array_equal(support, np.asarray(heldout.support)), "the generator's map is drawn differently now"
    truth, matched = [], []
    for run in group:
        z = np.asarray(run["codes"])  # on the heldout points (the second generator's shared points)
        corr = np.nan_to_num(np.abs(np.corrcoef(z.T, heldout.z.T)[: z.shape[1], z.shape[1]:]))
        rows, factors = linear_sum_assignment(-corr)
        per_factor, column = np.zeros(num_factors), np.zeros(num_factors, int)
        per_factor[factors], column[factors] = corr[rows, factors], rows
        truth.append(per_factor)
        matched.append(z[:, column])
    truth = np.array(truth)
    out = []
    for k in range(num_factors):
        anchors = [j for j in np.flatnonzero(support[:, k]) if support[j].sum() == 1]
        between = np.nanmean([abs(np.corrcoef(matched[i][:, k], matched[j][:, k])[0, 1])
                              for i, j in combinations(range(len(group)), 2)])
        out.append({"data_seed": data_seed, "factor": k, "anchors": [LINK_NAMES[links[j, k]] for j in anchors],
                    "monotone_anchor": any(links[j, k] in MONOTONE for j in anchors),
                    "truth_min": float(truth[:, k].min()), "truth_mean": float(truth[:, k].mean()),
                    "between_fits": float(between)})
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--level", type=float, default=0.6)
    parser.add_argument("--data-seeds", default="0,1")
    parser.add_argument("--fits", type=int, default=6, help="initialisation seeds per data seed (even, >= 4)")
    parser.add_argument("--epochs", type=int, default=sr.SETTINGS["correlated"]["epochs"])
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    data_seeds = [int(seed) for seed in args.data_seeds.split(",")]
    if args.fits < 4 or args.fits % 2:
        parser.error("--fits must be even and at least 4 (two sets of at least two fits)")
    runs = fit_all(args.level, data_seeds, args.fits, args.epochs, args.jobs)
    lines = [f"# Which n_init fit to keep: second generator, level {args.level}, data seeds {args.data_seeds}, "
             f"{args.fits} fits each, {args.epochs} epochs ({sr.SPARSE_RESTARTS_2})", "",
             f"Stability between the fits two `n_init = {args.fits // 2}` runs keep (all splits of the {args.fits} "
             "fits), by rule:", "",
             "| data seed | rule | code stability | support Jaccard | F(W) of kept fits |", "|---|---|---|---|---|"]
    factors = []
    for seed in data_seeds:
        group = [run for run in runs if run["data_seed"] == seed]
        for rule, (codes, supports, f_score) in choice_table(group).items():
            lines.append(f"| {seed} | {rule} | {codes:.3f} | {supports:.3f} | {f_score:.3f} |")
        factors += factor_table(group, args.level, seed)
    lines += ["", f"Per true factor ({args.fits} fits): matched |corr| with the truth and between fits.", "",
              "| data seed | factor | anchors' links | monotone anchor | truth min | truth mean | between fits |",
              "|---|---|---|---|---|---|---|"]
    for f in factors:
        anchors = ", ".join(f["anchors"]).replace("|", "\\|")  # |z| inside a table cell
        lines.append(f"| {f['data_seed']} | {f['factor']} | {anchors} | {'yes' if f['monotone_anchor'] else 'no'} | "
                     f"{f['truth_min']:.2f} | {f['truth_mean']:.2f} | {f['between_fits']:.2f} |")
    for monotone in (True, False):
        chosen = [f for f in factors if f["monotone_anchor"] == monotone]
        if chosen:
            lines.append(f"\n{'With' if monotone else 'Without'} a monotone anchor: {len(chosen)} factors, truth "
                         f"|corr| {np.mean([f['truth_mean'] for f in chosen]):.3f}, between fits "
                         f"{np.mean([f['between_fits'] for f in chosen]):.3f}.")
    sr.write_results(os.path.join(args.out, f"n_init_choice_correlated_{args.level}"), "\n".join(lines),
                     runs_key="runs", runs=runs, factors=factors)


if __name__ == "__main__":
    main()
