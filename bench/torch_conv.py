"""PyTorch's CPU conv2d on the ResNet layer bench_conv times (N=32, 64->64, 56x56,
3x3, pad 1, float32), two threads: forward, and forward+backward (input, weight
and bias gradients).

  python3 torch_conv.py [reps]          medians of reps calls, in ms
  python3 torch_conv.py --serve [reps]  for bench_conv: one round per line read
                                        from stdin, answered with one line
                                        "<forward ms> <forward+backward ms>"
"""
import statistics
import sys
import time

import torch

torch.set_num_threads(2)
serve = len(sys.argv) > 1 and sys.argv[1] == "--serve"
args = sys.argv[2:] if serve else sys.argv[1:]
reps = int(args[0]) if args else 7
x = torch.randn(32, 64, 56, 56, requires_grad=True)
conv = torch.nn.Conv2d(64, 64, 3, padding=1)
g = torch.randn(32, 64, 56, 56)


def fwd():
    with torch.no_grad():
        conv(x)


def fwd_bwd():
    x.grad = None
    conv.zero_grad(set_to_none=True)
    conv(x).backward(g)


def median_ms(fn):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


fwd()
fwd_bwd()
if serve:
    print("ready", flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        print(f"{median_ms(fwd):.3f} {median_ms(fwd_bwd):.3f}", flush=True)
else:
    for name, fn in (("forward", fwd), ("forward+backward", fwd_bwd)):
        print(f"torch {torch.__version__} conv2d {name}: {median_ms(fn):.1f} ms "
              f"(median of {reps})")
