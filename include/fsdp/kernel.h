/* libfsdp: kernel descriptors.
 *
 * A kernel launch is a plain struct handed to the backend's `kernel` slot. The sim backend runs
 * the shared element bodies (lib/kernels/) in a loop on the host; the gpu backend launches the
 * same bodies as CUDA kernels. Describing launches as data also lets the simulator price every
 * kernel (FLOPs and bytes) from one place, fsdp_kernel_cost().
 *
 * Tensors are dense and row-major. Pointers are device pointers of the rank's backend.
 */
#ifndef FSDP_KERNEL_H
#define FSDP_KERNEL_H

#include <fsdp/api.h>

#include <fsdp/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Every kind of kernel, one row each; everything indexed by kind is generated from this list
 * (the enum below, fsdp_kernel_name, the library's lookups in lib/kernels/kinds.h and the
 * backends' dispatch tables). Rows are appended, never reordered: FSDP_K_* are numbers.
 *
 * X(NAME, name, member, dtypes, exec, cost, vec)
 *   NAME    the kind is FSDP_K_NAME
 *   name    its name in logs and traces (fsdp_kernel_name)
 *   member  its operands: the member of fsdp_kernel_t's union
 *   dtypes  ONE: every tensor but f32 statistics has the member's `dtype`; MIXED: each operand
 *           names its own (x_dtype, y_dtype, ...); F32: f32 only (float * operands)
 *   exec    how a backend runs it: ELEMS, independent elements (fsdp_kb_elem over i < n, which
 *           a backend may cut anywhere); PARTS, the parts of lib/kernels/kernel_elem.h in order
 *           (column sums, rows, a reduction, elements); PASSES, the passes of
 *           lib/kernels/llama_bodies.h; GEMM, the backend's own matrix product
 *   cost    how the simulator prices its FLOPs and bytes (fsdp_kernel_cost): VECTOR, a roofline
 *           on CUDA cores; MATMUL, tensor cores at the GEMM's efficiency; ATTENTION, tensor
 *           cores at the fused attention's
 *   vec     which of its parts the sim may run with host vectors (sim/elem_vec.c), the bytes of
 *           its scalar loops: ELEMS, its elements; ROWS, its rows; COLS, its column sums;
 *           COLS_ROWS, both; PASSES, its passes; NONE, none (the scalar loops run it all). The
 *           vector loops and their check of the operands are named after the member */
#define FSDP_FOREACH_KERNEL(X)                                                                     \
    X(FILL, fill, fill, ONE, ELEMS, VECTOR, NONE)                                                  \
    X(CAST, cast, cast, MIXED, ELEMS, VECTOR, ELEMS)                                               \
    X(SCALE, scale, scale, ONE, ELEMS, VECTOR, NONE)                                               \
    X(DIV, div, scale, ONE, ELEMS, VECTOR, NONE)                                                   \
    X(AXPY, axpy, axpy, MIXED, ELEMS, VECTOR, ELEMS)                                               \
    X(GEMM, gemm, gemm, MIXED, GEMM, MATMUL, NONE)                                                 \
    X(BIAS_ADD, bias_add, bias_add, MIXED, PARTS, VECTOR, ELEMS)                                   \
    X(BIAS_GRAD, bias_grad, bias_grad, MIXED, PARTS, VECTOR, COLS)                                 \
    X(RELU_FWD, relu_fwd, relu_fwd, MIXED, ELEMS, VECTOR, ELEMS)                                   \
    X(RELU_BWD, relu_bwd, relu_bwd, MIXED, ELEMS, VECTOR, ELEMS)                                   \
    X(MSE_LOSS, mse_loss, mse, MIXED, PARTS, VECTOR, NONE)                                         \
    X(ADAMW, adamw, adamw, F32, ELEMS, VECTOR, ELEMS)                                              \
    X(SGD, sgd, sgd, F32, ELEMS, VECTOR, ELEMS)                                                    \
    X(SUMSQ, sumsq, sumsq, ONE, PARTS, VECTOR, NONE)                                               \
    X(LAYERNORM_FWD, layernorm_fwd, layernorm_fwd, ONE, PARTS, VECTOR, ROWS)                       \
    X(LAYERNORM_BWD, layernorm_bwd, layernorm_bwd, ONE, PARTS, VECTOR, COLS_ROWS)                  \
    X(GELU_FWD, gelu_fwd, gelu_fwd, ONE, ELEMS, VECTOR, ELEMS)                                     \
    X(GELU_BWD, gelu_bwd, gelu_bwd, ONE, ELEMS, VECTOR, ELEMS)                                     \
    X(SOFTMAX_FWD, softmax_fwd, softmax_fwd, ONE, PARTS, VECTOR, ROWS)                             \
    X(SOFTMAX_BWD, softmax_bwd, softmax_bwd, ONE, PARTS, VECTOR, ROWS)                             \
    X(EMBEDDING_FWD, embedding_fwd, embedding_fwd, ONE, PARTS, VECTOR, NONE)                       \
    X(EMBEDDING_BWD, embedding_bwd, embedding_bwd, ONE, PARTS, VECTOR, NONE)                       \
    X(CROSS_ENTROPY, cross_entropy, cross_entropy, ONE, PARTS, VECTOR, ROWS)                       \
    X(ADD, add, add, ONE, ELEMS, VECTOR, ELEMS)                                                    \
    X(RMSNORM_FWD, rmsnorm_fwd, rmsnorm_fwd, ONE, PASSES, VECTOR, PASSES)                          \
    X(RMSNORM_BWD, rmsnorm_bwd, rmsnorm_bwd, ONE, PASSES, VECTOR, PASSES)                          \
    X(ROPE_FWD, rope_fwd, rope, ONE, PASSES, VECTOR, PASSES)                                       \
    X(ROPE_BWD, rope_bwd, rope, ONE, PASSES, VECTOR, PASSES)                                       \
    X(SWIGLU_FWD, swiglu_fwd, swiglu_fwd, ONE, PASSES, VECTOR, PASSES)                             \
    X(SWIGLU_BWD, swiglu_bwd, swiglu_bwd, ONE, PASSES, VECTOR, PASSES)                             \
    X(ATTENTION_FWD, attention_fwd, attention_fwd, ONE, PASSES, ATTENTION, PASSES)                 \
    X(ATTENTION_BWD, attention_bwd, attention_bwd, ONE, PASSES, ATTENTION, PASSES)                 \
    X(CHUNK_COPY, chunk_copy, chunk_copy, MIXED, ELEMS, VECTOR, NONE)                              \
    X(GROUP_COPY, group_copy, group_copy, MIXED, ELEMS, VECTOR, NONE)

typedef enum {
#define FSDP_KERNEL_ENUM_(NAME, name, member, dtypes, exec, cost, vec) FSDP_K_##NAME,
    FSDP_FOREACH_KERNEL(FSDP_KERNEL_ENUM_)
#undef FSDP_KERNEL_ENUM_
        FSDP_K_COUNT
} fsdp_kernel_kind_t;

FSDP_API const char *fsdp_kernel_name(fsdp_kernel_kind_t kind);

/* The activation of a GEMM epilogue (values appended, never reordered). */
typedef enum {
    FSDP_ACT_NONE = 0,
    FSDP_ACT_RELU,     /* max(x, 0) */
    FSDP_ACT_GELU_TANH /* HF's gelu_new, the body of gelu_fwd */
} fsdp_activation_t;

/* What follows a GEMM's product, in this order, each stage one PyTorch op: the bias (torch's
 * addmm: the product plus the bias, in f32), the activation, the residual add, then the
 * accumulation into C. Every stage computes in f32 from its input and, when C is 16-bit, its
 * result is rounded once to C's dtype, as the op's own kernel does; so the product is rounded
 * only after the bias is added. In f32 a GEMM with an epilogue gives the bits of the separate
 * launches (gemm, bias_add, relu_fwd or gelu_fwd, add); under mixed precision, addmm's one
 * rounding instead of two. A zeroed epilogue does nothing. */
typedef struct fsdp_gemm_epilogue {
    const void *bias;        /* [N] of bias_dtype, or NULL: no bias */
    fsdp_dtype_t bias_dtype; /* f32, bf16 or f16 */
    fsdp_activation_t act;
    const void *residual; /* [M, N] of C's dtype with C's leading dimension, or NULL; may be C */
    /* 1: C holds a gradient the product adds to (needs beta == 1 and one product), as autograd
     * accumulates a new gradient into an existing one. In a 16-bit C the result of the stages
     * before (the new gradient, beta * C left out) is rounded to C's dtype, then added to C's
     * old value in f32 and rounded again: two torch ops, where beta = 1 alone rounds once. In an
     * f32 C, where the new gradient needs no rounding, it changes nothing: beta * C is added
     * where beta = 1 adds it. 0: no accumulation stage. */
    int accumulate;
} fsdp_gemm_epilogue_t;

/* One part of a group_copy launch: the operands of a chunk_copy (below), and `first`, the index
 * of its first element among the launch's: the sum of rows * cols over the parts before it. */
typedef struct fsdp_copy_part {
    void *dst;
    const void *src;
    size_t dst_ld, src_ld, src_n, rows, cols, first;
    fsdp_dtype_t dst_dtype, src_dtype;
} fsdp_copy_part_t;

typedef struct fsdp_kernel {
    fsdp_kernel_kind_t kind;
    union {
        /* x[i] = value for i < n (value converted to dtype) */
        struct { void *x; fsdp_dtype_t dtype; size_t n; double value; } fill;
        /* dst[i] = (dst_dtype) src[i]; round to nearest even; dst and src may not overlap
         * unless they are the same pointer with the same dtype */
        struct { void *dst; fsdp_dtype_t dst_dtype; const void *src; fsdp_dtype_t src_dtype;
                 size_t n; } cast;
        /* x[i] *= alpha (scale) or x[i] /= alpha (div), computed in f32, stored in dtype */
        struct { void *x; fsdp_dtype_t dtype; size_t n; float alpha; } scale;
        /* y[i] += alpha * x[i]; computed in f32 */
        struct { void *y; fsdp_dtype_t y_dtype; const void *x; fsdp_dtype_t x_dtype; size_t n;
                 float alpha; } axpy;
        /* C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C, row-major.
         * op(A) = A ([M,K], lda >= K) or A^T (A is [K,M], lda >= M); likewise B.
         * beta == 0 ignores C's old contents (NaN included).
         * Dtypes (f32 when zeroed): A and B share one of f32, bf16, f16; C is that dtype or
         * f32 (cublasGemmEx's combinations). Products and sums are f32, alpha and beta * C are
         * applied in f32, and C is rounded once (nearest even), unless the epilogue rounds more
         * (a 16-bit C's activation, residual or accumulation stage). */
        struct { int trans_a, trans_b; size_t m, n, k; float alpha; const void *a; size_t lda;
                 const void *b; size_t ldb; float beta; void *c; size_t ldc;
                 fsdp_dtype_t a_dtype, b_dtype, c_dtype;
                 /* batch > 1: `batch` independent products, the i-th on a + i * stride_a,
                  * b + i * stride_b and c + i * stride_c (elements), in index order; 0 or 1 is
                  * the one product above (strides unused) */
                 size_t batch, stride_a, stride_b, stride_c;
                 /* applied to every element of C before its one store; needs batch <= 1 */
                 fsdp_gemm_epilogue_t epilogue;
                 /* 0, or a number naming B's contents (fsdp_unit_param_version): a later
                  * launch with the same b, b_dtype, ldb, trans_b, n, k and nonzero b_version
                  * reads the same values, so a backend may reuse work derived from them (the
                  * sim: B as packed for its GEMM). Never changes a result. */
                 uint64_t b_version; } gemm;
        /* The element-wise kinds below load every operand as f32 (any float dtype), compute
         * in f32 and round on store; a buffer used in place must keep one dtype. */
        /* y[r, c] += bias[c] for r < rows, c < cols */
        struct { void *y; const void *bias; size_t rows, cols;
                 fsdp_dtype_t y_dtype, bias_dtype; } bias_add;
        /* dbias[c] += sum over r of dy[r, c], summed in f32 (32 row lanes, row r in lane r % 32
         * in order, meeting in a butterfly: lib/kernels/lanes.h) and rounded to dbias's dtype
         * once, then added (and rounded), as autograd accumulates a new gradient */
        struct { void *dbias; const void *dy; size_t rows, cols;
                 fsdp_dtype_t dbias_dtype, dy_dtype; } bias_grad;
        /* y[i] = max(x[i], 0); y may equal x */
        struct { void *y; const void *x; size_t n; fsdp_dtype_t y_dtype, x_dtype; } relu_fwd;
        /* dx[i] = y[i] > 0 ? dy[i] : 0; dx may equal dy */
        struct { void *dx; const void *dy; const void *y; size_t n;
                 fsdp_dtype_t dx_dtype, dy_dtype, y_dtype; } relu_bwd;
        /* loss[0] = sum((y - t)^2) / denom; dy[i] = 2 (y[i] - t[i]) / denom (dy may be NULL).
         * The loss is f32 whatever y, t and dy are (dy may equal y, with one dtype). */
        struct { float *loss; void *dy; const void *y; const void *t; size_t n;
                 double denom; fsdp_dtype_t y_dtype, t_dtype, dy_dtype; } mse;
        /* torch.optim.AdamW, one step t (1-based) on n elements, f32 */
        struct { float *param; const float *grad; float *exp_avg; float *exp_avg_sq; size_t n;
                 float lr, beta1, beta2, eps, weight_decay; int64_t step; } adamw;
        /* torch.optim.SGD on n elements, f32; first_step selects buf = grad */
        struct { float *param; const float *grad; float *momentum_buf; size_t n; float lr,
                 momentum, dampening, weight_decay; int nesterov, first_step; } sgd;
        /* out[0] = sum x[i]^2 (f32 out, computed in double in index order) */
        struct { float *out; const void *x; fsdp_dtype_t dtype; size_t n; } sumsq;

        /* ---- the transformer kernels (GPT-2). Every tensor but the layernorm statistics
         * (mean, rstd) and the cross-entropy losses (f32 always) is of the descriptor's dtype:
         * f32 (0, the default), bf16 or f16 (the activations, weights and gradients of a model
         * under mixed precision). Each kernel loads its inputs as f32, computes in f32 and
         * rounds every output once on store (nearest even), as torch's CUDA kernels do for
         * low-precision inputs. Reductions have fixed shapes (lib/kernels/lanes.h): a sum over
         * a row in f32 over 32 lanes (lane l takes elements l, l + 32, ... in order) meeting
         * in a butterfly; a sum over rows (weight gradients) the same over 32 row lanes per
         * column; the embedding backward in row order per gradient element. So every result
         * depends on the shapes alone. exp and log are the shared bodies' own
         * (lib/kernels/nn_bodies.h), the same bits on the host and the GPU. ---- */

        /* LayerNorm over the last dimension of x [rows, cols]: mean = sum(x) / cols,
         * var = sum((x - mean)^2) / cols, rstd = 1 / sqrt(var + eps),
         * y = (x - mean) * rstd * weight + bias. mean[r] and rstd[r] (f32) are saved unless
         * NULL. y may equal x. */
        struct { void *y; float *mean; float *rstd; const void *x; const void *weight;
                 const void *bias; size_t rows, cols; float eps; fsdp_dtype_t dtype; }
            layernorm_fwd;
        /* Its backward from x and the saved mean and rstd: with xhat = (x - mean) * rstd and
         * g = dy * weight, dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), written
         * (accumulate 0) or added (accumulate 1: the term is rounded to the dtype, then the sum,
         * as a separate add would); dweight[c] += sum over r of dy * xhat and dbias[c] += sum
         * over r of dy (summed in f32 and rounded once, then added, as autograd accumulates). Any
         * of dx, dweight, dbias may be NULL (not
         * computed). dx must not overlap dy or x. */
        struct { void *dx; void *dweight; void *dbias; const void *dy; const void *x;
                 const float *mean; const float *rstd; const void *weight; size_t rows, cols;
                 int accumulate; fsdp_dtype_t dtype; } layernorm_bwd;
        /* y = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), HF's gelu_new; y may equal x */
        struct { void *y; const void *x; size_t n; fsdp_dtype_t dtype; } gelu_fwd;
        /* dx = dy * gelu_new'(x); dx may equal dy */
        struct { void *dx; const void *dy; const void *x; size_t n; fsdp_dtype_t dtype; }
            gelu_bwd;
        /* y = softmax(z) over each row of x [rows, cols], where the scaled scores z are
         * scale * x (divisor 0: torch's multiply by a Python-float scale, as Llama's eager
         * attention does) or x / divisor, divisor first rounded to the dtype (HF's eager GPT-2
         * attention divides by torch.full([], sqrt(head size), dtype=dtype)); f32 arithmetic
         * either way. causal: x is [batch, cols, cols] (rows = batch * cols) and row r keeps
         * columns 0 .. r % cols, the others are 0 (the masked attention of a decoder). y may
         * equal x. In a 16-bit dtype z is rounded to the dtype first: the scaling is its own
         * torch op. head_dim: the scores are attention's (x is q k^T per head, of head size
         * head_dim, rows = batch x heads x cols), for pricing eager PyTorch's copies of q, k, v
         * and the output between layouts (docs/costs.md); 0: not priced. */
        struct { void *y; const void *x; size_t rows, cols; float scale; int causal;
                 fsdp_dtype_t dtype; float divisor; size_t head_dim; } softmax_fwd;
        /* Its backward from the saved y: with g = y * (dy - sum(y * dy)) per row,
         * dx = scale * g or g / divisor (the forward's scaling; 0 where masked); dx may equal
         * dy. In a 16-bit dtype g is rounded to the dtype before it is scaled (softmax's
         * backward, then the scaling's: torch's div backward divides by the same rounded
         * divisor). head_dim as the forward's. */
        struct { void *dx; const void *dy; const void *y; size_t rows, cols; float scale;
                 int causal; fsdp_dtype_t dtype; float divisor; size_t head_dim; } softmax_bwd;
        /* y[r, c] = wte[tokens[r], c] + wpe[r % seq, c] for r < rows, c < cols; wpe may be NULL
         * (no position term). A token outside [0, vocab) gives a row of NaN, or with
         * zero_outside a row of zeros (a vocabulary-parallel embedding's rows of the tokens
         * another rank holds, which torch masks to zero). */
        struct { void *y; const int32_t *tokens; const void *wte; const void *wpe;
                 size_t rows, cols, seq, vocab; fsdp_dtype_t dtype; int zero_outside; }
            embedding_fwd;
        /* dwte[tokens[r], c] += dy[r, c] and dwpe[r % seq, c] += dy[r, c]. In f32 each row adds
         * in row order; in a 16-bit dtype the rows of one token (of one position) are summed in
         * f32 in row order and rounded once, then added and rounded, as torch's embedding
         * backward and autograd's accumulation do. dwte or dwpe may be NULL; tokens outside
         * [0, vocab) add nothing. */
        struct { void *dwte; void *dwpe; const void *dy; const int32_t *tokens; size_t rows,
                 cols, seq, vocab; fsdp_dtype_t dtype; } embedding_bwd;
        /* Softmax cross-entropy over logits [rows, vocab]: losses[r] = logsumexp(logits[r]) -
         * logits[r, targets[r]] (0 for a target < 0: ignored, as torch's ignore_index);
         * loss[0] = sum(losses) / denom, summed in double along the tree of sumsq;
         * dlogits[r] = (softmax(logits[r]) - onehot(targets[r])) / denom (a zero row when
         * ignored). loss and losses are f32 whatever the dtype (the logits upcast, as HF's
         * loss does). loss and dlogits may be NULL; dlogits may equal logits; losses (rows
         * floats) is always written. A target >= vocab gives NaN.
         * stage 1 to 3: torch's loss_parallel over logits sharded by the vocabulary, this rank's
         * columns [vocab_start, vocab_start + vocab) of targets in the whole vocabulary, with
         * stats [3 rows] f32 (the row maximum, the sum of exponentials, the target's logit)
         * reduced across the ranks between the stages: 1 writes this rank's maximum and target
         * logit (0 when another rank holds it), 2 the sum of exp(logit - stats' maximum), 3
         * losses, loss and dlogits from the reduced stats, as above (ignored rows 0); losses
         * is written by stage 3 only. */
        struct { float *loss; float *losses; void *dlogits; const void *logits;
                 const int32_t *targets; size_t rows, vocab; double denom; fsdp_dtype_t dtype;
                 int stage; float *stats; size_t vocab_start; }
            cross_entropy;
        /* y = a + b (the residual add); y may equal a or b */
        struct { void *y; const void *a; const void *b; size_t n; fsdp_dtype_t dtype; } add;
        /* FSDP2's copy-out and chunk-cat: rows blocks of cols elements, block i from src +
         * i * src_ld to dst + i * dst_ld, cast to dst_dtype (rounded once, nearest even; the
         * same dtype is copied bit for bit); an element at or past src + src_n reads as 0 (a
         * gradient's chunks padded to whole ones). dst and src do not overlap. */
        struct { void *dst; fsdp_dtype_t dst_dtype; size_t dst_ld; const void *src;
                 fsdp_dtype_t src_dtype; size_t src_ld; size_t src_n; size_t rows, cols; }
            chunk_copy;
        /* FSDP2's copy-out, chunk-cat and gradient relayout of a whole group in one launch, as
         * torch's split_with_sizes_copy and _chunk_cat: each part of parts[0 .. nparts) is a
         * chunk_copy, whose element e is the launch's element parts[j].first + e, the same
         * bits as its own chunk_copy. No part's dst overlaps another part's dst or src. The
         * table is read while the launch is issued and need not outlive the call (the gpu
         * backend copies it into the kernel's arguments: a launch of up to 32 parts each). */
        struct { const fsdp_copy_part_t *parts; size_t nparts; } group_copy;

        /* ---- the Llama kernels (lib/kernels/llama_bodies.h), under the rules of the
         * transformer kernels above: one dtype per descriptor, f32 statistics, f32 arithmetic,
         * each output rounded once, except where a rounding of HF's eager PyTorch is named. ---- */

        /* RMSNorm over the last dimension of x [rows, cols], HF's LlamaRMSNorm:
         * rstd = 1 / sqrt(sum(x^2) / cols + eps) in f32, y = round(x * rstd) * weight (the
         * normalized row rounded to the dtype before the weight, as HF casts it back first).
         * rstd[r] (f32) is saved unless NULL. y may equal x. */
        struct { void *y; float *rstd; const void *x; const void *weight; size_t rows, cols;
                 float eps; fsdp_dtype_t dtype; } rmsnorm_fwd;
        /* Its backward from x and the saved rstd: with xhat = x * rstd and g = round(dy * weight),
         * dx = rstd * (g - xhat * mean(g * xhat)), written or added (accumulate, as layernorm_bwd);
         * dweight[c] += sum over r of dy * round(xhat) (summed in f32, added once). dx or dweight
         * may be NULL. dx must not overlap dy or x. */
        struct { void *dx; void *dweight; const void *dy; const void *x; const float *rstd;
                 const void *weight; size_t rows, cols; int accumulate; fsdp_dtype_t dtype; }
            rmsnorm_bwd;
        /* Rotary embedding in HF's rotate_half convention, in place or not, on `heads` heads of
         * head_dim (even) columns at the start of each of `rows` rows of ld elements (x and y
         * share ld); row r is position r % seq. With c = cos[p, i] and s = sin[p, i] ([seq,
         * head_dim / 2] f32 tables, rounded to the dtype as HF casts them) and the halves x1 =
         * x[i], x2 = x[i + head_dim / 2]: forward y1 = x1 c - x2 s, y2 = x2 c + x1 s; backward
         * (rope_bwd, x = dy, y = dx) the transpose, dx1 = dy1 c + dy2 s, dx2 = dy2 c - dy1 s.
         * Each product is rounded to the dtype, then the sum (HF's separate ops). */
        struct { void *y; const void *x; const float *cos; const float *sin; size_t rows, heads,
                 head_dim, seq, ld; fsdp_dtype_t dtype; } rope;
        /* SwiGLU's gate: y = round(silu(gate)) * up, silu(g) = g / (1 + e^-g); y may equal gate
         * or up */
        struct { void *y; const void *gate; const void *up; size_t n; fsdp_dtype_t dtype; }
            swiglu_fwd;
        /* Its backward: dup = dy * round(silu(gate)), dgate = round(dy * up) * silu'(gate) with
         * silu'(g) = s (1 + g (1 - s)), s = sigmoid(g) (torch's silu_backward). dgate may equal
         * gate and dup up (each element is read before it is written). */
        struct { void *dgate; void *dup; const void *dy; const void *gate; const void *up;
                 size_t n; fsdp_dtype_t dtype; } swiglu_bwd;
        /* Fused attention with FlashAttention's contract: o = softmax(scale q k^T, causal) v per
         * query head, without any [seq, seq] buffer; only o and the per-row log-sum-exp of the
         * scaled scores, lse [batch, heads, seq] (f32), are kept for the backward. Grouped-query:
         * query head h reads kv head h / (heads / kv_heads) (HF's repeat_kv); kv_heads divides
         * heads. q is [batch, seq] rows of ldq elements with head h at column h * head_dim; k, v
         * likewise (kv heads, ldk, ldv); o is [batch, seq] rows of ldo with head h at h *
         * head_dim. causal: query t sees keys 0..t. Scores, the online softmax (running max and
         * sum, rescaled as the max grows) and the weighted sum of v are f32, in key order; o is
         * rounded once. head_dim <= FSDP_KB_ATTN_MAX_HD. lse may be NULL (no backward). */
        struct { void *o; float *lse; const void *q; const void *k; const void *v;
                 size_t batch, seq, heads, kv_heads, head_dim, ldq, ldk, ldv, ldo; float scale;
                 int causal; fsdp_dtype_t dtype; } attention_fwd;
        /* Its backward, recomputing the probabilities p = exp(scale q.k - lse) from q, k and the
         * saved lse: delta = rowsum(dout * o) (f32, into the caller's [batch, heads, seq]
         * workspace), ds = p (dout.v - delta); dq = scale sum_j ds k_j, dk = scale sum_i ds q_i,
         * dv = sum_i p dout_i (a kv head's sums run over its query heads, then over queries, in
         * order). dq, dk, dv are written (not added) with q's, k's and v's leading dimensions,
         * and must not overlap an input; dout and o have ldo. */
        struct { void *dq; void *dk; void *dv; float *delta; const void *dout; const void *o;
                 const void *q; const void *k; const void *v; const float *lse; size_t batch,
                 seq, heads, kv_heads, head_dim, ldq, ldk, ldv, ldo; float scale; int causal;
                 fsdp_dtype_t dtype; } attention_bwd;
    } u;
} fsdp_kernel_t;

/* Arithmetic cost of a launch for the roofline model: floating-point operations and bytes
 * read plus written. Pure function of the descriptor. */
FSDP_API void fsdp_kernel_cost(const fsdp_kernel_t *k, double *flops_p, double *bytes_p);

#ifdef __cplusplus
}
#endif
#endif
