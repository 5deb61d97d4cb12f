/* The sim backend's check of a kernel descriptor, every kind: the dtypes, the buffers a launch
 * with work to do needs, the shapes, and the overlaps a body cannot take. A bad descriptor fails
 * whole, before anything is written, with one line naming the kernel and what was wrong. */
#include "config.h"

#include <stdint.h>

#include <fsdp/log.h>

#include "kernels/kernel_elem.h"
#include "kernels/llama_bodies.h"
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

static fsdp_status_t base_check(const fsdp_kernel_t *k)
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
    case FSDP_K_CHUNK_COPY: {
        const size_t rows = k->u.chunk_copy.rows, cols = k->u.chunk_copy.cols;
        FSDP_SIM_NEED_FLOAT(k, k->u.chunk_copy.dst_dtype);
        FSDP_SIM_NEED_FLOAT(k, k->u.chunk_copy.src_dtype);
        FSDP_SIM_NEED(k, k->u.chunk_copy.dst, rows * cols);
        FSDP_SIM_NEED(k, k->u.chunk_copy.src, k->u.chunk_copy.src_n > 0 ? rows * cols : 0);
        if (rows > 1 && (k->u.chunk_copy.dst_ld < cols || k->u.chunk_copy.src_ld < cols))
            FSDP_SIM_KERNEL_INVALID(k, "leading dimensions %zu (dst) and %zu (src) below the %zu "
                                    "columns", k->u.chunk_copy.dst_ld, k->u.chunk_copy.src_ld,
                                    cols);
        break;
    }
    case FSDP_K_GROUP_COPY: {
        const char *bad = fsdp_kb_group_copy_check(k);
        if (bad != NULL)
            FSDP_SIM_KERNEL_INVALID(k, "%s", bad);
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

/* ---- the transformer kinds (layernorm .. add) ---- */

/* rows x cols without overflow */
#define NN_NEED_SHAPE(k, rows, cols)                                                               \
    do {                                                                                           \
        if ((rows) > 0 && (cols) > SIZE_MAX / 8 / (rows))                                          \
            FSDP_SIM_KERNEL_INVALID(k, "%zu x %zu elements overflow", (size_t)(rows),              \
                                    (size_t)(cols));                                               \
    } while (0)

static fsdp_status_t nn_check(const fsdp_kernel_t *k)
{
    fsdp_dtype_t dt = fsdp_kb_dtype(k);

    if (dt != FSDP_DTYPE_F32 && dt != FSDP_DTYPE_BF16 && dt != FSDP_DTYPE_F16)
        FSDP_SIM_KERNEL_INVALID(k, "dtype %s (%d): the transformer kernels take f32, bf16 or f16",
                                fsdp_dtype_name(dt), (int)dt);
    switch (k->kind) {
    case FSDP_K_LAYERNORM_FWD: {
        size_t rows = k->u.layernorm_fwd.rows, cols = k->u.layernorm_fwd.cols;
        NN_NEED_SHAPE(k, rows, cols);
        if (rows > 0 && cols == 0)
            FSDP_SIM_KERNEL_INVALID(k, "%zu rows of 0 columns have no mean", rows);
        FSDP_SIM_NEED(k, k->u.layernorm_fwd.y, rows * cols);
        FSDP_SIM_NEED(k, k->u.layernorm_fwd.x, rows * cols);
        FSDP_SIM_NEED(k, k->u.layernorm_fwd.weight, rows > 0 ? cols : 0);
        FSDP_SIM_NEED(k, k->u.layernorm_fwd.bias, rows > 0 ? cols : 0);
        if (!(k->u.layernorm_fwd.eps >= 0.0f))
            FSDP_SIM_KERNEL_INVALID(k, "eps %g must be >= 0", (double)k->u.layernorm_fwd.eps);
        break;
    }
    case FSDP_K_LAYERNORM_BWD: {
        size_t rows = k->u.layernorm_bwd.rows, cols = k->u.layernorm_bwd.cols;
        size_t n = rows * cols;
        NN_NEED_SHAPE(k, rows, cols);
        FSDP_SIM_NEED(k, k->u.layernorm_bwd.dy, n);
        FSDP_SIM_NEED(k, k->u.layernorm_bwd.x, n);
        FSDP_SIM_NEED(k, k->u.layernorm_bwd.mean, cols > 0 ? rows : 0);
        FSDP_SIM_NEED(k, k->u.layernorm_bwd.rstd, cols > 0 ? rows : 0);
        if (k->u.layernorm_bwd.dx != NULL) {
            FSDP_SIM_NEED(k, k->u.layernorm_bwd.weight, rows > 0 ? cols : 0);
            size_t es = fsdp_dtype_size(dt);
            if (fsdp_sim_overlap(k->u.layernorm_bwd.dx, n * es, k->u.layernorm_bwd.dy, n * es) ||
                fsdp_sim_overlap(k->u.layernorm_bwd.dx, n * es, k->u.layernorm_bwd.x, n * es))
                FSDP_SIM_KERNEL_INVALID(k, "dx overlaps dy or x (%zu elements)", n);
        }
        break;
    }
    case FSDP_K_GELU_FWD:
        FSDP_SIM_NEED(k, k->u.gelu_fwd.y, k->u.gelu_fwd.n);
        FSDP_SIM_NEED(k, k->u.gelu_fwd.x, k->u.gelu_fwd.n);
        break;
    case FSDP_K_GELU_BWD:
        FSDP_SIM_NEED(k, k->u.gelu_bwd.dx, k->u.gelu_bwd.n);
        FSDP_SIM_NEED(k, k->u.gelu_bwd.dy, k->u.gelu_bwd.n);
        FSDP_SIM_NEED(k, k->u.gelu_bwd.x, k->u.gelu_bwd.n);
        break;
    case FSDP_K_SOFTMAX_FWD:
    case FSDP_K_SOFTMAX_BWD: {
        int fwd = k->kind == FSDP_K_SOFTMAX_FWD;
        size_t rows = fwd ? k->u.softmax_fwd.rows : k->u.softmax_bwd.rows;
        size_t cols = fwd ? k->u.softmax_fwd.cols : k->u.softmax_bwd.cols;
        int causal = fwd ? k->u.softmax_fwd.causal : k->u.softmax_bwd.causal;
        NN_NEED_SHAPE(k, rows, cols);
        if (rows > 0 && cols == 0)
            FSDP_SIM_KERNEL_INVALID(k, "%zu rows of 0 columns", rows);
        if (causal && cols > 0 && rows % cols != 0)
            FSDP_SIM_KERNEL_INVALID(k, "causal: %zu rows are not whole [%zu, %zu] blocks", rows,
                                    cols, cols);
        if (fwd) {
            FSDP_SIM_NEED(k, k->u.softmax_fwd.y, rows * cols);
            FSDP_SIM_NEED(k, k->u.softmax_fwd.x, rows * cols);
        } else {
            FSDP_SIM_NEED(k, k->u.softmax_bwd.dx, rows * cols);
            FSDP_SIM_NEED(k, k->u.softmax_bwd.dy, rows * cols);
            FSDP_SIM_NEED(k, k->u.softmax_bwd.y, rows * cols);
        }
        break;
    }
    case FSDP_K_EMBEDDING_FWD: {
        size_t rows = k->u.embedding_fwd.rows, cols = k->u.embedding_fwd.cols;
        NN_NEED_SHAPE(k, rows, cols);
        FSDP_SIM_NEED(k, k->u.embedding_fwd.y, rows * cols);
        FSDP_SIM_NEED(k, k->u.embedding_fwd.tokens, cols > 0 ? rows : 0);
        if (rows > 0 && cols > 0 && k->u.embedding_fwd.vocab == 0)
            FSDP_SIM_KERNEL_INVALID(k, "vocab is 0 for %zu tokens", rows);
        FSDP_SIM_NEED(k, k->u.embedding_fwd.wte, rows > 0 ? cols : 0);
        if (k->u.embedding_fwd.wpe != NULL && k->u.embedding_fwd.seq == 0)
            FSDP_SIM_KERNEL_INVALID(k, "seq is 0 with a position table (%zu rows)", rows);
        break;
    }
    case FSDP_K_EMBEDDING_BWD: {
        size_t rows = k->u.embedding_bwd.rows, cols = k->u.embedding_bwd.cols;
        NN_NEED_SHAPE(k, rows, cols);
        FSDP_SIM_NEED(k, k->u.embedding_bwd.dy, rows * cols);
        FSDP_SIM_NEED(k, k->u.embedding_bwd.tokens, cols > 0 ? rows : 0);
        if (k->u.embedding_bwd.dwpe != NULL && k->u.embedding_bwd.seq == 0)
            FSDP_SIM_KERNEL_INVALID(k, "seq is 0 with a position gradient (%zu rows)", rows);
        break;
    }
    case FSDP_K_CROSS_ENTROPY: {
        size_t rows = k->u.cross_entropy.rows, v = k->u.cross_entropy.vocab;
        NN_NEED_SHAPE(k, rows, v);
        if (rows > 0 && v == 0)
            FSDP_SIM_KERNEL_INVALID(k, "%zu rows of 0 classes", rows);
        FSDP_SIM_NEED(k, k->u.cross_entropy.logits, rows * v);
        FSDP_SIM_NEED(k, k->u.cross_entropy.targets, rows);
        FSDP_SIM_NEED(k, k->u.cross_entropy.losses, rows);
        if (k->u.cross_entropy.stage < 0 || k->u.cross_entropy.stage > 3)
            FSDP_SIM_KERNEL_INVALID(k, "stage %d is not 0 to 3", k->u.cross_entropy.stage);
        if (k->u.cross_entropy.stage != 0)
            FSDP_SIM_NEED(k, k->u.cross_entropy.stats, 3 * rows);
        if ((k->u.cross_entropy.loss != NULL || k->u.cross_entropy.dlogits != NULL) &&
            !(k->u.cross_entropy.denom > 0.0)) /* NaN fails too */
            FSDP_SIM_KERNEL_INVALID(k, "denom %g must be > 0", k->u.cross_entropy.denom);
        break;
    }
    case FSDP_K_ADD:
        FSDP_SIM_NEED(k, k->u.add.y, k->u.add.n);
        FSDP_SIM_NEED(k, k->u.add.a, k->u.add.n);
        FSDP_SIM_NEED(k, k->u.add.b, k->u.add.n);
        break;
    default:
        fsdp_error("kernel: kind %d (%s) is not a transformer kernel", (int)k->kind,
                   fsdp_kernel_name(k->kind));
        return FSDP_ERR_INVALID_PARAM;
    }
    return FSDP_OK;
}

fsdp_status_t fsdp_sim_kernel_check(const fsdp_kernel_t *k)
{
    const char *bad;

    if ((unsigned)k->kind >= FSDP_K_COUNT) {
        fsdp_error("kernel: unknown kind %d (valid: 0..%d)", (int)k->kind, (int)FSDP_K_COUNT - 1);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (fsdp_kb_exec(k->kind) == FSDP_KX_PASSES) { /* the Llama kinds: the gpu backend's check */
        bad = fsdp_kb_llama_check(k);
        if (bad != NULL) {
            fsdp_error("kernel %s: %s", fsdp_kernel_name(k->kind), bad);
            return FSDP_ERR_INVALID_PARAM;
        }
        return FSDP_OK;
    }
    if (k->kind >= FSDP_K_LAYERNORM_FWD && k->kind <= FSDP_K_ADD)
        return nn_check(k);
    return base_check(k);
}
