/* Element bodies of the element-wise kernels (kernel.h), shared by the sim and gpu backends.
 * Each function computes one element; a backend supplies the loop or the grid. */
#ifndef FSDP_KERNELS_ELEMENTWISE_H
#define FSDP_KERNELS_ELEMENTWISE_H

#include <math.h>
#include <stddef.h>

#include <fsdp/types.h>

#include "kernels/convert.h"

/* f32 to i32 rounding toward zero, saturated, NaN as 0: what CUDA's conversion does, and no
 * undefined behaviour on the host for values out of range. */
FSDP_HD int32_t fsdp_kb_f32_to_i32(float v)
{
    if (v != v)
        return 0;
    if (v <= -2147483648.0f)
        return INT32_MIN;
    if (v >= 2147483648.0f)
        return INT32_MAX;
    return (int32_t)v;
}

/* Load element i of a buffer of any dtype as f32. */
FSDP_HD float fsdp_kb_load(const void *p, fsdp_dtype_t dtype, size_t i)
{
    switch (dtype) {
    case FSDP_DTYPE_F32:
        return ((const float *)p)[i];
    case FSDP_DTYPE_BF16:
        return fsdp_kb_bf16_to_f32(((const uint16_t *)p)[i]);
    case FSDP_DTYPE_F16:
        return fsdp_kb_f16_to_f32(((const uint16_t *)p)[i]);
    case FSDP_DTYPE_I32:
        return (float)((const int32_t *)p)[i];
    default:
        return 0.0f;
    }
}

/* Store f32 value v as element i, rounding to nearest even (i32: toward zero, saturated). */
FSDP_HD void fsdp_kb_store(void *p, fsdp_dtype_t dtype, size_t i, float v)
{
    switch (dtype) {
    case FSDP_DTYPE_F32:
        ((float *)p)[i] = v;
        break;
    case FSDP_DTYPE_BF16:
        ((uint16_t *)p)[i] = fsdp_kb_f32_to_bf16(v);
        break;
    case FSDP_DTYPE_F16:
        ((uint16_t *)p)[i] = fsdp_kb_f32_to_f16(v);
        break;
    case FSDP_DTYPE_I32:
        ((int32_t *)p)[i] = fsdp_kb_f32_to_i32(v);
        break;
    default:
        break;
    }
}

/* torch.lerp's two-sided formula (exact at both ends). */
FSDP_HD float fsdp_kb_lerp(float self, float end, float weight)
{
    return weight < 0.5f ? self + weight * (end - self) : end - (end - self) * (1.0f - weight);
}

/* Scalars of one AdamW step, computed once per step in double as torch does in Python. */
typedef struct fsdp_kb_adamw_scalars {
    float decay;      /* 1 - lr * weight_decay */
    float one_minus_beta1;
    float beta2;
    float one_minus_beta2;
    float neg_step_size; /* -lr / (1 - beta1^t) */
    float bc2_sqrt;      /* sqrt(1 - beta2^t) */
    float eps;
} fsdp_kb_adamw_scalars_t;

FSDP_HD void fsdp_kb_adamw(float *param, float grad, float *exp_avg, float *exp_avg_sq,
                           const fsdp_kb_adamw_scalars_t *s)
{
    float p = *param * s->decay;
    float m = fsdp_kb_lerp(*exp_avg, grad, s->one_minus_beta1);
    float v = *exp_avg_sq * s->beta2 + s->one_minus_beta2 * grad * grad; /* addcmul order */
    float denom = sqrtf(v) / s->bc2_sqrt + s->eps;
    *param = p + s->neg_step_size * m / denom; /* addcdiv: (value * t1) / t2 */
    *exp_avg = m;
    *exp_avg_sq = v;
}

/* torch.optim.SGD (single-tensor path) for one element. */
FSDP_HD void fsdp_kb_sgd(float *param, float grad, float *buf, float lr, float momentum,
                         float dampening, float weight_decay, int nesterov, int first_step)
{
    float g = grad;
    if (weight_decay != 0.0f)
        g = g + weight_decay * *param;
    if (momentum != 0.0f) {
        float b = first_step ? g : *buf * momentum + (1.0f - dampening) * g;
        *buf = b;
        g = nesterov ? g + momentum * b : b;
    }
    *param = *param + (-lr) * g;
}

FSDP_HD float fsdp_kb_relu(float x)
{
    return x > 0.0f ? x : 0.0f;
}

FSDP_HD float fsdp_kb_relu_grad(float dy, float y)
{
    return y > 0.0f ? dy : 0.0f;
}

#endif
