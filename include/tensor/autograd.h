/* cten: reverse-mode automatic differentiation.
 *
 * As in PyTorch: a leaf tensor marked with ct_requires_grad_ makes every op
 * that reads it record itself (its inputs, what its backward needs, and its
 * backward function) on a dynamic graph; ct_backward walks that graph in
 * reverse topological order and accumulates gradients into the .grad of the
 * leaves. Gradients over broadcast dims are summed back to the input's shape.
 * Recording is off inside no-grad mode. */
#ifndef CTEN_AUTOGRAD_H
#define CTEN_AUTOGRAD_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Marks a leaf (a tensor no recorded op produced) as requiring gradients;
 * floating dtypes only. Switching it off on a non-leaf is an error. A view
 * of a plain tensor made a leaf this way is no longer tracked as a view of
 * it (in-place writes through it are refused as on any such leaf). */
ct_status ct_requires_grad_(ct_tensor *t, bool requires_grad);
/* For a view, these and ct_grad_fn_name see the view's present history: when
 * its base was written in place since, the view's history is first rebuilt
 * as a view of the base's (AsStridedBackward), as PyTorch does. */
bool ct_requires_grad(const ct_tensor *t);
/* True for tensors no recorded op produced. */
bool ct_is_leaf(const ct_tensor *t);
/* The accumulated gradient of a leaf, or NULL. Borrowed: valid until the next
 * ct_zero_grad or backward on it, or its release. */
ct_tensor *ct_grad(const ct_tensor *t);
/* Drops t's gradient (PyTorch's zero_grad(set_to_none=True)). */
void ct_zero_grad(ct_tensor *t);
/* Replaces t's gradient with a new reference to g (NULL drops it); g must
 * have t's shape, dtype and device. */
ct_status ct_set_grad(ct_tensor *t, ct_tensor *g);
/* A hook on a leaf that requires grad (PyTorch's
 * register_post_accumulate_grad_hook): each ct_backward that reaches the
 * leaf calls fn(leaf, ctx) once, on the calling thread, after it has
 * accumulated the last gradient it delivers to the leaf in that pass, with
 * ct_grad(leaf) then final for the pass (a pass whose formulas give the leaf
 * no gradient still calls it; ct_grad may then be NULL). A hook that returns
 * an error stops the backward with that error (as any failed backward: the
 * nodes that ran before it have freed their saved tensors unless
 * retain_graph). Data-parallel training starts each gradient's
 * reduction from here (tensor/dist.h). One hook per leaf: fn NULL removes
 * it; setting one on a leaf that has one is CT_ERR_AUTOGRAD. ctx is the
 * caller's and must outlive the hook. */
typedef ct_status (*ct_grad_hook_fn)(ct_tensor *leaf, void *ctx);
ct_status ct_set_post_accumulate_grad_hook(ct_tensor *leaf, ct_grad_hook_fn fn, void *ctx);

/* A view sharing t's storage with no history and requires_grad off. */
ct_tensor *ct_detach(ct_tensor *t);
/* Name of the backward function that produced t ("MulBackward"), or NULL for leaves. */
const char *ct_grad_fn_name(const ct_tensor *t);

/* Backpropagates from out. grad_out is d(loss)/d(out), of out's shape and
 * device and a floating dtype (converted to out's), or NULL when out has
 * one element (then 1). Unless retain_graph, each node's saved tensors are
 * freed as soon as its formula has run (so the activations go while the
 * gradients come, as in PyTorch), also when a later node fails; a second
 * backward through a freed node is an error naming it. */
ct_status ct_backward(ct_tensor *out, ct_tensor *grad_out, bool retain_graph);

/* Grad mode, per thread (on by default). Returns the previous setting. */
bool ct_set_grad_enabled(bool enabled);
bool ct_is_grad_enabled(void);
/* A no-grad region: bool prev = ct_no_grad_begin(); ...; ct_no_grad_end(prev); */
bool ct_no_grad_begin(void);
void ct_no_grad_end(bool prev);

/* Recomputation of cheap results in the backward, per thread, off by
 * default; returns the previous setting. It trades one more pointwise
 * kernel in the backward for the memory of a result, as llm.c's
 * --recompute does for GELU and torch.compile's partitioner does on its
 * own. While it is on, an op that saves for its backward the output of a
 * pointwise op (a linear layer saving GELU's or SwiGLU's result, say) keeps
 * a note of it instead of the tensor, when that pointwise op saved its own
 * inputs: the backward runs the pointwise op again on those inputs when the
 * formula reads the result, and frees it with the formula's other saved
 * tensors. The result's memory is thus free from the moment the caller
 * releases it until the backward, and the gradients are bit for bit those
 * without recomputation. The ops it covers: the unary ops that save their
 * input (GELU, SiLU, ELU and the rest; not ReLU, tanh or sigmoid, whose
 * formulas read their output) and ct_swiglu. What is decided is decided
 * when the consumer records its node: a result written in place since its
 * op made it is saved as usual, and one written without autograd (in
 * no-grad mode) after a consumer saved it gives the gradient of the values
 * that consumer saw, not the error of an in-place modification. */
bool ct_set_recompute_enabled(bool enabled);
bool ct_is_recompute_enabled(void);

/* ---- activation checkpointing -------------------------------------------------------
 * ct_activation_checkpoint(fn, ctx, n, inputs) is fn(ctx, n, inputs) without the memory
 * of fn's intermediate results (torch.utils.checkpoint, its reentrant form):
 * a transformer's block, say, keeps only its input for the backward, not
 * its attention and MLP activations, for one more forward of the block in
 * the backward.
 *
 * fn computes a new tensor from inputs (borrowed, at most 6) and what ctx
 * holds (the parameters; ctx must stay valid until the backward through the
 * result has run); fn runs in a scope of its own, so its temporaries go when
 * it returns. It must compute the same result each time it runs on
 * the same values: a dropout inside draws from a generator fn reseeds
 * itself (PyTorch stashes the global RNG state; cten has none).
 *
 * In grad mode with an input that requires grad, fn runs without recording
 * and the result's node keeps the inputs (written in place later, they are
 * refused at backward as any saved tensor). The backward runs fn again,
 * recording, in the autocast state of the first run, on leaves holding the
 * inputs' values, and backpropagates the result's gradient through that
 * graph: the parameters fn reads get their gradients there (accumulated as
 * by any backward), the inputs get theirs through the node. The gradients
 * are those without checkpointing, but for the order in which a parameter
 * used both inside and outside fn has its parts summed. A parameter's
 * post-accumulate-grad hook runs when the backward inside is done with it:
 * one used both inside and outside fn has its hook run twice per backward,
 * which data parallelism (tensor/dist.h) does not support, as PyTorch's
 * reentrant checkpoint does not.
 *
 * Otherwise (grad mode off, no input requiring grad) fn just runs, and
 * records as any code does. Errors: fn NULL, more than 6 inputs, a NULL
 * input, fn's own (returned as they are; in the backward, prefixed with
 * ct_activation_checkpoint's), a result of another shape or dtype when fn runs again. */
typedef ct_tensor *(*ct_activation_checkpoint_fn)(void *ctx, int n, ct_tensor *const *inputs);
ct_tensor *ct_activation_checkpoint(ct_activation_checkpoint_fn fn, void *ctx, int n,
                                    ct_tensor *const *inputs);

/* ---- gradient checking ------------------------------------------------------------
 * fn computes a tensor from inputs (borrowed; it returns a new tensor).
 * ct_gradcheck compares the gradient that backward computes for a random
 * projection sum(fn(inputs) * R) against central finite differences with
 * step eps, for every element of every input that requires grad. Inputs
 * should be float64. On a mismatch it returns CT_ERR_AUTOGRAD and the message
 * names the input, element, analytic and numeric values. */
typedef ct_tensor *(*ct_gradcheck_fn)(ct_tensor *const *inputs, void *ctx);
ct_status ct_gradcheck(ct_gradcheck_fn fn, void *ctx, int n, ct_tensor *const *inputs,
                       double eps, double atol, double rtol);

#ifdef __cplusplus
}
#endif
#endif
