"""
Tonolini, Jensen & Murray-Smith, "Variational Sparse Coding" (ICLR 2019
submission; UAI 2020): the classification, ELBO/sparsity and Smiley
experiments, on data that ship with this machine.

1. Fig. 2 / Fig. 3 (``--parts classification``): a VAE and a VSC (prior spike
   probability α = 0.01) are trained at latent sizes 5, 10, 20, 50, 100, 200
   with the same architecture (one hidden layer, Gaussian likelihood with a
   per-feature decoder variance: ``vae(noise="heteroscedastic")``).  A softmax
   regression (sklearn ``LogisticRegression`` on standardised codes, the
   paper's "one layer fully connected classifier") is fitted on the codes of
   up to 5,000 labelled training examples and scored on the test set.  VSC
   codes are the posterior mode (exactly 0 where γ ≤ 0.5) and, as a second
   column, the posterior mean γ·μ.  Also reported: the test ELBO (mean of
   single-draw log weights) and the heldout NLL (importance-weighted log p(x),
   ``--iw-samples`` draws, on at most ``--max-test`` test points).
   The paper's claim: VSC accuracy stays stable as the latent size grows,
   where the VAE's degrades past its best size.  The VSC test -ELBO is
   heavy-tailed: unused latents keep γ ≈ α with slabs far from the prior, so
   a rare hard draw that switches one on can cost thousands of nats for one
   test point; the importance-weighted NLL is much less affected.
2. Supplement Fig. 8 / Fig. 10 / Fig. 11 (``--parts alpha``): VSC at a fixed
   latent size (default 200) and α ∈ {0.01 … 0.8}: test -ELBO and NLL,
   accuracy, and the aggregate posterior sparsity: mean γ (the expected share
   of non-zero codes, to compare with α), share of codes with γ > 0.5, share
   of exact zeros in ``transform`` (the mode), and latent dimensions in use.
   α = 1 (the VAE limit) is not in the default grid: with a prior that has no
   spike, the Bernoulli KL term (1 - γ) log((1 - γ) / (1 - α)) is infinite
   whenever the encoder gives γ < 1.
3. UAI supplement Fig. 9 (``--parts smiley``): VSC and β-VAE (β from
   ``--betas``) with 20 latents on Smiley images (Appendix E; Gaussian
   likelihood on the binary pixels as in the paper, ``--smiley-likelihood``
   to change).  On fresh test smileys, |correlation| between each of the 18
   generating variables (over the examples where its attribute is present)
   and each latent code.  Summaries per model: mean over variables of the
   largest |corr| with any latent, mean gap between the largest and second
   largest (the "correlation contrast"), distinct best latents, latents in use.
   The paper trains with the pseudo-input prior of the UAI version; here the
   fixed-α prior of the ICLR version is used.  Pixels whose training sd is
   below ``--smiley-min-feature-sd`` (default 0.05: the 544 never-set pixels
   and ~100 that a shape reaches only rarely) are dropped: with the Gaussian
   likelihood and all pixels (or only those below 0.01 dropped) VSC training
   diverged (NaN gradients) within 20 epochs, see the note below.

Near-constant pixels: the Gaussian likelihood's variance floor is relative
(``min_variance`` = 1e-3 in standardised units), so a pixel that is almost
always 0 in training (digits: sd 0.0008) gets a variance of ~1e-9, and one
test image that is faintly non-zero there scores ~2e5 nats, which swamps the
mean NLL over the test set.  Pixels with training sd below
``--min-feature-sd`` (default 0.01; 12 of the 64 digit pixels) are therefore
dropped for every model; ``--min-feature-sd 0`` keeps them.  The median NLL
is reported next to the mean.  The networks also see inputs standardised by
those tiny sds (up to 1/sd), and on Smiley this made VSC's gradients
overflow (NaN in the encoder's first-layer weight gradient) with lr 1e-3.

Data: the 8x8 scikit-learn digits by default (unit-norm rows, a fixed
stratified 70/30 split), or ``--data fashion-mnist`` (subsampled with
``--fashion-train`` / ``--fashion-test``).  The paper trains 20,000 Adam
iterations on 60,000 MNIST / Fashion-MNIST images with 400 hidden units; the
defaults here are far shorter so that the whole run takes about 15 minutes
on two CPU cores.  The ICLR version's classification experiment (Fig. 3) has
no spike pre-training (that is the UAI version's, ``--pretrain``), and
``--spike-factor 10`` adds the loop's divergence guard: a step loss above 10x
the running median (or NaN) rolls the epoch back with halved learning rates.

Writes ``vsc_classification.json`` (every run) and markdown tables
``vsc_classification.md``, ``vsc_alpha.md``, ``vsc_smiley.md`` plus
``vsc_accuracy.png``, ``vsc_alpha.png``, ``vsc_smiley_corr.png`` (a suffix
``_<data>`` is added for data other than digits).  One fit per process, in
parallel over ``--jobs`` processes, one torch thread each.

    python benchmarks/vsc_classification.py --jobs 2
    python benchmarks/vsc_classification.py --data fashion-mnist --epochs 100 --seeds 3
    python benchmarks/vsc_classification.py --data fashion-mnist --parts classification --sizes 10,50,200,500 \
        --fashion-train 60000 --fashion-test 10000 --hidden 400 --epochs 33 --pretrain 0 --pretrain-ramp 0 \
        --spike-factor 10 --seeds 1      # the paper's scale (Fig. 3)
"""

import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")  # one thread per worker process, sklearn included

import numpy as np

# --------------------------------------------------------------------------- data


def load_data(name, fashion_train, fashion_test, min_feature_sd=0.0):
    """
    (X_train, y_train, X_test, y_test): unit-norm images, then only the pixels
    whose standard deviation over the training images is at least
    ``min_feature_sd`` (see the module docstring).
    """
    from pyro_sparse.data import images

    if name == "digits":
        from sklearn.model_selection import train_test_split

        data = images.load_digits_images()
        X_train, X_test, y_train, y_test = train_test_split(
            data.X, data.y, test_size=0.3, stratify=data.y, random_state=0
        )
    elif name == "fashion-mnist":
        rng = np.random.default_rng(0)
        train = images.load_fashion_mnist("train")
        test = images.load_fashion_mnist("test")
        i = rng.permutation(train.X.shape[0])[:fashion_train]
        j = rng.permutation(test.X.shape[0])[:fashion_test]
        X_train, y_train, X_test, y_test = train.X[i], train.y[i], test.X[j], test.y[j]
    else:
        raise ValueError(f"unknown data {name!r}")
    keep = X_train.std(0) >= min_feature_sd
    return X_train[:, keep], y_train, X_test[:, keep], y_test


def schedule(epochs, slope_fraction, pretrain_fraction, ramp_fraction):
    """VSC schedule hyperparameters as fractions of the run."""
    return {
        "slope_start": 50.0,
        "slope_end": 200.0,
        "slope_warmup_epochs": slope_fraction * epochs,
        "pretrain_epochs": pretrain_fraction * epochs,
        "pretrain_ramp_epochs": ramp_fraction * epochs,
    }


# --------------------------------------------------------------------------- metrics


def classify(Z_train, y_train, Z_test, y_test):
    """Test accuracy of softmax regression on standardised codes."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    classifier = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000))
    classifier.fit(Z_train, y_train)
    return float(classifier.score(Z_test, y_test))


def code_statistics(fitted, X, model):
    """Sparsity of the codes of X; 'active' latents: Var_x E[z|x] > 0.01 (Burda et al.)."""
    mean = fitted.transform(X, kind="mean")
    stats = {"active_units": int((mean.var(0) > 0.01).sum())}
    if model == "vsc":
        gamma = fitted.spike_probabilities(X)
        mode = fitted.transform(X)
        on = gamma > 0.5
        stats.update(
            mean_gamma=float(gamma.mean()),
            frac_gamma_gt_half=float(on.mean()),
            frac_exact_zero=float((mode == 0).mean()),
            nonzeros_per_code=float(on.sum(1).mean()),
            # a latent is "used" if it is non-zero in at least 1% of the points
            dims_used=int((on.mean(0) >= 0.01).sum()),
        )
    return stats


def likelihood_metrics(fitted, X, iw_samples, elbo_repeats=5):
    """Test -ELBO (single-draw log weights, averaged) and importance-weighted NLL per point."""
    elbo = np.mean([fitted.heldout_log_likelihood(X, num_samples=1).mean() for _ in range(elbo_repeats)])
    log_px = fitted.heldout_log_likelihood(X, num_samples=iw_samples)
    return {"neg_elbo": float(-elbo), "nll": float(-log_px.mean()), "nll_median": float(-np.median(log_px))}


def abs_correlations(variables, Z):
    """|corr(v_j, z_k)| over the rows where variable j is present, (18, K); 0 for constant columns."""
    out = np.zeros((variables.shape[1], Z.shape[1]))
    for j in range(variables.shape[1]):
        rows = ~np.isnan(variables[:, j])
        v = variables[rows, j].astype(float)
        z = Z[rows].astype(float)
        v = v - v.mean()
        z = z - z.mean(0)
        denominator = np.sqrt((v**2).sum() * (z**2).sum(0))
        with np.errstate(invalid="ignore", divide="ignore"):
            corr = np.where(denominator > 0, (v @ z) / denominator, 0.0)
        out[j] = np.abs(corr)
    return out


def correlation_summary(C):
    top = np.sort(C, axis=1)[:, ::-1]
    best = C.argmax(1)
    return {
        "mean_max_corr": float(top[:, 0].mean()),
        "mean_corr_gap": float((top[:, 0] - top[:, 1]).mean()) if C.shape[1] > 1 else float(top[:, 0].mean()),
        "distinct_best_latents": int(len(set(best.tolist()))),
        "max_corr_per_variable": top[:, 0].round(3).tolist(),
    }


# --------------------------------------------------------------------------- one fit per process


def run(job):
    import torch

    torch.set_num_threads(1)
    try:
        return _run(job)
    except Exception as error:  # a diverged or failed fit is a result, not a crash of the benchmark
        return {**job, "error": f"{type(error).__name__}: {error}"}


def _fit(job, X):
    """
    Train one model; with ``spike_factor`` a loss spike (or NaN) rolls back an epoch with halved rates.
    Returns the fit, the seconds it took and, when the rollbacks ran out, why it stopped.
    """
    import pyro_sparse
    from pyro_sparse import Checkpointing, Schedule
    from pyro_sparse.infer.loop import TrainingDivergedError

    hyper = {"hidden_dims": tuple(job["hidden"])}
    if job["model"] == "vsc":
        hyper.update(alpha=job["alpha"], **schedule(job["epochs"], *job["schedule"]))
    else:  # a variance per pixel for real-valued images; binary ones have no noise to model
        hyper.update(beta=job["beta"], **({"noise": "heteroscedastic"} if job["likelihood"] == "gaussian" else {}))
    if job["spike_factor"] is not None:
        hyper["checkpointing"] = Checkpointing(on_divergence="rollback", spike_factor=job["spike_factor"])
    start = time.perf_counter()
    stopped = None
    try:
        fitted = pyro_sparse.train(
            job["model"], X, latent_dim=job["latent_dim"], likelihood=job["likelihood"],
            max_epochs=job["epochs"], batch_size=job["batch_size"], lr=job["lr"], seed=job["seed"],
            progress=False, schedule=Schedule(kl_warmup_epochs=job["kl_warmup_fraction"] * job["epochs"]),
            **hyper,
        )
    except TrainingDivergedError as error:
        if job["spike_factor"] is None:
            raise
        # The guard's rollbacks ran out: train() hands back the model of the last good epoch.
        fitted, stopped = error.fitted, str(error).split(";")[0]
    return fitted, time.perf_counter() - start, stopped


def _history(fitted, stopped):
    loss = np.asarray(fitted.history_["train_loss"])
    return {
        "final_train_loss": float(loss[-1]),
        "train_loss": loss.round(3).tolist(),
        "rollbacks": len(fitted.history_["rollbacks"]),
        "stopped": stopped,
        "epochs_trained": len(loss),
    }


def _run(job):
    if job["part"] == "smiley":
        return _run_smiley(job)
    X_train, y_train, X_test, y_test = load_data(job["data"], job["fashion_train"], job["fashion_test"], job["min_feature_sd"])
    fitted, seconds, stopped = _fit(job, X_train)
    labelled = np.random.default_rng(0).permutation(X_train.shape[0])[: job["max_labelled"]]
    test = X_test[: job["max_test"]]
    result = {**job, "seconds": seconds, **_history(fitted, stopped)}
    result["accuracy"] = classify(fitted.transform(X_train[labelled]), y_train[labelled], fitted.transform(X_test), y_test)
    result["accuracy_mean_codes"] = classify(
        fitted.transform(X_train[labelled], kind="mean"), y_train[labelled],
        fitted.transform(X_test, kind="mean"), y_test,
    )
    result.update(likelihood_metrics(fitted, test, job["iw_samples"]))
    result.update(code_statistics(fitted, X_test, job["model"]))
    return result


def _run_smiley(job):
    from pyro_sparse.data.images import smiley

    train = smiley(job["smiley_n"], seed=job["seed"])
    test = smiley(job["smiley_test"], seed=10_000 + job["seed"])
    keep = train.X.std(0) >= job["min_feature_sd"]
    X_train, X_test = train.X[:, keep], test.X[:, keep]
    fitted, seconds, stopped = _fit(job, X_train)
    # Gaussian posteriors: mode = mean; spike-and-slab: the sparse mode.
    Z = fitted.transform(X_test)
    C = abs_correlations(test.variables, Z)
    result = {**job, "seconds": seconds, **_history(fitted, stopped)}
    result.update(correlation_summary(C))
    result["abs_corr"] = C.round(4).tolist()
    if job["model"] == "vsc":
        result["mean_max_corr_mean_codes"] = correlation_summary(
            abs_correlations(test.variables, fitted.transform(X_test, kind="mean"))
        )["mean_max_corr"]
    result["variable_names"] = list(test.variable_names)
    result["num_pixels"] = int(keep.sum())
    result.update(code_statistics(fitted, X_test, job["model"]))
    result["used_latents"] = result["dims_used"] if job["model"] == "vsc" else result["active_units"]
    result.update(likelihood_metrics(fitted, X_test[: job["max_test"]], job["iw_samples"]))
    return result


# --------------------------------------------------------------------------- tables and figures


def _cell(values, digits=3):
    values = [v for v in values if v is not None and np.isfinite(v)]
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{np.mean(values):.{digits}f} ± {np.std(values):.{digits}f}"


def _ok(results):
    return [r for r in results if "error" not in r]


def _errors(results):
    lines = [f"- FAILED: {r['label']} K={r['latent_dim']} seed={r['seed']}: {r['error']}" for r in results if "error" in r]
    lines += [f"- stopped early, scored at its last good epoch: {r['label']} K={r['latent_dim']} seed={r['seed']}: "
              f"{r['stopped']}" for r in results if r.get("stopped")]
    return ("\n\n" + "\n".join(lines)) if lines else ""


def classification_table(results, pixel_accuracy, header):
    columns = [
        ("accuracy", "accuracy (mode codes)", 3), ("accuracy_mean_codes", "accuracy (mean codes)", 3),
        ("nll", "test NLL", 1), ("nll_median", "median test NLL", 1), ("neg_elbo", "test −ELBO", 1),
        ("final_train_loss", "train −ELBO", 1), ("active_units", "active units", 1), ("dims_used", "dims used (γ>½)", 1),
        ("nonzeros_per_code", "non-zeros / code", 2), ("rollbacks", "rollbacks", 0),
        ("epochs_trained", "epochs trained", 0), ("seconds", "seconds", 0),
    ]
    lines = [header, "", f"Softmax regression on the raw pixels: accuracy {pixel_accuracy:.3f}.", ""]
    lines.append("| K | model | " + " | ".join(c[1] for c in columns) + " |")
    lines.append("|" + "---|" * (len(columns) + 2))
    ok = _ok(results)
    for K in sorted({r["latent_dim"] for r in ok}):
        for label in sorted({r["label"] for r in ok}):
            runs = [r for r in ok if r["latent_dim"] == K and r["label"] == label]
            if not runs:
                continue
            cells = [_cell([r.get(key) for r in runs], digits) for key, _, digits in columns]
            lines.append(f"| {K} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + _errors(results)


def classification_targets(results, vsc_label):
    """
    Issue 20's targets for Fig. 3, per seed and for the means over seeds: VSC's accuracy at
    K = 500 within 0.02 of its best over K, and at least the VAE's at every K >= 200.  A run that
    stopped early (its rollbacks ran out) is no finished fit: a verdict that needs it is "incomplete".
    """
    ok = [r for r in _ok(results) if r["part"] == "classification"]
    accuracy = {(r["label"], r["latent_dim"], r["seed"]): None if r.get("stopped") else r["accuracy"] for r in ok}
    sizes = sorted({K for label, K, _ in accuracy if label == vsc_label})
    seeds = sorted({seed for label, _, seed in accuracy if label == vsc_label})
    if not sizes or not any(label == "VAE" for label, _, _ in accuracy):
        return ""

    def verdict(get):
        vsc = {K: get(vsc_label, K) for K in sizes}
        if any(v is None for v in vsc.values()):
            return "incomplete (a run failed or stopped early)"
        if 500 not in vsc:
            first = f"K = 500 not run (missed; largest K run {sizes[-1]})"
        else:
            gap = max(vsc.values()) - vsc[500]
            first = f"K = 500 is {gap:.3f} below VSC's best ({'met' if gap <= 0.02 else 'missed'})"
        margins = [(K, vsc[K] - get("VAE", K)) for K in sizes if K >= 200 and get("VAE", K) is not None]
        return (f"{first}; "
                "VSC − VAE " + ", ".join(f"{m:+.3f} at K = {K}" for K, m in margins)
                + (" (met)" if margins and all(m >= 0 for _, m in margins) else " (missed)"))

    lines = ["", "", "Targets (issue 20): VSC at K = 500 within 0.02 of its best over K; VSC ≥ VAE at K ≥ 200.",
             ""]
    for seed in seeds:
        lines.append(f"- seed {seed}: " + verdict(lambda label, K: accuracy.get((label, K, seed))))

    def mean(label, K):
        values = [v for (lab, k, _), v in accuracy.items() if lab == label and k == K]
        return float(np.mean(values)) if values and None not in values else None

    lines.append(f"- mean over seeds {seeds}: " + verdict(mean))
    return "\n".join(lines)


def alpha_table(results, header):
    columns = [
        ("nll", "test NLL", 1), ("nll_median", "median test NLL", 1), ("neg_elbo", "test −ELBO", 1),
        ("final_train_loss", "train −ELBO", 1), ("accuracy", "accuracy (mode)", 3),
        ("accuracy_mean_codes", "accuracy (mean)", 3), ("mean_gamma", "mean γ", 3), ("frac_gamma_gt_half", "share γ>½", 3),
        ("frac_exact_zero", "share exact 0", 3), ("nonzeros_per_code", "non-zeros / code", 2),
        ("dims_used", "dims used", 1),
    ]
    lines = [header, ""]
    lines.append("| α | " + " | ".join(c[1] for c in columns) + " |")
    lines.append("|" + "---|" * (len(columns) + 1))
    ok = _ok(results)
    for alpha in sorted({r["alpha"] for r in ok}):
        runs = [r for r in ok if r["alpha"] == alpha]
        cells = [_cell([r.get(key) for r in runs], digits) for key, _, digits in columns]
        lines.append(f"| {alpha} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + _errors(results)


def smiley_table(results, header):
    columns = [
        ("mean_max_corr", "mean max \\|corr\\|", 3), ("mean_max_corr_mean_codes", "same, VSC mean codes", 3),
        ("mean_corr_gap", "mean gap 1st−2nd", 3),
        ("distinct_best_latents", "distinct best latents (of 18)", 1), ("used_latents", "latents used", 1),
        ("nonzeros_per_code", "non-zeros / code", 2), ("nll", "test NLL", 1), ("seconds", "seconds", 0),
    ]
    lines = [header, ""]
    lines.append("| model | " + " | ".join(c[1] for c in columns) + " |")
    lines.append("|" + "---|" * (len(columns) + 1))
    ok = _ok(results)
    for label in sorted({r["label"] for r in ok}):
        runs = [r for r in ok if r["label"] == label]
        cells = [_cell([r.get(key) for r in runs], digits) for key, _, digits in columns]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if ok:
        names = ok[0]["variable_names"]
        lines += ["", "Largest |corr| per generating variable (first seed):", ""]
        labels = sorted({r["label"] for r in ok})
        lines.append("| variable | " + " | ".join(labels) + " |")
        lines.append("|" + "---|" * (len(labels) + 1))
        first = {label: min((r for r in ok if r["label"] == label), key=lambda r: r["seed"]) for label in labels}
        for j, name in enumerate(names):
            lines.append(f"| {name} | " + " | ".join(f"{first[l]['max_corr_per_variable'][j]:.2f}" for l in labels) + " |")
    return "\n".join(lines) + _errors(results)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def accuracy_figure(results, pixel_accuracy, path, data):
    plt = _pyplot()
    ok = _ok(results)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for number, label in enumerate(sorted({r["label"] for r in ok})):
        sizes = sorted({r["latent_dim"] for r in ok if r["label"] == label})
        for key, ax, style in (("accuracy", axes[0], "-o"), ("accuracy_mean_codes", axes[0], "--s"), ("nll", axes[1], "-o")):
            if key == "accuracy_mean_codes" and not label.startswith("VSC"):
                continue
            values = [[r[key] for r in ok if r["label"] == label and r["latent_dim"] == K] for K in sizes]
            name = label + (" (mean codes)" if key == "accuracy_mean_codes" else "")
            ax.errorbar(sizes, [np.mean(v) for v in values], yerr=[np.std(v) for v in values], fmt=style,
                        capsize=3, label=name, color=f"C{number}", alpha=0.6 if key == "accuracy_mean_codes" else 1.0)
    axes[0].axhline(pixel_accuracy, color="grey", lw=0.8, ls=":", label="raw pixels")
    axes[1].set_ylabel("mean NLL (nats)")
    for ax, title in zip(axes, ("test accuracy (softmax regression on codes)", "test NLL per point (IW)")):
        ax.set_xscale("log")
        ax.set_xlabel("latent size K")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.suptitle(f"VAE vs VSC on {data}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def alpha_figure(results, path, data, latent_dim):
    plt = _pyplot()
    ok = _ok(results)
    alphas = sorted({r["alpha"] for r in ok})
    if not alphas:
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for key, name in (("mean_gamma", "mean γ"), ("frac_gamma_gt_half", "share γ > ½")):
        values = [[r[key] for r in ok if r["alpha"] == a] for a in alphas]
        axes[0].errorbar(alphas, [np.mean(v) for v in values], yerr=[np.std(v) for v in values], fmt="-o", capsize=3, label=name)
    axes[0].plot([0, 1], [0, 1], color="grey", ls=":", label="perfect prior match")
    axes[0].set_xlabel("prior spike probability α")
    axes[0].set_ylabel("posterior share of non-zero codes")
    axes[0].legend(fontsize=8)
    for key, name in (("neg_elbo", "test −ELBO"), ("nll", "test NLL")):
        values = [[r[key] for r in ok if r["alpha"] == a] for a in alphas]
        axes[1].errorbar(alphas, [np.mean(v) for v in values], yerr=[np.std(v) for v in values], fmt="-o", capsize=3, label=name)
    axes[1].set_xlabel("prior spike probability α")
    axes[1].legend(fontsize=8)
    fig.suptitle(f"VSC, K = {latent_dim}, {data}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def smiley_figure(results, path):
    plt = _pyplot()
    ok = _ok(results)
    labels = sorted({r["label"] for r in ok})
    if not labels:
        return
    first = [min((r for r in ok if r["label"] == label), key=lambda r: r["seed"]) for label in labels]
    fig, axes = plt.subplots(1, len(first), figsize=(4.2 * len(first) + 1.5, 5.2), squeeze=False)
    for ax, result in zip(axes[0], first):
        C = np.asarray(result["abs_corr"])
        # order latents by the variable they correlate with most, strongest first; unused at the end
        best, strength = C.argmax(0), C.max(0)
        order = sorted(range(C.shape[1]), key=lambda k: (strength[k] < 0.1, best[k], -strength[k]))
        image = ax.imshow(C[:, order], vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set_title(f"{result['label']}\nmean max |corr| {result['mean_max_corr']:.2f}", fontsize=9)
        ax.set_xlabel("latent (sorted)")
        ax.set_xticks([])
        ax.set_yticks(range(C.shape[0]))
        ax.set_yticklabels(result["variable_names"] if ax is axes[0][0] else [], fontsize=7)
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8, label="|correlation|")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


# --------------------------------------------------------------------------- main


def _floats(text):
    return [float(v) for v in text.split(",") if v]


def _ints(text):
    return [int(v) for v in text.split(",") if v]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="classification,alpha,smiley")
    parser.add_argument("--data", default="digits", choices=["digits", "fashion-mnist"])
    parser.add_argument("--fashion-train", type=int, default=10_000)
    parser.add_argument("--fashion-test", type=int, default=2_000)
    parser.add_argument("--min-feature-sd", type=float, default=0.01,
                        help="drop pixels whose training sd is below this (0 keeps all; see docstring)")
    parser.add_argument("--sizes", default="5,10,20,50,100,200", help="latent sizes of part 1")
    parser.add_argument("--alpha", type=float, default=0.01, help="VSC α of part 1")
    parser.add_argument("--seeds", type=int, default=3, help="seeds of part 1")
    parser.add_argument("--first-seed", type=int, default=0, help="seeds of part 1 are first-seed, first-seed + 1, …")
    parser.add_argument("--epochs", type=int, default=200, help="epochs of parts 1 and 2")
    parser.add_argument("--hidden", default="200", help="hidden widths, comma-separated")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--slope-warmup", type=float, default=0.5, help="share of the epochs for the slope 50→200")
    parser.add_argument("--pretrain", type=float, default=0.1, help="share of the epochs of spike pre-training (λ=0)")
    parser.add_argument("--pretrain-ramp", type=float, default=0.1, help="share of the epochs for λ 0→1")
    parser.add_argument("--spike-factor", type=float, default=None,
                        help="roll back an epoch (halving the rates) on a step loss above this x the running median "
                             "or on NaN (Checkpointing.spike_factor); default: no guard")
    parser.add_argument("--models", default="vsc,vae", help="models of part 1")
    parser.add_argument("--kl-warmup", type=float, default=0.25, help="share of the epochs of KL warm-up (library default)")
    parser.add_argument("--max-labelled", type=int, default=5_000)
    parser.add_argument("--max-test", type=int, default=1_000, help="test points for the IW NLL")
    parser.add_argument("--iw-samples", type=int, default=50)
    parser.add_argument("--alphas", default="0.01,0.05,0.1,0.2,0.5,0.8", help="α grid of part 2")
    parser.add_argument("--alpha-latent", type=int, default=200)
    parser.add_argument("--alpha-seeds", type=int, default=2)
    parser.add_argument("--smiley-n", type=int, default=10_000)
    parser.add_argument("--smiley-test", type=int, default=4_000)
    parser.add_argument("--smiley-latent", type=int, default=20)
    parser.add_argument("--smiley-epochs", type=int, default=60)
    parser.add_argument("--smiley-alpha", type=float, default=0.01)
    parser.add_argument("--smiley-likelihood", default="gaussian", choices=["gaussian", "bernoulli"])
    parser.add_argument("--smiley-min-feature-sd", type=float, default=0.05,
                        help="drop Smiley pixels whose training sd is below this (0 keeps all 1024)")
    parser.add_argument("--smiley-seeds", type=int, default=1)
    parser.add_argument("--betas", default="1,4", help="β grid of the Smiley β-VAE")
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    hidden = _ints(args.hidden)
    sched = (args.slope_warmup, args.pretrain, args.pretrain_ramp)
    common = {
        "data": args.data, "fashion_train": args.fashion_train, "fashion_test": args.fashion_test,
        "min_feature_sd": args.min_feature_sd,
        "hidden": hidden, "lr": args.lr, "batch_size": args.batch_size, "schedule": sched,
        "kl_warmup_fraction": args.kl_warmup, "max_labelled": args.max_labelled,
        "max_test": args.max_test, "iw_samples": args.iw_samples, "likelihood": "gaussian", "beta": 1.0,
        "alpha": None, "epochs": args.epochs, "spike_factor": args.spike_factor,
    }
    models = set(args.models.split(","))
    jobs = []
    if "smiley" in parts:
        smiley_common = {
            **common, "part": "smiley", "latent_dim": args.smiley_latent, "epochs": args.smiley_epochs,
            "likelihood": args.smiley_likelihood, "smiley_n": args.smiley_n, "smiley_test": args.smiley_test,
            "min_feature_sd": args.smiley_min_feature_sd,
        }
        for seed in range(args.smiley_seeds):
            jobs.append({**smiley_common, "model": "vsc", "alpha": args.smiley_alpha, "seed": seed,
                         "label": f"VSC α={args.smiley_alpha:g}"})
            for beta in _floats(args.betas):
                jobs.append({**smiley_common, "model": "vae", "beta": beta, "seed": seed, "label": f"β-VAE β={beta:g}"})
    if "alpha" in parts:
        for alpha in _floats(args.alphas):
            for seed in range(args.alpha_seeds):
                jobs.append({**common, "part": "alpha", "model": "vsc", "alpha": alpha, "seed": seed,
                             "latent_dim": args.alpha_latent, "label": f"VSC α={alpha:g}"})
    if "classification" in parts:
        for K in sorted(_ints(args.sizes), reverse=True):  # longest first
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                if "vsc" in models:
                    jobs.append({**common, "part": "classification", "model": "vsc", "alpha": args.alpha,
                                 "seed": seed, "latent_dim": K, "label": f"VSC α={args.alpha:g}"})
                if "vae" in models:
                    jobs.append({**common, "part": "classification", "model": "vae", "seed": seed,
                                 "latent_dim": K, "label": "VAE"})

    start = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(run, jobs))
    wall = time.perf_counter() - start

    X_train, y_train, X_test, y_test = load_data(args.data, args.fashion_train, args.fashion_test, args.min_feature_sd)
    labelled = np.random.default_rng(0).permutation(X_train.shape[0])[: args.max_labelled]
    pixel_accuracy = classify(X_train[labelled], y_train[labelled], X_test, y_test)

    suffix = "" if args.data == "digits" else f"_{args.data}"
    os.makedirs(args.out, exist_ok=True)
    path = lambda name, ext: os.path.join(args.out, f"{name}{suffix}.{ext}")  # noqa: E731
    by_part = {part: [r for r in results if r["part"] == part] for part in ("classification", "alpha", "smiley")}
    # Parts that were not run keep their earlier results in the JSON file.
    record = {}
    if os.path.exists(path("vsc_classification", "json")):
        with open(path("vsc_classification", "json")) as stream:
            record = json.load(stream)
    for part, part_results in by_part.items():
        if part in parts:
            record[part] = part_results
            record.setdefault("args", {})[part] = vars(args)
            record.setdefault("wall_seconds", {})[part] = wall
    record.update(pixel_accuracy=pixel_accuracy, n_train=int(X_train.shape[0]), n_test=int(X_test.shape[0]))
    with open(path("vsc_classification", "json"), "w") as stream:
        json.dump(record, stream, indent=1)
    setup = (
        f"{args.data}: {X_train.shape[0]} train / {X_test.shape[0]} test images, {len(labelled)} labelled, "
        f"{X_train.shape[1]} pixels with training sd ≥ {args.min_feature_sd:g}; "
        f"hidden {tuple(hidden)}, {args.epochs} epochs, batch {args.batch_size}, lr {args.lr}, "
        f"slope 50→200 over {args.slope_warmup:.0%}, spike pre-training {args.pretrain:.0%} + ramp "
        f"{args.pretrain_ramp:.0%}, KL warm-up {args.kl_warmup:.0%} of the epochs; "
        + ("no divergence guard; " if args.spike_factor is None else
           f"rollback guard at {args.spike_factor:g}x the running median loss; ")
        + f"NLL with {args.iw_samples} importance samples on ≤{args.max_test} test points; mean ± sd over seeds."
    )
    printed = []
    if by_part["classification"]:
        header = f"VAE vs VSC (α = {args.alpha:g}), {args.seeds} seeds. " + setup
        markdown = classification_table(by_part["classification"], pixel_accuracy, header)
        markdown += classification_targets(by_part["classification"], f"VSC α={args.alpha:g}")
        with open(path("vsc_classification", "md"), "w") as stream:
            stream.write(markdown + "\n")
        accuracy_figure(by_part["classification"], pixel_accuracy, path("vsc_accuracy", "png"), args.data)
        printed.append(markdown)
    if by_part["alpha"]:
        header = f"VSC at K = {args.alpha_latent} and varying α, {args.alpha_seeds} seeds. " + setup
        markdown = alpha_table(by_part["alpha"], header)
        with open(path("vsc_alpha", "md"), "w") as stream:
            stream.write(markdown + "\n")
        alpha_figure(by_part["alpha"], path("vsc_alpha", "png"), args.data, args.alpha_latent)
        printed.append(markdown)
    if by_part["smiley"]:
        pixels = next((r["num_pixels"] for r in by_part["smiley"] if "num_pixels" in r), "?")
        header = (
            f"Smiley: {args.smiley_n} train / {args.smiley_test} test images, {pixels} of 1024 pixels "
            f"(training sd ≥ {args.smiley_min_feature_sd:g}), K = {args.smiley_latent}, "
            f"{args.smiley_likelihood} likelihood, hidden {tuple(hidden)}, {args.smiley_epochs} epochs, batch "
            f"{args.batch_size}, lr {args.lr}, {args.smiley_seeds} seed(s). |corr| between each generating "
            "variable (rows where its attribute is present) and each code (VSC: sparse mode; β-VAE: mean). "
            "Latents used: VSC γ>½ on ≥1% of test points; β-VAE Var E[z|x] > 0.01."
        )
        markdown = smiley_table(by_part["smiley"], header)
        with open(path("vsc_smiley", "md"), "w") as stream:
            stream.write(markdown + "\n")
        smiley_figure(by_part["smiley"], path("vsc_smiley_corr", "png"))
        printed.append(markdown)
    print("\n\n".join(printed))
    print(f"\nwall-clock {wall:.0f} s for {len(jobs)} fits on {args.jobs} processes")


if __name__ == "__main__":
    main()
