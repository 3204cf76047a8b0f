"""What the PyTorch twins of the Fashion-MNIST examples share: the command
line, the data (the same gzip IDX files, read with gzip and numpy), the
cosine schedule and the evaluation. The models and training loops are in
fashion_mlp.py and fashion_cnn.py, beside examples/fashion_mlp.c and
examples/fashion_cnn.c."""
import argparse
import gzip
import contextlib
import math
import time

import numpy as np
import torch
import torch.nn.functional as F

MEAN, STD = 0.2860, 0.3530


def parse_args(description, epochs, batch_size, optimizer, lr, momentum, weight_decay):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", default="cpu")
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--batch-size", type=int, default=batch_size)
    p.add_argument("--optimizer", choices=["sgd", "adamw"], default=optimizer)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--momentum", type=float, default=momentum)
    p.add_argument("--weight-decay", type=float, default=weight_decay)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--limit-train", type=int, default=0)
    p.add_argument("--limit-test", type=int, default=0)
    p.add_argument("--amp", choices=["bf16", "fp16", "off"], default="off",
                   help="autocast the forward to bfloat16, or float16 with a GradScaler")
    p.add_argument("--threads", type=int, default=2, help="CPU threads (torch.set_num_threads)")
    return p.parse_args()


def load_idx(path):
    """An IDX file as a numpy array: magic 00 00 08 <ndim>, big-endian sizes, uint8 data."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    if data[:3] != b"\x00\x00\x08":
        raise ValueError(f"{path}: not a uint8 IDX file")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_split(directory, split, limit):
    """Images [N, 1, 28, 28] float32, (x / 255 - mean) / std, and labels [N] int64."""
    x = torch.from_numpy(load_idx(f"{directory}/{split}-images-idx3-ubyte.gz").copy())
    y = torch.from_numpy(load_idx(f"{directory}/{split}-labels-idx1-ubyte.gz").astype(np.int64))
    if limit:
        x, y = x[:limit], y[:limit]
    x = ((x.float() / 255 - MEAN) / STD).unsqueeze(1)
    return x.contiguous(), y.contiguous()


def load_data(args):
    return (load_split(args.data, "train", args.limit_train),
            load_split(args.data, "t10k", args.limit_test))


def make_optimizer(args, model):
    if args.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                               weight_decay=args.weight_decay)
    return torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)


def cosine_lr(base_lr, step, total):
    """Cosine decay from base_lr to 0 over total steps (ct_lr_cosine_warmup without warmup)."""
    return base_lr * (1 + math.cos(math.pi * min(step, total) / total)) / 2


def amp_dtype(args):
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)


def autocast(args, device):
    """The region --amp asks for (a disabled one for off), as the C examples open it."""
    dt = amp_dtype(args)
    return torch.autocast(device.type, dtype=dt or torch.bfloat16, enabled=dt is not None)


def grad_scaler(args, device):
    enabled = args.amp == "fp16"
    if hasattr(torch.amp, "GradScaler"):  # PyTorch >= 2.3
        return torch.amp.GradScaler(device.type, enabled=enabled)
    return torch.cuda.amp.GradScaler(enabled=enabled and device.type == "cuda")


@torch.no_grad()
def evaluate(model, x, y, device, batch=1000, args=None):
    """Accuracy and mean cross-entropy on (x, y), in batches of 1000 as the C examples."""
    correct, loss = 0, 0.0
    for i in range(0, len(x), batch):
        xb, yb = x[i:i + batch].to(device), y[i:i + batch].to(device)
        with autocast(args, device) if args else contextlib.nullcontext():
            logits = model(xb)
        loss += F.cross_entropy(logits, yb, reduction="sum").item()
        correct += (logits.argmax(1) == yb).sum().item()
    return correct / len(x), loss / len(x)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def now():
    return time.perf_counter()
