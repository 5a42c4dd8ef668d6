"""
Per-epoch training time of the sparse VAE at the paper's settings (Moran et
al. 2022, Table 6), ours against a literal per-feature loop, in one run:

* Zeisel: N = 3005, G = 558, K = 15, three hidden layers of 100, batch 512,
  100 epochs; the paper lists "CPU, 15 mins" per run;
* synthetic: N = 1000, G = 7, K = 5, three hidden layers of 50, batch 100,
  200 epochs; the paper lists "CPU, 2 mins" per run.

"ours" is ``pyro_sparse.train("ssl_dgm", ...)``: the whole loop (Pyro trace,
SSL proximal step and E-step, σ² point estimates, checks).  "per-feature loop"
is the same training step written in plain torch with the decoder evaluated
one feature at a time (``per_feature_loop`` of ``decoder_speed.py``): the same
encoder, a reparameterised draw of z, the Gaussian log-likelihood with
per-feature σ², the analytic KL, the SSL log-prior of W and the
Inverse-Gamma prior of σ², an Adam step and the closed-form η update.  Both
train on random data of the paper's shapes (timing only) for a few epochs; the
paper's epoch count is extrapolated linearly.  Times are the process's CPU
seconds on one thread (the machine is shared; wall-clock would time the
neighbours too).  A VAE epoch (``model="vae"``)
is timed alongside for scale, and ours with bfloat16 decoders
(``hardware=Hardware(precision="bf16")``).

    python benchmarks/reference_settings.py            # both settings, ~2 min on one thread
"""

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from decoder_speed import per_feature_loop

import pyro_sparse
from pyro_sparse import Hardware
from pyro_sparse.distributions import SpikeSlabLasso
from pyro_sparse.nn import MaskedDecoder, mlp

RESULTS = Path(__file__).parent / "results"

SETTINGS = {
    "zeisel": {"N": 3005, "G": 558, "K": 15, "H": 100, "batch": 512, "paper_epochs": 100, "paper_minutes": 15},
    "synthetic": {"N": 1000, "G": 7, "K": 5, "H": 50, "batch": 100, "paper_epochs": 200, "paper_minutes": 2},
}


def time_ours(model, X, s, epochs, precision="fp32"):
    options = {"latent_dim": s["K"], "hidden_dims": (s["H"],) * 3, "batch_size": s["batch"], "lr": 0.01,
               "device": "cpu", "progress": False, "hardware": Hardware(precision=precision)}
    pyro_sparse.train(model, X, max_epochs=1, **options)  # warm-up: one-off costs of a first call
    start = time.process_time()
    pyro_sparse.train(model, X, max_epochs=epochs, **options)
    return (time.process_time() - start) / epochs


def time_loop(X, s, epochs):
    """The same training step with the decoder as a Python loop over features."""
    torch.manual_seed(0)
    N, G, K, H = X.shape[0], s["G"], s["K"], s["H"]
    X = torch.as_tensor(X)
    encoder = mlp(G, (H,) * 3, 2 * K)
    decoder = MaskedDecoder(G, K, (H,) * 3)
    W = torch.nn.Parameter(torch.ones(G, K))
    log_sigma2 = torch.nn.Parameter(torch.zeros(G))
    eta = torch.full((K,), 0.5)
    optimizer = torch.optim.Adam([*encoder.parameters(), *decoder.parameters(), W, log_sigma2], lr=0.01)
    nu, xi, a, b = 3.0, 1.0, 1.0, float(G)

    def step(x):
        optimizer.zero_grad()
        loc, raw_scale = encoder(x).split(K, dim=-1)
        scale = F.softplus(raw_scale) + 1e-4
        z = loc + scale * torch.randn_like(loc)
        mean = per_feature_loop(decoder, z, W)
        sigma2 = log_sigma2.exp()
        log_lik = (-0.5 * ((x - mean) ** 2 / sigma2 + log_sigma2 + math.log(2 * math.pi))).sum()
        kl = (0.5 * (loc**2 + scale**2 - 1) - scale.log()).sum()
        # Inverse-Gamma(ν/2, νξ/2) on σ² (Eq. 60), up to a constant
        log_prior_sigma2 = (-(nu / 2 + 1) * log_sigma2 - nu * xi / 2 / sigma2).sum()
        ssl = SpikeSlabLasso(eta.expand(G, K), 10.0, 1.0)  # Eq. 2 with Table 6's λ0, λ1
        loss = -(N / x.shape[0]) * (log_lik - kl) - ssl.log_prob(W).sum() - log_prior_sigma2
        loss.backward()
        optimizer.step()
        with torch.no_grad():  # E-step (Eq. 57) and η update of Algorithm 1
            probs = ssl.inclusion_probability(W)
            eta.copy_(((probs.sum(0) + a - 1) / (a + b + G - 2)).clamp(1e-30, 1 - 1e-6))

    def epoch():
        for rows in torch.randperm(N).split(s["batch"]):
            step(X[rows])

    epoch()  # warm-up
    start = time.process_time()
    for _ in range(epochs):
        epoch()
    return (time.process_time() - start) / epochs


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", default="zeisel,synthetic")
    parser.add_argument("--epochs", default="zeisel=3,synthetic=20", help="epochs timed per setting")
    parser.add_argument("--out", type=Path, default=RESULTS, help="output folder")
    args = parser.parse_args()
    torch.set_num_threads(1)
    epochs = {k: int(v) for k, v in (item.split("=") for item in args.epochs.split(","))}
    rows = []
    for name in args.settings.split(","):
        s = SETTINGS[name]
        X = np.random.default_rng(0).standard_normal((s["N"], s["G"])).astype(np.float32)
        ours = time_ours("ssl_dgm", X, s, epochs[name])
        loop = time_loop(X, s, epochs[name])
        ours_bf16 = time_ours("ssl_dgm", X, s, epochs[name], precision="bf16")
        vae = time_ours("vae", X, s, epochs[name])
        rows.append({
            "setting": name, **s, "epochs_timed": epochs[name], "ours_s_per_epoch": ours,
            "loop_s_per_epoch": loop, "ours_bf16_s_per_epoch": ours_bf16, "vae_s_per_epoch": vae, "loop_over_ours": loop / ours,
            "ours_minutes_at_paper_epochs": ours * s["paper_epochs"] / 60,
            "loop_minutes_at_paper_epochs": loop * s["paper_epochs"] / 60,
        })
        print(json.dumps(rows[-1]), flush=True)
    lines = [
        (
            "| setting | N, G, K, hidden, batch | ours s/epoch | per-feature loop s/epoch | loop / ours | "
            "ours bf16 s/epoch | VAE s/epoch | paper epochs | ours (min) | loop (min) | paper (min, CPU) |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['setting']} | {r['N']}, {r['G']}, {r['K']}, 3x{r['H']}, {r['batch']} | {r['ours_s_per_epoch']:.3f} | "
            f"{r['loop_s_per_epoch']:.3f} | {r['loop_over_ours']:.2f} | {r['ours_bf16_s_per_epoch']:.3f} | {r['vae_s_per_epoch']:.3f} | {r['paper_epochs']} | "
            f"{r['ours_minutes_at_paper_epochs']:.1f} | {r['loop_minutes_at_paper_epochs']:.1f} | {r['paper_minutes']} |"
        )
    text = "\n".join(lines)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "reference_settings.json").write_text(json.dumps(rows, indent=1))
    (args.out / "reference_settings.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
