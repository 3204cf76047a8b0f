"""PyTorch's twin of bench_lm_step: one whole training step of the language model of
examples/reference/train_lm.py (zero_grad, forward with bf16 autocast on a GPU, cross-entropy on
the tied head, backward, AdamW with weight decay on the 2-d weights; fused AdamW on a GPU) on
random tokens, eager and (on a GPU, PyTorch 2) torch.compile'd, for the shapes bench_lm_step
knows (gpt2-124m, llama-124m: B16 T1024 vocab 50304; small: the CPU comparison's).

  python3 bench/torch_lm_step.py --shape llama-124m --device cuda [--cten build/bench/bench_lm_step]

With --cten, the cten program runs in alternation with PyTorch, --rounds times each, and each
line is printed as it comes, so the ratios come from one run on one machine; --recompute has
cten recompute the MLP's activation in the backward (torch.compile's partitioner recomputes
what it finds cheap on its own); --cten-graph adds cten's step replayed from a CUDA graph. A GPU
shape on a
machine without a GPU prints a line saying so and exits 0."""
import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples",
                                "reference"))
import train_lm  # noqa: E402

SHAPES = {
    "gpt2-124m": dict(model="gpt2", n_layer=12, n_embd=768, n_head=12, n_kv_head=12,
                      ffn_hidden=3072, context=1024, vocab=50304, batch=16),
    "llama-124m": dict(model="llama", n_layer=12, n_embd=768, n_head=12, n_kv_head=12,
                       ffn_hidden=2048, context=1024, vocab=50304, batch=16),
    "small": dict(model="llama", n_layer=4, n_embd=128, n_head=4, n_kv_head=2, ffn_hidden=384,
                  context=128, vocab=256, batch=8),
}


def peak_gib(device):
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 30
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def run_torch(args, device, compiled):
    s = SHAPES[args.shape]
    cfg = train_lm.Config(s)
    torch.manual_seed(1)
    model = train_lm.LM(cfg).to(device)
    train_lm.init_weights(model)
    opt = train_lm.make_optimizer(model, 6e-4, (0.9, 0.95), 1e-8, 0.1, fused=device.type == "cuda")
    B = args.batch or s["batch"]
    x = torch.randint(0, cfg.vocab, (B, cfg.context), device=device)
    y = torch.randint(0, cfg.vocab, (B, cfg.context), device=device)
    amp = device.type == "cuda"
    fwd = torch.compile(model) if compiled else model

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = fwd(x, y)
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    ms = []
    for _ in range(args.blocks):
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        sync()
        ms.append(1e3 * (time.perf_counter() - t0) / args.steps)
    med = statistics.median(ms)
    name = "torch.compile" if compiled else "torch eager"
    print(f"{name} {torch.__version__} {args.shape} {device.type}{' bf16' if amp else ' f32'} "
          f"B{B} T{cfg.context}: {med:.2f} ms/step  {B * cfg.context / med * 1e3:.0f} tok/s  "
          f"peak {peak_gib(device):.2f} GiB", flush=True)
    return B * cfg.context / med * 1e3


def run_cten(args, graph=False):
    cmd = [args.cten, "--shape", args.shape, "--device", args.device, "--steps", str(args.steps),
           "--blocks", str(args.blocks)]
    if args.batch:
        cmd += ["--batch", str(args.batch)]
    if args.recompute:
        cmd += ["--recompute", "1"]
    if graph:
        cmd += ["--cuda-graph", "1"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()
    print(out, flush=True)
    return float(out.split(" tok/s")[0].split()[-1]) if "tok/s" in out else None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="small")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cten", help="bench_lm_step to run in alternation")
    p.add_argument("--recompute", action="store_true",
                   help="cten recomputes the MLP's activation in the backward")
    p.add_argument("--cten-graph", action="store_true",
                   help="cten also runs its step replayed from a CUDA graph (--cuda-graph 1), as "
                        "its training loop does; torch.compile's default mode replays none")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"torch_lm_step {args.shape}: skipped, no GPU")
        return
    modes = [False] + ([True] if device.type == "cuda" and hasattr(torch, "compile") else [])
    rates = {}
    for _ in range(args.rounds):
        for compiled in modes:
            rates.setdefault("compile" if compiled else "eager", []).append(
                run_torch(args, device, compiled))
        for graph in ([False, True] if args.cten_graph else [False]) if args.cten else []:
            r = run_cten(args, graph)
            if r:
                rates.setdefault("cten graph" if graph else "cten", []).append(r)
    for mine in ("cten", "cten graph"):
        if mine not in rates:
            continue
        c = statistics.median(rates[mine])
        for k in ("eager", "compile"):
            if k in rates:
                print(f"{mine} / torch {k} tokens/s: {c / statistics.median(rates[k]):.2f}x "
                      f"(medians of {args.rounds} rounds)")


if __name__ == "__main__":
    main()
