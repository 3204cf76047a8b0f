"""PyTorch's cuDNN conv2d on the cases bench_cuda_conv times: the ResNet layer
N=32, 64->64, 56x56, 3x3, pad 1, float32 with a bias, forward and
forward+backward (gradients of input, weight and bias through autograd), with
torch.backends.cudnn.benchmark on and TF32 off and on. Median ms of CUDA-event
timed repetitions; the anchor, timed alternately, is the same work through
the raw aten ops (aten.convolution and aten.convolution_backward, no
autograd), and the ratio is torch / anchor."""
import statistics
import sys

import torch

REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 30
WARMUP = 5

if not torch.cuda.is_available():
    print("torch_cuda_conv: skipped, no usable GPU")
    sys.exit(0)

torch.backends.cudnn.benchmark = True
dev = torch.device("cuda:0")
gen = torch.Generator(device=dev).manual_seed(0)
x = torch.randn(32, 64, 56, 56, device=dev, generator=gen, requires_grad=True)
w = torch.randn(64, 64, 3, 3, device=dev, generator=gen, requires_grad=True)
b = torch.randn(64, device=dev, generator=gen, requires_grad=True)
gy = torch.randn(32, 64, 56, 56, device=dev, generator=gen)
xd, wd, bd = x.detach(), w.detach(), b.detach()
conv_args = dict(stride=[1, 1], padding=[1, 1], dilation=[1, 1], transposed=False,
                 output_padding=[0, 0], groups=1)


def fwd():
    with torch.no_grad():
        torch.nn.functional.conv2d(x, w, b, padding=1)


def fwd_bwd():
    x.grad = w.grad = b.grad = None
    torch.nn.functional.conv2d(x, w, b, padding=1).backward(gy)


def raw_fwd():
    torch.ops.aten.convolution(xd, wd, bd, **conv_args)


def raw_fwd_bwd():
    torch.ops.aten.convolution(xd, wd, bd, **conv_args)
    torch.ops.aten.convolution_backward(gy, xd, wd, [64], conv_args["stride"],
                                        conv_args["padding"], conv_args["dilation"], False,
                                        [0, 0], 1, [True, True, True])


def timed(fn, start, stop):
    start.record()
    fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop)


def measure(fn, anchor):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts, ta = [], []
    for r in range(-WARMUP, REPS):
        t = timed(fn, start, stop)
        a = timed(anchor, start, stop) if anchor else float("nan")
        if r >= 0:
            ts.append(t)
            ta.append(a)
    return statistics.median(ts), statistics.median(ta)


print(f"torch_cuda_conv: PyTorch {torch.__version__} on {torch.cuda.get_device_name(0)}, "
      f"cuDNN {torch.backends.cudnn.version()}, cudnn.benchmark on")
print(f"\n{'case (median of %d, CUDA events)' % REPS:<58} {'torch ms':>10} {'aten ms':>10} "
      f"{'ratio':>8}")
for tf32 in (False, True):
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    for name, fn, raw in (("forward", fwd, raw_fwd), ("forward+backward", fwd_bwd, raw_fwd_bwd)):
        try:
            raw()
        except (RuntimeError, TypeError) as e:  # an aten signature this version lacks
            print(f"  (anchor unavailable: {e})")
            raw = None
        t, a = measure(fn, raw)
        label = f"conv 32x64x56x56 3x3 pad 1 f32 {name}, TF32 {'on' if tf32 else 'off'}"
        print(f"{label:<58} {t:10.3f} {a:10.3f} {t / a:7.3f}x")
print("\nanchor: aten.convolution (+ aten.convolution_backward) called directly, no autograd; "
      "ratio = torch / anchor")
