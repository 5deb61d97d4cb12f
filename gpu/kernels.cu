/* The gpu backend's CUDA kernels: grids over the shared bodies of lib/kernels/ (kernel_elem.h).
 * Nothing here computes a formula of its own; the bodies are the ones the sim loops over.
 *
 * Every launch is deterministic. Element-wise kernels write each element once. sumsq and
 * mse_loss sum along the fixed shape of fsdp_kb_reduce_shape (a function of n alone), which the
 * host replays bit for bit with fsdp_kb_reduce_sum. The other reductions take the shapes of
 * lanes.h: the column sums (bias_grad, layernorm_bwd's weight and bias gradients) a block of 32
 * columns x 32 row lanes, the row kernels of nn_bodies.h (layernorm, softmax, cross-entropy) a
 * warp per row, each lane its elements l, l + 32, ..., the partials meeting in the warp's
 * butterfly; the host replays both lane by lane (fsdp_kb_colsum_block, fsdp_kb_nn_row).
 * embedding_bwd runs a thread per (column, token bucket), each gradient element in row order as
 * the host's loop; cross_entropy's mean takes the tree of sumsq. */
#include "config.h"

/* The bodies before the toolkit's libraries: cuda_fp16.h (through cublas and nccl) declares a
 * global `half`, which a local of convert.h would shadow (-Wshadow) if it came first. */
#include "kernels/kernel_elem.h"
#include "kernels/llama_bodies.h"

#include "gpu.h"

#include <stdio.h>
#include <string.h>

namespace {

/* A grid for n independent elements; a grid-stride loop covers what does not fit. */
unsigned grid_for(size_t n)
{
    const size_t max_blocks = 65536;
    size_t blocks = (n + FSDP_GPU_THREADS - 1) / FSDP_GPU_THREADS;
    return (unsigned)(blocks < max_blocks ? blocks : max_blocks);
}

fsdp_status_t launched(const fsdp_kernel_t *k, const char *what)
{
    char call[64];
    snprintf(call, sizeof(call), "launch of %s (%s)", what, fsdp_kernel_name(k->kind));
    return fsdp_gpu_cuda_status(cudaGetLastError(), call, __FILE__, __LINE__, __func__);
}

template <int Kind>
__global__ void __launch_bounds__(FSDP_GPU_THREADS)
    elem_kernel(const fsdp_kernel_t k, const fsdp_kb_prep_t p)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += stride)
        fsdp_kb_elem((fsdp_kernel_kind_t)Kind, &k, &p, i);
}

template <int Kind>
fsdp_status_t launch_elem(cudaStream_t s, const fsdp_kernel_t *k, const fsdp_kb_prep_t *p)
{
    if (p->n == 0)
        return FSDP_OK;
    elem_kernel<Kind><<<grid_for(p->n), FSDP_GPU_THREADS, 0, s>>>(*k, *p);
    return launched(k, "elem_kernel");
}

/* Sums lane[0 .. FSDP_KB_RED_LANES) into lane[0] along the tree of fsdp_kb_reduce_tree. */
__device__ void block_tree(double *lane)
{
    __syncthreads();
    for (unsigned w = FSDP_KB_RED_LANES / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w)
            lane[threadIdx.x] += lane[threadIdx.x + w];
        __syncthreads();
    }
}

/* Pass 1, a block of FSDP_KB_RED_LANES threads per chunk: partial[b] = the chunk's sum. */
template <int Kind>
__global__ void __launch_bounds__(FSDP_KB_RED_LANES)
    reduce_pass1(const fsdp_kernel_t k, size_t n, size_t chunk, double *partial)
{
    __shared__ double lane[FSDP_KB_RED_LANES];
    const size_t begin = (size_t)blockIdx.x * chunk;
    const size_t end = n - begin < chunk ? n : begin + chunk;
    double acc = 0.0;

    for (size_t i = begin + threadIdx.x; i < end; i += FSDP_KB_RED_LANES)
        acc += Kind == FSDP_K_SUMSQ      ? fsdp_kb_sumsq_term(&k, i)
               : Kind == FSDP_K_MSE_LOSS ? fsdp_kb_mse_term(&k, i)
                                         : fsdp_kb_cross_entropy_term(&k, i);
    lane[threadIdx.x] = acc;
    block_tree(lane);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = lane[0];
}

/* Pass 2, one block: out[0] = (sum of the partials) / divisor, rounded once to f32. */
__global__ void __launch_bounds__(FSDP_KB_RED_LANES)
    reduce_pass2(const double *partial, size_t nparts, float *out, double divisor)
{
    __shared__ double lane[FSDP_KB_RED_LANES];
    double acc = 0.0;

    for (size_t i = threadIdx.x; i < nparts; i += FSDP_KB_RED_LANES)
        acc += partial[i];
    lane[threadIdx.x] = acc;
    block_tree(lane);
    if (threadIdx.x == 0)
        out[0] = (float)(lane[0] / divisor);
}

/* sumsq and mse_loss: the shape of fsdp_kb_reduce_shape, the stream's scratch for the
 * partials. */
template <int Kind>
fsdp_status_t launch_reduce(fsdp_gpu_stream_t *s, const fsdp_kernel_t *k, size_t n, float *out,
                            double divisor)
{
    fsdp_status_t status;
    size_t chunk = 0, blocks = 0;

    if (s->scratch == NULL) {
        status = FSDP_CUDA_CALL(
            cudaMalloc((void **)&s->scratch, FSDP_KB_RED_MAX_BLOCKS * sizeof(double)));
        if (status != FSDP_OK)
            return status;
    }
    fsdp_kb_reduce_shape(n, &chunk, &blocks);
    if (blocks > 0) {
        reduce_pass1<Kind>
            <<<(unsigned)blocks, FSDP_KB_RED_LANES, 0, s->cu>>>(*k, n, chunk, s->scratch);
        status = launched(k, "reduce_pass1");
        if (status != FSDP_OK)
            return status;
    }
    reduce_pass2<<<1, FSDP_KB_RED_LANES, 0, s->cu>>>(s->scratch, blocks, out, divisor);
    return launched(k, "reduce_pass2");
}

/* Column sums (bias_grad, layernorm_bwd's weight and bias gradients): a block of FSDP_KB_LANES
 * columns (threadIdx.x: coalesced loads) x FSDP_KB_ROW_LANES row lanes (threadIdx.y), the shape
 * that fsdp_kb_colsum_block replays on the host. */
#define FSDP_GPU_COLSUM_THREADS (FSDP_KB_LANES * FSDP_KB_ROW_LANES)

template <int Kind>
__global__ void __launch_bounds__(FSDP_GPU_COLSUM_THREADS)
    colsum_kernel(const fsdp_kernel_t k, size_t cols, size_t rows, size_t blocks)
{
    constexpr unsigned ns = FSDP_KB_COLSUM_N(Kind);
    __shared__ float s[ns][FSDP_KB_ROW_LANES][FSDP_KB_LANES + 1];
    float t[ns], acc[ns];

    for (size_t b = blockIdx.x; b < blocks; b += gridDim.x) {
        const size_t c = b * FSDP_KB_LANES + threadIdx.x;
        for (unsigned q = 0; q < ns; q++)
            acc[q] = 0.0f;
        for (size_t r = threadIdx.y; c < cols && r < rows; r += FSDP_KB_ROW_LANES) {
            fsdp_kb_colsum_terms((fsdp_kernel_kind_t)Kind, &k, r, c, t);
            for (unsigned q = 0; q < ns; q++)
                acc[q] = acc[q] + t[q];
        }
        for (unsigned q = 0; q < ns; q++) {
            s[q][threadIdx.y][threadIdx.x] = acc[q];
            fsdp_kb_block_col_tree(s[q]);
            acc[q] = s[q][0][threadIdx.x];
        }
        if (threadIdx.y == 0 && c < cols)
            fsdp_kb_colsum_store((fsdp_kernel_kind_t)Kind, &k, c, acc);
        __syncthreads(); /* s is reused by the next block of columns */
    }
}

template <int Kind> fsdp_status_t launch_colsum(cudaStream_t s, const fsdp_kernel_t *k)
{
    const size_t blocks = fsdp_kb_colsum_blocks(k);
    if (blocks == 0)
        return FSDP_OK;
    colsum_kernel<Kind>
        <<<(unsigned)(blocks < 65536 ? blocks : 65536), dim3(FSDP_KB_LANES, FSDP_KB_ROW_LANES),
           0, s>>>(*k, fsdp_kb_colsum_cols(k), fsdp_kb_colsum_rows(k), blocks);
    return launched(k, "colsum_kernel");
}

__global__ void __launch_bounds__(FSDP_GPU_THREADS)
    scale_matrix_kernel(void *c, fsdp_dtype_t dtype, size_t rows, size_t cols, size_t ldc,
                        float beta)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * cols; i += stride) {
        const size_t e = (i / cols) * ldc + i % cols;
        fsdp_kb_store(c, dtype, e, beta == 0.0f ? 0.0f : beta * fsdp_kb_load(c, dtype, e));
    }
}

__global__ void __launch_bounds__(FSDP_GPU_THREADS)
    gemm_epilogue_kernel(const fsdp_kernel_t k, const float *w, size_t ldw)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x, n = k.u.gemm.n;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < k.u.gemm.m * n;
         e += stride) {
        const size_t i = e / n, j = e - i * n;
        fsdp_kb_store(k.u.gemm.c, k.u.gemm.c_dtype, i * k.u.gemm.ldc + j,
                      fsdp_kb_gemm_epilogue(&k.u.gemm.epilogue, k.u.gemm.c_dtype, k.u.gemm.c,
                                            k.u.gemm.ldc, w[i * ldw + j], i, j));
    }
}

__global__ void __launch_bounds__(FSDP_GPU_THREADS)
    widen_matrix_kernel(float *w, const void *c, fsdp_dtype_t dtype, size_t m, size_t n, size_t ldc)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < m * n; e += stride)
        w[e] = fsdp_kb_load(c, dtype, (e / n) * ldc + e % n);
}
} // namespace

extern "C" fsdp_status_t fsdp_gpu_gemm_epilogue(fsdp_gpu_stream_t *stream, const fsdp_kernel_t *k,
                                                const float *w, size_t ldw)
{
    if (k->u.gemm.m == 0 || k->u.gemm.n == 0)
        return FSDP_OK;
    gemm_epilogue_kernel<<<grid_for(k->u.gemm.m * k->u.gemm.n), FSDP_GPU_THREADS, 0, stream->cu>>>(
        *k, w, ldw);
    return launched(k, "gemm_epilogue_kernel");
}

extern "C" fsdp_status_t fsdp_gpu_widen_matrix(fsdp_gpu_stream_t *stream, float *w, const void *c,
                                               fsdp_dtype_t dtype, size_t m, size_t n, size_t ldc)
{
    if (m == 0 || n == 0)
        return FSDP_OK;
    widen_matrix_kernel<<<grid_for(m * n), FSDP_GPU_THREADS, 0, stream->cu>>>(w, c, dtype, m, n,
                                                                              ldc);
    return fsdp_gpu_cuda_status(cudaGetLastError(), "launch of widen_matrix_kernel (gemm)",
                                __FILE__, __LINE__, __func__);
}

extern "C" fsdp_status_t fsdp_gpu_scale_matrix(fsdp_gpu_stream_t *stream, void *c,
                                               fsdp_dtype_t dtype, size_t rows, size_t cols,
                                               size_t ldc, float beta)
{
    if (rows == 0 || cols == 0 || beta == 1.0f)
        return FSDP_OK;
    scale_matrix_kernel<<<grid_for(rows * cols), FSDP_GPU_THREADS, 0, stream->cu>>>(
        c, dtype, rows, cols, ldc, beta);
    return fsdp_gpu_cuda_status(cudaGetLastError(), "launch of scale_matrix_kernel (gemm)",
                                __FILE__, __LINE__, __func__);
}

/* The row kernels of lib/kernels/nn_bodies.h: a warp per row, FSDP_GPU_ROW_WARPS rows a block
 * and a grid-stride loop over the rows. Each reduction pass's lane partials meet in the warp's
 * butterfly (lanes.h), as fsdp_kb_nn_row replays it on the host. */
#define FSDP_GPU_ROW_WARPS (FSDP_GPU_THREADS / FSDP_KB_LANES)

constexpr bool is_row_kind(int kind)
{
    return FSDP_KB_ROW_KIND(kind);
}

template <int Kind>
__global__ void __launch_bounds__(FSDP_GPU_THREADS)
    row_kernel(const fsdp_kernel_t k, size_t rows, float ce_scale)
{
    constexpr int np = FSDP_KB_ROW_REDUCTIONS(Kind);
    const unsigned lane = threadIdx.x % FSDP_KB_LANES;
    const size_t stride = (size_t)gridDim.x * FSDP_GPU_ROW_WARPS;

    /* r is the same in every lane of a warp: the shuffles see the full warp */
    for (size_t r = (size_t)blockIdx.x * FSDP_GPU_ROW_WARPS + threadIdx.x / FSDP_KB_LANES;
         r < rows; r += stride) {
        float st[FSDP_KB_ROW_STATE] = {0.0f, 0.0f, 0.0f};
        float v;
#pragma unroll
        for (int p = 0; p < np; p++) {
            v = fsdp_kb_nn_row_init((fsdp_kernel_kind_t)Kind, p);
            fsdp_kb_nn_row_pass((fsdp_kernel_kind_t)Kind, &k, ce_scale, r, lane, FSDP_KB_LANES, p,
                                st, &v);
            st[p] = FSDP_KB_ROW_MAX(Kind, p) ? fsdp_kb_warp_max(v) : fsdp_kb_warp_tree(v);
            fsdp_kb_nn_row_reduced((fsdp_kernel_kind_t)Kind, &k, p, st);
        }
        fsdp_kb_nn_row_pass((fsdp_kernel_kind_t)Kind, &k, ce_scale, r, lane, FSDP_KB_LANES, np, st,
                            &v);
    }
}

/* embedding_bwd: a thread per (column, token bucket) and per (column, position), each
 * destination element in row order (fsdp_kb_embedding_bwd_at). */
__global__ void __launch_bounds__(FSDP_GPU_THREADS)
    embedding_bwd_kernel(const fsdp_kernel_t k, size_t n)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        fsdp_kb_embedding_bwd_at(&k, i);
}

/* The parts of a kind of the exec classes ELEMS and PARTS (kernel.h), in the sim's order: the
 * column part (bias_grad, layernorm_bwd's weight gradients), the embedding's buckets, the row
 * part (they touch disjoint outputs), the reduction (after the rows, whose losses it sums, and
 * before the elements, which may overwrite its input: mse_loss's dy), then the element-wise
 * part. Each part a kind has not is left out at compile time. */
template <int Kind> fsdp_status_t launch_parts(fsdp_gpu_stream_t *stream, const fsdp_kernel_t *k)
{
    fsdp_kb_prep_t p;

    fsdp_kb_prepare(k, &p);
    if constexpr (Kind == FSDP_K_BIAS_GRAD || Kind == FSDP_K_LAYERNORM_BWD) {
        const fsdp_status_t status = launch_colsum<Kind>(stream->cu, k);
        if (status != FSDP_OK)
            return status;
    }
    if constexpr (Kind == FSDP_K_EMBEDDING_BWD) {
        const size_t n = fsdp_kb_embedding_bwd_threads(k);
        if (n > 0) {
            embedding_bwd_kernel<<<grid_for(n), FSDP_GPU_THREADS, 0, stream->cu>>>(*k, n);
            const fsdp_status_t status = launched(k, "embedding_bwd_kernel");
            if (status != FSDP_OK)
                return status;
        }
    }
    if constexpr (is_row_kind(Kind)) {
        const size_t rows = fsdp_kb_nn_rows(k);
        if (rows > 0) {
            const size_t blocks = (rows + FSDP_GPU_ROW_WARPS - 1) / FSDP_GPU_ROW_WARPS;
            row_kernel<Kind>
                <<<(unsigned)(blocks < 65536 ? blocks : 65536), FSDP_GPU_THREADS, 0, stream->cu>>>(
                    *k, rows, p.ce_scale);
            const fsdp_status_t status = launched(k, "row_kernel");
            if (status != FSDP_OK)
                return status;
        }
    }
    if constexpr (Kind == FSDP_K_SUMSQ || Kind == FSDP_K_MSE_LOSS || Kind == FSDP_K_CROSS_ENTROPY) {
        size_t n = 0;
        float *out = NULL;
        double divisor = 1.0;
        if (fsdp_kb_reduction(k, &n, &out, &divisor) != NULL) {
            const fsdp_status_t status = launch_reduce<Kind>(stream, k, n, out, divisor);
            if (status != FSDP_OK)
                return status;
        }
    }
    if constexpr (Kind != FSDP_K_SUMSQ && Kind != FSDP_K_BIAS_GRAD)
        return launch_elem<Kind>(stream->cu, k, &p);
    return FSDP_OK;
}

/* group_copy: the caller's table of parts is host memory, so each launch carries a slice of it
 * in its arguments, which CUDA copies at launch (nothing outlives the call); a group of more
 * parts than one launch holds is several launches, each over its parts' elements. 32 parts of
 * 80 bytes stay well inside the 4 KiB of kernel arguments every CUDA version takes. */
#define FSDP_GPU_COPY_PARTS 32

struct copy_slice {
    fsdp_copy_part_t parts[FSDP_GPU_COPY_PARTS];
    size_t nparts, begin, end; /* the launch's elements [begin, end) */
};

/* __grid_constant__: the body reads the table where the arguments are, with no copy a thread */
__global__ void __launch_bounds__(FSDP_GPU_THREADS)
    group_copy_kernel(const __grid_constant__ copy_slice t)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = t.begin + (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < t.end; i += stride)
        fsdp_kb_group_copy_at(t.parts, t.nparts, i);
}

template <>
fsdp_status_t launch_parts<FSDP_K_GROUP_COPY>(fsdp_gpu_stream_t *stream, const fsdp_kernel_t *k)
{
    const fsdp_copy_part_t *parts = k->u.group_copy.parts;
    const size_t nparts = k->u.group_copy.nparts;
    copy_slice t;

    for (size_t j = 0; j < nparts; j += FSDP_GPU_COPY_PARTS) {
        const fsdp_copy_part_t *last;
        t.nparts = nparts - j < FSDP_GPU_COPY_PARTS ? nparts - j : FSDP_GPU_COPY_PARTS;
        memcpy(t.parts, parts + j, t.nparts * sizeof(*parts));
        last = &t.parts[t.nparts - 1];
        t.begin = t.parts[0].first;
        t.end = last->first + last->rows * last->cols;
        if (t.end == t.begin)
            continue;
        group_copy_kernel<<<grid_for(t.end - t.begin), FSDP_GPU_THREADS, 0, stream->cu>>>(t);
        const fsdp_status_t status = launched(k, "group_copy_kernel");
        if (status != FSDP_OK)
            return status;
    }
    return FSDP_OK;
}

typedef fsdp_status_t (*launch_fn_t)(fsdp_gpu_stream_t *stream, const fsdp_kernel_t *k);

/* A launcher per kind, generated from kernel.h's list by its exec column: the parts above, the
 * Llama passes (kernels_llama.cu), or none (GEMM goes to cuBLAS: kernel.c). */
#define FSDP_GPU_LAUNCH_ELEMS(NAME) launch_parts<FSDP_K_##NAME>
#define FSDP_GPU_LAUNCH_PARTS(NAME) launch_parts<FSDP_K_##NAME>
#define FSDP_GPU_LAUNCH_PASSES(NAME) fsdp_gpu_launch_llama
#define FSDP_GPU_LAUNCH_GEMM(NAME) nullptr
#define FSDP_GPU_LAUNCH_(NAME, name, member, dtypes, exec, cost, vec) FSDP_GPU_LAUNCH_##exec(NAME),
const launch_fn_t launchers[FSDP_K_COUNT] = {FSDP_FOREACH_KERNEL(FSDP_GPU_LAUNCH_)};
#undef FSDP_GPU_LAUNCH_

/* Every kernel that the launchers above instantiate: those of launch_elem, launch_reduce and
 * launch_nn per kind, and the GEMM helpers. fsdp_gpu_load_kernels loads them all. */
namespace {
#define FSDP_GPU_NN(K) (const void *)elem_kernel<K>
#define FSDP_GPU_NN_ROWS(K) (const void *)elem_kernel<K>, (const void *)row_kernel<K>
const void *const all_kernels[] = {
    (const void *)elem_kernel<FSDP_K_FILL>,
    (const void *)elem_kernel<FSDP_K_CAST>,
    (const void *)elem_kernel<FSDP_K_CHUNK_COPY>,
    (const void *)group_copy_kernel,
    (const void *)elem_kernel<FSDP_K_SCALE>,
    (const void *)elem_kernel<FSDP_K_DIV>,
    (const void *)elem_kernel<FSDP_K_AXPY>,
    (const void *)elem_kernel<FSDP_K_BIAS_ADD>,
    (const void *)elem_kernel<FSDP_K_RELU_FWD>,
    (const void *)elem_kernel<FSDP_K_RELU_BWD>,
    (const void *)elem_kernel<FSDP_K_ADAMW>,
    (const void *)elem_kernel<FSDP_K_SGD>,
    (const void *)elem_kernel<FSDP_K_MSE_LOSS>,
    (const void *)reduce_pass1<FSDP_K_MSE_LOSS>,
    (const void *)reduce_pass1<FSDP_K_SUMSQ>,
    (const void *)reduce_pass1<FSDP_K_CROSS_ENTROPY>,
    (const void *)reduce_pass2,
    (const void *)colsum_kernel<FSDP_K_BIAS_GRAD>,
    (const void *)colsum_kernel<FSDP_K_LAYERNORM_BWD>,
    (const void *)scale_matrix_kernel,
    (const void *)gemm_epilogue_kernel,
    (const void *)widen_matrix_kernel,
    (const void *)embedding_bwd_kernel,
    FSDP_GPU_NN_ROWS(FSDP_K_LAYERNORM_FWD),
    FSDP_GPU_NN_ROWS(FSDP_K_LAYERNORM_BWD),
    FSDP_GPU_NN(FSDP_K_GELU_FWD),
    FSDP_GPU_NN(FSDP_K_GELU_BWD),
    FSDP_GPU_NN_ROWS(FSDP_K_SOFTMAX_FWD),
    FSDP_GPU_NN_ROWS(FSDP_K_SOFTMAX_BWD),
    FSDP_GPU_NN(FSDP_K_EMBEDDING_FWD),
    FSDP_GPU_NN(FSDP_K_EMBEDDING_BWD),
    FSDP_GPU_NN_ROWS(FSDP_K_CROSS_ENTROPY),
    FSDP_GPU_NN(FSDP_K_ADD),
};
#undef FSDP_GPU_NN
#undef FSDP_GPU_NN_ROWS
} // namespace

/* Under lazy module loading (CUDA's default since 12.2) a kernel's first launch loads its
 * module, waiting for the device's queue to drain while it holds the context lock: behind a
 * collective whose peer is dead it would block cudaLaunchKernel, out of the watchdog's reach
 * (and across nodes NCCL's proxy thread can deadlock on that lock). cudaFuncGetAttributes loads
 * a kernel without launching it: every one is loaded at init, on an idle device. */
extern "C" fsdp_status_t fsdp_gpu_load_kernels(void)
{
    cudaFuncAttributes attr;
    fsdp_status_t status;

    for (size_t i = 0; i < sizeof(all_kernels) / sizeof(all_kernels[0]); i++) {
        status = FSDP_CUDA_CALL(cudaFuncGetAttributes(&attr, all_kernels[i]));
        if (status != FSDP_OK)
            return status;
    }
    return FSDP_OK;
}

extern "C" fsdp_status_t fsdp_gpu_launch(fsdp_gpu_stream_t *stream, const fsdp_kernel_t *k)
{
    launch_fn_t launch = (unsigned)k->kind < FSDP_K_COUNT ? launchers[k->kind] : nullptr;

    if (launch == nullptr) {
        fsdp_error("kernel %s: no CUDA launcher", fsdp_kernel_name(k->kind));
        return FSDP_ERR_UNSUPPORTED;
    }
    return launch(stream, k);
}
