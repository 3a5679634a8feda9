"""PyTorch's side of Kiln's CPU data-parallel figure: the zoo's MLP (784-1024-1024-10,
ReLU, SGD with momentum 0.9) trained for `--steps` steps of `--batch-size` examples per
rank, under torchrun (DistributedDataParallel over gloo) or alone. Prints the
median milliseconds of a step and the total over all timed steps on rank 0. The inputs
are drawn once (a step's cost does not depend on the values).

    torchrun --nproc-per-node 2 scripts/mlp_ddp_torch.py --steps 64 --batch-size 64
"""
import argparse, os, time
import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    ddp = "RANK" in os.environ
    rank, world = 0, 1
    if ddp:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 10))
    if ddp:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = torch.randn(a.batch_size, 784)
    y = torch.randint(0, 10, (a.batch_size,))

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    for _ in range(3):
        step()
    ts = []
    for _ in range(a.steps):
        t = time.perf_counter()
        step()
        ts.append((time.perf_counter() - t) * 1e3)
    if rank == 0:
        med = sorted(ts)[len(ts) // 2]
        print(f"impl=torch{'-ddp' + str(world) if ddp else ''} batch={a.batch_size}x{world} "
              f"steps={a.steps} step_ms={med:.2f} total_s={sum(ts) / 1e3:.2f}")


if __name__ == "__main__":
    main()
