/* IDX reading: the input is a whole file given to ct_idx_load, plain or
 * (starting with the gzip magic) compressed. The dtype asked for is picked
 * from the input's length, so every conversion is reached. A plain input is
 * also compressed here and loaded again: the two paths must agree, a tensor
 * from both with the same shape and bytes, or a refusal from both, since
 * compression changes how a file is read but not what it holds. */
#include <string.h>
#include <zlib.h>

#include "fuzz.h"

static const ct_dtype DTYPES[] = {CT_F32, CT_F64, CT_I64, CT_I32, CT_F16, CT_BF16, CT_BOOL};

static void check_refusal(const char *path, ct_dtype dt) {
    ct_status st = ct_last_status();
    FZ_CHECK(st == CT_ERR_FORMAT || st == CT_ERR_OOM ||
                 (st == CT_ERR_DTYPE && !ct_dtype_is_floating(dt)),
             "ct_idx_load refused with %s", ct_status_name(st));
    FZ_CHECK(strstr(ct_last_error(), "ct_idx_load") && strstr(ct_last_error(), path),
             "message names neither the function nor the file");
}

/* A gzip stream of data (caller frees), or NULL when zlib fails. */
static unsigned char *gzip(const uint8_t *data, size_t size, size_t *out_len) {
    z_stream z;
    memset(&z, 0, sizeof z);
    if (deflateInit2(&z, 1, Z_DEFLATED, 16 + 15, 8, Z_DEFAULT_STRATEGY) != Z_OK) return NULL;
    size_t cap = deflateBound(&z, (uLong)size) + 32;
    unsigned char *out = malloc(cap);
    if (!out) {
        deflateEnd(&z);
        return NULL;
    }
    z.next_in = (Bytef *)(uintptr_t)data;
    z.avail_in = (uInt)size;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    int r = deflate(&z, Z_FINISH);
    *out_len = z.total_out;
    deflateEnd(&z);
    if (r != Z_STREAM_END) {
        free(out);
        return NULL;
    }
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ct_dtype dt = DTYPES[size % (sizeof DTYPES / sizeof DTYPES[0])];
    const char *path = fz_file(0, data, size);
    ct_clear_error();
    ct_tensor *t = ct_idx_load(path, dt);
    if (!t) check_refusal(path, dt);
    else
        FZ_CHECK(ct_tensor_dtype(t) == dt && ct_tensor_is_contiguous(t),
                 "loaded a %s tensor when %s was asked for", ct_dtype_name(ct_tensor_dtype(t)),
                 ct_dtype_name(dt));

    bool zipped = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
    size_t zlen = 0;
    unsigned char *z = zipped || size > (1u << 20) ? NULL : gzip(data, size, &zlen);
    if (z) {
        const char *zpath = fz_file(1, z, zlen);
        ct_tensor *u = ct_idx_load(zpath, dt);
        if (!u) check_refusal(zpath, dt);
        FZ_CHECK(!t == !u, "plain: %s, gzip: %s", t ? "loaded" : "refused",
                 u ? "loaded" : "refused");
        if (t && u) {
            int nd = ct_tensor_ndim(t);
            FZ_CHECK(nd == ct_tensor_ndim(u) && memcmp(ct_tensor_shape(t), ct_tensor_shape(u),
                                                       sizeof(int64_t) * (size_t)nd) == 0,
                     "plain and gzip shapes differ");
            size_t nbytes = (size_t)ct_tensor_numel(t) * ct_dtype_size(dt);
            FZ_CHECK(nbytes == 0 ||
                         memcmp(ct_tensor_data_ptr(t), ct_tensor_data_ptr(u), nbytes) == 0,
                     "plain and gzip values differ");
        }
        ct_tensor_release(u);
        free(z);
    }
    ct_tensor_release(t);
    return 0;
}
