/* Host execution of kernel descriptors (data mode).
 *
 * This file only validates and loops: every per-element or per-column formula is a body of
 * lib/kernels/kernel_elem.h (fsdp_kb_elem and friends), the code the gpu backend launches, and
 * the per-launch scalars come from the same fsdp_kb_prepare(). GEMM runs the blocked routine
 * of gemm.c. Reductions run in a fixed order that depends on the sizes alone: bias_grad sums
 * each column in f32 over 32 row lanes (lanes.h's column shape, fsdp_kb_colsum); mse_loss and
 * sumsq sum their terms in double along the GPU's tree (fsdp_kb_reduce_sum), so the sim and the
 * gpu backend agree bit for bit.
 */
#include "config.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include <fsdp/log.h>

#include "elem_vec.h"
#include "kernels/kernel_elem.h"
#include "kernels/llama_bodies.h"
#include "sim_kernels.h"

/* Logs one line naming the kernel and returns FSDP_ERR_INVALID_PARAM. */
#define FSDP_SIM_KERNEL_INVALID(k, fmt, ...)                                                       \
    do {                                                                                           \
        fsdp_error("kernel %s: " fmt, fsdp_kernel_name((k)->kind), __VA_ARGS__);                   \
        return FSDP_ERR_INVALID_PARAM;                                                             \
    } while (0)

/* The runtime's own arithmetic on whole flat buffers (zero fills, the gradient divides, f32
 * copies) as plain loops over one dtype: the same value to the bit as fsdp_kb_elem's
 * per-element load and store (a zero fill is all zero bits in every dtype; f32 loads and
 * stores are the identity), without a dtype switch per element. Each runs elements [b, e) and
 * returns 1, or returns 0 for a kernel it leaves to the general loop. */
#define FAST_LANES 8

typedef int (*fsdp_sim_fast_t)(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p, size_t b, size_t e);

static int fast_fill(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p, size_t b, size_t e)
{
    uint32_t bits;
    size_t es = fsdp_dtype_size(k->u.fill.dtype);

    memcpy(&bits, &p->fill_f32, sizeof(bits));
    if (k->u.fill.dtype == FSDP_DTYPE_I32 ? p->fill_i32 != 0 : bits != 0)
        return 0;
    if (e > b) /* x may be NULL for no elements */
        memset((char *)k->u.fill.x + b * es, 0, (e - b) * es);
    return 1;
}

static int fast_cast(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p, size_t b, size_t e)
{
    size_t es = fsdp_dtype_size(k->u.cast.dst_dtype);

    (void)p;
    if (k->u.cast.src_dtype != k->u.cast.dst_dtype)
        return 0;
    if (e > b && k->u.cast.dst != k->u.cast.src) /* the check refused an overlap */
        memcpy((char *)k->u.cast.dst + b * es, (const char *)k->u.cast.src + b * es, (e - b) * es);
    return 1;
}

/* scale and div; whole groups of FAST_LANES first: a fixed trip count the compiler vectorizes */
static int fast_scale(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p, size_t b, size_t e)
{
    float *x = k->u.scale.x, alpha = k->u.scale.alpha;
    size_t i = b;

    (void)p;
    if (k->u.scale.dtype != FSDP_DTYPE_F32)
        return 0;
    if (k->kind == FSDP_K_SCALE) {
        for (; i + FAST_LANES <= e; i += FAST_LANES)
            for (size_t j = 0; j < FAST_LANES; j++)
                x[i + j] *= alpha;
        for (; i < e; i++)
            x[i] *= alpha;
    } else {
        for (; i + FAST_LANES <= e; i += FAST_LANES)
            for (size_t j = 0; j < FAST_LANES; j++)
                x[i + j] /= alpha;
        for (; i < e; i++)
            x[i] /= alpha;
    }
    return 1;
}

static const fsdp_sim_fast_t fsdp_sim_fast[FSDP_K_COUNT] = {
    [FSDP_K_FILL] = fast_fill,
    [FSDP_K_CAST] = fast_cast,
    [FSDP_K_SCALE] = fast_scale,
    [FSDP_K_DIV] = fast_scale,
};

/* The element-wise part of a checked descriptor, elements [b, e): a plain loop, a vector loop
 * or the scalar bodies, the same bytes whichever runs. */
static void fsdp_sim_elems(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p, size_t b, size_t e)
{
    fsdp_sim_fast_t fast = fsdp_sim_fast[k->kind];

    if ((fast != NULL && fast(k, p, b, e)) || fsdp_sim_elem_vec(k, p, b, e))
        return;
    fsdp_sim_elem_range(k, p, b, e);
}

/* GEMM, or a batch of them in index order (kernel.h: batch 0 or 1 is one product); each
 * product on the threads of pool (NULL: the calling thread), B from cache when it has it. */
static fsdp_status_t fsdp_sim_gemm_desc(const fsdp_kernel_t *k, fsdp_sim_pool_t *pool,
                                        fsdp_sim_pack_cache_t *cache)
{
    int fill = 0;
    float *b_packed = fsdp_sim_pack_cache_get(cache, k, &fill); /* NULL for a batch */
    size_t batch = k->u.gemm.batch > 1 ? k->u.gemm.batch : 1;
    size_t sa = fsdp_dtype_size(k->u.gemm.a_dtype), sb = fsdp_dtype_size(k->u.gemm.b_dtype);
    size_t sc = fsdp_dtype_size(k->u.gemm.c_dtype);
    fsdp_status_t status = FSDP_OK;

    if (batch > 1 &&
        (k->u.gemm.stride_a > SIZE_MAX / batch / sa || k->u.gemm.stride_b > SIZE_MAX / batch / sb ||
         k->u.gemm.stride_c > SIZE_MAX / batch / sc))
        FSDP_SIM_KERNEL_INVALID(k, "a batch of %zu with strides %zu, %zu, %zu overflows", batch,
                                k->u.gemm.stride_a, k->u.gemm.stride_b, k->u.gemm.stride_c);
    for (size_t i = 0; i < batch && status == FSDP_OK; i++) {
        const char *a = k->u.gemm.a, *b = k->u.gemm.b;
        char *c = k->u.gemm.c;
        if (i > 0) { /* the pointers of the first product are used as they are (NULL too) */
            a += i * k->u.gemm.stride_a * sa;
            b += i * k->u.gemm.stride_b * sb;
            c += i * k->u.gemm.stride_c * sc;
        }
        status = fsdp_sim_gemm_ex_packed(
            pool, k->u.gemm.trans_a, k->u.gemm.trans_b, k->u.gemm.m, k->u.gemm.n, k->u.gemm.k,
            k->u.gemm.alpha, a, k->u.gemm.a_dtype, k->u.gemm.lda, b, k->u.gemm.b_dtype,
            k->u.gemm.ldb, k->u.gemm.beta, c, k->u.gemm.c_dtype, k->u.gemm.ldc,
            fsdp_kb_gemm_has_epilogue(k) ? &k->u.gemm.epilogue : NULL, b_packed, fill);
    }
    fsdp_sim_pack_cache_done(cache, status);
    return status;
}

/* Indices [b, e) of pass `pass` of a checked Llama kernel: with vectors (elem_vec.c) where there
 * is a loop for them, the bodies' host loops otherwise; the same bytes either way. */
static void fsdp_sim_llama_range(const fsdp_kernel_t *k, int pass, size_t b, size_t e)
{
    if (!fsdp_sim_pass_vec(k, pass, b, e))
        fsdp_sim_pass_range(k, pass, b, e);
}

/* Column blocks [b, e) of the column sums, rows [b, e) of a row kernel: the same. */
static void fsdp_sim_colsum_part(const fsdp_kernel_t *k, size_t b, size_t e)
{
    if (b < e && !fsdp_sim_colsum_vec(k, b, e))
        fsdp_sim_colsum_range(k, b, e);
}

static void fsdp_sim_rows_part(const fsdp_kernel_t *k, float ce_scale, size_t b, size_t e)
{
    if (b < e && !fsdp_sim_rows_vec(k, ce_scale, b, e))
        fsdp_sim_rows_range(k, ce_scale, b, e);
}

/* The parts of a checked descriptor of the exec classes ELEMS and PARTS, in the order of
 * kernel.h's list: the column sums and the embedding's column chunks read only inputs, the rows
 * write outputs, the reduction reads what the rows wrote (cross_entropy's losses) before the
 * elements overwrite an input (mse_loss's dy). A kind without a part skips it. */
static void fsdp_sim_parts(const fsdp_kernel_t *k)
{
    fsdp_kb_prep_t prep;
    fsdp_kb_term_func_t term;
    size_t n = 0;
    float *out = NULL;
    double divisor = 1.0;

    fsdp_kb_prepare(k, &prep);
    fsdp_sim_colsum_part(k, 0, fsdp_kb_colsum_blocks(k));
    fsdp_kb_nn_cols_host(k);
    fsdp_sim_rows_part(k, prep.ce_scale, 0, fsdp_kb_nn_rows(k));
    term = fsdp_kb_reduction(k, &n, &out, &divisor);
    if (term != NULL)
        out[0] = (float)(fsdp_kb_reduce_sum(k, n, term) / divisor);
    fsdp_sim_elems(k, &prep, 0, prep.n);
}

fsdp_status_t fsdp_sim_kernel_exec(const fsdp_kernel_t *k)
{
    fsdp_status_t status;

    if (k == NULL) {
        fsdp_error("kernel: descriptor is NULL");
        return FSDP_ERR_INVALID_PARAM;
    }
    status = fsdp_sim_kernel_check(k);
    if (status != FSDP_OK)
        return status;
    switch (fsdp_kb_exec(k->kind)) {
    case FSDP_KX_GEMM:
        return fsdp_sim_gemm_desc(k, NULL, NULL);
    case FSDP_KX_PASSES:
        for (int pass = 0; pass < fsdp_kb_llama_passes(k); pass++) {
            size_t units = fsdp_sim_attn_bwd_units(k, pass); /* the passes left, in one walk */
            if (units > 0) {
                fsdp_sim_attn_bwd_run(k, 0, units);
                break;
            }
            fsdp_sim_llama_range(k, pass, 0, fsdp_kb_llama_count(k, pass));
        }
        return FSDP_OK;
    case FSDP_KX_ELEMS:
    case FSDP_KX_PARTS:
        break;
    }
    fsdp_sim_parts(k);
    return FSDP_OK;
}

/* ---- on a rank's worker threads ----
 *
 * A kernel whose elements are independent (each output element is a function of the inputs at
 * its own index, and nothing is summed across indexes: the exec class ELEMS of kernel.h's list)
 * is cut into fixed blocks of indexes, each run on a thread: the same bits, whatever the threads. A
 * batch of small products is cut by product; a large product splits itself (gemm.c). Everything
 * else runs on the calling thread. */

#define FSDP_SIM_PAR_MIN_ELEMS ((size_t)1 << 16) /* fewer elements stay on the calling thread */
#define FSDP_SIM_PAR_UNIT 1024                   /* blocks are multiples of this many elements */
#define FSDP_SIM_PAR_MIN_MACS 1e6                /* a batch of fewer products stays too */

typedef struct fsdp_sim_par_job {
    const fsdp_kernel_t *k;
    fsdp_kb_prep_t prep; /* an element-wise kernel's scalars, prepared once */
    size_t n, block;     /* elements (products of a batch) in all and per part */
    atomic_int status;
} fsdp_sim_par_job_t;

/* Elements [part * block, ...) of a checked kernel of independent elements. */
static void fsdp_sim_par_elem_part(void *arg, size_t part)
{
    fsdp_sim_par_job_t *job = arg;
    size_t o = part * job->block;
    size_t len = job->n - o < job->block ? job->n - o : job->block;

    fsdp_sim_elems(job->k, &job->prep, o, o + len);
}

/* Products [part * block, ...) of a batch, each on this thread. */
static void fsdp_sim_par_batch_part(void *arg, size_t part)
{
    fsdp_sim_par_job_t *job = arg;
    const fsdp_kernel_t *k = job->k;
    size_t sa = fsdp_dtype_size(k->u.gemm.a_dtype), sb = fsdp_dtype_size(k->u.gemm.b_dtype);
    size_t sc = fsdp_dtype_size(k->u.gemm.c_dtype);
    size_t end = (part + 1) * job->block < job->n ? (part + 1) * job->block : job->n;
    fsdp_status_t status = FSDP_OK;

    for (size_t i = part * job->block; i < end && status == FSDP_OK; i++)
        status = fsdp_sim_gemm_ex(
            k->u.gemm.trans_a, k->u.gemm.trans_b, k->u.gemm.m, k->u.gemm.n, k->u.gemm.k,
            k->u.gemm.alpha, (const char *)k->u.gemm.a + i * k->u.gemm.stride_a * sa,
            k->u.gemm.a_dtype, k->u.gemm.lda,
            (const char *)k->u.gemm.b + i * k->u.gemm.stride_b * sb, k->u.gemm.b_dtype,
            k->u.gemm.ldb, k->u.gemm.beta, (char *)k->u.gemm.c + i * k->u.gemm.stride_c * sc,
            k->u.gemm.c_dtype, k->u.gemm.ldc, NULL);
    if (status != FSDP_OK)
        atomic_store(&job->status, (int)status);
}

/* 1 when a batch of products (a checked descriptor) is worth cutting by product: many small
 * ones (each too small to split itself), all set, whose C blocks are apart (a product's C
 * ends before the next one's starts), without an epilogue (which needs batch <= 1). */
static int fsdp_sim_par_batch(const fsdp_kernel_t *k, int threads)
{
    size_t batch = k->u.gemm.batch, m = k->u.gemm.m, n = k->u.gemm.n;
    double macs = (double)m * (double)n * (double)k->u.gemm.k;

    if (threads <= 1 || batch < 2 || m == 0 || n == 0 || k->u.gemm.k == 0 ||
        macs * (double)batch < FSDP_SIM_PAR_MIN_MACS || macs >= FSDP_SIM_PAR_MIN_MACS ||
        fsdp_kb_gemm_has_epilogue(k) || k->u.gemm.a == NULL || k->u.gemm.b == NULL ||
        k->u.gemm.c == NULL || k->u.gemm.ldc < n)
        return 0;
    if (k->u.gemm.stride_a > SIZE_MAX / batch / fsdp_dtype_size(k->u.gemm.a_dtype) ||
        k->u.gemm.stride_b > SIZE_MAX / batch / fsdp_dtype_size(k->u.gemm.b_dtype) ||
        k->u.gemm.stride_c > SIZE_MAX / batch / fsdp_dtype_size(k->u.gemm.c_dtype) ||
        k->u.gemm.stride_c < (m - 1) * k->u.gemm.ldc + n)
        return 0; /* the serial loop says what is wrong, or runs them in order */
    return 1;
}

/* ---- the kernels of passes and parts, split by index ----
 *
 * A Llama kernel's pass is a range of independent indices (llama_bodies.h: rows, column blocks,
 * elements), and so is each part of a kernel of parts but its one reduction (kernel_elem.h:
 * the column sums by blocks of 32 columns, each in its fixed tree; the embedding's column
 * chunks; the rows; the elements): each is cut into ranges of indices run on the pool's
 * threads, a part after the one before it, the reduction on the calling thread. Every index is
 * computed as on one thread, so the bits do not depend on the thread count. */

#define FSDP_SIM_PAR_MIN_WORK ((double)(1 << 19)) /* FLOPs and bytes: less stays serial */
#define FSDP_SIM_PAR_PARTS 8                      /* ranges per thread, for the balance */

/* 1 when a checked-or-not kernel of passes or parts is worth the pool. */
static int fsdp_sim_par_split(const fsdp_kernel_t *k)
{
    double flops, bytes;

    if (fsdp_kb_exec(k->kind) != FSDP_KX_PASSES && fsdp_kb_exec(k->kind) != FSDP_KX_PARTS)
        return 0;
    if (k->kind == FSDP_K_ATTENTION_FWD && k->u.attention_fwd.batch > 0) {
        /* a query row reads every key and value row of its batch: o must be apart from them
         * (in place over q is a row's own) */
        const size_t es = fsdp_dtype_size(k->u.attention_fwd.dtype),
                     rows = k->u.attention_fwd.batch * k->u.attention_fwd.seq;
        const char *o = k->u.attention_fwd.o, *kk = k->u.attention_fwd.k, *v = k->u.attention_fwd.v;
        const size_t ob = rows * k->u.attention_fwd.ldo * es;
        if ((o < kk + rows * k->u.attention_fwd.ldk * es && kk < o + ob) ||
            (o < v + rows * k->u.attention_fwd.ldv * es && v < o + ob))
            return 0;
    }
    fsdp_kernel_cost(k, &flops, &bytes);
    return flops + bytes >= FSDP_SIM_PAR_MIN_WORK;
}

typedef struct fsdp_sim_split_job fsdp_sim_split_job_t;
struct fsdp_sim_split_job {
    const fsdp_kernel_t *k;
    const fsdp_kb_prep_t *prep;
    int pass;        /* a Llama kernel's pass */
    size_t n, block; /* indices in all and per range */
    void (*range)(const fsdp_sim_split_job_t *job, size_t b, size_t e);
};

static void fsdp_sim_split_part(void *arg, size_t part)
{
    const fsdp_sim_split_job_t *job = arg;
    size_t b = part * job->block, e = job->n - b < job->block ? job->n : b + job->block;

    job->range(job, b, e);
}

/* Indices [0, n) of job on the pool's threads, in ranges. */
static void fsdp_sim_split_run(fsdp_sim_pool_t *pool, fsdp_sim_split_job_t *job, size_t n)
{
    size_t parts = (size_t)fsdp_sim_pool_threads(pool) * FSDP_SIM_PAR_PARTS;

    if (n == 0)
        return;
    job->n = n;
    job->block = (n + parts - 1) / parts;
    if (n <= 1 || fsdp_sim_pool_threads(pool) <= 1) {
        job->range(job, 0, n);
        return;
    }
    fsdp_sim_pool_run(pool, (n + job->block - 1) / job->block, fsdp_sim_split_part, job);
}

static void fsdp_sim_split_llama(const fsdp_sim_split_job_t *job, size_t b, size_t e)
{
    fsdp_sim_llama_range(job->k, job->pass, b, e);
}

static void fsdp_sim_split_attn_bwd(const fsdp_sim_split_job_t *job, size_t b, size_t e)
{
    fsdp_sim_attn_bwd_run(job->k, b, e);
}

static void fsdp_sim_split_colsum(const fsdp_sim_split_job_t *job, size_t b, size_t e)
{
    fsdp_sim_colsum_part(job->k, b, e);
}

static void fsdp_sim_split_cols(const fsdp_sim_split_job_t *job, size_t b, size_t e)
{
    fsdp_kb_nn_cols_range(job->k, b, e);
}

static void fsdp_sim_split_rows(const fsdp_sim_split_job_t *job, size_t b, size_t e)
{
    fsdp_sim_rows_part(job->k, job->prep->ce_scale, b, e);
}

static void fsdp_sim_split_elems(const fsdp_sim_split_job_t *job, size_t b, size_t e)
{
    fsdp_sim_elems(job->k, job->prep, b, e);
}

/* A checked kernel of passes or parts on the pool: what fsdp_sim_kernel_exec does, each pass
 * or part cut into ranges. */
static void fsdp_sim_split_exec(const fsdp_kernel_t *k, fsdp_sim_pool_t *pool)
{
    fsdp_sim_split_job_t job = {.k = k};
    fsdp_kb_prep_t prep;
    fsdp_kb_term_func_t term;
    size_t n = 0;
    float *out = NULL;
    double divisor = 1.0;

    if (fsdp_kb_exec(k->kind) == FSDP_KX_PASSES) {
        job.range = fsdp_sim_split_llama;
        for (job.pass = 0; job.pass < fsdp_kb_llama_passes(k); job.pass++) {
            /* the passes left in one walk, where it has a unit for each thread */
            size_t units = fsdp_sim_attn_bwd_units(k, job.pass);
            if (units >= (size_t)fsdp_sim_pool_threads(pool)) {
                job.range = fsdp_sim_split_attn_bwd;
                fsdp_sim_split_run(pool, &job, units);
                break;
            }
            fsdp_sim_split_run(pool, &job, fsdp_kb_llama_count(k, job.pass));
        }
        return;
    }
    /* fsdp_sim_parts' order */
    fsdp_kb_prepare(k, &prep);
    job.prep = &prep;
    job.range = fsdp_sim_split_colsum;
    fsdp_sim_split_run(pool, &job, fsdp_kb_colsum_blocks(k));
    job.range = fsdp_sim_split_cols;
    fsdp_sim_split_run(pool, &job, fsdp_kb_nn_chunks(k));
    job.range = fsdp_sim_split_rows;
    fsdp_sim_split_run(pool, &job, fsdp_kb_nn_rows(k));
    term = fsdp_kb_reduction(k, &n, &out, &divisor);
    if (term != NULL)
        out[0] = (float)(fsdp_kb_reduce_sum(k, n, term) / divisor);
    if (prep.n < FSDP_SIM_PAR_MIN_ELEMS) {
        fsdp_sim_elems(k, &prep, 0, prep.n);
        return;
    }
    job.range = fsdp_sim_split_elems;
    fsdp_sim_split_run(pool, &job, prep.n);
}

int fsdp_sim_kernel_wants_pool(const fsdp_kernel_t *k)
{
    fsdp_kb_prep_t prep;

    switch (fsdp_kb_exec(k->kind)) {
    case FSDP_KX_GEMM:
        return (double)k->u.gemm.m * (double)k->u.gemm.n * (double)k->u.gemm.k *
                   (double)(k->u.gemm.batch > 1 ? k->u.gemm.batch : 1) >=
               FSDP_SIM_PAR_MIN_MACS;
    case FSDP_KX_ELEMS:
        fsdp_kb_prepare(k, &prep);
        return prep.n >= FSDP_SIM_PAR_MIN_ELEMS;
    default:
        return fsdp_sim_par_split(k);
    }
}

fsdp_status_t fsdp_sim_kernel_exec_par(const fsdp_kernel_t *k, fsdp_sim_pool_t *pool,
                                       fsdp_sim_pack_cache_t *cache)
{
    int threads = fsdp_sim_pool_threads(pool);
    fsdp_sim_par_job_t job;
    fsdp_status_t status;
    size_t parts;

    if (k != NULL && k->kind == FSDP_K_GEMM) { /* on any number of threads: the pack cache */
        if (fsdp_sim_kernel_check(k) != FSDP_OK)
            return FSDP_ERR_INVALID_PARAM;
        if (!fsdp_sim_par_batch(k, threads)) /* 0 on one thread */
            return fsdp_sim_gemm_desc(k, pool, cache);
        job.k = k;
        job.n = k->u.gemm.batch;
        parts = job.n < (size_t)threads * 2 ? job.n : (size_t)threads * 2;
        job.block = (job.n + parts - 1) / parts;
        parts = (job.n + job.block - 1) / job.block;
        atomic_init(&job.status, (int)FSDP_OK);
        fsdp_sim_pool_run(pool, parts, fsdp_sim_par_batch_part, &job);
        return (fsdp_status_t)atomic_load(&job.status);
    }
    if (threads > 1 && k != NULL && fsdp_sim_par_split(k)) {
        /* checked whole first, as below */
        status = fsdp_sim_kernel_check(k);
        if (status != FSDP_OK)
            return status;
        fsdp_sim_split_exec(k, pool);
        return FSDP_OK;
    }
    if (threads <= 1 || k == NULL || fsdp_kb_exec(k->kind) != FSDP_KX_ELEMS)
        return fsdp_sim_kernel_exec(k);
    fsdp_kb_prepare(k, &job.prep);
    job.n = job.prep.n;
    if (job.n < FSDP_SIM_PAR_MIN_ELEMS)
        return fsdp_sim_kernel_exec(k);
    /* the whole descriptor is checked first, so that every block of it is valid and a bad one
     * fails whole before anything is written */
    status = fsdp_sim_kernel_check(k);
    if (status != FSDP_OK)
        return status;
    job.k = k;
    parts = (size_t)threads * 2;
    job.block = (job.n + parts - 1) / parts;
    job.block = (job.block + FSDP_SIM_PAR_UNIT - 1) / FSDP_SIM_PAR_UNIT * FSDP_SIM_PAR_UNIT;
    parts = (job.n + job.block - 1) / job.block;
    atomic_init(&job.status, (int)FSDP_OK);
    fsdp_sim_pool_run(pool, parts, fsdp_sim_par_elem_part, &job);
    return (fsdp_status_t)atomic_load(&job.status);
}
