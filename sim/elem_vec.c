/* Vectorized host loops of the element-wise kernels (data mode): adamw, sgd, gelu_fwd,
 * gelu_bwd, add, axpy, relu_fwd, relu_bwd, bias_add, and casts between f32 and bf16, on
 * buffers of f32 and bf16.
 *
 * The scalar bodies of lib/kernels/ stay the definition (the gpu backend launches them); each
 * loop here computes, lane by lane, the same IEEE operations on the same operands in the same
 * order, so its bytes are those of the scalar loop over the body (tests/test_elem_vec.c checks
 * every kind against it with NaNs, infinities, signed zeros and subnormals, at every length and
 * alignment; elem_vec_tmpl.h says how NaN payloads stay the same). One source, elem_vec_tmpl.h, is
 * instantiated twice on x86-64: 4 lanes on the SSE2 baseline and 8 lanes for CPUs with AVX2 (chosen
 * at run time; FMA is never enabled, and -ffp-contract=off would keep it out anyway). Other
 * targets, f16 and anything else run the scalar loop.
 */
#include "config.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "elem_vec.h"
#include "kernels/llama_bodies.h"

#if defined(__GNUC__) && defined(__x86_64__)
#define FSDP_EV_X86 1
#include <immintrin.h>
#else
#define FSDP_EV_X86 0
#endif

typedef void (*fsdp_sim_elem_loop_t)(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p, size_t begin,
                                     size_t end);

#if FSDP_EV_X86
#define EV_W 4
#define EV_SUFFIX sse2
#define EV_ATTR
#define EV_SQRT(v) ((__typeof__(v))_mm_sqrt_ps((__m128)(v)))
#define EV_ANY(m) _mm_movemask_ps((__m128)(m))
#include "elem_vec_tmpl.h"
#include "lanes_vec_tmpl.h"
#undef EV_W
#undef EV_SUFFIX
#undef EV_ATTR
#undef EV_SQRT
#undef EV_ANY

#define EV_W 8
#define EV_SUFFIX avx2
#define EV_ATTR __attribute__((target("avx2")))
#define EV_SQRT(v) ((__typeof__(v))_mm256_sqrt_ps((__m256)(v)))
#define EV_ANY(m) _mm256_movemask_ps((__m256)(m))
#include "elem_vec_tmpl.h"
#include "lanes_vec_tmpl.h"
#undef EV_W
#undef EV_SUFFIX
#undef EV_ATTR
#undef EV_SQRT
#undef EV_ANY
#endif

static atomic_int fsdp_ev_isa_choice = FSDP_SIM_ELEM_AUTO;

static int fsdp_ev_have(fsdp_sim_elem_isa_t isa)
{
    switch (isa) {
    case FSDP_SIM_ELEM_AUTO:
    case FSDP_SIM_ELEM_SCALAR:
        return 1;
#if FSDP_EV_X86
    case FSDP_SIM_ELEM_SSE2:
        return 1;
    case FSDP_SIM_ELEM_AVX2:
        return __builtin_cpu_supports("avx2") ? 1 : 0;
#endif
    default:
        return 0;
    }
}

static fsdp_sim_elem_isa_t fsdp_ev_isa(void)
{
    int choice = atomic_load_explicit(&fsdp_ev_isa_choice, memory_order_relaxed);
    if (choice != FSDP_SIM_ELEM_AUTO)
        return (fsdp_sim_elem_isa_t)choice;
#if FSDP_EV_X86
    return fsdp_ev_have(FSDP_SIM_ELEM_AVX2) ? FSDP_SIM_ELEM_AVX2 : FSDP_SIM_ELEM_SSE2;
#else
    return FSDP_SIM_ELEM_SCALAR;
#endif
}

int fsdp_sim_elem_set_isa(fsdp_sim_elem_isa_t isa)
{
    if (!fsdp_ev_have(isa))
        return 0;
    atomic_store_explicit(&fsdp_ev_isa_choice, (int)isa, memory_order_relaxed);
    return 1;
}

const char *fsdp_sim_elem_isa_name(void)
{
    switch (fsdp_ev_isa()) {
    case FSDP_SIM_ELEM_SSE2:
        return "sse2";
    case FSDP_SIM_ELEM_AVX2:
        return "avx2";
    default:
        return "scalar";
    }
}

/* ---- which descriptors the loops take ---- */

static int fsdp_ev_dtype(fsdp_dtype_t dt)
{
    return dt == FSDP_DTYPE_F32 || dt == FSDP_DTYPE_BF16;
}

/* A launch whose scalars hold a NaN runs the scalar loop (elem_vec_tmpl.h says why). */
static int fsdp_ev_nan(float v)
{
    return v != v;
}

/* A buffer of a descriptor: its bytes, and whether the kernel writes it. */
typedef struct fsdp_ev_buf {
    const void *p;
    size_t bytes;
    int out;
} fsdp_ev_buf_t;

/* The loops read a whole vector of every input before they store a vector of any output, and
 * store the outputs in the body's order: the body's result when two buffers are one (in place,
 * the same start and element size) or apart, not when they overlap otherwise. */
static int fsdp_ev_apart(const fsdp_ev_buf_t *b, int nb, size_t elem)
{
    for (int x = 0; x < nb; x++) {
        for (int y = x + 1; y < nb; y++) {
            uintptr_t px = (uintptr_t)b[x].p, py = (uintptr_t)b[y].p;
            if (!b[x].out && !b[y].out)
                continue;
            if (b[x].bytes == 0 || b[y].bytes == 0)
                continue;
            if (px == py && b[x].bytes == b[y].bytes && elem != 0)
                continue; /* one buffer, element i at the same place in both */
            if (px < py + b[y].bytes && py < px + b[x].bytes)
                return 0;
        }
    }
    return 1;
}

#define EV_BUF(ptr, n, dt, out) ((fsdp_ev_buf_t){(ptr), (n)*fsdp_dtype_size(dt), (out)})

/* Whether the vector loop of a kind gives the body's bytes for this (checked) descriptor, one
 * test per kind with a loop. */
typedef int (*fsdp_ev_takes_t)(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p);

#define F FSDP_DTYPE_F32

static int takes_adamw(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p)
{
    const fsdp_kb_adamw_scalars_t *a = &p->adamw;
    fsdp_ev_buf_t b[4];
    size_t n = p->n;

    if (fsdp_ev_nan(a->decay) || fsdp_ev_nan(a->one_minus_beta1) || fsdp_ev_nan(a->beta2) ||
        fsdp_ev_nan(a->one_minus_beta2) || fsdp_ev_nan(a->neg_step_size) ||
        fsdp_ev_nan(a->bc2_sqrt) || fsdp_ev_nan(a->eps))
        return 0;
    b[0] = EV_BUF(k->u.adamw.param, n, F, 1);
    b[1] = EV_BUF(k->u.adamw.grad, n, F, 0);
    b[2] = EV_BUF(k->u.adamw.exp_avg, n, F, 1);
    b[3] = EV_BUF(k->u.adamw.exp_avg_sq, n, F, 1);
    return fsdp_ev_apart(b, 4, 4);
}

static int takes_sgd(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p)
{
    fsdp_ev_buf_t b[3];
    size_t n = p->n;

    if (fsdp_ev_nan(k->u.sgd.lr) || fsdp_ev_nan(k->u.sgd.momentum) ||
        fsdp_ev_nan(k->u.sgd.dampening) || fsdp_ev_nan(k->u.sgd.weight_decay))
        return 0;
    b[0] = EV_BUF(k->u.sgd.param, n, F, 1);
    b[1] = EV_BUF(k->u.sgd.grad, n, F, 0);
    if (k->u.sgd.momentum == 0.0f)
        return fsdp_ev_apart(b, 2, 4);
    /* the body reads param again after it stores the momentum buffer: apart only */
    b[2] = EV_BUF(k->u.sgd.momentum_buf, n, F, 1);
    return fsdp_ev_apart(b, 3, 4) &&
           (n == 0 || (const void *)k->u.sgd.momentum_buf != (const void *)k->u.sgd.param);
}

#undef F

static int takes_gelu_fwd(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p)
{
    fsdp_ev_buf_t b[2];

    if (!fsdp_ev_dtype(k->u.gelu_fwd.dtype))
        return 0;
    b[0] = EV_BUF(k->u.gelu_fwd.y, p->n, k->u.gelu_fwd.dtype, 1);
    b[1] = EV_BUF(k->u.gelu_fwd.x, p->n, k->u.gelu_fwd.dtype, 0);
    return fsdp_ev_apart(b, 2, 1);
}

static int takes_gelu_bwd(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p)
{
    fsdp_ev_buf_t b[3];

    if (!fsdp_ev_dtype(k->u.gelu_bwd.dtype))
        return 0;
    b[0] = EV_BUF(k->u.gelu_bwd.dx, p->n, k->u.gelu_bwd.dtype, 1);
    b[1] = EV_BUF(k->u.gelu_bwd.dy, p->n, k->u.gelu_bwd.dtype, 0);
    b[2] = EV_BUF(k->u.gelu_bwd.x, p->n, k->u.gelu_bwd.dtype, 0);
    return fsdp_ev_apart(b, 3, 1);
}

static int takes_add(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p)
{
    fsdp_ev_buf_t b[3];

    if (!fsdp_ev_dtype(k->u.add.dtype))
        return 0;
    b[0] = EV_BUF(k->u.add.y, p->n, k->u.add.dtype, 1);
    b[1] = EV_BUF(k->u.add.a, p->n, k->u.add.dtype, 0);
    b[2] = EV_BUF(k->u.add.b, p->n, k->u.add.dtype, 0);
    return fsdp_ev_apart(b, 3, 1);
}

static int takes_axpy(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p)
{
    fsdp_ev_buf_t b[2];

    if (fsdp_ev_nan(k->u.axpy.alpha))
        return 0;
    if (!fsdp_ev_dtype(k->u.axpy.y_dtype) || !fsdp_ev_dtype(k->u.axpy.x_dtype))
        return 0;
    b[0] = EV_BUF(k->u.axpy.y, p->n, k->u.axpy.y_dtype, 1);
    b[1] = EV_BUF(k->u.axpy.x, p->n, k->u.axpy.x_dtype, 0);
    return fsdp_ev_apart(b, 2, 1);
}

static int takes_relu_fwd(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p)
{
    fsdp_ev_buf_t b[2];

    if (!fsdp_ev_dtype(k->u.relu_fwd.y_dtype) || !fsdp_ev_dtype(k->u.relu_fwd.x_dtype))
        return 0;
    b[0] = EV_BUF(k->u.relu_fwd.y, p->n, k->u.relu_fwd.y_dtype, 1);
    b[1] = EV_BUF(k->u.relu_fwd.x, p->n, k->u.relu_fwd.x_dtype, 0);
    return fsdp_ev_apart(b, 2, 1);
}

static int takes_relu_bwd(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p)
{
    fsdp_ev_buf_t b[3];

    if (!fsdp_ev_dtype(k->u.relu_bwd.dx_dtype) || !fsdp_ev_dtype(k->u.relu_bwd.dy_dtype) ||
        !fsdp_ev_dtype(k->u.relu_bwd.y_dtype))
        return 0;
    b[0] = EV_BUF(k->u.relu_bwd.dx, p->n, k->u.relu_bwd.dx_dtype, 1);
    b[1] = EV_BUF(k->u.relu_bwd.dy, p->n, k->u.relu_bwd.dy_dtype, 0);
    b[2] = EV_BUF(k->u.relu_bwd.y, p->n, k->u.relu_bwd.y_dtype, 0);
    return fsdp_ev_apart(b, 3, 1);
}

static int takes_bias_add(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p)
{
    size_t cols = k->u.bias_add.rows > 0 ? k->u.bias_add.cols : 0;
    fsdp_ev_buf_t b[2];

    if (!fsdp_ev_dtype(k->u.bias_add.y_dtype) || !fsdp_ev_dtype(k->u.bias_add.bias_dtype))
        return 0;
    /* bias is read at other indexes than y's: never one buffer with y */
    b[0] = EV_BUF(k->u.bias_add.y, p->n, k->u.bias_add.y_dtype, 1);
    b[1] = EV_BUF(k->u.bias_add.bias, cols, k->u.bias_add.bias_dtype, 0);
    return fsdp_ev_apart(b, 2, 0);
}

static int takes_cast(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p)
{
    (void)p;
    /* the same dtype is a copy (kernels.c's plain loops); the check refused an overlap */
    return fsdp_ev_dtype(k->u.cast.dst_dtype) && fsdp_ev_dtype(k->u.cast.src_dtype) &&
           k->u.cast.dst_dtype != k->u.cast.src_dtype;
}

static const fsdp_ev_takes_t fsdp_ev_takes[FSDP_K_COUNT] = {
    [FSDP_K_ADAMW] = takes_adamw,       [FSDP_K_SGD] = takes_sgd,
    [FSDP_K_GELU_FWD] = takes_gelu_fwd, [FSDP_K_GELU_BWD] = takes_gelu_bwd,
    [FSDP_K_ADD] = takes_add,           [FSDP_K_AXPY] = takes_axpy,
    [FSDP_K_RELU_FWD] = takes_relu_fwd, [FSDP_K_RELU_BWD] = takes_relu_bwd,
    [FSDP_K_BIAS_ADD] = takes_bias_add, [FSDP_K_CAST] = takes_cast,
};

int fsdp_sim_elem_vec(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p, size_t begin, size_t end)
{
#if FSDP_EV_X86
    fsdp_sim_elem_isa_t isa = fsdp_ev_isa();
    fsdp_sim_elem_loop_t loop;

    if (isa == FSDP_SIM_ELEM_SCALAR)
        return 0;
    loop = isa == FSDP_SIM_ELEM_AVX2 ? fsdp_ev_loop_avx2(k->kind) : fsdp_ev_loop_sse2(k->kind);
    if (loop == NULL || !fsdp_ev_takes[k->kind](k, p))
        return 0;
    loop(k, p, begin, end);
    return 1;
#else
    (void)k;
    (void)p;
    (void)begin;
    (void)end;
    return 0;
#endif
}

/* ---- the fused attention's rows (lanes_vec_tmpl.h) ---- */

int fsdp_sim_lanes_vec(const fsdp_kernel_t *k, int pass, size_t r0, size_t r1)
{
#if FSDP_EV_X86
    fsdp_sim_elem_isa_t isa = fsdp_ev_isa();
    fsdp_dtype_t dt;
    size_t hd;

    if (isa == FSDP_SIM_ELEM_SCALAR)
        return 0;
    if (k->kind == FSDP_K_ATTENTION_FWD) {
        dt = k->u.attention_fwd.dtype;
        hd = k->u.attention_fwd.head_dim;
    } else if (k->kind == FSDP_K_ATTENTION_BWD) {
        dt = k->u.attention_bwd.dtype;
        hd = k->u.attention_bwd.head_dim;
    } else {
        return 0;
    }
    if (!fsdp_ev_dtype(dt))
        return 0;
    if (isa == FSDP_SIM_ELEM_AVX2 && hd % 8 == 0)
        fsdp_ev_lanes_vec_rows_avx2(k, pass, r0, r1);
    else if (hd % 4 == 0)
        fsdp_ev_lanes_vec_rows_sse2(k, pass, r0, r1);
    else
        return 0;
    return 1;
#else
    (void)k;
    (void)pass;
    (void)r0;
    (void)r1;
    return 0;
#endif
}
