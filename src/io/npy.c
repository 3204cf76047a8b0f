/* NumPy's .npy files: the header (a Python dict literal) parsed by a strict
 * little parser and validated against the file's size before a byte of
 * data is allocated; data read straight into the tensor and byte-swapped
 * there when the file is big-endian. Written as numpy.save writes them. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io_impl.h"

static const char MAGIC[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};
/* numpy.load refuses headers above 10000 bytes unless told otherwise; cten
 * allows more, but never what a corrupt length field claims. */
#define MAX_HEADER_BYTES (1 << 20)
/* numpy.save pads the header so the data starts at a multiple of this. */
#define ALIGN 64

/* The descr of each cten dtype as numpy.save writes it: bfloat16 has no
 * NumPy type of its own, and ml_dtypes' bfloat16 arrays save as '<V2'. */
static const struct {
    char kind;
    int size;
    ct_dtype dtype;
    const char *descr;
} KINDS[] = {
    {'b', 1, CT_BOOL, "|b1"}, {'i', 4, CT_I32, "<i4"}, {'i', 8, CT_I64, "<i8"},
    {'f', 2, CT_F16, "<f2"},  {'V', 2, CT_BF16, "<V2"}, {'f', 4, CT_F32, "<f4"},
    {'f', 8, CT_F64, "<f8"},
};
#define NUM_KINDS (sizeof KINDS / sizeof KINDS[0])
#define KNOWN_DESCRS "b1, i4, i8, f2, f4, f8, and V2 as bfloat16"

/* ---- the header ---------------------------------------------------------------------------- */

typedef struct npy_header {
    ct_dtype dtype;
    bool swap; /* big-endian data */
    bool fortran;
    int ndim;
    int64_t shape[CT_MAX_DIMS];
} npy_header;

typedef struct hparser {
    const char *p, *begin, *end;
    char err[200];
} hparser;

static bool fail(hparser *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(hparser *h, const char *fmt, ...) {
    int n = snprintf(h->err, sizeof h->err, "at byte %td of the header: ", h->p - h->begin);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h->err + n, sizeof h->err - (size_t)n, fmt, ap);
    va_end(ap);
    return false;
}

static void skip_ws(hparser *h) {
    while (h->p < h->end && (*h->p == ' ' || *h->p == '\t' || *h->p == '\n' || *h->p == '\r'))
        h->p++;
}

static bool accept(hparser *h, char c) {
    skip_ws(h);
    if (h->p < h->end && *h->p == c) {
        h->p++;
        return true;
    }
    return false;
}

static bool expect(hparser *h, char c, const char *what) {
    if (accept(h, c)) return true;
    if (h->p == h->end) return fail(h, "the header ends where %s was expected", what);
    unsigned char b = (unsigned char)*h->p;
    return b >= 0x20 && b < 0x7f ? fail(h, "expected %s, found '%c'", what, b)
                                 : fail(h, "expected %s, found byte 0x%02x", what, b);
}

/* A quoted string of printable ASCII without escapes (no key or descr
 * numpy writes has any) into out (at most n - 1 bytes). */
static bool string(hparser *h, char *out, size_t n) {
    skip_ws(h);
    if (h->p == h->end || (*h->p != '\'' && *h->p != '"')) return expect(h, '\'', "a string");
    char q = *h->p++;
    size_t len = 0;
    while (h->p < h->end && *h->p != q) {
        unsigned char c = (unsigned char)*h->p;
        if (c < 0x20 || c >= 0x7f || c == '\\')
            return fail(h, "byte 0x%02x in a string (expected printable ASCII, no escapes)", c);
        if (len + 1 >= n) return fail(h, "string longer than %zu bytes", n - 1);
        out[len++] = (char)c;
        h->p++;
    }
    if (h->p == h->end) return fail(h, "unterminated string");
    h->p++;
    out[len] = '\0';
    return true;
}

static bool word(hparser *h, const char *w) {
    skip_ws(h);
    size_t n = strlen(w);
    if ((size_t)(h->end - h->p) < n || memcmp(h->p, w, n) != 0) return false;
    h->p += n;
    return true;
}

static bool parse_descr(hparser *h, npy_header *o) {
    skip_ws(h);
    if (h->p < h->end && *h->p == '[')
        return fail(h, "structured dtypes (a list of fields) are not supported");
    char d[32];
    if (!string(h, d, sizeof d)) return false;
    const char *s = d;
    char order = strchr("<>|=", *s) && *s ? *s++ : '=';
    char kind = *s ? *s++ : '\0';
    int size = 0;
    while (*s >= '0' && *s <= '9' && size < 1000) size = size * 10 + (*s++ - '0');
    for (size_t i = 0; !*s && i < NUM_KINDS; i++) {
        if (KINDS[i].kind != kind || KINDS[i].size != size) continue;
        if (order == '|' && size > 1 && kind != 'V')
            return fail(h, "descr '%s' gives no byte order for a %d-byte type", d, size);
        if (order == '>' && kind == 'V')
            return fail(h, "descr '%s': cten reads V2 as little-endian bfloat16 ('<V2' or '|V2')",
                        d);
        o->dtype = KINDS[i].dtype;
        o->swap = order == '>' && size > 1;
        return true;
    }
    return fail(h, "descr '%s' is not a dtype cten has (it reads " KNOWN_DESCRS ")", d);
}

static bool parse_bool(hparser *h, bool *out) {
    if (word(h, "True")) *out = true;
    else if (word(h, "False")) *out = false;
    else return fail(h, "fortran_order is not True or False");
    return true;
}

/* A non-negative integer (Python 2's "L" suffix allowed) up to INT64_MAX. */
static bool parse_int(hparser *h, int64_t *out) {
    skip_ws(h);
    if (h->p == h->end || *h->p < '0' || *h->p > '9') return expect(h, '0', "a size");
    int64_t v = 0;
    while (h->p < h->end && *h->p >= '0' && *h->p <= '9') {
        int dgt = *h->p++ - '0';
        if (v > (INT64_MAX - dgt) / 10) return fail(h, "size exceeds %lld", (long long)INT64_MAX);
        v = v * 10 + dgt;
    }
    if (h->p < h->end && *h->p == 'L') h->p++;
    *out = v;
    return true;
}

/* A tuple as Python writes it: (), (3,), (2, 3) with an optional comma at
 * the end; (3) is an int in Python, and numpy refuses it too. */
static bool parse_shape(hparser *h, npy_header *o) {
    if (!expect(h, '(', "'(' opening the shape")) return false;
    o->ndim = 0;
    if (accept(h, ')')) return true;
    bool comma = false;
    do {
        if (o->ndim == CT_MAX_DIMS)
            return fail(h, "shape has more than %d dims (cten's limit)", CT_MAX_DIMS);
        if (!parse_int(h, &o->shape[o->ndim++])) return false;
        comma = accept(h, ',');
        skip_ws(h);
    } while (comma && !(h->p < h->end && *h->p == ')'));
    if (o->ndim == 1 && !comma && h->p < h->end && *h->p == ')')
        return fail(h, "shape (n) is not a tuple (expected (n,))");
    return expect(h, ')', "',' or ')' in the shape");
}

/* {'descr': ..., 'fortran_order': ..., 'shape': (...)}, each key once and
 * nothing else, as numpy.load requires. */
static bool parse_header(hparser *h, npy_header *o) {
    static const char *const keys[3] = {"descr", "fortran_order", "shape"};
    bool have[3] = {false, false, false};
    if (!expect(h, '{', "'{' opening the header")) return false;
    while (!accept(h, '}')) {
        char key[32];
        if (!string(h, key, sizeof key)) return false;
        int k = 0;
        while (k < 3 && strcmp(key, keys[k]) != 0) k++;
        if (k == 3) return fail(h, "unknown key '%s' (expected descr, fortran_order, shape)", key);
        if (have[k]) return fail(h, "duplicate key '%s'", key);
        have[k] = true;
        if (!expect(h, ':', "':' after a key")) return false;
        bool ok = k == 0 ? parse_descr(h, o) : k == 1 ? parse_bool(h, &o->fortran)
                                                      : parse_shape(h, o);
        if (!ok) return false;
        if (!accept(h, ',')) {
            if (!expect(h, '}', "',' or '}' after a value")) return false;
            break;
        }
    }
    for (int k = 0; k < 3; k++)
        if (!have[k]) return fail(h, "missing key '%s'", keys[k]);
    skip_ws(h);
    if (h->p != h->end) return fail(h, "text after the closing '}'");
    return true;
}

/* ---- reading ------------------------------------------------------------------------------- */

static ct_status read_exact(const char *op, const char *where, cti_npy_source src, void *buf,
                            size_t n, const char *what) {
    size_t got = 0;
    ct_status st = src.read(src.ctx, buf, n, &got);
    if (st) return st;
    if (got < n)
        return cti_error(CT_ERR_FORMAT, "%s: %s is truncated: it ends inside %s", op, where, what);
    return CT_OK;
}

/* The magic, version and header length; *prefix receives the bytes before
 * the header text. */
static ct_status read_preamble(const char *op, const char *where, int64_t size,
                               cti_npy_source src, uint32_t *hlen, int *prefix) {
    unsigned char b[12];
    if (size < 10)
        return cti_error(CT_ERR_FORMAT,
                         "%s: %s is too short (%lld bytes) to be a .npy file (expected at least "
                         "the 10-byte preamble)",
                         op, where, (long long)size);
    ct_status st = read_exact(op, where, src, b, 8, "the preamble");
    if (st) return st;
    if (memcmp(b, MAGIC, 6) != 0)
        return cti_error(CT_ERR_FORMAT,
                         "%s: %s is not a .npy file: wrong magic (expected \\x93NUMPY)", op, where);
    if ((b[6] != 1 && b[6] != 2 && b[6] != 3) || b[7] != 0)
        return cti_error(CT_ERR_FORMAT,
                         "%s: %s: unsupported .npy version %u.%u (expected 1.0, 2.0 or 3.0)", op,
                         where, b[6], b[7]);
    *prefix = b[6] == 1 ? 10 : 12;
    if (size < *prefix)
        return cti_error(CT_ERR_FORMAT, "%s: %s is truncated: it ends inside the header length",
                         op, where);
    if ((st = read_exact(op, where, src, b + 8, (size_t)*prefix - 8, "the header length")))
        return st;
    *hlen = b[6] == 1 ? (uint32_t)(b[8] | b[9] << 8)
                      : (uint32_t)b[8] | (uint32_t)b[9] << 8 | (uint32_t)b[10] << 16 |
                            (uint32_t)b[11] << 24;
    if (*hlen > size - *prefix)
        return cti_error(CT_ERR_FORMAT,
                         "%s: %s: header length %u exceeds the %lld bytes after it (truncated?)",
                         op, where, *hlen, (long long)(size - *prefix));
    if (*hlen > MAX_HEADER_BYTES)
        return cti_error(CT_ERR_FORMAT, "%s: %s: header length %u exceeds the limit of %d", op,
                         where, *hlen, MAX_HEADER_BYTES);
    return CT_OK;
}

static ct_status read_header(const char *op, const char *where, int64_t size, cti_npy_source src,
                             npy_header *o, int64_t *data_bytes) {
    uint32_t hlen = 0;
    int prefix = 0;
    ct_status st = read_preamble(op, where, size, src, &hlen, &prefix);
    if (st) return st;
    char *text = malloc(hlen ? hlen : 1);
    if (!text) return cti_error(CT_ERR_OOM, "%s: out of memory reading %s", op, where);
    if ((st = read_exact(op, where, src, text, hlen, "the header"))) {
        free(text);
        return st;
    }
    hparser h = {text, text, text + hlen, ""};
    memset(o, 0, sizeof *o);
    bool ok = parse_header(&h, o);
    free(text);
    if (!ok) return cti_error(CT_ERR_FORMAT, "%s: %s: malformed header: %s", op, where, h.err);
    int64_t numel = 1;
    bool overflow = false;
    for (int d = 0; d < o->ndim; d++) {
        overflow |= o->shape[d] != 0 && numel > INT64_MAX / o->shape[d];
        if (!overflow) numel *= o->shape[d];
    }
    int64_t es = (int64_t)ct_dtype_size(o->dtype);
    if (overflow || numel > INT64_MAX / es)
        return cti_error(CT_ERR_FORMAT, "%s: %s: shape %s of %s overflows", op, where,
                         cti_shape_s(o->ndim, o->shape), ct_dtype_name(o->dtype));
    *data_bytes = numel * es;
    int64_t have = size - prefix - (int64_t)hlen;
    if (have < *data_bytes)
        return cti_error(CT_ERR_FORMAT,
                         "%s: %s is truncated: shape %s of %s needs %lld bytes of data, it holds "
                         "%lld",
                         op, where, cti_shape_s(o->ndim, o->shape), ct_dtype_name(o->dtype),
                         (long long)*data_bytes, (long long)have);
    if (have > *data_bytes)
        return cti_error(CT_ERR_FORMAT,
                         "%s: %s has %lld trailing bytes after the %lld bytes of data that shape "
                         "%s of %s needs",
                         op, where, (long long)(have - *data_bytes), (long long)*data_bytes,
                         cti_shape_s(o->ndim, o->shape), ct_dtype_name(o->dtype));
    return CT_OK;
}

static void byteswap(void *p, int64_t n, size_t es) {
    if (es == 2) {
        uint16_t *q = p;
        for (int64_t i = 0; i < n; i++) q[i] = __builtin_bswap16(q[i]);
    } else if (es == 4) {
        uint32_t *q = p;
        for (int64_t i = 0; i < n; i++) q[i] = __builtin_bswap32(q[i]);
    } else if (es == 8) {
        uint64_t *q = p;
        for (int64_t i = 0; i < n; i++) q[i] = __builtin_bswap64(q[i]);
    }
}

static ct_status check_bools(const char *op, const char *where, const unsigned char *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (b[i] > 1)
            return cti_error(CT_ERR_FORMAT,
                             "%s: %s: bool element %zu holds byte %u (expected 0 or 1)", op,
                             where, i, b[i]);
    return CT_OK;
}

ct_tensor *cti_npy_read(const char *op, const char *where, int64_t size, cti_npy_source src) {
    npy_header h;
    int64_t nbytes = 0;
    if (read_header(op, where, size, src, &h, &nbytes)) return NULL;
    /* Fortran order is the row-major layout of the reversed shape. */
    int64_t shape[CT_MAX_DIMS];
    for (int d = 0; d < h.ndim; d++) shape[d] = h.fortran ? h.shape[h.ndim - 1 - d] : h.shape[d];
    ct_tensor *t = cti_tensor_new(op, h.ndim, shape, h.dtype, CT_CPU);
    if (!t) return NULL;
    ct_status st = nbytes ? read_exact(op, where, src, cti_data(t), (size_t)nbytes, "the data")
                          : CT_OK;
    if (!st && h.swap) byteswap(cti_data(t), nbytes / (int64_t)ct_dtype_size(h.dtype),
                                ct_dtype_size(h.dtype));
    if (!st && h.dtype == CT_BOOL)
        st = check_bools(op, where, (const unsigned char *)cti_data(t), (size_t)nbytes);
    if (!st && h.fortran && h.ndim > 1) {
        int64_t rev[CT_MAX_DIMS];
        for (int d = 0; d < h.ndim; d++) rev[d] = h.ndim - 1 - d;
        ct_tensor *v = cti_permute(t, h.ndim, rev);
        ct_tensor_release(t);
        return v;
    }
    if (st) {
        ct_tensor_release(t);
        return NULL;
    }
    return t;
}

typedef struct fd_source {
    int fd;
    const char *op, *path;
} fd_source;

static ct_status fd_read(void *ctx, void *buf, size_t n, size_t *got) {
    fd_source *s = ctx;
    if (!cti_read_full(s->fd, buf, n, got))
        return cti_error(CT_ERR_IO, "%s: cannot read '%s': %s", s->op, s->path, strerror(errno));
    return CT_OK;
}

ct_tensor *ct_load_npy(const char *path) {
    static const char op[] = "ct_load_npy";
    if (!path) return cti_error_null(CT_ERR_INVALID_ARG, "%s: path is NULL", op);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return cti_error_null(CT_ERR_IO, "%s: cannot open '%s': %s", op, path, strerror(errno));
    struct stat sb;
    ct_tensor *t = NULL;
    if (fstat(fd, &sb) != 0) {
        cti_error(CT_ERR_IO, "%s: cannot stat '%s': %s", op, path, strerror(errno));
    } else if (!S_ISREG(sb.st_mode)) {
        cti_error(CT_ERR_IO, "%s: '%s' is not a regular file", op, path);
    } else {
        char where[4096 + 8];
        snprintf(where, sizeof where, "'%s'", path);
        fd_source s = {fd, op, path};
        t = cti_npy_read(op, where, (int64_t)sb.st_size, (cti_npy_source){fd_read, &s});
    }
    close(fd);
    return t;
}

/* ---- writing ------------------------------------------------------------------------------- */

/* Column-major: t's transpose is row-major (sizes 0 and 1 aside). */
static bool is_fortran(const ct_tensor *t) {
    int64_t expect_stride = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 0) return true;
        if (t->shape[d] != 1 && t->stride[d] != expect_stride) return false;
        expect_stride *= t->shape[d];
    }
    return true;
}

static const char *descr_of(ct_dtype dt) {
    for (size_t i = 0; i < NUM_KINDS; i++)
        if (KINDS[i].dtype == dt) return KINDS[i].descr;
    return "?";
}

/* The header as numpy.save writes it (version 1.0, padded with spaces and
 * a newline so the data starts at a multiple of ALIGN). */
static void build_header(cti_npy_out *o, const ct_tensor *t, bool fortran) {
    char dict[200];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': %s, 'shape': (",
                     descr_of(t->dtype), fortran ? "True" : "False");
    for (int d = 0; d < t->ndim; d++)
        n += snprintf(dict + n, sizeof dict - (size_t)n, d ? ", %lld" : "%lld",
                      (long long)t->shape[d]);
    n += snprintf(dict + n, sizeof dict - (size_t)n, "%s), }", t->ndim == 1 ? "," : "");
    size_t total = (10 + (size_t)n + 1 + ALIGN - 1) / ALIGN * ALIGN;
    size_t hlen = total - 10;
    memcpy(o->header, MAGIC, 6);
    o->header[6] = 1;
    o->header[7] = 0;
    o->header[8] = (char)(hlen & 0xff);
    o->header[9] = (char)(hlen >> 8);
    memcpy(o->header + 10, dict, (size_t)n);
    memset(o->header + 10 + n, ' ', hlen - (size_t)n - 1);
    o->header[total - 1] = '\n';
    o->header_len = total;
}

ct_status cti_npy_prepare(const char *op, ct_tensor *t, cti_npy_out *o) {
    memset(o, 0, sizeof *o);
    size_t nbytes;
    if (!cti_checked_nbytes(op, t->ndim, t->shape, t->dtype, &nbytes)) return ct_last_status();
    bool cpu = t->storage->device.type == CT_DEVICE_CPU;
    bool c_order = cti_is_contiguous(t);
    bool fortran = cpu && !c_order && is_fortran(t);
    build_header(o, t, fortran);
    o->nbytes = nbytes;
    if (cpu && (c_order || fortran)) {
        o->data = cti_data(t);
        return CT_OK;
    }
    if (!(o->staged = malloc(nbytes ? nbytes : 1)))
        return cti_error(CT_ERR_OOM, "%s: out of memory staging %s", op, cti_desc(t));
    ct_status st = ct_tensor_copy_to_host(t, o->staged, nbytes);
    if (st) {
        cti_npy_out_free(o);
        return st;
    }
    o->data = o->staged;
    return CT_OK;
}

void cti_npy_out_free(cti_npy_out *o) {
    free(o->staged);
    o->staged = NULL;
}

ct_status ct_save_npy(const char *path, ct_tensor *t) {
    static const char op[] = "ct_save_npy";
    if (!path || !*path) return cti_error(CT_ERR_INVALID_ARG, "%s: path is NULL or empty", op);
    if (!t) return cti_error(CT_ERR_INVALID_ARG, "%s: tensor is NULL", op);
    cti_npy_out o;
    ct_status st = cti_npy_prepare(op, t, &o);
    if (st) return st;
    cti_tmp_sweep(path);
    char *tmp;
    int fd;
    if (!(st = cti_tmp_create(op, path, &tmp, &fd))) {
        if (!cti_write_full(fd, o.header, o.header_len) || !cti_write_full(fd, o.data, o.nbytes))
            st = cti_error(CT_ERR_IO, "%s: cannot write '%s': %s", op, tmp, strerror(errno));
        st = cti_tmp_commit(op, path, tmp, fd, st);
    }
    cti_npy_out_free(&o);
    return st;
}
