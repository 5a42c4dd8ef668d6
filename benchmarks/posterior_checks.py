"""
Posterior checks with ArviZ (``pyro_sparse.evaluation.diagnostics``) on two fits:

* ``ssl_dgm`` on the synthetic data of Moran et al. (2022), Eq. 9 (the
  README's example: ρ = 0.6, K = 5, Table 6 settings): the posterior
  predictive density of every feature against the data (``ppc.png``; under
  arviz >= 1.0, one ``ppc_<epochs>.png`` per fit), the
  per-feature checks of means and variances, and the Pareto k̂ of the
  importance ratios p(x_i, z) / q(z | x_i) per data point;
* binary data from a one-factor logistic model fitted by a VAE with the
  bernoulli and with the (wrong) gaussian likelihood: the check of the
  fraction of zeros tells them apart.

Writes the figures, ``posterior_checks.md`` and ``posterior_checks.json``.

    python benchmarks/posterior_checks.py --out benchmarks/results
"""

import argparse
import json
import os
import time
import warnings

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pyro
import torch

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)  # arviz 0.x announces its 1.0 refactor on import
    import arviz as az

    import pyro_sparse
    from pyro_sparse.data.synthetic import synthetic_sparse_dgm
    from pyro_sparse.evaluation import diagnostics

FEATURES = ["z1", "2 z1", "3 z1²", "4 z2", "5 z2", "6 sin z2", "7 z1 z2"]  # Eq. 9's means


def binary_data(n=1000, features=20, seed=0):
    """x_ij ~ Bernoulli(sigmoid(a_j z_i - 2)), z_i ~ N(0, 1): most entries are 0."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, 1)) @ (2 * rng.normal(size=(1, features))) - 2
    return (rng.random((n, features)) < 1 / (1 + np.exp(-logits))).astype(np.float32)


def check_rows(checks, statistic):
    rows = checks.sel(statistic=statistic)
    return [
        {
            "feature": str(feature),
            "observed": float(rows["observed"].sel(feature=feature)),
            "replicated_mean": float(rows["replicated_mean"].sel(feature=feature)),
            "replicated_sd": float(rows["replicated_sd"].sel(feature=feature)),
            "p_value": float(rows["p_value"].sel(feature=feature)),
        }
        for feature in checks["feature"].values
    ]


def plot_ppc(fits, path):
    """
    One row of per-feature posterior predictive densities per fit (``fits``:
    label -> ArviZ data).  arviz >= 1.0 has no ``plot_ppc``: there each fit
    gets its own ``plot_ppc_dist`` figure, ``<path stem>_<label>.png``.
    """
    if diagnostics.ARVIZ_DATATREE:
        stem, extension = os.path.splitext(path)
        for label, data in fits.items():
            az.plot_ppc_dist(data, num_samples=50, cols=["feature"]).savefig(f"{stem}_{label.split()[0]}{extension}")
        return
    names = next(iter(fits.values()))["observed_data"]["feature"].values
    figure, axes = plt.subplots(len(fits), len(names), figsize=(2.6 * len(names), 2.4 * len(fits)), squeeze=False)
    for row, (label, data) in zip(axes, fits.items()):
        az.plot_ppc(data, flatten=["data_point"], num_pp_samples=50, ax=row, textsize=9)
        for ax, name in zip(row, names):
            ax.set_title(f"x: {name}", fontsize=10)
            ax.set_xlabel("")
            if ax is not axes[0, 0]:
                ax.get_legend().remove()
        row[0].set_ylabel(label, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def khat_summary(khat):
    return {
        "median": float(np.median(khat)),
        "q90": float(np.quantile(khat, 0.9)),
        "max": float(khat.max()),
        "share_above_0.5": float((khat > 0.5).mean()),
        "share_above_0.7": float((khat > 0.7).mean()),
    }


def check_synthetic(epochs, args):
    """Fit ssl_dgm for ``epochs``; its ArviZ data and the results of its checks."""
    synthetic = synthetic_sparse_dgm(n=1000, rho=0.6, seed=0)
    start = time.perf_counter()
    fitted = pyro_sparse.train(
        "ssl_dgm", synthetic.X, latent_dim=5, max_epochs=epochs, batch_size=100, lr=0.01,
        hidden_dims=(50, 50, 50), seed=0, progress=False,
    )
    result = {"epochs": epochs, "fit_seconds": time.perf_counter() - start}
    pyro.set_rng_seed(0)
    start = time.perf_counter()
    data = fitted.to_arviz(synthetic.X, num_samples=args.draws, feature_names=FEATURES)
    result["to_arviz_seconds"] = time.perf_counter() - start
    checks = diagnostics.predictive_checks(data, statistics=["mean", "variance"])
    result["checks"] = {statistic: check_rows(checks, statistic) for statistic in ("mean", "variance")}
    start = time.perf_counter()
    result["khat"] = khat_summary(diagnostics.pareto_khat(fitted, synthetic.X, num_samples=args.khat_draws))
    result["khat_seconds"] = time.perf_counter() - start
    return data, result


def check_zero_fraction(args):
    """VAEs with the bernoulli and the gaussian likelihood on binary data: the zero-fraction check."""
    binary = binary_data()
    results = {}
    for likelihood in ("bernoulli", "gaussian"):
        vae = pyro_sparse.train(
            "vae", binary, latent_dim=1, likelihood=likelihood, max_epochs=50, batch_size=100, lr=0.01,
            hidden_dims=(32,), seed=0, progress=False,
        )
        pyro.set_rng_seed(0)
        checks = diagnostics.predictive_checks(vae.to_arviz(binary, num_samples=args.draws), ["zero_fraction"])
        results[likelihood] = check_rows(checks, "zero_fraction")
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--short-epochs", type=int, default=20, help="a deliberately undertrained fit for contrast")
    parser.add_argument("--draws", type=int, default=100, help="posterior draws per data point for the PPC")
    parser.add_argument("--khat-draws", type=int, default=500, help="importance draws per data point for k̂")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    if args.draws < 50:
        parser.error("--draws must be at least 50: the PPC figure shows 50 replicates")
    if args.khat_draws < 100:
        parser.error("--khat-draws must be at least 100: with fewer, PSIS fits its Pareto tail to a handful of "
                     "ratios and k̂ reads inf")
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    fits, results = {}, {"draws": args.draws, "khat_draws": args.khat_draws, "ssl_dgm": []}
    for epochs in (args.short_epochs, args.epochs):
        data, result = check_synthetic(epochs, args)
        fits[f"{epochs} epochs"] = data
        results["ssl_dgm"].append(result)
    plot_ppc(fits, os.path.join(args.out, "ppc.png"))
    results["zero_fraction"] = check_zero_fraction(args)
    with open(os.path.join(args.out, "posterior_checks.json"), "w") as stream:
        json.dump(results, stream, indent=1)
    with open(os.path.join(args.out, "posterior_checks.md"), "w") as stream:
        stream.write(markdown(results))
    print(markdown(results))


def markdown(results):
    lines = [
        f"# Posterior checks (`benchmarks/posterior_checks.py`, arviz {az.__version__})",
        "",
        (
            "`ssl_dgm` on the synthetic data (Eq. 9, ρ = 0.6, N = 1000, K = 5, Table 6 settings); "
            f"{results['draws']} posterior draws per point; p = P(T(x_rep) > T(x)) + ½ P(=), "
            "T = the feature's mean or variance over the data points; replicated: mean (sd) of T over draws."
        ),
    ]
    for fit in results["ssl_dgm"]:
        khat = fit["khat"]
        lines += [
            "",
            (
                f"**{fit['epochs']} epochs** (fit {fit['fit_seconds']:.0f} s, "
                f"`to_arviz` {fit['to_arviz_seconds']:.1f} s, k̂ {fit['khat_seconds']:.0f} s). "
                f"Pareto k̂ of the importance ratios ({results['khat_draws']} draws per point): "
                f"median {khat['median']:.2f}, 90% quantile {khat['q90']:.2f}, max {khat['max']:.2f}; "
                f"{100 * khat['share_above_0.5']:.1f}% of points above 0.5, "
                f"{100 * khat['share_above_0.7']:.1f}% above 0.7."
            ),
            "",
            "| feature | mean: data | replicated | p | variance: data | replicated | p |",
            "|---|---|---|---|---|---|---|",
        ]
        for mean, variance in zip(fit["checks"]["mean"], fit["checks"]["variance"]):
            lines.append(
                f"| {mean['feature']} | {mean['observed']:.3f} | {mean['replicated_mean']:.3f} "
                f"({mean['replicated_sd']:.3f}) | {mean['p_value']:.2f} | {variance['observed']:.2f} | "
                f"{variance['replicated_mean']:.2f} ({variance['replicated_sd']:.2f}) | {variance['p_value']:.2f} |"
            )
    bernoulli, gaussian = results["zero_fraction"]["bernoulli"], results["zero_fraction"]["gaussian"]
    p_bernoulli = [b["p_value"] for b in bernoulli]
    lines += [
        "",
        (
            "**Binary data** (N = 1000, 20 features, one logistic factor; VAE, K = 1, 50 epochs): "
            "fraction of zeros, data vs replicates, first 5 features."
        ),
        "",
        "| feature | data | bernoulli fit | p | gaussian fit | p |",
        "|---|---|---|---|---|---|",
    ]
    for b, g in list(zip(bernoulli, gaussian))[:5]:
        lines.append(
            f"| {b['feature']} | {b['observed']:.3f} | {b['replicated_mean']:.3f} | {b['p_value']:.2f}"
            f" | {g['replicated_mean']:.3f} | {g['p_value']:.2f} |"
        )
    lines += [
        "",
        (
            f"All 20 features: bernoulli p in [{min(p_bernoulli):.2f}, {max(p_bernoulli):.2f}]; "
            f"gaussian p at most {max(g['p_value'] for g in gaussian):.2f}."
        ),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
