/* In-place ops on tensors with history, as PyTorch records them: the new
 * values are computed out of place from a copy of the destination (which
 * carries its old history, and keeps the values the op's backward may need
 * when the destination is overwritten), written into the destination, and
 * the histories are rewritten:
 * - a destination that is no view takes the result's history (the rebase:
 *   x.add_(1) leaves x with AddBackward whose input is x's old history);
 * - a view (ct_narrow, ct_select, ct_transpose, ct_view ... of a base, made
 *   in grad mode) rewrites its base's history instead, PyTorch's CopySlices:
 *   the base's gradient reaches the result through the view's region and
 *   the base's old history everywhere else, and the view's history becomes
 *   a strided view of the base's new one (cti_ag_rebase_view). Other views
 *   of the base rebuild theirs when next read (src/autograd/graph.c).
 * The region's gradient flows through the result's own nodes (the op, the
 * copy, the view op that made the destination) back to the base's old
 * history, so every recorded op works on views without a formula of its
 * own. Refused before anything is written (cti_ag_inplace_mode): a leaf that
 * requires grad or a view of one, a view made in no-grad mode or returned
 * among several (split, chunk, unbind). ct_copy_, ct_fill_ and ct_zero_
 * record their writes the same way (src/ops/factory.c). */
#include "autograd/autograd_impl.h"
#include "ops_impl.h"
#include "tensor/autograd.h"

ct_status cti_inplace_record(const char *op, ct_tensor *a, cti_inplace_fn fn, const void *ctx) {
    ct_tensor *src = ct_clone(a);
    ct_tensor *r = src ? fn(src, ctx) : NULL;
    if (r && r->dtype != a->dtype) { /* the destination keeps its dtype */
        ct_tensor *c = ct_to_dtype(r, a->dtype);
        ct_tensor_release(r);
        r = c;
    }
    ct_status st = r ? CT_OK : ct_last_status();
    if (st == CT_OK && (r->ndim != a->ndim ||
                        memcmp(r->shape, a->shape, sizeof(int64_t) * (size_t)a->ndim) != 0))
        st = cti_error(CT_ERR_SHAPE, "%s: the result %s does not have the destination's shape %s",
                       op, cti_desc(r), cti_desc(a));
    if (st == CT_OK) {
        bool prev = ct_no_grad_begin();
        st = ct_copy_(a, r);
        ct_no_grad_end(prev);
    }
    if (st == CT_OK) st = cti_ag_is_view(a) ? cti_ag_rebase_view(a, r) : cti_ag_rebase(a, r);
    ct_tensor_release(r);
    ct_tensor_release(src);
    if (st != CT_OK && strncmp(ct_last_error(), op, strlen(op)) != 0)
        return cti_error(st, "%s: %s", op, ct_last_error());
    return st;
}
