/* The transformer kernels (layernorm, gelu, softmax, embedding, cross-entropy, add, batched
 * GEMM) through the sim's executor: every forward against the formula computed here in double,
 * every backward against central finite differences of that double forward, and the shared
 * bodies' exp and log against libm's double functions.
 */
#include <fsdp/fsdp.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernel_elem.h"
#include "sim_kernels.h"
#include "test_util.h"

static uint64_t rng_state = 1;

static double urand(double lo, double hi)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return lo + (hi - lo) * ((double)((rng_state * UINT64_C(2685821657736338717)) >> 11) * 0x1p-53);
}

static void fill(float *x, size_t n, double lo, double hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)urand(lo, hi);
}

static fsdp_status_t run(const fsdp_kernel_t *k)
{
    return fsdp_sim_kernel_exec(k);
}

/* |a - b| <= tol * (1 + |b|), reporting the first failure */
static int close_to(double a, double b, double tol, const char *what, size_t i)
{
    if (fabs(a - b) <= tol * (1.0 + fabs(b)))
        return 1;
    fprintf(stderr, "\n  %s[%zu]: %.9g vs %.9g (tolerance %g)\n", what, i, a, b, tol);
    return 0;
}

#define FD_H 1e-5   /* central differences of a double function: error ~ h^2 */
#define FD_TOL 2e-4 /* the f32 kernel against them */

/* ---- exp and log of the shared bodies ---- */

/* |f - exact| in units of the f32 spacing at exact */
static double ulps(float f, double exact)
{
    float e = (float)exact;
    double ulp = e == 0.0f ? 0x1p-149 : fabs((double)nextafterf(e, INFINITY) - (double)e);
    if (fabs(exact) < 0x1p-126) /* subnormals have a fixed spacing */
        ulp = 0x1p-149;
    return fabs((double)f - exact) / ulp;
}

static void test_exp_log(void)
{
    double worst_exp = 0.0, worst_log = 0.0;

    for (double x = -103.0; x < 88.7; x += 0.00731) {
        double u = ulps(fsdp_kb_expf((float)x), exp((double)(float)x));
        if (u > worst_exp)
            worst_exp = u;
    }
    for (int i = 0; i < 200000; i++) { /* near 0, where the polynomial alone works */
        float x = (float)urand(-0.4, 0.4);
        double u = ulps(fsdp_kb_expf(x), exp((double)x));
        if (u > worst_exp)
            worst_exp = u;
    }
    for (double lx = -140.0; lx < 127.0; lx += 0.00377) {
        float x = (float)exp2(lx);
        double u = ulps(fsdp_kb_logf(x), log((double)x));
        if (u > worst_log)
            worst_log = u;
    }
    for (int i = 0; i < 200000; i++) { /* around 1, where ln x is small */
        float x = (float)urand(0.5, 2.0);
        double u = ulps(fsdp_kb_logf(x), log((double)x));
        if (u > worst_log)
            worst_log = u;
    }
    fprintf(stderr, "\n  worst error: exp %.2f ulp, log %.2f ulp\n", worst_exp, worst_log);
    CU_ASSERT(worst_exp <= 2.0);
    CU_ASSERT(worst_log <= 2.0);
    /* the edges */
    CU_ASSERT(isinf(fsdp_kb_expf(89.0f)) && fsdp_kb_expf(89.0f) > 0.0f);
    CU_ASSERT(fsdp_kb_expf(-104.0f) == 0.0f);
    CU_ASSERT(fsdp_kb_expf(-INFINITY) == 0.0f);
    CU_ASSERT(isnan(fsdp_kb_expf(NAN)));
    CU_ASSERT(fsdp_kb_expf(0.0f) == 1.0f);
    CU_ASSERT(fsdp_kb_logf(1.0f) == 0.0f);
    CU_ASSERT(isinf(fsdp_kb_logf(0.0f)) && fsdp_kb_logf(0.0f) < 0.0f);
    CU_ASSERT(isnan(fsdp_kb_logf(-1.0f)));
    CU_ASSERT(isinf(fsdp_kb_logf(INFINITY)));
}

/* ---- layernorm ---- */

#define LN_R 3
#define LN_C 7

/* sum of dy * layernorm(x) in double */
static double ln_loss(const double *x, const double *w, const double *b, const float *dy,
                      double *y_out)
{
    double l = 0.0;
    for (int r = 0; r < LN_R; r++) {
        double mean = 0.0, var = 0.0;
        for (int c = 0; c < LN_C; c++)
            mean += x[r * LN_C + c];
        mean /= LN_C;
        for (int c = 0; c < LN_C; c++)
            var += (x[r * LN_C + c] - mean) * (x[r * LN_C + c] - mean);
        double rstd = 1.0 / sqrt(var / LN_C + 1e-5);
        for (int c = 0; c < LN_C; c++) {
            double y = (x[r * LN_C + c] - mean) * rstd * w[c] + b[c];
            if (y_out)
                y_out[r * LN_C + c] = y;
            l += dy[r * LN_C + c] * y;
        }
    }
    return l;
}

/* d(ln_loss)/d(v[i]) by central differences */
static double ln_fd(double *v, int i, const double *x, const double *w, const double *b,
                    const float *dy)
{
    double keep = v[i], lp, lm;
    v[i] = keep + FD_H;
    lp = ln_loss(x, w, b, dy, NULL);
    v[i] = keep - FD_H;
    lm = ln_loss(x, w, b, dy, NULL);
    v[i] = keep;
    return (lp - lm) / (2.0 * FD_H);
}

static void test_layernorm(void)
{
    float x[LN_R * LN_C], w[LN_C], b[LN_C], y[LN_R * LN_C], mean[LN_R], rstd[LN_R];
    float dy[LN_R * LN_C], dx[LN_R * LN_C], dw[LN_C], db[LN_C];
    double xd[LN_R * LN_C], wd[LN_C], bd[LN_C], yd[LN_R * LN_C];
    fsdp_kernel_t k = {.kind = FSDP_K_LAYERNORM_FWD};
    int ok = 1;

    fill(x, LN_R * LN_C, -2.0, 3.0);
    fill(w, LN_C, 0.5, 1.5);
    fill(b, LN_C, -0.5, 0.5);
    fill(dy, LN_R * LN_C, -1.0, 1.0);
    for (int i = 0; i < LN_R * LN_C; i++)
        xd[i] = x[i];
    for (int i = 0; i < LN_C; i++)
        wd[i] = w[i], bd[i] = b[i];
    k.u.layernorm_fwd.y = y;
    k.u.layernorm_fwd.mean = mean;
    k.u.layernorm_fwd.rstd = rstd;
    k.u.layernorm_fwd.x = x;
    k.u.layernorm_fwd.weight = w;
    k.u.layernorm_fwd.bias = b;
    k.u.layernorm_fwd.rows = LN_R;
    k.u.layernorm_fwd.cols = LN_C;
    k.u.layernorm_fwd.eps = 1e-5f;
    CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    ln_loss(xd, wd, bd, dy, yd);
    for (int i = 0; i < LN_R * LN_C && ok; i++)
        ok = close_to(y[i], yd[i], 1e-5, "layernorm y", (size_t)i);
    CU_ASSERT(ok);

    /* backward, accumulating onto what is there */
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_LAYERNORM_BWD;
    for (int i = 0; i < LN_R * LN_C; i++)
        dx[i] = 0.25f;
    for (int i = 0; i < LN_C; i++)
        dw[i] = 0.5f, db[i] = -0.5f;
    k.u.layernorm_bwd.dx = dx;
    k.u.layernorm_bwd.dweight = dw;
    k.u.layernorm_bwd.dbias = db;
    k.u.layernorm_bwd.dy = dy;
    k.u.layernorm_bwd.x = x;
    k.u.layernorm_bwd.mean = mean;
    k.u.layernorm_bwd.rstd = rstd;
    k.u.layernorm_bwd.weight = w;
    k.u.layernorm_bwd.rows = LN_R;
    k.u.layernorm_bwd.cols = LN_C;
    k.u.layernorm_bwd.accumulate = 1;
    CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    for (int i = 0; i < LN_R * LN_C && ok; i++)
        ok =
            close_to(dx[i] - 0.25, ln_fd(xd, i, xd, wd, bd, dy), FD_TOL, "layernorm dx", (size_t)i);
    for (int i = 0; i < LN_C && ok; i++)
        ok = close_to(dw[i] - 0.5, ln_fd(wd, i, xd, wd, bd, dy), FD_TOL, "layernorm dw",
                      (size_t)i) &&
             close_to(db[i] + 0.5, ln_fd(bd, i, xd, wd, bd, dy), FD_TOL, "layernorm db", (size_t)i);
    CU_ASSERT(ok);

    /* accumulate 0 overwrites; dx overlapping dy is refused */
    float dx2[LN_R * LN_C];
    k.u.layernorm_bwd.dx = dx2;
    k.u.layernorm_bwd.dweight = k.u.layernorm_bwd.dbias = NULL;
    k.u.layernorm_bwd.accumulate = 0;
    CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    for (int i = 0; i < LN_R * LN_C; i++)
        CU_ASSERT_EQUAL(dx[i], 0.25f + dx2[i]);
    k.u.layernorm_bwd.dx = dy;
    fsdp_log_set_level(FSDP_LOG_OFF);
    CU_ASSERT_EQUAL(run(&k), FSDP_ERR_INVALID_PARAM);
    fsdp_log_set_level(FSDP_LOG_ERROR);
}

/* ---- gelu ---- */

static double gelu_d(double x)
{
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

static void test_gelu(void)
{
    enum { N = 601 };
    float x[N], y[N], dy[N], dx[N];
    fsdp_kernel_t k = {.kind = FSDP_K_GELU_FWD};
    int ok = 1;

    for (int i = 0; i < N; i++)
        x[i] = (float)(-12.0 + 24.0 * i / (N - 1)) + (float)urand(-0.01, 0.01);
    fill(dy, N, -1.0, 1.0);
    k.u.gelu_fwd.y = y;
    k.u.gelu_fwd.x = x;
    k.u.gelu_fwd.n = N;
    CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    for (int i = 0; i < N && ok; i++)
        ok = close_to(y[i], gelu_d(x[i]), 1e-6, "gelu y", (size_t)i);
    CU_ASSERT(ok);
    k.kind = FSDP_K_GELU_BWD;
    memcpy(dx, dy, sizeof(dx));
    k.u.gelu_bwd.dx = dx; /* in place on dy's copy */
    k.u.gelu_bwd.dy = dx;
    k.u.gelu_bwd.x = x;
    k.u.gelu_bwd.n = N;
    CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    for (int i = 0; i < N && ok; i++) {
        double fd = (gelu_d(x[i] + FD_H) - gelu_d(x[i] - FD_H)) / (2.0 * FD_H);
        ok = close_to(dx[i], dy[i] * fd, FD_TOL, "gelu dx", (size_t)i);
    }
    CU_ASSERT(ok);
}

/* ---- softmax ---- */

/* sum of dy * softmax(scale * x) over rows of `cols`, causal or not, in double */
static double sm_loss(const double *x, const float *dy, size_t rows, size_t cols, double scale,
                      int causal, double *y_out)
{
    double l = 0.0;
    for (size_t r = 0; r < rows; r++) {
        size_t valid = causal ? r % cols + 1 : cols;
        double mx = -INFINITY, sum = 0.0;
        for (size_t j = 0; j < valid; j++)
            mx = fmax(mx, scale * x[r * cols + j]);
        for (size_t j = 0; j < valid; j++)
            sum += exp(scale * x[r * cols + j] - mx);
        for (size_t j = 0; j < cols; j++) {
            double y = j < valid ? exp(scale * x[r * cols + j] - mx) / sum : 0.0;
            if (y_out)
                y_out[r * cols + j] = y;
            l += dy[r * cols + j] * y;
        }
    }
    return l;
}

static void check_softmax(size_t rows, size_t cols, int causal)
{
    float x[60], y[60], dy[60], dx[60];
    double xd[60], yd[60];
    const float scale = 0.37f;
    fsdp_kernel_t k = {.kind = FSDP_K_SOFTMAX_FWD};
    int ok = 1;

    fill(x, rows * cols, -4.0, 4.0);
    fill(dy, rows * cols, -1.0, 1.0);
    for (size_t i = 0; i < rows * cols; i++)
        xd[i] = x[i];
    memcpy(y, x, sizeof(x)); /* in place */
    k.u.softmax_fwd.y = y;
    k.u.softmax_fwd.x = y;
    k.u.softmax_fwd.rows = rows;
    k.u.softmax_fwd.cols = cols;
    k.u.softmax_fwd.scale = scale;
    k.u.softmax_fwd.causal = causal;
    CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    sm_loss(xd, dy, rows, cols, scale, causal, yd);
    for (size_t i = 0; i < rows * cols && ok; i++)
        ok = close_to(y[i], yd[i], 1e-6, "softmax y", i) &&
             (yd[i] != 0.0 || y[i] == 0.0f); /* masked entries are exactly 0 */
    CU_ASSERT(ok);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_SOFTMAX_BWD;
    k.u.softmax_bwd.dx = dx;
    k.u.softmax_bwd.dy = dy;
    k.u.softmax_bwd.y = y;
    k.u.softmax_bwd.rows = rows;
    k.u.softmax_bwd.cols = cols;
    k.u.softmax_bwd.scale = scale;
    k.u.softmax_bwd.causal = causal;
    CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    for (size_t i = 0; i < rows * cols && ok; i++) {
        double keep = xd[i], lp, lm;
        xd[i] = keep + FD_H;
        lp = sm_loss(xd, dy, rows, cols, scale, causal, NULL);
        xd[i] = keep - FD_H;
        lm = sm_loss(xd, dy, rows, cols, scale, causal, NULL);
        xd[i] = keep;
        ok = close_to(dx[i], (lp - lm) / (2.0 * FD_H), FD_TOL, "softmax dx", i);
    }
    CU_ASSERT(ok);
}

static void test_softmax(void)
{
    check_softmax(10, 5, 1); /* two [5, 5] causal blocks */
    check_softmax(3, 6, 0);
    /* causal rows must be whole blocks */
    fsdp_kernel_t k = {.kind = FSDP_K_SOFTMAX_FWD};
    float x[12];
    k.u.softmax_fwd.y = x;
    k.u.softmax_fwd.x = x;
    k.u.softmax_fwd.rows = 3;
    k.u.softmax_fwd.cols = 4;
    k.u.softmax_fwd.causal = 1;
    fsdp_log_set_level(FSDP_LOG_OFF);
    CU_ASSERT_EQUAL(run(&k), FSDP_ERR_INVALID_PARAM);
    fsdp_log_set_level(FSDP_LOG_ERROR);
}

/* ---- embedding ---- */

static void test_embedding(void)
{
    enum { R = 6, SEQ = 3, V = 5, C = 4 };
    const int32_t tok[R] = {1, 4, 1, 0, 1, 3}; /* token 1 three times, 2 never */
    float wte[V * C], wpe[SEQ * C], y[R * C], dy[R * C], dwte[V * C], dwpe[SEQ * C];
    fsdp_kernel_t k = {.kind = FSDP_K_EMBEDDING_FWD};

    fill(wte, V * C, -1.0, 1.0);
    fill(wpe, SEQ * C, -1.0, 1.0);
    fill(dy, R * C, -1.0, 1.0);
    k.u.embedding_fwd.y = y;
    k.u.embedding_fwd.tokens = tok;
    k.u.embedding_fwd.wte = wte;
    k.u.embedding_fwd.wpe = wpe;
    k.u.embedding_fwd.rows = R;
    k.u.embedding_fwd.cols = C;
    k.u.embedding_fwd.seq = SEQ;
    k.u.embedding_fwd.vocab = V;
    CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            CU_ASSERT_EQUAL(y[r * C + c], wte[tok[r] * C + c] + wpe[(r % SEQ) * C + c]);

    /* the gradient is linear: its finite difference is the sum of dy over the uses */
    for (int i = 0; i < V * C; i++)
        dwte[i] = 1.0f;
    memset(dwpe, 0, sizeof(dwpe));
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_EMBEDDING_BWD;
    k.u.embedding_bwd.dwte = dwte;
    k.u.embedding_bwd.dwpe = dwpe;
    k.u.embedding_bwd.dy = dy;
    k.u.embedding_bwd.tokens = tok;
    k.u.embedding_bwd.rows = R;
    k.u.embedding_bwd.cols = C;
    k.u.embedding_bwd.seq = SEQ;
    k.u.embedding_bwd.vocab = V;
    CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    for (int v = 0; v < V; v++) {
        for (int c = 0; c < C; c++) {
            double s = 1.0;
            for (int r = 0; r < R; r++)
                s += tok[r] == v ? dy[r * C + c] : 0.0;
            CU_ASSERT(fabs(dwte[v * C + c] - s) < 1e-6);
        }
    }
    for (int t = 0; t < SEQ; t++) {
        for (int c = 0; c < C; c++) {
            double s = 0.0;
            for (int r = t; r < R; r += SEQ)
                s += dy[r * C + c];
            CU_ASSERT(fabs(dwpe[t * C + c] - s) < 1e-6);
        }
    }
    /* a token outside the vocabulary gives a row of NaN, and no gradient */
    const int32_t bad[R] = {1, 5, 1, -1, 1, 3};
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_EMBEDDING_FWD;
    k.u.embedding_fwd.y = y;
    k.u.embedding_fwd.tokens = bad;
    k.u.embedding_fwd.wte = wte;
    k.u.embedding_fwd.rows = R;
    k.u.embedding_fwd.cols = C;
    k.u.embedding_fwd.seq = SEQ;
    k.u.embedding_fwd.vocab = V;
    CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    CU_ASSERT(isnan(y[1 * C]) && isnan(y[3 * C + 3]) && y[0] == wte[1 * C]);
}

/* ---- cross-entropy ---- */

#define CE_R 5
#define CE_V 6

static double ce_loss(const double *l, const int32_t *t, double denom)
{
    double s = 0.0;
    for (int r = 0; r < CE_R; r++) {
        double mx = -INFINITY, sum = 0.0;
        if (t[r] < 0)
            continue;
        for (int j = 0; j < CE_V; j++)
            mx = fmax(mx, l[r * CE_V + j]);
        for (int j = 0; j < CE_V; j++)
            sum += exp(l[r * CE_V + j] - mx);
        s += mx + log(sum) - l[r * CE_V + t[r]];
    }
    return s / denom;
}

static void test_cross_entropy(void)
{
    const int32_t t[CE_R] = {2, 0, -1, 5, 2}; /* one ignored: 4 counted */
    float logits[CE_R * CE_V], d[CE_R * CE_V], losses[CE_R], loss;
    double ld[CE_R * CE_V];
    fsdp_kernel_t k = {.kind = FSDP_K_CROSS_ENTROPY};
    int ok = 1;

    fill(logits, CE_R * CE_V, -3.0, 3.0);
    logits[3 * CE_V + 5] = 40.0f; /* a confident row */
    for (int i = 0; i < CE_R * CE_V; i++)
        ld[i] = logits[i];
    memcpy(d, logits, sizeof(d));
    k.u.cross_entropy.loss = &loss;
    k.u.cross_entropy.losses = losses;
    k.u.cross_entropy.dlogits = d; /* in place */
    k.u.cross_entropy.logits = d;
    k.u.cross_entropy.targets = t;
    k.u.cross_entropy.rows = CE_R;
    k.u.cross_entropy.vocab = CE_V;
    k.u.cross_entropy.denom = 4.0;
    CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    CU_ASSERT(close_to(loss, ce_loss(ld, t, 4.0), 1e-6, "cross-entropy loss", 0));
    CU_ASSERT_EQUAL(losses[2], 0.0f);
    for (int i = 0; i < CE_R * CE_V && ok; i++) {
        double keep = ld[i], lp, lm;
        ld[i] = keep + FD_H;
        lp = ce_loss(ld, t, 4.0);
        ld[i] = keep - FD_H;
        lm = ce_loss(ld, t, 4.0);
        ld[i] = keep;
        ok = close_to(d[i], (lp - lm) / (2.0 * FD_H), FD_TOL, "cross-entropy dlogits", (size_t)i);
    }
    CU_ASSERT(ok);
    /* a target past the vocabulary poisons its row; no dlogits and no loss is fine */
    const int32_t bad[CE_R] = {2, 6, -1, 5, 2};
    k.u.cross_entropy.loss = NULL;
    k.u.cross_entropy.dlogits = NULL;
    k.u.cross_entropy.logits = logits;
    k.u.cross_entropy.targets = bad;
    CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    CU_ASSERT(isnan(losses[1]) && !isnan(losses[0]) && losses[2] == 0.0f);
    k.u.cross_entropy.loss = &loss;
    k.u.cross_entropy.denom = 0.0;
    fsdp_log_set_level(FSDP_LOG_OFF);
    CU_ASSERT_EQUAL(run(&k), FSDP_ERR_INVALID_PARAM);
    fsdp_log_set_level(FSDP_LOG_ERROR);
}

/* ---- add, batched GEMM, costs ---- */

static void test_add_and_batched_gemm(void)
{
    enum { B = 3, M = 4, N = 5, K = 6 };
    float a[B * 8 * M], bm[B * 8 * N], c1[B * M * 7], c2[B * M * 7];
    fsdp_kernel_t k = {.kind = FSDP_K_ADD};
    double f1, b1, f3, b3;

    fill(a, sizeof(a) / 4, -1.0, 1.0);
    fill(bm, sizeof(bm) / 4, -1.0, 1.0);
    memcpy(c1, a, sizeof(c1));
    k.u.add.y = c1;
    k.u.add.a = c1;
    k.u.add.b = bm;
    k.u.add.n = 20;
    CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    for (int i = 0; i < 20; i++)
        CU_ASSERT_EQUAL(c1[i], a[i] + bm[i]);

    /* a batch of 3 A^T B products with strides equals 3 single ones, bit for bit */
    fill(c1, sizeof(c1) / 4, -1.0, 1.0);
    memcpy(c2, c1, sizeof(c2));
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_GEMM;
    k.u.gemm.trans_a = 1;
    k.u.gemm.m = M;
    k.u.gemm.n = N;
    k.u.gemm.k = K;
    k.u.gemm.alpha = 0.5f;
    k.u.gemm.lda = M + 1;
    k.u.gemm.ldb = N + 2;
    k.u.gemm.beta = 1.0f;
    k.u.gemm.ldc = 7;
    fsdp_kernel_cost(&k, &f1, &b1);
    for (int i = 0; i < B; i++) {
        k.u.gemm.a = a + i * 8 * M;
        k.u.gemm.b = bm + i * 8 * N;
        k.u.gemm.c = c1 + i * M * 7;
        CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    }
    k.u.gemm.a = a;
    k.u.gemm.b = bm;
    k.u.gemm.c = c2;
    k.u.gemm.batch = B;
    k.u.gemm.stride_a = 8 * M;
    k.u.gemm.stride_b = 8 * N;
    k.u.gemm.stride_c = M * 7;
    CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    CU_ASSERT(memcmp(c1, c2, sizeof(c1)) == 0);
    fsdp_kernel_cost(&k, &f3, &b3);
    CU_ASSERT_EQUAL(f3, 3.0 * f1);
    CU_ASSERT_EQUAL(b3, 3.0 * b1);
}

/* every new kind has a name and a cost, and a malformed descriptor is refused */
static void test_names_costs_checks(void)
{
    static const fsdp_kernel_kind_t kinds[] = {FSDP_K_LAYERNORM_FWD, FSDP_K_LAYERNORM_BWD,
                                               FSDP_K_GELU_FWD,      FSDP_K_GELU_BWD,
                                               FSDP_K_SOFTMAX_FWD,   FSDP_K_SOFTMAX_BWD,
                                               FSDP_K_EMBEDDING_FWD, FSDP_K_EMBEDDING_BWD,
                                               FSDP_K_CROSS_ENTROPY, FSDP_K_ADD};
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        fsdp_kernel_t k;
        double f, b;
        memset(&k, 0, sizeof(k));
        k.kind = kinds[i];
        CU_ASSERT(strcmp(fsdp_kernel_name(kinds[i]), "invalid") != 0);
        /* empty launches are fine */
        CU_ASSERT_EQUAL(run(&k), FSDP_OK);
        /* one row or element of work with NULL pointers is not */
        switch (kinds[i]) {
        case FSDP_K_GELU_FWD:
            k.u.gelu_fwd.n = 4;
            break;
        case FSDP_K_GELU_BWD:
            k.u.gelu_bwd.n = 4;
            break;
        case FSDP_K_ADD:
            k.u.add.n = 4;
            break;
        case FSDP_K_LAYERNORM_FWD:
            k.u.layernorm_fwd.rows = 1;
            k.u.layernorm_fwd.cols = 4;
            break;
        case FSDP_K_LAYERNORM_BWD:
            k.u.layernorm_bwd.rows = 1;
            k.u.layernorm_bwd.cols = 4;
            break;
        case FSDP_K_SOFTMAX_FWD:
            k.u.softmax_fwd.rows = 1;
            k.u.softmax_fwd.cols = 4;
            break;
        case FSDP_K_SOFTMAX_BWD:
            k.u.softmax_bwd.rows = 1;
            k.u.softmax_bwd.cols = 4;
            break;
        case FSDP_K_EMBEDDING_FWD:
            k.u.embedding_fwd.rows = 1;
            k.u.embedding_fwd.cols = 4;
            break;
        case FSDP_K_EMBEDDING_BWD:
            k.u.embedding_bwd.rows = 1;
            k.u.embedding_bwd.cols = 4;
            break;
        case FSDP_K_CROSS_ENTROPY:
            k.u.cross_entropy.rows = 1;
            k.u.cross_entropy.vocab = 4;
            break;
        default:
            break;
        }
        fsdp_kernel_cost(&k, &f, &b);
        CU_ASSERT(b > 0.0);
        fsdp_log_set_level(FSDP_LOG_OFF);
        CU_ASSERT_EQUAL(run(&k), FSDP_ERR_INVALID_PARAM);
        fsdp_log_set_level(FSDP_LOG_ERROR);
    }
}

/* ---- the low-precision variants (bf16, f16) against the f32 bodies ----
 *
 * Every input is drawn, rounded to the low dtype, and held twice: as 16-bit values for the
 * low-precision launch and as the same values in f32 for the f32 launch. The low-precision
 * kernel loads exactly those f32 values and runs the f32 arithmetic, so each output must be the
 * f32 kernel's output rounded once: at most 1 ulp of the output dtype apart where a rounding
 * point differs, else equal (they are equal throughout; layernorm_bwd's accumulate, which
 * rounds its term before the add, and embedding_bwd, which rounds every add, are checked
 * against f32 emulations of those rounding points). The f32
 * outputs (mean, rstd, losses, loss) must be the same bits. */

#define LP_MAX 4096
#define LP_N 8

typedef struct lp_tensor {
    float f[LP_MAX];    /* f32 launch */
    uint16_t h[LP_MAX]; /* low-precision launch */
    size_t n;
} lp_tensor_t;

static lp_tensor_t lp_t[LP_N];
static float lp_sf[4][LP_MAX], lp_sh[4][LP_MAX]; /* f32 outputs of the two launches */

static uint16_t lp_to16(float v, fsdp_dtype_t dt)
{
    return dt == FSDP_DTYPE_BF16 ? fsdp_kb_f32_to_bf16(v) : fsdp_kb_f32_to_f16(v);
}

static float lp_from16(uint16_t h, fsdp_dtype_t dt)
{
    return dt == FSDP_DTYPE_BF16 ? fsdp_kb_bf16_to_f32(h) : fsdp_kb_f16_to_f32(h);
}

static void lp_fill(int i, size_t n, double lo, double hi, fsdp_dtype_t dt)
{
    lp_t[i].n = n;
    for (size_t e = 0; e < n; e++) {
        lp_t[i].h[e] = lp_to16((float)urand(lo, hi), dt);
        lp_t[i].f[e] = lp_from16(lp_t[i].h[e], dt);
    }
}

/* the f32 copy of tensor i made the 16-bit one's values again (after an in-place launch) */
static void lp_sync(int i, fsdp_dtype_t dt)
{
    for (size_t e = 0; e < lp_t[i].n; e++)
        lp_t[i].f[e] = lp_from16(lp_t[i].h[e], dt);
}

/* the tensor for the launch: lp 0 the f32 copy, 1 the 16-bit one */
static void *lp_ptr(int i, int lp)
{
    return lp ? (void *)lp_t[i].h : (void *)lp_t[i].f;
}

/* the 16-bit patterns on one line: distance in ulps between two finite values */
static long lp_ulps(uint16_t a, uint16_t b)
{
    long x = a & 0x8000 ? -(long)(a & 0x7fff) : (long)a;
    long y = b & 0x8000 ? -(long)(b & 0x7fff) : (long)b;
    return labs(x - y);
}

/* tensor i after both launches: the worst distance of h from round(f) */
static long lp_worst(int i, fsdp_dtype_t dt)
{
    long worst = 0;
    for (size_t e = 0; e < lp_t[i].n; e++) {
        long u = lp_ulps(lp_t[i].h[e], lp_to16(lp_t[i].f[e], dt));
        if (u > worst)
            worst = u;
    }
    return worst;
}

typedef void (*lp_make_t)(fsdp_kernel_t *k, int lp, fsdp_dtype_t dt);

/* Runs make's descriptor in f32 and in dt; outputs out[0..nout) must be within max_ulps, the
 * f32 outputs lp_sf/lp_sh[0..nstat) of nstat_n elements the same bits. */
static void lp_check(const char *what, lp_make_t make, fsdp_dtype_t dt, const int *out, int nout,
                     long max_ulps, int nstat, size_t nstat_n)
{
    fsdp_kernel_t k;
    for (int lp = 0; lp < 2; lp++) {
        memset(&k, 0, sizeof(k));
        make(&k, lp, dt);
        CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
    }
    for (int o = 0; o < nout; o++) {
        long w = lp_worst(out[o], dt);
        if (w > max_ulps)
            fprintf(stderr, "\n  %s %s output %d: %ld ulp\n", what, fsdp_dtype_name(dt), o, w);
        CU_ASSERT(w <= max_ulps);
    }
    for (int s = 0; s < nstat; s++)
        CU_ASSERT(memcmp(lp_sf[s], lp_sh[s], nstat_n * sizeof(float)) == 0);
}

#define LP_R 24 /* rows */
#define LP_C 40 /* columns: a block of 32 (lanes.h) and a remainder */
static int32_t lp_tok[LP_R], lp_tgt[LP_R];

static void mk_ln_fwd(fsdp_kernel_t *k, int lp, fsdp_dtype_t dt)
{
    k->kind = FSDP_K_LAYERNORM_FWD;
    k->u.layernorm_fwd.y = lp_ptr(1, lp);
    k->u.layernorm_fwd.mean = lp ? lp_sh[0] : lp_sf[0];
    k->u.layernorm_fwd.rstd = lp ? lp_sh[1] : lp_sf[1];
    k->u.layernorm_fwd.x = lp_ptr(0, lp);
    k->u.layernorm_fwd.weight = lp_ptr(2, lp);
    k->u.layernorm_fwd.bias = lp_ptr(3, lp);
    k->u.layernorm_fwd.rows = LP_R;
    k->u.layernorm_fwd.cols = LP_C;
    k->u.layernorm_fwd.eps = 1e-5f;
    k->u.layernorm_fwd.dtype = lp ? dt : FSDP_DTYPE_F32;
}

static int lp_accumulate;

static void mk_ln_bwd(fsdp_kernel_t *k, int lp, fsdp_dtype_t dt)
{
    k->kind = FSDP_K_LAYERNORM_BWD;
    k->u.layernorm_bwd.dx = lp_ptr(4, lp);
    k->u.layernorm_bwd.dweight = lp_ptr(5, lp);
    k->u.layernorm_bwd.dbias = lp_ptr(6, lp);
    k->u.layernorm_bwd.dy = lp_ptr(7, lp);
    k->u.layernorm_bwd.x = lp_ptr(0, lp);
    k->u.layernorm_bwd.mean = lp_sf[0]; /* the same statistics for both */
    k->u.layernorm_bwd.rstd = lp_sf[1];
    k->u.layernorm_bwd.weight = lp_ptr(2, lp);
    k->u.layernorm_bwd.rows = LP_R;
    k->u.layernorm_bwd.cols = LP_C;
    k->u.layernorm_bwd.accumulate = lp_accumulate;
    k->u.layernorm_bwd.dtype = lp ? dt : FSDP_DTYPE_F32;
}

static void mk_gelu_fwd(fsdp_kernel_t *k, int lp, fsdp_dtype_t dt)
{
    k->kind = FSDP_K_GELU_FWD;
    k->u.gelu_fwd.y = lp_ptr(1, lp);
    k->u.gelu_fwd.x = lp_ptr(0, lp);
    k->u.gelu_fwd.n = lp_t[0].n;
    k->u.gelu_fwd.dtype = lp ? dt : FSDP_DTYPE_F32;
}

static void mk_gelu_bwd(fsdp_kernel_t *k, int lp, fsdp_dtype_t dt)
{
    k->kind = FSDP_K_GELU_BWD;
    k->u.gelu_bwd.dx = lp_ptr(2, lp); /* in place on dy */
    k->u.gelu_bwd.dy = lp_ptr(2, lp);
    k->u.gelu_bwd.x = lp_ptr(0, lp);
    k->u.gelu_bwd.n = lp_t[0].n;
    k->u.gelu_bwd.dtype = lp ? dt : FSDP_DTYPE_F32;
}

static void mk_softmax_fwd(fsdp_kernel_t *k, int lp, fsdp_dtype_t dt)
{
    k->kind = FSDP_K_SOFTMAX_FWD;
    k->u.softmax_fwd.y = lp_ptr(0, lp); /* in place, as the model runs it */
    k->u.softmax_fwd.x = lp_ptr(0, lp);
    k->u.softmax_fwd.rows = 3 * 8;
    k->u.softmax_fwd.cols = 8;
    k->u.softmax_fwd.scale = 0.25f; /* exact: the rounded scaled scores are the f32 ones */
    k->u.softmax_fwd.causal = 1;
    k->u.softmax_fwd.dtype = lp ? dt : FSDP_DTYPE_F32;
}

static void mk_softmax_bwd(fsdp_kernel_t *k, int lp, fsdp_dtype_t dt)
{
    k->kind = FSDP_K_SOFTMAX_BWD;
    k->u.softmax_bwd.dx = lp_ptr(1, lp);
    k->u.softmax_bwd.dy = lp_ptr(1, lp);
    k->u.softmax_bwd.y = lp_ptr(0, lp);
    k->u.softmax_bwd.rows = 3 * 8;
    k->u.softmax_bwd.cols = 8;
    k->u.softmax_bwd.scale = 0.25f; /* exact: the rounded scaled scores are the f32 ones */
    k->u.softmax_bwd.causal = 1;
    k->u.softmax_bwd.dtype = lp ? dt : FSDP_DTYPE_F32;
}

static void mk_emb_fwd(fsdp_kernel_t *k, int lp, fsdp_dtype_t dt)
{
    k->kind = FSDP_K_EMBEDDING_FWD;
    k->u.embedding_fwd.y = lp_ptr(2, lp);
    k->u.embedding_fwd.tokens = lp_tok;
    k->u.embedding_fwd.wte = lp_ptr(0, lp);
    k->u.embedding_fwd.wpe = lp_ptr(1, lp);
    k->u.embedding_fwd.rows = LP_R;
    k->u.embedding_fwd.cols = LP_C;
    k->u.embedding_fwd.seq = 8;
    k->u.embedding_fwd.vocab = 11;
    k->u.embedding_fwd.dtype = lp ? dt : FSDP_DTYPE_F32;
}

static void mk_emb_bwd(fsdp_kernel_t *k, int lp, fsdp_dtype_t dt)
{
    k->kind = FSDP_K_EMBEDDING_BWD;
    k->u.embedding_bwd.dwte = lp_ptr(0, lp);
    k->u.embedding_bwd.dwpe = lp_ptr(1, lp);
    k->u.embedding_bwd.dy = lp_ptr(2, lp);
    k->u.embedding_bwd.tokens = lp_tok;
    k->u.embedding_bwd.rows = LP_R;
    k->u.embedding_bwd.cols = LP_C;
    k->u.embedding_bwd.seq = 8;
    k->u.embedding_bwd.vocab = 11;
    k->u.embedding_bwd.dtype = lp ? dt : FSDP_DTYPE_F32;
}

static void mk_ce(fsdp_kernel_t *k, int lp, fsdp_dtype_t dt)
{
    k->kind = FSDP_K_CROSS_ENTROPY;
    k->u.cross_entropy.loss = lp ? lp_sh[1] : lp_sf[1];
    k->u.cross_entropy.losses = lp ? lp_sh[0] : lp_sf[0];
    k->u.cross_entropy.dlogits = lp_ptr(0, lp); /* in place */
    k->u.cross_entropy.logits = lp_ptr(0, lp);
    k->u.cross_entropy.targets = lp_tgt;
    k->u.cross_entropy.rows = LP_R;
    k->u.cross_entropy.vocab = LP_C;
    k->u.cross_entropy.denom = 17.0;
    k->u.cross_entropy.dtype = lp ? dt : FSDP_DTYPE_F32;
}

static void mk_add(fsdp_kernel_t *k, int lp, fsdp_dtype_t dt)
{
    k->kind = FSDP_K_ADD;
    k->u.add.y = lp_ptr(0, lp); /* in place on a */
    k->u.add.a = lp_ptr(0, lp);
    k->u.add.b = lp_ptr(1, lp);
    k->u.add.n = lp_t[0].n;
    k->u.add.dtype = lp ? dt : FSDP_DTYPE_F32;
}

static void test_low_precision(void)
{
    static const fsdp_dtype_t dts[] = {FSDP_DTYPE_BF16, FSDP_DTYPE_F16};
    const size_t n = (size_t)LP_R * LP_C;

    for (int d = 0; d < 2; d++) {
        fsdp_dtype_t dt = dts[d];
        static const int o1[] = {1}, o2[] = {2}, o0[] = {0}, o01[] = {0, 1}, o456[] = {4, 5, 6};

        rng_state = 5 + (uint64_t)d;
        for (int r = 0; r < LP_R; r++) {
            lp_tok[r] = (int32_t)urand(0, 10.99); /* repeated tokens */
            lp_tgt[r] = r == 5 ? -1 : (int32_t)urand(0, LP_C - 0.01);
        }
        /* layernorm: x with an offset (the mean matters), weight near 1 */
        lp_fill(0, n, 1.0, 3.0, dt);
        lp_fill(1, n, 0.0, 0.0, dt);
        lp_fill(2, LP_C, 0.5, 1.5, dt);
        lp_fill(3, LP_C, -0.5, 0.5, dt);
        lp_check("layernorm_fwd", mk_ln_fwd, dt, o1, 1, 0, 2, LP_R);
        lp_fill(4, n, -1.0, 1.0, dt);
        lp_fill(5, LP_C, 0.0, 0.0, dt); /* fresh weight gradients: their sums rounded once */
        lp_fill(6, LP_C, 0.0, 0.0, dt);
        lp_fill(7, n, -1.0, 1.0, dt);
        lp_accumulate = 0;
        lp_check("layernorm_bwd", mk_ln_bwd, dt, o456, 3, 0, 0, 0);
        {
            /* accumulate: dx0 + round(term), rounded, the two roundings of a separate add;
             * the term is the f32 launch's dx just computed */
            uint16_t dx0[LP_R * LP_C];
            fsdp_kernel_t k;
            long worst = 0;
            lp_fill(4, n, -1.0, 1.0, dt);
            memcpy(dx0, lp_t[4].h, sizeof(dx0));
            memset(&k, 0, sizeof(k));
            lp_accumulate = 1;
            mk_ln_bwd(&k, 1, dt);
            k.u.layernorm_bwd.dweight = k.u.layernorm_bwd.dbias = NULL;
            CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
            memset(lp_t[4].f, 0, sizeof(lp_t[4].f)); /* the f32 term alone */
            lp_accumulate = 0;
            mk_ln_bwd(&k, 0, dt);
            k.u.layernorm_bwd.dweight = k.u.layernorm_bwd.dbias = NULL;
            CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
            for (size_t e = 0; e < n; e++) {
                float term = lp_from16(lp_to16(lp_t[4].f[e], dt), dt);
                long u = lp_ulps(lp_t[4].h[e], lp_to16(lp_from16(dx0[e], dt) + term, dt));
                worst = u > worst ? u : worst;
            }
            CU_ASSERT_EQUAL(worst, 0);
        }
        lp_fill(0, n, -6.0, 6.0, dt);
        lp_fill(1, n, 0.0, 0.0, dt);
        lp_check("gelu_fwd", mk_gelu_fwd, dt, o1, 1, 0, 0, 0);
        lp_fill(2, n, -1.0, 1.0, dt);
        lp_check("gelu_bwd", mk_gelu_bwd, dt, o2, 1, 0, 0, 0);
        lp_fill(0, 3 * 64, -8.0, 8.0, dt);
        lp_check("softmax_fwd", mk_softmax_fwd, dt, o0, 1, 0, 0, 0);
        lp_sync(0, dt); /* the probabilities as the low-precision forward left them */
        lp_fill(1, 3 * 64, -1.0, 1.0, dt);
        lp_check("softmax_bwd", mk_softmax_bwd, dt, o1, 1, 0, 0, 0);
        lp_fill(0, 11 * LP_C, -1.0, 1.0, dt);
        lp_fill(1, 8 * LP_C, -1.0, 1.0, dt);
        lp_fill(2, n, 0.0, 0.0, dt);
        lp_check("embedding_fwd", mk_emb_fwd, dt, o2, 1, 0, 0, 0);
        lp_fill(2, n, -1.0, 1.0, dt);
        {
            /* the f32 reference of the low-precision backward: a token's rows (a token
             * repeats) and a position's (3 rows each) summed in f32 in row order and rounded
             * once, then added to the gradient and rounded */
            float wte[11 * LP_C], wpe[8 * LP_C], sw[11 * LP_C] = {0}, sp[8 * LP_C] = {0};
            fsdp_kernel_t k;
            long off_ulps = 0; /* summed over both tables */
            memcpy(wte, lp_t[0].f, sizeof(wte));
            memcpy(wpe, lp_t[1].f, sizeof(wpe));
            for (size_t r = 0; r < LP_R; r++)
                for (size_t c = 0; c < LP_C; c++) {
                    float g = lp_t[2].f[r * LP_C + c];
                    sw[(size_t)lp_tok[r] * LP_C + c] += g;
                    sp[(r % 8) * LP_C + c] += g;
                }
            for (size_t e = 0; e < 11 * LP_C; e++)
                wte[e] = lp_from16(lp_to16(wte[e] + lp_from16(lp_to16(sw[e], dt), dt), dt), dt);
            for (size_t e = 0; e < 8 * LP_C; e++)
                wpe[e] = lp_from16(lp_to16(wpe[e] + lp_from16(lp_to16(sp[e], dt), dt), dt), dt);
            memset(&k, 0, sizeof(k));
            mk_emb_bwd(&k, 1, dt);
            CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
            for (size_t e = 0; e < 11 * LP_C; e++)
                off_ulps += lp_ulps(lp_t[0].h[e], lp_to16(wte[e], dt));
            for (size_t e = 0; e < 8 * LP_C; e++)
                off_ulps += lp_ulps(lp_t[1].h[e], lp_to16(wpe[e], dt));
            CU_ASSERT_EQUAL(off_ulps, 0);
        }
        lp_fill(0, n, -4.0, 4.0, dt);
        lp_check("cross_entropy", mk_ce, dt, o0, 1, 0, 2, LP_R);
        lp_fill(0, n, -2.0, 2.0, dt);
        lp_fill(1, n, -2.0, 2.0, dt);
        lp_check("add", mk_add, dt, o01, 1, 0, 0, 0);
    }
}

/* A dtype the transformer kernels do not take is refused by name. */
static void test_low_precision_refusals(void)
{
    fsdp_kernel_t k;
    memset(&k, 0, sizeof(k));
    mk_add(&k, 0, FSDP_DTYPE_F32);
    k.u.add.dtype = FSDP_DTYPE_I32;
    CU_ASSERT_EQUAL(run(&k), FSDP_ERR_INVALID_PARAM);
    k.u.add.dtype = (fsdp_dtype_t)42;
    CU_ASSERT_EQUAL(run(&k), FSDP_ERR_INVALID_PARAM);
}

/* The cost model prices the low-precision tensors at 2 bytes: half the f32 bytes for the kinds
 * whose every tensor has the dtype. */
static void test_low_precision_costs(void)
{
    fsdp_kernel_t k;
    double f32_flops, f32_bytes, flops, bytes;
    memset(&k, 0, sizeof(k));
    mk_add(&k, 0, FSDP_DTYPE_F32);
    fsdp_kernel_cost(&k, &f32_flops, &f32_bytes);
    k.u.add.dtype = FSDP_DTYPE_BF16;
    fsdp_kernel_cost(&k, &flops, &bytes);
    CU_ASSERT_EQUAL(flops, f32_flops);
    CU_ASSERT_EQUAL(bytes * 2.0, f32_bytes);
    memset(&k, 0, sizeof(k));
    mk_softmax_fwd(&k, 0, FSDP_DTYPE_F32);
    fsdp_kernel_cost(&k, &f32_flops, &f32_bytes);
    k.u.softmax_fwd.dtype = FSDP_DTYPE_F16;
    fsdp_kernel_cost(&k, &flops, &bytes);
    CU_ASSERT_EQUAL(flops, f32_flops);
    CU_ASSERT_EQUAL(bytes * 2.0, f32_bytes);
}

/* ---- the lane shapes of lanes.h: sums against double, and against the sequential order ----
 *
 * A sum of n f32 terms in the lane shape (ceil(n / 32) terms a lane, in order, then the 5 levels
 * of the butterfly) is within (ceil(n / 32) + 5) u sum |t| of the exact sum (u = 2^-24, to
 * first order); the sequential sum of the bodies before the lanes was within n u sum |t|, so the
 * two differ by at most the sum of the two bounds. */

static const size_t lane_rows[] = {0, 1, 5, 31, 32, 33, 64, 100, 1000};
static const size_t lane_cols[] = {1, 7, 32, 33, 70};
#define LANE_NR (sizeof(lane_rows) / sizeof(lane_rows[0]))
#define LANE_NC (sizeof(lane_cols) / sizeof(lane_cols[0]))

static double lane_bound(size_t n, double abs_sum)
{
    return ((double)((n + 31) / 32) + 5.0) * 0x1p-24 * abs_sum * 1.01;
}

static double seq_bound(size_t n, double abs_sum)
{
    return (double)n * 0x1p-24 * abs_sum * 1.01;
}

/* got against the exact sum ref (sum |t| = abs) and the sequential f32 sum seq of n terms */
static int lane_sum_ok(float got, double ref, float seq, size_t n, double abs, const char *what,
                       size_t i)
{
    double e = fabs((double)got - ref), d = fabs((double)got - (double)seq);
    if (e <= lane_bound(n, abs) && d <= lane_bound(n, abs) + seq_bound(n, abs))
        return 1;
    fprintf(stderr, "\n  %s[%zu] of %zu terms: %.9g, exact %.9g, sequential %.9g (bound %g)\n",
            what, i, n, (double)got, ref, (double)seq, lane_bound(n, abs));
    return 0;
}

/* bias_grad and layernorm_bwd's dweight and dbias: the column shape */
static void test_lane_column_sums(void)
{
    for (size_t ri = 0; ri < LANE_NR; ri++) {
        for (size_t ci = 0; ci < LANE_NC; ci++) {
            const size_t rows = lane_rows[ri], cols = lane_cols[ci];
            float *dy = calloc(rows * cols + 1, sizeof(float));
            float *x = calloc(rows * cols + 1, sizeof(float));
            float *mean = calloc(rows + 1, sizeof(float)), *rstd = calloc(rows + 1, sizeof(float));
            float *db = calloc(cols, sizeof(float)), *dw = calloc(cols, sizeof(float));
            float *lb = calloc(cols, sizeof(float));
            fsdp_kernel_t k;
            int ok = 1;

            CU_ASSERT_FATAL(dy != NULL && x != NULL && mean != NULL && rstd != NULL && db != NULL &&
                            dw != NULL && lb != NULL);
            fill(dy, rows * cols, -1.0, 1.0);
            fill(x, rows * cols, -2.0, 2.0);
            fill(mean, rows, -0.5, 0.5);
            fill(rstd, rows, 0.5, 2.0);

            memset(&k, 0, sizeof(k));
            k.kind = FSDP_K_BIAS_GRAD;
            k.u.bias_grad.dbias = db;
            k.u.bias_grad.dy = dy;
            k.u.bias_grad.rows = rows;
            k.u.bias_grad.cols = cols;
            CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);

            memset(&k, 0, sizeof(k)); /* the column part alone (no dx) */
            k.kind = FSDP_K_LAYERNORM_BWD;
            k.u.layernorm_bwd.dweight = dw;
            k.u.layernorm_bwd.dbias = lb;
            k.u.layernorm_bwd.dy = dy;
            k.u.layernorm_bwd.x = x;
            k.u.layernorm_bwd.mean = mean;
            k.u.layernorm_bwd.rstd = rstd;
            k.u.layernorm_bwd.rows = rows;
            k.u.layernorm_bwd.cols = cols;
            CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);

            for (size_t c = 0; ok && c < cols; c++) {
                double rb = 0.0, ab = 0.0, rw = 0.0, aw = 0.0;
                float sb = 0.0f, sw = 0.0f;
                for (size_t r = 0; r < rows; r++) {
                    float g = dy[r * cols + c], t = g * ((x[r * cols + c] - mean[r]) * rstd[r]);
                    rb += g;
                    ab += fabs(g);
                    sb += g;
                    rw += t;
                    aw += fabs(t);
                    sw += t;
                }
                ok = lane_sum_ok(db[c], rb, sb, rows, ab, "bias_grad", c) &&
                     lane_sum_ok(lb[c], rb, sb, rows, ab, "layernorm dbias", c) &&
                     lane_sum_ok(dw[c], rw, sw, rows, aw, "layernorm dweight", c);
                /* the same terms in the same shape: the same bits */
                ok = ok && memcmp(&db[c], &lb[c], sizeof(float)) == 0;
                if (rows <= 1) /* one term (or none) is exact */
                    ok = ok && db[c] == (rows == 1 ? dy[c] : 0.0f) &&
                         lb[c] == (rows == 1 ? dy[c] : 0.0f);
            }
            if (!ok)
                fprintf(stderr, "  (%zu rows, %zu columns)\n", rows, cols);
            CU_ASSERT(ok);
            free(dy);
            free(x);
            free(mean);
            free(rstd);
            free(db);
            free(dw);
            free(lb);
        }
    }
}

/* embedding_bwd: the GPU's threads (a (column, token bucket) pair each, and a (column,
 * position) pair each) give the host loop's bits, in every dtype, with repeated, ignored and
 * out-of-range tokens, and with or without each table. */
static void test_lane_embedding_bwd(void)
{
    static const size_t rows_[] = {0, 1, 5, 33, 200};
    static const size_t cols_[] = {1, 7, 33, 70};
    static const fsdp_dtype_t dts[] = {FSDP_DTYPE_F32, FSDP_DTYPE_BF16, FSDP_DTYPE_F16};
    const size_t vocab = 100, seq = 24;

    for (size_t ri = 0; ri < 5; ri++) {
        for (size_t ci = 0; ci < 4; ci++) {
            for (int d = 0; d < 3; d++) {
                for (int tables = 1; tables < 4; tables++) {
                    const size_t rows = rows_[ri], cols = cols_[ci];
                    const fsdp_dtype_t dt = dts[d];
                    const size_t es = fsdp_dtype_size(dt);
                    int32_t *tok = calloc(rows + 1, sizeof(int32_t));
                    uint8_t *dy = calloc(rows * cols + 1, es);
                    uint8_t *wte[2], *wpe[2];
                    fsdp_kernel_t k;

                    for (int h = 0; h < 2; h++) {
                        wte[h] = calloc(vocab * cols, es);
                        wpe[h] = calloc(seq * cols, es);
                        CU_ASSERT_FATAL(wte[h] != NULL && wpe[h] != NULL);
                    }
                    CU_ASSERT_FATAL(tok != NULL && dy != NULL);
                    for (size_t r = 0; r < rows; r++) {
                        /* few distinct tokens (repeats), some ignored or out of range */
                        double u = urand(0.0, 1.0);
                        tok[r] = u < 0.05 ? -1 : u < 0.1 ? (int32_t)vocab : (int32_t)(u * 40.0);
                    }
                    for (size_t i = 0; i < rows * cols; i++)
                        fsdp_kb_store(dy, dt, i, (float)urand(-1.0, 1.0));
                    for (size_t i = 0; i < vocab * cols; i++)
                        fsdp_kb_store(wte[0], dt, i, (float)urand(-1.0, 1.0));
                    for (size_t i = 0; i < seq * cols; i++)
                        fsdp_kb_store(wpe[0], dt, i, (float)urand(-1.0, 1.0));
                    memcpy(wte[1], wte[0], vocab * cols * es);
                    memcpy(wpe[1], wpe[0], seq * cols * es);

                    for (int h = 0; h < 2; h++) {
                        memset(&k, 0, sizeof(k));
                        k.kind = FSDP_K_EMBEDDING_BWD;
                        k.u.embedding_bwd.dwte = tables & 1 ? wte[h] : NULL;
                        k.u.embedding_bwd.dwpe = tables & 2 ? wpe[h] : NULL;
                        k.u.embedding_bwd.dy = dy;
                        k.u.embedding_bwd.tokens = tok;
                        k.u.embedding_bwd.rows = rows;
                        k.u.embedding_bwd.cols = cols;
                        k.u.embedding_bwd.vocab = vocab;
                        k.u.embedding_bwd.seq = seq;
                        k.u.embedding_bwd.dtype = dt;
                        if (h == 0) {
                            CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
                        } else {
                            const size_t n = fsdp_kb_embedding_bwd_threads(&k);
                            for (size_t i = n; i-- > 0;) /* any order of the threads */
                                fsdp_kb_embedding_bwd_at(&k, i);
                        }
                    }
                    CU_ASSERT(memcmp(wte[0], wte[1], vocab * cols * es) == 0);
                    CU_ASSERT(memcmp(wpe[0], wpe[1], seq * cols * es) == 0);
                    for (int h = 0; h < 2; h++) {
                        free(wte[h]);
                        free(wpe[h]);
                    }
                    free(tok);
                    free(dy);
                }
            }
        }
    }
}

/* relative error within tol of the double value, reporting the first failure */
static int rel_ok(double got, double ref, double tol, const char *what, size_t n, size_t i)
{
    if (fabs(got - ref) <= tol * (fabs(ref) + 1e-30) || (got == ref))
        return 1;
    fprintf(stderr, "\n  %s[%zu] of a row of %zu: %.9g vs %.9g (tolerance %g)\n", what, i, n, got,
            ref, tol);
    return 0;
}

/* The row kernels (a warp per row, replayed on the host) against double: layernorm forward and
 * backward, softmax forward (plain and causal) and backward, cross-entropy, with rows of 0 to 257
 * columns; and layernorm's mean and cross-entropy's loss against the sequential f32 sums of the
 * bodies before the lanes (within the two sums' bounds). Tolerances: a lane sum of n terms is
 * within (ceil(n / 32) + 5) u sum |t| (u = 2^-24); exp and log add 2 ulp; each output rounds
 * a few more times: 1e-5 relative everywhere but the stated sums. */
static void test_lane_rows(void)
{
    static const size_t cols_[] = {1, 5, 31, 32, 33, 64, 100, 257};
    const size_t rows = 5;

    for (size_t ci = 0; ci < sizeof(cols_) / sizeof(cols_[0]); ci++) {
        const size_t n = cols_[ci], crows = 2 * n; /* causal: two blocks */
        const size_t arows = crows > rows ? crows : rows; /* the buffers hold either */
        float *x = malloc(arows * n * sizeof(float)), *y = malloc(arows * n * sizeof(float));
        float *dy = malloc(arows * n * sizeof(float)), *dx = malloc(arows * n * sizeof(float));
        float *w = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
        float mean[5], rstd[5], losses[5], loss;
        int32_t tgt[5];
        fsdp_kernel_t k;
        int ok = 1;

        CU_ASSERT_FATAL(x != NULL && y != NULL && dy != NULL && dx != NULL && w != NULL &&
                        b != NULL);
        fill(x, arows * n, -3.0, 3.0);
        fill(dy, arows * n, -1.0, 1.0);
        fill(w, n, 0.5, 1.5);
        fill(b, n, -0.5, 0.5);

        /* layernorm forward */
        memset(&k, 0, sizeof(k));
        k.kind = FSDP_K_LAYERNORM_FWD;
        k.u.layernorm_fwd.y = y;
        k.u.layernorm_fwd.mean = mean;
        k.u.layernorm_fwd.rstd = rstd;
        k.u.layernorm_fwd.x = x;
        k.u.layernorm_fwd.weight = w;
        k.u.layernorm_fwd.bias = b;
        k.u.layernorm_fwd.rows = rows;
        k.u.layernorm_fwd.cols = n;
        k.u.layernorm_fwd.eps = 1e-5f;
        CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
        for (size_t r = 0; ok && r < rows; r++) {
            const float *xr = x + r * n;
            double m = 0.0, v = 0.0, a = 0.0, rs;
            float seq = 0.0f;
            for (size_t c = 0; c < n; c++) {
                m += xr[c];
                a += fabs(xr[c]);
                seq += xr[c];
            }
            ok = lane_sum_ok(mean[r] * (float)n, m, seq, n, a + fabs(m), "layernorm sum", r);
            m /= (double)n;
            for (size_t c = 0; c < n; c++)
                v += (xr[c] - m) * (xr[c] - m);
            rs = 1.0 / sqrt(v / (double)n + 1e-5);
            ok = ok && rel_ok(rstd[r], rs, 1e-5, "layernorm rstd", n, r);
            for (size_t c = 0; ok && c < n; c++)
                ok = close_to(y[r * n + c], (xr[c] - m) * rs * w[c] + b[c], 1e-5, "layernorm y", c);
        }

        /* layernorm backward, the input gradient (the statistics of the forward) */
        memset(&k, 0, sizeof(k));
        k.kind = FSDP_K_LAYERNORM_BWD;
        k.u.layernorm_bwd.dx = dx;
        k.u.layernorm_bwd.dy = dy;
        k.u.layernorm_bwd.x = x;
        k.u.layernorm_bwd.mean = mean;
        k.u.layernorm_bwd.rstd = rstd;
        k.u.layernorm_bwd.weight = w;
        k.u.layernorm_bwd.rows = rows;
        k.u.layernorm_bwd.cols = n;
        CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
        for (size_t r = 0; ok && r < rows; r++) {
            double sg = 0.0, sgx = 0.0, scale = 0.0;
            for (size_t c = 0; c < n; c++) {
                double g = (double)dy[r * n + c] * w[c];
                double xh = ((double)x[r * n + c] - mean[r]) * rstd[r];
                sg += g;
                sgx += g * xh;
                scale += fabs(g) * (1.0 + fabs(xh));
            }
            sg /= (double)n;
            sgx /= (double)n;
            scale = scale / (double)n + 1.0; /* the size of the terms the sums cancel */
            for (size_t c = 0; ok && c < n; c++) {
                double g = (double)dy[r * n + c] * w[c];
                double xh = ((double)x[r * n + c] - mean[r]) * rstd[r];
                double want = (g - sg - xh * sgx) * rstd[r];
                if (!(fabs(dx[r * n + c] - want) <= 1e-5 * scale * rstd[r])) {
                    fprintf(stderr, "\n  layernorm dx[%zu] of %zu: %.9g vs %.9g\n", c, n,
                            (double)dx[r * n + c], want);
                    ok = 0;
                }
            }
        }

        /* softmax forward (plain, then causal), backward of the causal one */
        for (int causal = 0; causal < 2; causal++) {
            const size_t sr = causal ? crows : rows;
            memset(&k, 0, sizeof(k));
            k.kind = FSDP_K_SOFTMAX_FWD;
            k.u.softmax_fwd.y = y;
            k.u.softmax_fwd.x = x;
            k.u.softmax_fwd.rows = sr;
            k.u.softmax_fwd.cols = n;
            k.u.softmax_fwd.scale = 0.7f;
            k.u.softmax_fwd.causal = causal;
            CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
            for (size_t r = 0; ok && r < sr; r++) {
                const size_t valid = causal ? r % n + 1 : n;
                double mx = -INFINITY, sum = 0.0;
                for (size_t j = 0; j < valid; j++)
                    mx = fmax(mx, (double)(x[r * n + j] * 0.7f));
                for (size_t j = 0; j < valid; j++)
                    sum += exp((double)(x[r * n + j] * 0.7f) - mx);
                for (size_t j = 0; ok && j < n; j++)
                    ok = j < valid
                             ? rel_ok(y[r * n + j], exp((double)(x[r * n + j] * 0.7f) - mx) / sum,
                                      1e-5, "softmax y", n, j)
                             : y[r * n + j] == 0.0f;
            }
        }
        memset(&k, 0, sizeof(k)); /* y: the causal softmax */
        k.kind = FSDP_K_SOFTMAX_BWD;
        k.u.softmax_bwd.dx = dx;
        k.u.softmax_bwd.dy = dy;
        k.u.softmax_bwd.y = y;
        k.u.softmax_bwd.rows = crows;
        k.u.softmax_bwd.cols = n;
        k.u.softmax_bwd.scale = 0.7f;
        k.u.softmax_bwd.causal = 1;
        CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
        for (size_t r = 0; ok && r < crows; r++) {
            const size_t valid = r % n + 1;
            double dot = 0.0;
            for (size_t j = 0; j < valid; j++)
                dot += (double)y[r * n + j] * dy[r * n + j];
            for (size_t j = 0; ok && j < n; j++) {
                double want = j < valid ? 0.7 * y[r * n + j] * (dy[r * n + j] - dot) : 0.0;
                /* |dy - dot| may cancel: absolute in units of y's scale */
                ok = j < valid ? fabs(dx[r * n + j] - want) <= 1e-5 * (y[r * n + j] + 1e-30) * 2.0
                               : dx[r * n + j] == 0.0f;
                if (!ok)
                    fprintf(stderr, "\n  softmax dx[%zu] of %zu: %.9g vs %.9g\n", j, n,
                            (double)dx[r * n + j], want);
            }
        }

        /* cross-entropy: a target in every lane position, one ignored row */
        for (size_t r = 0; r < rows; r++)
            tgt[r] = r == 3 ? -1 : (int32_t)((r * 37) % n);
        memset(&k, 0, sizeof(k));
        k.kind = FSDP_K_CROSS_ENTROPY;
        k.u.cross_entropy.loss = &loss;
        k.u.cross_entropy.losses = losses;
        k.u.cross_entropy.dlogits = dx;
        k.u.cross_entropy.logits = x;
        k.u.cross_entropy.targets = tgt;
        k.u.cross_entropy.rows = rows;
        k.u.cross_entropy.vocab = n;
        k.u.cross_entropy.denom = 4.0;
        CU_ASSERT_EQUAL_FATAL(run(&k), FSDP_OK);
        for (size_t r = 0; ok && r < rows; r++) {
            const float *l = x + r * n;
            double mx = -INFINITY, sum = 0.0;
            float fmx = -INFINITY, fsum = 0.0f, seq;
            if (tgt[r] < 0) {
                ok = losses[r] == 0.0f;
                continue;
            }
            for (size_t j = 0; j < n; j++) {
                mx = fmax(mx, l[j]);
                fmx = l[j] > fmx ? l[j] : fmx;
            }
            for (size_t j = 0; j < n; j++) {
                sum += exp(l[j] - mx);
                fsum += fsdp_kb_expf(l[j] - fmx);
            }
            seq = (fmx + fsdp_kb_logf(fsum)) - l[tgt[r]];
            /* the loss: log of the sum (within the sum's bound, relative) plus the logits */
            ok = fabs(losses[r] - (mx + log(sum) - l[tgt[r]])) <=
                     lane_bound(n, sum) / sum + 1e-6 * (fabs(mx) + fabs(l[tgt[r]]) + 1.0) &&
                 fabs(losses[r] - seq) <= (lane_bound(n, sum) + seq_bound(n, sum)) / sum +
                                              1e-6 * (fabs(mx) + fabs(l[tgt[r]]) + 1.0);
            if (!ok)
                fprintf(stderr, "\n  cross-entropy loss of %zu classes: %.9g vs %.9g, seq %.9g\n",
                        n, (double)losses[r], mx + log(sum) - l[tgt[r]], (double)seq);
            for (size_t j = 0; ok && j < n; j++) {
                double p = exp(l[j] - mx) / sum;
                ok = fabs(dx[r * n + j] - (p - (j == (size_t)tgt[r])) / 4.0) <=
                     1e-5 * (p + (j == (size_t)tgt[r]) + 1e-30);
                if (!ok)
                    fprintf(stderr, "\n  dlogits[%zu] of %zu: %.9g vs %.9g\n", j, n,
                            (double)dx[r * n + j], (p - (j == (size_t)tgt[r])) / 4.0);
            }
        }
        CU_ASSERT(ok);
        free(x);
        free(y);
        free(dy);
        free(dx);
        free(w);
        free(b);
    }

    /* no rows: nothing is read or written */
    {
        fsdp_kernel_t k;
        memset(&k, 0, sizeof(k));
        k.kind = FSDP_K_SOFTMAX_FWD;
        k.u.softmax_fwd.cols = 8;
        CU_ASSERT_EQUAL(run(&k), FSDP_OK);
        memset(&k, 0, sizeof(k));
        k.kind = FSDP_K_LAYERNORM_FWD;
        k.u.layernorm_fwd.cols = 8;
        CU_ASSERT_EQUAL(run(&k), FSDP_OK);
        memset(&k, 0, sizeof(k));
        k.kind = FSDP_K_CROSS_ENTROPY;
        k.u.cross_entropy.vocab = 8;
        CU_ASSERT_EQUAL(run(&k), FSDP_OK);
    }
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"exp and log of the shared bodies within 2 ulp", test_exp_log},
        {"layernorm forward, backward against finite differences", test_layernorm},
        {"gelu_new forward, backward against finite differences", test_gelu},
        {"causal and plain softmax, backward against finite differences", test_softmax},
        {"embedding forward and accumulated backward", test_embedding},
        {"cross-entropy with ignored targets, dlogits against finite differences",
         test_cross_entropy},
        {"add; batched GEMM equals single products, cost scales", test_add_and_batched_gemm},
        {"names, costs and checks of every transformer kind", test_names_costs_checks},
        {"bf16 and f16 variants equal the f32 bodies rounded once", test_low_precision},
        {"a dtype the transformer kernels do not take is refused", test_low_precision_refusals},
        {"low-precision tensors cost 2 bytes", test_low_precision_costs},
        {"column sums in the lane shape: within f32 bounds of double and of the row order",
         test_lane_column_sums},
        {"embedding_bwd by token buckets gives the row-order loop's bits", test_lane_embedding_bwd},
        {"row kernels in the lane shape against double and the row order", test_lane_rows},
        {NULL, NULL},
    };
    return fsdp_test_run("gpt2_kernels", tests);
}
