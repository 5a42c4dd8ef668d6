"""
Sparse mapping, sparse codes, or both?  Every combination of a dense (``vae``)
or sparse (``ssl_dgm``, Spike-and-Slab Lasso mask W) decoder with dense
(N(0, I)) or sparse codes (``latent_prior="spike_slab"``, VSC's
α N(0, 1) + (1 - α) δ0, or ``"thresholded_laplace"``, Fallah & Rozell's
soft-thresholded Laplace), on three data sets:

* ``dense codes``: the sparse VAE paper's synthetic data (Eq. 9; N = 1000,
  G = 7, sparse map, two N(0, 1) factors with correlation ρ = 0.4);
* ``sparse codes``: the same map with spike-and-slab factors, each on with
  probability 0.3 (``datasets.synthetic_sparse_codes``, slab correlation ρ = 0.4);
* ``digits``: scikit-learn's 8x8 digits (unit-norm rows), the fixed stratified
  70/30 split of ``vsc_classification.py``, pixels with training sd < 0.01
  dropped (12 of 64; a near-constant pixel's tiny variance swamps the NLL).

Priors: α = 0.3 for the spike-and-slab codes, the true activity rate of the
sparse-code data (on the dense-code data the same α is a misspecified prior,
which is part of the question).  The thresholded Laplace prior is set to the
same sparsity and slab variance: its codes are spike-and-slab with
P(z ≠ 0) = exp(-λ/b0) and a Laplace(0, b0) slab (Fallah & Rozell Prop. 3.1),
so b0 = 1/√2 (unit variance) and λ = b0 log(1/α).  The SSL mask keeps the
paper's λ0 = 10, λ1 = 1.  Guide warm-ups (the spike-and-slab guide's sigmoid
slope, the thresholded guide's scale ω) run over the first half of training.

Synthetic data: K = 5 and the paper's Table 6 settings through
``synthetic_recovery.fit_synthetic`` (3 x 50 hidden units, lr 0.01, batch
100, 200 epochs), scored on 1000 fresh points:

* DCI disentanglement of E_q[z | x] against the true factors;
* W support F: the paper's rule E[γ] > 0.5 against the true support of W
  (masked models only), after matching codes to factors (``evaluation.match_factors``);
* code support F: the exact non-zeros of the posterior-mode codes against
  the true non-zeros of z, with the same matching (unmatched codes' non-zeros
  are false positives); dense codes score 2p / (1 + p) on factors active with
  probability p;
* zero codes: share of exactly-zero posterior-mode codes;
* heldout MSE of E[x | E_q z] and heldout log-likelihood per point
  (importance-weighted, 50 draws).

Digits: K = 10, the same networks and learning rate; heldout log-likelihood,
reconstruction MSE (×1000; rows have unit norm), share of exactly-zero codes,
share of exactly-zero entries of W, and the test accuracy of a logistic
regression on standardised posterior-mode codes fitted on the training codes.

Mean ± sd over seeds (a seed fixes the data draw and the model's initialisation;
the digits split is fixed).  One fit at a time on one thread.

    OMP_NUM_THREADS=1 python benchmarks/prior_combinations.py            # 3 seeds, 200 / 50 epochs, ~25 min
    OMP_NUM_THREADS=1 python benchmarks/prior_combinations.py --quick    # 1 seed, 50 / 20 epochs, ~3 min
    OMP_NUM_THREADS=1 python benchmarks/prior_combinations.py --smoke    # 1 seed, 2 epochs, 200 points: does it run

Writes ``prior_combinations.{json,md}`` (``_quick`` / ``_smoke`` with those
flags) to ``--out``.
"""

import argparse
import json
import math
import os
import sys
import time

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")  # one thread, sklearn's BLAS included

import numpy as np
from synthetic_recovery import fit_synthetic, synthetic_split

ALPHA = 0.3  # prior P(z_k ≠ 0); the sparse-code data's true activity rate
RHO = 0.4  # correlation of the two true factors (of the slab, for sparse codes)
LAPLACE_SCALE = 1 / math.sqrt(2)  # unit-variance Laplace slab
CODE_PRIORS = {
    "N(0, 1)": {},
    f"spike-and-slab α = {ALPHA}": {"latent_prior": "spike_slab", "alpha": ALPHA},
    f"thresholded Laplace, P(z ≠ 0) = {ALPHA}": {
        "latent_prior": "thresholded_laplace", "prior_scale": LAPLACE_SCALE,
        "threshold": LAPLACE_SCALE * math.log(1 / ALPHA),
    },
}
MAPPINGS = {"dense (vae)": "vae", "sparse (ssl_dgm)": "ssl_dgm"}
DATA = ("dense codes", "sparse codes", "digits")
# seeds, synthetic epochs, digits epochs, synthetic training points
SETTINGS = {"full": (3, 200, 50, 1000), "quick": (1, 50, 20, 1000), "smoke": (1, 2, 2, 200)}
DIGITS_LATENT_DIM, BATCH_SIZE, IW_SAMPLES = 10, 100, 50
SYNTHETIC_COLUMNS = {
    "dci": "DCI", "w_support_f": "W support F", "code_support_f": "code support F", "zero_codes": "zero codes",
    "mse": "heldout MSE", "log_likelihood": "heldout log-lik.", "seconds": "s / fit",
}
DIGITS_COLUMNS = {
    "log_likelihood": "heldout log-lik.", "mse_x1000": "recon. MSE ×1000", "zero_codes": "zero codes",
    "zero_w": "zero W entries", "accuracy": "logistic-regression accuracy", "seconds": "s / fit",
}


def hyperparameters(codes, epochs, steps_per_epoch):
    """The code prior's hyperparameters, with its guide's warm-up over the first half of training."""
    hyper = dict(CODE_PRIORS[codes])
    if hyper.get("latent_prior") == "spike_slab":
        hyper["slope_warmup_epochs"] = epochs / 2
    elif hyper.get("latent_prior") == "thresholded_laplace":
        # ω grows from 0.1 to 1 by a fixed amount per step (Appendix B).
        hyper["scale_warmup_rate"] = 0.9 / max(1, epochs * steps_per_epoch // 2)
    return hyper


def synthetic_data(name, seed, num_train):
    """(train, test) of the dense-code data (``synthetic_split``) or the sparse-code variant, seed + 10,000 for test."""
    if name == "dense codes":
        return synthetic_split(RHO, seed, num_train)
    from pyro_sparse.data.synthetic import synthetic_sparse_codes

    return (synthetic_sparse_codes(num_train, ALPHA, RHO, seed),
            synthetic_sparse_codes(1000, ALPHA, RHO, seed + 10_000))


def heldout_log_likelihood(fitted, X):
    from pyro_sparse import evaluation

    return -evaluation.heldout_nll(fitted.heldout_log_likelihood(X, num_samples=IW_SAMPLES))


def score_synthetic(fitted, test):
    from pyro_sparse import evaluation

    codes, mode = fitted.transform(test.X, kind="mean"), fitted.transform(test.X)
    matching = evaluation.match_factors(codes, test.z)
    result = {
        "dci": evaluation.dci_disentanglement(codes, test.z),
        "code_support_f": evaluation.support_f_score(mode, test.z != 0, matching),
        "zero_codes": float(np.mean(mode == 0)),
        "mse": evaluation.mse(test.X, fitted.reconstruct(test.X)),
        "log_likelihood": heldout_log_likelihood(fitted, test.X),
    }
    if "W" in fitted.guide.unconstrained:
        result.update(
            w_support_f=evaluation.support_f_score(fitted.support_, test.support, matching),
            w_support_f_zeros=evaluation.support_f_score(fitted.W_, test.support, matching),
            W=fitted.W_.round(3).tolist(),
        )
    return result


def load_digits():
    """Unit-norm digits, stratified 70/30 split (random_state 0), pixels with training sd ≥ 0.01."""
    from sklearn.model_selection import train_test_split

    from pyro_sparse.data.images import load_digits_images

    digits = load_digits_images()
    X_train, X_test, y_train, y_test = train_test_split(
        digits.X, digits.y, test_size=0.3, stratify=digits.y, random_state=0
    )
    keep = X_train.std(0) >= 0.01
    return X_train[:, keep], X_test[:, keep], y_train, y_test


def fit_digits(model, X, seed, epochs, hyper):
    import torch

    torch.set_num_threads(1)
    import pyro_sparse

    start = time.perf_counter()
    fitted = pyro_sparse.train(
        model, X, latent_dim=DIGITS_LATENT_DIM, max_epochs=epochs, batch_size=BATCH_SIZE, lr=0.01,
        hidden_dims=(50, 50, 50), seed=seed, progress=False, **hyper,
    )
    return fitted, time.perf_counter() - start


def score_digits(fitted, X_train, X_test, y_train, y_test):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from pyro_sparse import evaluation

    codes_train, codes_test = fitted.transform(X_train), fitted.transform(X_test)
    classifier = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
    result = {
        "log_likelihood": heldout_log_likelihood(fitted, X_test),
        "mse_x1000": 1000 * evaluation.mse(X_test, fitted.reconstruct(X_test)),
        "zero_codes": float(np.mean(codes_test == 0)),
        "accuracy": float(classifier.fit(codes_train, y_train).score(codes_test, y_test)),
    }
    if "W" in fitted.guide.unconstrained:
        result["zero_w"] = float(np.mean(fitted.W_ == 0))
    return result


def run(job, digits):
    data, (mapping, codes), seed, epochs, num_train = job
    model = MAPPINGS[mapping]
    result = {"data": data, "mapping": mapping, "codes": codes, "model": model, "seed": seed, "epochs": epochs}
    if data == "digits":
        X_train, X_test, y_train, y_test = digits
        hyper = hyperparameters(codes, epochs, math.ceil(len(X_train) / BATCH_SIZE))
        fitted, result["seconds"] = fit_digits(model, X_train, seed, epochs, hyper)
        result.update(score_digits(fitted, *digits))
    else:
        train, test = synthetic_data(data, seed, num_train)
        hyper = hyperparameters(codes, epochs, math.ceil(num_train / BATCH_SIZE))
        fitted, result["seconds"] = fit_synthetic(model, train.X, seed, epochs, hyper)
        result.update(score_synthetic(fitted, test))
    result["hyper"] = hyper
    return result


def summary(results):
    """data -> "mapping | codes" -> metric -> (mean, sd) over seeds."""
    out = {}
    for data in DATA:
        for mapping in MAPPINGS:
            for codes in CODE_PRIORS:
                runs = [r for r in results if (r["data"], r["mapping"], r["codes"]) == (data, mapping, codes)]
                metrics = {key for r in runs for key in r if isinstance(r[key], float)}
                if runs:
                    out.setdefault(data, {})[f"{mapping} | {codes}"] = {
                        key: (float(np.mean([r[key] for r in runs])), float(np.std([r[key] for r in runs])))
                        for key in sorted(metrics)
                    }
    return out


def markdown_table(by_method, columns):
    lines = ["| mapping | codes | " + " | ".join(columns.values()) + " |", "|" + "---|" * (len(columns) + 2)]
    for method, stats in by_method.items():
        cells = [
            f"{stats[key][0]:.{1 if key == 'seconds' else 2}f} ± {stats[key][1]:.{1 if key == 'seconds' else 2}f}"
            if key in stats else "–"
            for key in columns
        ]
        lines.append("| " + " | ".join(method.split(" | ")) + " | " + " | ".join(cells) + " |")
    return lines


def markdown(stats, args, seconds):
    lines = [
        "# Sparse mapping × sparse codes", "",
        f"`{args.command}` — {args.seeds} seed(s); synthetic: {args.epochs} epochs, N = {args.num_train} training "
        f"and 1000 heldout points, K = 5; digits: {args.digits_epochs} epochs, K = {DIGITS_LATENT_DIM}. "
        f"Mean ± sd over seeds. Total {seconds / 60:.1f} min on one thread.",
    ]
    titles = {
        "dense codes": f"Synthetic data of Eq. 9, dense codes (ρ = {RHO})",
        "sparse codes": f"Synthetic data of Eq. 9, sparse codes (each factor on w.p. {ALPHA}, slab ρ = {RHO})",
        "digits": "Digits (8x8, 1257 training / 540 test images, 52 pixels)",
    }
    for data in DATA:
        if data in stats:
            columns = DIGITS_COLUMNS if data == "digits" else SYNTHETIC_COLUMNS
            lines += ["", f"## {titles[data]}", "", *markdown_table(stats[data], columns)]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", dest="setting", action="store_const", const="quick",
                       help="1 seed, 50 synthetic / 20 digits epochs")
    group.add_argument("--smoke", dest="setting", action="store_const", const="smoke",
                       help="1 seed, 2 epochs, 200 synthetic training points: a test that the script runs")
    parser.set_defaults(setting="full")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=None, help="synthetic data")
    parser.add_argument("--digits-epochs", type=int, default=None)
    parser.add_argument("--data", default=",".join(DATA), help="comma-separated subset of %(default)s")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    flags = [flag for flag, previous in zip(sys.argv[1:], [""] + sys.argv[1:]) if "--out" not in (flag, previous)]
    args.command = " ".join(["python benchmarks/prior_combinations.py", *flags])
    seeds, epochs, digits_epochs, args.num_train = SETTINGS[args.setting]
    args.seeds, args.epochs = args.seeds or seeds, args.epochs or epochs
    args.digits_epochs = args.digits_epochs or digits_epochs
    data_sets = args.data.split(",")
    unknown = sorted(set(data_sets) - set(DATA))
    if unknown:
        parser.error(f"unknown data set(s) {unknown}; choose from {list(DATA)}")
    digits = load_digits() if "digits" in data_sets else None
    methods = [(mapping, codes) for mapping in MAPPINGS for codes in CODE_PRIORS]
    start = time.perf_counter()
    results = []
    for data in data_sets:
        for seed in range(args.seeds):
            for method in methods:
                job = (data, method, seed, args.digits_epochs if data == "digits" else args.epochs, args.num_train)
                results.append(run(job, digits))
                print(json.dumps({k: v for k, v in results[-1].items() if k not in ("hyper", "W")}), flush=True)
    seconds = time.perf_counter() - start
    stats = summary(results)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, "prior_combinations" + ("" if args.setting == "full" else "_" + args.setting))
    with open(stem + ".json", "w") as stream:
        json.dump({"setting": args.setting, "seeds": args.seeds, "epochs": args.epochs,
                   "digits_epochs": args.digits_epochs, "num_train": args.num_train, "alpha": ALPHA, "rho": RHO,
                   "seconds": seconds, "summary": stats, "runs": results}, stream, indent=1)
    text = markdown(stats, args, seconds)
    with open(stem + ".md", "w") as stream:
        stream.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
