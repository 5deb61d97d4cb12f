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
 *
 * The same for the row kernels, the column sums and the Llama kernels' passes (rows_vec_tmpl.h,
 * lanes_vec_tmpl.h). Which kind has vector loops for which of its parts is the vec column of
 * kernel.h's list of kinds, from which the table of each kind's check and loops is generated
 * (fsdp_ev_kinds, below).
 */
#include "config.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "elem_vec.h"
#include "kernels/llama_bodies.h"

#if defined(__GNUC__) && defined(__x86_64__)
#define FSDP_EV_X86 1
#include <immintrin.h>
#else
#define FSDP_EV_X86 0
#endif

/* The parts of a descriptor that vector loops may run: the values of kernel.h's vec column. */
enum { FSDP_EV_ELEMS = 1, FSDP_EV_ROWS = 2, FSDP_EV_COLS = 4, FSDP_EV_PASSES = 8 };

/* A part of a checked descriptor that the vector loops are asked to run, and what its scalar
 * loop is given besides the descriptor. */
typedef struct fsdp_ev_job {
    unsigned what;           /* FSDP_EV_ELEMS, _ROWS, _COLS or _PASSES */
    const fsdp_kb_prep_t *p; /* ELEMS: the launch's scalars */
    float ce_scale;          /* ROWS: cross_entropy's (fsdp_kb_prep_t's) */
    int pass;                /* PASSES: which */
} fsdp_ev_job_t;

/* The vector loops of a kind over indices [b, e) of a part (elements, rows, column blocks or a
 * pass's indices) that its check took: one function per member and instance, named after the
 * member (adamw_sse2, rope_avx2), which the instances' templates define. */
typedef void (*fsdp_ev_loop_t)(const fsdp_kernel_t *k, const fsdp_ev_job_t *job, size_t b,
                               size_t e);

/* Whether the forward's rows may be computed two at a time (elem_vec.c, below). */
static int fsdp_ev_attn_fwd_pairs(const fsdp_kernel_t *k);

#if FSDP_EV_X86
#define EV_W 4
#define EV_SUFFIX sse2
#define EV_ATTR
#define EV_SQRT(v) ((__typeof__(v))_mm_sqrt_ps((__m128)(v)))
#define EV_ANY(m) _mm_movemask_ps((__m128)(m))
#include "elem_vec_tmpl.h"
#include "lanes_vec_tmpl.h"
#include "rows_vec_tmpl.h"
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
#define EV_NARROWER sse2 /* the instance of what this one's vectors are too wide for */
#include "elem_vec_tmpl.h"
#include "lanes_vec_tmpl.h"
#include "rows_vec_tmpl.h"
#undef EV_W
#undef EV_SUFFIX
#undef EV_ATTR
#undef EV_SQRT
#undef EV_ANY
#undef EV_NARROWER
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

/* Whether n elements of p hold no NaN: the inputs every row reads (a weight, a bias). */
static int fsdp_ev_no_nan(const void *p, fsdp_dtype_t dt, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float v = fsdp_kb_load(p, dt, i);
        if (v != v)
            return 0;
    }
    return 1;
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

/* Whether the vector loops of a kind give the scalar loops' bytes for a part of this checked
 * descriptor: f32 or bf16, no NaN in the launch's scalars nor in what every row reads, each
 * output in place over an input or apart from every other buffer. One per member of a kind with
 * vector loops (takes_adamw, takes_rope), asked only about the parts of its vec column. */
typedef int (*fsdp_ev_takes_t)(const fsdp_kernel_t *k, const fsdp_ev_job_t *job);

/* -- elements (elem_vec_tmpl.h) -- */

#define F FSDP_DTYPE_F32

static int takes_adamw(const fsdp_kernel_t *k, const fsdp_ev_job_t *job)
{
    const fsdp_kb_adamw_scalars_t *a = &job->p->adamw;
    fsdp_ev_buf_t b[4];
    size_t n = job->p->n;

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

static int takes_sgd(const fsdp_kernel_t *k, const fsdp_ev_job_t *job)
{
    fsdp_ev_buf_t b[3];
    size_t n = job->p->n;

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

static int takes_gelu_fwd(const fsdp_kernel_t *k, const fsdp_ev_job_t *job)
{
    fsdp_ev_buf_t b[2];

    if (!fsdp_ev_dtype(k->u.gelu_fwd.dtype))
        return 0;
    b[0] = EV_BUF(k->u.gelu_fwd.y, job->p->n, k->u.gelu_fwd.dtype, 1);
    b[1] = EV_BUF(k->u.gelu_fwd.x, job->p->n, k->u.gelu_fwd.dtype, 0);
    return fsdp_ev_apart(b, 2, 1);
}

static int takes_gelu_bwd(const fsdp_kernel_t *k, const fsdp_ev_job_t *job)
{
    fsdp_ev_buf_t b[3];

    if (!fsdp_ev_dtype(k->u.gelu_bwd.dtype))
        return 0;
    b[0] = EV_BUF(k->u.gelu_bwd.dx, job->p->n, k->u.gelu_bwd.dtype, 1);
    b[1] = EV_BUF(k->u.gelu_bwd.dy, job->p->n, k->u.gelu_bwd.dtype, 0);
    b[2] = EV_BUF(k->u.gelu_bwd.x, job->p->n, k->u.gelu_bwd.dtype, 0);
    return fsdp_ev_apart(b, 3, 1);
}

static int takes_add(const fsdp_kernel_t *k, const fsdp_ev_job_t *job)
{
    fsdp_ev_buf_t b[3];

    if (!fsdp_ev_dtype(k->u.add.dtype))
        return 0;
    b[0] = EV_BUF(k->u.add.y, job->p->n, k->u.add.dtype, 1);
    b[1] = EV_BUF(k->u.add.a, job->p->n, k->u.add.dtype, 0);
    b[2] = EV_BUF(k->u.add.b, job->p->n, k->u.add.dtype, 0);
    return fsdp_ev_apart(b, 3, 1);
}

static int takes_axpy(const fsdp_kernel_t *k, const fsdp_ev_job_t *job)
{
    fsdp_ev_buf_t b[2];

    if (fsdp_ev_nan(k->u.axpy.alpha))
        return 0;
    if (!fsdp_ev_dtype(k->u.axpy.y_dtype) || !fsdp_ev_dtype(k->u.axpy.x_dtype))
        return 0;
    b[0] = EV_BUF(k->u.axpy.y, job->p->n, k->u.axpy.y_dtype, 1);
    b[1] = EV_BUF(k->u.axpy.x, job->p->n, k->u.axpy.x_dtype, 0);
    return fsdp_ev_apart(b, 2, 1);
}

static int takes_relu_fwd(const fsdp_kernel_t *k, const fsdp_ev_job_t *job)
{
    fsdp_ev_buf_t b[2];

    if (!fsdp_ev_dtype(k->u.relu_fwd.y_dtype) || !fsdp_ev_dtype(k->u.relu_fwd.x_dtype))
        return 0;
    b[0] = EV_BUF(k->u.relu_fwd.y, job->p->n, k->u.relu_fwd.y_dtype, 1);
    b[1] = EV_BUF(k->u.relu_fwd.x, job->p->n, k->u.relu_fwd.x_dtype, 0);
    return fsdp_ev_apart(b, 2, 1);
}

static int takes_relu_bwd(const fsdp_kernel_t *k, const fsdp_ev_job_t *job)
{
    fsdp_ev_buf_t b[3];

    if (!fsdp_ev_dtype(k->u.relu_bwd.dx_dtype) || !fsdp_ev_dtype(k->u.relu_bwd.dy_dtype) ||
        !fsdp_ev_dtype(k->u.relu_bwd.y_dtype))
        return 0;
    b[0] = EV_BUF(k->u.relu_bwd.dx, job->p->n, k->u.relu_bwd.dx_dtype, 1);
    b[1] = EV_BUF(k->u.relu_bwd.dy, job->p->n, k->u.relu_bwd.dy_dtype, 0);
    b[2] = EV_BUF(k->u.relu_bwd.y, job->p->n, k->u.relu_bwd.y_dtype, 0);
    return fsdp_ev_apart(b, 3, 1);
}

static int takes_bias_add(const fsdp_kernel_t *k, const fsdp_ev_job_t *job)
{
    size_t cols = k->u.bias_add.rows > 0 ? k->u.bias_add.cols : 0;
    fsdp_ev_buf_t b[2];

    if (!fsdp_ev_dtype(k->u.bias_add.y_dtype) || !fsdp_ev_dtype(k->u.bias_add.bias_dtype))
        return 0;
    /* bias is read at other indexes than y's: never one buffer with y */
    b[0] = EV_BUF(k->u.bias_add.y, job->p->n, k->u.bias_add.y_dtype, 1);
    b[1] = EV_BUF(k->u.bias_add.bias, cols, k->u.bias_add.bias_dtype, 0);
    return fsdp_ev_apart(b, 2, 0);
}

static int takes_cast(const fsdp_kernel_t *k, const fsdp_ev_job_t *job)
{
    (void)job;
    /* the same dtype is a copy (kernels.c's plain loops); the check refused an overlap */
    return fsdp_ev_dtype(k->u.cast.dst_dtype) && fsdp_ev_dtype(k->u.cast.src_dtype) &&
           k->u.cast.dst_dtype != k->u.cast.src_dtype;
}

/* -- rows and column sums (rows_vec_tmpl.h) -- */

#define D(dt) fsdp_ev_dtype(dt)

static int takes_layernorm_fwd(const fsdp_kernel_t *k, const fsdp_ev_job_t *job)
{
    const fsdp_dtype_t dt = k->u.layernorm_fwd.dtype;
    const size_t rows = k->u.layernorm_fwd.rows, n = k->u.layernorm_fwd.cols;
    fsdp_ev_buf_t b[6];

    (void)job;
    if (!D(dt) || fsdp_ev_nan(k->u.layernorm_fwd.eps) ||
        !fsdp_ev_no_nan(k->u.layernorm_fwd.weight, dt, n) ||
        !fsdp_ev_no_nan(k->u.layernorm_fwd.bias, dt, n))
        return 0;
    b[0] = EV_BUF(k->u.layernorm_fwd.y, rows * n, dt, 1);
    b[1] = EV_BUF(k->u.layernorm_fwd.x, rows * n, dt, 0);
    b[2] = EV_BUF(k->u.layernorm_fwd.weight, n, dt, 0);
    b[3] = EV_BUF(k->u.layernorm_fwd.bias, n, dt, 0);
    b[4] = EV_BUF(k->u.layernorm_fwd.mean, k->u.layernorm_fwd.mean ? rows : 0, FSDP_DTYPE_F32, 1);
    b[5] = EV_BUF(k->u.layernorm_fwd.rstd, k->u.layernorm_fwd.rstd ? rows : 0, FSDP_DTYPE_F32, 1);
    return fsdp_ev_apart(b, 6, 1);
}

/* its input gradient's rows, or its weight and bias gradients' column sums */
static int takes_layernorm_bwd(const fsdp_kernel_t *k, const fsdp_ev_job_t *job)
{
    const fsdp_dtype_t dt = k->u.layernorm_bwd.dtype;
    const size_t rows = k->u.layernorm_bwd.rows, n = k->u.layernorm_bwd.cols;
    fsdp_ev_buf_t b[6];

    if (!D(dt))
        return 0;
    if (job->what == FSDP_EV_COLS) {
        b[0] = EV_BUF(k->u.layernorm_bwd.dweight, k->u.layernorm_bwd.dweight ? n : 0, dt, 1);
        b[1] = EV_BUF(k->u.layernorm_bwd.dbias, k->u.layernorm_bwd.dbias ? n : 0, dt, 1);
        b[2] = EV_BUF(k->u.layernorm_bwd.dy, rows * n, dt, 0);
        b[3] = EV_BUF(k->u.layernorm_bwd.x, rows * n, dt, 0);
        return fsdp_ev_apart(b, 4, 0);
    }
    if (!fsdp_ev_no_nan(k->u.layernorm_bwd.weight, dt, n))
        return 0;
    b[0] = EV_BUF(k->u.layernorm_bwd.dx, rows * n, dt, 1);
    b[1] = EV_BUF(k->u.layernorm_bwd.dy, rows * n, dt, 0);
    b[2] = EV_BUF(k->u.layernorm_bwd.x, rows * n, dt, 0);
    b[3] = EV_BUF(k->u.layernorm_bwd.weight, n, dt, 0);
    b[4] = EV_BUF(k->u.layernorm_bwd.mean, rows, FSDP_DTYPE_F32, 0);
    b[5] = EV_BUF(k->u.layernorm_bwd.rstd, rows, FSDP_DTYPE_F32, 0);
    return fsdp_ev_apart(b, 6, 0);
}

static int takes_bias_grad(const fsdp_kernel_t *k, const fsdp_ev_job_t *job)
{
    const size_t rows = k->u.bias_grad.rows, n = k->u.bias_grad.cols;
    fsdp_ev_buf_t b[2];

    (void)job;
    if (!D(k->u.bias_grad.dy_dtype) || !D(k->u.bias_grad.dbias_dtype))
        return 0;
    b[0] = EV_BUF(k->u.bias_grad.dbias, n, k->u.bias_grad.dbias_dtype, 1);
    b[1] = EV_BUF(k->u.bias_grad.dy, rows * n, k->u.bias_grad.dy_dtype, 0);
    return fsdp_ev_apart(b, 2, 0);
}

static int takes_softmax_fwd(const fsdp_kernel_t *k, const fsdp_ev_job_t *job)
{
    const fsdp_dtype_t dt = k->u.softmax_fwd.dtype;
    const size_t n = k->u.softmax_fwd.rows * k->u.softmax_fwd.cols;
    fsdp_ev_buf_t b[2];

    (void)job;
    if (!D(dt) || fsdp_ev_nan(k->u.softmax_fwd.scale) || fsdp_ev_nan(k->u.softmax_fwd.divisor))
        return 0;
    b[0] = EV_BUF(k->u.softmax_fwd.y, n, dt, 1);
    b[1] = EV_BUF(k->u.softmax_fwd.x, n, dt, 0);
    return fsdp_ev_apart(b, 2, 1);
}

static int takes_softmax_bwd(const fsdp_kernel_t *k, const fsdp_ev_job_t *job)
{
    const fsdp_dtype_t dt = k->u.softmax_bwd.dtype;
    const size_t n = k->u.softmax_bwd.rows * k->u.softmax_bwd.cols;
    fsdp_ev_buf_t b[3];

    (void)job;
    if (!D(dt) || fsdp_ev_nan(k->u.softmax_bwd.scale) || fsdp_ev_nan(k->u.softmax_bwd.divisor))
        return 0;
    b[0] = EV_BUF(k->u.softmax_bwd.dx, n, dt, 1);
    b[1] = EV_BUF(k->u.softmax_bwd.dy, n, dt, 0);
    b[2] = EV_BUF(k->u.softmax_bwd.y, n, dt, 0);
    return fsdp_ev_apart(b, 3, 1);
}

static int takes_cross_entropy(const fsdp_kernel_t *k, const fsdp_ev_job_t *job)
{
    const fsdp_dtype_t dt = k->u.cross_entropy.dtype;
    const size_t rows = k->u.cross_entropy.rows, n = rows * k->u.cross_entropy.vocab;
    const int stage = k->u.cross_entropy.stage, writes = stage == 0 || stage == 3;
    fsdp_ev_buf_t b[5];

    if (!D(dt) || fsdp_ev_nan(job->ce_scale))
        return 0;
    /* stages 1 and 2 write only their stats; dlogits and losses are stage 3's (and 0's) */
    b[0] = EV_BUF(k->u.cross_entropy.logits, n, dt, 0);
    b[1] = EV_BUF(k->u.cross_entropy.targets, rows, FSDP_DTYPE_I32, 0);
    b[2] = EV_BUF(k->u.cross_entropy.stats, stage != 0 ? 3 * rows : 0, FSDP_DTYPE_F32, 1);
    b[3] = EV_BUF(k->u.cross_entropy.dlogits, writes && k->u.cross_entropy.dlogits ? n : 0, dt, 1);
    b[4] = EV_BUF(k->u.cross_entropy.losses, writes ? rows : 0, FSDP_DTYPE_F32, 1);
    return fsdp_ev_apart(b, 5, 1);
}

/* -- the Llama kernels' passes (rows_vec_tmpl.h, lanes_vec_tmpl.h) -- */

static int takes_rmsnorm_fwd(const fsdp_kernel_t *k, const fsdp_ev_job_t *job)
{
    const fsdp_dtype_t dt = k->u.rmsnorm_fwd.dtype;
    const size_t rows = k->u.rmsnorm_fwd.rows, n = k->u.rmsnorm_fwd.cols;
    fsdp_ev_buf_t b[4];

    (void)job;
    if (!D(dt) || !fsdp_ev_no_nan(k->u.rmsnorm_fwd.weight, dt, n))
        return 0;
    b[0] = EV_BUF(k->u.rmsnorm_fwd.y, rows * n, dt, 1);
    b[1] = EV_BUF(k->u.rmsnorm_fwd.x, rows * n, dt, 0);
    b[2] = EV_BUF(k->u.rmsnorm_fwd.weight, n, dt, 0);
    b[3] = EV_BUF(k->u.rmsnorm_fwd.rstd, k->u.rmsnorm_fwd.rstd ? rows : 0, FSDP_DTYPE_F32, 1);
    return fsdp_ev_apart(b, 4, 1);
}

/* pass 0, the weight gradient's column blocks; pass 1, the input gradient's rows */
static int takes_rmsnorm_bwd(const fsdp_kernel_t *k, const fsdp_ev_job_t *job)
{
    const fsdp_dtype_t dt = k->u.rmsnorm_bwd.dtype;
    const size_t rows = k->u.rmsnorm_bwd.rows, n = k->u.rmsnorm_bwd.cols;
    const int pass = job->pass;
    fsdp_ev_buf_t b[5];

    if (!D(dt) || (pass == 1 && !fsdp_ev_no_nan(k->u.rmsnorm_bwd.weight, dt, n)))
        return 0;
    b[0] = pass == 0 ? EV_BUF(k->u.rmsnorm_bwd.dweight, n, dt, 1)
                     : EV_BUF(k->u.rmsnorm_bwd.dx, rows * n, dt, 1);
    b[1] = EV_BUF(k->u.rmsnorm_bwd.dy, rows * n, dt, 0);
    b[2] = EV_BUF(k->u.rmsnorm_bwd.x, rows * n, dt, 0);
    b[3] = EV_BUF(k->u.rmsnorm_bwd.rstd, rows, FSDP_DTYPE_F32, 0);
    b[4] = EV_BUF(k->u.rmsnorm_bwd.weight, pass == 1 ? n : 0, dt, 0);
    return fsdp_ev_apart(b, 5, 0);
}

static int takes_swiglu_fwd(const fsdp_kernel_t *k, const fsdp_ev_job_t *job)
{
    const fsdp_dtype_t dt = k->u.swiglu_fwd.dtype;
    const size_t n = k->u.swiglu_fwd.n;
    fsdp_ev_buf_t b[3];

    (void)job;
    if (!D(dt))
        return 0;
    b[0] = EV_BUF(k->u.swiglu_fwd.y, n, dt, 1);
    b[1] = EV_BUF(k->u.swiglu_fwd.gate, n, dt, 0);
    b[2] = EV_BUF(k->u.swiglu_fwd.up, n, dt, 0);
    return fsdp_ev_apart(b, 3, 1);
}

static int takes_swiglu_bwd(const fsdp_kernel_t *k, const fsdp_ev_job_t *job)
{
    const fsdp_dtype_t dt = k->u.swiglu_bwd.dtype;
    const size_t n = k->u.swiglu_bwd.n;
    fsdp_ev_buf_t b[5];

    (void)job;
    if (!D(dt))
        return 0;
    b[0] = EV_BUF(k->u.swiglu_bwd.dgate, n, dt, 1);
    b[1] = EV_BUF(k->u.swiglu_bwd.dup, n, dt, 1);
    b[2] = EV_BUF(k->u.swiglu_bwd.dy, n, dt, 0);
    b[3] = EV_BUF(k->u.swiglu_bwd.gate, n, dt, 0);
    b[4] = EV_BUF(k->u.swiglu_bwd.up, n, dt, 0);
    return fsdp_ev_apart(b, 5, 1);
}

/* rope_fwd and rope_bwd */
static int takes_rope(const fsdp_kernel_t *k, const fsdp_ev_job_t *job)
{
    const fsdp_dtype_t dt = k->u.rope.dtype;
    const size_t n = k->u.rope.rows * k->u.rope.ld, tab = k->u.rope.seq * k->u.rope.head_dim / 2;
    fsdp_ev_buf_t b[4];

    (void)job;
    if (!D(dt))
        return 0;
    b[0] = EV_BUF(k->u.rope.y, n, dt, 1);
    b[1] = EV_BUF(k->u.rope.x, n, dt, 0);
    b[2] = EV_BUF(k->u.rope.cos, tab, FSDP_DTYPE_F32, 0);
    b[3] = EV_BUF(k->u.rope.sin, tab, FSDP_DTYPE_F32, 0);
    return fsdp_ev_apart(b, 4, 1);
}

/* The attention rows' accumulators are whole vectors of head_dim: 4 lanes (SSE2) or more, and an
 * instance whose vectors do not divide head_dim hands the rows to a narrower one
 * (lanes_vec_tmpl.h). */
static int takes_attention_fwd(const fsdp_kernel_t *k, const fsdp_ev_job_t *job)
{
    (void)job;
    return D(k->u.attention_fwd.dtype) && k->u.attention_fwd.head_dim % 4 == 0;
}

static int takes_attention_bwd(const fsdp_kernel_t *k, const fsdp_ev_job_t *job)
{
    (void)job;
    return D(k->u.attention_bwd.dtype) && k->u.attention_bwd.head_dim % 4 == 0;
}

/* ---- the vector path of each kind, generated from kernel.h's list by its vec column ---- */

typedef struct fsdp_ev_kind {
    unsigned parts;        /* the parts its loops run (FSDP_EV_*), 0 for none */
    fsdp_ev_takes_t takes; /* its check, takes_<member> */
    fsdp_ev_loop_t sse2;   /* its loops of 4 lanes, <member>_sse2 */
    fsdp_ev_loop_t avx2;   /* of 8 lanes, <member>_avx2 */
} fsdp_ev_kind_t;

/* A row's vec column as an fsdp_ev_kind_t: the parts it names, and the functions named after
 * the row's member (none for NONE) */

#if FSDP_EV_X86
#define FSDP_EV_LOOPS_(m) m##_sse2, m##_avx2
#else
#define FSDP_EV_LOOPS_(m) NULL, NULL
#endif
#define FSDP_EV_KIND_(parts, m) (parts), takes_##m, FSDP_EV_LOOPS_(m)

#define FSDP_EV_VEC_NONE(m) 0, NULL, NULL, NULL
#define FSDP_EV_VEC_ELEMS(m) FSDP_EV_KIND_(FSDP_EV_ELEMS, m)
#define FSDP_EV_VEC_ROWS(m) FSDP_EV_KIND_(FSDP_EV_ROWS, m)
#define FSDP_EV_VEC_COLS(m) FSDP_EV_KIND_(FSDP_EV_COLS, m)
#define FSDP_EV_VEC_COLS_ROWS(m) FSDP_EV_KIND_(FSDP_EV_COLS | FSDP_EV_ROWS, m)
#define FSDP_EV_VEC_PASSES(m) FSDP_EV_KIND_(FSDP_EV_PASSES, m)

static const fsdp_ev_kind_t fsdp_ev_kinds[FSDP_K_COUNT] = {
#define FSDP_EV_KIND_ROW_(NAME, name, member, dtypes, exec, cost, vec) {FSDP_EV_VEC_##vec(member)},
    FSDP_FOREACH_KERNEL(FSDP_EV_KIND_ROW_)
#undef FSDP_EV_KIND_ROW_
};

/* Indices [b, e) of a part of the checked descriptor k by its kind's vector loops, on the ISA
 * chosen, and 1; 0, having written nothing, when its vec column leaves the part out, its check
 * does not take it or the ISA is the scalar loop's. */
static int fsdp_ev_run(const fsdp_kernel_t *k, const fsdp_ev_job_t *job, size_t b, size_t e)
{
    const fsdp_sim_elem_isa_t isa = fsdp_ev_isa();
    const fsdp_ev_kind_t *v;

    if (isa == FSDP_SIM_ELEM_SCALAR || (unsigned)k->kind >= FSDP_K_COUNT)
        return 0;
    v = &fsdp_ev_kinds[k->kind];
    if ((v->parts & job->what) == 0 || !v->takes(k, job))
        return 0;
    (isa == FSDP_SIM_ELEM_AVX2 ? v->avx2 : v->sse2)(k, job, b, e);
    return 1;
}

int fsdp_sim_elem_vec(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p, size_t begin, size_t end)
{
    const fsdp_ev_job_t job = {.what = FSDP_EV_ELEMS, .p = p};
    return fsdp_ev_run(k, &job, begin, end);
}

int fsdp_sim_rows_vec(const fsdp_kernel_t *k, float ce_scale, size_t r0, size_t r1)
{
    const fsdp_ev_job_t job = {.what = FSDP_EV_ROWS, .ce_scale = ce_scale};
    return fsdp_ev_run(k, &job, r0, r1);
}

int fsdp_sim_colsum_vec(const fsdp_kernel_t *k, size_t b0, size_t b1)
{
    const fsdp_ev_job_t job = {.what = FSDP_EV_COLS};
    return fsdp_ev_run(k, &job, b0, b1);
}

int fsdp_sim_pass_vec(const fsdp_kernel_t *k, int pass, size_t b, size_t e)
{
    const fsdp_ev_job_t job = {.what = FSDP_EV_PASSES, .pass = pass};
    return fsdp_ev_run(k, &job, b, e);
}

/* ---- the attention backward's passes 1 and 2 in one walk (lanes_vec_tmpl.h) ---- */

/* A matrix at p of rows rows of ld elements of es bytes, n of each used. */
typedef struct fsdp_ev_mat {
    const void *p;
    size_t rows, ld, n;
} fsdp_ev_mat_t;

/* Whether two matrices share no byte; or, when cols, no element either as other columns of rows
 * of one ld (GPT-2's dq, dk and dv in one dqkv). */
static int fsdp_ev_mats_apart(fsdp_ev_mat_t a, fsdp_ev_mat_t b, size_t es, int cols)
{
    const uintptr_t pa = (uintptr_t)a.p, pb = (uintptr_t)b.p;
    const size_t ea = ((a.rows - 1) * a.ld + a.n) * es, eb = ((b.rows - 1) * b.ld + b.n) * es;
    size_t d, r;

    if (pa + ea <= pb || pb + eb <= pa)
        return 1;
    if (!cols || a.ld != b.ld || (pb > pa ? pb - pa : pa - pb) % es != 0)
        return 0;
    d = (pb > pa ? pb - pa : pa - pb) / es % a.ld;
    r = pb > pa ? d : (a.ld - d) % a.ld; /* b's first column in a's rows */
    return a.n <= r && r + b.n <= a.ld;
}

/* A pair of rows reads the later row's q and every v row before the earlier row writes its o and
 * lse: the same bytes when these are apart from those (o in place over q, each row its own). */
static int fsdp_ev_attn_fwd_pairs(const fsdp_kernel_t *k)
{
    const size_t rows = k->u.attention_fwd.batch * k->u.attention_fwd.seq;
    const size_t hd = k->u.attention_fwd.head_dim, H = k->u.attention_fwd.heads;
    const size_t es = fsdp_dtype_size(k->u.attention_fwd.dtype);
    fsdp_ev_mat_t o, q, v, lse;

    if (rows == 0)
        return 0;
    o = (fsdp_ev_mat_t){k->u.attention_fwd.o, rows, k->u.attention_fwd.ldo, H * hd};
    q = (fsdp_ev_mat_t){k->u.attention_fwd.q, rows, k->u.attention_fwd.ldq, H * hd};
    v = (fsdp_ev_mat_t){k->u.attention_fwd.v, rows, k->u.attention_fwd.ldv,
                        k->u.attention_fwd.kv_heads * hd};
    lse = (fsdp_ev_mat_t){k->u.attention_fwd.lse, 1, rows * H * 4 / es, rows * H * 4 / es};
    if (!fsdp_ev_mats_apart(o, v, es, 0) ||
        (!fsdp_ev_mats_apart(o, q, es, 0) && (o.p != q.p || o.ld != q.ld)))
        return 0;
    return lse.p == NULL ||
           (fsdp_ev_mats_apart(lse, q, es, 0) && fsdp_ev_mats_apart(lse, v, es, 0));
}

size_t fsdp_sim_attn_bwd_units(const fsdp_kernel_t *k, int pass)
{
    size_t rows, es, hd, H, K;
    fsdp_ev_mat_t out[3], in[6];

    if (fsdp_ev_isa() == FSDP_SIM_ELEM_SCALAR || pass != 1 || k->kind != FSDP_K_ATTENTION_BWD)
        return 0;
    rows = k->u.attention_bwd.batch * k->u.attention_bwd.seq;
    hd = k->u.attention_bwd.head_dim, H = k->u.attention_bwd.heads;
    K = k->u.attention_bwd.kv_heads;
    if (!D(k->u.attention_bwd.dtype) || hd % 4 != 0 || rows == 0)
        return 0;
    es = fsdp_dtype_size(k->u.attention_bwd.dtype);
    out[0] = (fsdp_ev_mat_t){k->u.attention_bwd.dq, rows, k->u.attention_bwd.ldq, H * hd};
    out[1] = (fsdp_ev_mat_t){k->u.attention_bwd.dk, rows, k->u.attention_bwd.ldk, K * hd};
    out[2] = (fsdp_ev_mat_t){k->u.attention_bwd.dv, rows, k->u.attention_bwd.ldv, K * hd};
    in[0] = (fsdp_ev_mat_t){k->u.attention_bwd.q, rows, k->u.attention_bwd.ldq, H * hd};
    in[1] = (fsdp_ev_mat_t){k->u.attention_bwd.k, rows, k->u.attention_bwd.ldk, K * hd};
    in[2] = (fsdp_ev_mat_t){k->u.attention_bwd.v, rows, k->u.attention_bwd.ldv, K * hd};
    in[3] = (fsdp_ev_mat_t){k->u.attention_bwd.dout, rows, k->u.attention_bwd.ldo, H * hd};
    /* lse and delta, f32 [batch, heads, seq], as one row of es-byte elements */
    in[4] = (fsdp_ev_mat_t){k->u.attention_bwd.lse, 1, rows * H * 4 / es, rows * H * 4 / es};
    in[5] = (fsdp_ev_mat_t){k->u.attention_bwd.delta, 1, rows * H * 4 / es, rows * H * 4 / es};
    for (int o = 0; o < 3; o++) {
        for (int i = 0; i < 6; i++)
            if (!fsdp_ev_mats_apart(out[o], in[i], es, 0))
                return 0;
        for (int o2 = o + 1; o2 < 3; o2++)
            if (!fsdp_ev_mats_apart(out[o], out[o2], es, 1))
                return 0;
    }
    return k->u.attention_bwd.batch * K;
}

void fsdp_sim_attn_bwd_run(const fsdp_kernel_t *k, size_t u0, size_t u1)
{
    const size_t T = k->u.attention_bwd.seq, hd = k->u.attention_bwd.head_dim;
    const size_t group = k->u.attention_bwd.heads / k->u.attention_bwd.kv_heads;
    int done = 0;

#if FSDP_EV_X86
    if (fsdp_ev_isa() == FSDP_SIM_ELEM_AVX2 && hd % 8 == 0)
        done = fsdp_ev_attn_bwd_units_avx2(k, u0, u1);
    else
        done = fsdp_ev_attn_bwd_units_sse2(k, u0, u1);
#endif
    (void)hd;
    if (done)
        return;
    /* no workspace: the units' dq rows, then their key rows, as the passes run them */
    if (!fsdp_sim_pass_vec(k, 1, u0 * group * T, u1 * group * T))
        fsdp_sim_pass_range(k, 1, u0 * group * T, u1 * group * T);
    if (!fsdp_sim_pass_vec(k, 2, u0 * T, u1 * T))
        fsdp_sim_pass_range(k, 2, u0 * T, u1 * T);
}

#undef D
