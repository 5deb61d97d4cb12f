/* The fused attention's vector lanes (sim/lanes_vec_tmpl.h) against the scalar replay of its
 * bodies (llama_bodies.h, the code the gpu backend runs a lane per thread; the sim's path with
 * FSDP_SIM_ELEM_SCALAR), byte for byte: forward and backward, f32 and bf16, on Llama's shapes
 * (head_dim 16, 64 and 128, grouped-query heads, causal and not) and on odd ones (head_dim 4, 8,
 * 12, 24, 40 and 6, which no vector loop takes), with ordinary inputs, with large scores (the
 * online softmax's rescaling, exp's underflow), and with NaNs and infinities now and then; on
 * each available ISA (SSE2, AVX2), and split across a pool of 3 threads. Every output buffer is
 * compared whole, guards included; the backward's one walk of passes 1 and 2 (by batch row and kv
 * head) on query and key tiles (T past 64), over GPT-2's qkv layout, and left to the passes
 * with dq in place over q; the forward's rows in pairs, and in place over q and over v (one at a
 * time). Long sequences too (T = 1024 and 2048 at head_dim 64, causal
 * and not, grouped-query heads, f32 and bf16), whose keys and values outgrow the first caches. */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp/types.h>

#include "sim_kernels.h"
#include "test_util.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint32_t rng(void)
{
    return fsdp_test_rand32(&rng_state);
}

/* inputs: 0 ordinary, 1 large (scores of tens), 2 NaNs and infinities now and then */
static float value(int mode)
{
    float u = (float)(rng() >> 8) / 16777216.0f - 0.5f;
    if (mode == 2 && rng() % 97 == 0)
        return rng() & 1
                   ? fsdp_test_bits_f32(0x7fc00000u | (rng() & 0x3fffffu) | (rng() & 1u) << 31)
                   : fsdp_test_bits_f32(0x7f800000u | (rng() & 1u) << 31);
    return mode == 1 ? 16.0f * u : 2.0f * u;
}

#define GUARD 16 /* floats around every buffer */

typedef struct shape {
    size_t B, T, H, K, hd;
    int causal;
} shape_t;

typedef struct bufs {
    float *f[11]; /* q, k, v, o, dout, dq, dk, dv (values of dtype), lse, delta, lse_in */
    size_t len[11];
} bufs_t;

enum { Q, KK, V, O, DOUT, DQ, DK, DV, LSE, DELTA, LSE_IN, NBUF };

static long compared;
static int have_isa[2];

static void fill(float *p, size_t n, fsdp_dtype_t dt, int mode)
{
    for (size_t i = 0; i < n; i++) {
        float v = value(mode);
        if (dt == FSDP_DTYPE_BF16)
            ((uint16_t *)p)[i] = fsdp_f32_to_bf16(v);
        else
            p[i] = v;
    }
}

/* the kernels of shape s over the buffers of a (pointers past the guards) */
static void build(const shape_t *s, fsdp_dtype_t dt, bufs_t *a, fsdp_kernel_t *fwd,
                  fsdp_kernel_t *bwd)
{
    const size_t ldq = s->H * s->hd, ldk = s->K * s->hd;
    float scale = 1.0f / (float)s->hd;

    memset(fwd, 0, sizeof(*fwd));
    fwd->kind = FSDP_K_ATTENTION_FWD;
#define SHAPE_(x)                                                                                  \
    ((x).batch = s->B, (x).seq = s->T, (x).heads = s->H, (x).kv_heads = s->K,                      \
     (x).head_dim = s->hd, (x).ldq = (x).ldo = ldq, (x).ldk = (x).ldv = ldk, (x).scale = scale,    \
     (x).causal = s->causal, (x).dtype = dt)
    SHAPE_(fwd->u.attention_fwd);
    fwd->u.attention_fwd.o = a->f[O] + GUARD;
    fwd->u.attention_fwd.lse = a->f[LSE] + GUARD;
    fwd->u.attention_fwd.q = a->f[Q] + GUARD;
    fwd->u.attention_fwd.k = a->f[KK] + GUARD;
    fwd->u.attention_fwd.v = a->f[V] + GUARD;
    memset(bwd, 0, sizeof(*bwd));
    bwd->kind = FSDP_K_ATTENTION_BWD;
    SHAPE_(bwd->u.attention_bwd);
#undef SHAPE_
    bwd->u.attention_bwd.dq = a->f[DQ] + GUARD;
    bwd->u.attention_bwd.dk = a->f[DK] + GUARD;
    bwd->u.attention_bwd.dv = a->f[DV] + GUARD;
    bwd->u.attention_bwd.delta = a->f[DELTA] + GUARD;
    bwd->u.attention_bwd.dout = a->f[DOUT] + GUARD;
    bwd->u.attention_bwd.o = a->f[O] + GUARD;
    bwd->u.attention_bwd.q = a->f[Q] + GUARD;
    bwd->u.attention_bwd.k = a->f[KK] + GUARD;
    bwd->u.attention_bwd.v = a->f[V] + GUARD;
    bwd->u.attention_bwd.lse = a->f[LSE_IN] + GUARD;
}

static void bufs_alloc(const shape_t *s, bufs_t *a)
{
    const size_t rows = s->B * s->T, qn = rows * s->H * s->hd, kn = rows * s->K * s->hd;
    const size_t n[NBUF] = {
        qn, kn, kn, qn, qn, qn, kn, kn, s->B * s->H * s->T, s->B * s->H * s->T, s->B * s->H * s->T};
    for (int b = 0; b < NBUF; b++) {
        a->len[b] = n[b] + 2 * GUARD;
        a->f[b] = calloc(a->len[b], sizeof(float));
        CU_ASSERT_FATAL(a->f[b] != NULL);
    }
}

static void bufs_copy(bufs_t *dst, const bufs_t *src)
{
    for (int b = 0; b < NBUF; b++)
        memcpy(dst->f[b], src->f[b], src->len[b] * sizeof(float));
}

static void bufs_free(bufs_t *a)
{
    for (int b = 0; b < NBUF; b++)
        free(a->f[b]);
}

/* one shape, dtype and mode: the scalar replay, then each ISA and the pool, compared */
static void check(const shape_t *s, fsdp_dtype_t dt, int mode, fsdp_sim_pool_t *pool)
{
    static const char *names[NBUF] = {"q",  "k",  "v",   "o",     "dout",  "dq",
                                      "dk", "dv", "lse", "delta", "lse_in"};
    static const fsdp_sim_elem_isa_t isas[3] = {FSDP_SIM_ELEM_SSE2, FSDP_SIM_ELEM_AVX2,
                                                FSDP_SIM_ELEM_AUTO};
    const size_t rows = s->B * s->T;
    bufs_t in, ref, got;
    fsdp_kernel_t fwd, bwd;

    bufs_alloc(s, &in);
    bufs_alloc(s, &ref);
    bufs_alloc(s, &got);
    fill(in.f[Q] + GUARD, rows * s->H * s->hd, dt, mode);
    fill(in.f[KK] + GUARD, rows * s->K * s->hd, dt, mode);
    fill(in.f[V] + GUARD, rows * s->K * s->hd, dt, mode);
    fill(in.f[DOUT] + GUARD, rows * s->H * s->hd, dt, mode);
    /* the backward's o and lse from the scalar forward (a NaN in them is an input too) */
    build(s, dt, &in, &fwd, &bwd);
    CU_ASSERT_FATAL(fsdp_sim_elem_set_isa(FSDP_SIM_ELEM_SCALAR));
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&fwd), FSDP_OK);
    memcpy(in.f[LSE_IN], in.f[LSE], in.len[LSE] * sizeof(float));
    bufs_copy(&ref, &in);
    build(s, dt, &ref, &fwd, &bwd);
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&fwd), FSDP_OK);
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&bwd), FSDP_OK);
    for (int v = 0; v < 3; v++) {
        if (v < 2 && !have_isa[v])
            continue;
        bufs_copy(&got, &in);
        build(s, dt, &got, &fwd, &bwd);
        CU_ASSERT_FATAL(fsdp_sim_elem_set_isa(isas[v]));
        if (v < 2) {
            CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&fwd), FSDP_OK);
            CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&bwd), FSDP_OK);
        } else {
            CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec_par(&fwd, pool, NULL), FSDP_OK);
            CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec_par(&bwd, pool, NULL), FSDP_OK);
        }
        for (int b = 0; b < NBUF; b++) {
            if (memcmp(ref.f[b], got.f[b], ref.len[b] * sizeof(float)) != 0) {
                size_t at = 0;
                while (memcmp(&ref.f[b][at], &got.f[b][at], sizeof(float)) == 0)
                    at++;
                fprintf(stderr,
                        "\nB %zu T %zu H %zu K %zu hd %zu causal %d %s mode %d %s: %s differs at "
                        "float %zu: %08x, scalar %08x\n",
                        s->B, s->T, s->H, s->K, s->hd, s->causal, fsdp_dtype_name(dt), mode,
                        v == 2   ? "pool"
                        : v == 0 ? "sse2"
                                 : "avx2",
                        names[b], at, (unsigned)*(uint32_t *)&got.f[b][at],
                        (unsigned)*(uint32_t *)&ref.f[b][at]);
                CU_FAIL("vector lanes differ from the scalar replay");
            }
        }
        compared++;
    }
    fsdp_sim_elem_set_isa(FSDP_SIM_ELEM_AUTO);
    bufs_free(&in);
    bufs_free(&ref);
    bufs_free(&got);
}

static void test_shapes(void)
{
    /* B, T, H, K, hd, causal: llama-tiny's, stories15M's heads (48), Llama 2's and 3's 128, GQA
     * 4:1 and 2:1, MQA; odd head_dims; T below and around the vector widths */
    static const shape_t shapes[] = {
        {2, 17, 4, 4, 16, 1},  {1, 33, 2, 2, 48, 1}, {1, 20, 4, 1, 64, 1}, {2, 9, 4, 2, 128, 0},
        {1, 12, 2, 2, 128, 1}, {1, 7, 2, 1, 16, 0},  {1, 10, 3, 3, 4, 1},  {1, 9, 2, 1, 8, 0},
        {1, 11, 2, 2, 12, 1},  {1, 6, 2, 2, 24, 0},  {1, 5, 2, 1, 40, 1},  {1, 8, 2, 2, 6, 1},
        {1, 3, 2, 2, 256, 1},  {1, 1, 1, 1, 32, 1},  {1, 70, 2, 1, 16, 1}, {1, 67, 2, 2, 32, 0},
        {2, 130, 2, 1, 8, 1},
    };
    fsdp_sim_pool_t *pool = fsdp_sim_pool_create(3);

    CU_ASSERT_FATAL(pool != NULL);
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
        for (int d = 0; d < 2; d++)
            for (int mode = 0; mode < 3; mode++)
                check(&shapes[i], d == 0 ? FSDP_DTYPE_F32 : FSDP_DTYPE_BF16, mode, pool);
    fsdp_sim_pool_destroy(pool);
}

/* a pass large enough to be split across the pool by index ranges */
static void test_split(void)
{
    static const shape_t s = {2, 64, 4, 2, 64, 1};
    fsdp_sim_pool_t *pool = fsdp_sim_pool_create(3);

    CU_ASSERT_FATAL(pool != NULL);
    check(&s, FSDP_DTYPE_F32, 0, pool);
    check(&s, FSDP_DTYPE_BF16, 2, pool);
    fsdp_sim_pool_destroy(pool);
}

/* The backward over GPT-2's layout (q, k and v columns of one qkv, dq, dk and dv of one dqkv),
 * which the one walk of passes 1 and 2 takes, and with dq in place over q, which it leaves to the
 * passes (pass 2 reads q after pass 1 wrote dq over it): the scalar replay's bytes either way. */
static void test_layouts(void)
{
    enum { B = 2, T = 70, H = 2, hd = 16, C = H * hd, LD = 3 * C, N = B * T * LD };
    static const fsdp_sim_elem_isa_t isas[3] = {FSDP_SIM_ELEM_SCALAR, FSDP_SIM_ELEM_SSE2,
                                                FSDP_SIM_ELEM_AVX2};

    for (int inplace = 0; inplace < 2; inplace++) {
        float *ref = NULL;
        for (int v = 0; v < 3; v++) {
            /* qkv, dqkv, o, dout [B T C], lse and delta [B H T], one after another */
            float *m = calloc(2 * N + 2 * B * T * C + 2 * B * H * T, sizeof(float));
            float *qkv = m, *dqkv = qkv + N, *o = dqkv + N, *dout = o + B * T * C;
            float *lse = dout + B * T * C, *delta = lse + B * H * T;
            fsdp_kernel_t fwd = {.kind = FSDP_K_ATTENTION_FWD},
                          bwd = {.kind = FSDP_K_ATTENTION_BWD};
            CU_ASSERT_FATAL(m != NULL);
            rng_state = 0x9e3779b97f4a7c15ull;
            fill(qkv, N, FSDP_DTYPE_F32, 0);
            fill(dout, B * T * C, FSDP_DTYPE_F32, 0);
#define SHAPE_(x)                                                                                  \
    ((x).batch = B, (x).seq = T, (x).heads = H, (x).kv_heads = H, (x).head_dim = hd,               \
     (x).ldq = (x).ldk = (x).ldv = LD, (x).ldo = C, (x).scale = 0.25f, (x).causal = 1,             \
     (x).dtype = FSDP_DTYPE_F32, (x).q = qkv, (x).k = qkv + C, (x).v = qkv + 2 * C, (x).o = o,     \
     (x).lse = lse)
            SHAPE_(fwd.u.attention_fwd);
            SHAPE_(bwd.u.attention_bwd);
#undef SHAPE_
            bwd.u.attention_bwd.dq = inplace ? qkv : dqkv;
            bwd.u.attention_bwd.dk = dqkv + C;
            bwd.u.attention_bwd.dv = dqkv + 2 * C;
            bwd.u.attention_bwd.delta = delta;
            bwd.u.attention_bwd.dout = dout;
            if (!fsdp_sim_elem_set_isa(isas[v])) {
                free(m);
                continue;
            }
            CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&fwd), FSDP_OK);
            CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&bwd), FSDP_OK);
            if (ref == NULL)
                ref = m;
            else {
                CU_ASSERT(memcmp(ref, m, (2 * N + 2 * B * T * C + 2 * B * H * T) * 4) == 0);
                compared++;
                free(m);
            }
        }
        free(ref);
    }
    fsdp_sim_elem_set_isa(FSDP_SIM_ELEM_AUTO);
}

/* The forward in place over q, and over v (which rows after a row read: the vector rows then go
 * one at a time, not in pairs), f32 and bf16, ordinary and large scores: the scalar replay's
 * bytes on each ISA and on the pool. */
static void test_fwd_over(void)
{
    enum { B = 2, T = 37, H = 2, hd = 16, C = H * hd, LD = 3 * C, N = B * T * LD };
    static const fsdp_sim_elem_isa_t isas[4] = {FSDP_SIM_ELEM_SCALAR, FSDP_SIM_ELEM_SSE2,
                                                FSDP_SIM_ELEM_AVX2, FSDP_SIM_ELEM_AUTO};
    fsdp_sim_pool_t *pool = fsdp_sim_pool_create(3);

    CU_ASSERT_FATAL(pool != NULL);
    for (int over = 0; over < 2; over++)
        for (int d = 0; d < 2; d++)
            for (int mode = 0; mode < 2; mode++) {
                const fsdp_dtype_t dt = d == 0 ? FSDP_DTYPE_F32 : FSDP_DTYPE_BF16;
                float *ref = NULL;
                for (int v = 0; v < 4; v++) {
                    /* qkv [B T LD], lse [B H T] */
                    float *m = calloc(N + B * H * T, sizeof(float)), *lse = m + N;
                    const size_t es = fsdp_dtype_size(dt);
                    char *qkv = (char *)m;
                    fsdp_kernel_t fwd = {.kind = FSDP_K_ATTENTION_FWD};
                    CU_ASSERT_FATAL(m != NULL);
                    rng_state = 0x9e3779b97f4a7c15ull;
                    fill(m, N, dt, mode);
                    fwd.u.attention_fwd.o = qkv + (over ? 2 * C : 0) * es;
                    fwd.u.attention_fwd.lse = lse;
                    fwd.u.attention_fwd.q = qkv;
                    fwd.u.attention_fwd.k = qkv + C * es;
                    fwd.u.attention_fwd.v = qkv + 2 * C * es;
                    fwd.u.attention_fwd.batch = B, fwd.u.attention_fwd.seq = T;
                    fwd.u.attention_fwd.heads = fwd.u.attention_fwd.kv_heads = H;
                    fwd.u.attention_fwd.head_dim = hd, fwd.u.attention_fwd.scale = 0.25f;
                    fwd.u.attention_fwd.ldq = fwd.u.attention_fwd.ldk = LD;
                    fwd.u.attention_fwd.ldv = fwd.u.attention_fwd.ldo = LD;
                    fwd.u.attention_fwd.causal = 1, fwd.u.attention_fwd.dtype = dt;
                    if (!fsdp_sim_elem_set_isa(isas[v])) {
                        free(m);
                        continue;
                    }
                    CU_ASSERT_EQUAL_FATAL(v == 3 ? fsdp_sim_kernel_exec_par(&fwd, pool, NULL)
                                                 : fsdp_sim_kernel_exec(&fwd),
                                          FSDP_OK);
                    if (ref == NULL) {
                        ref = m;
                        continue;
                    }
                    if (memcmp(ref, m, (N + B * H * T) * sizeof(float)) != 0) {
                        fprintf(stderr, "\nforward over %s, %s mode %d, isa %d differs\n",
                                over ? "v" : "q", fsdp_dtype_name(dt), mode, v);
                        CU_FAIL("vector lanes differ from the scalar replay");
                    }
                    compared++;
                    free(m);
                }
                free(ref);
            }
    fsdp_sim_elem_set_isa(FSDP_SIM_ELEM_AUTO);
    fsdp_sim_pool_destroy(pool);
}

/* The sanitizer builds check memory and threads, which the short shapes exercise along the same
 * paths; the long sequences, arithmetic alone, would take them many minutes: there they run
 * the first case only. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define LONG_RUNS 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define LONG_RUNS 1
#endif
#endif

/* long sequences on each ISA and on 1, 2 and 3 threads */
static void test_long(void)
{
    static const struct {
        shape_t s;
        fsdp_dtype_t dt;
        int mode;
    } runs[] = {
        {{1, 1024, 2, 1, 64, 1}, FSDP_DTYPE_F32, 0},
        {{1, 1024, 2, 2, 64, 0}, FSDP_DTYPE_BF16, 1},
        {{1, 2048, 1, 1, 64, 1}, FSDP_DTYPE_BF16, 0},
        {{1, 2048, 2, 1, 64, 1}, FSDP_DTYPE_F32, 2},
    };

#ifndef LONG_RUNS
#define LONG_RUNS (sizeof(runs) / sizeof(runs[0]))
#endif
    for (size_t i = 0; i < LONG_RUNS; i++) {
        const int threads = 1 + (int)(i % 3);
        fsdp_sim_pool_t *pool = fsdp_sim_pool_create(threads); /* one thread: NULL, no pool */
        CU_ASSERT_FATAL(threads == 1 || pool != NULL);
        check(&runs[i].s, runs[i].dt, runs[i].mode, pool);
        fsdp_sim_pool_destroy(pool);
    }
}

static void test_summary(void)
{
    fsdp_test_isa_summary(have_isa, compared);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"shapes", test_shapes},
        {"split", test_split},
        {"layouts", test_layouts},
        {"fwd_over", test_fwd_over},
        {"long", test_long},
        {"summary", test_summary},
        {NULL, NULL},
    };
    have_isa[0] = fsdp_sim_elem_set_isa(FSDP_SIM_ELEM_SSE2);
    have_isa[1] = fsdp_sim_elem_set_isa(FSDP_SIM_ELEM_AVX2);
    fsdp_sim_elem_set_isa(FSDP_SIM_ELEM_AUTO);
    return fsdp_test_run("lanes_vec", tests);
}
