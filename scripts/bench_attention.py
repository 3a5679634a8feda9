#!/usr/bin/env python3
"""PyTorch's `F.scaled_dot_product_attention` on the shapes of `gpu_bench --workloads
attention` ([32, 8, T, 64], T 128 to 1024, causal and not, f32 and bf16), timed the same
way (median wall time of `reps` runs, each followed by a synchronisation, after two
warm-up runs), one line per figure in the same format. The backend is PyTorch's own
choice (flash for bf16, memory-efficient for f32), named in each line.

Usage: python3 scripts/bench_attention.py [--reps 20]
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# Timed as bench_gpu.py times the other workloads (this folder is on the path).
from bench_gpu import median_ms


def backend_of(q, k, v, causal):
    """The first of flash, memory-efficient and math that runs these inputs."""
    for name, b in [("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                    ("math", SDPBackend.MATH)]:
        try:
            with sdpa_kernel(b):
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            return name
        except RuntimeError:
            continue
    return "none"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    print(f"# torch {torch.__version__} on {torch.cuda.get_device_name()}")
    batch, heads, e = 32, 8, 64
    for label, dtype in [("f32", torch.float32), ("bf16", torch.bfloat16)]:
        for t in [128, 256, 512, 1024]:
            q, k, v, g = (torch.randn(batch, heads, t, e, device="cuda", dtype=dtype) for _ in range(4))
            for causal in [True, False]:
                name = backend_of(q, k, v, causal)
                fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), a.reps)
                qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))

                def both():
                    out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                    out.backward(g)

                fb = median_ms(both, a.reps)
                flops = 4.0 * batch * heads * t * t * e * (0.5 if causal else 1.0)
                print(f"bench=attention impl=torch-sdpa backend=cuda sdpa={name} dtype={label} T={t} "
                      f"causal={str(causal).lower()} fwd_ms={fwd:.4f} fwd_tflops={flops / fwd / 1e9:.1f} "
                      f"fwdbwd_ms={fb:.4f} fwdbwd_tflops={3.5 * flops / fb / 1e9:.1f}")


if __name__ == "__main__":
    main()
