"""PyTorch on the cases bench_cuda_optim times: one AdamW step over the parameters of
GPT-2 124M (wte 50304 x 768, wpe 1024 x 768, 12 blocks, ln_f: 148 tensors, 124.5M
elements), float32 parameters, gradients and moments, alternating with a
device-to-device copy of the same bytes (7 x 4 per element: params read and written,
grads read, both moments read and written; the copy moves the same total), each timed
with CUDA events: median ms per step with BURST steps queued (the device's rate) and
with one (the host's time to queue it counts), GB/s and that as a share of the copy's.
  - torch.optim.AdamW(fused=True)
  - torch.optim.AdamW(fused=True, capturable=True) (step counts on the device)
  - torch.optim.AdamW(capturable=True) (foreach), and the same step captured in a
    CUDA graph and replayed
  - SGD with momentum (foreach), 5 x 4 bytes per element
Prints a line saying why and exits 0 without a GPU."""
import statistics
import sys

import torch

D, LAYERS = 768, 12
REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
WARMUP = 3
BURST = 5


def gpt2_shapes():
    shapes = [(50304, D), (1024, D)]
    for _ in range(LAYERS):
        shapes += [(D,), (D,), (3 * D, D), (3 * D,), (D, D), (D,), (D,), (D,),
                   (4 * D, D), (4 * D,), (D, 4 * D), (D,)]
    return shapes + [(D,), (D,)]


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


def report(what, ms, copy_ms, nbytes):
    gbs, copy_gbs = nbytes / (ms * 1e-3) / 1e9, nbytes / (copy_ms * 1e-3) / 1e9
    print(f"{what:<40} {ms:8.3f} ms {gbs:7.0f} GB/s {100 * gbs / copy_gbs:6.1f}% of copy "
          f"({copy_ms:.3f} ms, {copy_gbs:.0f} GB/s)")


def params():
    ps = [torch.randn(s, device="cuda").requires_grad_(True) for s in gpt2_shapes()]
    for p in ps:
        p.grad = torch.randn_like(p)
    return ps


def bench(name, make_opt, bpe, graph=False):
    ps = params()
    numel = sum(p.numel() for p in ps)
    opt = make_opt(ps)
    nbytes = bpe * numel
    src = torch.zeros(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)

    def copy():
        dst.copy_(src)

    opt.step()  # the state exists
    print(f"{name}, {len(ps)} tensors, {numel / 1e6:.1f}M elements")
    ms_copy, ms_step = timed([copy, opt.step], BURST)
    report(f"  step, {BURST} queued (device rate)", ms_step, ms_copy, nbytes)
    ms_copy, ms_step = timed([copy, opt.step])
    report("  one step (with the host's queueing)", ms_step, ms_copy, nbytes)
    if graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                opt.step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            opt.step()
        ms_copy, ms_replay = timed([copy, g.replay])
        report("  one CUDA graph replay of the step", ms_replay, ms_copy, nbytes)


def main():
    if not torch.cuda.is_available():
        print("torch_cuda_optim: skipped, no usable GPU")
        return
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}: GPT-2 124M parameter "
          f"shapes, median of {REPS} after {WARMUP} warm-up, alternating with a "
          f"device-to-device copy of the same bytes")
    kw = dict(lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    bench("adamw f32 fused=True (28 B/elem)",
          lambda ps: torch.optim.AdamW(ps, fused=True, **kw), 28)
    bench("adamw f32 fused, capturable (28 B/elem)",
          lambda ps: torch.optim.AdamW(ps, fused=True, capturable=True, **kw), 28, graph=True)
    bench("adamw f32 foreach, capturable (28 B/elem)",
          lambda ps: torch.optim.AdamW(ps, foreach=True, capturable=True, **kw), 28,
          graph=True)
    bench("sgd momentum f32 foreach (20 B/elem)",
          lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9, foreach=True), 20)
    print("\nGB/s counts the bytes an update must move (params r+w, grads r, states r+w); the "
          "copy moves the same total.")


if __name__ == "__main__":
    main()
