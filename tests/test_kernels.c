/* Host kernels (sim/kernels.c, sim/gemm.c, the bodies of lib/kernels/), the optimizer's
 * configuration and the random number generator.
 *
 * Every kernel is checked against a reference the test computes itself in double, with a
 * tolerance derived from the rounding the kernel is allowed to do (u = 2^-24, the unit
 * roundoff of f32). The kernels are called through fsdp_sim_kernel_exec, the sim backend's
 * executor, so no process group is needed.
 */
#include <fsdp/fsdp.h>
#include <fsdp/nn.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/lanes.h"
#include "nn/nn_hidden.h"
#include "sim_kernels.h"
#include "test_util.h"

#define U32 0x1p-24 /* unit roundoff of f32 */

/* ---- helpers ------------------------------------------------------------------------------ */

static uint64_t test_rng_state;

static void test_seed(uint64_t s)
{
    test_rng_state = s * 2654435761u + 1;
}

/* xorshift64*, independent of the library's generator */
static double test_rand(double lo, double hi)
{
    test_rng_state ^= test_rng_state >> 12;
    test_rng_state ^= test_rng_state << 25;
    test_rng_state ^= test_rng_state >> 27;
    uint64_t r = test_rng_state * UINT64_C(2685821657736338717);
    return lo + (hi - lo) * ((double)(r >> 11) * 0x1p-53);
}

static size_t test_index(size_t n)
{
    size_t i = (size_t)test_rand(0.0, (double)n);
    return i < n ? i : n - 1;
}

static void fill_rand(float *x, size_t n, double lo, double hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)test_rand(lo, hi);
}

static uint32_t test_f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof(u));
    return u;
}

/* Counts error lines, keeps the last one. */
static int log_count;
static char log_last[512];

static void log_capture(fsdp_log_level_t level, const char *file, int line, const char *func,
                        const char *msg, void *arg)
{
    (void)file;
    (void)line;
    (void)func;
    (void)arg;
    if (level == FSDP_LOG_ERROR)
        log_count++;
    snprintf(log_last, sizeof(log_last), "%s", msg);
}

static void log_begin(void)
{
    log_count = 0;
    log_last[0] = '\0';
    fsdp_log_set_handler(log_capture, NULL);
}

static void log_end(void)
{
    fsdp_log_set_handler(NULL, NULL);
}

static fsdp_status_t run(const fsdp_kernel_t *k)
{
    return fsdp_sim_kernel_exec(k);
}

/* gamma_n = n u / (1 - n u): the bound on n successive f32 roundings (Higham, ch. 3) */
static double gamma_n(double n)
{
    return n * U32 / (1.0 - n * U32);
}

/* ---- GEMM --------------------------------------------------------------------------------- */

/* C = alpha op(A) op(B) + beta C in double, and for each element the rigorous bound on the
 * error of any f32 evaluation that sums the k products in some order, in blocks of KC added
 * to C one after the other: every path from a product to C holds at most k - 1 additions
 * within its block, one multiplication (the product), one by alpha, and per block one addition
 * to C (plus beta*C and its sum in the first one): gamma_{k + 2 ceil(k/KC) + 3} times the sum
 * of the magnitudes. Products of two floats are exact in double. */
static void ref_gemm(int ta, int tb, size_t m, size_t n, size_t k, float alpha, const float *a,
                     size_t lda, const float *b, size_t ldb, float beta, const float *c0,
                     size_t ldc, double *ref, double *bound)
{
    double nblocks = ceil((double)k / FSDP_SIM_GEMM_KC);
    double g = gamma_n((double)k + 2.0 * nblocks + 3.0);
    for (size_t i = 0; i < m; i++) {
        for (size_t j = 0; j < n; j++) {
            double s = 0.0, sa = 0.0, cterm = 0.0;
            for (size_t p = 0; p < k; p++) {
                double x = (double)(ta ? a[p * lda + i] : a[i * lda + p]) *
                           (double)(tb ? b[j * ldb + p] : b[p * ldb + j]);
                s += x;
                sa += fabs(x);
            }
            if (beta != 0.0f)
                cterm = (double)beta * (double)c0[i * ldc + j];
            ref[i * n + j] = (double)alpha * s + cterm;
            bound[i * n + j] = g * (fabs((double)alpha) * sa + fabs(cterm)) + 1e-300;
        }
    }
}

static double gemm_worst; /* largest |error| / bound seen */

/* Runs one GEMM through the executor and checks it; returns the number of bad elements. */
static int check_gemm(int ta, int tb, size_t m, size_t n, size_t k, float alpha, float beta,
                      size_t pad)
{
    size_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
    size_t arows = ta ? k : m, brows = tb ? n : k;
    float *a = malloc((arows * lda + 1) * sizeof(float));
    float *b = malloc((brows * ldb + 1) * sizeof(float));
    float *c = malloc((m * ldc + 1) * sizeof(float)), *c0 = malloc((m * ldc + 1) * sizeof(float));
    float *c2 = malloc((m * ldc + 1) * sizeof(float));
    double *ref = malloc((m * n + 1) * sizeof(double)),
           *bound = malloc((m * n + 1) * sizeof(double));
    fsdp_kernel_t kd = {.kind = FSDP_K_GEMM};
    int bad = 0;

    CU_ASSERT_FATAL(a && b && c && c0 && c2 && ref && bound);
    fill_rand(a, arows * lda, -1.0, 1.0);
    fill_rand(b, brows * ldb, -1.0, 1.0);
    fill_rand(c0, m * ldc, -1.0, 1.0);
    for (size_t i = 0; i < m; i++) {
        for (size_t j = n; j < ldc; j++)
            c0[i * ldc + j] = 12345.0f; /* past n: must stay */
        if (beta == 0.0f)
            for (size_t j = 0; j < n; j++)
                c0[i * ldc + j] = NAN; /* beta == 0 must not read C */
    }
    memcpy(c, c0, m * ldc * sizeof(float));
    kd.u.gemm.trans_a = ta;
    kd.u.gemm.trans_b = tb;
    kd.u.gemm.m = m;
    kd.u.gemm.n = n;
    kd.u.gemm.k = k;
    kd.u.gemm.alpha = alpha;
    kd.u.gemm.a = a;
    kd.u.gemm.lda = lda;
    kd.u.gemm.b = b;
    kd.u.gemm.ldb = ldb;
    kd.u.gemm.beta = beta;
    kd.u.gemm.c = c;
    kd.u.gemm.ldc = ldc;
    CU_ASSERT_EQUAL_FATAL(run(&kd), FSDP_OK);
    ref_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c0, ldc, ref, bound);
    for (size_t i = 0; i < m; i++) {
        for (size_t j = 0; j < ldc; j++) {
            double got = c[i * ldc + j];
            int ok = j < n ? fabs(got - ref[i * n + j]) <= bound[i * n + j] : got == 12345.0;
            if (j < n)
                gemm_worst = fmax(gemm_worst, fabs(got - ref[i * n + j]) / bound[i * n + j]);
            if (!ok && bad++ < 3)
                fprintf(stderr,
                        "gemm %c%c m %zu n %zu k %zu pad %zu: C[%zu,%zu] = %.9g, want %.9g\n",
                        ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, pad, i, j, got,
                        j < n ? ref[i * n + j] : 12345.0);
        }
    }
    /* same shape, same bits */
    memcpy(c2, c0, m * ldc * sizeof(float));
    kd.u.gemm.c = c2;
    CU_ASSERT_EQUAL(run(&kd), FSDP_OK);
    if (memcmp(c, c2, m * ldc * sizeof(float)) != 0)
        bad++;
    free(a);
    free(b);
    free(c);
    free(c0);
    free(c2);
    free(ref);
    free(bound);
    return bad;
}

static void test_gemm_transposes(void)
{
    static const size_t sizes[] = {1,  2,  3,  4,  5,  7,  8,  11, 13, 16, 17,
                                   19, 23, 31, 32, 33, 37, 47, 61, 64, 67, 70};
    static const float alphas[] = {1.0f, -0.5f, 2.0f};
    static const float betas[] = {0.0f, 1.0f, 0.25f};
    const size_t ns = sizeof(sizes) / sizeof(sizes[0]);
    int bad = 0, cases = 0;

    test_seed(1);
    for (int t = 0; t < 4; t++) {
        int ta = t >> 1, tb = t & 1;
        for (int r = 0; r < 30; r++) {
            size_t m = sizes[test_index(ns)];
            size_t n = sizes[test_index(ns)];
            size_t k = sizes[test_index(ns)];
            bad += check_gemm(ta, tb, m, n, k, alphas[r % 3], betas[(r / 3) % 3],
                              (size_t)(r % 4 == 0   ? 0
                                       : r % 4 == 1 ? 1
                                                    : 9));
            cases++;
        }
        bad += check_gemm(ta, tb, 1, 1, 1, 1.0f, 0.0f, 0);
        bad += check_gemm(ta, tb, 70, 70, 70, 1.0f, 0.0f, 3);
        bad += check_gemm(ta, tb, 67, 61, 300, 0.5f, 1.0f, 2); /* two k blocks */
        bad += check_gemm(ta, tb, 3, 17, 2 * FSDP_SIM_GEMM_KC + 1, 1.0f, 0.25f, 0);
        bad += check_gemm(ta, tb, 151, 21, 9, 1.0f, 0.0f, 1);  /* more rows than one A block */
        bad += check_gemm(ta, tb, 5, 3100, 7, -1.0f, 1.0f, 0); /* more columns than one B panel */
        cases += 6;
    }
    fprintf(stderr, "(%d cases, worst error %.2f of the bound) ", cases, gemm_worst);
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT(cases > 100);
}

/* A rank's worker threads give the bits of the calling thread alone: GEMMs cut by rows or by
 * columns (every transpose, an f32 and a bf16 C with an epilogue, edge blocks), a batch of small
 * products cut by product, and element-wise kernels cut by index, on pools of 2, 3 and 4. */
static void test_threads_bits(void)
{
    /* m, n, k: columns cut (m <= n), rows cut, a long k, an n of no whole micro-tile */
    static const size_t shapes[][3] = {{37, 901, 300}, {1203, 70, 129}, {64, 130, 2100}, {500, 509, 17}};
    fsdp_sim_pool_t *pools[3] = {fsdp_sim_pool_create(2), fsdp_sim_pool_create(3),
                                 fsdp_sim_pool_create(4)};
    int bad = 0, cases = 0;

    CU_ASSERT_FATAL(pools[0] != NULL && pools[1] != NULL && pools[2] != NULL);
    CU_ASSERT_EQUAL(fsdp_sim_pool_threads(pools[1]), 3);
    CU_ASSERT_EQUAL(fsdp_sim_pool_threads(NULL), 1);
    test_seed(17);
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        size_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        float *a = malloc(m * k * sizeof(float)), *b = malloc(k * n * sizeof(float));
        float *bias = malloc(n * sizeof(float));
        float *c0 = malloc(m * n * sizeof(float)), *c1 = malloc(m * n * sizeof(float));
        CU_ASSERT_FATAL(a && b && bias && c0 && c1);
        fill_rand(a, m * k, -1, 1);
        fill_rand(b, k * n, -1, 1);
        fill_rand(bias, n, -1, 1);
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int lp = 0; lp < 2; lp++) { /* f32; bf16 operands and C, bias and GELU */
                    fsdp_dtype_t dt = lp ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
                    fsdp_gemm_epilogue_t epi;
                    memset(&epi, 0, sizeof(epi));
                    epi.bias = bias;
                    epi.bias_dtype = FSDP_DTYPE_F32;
                    epi.act = FSDP_ACT_GELU_TANH;
                    for (int p = -1; p < 3; p++) {
                        float *c = p < 0 ? c0 : c1;
                        memset(c, 0x7f, m * n * sizeof(float)); /* beta 0 must not read it */
                        CU_ASSERT_EQUAL(
                            fsdp_sim_gemm_ex_par(p < 0 ? NULL : pools[p], ta, tb, m, n, k, 0.5f,
                                                 a, dt, ta ? m : k, b, dt, tb ? k : n, 0.0f, c, dt,
                                                 n, lp ? &epi : NULL),
                            FSDP_OK);
                        if (p >= 0 && memcmp(c0, c1, m * n * fsdp_dtype_size(dt)) != 0) {
                            bad++;
                            fprintf(stderr, "\n%zux%zux%zu ta %d tb %d %s on %d threads differs", m,
                                    n, k, ta, tb, lp ? "bf16" : "f32", p + 2);
                        }
                        cases++;
                    }
                }
        free(a);
        free(b);
        free(bias);
        free(c0);
        free(c1);
    }

    { /* a batch of 40 products of 50 x 60 x 70, cut by product; and an AdamW step by index */
        const size_t batch = 40, m = 50, n = 60, k = 70, len = 300001;
        float *a = malloc(batch * m * k * sizeof(float)), *b = malloc(batch * k * n * sizeof(float));
        float *c[2] = {malloc(batch * m * n * sizeof(float)), malloc(batch * m * n * sizeof(float))};
        float *st[2][3], *grad = malloc(len * sizeof(float));
        fsdp_kernel_t d;
        CU_ASSERT_FATAL(a && b && c[0] && c[1] && grad);
        fill_rand(a, batch * m * k, -1, 1);
        fill_rand(b, batch * k * n, -1, 1);
        fill_rand(grad, len, -1, 1);
        for (int r = 0; r < 2; r++)
            for (int j = 0; j < 3; j++) {
                st[r][j] = malloc(len * sizeof(float));
                CU_ASSERT_FATAL(st[r][j] != NULL);
                for (size_t i = 0; i < len; i++)
                    st[r][j][i] = j == 2 ? 0.25f : 0.01f * (float)(i % 97) - 0.3f;
            }
        for (int r = 0; r < 2; r++) {
            memset(&d, 0, sizeof(d));
            d.kind = FSDP_K_GEMM;
            d.u.gemm.trans_b = 1;
            d.u.gemm.m = m;
            d.u.gemm.n = n;
            d.u.gemm.k = k;
            d.u.gemm.alpha = 1.0f;
            d.u.gemm.a = a;
            d.u.gemm.lda = k;
            d.u.gemm.b = b;
            d.u.gemm.ldb = k;
            d.u.gemm.c = c[r];
            d.u.gemm.ldc = n;
            d.u.gemm.batch = batch;
            d.u.gemm.stride_a = m * k;
            d.u.gemm.stride_b = n * k;
            d.u.gemm.stride_c = m * n;
            CU_ASSERT_EQUAL(fsdp_sim_kernel_exec_par(&d, r ? pools[1] : NULL, NULL), FSDP_OK);
            memset(&d, 0, sizeof(d));
            d.kind = FSDP_K_ADAMW;
            d.u.adamw.param = st[r][0];
            d.u.adamw.grad = grad;
            d.u.adamw.exp_avg = st[r][1];
            d.u.adamw.exp_avg_sq = st[r][2];
            d.u.adamw.n = len;
            d.u.adamw.lr = 1e-3f;
            d.u.adamw.beta1 = 0.9f;
            d.u.adamw.beta2 = 0.999f;
            d.u.adamw.eps = 1e-8f;
            d.u.adamw.weight_decay = 0.01f;
            d.u.adamw.step = 3;
            CU_ASSERT_EQUAL(fsdp_sim_kernel_exec_par(&d, r ? pools[2] : NULL, NULL), FSDP_OK);
            d.u.adamw.param = NULL; /* invalid: refused as a whole, nothing written */
            CU_ASSERT_EQUAL(fsdp_sim_kernel_exec_par(&d, r ? pools[2] : NULL, NULL),
                            FSDP_ERR_INVALID_PARAM);
        }
        CU_ASSERT(memcmp(c[0], c[1], batch * m * n * sizeof(float)) == 0);
        for (int j = 0; j < 3; j++)
            CU_ASSERT(memcmp(st[0][j], st[1][j], len * sizeof(float)) == 0);
        CU_ASSERT(st[0][0][5] != 0.01f * 5.0f - 0.3f); /* the step moved it */
        free(a);
        free(b);
        free(c[0]);
        free(c[1]);
        free(grad);
        for (int r = 0; r < 2; r++)
            for (int j = 0; j < 3; j++)
                free(st[r][j]);
    }
    for (int p = 0; p < 3; p++)
        fsdp_sim_pool_destroy(pools[p]);
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(cases, 4 * 4 * 2 * 4);
}

static fsdp_kernel_t k_gemm(int ta, int tb, size_t m, size_t n, size_t k, const float *a,
                            size_t lda, const float *b, size_t ldb, float *c, size_t ldc)
{
    fsdp_kernel_t kd = {.kind = FSDP_K_GEMM};
    kd.u.gemm.trans_a = ta;
    kd.u.gemm.trans_b = tb;
    kd.u.gemm.m = m;
    kd.u.gemm.n = n;
    kd.u.gemm.k = k;
    kd.u.gemm.alpha = 1.0f;
    kd.u.gemm.a = a;
    kd.u.gemm.lda = lda;
    kd.u.gemm.b = b;
    kd.u.gemm.ldb = ldb;
    kd.u.gemm.beta = 0.0f;
    kd.u.gemm.c = c;
    kd.u.gemm.ldc = ldc;
    return kd;
}

/* k_gemm over f32 or bf16 operands, alpha 0.5, with an epilogue (NULL: none), B named by
 * version (0: not named) */
static fsdp_kernel_t gemm_desc(int tb, size_t m, size_t n, size_t k, const void *a, const void *b,
                               void *c, fsdp_dtype_t dt, const fsdp_gemm_epilogue_t *epi,
                               uint64_t version)
{
    fsdp_kernel_t d = k_gemm(0, tb, m, n, k, a, k, b, tb ? k : n, c, n);
    d.u.gemm.alpha = 0.5f;
    d.u.gemm.a_dtype = d.u.gemm.b_dtype = d.u.gemm.c_dtype = dt;
    if (epi != NULL)
        d.u.gemm.epilogue = *epi;
    d.u.gemm.b_version = version;
    return d;
}

/* A rank's packed operand (pack_cache.c) against products that pack B themselves: the same bits
 * on every path (one or several A blocks, k blocks, columns or rows cut across threads, f32 and
 * bf16 with an epilogue); packed by the second launch of a version, read from then on, stale
 * for a new version (the buffer kept); within half its bound and its rows, never for a batch or
 * a bad B, and packed again after a product that failed while packing it. */
static void test_pack_cache(void)
{
    static const size_t shapes[][3] = {{37, 901, 300}, {1203, 70, 129}, {300, 509, 17}};
    fsdp_sim_pool_t *pools[3] = {NULL, fsdp_sim_pool_create(2), fsdp_sim_pool_create(3)};
    int bad = 0;

    CU_ASSERT_FATAL(pools[1] != NULL && pools[2] != NULL);
    test_seed(29);
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        size_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        float *a = malloc(m * k * sizeof(float)), *b = malloc(k * n * sizeof(float));
        float *bias = malloc(n * sizeof(float));
        float *c0 = malloc(m * n * sizeof(float)), *c1 = malloc(m * n * sizeof(float));
        CU_ASSERT_FATAL(a && b && bias && c0 && c1);
        fill_rand(a, m * k, -1, 1);
        fill_rand(bias, n, -1, 1);
        for (int tb = 0; tb < 2; tb++)
            for (int lp = 0; lp < 2; lp++)
                for (int p = 0; p < 3; p++) {
                    fsdp_dtype_t dt = lp ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
                    fsdp_gemm_epilogue_t epi;
                    size_t held = 0, bytes = fsdp_sim_gemm_packed_b_floats(n, k) * sizeof(float);
                    fsdp_sim_pack_cache_t cache;
                    memset(&cache, 0, sizeof(cache));
                    cache.held = &held;
                    cache.limit = SIZE_MAX;
                    cache.max_rows = SIZE_MAX;
                    memset(&epi, 0, sizeof(epi));
                    epi.bias = bias;
                    epi.bias_dtype = FSDP_DTYPE_F32;
                    epi.act = FSDP_ACT_GELU_TANH;
                    for (int launch = 0; launch < 5; launch++) {
                        uint64_t version = launch < 3 ? 7 : 8; /* new values from launch 3 on */
                        fsdp_kernel_t d0 = gemm_desc(tb, m, n, k, a, b, c0, dt, lp ? &epi : NULL, 0);
                        fsdp_kernel_t d1 = gemm_desc(tb, m, n, k, a, b, c1, dt, lp ? &epi : NULL,
                                                     version);
                        if (launch == 0 || launch == 3)
                            fill_rand(b, k * n, -1, 1); /* f32 values; bf16 reads their bits */
                        CU_ASSERT_EQUAL(fsdp_sim_kernel_exec(&d0), FSDP_OK);
                        memset(c1, 0x7f, m * n * sizeof(float));
                        CU_ASSERT_EQUAL(fsdp_sim_kernel_exec_par(&d1, pools[p], &cache), FSDP_OK);
                        if (memcmp(c0, c1, m * n * fsdp_dtype_size(dt)) != 0) {
                            bad++;
                            fprintf(stderr, "\n%zux%zux%zu tb %d %s on %d threads, launch %d differs",
                                    m, n, k, tb, lp ? "bf16" : "f32", p + 1, launch);
                        }
                    }
                    /* launch 1 packs version 7, 2 reads it; 4 packs version 8 */
                    CU_ASSERT_EQUAL(cache.packs, 2);
                    CU_ASSERT_EQUAL(cache.hits, 1);
                    CU_ASSERT_EQUAL(held, bytes);
                    fsdp_sim_pack_cache_drop(&cache);
                    CU_ASSERT_EQUAL(held, 0);
                    CU_ASSERT_PTR_NULL(cache.packed);
                }
        free(a);
        free(b);
        free(bias);
        free(c0);
        free(c1);
    }
    CU_ASSERT_EQUAL(bad, 0);

    { /* the bound: a copy takes at most half of it; a batch and a bad ldb are never packed */
        size_t m = 8, n = 40, k = 30, held = 0;
        size_t bytes = fsdp_sim_gemm_packed_b_floats(n, k) * sizeof(float);
        float a[8 * 30], b[2 * 30 * 40], c0[2 * 8 * 40], c1[2 * 8 * 40];
        fsdp_sim_pack_cache_t cache;
        fsdp_kernel_t d0, d1;
        memset(&cache, 0, sizeof(cache));
        cache.held = &held;
        cache.limit = 2 * bytes - 1;
        cache.max_rows = m;
        fill_rand(a, 8 * 30, -1, 1);
        fill_rand(b, 2 * 30 * 40, -1, 1);
        d0 = gemm_desc(1, m, n, k, a, b, c0, FSDP_DTYPE_F32, NULL, 0);
        d1 = gemm_desc(1, m, n, k, a, b, c1, FSDP_DTYPE_F32, NULL, 3);
        CU_ASSERT_EQUAL(fsdp_sim_kernel_exec(&d0), FSDP_OK);
        for (int launch = 0; launch < 3; launch++)
            CU_ASSERT_EQUAL(fsdp_sim_kernel_exec_par(&d1, NULL, &cache), FSDP_OK);
        CU_ASSERT(memcmp(c0, c1, m * n * sizeof(float)) == 0);
        CU_ASSERT_EQUAL(cache.packs, 0);
        CU_ASSERT_EQUAL(held, 0);
        cache.limit = 2 * bytes; /* now it fits */
        CU_ASSERT_EQUAL(fsdp_sim_kernel_exec_par(&d1, NULL, &cache), FSDP_OK);
        CU_ASSERT_EQUAL(cache.packs, 1);
        CU_ASSERT_EQUAL(held, bytes);
        fsdp_sim_pack_cache_drop(&cache);
        CU_ASSERT_EQUAL(held, 0);

        cache.max_rows = m - 1; /* too many rows to be worth it */
        for (int launch = 0; launch < 3; launch++)
            CU_ASSERT_EQUAL(fsdp_sim_kernel_exec_par(&d1, NULL, &cache), FSDP_OK);
        CU_ASSERT_EQUAL(cache.packs, 1);
        CU_ASSERT_EQUAL(held, 0);
        cache.max_rows = m;

        /* a product that fails while it would pack (A missing): nothing kept, packed again */
        memset(c1, 0, sizeof(c1));
        CU_ASSERT_EQUAL(fsdp_sim_kernel_exec_par(&d1, NULL, &cache), FSDP_OK); /* the key */
        d1.u.gemm.a = NULL;
        log_begin();
        CU_ASSERT_EQUAL(fsdp_sim_kernel_exec_par(&d1, NULL, &cache), FSDP_ERR_INVALID_PARAM);
        log_end();
        CU_ASSERT_EQUAL(cache.packs, 1);
        CU_ASSERT_EQUAL(cache.valid, 0);
        d1.u.gemm.a = a;
        for (int launch = 0; launch < 2; launch++) {
            memset(c1, 0, sizeof(c1));
            CU_ASSERT_EQUAL(fsdp_sim_kernel_exec_par(&d1, NULL, &cache), FSDP_OK);
            CU_ASSERT(memcmp(c0, c1, m * n * sizeof(float)) == 0);
        }
        CU_ASSERT_EQUAL(cache.packs, 2);
        CU_ASSERT_EQUAL(cache.hits, 1);
        fsdp_sim_pack_cache_drop(&cache);

        d1.u.gemm.batch = 2; /* two products: B differs between them */
        d1.u.gemm.stride_a = 0;
        d1.u.gemm.stride_b = k * n;
        d1.u.gemm.stride_c = m * n;
        d0 = d1;
        d0.u.gemm.c = c0;
        d0.u.gemm.b_version = 0;
        CU_ASSERT_EQUAL(fsdp_sim_kernel_exec(&d0), FSDP_OK);
        for (int launch = 0; launch < 3; launch++)
            CU_ASSERT_EQUAL(fsdp_sim_kernel_exec_par(&d1, NULL, &cache), FSDP_OK);
        CU_ASSERT(memcmp(c0, c1, 2 * m * n * sizeof(float)) == 0);
        CU_ASSERT_EQUAL(cache.packs, 2);

        d1 = gemm_desc(1, m, n, k, a, b, c1, FSDP_DTYPE_F32, NULL, 3);
        d1.u.gemm.ldb = k - 1; /* refused by the product, not read by the cache */
        log_begin();
        for (int launch = 0; launch < 3; launch++)
            CU_ASSERT_EQUAL(fsdp_sim_kernel_exec_par(&d1, NULL, &cache), FSDP_ERR_INVALID_PARAM);
        log_end();
        CU_ASSERT_EQUAL(log_count, 3);
        CU_ASSERT_EQUAL(cache.packs, 2);
        CU_ASSERT_EQUAL(held, 0);
    }

    { /* packed only when the version before had min_launches launches: versions of 4, 4, 2
       * and 3 launches pack the second (read twice) and the third (read never) */
        static const int launches[] = {4, 4, 2, 3};
        size_t m = 8, n = 40, k = 30, held = 0;
        float a[8 * 30], b[30 * 40], c0[8 * 40], c1[8 * 40];
        fsdp_sim_pack_cache_t cache;
        fsdp_kernel_t d0, d1;
        memset(&cache, 0, sizeof(cache));
        cache.held = &held;
        cache.limit = SIZE_MAX;
        cache.max_rows = m;
        cache.min_launches = 4;
        fill_rand(a, 8 * 30, -1, 1);
        d0 = gemm_desc(1, m, n, k, a, b, c0, FSDP_DTYPE_F32, NULL, 0);
        for (int v = 0; v < 4; v++) {
            fill_rand(b, 30 * 40, -1, 1); /* new values, new version */
            CU_ASSERT_EQUAL(fsdp_sim_kernel_exec(&d0), FSDP_OK);
            d1 = gemm_desc(1, m, n, k, a, b, c1, FSDP_DTYPE_F32, NULL, 100 + (uint64_t)v);
            for (int l = 0; l < launches[v]; l++) {
                memset(c1, 0, sizeof(c1));
                CU_ASSERT_EQUAL(fsdp_sim_kernel_exec_par(&d1, NULL, &cache), FSDP_OK);
                CU_ASSERT(memcmp(c0, c1, sizeof(c1)) == 0);
            }
        }
        CU_ASSERT_EQUAL(cache.packs, 2);
        CU_ASSERT_EQUAL(cache.hits, 2);
        fsdp_sim_pack_cache_drop(&cache);
        CU_ASSERT_EQUAL(held, 0);
    }
    fsdp_sim_pool_destroy(pools[1]);
    fsdp_sim_pool_destroy(pools[2]);
}

/* Results do not depend on the micro-kernel: every path this CPU runs (the generic one, AVX2)
 * gives the bits of the generic one, on random shapes (odd sizes, several A blocks, several k
 * blocks, a second B panel), every transpose, padded leading dimensions, f32, bf16 and f16
 * operands, an f32 or a 16-bit C, alpha and beta, and epilogues. */
static void test_gemm_isa_bits(void)
{
    static const fsdp_sim_gemm_isa_t isas[] = {FSDP_SIM_GEMM_GENERIC, FSDP_SIM_GEMM_AVX2};
    static const fsdp_dtype_t dts[] = {FSDP_DTYPE_F32, FSDP_DTYPE_BF16, FSDP_DTYPE_F16};
    static const float alphas[] = {1.0f, 0.75f, -1.5f}, betas[] = {0.0f, 1.0f, 0.5f};
    const int ncases = 48;
    int bad = 0, paths = 0;

    test_seed(2);
    for (int t = 0; t < ncases; t++) {
        /* mostly small, some past an A block (144 rows), k blocks (256) or a B panel (3072) */
        size_t m = 1 + test_index(t % 4 == 1 ? 400 : 60);
        size_t n = 1 + test_index(t % 4 == 2 ? 300 : 90);
        size_t k = 1 + test_index(t % 4 == 3 ? 700 : 120);
        int ta = t & 1, tb = (t >> 1) & 1, epi_kind = t % 3;
        fsdp_dtype_t dt = dts[(t / 4) % 3];
        fsdp_dtype_t cdt = (t / 12) % 2 ? dt : FSDP_DTYPE_F32;
        float alpha = alphas[t % 3], beta = betas[(t / 3) % 3];
        size_t lda = (ta ? m : k) + test_index(3), ldb = (tb ? k : n) + test_index(3);
        size_t ldc = n + test_index(3), cbytes = m * ldc * fsdp_dtype_size(cdt);
        fsdp_gemm_epilogue_t epi;
        float *a, *b, *bias, *c0, *c1, *cinit;

        if (t == ncases - 1) { /* two B panels of 3072 columns */
            m = 7;
            n = 3100;
            k = 20;
            lda = ta ? m : k;
            ldb = tb ? k : n;
            ldc = n;
            cbytes = m * ldc * fsdp_dtype_size(cdt);
        }
        a = malloc((ta ? k : m) * lda * sizeof(float));
        b = malloc((tb ? n : k) * ldb * sizeof(float));
        bias = malloc(n * sizeof(float));
        c0 = malloc(cbytes);
        c1 = malloc(cbytes);
        cinit = malloc(m * ldc * sizeof(float));
        CU_ASSERT_FATAL(a && b && bias && c0 && c1 && cinit);
        fill_rand(a, (ta ? k : m) * lda, -1, 1);
        fill_rand(b, (tb ? n : k) * ldb, -1, 1);
        fill_rand(bias, n, -1, 1);
        fill_rand(cinit, m * ldc, -1, 1);
        if (dt != FSDP_DTYPE_F32) { /* 16-bit operands: the upper halves of the f32 values */
            uint16_t *a16 = (uint16_t *)a, *b16 = (uint16_t *)b;
            for (size_t i = 0; i < (ta ? k : m) * lda; i++)
                a16[i] = (uint16_t)(test_f32_bits(a[i]) >> 16);
            for (size_t i = 0; i < (tb ? n : k) * ldb; i++)
                b16[i] = (uint16_t)(test_f32_bits(b[i]) >> 16);
        }
        if (cdt != FSDP_DTYPE_F32) {
            uint16_t *c16 = (uint16_t *)cinit;
            for (size_t i = 0; i < m * ldc; i++)
                c16[i] = (uint16_t)(test_f32_bits(cinit[i]) >> 16);
        }
        memset(&epi, 0, sizeof(epi));
        epi.bias = bias;
        epi.bias_dtype = FSDP_DTYPE_F32;
        epi.act = epi_kind == 1 ? FSDP_ACT_GELU_TANH : FSDP_ACT_RELU;
        for (size_t i = 0; i < sizeof(isas) / sizeof(isas[0]); i++) {
            float *c = i == 0 ? c0 : c1;
            if (!fsdp_sim_gemm_set_isa(isas[i])) {
                CU_ASSERT(i > 0);
                continue;
            }
            memcpy(c, cinit, cbytes);
            CU_ASSERT_EQUAL(fsdp_sim_gemm_ex(ta, tb, m, n, k, alpha, a, dt, lda, b, dt, ldb, beta,
                                             c, cdt, ldc, epi_kind ? &epi : NULL),
                            FSDP_OK);
            if (i == 0)
                continue;
            paths++;
            if (memcmp(c0, c1, cbytes) != 0) {
                bad++;
                fprintf(stderr,
                        "\n%s: %zux%zux%zu ta %d tb %d %s C %s alpha %g beta %g epi %d differs",
                        fsdp_sim_gemm_isa_name(), m, n, k, ta, tb, fsdp_dtype_name(dt),
                        fsdp_dtype_name(cdt), alpha, beta, epi_kind);
            }
        }
        free(a);
        free(b);
        free(bias);
        free(c0);
        free(c1);
        free(cinit);
    }
    if (paths == 0)
        fprintf(stderr, "(no avx2 here: only the generic micro-kernel checked) ");
    CU_ASSERT(fsdp_sim_gemm_set_isa(FSDP_SIM_GEMM_AUTO));
    CU_ASSERT_EQUAL(bad, 0);
}

static void test_gemm_degenerate(void)
{
    float a[6] = {NAN, NAN, NAN, NAN, NAN, NAN}, b[6] = {1, 2, 3, 4, 5, 6};
    float c[6] = {NAN, 1, 2, 3, 4, 5};
    fsdp_kernel_t k = {.kind = FSDP_K_GEMM};

    /* k == 0 with beta == 0: zeros, even over NaN */
    k.u.gemm.m = 2;
    k.u.gemm.n = 3;
    k.u.gemm.k = 0;
    k.u.gemm.alpha = 1.0f;
    k.u.gemm.ldc = 3;
    k.u.gemm.c = c;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    for (int i = 0; i < 6; i++)
        CU_ASSERT_EQUAL(c[i], 0.0f);
    /* alpha == 0: A (NaN here) is not read, C = beta C */
    for (int i = 0; i < 6; i++)
        c[i] = (float)i;
    k.u.gemm.k = 2;
    k.u.gemm.a = a;
    k.u.gemm.lda = 2;
    k.u.gemm.b = b;
    k.u.gemm.ldb = 3;
    k.u.gemm.alpha = 0.0f;
    k.u.gemm.beta = 0.5f;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    for (int i = 0; i < 6; i++)
        CU_ASSERT_EQUAL(c[i], 0.5f * (float)i);
    /* m == 0: nothing to do, NULL pointers fine */
    memset(&k.u.gemm, 0, sizeof(k.u.gemm));
    k.u.gemm.n = 4;
    k.u.gemm.k = 4;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
}

/* ---- casts and element-wise kernels ------------------------------------------------------ */

/* Round to nearest even onto a grid of 2^-p relative spacing, with exponent floor emin (the
 * smallest normal exponent: below it the spacing stays that of emin) and overflow threshold,
 * computed with double arithmetic: an independent model of bf16 (p 8, emin -126) and f16
 * (p 11, emin -14, max 65504). */
static double ref_round(double x, int p, int emin, double maxv)
{
    if (isnan(x) || isinf(x) || x == 0.0)
        return x;
    int e;
    frexp(fabs(x), &e); /* |x| = f 2^e, f in [0.5, 1) */
    e -= 1;             /* |x| = 1.f 2^e */
    if (e < emin)
        e = emin;
    double ulp = ldexp(1.0, e - (p - 1));
    double r = nearbyint(x / ulp) * ulp; /* default rounding mode: to nearest, ties to even */
    if (maxv > 0.0 && fabs(r) > maxv)
        return copysign(INFINITY, x);
    return r;
}

static void test_cast_round_trips(void)
{
    enum { N = 4096 };
    float *x = malloc(N * sizeof(float)), *back = malloc(N * sizeof(float));
    uint16_t *h = malloc(N * sizeof(uint16_t)), *h2 = malloc(N * sizeof(uint16_t));
    fsdp_kernel_t k = {.kind = FSDP_K_CAST};
    int bad = 0;

    CU_ASSERT_FATAL(x && back && h && h2);
    test_seed(3);
    for (size_t i = 0; i < N; i++) /* magnitudes from 2^-30 to 2^20, both signs */
        x[i] = (float)(ldexp(test_rand(1.0, 2.0), (int)test_rand(-30, 20)) * (i % 2 ? -1.0 : 1.0));
    x[0] = 0.0f;
    x[1] = -0.0f;
    x[2] = INFINITY;
    x[3] = -INFINITY;
    x[4] = NAN;
    x[5] = 65504.0f;
    x[6] = 65520.0f;       /* f16: rounds to infinity */
    x[7] = 0x1p-24f;       /* f16: smallest subnormal */
    x[8] = 0x1p-25f;       /* f16: tie to even, zero */
    x[9] = 1.0f + 0x1p-8f; /* bf16: tie to even */
    x[10] = 3.4e38f;
    x[11] = 0x1.fffffep127f; /* bf16: rounds to infinity */

    for (int f16 = 0; f16 < 2; f16++) {
        fsdp_dtype_t d = f16 ? FSDP_DTYPE_F16 : FSDP_DTYPE_BF16;
        k.u.cast.src = x;
        k.u.cast.src_dtype = FSDP_DTYPE_F32;
        k.u.cast.dst = h;
        k.u.cast.dst_dtype = d;
        k.u.cast.n = N;
        CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
        k.u.cast.src = h;
        k.u.cast.src_dtype = d;
        k.u.cast.dst = back;
        k.u.cast.dst_dtype = FSDP_DTYPE_F32;
        CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
        for (size_t i = 0; i < N; i++) {
            double want =
                f16 ? ref_round(x[i], 11, -14, 65504.0) : ref_round(x[i], 8, -126, 0x1.fep127);
            if (!(back[i] == want || (isnan(want) && isnan(back[i]))) ||
                signbit(back[i]) != signbit(x[i])) {
                if (bad++ < 5)
                    fprintf(stderr, "%s: %a -> %a, want %a\n", f16 ? "f16" : "bf16", x[i], back[i],
                            want);
            }
            /* the kernel and the public conversion agree bit for bit */
            uint16_t pub = f16 ? fsdp_f32_to_f16(x[i]) : fsdp_f32_to_bf16(x[i]);
            if (pub != h[i] && bad++ < 5)
                fprintf(stderr, "%s: kernel %04x, public %04x\n", f16 ? "f16" : "bf16", h[i], pub);
        }
        /* a 16-bit value survives the round trip through f32 exactly */
        k.u.cast.src = back;
        k.u.cast.src_dtype = FSDP_DTYPE_F32;
        k.u.cast.dst = h2;
        k.u.cast.dst_dtype = d;
        CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
        for (size_t i = 0; i < N; i++)
            if (h2[i] != h[i] && !isnan(back[i]))
                bad++;
    }
    /* bf16 -> f16 goes through f32: each value rounds once more to the f16 grid */
    k.u.cast.src = x;
    k.u.cast.src_dtype = FSDP_DTYPE_F32;
    k.u.cast.dst = h;
    k.u.cast.dst_dtype = FSDP_DTYPE_BF16;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    k.u.cast.src = h;
    k.u.cast.src_dtype = FSDP_DTYPE_BF16;
    k.u.cast.dst = h2;
    k.u.cast.dst_dtype = FSDP_DTYPE_F16;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    for (size_t i = 12; i < N; i++)
        if (fsdp_f16_to_f32(h2[i]) != (float)ref_round(fsdp_bf16_to_f32(h[i]), 11, -14, 65504.0))
            bad++;
    CU_ASSERT_EQUAL(bad, 0);
    free(x);
    free(back);
    free(h);
    free(h2);
}

static void test_cast_int_and_copy(void)
{
    int32_t iv[6] = {0, -7, 16777217, INT32_MAX, INT32_MIN, 123}, io[6];
    float f[6] = {1.9f, -1.9f, 3e9f, -3e9f, NAN, 16777216.0f}, fo[6];
    fsdp_kernel_t k = {.kind = FSDP_K_CAST};

    /* same dtype: a bit copy, exact for i32 beyond 2^24 */
    k.u.cast.dst = io;
    k.u.cast.dst_dtype = FSDP_DTYPE_I32;
    k.u.cast.src = iv;
    k.u.cast.src_dtype = FSDP_DTYPE_I32;
    k.u.cast.n = 6;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    CU_ASSERT(memcmp(io, iv, sizeof(iv)) == 0);
    /* in place, same dtype: nothing changes */
    k.u.cast.dst = iv;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    CU_ASSERT(memcmp(io, iv, sizeof(iv)) == 0);
    /* f32 -> i32: toward zero, saturated, NaN as 0 (CUDA's conversion) */
    k.u.cast.dst = io;
    k.u.cast.src = f;
    k.u.cast.src_dtype = FSDP_DTYPE_F32;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    CU_ASSERT_EQUAL(io[0], 1);
    CU_ASSERT_EQUAL(io[1], -1);
    CU_ASSERT_EQUAL(io[2], INT32_MAX);
    CU_ASSERT_EQUAL(io[3], INT32_MIN);
    CU_ASSERT_EQUAL(io[4], 0);
    CU_ASSERT_EQUAL(io[5], 16777216);
    /* i32 -> f32 rounds to nearest */
    k.u.cast.dst = fo;
    k.u.cast.dst_dtype = FSDP_DTYPE_F32;
    k.u.cast.src = iv;
    k.u.cast.src_dtype = FSDP_DTYPE_I32;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    for (int i = 0; i < 6; i++)
        CU_ASSERT_EQUAL(fo[i], (float)iv[i]);
}

static void expect_invalid(const fsdp_kernel_t *k, const char *what);

/* chunk_copy (FSDP2's copy-out and chunk-cat) against a plain loop: blocks with their own
 * leading dimensions, the source cut at src_n into zeros, f32 to bf16 rounded once, bf16 to
 * bf16 bit for bit (NaN payloads), one launch split across threads as any element-wise kind;
 * a leading dimension below the columns is refused. */
static void test_chunk_copy(void)
{
    enum { ROWS = 5, COLS = 37, SLD = 41, DLD = 50, N = ROWS * SLD };
    static float src[N], dst[ROWS * DLD];
    static uint16_t src16[N], dst16[ROWS * DLD];
    fsdp_kernel_t k = {.kind = FSDP_K_CHUNK_COPY};
    size_t src_n = 3 * SLD + 11; /* rows 0-2 whole, row 3 in part, row 4 none */
    int bad = 0;

    test_seed(77);
    fill_rand(src, N, -3.0, 3.0);
    for (size_t i = 0; i < N; i++)
        src16[i] = fsdp_f32_to_bf16(src[i]);
    src16[7] = 0x7fc1; /* a NaN with a payload: copied as it is */
    for (size_t i = 0; i < ROWS * DLD; i++) {
        dst[i] = -1.0f;
        dst16[i] = 0xbeef;
    }
    k.u.chunk_copy = (typeof(k.u.chunk_copy)){.dst = dst16, .dst_dtype = FSDP_DTYPE_BF16,
                                              .dst_ld = DLD, .src = src, .src_dtype = FSDP_DTYPE_F32,
                                              .src_ld = SLD, .src_n = src_n, .rows = ROWS,
                                              .cols = COLS};
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    for (size_t r = 0; r < ROWS; r++) {
        for (size_t c = 0; c < DLD; c++) {
            size_t s = r * SLD + c;
            uint16_t want = c >= COLS ? 0xbeef : s < src_n ? fsdp_f32_to_bf16(src[s]) : 0;
            bad += dst16[r * DLD + c] != want;
        }
    }
    CU_ASSERT_EQUAL(bad, 0);

    k.u.chunk_copy = (typeof(k.u.chunk_copy)){.dst = dst, .dst_dtype = FSDP_DTYPE_F32,
                                              .dst_ld = DLD, .src = src16,
                                              .src_dtype = FSDP_DTYPE_BF16, .src_ld = SLD,
                                              .src_n = SIZE_MAX, .rows = ROWS, .cols = COLS};
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    bad = 0;
    for (size_t r = 0; r < ROWS; r++)
        for (size_t c = 0; c < COLS; c++)
            bad += test_f32_bits(dst[r * DLD + c]) !=
                   test_f32_bits(fsdp_bf16_to_f32(src16[r * SLD + c]));
    CU_ASSERT_EQUAL(bad, 0);

    uint16_t out16[ROWS * COLS];
    k.u.chunk_copy = (typeof(k.u.chunk_copy)){.dst = out16, .dst_dtype = FSDP_DTYPE_BF16,
                                              .dst_ld = COLS, .src = src16,
                                              .src_dtype = FSDP_DTYPE_BF16, .src_ld = SLD,
                                              .src_n = SIZE_MAX, .rows = ROWS, .cols = COLS};
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    CU_ASSERT_EQUAL(out16[7], 0x7fc1);
    bad = 0;
    for (size_t r = 0; r < ROWS; r++)
        for (size_t c = 0; c < COLS; c++)
            bad += out16[r * COLS + c] != src16[r * SLD + c];
    CU_ASSERT_EQUAL(bad, 0);

    /* a gradient that is all past its end: zeros, and no source needed */
    k.u.chunk_copy.src = NULL;
    k.u.chunk_copy.src_n = 0;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    bad = 0;
    for (size_t i = 0; i < ROWS * COLS; i++)
        bad += out16[i] != 0;
    CU_ASSERT_EQUAL(bad, 0);

    k.u.chunk_copy.src = src16;
    k.u.chunk_copy.src_n = N;
    k.u.chunk_copy.src_ld = COLS - 1;
    expect_invalid(&k, "chunk_copy with a leading dimension below the columns");
}

/* One group_copy of nparts parts into dst: on the calling thread (pool NULL) or cut across the
 * pool's threads as the sim's --threads cuts it. */
static void run_group(fsdp_copy_part_t *parts, size_t nparts, fsdp_sim_pool_t *pool)
{
    fsdp_kernel_t k = {.kind = FSDP_K_GROUP_COPY};

    k.u.group_copy.parts = parts;
    k.u.group_copy.nparts = nparts;
    CU_ASSERT_EQUAL(fsdp_sim_kernel_exec_par(&k, pool, NULL), FSDP_OK);
}

/* The per-parameter launches a group_copy replaces: a chunk_copy a part, and the sum of their
 * bytes, which is the group's (one launch of them all). */
static void run_per_part(const fsdp_copy_part_t *parts, size_t nparts, const fsdp_kernel_t *g)
{
    double bytes = 0.0, b, flops;

    for (size_t j = 0; j < nparts; j++) {
        fsdp_kernel_t k = {.kind = FSDP_K_CHUNK_COPY};
        const fsdp_copy_part_t *q = &parts[j];
        k.u.chunk_copy = (typeof(k.u.chunk_copy)){.dst = q->dst,
                                                  .dst_dtype = q->dst_dtype,
                                                  .dst_ld = q->dst_ld,
                                                  .src = q->src,
                                                  .src_dtype = q->src_dtype,
                                                  .src_ld = q->src_ld,
                                                  .src_n = q->src_n,
                                                  .rows = q->rows,
                                                  .cols = q->cols};
        CU_ASSERT_EQUAL(run(&k), FSDP_OK);
        fsdp_kernel_cost(&k, &flops, &b);
        bytes += b;
    }
    fsdp_kernel_cost(g, &flops, &b);
    CU_ASSERT_EQUAL(b, bytes);
    CU_ASSERT_EQUAL(flops, 0.0);
}

/* group_copy against the chunk_copy per parameter that FSDP2 ran before, byte for byte, at
 * W = 3 and 5 in f32 and bf16: the copy-out (block j of O, W x A, into each parameter's U), the
 * chunk-cat (each gradient's W chunks into I, zero-padded past its end, f32 and bf16 sources
 * cast to the reduce dtype) and the relayout (the reduced chunks into the f32 shard, zeros in a
 * frozen parameter's slot). The parameters: 37 rows (padded), 2 rows (high ranks own none: empty
 * shards), 1 row, [4, 0] (an empty part) and 1000 x 70 (a launch past 2^16 elements, cut across
 * threads). Every buffer starts as the same garbage; what no part covers stays garbage. A part
 * whose first is not the count of the elements before it is refused. */
static void test_group_copy(void)
{
    enum { P = 5 };
    static const size_t rows[P] = {37, 2, 1, 4, 1000}, rest[P] = {3, 5, 7, 0, 70};
    static const int worlds[] = {3, 5};
    static const fsdp_dtype_t dts[] = {FSDP_DTYPE_F32, FSDP_DTYPE_BF16};
    fsdp_sim_pool_t *pool = fsdp_sim_pool_create(3);
    fsdp_copy_part_t parts[P];
    fsdp_kernel_t g = {.kind = FSDP_K_GROUP_COPY};

    CU_ASSERT_FATAL(pool != NULL);
    test_seed(91);
    for (size_t wi = 0; wi < sizeof(worlds) / sizeof(worlds[0]); wi++) {
        size_t w = (size_t)worlds[wi], chunk[P], slot[P], numel[P], a = 0, total = 0;
        for (int j = 0; j < P; j++) {
            chunk[j] = (rows[j] + w - 1) / w * rest[j];
            slot[j] = a;
            a += chunk[j];
            numel[j] = rows[j] * rest[j];
            total += numel[j];
        }
        /* sources: O (W x A), the gradients in f32 and in bf16, a reduced row (A) */
        float *o32 = malloc(w * a * 4), *g32 = malloc(total * 4);
        uint16_t *o16 = malloc(w * a * 2), *g16 = malloc(total * 2);
        unsigned char *want = malloc(w * a * 4), *got = malloc(w * a * 4);
        CU_ASSERT_FATAL(o32 && g32 && o16 && g16 && want && got);
        fill_rand(o32, w * a, -3.0, 3.0);
        fill_rand(g32, total, -3.0, 3.0);
        for (size_t i = 0; i < w * a; i++)
            o16[i] = fsdp_f32_to_bf16(o32[i] * 0.7f);
        for (size_t i = 0; i < total; i++)
            g16[i] = fsdp_f32_to_bf16(g32[i] * 1.3f);
        for (size_t d = 0; d < 2; d++) {
            const fsdp_dtype_t dt = dts[d];
            const size_t es = fsdp_dtype_size(dt);
            const void *o = dt == FSDP_DTYPE_F32 ? (const void *)o32 : (const void *)o16;
            for (int pass = 0; pass < 6; pass++) { /* 3 copies, each on 1 and 3 threads */
                const int what = pass / 2;
                size_t first = 0, goff = 0;
                memset(want, 0xa5, w * a * 4);
                memset(got, 0xa5, w * a * 4);
                for (int j = 0; j < P; j++) {
                    fsdp_copy_part_t *q = &parts[j];
                    if (what == 0) /* copy-out: U of parameter j at W x its slot */
                        *q = (fsdp_copy_part_t){.dst = want + w * slot[j] * es,
                                                .dst_dtype = dt,
                                                .dst_ld = chunk[j],
                                                .src = (char *)o + slot[j] * es,
                                                .src_dtype = dt,
                                                .src_ld = a,
                                                .src_n = SIZE_MAX,
                                                .rows = w,
                                                .cols = chunk[j]};
                    else if (what == 1) /* chunk-cat: odd parameters' gradients in bf16 */
                        *q = (fsdp_copy_part_t){
                            .dst = want + slot[j] * es,
                            .dst_dtype = dt,
                            .dst_ld = a,
                            .src = j % 2 ? (const void *)(g16 + goff) : (const void *)(g32 + goff),
                            .src_dtype = j % 2 ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32,
                            .src_ld = chunk[j],
                            .src_n = numel[j],
                            .rows = w,
                            .cols = chunk[j]};
                    else /* relayout: parameter 1 frozen (zeros), the others from a row of dt */
                        *q = (fsdp_copy_part_t){.dst = want + slot[j] * 4,
                                                .dst_dtype = FSDP_DTYPE_F32,
                                                .dst_ld = chunk[j],
                                                .src = j == 1 ? NULL : (char *)o + slot[j] * es,
                                                .src_dtype = dt,
                                                .src_ld = chunk[j],
                                                .src_n = j == 1 ? 0 : chunk[j],
                                                .rows = 1,
                                                .cols = chunk[j]};
                    q->first = first;
                    first += q->rows * q->cols;
                    goff += numel[j];
                }
                CU_ASSERT(what == 2 || first == w * a);
                g.u.group_copy.parts = parts;
                g.u.group_copy.nparts = P;
                run_per_part(parts, P, &g);
                for (int j = 0; j < P; j++)
                    parts[j].dst = got + ((unsigned char *)parts[j].dst - want);
                run_group(parts, P, pass % 2 ? pool : NULL);
                if (memcmp(want, got, w * a * 4) != 0)
                    fprintf(stderr, "\n  group_copy W = %zu, %s, copy %d, %d thread(s) differs\n",
                            w, fsdp_dtype_name(dt), what, pass % 2 ? 3 : 1);
                CU_ASSERT(memcmp(want, got, w * a * 4) == 0);
            }
        }
        free(o32);
        free(g32);
        free(o16);
        free(g16);
        free(want);
        free(got);
    }
    fsdp_sim_pool_destroy(pool);

    parts[2].first++;
    expect_invalid(&g, "group_copy with a part's first past the count before it");
    g.u.group_copy.parts = NULL;
    expect_invalid(&g, "group_copy with no table");
}

static void test_fill(void)
{
    float f[5];
    uint16_t h[5];
    int32_t iv[5];
    fsdp_kernel_t k = {.kind = FSDP_K_FILL};

    k.u.fill.x = f;
    k.u.fill.dtype = FSDP_DTYPE_F32;
    k.u.fill.n = 5;
    k.u.fill.value = 0.1;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    for (int i = 0; i < 5; i++)
        CU_ASSERT_EQUAL(f[i], 0.1f);
    k.u.fill.x = h;
    k.u.fill.dtype = FSDP_DTYPE_BF16;
    k.u.fill.value = -3.0;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    for (int i = 0; i < 5; i++)
        CU_ASSERT_EQUAL(h[i], 0xc040);
    k.u.fill.dtype = FSDP_DTYPE_F16;
    k.u.fill.value = 1.0;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    for (int i = 0; i < 5; i++)
        CU_ASSERT_EQUAL(h[i], 0x3c00);
    k.u.fill.x = iv;
    k.u.fill.dtype = FSDP_DTYPE_I32;
    k.u.fill.value = 16777217.0; /* exact in i32, not in f32 */
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    CU_ASSERT_EQUAL(iv[4], 16777217);
    k.u.fill.value = 1e12;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    CU_ASSERT_EQUAL(iv[0], INT32_MAX);
    k.u.fill.value = NAN;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    CU_ASSERT_EQUAL(iv[2], 0);
}

/* scale, div and axpy compute in f32 and round once into the destination dtype. */
static void test_scale_div_axpy(void)
{
    enum { N = 257 };
    float x[N], y[N], x0[N], y0[N];
    uint16_t hb[N], hx[N];
    fsdp_kernel_t k;
    int bad = 0;

    test_seed(4);
    fill_rand(x0, N, -3, 3);
    fill_rand(y0, N, -3, 3);
    memcpy(x, x0, sizeof(x));
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_SCALE;
    k.u.scale.x = x;
    k.u.scale.dtype = FSDP_DTYPE_F32;
    k.u.scale.n = N;
    k.u.scale.alpha = 0.37f;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    for (int i = 0; i < N; i++)
        bad += x[i] != x0[i] * 0.37f;
    k.kind = FSDP_K_DIV;
    k.u.scale.alpha = 3.0f;
    memcpy(x, x0, sizeof(x));
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    for (int i = 0; i < N; i++)
        bad += x[i] != x0[i] / 3.0f; /* a true division, not a multiply by 1/3 */
    /* bf16 in place: load, multiply in f32, round to bf16 */
    for (int i = 0; i < N; i++)
        hb[i] = fsdp_f32_to_bf16(x0[i]);
    k.kind = FSDP_K_SCALE;
    k.u.scale.x = hb;
    k.u.scale.dtype = FSDP_DTYPE_BF16;
    k.u.scale.alpha = 0.37f;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    for (int i = 0; i < N; i++)
        bad += hb[i] != fsdp_f32_to_bf16(fsdp_bf16_to_f32(fsdp_f32_to_bf16(x0[i])) * 0.37f);
    /* axpy f32 += alpha * f32 */
    memcpy(y, y0, sizeof(y));
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_AXPY;
    k.u.axpy.y = y;
    k.u.axpy.y_dtype = FSDP_DTYPE_F32;
    k.u.axpy.x = x0;
    k.u.axpy.x_dtype = FSDP_DTYPE_F32;
    k.u.axpy.n = N;
    k.u.axpy.alpha = -0.5f;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    for (int i = 0; i < N; i++)
        bad += y[i] != y0[i] + -0.5f * x0[i];
    /* axpy f32 += alpha * f16 (a low-precision gradient into an f32 accumulator) */
    for (int i = 0; i < N; i++)
        hx[i] = fsdp_f32_to_f16(x0[i]);
    memcpy(y, y0, sizeof(y));
    k.u.axpy.x = hx;
    k.u.axpy.x_dtype = FSDP_DTYPE_F16;
    k.u.axpy.alpha = 2.0f;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    for (int i = 0; i < N; i++)
        bad += y[i] != y0[i] + 2.0f * fsdp_f16_to_f32(hx[i]);
    CU_ASSERT_EQUAL(bad, 0);
}

static void test_bias_relu(void)
{
    enum { R = 7, C = 13 };
    float y[R * C], y0[R * C], bias[C], dbias[C], dy[R * C], dx[R * C];
    fsdp_kernel_t k;
    int bad = 0;

    test_seed(5);
    fill_rand(y0, R * C, -1, 1);
    fill_rand(bias, C, -1, 1);
    memcpy(y, y0, sizeof(y));
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_BIAS_ADD;
    k.u.bias_add.y = y;
    k.u.bias_add.bias = bias;
    k.u.bias_add.rows = R;
    k.u.bias_add.cols = C;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            bad += y[r * C + c] != y0[r * C + c] + bias[c];
    /* bias_grad accumulates: dbias += (the sum of lanes.h's column shape, in f32: row r in row
     * lane r % 32, the lanes meeting in the butterfly) */
    fill_rand(dy, R * C, -1, 1);
    for (int c = 0; c < C; c++)
        dbias[c] = (float)c;
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_BIAS_GRAD;
    k.u.bias_grad.dbias = dbias;
    k.u.bias_grad.dy = dy;
    k.u.bias_grad.rows = R;
    k.u.bias_grad.cols = C;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    for (int c = 0; c < C; c++) {
        float lane[FSDP_KB_ROW_LANES] = {0.0f}, s;
        double sd = 0.0;
        for (int r = 0; r < R; r++) {
            lane[r % FSDP_KB_ROW_LANES] += dy[r * C + c];
            sd += dy[r * C + c];
        }
        s = fsdp_kb_lane_tree(lane);
        bad += dbias[c] != (float)c + s; /* exactly that order */
        bad += fabs(dbias[c] - ((double)c + sd)) > gamma_n(R + 1) * (R + c);
    }
    /* relu, in place */
    memcpy(y, y0, sizeof(y));
    y[0] = 0.0f;
    y[1] = -0.0f;
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_RELU_FWD;
    k.u.relu_fwd.y = y;
    k.u.relu_fwd.x = y;
    k.u.relu_fwd.n = R * C;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    for (int i = 2; i < R * C; i++)
        bad += y[i] != (y0[i] > 0.0f ? y0[i] : 0.0f);
    bad += y[0] != 0.0f || y[1] != 0.0f;
    /* relu backward, in place on dy, masked by the output y > 0 */
    memcpy(dx, dy, sizeof(dx));
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_RELU_BWD;
    k.u.relu_bwd.dx = dx;
    k.u.relu_bwd.dy = dx;
    k.u.relu_bwd.y = y;
    k.u.relu_bwd.n = R * C;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    for (int i = 0; i < R * C; i++)
        bad += dx[i] != (y[i] > 0.0f ? dy[i] : 0.0f);
    CU_ASSERT_EQUAL(bad, 0);
}

static void test_mse_sumsq(void)
{
    enum { N = 1001 };
    float y[N], t[N], dy[N], loss = -1.0f, out = -1.0f;
    uint16_t hb[N];
    fsdp_kernel_t k;
    double ref = 0.0;
    int bad = 0;

    test_seed(6);
    fill_rand(y, N, -2, 2);
    fill_rand(t, N, -2, 2);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_MSE_LOSS;
    k.u.mse.loss = &loss;
    k.u.mse.dy = dy;
    k.u.mse.y = y;
    k.u.mse.t = t;
    k.u.mse.n = N;
    k.u.mse.denom = (double)N;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    for (int i = 0; i < N; i++)
        ref += ((double)y[i] - t[i]) * ((double)y[i] - t[i]);
    ref /= N;
    /* the difference rounds once in f32 (relative u, 2u squared), the double sum adds nothing
     * visible, the store one more u */
    CU_ASSERT(fabs(loss - ref) <= 4 * U32 * ref);
    /* torch's mse_loss backward: (2 / n as f32) * (y - t) */
    for (int i = 0; i < N; i++)
        bad += dy[i] != (float)(2.0 / N) * (y[i] - t[i]);
    /* without dy, a sum over a denominator that is not n */
    k.u.mse.dy = NULL;
    k.u.mse.denom = 4.0;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    CU_ASSERT(fabs(loss - ref * N / 4.0) <= 4 * U32 * ref * N / 4.0);

    /* sumsq: each square is exact in double; only the final rounding to f32 remains */
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_SUMSQ;
    k.u.sumsq.out = &out;
    k.u.sumsq.x = y;
    k.u.sumsq.dtype = FSDP_DTYPE_F32;
    k.u.sumsq.n = N;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    ref = 0.0;
    for (int i = 0; i < N; i++)
        ref += (double)y[i] * y[i];
    CU_ASSERT(fabs(out - ref) <= 1.01 * U32 * ref);
    for (int i = 0; i < N; i++)
        hb[i] = fsdp_f32_to_bf16(y[i]);
    k.u.sumsq.x = hb;
    k.u.sumsq.dtype = FSDP_DTYPE_BF16;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    ref = 0.0;
    for (int i = 0; i < N; i++)
        ref += (double)fsdp_bf16_to_f32(hb[i]) * fsdp_bf16_to_f32(hb[i]);
    CU_ASSERT(fabs(out - ref) <= 1.01 * U32 * ref);
    k.u.sumsq.n = 0;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    CU_ASSERT_EQUAL(out, 0.0f);
    CU_ASSERT_EQUAL(bad, 0);
}

/* ---- validation: one error line, FSDP_ERR_INVALID_PARAM, nothing written ---------------- */

static void expect_invalid(const fsdp_kernel_t *k, const char *what)
{
    log_begin();
    fsdp_status_t s = run(k);
    log_end();
    if (s != FSDP_ERR_INVALID_PARAM || log_count != 1)
        fprintf(stderr, "%s: status %d, %d error lines (%s)\n", what, (int)s, log_count, log_last);
    CU_ASSERT_EQUAL(s, FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_EQUAL(log_count, 1);
}

static void test_validation(void)
{
    float buf[16] = {0}, loss;
    fsdp_kernel_t k;

    memset(&k, 0, sizeof(k));
    k.kind = (fsdp_kernel_kind_t)99;
    expect_invalid(&k, "unknown kind");
    CU_ASSERT(strstr(log_last, "unknown kind") != NULL);
    log_begin();
    CU_ASSERT_EQUAL(fsdp_sim_kernel_exec(NULL), FSDP_ERR_INVALID_PARAM);
    log_end();
    CU_ASSERT_EQUAL(log_count, 1);

    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_FILL;
    k.u.fill.n = 3;
    expect_invalid(&k, "fill NULL");
    CU_ASSERT(strstr(log_last, "fill") != NULL && strstr(log_last, "NULL") != NULL);
    k.u.fill.n = 0; /* nothing to do: NULL is fine */
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    k.u.fill.x = buf;
    k.u.fill.n = 3;
    k.u.fill.dtype = (fsdp_dtype_t)42;
    expect_invalid(&k, "fill dtype");

    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_SCALE;
    k.u.scale.x = buf;
    k.u.scale.n = 4;
    k.u.scale.dtype = FSDP_DTYPE_I32;
    expect_invalid(&k, "scale i32");

    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_CAST;
    k.u.cast.dst = buf;
    k.u.cast.src = buf;
    k.u.cast.n = 4;
    k.u.cast.src_dtype = FSDP_DTYPE_F32;
    k.u.cast.dst_dtype = FSDP_DTYPE_BF16;
    expect_invalid(&k, "cast in place across dtypes");
    k.u.cast.dst = buf + 1;
    expect_invalid(&k, "cast overlap");
    k.u.cast.dst = buf + 8;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK); /* 4 bf16 at buf+8 do not touch 4 f32 at buf */

    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_GEMM;
    k.u.gemm.m = 2;
    k.u.gemm.n = 2;
    k.u.gemm.k = 3;
    k.u.gemm.alpha = 1.0f;
    k.u.gemm.a = buf;
    k.u.gemm.lda = 2; /* < k */
    k.u.gemm.b = buf;
    k.u.gemm.ldb = 2;
    k.u.gemm.c = buf + 8;
    k.u.gemm.ldc = 2;
    expect_invalid(&k, "gemm lda");
    k.u.gemm.lda = 3;
    k.u.gemm.ldc = 1;
    expect_invalid(&k, "gemm ldc");
    k.u.gemm.ldc = 2;
    k.u.gemm.b = NULL;
    expect_invalid(&k, "gemm NULL b");

    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_MSE_LOSS;
    k.u.mse.loss = &loss;
    k.u.mse.y = buf;
    k.u.mse.t = buf;
    k.u.mse.n = 4;
    k.u.mse.denom = 0.0;
    expect_invalid(&k, "mse denom");
    k.u.mse.denom = NAN;
    expect_invalid(&k, "mse NaN denom");

    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_ADAMW;
    k.u.adamw.param = buf;
    k.u.adamw.grad = buf;
    k.u.adamw.exp_avg = buf;
    k.u.adamw.exp_avg_sq = buf;
    k.u.adamw.n = 2;
    k.u.adamw.step = 0;
    expect_invalid(&k, "adamw step 0");

    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_SGD;
    k.u.sgd.param = buf;
    k.u.sgd.grad = buf;
    k.u.sgd.n = 2;
    k.u.sgd.momentum = 0.9f;
    expect_invalid(&k, "sgd momentum without buffer");

    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_BIAS_ADD;
    k.u.bias_add.y = buf;
    k.u.bias_add.rows = 2;
    k.u.bias_add.cols = 2;
    expect_invalid(&k, "bias_add NULL bias");

    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_SUMSQ;
    k.u.sumsq.x = buf;
    k.u.sumsq.n = 2;
    expect_invalid(&k, "sumsq NULL out");
}

/* ---- optimizers against torch's formulas in double --------------------------------------- */

/* torch.optim.AdamW (single tensor), in double: the hyperparameters are the f32 values the
 * config holds, widened. */
static void ref_adamw(double *p, double g, double *m, double *v, double lr, double b1, double b2,
                      double eps, double wd, int64_t t)
{
    *p *= 1.0 - lr * wd;
    *m += (1.0 - b1) * (g - *m);
    *v = *v * b2 + (1.0 - b2) * g * g;
    double bc1 = 1.0 - pow(b1, (double)t), bc2 = 1.0 - pow(b2, (double)t);
    double denom = sqrt(*v) / sqrt(bc2) + eps;
    *p -= lr / bc1 * (*m / denom);
}

static void test_adamw(void)
{
    enum { N = 37, STEPS = 6 };
    static const struct {
        float lr, b1, b2, eps, wd;
        int64_t first_step;
    } cfgs[] = {
        {1e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f, 1},
        {0.05f, 0.8f, 0.99f, 1e-6f, 0.1f, 1},
        {1e-2f, 0.0f, 0.5f, 1e-3f, 0.0f, 1},
        {3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1000}, /* late steps: corrections near 1 */
    };
    float p[N], g[N], m[N], v[N];
    double pr[N], mr[N], vr[N], gmax = 0.0;
    double err_p = 0.0, err_m = 0.0, err_v = 0.0;

    for (size_t c = 0; c < sizeof(cfgs) / sizeof(cfgs[0]); c++) {
        test_seed(10 + c);
        for (int i = 0; i < N; i++) {
            p[i] = (float)(test_rand(0.5, 1.5) * (i % 2 ? -1 : 1));
            pr[i] = p[i];
            m[i] = v[i] = 0.0f;
            mr[i] = vr[i] = 0.0;
        }
        for (int s = 0; s < STEPS; s++) {
            int64_t t = cfgs[c].first_step + s;
            fsdp_kernel_t k;
            fill_rand(g, N, -1, 1);
            memset(&k, 0, sizeof(k));
            k.kind = FSDP_K_ADAMW;
            k.u.adamw.param = p;
            k.u.adamw.grad = g;
            k.u.adamw.exp_avg = m;
            k.u.adamw.exp_avg_sq = v;
            k.u.adamw.n = N;
            k.u.adamw.lr = cfgs[c].lr;
            k.u.adamw.beta1 = cfgs[c].b1;
            k.u.adamw.beta2 = cfgs[c].b2;
            k.u.adamw.eps = cfgs[c].eps;
            k.u.adamw.weight_decay = cfgs[c].wd;
            k.u.adamw.step = t;
            CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
            for (int i = 0; i < N; i++) {
                gmax = fmax(gmax, fabs(g[i]));
                ref_adamw(&pr[i], g[i], &mr[i], &vr[i], cfgs[c].lr, cfgs[c].b1, cfgs[c].b2,
                          cfgs[c].eps, cfgs[c].wd, t);
            }
        }
        /* relative errors; m and v relative to the scale of the gradients that built them,
         * as either may cancel to near 0 */
        for (int i = 0; i < N; i++) {
            err_p = fmax(err_p, fabs(p[i] - pr[i]) / fabs(pr[i]));
            err_m = fmax(err_m, fabs(m[i] - mr[i]) / (fabs(mr[i]) + gmax));
            err_v = fmax(err_v, fabs(v[i] - vr[i]) / (fabs(vr[i]) + gmax * gmax));
        }
    }
    /* Each step rounds p about 3 times (decay, product, sum: 3u relative) and the update
     * (about lr in size, <= 5% of |p| here) about 10 times; m and v about 3 times. Over 6 steps
     * that is < 25u = 1.5e-6 for p and < 20u for m and v: 1e-6 leaves no room to spare in the
     * worst case, 2e-6 does. */
    fprintf(stderr, "(relative errors: p %.1e m %.1e v %.1e) ", err_p, err_m, err_v);
    CU_ASSERT(err_p <= 2e-6);
    CU_ASSERT(err_m <= 2e-6);
    CU_ASSERT(err_v <= 2e-6);
}

/* torch.optim.SGD (single tensor), in double. */
static void ref_sgd(double *p, double g, double *buf, double lr, double mom, double damp, double wd,
                    int nesterov, int first)
{
    if (wd != 0.0)
        g += wd * *p;
    if (mom != 0.0) {
        *buf = first ? g : *buf * mom + (1.0 - damp) * g;
        g = nesterov ? g + mom * *buf : *buf;
    }
    *p -= lr * g;
}

static void test_sgd(void)
{
    enum { N = 29, STEPS = 6 };
    static const struct {
        float lr, mom, damp, wd;
        int nesterov;
    } cfgs[] = {
        {0.1f, 0.0f, 0.0f, 0.0f, 0},   {0.05f, 0.9f, 0.0f, 0.0f, 0}, {0.05f, 0.9f, 0.1f, 1e-2f, 0},
        {0.02f, 0.9f, 0.0f, 1e-2f, 1}, {0.01f, 0.0f, 0.0f, 0.1f, 0},
    };
    float p[N], g[N], buf[N];
    double pr[N], br[N], err_p = 0.0, err_b = 0.0;

    for (size_t c = 0; c < sizeof(cfgs) / sizeof(cfgs[0]); c++) {
        test_seed(20 + c);
        for (int i = 0; i < N; i++) {
            p[i] = (float)(test_rand(0.5, 1.5) * (i % 2 ? -1 : 1));
            pr[i] = p[i];
            buf[i] = 123.0f; /* the first step must not read it */
            br[i] = 0.0;
        }
        for (int s = 0; s < STEPS; s++) {
            fsdp_kernel_t k;
            fill_rand(g, N, -1, 1);
            memset(&k, 0, sizeof(k));
            k.kind = FSDP_K_SGD;
            k.u.sgd.param = p;
            k.u.sgd.grad = g;
            k.u.sgd.momentum_buf = cfgs[c].mom != 0.0f ? buf : NULL;
            k.u.sgd.n = N;
            k.u.sgd.lr = cfgs[c].lr;
            k.u.sgd.momentum = cfgs[c].mom;
            k.u.sgd.dampening = cfgs[c].damp;
            k.u.sgd.weight_decay = cfgs[c].wd;
            k.u.sgd.nesterov = cfgs[c].nesterov;
            k.u.sgd.first_step = s == 0;
            CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
            for (int i = 0; i < N; i++)
                ref_sgd(&pr[i], g[i], &br[i], cfgs[c].lr, cfgs[c].mom, cfgs[c].damp, cfgs[c].wd,
                        cfgs[c].nesterov, s == 0);
        }
        for (int i = 0; i < N; i++) {
            err_p = fmax(err_p, fabs(p[i] - pr[i]) / fabs(pr[i]));
            if (cfgs[c].mom != 0.0f)
                err_b = fmax(err_b, fabs(buf[i] - br[i]) / (fabs(br[i]) + 1.0));
        }
    }
    /* a few roundings per step on p (relative u each) and on the buffer: over 6 steps < 20u */
    fprintf(stderr, "(relative errors: p %.1e buf %.1e) ", err_p, err_b);
    CU_ASSERT(err_p <= 1.2e-6);
    CU_ASSERT(err_b <= 1.2e-6);
}

static void test_optim_config(void)
{
    fsdp_optim_config_t cfg;
    fsdp_optim_t *opt = NULL;

    fsdp_optim_config_init(&cfg, FSDP_OPTIM_ADAMW);
    CU_ASSERT_EQUAL(cfg.kind, FSDP_OPTIM_ADAMW);
    CU_ASSERT_EQUAL(cfg.lr, 1e-3f);
    CU_ASSERT_EQUAL(cfg.beta1, 0.9f);
    CU_ASSERT_EQUAL(cfg.beta2, 0.999f);
    CU_ASSERT_EQUAL(cfg.eps, 1e-8f);
    CU_ASSERT_EQUAL(cfg.weight_decay, 1e-2f);
    CU_ASSERT_EQUAL(cfg.no_decay_1d, 0);
    CU_ASSERT_EQUAL(fsdp_optim_config_check(&cfg), FSDP_OK);
    fsdp_optim_config_init(&cfg, FSDP_OPTIM_SGD);
    CU_ASSERT_EQUAL(cfg.kind, FSDP_OPTIM_SGD);
    CU_ASSERT_EQUAL(cfg.lr, 1e-3f);
    CU_ASSERT_EQUAL(cfg.momentum, 0.0f);
    CU_ASSERT_EQUAL(cfg.dampening, 0.0f);
    CU_ASSERT_EQUAL(cfg.weight_decay, 0.0f);
    CU_ASSERT_EQUAL(cfg.nesterov, 0);
    CU_ASSERT_EQUAL(fsdp_optim_config_check(&cfg), FSDP_OK);

#define EXPECT_BAD(msg)                                                                            \
    do {                                                                                           \
        log_begin();                                                                               \
        CU_ASSERT_EQUAL(fsdp_optim_config_check(&cfg), FSDP_ERR_INVALID_PARAM);                    \
        log_end();                                                                                 \
        CU_ASSERT_EQUAL(log_count, 1);                                                             \
        if (strstr(log_last, msg) == NULL)                                                         \
            fprintf(stderr, "want \"%s\" in \"%s\"\n", msg, log_last);                             \
        CU_ASSERT(strstr(log_last, msg) != NULL);                                                  \
    } while (0)

    cfg.lr = -1.0f;
    EXPECT_BAD("invalid learning rate: -1");
    cfg.lr = NAN;
    EXPECT_BAD("invalid learning rate");
    fsdp_optim_config_init(&cfg, FSDP_OPTIM_SGD);
    cfg.nesterov = 1;
    EXPECT_BAD("nesterov momentum requires a momentum and zero dampening");
    cfg.momentum = 0.9f;
    CU_ASSERT_EQUAL(fsdp_optim_config_check(&cfg), FSDP_OK);
    cfg.dampening = 0.1f;
    EXPECT_BAD("nesterov momentum requires a momentum and zero dampening");
    cfg.nesterov = 0;
    cfg.momentum = -0.5f;
    EXPECT_BAD("invalid momentum value: -0.5");
    fsdp_optim_config_init(&cfg, FSDP_OPTIM_SGD);
    cfg.weight_decay = -1e-2f;
    EXPECT_BAD("invalid weight_decay value: -0.01");
    fsdp_optim_config_init(&cfg, FSDP_OPTIM_ADAMW);
    cfg.beta1 = 1.0f;
    EXPECT_BAD("invalid beta parameter at index 0: 1");
    cfg.beta1 = 0.9f;
    cfg.beta2 = -0.1f;
    EXPECT_BAD("invalid beta parameter at index 1: -0.1");
    cfg.beta2 = 0.999f;
    cfg.eps = -1e-8f;
    EXPECT_BAD("invalid epsilon value: -1e-08");
    fsdp_optim_config_init(&cfg, FSDP_OPTIM_ADAMW);
    cfg.kind = (fsdp_optim_kind_t)7;
    EXPECT_BAD("invalid optimizer kind: 7");
#undef EXPECT_BAD

    /* create needs a runtime; the argument checks do not */
    fsdp_optim_config_init(&cfg, FSDP_OPTIM_ADAMW);
    log_begin();
    CU_ASSERT_EQUAL(fsdp_optim_create(NULL, &cfg, &opt), FSDP_ERR_INVALID_PARAM);
    log_end();
    CU_ASSERT_PTR_NULL(opt);
    fsdp_optim_destroy(NULL);
    CU_ASSERT_EQUAL(fsdp_optim_num_steps(NULL), 0);
}

/* ---- finite differences through a Linear+ReLU+Linear+MSE network ------------------------- */

enum { FD_B = 5, FD_D0 = 4, FD_D1 = 7, FD_D2 = 3 };

typedef struct fd_net {
    double x[FD_B * FD_D0], t[FD_B * FD_D2];
    double w1[FD_D1 * FD_D0], b1[FD_D1], w2[FD_D2 * FD_D1], b2[FD_D2];
} fd_net_t;

/* The forward in double: y = relu(x w1^T + b1) w2^T + b2, loss = mean((y - t)^2). min_h gets
 * the smallest |pre-activation|, to keep finite differences away from the ReLU's kink. */
static double fd_loss(const fd_net_t *nt, double *min_h)
{
    double loss = 0.0, mh = INFINITY;
    for (int r = 0; r < FD_B; r++) {
        double a[FD_D1];
        for (int j = 0; j < FD_D1; j++) {
            double h = nt->b1[j];
            for (int p = 0; p < FD_D0; p++)
                h += nt->x[r * FD_D0 + p] * nt->w1[j * FD_D0 + p];
            mh = fmin(mh, fabs(h));
            a[j] = h > 0.0 ? h : 0.0;
        }
        for (int o = 0; o < FD_D2; o++) {
            double y = nt->b2[o];
            for (int j = 0; j < FD_D1; j++)
                y += a[j] * nt->w2[o * FD_D1 + j];
            loss += (y - nt->t[r * FD_D2 + o]) * (y - nt->t[r * FD_D2 + o]);
        }
    }
    if (min_h != NULL)
        *min_h = mh;
    return loss / (FD_B * FD_D2);
}

static fsdp_kernel_t k_bias_grad(float *dbias, const float *dy, size_t rows, size_t cols)
{
    fsdp_kernel_t kd = {.kind = FSDP_K_BIAS_GRAD};
    kd.u.bias_grad.dbias = dbias;
    kd.u.bias_grad.dy = dy;
    kd.u.bias_grad.rows = rows;
    kd.u.bias_grad.cols = cols;
    return kd;
}

/* Compares an f32 gradient with central differences of the double loss over n parameters at
 * theta; returns the largest error relative to the tensor's largest gradient. */
static double fd_compare(fd_net_t *nt, double *theta, const float *grad, int n, const char *what)
{
    const double h = 1e-4;
    double fd[64], gmax = 0.0, worst = 0.0;
    for (int i = 0; i < n; i++) {
        double keep = theta[i];
        theta[i] = keep + h;
        double lp = fd_loss(nt, NULL);
        theta[i] = keep - h;
        double lm = fd_loss(nt, NULL);
        theta[i] = keep;
        fd[i] = (lp - lm) / (2.0 * h);
        gmax = fmax(gmax, fabs(fd[i]));
    }
    for (int i = 0; i < n; i++)
        worst = fmax(worst, fabs(grad[i] - fd[i]) / gmax);
    if (worst > 1e-5)
        fprintf(stderr, "%s: gradient off by %.2e of its largest entry %.3e\n", what, worst, gmax);
    return worst;
}

static void test_fd_linear_relu_mse(void)
{
    fd_net_t nt;
    float x[FD_B * FD_D0], t[FD_B * FD_D2], w1[FD_D1 * FD_D0], b1[FD_D1], w2[FD_D2 * FD_D1],
        b2[FD_D2];
    float hbuf[FD_B * FD_D1], y[FD_B * FD_D2], dy[FD_B * FD_D2], loss;
    float dw1[FD_D1 * FD_D0], db1[FD_D1], dw2[FD_D2 * FD_D1], db2[FD_D2], da[FD_B * FD_D1],
        dx[FD_B * FD_D0];
    double min_h = 0.0, worst = 0.0;
    fsdp_kernel_t k;

    test_seed(30);
    fill_rand(x, FD_B * FD_D0, -1, 1);
    fill_rand(t, FD_B * FD_D2, -1, 1);
    fill_rand(w1, FD_D1 * FD_D0, -0.5, 0.5);
    fill_rand(b1, FD_D1, -0.5, 0.5);
    fill_rand(w2, FD_D2 * FD_D1, -0.5, 0.5);
    fill_rand(b2, FD_D2, -0.5, 0.5);
    /* keep every pre-activation at least 0.02 from the kink: the f32 forward then masks as the
     * double one, and a step of h = 1e-4 (moving h by at most 1e-4) never crosses it */
    for (int tries = 0; tries < 100; tries++) {
        for (int i = 0; i < FD_B * FD_D0; i++)
            nt.x[i] = x[i];
        for (int i = 0; i < FD_B * FD_D2; i++)
            nt.t[i] = t[i];
        for (int i = 0; i < FD_D1 * FD_D0; i++)
            nt.w1[i] = w1[i];
        for (int i = 0; i < FD_D1; i++)
            nt.b1[i] = b1[i];
        for (int i = 0; i < FD_D2 * FD_D1; i++)
            nt.w2[i] = w2[i];
        for (int i = 0; i < FD_D2; i++)
            nt.b2[i] = b2[i];
        fd_loss(&nt, &min_h);
        if (min_h >= 0.02)
            break;
        fill_rand(b1, FD_D1, -0.5, 0.5);
    }
    CU_ASSERT_FATAL(min_h >= 0.02);

    /* forward: h = x w1^T + b1; a = relu(h) (in place); y = a w2^T + b2; loss, dy */
    k = k_gemm(0, 1, FD_B, FD_D1, FD_D0, x, FD_D0, w1, FD_D0, hbuf, FD_D1);
    CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_BIAS_ADD;
    k.u.bias_add.y = hbuf;
    k.u.bias_add.bias = b1;
    k.u.bias_add.rows = FD_B;
    k.u.bias_add.cols = FD_D1;
    CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_RELU_FWD;
    k.u.relu_fwd.y = hbuf;
    k.u.relu_fwd.x = hbuf;
    k.u.relu_fwd.n = FD_B * FD_D1;
    CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    k = k_gemm(0, 1, FD_B, FD_D2, FD_D1, hbuf, FD_D1, w2, FD_D1, y, FD_D2);
    CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_BIAS_ADD;
    k.u.bias_add.y = y;
    k.u.bias_add.bias = b2;
    k.u.bias_add.rows = FD_B;
    k.u.bias_add.cols = FD_D2;
    CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_MSE_LOSS;
    k.u.mse.loss = &loss;
    k.u.mse.dy = dy;
    k.u.mse.y = y;
    k.u.mse.t = t;
    k.u.mse.n = FD_B * FD_D2;
    k.u.mse.denom = FD_B * FD_D2;
    CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    CU_ASSERT(fabs(loss - fd_loss(&nt, NULL)) <= 1e-6 * fd_loss(&nt, NULL));

    /* backward: dw2 = dy^T a, db2, da = dy w2, dh = relu'(da), dw1 = dh^T x, db1, dx = dh w1 */
    k = k_gemm(1, 0, FD_D2, FD_D1, FD_B, dy, FD_D2, hbuf, FD_D1, dw2, FD_D1);
    CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    memset(db2, 0, sizeof(db2));
    k = k_bias_grad(db2, dy, FD_B, FD_D2);
    CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    k = k_gemm(0, 0, FD_B, FD_D1, FD_D2, dy, FD_D2, w2, FD_D1, da, FD_D1);
    CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_RELU_BWD;
    k.u.relu_bwd.dx = da;
    k.u.relu_bwd.dy = da;
    k.u.relu_bwd.y = hbuf;
    k.u.relu_bwd.n = FD_B * FD_D1;
    CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    k = k_gemm(1, 0, FD_D1, FD_D0, FD_B, da, FD_D1, x, FD_D0, dw1, FD_D0);
    CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    memset(db1, 0, sizeof(db1));
    k = k_bias_grad(db1, da, FD_B, FD_D1);
    CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    k = k_gemm(0, 0, FD_B, FD_D0, FD_D1, da, FD_D1, w1, FD_D0, dx, FD_D0);
    CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);

    /* The loss is piecewise quadratic in each single parameter, and no step crosses a kink, so
     * central differences are exact but for roundoff (1e-16 / h = 1e-12). The f32 gradients
     * are sums of at most 7 terms, two layers deep: each entry is off by a few tens of u of
     * the magnitudes it sums, < 1e-5 of the tensor's largest entry. */
    worst = fmax(worst, fd_compare(&nt, nt.w2, dw2, FD_D2 * FD_D1, "dw2"));
    worst = fmax(worst, fd_compare(&nt, nt.b2, db2, FD_D2, "db2"));
    worst = fmax(worst, fd_compare(&nt, nt.w1, dw1, FD_D1 * FD_D0, "dw1"));
    worst = fmax(worst, fd_compare(&nt, nt.b1, db1, FD_D1, "db1"));
    worst = fmax(worst, fd_compare(&nt, nt.x, dx, FD_B * FD_D0, "dx"));
    fprintf(stderr, "(worst error %.1e of the largest entry) ", worst);
    CU_ASSERT(worst <= 1e-5);
}

/* ---- random numbers ---------------------------------------------------------------------- */

static void test_rng(void)
{
    fsdp_rng_t r1, r2;
    enum { N = 100000 };
    double sum = 0.0, sum2 = 0.0;
    float lo = 1e30f, hi = -1e30f;

    /* splitmix64's published first output for seed 0 */
    fsdp_rng_seed(&r1, 0);
    CU_ASSERT_EQUAL(fsdp_rng_next(&r1), UINT64_C(0xe220a8397b1dcdaf));
    fsdp_rng_seed(&r1, 42);
    fsdp_rng_seed(&r2, 42);
    for (int i = 0; i < 100; i++)
        CU_ASSERT_EQUAL(fsdp_rng_next(&r1), fsdp_rng_next(&r2));
    for (int i = 0; i < N; i++) {
        float u = fsdp_rng_uniform(&r1, -0.25f, 0.75f);
        lo = u < lo ? u : lo;
        hi = u > hi ? u : hi;
        sum += u;
    }
    CU_ASSERT(lo >= -0.25f && hi < 0.75f);
    CU_ASSERT(lo < -0.249f && hi > 0.749f);
    /* mean 0.25, standard error 0.29 / sqrt(N) = 9e-4: 5 sigma */
    CU_ASSERT(fabs(sum / N - 0.25) < 5e-3);
    /* [lo, hi) holds even when rounding to f32 would reach hi */
    for (int i = 0; i < 1000; i++) {
        float u = fsdp_rng_uniform(&r1, 1.0f, 1.0000001f);
        CU_ASSERT(u >= 1.0f && u < 1.0000001f);
    }
    sum = 0.0;
    for (int i = 0; i < N; i++) {
        float z = fsdp_rng_normal(&r1);
        CU_ASSERT(isfinite(z));
        sum += z;
        sum2 += (double)z * z;
    }
    /* standard errors: mean 1/sqrt(N) = 3.2e-3, variance sqrt(2/N) = 4.5e-3; 5 sigma */
    CU_ASSERT(fabs(sum / N) < 0.016);
    CU_ASSERT(fabs(sum2 / N - 1.0) < 0.023);

    /* skipping n draws is n draws, the counter wrapping modulo 2^64 included */
    {
        static const uint64_t skips[] = {0, 1, 7, 1000, UINT64_C(1) << 63};
        for (size_t i = 0; i < sizeof(skips) / sizeof(skips[0]); i++) {
            fsdp_rng_seed(&r1, 5);
            fsdp_rng_seed(&r2, 5);
            if (skips[i] <= 1000)
                for (uint64_t k = 0; k < skips[i]; k++)
                    (void)fsdp_rng_next(&r2);
            else
                r2.state += skips[i] * UINT64_C(0x9e3779b97f4a7c15); /* splitmix64's step */
            fsdp_rng_skip(&r1, skips[i]);
            CU_ASSERT_EQUAL(fsdp_rng_next(&r1), fsdp_rng_next(&r2));
        }
    }
    /* the polar method's part [first, first + count) is the whole's, and the generator ends
     * where the whole's does, for every part of an odd length */
    {
        enum { M = 1001 };
        float whole[M], part[M];
        uint64_t after;
        fsdp_rng_seed(&r1, 9);
        fsdp_rng_normal_polar(&r1, whole, M, 0.5f, 0, M);
        after = fsdp_rng_next(&r1);
        for (size_t first = 0; first <= M; first += 97)
            for (size_t count = 0; first + count <= M; count += 131) {
                memset(part, 0xff, sizeof(part));
                fsdp_rng_seed(&r2, 9);
                fsdp_rng_normal_polar(&r2, part, M, 0.5f, first, count);
                CU_ASSERT(memcmp(part + first, whole + first, count * sizeof(float)) == 0);
                CU_ASSERT_EQUAL(fsdp_rng_next(&r2), after);
            }
    }
}

/* ---- low precision: bf16 and f16 operands ------------------------------------------------ */

static uint16_t to16(fsdp_dtype_t dt, float v)
{
    return dt == FSDP_DTYPE_BF16 ? fsdp_f32_to_bf16(v) : fsdp_f32_to_f16(v);
}

static float from16(fsdp_dtype_t dt, uint16_t h)
{
    return dt == FSDP_DTYPE_BF16 ? fsdp_bf16_to_f32(h) : fsdp_f16_to_f32(h);
}

/* Element i of a buffer of dtype dt (f32 or 16-bit) as f32, and the store that rounds. */
static float ld(const void *p, fsdp_dtype_t dt, size_t i)
{
    return dt == FSDP_DTYPE_F32 ? ((const float *)p)[i] : from16(dt, ((const uint16_t *)p)[i]);
}

static void st(void *p, fsdp_dtype_t dt, size_t i, float v)
{
    if (dt == FSDP_DTYPE_F32)
        ((float *)p)[i] = v;
    else
        ((uint16_t *)p)[i] = to16(dt, v);
}

/* The test's own model of rounding f32 to dt (ref_round), as a double. */
static double round_to(fsdp_dtype_t dt, double x)
{
    if (dt == FSDP_DTYPE_BF16)
        return ref_round(x, 8, -126, 0.0);
    if (dt == FSDP_DTYPE_F16)
        return ref_round(x, 11, -14, 65504.0);
    return x;
}

/* A random buffer of n elements of dt, values in [lo, hi) rounded to dt. */
static void *rand_buf(fsdp_dtype_t dt, size_t n, double lo, double hi)
{
    void *p = malloc((n + 1) * fsdp_dtype_size(dt));
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    for (size_t i = 0; i < n; i++)
        st(p, dt, i, (float)test_rand(lo, hi));
    return p;
}

/* One 16-bit GEMM (A and B of dt, C of cdt: dt or f32) against three references:
 *  - the f32 routine on the inputs widened by the test: widening is exact and the 16-bit path
 *    packs the widened values into the same micro-kernel in the same order, so an f32 C must
 *    have the same bits, and a 16-bit C must be that f32 result rounded once (the test's own
 *    rounding model), however many k blocks were summed;
 *  - the double product of the rounded inputs, within the bound of f32 accumulation (ref_gemm),
 *    for the f32 result before the final rounding. */
static int check_gemm_lp(fsdp_dtype_t dt, fsdp_dtype_t cdt, int ta, int tb, size_t m, size_t n,
                         size_t k, float alpha, float beta, size_t pad)
{
    size_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
    size_t na = (ta ? k : m) * lda, nb = (tb ? n : k) * ldb, nc = m * ldc;
    void *a = rand_buf(dt, na, -1.0, 1.0), *b = rand_buf(dt, nb, -1.0, 1.0);
    void *c = rand_buf(cdt, nc, -1.0, 1.0);
    float *aw = malloc((na + 1) * sizeof(float)), *bw = malloc((nb + 1) * sizeof(float));
    float *cw = malloc((nc + 1) * sizeof(float)), *c0 = malloc((nc + 1) * sizeof(float));
    double *ref = malloc((m * n + 1) * sizeof(double)),
           *bound = malloc((m * n + 1) * sizeof(double));
    fsdp_kernel_t kd = {.kind = FSDP_K_GEMM};
    int bad = 0;

    CU_ASSERT_FATAL(aw && bw && cw && c0 && ref && bound);
    for (size_t i = 0; i < m; i++) {
        for (size_t j = n; j < ldc; j++)
            st(c, cdt, i * ldc + j, 4096.0f); /* past n: must stay */
        for (size_t j = 0; j < n && beta == 0.0f; j++)
            st(c, cdt, i * ldc + j, NAN); /* beta == 0 must not read C */
    }
    for (size_t i = 0; i < na; i++)
        aw[i] = ld(a, dt, i);
    for (size_t i = 0; i < nb; i++)
        bw[i] = ld(b, dt, i);
    for (size_t i = 0; i < nc; i++)
        c0[i] = cw[i] = ld(c, cdt, i);

    kd.u.gemm.trans_a = ta;
    kd.u.gemm.trans_b = tb;
    kd.u.gemm.m = m;
    kd.u.gemm.n = n;
    kd.u.gemm.k = k;
    kd.u.gemm.alpha = alpha;
    kd.u.gemm.a = a;
    kd.u.gemm.lda = lda;
    kd.u.gemm.b = b;
    kd.u.gemm.ldb = ldb;
    kd.u.gemm.beta = beta;
    kd.u.gemm.c = c;
    kd.u.gemm.ldc = ldc;
    kd.u.gemm.a_dtype = kd.u.gemm.b_dtype = dt;
    kd.u.gemm.c_dtype = cdt;
    CU_ASSERT_EQUAL_FATAL(run(&kd), FSDP_OK);
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_gemm(ta, tb, m, n, k, alpha, aw, lda, bw, ldb, beta, cw, ldc),
                          FSDP_OK);
    ref_gemm(ta, tb, m, n, k, alpha, aw, lda, bw, ldb, beta, c0, ldc, ref, bound);
    for (size_t i = 0; i < m; i++) {
        for (size_t j = 0; j < ldc; j++) {
            size_t e = i * ldc + j;
            double got = ld(c, cdt, e);
            int ok;
            if (j >= n) {
                ok = got == 4096.0;
            } else if (cdt == FSDP_DTYPE_F32) {
                ok = memcmp(&((const float *)c)[e], &cw[e], sizeof(float)) == 0 &&
                     fabs(got - ref[i * n + j]) <= bound[i * n + j];
            } else {
                ok =
                    got == round_to(cdt, cw[e]) && fabs(cw[e] - ref[i * n + j]) <= bound[i * n + j];
                gemm_worst = fmax(gemm_worst, fabs(cw[e] - ref[i * n + j]) / bound[i * n + j]);
            }
            if (!ok && bad++ < 3)
                fprintf(stderr,
                        "gemm %s->%s %c%c m %zu n %zu k %zu pad %zu: C[%zu,%zu] = %.9g, f32 path "
                        "%.9g, double %.9g\n",
                        fsdp_dtype_name(dt), fsdp_dtype_name(cdt), ta ? 'T' : 'N', tb ? 'T' : 'N',
                        m, n, k, pad, i, j, got, (double)cw[e], j < n ? ref[i * n + j] : 4096.0);
        }
    }
    free(a);
    free(b);
    free(c);
    free(aw);
    free(bw);
    free(cw);
    free(c0);
    free(ref);
    free(bound);
    return bad;
}

static void test_gemm_low_precision(void)
{
    static const size_t sizes[] = {1, 2, 3, 5, 7, 16, 17, 23, 33, 64, 67};
    static const float alphas[] = {1.0f, -0.5f, 2.0f};
    static const float betas[] = {0.0f, 1.0f, 0.25f};
    static const fsdp_dtype_t dts[] = {FSDP_DTYPE_BF16, FSDP_DTYPE_F16};
    const size_t ns = sizeof(sizes) / sizeof(sizes[0]);
    int bad = 0, cases = 0;

    test_seed(11);
    for (int d = 0; d < 2; d++) {
        for (int cf = 0; cf < 2; cf++) {
            fsdp_dtype_t cdt = cf ? FSDP_DTYPE_F32 : dts[d];
            for (int t = 0; t < 4; t++) {
                int ta = t >> 1, tb = t & 1;
                for (int r = 0; r < 9; r++) {
                    bad += check_gemm_lp(dts[d], cdt, ta, tb, sizes[test_index(ns)],
                                         sizes[test_index(ns)], sizes[test_index(ns)],
                                         alphas[r % 3], betas[r / 3], (size_t)(r % 2 ? 3 : 0));
                    cases++;
                }
                /* three k blocks: C is rounded once, after the last */
                bad += check_gemm_lp(dts[d], cdt, ta, tb, 13, 21, 2 * FSDP_SIM_GEMM_KC + 7, 1.0f,
                                     0.5f, 1);
                /* more rows than one A block, more columns than one B panel */
                bad += check_gemm_lp(dts[d], cdt, ta, tb, 151, 9, 5, 1.0f, 0.0f, 0);
                bad += check_gemm_lp(dts[d], cdt, ta, tb, 3, 3100, 4, -1.0f, 1.0f, 0);
                cases += 3;
            }
        }
    }
    fprintf(stderr, "(%d cases, worst error %.2f of the bound) ", cases, gemm_worst);
    CU_ASSERT_EQUAL(bad, 0);
}

/* k == 0 or alpha == 0 with a 16-bit C: C = beta * C in f32, rounded; beta == 0 gives zeros
 * over NaN. Unsupported dtype combinations are refused with one error line. */
static void test_gemm_low_precision_edges(void)
{
    uint16_t c[6], a[4] = {0}, b[4] = {0};
    float cf[6];
    fsdp_kernel_t k = {.kind = FSDP_K_GEMM};

    for (int i = 0; i < 6; i++)
        c[i] = fsdp_f32_to_bf16(NAN);
    k.u.gemm.m = 2;
    k.u.gemm.n = 3;
    k.u.gemm.ldc = 3;
    k.u.gemm.c = c;
    k.u.gemm.alpha = 1.0f;
    k.u.gemm.a_dtype = k.u.gemm.b_dtype = k.u.gemm.c_dtype = FSDP_DTYPE_BF16;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    for (int i = 0; i < 6; i++)
        CU_ASSERT_EQUAL(c[i], 0);
    for (int i = 0; i < 6; i++)
        c[i] = fsdp_f32_to_bf16(1.0f + (float)i / 3.0f);
    k.u.gemm.k = 2;
    k.u.gemm.a = a;
    k.u.gemm.lda = 2;
    k.u.gemm.b = b;
    k.u.gemm.ldb = 3;
    k.u.gemm.alpha = 0.0f;
    k.u.gemm.beta = 0.3f;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    for (int i = 0; i < 6; i++) {
        float old = fsdp_bf16_to_f32(fsdp_f32_to_bf16(1.0f + (float)i / 3.0f));
        CU_ASSERT_EQUAL(fsdp_bf16_to_f32(c[i]), round_to(FSDP_DTYPE_BF16, 0.3f * old));
    }

    /* A and B of two dtypes, an f16 C from bf16 inputs, a 16-bit C from f32 inputs, i32 */
    k.u.gemm.alpha = 1.0f;
    k.u.gemm.b_dtype = FSDP_DTYPE_F16;
    expect_invalid(&k, "gemm bf16 x f16");
    k.u.gemm.b_dtype = FSDP_DTYPE_BF16;
    k.u.gemm.c_dtype = FSDP_DTYPE_F16;
    expect_invalid(&k, "gemm bf16 -> f16");
    k.u.gemm.a_dtype = k.u.gemm.b_dtype = FSDP_DTYPE_F32;
    k.u.gemm.c_dtype = FSDP_DTYPE_BF16;
    expect_invalid(&k, "gemm f32 -> bf16");
    k.u.gemm.a_dtype = k.u.gemm.b_dtype = k.u.gemm.c_dtype = FSDP_DTYPE_I32;
    expect_invalid(&k, "gemm i32");
    /* with every dtype f32 the f32 routine runs */
    k.u.gemm.a_dtype = k.u.gemm.b_dtype = k.u.gemm.c_dtype = FSDP_DTYPE_F32;
    k.u.gemm.c = cf;
    k.u.gemm.alpha = 0.0f;
    k.u.gemm.beta = 0.0f;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
}

/* bias_add, bias_grad, relu forward and backward and mse_loss in bf16 and f16, and with mixed
 * dtypes: every element equals load -> the f32 operation -> store, computed here. */
static void test_elementwise_low_precision(void)
{
    enum { R = 9, C = 37, N = R * C };
    static const fsdp_dtype_t dts[] = {FSDP_DTYPE_BF16, FSDP_DTYPE_F16, FSDP_DTYPE_F32};
    int bad = 0;

    test_seed(12);
    for (int d = 0; d < 2; d++) {
        for (int o = 0; o < 3; o++) {
            fsdp_dtype_t dt = dts[d], ot = dts[(d + o) % 3]; /* the other operand's dtype */
            void *y = rand_buf(dt, N, -2, 2), *y0 = malloc(N * sizeof(uint16_t));
            void *x = rand_buf(ot, N, -2, 2), *bias = rand_buf(ot, C, -1, 1);
            void *dy = rand_buf(ot, N, -1, 1), *dbias = rand_buf(dt, C, -1, 1);
            void *t = rand_buf(ot, N, -2, 2), *g = malloc(N * sizeof(uint16_t));
            void *dbias0 = malloc(C * sizeof(uint16_t));
            float loss = -1.0f;
            double ref = 0.0;
            fsdp_kernel_t k;

            CU_ASSERT_FATAL(y0 && g && dbias0);
            memcpy(y0, y, N * sizeof(uint16_t));
            memcpy(dbias0, dbias, C * sizeof(uint16_t));
            st(x, ot, 0, 0.0f);
            st(x, ot, 1, -0.0f);

            memset(&k, 0, sizeof(k));
            k.kind = FSDP_K_BIAS_ADD;
            k.u.bias_add.y = y;
            k.u.bias_add.bias = bias;
            k.u.bias_add.rows = R;
            k.u.bias_add.cols = C;
            k.u.bias_add.y_dtype = dt;
            k.u.bias_add.bias_dtype = ot;
            CU_ASSERT_EQUAL(run(&k), FSDP_OK);
            for (int i = 0; i < N; i++)
                bad += ld(y, dt, i) != round_to(dt, ld(y0, dt, i) + ld(bias, ot, i % C));

            memset(&k, 0, sizeof(k));
            k.kind = FSDP_K_BIAS_GRAD;
            k.u.bias_grad.dbias = dbias;
            k.u.bias_grad.dy = dy;
            k.u.bias_grad.rows = R;
            k.u.bias_grad.cols = C;
            k.u.bias_grad.dbias_dtype = dt;
            k.u.bias_grad.dy_dtype = ot;
            CU_ASSERT_EQUAL(run(&k), FSDP_OK);
            for (int c = 0; c < C; c++) {
                float s = 0.0f; /* rows in order, in f32, rounded once, then accumulated */
                for (int r = 0; r < R; r++)
                    s += ld(dy, ot, (size_t)(r * C + c));
                bad += ld(dbias, dt, c) != round_to(dt, ld(dbias0, dt, c) + round_to(dt, s));
            }

            memset(&k, 0, sizeof(k)); /* y (dt) = relu(x (ot)) */
            k.kind = FSDP_K_RELU_FWD;
            k.u.relu_fwd.y = y;
            k.u.relu_fwd.x = x;
            k.u.relu_fwd.n = N;
            k.u.relu_fwd.y_dtype = dt;
            k.u.relu_fwd.x_dtype = ot;
            CU_ASSERT_EQUAL(run(&k), FSDP_OK);
            for (int i = 0; i < N; i++) {
                float v = ld(x, ot, i);
                bad += ld(y, dt, i) != round_to(dt, v > 0.0f ? v : 0.0f);
                bad += i < 2 && (((const uint16_t *)y)[i] != 0); /* +0, never -0 */
            }
            memcpy(y0, y, N * sizeof(uint16_t)); /* in place, one dtype */
            k.u.relu_fwd.x = y;
            k.u.relu_fwd.x_dtype = dt;
            CU_ASSERT_EQUAL(run(&k), FSDP_OK);
            bad += memcmp(y0, y, N * sizeof(uint16_t)) != 0;

            memset(&k, 0, sizeof(k)); /* g (dt) = y > 0 ? dy (ot) : 0, y from above */
            k.kind = FSDP_K_RELU_BWD;
            k.u.relu_bwd.dx = g;
            k.u.relu_bwd.dy = dy;
            k.u.relu_bwd.y = x;
            k.u.relu_bwd.n = N;
            k.u.relu_bwd.dx_dtype = dt;
            k.u.relu_bwd.dy_dtype = ot;
            k.u.relu_bwd.y_dtype = ot;
            CU_ASSERT_EQUAL(run(&k), FSDP_OK);
            for (int i = 0; i < N; i++)
                bad += ld(g, dt, i) != round_to(dt, ld(x, ot, i) > 0.0f ? ld(dy, ot, i) : 0.0f);

            memset(&k, 0, sizeof(k)); /* y in dt, target in ot, dy in dt, loss f32 */
            k.kind = FSDP_K_MSE_LOSS;
            k.u.mse.loss = &loss;
            k.u.mse.dy = g;
            k.u.mse.y = y;
            k.u.mse.t = t;
            k.u.mse.n = N;
            k.u.mse.denom = (double)N;
            k.u.mse.y_dtype = dt;
            k.u.mse.t_dtype = ot;
            k.u.mse.dy_dtype = dt;
            CU_ASSERT_EQUAL(run(&k), FSDP_OK);
            for (int i = 0; i < N; i++) {
                double e = (double)ld(y, dt, i) - ld(t, ot, i);
                ref += e * e;
                bad +=
                    ld(g, dt, i) != round_to(dt, (ld(y, dt, i) - ld(t, ot, i)) * (float)(2.0 / N));
            }
            ref /= N;
            CU_ASSERT(fabs(loss - ref) <= 4 * U32 * ref);
            /* dy over y, in place */
            memcpy(y0, y, N * sizeof(uint16_t));
            k.u.mse.dy = y;
            CU_ASSERT_EQUAL(run(&k), FSDP_OK);
            for (int i = 0; i < N; i++)
                bad +=
                    ld(y, dt, i) != round_to(dt, (ld(y0, dt, i) - ld(t, ot, i)) * (float)(2.0 / N));
            free(y), free(y0), free(x), free(bias), free(dy), free(dbias), free(t), free(g);
            free(dbias0);
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* A buffer used in place keeps one dtype; i32 operands are refused. One error line each. */
static void test_low_precision_validation(void)
{
    uint16_t h[8] = {0};
    float f[8] = {0}, loss;
    fsdp_kernel_t k;

    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_RELU_FWD;
    k.u.relu_fwd.y = h;
    k.u.relu_fwd.x = h;
    k.u.relu_fwd.n = 8;
    k.u.relu_fwd.y_dtype = FSDP_DTYPE_BF16;
    k.u.relu_fwd.x_dtype = FSDP_DTYPE_F16;
    expect_invalid(&k, "relu in place, two dtypes");
    k.u.relu_fwd.x_dtype = FSDP_DTYPE_I32;
    k.u.relu_fwd.x = f;
    expect_invalid(&k, "relu i32");

    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_RELU_BWD;
    k.u.relu_bwd.dx = f;
    k.u.relu_bwd.dy = f;
    k.u.relu_bwd.y = h;
    k.u.relu_bwd.n = 4;
    k.u.relu_bwd.dx_dtype = FSDP_DTYPE_BF16;
    k.u.relu_bwd.y_dtype = FSDP_DTYPE_BF16;
    expect_invalid(&k, "relu_bwd in place, two dtypes");

    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_MSE_LOSS;
    k.u.mse.loss = &loss;
    k.u.mse.dy = h;
    k.u.mse.y = h;
    k.u.mse.t = f;
    k.u.mse.n = 4;
    k.u.mse.denom = 4.0;
    k.u.mse.y_dtype = FSDP_DTYPE_BF16;
    expect_invalid(&k, "mse dy over y, two dtypes");
    k.u.mse.dy = NULL; /* no dy: its dtype does not matter */
    k.u.mse.dy_dtype = FSDP_DTYPE_I32;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);

    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_BIAS_ADD;
    k.u.bias_add.y = f;
    k.u.bias_add.bias = f;
    k.u.bias_add.rows = 2;
    k.u.bias_add.cols = 4;
    k.u.bias_add.bias_dtype = FSDP_DTYPE_I32;
    expect_invalid(&k, "bias_add i32");

    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_BIAS_GRAD;
    k.u.bias_grad.dbias = f;
    k.u.bias_grad.dy = f;
    k.u.bias_grad.rows = 2;
    k.u.bias_grad.cols = 4;
    k.u.bias_grad.dbias_dtype = (fsdp_dtype_t)77;
    expect_invalid(&k, "bias_grad bad dtype");
}

/* The roofline's bytes follow the dtypes; zeroed dtypes are f32. */
static void test_cost_dtypes(void)
{
    fsdp_kernel_t k;
    double flops, bytes, bytes16;

    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_GEMM;
    k.u.gemm.m = 8;
    k.u.gemm.n = 16;
    k.u.gemm.k = 32;
    k.u.gemm.beta = 1.0f;
    fsdp_kernel_cost(&k, &flops, &bytes);
    CU_ASSERT_EQUAL(flops, 2.0 * 8 * 16 * 32);
    CU_ASSERT_EQUAL(bytes, 4.0 * (8 * 32 + 32 * 16 + 2 * 8 * 16));
    k.u.gemm.a_dtype = k.u.gemm.b_dtype = FSDP_DTYPE_BF16;
    fsdp_kernel_cost(&k, &flops, &bytes16);
    CU_ASSERT_EQUAL(bytes16, 2.0 * (8 * 32 + 32 * 16) + 4.0 * 2 * 8 * 16);
    k.u.gemm.c_dtype = FSDP_DTYPE_BF16;
    fsdp_kernel_cost(&k, &flops, &bytes16);
    CU_ASSERT_EQUAL(bytes16, bytes / 2);

    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_RELU_BWD;
    k.u.relu_bwd.n = 100;
    fsdp_kernel_cost(&k, &flops, &bytes);
    CU_ASSERT_EQUAL(bytes, 1200.0);
    k.u.relu_bwd.dx_dtype = k.u.relu_bwd.dy_dtype = k.u.relu_bwd.y_dtype = FSDP_DTYPE_F16;
    fsdp_kernel_cost(&k, &flops, &bytes);
    CU_ASSERT_EQUAL(bytes, 600.0);

    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_MSE_LOSS;
    k.u.mse.n = 10;
    k.u.mse.dy = &bytes; /* any non-NULL pointer: cost reads no data */
    fsdp_kernel_cost(&k, &flops, &bytes);
    CU_ASSERT_EQUAL(bytes, 120.0);
    k.u.mse.y_dtype = k.u.mse.dy_dtype = FSDP_DTYPE_BF16;
    fsdp_kernel_cost(&k, &flops, &bytes);
    CU_ASSERT_EQUAL(bytes, 80.0);
}

/* chunk_copy's bytes: every element written, and of the source those of each row's block
 * below its end, against a loop over the rows (the cost counts them in closed form). */
static void test_cost_chunk_copy(void)
{
    static const size_t dims[] = {0, 1, 2, 3, 5, 7, 8, 64, 1000};
    fsdp_kernel_t k;

    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_CHUNK_COPY;
    for (size_t a = 0; a < sizeof(dims) / sizeof(dims[0]); a++)
        for (size_t b = 0; b < sizeof(dims) / sizeof(dims[0]); b++)
            for (size_t ld = 0; ld < 12; ld++)
                for (size_t i = 0; i < 28; i++) {
                    /* SIZE_MAX: a source with no end (the copy-out's) */
                    size_t rows = dims[a], cols = dims[b], read = 0, n = i < 27 ? 3 * i : SIZE_MAX;
                    double flops, bytes;

                    for (size_t r = 0; r < rows; r++)
                        read += r * ld >= n ? 0 : n - r * ld < cols ? n - r * ld : cols;
                    k.u.chunk_copy.rows = rows;
                    k.u.chunk_copy.cols = cols;
                    k.u.chunk_copy.src_ld = ld;
                    k.u.chunk_copy.src_n = n;
                    fsdp_kernel_cost(&k, &flops, &bytes);
                    CU_ASSERT_EQUAL(bytes, 4.0 * (double)(rows * cols + read));
                }
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"gemm_transposes", test_gemm_transposes},
        {"gemm_isa_bits", test_gemm_isa_bits},
        {"gemm_degenerate", test_gemm_degenerate},
        {"cast_round_trips", test_cast_round_trips},
        {"cast_int_and_copy", test_cast_int_and_copy},
        {"chunk_copy", test_chunk_copy},
        {"cost_chunk_copy", test_cost_chunk_copy},
        {"group_copy", test_group_copy},
        {"threads_bits", test_threads_bits},
        {"pack_cache", test_pack_cache},
        {"fill", test_fill},
        {"scale_div_axpy", test_scale_div_axpy},
        {"bias_relu", test_bias_relu},
        {"mse_sumsq", test_mse_sumsq},
        {"validation", test_validation},
        {"adamw", test_adamw},
        {"sgd", test_sgd},
        {"optim_config", test_optim_config},
        {"fd_linear_relu_mse", test_fd_linear_relu_mse},
        {"rng", test_rng},
        {"gemm_low_precision", test_gemm_low_precision},
        {"gemm_low_precision_edges", test_gemm_low_precision_edges},
        {"elementwise_low_precision", test_elementwise_low_precision},
        {"low_precision_validation", test_low_precision_validation},
        {"cost_dtypes", test_cost_dtypes},
        {NULL, NULL},
    };
    return fsdp_test_run("kernels", tests);
}
