"""PyTorch's learning rates for the schedules in kiln-train (train/src/schedule.rs), as
the reference its test compares against (train/tests/schedule.rs).

Each case runs a `torch.optim.lr_scheduler` over an SGD optimizer for `steps` steps and
records the rate of every step (the rate `optimizer.step()` uses at step 0, 1, ..).
Writes train/tests/fixtures/schedules_torch.json.

Usage: python3 scripts/schedule_reference.py
"""
import json
import math
import os

import torch
from torch.optim import lr_scheduler as S


def rates(base, make, steps):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=base)
    sched = make(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


CASES = [
    ("step", {"base": 0.1, "step_size": 3, "gamma": 0.5}, 20,
     lambda o: S.StepLR(o, step_size=3, gamma=0.5)),
    ("exponential", {"base": 0.1, "gamma": 0.9}, 30,
     lambda o: S.ExponentialLR(o, gamma=0.9)),
    ("cosine_restarts", {"base": 0.1, "t0": 5, "t_mult": 2, "min_lr": 0.001}, 40,
     lambda o: S.CosineAnnealingWarmRestarts(o, T_0=5, T_mult=2, eta_min=0.001)),
    ("cosine_restarts", {"base": 0.05, "t0": 7, "t_mult": 1, "min_lr": 0.0}, 30,
     lambda o: S.CosineAnnealingWarmRestarts(o, T_0=7, T_mult=1, eta_min=0.0)),
    ("one_cycle", {"max_lr": 0.1, "total": 50, "pct_start": 0.3, "div": 25.0,
                   "final_div": 1e4, "anneal": "cos", "three_phase": False}, 50,
     lambda o: S.OneCycleLR(o, max_lr=0.1, total_steps=50, pct_start=0.3,
                            div_factor=25.0, final_div_factor=1e4,
                            anneal_strategy="cos", cycle_momentum=False)),
    ("one_cycle", {"max_lr": 0.02, "total": 37, "pct_start": 0.25, "div": 10.0,
                   "final_div": 100.0, "anneal": "linear", "three_phase": True}, 37,
     lambda o: S.OneCycleLR(o, max_lr=0.02, total_steps=37, pct_start=0.25,
                            div_factor=10.0, final_div_factor=100.0,
                            anneal_strategy="linear", three_phase=True,
                            cycle_momentum=False)),
    ("linear", {"base": 0.1, "start_factor": 0.1, "end_factor": 1.0, "total": 10}, 20,
     lambda o: S.LinearLR(o, start_factor=0.1, end_factor=1.0, total_iters=10)),
    ("linear", {"base": 0.3, "start_factor": 1.0, "end_factor": 0.05, "total": 8}, 12,
     lambda o: S.LinearLR(o, start_factor=1.0, end_factor=0.05, total_iters=8)),
    ("lambda_power", {"base": 0.1, "k": 0.95}, 20,
     lambda o: S.LambdaLR(o, lambda s: 0.95 ** s)),
    ("warmup_exponential", {"base": 0.1, "start_factor": 0.01, "warmup": 5, "gamma": 0.9}, 20,
     lambda o: S.SequentialLR(o, [S.LinearLR(o, start_factor=0.01, end_factor=1.0, total_iters=5),
                                  S.ExponentialLR(o, gamma=0.9)], milestones=[5])),
]


def main():
    out = []
    for name, params, steps, make in CASES:
        out.append({"schedule": name, "params": params,
                    "rates": rates(params.get("base", 1.0) if "base" in params else 1.0, make, steps)})
    path = os.path.join(os.path.dirname(__file__), "..", "train", "tests", "fixtures",
                        "schedules_torch.json")
    with open(path, "w") as f:
        json.dump({"torch": torch.__version__, "cases": out}, f, indent=1)
        f.write("\n")
    print(f"wrote {len(out)} cases to {os.path.normpath(path)}")


if __name__ == "__main__":
    main()
