/* Descriptor I/O, UTF-8 validation and a strict JSON lexer (RFC 8259): the
 * pieces the safetensors header parser needs, with no recursion, so no input
 * can exhaust the stack. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "io_impl.h"

/* read/write move at most this much per call (Linux caps a call near 2 GiB). */
#define IO_MAX_CALL ((size_t)1 << 30)

bool cti_read_full(int fd, void *buf, size_t n, size_t *got) {
    char *p = buf;
    size_t done = 0;
    while (done < n) {
        size_t want = n - done < IO_MAX_CALL ? n - done : IO_MAX_CALL;
        ssize_t r = read(fd, p + done, want);
        if (r < 0) {
            if (errno == EINTR) continue;
            *got = done;
            return false;
        }
        if (r == 0) break;
        done += (size_t)r;
    }
    *got = done;
    return true;
}

bool cti_write_full(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        size_t want = n < IO_MAX_CALL ? n : IO_MAX_CALL;
        ssize_t r = write(fd, p, want);
        if (r < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        p += r;
        n -= (size_t)r;
    }
    return true;
}

/* Length of the UTF-8 sequence at s (at most n bytes available), 0 if it is
 * malformed. The ranges are Unicode's Table 3-7 of well-formed sequences. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F; /* above U+10FFFF */
    } else {
        return 0;
    }
    if (n < len) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t k = 2; k < len; k++)
        if (s[k] < 0x80 || s[k] > 0xBF) return 0;
    return len;
}

bool cti_utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t len = utf8_seq(u + i, n - i);
        if (!len) return false;
        i += len;
    }
    return true;
}

void cti_json_init(cti_json *j, const char *text, size_t n) {
    j->begin = j->p = text;
    j->end = text + n;
    j->err[0] = '\0';
}

bool cti_json_fail(cti_json *j, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(j->err, sizeof j->err, "at byte %lld: %s", (long long)(j->p - j->begin), msg);
    return false;
}

static void skip_ws(cti_json *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

/* What the cursor sees, for messages. */
static const char *seen(const cti_json *j) {
    if (j->p >= j->end) return "the end of the header";
    switch (*j->p) {
    case '{': return "'{'";
    case '}': return "'}'";
    case '[': return "'['";
    case ']': return "']'";
    case '"': return "a string";
    case ',': return "','";
    case ':': return "':'";
    case '-': return "'-'";
    default: break;
    }
    if (*j->p >= '0' && *j->p <= '9') return "a number";
    if (*j->p == 't' || *j->p == 'f' || *j->p == 'n') return "a literal";
    return "an unexpected character";
}

bool cti_json_accept(cti_json *j, char c) {
    skip_ws(j);
    if (j->p < j->end && *j->p == c) {
        j->p++;
        return true;
    }
    return false;
}

bool cti_json_expect(cti_json *j, char c, const char *what) {
    if (cti_json_accept(j, c)) return true;
    return cti_json_fail(j, "expected %s, found %s", what, seen(j));
}

bool cti_json_at_end(cti_json *j) {
    skip_ws(j);
    return j->p == j->end;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Four hex digits after "\u" at j->p. */
static bool read_u16(cti_json *j, unsigned *out) {
    if (j->end - j->p < 4) return cti_json_fail(j, "truncated \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        int d = hex_digit(j->p[k]);
        if (d < 0) return cti_json_fail(j, "bad hex digit in \\u escape");
        v = v << 4 | (unsigned)d;
    }
    j->p += 4;
    *out = v;
    return true;
}

static size_t put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decodes the escape after a backslash (j->p just past it) into o. */
static bool read_escape(cti_json *j, char *o, size_t *len) {
    if (j->p >= j->end) return cti_json_fail(j, "unterminated string");
    char c = *j->p++;
    switch (c) {
    case '"': case '\\': case '/': *o = c; *len = 1; return true;
    case 'b': *o = '\b'; *len = 1; return true;
    case 'f': *o = '\f'; *len = 1; return true;
    case 'n': *o = '\n'; *len = 1; return true;
    case 'r': *o = '\r'; *len = 1; return true;
    case 't': *o = '\t'; *len = 1; return true;
    case 'u': break;
    default: j->p--; return cti_json_fail(j, "invalid escape '\\%c'", c);
    }
    unsigned cp;
    if (!read_u16(j, &cp)) return false;
    if (cp >= 0xDC00 && cp <= 0xDFFF) return cti_json_fail(j, "lone low surrogate in \\u escape");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
        unsigned lo;
        if (j->end - j->p < 2 || j->p[0] != '\\' || j->p[1] != 'u')
            return cti_json_fail(j, "high surrogate without its low half");
        j->p += 2;
        if (!read_u16(j, &lo)) return false;
        if (lo < 0xDC00 || lo > 0xDFFF)
            return cti_json_fail(j, "high surrogate without its low half");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    }
    if (cp == 0) return cti_json_fail(j, "\\u0000 in a string");
    *len = put_utf8(o, cp);
    return true;
}

bool cti_json_string(cti_json *j, char **out) {
    *out = NULL;
    if (!cti_json_expect(j, '"', "a string")) return false;
    /* Find the closing quote first so the buffer fits this string, not the
     * rest of the header; decoded text is never longer than its source. */
    const char *q = j->p;
    while (q < j->end && *q != '"') {
        if (*q == '\\' && j->end - q < 2) break;
        q += *q == '\\' ? 2 : 1;
    }
    if (q >= j->end || *q != '"') return cti_json_fail(j, "unterminated string");
    char *buf = malloc((size_t)(q - j->p) + 1);
    if (!buf) return cti_json_fail(j, "out of memory");
    size_t n = 0;
    while (j->p < q) {
        unsigned char c = (unsigned char)*j->p;
        if (c == '\\') {
            j->p++;
            size_t len = 0;
            if (!read_escape(j, buf + n, &len)) goto fail;
            n += len;
        } else if (c < 0x20) {
            cti_json_fail(j, "control character 0x%02x in a string", c);
            goto fail;
        } else {
            size_t len = utf8_seq((const unsigned char *)j->p, (size_t)(j->end - j->p));
            if (!len) {
                cti_json_fail(j, "invalid UTF-8 in a string");
                goto fail;
            }
            memcpy(buf + n, j->p, len);
            n += len;
            j->p += len;
        }
    }
    /* Escapes and multi-byte sequences never contain '"', so decoding ends
     * exactly at the quote the scan found. */
    j->p = q + 1;
    buf[n] = '\0';
    *out = buf;
    return true;
fail:
    free(buf);
    return false;
}

bool cti_json_uint(cti_json *j, int64_t *out) {
    skip_ws(j);
    if (j->p < j->end && *j->p == '-') return cti_json_fail(j, "negative number");
    if (j->p >= j->end || *j->p < '0' || *j->p > '9')
        return cti_json_fail(j, "expected a non-negative integer, found %s", seen(j));
    const char *start = j->p;
    int64_t v = 0;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        int d = *j->p - '0';
        if (v > (INT64_MAX - d) / 10) return cti_json_fail(j, "integer too large");
        v = v * 10 + d;
        j->p++;
    }
    if (j->p - start > 1 && *start == '0') {
        j->p = start;
        return cti_json_fail(j, "integer with a leading zero");
    }
    if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E'))
        return cti_json_fail(j, "expected an integer, found a fraction or exponent");
    *out = v;
    return true;
}
