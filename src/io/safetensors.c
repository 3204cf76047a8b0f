/* safetensors checkpoints: atomic writes, and reads that validate the whole
 * header against the file before a byte of tensor data is allocated. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/hashmap.h"
#include "io_impl.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

/* A header longer than this is refused as the reference implementation does. */
#define MAX_HEADER_BYTES ((int64_t)100 * 1000 * 1000)
#define METADATA_KEY "__metadata__"

static const struct {
    const char *name;
    ct_dtype dtype;
} DTYPES[] = {
    {"BOOL", CT_BOOL}, {"I32", CT_I32}, {"I64", CT_I64},  {"F16", CT_F16},
    {"BF16", CT_BF16}, {"F32", CT_F32}, {"F64", CT_F64},
};
#define NUM_DTYPES (sizeof DTYPES / sizeof DTYPES[0])

static const char *st_dtype_name(ct_dtype dt) {
    for (size_t i = 0; i < NUM_DTYPES; i++)
        if (DTYPES[i].dtype == dt) return DTYPES[i].name;
    return "?";
}

/* ---- metadata lists ------------------------------------------------------------------------ */

struct ct_metadata {
    int64_t n, cap;
    char **keys, **values; /* owned copies */
    cti_hmap index;        /* key -> position */
};

/* An empty list, or NULL (no error set) when out of memory. */
static ct_metadata *meta_alloc(void) {
    ct_metadata *m = calloc(1, sizeof *m);
    if (m) cti_hmap_init(&m->index, CTI_HMAP_STR);
    return m;
}

ct_metadata *ct_metadata_new(void) {
    ct_metadata *m = meta_alloc();
    if (!m) return cti_error_null(CT_ERR_OOM, "ct_metadata_new: out of memory");
    return m;
}

void ct_metadata_free(ct_metadata *m) {
    if (!m) return;
    for (int64_t i = 0; i < m->n; i++) {
        free(m->keys[i]);
        free(m->values[i]);
    }
    free(m->keys);
    free(m->values);
    cti_hmap_clear(&m->index);
    free(m);
}

/* Appends (key, value) for a key not in m, taking ownership of both; false
 * on OOM (both freed). */
static bool meta_append(ct_metadata *m, char *key, char *value) {
    bool room = cti_hmap_reserve(&m->index, (size_t)m->n + 1);
    if (room && m->n == m->cap) {
        room = m->cap <= INT64_MAX / 2 && (uint64_t)m->cap * 2 <= SIZE_MAX / sizeof(char *);
    }
    if (!room) {
        free(key);
        free(value);
        return false;
    }
    if (m->n == m->cap) {
        int64_t cap = m->cap ? m->cap * 2 : 8;
        char **k = realloc(m->keys, (size_t)cap * sizeof *k);
        if (k) m->keys = k;
        char **v = k ? realloc(m->values, (size_t)cap * sizeof *v) : NULL;
        if (v) m->values = v;
        if (!k || !v) {
            free(key);
            free(value);
            return false;
        }
        m->cap = cap;
    }
    /* Reserved above, so this cannot fail. */
    cti_hmap_put(&m->index, key, m->n);
    m->keys[m->n] = key;
    m->values[m->n] = value;
    m->n++;
    return true;
}

static int64_t meta_find(const ct_metadata *m, const char *key) {
    return cti_hmap_get(&m->index, key);
}

ct_status ct_metadata_set(ct_metadata *m, const char *key, const char *value) {
    static const char op[] = "ct_metadata_set";
    if (!m) return cti_error(CT_ERR_INVALID_ARG, "%s: metadata list is NULL", op);
    if (!key || !*key) return cti_error(CT_ERR_INVALID_ARG, "%s: key is NULL or empty", op);
    if (!value) return cti_error(CT_ERR_INVALID_ARG, "%s: value of '%s' is NULL", op, key);
    if (!cti_utf8_valid(key, strlen(key)))
        return cti_error(CT_ERR_INVALID_ARG, "%s: key is not valid UTF-8", op);
    if (!cti_utf8_valid(value, strlen(value)))
        return cti_error(CT_ERR_INVALID_ARG, "%s: value of '%s' is not valid UTF-8", op, key);
    char *v = strdup(value);
    if (!v) return cti_error(CT_ERR_OOM, "%s: out of memory", op);
    int64_t i = meta_find(m, key);
    if (i >= 0) {
        free(m->values[i]);
        m->values[i] = v;
        return CT_OK;
    }
    char *k = strdup(key);
    if (!k) {
        free(v);
        return cti_error(CT_ERR_OOM, "%s: out of memory", op);
    }
    if (!meta_append(m, k, v)) return cti_error(CT_ERR_OOM, "%s: out of memory", op);
    return CT_OK;
}

const char *ct_metadata_get(const ct_metadata *m, const char *key) {
    if (!m || !key) return NULL;
    int64_t i = meta_find(m, key);
    return i >= 0 ? m->values[i] : NULL;
}

int64_t ct_metadata_count(const ct_metadata *m) { return m ? m->n : 0; }

const char *ct_metadata_at(const ct_metadata *m, int64_t index, const char **value) {
    if (!m) return cti_error_null(CT_ERR_INVALID_ARG, "ct_metadata_at: metadata list is NULL");
    if (index < 0 || index >= m->n)
        return cti_error_null(CT_ERR_INDEX,
                              "ct_metadata_at: index %lld is out of range for a list of %lld",
                              (long long)index, (long long)m->n);
    if (value) *value = m->values[index];
    return m->keys[index];
}

/* ---- the header --------------------------------------------------------------------------- */

typedef struct st_entry {
    char *name;
    ct_dtype dtype;
    int ndim;
    int64_t shape[CT_MAX_DIMS];
    int64_t begin, end;
} st_entry;

typedef struct st_header {
    st_entry *e;
    int64_t n, cap;
    ct_metadata *meta;
    cti_hmap by_name;   /* entry name -> index */
    int64_t *by_offset; /* entry indices sorted by (begin, end) */
} st_header;

static void header_free(st_header *h) {
    for (int64_t i = 0; i < h->n; i++) free(h->e[i].name);
    free(h->e);
    ct_metadata_free(h->meta);
    cti_hmap_clear(&h->by_name);
    free(h->by_offset);
    memset(h, 0, sizeof *h);
    cti_hmap_init(&h->by_name, CTI_HMAP_STR);
}

typedef struct parser {
    cti_json j;
    bool oom;
    char where[96]; /* the part being parsed, for messages */
} parser;

static bool oom(parser *p) {
    p->oom = true;
    return cti_json_fail(&p->j, "out of memory");
}

static void set_where(parser *p, const char *what, const char *name) {
    snprintf(p->where, sizeof p->where, "%s '%s'", what, name);
}

static bool parse_shape(parser *p, st_entry *e) {
    cti_json *j = &p->j;
    if (!cti_json_expect(j, '[', "'[' opening the shape")) return false;
    e->ndim = 0;
    if (cti_json_accept(j, ']')) return true;
    do {
        if (e->ndim == CT_MAX_DIMS)
            return cti_json_fail(j, "shape has more than %d dims", CT_MAX_DIMS);
        if (!cti_json_uint(j, &e->shape[e->ndim])) return false;
        e->ndim++;
    } while (cti_json_accept(j, ','));
    return cti_json_expect(j, ']', "',' or ']' in the shape");
}

static bool parse_offsets(parser *p, st_entry *e) {
    cti_json *j = &p->j;
    return cti_json_expect(j, '[', "'[' opening data_offsets") && cti_json_uint(j, &e->begin) &&
           cti_json_expect(j, ',', "',' between the two data_offsets") &&
           cti_json_uint(j, &e->end) &&
           cti_json_expect(j, ']', "']' after the two data_offsets (exactly two)");
}

static bool parse_dtype(parser *p, st_entry *e) {
    char *s;
    if (!cti_json_string(&p->j, &s)) return false;
    for (size_t i = 0; i < NUM_DTYPES; i++) {
        if (strcmp(s, DTYPES[i].name) == 0) {
            e->dtype = DTYPES[i].dtype;
            free(s);
            return true;
        }
    }
    cti_json_fail(&p->j,
                  "unknown or unsupported dtype \"%.24s\" (cten reads BOOL, I32, I64, F16, "
                  "BF16, F32, F64)",
                  s);
    free(s);
    return false;
}

/* {"dtype": ..., "shape": [...], "data_offsets": [b, e]}, each key once. */
static bool parse_info(parser *p, st_entry *e) {
    cti_json *j = &p->j;
    bool have[3] = {false, false, false};
    static const char *const keys[3] = {"dtype", "shape", "data_offsets"};
    if (!cti_json_expect(j, '{', "'{' opening the tensor's description")) return false;
    if (!cti_json_accept(j, '}')) {
        do {
            char *key;
            if (!cti_json_string(j, &key)) return false;
            int k = 0;
            while (k < 3 && strcmp(key, keys[k]) != 0) k++;
            if (k == 3) {
                cti_json_fail(j, "unknown key \"%.32s\" (expected dtype, shape, data_offsets)",
                              key);
                free(key);
                return false;
            }
            free(key);
            if (have[k]) return cti_json_fail(j, "duplicate key \"%s\"", keys[k]);
            have[k] = true;
            if (!cti_json_expect(j, ':', "':' after a key")) return false;
            bool ok = k == 0 ? parse_dtype(p, e) : k == 1 ? parse_shape(p, e)
                                                          : parse_offsets(p, e);
            if (!ok) return false;
        } while (cti_json_accept(j, ','));
        if (!cti_json_expect(j, '}', "',' or '}' in the tensor's description")) return false;
    }
    for (int k = 0; k < 3; k++)
        if (!have[k]) return cti_json_fail(j, "missing key \"%s\"", keys[k]);
    return true;
}

/* {"key": "value", ...}: string values only, as the format specifies. */
static bool parse_metadata(parser *p, st_header *h) {
    cti_json *j = &p->j;
    if (h->meta) return cti_json_fail(j, "duplicate key \"" METADATA_KEY "\"");
    if (!(h->meta = meta_alloc())) return oom(p);
    if (!cti_json_expect(j, '{', "'{' opening the metadata")) return false;
    if (cti_json_accept(j, '}')) return true;
    do {
        char *key, *value;
        if (!cti_json_string(j, &key)) return false;
        /* ct_metadata keys are never empty (ct_metadata_set refuses them),
         * so a list read from a file is one the API could have built. */
        if (!*key) {
            free(key);
            return cti_json_fail(j, "empty metadata key");
        }
        if (!cti_json_expect(j, ':', "':' after a key") || !cti_json_string(j, &value)) {
            free(key);
            return false;
        }
        if (meta_find(h->meta, key) >= 0) {
            cti_json_fail(j, "duplicate metadata key \"%.32s\"", key);
            free(key);
            free(value);
            return false;
        }
        if (!meta_append(h->meta, key, value)) return oom(p);
    } while (cti_json_accept(j, ','));
    return cti_json_expect(j, '}', "',' or '}' in the metadata");
}

static bool add_entry(parser *p, st_header *h, char *name) {
    if (h->n == h->cap) {
        int64_t cap = h->cap ? h->cap * 2 : 16;
        st_entry *e = realloc(h->e, (size_t)cap * sizeof *e);
        if (!e) {
            free(name);
            return oom(p);
        }
        h->e = e;
        h->cap = cap;
    }
    memset(&h->e[h->n], 0, sizeof h->e[0]);
    h->e[h->n++].name = name;
    return true;
}

static bool parse_header(parser *p, st_header *h) {
    cti_json *j = &p->j;
    snprintf(p->where, sizeof p->where, "the top level");
    if (!cti_json_expect(j, '{', "'{' opening the header")) return false;
    if (!cti_json_accept(j, '}')) {
        do {
            snprintf(p->where, sizeof p->where, "a tensor name");
            char *name;
            if (!cti_json_string(j, &name)) return false;
            if (!cti_json_expect(j, ':', "':' after a name")) {
                free(name);
                return false;
            }
            if (strcmp(name, METADATA_KEY) == 0) {
                free(name);
                snprintf(p->where, sizeof p->where, "the metadata");
                if (!parse_metadata(p, h)) return false;
                continue;
            }
            if (!*name) {
                free(name);
                return cti_json_fail(j, "empty tensor name");
            }
            set_where(p, "tensor", name);
            if (!add_entry(p, h, name) || !parse_info(p, &h->e[h->n - 1])) return false;
        } while (cti_json_accept(j, ','));
        snprintf(p->where, sizeof p->where, "the top level");
        if (!cti_json_expect(j, '}', "',' or '}' after a tensor")) return false;
    }
    if (!cti_json_at_end(j)) return cti_json_fail(j, "text after the header's closing '}'");
    if (!h->meta && !(h->meta = meta_alloc())) return oom(p);
    return true;
}

/* ---- validation of the header against the file --------------------------------------------- */

static int cmp_offset(const void *a, const void *b, void *ctx) {
    const st_entry *e = ctx;
    const st_entry *x = &e[*(const int64_t *)a], *y = &e[*(const int64_t *)b];
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static void sort_offsets(st_header *h) {
    for (int64_t i = 0; i < h->n; i++) h->by_offset[i] = i;
    qsort_r(h->by_offset, (size_t)h->n, sizeof(int64_t), cmp_offset, h->e);
}

static ct_status validate(const char *op, const char *path, st_header *h, int64_t data_len) {
    for (int64_t i = 0; i < h->n; i++) {
        const st_entry *e = &h->e[i];
        int64_t numel = 1;
        bool overflow = false;
        for (int d = 0; d < e->ndim; d++) {
            overflow |= e->shape[d] != 0 && numel > INT64_MAX / e->shape[d];
            if (!overflow) numel *= e->shape[d];
        }
        int64_t es = (int64_t)ct_dtype_size(e->dtype);
        if (overflow || numel > INT64_MAX / es)
            return cti_error(CT_ERR_FORMAT, "%s: '%s': tensor '%s': shape %s of %s overflows", op,
                             path, e->name, cti_shape_s(e->ndim, e->shape),
                             st_dtype_name(e->dtype));
        if (e->begin > e->end)
            return cti_error(CT_ERR_FORMAT,
                             "%s: '%s': tensor '%s': data_offsets [%lld, %lld] end before they "
                             "begin",
                             op, path, e->name, (long long)e->begin, (long long)e->end);
        if (e->end > data_len)
            return cti_error(CT_ERR_FORMAT,
                             "%s: '%s': tensor '%s': data_offsets [%lld, %lld] are outside the "
                             "data section of %lld bytes (file truncated?)",
                             op, path, e->name, (long long)e->begin, (long long)e->end,
                             (long long)data_len);
        if (e->end - e->begin != numel * es)
            return cti_error(CT_ERR_FORMAT,
                             "%s: '%s': tensor '%s': dtype %s and shape %s need %lld bytes but "
                             "data_offsets [%lld, %lld] span %lld",
                             op, path, e->name, st_dtype_name(e->dtype),
                             cti_shape_s(e->ndim, e->shape), (long long)(numel * es),
                             (long long)e->begin, (long long)e->end,
                             (long long)(e->end - e->begin));
    }
    if (!cti_hmap_reserve(&h->by_name, (size_t)h->n) ||
        !(h->by_offset = malloc((size_t)(h->n + 1) * sizeof(int64_t))))
        return cti_error(CT_ERR_OOM, "%s: out of memory reading '%s'", op, path);
    /* In header order, so the first repeated name is the one named. */
    for (int64_t i = 0; i < h->n; i++)
        if (cti_hmap_put_new(&h->by_name, h->e[i].name, i) >= 0)
            return cti_error(CT_ERR_FORMAT, "%s: '%s': duplicate tensor name '%s'", op, path,
                             h->e[i].name);
    sort_offsets(h);
    /* The ranges, in order, must tile [0, data_len): no gaps, no overlaps. */
    int64_t pos = 0;
    const st_entry *prev = NULL;
    for (int64_t i = 0; i < h->n; i++) {
        const st_entry *e = &h->e[h->by_offset[i]];
        if (e->begin < pos)
            return cti_error(CT_ERR_FORMAT,
                             "%s: '%s': tensors '%s' [%lld, %lld] and '%s' [%lld, %lld] overlap",
                             op, path, prev->name, (long long)prev->begin, (long long)prev->end,
                             e->name, (long long)e->begin, (long long)e->end);
        if (e->begin > pos)
            return cti_error(CT_ERR_FORMAT,
                             "%s: '%s': gap in the data section: bytes [%lld, %lld) belong to no "
                             "tensor (tensor '%s' begins at %lld)",
                             op, path, (long long)pos, (long long)e->begin, e->name,
                             (long long)e->begin);
        pos = e->end;
        prev = e;
    }
    if (pos != data_len)
        return cti_error(CT_ERR_FORMAT,
                         "%s: '%s': gap in the data section: bytes [%lld, %lld) at its end "
                         "belong to no tensor",
                         op, path, (long long)pos, (long long)data_len);
    return CT_OK;
}

/* ---- reading ---------------------------------------------------------------------------------- */

static ct_status read_bytes(const char *op, const char *path, int fd, void *buf, size_t n,
                            const char *what) {
    size_t got;
    if (!cti_read_full(fd, buf, n, &got))
        return cti_error(CT_ERR_IO, "%s: cannot read '%s': %s", op, path, strerror(errno));
    if (got < n)
        return cti_error(CT_ERR_FORMAT, "%s: '%s' is truncated: it ends inside %s", op, path,
                         what);
    return CT_OK;
}

/* Parses and validates the header of the open file fd of size file_size. */
static ct_status read_header(const char *op, const char *path, int fd, int64_t file_size,
                             st_header *h) {
    if (file_size < 8)
        return cti_error(CT_ERR_FORMAT,
                         "%s: '%s' is too short (%lld bytes) to hold the 8-byte header length",
                         op, path, (long long)file_size);
    unsigned char len8[8];
    ct_status st = read_bytes(op, path, fd, len8, 8, "the header length");
    if (st) return st;
    uint64_t hlen = 0;
    for (int k = 7; k >= 0; k--) hlen = hlen << 8 | len8[k];
    if (hlen > (uint64_t)(file_size - 8))
        return cti_error(CT_ERR_FORMAT,
                         "%s: '%s': header length %llu exceeds the %lld bytes after it in the "
                         "file",
                         op, path, (unsigned long long)hlen, (long long)(file_size - 8));
    if (hlen > (uint64_t)MAX_HEADER_BYTES)
        return cti_error(CT_ERR_FORMAT, "%s: '%s': header length %llu exceeds the limit of %lld",
                         op, path, (unsigned long long)hlen, (long long)MAX_HEADER_BYTES);
    char *text = malloc(hlen ? hlen : 1);
    if (!text) return cti_error(CT_ERR_OOM, "%s: out of memory reading '%s'", op, path);
    if ((st = read_bytes(op, path, fd, text, hlen, "the header"))) {
        free(text);
        return st;
    }
    parser p = {.oom = false};
    cti_json_init(&p.j, text, hlen);
    bool ok = parse_header(&p, h);
    free(text);
    if (!ok)
        return p.oom ? cti_error(CT_ERR_OOM, "%s: out of memory reading '%s'", op, path)
                     : cti_error(CT_ERR_FORMAT, "%s: '%s': malformed header JSON in %s: %s", op,
                                 path, p.where, p.j.err);
    return validate(op, path, h, file_size - 8 - (int64_t)hlen);
}

/* Reads the data section into new CPU tensors (out[i] for entry i). */
static ct_status read_tensors(const char *op, const char *path, int fd, const st_header *h,
                              ct_tensor **out) {
    for (int64_t i = 0; i < h->n; i++) {
        const st_entry *e = &h->e[i];
        if (!(out[i] = cti_tensor_new(op, e->ndim, e->shape, e->dtype, CT_CPU)))
            return ct_last_status();
        /* Owned by the list being built, not by whichever scope is open. */
        cti_scope_forget(out[i]);
    }
    /* Validation made the ranges consecutive in this order. */
    for (int64_t i = 0; i < h->n; i++) {
        int64_t k = h->by_offset[i];
        const st_entry *e = &h->e[k];
        size_t n = (size_t)(e->end - e->begin);
        if (n == 0) continue;
        char what[96];
        snprintf(what, sizeof what, "tensor '%.64s'", e->name);
        ct_status st = read_bytes(op, path, fd, cti_data(out[k]), n, what);
        if (st) return st;
        if (e->dtype == CT_BOOL) {
            const unsigned char *b = (const unsigned char *)cti_data(out[k]);
            for (size_t m = 0; m < n; m++)
                if (b[m] > 1)
                    return cti_error(CT_ERR_FORMAT,
                                     "%s: '%s': BOOL tensor '%s' holds byte %u at element %zu "
                                     "(expected 0 or 1)",
                                     op, path, e->name, b[m], m);
        }
    }
    return CT_OK;
}

/* Opens path, validates it and reads every tensor (tensors[i] for header
 * entry i, references owned by the caller). */
static ct_status load_file(const char *op, const char *path, st_header *h, ct_tensor ***tensors) {
    memset(h, 0, sizeof *h);
    cti_hmap_init(&h->by_name, CTI_HMAP_STR);
    *tensors = NULL;
    cti_tmp_sweep(path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return cti_error(CT_ERR_IO, "%s: cannot open '%s': %s", op, path, strerror(errno));
    struct stat sb;
    ct_status st = CT_OK;
    if (fstat(fd, &sb) != 0)
        st = cti_error(CT_ERR_IO, "%s: cannot stat '%s': %s", op, path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        st = cti_error(CT_ERR_IO, "%s: '%s' is not a regular file", op, path);
    if (!st) st = read_header(op, path, fd, (int64_t)sb.st_size, h);
    ct_tensor **ts = NULL;
    if (!st && !(ts = calloc((size_t)h->n + 1, sizeof *ts)))
        st = cti_error(CT_ERR_OOM, "%s: out of memory reading '%s'", op, path);
    if (!st) st = read_tensors(op, path, fd, h, ts);
    close(fd);
    if (st) {
        for (int64_t i = 0; ts && i < h->n; i++) ct_tensor_release(ts[i]);
        free(ts);
        header_free(h);
        return st;
    }
    *tensors = ts;
    return CT_OK;
}

static void release_all(ct_tensor **ts, int64_t n) {
    for (int64_t i = 0; i < n; i++) ct_tensor_release(ts[i]);
    free(ts);
}

/* Hands h's metadata to *meta (when asked for). */
static void give_meta(st_header *h, ct_metadata **meta) {
    if (meta) {
        *meta = h->meta;
        h->meta = NULL;
    }
}

ct_params *ct_load_safetensors(const char *path, ct_metadata **meta) {
    static const char op[] = "ct_load_safetensors";
    if (meta) *meta = NULL;
    if (!path) return cti_error_null(CT_ERR_INVALID_ARG, "%s: path is NULL", op);
    st_header h;
    ct_tensor **ts;
    if (load_file(op, path, &h, &ts)) return NULL;
    ct_params *p = ct_params_new();
    for (int64_t i = 0; p && i < h.n; i++) {
        if (ct_params_add(p, h.e[i].name, ts[i]) != CT_OK) {
            ct_params_free(p);
            p = NULL;
        }
    }
    release_all(ts, h.n);
    if (p) give_meta(&h, meta);
    header_free(&h);
    return p;
}

ct_metadata *ct_load_safetensors_metadata(const char *path) {
    static const char op[] = "ct_load_safetensors_metadata";
    if (!path) return cti_error_null(CT_ERR_INVALID_ARG, "%s: path is NULL", op);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return cti_error_null(CT_ERR_IO, "%s: cannot open '%s': %s", op, path, strerror(errno));
    struct stat sb;
    st_header h;
    memset(&h, 0, sizeof h);
    ct_status st = CT_OK;
    if (fstat(fd, &sb) != 0)
        st = cti_error(CT_ERR_IO, "%s: cannot stat '%s': %s", op, path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        st = cti_error(CT_ERR_IO, "%s: '%s' is not a regular file", op, path);
    if (!st) st = read_header(op, path, fd, (int64_t)sb.st_size, &h);
    close(fd);
    ct_metadata *m = NULL;
    if (!st) give_meta(&h, &m);
    header_free(&h);
    return m;
}

static int64_t find_entry(const st_header *h, const char *name) {
    return cti_hmap_get(&h->by_name, name);
}

static ct_status check_into(const char *op, const char *path, const st_header *h,
                            const ct_params *dst, bool strict, int64_t *src_of) {
    int64_t nd = ct_params_count(dst);
    for (int64_t i = 0; i < nd; i++) {
        const char *name;
        ct_tensor *t = ct_params_get(dst, i, &name);
        int64_t k = find_entry(h, name);
        if (k < 0)
            return cti_error(CT_ERR_FORMAT, "%s: '%s' has no tensor named '%s'", op, path, name);
        const st_entry *e = &h->e[k];
        bool same = e->ndim == t->ndim;
        for (int d = 0; same && d < e->ndim; d++) same = e->shape[d] == t->shape[d];
        if (!same || e->dtype != t->dtype)
            return cti_error(same ? CT_ERR_DTYPE : CT_ERR_SHAPE,
                             "%s: '%s': tensor '%s' is %s %s in the file but %s in the list", op,
                             path, name, cti_shape_s(e->ndim, e->shape),
                             ct_dtype_name(e->dtype), cti_desc(t));
        src_of[i] = k;
    }
    if (strict && h->n != nd) {
        /* dst's names are distinct and all found, so some file tensor is extra. */
        bool *used = calloc((size_t)h->n, sizeof *used);
        if (!used) return cti_error(CT_ERR_OOM, "%s: out of memory", op);
        for (int64_t i = 0; i < nd; i++) used[src_of[i]] = true;
        int64_t k = 0;
        while (k < h->n && used[k]) k++;
        free(used);
        if (k < h->n)
            return cti_error(CT_ERR_FORMAT,
                             "%s: '%s' holds tensor '%s' that the list lacks (strict)", op, path,
                             h->e[k].name);
    }
    return CT_OK;
}

ct_status ct_load_safetensors_into(const char *path, ct_params *dst, bool strict,
                                   ct_metadata **meta) {
    static const char op[] = "ct_load_safetensors_into";
    if (meta) *meta = NULL;
    if (!path) return cti_error(CT_ERR_INVALID_ARG, "%s: path is NULL", op);
    if (!dst) return cti_error(CT_ERR_INVALID_ARG, "%s: destination list is NULL", op);
    st_header h;
    ct_tensor **ts;
    ct_status st = load_file(op, path, &h, &ts);
    if (st) return st;
    int64_t nd = ct_params_count(dst);
    int64_t *src_of = malloc((size_t)(nd + 1) * sizeof *src_of);
    if (!src_of) st = cti_error(CT_ERR_OOM, "%s: out of memory", op);
    if (!st) st = check_into(op, path, &h, dst, strict, src_of);
    if (!st) {
        bool prev = ct_no_grad_begin();
        for (int64_t i = 0; i < nd && !st; i++)
            st = ct_copy_(ct_params_get(dst, i, NULL), ts[src_of[i]]);
        ct_no_grad_end(prev);
    }
    if (!st) give_meta(&h, meta);
    free(src_of);
    release_all(ts, h.n);
    header_free(&h);
    return st;
}

/* ---- writing ------------------------------------------------------------------------------------ */

typedef struct strbuf {
    char *p;
    size_t n, cap;
    bool oom;
} strbuf;

static void sb_reserve(strbuf *b, size_t extra) {
    if (b->oom || b->n + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return;
    }
    b->p = p;
    b->cap = cap;
}

static void sb_put(strbuf *b, const char *s, size_t n) {
    sb_reserve(b, n);
    if (b->oom) return;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void sb_puts(strbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(strbuf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    sb_put(b, tmp, (size_t)n);
}

/* A JSON string: quotes, backslashes and control characters escaped; the
 * rest (valid UTF-8, checked by the caller) kept as is. */
static void sb_json_string(strbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (const char *q = s; *q; q++) {
        unsigned char c = (unsigned char)*q;
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            sb_put(b, esc, 2);
        } else if (c < 0x20) {
            sb_printf(b, "\\u%04x", c);
        } else {
            sb_put(b, q, 1);
        }
    }
    sb_put(b, "\"", 1);
}

/* Data offsets: tensors placed by element size, largest first, so every
 * tensor starts aligned to its element size for readers that map the file. */
static ct_status plan_offsets(const char *op, const ct_params *ps, int64_t *begin,
                              int64_t *order) {
    int64_t n = ct_params_count(ps), pos = 0, m = 0;
    static const size_t sizes[] = {8, 4, 2, 1};
    for (int s = 0; s < 4; s++) {
        for (int64_t i = 0; i < n; i++) {
            ct_tensor *t = ct_params_get(ps, i, NULL);
            if (ct_dtype_size(t->dtype) != sizes[s]) continue;
            size_t nb;
            if (!cti_checked_nbytes(op, t->ndim, t->shape, t->dtype, &nb)) return ct_last_status();
            if ((uint64_t)nb > (uint64_t)(INT64_MAX - pos))
                return cti_error(CT_ERR_OVERFLOW, "%s: the tensors' total size overflows", op);
            begin[i] = pos;
            order[m++] = i;
            pos += (int64_t)nb;
        }
    }
    return CT_OK;
}

static ct_status build_header(const char *op, const ct_params *ps, const ct_metadata *meta,
                              const int64_t *begin, strbuf *b) {
    sb_puts(b, "{");
    bool first = true;
    if (meta && meta->n > 0) {
        sb_puts(b, "\"" METADATA_KEY "\":{");
        for (int64_t i = 0; i < meta->n; i++) {
            if (i) sb_puts(b, ",");
            sb_json_string(b, meta->keys[i]);
            sb_puts(b, ":");
            sb_json_string(b, meta->values[i]);
        }
        sb_puts(b, "}");
        first = false;
    }
    int64_t n = ct_params_count(ps);
    for (int64_t i = 0; i < n; i++) {
        const char *name;
        ct_tensor *t = ct_params_get(ps, i, &name);
        if (!cti_utf8_valid(name, strlen(name)))
            return cti_error(CT_ERR_INVALID_ARG, "%s: tensor name number %lld is not valid UTF-8",
                             op, (long long)i);
        if (strcmp(name, METADATA_KEY) == 0)
            return cti_error(CT_ERR_INVALID_ARG,
                             "%s: the name '" METADATA_KEY "' is reserved for metadata", op);
        if (!first) sb_puts(b, ",");
        first = false;
        sb_json_string(b, name);
        sb_printf(b, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++) sb_printf(b, d ? ",%lld" : "%lld", (long long)t->shape[d]);
        int64_t nb = cti_numel(t->ndim, t->shape) * (int64_t)ct_dtype_size(t->dtype);
        sb_printf(b, "],\"data_offsets\":[%lld,%lld]}", (long long)begin[i],
                  (long long)(begin[i] + nb));
    }
    sb_puts(b, "}");
    /* Pad with spaces so the data section starts 8-byte aligned. */
    while (!b->oom && (b->n + 8) % 8 != 0) sb_puts(b, " ");
    if (b->oom) return cti_error(CT_ERR_OOM, "%s: out of memory building the header", op);
    return CT_OK;
}

static ct_status write_tensor(const char *op, const char *tmp, int fd, ct_tensor *t) {
    size_t nb = (size_t)cti_numel(t->ndim, t->shape) * ct_dtype_size(t->dtype);
    if (nb == 0) return CT_OK;
    if (t->storage->device.type == CT_DEVICE_CPU && cti_is_contiguous(t)) {
        if (!cti_write_full(fd, cti_data(t), nb))
            return cti_error(CT_ERR_IO, "%s: cannot write '%s': %s", op, tmp, strerror(errno));
        return CT_OK;
    }
    void *buf = malloc(nb);
    if (!buf) return cti_error(CT_ERR_OOM, "%s: out of memory staging %s", op, cti_desc(t));
    ct_status st = ct_tensor_copy_to_host(t, buf, nb);
    if (!st && !cti_write_full(fd, buf, nb))
        st = cti_error(CT_ERR_IO, "%s: cannot write '%s': %s", op, tmp, strerror(errno));
    free(buf);
    return st;
}

static ct_status write_file(const char *op, const char *path, const strbuf *hdr,
                            const ct_params *ps, const int64_t *order) {
    cti_tmp_sweep(path);
    char *tmp;
    int fd;
    ct_status st = cti_tmp_create(op, path, &tmp, &fd);
    if (st) return st;
    unsigned char len8[8];
    for (int k = 0; k < 8; k++) len8[k] = (unsigned char)((uint64_t)hdr->n >> (8 * k));
    if (!cti_write_full(fd, len8, 8) || !cti_write_full(fd, hdr->p, hdr->n))
        st = cti_error(CT_ERR_IO, "%s: cannot write '%s': %s", op, tmp, strerror(errno));
    for (int64_t i = 0; !st && i < ct_params_count(ps); i++)
        st = write_tensor(op, tmp, fd, ct_params_get(ps, order[i], NULL));
    return cti_tmp_commit(op, path, tmp, fd, st);
}

ct_status ct_save_safetensors(const char *path, const ct_params *tensors,
                              const ct_metadata *meta) {
    static const char op[] = "ct_save_safetensors";
    if (!path || !*path) return cti_error(CT_ERR_INVALID_ARG, "%s: path is NULL or empty", op);
    if (!tensors) return cti_error(CT_ERR_INVALID_ARG, "%s: tensor list is NULL", op);
    int64_t n = ct_params_count(tensors);
    int64_t *begin = malloc((size_t)(n + 1) * sizeof *begin);
    int64_t *order = malloc((size_t)(n + 1) * sizeof *order);
    strbuf hdr = {0};
    ct_status st = CT_OK;
    if (!begin || !order) st = cti_error(CT_ERR_OOM, "%s: out of memory", op);
    if (!st) st = plan_offsets(op, tensors, begin, order);
    if (!st) st = build_header(op, tensors, meta, begin, &hdr);
    if (!st) st = write_file(op, path, &hdr, tensors, order);
    free(hdr.p);
    free(begin);
    free(order);
    return st;
}
