/* What cten-bench's parts share: host clocks, statistics over repeats, the
 * JSON writer, the multi-threaded memcpy anchor and the capture of the
 * library's trace (CT_TRACE lines on stderr) for one call. */
#ifndef CTEN_BENCH_COMMON_H
#define CTEN_BENCH_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "tensor/tensor.h"

/* ---- clocks and statistics ------------------------------------------------------------ */
double bc_now_s(void);

typedef struct bc_stats {
    double median, min, max, p10, p90; /* seconds per call */
    int n;
} bc_stats;

/* Sorts v (n >= 1) and summarizes it. */
bc_stats bc_summarize(double *v, int n);
/* Spread of the middle 80% of the repeats relative to the median, in percent. */
double bc_spread_pct(const bc_stats *s);

/* ---- CPU anchors ---------------------------------------------------------------------------
 * memcpy of bytes split over nthreads threads (the calling thread takes the
 * first part): the copy a multi-threaded CPU kernel is measured against. */
void bc_par_memcpy(void *dst, const void *src, size_t bytes, int nthreads);

/* ---- trace capture -------------------------------------------------------------------------
 * One (op, device, dtype, routine) the library's trace reported, with how
 * many times it appeared during the captured call. */
typedef struct bc_trace_entry {
    char op[40], device[16], dtype[16], routine[160];
    int calls;
} bc_trace_entry;

#define BC_TRACE_MAX 48
typedef struct bc_trace {
    bc_trace_entry e[BC_TRACE_MAX];
    int n;
    int dropped; /* distinct entries beyond BC_TRACE_MAX */
} bc_trace;

typedef ct_status (*bc_call_fn)(void *ctx);
/* Runs fn(ctx) once with the library's trace switched on and its stderr
 * lines captured into *tr (other stderr output passes through). Returns
 * fn's status. */
ct_status bc_traced_call(bc_call_fn fn, void *ctx, bc_trace *tr);
/* Parses one trace line; false when it is not one. */
bool bc_parse_trace_line(const char *line, bc_trace_entry *e);
/* The routine recorded for op (first match), or the first entry's, or "". */
const char *bc_trace_routine(const bc_trace *tr, const char *op);

/* ---- JSON output ---------------------------------------------------------------------------
 * A small streaming writer: objects and arrays nest, commas are placed by
 * the writer. Non-finite numbers are written as null. */
typedef struct bc_json {
    FILE *f;
    int depth;
    bool first[32];
    bool after_key;
} bc_json;

void bc_json_init(bc_json *j, FILE *f);
void bc_json_begin_obj(bc_json *j, const char *key); /* key NULL inside arrays / at top */
void bc_json_end_obj(bc_json *j);
void bc_json_begin_arr(bc_json *j, const char *key);
void bc_json_end_arr(bc_json *j);
void bc_json_str(bc_json *j, const char *key, const char *v); /* v NULL writes null */
void bc_json_num(bc_json *j, const char *key, double v);
void bc_json_int(bc_json *j, const char *key, long long v);
void bc_json_bool(bc_json *j, const char *key, bool v);
void bc_json_null(bc_json *j, const char *key);

/* ---- the machine -----------------------------------------------------------------------------*/
/* The CPU's model name from /proc/cpuinfo ("unknown" elsewhere). */
void bc_cpu_model(char *buf, size_t n);
/* Bytes of the largest CPU cache level the system reports (32 MiB when it reports none). */
size_t bc_cpu_cache_bytes(void);
/* Physical memory in bytes, 0 when unknown. */
uint64_t bc_total_memory(void);

#endif
