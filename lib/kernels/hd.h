/* Kernel bodies are written once and compiled twice: as host C for the sim backend and as
 * CUDA device code for the gpu backend. FSDP_HD marks such a body. */
#ifndef FSDP_KERNELS_HD_H
#define FSDP_KERNELS_HD_H

#ifdef __CUDACC__
#define FSDP_HD static __host__ __device__ __forceinline__
#else
#define FSDP_HD static inline
#endif

#endif
