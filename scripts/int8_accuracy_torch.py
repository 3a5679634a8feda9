#!/usr/bin/env python3
"""PyTorch's dynamic int8 quantisation of Kiln's MLP, the comparison for Kiln's int8
checkpoints: loads an f32 MLP checkpoint kiln-train wrote (784-1024-1024-10, ReLU),
evaluates it on the data set's test split in f32 and after
`torch.ao.quantization.quantize_dynamic` (int8 weights per output channel, activations
quantised per call), with Kiln's normalisation. Kiln's own figures for the same file:
`kiln-quantize mlp.safetensors mlp-int8.safetensors`, then `kiln-infer` on each.

  python3 scripts/int8_accuracy_torch.py CHECKPOINT [--dataset mnist|fashion]
      [--data ../shared/data]
"""
import argparse, gzip, json, os, struct, sys

import numpy as np
import torch

NORM = {"mnist": (0.1307, 0.3081), "fashion": (0.2860, 0.3530)}
FOLDER = {"mnist": "mnist", "fashion": "fashion-mnist"}


def safetensors(path):
    """The f32 tensors of a safetensors file, by name (no safetensors package needed)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            sys.exit(f"{path}: tensor {name} is {t['dtype']}, not an f32 checkpoint's")
        a, b = t["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[a:b], dtype="<f4").reshape(t["shape"]).copy())
    return out


def idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = struct.unpack(">" + "I" * dims, raw[4:4 + 4 * dims])
    return np.frombuffer(raw[4 + 4 * dims:], dtype=np.uint8).reshape(shape)


def accuracy(model, x, y):
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item() * 100


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--dataset", choices=NORM, default="mnist")
    ap.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "../../shared/data"))
    a = ap.parse_args()
    w = safetensors(a.checkpoint)
    model = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10))
    for i, layer in zip((0, 2, 4), ("fc1", "fc2", "fc3")):
        model[i].weight.data.copy_(w[f"{layer}.weight"])
        model[i].bias.data.copy_(w[f"{layer}.bias"])
    folder = os.path.join(a.data, FOLDER[a.dataset])
    mean, std = NORM[a.dataset]
    x = torch.from_numpy(idx(os.path.join(folder, "t10k-images-idx3-ubyte.gz")).reshape(-1, 784).astype(np.float32))
    x = (x / 255.0 - mean) / std
    y = torch.from_numpy(idx(os.path.join(folder, "t10k-labels-idx1-ubyte.gz")).astype(np.int64))
    f32 = accuracy(model, x, y)
    q = torch.ao.quantization.quantize_dynamic(
        model, {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}, dtype=torch.qint8)
    int8 = accuracy(q, x, y)
    print(f"dataset={a.dataset} impl=pytorch f32={f32:.2f} int8={int8:.2f} "
          f"drop={f32 - int8:.2f} torch={torch.__version__} checkpoint={a.checkpoint}")


if __name__ == "__main__":
    main()
