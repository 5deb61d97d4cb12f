/* GPT-2 forward and backward on one rank, through backend kernels and the FSDP hooks.
 *
 * Layout: activations are row-major [B*T, width]; qkv is [B*T, 3C] with Q, K, V at columns 0,
 * C, 2C and head h at h*hs within each (HF's c_attn split); the attention probabilities are
 * [B, H, T, T]. Weights are Conv1D [in, out], so a layer is y = x W + b with no transpose.
 * Attention (eager, HF's) is two batched products per sequence (a batch over the heads: Q K^T,
 * then att V) around a causal softmax that also applies the scaling by sqrt(hs): in a 16-bit
 * dtype it divides the scores by sqrt(hs) rounded to the dtype, as HF's eager attention divides
 * by torch.full([], sqrt(hs), dtype=dtype); in f32 it multiplies by 1/sqrt(hs) (f32 runs as
 * they were, within an f32 rounding of the division). With the config's fused_attention it is one
 * fused kernel instead (kernel.h attention_fwd, reading the heads in place in qkv), which keeps
 * the per-row log-sum-exp [B, H, T] in place of the probabilities.
 *
 * Mixed precision: everything runs in the units' compute dtype (param_dtype), as torch runs HF's
 * model under FSDP's MixedPrecision: the unsharded weights, the activations and their gradients
 * are in it, the GEMMs sum in f32 and round their output once, the other kernels load
 * low-precision inputs, compute in f32 and round their outputs (kernel.h); the layernorm
 * statistics and the per-row losses are f32, and so is the loss. The weight gradients are
 * written in the compute dtype; FSDP reduces them in reduce_dtype.
 *
 * Memory: the forward keeps, per block, its input and the activations its backward reads
 * (ln_1, qkv, att, y, the mid residual, ln_2, the MLP pre- and post-activation, the layernorm
 * statistics); a checkpointed block keeps only its input and recomputes the rest after its
 * pre-backward hook. Saved tensors are FSDP_MEM_ACTIVATION, gradients of activations
 * FSDP_MEM_TEMPORARY; each is freed as soon as the backward is past it.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp/log.h>

#include "nn/gpt2_int.h"

/* what a block's backward reads, by index */
enum {
    A_LN1,
    A_MEAN1,
    A_RSTD1,
    A_QKV,
    A_ATT,
    A_Y,
    A_XMID,
    A_LN2,
    A_MEAN2,
    A_RSTD2,
    A_H,
    A_G,
    A_COUNT
};

typedef struct block_act {
    void *buf[A_COUNT]; /* mean and rstd are f32, the others of the compute dtype */
} block_act_t;

typedef struct gpt2_run {
    fsdp_lm_run_t lm; /* first: the step's callbacks get &run.lm (lm.c) */
    fsdp_gpt2_t *m;
    size_t C, H, hs;
    size_t Ca; /* the attention's width: H hs, C / tp under tensor parallelism (H this rank's) */
    float att_scale; /* 1 / sqrt(hs), in f32 */
    float att_div;   /* sqrt(hs) in a 16-bit dtype (the kernel rounds it), else 0 */
} gpt2_run_t;

static fsdp_status_t launch(gpt2_run_t *r, const fsdp_kernel_t *k)
{
    return fsdp_lm_launch(&r->lm, k);
}

/* n elements of the compute dtype */
static fsdp_status_t alloc_a(gpt2_run_t *r, size_t n, fsdp_mem_category_t cat, void **p)
{
    return fsdp_lm_alloc(&r->lm, n, cat, p);
}

/* frees a buffer of the run and forgets it */
#define FREE(r, p) FSDP_LM_FREE(&(r)->lm, p)

/* element i of a tensor of the compute dtype */
#define AT(r, p, i) ((const char *)(p) + (size_t)(i) * (r)->lm.es)
#define AT_W(r, p, i) ((char *)(p) + (size_t)(i) * (r)->lm.es)

/* block l's activations */
#define ACT(r, l) (((block_act_t *)(r)->lm.acts)[l].buf)

/* ---- kernel launches ---- */

/* c = alpha op(a) op(b) + beta c, `batch` times with the given strides (elements), then the
 * epilogue epi (NULL: none) */
static fsdp_status_t gemm_epi(gpt2_run_t *r, int ta, int tb, size_t m, size_t n, size_t k,
                              float alpha, const void *a, size_t lda, size_t sa, const void *b,
                              size_t ldb, size_t sb, float beta, void *c, size_t ldc, size_t sc,
                              size_t batch, const fsdp_gemm_epilogue_t *epi, uint64_t b_version)
{
    fsdp_kernel_t d = {.kind = FSDP_K_GEMM}; /* every operand in the compute dtype */
    d.u.gemm.a_dtype = d.u.gemm.b_dtype = d.u.gemm.c_dtype = r->lm.dt;
    d.u.gemm.trans_a = ta;
    d.u.gemm.trans_b = tb;
    d.u.gemm.m = m;
    d.u.gemm.n = n;
    d.u.gemm.k = k;
    d.u.gemm.alpha = alpha;
    d.u.gemm.a = a;
    d.u.gemm.lda = lda;
    d.u.gemm.b = b;
    d.u.gemm.ldb = ldb;
    d.u.gemm.beta = beta;
    d.u.gemm.c = c;
    d.u.gemm.ldc = ldc;
    d.u.gemm.batch = batch;
    d.u.gemm.stride_a = sa;
    d.u.gemm.stride_b = sb;
    d.u.gemm.stride_c = sc;
    if (epi != NULL)
        d.u.gemm.epilogue = *epi;
    d.u.gemm.b_version = b_version;
    return fsdp_nn_gemm(r->lm.dev, r->lm.s, &d);
}

static fsdp_status_t gemm_batched(gpt2_run_t *r, int ta, int tb, size_t m, size_t n, size_t k,
                                  float alpha, const void *a, size_t lda, size_t sa, const void *b,
                                  size_t ldb, size_t sb, float beta, void *c, size_t ldc, size_t sc,
                                  size_t batch)
{
    return gemm_epi(r, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch,
                    NULL, 0);
}

static fsdp_status_t gemm(gpt2_run_t *r, int ta, int tb, size_t m, size_t n, size_t k,
                          const void *a, size_t lda, const void *b, size_t ldb, float beta, void *c,
                          size_t ldc)
{
    return gemm_batched(r, ta, tb, m, n, k, 1.0f, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1);
}

/* dw[m, n] += op(a) op(b), a weight gradient accumulated as autograd accumulates it (kernel.h's
 * accumulate: in a 16-bit dtype the new gradient is rounded, then the sum) */
static fsdp_status_t grad_gemm(gpt2_run_t *r, int ta, int tb, size_t m, size_t n, size_t k,
                               const void *a, size_t lda, const void *b, size_t ldb, void *dw,
                               size_t ldc)
{
    fsdp_gemm_epilogue_t epi = {.accumulate = 1};
    return gemm_epi(r, ta, tb, m, n, k, 1.0f, a, lda, 0, b, ldb, 0, 1.0f, dw, ldc, 0, 1, &epi, 0);
}

/* out[BT, n] = x[BT, k] W[k, n] + bias (Conv1D's addmm), then + residual [BT, n] unless NULL
 * (the block's residual add, a separate torch op: kernel.h's epilogue rounds it apart) */
static fsdp_status_t linear_fwd(gpt2_run_t *r, const void *x, size_t k, const void *w,
                                const void *bias, size_t n, const void *residual, void *out)
{
    fsdp_gemm_epilogue_t epi = {.bias = bias, .bias_dtype = r->lm.dt, .residual = residual};
    return gemm_epi(r, 0, 0, r->lm.BT, n, k, 1.0f, x, k, 0, w, n, 0, 0.0f, out, n, 0, 1, &epi, 0);
}

/* dW[k, n] += x^T dout, dbias += the column sums of dout, dx[BT, k] = dout W^T (dx NULL: not
 * wanted) */
static fsdp_status_t linear_bwd(gpt2_run_t *r, const void *x, size_t k, const void *w, size_t n,
                                const void *dout, void *dw, void *dbias, void *dx)
{
    fsdp_kernel_t d = {.kind = FSDP_K_BIAS_GRAD};
    fsdp_status_t status = grad_gemm(r, 1, 0, k, n, r->lm.BT, x, k, dout, n, dw, n);

    if (status != FSDP_OK)
        return status;
    d.u.bias_grad.dbias = dbias;
    d.u.bias_grad.dy = dout;
    d.u.bias_grad.rows = r->lm.BT;
    d.u.bias_grad.cols = n;
    d.u.bias_grad.dbias_dtype = d.u.bias_grad.dy_dtype = r->lm.dt;
    status = launch(r, &d);
    if (status != FSDP_OK || dx == NULL)
        return status;
    return gemm(r, 0, 1, r->lm.BT, k, n, dout, n, w, n, 0.0f, dx, k);
}

static fsdp_status_t layernorm_fwd(gpt2_run_t *r, const void *x, const void *w, const void *b,
                                   void *y, float *mean, float *rstd)
{
    fsdp_kernel_t d = {.kind = FSDP_K_LAYERNORM_FWD};
    d.u.layernorm_fwd.y = y;
    d.u.layernorm_fwd.mean = mean;
    d.u.layernorm_fwd.rstd = rstd;
    d.u.layernorm_fwd.x = x;
    d.u.layernorm_fwd.weight = w;
    d.u.layernorm_fwd.bias = b;
    d.u.layernorm_fwd.rows = r->lm.rows; /* sequence shards under tensor parallelism */
    d.u.layernorm_fwd.cols = r->C;
    d.u.layernorm_fwd.eps = r->m->cfg.layer_norm_eps;
    d.u.layernorm_fwd.dtype = r->lm.dt;
    return launch(r, &d);
}

static fsdp_status_t layernorm_bwd(gpt2_run_t *r, const void *dy, const void *x, const float *mean,
                                   const float *rstd, const void *w, void *dx, int accumulate,
                                   void *dw, void *db)
{
    fsdp_kernel_t d = {.kind = FSDP_K_LAYERNORM_BWD};
    d.u.layernorm_bwd.dx = dx;
    d.u.layernorm_bwd.dweight = dw;
    d.u.layernorm_bwd.dbias = db;
    d.u.layernorm_bwd.dy = dy;
    d.u.layernorm_bwd.x = x;
    d.u.layernorm_bwd.mean = mean;
    d.u.layernorm_bwd.rstd = rstd;
    d.u.layernorm_bwd.weight = w;
    d.u.layernorm_bwd.rows = r->lm.rows;
    d.u.layernorm_bwd.cols = r->C;
    d.u.layernorm_bwd.accumulate = accumulate;
    d.u.layernorm_bwd.dtype = r->lm.dt;
    return launch(r, &d);
}

/* ---- attention ---- */

/* y[BT, C] = the heads' softmax(Q K^T / sqrt(hs), causal) V, side by side; att keeps the
 * probabilities. */
static fsdp_status_t attention_fwd(gpt2_run_t *r, const void *qkv, void *att, void *y)
{
    const size_t T = r->lm.T, C = r->Ca, H = r->H, hs = r->hs, tt = T * T;
    fsdp_kernel_t d = {.kind = FSDP_K_SOFTMAX_FWD};
    fsdp_status_t status = FSDP_OK;

    for (size_t b = 0; b < r->lm.B && status == FSDP_OK; b++) { /* scores = Q K^T, per head */
        const void *q = AT(r, qkv, b * T * 3 * C);
        status = gemm_batched(r, 0, 1, T, T, hs, 1.0f, q, 3 * C, hs, AT(r, q, C), 3 * C, hs, 0.0f,
                              AT_W(r, att, b * H * tt), T, tt, H);
    }
    if (status != FSDP_OK)
        return status;
    d.u.softmax_fwd.y = att;
    d.u.softmax_fwd.x = att;
    d.u.softmax_fwd.rows = r->lm.B * H * T;
    d.u.softmax_fwd.cols = T;
    d.u.softmax_fwd.scale = r->att_scale;
    d.u.softmax_fwd.divisor = r->att_div;
    d.u.softmax_fwd.causal = 1;
    d.u.softmax_fwd.dtype = r->lm.dt;
    d.u.softmax_fwd.head_dim = hs;
    status = launch(r, &d);
    for (size_t b = 0; b < r->lm.B && status == FSDP_OK; b++) { /* y_h = att_h V_h */
        const void *v = AT(r, qkv, b * T * 3 * C + 2 * C);
        status = gemm_batched(r, 0, 0, T, hs, T, 1.0f, AT(r, att, b * H * tt), T, tt, v, 3 * C, hs,
                              0.0f, AT_W(r, y, b * T * C), C, hs, H);
    }
    return status;
}

/* From dy [BT, C] (the gradient of the heads' output): dqkv [BT, 3C]; datt is [B, H, T, T]
 * scratch. */
static fsdp_status_t attention_bwd(gpt2_run_t *r, const void *qkv, const void *att, const void *dy,
                                   void *datt, void *dqkv)
{
    const size_t T = r->lm.T, C = r->Ca, H = r->H, hs = r->hs, tt = T * T;
    fsdp_kernel_t d = {.kind = FSDP_K_SOFTMAX_BWD};
    fsdp_status_t status = FSDP_OK;

    for (size_t b = 0; b < r->lm.B && status == FSDP_OK; b++) {
        const void *v = AT(r, qkv, b * T * 3 * C + 2 * C), *dyb = AT(r, dy, b * T * C);
        const void *attb = AT(r, att, b * H * tt);
        /* datt_h = dy_h V_h^T */
        status = gemm_batched(r, 0, 1, T, T, hs, 1.0f, dyb, C, hs, v, 3 * C, hs, 0.0f,
                              AT_W(r, datt, b * H * tt), T, tt, H);
        /* dV_h = att_h^T dy_h */
        if (status == FSDP_OK)
            status = gemm_batched(r, 1, 0, T, hs, T, 1.0f, attb, T, tt, dyb, C, hs, 0.0f,
                                  AT_W(r, dqkv, b * T * 3 * C + 2 * C), 3 * C, hs, H);
    }
    if (status != FSDP_OK)
        return status;
    d.u.softmax_bwd.dx = datt; /* the scores' gradient, scale included */
    d.u.softmax_bwd.dy = datt;
    d.u.softmax_bwd.y = att;
    d.u.softmax_bwd.rows = r->lm.B * H * T;
    d.u.softmax_bwd.cols = T;
    d.u.softmax_bwd.scale = r->att_scale;
    d.u.softmax_bwd.divisor = r->att_div;
    d.u.softmax_bwd.causal = 1;
    d.u.softmax_bwd.dtype = r->lm.dt;
    d.u.softmax_bwd.head_dim = hs;
    status = launch(r, &d);
    for (size_t b = 0; b < r->lm.B && status == FSDP_OK; b++) {
        const void *q = AT(r, qkv, b * T * 3 * C), *ds = AT(r, datt, b * H * tt);
        void *dq = AT_W(r, dqkv, b * T * 3 * C);
        /* dQ_h = dS_h K_h, dK_h = dS_h^T Q_h */
        status = gemm_batched(r, 0, 0, T, hs, T, 1.0f, ds, T, tt, AT(r, q, C), 3 * C, hs, 0.0f, dq,
                              3 * C, hs, H);
        if (status == FSDP_OK)
            status = gemm_batched(r, 1, 0, T, hs, T, 1.0f, ds, T, tt, q, 3 * C, hs, 0.0f,
                                  AT_W(r, dq, C), 3 * C, hs, H);
    }
    return status;
}

/* The fused kernel (kernel.h attention_fwd): y [BT, C] from the heads of qkv [BT, 3C], with
 * the per-row log-sum-exp into lse [B, H, T] for the backward. */
#define FUSED_ARGS(f, r, qkv)                                                                      \
    do {                                                                                           \
        (f).q = (qkv);                                                                             \
        (f).k = AT((r), (qkv), (r)->Ca);                                                           \
        (f).v = AT((r), (qkv), 2 * (r)->Ca);                                                       \
        (f).batch = (r)->lm.B;                                                                     \
        (f).seq = (r)->lm.T;                                                                       \
        (f).heads = (f).kv_heads = (r)->H;                                                         \
        (f).head_dim = (r)->hs;                                                                    \
        (f).ldq = (f).ldk = (f).ldv = 3 * (r)->Ca;                                                 \
        (f).ldo = (r)->Ca;                                                                         \
        (f).scale = (r)->att_scale;                                                                \
        (f).causal = 1;                                                                            \
        (f).dtype = (r)->lm.dt;                                                                    \
    } while (0)

static fsdp_status_t fused_attention_fwd(gpt2_run_t *r, const void *qkv, float *lse, void *y)
{
    fsdp_kernel_t d = {.kind = FSDP_K_ATTENTION_FWD};

    d.u.attention_fwd.o = y;
    d.u.attention_fwd.lse = lse;
    FUSED_ARGS(d.u.attention_fwd, r, qkv);
    return launch(r, &d);
}

/* Its backward from y, lse and dy [BT, C]: dqkv [BT, 3C]; delta is [B, H, T] f32 scratch. */
static fsdp_status_t fused_attention_bwd(gpt2_run_t *r, const void *qkv, const void *y,
                                         const float *lse, const void *dy, float *delta,
                                         void *dqkv)
{
    fsdp_kernel_t d = {.kind = FSDP_K_ATTENTION_BWD};

    d.u.attention_bwd.dq = dqkv;
    d.u.attention_bwd.dk = AT_W(r, dqkv, r->Ca);
    d.u.attention_bwd.dv = AT_W(r, dqkv, 2 * r->Ca);
    d.u.attention_bwd.delta = delta;
    d.u.attention_bwd.dout = dy;
    d.u.attention_bwd.o = y;
    d.u.attention_bwd.lse = lse;
    FUSED_ARGS(d.u.attention_bwd, r, qkv);
    return launch(r, &d);
}

/* ---- blocks ---- */

/* Under tensor parallelism the layernorms' statistics and the mid residual are sequence
 * shards (rows), ln_1 and ln_2 all-gathered, and qkv, att, y, h and g this rank's heads and
 * columns (Ca = C / tp). */
static size_t act_numel(const gpt2_run_t *r, int i)
{
    switch (i) {
    case A_MEAN1:
    case A_RSTD1:
    case A_MEAN2:
    case A_RSTD2:
        return r->lm.rows;
    case A_QKV:
        return r->lm.BT * 3 * r->Ca;
    case A_ATT: /* the probabilities, or the fused kernel's log-sum-exp */
        return r->lm.B * r->H * r->lm.T * (r->m->cfg.fused_attention ? 1 : r->lm.T);
    case A_H:
    case A_G:
        return r->lm.BT * 4 * r->Ca;
    case A_Y:
        return r->lm.BT * r->Ca;
    case A_XMID:
        return r->lm.rows * r->C;
    default:
        return r->lm.BT * r->C;
    }
}

/* its bytes: the layernorm statistics are f32, the rest of the compute dtype */
static size_t act_bytes(const gpt2_run_t *r, int i)
{
    int stat = i == A_MEAN1 || i == A_RSTD1 || i == A_MEAN2 || i == A_RSTD2 ||
               (i == A_ATT && r->m->cfg.fused_attention);
    return act_numel(r, i) * (stat ? sizeof(float) : r->lm.es);
}

static void free_act(gpt2_run_t *r, int l)
{
    for (int i = 0; i < A_COUNT; i++)
        FREE(r, ACT(r, l)[i]);
}

#define P(u, i) ((const void *)fsdp_unit_param((u), (i)))

/* ---- tensor parallelism (Megatron's layout of a block, with sequence parallelism) ---- */

/* A layernorm on the sequence shard x (SequenceParallel) into the all-gathered y [BT, C] that the
 * column-parallel c_attn or c_fc reads; without tensor parallelism the layernorm itself. */
static fsdp_status_t ln_gather(gpt2_run_t *r, const void *x, const void *w, const void *b, void *y,
                               float *mean, float *rstd)
{
    void *ys = NULL;
    fsdp_status_t status;

    if (r->lm.tp <= 1)
        return layernorm_fwd(r, x, w, b, y, mean, rstd);
    status = alloc_a(r, r->lm.rows * r->C, FSDP_MEM_TEMPORARY, &ys);
    if (status == FSDP_OK)
        status = layernorm_fwd(r, x, w, b, ys, mean, rstd);
    if (status == FSDP_OK)
        status = fsdp_lm_sp_gather(&r->lm, ys, y, r->C);
    FREE(r, ys);
    return status;
}

/* out [rows, C] = the row-parallel c_proj of x [BT, k] (RowwiseParallel, output Shard(1)), then
 * + residual (the sequence shard): the partial products x W + bias / tp, as DTensor's addmm makes
 * the replicated bias Partial (Partial._partition_value divides it by tp), reduce-scattered, and
 * the residual added. Without tensor parallelism linear_fwd's bias and residual epilogue. */
static fsdp_status_t row_parallel_fwd(gpt2_run_t *r, const void *x, size_t k, const void *w,
                                      const void *bias, const void *residual, void *out)
{
    fsdp_kernel_t d = {.kind = FSDP_K_DIV};
    void *part = NULL, *bp = NULL;
    fsdp_status_t status;

    if (r->lm.tp <= 1)
        return linear_fwd(r, x, k, w, bias, r->C, residual, out);
    status = alloc_a(r, r->C, FSDP_MEM_TEMPORARY, &bp);
    if (status == FSDP_OK)
        status = fsdp_dev_memcpy_async(r->lm.dev, bp, bias, r->C * r->lm.es, r->lm.s);
    d.u.scale.x = bp;
    d.u.scale.dtype = r->lm.dt;
    d.u.scale.n = r->C;
    d.u.scale.alpha = (float)r->lm.tp;
    if (status == FSDP_OK)
        status = launch(r, &d);
    if (status == FSDP_OK)
        status = alloc_a(r, r->lm.BT * r->C, FSDP_MEM_TEMPORARY, &part);
    if (status == FSDP_OK)
        status = linear_fwd(r, x, k, w, bp, r->C, NULL, part);
    FREE(r, bp);
    if (status == FSDP_OK)
        status = fsdp_lm_sp_scatter(&r->lm, part, out, r->C);
    FREE(r, part);
    if (status == FSDP_OK) {
        fsdp_kernel_t a = {.kind = FSDP_K_ADD};
        a.u.add.y = out;
        a.u.add.a = out;
        a.u.add.b = residual;
        a.u.add.n = r->lm.rows * r->C;
        a.u.add.dtype = r->lm.dt;
        status = launch(r, &a);
    }
    return status;
}

/* A layernorm's backward into dres from the column-parallel layer's input gradient dln [BT, C],
 * partial over tp and reduce-scattered to the shard first (the all-gather's backward); its
 * weight and bias gradients are this shard's part (tp_partial_grad: FSDP2 sums them). */
static fsdp_status_t ln_scatter_bwd(gpt2_run_t *r, const void *dln, const void *x,
                                    const float *mean, const float *rstd, const void *w, void *dw,
                                    void *db)
{
    void **dls = &r->lm.tmp[0];
    fsdp_status_t status;

    if (r->lm.tp <= 1)
        return layernorm_bwd(r, dln, x, mean, rstd, w, r->lm.dres, 1, dw, db);
    status = alloc_a(r, r->lm.rows * r->C, FSDP_MEM_TEMPORARY, dls);
    if (status == FSDP_OK)
        status = fsdp_lm_sp_scatter(&r->lm, dln, *dls, r->C);
    if (status == FSDP_OK)
        status = layernorm_bwd(r, *dls, x, mean, rstd, w, r->lm.dres, 1, dw, db);
    FREE(r, *dls);
    return status;
}

/* Block l's forward from resid[l]: its activations, and (unless recompute, which stops at
 * what the backward reads) its output resid[l + 1]. */
static fsdp_status_t block_fwd(gpt2_run_t *r, int l, int recompute)
{
    fsdp_unit_t *u = r->m->lm.layers[l];
    void **a = ACT(r, l);
    const void *x = r->lm.resid[l];
    const size_t C = r->C, BT = r->lm.BT;
    fsdp_kernel_t d = {.kind = FSDP_K_GELU_FWD};
    fsdp_status_t status = FSDP_OK;

    for (int i = 0; i < A_COUNT && status == FSDP_OK; i++)
        status = fsdp_mem_alloc(r->lm.mem, act_bytes(r, i), FSDP_MEM_ACTIVATION, r->lm.s, &a[i]);
    if (status == FSDP_OK)
        status = ln_gather(r, x, P(u, FSDP_GPT2_LN1_W), P(u, FSDP_GPT2_LN1_B), a[A_LN1],
                           (float *)a[A_MEAN1], (float *)a[A_RSTD1]);
    if (status == FSDP_OK)
        status = linear_fwd(r, a[A_LN1], C, P(u, FSDP_GPT2_ATTN_W), P(u, FSDP_GPT2_ATTN_B),
                            3 * r->Ca, NULL, a[A_QKV]);
    if (status == FSDP_OK)
        status = r->m->cfg.fused_attention
                     ? fused_attention_fwd(r, a[A_QKV], (float *)a[A_ATT], a[A_Y])
                     : attention_fwd(r, a[A_QKV], a[A_ATT], a[A_Y]);
    if (status == FSDP_OK)
        status = row_parallel_fwd(r, a[A_Y], r->Ca, P(u, FSDP_GPT2_ATTN_PROJ_W),
                                  P(u, FSDP_GPT2_ATTN_PROJ_B), x, a[A_XMID]);
    if (status == FSDP_OK)
        status = ln_gather(r, a[A_XMID], P(u, FSDP_GPT2_LN2_W), P(u, FSDP_GPT2_LN2_B), a[A_LN2],
                           (float *)a[A_MEAN2], (float *)a[A_RSTD2]);
    if (status == FSDP_OK)
        status = linear_fwd(r, a[A_LN2], C, P(u, FSDP_GPT2_FC_W), P(u, FSDP_GPT2_FC_B), 4 * r->Ca,
                            NULL, a[A_H]);
    if (status == FSDP_OK) {
        d.u.gelu_fwd.y = a[A_G];
        d.u.gelu_fwd.x = a[A_H];
        d.u.gelu_fwd.n = BT * 4 * r->Ca;
        d.u.gelu_fwd.dtype = r->lm.dt;
        status = launch(r, &d);
    }
    if (status != FSDP_OK || recompute)
        return status;
    status = alloc_a(r, r->lm.rows * C, FSDP_MEM_ACTIVATION, &r->lm.resid[l + 1]);
    if (status == FSDP_OK)
        status = row_parallel_fwd(r, a[A_G], 4 * r->Ca, P(u, FSDP_GPT2_FC_PROJ_W),
                                  P(u, FSDP_GPT2_FC_PROJ_B), a[A_XMID], r->lm.resid[l + 1]);
    return status;
}

/* Block l's backward: r->lm.dres holds the gradient of its output and becomes that of its
 * input; the parameter gradients accumulate into the unit's. */
static fsdp_status_t block_bwd(gpt2_run_t *r, int l)
{
    fsdp_unit_t *u = r->m->lm.layers[l];
    void **a = ACT(r, l), *g[FSDP_GPT2_BLOCK_NPARAMS];
    void **dh = &r->lm.tmp[0], **dln = &r->lm.tmp[1], **dy = &r->lm.tmp[2], **datt = &r->lm.tmp[3];
    void **dqkv = &r->lm.tmp[4];
    void *dfull = NULL; /* dres, all-gathered under tensor parallelism */
    const size_t C = r->C, Ca = r->Ca, BT = r->lm.BT;
    fsdp_kernel_t d = {.kind = FSDP_K_GELU_BWD};
    fsdp_status_t status = FSDP_OK;

    for (int i = 0; i < FSDP_GPT2_BLOCK_NPARAMS && status == FSDP_OK; i++)
        status = fsdp_unit_grad(u, i, &g[i]);
    /* MLP: dG = dres W_proj^T, dH = dG gelu'(H), dln2 = dH W_fc^T */
    if (status == FSDP_OK)
        status = alloc_a(r, BT * 4 * Ca, FSDP_MEM_TEMPORARY, dh);
    if (status == FSDP_OK)
        status = fsdp_lm_sp_gather_dres(&r->lm, &dfull);
    if (status == FSDP_OK)
        status = linear_bwd(r, a[A_G], 4 * Ca, P(u, FSDP_GPT2_FC_PROJ_W), C, dfull,
                            g[FSDP_GPT2_FC_PROJ_W], g[FSDP_GPT2_FC_PROJ_B], *dh);
    if (dfull != r->lm.dres)
        FREE(r, dfull);
    dfull = NULL;
    if (status == FSDP_OK) {
        d.u.gelu_bwd.dx = *dh;
        d.u.gelu_bwd.dy = *dh;
        d.u.gelu_bwd.x = a[A_H];
        d.u.gelu_bwd.n = BT * 4 * Ca;
        d.u.gelu_bwd.dtype = r->lm.dt;
        status = launch(r, &d);
    }
    if (status == FSDP_OK)
        status = alloc_a(r, BT * C, FSDP_MEM_TEMPORARY, dln);
    if (status == FSDP_OK)
        status = linear_bwd(r, a[A_LN2], C, P(u, FSDP_GPT2_FC_W), 4 * Ca, *dh, g[FSDP_GPT2_FC_W],
                            g[FSDP_GPT2_FC_B], *dln);
    FREE(r, *dh);
    /* the mid residual: dres += ln_2's input gradient */
    if (status == FSDP_OK)
        status = ln_scatter_bwd(r, *dln, a[A_XMID], (float *)a[A_MEAN2], (float *)a[A_RSTD2],
                                P(u, FSDP_GPT2_LN2_W), g[FSDP_GPT2_LN2_W], g[FSDP_GPT2_LN2_B]);
    /* attention */
    if (status == FSDP_OK)
        status = alloc_a(r, BT * Ca, FSDP_MEM_TEMPORARY, dy);
    if (status == FSDP_OK)
        status = fsdp_lm_sp_gather_dres(&r->lm, &dfull);
    if (status == FSDP_OK)
        status = linear_bwd(r, a[A_Y], Ca, P(u, FSDP_GPT2_ATTN_PROJ_W), C, dfull,
                            g[FSDP_GPT2_ATTN_PROJ_W], g[FSDP_GPT2_ATTN_PROJ_B], *dy);
    if (dfull != r->lm.dres)
        FREE(r, dfull);
    /* the scores' gradient [B, H, T, T], or the fused backward's delta [B, H, T] (f32) */
    if (status == FSDP_OK)
        status = fsdp_mem_alloc(r->lm.mem, act_bytes(r, A_ATT), FSDP_MEM_TEMPORARY, r->lm.s, datt);
    if (status == FSDP_OK)
        status = alloc_a(r, BT * 3 * Ca, FSDP_MEM_TEMPORARY, dqkv);
    if (status == FSDP_OK)
        status = r->m->cfg.fused_attention
                     ? fused_attention_bwd(r, a[A_QKV], a[A_Y], (const float *)a[A_ATT], *dy,
                                           (float *)*datt, *dqkv)
                     : attention_bwd(r, a[A_QKV], a[A_ATT], *dy, *datt, *dqkv);
    FREE(r, *datt);
    FREE(r, *dy);
    if (status == FSDP_OK)
        status = linear_bwd(r, a[A_LN1], C, P(u, FSDP_GPT2_ATTN_W), 3 * Ca, *dqkv,
                            g[FSDP_GPT2_ATTN_W], g[FSDP_GPT2_ATTN_B], *dln);
    FREE(r, *dqkv);
    /* the block's input: dres += ln_1's input gradient */
    if (status == FSDP_OK)
        status = ln_scatter_bwd(r, *dln, r->lm.resid[l], (float *)a[A_MEAN1], (float *)a[A_RSTD1],
                                P(u, FSDP_GPT2_LN1_W), g[FSDP_GPT2_LN1_W], g[FSDP_GPT2_LN1_B]);
    FREE(r, *dln);
    return status;
}

/* ---- the step (lm.c): the model's part ---- */

static gpt2_run_t *run_of(fsdp_lm_run_t *lr)
{
    return (gpt2_run_t *)lr;
}

/* the token rows of wte plus the position rows of wpe */
static fsdp_status_t embed_fwd(fsdp_lm_run_t *lr)
{
    return fsdp_lm_embed_fwd(lr, P(lr->lm->root, FSDP_GPT2_WTE), P(lr->lm->root, FSDP_GPT2_WPE));
}

static fsdp_status_t layer_fwd(fsdp_lm_run_t *lr, int l)
{
    return block_fwd(run_of(lr), l, 0);
}

/* a checkpointed block keeps only its input */
static void layer_forget(fsdp_lm_run_t *lr, int l)
{
    if (lr->lm->checkpoint[l])
        free_act(run_of(lr), l);
}

static fsdp_status_t norm_fwd(fsdp_lm_run_t *lr)
{
    fsdp_unit_t *root = lr->lm->root;
    return layernorm_fwd(run_of(lr), lr->resid[lr->lm->n_layer], P(root, FSDP_GPT2_LNF_W),
                         P(root, FSDP_GPT2_LNF_B), lr->nf, lr->meanf, lr->rstdf);
}

/* the LM head, tied: logits = ln_f(x) wte^T; wte's version lets the backend keep it packed
 * while it does not change (micro-batches of an accumulated step) */
static fsdp_status_t head_fwd(fsdp_lm_run_t *lr)
{
    gpt2_run_t *r = run_of(lr);
    void *part = NULL;
    fsdp_status_t status;

    if (lr->tp <= 1)
        return gemm_epi(r, 0, 1, lr->BT, lr->V, lr->width, 1.0f, lr->nf, lr->width, 0,
                        P(lr->lm->root, FSDP_GPT2_WTE), lr->width, 0, 0.0f, lr->logits, lr->V, 0, 1,
                        NULL, fsdp_unit_param_version(lr->lm->root));
    /* ColwiseParallel on the all-gathered ln_f: this rank's vocabulary columns, all-gathered
     * (output Replicate) or kept for the vocabulary-parallel loss */
    part = lr->loss_parallel ? lr->logits : NULL;
    status = part != NULL ? FSDP_OK : alloc_a(r, lr->BT * lr->vl, FSDP_MEM_TEMPORARY, &part);
    if (status == FSDP_OK)
        status = gemm_epi(r, 0, 1, lr->BT, lr->vl, lr->width, 1.0f, lr->nff, lr->width, 0,
                          P(lr->lm->root, FSDP_GPT2_WTE), lr->width, 0, 0.0f, part, lr->vl, 0, 1,
                          NULL, fsdp_unit_param_version(lr->lm->root));
    if (status == FSDP_OK && !lr->loss_parallel)
        status = fsdp_lm_tp_gather_cols(lr, part, lr->logits);
    if (!lr->loss_parallel)
        FREE(r, part);
    return status;
}

/* dln_f = dlogits wte, dwte += dlogits^T ln_f; under tensor parallelism from this rank's
 * vocabulary columns and the all-gathered ln_f, dln_f partial and reduce-scattered */
static fsdp_status_t head_bwd(fsdp_lm_run_t *lr, void **g, void *dnf)
{
    gpt2_run_t *r = run_of(lr);
    const size_t C = lr->width;
    const void *dl = AT(r, lr->logits, lr->tp > 1 && !lr->loss_parallel ? lr->v0 : 0);
    const void *nf = lr->tp > 1 ? lr->nff : lr->nf;
    void *part = NULL;
    fsdp_status_t status = FSDP_OK;

    if (lr->tp > 1)
        status = alloc_a(r, lr->BT * C, FSDP_MEM_TEMPORARY, &part);
    if (status == FSDP_OK)
        status = gemm(r, 0, 0, lr->BT, C, lr->vl, dl, lr->lv, P(lr->lm->root, FSDP_GPT2_WTE), C,
                      0.0f, lr->tp > 1 ? part : dnf, C);
    if (status == FSDP_OK)
        status = grad_gemm(r, 1, 0, lr->vl, C, lr->BT, dl, lr->lv, nf, C, g[FSDP_GPT2_WTE], C);
    if (status == FSDP_OK && lr->tp > 1)
        status = fsdp_lm_sp_scatter(lr, part, dnf, C);
    FREE(r, part);
    return status;
}

static fsdp_status_t norm_bwd(fsdp_lm_run_t *lr, void **g, const void *dnf)
{
    return layernorm_bwd(run_of(lr), dnf, lr->resid[lr->lm->n_layer], lr->meanf, lr->rstdf,
                         P(lr->lm->root, FSDP_GPT2_LNF_W), lr->dres, 0, g[FSDP_GPT2_LNF_W],
                         g[FSDP_GPT2_LNF_B]);
}

static fsdp_status_t layer_recompute(fsdp_lm_run_t *lr, int l)
{
    return lr->lm->checkpoint[l] ? block_fwd(run_of(lr), l, 1) : FSDP_OK;
}

static fsdp_status_t layer_bwd(fsdp_lm_run_t *lr, int l)
{
    return block_bwd(run_of(lr), l);
}

static void layer_free(fsdp_lm_run_t *lr, int l)
{
    free_act(run_of(lr), l);
}

/* the embeddings: the token rows of wte (on top of the LM head's) and wpe */
static fsdp_status_t embed_bwd(fsdp_lm_run_t *lr, void **g)
{
    return fsdp_lm_embed_bwd(lr, g[FSDP_GPT2_WTE], g[FSDP_GPT2_WPE]);
}

static const fsdp_lm_ops_t gpt2_ops = {
    .layer_acts = sizeof(block_act_t),
    .norm_mean = 1,
    .embed_fwd = embed_fwd,
    .layer_fwd = layer_fwd,
    .layer_forget = layer_forget,
    .norm_fwd = norm_fwd,
    .head_fwd = head_fwd,
    .head_bwd = head_bwd,
    .norm_bwd = norm_bwd,
    .layer_recompute = layer_recompute,
    .layer_bwd = layer_bwd,
    .layer_free = layer_free,
    .embed_bwd = embed_bwd,
};

fsdp_status_t fsdp_gpt2_forward_backward(fsdp_lm_t *lm, const int32_t *inputs,
                                         const int32_t *targets, size_t batch, size_t seq,
                                         float *loss_p)
{
    fsdp_gpt2_t *model = fsdp_gpt2_of(lm);
    const fsdp_gpt2_config_t *cfg = &model->cfg;
    gpt2_run_t run;
    size_t count = 0;
    fsdp_status_t status;

    /* the largest buffers, logits [B*T, V] and att [B, H, T, T], per token */
    status = fsdp_lm_check_batch(&model->lm, cfg->n_positions, "positions", cfg->vocab_size,
                                 (double)cfg->vocab_size + 16.0 * cfg->n_embd +
                                     (double)cfg->n_head * (double)seq,
                                 inputs, targets, batch, seq, &count);
    if (status != FSDP_OK)
        return status;
    memset(&run, 0, sizeof(run));
    status = fsdp_lm_run_init(&run.lm, &model->lm, batch, seq, (size_t)cfg->n_embd,
                              (size_t)cfg->vocab_size);
    if (status != FSDP_OK)
        return status;
    run.m = model;
    run.C = (size_t)cfg->n_embd;
    run.H = (size_t)cfg->n_head / (size_t)model->tp; /* this rank's heads */
    run.hs = run.C / (size_t)cfg->n_head;
    run.Ca = run.H * run.hs;
    run.att_scale = (float)(1.0 / sqrt((double)run.hs));
    run.att_div = run.lm.dt != FSDP_DTYPE_F32 ? (float)sqrt((double)run.hs) : 0.0f;
    return fsdp_lm_run_step(&run.lm, &gpt2_ops, inputs, targets, count, loss_p);
}
