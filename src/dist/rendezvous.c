/* The rendezvous file of a launch without MPI (RANK/WORLD_SIZE from the
 * environment), on a path every rank sees (a shared file system across
 * machines). It carries one thing, rank 0's blob (NCCL's id), and tells
 * rank 0 that everyone has it:
 *
 *   rank 0   writes  <path>            "cten-rendezvous 1\nrun R\nworld W\n<blob>\n"
 *                                      (a temporary file renamed over it, so readers see
 *                                      a whole file, and a leftover of an earlier run is
 *                                      replaced), R a fresh random run id;
 *   rank r   reads   <path>, then writes <path>.rank<r> holding "run R";
 *   rank 0   waits for every <path>.rank<r> of run R, then removes them and <path>;
 *   rank r   waits for <path> to go away (or to name another run: it joins that one).
 *
 * So a finished rendezvous leaves no file behind, and a stale one (of a run
 * whose rank 0 died) cannot capture the ranks: they acknowledge it but only
 * finish when a rank 0 removes the file it wrote; a new rank 0 replaces the
 * stale file and the ranks follow the new run. A rank that never sees its
 * run confirmed within the timeout fails saying what it found. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dist_impl.h"

#define MAGIC "cten-rendezvous 1\n"

typedef struct rdv_file {
    uint64_t run;
    int world;
    char *blob; /* malloc'ed */
} rdv_file;

static char *path_of(const char *path, int rank) {
    size_t n = strlen(path) + 32;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s.rank%d", path, rank);
    return p;
}

/* The whole file, NUL-terminated, or NULL (errno ENOENT when absent). */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1024, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - 1 - n, f);
        if (n < cap - 1) break;
        char *b = realloc(buf, cap * 2);
        if (!b) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = b;
        cap *= 2;
    }
    fclose(f);
    if (buf) buf[n] = '\0';
    return buf;
}

/* Writes text to path through a temporary file renamed over it. */
static ct_status write_atomic(const char *op, const char *path, const char *text) {
    size_t n = strlen(path) + 32;
    char *tmp = malloc(n);
    if (!tmp) return cti_error(CT_ERR_OOM, "%s: out of memory", op);
    snprintf(tmp, n, "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    bool ok = f && fputs(text, f) >= 0;
    if (f && fclose(f) != 0) ok = false;
    if (ok && rename(tmp, path) != 0) ok = false;
    ct_status st = CT_OK;
    if (!ok) {
        st = cti_error(CT_ERR_IO, "%s: cannot write the rendezvous file %s: %s", op, path,
                       strerror(errno));
        unlink(tmp);
    }
    free(tmp);
    return st;
}

/* 1 parsed, 0 not a rendezvous file. */
static int parse(const char *text, rdv_file *out) {
    out->blob = NULL;
    if (strncmp(text, MAGIC, strlen(MAGIC)) != 0) return 0;
    const char *p = text + strlen(MAGIC);
    int used = 0;
    if (sscanf(p, "run %" SCNx64 "\nworld %d\n%n", &out->run, &out->world, &used) != 2 || !used)
        return 0;
    p += used;
    size_t len = strlen(p);
    if (len && p[len - 1] == '\n') len--;
    out->blob = malloc(len + 1);
    if (!out->blob) return 0;
    memcpy(out->blob, p, len);
    out->blob[len] = '\0';
    return 1;
}

static uint64_t fresh_run_id(void) {
    uint64_t r = 0;
    int fd = open("/dev/urandom", O_RDONLY);
    if (fd >= 0) {
        if (read(fd, &r, sizeof r) != (ssize_t)sizeof r) r = 0;
        close(fd);
    }
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return r ^ ((uint64_t)t.tv_nsec << 20) ^ (uint64_t)t.tv_sec ^ ((uint64_t)getpid() << 40) ^ 1;
}

static bool acked(const char *ack_path, uint64_t run) {
    char *t = slurp(ack_path);
    uint64_t r = 0;
    bool ok = t && sscanf(t, "run %" SCNx64, &r) == 1 && r == run;
    free(t);
    return ok;
}

static ct_status rank0(const char *op, const char *path, int world, double timeout_s,
                       const char *blob) {
    uint64_t run = fresh_run_id();
    size_t n = strlen(blob) + 128;
    char *text = malloc(n);
    char **acks = calloc((size_t)world, sizeof *acks);
    bool *seen = calloc((size_t)world, sizeof *seen);
    ct_status st = CT_OK;
    if (!text || !acks || !seen) {
        st = cti_error(CT_ERR_OOM, "%s: out of memory", op);
        goto done;
    }
    for (int r = 1; r < world; r++)
        if (!(acks[r] = path_of(path, r))) {
            st = cti_error(CT_ERR_OOM, "%s: out of memory", op);
            goto done;
        }
    snprintf(text, n, MAGIC "run %016" PRIx64 "\nworld %d\n%s\n", run, world, blob);
    if ((st = write_atomic(op, path, text)) != CT_OK) goto done;
    double deadline = cti_dist_now() + timeout_s;
    int missing = world - 1, spins = CTI_DIST_SLEEP_SPINS;
    while (missing > 0) {
        for (int r = 1; r < world; r++)
            if (!seen[r] && acked(acks[r], run)) {
                seen[r] = true;
                missing--;
            }
        if (missing == 0) break;
        if (cti_dist_now() > deadline) {
            char list[256] = "";
            size_t at = 0;
            for (int r = 1; r < world && at < sizeof list - 16; r++)
                if (!seen[r])
                    at += (size_t)snprintf(list + at, sizeof list - at, "%s%d", at ? ", " : "", r);
            st = cti_error(CT_ERR_RUNTIME,
                           "%s: rendezvous at %s: %d of %d ranks did not join within %g s "
                           "(missing: %s%s)",
                           op, path, missing, world - 1, timeout_s, list,
                           at >= sizeof list - 16 ? ", ..." : "");
            break;
        }
        cti_dist_backoff(&spins);
    }
    /* Removing the file is the signal that the run is confirmed; after a
     * failure it keeps a stale file from holding the next launch. */
    unlink(path);
    for (int r = 1; r < world; r++)
        if (acks[r]) unlink(acks[r]);
done:
    if (acks)
        for (int r = 1; r < world; r++) free(acks[r]);
    free(acks);
    free(seen);
    free(text);
    return st;
}

static ct_status other_rank(const char *op, const char *path, int rank, int world,
                            double timeout_s, char *blob, size_t blob_n) {
    char *ack = path_of(path, rank);
    if (!ack) return cti_error(CT_ERR_OOM, "%s: out of memory", op);
    double deadline = cti_dist_now() + timeout_s;
    uint64_t joined = 0; /* the run acknowledged, 0 for none */
    bool have = false;
    int other_world = 0, spins = CTI_DIST_SLEEP_SPINS;
    ct_status st = CT_OK;
    for (;;) {
        char *text = slurp(path);
        if (!text && errno != ENOENT) {
            st = cti_error(CT_ERR_IO, "%s: cannot read the rendezvous file %s: %s", op, path,
                           strerror(errno));
            break;
        }
        if (!text && joined) break; /* rank 0 confirmed our run */
        rdv_file f = {0};
        if (text && !parse(text, &f)) {
            free(text);
            st = cti_error(CT_ERR_FORMAT,
                           "%s: %s is not a cten rendezvous file (it does not start with "
                           "\"cten-rendezvous 1\"); remove it or name another path",
                           op, path);
            break;
        }
        free(text);
        if (text && f.world != world) {
            /* A stale file of a launch of another size: wait for ours. */
            other_world = f.world;
        } else if (text && f.run != joined) {
            snprintf(blob, blob_n, "%s", f.blob);
            char line[64];
            snprintf(line, sizeof line, "run %016" PRIx64 "\n", f.run);
            if ((st = write_atomic(op, ack, line)) != CT_OK) {
                free(f.blob);
                break;
            }
            joined = f.run;
            have = true;
        }
        free(f.blob);
        if (cti_dist_now() > deadline) {
            if (joined)
                st = cti_error(CT_ERR_RUNTIME,
                               "%s: rank %d: the rendezvous file %s (run %016" PRIx64
                               ") was not confirmed by its rank 0 within %g s: a stale file of an "
                               "earlier launch, with this launch's rank 0 not started?",
                               op, rank, path, joined, timeout_s);
            else if (other_world)
                st = cti_error(CT_ERR_RUNTIME,
                               "%s: rank %d: the rendezvous file %s is for world size %d, not %d, "
                               "and no file of this launch appeared within %g s (a stale file?)",
                               op, rank, path, other_world, world, timeout_s);
            else
                st = cti_error(CT_ERR_RUNTIME,
                               "%s: rank %d: the rendezvous file %s did not appear within %g s "
                               "(rank 0 writes it)",
                               op, rank, path, timeout_s);
            break;
        }
        cti_dist_backoff(&spins);
    }
    if (st != CT_OK && have) unlink(ack);
    free(ack);
    return st;
}

ct_status cti_rendezvous(const char *op, const char *path, int rank, int world, double timeout_s,
                         char *blob, size_t n) {
    if (world == 1) return CT_OK;
    if (rank == 0) return rank0(op, path, world, timeout_s, blob);
    return other_rank(op, path, rank, world, timeout_s, blob, n);
}
