/* In-place ops on tensors with history, as PyTorch records them: the new
 * values are computed out of place from a copy of the destination (which
 * carries its old history, and keeps the values the op's backward may need
 * when the destination is overwritten), written into the destination, and
 * the destination's history becomes the result's (the rebase: x.add_(1)
 * leaves x with AddBackward whose input is x's old history). A destination
 * whose memory another handle holds (a view, a base, a saved tensor) is
 * refused before (cti_ag_inplace_mode): PyTorch rebases a view's base
 * through CopySlices, which cten does not do. */
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
    if (st == CT_OK) st = cti_ag_rebase(a, r);
    ct_tensor_release(r);
    ct_tensor_release(src);
    if (st != CT_OK && strncmp(ct_last_error(), op, strlen(op)) != 0)
        return cti_error(st, "%s: %s", op, ct_last_error());
    return st;
}
