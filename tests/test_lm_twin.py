"""The language-model example against its PyTorch twin: cten-train-lm
--compare writes its initial weights, its batches and its losses, and
examples/reference/train_lm.py --compare trains PyTorch's model from the
same weights on the same batches; their float32 CPU losses must agree
within 1e-4 relative at every one of 50 steps, for both model families
(llama with grouped-query attention, gpt2), with gradient accumulation.
Skipped (77) where this python has no torch.

usage: test_lm_twin.py CTEN_TRAIN_LM TWIN_SCRIPT DATA_FILE"""
import os
import subprocess
import sys
import tempfile

try:
    import torch  # noqa: F401
except ImportError:
    print("torch is not installed for", sys.executable, "- skipped")
    sys.exit(77)

exe, twin, data = sys.argv[1:4]
TINY = ["--layers", "2", "--width", "32", "--heads", "4", "--context", "32", "--batch-size", "4",
        "--grad-accum", "2", "--steps", "50", "--warmup", "5", "--lr", "3e-3", "--data", data]
worst_all = 0.0
for family, extra in (("llama", ["--kv-heads", "2"]), ("gpt2", [])):
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([exe, "--model", family, "--compare", d] + TINY + extra, check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run([sys.executable, twin, "--compare", d, "--threads", "1"], check=True,
                       stdout=subprocess.DEVNULL)
        ours = [float(l) for l in open(os.path.join(d, "losses.txt"))]
        theirs = [float(l) for l in open(os.path.join(d, "torch_losses.txt"))]
    assert len(ours) == len(theirs) == 50, (len(ours), len(theirs))
    # the curve must move: a loop that did not train would agree trivially
    assert ours[-1] < ours[0] - 0.5, (family, ours[0], ours[-1])
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
    print(f"{family}: largest relative difference of the losses {worst:.2e} over 50 steps "
          f"(first {ours[0]:.4f}, last {ours[-1]:.4f})")
    if not worst <= 1e-4:
        for i, (a, b) in enumerate(zip(ours, theirs)):
            print(f"step {i + 1:3d}  cten {a:.7f}  torch {b:.7f}")
        sys.exit(1)
