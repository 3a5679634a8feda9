#!/usr/bin/env python3
"""PyTorch's side of the GPT comparisons: the same model as `kiln_models::gpt::Gpt`
(token + position embeddings, 10% dropout on them and on each residual branch, pre-norm blocks of causal self-attention with separate
q/k/v/proj projections and a GELU MLP of width 4·D, a final LayerNorm, a head over 256
bytes), the same split of the vendored Shakespeare text (the last 10% held out), the
same windows in the same order (`train`: kiln-train's epochs of consecutive windows of
the context, shuffled as `kiln::data::shuffled` does; `bench`: a port of
`kiln_models::text::windows`; both over Kiln's counter-based generator), the same
AdamW and cosine schedule, and the same evaluation (the whole held-out text after
every epoch) as `kiln-train --model gpt`.

  python3 scripts/gpt_torch.py train --config small --batch-size 32 --epochs 20 --lr 0.003
  python3 scripts/gpt_torch.py bench --config small --batch-size 32 --reps 5
  python3 scripts/gpt_torch.py latency --config w3 --device cuda --reps 50

`latency` times one full-context window's logits at batch 1 in evaluation mode, read
back to the host (the example `gpt_int8`'s figure).

Only the initial weights differ (PyTorch's default initialisation).
"""
import argparse, math, os, time

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {  # name: (width D, heads H, blocks L, context)
    "tiny": (16, 2, 2, 32),
    "small": (128, 4, 4, 128),
    "w3": (512, 8, 6, 256),
}
M32 = 0xFFFFFFFF
M64 = 0xFFFFFFFFFFFFFFFF


def mix32(x):
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    x ^= x >> 16
    return x


def stream_key(seed, stream):
    return mix32((seed & M32) ^ mix32(((seed >> 32) & M32) ^ ((stream * 0x9E3779B9) & M32)))


def bits(key, counter):
    return mix32((mix32(counter ^ key) + key) & M32)


def windows(text, batch, length, seed):
    """`batch` windows of `length` bytes and their next bytes, as Kiln draws them."""
    starts = len(text) - length
    key = stream_key(seed, 0)
    ids, nxt = [], []
    for b in range(batch):
        s = (bits(key, b) * starts) >> 32
        ids.append(text[s:s + length])
        nxt.append(text[s + 1:s + length + 1])
    return (torch.tensor(ids, dtype=torch.long), torch.tensor(nxt, dtype=torch.long))


class Attention(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.q, self.k, self.v, self.proj = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        b, t, d = x.shape
        split = lambda y: y.view(b, t, self.h, d // self.h).transpose(1, 2)
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.h)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        w = scores.masked_fill(mask, float("-inf")).softmax(-1)
        return self.proj((w @ v).transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d, h, p):
        super().__init__()
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(d), Attention(d, h), nn.LayerNorm(d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        h = x + self.drop(self.attn(self.ln1(x)))
        return h + self.drop(self.down(F.gelu(self.up(self.ln2(h)))))


class Gpt(nn.Module):
    def __init__(self, d, h, l, ctx, p=0.1):
        super().__init__()
        self.tok, self.pos = nn.Embedding(256, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, h, p) for _ in range(l))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, 256)
        self.drop = nn.Dropout(p)

    def forward(self, ids):
        h = self.drop(self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device)))
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))

    def loss(self, ids, nxt):
        return F.cross_entropy(self(ids).reshape(-1, 256), nxt.reshape(-1))


def corpus(limit=0):
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "models", "data", "shakespeare", "shakespeare_7plays.txt")
    data = open(path, "rb").read()
    cut = len(data) - len(data) // 10
    train, held = data[:cut], data[cut:]
    return (train[:limit] if limit else train), held


def shuffled(n, seed, epoch):
    """A port of `kiln::data::shuffled`: the order of epoch `epoch` of a loader of `n`
    examples shuffled with `seed` (Fisher-Yates over Kiln's generator)."""
    idx = list(range(n))
    key = stream_key(seed ^ ((epoch * 0x9E3779B97F4A7C15) & M64), 7)
    for i in range(n - 1, 0, -1):
        j = (bits(key, i) * (i + 1)) >> 32
        idx[i], idx[j] = idx[j], idx[i]
    return idx


def held_out_full(model, held, batch, length, device="cpu"):
    """Mean loss over consecutive windows of the whole held-out text (kiln-train's
    evaluation after every epoch and at the end)."""
    n = (len(held) - 1) // length
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for first in range(0, n - batch + 1, batch):
            ids = torch.tensor([list(held[w * length:(w + 1) * length]) for w in range(first, first + batch)])
            nxt = torch.tensor([list(held[w * length + 1:(w + 1) * length + 1]) for w in range(first, first + batch)])
            total += model.loss(ids.to(device), nxt.to(device)).item()
            count += 1
    model.train()
    return total / count


def lr_at(step, base, low, warmup, total):
    if step < warmup:
        return base * step / warmup
    if step >= total:
        return low
    return low + (base - low) * (1 + math.cos(math.pi * (step - warmup) / (total - warmup))) / 2


def train(a):
    torch.manual_seed(a.seed)
    d, h, l, ctx = CONFIGS[a.config]
    train_text, held = corpus(a.limit)
    b = a.batch_size
    model = Gpt(d, h, l, ctx, a.dropout).to(a.device)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=a.weight_decay, fused=a.device != "cpu")
    # kiln-train's loader: consecutive windows of the context, `b` a step in a shuffled
    # order per epoch, the last short batch dropped.
    n_windows = (len(train_text) - 1) // ctx
    per_epoch = n_windows // b
    total = max(per_epoch * a.epochs, 1)
    warmup = min(a.warmup, total // 2)
    params = sum(p.numel() for p in model.parameters())
    print(f"training torch {a.config} ({params} parameters), {b} windows of {ctx} per step, "
          f"{total} steps, AdamW lr {a.lr}, dropout {a.dropout}, on {a.device} "
          f"({torch.get_num_threads()} threads)", flush=True)
    autocast, scaler = mixed(a.device, a.precision)
    loss_fn = torch.compile(model.loss) if a.compile else model.loss
    start, avg, reached = time.perf_counter(), float("nan"), None
    order = []
    for step in range(total):
        if step % per_epoch == 0:
            order = shuffled(n_windows, a.seed, step // per_epoch)
        mine = order[(step % per_epoch) * b:(step % per_epoch + 1) * b]
        ids = torch.tensor([list(train_text[w * ctx:(w + 1) * ctx]) for w in mine])
        nxt = torch.tensor([list(train_text[w * ctx + 1:(w + 1) * ctx + 1]) for w in mine])
        ids, nxt = ids.to(a.device), nxt.to(a.device)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a.lr, a.lr * 0.1, warmup, total)
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = loss_fn(ids, nxt)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        v = loss.item()
        avg = v if math.isnan(avg) else 0.98 * avg + 0.02 * v
        if (step + 1) % per_epoch == 0:
            with autocast:
                h = held_out_full(model, held, b, ctx, a.device)
            took = time.perf_counter() - start
            if reached is None and a.target and h <= a.target:
                reached = (step + 1, took)
            print(f"step {step + 1}: train loss {avg:.3f}, held-out loss {h:.3f} nats/byte ({took:.0f}s)",
                  flush=True)
    if a.device != "cpu":
        torch.cuda.synchronize()
    trained = time.perf_counter() - start
    with autocast:
        held_loss = held_out_full(model, held, b, ctx, a.device)
    if a.target:
        print(f"held-out loss at most {a.target} nats/byte: "
              + (f"step {reached[0]} after {reached[1]:.1f}s" if reached else "not reached"))
    print(f"trained {total} steps in {trained:.1f}s ({trained * 1e3 / total:.1f} ms per step); "
          f"train loss {avg:.3f}, held-out loss {held_loss:.3f} nats/byte over the whole held-out text")


def mixed(device, precision):
    """The autocast context of `precision` (bf16 or f16 products, f32 parameters; off for
    f32 and tf32) and its gradient scaler: f16's dynamic loss scaling (torch.amp.GradScaler's
    defaults, as Kiln's), a pass-through otherwise. tf32 lets CUDA's f32 products run on
    TF32 tensor cores (`allow_tf32`, as Kiln's `w3-tf32`)."""
    kind = device.split(":")[0]
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    half = {"bf16": torch.bfloat16, "f16": torch.float16}.get(precision)
    autocast = torch.autocast(device_type=kind, dtype=half or torch.bfloat16,
                              enabled=half is not None)
    return autocast, torch.amp.GradScaler(kind, enabled=precision == "f16")


def step_ms(config, batch, reps, seed=0, device="cpu", precision="f32", compile=False,
            ddp=False):
    """Median milliseconds of one AdamW training step (the W3 step); `precision` bf16
    or f16 runs the forward pass under autocast (half products, f32 parameters; f16
    loss-scaled), `compile`
    through torch.compile (the warm-up steps compile first); `ddp` as one rank of
    DistributedDataParallel over NCCL (under torchrun, or alone as a world of 1), each
    rank on `batch` windows of its own."""
    torch.manual_seed(seed)
    d, h, l, ctx = CONFIGS[config]
    train_text, _ = corpus()
    rank = 0
    if ddp:
        import torch.distributed as dist
        for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29517"), ("RANK", "0"),
                     ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
            os.environ.setdefault(k, v)
        rank = int(os.environ["RANK"])
        device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
    model = Gpt(d, h, l, ctx).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0,
                            fused=device != "cpu")
    ids, nxt = windows(train_text, batch, ctx, 7 + rank)
    ids, nxt = ids.to(device), nxt.to(device)
    if ddp:
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
        def ddp_loss(ids, nxt):
            return F.cross_entropy(wrapped(ids).reshape(-1, 256), nxt.reshape(-1))
        loss_fn = torch.compile(ddp_loss) if compile else ddp_loss
    else:
        loss_fn = torch.compile(model.loss) if compile else model.loss
    autocast, scaler = mixed(device, precision)

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = loss_fn(ids, nxt)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if device != "cpu":
            torch.cuda.synchronize()
    for _ in range(3 if compile else 1):
        step()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        step()
        ts.append((time.perf_counter() - t) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def logits_ms(config, reps, device="cpu", precision="f32", tokens=0):
    """Median milliseconds of one window's next-byte logits (batch 1, `tokens` bytes or
    the whole context, evaluation mode, no gradients), read back to the host."""
    torch.manual_seed(0)
    d, h, l, ctx = CONFIGS[config]
    model = Gpt(d, h, l, ctx).to(device).eval()
    t = tokens or ctx
    ids = (torch.arange(t) * 31 % 256).reshape(1, t).to(device)
    autocast, _ = mixed(device, precision)
    def run():
        with torch.no_grad(), autocast:
            return model(ids).float().cpu()
    run()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        run()
        ts.append((time.perf_counter() - t) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["train", "bench", "latency"])
    p.add_argument("--config", choices=sorted(CONFIGS), default="small")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", choices=["f32", "tf32", "bf16", "f16"], default="f32")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--tokens", type=int, default=0,
                   help="latency: bytes in the window (0: the whole context)")
    p.add_argument("--ddp", action="store_true",
                   help="bench: one rank of DistributedDataParallel over NCCL (under torchrun, or a world of 1)")
    p.add_argument("--target", type=float, default=0.0,
                   help="report the first epoch whose held-out sample is at most this")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    if a.mode == "train":
        train(a)
    elif a.mode == "latency":
        ms = logits_ms(a.config, a.reps, device=a.device, precision=a.precision, tokens=a.tokens)
        t = a.tokens or CONFIGS[a.config][3]
        print(f"gpt={a.config} impl=torch precision={a.precision} task=logits batch=1 tokens={t} ms={ms:.4f}")
    else:
        ms = step_ms(a.config, a.batch_size, a.reps, device=a.device, precision=a.precision,
                     compile=a.compile, ddp=a.ddp)
        impl = "torch-compile" if a.compile else "torch"
        if a.ddp:
            import torch.distributed as dist
            impl += f"-ddp{dist.get_world_size()}"
            if dist.get_rank() != 0:
                return
        print(f"bench=W3 impl={impl} config={a.config} precision={a.precision} "
              f"batch={a.batch_size} ms={ms:.1f}")


if __name__ == "__main__":
    main()
