/* Shared by the fuzz targets: each defines LLVMFuzzerTestOneInput, which
 * libFuzzer drives in a -Dfuzz=true build and replay.c drives over saved
 * inputs in every build (so gcc builds run the regression inputs too). */
#ifndef CTEN_FUZZ_H
#define CTEN_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "tensor/tensor.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A property the library must keep whatever the input: a violation is a
 * finding, so it aborts for libFuzzer (and the replay test) to report. */
#define FZ_CHECK(cond, ...)                                                                 \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);        \
            fprintf(stderr, __VA_ARGS__);                                                   \
            fprintf(stderr, "\n(last error: %s)\n", ct_last_error());                       \
            abort();                                                                        \
        }                                                                                   \
    } while (0)

/* The bytes as a regular file the public load functions can open by path:
 * an in-memory file reached through /proc/self/fd (a temporary file where
 * memfd_create is missing), rewritten on every call. slot picks one of two
 * independent files. Returns its path (static storage). */
const char *fz_file(int slot, const void *data, size_t size);

/* A directory for files a target writes (on tmpfs when there is one, so
 * that the saves' fsyncs cost little), created once per process. */
const char *fz_dir(void);

#endif
