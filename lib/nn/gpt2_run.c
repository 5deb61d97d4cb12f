/* GPT-2 forward and backward on one rank, through backend kernels and the FSDP hooks.
 *
 * Layout: activations are row-major [B*T, width]; qkv is [B*T, 3C] with Q, K, V at columns 0,
 * C, 2C and head h at h*hs within each (HF's c_attn split); the attention probabilities are
 * [B, H, T, T]. Weights are Conv1D [in, out], so a layer is y = x W + b with no transpose.
 * Attention is two batched products per sequence (a batch over the heads: Q K^T, then att V)
 * around a causal softmax that also applies the scaling by sqrt(hs): in a 16-bit dtype it
 * divides the scores by sqrt(hs) rounded to the dtype, as HF's eager attention divides by
 * torch.full([], sqrt(hs), dtype=dtype); in f32 it multiplies by 1/sqrt(hs) (f32 runs as they
 * were, within an f32 rounding of the division).
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
#include "nn/nn_int.h"

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
    fsdp_gpt2_t *m;
    fsdp_dev_t *dev;
    fsdp_stream_t *s;
    fsdp_mem_t *mem;
    size_t B, T, BT, C, H, hs, V;
    fsdp_dtype_t dt;           /* the compute dtype: weights, activations, their gradients */
    size_t es;                 /* its element size */
    float att_scale;           /* 1 / sqrt(hs), in f32 */
    float att_div;             /* sqrt(hs) in a 16-bit dtype (the kernel rounds it), else 0 */
    int32_t *tokens, *targets; /* [BT] on the device */
    void **resid;              /* [L + 1]: the input of block l, then the last output */
    block_act_t *act;          /* [L] */
    /* the head: ln_f's output and statistics, logits (then their gradient), losses */
    void *lnf, *logits;
    float *meanf, *rstdf, *losses, *loss;
    void *dres;   /* the gradient of the residual stream, walked down the blocks */
    void *tmp[5]; /* a block's backward scratch */
} gpt2_run_t;

static fsdp_status_t launch(gpt2_run_t *r, const fsdp_kernel_t *k)
{
    return r->dev->ops->kernel(r->dev, r->s, k);
}

static fsdp_status_t alloc_f(gpt2_run_t *r, size_t n, fsdp_mem_category_t cat, float **p)
{
    return fsdp_mem_alloc(r->mem, n * sizeof(float), cat, r->s, (void **)p);
}

/* n elements of the compute dtype */
static fsdp_status_t alloc_a(gpt2_run_t *r, size_t n, fsdp_mem_category_t cat, void **p)
{
    return fsdp_mem_alloc(r->mem, n * r->es, cat, r->s, p);
}

/* frees a buffer of the run and forgets it */
#define FREE(r, p) (fsdp_mem_free((r)->mem, (p)), (p) = NULL)

/* element i of a tensor of the compute dtype */
#define AT(r, p, i) ((const char *)(p) + (size_t)(i) * (r)->es)
#define AT_W(r, p, i) ((char *)(p) + (size_t)(i) * (r)->es)

/* ---- kernel launches ---- */

/* c = alpha op(a) op(b) + beta c, `batch` times with the given strides (elements), then the
 * epilogue epi (NULL: none) */
static fsdp_status_t gemm_epi(gpt2_run_t *r, int ta, int tb, size_t m, size_t n, size_t k,
                              float alpha, const void *a, size_t lda, size_t sa, const void *b,
                              size_t ldb, size_t sb, float beta, void *c, size_t ldc, size_t sc,
                              size_t batch, const fsdp_gemm_epilogue_t *epi)
{
    fsdp_kernel_t d = {.kind = FSDP_K_GEMM}; /* every operand in the compute dtype */
    d.u.gemm.a_dtype = d.u.gemm.b_dtype = d.u.gemm.c_dtype = r->dt;
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
    return fsdp_nn_gemm(r->dev, r->s, &d);
}

static fsdp_status_t gemm_batched(gpt2_run_t *r, int ta, int tb, size_t m, size_t n, size_t k,
                                  float alpha, const void *a, size_t lda, size_t sa, const void *b,
                                  size_t ldb, size_t sb, float beta, void *c, size_t ldc, size_t sc,
                                  size_t batch)
{
    return gemm_epi(r, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch,
                    NULL);
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
    return gemm_epi(r, ta, tb, m, n, k, 1.0f, a, lda, 0, b, ldb, 0, 1.0f, dw, ldc, 0, 1, &epi);
}

/* out[BT, n] = x[BT, k] W[k, n] + bias (Conv1D's addmm), then + residual [BT, n] unless NULL
 * (the block's residual add, a separate torch op: kernel.h's epilogue rounds it apart) */
static fsdp_status_t linear_fwd(gpt2_run_t *r, const void *x, size_t k, const void *w,
                                const void *bias, size_t n, const void *residual, void *out)
{
    fsdp_gemm_epilogue_t epi = {.bias = bias, .bias_dtype = r->dt, .residual = residual};
    return gemm_epi(r, 0, 0, r->BT, n, k, 1.0f, x, k, 0, w, n, 0, 0.0f, out, n, 0, 1, &epi);
}

/* dW[k, n] += x^T dout, dbias += the column sums of dout, dx[BT, k] = dout W^T (dx NULL: not
 * wanted) */
static fsdp_status_t linear_bwd(gpt2_run_t *r, const void *x, size_t k, const void *w, size_t n,
                                const void *dout, void *dw, void *dbias, void *dx)
{
    fsdp_kernel_t d = {.kind = FSDP_K_BIAS_GRAD};
    fsdp_status_t status = grad_gemm(r, 1, 0, k, n, r->BT, x, k, dout, n, dw, n);

    if (status != FSDP_OK)
        return status;
    d.u.bias_grad.dbias = dbias;
    d.u.bias_grad.dy = dout;
    d.u.bias_grad.rows = r->BT;
    d.u.bias_grad.cols = n;
    d.u.bias_grad.dbias_dtype = d.u.bias_grad.dy_dtype = r->dt;
    status = launch(r, &d);
    if (status != FSDP_OK || dx == NULL)
        return status;
    return gemm(r, 0, 1, r->BT, k, n, dout, n, w, n, 0.0f, dx, k);
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
    d.u.layernorm_fwd.rows = r->BT;
    d.u.layernorm_fwd.cols = r->C;
    d.u.layernorm_fwd.eps = r->m->cfg.layer_norm_eps;
    d.u.layernorm_fwd.dtype = r->dt;
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
    d.u.layernorm_bwd.rows = r->BT;
    d.u.layernorm_bwd.cols = r->C;
    d.u.layernorm_bwd.accumulate = accumulate;
    d.u.layernorm_bwd.dtype = r->dt;
    return launch(r, &d);
}

/* ---- attention ---- */

/* y[BT, C] = the heads' softmax(Q K^T / sqrt(hs), causal) V, side by side; att keeps the
 * probabilities. */
static fsdp_status_t attention_fwd(gpt2_run_t *r, const void *qkv, void *att, void *y)
{
    const size_t T = r->T, C = r->C, H = r->H, hs = r->hs, tt = T * T;
    fsdp_kernel_t d = {.kind = FSDP_K_SOFTMAX_FWD};
    fsdp_status_t status = FSDP_OK;

    for (size_t b = 0; b < r->B && status == FSDP_OK; b++) { /* scores = Q K^T, per head */
        const void *q = AT(r, qkv, b * T * 3 * C);
        status = gemm_batched(r, 0, 1, T, T, hs, 1.0f, q, 3 * C, hs, AT(r, q, C), 3 * C, hs, 0.0f,
                              AT_W(r, att, b * H * tt), T, tt, H);
    }
    if (status != FSDP_OK)
        return status;
    d.u.softmax_fwd.y = att;
    d.u.softmax_fwd.x = att;
    d.u.softmax_fwd.rows = r->B * H * T;
    d.u.softmax_fwd.cols = T;
    d.u.softmax_fwd.scale = r->att_scale;
    d.u.softmax_fwd.divisor = r->att_div;
    d.u.softmax_fwd.causal = 1;
    d.u.softmax_fwd.dtype = r->dt;
    status = launch(r, &d);
    for (size_t b = 0; b < r->B && status == FSDP_OK; b++) { /* y_h = att_h V_h */
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
    const size_t T = r->T, C = r->C, H = r->H, hs = r->hs, tt = T * T;
    fsdp_kernel_t d = {.kind = FSDP_K_SOFTMAX_BWD};
    fsdp_status_t status = FSDP_OK;

    for (size_t b = 0; b < r->B && status == FSDP_OK; b++) {
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
    d.u.softmax_bwd.rows = r->B * H * T;
    d.u.softmax_bwd.cols = T;
    d.u.softmax_bwd.scale = r->att_scale;
    d.u.softmax_bwd.divisor = r->att_div;
    d.u.softmax_bwd.causal = 1;
    d.u.softmax_bwd.dtype = r->dt;
    status = launch(r, &d);
    for (size_t b = 0; b < r->B && status == FSDP_OK; b++) {
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

/* ---- blocks ---- */

static size_t act_numel(const gpt2_run_t *r, int i)
{
    switch (i) {
    case A_MEAN1:
    case A_RSTD1:
    case A_MEAN2:
    case A_RSTD2:
        return r->BT;
    case A_QKV:
        return r->BT * 3 * r->C;
    case A_ATT:
        return r->B * r->H * r->T * r->T;
    case A_H:
    case A_G:
        return r->BT * 4 * r->C;
    default:
        return r->BT * r->C;
    }
}

/* its bytes: the layernorm statistics are f32, the rest of the compute dtype */
static size_t act_bytes(const gpt2_run_t *r, int i)
{
    int stat = i == A_MEAN1 || i == A_RSTD1 || i == A_MEAN2 || i == A_RSTD2;
    return act_numel(r, i) * (stat ? sizeof(float) : r->es);
}

static void free_act(gpt2_run_t *r, int l)
{
    for (int i = 0; i < A_COUNT; i++)
        FREE(r, r->act[l].buf[i]);
}

#define P(u, i) ((const void *)fsdp_unit_param((u), (i)))

/* Block l's forward from resid[l]: its activations, and (unless recompute, which stops at
 * what the backward reads) its output resid[l + 1]. */
static fsdp_status_t block_fwd(gpt2_run_t *r, int l, int recompute)
{
    fsdp_unit_t *u = r->m->blocks[l];
    void **a = r->act[l].buf;
    const void *x = r->resid[l];
    const size_t C = r->C, BT = r->BT;
    fsdp_kernel_t d = {.kind = FSDP_K_GELU_FWD};
    fsdp_status_t status = FSDP_OK;

    for (int i = 0; i < A_COUNT && status == FSDP_OK; i++)
        status = fsdp_mem_alloc(r->mem, act_bytes(r, i), FSDP_MEM_ACTIVATION, r->s, &a[i]);
    if (status == FSDP_OK)
        status = layernorm_fwd(r, x, P(u, FSDP_GPT2_LN1_W), P(u, FSDP_GPT2_LN1_B), a[A_LN1],
                               (float *)a[A_MEAN1], (float *)a[A_RSTD1]);
    if (status == FSDP_OK)
        status = linear_fwd(r, a[A_LN1], C, P(u, FSDP_GPT2_ATTN_W), P(u, FSDP_GPT2_ATTN_B), 3 * C,
                            NULL, a[A_QKV]);
    if (status == FSDP_OK)
        status = attention_fwd(r, a[A_QKV], a[A_ATT], a[A_Y]);
    if (status == FSDP_OK)
        status = linear_fwd(r, a[A_Y], C, P(u, FSDP_GPT2_ATTN_PROJ_W), P(u, FSDP_GPT2_ATTN_PROJ_B),
                            C, x, a[A_XMID]);
    if (status == FSDP_OK)
        status = layernorm_fwd(r, a[A_XMID], P(u, FSDP_GPT2_LN2_W), P(u, FSDP_GPT2_LN2_B), a[A_LN2],
                               (float *)a[A_MEAN2], (float *)a[A_RSTD2]);
    if (status == FSDP_OK)
        status = linear_fwd(r, a[A_LN2], C, P(u, FSDP_GPT2_FC_W), P(u, FSDP_GPT2_FC_B), 4 * C, NULL,
                            a[A_H]);
    if (status == FSDP_OK) {
        d.u.gelu_fwd.y = a[A_G];
        d.u.gelu_fwd.x = a[A_H];
        d.u.gelu_fwd.n = BT * 4 * C;
        d.u.gelu_fwd.dtype = r->dt;
        status = launch(r, &d);
    }
    if (status != FSDP_OK || recompute)
        return status;
    status = alloc_a(r, BT * C, FSDP_MEM_ACTIVATION, &r->resid[l + 1]);
    if (status == FSDP_OK)
        status = linear_fwd(r, a[A_G], 4 * C, P(u, FSDP_GPT2_FC_PROJ_W), P(u, FSDP_GPT2_FC_PROJ_B),
                            C, a[A_XMID], r->resid[l + 1]);
    return status;
}

/* Block l's backward: r->dres holds the gradient of its output and becomes that of its
 * input; the parameter gradients accumulate into the unit's. */
static fsdp_status_t block_bwd(gpt2_run_t *r, int l)
{
    fsdp_unit_t *u = r->m->blocks[l];
    void **a = r->act[l].buf, *g[FSDP_GPT2_BLOCK_NPARAMS];
    void **dh = &r->tmp[0], **dln = &r->tmp[1], **dy = &r->tmp[2], **datt = &r->tmp[3];
    void **dqkv = &r->tmp[4];
    const size_t C = r->C, BT = r->BT;
    fsdp_kernel_t d = {.kind = FSDP_K_GELU_BWD};
    fsdp_status_t status = FSDP_OK;

    for (int i = 0; i < FSDP_GPT2_BLOCK_NPARAMS && status == FSDP_OK; i++)
        status = fsdp_unit_grad(u, i, &g[i]);
    /* MLP: dG = dres W_proj^T, dH = dG gelu'(H), dln2 = dH W_fc^T */
    if (status == FSDP_OK)
        status = alloc_a(r, BT * 4 * C, FSDP_MEM_TEMPORARY, dh);
    if (status == FSDP_OK)
        status = linear_bwd(r, a[A_G], 4 * C, P(u, FSDP_GPT2_FC_PROJ_W), C, r->dres,
                            g[FSDP_GPT2_FC_PROJ_W], g[FSDP_GPT2_FC_PROJ_B], *dh);
    if (status == FSDP_OK) {
        d.u.gelu_bwd.dx = *dh;
        d.u.gelu_bwd.dy = *dh;
        d.u.gelu_bwd.x = a[A_H];
        d.u.gelu_bwd.n = BT * 4 * C;
        d.u.gelu_bwd.dtype = r->dt;
        status = launch(r, &d);
    }
    if (status == FSDP_OK)
        status = alloc_a(r, BT * C, FSDP_MEM_TEMPORARY, dln);
    if (status == FSDP_OK)
        status = linear_bwd(r, a[A_LN2], C, P(u, FSDP_GPT2_FC_W), 4 * C, *dh, g[FSDP_GPT2_FC_W],
                            g[FSDP_GPT2_FC_B], *dln);
    FREE(r, *dh);
    /* the mid residual: dres += ln_2's input gradient */
    if (status == FSDP_OK)
        status = layernorm_bwd(r, *dln, a[A_XMID], (float *)a[A_MEAN2], (float *)a[A_RSTD2],
                               P(u, FSDP_GPT2_LN2_W), r->dres, 1, g[FSDP_GPT2_LN2_W],
                               g[FSDP_GPT2_LN2_B]);
    /* attention */
    if (status == FSDP_OK)
        status = alloc_a(r, BT * C, FSDP_MEM_TEMPORARY, dy);
    if (status == FSDP_OK)
        status = linear_bwd(r, a[A_Y], C, P(u, FSDP_GPT2_ATTN_PROJ_W), C, r->dres,
                            g[FSDP_GPT2_ATTN_PROJ_W], g[FSDP_GPT2_ATTN_PROJ_B], *dy);
    if (status == FSDP_OK)
        status = alloc_a(r, act_numel(r, A_ATT), FSDP_MEM_TEMPORARY, datt);
    if (status == FSDP_OK)
        status = alloc_a(r, BT * 3 * C, FSDP_MEM_TEMPORARY, dqkv);
    if (status == FSDP_OK)
        status = attention_bwd(r, a[A_QKV], a[A_ATT], *dy, *datt, *dqkv);
    FREE(r, *datt);
    FREE(r, *dy);
    if (status == FSDP_OK)
        status = linear_bwd(r, a[A_LN1], C, P(u, FSDP_GPT2_ATTN_W), 3 * C, *dqkv,
                            g[FSDP_GPT2_ATTN_W], g[FSDP_GPT2_ATTN_B], *dln);
    FREE(r, *dqkv);
    /* the block's input: dres += ln_1's input gradient */
    if (status == FSDP_OK)
        status = layernorm_bwd(r, *dln, r->resid[l], (float *)a[A_MEAN1], (float *)a[A_RSTD1],
                               P(u, FSDP_GPT2_LN1_W), r->dres, 1, g[FSDP_GPT2_LN1_W],
                               g[FSDP_GPT2_LN1_B]);
    FREE(r, *dln);
    return status;
}

/* ---- the step ---- */

/* Checks the batch on the host; *count_p gets the number of targets to predict. */
static fsdp_status_t check_batch(const fsdp_gpt2_t *m, const int32_t *inputs,
                                 const int32_t *targets, size_t batch, size_t seq, size_t *count_p)
{
    const fsdp_gpt2_config_t *cfg = &m->cfg;
    size_t count = 0, n;

    if (batch == 0 || seq == 0 || seq > (size_t)cfg->n_positions) {
        fsdp_error("gpt2: a batch needs at least one row and 1 to %d tokens per row (the "
                   "model's positions), not %zu x %zu",
                   cfg->n_positions, batch, seq);
        return FSDP_ERR_INVALID_PARAM;
    }
    /* the largest buffers, logits [B*T, V] and att [B, H, T, T], in bytes */
    if ((double)batch * (double)seq *
            ((double)cfg->vocab_size + 16.0 * cfg->n_embd + (double)cfg->n_head * (double)seq) *
            4.0 >
        0x1p60) {
        fsdp_error("gpt2: a batch of %zu x %zu is too large", batch, seq);
        return FSDP_ERR_INVALID_PARAM;
    }
    n = batch * seq;
    if (inputs == NULL || targets == NULL) {
        if (!fsdp_device(m->fs)->no_data) {
            fsdp_error("gpt2: inputs and targets are NULL (allowed in shape mode only)");
            return FSDP_ERR_INVALID_PARAM;
        }
        *count_p = n;
        return FSDP_OK;
    }
    for (size_t i = 0; i < n; i++) {
        if (inputs[i] < 0 || inputs[i] >= cfg->vocab_size) {
            fsdp_error("gpt2: input token %d at row %zu position %zu is outside the vocabulary "
                       "[0, %d)",
                       (int)inputs[i], i / seq, i % seq, cfg->vocab_size);
            return FSDP_ERR_INVALID_PARAM;
        }
        if (targets[i] >= cfg->vocab_size) {
            fsdp_error("gpt2: target token %d at row %zu position %zu is outside the vocabulary "
                       "[0, %d) (negative targets are ignored)",
                       (int)targets[i], i / seq, i % seq, cfg->vocab_size);
            return FSDP_ERR_INVALID_PARAM;
        }
        count += targets[i] >= 0;
    }
    if (count == 0) {
        fsdp_error("gpt2: every target of the batch is ignored: no loss to compute");
        return FSDP_ERR_INVALID_PARAM;
    }
    *count_p = count;
    return FSDP_OK;
}

static void run_cleanup(gpt2_run_t *r)
{
    int L = r->m->cfg.n_layer;

    for (int l = 0; r->act != NULL && l < L; l++)
        free_act(r, l);
    for (int l = 0; r->resid != NULL && l <= L; l++)
        FREE(r, r->resid[l]);
    for (int i = 0; i < 5; i++)
        FREE(r, r->tmp[i]);
    FREE(r, r->dres);
    FREE(r, r->logits);
    FREE(r, r->losses);
    FREE(r, r->loss);
    FREE(r, r->lnf);
    FREE(r, r->meanf);
    FREE(r, r->rstdf);
    fsdp_mem_free(r->mem, r->tokens);
    fsdp_mem_free(r->mem, r->targets);
    free(r->act);
    free(r->resid);
}

/* The forward up to the logits, inside the root's forward hooks. */
static fsdp_status_t forward(gpt2_run_t *r)
{
    fsdp_gpt2_t *m = r->m;
    const int L = m->cfg.n_layer;
    fsdp_kernel_t d = {.kind = FSDP_K_EMBEDDING_FWD};
    fsdp_status_t status = fsdp_pre_forward(m->root);

    if (status == FSDP_OK)
        status = alloc_a(r, r->BT * r->C, FSDP_MEM_ACTIVATION, &r->resid[0]);
    if (status == FSDP_OK) {
        d.u.embedding_fwd.y = r->resid[0];
        d.u.embedding_fwd.tokens = r->tokens;
        d.u.embedding_fwd.wte = P(m->root, FSDP_GPT2_WTE);
        d.u.embedding_fwd.wpe = P(m->root, FSDP_GPT2_WPE);
        d.u.embedding_fwd.rows = r->BT;
        d.u.embedding_fwd.cols = r->C;
        d.u.embedding_fwd.seq = r->T;
        d.u.embedding_fwd.vocab = r->V;
        d.u.embedding_fwd.dtype = r->dt;
        status = launch(r, &d);
    }
    for (int l = 0; l < L && status == FSDP_OK; l++) {
        status = fsdp_pre_forward(m->blocks[l]);
        if (status == FSDP_OK)
            status = block_fwd(r, l, 0);
        if (status == FSDP_OK)
            status = fsdp_post_forward(m->blocks[l]);
        if (m->checkpoint[l])
            free_act(r, l);
    }
    /* ln_f, then the LM head: logits = ln_f(x) wte^T */
    if (status == FSDP_OK)
        status = alloc_a(r, r->BT * r->C, FSDP_MEM_ACTIVATION, &r->lnf);
    if (status == FSDP_OK)
        status = alloc_f(r, r->BT, FSDP_MEM_ACTIVATION, &r->meanf);
    if (status == FSDP_OK)
        status = alloc_f(r, r->BT, FSDP_MEM_ACTIVATION, &r->rstdf);
    if (status == FSDP_OK)
        status = layernorm_fwd(r, r->resid[L], P(m->root, FSDP_GPT2_LNF_W),
                               P(m->root, FSDP_GPT2_LNF_B), r->lnf, r->meanf, r->rstdf);
    if (status == FSDP_OK)
        status = alloc_a(r, r->BT * r->V, FSDP_MEM_ACTIVATION, &r->logits);
    if (status == FSDP_OK)
        status = gemm(r, 0, 1, r->BT, r->V, r->C, r->lnf, r->C, P(m->root, FSDP_GPT2_WTE), r->C,
                      0.0f, r->logits, r->V);
    if (status == FSDP_OK)
        status = fsdp_post_forward(m->root);
    return status;
}

/* The loss and the logits' gradient (in place), then the backward through every unit. */
static fsdp_status_t backward(gpt2_run_t *r, double denom)
{
    fsdp_gpt2_t *m = r->m;
    const int L = m->cfg.n_layer;
    fsdp_kernel_t d = {.kind = FSDP_K_CROSS_ENTROPY};
    void *g[FSDP_GPT2_ROOT_NPARAMS];
    fsdp_status_t status;

    status = alloc_f(r, r->BT, FSDP_MEM_TEMPORARY, &r->losses);
    if (status == FSDP_OK)
        status = alloc_f(r, 1, FSDP_MEM_TEMPORARY, &r->loss);
    if (status != FSDP_OK)
        return status;
    d.u.cross_entropy.loss = r->loss;
    d.u.cross_entropy.losses = r->losses;
    d.u.cross_entropy.dlogits = r->logits;
    d.u.cross_entropy.logits = r->logits;
    d.u.cross_entropy.targets = r->targets;
    d.u.cross_entropy.rows = r->BT;
    d.u.cross_entropy.vocab = r->V;
    d.u.cross_entropy.denom = denom;
    d.u.cross_entropy.dtype = r->dt;
    status = launch(r, &d);

    /* the root's gradient arrives first: the LM head and ln_f */
    if (status == FSDP_OK)
        status = fsdp_pre_backward(m->root);
    for (int i = 0; i < FSDP_GPT2_ROOT_NPARAMS && status == FSDP_OK; i++)
        status = fsdp_unit_grad(m->root, i, &g[i]);
    if (status == FSDP_OK)
        status = alloc_a(r, r->BT * r->C, FSDP_MEM_TEMPORARY, &r->tmp[0]);
    /* dln_f = dlogits wte, dwte += dlogits^T ln_f */
    if (status == FSDP_OK)
        status = gemm(r, 0, 0, r->BT, r->C, r->V, r->logits, r->V, P(m->root, FSDP_GPT2_WTE), r->C,
                      0.0f, r->tmp[0], r->C);
    if (status == FSDP_OK)
        status = grad_gemm(r, 1, 0, r->V, r->C, r->BT, r->logits, r->V, r->lnf, r->C,
                           g[FSDP_GPT2_WTE], r->C);
    FREE(r, r->logits);
    if (status == FSDP_OK)
        status = alloc_a(r, r->BT * r->C, FSDP_MEM_TEMPORARY, &r->dres);
    if (status == FSDP_OK)
        status = layernorm_bwd(r, r->tmp[0], r->resid[L], r->meanf, r->rstdf,
                               P(m->root, FSDP_GPT2_LNF_W), r->dres, 0, g[FSDP_GPT2_LNF_W],
                               g[FSDP_GPT2_LNF_B]);
    FREE(r, r->tmp[0]);
    FREE(r, r->lnf);
    FREE(r, r->meanf);
    FREE(r, r->rstdf);
    FREE(r, r->resid[L]);

    for (int l = L - 1; l >= 0 && status == FSDP_OK; l--) {
        status = fsdp_pre_backward(m->blocks[l]);
        if (status == FSDP_OK && m->checkpoint[l])
            status = block_fwd(r, l, 1); /* the hooks of forward are not re-run */
        if (status == FSDP_OK)
            status = block_bwd(r, l);
        if (status == FSDP_OK)
            status = fsdp_post_backward(m->blocks[l]);
        free_act(r, l);
        if (l > 0)
            FREE(r, r->resid[l]);
    }
    FREE(r, r->resid[0]);

    /* the embeddings: the token rows of wte (on top of the LM head's) and wpe */
    if (status == FSDP_OK) {
        fsdp_kernel_t e = {.kind = FSDP_K_EMBEDDING_BWD};
        e.u.embedding_bwd.dwte = g[FSDP_GPT2_WTE];
        e.u.embedding_bwd.dwpe = g[FSDP_GPT2_WPE];
        e.u.embedding_bwd.dy = r->dres;
        e.u.embedding_bwd.tokens = r->tokens;
        e.u.embedding_bwd.rows = r->BT;
        e.u.embedding_bwd.cols = r->C;
        e.u.embedding_bwd.seq = r->T;
        e.u.embedding_bwd.vocab = r->V;
        e.u.embedding_bwd.dtype = r->dt;
        status = launch(r, &e);
    }
    FREE(r, r->dres);
    if (status == FSDP_OK)
        status = fsdp_post_backward(m->root);
    if (status == FSDP_OK)
        status = fsdp_final_callback(m->fs);
    return status;
}

fsdp_status_t fsdp_gpt2_forward_backward(fsdp_gpt2_t *model, const int32_t *inputs,
                                         const int32_t *targets, size_t batch, size_t seq,
                                         float *loss_p)
{
    fsdp_t *fs = model->fs;
    gpt2_run_t run;
    size_t count = 0;
    fsdp_status_t status;

    status = check_batch(model, inputs, targets, batch, seq, &count);
    if (status != FSDP_OK)
        return status;
    memset(&run, 0, sizeof(run));
    run.m = model;
    run.dev = fsdp_device(fs);
    run.s = fsdp_compute_stream(fs);
    run.mem = fsdp_memory(fs);
    run.B = batch;
    run.T = seq;
    run.BT = batch * seq;
    run.C = (size_t)model->cfg.n_embd;
    run.H = (size_t)model->cfg.n_head;
    run.hs = run.C / run.H;
    run.V = (size_t)model->cfg.vocab_size;
    run.att_scale = (float)(1.0 / sqrt((double)run.hs));
    run.dt = fsdp_unit_compute_dtype(model->root);
    run.att_div = run.dt != FSDP_DTYPE_F32 ? (float)sqrt((double)run.hs) : 0.0f;
    run.es = fsdp_dtype_size(run.dt);
    for (int l = 0; l < model->cfg.n_layer; l++) {
        if (fsdp_unit_compute_dtype(model->blocks[l]) != run.dt) {
            fsdp_error("gpt2: block %d computes in %s, the root in %s; the model needs one "
                       "compute dtype",
                       l, fsdp_dtype_name(fsdp_unit_compute_dtype(model->blocks[l])),
                       fsdp_dtype_name(run.dt));
            return FSDP_ERR_INVALID_PARAM;
        }
    }
    run.resid = calloc((size_t)model->cfg.n_layer + 1, sizeof(*run.resid));
    run.act = calloc((size_t)model->cfg.n_layer, sizeof(*run.act));
    if (run.resid == NULL || run.act == NULL) {
        status = FSDP_ERR_NO_MEMORY;
        goto out;
    }
    status = fsdp_nn_batch_to_device(run.dev, run.mem, run.s, inputs, targets, run.BT,
                                     &run.tokens, &run.targets);
    if (status == FSDP_OK)
        status = forward(&run);
    /* the scale divides the denominator: the loss and every gradient carry it */
    if (status == FSDP_OK)
        status = backward(&run, (double)count / (double)model->loss_scale);
    if (status == FSDP_OK)
        status = fsdp_nn_loss_to_host(run.dev, run.s, run.loss, model->loss_scale, loss_p);
out:
    run_cleanup(&run);
    return status;
}
