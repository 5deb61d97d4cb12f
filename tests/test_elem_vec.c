/* The vectorized element-wise loops of the sim (sim/elem_vec.c) against the scalar loop over
 * the bodies of lib/kernels/ (fsdp_kb_elem, the code the gpu backend runs; the sim's path with
 * FSDP_SIM_ELEM_SCALAR), byte for byte: every vectorized
 * kind and dtype, inputs with NaNs (quiet and signaling, either sign, any payload), infinities,
 * signed zeros, subnormals, huge and tiny values; lengths 0 to 1023 around the vector widths;
 * starts off every alignment; buffers in place, apart, and overlapping (which the loops must
 * leave to the scalar body); each available ISA (SSE2, AVX2), and through a rank's pool of
 * worker threads. The whole allocation of every buffer is compared, guards included, so a
 * store out of bounds fails too. */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernel_elem.h"
#include "sim_kernels.h"
#include "test_util.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rng_state = x;
    return x;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* One value in nan_in of them is a NaN: a vector with a NaN among its inputs goes to the
 * scalar loop, so most runs have few or none, for the vector arithmetic to meet the rest. */
static unsigned nan_in = 300;

/* A value of a random kind: the specials, the edges of the exp inside gelu, and the ordinary */
static float rand_value(void)
{
    uint32_t r = (uint32_t)rng(), sign = (uint32_t)(rng() & 1u) << 31;
    uint32_t mant = r & 0x7fffffu;

    if (nan_in > 0 && rng() % nan_in == 0) /* NaN: quiet or signaling, any payload */
        return bits_f32(sign | 0x7f800000u | (mant != 0 ? mant : 1u));
    switch (rng() % 12) {
    case 0: /* any bits but a NaN's */
        return (r & 0x7f800000u) == 0x7f800000u ? bits_f32(r & 0xff7fffffu) : bits_f32(r);
    case 1:
        return bits_f32(sign | 0x7f800000u);
    case 2:
        return bits_f32(sign);
    case 3: /* subnormal */
        return bits_f32(sign | (mant != 0 ? mant : 1u));
    case 4: /* huge */
        return bits_f32(sign | ((uint32_t)(240 + rng() % 15) << 23) | mant);
    case 5: /* tiny normal */
        return bits_f32(sign | ((uint32_t)(1 + rng() % 20) << 23) | mant);
    case 6: /* a power of two */
        return bits_f32(sign | ((uint32_t)(rng() % 255) << 23));
    case 7: /* around the exp's overflow and subnormal edges inside gelu (|x| ~ 10 to 12) */
        return (sign ? -1.0f : 1.0f) * (9.5f + 3.0f * (float)(r >> 8) / 16777216.0f);
    case 8: /* any float of magnitude 2^-30 .. 2^30 */
        return bits_f32(sign | ((uint32_t)(97 + rng() % 60) << 23) | mant);
    default: /* [-12, 12) */
        return -12.0f + 24.0f * (float)(r >> 8) / 16777216.0f;
    }
}

#define MAXB 4     /* buffers of a kernel */
#define GUARD 64   /* bytes before and after every buffer */
#define MAXOFF 3   /* start offsets, in elements */

/* One buffer of a test: its dtype, and either its own allocation or a place in an earlier one */
typedef struct tbuf {
    fsdp_dtype_t dt;
    int alias; /* -1: its own; j: inside buffer j's allocation */
    long shift; /* with alias: elements after buffer j's start */
} tbuf_t;

typedef struct tcase {
    fsdp_kernel_kind_t kind;
    int nb;
    tbuf_t b[MAXB];
    /* the scalars */
    float a0, a1, a2, a3, a4;
    int64_t step;
    int i0, i1;
    size_t cols; /* bias_add: columns (n is rows x cols) */
} tcase_t;

/* k from the buffers' pointers */
static void build(const tcase_t *c, void *const *p, size_t n, fsdp_kernel_t *k)
{
    memset(k, 0, sizeof(*k));
    k->kind = c->kind;
    switch (c->kind) {
    case FSDP_K_ADAMW:
        k->u.adamw.param = p[0], k->u.adamw.grad = p[1], k->u.adamw.exp_avg = p[2];
        k->u.adamw.exp_avg_sq = p[3], k->u.adamw.n = n;
        k->u.adamw.lr = c->a0, k->u.adamw.beta1 = c->a1, k->u.adamw.beta2 = c->a2;
        k->u.adamw.eps = c->a3, k->u.adamw.weight_decay = c->a4, k->u.adamw.step = c->step;
        break;
    case FSDP_K_SGD:
        k->u.sgd.param = p[0], k->u.sgd.grad = p[1];
        k->u.sgd.momentum_buf = c->a1 != 0.0f ? p[2] : NULL, k->u.sgd.n = n;
        k->u.sgd.lr = c->a0, k->u.sgd.momentum = c->a1, k->u.sgd.dampening = c->a2;
        k->u.sgd.weight_decay = c->a3, k->u.sgd.nesterov = c->i0, k->u.sgd.first_step = c->i1;
        break;
    case FSDP_K_GELU_FWD:
        k->u.gelu_fwd.y = p[0], k->u.gelu_fwd.x = p[1], k->u.gelu_fwd.n = n;
        k->u.gelu_fwd.dtype = c->b[0].dt;
        break;
    case FSDP_K_GELU_BWD:
        k->u.gelu_bwd.dx = p[0], k->u.gelu_bwd.dy = p[1], k->u.gelu_bwd.x = p[2];
        k->u.gelu_bwd.n = n, k->u.gelu_bwd.dtype = c->b[0].dt;
        break;
    case FSDP_K_ADD:
        k->u.add.y = p[0], k->u.add.a = p[1], k->u.add.b = p[2], k->u.add.n = n;
        k->u.add.dtype = c->b[0].dt;
        break;
    case FSDP_K_AXPY:
        k->u.axpy.y = p[0], k->u.axpy.x = p[1], k->u.axpy.n = n, k->u.axpy.alpha = c->a0;
        k->u.axpy.y_dtype = c->b[0].dt, k->u.axpy.x_dtype = c->b[1].dt;
        break;
    case FSDP_K_RELU_FWD:
        k->u.relu_fwd.y = p[0], k->u.relu_fwd.x = p[1], k->u.relu_fwd.n = n;
        k->u.relu_fwd.y_dtype = c->b[0].dt, k->u.relu_fwd.x_dtype = c->b[1].dt;
        break;
    case FSDP_K_RELU_BWD:
        k->u.relu_bwd.dx = p[0], k->u.relu_bwd.dy = p[1], k->u.relu_bwd.y = p[2];
        k->u.relu_bwd.n = n, k->u.relu_bwd.dx_dtype = c->b[0].dt;
        k->u.relu_bwd.dy_dtype = c->b[1].dt, k->u.relu_bwd.y_dtype = c->b[2].dt;
        break;
    case FSDP_K_BIAS_ADD:
        k->u.bias_add.y = p[0], k->u.bias_add.bias = p[1];
        k->u.bias_add.cols = c->cols, k->u.bias_add.rows = n / c->cols;
        k->u.bias_add.y_dtype = c->b[0].dt, k->u.bias_add.bias_dtype = c->b[1].dt;
        break;
    case FSDP_K_CAST:
        k->u.cast.dst = p[0], k->u.cast.src = p[1], k->u.cast.n = n;
        k->u.cast.dst_dtype = c->b[0].dt, k->u.cast.src_dtype = c->b[1].dt;
        break;
    default:
        break;
    }
}

/* The scalar loop over every element: the definition. (Not a loop of this file's own over
 * fsdp_kb_elem: where two NaNs meet, which one comes out depends on how the compiler ordered
 * the operands in each copy of the body; elem_vec_tmpl.h.) */
static void run_body(const fsdp_kernel_t *k)
{
    CU_ASSERT_FATAL(fsdp_sim_elem_set_isa(FSDP_SIM_ELEM_SCALAR));
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(k), FSDP_OK);
}

static void fill_random(unsigned char *raw, size_t bytes, fsdp_dtype_t dt)
{
    size_t i = 0;
    for (; i + 4 <= bytes; i += 4) {
        float v = rand_value();
        if (dt == FSDP_DTYPE_BF16) { /* a random bf16 of each kind twice: the upper halves */
            uint32_t u;
            memcpy(&u, &v, 4);
            u = (u & 0xffff0000u) | (uint32_t)(fsdp_kb_f32_bits(rand_value()) >> 16);
            memcpy(raw + i, &u, 4);
        } else {
            memcpy(raw + i, &v, 4);
        }
    }
    for (; i < bytes; i++)
        raw[i] = (unsigned char)rng();
}

static int have_isa[2];
static const fsdp_sim_elem_isa_t isas[2] = {FSDP_SIM_ELEM_SSE2, FSDP_SIM_ELEM_AVX2};
static long compared; /* kernels compared, for the summary */

/* Runs c at length n with every buffer starting `off` elements into its allocation (buffer i
 * shifted by i more, so that the buffers are misaligned to each other too), on the scalar body
 * and on each ISA (and on the pool, when given), and compares every allocation. */
static void check_case(const tcase_t *c, size_t n, size_t off, fsdp_sim_pool_t *pool)
{
    unsigned char *ref[MAXB] = {0}, *got[MAXB] = {0}, *orig[MAXB] = {0};
    size_t bytes[MAXB] = {0};
    void *pr[MAXB], *pg[MAXB];
    fsdp_kernel_t k;

    for (int b = 0; b < c->nb; b++) {
        if (c->b[b].alias >= 0)
            continue;
        bytes[b] = 2 * GUARD + (n + MAXOFF + MAXB + 8) * 4;
        orig[b] = malloc(bytes[b]);
        ref[b] = malloc(bytes[b]);
        got[b] = malloc(bytes[b]);
        CU_ASSERT_FATAL(orig[b] != NULL && ref[b] != NULL && got[b] != NULL);
        fill_random(orig[b], bytes[b], c->b[b].dt);
    }
    for (int b = 0; b < c->nb; b++) {
        size_t es = fsdp_dtype_size(c->b[b].dt);
        if (c->b[b].alias >= 0) {
            int j = c->b[b].alias;
            pr[b] = (char *)pr[j] + c->b[b].shift * (long)es;
            pg[b] = (char *)pg[j] + c->b[b].shift * (long)es;
        } else {
            pr[b] = ref[b] + GUARD + (off + (size_t)b) * es;
            pg[b] = got[b] + GUARD + (off + (size_t)b) * es;
        }
    }
    for (int b = 0; b < c->nb; b++)
        if (orig[b] != NULL)
            memcpy(ref[b], orig[b], bytes[b]);
    build(c, pr, n, &k);
    run_body(&k);

    for (int v = 0; v < 3; v++) {
        if (v < 2 && !have_isa[v])
            continue;
        if (v == 2 && pool == NULL)
            continue;
        for (int b = 0; b < c->nb; b++)
            if (orig[b] != NULL)
                memcpy(got[b], orig[b], bytes[b]);
        build(c, pg, n, &k);
        if (v < 2) {
            CU_ASSERT_FATAL(fsdp_sim_elem_set_isa(isas[v]));
            CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec(&k), FSDP_OK);
        } else {
            CU_ASSERT_FATAL(fsdp_sim_elem_set_isa(FSDP_SIM_ELEM_AUTO));
            CU_ASSERT_EQUAL_FATAL(fsdp_sim_kernel_exec_par(&k, pool, NULL), FSDP_OK);
        }
        for (int b = 0; b < c->nb; b++) {
            if (orig[b] == NULL)
                continue;
            if (memcmp(ref[b], got[b], bytes[b]) != 0) {
                size_t at = 0;
                uint32_t wr = 0, wg = 0, wo = 0;
                while (ref[b][at] == got[b][at])
                    at++;
                at &= ~(size_t)1;
                memcpy(&wr, ref[b] + at, at + 4 <= bytes[b] ? 4 : 2);
                memcpy(&wg, got[b] + at, at + 4 <= bytes[b] ? 4 : 2);
                memcpy(&wo, orig[b] + at, at + 4 <= bytes[b] ? 4 : 2);
                fprintf(stderr,
                        "\n%s: n %zu off %zu %s: buffer %d differs at byte %zu: body %08x, "
                        "loop %08x (was %08x)\n",
                        fsdp_kernel_name(c->kind), n, off,
                        v == 2 ? "pool" : v == 0 ? "sse2" : "avx2", b, at, (unsigned)wr,
                        (unsigned)wg, (unsigned)wo);
                CU_FAIL("vector loop differs from the scalar body");
            }
        }
        compared++;
    }
    fsdp_sim_elem_set_isa(FSDP_SIM_ELEM_AUTO);
    for (int b = 0; b < c->nb; b++)
        free(orig[b]), free(ref[b]), free(got[b]);
}

static const size_t lengths[] = {0, 1, 3, 7, 8, 9, 15, 16, 17, 1000, 1023};

/* c at every length and offset, with fresh random inputs for each: no NaN, NaNs now and
 * then, NaNs often */
static void check_all(const tcase_t *c)
{
    static const unsigned nans[] = {0, 300, 12};
    for (size_t l = 0; l < sizeof(lengths) / sizeof(lengths[0]); l++)
        for (size_t off = 0; off <= MAXOFF; off++)
            for (int rep = 0; rep < 3; rep++) {
                nan_in = nans[rep];
                check_case(c, lengths[l], off, NULL);
            }
    nan_in = 300;
}

#define OWN(dt) {(dt), -1, 0}
#define AS(j, dt) {(dt), (j), 0}
#define F32 FSDP_DTYPE_F32
#define BF16 FSDP_DTYPE_BF16
#define F16 FSDP_DTYPE_F16

static void init_isas(void)
{
    have_isa[0] = fsdp_sim_elem_set_isa(FSDP_SIM_ELEM_SSE2);
    have_isa[1] = fsdp_sim_elem_set_isa(FSDP_SIM_ELEM_AVX2);
    fsdp_sim_elem_set_isa(FSDP_SIM_ELEM_AUTO);
}

static void test_adamw(void)
{
    /* lr, beta1, beta2, eps, weight decay, step: the lerp's two sides (1 - beta1 < 0.5 and
     * >= 0.5), no decay, a late step, eps 0 */
    const float s[][5] = {{1e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f},
                          {3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f},
                          {0.1f, 0.3f, 0.5f, 1e-3f, 0.0f},
                          {2.0f, 0.5f, 0.99f, 0.0f, 0.5f}};
    const int64_t steps[] = {1, 1000, 3, 7};
    for (int j = 0; j < 4; j++) {
        tcase_t c = {FSDP_K_ADAMW, 4, {OWN(F32), OWN(F32), OWN(F32), OWN(F32)}, s[j][0], s[j][1],
                     s[j][2], s[j][3], s[j][4], steps[j], 0, 0, 0};
        check_all(&c);
    }
    /* one buffer for two roles: the grad in place of the param, exp_avg as exp_avg_sq */
    tcase_t a = {FSDP_K_ADAMW, 4, {OWN(F32), AS(0, F32), OWN(F32), AS(2, F32)}, 1e-3f, 0.9f,
                 0.999f, 1e-8f, 1e-2f, 5, 0, 0, 0};
    check_all(&a);
    /* overlapping (the scalar body, element after element) */
    tcase_t o = {FSDP_K_ADAMW, 4, {OWN(F32), {F32, 0, 1}, OWN(F32), OWN(F32)}, 1e-3f, 0.9f,
                 0.999f, 1e-8f, 1e-2f, 5, 0, 0, 0};
    check_all(&o);
}

static void test_sgd(void)
{
    /* lr, momentum, dampening, weight decay; nesterov, first step */
    const float s[][4] = {{0.1f, 0.0f, 0.0f, 0.0f},
                          {0.01f, 0.9f, 0.0f, 1e-2f},
                          {0.5f, 0.9f, 0.1f, 0.0f},
                          {0.05f, 0.5f, 0.0f, 1e-4f}};
    for (int j = 0; j < 4; j++) {
        for (int f = 0; f < 4; f++) {
            tcase_t c = {FSDP_K_SGD, 3, {OWN(F32), OWN(F32), OWN(F32)}, s[j][0], s[j][1],
                         s[j][2], s[j][3], 0, 0, f & 1, f >> 1, 0};
            check_all(&c);
        }
    }
    /* the momentum buffer as the param: the body reads the param after storing it */
    tcase_t a = {FSDP_K_SGD, 3, {OWN(F32), OWN(F32), AS(0, F32)}, 0.1f, 0.9f, 0.0f, 1e-2f, 0, 0,
                 1, 0, 0};
    check_all(&a);
    tcase_t g = {FSDP_K_SGD, 3, {OWN(F32), AS(0, F32), OWN(F32)}, 0.1f, 0.9f, 0.0f, 1e-2f, 0, 0,
                 0, 0, 0};
    check_all(&g);
}

static void test_gelu(void)
{
    const fsdp_dtype_t dts[] = {F32, BF16, F16};
    for (int d = 0; d < 3; d++) {
        fsdp_dtype_t dt = dts[d];
        tcase_t f = {FSDP_K_GELU_FWD, 2, {OWN(dt), OWN(dt)}, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        tcase_t fi = {FSDP_K_GELU_FWD, 2, {OWN(dt), AS(0, dt)}, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        tcase_t fo = {FSDP_K_GELU_FWD, 2, {OWN(dt), {dt, 0, 2}}, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        tcase_t b = {FSDP_K_GELU_BWD, 3, {OWN(dt), OWN(dt), OWN(dt)}, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        tcase_t bi = {FSDP_K_GELU_BWD, 3, {OWN(dt), AS(0, dt), OWN(dt)}, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        tcase_t bo = {FSDP_K_GELU_BWD, 3, {OWN(dt), OWN(dt), {dt, 0, -3}}, 0, 0, 0, 0, 0, 0, 0, 0,
                      0};
        check_all(&f), check_all(&fi), check_all(&fo);
        check_all(&b), check_all(&bi), check_all(&bo);
    }
}

static void test_add(void)
{
    const fsdp_dtype_t dts[] = {F32, BF16, F16};
    for (int d = 0; d < 3; d++) {
        fsdp_dtype_t dt = dts[d];
        tcase_t c = {FSDP_K_ADD, 3, {OWN(dt), OWN(dt), OWN(dt)}, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        tcase_t ia = {FSDP_K_ADD, 3, {OWN(dt), AS(0, dt), OWN(dt)}, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        tcase_t ib = {FSDP_K_ADD, 3, {OWN(dt), OWN(dt), AS(0, dt)}, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        tcase_t iab = {FSDP_K_ADD, 3, {OWN(dt), AS(0, dt), AS(0, dt)}, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        tcase_t o = {FSDP_K_ADD, 3, {OWN(dt), {dt, 0, 5}, OWN(dt)}, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        check_all(&c), check_all(&ia), check_all(&ib), check_all(&iab), check_all(&o);
    }
}

static void test_axpy(void)
{
    const fsdp_dtype_t dts[] = {F32, BF16, F16};
    const float alphas[] = {0.5f, -3.0f, 1e30f, 0.0f};
    for (int y = 0; y < 3; y++)
        for (int x = 0; x < 3; x++)
            for (int a = 0; a < 4; a++) {
                tcase_t c = {FSDP_K_AXPY, 2, {OWN(dts[y]), OWN(dts[x])}, alphas[a], 0, 0, 0, 0, 0, 0,
                             0, 0};
                check_all(&c);
            }
    tcase_t i = {FSDP_K_AXPY, 2, {OWN(F32), AS(0, F32)}, 2.0f, 0, 0, 0, 0, 0, 0, 0, 0};
    tcase_t o = {FSDP_K_AXPY, 2, {OWN(F32), {F32, 0, 1}}, 2.0f, 0, 0, 0, 0, 0, 0, 0, 0};
    check_all(&i), check_all(&o);
}

static void test_relu(void)
{
    const fsdp_dtype_t dts[] = {F32, BF16, F16};
    for (int y = 0; y < 3; y++)
        for (int x = 0; x < 3; x++) {
            tcase_t f = {FSDP_K_RELU_FWD, 2, {OWN(dts[y]), OWN(dts[x])}, 0, 0, 0, 0, 0, 0, 0, 0, 0};
            check_all(&f);
            for (int z = 0; z < 3; z++) {
                tcase_t b = {FSDP_K_RELU_BWD, 3, {OWN(dts[y]), OWN(dts[x]), OWN(dts[z])}, 0, 0, 0, 0,
                             0, 0, 0, 0, 0};
                check_all(&b);
            }
        }
    tcase_t fi = {FSDP_K_RELU_FWD, 2, {OWN(F32), AS(0, F32)}, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    tcase_t bi = {FSDP_K_RELU_BWD, 3, {OWN(BF16), AS(0, BF16), OWN(BF16)}, 0, 0, 0, 0, 0, 0, 0, 0,
                  0};
    check_all(&fi), check_all(&bi);
}

static void test_bias_add(void)
{
    const fsdp_dtype_t dts[] = {F32, BF16, F16};
    const size_t cols[] = {1, 3, 7, 8, 9, 33};
    const size_t rows[] = {0, 1, 3, 5};
    for (int y = 0; y < 3; y++)
        for (int b = 0; b < 3; b++)
            for (int cc = 0; cc < 6; cc++)
                for (int r = 0; r < 4; r++)
                    for (size_t off = 0; off <= MAXOFF; off++) {
                        tcase_t c = {FSDP_K_BIAS_ADD, 2, {OWN(dts[y]), OWN(dts[b])}, 0, 0, 0, 0, 0,
                                     0, 0, 0, cols[cc]};
                        check_case(&c, rows[r] * cols[cc], off, NULL);
                    }
    /* the bias inside y: read at other indexes than the ones written */
    tcase_t in = {FSDP_K_BIAS_ADD, 2, {OWN(F32), AS(0, F32)}, 0, 0, 0, 0, 0, 0, 0, 0, 8};
    check_case(&in, 64, 0, NULL);
    check_case(&in, 8 * 9, 1, NULL);
}

static void test_cast(void)
{
    const fsdp_dtype_t dts[] = {F32, BF16, F16};
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < 3; s++) {
            tcase_t c = {FSDP_K_CAST, 2, {OWN(dts[d]), OWN(dts[s])}, 0, 0, 0, 0, 0, 0, 0, 0, 0};
            check_all(&c);
        }
}

/* Large kernels split across a pool of 3 threads (blocks of whole vectors, and a tail) */
static void test_pool(void)
{
    fsdp_sim_pool_t *pool = fsdp_sim_pool_create(3);
    const size_t n[] = {(size_t)1 << 16, 200003};
    tcase_t cs[] = {
        {FSDP_K_ADAMW, 4, {OWN(F32), OWN(F32), OWN(F32), OWN(F32)}, 1e-3f, 0.9f, 0.999f, 1e-8f,
         1e-2f, 2, 0, 0, 0},
        {FSDP_K_GELU_FWD, 2, {OWN(F32), OWN(F32)}, 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {FSDP_K_GELU_BWD, 3, {OWN(BF16), AS(0, BF16), OWN(BF16)}, 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {FSDP_K_ADD, 3, {OWN(F32), AS(0, F32), OWN(F32)}, 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {FSDP_K_CAST, 2, {OWN(BF16), OWN(F32)}, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    };
    CU_ASSERT_FATAL(pool != NULL);
    for (size_t c = 0; c < sizeof(cs) / sizeof(cs[0]); c++)
        for (int j = 0; j < 2; j++)
            check_case(&cs[c], n[j], (size_t)j, pool);
    fsdp_sim_pool_destroy(pool);
}

static void test_summary(void)
{
    printf("\n  sse2 %s, avx2 %s; %ld kernel runs compared with the scalar bodies ",
           have_isa[0] ? "tested" : "not available", have_isa[1] ? "tested" : "not available",
           compared);
    CU_ASSERT(compared > 0);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"adamw", test_adamw},   {"sgd", test_sgd},   {"gelu", test_gelu},
        {"add", test_add},       {"axpy", test_axpy}, {"relu", test_relu},
        {"bias_add", test_bias_add}, {"cast", test_cast}, {"pool", test_pool},
        {"summary", test_summary}, {NULL, NULL},
    };
    init_isas();
    return fsdp_test_run("elem_vec", tests);
}
