/* Replays fuzz inputs through a target's entry point without libFuzzer, so
 * the normal test suite (any compiler, with or without sanitizers) reruns
 * every input that once found a bug:
 *
 *   op_program_replay FILE_OR_DIR...
 *
 * Each file is read whole and passed to LLVMFuzzerTestOneInput once; a
 * directory contributes its regular files in name order. A finding aborts, as
 * it does under the fuzzer, which fails the test. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CTI_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define CTI_SANITIZED 1
#endif
#endif

static int replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return 1;
    }
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? cap * 2 : 4096;
            uint8_t *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                fprintf(stderr, "replay: out of memory reading %s\n", path);
                return 1;
            }
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    fclose(f);
    fprintf(stderr, "replay: %s (%zu bytes)\n", path, len);
    LLVMFuzzerTestOneInput(buf, len);
    free(buf);
    return 0;
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int replay_dir(const char *dir, int *count) {
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "replay: cannot open directory %s\n", dir);
        return 1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    int bad = 0;
    for (struct dirent *de; (de = readdir(d));) {
        if (de->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) {
                bad = 1;
                break;
            }
            names = nn;
        }
        size_t len = strlen(dir) + strlen(de->d_name) + 2;
        names[n] = malloc(len);
        if (!names[n]) {
            bad = 1;
            break;
        }
        snprintf(names[n++], len, "%s/%s", dir, de->d_name);
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, by_name);
    for (size_t k = 0; k < n; k++) {
        struct stat st;
        if (!bad && stat(names[k], &st) == 0 && S_ISREG(st.st_mode)) {
            bad |= replay_file(names[k]);
            ++*count;
        }
        free(names[k]);
    }
    free(names);
    return bad;
}

int main(int argc, char **argv) {
#ifndef CTI_SANITIZED
    /* A replayed program may ask for a huge but valid tensor; capping the
     * address space makes that fail as out of memory, as the fuzzer's
     * allocation limit did, instead of exhausting the machine. (Sanitizer
     * builds reserve terabytes of shadow and rely on their own limit.) */
    unsigned long long pages = 0;
    FILE *statm = fopen("/proc/self/statm", "r");
    if (statm) {
        if (fscanf(statm, "%llu", &pages) != 1) pages = 0;
        fclose(statm);
    }
    /* On top of what is mapped already (thread stacks and arenas scale with
     * the machine's cores). */
    rlim_t cap = (rlim_t)pages * 4096 + ((rlim_t)4 << 30);
    struct rlimit rl = {cap, cap};
    setrlimit(RLIMIT_AS, &rl);
#endif
    int bad = 0, count = 0;
    for (int k = 1; k < argc; k++) {
        struct stat st;
        if (stat(argv[k], &st) != 0) {
            fprintf(stderr, "replay: %s does not exist\n", argv[k]);
            bad = 1;
        } else if (S_ISDIR(st.st_mode)) {
            bad |= replay_dir(argv[k], &count);
        } else {
            bad |= replay_file(argv[k]);
            count++;
        }
    }
    fprintf(stderr, "replay: %d inputs\n", count);
    return bad;
}
