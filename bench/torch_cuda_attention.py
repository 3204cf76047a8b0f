"""PyTorch (eager) on the cases bench_cuda_attention times: scaled dot-product attention
with q, k, v [16, 12, 1024, 64], causal, no dropout, bfloat16 and float32, with each of
PyTorch's SDPA backends forced in turn (torch.nn.attention.sdpa_kernel: CUDNN_ATTENTION,
FLASH_ATTENTION, EFFICIENT_ATTENTION; a backend that refuses the case prints why):
  - forward (torch.nn.functional.scaled_dot_product_attention under no_grad), timed with
    CUDA events around one call: median ms and TFLOP/s (4 T S D flops a (b, h), halved
    for causal);
  - forward + backward through autograd (q, k, v require grad, y.backward(g)).
Prints a line saying why and exits 0 without a GPU."""
import statistics
import sys

import torch
import torch.nn.functional as F

B, H, T, D = 16, 12, 1024, 64
REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 25
WARMUP = 3


def timed(fns):
    """Median ms of one call of each function, run in alternation and timed with CUDA
    events."""
    times = [[] for _ in fns]
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(-WARMUP, REPS):
        for k, fn in enumerate(fns):
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            if r >= 0:
                times[k].append(start.elapsed_time(stop))
    return [statistics.median(t) for t in times]


def bench(backend, dtype):
    from torch.nn.attention import sdpa_kernel

    q, k, v, g = (torch.randn(B, H, T, D, device="cuda", dtype=dtype) for _ in range(4))
    qa, ka, va = (t.detach().requires_grad_(True) for t in (q, k, v))

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def fwd_bwd():
        qa.grad = ka.grad = va.grad = None
        F.scaled_dot_product_attention(qa, ka, va, is_causal=True).backward(g)

    name = str(backend).split(".")[-1]
    dn = str(dtype).replace("torch.", "")
    try:
        with sdpa_kernel(backend):
            fwd()
            fwd_bwd()
            torch.cuda.synchronize()
            ms_fwd, ms_fb = timed([fwd, fwd_bwd])
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"sdpa causal {dn:<8} {name:<20} unsupported: {first[:120]}")
        return
    flops = 4.0 * B * H * T * T * D / 2
    print(f"sdpa causal {dn:<8} {name:<20} forward             {ms_fwd:8.3f} ms "
          f"{flops / (ms_fwd * 1e-3) / 1e12:7.1f} TFLOP/s")
    print(f"sdpa causal {dn:<8} {name:<20} fwd+bwd (autograd)  {ms_fb:8.3f} ms "
          f"{3.5 * flops / (ms_fb * 1e-3) / 1e12:7.1f} TFLOP/s")


def main():
    if not torch.cuda.is_available():
        print("torch_cuda_attention: skipped, no usable GPU")
        return
    from torch.nn.attention import SDPBackend

    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}: q, k, v "
          f"[{B}, {H}, {T}, {D}], causal, eager, median of {REPS} after {WARMUP} warm-up")
    backends = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                SDPBackend.EFFICIENT_ATTENTION]
    for dtype in (torch.bfloat16, torch.float32):
        for backend in backends:
            bench(backend, dtype)


if __name__ == "__main__":
    main()
