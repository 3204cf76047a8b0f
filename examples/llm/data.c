/* Text, tokens and batches; see data.h. */
#include "data.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void lm_text_free(lm_text *t) {
    free(t->tokens);
    t->tokens = NULL;
    t->n = 0;
}

/* Appends the file at path to out (tokens grown with realloc). */
static bool append_file(const char *path, lm_text *out, char *why, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(why, n, "cannot open %s: %s", path, strerror(errno));
        return false;
    }
    bool ok = true;
    uint8_t buf[1 << 16];
    size_t got;
    while (ok && (got = fread(buf, 1, sizeof buf, f)) > 0) {
        uint8_t *grown = realloc(out->tokens, (size_t)out->n + got);
        if (!grown) {
            snprintf(why, n, "out of memory reading %s", path);
            ok = false;
            break;
        }
        memcpy(grown + out->n, buf, got);
        out->tokens = grown;
        out->n += (int64_t)got;
    }
    if (ok && ferror(f)) {
        snprintf(why, n, "cannot read %s: %s", path, strerror(errno));
        ok = false;
    }
    fclose(f);
    return ok;
}

bool lm_text_load_file(const char *path, lm_text *out, char *why, size_t n) {
    memset(out, 0, sizeof *out);
    if (append_file(path, out, why, n)) return true;
    lm_text_free(out);
    return false;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

bool lm_text_load_dir(const char *dir, lm_text *out, char *why, size_t n) {
    memset(out, 0, sizeof *out);
    DIR *d = opendir(dir);
    if (!d) {
        snprintf(why, n, "cannot open the directory %s: %s", dir, strerror(errno));
        return false;
    }
    char **names = NULL;
    size_t count = 0;
    bool ok = true;
    struct dirent *e;
    while (ok && (e = readdir(d))) {
        if (e->d_name[0] == '.' || ends_with(e->d_name, ".dat") || ends_with(e->d_name, ".u8"))
            continue;
        char **grown = realloc(names, (count + 1) * sizeof *names);
        char *name = grown ? strdup(e->d_name) : NULL;
        if (grown) names = grown;
        if (!name) ok = false;
        else names[count++] = name;
    }
    closedir(d);
    if (!ok) snprintf(why, n, "out of memory listing %s", dir);
    /* readdir's order is the file system's: sorted, the text is the same
     * everywhere (qsort takes no NULL array, even of none) */
    if (count > 1) qsort(names, count, sizeof *names, by_name);
    for (size_t i = 0; i < count && ok; i++) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) ok = append_file(path, out, why, n);
    }
    for (size_t i = 0; i < count; i++) free(names[i]);
    free(names);
    if (ok && out->n == 0) {
        snprintf(why, n, "no text files in %s", dir);
        ok = false;
    }
    if (!ok) lm_text_free(out);
    return ok;
}

bool lm_text_load(const char *path, lm_text *out, char *why, size_t n) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return lm_text_load_dir(path, out, why, n);
    return lm_text_load_file(path, out, why, n);
}

bool lm_split(const lm_text *text, double val_fraction, int64_t context, lm_text *train,
              lm_text *val, char *why, size_t n) {
    int64_t nval = (int64_t)((double)text->n * val_fraction);
    int64_t ntrain = text->n - nval;
    if (!(val_fraction > 0 && val_fraction < 1) || ntrain < context + 1 || nval < context + 1) {
        snprintf(why, n,
                 "%lld tokens split %g for validation leave %lld and %lld tokens; each part "
                 "needs a window of %lld",
                 (long long)text->n, val_fraction, (long long)ntrain, (long long)nval,
                 (long long)(context + 1));
        return false;
    }
    *train = (lm_text){text->tokens, ntrain};
    *val = (lm_text){text->tokens + ntrain, nval};
    return true;
}

void lm_draw_starts(const lm_text *text, int64_t context, int64_t batch, ct_generator *gen,
                    int64_t *starts) {
    uint64_t range = (uint64_t)(text->n - context); /* starts 0 .. n - context - 1 */
    bool wide = range > UINT32_MAX;
    uint64_t first = ct_generator_reserve(gen, (uint64_t)batch * (wide ? 2 : 1));
    uint64_t seed = ct_generator_seed(gen);
    for (int64_t b = 0; b < batch; b++) {
        uint64_t r;
        if (wide)
            r = (uint64_t)ct_philox(seed, first + 2 * (uint64_t)b) << 32 |
                ct_philox(seed, first + 2 * (uint64_t)b + 1);
        else
            r = ct_philox(seed, first + (uint64_t)b);
        starts[b] = (int64_t)(r % range); /* the bias is below range / 2^32: negligible */
    }
}

bool lm_batch_at(const lm_text *text, const int64_t *starts, int64_t batch, int64_t context,
                 ct_device device, ct_tensor **x, ct_tensor **y) {
    *x = *y = NULL;
    size_t cells = (size_t)(batch * context);
    int64_t *xs = malloc(2 * cells * sizeof *xs);
    if (!xs) return false;
    int64_t *ys = xs + cells;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t t = 0; t < context; t++) {
            xs[b * context + t] = text->tokens[starts[b] + t];
            ys[b * context + t] = text->tokens[starts[b] + t + 1];
        }
    *x = ct_tensor_from_data_on(xs, CT_I64, CT_SHAPE(batch, context), device);
    *y = *x ? ct_tensor_from_data_on(ys, CT_I64, CT_SHAPE(batch, context), device) : NULL;
    free(xs);
    if (*x && *y) return true;
    ct_tensor_release(*x);
    *x = NULL;
    return false;
}
