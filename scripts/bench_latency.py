#!/usr/bin/env python3
"""Batch-1 latency of the W1 MLP (784-1024-1024-10, logits read back) in Kiln, candle,
Burn (Flex backend) and PyTorch, in f32, and in Kiln's int8 (weights quantised per
output channel, `kiln-quantize`'s checkpoint on the CPU's int8 products) beside
PyTorch's dynamic int8 quantisation of the same MLP, in alternating rounds so all see
the same machine load; prints each one's median over the rounds and its ratio to
Kiln's f32 (`--skip-peers` leaves candle and Burn out, where they are not built).

Build first (the peers are a separate Cargo project that Kiln's CI never builds):
  cargo build --release -p kiln-models --bin kiln-bench
  cargo build --release --manifest-path scripts/peers/Cargo.toml
Usage: python3 scripts/bench_latency.py [--rounds 5] [--reps 2000] [--threads 2]
"""
import argparse, os, statistics, subprocess, sys, time

# The int8 kernel each Kiln run reported (`kernel=` on its line).
KERNELS = {}


def parse_ms(text, impl):
    for line in text.splitlines():
        if line.startswith("bench=W1") and "task=infer" in line:
            kv = dict(p.split("=", 1) for p in line.split())
            if "kernel" in kv:
                KERNELS[impl] = kv["kernel"]
            return float(kv["ms"])
    sys.exit(f"{impl} printed no W1 infer line:\n{text}")


def run(cmd, threads, impl):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{impl} failed ({' '.join(cmd)}):\n{done.stderr}")
    return parse_ms(done.stdout, impl)


def torch_ms(reps, threads, int8=False):
    import torch
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10))
    if int8:
        # Weights int8 per output channel, activations quantised per call.
        qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
        model = torch.ao.quantization.quantize_dynamic(
            model, {torch.nn.Linear: qconfig}, dtype=torch.qint8)
    x = torch.randn(1, 784)
    ts = []
    with torch.no_grad():
        model(x).tolist()
        for _ in range(reps):
            t = time.perf_counter()
            model(x).tolist()  # read back, as the others do
            ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kiln", default="target/release/kiln-bench")
    ap.add_argument("--peers", default="scripts/peers/target/release/kiln-peers")
    ap.add_argument("--skip-peers", action="store_true")
    a = ap.parse_args()
    # kiln-bench times 20 x --reps calls for the batch-1 figure.
    kiln_reps = str(max(1, a.reps // 20))
    runs = {
        "kiln": lambda: run([a.kiln, "--workloads", "w1", "--variants", "infer", "--reps",
                             kiln_reps], a.threads, "kiln"),
        "kiln-int8": lambda: run([a.kiln, "--workloads", "w1", "--variants", "infer-int8",
                                  "--reps", kiln_reps], a.threads, "kiln-int8"),
        "candle": lambda: run([a.peers, "candle", str(a.reps)], a.threads, "candle"),
        "burn": lambda: run([a.peers, "burn", str(a.reps)], a.threads, "burn"),
        "pytorch": lambda: torch_ms(a.reps, a.threads),
        "pytorch-int8": lambda: torch_ms(a.reps, a.threads, int8=True),
    }
    if a.skip_peers:
        del runs["candle"], runs["burn"]
    figures = {name: [] for name in runs}
    for _ in range(a.rounds):
        for name, f in runs.items():
            figures[name].append(f())
    import torch
    print(f"# W1 batch-1 inference, threads={a.threads}, rounds={a.rounds}, reps={a.reps}, "
          f"torch {torch.__version__}")
    kiln = statistics.median(figures["kiln"])
    for name, ms in figures.items():
        m = statistics.median(ms)
        spread = f"{min(ms):.4f}-{max(ms):.4f}"
        kernel = f" kernel={KERNELS[name]}" if name in KERNELS else ""
        print(f"impl={name} ms={m:.4f} rounds={spread} kiln_speedup={m / kiln:.2f}{kernel}")


if __name__ == "__main__":
    main()
