"""The PyTorch twin of examples/llm/train_lm.c: the same byte-level language
model (llama: RMSNorm, RoPE, grouped-query attention, SwiGLU; gpt2:
LayerNorm, learned positions, GELU-tanh), the same parameter names and the
same training loop (AdamW with weight decay on the 2-d weights only, warmup
then cosine, clipping, accumulation).

  python3 train_lm.py [--steps N ...]   trains on the fortunes text by itself
  python3 train_lm.py --compare DIR     trains from DIR/init.safetensors on the
                                        batches of DIR/batches.safetensors, which
                                        `cten-train-lm --compare DIR` wrote, and
                                        prints its losses beside DIR/losses.txt

Runs on PyTorch 1.13 (attention and RMSNorm written out) and 2.x (their
fused forms)."""
import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

FORTUNES = "/usr/share/games/fortunes"
DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32}


# ---- safetensors, read and written with json and numpy -------------------------------------------

def load_safetensors(path):
    """(tensors by name, in file order; the metadata dict)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, h in header.items():
        begin, end = h["data_offsets"]
        a = np.frombuffer(data[base + begin:base + end], DTYPES[h["dtype"]]).reshape(h["shape"])
        out[name] = torch.from_numpy(a.copy())
    return out, meta


# ---- the model -------------------------------------------------------------------------------------

class Config:
    def __init__(self, meta):
        self.family = meta["model"]
        for key in ("n_layer", "n_embd", "n_head", "n_kv_head", "ffn_hidden", "context", "vocab"):
            setattr(self, key, int(meta[key]))
        self.norm_eps = float(meta.get("norm_eps", 1e-5))
        self.rope_base = float(meta.get("rope_base", 10000.0))


def rms_norm(x, weight, eps):
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype) * weight


def rope(x, cos, sin):
    """x [B, T, H, D]: pairs (k, k + D/2) turned by angle t * base^(-2k/D) (rotate_half)."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def attention(q, k, v):
    """Causal attention of q [B, Hq, T, D] over k, v [B, Hkv, T, D]."""
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[2]
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        gpt2 = c.family == "gpt2"
        hd = c.n_embd // c.n_head
        qkv = (c.n_head + 2 * c.n_kv_head) * hd
        ffn_in = c.ffn_hidden if gpt2 else 2 * c.ffn_hidden
        self.c, self.gpt2 = c, gpt2
        self.norm1 = nn.LayerNorm(c.n_embd, eps=c.norm_eps) if gpt2 else nn.Module()
        self.norm2 = nn.LayerNorm(c.n_embd, eps=c.norm_eps) if gpt2 else nn.Module()
        if not gpt2:
            self.norm1.weight = nn.Parameter(torch.ones(c.n_embd))
            self.norm2.weight = nn.Parameter(torch.ones(c.n_embd))
        self.attn = nn.Module()
        self.attn.wqkv = nn.Linear(c.n_embd, qkv, bias=gpt2)
        self.attn.wo = nn.Linear(c.n_embd, c.n_embd, bias=gpt2)
        self.mlp = nn.Module()
        self.mlp.w_in = nn.Linear(c.n_embd, ffn_in, bias=gpt2)
        self.mlp.w_out = nn.Linear(c.ffn_hidden, c.n_embd, bias=gpt2)

    def norm(self, n, x):
        return n(x) if self.gpt2 else rms_norm(x, n.weight, self.c.norm_eps)

    def forward(self, x, cos, sin):
        c = self.c
        B, T, C = x.shape
        hd = C // c.n_head
        q, k, v = self.attn.wqkv(self.norm(self.norm1, x)).split(
            [c.n_head * hd, c.n_kv_head * hd, c.n_kv_head * hd], dim=-1)
        q = q.view(B, T, c.n_head, hd)
        k = k.view(B, T, c.n_kv_head, hd)
        v = v.view(B, T, c.n_kv_head, hd)
        if not self.gpt2:
            q, k = rope(q, cos, sin), rope(k, cos, sin)
        y = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + self.attn.wo(y.transpose(1, 2).reshape(B, T, C))
        h = self.mlp.w_in(self.norm(self.norm2, x))
        if self.gpt2:
            h = F.gelu(h, approximate="tanh")
        else:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        return x + self.mlp.w_out(h)


class LM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.wte = nn.Embedding(c.vocab, c.n_embd)
        if c.family == "gpt2":
            self.wpe = nn.Embedding(c.context, c.n_embd)
        self.h = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        if c.family == "gpt2":
            self.normf = nn.LayerNorm(c.n_embd, eps=c.norm_eps)
        else:
            self.normf = nn.Module()
            self.normf.weight = nn.Parameter(torch.ones(c.n_embd))
            hd = c.n_embd // c.n_head
            inv = c.rope_base ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
            ang = torch.arange(c.context, dtype=torch.float64)[:, None] * inv[None, :]
            self.register_buffer("cos", ang.cos().float(), persistent=False)
            self.register_buffer("sin", ang.sin().float(), persistent=False)

    def hidden(self, idx):
        c = self.c
        T = idx.shape[1]
        x = self.wte(idx)
        cos = sin = None
        if c.family == "gpt2":
            x = x + self.wpe.weight[:T]
        else:
            cos, sin = self.cos[:T, None, :], self.sin[:T, None, :]
        for b in self.h:
            x = b(x, cos, sin)
        if c.family == "gpt2":
            return self.normf(x)
        return rms_norm(x, self.normf.weight, c.norm_eps)

    def forward(self, idx, targets):
        h = self.hidden(idx)
        logits = F.linear(h, self.wte.weight)  # the tied head
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def init_weights(model):
    """GPT-2's initialisation, as the C example's (for runs that do not load one)."""
    n_layer = model.c.n_layer
    for name, p in model.named_parameters():
        if name.endswith("norm1.weight") or name.endswith("norm2.weight") or name == "normf.weight":
            nn.init.ones_(p)
        elif name.endswith(".bias"):
            nn.init.zeros_(p)
        else:
            std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(("wo.weight", "w_out.weight")) else 0.02
            nn.init.normal_(p, 0.0, std)


def make_optimizer(model, lr, betas, eps, weight_decay, fused=False):
    """AdamW with weight decay on the 2-d parameters only (matrices and embeddings)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    kw = {"fused": True} if fused else {"foreach": False}
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, **kw)


def lr_at(step, lr, min_lr, warmup, steps):
    """ct_lr_cosine_warmup at step + 1 (the first step trains at lr / warmup)."""
    warmup = min(warmup, steps)
    s = step + 1
    if s < warmup:
        return lr * s / warmup
    if s < steps:
        p = (s - warmup) / (steps - warmup)
        return min_lr + (lr - min_lr) * (1 + math.cos(math.pi * p)) / 2
    return min_lr


def train_step(model, opt, batches, step, hp, amp, device):
    """One optimizer step over the micro-batches [(x, y), ...]; the step's loss."""
    total = 0.0
    for x, y in batches:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = model(x, y) / len(batches)
        loss.backward()
        total += loss.item()
    torch.nn.utils.clip_grad_norm_(model.parameters(), hp["clip"])
    for g in opt.param_groups:
        g["lr"] = lr_at(step, hp["lr"], hp["min_lr"], hp["warmup"], hp["steps"])
    opt.step()
    opt.zero_grad(set_to_none=True)
    return total


def hyperparams(meta):
    return {k: float(meta[k]) for k in ("lr", "min_lr", "weight_decay", "beta1", "beta2", "eps",
                                         "clip")} | {k: int(meta[k]) for k in ("warmup", "steps")}


# ---- --compare: the C example's weights and batches ------------------------------------------------

def compare(args, device):
    init, meta = load_safetensors(os.path.join(args.compare, "init.safetensors"))
    batches, _ = load_safetensors(os.path.join(args.compare, "batches.safetensors"))
    c = Config(meta)
    hp = hyperparams(meta)
    torch.manual_seed(0)
    model = LM(c).to(device)
    missing = set(dict(model.named_parameters())) ^ set(init)
    if missing:
        sys.exit(f"--compare: parameter names differ from the C model's: {sorted(missing)}")
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(init[name])
    opt = make_optimizer(model, hp["lr"], (hp["beta1"], hp["beta2"]), hp["eps"], hp["weight_decay"])
    amp = meta.get("amp") == "bf16"
    xs, ys = batches["x"].to(device), batches["y"].to(device)
    losses = []
    for step in range(xs.shape[0]):
        micro = [(xs[step, m], ys[step, m]) for m in range(xs.shape[1])]
        losses.append(train_step(model, opt, micro, step, hp, amp, device))
    with open(os.path.join(args.compare, "torch_losses.txt"), "w") as f:
        f.writelines(f"{l:.9g}\n" for l in losses)
    path = os.path.join(args.compare, "losses.txt")
    theirs = [float(l) for l in open(path)] if os.path.exists(path) else []
    worst = 0.0
    for i, l in enumerate(losses):
        other = theirs[i] if i < len(theirs) else float("nan")
        rel = abs(l - other) / abs(other) if other == other else float("nan")
        worst = max(worst, rel) if rel == rel else worst
        print(f"step {i + 1:4d}  torch {l:.7f}  cten {other:.7f}  rel {rel:.2e}")
    print(f"largest relative difference {worst:.3e} over {len(losses)} steps")


# ---- training on text by itself ----------------------------------------------------------------------

def load_text(path):
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path)
                       if not n.startswith(".") and not n.endswith((".dat", ".u8")))
        data = b"".join(open(os.path.join(path, n), "rb").read() for n in names
                        if os.path.isfile(os.path.join(path, n)))
    else:
        data = open(path, "rb").read()
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def train(args, device):
    meta = {"model": args.model, "n_layer": args.layers, "n_embd": args.width,
            "n_head": args.heads, "n_kv_head": args.kv_heads or (args.heads if args.model == "gpt2"
                                                               else max(1, args.heads // 3)),
            "ffn_hidden": args.ffn or (4 * args.width if args.model == "gpt2"
                                       else ((8 * args.width + 2) // 3 + 63) // 64 * 64),
            "context": args.context, "vocab": 256}
    c = Config(meta)
    torch.manual_seed(args.seed)
    model = LM(c).to(device)
    init_weights(model)
    hp = {"lr": args.lr, "min_lr": args.lr / 10, "warmup": args.warmup, "steps": args.steps,
          "clip": 1.0}
    opt = make_optimizer(model, args.lr, (0.9, 0.95), 1e-8, 0.1)
    text = load_text(args.data)
    nval = int(len(text) * 0.1)
    train_text, val_text = text[:len(text) - nval], text[len(text) - nval:]
    T, B = c.context, args.batch_size
    gen = torch.Generator().manual_seed(args.seed + 1)

    def batch(src, g):
        starts = torch.randint(0, len(src) - T, (B,), generator=g)
        x = torch.stack([src[s:s + T] for s in starts])
        y = torch.stack([src[s + 1:s + T + 1] for s in starts])
        return x.to(device), y.to(device)

    def evaluate():
        g = torch.Generator().manual_seed(args.seed ^ 0x5EED5EED)
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp):
            return sum(model(*batch(val_text, g)).item() for _ in range(args.val_batches)) / args.val_batches

    print(f"model {c.family}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    t_log = time.perf_counter()
    for step in range(args.steps):
        loss = train_step(model, opt, [batch(train_text, gen) for _ in range(args.grad_accum)],
                          step, hp, args.amp, device)
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            t = time.perf_counter()
            dt = (t - t_log) / args.log_every
            print(f"step {step + 1:5d}/{args.steps}  loss {loss:.4f}  "
                  f"{args.grad_accum * B * T / dt:6.0f} tok/s  {1e3 * dt:7.1f} ms/step", flush=True)
            t_log = time.perf_counter()
        if (args.val_every and (step + 1) % args.val_every == 0) or step + 1 == args.steps:
            print(f"step {step + 1:5d}/{args.steps}  validation loss {evaluate():.4f}", flush=True)
            t_log = time.perf_counter()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--compare", metavar="DIR")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's)")
    p.add_argument("--model", choices=["llama", "gpt2"], default="llama")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--width", type=int, default=384)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--kv-heads", type=int, default=0)
    p.add_argument("--ffn", type=int, default=0)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--data", default=FORTUNES)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--val-every", type=int, default=250)
    p.add_argument("--val-batches", type=int, default=20)
    p.add_argument("--amp", action="store_true", help="bf16 autocast")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.compare:
        compare(args, device)
    else:
        train(args, device)


if __name__ == "__main__":
    main()
