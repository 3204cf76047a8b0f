"""PyTorch (eager) on the cases bench_cuda_rope_swiglu times, bfloat16 and float32:
  - rope of q [16, 1024, 12, 64] ([B, T, H, D]) as LLaMA's Hugging Face code writes it,
    x * cos + rotate_half(x) * sin with cos/sin [1024, 1, 64] (the [T, D/2] tables
    repeated over both halves), the half layout (PyTorch has no fused rope);
  - swiglu of gate and up [16384, 2048] as F.silu(gate) * up;
  - forward alternating with a device-to-device copy of x's (gate's) bytes
    (Tensor.copy_), each timed with CUDA events: median ms, GB/s counting the inputs
    read once and the output written once, and that as a share of the copy's GB/s;
    once with one op between the events, once with BURST ops queued back to back;
  - forward + backward through autograd (x, or gate and up, require grad,
    y.backward(g)).
Prints a line saying why and exits 0 without a GPU."""
import statistics
import sys

import torch
import torch.nn.functional as F

B, T, H, D = 16, 1024, 12, 64
ROWS, FFN = 16384, 2048
BASE = 10000.0
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


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_tables(dtype):
    inv = 1.0 / (BASE ** (torch.arange(0, D, 2, dtype=torch.float64, device="cuda") / D))
    ang = torch.outer(torch.arange(T, dtype=torch.float64, device="cuda"), inv)
    emb = torch.cat((ang, ang), dim=-1)[:, None, :]  # [T, 1, D]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def bench(swiglu, dtype):
    name = "swiglu" if swiglu else "rope half"
    shape = (ROWS, FFN) if swiglu else (B, T, H, D)
    a = torch.randn(shape, device="cuda", dtype=dtype)
    g = torch.randn(shape, device="cuda", dtype=dtype)
    dst = torch.empty_like(a)
    if swiglu:
        b = torch.randn(shape, device="cuda", dtype=dtype)
        leaves = [a.detach().requires_grad_(True), b.detach().requires_grad_(True)]

        def op(xx, yy):
            return F.silu(xx) * yy
    else:
        cos, sin = rope_tables(dtype)
        b = None
        leaves = [a.detach().requires_grad_(True)]

        def op(xx, _):
            return xx * cos + rotate_half(xx) * sin

    def copy():
        dst.copy_(a)

    def fwd():
        with torch.no_grad():
            op(a, b)

    def fwd_bwd():
        for leaf in leaves:
            leaf.grad = None
        op(leaves[0], leaves[1] if swiglu else None).backward(g)

    ms_copy, ms_fwd, ms_fb = timed([copy, fwd, fwd_bwd])
    ms_copy_b, ms_fwd_b = timed([copy, fwd], BURST)
    nbytes = a.numel() * a.element_size()
    traffic = (3 if swiglu else 2) * nbytes
    copy_gbs, gbs = 2 * nbytes / (ms_copy * 1e-3) / 1e9, traffic / (ms_fwd * 1e-3) / 1e9
    copy_gbs_b, gbs_b = 2 * nbytes / (ms_copy_b * 1e-3) / 1e9, traffic / (ms_fwd_b * 1e-3) / 1e9
    dn = str(dtype).replace("torch.", "")
    print(f"{name:<16} {dn:<8} forward             {ms_fwd:8.3f} ms {gbs:8.0f} GB/s  "
          f"{100 * gbs / copy_gbs:5.1f}% of copy ({ms_copy:.3f} ms, {copy_gbs:.0f} GB/s)")
    print(f"{name:<16} {dn:<8} forward, {BURST} queued  {ms_fwd_b:8.3f} ms {gbs_b:8.0f} GB/s  "
          f"{100 * gbs_b / copy_gbs_b:5.1f}% of copy ({ms_copy_b:.3f} ms, {copy_gbs_b:.0f} GB/s)")
    print(f"{name:<16} {dn:<8} fwd+bwd (autograd)  {ms_fb:8.3f} ms")


def main():
    if not torch.cuda.is_available():
        print("torch_cuda_rope_swiglu: skipped, no usable GPU")
        return
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}: rope x [{B}, {T}, {H}, "
          f"{D}] with cos/sin [{T}, 1, {D}]; swiglu [{ROWS}, {FFN}]; eager, median of {REPS} "
          f"after {WARMUP} warm-up")
    for dtype in (torch.bfloat16, torch.float32):
        bench(False, dtype)
        bench(True, dtype)


if __name__ == "__main__":
    main()
