/* Temporary files for atomic writes, named so that the ones a killed writer
 * left behind can be recognized and removed later without touching one that
 * a live writer is still filling.
 *
 * A temporary of "dir/name" is "dir/name.tmp-<pid>.<host>.<6 random>": the
 * writer's process id and a hash of its host name. The writer holds an
 * exclusive flock on it while it writes. A sweep removes a temporary of the
 * same target only when all of these hold: it was made on this host, its
 * process no longer exists, it is a regular file the caller owns, and its
 * lock can be taken. The pid alone is not enough (a process in another pid
 * namespace looks dead from here) and the lock alone is not either (a
 * writer holds no lock between creating and locking the file, nor between
 * closing and renaming it); together they leave a live writer alone. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "io_impl.h"

#define TMP_TAG ".tmp-"
#define RAND_LEN 6

static const char RAND_CHARS[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

uint32_t cti_tmp_host_hash(void) {
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
    uint32_t h = 2166136261u; /* FNV-1a: a tag, not a defence */
    for (const char *c = host; *c; c++) h = (h ^ (unsigned char)*c) * 16777619u;
    return h;
}

/* The directory part of path ("." when there is none) and where the file
 * name starts. */
static char *split(const char *path, const char **base) {
    const char *slash = strrchr(path, '/');
    *base = slash ? slash + 1 : path;
    if (!slash) return strdup(".");
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    char *dir = malloc(n + 1);
    if (dir) {
        memcpy(dir, path, n);
        dir[n] = '\0';
    }
    return dir;
}

/* Whether entry is "<base>.tmp-<pid>.<host>.<6 random>"; *pid and *host
 * receive its fields. */
static bool parse_name(const char *entry, const char *base, long *pid, uint32_t *host) {
    size_t bl = strlen(base), tl = strlen(TMP_TAG);
    if (strncmp(entry, base, bl) != 0 || strncmp(entry + bl, TMP_TAG, tl) != 0) return false;
    const char *p = entry + bl + tl;
    if (*p < '1' || *p > '9') return false;
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (errno || end - p > 10 || *end != '.' || v <= 0) return false;
    p = end + 1;
    uint32_t h = 0;
    for (int k = 0; k < 8; k++, p++) {
        int d = *p >= '0' && *p <= '9' ? *p - '0' : *p >= 'a' && *p <= 'f' ? *p - 'a' + 10 : -1;
        if (d < 0) return false;
        h = h << 4 | (uint32_t)d;
    }
    if (*p++ != '.') return false;
    for (int k = 0; k < RAND_LEN; k++, p++)
        if (!*p || !strchr(RAND_CHARS, *p)) return false;
    if (*p) return false;
    *pid = v;
    *host = h;
    return true;
}

void cti_tmp_sweep(const char *path) {
    const char *base;
    char *dir = split(path, &base);
    if (!dir || !*base) {
        free(dir);
        return;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(dir);
    if (dfd < 0) return;
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return;
    }
    uint32_t here = cti_tmp_host_hash();
    struct dirent *e;
    while ((e = readdir(d))) {
        long pid;
        uint32_t host;
        if (!parse_name(e->d_name, base, &pid, &host) || host != here) continue;
        if (pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        int fd = openat(dfd, e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) continue;
        struct stat sb;
        if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_uid == geteuid() &&
            flock(fd, LOCK_EX | LOCK_NB) == 0)
            unlinkat(dfd, e->d_name, 0);
        close(fd);
    }
    closedir(d);
}

/* Six characters no other call of this process has drawn lately. */
static void random_suffix(char *out) {
    static atomic_uint_fast64_t counter;
    unsigned char r[RAND_LEN];
    if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t x = (uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec << 30 ^
                     atomic_fetch_add(&counter, 0x9E3779B97F4A7C15ull);
        for (int k = 0; k < RAND_LEN; k++, x >>= 8) r[k] = (unsigned char)x;
    }
    for (int k = 0; k < RAND_LEN; k++) out[k] = RAND_CHARS[r[k] % (sizeof RAND_CHARS - 1)];
    out[RAND_LEN] = '\0';
}

ct_status cti_tmp_create(const char *op, const char *path, char **tmp, int *fd) {
    *tmp = NULL;
    *fd = -1;
    size_t plen = strlen(path);
    size_t cap = plen + sizeof TMP_TAG + 20 + 1 + 8 + 1 + RAND_LEN + 1;
    char *name = malloc(cap);
    if (!name) return cti_error(CT_ERR_OOM, "%s: out of memory", op);
    uint32_t host = cti_tmp_host_hash();
    int err = EEXIST;
    for (int attempt = 0; attempt < 100 && err == EEXIST; attempt++) {
        char r[RAND_LEN + 1];
        random_suffix(r);
        snprintf(name, cap, "%s" TMP_TAG "%ld.%08x.%s", path, (long)getpid(), host, r);
        /* 0666, so that the umask decides the mode as for any new file. */
        int f = open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (f < 0) {
            err = errno;
            continue;
        }
        /* Marks it live for sweeps; where flock is not supported the pid
         * check alone protects it. */
        flock(f, LOCK_EX | LOCK_NB);
        *tmp = name;
        *fd = f;
        return CT_OK;
    }
    ct_status st = cti_error(CT_ERR_IO, "%s: cannot create a temporary file next to '%s': %s",
                             op, path, strerror(err));
    free(name);
    return st;
}

/* Makes the rename itself durable. */
static void sync_parent_dir(const char *path) {
    char *copy = strdup(path);
    if (!copy) return;
    int dfd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    free(copy);
}

ct_status cti_tmp_commit(const char *op, const char *path, char *tmp, int fd, ct_status st) {
    if (!st && fsync(fd) != 0)
        st = cti_error(CT_ERR_IO, "%s: cannot sync '%s': %s", op, tmp, strerror(errno));
    if (close(fd) != 0 && !st)
        st = cti_error(CT_ERR_IO, "%s: cannot close '%s': %s", op, tmp, strerror(errno));
    if (!st && rename(tmp, path) != 0)
        st = cti_error(CT_ERR_IO, "%s: cannot rename '%s' to '%s': %s", op, tmp, path,
                       strerror(errno));
    if (st) unlink(tmp);
    else sync_parent_dir(path);
    free(tmp);
    return st;
}
