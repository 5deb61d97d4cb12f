/* The Llama kernels (rmsnorm, rope, swiglu, fused attention) through the sim's executor: each
 * forward and backward against its formula computed here in double; the fused attention also
 * against the unfused math run by the library's own f32 kernels (GEMMs and the causal softmax),
 * forward and backward, for multi-head, grouped-query and multi-query layouts; and the cost
 * model's count of fused attention (causal about half of full, bytes linear in the sequence).
 */
#include <fsdp/fsdp.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/llama_bodies.h"
#include "sim_kernels.h"
#include "test_util.h"

static uint64_t rng_state = 5;

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

/* max |a - b| / max |b| over n elements */
static double rel_err(const float *a, const double *b, size_t n)
{
    double d = 0.0, m = 1e-30;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs(b[i]));
    }
    return d / m;
}

static double rel_err_f(const float *a, const float *b, size_t n)
{
    double d = 0.0, m = 1e-30;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - (double)b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return d / m;
}

/* ---- the lanes ---- */

/* fsdp_kb_lanes_sum_n (the host's butterfly that skips lanes without elements) has the bits of
 * the whole butterfly over partials that are +0 past n, for every n, with signs, cancellations,
 * infinities and NaN among the partials; and FSDP_KB_SLOT walks lane l's elements in order. */
static void test_lanes(void)
{
    for (int trial = 0; trial < 200; trial++)
        for (size_t n = 0; n <= FSDP_KB_LANES + 3; n++) {
            float a[FSDP_KB_LANES], b[FSDP_KB_LANES], x, y;
            for (size_t l = 0; l < FSDP_KB_LANES; l++) {
                a[l] = l < n ? (float)urand(-1, 1) * (trial % 3 == 0 ? 1e30f : 1.0f) : 0.0f;
                if (l < n && trial % 7 == 1 && l % 5 == 0)
                    a[l] = -a[l > 0 ? l - 1 : 0]; /* exact cancellations */
                if (l < n && trial == 5 && l == n / 2)
                    a[l] = (l % 2) ? INFINITY : NAN;
                b[l] = a[l];
            }
            x = fsdp_kb_lane_tree(a);
            y = fsdp_kb_lanes_sum_n(b, n);
            CU_ASSERT(memcmp(&x, &y, sizeof(x)) == 0);
        }
    CU_ASSERT_EQUAL(FSDP_KB_STEP, 1);
    for (size_t e = 0; e < 100; e++)
        CU_ASSERT_EQUAL(FSDP_KB_SLOT(e), e % FSDP_KB_LANES);
}

/* ---- RMSNorm ---- */

static void test_rmsnorm(void)
{
    enum { R = 7, C = 37 };
    float x[R * C], w[C], y[R * C], rstd[R], dy[R * C], dx[R * C], dw[C];
    double ry[R * C], rdx[R * C], rdw[C] = {0};
    const double eps = 1e-5;
    fsdp_kernel_t k = {.kind = FSDP_K_RMSNORM_FWD};

    fill(x, R * C, -2, 2);
    fill(w, C, 0.5, 1.5);
    fill(dy, R * C, -1, 1);
    for (int c = 0; c < C; c++)
        dw[c] = 0.25f;
    for (int r = 0; r < R; r++) {
        double ss = 0.0, rs, dot = 0.0;
        for (int c = 0; c < C; c++)
            ss += (double)x[r * C + c] * x[r * C + c];
        rs = 1.0 / sqrt(ss / C + eps);
        for (int c = 0; c < C; c++) {
            ry[r * C + c] = x[r * C + c] * rs * w[c];
            dot += (double)dy[r * C + c] * w[c] * x[r * C + c] * rs;
            rdw[c] += (double)dy[r * C + c] * x[r * C + c] * rs;
        }
        for (int c = 0; c < C; c++)
            rdx[r * C + c] = rs * (dy[r * C + c] * w[c] - x[r * C + c] * rs * dot / C);
    }
    for (int c = 0; c < C; c++)
        rdw[c] += 0.25;
    k.u.rmsnorm_fwd.y = y;
    k.u.rmsnorm_fwd.rstd = rstd;
    k.u.rmsnorm_fwd.x = x;
    k.u.rmsnorm_fwd.weight = w;
    k.u.rmsnorm_fwd.rows = R;
    k.u.rmsnorm_fwd.cols = C;
    k.u.rmsnorm_fwd.eps = (float)eps;
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&k), FSDP_OK);
    CU_ASSERT(rel_err(y, ry, R * C) < 2e-6);

    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_RMSNORM_BWD;
    k.u.rmsnorm_bwd.dx = dx;
    k.u.rmsnorm_bwd.dweight = dw;
    k.u.rmsnorm_bwd.dy = dy;
    k.u.rmsnorm_bwd.x = x;
    k.u.rmsnorm_bwd.rstd = rstd;
    k.u.rmsnorm_bwd.weight = w;
    k.u.rmsnorm_bwd.rows = R;
    k.u.rmsnorm_bwd.cols = C;
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&k), FSDP_OK);
    CU_ASSERT(rel_err(dx, rdx, R * C) < 1e-5);
    CU_ASSERT(rel_err(dw, rdw, C) < 1e-5);

    /* dx overlapping dy is refused */
    k.u.rmsnorm_bwd.dx = dy;
    CU_ASSERT_EQUAL(fsdp_sim_kernel_exec(&k), FSDP_ERR_INVALID_PARAM);
}

/* ---- rotary embedding ---- */

static void test_rope(void)
{
    enum { B = 2, T = 5, NH = 3, HD = 8, LD = 29 }; /* heads inside wider rows */
    float x[B * T * LD], y[B * T * LD], back[B * T * LD], cs[T * HD / 2], sn[T * HD / 2];
    double ry[B * T * LD];
    fsdp_kernel_t k = {.kind = FSDP_K_ROPE_FWD};

    fill(x, B * T * LD, -1, 1);
    for (int p = 0; p < T; p++)
        for (int i = 0; i < HD / 2; i++) {
            double a = p * pow(10000.0, -2.0 * i / HD);
            cs[p * HD / 2 + i] = (float)cos(a);
            sn[p * HD / 2 + i] = (float)sin(a);
        }
    memcpy(y, x, sizeof(x));
    for (int e = 0; e < B * T * LD; e++)
        ry[e] = x[e];
    for (int r = 0; r < B * T; r++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < HD; i++) { /* q cos + rotate_half(q) sin */
                int p = r % T, j = i % (HD / 2);
                double q = x[r * LD + h * HD + i];
                double rot =
                    i < HD / 2 ? -x[r * LD + h * HD + i + HD / 2] : x[r * LD + h * HD + i - HD / 2];
                ry[r * LD + h * HD + i] = q * cs[p * HD / 2 + j] + rot * sn[p * HD / 2 + j];
            }
    k.u.rope.y = y; /* in place */
    k.u.rope.x = y;
    k.u.rope.cos = cs;
    k.u.rope.sin = sn;
    k.u.rope.rows = B * T;
    k.u.rope.heads = NH;
    k.u.rope.head_dim = HD;
    k.u.rope.seq = T;
    k.u.rope.ld = LD;
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&k), FSDP_OK);
    CU_ASSERT(rel_err(y, ry, B * T * LD) < 2e-7);
    /* the backward is the inverse rotation (its transpose): it brings x back */
    k.kind = FSDP_K_ROPE_BWD;
    k.u.rope.y = back;
    k.u.rope.x = y;
    memcpy(back, y, sizeof(y));
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&k), FSDP_OK);
    CU_ASSERT(rel_err_f(back, x, B * T * LD) < 1e-6);
    k.u.rope.head_dim = 7;
    CU_ASSERT_EQUAL(fsdp_sim_kernel_exec(&k), FSDP_ERR_INVALID_PARAM);
}

/* ---- SwiGLU ---- */

static void test_swiglu(void)
{
    enum { N = 301 };
    float g[N], u[N], y[N], dy[N], dg[N], du[N];
    double ry[N], rdg[N], rdu[N];
    fsdp_kernel_t k = {.kind = FSDP_K_SWIGLU_FWD};

    fill(g, N, -12, 12);
    fill(u, N, -2, 2);
    fill(dy, N, -1, 1);
    for (int i = 0; i < N; i++) {
        double s = 1.0 / (1.0 + exp(-(double)g[i]));
        ry[i] = g[i] * s * u[i];
        rdu[i] = dy[i] * g[i] * s;
        rdg[i] = dy[i] * u[i] * s * (1.0 + g[i] * (1.0 - s));
    }
    k.u.swiglu_fwd.y = y;
    k.u.swiglu_fwd.gate = g;
    k.u.swiglu_fwd.up = u;
    k.u.swiglu_fwd.n = N;
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&k), FSDP_OK);
    CU_ASSERT(rel_err(y, ry, N) < 1e-6);
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_SWIGLU_BWD;
    memcpy(dg, g, sizeof(g)); /* in place over gate and up */
    memcpy(du, u, sizeof(u));
    k.u.swiglu_bwd.dgate = dg;
    k.u.swiglu_bwd.dup = du;
    k.u.swiglu_bwd.dy = dy;
    k.u.swiglu_bwd.gate = dg;
    k.u.swiglu_bwd.up = du;
    k.u.swiglu_bwd.n = N;
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&k), FSDP_OK);
    CU_ASSERT(rel_err(dg, rdg, N) < 1e-6);
    CU_ASSERT(rel_err(du, rdu, N) < 1e-6);
}

/* ---- fused attention ---- */

typedef struct attn_case {
    int B, T, H, K, hd, causal;
} attn_case_t;

typedef struct attn_bufs {
    float *q, *k, *v, *o, *lse, *dout, *dq, *dk, *dv, *delta;
    size_t ldq, ldk, ldv, ldo;
} attn_bufs_t;

/* q, k, v in one [B*T, (H + 2K) hd] buffer, as the model lays them out; o and dout [B*T, H hd] */
static void attn_alloc(const attn_case_t *c, attn_bufs_t *a)
{
    size_t rows = (size_t)c->B * c->T, w = (size_t)(c->H + 2 * c->K) * c->hd;
    a->ldq = a->ldk = a->ldv = w;
    a->ldo = (size_t)c->H * c->hd;
    a->q = calloc(rows * w, sizeof(float));
    a->k = a->q + (size_t)c->H * c->hd;
    a->v = a->k + (size_t)c->K * c->hd;
    a->dq = calloc(rows * w, sizeof(float));
    a->dk = a->dq + (size_t)c->H * c->hd;
    a->dv = a->dk + (size_t)c->K * c->hd;
    a->o = calloc(rows * a->ldo, sizeof(float));
    a->dout = calloc(rows * a->ldo, sizeof(float));
    a->lse = calloc((size_t)c->B * c->H * c->T, sizeof(float));
    a->delta = calloc((size_t)c->B * c->H * c->T, sizeof(float));
    fill(a->q, rows * w, -1.5, 1.5);
    fill(a->dout, rows * a->ldo, -1, 1);
}

static void attn_free(attn_bufs_t *a)
{
    free(a->q);
    free(a->dq);
    free(a->o);
    free(a->dout);
    free(a->lse);
    free(a->delta);
}

static fsdp_status_t fused(const attn_case_t *c, attn_bufs_t *a, float scale)
{
    fsdp_kernel_t k = {.kind = FSDP_K_ATTENTION_FWD};
    fsdp_status_t st;

    k.u.attention_fwd.o = a->o;
    k.u.attention_fwd.lse = a->lse;
    k.u.attention_fwd.q = a->q;
    k.u.attention_fwd.k = a->k;
    k.u.attention_fwd.v = a->v;
    k.u.attention_fwd.batch = (size_t)c->B;
    k.u.attention_fwd.seq = (size_t)c->T;
    k.u.attention_fwd.heads = (size_t)c->H;
    k.u.attention_fwd.kv_heads = (size_t)c->K;
    k.u.attention_fwd.head_dim = (size_t)c->hd;
    k.u.attention_fwd.ldq = a->ldq;
    k.u.attention_fwd.ldk = a->ldk;
    k.u.attention_fwd.ldv = a->ldv;
    k.u.attention_fwd.ldo = a->ldo;
    k.u.attention_fwd.scale = scale;
    k.u.attention_fwd.causal = c->causal;
    st = fsdp_sim_kernel_exec(&k);
    if (st != FSDP_OK)
        return st;
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_ATTENTION_BWD;
    k.u.attention_bwd.dq = a->dq;
    k.u.attention_bwd.dk = a->dk;
    k.u.attention_bwd.dv = a->dv;
    k.u.attention_bwd.delta = a->delta;
    k.u.attention_bwd.dout = a->dout;
    k.u.attention_bwd.o = a->o;
    k.u.attention_bwd.q = a->q;
    k.u.attention_bwd.k = a->k;
    k.u.attention_bwd.v = a->v;
    k.u.attention_bwd.lse = a->lse;
    k.u.attention_bwd.batch = (size_t)c->B;
    k.u.attention_bwd.seq = (size_t)c->T;
    k.u.attention_bwd.heads = (size_t)c->H;
    k.u.attention_bwd.kv_heads = (size_t)c->K;
    k.u.attention_bwd.head_dim = (size_t)c->hd;
    k.u.attention_bwd.ldq = a->ldq;
    k.u.attention_bwd.ldk = a->ldk;
    k.u.attention_bwd.ldv = a->ldv;
    k.u.attention_bwd.ldo = a->ldo;
    k.u.attention_bwd.scale = scale;
    k.u.attention_bwd.causal = c->causal;
    return fsdp_sim_kernel_exec(&k);
}

static fsdp_status_t gemm(int ta, int tb, size_t m, size_t n, size_t kk, const float *a, size_t lda,
                          const float *b, size_t ldb, float beta, float *c, size_t ldc)
{
    fsdp_kernel_t k = {.kind = FSDP_K_GEMM};
    k.u.gemm.trans_a = ta;
    k.u.gemm.trans_b = tb;
    k.u.gemm.m = m;
    k.u.gemm.n = n;
    k.u.gemm.k = kk;
    k.u.gemm.alpha = 1.0f;
    k.u.gemm.a = a;
    k.u.gemm.lda = lda;
    k.u.gemm.b = b;
    k.u.gemm.ldb = ldb;
    k.u.gemm.beta = beta;
    k.u.gemm.c = c;
    k.u.gemm.ldc = ldc;
    return fsdp_sim_kernel_exec(&k);
}

/* The unfused math with the library's f32 kernels, per (batch, head): S = Q K^T, P =
 * softmax(scale S, causal), O = P V; dP = dO V^T, dV += P^T dO, dS = softmax_bwd, dQ = dS K,
 * dK += dS^T Q. (Non-causal: the softmax without the mask.) */
static void unfused(const attn_case_t *c, const attn_bufs_t *a, float scale, float *o, float *dq,
                    float *dk, float *dv)
{
    const size_t T = (size_t)c->T, hd = (size_t)c->hd, grp = (size_t)(c->H / c->K);
    float *p = malloc(T * T * sizeof(float)), *dp = malloc(T * T * sizeof(float));
    fsdp_status_t st = FSDP_OK;

    for (size_t b = 0; b < (size_t)c->B; b++)
        for (size_t h = 0; h < (size_t)c->H; h++) {
            size_t g = h / grp, r0 = b * T;
            const float *q = a->q + r0 * a->ldq + h * hd, *k = a->k + r0 * a->ldk + g * hd;
            const float *v = a->v + r0 * a->ldv + g * hd, *dout = a->dout + r0 * a->ldo + h * hd;
            fsdp_kernel_t s = {.kind = FSDP_K_SOFTMAX_FWD};
            float beta = h % grp == 0 ? 0.0f : 1.0f; /* a kv head sums over its group */
            st |= gemm(0, 1, T, T, hd, q, a->ldq, k, a->ldk, 0.0f, p, T);
            s.u.softmax_fwd.y = p;
            s.u.softmax_fwd.x = p;
            s.u.softmax_fwd.rows = T;
            s.u.softmax_fwd.cols = T;
            s.u.softmax_fwd.scale = scale;
            s.u.softmax_fwd.causal = c->causal;
            st |= fsdp_sim_kernel_exec(&s);
            st |= gemm(0, 0, T, hd, T, p, T, v, a->ldv, 0.0f, o + r0 * a->ldo + h * hd, a->ldo);
            st |= gemm(0, 1, T, T, hd, dout, a->ldo, v, a->ldv, 0.0f, dp, T);
            st |= gemm(1, 0, T, hd, T, p, T, dout, a->ldo, beta, dv + r0 * a->ldv + g * hd, a->ldv);
            memset(&s, 0, sizeof(s));
            s.kind = FSDP_K_SOFTMAX_BWD;
            s.u.softmax_bwd.dx = dp;
            s.u.softmax_bwd.dy = dp;
            s.u.softmax_bwd.y = p;
            s.u.softmax_bwd.rows = T;
            s.u.softmax_bwd.cols = T;
            s.u.softmax_bwd.scale = scale;
            s.u.softmax_bwd.causal = c->causal;
            st |= fsdp_sim_kernel_exec(&s);
            st |= gemm(0, 0, T, hd, T, dp, T, k, a->ldk, 0.0f, dq + r0 * a->ldq + h * hd, a->ldq);
            st |= gemm(1, 0, T, hd, T, dp, T, q, a->ldq, beta, dk + r0 * a->ldk + g * hd, a->ldk);
        }
    CU_ASSERT_EQUAL(st, FSDP_OK);
    free(p);
    free(dp);
}

/* The same in double, with the log-sum-exp of each row. */
static void exact(const attn_case_t *c, const attn_bufs_t *a, double scale, double *o, double *lse,
                  double *dq, double *dk, double *dv)
{
    const int T = c->T, hd = c->hd, grp = c->H / c->K;
    double *p = malloc((size_t)T * sizeof(double)), *ds = malloc((size_t)T * sizeof(double));

    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->H; h++) {
            int g = h / grp;
            for (int t = 0; t < T; t++) {
                const float *q = a->q + (size_t)(b * T + t) * a->ldq + h * hd;
                const float *dout = a->dout + (size_t)(b * T + t) * a->ldo + (size_t)h * hd;
                int last = c->causal ? t : T - 1;
                double m = -INFINITY, l = 0.0, dsum = 0.0;
                for (int j = 0; j <= last; j++) {
                    const float *k = a->k + (size_t)(b * T + j) * a->ldk + g * hd;
                    double s = 0.0;
                    for (int e = 0; e < hd; e++)
                        s += (double)q[e] * k[e];
                    p[j] = s * scale;
                    m = fmax(m, p[j]);
                }
                for (int j = 0; j <= last; j++)
                    l += exp(p[j] - m);
                lse[(b * c->H + h) * T + t] = m + log(l);
                for (int e = 0; e < hd; e++)
                    o[(size_t)(b * T + t) * a->ldo + h * hd + e] = 0.0;
                for (int j = 0; j <= last; j++) {
                    const float *v = a->v + (size_t)(b * T + j) * a->ldv + g * hd;
                    double dp = 0.0;
                    p[j] = exp(p[j] - m) / l;
                    for (int e = 0; e < hd; e++) {
                        o[(size_t)(b * T + t) * a->ldo + h * hd + e] += p[j] * v[e];
                        dp += (double)dout[e] * v[e];
                    }
                    ds[j] = dp;
                    dsum += p[j] * dp;
                }
                for (int j = 0; j <= last; j++) {
                    const float *k = a->k + (size_t)(b * T + j) * a->ldk + g * hd;
                    double d = p[j] * (ds[j] - dsum) * scale;
                    for (int e = 0; e < hd; e++) {
                        dq[(size_t)(b * T + t) * a->ldq + h * hd + e] += d * k[e];
                        dk[(size_t)(b * T + j) * a->ldk + g * hd + e] += d * q[e];
                        dv[(size_t)(b * T + j) * a->ldv + g * hd + e] += p[j] * dout[e];
                    }
                }
            }
        }
    free(p);
    free(ds);
}

/* Only the columns of one part (q, k or v) of the fused rows. */
static double part_err(const attn_case_t *c, const float *a, const float *b, size_t ld,
                       size_t width)
{
    double d = 0.0, m = 1e-30;
    for (size_t r = 0; r < (size_t)c->B * c->T; r++)
        for (size_t e = 0; e < width; e++) {
            d = fmax(d, fabs((double)a[r * ld + e] - (double)b[r * ld + e]));
            m = fmax(m, fabs((double)b[r * ld + e]));
        }
    return d / m;
}

static double part_err_d(const attn_case_t *c, const float *a, const double *b, size_t ld,
                         size_t width)
{
    double d = 0.0, m = 1e-30;
    for (size_t r = 0; r < (size_t)c->B * c->T; r++)
        for (size_t e = 0; e < width; e++) {
            d = fmax(d, fabs((double)a[r * ld + e] - b[r * ld + e]));
            m = fmax(m, fabs(b[r * ld + e]));
        }
    return d / m;
}

static void test_attention(void)
{
    static const attn_case_t cases[] = {
        {2, 9, 4, 4, 8, 1},   /* multi-head */
        {2, 9, 4, 2, 8, 1},   /* grouped-query */
        {1, 16, 6, 1, 16, 1}, /* multi-query */
        {2, 7, 4, 2, 8, 0},   /* not causal */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const attn_case_t *c = &cases[i];
        const size_t rows = (size_t)c->B * c->T, w = (size_t)(c->H + 2 * c->K) * c->hd;
        const size_t qw = (size_t)c->H * c->hd, kw = (size_t)c->K * c->hd;
        const float scale = (float)(1.0 / sqrt((double)c->hd));
        attn_bufs_t a;
        float *uo, *ud;
        double *eo, *lse_ref, *ed, lse_err = 0.0, worst;

        attn_alloc(c, &a);
        uo = calloc(rows * a.ldo, sizeof(float));
        ud = calloc(rows * w, sizeof(float));
        eo = calloc(rows * a.ldo, sizeof(double));
        ed = calloc(rows * w, sizeof(double));
        lse_ref = calloc((size_t)c->B * c->H * c->T, sizeof(double));
        CU_ASSERT_EQUAL_FATAL(fused(c, &a, scale), FSDP_OK);
        unfused(c, &a, scale, uo, ud, ud + qw, ud + qw + kw);
        exact(c, &a, scale, eo, lse_ref, ed, ed + qw, ed + qw + kw);
        for (size_t r = 0; r < (size_t)c->B * c->H * c->T; r++)
            lse_err = fmax(lse_err, fabs(a.lse[r] - lse_ref[r]));
        /* fused against unfused f32: the same math in another order, within f32 rounding */
        worst =
            fmax(rel_err_f(a.o, uo, rows * a.ldo),
                 fmax(part_err(c, a.dq, ud, w, qw), fmax(part_err(c, a.dk, ud + qw, w, kw),
                                                         part_err(c, a.dv, ud + qw + kw, w, kw))));
        fprintf(stderr,
                "\n  B=%d T=%d H=%d K=%d hd=%d causal=%d: fused vs unfused %.2g, vs double: o "
                "%.2g dq %.2g dk %.2g dv %.2g, lse %.2g",
                c->B, c->T, c->H, c->K, c->hd, c->causal, worst, rel_err(a.o, eo, rows * a.ldo),
                part_err_d(c, a.dq, ed, w, qw), part_err_d(c, a.dk, ed + qw, w, kw),
                part_err_d(c, a.dv, ed + qw + kw, w, kw), lse_err);
        CU_ASSERT(worst < 1e-5);
        CU_ASSERT(rel_err(a.o, eo, rows * a.ldo) < 1e-5);
        CU_ASSERT(part_err_d(c, a.dq, ed, w, qw) < 1e-5);
        CU_ASSERT(part_err_d(c, a.dk, ed + qw, w, kw) < 1e-5);
        CU_ASSERT(part_err_d(c, a.dv, ed + qw + kw, w, kw) < 1e-5);
        CU_ASSERT(lse_err < 1e-5);
        free(uo);
        free(ud);
        free(eo);
        free(ed);
        free(lse_ref);
        attn_free(&a);
    }
}

/* The lanes of the row bodies (lanes.h: 32 lanes over head_dim, meeting in a butterfly) against
 * double for every head_dim the models use and some they do not (8 and 80: lanes with one element
 * or none, a tail of 16), sequences of 1, across 32 and longer, and 1, 2 and 4 query heads per kv
 * head; causal, and a few not. The bound, relative to the largest |element| of each output: the
 * f32 sums have at most a few hundred terms (dk and dv: group x T), so a few 1e-6 at worst. */
static void test_attention_sweep(void)
{
    static const int hds[] = {8, 32, 64, 80, 128}, Ts[] = {1, 31, 33, 100}, ratios[] = {1, 2, 4};
    double worst[5] = {0};

    for (size_t hi = 0; hi < 5; hi++)
        for (size_t ti = 0; ti < 4; ti++)
            for (size_t ri = 0; ri < 3; ri++) {
                const attn_case_t cc = {1 + (int)(ti % 2), Ts[ti], 4, 4 / ratios[ri], hds[hi],
                                        !(hi == 3 && ri == 1)};
                const attn_case_t *c = &cc;
                const size_t rows = (size_t)c->B * c->T, w = (size_t)(c->H + 2 * c->K) * c->hd;
                const size_t qw = (size_t)c->H * c->hd, kw = (size_t)c->K * c->hd;
                const float scale = (float)(1.0 / sqrt((double)c->hd));
                double *eo = calloc(rows * qw, sizeof(double)), *ed = calloc(rows * w, sizeof(double));
                double *lse_ref = calloc((size_t)c->B * c->H * c->T, sizeof(double)), e[5];
                attn_bufs_t a;

                attn_alloc(c, &a);
                CU_ASSERT_EQUAL_FATAL(fused(c, &a, scale), FSDP_OK);
                exact(c, &a, scale, eo, lse_ref, ed, ed + qw, ed + qw + kw);
                e[0] = rel_err(a.o, eo, rows * a.ldo);
                e[1] = part_err_d(c, a.dq, ed, w, qw);
                e[2] = part_err_d(c, a.dk, ed + qw, w, kw);
                e[3] = part_err_d(c, a.dv, ed + qw + kw, w, kw);
                e[4] = 0.0;
                for (size_t r = 0; r < (size_t)c->B * c->H * c->T; r++)
                    e[4] = fmax(e[4], fabs(a.lse[r] - lse_ref[r]));
                for (int i = 0; i < 5; i++) {
                    worst[i] = fmax(worst[i], e[i]);
                    if (!(e[i] < 1e-5))
                        fprintf(stderr, "\n  B=%d T=%d H=%d K=%d hd=%d causal=%d: output %d off by %.3g",
                                c->B, c->T, c->H, c->K, c->hd, c->causal, i, e[i]);
                    CU_ASSERT(e[i] < 1e-5);
                }
                free(eo);
                free(ed);
                free(lse_ref);
                attn_free(&a);
            }
    fprintf(stderr, "\n  worst of 60 cases vs double: o %.2g dq %.2g dk %.2g dv %.2g lse %.2g", worst[0],
            worst[1], worst[2], worst[3], worst[4]);
}

/* RMSNorm's row lanes and column blocks against double for rows and columns that are and are not
 * multiples of 32: dx and y within 2e-6 relative to the largest |element|, dweight (a column sum
 * over up to 100 rows, then added to the old value) within 1e-5. (Not one column: there dx is
 * rstd (g - g xhat^2) with xhat^2 = 1 - O(eps), all cancellation, and no relative bound holds.) */
static void test_rmsnorm_sweep(void)
{
    static const size_t Rs[] = {1, 31, 33, 100}, Cs[] = {8, 33, 80, 128, 4096};
    double worst[3] = {0};

    for (size_t ri = 0; ri < 4; ri++)
        for (size_t ci = 0; ci < 5; ci++) {
            const size_t R = Rs[ri], C = Cs[ci];
            float *x = malloc(R * C * sizeof(float)), *dy = malloc(R * C * sizeof(float));
            float *y = malloc(R * C * sizeof(float)), *dx = malloc(R * C * sizeof(float));
            float *w = malloc(C * sizeof(float)), *dw = malloc(C * sizeof(float));
            float *rstd = malloc(R * sizeof(float));
            double *ry = malloc(R * C * sizeof(double)), *rdx = malloc(R * C * sizeof(double));
            double *rdw = malloc(C * sizeof(double)), e[3];
            fsdp_kernel_t k = {.kind = FSDP_K_RMSNORM_FWD};

            fill(x, R * C, -2, 2);
            fill(dy, R * C, -1, 1);
            fill(w, C, 0.5, 1.5);
            fill(dw, C, -0.5, 0.5);
            for (size_t c = 0; c < C; c++)
                rdw[c] = dw[c];
            for (size_t r = 0; r < R; r++) {
                double ss = 0.0, rs, dot = 0.0;
                for (size_t c = 0; c < C; c++)
                    ss += (double)x[r * C + c] * x[r * C + c];
                rs = 1.0 / sqrt(ss / (double)C + 1e-5);
                for (size_t c = 0; c < C; c++) {
                    ry[r * C + c] = x[r * C + c] * rs * w[c];
                    dot += (double)dy[r * C + c] * w[c] * x[r * C + c] * rs;
                    rdw[c] += (double)dy[r * C + c] * x[r * C + c] * rs;
                }
                for (size_t c = 0; c < C; c++)
                    rdx[r * C + c] =
                        rs * (dy[r * C + c] * w[c] - x[r * C + c] * rs * dot / (double)C);
            }
            k.u.rmsnorm_fwd.y = y;
            k.u.rmsnorm_fwd.rstd = rstd;
            k.u.rmsnorm_fwd.x = x;
            k.u.rmsnorm_fwd.weight = w;
            k.u.rmsnorm_fwd.rows = R;
            k.u.rmsnorm_fwd.cols = C;
            k.u.rmsnorm_fwd.eps = 1e-5f;
            CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&k), FSDP_OK);
            memset(&k, 0, sizeof(k));
            k.kind = FSDP_K_RMSNORM_BWD;
            k.u.rmsnorm_bwd.dx = dx;
            k.u.rmsnorm_bwd.dweight = dw;
            k.u.rmsnorm_bwd.dy = dy;
            k.u.rmsnorm_bwd.x = x;
            k.u.rmsnorm_bwd.rstd = rstd;
            k.u.rmsnorm_bwd.weight = w;
            k.u.rmsnorm_bwd.rows = R;
            k.u.rmsnorm_bwd.cols = C;
            CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&k), FSDP_OK);
            e[0] = rel_err(y, ry, R * C);
            e[1] = rel_err(dx, rdx, R * C);
            e[2] = rel_err(dw, rdw, C);
            for (int i = 0; i < 3; i++) {
                worst[i] = fmax(worst[i], e[i]);
                if (!(e[i] < (i == 2 ? 1e-5 : 2e-6)))
                    fprintf(stderr, "\n  rows %zu cols %zu: output %d off by %.3g", R, C, i, e[i]);
                CU_ASSERT(e[i] < (i == 2 ? 1e-5 : 2e-6));
            }
            free(x);
            free(dy);
            free(y);
            free(dx);
            free(w);
            free(dw);
            free(rstd);
            free(ry);
            free(rdx);
            free(rdw);
        }
    fprintf(stderr, "\n  worst of 20 shapes vs double: y %.2g dx %.2g dweight %.2g", worst[0],
            worst[1], worst[2]);
}

static void test_attention_refused(void)
{
    attn_case_t c = {1, 4, 4, 3, 8, 1}; /* 3 does not divide 4 */
    attn_bufs_t a;
    attn_alloc(&c, &a);
    CU_ASSERT_EQUAL(fused(&c, &a, 1.0f), FSDP_ERR_INVALID_PARAM);
    attn_free(&a);
}

/* The cost model: causal attention is about half the FLOPs of full attention, at 4 hd per pair
 * forward and 10 backward, and its bytes grow linearly in T (no [T, T] tensor). */
static void test_attention_cost(void)
{
    fsdp_kernel_t k = {.kind = FSDP_K_ATTENTION_FWD};
    double f_causal, f_full, b1, b2, fb;

    k.u.attention_fwd.batch = 2;
    k.u.attention_fwd.heads = 32;
    k.u.attention_fwd.kv_heads = 8;
    k.u.attention_fwd.head_dim = 128;
    k.u.attention_fwd.seq = 4096;
    k.u.attention_fwd.causal = 1;
    k.u.attention_fwd.dtype = FSDP_DTYPE_BF16;
    fsdp_kernel_cost(&k, &f_causal, &b1);
    k.u.attention_fwd.causal = 0;
    fsdp_kernel_cost(&k, &f_full, &b1);
    CU_ASSERT(fabs(f_full - 4.0 * 2 * 32 * 128 * 4096.0 * 4096.0) < 1.0);
    CU_ASSERT(fabs(f_causal / f_full - 0.5) < 1e-3);
    k.u.attention_fwd.seq = 8192;
    fsdp_kernel_cost(&k, &f_full, &b2);
    CU_ASSERT(fabs(b2 / b1 - 2.0) < 1e-12);
    k.kind = FSDP_K_ATTENTION_BWD; /* the same fields in the same places are not assumed */
    memset(&k.u, 0, sizeof(k.u));
    k.u.attention_bwd.batch = 2;
    k.u.attention_bwd.heads = 32;
    k.u.attention_bwd.kv_heads = 8;
    k.u.attention_bwd.head_dim = 128;
    k.u.attention_bwd.seq = 8192;
    k.u.attention_bwd.causal = 0;
    fsdp_kernel_cost(&k, &fb, &b2);
    CU_ASSERT(fabs(fb / f_full - 2.5) < 1e-9);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"lanes: the host's butterfly without empty lanes has the bits of the whole", test_lanes},
        {"rmsnorm forward and backward against double", test_rmsnorm},
        {"rotary embedding (rotate_half) against double; backward inverts it", test_rope},
        {"swiglu forward and backward against double", test_swiglu},
        {"fused attention against the unfused f32 kernels and double, fwd and bwd, MHA, GQA, MQA",
         test_attention},
        {"fused attention against double: head_dim 8 to 128, T 1 to 100, GQA 1, 2, 4",
         test_attention_sweep},
        {"rmsnorm against double: rows 1 to 100, columns 8 to 4096", test_rmsnorm_sweep},
        {"fused attention refuses kv_heads that do not divide heads", test_attention_refused},
        {"fused attention's cost: causal half of full, backward 2.5x, bytes linear in T",
         test_attention_cost},
        {NULL, NULL},
    };
    return fsdp_test_run("llama_kernels", tests);
}
