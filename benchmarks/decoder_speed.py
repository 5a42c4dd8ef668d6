"""
Per-step time (forward + backward) of the sparse decoder f_θ(w_j ⊙ z_i)_j,
against, in the same run:

* a literal per-feature loop (one pass of the shared network per feature, as
  the paper describes the cost and the reference code implements it);
* a plain VAE decoder of the same widths (K -> H -> H -> H -> G);
* the plain matmuls the sparse decoder cannot avoid, with the same shapes
  (the decoder's cache-sized blocks of features on CPU, all features at once
  on CUDA), as a roofline: (rows, K)@(K, H), two (rows, H)@(H, H), the
  per-feature (H -> 1) rows, each forward and its two backward products.

Reports ms/step, achieved GFLOP/s and decoder time / matmul time (issue 8's
target: ≤ 1.15), and the time of decoding a random quarter of the features (feature
subsampling; target: all / G/4 close to 4).  ``--memory`` runs each G in a fresh process and reports peak resident
memory with a fixed chunk budget, which should not grow with G; with ``--training`` the process runs one
epoch of ``pyro_sparse.train("ssl_dgm", ...)`` on ``--train-points`` random points (encoder, Pyro trace,
optimizer state and the SSL hooks included), next to what one step would need without chunking.

    python benchmarks/decoder_speed.py                  # G in {300, 1000}, K=50, H=300, batch 128
    python benchmarks/decoder_speed.py --device cuda
    python benchmarks/decoder_speed.py --memory --features 1000,4000,16000
    python benchmarks/decoder_speed.py --memory --training --features 1000,5000,20000 --hidden 100
"""

import argparse
import json
import resource
import subprocess
import sys
import time

import numpy as np
import torch

import pyro_sparse
from pyro_sparse.nn import DenseDecoder, MaskedDecoder


def timed(steps, device, repeats):
    """
    Median seconds of each of ``steps``, run in turn ``repeats`` times:
    interleaved, a slowdown of the (shared) machine hits every step alike, so
    their ratios hold even when absolute times drift by 30 %.
    """
    times = [[] for _ in steps]
    for repeat in range(repeats + 1):
        for step, record in zip(steps, times):
            start = time.perf_counter()
            step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            if repeat:  # the first round warms up (allocator, kernels)
                record.append(time.perf_counter() - start)
    return [sorted(record)[len(record) // 2] for record in times]


def per_feature_loop(decoder, z, mask):
    """One pass of the shared network per feature: the reference's cost model."""
    first_weight = decoder.normalized_first_weight()
    outputs = []
    for j in range(decoder.num_features):
        h = torch.relu(torch.nn.functional.linear(z * mask[j], first_weight, decoder.first_bias))
        for layer in decoder.hidden:
            h = torch.relu(layer(h))
        outputs.append(h @ decoder.out_weight[j] + decoder.out_bias[j])
    return decoder.output_affine(torch.stack(outputs, -1))


def matmul_roofline(batch, features, latent, hidden, device, block):
    """The decoder's unavoidable products, in the same block shapes the decoder uses."""
    rows = batch * block
    a = torch.randn(rows, latent, device=device)
    h = torch.randn(rows, hidden, device=device)
    w1 = torch.randn(latent, hidden, device=device)
    w2 = torch.randn(hidden, hidden, device=device)
    h3 = torch.randn(block, batch, hidden, device=device)
    v = torch.randn(block, hidden, 1, device=device)
    g3 = torch.randn(block, batch, 1, device=device)
    num_blocks = -(-features // block)

    def step():
        for _ in range(num_blocks):
            a @ w1, a.T @ h, h @ w1.T  # first layer: forward, dW, dX
            for _ in range(2):
                h @ w2, h.T @ h, h @ w2.T
            torch.bmm(h3, v), torch.bmm(h3.transpose(1, 2), g3), torch.bmm(g3, v.transpose(1, 2))

    return step


def flops(batch, features, latent, hidden):
    forward = 2 * batch * features * (latent * hidden + 2 * hidden * hidden + hidden)
    return 3 * forward  # backward is two products of the forward's size


def speed(args):
    device = torch.device(args.device)
    rows = []
    for features in [int(g) for g in args.features.split(",")]:
        torch.manual_seed(0)
        hidden = (args.hidden,) * 3
        decoder = MaskedDecoder(features, args.latent, hidden).to(device)
        dense = DenseDecoder(features, args.latent, hidden).to(device)
        z = torch.randn(args.batch, args.latent, device=device)
        mask = torch.randn(features, args.latent, device=device, requires_grad=True)

        def backward_of(fn):
            def step():
                decoder.zero_grad(set_to_none=True)
                fn().square().mean().backward()
            return step

        visited = torch.randperm(features, device=device)[: features // 4]
        block = features if device.type == "cuda" else decoder.block_features(args.batch)
        roofline = matmul_roofline(args.batch, features, args.latent, args.hidden, device, min(block, features))
        sparse_s, roofline_s, subsampled_s, dense_s = timed(
            [backward_of(lambda: decoder(z, mask)), roofline, backward_of(lambda: decoder(z, mask, visited)),
             backward_of(lambda: dense(z))],
            device, args.repeats,
        )
        (loop_s,) = timed([backward_of(lambda: per_feature_loop(decoder, z, mask))], device, max(3, args.repeats // 3))
        work = flops(args.batch, features, args.latent, args.hidden)
        rows.append({
            "device": str(device), "G": features, "K": args.latent, "H": args.hidden, "batch": args.batch,
            "sparse_ms": 1e3 * sparse_s, "per_feature_loop_ms": 1e3 * loop_s, "vae_decoder_ms": 1e3 * dense_s,
            "matmul_ms": 1e3 * roofline_s, "sparse_gflops": work / sparse_s / 1e9,
            "matmul_gflops": work / roofline_s / 1e9, "sparse_over_matmul": sparse_s / roofline_s,
            "loop_over_sparse": loop_s / sparse_s, "sparse_over_vae": sparse_s / dense_s,
            "subsampled_ms": 1e3 * subsampled_s, "full_over_subsampled": sparse_s / subsampled_s,
        })
    print("| device | G | sparse ms | per-feature loop ms | VAE decoder ms | matmul ms | sparse GFLOP/s | matmul GFLOP/s | sparse / matmul | loop / sparse | sparse / VAE |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['device']} | {r['G']} | {r['sparse_ms']:.1f} | {r['per_feature_loop_ms']:.1f} | {r['vae_decoder_ms']:.2f} | "
              f"{r['matmul_ms']:.1f} | {r['sparse_gflops']:.1f} | {r['matmul_gflops']:.1f} | {r['sparse_over_matmul']:.2f} | "
              f"{r['loop_over_sparse']:.1f} | {r['sparse_over_vae']:.0f} |")
    print("\nFeature subsampling (SparseDGM feature_subsample_size): decoding G/4 random features")
    print("| device | G | all features ms | G/4 features ms | all / G/4 |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['device']} | {r['G']} | {r['sparse_ms']:.1f} | {r['subsampled_ms']:.1f} | {r['full_over_subsampled']:.2f} |")
    return rows


def peak_memory_child(features, args):
    torch.manual_seed(0)
    decoder = MaskedDecoder(features, args.latent, (args.hidden,) * 3, memory_budget_bytes=args.budget)
    z = torch.randn(args.batch, args.latent)
    mask = torch.randn(features, args.latent, requires_grad=True)
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    decoder(z, mask).square().mean().backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"G": features, "chunk": decoder.chunk_size(args.batch), "peak_extra_MiB": (peak - baseline) / 1024}))


def training_memory_child(features, args):
    torch.set_num_threads(1)
    X = np.random.default_rng(0).standard_normal((args.train_points, features)).astype(np.float32)
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    pyro_sparse.train(
        "ssl_dgm", X, latent_dim=args.latent, hidden_dims=(args.hidden,) * 3, batch_size=args.batch,
        max_epochs=1, memory_budget_bytes=args.budget, device="cpu", progress=False,
    )
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    decoder = MaskedDecoder(features, args.latent, (args.hidden,) * 3, memory_budget_bytes=args.budget)
    unchunked = MaskedDecoder(features, args.latent, (args.hidden,) * 3, memory_budget_bytes=2**62)
    print(json.dumps({
        "G": features, "chunk": decoder.chunk_size(args.batch), "peak_MiB": peak / 1024,
        "peak_extra_MiB": (peak - baseline) / 1024, "seconds_per_step": seconds / -(-args.train_points // args.batch),
        "estimate_MiB": decoder.step_memory_bytes(args.batch) / 2**20,
        "unchunked_estimate_MiB": unchunked.step_memory_bytes(args.batch) / 2**20,
    }))


def memory(args):
    rows = []
    for features in [int(g) for g in args.features.split(",")]:
        command = [sys.executable, __file__, "--child", str(features), "--batch", str(args.batch),
                   "--latent", str(args.latent), "--hidden", str(args.hidden), "--budget", str(args.budget)]
        if args.training:
            command += ["--training", "--train-points", str(args.train_points)]
        out = subprocess.run(command, capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    if not args.training:
        print(f"| G | features per chunk | extra peak RSS (MiB), budget {args.budget / 2**20:.0f} MiB |")
        print("|---|---|---|")
        for r in rows:
            print(f"| {r['G']} | {r['chunk']} | {r['peak_extra_MiB']:.0f} |")
        return
    print(f"One epoch of train(\"ssl_dgm\") on {args.train_points} random points, K = {args.latent}, "
          f"3x{args.hidden} hidden, batch {args.batch}, memory_budget_bytes = {args.budget / 2**20:.0f} MiB, one thread.")
    print("| G | features per chunk | peak RSS (MiB) | extra peak RSS over data + imports (MiB) | "
          "decoder estimate (MiB) | decoder estimate without chunking (MiB) | s / step |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['G']} | {r['chunk']} | {r['peak_MiB']:.0f} | {r['peak_extra_MiB']:.0f} | {r['estimate_MiB']:.0f} | "
              f"{r['unchunked_estimate_MiB']:.0f} | {r['seconds_per_step']:.1f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--features", default="300,1000")
    parser.add_argument("--latent", type=int, default=50)
    parser.add_argument("--hidden", type=int, default=300)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--budget", type=int, default=2**27)
    parser.add_argument("--training", action="store_true", help="--memory of whole training steps")
    parser.add_argument("--train-points", type=int, default=256)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child and args.training:
        training_memory_child(args.child, args)
    elif args.child:
        peak_memory_child(args.child, args)
    elif args.memory:
        memory(args)
    else:
        speed(args)


if __name__ == "__main__":
    main()
