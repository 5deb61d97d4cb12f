/* Mixed precision rounds once per torch op: each kernel alone in bf16 and f16 against values
 * computed here from the rule (the op's exact result, or its f32 result where the op computes
 * in f32, rounded once to nearest even), and a one-layer Linear trained under FSDP's
 * MixedPrecision(param_dtype=bf16, reduce_dtype=f32) against the same rule.
 *
 * The rounding is written here from its definition (rint on the significand, in double), not
 * taken from the library. Where inputs are small dyadic numbers, every f32 sum of the op is
 * exact, so the expected values hold for any summation order: those of cuBLAS and torch's
 * reductions too, whose orders differ from the sim's. */
#include <fsdp/fsdp.h>
#include <fsdp/nn.h>
#include <fsdp/sim.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/core_hidden.h"
#include "test_util.h"

static const fsdp_dtype_t dts[] = {FSDP_DTYPE_BF16, FSDP_DTYPE_F16};

/* x rounded to nearest even with the significant bits of dt (8 for bf16, 11 for f16; below
 * 2^-14, f16's subnormals: multiples of 2^-24); no test value overflows */
static double rne(double x, fsdp_dtype_t dt)
{
    int bits = dt == FSDP_DTYPE_BF16 ? 8 : 11, e;
    if (x == 0.0 || !isfinite(x))
        return x;
    if (dt == FSDP_DTYPE_F16 && fabs(x) < 0x1p-14)
        return ldexp(rint(ldexp(x, 24)), -24);
    (void)frexp(x, &e);
    return ldexp(rint(ldexp(x, bits - e)), e - bits);
}

/* Is x within rel of a rounding midpoint of dt? Where an op computes in f32 (exp, rsqrt), its
 * result is known here only to about 1e-7, and such a value could round either way. */
static int near_tie(double x, fsdp_dtype_t dt, double rel)
{
    int bits = dt == FSDP_DTYPE_BF16 ? 8 : 11, e;
    double s, f;
    if (x == 0.0)
        return 0;
    (void)frexp(x, &e);
    s = ldexp(fabs(x), bits - e);
    f = s - floor(s);
    return fabs(f - 0.5) < rel * s;
}

static uint16_t to16(double x, fsdp_dtype_t dt)
{
    return dt == FSDP_DTYPE_BF16 ? fsdp_f32_to_bf16((float)x) : fsdp_f32_to_f16((float)x);
}

static double from16(uint16_t h, fsdp_dtype_t dt)
{
    return dt == FSDP_DTYPE_BF16 ? fsdp_bf16_to_f32(h) : fsdp_f16_to_f32(h);
}

static uint64_t rng_state = 1;

/* a dyadic value k / 2^shift with |k| < span, exact in both 16-bit formats */
static double dyadic(int span, int shift)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return ldexp((double)((int)((rng_state >> 33) % (uint64_t)(2 * span - 1)) - (span - 1)),
                 -shift);
}

static void fill16(uint16_t *h, size_t n, int span, int shift, fsdp_dtype_t dt)
{
    for (size_t i = 0; i < n; i++)
        h[i] = to16(dyadic(span, shift), dt);
}

#define R 6
#define K 5
#define N 7

/* ---- Linear and Conv1D: the bias added to the f32 product, one rounding ---- */

/* y = x op(W) + b (+ residual): trans_b 1 is nn.Linear (W [N, K]), 0 is HF's Conv1D (W [K, N]) */
static void check_linear_fwd(fsdp_dtype_t dt, int trans_b, int residual, int *twice_p)
{
    uint16_t x[R * K], w[K * N], b[N], res[R * N], y[R * N];
    fsdp_kernel_t k = {.kind = FSDP_K_GEMM};
    int bad = 0;

    fill16(x, R * K, 60, 3, dt);
    fill16(w, K * N, 60, 4, dt);
    fill16(b, N, 100, 5, dt);
    fill16(res, R * N, 100, 4, dt);
    k.u.gemm.trans_b = trans_b;
    k.u.gemm.m = R;
    k.u.gemm.n = N;
    k.u.gemm.k = K;
    k.u.gemm.alpha = 1.0f;
    k.u.gemm.a = x;
    k.u.gemm.lda = K;
    k.u.gemm.b = w;
    k.u.gemm.ldb = trans_b ? K : N;
    k.u.gemm.c = y;
    k.u.gemm.ldc = N;
    k.u.gemm.a_dtype = k.u.gemm.b_dtype = k.u.gemm.c_dtype = dt;
    k.u.gemm.epilogue.bias = b;
    k.u.gemm.epilogue.bias_dtype = dt;
    k.u.gemm.epilogue.residual = residual ? res : NULL;
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&k), FSDP_OK);
    for (int i = 0; i < R; i++)
        for (int j = 0; j < N; j++) {
            double s = 0.0, want;
            for (int p = 0; p < K; p++)
                s += from16(x[i * K + p], dt) * from16(w[trans_b ? j * K + p : p * N + j], dt);
            want = rne(s + from16(b[j], dt), dt); /* addmm */
            *twice_p += want != rne(rne(s, dt) + from16(b[j], dt), dt);
            if (residual) /* the block's add: a second op, a second rounding */
                want = rne(want + from16(res[i * N + j], dt), dt);
            bad += from16(y[i * N + j], dt) != want;
        }
    CU_ASSERT_EQUAL(bad, 0);
}

static void test_linear_conv1d_fwd(void)
{
    for (int d = 0; d < 2; d++) {
        int twice = 0;
        rng_state = 3 + (uint64_t)d;
        for (int rep = 0; rep < 8; rep++) {
            check_linear_fwd(dts[d], 1, 0, &twice);
            check_linear_fwd(dts[d], 0, 0, &twice);
            check_linear_fwd(dts[d], 0, 1, &twice);
        }
        fprintf(stderr, "\n  %s: %d of %d outputs differ where the product is rounded first",
                fsdp_dtype_name(dts[d]), twice, 24 * R * N);
        CU_ASSERT(twice > 0); /* the inputs tell one rounding from two */
    }
}

/* nn.Linear's backward: dx = dy W, dW = dy^T x (each one GEMM rounded once), db = the column
 * sums of dy in f32, rounded once (into a fresh gradient) */
static void test_linear_bwd(void)
{
    for (int d = 0; d < 2; d++) {
        fsdp_dtype_t dt = dts[d];
        uint16_t x[R * K], w[N * K], dy[R * N], dx[R * K], dw[N * K], db[N];
        fsdp_kernel_t k;
        int bad = 0;

        rng_state = 17 + (uint64_t)d;
        fill16(x, R * K, 60, 3, dt);
        fill16(w, N * K, 60, 4, dt);
        fill16(dy, R * N, 120, 6, dt);
        memset(db, 0, sizeof(db));
        memset(&k, 0, sizeof(k));
        k.kind = FSDP_K_GEMM; /* dx[R, K] = dy[R, N] W[N, K] */
        k.u.gemm.m = R, k.u.gemm.n = K, k.u.gemm.k = N;
        k.u.gemm.alpha = 1.0f;
        k.u.gemm.a = dy, k.u.gemm.lda = N, k.u.gemm.b = w, k.u.gemm.ldb = K;
        k.u.gemm.c = dx, k.u.gemm.ldc = K;
        k.u.gemm.a_dtype = k.u.gemm.b_dtype = k.u.gemm.c_dtype = dt;
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&k), FSDP_OK);
        k.u.gemm.trans_a = 1; /* dW[N, K] = dy^T x */
        k.u.gemm.m = N, k.u.gemm.n = K, k.u.gemm.k = R;
        k.u.gemm.a = dy, k.u.gemm.lda = N, k.u.gemm.b = x, k.u.gemm.ldb = K;
        k.u.gemm.c = dw, k.u.gemm.ldc = K;
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&k), FSDP_OK);
        memset(&k, 0, sizeof(k));
        k.kind = FSDP_K_BIAS_GRAD;
        k.u.bias_grad.dbias = db, k.u.bias_grad.dy = dy;
        k.u.bias_grad.rows = R, k.u.bias_grad.cols = N;
        k.u.bias_grad.dbias_dtype = k.u.bias_grad.dy_dtype = dt;
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&k), FSDP_OK);
        for (int i = 0; i < R; i++)
            for (int p = 0; p < K; p++) {
                double s = 0.0;
                for (int j = 0; j < N; j++)
                    s += from16(dy[i * N + j], dt) * from16(w[j * K + p], dt);
                bad += from16(dx[i * K + p], dt) != rne(s, dt);
            }
        for (int j = 0; j < N; j++) {
            double sb = 0.0;
            for (int p = 0; p < K; p++) {
                double s = 0.0;
                for (int i = 0; i < R; i++)
                    s += from16(dy[i * N + j], dt) * from16(x[i * K + p], dt);
                bad += from16(dw[j * K + p], dt) != rne(s, dt);
            }
            for (int i = 0; i < R; i++)
                sb += from16(dy[i * N + j], dt);
            bad += from16(db[j], dt) != rne(sb, dt);
        }
        CU_ASSERT_EQUAL(bad, 0);
    }
}

/* ---- a weight gradient accumulated into an existing one: autograd's two roundings ----
 *
 * Under no_sync (or a tied weight's second use) autograd adds the new gradient, dy^T x rounded
 * once by its GEMM, to the gradient already held in the dtype, and rounds the sum: the GEMM with
 * beta = 1 and the epilogue's accumulate. Without it, beta = 1 adds the old gradient to the f32
 * product and rounds once. In f32 both are the plain beta = 1 GEMM. */

#define AK 40 /* rows summed: k of the GEMM */

static void test_grad_accumulate(void)
{
    for (int d = 0; d < 2; d++) {
        fsdp_dtype_t dt = dts[d];
        uint16_t x[AK * K], dy[AK * N], dw0[N * K], dw[N * K], once[N * K];
        float x32[AK * K], dy32[AK * N], w32[N * K], plain32[N * K];
        fsdp_kernel_t k = {.kind = FSDP_K_GEMM};
        int bad = 0, twice = 0;

        rng_state = 23 + (uint64_t)d;
        fill16(x, AK * K, 60, 3, dt);
        fill16(dy, AK * N, 120, 6, dt);
        fill16(dw0, N * K, 2000, 4, dt); /* the gradient of earlier micro-batches */
        memcpy(dw, dw0, sizeof(dw));
        memcpy(once, dw0, sizeof(once));
        k.u.gemm.trans_a = 1; /* dW[N, K] += dy^T x */
        k.u.gemm.m = N, k.u.gemm.n = K, k.u.gemm.k = AK;
        k.u.gemm.alpha = 1.0f;
        k.u.gemm.a = dy, k.u.gemm.lda = N, k.u.gemm.b = x, k.u.gemm.ldb = K;
        k.u.gemm.beta = 1.0f;
        k.u.gemm.c = once, k.u.gemm.ldc = K;
        k.u.gemm.a_dtype = k.u.gemm.b_dtype = k.u.gemm.c_dtype = dt;
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&k), FSDP_OK); /* beta = 1 alone */
        k.u.gemm.c = dw;
        k.u.gemm.epilogue.accumulate = 1;
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&k), FSDP_OK);
        for (int j = 0; j < N; j++)
            for (int p = 0; p < K; p++) {
                double s = 0.0, old = from16(dw0[j * K + p], dt);
                for (int i = 0; i < AK; i++)
                    s += from16(dy[i * N + j], dt) * from16(x[i * K + p], dt);
                bad += from16(dw[j * K + p], dt) != rne(old + rne(s, dt), dt);
                bad += from16(once[j * K + p], dt) != rne(old + s, dt);
                twice += rne(old + rne(s, dt), dt) != rne(old + s, dt);
            }
        fprintf(stderr, "\n  %s: %d of %d accumulated gradients differ from one rounding",
                fsdp_dtype_name(dt), twice, N * K);
        CU_ASSERT_EQUAL(bad, 0);
        CU_ASSERT(twice > 0); /* the inputs tell two roundings from one */

        /* accumulate needs beta 1 */
        k.u.gemm.beta = 0.0f;
        CU_ASSERT_EQUAL(fsdp_sim_kernel_exec(&k), FSDP_ERR_INVALID_PARAM);

        /* f32: the same bits as beta = 1 without it */
        for (int e = 0; e < AK * K; e++)
            x32[e] = (float)from16(x[e], dt);
        for (int e = 0; e < AK * N; e++)
            dy32[e] = (float)from16(dy[e], dt);
        for (int e = 0; e < N * K; e++)
            w32[e] = plain32[e] = (float)from16(dw0[e], dt) + 0x1p-20f;
        k.u.gemm.a = dy32, k.u.gemm.b = x32;
        k.u.gemm.beta = 1.0f;
        k.u.gemm.a_dtype = k.u.gemm.b_dtype = k.u.gemm.c_dtype = FSDP_DTYPE_F32;
        k.u.gemm.c = w32;
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&k), FSDP_OK);
        k.u.gemm.c = plain32;
        k.u.gemm.epilogue.accumulate = 0;
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&k), FSDP_OK);
        CU_ASSERT(memcmp(w32, plain32, sizeof(w32)) == 0);
    }
}

/* ---- LayerNorm: statistics in f32, (x - mean) rstd w + b rounded once ---- */

#define LC 12

static void test_layernorm(void)
{
    for (int d = 0; d < 2; d++) {
        fsdp_dtype_t dt = dts[d];
        uint16_t x[R * LC], w[LC], b[LC], y[R * LC];
        float mean[R], rstd[R];
        fsdp_kernel_t k = {.kind = FSDP_K_LAYERNORM_FWD};
        int bad = 0, ties = 0, twice = 0;

        rng_state = 29 + (uint64_t)d;
        fill16(x, R * LC, 100, 4, dt);
        fill16(w, LC, 60, 5, dt);
        fill16(b, LC, 60, 5, dt);
        k.u.layernorm_fwd.y = y, k.u.layernorm_fwd.mean = mean, k.u.layernorm_fwd.rstd = rstd;
        k.u.layernorm_fwd.x = x, k.u.layernorm_fwd.weight = w, k.u.layernorm_fwd.bias = b;
        k.u.layernorm_fwd.rows = R, k.u.layernorm_fwd.cols = LC;
        k.u.layernorm_fwd.eps = 1e-5f;
        k.u.layernorm_fwd.dtype = dt;
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&k), FSDP_OK);
        for (int r = 0; r < R; r++) {
            double m = 0.0, v = 0.0, rs;
            for (int c = 0; c < LC; c++)
                m += from16(x[r * LC + c], dt);
            m /= LC;
            for (int c = 0; c < LC; c++)
                v += (from16(x[r * LC + c], dt) - m) * (from16(x[r * LC + c], dt) - m);
            rs = 1.0 / sqrt(v / LC + 1e-5);
            for (int c = 0; c < LC; c++) {
                double xh = (from16(x[r * LC + c], dt) - m) * rs;
                double want = xh * from16(w[c], dt) + from16(b[c], dt);
                twice +=
                    rne(want, dt) != rne(rne(xh * from16(w[c], dt), dt) + from16(b[c], dt), dt);
                if (near_tie(want, dt, 1e-6)) {
                    ties++;
                    continue;
                }
                bad += from16(y[r * LC + c], dt) != rne(want, dt);
            }
        }
        CU_ASSERT_EQUAL(bad, 0);
        CU_ASSERT(ties <= 2);
        CU_ASSERT(twice > 0);
    }
}

/* ---- softmax of scaled scores: the scaling rounds, then the softmax ---- */

#define SC 9

static void test_softmax(void)
{
    const float scale = 0.35f;
    for (int d = 0; d < 2; d++) {
        fsdp_dtype_t dt = dts[d];
        uint16_t x[R * SC], y[R * SC], dy[R * SC], dx[R * SC];
        fsdp_kernel_t k = {.kind = FSDP_K_SOFTMAX_FWD};
        int bad = 0, ties = 0, differs = 0;

        rng_state = 41 + (uint64_t)d;
        fill16(x, R * SC, 100, 4, dt);
        fill16(dy, R * SC, 100, 6, dt);
        k.u.softmax_fwd.y = y, k.u.softmax_fwd.x = x;
        k.u.softmax_fwd.rows = R, k.u.softmax_fwd.cols = SC;
        k.u.softmax_fwd.scale = scale;
        k.u.softmax_fwd.dtype = dt;
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&k), FSDP_OK);
        memset(&k, 0, sizeof(k));
        k.kind = FSDP_K_SOFTMAX_BWD;
        k.u.softmax_bwd.dx = dx, k.u.softmax_bwd.dy = dy, k.u.softmax_bwd.y = y;
        k.u.softmax_bwd.rows = R, k.u.softmax_bwd.cols = SC;
        k.u.softmax_bwd.scale = scale;
        k.u.softmax_bwd.dtype = dt;
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&k), FSDP_OK);
        for (int r = 0; r < R; r++) {
            double z[SC], mx = -INFINITY, sum = 0.0, dot = 0.0, sum_u = 0.0;
            for (int c = 0; c < SC; c++) { /* the multiply by scale, f32, rounded to dt */
                z[c] = rne((double)(float)((float)from16(x[r * SC + c], dt) * scale), dt);
                mx = fmax(mx, z[c]);
            }
            for (int c = 0; c < SC; c++) {
                sum += exp(z[c] - mx);
                sum_u += exp((double)from16(x[r * SC + c], dt) * scale - mx);
            }
            for (int c = 0; c < SC; c++) {
                double p = exp(z[c] - mx) / sum;
                differs += rne(p, dt) !=
                           rne(exp((double)from16(x[r * SC + c], dt) * scale - mx) / sum_u, dt);
                if (near_tie(p, dt, 1e-6)) {
                    ties++;
                    continue;
                }
                bad += from16(y[r * SC + c], dt) != rne(p, dt);
            }
            /* the backward from the probabilities the forward stored */
            for (int c = 0; c < SC; c++)
                dot += from16(y[r * SC + c], dt) * from16(dy[r * SC + c], dt);
            for (int c = 0; c < SC; c++) {
                double g = from16(y[r * SC + c], dt) * (from16(dy[r * SC + c], dt) - dot);
                if (near_tie(g, dt, 1e-6) || near_tie(scale * rne(g, dt), dt, 1e-6)) {
                    ties++;
                    continue;
                }
                bad += from16(dx[r * SC + c], dt) != rne((double)scale * rne(g, dt), dt);
            }
        }
        fprintf(stderr,
                "\n  %s: %d of %d probabilities differ from a softmax of unrounded scores; %d "
                "values within 1e-6 of a tie not judged",
                fsdp_dtype_name(dt), differs, R * SC, ties);
        CU_ASSERT_EQUAL(bad, 0);
        CU_ASSERT(ties <= R * SC / 4); /* of 2 R SC values judged */
    }
}

/* ---- HF's GPT-2 attention: the scores divided by sqrt(head size) held in the dtype ----
 *
 * GPT2Attention divides the scores by torch.full([], sqrt(hs), dtype=dtype): the divisor is
 * rounded to the dtype (sqrt(32) = 5.65685... is 5.65625 in bf16 and f16), the quotient is
 * computed in f32 and rounded, then softmax; the backward divides softmax's rounded gradient by
 * the same divisor. Head size 32 is gpt2-tiny's; multiplying by 1/sqrt(32) in f32 (the divisor
 * unrounded) gives other scores. Causal rows of T columns, as the model launches them. */

#define HS 32
#define DT 16
#define DR (2 * DT)

static void test_softmax_divisor(void)
{
    const float div = (float)sqrt((double)HS);
    const double dv = 5.65625; /* sqrt(32) rounded to 8 (bf16) or 11 (f16) significant bits */
    for (int d = 0; d < 2; d++) {
        fsdp_dtype_t dt = dts[d];
        uint16_t x[DR * DT], y[DR * DT], dy[DR * DT], dx[DR * DT];
        fsdp_kernel_t k = {.kind = FSDP_K_SOFTMAX_FWD};
        int bad = 0, ties = 0, old = 0, scores = 0;

        CU_ASSERT_EQUAL(rne(div, dt), dv);
        rng_state = 47 + (uint64_t)d;
        fill16(x, DR * DT, 1000, 6, dt); /* scores in (-16, 16) */
        fill16(dy, DR * DT, 100, 6, dt);
        k.u.softmax_fwd.y = y, k.u.softmax_fwd.x = x;
        k.u.softmax_fwd.rows = DR, k.u.softmax_fwd.cols = DT;
        k.u.softmax_fwd.scale = 1.0f / div; /* unused with a divisor */
        k.u.softmax_fwd.divisor = div;
        k.u.softmax_fwd.causal = 1;
        k.u.softmax_fwd.dtype = dt;
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&k), FSDP_OK);
        memset(&k, 0, sizeof(k));
        k.kind = FSDP_K_SOFTMAX_BWD;
        k.u.softmax_bwd.dx = dx, k.u.softmax_bwd.dy = dy, k.u.softmax_bwd.y = y;
        k.u.softmax_bwd.rows = DR, k.u.softmax_bwd.cols = DT;
        k.u.softmax_bwd.scale = 1.0f / div;
        k.u.softmax_bwd.divisor = div;
        k.u.softmax_bwd.causal = 1;
        k.u.softmax_bwd.dtype = dt;
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&k), FSDP_OK);
        for (int r = 0; r < DR; r++) {
            const int valid = r % DT + 1;
            double z[DT], mx = -INFINITY, sum = 0.0, dot = 0.0;
            for (int c = 0; c < valid; c++) { /* the division in f32, rounded to dt */
                double xv = from16(x[r * DT + c], dt);
                z[c] = rne((double)(float)(xv / dv), dt);
                old += z[c] != rne((double)((float)xv * (1.0f / div)), dt);
                scores++;
                mx = fmax(mx, z[c]);
            }
            for (int c = 0; c < valid; c++)
                sum += exp(z[c] - mx);
            for (int c = 0; c < DT; c++) {
                double p = c < valid ? exp(z[c] - mx) / sum : 0.0;
                if (near_tie(p, dt, 1e-6)) {
                    ties++;
                    continue;
                }
                bad += from16(y[r * DT + c], dt) != rne(p, dt);
            }
            for (int c = 0; c < valid; c++)
                dot += from16(y[r * DT + c], dt) * from16(dy[r * DT + c], dt);
            for (int c = 0; c < DT; c++) {
                double g = c < valid
                               ? from16(y[r * DT + c], dt) * (from16(dy[r * DT + c], dt) - dot)
                               : 0.0;
                if (near_tie(g, dt, 1e-6)) {
                    ties++;
                    continue;
                }
                /* the quotient of two values of dt in f32, then rounded to dt */
                bad += from16(dx[r * DT + c], dt) != rne((double)(float)(rne(g, dt) / dv), dt);
            }
        }
        fprintf(stderr,
                "\n  %s: %d of %d scaled scores differ where 1/sqrt(%d) multiplies in f32; %d "
                "values within 1e-6 of a tie not judged",
                fsdp_dtype_name(dt), old, scores, HS, ties);
        CU_ASSERT_EQUAL(bad, 0);
        CU_ASSERT(old > 0); /* the inputs tell the division from the multiply */
        CU_ASSERT(ties <= DR * DT / 4);
    }
}

/* ---- embedding backward: a token's rows summed in f32, rounded once, then accumulated ---- */

#define ER 10
#define EC 20 /* fewer columns than a block of 32 (lanes.h) */
#define EV 4
#define ES 5

static void test_embedding_bwd(void)
{
    static const int32_t tok[ER] = {1, 3, 1, 0, 1, 3, 2, 1, -1, 3};
    for (int d = 0; d < 2; d++) {
        fsdp_dtype_t dt = dts[d];
        uint16_t dwte[EV * EC], dwte0[EV * EC], dwpe[ES * EC], dy[ER * EC];
        fsdp_kernel_t k = {.kind = FSDP_K_EMBEDDING_BWD};
        int bad = 0, twice = 0;

        rng_state = 53 + (uint64_t)d;
        fill16(dy, ER * EC, 2000, 8, dt);  /* 11 bits: sums that f16 rounds too */
        fill16(dwte, EV * EC, 120, 2, dt); /* the LM head's gradient, already there */
        memcpy(dwte0, dwte, sizeof(dwte));
        memset(dwpe, 0, sizeof(dwpe));
        k.u.embedding_bwd.dwte = dwte, k.u.embedding_bwd.dwpe = dwpe, k.u.embedding_bwd.dy = dy;
        k.u.embedding_bwd.tokens = tok;
        k.u.embedding_bwd.rows = ER, k.u.embedding_bwd.cols = EC;
        k.u.embedding_bwd.seq = ES, k.u.embedding_bwd.vocab = EV;
        k.u.embedding_bwd.dtype = dt;
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&k), FSDP_OK);
        for (int c = 0; c < EC; c++) {
            for (int t = 0; t < EV; t++) {
                double s = 0.0, each = from16(dwte0[t * EC + c], dt);
                for (int r = 0; r < ER; r++)
                    if (tok[r] == t) {
                        s += from16(dy[r * EC + c], dt);
                        each = rne(each + from16(dy[r * EC + c], dt), dt);
                    }
                s = rne(from16(dwte0[t * EC + c], dt) + rne(s, dt), dt);
                bad += from16(dwte[t * EC + c], dt) != s;
                twice += s != each;
            }
            for (int p = 0; p < ES; p++) {
                double s = 0.0;
                for (int r = p; r < ER; r += ES)
                    s += from16(dy[r * EC + c], dt);
                bad += from16(dwpe[p * EC + c], dt) != rne(s, dt);
            }
        }
        CU_ASSERT_EQUAL(bad, 0);
        CU_ASSERT(twice > 0); /* rounding every row's add would differ */
    }
}

/* ---- a one-layer Linear under FSDP: MixedPrecision(param_dtype=bf16, reduce_dtype=f32) ----
 *
 * 2 ranks of 4 rows, FULL_SHARD, MSE loss against an f32 target. Per the rule: x and the
 * parameters rounded to bf16; y = rne(x W^T + b); the loss in f32 from y; dy = rne((y - t) *
 * 2 / n); each rank's dW = rne(dy^T x) and db = rne(sum of dy's rows); the gradients cast to f32,
 * divided by 2 (FSDP's pre-divide) and summed over the ranks. The inputs are dyadic, so every
 * sum is exact and the values are those of any summation order. */

#define LI 4
#define LO 4
#define LB 8 /* rows, 4 a rank */

typedef struct lin_ctx {
    float w[LO * LI], b[LO], x[LB * LI], t[LB * LO];
    float loss[2], grad[LO * LI + LO];
} lin_ctx_t;

static fsdp_status_t lin_rank(fsdp_dev_t *dev, void *arg)
{
    lin_ctx_t *c = arg;
    const int dims[2] = {LI, LO};
    const int rows = LB / 2;
    fsdp_config_t fc;
    fsdp_t *fs;
    fsdp_mlp_t *mlp = NULL;
    fsdp_status_t status;

    fsdp_config_init(&fc);
    fc.strategy = FSDP_FULL_SHARD;
    fc.mixed_precision.param_dtype = FSDP_DTYPE_BF16;
    fc.mixed_precision.reduce_dtype = FSDP_DTYPE_F32;
    status = fsdp_create(dev, &fc, &fs);
    if (status != FSDP_OK)
        return status;
    status = fsdp_mlp_create(fs, dims, 1, &mlp);
    if (status == FSDP_OK)
        status = fsdp_unit_set_param(fsdp_mlp_layer(mlp, 0), 0, c->w);
    if (status == FSDP_OK)
        status = fsdp_unit_set_param(fsdp_mlp_layer(mlp, 0), 1, c->b);
    if (status == FSDP_OK)
        status = fsdp_mlp_forward_backward(mlp, c->x + dev->rank * rows * LI,
                                           c->t + dev->rank * rows * LO, (size_t)rows,
                                           &c->loss[dev->rank]);
    if (status == FSDP_OK) { /* this rank's shard of the reduced f32 gradient */
        fsdp_unit_t *u = fsdp_mlp_layer(mlp, 0);
        size_t s = fsdp_unit_shard_numel(u), total = fsdp_unit_flat_numel(u);
        const float *g = fsdp_unit_sharded_grad(u);
        for (size_t i = 0; g != NULL && i < s && dev->rank * s + i < total; i++)
            c->grad[dev->rank * s + i] = g[i];
        if (g == NULL)
            status = FSDP_ERR_INVALID_PARAM;
    }
    fsdp_mlp_destroy(mlp);
    fsdp_destroy(fs);
    return status;
}

static void test_fsdp_linear(void)
{
    lin_ctx_t *c = calloc(1, sizeof(*c));
    fsdp_sim_params_t p;
    double y[LB * LO], gw[LO * LI] = {0}, gb[LO] = {0};
    int bad = 0;

    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    rng_state = 71;
    for (int i = 0; i < LO * LI; i++) /* f32 masters that round to bf16 */
        c->w[i] = (float)(dyadic(250, 7) + ldexp(dyadic(8, 0), -12));
    for (int i = 0; i < LO; i++)
        c->b[i] = (float)dyadic(250, 8);
    for (int i = 0; i < LB * LI; i++)
        c->x[i] = (float)dyadic(60, 3);
    for (int i = 0; i < LB * LO; i++)
        c->t[i] = (float)(4.0 + dyadic(4, 1)); /* far from y: dy keeps few bits */
    fsdp_sim_params_init(&p);
    p.world_size = 2;
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_launch(&p, lin_rank, c, NULL), FSDP_OK);

    for (int r = 0; r < 2; r++) {
        double loss = 0.0, gwr[LO * LI] = {0}, gbr[LO] = {0};
        for (int i = r * 4; i < r * 4 + 4; i++)
            for (int o = 0; o < LO; o++) {
                double s = 0.0;
                for (int k = 0; k < LI; k++)
                    s += rne(c->x[i * LI + k], FSDP_DTYPE_BF16) *
                         rne(c->w[o * LI + k], FSDP_DTYPE_BF16);
                y[i * LO + o] = rne(s + rne(c->b[o], FSDP_DTYPE_BF16), FSDP_DTYPE_BF16);
                loss += (y[i * LO + o] - c->t[i * LO + o]) * (y[i * LO + o] - c->t[i * LO + o]);
            }
        bad += c->loss[r] != (float)(loss / 16.0);
        for (int i = r * 4; i < r * 4 + 4; i++)
            for (int o = 0; o < LO; o++) {
                double dy = rne((y[i * LO + o] - c->t[i * LO + o]) / 8.0, FSDP_DTYPE_BF16);
                gbr[o] += dy;
                for (int k = 0; k < LI; k++)
                    gwr[o * LI + k] += dy * rne(c->x[i * LI + k], FSDP_DTYPE_BF16);
            }
        for (int e = 0; e < LO * LI; e++)
            gw[e] += rne(gwr[e], FSDP_DTYPE_BF16) / 2.0;
        for (int o = 0; o < LO; o++)
            gb[o] += rne(gbr[o], FSDP_DTYPE_BF16) / 2.0;
    }
    for (int e = 0; e < LO * LI; e++)
        bad += c->grad[e] != (float)gw[e];
    for (int o = 0; o < LO; o++)
        bad += c->grad[LO * LI + o] != (float)gb[o];
    CU_ASSERT_EQUAL(bad, 0);
    free(c);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"Linear and Conv1D forward: bias added in f32, one rounding (bf16, f16)",
         test_linear_conv1d_fwd},
        {"Linear backward: each gradient rounded once (bf16, f16)", test_linear_bwd},
        {"weight gradient accumulated: the new gradient rounded, then the sum (bf16, f16)",
         test_grad_accumulate},
        {"LayerNorm forward rounds once (bf16, f16)", test_layernorm},
        {"softmax: scaled scores rounded, then the softmax (bf16, f16)", test_softmax},
        {"softmax of HF's GPT-2 attention: scores divided by sqrt(32) held in the dtype (bf16, "
         "f16)",
         test_softmax_divisor},
        {"embedding backward: a token's rows summed in f32, rounded once (bf16, f16)",
         test_embedding_bwd},
        {"one-layer Linear under FSDP MixedPrecision(bf16, reduce f32): the rule, bit for bit",
         test_fsdp_linear},
        {NULL, NULL}};
    return fsdp_test_run("mixed_precision", tests);
}
