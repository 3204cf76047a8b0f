/* .npz reading: the input is a whole file given to ct_load_npz (libzip
 * reads the archive, cten each member). Whatever the bytes, the load either
 * fails with CT_ERR_FORMAT (or CT_ERR_OOM) and a message naming the
 * function and the file, or it gives a list of CPU tensors under unique
 * non-empty names holding no more bytes than deflate could have packed into
 * the file, with bool bytes 0 or 1. A loaded list must survive a save,
 * stored and deflated, and a second load unchanged: names, order, dtypes,
 * shapes and bytes. */
#include <string.h>

#include "fuzz.h"

static void check_refusal(const char *path) {
    ct_status st = ct_last_status();
    FZ_CHECK(st == CT_ERR_FORMAT || st == CT_ERR_OOM, "ct_load_npz refused with %s",
             ct_status_name(st));
    FZ_CHECK(strstr(ct_last_error(), "ct_load_npz") && strstr(ct_last_error(), path),
             "message names neither the function nor the file");
}

static void check_loaded(const ct_params *ps, size_t size) {
    size_t total = 0;
    for (int64_t i = 0; i < ct_params_count(ps); i++) {
        const char *name;
        ct_tensor *t = ct_params_get(ps, i, &name);
        FZ_CHECK(t && name && *name, "member %lld is empty", (long long)i);
        FZ_CHECK(ct_tensor_device(t).type == CT_DEVICE_CPU, "'%s' on another device", name);
        size_t nbytes = (size_t)ct_tensor_numel(t) * ct_dtype_size(ct_tensor_dtype(t));
        total += nbytes;
        if (ct_tensor_dtype(t) == CT_BOOL) {
            const unsigned char *b = ct_tensor_data_ptr(t);
            for (size_t k = 0; k < nbytes; k++) FZ_CHECK(b[k] <= 1, "'%s': bool byte %u", name, b[k]);
        }
    }
    FZ_CHECK(total <= size * 1032 + 4096 * (size_t)ct_params_count(ps),
             "%zu bytes of data from an archive of %zu", total, size);
}

static void check_same(const ct_params *a, const ct_params *b) {
    int64_t n = ct_params_count(a);
    FZ_CHECK(ct_params_count(b) == n, "%lld members, then %lld", (long long)n,
             (long long)ct_params_count(b));
    for (int64_t i = 0; i < n; i++) {
        const char *na, *nb;
        ct_tensor *ta = ct_params_get(a, i, &na), *tb = ct_params_get(b, i, &nb);
        FZ_CHECK(strcmp(na, nb) == 0, "member %lld: '%s' then '%s'", (long long)i, na, nb);
        int nd = ct_tensor_ndim(ta);
        FZ_CHECK(ct_tensor_dtype(ta) == ct_tensor_dtype(tb) && ct_tensor_ndim(tb) == nd,
                 "'%s' changed dtype or ndim", na);
        FZ_CHECK(memcmp(ct_tensor_shape(ta), ct_tensor_shape(tb), sizeof(int64_t) * (size_t)nd) ==
                     0,
                 "'%s' changed shape", na);
        size_t nbytes = (size_t)ct_tensor_numel(ta) * ct_dtype_size(ct_tensor_dtype(ta));
        FZ_CHECK(nbytes == 0 ||
                     memcmp(ct_tensor_data_ptr(ta), ct_tensor_data_ptr(tb), nbytes) == 0,
                 "'%s' changed its bytes", na);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fz_file(0, data, size);
    ct_clear_error();
    ct_params *p = ct_load_npz(path);
    if (!p) {
        check_refusal(path);
        return 0;
    }
    check_loaded(p, size);
    for (int compress = 0; compress < 2; compress++) {
        char out[128];
        snprintf(out, sizeof out, "%s/again.npz", fz_dir());
        FZ_CHECK(ct_save_npz(out, p, compress) == CT_OK, "a loaded list does not save: %s",
                 ct_last_error());
        ct_params *q = ct_load_npz(out);
        FZ_CHECK(q != NULL, "a saved list does not load (compress %d)", compress);
        check_same(p, q);
        ct_params_free(q);
    }
    ct_params_free(p);
    return 0;
}
