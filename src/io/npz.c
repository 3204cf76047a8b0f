/* NumPy's .npz files: zip archives of .npy members, as numpy.savez (stored)
 * and numpy.savez_compressed (deflated) write them.
 *
 * Reading goes through libzip, which handles every layout Python's zipfile
 * writes (zip64 records, data descriptors) and checks each member's CRC;
 * cten checks each member's declared sizes against the file before
 * anything of that size is allocated. Writing streams each member through
 * zlib's deflate (or stores it) into a temporary file that is renamed over
 * the target, as the other savers do: libzip would write through a
 * temporary of its own without syncing it and hold every member's bytes
 * until the archive closes. The container is written with zip64 records
 * throughout, as numpy does, so one layout serves every size. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zip.h>
#include <zlib.h>

#include "core/hashmap.h"
#include "io_impl.h"

/* deflate never compresses better than 1032:1 (as in idx.c). */
#define DEFLATE_MAX_RATIO 1032
#define DEFLATE_SLACK 4096
#define SUFFIX ".npy"
#define CHUNK (1u << 18)

/* ---- reading -------------------------------------------------------------------------------- */

typedef struct member {
    zip_t *za;
    zip_file_t *zf;
    const char *op, *path, *name;
} member;

/* libzip's reason as a status and message. A failed seek is a format
 * error: on a regular file it means an offset in the archive points past
 * its end or below 0. */
static ct_status zip_status(const char *op, const char *path, const char *name, zip_error_t *e) {
    int code = zip_error_code_zip(e);
    ct_status st = code == ZIP_ER_MEMORY                         ? CT_ERR_OOM
                   : code == ZIP_ER_READ || code == ZIP_ER_OPEN ? CT_ERR_IO
                                                                : CT_ERR_FORMAT;
    if (name)
        return cti_error(st, "%s: '%s' member '%.200s': %s", op, path, name, zip_error_strerror(e));
    return cti_error(st, "%s: '%s': %s", op, path, zip_error_strerror(e));
}

static ct_status member_read(void *ctx, void *buf, size_t n, size_t *got) {
    member *m = ctx;
    *got = 0;
    while (*got < n) {
        zip_int64_t r = zip_fread(m->zf, (char *)buf + *got, n - *got);
        if (r < 0) return zip_status(m->op, m->path, m->name, zip_file_get_error(m->zf));
        if (r == 0) break;
        *got += (size_t)r;
    }
    return CT_OK;
}

/* Refuses a member cten cannot or need not read before it is opened. */
static ct_status check_member(const char *op, const char *path, const zip_stat_t *zs,
                              int64_t file_size) {
    const char *name = zs->name;
    size_t len = strlen(name), sl = strlen(SUFFIX);
    if (len <= sl || strcmp(name + len - sl, SUFFIX) != 0)
        return cti_error(CT_ERR_FORMAT,
                         "%s: '%s': member '%.200s' is not a .npy file (expected a name ending "
                         "in .npy)",
                         op, path, name);
    /* libzip gives names as UTF-8, decoding those not marked UTF-8 from
     * CP437 as Python's zipfile does, which can make them longer than a zip
     * name may be: such a list could not be saved again. */
    if (!cti_utf8_valid(name, len) || len > 0xffff)
        return cti_error(CT_ERR_FORMAT,
                         "%s: '%s': member name '%.200s' is not valid UTF-8 of at most 65535 "
                         "bytes",
                         op, path, name);
    if (zs->encryption_method != ZIP_EM_NONE)
        return cti_error(CT_ERR_FORMAT, "%s: '%s': member '%.200s' is encrypted", op, path, name);
    if (zs->comp_method != ZIP_CM_STORE && zs->comp_method != ZIP_CM_DEFLATE)
        return cti_error(CT_ERR_FORMAT,
                         "%s: '%s': member '%.200s' uses compression method %d (expected 0, "
                         "stored, or 8, deflated)",
                         op, path, name, (int)zs->comp_method);
    if (zs->comp_size > (uint64_t)file_size)
        return cti_error(CT_ERR_FORMAT,
                         "%s: '%s': member '%.200s' claims %llu compressed bytes, more than the "
                         "file's %lld",
                         op, path, name, (unsigned long long)zs->comp_size, (long long)file_size);
    uint64_t bound = zs->comp_method == ZIP_CM_STORE
                         ? zs->comp_size
                         : zs->comp_size * DEFLATE_MAX_RATIO + DEFLATE_SLACK;
    if (zs->size > bound || zs->size > INT64_MAX)
        return cti_error(CT_ERR_FORMAT,
                         "%s: '%s': member '%.200s' claims %llu bytes, more than %llu %s bytes "
                         "can hold",
                         op, path, name, (unsigned long long)zs->size,
                         (unsigned long long)zs->comp_size,
                         zs->comp_method == ZIP_CM_STORE ? "stored" : "deflated");
    return CT_OK;
}

/* Reads member i into a new tensor (in the current scope). */
static ct_tensor *read_member(const char *op, const char *path, zip_t *za, zip_uint64_t i,
                              const zip_stat_t *zs) {
    member m = {za, zip_fopen_index(za, i, 0), op, path, zs->name};
    if (!m.zf) {
        zip_status(op, path, zs->name, zip_get_error(za));
        return NULL;
    }
    char where[4096 + 256];
    snprintf(where, sizeof where, "'%s' member '%.200s'", path, zs->name);
    ct_tensor *t = cti_npy_read(op, where, (int64_t)zs->size, (cti_npy_source){member_read, &m});
    /* Reading on to the end makes libzip check the CRC. */
    char extra;
    size_t got = 0;
    ct_status st = t ? member_read(&m, &extra, 1, &got) : CT_OK;
    if (!st && got > 0)
        st = cti_error(CT_ERR_FORMAT, "%s: %s holds more than its declared %llu bytes", op, where,
                       (unsigned long long)zs->size);
    if (st) {
        ct_tensor_release(t);
        t = NULL;
    }
    zip_fclose(m.zf);
    return t;
}

/* Adds every member of za to p in the archive's order. */
static ct_status read_members(const char *op, const char *path, zip_t *za, int64_t file_size,
                              ct_params *p) {
    zip_int64_t n = zip_get_num_entries(za, 0);
    cti_hmap names;
    cti_hmap_init(&names, CTI_HMAP_STR);
    ct_status st = CT_OK;
    char *key = NULL;
    for (zip_int64_t i = 0; i < n && !st; i++) {
        zip_stat_t zs;
        if (zip_stat_index(za, (zip_uint64_t)i, 0, &zs) != 0) {
            st = zip_status(op, path, NULL, zip_get_error(za));
            break;
        }
        if ((st = check_member(op, path, &zs, file_size))) break;
        free(key);
        size_t klen = strlen(zs.name) - strlen(SUFFIX);
        if (!(key = strndup(zs.name, klen))) {
            st = cti_error(CT_ERR_OOM, "%s: out of memory reading '%s'", op, path);
            break;
        }
        if (cti_hmap_get(&names, key) >= 0) {
            st = cti_error(CT_ERR_FORMAT, "%s: '%s': duplicate member '%.200s'", op, path,
                           zs.name);
            break;
        }
        ct_tensor *t = read_member(op, path, za, (zip_uint64_t)i, &zs);
        if (!t) {
            st = ct_last_status();
            break;
        }
        st = ct_params_add(p, key, t);
        ct_tensor_release(t);
        const char *kept;
        if (!st) ct_params_get(p, ct_params_count(p) - 1, &kept);
        if (!st && !cti_hmap_put(&names, kept, i))
            st = cti_error(CT_ERR_OOM, "%s: out of memory reading '%s'", op, path);
    }
    free(key);
    cti_hmap_clear(&names);
    return st;
}

ct_params *ct_load_npz(const char *path) {
    static const char op[] = "ct_load_npz";
    if (!path) return cti_error_null(CT_ERR_INVALID_ARG, "%s: path is NULL", op);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return cti_error_null(CT_ERR_IO, "%s: cannot open '%s': %s", op, path, strerror(errno));
    struct stat sb;
    ct_status st = CT_OK;
    if (fstat(fd, &sb) != 0)
        st = cti_error(CT_ERR_IO, "%s: cannot stat '%s': %s", op, path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        st = cti_error(CT_ERR_IO, "%s: '%s' is not a regular file", op, path);
    else if (sb.st_size < 22) /* the end-of-directory record alone */
        st = cti_error(CT_ERR_FORMAT,
                       "%s: '%s' is too short (%lld bytes) to be a zip archive (an .npz file is "
                       "one)",
                       op, path, (long long)sb.st_size);
    int zerr = 0;
    zip_t *za = st ? NULL : zip_fdopen(fd, ZIP_CHECKCONS, &zerr);
    if (!za) {
        close(fd);
        if (st) return NULL;
        if (zerr == ZIP_ER_NOZIP)
            return cti_error_null(CT_ERR_FORMAT,
                                  "%s: '%s' is not a zip archive (an .npz file is one)", op, path);
        if (zerr == ZIP_ER_EXISTS) /* libzip's index of names refused one */
            return cti_error_null(CT_ERR_FORMAT, "%s: '%s': two members have one name", op, path);
        zip_error_t e;
        zip_error_init_with_code(&e, zerr);
        zip_status(op, path, NULL, &e);
        zip_error_fini(&e);
        return NULL;
    }
    ct_params *p = ct_params_new();
    st = p ? read_members(op, path, za, (int64_t)sb.st_size, p) : ct_last_status();
    zip_discard(za); /* closes fd */
    if (st) {
        ct_params_free(p);
        return NULL;
    }
    return p;
}

/* ---- writing ------------------------------------------------------------------------------- */

static void put16(unsigned char *b, unsigned v) {
    b[0] = (unsigned char)v;
    b[1] = (unsigned char)(v >> 8);
}

static void put32(unsigned char *b, uint32_t v) {
    for (int k = 0; k < 4; k++) b[k] = (unsigned char)(v >> (8 * k));
}

static void put64(unsigned char *b, uint64_t v) {
    for (int k = 0; k < 8; k++) b[k] = (unsigned char)(v >> (8 * k));
}

#define ZIP_VERSION 45       /* 4.5: zip64 */
#define DOS_DATE 0x21        /* 1980-01-01: the same archive for the same tensors */
#define UTF8_FLAG (1u << 11) /* the name is UTF-8 */
#define LOCAL_SIZE 30
#define LOCAL_EXTRA 20 /* zip64: uncompressed and compressed sizes */
#define CENTRAL_SIZE 46
#define CENTRAL_EXTRA 28 /* zip64: both sizes and the local header's offset */

/* What the central directory needs of a written member. */
typedef struct entry {
    char *name; /* "<key>.npy" */
    unsigned flags;
    uint32_t crc;
    uint64_t size, comp_size, offset;
} entry;

typedef struct writer {
    const char *op, *tmp;
    int fd;
    uint64_t pos;
    bool compress;
    z_stream z;
    unsigned char *out; /* CHUNK bytes of deflate output */
} writer;

static ct_status w_write(writer *w, const void *p, size_t n) {
    if (!cti_write_full(w->fd, p, n))
        return cti_error(CT_ERR_IO, "%s: cannot write '%s': %s", w->op, w->tmp, strerror(errno));
    w->pos += n;
    return CT_OK;
}

static ct_status w_pwrite(writer *w, const void *p, size_t n, uint64_t at) {
    ssize_t r;
    do r = pwrite(w->fd, p, n, (off_t)at);
    while (r < 0 && errno == EINTR);
    if (r != (ssize_t)n)
        return cti_error(CT_ERR_IO, "%s: cannot write '%s': %s", w->op, w->tmp,
                         r < 0 ? strerror(errno) : "short write");
    return CT_OK;
}

/* Feeds n bytes of the member (flush: its last ones) through deflate. */
static ct_status w_deflate(writer *w, const void *p, size_t n, bool flush) {
    const unsigned char *in = p;
    for (;;) {
        uInt step = n > (1u << 30) ? 1u << 30 : (uInt)n;
        w->z.next_in = (Bytef *)(uintptr_t)in;
        w->z.avail_in = step;
        bool last = flush && step == n;
        int r;
        do {
            w->z.next_out = w->out;
            w->z.avail_out = CHUNK;
            r = deflate(&w->z, last ? Z_FINISH : Z_NO_FLUSH);
            if (r == Z_STREAM_ERROR)
                return cti_error(CT_ERR_RUNTIME, "%s: zlib's deflate failed", w->op);
            ct_status st = w_write(w, w->out, CHUNK - w->z.avail_out);
            if (st) return st;
        } while (w->z.avail_out == 0 || (last && r != Z_STREAM_END));
        in += step;
        n -= step;
        if (n == 0) return CT_OK;
    }
}

/* The member's bytes, stored or deflated, with their CRC. */
static ct_status w_member_data(writer *w, const cti_npy_out *o, entry *e) {
    e->crc = (uint32_t)crc32(0, (const Bytef *)o->header, (uInt)o->header_len);
    const unsigned char *d = o->data;
    for (size_t k = 0; k < o->nbytes; k += 1u << 30) {
        size_t n = o->nbytes - k < (1u << 30) ? o->nbytes - k : 1u << 30;
        e->crc = (uint32_t)crc32(e->crc, d + k, (uInt)n);
    }
    uint64_t start = w->pos;
    ct_status st;
    if (!w->compress) {
        st = w_write(w, o->header, o->header_len);
        if (!st && o->nbytes) st = w_write(w, o->data, o->nbytes);
    } else {
        if (deflateReset(&w->z) != Z_OK)
            return cti_error(CT_ERR_RUNTIME, "%s: zlib's deflateReset failed", w->op);
        st = w_deflate(w, o->header, o->header_len, false);
        if (!st) st = w_deflate(w, o->data, o->nbytes, true);
    }
    e->comp_size = w->pos - start;
    return st;
}

static ct_status write_member(writer *w, const char *key, ct_tensor *t, entry *e) {
    size_t klen = strlen(key);
    if (!(e->name = malloc(klen + sizeof SUFFIX)))
        return cti_error(CT_ERR_OOM, "%s: out of memory", w->op);
    memcpy(e->name, key, klen);
    memcpy(e->name + klen, SUFFIX, sizeof SUFFIX);
    size_t nlen = klen + strlen(SUFFIX);
    e->flags = 0;
    for (size_t k = 0; k < nlen; k++)
        if ((unsigned char)e->name[k] >= 0x80) e->flags = UTF8_FLAG;
    cti_npy_out o;
    ct_status st = cti_npy_prepare(w->op, t, &o);
    if (st) return st;
    e->size = o.header_len + o.nbytes;
    e->offset = w->pos;
    unsigned char h[LOCAL_SIZE + LOCAL_EXTRA];
    memset(h, 0, sizeof h);
    put32(h, 0x04034b50);
    put16(h + 4, ZIP_VERSION);
    put16(h + 6, e->flags);
    put16(h + 8, w->compress ? 8 : 0);
    put16(h + 12, DOS_DATE);
    put32(h + 18, 0xffffffffu);
    put32(h + 22, 0xffffffffu);
    put16(h + 26, (unsigned)nlen);
    put16(h + 28, LOCAL_EXTRA);
    unsigned char *x = h + LOCAL_SIZE;
    put16(x, 0x0001);
    put16(x + 2, 16);
    st = w_write(w, h, LOCAL_SIZE);
    if (!st) st = w_write(w, e->name, nlen);
    if (!st) st = w_write(w, x, LOCAL_EXTRA);
    if (!st) st = w_member_data(w, &o, e);
    cti_npy_out_free(&o);
    /* The CRC and sizes, known now, into the local header. */
    if (!st) {
        put32(h + 14, e->crc);
        st = w_pwrite(w, h + 14, 4, e->offset + 14);
    }
    if (!st) {
        put64(x + 4, e->size);
        put64(x + 12, e->comp_size);
        st = w_pwrite(w, x + 4, 16, e->offset + LOCAL_SIZE + nlen + 4);
    }
    return st;
}

static ct_status write_central(writer *w, const entry *es, int64_t n) {
    uint64_t cd_start = w->pos;
    ct_status st = CT_OK;
    for (int64_t i = 0; i < n && !st; i++) {
        const entry *e = &es[i];
        size_t nlen = strlen(e->name);
        unsigned char h[CENTRAL_SIZE], x[CENTRAL_EXTRA];
        memset(h, 0, sizeof h);
        put32(h, 0x02014b50);
        put16(h + 4, 3u << 8 | ZIP_VERSION); /* made by: Unix */
        put16(h + 6, ZIP_VERSION);
        put16(h + 8, e->flags);
        put16(h + 10, w->compress ? 8 : 0);
        put16(h + 14, DOS_DATE);
        put32(h + 16, e->crc);
        put32(h + 20, 0xffffffffu);
        put32(h + 24, 0xffffffffu);
        put16(h + 28, (unsigned)nlen);
        put16(h + 30, CENTRAL_EXTRA);
        put32(h + 38, 0100644u << 16); /* a regular file, rw-r--r-- */
        put32(h + 42, 0xffffffffu);
        put16(x, 0x0001);
        put16(x + 2, 24);
        put64(x + 4, e->size);
        put64(x + 12, e->comp_size);
        put64(x + 20, e->offset);
        st = w_write(w, h, sizeof h);
        if (!st) st = w_write(w, e->name, nlen);
        if (!st) st = w_write(w, x, sizeof x);
    }
    if (st) return st;
    uint64_t cd_size = w->pos - cd_start, eocd64 = w->pos;
    unsigned char t[56 + 20 + 22];
    memset(t, 0, sizeof t);
    put32(t, 0x06064b50); /* zip64 end of central directory */
    put64(t + 4, 44);
    put16(t + 12, 3u << 8 | ZIP_VERSION);
    put16(t + 14, ZIP_VERSION);
    put64(t + 24, (uint64_t)n);
    put64(t + 32, (uint64_t)n);
    put64(t + 40, cd_size);
    put64(t + 48, cd_start);
    put32(t + 56, 0x07064b50); /* its locator */
    put64(t + 64, eocd64);
    put32(t + 72, 1);
    unsigned char *e = t + 76; /* end of central directory, saturated as zip64 says */
    put32(e, 0x06054b50);
    put16(e + 8, n < 0xffff ? (unsigned)n : 0xffffu);
    put16(e + 10, n < 0xffff ? (unsigned)n : 0xffffu);
    put32(e + 12, cd_size < 0xffffffffu ? (uint32_t)cd_size : 0xffffffffu);
    put32(e + 16, cd_start < 0xffffffffu ? (uint32_t)cd_start : 0xffffffffu);
    return w_write(w, t, sizeof t);
}

static ct_status check_names(const char *op, const ct_params *ps) {
    int64_t n = ct_params_count(ps);
    for (int64_t i = 0; i < n; i++) {
        const char *name;
        ct_params_get(ps, i, &name);
        size_t len = strlen(name);
        if (!cti_utf8_valid(name, len))
            return cti_error(CT_ERR_INVALID_ARG, "%s: tensor name number %lld is not valid UTF-8",
                             op, (long long)i);
        if (len > 0xffff - strlen(SUFFIX))
            return cti_error(CT_ERR_INVALID_ARG,
                             "%s: tensor name number %lld is %zu bytes (a zip name holds at most "
                             "%zu with .npy)",
                             op, (long long)i, len, (size_t)0xffff);
    }
    return CT_OK;
}

ct_status ct_save_npz(const char *path, const ct_params *tensors, bool compress) {
    static const char op[] = "ct_save_npz";
    if (!path || !*path) return cti_error(CT_ERR_INVALID_ARG, "%s: path is NULL or empty", op);
    if (!tensors) return cti_error(CT_ERR_INVALID_ARG, "%s: tensor list is NULL", op);
    ct_status st = check_names(op, tensors);
    if (st) return st;
    int64_t n = ct_params_count(tensors);
    entry *es = calloc((size_t)n + 1, sizeof *es);
    writer w = {.op = op, .compress = compress};
    if (!es || (compress && !(w.out = malloc(CHUNK)))) {
        free(es);
        return cti_error(CT_ERR_OOM, "%s: out of memory", op);
    }
    if (compress && deflateInit2(&w.z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -15, 8,
                                 Z_DEFAULT_STRATEGY) != Z_OK) {
        free(es);
        free(w.out);
        return cti_error(CT_ERR_OOM, "%s: out of memory starting zlib's deflate", op);
    }
    cti_tmp_sweep(path);
    char *tmp;
    if (!(st = cti_tmp_create(op, path, &tmp, &w.fd))) {
        w.tmp = tmp;
        for (int64_t i = 0; i < n && !st; i++) {
            const char *name;
            ct_tensor *t = ct_params_get(tensors, i, &name);
            st = write_member(&w, name, t, &es[i]);
        }
        if (!st) st = write_central(&w, es, n);
        st = cti_tmp_commit(op, path, tmp, w.fd, st);
    }
    if (compress) deflateEnd(&w.z);
    for (int64_t i = 0; i < n; i++) free(es[i].name);
    free(es);
    free(w.out);
    return st;
}
