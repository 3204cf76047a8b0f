"""PyTorch on the cases bench_cuda_linear_ce times: the language-model head's linear +
cross-entropy at N = 16384 tokens, d = 768, V = 50304 on the GPU, bfloat16 and float32,
mean reduction, x and weight requiring grad:
  - eager: F.linear + F.cross_entropy, forward + backward (loss.backward()), and the
    forward alone under torch.no_grad();
  - Liger Kernel's fused linear cross-entropy (liger_kernel's
    LigerFusedLinearCrossEntropyFunction) when it imports, else its algorithm in plain
    PyTorch: rows in chunks of next_power_of_2(N / ceil(V / d)), per chunk the logits
    (addmm/mm), the loss and d(loss)/d(logits) from log_softmax, dx = g @ W and
    dW += g^T x (addmm in place), the gradients computed in the forward and scaled by
    grad_output in the backward;
  - the peak memory of one forward + backward above what was allocated before it
    (torch.cuda.reset_peak_memory_stats / max_memory_allocated), the gradients included.
Each timed with CUDA events: median ms. TF32 off. Prints a line saying why and exits 0
without a GPU. Optional arguments: N d V.
Liger Kernel is pure Python on Triton: where it is not installed, its source can be put
on PYTHONPATH (scripts/gpu.sh takes .debs/liger/src, e.g. from
`git archive v0.5.10 src/liger_kernel` of github.com/linkedin/Liger-Kernel)."""
import statistics
import sys

import torch
import torch.nn.functional as F

N, D, V = (int(a) for a in sys.argv[1:4]) if len(sys.argv) == 4 else (16384, 768, 50304)
REPS, WARMUP = 15, 3
IGNORE = -100


class ChunkedLinearCE(torch.autograd.Function):
    """Liger Kernel's fused linear cross-entropy (mean reduction, no bias), in PyTorch."""

    @staticmethod
    def forward(ctx, x, w, target):
        n, d = x.shape
        v = w.shape[0]
        inc = (v + d - 1) // d
        chunk = 1 << max(0, ((n + inc - 1) // inc - 1).bit_length())
        count = (target != IGNORE).sum()
        gx = torch.empty_like(x) if ctx.needs_input_grad[0] else None
        gw = torch.zeros_like(w) if ctx.needs_input_grad[1] else None
        loss = torch.zeros(n, dtype=torch.float32, device=x.device)
        for s in range(0, n, chunk):
            xc, tc = x[s:s + chunk], target[s:s + chunk]
            logits = xc @ w.t()
            lsm = torch.log_softmax(logits.float(), dim=-1)
            valid = tc != IGNORE
            tsafe = torch.where(valid, tc, 0)
            loss[s:s + chunk] = -lsm.gather(1, tsafe[:, None]).squeeze(1) * valid
            g = lsm.exp_()
            g[torch.arange(g.shape[0], device=g.device), tsafe] -= 1
            g *= valid[:, None]
            g = (g / count).to(x.dtype)
            if gx is not None:
                gx[s:s + chunk] = g @ w
            if gw is not None:
                torch.addmm(gw, g.t(), xc, out=gw)
        ctx.save_for_backward(gx, gw)
        return loss.sum() / count

    @staticmethod
    def backward(ctx, grad_out):
        gx, gw = ctx.saved_tensors
        if not torch.equal(grad_out, torch.ones_like(grad_out)):
            gx = gx * grad_out if gx is not None else None
            gw = gw * grad_out if gw is not None else None
        return gx, gw, None


def liger_fn():
    try:
        from liger_kernel.ops.fused_linear_cross_entropy import (
            LigerFusedLinearCrossEntropyFunction)
    except Exception as e:  # not installed: the plain PyTorch reimplementation
        print(f"liger_kernel does not import ({e}); its algorithm in PyTorch instead",
              file=sys.stderr)
        return "chunked (Liger's algorithm in PyTorch)", ChunkedLinearCE.apply

    def run(x, w, t):
        out = LigerFusedLinearCrossEntropyFunction.apply(x, w, t)  # ignore_index -100 by default
        return out[0] if isinstance(out, tuple) else out
    return "liger_kernel", run


def timed(fns):
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


def peak_extra(fn, leaves):
    for p in leaves:
        p.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def bench(dtype):
    x = torch.randn(N, D, device="cuda", dtype=dtype).requires_grad_(True)
    w = (torch.randn(V, D, device="cuda", dtype=dtype) * 0.02).requires_grad_(True)
    t = torch.randint(0, V, (N,), device="cuda")
    name, fused = liger_fn()

    def eager_fb():
        x.grad = w.grad = None
        F.cross_entropy(F.linear(x, w), t, ignore_index=IGNORE).backward()

    def fused_fb():
        x.grad = w.grad = None
        fused(x, w, t).backward()

    def eager_fwd():
        with torch.no_grad():
            F.cross_entropy(F.linear(x, w), t, ignore_index=IGNORE)

    ms = timed([eager_fb, fused_fb, eager_fwd])
    mib = [peak_extra(eager_fb, [x, w]), peak_extra(fused_fb, [x, w])]
    dn = str(dtype).replace("torch.", "")
    flop = 3 * 2.0 * N * D * V
    rows = [("eager fwd+bwd", ms[0], flop, mib[0]), (name + " fwd+bwd", ms[1], flop, mib[1]),
            ("eager fwd (no grad)", ms[2], flop / 3, None)]
    for label, m, f, mb in rows:
        line = (f"torch linear_ce {dn:8s} N={N} d={D} V={V} {label:44s} {m:8.3f} ms "
                f"{f / (m * 1e-3) / 1e12:6.1f} TFLOP/s (GEMMs)")
        if mb is not None:
            line += f"  peak extra {mb:8.1f} MiB"
        print(line)
    with torch.no_grad():
        le = F.cross_entropy(F.linear(x, w), t, ignore_index=IGNORE).item()
    lf = fused(x.detach(), w.detach(), t).item()
    print(f"torch linear_ce {dn:8s} loss eager {le:.6f} {name} {lf:.6f}")
    del x, w, t
    torch.cuda.empty_cache()


def main():
    if not torch.cuda.is_available():
        print("torch_cuda_linear_ce: no usable GPU, skipped")
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    print("device:", torch.cuda.get_device_name(0), "torch", torch.__version__)
    for dt in (torch.bfloat16, torch.float32):
        bench(dt)


if __name__ == "__main__":
    main()
