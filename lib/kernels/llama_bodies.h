/* Bodies of the Llama kernels of kernel.h (rmsnorm, rope, swiglu, fused attention), shared by the
 * sim's host loops (sim/kernels_llama.c) and the gpu backend's launches (gpu/kernels_llama.cu).
 *
 * A kernel runs as one or more passes, each a range of independent indices run in one shape
 * (fsdp_kb_llama_shape): an element (rope, swiglu: a thread on the GPU), a row reduced over the
 * 32 lanes of lanes.h (rmsnorm's rows, attention's query and key rows: a warp), or a block of 32
 * columns summed over 32 row lanes (rmsnorm's weight gradient: a 32 x 32 block).
 * fsdp_kb_llama_passes, fsdp_kb_llama_count, fsdp_kb_llama_at, fsdp_kb_llama_row and
 * fsdp_kb_llama_cols say which. A row or column body is written once for every lane
 * (FSDP_KB_HERE, FSDP_KB_STEP): the host runs all the lanes of an index in the body's own loops
 * and meets them in the butterfly in order (fsdp_kb_llama_host_pass), the GPU runs a lane per
 * thread and meets them with shuffles or shared memory; the passes run in order, and on the GPU
 * a pass after the previous one on the same stream. A body is a pure function of the
 * descriptor, f32 sums in a fixed order, with the exp and log of nn_bodies.h: both backends give
 * the same bits (nvcc builds with --fmad=false).
 *
 * The attention bodies are FlashAttention's algorithm one query row (forward, dq) or one key row
 * (dk, dv) per index, a warp over head_dim: an online softmax over the keys in order, no
 * [seq, seq] buffer. They are not tiled into shared memory (a key row is read once per query
 * row), which a faster kernel would be. */
#ifndef FSDP_KERNELS_LLAMA_BODIES_H
#define FSDP_KERNELS_LLAMA_BODIES_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include <fsdp/kernel.h>

#include "kernels/convert.h"
#include "kernels/hd.h"
#include "kernels/kinds.h"
#include "kernels/lanes.h"
#include "kernels/nn_bodies.h"

/* The largest head_dim of the attention kernels: a row's accumulators are local arrays. */
#define FSDP_KB_ATTN_MAX_HD 256

/* ---- RMSNorm: a row per index in the row shape of lanes.h (lane l takes columns l, l + 32, ...;
 * the caller walks the row from lane0 by FSDP_KB_STEP), the weight gradient in column blocks ---- */

FSDP_HD void fsdp_kb_rmsnorm_fwd_row(const fsdp_kernel_t *k, size_t r, unsigned lane0)
{
    const fsdp_dtype_t dt = k->u.rmsnorm_fwd.dtype;
    const size_t n = k->u.rmsnorm_fwd.cols, o = r * n;
    const void *x = k->u.rmsnorm_fwd.x, *w = k->u.rmsnorm_fwd.weight;
    float part[FSDP_KB_HERE], rstd;

    for (unsigned i = 0; i < FSDP_KB_HERE; i++)
        part[i] = 0.0f;
    for (size_t c = lane0; c < n; c += FSDP_KB_STEP) {
        float v = fsdp_kb_load(x, dt, o + c);
        part[FSDP_KB_SLOT(c)] += v * v;
    }
    rstd = 1.0f / sqrtf(fsdp_kb_lanes_sum_n(part, n) / (float)n + k->u.rmsnorm_fwd.eps);
    /* y may be x: a lane reads and writes only its own columns, after the sum */
    for (size_t c = lane0; c < n; c += FSDP_KB_STEP)
        fsdp_kb_store(k->u.rmsnorm_fwd.y, dt, o + c,
                      fsdp_kb_round_to(fsdp_kb_load(x, dt, o + c) * rstd, dt) *
                          fsdp_kb_load(w, dt, c));
    if (k->u.rmsnorm_fwd.rstd != NULL && lane0 == 0)
        k->u.rmsnorm_fwd.rstd[r] = rstd;
}

/* rmsnorm_bwd, the input gradient of row r */
FSDP_HD void fsdp_kb_rmsnorm_bwd_row(const fsdp_kernel_t *k, size_t r, unsigned lane0)
{
    const fsdp_dtype_t dt = k->u.rmsnorm_bwd.dtype;
    const size_t n = k->u.rmsnorm_bwd.cols, o = r * n;
    const void *x = k->u.rmsnorm_bwd.x, *dy = k->u.rmsnorm_bwd.dy, *w = k->u.rmsnorm_bwd.weight;
    const float rstd = k->u.rmsnorm_bwd.rstd[r];
    void *dx = k->u.rmsnorm_bwd.dx;
    float part[FSDP_KB_HERE], dot;

    for (unsigned i = 0; i < FSDP_KB_HERE; i++)
        part[i] = 0.0f;
    for (size_t c = lane0; c < n; c += FSDP_KB_STEP) {
        float g = fsdp_kb_round_to(fsdp_kb_load(dy, dt, o + c) * fsdp_kb_load(w, dt, c), dt);
        part[FSDP_KB_SLOT(c)] += g * (fsdp_kb_load(x, dt, o + c) * rstd);
    }
    dot = fsdp_kb_lanes_sum_n(part, n) / (float)n;
    for (size_t c = lane0; c < n; c += FSDP_KB_STEP) {
        float g = fsdp_kb_round_to(fsdp_kb_load(dy, dt, o + c) * fsdp_kb_load(w, dt, c), dt);
        float d = (g - (fsdp_kb_load(x, dt, o + c) * rstd) * dot) * rstd;
        if (k->u.rmsnorm_bwd.accumulate)
            d = fsdp_kb_load(dx, dt, o + c) + fsdp_kb_round_to(d, dt);
        fsdp_kb_store(dx, dt, o + c, d);
    }
}

/* rmsnorm_bwd, the weight gradient of the FSDP_KB_LANES columns of block blk, in the column shape
 * of lanes.h: row lane y sums rows y, y + 32, ... of its column in f32, the row lanes meet in the
 * butterfly, and the sum is added to the old gradient once. The caller runs columns x0 .. and row
 * lanes y0 .. (FSDP_KB_HERE of each: all on the host, its own on the GPU); s is the block's. */
FSDP_HD void fsdp_kb_rmsnorm_bwd_cols(const fsdp_kernel_t *k, size_t blk, unsigned x0, unsigned y0,
                                      float (*s)[FSDP_KB_LANES + 1])
{
    const fsdp_dtype_t dt = k->u.rmsnorm_bwd.dtype;
    const size_t n = k->u.rmsnorm_bwd.cols, rows = k->u.rmsnorm_bwd.rows;
    const size_t c0 = blk * FSDP_KB_LANES + x0;
    const size_t nc = c0 >= n ? 0 : n - c0 < FSDP_KB_HERE ? n - c0 : FSDP_KB_HERE;
    void *dw = k->u.rmsnorm_bwd.dweight;

    for (unsigned j = 0; j < FSDP_KB_HERE; j++) {
        float sw[FSDP_KB_HERE];
        for (unsigned i = 0; i < FSDP_KB_HERE; i++)
            sw[i] = 0.0f;
        for (size_t r = y0 + j; r < rows; r += FSDP_KB_ROW_LANES) {
            const size_t o = r * n + c0;
            const float rstd = k->u.rmsnorm_bwd.rstd[r];
            for (size_t i = 0; i < nc; i++)
                sw[i] += fsdp_kb_load(k->u.rmsnorm_bwd.dy, dt, o + i) *
                         fsdp_kb_round_to(fsdp_kb_load(k->u.rmsnorm_bwd.x, dt, o + i) * rstd, dt);
        }
        for (unsigned i = 0; i < FSDP_KB_HERE; i++)
            s[y0 + j][x0 + i] = sw[i];
    }
    fsdp_kb_cols_sum(s);
    if (y0 == 0)
        for (size_t i = 0; i < nc; i++)
            fsdp_kb_store(dw, dt, c0 + i, fsdp_kb_load(dw, dt, c0 + i) + s[0][x0 + i]);
}

/* ---- rotary embedding: element i is one rotation pair (row, head, i < head_dim / 2) ---- */

FSDP_HD void fsdp_kb_rope_at(const fsdp_kernel_t *k, int backward, size_t i)
{
    const fsdp_dtype_t dt = k->u.rope.dtype;
    const size_t half = k->u.rope.head_dim / 2, per_row = k->u.rope.heads * half;
    const size_t r = i / per_row, h = (i - r * per_row) / half, j = i - r * per_row - h * half;
    const size_t p = (r % k->u.rope.seq) * half + j;
    const size_t e1 = r * k->u.rope.ld + h * k->u.rope.head_dim + j, e2 = e1 + half;
    const float c = fsdp_kb_round_to(k->u.rope.cos[p], dt);
    const float s = fsdp_kb_round_to(k->u.rope.sin[p], dt);
    const float x1 = fsdp_kb_load(k->u.rope.x, dt, e1), x2 = fsdp_kb_load(k->u.rope.x, dt, e2);
    float y1, y2;

    if (!backward) {
        y1 = fsdp_kb_round_to(x1 * c, dt) - fsdp_kb_round_to(x2 * s, dt);
        y2 = fsdp_kb_round_to(x2 * c, dt) + fsdp_kb_round_to(x1 * s, dt);
    } else {
        y1 = fsdp_kb_round_to(x1 * c, dt) + fsdp_kb_round_to(x2 * s, dt);
        y2 = fsdp_kb_round_to(x2 * c, dt) - fsdp_kb_round_to(x1 * s, dt);
    }
    fsdp_kb_store(k->u.rope.y, dt, e1, y1);
    fsdp_kb_store(k->u.rope.y, dt, e2, y2);
}

/* ---- SwiGLU ---- */

FSDP_HD float fsdp_kb_silu(float g)
{
    return g / (1.0f + fsdp_kb_expf(-g));
}

FSDP_HD void fsdp_kb_swiglu_fwd_at(const fsdp_kernel_t *k, size_t i)
{
    const fsdp_dtype_t dt = k->u.swiglu_fwd.dtype;
    float g = fsdp_kb_load(k->u.swiglu_fwd.gate, dt, i),
          u = fsdp_kb_load(k->u.swiglu_fwd.up, dt, i);
    fsdp_kb_store(k->u.swiglu_fwd.y, dt, i, fsdp_kb_round_to(fsdp_kb_silu(g), dt) * u);
}

FSDP_HD void fsdp_kb_swiglu_bwd_at(const fsdp_kernel_t *k, size_t i)
{
    const fsdp_dtype_t dt = k->u.swiglu_bwd.dtype;
    float g = fsdp_kb_load(k->u.swiglu_bwd.gate, dt, i),
          u = fsdp_kb_load(k->u.swiglu_bwd.up, dt, i);
    float dy = fsdp_kb_load(k->u.swiglu_bwd.dy, dt, i);
    float sig = 1.0f / (1.0f + fsdp_kb_expf(-g));
    float dh = fsdp_kb_round_to(dy * u, dt);

    fsdp_kb_store(k->u.swiglu_bwd.dup, dt, i, dy * fsdp_kb_round_to(fsdp_kb_silu(g), dt));
    fsdp_kb_store(k->u.swiglu_bwd.dgate, dt, i, dh * (sig * (1.0f + g * (1.0f - sig))));
}

/* ---- fused attention: a row per index (a query row, or a key row for dk and dv) in the row
 * shape of lanes.h over head_dim: lane l holds elements d = l, l + 32, ... of the row's
 * accumulators, and a dot product over head_dim is the lanes' partials meeting in the butterfly,
 * so every lane has the same score and the online softmax's state is the same on every lane.
 * The keys (or queries) are taken one at a time, in order. ---- */

/* Keys (or queries) whose scores are computed together, then taken in order: independent dot
 * products that a GPU warp overlaps; the sums and their order are those of one at a time. */
#ifndef FSDP_KB_ATTN_AHEAD
#define FSDP_KB_ATTN_AHEAD 4
#endif
#ifdef __CUDA_ARCH__
#define FSDP_KB_UNROLL _Pragma("unroll") /* a constant trip count: arrays stay in registers */
#else
#define FSDP_KB_UNROLL
#endif

/* A caller's accumulators of a row of head_dim: acc[q] is element lane0 + q FSDP_KB_STEP (every
 * element on the host, the lane's own on the GPU). */
#define FSDP_KB_ATTN_HERE (FSDP_KB_ATTN_MAX_HD / FSDP_KB_STEP)

/* The caller's lane partials of a . b (d elements of two rows), each lane's in f32 in index order */
FSDP_HD void fsdp_kb_dot_walk(float *part, const void *a, size_t ao, const void *b, size_t bo,
                              size_t d, fsdp_dtype_t dt, unsigned lane0)
{
    for (size_t e = lane0; e < d; e += FSDP_KB_STEP)
        part[FSDP_KB_SLOT(e)] += fsdp_kb_load(a, dt, ao + e) * fsdp_kb_load(b, dt, bo + e);
}

/* a . b over d elements of two rows: the lanes' partials, then the butterfly. (f32 is walked
 * with its dtype a constant, so that the loads' dispatch folds out of the loop.) */
FSDP_HD float fsdp_kb_dot_lanes(const void *a, size_t ao, const void *b, size_t bo, size_t d,
                                fsdp_dtype_t dt, unsigned lane0)
{
    float part[FSDP_KB_HERE];
    for (unsigned i = 0; i < FSDP_KB_HERE; i++)
        part[i] = 0.0f;
    if (dt == FSDP_DTYPE_F32)
        fsdp_kb_dot_walk(part, a, ao, b, bo, d, FSDP_DTYPE_F32, lane0);
    else
        fsdp_kb_dot_walk(part, a, ao, b, bo, d, dt, lane0);
    return fsdp_kb_lanes_sum_n(part, d);
}

/* The caller's accumulators set to 0. */
FSDP_HD void fsdp_kb_acc_zero(float *acc)
{
    for (unsigned q = 0; q < FSDP_KB_ATTN_HERE; q++)
        acc[q] = 0.0f;
}

/* acc *= f, the caller's elements of a row of hd */
FSDP_HD void fsdp_kb_acc_scale(float *acc, float f, size_t hd, unsigned lane0)
{
    for (unsigned q = 0; q < FSDP_KB_ATTN_HERE; q++) {
        if (lane0 + (size_t)q * FSDP_KB_STEP >= hd)
            break;
        acc[q] *= f;
    }
}

FSDP_HD void fsdp_kb_acc_walk(float *acc, float p, const void *row, size_t ro, size_t hd,
                              fsdp_dtype_t dt, unsigned lane0)
{
    for (unsigned q = 0; q < FSDP_KB_ATTN_HERE; q++) {
        const size_t e = lane0 + (size_t)q * FSDP_KB_STEP;
        if (e >= hd)
            break;
        acc[q] += p * fsdp_kb_load(row, dt, ro + e);
    }
}

/* acc += p * row (the row's elements at ro ..), the caller's elements (f32 as in the dot) */
FSDP_HD void fsdp_kb_acc_add(float *acc, float p, const void *row, size_t ro, size_t hd,
                             fsdp_dtype_t dt, unsigned lane0)
{
    if (dt == FSDP_DTYPE_F32)
        fsdp_kb_acc_walk(acc, p, row, ro, hd, FSDP_DTYPE_F32, lane0);
    else
        fsdp_kb_acc_walk(acc, p, row, ro, hd, dt, lane0);
}

/* out[oo + e] = acc / f when divide, else acc * f: the caller's elements */
FSDP_HD void fsdp_kb_acc_store(const float *acc, void *out, size_t oo, size_t hd, fsdp_dtype_t dt,
                               int divide, float f, unsigned lane0)
{
    for (unsigned q = 0; q < FSDP_KB_ATTN_HERE; q++) {
        const size_t e = lane0 + (size_t)q * FSDP_KB_STEP;
        if (e >= hd)
            break;
        fsdp_kb_store(out, dt, oo + e, divide ? acc[q] / f : acc[q] * f);
    }
}

/* attention_fwd, query row r = (b * heads + h) * seq + t (lse's index) */
FSDP_HD void fsdp_kb_attention_fwd_row(const fsdp_kernel_t *k, size_t r, unsigned lane0)
{
    const fsdp_dtype_t dt = k->u.attention_fwd.dtype;
    const size_t T = k->u.attention_fwd.seq, H = k->u.attention_fwd.heads;
    const size_t hd = k->u.attention_fwd.head_dim;
    const size_t t = r % T, h = (r / T) % H, b = r / T / H;
    const size_t g = h / (H / k->u.attention_fwd.kv_heads);
    const size_t qo = (b * T + t) * k->u.attention_fwd.ldq + h * hd;
    const size_t last = k->u.attention_fwd.causal ? t : T - 1;
    const float scale = k->u.attention_fwd.scale;
    float acc[FSDP_KB_ATTN_HERE], m = -fsdp_kb_inff(), l = 0.0f;

    fsdp_kb_acc_zero(acc);
    for (size_t j0 = 0; j0 <= last; j0 += FSDP_KB_ATTN_AHEAD) {
        const unsigned nj = last - j0 < FSDP_KB_ATTN_AHEAD ? (unsigned)(last - j0 + 1)
                                                           : FSDP_KB_ATTN_AHEAD;
        float sc[FSDP_KB_ATTN_AHEAD];
        FSDP_KB_UNROLL
        for (unsigned u = 0; u < FSDP_KB_ATTN_AHEAD && u < nj; u++)
            sc[u] = fsdp_kb_dot_lanes(k->u.attention_fwd.q, qo, k->u.attention_fwd.k,
                                      (b * T + j0 + u) * k->u.attention_fwd.ldk + g * hd, hd, dt,
                                      lane0) *
                    scale;
        FSDP_KB_UNROLL
        for (unsigned u = 0; u < FSDP_KB_ATTN_AHEAD && u < nj; u++) {
            const size_t vo = (b * T + j0 + u) * k->u.attention_fwd.ldv + g * hd;
            const float s = sc[u];
            float p;
            if (s > m) { /* a new maximum: rescale what was summed against the old one */
                float corr = fsdp_kb_expf(m - s);
                l *= corr;
                fsdp_kb_acc_scale(acc, corr, hd, lane0);
                m = s;
            }
            p = fsdp_kb_expf(s - m);
            l += p;
            fsdp_kb_acc_add(acc, p, k->u.attention_fwd.v, vo, hd, dt, lane0);
        }
    }
    fsdp_kb_acc_store(acc, k->u.attention_fwd.o, (b * T + t) * k->u.attention_fwd.ldo + h * hd, hd,
                      dt, 1, l, lane0);
    if (k->u.attention_fwd.lse != NULL && lane0 == 0)
        k->u.attention_fwd.lse[r] = m + fsdp_kb_logf(l);
}

/* attention_bwd pass 0, query row r: delta[r] = dout . o */
FSDP_HD void fsdp_kb_attention_delta_row(const fsdp_kernel_t *k, size_t r, unsigned lane0)
{
    const size_t T = k->u.attention_bwd.seq, H = k->u.attention_bwd.heads;
    const size_t hd = k->u.attention_bwd.head_dim;
    const size_t t = r % T, h = (r / T) % H, b = r / T / H;
    const size_t oo = (b * T + t) * k->u.attention_bwd.ldo + h * hd;
    const float d = fsdp_kb_dot_lanes(k->u.attention_bwd.dout, oo, k->u.attention_bwd.o, oo, hd,
                                      k->u.attention_bwd.dtype, lane0);

    if (lane0 == 0)
        k->u.attention_bwd.delta[r] = d;
}

/* ds of query row (b, h, t) and key j, and p: p = exp(scale q.k - lse), ds = p (dout.v - delta);
 * the same on every lane */
FSDP_HD float fsdp_kb_attention_ds(const fsdp_kernel_t *k, size_t b, size_t h, size_t g, size_t t,
                                   size_t j, float *p_p, unsigned lane0)
{
    const fsdp_dtype_t dt = k->u.attention_bwd.dtype;
    const size_t T = k->u.attention_bwd.seq, H = k->u.attention_bwd.heads;
    const size_t hd = k->u.attention_bwd.head_dim, r = (b * H + h) * T + t;
    const size_t qo = (b * T + t) * k->u.attention_bwd.ldq + h * hd;
    const size_t ko = (b * T + j) * k->u.attention_bwd.ldk + g * hd;
    const size_t vo = (b * T + j) * k->u.attention_bwd.ldv + g * hd;
    const size_t oo = (b * T + t) * k->u.attention_bwd.ldo + h * hd;
    float s = fsdp_kb_dot_lanes(k->u.attention_bwd.q, qo, k->u.attention_bwd.k, ko, hd, dt, lane0) *
              k->u.attention_bwd.scale;
    float p = fsdp_kb_expf(s - k->u.attention_bwd.lse[r]);
    float dp = fsdp_kb_dot_lanes(k->u.attention_bwd.dout, oo, k->u.attention_bwd.v, vo, hd, dt,
                                 lane0);

    *p_p = p;
    return p * (dp - k->u.attention_bwd.delta[r]);
}

/* attention_bwd pass 1, query row r (as the forward's): dq = scale sum_j ds k_j, in key order */
FSDP_HD void fsdp_kb_attention_dq_row(const fsdp_kernel_t *k, size_t r, unsigned lane0)
{
    const fsdp_dtype_t dt = k->u.attention_bwd.dtype;
    const size_t T = k->u.attention_bwd.seq, H = k->u.attention_bwd.heads;
    const size_t hd = k->u.attention_bwd.head_dim;
    const size_t t = r % T, h = (r / T) % H, b = r / T / H;
    const size_t g = h / (H / k->u.attention_bwd.kv_heads);
    const size_t last = k->u.attention_bwd.causal ? t : T - 1;
    float acc[FSDP_KB_ATTN_HERE];

    fsdp_kb_acc_zero(acc);
    for (size_t j0 = 0; j0 <= last; j0 += FSDP_KB_ATTN_AHEAD) {
        const unsigned nj = last - j0 < FSDP_KB_ATTN_AHEAD ? (unsigned)(last - j0 + 1)
                                                           : FSDP_KB_ATTN_AHEAD;
        float ds[FSDP_KB_ATTN_AHEAD], p;
        FSDP_KB_UNROLL
        for (unsigned u = 0; u < FSDP_KB_ATTN_AHEAD && u < nj; u++)
            ds[u] = fsdp_kb_attention_ds(k, b, h, g, t, j0 + u, &p, lane0);
        FSDP_KB_UNROLL
        for (unsigned u = 0; u < FSDP_KB_ATTN_AHEAD && u < nj; u++)
            fsdp_kb_acc_add(acc, ds[u], k->u.attention_bwd.k,
                            (b * T + j0 + u) * k->u.attention_bwd.ldk + g * hd, hd, dt, lane0);
    }
    fsdp_kb_acc_store(acc, k->u.attention_bwd.dq, (b * T + t) * k->u.attention_bwd.ldq + h * hd,
                      hd, dt, 0, k->u.attention_bwd.scale, lane0);
}

/* attention_bwd pass 2, key row r = (b * kv_heads + g) * seq + j: over the query heads of group g
 * in order, then the queries that see key j in order, dv = sum p dout_i and dk = scale sum ds q_i */
FSDP_HD void fsdp_kb_attention_dkv_row(const fsdp_kernel_t *k, size_t r, unsigned lane0)
{
    const fsdp_dtype_t dt = k->u.attention_bwd.dtype;
    const size_t T = k->u.attention_bwd.seq, H = k->u.attention_bwd.heads;
    const size_t K = k->u.attention_bwd.kv_heads, hd = k->u.attention_bwd.head_dim;
    const size_t j = r % T, g = (r / T) % K, b = r / T / K, group = H / K;
    float dk[FSDP_KB_ATTN_HERE], dv[FSDP_KB_ATTN_HERE];

    fsdp_kb_acc_zero(dk);
    fsdp_kb_acc_zero(dv);
    for (size_t h = g * group; h < (g + 1) * group; h++) {
        for (size_t t0 = k->u.attention_bwd.causal ? j : 0; t0 < T; t0 += FSDP_KB_ATTN_AHEAD) {
            const unsigned nt = T - t0 < FSDP_KB_ATTN_AHEAD ? (unsigned)(T - t0)
                                                            : FSDP_KB_ATTN_AHEAD;
            float ds[FSDP_KB_ATTN_AHEAD], p[FSDP_KB_ATTN_AHEAD];
            FSDP_KB_UNROLL
            for (unsigned u = 0; u < FSDP_KB_ATTN_AHEAD && u < nt; u++)
                ds[u] = fsdp_kb_attention_ds(k, b, h, g, t0 + u, j, &p[u], lane0);
            FSDP_KB_UNROLL
            for (unsigned u = 0; u < FSDP_KB_ATTN_AHEAD && u < nt; u++) {
                const size_t t = t0 + u;
                fsdp_kb_acc_add(dv, p[u], k->u.attention_bwd.dout,
                                (b * T + t) * k->u.attention_bwd.ldo + h * hd, hd, dt, lane0);
                fsdp_kb_acc_add(dk, ds[u], k->u.attention_bwd.q,
                                (b * T + t) * k->u.attention_bwd.ldq + h * hd, hd, dt, lane0);
            }
        }
    }
    fsdp_kb_acc_store(dk, k->u.attention_bwd.dk, (b * T + j) * k->u.attention_bwd.ldk + g * hd, hd,
                      dt, 0, k->u.attention_bwd.scale, lane0);
    fsdp_kb_acc_store(dv, k->u.attention_bwd.dv, (b * T + j) * k->u.attention_bwd.ldv + g * hd, hd,
                      dt, 0, 1.0f, lane0);
}

/* ---- dispatch ---- */

FSDP_HD int fsdp_kb_llama_kind(fsdp_kernel_kind_t kind)
{
    return kind >= FSDP_K_RMSNORM_FWD && kind <= FSDP_K_ATTENTION_BWD;
}

/* How the indices of a pass run. */
#define FSDP_KB_BY_ELEM 0 /* an element: a thread on the GPU */
#define FSDP_KB_BY_ROW 1  /* a row of FSDP_KB_LANES lanes (lanes.h): a warp on the GPU */
#define FSDP_KB_BY_COLS 2 /* FSDP_KB_LANES columns x FSDP_KB_ROW_LANES row lanes: a block */

/* The shape of pass `pass` of a kind, and a kind's passes at most: constant expressions for a
 * constant kind (the gpu backend instantiates a kernel per pass). */
#define FSDP_KB_LLAMA_SHAPE(kind, pass)                                                            \
    ((kind) == FSDP_K_RMSNORM_BWD ? ((pass) == 0 ? FSDP_KB_BY_COLS : FSDP_KB_BY_ROW)               \
     : (kind) == FSDP_K_RMSNORM_FWD || (kind) == FSDP_K_ATTENTION_FWD ||                           \
             (kind) == FSDP_K_ATTENTION_BWD                                                        \
         ? FSDP_KB_BY_ROW                                                                          \
         : FSDP_KB_BY_ELEM)
#define FSDP_KB_LLAMA_PASSES(kind)                                                                 \
    ((kind) == FSDP_K_RMSNORM_BWD ? 2 : (kind) == FSDP_K_ATTENTION_BWD ? 3 : 1)

FSDP_HD int fsdp_kb_llama_shape(fsdp_kernel_kind_t kind, int pass)
{
    return FSDP_KB_LLAMA_SHAPE(kind, pass);
}

/* The passes of a kernel, run in order. */
FSDP_HD int fsdp_kb_llama_passes(const fsdp_kernel_t *k)
{
    return FSDP_KB_LLAMA_PASSES(k->kind);
}

/* The indices of pass `pass` (0 when it has nothing to do). */
FSDP_HD size_t fsdp_kb_llama_count(const fsdp_kernel_t *k, int pass)
{
    switch (k->kind) {
    case FSDP_K_RMSNORM_FWD:
        return k->u.rmsnorm_fwd.cols > 0 ? k->u.rmsnorm_fwd.rows : 0;
    case FSDP_K_RMSNORM_BWD:
        if (pass == 0)
            return k->u.rmsnorm_bwd.dweight != NULL
                       ? (k->u.rmsnorm_bwd.cols + FSDP_KB_LANES - 1) / FSDP_KB_LANES
                       : 0;
        return k->u.rmsnorm_bwd.dx != NULL && k->u.rmsnorm_bwd.cols > 0 ? k->u.rmsnorm_bwd.rows : 0;
    case FSDP_K_ROPE_FWD:
    case FSDP_K_ROPE_BWD:
        return k->u.rope.rows * k->u.rope.heads * (k->u.rope.head_dim / 2);
    case FSDP_K_SWIGLU_FWD:
        return k->u.swiglu_fwd.n;
    case FSDP_K_SWIGLU_BWD:
        return k->u.swiglu_bwd.n;
    case FSDP_K_ATTENTION_FWD:
        return k->u.attention_fwd.batch * k->u.attention_fwd.heads * k->u.attention_fwd.seq;
    case FSDP_K_ATTENTION_BWD:
        return k->u.attention_bwd.batch * k->u.attention_bwd.seq *
               (pass == 2 ? k->u.attention_bwd.kv_heads : k->u.attention_bwd.heads);
    default:
        return 0;
    }
}

/* Index i of a pass of elements. With a constant kind the switch folds away. */
FSDP_HD void fsdp_kb_llama_at(fsdp_kernel_kind_t kind, const fsdp_kernel_t *k, int pass, size_t i)
{
    switch (kind) {
    case FSDP_K_ROPE_FWD:
        fsdp_kb_rope_at(k, 0, i);
        break;
    case FSDP_K_ROPE_BWD:
        fsdp_kb_rope_at(k, 1, i);
        break;
    case FSDP_K_SWIGLU_FWD:
        fsdp_kb_swiglu_fwd_at(k, i);
        break;
    case FSDP_K_SWIGLU_BWD:
        fsdp_kb_swiglu_bwd_at(k, i);
        break;
    default:
        break;
    }
}

/* Row r of a pass of rows: lanes lane0 .. of it (FSDP_KB_HERE). */
FSDP_HD void fsdp_kb_llama_row(fsdp_kernel_kind_t kind, const fsdp_kernel_t *k, int pass, size_t r,
                               unsigned lane0)
{
    switch (kind) {
    case FSDP_K_RMSNORM_FWD:
        fsdp_kb_rmsnorm_fwd_row(k, r, lane0);
        break;
    case FSDP_K_RMSNORM_BWD:
        fsdp_kb_rmsnorm_bwd_row(k, r, lane0);
        break;
    case FSDP_K_ATTENTION_FWD:
        fsdp_kb_attention_fwd_row(k, r, lane0);
        break;
    case FSDP_K_ATTENTION_BWD:
        if (pass == 0)
            fsdp_kb_attention_delta_row(k, r, lane0);
        else if (pass == 1)
            fsdp_kb_attention_dq_row(k, r, lane0);
        else
            fsdp_kb_attention_dkv_row(k, r, lane0);
        break;
    default:
        break;
    }
}

/* Column block blk of a pass of column blocks: columns x0 .. and row lanes y0 .. of it. */
FSDP_HD void fsdp_kb_llama_cols(fsdp_kernel_kind_t kind, const fsdp_kernel_t *k, int pass,
                                size_t blk, unsigned x0, unsigned y0,
                                float (*s)[FSDP_KB_LANES + 1])
{
    if (kind == FSDP_K_RMSNORM_BWD && pass == 0)
        fsdp_kb_rmsnorm_bwd_cols(k, blk, x0, y0, s);
}

/* The host's run of indices [b, e) of a pass: each index in order, and within one the lanes
 * (or the columns and row lanes of a block) in the loops of the body. The indices of a pass are
 * independent, so any cut of [0, fsdp_kb_llama_count) into ranges, run in any order or at once,
 * gives the bits of one run in order. */
static inline void fsdp_kb_llama_host_pass(fsdp_kernel_kind_t kind, const fsdp_kernel_t *k,
                                           int pass, size_t b, size_t e)
{
    switch (fsdp_kb_llama_shape(kind, pass)) {
    case FSDP_KB_BY_ROW:
        for (size_t i = b; i < e; i++)
            fsdp_kb_llama_row(kind, k, pass, i, 0);
        break;
    case FSDP_KB_BY_COLS: {
        float s[FSDP_KB_ROW_LANES][FSDP_KB_LANES + 1];
        for (size_t i = b; i < e; i++)
            fsdp_kb_llama_cols(kind, k, pass, i, 0, 0, s);
        break;
    }
    default:
        for (size_t i = b; i < e; i++)
            fsdp_kb_llama_at(kind, k, pass, i);
        break;
    }
}

#define FSDP_KB_LLAMA_CASE_(KIND)                                                                  \
    case KIND:                                                                                     \
        fsdp_kb_llama_host_pass(KIND, k, pass, b, e);                                              \
        break;

/* Indices [b, e) of pass `pass` of a kernel on the host, the kind a constant so that the
 * dispatch folds. */
static inline void fsdp_kb_llama_host_range(const fsdp_kernel_t *k, int pass, size_t b, size_t e)
{
    switch (k->kind) {
        FSDP_KB_LLAMA_CASE_(FSDP_K_RMSNORM_FWD)
        FSDP_KB_LLAMA_CASE_(FSDP_K_RMSNORM_BWD)
        FSDP_KB_LLAMA_CASE_(FSDP_K_ROPE_FWD)
        FSDP_KB_LLAMA_CASE_(FSDP_K_ROPE_BWD)
        FSDP_KB_LLAMA_CASE_(FSDP_K_SWIGLU_FWD)
        FSDP_KB_LLAMA_CASE_(FSDP_K_SWIGLU_BWD)
        FSDP_KB_LLAMA_CASE_(FSDP_K_ATTENTION_FWD)
        FSDP_KB_LLAMA_CASE_(FSDP_K_ATTENTION_BWD)
    default:
        break;
    }
}
#undef FSDP_KB_LLAMA_CASE_

/* The host's run of a whole kernel: its passes in order. */
static inline void fsdp_kb_llama_host(const fsdp_kernel_t *k)
{
    for (int pass = 0; pass < fsdp_kb_llama_passes(k); pass++)
        fsdp_kb_llama_host_range(k, pass, 0, fsdp_kb_llama_count(k, pass));
}

/* ---- the host's check of a descriptor, for both backends: what is wrong, or NULL ---- */

static inline int fsdp_kb_llama_float(fsdp_dtype_t dt)
{
    return dt == FSDP_DTYPE_F32 || dt == FSDP_DTYPE_BF16 || dt == FSDP_DTYPE_F16;
}

/* The attention shapes (fwd or bwd share them): what is wrong, or NULL. */
static inline const char *fsdp_kb_attention_shape(size_t batch, size_t seq, size_t heads,
                                                  size_t kv_heads, size_t hd, size_t ldq,
                                                  size_t ldk, size_t ldv, size_t ldo)
{
    if (batch == 0 || seq == 0)
        return NULL; /* nothing to do */
    if (heads == 0 || kv_heads == 0 || heads % kv_heads != 0)
        return "kv_heads must divide heads (both >= 1)";
    if (hd == 0 || hd > FSDP_KB_ATTN_MAX_HD)
        return "head_dim must be in [1, 256]";
    if (ldq < heads * hd || ldo < heads * hd || ldk < kv_heads * hd || ldv < kv_heads * hd)
        return "a leading dimension is smaller than its heads x head_dim";
    if ((double)batch * (double)seq * (double)(ldq + ldk + ldv + ldo) > 0x1p60)
        return "the tensors overflow";
    return NULL;
}

static inline const char *fsdp_kb_llama_check(const fsdp_kernel_t *k)
{
    if (!fsdp_kb_llama_float(fsdp_kb_dtype(k)))
        return "dtype: the Llama kernels take f32, bf16 or f16";
    switch (k->kind) {
    case FSDP_K_RMSNORM_FWD: {
        size_t n = k->u.rmsnorm_fwd.rows * k->u.rmsnorm_fwd.cols;
        if (k->u.rmsnorm_fwd.rows > 0 && k->u.rmsnorm_fwd.cols == 0)
            return "rows of 0 columns have no mean square";
        if (n > 0 && (k->u.rmsnorm_fwd.y == NULL || k->u.rmsnorm_fwd.x == NULL ||
                      k->u.rmsnorm_fwd.weight == NULL))
            return "y, x or weight is NULL";
        if (!(k->u.rmsnorm_fwd.eps >= 0.0f))
            return "eps must be >= 0";
        return NULL;
    }
    case FSDP_K_RMSNORM_BWD: {
        size_t n = k->u.rmsnorm_bwd.rows * k->u.rmsnorm_bwd.cols;
        const char *dx = (const char *)k->u.rmsnorm_bwd.dx;
        size_t bytes = n * fsdp_dtype_size(k->u.rmsnorm_bwd.dtype);
        if (n > 0 &&
            (k->u.rmsnorm_bwd.dy == NULL || k->u.rmsnorm_bwd.x == NULL ||
             k->u.rmsnorm_bwd.rstd == NULL || (dx != NULL && k->u.rmsnorm_bwd.weight == NULL)))
            return "dy, x, rstd or weight is NULL";
        if (dx != NULL && n > 0) {
            const char *dy = (const char *)k->u.rmsnorm_bwd.dy;
            const char *x = (const char *)k->u.rmsnorm_bwd.x;
            if ((dx < dy + bytes && dy < dx + bytes) || (dx < x + bytes && x < dx + bytes))
                return "dx overlaps dy or x";
        }
        return NULL;
    }
    case FSDP_K_ROPE_FWD:
    case FSDP_K_ROPE_BWD:
        if (k->u.rope.rows == 0 || k->u.rope.heads == 0)
            return NULL;
        if (k->u.rope.head_dim == 0 || k->u.rope.head_dim % 2 != 0)
            return "head_dim must be even and >= 2";
        if (k->u.rope.seq == 0 || k->u.rope.ld < k->u.rope.heads * k->u.rope.head_dim)
            return "seq must be >= 1 and ld >= heads x head_dim";
        if (k->u.rope.y == NULL || k->u.rope.x == NULL || k->u.rope.cos == NULL ||
            k->u.rope.sin == NULL)
            return "y, x, cos or sin is NULL";
        return NULL;
    case FSDP_K_SWIGLU_FWD:
        return k->u.swiglu_fwd.n > 0 && (k->u.swiglu_fwd.y == NULL ||
                                         k->u.swiglu_fwd.gate == NULL || k->u.swiglu_fwd.up == NULL)
                   ? "y, gate or up is NULL"
                   : NULL;
    case FSDP_K_SWIGLU_BWD:
        return k->u.swiglu_bwd.n > 0 &&
                       (k->u.swiglu_bwd.dgate == NULL || k->u.swiglu_bwd.dup == NULL ||
                        k->u.swiglu_bwd.dy == NULL || k->u.swiglu_bwd.gate == NULL ||
                        k->u.swiglu_bwd.up == NULL)
                   ? "dgate, dup, dy, gate or up is NULL"
                   : NULL;
    case FSDP_K_ATTENTION_FWD: {
        const char *bad = fsdp_kb_attention_shape(
            k->u.attention_fwd.batch, k->u.attention_fwd.seq, k->u.attention_fwd.heads,
            k->u.attention_fwd.kv_heads, k->u.attention_fwd.head_dim, k->u.attention_fwd.ldq,
            k->u.attention_fwd.ldk, k->u.attention_fwd.ldv, k->u.attention_fwd.ldo);
        if (bad != NULL || k->u.attention_fwd.batch == 0 || k->u.attention_fwd.seq == 0)
            return bad;
        return k->u.attention_fwd.o == NULL || k->u.attention_fwd.q == NULL ||
                       k->u.attention_fwd.k == NULL || k->u.attention_fwd.v == NULL
                   ? "o, q, k or v is NULL"
                   : NULL;
    }
    case FSDP_K_ATTENTION_BWD: {
        const char *bad = fsdp_kb_attention_shape(
            k->u.attention_bwd.batch, k->u.attention_bwd.seq, k->u.attention_bwd.heads,
            k->u.attention_bwd.kv_heads, k->u.attention_bwd.head_dim, k->u.attention_bwd.ldq,
            k->u.attention_bwd.ldk, k->u.attention_bwd.ldv, k->u.attention_bwd.ldo);
        if (bad != NULL || k->u.attention_bwd.batch == 0 || k->u.attention_bwd.seq == 0)
            return bad;
        return k->u.attention_bwd.dq == NULL || k->u.attention_bwd.dk == NULL ||
                       k->u.attention_bwd.dv == NULL || k->u.attention_bwd.delta == NULL ||
                       k->u.attention_bwd.dout == NULL || k->u.attention_bwd.o == NULL ||
                       k->u.attention_bwd.q == NULL || k->u.attention_bwd.k == NULL ||
                       k->u.attention_bwd.v == NULL || k->u.attention_bwd.lse == NULL
                   ? "dq, dk, dv, delta, dout, o, q, k, v or lse is NULL"
                   : NULL;
    }
    default:
        return "not a Llama kernel";
    }
}

#endif
