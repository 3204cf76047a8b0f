"""PyTorch eager on the training steps bench_cuda_train times: the MLP 784-256-10 and the CNN
conv(1->16, 3x3, pad 1)-relu-maxpool 2-conv(16->32)-relu-maxpool 2-linear(1568->10), batch 64,
float32 with TF32 off, cross-entropy, zero_grad(set_to_none), backward, SGD momentum 0.9.
Blocks of 50 steps timed with CUDA events from an idle device, the loss read once per block;
median ms per step.

When the cten benchmark is built (CT_GPU_BUILD, default build-gpu, or the path given as the first
argument), it runs in alternation with PyTorch, ROUNDS times each, and the lines give cten's
median next to PyTorch's and the ratio cten / PyTorch (< 1: cten is faster)."""
import os
import re
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F

BATCH, STEPS, BLOCKS, WARMUP, ROUNDS = 64, 50, 15, 2, 3


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(28 * 28, 256)
        self.fc2 = torch.nn.Linear(256, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc = torch.nn.Linear(32 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def torch_ms_per_step(cnn):
    dev = torch.device("cuda")
    model = (CNN() if cnn else MLP()).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn((BATCH, 1, 28, 28) if cnn else (BATCH, 28 * 28), device=dev)
    y = torch.randint(0, 10, (BATCH,), device=dev)
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per = []
    for b in range(-WARMUP, BLOCKS):
        torch.cuda.synchronize()
        t0.record()
        for _ in range(STEPS):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        t1.record()
        loss.item()
        t1.synchronize()
        if b >= 0:
            per.append(t0.elapsed_time(t1) / STEPS)
    return statistics.median(per)


def cten_ms_per_step(binary):
    """{"mlp": ms, "cnn": ms} from one run of bench_cuda_train, or None."""
    try:
        out = subprocess.run([binary, "5"], capture_output=True, text=True, timeout=300).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    got = {}
    for line in out.splitlines():
        m = re.match(r"train step (mlp|cnn) \S+\s+([0-9.]+)", line)
        if m:
            got[m.group(1)] = float(m.group(2))
    return got if len(got) == 2 else None


def main():
    if not torch.cuda.is_available():
        print("torch_cuda_train: skipped, no usable GPU")
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    build = os.environ.get("CT_GPU_BUILD", "build-gpu")
    binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(build, "bench", "bench_cuda_train")
    have_cten = os.access(binary, os.X_OK)
    times = {"mlp": [], "cnn": []}
    ctimes = {"mlp": [], "cnn": []}
    for _ in range(ROUNDS if have_cten else 1):
        for name in times:
            times[name].append(torch_ms_per_step(name == "cnn"))
        if have_cten:
            got = cten_ms_per_step(binary)
            if got:
                for name in ctimes:
                    ctimes[name].append(got[name])
    print(f"torch {torch.__version__} eager on {torch.cuda.get_device_name()}: batch {BATCH}, "
          f"float32, TF32 off, SGD momentum; median of {BLOCKS} blocks of {STEPS} steps")
    labels = {"mlp": "train step mlp 784-256-10", "cnn": "train step cnn 2conv+fc"}
    for name in times:
        t = statistics.median(times[name])
        if ctimes[name]:
            c = statistics.median(ctimes[name])
            print(f"{labels[name]:<30} torch {t:8.3f} ms   cten {c:8.3f} ms   "
                  f"ratio cten/torch {c / t:6.2f}")
        else:
            print(f"{labels[name]:<30} torch {t:8.3f} ms   (cten benchmark {binary} not run)")


if __name__ == "__main__":
    main()
