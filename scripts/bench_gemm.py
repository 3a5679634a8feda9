#!/usr/bin/env python3
"""Alternates our bench_gemm example and the same shapes in PyTorch (2 threads),
and with --peer the `gemm` crate (scripts/gemm_peer), shape by shape for several
rounds, then prints per-shape medians (of the per-run medians) and the ratios.

Usage: python3 scripts/bench_gemm.py [--rounds 5] [--filter SUBSTR] [--bin PATH]
                                     [--threads 2] [--cputime] [--best] [--peer PATH]
Build first: cargo build --release -p kiln-cpu --examples, and for --peer
(cd scripts/gemm_peer && cargo build --release).
"""
import argparse
import re
import statistics
import subprocess
import time

import torch

# Keep in sync with SHAPES in examples/bench_gemm.rs.
SHAPES = [
    (1024, 1024, 1024, "nn"),
    (1024, 1024, 1024, "tn"),
    (1024, 1024, 1024, "nt"),
    (256, 1024, 784, "nn"),
    (256, 10, 1024, "nn"),
    (1, 1024, 784, "nn"),
    (1, 1024, 784, "nt"),
    (784, 1024, 256, "tn"),
    (1024, 10, 256, "tn"),
    (256, 784, 1024, "nt"),
    (256, 1024, 10, "nn"),
    (4, 1024, 784, "nt"),
    (64, 64, 64, "nn"),
    # The small GPT's products (width 128, MLP 512, 4,096 tokens a step): forward
    # against [out, in] weights, input gradients, weight gradients.
    (4096, 128, 128, "nt"),
    (4096, 512, 128, "nt"),
    (4096, 128, 512, "nt"),
    (4096, 128, 128, "nn"),
    (4096, 128, 512, "nn"),
    (4096, 512, 128, "nn"),
    (128, 128, 4096, "tn"),
    (128, 512, 4096, "tn"),
    (512, 128, 4096, "tn"),
]


def clock(cputime):
    return time.process_time if cputime else time.perf_counter


def torch_shape(m, n, k, layout, samples, cputime=False, best=False):
    now = clock(cputime)
    a = torch.rand(m, k) * 2 - 1 if layout[0] == "n" else (torch.rand(k, m) * 2 - 1).t()
    b = torch.rand(k, n) * 2 - 1 if layout[1] == "n" else (torch.rand(n, k) * 2 - 1).t()
    c = torch.empty(m, n)
    for _ in range(3):
        torch.mm(a, b, out=c)
    t = now()
    torch.mm(a, b, out=c)
    one = max(now() - t, 1e-7)
    reps = int(min(max(3e-3 / one, 1), 100000))
    v = []
    for _ in range(samples):
        t = now()
        for _ in range(reps):
            torch.mm(a, b, out=c)
        v.append(max(now() - t, 1e-9) / reps)
    return 2 * m * n * k / (min(v) if cputime or best else statistics.median(v)) / 1e9


def ours_shape(binary, key, samples, threads, cputime=False, best=False):
    cmd = [binary, "--samples", str(samples), "--filter", key, "--threads", str(threads)]
    if best:
        cmd += ["--best"]
    if cputime:
        cmd += ["--cputime", "--efficiency"]
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    for line in text.splitlines():
        mt = re.match(r"(?:gemm|efficiency) f32 (\S+ \S+) threads=\d+ (?:gflops|best_gflops)=([\d.]+)", line)
        if mt and mt.group(1) == key:
            return float(mt.group(2))
    raise RuntimeError(f"no figure for {key!r} in:\n{text}")


def peer_shape(binary, m, n, k, layout, samples, threads):
    """The `gemm` crate's GFLOP/s on one shape (median wall time)."""
    text = subprocess.run([binary, f"{m}x{n}x{k}", layout, str(threads), str(samples)],
                          check=True, capture_output=True, text=True).stdout
    mt = re.search(r"gflops=([\d.]+)", text)
    if not mt:
        raise RuntimeError(f"no figure in:\n{text}")
    return float(mt.group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--samples", type=int, default=15)
    ap.add_argument("--filter", default=None)
    ap.add_argument("--bin", default="target/release/examples/bench_gemm")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--cputime",
        action="store_true",
        help="best-of process CPU time instead of median wall time (robust on a busy "
        "machine; figures are then GFLOP per CPU-second, meaningful with --threads 1)",
    )
    ap.add_argument(
        "--best",
        action="store_true",
        help="fastest batch and best round instead of medians (interference only slows "
        "things down, so on a busy machine this approximates the unloaded speed)",
    )
    ap.add_argument("--peer", default=None,
                    help="the gemm crate's benchmark (scripts/gemm_peer/target/release/"
                    "kiln-gemm-peer): a third column, median wall time")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    shapes = [s for s in SHAPES if not args.filter or args.filter in f"{s[0]}x{s[1]}x{s[2]} {s[3]}"]
    ours, theirs, peer = {}, {}, {}
    for r in range(args.rounds):
        # Alternate per shape, so both sides see the same machine load.
        for m, n, k, layout in shapes:
            key = f"{m}x{n}x{k} {layout}"
            o = ours_shape(args.bin, key, args.samples, args.threads, args.cputime, args.best)
            t = torch_shape(m, n, k, layout, args.samples, args.cputime, args.best)
            ours.setdefault(key, []).append(o)
            theirs.setdefault(key, []).append(t)
            if args.peer:
                p = peer_shape(args.peer, m, n, k, layout, args.samples, args.threads)
                peer.setdefault(key, []).append(p)
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    mode = "best process-CPU-time" if args.cputime else ("best wall time" if args.best else "median wall time")
    print(f"torch {torch.__version__} threads={torch.get_num_threads()} rounds={args.rounds} ({mode})")
    extra = f"{'gemm GF/s':>10}{'vs gemm':>8}" if args.peer else ""
    print(f"{'shape':<22}{'ours GF/s':>10}{'torch GF/s':>11}{'ratio':>8}{extra}")
    for m, n, k, layout in shapes:
        key = f"{m}x{n}x{k} {layout}"
        agg = max if args.cputime or args.best else statistics.median
        o, t = agg(ours[key]), agg(theirs[key])
        extra = ""
        if args.peer:
            p = statistics.median(peer[key])
            extra = f"{p:>10.1f}{o / p:>8.2f}"
        print(f"{key:<22}{o:>10.1f}{t:>11.1f}{o / t:>8.2f}{extra}")


if __name__ == "__main__":
    main()
