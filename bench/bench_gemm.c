/* GFLOP/s of the sim backend's blocked GEMM against a naive triple loop, measured in the same
 * run, on shapes of a small GPT-2 (d_model 768, MLP 3072, 256 or 1024 tokens per rank) in the
 * four transpose combinations a Linear layer uses (forward NT, dX NN, dW TN, and TT).
 *
 *     bench_gemm [--quick] [--isa auto|generic|avx2]
 *
 * The naive loop (one dot product per element, k innermost) is timed on the first
 * min(M, 64) rows: its cost is linear in M, and that keeps the run short. Times are the
 * thread's CPU time (time descheduled on a shared machine does not count), best of several
 * repetitions. The blocked result is checked against the naive one on the rows both computed.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <fsdp/log.h>

#include "sim_kernels.h"

#define NAIVE_ROWS 64

typedef struct bench_shape {
    size_t m, n, k;
    const char *what;
} bench_shape_t;

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

static int bench_one(const bench_shape_t *sh, int ta, int tb, int reps)
{
    size_t m = sh->m, n = sh->n, k = sh->k, mn = m < NAIVE_ROWS ? m : NAIVE_ROWS;
    size_t lda = ta ? m : k, ldb = tb ? k : n;
    float *a = malloc(m * k * sizeof(float)), *b = malloc(k * n * sizeof(float));
    float *c = malloc(m * n * sizeof(float)), *cn = malloc(mn * n * sizeof(float));
    double best = 1e30, best_naive = 1e30, max_err = 0.0;
    int rc = 0;

    if (a == NULL || b == NULL || c == NULL || cn == NULL) {
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
    }
    for (int r = 0; r < (reps > 2 ? 2 : reps); r++) {
        double t0 = bench_now();
        /* the first mn rows of op(A) (for A^T: its first mn columns, same lda) */
        bench_naive(ta, tb, mn, n, k, a, lda, b, ldb, cn, n);
        double t = bench_now() - t0;
        best_naive = t < best_naive ? t : best_naive;
    }
    for (size_t i = 0; i < mn * n; i++) {
        double e = fabs((double)c[i] - (double)cn[i]);
        max_err = e > max_err ? e : max_err;
    }
    {
        double gf = 2.0 * (double)m * (double)n * (double)k / best * 1e-9;
        double gf_naive = 2.0 * (double)mn * (double)n * (double)k / best_naive * 1e-9;
        printf("%5zu x %5zu x %5zu  %c%c  %-10s  blocked %7.2f GFLOP/s  naive %6.2f GFLOP/s  "
               "x%6.1f  max|diff| %.1e\n",
               m, n, k, ta ? 'T' : 'N', tb ? 'T' : 'N', sh->what, gf, gf_naive, gf / gf_naive,
               max_err);
    }
out:
    free(a);
    free(b);
    free(c);
    free(cn);
    return rc;
}

int main(int argc, char **argv)
{
    static const bench_shape_t full[] = {
        {256, 768, 768, "attn proj"}, {256, 3072, 768, "mlp fc"},    {256, 768, 3072, "mlp proj"},
        {1024, 3072, 768, "mlp fc"},  {1024, 768, 768, "attn proj"},
    };
    static const bench_shape_t quick[] = {
        {256, 768, 768, "attn proj"},
        {97, 131, 61, "odd"},
    };
    const bench_shape_t *shapes = full;
    size_t nshapes = sizeof(full) / sizeof(full[0]);
    int reps = 5, rc = 0;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            shapes = quick;
            nshapes = sizeof(quick) / sizeof(quick[0]);
            reps = 2;
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
            fprintf(stderr, "usage: %s [--quick] [--isa auto|generic|avx2]\n", argv[0]);
            return 2;
        }
    }
    printf("sim gemm, micro-kernel %s, KC %d, thread CPU time, best of %d (naive: first %d rows, "
           "best of 2)\n",
           fsdp_sim_gemm_isa_name(), FSDP_SIM_GEMM_KC, reps, NAIVE_ROWS);
    for (size_t s = 0; s < nshapes && rc == 0; s++)
        for (int t = 0; t < 4 && rc == 0; t++)
            rc = bench_one(&shapes[s], t >> 1, t & 1, reps);
    return rc;
}
