/* The gpu backend's launches of the Llama kernels: a grid per pass over the shared bodies of
 * lib/kernels/llama_bodies.h, a thread per index, the passes in order on the stream. Nothing here
 * computes a formula of its own; the bodies are the ones the sim loops over. */
#include "config.h"

/* The bodies before the toolkit's headers (see kernels.cu). */
#include "kernels/llama_bodies.h"

#include "gpu.h"

#include <stdio.h>

namespace {

/* A grid for n indices; a grid-stride loop covers what does not fit. */
unsigned llama_grid(size_t n)
{
    const size_t max_blocks = 65536;
    size_t blocks = (n + FSDP_GPU_THREADS - 1) / FSDP_GPU_THREADS;
    return (unsigned)(blocks < max_blocks ? blocks : max_blocks);
}

template <int Kind>
__global__ void __launch_bounds__(FSDP_GPU_THREADS)
    llama_pass_kernel(const fsdp_kernel_t k, int pass, size_t n)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        fsdp_kb_llama_at((fsdp_kernel_kind_t)Kind, &k, pass, i);
}

template <int Kind> fsdp_status_t launch_passes(fsdp_gpu_stream_t *stream, const fsdp_kernel_t *k)
{
    for (int pass = 0; pass < fsdp_kb_llama_passes(k); pass++) {
        const size_t n = fsdp_kb_llama_count(k, pass);
        char call[80];
        fsdp_status_t status;

        if (n == 0)
            continue;
        llama_pass_kernel<Kind><<<llama_grid(n), FSDP_GPU_THREADS, 0, stream->cu>>>(*k, pass, n);
        snprintf(call, sizeof(call), "launch of llama_pass_kernel (%s, pass %d)",
                 fsdp_kernel_name(k->kind), pass);
        status = fsdp_gpu_cuda_status(cudaGetLastError(), call, __FILE__, __LINE__, __func__);
        if (status != FSDP_OK)
            return status;
    }
    return FSDP_OK;
}

} // namespace

extern "C" fsdp_status_t fsdp_gpu_launch_llama(fsdp_gpu_stream_t *stream, const fsdp_kernel_t *k)
{
    switch (k->kind) {
    case FSDP_K_RMSNORM_FWD:
        return launch_passes<FSDP_K_RMSNORM_FWD>(stream, k);
    case FSDP_K_RMSNORM_BWD:
        return launch_passes<FSDP_K_RMSNORM_BWD>(stream, k);
    case FSDP_K_ROPE_FWD:
        return launch_passes<FSDP_K_ROPE_FWD>(stream, k);
    case FSDP_K_ROPE_BWD:
        return launch_passes<FSDP_K_ROPE_BWD>(stream, k);
    case FSDP_K_SWIGLU_FWD:
        return launch_passes<FSDP_K_SWIGLU_FWD>(stream, k);
    case FSDP_K_SWIGLU_BWD:
        return launch_passes<FSDP_K_SWIGLU_BWD>(stream, k);
    case FSDP_K_ATTENTION_FWD:
        return launch_passes<FSDP_K_ATTENTION_FWD>(stream, k);
    case FSDP_K_ATTENTION_BWD:
        return launch_passes<FSDP_K_ATTENTION_BWD>(stream, k);
    default:
        fsdp_error("kernel %s: no CUDA launcher", fsdp_kernel_name(k->kind));
        return FSDP_ERR_UNSUPPORTED;
    }
}
