/* Kernel launches the built-in models share. */
#ifndef FSDP_NN_NN_INT_H
#define FSDP_NN_NN_INT_H

#include <fsdp/backend.h>

/* Launches the GEMM descriptor k (its epilogue included) on stream s. With a 16-bit C the
 * epilogue is fused, so that each of its stages rounds once, where torch's op rounds
 * (kernel.h). With an f32 C, where no stage rounds, it runs as the separate launches it equals
 * bit for bit (gemm, then bias_add, relu_fwd or gelu_fwd, add), the kernels an f32 model has
 * always launched, so f32 traces and their costs compare across versions. */
fsdp_status_t fsdp_nn_gemm(fsdp_dev_t *dev, fsdp_stream_t *s, const fsdp_kernel_t *k);

#endif
