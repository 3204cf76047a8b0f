/* Parameter lists: ordered (name, tensor) pairs holding references, indexed
 * by name and by tensor. */
#include <stdlib.h>

#include "nn_impl.h"

ct_params *ct_params_new(void) {
    ct_params *p = calloc(1, sizeof *p);
    if (!p) return cti_error_null(CT_ERR_OOM, "ct_params_new: out of memory");
    cti_hmap_init(&p->by_name, CTI_HMAP_STR);
    cti_hmap_init(&p->by_tensor, CTI_HMAP_PTR);
    return p;
}

void ct_params_free(ct_params *p) {
    if (!p) return;
    for (int64_t i = 0; i < p->n; i++) {
        free(p->names[i]);
        cti_unref(p->tensors[i]);
    }
    free(p->names);
    free(p->tensors);
    cti_hmap_clear(&p->by_name);
    cti_hmap_clear(&p->by_tensor);
    free(p);
}

/* Room for one more entry in the arrays and both indexes, so that the
 * insertion after it cannot fail half-way. */
static bool grow(ct_params *p) {
    if (!cti_hmap_reserve(&p->by_name, (size_t)p->n + 1) ||
        !cti_hmap_reserve(&p->by_tensor, (size_t)p->n + 1))
        return false;
    if (p->n < p->cap) return true;
    if (p->cap > INT64_MAX / 2 || (uint64_t)p->cap * 2 > SIZE_MAX / sizeof(char *)) return false;
    int64_t cap = p->cap ? p->cap * 2 : 16;
    char **names = realloc(p->names, (size_t)cap * sizeof *names);
    if (!names) return false;
    p->names = names;
    ct_tensor **ts = realloc(p->tensors, (size_t)cap * sizeof *ts);
    if (!ts) return false;
    p->tensors = ts;
    p->cap = cap;
    return true;
}

ct_status ct_params_add(ct_params *p, const char *name, ct_tensor *t) {
    static const char op[] = "ct_params_add";
    if (!p) return cti_error(CT_ERR_INVALID_ARG, "%s: parameter list is NULL", op);
    if (!name || !*name)
        return cti_error(CT_ERR_INVALID_ARG, "%s: name is NULL or empty", op);
    if (!t) return cti_error(CT_ERR_INVALID_ARG, "%s: tensor '%s' is NULL", op, name);
    if (cti_hmap_get(&p->by_name, name) >= 0)
        return cti_error(CT_ERR_INVALID_ARG, "%s: a parameter named '%s' is already in the list",
                         op, name);
    int64_t i = cti_hmap_get(&p->by_tensor, t);
    if (i >= 0)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: tensor %s is already in the list as '%s' (adding it as '%s')", op,
                         cti_desc(t), p->names[i], name);
    char *copy = strdup(name);
    if (!copy || !grow(p)) {
        free(copy);
        return cti_error(CT_ERR_OOM, "%s: out of memory", op);
    }
    /* Both reserved above, so neither insertion can fail. */
    cti_hmap_put(&p->by_name, copy, p->n);
    cti_hmap_put(&p->by_tensor, t, p->n);
    p->names[p->n] = copy;
    p->tensors[p->n] = cti_ref(t);
    p->n++;
    return CT_OK;
}

void cti_params_pop(ct_params *p) {
    if (!p || p->n == 0) return;
    p->n--;
    cti_hmap_remove(&p->by_name, p->names[p->n]);
    cti_hmap_remove(&p->by_tensor, p->tensors[p->n]);
    free(p->names[p->n]);
    cti_unref(p->tensors[p->n]);
}

int64_t ct_params_count(const ct_params *p) { return p ? p->n : 0; }

ct_tensor *ct_params_get(const ct_params *p, int64_t index, const char **name) {
    if (!p) return cti_error_null(CT_ERR_INVALID_ARG, "ct_params_get: parameter list is NULL");
    if (index < 0 || index >= p->n)
        return cti_error_null(CT_ERR_INDEX,
                              "ct_params_get: index %lld is out of range for a list of %lld",
                              (long long)index, (long long)p->n);
    if (name) *name = p->names[index];
    return p->tensors[index];
}

ct_tensor *ct_params_find(const ct_params *p, const char *name) {
    if (!p) return cti_error_null(CT_ERR_INVALID_ARG, "ct_params_find: parameter list is NULL");
    if (!name) return cti_error_null(CT_ERR_INVALID_ARG, "ct_params_find: name is NULL");
    int64_t i = cti_hmap_get(&p->by_name, name);
    if (i >= 0) return p->tensors[i];
    return cti_error_null(CT_ERR_INDEX, "ct_params_find: no parameter named '%s' among %lld",
                          name, (long long)p->n);
}
