#!/usr/bin/env python3
"""PyTorch's figures for the GPU workloads of `kiln-gpu-system`'s `gpu_bench` example, timed
the same way (median wall time of `reps` runs, each followed by a device
synchronisation, after warm-up), one line per figure in the same format.

Usage: python3 scripts/bench_gpu.py [--reps 20] [--compile]
"""
import argparse, statistics, time

import torch


def median_ms(f, reps):
    for _ in range(2):
        f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--compile", action="store_true", help="also torch.compile W1 (its first calls too) and W2")
    a = ap.parse_args()
    dev = "cuda"
    print(f"# torch {torch.__version__} on {torch.cuda.get_device_name()}")

    n = 4096
    a32, b32 = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
    for label, dtype, tf32 in [("f32", torch.float32, False), ("tf32", torch.float32, True),
                               ("bf16", torch.bfloat16, False), ("f16", torch.float16, False)]:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        x, y = a32.to(dtype), b32.to(dtype)
        ms = median_ms(lambda: x @ y, a.reps)
        print(f"bench=W4 impl=torch backend=cuda dtype={label} mode=latency shape={n}x{n}x{n} "
              f"ms={ms:.3f} tflops={2 * n**3 / ms / 1e9:.1f}")

        def ten():
            for _ in range(10):
                x @ y
        ms = median_ms(ten, (a.reps + 3) // 4) / 10
        print(f"bench=W4 impl=torch backend=cuda dtype={label} mode=throughput shape={n}x{n}x{n} "
              f"ms={ms:.3f} tflops={2 * n**3 / ms / 1e9:.1f}")
    torch.backends.cuda.matmul.allow_tf32 = False

    x = torch.randn(1 << 26, device=dev)
    chain = lambda: torch.relu(x * 1.5 + 0.5) * torch.sigmoid(x)
    variants = [("eager", chain)]
    if a.compile:
        variants.append(("compile", torch.compile(chain)))
    for name, f in variants:
        ms = median_ms(f, a.reps)
        print(f"bench=W2 impl=torch backend=cuda variant={name} n={1 << 26} ms={ms:.3f} "
              f"gbps={(1 << 26) * 8 / ms / 1e6:.1f}")

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def make_step(batch, set_to_none=True, net=model):
        """One W1 training step of `net` on a fixed random batch."""
        xb = torch.randn(batch, 784, device=dev)
        yb = torch.arange(batch, device=dev) % 10

        def step():
            opt.zero_grad(set_to_none=set_to_none)
            torch.nn.functional.cross_entropy(net(xb), yb).backward()
            opt.step()
        return step

    # Eager in f32 and TF32, then the same step captured whole as a CUDA graph
    # (PyTorch's recipe: warm up on a side stream, gradients kept, the step replayed on
    # static inputs).
    for tf32 in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        suffix = "-tf32" if tf32 else ""
        for batch in (256, 4096):
            print(f"bench=W1 impl=torch backend=cuda variant=eager{suffix} task=train "
                  f"batch={batch} ms={median_ms(make_step(batch), a.reps):.3f}")
        for batch in (256, 4096):
            gstep = make_step(batch, set_to_none=False)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    gstep()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                gstep()
            print(f"bench=W1 impl=torch backend=cuda variant=graph{suffix} task=train "
                  f"batch={batch} ms={median_ms(graph.replay, a.reps):.3f}")
    torch.backends.cuda.matmul.allow_tf32 = False
    if a.compile:
        # torch.compile's first call (tracing, compiling forward and backward) at batch
        # 256, then at a new batch size (a recompile, with that dim made dynamic), and
        # its warm step: the anchors of Kiln's dynamic-path first-compile figures.
        cmodel = torch.compile(model)
        for batch in (256, 128):
            cstep = make_step(batch, net=cmodel)
            torch.cuda.synchronize()
            t = time.perf_counter()
            cstep()
            torch.cuda.synchronize()
            first = (time.perf_counter() - t) * 1e3
            print(f"bench=W1 impl=torch backend=cuda variant=compile task=train batch={batch} "
                  f"first_ms={first:.1f} ms={median_ms(cstep, a.reps):.3f}")
    x1 = torch.randn(1, 784, device=dev)
    with torch.no_grad():
        ms = median_ms(lambda: model(x1).cpu(), a.reps * 20)
    print(f"bench=W1 impl=torch backend=cuda variant=eager task=infer batch=1 ms={ms:.4f}")


if __name__ == "__main__":
    main()
