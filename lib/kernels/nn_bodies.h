/* Bodies of the transformer kernels of kernel.h (layernorm, gelu, softmax, embedding,
 * cross-entropy, add), shared by the sim's host loops (sim/kernels.c) and the gpu backend's
 * launches (gpu/kernels.cu).
 *
 * Each body is a pure function of the descriptor, and its reductions have the fixed shapes of
 * lanes.h: a row kernel is split into passes over a lane's elements l, l + 32, ... (a warp per
 * row on the GPU, the 32 lanes replayed in turn on the host by fsdp_kb_nn_row), its partials
 * meeting in lanes.h's butterfly; a sum over rows (layernorm_bwd's weight and bias gradients)
 * gives the terms of one (row, column) and the column-sum driver of kernel_elem.h sums them over
 * 32 row lanes; the embedding backward adds each gradient element's rows in row order, whether
 * by the host's loop over chunks of FSDP_KB_COLS columns or by the GPU's (column, token bucket)
 * threads. So the two backends give the same bits. exp and log are computed here from
 * +, -, *, / and exact conversions only (all correctly rounded in IEEE f32, and not contracted:
 * nvcc builds with --fmad=false), never from libm or CUDA's math library, whose last bits differ;
 * they are within 2 ulp of the exact values (tests/test_gpt2.c measures it). */
#ifndef FSDP_KERNELS_NN_BODIES_H
#define FSDP_KERNELS_NN_BODIES_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include <fsdp/kernel.h>

#include "kernels/convert.h"
#include "kernels/elementwise.h"
#include "kernels/hd.h"
#include "kernels/lanes.h"

/* Columns of one chunk of the host's embedding_bwd loop: row-major reads stay within a cache
 * line, and each column's order is the same whatever the chunk. */
#define FSDP_KB_COLS 16

FSDP_HD size_t fsdp_kb_col_chunks(size_t cols)
{
    return (cols + FSDP_KB_COLS - 1) / FSDP_KB_COLS;
}

FSDP_HD float fsdp_kb_nanf(void)
{
    return fsdp_kb_bits_f32(0x7fc00000u);
}

FSDP_HD float fsdp_kb_inff(void)
{
    return fsdp_kb_bits_f32(0x7f800000u);
}

/* ---- elementary functions ---- */

#define FSDP_KB_LN2_HI 0.693145751953125f        /* 15 significant bits: n * LN2_HI is exact */
#define FSDP_KB_LN2_LO 1.428606765330187045e-06f /* ln 2 - LN2_HI */

/* e^r for |r| <= ln(2)/2, by its Taylor series to r^7 (truncation below 0.1 ulp), evaluated
 * in Estrin's scheme: a chain of 3 multiply-adds instead of Horner's 7. */
FSDP_HD float fsdp_kb_exp_poly(float r)
{
    float r2 = r * r, r4 = r2 * r2;
    float p01 = 1.0f + r, p23 = 0.5f + r * 1.66666672e-1f;
    float p45 = 4.16666679e-2f + r * 8.33333377e-3f, p67 = 1.38888892e-3f + r * 1.98412701e-4f;
    return (p01 + r2 * p23) + r4 * (p45 + r2 * p67);
}

/* e^x: x = n ln 2 + r (Cody and Waite's split of ln 2), e^r by polynomial, times 2^n built
 * from its bits. Overflow is +inf, underflow 0 (through the subnormals), NaN stays NaN. */
FSDP_HD float fsdp_kb_expf(float x)
{
    float nf, r, p;
    int n;

    if (x != x)
        return x + x;
    if (x > 88.7228393f)
        return fsdp_kb_inff();
    if (x < -103.972084f)
        return 0.0f;
    /* n = x / ln 2 rounded half away from zero, by truncation (an exact conversion either
     * way; floorf is a library call on baseline x86-64) */
    n = (int)(x * 1.44269502f + (x < 0.0f ? -0.5f : 0.5f));
    nf = (float)n;
    r = (x - nf * FSDP_KB_LN2_HI) - nf * FSDP_KB_LN2_LO;
    p = fsdp_kb_exp_poly(r);
    if (n > 127) { /* only 128: 2^128 is not a float */
        p *= 2.0f;
        n -= 1;
    }
    if (n < -126) {           /* a subnormal result: scale in two exact steps, round once */
        p *= 5.42101086e-20f; /* 2^-64 */
        n += 64;
    }
    return p * fsdp_kb_bits_f32((uint32_t)(n + 127) << 23);
}

/* ln x: x = m 2^e with m in [sqrt(1/2), sqrt(2)), f = m - 1 (exact), ln m = 2 atanh(s) with
 * s = f / (2 + f), arranged as f - (f^2/2 - s (f^2/2 + R)), R = 2 s^2/3 + 2 s^4/5 + ... + 2 s^8/9,
 * so that the exact f carries the result and the rounding falls on a small correction (the
 * arrangement of fdlibm's log). x < 0 and NaN give NaN, 0 gives -inf, +inf stays. */
FSDP_HD float fsdp_kb_logf(float x)
{
    uint32_t u = fsdp_kb_f32_bits(x);
    float m, f, s, s2, hfsq, r, ef;
    int e = 0;

    if (x != x)
        return x + x;
    if (x < 0.0f)
        return fsdp_kb_nanf();
    if (x == 0.0f)
        return -fsdp_kb_inff();
    if (u >= 0x7f800000u)
        return x;
    if (u < 0x00800000u) { /* subnormal: normalize exactly */
        x *= 8388608.0f;   /* 2^23 */
        u = fsdp_kb_f32_bits(x);
        e = -23;
    }
    e += (int)(u >> 23) - 127;
    m = fsdp_kb_bits_f32((u & 0x007fffffu) | 0x3f800000u); /* [1, 2) */
    if (m > 1.41421354f) {
        m *= 0.5f;
        e += 1;
    }
    f = m - 1.0f;
    s = f / (2.0f + f);
    s2 = s * s;
    r = s2 * (6.66666687e-1f + s2 * (4.00000006e-1f + s2 * (2.85714298e-1f + s2 * 2.22222224e-1f)));
    hfsq = 0.5f * f * f;
    ef = (float)e;
    return ef * FSDP_KB_LN2_HI - ((hfsq - (s * (hfsq + r) + ef * FSDP_KB_LN2_LO)) - f);
}

/* ---- GELU, tanh approximation (HF's gelu_new, torch's gelu(approximate="tanh")) ----
 *
 * 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3) is x sigmoid(2u) exactly
 * (1 + tanh(u) = 2 / (1 + e^-2u)): one exp and one division, and no cancellation where tanh(u)
 * nears -1. The derivative is s + 2 x s (1 - s) du/dx with s = sigmoid(2u). */

#define FSDP_KB_GELU_K 0.797884583f /* sqrt(2 / pi) */
#define FSDP_KB_GELU_A 0.044715f

FSDP_HD float fsdp_kb_gelu(float x)
{
    float u = FSDP_KB_GELU_K * (x + FSDP_KB_GELU_A * (x * x) * x);
    return x / (1.0f + fsdp_kb_expf(-2.0f * u));
}

/* dy * d gelu(x) / dx, with u and the sigmoid as the forward computes them. */
FSDP_HD float fsdp_kb_gelu_grad(float dy, float x)
{
    float x2 = x * x;
    float u = FSDP_KB_GELU_K * (x + FSDP_KB_GELU_A * x2 * x);
    float s = 1.0f / (1.0f + fsdp_kb_expf(-2.0f * u));
    float t = s * (1.0f - s); /* 0 far out, where du may overflow */
    float du = FSDP_KB_GELU_K * (1.0f + 3.0f * FSDP_KB_GELU_A * x2);
    return dy * (t == 0.0f ? s : s + 2.0f * x * t * du);
}

/* ---- element bodies (called from fsdp_kb_elem) ----
 *
 * Every tensor of a descriptor but mean, rstd and the losses has the descriptor's dtype: the
 * bodies load through it (fsdp_kb_load), compute in f32 and round once on store. With f32 the
 * loads and stores are plain, and the arithmetic is that of the f32 kernels. */

/* v rounded to dtype and back: the value a separate operation would hand on */
FSDP_HD float fsdp_kb_round_to(float v, fsdp_dtype_t dt)
{
    return dt == FSDP_DTYPE_BF16  ? fsdp_kb_round_bf16(v)
           : dt == FSDP_DTYPE_F16 ? fsdp_kb_round_f16(v)
                                  : v;
}

/* embedding_fwd, element i of y [rows, cols]: the sum of the two rows, rounded once */
FSDP_HD void fsdp_kb_embedding_fwd_at(const fsdp_kernel_t *k, size_t i)
{
    const fsdp_dtype_t dt = k->u.embedding_fwd.dtype;
    size_t cols = k->u.embedding_fwd.cols, r = i / cols, c = i - r * cols;
    int32_t t = k->u.embedding_fwd.tokens[r];
    float v;

    if (t < 0 || (size_t)t >= k->u.embedding_fwd.vocab) {
        v = k->u.embedding_fwd.zero_outside ? 0.0f : fsdp_kb_nanf();
    } else {
        v = fsdp_kb_load(k->u.embedding_fwd.wte, dt, (size_t)t * cols + c);
        if (k->u.embedding_fwd.wpe != NULL)
            v = v +
                fsdp_kb_load(k->u.embedding_fwd.wpe, dt, (r % k->u.embedding_fwd.seq) * cols + c);
    }
    fsdp_kb_store(k->u.embedding_fwd.y, dt, i, v);
}

/* ---- row bodies ----
 *
 * A row kernel runs in passes over its row (lanes.h's row shape): in pass p < the kind's
 * reductions (FSDP_KB_ROW_REDUCTIONS), lane l of FSDP_KB_LANES adds elements l, l + 32, ... in
 * order into its partial sum (or maximum); the lanes' partials meet in the butterfly, and the
 * result, turned into the row's scalar by fsdp_kb_nn_row_reduced (a mean, say), is st[p] for the
 * passes after it. The last pass stores the elements (lane 0 the row's scalars). st may also
 * carry what a pass keeps for a later one (cross_entropy's target logit).
 *
 * A pass takes the elements c = l, l + step, ...: a warp's thread on the GPU has l = its lane
 * and step = FSDP_KB_LANES, and one partial, acc[0]; the host (fsdp_kb_nn_row) has l = 0 and
 * step = 1, every element in order, each into its lane's partial acc[c % FSDP_KB_LANES]. Each
 * lane's elements come in the same order either way, so the bits are the same, and the host's
 * loop runs over the row once. */
#define FSDP_KB_ROW_STATE 3

/* The partial of acc that element c goes into (see above; 0 on the GPU, a constant there). */
#define FSDP_KB_LANE_SLOT(c, step) ((step) == 1 ? (c) % FSDP_KB_LANES : 0)

/* layernorm_fwd, row r: pass 0 sums x, pass 1 the squared deviations from the mean st[0],
 * pass 2 stores y (and mean, rstd) with the rstd st[1]. */
FSDP_HD void fsdp_kb_layernorm_fwd_pass(const fsdp_kernel_t *k, size_t r, unsigned l, unsigned step,
                                        int pass, const float *st, float *acc)
{
    const fsdp_dtype_t dt = k->u.layernorm_fwd.dtype;
    const size_t n = k->u.layernorm_fwd.cols, o = r * n;
    const void *x = k->u.layernorm_fwd.x;
    const void *w = k->u.layernorm_fwd.weight, *b = k->u.layernorm_fwd.bias;
    const float mean = st[0], rstd = st[1];

    if (pass == 0) {
        for (size_t c = l; c < n; c += step)
            acc[FSDP_KB_LANE_SLOT(c, step)] += fsdp_kb_load(x, dt, o + c);
        return;
    }
    if (pass == 1) {
        for (size_t c = l; c < n; c += step) {
            float d = fsdp_kb_load(x, dt, o + c) - mean;
            acc[FSDP_KB_LANE_SLOT(c, step)] += d * d;
        }
        return;
    }
    for (size_t c = l; c < n; c += step)
        fsdp_kb_store(k->u.layernorm_fwd.y, dt, o + c,
                      (fsdp_kb_load(x, dt, o + c) - mean) * rstd * fsdp_kb_load(w, dt, c) +
                          fsdp_kb_load(b, dt, c));
    if (l == 0 && k->u.layernorm_fwd.mean != NULL)
        k->u.layernorm_fwd.mean[r] = mean;
    if (l == 0 && k->u.layernorm_fwd.rstd != NULL)
        k->u.layernorm_fwd.rstd[r] = rstd;
}

/* layernorm_bwd, the input gradient of row r: with g = dy * weight, pass 0 sums g, pass 1
 * g * xhat, pass 2 stores dx with their means st[0] and st[1]. */
FSDP_HD void fsdp_kb_layernorm_bwd_pass(const fsdp_kernel_t *k, size_t r, unsigned l, unsigned step,
                                        int pass, const float *st, float *acc)
{
    const fsdp_dtype_t dt = k->u.layernorm_bwd.dtype;
    const size_t n = k->u.layernorm_bwd.cols, o = r * n;
    const void *x = k->u.layernorm_bwd.x, *dy = k->u.layernorm_bwd.dy;
    const void *w = k->u.layernorm_bwd.weight;
    const float mean = k->u.layernorm_bwd.mean[r], rstd = k->u.layernorm_bwd.rstd[r];
    const float sg = st[0], sgx = st[1];
    void *dx = k->u.layernorm_bwd.dx;

    if (pass < 2) {
        for (size_t c = l; c < n; c += step) {
            float g = fsdp_kb_load(dy, dt, o + c) * fsdp_kb_load(w, dt, c);
            acc[FSDP_KB_LANE_SLOT(c, step)] +=
                pass == 0 ? g : g * ((fsdp_kb_load(x, dt, o + c) - mean) * rstd);
        }
        return;
    }
    for (size_t c = l; c < n; c += step) {
        float xhat = (fsdp_kb_load(x, dt, o + c) - mean) * rstd;
        float d = (fsdp_kb_load(dy, dt, o + c) * fsdp_kb_load(w, dt, c) - sg - xhat * sgx) * rstd;
        if (k->u.layernorm_bwd.accumulate)
            d = fsdp_kb_load(dx, dt, o + c) + fsdp_kb_round_to(d, dt);
        fsdp_kb_store(dx, dt, o + c, d);
    }
}

/* layernorm_bwd's weight and bias gradients, summed over the rows in the column shape of
 * lanes.h (fsdp_kb_colsum_*, kernel_elem.h). The terms of row r, column c: t[0] for dweight,
 * t[1] for dbias. */
FSDP_HD void fsdp_kb_layernorm_bwd_col_terms(const fsdp_kernel_t *k, size_t r, size_t c, float *t)
{
    const fsdp_dtype_t dt = k->u.layernorm_bwd.dtype;
    const size_t i = r * k->u.layernorm_bwd.cols + c;
    const float g = fsdp_kb_load(k->u.layernorm_bwd.dy, dt, i);
    t[0] = g * ((fsdp_kb_load(k->u.layernorm_bwd.x, dt, i) - k->u.layernorm_bwd.mean[r]) *
                k->u.layernorm_bwd.rstd[r]);
    t[1] = g;
}

/* Column c's sums s[0] (dweight) and s[1] (dbias): each rounded, then added (autograd's
 * accumulate). */
FSDP_HD void fsdp_kb_layernorm_bwd_col_store(const fsdp_kernel_t *k, size_t c, const float *s)
{
    const fsdp_dtype_t dt = k->u.layernorm_bwd.dtype;
    void *dw = k->u.layernorm_bwd.dweight, *db = k->u.layernorm_bwd.dbias;
    if (dw != NULL)
        fsdp_kb_store(dw, dt, c, fsdp_kb_load(dw, dt, c) + fsdp_kb_round_to(s[0], dt));
    if (db != NULL)
        fsdp_kb_store(db, dt, c, fsdp_kb_load(db, dt, c) + fsdp_kb_round_to(s[1], dt));
}

/* The scaled score of x (kernel.h): x * scale, or with by_div x / div, div being the
 * descriptor's divisor rounded to the dtype; rounded to the dtype as the scaling op's output. */
FSDP_HD float fsdp_kb_softmax_scaled(float x, float scale, int by_div, float div, fsdp_dtype_t dt)
{
    return fsdp_kb_round_to(by_div ? x / div : x * scale, dt);
}

/* softmax_fwd, row r: pass 0 the maximum of the scaled scores, pass 1 the sum of their
 * exponentials (st[0] subtracted), pass 2 the stores (divided by st[1]; 0 past a causal row's
 * end). In f32 y keeps each exponential until the division (y may be x: each element is read,
 * then written, by the same lane); in a 16-bit dtype they are computed again for the output
 * instead, so that no unnormalized value is rounded. The same function of the same argument,
 * so the same bits either way. The scaled scores are rounded to the dtype before the softmax
 * reads them: the scaling is its own torch op (HF's eager attention divides the scores, then
 * calls softmax), which rounds its output. */
FSDP_HD void fsdp_kb_softmax_fwd_pass(const fsdp_kernel_t *k, size_t r, unsigned l, unsigned step,
                                      int pass, const float *st, float *acc)
{
    const fsdp_dtype_t dt = k->u.softmax_fwd.dtype;
    const size_t n = k->u.softmax_fwd.cols, o = r * n;
    const size_t valid = k->u.softmax_fwd.causal ? r % n + 1 : n;
    const void *x = k->u.softmax_fwd.x;
    const float s = k->u.softmax_fwd.scale;
    const int by_div = k->u.softmax_fwd.divisor != 0.0f;
    const float dv = fsdp_kb_round_to(k->u.softmax_fwd.divisor, dt);
    void *y = k->u.softmax_fwd.y;

    if (pass == 0) {
        for (size_t j = l; j < valid; j += step) {
            float z = fsdp_kb_softmax_scaled(fsdp_kb_load(x, dt, o + j), s, by_div, dv, dt);
            float *m = &acc[FSDP_KB_LANE_SLOT(j, step)];
            if (z > *m)
                *m = z;
        }
        return;
    }
    if (pass == 1) {
        for (size_t j = l; j < valid; j += step) {
            float e = fsdp_kb_expf(
                fsdp_kb_softmax_scaled(fsdp_kb_load(x, dt, o + j), s, by_div, dv, dt) - st[0]);
            acc[FSDP_KB_LANE_SLOT(j, step)] += e;
            if (dt == FSDP_DTYPE_F32)
                ((float *)y)[o + j] = e;
        }
        return;
    }
    for (size_t j = l; j < n; j += step) {
        float e = j >= valid ? 0.0f
                  : dt == FSDP_DTYPE_F32
                      ? ((const float *)y)[o + j]
                      : fsdp_kb_expf(
                            fsdp_kb_softmax_scaled(fsdp_kb_load(x, dt, o + j), s, by_div, dv, dt) -
                            st[0]);
        fsdp_kb_store(y, dt, o + j, j >= valid ? 0.0f : e / st[1]);
    }
}

/* softmax_bwd, row r: pass 0 the dot product of y and dy, pass 1 the stores. */
FSDP_HD void fsdp_kb_softmax_bwd_pass(const fsdp_kernel_t *k, size_t r, unsigned l, unsigned step,
                                      int pass, const float *st, float *acc)
{
    const fsdp_dtype_t dt = k->u.softmax_bwd.dtype;
    const size_t n = k->u.softmax_bwd.cols, o = r * n;
    const size_t valid = k->u.softmax_bwd.causal ? r % n + 1 : n;
    const void *y = k->u.softmax_bwd.y, *dy = k->u.softmax_bwd.dy;
    const float s = k->u.softmax_bwd.scale;
    const int by_div = k->u.softmax_bwd.divisor != 0.0f;
    const float dv = fsdp_kb_round_to(k->u.softmax_bwd.divisor, dt);
    void *dx = k->u.softmax_bwd.dx;

    if (pass == 0) {
        for (size_t j = l; j < valid; j += step)
            acc[FSDP_KB_LANE_SLOT(j, step)] +=
                fsdp_kb_load(y, dt, o + j) * fsdp_kb_load(dy, dt, o + j);
        return;
    }
    for (size_t j = l; j < n; j += step) { /* softmax's gradient is rounded, then scaled */
        float g = j >= valid
                      ? 0.0f
                      : fsdp_kb_round_to(
                            fsdp_kb_load(y, dt, o + j) * (fsdp_kb_load(dy, dt, o + j) - st[0]), dt);
        fsdp_kb_store(dx, dt, o + j, j >= valid ? 0.0f : by_div ? g / dv : s * g);
    }
}

/* cross_entropy, row r (inv_denom = 1 / denom): pass 0 the maximum logit (and st[2], the
 * target's logit, read before dlogits, which may be the logits, is written), pass 1 the sum of
 * the exponentials, pass 2 losses[r] and, when asked, dlogits[r]. As in softmax_fwd, f32
 * dlogits keep the exponentials until the division; in a 16-bit dtype they are computed again
 * for the gradient. */
/* cross_entropy's stages 1 to 3: target t's column in this rank's shard of the vocabulary; the
 * shard's width when another rank holds it or it is ignored */
FSDP_HD size_t fsdp_kb_cross_entropy_vp_col(const fsdp_kernel_t *k, int32_t t)
{
    const size_t v = k->u.cross_entropy.vocab, v0 = k->u.cross_entropy.vocab_start;
    return t >= 0 && (size_t)t >= v0 && (size_t)t - v0 < v ? (size_t)t - v0 : v;
}

/* cross_entropy's stages 1 to 3 (kernel.h), row r: the vocabulary-parallel loss. The stats of
 * the other stages come reduced in stats; the passes that would recompute them do nothing. */
FSDP_HD void fsdp_kb_cross_entropy_vp_pass(const fsdp_kernel_t *k, float inv_denom, size_t r,
                                           unsigned l, unsigned step, int pass, float *st,
                                           float *acc)
{
    const fsdp_dtype_t dt = k->u.cross_entropy.dtype;
    const size_t v = k->u.cross_entropy.vocab, o = r * v, rows = k->u.cross_entropy.rows;
    const int stage = k->u.cross_entropy.stage;
    const void *lg = k->u.cross_entropy.logits;
    void *d = k->u.cross_entropy.dlogits;
    float *stats = k->u.cross_entropy.stats;
    const int32_t t = k->u.cross_entropy.targets[r];
    const size_t tc = fsdp_kb_cross_entropy_vp_col(k, t);
    const float gmax = stage > 1 ? stats[r] : 0.0f;

    if (stage == 1 && pass == 0) {
        st[2] = tc < v ? fsdp_kb_load(lg, dt, o + tc) : 0.0f;
        for (size_t j = l; j < v; j += step) {
            float lj = fsdp_kb_load(lg, dt, o + j);
            float *m = &acc[FSDP_KB_LANE_SLOT(j, step)];
            if (lj > *m)
                *m = lj;
        }
    } else if (stage == 2 && pass == 1) {
        for (size_t j = l; j < v; j += step)
            acc[FSDP_KB_LANE_SLOT(j, step)] += fsdp_kb_expf(fsdp_kb_load(lg, dt, o + j) - gmax);
    } else if (pass == 2 && stage == 1) {
        if (l == 0) {
            stats[r] = st[0];
            stats[2 * rows + r] = st[2];
        }
    } else if (pass == 2 && stage == 2) {
        if (l == 0)
            stats[rows + r] = st[1];
    } else if (pass == 2 && stage == 3) {
        const float sum = stats[rows + r];
        if (l == 0)
            k->u.cross_entropy.losses[r] =
                t < 0 ? 0.0f : (gmax + fsdp_kb_logf(sum)) - stats[2 * rows + r];
        for (size_t j = l; d != NULL && j < v; j += step) {
            float p = fsdp_kb_expf(fsdp_kb_load(lg, dt, o + j) - gmax) / sum;
            fsdp_kb_store(d, dt, o + j, t < 0 ? 0.0f : (j == tc ? p - 1.0f : p) * inv_denom);
        }
    }
}

FSDP_HD void fsdp_kb_cross_entropy_pass(const fsdp_kernel_t *k, float inv_denom, size_t r,
                                        unsigned l, unsigned step, int pass, float *st, float *acc)
{
    const fsdp_dtype_t dt = k->u.cross_entropy.dtype;
    const size_t v = k->u.cross_entropy.vocab, o = r * v;
    const void *lg = k->u.cross_entropy.logits;
    void *d = k->u.cross_entropy.dlogits;
    const int32_t t = k->u.cross_entropy.targets[r];

    if (k->u.cross_entropy.stage != 0) {
        fsdp_kb_cross_entropy_vp_pass(k, inv_denom, r, l, step, pass, st, acc);
        return;
    }
    if (t < 0 || (size_t)t >= v) { /* ignored (0), or no such class (NaN): read nothing */
        const float fill = t < 0 ? 0.0f : fsdp_kb_nanf();
        if (pass < 2)
            return;
        if (l == 0)
            k->u.cross_entropy.losses[r] = fill;
        for (size_t j = l; d != NULL && j < v; j += step)
            fsdp_kb_store(d, dt, o + j, fill);
        return;
    }
    if (pass == 0) {
        st[2] = fsdp_kb_load(lg, dt, o + (size_t)t);
        for (size_t j = l; j < v; j += step) {
            float lj = fsdp_kb_load(lg, dt, o + j);
            float *m = &acc[FSDP_KB_LANE_SLOT(j, step)];
            if (lj > *m)
                *m = lj;
        }
        return;
    }
    if (pass == 1) {
        for (size_t j = l; j < v; j += step) {
            float e = fsdp_kb_expf(fsdp_kb_load(lg, dt, o + j) - st[0]);
            acc[FSDP_KB_LANE_SLOT(j, step)] += e;
            if (d != NULL && dt == FSDP_DTYPE_F32)
                ((float *)d)[o + j] = e;
        }
        return;
    }
    if (l == 0)
        k->u.cross_entropy.losses[r] = (st[0] + fsdp_kb_logf(st[1])) - st[2];
    for (size_t j = l; d != NULL && j < v; j += step) {
        float e = dt == FSDP_DTYPE_F32 ? ((const float *)d)[o + j]
                                       : fsdp_kb_expf(fsdp_kb_load(lg, dt, o + j) - st[0]);
        float p = e / st[1];
        fsdp_kb_store(d, dt, o + j, ((size_t)t == j ? p - 1.0f : p) * inv_denom);
    }
}

/* cross_entropy, the loss term of row i for the sum of fsdp_kb_reduce_sum */
FSDP_HD double fsdp_kb_cross_entropy_term(const fsdp_kernel_t *k, size_t i)
{
    return (double)k->u.cross_entropy.losses[i];
}

/* embedding_bwd in a 16-bit dtype, columns [c0, c0 + nc): each token's rows (and each
 * position's) summed in f32 in row order and rounded once, then added to the gradient and
 * rounded, as torch's embedding backward and autograd's accumulation do. A row whose token came
 * earlier was summed with that earlier row. */
FSDP_HD void fsdp_kb_embedding_bwd_cols16(const fsdp_kernel_t *k, size_t c0, size_t nc)
{
    const fsdp_dtype_t dt = k->u.embedding_bwd.dtype;
    const size_t n = k->u.embedding_bwd.cols, rows = k->u.embedding_bwd.rows;
    const size_t seq = k->u.embedding_bwd.seq;
    const int32_t *tok = k->u.embedding_bwd.tokens;
    const void *dy = k->u.embedding_bwd.dy;
    void *dwte = k->u.embedding_bwd.dwte, *dwpe = k->u.embedding_bwd.dwpe;
    float s[FSDP_KB_COLS];

    for (size_t r = 0; dwte != NULL && r < rows; r++) {
        const int32_t t = tok[r];
        size_t q = 0;
        if (t < 0 || (size_t)t >= k->u.embedding_bwd.vocab)
            continue;
        while (q < r && tok[q] != t)
            q++;
        if (q < r)
            continue; /* summed with row q */
        for (size_t j = 0; j < nc; j++)
            s[j] = 0.0f;
        for (q = r; q < rows; q++)
            for (size_t j = 0; tok[q] == t && j < nc; j++)
                s[j] += fsdp_kb_load(dy, dt, q * n + c0 + j);
        for (size_t j = 0; j < nc; j++) {
            const size_t w = (size_t)t * n + c0 + j;
            fsdp_kb_store(dwte, dt, w, fsdp_kb_load(dwte, dt, w) + fsdp_kb_round_to(s[j], dt));
        }
    }
    for (size_t p = 0; dwpe != NULL && p < seq && p < rows; p++) {
        for (size_t j = 0; j < nc; j++)
            s[j] = 0.0f;
        for (size_t q = p; q < rows; q += seq)
            for (size_t j = 0; j < nc; j++)
                s[j] += fsdp_kb_load(dy, dt, q * n + c0 + j);
        for (size_t j = 0; j < nc; j++) {
            const size_t w = p * n + c0 + j;
            fsdp_kb_store(dwpe, dt, w, fsdp_kb_load(dwpe, dt, w) + fsdp_kb_round_to(s[j], dt));
        }
    }
}

/* embedding_bwd on the host, columns [chunk * FSDP_KB_COLS, ...) of every row, in row order. In
 * f32 each row adds onto the gradient in turn (f32 sums either way). */
FSDP_HD void fsdp_kb_embedding_bwd_cols(const fsdp_kernel_t *k, size_t chunk)
{
    const fsdp_dtype_t dt = k->u.embedding_bwd.dtype;
    const size_t n = k->u.embedding_bwd.cols, c0 = chunk * FSDP_KB_COLS;
    const size_t nc = n - c0 < FSDP_KB_COLS ? n - c0 : FSDP_KB_COLS;
    void *dwte = k->u.embedding_bwd.dwte, *dwpe = k->u.embedding_bwd.dwpe;

    if (dt != FSDP_DTYPE_F32) {
        fsdp_kb_embedding_bwd_cols16(k, c0, nc);
        return;
    }
    for (size_t r = 0; r < k->u.embedding_bwd.rows; r++) {
        const size_t g = r * n + c0;
        int32_t t = k->u.embedding_bwd.tokens[r];
        if (dwte != NULL && t >= 0 && (size_t)t < k->u.embedding_bwd.vocab) {
            const size_t w = (size_t)t * n + c0;
            for (size_t j = 0; j < nc; j++)
                fsdp_kb_store(dwte, dt, w + j,
                              fsdp_kb_load(dwte, dt, w + j) +
                                  fsdp_kb_load(k->u.embedding_bwd.dy, dt, g + j));
        }
        if (dwpe != NULL) {
            const size_t p = (r % k->u.embedding_bwd.seq) * n + c0;
            for (size_t j = 0; j < nc; j++)
                fsdp_kb_store(dwpe, dt, p + j,
                              fsdp_kb_load(dwpe, dt, p + j) +
                                  fsdp_kb_load(k->u.embedding_bwd.dy, dt, g + j));
        }
    }
}

/* ---- embedding_bwd on the GPU ----
 *
 * A thread per (column c, token bucket b) for dwte: it scans every row in order and adds those
 * whose token t has t % FSDP_KB_EMB_BUCKETS == b; and a thread per (column c, position p) for
 * dwpe, over rows p, p + seq, ... in order. Each destination element takes its rows in row order,
 * as in the host loops above (fsdp_kb_embedding_bwd_cols), so the bits are theirs; consecutive
 * threads take consecutive columns (coalesced). */
#define FSDP_KB_EMB_BUCKETS 32

/* Positions of dwpe that rows reach (0 without dwpe). */
FSDP_HD size_t fsdp_kb_embedding_bwd_positions(const fsdp_kernel_t *k)
{
    const size_t seq = k->u.embedding_bwd.seq, rows = k->u.embedding_bwd.rows;
    return k->u.embedding_bwd.dwpe == NULL ? 0 : seq < rows ? seq : rows;
}

/* Threads of fsdp_kb_embedding_bwd_at. */
FSDP_HD size_t fsdp_kb_embedding_bwd_threads(const fsdp_kernel_t *k)
{
    const size_t n = k->u.embedding_bwd.cols;
    return (k->u.embedding_bwd.dwte != NULL ? n * FSDP_KB_EMB_BUCKETS : 0) +
           n * fsdp_kb_embedding_bwd_positions(k);
}

/* dwte, column c, the tokens of bucket b. In f32 each row adds onto the gradient in turn; in a
 * 16-bit dtype each token's rows are summed in f32 (in row order), rounded, then added: the
 * tokens of the bucket are taken one by one in increasing order, a scan of the rows each, which
 * follows the smallest token above the last one done, restarting its sum where a smaller one
 * first appears. */
FSDP_HD void fsdp_kb_embedding_bwd_bucket(const fsdp_kernel_t *k, size_t c, size_t b)
{
    const fsdp_dtype_t dt = k->u.embedding_bwd.dtype;
    const size_t n = k->u.embedding_bwd.cols, rows = k->u.embedding_bwd.rows;
    const size_t vocab = k->u.embedding_bwd.vocab;
    const int32_t *tok = k->u.embedding_bwd.tokens;
    const void *dy = k->u.embedding_bwd.dy;
    void *dwte = k->u.embedding_bwd.dwte;

    if (dt == FSDP_DTYPE_F32) {
        for (size_t r = 0; r < rows; r++) {
            const int32_t t = tok[r];
            if (t >= 0 && (size_t)t < vocab && (size_t)t % FSDP_KB_EMB_BUCKETS == b) {
                const size_t w = (size_t)t * n + c;
                fsdp_kb_store(dwte, dt, w,
                              fsdp_kb_load(dwte, dt, w) + fsdp_kb_load(dy, dt, r * n + c));
            }
        }
        return;
    }
    for (size_t lo = 0;;) { /* tokens below lo are done */
        size_t cur = vocab, w;
        float s = 0.0f;
        for (size_t r = 0; r < rows; r++) {
            const int32_t t = tok[r];
            if (t < 0 || (size_t)t < lo || (size_t)t > cur || (size_t)t >= vocab ||
                (size_t)t % FSDP_KB_EMB_BUCKETS != b)
                continue;
            if ((size_t)t < cur) {
                cur = (size_t)t;
                s = 0.0f;
            }
            s += fsdp_kb_load(dy, dt, r * n + c);
        }
        if (cur == vocab)
            return;
        w = cur * n + c;
        fsdp_kb_store(dwte, dt, w, fsdp_kb_load(dwte, dt, w) + fsdp_kb_round_to(s, dt));
        lo = cur + 1;
    }
}

/* dwpe, column c, position p: rows p, p + seq, ... (in a 16-bit dtype summed, rounded, added) */
FSDP_HD void fsdp_kb_embedding_bwd_pos(const fsdp_kernel_t *k, size_t c, size_t p)
{
    const fsdp_dtype_t dt = k->u.embedding_bwd.dtype;
    const size_t n = k->u.embedding_bwd.cols, rows = k->u.embedding_bwd.rows;
    const size_t seq = k->u.embedding_bwd.seq, w = p * n + c;
    const void *dy = k->u.embedding_bwd.dy;
    void *dwpe = k->u.embedding_bwd.dwpe;
    float s = 0.0f;

    for (size_t q = p; q < rows; q += seq) {
        if (dt == FSDP_DTYPE_F32)
            fsdp_kb_store(dwpe, dt, w, fsdp_kb_load(dwpe, dt, w) + fsdp_kb_load(dy, dt, q * n + c));
        else
            s += fsdp_kb_load(dy, dt, q * n + c);
    }
    if (dt != FSDP_DTYPE_F32)
        fsdp_kb_store(dwpe, dt, w, fsdp_kb_load(dwpe, dt, w) + fsdp_kb_round_to(s, dt));
}

/* Thread i < fsdp_kb_embedding_bwd_threads(k): the buckets of dwte first, then dwpe's
 * positions, the column fastest. */
FSDP_HD void fsdp_kb_embedding_bwd_at(const fsdp_kernel_t *k, size_t i)
{
    const size_t n = k->u.embedding_bwd.cols;
    const size_t nt = k->u.embedding_bwd.dwte != NULL ? n * FSDP_KB_EMB_BUCKETS : 0;
    if (i < nt) {
        fsdp_kb_embedding_bwd_bucket(k, i % n, i / n);
    } else {
        i -= nt;
        fsdp_kb_embedding_bwd_pos(k, i % n, i / n);
    }
}

#endif
