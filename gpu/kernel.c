/* The kernel slot: checks a descriptor, runs GEMM through cuBLAS and hands every other kind to
 * the CUDA launchers of kernels.cu. */
#include "config.h"

#include "gpu_trace.h"

#include <limits.h>

#include "kernels/kernel_elem.h"
#include "kernels/llama_bodies.h"
#include "kernels/nn_bodies.h"

static int dtype_ok(fsdp_dtype_t dtype)
{
    return (int)dtype >= 0 && dtype < FSDP_DTYPE_COUNT;
}

static int float_ok(fsdp_dtype_t dtype)
{
    return dtype == FSDP_DTYPE_F32 || dtype == FSDP_DTYPE_BF16 || dtype == FSDP_DTYPE_F16;
}

/* An output that is also an input (in place) must keep its dtype. */
static int in_place_ok(const void *out, fsdp_dtype_t out_dtype, const void *in,
                       fsdp_dtype_t in_dtype)
{
    return out == NULL || out != in || out_dtype == in_dtype;
}

/* The transformer kinds: what is wrong, or NULL. */
static const char *check_nn(const fsdp_kernel_t *k)
{
    if (!float_ok(fsdp_kb_dtype(k)))
        return "dtype: the transformer kernels take f32, bf16 or f16";
    switch (k->kind) {
    case FSDP_K_LAYERNORM_FWD:
        if (k->u.layernorm_fwd.rows > 0 && k->u.layernorm_fwd.cols > 0 &&
            (k->u.layernorm_fwd.y == NULL || k->u.layernorm_fwd.x == NULL ||
             k->u.layernorm_fwd.weight == NULL || k->u.layernorm_fwd.bias == NULL))
            return "y, x, weight or bias is NULL";
        return NULL;
    case FSDP_K_LAYERNORM_BWD:
        if (k->u.layernorm_bwd.rows > 0 && k->u.layernorm_bwd.cols > 0 &&
            (k->u.layernorm_bwd.dy == NULL || k->u.layernorm_bwd.x == NULL ||
             k->u.layernorm_bwd.mean == NULL || k->u.layernorm_bwd.rstd == NULL ||
             (k->u.layernorm_bwd.dx != NULL && k->u.layernorm_bwd.weight == NULL)))
            return "dy, x, mean, rstd or weight is NULL";
        return NULL;
    case FSDP_K_GELU_FWD:
        return k->u.gelu_fwd.n > 0 && (k->u.gelu_fwd.y == NULL || k->u.gelu_fwd.x == NULL)
                   ? "y or x is NULL"
                   : NULL;
    case FSDP_K_GELU_BWD:
        return k->u.gelu_bwd.n > 0 && (k->u.gelu_bwd.dx == NULL || k->u.gelu_bwd.dy == NULL ||
                                       k->u.gelu_bwd.x == NULL)
                   ? "dx, dy or x is NULL"
                   : NULL;
    case FSDP_K_SOFTMAX_FWD:
        if (k->u.softmax_fwd.rows > 0 && k->u.softmax_fwd.cols == 0)
            return "rows of 0 columns";
        if (k->u.softmax_fwd.causal && k->u.softmax_fwd.rows % k->u.softmax_fwd.cols != 0)
            return "causal rows are not whole [cols, cols] blocks";
        return k->u.softmax_fwd.rows > 0 &&
                       (k->u.softmax_fwd.y == NULL || k->u.softmax_fwd.x == NULL)
                   ? "y or x is NULL"
                   : NULL;
    case FSDP_K_SOFTMAX_BWD:
        if (k->u.softmax_bwd.rows > 0 && k->u.softmax_bwd.cols == 0)
            return "rows of 0 columns";
        if (k->u.softmax_bwd.causal && k->u.softmax_bwd.rows % k->u.softmax_bwd.cols != 0)
            return "causal rows are not whole [cols, cols] blocks";
        return k->u.softmax_bwd.rows > 0 &&
                       (k->u.softmax_bwd.dx == NULL || k->u.softmax_bwd.dy == NULL ||
                        k->u.softmax_bwd.y == NULL)
                   ? "dx, dy or y is NULL"
                   : NULL;
    case FSDP_K_EMBEDDING_FWD:
        if (k->u.embedding_fwd.wpe != NULL && k->u.embedding_fwd.seq == 0)
            return "seq is 0 with a position table";
        return k->u.embedding_fwd.rows > 0 && k->u.embedding_fwd.cols > 0 &&
                       (k->u.embedding_fwd.y == NULL || k->u.embedding_fwd.tokens == NULL ||
                        k->u.embedding_fwd.wte == NULL)
                   ? "y, tokens or wte is NULL"
                   : NULL;
    case FSDP_K_EMBEDDING_BWD:
        if (k->u.embedding_bwd.dwpe != NULL && k->u.embedding_bwd.seq == 0)
            return "seq is 0 with a position gradient";
        return k->u.embedding_bwd.rows > 0 && k->u.embedding_bwd.cols > 0 &&
                       (k->u.embedding_bwd.dy == NULL || k->u.embedding_bwd.tokens == NULL)
                   ? "dy or tokens is NULL"
                   : NULL;
    case FSDP_K_CROSS_ENTROPY:
        if (k->u.cross_entropy.rows > 0 &&
            (k->u.cross_entropy.vocab == 0 || k->u.cross_entropy.logits == NULL ||
             k->u.cross_entropy.targets == NULL || k->u.cross_entropy.losses == NULL))
            return "0 classes, or logits, targets or losses is NULL";
        if (k->u.cross_entropy.stage < 0 || k->u.cross_entropy.stage > 3 ||
            (k->u.cross_entropy.stage != 0 && k->u.cross_entropy.stats == NULL))
            return "stage must be 0 to 3, and stats given for stages 1 to 3";
        if ((k->u.cross_entropy.loss != NULL || k->u.cross_entropy.dlogits != NULL) &&
            !(k->u.cross_entropy.denom > 0.0))
            return "denom must be > 0";
        return NULL;
    case FSDP_K_ADD:
        return k->u.add.n > 0 && (k->u.add.y == NULL || k->u.add.a == NULL || k->u.add.b == NULL)
                   ? "y, a or b is NULL"
                   : NULL;
    default:
        return "unknown kind";
    }
}

/* NULL pointers with work to do, invalid dtypes, degenerate shapes. Logs what was wrong. */
static fsdp_status_t check(const fsdp_dev_t *dev, const fsdp_kernel_t *k)
{
    const char *bad = NULL;

    switch (k->kind) {
    case FSDP_K_FILL:
        if (!dtype_ok(k->u.fill.dtype))
            bad = "dtype";
        else if (k->u.fill.n > 0 && k->u.fill.x == NULL)
            bad = "x is NULL";
        break;
    case FSDP_K_CHUNK_COPY:
        if (!dtype_ok(k->u.chunk_copy.dst_dtype) || !dtype_ok(k->u.chunk_copy.src_dtype))
            bad = "dtype";
        else if (k->u.chunk_copy.rows * k->u.chunk_copy.cols > 0 &&
                 (k->u.chunk_copy.dst == NULL ||
                  (k->u.chunk_copy.src == NULL && k->u.chunk_copy.src_n > 0)))
            bad = "dst or src is NULL";
        else if (k->u.chunk_copy.rows > 1 && (k->u.chunk_copy.dst_ld < k->u.chunk_copy.cols ||
                                              k->u.chunk_copy.src_ld < k->u.chunk_copy.cols))
            bad = "a leading dimension below the columns";
        break;
    case FSDP_K_GROUP_COPY:
        bad = fsdp_kb_group_copy_check(k);
        break;
    case FSDP_K_CAST:
        if (!dtype_ok(k->u.cast.dst_dtype) || !dtype_ok(k->u.cast.src_dtype))
            bad = "dtype";
        else if (k->u.cast.n > 0 && (k->u.cast.dst == NULL || k->u.cast.src == NULL))
            bad = "dst or src is NULL";
        break;
    case FSDP_K_SCALE:
    case FSDP_K_DIV:
        if (!dtype_ok(k->u.scale.dtype))
            bad = "dtype";
        else if (k->u.scale.n > 0 && k->u.scale.x == NULL)
            bad = "x is NULL";
        break;
    case FSDP_K_AXPY:
        if (!dtype_ok(k->u.axpy.y_dtype) || !dtype_ok(k->u.axpy.x_dtype))
            bad = "dtype";
        else if (k->u.axpy.n > 0 && (k->u.axpy.y == NULL || k->u.axpy.x == NULL))
            bad = "y or x is NULL";
        break;
    case FSDP_K_GEMM: {
        const size_t m = k->u.gemm.m, n = k->u.gemm.n, kk = k->u.gemm.k;
        if (!float_ok(k->u.gemm.a_dtype) || k->u.gemm.b_dtype != k->u.gemm.a_dtype ||
            (k->u.gemm.c_dtype != k->u.gemm.a_dtype && k->u.gemm.c_dtype != FSDP_DTYPE_F32))
            bad = "dtypes (A and B one of f32, bf16, f16; C that dtype or f32)";
        else if (m > INT_MAX || n > INT_MAX || kk > INT_MAX || k->u.gemm.lda > INT_MAX ||
                 k->u.gemm.ldb > INT_MAX || k->u.gemm.ldc > INT_MAX)
            bad = "a dimension or leading dimension exceeds INT_MAX (cuBLAS)";
        else if (k->u.gemm.batch > INT_MAX || k->u.gemm.stride_a > LLONG_MAX ||
                 k->u.gemm.stride_b > LLONG_MAX || k->u.gemm.stride_c > LLONG_MAX)
            bad = "a batch count above INT_MAX or a stride above LLONG_MAX (cuBLAS)";
        else if (k->u.gemm.lda < (k->u.gemm.trans_a ? m : kk) ||
                 k->u.gemm.ldb < (k->u.gemm.trans_b ? kk : n) || k->u.gemm.ldc < n)
            bad = "leading dimension too small (lda >= K or M, ldb >= N or K, ldc >= N)";
        else if (m > 0 && n > 0 &&
                 (k->u.gemm.c == NULL || (kk > 0 && k->u.gemm.alpha != 0.0f &&
                                          (k->u.gemm.a == NULL || k->u.gemm.b == NULL))))
            bad = "a, b or c is NULL";
        else if (fsdp_kb_gemm_has_epilogue(k) && k->u.gemm.batch > 1)
            bad = "an epilogue on a batch of products (needs one)";
        else if (k->u.gemm.epilogue.bias != NULL && !float_ok(k->u.gemm.epilogue.bias_dtype))
            bad = "epilogue bias dtype (f32, bf16 or f16)";
        else if (k->u.gemm.epilogue.act != FSDP_ACT_NONE &&
                 k->u.gemm.epilogue.act != FSDP_ACT_RELU &&
                 k->u.gemm.epilogue.act != FSDP_ACT_GELU_TANH)
            bad = "epilogue activation (none, relu or gelu_tanh)";
        else if (k->u.gemm.epilogue.accumulate != 0 && k->u.gemm.epilogue.accumulate != 1)
            bad = "epilogue accumulate (0 or 1)";
        else if (k->u.gemm.epilogue.accumulate && (k->u.gemm.beta != 1.0f || k->u.gemm.batch > 1))
            bad = "an accumulating epilogue needs beta 1 and batch 0 or 1";
        break;
    }
    case FSDP_K_BIAS_ADD:
        if (!float_ok(k->u.bias_add.y_dtype) || !float_ok(k->u.bias_add.bias_dtype))
            bad = "dtype (f32, bf16 or f16)";
        else if (k->u.bias_add.rows > 0 && k->u.bias_add.cols > 0 &&
                 (k->u.bias_add.y == NULL || k->u.bias_add.bias == NULL))
            bad = "y or bias is NULL";
        break;
    case FSDP_K_BIAS_GRAD:
        if (!float_ok(k->u.bias_grad.dbias_dtype) || !float_ok(k->u.bias_grad.dy_dtype))
            bad = "dtype (f32, bf16 or f16)";
        else if (k->u.bias_grad.cols > 0 &&
                 (k->u.bias_grad.dbias == NULL ||
                  (k->u.bias_grad.rows > 0 && k->u.bias_grad.dy == NULL)))
            bad = "dbias or dy is NULL";
        break;
    case FSDP_K_RELU_FWD:
        if (!float_ok(k->u.relu_fwd.y_dtype) || !float_ok(k->u.relu_fwd.x_dtype))
            bad = "dtype (f32, bf16 or f16)";
        else if (!in_place_ok(k->u.relu_fwd.y, k->u.relu_fwd.y_dtype, k->u.relu_fwd.x,
                              k->u.relu_fwd.x_dtype))
            bad = "y and x are one buffer with two dtypes";
        else if (k->u.relu_fwd.n > 0 && (k->u.relu_fwd.y == NULL || k->u.relu_fwd.x == NULL))
            bad = "y or x is NULL";
        break;
    case FSDP_K_RELU_BWD:
        if (!float_ok(k->u.relu_bwd.dx_dtype) || !float_ok(k->u.relu_bwd.dy_dtype) ||
            !float_ok(k->u.relu_bwd.y_dtype))
            bad = "dtype (f32, bf16 or f16)";
        else if (!in_place_ok(k->u.relu_bwd.dx, k->u.relu_bwd.dx_dtype, k->u.relu_bwd.dy,
                              k->u.relu_bwd.dy_dtype))
            bad = "dx and dy are one buffer with two dtypes";
        else if (k->u.relu_bwd.n > 0 &&
                 (k->u.relu_bwd.dx == NULL || k->u.relu_bwd.dy == NULL || k->u.relu_bwd.y == NULL))
            bad = "dx, dy or y is NULL";
        break;
    case FSDP_K_MSE_LOSS:
        if (!float_ok(k->u.mse.y_dtype) || !float_ok(k->u.mse.t_dtype) ||
            (k->u.mse.dy != NULL && !float_ok(k->u.mse.dy_dtype)))
            bad = "dtype (f32, bf16 or f16)";
        else if (!in_place_ok(k->u.mse.dy, k->u.mse.dy_dtype, k->u.mse.y, k->u.mse.y_dtype))
            bad = "dy and y are one buffer with two dtypes";
        else if (k->u.mse.loss == NULL ||
                 (k->u.mse.n > 0 && (k->u.mse.y == NULL || k->u.mse.t == NULL)))
            bad = "loss, y or t is NULL";
        else if (!(k->u.mse.denom != 0.0))
            bad = "denom is 0";
        break;
    case FSDP_K_ADAMW:
        if (k->u.adamw.step < 1)
            bad = "step < 1 (steps count from 1)";
        else if (k->u.adamw.n > 0 && (k->u.adamw.param == NULL || k->u.adamw.grad == NULL ||
                                      k->u.adamw.exp_avg == NULL || k->u.adamw.exp_avg_sq == NULL))
            bad = "param, grad, exp_avg or exp_avg_sq is NULL";
        break;
    case FSDP_K_SGD:
        if (k->u.sgd.n > 0 && (k->u.sgd.param == NULL || k->u.sgd.grad == NULL ||
                               (k->u.sgd.momentum != 0.0f && k->u.sgd.momentum_buf == NULL)))
            bad = "param, grad or momentum_buf is NULL";
        break;
    case FSDP_K_SUMSQ:
        if (!dtype_ok(k->u.sumsq.dtype))
            bad = "dtype";
        else if (k->u.sumsq.out == NULL || (k->u.sumsq.n > 0 && k->u.sumsq.x == NULL))
            bad = "out or x is NULL";
        break;
    default:
        if (k->kind >= FSDP_K_LAYERNORM_FWD && k->kind <= FSDP_K_ADD) {
            bad = check_nn(k);
            break;
        }
        if (fsdp_kb_llama_kind(k->kind)) {
            bad = fsdp_kb_llama_check(k);
            break;
        }
        fsdp_error("rank %d: kernel: unknown kind %d", dev->rank, (int)k->kind);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (bad != NULL) {
        fsdp_error("rank %d: kernel %s: %s", dev->rank, fsdp_kernel_name(k->kind), bad);
        return FSDP_ERR_INVALID_PARAM;
    }
    return FSDP_OK;
}

static cudaDataType_t cuda_dtype(fsdp_dtype_t dtype)
{
    switch (dtype) {
    case FSDP_DTYPE_BF16:
        return CUDA_R_16BF;
    case FSDP_DTYPE_F16:
        return CUDA_R_16F;
    default:
        return CUDA_R_32F;
    }
}

fsdp_status_t fsdp_gpu_stream_cublas(fsdp_gpu_stream_t *s, cublasHandle_t *handle_p)
{
    cublasHandle_t h = NULL;
    fsdp_status_t status;

    if (s->cublas == NULL) {
        status = FSDP_CUBLAS_CALL(cublasCreate(&h));
        if (status != FSDP_OK)
            return status;
        /* A 16-bit C is rounded once (kernel.h): split-K partial sums stay f32, never the
         * output dtype. No effect on f32 GEMMs (no TF32 either). */
        status = FSDP_CUBLAS_CALL(cublasSetMathMode(
            h, CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
        if (status == FSDP_OK)
            status = FSDP_CUBLAS_CALL(cublasSetStream(h, s->cu));
        if (status != FSDP_OK) {
            (void)FSDP_CUBLAS_CALL(cublasDestroy(h));
            return status;
        }
        s->cublas = h;
    }
    *handle_p = s->cublas;
    return FSDP_OK;
}

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS sees each row-major
 * matrix as its transpose, so B comes first, and the dimensions swap (N, M, K). f32 operands
 * take cublasSgemm; 16-bit ones cublasGemmEx with f32 compute (CUBLAS_COMPUTE_32F: products
 * and sums in f32, alpha and beta f32, C rounded once), PyTorch's bf16/f16 matmul. */
static fsdp_status_t gemm(fsdp_gpu_dev_t *gdev, fsdp_gpu_stream_t *s, const fsdp_kernel_t *k)
{
    const int m = (int)k->u.gemm.m, n = (int)k->u.gemm.n, kk = (int)k->u.gemm.k;
    /* cuBLAS wants ld >= 1 even for an empty operand. */
    const int lda = k->u.gemm.lda > 0 ? (int)k->u.gemm.lda : 1;
    const int ldb = k->u.gemm.ldb > 0 ? (int)k->u.gemm.ldb : 1;
    const int ldc = k->u.gemm.ldc > 0 ? (int)k->u.gemm.ldc : 1;
    const cublasOperation_t op_a = k->u.gemm.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = k->u.gemm.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const size_t batch = k->u.gemm.batch > 1 ? k->u.gemm.batch : 1; /* kernel.h: 0 is 1 */
    cublasHandle_t handle;
    fsdp_status_t status;

    if (m == 0 || n == 0)
        return FSDP_OK;
    /* K == 0 or alpha == 0: C = beta * C, reading neither A nor B (which may then be NULL), as
     * BLAS and the sim; not left to cuBLAS, whose quick returns are not documented. */
    if (kk == 0 || k->u.gemm.alpha == 0.0f) {
        status = FSDP_OK;
        for (size_t i = 0; i < batch && status == FSDP_OK; i++)
            status = fsdp_gpu_scale_matrix(
                s, (char *)k->u.gemm.c + i * k->u.gemm.stride_c * fsdp_dtype_size(k->u.gemm.c_dtype),
                k->u.gemm.c_dtype, k->u.gemm.m, k->u.gemm.n, k->u.gemm.ldc, k->u.gemm.beta);
        return status;
    }
    status = fsdp_gpu_stream_cublas(s, &handle);
    if (status != FSDP_OK)
        return status;
    /* beta == 0: cuBLAS does not read C (NaN included), as kernel.h asks. */
    if (batch > 1) /* cuBLAS's operand A is our B: the strides swap with the operands */
        return FSDP_CUBLAS_CALL(cublasGemmStridedBatchedEx(
            handle, op_b, op_a, n, m, kk, &k->u.gemm.alpha, k->u.gemm.b,
            cuda_dtype(k->u.gemm.b_dtype), ldb, (long long)k->u.gemm.stride_b, k->u.gemm.a,
            cuda_dtype(k->u.gemm.a_dtype), lda, (long long)k->u.gemm.stride_a, &k->u.gemm.beta,
            k->u.gemm.c, cuda_dtype(k->u.gemm.c_dtype), ldc, (long long)k->u.gemm.stride_c,
            (int)batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (k->u.gemm.a_dtype == FSDP_DTYPE_F32 && k->u.gemm.c_dtype == FSDP_DTYPE_F32)
        return FSDP_CUBLAS_CALL(cublasSgemm(handle, op_b, op_a, n, m, kk, &k->u.gemm.alpha,
                                            k->u.gemm.b, ldb, k->u.gemm.a, lda, &k->u.gemm.beta,
                                            k->u.gemm.c, ldc));
    return FSDP_CUBLAS_CALL(cublasGemmEx(
        handle, op_b, op_a, n, m, kk, &k->u.gemm.alpha, k->u.gemm.b, cuda_dtype(k->u.gemm.b_dtype),
        ldb, k->u.gemm.a, cuda_dtype(k->u.gemm.a_dtype), lda, &k->u.gemm.beta, k->u.gemm.c,
        cuda_dtype(k->u.gemm.c_dtype), ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

/* gemm_epilogue for one matrix. */
static fsdp_status_t gemm_epilogue_one(fsdp_gpu_dev_t *gdev, fsdp_gpu_stream_t *s,
                                       const fsdp_kernel_t *k)
{
    const size_t m = k->u.gemm.m, n = k->u.gemm.n;
    fsdp_kernel_t d = *k;
    float *w = NULL;
    fsdp_status_t status;

    if (m == 0 || n == 0)
        return FSDP_OK;
    if (k->u.gemm.c_dtype == FSDP_DTYPE_F32) {
        status = gemm(gdev, s, k);
        return status != FSDP_OK
                   ? status
                   : fsdp_gpu_gemm_epilogue(s, k, (const float *)k->u.gemm.c, k->u.gemm.ldc);
    }
    status = FSDP_CUDA_CALL(cudaMallocAsync((void **)&w, m * n * sizeof(float), s->cu));
    if (status != FSDP_OK)
        return status;
    if (fsdp_kb_gemm_accumulates(&k->u.gemm.epilogue, k->u.gemm.c_dtype))
        d.u.gemm.beta = 0.0f; /* the epilogue adds C after rounding the product */
    if (d.u.gemm.beta != 0.0f)
        status = fsdp_gpu_widen_matrix(s, w, k->u.gemm.c, k->u.gemm.c_dtype, m, n, k->u.gemm.ldc);
    d.u.gemm.c = w;
    d.u.gemm.c_dtype = FSDP_DTYPE_F32;
    d.u.gemm.ldc = n;
    if (status == FSDP_OK)
        status = gemm(gdev, s, &d);
    if (status == FSDP_OK)
        status = fsdp_gpu_gemm_epilogue(s, k, w, n);
    if (status == FSDP_OK)
        status = FSDP_CUDA_CALL(cudaFreeAsync(w, s->cu));
    else
        (void)cudaFreeAsync(w, s->cu);
    return status;
}

/* Must the GEMM k go through gemm_epilogue's f32 workspace? With an epilogue, yes; and with a
 * 16-bit C that beta reads, too: kernel.h promises C one rounding, and cuBLAS was seen to give
 * such a C more (an H200, cuBLAS 13.1, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION set:
 * 6% of a 64 x 96 x 1000 bf16 product with beta = 1 off by about an ulp, test_gpu's gemm). */
static int gemm_via_f32(const fsdp_kernel_t *k)
{
    return fsdp_kb_gemm_has_epilogue(k) ||
           (k->u.gemm.c_dtype != FSDP_DTYPE_F32 && k->u.gemm.beta != 0.0f && k->u.gemm.k > 0 &&
            k->u.gemm.alpha != 0.0f);
}

/* A GEMM with an epilogue, or a 16-bit C that beta reads: the product in f32 (C itself when C
 * is f32, else a workspace on the stream, holding C's old values when beta reads them and the
 * epilogue does not accumulate them itself), then the epilogue's shared body over it, which
 * rounds where the sim rounds: given the same f32 product, the same bits. Without an epilogue
 * that body only rounds, once. A batch (no epilogue: check()) goes one matrix at a time. */
static fsdp_status_t gemm_epilogue(fsdp_gpu_dev_t *gdev, fsdp_gpu_stream_t *s,
                                   const fsdp_kernel_t *k)
{
    const size_t batch = k->u.gemm.batch > 1 ? k->u.gemm.batch : 1; /* kernel.h: 0 is 1 */
    if (batch > 1) {
        fsdp_status_t status = FSDP_OK;
        for (size_t i = 0; i < batch && status == FSDP_OK; i++) {
            fsdp_kernel_t one = *k;
            one.u.gemm.batch = 1;
            one.u.gemm.a = (const char *)k->u.gemm.a +
                           i * k->u.gemm.stride_a * fsdp_dtype_size(k->u.gemm.a_dtype);
            one.u.gemm.b = (const char *)k->u.gemm.b +
                           i * k->u.gemm.stride_b * fsdp_dtype_size(k->u.gemm.b_dtype);
            one.u.gemm.c =
                (char *)k->u.gemm.c + i * k->u.gemm.stride_c * fsdp_dtype_size(k->u.gemm.c_dtype);
            status = gemm_epilogue(gdev, s, &one);
        }
        return status;
    }
    return gemm_epilogue_one(gdev, s, k);
}

fsdp_status_t fsdp_gpu_load_gemms(fsdp_gpu_dev_t *gdev)
{
    /* A and B's dtype, C's: each pair gemm() may pass to cuBLAS */
    static const fsdp_dtype_t pairs[][2] = {
        {FSDP_DTYPE_F32, FSDP_DTYPE_F32},  {FSDP_DTYPE_BF16, FSDP_DTYPE_BF16},
        {FSDP_DTYPE_BF16, FSDP_DTYPE_F32}, {FSDP_DTYPE_F16, FSDP_DTYPE_F16},
        {FSDP_DTYPE_F16, FSDP_DTYPE_F32},
    };
    const size_t dim = 16, elems = 2 * dim * dim; /* a batch of two 16x16 matrices */
    fsdp_status_t status;
    char *buf = NULL;

    status = FSDP_CUDA_CALL(cudaMalloc((void **)&buf, 3 * elems * sizeof(float)));
    if (status != FSDP_OK)
        return status;
    status = FSDP_CUDA_CALL(cudaMemsetAsync(buf, 0, 3 * elems * sizeof(float), gdev->compute.cu));
    for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]) && status == FSDP_OK; i++) {
        for (size_t batch = 1; batch <= 2 && status == FSDP_OK; batch++) {
            fsdp_kernel_t k = {.kind = FSDP_K_GEMM};
            k.u.gemm.m = k.u.gemm.n = k.u.gemm.k = dim;
            k.u.gemm.lda = k.u.gemm.ldb = k.u.gemm.ldc = dim;
            k.u.gemm.alpha = 1.0f;
            k.u.gemm.a = buf;
            k.u.gemm.b = buf + elems * sizeof(float);
            k.u.gemm.c = buf + 2 * elems * sizeof(float);
            k.u.gemm.a_dtype = k.u.gemm.b_dtype = pairs[i][0];
            k.u.gemm.c_dtype = pairs[i][1];
            k.u.gemm.batch = batch;
            k.u.gemm.stride_a = k.u.gemm.stride_b = k.u.gemm.stride_c = dim * dim;
            status = gemm(gdev, &gdev->compute, &k);
        }
    }
    if (status == FSDP_OK)
        status = FSDP_CUDA_CALL(cudaStreamSynchronize(gdev->compute.cu));
    (void)FSDP_CUDA_CALL(cudaFree(buf));
    return status;
}

fsdp_status_t fsdp_gpu_kernel(fsdp_dev_t *dev, fsdp_stream_t *stream, const fsdp_kernel_t *k)
{
    fsdp_gpu_dev_t *gdev = fsdp_gpu_dev_of(dev);
    fsdp_gpu_stream_t *s = fsdp_gpu_stream_of(gdev, stream);
    fsdp_trace_op_t op = {.stream = s->super.name};
    fsdp_gpu_timer_t *timer;
    fsdp_status_t status;

    if (k == NULL) {
        fsdp_error("rank %d: kernel: descriptor is NULL", dev->rank);
        return FSDP_ERR_INVALID_PARAM;
    }
    status = check(dev, k);
    if (status != FSDP_OK)
        return status;
    status = FSDP_CUDA_CALL(cudaSetDevice(gdev->device));
    if (status != FSDP_OK)
        return status;
    op.host = op.start = op.end = fsdp_gpu_now();
    timer = fsdp_gpu_trace_begin(gdev, s->cu, 0);
    if (k->kind != FSDP_K_GEMM)
        status = fsdp_gpu_launch(s, k);
    else
        status = gemm_via_f32(k) ? gemm_epilogue(gdev, s, k) : gemm(gdev, s, k);
    if (status != FSDP_OK) {
        fsdp_gpu_trace_cancel(timer);
        return status;
    }
    if (fsdp_trace_enabled(dev)) {
        fsdp_trace_kernel_fields(k, &op);
        fsdp_gpu_trace_end(gdev, timer, s->cu, &op);
    }
    return FSDP_OK;
}
