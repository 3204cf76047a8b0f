/* Training checkpoints: one safetensors file with the model's parameters
 * under their names, the optimizer's state under "optim.<k>.<what>", the
 * data loader's position as "cten.loader.*" metadata and the caller's
 * metadata; and typed metadata values. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io_impl.h"

#define OPTIM_PREFIX "optim."
#define KEY_FORMAT "cten.checkpoint"
#define FORMAT_VERSION "1"

/* ---- typed metadata ----------------------------------------------------------------------- */

ct_status ct_metadata_set_int(ct_metadata *m, const char *key, int64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    return ct_metadata_set(m, key, buf);
}

ct_status ct_metadata_set_uint(ct_metadata *m, const char *key, uint64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    return ct_metadata_set(m, key, buf);
}

ct_status ct_metadata_set_double(ct_metadata *m, const char *key, double v) {
    char buf[40];
    /* %.17g reads back to the same double; inf and nan as strtod reads them. */
    snprintf(buf, sizeof buf, "%.17g", v);
    return ct_metadata_set(m, key, buf);
}

/* The value of key, or NULL with CT_ERR_FORMAT naming op and key. */
static const char *value_of(const char *op, const ct_metadata *m, const char *key, void *out) {
    if (!m) return cti_error_null(CT_ERR_INVALID_ARG, "%s: metadata list is NULL", op);
    if (!key) return cti_error_null(CT_ERR_INVALID_ARG, "%s: key is NULL", op);
    if (!out) return cti_error_null(CT_ERR_INVALID_ARG, "%s: output pointer for '%s' is NULL", op, key);
    const char *v = ct_metadata_get(m, key);
    if (!v) return cti_error_null(CT_ERR_FORMAT, "%s: no metadata key '%s'", op, key);
    return v;
}

static ct_status not_a(const char *op, const char *key, const char *v, const char *what) {
    return cti_error(CT_ERR_FORMAT, "%s: metadata '%s' is \"%.64s\", not %s", op, key, v, what);
}

ct_status ct_metadata_get_int(const ct_metadata *m, const char *key, int64_t *out) {
    static const char op[] = "ct_metadata_get_int";
    const char *v = value_of(op, m, key, out);
    if (!v) return ct_last_status();
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || errno == ERANGE) return not_a(op, key, v, "an int64 integer");
    *out = (int64_t)x;
    return CT_OK;
}

ct_status ct_metadata_get_uint(const ct_metadata *m, const char *key, uint64_t *out) {
    static const char op[] = "ct_metadata_get_uint";
    const char *v = value_of(op, m, key, out);
    if (!v) return ct_last_status();
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (end == v || *end || errno == ERANGE || v[0] == '-')
        return not_a(op, key, v, "a uint64 integer");
    *out = (uint64_t)x;
    return CT_OK;
}

ct_status ct_metadata_get_double(const ct_metadata *m, const char *key, double *out) {
    static const char op[] = "ct_metadata_get_double";
    const char *v = value_of(op, m, key, out);
    if (!v) return ct_last_status();
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end) return not_a(op, key, v, "a number");
    *out = x;
    return CT_OK;
}

/* ---- checkpoints ------------------------------------------------------------------------------ */

/* params' tensors under their names, then opt's state under "optim.<name>":
 * a list of borrowed references (the list holds its own). */
static ct_params *state_list(const char *op, const ct_params *params, const ct_optimizer *opt) {
    ct_params *list = ct_params_new();
    if (!list) return cti_error_null(CT_ERR_OOM, "%s: out of memory", op);
    for (int64_t i = 0; i < ct_params_count(params); i++) {
        const char *name;
        ct_tensor *t = ct_params_get(params, i, &name);
        if (!t) goto fail;
        if (strncmp(name, OPTIM_PREFIX, strlen(OPTIM_PREFIX)) == 0 && opt) {
            cti_error(CT_ERR_INVALID_ARG,
                      "%s: parameter '%s' starts with \"" OPTIM_PREFIX "\", which names the "
                      "optimizer's state in a checkpoint",
                      op, name);
            goto fail;
        }
        if (ct_params_add(list, name, t) != CT_OK) goto fail;
    }
    for (int64_t k = 0; opt && k < ct_optim_state_count(opt); k++) {
        const char *name;
        ct_tensor *t = ct_optim_state_get(opt, k, &name);
        char full[160];
        if (!t) goto fail;
        snprintf(full, sizeof full, OPTIM_PREFIX "%s", name);
        if (ct_params_add(list, full, t) != CT_OK) goto fail;
    }
    return list;
fail:
    ct_params_free(list);
    return NULL;
}

static ct_status loader_to_meta(ct_metadata *m, const ct_dataloader *loader) {
    ct_dataloader_state s = ct_dataloader_get_state(loader);
    ct_status st = ct_metadata_set_int(m, "cten.loader.epoch", s.epoch);
    if (!st) st = ct_metadata_set_int(m, "cten.loader.position", s.position);
    if (!st) st = ct_metadata_set_uint(m, "cten.loader.seed", s.seed);
    if (!st) st = ct_metadata_set_uint(m, "cten.loader.gen_offset", s.gen_offset);
    return st;
}

static ct_status loader_from_meta(const ct_metadata *m, ct_dataloader_state *s) {
    ct_status st = ct_metadata_get_int(m, "cten.loader.epoch", &s->epoch);
    if (!st) st = ct_metadata_get_int(m, "cten.loader.position", &s->position);
    if (!st) st = ct_metadata_get_uint(m, "cten.loader.seed", &s->seed);
    if (!st) st = ct_metadata_get_uint(m, "cten.loader.gen_offset", &s->gen_offset);
    return st;
}

ct_status ct_checkpoint_save(const char *path, const ct_params *params, const ct_optimizer *opt,
                             const ct_dataloader *loader, const ct_metadata *meta) {
    static const char op[] = "ct_checkpoint_save";
    if (!path) return cti_error(CT_ERR_INVALID_ARG, "%s: path is NULL", op);
    if (!params) return cti_error(CT_ERR_INVALID_ARG, "%s: parameter list is NULL", op);
    ct_params *list = state_list(op, params, opt);
    if (!list) return ct_last_status();
    ct_metadata *m = ct_metadata_new();
    ct_status st = m ? CT_OK : cti_error(CT_ERR_OOM, "%s: out of memory", op);
    for (int64_t i = 0; !st && meta && i < ct_metadata_count(meta); i++) {
        const char *v, *k = ct_metadata_at(meta, i, &v);
        if (strncmp(k, "cten.", 5) == 0)
            st = cti_error(CT_ERR_INVALID_ARG,
                           "%s: metadata key '%s' starts with \"cten.\", which the checkpoint "
                           "keeps for its own entries",
                           op, k);
        else
            st = ct_metadata_set(m, k, v);
    }
    if (!st) st = ct_metadata_set(m, KEY_FORMAT, FORMAT_VERSION);
    if (!st) st = ct_metadata_set_int(m, "cten.params", ct_params_count(params));
    if (!st) st = ct_metadata_set_int(m, "cten.optim.state", opt ? ct_optim_state_count(opt) : 0);
    if (!st && loader) st = loader_to_meta(m, loader);
    if (!st) st = ct_save_safetensors(path, list, m);
    ct_metadata_free(m);
    ct_params_free(list);
    return st;
}

/* The last error, prefixed with op and path unless it names op already. */
static ct_status in_op(const char *op, const char *path, ct_status st) {
    if (strncmp(ct_last_error(), op, strlen(op)) == 0) return st;
    return cti_error(st, "%s: '%s': %s", op, path, ct_last_error());
}

ct_status ct_checkpoint_load(const char *path, ct_params *params, ct_optimizer *opt,
                             ct_dataloader *loader, ct_metadata **meta) {
    static const char op[] = "ct_checkpoint_load";
    if (meta) *meta = NULL;
    if (!path) return cti_error(CT_ERR_INVALID_ARG, "%s: path is NULL", op);
    if (!params) return cti_error(CT_ERR_INVALID_ARG, "%s: parameter list is NULL", op);
    /* The metadata first: a file that is no checkpoint, or whose loader
     * position does not fit this loader, changes nothing. */
    ct_metadata *m = ct_load_safetensors_metadata(path);
    if (!m) return cti_error(ct_last_status(), "%s: %s", op, ct_last_error());
    ct_status st = CT_OK;
    const char *fmt = ct_metadata_get(m, KEY_FORMAT);
    int64_t nstate = 0;
    if (!fmt || strcmp(fmt, FORMAT_VERSION) != 0)
        st = cti_error(CT_ERR_FORMAT, "%s: '%s' is not a cten checkpoint (metadata '" KEY_FORMAT
                                      "' is %s%s%s, expected \"" FORMAT_VERSION "\")",
                       op, path, fmt ? "\"" : "", fmt ? fmt : "missing", fmt ? "\"" : "");
    if (!st && opt && (st = ct_metadata_get_int(m, "cten.optim.state", &nstate)) == CT_OK &&
        nstate != ct_optim_state_count(opt))
        st = cti_error(CT_ERR_FORMAT,
                       "%s: '%s' holds %lld optimizer state tensors, the optimizer has %lld "
                       "(another optimizer or momentum setting?)",
                       op, path, (long long)nstate, (long long)ct_optim_state_count(opt));
    ct_dataloader_state saved = {0}, before = {0};
    if (!st && loader) {
        before = ct_dataloader_get_state(loader);
        st = loader_from_meta(m, &saved);
        if (!st) st = ct_dataloader_set_state(loader, &saved);
    }
    if (st) {
        ct_metadata_free(m);
        return in_op(op, path, st);
    }
    ct_params *list = state_list(op, params, opt);
    st = list ? ct_load_safetensors_into(path, list, opt != NULL, NULL) : ct_last_status();
    ct_params_free(list);
    if (st) {
        if (loader) ct_dataloader_set_state(loader, &before);
        ct_metadata_free(m);
        return in_op(op, path, st);
    }
    if (meta) *meta = m;
    else ct_metadata_free(m);
    return CT_OK;
}
