#!/usr/bin/env python3
"""Runs Kiln's CPU benchmarks beside PyTorch's on the same work, alternating rounds so
both see the same machine load, and prints each figure's median and the ratio to
PyTorch (a ratio above 1 means Kiln is faster).

Usage: python3 scripts/bench_cpu.py [--rounds 3] [--threads 2] [--workloads w1,w2,w4,cnn]
       python3 scripts/bench_cpu.py --workloads w3 [--w3-configs small,small-bf16,w3,w3-bf16]
(build first: cargo build --release -p kiln-models)
"""
import argparse, os, statistics, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def median_ms(f, reps):
    f()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


def torch_figures(workloads, reps, threads, w3_configs=()):
    """{key: ms} for PyTorch, keys as Kiln's lines build them."""
    import torch
    torch.set_num_threads(threads)
    out = {}
    if "w1" in workloads:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(),
                                    torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                    torch.nn.Linear(1024, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(256, 784)
        y = torch.arange(256) % 10

        def step():
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        out[("W1", "train", "256")] = median_ms(step, reps)
        x1 = torch.randn(1, 784)
        with torch.no_grad():
            out[("W1", "infer", "1")] = median_ms(lambda: model(x1), reps * 20)
    if "w3" in workloads:
        import gpt_torch
        for config in w3_configs:
            # `small-bf16`, `w3-bf16`: the same model under bf16 autocast.
            base = config.removesuffix("-bf16")
            precision = "f32" if base == config else "bf16"
            r = reps if base == "small" else -(-reps // 5)
            out[("W3", config, "32")] = gpt_torch.step_ms(base, 32, r, precision=precision)
    if "cnn" in workloads:
        for name, make in (("LeNet", lenet), ("ResNet", small_resnet)):
            for (task, batch), ms in cnn_figures(make, reps).items():
                out[(name, task, str(batch))] = ms
    if "w4" in workloads:
        n = 1024
        a, b = torch.randn(n, n), torch.randn(n, n)
        out[("W4", "", "")] = median_ms(lambda: a @ b, reps)
    if "w2" in workloads:
        x = torch.randn(1 << 26)
        out[("W2", "", "")] = median_ms(lambda: torch.relu(x * 1.5 + 0.5) * torch.sigmoid(x), reps)
    return out


def lenet():
    """The zoo's LeNet (models/src/lenet.rs) in PyTorch: Conv(1->32, 5x5, pad 2) -> BN ->
    ReLU -> pool -> Conv(32->64, 5x5) -> BN -> ReLU -> pool -> Linear(1600->128) -> ReLU
    -> Dropout(0.25) -> Linear(128->10)."""
    import torch
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(1, 32, 5, padding=2), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(1600, 128), nn.ReLU(), nn.Dropout(0.25), nn.Linear(128, 10))


def small_resnet():
    """kiln-bench's SmallResNet in PyTorch: a 3x3 stem of 16 channels, basic blocks of
    16, 32 and 64 channels (the last two strided, with a 1x1 convolution and batch
    norm on the shortcut), global average pooling and a linear head."""
    import torch
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1)
            self.b2 = nn.BatchNorm2d(cout)
            self.short = None if stride == 1 else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, 0), nn.BatchNorm2d(cout))

        def forward(self, x):
            h = torch.relu(self.b1(self.c1(x)))
            s = x if self.short is None else self.short(x)
            return torch.relu(self.b2(self.c2(h)) + s)

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, 1, 1), nn.BatchNorm2d(16), nn.ReLU(),
        Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2),
        nn.AvgPool2d(7), nn.Flatten(), nn.Linear(64, 10))


def cnn_figures(make, reps):
    """{(task, batch): ms}: a CNN's training step (SGD with momentum) at batch 64 and
    128, and inference (eval mode, no autograd) at batch 1 and 256, as kiln-bench's."""
    import torch
    torch.manual_seed(0)
    out = {}
    for batch in (64, 128):
        model = make().train()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x, y = torch.randn(batch, 1, 28, 28), torch.arange(batch) % 10

        def step():
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        out[("train", batch)] = median_ms(step, reps)
    model = make().eval()
    for batch, r in ((1, reps * 20), (256, reps)):
        x = torch.randn(batch, 1, 28, 28)
        with torch.no_grad():
            out[("infer", batch)] = median_ms(lambda: model(x).tolist(), r)
    return out


def kiln_figures(binary, workloads, reps, threads, w3_configs=()):
    """{(key, variant): ms} for Kiln."""
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    text = subprocess.run([binary, "--workloads", ",".join(workloads), "--reps", str(reps),
                           "--w3-configs", ",".join(w3_configs) or "small"],
                          env=env, check=True, capture_output=True, text=True).stdout
    out = {}
    for line in text.splitlines():
        if not line.startswith("bench="):
            continue  # `# device ...` and other comments
        kv = dict(p.split("=", 1) for p in line.split())
        key = (kv["bench"], kv.get("task", ""), kv.get("batch", ""))
        out[(key, kv.get("variant", ""))] = float(kv["ms"])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workloads", default="w1,w2,w4")
    ap.add_argument("--binary", default="target/release/kiln-bench")
    ap.add_argument("--w3-configs", default="small")
    a = ap.parse_args()
    wl = a.workloads.split(",")
    w3c = a.w3_configs.split(",")
    kiln, torch_ms = {}, {}
    for _ in range(a.rounds):
        for k, v in kiln_figures(a.binary, wl, a.reps, a.threads, w3c).items():
            kiln.setdefault(k, []).append(v)
        for k, v in torch_figures(wl, a.reps, a.threads, w3c).items():
            torch_ms.setdefault(k, []).append(v)
    import torch
    print(f"# torch {torch.__version__}, threads={a.threads}, rounds={a.rounds}, reps={a.reps}")
    for (key, variant), ms in sorted(kiln.items()):
        km = statistics.median(ms)
        tm = statistics.median(torch_ms[key])
        bench, task, batch = key
        extra = ""
        if bench == "W4":
            extra = f" kiln_gflops={2 * 1024**3 / km / 1e6:.1f} torch_gflops={2 * 1024**3 / tm / 1e6:.1f}"
        if bench == "W2":
            extra = f" kiln_gbps={(1 << 26) * 8 / km / 1e6:.2f} torch_gbps={(1 << 26) * 8 / tm / 1e6:.2f}"
        print(f"bench={bench} task={task or '-'} batch={batch or '-'} variant={variant or '-'} "
              f"kiln_ms={km:.3f} torch_ms={tm:.3f} speedup_vs_torch={tm / km:.2f}{extra}")
    # Build-time fusion against Kiln's own op-by-op path, in the same run.
    med = {k: statistics.median(v) for k, v in kiln.items()}
    for (key, variant), ms in sorted(med.items()):
        base = {"static": "static-unfused", "fused": "unfused"}.get(variant)
        if base and (key, base) in med:
            print(f"bench={key[0]} task={key[1] or '-'} batch={key[2] or '-'} fused_ms={ms:.3f} "
                  f"unfused_ms={med[(key, base)]:.3f} fused_speedup={med[(key, base)] / ms:.2f}")


if __name__ == "__main__":
    main()
