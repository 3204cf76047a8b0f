/* safetensors reading: the input is a whole file (8-byte length, header
 * JSON, data section) given to ct_load_safetensors. Whatever the bytes, the
 * load either fails with CT_ERR_FORMAT (or CT_ERR_OOM) and a message naming
 * the function and the file, or it succeeds with a list that keeps the
 * format's promises: unique names, contiguous CPU tensors, BOOL bytes 0 or 1,
 * metadata found by key. A successful load must also restore into itself
 * (ct_load_safetensors_into, strict) and survive a save and a second load
 * unchanged, byte for byte. */
#include <string.h>

#include "fuzz.h"

static void check_refusal(const char *op, const char *path, ct_metadata *meta) {
    ct_status st = ct_last_status();
    FZ_CHECK(st == CT_ERR_FORMAT || st == CT_ERR_OOM, "%s refused with %s", op,
             ct_status_name(st));
    FZ_CHECK(meta == NULL, "%s failed but returned metadata", op);
    FZ_CHECK(strstr(ct_last_error(), op) && strstr(ct_last_error(), path),
             "message names neither the function nor the file");
}

/* The same names, dtypes, shapes and bytes in the same order. */
static void check_same(const ct_params *a, const ct_params *b) {
    int64_t n = ct_params_count(a);
    FZ_CHECK(ct_params_count(b) == n, "%lld tensors, then %lld", (long long)n,
             (long long)ct_params_count(b));
    for (int64_t i = 0; i < n; i++) {
        const char *na, *nb;
        ct_tensor *ta = ct_params_get(a, i, &na), *tb = ct_params_get(b, i, &nb);
        FZ_CHECK(strcmp(na, nb) == 0, "entry %lld: '%s' then '%s'", (long long)i, na, nb);
        FZ_CHECK(ct_tensor_dtype(ta) == ct_tensor_dtype(tb), "'%s' changed dtype", na);
        FZ_CHECK(ct_tensor_ndim(ta) == ct_tensor_ndim(tb), "'%s' changed ndim", na);
        FZ_CHECK(memcmp(ct_tensor_shape(ta), ct_tensor_shape(tb),
                        sizeof(int64_t) * (size_t)ct_tensor_ndim(ta)) == 0,
                 "'%s' changed shape", na);
        size_t nbytes = (size_t)ct_tensor_numel(ta) * ct_dtype_size(ct_tensor_dtype(ta));
        FZ_CHECK(nbytes == 0 ||
                     memcmp(ct_tensor_data_ptr(ta), ct_tensor_data_ptr(tb), nbytes) == 0,
                 "'%s' changed its bytes", na);
    }
}

static void check_same_meta(const ct_metadata *a, const ct_metadata *b) {
    int64_t n = ct_metadata_count(a);
    FZ_CHECK(ct_metadata_count(b) == n, "%lld metadata keys, then %lld", (long long)n,
             (long long)ct_metadata_count(b));
    for (int64_t i = 0; i < n; i++) {
        const char *va, *vb;
        const char *ka = ct_metadata_at(a, i, &va), *kb = ct_metadata_at(b, i, &vb);
        FZ_CHECK(strcmp(ka, kb) == 0 && strcmp(va, vb) == 0, "metadata entry %lld changed",
                 (long long)i);
    }
}

static void check_loaded(const ct_params *ps, const ct_metadata *meta) {
    int64_t n = ct_params_count(ps);
    for (int64_t i = 0; i < n; i++) {
        const char *name;
        ct_tensor *t = ct_params_get(ps, i, &name);
        FZ_CHECK(t && name && *name, "entry %lld is empty", (long long)i);
        FZ_CHECK(ct_params_find(ps, name) == t, "'%s' is not found as itself", name);
        FZ_CHECK(ct_tensor_is_contiguous(t) && ct_tensor_device(t).type == CT_DEVICE_CPU,
                 "'%s' is not a contiguous CPU tensor", name);
        if (ct_tensor_dtype(t) == CT_BOOL) {
            const unsigned char *b = ct_tensor_data_ptr(t);
            for (int64_t k = 0; k < ct_tensor_numel(t); k++)
                FZ_CHECK(b[k] <= 1, "BOOL '%s' holds %u", name, b[k]);
        }
    }
    for (int64_t i = 0; i < ct_metadata_count(meta); i++) {
        const char *v;
        const char *k = ct_metadata_at(meta, i, &v);
        FZ_CHECK(k && *k && v && ct_metadata_get(meta, k) == v, "metadata key %lld", (long long)i);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char op[] = "ct_load_safetensors";
    const char *path = fz_file(0, data, size);
    ct_metadata *meta = NULL;
    ct_clear_error();
    ct_params *ps = ct_load_safetensors(path, &meta);
    if (!ps) {
        check_refusal(op, path, meta);
        return 0;
    }
    FZ_CHECK(meta != NULL, "a successful load gave no metadata list");
    check_loaded(ps, meta);

    ct_metadata *meta2 = NULL;
    ct_status st = ct_load_safetensors_into(path, ps, true, &meta2);
    FZ_CHECK(st == CT_OK, "restoring a file into its own tensors gave %s", ct_status_name(st));
    check_same_meta(meta, meta2);
    ct_metadata_free(meta2);

    char out[128];
    snprintf(out, sizeof out, "%s/rt.safetensors", fz_dir());
    st = ct_save_safetensors(out, ps, meta);
    FZ_CHECK(st == CT_OK, "saving what was loaded gave %s", ct_status_name(st));
    ct_metadata *meta3 = NULL;
    ct_params *again = ct_load_safetensors(out, &meta3);
    FZ_CHECK(again != NULL, "reloading a saved file failed");
    check_same(ps, again);
    check_same_meta(meta, meta3);
    ct_params_free(again);
    ct_metadata_free(meta3);
    ct_params_free(ps);
    ct_metadata_free(meta);
    return 0;
}
