#!/usr/bin/env python3
"""Runs Kiln's CPU benchmarks beside PyTorch's on the same work, alternating rounds so
both see the same machine load, and prints each figure's median and the ratio.

Usage: python3 scripts/bench_cpu.py [--rounds 3] [--threads 2] [--workloads w2,w4]
(build first: cargo build --release -p kiln-models)
"""
import argparse, os, re, statistics, subprocess, sys, time

def torch_figures(workloads, reps, threads):
    import torch
    torch.set_num_threads(threads)
    out = []
    def med(f):
        f()
        ts = []
        for _ in range(reps):
            t = time.perf_counter(); f(); ts.append((time.perf_counter() - t) * 1e3)
        return statistics.median(ts)
    if "w4" in workloads:
        n = 1024
        a, b = torch.randn(n, n), torch.randn(n, n)
        ms = med(lambda: a @ b)
        out.append(("W4", ms, 2 * n**3 / (ms * 1e-3) / 1e9, "gflops"))
    if "w2" in workloads:
        n = 1 << 26
        x = torch.randn(n)
        ms = med(lambda: torch.relu(x * 1.5 + 0.5) * torch.sigmoid(x))
        out.append(("W2", ms, n * 8 / (ms * 1e-3) / 1e9, "gbps"))
    return out

def kiln_figures(binary, workloads, reps, threads):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    text = subprocess.run([binary, "--workloads", ",".join(workloads), "--reps", str(reps)],
                          env=env, check=True, capture_output=True, text=True).stdout
    out = []
    for line in text.splitlines():
        kv = dict(p.split("=", 1) for p in line.split())
        unit = "gflops" if "gflops" in kv else "gbps"
        out.append((kv["bench"], float(kv["ms"]), float(kv[unit]), unit))
    return out

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workloads", default="w2,w4")
    ap.add_argument("--binary", default="target/release/kiln-bench")
    a = ap.parse_args()
    wl = a.workloads.split(",")
    runs = {}
    for _ in range(a.rounds):
        for impl, fig in (("kiln", kiln_figures(a.binary, wl, a.reps, a.threads)),
                          ("torch", torch_figures(wl, a.reps, a.threads))):
            for name, ms, rate, unit in fig:
                runs.setdefault((name, impl), []).append((ms, rate, unit))
    import torch
    print(f"# torch {torch.__version__}, threads={a.threads}, rounds={a.rounds}, reps={a.reps}")
    for name in sorted({k[0] for k in runs}):
        k, t = runs[(name, "kiln")], runs[(name, "torch")]
        km, tm = statistics.median(r[1] for r in k), statistics.median(r[1] for r in t)
        unit = k[0][2]
        print(f"bench={name} kiln_{unit}={km:.1f} torch_{unit}={tm:.1f} ratio={km / tm:.2f} "
              f"kiln_ms={statistics.median(r[0] for r in k):.3f} torch_ms={statistics.median(r[0] for r in t):.3f}")

if __name__ == "__main__":
    main()
