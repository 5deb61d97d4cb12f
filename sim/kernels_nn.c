/* Host execution of the transformer kernels (layernorm .. add of kernel.h), data mode.
 *
 * As in kernels.c, this file only validates and loops: the formulas are the bodies of
 * lib/kernels/nn_bodies.h (and fsdp_kb_elem for the element-wise kinds), the code the gpu
 * backend launches with a thread per element, a warp per row, a block per 32 columns of a
 * weight gradient. Here rows run in index order, each replaying the warp's 32 lanes and their
 * butterfly (fsdp_kb_nn_row), the column sums replay the GPU's blocks (fsdp_kb_colsum), the
 * embedding backward is the plain row-order loop the GPU's token buckets reproduce, and the
 * cross-entropy mean sums the row losses along the GPU's tree (fsdp_kb_reduce_sum): both
 * backends give the same bits.
 */
#include "config.h"

#include <stdint.h>

#include <fsdp/log.h>

#include "elem_vec.h"
#include "kernels/kernel_elem.h"
#include "sim_kernels.h"

#define NN_INVALID(k, fmt, ...)                                                                    \
    do {                                                                                           \
        fsdp_error("kernel %s: " fmt, fsdp_kernel_name((k)->kind), __VA_ARGS__);                   \
        return FSDP_ERR_INVALID_PARAM;                                                             \
    } while (0)

/* A buffer of n elements may be NULL only when n is 0. */
#define NN_NEED(k, ptr, n)                                                                         \
    do {                                                                                           \
        if ((ptr) == NULL && (n) > 0)                                                              \
            NN_INVALID(k, "%s is NULL for %zu elements", #ptr, (size_t)(n));                       \
    } while (0)

/* rows x cols without overflow */
#define NN_NEED_SHAPE(k, rows, cols)                                                               \
    do {                                                                                           \
        if ((rows) > 0 && (cols) > SIZE_MAX / 8 / (rows))                                          \
            NN_INVALID(k, "%zu x %zu elements overflow", (size_t)(rows), (size_t)(cols));          \
    } while (0)

int fsdp_sim_nn_kernel(fsdp_kernel_kind_t kind)
{
    return kind >= FSDP_K_LAYERNORM_FWD && kind <= FSDP_K_ADD;
}

/* Do [a, a + an) and [b, b + bn) (elements of es bytes) overlap? */
static int nn_overlap(const void *a, size_t an, const void *b, size_t bn, size_t es)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return an > 0 && bn > 0 && x < y + bn * es && y < x + an * es;
}

static fsdp_status_t nn_check(const fsdp_kernel_t *k)
{
    fsdp_dtype_t dt = fsdp_kb_dtype(k);

    if (dt != FSDP_DTYPE_F32 && dt != FSDP_DTYPE_BF16 && dt != FSDP_DTYPE_F16)
        NN_INVALID(k, "dtype %s (%d): the transformer kernels take f32, bf16 or f16",
                   fsdp_dtype_name(dt), (int)dt);
    switch (k->kind) {
    case FSDP_K_LAYERNORM_FWD: {
        size_t rows = k->u.layernorm_fwd.rows, cols = k->u.layernorm_fwd.cols;
        NN_NEED_SHAPE(k, rows, cols);
        if (rows > 0 && cols == 0)
            NN_INVALID(k, "%zu rows of 0 columns have no mean", rows);
        NN_NEED(k, k->u.layernorm_fwd.y, rows * cols);
        NN_NEED(k, k->u.layernorm_fwd.x, rows * cols);
        NN_NEED(k, k->u.layernorm_fwd.weight, rows > 0 ? cols : 0);
        NN_NEED(k, k->u.layernorm_fwd.bias, rows > 0 ? cols : 0);
        if (!(k->u.layernorm_fwd.eps >= 0.0f))
            NN_INVALID(k, "eps %g must be >= 0", (double)k->u.layernorm_fwd.eps);
        break;
    }
    case FSDP_K_LAYERNORM_BWD: {
        size_t rows = k->u.layernorm_bwd.rows, cols = k->u.layernorm_bwd.cols;
        size_t n = rows * cols;
        NN_NEED_SHAPE(k, rows, cols);
        NN_NEED(k, k->u.layernorm_bwd.dy, n);
        NN_NEED(k, k->u.layernorm_bwd.x, n);
        NN_NEED(k, k->u.layernorm_bwd.mean, cols > 0 ? rows : 0);
        NN_NEED(k, k->u.layernorm_bwd.rstd, cols > 0 ? rows : 0);
        if (k->u.layernorm_bwd.dx != NULL) {
            NN_NEED(k, k->u.layernorm_bwd.weight, rows > 0 ? cols : 0);
            size_t es = fsdp_dtype_size(dt);
            if (nn_overlap(k->u.layernorm_bwd.dx, n, k->u.layernorm_bwd.dy, n, es) ||
                nn_overlap(k->u.layernorm_bwd.dx, n, k->u.layernorm_bwd.x, n, es))
                NN_INVALID(k, "dx overlaps dy or x (%zu elements)", n);
        }
        break;
    }
    case FSDP_K_GELU_FWD:
        NN_NEED(k, k->u.gelu_fwd.y, k->u.gelu_fwd.n);
        NN_NEED(k, k->u.gelu_fwd.x, k->u.gelu_fwd.n);
        break;
    case FSDP_K_GELU_BWD:
        NN_NEED(k, k->u.gelu_bwd.dx, k->u.gelu_bwd.n);
        NN_NEED(k, k->u.gelu_bwd.dy, k->u.gelu_bwd.n);
        NN_NEED(k, k->u.gelu_bwd.x, k->u.gelu_bwd.n);
        break;
    case FSDP_K_SOFTMAX_FWD:
    case FSDP_K_SOFTMAX_BWD: {
        int fwd = k->kind == FSDP_K_SOFTMAX_FWD;
        size_t rows = fwd ? k->u.softmax_fwd.rows : k->u.softmax_bwd.rows;
        size_t cols = fwd ? k->u.softmax_fwd.cols : k->u.softmax_bwd.cols;
        int causal = fwd ? k->u.softmax_fwd.causal : k->u.softmax_bwd.causal;
        NN_NEED_SHAPE(k, rows, cols);
        if (rows > 0 && cols == 0)
            NN_INVALID(k, "%zu rows of 0 columns", rows);
        if (causal && cols > 0 && rows % cols != 0)
            NN_INVALID(k, "causal: %zu rows are not whole [%zu, %zu] blocks", rows, cols, cols);
        if (fwd) {
            NN_NEED(k, k->u.softmax_fwd.y, rows * cols);
            NN_NEED(k, k->u.softmax_fwd.x, rows * cols);
        } else {
            NN_NEED(k, k->u.softmax_bwd.dx, rows * cols);
            NN_NEED(k, k->u.softmax_bwd.dy, rows * cols);
            NN_NEED(k, k->u.softmax_bwd.y, rows * cols);
        }
        break;
    }
    case FSDP_K_EMBEDDING_FWD: {
        size_t rows = k->u.embedding_fwd.rows, cols = k->u.embedding_fwd.cols;
        NN_NEED_SHAPE(k, rows, cols);
        NN_NEED(k, k->u.embedding_fwd.y, rows * cols);
        NN_NEED(k, k->u.embedding_fwd.tokens, cols > 0 ? rows : 0);
        if (rows > 0 && cols > 0 && k->u.embedding_fwd.vocab == 0)
            NN_INVALID(k, "vocab is 0 for %zu tokens", rows);
        NN_NEED(k, k->u.embedding_fwd.wte, rows > 0 ? cols : 0);
        if (k->u.embedding_fwd.wpe != NULL && k->u.embedding_fwd.seq == 0)
            NN_INVALID(k, "seq is 0 with a position table (%zu rows)", rows);
        break;
    }
    case FSDP_K_EMBEDDING_BWD: {
        size_t rows = k->u.embedding_bwd.rows, cols = k->u.embedding_bwd.cols;
        NN_NEED_SHAPE(k, rows, cols);
        NN_NEED(k, k->u.embedding_bwd.dy, rows * cols);
        NN_NEED(k, k->u.embedding_bwd.tokens, cols > 0 ? rows : 0);
        if (k->u.embedding_bwd.dwpe != NULL && k->u.embedding_bwd.seq == 0)
            NN_INVALID(k, "seq is 0 with a position gradient (%zu rows)", rows);
        break;
    }
    case FSDP_K_CROSS_ENTROPY: {
        size_t rows = k->u.cross_entropy.rows, v = k->u.cross_entropy.vocab;
        NN_NEED_SHAPE(k, rows, v);
        if (rows > 0 && v == 0)
            NN_INVALID(k, "%zu rows of 0 classes", rows);
        NN_NEED(k, k->u.cross_entropy.logits, rows * v);
        NN_NEED(k, k->u.cross_entropy.targets, rows);
        NN_NEED(k, k->u.cross_entropy.losses, rows);
        if ((k->u.cross_entropy.loss != NULL || k->u.cross_entropy.dlogits != NULL) &&
            !(k->u.cross_entropy.denom > 0.0)) /* NaN fails too */
            NN_INVALID(k, "denom %g must be > 0", k->u.cross_entropy.denom);
        break;
    }
    case FSDP_K_ADD:
        NN_NEED(k, k->u.add.y, k->u.add.n);
        NN_NEED(k, k->u.add.a, k->u.add.n);
        NN_NEED(k, k->u.add.b, k->u.add.n);
        break;
    default:
        fsdp_error("kernel: kind %d (%s) is not a transformer kernel", (int)k->kind,
                   fsdp_kernel_name(k->kind));
        return FSDP_ERR_INVALID_PARAM;
    }
    return FSDP_OK;
}

#define NN_ROW_LOOP(KIND, k, ce_scale, rows)                                                       \
    do {                                                                                           \
        for (size_t r_ = 0; r_ < (rows); r_++)                                                     \
            fsdp_kb_nn_row(KIND, (k), (ce_scale), r_);                                             \
    } while (0)

fsdp_status_t fsdp_sim_nn_kernel_exec(const fsdp_kernel_t *k)
{
    fsdp_kb_prep_t prep;
    fsdp_status_t status = nn_check(k);
    size_t chunks, rows;

    if (status != FSDP_OK)
        return status;
    fsdp_kb_prepare(k, &prep);
    /* the column part (weight gradients) reads only inputs; the row part writes outputs */
    fsdp_kb_colsum(k);
    chunks = fsdp_kb_nn_chunks(k);
    for (size_t c = 0; c < chunks; c++)
        fsdp_kb_nn_cols(k->kind, k, c);
    rows = fsdp_kb_nn_rows(k);
    switch (k->kind) { /* each kind a constant: its passes inline into the lanes' loops */
    case FSDP_K_LAYERNORM_FWD:
        NN_ROW_LOOP(FSDP_K_LAYERNORM_FWD, k, prep.ce_scale, rows);
        break;
    case FSDP_K_LAYERNORM_BWD:
        NN_ROW_LOOP(FSDP_K_LAYERNORM_BWD, k, prep.ce_scale, rows);
        break;
    case FSDP_K_SOFTMAX_FWD:
        NN_ROW_LOOP(FSDP_K_SOFTMAX_FWD, k, prep.ce_scale, rows);
        break;
    case FSDP_K_SOFTMAX_BWD:
        NN_ROW_LOOP(FSDP_K_SOFTMAX_BWD, k, prep.ce_scale, rows);
        break;
    case FSDP_K_CROSS_ENTROPY:
        NN_ROW_LOOP(FSDP_K_CROSS_ENTROPY, k, prep.ce_scale, rows);
        break;
    default:
        break;
    }
    if (fsdp_sim_elem_vec(k, &prep)) /* gelu_fwd, gelu_bwd, add */
        return FSDP_OK;
    switch (k->kind) {
    case FSDP_K_GELU_FWD:
    case FSDP_K_GELU_BWD:
    case FSDP_K_EMBEDDING_FWD:
    case FSDP_K_ADD: /* the scalar loops of kernels.c */
        fsdp_sim_elem_range(k, &prep, 0, prep.n);
        break;
    case FSDP_K_CROSS_ENTROPY: /* the mean, after every row's loss */
        if (k->u.cross_entropy.loss != NULL)
            k->u.cross_entropy.loss[0] =
                (float)(fsdp_kb_reduce_sum(k, k->u.cross_entropy.rows, fsdp_kb_cross_entropy_term) /
                        k->u.cross_entropy.denom);
        break;
    default:
        break;
    }
    return FSDP_OK;
}
