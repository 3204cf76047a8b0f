"""PyTorch (eager) on the cases bench_cuda_rmsnorm times: rms_norm and layer_norm of a
16384 x 4096 activation on the GPU, float32 and bfloat16.
  - forward (torch.nn.functional.rms_norm / layer_norm, with weight; layer_norm with
    bias too) alternating with a device-to-device copy of x's bytes (Tensor.copy_),
    each timed with CUDA events: median ms, GB/s counting x read and y written, and
    that as a share of the copy's GB/s; once with one op between the events, once
    with BURST ops queued back to back;
  - forward + backward through autograd (x and weight require grad, y.backward(g));
  - the peak memory of one forward + backward above the inputs
    (torch.cuda.reset_peak_memory_stats / max_memory_allocated).
Prints a line saying why and exits 0 without a GPU."""
import statistics
import sys

import torch
import torch.nn.functional as F

ROWS, DIM, EPS = 16384, 4096, 1e-6
REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 25
WARMUP = 3
BURST = 10


def timed(fns, burst=1):
    """Median ms of one call of each function, run in alternation and timed with CUDA
    events around burst calls queued back to back."""
    times = [[] for _ in fns]
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(-WARMUP, REPS):
        for k, fn in enumerate(fns):
            start.record()
            for _ in range(burst):
                fn()
            stop.record()
            stop.synchronize()
            if r >= 0:
                times[k].append(start.elapsed_time(stop) / burst)
    return [statistics.median(t) for t in times]


def bench(layer, dtype):
    name = "layer_norm" if layer else "rms_norm"
    x = torch.randn(ROWS, DIM, device="cuda", dtype=dtype)
    g = torch.randn(ROWS, DIM, device="cuda", dtype=dtype)
    w = torch.rand(DIM, device="cuda", dtype=dtype)
    b = torch.randn(DIM, device="cuda", dtype=dtype) if layer else None
    dst = torch.empty_like(x)
    xa = x.detach().requires_grad_(True)
    wa = w.detach().requires_grad_(True)
    ba = b.detach().requires_grad_(True) if layer else None

    def norm(xx, ww, bb):
        if layer:
            return F.layer_norm(xx, (DIM,), ww, bb, EPS)
        return F.rms_norm(xx, (DIM,), ww, EPS)

    def copy():
        dst.copy_(x)

    def fwd():
        with torch.no_grad():
            norm(x, w, b)

    def fwd_bwd():
        xa.grad = None
        wa.grad = None
        if ba is not None:
            ba.grad = None
        norm(xa, wa, ba).backward(g)

    ms_copy, ms_fwd, ms_fb = timed([copy, fwd, fwd_bwd])
    ms_copy_b, ms_fwd_b = timed([copy, fwd], BURST)
    nbytes = x.numel() * x.element_size()
    copy_gbs = 2 * nbytes / (ms_copy * 1e-3) / 1e9
    fwd_gbs = 2 * nbytes / (ms_fwd * 1e-3) / 1e9

    xa.grad = wa.grad = None
    if ba is not None:
        ba.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fwd_bwd()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20

    dn = str(dtype).replace("torch.", "")
    print(f"{name:<10} {dn:<8} forward             {ms_fwd:8.3f} ms {fwd_gbs:8.0f} GB/s  "
          f"{100 * fwd_gbs / copy_gbs:5.1f}% of copy ({ms_copy:.3f} ms, {copy_gbs:.0f} GB/s)")
    fwd_gbs_b, copy_gbs_b = 2 * nbytes / (ms_fwd_b * 1e-3) / 1e9, 2 * nbytes / (ms_copy_b * 1e-3) / 1e9
    print(f"{name:<10} {dn:<8} forward, {BURST} queued  {ms_fwd_b:8.3f} ms {fwd_gbs_b:8.0f} GB/s  "
          f"{100 * fwd_gbs_b / copy_gbs_b:5.1f}% of copy ({ms_copy_b:.3f} ms, {copy_gbs_b:.0f} GB/s)")
    print(f"{name:<10} {dn:<8} fwd+bwd (autograd)  {ms_fb:8.3f} ms")
    print(f"{name:<10} {dn:<8} peak memory of autograd fwd+bwd: {peak:.1f} MiB above the "
          f"{base / 2**20:.1f} MiB of inputs")


def main():
    if not torch.cuda.is_available():
        print("torch_cuda_rmsnorm: skipped, no usable GPU")
        return
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}: x [{ROWS}, {DIM}], "
          f"eps {EPS:g}, eager, median of {REPS} after {WARMUP} warm-up")
    for layer in (False, True):
        for dtype in (torch.float32, torch.bfloat16):
            bench(layer, dtype)


if __name__ == "__main__":
    main()
