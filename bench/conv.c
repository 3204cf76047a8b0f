/* Times conv2d on the CPU: forward, and forward + backward (input, weight and
 * bias gradients), in ms and GFLOP/s. The main case is a ResNet stage layer
 * (N=32, 64->64 channels, 56x56, 3x3, padding 1, f32), timed against PyTorch
 * on the same machine: rounds alternate between cten and a PyTorch process
 * kept alive beside it (bench/torch_conv.py --serve), so both see the same
 * machine state; each round takes the median of its repeats, and the summary
 * gives the median over rounds of each side and of the per-round ratio. The
 * two small Fashion-MNIST layers follow, cten only. One traced call per case
 * prints the routine each op ran.
 *
 * usage: bench_conv [rounds] [repeats] [torch_conv.py] [python]
 *   rounds 0 skips PyTorch; the script defaults to bench/torch_conv.py, the
 *   interpreter to /usr/bin/python3. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

static double median(const double *v, int n) {
    double *s = malloc((size_t)n * sizeof *s);
    if (!s) return 0;
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    double m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    free(s);
    return m;
}

typedef struct layer {
    const char *name;
    int64_t N, C, H, W, Co, k, pad;
} layer;

typedef struct operands {
    ct_tensor *x, *w, *b;
    double gflop;
} operands;

/* One forward (and with backward, the three gradients); false on error. */
static bool step(const layer *L, const operands *o, bool backward) {
    int64_t s[2] = {1, 1}, p[2] = {L->pad, L->pad}, d[2] = {1, 1};
    int64_t xs[4] = {L->N, L->C, L->H, L->W}, ws[4] = {L->Co, L->C, L->k, L->k};
    ct_scope *sc = ct_scope_begin();
    ct_tensor *y = ct_conv2d(o->x, o->w, o->b, s, p, d, 1);
    bool ok = y != NULL;
    if (ok && backward) {
        ok = ct_conv2d_backward_input(y, o->w, xs, s, p, d, 1) &&
             ct_conv2d_backward_weight(y, o->x, ws, s, p, d, 1) && ct_conv2d_backward_bias(y);
    }
    ct_scope_end(sc);
    if (!ok) fprintf(stderr, "bench_conv: %s\n", ct_last_error());
    return ok;
}

/* Median ms of reps calls (after one warm-up call); negative on error. */
static double time_step(const layer *L, const operands *o, bool backward, int reps) {
    double *t = malloc((size_t)reps * sizeof *t);
    if (!t || !step(L, o, backward)) {
        free(t);
        return -1;
    }
    for (int r = 0; r < reps; r++) {
        double t0 = now_ms();
        if (!step(L, o, backward)) {
            free(t);
            return -1;
        }
        t[r] = now_ms() - t0;
    }
    double m = median(t, reps);
    free(t);
    return m;
}

static bool setup(const layer *L, operands *o) {
    o->x = ct_tensor_randn(NULL, CT_SHAPE(L->N, L->C, L->H, L->W), CT_F32, CT_CPU);
    o->w = ct_tensor_randn(NULL, CT_SHAPE(L->Co, L->C, L->k, L->k), CT_F32, CT_CPU);
    o->b = ct_tensor_randn(NULL, CT_SHAPE(L->Co), CT_F32, CT_CPU);
    int64_t oh = L->H + 2 * L->pad - L->k + 1, ow = L->W + 2 * L->pad - L->k + 1;
    o->gflop = 2.0 * (double)(L->N * L->Co * oh * ow) * (double)(L->C * L->k * L->k) / 1e9;
    printf("%s: x [%lld, %lld, %lld, %lld], w [%lld, %lld, %lld, %lld], padding %lld, f32, "
           "%.2f GFLOP per conv\n",
           L->name, (long long)L->N, (long long)L->C, (long long)L->H, (long long)L->W,
           (long long)L->Co, (long long)L->C, (long long)L->k, (long long)L->k,
           (long long)L->pad, o->gflop);
    fflush(stdout);
    if (!o->x || !o->w || !o->b) {
        fprintf(stderr, "bench_conv: %s\n", ct_last_error());
        return false;
    }
    ct_set_trace(true);
    bool ok = step(L, o, true);
    ct_set_trace(false);
    fflush(stderr);
    return ok;
}

static void release(operands *o) {
    ct_tensor_release(o->x);
    ct_tensor_release(o->w);
    ct_tensor_release(o->b);
}

/* A PyTorch process answering one round per request (torch_conv.py --serve). */
typedef struct torch_proc {
    pid_t pid;
    FILE *to, *from;
} torch_proc;

static bool torch_start(torch_proc *t, const char *python, const char *script, int reps) {
    int in[2], out[2];
    if (pipe(in) != 0) return false;
    if (pipe(out) != 0) {
        close(in[0]);
        close(in[1]);
        return false;
    }
    char r[32];
    snprintf(r, sizeof r, "%d", reps);
    t->pid = fork();
    if (t->pid < 0) return false;
    if (t->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        execl(python, python, script, "--serve", r, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    t->to = fdopen(in[1], "w");
    t->from = fdopen(out[0], "r");
    char line[64];
    return t->to && t->from && fgets(line, sizeof line, t->from) && strncmp(line, "ready", 5) == 0;
}

static bool torch_round(torch_proc *t, double *fwd, double *both) {
    char line[128];
    if (fputs("round\n", t->to) == EOF || fflush(t->to) != 0) return false;
    if (!fgets(line, sizeof line, t->from)) return false;
    return sscanf(line, "%lf %lf", fwd, both) == 2;
}

static void torch_stop(torch_proc *t) {
    if (t->to) fclose(t->to); /* end of input ends the server */
    if (t->from) fclose(t->from);
    if (t->pid > 0) waitpid(t->pid, NULL, 0);
}

/* The ResNet layer, alternating with PyTorch for `rounds` rounds. */
static int run_vs_torch(const layer *L, int rounds, int reps, const char *python,
                        const char *script) {
    operands o;
    if (!setup(L, &o)) return 1;
    torch_proc tp = {0, NULL, NULL};
    bool torch = rounds > 0 && torch_start(&tp, python, script, reps);
    if (rounds > 0 && !torch)
        fprintf(stderr, "bench_conv: could not run %s %s --serve; cten only\n", python, script);
    int n = rounds > 0 ? rounds : 1;
    double *v = calloc((size_t)(6 * n), sizeof *v);
    double *cf = v, *cb = v + n, *tf = v + 2 * n, *tb = v + 3 * n, *rf = v + 4 * n, *rb = v + 5 * n;
    int rc = 0;
    for (int r = 0; v && r < n; r++) {
        cf[r] = time_step(L, &o, false, reps);
        cb[r] = time_step(L, &o, true, reps);
        if (cf[r] < 0 || cb[r] < 0) {
            rc = 1;
            n = r;
            break;
        }
        if (torch && !torch_round(&tp, &tf[r], &tb[r])) {
            fprintf(stderr, "bench_conv: the PyTorch process stopped answering\n");
            torch = false;
        }
        if (torch) {
            rf[r] = cf[r] / tf[r];
            rb[r] = cb[r] / tb[r];
            printf("  round %2d: forward cten %7.2f ms torch %7.2f ms | forward+backward cten "
                   "%7.2f ms torch %7.2f ms\n",
                   r + 1, cf[r], tf[r], cb[r], tb[r]);
        } else {
            printf("  round %2d: forward cten %7.2f ms | forward+backward cten %7.2f ms\n", r + 1,
                   cf[r], cb[r]);
        }
        fflush(stdout);
    }
    if (v && n > 0) {
        double mf = median(cf, n), mb = median(cb, n);
        printf("  cten  forward          median %8.2f ms  %7.1f GFLOP/s  (%d rounds x %d repeats)\n",
               mf, o.gflop / (mf / 1e3), n, reps);
        printf("  cten  forward+backward median %8.2f ms  %7.1f GFLOP/s\n", mb,
               3 * o.gflop / (mb / 1e3));
        if (torch) {
            double tmf = median(tf, n), tmb = median(tb, n);
            printf("  torch forward          median %8.2f ms  %7.1f GFLOP/s\n", tmf,
                   o.gflop / (tmf / 1e3));
            printf("  torch forward+backward median %8.2f ms  %7.1f GFLOP/s\n", tmb,
                   3 * o.gflop / (tmb / 1e3));
            printf("  cten/torch time ratio, median of rounds: forward %.3f, forward+backward "
                   "%.3f\n",
                   median(rf, n), median(rb, n));
        }
    }
    if (tp.pid > 0) torch_stop(&tp);
    free(v);
    release(&o);
    return rc;
}

static int run_cten(const layer *L, int reps) {
    operands o;
    if (!setup(L, &o)) return 1;
    int rc = 0;
    for (int bwd = 0; bwd < 2; bwd++) {
        double m = time_step(L, &o, bwd, reps), fl = bwd ? 3 * o.gflop : o.gflop;
        if (m < 0) {
            rc = 1;
            break;
        }
        printf("  %-22s median %8.2f ms  %7.1f GFLOP/s  (%d repeats)\n",
               bwd ? "forward+backward" : "forward", m, fl / (m / 1e3), reps);
    }
    release(&o);
    return rc;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 7;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    const char *script = argc > 3 ? argv[3] : "bench/torch_conv.py";
    const char *python = argc > 4 ? argv[4] : "/usr/bin/python3";
    if (rounds < 0) rounds = 0;
    if (reps < 1) reps = 1;
    signal(SIGPIPE, SIG_IGN);
    printf("BLAS: %s, threads %d\n", ct_blas_info(), ct_get_num_threads());
    const layer resnet = {"resnet 64->64 56x56", 32, 64, 56, 56, 64, 3, 1};
    const layer small[] = {
        {"fashion-mnist conv1", 64, 1, 28, 28, 16, 3, 1},
        {"fashion-mnist conv2", 64, 16, 14, 14, 32, 3, 1},
    };
    int rc = run_vs_torch(&resnet, rounds, reps, python, script);
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) rc |= run_cten(&small[i], 20 * reps);
    return rc;
}
