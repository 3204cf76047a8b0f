/* All-reduce bus bandwidth of ct_dist_all_reduce (docs/DISTRIBUTED.md),
 * reported as NCCL's tests report it: for S bytes reduced over n ranks in
 * t seconds, algbw = S / t and busbw = algbw * 2 (n - 1) / n, the rate each
 * rank's link carried. Run it as the ranks of one job:
 *
 *     mpirun -np 2 bench_allreduce --device cuda --sizes 1M,16M,256M,1G
 *     mpirun -np 2 bench_allreduce --device cpu --sizes 4K,1M,16M
 *
 * The anchor: on the CPU, MPI_Allreduce on the same buffer in the same
 * process, alternating with cten's call (the ratio is cten's overhead over
 * the MPI it calls); on the GPU, NCCL's own all_reduce_perf or PyTorch's
 * dist.all_reduce (bench/torch_allreduce.py), which bench/allreduce.sh runs
 * with the same sizes and ranks and puts beside this program's figures.
 * Rank 0 prints one line per size; --json PATH writes them as records. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tensor/tensor.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* "4K", "16M", "1G" (powers of 1024), or plain bytes. */
static long long parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    long long m = *end == 'K' ? 1LL << 10 : *end == 'M' ? 1LL << 20 : *end == 'G' ? 1LL << 30 : 1;
    return (long long)(v * (double)m);
}

typedef struct options {
    ct_device device;
    long long sizes[32];
    int nsizes, iters, warmup;
    const char *json;
} options;

static int parse(int argc, char **argv, options *o) {
    *o = (options){.device = CT_CPU, .iters = 20, .warmup = 5};
    const char *sizes = "1K,64K,1M,16M,64M";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--device") && v) {
            o->device = !strcmp(v, "cuda") ? CT_CUDA(0) : CT_CPU;
            i++;
        } else if (!strcmp(a, "--sizes") && v) {
            sizes = v;
            i++;
        } else if (!strcmp(a, "--iters") && v) {
            o->iters = atoi(v);
            i++;
        } else if (!strcmp(a, "--warmup") && v) {
            o->warmup = atoi(v);
            i++;
        } else if (!strcmp(a, "--json") && v) {
            o->json = v;
            i++;
        } else {
            fprintf(stderr,
                    "usage: %s [--device cpu|cuda] [--sizes 1K,1M,1G] [--iters N] [--warmup N] "
                    "[--json PATH]\n",
                    argv[0]);
            return -1;
        }
    }
    char buf[512];
    snprintf(buf, sizeof buf, "%s", sizes);
    for (char *t = strtok(buf, ","); t && o->nsizes < 32; t = strtok(NULL, ","))
        o->sizes[o->nsizes++] = parse_size(t);
    return o->iters > 0 && o->nsizes > 0 ? 0 : -1;
}

static void sync_device(ct_device d) {
    if (d.type == CT_DEVICE_CUDA) ct_cuda_synchronize(d.index);
}

/* Seconds per all-reduce of t: cten's, or (anchor) MPI_Allreduce on its
 * buffer, the slowest rank's mean over iters. */
static double time_once(ct_tensor *t, ct_device d, int iters, bool anchor) {
    ct_dist_barrier();
    double t0 = now_s();
    for (int k = 0; k < iters; k++) {
        if (anchor)
            MPI_Allreduce(MPI_IN_PLACE, ct_tensor_data_ptr(t), (int)ct_tensor_numel(t), MPI_FLOAT,
                          MPI_SUM, MPI_COMM_WORLD);
        else if (ct_dist_all_reduce(t, CT_DIST_SUM) != CT_OK) {
            fprintf(stderr, "ct_dist_all_reduce: %s\n", ct_last_error());
            return NAN;
        }
    }
    sync_device(d);
    double dt = (now_s() - t0) / iters, worst = dt;
    MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return worst;
}

int main(int argc, char **argv) {
    options o;
    if (parse(argc, argv, &o) != 0) return 2;
    if (ct_dist_init(NULL) != CT_OK) {
        fprintf(stderr, "ct_dist_init: %s\n", ct_last_error());
        return 1;
    }
    int rank = ct_dist_rank(), n = ct_dist_world_size();
    if (strcmp(ct_dist_launch(), "mpi") != 0) {
        fprintf(stderr, "bench_allreduce: run it under mpirun (its timing uses MPI)\n");
        ct_dist_finalize();
        return 2;
    }
    if (o.device.type == CT_DEVICE_CUDA)
        o.device.index = ct_dist_local_rank() % ct_cuda_device_count();
    bool anchor = o.device.type == CT_DEVICE_CPU;
    FILE *js = rank == 0 && o.json ? fopen(o.json, "w") : NULL;
    if (js) fprintf(js, "[\n");
    if (rank == 0)
        printf("%12s %12s %12s %12s%s\n", "bytes", "time us", "algbw GB/s", "busbw GB/s",
               anchor ? "   MPI busbw   cten/MPI" : "");
    int rc = 0;
    for (int s = 0; s < o.nsizes; s++) {
        int64_t numel = o.sizes[s] / 4;
        if (numel < 1) numel = 1;
        ct_tensor *t = ct_tensor_ones(1, &numel, CT_F32, o.device);
        if (!t) {
            fprintf(stderr, "allocating %lld bytes: %s\n", (long long)numel * 4, ct_last_error());
            rc = 1;
            break;
        }
        time_once(t, o.device, o.warmup, false);
        if (anchor) time_once(t, o.device, o.warmup, true);
        /* Alternate cten and the anchor; keep each one's best round. */
        double best = INFINITY, best_anchor = INFINITY;
        for (int round = 0; round < 3; round++) {
            double c = time_once(t, o.device, o.iters, false);
            if (c < best) best = c;
            if (anchor) {
                double a = time_once(t, o.device, o.iters, true);
                if (a < best_anchor) best_anchor = a;
            }
        }
        double bytes = (double)numel * 4, algbw = bytes / best / 1e9;
        double busbw = algbw * 2.0 * (n - 1) / n;
        double abus = anchor ? bytes / best_anchor / 1e9 * 2.0 * (n - 1) / n : NAN;
        if (rank == 0) {
            printf("%12.0f %12.1f %12.3f %12.3f", bytes, best * 1e6, algbw, busbw);
            if (anchor) printf(" %12.3f %10.3f", abus, busbw / abus);
            printf("\n");
            if (js)
                fprintf(js,
                        "  {\"bytes\": %.0f, \"ranks\": %d, \"device\": \"%s\", \"time_s\": %.9g, "
                        "\"busbw_gbs\": %.6g, \"anchor_busbw_gbs\": %.6g}%s\n",
                        bytes, n, anchor ? "cpu" : "cuda", best, busbw, anchor ? abus : 0.0,
                        s + 1 < o.nsizes ? "," : "");
        }
        ct_tensor_release(t);
    }
    if (js) {
        fprintf(js, "]\n");
        fclose(js);
    }
    fflush(stdout);
    if (ct_dist_finalize() != CT_OK) rc = 1;
    return rc;
}
