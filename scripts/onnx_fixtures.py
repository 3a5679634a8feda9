#!/usr/bin/env python3
"""Exports the ONNX fixtures of Kiln's importer tests (import/tests/fixtures) with
PyTorch's TorchScript exporter: each model as `<name>.onnx`, beside it one input and
PyTorch's output for it in ONNX's own test-data layout (`<name>/input_0.pb`,
`<name>/output_0.pb`, serialised TensorProtos). Small models with fixed seeds, so the
files are a few kilobytes and the same on every run of the same PyTorch.

  python3 scripts/onnx_fixtures.py [--out import/tests/fixtures]

Needs torch and onnx (pip install onnx). CI only reads the committed files.
"""
import argparse, os

import torch
import torch.nn as nn
import onnx
from onnx import numpy_helper


class Mlp(nn.Module):
    """W1's shape, small: Linear, ReLU, Linear, ReLU, Linear (exported as Gemm)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(20, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class MatMulMlp(nn.Module):
    """Layers written as products with bare parameters (exported as MatMul then Add),
    with tanh and sigmoid between them."""

    def __init__(self):
        super().__init__()
        self.w1, self.b1 = nn.Parameter(torch.randn(12, 8) / 4), nn.Parameter(torch.randn(8))
        self.w2, self.b2 = nn.Parameter(torch.randn(8, 5) / 3), nn.Parameter(torch.randn(5))

    def forward(self, x):
        return torch.sigmoid(torch.tanh(x @ self.w1 + self.b1) @ self.w2 + self.b2)


class Cnn(nn.Module):
    """Conv, batch norm, ReLU, max pool, conv, global average pool, flatten, linear."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 8, 3)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        h = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        h = nn.functional.adaptive_avg_pool2d(torch.relu(self.conv2(h)), 1)
        return self.fc(torch.flatten(h, 1))


class Attention(nn.Module):
    """One pre-norm transformer block over embedded tokens, attention written out:
    heads split by reshape and transpose (the shape subgraphs PyTorch emits around
    them), scaled scores, softmax, exact GELU; separate q, k and v layers."""

    def __init__(self, vocab=20, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.proj = (nn.Linear(d, d) for _ in range(4))
        self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        h = self.ln1(x)
        b, t, d = h.shape
        split = lambda z: z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        q, k, v = split(self.q(h)), split(self.k(h)), split(self.v(h))
        att = torch.softmax((q @ k.transpose(-2, -1)) / (d // self.heads) ** 0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        x = x + self.down(nn.functional.gelu(self.up(self.ln2(x))))
        return self.head(x)


class Encoder(nn.Module):
    """Two post-norm transformer encoder blocks over embedded tokens (GELU)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, activation="gelu", batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 20)

    def forward(self, tokens):
        return self.head(self.blocks(self.embed(tokens)))


class Decoder(nn.Module):
    """A two-block causal decoder (a small GPT): learned positions, pre-norm blocks
    with masked attention written out (the shape subgraphs PyTorch emits around it)."""

    def __init__(self, vocab=20, d=16, heads=2, blocks=2, context=8):
        super().__init__()
        self.heads = heads
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.ln1 = nn.ModuleList(nn.LayerNorm(d) for _ in range(blocks))
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(blocks))
        self.proj = nn.ModuleList(nn.Linear(d, d) for _ in range(blocks))
        self.ln2 = nn.ModuleList(nn.LayerNorm(d) for _ in range(blocks))
        self.up = nn.ModuleList(nn.Linear(d, 4 * d) for _ in range(blocks))
        self.down = nn.ModuleList(nn.Linear(4 * d, d) for _ in range(blocks))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, tokens):
        b, t = tokens.shape
        x = self.tok(tokens) + self.pos(torch.arange(t, device=tokens.device))
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        for i in range(len(self.qkv)):
            q, k, v = self.qkv[i](self.ln1[i](x)).chunk(3, dim=-1)
            split = lambda z: z.reshape(b, t, self.heads, -1).transpose(1, 2)
            q, k, v = split(q), split(k), split(v)
            att = (q @ k.transpose(-2, -1)) / (q.shape[-1] ** 0.5)
            att = torch.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
            y = (att @ v).transpose(1, 2).reshape(b, t, -1)
            x = x + self.proj[i](y)
            x = x + self.down[i](nn.functional.gelu(self.up[i](self.ln2[i](x))))
        return self.head(self.ln_f(x))


class Ops(nn.Module):
    """The ops the other fixtures lack, at opset 21: a tanh GELU (a `Gelu` op), average
    pooling, means over an axis with and without keepdims, a square and a square root
    of computed values (an RMS norm written out), log-softmax."""

    def __init__(self):
        super().__init__()
        self.conv, self.pool, self.fc = nn.Conv2d(1, 4, 3, padding=1), nn.AvgPool2d(2), nn.Linear(16, 5)

    def forward(self, x):
        h = self.pool(nn.functional.gelu(self.conv(x), approximate="tanh")).mean(dim=3)
        h = h / torch.sqrt((h ** 2).mean(dim=-1, keepdim=True) + 1e-3)
        return torch.log_softmax(self.fc(torch.flatten(h, 1)), dim=-1)


def export(name, model, example, out, dynamic, fold=True, opset=17, data=True):
    model.eval()
    path = os.path.join(out, f"{name}.onnx")
    names = ["input"]
    torch.onnx.export(
        model, (example,), path, dynamo=False, opset_version=opset,
        input_names=names, output_names=["output"],
        dynamic_axes={"input": dynamic, "output": dynamic},
        do_constant_folding=fold,
    )
    ops = onnx.load(path).graph.node
    print(f"{path}: {len(ops)} nodes, {len({n.op_type for n in ops})} op types, {os.path.getsize(path)} bytes")
    if not data:
        return
    with torch.no_grad():
        result = model(example)
    data = os.path.join(out, name)
    os.makedirs(data, exist_ok=True)
    for file, t in (("input_0.pb", example), ("output_0.pb", result)):
        with open(os.path.join(data, file), "wb") as f:
            f.write(numpy_helper.from_array(t.numpy()).SerializeToString())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="import/tests/fixtures")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    mlp, x = Mlp(), torch.randn(3, 20)
    export("mlp", mlp, x, a.out, {0: "batch"})
    # The same model at the oldest and newest opsets Kiln imports (its data is mlp's).
    for opset in (13, 21):
        export(f"mlp_opset{opset}", mlp, x, a.out, {0: "batch"}, opset=opset, data=False)
    export("mlp_matmul", MatMulMlp(), torch.randn(2, 12), a.out, {0: "batch"})
    cnn = Cnn()
    # Running statistics of a model that has trained, not the initial zeros and ones.
    cnn.bn1.running_mean.uniform_(-0.5, 0.5)
    cnn.bn1.running_var.uniform_(0.5, 1.5)
    # Unfolded, so that the batch norm stays a node of its own rather than folded into
    # the convolution before it.
    export("cnn", cnn, torch.randn(2, 1, 8, 8), a.out, {0: "batch"}, fold=False)
    attention, x = Attention(), torch.randint(0, 20, (2, 6))
    export("attention", attention, x, a.out, {0: "batch", 1: "sequence"})
    # Before opset 17 layer norms are written out (ReduceMean, Sub, Pow, Sqrt, Div...).
    export("attention_opset13", attention, x, a.out, {0: "batch", 1: "sequence"}, opset=13, data=False)
    # Only the batch is dynamic: PyTorch's export of nn.MultiheadAttention traces
    # `k.shape[0]` (the sequence length) as a constant, so the graph holds for 8 only.
    export("encoder", Encoder(), torch.randint(0, 20, (2, 8)), a.out, {0: "batch"})
    decoder, x = Decoder(), torch.randint(0, 20, (2, 8))
    export("decoder", decoder, x, a.out, {0: "batch", 1: "sequence"})
    # Trilu is opset 14's; from opset 20 GELU is an op of its own.
    for opset in (14, 21):
        export(f"decoder_opset{opset}", decoder, x, a.out, {0: "batch", 1: "sequence"}, opset=opset, data=False)
    # Without constant folding: the weights' transposes stay nodes (`x · Wᵀ`).
    export("decoder_unfolded", decoder, x, a.out, {0: "batch", 1: "sequence"}, fold=False, data=False)
    export("ops", Ops(), torch.randn(2, 1, 8, 8), a.out, {0: "batch"}, opset=21)


if __name__ == "__main__":
    main()
