#!/usr/bin/env python3
"""The cases of cten-bench, run with PyTorch, written as the same JSON.

Same case names, sizes, dtypes, inputs (uniform in [-1, 1), rotated among
several copies when one would fit in the cache), warm-up, repeats of `inner`
back-to-back calls (host clock on the CPU, CUDA events on the current stream
on the GPU) and statistics as cten-bench, so that bench/report.py can put
the two side by side. The ceilings (a large GEMM, a large copy) are measured
through PyTorch at start. One call per case runs under torch.profiler; the
operators (CPU) or kernels (GPU) it saw go into the record's trace.

    python3 bench/torch_ref.py [--quick] [--devices cpu,cuda] [--json PATH] ...

Float32 products run in full float32 (TF32 off for matmul and cuDNN) except
in the tf32 cases, as cten does.
"""
import argparse
import datetime
import json
import math
import os
import platform
import socket
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

FAMILIES = ["matmul", "conv2d", "rms_norm", "add", "unary", "softmax", "cross_entropy",
            "overhead", "train", "sort"]
MAX_SETS = 8
OOM = getattr(torch.cuda, "OutOfMemoryError", MemoryError)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer warm-ups and repeats")
    p.add_argument("--cases", default=None, help="families: " + ",".join(FAMILIES))
    p.add_argument("--match", default=None, help="only cases whose name contains this")
    p.add_argument("--devices", default=None, help="cpu, cuda, cuda:N (default all present)")
    p.add_argument("--sizes", default=None, help="matmul sizes (default 256,1024,2048,8192)")
    p.add_argument("--batches", default=None, help="training batch sizes (default 64,1024)")
    p.add_argument("--reps", type=int, default=0, help="timed repeats per case")
    p.add_argument("--warmup", type=int, default=-1, help="warm-up repeats")
    p.add_argument("--budget", type=float, default=0.0, help="seconds per case and device")
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads (default: the cores this process may run on)")
    p.add_argument("--json", default=None, help="write the records here (- for stdout)")
    p.add_argument("--no-ceiling", action="store_true", help="skip the ceiling measurement")
    p.add_argument("--no-trace", action="store_true", help="skip the profiled call")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    a = p.parse_args()
    a.sizes = [int(s) for s in a.sizes.split(",")] if a.sizes else None
    a.batches = [int(s) for s in a.batches.split(",")] if a.batches else None
    if a.cases:
        for c in a.cases.split(","):
            if c != "all" and c not in FAMILIES:
                p.error(f"unknown case family '{c}'")
    return a


ARGS = None


# ---- devices ----------------------------------------------------------------------------------
class Device:
    def __init__(self, spec):
        self.torch = torch.device(spec)
        self.label = "cpu" if spec == "cpu" else spec
        self.is_gpu = self.torch.type == "cuda"
        if self.is_gpu:
            props = torch.cuda.get_device_properties(self.torch)
            self.name = props.name
            self.props = props
            self.cache_bytes = getattr(props, "L2_cache_size", 0) or (50 << 20)
            self.rotate_budget = 4 << 30
        else:
            self.name = cpu_model()
            self.props = None
            self.cache_bytes = cpu_cache_bytes()
            self.rotate_budget = (512 if ARGS.quick else 1024) << 20
        self.gemm_n = 0
        self.gemm = {}  # kind -> GFLOP/s
        self.copy_gbs = 0.0
        self.copy_bytes = 0

    def sync(self):
        if self.is_gpu:
            torch.cuda.synchronize(self.torch)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_cache_bytes():
    best = 0
    for name in ("SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
        try:
            best = max(best, os.sysconf(name))
        except (ValueError, OSError):
            pass
    return best if best > 0 else 32 << 20


def select_devices():
    want = ARGS.devices.split(",") if ARGS.devices else None
    out = []
    if want is None or "cpu" in want:
        out.append(Device("cpu"))
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            if want is None or "cuda" in want or "gpu" in want or f"cuda:{i}" in want:
                out.append(Device(f"cuda:{i}"))
    elif want and any(w.startswith("cuda") for w in want):
        print("torch_ref: no usable CUDA device", file=sys.stderr)
    return out


# ---- timing -------------------------------------------------------------------------------------
class Timer:
    def __init__(self, dev):
        self.dev = dev
        if dev.is_gpu:
            self.start_ev = torch.cuda.Event(enable_timing=True)
            self.stop_ev = torch.cuda.Event(enable_timing=True)

    def start(self):
        if self.dev.is_gpu:
            self.start_ev.record()
        else:
            self.t0 = time.perf_counter()

    def stop(self):
        if self.dev.is_gpu:
            self.stop_ev.record()
            self.stop_ev.synchronize()
            return self.start_ev.elapsed_time(self.stop_ev) * 1e-3
        return time.perf_counter() - self.t0


def quantile(v, q):
    pos = q * (len(v) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (pos - lo) * (v[hi] - v[lo])


def summarize(v):
    v = sorted(v)
    return {"median": quantile(v, 0.5), "min": v[0], "p10": quantile(v, 0.1),
            "p90": quantile(v, 0.9), "max": v[-1]}


def sets_for(dev, set_bytes):
    if set_bytes <= 0:
        return 1
    want = -(-2 * dev.cache_bytes // set_bytes)
    fit = dev.rotate_budget // set_bytes
    return max(1, min(MAX_SETS, want, fit))


# ---- cases --------------------------------------------------------------------------------------
class Case:
    """What a case is (name, key, work) and how it runs: setup(case) builds
    the state, run(case) makes one call."""

    def __init__(self, family, dev, name, key, variant, dtype, params, rate, work, ceil,
                 setup, run, tf32=False):
        self.family, self.dev, self.name, self.key = family, dev, name, key
        self.variant, self.dtype, self.params = variant, dtype, params
        self.rate, self.work, self.ceil = rate, work, ceil
        self.setup, self.run, self.tf32 = setup, run, tf32
        self.sets = []
        self.set = 0
        self.note = None
        self.status = "error"

    def next_set(self):
        self.set = (self.set + 1) % len(self.sets)
        return self.sets[self.set]


DT_NAME = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
DT_SHORT = {torch.float32: "f32", torch.bfloat16: "bf16"}


def rnd(c, *shape, dtype=torch.float32):
    return (torch.rand(*shape, device=c.dev.torch, generator=c.gen) * 2 - 1).to(dtype)


def elsize(dt):
    return torch.tensor([], dtype=dt).element_size()


def rows_for(dev):
    return 16384 if dev.is_gpu else 4096


def matmul_cases(dev):
    sizes = ARGS.sizes or [256, 1024, 2048, 8192]
    for n in sizes:
        for mode in ("f32", "tf32", "bf16"):
            if not dev.is_gpu and (mode != "f32" or (not ARGS.sizes and n > 2048)):
                continue
            dt = torch.bfloat16 if mode == "bf16" else torch.float32

            def setup(c, n=n, dt=dt):
                c.sets = [(rnd(c, n, n, dtype=dt), rnd(c, n, n, dtype=dt))
                          for _ in range(sets_for(c.dev, 2 * n * n * elsize(dt)))]

            def run(c):
                a, b = c.next_set()
                torch.matmul(a, b)

            name = f"matmul {n} {mode}"
            yield Case("matmul", dev, name, name, mode, dt, {"n": n}, "flop", 2.0 * n ** 3,
                       {"f32": "gemm_f32", "tf32": "gemm_tf32", "bf16": "gemm_bf16"}[mode],
                       setup, run, tf32=mode == "tf32")


CONV_LAYERS = [("resnet", 32, 64, 56, 56, 64), ("fmnist1", 64, 1, 28, 28, 16),
               ("fmnist2", 64, 16, 14, 14, 32)]


def conv_cases(dev):
    for tag, N, C, H, W, Co in CONV_LAYERS:
        for bwd in (False, True):
            M, K = N * H * W, C * 9
            flop = 2.0 * M * Co * K * (3 if bwd else 1)

            def setup(c, N=N, C=C, H=H, W=W, Co=Co, bwd=bwd):
                per = (N * C * H * W + (N * Co * H * W if bwd else 0)) * 4
                c.sets = [(rnd(c, N, C, H, W), rnd(c, N, Co, H, W) if bwd else None)
                          for _ in range(sets_for(c.dev, per))]
                c.w = rnd(c, Co, C, 3, 3)
                c.b = rnd(c, Co)
                if bwd:
                    c.w.requires_grad_(True)
                    c.b.requires_grad_(True)

            def run_fwd(c):
                x, _ = c.next_set()
                with torch.no_grad():
                    F.conv2d(x, c.w, c.b, padding=1)

            def run_bwd(c):
                x, g = c.next_set()
                x = x.detach().requires_grad_(True)
                y = F.conv2d(x, c.w, c.b, padding=1)
                torch.autograd.grad(y, (x, c.w, c.b), g)

            variant = "fwd+bwd" if bwd else "fwd"
            name = f"conv2d {tag} {N}x{C}x{H}x{W}->{Co} {variant}"
            yield Case("conv2d", dev, name, name, variant, torch.float32,
                       {"N": N, "C": C, "H": H, "W": W, "Cout": Co, "k": 3}, "flop", flop,
                       "gemm_f32", setup, run_bwd if bwd else run_fwd)


def rms_norm(x, w, eps):
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rms_cases(dev):
    R, D = rows_for(dev), 4096
    for dt in (torch.float32, torch.bfloat16):
        es = elsize(dt)
        for bwd in (False, True):
            def setup(c, dt=dt, bwd=bwd, es=es):
                c.sets = [(rnd(c, R, D, dtype=dt), rnd(c, R, D, dtype=dt) if bwd else None)
                          for _ in range(sets_for(c.dev, R * D * es * (2 if bwd else 1)))]
                c.w = rnd(c, D, dtype=dt).requires_grad_(bwd)

            def run_fwd(c):
                x, _ = c.next_set()
                with torch.no_grad():
                    rms_norm(x, c.w, 1e-6)

            def run_bwd(c):
                x, g = c.next_set()
                x = x.detach().requires_grad_(True)
                torch.autograd.grad(rms_norm(x, c.w, 1e-6), (x, c.w), g)

            variant = "fwd+bwd" if bwd else "fwd"
            tensor = R * D * es
            yield Case("rms_norm", dev, f"rms_norm {R}x{D} {DT_SHORT[dt]} {variant}",
                       f"rms_norm {DT_SHORT[dt]} {variant}", variant, dt,
                       {"rows": R, "cols": D}, "bytes", (5 if bwd else 2) * tensor, "copy",
                       setup, run_bwd if bwd else run_fwd)


def add_cases(dev):
    n = (256 << 20) if dev.is_gpu else (16 << 20)

    def setup(c):
        c.sets = [(rnd(c, n), rnd(c, n)) for _ in range(sets_for(c.dev, n * 8))]

    def run(c):
        a, b = c.next_set()
        torch.add(a, b)

    yield Case("add", dev, f"add {n >> 20}M f32", "add f32", "f32", torch.float32,
               {"numel": n}, "bytes", 3.0 * n * 4, "copy", setup, run)


# cten-bench's unary rows: name, the function, whether a forward + backward case runs, and the
# shift of the inputs into the op's domain (log's (0, 2)).
UNARY_OPS = [
    ("exp", torch.exp, False, 0), ("log", torch.log, False, 1), ("sin", torch.sin, False, 0),
    ("cos", torch.cos, False, 0), ("tanh", torch.tanh, True, 0),
    ("sigmoid", torch.sigmoid, True, 0), ("silu", F.silu, True, 0),
    ("softplus", F.softplus, False, 0), ("gelu", F.gelu, True, 0),
    ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), True, 0),
    ("log1p", torch.log1p, False, 0), ("expm1", torch.expm1, False, 0),
    ("log2", torch.log2, False, 1), ("exp2", torch.exp2, False, 0),
    ("erf", torch.erf, False, 0), ("erfc", torch.erfc, False, 0),
    ("erfinv", torch.erfinv, False, 0), ("tan", torch.tan, False, 0),
    ("asin", torch.asin, False, 0), ("atan", torch.atan, False, 0),
    ("sinh", torch.sinh, False, 0), ("asinh", torch.asinh, False, 0),
    ("atanh", torch.atanh, False, 0), ("floor", torch.floor, False, 0),
    ("round", torch.round, False, 0), ("leaky_relu", F.leaky_relu, False, 0),
    ("elu", F.elu, False, 0), ("mish", F.mish, False, 0),
    ("hardswish", F.hardswish, False, 0), ("logsigmoid", F.logsigmoid, False, 0),
]


def unary_cases(dev):
    """As cten-bench: 16M float32 elements, forward (x in, y out) and, for some, forward +
    backward (x, dy in, dx out: 5 tensors counted)."""
    n = 16 << 20
    for bwd in (False, True):
        for name, fn, has_bwd, shift in UNARY_OPS:
            if bwd and not has_bwd:
                continue

            def setup(c, bwd=bwd, shift=shift):
                c.sets = [((rnd(c, n) + shift), rnd(c, n) if bwd else None)
                          for _ in range(sets_for(c.dev, n * 4 * (2 if bwd else 1)))]

            def run_fwd(c, fn=fn):
                x, _ = c.next_set()
                with torch.no_grad():
                    fn(x)

            def run_bwd(c, fn=fn):
                x, g = c.next_set()
                x = x.detach().requires_grad_(True)
                torch.autograd.grad(fn(x), (x,), g)

            variant = "fwd+bwd" if bwd else "fwd"
            yield Case("unary", dev, f"{name} 16M f32 {variant}", f"{name} f32 {variant}", variant,
                       torch.float32, {"numel": n}, "bytes", (5.0 if bwd else 2.0) * n * 4, "copy",
                       setup, run_bwd if bwd else run_fwd)


def rowwise_cases(dev, xent):
    N, C = rows_for(dev), 4096
    family = "cross_entropy" if xent else "softmax"

    def setup(c):
        c.sets = [(rnd(c, N, C),
                   torch.randint(0, C, (N,), device=c.dev.torch, generator=c.gen) if xent else None)
                  for _ in range(sets_for(c.dev, N * C * 4))]

    def run_softmax(c):
        x, _ = c.next_set()
        torch.softmax(x, -1)

    def run_xent(c):
        x, t = c.next_set()
        x = x.detach().requires_grad_(True)
        torch.autograd.grad(F.cross_entropy(x, t), (x,))

    variant = "fwd+bwd" if xent else "fwd"
    yield Case(family, dev, f"{family} {N}x{C} f32 {variant}", f"{family} f32 {variant}", variant,
               torch.float32, {"rows": N, "cols": C}, "bytes", (3 if xent else 2) * N * C * 4.0,
               "copy", setup, run_xent if xent else run_softmax)


def softmax_cases(dev):
    return rowwise_cases(dev, False)


def xent_cases(dev):
    return rowwise_cases(dev, True)


def overhead_cases(dev):
    def setup(c):
        c.sets = [(torch.full((1,), 1.5, device=c.dev.torch),
                   torch.full((1,), 2.25, device=c.dev.torch))]

    def run(c):
        a, b = c.sets[0]
        torch.add(a, b)

    name = "overhead add 1-element f32"
    yield Case("overhead", dev, name, name, "f32", torch.float32, {"numel": 1}, "calls", 1.0,
               None, setup, run)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(28 * 28, 256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def train_gemms(model, B):
    """The GEMMs the step's layers lower to, as cten-bench counts them."""
    if model == "mlp":
        return [(B, 256, 784), (B, 10, 256), (B, 256, 10), (10, 256, B), (256, 784, B)]
    m1, m2 = B * 28 * 28, B * 14 * 14
    return [(m1, 16, 9), (16, 9, m1), (m2, 32, 144), (m2, 144, 32), (32, 144, m2),
            (B, 10, 1568), (B, 1568, 10), (10, 1568, B)]


def train_cases(dev):
    for model in ("mlp", "cnn"):
        for B in ARGS.batches or [64, 1024]:
            def setup(c, model=model, B=B):
                c.sets = [(rnd(c, B, 1, 28, 28),
                           torch.randint(0, 10, (B,), device=c.dev.torch, generator=c.gen))
                          for _ in range(sets_for(c.dev, B * (28 * 28 * 4 + 8)))]
                torch.manual_seed(0)
                c.model = (MLP() if model == "mlp" else CNN()).to(c.dev.torch)
                c.opt = torch.optim.AdamW(c.model.parameters(), lr=1e-3, betas=(0.9, 0.999),
                                          eps=1e-8, weight_decay=1e-2)

            def run(c):
                x, y = c.next_set()
                loss = F.cross_entropy(c.model(x), y)
                c.opt.zero_grad(set_to_none=True)
                loss.backward()
                c.opt.step()

            flop = sum(2.0 * m * n * k for m, n, k in train_gemms(model, B))
            name = f"train {model} b{B}"
            yield Case("train", dev, name, name, model, torch.float32, {"batch": B}, "flop",
                       flop, "gemm_f32", setup, run)


def sort_cases(dev):
    """sort, topk (k 50), cumsum and logsumexp along rows, as cten-bench's sort family."""
    k = 50
    for i, op in enumerate(["sort", "topk", "cumsum", "logsumexp"]):
        R = (4096 if dev.is_gpu else 1024) if i <= 1 else rows_for(dev)
        C = 1024 if i == 0 else 4096

        def setup(c, R=R, C=C):
            c.sets = [rnd(c, R, C) for _ in range(sets_for(c.dev, R * C * 4))]

        def run(c, op=op):
            x = c.next_set()
            if op == "sort":
                torch.sort(x, -1)
            elif op == "topk":
                torch.topk(x, k, -1)
            elif op == "cumsum":
                torch.cumsum(x, -1)
            else:
                torch.logsumexp(x, -1)

        out = {"sort": R * C * 12, "topk": R * k * 12, "cumsum": R * C * 4,
               "logsumexp": R * 4}[op]
        yield Case("sort", dev, f"{op} {R}x{C} f32", f"{op} f32", op, torch.float32,
                   {"rows": R, "cols": C}, "bytes", R * C * 4.0 + out, "copy", setup, run)


CASES = {"matmul": matmul_cases, "conv2d": conv_cases, "rms_norm": rms_cases,
         "add": add_cases, "unary": unary_cases, "softmax": softmax_cases,
         "cross_entropy": xent_cases, "overhead": overhead_cases, "train": train_cases,
         "sort": sort_cases}


# ---- tracing one call ---------------------------------------------------------------------------
def trace_call(c):
    """Runs one call under torch.profiler; returns the operators (CPU, every
    aten:: level) or kernels (GPU) it recorded, with counts and their own
    time, the most expensive first."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if c.dev.is_gpu else [])
    with profile(activities=acts) as prof:
        c.run(c)
        c.dev.sync()
    seen = {}
    for e in prof.events():
        dev_type = str(getattr(e, "device_type", "")).split(".")[-1]
        if c.dev.is_gpu:
            if dev_type != "CUDA":
                continue
            t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0) or 0
            op = "kernel"
        else:
            if not e.name.startswith("aten::"):
                continue
            t = getattr(e, "self_cpu_time_total", 0) or 0
            op = e.name
        n, total = seen.get((op, e.name), (0, 0.0))
        seen[(op, e.name)] = (n + 1, total + t)
    # the routine that took the most time first: the kernel or operator that did the work
    items = sorted(seen.items(), key=lambda kv: -kv[1][1])
    out = [{"op": op, "device": "cuda" if c.dev.is_gpu else "cpu",
            "dtype": DT_NAME.get(c.dtype, str(c.dtype)), "routine": name[:160], "calls": n,
            "time_us": round(total, 3)} for (op, name), (n, total) in items]
    return out[:48]


# ---- running a case -----------------------------------------------------------------------------
def set_tf32(on):
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def run_case(c):
    dev = c.dev
    timer = Timer(dev)
    c.gen = torch.Generator(device=dev.torch)
    c.gen.manual_seed(0x5eed)
    set_tf32(c.tf32)
    try:
        c.setup(c)
        c.trace = []
        if not ARGS.no_trace:
            try:
                c.trace = trace_call(c)
            except Exception as e:  # the profiler is optional; the timing is not
                c.trace = []
                c.note = f"profiler: {e}"
        else:
            c.run(c)
        warm = ARGS.warmup if ARGS.warmup >= 0 else (1 if ARGS.quick else 3)
        c.warmup = warm + 1

        def sample(inner):
            timer.start()
            for _ in range(inner):
                c.run(c)
            return timer.stop() / inner

        for _ in range(warm):
            sample(1)
        t1 = sample(1)
        target = 1e-3 if ARGS.quick else 4e-3
        c.inner = int(min(1e6, max(1, math.ceil(target / t1)))) if t1 > 0 else 1
        budget = ARGS.budget if ARGS.budget > 0 else (0.35 if ARGS.quick else 2.5)
        lo, hi = (5, 31) if ARGS.quick else (11, 201)
        per = c.inner * t1
        c.reps = ARGS.reps or int(min(hi, max(lo, budget // per if per > 0 else hi)))
        times = [sample(c.inner) for _ in range(c.reps)]
        c.t = summarize(times)
        c.status = "ok"
    except OOM as e:
        c.status, c.note = "error", f"out of memory: {e}"
    except (RuntimeError, NotImplementedError) as e:
        msg = str(e).split("\n")[0]
        c.status = "unsupported" if ("not implemented" in msg.lower()
                                     or isinstance(e, NotImplementedError)) else "error"
        c.note = msg
    finally:
        set_tf32(False)
        c.nsets = len(c.sets)
        c.sets = []
        for attr in ("w", "b", "model", "opt"):
            if hasattr(c, attr):
                delattr(c, attr)
        if dev.is_gpu:
            torch.cuda.empty_cache()


# ---- ceilings -----------------------------------------------------------------------------------
def ceiling_gemm(dev, n, dt, tf32, reps):
    timer = Timer(dev)
    g = torch.Generator(device=dev.torch)
    g.manual_seed(7)
    a = (torch.rand(n, n, device=dev.torch, generator=g) * 2 - 1).to(dt)
    b = (torch.rand(n, n, device=dev.torch, generator=g) * 2 - 1).to(dt)
    set_tf32(tf32)
    t = []
    for r in range(reps + 1):
        timer.start()
        torch.mm(a, b)
        s = timer.stop()
        if r:
            t.append(s)
    set_tf32(False)
    return 2.0 * n ** 3 / min(t) / 1e9


def ceiling_copy(dev, nbytes, reps):
    timer = Timer(dev)
    src = torch.ones(nbytes // 4, device=dev.torch)
    dst = torch.empty_like(src)
    t = []
    for r in range(reps + 1):
        timer.start()
        dst.copy_(src)
        s = timer.stop()
        if r:
            t.append(s)
    return 2.0 * nbytes / min(t) / 1e9


def measure_ceilings(dev):
    reps = 3 if ARGS.quick else 7
    if dev.is_gpu:
        dev.gemm_n = 8192
        dev.gemm["gemm_f32"] = ceiling_gemm(dev, 8192, torch.float32, False, reps)
        dev.gemm["gemm_tf32"] = ceiling_gemm(dev, 8192, torch.float32, True, reps)
        dev.gemm["gemm_bf16"] = ceiling_gemm(dev, 8192, torch.bfloat16, False, reps)
        dev.copy_bytes = 1 << 30
        dev.copy_gbs = ceiling_copy(dev, dev.copy_bytes, 5 if ARGS.quick else 11)
        torch.cuda.empty_cache()
    else:
        dev.gemm_n = 2048
        dev.gemm["gemm_f32"] = ceiling_gemm(dev, 2048, torch.float32, False, reps)
        dev.copy_bytes = (256 if ARGS.quick else 512) << 20
        dev.copy_gbs = ceiling_copy(dev, dev.copy_bytes, reps)


# ---- output -------------------------------------------------------------------------------------
def fmt_time(s):
    if s < 1e-6:
        return f"{s * 1e9:.1f} ns"
    if s < 1e-3:
        return f"{s * 1e6:.2f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.3f} s"


def rate_of(c):
    return c.work / c.t["median"] if c.status == "ok" and c.t["median"] > 0 else 0.0


def fmt_rate(c, r):
    if c.rate == "flop":
        return f"{r / 1e9:.1f} GFLOP/s"
    if c.rate == "bytes":
        return f"{r / 1e9:.1f} GB/s"
    return "-"


def ceiling_value(c):
    if c.ceil == "copy":
        return c.dev.copy_gbs
    return c.dev.gemm.get(c.ceil, 0.0) if c.ceil else 0.0


ROW = "{:<40} {:<7} {:>10} {:>5} {:>15} {:>6}  {:>8}  {}"


def print_row(c):
    if c.status != "ok":
        print(f"{c.name:<40} {c.dev.label:<7} {c.status}: {c.note}", flush=True)
        return
    ceil = ceiling_value(c)
    pct = f"{100 * rate_of(c) / 1e9 / ceil:.0f}%" if ceil > 0 and c.rate != "calls" else "-"
    spread = 100 * (c.t["p90"] - c.t["p10"]) / c.t["median"]
    su = f"{c.speedup:.1f}x" if getattr(c, "speedup", 0) else "-"
    routine = c.trace[0]["routine"][:44] if c.trace else ""
    print(ROW.format(c.name, c.dev.label, fmt_time(c.t["median"]), f"{spread:.0f}",
                     fmt_rate(c, rate_of(c)), pct, su, routine), flush=True)


def record(c):
    ok = c.status == "ok"
    r = rate_of(c)
    ceil = ceiling_value(c)
    rec = {
        "suite": "torch", "case": c.family, "name": c.name, "key": c.key, "variant": c.variant,
        "device": c.dev.label, "device_type": "cuda" if c.dev.is_gpu else "cpu",
        "device_name": c.dev.name, "dtype": DT_NAME[c.dtype], "tf32": c.tf32,
        "params": c.params, "status": c.status, "note": c.note,
        "flop": c.work if c.rate == "flop" else None,
        "bytes": c.work if c.rate == "bytes" else None,
    }
    if ok:
        rec.update({
            "reps": c.reps, "inner": c.inner, "warmup": c.warmup, "input_sets": c.nsets,
            "time_s": c.t, "spread_pct": 100 * (c.t["p90"] - c.t["p10"]) / c.t["median"],
            "gflops": r / 1e9 if c.rate == "flop" else None,
            "gbs": r / 1e9 if c.rate == "bytes" else None,
            "calls_per_s": r if c.rate == "calls" else None,
        })
    rec["ceiling"] = {"kind": c.ceil, "value": ceil or None,
                      "unit": None if not c.ceil else "GB/s" if c.ceil == "copy" else "GFLOP/s"}
    rec["pct_ceiling"] = 100 * r / 1e9 / ceil if ok and ceil > 0 and c.rate != "calls" else None
    rec["anchor"] = None
    rec["ratio_anchor"] = None
    rec["speedup_vs_cpu"] = getattr(c, "speedup", None) or None
    rec["kernel_registered"] = None
    rec["routine"] = c.trace[0]["routine"] if ok and c.trace else None
    rec["trace"] = c.trace if ok else []
    return rec


def versions():
    v = {"torch": torch.__version__, "python": platform.python_version(),
         "torch_threads": torch.get_num_threads()}
    v["cuda"] = torch.version.cuda
    try:
        v["cudnn"] = torch.backends.cudnn.version() if torch.cuda.is_available() else None
    except Exception:
        v["cudnn"] = None
    try:
        cfg = torch.__config__.show()
        v["blas"] = next((l.strip() for l in cfg.splitlines()
                          if "BLAS_INFO" in l or "LAPACK_INFO" in l or "MKL" in l), None)
    except Exception:
        v["blas"] = None
    return v


def main():
    global ARGS
    ARGS = parse_args()
    threads = ARGS.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    set_tf32(False)
    torch.backends.cudnn.benchmark = False
    devs = select_devices()
    if not devs:
        print("torch_ref: no device selected", file=sys.stderr)
        return 2
    families = FAMILIES if not ARGS.cases or "all" in ARGS.cases.split(",") else \
        [f for f in FAMILIES if f in ARGS.cases.split(",")]

    def cases_for(fam):
        # each case on every device in turn, in the order of the device with
        # the most cases (GPUs have all of the CPU's), as cten-bench runs them
        per_dev = [list(CASES[fam](d)) for d in devs]
        keys = []
        for lst in sorted(per_dev, key=len, reverse=True):
            for c in lst:
                if c.key not in keys:
                    keys.append(c.key)
        cases = [c for lst in per_dev for c in lst]
        return sorted(cases, key=lambda c: (keys.index(c.key), devs.index(c.dev)))

    if ARGS.list:
        for fam in families:
            for c in cases_for(fam):
                if not ARGS.match or ARGS.match in c.name:
                    print(f"  {c.name:<44} {c.dev.label}")
        return 0

    t_start = time.perf_counter()
    if not ARGS.no_ceiling:
        for d in devs:
            measure_ceilings(d)
    print(f"torch_ref: PyTorch {torch.__version__} ({'quick' if ARGS.quick else 'full'} mode), "
          f"{torch.get_num_threads()} CPU threads")
    for d in devs:
        extra = ""
        if d.gemm:
            extra = ", ".join(f"{k[5:]} {v:.1f} GFLOP/s" for k, v in d.gemm.items())
            extra = f": torch.mm {d.gemm_n}^3 {extra}; copy {d.copy_gbs:.1f} GB/s"
        print(f"  {d.label}: {d.name}{extra}")
    print()
    print(ROW.format("case", "device", "time", "+-%", "rate", "%peak", "GPU/CPU", "routine"))
    done = []
    for fam in families:
        for c in cases_for(fam):
            if ARGS.match and ARGS.match not in c.name:
                continue
            run_case(c)
            if c.dev.is_gpu and c.status == "ok":
                cpu = [p for p in done if not p.dev.is_gpu and p.key == c.key and p.status == "ok"]
                if cpu and rate_of(cpu[-1]) > 0:
                    c.speedup = rate_of(c) / rate_of(cpu[-1])
            done.append(c)
            print_row(c)
    elapsed = time.perf_counter() - t_start
    print(f"\n{len(done)} cases in {elapsed:.1f} s")
    if ARGS.json:
        doc = {
            "schema": "cten-bench/1", "suite": "torch",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "mode": "quick" if ARGS.quick else "full", "elapsed_s": elapsed,
            "machine": {
                "hostname": socket.gethostname(), "cpu": cpu_model(),
                "cpu_cores_online": os.cpu_count(), "threads": torch.get_num_threads(),
                "gpus": [{"device": d.label, "name": d.name,
                          "compute_capability": d.props.major * 10 + d.props.minor,
                          "multiprocessors": d.props.multi_processor_count,
                          "memory_bytes": d.props.total_memory}
                         for d in devs if d.is_gpu],
            },
            "versions": versions(),
            "ceilings": [{"device": d.label, "device_name": d.name, "gemm_n": d.gemm_n,
                          "gemm_f32_gflops": d.gemm.get("gemm_f32"),
                          "gemm_tf32_gflops": d.gemm.get("gemm_tf32"),
                          "gemm_bf16_gflops": d.gemm.get("gemm_bf16"),
                          "gemm_routine": "torch.mm", "copy_gbs": d.copy_gbs or None,
                          "copy_bytes": d.copy_bytes, "copy_routine": "Tensor.copy_"}
                         for d in devs],
            "records": [record(c) for c in done],
        }
        text = json.dumps(doc, indent=2)
        if ARGS.json == "-":
            print(text)
        else:
            with open(ARGS.json, "w") as f:
                f.write(text + "\n")
    return 1 if any(c.status == "error" for c in done) else 0


if __name__ == "__main__":
    sys.exit(main())
