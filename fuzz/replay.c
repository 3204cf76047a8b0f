/* Runs saved inputs through a fuzz target's entry point without libFuzzer,
 * so that every build (gcc too, sanitized or not) checks them: each
 * argument is a file or a directory whose files (not dot files) are run in
 * name order. A missing argument path is an error, an empty directory is
 * not (a target may have no regression inputs yet). */
#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open '%s': %s\n", path, strerror(errno));
        return 1;
    }
    size_t cap = 4096, n = 0;
    unsigned char *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            unsigned char *b = realloc(buf, cap *= 2);
            if (!b) free(buf);
            buf = b;
        }
    }
    int err = ferror(f);
    fclose(f);
    if (!buf || err) {
        fprintf(stderr, "replay: cannot read '%s'\n", path);
        free(buf);
        return 1;
    }
    fprintf(stderr, "replay: %s (%zu bytes)\n", path, n);
    /* An exact-size copy, so that ASan sees a read past the input. */
    unsigned char *exact = malloc(n ? n : 1);
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_path(const char *path, int *count) {
    struct stat sb;
    if (stat(path, &sb) != 0) {
        fprintf(stderr, "replay: '%s': %s\n", path, strerror(errno));
        return 1;
    }
    if (!S_ISDIR(sb.st_mode)) {
        (*count)++;
        return run_file(path);
    }
    DIR *d = opendir(path);
    if (!d) {
        fprintf(stderr, "replay: cannot open '%s': %s\n", path, strerror(errno));
        return 1;
    }
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char **nn = realloc(names, (n + 1) * sizeof *names);
        if (!nn) break;
        names = nn;
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_names);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", path, names[i]);
        rc |= run_path(p, count);
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE_OR_DIR...\n", argv[0]);
        return 2;
    }
    int rc = 0, count = 0;
    for (int i = 1; i < argc; i++) rc |= run_path(argv[i], &count);
    fprintf(stderr, "replay: %d inputs, %s\n", count, rc ? "errors" : "ok");
    return rc;
}
