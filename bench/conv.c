/* Times conv2d on the CPU: forward, and forward + backward (input, weight and
 * bias gradients), median of repeats, in ms and GFLOP/s. The main case is a
 * ResNet stage layer (N=32, 64->64 channels, 56x56, 3x3, padding 1, f32); the
 * two small Fashion-MNIST layers follow. One traced call per case prints the
 * routine each op ran.
 *
 * usage: bench_conv [repeats] */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tensor/tensor.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct layer {
    const char *name;
    int64_t N, C, H, W, Co, k, pad;
} layer;

/* One forward (and with backward, the three gradients); false on error. */
static bool step(const layer *L, ct_tensor *x, ct_tensor *w, ct_tensor *b, bool backward) {
    int64_t s[2] = {1, 1}, p[2] = {L->pad, L->pad}, d[2] = {1, 1};
    int64_t xs[4] = {L->N, L->C, L->H, L->W}, ws[4] = {L->Co, L->C, L->k, L->k};
    ct_scope *sc = ct_scope_begin();
    ct_tensor *y = ct_conv2d(x, w, b, s, p, d, 1);
    bool ok = y != NULL;
    if (ok && backward) {
        ok = ct_conv2d_backward_input(y, w, xs, s, p, d, 1) &&
             ct_conv2d_backward_weight(y, x, ws, s, p, d, 1) && ct_conv2d_backward_bias(y);
    }
    ct_scope_end(sc);
    if (!ok) fprintf(stderr, "bench_conv: %s\n", ct_last_error());
    return ok;
}

static int run(const layer *L, int reps) {
    ct_tensor *x = ct_tensor_randn(NULL, CT_SHAPE(L->N, L->C, L->H, L->W), CT_F32, CT_CPU);
    ct_tensor *w = ct_tensor_randn(NULL, CT_SHAPE(L->Co, L->C, L->k, L->k), CT_F32, CT_CPU);
    ct_tensor *b = ct_tensor_randn(NULL, CT_SHAPE(L->Co), CT_F32, CT_CPU);
    if (!x || !w || !b) {
        fprintf(stderr, "bench_conv: %s\n", ct_last_error());
        return 1;
    }
    int64_t oh = L->H + 2 * L->pad - L->k + 1, ow = L->W + 2 * L->pad - L->k + 1;
    double gflop = 2.0 * (double)(L->N * L->Co * oh * ow) * (double)(L->C * L->k * L->k) / 1e9;
    printf("%s: x [%lld, %lld, %lld, %lld], w [%lld, %lld, %lld, %lld], padding %lld, f32, "
           "%.2f GFLOP per conv\n",
           L->name, (long long)L->N, (long long)L->C, (long long)L->H, (long long)L->W,
           (long long)L->Co, (long long)L->C, (long long)L->k, (long long)L->k,
           (long long)L->pad, gflop);
    fflush(stdout);
    ct_set_trace(true);
    bool ok = step(L, x, w, b, true);
    ct_set_trace(false);
    double *t = malloc((size_t)reps * sizeof(double));
    for (int bwd = 0; ok && bwd < 2; bwd++) {
        for (int r = 0; ok && r < 2; r++) ok = step(L, x, w, b, bwd); /* warm-up */
        for (int r = 0; ok && r < reps; r++) {
            double t0 = now_ms();
            ok = step(L, x, w, b, bwd);
            t[r] = now_ms() - t0;
        }
        if (!ok) break;
        double m = median(t, reps), fl = bwd ? 3 * gflop : gflop;
        printf("  %-22s median %8.2f ms  %7.1f GFLOP/s  (min %.2f ms, %d repeats)\n",
               bwd ? "forward+backward" : "forward", m, fl / (m / 1e3), t[0], reps);
    }
    free(t);
    ct_tensor_release(x);
    ct_tensor_release(w);
    ct_tensor_release(b);
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 15;
    if (reps < 1) reps = 1;
    printf("BLAS: %s, threads %d\n", ct_blas_info(), ct_get_num_threads());
    const layer layers[] = {
        {"resnet 64->64 56x56", 32, 64, 56, 56, 64, 3, 1},
        {"fashion-mnist conv1", 64, 1, 28, 28, 16, 3, 1},
        {"fashion-mnist conv2", 64, 16, 14, 14, 32, 3, 1},
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof layers / sizeof layers[0]; i++)
        rc |= run(&layers[i], i == 0 ? reps : 10 * reps);
    return rc;
}
