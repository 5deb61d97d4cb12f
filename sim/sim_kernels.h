/* The sim backend's host kernels (never installed).
 *
 * fsdp_sim_kernel_exec() runs any kernel descriptor of kernel.h on the calling thread, now,
 * by looping over the element and row bodies of lib/kernels/ (the very code the gpu backend
 * launches), so the sim's data mode and the GPU compute the same formulas. GEMM is the one
 * kernel with a host-specific body: a packed, cache-blocked routine (gemm.c).
 *
 * Every routine here is deterministic: the same inputs give the same bits on every run, and
 * reductions (bias_grad, mse_loss, sumsq, the GEMM's k sums) follow a fixed order that
 * depends only on the shapes. No routine starts threads: ranks are already threads. A rank
 * that has cores to spare (fsdp_sim_params_t.threads) has a pool of worker threads, started
 * once, and the _par routines split a GEMM or a large element-wise kernel across it by a
 * partition of the output that involves no sum across parts, so their results are the same
 * bits whatever the number of threads.
 */
#ifndef FSDP_SIM_SIM_KERNELS_H
#define FSDP_SIM_SIM_KERNELS_H

#include <fsdp/kernel.h>
#include <fsdp/sim.h> /* fsdp_sim_kernel_exec */
#include <fsdp/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- worker pools (pool.c) ---- */

typedef struct fsdp_sim_pool fsdp_sim_pool_t;
typedef void (*fsdp_sim_pool_fn_t)(void *arg, size_t part);

/* A pool of threads - 1 persistent workers (the caller is the other thread). NULL for
 * threads <= 1 or when nothing could be allocated: every routine takes NULL as "run on the
 * calling thread alone". */
fsdp_sim_pool_t *fsdp_sim_pool_create(int threads);
void fsdp_sim_pool_destroy(fsdp_sim_pool_t *pool);
/* The threads a job runs on, the caller's included (1 for NULL). */
int fsdp_sim_pool_threads(const fsdp_sim_pool_t *pool);
/* Calls fn(arg, part) once for each part < nparts, on the caller and the workers, and returns
 * when every call has returned. One job at a time: only the pool's owner calls it. */
void fsdp_sim_pool_run(fsdp_sim_pool_t *pool, size_t nparts, fsdp_sim_pool_fn_t fn, void *arg);

/* fsdp_sim_kernel_exec with the rank's pool (NULL: the calling thread alone): GEMMs, and
 * element-wise kernels of many elements, split across its threads; the same bits either way. */
fsdp_status_t fsdp_sim_kernel_exec_par(const fsdp_kernel_t *k, fsdp_sim_pool_t *pool);
/* 1 when k is large enough for fsdp_sim_kernel_exec_par to split it: a rank starts its workers
 * then (a descriptor's sizes only; it may still be invalid). */
int fsdp_sim_kernel_wants_pool(const fsdp_kernel_t *k);

/* 1 for the transformer kinds (layernorm .. add), which kernels_nn.c runs. */
int fsdp_sim_nn_kernel(fsdp_kernel_kind_t kind);
/* fsdp_sim_kernel_exec for those kinds: checks the descriptor, then loops over the bodies of
 * lib/kernels/nn_bodies.h. */
fsdp_status_t fsdp_sim_nn_kernel_exec(const fsdp_kernel_t *k);

/* 1 for the Llama kinds (rmsnorm .. attention), which kernels_llama.c runs. */
int fsdp_sim_llama_kernel(fsdp_kernel_kind_t kind);
/* fsdp_sim_kernel_exec for those kinds: the shared check, then the passes of
 * lib/kernels/llama_bodies.h. */
fsdp_status_t fsdp_sim_llama_kernel_exec(const fsdp_kernel_t *k);

/* C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C, f32, row-major, as the GEMM
 * descriptor of kernel.h: op(A) = A ([M,K], lda >= K) or A^T (A is [K,M], lda >= M), likewise
 * B with ldb; ldc >= N. beta == 0 ignores C's old contents (NaN included); alpha == 0 or
 * K == 0 reads neither A nor B (C = beta * C), as BLAS.
 *
 * For a given shape, every element of C is summed in the same fixed order (k ascending inside
 * blocks of FSDP_SIM_GEMM_KC, blocks ascending), whatever micro-kernel runs, so the AVX2 and
 * the generic paths give identical bits. Returns FSDP_ERR_INVALID_PARAM for bad arguments and
 * FSDP_ERR_NO_MEMORY when the packing buffers cannot be allocated. */
fsdp_status_t fsdp_sim_gemm(int trans_a, int trans_b, size_t m, size_t n, size_t k, float alpha,
                            const float *a, size_t lda, const float *b, size_t ldb, float beta,
                            float *c, size_t ldc);

/* The same with dtypes, as the GEMM descriptor of kernel.h: A and B share one of f32, bf16 and
 * f16, C is that dtype or f32. 16-bit operands are widened to f32 while they are packed, so the
 * micro-kernel and the summation order are those of the f32 routine; a 16-bit C is accumulated
 * in an f32 workspace (beta * C included) and rounded once at the end. epi (NULL: none) is the
 * descriptor's epilogue, applied to each f32 element before that rounding (an f32 C: in place
 * after the product). With every dtype f32 and no epilogue this is fsdp_sim_gemm, bit for bit. */
fsdp_status_t fsdp_sim_gemm_ex(int trans_a, int trans_b, size_t m, size_t n, size_t k, float alpha,
                               const void *a, fsdp_dtype_t a_dtype, size_t lda, const void *b,
                               fsdp_dtype_t b_dtype, size_t ldb, float beta, void *c,
                               fsdp_dtype_t c_dtype, size_t ldc, const fsdp_gemm_epilogue_t *epi);

/* fsdp_sim_gemm_ex on the threads of pool (NULL: the calling thread): the rows or the columns
 * of C split into blocks, each a whole product over all of k, so the result is the same bits. */
fsdp_status_t fsdp_sim_gemm_ex_par(fsdp_sim_pool_t *pool, int trans_a, int trans_b, size_t m,
                                   size_t n, size_t k, float alpha, const void *a,
                                   fsdp_dtype_t a_dtype, size_t lda, const void *b,
                                   fsdp_dtype_t b_dtype, size_t ldb, float beta, void *c,
                                   fsdp_dtype_t c_dtype, size_t ldc,
                                   const fsdp_gemm_epilogue_t *epi);

#define FSDP_SIM_GEMM_KC 256 /* depth of one packed block: fixes the summation order */

typedef enum {
    FSDP_SIM_GEMM_AUTO = 0,    /* the fastest this CPU supports (default) */
    FSDP_SIM_GEMM_GENERIC = 1, /* baseline vectors (SSE2 on x86-64), or scalar C */
    FSDP_SIM_GEMM_AVX2 = 2     /* 8-wide vectors, x86-64 with AVX2 (no FMA: same rounding) */
} fsdp_sim_gemm_isa_t;

/* Process-wide micro-kernel choice, for tests and benchmarks. Returns 0 when the CPU (or the
 * build) cannot run `isa`, leaving the choice unchanged. */
int fsdp_sim_gemm_set_isa(fsdp_sim_gemm_isa_t isa);
/* The micro-kernel the next call will run: "avx2", "generic" or "scalar". */
const char *fsdp_sim_gemm_isa_name(void);

typedef enum {
    FSDP_SIM_ELEM_AUTO = 0,   /* the widest this CPU supports (default) */
    FSDP_SIM_ELEM_SCALAR = 1, /* the scalar bodies, an element at a time */
    FSDP_SIM_ELEM_SSE2 = 2,   /* 4-wide vectors, x86-64's baseline */
    FSDP_SIM_ELEM_AVX2 = 3    /* 8-wide vectors, x86-64 with AVX2 (no FMA: same rounding) */
} fsdp_sim_elem_isa_t;

/* Process-wide choice of the element-wise loops (elem_vec.c), for tests and benchmarks: every
 * choice gives the same bytes. Returns 0 when the CPU (or the build) cannot run `isa`, leaving
 * the choice unchanged. */
int fsdp_sim_elem_set_isa(fsdp_sim_elem_isa_t isa);
/* The loops the next kernel will run: "avx2", "sse2" or "scalar". */
const char *fsdp_sim_elem_isa_name(void);

#ifdef __cplusplus
}
#endif
#endif
