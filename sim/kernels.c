/* Host execution of kernel descriptors (data mode).
 *
 * This file only validates and loops: every per-element or per-column formula is a body of
 * lib/kernels/kernel_elem.h (fsdp_kb_elem and friends), the code the gpu backend launches, and
 * the per-launch scalars come from the same fsdp_kb_prepare(). GEMM runs the blocked routine
 * of gemm.c. Reductions run in a fixed order that depends on the sizes alone: bias_grad sums
 * each column in f32 over 32 row lanes (lanes.h's column shape, fsdp_kb_colsum); mse_loss and
 * sumsq sum their terms in double along the GPU's tree (fsdp_kb_reduce_sum), so the sim and the
 * gpu backend agree bit for bit.
 */
#include "config.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include <fsdp/log.h>

#include "elem_vec.h"
#include "kernels/kernel_elem.h"
#include "sim_kernels.h"

static int fsdp_sim_dtype_valid(fsdp_dtype_t dtype)
{
    return (unsigned)dtype < (unsigned)FSDP_DTYPE_COUNT;
}

static int fsdp_sim_dtype_float(fsdp_dtype_t dtype)
{
    return dtype == FSDP_DTYPE_F32 || dtype == FSDP_DTYPE_BF16 || dtype == FSDP_DTYPE_F16;
}

/* Logs one line naming the kernel and returns FSDP_ERR_INVALID_PARAM. */
#define FSDP_SIM_KERNEL_INVALID(k, fmt, ...)                                                       \
    do {                                                                                           \
        fsdp_error("kernel %s: " fmt, fsdp_kernel_name((k)->kind), __VA_ARGS__);                   \
        return FSDP_ERR_INVALID_PARAM;                                                             \
    } while (0)

/* A buffer of n elements may be NULL only when n is 0. */
#define FSDP_SIM_NEED(k, ptr, n)                                                                   \
    do {                                                                                           \
        if ((ptr) == NULL && (n) > 0)                                                              \
            FSDP_SIM_KERNEL_INVALID(k, "%s is NULL for %zu elements", #ptr, (size_t)(n));          \
    } while (0)

#define FSDP_SIM_NEED_DTYPE(k, dtype, allowed, what)                                               \
    do {                                                                                           \
        if (!(allowed))                                                                            \
            FSDP_SIM_KERNEL_INVALID(k, "%s dtype %d (%s) not allowed, use %s", #dtype,             \
                                    (int)(dtype), fsdp_dtype_name(dtype), what);                   \
    } while (0)

#define FSDP_SIM_NEED_FLOAT(k, dtype)                                                              \
    FSDP_SIM_NEED_DTYPE(k, dtype, fsdp_sim_dtype_float(dtype), "f32, bf16 or f16")

/* A buffer used in place (the same pointer for an input and the output) keeps one dtype. */
#define FSDP_SIM_SAME_IN_PLACE(k, out, out_dtype, in, in_dtype)                                    \
    do {                                                                                           \
        if ((out) != NULL && (const void *)(out) == (const void *)(in) &&                          \
            (out_dtype) != (in_dtype))                                                             \
            FSDP_SIM_KERNEL_INVALID(k, "%s and %s are one buffer with dtypes %s and %s", #out,     \
                                    #in, fsdp_dtype_name(out_dtype), fsdp_dtype_name(in_dtype));   \
    } while (0)

/* Do [a, a + an) and [b, b + bn) (bytes) overlap? */
static int fsdp_sim_overlap(const void *a, size_t an, const void *b, size_t bn)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return an > 0 && bn > 0 && x < y + bn && y < x + an;
}

static fsdp_status_t fsdp_sim_kernel_check(const fsdp_kernel_t *k)
{
    switch (k->kind) {
    case FSDP_K_FILL:
        FSDP_SIM_NEED_DTYPE(k, k->u.fill.dtype, fsdp_sim_dtype_valid(k->u.fill.dtype),
                            "f32, bf16, f16 or i32");
        FSDP_SIM_NEED(k, k->u.fill.x, k->u.fill.n);
        break;
    case FSDP_K_CAST: {
        fsdp_dtype_t sd = k->u.cast.src_dtype, dd = k->u.cast.dst_dtype;
        FSDP_SIM_NEED_DTYPE(k, k->u.cast.src_dtype, fsdp_sim_dtype_valid(sd),
                            "f32, bf16, f16 or i32");
        FSDP_SIM_NEED_DTYPE(k, k->u.cast.dst_dtype, fsdp_sim_dtype_valid(dd),
                            "f32, bf16, f16 or i32");
        FSDP_SIM_NEED(k, k->u.cast.dst, k->u.cast.n);
        FSDP_SIM_NEED(k, k->u.cast.src, k->u.cast.n);
        if (k->u.cast.dst == (const void *)k->u.cast.src) {
            if (sd != dd)
                FSDP_SIM_KERNEL_INVALID(k, "in place from %s to %s (in place needs one dtype)",
                                        fsdp_dtype_name(sd), fsdp_dtype_name(dd));
        } else if (fsdp_sim_overlap(k->u.cast.dst, k->u.cast.n * fsdp_dtype_size(dd), k->u.cast.src,
                                    k->u.cast.n * fsdp_dtype_size(sd))) {
            FSDP_SIM_KERNEL_INVALID(k, "dst and src of %zu elements overlap", k->u.cast.n);
        }
        break;
    }
    case FSDP_K_SCALE:
    case FSDP_K_DIV:
        FSDP_SIM_NEED_DTYPE(k, k->u.scale.dtype, fsdp_sim_dtype_float(k->u.scale.dtype),
                            "f32, bf16 or f16");
        FSDP_SIM_NEED(k, k->u.scale.x, k->u.scale.n);
        break;
    case FSDP_K_AXPY:
        FSDP_SIM_NEED_DTYPE(k, k->u.axpy.y_dtype, fsdp_sim_dtype_float(k->u.axpy.y_dtype),
                            "f32, bf16 or f16");
        FSDP_SIM_NEED_DTYPE(k, k->u.axpy.x_dtype, fsdp_sim_dtype_float(k->u.axpy.x_dtype),
                            "f32, bf16 or f16");
        FSDP_SIM_NEED(k, k->u.axpy.y, k->u.axpy.n);
        FSDP_SIM_NEED(k, k->u.axpy.x, k->u.axpy.n);
        break;
    case FSDP_K_GEMM: /* fsdp_sim_gemm_ex checks shapes and pointers */
        FSDP_SIM_NEED_FLOAT(k, k->u.gemm.a_dtype);
        FSDP_SIM_NEED_DTYPE(k, k->u.gemm.b_dtype, k->u.gemm.b_dtype == k->u.gemm.a_dtype,
                            "a_dtype");
        FSDP_SIM_NEED_DTYPE(k, k->u.gemm.c_dtype,
                            k->u.gemm.c_dtype == k->u.gemm.a_dtype ||
                                k->u.gemm.c_dtype == FSDP_DTYPE_F32,
                            "a_dtype or f32");
        if (fsdp_kb_gemm_has_epilogue(k)) {
            const fsdp_gemm_epilogue_t *e = &k->u.gemm.epilogue;
            if (k->u.gemm.batch > 1)
                FSDP_SIM_KERNEL_INVALID(k, "an epilogue on a batch of %zu products (needs one)",
                                        k->u.gemm.batch);
            if (e->bias != NULL)
                FSDP_SIM_NEED_FLOAT(k, e->bias_dtype);
            if (e->act != FSDP_ACT_NONE && e->act != FSDP_ACT_RELU && e->act != FSDP_ACT_GELU_TANH)
                FSDP_SIM_KERNEL_INVALID(k, "epilogue activation %d (none, relu or gelu_tanh)",
                                        (int)e->act);
        }
        if (k->u.gemm.epilogue.accumulate != 0 && k->u.gemm.epilogue.accumulate != 1)
            FSDP_SIM_KERNEL_INVALID(k, "epilogue accumulate %d (0 or 1)",
                                    k->u.gemm.epilogue.accumulate);
        if (k->u.gemm.epilogue.accumulate && (k->u.gemm.beta != 1.0f || k->u.gemm.batch > 1))
            FSDP_SIM_KERNEL_INVALID(k,
                                    "an accumulating epilogue with beta %g and batch %zu "
                                    "(needs beta 1 and batch 0 or 1)",
                                    (double)k->u.gemm.beta, k->u.gemm.batch);
        break;
    case FSDP_K_BIAS_ADD: {
        size_t rows = k->u.bias_add.rows, cols = k->u.bias_add.cols;
        FSDP_SIM_NEED_FLOAT(k, k->u.bias_add.y_dtype);
        FSDP_SIM_NEED_FLOAT(k, k->u.bias_add.bias_dtype);
        if (rows > 0 && cols > SIZE_MAX / rows)
            FSDP_SIM_KERNEL_INVALID(k, "%zu x %zu elements overflow", rows, cols);
        FSDP_SIM_NEED(k, k->u.bias_add.y, rows * cols);
        FSDP_SIM_NEED(k, k->u.bias_add.bias, rows > 0 ? cols : 0);
        break;
    }
    case FSDP_K_BIAS_GRAD: {
        size_t rows = k->u.bias_grad.rows, cols = k->u.bias_grad.cols;
        FSDP_SIM_NEED_FLOAT(k, k->u.bias_grad.dbias_dtype);
        FSDP_SIM_NEED_FLOAT(k, k->u.bias_grad.dy_dtype);
        if (rows > 0 && cols > SIZE_MAX / rows)
            FSDP_SIM_KERNEL_INVALID(k, "%zu x %zu elements overflow", rows, cols);
        FSDP_SIM_NEED(k, k->u.bias_grad.dy, rows * cols);
        FSDP_SIM_NEED(k, k->u.bias_grad.dbias, cols);
        break;
    }
    case FSDP_K_RELU_FWD:
        FSDP_SIM_NEED_FLOAT(k, k->u.relu_fwd.y_dtype);
        FSDP_SIM_NEED_FLOAT(k, k->u.relu_fwd.x_dtype);
        FSDP_SIM_NEED(k, k->u.relu_fwd.y, k->u.relu_fwd.n);
        FSDP_SIM_NEED(k, k->u.relu_fwd.x, k->u.relu_fwd.n);
        FSDP_SIM_SAME_IN_PLACE(k, k->u.relu_fwd.y, k->u.relu_fwd.y_dtype, k->u.relu_fwd.x,
                               k->u.relu_fwd.x_dtype);
        break;
    case FSDP_K_RELU_BWD:
        FSDP_SIM_NEED_FLOAT(k, k->u.relu_bwd.dx_dtype);
        FSDP_SIM_NEED_FLOAT(k, k->u.relu_bwd.dy_dtype);
        FSDP_SIM_NEED_FLOAT(k, k->u.relu_bwd.y_dtype);
        FSDP_SIM_NEED(k, k->u.relu_bwd.dx, k->u.relu_bwd.n);
        FSDP_SIM_NEED(k, k->u.relu_bwd.dy, k->u.relu_bwd.n);
        FSDP_SIM_NEED(k, k->u.relu_bwd.y, k->u.relu_bwd.n);
        FSDP_SIM_SAME_IN_PLACE(k, k->u.relu_bwd.dx, k->u.relu_bwd.dx_dtype, k->u.relu_bwd.dy,
                               k->u.relu_bwd.dy_dtype);
        break;
    case FSDP_K_MSE_LOSS:
        FSDP_SIM_NEED_FLOAT(k, k->u.mse.y_dtype);
        FSDP_SIM_NEED_FLOAT(k, k->u.mse.t_dtype);
        if (k->u.mse.dy != NULL)
            FSDP_SIM_NEED_FLOAT(k, k->u.mse.dy_dtype);
        FSDP_SIM_SAME_IN_PLACE(k, k->u.mse.dy, k->u.mse.dy_dtype, k->u.mse.y, k->u.mse.y_dtype);
        FSDP_SIM_NEED(k, k->u.mse.loss, 1);
        FSDP_SIM_NEED(k, k->u.mse.y, k->u.mse.n);
        FSDP_SIM_NEED(k, k->u.mse.t, k->u.mse.n);
        if (!(k->u.mse.denom > 0.0)) /* NaN fails too */
            FSDP_SIM_KERNEL_INVALID(k, "denom %g must be > 0", k->u.mse.denom);
        break;
    case FSDP_K_ADAMW:
        FSDP_SIM_NEED(k, k->u.adamw.param, k->u.adamw.n);
        FSDP_SIM_NEED(k, k->u.adamw.grad, k->u.adamw.n);
        FSDP_SIM_NEED(k, k->u.adamw.exp_avg, k->u.adamw.n);
        FSDP_SIM_NEED(k, k->u.adamw.exp_avg_sq, k->u.adamw.n);
        if (k->u.adamw.step < 1)
            FSDP_SIM_KERNEL_INVALID(k, "step %lld must be >= 1", (long long)k->u.adamw.step);
        break;
    case FSDP_K_SGD:
        FSDP_SIM_NEED(k, k->u.sgd.param, k->u.sgd.n);
        FSDP_SIM_NEED(k, k->u.sgd.grad, k->u.sgd.n);
        if (k->u.sgd.momentum != 0.0f)
            FSDP_SIM_NEED(k, k->u.sgd.momentum_buf, k->u.sgd.n);
        break;
    case FSDP_K_SUMSQ:
        FSDP_SIM_NEED_DTYPE(k, k->u.sumsq.dtype, fsdp_sim_dtype_float(k->u.sumsq.dtype),
                            "f32, bf16 or f16");
        FSDP_SIM_NEED(k, k->u.sumsq.out, 1);
        FSDP_SIM_NEED(k, k->u.sumsq.x, k->u.sumsq.n);
        break;
    default:
        fsdp_error("kernel: unknown kind %d (valid: 0..%d)", (int)k->kind, (int)FSDP_K_COUNT - 1);
        return FSDP_ERR_INVALID_PARAM;
    }
    return FSDP_OK;
}

/* The runtime's own arithmetic on whole flat buffers (zero fills, the gradient divides, f32
 * copies) as plain loops over one dtype: the same value to the bit as fsdp_kb_elem's
 * per-element load and store (a zero fill is all zero bits in every dtype; f32 loads and
 * stores are the identity), without a dtype switch per element. Returns 0 for a kernel it
 * leaves to the general loop. */
#define FAST_LANES 8

static int fsdp_sim_elem_fast(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p)
{
    switch (k->kind) {
    case FSDP_K_FILL: {
        uint32_t bits;
        memcpy(&bits, &p->fill_f32, sizeof(bits));
        if (k->u.fill.dtype == FSDP_DTYPE_I32 ? p->fill_i32 != 0 : bits != 0)
            return 0;
        if (p->n > 0) /* x may be NULL for no elements */
            memset(k->u.fill.x, 0, p->n * fsdp_dtype_size(k->u.fill.dtype));
        return 1;
    }
    case FSDP_K_CAST:
        if (k->u.cast.src_dtype != k->u.cast.dst_dtype)
            return 0;
        if (p->n > 0 && k->u.cast.dst != k->u.cast.src) /* the check refused an overlap */
            memcpy(k->u.cast.dst, k->u.cast.src, p->n * fsdp_dtype_size(k->u.cast.dst_dtype));
        return 1;
    case FSDP_K_SCALE:
    case FSDP_K_DIV: {
        float *x = k->u.scale.x, alpha = k->u.scale.alpha;
        if (k->u.scale.dtype != FSDP_DTYPE_F32)
            return 0;
        size_t n = p->n, i = 0;
        /* whole groups of FAST_LANES first: a fixed trip count the compiler vectorizes */
        if (k->kind == FSDP_K_SCALE) {
            for (; i + FAST_LANES <= n; i += FAST_LANES)
                for (size_t j = 0; j < FAST_LANES; j++)
                    x[i + j] *= alpha;
            for (; i < n; i++)
                x[i] *= alpha;
        } else {
            for (; i + FAST_LANES <= n; i += FAST_LANES)
                for (size_t j = 0; j < FAST_LANES; j++)
                    x[i + j] /= alpha;
            for (; i < n; i++)
                x[i] /= alpha;
        }
        return 1;
    }
    default:
        return 0;
    }
}

/* GEMM, or a batch of them in index order (kernel.h: batch 0 or 1 is one product); each
 * product on the threads of pool (NULL: the calling thread), B from cache when it has it. */
static fsdp_status_t fsdp_sim_gemm_desc(const fsdp_kernel_t *k, fsdp_sim_pool_t *pool,
                                        fsdp_sim_pack_cache_t *cache)
{
    int fill = 0;
    float *b_packed = fsdp_sim_pack_cache_get(cache, k, &fill); /* NULL for a batch */
    size_t batch = k->u.gemm.batch > 1 ? k->u.gemm.batch : 1;
    size_t sa = fsdp_dtype_size(k->u.gemm.a_dtype), sb = fsdp_dtype_size(k->u.gemm.b_dtype);
    size_t sc = fsdp_dtype_size(k->u.gemm.c_dtype);
    fsdp_status_t status = FSDP_OK;

    if (batch > 1 && (k->u.gemm.stride_a > SIZE_MAX / batch / sa ||
                      k->u.gemm.stride_b > SIZE_MAX / batch / sb ||
                      k->u.gemm.stride_c > SIZE_MAX / batch / sc))
        FSDP_SIM_KERNEL_INVALID(k, "a batch of %zu with strides %zu, %zu, %zu overflows", batch,
                                k->u.gemm.stride_a, k->u.gemm.stride_b, k->u.gemm.stride_c);
    for (size_t i = 0; i < batch && status == FSDP_OK; i++) {
        const char *a = k->u.gemm.a, *b = k->u.gemm.b;
        char *c = k->u.gemm.c;
        if (i > 0) { /* the pointers of the first product are used as they are (NULL too) */
            a += i * k->u.gemm.stride_a * sa;
            b += i * k->u.gemm.stride_b * sb;
            c += i * k->u.gemm.stride_c * sc;
        }
        status = fsdp_sim_gemm_ex_packed(
            pool, k->u.gemm.trans_a, k->u.gemm.trans_b, k->u.gemm.m, k->u.gemm.n, k->u.gemm.k,
            k->u.gemm.alpha, a, k->u.gemm.a_dtype, k->u.gemm.lda, b, k->u.gemm.b_dtype,
            k->u.gemm.ldb, k->u.gemm.beta, c, k->u.gemm.c_dtype, k->u.gemm.ldc,
            fsdp_kb_gemm_has_epilogue(k) ? &k->u.gemm.epilogue : NULL, b_packed, fill);
    }
    fsdp_sim_pack_cache_done(cache, status);
    return status;
}

fsdp_status_t fsdp_sim_kernel_exec(const fsdp_kernel_t *k)
{
    fsdp_kb_prep_t prep;
    fsdp_status_t status;

    if (k == NULL) {
        fsdp_error("kernel: descriptor is NULL");
        return FSDP_ERR_INVALID_PARAM;
    }
    if (fsdp_sim_nn_kernel(k->kind))
        return fsdp_sim_nn_kernel_exec(k); /* the transformer kinds: kernels_nn.c */
    if (fsdp_sim_llama_kernel(k->kind))
        return fsdp_sim_llama_kernel_exec(k); /* the Llama kinds: kernels_llama.c */
    status = fsdp_sim_kernel_check(k);
    if (status != FSDP_OK)
        return status;

    if (k->kind == FSDP_K_GEMM)
        return fsdp_sim_gemm_desc(k, NULL, NULL);

    fsdp_kb_prepare(k, &prep);
    if (fsdp_sim_elem_fast(k, &prep) || fsdp_sim_elem_vec(k, &prep))
        return FSDP_OK;
    switch (k->kind) {
    case FSDP_K_FILL:
        fsdp_sim_elem_range(k, &prep, 0, prep.n);
        break;
    case FSDP_K_CAST:
        fsdp_sim_elem_range(k, &prep, 0, prep.n);
        break;
    case FSDP_K_SCALE:
        fsdp_sim_elem_range(k, &prep, 0, prep.n);
        break;
    case FSDP_K_DIV:
        fsdp_sim_elem_range(k, &prep, 0, prep.n);
        break;
    case FSDP_K_AXPY:
        fsdp_sim_elem_range(k, &prep, 0, prep.n);
        break;
    case FSDP_K_BIAS_ADD:
        fsdp_sim_elem_range(k, &prep, 0, prep.n);
        break;
    case FSDP_K_BIAS_GRAD:
        fsdp_kb_colsum(k);
        break;
    case FSDP_K_RELU_FWD:
        fsdp_sim_elem_range(k, &prep, 0, prep.n);
        break;
    case FSDP_K_RELU_BWD:
        fsdp_sim_elem_range(k, &prep, 0, prep.n);
        break;
    case FSDP_K_MSE_LOSS:
        /* the loss first: it must see y and t before dy is written */
        k->u.mse.loss[0] =
            (float)(fsdp_kb_reduce_sum(k, k->u.mse.n, fsdp_kb_mse_term) / k->u.mse.denom);
        fsdp_sim_elem_range(k, &prep, 0, prep.n); /* dy; prep.n is 0 without it */
        break;
    case FSDP_K_ADAMW:
        fsdp_sim_elem_range(k, &prep, 0, prep.n);
        break;
    case FSDP_K_SGD:
        fsdp_sim_elem_range(k, &prep, 0, prep.n);
        break;
    case FSDP_K_SUMSQ:
        k->u.sumsq.out[0] = (float)fsdp_kb_reduce_sum(k, k->u.sumsq.n, fsdp_kb_sumsq_term);
        break;
    default: /* rejected by the check */
        return FSDP_ERR_INVALID_PARAM;
    }
    return FSDP_OK;
}

/* ---- on a rank's worker threads ----
 *
 * A kernel whose elements are independent (each output element is a function of the inputs at
 * its own index, and nothing is summed across indexes) is cut into fixed blocks of indexes,
 * each run as a kernel of its own: the same bits, whatever the threads. A batch of small
 * products is cut by product; a large product splits itself (gemm.c). Everything else runs on
 * the calling thread. */

#define FSDP_SIM_PAR_MIN_ELEMS ((size_t)1 << 16) /* fewer elements stay on the calling thread */
#define FSDP_SIM_PAR_UNIT 1024                   /* blocks are multiples of this many elements */
#define FSDP_SIM_PAR_MIN_MACS 1e6                /* a batch of fewer products stays too */

typedef struct fsdp_sim_par_job {
    const fsdp_kernel_t *k;
    size_t n, block; /* elements (products of a batch) in all and per part */
    atomic_int status;
} fsdp_sim_par_job_t;

static const void *fsdp_sim_at(const void *p, fsdp_dtype_t dt, size_t i)
{
    return (const char *)p + i * fsdp_dtype_size(dt);
}

static void *fsdp_sim_at_mut(void *p, fsdp_dtype_t dt, size_t i)
{
    return (char *)p + i * fsdp_dtype_size(dt);
}

/* The number of independent elements of a kernel that can be cut, 0 when it cannot: the
 * element-wise kinds, once the whole descriptor is known to be valid (so that every block of
 * it is, and a bad descriptor fails as a whole before anything is written). */
static size_t fsdp_sim_par_elems(const fsdp_kernel_t *k)
{
    switch (k->kind) {
    case FSDP_K_FILL:
    case FSDP_K_CAST:
    case FSDP_K_SCALE:
    case FSDP_K_DIV:
    case FSDP_K_AXPY:
    case FSDP_K_RELU_FWD:
    case FSDP_K_RELU_BWD:
    case FSDP_K_ADAMW:
    case FSDP_K_SGD:
        if (fsdp_sim_kernel_check(k) != FSDP_OK)
            return 0;
        switch (k->kind) {
        case FSDP_K_FILL:
            return k->u.fill.n;
        case FSDP_K_CAST:
            return k->u.cast.n;
        case FSDP_K_SCALE:
        case FSDP_K_DIV:
            return k->u.scale.n;
        case FSDP_K_AXPY:
            return k->u.axpy.n;
        case FSDP_K_RELU_FWD:
            return k->u.relu_fwd.n;
        case FSDP_K_RELU_BWD:
            return k->u.relu_bwd.n;
        case FSDP_K_ADAMW:
            return k->u.adamw.n;
        default:
            return k->u.sgd.n;
        }
    /* the transformer's element-wise kinds: their whole check is a float dtype and buffers */
    case FSDP_K_GELU_FWD:
        return fsdp_sim_dtype_float(k->u.gelu_fwd.dtype) && k->u.gelu_fwd.y != NULL &&
                       k->u.gelu_fwd.x != NULL
                   ? k->u.gelu_fwd.n
                   : 0;
    case FSDP_K_GELU_BWD:
        return fsdp_sim_dtype_float(k->u.gelu_bwd.dtype) && k->u.gelu_bwd.dx != NULL &&
                       k->u.gelu_bwd.dy != NULL && k->u.gelu_bwd.x != NULL
                   ? k->u.gelu_bwd.n
                   : 0;
    case FSDP_K_ADD:
        return fsdp_sim_dtype_float(k->u.add.dtype) && k->u.add.y != NULL && k->u.add.a != NULL &&
                       k->u.add.b != NULL
                   ? k->u.add.n
                   : 0;
    default:
        return 0;
    }
}

/* *sub = elements [o, o + len) of k. */
static void fsdp_sim_par_slice(const fsdp_kernel_t *k, size_t o, size_t len, fsdp_kernel_t *sub)
{
    *sub = *k;
    switch (k->kind) {
    case FSDP_K_FILL:
        sub->u.fill.x = fsdp_sim_at_mut(k->u.fill.x, k->u.fill.dtype, o);
        sub->u.fill.n = len;
        break;
    case FSDP_K_CAST:
        sub->u.cast.dst = fsdp_sim_at_mut(k->u.cast.dst, k->u.cast.dst_dtype, o);
        sub->u.cast.src = fsdp_sim_at(k->u.cast.src, k->u.cast.src_dtype, o);
        sub->u.cast.n = len;
        break;
    case FSDP_K_SCALE:
    case FSDP_K_DIV:
        sub->u.scale.x = fsdp_sim_at_mut(k->u.scale.x, k->u.scale.dtype, o);
        sub->u.scale.n = len;
        break;
    case FSDP_K_AXPY:
        sub->u.axpy.y = fsdp_sim_at_mut(k->u.axpy.y, k->u.axpy.y_dtype, o);
        sub->u.axpy.x = fsdp_sim_at(k->u.axpy.x, k->u.axpy.x_dtype, o);
        sub->u.axpy.n = len;
        break;
    case FSDP_K_RELU_FWD:
        sub->u.relu_fwd.y = fsdp_sim_at_mut(k->u.relu_fwd.y, k->u.relu_fwd.y_dtype, o);
        sub->u.relu_fwd.x = fsdp_sim_at(k->u.relu_fwd.x, k->u.relu_fwd.x_dtype, o);
        sub->u.relu_fwd.n = len;
        break;
    case FSDP_K_RELU_BWD:
        sub->u.relu_bwd.dx = fsdp_sim_at_mut(k->u.relu_bwd.dx, k->u.relu_bwd.dx_dtype, o);
        sub->u.relu_bwd.dy = fsdp_sim_at(k->u.relu_bwd.dy, k->u.relu_bwd.dy_dtype, o);
        sub->u.relu_bwd.y = fsdp_sim_at(k->u.relu_bwd.y, k->u.relu_bwd.y_dtype, o);
        sub->u.relu_bwd.n = len;
        break;
    case FSDP_K_ADAMW:
        sub->u.adamw.param = k->u.adamw.param + o;
        sub->u.adamw.grad = k->u.adamw.grad + o;
        sub->u.adamw.exp_avg = k->u.adamw.exp_avg + o;
        sub->u.adamw.exp_avg_sq = k->u.adamw.exp_avg_sq + o;
        sub->u.adamw.n = len;
        break;
    case FSDP_K_SGD:
        sub->u.sgd.param = k->u.sgd.param + o;
        sub->u.sgd.grad = k->u.sgd.grad + o;
        if (k->u.sgd.momentum_buf != NULL)
            sub->u.sgd.momentum_buf = k->u.sgd.momentum_buf + o;
        sub->u.sgd.n = len;
        break;
    case FSDP_K_GELU_FWD:
        sub->u.gelu_fwd.y = fsdp_sim_at_mut(k->u.gelu_fwd.y, k->u.gelu_fwd.dtype, o);
        sub->u.gelu_fwd.x = fsdp_sim_at(k->u.gelu_fwd.x, k->u.gelu_fwd.dtype, o);
        sub->u.gelu_fwd.n = len;
        break;
    case FSDP_K_GELU_BWD:
        sub->u.gelu_bwd.dx = fsdp_sim_at_mut(k->u.gelu_bwd.dx, k->u.gelu_bwd.dtype, o);
        sub->u.gelu_bwd.dy = fsdp_sim_at(k->u.gelu_bwd.dy, k->u.gelu_bwd.dtype, o);
        sub->u.gelu_bwd.x = fsdp_sim_at(k->u.gelu_bwd.x, k->u.gelu_bwd.dtype, o);
        sub->u.gelu_bwd.n = len;
        break;
    case FSDP_K_ADD:
        sub->u.add.y = fsdp_sim_at_mut(k->u.add.y, k->u.add.dtype, o);
        sub->u.add.a = fsdp_sim_at(k->u.add.a, k->u.add.dtype, o);
        sub->u.add.b = fsdp_sim_at(k->u.add.b, k->u.add.dtype, o);
        sub->u.add.n = len;
        break;
    default:
        break;
    }
}

static void fsdp_sim_par_elem_part(void *arg, size_t part)
{
    fsdp_sim_par_job_t *job = arg;
    size_t o = part * job->block;
    size_t len = job->n - o < job->block ? job->n - o : job->block;
    fsdp_kernel_t sub;
    fsdp_status_t status;

    fsdp_sim_par_slice(job->k, o, len, &sub);
    status = fsdp_sim_kernel_exec(&sub);
    if (status != FSDP_OK)
        atomic_store(&job->status, (int)status);
}

/* Products [part * block, ...) of a batch, each on this thread. */
static void fsdp_sim_par_batch_part(void *arg, size_t part)
{
    fsdp_sim_par_job_t *job = arg;
    const fsdp_kernel_t *k = job->k;
    size_t sa = fsdp_dtype_size(k->u.gemm.a_dtype), sb = fsdp_dtype_size(k->u.gemm.b_dtype);
    size_t sc = fsdp_dtype_size(k->u.gemm.c_dtype);
    size_t end = (part + 1) * job->block < job->n ? (part + 1) * job->block : job->n;
    fsdp_status_t status = FSDP_OK;

    for (size_t i = part * job->block; i < end && status == FSDP_OK; i++)
        status = fsdp_sim_gemm_ex(
            k->u.gemm.trans_a, k->u.gemm.trans_b, k->u.gemm.m, k->u.gemm.n, k->u.gemm.k,
            k->u.gemm.alpha, (const char *)k->u.gemm.a + i * k->u.gemm.stride_a * sa,
            k->u.gemm.a_dtype, k->u.gemm.lda,
            (const char *)k->u.gemm.b + i * k->u.gemm.stride_b * sb, k->u.gemm.b_dtype,
            k->u.gemm.ldb, k->u.gemm.beta,
            (char *)k->u.gemm.c + i * k->u.gemm.stride_c * sc, k->u.gemm.c_dtype, k->u.gemm.ldc,
            NULL);
    if (status != FSDP_OK)
        atomic_store(&job->status, (int)status);
}

/* 1 when a batch of products (a checked descriptor) is worth cutting by product: many small
 * ones (each too small to split itself), all set, whose C blocks are apart (a product's C
 * ends before the next one's starts), without an epilogue (which needs batch <= 1). */
static int fsdp_sim_par_batch(const fsdp_kernel_t *k, int threads)
{
    size_t batch = k->u.gemm.batch, m = k->u.gemm.m, n = k->u.gemm.n;
    double macs = (double)m * (double)n * (double)k->u.gemm.k;

    if (threads <= 1 || batch < 2 || m == 0 || n == 0 || k->u.gemm.k == 0 ||
        macs * (double)batch < FSDP_SIM_PAR_MIN_MACS || macs >= FSDP_SIM_PAR_MIN_MACS ||
        fsdp_kb_gemm_has_epilogue(k) || k->u.gemm.a == NULL || k->u.gemm.b == NULL ||
        k->u.gemm.c == NULL || k->u.gemm.ldc < n)
        return 0;
    if (k->u.gemm.stride_a > SIZE_MAX / batch / fsdp_dtype_size(k->u.gemm.a_dtype) ||
        k->u.gemm.stride_b > SIZE_MAX / batch / fsdp_dtype_size(k->u.gemm.b_dtype) ||
        k->u.gemm.stride_c > SIZE_MAX / batch / fsdp_dtype_size(k->u.gemm.c_dtype) ||
        k->u.gemm.stride_c < (m - 1) * k->u.gemm.ldc + n)
        return 0; /* the serial loop says what is wrong, or runs them in order */
    return 1;
}

int fsdp_sim_kernel_wants_pool(const fsdp_kernel_t *k)
{
    size_t n;

    switch (k->kind) {
    case FSDP_K_GEMM:
        return (double)k->u.gemm.m * (double)k->u.gemm.n * (double)k->u.gemm.k *
                   (double)(k->u.gemm.batch > 1 ? k->u.gemm.batch : 1) >=
               FSDP_SIM_PAR_MIN_MACS;
    case FSDP_K_ADAMW:
        n = k->u.adamw.n;
        break;
    case FSDP_K_SGD:
        n = k->u.sgd.n;
        break;
    default:
        return 0;
    }
    return n >= FSDP_SIM_PAR_MIN_ELEMS;
}

fsdp_status_t fsdp_sim_kernel_exec_par(const fsdp_kernel_t *k, fsdp_sim_pool_t *pool,
                                       fsdp_sim_pack_cache_t *cache)
{
    int threads = fsdp_sim_pool_threads(pool);
    fsdp_sim_par_job_t job;
    size_t parts;

    if (k != NULL && k->kind == FSDP_K_GEMM) { /* on any number of threads: the pack cache */
        if (fsdp_sim_kernel_check(k) != FSDP_OK)
            return FSDP_ERR_INVALID_PARAM;
        if (!fsdp_sim_par_batch(k, threads)) /* 0 on one thread */
            return fsdp_sim_gemm_desc(k, pool, cache);
        job.k = k;
        job.n = k->u.gemm.batch;
        parts = job.n < (size_t)threads * 2 ? job.n : (size_t)threads * 2;
        job.block = (job.n + parts - 1) / parts;
        parts = (job.n + job.block - 1) / job.block;
        atomic_init(&job.status, (int)FSDP_OK);
        fsdp_sim_pool_run(pool, parts, fsdp_sim_par_batch_part, &job);
        return (fsdp_status_t)atomic_load(&job.status);
    }
    if (threads <= 1 || k == NULL)
        return fsdp_sim_kernel_exec(k);
    job.n = fsdp_sim_par_elems(k);
    if (job.n < FSDP_SIM_PAR_MIN_ELEMS)
        return fsdp_sim_kernel_exec(k);
    job.k = k;
    parts = (size_t)threads * 2;
    job.block = (job.n + parts - 1) / parts;
    job.block = (job.block + FSDP_SIM_PAR_UNIT - 1) / FSDP_SIM_PAR_UNIT * FSDP_SIM_PAR_UNIT;
    parts = (job.n + job.block - 1) / job.block;
    atomic_init(&job.status, (int)FSDP_OK);
    fsdp_sim_pool_run(pool, parts, fsdp_sim_par_elem_part, &job);
    return (fsdp_status_t)atomic_load(&job.status);
}
