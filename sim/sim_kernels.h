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
 * once, and the _par routines split a GEMM or any other large kernel across it by a
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

/* ---- a rank's packed GEMM operand (pack_cache.c) ---- */

/* The rank's copy of one GEMM operand B packed whole, kept while the launches that read it name
 * it unchanged (kernel.h's gemm b_version: the LM head's weight over the micro-batches of an
 * accumulated step). It is made by the second launch with the same B, when the B before it had
 * enough launches to pay for it, so that a B that changes every time (a step's new weights) is
 * never packed twice. Its bytes count against the world's host-memory bound, of which it takes
 * at most half. Only its rank's thread uses it. */
typedef struct fsdp_sim_pack_cache {
    size_t *held; /* the world's count of host bytes, and its bound (params.host_memory) */
    size_t limit;
    int off; /* 1: never packs (fsdp_sim_params_t.no_pack_cache) */
    /* only for products of at most this many rows (FSDP_SIM_PACK_CACHE_ROWS): with more, the
     * packing a product does as it goes is hidden behind its multiplies */
    size_t max_rows;
    /* packed only when the B before this one was launched at least this many times
     * (FSDP_SIM_PACK_CACHE_LAUNCHES): packing pays off from the third launch of a version on */
    uint64_t min_launches;
    /* the last launch that named its B: B and the version, shape and layout it had */
    const void *b;
    uint64_t version;
    int trans_b;
    size_t n, k, ldb;
    fsdp_dtype_t dtype;
    uint64_t launches, last_launches; /* of that B so far; of the B before it */
    float *packed; /* a buffer for op(B) packed, or NULL; kept for the next B of its size */
    size_t bytes;  /* packed's size, counted in *held */
    int valid;     /* packed holds that B */
    int filling;   /* a product is packing that B into packed */
    uint64_t hits, packs; /* launches that read packed; that filled it */
} fsdp_sim_pack_cache_t;

/* Measured in bench_gemm (GPT-2's LM head, 768 x 50257, one thread): reading wte packed saves
 * 12 ms a launch at 16 and 32 rows, 7 at 64, 4 at 128, none at 256; packing it into the kept
 * buffer costs a launch 13 to 19 ms more. So a version read by at least two launches after the
 * one that packs it gains at 64 rows and fewer; the launches of a step's version are foretold
 * by the last step's (the micro-batches of gradient accumulation). */
#define FSDP_SIM_PACK_CACHE_ROWS 64
#define FSDP_SIM_PACK_CACHE_LAUNCHES 4

/* The packed op(B) for the GEMM k: NULL when k names no version, or has more than max_rows rows,
 * or the B before had fewer than min_launches launches, or a B other than the last
 * launch's (then remembered), or when the bound leaves no room: the product packs B itself.
 * Else the buffer, to read (*fill_p 0), or for the product to pack B into as it goes (*fill_p
 * 1), after which fsdp_sim_pack_cache_done says whether it did. The same bits either way. */
float *fsdp_sim_pack_cache_get(fsdp_sim_pack_cache_t *c, const fsdp_kernel_t *k, int *fill_p);
void fsdp_sim_pack_cache_done(fsdp_sim_pack_cache_t *c, fsdp_status_t status);
/* Frees the buffer (its bytes leave *held) and forgets the key. */
void fsdp_sim_pack_cache_drop(fsdp_sim_pack_cache_t *c);

/* Host bytes counted against a bound shared by the ranks (SIZE_MAX: none): 1 when size more
 * keep *held within limit (then counted), else 0 (nothing counted); *before_p the count
 * before. */
static inline int fsdp_sim_host_reserve(size_t *held, size_t limit, size_t size,
                                        size_t *before_p)
{
    size_t now = __atomic_add_fetch(held, size, __ATOMIC_RELAXED);

    *before_p = now - size;
    if (now >= size && now <= limit)
        return 1;
    __atomic_sub_fetch(held, size, __ATOMIC_RELAXED);
    return 0;
}

static inline void fsdp_sim_host_release(size_t *held, size_t size)
{
    __atomic_sub_fetch(held, size, __ATOMIC_RELAXED);
}

/* fsdp_sim_kernel_exec with the rank's pool (NULL: the calling thread alone): GEMMs, and
 * element-wise kernels of many elements, split across its threads; the same bits either way.
 * A GEMM reads its B from cache when the cache has it packed (NULL: no cache). */
fsdp_status_t fsdp_sim_kernel_exec_par(const fsdp_kernel_t *k, fsdp_sim_pool_t *pool,
                                       fsdp_sim_pack_cache_t *cache);
/* 1 when k is large enough for fsdp_sim_kernel_exec_par to split it: a rank starts its workers
 * then (a descriptor's sizes only; it may still be invalid). */
int fsdp_sim_kernel_wants_pool(const fsdp_kernel_t *k);

/* The check of a descriptor of any kind (kernel_check.c): FSDP_OK, or FSDP_ERR_INVALID_PARAM
 * after one line naming the kernel and what is wrong with it. */
fsdp_status_t fsdp_sim_kernel_check(const fsdp_kernel_t *k);

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

/* op(B) packed whole, as the product packs it a block at a time: fsdp_sim_gemm_packed_b_floats
 * floats (0: too many to address), filled by fsdp_sim_gemm_pack_b. Packing copies (and widens
 * 16-bit values, exactly), so a product from the packed operand gives the bits of one that
 * packs B itself. */
size_t fsdp_sim_gemm_packed_b_floats(size_t n, size_t k);
void fsdp_sim_gemm_pack_b(int trans_b, const void *b, fsdp_dtype_t b_dtype, size_t ldb, size_t n,
                          size_t k, float *out);
/* fsdp_sim_gemm_ex_par with op(B) in b_packed (NULL: packed as it goes, into a buffer of its
 * own), fsdp_sim_gemm_packed_b_floats(n, k) floats: with b_fill 0 it must hold
 * fsdp_sim_gemm_pack_b of this product's trans_b, b, b_dtype, ldb, n and k, and is read; with
 * b_fill 1 the product packs B into it as it goes and reads it there, so that it holds that
 * when the product returns FSDP_OK (no extra pass over B: the packing it would do anyway). */
fsdp_status_t fsdp_sim_gemm_ex_packed(fsdp_sim_pool_t *pool, int trans_a, int trans_b, size_t m,
                                      size_t n, size_t k, float alpha, const void *a,
                                      fsdp_dtype_t a_dtype, size_t lda, const void *b,
                                      fsdp_dtype_t b_dtype, size_t ldb, float beta, void *c,
                                      fsdp_dtype_t c_dtype, size_t ldc,
                                      const fsdp_gemm_epilogue_t *epi, float *b_packed,
                                      int b_fill);

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
