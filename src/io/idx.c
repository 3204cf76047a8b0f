/* IDX files (LeCun's MNIST format), plain or gzip-compressed, read through
 * zlib in bounded chunks straight into the result tensor. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "io_impl.h"

static const char OP[] = "ct_idx_load";

/* Elements converted per chunk: small enough for the cache, large enough
 * that the per-call cost of gzread does not matter. */
#define CHUNK_ELEMS 65536
/* deflate never compresses better than 1032:1, so a gzip file of S bytes
 * cannot hold more than this many bytes (plus a few for tiny streams). */
#define DEFLATE_MAX_RATIO 1032
#define DEFLATE_SLACK 4096

typedef struct idx_type {
    unsigned char code;
    int size;
    bool floating;
    const char *name;
} idx_type;

static const idx_type IDX_TYPES[] = {
    {0x08, 1, false, "uint8"},  {0x09, 1, false, "int8"},     {0x0B, 2, false, "int16"},
    {0x0C, 4, false, "int32"},  {0x0D, 4, true, "float32"},   {0x0E, 8, true, "float64"},
};

static const idx_type *find_type(unsigned char code) {
    for (size_t i = 0; i < sizeof IDX_TYPES / sizeof IDX_TYPES[0]; i++)
        if (IDX_TYPES[i].code == code) return &IDX_TYPES[i];
    return NULL;
}

/* The status and message for a read that failed or came up short. */
static ct_status read_error(gzFile gz, const char *path, const char *where) {
    int err = Z_OK;
    const char *msg = gzerror(gz, &err);
    switch (err) {
    case Z_OK:
    case Z_BUF_ERROR: /* zlib's "unexpected end of file" inside a gzip stream */
        return cti_error(CT_ERR_FORMAT, "%s: '%s' is truncated: the file ends inside %s%s%s", OP,
                         path, where, err == Z_BUF_ERROR ? " (gzip: " : "",
                         err == Z_BUF_ERROR ? "unexpected end of the compressed stream)" : "");
    case Z_ERRNO:
        return cti_error(CT_ERR_IO, "%s: cannot read '%s': %s", OP, path, strerror(errno));
    case Z_MEM_ERROR:
        return cti_error(CT_ERR_OOM, "%s: out of memory decompressing '%s'", OP, path);
    default:
        return cti_error(CT_ERR_FORMAT, "%s: '%s': gzip data is corrupt (%s) while reading %s",
                         OP, path, msg, where);
    }
}

/* Reads exactly n bytes or reports why not. */
static ct_status read_exact(gzFile gz, void *buf, size_t n, const char *path, const char *where) {
    char *p = buf;
    while (n > 0) {
        unsigned want = n < (1u << 30) ? (unsigned)n : 1u << 30;
        int r = gzread(gz, p, want);
        if (r <= 0) return read_error(gz, path, where);
        p += r;
        n -= (size_t)r;
    }
    return CT_OK;
}

static uint32_t be32(const unsigned char *b) {
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

/* Big-endian elements of type t into doubles (every IDX value is exact in
 * a double). */
static void decode(const unsigned char *src, int64_t n, const idx_type *t, double *dst) {
    switch (t->code) {
    case 0x08:
        for (int64_t i = 0; i < n; i++) dst[i] = src[i];
        break;
    case 0x09:
        for (int64_t i = 0; i < n; i++) dst[i] = (int8_t)src[i];
        break;
    case 0x0B:
        for (int64_t i = 0; i < n; i++)
            dst[i] = (int16_t)(uint16_t)(src[2 * i] << 8 | src[2 * i + 1]);
        break;
    case 0x0C:
        for (int64_t i = 0; i < n; i++) dst[i] = (int32_t)be32(src + 4 * i);
        break;
    case 0x0D:
        for (int64_t i = 0; i < n; i++) {
            uint32_t u = be32(src + 4 * i);
            float f;
            memcpy(&f, &u, 4);
            dst[i] = f;
        }
        break;
    default: /* 0x0E */
        for (int64_t i = 0; i < n; i++) {
            uint64_t u = (uint64_t)be32(src + 8 * i) << 32 | be32(src + 8 * i + 4);
            double d;
            memcpy(&d, &u, 8);
            dst[i] = d;
        }
        break;
    }
}

static void store(const double *src, int64_t n, ct_dtype dt, void *out) {
    switch (dt) {
    case CT_BOOL: {
        uint8_t *o = out;
        for (int64_t i = 0; i < n; i++) o[i] = src[i] != 0.0;
        break;
    }
    case CT_I32: {
        int32_t *o = out;
        for (int64_t i = 0; i < n; i++) o[i] = (int32_t)src[i];
        break;
    }
    case CT_I64: {
        int64_t *o = out;
        for (int64_t i = 0; i < n; i++) o[i] = (int64_t)src[i];
        break;
    }
    case CT_F16: {
        uint16_t *o = out;
        for (int64_t i = 0; i < n; i++) o[i] = cti_f32_to_f16((float)src[i]);
        break;
    }
    case CT_BF16: {
        uint16_t *o = out;
        for (int64_t i = 0; i < n; i++) o[i] = cti_f32_to_bf16((float)src[i]);
        break;
    }
    case CT_F32: {
        float *o = out;
        for (int64_t i = 0; i < n; i++) o[i] = (float)src[i];
        break;
    }
    default: {
        double *o = out;
        for (int64_t i = 0; i < n; i++) o[i] = src[i];
        break;
    }
    }
}

typedef struct idx_header {
    const idx_type *type;
    int ndim;
    int64_t shape[CT_MAX_DIMS];
    int64_t data_bytes;
    int64_t header_bytes;
} idx_header;

static ct_status read_header(gzFile gz, const char *path, idx_header *h) {
    unsigned char magic[4];
    ct_status st = read_exact(gz, magic, 4, path, "the 4-byte magic number");
    if (st) return st;
    if (magic[0] != 0 || magic[1] != 0)
        return cti_error(CT_ERR_FORMAT,
                         "%s: '%s' is not an IDX file: wrong magic %02x %02x %02x %02x "
                         "(expected 00 00 <type> <ndims>)",
                         OP, path, magic[0], magic[1], magic[2], magic[3]);
    h->type = find_type(magic[2]);
    if (!h->type)
        return cti_error(CT_ERR_FORMAT,
                         "%s: '%s': unsupported element type 0x%02x (IDX types are 0x08 "
                         "uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64)",
                         OP, path, magic[2]);
    if (magic[3] > CT_MAX_DIMS)
        return cti_error(CT_ERR_FORMAT, "%s: '%s' declares %d dims; cten tensors have at most %d",
                         OP, path, magic[3], CT_MAX_DIMS);
    h->ndim = magic[3];
    unsigned char dims[4 * CT_MAX_DIMS];
    if ((st = read_exact(gz, dims, 4 * (size_t)h->ndim, path, "the dimension sizes")))
        return st;
    int64_t numel = 1;
    bool overflow = false;
    for (int d = 0; d < h->ndim; d++) {
        h->shape[d] = be32(dims + 4 * d);
        overflow |= h->shape[d] != 0 && numel > INT64_MAX / h->shape[d];
        if (!overflow) numel *= h->shape[d];
    }
    overflow |= numel > INT64_MAX / 8;
    if (overflow)
        return cti_error(CT_ERR_FORMAT, "%s: '%s': sizes %s overflow a 64-bit element count", OP,
                         path, cti_shape_s(h->ndim, h->shape));
    h->data_bytes = numel * h->type->size;
    h->header_bytes = 4 + 4 * (int64_t)h->ndim;
    return CT_OK;
}

/* Refuses a header whose data cannot be in a file of this size, before
 * anything of that size is allocated. */
static ct_status check_plausible(gzFile gz, const char *path, const idx_header *h,
                                 int64_t file_size) {
    const char *shape = cti_shape_s(h->ndim, h->shape);
    if (gzdirect(gz)) {
        int64_t have = file_size - h->header_bytes;
        if (have < h->data_bytes)
            return cti_error(CT_ERR_FORMAT,
                             "%s: '%s' is truncated: sizes %s of %s need %lld bytes of data, "
                             "the file holds %lld",
                             OP, path, shape, h->type->name, (long long)h->data_bytes,
                             (long long)have);
        if (have > h->data_bytes)
            return cti_error(CT_ERR_FORMAT,
                             "%s: '%s' has %lld trailing bytes after the %lld bytes of data "
                             "that sizes %s of %s need",
                             OP, path, (long long)(have - h->data_bytes),
                             (long long)h->data_bytes, shape, h->type->name);
        return CT_OK;
    }
    int64_t bound = file_size > (INT64_MAX - DEFLATE_SLACK) / DEFLATE_MAX_RATIO
                        ? INT64_MAX
                        : file_size * DEFLATE_MAX_RATIO + DEFLATE_SLACK;
    if (h->data_bytes > bound)
        return cti_error(CT_ERR_FORMAT,
                         "%s: '%s' is truncated: sizes %s of %s need %lld bytes of data, more "
                         "than a gzip file of %lld bytes can hold",
                         OP, path, shape, h->type->name, (long long)h->data_bytes,
                         (long long)file_size);
    return CT_OK;
}

/* Streams the data into out, converting chunk by chunk, then makes sure
 * nothing follows it (reading on also makes zlib check the gzip CRC). */
static ct_status read_data(gzFile gz, const char *path, const idx_header *h, ct_tensor *out) {
    int64_t numel = h->data_bytes / h->type->size;
    int64_t chunk = numel < CHUNK_ELEMS ? numel : CHUNK_ELEMS;
    unsigned char *raw = malloc((size_t)(chunk > 0 ? chunk : 1) * (size_t)h->type->size);
    double *vals = malloc((size_t)(chunk > 0 ? chunk : 1) * sizeof(double));
    ct_status st = CT_OK;
    if (!raw || !vals) {
        st = cti_error(CT_ERR_OOM, "%s: out of memory reading '%s'", OP, path);
        goto done;
    }
    char *dst = cti_data(out);
    size_t esize = ct_dtype_size(out->dtype);
    for (int64_t i = 0; i < numel; i += chunk) {
        int64_t n = numel - i < chunk ? numel - i : chunk;
        if ((st = read_exact(gz, raw, (size_t)n * (size_t)h->type->size, path, "the data")))
            goto done;
        decode(raw, n, h->type, vals);
        store(vals, n, out->dtype, dst + (size_t)i * esize);
    }
    unsigned char extra;
    int r = gzread(gz, &extra, 1);
    if (r > 0) {
        st = cti_error(CT_ERR_FORMAT,
                       "%s: '%s' has trailing bytes after the %lld bytes of data that sizes %s "
                       "of %s need",
                       OP, path, (long long)h->data_bytes, cti_shape_s(h->ndim, h->shape),
                       h->type->name);
    } else {
        int err = Z_OK;
        gzerror(gz, &err);
        if (r < 0 || (err != Z_OK && err != Z_BUF_ERROR)) st = read_error(gz, path, "the data");
        else if (err == Z_BUF_ERROR) st = read_error(gz, path, "the gzip trailer");
    }
done:
    free(raw);
    free(vals);
    return st;
}

ct_tensor *ct_idx_load(const char *path, ct_dtype dtype) {
    if (!path) return cti_error_null(CT_ERR_INVALID_ARG, "%s: path is NULL", OP);
    if ((int)dtype < 0 || dtype >= CT_NUM_DTYPES)
        return cti_error_null(CT_ERR_DTYPE, "%s: invalid dtype %d", OP, (int)dtype);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return cti_error_null(CT_ERR_IO, "%s: cannot open '%s': %s", OP, path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return cti_error_null(CT_ERR_IO, "%s: cannot stat '%s': %s", OP, path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return cti_error_null(CT_ERR_IO, "%s: '%s' is not a regular file", OP, path);
    }
    gzFile gz = gzdopen(fd, "rb");
    if (!gz) {
        close(fd);
        return cti_error_null(CT_ERR_OOM, "%s: out of memory opening '%s'", OP, path);
    }
    gzbuffer(gz, 1u << 18);
    ct_tensor *out = NULL;
    idx_header h;
    ct_status st = read_header(gz, path, &h);
    if (!st) st = check_plausible(gz, path, &h, (int64_t)sb.st_size);
    if (!st && h.type->floating && !ct_dtype_is_floating(dtype))
        st = cti_error(CT_ERR_DTYPE,
                       "%s: '%s' holds %s values; converting them to %s would truncate them "
                       "(load as a floating dtype)",
                       OP, path, h.type->name, ct_dtype_name(dtype));
    if (!st && !(out = cti_tensor_new(OP, h.ndim, h.shape, dtype, CT_CPU))) st = ct_last_status();
    if (!st && (st = read_data(gz, path, &h, out))) {
        ct_tensor_release(out);
        out = NULL;
    }
    gzclose_r(gz);
    return out;
}
