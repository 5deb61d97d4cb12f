/* Per-element bodies of the kernel descriptors of kernel.h, addressed by descriptor and index,
 * with the per-launch scalars computed once on the host (fsdp_kb_prepare). A backend supplies
 * only the loop: the sim runs i over [0, prep.n) on the host, the gpu backend launches a grid
 * over the same range (gpu/kernels.cu), and both call fsdp_kb_elem. So what the CPU tests
 * exercise is the arithmetic the GPU runs; nvcc builds it with --fmad=false so that no
 * multiply-add is fused on one side only, and the results agree bit for bit.
 *
 * The reductions keep their per-element terms and their order here too: bias_grad sums each
 * column in the column shape of lanes.h (a block of 32 columns x 32 row lanes on the GPU, which
 * the host replays: fsdp_kb_colsum_block); sumsq and mse_loss sum per-element terms in double
 * along a fixed tree (fsdp_kb_reduce_shape), which the host can replay exactly
 * (fsdp_kb_reduce_sum).
 * GEMM has no body here: each backend brings its own (the sim's blocked routine, cuBLAS). */
#ifndef FSDP_KERNELS_KERNEL_ELEM_H
#define FSDP_KERNELS_KERNEL_ELEM_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include <fsdp/kernel.h>

#include "kernels/elementwise.h"
#include "kernels/kinds.h"
#include "kernels/nn_bodies.h"

/* The scalars of one launch, computed once on the host (in double, as torch does in Python). */
typedef struct fsdp_kb_prep {
    size_t n;                      /* index space of the element-wise part: i < n */
    float fill_f32;                /* fill: the value as f32 (floating-point dtypes) */
    int32_t fill_i32;              /* fill: the value as i32, saturated, NaN as 0 */
    float mse_scale;               /* mse_loss: 2 / denom as f32, torch's factor of dy */
    fsdp_kb_adamw_scalars_t adamw; /* adamw */
    float ce_scale;                /* cross_entropy: 1 / denom as f32, the factor of dlogits */
} fsdp_kb_prep_t;

/* Host side. Fills *p for the descriptor; p->n is 0 for the kinds with no element-wise part
 * (gemm, bias_grad, sumsq, and the row kernels of nn_bodies.h) and for mse_loss without dy. */
static inline void fsdp_kb_prepare(const fsdp_kernel_t *k, fsdp_kb_prep_t *p)
{
    p->n = 0;
    p->fill_f32 = 0.0f;
    p->fill_i32 = 0;
    p->mse_scale = 0.0f;
    p->adamw.decay = 1.0f;
    p->adamw.one_minus_beta1 = 0.0f;
    p->adamw.beta2 = 0.0f;
    p->adamw.one_minus_beta2 = 0.0f;
    p->adamw.neg_step_size = 0.0f;
    p->adamw.bc2_sqrt = 1.0f;
    p->adamw.eps = 0.0f;
    p->ce_scale = 0.0f;

    switch (k->kind) {
    case FSDP_K_FILL: {
        double v = k->u.fill.value;
        p->n = k->u.fill.n;
        p->fill_f32 = (float)v;
        p->fill_i32 = v != v               ? 0
                      : v <= -2147483648.0 ? INT32_MIN
                      : v >= 2147483647.0  ? INT32_MAX
                                           : (int32_t)v;
        break;
    }
    case FSDP_K_CAST:
        p->n = k->u.cast.n;
        break;
    case FSDP_K_SCALE:
    case FSDP_K_DIV:
        p->n = k->u.scale.n;
        break;
    case FSDP_K_AXPY:
        p->n = k->u.axpy.n;
        break;
    case FSDP_K_BIAS_ADD:
        p->n = k->u.bias_add.rows * k->u.bias_add.cols;
        break;
    case FSDP_K_RELU_FWD:
        p->n = k->u.relu_fwd.n;
        break;
    case FSDP_K_RELU_BWD:
        p->n = k->u.relu_bwd.n;
        break;
    case FSDP_K_MSE_LOSS:
        p->n = k->u.mse.dy != NULL ? k->u.mse.n : 0;
        p->mse_scale = (float)(2.0 / k->u.mse.denom);
        break;
    case FSDP_K_ADAMW: {
        double lr = k->u.adamw.lr, b1 = k->u.adamw.beta1, b2 = k->u.adamw.beta2;
        double t = (double)k->u.adamw.step;
        p->n = k->u.adamw.n;
        p->adamw.decay = (float)(1.0 - lr * (double)k->u.adamw.weight_decay);
        p->adamw.one_minus_beta1 = (float)(1.0 - b1);
        p->adamw.beta2 = k->u.adamw.beta2;
        p->adamw.one_minus_beta2 = (float)(1.0 - b2);
        p->adamw.neg_step_size = (float)(-(lr / (1.0 - pow(b1, t))));
        p->adamw.bc2_sqrt = (float)sqrt(1.0 - pow(b2, t));
        p->adamw.eps = k->u.adamw.eps;
        break;
    }
    case FSDP_K_SGD:
        p->n = k->u.sgd.n;
        break;
    case FSDP_K_GELU_FWD:
        p->n = k->u.gelu_fwd.n;
        break;
    case FSDP_K_GELU_BWD:
        p->n = k->u.gelu_bwd.n;
        break;
    case FSDP_K_EMBEDDING_FWD:
        p->n = k->u.embedding_fwd.rows * k->u.embedding_fwd.cols;
        break;
    case FSDP_K_ADD:
        p->n = k->u.add.n;
        break;
    case FSDP_K_CHUNK_COPY:
        p->n = k->u.chunk_copy.rows * k->u.chunk_copy.cols;
        break;
    case FSDP_K_GROUP_COPY: /* the last part's end (read before the check: parts may be NULL) */
        if (k->u.group_copy.nparts > 0 && k->u.group_copy.parts != NULL) {
            const fsdp_copy_part_t *last = &k->u.group_copy.parts[k->u.group_copy.nparts - 1];
            p->n = last->first + last->rows * last->cols;
        }
        break;
    case FSDP_K_CROSS_ENTROPY:
        p->ce_scale = (float)(1.0 / k->u.cross_entropy.denom);
        break;
    default:
        break;
    }
}

/* cast: an element of the same dtype is copied bit for bit (i32 beyond 2^24, NaN payloads). */
FSDP_HD void fsdp_kb_cast_at(const fsdp_kernel_t *k, size_t i)
{
    fsdp_dtype_t sd = k->u.cast.src_dtype, dd = k->u.cast.dst_dtype;
    if (sd == dd) {
        if (k->u.cast.dst == k->u.cast.src)
            return;
        if (dd == FSDP_DTYPE_BF16 || dd == FSDP_DTYPE_F16)
            ((uint16_t *)k->u.cast.dst)[i] = ((const uint16_t *)k->u.cast.src)[i];
        else
            ((uint32_t *)k->u.cast.dst)[i] = ((const uint32_t *)k->u.cast.src)[i];
        return;
    }
    fsdp_kb_store(k->u.cast.dst, dd, i, fsdp_kb_load(k->u.cast.src, sd, i));
}

/* Element i of a chunk_copy's rows blocks of cols elements: column i % cols of block i / cols,
 * cast to dd (the same dtype copied bit for bit); past src_n a 0. */
FSDP_HD void fsdp_kb_chunk_elem(void *dst, fsdp_dtype_t dd, size_t dst_ld, const void *src,
                                fsdp_dtype_t sd, size_t src_ld, size_t src_n, size_t cols, size_t i)
{
    size_t row = i / cols, col = i - row * cols;
    size_t s = row * src_ld + col, d = row * dst_ld + col;

    if (s >= src_n)
        fsdp_kb_store(dst, dd, d, 0.0f);
    else if (sd == dd && dd != FSDP_DTYPE_F32)
        ((uint16_t *)dst)[d] = ((const uint16_t *)src)[s];
    else if (sd == dd)
        ((uint32_t *)dst)[d] = ((const uint32_t *)src)[s];
    else
        fsdp_kb_store(dst, dd, d, fsdp_kb_load(src, sd, s));
}

FSDP_HD void fsdp_kb_chunk_copy_at(const fsdp_kernel_t *k, size_t i)
{
    fsdp_kb_chunk_elem(k->u.chunk_copy.dst, k->u.chunk_copy.dst_dtype, k->u.chunk_copy.dst_ld,
                       k->u.chunk_copy.src, k->u.chunk_copy.src_dtype, k->u.chunk_copy.src_ld,
                       k->u.chunk_copy.src_n, k->u.chunk_copy.cols, i);
}

/* group_copy: element i (at or past parts[0].first) of the part it falls in, the last of the
 * nparts whose first is at most i (a binary search: an empty part shares its first with the
 * next and is passed over). The gpu backend calls it on its copy of a slice of the table. */
FSDP_HD void fsdp_kb_group_copy_at(const fsdp_copy_part_t *parts, size_t nparts, size_t i)
{
    size_t lo = 0, hi = nparts;

    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (parts[mid].first <= i)
            lo = mid;
        else
            hi = mid;
    }
    fsdp_kb_chunk_elem(parts[lo].dst, parts[lo].dst_dtype, parts[lo].dst_ld, parts[lo].src,
                       parts[lo].src_dtype, parts[lo].src_ld, parts[lo].src_n, parts[lo].cols,
                       i - parts[lo].first);
}

static inline int fsdp_kb_copy_float(fsdp_dtype_t dt)
{
    return dt == FSDP_DTYPE_F32 || dt == FSDP_DTYPE_BF16 || dt == FSDP_DTYPE_F16;
}

/* Host side: what is wrong with a group_copy's table, or NULL (the sim's and the gpu backend's
 * one check): float dtypes, the buffers a part with elements needs, leading dimensions of at
 * least the columns, and each part's first the count of the elements before it. */
static inline const char *fsdp_kb_group_copy_check(const fsdp_kernel_t *k)
{
    const fsdp_copy_part_t *parts = k->u.group_copy.parts;
    size_t next = 0;

    if (k->u.group_copy.nparts > 0 && parts == NULL)
        return "parts is NULL";
    for (size_t j = 0; j < k->u.group_copy.nparts; j++) {
        const fsdp_copy_part_t *q = &parts[j];
        size_t n = q->rows * q->cols;
        if (!fsdp_kb_copy_float(q->dst_dtype) || !fsdp_kb_copy_float(q->src_dtype))
            return "a part's dtype: f32, bf16 or f16";
        if (q->cols > 0 && n / q->cols != q->rows)
            return "a part's rows x cols overflow";
        if (n > 0 && (q->dst == NULL || (q->src == NULL && q->src_n > 0)))
            return "a part's dst or src is NULL";
        if (q->rows > 1 && (q->dst_ld < q->cols || q->src_ld < q->cols))
            return "a part's leading dimension is below its columns";
        if (q->first != next || next + n < next)
            return "a part's first is not the count of the elements before it";
        next += n;
    }
    return NULL;
}

FSDP_HD void fsdp_kb_fill_at(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p, size_t i)
{
    if (k->u.fill.dtype == FSDP_DTYPE_I32)
        ((int32_t *)k->u.fill.x)[i] = p->fill_i32;
    else
        fsdp_kb_store(k->u.fill.x, k->u.fill.dtype, i, p->fill_f32);
}

/* The element-wise part of every kind, element i < p->n. With a constant kind (the gpu
 * backend's launch templates) the switch folds away. */
FSDP_HD void fsdp_kb_elem(fsdp_kernel_kind_t kind, const fsdp_kernel_t *k, const fsdp_kb_prep_t *p,
                          size_t i)
{
    switch (kind) {
    case FSDP_K_FILL:
        fsdp_kb_fill_at(k, p, i);
        break;
    case FSDP_K_CAST:
        fsdp_kb_cast_at(k, i);
        break;
    case FSDP_K_CHUNK_COPY:
        fsdp_kb_chunk_copy_at(k, i);
        break;
    case FSDP_K_GROUP_COPY:
        fsdp_kb_group_copy_at(k->u.group_copy.parts, k->u.group_copy.nparts, i);
        break;
    case FSDP_K_SCALE:
        fsdp_kb_store(k->u.scale.x, k->u.scale.dtype, i,
                      fsdp_kb_load(k->u.scale.x, k->u.scale.dtype, i) * k->u.scale.alpha);
        break;
    case FSDP_K_DIV:
        fsdp_kb_store(k->u.scale.x, k->u.scale.dtype, i,
                      fsdp_kb_load(k->u.scale.x, k->u.scale.dtype, i) / k->u.scale.alpha);
        break;
    case FSDP_K_AXPY:
        fsdp_kb_store(k->u.axpy.y, k->u.axpy.y_dtype, i,
                      fsdp_kb_load(k->u.axpy.y, k->u.axpy.y_dtype, i) +
                          k->u.axpy.alpha * fsdp_kb_load(k->u.axpy.x, k->u.axpy.x_dtype, i));
        break;
    case FSDP_K_BIAS_ADD:
        fsdp_kb_store(
            k->u.bias_add.y, k->u.bias_add.y_dtype, i,
            fsdp_kb_load(k->u.bias_add.y, k->u.bias_add.y_dtype, i) +
                fsdp_kb_load(k->u.bias_add.bias, k->u.bias_add.bias_dtype, i % k->u.bias_add.cols));
        break;
    case FSDP_K_RELU_FWD:
        fsdp_kb_store(k->u.relu_fwd.y, k->u.relu_fwd.y_dtype, i,
                      fsdp_kb_relu(fsdp_kb_load(k->u.relu_fwd.x, k->u.relu_fwd.x_dtype, i)));
        break;
    case FSDP_K_RELU_BWD:
        fsdp_kb_store(k->u.relu_bwd.dx, k->u.relu_bwd.dx_dtype, i,
                      fsdp_kb_relu_grad(fsdp_kb_load(k->u.relu_bwd.dy, k->u.relu_bwd.dy_dtype, i),
                                        fsdp_kb_load(k->u.relu_bwd.y, k->u.relu_bwd.y_dtype, i)));
        break;
    case FSDP_K_MSE_LOSS: /* torch: (y - t) * (2 / n), rounded on store */
        fsdp_kb_store(k->u.mse.dy, k->u.mse.dy_dtype, i,
                      (fsdp_kb_load(k->u.mse.y, k->u.mse.y_dtype, i) -
                       fsdp_kb_load(k->u.mse.t, k->u.mse.t_dtype, i)) *
                          p->mse_scale);
        break;
    case FSDP_K_ADAMW:
        fsdp_kb_adamw(&k->u.adamw.param[i], k->u.adamw.grad[i], &k->u.adamw.exp_avg[i],
                      &k->u.adamw.exp_avg_sq[i], &p->adamw);
        break;
    case FSDP_K_SGD:
        fsdp_kb_sgd(&k->u.sgd.param[i], k->u.sgd.grad[i],
                    k->u.sgd.momentum_buf != NULL ? &k->u.sgd.momentum_buf[i] : NULL, k->u.sgd.lr,
                    k->u.sgd.momentum, k->u.sgd.dampening, k->u.sgd.weight_decay, k->u.sgd.nesterov,
                    k->u.sgd.first_step);
        break;
    case FSDP_K_GELU_FWD:
        fsdp_kb_store(k->u.gelu_fwd.y, k->u.gelu_fwd.dtype, i,
                      fsdp_kb_gelu(fsdp_kb_load(k->u.gelu_fwd.x, k->u.gelu_fwd.dtype, i)));
        break;
    case FSDP_K_GELU_BWD:
        fsdp_kb_store(k->u.gelu_bwd.dx, k->u.gelu_bwd.dtype, i,
                      fsdp_kb_gelu_grad(fsdp_kb_load(k->u.gelu_bwd.dy, k->u.gelu_bwd.dtype, i),
                                        fsdp_kb_load(k->u.gelu_bwd.x, k->u.gelu_bwd.dtype, i)));
        break;
    case FSDP_K_EMBEDDING_FWD:
        fsdp_kb_embedding_fwd_at(k, i);
        break;
    case FSDP_K_ADD:
        fsdp_kb_store(k->u.add.y, k->u.add.dtype, i,
                      fsdp_kb_load(k->u.add.a, k->u.add.dtype, i) +
                          fsdp_kb_load(k->u.add.b, k->u.add.dtype, i));
        break;
    default:
        break;
    }
}

/* Does the epilogue e accumulate into a C of dtype dt, with a rounding of its own? (In f32 the
 * accumulation is beta = 1's, inside the product: kernel.h.) Then the backends compute the
 * product with beta = 0 and the epilogue adds C's old value. */
FSDP_HD int fsdp_kb_gemm_accumulates(const fsdp_gemm_epilogue_t *e, fsdp_dtype_t dt)
{
    return e != NULL && e->accumulate && dt != FSDP_DTYPE_F32;
}

/* Does the GEMM descriptor k have an epilogue (kernel.h) that changes its f32 product? */
FSDP_HD int fsdp_kb_gemm_has_epilogue(const fsdp_kernel_t *k)
{
    const fsdp_gemm_epilogue_t *e = &k->u.gemm.epilogue;
    return e->bias != NULL || e->act != FSDP_ACT_NONE || e->residual != NULL ||
           fsdp_kb_gemm_accumulates(e, k->u.gemm.c_dtype);
}

/* The epilogue of a GEMM whose C (c) has dtype dt and leading dimension ldc, for element
 * (i, j): v is the product's f32 value (alpha applied, and beta * C unless the epilogue
 * accumulates into a 16-bit C); returns the value to store, which the store rounds. Each stage
 * is one torch op: its input is the previous stage's output as that op would hand it on
 * (rounded to dt), so the product alone is never rounded before the bias is added (addmm). In
 * f32 every rounding is the identity, and the arithmetic is that of bias_add, relu_fwd or
 * gelu_fwd and add, in that order. C[i, j] is read before the caller stores into it. */
FSDP_HD float fsdp_kb_gemm_epilogue(const fsdp_gemm_epilogue_t *e, fsdp_dtype_t dt, const void *c,
                                    size_t ldc, float v, size_t i, size_t j)
{
    if (e->bias != NULL)
        v = v + fsdp_kb_load(e->bias, e->bias_dtype, j);
    if (e->act == FSDP_ACT_RELU)
        v = fsdp_kb_relu(fsdp_kb_round_to(v, dt));
    else if (e->act == FSDP_ACT_GELU_TANH)
        v = fsdp_kb_gelu(fsdp_kb_round_to(v, dt));
    if (e->residual != NULL)
        v = fsdp_kb_round_to(v, dt) + fsdp_kb_load(e->residual, dt, i * ldc + j);
    if (fsdp_kb_gemm_accumulates(e, dt)) /* autograd: the new gradient, then the sum */
        v = fsdp_kb_round_to(v, dt) + fsdp_kb_load(c, dt, i * ldc + j);
    return v;
}

/* bias_grad, the term of row r, column c: dy[r, c] (in f32). */
FSDP_HD void fsdp_kb_bias_grad_col_terms(const fsdp_kernel_t *k, size_t r, size_t c, float *t)
{
    t[0] = fsdp_kb_load(k->u.bias_grad.dy, k->u.bias_grad.dy_dtype, r * k->u.bias_grad.cols + c);
}

/* bias_grad, column c: the sum s[0] is rounded (torch's sum over the rows), then added
 * (autograd's accumulate). */
FSDP_HD void fsdp_kb_bias_grad_col_store(const fsdp_kernel_t *k, size_t c, const float *s)
{
    fsdp_dtype_t dt = k->u.bias_grad.dbias_dtype;
    fsdp_kb_store(k->u.bias_grad.dbias, dt, c,
                  fsdp_kb_load(k->u.bias_grad.dbias, dt, c) + fsdp_kb_round_to(s[0], dt));
}

/* ---- column sums: bias_grad, layernorm_bwd's weight and bias gradients ----
 *
 * Per column, up to FSDP_KB_COL_SUMS sums over the rows in the column shape of lanes.h: lane y
 * of FSDP_KB_ROW_LANES sums rows y, y + 32, ... in order, in f32, and the lanes meet in
 * fsdp_kb_lane_tree's butterfly. The GPU runs a block of FSDP_KB_LANES columns x
 * FSDP_KB_ROW_LANES row lanes (gpu/kernels.cu); the host replays the block column by column
 * (fsdp_kb_colsum_block). */
#define FSDP_KB_COL_SUMS 2

/* Columns of the column part (0: none). */
FSDP_HD size_t fsdp_kb_colsum_cols(const fsdp_kernel_t *k)
{
    switch (k->kind) {
    case FSDP_K_BIAS_GRAD:
        return k->u.bias_grad.cols;
    case FSDP_K_LAYERNORM_BWD:
        return k->u.layernorm_bwd.dweight != NULL || k->u.layernorm_bwd.dbias != NULL
                   ? k->u.layernorm_bwd.cols
                   : 0;
    default:
        return 0;
    }
}

/* Rows summed per column. */
FSDP_HD size_t fsdp_kb_colsum_rows(const fsdp_kernel_t *k)
{
    return k->kind == FSDP_K_BIAS_GRAD ? k->u.bias_grad.rows : k->u.layernorm_bwd.rows;
}

/* Blocks of FSDP_KB_LANES columns. */
FSDP_HD size_t fsdp_kb_colsum_blocks(const fsdp_kernel_t *k)
{
    return (fsdp_kb_colsum_cols(k) + FSDP_KB_LANES - 1) / FSDP_KB_LANES;
}

/* Sums per column (a constant expression for a constant kind). */
#define FSDP_KB_COLSUM_N(kind) ((kind) == FSDP_K_LAYERNORM_BWD ? 2u : 1u)

/* The terms t[0 .. FSDP_KB_COLSUM_N) of row r, column c. */
FSDP_HD void fsdp_kb_colsum_terms(fsdp_kernel_kind_t kind, const fsdp_kernel_t *k, size_t r,
                                  size_t c, float *t)
{
    if (kind == FSDP_K_LAYERNORM_BWD)
        fsdp_kb_layernorm_bwd_col_terms(k, r, c, t);
    else
        fsdp_kb_bias_grad_col_terms(k, r, c, t);
}

/* Column c's sums s[0 .. FSDP_KB_COLSUM_N) into the gradients. */
FSDP_HD void fsdp_kb_colsum_store(fsdp_kernel_kind_t kind, const fsdp_kernel_t *k, size_t c,
                                  const float *s)
{
    if (kind == FSDP_K_LAYERNORM_BWD)
        fsdp_kb_layernorm_bwd_col_store(k, c, s);
    else
        fsdp_kb_bias_grad_col_store(k, c, s);
}

/* Host side: block b (columns [32 b, 32 b + 32)) as the GPU's block sums it. The rows are read
 * in order, each into its lane's partial sums. */
static inline void fsdp_kb_colsum_block(fsdp_kernel_kind_t kind, const fsdp_kernel_t *k, size_t b)
{
    const size_t cols = fsdp_kb_colsum_cols(k), rows = fsdp_kb_colsum_rows(k);
    const size_t c0 = b * FSDP_KB_LANES;
    const size_t nc = cols - c0 < FSDP_KB_LANES ? cols - c0 : FSDP_KB_LANES;
    const unsigned ns = FSDP_KB_COLSUM_N(kind);
    float part[FSDP_KB_COL_SUMS][FSDP_KB_ROW_LANES][FSDP_KB_LANES];
    float lane[FSDP_KB_ROW_LANES], t[FSDP_KB_COL_SUMS], s[FSDP_KB_COL_SUMS];

    for (unsigned q = 0; q < ns; q++)
        for (unsigned y = 0; y < FSDP_KB_ROW_LANES; y++)
            for (size_t j = 0; j < nc; j++)
                part[q][y][j] = 0.0f;
    for (size_t r = 0; r < rows; r++) {
        const unsigned y = (unsigned)(r % FSDP_KB_ROW_LANES);
        for (size_t j = 0; j < nc; j++) {
            fsdp_kb_colsum_terms(kind, k, r, c0 + j, t);
            for (unsigned q = 0; q < ns; q++)
                part[q][y][j] = part[q][y][j] + t[q];
        }
    }
    for (size_t j = 0; j < nc; j++) {
        for (unsigned q = 0; q < ns; q++) {
            for (unsigned y = 0; y < FSDP_KB_ROW_LANES; y++)
                lane[y] = part[q][y][j];
            s[q] = fsdp_kb_lane_tree(lane);
        }
        fsdp_kb_colsum_store(kind, k, c0 + j, s);
    }
}

/* Host side: blocks [b0, b1) of the column part of k (each kind a constant: the bodies inline).
 * A block writes its own columns only, so the blocks may run in any order, or at once. */
static inline void fsdp_kb_colsum_range(const fsdp_kernel_t *k, size_t b0, size_t b1)
{
    for (size_t b = b0; b < b1; b++) {
        if (k->kind == FSDP_K_LAYERNORM_BWD)
            fsdp_kb_colsum_block(FSDP_K_LAYERNORM_BWD, k, b);
        else
            fsdp_kb_colsum_block(FSDP_K_BIAS_GRAD, k, b);
    }
}

/* Host side: the whole column part of k. */
static inline void fsdp_kb_colsum(const fsdp_kernel_t *k)
{
    fsdp_kb_colsum_range(k, 0, fsdp_kb_colsum_blocks(k));
}

/* sumsq, element i: x[i]^2 in double (exact for every f32 x). */
FSDP_HD double fsdp_kb_sumsq_term(const fsdp_kernel_t *k, size_t i)
{
    double v = (double)fsdp_kb_load(k->u.sumsq.x, k->u.sumsq.dtype, i);
    return v * v;
}

/* mse_loss, element i: (y[i] - t[i])^2, the difference in f32 and its square in double. */
FSDP_HD double fsdp_kb_mse_term(const fsdp_kernel_t *k, size_t i)
{
    double d = (double)(fsdp_kb_load(k->u.mse.y, k->u.mse.y_dtype, i) -
                        fsdp_kb_load(k->u.mse.t, k->u.mse.t_dtype, i));
    return d * d;
}

/* The fixed shape of the sumsq and mse_loss sums: the GPU's grid (gpu/kernels.cu), which the
 * host replays bit for bit with fsdp_kb_reduce_sum. Block b sums terms [b * chunk, (b + 1) *
 * chunk); in a block, lane t sums its terms t, t + LANES, t + 2 LANES, ... in that order, and
 * the lanes meet in a fixed tree (fsdp_kb_reduce_tree); one last block sums the blocks'
 * partials the same way. All in double. The shape depends on n alone, not on the device. */
#define FSDP_KB_RED_LANES 256
#define FSDP_KB_RED_MAX_BLOCKS 1024

FSDP_HD void fsdp_kb_reduce_shape(size_t n, size_t *chunk_p, size_t *blocks_p)
{
    size_t chunk = (size_t)FSDP_KB_RED_LANES * 16; /* at least 16 terms a lane */

    if ((n + chunk - 1) / chunk > FSDP_KB_RED_MAX_BLOCKS) {
        chunk = (n + FSDP_KB_RED_MAX_BLOCKS - 1) / FSDP_KB_RED_MAX_BLOCKS;
        chunk = (chunk + FSDP_KB_RED_LANES - 1) / FSDP_KB_RED_LANES * FSDP_KB_RED_LANES;
    }
    *chunk_p = chunk;
    *blocks_p = (n + chunk - 1) / chunk;
}

/* Host side: lane[0] = the tree sum of lane[0 .. FSDP_KB_RED_LANES), as a block does it. */
static inline void fsdp_kb_reduce_tree(double *lane)
{
    for (unsigned w = FSDP_KB_RED_LANES / 2; w > 0; w >>= 1) {
        for (unsigned t = 0; t < w; t++)
            lane[t] += lane[t + w];
    }
}

typedef double (*fsdp_kb_term_func_t)(const fsdp_kernel_t *k, size_t i);

/* Host side: the sum of term(k, i) for i < n, in the GPU's order (same bits). */
static inline double fsdp_kb_reduce_sum(const fsdp_kernel_t *k, size_t n, fsdp_kb_term_func_t term)
{
    double lane[FSDP_KB_RED_LANES], partial[FSDP_KB_RED_MAX_BLOCKS];
    size_t chunk, blocks;

    fsdp_kb_reduce_shape(n, &chunk, &blocks);
    for (size_t b = 0; b < blocks; b++) {
        size_t begin = b * chunk, end = n - begin < chunk ? n : begin + chunk;
        for (unsigned t = 0; t < FSDP_KB_RED_LANES; t++)
            lane[t] = 0.0;
        for (size_t i = begin; i < end; i++)
            lane[(i - begin) % FSDP_KB_RED_LANES] += term(k, i);
        fsdp_kb_reduce_tree(lane);
        partial[b] = lane[0];
    }
    for (unsigned t = 0; t < FSDP_KB_RED_LANES; t++)
        lane[t] = 0.0;
    for (size_t b = 0; b < blocks; b++)
        lane[b % FSDP_KB_RED_LANES] += partial[b];
    fsdp_kb_reduce_tree(lane);
    return lane[0];
}

/* ---- dispatch by kind: a row's passes and lanes, the host's embedding chunks ---- */

/* The number of rows a row kernel runs over (0 for the others). */
FSDP_HD size_t fsdp_kb_nn_rows(const fsdp_kernel_t *k)
{
    switch (k->kind) {
    case FSDP_K_LAYERNORM_FWD:
        return k->u.layernorm_fwd.cols > 0 ? k->u.layernorm_fwd.rows : 0;
    case FSDP_K_LAYERNORM_BWD:
        return k->u.layernorm_bwd.cols > 0 && k->u.layernorm_bwd.dx != NULL
                   ? k->u.layernorm_bwd.rows
                   : 0;
    case FSDP_K_SOFTMAX_FWD:
        return k->u.softmax_fwd.rows;
    case FSDP_K_SOFTMAX_BWD:
        return k->u.softmax_bwd.rows;
    case FSDP_K_CROSS_ENTROPY:
        return k->u.cross_entropy.rows;
    default:
        return 0;
    }
}

/* The number of column chunks of the host's embedding_bwd loop (0 for the other kinds). */
FSDP_HD size_t fsdp_kb_nn_chunks(const fsdp_kernel_t *k)
{
    switch (k->kind) {
    case FSDP_K_EMBEDDING_BWD:
        return fsdp_kb_col_chunks(k->u.embedding_bwd.cols);
    default:
        return 0;
    }
}

/* The reduction passes of a row kernel (before its storing pass), and whether pass p's
 * partials meet as a maximum (else a sum). Constant expressions for a constant kind. */
#define FSDP_KB_ROW_REDUCTIONS(kind) ((kind) == FSDP_K_SOFTMAX_BWD ? 1 : 2)
#define FSDP_KB_ROW_MAX(kind, p)                                                                   \
    ((p) == 0 && ((kind) == FSDP_K_SOFTMAX_FWD || (kind) == FSDP_K_CROSS_ENTROPY))

/* Pass p of row r of a row kernel over elements l, l + step, ... into acc (see the row bodies;
 * ce_scale: cross_entropy's 1 / denom). With a constant kind the switch folds away. */
FSDP_HD void fsdp_kb_nn_row_pass(fsdp_kernel_kind_t kind, const fsdp_kernel_t *k, float ce_scale,
                                 size_t r, unsigned l, unsigned step, int p, float *st, float *acc)
{
    switch (kind) {
    case FSDP_K_LAYERNORM_FWD:
        fsdp_kb_layernorm_fwd_pass(k, r, l, step, p, st, acc);
        break;
    case FSDP_K_LAYERNORM_BWD:
        fsdp_kb_layernorm_bwd_pass(k, r, l, step, p, st, acc);
        break;
    case FSDP_K_SOFTMAX_FWD:
        fsdp_kb_softmax_fwd_pass(k, r, l, step, p, st, acc);
        break;
    case FSDP_K_SOFTMAX_BWD:
        fsdp_kb_softmax_bwd_pass(k, r, l, step, p, st, acc);
        break;
    case FSDP_K_CROSS_ENTROPY:
        fsdp_kb_cross_entropy_pass(k, ce_scale, r, l, step, p, st, acc);
        break;
    default:
        break;
    }
}

/* A partial's start in pass p: -inf for a maximum, 0 for a sum. */
FSDP_HD float fsdp_kb_nn_row_init(fsdp_kernel_kind_t kind, int p)
{
    return FSDP_KB_ROW_MAX(kind, p) ? -fsdp_kb_inff() : 0.0f;
}

/* The row's scalar from reduction p's result st[p], in place, once per row (on the GPU in every
 * lane): layernorm's mean and rstd, layernorm_bwd's means of g and g * xhat. */
FSDP_HD void fsdp_kb_nn_row_reduced(fsdp_kernel_kind_t kind, const fsdp_kernel_t *k, int p,
                                    float *st)
{
    switch (kind) {
    case FSDP_K_LAYERNORM_FWD: {
        const float n = (float)k->u.layernorm_fwd.cols;
        st[p] = p == 0 ? st[p] / n : 1.0f / sqrtf(st[p] / n + k->u.layernorm_fwd.eps);
        break;
    }
    case FSDP_K_LAYERNORM_BWD:
        st[p] = st[p] / (float)k->u.layernorm_bwd.cols;
        break;
    default:
        break;
    }
}

/* Host side: row r of a row kernel as a warp runs it: each pass once over the row into the 32
 * lanes' partials, which meet in fsdp_kb_lane_tree (fsdp_kb_lane_max): the GPU's bits. */
FSDP_HD void fsdp_kb_nn_row(fsdp_kernel_kind_t kind, const fsdp_kernel_t *k, float ce_scale,
                            size_t r)
{
    float st[FSDP_KB_ROW_STATE] = {0.0f, 0.0f, 0.0f}, part[FSDP_KB_LANES];
    const int np = FSDP_KB_ROW_REDUCTIONS(kind);

    for (int p = 0; p < np; p++) {
        for (unsigned l = 0; l < FSDP_KB_LANES; l++)
            part[l] = fsdp_kb_nn_row_init(kind, p);
        fsdp_kb_nn_row_pass(kind, k, ce_scale, r, 0, 1, p, st, part);
        st[p] = FSDP_KB_ROW_MAX(kind, p) ? fsdp_kb_lane_max(part) : fsdp_kb_lane_tree(part);
        fsdp_kb_nn_row_reduced(kind, k, p, st);
    }
    fsdp_kb_nn_row_pass(kind, k, ce_scale, r, 0, 1, np, st, part);
}

/* Column chunk c of the host's embedding_bwd loop (the GPU runs fsdp_kb_embedding_bwd_at). */
FSDP_HD void fsdp_kb_nn_cols(fsdp_kernel_kind_t kind, const fsdp_kernel_t *k, size_t c)
{
    switch (kind) {
    case FSDP_K_EMBEDDING_BWD:
        fsdp_kb_embedding_bwd_cols(k, c);
        break;
    default:
        break;
    }
}

/* Is kind a row kernel of nn_bodies.h (a constant expression)? */
#define FSDP_KB_ROW_KIND(kind)                                                                     \
    ((kind) == FSDP_K_LAYERNORM_FWD || (kind) == FSDP_K_LAYERNORM_BWD ||                           \
     (kind) == FSDP_K_SOFTMAX_FWD || (kind) == FSDP_K_SOFTMAX_BWD ||                               \
     (kind) == FSDP_K_CROSS_ENTROPY)

#define FSDP_KB_ROW_LOOP_(KIND, k, ce_scale, r0, r1)                                               \
    do {                                                                                           \
        for (size_t r_ = (r0); r_ < (r1); r_++)                                                    \
            fsdp_kb_nn_row(KIND, (k), (ce_scale), r_);                                             \
    } while (0)

/* Host side: rows [r0, r1) of a row kernel (nothing for the other kinds), each kind a constant
 * so that its passes inline into the lanes' loops. A row writes its own outputs only. */
static inline void fsdp_kb_nn_rows_range(const fsdp_kernel_t *k, float ce_scale, size_t r0,
                                         size_t r1)
{
    switch (k->kind) {
    case FSDP_K_LAYERNORM_FWD:
        FSDP_KB_ROW_LOOP_(FSDP_K_LAYERNORM_FWD, k, ce_scale, r0, r1);
        break;
    case FSDP_K_LAYERNORM_BWD:
        FSDP_KB_ROW_LOOP_(FSDP_K_LAYERNORM_BWD, k, ce_scale, r0, r1);
        break;
    case FSDP_K_SOFTMAX_FWD:
        FSDP_KB_ROW_LOOP_(FSDP_K_SOFTMAX_FWD, k, ce_scale, r0, r1);
        break;
    case FSDP_K_SOFTMAX_BWD:
        FSDP_KB_ROW_LOOP_(FSDP_K_SOFTMAX_BWD, k, ce_scale, r0, r1);
        break;
    case FSDP_K_CROSS_ENTROPY:
        FSDP_KB_ROW_LOOP_(FSDP_K_CROSS_ENTROPY, k, ce_scale, r0, r1);
        break;
    default:
        break;
    }
}

/* Host side: every row of a row kernel. */
static inline void fsdp_kb_nn_rows_host(const fsdp_kernel_t *k, float ce_scale)
{
    fsdp_kb_nn_rows_range(k, ce_scale, 0, fsdp_kb_nn_rows(k));
}

/* Host side: column chunks [c0, c1) of the host's embedding_bwd loop (none for the other kinds);
 * a chunk writes its own columns only. */
static inline void fsdp_kb_nn_cols_range(const fsdp_kernel_t *k, size_t c0, size_t c1)
{
    for (size_t c = c0; c < c1; c++)
        fsdp_kb_nn_cols(k->kind, k, c);
}

/* Host side: the column chunks of the host's embedding_bwd loop. */
static inline void fsdp_kb_nn_cols_host(const fsdp_kernel_t *k)
{
    fsdp_kb_nn_cols_range(k, 0, fsdp_kb_nn_chunks(k));
}

/* The reduction of a launch into one f32, out[0] = (float)(sum of term(k, i) for i < *n_p, in
 * double along fsdp_kb_reduce_shape's tree) / *divisor_p): sumsq's, mse_loss's loss,
 * cross_entropy's mean (when it has a loss). NULL for a launch without one. Read before the
 * element-wise part writes (mse_loss's dy may be y) and after the rows (cross_entropy's
 * losses). */
static inline fsdp_kb_term_func_t fsdp_kb_reduction(const fsdp_kernel_t *k, size_t *n_p,
                                                    float **out_p, double *divisor_p)
{
    switch (k->kind) {
    case FSDP_K_SUMSQ:
        *n_p = k->u.sumsq.n;
        *out_p = k->u.sumsq.out;
        *divisor_p = 1.0;
        return fsdp_kb_sumsq_term;
    case FSDP_K_MSE_LOSS:
        *n_p = k->u.mse.n;
        *out_p = k->u.mse.loss;
        *divisor_p = k->u.mse.denom;
        return fsdp_kb_mse_term;
    case FSDP_K_CROSS_ENTROPY:
        if (k->u.cross_entropy.loss == NULL)
            return NULL;
        *n_p = k->u.cross_entropy.rows;
        *out_p = k->u.cross_entropy.loss;
        *divisor_p = k->u.cross_entropy.denom;
        return fsdp_kb_cross_entropy_term;
    default:
        return NULL;
    }
}

#endif
