/* Elementwise geometry for the CUDA kernels: broadcast, reorder and merge the
 * operands' dims on the host, once per launch, so a kernel's index math is
 * as short as the layout allows. */
#include "cuda_impl.h"

/* Magic numbers for n / d == (umulhi(n, magic) + n) >> shift, valid for
 * n < 2^31 (the scheme PyTorch's IntDivider uses). */
static void divider(uint32_t d, uint32_t *magic, uint32_t *shift) {
    uint32_t s = 0;
    while (s < 32 && ((uint64_t)1 << s) < d) s++;
    uint64_t m = (((uint64_t)1 << 32) * (((uint64_t)1 << s) - d)) / d + 1;
    *magic = (uint32_t)m;
    *shift = s;
}

void cti_cuda_iter_init(cti_cuda_iter *it, int nops, ct_tensor *const *ops) {
    const ct_tensor *out = ops[0];
    int nd = out->ndim;
    it->nops = nops;
    it->numel = cti_numel(nd, out->shape);
    /* Innermost first; each operand right-aligned against the output, with
     * stride 0 for broadcast dims. Size-1 dims are dropped. */
    int n = 0;
    for (int d = nd - 1; d >= 0; d--) {
        if (out->shape[d] == 1) continue;
        it->shape[n] = out->shape[d];
        for (int k = 0; k < nops; k++) {
            const ct_tensor *t = ops[k];
            int td = d - (nd - t->ndim);
            it->stride[k][n] = td >= 0 && t->shape[td] != 1 ? t->stride[td] : 0;
        }
        n++;
    }
    /* Order dims by the output's strides, smallest innermost, so writes to a
     * permuted output stay coalesced (insertion sort: few dims, stable). */
    for (int i = 1; i < n; i++) {
        for (int j = i; j > 0; j--) {
            int64_t a = it->stride[0][j - 1], b = it->stride[0][j];
            if ((a < 0 ? -a : a) <= (b < 0 ? -b : b)) break;
            int64_t sh = it->shape[j];
            it->shape[j] = it->shape[j - 1];
            it->shape[j - 1] = sh;
            for (int k = 0; k < nops; k++) {
                int64_t s = it->stride[k][j];
                it->stride[k][j] = it->stride[k][j - 1];
                it->stride[k][j - 1] = s;
            }
        }
    }
    /* Merge dim i+1 into dim i where every operand steps over dim i's extent
     * exactly once. */
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m > 0) {
            bool merge = true;
            for (int k = 0; k < nops && merge; k++)
                merge = it->stride[k][i] == it->stride[k][m - 1] * it->shape[m - 1];
            if (merge) {
                it->shape[m - 1] *= it->shape[i];
                continue;
            }
        }
        it->shape[m] = it->shape[i];
        for (int k = 0; k < nops; k++) it->stride[k][m] = it->stride[k][i];
        m++;
    }
    if (m == 0 && it->numel > 0) { /* all size-1: one element */
        it->shape[0] = 1;
        for (int k = 0; k < nops; k++) it->stride[k][0] = 0;
        m = 1;
    }
    it->ndim = m;
    it->use32 = it->numel > 0 && it->numel <= INT32_MAX;
    for (int d = 0; d < m; d++) {
        if (it->use32) divider((uint32_t)it->shape[d], &it->magic[d], &it->shift[d]);
        else it->magic[d] = it->shift[d] = 0;
    }
}

/* The widest unit (4, 8 or 16 bytes, at least es) in which the copy of
 * operand 1 into operand 0 can move: both innermost dims contiguous, and
 * the run length, every other stride and both addresses multiples of it.
 * it then counts units instead of elements. Strided copies of rows (a
 * slice's columns, a cat's pieces, a broadcast bias) move 16 bytes a thread
 * instead of one element. */
int cti_cuda_iter_widen(cti_cuda_iter *it, int es, const void *p0, const void *p1) {
    if (it->nops != 2 || it->ndim < 1 || it->numel == 0 || it->stride[0][0] != 1 ||
        it->stride[1][0] != 1)
        return es;
    int unit = 16;
    for (; unit > es; unit /= 2) {
        bool ok = (it->shape[0] * es) % unit == 0 && (uintptr_t)p0 % (uintptr_t)unit == 0 &&
                  (uintptr_t)p1 % (uintptr_t)unit == 0;
        for (int d = 1; d < it->ndim && ok; d++)
            ok = (it->stride[0][d] * es) % unit == 0 && (it->stride[1][d] * es) % unit == 0;
        if (ok) break;
    }
    if (unit <= es || unit < 4) return es;
    int f = unit / es;
    it->shape[0] /= f;
    it->numel /= f;
    for (int d = 1; d < it->ndim; d++) {
        it->stride[0][d] /= f;
        it->stride[1][d] /= f;
    }
    if (it->use32) divider((uint32_t)it->shape[0], &it->magic[0], &it->shift[0]);
    return unit;
}
