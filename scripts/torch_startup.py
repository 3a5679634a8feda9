"""PyTorch's side of the startup figure in BENCHMARKS.md (issue 14): from process start
to the first logits of the W1 MLP loaded from a Kiln checkpoint (Kiln's `fc1`..`fc3`
mapped to `nn.Sequential`'s 0, 2, 4), on the CPU with 2 threads.

    /usr/bin/time -f "%e s %M KiB" python3 scripts/torch_startup.py models/weights/mlp-mnist.safetensors
"""
import sys
import time

t0 = time.perf_counter()
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

torch.set_num_threads(2)
model = torch.nn.Sequential(
    torch.nn.Linear(784, 1024), torch.nn.ReLU(),
    torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
    torch.nn.Linear(1024, 10),
)
names = {"fc1": "0", "fc2": "2", "fc3": "4"}
state = {names[k.split(".")[0]] + "." + k.split(".")[1]: v for k, v in load_file(sys.argv[1]).items()}
model.load_state_dict(state)
with torch.no_grad():
    model(torch.zeros(1, 784)).softmax(-1)
print(f"ready + 1 inference in {(time.perf_counter() - t0) * 1e3:.0f} ms", file=sys.stderr)
