/* Host clocks, statistics, the threaded memcpy anchor, trace capture and the
 * JSON writer of cten-bench. */
#include "bench_common.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double bc_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Linear interpolation between the order statistics of sorted v. */
static double quantile(const double *v, int n, double q) {
    double pos = q * (n - 1);
    int lo = (int)floor(pos), hi = lo + 1 < n ? lo + 1 : lo;
    return v[lo] + (pos - lo) * (v[hi] - v[lo]);
}

bc_stats bc_summarize(double *v, int n) {
    bc_stats s = {0};
    if (n < 1) return s;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    s.n = n;
    s.min = v[0];
    s.max = v[n - 1];
    s.median = quantile(v, n, 0.5);
    s.p10 = quantile(v, n, 0.1);
    s.p90 = quantile(v, n, 0.9);
    return s;
}

double bc_spread_pct(const bc_stats *s) {
    return s->median > 0 ? 100.0 * (s->p90 - s->p10) / s->median : 0.0;
}

/* ---- threaded memcpy ---------------------------------------------------------------------- */
typedef struct copy_part {
    char *dst;
    const char *src;
    size_t bytes;
} copy_part;

static void *copy_part_run(void *arg) {
    copy_part *p = arg;
    memcpy(p->dst, p->src, p->bytes);
    return NULL;
}

#define MAX_COPY_THREADS 256

void bc_par_memcpy(void *dst, const void *src, size_t bytes, int nthreads) {
    if (nthreads > MAX_COPY_THREADS) nthreads = MAX_COPY_THREADS;
    /* Threads only pay off on copies far larger than their start-up. */
    if (nthreads < 2 || bytes < ((size_t)4 << 20)) {
        memcpy(dst, src, bytes);
        return;
    }
    copy_part parts[MAX_COPY_THREADS];
    pthread_t th[MAX_COPY_THREADS];
    bool started[MAX_COPY_THREADS] = {false};
    size_t chunk = (bytes / (size_t)nthreads + 63) & ~(size_t)63, off = 0;
    int n = 0;
    for (; n < nthreads && off < bytes; n++) {
        size_t len = bytes - off < chunk ? bytes - off : chunk;
        parts[n] = (copy_part){(char *)dst + off, (const char *)src + off, len};
        off += len;
    }
    for (int i = 1; i < n; i++)
        started[i] = pthread_create(&th[i], NULL, copy_part_run, &parts[i]) == 0;
    copy_part_run(&parts[0]);
    for (int i = 1; i < n; i++) {
        if (started[i])
            pthread_join(th[i], NULL);
        else
            copy_part_run(&parts[i]); /* no thread to be had: copy that part here */
    }
}

/* ---- trace capture ----------------------------------------------------------------------- */
bool bc_parse_trace_line(const char *line, bc_trace_entry *e) {
    static const char prefix[] = "[cten] ";
    if (strncmp(line, prefix, sizeof prefix - 1) != 0) return false;
    memset(e, 0, sizeof *e);
    if (sscanf(line + sizeof prefix - 1, "%39s %15s %15s", e->op, e->device, e->dtype) != 3)
        return false;
    const char *k = strstr(line, " kernel=");
    if (!k) return false;
    k += strlen(" kernel=");
    /* The routine runs up to the last " <time> us" (which a " FAILED" may follow). */
    const char *end = k + strlen(k);
    while (end > k && (end[-1] == '\n' || end[-1] == '\r')) end--;
    const char *us = NULL;
    for (const char *p = k; (p = strstr(p, " us")) && p < end; p++) us = p;
    if (us) {
        const char *num = us;
        while (num > k && num[-1] != ' ') num--;
        if (num > k) end = num - 1;
    }
    size_t len = (size_t)(end - k);
    if (len >= sizeof e->routine) len = sizeof e->routine - 1;
    memcpy(e->routine, k, len);
    e->routine[len] = '\0';
    e->calls = 1;
    return true;
}

static void trace_add(bc_trace *tr, const bc_trace_entry *e) {
    for (int i = 0; i < tr->n; i++) {
        bc_trace_entry *x = &tr->e[i];
        if (!strcmp(x->op, e->op) && !strcmp(x->device, e->device) && !strcmp(x->dtype, e->dtype) &&
            !strcmp(x->routine, e->routine)) {
            x->calls++;
            return;
        }
    }
    if (tr->n < BC_TRACE_MAX)
        tr->e[tr->n++] = *e;
    else
        tr->dropped++;
}

ct_status bc_traced_call(bc_call_fn fn, void *ctx, bc_trace *tr) {
    memset(tr, 0, sizeof *tr);
    bool was_on = ct_trace_enabled();
    fflush(stderr);
    FILE *tmp = tmpfile();
    int saved = tmp ? dup(STDERR_FILENO) : -1;
    if (saved < 0 || dup2(fileno(tmp), STDERR_FILENO) < 0) {
        /* Nowhere to capture to: run untraced, the record just has no trace. */
        if (saved >= 0) close(saved);
        if (tmp) fclose(tmp);
        return fn(ctx);
    }
    ct_set_trace(true);
    ct_status st = fn(ctx);
    ct_set_trace(was_on);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    rewind(tmp);
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, tmp) > 0) {
        bc_trace_entry e;
        if (bc_parse_trace_line(line, &e))
            trace_add(tr, &e);
        else
            fputs(line, stderr);
    }
    free(line);
    fclose(tmp);
    return st;
}

const char *bc_trace_routine(const bc_trace *tr, const char *op) {
    for (int i = 0; op && i < tr->n; i++)
        if (!strcmp(tr->e[i].op, op)) return tr->e[i].routine;
    return tr->n ? tr->e[0].routine : "";
}

/* ---- JSON ------------------------------------------------------------------------------------ */
void bc_json_init(bc_json *j, FILE *f) {
    memset(j, 0, sizeof *j);
    j->f = f;
    j->first[0] = true;
}

static void indent(bc_json *j) {
    fputc('\n', j->f);
    for (int i = 0; i < j->depth; i++) fputs("  ", j->f);
}

static void put_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", f);
        else if (*p == '\t')
            fputs("\\t", f);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

/* The separator, indentation and key before a value. */
static void member(bc_json *j, const char *key) {
    if (j->depth > 0) {
        if (!j->first[j->depth]) fputc(',', j->f);
        indent(j);
    }
    j->first[j->depth] = false;
    if (key) {
        put_string(j->f, key);
        fputs(": ", j->f);
    }
}

static void open_container(bc_json *j, const char *key, char c) {
    member(j, key);
    fputc(c, j->f);
    if (j->depth + 1 < (int)(sizeof j->first / sizeof j->first[0])) j->depth++;
    j->first[j->depth] = true;
}

static void close_container(bc_json *j, char c) {
    bool empty = j->first[j->depth];
    if (j->depth > 0) j->depth--;
    if (!empty) indent(j);
    fputc(c, j->f);
    if (j->depth == 0) fputc('\n', j->f);
}

void bc_json_begin_obj(bc_json *j, const char *key) { open_container(j, key, '{'); }
void bc_json_end_obj(bc_json *j) { close_container(j, '}'); }
void bc_json_begin_arr(bc_json *j, const char *key) { open_container(j, key, '['); }
void bc_json_end_arr(bc_json *j) { close_container(j, ']'); }

void bc_json_str(bc_json *j, const char *key, const char *v) {
    member(j, key);
    if (v)
        put_string(j->f, v);
    else
        fputs("null", j->f);
}

void bc_json_num(bc_json *j, const char *key, double v) {
    member(j, key);
    if (isfinite(v))
        fprintf(j->f, "%.12g", v);
    else
        fputs("null", j->f);
}

void bc_json_int(bc_json *j, const char *key, long long v) {
    member(j, key);
    fprintf(j->f, "%lld", v);
}

void bc_json_bool(bc_json *j, const char *key, bool v) {
    member(j, key);
    fputs(v ? "true" : "false", j->f);
}

void bc_json_null(bc_json *j, const char *key) {
    member(j, key);
    fputs("null", j->f);
}

/* ---- the machine ----------------------------------------------------------------------------- */
void bc_cpu_model(char *buf, size_t n) {
    snprintf(buf, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        const char *v = strchr(line, ':');
        if (!v) continue;
        v++;
        while (*v == ' ' || *v == '\t') v++;
        snprintf(buf, n, "%s", v);
        buf[strcspn(buf, "\n")] = '\0';
        break;
    }
    fclose(f);
}

size_t bc_cpu_cache_bytes(void) {
    long best = 0;
#ifdef _SC_LEVEL3_CACHE_SIZE
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (l3 > best) best = l3;
#endif
#ifdef _SC_LEVEL2_CACHE_SIZE
    long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (l2 > best) best = l2;
#endif
    return best > 0 ? (size_t)best : (size_t)32 << 20;
}

uint64_t bc_total_memory(void) {
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
}
