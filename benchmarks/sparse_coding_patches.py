"""
Sparse coding of whitened natural-image patches with a linear generator
(Fallah & Rozell, "Variational Sparse Coding with Learned Thresholding", ICML
2022, Sec. 4.1 / Table 1; issue 20): a dictionary A (K atoms) learned by FISTA
(MAP, Eq. 10) and by variational inference with several code priors, all
through ``pyro_sparse.train``, FISTA and the all-zero code in the same run.

Protocol
--------
* Data: ``pyro_sparse.data.patches.whitened_patches`` (photographs shipped
  with scikit-learn / scikit-image, Olshausen-Field whitening, per-pixel
  standardisation, train/validation split *by image*).  Default: 8x8 patches,
  64 atoms, 10,000 / 2,000 patches, 200 epochs (``train``'s default), seeds
  0 1337 747 (the paper's);
  ``--patch-size 16 --atoms 256`` is the paper's size (80,000 / 16,000 patches,
  300 epochs there).  ``--quick``: 8x8, 5,000 / 1,000 patches, 10 epochs, seed
  0, FISTA and the thresholded Laplacian only; it exits with status 1 if the
  thresholded Laplacian's objective is not below the all-zero code's (the
  test suite runs it).
* FISTA: ``baselines.fista.learn_dictionary`` (λ = 20, κ = 1e-3, SGD lr 0.5
  decayed 0.99 per epoch, batch 100, the λ warm-up of Appendix D reaching 1
  after a third of the run), validation codes by ``fista`` at λ = 20.  Outside
  ``--quick`` also "FISTA, principal start": the same, started from the
  patches' principal directions at norm 6 (instead of random unit atoms), so
  that most atoms are in use at the start -- does Eq. 10 at λ = 20 keep them?
* Variational rows: ``train(model, patches, decoder="linear", latent_dim=K)``
  with the library's defaults (``tvsc``: Adam lr 1e-3, dictionary lr 0.1,
  decay 0.99 per epoch, KL warm-up over a quarter of the run, rollback on
  divergence or on a step loss above 10x the running median), J = 1 particle;
  the spike-and-slab row (``vsc``, Gumbel-softmax straight-through, prior
  spike probability 0.1, an N(0, 0.1) slab (variance 0.1), Appendix D's slab pre-training and temperature
  schedule rescaled to the run) gets the same optimiser settings.  Each row
  changes only the code prior; the "variants" change one choice of the
  thresholded Laplacian at a time (KL, threshold, estimator, atom norms,
  particles), and
  "paper's recipe" is the paper's combination (straight-through, Eq. 5 base
  KL, the prior's λ0 in q, the scale warm-up ω of Appendix B).

Columns
-------
* objective: mean over validation patches of ½‖x − Az‖² + 20‖z‖₁ (Eq. 10,
  ``sparse_coding_objective``) with the row's dictionary and its *mode* codes
  (``transform``: exactly 0 where P(z = 0) > 1/2); "FISTA re-coding": the same
  with FISTA's codes for the row's dictionary (scores the dictionary alone).
* density: fraction of non-zero mode codes; dead atoms: used by no
  validation patch (and by none of the first 2,000 training patches);
  coherence: largest |cos| between two atoms (``evaluation.dictionary``).
* IWAE: −mean ``heldout_log_likelihood`` (nats per patch, importance weighted).
* spikes: rollbacks triggered by a step loss above 10x the running median
  after the KL warm-up (the default ``Checkpointing(spike_factor=10)``), and
  NaN rollbacks; "epoch spikes": epochs whose mean loss is above 10x the
  median of the earlier post-warm-up epochs.

``--ssl-dgm`` checks thresholded codes inside the sparse VAE instead (issue
20, item 5): ``train("ssl_dgm", X, latent_dim=5, latent_prior="thresholded_laplace")``
on ``synthetic_correlated_factors`` (3 correlated factors with anchors, 30
features, 2,000 training / 1,000 held-out points), with ``ssl_dgm``'s
defaults for the prior (unit-scale codes, b0 = 1, the prior's threshold
learned per code from λ0 = 1, augmented KL) and with each of them changed
(exact KL; a fixed λ0 = 1, 37 % non-zero a priori; the prior's own patch
defaults b0 = 0.1, λ0 = 0.25), and thresholded Gaussian codes with
``ssl_dgm``'s defaults, against the Gaussian-latent ``ssl_dgm`` (and, as a
row, the same with K = 3, one code per factor: what the spare codes are worth
in held-out NLL): the share of
exact zeros in the codes (and how many of the K codes are always 0), F(W)
of the decoder support (``match_factors``, ``support_f_score``) and the
held-out NLL (100 importance samples); the targets are scored on the
default row.  Writes ``results/sparse_coding_patches_ssl_dgm.json`` / ``.md``.

Writes ``results/sparse_coding_patches{tag}.json`` / ``.md`` / ``.png``
(dictionaries of FISTA and of the thresholded Laplacian, seed of the first
run, and the per-atom usage).

    python benchmarks/sparse_coding_patches.py --quick           # < 2 min
    python benchmarks/sparse_coding_patches.py                   # 8x8, 3 seeds, every row
    python benchmarks/sparse_coding_patches.py --patch-size 16 --atoms 256 --methods thr_laplace tl_paper --tag _16
    python benchmarks/sparse_coding_patches.py --ssl-dgm
"""

import argparse
import json
import math
import os
import platform
import sys
import time
import traceback
import warnings
from pathlib import Path

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import pyro_sparse  # noqa: E402
from pyro_sparse import Checkpointing, Optimization  # noqa: E402
from pyro_sparse.baselines.fista import fista, learn_dictionary  # noqa: E402
from pyro_sparse.data.patches import whitened_patches  # noqa: E402
from pyro_sparse.data.synthetic import synthetic_correlated_factors  # noqa: E402
from pyro_sparse.evaluation import (  # noqa: E402
    feature_collapse,
    heldout_nll,
    match_factors,
    multi_information,
    support_f_score,
)
from pyro_sparse.evaluation.dictionary import dead_atoms, dictionary_grid, sparse_coding_report  # noqa: E402
from pyro_sparse.infer.loop import TrainingDivergedError  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
LAM = 20.0  # Eq. 10's λ: ~10 % non-zero FISTA codes in the paper (Sec. 4.1)
SPIKE_FACTOR = 10.0
TRAIN_USAGE_POINTS = 2000  # training patches on which dead atoms are counted too
PRINCIPAL_START_NORM = 6.0  # atoms of the principal start: about the norm FISTA's atoms reach (5.6)

# Table 1 rows in the paper's order: (label, model, options).
TABLE1 = {
    "gaussian": ("Gaussian", "tvsc", dict(latent_prior="thresholded_normal", threshold=None)),
    "laplacian": ("Laplacian", "tvsc", dict(latent_prior="thresholded_laplace", threshold=None)),
    # Appendix D: prior "scale" 0.1 "when applicable" and κ = 1e-4 for the variational methods; for a Gaussian
    # slab the authors' code reads 0.1 as the variance (as for the thresholded Gaussian's σ0² = 0.1).
    "spike_slab": ("Spike-and-slab", "vsc", dict(alpha=0.1, slab_scale=math.sqrt(0.1))),
    "thr_gaussian": ("Thresholded Gaussian", "tvsc", dict(latent_prior="thresholded_normal")),
    "thr_gaussian_gamma": ("Thresholded Gaussian+Gamma", "tvsc",
                           dict(latent_prior="thresholded_normal", learn_threshold=True)),
    "thr_laplace": ("Thresholded Laplacian", "tvsc", dict()),
    "thr_laplace_gamma": ("Thresholded Laplacian+Gamma", "tvsc", dict(learn_threshold=True)),
}
# The thresholded Laplacian with one choice changed (the defaults: amortised threshold, exact KL, jump).
VARIANTS = {
    "tl_augmented_kl": ("TL, augmented KL", "tvsc", dict(kl="augmented")),
    "tl_base_kl": ("TL, base KL (Eq. 5; q uses λ0)", "tvsc", dict(kl="base")),
    "tl_fixed_threshold": ("TL, q uses λ0", "tvsc", dict(amortized_threshold=False)),
    "tl_straight_through": ("TL, straight-through (Eq. 4)", "tvsc", dict(estimator="straight_through")),
    "tl_subgradient": ("TL, subgradient", "tvsc", dict(estimator="subgradient")),
    "tl_free_norms": ("TL, free atom norms (the paper's)", "tvsc", dict(shared_atom_norm=False)),
    "tl_J20": ("TL, J = 20 max-ELBO (Eq. 9)", "tvsc", dict(num_particles=20)),
    "tl_paper": ("TL, paper's recipe", "tvsc", dict(estimator="straight_through", kl="base",
                                                     amortized_threshold=False, scale_warmup_start=0.1)),
}
# The spike-and-slab baseline with other slabs: VSC's own N(0, 1) (Tonolini et al.) and N(0, 0.1²) (Appendix D's
# 0.1 read as a standard deviation).
SPIKE_SLAB_VARIANTS = {
    "spike_slab_unit": ("Spike-and-slab, N(0, 1) slab", "vsc", dict(alpha=0.1)),
    "spike_slab_sd01": ("Spike-and-slab, N(0, 0.1²) slab", "vsc", dict(alpha=0.1, slab_scale=0.1)),
}
ROWS = {**TABLE1, **VARIANTS, **SPIKE_SLAB_VARIANTS}
THRESHOLDED_LAPLACE = ["thr_laplace", "thr_laplace_gamma", *VARIANTS]

# The paper's Table 1 (J = 1 / J = 20), 16x16 patches, 80k training patches, 300 epochs.
PAPER = {
    "fista": (101, 101), "gaussian": (1350, 1350), "laplacian": (596, 579), "spike_slab": (252, 239),
    "thr_gaussian": (232, 230), "thr_gaussian_gamma": (285, 270), "thr_laplace": (198, 194),
    "thr_laplace_gamma": (223, 211),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--patch-size", type=int, default=8)
    p.add_argument("--atoms", type=int, default=None, help="dictionary size K (default: patch_size**2)")
    p.add_argument("--num-train", type=int, default=10_000)
    p.add_argument("--num-val", type=int, default=2_000)
    p.add_argument("--epochs", type=int, default=200, help="epochs for FISTA and every variational row (train's default)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1337, 747])
    p.add_argument("--methods", nargs="+", default=list(ROWS), choices=list(ROWS))
    p.add_argument("--iwae-points", type=int, default=500)
    p.add_argument("--iwae-samples", type=int, default=50)
    p.add_argument("--mi-points", type=int, default=2000)
    p.add_argument("--quick", action="store_true", help="8x8, 5000/1000 patches, 10 epochs, seed 0, TL only")
    p.add_argument("--ssl-dgm", action="store_true", help="thresholded codes in ssl_dgm on correlated factors")
    p.add_argument("--ssl-dgm-rows", nargs="+", default=list(SSL_DGM_ROWS), choices=list(SSL_DGM_ROWS),
                   help=f"rows of --ssl-dgm ({', '.join(SSL_DGM_REQUIRED)} always run)")
    p.add_argument("--factor-zeros", type=float, default=0.0,
                   help="--ssl-dgm on sparse factors: this share of each factor's values exactly 0 (default: dense)")
    p.add_argument("--out", default=str(RESULTS), help="output folder")
    p.add_argument("--tag", default="", help="suffix of the output files")
    args = p.parse_args(argv)
    if args.factor_zeros and not args.ssl_dgm:
        p.error("--factor-zeros sets the factors of --ssl-dgm; give --ssl-dgm too")
    if args.quick:
        args.patch_size, args.num_train, args.num_val, args.epochs = 8, 5000, 1000, 10
        args.seeds, args.methods, args.iwae_points, args.mi_points = [0], ["thr_laplace"], 200, 0
        args.tag = args.tag or "_quick"
    args.atoms = args.atoms or args.patch_size**2
    return args


# --------------------------------------------------------------------------- runs


def principal_start(X, num_atoms):
    """The leading principal directions of the patches at norm PRINCIPAL_START_NORM (cycled if K > G)."""
    _, _, vt = torch.linalg.svd(X - X.mean(0), full_matrices=False)
    return vt.T[:, torch.arange(num_atoms) % vt.shape[0]] * PRINCIPAL_START_NORM


def run_fista(args, data, seed, start="random"):
    """Classical dictionary learning; ``start="principal"`` starts from the principal directions instead."""
    X, V = torch.as_tensor(data.train), torch.as_tensor(data.validation)
    steps = args.epochs * (X.shape[0] // 100)
    init = principal_start(X, args.atoms) if start == "principal" else None
    t0 = time.perf_counter()
    A = learn_dictionary(X, args.atoms, LAM, kappa=1e-3, num_epochs=args.epochs, batch_size=100, lr=0.5,
                         lr_decay=0.99, warmup=True, warmup_increment=0.9 / max(1.0, steps / 3), seed=seed,
                         init=init)
    seconds = time.perf_counter() - t0
    codes = fista(V, A, LAM, num_iterations=2000, tol=1e-5)
    report = sparse_coding_report(V, A, codes, LAM)
    train_codes = fista(X[:TRAIN_USAGE_POINTS], A, LAM, num_iterations=2000, tol=1e-5)
    row = "fista" if start == "random" else "fista_principal"
    rec = dict(key=f"{row}/seed{seed}", row=row, seed=seed, status="ok", train_seconds=seconds,
               **report.as_dict(), dead_atoms_train=len(dead_atoms(train_codes.numpy())),
               dictionary=A.numpy().tolist())
    if init is not None:
        rec["dead_atoms_start"] = len(dead_atoms(fista(V, init, LAM, num_iterations=2000, tol=1e-5).numpy()))
    return rec


def vsc_schedule(args, steps_per_epoch):
    """Appendix D's slab pre-training (1,500 + 5,000 iterations) and τ decay, rescaled to a third of the run."""
    rescale = max(1.0, args.epochs * steps_per_epoch / 3) / 4500
    return dict(spike_estimator="straight_through", pretrain_epochs=1500 * rescale / steps_per_epoch,
                pretrain_ramp_epochs=5000 * rescale / steps_per_epoch, temperature_start=1.0,
                temperature_end=0.5, temperature_decay=0.9995 ** (1 / rescale))


def train_options(args, row, seed, num_train):
    """``train``'s arguments for a row: the library's tvsc defaults, made explicit where a row sets particles."""
    _, model, options = ROWS[row]
    options = dict(options)
    J = options.pop("num_particles", 1)
    if model == "vsc":  # the encoder of tvsc's linear generator (one layer of 4G units)
        options.update(vsc_schedule(args, math.ceil(num_train / 100)), hidden_dims=(4 * args.patch_size**2,))
    return model, dict(
        decoder="linear", latent_dim=args.atoms, max_epochs=args.epochs, batch_size=100, lr=1e-3, seed=seed,
        progress=False, device="cpu",
        optimization=Optimization(global_lr=0.1, lr_decay=0.99, num_particles=J,
                                  particle_reduction="max" if J > 1 else "mean"),
        checkpointing=Checkpointing(on_divergence="rollback", spike_factor=SPIKE_FACTOR),
        **options,
    ), J


def epoch_spikes(losses, warmup_epochs):
    """Epochs after the KL warm-up whose mean loss is above 10x the median of the earlier post-warm-up epochs."""
    after = [v for v in losses[int(math.ceil(warmup_epochs)):]]
    return sum(1 for i in range(3, len(after)) if after[i] > np.median(after[:i]) + 9 * abs(np.median(after[:i])))


def run_variational(args, data, row, seed):
    label, _, _ = ROWS[row]
    model, options, J = train_options(args, row, seed, data.train.shape[0])
    rec = dict(key=f"{row}/seed{seed}", row=row, label=label, seed=seed, J=J, model=model,
               options={k: v for k, v in options.items() if isinstance(v, (int, float, str, type(None)))})
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    try:
        fitted = pyro_sparse.train(model, data.train, **options)
    except TrainingDivergedError as error:
        rec.update(status="diverged", error=str(error)[:500], train_seconds=time.perf_counter() - t0)
        return rec, None
    except Exception as error:  # noqa: BLE001 -- record the failure and go on with the other rows
        rec.update(status=f"error: {type(error).__name__}", error=traceback.format_exc(limit=3)[-1500:],
                   train_seconds=time.perf_counter() - t0)
        return rec, None
    reasons = [event["reason"] for event in fitted.history_["rollbacks"]]
    rec.update(status="ok", train_seconds=time.perf_counter() - t0,
               spike_rollbacks=sum(reason.startswith("loss spike") for reason in reasons),
               nan_rollbacks=sum(not reason.startswith("loss spike") for reason in reasons))
    losses = fitted.history_["train_loss"]
    rec["train_loss"] = losses
    rec["epoch_spikes"] = epoch_spikes(losses, args.epochs / 4)
    V = data.validation
    A = torch.as_tensor(fitted.dictionary_)
    codes = fitted.transform(V)
    rec.update(sparse_coding_report(V, A, codes, LAM).as_dict())
    rec["dead_atoms_train"] = len(dead_atoms(fitted.transform(data.train[:TRAIN_USAGE_POINTS])))
    rec["dictionary"] = A.numpy().tolist()
    n = min(args.iwae_points, V.shape[0])
    rec["iwae"] = float(-np.mean(fitted.heldout_log_likelihood(V[:n], num_samples=args.iwae_samples)))
    rec["feature_collapse"] = feature_collapse(codes)
    if args.mi_points and np.any(codes != 0):
        rec["multi_information"] = multi_information(codes, max_samples=args.mi_points, random_state=0)
    return rec, fitted


# --------------------------------------------------------------------------- summary


def stats(records, field):
    values = [r[field] for r in records if r.get("status") == "ok" and r.get(field) is not None]
    if not values:
        return None, None
    return float(np.mean(values)), (float(np.std(values, ddof=1)) if len(values) > 1 else 0.0)


def cell(records, field, spec=".3g", scale=1.0, suffix=""):
    mean, sd = stats(records, field)
    failed = [r["status"] for r in records if r.get("status") != "ok"]
    if mean is None:
        return failed[0] if failed else "–"
    text = f"{format(scale * mean, spec)} ± {format(scale * sd, spec)}{suffix}"
    return text + (f" ({len(failed)} failed)" if failed else "")


def targets(fista_recs, runs, zero):
    """
    The issue-20 targets, from the means over seeds, for the library's default row (``thr_laplace``) and, when
    another thresholded-Laplacian row has a lower objective, for that best row too.  A row that was run but
    did not finish every seed misses its targets, and so does the ordering when one of its four rows did not.
    """
    by_row = {}
    for r in runs:
        by_row.setdefault(r["row"], []).append(r)
    mean = {row: stats(recs, "objective")[0] for row, recs in by_row.items()}
    fista_obj = stats(fista_recs, "objective")[0]
    if fista_obj is None:
        return {"FISTA finished (every target is measured against it)": (0, len(fista_recs), False)}
    tl_rows = [row for row in THRESHOLDED_LAPLACE if mean.get(row) is not None]
    out = {}
    best = min(tl_rows, key=mean.get) if tl_rows else None
    if best is not None:
        out["best thresholded-Laplacian row"] = best
    for row in dict.fromkeys(row for row in ("thr_laplace", best) if row in by_row):
        out.update(row_targets(row, by_row[row], fista_obj, zero))
    # A run that diverged past its rollbacks counts as one spike more (it recorded none of its own).
    spikes = sum(r.get("spike_rollbacks", 0) + r.get("nan_rollbacks", 0) + r.get("epoch_spikes", 0)
                 + (r.get("status") == "diverged") for rows in by_row.values() for r in rows)
    out["spikes / rollbacks / divergences, all rows and seeds"] = (spikes, 0, spikes == 0)
    order = ["thr_laplace", "spike_slab", "laplacian", "gaussian"]
    if all(row in by_row for row in order):
        name = "Table 1 ordering thresholded < spike-and-slab < Laplacian < Gaussian"
        if all(r.get("status") == "ok" for row in order for r in by_row[row]):
            values = [mean[row] for row in order]
            out[name] = (values, None, all(a < b for a, b in zip(values, values[1:])))
        else:
            out[name] = "not met: a seed of one of the four rows did not finish"
    return out


def row_targets(row, recs, fista_obj, zero):
    """
    The per-row targets of issue 20: (measured, bound, met) by name, each name prefixed with the row; a row
    with a seed that did not finish misses all of them (the means would be over fewer seeds than asked).
    """
    finished = [r for r in recs if r.get("status") == "ok"]
    checks = {"every seed finished": (len(finished), len(recs), len(finished) == len(recs))}
    if finished:
        objective, recode = stats(recs, "objective")[0], stats(recs, "fista_objective")[0]
        density, dead, dead_train = (stats(recs, field)[0] for field in ("density", "dead_atoms", "dead_atoms_train"))
        K = len(finished[0]["atom_usage"])
        checks.update({
            "objective <= 2x FISTA": (objective, 2 * fista_obj, objective <= 2 * fista_obj),
            "objective >= 30% below the zero code": (objective, 0.7 * zero, objective <= 0.7 * zero),
            "FISTA re-coding <= 1.2x FISTA's dictionary": (recode, 1.2 * fista_obj, recode <= 1.2 * fista_obj),
            "code density in [1%, 20%]": (density, (0.01, 0.2), 0.01 <= density <= 0.2),
            "dead atoms <= 10% (validation patches)": (dead, 0.1 * K, dead <= 0.1 * K),
            "dead atoms <= 10% (training patches)": (dead_train, 0.1 * K, dead_train <= 0.1 * K),
        })
    complete = len(finished) == len(recs)
    return {f"{row}: {name}": (measured, bound, met and complete) for name, (measured, bound, met) in checks.items()}


def principal_directions(X, shares=(0.9, 0.95, 0.99)):
    """How many principal directions of the patches hold each share of their variance (the data's effective rank)."""
    eigenvalues = np.linalg.eigvalsh(np.cov(np.asarray(X, np.float64).T))[::-1]
    cumulative = np.cumsum(eigenvalues) / eigenvalues.sum()
    return {f"{share:g}": int(np.searchsorted(cumulative, share) + 1) for share in shares}


def classical_row(label, recs):
    """A table row of classical dictionary learning (no IWAE, no spikes)."""
    return (f"| {label} | {cell(recs, 'objective')} | {cell(recs, 'fista_objective')} | "
            f"{cell(recs, 'density', '.2g', 100, '%')} | {cell(recs, 'dead_atoms', '.2g')} / "
            f"{cell(recs, 'dead_atoms_train', '.2g')} | {cell(recs, 'coherence_max', '.2f')} | "
            f"{cell(recs, 'mean_atom_norm', '.2f')} | – | – | {cell(recs, 'train_seconds', '.0f')} |")


def markdown(args, config, fista_recs, principal_recs, runs, verdicts, wall):
    zero = config["zero_code_objective"]
    L = ["## Sparse coding of whitened patches (Fallah & Rozell 2022, Table 1; issue 20)\n"]
    L.append(f"`python benchmarks/sparse_coding_patches.py {' '.join(config['argv'])}` — {args.num_train} training / "
             f"{args.num_val} validation {args.patch_size}x{args.patch_size} patches (validation images "
             f"{', '.join(config['validation_images'])}), K = {args.atoms} atoms, {args.epochs} epochs, batch 100, "
             f"seeds {args.seeds}; one process, one torch thread. Wall clock **{wall / 60:.1f} min**. "
             "Cells: mean ± sd over seeds.\n")
    L.append("| row | objective (mode codes) | FISTA re-coding | density | dead atoms (validation / training) | "
             "coherence max | mean ‖a‖ | IWAE (nats) | spikes (step / non-finite / epoch) | train s |")
    L.append("|---|---|---|---|---|---|---|---|---|---|")
    L.append(classical_row("FISTA", fista_recs))
    if principal_recs:
        start = cell(principal_recs, 'dead_atoms_start', '.2g')
        L.append(classical_row(f"FISTA, principal start (dead atoms at the start: {start})", principal_recs))
    for row in args.methods:
        recs = [r for r in runs if r["row"] == row]
        if not recs:
            continue
        spikes = "/".join(str(sum(r.get(k, 0) for r in recs)) for k in ("spike_rollbacks", "nan_rollbacks",
                                                                          "epoch_spikes"))
        L.append(f"| {ROWS[row][0]} | {cell(recs, 'objective')} | {cell(recs, 'fista_objective')} | "
                 f"{cell(recs, 'density', '.2g', 100, '%')} | {cell(recs, 'dead_atoms', '.2g')} / "
                 f"{cell(recs, 'dead_atoms_train', '.2g')} | "
                 f"{cell(recs, 'coherence_max', '.2f')} | {cell(recs, 'mean_atom_norm', '.2f')} | "
                 f"{cell(recs, 'iwae', '.4g')} | {spikes} | {cell(recs, 'train_seconds', '.0f')} |")
    L.append(f"| *all codes 0* | {zero:.3g} | – | 0% | – | – | – | – | – | – |\n")
    shares = config["principal_directions"].items()
    L.append("Effective rank of the training patches (for the dead atoms): " + ", ".join(
        f"{n} principal directions hold {100 * float(share):g} %" for share, n in shares)
        + f" of the variance, of {args.patch_size ** 2}.\n")
    L.append("Paper (16x16, 80k patches, 300 epochs), objective J = 1 / J = 20: " + ", ".join(
        f"{'FISTA' if k == 'fista' else ROWS[k][0]} {a} / {b}" for k, (a, b) in PAPER.items()) + ".\n")
    L.append("### Targets (issue 20)\n")
    L.append("| target | measured | bound | met |")
    L.append("|---|---|---|---|")
    def fmt(v):
        return ", ".join(f"{x:.3g}" for x in v) if isinstance(v, (list, tuple)) else f"{v:.3g}"

    for name, value in verdicts.items():
        if isinstance(value, str):
            L.append(f"| {name} | {value} | | |")
            continue
        measured, bound, met = value
        L.append(f"| {name} | {fmt(measured)} | {'–' if bound is None else fmt(bound)} | "
                 f"{'yes' if met else '**no**'} |")
    L.append("")
    L.append(f"Figure: `{config['figure']}` (dictionaries of the first seed, atoms by decreasing norm; "
             "usage per atom of the validation mode codes).\n")
    return "\n".join(L)


def figure(path, fista_rec, tl_rec):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(f"FISTA (objective {fista_rec['objective']:.3g})", fista_rec)]
    if tl_rec is not None:
        panels.append((f"{tl_rec['label']} (objective {tl_rec['objective']:.3g})", tl_rec))
    fig, axes = plt.subplots(1, len(panels) + 1, figsize=(4.2 * (len(panels) + 1), 4.4))
    cmap = plt.get_cmap("gray").copy()
    cmap.set_bad("white")
    for axis, (title, rec) in zip(axes, panels):
        axis.imshow(dictionary_grid(np.asarray(rec["dictionary"])), cmap=cmap, vmin=-1, vmax=1,
                    interpolation="nearest")
        axis.set_title(title, fontsize=9)
        axis.set_axis_off()
    usage = axes[-1]
    for title, rec in panels:
        usage.plot(100 * np.sort(np.asarray(rec["atom_usage"]))[::-1], label=title.split(" (")[0])
    usage.set_xlabel("atom (by usage)")
    usage.set_ylabel("% of validation patches using it")
    usage.set_yscale("symlog", linthresh=0.1)
    usage.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- thresholded codes in ssl_dgm

SSL_DGM_ROWS = {
    "gaussian": ("Gaussian codes (ssl_dgm default)", {}),
    "gaussian_k3": ("Gaussian codes, K = 3 (one per factor, no spare code)", {"latent_dim": 3}),
    "thresholded": ("thresholded Laplace, ssl_dgm's defaults (b0 = 1, prior λ_k learned per code from 1, "
                    "augmented KL)", {"latent_prior": "thresholded_laplace"}),
    "thresholded_exact": ("the same with the exact KL", {"latent_prior": "thresholded_laplace", "kl": "exact"}),
    "thresholded_fixed": ("thresholded Laplace, fixed λ0 = 1 (b0 = 1, augmented KL)",
                          {"latent_prior": "thresholded_laplace", "learn_prior_threshold": False}),
    "thresholded_fixed_exact": ("the same with the exact KL", {"latent_prior": "thresholded_laplace",
                                                              "learn_prior_threshold": False, "kl": "exact"}),
    "thresholded_patch": ("thresholded Laplace, the prior's patch defaults (b0 = 0.1, fixed λ0 = 0.25), augmented KL",
                          {"latent_prior": "thresholded_laplace", "prior_scale": 0.1, "threshold": 0.25,
                           "learn_prior_threshold": False}),
    "thresholded_normal": ("thresholded Gaussian, ssl_dgm's defaults (σ0 = 1, prior λ_k learned per code from 1, "
                           "exact KL)", {"latent_prior": "thresholded_normal"}),
    "thresholded_warmup": ("thresholded Laplace, ssl_dgm's defaults + threshold warm-up (codes dense through the KL "
                           "warm-up, threshold ramped in over as many epochs)",
                           {"latent_prior": "thresholded_laplace", "threshold_warmup_epochs": None}),
    "thresholded_normal_warmup": ("thresholded Gaussian, ssl_dgm's defaults + threshold warm-up",
                                  {"latent_prior": "thresholded_normal", "threshold_warmup_epochs": None}),
    "thresholded_warmup_restart": ("thresholded Laplace, ssl_dgm's defaults + threshold warm-up + sparse restart "
                                   "(refit from each feature's strongest parent)",
                                   {"latent_prior": "thresholded_laplace", "threshold_warmup_epochs": None,
                                    "sparse_restart": True}),
}
# The rows every --ssl-dgm run fits: the targets compare the default row with the Gaussian codes.
SSL_DGM_REQUIRED = ("gaussian", "thresholded")


def ssl_dgm_check(args, stem):
    """Issue 20, item 5: exact zeros, F(W) and held-out NLL of thresholded codes inside ssl_dgm."""
    wall0, runs = time.perf_counter(), []
    rows = {row: value for row, value in SSL_DGM_ROWS.items()
            if row in SSL_DGM_REQUIRED or row in args.ssl_dgm_rows}
    for seed in args.seeds:
        data = {"num_factors": 3, "num_features": 30, "factor_zeros": args.factor_zeros, "seed": seed}
        train, test = synthetic_correlated_factors(n=2000, **data), synthetic_correlated_factors(n=1000, **data)
        for row, (label, options) in rows.items():
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fitted = pyro_sparse.train("ssl_dgm", train.X, seed=seed, max_epochs=args.epochs, progress=False,
                                           **{"latent_dim": 5, **options})
            codes = fitted.transform(train.X)
            matching = match_factors(codes, train.z)
            zeros = (codes == 0).mean(0)
            runs.append(dict(row=row, seed=seed, zeros=float(zeros.mean()), zeros_per_code=zeros.tolist(),
                             codes_off=int((zeros == 1).sum()),
                             # No code in use: every code 0 on every point, the collapse (100 %).
                             zeros_in_used=float(zeros[zeros < 1].mean()) if (zeros < 1).any() else 1.0,
                             prior_threshold=(fitted.guide.point_estimate("prior_threshold").detach().tolist()
                                              if getattr(fitted.model.latent_prior, "learn_prior_threshold", False)
                                              else None),
                             # W's support as issue 18 defines it (E[γ] > 0.5), as in synthetic_recovery.
                             f_score=support_f_score(fitted.support_, train.support, matching),
                             # The F1 of the matched codes' exact zeros against their factors' zeros.
                             zero_f1=(support_f_score(codes[:, matching] == 0, train.z == 0,
                                                      np.arange(train.z.shape[1]))
                                      if args.factor_zeros > 0 else None),
                             nll=heldout_nll(fitted.heldout_log_likelihood(test.X, num_samples=100)),
                             seconds=time.perf_counter() - t0))
            print(f"[{time.perf_counter() - wall0:5.0f}s] ssl_dgm {row} seed {seed}: zeros "
                  f"{100 * runs[-1]['zeros']:.0f}%, F(W) {runs[-1]['f_score']:.3f}, NLL {runs[-1]['nll']:.2f}",
                  flush=True)
    stem.with_suffix(".json").write_text(json.dumps(dict(config=vars(args), runs=runs), default=float))
    gaussian_nll = stats([dict(r, status="ok") for r in runs if r["row"] == "gaussian"], "nll")
    factors = ("dense factors" if args.factor_zeros == 0 else
               f"sparse factors: {100 * args.factor_zeros:.0f} % of each factor's values exactly 0, `--factor-zeros`")
    L = ["## Thresholded codes inside the sparse VAE (issue 20, item 5)\n",
         "`python benchmarks/sparse_coding_patches.py --ssl-dgm` — `ssl_dgm` (K = 5 unless the row says otherwise, "
         f"its defaults, {args.epochs} epochs) on "
         f"`synthetic_correlated_factors` (3 correlated factors with anchors, {factors}, 30 features; 2,000 "
         f"training, 1,000 held-out points), seeds {args.seeds}; mean ± sd. Wall clock "
         f"{(time.perf_counter() - wall0) / 60:.1f} min.\n"
         + ("" if args.factor_zeros == 0 else
            "\"zero F1\": F1 of the exact zeros of each factor's matched code against the factor's own zeros "
            "(training points).\n"),
         "Targets: 30-90 % exact zeros, over all codes and in the codes in use (a code that is 0 on every point is "
         "a factor switched off, which Gaussian codes show too; 100 % zeros is the collapse the issue names), "
         "F(W) >= 0.7 "
         "(E[γ] > 0.5), held-out NLL at most one sd above the Gaussian codes' "
         f"({gaussian_nll[0]:.2f} ± {gaussian_nll[1]:.2f}).\n",
         "| codes | exact zeros | codes always 0 (of K) | zeros in the other codes | F(W) | held-out NLL "
         "| NLL − Gaussian's | zero F1 | s per fit |", "|---|---|---|---|---|---|---|---|---|"]
    for row, (label, _) in rows.items():
        recs = [dict(r, status="ok") for r in runs if r["row"] == row]
        gap = stats(recs, "nll")[0] - gaussian_nll[0]
        L.append(f"| {label} | {cell(recs, 'zeros', '.2g', 100, '%')} | {cell(recs, 'codes_off', '.2g')} | "
                 f"{cell(recs, 'zeros_in_used', '.2g', 100, '%')} | {cell(recs, 'f_score', '.3f')} | "
                 f"{cell(recs, 'nll', '.4g')} | {gap:+.2f} | {cell(recs, 'zero_f1', '.2f')} | "
                 f"{cell(recs, 'seconds', '.0f')} |")
    default = [r for r in runs if r["row"] == "thresholded"]
    f_score, nll, zeros, zeros_in_used = (float(np.mean([r[k] for r in default]))
                                          for k in ("f_score", "nll", "zeros", "zeros_in_used"))
    # The issue's share of exact zeros over all codes, and over the codes in use: a code 0 on every point is a
    # factor switched off, not a sparse code; both must lie in 30-90 %.
    checks = [(f"exact zeros {100 * zeros:.0f} % in 30-90 %", 0.3 <= zeros <= 0.9),
              (f"exact zeros in the codes in use {100 * zeros_in_used:.0f} % in 30-90 %",
               0.3 <= zeros_in_used <= 0.9),
              (f"F(W) {f_score:.3f} >= 0.7", f_score >= 0.7),
              (f"NLL {nll:.2f} at most one sd above the Gaussian codes' ({gaussian_nll[0]:.2f} + "
               f"{gaussian_nll[1]:.2f})", nll <= sum(gaussian_nll))]
    L.append("\nTargets on the default row (`latent_prior=\"thresholded_laplace\"` and nothing else): "
             + "; ".join(f"{text}: {'met' if ok else 'MISSED'}" for text, ok in checks) + ".")
    for row, (label, _) in rows.items():
        learned = [r for r in runs if r["row"] == row and r["prior_threshold"] is not None]
        used = [t for r in learned for t, z in zip(r["prior_threshold"], r["zeros_per_code"]) if z < 1]
        off = [t for r in learned for t, z in zip(r["prior_threshold"], r["zeros_per_code"]) if z == 1]
        if learned:
            L.append(f"\n{label}: learned λ_k " + (f"{min(used):.3g}-{max(used):.3g} in the codes in use" if used
                                                   else "(no code in use)")
                     + (f", {min(off):.3g}-{max(off):.3g} in the codes always 0." if off else "."))
    stem.with_suffix(".md").write_text("\n".join(L) + "\n")
    print(f"wrote {stem}.json/.md", flush=True)


# --------------------------------------------------------------------------- main


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    wall0 = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.ssl_dgm:
        ssl_dgm_check(args, out / f"sparse_coding_patches_ssl_dgm{args.tag}")
        return 0
    stem = out / f"sparse_coding_patches{args.tag}"
    data = whitened_patches(args.num_train, patch_size=args.patch_size, seed=0, num_validation=args.num_val)
    zero = float(0.5 * (data.validation.astype(np.float64) ** 2).sum(1).mean())
    config = dict(principal_directions=principal_directions(data.train),
                  argv=sys.argv[1:] if argv is None else list(argv), **{k: v for k, v in vars(args).items()},
                  zero_code_objective=zero, validation_images=list(data.image_names_validation),
                  training_images=list(data.image_names_train), torch=torch.__version__,
                  python=platform.python_version(), figure=str(stem.with_suffix(".png").name))
    fista_recs, principal_recs, runs = [], [], []

    def dump(final):
        wall = time.perf_counter() - wall0
        verdicts = targets(fista_recs, runs, zero)
        payload = dict(config=config, fista=fista_recs, fista_principal=principal_recs, runs=runs, targets=verdicts,
                       wall_seconds=wall,
                       complete=final)
        stem.with_suffix(".json").write_text(json.dumps(payload, default=float))
        stem.with_suffix(".md").write_text(markdown(args, config, fista_recs, principal_recs, runs, verdicts, wall))
        return verdicts

    for seed in args.seeds:
        rec = run_fista(args, data, seed)
        fista_recs.append(rec)
        print(f"[{time.perf_counter() - wall0:5.0f}s] FISTA seed {seed}: {rec['objective']:.4g} "
              f"(zero code {zero:.4g}), density {100 * rec['density']:.1f}%", flush=True)
        if not args.quick:
            rec = run_fista(args, data, seed, start="principal")
            principal_recs.append(rec)
            print(f"[{time.perf_counter() - wall0:5.0f}s] FISTA from the principal directions, seed {seed}: "
                  f"{rec['objective']:.4g}, dead {rec['dead_atoms']} (at the start {rec['dead_atoms_start']})",
                  flush=True)
        for row in args.methods:
            rec, _ = run_variational(args, data, row, seed)
            runs.append(rec)
            if rec["status"] == "ok":
                print(f"[{time.perf_counter() - wall0:5.0f}s] {rec['key']}: objective {rec['objective']:.4g}, "
                      f"FISTA re-coding {rec['fista_objective']:.4g}, density {100 * rec['density']:.1f}%, "
                      f"dead {rec['dead_atoms']}, rollbacks {rec['spike_rollbacks']}+{rec['nan_rollbacks']} "
                      f"({rec['train_seconds']:.0f} s)", flush=True)
            else:
                print(f"[{time.perf_counter() - wall0:5.0f}s] {rec['key']}: {rec['status']}", flush=True)
            dump(final=False)
    first_tl = next((r for r in runs if r["row"] == "thr_laplace" and r["status"] == "ok"), None)
    figure(stem.with_suffix(".png"), fista_recs[0], first_tl)
    dump(final=True)
    print(f"wrote {stem}.json/.md/.png ({(time.perf_counter() - wall0) / 60:.1f} min)", flush=True)
    if args.quick:
        tl = [r for r in runs if r["row"] == "thr_laplace"]
        # Strictly below, beyond rounding: collapsed codes score the zero code itself up to the last digit.
        if not tl or any(r["status"] != "ok" or not r["objective"] < zero * (1 - 1e-6) for r in tl):
            print(f"FAILED: the thresholded Laplacian's objective is not below the all-zero code's ({zero:.4g})",
                  file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
