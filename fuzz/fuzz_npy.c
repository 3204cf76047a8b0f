/* .npy reading: the input is a whole file given to ct_load_npy. Whatever
 * the bytes, the load either fails with CT_ERR_FORMAT (or CT_ERR_OOM) and a
 * message naming the function and the file, or it gives a CPU tensor that
 * keeps the format's promises: row-major or (Fortran order) column-major
 * over exactly the file's data, no more bytes than the file holds, bool
 * bytes 0 or 1. A loaded tensor must survive a save and a second load
 * unchanged: dtype, shape, layout and bytes. */
#include <string.h>

#include "fuzz.h"

static void check_refusal(const char *path) {
    ct_status st = ct_last_status();
    FZ_CHECK(st == CT_ERR_FORMAT || st == CT_ERR_OOM, "ct_load_npy refused with %s",
             ct_status_name(st));
    FZ_CHECK(strstr(ct_last_error(), "ct_load_npy") && strstr(ct_last_error(), path),
             "message names neither the function nor the file");
}

/* Row-major or column-major, densely (sizes 0 and 1 aside). */
static bool dense(const ct_tensor *t, bool column_major) {
    int nd = ct_tensor_ndim(t);
    const int64_t *sh = ct_tensor_shape(t), *st = ct_tensor_strides(t);
    if (ct_tensor_numel(t) == 0) return true;
    int64_t expect = 1;
    for (int k = 0; k < nd; k++) {
        int d = column_major ? k : nd - 1 - k;
        if (sh[d] != 1 && st[d] != expect) return false;
        expect *= sh[d];
    }
    return true;
}

static void check_loaded(ct_tensor *t, size_t size) {
    FZ_CHECK(ct_tensor_device(t).type == CT_DEVICE_CPU, "loaded onto another device");
    FZ_CHECK(ct_tensor_offset(t) == 0, "loaded at an offset");
    FZ_CHECK(dense(t, false) || dense(t, true), "neither row- nor column-major");
    size_t nbytes = (size_t)ct_tensor_numel(t) * ct_dtype_size(ct_tensor_dtype(t));
    FZ_CHECK(nbytes + 10 <= size, "%zu bytes of data from a file of %zu", nbytes, size);
    if (ct_tensor_dtype(t) == CT_BOOL) {
        const unsigned char *b = ct_tensor_data_ptr(t);
        for (size_t i = 0; i < nbytes; i++) FZ_CHECK(b[i] <= 1, "bool byte %u", b[i]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fz_file(0, data, size);
    ct_clear_error();
    ct_tensor *t = ct_load_npy(path);
    if (!t) {
        check_refusal(path);
        return 0;
    }
    check_loaded(t, size);
    char out[128];
    snprintf(out, sizeof out, "%s/again.npy", fz_dir());
    FZ_CHECK(ct_save_npy(out, t) == CT_OK, "a loaded tensor does not save");
    ct_tensor *u = ct_load_npy(out);
    FZ_CHECK(u != NULL, "a saved tensor does not load");
    int nd = ct_tensor_ndim(t);
    FZ_CHECK(ct_tensor_dtype(u) == ct_tensor_dtype(t) && ct_tensor_ndim(u) == nd,
             "dtype or ndim changed");
    FZ_CHECK(memcmp(ct_tensor_shape(t), ct_tensor_shape(u), sizeof(int64_t) * (size_t)nd) == 0,
             "shape changed");
    /* The layout is kept; a stride of a size-1 dim is no part of it. */
    for (int d = 0; d < nd && ct_tensor_numel(t) > 0; d++)
        FZ_CHECK(ct_tensor_shape(t)[d] == 1 || ct_tensor_strides(t)[d] == ct_tensor_strides(u)[d],
                 "stride of dim %d changed", d);
    size_t nbytes = (size_t)ct_tensor_numel(t) * ct_dtype_size(ct_tensor_dtype(t));
    FZ_CHECK(nbytes == 0 || memcmp(ct_tensor_data_ptr(t), ct_tensor_data_ptr(u), nbytes) == 0,
             "bytes changed");
    ct_tensor_release(u);
    ct_tensor_release(t);
    return 0;
}
