/* The row kernels', column sums' and Llama element passes' vector loops (sim/rows_vec_tmpl.h)
 * against the scalar replay of their bodies (nn_bodies.h, kernel_elem.h, llama_bodies.h: the code
 * the gpu backend runs a lane per thread; the sim's path with FSDP_SIM_ELEM_SCALAR), byte for
 * byte: layernorm forward and backward (input, weight and bias gradients, accumulated or not),
 * softmax forward and backward (causal or not, scaled or divided), cross-entropy (ignored and
 * out-of-range targets, dlogits apart, over the logits or none; the whole vocabulary and the
 * vocabulary-parallel stages over a shard), bias_grad (mixed dtypes),
 * rmsnorm forward and backward, swiglu and rope forward and backward; f32 and bf16; row lengths
 * below, at and past the vector widths and the 32 lanes, in place and not; with ordinary inputs,
 * large ones, and NaNs and infinities now and then (often, and rarely: some rows with, some
 * without). On each available ISA (SSE2, AVX2), and split across a pool of 3 threads. Every
 * buffer is compared whole, guards included. */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp/types.h>

#include "sim_kernels.h"
#include "test_util.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rng(void)
{
    return fsdp_test_rand32(&rng_state);
}

/* modes: 0 ordinary, 1 large (exp's overflow and underflow), 2 NaNs and infinities one in 97,
 * 3 one in 3000 (most rows have none) */
#define MODES 4

static float value(int mode)
{
    float u = (float)(rng() >> 8) / 16777216.0f - 0.5f;
    if ((mode == 2 && rng() % 97 == 0) || (mode == 3 && rng() % 3000 == 0))
        return rng() & 1
                   ? fsdp_test_bits_f32(0x7fc00000u | (rng() & 0x3fffffu) | (rng() & 1u) << 31)
                   : fsdp_test_bits_f32(0x7f800000u | (rng() & 1u) << 31);
    return mode == 1 ? 200.0f * u : 4.0f * u;
}

#define GUARD 16 /* elements around every buffer */
#define NB 8     /* buffers of a case at most */

/* what a buffer holds: values of the case's dtype, f32 values, positive f32 (rstd), targets */
enum { VAL, F32, POS, TGT };

typedef struct tcase tcase_t;
struct tcase {
    const char *name;
    fsdp_kernel_kind_t kind;
    size_t rows, cols, heads, hd, ld;
    int f1, f2, f3; /* the kind's variants (see build) */
    int stage;      /* cross_entropy's (kernel.h), its vocabulary shard from cols / 2 */
    fsdp_dtype_t dt;
    int nb;
    size_t n[NB];
    int what[NB];
};

typedef struct set {
    void *p[NB]; /* past the guard */
    void *base[NB];
    size_t bytes[NB]; /* guards included */
} set_t;

static size_t esize(const tcase_t *c, int b)
{
    return c->what[b] == VAL ? fsdp_dtype_size(c->dt) : 4;
}

static void set_alloc(const tcase_t *c, set_t *s)
{
    for (int b = 0; b < c->nb; b++) {
        s->bytes[b] = (c->n[b] + 2 * GUARD) * esize(c, b);
        s->base[b] = calloc(1, s->bytes[b]);
        CU_ASSERT_FATAL(s->base[b] != NULL);
        s->p[b] = (char *)s->base[b] + GUARD * esize(c, b);
    }
}

static void set_fill(const tcase_t *c, set_t *s, int mode)
{
    for (int b = 0; b < c->nb; b++) {
        size_t len = c->n[b] + 2 * GUARD;
        for (size_t i = 0; i < len; i++) {
            float v = value(mode);
            switch (c->what[b]) {
            case VAL:
                if (c->dt == FSDP_DTYPE_BF16)
                    ((uint16_t *)s->base[b])[i] = fsdp_f32_to_bf16(v);
                else
                    ((float *)s->base[b])[i] = v;
                break;
            case F32:
                ((float *)s->base[b])[i] = v;
                break;
            case POS:
                ((float *)s->base[b])[i] = v != v ? v : 0.25f + (v < 0 ? -v : v);
                break;
            default: /* mostly in range; -1 ignored, cols out of range */
                ((int32_t *)s->base[b])[i] = rng() % 13 == 0   ? -1
                                             : rng() % 29 == 0 ? (int32_t)c->cols
                                                               : (int32_t)(rng() % c->cols);
                break;
            }
        }
    }
}

static void set_copy(const tcase_t *c, set_t *dst, const set_t *src)
{
    for (int b = 0; b < c->nb; b++)
        memcpy(dst->base[b], src->base[b], src->bytes[b]);
}

static void set_free(const tcase_t *c, set_t *s)
{
    for (int b = 0; b < c->nb; b++)
        free(s->base[b]);
}

/* The kernel of case c over the buffers of s. Buffer 0 is the first output; f1 is "in place"
 * for the kinds that may be. */
static void build(const tcase_t *c, const set_t *s, fsdp_kernel_t *k)
{
    void *const *p = s->p;
    const size_t R = c->rows, C = c->cols;

    memset(k, 0, sizeof(*k));
    k->kind = c->kind;
    switch (c->kind) {
    case FSDP_K_LAYERNORM_FWD: /* y, x, w, b, mean, rstd; f1 in place, f2 no statistics */
        k->u.layernorm_fwd = (__typeof__(k->u.layernorm_fwd)){p[0],
                                                              c->f2 ? NULL : p[4],
                                                              c->f2 ? NULL : p[5],
                                                              c->f1 ? p[0] : p[1],
                                                              p[2],
                                                              p[3],
                                                              R,
                                                              C,
                                                              1e-5f,
                                                              c->dt};
        break;
    case FSDP_K_LAYERNORM_BWD: /* dx, dw, db, dy, x, mean, rstd, w; f1 accumulate, f2 no dx, f3
                                * no dw or db */
        k->u.layernorm_bwd = (__typeof__(k->u.layernorm_bwd)){c->f2 ? NULL : p[0],
                                                              c->f3 == 1 ? NULL : p[1],
                                                              c->f3 == 2 ? NULL : p[2],
                                                              p[3],
                                                              p[4],
                                                              p[5],
                                                              p[6],
                                                              p[7],
                                                              R,
                                                              C,
                                                              c->f1,
                                                              c->dt};
        break;
    case FSDP_K_SOFTMAX_FWD: /* y, x; f1 in place, f2 causal, f3 divisor */
        k->u.softmax_fwd = (__typeof__(k->u.softmax_fwd)){
            p[0], c->f1 ? p[0] : p[1], R, C, 0.125f, c->f2, c->dt, c->f3 ? 5.657f : 0.0f, 0};
        break;
    case FSDP_K_SOFTMAX_BWD: /* dx, dy, y; f1 in place over dy */
        k->u.softmax_bwd = (__typeof__(k->u.softmax_bwd)){
            p[0], c->f1 ? p[0] : p[1], p[2], R, C, 0.125f, c->f2, c->dt, c->f3 ? 5.657f : 0.0f, 0};
        break;
    case FSDP_K_CROSS_ENTROPY: /* dlogits, logits, losses, loss, targets, stats; f1 in place,
                                * f2 none */
        k->u.cross_entropy = (__typeof__(k->u.cross_entropy)){p[3],
                                                              p[2],
                                                              c->f2   ? NULL
                                                              : c->f1 ? p[1]
                                                                      : p[0],
                                                              p[1],
                                                              p[4],
                                                              R,
                                                              C,
                                                              (double)R * 0.75,
                                                              c->dt,
                                                              c->stage,
                                                              c->stage ? p[5] : NULL,
                                                              c->stage ? C / 2 : 0};
        break;
    case FSDP_K_BIAS_GRAD: /* dbias, dy; f1: dbias f32, dy of the case's dtype */
        k->u.bias_grad =
            (__typeof__(k->u.bias_grad)){p[0], p[1], R, C, c->f1 ? FSDP_DTYPE_F32 : c->dt, c->dt};
        break;
    case FSDP_K_RMSNORM_FWD: /* y, x, w, rstd; f1 in place, f2 no rstd */
        k->u.rmsnorm_fwd = (__typeof__(k->u.rmsnorm_fwd)){
            p[0], c->f2 ? NULL : p[3], c->f1 ? p[0] : p[1], p[2], R, C, 1e-6f, c->dt};
        break;
    case FSDP_K_RMSNORM_BWD: /* dx, dw, dy, x, rstd, w; f1 accumulate, f2 no dx, f3 no dw */
        k->u.rmsnorm_bwd = (__typeof__(k->u.rmsnorm_bwd)){
            c->f2 ? NULL : p[0], c->f3 ? NULL : p[1], p[2], p[3], p[4], p[5], R, C, c->f1, c->dt};
        break;
    case FSDP_K_SWIGLU_FWD: /* y, gate, up; f1 in place over gate */
        k->u.swiglu_fwd =
            (__typeof__(k->u.swiglu_fwd)){p[0], c->f1 ? p[0] : p[1], p[2], R * C, c->dt};
        break;
    case FSDP_K_SWIGLU_BWD: /* dgate, dup, dy, gate, up; f1 dgate over gate and dup over up */
        k->u.swiglu_bwd = (__typeof__(k->u.swiglu_bwd)){
            p[0], p[1], p[2], c->f1 ? p[0] : p[3], c->f1 ? p[1] : p[4], R * C, c->dt};
        break;
    default: /* rope: y, x, cos, sin; f1 in place; rows of ld, seq = cols */
        k->u.rope = (__typeof__(k->u.rope)){
            p[0], c->f1 ? p[0] : p[1], p[2], p[3], R, c->heads, c->hd, C, c->ld, c->dt};
        break;
    }
}

/* the buffers of a case (sizes and contents) from its kind and sizes */
static void layout(tcase_t *c)
{
    const size_t R = c->rows, C = c->cols, RC = R * C;
#define B_(i, len, w) (c->n[i] = (len), c->what[i] = (w))
    switch (c->kind) {
    case FSDP_K_LAYERNORM_FWD:
        c->nb = 6;
        B_(0, RC, VAL), B_(1, RC, VAL), B_(2, C, VAL), B_(3, C, VAL), B_(4, R, F32), B_(5, R, F32);
        break;
    case FSDP_K_LAYERNORM_BWD:
        c->nb = 8;
        B_(0, RC, VAL), B_(1, C, VAL), B_(2, C, VAL), B_(3, RC, VAL), B_(4, RC, VAL), B_(5, R, F32),
            B_(6, R, POS), B_(7, C, VAL);
        break;
    case FSDP_K_SOFTMAX_FWD:
        c->nb = 2;
        B_(0, RC, VAL), B_(1, RC, VAL);
        break;
    case FSDP_K_SOFTMAX_BWD:
        c->nb = 3;
        B_(0, RC, VAL), B_(1, RC, VAL), B_(2, RC, VAL);
        break;
    case FSDP_K_CROSS_ENTROPY:
        c->nb = 6;
        B_(0, RC, VAL), B_(1, RC, VAL), B_(2, R, F32), B_(3, 1, F32), B_(4, R, TGT),
            B_(5, 3 * R, POS);
        break;
    case FSDP_K_BIAS_GRAD:
        c->nb = 2;
        B_(0, C, c->f1 ? F32 : VAL), B_(1, RC, VAL);
        break;
    case FSDP_K_RMSNORM_FWD:
        c->nb = 4;
        B_(0, RC, VAL), B_(1, RC, VAL), B_(2, C, VAL), B_(3, R, F32);
        break;
    case FSDP_K_RMSNORM_BWD:
        c->nb = 6;
        B_(0, RC, VAL), B_(1, C, VAL), B_(2, RC, VAL), B_(3, RC, VAL), B_(4, R, POS), B_(5, C, VAL);
        break;
    case FSDP_K_SWIGLU_FWD:
        c->nb = 3;
        B_(0, RC, VAL), B_(1, RC, VAL), B_(2, RC, VAL);
        break;
    case FSDP_K_SWIGLU_BWD:
        c->nb = 5;
        for (int b = 0; b < 5; b++)
            B_(b, RC, VAL);
        break;
    default:
        c->nb = 4;
        B_(0, R * c->ld, VAL), B_(1, R * c->ld, VAL), B_(2, C * c->hd / 2, F32),
            B_(3, C * c->hd / 2, F32);
        break;
    }
#undef B_
}

static long compared;
static int have_isa[2];

/* one case and mode: the scalar replay, then each ISA and the pool, compared */
static void check(tcase_t *c, int mode, fsdp_sim_pool_t *pool)
{
    static const fsdp_sim_elem_isa_t isas[3] = {FSDP_SIM_ELEM_SSE2, FSDP_SIM_ELEM_AVX2,
                                                FSDP_SIM_ELEM_AUTO};
    set_t in, ref, got;
    fsdp_kernel_t k;

    layout(c);
    set_alloc(c, &in);
    set_alloc(c, &ref);
    set_alloc(c, &got);
    set_fill(c, &in, mode);
    set_copy(c, &ref, &in);
    build(c, &ref, &k);
    CU_ASSERT_FATAL(fsdp_sim_elem_set_isa(FSDP_SIM_ELEM_SCALAR));
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&k), FSDP_OK);
    for (int v = 0; v < 3; v++) {
        if (v < 2 && !have_isa[v])
            continue;
        set_copy(c, &got, &in);
        build(c, &got, &k);
        CU_ASSERT_FATAL(fsdp_sim_elem_set_isa(isas[v]));
        if (v < 2) {
            CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&k), FSDP_OK);
        } else {
            CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec_par(&k, pool, NULL), FSDP_OK);
        }
        for (int b = 0; b < c->nb; b++) {
            if (memcmp(ref.base[b], got.base[b], ref.bytes[b]) != 0) {
                size_t at = 0;
                while (((char *)ref.base[b])[at] == ((char *)got.base[b])[at])
                    at++;
                fprintf(stderr,
                        "\n%s rows %zu cols %zu f %d %d %d stage %d %s mode %d %s: buffer %d "
                        "differs at byte %zu (element %zd)\n",
                        c->name, c->rows, c->cols, c->f1, c->f2, c->f3, c->stage,
                        fsdp_dtype_name(c->dt), mode,
                        v == 2   ? "pool"
                        : v == 0 ? "sse2"
                                 : "avx2",
                        b, at, (ssize_t)(at / esize(c, b)) - GUARD);
                CU_FAIL("vector loops differ from the scalar replay");
            }
        }
        compared++;
    }
    fsdp_sim_elem_set_isa(FSDP_SIM_ELEM_AUTO);
    set_free(c, &in);
    set_free(c, &ref);
    set_free(c, &got);
}

/* case c on every dtype, mode and variant of its kind (flags up to f1max, f2max, f3max) */
static void check_all(tcase_t c, int f1max, int f2max, int f3max, fsdp_sim_pool_t *pool)
{
    for (int d = 0; d < 2; d++)
        for (c.f1 = 0; c.f1 <= f1max; c.f1++)
            for (c.f2 = 0; c.f2 <= f2max; c.f2++)
                for (c.f3 = 0; c.f3 <= f3max; c.f3++)
                    for (int mode = 0; mode < MODES; mode++) {
                        c.dt = d == 0 ? FSDP_DTYPE_F32 : FSDP_DTYPE_BF16;
                        check(&c, mode, pool);
                    }
}

static tcase_t tc(const char *name, fsdp_kernel_kind_t kind, size_t rows, size_t cols)
{
    tcase_t c;
    memset(&c, 0, sizeof(c));
    c.name = name;
    c.kind = kind;
    c.rows = rows;
    c.cols = cols;
    return c;
}

/* row lengths: below and at the widths, odd, the 32 lanes and past them */
static const size_t lens[] = {1, 3, 4, 7, 8, 13, 32, 37, 64, 100};
#define NLENS (sizeof(lens) / sizeof(lens[0]))

static fsdp_sim_pool_t *test_pool;

static void test_layernorm(void)
{
    for (size_t i = 0; i < NLENS; i++) {
        check_all(tc("layernorm_fwd", FSDP_K_LAYERNORM_FWD, 5, lens[i]), 1, 1, 0, test_pool);
        check_all(tc("layernorm_bwd", FSDP_K_LAYERNORM_BWD, 37, lens[i]), 1, 1, 2, test_pool);
    }
}

static void test_softmax(void)
{
    for (size_t i = 0; i < NLENS; i++) {
        /* causal: rows of [batch, cols, cols] */
        check_all(tc("softmax_fwd", FSDP_K_SOFTMAX_FWD, 2 * lens[i], lens[i]), 1, 1, 1, test_pool);
        check_all(tc("softmax_bwd", FSDP_K_SOFTMAX_BWD, 2 * lens[i], lens[i]), 1, 1, 1, test_pool);
    }
}

/* stage 0, the whole vocabulary, and the vocabulary-parallel stages 1 to 3 over a shard (the
 * targets partly in it; stats made up, sometimes NaN or infinite); in place and no dlogits only
 * where the stage writes dlogits */
static void test_cross_entropy(void)
{
    for (int stage = 0; stage <= 3; stage++) {
        const int f = stage == 0 || stage == 3;
        tcase_t c = tc("cross_entropy", FSDP_K_CROSS_ENTROPY, 3, 1001);
        for (size_t i = 0; i < NLENS; i++) {
            tcase_t ci = tc("cross_entropy", FSDP_K_CROSS_ENTROPY, 9, lens[i] + 1);
            ci.stage = stage;
            check_all(ci, f, f, 0, test_pool);
        }
        c.stage = stage;
        check_all(c, f, f, 0, test_pool);
    }
}

static void test_bias_grad(void)
{
    static const size_t cols[] = {1, 5, 8, 31, 32, 33, 70};
    for (size_t i = 0; i < sizeof(cols) / sizeof(cols[0]); i++)
        check_all(tc("bias_grad", FSDP_K_BIAS_GRAD, 71, cols[i]), 1, 0, 0, test_pool);
}

static void test_rmsnorm(void)
{
    for (size_t i = 0; i < NLENS; i++) {
        check_all(tc("rmsnorm_fwd", FSDP_K_RMSNORM_FWD, 5, lens[i]), 1, 1, 0, test_pool);
        check_all(tc("rmsnorm_bwd", FSDP_K_RMSNORM_BWD, 37, lens[i]), 1, 1, 1, test_pool);
    }
}

static void test_swiglu(void)
{
    for (size_t i = 0; i < NLENS; i++) {
        check_all(tc("swiglu_fwd", FSDP_K_SWIGLU_FWD, 3, lens[i]), 1, 0, 0, test_pool);
        check_all(tc("swiglu_bwd", FSDP_K_SWIGLU_BWD, 3, lens[i]), 1, 0, 0, test_pool);
    }
}

static void test_rope(void)
{
    /* head_dim, heads, ld: halves below, at and past the widths; ld past the heads */
    static const size_t shapes[][3] = {{2, 3, 6},   {6, 2, 13},  {8, 2, 16}, {16, 4, 64},
                                       {24, 1, 30}, {48, 2, 96}, {64, 1, 64}};
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        tcase_t c = tc("rope_fwd", FSDP_K_ROPE_FWD, 6, 4); /* 4 positions */
        c.heads = shapes[i][1];
        c.hd = shapes[i][0];
        c.ld = shapes[i][2];
        check_all(c, 1, 0, 0, test_pool);
        c.name = "rope_bwd";
        c.kind = FSDP_K_ROPE_BWD;
        check_all(c, 1, 0, 0, test_pool);
    }
}

/* kernels large enough to be split across the pool (rows, column blocks, element ranges) */
static void test_split(void)
{
    tcase_t big[] = {
        tc("layernorm_fwd", FSDP_K_LAYERNORM_FWD, 512, 257),
        tc("layernorm_bwd", FSDP_K_LAYERNORM_BWD, 512, 257),
        tc("softmax_fwd", FSDP_K_SOFTMAX_FWD, 512, 128),
        tc("softmax_bwd", FSDP_K_SOFTMAX_BWD, 512, 128),
        tc("cross_entropy", FSDP_K_CROSS_ENTROPY, 64, 2001),
        tc("cross_entropy", FSDP_K_CROSS_ENTROPY, 64, 2001), /* stages 1 to 3 */
        tc("cross_entropy", FSDP_K_CROSS_ENTROPY, 64, 2001),
        tc("cross_entropy", FSDP_K_CROSS_ENTROPY, 64, 2001),
        tc("bias_grad", FSDP_K_BIAS_GRAD, 512, 257),
        tc("rmsnorm_fwd", FSDP_K_RMSNORM_FWD, 512, 257),
        tc("rmsnorm_bwd", FSDP_K_RMSNORM_BWD, 512, 257),
        tc("swiglu_fwd", FSDP_K_SWIGLU_FWD, 512, 257),
        tc("swiglu_bwd", FSDP_K_SWIGLU_BWD, 512, 257),
        tc("rope_fwd", FSDP_K_ROPE_FWD, 512, 64), /* 64 positions */
    };
    const size_t nbig = sizeof(big) / sizeof(big[0]);

    big[2].f2 = big[3].f2 = 1;                                           /* causal */
    big[5].stage = 1, big[6].stage = 2, big[7].stage = 3, big[7].f1 = 1; /* in place */
    big[nbig - 1].heads = 4, big[nbig - 1].hd = 48, big[nbig - 1].ld = 200;
    for (size_t i = 0; i < nbig; i++)
        for (int d = 0; d < 2; d++)
            for (int mode = 0; mode < MODES; mode += 3) {
                tcase_t c = big[i];
                c.dt = d == 0 ? FSDP_DTYPE_F32 : FSDP_DTYPE_BF16;
                check(&c, mode, test_pool);
            }
}

static void test_summary(void)
{
    fsdp_test_isa_summary(have_isa, compared);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"layernorm", test_layernorm},
        {"softmax", test_softmax},
        {"cross_entropy", test_cross_entropy},
        {"bias_grad", test_bias_grad},
        {"rmsnorm", test_rmsnorm},
        {"swiglu", test_swiglu},
        {"rope", test_rope},
        {"split", test_split},
        {"summary", test_summary},
        {NULL, NULL},
    };
    int rc;

    have_isa[0] = fsdp_sim_elem_set_isa(FSDP_SIM_ELEM_SSE2);
    have_isa[1] = fsdp_sim_elem_set_isa(FSDP_SIM_ELEM_AVX2);
    fsdp_sim_elem_set_isa(FSDP_SIM_ELEM_AUTO);
    test_pool = fsdp_sim_pool_create(3);
    if (test_pool == NULL)
        return 99;
    rc = fsdp_test_run("rows_vec", tests);
    fsdp_sim_pool_destroy(test_pool);
    return rc;
}
