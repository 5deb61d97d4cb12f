/* The gpu backend's launches of the Llama kernels: a grid per pass over the shared bodies of
 * lib/kernels/llama_bodies.h, the passes in order on the stream. A pass of elements runs a thread
 * per index, a pass of rows a warp per row (the lanes of lanes.h), a pass of column blocks a
 * 32 x 32 block per 32 columns; grid-stride loops cover what one grid does not. Nothing here
 * computes a formula of its own; the bodies are the ones the sim runs, lane by lane. */
#include "config.h"

/* The bodies before the toolkit's headers (see kernels.cu). */
#include "kernels/llama_bodies.h"

#include "gpu.h"

#include <stdio.h>

namespace {

/* Warps per block of a pass of rows. */
constexpr unsigned ROW_WARPS = FSDP_GPU_THREADS / FSDP_KB_LANES;

/* A grid of at most 65536 blocks for n indices, per blocks of `per_block` indices. */
unsigned llama_grid(size_t n, size_t per_block)
{
    const size_t max_blocks = 65536;
    size_t blocks = (n + per_block - 1) / per_block;
    return (unsigned)(blocks < max_blocks ? blocks : max_blocks);
}

/* A kernel per (kind, pass): the pass a constant, so that each kernel holds one body. */
template <int Kind, int Pass>
__global__ void __launch_bounds__(FSDP_GPU_THREADS)
    llama_elem_kernel(const fsdp_kernel_t k, size_t n)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        fsdp_kb_llama_at((fsdp_kernel_kind_t)Kind, &k, Pass, i);
}

/* A warp per row: every lane of a warp takes the same rows, so its shuffles are full. */
template <int Kind, int Pass>
__global__ void __launch_bounds__(FSDP_GPU_THREADS)
    llama_row_kernel(const fsdp_kernel_t k, size_t n)
{
    const unsigned lane = threadIdx.x % FSDP_KB_LANES;
    const size_t stride = (size_t)gridDim.x * ROW_WARPS;
    for (size_t r = (size_t)blockIdx.x * ROW_WARPS + threadIdx.x / FSDP_KB_LANES; r < n;
         r += stride)
        fsdp_kb_llama_row((fsdp_kernel_kind_t)Kind, &k, Pass, r, lane);
}

/* A block of FSDP_KB_LANES columns (threadIdx.x, coalesced) x FSDP_KB_ROW_LANES row lanes. */
template <int Kind, int Pass>
__global__ void __launch_bounds__(FSDP_KB_LANES * FSDP_KB_ROW_LANES)
    llama_cols_kernel(const fsdp_kernel_t k, size_t n)
{
    __shared__ float s[FSDP_KB_ROW_LANES][FSDP_KB_LANES + 1];
    for (size_t b = blockIdx.x; b < n; b += gridDim.x)
        fsdp_kb_llama_cols((fsdp_kernel_kind_t)Kind, &k, Pass, b, threadIdx.x, threadIdx.y, s);
}

/* Pass Pass of n indices in the shape Shape. */
template <int Kind, int Shape, int Pass>
fsdp_status_t launch_pass(cudaStream_t s, const fsdp_kernel_t *k, size_t n)
{
    const char *name;
    char call[96];

    if constexpr (Shape == FSDP_KB_BY_ROW) {
        llama_row_kernel<Kind, Pass><<<llama_grid(n, ROW_WARPS), FSDP_GPU_THREADS, 0, s>>>(*k, n);
        name = "llama_row_kernel";
    } else if constexpr (Shape == FSDP_KB_BY_COLS) {
        llama_cols_kernel<Kind, Pass>
            <<<llama_grid(n, 1), dim3(FSDP_KB_LANES, FSDP_KB_ROW_LANES), 0, s>>>(*k, n);
        name = "llama_cols_kernel";
    } else {
        llama_elem_kernel<Kind, Pass>
            <<<llama_grid(n, FSDP_GPU_THREADS), FSDP_GPU_THREADS, 0, s>>>(*k, n);
        name = "llama_elem_kernel";
    }
    snprintf(call, sizeof(call), "launch of %s (%s, pass %d)", name, fsdp_kernel_name(k->kind),
             Pass);
    return fsdp_gpu_cuda_status(cudaGetLastError(), call, __FILE__, __LINE__, __func__);
}

/* The passes of a kind, each in the shape fsdp_kb_llama_shape gives it, named here at compile
 * time so that a kind instantiates (and fsdp_gpu_load_llama_kernels loads) only the kernels it
 * launches, one per pass. */
template <int Kind, int S0, int S1 = -1, int S2 = -1>
fsdp_status_t launch_passes(fsdp_gpu_stream_t *stream, const fsdp_kernel_t *k)
{
    const int shapes[3] = {S0, S1, S2};

    for (int pass = 0; pass < fsdp_kb_llama_passes(k); pass++) {
        const size_t n = fsdp_kb_llama_count(k, pass);
        fsdp_status_t status = FSDP_OK;

        if (pass > 2 || shapes[pass] != fsdp_kb_llama_shape((fsdp_kernel_kind_t)Kind, pass)) {
            fsdp_error("kernel %s: pass %d has no launch of its shape", fsdp_kernel_name(k->kind),
                       pass);
            return FSDP_ERR_INTERNAL;
        }
        if (n == 0)
            continue;
        if (pass == 0)
            status = launch_pass<Kind, S0, 0>(stream->cu, k, n);
        else if constexpr (S1 >= 0) {
            if (pass == 1)
                status = launch_pass<Kind, S1, 1>(stream->cu, k, n);
            else if constexpr (S2 >= 0)
                status = launch_pass<Kind, S2, 2>(stream->cu, k, n);
        }
        if (status != FSDP_OK)
            return status;
    }
    return FSDP_OK;
}

/* Every kernel the launches above instantiate. */
const void *const llama_kernels[] = {
    (const void *)llama_row_kernel<FSDP_K_RMSNORM_FWD, 0>,
    (const void *)llama_cols_kernel<FSDP_K_RMSNORM_BWD, 0>,
    (const void *)llama_row_kernel<FSDP_K_RMSNORM_BWD, 1>,
    (const void *)llama_elem_kernel<FSDP_K_ROPE_FWD, 0>,
    (const void *)llama_elem_kernel<FSDP_K_ROPE_BWD, 0>,
    (const void *)llama_elem_kernel<FSDP_K_SWIGLU_FWD, 0>,
    (const void *)llama_elem_kernel<FSDP_K_SWIGLU_BWD, 0>,
    (const void *)llama_row_kernel<FSDP_K_ATTENTION_FWD, 0>,
    (const void *)llama_row_kernel<FSDP_K_ATTENTION_BWD, 0>,
    (const void *)llama_row_kernel<FSDP_K_ATTENTION_BWD, 1>,
    (const void *)llama_row_kernel<FSDP_K_ATTENTION_BWD, 2>,
};

/* A kind's passes in the shapes llama_bodies.h gives them. */
template <int Kind> fsdp_status_t launch_kind(fsdp_gpu_stream_t *stream, const fsdp_kernel_t *k)
{
    constexpr int np = FSDP_KB_LLAMA_PASSES(Kind);
    return launch_passes<Kind, FSDP_KB_LLAMA_SHAPE(Kind, 0),
                         (np > 1 ? FSDP_KB_LLAMA_SHAPE(Kind, 1) : -1),
                         (np > 2 ? FSDP_KB_LLAMA_SHAPE(Kind, 2) : -1)>(stream, k);
}

typedef fsdp_status_t (*launch_fn_t)(fsdp_gpu_stream_t *stream, const fsdp_kernel_t *k);

/* A launcher per kind of the exec class PASSES, generated from kernel.h's list. */
#define LLAMA_LAUNCH_PASSES(NAME) launch_kind<FSDP_K_##NAME>
#define LLAMA_LAUNCH_ELEMS(NAME) nullptr
#define LLAMA_LAUNCH_PARTS(NAME) nullptr
#define LLAMA_LAUNCH_GEMM(NAME) nullptr
#define LLAMA_LAUNCH_(NAME, name, member, dtypes, exec, cost, vec) LLAMA_LAUNCH_##exec(NAME),
const launch_fn_t llama_launchers[FSDP_K_COUNT] = {FSDP_FOREACH_KERNEL(LLAMA_LAUNCH_)};
#undef LLAMA_LAUNCH_

} // namespace

extern "C" fsdp_status_t fsdp_gpu_load_llama_kernels(void)
{
    cudaFuncAttributes attr;

    for (size_t i = 0; i < sizeof(llama_kernels) / sizeof(llama_kernels[0]); i++) {
        fsdp_status_t status = FSDP_CUDA_CALL(cudaFuncGetAttributes(&attr, llama_kernels[i]));
        if (status != FSDP_OK)
            return status;
    }
    return FSDP_OK;
}

extern "C" fsdp_status_t fsdp_gpu_launch_llama(fsdp_gpu_stream_t *stream, const fsdp_kernel_t *k)
{
    launch_fn_t launch = (unsigned)k->kind < FSDP_K_COUNT ? llama_launchers[k->kind] : nullptr;

    if (launch == nullptr) {
        fsdp_error("kernel %s: no CUDA launcher", fsdp_kernel_name(k->kind));
        return FSDP_ERR_UNSUPPORTED;
    }
    return launch(stream, k);
}
