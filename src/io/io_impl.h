/* Private: helpers shared by the file readers and writers: whole-buffer
 * reads and writes on descriptors, UTF-8 validation and the small strict JSON
 * lexer the safetensors header parser is built on. */
#ifndef CTEN_IO_IMPL_H
#define CTEN_IO_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/tensor_impl.h"
#include "tensor/io.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "cten's file formats are read and written for little-endian hosts"
#endif

/* Reads up to n bytes, retrying short reads and EINTR; *got receives the
 * count (less than n only at end of file). false on a read error (errno set). */
bool cti_read_full(int fd, void *buf, size_t n, size_t *got);
/* Writes all n bytes; false on error (errno set). */
bool cti_write_full(int fd, const void *buf, size_t n);

/* Temporary files for atomic writes (tmpfile.c). cti_tmp_create makes
 * "<path>.tmp-<pid>.<host>.<random>" (mode 0666 less the umask, locked while
 * it is written): *tmp receives its name (caller frees) and *fd the open
 * descriptor. cti_tmp_sweep removes the temporaries of path that writers
 * which no longer run left behind (killed mid-write), leaving those of live
 * writers; it reports nothing, as a sweep that cannot run changes nothing. */
ct_status cti_tmp_create(const char *op, const char *path, char **tmp, int *fd);
void cti_tmp_sweep(const char *path);
/* Ends a write to a temporary of cti_tmp_create: when st is CT_OK, syncs
 * fd, closes it, renames tmp over path and syncs the directory; otherwise,
 * or when one of those fails, closes fd and removes tmp. Frees tmp; returns
 * st or the first failure (CT_ERR_IO naming op). */
ct_status cti_tmp_commit(const char *op, const char *path, char *tmp, int fd, ct_status st);
/* The host tag in temporary names (a hash of the host name). */
uint32_t cti_tmp_host_hash(void);

/* ---- .npy (npy.c), shared with the .npz reader and writer (npz.c) ---------------------------
 * A source of bytes: read fills up to n bytes, *got receiving the count
 * (less than n only at its end); on a failure it sets the error itself
 * (naming op and the file) and returns its status. */
typedef struct cti_npy_source {
    ct_status (*read)(void *ctx, void *buf, size_t n, size_t *got);
    void *ctx;
} cti_npy_source;
/* Reads one .npy of exactly size bytes from src into a new CPU tensor
 * (registered in the current scope; Fortran order gives column-major
 * strides). where names the bytes in messages ("'a.npy'", "'a.npz' member
 * 'x.npy'"). The header is validated against size before anything is
 * allocated for the data; malformed bytes, a dtype cten lacks included,
 * are CT_ERR_FORMAT. */
ct_tensor *cti_npy_read(const char *op, const char *where, int64_t size, cti_npy_source src);

/* A tensor laid out for writing as .npy: the header (magic to newline) and
 * the data bytes in file order (t's own memory, or a staging copy). */
typedef struct cti_npy_out {
    char header[256];
    size_t header_len;
    const void *data;
    size_t nbytes;
    void *staged; /* freed by cti_npy_out_free */
} cti_npy_out;
ct_status cti_npy_prepare(const char *op, ct_tensor *t, cti_npy_out *o);
void cti_npy_out_free(cti_npy_out *o);

/* Whether s[0..n) is well-formed UTF-8 (no overlong forms, surrogates or
 * code points above U+10FFFF). */
bool cti_utf8_valid(const char *s, size_t n);

/* A cursor over a JSON text. Every function skips leading whitespace and,
 * on failure, writes a message naming the byte offset into err. */
typedef struct cti_json {
    const char *begin, *p, *end;
    char err[320];
} cti_json;

void cti_json_init(cti_json *j, const char *text, size_t n);
/* Skips whitespace; true (consuming it) when the next character is c. */
bool cti_json_accept(cti_json *j, char c);
/* Skips whitespace; consumes c or fails with "expected <what>". */
bool cti_json_expect(cti_json *j, char c, const char *what);
/* A string into a new NUL-terminated buffer (caller frees): escapes decoded,
 * raw bytes and \u escapes checked to form valid UTF-8, \u0000 refused. */
bool cti_json_string(cti_json *j, char **out);
/* A non-negative integer without sign, fraction or exponent, <= INT64_MAX. */
bool cti_json_uint(cti_json *j, int64_t *out);
/* Skips whitespace; true when only whitespace is left. */
bool cti_json_at_end(cti_json *j);
/* Sets err to "at byte <offset>: <message>". */
bool cti_json_fail(cti_json *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
