"""PyTorch, eager and with the step captured in a CUDA graph, on the training steps
bench_cuda_train times: the MLP 784-256-10 and the CNN
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


def torch_graph_ms_per_step(cnn):
    """The same step captured whole in a torch.cuda.CUDAGraph (PyTorch's whole-network
    capture recipe: warmup on a side stream, static inputs, zero_grad(set_to_none=True)
    inside) and replayed, the batch copied into the static inputs before each replay."""
    dev = torch.device("cuda")
    model = (CNN() if cnn else MLP()).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn((BATCH, 1, 28, 28) if cnn else (BATCH, 28 * 28), device=dev)
    y = torch.randint(0, 10, (BATCH,), device=dev)
    sx, sy = x.clone(), y.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(sx), sy).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        static_loss = F.cross_entropy(model(sx), sy)
        static_loss.backward()
        opt.step()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per = []
    for b in range(-WARMUP, BLOCKS):
        torch.cuda.synchronize()
        t0.record()
        for _ in range(STEPS):
            sx.copy_(x)
            sy.copy_(y)
            g.replay()
        t1.record()
        static_loss.item()
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
        m = re.match(r"\s+(mlp|cnn), CUDA graph\s+([0-9.]+)", line)
        if m:
            got[m.group(1) + "_graph"] = float(m.group(2))
    return got if len(got) == 4 else None


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
    names = ["mlp", "mlp_graph", "cnn", "cnn_graph"]
    times = {n: [] for n in names}
    ctimes = {n: [] for n in names}
    for _ in range(ROUNDS if have_cten else 1):
        for name in times:
            cnn = name.startswith("cnn")
            f = torch_graph_ms_per_step if name.endswith("_graph") else torch_ms_per_step
            times[name].append(f(cnn))
        if have_cten:
            got = cten_ms_per_step(binary)
            if got:
                for name in ctimes:
                    ctimes[name].append(got[name])
    print(f"torch {torch.__version__} eager and CUDA graph on {torch.cuda.get_device_name()}: "
          f"batch {BATCH}, float32, TF32 off, SGD momentum; median of {BLOCKS} blocks of "
          f"{STEPS} steps")
    labels = {"mlp": "train step mlp 784-256-10", "cnn": "train step cnn 2conv+fc",
              "mlp_graph": "  mlp, CUDA graph", "cnn_graph": "  cnn, CUDA graph"}
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
