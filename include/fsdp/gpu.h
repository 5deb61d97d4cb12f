/* libfsdp: the gpu backend (CUDA streams, events and memory; NCCL collectives).
 *
 * Always declared; when the library was built without CUDA and NCCL, fsdp_gpu_init returns
 * FSDP_ERR_UNSUPPORTED and fsdp_gpu_device_count returns 0.
 */
#ifndef FSDP_GPU_H
#define FSDP_GPU_H

#include <fsdp/backend.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when this library was built with the gpu backend. */
int fsdp_gpu_built(void);
/* Number of CUDA devices visible to this process (0 without a driver or device). */
int fsdp_gpu_device_count(void);
/* The gpu ops table (every slot returns FSDP_ERR_UNSUPPORTED when not built). */
const fsdp_backend_ops_t *fsdp_gpu_backend(void);

#ifdef __cplusplus
}
#endif
#endif
