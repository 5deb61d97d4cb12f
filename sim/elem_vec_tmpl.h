/* One instance of the vectorized element-wise loops of elem_vec.c, included once per vector
 * width: a loop per kind whose vec column (kernel.h) is ELEMS, named after its member. The
 * includer defines:
 *   EV_W       floats per vector (4: SSE2, 8: AVX2)
 *   EV_SUFFIX  the suffix of this instance's names (sse2, avx2)
 *   EV_ATTR    the function attributes of this instance (its target)
 *   EV_SQRT(v) the correctly rounded square root of each lane (sqrtps, not an rsqrt estimate)
 *   EV_ANY(m)  nonzero when any lane of the mask m is set
 *   EV_NARROWER in an instance wider than 4 lanes, the 4 lanes' suffix (lanes_vec_tmpl.h)
 *
 * Each lane computes what the shared scalar body computes for its element (kernel_elem.h,
 * elementwise.h, nn_bodies.h), as the same sequence of IEEE operations on the same operands in
 * the same order: vector +, -, *, / and sqrt round each lane as the scalar instruction does,
 * and the build's -ffp-contract=off keeps every multiply and add apart (no target here enables
 * FMA anyway). Where a body branches on an element, both sides are computed and the lane takes
 * its side with a bit mask. The elements after the last whole vector run through the scalar
 * loop itself (fsdp_sim_elem_range, kernels.c).
 *
 * NaNs: when both operands of an operation are NaNs, x86 returns the first one (quieted), and
 * the compiler may order the operands of a + or a * either way, in each compiled copy of a
 * body; so two NaNs that meet could give another payload here than in the scalar loop.
 * Without a NaN among its inputs, though, an element only meets the NaNs that invalid
 * operations make, all the one default NaN, and every order gives the same bits. So a vector
 * whose inputs hold a NaN (rare: a diverged step) is left to the scalar loop, and the callers
 * leave a launch whose scalars are NaN to it too. Kinds that only move or select a value
 * (relu, cast) need neither. tests/test_elem_vec.c compares every loop with the scalar loop,
 * byte for byte. */

#define EV_CAT2(a, b) a##_##b
#define EV_CAT(a, b) EV_CAT2(a, b)
#define EV(name) EV_CAT(name, EV_SUFFIX)

#define vf EV(vf)
#define vi EV(vi)
#define vu EV(vu)
#define vh EV(vh)

typedef float vf __attribute__((vector_size(EV_W * 4)));
typedef int32_t vi __attribute__((vector_size(EV_W * 4)));
typedef uint32_t vu __attribute__((vector_size(EV_W * 4)));
typedef uint16_t vh __attribute__((vector_size(EV_W * 2)));

#define EV_INLINE EV_ATTR static inline __attribute__((always_inline))

EV_INLINE vf EV(splat)(float c)
{
    vf v;
    for (int j = 0; j < EV_W; j++)
        v[j] = c;
    return v;
}

/* m ? a : b, lane by lane (m: all ones or all zeros, as a comparison gives) */
EV_INLINE vf EV(sel)(vi m, vf a, vf b)
{
    return (vf)((m & (vi)a) | (~m & (vi)b));
}

EV_INLINE vi EV(seli)(vi m, vi a, vi b)
{
    return (m & a) | (~m & b);
}

/* fsdp_kb_load and fsdp_kb_store of elements [i, i + EV_W), for f32 and bf16 (the callers
 * leave every other dtype to the scalar loop) */
EV_INLINE vf EV(ld)(const void *p, fsdp_dtype_t dt, size_t i)
{
    if (dt == FSDP_DTYPE_BF16) {
        vh h;
        memcpy(&h, (const uint16_t *)p + i, sizeof(h));
        return (vf)(__builtin_convertvector(h, vu) << 16);
    }
    vf v;
    memcpy(&v, (const float *)p + i, sizeof(v));
    return v;
}

/* fsdp_kb_f32_to_bf16: a NaN stays a quiet NaN, the rest rounds to nearest even */
EV_INLINE void EV(st)(void *p, fsdp_dtype_t dt, size_t i, vf v)
{
    if (dt == FSDP_DTYPE_BF16) {
        vu x = (vu)v;
        vi nan = (vi)(x & 0x7fffffffu) > 0x7f800000; /* both sides below 2^31 */
        vu r = (x + (0x7fffu + ((x >> 16) & 1u))) >> 16;
        r = (vu)EV(seli)(nan, (vi)((x >> 16) | 0x0040u), (vi)r);
        vh h = __builtin_convertvector(r, vh);
        memcpy((uint16_t *)p + i, &h, sizeof(h));
        return;
    }
    memcpy((float *)p + i, &v, sizeof(v));
}

/* fsdp_kb_exp_poly */
EV_INLINE vf EV(exp_poly)(vf r)
{
    vf r2 = r * r, r4 = r2 * r2;
    vf p01 = 1.0f + r, p23 = 0.5f + r * 1.66666672e-1f;
    vf p45 = 4.16666679e-2f + r * 8.33333377e-3f, p67 = 1.38888892e-3f + r * 1.98412701e-4f;
    return (p01 + r2 * p23) + r4 * (p45 + r2 * p67);
}

/* fsdp_kb_expf. The lanes that return early there (NaN, overflow, underflow) compute on 0
 * instead of x (no conversion out of int range) and take their value at the end. */
EV_INLINE vf EV(expf)(vf x)
{
    const vf zero = EV(splat)(0.0f);
    vi nan = x != x, over = x > 88.7228393f, under = x < -103.972084f;
    vf xs = EV(sel)(nan | over | under, zero, x);
    vi n = __builtin_convertvector(
        xs * 1.44269502f + EV(sel)(xs < 0.0f, EV(splat)(-0.5f), EV(splat)(0.5f)), vi);
    vf nf = __builtin_convertvector(n, vf);
    vf r = (xs - nf * FSDP_KB_LN2_HI) - nf * FSDP_KB_LN2_LO;
    vf p = EV(exp_poly)(r);
    vi big = n > 127, small;

    p = EV(sel)(big, p * 2.0f, p);
    n = EV(seli)(big, n - 1, n);
    small = n < -126;
    p = EV(sel)(small, p * 5.42101086e-20f, p);
    n = EV(seli)(small, n + 64, n);
    p = p * (vf)((vu)(n + 127) << 23);
    p = EV(sel)(nan, x + x, p);
    p = EV(sel)(over, EV(splat)(fsdp_kb_inff()), p);
    return EV(sel)(under, zero, p);
}

/* fsdp_kb_gelu */
EV_INLINE vf EV(gelu)(vf x)
{
    vf u = FSDP_KB_GELU_K * (x + FSDP_KB_GELU_A * (x * x) * x);
    return x / (1.0f + EV(expf)(-2.0f * u));
}

/* fsdp_kb_gelu_grad */
EV_INLINE vf EV(gelu_grad)(vf dy, vf x)
{
    vf x2 = x * x;
    vf u = FSDP_KB_GELU_K * (x + FSDP_KB_GELU_A * x2 * x);
    vf s = 1.0f / (1.0f + EV(expf)(-2.0f * u));
    vf t = s * (1.0f - s);
    vf du = FSDP_KB_GELU_K * (1.0f + 3.0f * FSDP_KB_GELU_A * x2);
    return dy * EV(sel)(t == 0.0f, s, s + 2.0f * x * t * du);
}

/* ---- the loops: whole vectors, then the scalar loop for the rest ---- */

/* the vector at i by the scalar loop (its inputs hold a NaN) */
#define EV_BODY(KIND, k, p, i) fsdp_sim_elem_range((k), (p), (i), (i) + EV_W)

#define EV_NAN(v) ((v) != (v))

#define EV_TAIL(KIND, k, p, i) fsdp_sim_elem_range((k), (p), (i), end)

EV_ATTR static void EV(adamw)(const fsdp_kernel_t *k, const fsdp_ev_job_t *job, size_t begin,
                              size_t end)
{
    const fsdp_kb_prep_t *p = job->p;
    float *param = k->u.adamw.param, *exp_avg = k->u.adamw.exp_avg;
    float *exp_avg_sq = k->u.adamw.exp_avg_sq;
    const float *grad = k->u.adamw.grad;
    const fsdp_kb_adamw_scalars_t s = p->adamw;
    const float w = s.one_minus_beta1, one_minus_w = 1.0f - w;
    size_t i = begin;

    for (; i + EV_W <= end; i += EV_W) {
        vf pa = EV(ld)(param, FSDP_DTYPE_F32, i), g = EV(ld)(grad, FSDP_DTYPE_F32, i);
        vf ea = EV(ld)(exp_avg, FSDP_DTYPE_F32, i), es = EV(ld)(exp_avg_sq, FSDP_DTYPE_F32, i);
        if (EV_ANY(EV_NAN(pa) | EV_NAN(g) | EV_NAN(ea) | EV_NAN(es))) {
            EV_BODY(FSDP_K_ADAMW, k, p, i);
            continue;
        }
        vf pd = pa * s.decay;
        /* fsdp_kb_lerp: its branch is on the weight, the same for every element */
        vf m = w < 0.5f ? ea + w * (g - ea) : g - (g - ea) * one_minus_w;
        vf v = es * s.beta2 + s.one_minus_beta2 * g * g;
        vf denom = EV_SQRT(v) / s.bc2_sqrt + s.eps;
        /* stored in the body's order, should two of the buffers be one */
        EV(st)(param, FSDP_DTYPE_F32, i, pd + s.neg_step_size * m / denom);
        EV(st)(exp_avg, FSDP_DTYPE_F32, i, m);
        EV(st)(exp_avg_sq, FSDP_DTYPE_F32, i, v);
    }
    EV_TAIL(FSDP_K_ADAMW, k, p, i);
}

EV_ATTR static void EV(sgd)(const fsdp_kernel_t *k, const fsdp_ev_job_t *job, size_t begin,
                            size_t end)
{
    const fsdp_kb_prep_t *p = job->p;
    float *param = k->u.sgd.param, *buf = k->u.sgd.momentum_buf;
    const float *grad = k->u.sgd.grad;
    const float lr = k->u.sgd.lr, momentum = k->u.sgd.momentum;
    const float dampening = k->u.sgd.dampening, weight_decay = k->u.sgd.weight_decay;
    const int nesterov = k->u.sgd.nesterov, first_step = k->u.sgd.first_step;
    const int read_buf = momentum != 0.0f && !first_step;
    size_t i = begin;

    /* fsdp_kb_sgd: every branch is on the launch's scalars */
    for (; i + EV_W <= end; i += EV_W) {
        vf pa = EV(ld)(param, FSDP_DTYPE_F32, i), g = EV(ld)(grad, FSDP_DTYPE_F32, i);
        vf bo = read_buf ? EV(ld)(buf, FSDP_DTYPE_F32, i) : pa;
        if (EV_ANY(EV_NAN(pa) | EV_NAN(g) | EV_NAN(bo))) {
            EV_BODY(FSDP_K_SGD, k, p, i);
            continue;
        }
        if (weight_decay != 0.0f)
            g = g + weight_decay * pa;
        if (momentum != 0.0f) {
            vf b = first_step ? g : bo * momentum + (1.0f - dampening) * g;
            EV(st)(buf, FSDP_DTYPE_F32, i, b);
            g = nesterov ? g + momentum * b : b;
        }
        EV(st)(param, FSDP_DTYPE_F32, i, pa + (-lr) * g);
    }
    EV_TAIL(FSDP_K_SGD, k, p, i);
}

EV_ATTR static void EV(gelu_fwd)(const fsdp_kernel_t *k, const fsdp_ev_job_t *job, size_t begin,
                                 size_t end)
{
    const fsdp_kb_prep_t *p = job->p;
    const fsdp_dtype_t dt = k->u.gelu_fwd.dtype;
    size_t i = begin;

    for (; i + EV_W <= end; i += EV_W) {
        vf x = EV(ld)(k->u.gelu_fwd.x, dt, i);
        if (EV_ANY(EV_NAN(x)))
            EV_BODY(FSDP_K_GELU_FWD, k, p, i);
        else
            EV(st)(k->u.gelu_fwd.y, dt, i, EV(gelu)(x));
    }
    EV_TAIL(FSDP_K_GELU_FWD, k, p, i);
}

EV_ATTR static void EV(gelu_bwd)(const fsdp_kernel_t *k, const fsdp_ev_job_t *job, size_t begin,
                                 size_t end)
{
    const fsdp_kb_prep_t *p = job->p;
    const fsdp_dtype_t dt = k->u.gelu_bwd.dtype;
    size_t i = begin;

    for (; i + EV_W <= end; i += EV_W) {
        vf dy = EV(ld)(k->u.gelu_bwd.dy, dt, i), x = EV(ld)(k->u.gelu_bwd.x, dt, i);
        if (EV_ANY(EV_NAN(dy) | EV_NAN(x)))
            EV_BODY(FSDP_K_GELU_BWD, k, p, i);
        else
            EV(st)(k->u.gelu_bwd.dx, dt, i, EV(gelu_grad)(dy, x));
    }
    EV_TAIL(FSDP_K_GELU_BWD, k, p, i);
}

EV_ATTR static void EV(add)(const fsdp_kernel_t *k, const fsdp_ev_job_t *job, size_t begin,
                            size_t end)
{
    const fsdp_kb_prep_t *p = job->p;
    const fsdp_dtype_t dt = k->u.add.dtype;
    size_t i = begin;

    for (; i + EV_W <= end; i += EV_W) {
        vf a = EV(ld)(k->u.add.a, dt, i), b = EV(ld)(k->u.add.b, dt, i);
        if (EV_ANY(EV_NAN(a) & EV_NAN(b))) /* one NaN alone passes through either order */
            EV_BODY(FSDP_K_ADD, k, p, i);
        else
            EV(st)(k->u.add.y, dt, i, a + b);
    }
    EV_TAIL(FSDP_K_ADD, k, p, i);
}

EV_ATTR static void EV(axpy)(const fsdp_kernel_t *k, const fsdp_ev_job_t *job, size_t begin,
                             size_t end)
{
    const fsdp_kb_prep_t *p = job->p;
    const fsdp_dtype_t ydt = k->u.axpy.y_dtype, xdt = k->u.axpy.x_dtype;
    const float alpha = k->u.axpy.alpha;
    size_t i = begin;

    for (; i + EV_W <= end; i += EV_W) {
        vf y = EV(ld)(k->u.axpy.y, ydt, i), x = EV(ld)(k->u.axpy.x, xdt, i);
        if (EV_ANY(EV_NAN(y) | EV_NAN(x))) /* alpha * x may be a NaN of its own */
            EV_BODY(FSDP_K_AXPY, k, p, i);
        else
            EV(st)(k->u.axpy.y, ydt, i, y + alpha * x);
    }
    EV_TAIL(FSDP_K_AXPY, k, p, i);
}

EV_ATTR static void EV(relu_fwd)(const fsdp_kernel_t *k, const fsdp_ev_job_t *job, size_t begin,
                                 size_t end)
{
    const fsdp_kb_prep_t *p = job->p;
    const fsdp_dtype_t ydt = k->u.relu_fwd.y_dtype, xdt = k->u.relu_fwd.x_dtype;
    const vf zero = EV(splat)(0.0f);
    size_t i = begin;

    for (; i + EV_W <= end; i += EV_W) {
        vf x = EV(ld)(k->u.relu_fwd.x, xdt, i);
        EV(st)(k->u.relu_fwd.y, ydt, i, EV(sel)(x > 0.0f, x, zero));
    }
    EV_TAIL(FSDP_K_RELU_FWD, k, p, i);
}

EV_ATTR static void EV(relu_bwd)(const fsdp_kernel_t *k, const fsdp_ev_job_t *job, size_t begin,
                                 size_t end)
{
    const fsdp_kb_prep_t *p = job->p;
    const fsdp_dtype_t dxdt = k->u.relu_bwd.dx_dtype, dydt = k->u.relu_bwd.dy_dtype;
    const fsdp_dtype_t ydt = k->u.relu_bwd.y_dtype;
    const vf zero = EV(splat)(0.0f);
    size_t i = begin;

    for (; i + EV_W <= end; i += EV_W) {
        vf dy = EV(ld)(k->u.relu_bwd.dy, dydt, i), y = EV(ld)(k->u.relu_bwd.y, ydt, i);
        EV(st)(k->u.relu_bwd.dx, dxdt, i, EV(sel)(y > 0.0f, dy, zero));
    }
    EV_TAIL(FSDP_K_RELU_BWD, k, p, i);
}

/* row by row: whole vectors of the row's columns, then its last columns by the scalar loop */
EV_ATTR static void EV(bias_add)(const fsdp_kernel_t *k, const fsdp_ev_job_t *job, size_t begin,
                                 size_t end)
{
    const fsdp_kb_prep_t *p = job->p;
    const fsdp_dtype_t ydt = k->u.bias_add.y_dtype, bdt = k->u.bias_add.bias_dtype;
    const size_t rows = k->u.bias_add.rows, cols = k->u.bias_add.cols;

    if (begin != 0 || end != p->n) { /* whole rows only */
        fsdp_sim_elem_range(k, p, begin, end);
        return;
    }
    for (size_t r = 0; r < rows; r++) {
        size_t c = 0, o = r * cols;
        for (; c + EV_W <= cols; c += EV_W) {
            vf y = EV(ld)(k->u.bias_add.y, ydt, o + c), b = EV(ld)(k->u.bias_add.bias, bdt, c);
            if (EV_ANY(EV_NAN(y) & EV_NAN(b)))
                EV_BODY(FSDP_K_BIAS_ADD, k, p, o + c);
            else
                EV(st)(k->u.bias_add.y, ydt, o + c, y + b);
        }
        fsdp_sim_elem_range(k, p, o + c, o + cols);
    }
}

/* between f32 and bf16 (the same dtype is a copy: kernels.c's plain loops) */
EV_ATTR static void EV(cast)(const fsdp_kernel_t *k, const fsdp_ev_job_t *job, size_t begin,
                             size_t end)
{
    const fsdp_kb_prep_t *p = job->p;
    const fsdp_dtype_t ddt = k->u.cast.dst_dtype, sdt = k->u.cast.src_dtype;
    size_t i = begin;

    for (; i + EV_W <= end; i += EV_W)
        EV(st)(k->u.cast.dst, ddt, i, EV(ld)(k->u.cast.src, sdt, i));
    EV_TAIL(FSDP_K_CAST, k, p, i);
}

#undef EV_TAIL
#undef EV_BODY
#undef EV_NAN
/* the vector types and helpers stay defined for lanes_vec_tmpl.h, which undefines them */
