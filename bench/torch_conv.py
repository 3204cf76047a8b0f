"""PyTorch's CPU conv2d on the ResNet layer bench_conv times (N=32, 64->64, 56x56,
3x3, pad 1, float32): median forward and forward+backward in ms, two threads."""
import statistics
import sys
import time

import torch

torch.set_num_threads(2)
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 7
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


for name, fn in (("forward", fwd), ("forward+backward", fwd_bwd)):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    print(f"torch {torch.__version__} conv2d {name}: {statistics.median(times):.1f} ms "
          f"(median of {reps})")
