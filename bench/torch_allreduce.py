"""The anchor of bench/allreduce.c on GPUs where NCCL's all_reduce_perf is
absent: torch.distributed's all_reduce (NCCL backend) on float32 tensors of
the same sizes, with the same bus-bandwidth formula (busbw = S / t * 2 (n-1) / n),
the same warm-up, iterations and best of three rounds, printed in the same
columns. Run it as the ranks of one job, under mpirun (it reads Open MPI's
rank variables) or torchrun:

    mpirun -np 2 python3 bench/torch_allreduce.py --sizes 1M,16M,256M,1G
"""
import argparse
import os
import time

import torch
import torch.distributed as dist


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1], 1)
    return int(float(s[:-1] if s[-1] in "KMG" else s) * mult)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1K,64K,1M,16M,64M")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    env = os.environ
    rank = int(env.get("RANK", env.get("OMPI_COMM_WORLD_RANK", "0")))
    world = int(env.get("WORLD_SIZE", env.get("OMPI_COMM_WORLD_SIZE", "1")))
    local = int(env.get("LOCAL_RANK", env.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")))
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", "29511")
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    if rank == 0:
        print("%12s %12s %12s %12s" % ("bytes", "time us", "algbw GB/s", "busbw GB/s"))

    def timed(t, iters):
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        dt = torch.tensor([(time.perf_counter() - t0) / iters], device="cuda")
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        return dt.item()

    for s in args.sizes.split(","):
        numel = max(1, parse_size(s) // 4)
        t = torch.ones(numel, dtype=torch.float32, device="cuda")
        timed(t, args.warmup)
        best = min(timed(t, args.iters) for _ in range(3))
        nbytes = numel * 4
        algbw = nbytes / best / 1e9
        busbw = algbw * 2 * (world - 1) / world
        if rank == 0:
            print("%12.0f %12.1f %12.3f %12.3f" % (nbytes, best * 1e6, algbw, busbw), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
