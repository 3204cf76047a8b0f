/* cten: layers with parameters, optimizers, learning-rate schedules and
 * gradient clipping, as torch.nn / torch.optim offer them.
 *
 * A training step reads like PyTorch's:
 *
 *     ct_scope *s = ct_scope_begin();                  // temporaries of this step
 *     ct_tensor *h = ct_relu(ct_nn_linear_forward(fc1, x));
 *     ct_tensor *loss = ct_cross_entropy(ct_nn_linear_forward(fc2, h), y, NULL,
 *                                        CT_REDUCTION_MEAN, -100, 0.0);
 *     ct_optim_zero_grad(opt);                         // opt.zero_grad()
 *     ct_backward(loss, NULL, false);                  // loss.backward()
 *     ct_optim_step(opt);                              // opt.step()
 *     ct_scope_end(s);
 *
 * Ownership: layers own their parameter tensors (leaves that require grad,
 * outside any scope) until their _free. A ct_params list and an optimizer
 * hold references of their own to the tensors they are given, so freeing a
 * layer before them is safe. Functions returning ct_tensor * follow core.h:
 * forward results are new handles the caller (or the open scope) owns;
 * accessors (ct_params_get, ct_optim_state_get) return borrowed handles.
 * Errors: NULL / a status, with the message in ct_last_error(). */
#ifndef CTEN_NN_H
#define CTEN_NN_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- parameter lists ---------------------------------------------------------------
 * An ordered list of (name, tensor) pairs, as module.named_parameters() gives:
 * what optimizers update and what a checkpoint saves. */
typedef struct ct_params ct_params;

ct_params *ct_params_new(void);
/* Releases the list's references (NULL is a no-op). */
void ct_params_free(ct_params *p);
/* Appends (name, t), retaining t and copying name. Refuses a name or a
 * tensor handle already in the list. */
ct_status ct_params_add(ct_params *p, const char *name, ct_tensor *t);
int64_t ct_params_count(const ct_params *p);
/* Tensor number index (borrowed), its name into *name when not NULL; NULL
 * with an error when index is out of range. */
ct_tensor *ct_params_get(const ct_params *p, int64_t index, const char **name);
/* The tensor named name (borrowed), or NULL with an error. */
ct_tensor *ct_params_find(const ct_params *p, const char *name);

/* ---- layers ---------------------------------------------------------------------------
 * Each layer: _new(...) creates its parameters on device with dtype
 * (floating), drawn from gen (NULL: the default generator) with PyTorch's
 * default initialisation, or returns NULL with an error on bad arguments;
 * _forward(m, x) runs the functional op; _params(m, prefix, list) appends
 * "prefix.weight" and "prefix.bias" (just "weight"/"bias" for a NULL or empty
 * prefix); _free(m) releases the layer's references (NULL is a no-op).
 * Fields are for reading; replace a parameter's values in place, in no-grad
 * mode, never its handle. */

/* torch.nn.Linear: y = x @ weight^T + bias; weight [out, in] and bias [out]
 * ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform_ with a = sqrt(5)). */
typedef struct ct_nn_linear {
    int64_t in_features, out_features;
    ct_tensor *weight; /* [out_features, in_features] */
    ct_tensor *bias;   /* [out_features], or NULL */
} ct_nn_linear;
ct_nn_linear *ct_nn_linear_new(int64_t in_features, int64_t out_features, bool bias,
                               ct_dtype dtype, ct_device device, ct_generator *gen);
ct_tensor *ct_nn_linear_forward(ct_nn_linear *m, ct_tensor *x);
ct_status ct_nn_linear_params(ct_nn_linear *m, const char *prefix, ct_params *p);
void ct_nn_linear_free(ct_nn_linear *m);

/* torch.nn.Conv2d: weight [out, in/groups, kh, kw] and bias [out] ~
 * U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = in/groups * kh * kw.
 * stride, padding, dilation may be NULL for 1, 0, 1. */
typedef struct ct_nn_conv2d {
    int64_t in_channels, out_channels, kernel[2], stride[2], padding[2], dilation[2], groups;
    ct_tensor *weight;
    ct_tensor *bias; /* or NULL */
} ct_nn_conv2d;
ct_nn_conv2d *ct_nn_conv2d_new(int64_t in_channels, int64_t out_channels,
                               const int64_t kernel[2], const int64_t stride[2],
                               const int64_t padding[2], const int64_t dilation[2],
                               int64_t groups, bool bias, ct_dtype dtype, ct_device device,
                               ct_generator *gen);
ct_tensor *ct_nn_conv2d_forward(ct_nn_conv2d *m, ct_tensor *x);
ct_status ct_nn_conv2d_params(ct_nn_conv2d *m, const char *prefix, ct_params *p);
void ct_nn_conv2d_free(ct_nn_conv2d *m);

/* torch.nn.Embedding: weight [num_embeddings, embedding_dim] ~ N(0, 1);
 * forward takes int64/int32 indices of any shape. */
typedef struct ct_nn_embedding {
    int64_t num_embeddings, embedding_dim;
    ct_tensor *weight;
} ct_nn_embedding;
ct_nn_embedding *ct_nn_embedding_new(int64_t num_embeddings, int64_t embedding_dim,
                                     ct_dtype dtype, ct_device device, ct_generator *gen);
ct_tensor *ct_nn_embedding_forward(ct_nn_embedding *m, ct_tensor *indices);
ct_status ct_nn_embedding_params(ct_nn_embedding *m, const char *prefix, ct_params *p);
void ct_nn_embedding_free(ct_nn_embedding *m);

/* torch.nn.RMSNorm over the trailing normalized_shape (eps >= 0; PyTorch's
 * eps=None is the dtype's machine epsilon). weight = ones when
 * elementwise_affine, else NULL. */
typedef struct ct_nn_rms_norm {
    int nnorm;
    int64_t normalized_shape[CT_MAX_DIMS];
    double eps;
    ct_tensor *weight; /* or NULL */
} ct_nn_rms_norm;
ct_nn_rms_norm *ct_nn_rms_norm_new(int nnorm, const int64_t *normalized_shape, double eps,
                                   bool elementwise_affine, ct_dtype dtype, ct_device device);
ct_tensor *ct_nn_rms_norm_forward(ct_nn_rms_norm *m, ct_tensor *x);
ct_status ct_nn_rms_norm_params(ct_nn_rms_norm *m, const char *prefix, ct_params *p);
void ct_nn_rms_norm_free(ct_nn_rms_norm *m);

/* torch.nn.LayerNorm (eps 1e-5 in PyTorch): weight = ones and bias = zeros
 * when elementwise_affine (bias only when bias is true), else NULL. */
typedef struct ct_nn_layer_norm {
    int nnorm;
    int64_t normalized_shape[CT_MAX_DIMS];
    double eps;
    ct_tensor *weight; /* or NULL */
    ct_tensor *bias;   /* or NULL */
} ct_nn_layer_norm;
ct_nn_layer_norm *ct_nn_layer_norm_new(int nnorm, const int64_t *normalized_shape, double eps,
                                       bool elementwise_affine, bool bias, ct_dtype dtype,
                                       ct_device device);
ct_tensor *ct_nn_layer_norm_forward(ct_nn_layer_norm *m, ct_tensor *x);
ct_status ct_nn_layer_norm_params(ct_nn_layer_norm *m, const char *prefix, ct_params *p);
void ct_nn_layer_norm_free(ct_nn_layer_norm *m);

/* ---- optimizers ---------------------------------------------------------------------------
 * An optimizer keeps its own references to the tensors of params (the list
 * may be freed afterwards) and updates, at each ct_optim_step, every one that
 * has a gradient (those without are skipped, their state untouched). Updates
 * run in no-grad mode, in place, on the parameter's device and in its dtype,
 * with state tensors of the same kind: one fused kernel per (device, dtype)
 * of the parameters (on a GPU one launch per up to 48 parameters),
 * float16/bfloat16 computed in float32 and rounded once (or kept in float32
 * master weights, ct_optim_set_master_weights).
 *
 * Nothing is read back from a GPU, and a GPU step can be recorded in a CUDA
 * graph and replayed (torch.optim's capturable=True): a GPU parameter's
 * step count and the learning rate live on its device and the kernel reads
 * them (the bias corrections are computed there), so each replay counts
 * one more step, and ct_optim_set_lr between replays takes effect. A CPU
 * parameter's count lives on the CPU, read and advanced by the host. */
typedef struct ct_optimizer ct_optimizer;

/* torch.optim.SGD (maximize=False). With g = grad + weight_decay * p:
 *   momentum != 0: buf = g on the first step, else buf = momentum * buf +
 *   (1 - dampening) * g; g = nesterov ? g + momentum * buf : buf;
 *   p -= lr * g.
 * lr, momentum, weight_decay >= 0; nesterov needs momentum > 0 and
 * dampening == 0. */
ct_optimizer *ct_optim_sgd_new(const ct_params *params, double lr, double momentum,
                               double dampening, double weight_decay, bool nesterov);
/* torch.optim.AdamW (amsgrad=False). Per parameter, with t its step count:
 *   p *= 1 - lr * weight_decay; m = beta1 * m + (1 - beta1) * g;
 *   v = beta2 * v + (1 - beta2) * g^2; bc1 = 1 - beta1^t; bc2 = 1 - beta2^t;
 *   p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps).
 * PyTorch's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay
 * 1e-2. lr, eps, weight_decay >= 0; 0 <= beta < 1. */
ct_optimizer *ct_optim_adamw_new(const ct_params *params, double lr, double beta1,
                                 double beta2, double eps, double weight_decay);
/* Never waits for a GPU. A CPU parameter's count is checked first (a
 * restored count that is no whole number >= 0 is refused); a count on a GPU
 * is not (the check would wait for the device). */
ct_status ct_optim_step(ct_optimizer *opt);
/* Drops every parameter's gradient (zero_grad(set_to_none=True)). */
void ct_optim_zero_grad(ct_optimizer *opt);
/* The learning rate the next step uses (lr >= 0). On a GPU it queues a
 * write of the device's copy, ordered before the next step or graph replay
 * on that device's stream; call it outside a capture (a write recorded in
 * a graph would set the value again at every replay). */
ct_status ct_optim_set_lr(ct_optimizer *opt, double lr);
double ct_optim_get_lr(const ct_optimizer *opt);
/* The momentum the next step uses, as torch's schedulers set it: SGD's and
 * RMSprop's momentum (> 0; not for one created with momentum 0, which keeps
 * no momentum buffer), Adam's and AdamW's
 * beta1 (in [0, 1); the bias correction 1 - beta1^t uses the current value,
 * as torch's does). Adagrad has none. A hyperparameter given to each step's
 * kernels: a step recorded in a CUDA graph replays the momentum it was
 * recorded with. Nothing changes on failure. */
ct_status ct_optim_set_momentum(ct_optimizer *opt, double momentum);
/* SGD's or RMSprop's momentum, or beta1; NAN with an error for Adagrad or
 * NULL. */
double ct_optim_get_momentum(const ct_optimizer *opt);
/* Parameter k's weight decay (k in the order of the list given at
 * creation), replacing the constructor's for it alone, as a torch.optim
 * parameter group of its own would: language models decay their matrices
 * but not their norms' gains and biases. weight_decay >= 0. Takes effect
 * at the next step; a hyperparameter, not state (checkpoints do not keep
 * it). A step dispatches one update per distinct value. */
ct_status ct_optim_set_weight_decay(ct_optimizer *opt, int64_t k, double weight_decay);
/* Parameter k's weight decay; NAN with an error for a NULL optimizer or k
 * out of range. */
double ct_optim_get_weight_decay(const ct_optimizer *opt, int64_t k);
/* Master weights (PyTorch users keep a float32 copy by hand): with enable,
 * every float16/bfloat16 parameter gets a float32 copy of its values that
 * the updates read and write, with float32 states, and after each update
 * the parameter receives the master rounded to its dtype (to nearest even);
 * float32 and float64 parameters are unchanged. The gradients stay in the
 * parameter's dtype. Disabling drops the masters and rounds the states to
 * the parameter's dtype. Either replaces the state tensors of the
 * low-precision parameters (handles from ct_optim_state_get taken before
 * are released) and changes ct_optim_state_count; call it right after
 * creating the optimizer, before restoring a checkpoint into it. Nothing
 * changes on failure. */
ct_status ct_optim_set_master_weights(ct_optimizer *opt, bool enable);
void ct_optim_free(ct_optimizer *opt);

/* The optimizer's state, for checkpoints: ct_optim_state_count tensors, in
 * a fixed order (parameter by parameter, in the order of the list given at
 * creation), each named "<k>.<what>" with k the parameter's index:
 *   SGD:   "<k>.step" and, when momentum != 0, "<k>.momentum_buffer";
 *   AdamW: "<k>.step", "<k>.exp_avg", "<k>.exp_avg_sq";
 *   then, with master weights, "<k>.master_param" for a float16/bfloat16
 *   parameter (float32, its shape and device; its states are float32 too).
 * "<k>.step" is a 0-d float64 tensor on the parameter's device counting
 * the updates parameter k received (a momentum buffer is used from the
 * first update on, when step > 0); the others have the parameter's shape,
 * dtype and device. The tensors exist from the optimizer's creation and
 * the optimizer reads them at every step, so copying saved values into them
 * (ct_copy_) restores a checkpoint. Borrowed handles; NULL with an error
 * when k is out of range. */
int64_t ct_optim_state_count(const ct_optimizer *opt);
ct_tensor *ct_optim_state_get(const ct_optimizer *opt, int64_t k, const char **name);

/* ---- gradient scaling for float16 training (torch.amp.GradScaler) ----------------------------
 * The loop:
 *
 *     ct_grad_scaler *sc = ct_grad_scaler_new(CT_CUDA(0), 65536, 2, 0.5, 2000, true);
 *     ...
 *     ct_backward(ct_grad_scaler_scale(sc, loss), NULL, false); // scaler.scale(loss).backward()
 *     ct_grad_scaler_unscale(sc, opt);              // optional: before clipping
 *     ct_clip_grad_norm(params, 1.0, NULL);
 *     ct_grad_scaler_step(sc, opt);                 // skipped on the device on inf/NaN
 *     ct_grad_scaler_update(sc);                    // backoff or growth of the scale
 *
 * The scale, the growth tracker and each optimizer's found_inf live on the
 * scaler's device and only kernels read them: no call but
 * ct_grad_scaler_get_scale and ct_grad_scaler_get_state waits for the
 * device, and a scaled step can be recorded in a CUDA graph (run one step
 * eagerly first: an optimizer's first unscale creates its found_inf). The
 * optimizers' parameters (those with gradients) must be on the scaler's
 * device. Not thread-safe: one scaler per training loop. */
typedef struct ct_grad_scaler ct_grad_scaler;

/* A scaler on device with scale init_scale (> 0, finite; torch's 65536),
 * growth_factor (> 1; 2), backoff_factor (in (0, 1); 0.5) and
 * growth_interval (1 .. 2^31 - 1; 2000). A disabled scaler (enabled false)
 * makes every call a pass-through: scale returns the loss, step is
 * ct_optim_step, unscale and update do nothing, get_scale gives 1. NULL
 * with an error on bad arguments or a device that is not present. */
ct_grad_scaler *ct_grad_scaler_new(ct_device device, double init_scale, double growth_factor,
                                   double backoff_factor, int64_t growth_interval, bool enabled);
void ct_grad_scaler_free(ct_grad_scaler *sc);
/* New tensor: loss * scale (recorded by autograd; type promotion as ct_mul
 * with a 0-d float32, so a float16 0-d loss gives float32). loss must be
 * floating and on the scaler's device. */
ct_tensor *ct_grad_scaler_scale(ct_grad_scaler *sc, ct_tensor *loss);
/* torch's unscale_(optimizer): in place, every gradient of opt's
 * parameters *= 1 / scale (in the gradient's dtype; float64 reciprocal
 * rounded to float32), and the optimizer's found_inf set where a gradient
 * held an inf or NaN, in one kernel per device (multi-tensor). At most once
 * per optimizer between updates, and not after its step: both are refused. */
ct_status ct_grad_scaler_unscale(ct_grad_scaler *sc, ct_optimizer *opt);
/* torch's step(optimizer): unscales first unless ct_grad_scaler_unscale
 * did, then runs the optimizer's update, which skips itself on the device
 * when found_inf is not zero (parameters, states and step counts stay as
 * they were, bit for bit). Once per optimizer between updates. */
ct_status ct_grad_scaler_step(ct_grad_scaler *sc, ct_optimizer *opt);
/* torch's update(): on the device, with found_inf summed over the
 * optimizers unscaled since the last update: any inf: scale *=
 * backoff_factor and the growth tracker = 0; else the tracker counts one
 * more good step and at growth_interval scale *= growth_factor (unless that
 * is not finite in float32) and the tracker restarts at 0. Refused when no
 * optimizer was unscaled or stepped since the last update. */
ct_status ct_grad_scaler_update(ct_grad_scaler *sc);
/* The current scale (1 when disabled; NAN with an error for NULL). WAITS
 * for the device: it reads the scale back. */
double ct_grad_scaler_get_scale(const ct_grad_scaler *sc);

/* What a checkpoint keeps of a scaler (torch's state_dict: "scale",
 * "_growth_tracker"); the hyperparameters are the constructor's. */
typedef struct ct_grad_scaler_state {
    double scale;           /* > 0, finite */
    int64_t growth_tracker; /* good steps since the last change, 0 .. growth_interval - 1 */
} ct_grad_scaler_state;
/* Reads the state back (WAITS for the device). A disabled scaler has no
 * state: refused. */
ct_status ct_grad_scaler_get_state(const ct_grad_scaler *sc, ct_grad_scaler_state *state);
/* Queues writes of the state to the device (no wait); a no-op for a
 * disabled scaler. Refuses a scale that is not finite and > 0 and a tracker
 * outside [0, growth_interval). */
ct_status ct_grad_scaler_set_state(ct_grad_scaler *sc, const ct_grad_scaler_state *state);

/* ---- learning-rate schedules (pure functions of the step; NAN with an error
 * on bad arguments) ------------------------------------------------------------------------- */
/* torch.optim.lr_scheduler.StepLR: base_lr * gamma^floor(step / step_size);
 * step >= 0, step_size >= 1. */
double ct_lr_step(double base_lr, int64_t step_size, double gamma, int64_t step);
/* Linear warmup from 0, then cosine decay to min_lr:
 *   step < warmup_steps:  base_lr * step / warmup_steps
 *   step < total_steps:   min_lr + (base_lr - min_lr) * (1 + cos(pi * p)) / 2,
 *                         p = (step - warmup_steps) / (total_steps - warmup_steps)
 *   otherwise:            min_lr
 * 0 <= warmup_steps <= total_steps, total_steps >= 1, step >= 0. */
double ct_lr_cosine_warmup(double base_lr, int64_t warmup_steps, int64_t total_steps,
                           double min_lr, int64_t step);

/* torch.nn.utils.clip_grad_norm_ (norm_type 2): total = the L2 norm of all
 * gradients of params together; when max_norm / (total + 1e-6) < 1 every
 * gradient is scaled by it (a non-finite total makes the gradients
 * non-finite, as in torch; no error). *total_norm (when not NULL) gets
 * total, before clipping. Parameters without gradients are skipped;
 * max_norm > 0. Host waits: gradients on one GPU are clipped on the device
 * (as torch does: the coefficient clamped to 1 is multiplied into every
 * gradient, in float32, float64 when a gradient is) and the host waits
 * only to read total_norm, so pass NULL in a step meant to be recorded in a
 * CUDA graph; CPU gradients are read on the host (no device); gradients on
 * several devices wait once per gradient. */
ct_status ct_clip_grad_norm(const ct_params *params, double max_norm, double *total_norm);

/* ---- more optimizers (torch.optim, single-tensor formulas, maximize=False,
 * foreach/fused as the kernels choose) -------------------------------------------------------
 * As SGD and AdamW above: fused multi-tensor kernels per (device, dtype),
 * capturable on a GPU, master weights, per-parameter weight decay, state
 * through ct_optim_state_get ("<k>.step" first, then the buffers named
 * below, then "<k>.master_param"). g is the gradient, t the step count
 * including this update. NULL with an error on bad hyperparameters. */

/* torch.optim.Adam (weight decay added to the gradient, not decoupled):
 *   g += weight_decay * p; m = beta1 m + (1 - beta1) g;
 *   v = beta2 v + (1 - beta2) g^2; amsgrad: vmax = max(vmax, v), used as v;
 *   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps).
 * States "exp_avg", "exp_avg_sq" and, with amsgrad, "max_exp_avg_sq".
 * torch's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.
 * lr, eps, weight_decay >= 0; 0 <= beta < 1. */
ct_optimizer *ct_optim_adam_new(const ct_params *params, double lr, double beta1, double beta2,
                                double eps, double weight_decay, bool amsgrad);
/* torch.optim.RMSprop:
 *   g += weight_decay * p; sq = alpha sq + (1 - alpha) g^2;
 *   centered: ga = alpha ga + (1 - alpha) g, avg = sqrt(sq - ga^2) + eps,
 *   else avg = sqrt(sq) + eps; momentum > 0: buf = momentum buf + g / avg,
 *   p -= lr buf; else p -= lr g / avg.
 * States "square_avg", then "momentum_buffer" (momentum > 0) and
 * "grad_avg" (centered). torch's defaults: lr 1e-2, alpha 0.99, eps 1e-8,
 * weight_decay 0, momentum 0, centered false. All >= 0. */
ct_optimizer *ct_optim_rmsprop_new(const ct_params *params, double lr, double alpha, double eps,
                                   double weight_decay, double momentum, bool centered);
/* torch.optim.Adagrad:
 *   g += weight_decay * p; clr = lr / (1 + (t - 1) lr_decay); sum += g^2;
 *   p -= clr g / (sqrt(sum) + eps).
 * State "sum", starting at initial_accumulator_value. torch's defaults:
 * lr 1e-2, lr_decay 0, weight_decay 0, initial_accumulator_value 0,
 * eps 1e-10. All >= 0. */
ct_optimizer *ct_optim_adagrad_new(const ct_params *params, double lr, double lr_decay,
                                   double weight_decay, double initial_accumulator_value,
                                   double eps);

/* ---- more learning-rate schedules (torch.optim.lr_scheduler) ------------------------------- */
/* LinearLR's closed form: base_lr * (start_factor + (end_factor -
 * start_factor) * min(step, total_iters) / total_iters); start_factor in
 * (0, 1], end_factor in [0, 1], total_iters >= 1, step >= 0 (torch's
 * defaults 1/3, 1, 5). NAN with an error on bad arguments. */
double ct_lr_linear(double base_lr, double start_factor, double end_factor, int64_t total_iters,
                    int64_t step);
/* OneCycleLR's learning rate after step steps (0 <= step <= total_steps,
 * as torch refuses stepping past total_steps): from max_lr / div_factor up
 * to max_lr over the first pct_start of the steps, then down to
 * max_lr / div_factor / final_div_factor (three_phase: back to the initial
 * rate first, then down), annealed by cosine (anneal_cos) or linearly.
 * torch's defaults: pct_start 0.3, cos, div_factor 25, final_div_factor
 * 1e4, three_phase false. NAN with an error on bad arguments or a phase of
 * no length. */
double ct_lr_one_cycle(double max_lr, int64_t total_steps, double pct_start, bool anneal_cos,
                       double div_factor, double final_div_factor, bool three_phase,
                       int64_t step);
/* OneCycleLR's momentum after step steps (its cycle_momentum, on by default
 * in torch): the rate's cycle mirrored, from max_momentum down to
 * base_momentum while the rate rises, back up while it falls (three_phase:
 * then held at max_momentum). torch's defaults 0.85 and 0.95. Give it to
 * ct_optim_set_momentum each step, as torch sets momentum or betas[0].
 * NAN with an error as ct_lr_one_cycle, or for momenta that are not
 * finite. */
double ct_momentum_one_cycle(double base_momentum, double max_momentum, int64_t total_steps,
                             double pct_start, bool anneal_cos, bool three_phase, int64_t step);

/* torch.optim.lr_scheduler.ReduceLROnPlateau over one optimizer's learning
 * rate (borrowed: free the scheduler before the optimizer). mode_max:
 * 'max' (else 'min'); threshold_abs: threshold_mode 'abs' (else 'rel').
 * torch's defaults: min, factor 0.1, patience 10, threshold 1e-4, rel,
 * cooldown 0, min_lr 0, eps 1e-8. factor in [0, 1); patience, cooldown >= 0;
 * threshold, min_lr, eps finite and >= 0. NULL with an error. */
typedef struct ct_lr_plateau ct_lr_plateau;
ct_lr_plateau *ct_lr_plateau_new(ct_optimizer *opt, bool mode_max, double factor,
                                 int64_t patience, double threshold, bool threshold_abs,
                                 int64_t cooldown, double min_lr, double eps);
void ct_lr_plateau_free(ct_lr_plateau *s);
/* torch's step(metrics): counts a bad epoch unless metric is better than
 * the best by the threshold (NaN never is); after more than patience bad
 * epochs outside a cooldown sets lr = max(lr * factor, min_lr) when that
 * lowers it by more than eps (ct_optim_set_lr), then cools down. */
ct_status ct_lr_plateau_step(ct_lr_plateau *s, double metric);
/* What a checkpoint keeps (torch's state_dict fields of the same names). */
typedef struct ct_lr_plateau_state {
    double best;              /* +inf (min) / -inf (max) before the first step */
    int64_t num_bad_epochs;
    int64_t cooldown_counter;
    int64_t last_epoch;
} ct_lr_plateau_state;
ct_status ct_lr_plateau_get_state(const ct_lr_plateau *s, ct_lr_plateau_state *state);
/* Refuses negative counters and a NaN best. */
ct_status ct_lr_plateau_set_state(ct_lr_plateau *s, const ct_lr_plateau_state *state);
/* ---- layers: batch/group/instance norm, conv1d, conv_transpose2d -------------------------
 * As the layers above: _new, _forward, _params (weight, bias), _free. The norms with
 * running statistics also have _buffers(m, prefix, list), appending "prefix.running_mean"
 * and "prefix.running_var" (torch's named_buffers) to a list a checkpoint can save beside
 * the parameters (optimizers skip them: they never have a gradient). */

/* torch.nn.BatchNorm2d(num_features, eps, momentum, affine, track_running_stats): weight =
 * ones and bias = zeros when affine; running_mean = zeros and running_var = ones when
 * track_running_stats (dtype float32 for float16/bfloat16 layers, else the layer's).
 * training (true after _new): forward normalizes with the batch's statistics and updates
 * the running ones; false: with the running ones (batch statistics without them). */
typedef struct ct_nn_batch_norm2d {
    int64_t num_features;
    double eps, momentum;
    bool training;
    ct_tensor *weight, *bias;             /* [C] or NULL */
    ct_tensor *running_mean, *running_var; /* [C] or NULL */
} ct_nn_batch_norm2d;
ct_nn_batch_norm2d *ct_nn_batch_norm2d_new(int64_t num_features, double eps, double momentum,
                                           bool affine, bool track_running_stats,
                                           ct_dtype dtype, ct_device device);
/* x [N, C, H, W]. */
ct_tensor *ct_nn_batch_norm2d_forward(ct_nn_batch_norm2d *m, ct_tensor *x);
ct_status ct_nn_batch_norm2d_params(ct_nn_batch_norm2d *m, const char *prefix, ct_params *p);
ct_status ct_nn_batch_norm2d_buffers(ct_nn_batch_norm2d *m, const char *prefix, ct_params *p);
void ct_nn_batch_norm2d_free(ct_nn_batch_norm2d *m);

/* torch.nn.GroupNorm(num_groups, num_channels, eps, affine): weight = ones, bias = zeros
 * when affine. */
typedef struct ct_nn_group_norm {
    int64_t num_groups, num_channels;
    double eps;
    ct_tensor *weight, *bias; /* [C] or NULL */
} ct_nn_group_norm;
ct_nn_group_norm *ct_nn_group_norm_new(int64_t num_groups, int64_t num_channels, double eps,
                                       bool affine, ct_dtype dtype, ct_device device);
ct_tensor *ct_nn_group_norm_forward(ct_nn_group_norm *m, ct_tensor *x);
ct_status ct_nn_group_norm_params(ct_nn_group_norm *m, const char *prefix, ct_params *p);
void ct_nn_group_norm_free(ct_nn_group_norm *m);

/* torch.nn.InstanceNorm2d(num_features, eps, momentum, affine, track_running_stats) (PyTorch's
 * defaults: affine and track_running_stats false). Training uses the instance statistics
 * (updating the running ones when tracked); eval uses the running ones when tracked. */
typedef struct ct_nn_instance_norm2d {
    int64_t num_features;
    double eps, momentum;
    bool training;
    ct_tensor *weight, *bias;             /* [C] or NULL */
    ct_tensor *running_mean, *running_var; /* [C] or NULL */
} ct_nn_instance_norm2d;
ct_nn_instance_norm2d *ct_nn_instance_norm2d_new(int64_t num_features, double eps,
                                                 double momentum, bool affine,
                                                 bool track_running_stats, ct_dtype dtype,
                                                 ct_device device);
ct_tensor *ct_nn_instance_norm2d_forward(ct_nn_instance_norm2d *m, ct_tensor *x);
ct_status ct_nn_instance_norm2d_params(ct_nn_instance_norm2d *m, const char *prefix,
                                       ct_params *p);
ct_status ct_nn_instance_norm2d_buffers(ct_nn_instance_norm2d *m, const char *prefix,
                                        ct_params *p);
void ct_nn_instance_norm2d_free(ct_nn_instance_norm2d *m);

/* torch.nn.Conv1d: weight [out, in/groups, k], bias [out] ~ U(-1/sqrt(fan_in), ..) with
 * fan_in = in/groups * k. */
typedef struct ct_nn_conv1d {
    int64_t in_channels, out_channels, kernel_size, stride, padding, dilation, groups;
    ct_tensor *weight;
    ct_tensor *bias; /* or NULL */
} ct_nn_conv1d;
ct_nn_conv1d *ct_nn_conv1d_new(int64_t in_channels, int64_t out_channels, int64_t kernel_size,
                               int64_t stride, int64_t padding, int64_t dilation, int64_t groups,
                               bool bias, ct_dtype dtype, ct_device device, ct_generator *gen);
ct_tensor *ct_nn_conv1d_forward(ct_nn_conv1d *m, ct_tensor *x);
ct_status ct_nn_conv1d_params(ct_nn_conv1d *m, const char *prefix, ct_params *p);
void ct_nn_conv1d_free(ct_nn_conv1d *m);

/* torch.nn.ConvTranspose2d: weight [in, out/groups, kh, kw], bias [out] ~ U(-b, b) with
 * b = 1/sqrt(fan_in), fan_in = out/groups * kh * kw (torch's fan of the weight's dim 1).
 * stride, padding, output_padding, dilation may be NULL for 1, 0, 0, 1. */
typedef struct ct_nn_conv_transpose2d {
    int64_t in_channels, out_channels, kernel[2], stride[2], padding[2], output_padding[2],
        dilation[2], groups;
    ct_tensor *weight;
    ct_tensor *bias; /* or NULL */
} ct_nn_conv_transpose2d;
ct_nn_conv_transpose2d *ct_nn_conv_transpose2d_new(
    int64_t in_channels, int64_t out_channels, const int64_t kernel[2], const int64_t stride[2],
    const int64_t padding[2], const int64_t output_padding[2], int64_t groups, bool bias,
    const int64_t dilation[2], ct_dtype dtype, ct_device device, ct_generator *gen);
ct_tensor *ct_nn_conv_transpose2d_forward(ct_nn_conv_transpose2d *m, ct_tensor *x);
ct_status ct_nn_conv_transpose2d_params(ct_nn_conv_transpose2d *m, const char *prefix,
                                        ct_params *p);
void ct_nn_conv_transpose2d_free(ct_nn_conv_transpose2d *m);

#ifdef __cplusplus
}
#endif
#endif
