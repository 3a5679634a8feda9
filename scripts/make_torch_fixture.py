"""Writes the PyTorch-side fixture of the compatibility test (models/tests/pytorch_logits.rs):
a LeNet built and initialised by PyTorch (Kiln's `LeNet`: same structure, PyTorch's
names; batch-norm statistics set to non-trivial values), saved with
`safetensors.torch.save_file`, and its logits in evaluation mode on the first 8
Fashion-MNIST test images, normalised as Kiln's data loader does.

    python3 scripts/make_torch_fixture.py   # needs torch and safetensors

Writes models/tests/fixtures/torch_lenet.safetensors and torch_lenet_logits.json.
"""
import gzip
import json
import struct

import torch
import torch.nn as nn
from safetensors.torch import save_file


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, padding=2)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 5)
        self.bn2 = nn.BatchNorm2d(64)
        self.fc1 = nn.Linear(1600, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = torch.max_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


torch.manual_seed(2026)
model = LeNet()
with torch.no_grad():
    for bn in (model.bn1, model.bn2):
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.2, 0.2)
        bn.running_mean.uniform_(-0.3, 0.3)
        bn.running_var.uniform_(0.5, 2.0)
        bn.num_batches_tracked.fill_(1234)
model.eval()

with gzip.open("models/data/fashion-mnist/t10k-images-idx3-ubyte.gz") as f:
    data = f.read()
n = 8
pixels = torch.tensor(list(data[16:16 + n * 784]), dtype=torch.float32).reshape(n, 1, 28, 28)
mean, std = 0.2860, 0.3530  # kiln_models::data::FASHION_NORM
x = (pixels / 255.0 - mean) / std
with torch.no_grad():
    logits = model(x)

save_file(model.state_dict(), "models/tests/fixtures/torch_lenet.safetensors")
with open("models/tests/fixtures/torch_lenet_logits.json", "w") as f:
    json.dump(
        {
            "torch": torch.__version__,
            "images": "Fashion-MNIST t10k, the first 8, normalised (x / 255 - 0.2860) / 0.3530",
            "logits": logits.tolist(),
        },
        f,
        indent=1,
    )
print("logits[0]:", logits[0].tolist())
