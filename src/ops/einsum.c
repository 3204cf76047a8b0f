/* ct_einsum: torch.einsum's equations planned through bmm.
 *
 * Each operand carries one label per dim: a letter, or one of the "..."
 * dims (labels after the 52 letters, right-aligned across operands so they
 * broadcast). The plan:
 *   1. a label repeated within an operand takes the diagonal (the operand
 *      times an identity mask, summed over the second copy);
 *   2. the operands are contracted left to right; before each product, a
 *      label found in one side only and needed by nothing later is summed
 *      out of that side, and a size-1 dim facing a larger one is dropped
 *      from its side (it broadcasts);
 *   3. the pair is permuted to [batch, left-only, contracted] and
 *      [batch, contracted, right-only], reshaped to [B, M, K] @ [B, K, N]
 *      and multiplied with bmm (views where the strides allow, else one
 *      copy per operand), and the product reshaped to its labels;
 *   4. what remains outside the output is summed, and the result permuted
 *      into the output's order.
 * Every step is a public op, so autograd records the plan and it runs on
 * every device bmm runs on (integer operands on the CPU only, as bmm). */
#include <stdio.h>
#include <string.h>

#include "ops_impl.h"

enum { NLETTERS = 52, NLABELS = NLETTERS + CT_MAX_DIMS };

typedef struct term {
    ct_tensor *t; /* the caller's operand (owned false) or a handle made here */
    bool owned;
    int nd;
    int lab[CT_MAX_DIMS];
} term;

static const char OP[] = "ct_einsum";

static int letter_id(char c) {
    if (c >= 'a' && c <= 'z') return c - 'a';
    if (c >= 'A' && c <= 'Z') return 26 + (c - 'A');
    return -1;
}

static char label_char(int id) {
    return id < 26 ? (char)('a' + id) : id < NLETTERS ? (char)('A' + id - 26) : '.';
}

/* Replaces tm->t by nt (NULL: failure, tm->t kept for release). */
static ct_status step(term *tm, ct_tensor *nt) {
    if (!nt) return ct_last_status();
    if (tm->owned) ct_tensor_release(tm->t);
    tm->t = nt;
    tm->owned = true;
    return CT_OK;
}

/* Integer sums come back as int64: keep the operands' dtype through the plan. */
static ct_tensor *sum_dims(ct_tensor *t, int n, const int64_t *dims) {
    ct_tensor *s = ct_sum(t, n, dims, false);
    if (!s || s->dtype == t->dtype) return s;
    ct_tensor *c = ct_to_dtype(s, t->dtype);
    ct_tensor_release(s);
    return c;
}

/* Sums out the dims whose labels `drop` marks. */
static ct_status sum_out(term *tm, const bool drop[NLABELS]) {
    int64_t dims[CT_MAX_DIMS];
    int n = 0, nd = 0;
    for (int d = 0; d < tm->nd; d++) {
        if (drop[tm->lab[d]]) dims[n++] = d;
        else tm->lab[nd++] = tm->lab[d];
    }
    if (n == 0) return CT_OK;
    ct_status st = step(tm, sum_dims(tm->t, n, dims));
    tm->nd = nd;
    return st;
}

/* Drops dim d (size 1) of tm. */
static ct_status squeeze_out(term *tm, int d) {
    ct_status st = step(tm, ct_squeeze_dim(tm->t, d));
    for (int k = d; k + 1 < tm->nd; k++) tm->lab[k] = tm->lab[k + 1];
    tm->nd--;
    return st;
}

/* Takes the diagonal of every label repeated within tm. */
static ct_status diagonals(term *tm) {
    for (int i = 0; i < tm->nd; i++)
        for (int j = i + 1; j < tm->nd; j++) {
            if (tm->lab[i] != tm->lab[j]) continue;
            int64_t n = tm->t->shape[i];
            if (tm->t->shape[j] != n)
                return cti_error(CT_ERR_SHAPE,
                                 "%s: subscript %c is repeated for operand %s but the sizes "
                                 "don't match, %lld != %lld",
                                 OP, label_char(tm->lab[i]), cti_desc(tm->t),
                                 (long long)n, (long long)tm->t->shape[j]);
            ct_tensor *eye = ct_tensor_eye(n, n, tm->t->dtype, tm->t->storage->device);
            int64_t shape[CT_MAX_DIMS];
            for (int d = 0; d < tm->nd; d++) shape[d] = d == i || d == j ? n : 1;
            ct_tensor *mask = eye ? ct_reshape(eye, tm->nd, shape) : NULL;
            ct_tensor_release(eye);
            ct_tensor *prod = mask ? ct_mul(tm->t, mask) : NULL;
            ct_tensor_release(mask);
            int64_t dj = j;
            ct_tensor *diag = prod ? sum_dims(prod, 1, &dj) : NULL;
            ct_tensor_release(prod);
            if (step(tm, diag) != CT_OK) return ct_last_status();
            for (int k = j; k + 1 < tm->nd; k++) tm->lab[k] = tm->lab[k + 1];
            tm->nd--;
            j--;
        }
    return CT_OK;
}

/* ---- parsing ----------------------------------------------------------------------------- */

typedef struct plan {
    int n;
    term *terms;
    int out[NLABELS], nout;
} plan;

/* Reads one operand's subscripts from s (up to ',' or '-' or the end) into
 * lab, with "..." expanded to the operand's extra dims; *nell receives
 * their count (-1: no ellipsis). Returns the characters read, or -1. */
static int parse_term(const char *s, const ct_tensor *t, int k, int *lab, int *nell,
                      int *nlab) {
    int n = 0, pos = 0, letters = 0, ell_at = -1;
    int tmp[CT_MAX_DIMS + 64];
    for (; s[pos] && s[pos] != ',' && s[pos] != '-'; pos++) {
        char c = s[pos];
        if (c == ' ') continue;
        if (c == '.') {
            if (ell_at >= 0 || strncmp(s + pos, "...", 3) != 0) {
                cti_error(CT_ERR_INVALID_ARG, "%s: invalid ellipsis in the subscripts of operand %d",
                          OP, k);
                return -1;
            }
            ell_at = n;
            pos += 2;
            continue;
        }
        int id = letter_id(c);
        if (id < 0) {
            cti_error(CT_ERR_INVALID_ARG,
                      "%s: invalid subscript '%c' for operand %d: letters a-z, A-Z and ... only",
                      OP, c, k);
            return -1;
        }
        if (n == (int)(sizeof tmp / sizeof tmp[0])) {
            cti_error(CT_ERR_INVALID_ARG, "%s: too many subscripts for operand %d", OP, k);
            return -1;
        }
        tmp[n++] = id;
        letters++;
    }
    int nd = t->ndim;
    if (ell_at < 0 ? letters != nd : letters > nd) {
        cti_error(CT_ERR_SHAPE,
                  "%s: the number of subscripts in the equation (%d) does not match the number "
                  "of dimensions (%d) for operand %d%s",
                  OP, letters, nd, k, ell_at < 0 ? " and no ellipsis was given" : "");
        return -1;
    }
    int ne = ell_at < 0 ? 0 : nd - letters, o = 0;
    for (int i = 0; i < n; i++) {
        if (i == ell_at)
            for (int e = 0; e < ne; e++) lab[o++] = -1 - e; /* fixed up by the caller */
        lab[o++] = tmp[i];
    }
    if (ell_at == n)
        for (int e = 0; e < ne; e++) lab[o++] = -1 - e;
    *nell = ell_at < 0 ? -1 : ne;
    *nlab = o;
    return pos;
}

/* Parses the equation into p (terms own new references to the operands). */
static ct_status parse(const char *eq, int n, ct_tensor *const *ops, plan *p) {
    const char *s = eq;
    int nell[CT_MAX_DIMS * 8], maxe = 0;
    for (int k = 0; k < n; k++) {
        term *tm = &p->terms[k];
        int used = parse_term(s, ops[k], k, tm->lab, &nell[k], &tm->nd);
        if (used < 0) return ct_last_status();
        if (nell[k] > maxe) maxe = nell[k];
        s += used;
        if (k + 1 < n) {
            if (*s != ',')
                return cti_error(CT_ERR_INVALID_ARG,
                                 "%s: the equation \"%s\" has fewer operands than the %d given",
                                 OP, eq, n);
            s++;
        }
    }
    if (*s == ',')
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: the equation \"%s\" has more operands than the %d given", OP, eq, n);
    /* ellipsis dims right-aligned: the e-th of ne is global dim maxe - ne + e */
    for (int k = 0; k < n; k++)
        for (int d = 0; d < p->terms[k].nd; d++) {
            int *l = &p->terms[k].lab[d];
            if (*l < 0) *l = NLETTERS + maxe - nell[k] + (-1 - *l);
        }
    int count[NLABELS] = {0};
    for (int k = 0; k < n; k++) {
        bool seen[NLABELS] = {false};
        for (int d = 0; d < p->terms[k].nd; d++) {
            int l = p->terms[k].lab[d];
            if (l < NLETTERS) count[l]++;
            else if (!seen[l]) count[l]++;
            seen[l] = true;
        }
    }
    while (*s == ' ') s++;
    p->nout = 0;
    if (*s == '\0') {
        /* implicit output: the "..." dims, then letters seen once, sorted */
        for (int e = 0; e < maxe; e++) p->out[p->nout++] = NLETTERS + e;
        for (int l = 0; l < NLETTERS; l++)
            if (count[l] == 1) p->out[p->nout++] = l;
        return CT_OK;
    }
    if (strncmp(s, "->", 2) != 0)
        return cti_error(CT_ERR_INVALID_ARG, "%s: invalid equation \"%s\": expected \"->\"", OP,
                         eq);
    bool in_out[NLABELS] = {false}, ell = false;
    for (s += 2; *s; s++) {
        if (*s == ' ') continue;
        if (*s == '.') {
            if (ell || strncmp(s, "...", 3) != 0)
                return cti_error(CT_ERR_INVALID_ARG, "%s: invalid ellipsis in the output of \"%s\"",
                                 OP, eq);
            ell = true;
            s += 2;
            for (int e = 0; e < maxe; e++) p->out[p->nout++] = NLETTERS + e;
            continue;
        }
        int id = letter_id(*s);
        if (id < 0)
            return cti_error(CT_ERR_INVALID_ARG, "%s: invalid subscript '%c' in the output", OP,
                             *s);
        if (in_out[id])
            return cti_error(CT_ERR_INVALID_ARG,
                             "%s: output subscript %c appears more than once in the output", OP,
                             *s);
        if (count[id] == 0)
            return cti_error(CT_ERR_INVALID_ARG,
                             "%s: output subscript %c does not appear in the equation for any "
                             "input operand",
                             OP, *s);
        in_out[id] = true;
        p->out[p->nout++] = id;
    }
    if (!ell && maxe > 0)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: the operands have \"...\" dims but the output of \"%s\" has no "
                         "ellipsis",
                         OP, eq);
    if (p->nout > CT_MAX_DIMS)
        return cti_error(CT_ERR_SHAPE, "%s: the output has %d dims, more than %d", OP, p->nout,
                         CT_MAX_DIMS);
    return CT_OK;
}

/* ---- contraction ---------------------------------------------------------------------- */

static int find(const term *tm, int l) {
    for (int d = 0; d < tm->nd; d++)
        if (tm->lab[d] == l) return d;
    return -1;
}

/* Permutes tm into the label order `order` (a permutation of its labels) and
 * reshapes it to the 3 group sizes. */
static ct_tensor *grouped(const term *tm, const int *order, const int ng[3], int64_t gs[3]) {
    int64_t perm[CT_MAX_DIMS];
    int o = 0;
    for (int gi = 0; gi < 3; gi++) {
        gs[gi] = 1;
        for (int i = 0; i < ng[gi]; i++, o++) {
            perm[o] = find(tm, order[o]);
            gs[gi] *= tm->t->shape[perm[o]];
        }
    }
    ct_tensor *pt = ct_permute(tm->t, tm->nd, perm);
    ct_tensor *r = pt ? ct_reshape(pt, 3, gs) : NULL;
    ct_tensor_release(pt);
    return r;
}

/* a = a (x) b over their labels; `needed` marks labels used after this pair. */
static ct_status contract(term *a, term *b, const bool needed[NLABELS]) {
    /* a size-1 dim facing a larger one broadcasts: it leaves its side */
    for (int d = 0; d < a->nd; d++) {
        int e = find(b, a->lab[d]);
        if (e < 0 || a->t->shape[d] == b->t->shape[e]) continue;
        if (a->t->shape[d] != 1 && b->t->shape[e] != 1)
            return cti_error(CT_ERR_SHAPE,
                             "%s: operands %s and %s do not broadcast at subscript %c (%lld vs "
                             "%lld)",
                             OP, cti_desc(a->t), cti_desc(b->t), label_char(a->lab[d]),
                             (long long)a->t->shape[d], (long long)b->t->shape[e]);
        if (a->t->shape[d] == 1) {
            if (squeeze_out(a, d) != CT_OK) return ct_last_status();
            d--;
        } else if (squeeze_out(b, e) != CT_OK) {
            return ct_last_status();
        }
    }
    /* labels of one side that nothing else needs are summed out of it first */
    bool drop_a[NLABELS] = {false}, drop_b[NLABELS] = {false};
    for (int d = 0; d < a->nd; d++) drop_a[a->lab[d]] = !needed[a->lab[d]] && find(b, a->lab[d]) < 0;
    for (int d = 0; d < b->nd; d++) drop_b[b->lab[d]] = !needed[b->lab[d]] && find(a, b->lab[d]) < 0;
    if (sum_out(a, drop_a) != CT_OK || sum_out(b, drop_b) != CT_OK) return ct_last_status();

    int batch[CT_MAX_DIMS], con[CT_MAX_DIMS], aonly[CT_MAX_DIMS], bonly[CT_MAX_DIMS];
    int nb = 0, nc = 0, na = 0, nbo = 0;
    for (int d = 0; d < a->nd; d++) {
        int l = a->lab[d];
        if (find(b, l) < 0) aonly[na++] = l;
        else if (needed[l]) batch[nb++] = l;
        else con[nc++] = l;
    }
    for (int d = 0; d < b->nd; d++)
        if (find(a, b->lab[d]) < 0) bonly[nbo++] = b->lab[d];
    if (nb + na + nbo > CT_MAX_DIMS)
        return cti_error(CT_ERR_SHAPE, "%s: an intermediate product would have %d dims, more than %d",
                         OP, nb + na + nbo, CT_MAX_DIMS);
    int oa[CT_MAX_DIMS], ob[CT_MAX_DIMS], o = 0;
    for (int i = 0; i < nb; i++) oa[o++] = batch[i];
    for (int i = 0; i < na; i++) oa[o++] = aonly[i];
    for (int i = 0; i < nc; i++) oa[o++] = con[i];
    o = 0;
    for (int i = 0; i < nb; i++) ob[o++] = batch[i];
    for (int i = 0; i < nc; i++) ob[o++] = con[i];
    for (int i = 0; i < nbo; i++) ob[o++] = bonly[i];
    int64_t ga[3], gb[3], rshape[CT_MAX_DIMS];
    int nr = 0;
    for (int i = 0; i < nb; i++) rshape[nr++] = a->t->shape[find(a, batch[i])];
    for (int i = 0; i < na; i++) rshape[nr++] = a->t->shape[find(a, aonly[i])];
    for (int i = 0; i < nbo; i++) rshape[nr++] = b->t->shape[find(b, bonly[i])];
    ct_tensor *a3 = grouped(a, oa, (const int[3]){nb, na, nc}, ga);
    ct_tensor *b3 = a3 ? grouped(b, ob, (const int[3]){nb, nc, nbo}, gb) : NULL;
    ct_tensor *p3 = b3 ? ct_bmm(a3, b3) : NULL;
    ct_tensor_release(a3);
    ct_tensor_release(b3);
    ct_tensor *r = p3 ? ct_reshape(p3, nr, rshape) : NULL;
    ct_tensor_release(p3);
    if (step(a, r) != CT_OK) return ct_last_status();
    a->nd = nr;
    nr = 0;
    for (int i = 0; i < nb; i++) a->lab[nr++] = batch[i];
    for (int i = 0; i < na; i++) a->lab[nr++] = aonly[i];
    for (int i = 0; i < nbo; i++) a->lab[nr++] = bonly[i];
    return CT_OK;
}

static ct_status run_plan(plan *p, ct_tensor **result) {
    for (int k = 0; k < p->n; k++)
        if (diagonals(&p->terms[k]) != CT_OK) return ct_last_status();
    bool in_out[NLABELS] = {false};
    for (int i = 0; i < p->nout; i++) in_out[p->out[i]] = true;
    term *acc = &p->terms[0];
    for (int k = 1; k < p->n; k++) {
        bool needed[NLABELS];
        memcpy(needed, in_out, sizeof needed);
        for (int r = k + 1; r < p->n; r++)
            for (int d = 0; d < p->terms[r].nd; d++) needed[p->terms[r].lab[d]] = true;
        if (contract(acc, &p->terms[k], needed) != CT_OK) return ct_last_status();
    }
    bool drop[NLABELS];
    for (int l = 0; l < NLABELS; l++) drop[l] = !in_out[l];
    if (sum_out(acc, drop) != CT_OK) return ct_last_status();
    /* every output label is in acc now (size-1 "..." dims an operand lacked
     * come back as 1) */
    int64_t perm[CT_MAX_DIMS], shape[CT_MAX_DIMS];
    bool all_there = true;
    for (int i = 0; i < p->nout; i++) {
        int d = find(acc, p->out[i]);
        if (d < 0) all_there = false;
        perm[i] = d;
        shape[i] = d < 0 ? 1 : acc->t->shape[d];
    }
    if (all_there) {
        *result = ct_permute(acc->t, acc->nd, perm);
        return *result ? CT_OK : ct_last_status();
    }
    /* dims no operand had: insert them as size 1 */
    int64_t pp[CT_MAX_DIMS];
    int o = 0;
    for (int i = 0; i < p->nout; i++)
        if (perm[i] >= 0) pp[o++] = perm[i];
    ct_tensor *pt = ct_permute(acc->t, acc->nd, pp);
    *result = pt ? ct_reshape(pt, p->nout, shape) : NULL;
    ct_tensor_release(pt);
    return *result ? CT_OK : ct_last_status();
}

ct_tensor *ct_einsum(const char *equation, int n, ct_tensor *const *operands) {
    if (!equation) return cti_error_null(CT_ERR_INVALID_ARG, "%s: equation is NULL", OP);
    if (n < 1 || !operands)
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: expected at least one operand, got %d", OP,
                              n);
    if (n > CT_MAX_DIMS * 8)
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: at most %d operands, got %d", OP,
                              CT_MAX_DIMS * 8, n);
    if (cti_check_not_null(OP, n, operands) != CT_OK ||
        cti_check_same_device(OP, n, operands) != CT_OK)
        return NULL;
    for (int k = 1; k < n; k++)
        if (operands[k]->dtype != operands[0]->dtype)
            return cti_error_null(CT_ERR_DTYPE,
                                  "%s: expected every operand to have dtype %s, got %s for "
                                  "operand %d",
                                  OP, ct_dtype_name(operands[0]->dtype),
                                  ct_dtype_name(operands[k]->dtype), k);
    term terms[CT_MAX_DIMS * 8];
    plan p = {.n = n, .terms = terms};
    for (int k = 0; k < n; k++) {
        terms[k].t = operands[k];
        terms[k].owned = false;
    }
    ct_status st = parse(equation, n, operands, &p);
    ct_tensor *result = NULL;
    if (st == CT_OK) st = run_plan(&p, &result);
    for (int k = 0; k < n; k++)
        if (terms[k].owned) ct_tensor_release(terms[k].t);
    if (st != CT_OK && result) {
        ct_tensor_release(result);
        result = NULL;
    }
    if (!result && strncmp(ct_last_error(), OP, sizeof OP - 1) != 0)
        cti_error_wrap(CT_ERR_RUNTIME, OP);
    return result;
}
