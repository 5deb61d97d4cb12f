/* Small kernel launches the runtime issues itself (fill, divide, accumulate). */
#include "core/core_int.h"

static fsdp_status_t launch(fsdp_t *fs, fsdp_stream_t *s, const fsdp_kernel_t *k)
{
    return fsdp_dev_kernel(fs->dev, s, k);
}

fsdp_status_t fsdp_k_fill(fsdp_t *fs, fsdp_stream_t *s, void *x, fsdp_dtype_t dtype, size_t n,
                          double value)
{
    fsdp_kernel_t k = {.kind = FSDP_K_FILL};
    if (n == 0)
        return FSDP_OK;
    k.u.fill.x = x;
    k.u.fill.dtype = dtype;
    k.u.fill.n = n;
    k.u.fill.value = value;
    return launch(fs, s, &k);
}

fsdp_status_t fsdp_k_div(fsdp_t *fs, fsdp_stream_t *s, void *x, fsdp_dtype_t dtype, size_t n,
                         float divisor)
{
    fsdp_kernel_t k = {.kind = FSDP_K_DIV};
    if (n == 0 || divisor == 1.0f)
        return FSDP_OK; /* a factor of 1 is not applied (docs/runtime.md section 4) */
    k.u.scale.x = x;
    k.u.scale.dtype = dtype;
    k.u.scale.n = n;
    k.u.scale.alpha = divisor;
    return launch(fs, s, &k);
}

fsdp_status_t fsdp_k_axpy(fsdp_t *fs, fsdp_stream_t *s, float *y, const float *x, size_t n,
                          float alpha)
{
    fsdp_kernel_t k = {.kind = FSDP_K_AXPY};
    if (n == 0)
        return FSDP_OK;
    k.u.axpy.y = y;
    k.u.axpy.y_dtype = FSDP_DTYPE_F32;
    k.u.axpy.x = x;
    k.u.axpy.x_dtype = FSDP_DTYPE_F32;
    k.u.axpy.n = n;
    k.u.axpy.alpha = alpha;
    return launch(fs, s, &k);
}

fsdp_status_t fsdp_k_cast(fsdp_t *fs, fsdp_stream_t *s, void *dst, fsdp_dtype_t dst_dtype,
                          const void *src, fsdp_dtype_t src_dtype, size_t n)
{
    fsdp_kernel_t k = {.kind = FSDP_K_CAST};
    if (n == 0)
        return FSDP_OK;
    k.u.cast.dst = dst;
    k.u.cast.dst_dtype = dst_dtype;
    k.u.cast.src = src;
    k.u.cast.src_dtype = src_dtype;
    k.u.cast.n = n;
    return launch(fs, s, &k);
}
