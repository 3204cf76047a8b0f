/* Per-op overhead of the CPU path: ct_add on two 1-element float32 tensors,
 * result released, timed over batches of calls; prints the median ns/op. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tensor/tensor.h"

#define CALLS 1000000
#define BATCHES 7

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void) {
    float va = 1.5f, vb = 2.25f;
    ct_tensor *a = ct_tensor_from_data(&va, CT_F32, CT_SHAPE(1));
    ct_tensor *b = ct_tensor_from_data(&vb, CT_F32, CT_SHAPE(1));
    if (!a || !b) {
        fprintf(stderr, "overhead: %s\n", ct_last_error());
        return 1;
    }
    for (int i = 0; i < 10000; i++) ct_tensor_release(ct_add(a, b)); /* warm up */
    double ns[BATCHES];
    for (int k = 0; k < BATCHES; k++) {
        double t0 = now_s();
        for (int i = 0; i < CALLS; i++) {
            ct_tensor *c = ct_add(a, b);
            if (!c) {
                fprintf(stderr, "overhead: %s\n", ct_last_error());
                return 1;
            }
            ct_tensor_release(c);
        }
        ns[k] = (now_s() - t0) * 1e9 / CALLS;
    }
    qsort(ns, BATCHES, sizeof ns[0], cmp_double);
    printf("ct_add, two 1-element float32 tensors, result released: %.1f ns/op "
           "(median of %d batches of %d calls; min %.1f, max %.1f)\n",
           ns[BATCHES / 2], BATCHES, CALLS, ns[0], ns[BATCHES - 1]);
    ct_tensor_release(a);
    ct_tensor_release(b);
    return 0;
}
