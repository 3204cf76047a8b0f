#!/usr/bin/env python3
"""The PyTorch twin of bench_attention, alternating with it in one run.

PyTorch 1.13 has no scaled_dot_product_attention, so the twin is its math
path: softmax(q k^T * scale + causal mask) v, forward and forward + backward
(gradients of q, k, v from a gradient of ones), float32 on the CPU with the
same threads as cten. Each round runs bench_attention (its own timing of
`reps` calls, after warm-up) and then the twin with the same counts; the
report gives each one's median over the rounds' medians and the ratio
torch / cten (> 1: cten is faster).

    python3 bench/torch_attention.py build-cpu/bench/bench_attention \
        [--shape 4,8,512,64] [--causal 1] [--rounds 5] [--reps 10] [--warmup 3]
"""
import argparse
import math
import os
import statistics
import subprocess
import time

import torch


def twin(q, k, v, causal):
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        T, S = s.shape[-2], s.shape[-1]
        mask = torch.ones(T, S, dtype=torch.bool).tril()
        s = s.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v)


def time_torch(shape, causal, reps, warm):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.rand(shape, generator=g).mul_(2).sub_(1).requires_grad_() for _ in range(3))
    ones = torch.ones(shape)

    def fwd():
        with torch.no_grad():
            twin(q, k, v, causal)

    def fwdbwd():
        o = twin(q, k, v, causal)
        o.backward(ones)
        q.grad = k.grad = v.grad = None

    for _ in range(warm):
        fwd()
        fwdbwd()
    tf, tb = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        # the forward as cten's runs it: recording for autograd
        o = twin(q, k, v, causal)
        t1 = time.perf_counter()
        del o
        t2 = time.perf_counter()
        fwdbwd()
        t3 = time.perf_counter()
        tf.append((t1 - t0) * 1e3)
        tb.append((t3 - t2) * 1e3)
    return statistics.median(tf), statistics.median(tb)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cten_bench")
    p.add_argument("--shape", default="4,8,512,64")
    p.add_argument("--causal", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    shape = tuple(int(x) for x in a.shape.split(","))
    cf, cb, tf, tb = [], [], [], []
    for r in range(a.rounds):
        out = subprocess.run([a.cten_bench, *map(str, shape), str(a.causal), str(a.reps),
                              str(a.warmup)], check=True, capture_output=True, text=True).stdout
        w = out.split()
        cf.append(float(w[w.index("fwd_ms") + 1]))
        cb.append(float(w[w.index("fwdbwd_ms") + 1]))
        f, b = time_torch(shape, bool(a.causal), a.reps, a.warmup)
        tf.append(f)
        tb.append(b)
        print(f"round {r}: cten fwd {cf[-1]:.2f} ms, fwd+bwd {cb[-1]:.2f} ms; "
              f"torch {torch.__version__} fwd {f:.2f} ms, fwd+bwd {b:.2f} ms", flush=True)
    mcf, mcb, mtf, mtb = map(statistics.median, (cf, cb, tf, tb))
    print(f"shape {shape} causal {a.causal} threads {a.threads} float32")
    print(f"forward:            cten {mcf:.2f} ms  torch {mtf:.2f} ms  torch/cten {mtf / mcf:.2f}")
    print(f"forward + backward: cten {mcb:.2f} ms  torch {mtb:.2f} ms  torch/cten {mtb / mcb:.2f}")


if __name__ == "__main__":
    main()
