/* Kernel names and their roofline costs. */
#include <fsdp/kernel.h>

#include "kernels/attn_dims.h"

const char *fsdp_kernel_name(fsdp_kernel_kind_t kind)
{
    static const char *const names[FSDP_K_COUNT] = {
#define FSDP_KERNEL_NAME_(NAME, name, member, dtypes, exec, cost, vec) #name,
        FSDP_FOREACH_KERNEL(FSDP_KERNEL_NAME_)
#undef FSDP_KERNEL_NAME_
    };
    return (unsigned)kind < FSDP_K_COUNT ? names[kind] : "invalid";
}

/* Bytes of one element, as a double for the cost formulas. */
static double dsize(fsdp_dtype_t dtype)
{
    return (double)fsdp_dtype_size(dtype);
}

/* The elements chunk_copy reads: of each row r, those of [r ld, r ld + cols) below src_n. In
 * closed form, not a loop over the rows (W of them in FSDP2's copy-out and chunk-cat): the
 * first f rows read cols, rows f to m - 1 the rest of the source, the others none. */
static size_t chunk_copy_read(size_t rows, size_t cols, size_t ld, size_t src_n)
{
    size_t m, f = 0, t;

    if (src_n == 0 || rows == 0)
        return 0;
    if (ld == 0)
        return rows * (src_n < cols ? src_n : cols);
    /* rows that start inside the source, and of them those wholly inside, counted without
     * overflow (src_n is SIZE_MAX for a source with no end) */
    m = (src_n - 1) / ld < rows - 1 ? (src_n - 1) / ld + 1 : rows;
    if (src_n >= cols)
        f = (src_n - cols) / ld < m ? (src_n - cols) / ld + 1 : m;
    t = m - f; /* rows cut by the end, reading src_n - r ld each */
    return f * cols + (t == 0 ? 0 : t * (src_n - f * ld) - ld * (t * (t - 1) / 2));
}

/* chunk_copy's bytes (a group_copy's part's): every element written, and only those inside
 * the source read. */
static double chunk_copy_bytes(size_t rows, size_t cols, size_t ld, size_t src_n, fsdp_dtype_t dt,
                               fsdp_dtype_t st)
{
    return (double)rows * (double)cols * dsize(dt) +
           (double)chunk_copy_read(rows, cols, ld, src_n) * dsize(st);
}

void fsdp_kernel_cost(const fsdp_kernel_t *k, double *flops_p, double *bytes_p)
{
    double flops = 0.0, bytes = 0.0, n;

    switch (k->kind) {
    case FSDP_K_FILL:
        bytes = (double)k->u.fill.n * (double)fsdp_dtype_size(k->u.fill.dtype);
        break;
    case FSDP_K_CAST:
        n = (double)k->u.cast.n;
        bytes = n * (double)(fsdp_dtype_size(k->u.cast.dst_dtype) +
                             fsdp_dtype_size(k->u.cast.src_dtype));
        break;
    case FSDP_K_SCALE:
    case FSDP_K_DIV:
        n = (double)k->u.scale.n;
        flops = n;
        bytes = 2.0 * n * (double)fsdp_dtype_size(k->u.scale.dtype);
        break;
    case FSDP_K_AXPY:
        n = (double)k->u.axpy.n;
        flops = 2.0 * n;
        bytes = n * (2.0 * (double)fsdp_dtype_size(k->u.axpy.y_dtype) +
                     (double)fsdp_dtype_size(k->u.axpy.x_dtype));
        break;
    case FSDP_K_GEMM: {
        double m = (double)k->u.gemm.m, nn = (double)k->u.gemm.n, kk = (double)k->u.gemm.k;
        flops = 2.0 * m * nn * kk;
        bytes = m * kk * dsize(k->u.gemm.a_dtype) + kk * nn * dsize(k->u.gemm.b_dtype) +
                (k->u.gemm.beta != 0.0f ? 2.0 : 1.0) * m * nn * dsize(k->u.gemm.c_dtype);
        if (k->u.gemm.batch > 1) {
            flops *= (double)k->u.gemm.batch;
            bytes *= (double)k->u.gemm.batch;
        }
        /* The epilogue runs on the product before it is stored (cuBLASLt's epilogue): it adds
         * its own arithmetic and reads, and no write of C. */
        if (k->u.gemm.epilogue.bias != NULL) {
            flops += m * nn;
            bytes += nn * dsize(k->u.gemm.epilogue.bias_dtype);
        }
        if (k->u.gemm.epilogue.act != FSDP_ACT_NONE)
            flops += (k->u.gemm.epilogue.act == FSDP_ACT_GELU_TANH ? 20.0 : 1.0) * m * nn;
        if (k->u.gemm.epilogue.residual != NULL) {
            flops += m * nn;
            bytes += m * nn * dsize(k->u.gemm.c_dtype);
        }
        break;
    }
    case FSDP_K_BIAS_ADD:
        n = (double)k->u.bias_add.rows * (double)k->u.bias_add.cols;
        flops = n;
        bytes = 2.0 * n * dsize(k->u.bias_add.y_dtype) +
                (double)k->u.bias_add.cols * dsize(k->u.bias_add.bias_dtype);
        break;
    case FSDP_K_BIAS_GRAD:
        n = (double)k->u.bias_grad.rows * (double)k->u.bias_grad.cols;
        flops = n;
        bytes = n * dsize(k->u.bias_grad.dy_dtype) +
                2.0 * (double)k->u.bias_grad.cols * dsize(k->u.bias_grad.dbias_dtype);
        break;
    case FSDP_K_RELU_FWD:
        n = (double)k->u.relu_fwd.n;
        flops = n;
        bytes = n * (dsize(k->u.relu_fwd.x_dtype) + dsize(k->u.relu_fwd.y_dtype));
        break;
    case FSDP_K_RELU_BWD:
        n = (double)k->u.relu_bwd.n;
        flops = n;
        bytes = n * (dsize(k->u.relu_bwd.dy_dtype) + dsize(k->u.relu_bwd.y_dtype) +
                     dsize(k->u.relu_bwd.dx_dtype));
        break;
    case FSDP_K_MSE_LOSS:
        n = (double)k->u.mse.n;
        flops = 4.0 * n;
        bytes = n * (dsize(k->u.mse.y_dtype) + dsize(k->u.mse.t_dtype) +
                     (k->u.mse.dy ? dsize(k->u.mse.dy_dtype) : 0.0));
        break;
    case FSDP_K_ADAMW:
        n = (double)k->u.adamw.n;
        flops = 14.0 * n;
        bytes = 28.0 * n; /* read p, g, m, v; write p, m, v */
        break;
    case FSDP_K_SGD:
        n = (double)k->u.sgd.n;
        flops = 6.0 * n;
        bytes = (k->u.sgd.momentum != 0.0f ? 20.0 : 12.0) * n;
        break;
    case FSDP_K_SUMSQ:
        n = (double)k->u.sumsq.n;
        flops = 2.0 * n;
        bytes = n * (double)fsdp_dtype_size(k->u.sumsq.dtype);
        break;
    /* The transformer kernels: exp and tanh count 10 operations each (the polynomials of
     * lib/kernels/nn_bodies.h); these are memory-bound kernels on any GPU either way. e is the
     * size of an element of the kernel's dtype; mean, rstd, the losses and token ids are 4
     * bytes. */
    case FSDP_K_LAYERNORM_FWD: {
        double rows = (double)k->u.layernorm_fwd.rows, cols = (double)k->u.layernorm_fwd.cols;
        double e = (double)fsdp_dtype_size(k->u.layernorm_fwd.dtype);
        n = rows * cols;
        flops = 8.0 * n;
        bytes = 2.0 * e * (n + cols) + 8.0 * rows; /* x, y; weight, bias; mean, rstd */
        break;
    }
    case FSDP_K_LAYERNORM_BWD: {
        double rows = (double)k->u.layernorm_bwd.rows, cols = (double)k->u.layernorm_bwd.cols;
        double e = (double)fsdp_dtype_size(k->u.layernorm_bwd.dtype);
        n = rows * cols;
        flops = 14.0 * n;
        bytes = 2.0 * e * n + 12.0 * rows + 5.0 * e * cols; /* dy, x; mean, rstd; weight, dw, db */
        if (k->u.layernorm_bwd.dx != NULL)
            bytes += (k->u.layernorm_bwd.accumulate ? 2.0 : 1.0) * e * n;
        break;
    }
    case FSDP_K_GELU_FWD:
        n = (double)k->u.gelu_fwd.n;
        flops = 20.0 * n;
        bytes = 2.0 * (double)fsdp_dtype_size(k->u.gelu_fwd.dtype) * n;
        break;
    case FSDP_K_GELU_BWD:
        n = (double)k->u.gelu_bwd.n;
        flops = 25.0 * n;
        bytes = 3.0 * (double)fsdp_dtype_size(k->u.gelu_bwd.dtype) * n;
        break;
    case FSDP_K_SOFTMAX_FWD:
    case FSDP_K_SOFTMAX_BWD: {
        int fwd = k->kind == FSDP_K_SOFTMAX_FWD;
        double rows = (double)(fwd ? k->u.softmax_fwd.rows : k->u.softmax_bwd.rows);
        double cols = (double)(fwd ? k->u.softmax_fwd.cols : k->u.softmax_bwd.cols);
        int causal = fwd ? k->u.softmax_fwd.causal : k->u.softmax_bwd.causal;
        double e = (double)fsdp_dtype_size(fwd ? k->u.softmax_fwd.dtype : k->u.softmax_bwd.dtype);
        double valid = causal ? rows * (cols + 1.0) / 2.0 : rows * cols;
        flops = (fwd ? 15.0 : 5.0) * valid;
        bytes = (fwd ? 2.0 : 3.0) * e * rows * cols;
        break;
    }
    case FSDP_K_EMBEDDING_FWD: {
        double e = (double)fsdp_dtype_size(k->u.embedding_fwd.dtype);
        n = (double)k->u.embedding_fwd.rows * (double)k->u.embedding_fwd.cols;
        flops = k->u.embedding_fwd.wpe != NULL ? n : 0.0;
        bytes = (k->u.embedding_fwd.wpe != NULL ? 3.0 : 2.0) * e * n +
                4.0 * (double)k->u.embedding_fwd.rows;
        break;
    }
    case FSDP_K_EMBEDDING_BWD: {
        double e = (double)fsdp_dtype_size(k->u.embedding_bwd.dtype);
        n = (double)k->u.embedding_bwd.rows * (double)k->u.embedding_bwd.cols;
        flops = ((k->u.embedding_bwd.dwte != NULL) + (k->u.embedding_bwd.dwpe != NULL)) * n;
        bytes = e * n + 2.0 * e * flops + 4.0 * (double)k->u.embedding_bwd.rows;
        break;
    }
    case FSDP_K_CROSS_ENTROPY: {
        double e = (double)fsdp_dtype_size(k->u.cross_entropy.dtype);
        n = (double)k->u.cross_entropy.rows * (double)k->u.cross_entropy.vocab;
        flops = (k->u.cross_entropy.dlogits != NULL ? 15.0 : 12.0) * n;
        bytes = (k->u.cross_entropy.dlogits != NULL ? 2.0 : 1.0) * e * n +
                8.0 * (double)k->u.cross_entropy.rows;
        break;
    }
    case FSDP_K_ADD:
        n = (double)k->u.add.n;
        flops = n;
        bytes = 3.0 * (double)fsdp_dtype_size(k->u.add.dtype) * n;
        break;
    case FSDP_K_CHUNK_COPY:
        bytes = chunk_copy_bytes(k->u.chunk_copy.rows, k->u.chunk_copy.cols, k->u.chunk_copy.src_ld,
                                 k->u.chunk_copy.src_n, k->u.chunk_copy.dst_dtype,
                                 k->u.chunk_copy.src_dtype);
        break;
    case FSDP_K_GROUP_COPY: /* one memory-bound launch: its parts' bytes summed */
        for (size_t j = 0; j < k->u.group_copy.nparts && k->u.group_copy.parts != NULL; j++) {
            const fsdp_copy_part_t *q = &k->u.group_copy.parts[j];
            bytes +=
                chunk_copy_bytes(q->rows, q->cols, q->src_ld, q->src_n, q->dst_dtype, q->src_dtype);
        }
        break;
    /* The Llama kernels. Fused attention counts the FLOPs of its matrix products over the
     * (query, key) pairs it computes, causal about half of them (FlashAttention's count: forward
     * 4 hd a pair, backward 10, its five products with the scores recomputed), and the bytes of
     * its inputs and outputs only: no [seq, seq] tensor reaches memory. */
    case FSDP_K_RMSNORM_FWD: {
        double rows = (double)k->u.rmsnorm_fwd.rows, cols = (double)k->u.rmsnorm_fwd.cols;
        double e = dsize(k->u.rmsnorm_fwd.dtype);
        n = rows * cols;
        flops = 4.0 * n;
        bytes = 2.0 * e * n + e * cols + 4.0 * rows; /* x, y; weight; rstd */
        break;
    }
    case FSDP_K_RMSNORM_BWD: {
        double rows = (double)k->u.rmsnorm_bwd.rows, cols = (double)k->u.rmsnorm_bwd.cols;
        double e = dsize(k->u.rmsnorm_bwd.dtype);
        n = rows * cols;
        flops = 8.0 * n;
        bytes = 2.0 * e * n + 4.0 * rows + 3.0 * e * cols; /* dy, x; rstd; weight, dweight */
        if (k->u.rmsnorm_bwd.dx != NULL)
            bytes += (k->u.rmsnorm_bwd.accumulate ? 2.0 : 1.0) * e * n;
        break;
    }
    case FSDP_K_ROPE_FWD:
    case FSDP_K_ROPE_BWD:
        n = (double)k->u.rope.rows * (double)k->u.rope.heads * (double)k->u.rope.head_dim;
        flops = 3.0 * n;
        bytes = 2.0 * dsize(k->u.rope.dtype) * n +
                4.0 * (double)k->u.rope.seq * (double)k->u.rope.head_dim; /* cos, sin */
        break;
    case FSDP_K_SWIGLU_FWD:
        n = (double)k->u.swiglu_fwd.n;
        flops = 14.0 * n;
        bytes = 3.0 * dsize(k->u.swiglu_fwd.dtype) * n;
        break;
    case FSDP_K_SWIGLU_BWD:
        n = (double)k->u.swiglu_bwd.n;
        flops = 20.0 * n;
        bytes = 5.0 * dsize(k->u.swiglu_bwd.dtype) * n;
        break;
    case FSDP_K_ATTENTION_FWD:
    case FSDP_K_ATTENTION_BWD: {
        fsdp_attn_dims_t a = fsdp_attn_dims(k);
        int fwd = a.fwd;
        double b = a.batch, t = a.seq, h = a.heads, kv = a.kv_heads, hd = a.head_dim;
        double e = dsize(a.dtype);
        double pairs = a.causal ? t * (t + 1.0) / 2.0 : t * t;
        double qo = b * t * h * hd, kv_n = b * t * kv * hd; /* elements of q (or o), of k (or v) */
        flops = (fwd ? 4.0 : 10.0) * b * h * hd * pairs;
        bytes = fwd ? e * (2.0 * qo + 2.0 * kv_n) + 4.0 * b * h * t   /* q, k, v, o; lse */
                    : e * (5.0 * qo + 4.0 * kv_n) + 12.0 * b * h * t; /* + dout, dq, dk, dv */
        break;
    }
    default:
        break;
    }
    *flops_p = flops;
    *bytes_p = bytes;
}
