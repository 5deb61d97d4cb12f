/* GFLOP/s of the sim backend's blocked GEMM on the GEMMs of a GPT-2 124M training step at 256
 * tokens per rank (d_model 768, MLP 3072, vocabulary 50257): the forward (NN: HF's Conv1D
 * weights are [in, out]), input-gradient (NT) and weight-gradient (TN) products of the qkv,
 * attention projection, MLP fc and MLP projection layers, and of the tied LM head (forward NT
 * against wte, dX NN, dwte TN). When configure found OpenBLAS, its cblas_sgemm on one thread is
 * timed in the same run on the same operands, with the ratio per shape (OpenBLAS's time over
 * the sim's: above 1 the sim is faster) and overall (the summed times, and the geometric mean
 * of the ratios).
 *
 *     bench_gemm [--quick] [--isa auto|generic|avx2] [--reps N]
 *
 * Times are the thread's CPU time (time descheduled on a shared machine does not count), best
 * of several repetitions, alternating the two libraries. A naive triple loop (one dot product
 * per element, k innermost) on the first NAIVE_ROWS rows checks the sim's result (max|diff|),
 * and OpenBLAS's too; --quick runs the attention projection's three products and an odd shape.
 *
 * Then the LM head's forward at 256, 128, 64, 32 and 16 rows (micro-batches of an accumulated
 * step): as every launch packs wte, against the sim's pack cache, which keeps it packed while
 * the core names it unchanged (one launch packs it into the kept buffer, later ones read it),
 * with the ratios to the first and a check that the bits agree; --quick runs 16 rows.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <fsdp/log.h>

#include "sim_kernels.h"

#ifdef FSDP_BENCH_OPENBLAS
#include <cblas.h>
#endif

#define NAIVE_ROWS 8

typedef struct bench_shape {
    size_t m, n, k;
    int ta, tb;
    const char *what;
} bench_shape_t;

typedef struct bench_total {
    double sim_s, blas_s, log_ratio;
    int n;
} bench_total_t;

static double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void bench_naive(int ta, int tb, size_t m, size_t n, size_t k, const float *a, size_t lda,
                        const float *b, size_t ldb, float *c, size_t ldc)
{
    for (size_t i = 0; i < m; i++) {
        for (size_t j = 0; j < n; j++) {
            float s = 0.0f;
            for (size_t p = 0; p < k; p++)
                s +=
                    (ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
            c[i * ldc + j] = s;
        }
    }
}

static void bench_fill(float *x, size_t n, unsigned seed)
{
    unsigned s = seed;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (float)((s >> 8) & 0xffff) / 65536.0f - 0.5f;
    }
}

static double bench_max_diff(const float *x, const float *y, size_t n)
{
    double max_err = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)x[i] - (double)y[i]);
        max_err = e > max_err || e != e ? e : max_err;
    }
    return max_err;
}

static int bench_one(const bench_shape_t *sh, int reps, bench_total_t *tot)
{
    size_t m = sh->m, n = sh->n, k = sh->k, mn = m < NAIVE_ROWS ? m : NAIVE_ROWS;
    int ta = sh->ta, tb = sh->tb;
    size_t lda = ta ? m : k, ldb = tb ? k : n;
    float *a = malloc(m * k * sizeof(float)), *b = malloc(k * n * sizeof(float));
    float *c = malloc(m * n * sizeof(float)), *cn = malloc(mn * n * sizeof(float));
    double best = 1e30, gf, flops = 2.0 * (double)m * (double)n * (double)k;
    int rc = 0;
#ifdef FSDP_BENCH_OPENBLAS
    float *cb = malloc(m * n * sizeof(float));
    double best_blas = 1e30;
#endif

    if (a == NULL || b == NULL || c == NULL || cn == NULL
#ifdef FSDP_BENCH_OPENBLAS
        || cb == NULL
#endif
    ) {
        fprintf(stderr, "bench_gemm: out of memory\n");
        rc = 1;
        goto out;
    }
    bench_fill(a, m * k, 1);
    bench_fill(b, k * n, 2);
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        if (fsdp_sim_gemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n) != FSDP_OK) {
            rc = 1;
            goto out;
        }
        double t = bench_now() - t0;
        best = t < best ? t : best;
#ifdef FSDP_BENCH_OPENBLAS
        t0 = bench_now();
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    (int)m, (int)n, (int)k, 1.0f, a, (int)lda, b, (int)ldb, 0.0f, cb, (int)n);
        t = bench_now() - t0;
        best_blas = t < best_blas ? t : best_blas;
#endif
    }
    /* the first mn rows of op(A) (for A^T: its first mn columns, same lda) */
    bench_naive(ta, tb, mn, n, k, a, lda, b, ldb, cn, n);
    gf = flops / best * 1e-9;
    printf("%5zu x %5zu x %5zu  %c%c  %-16s  sim %6.2f GFLOP/s", m, n, k, ta ? 'T' : 'N',
           tb ? 'T' : 'N', sh->what, gf);
    tot->sim_s += best;
#ifdef FSDP_BENCH_OPENBLAS
    printf("  openblas %6.2f GFLOP/s  x%5.3f", flops / best_blas * 1e-9, best_blas / best);
    printf("  max|diff| naive %.1e openblas %.1e\n", bench_max_diff(c, cn, mn * n),
           bench_max_diff(c, cb, m * n));
    tot->blas_s += best_blas;
    tot->log_ratio += log(best_blas / best);
#else
    printf("  max|diff| naive %.1e\n", bench_max_diff(c, cn, mn * n));
#endif
    tot->n++;
out:
    free(a);
    free(b);
    free(c);
    free(cn);
#ifdef FSDP_BENCH_OPENBLAS
    free(cb);
#endif
    return rc;
}

/* The LM head's forward GEMM of m rows (logits = x wte^T, wte [V, C]): packing wte into the
 * product's own buffer at every launch, packing it into a kept buffer (the pack cache's second
 * launch), and reading it from there (every launch after); 0, or 1 when the bits differ or
 * memory runs out. */
static int bench_packed_head(size_t m, int reps)
{
    const size_t n = 50257, k = 768;
    float *a = malloc(m * k * sizeof(float)), *b = malloc(n * k * sizeof(float));
    float *c[3] = {malloc(m * n * sizeof(float)), malloc(m * n * sizeof(float)),
                   malloc(m * n * sizeof(float))};
    float *packed = malloc(fsdp_sim_gemm_packed_b_floats(n, k) * sizeof(float));
    double best[3] = {1e30, 1e30, 1e30};
    int rc = 0;

    if (a == NULL || b == NULL || c[0] == NULL || c[1] == NULL || c[2] == NULL || packed == NULL) {
        fprintf(stderr, "bench_gemm: out of memory\n");
        rc = 1;
        goto out;
    }
    bench_fill(a, m * k, 3);
    bench_fill(b, n * k, 4);
    memset(packed, 0, fsdp_sim_gemm_packed_b_floats(n, k) * sizeof(float)); /* its pages in */
    for (int r = 0; r < reps && rc == 0; r++)
        for (int v = 0; v < 3 && rc == 0; v++) { /* alternating: own buffer, filling, reading */
            double t0 = bench_now();
            if (fsdp_sim_gemm_ex_packed(NULL, 0, 1, m, n, k, 1.0f, a, FSDP_DTYPE_F32, k, b,
                                        FSDP_DTYPE_F32, k, 0.0f, c[v], FSDP_DTYPE_F32, n, NULL,
                                        v > 0 ? packed : NULL, v == 1) != FSDP_OK)
                rc = 1;
            double t = bench_now() - t0;
            best[v] = t < best[v] ? t : best[v];
        }
    if (rc == 0 && (memcmp(c[0], c[1], m * n * sizeof(float)) != 0 ||
                    memcmp(c[0], c[2], m * n * sizeof(float)) != 0)) {
        fprintf(stderr, "bench_gemm: the packed wte gave other bits at %zu rows\n", m);
        rc = 1;
    }
    if (rc == 0)
        printf("%5zu x %5zu x %5zu  NT  lm head fwd       packing %7.2f ms, packing it to keep "
               "%7.2f ms (x%.2f), reading it %7.2f ms (x%.2f)\n",
               m, n, k, 1e3 * best[0], 1e3 * best[1], best[0] / best[1], 1e3 * best[2],
               best[0] / best[2]);
out:
    free(a);
    free(b);
    for (int v = 0; v < 3; v++)
        free(c[v]);
    free(packed);
    return rc;
}

int main(int argc, char **argv)
{
#define GPT2_LAYER(in, out, name)                                                                  \
    {256, out, in, 0, 0, name " fwd"}, {256, in, out, 0, 1, name " dX"},                           \
        {in, out, 256, 1, 0, name " dW"}
    static const bench_shape_t full[] = {
        GPT2_LAYER(768, 2304, "qkv"),
        GPT2_LAYER(768, 768, "attn proj"),
        GPT2_LAYER(768, 3072, "mlp fc"),
        GPT2_LAYER(3072, 768, "mlp proj"),
        {256, 50257, 768, 0, 1, "lm head fwd"},
        {256, 768, 50257, 0, 0, "lm head dX"},
        {50257, 768, 256, 1, 0, "lm head dW"},
    };
    static const bench_shape_t quick[] = {
        GPT2_LAYER(768, 768, "attn proj"),
        {97, 131, 61, 0, 1, "odd"},
    };
#undef GPT2_LAYER
    const bench_shape_t *shapes = full;
    size_t nshapes = sizeof(full) / sizeof(full[0]);
    int reps = 3, rc = 0;
    bench_total_t tot = {0};

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            shapes = quick;
            nshapes = sizeof(quick) / sizeof(quick[0]);
            reps = 2;
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps = atoi(argv[++i]);
            if (reps < 1 || reps > 1000) {
                fprintf(stderr, "bench_gemm: --reps %s: 1 to 1000\n", argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "--isa") == 0 && i + 1 < argc) {
            const char *s = argv[++i];
            fsdp_sim_gemm_isa_t isa = strcmp(s, "generic") == 0 ? FSDP_SIM_GEMM_GENERIC
                                      : strcmp(s, "avx2") == 0  ? FSDP_SIM_GEMM_AVX2
                                                                : FSDP_SIM_GEMM_AUTO;
            if (!fsdp_sim_gemm_set_isa(isa)) {
                fprintf(stderr, "bench_gemm: isa %s not available here\n", s);
                return 77;
            }
        } else {
            fprintf(stderr, "usage: %s [--quick] [--isa auto|generic|avx2] [--reps N]\n", argv[0]);
            return 2;
        }
    }
#ifdef FSDP_BENCH_OPENBLAS
    openblas_set_num_threads(1);
    printf("sim gemm, micro-kernel %s, KC %d, against OpenBLAS %s on 1 thread; thread CPU time, "
           "best of %d\n",
           fsdp_sim_gemm_isa_name(), FSDP_SIM_GEMM_KC, openblas_get_config(), reps);
#else
    printf("sim gemm, micro-kernel %s, KC %d, thread CPU time, best of %d (no OpenBLAS baseline: "
           "configure did not find it)\n",
           fsdp_sim_gemm_isa_name(), FSDP_SIM_GEMM_KC, reps);
#endif
    for (size_t s = 0; s < nshapes && rc == 0; s++)
        rc = bench_one(&shapes[s], reps, &tot);
    if (rc == 0 && tot.n > 0) {
#ifdef FSDP_BENCH_OPENBLAS
        printf("overall: sim %.3f s, openblas %.3f s: x%.3f of OpenBLAS's speed (summed times); "
               "geometric mean of the %d shapes x%.3f\n",
               tot.sim_s, tot.blas_s, tot.blas_s / tot.sim_s, tot.n, exp(tot.log_ratio / tot.n));
#else
        printf("overall: sim %.3f s over %d shapes\n", tot.sim_s, tot.n);
#endif
    }
    if (rc == 0)
        printf("the LM head against a wte packed once (the pack cache), best of %d:\n", reps);
    for (size_t rows = shapes == quick ? 16 : 256; rc == 0 && rows >= 16; rows /= 2)
        rc = bench_packed_head(rows, reps);
    return rc;
}
