/* dtypes: sizes, names, promotion and the half-precision conversions. */
#include <stdio.h>

#include "tensor_impl.h"

size_t ct_dtype_size(ct_dtype dt) {
    static const size_t sizes[CT_NUM_DTYPES] = {1, 4, 8, 2, 2, 4, 8};
    return (unsigned)dt < CT_NUM_DTYPES ? sizes[dt] : 0;
}

const char *ct_dtype_name(ct_dtype dt) {
    static const char *names[CT_NUM_DTYPES] = {"bool",    "int32",    "int64",  "float16",
                                               "bfloat16", "float32", "float64"};
    return (unsigned)dt < CT_NUM_DTYPES ? names[dt] : "invalid";
}

bool ct_dtype_is_floating(ct_dtype dt) {
    return dt == CT_F16 || dt == CT_BF16 || dt == CT_F32 || dt == CT_F64;
}

bool ct_dtype_is_integral(ct_dtype dt) { return dt == CT_BOOL || dt == CT_I32 || dt == CT_I64; }

ct_dtype ct_promote_types(ct_dtype a, ct_dtype b) {
    if ((unsigned)a >= CT_NUM_DTYPES || (unsigned)b >= CT_NUM_DTYPES) {
        cti_error(CT_ERR_DTYPE, "ct_promote_types: invalid dtype %d (expected 0..%d)",
                  (unsigned)a >= CT_NUM_DTYPES ? (int)a : (int)b, (int)CT_NUM_DTYPES - 1);
        return CT_NUM_DTYPES;
    }
    if (a == b) return a;
    if ((a == CT_F16 && b == CT_BF16) || (a == CT_BF16 && b == CT_F16)) return CT_F32;
    /* Elsewhere the enum order is the promotion order: bool < ints < floats,
     * and wider after narrower within each category. */
    return a > b ? a : b;
}

bool cti_can_cast(ct_dtype from, ct_dtype to) {
    if (ct_dtype_is_floating(from) && !ct_dtype_is_floating(to)) return false;
    if (from != CT_BOOL && to == CT_BOOL) return false;
    return true;
}

/* PyTorch's result_type: operands fall in three groups (tensors with dims,
 * 0-d tensors, wrapped numbers); a lower group only matters when it brings a
 * higher category (bool < integer < floating). Wrapped floats count as the
 * default dtype, float32. */
#define CTI_UNDEF (-1)

static int promote_skip_undef(int a, int b) {
    if (a == CTI_UNDEF) return b;
    if (b == CTI_UNDEF) return a;
    return (int)ct_promote_types((ct_dtype)a, (ct_dtype)b);
}

static int combine_categories(int higher, int lower) {
    if (higher != CTI_UNDEF && ct_dtype_is_floating((ct_dtype)higher)) return higher;
    if (higher == CT_BOOL || (lower != CTI_UNDEF && ct_dtype_is_floating((ct_dtype)lower)))
        return promote_skip_undef(higher, lower);
    if (higher != CTI_UNDEF) return higher;
    return lower;
}

ct_dtype cti_result_type(int n, ct_tensor *const *ts) {
    int dim_r = CTI_UNDEF, zero_r = CTI_UNDEF, wrapped_r = CTI_UNDEF;
    for (int i = 0; i < n; i++) {
        const ct_tensor *t = ts[i];
        if (!t) continue;
        if (t->wrapped_number) {
            int d = ct_dtype_is_floating(t->dtype) ? CT_F32 : (int)t->dtype;
            wrapped_r = promote_skip_undef(wrapped_r, d);
        } else if (t->ndim == 0) {
            zero_r = promote_skip_undef(zero_r, t->dtype);
        } else {
            dim_r = promote_skip_undef(dim_r, t->dtype);
        }
    }
    int r = combine_categories(dim_r, combine_categories(zero_r, wrapped_r));
    return r == CTI_UNDEF ? CT_F32 : (ct_dtype)r;
}

char *ct_device_str(ct_device d, char *buf, size_t n) {
    if (!buf || n == 0) return buf;
    switch (d.type) {
    case CT_DEVICE_CPU: snprintf(buf, n, "cpu"); break;
    case CT_DEVICE_CUDA: snprintf(buf, n, "cuda:%d", d.index); break;
    default: snprintf(buf, n, "device(%d):%d", (int)d.type, d.index); break;
    }
    return buf;
}

bool ct_device_eq(ct_device a, ct_device b) {
    return a.type == b.type && (a.type == CT_DEVICE_CPU || a.index == b.index);
}

/* ---- half precision ------------------------------------------------------------
 * The conversions are tensor_impl.h's inline ones, which the CPU kernels'
 * loops use directly. */
uint16_t ct_f32_to_f16(float f) { return cti_f32_to_f16(f); }

float ct_f16_to_f32(uint16_t h) { return cti_f16_to_f32(h); }

uint16_t ct_f32_to_bf16(float f) { return cti_f32_to_bf16(f); }

float ct_bf16_to_f32(uint16_t h) { return cti_bf16_to_f32(h); }
