"""PyTorch on the cases bench_cuda_sort times: torch.sort (values and indices),
torch.argsort and torch.topk along the last dim of
  - many short rows: 4096 x 1024 f32, bf16 and int64, 16384 x 128 f32;
  - a few long rows: 1 x 16M f32, 16 x 1M f32;
  - topk: 4096 x 1024 k 50, 64 x 50304 k 50, 1 x 16M k 100;
each timed with CUDA events around one call: the median ms of REPS after WARMUP and the
elements per second. Run both in one session and compare the ms columns (the target:
cten within 1.5x of these). Prints a line saying why and exits 0 without a GPU."""
import statistics
import sys

import torch

REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
WARMUP = 3


def timed(fn):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for r in range(-WARMUP, REPS):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        if r >= 0:
            times.append(start.elapsed_time(stop))
    return statistics.median(times)


def case(what, kind, dtype, rows, cols, k=0):
    x = torch.randn(rows, cols, device="cuda")
    if dtype == torch.int64:
        x = (x * 1e6).to(dtype)
    else:
        x = x.to(dtype)
    if kind == "sort":
        fn = lambda: torch.sort(x, -1)
    elif kind == "argsort":
        fn = lambda: torch.argsort(x, -1)
    else:
        fn = lambda: torch.topk(x, k, -1)
    ms = timed(fn)
    print(f"{what:<36} {ms:9.3f} ms {rows * cols / (ms * 1e-3) / 1e9:8.2f} Gelem/s")
    del x
    torch.cuda.empty_cache()


def main():
    if not torch.cuda.is_available():
        print("torch_cuda_sort: skipped, no usable GPU")
        return
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}: median of {REPS} "
          f"after {WARMUP} warm-up, one call per interval")
    f32, bf16, i64 = torch.float32, torch.bfloat16, torch.int64
    case("sort 4096x1024 f32", "sort", f32, 4096, 1024)
    case("sort 4096x1024 bf16", "sort", bf16, 4096, 1024)
    case("sort 4096x1024 int64", "sort", i64, 4096, 1024)
    case("sort 16384x128 f32", "sort", f32, 16384, 128)
    case("argsort 4096x1024 f32", "argsort", f32, 4096, 1024)
    case("sort 1x16M f32", "sort", f32, 1, 1 << 24)
    case("sort 16x1M f32", "sort", f32, 16, 1 << 20)
    case("topk 4096x1024 k50 f32", "topk", f32, 4096, 1024, 50)
    case("topk 64x50304 k50 f32", "topk", f32, 64, 50304, 50)
    case("topk 1x16M k100 f32", "topk", f32, 1, 1 << 24, 100)


if __name__ == "__main__":
    main()
