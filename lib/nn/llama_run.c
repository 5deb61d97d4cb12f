/* Llama forward and backward on one rank, through backend kernels and the FSDP hooks.
 *
 * Layout: activations are row-major [B*T, width]. q [B*T, H hd], k and v [B*T, K hd] (head h at
 * column h hd) are written by three GEMMs, q and k rotated in place; the fused attention reads
 * them and writes o [B*T, H hd]. Their gradients share one [B*T, (H + 2K) hd] buffer (dq at
 * column 0, dk at H hd, dv at (H + K) hd). The weights are nn.Linear's [out, in]: y = x W^T,
 * dx = dy W, dW += dy^T x.
 *
 * Mixed precision: as gpt2_run.c, everything runs in the units' compute dtype, each kernel rounds
 * its outputs once (and where kernel.h says HF's eager ops round in between); RMSNorm statistics,
 * the attention's log-sum-exp and the losses are f32, and so is the loss.
 *
 * Memory: a layer keeps its input and what its backward reads: the two normalized inputs and
 * their rstd, q k v (rotated), the attention output and its log-sum-exp, the mid residual, gate,
 * up and the SwiGLU output; nothing of [T, T]: O(T) per layer. A fully checkpointed layer keeps
 * only its input and recomputes the rest after its pre-backward hook; under the selective op
 * policy it keeps SAVED_OP below and recomputes the others. The rotary tables [T, hd / 2]
 * are made on the host for the step and copied once.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp/log.h>

#include "nn/llama_int.h"

/* what a layer's backward reads, by index; with eager memory (fsdp_llama_set_eager_memory) also
 * what eager autograd saves beyond it: RMSNorm's f32 upcast of its input (U) and its product in
 * the compute dtype before the weight (HB), SiLU's output */
enum {
    A_N1, A_RSTD1, A_Q, A_K, A_V, A_O, A_LSE, A_H, A_N2, A_RSTD2, A_GATE, A_UP, A_ACT,
    A_U1, A_HB1, A_U2, A_HB2, A_SILU, A_COUNT
};

#define BIT(i) (1u << (i))
#define FUSED_ACT (BIT(A_ACT + 1) - 1u)
#define ALL_ACT (BIT(A_COUNT) - 1u)
/* torchtitan's selective op policy (llama.h): the attention's outputs and every other matmul's
 * in forward order, q (1st), v (3rd), gate (5th); k, o and up (2nd, 4th, 6th) are recomputed */
#define SAVED_OP (BIT(A_Q) | BIT(A_V) | BIT(A_O) | BIT(A_LSE) | BIT(A_GATE))

typedef struct llama_run {
    fsdp_lm_run_t lm; /* first: the step's callbacks get &run.lm (lm.c) */
    fsdp_llama_t *m;
    size_t D, H, K, hd, F;
    size_t qw, kw, w; /* H hd, K hd, and the q k v row: qw + 2 kw */
    float *cos, *sin; /* [T, hd / 2] */
    float *host_rope; /* their host copy, kept until the step has synchronized */
    /* eager memory: on; the compute dtype is not f32, so that RMSNorm and the loss upcast into
     * new f32 tensors (in f32 .float() is the tensor itself); the final norm's upcast and
     * product, the log-softmax the loss saves */
    int eager, upcast;
    void *uf, *hbf, *logsm;
} llama_run_t;

static fsdp_status_t launch(llama_run_t *r, const fsdp_kernel_t *k)
{
    return fsdp_lm_launch(&r->lm, k);
}

/* n elements of the compute dtype */
static fsdp_status_t alloc_a(llama_run_t *r, size_t n, fsdp_mem_category_t cat, void **p)
{
    return fsdp_lm_alloc(&r->lm, n, cat, p);
}

static fsdp_status_t alloc_f(llama_run_t *r, size_t n, fsdp_mem_category_t cat, void **p)
{
    return fsdp_lm_alloc_f(&r->lm, n, cat, (float **)p);
}

#define FREE(r, p) FSDP_LM_FREE(&(r)->lm, p)
#define AT(r, p, i) ((char *)(p) + (size_t)(i) * (r)->lm.es)
#define P(u, i) ((const void *)fsdp_unit_param((u), (i)))
/* layer l's activations */
#define ACT(r, l) (((void *(*)[A_COUNT])(r)->lm.acts)[l])

/* ---- kernel launches ---- */

/* b_version: fsdp_unit_param_version of a parameter B, or 0 */
static fsdp_status_t gemm_v(llama_run_t *r, int ta, int tb, size_t m, size_t n, size_t k,
                            const void *a, size_t lda, const void *b, size_t ldb, float beta,
                            void *c, size_t ldc, uint64_t b_version)
{
    fsdp_kernel_t d = {.kind = FSDP_K_GEMM};
    d.u.gemm.a_dtype = d.u.gemm.b_dtype = d.u.gemm.c_dtype = r->lm.dt;
    d.u.gemm.trans_a = ta;
    d.u.gemm.trans_b = tb;
    d.u.gemm.m = m;
    d.u.gemm.n = n;
    d.u.gemm.k = k;
    d.u.gemm.alpha = 1.0f;
    d.u.gemm.a = a;
    d.u.gemm.lda = lda;
    d.u.gemm.b = b;
    d.u.gemm.ldb = ldb;
    d.u.gemm.beta = beta;
    d.u.gemm.c = c;
    d.u.gemm.ldc = ldc;
    /* beta 1 adds a new gradient to one already held (weight gradients across micro-batches,
     * the input gradients of q, k and v, of gate and up): in a 16-bit dtype rounded, then the
     * sum rounded, as autograd accumulates (kernel.h's accumulate; in f32 the same bits) */
    d.u.gemm.epilogue.accumulate = beta == 1.0f;
    d.u.gemm.b_version = b_version;
    return launch(r, &d);
}

static fsdp_status_t gemm(llama_run_t *r, int ta, int tb, size_t m, size_t n, size_t k,
                          const void *a, size_t lda, const void *b, size_t ldb, float beta, void *c,
                          size_t ldc)
{
    return gemm_v(r, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, 0);
}

/* y[BT, out] (row stride ldy) = x[BT, in] W^T */
static fsdp_status_t linear_fwd(llama_run_t *r, const void *x, size_t in, const void *w, size_t out,
                                void *y, size_t ldy)
{
    return gemm(r, 0, 1, r->lm.BT, out, in, x, in, w, in, 0.0f, y, ldy);
}

/* dW[out, in] += dy^T x; dx[BT, in] = dy W, or += when accumulate (dx NULL: not wanted) */
static fsdp_status_t linear_bwd(llama_run_t *r, const void *x, size_t in, const void *w, size_t out,
                                const void *dy, size_t lddy, void *dw, void *dx, int accumulate)
{
    fsdp_status_t status = gemm(r, 1, 0, out, in, r->lm.BT, dy, lddy, x, in, 1.0f, dw, in);
    if (status != FSDP_OK || dx == NULL)
        return status;
    return gemm(r, 0, 0, r->lm.BT, in, out, dy, lddy, w, in, accumulate ? 1.0f : 0.0f, dx, in);
}

static fsdp_status_t rmsnorm_fwd(llama_run_t *r, const void *x, const void *w, void *y, float *rstd)
{
    fsdp_kernel_t d = {.kind = FSDP_K_RMSNORM_FWD};
    d.u.rmsnorm_fwd.y = y;
    d.u.rmsnorm_fwd.rstd = rstd;
    d.u.rmsnorm_fwd.x = x;
    d.u.rmsnorm_fwd.weight = w;
    d.u.rmsnorm_fwd.rows = r->lm.rows; /* sequence shards under tensor parallelism */
    d.u.rmsnorm_fwd.cols = r->D;
    d.u.rmsnorm_fwd.eps = r->m->cfg.rms_norm_eps;
    d.u.rmsnorm_fwd.dtype = r->lm.dt;
    return launch(r, &d);
}

static fsdp_status_t rmsnorm_bwd(llama_run_t *r, const void *dy, const void *x, const float *rstd,
                                 const void *w, void *dx, int accumulate, void *dw)
{
    fsdp_kernel_t d = {.kind = FSDP_K_RMSNORM_BWD};
    d.u.rmsnorm_bwd.dx = dx;
    d.u.rmsnorm_bwd.dweight = dw;
    d.u.rmsnorm_bwd.dy = dy;
    d.u.rmsnorm_bwd.x = x;
    d.u.rmsnorm_bwd.rstd = rstd;
    d.u.rmsnorm_bwd.weight = w;
    d.u.rmsnorm_bwd.rows = r->lm.rows;
    d.u.rmsnorm_bwd.cols = r->D;
    d.u.rmsnorm_bwd.accumulate = accumulate;
    d.u.rmsnorm_bwd.dtype = r->lm.dt;
    return launch(r, &d);
}

/* Rotates `heads` heads of rows of stride ld (q or k, or their gradients) in place. */
static fsdp_status_t rope(llama_run_t *r, fsdp_kernel_kind_t kind, void *x, size_t heads, size_t ld)
{
    fsdp_kernel_t d = {.kind = kind};

    d.u.rope.y = x;
    d.u.rope.x = x;
    d.u.rope.cos = r->cos;
    d.u.rope.sin = r->sin;
    d.u.rope.rows = r->lm.BT;
    d.u.rope.heads = heads;
    d.u.rope.head_dim = r->hd;
    d.u.rope.seq = r->lm.T;
    d.u.rope.ld = ld;
    d.u.rope.dtype = r->lm.dt;
    return launch(r, &d);
}

static fsdp_status_t add(llama_run_t *r, void *y, const void *a, const void *b, size_t n)
{
    fsdp_kernel_t d = {.kind = FSDP_K_ADD};
    d.u.add.y = y;
    d.u.add.a = a;
    d.u.add.b = b;
    d.u.add.n = n;
    d.u.add.dtype = r->lm.dt;
    return launch(r, &d);
}


/* ---- eager memory ----
 *
 * What HF's eager LlamaForCausalLM and autograd allocate, saved tensors (ACTIVATION) and the
 * intermediates they free at once (TEMPORARY), in the order eager PyTorch allocates and frees
 * them; docs/costs.md, "The memory of eager autograd", lists each with its source. Shape mode
 * only: the fused kernels are launched as before, on pointers that need not hold their data. */

static fsdp_status_t ealloc(llama_run_t *r, size_t bytes, fsdp_mem_category_t cat, void **p)
{
    return fsdp_mem_alloc(r->lm.mem, bytes, cat, r->lm.s, p);
}

/* RMSNorm's forward on [BT, D]: h = x.to(f32) (saved by pow and mul; x itself in f32),
 * h.pow(2) until mean, rstd = rsqrt(mean + eps) (saved by mul), h * rstd in f32 until
 * .to(dtype), hb = that (saved by weight *), y = weight * hb (saved by the Linears that read it).
 * *rstd and *y are allocated only when NULL (the final norm's come from lm.c). */
static fsdp_status_t eager_rmsnorm(llama_run_t *r, void **u, void **rstd, void **hb, void **y)
{
    /* a sequence shard under tensor parallelism; y is what the Linears after it read, the
     * all-gathered [BT, D] */
    const size_t n = r->lm.rows * r->D, es = r->lm.es;
    void *t = NULL;
    fsdp_status_t status = FSDP_OK;

    if (r->upcast)
        status = ealloc(r, 4 * n, FSDP_MEM_ACTIVATION, u);
    if (status == FSDP_OK)
        status = ealloc(r, 4 * n, FSDP_MEM_TEMPORARY, &t); /* pow(2) */
    if (status == FSDP_OK && *rstd == NULL)
        status = ealloc(r, 4 * r->lm.rows, FSDP_MEM_ACTIVATION, rstd);
    FREE(r, t);
    if (status == FSDP_OK && r->upcast)
        status = ealloc(r, 4 * n, FSDP_MEM_TEMPORARY, &t); /* h * rstd before .to(dtype) */
    if (status == FSDP_OK)
        status = ealloc(r, es * n, FSDP_MEM_ACTIVATION, hb);
    FREE(r, t);
    if (status == FSDP_OK && *y == NULL)
        status = ealloc(r, es * r->lm.BT * r->D, FSDP_MEM_ACTIVATION, y);
    return status;
}

/* RMSNorm's backward, the gradients autograd makes in turn: hb's (dy * weight) and the
 * weight's product (dy * hb, summed), .to(dtype)'s back to f32, mul's for h (kept until pow's
 * arrives and is added in place) and for rstd (dy * h, summed), mean's expanded / D, pow's
 * (h.pow(1), 2 x, x the gradient), h's .to(f32)'s back to the dtype, added to the residual's
 * gradient. Then frees the norm's saved u, hb and rstd. */
static fsdp_status_t eager_rmsnorm_bwd(llama_run_t *r, void **u, void **hb, void **rstd)
{
    const size_t n = r->lm.rows * r->D, es = r->lm.es;
    void *dhb = NULL, *dhn = NULL, *dh = NULL, *t = NULL, *gm = NULL, *p1 = NULL, *p2 = NULL;
    fsdp_status_t status = ealloc(r, es * n, FSDP_MEM_TEMPORARY, &dhb);

    if (status == FSDP_OK)
        status = ealloc(r, es * n, FSDP_MEM_TEMPORARY, &t); /* dy * hb */
    FREE(r, t);
    if (status == FSDP_OK && r->upcast)
        status = ealloc(r, 4 * n, FSDP_MEM_TEMPORARY, &dhn);
    if (r->upcast)
        FREE(r, dhb);
    else
        dhn = dhb, dhb = NULL;
    if (status == FSDP_OK)
        status = ealloc(r, 4 * n, FSDP_MEM_TEMPORARY, &dh); /* dhn * rstd */
    if (status == FSDP_OK)
        status = ealloc(r, 4 * n, FSDP_MEM_TEMPORARY, &t); /* dhn * h, summed over rows */
    FREE(r, t);
    FREE(r, dhn);
    if (status == FSDP_OK)
        status = ealloc(r, 4 * n, FSDP_MEM_TEMPORARY, &gm);
    if (status == FSDP_OK)
        status = ealloc(r, 4 * n, FSDP_MEM_TEMPORARY, &p1);
    if (status == FSDP_OK)
        status = ealloc(r, 4 * n, FSDP_MEM_TEMPORARY, &p2);
    FREE(r, p1);
    if (status == FSDP_OK)
        status = ealloc(r, 4 * n, FSDP_MEM_TEMPORARY, &t); /* gm * 2 h, added into dh */
    FREE(r, p2);
    FREE(r, gm);
    FREE(r, t);
    if (status == FSDP_OK && r->upcast)
        status = ealloc(r, es * n, FSDP_MEM_TEMPORARY, &t); /* x's gradient */
    FREE(r, dh);
    FREE(r, t);
    FREE(r, *u);
    FREE(r, *hb);
    FREE(r, *rstd);
    return status;
}

/* The rotary embedding of q or k (`heads` heads) into a new tensor *out: q * cos, -x2, the cat
 * of rotate_half, its * sin, the sum; cos and sin are saved, the input is not. */
static fsdp_status_t eager_rope(llama_run_t *r, size_t heads, fsdp_mem_category_t cat, void **out)
{
    const size_t b = r->lm.BT * heads * r->hd * r->lm.es;
    void *qc = NULL, *neg = NULL, *rot = NULL, *rs = NULL;
    fsdp_status_t status = ealloc(r, b, FSDP_MEM_TEMPORARY, &qc);

    if (status == FSDP_OK)
        status = ealloc(r, b / 2, FSDP_MEM_TEMPORARY, &neg);
    if (status == FSDP_OK)
        status = ealloc(r, b, FSDP_MEM_TEMPORARY, &rot);
    FREE(r, neg);
    if (status == FSDP_OK)
        status = ealloc(r, b, FSDP_MEM_TEMPORARY, &rs);
    FREE(r, rot);
    if (status == FSDP_OK)
        status = ealloc(r, b, cat, out);
    FREE(r, qc);
    FREE(r, rs);
    return status;
}

/* Its backward: g * cos and g * sin, rotate_half's: neg's gradient, the two slice backwards
 * (zeros, slice_scatter), each added in place into g * cos, which becomes the input's gradient
 * (the fused kernel's in dqkv). */
static fsdp_status_t eager_rope_bwd(llama_run_t *r, size_t heads)
{
    const size_t b = r->lm.BT * heads * r->hd * r->lm.es;
    void *gc = NULL, *gs = NULL, *gn = NULL, *z = NULL;
    fsdp_status_t status = ealloc(r, b, FSDP_MEM_TEMPORARY, &gc);

    if (status == FSDP_OK)
        status = ealloc(r, b, FSDP_MEM_TEMPORARY, &gs);
    if (status == FSDP_OK)
        status = ealloc(r, b / 2, FSDP_MEM_TEMPORARY, &gn);
    if (status == FSDP_OK)
        status = ealloc(r, b, FSDP_MEM_TEMPORARY, &z);
    FREE(r, gn);
    FREE(r, z);
    if (status == FSDP_OK)
        status = ealloc(r, b, FSDP_MEM_TEMPORARY, &z);
    FREE(r, z);
    FREE(r, gs);
    FREE(r, gc);
    return status;
}

/* ---- layers ---- */

static size_t act_bytes(const llama_run_t *r, int i)
{
    switch (i) {
    case A_RSTD1:
    case A_RSTD2:
        return r->lm.rows * sizeof(float);
    case A_H: /* the mid residual: a sequence shard under tensor parallelism */
        return r->lm.rows * r->D * r->lm.es;
    case A_LSE:
        return r->lm.B * r->H * r->lm.T * sizeof(float);
    case A_Q:
    case A_O:
        return r->lm.BT * r->qw * r->lm.es;
    case A_K:
    case A_V:
        return r->lm.BT * r->kw * r->lm.es;
    case A_GATE:
    case A_UP:
    case A_ACT:
        return r->lm.BT * r->F * r->lm.es;
    default:
        return r->lm.BT * r->D * r->lm.es;
    }
}

/* Frees layer l's activations in mask. */
static void free_act(llama_run_t *r, int l, unsigned mask)
{
    for (int i = 0; i < A_COUNT; i++) {
        if (mask & BIT(i))
            FREE(r, ACT(r, l)[i]);
    }
}

/* What the fused attention's forward and backward descriptors (kernel.h) share: q k v, o and
 * its log-sum-exp in the layer's activations a, the shapes and row strides, the scale. */
#define ATTENTION_ARGS(x, r, a)                                                                    \
    ((x).o = (a)[A_O], (x).lse = (a)[A_LSE], (x).q = (a)[A_Q], (x).k = (a)[A_K], (x).v = (a)[A_V], \
     (x).batch = (r)->lm.B, (x).seq = (r)->lm.T, (x).heads = (r)->H, (x).kv_heads = (r)->K,        \
     (x).head_dim = (r)->hd, (x).ldq = (r)->qw, (x).ldk = (r)->kw, (x).ldv = (r)->kw,              \
     (x).ldo = (r)->qw, (x).scale = (float)(1.0 / sqrt((double)(r)->hd)), (x).causal = 1,          \
     (x).dtype = (r)->lm.dt)

/* ---- tensor parallelism (torchtitan's plan for a layer) ---- */

/* An RMSNorm on the sequence shard x (SequenceParallel) into the all-gathered y [BT, D] that the
 * column-parallel q, k, v (gate, up) read (PrepareModuleInput's Shard(1) -> Replicate); its rstd
 * stays the shard's. Without tensor parallelism the norm itself. */
static fsdp_status_t norm_gather(llama_run_t *r, const void *x, const void *w, void *y, float *rstd)
{
    void *ys = NULL;
    fsdp_status_t status;

    if (r->lm.tp <= 1)
        return rmsnorm_fwd(r, x, w, y, rstd);
    status = alloc_a(r, r->lm.rows * r->D, FSDP_MEM_TEMPORARY, &ys);
    if (status == FSDP_OK)
        status = rmsnorm_fwd(r, x, w, ys, rstd);
    if (status == FSDP_OK)
        status = fsdp_lm_sp_gather(&r->lm, ys, y, r->D);
    FREE(r, ys);
    return status;
}

/* A row-parallel Linear (o, down: RowwiseParallel with output Shard(1)): x [BT, in] W^T, a
 * partial sum over the tp ranks' columns, reduce-scattered into the sequence shard y [rows, D]. */
static fsdp_status_t row_parallel_fwd(llama_run_t *r, const void *x, size_t in, const void *w,
                                      void *y)
{
    void *part = NULL;
    fsdp_status_t status = alloc_a(r, r->lm.BT * r->D, FSDP_MEM_TEMPORARY, &part);

    if (status == FSDP_OK)
        status = linear_fwd(r, x, in, w, r->D, part, r->D);
    if (status == FSDP_OK)
        status = fsdp_lm_sp_scatter(&r->lm, part, y, r->D);
    FREE(r, part);
    return status;
}

/* The gradient of a row-parallel Linear's output, all-gathered from dres (the reduce-scatter's
 * backward) into *full; without tensor parallelism dres itself. */
static fsdp_status_t gather_dres(llama_run_t *r, void **full)
{
    fsdp_status_t status;

    if (r->lm.tp <= 1) {
        *full = r->lm.dres;
        return FSDP_OK;
    }
    status = alloc_a(r, r->lm.BT * r->D, FSDP_MEM_TEMPORARY, full);
    if (status == FSDP_OK)
        status = fsdp_lm_sp_gather(&r->lm, r->lm.dres, *full, r->D);
    return status;
}

/* A norm's backward under the column-parallel layers: their input gradient dn [BT, D], partial
 * over tp, reduce-scattered to the shard (the all-gather's backward), then the RMSNorm backward
 * into dres; the weight gradient is this shard's part (tp_partial_grad: FSDP2 sums it). */
static fsdp_status_t norm_scatter_bwd(llama_run_t *r, const void *dn, const void *x,
                                      const float *rstd, const void *w, void *dw)
{
    void **dns = &r->lm.tmp[4];
    fsdp_status_t status;

    if (r->lm.tp <= 1)
        return rmsnorm_bwd(r, dn, x, rstd, w, r->lm.dres, 1, dw);
    status = alloc_a(r, r->lm.rows * r->D, FSDP_MEM_TEMPORARY, dns);
    if (status == FSDP_OK)
        status = fsdp_lm_sp_scatter(&r->lm, dn, *dns, r->D);
    if (status == FSDP_OK)
        status = rmsnorm_bwd(r, *dns, x, rstd, w, r->lm.dres, 1, dw);
    FREE(r, *dns);
    return status;
}

/* Layer l's forward from resid[l]: the activations in the set `need` (their inputs already there)
 * and, when output, resid[l + 1]. Recomputing runs the same kernels on the same inputs as the
 * forward did, so the values are the same to the bit. With eager memory the buffers are eager
 * PyTorch's (above): q and k rotated into new tensors and, for grouped-query attention, k and v
 * copied to every query head (repeat_kv) before SDPA; the GEMMs' outputs and the residual adds'
 * new tensors; the mid residual freed at the end unless it is RMSNorm's saved f32 input. */
static fsdp_status_t layer_fwd(llama_run_t *r, int l, unsigned need, int output)
{
    fsdp_unit_t *u = r->m->lm.layers[l];
    void **a = ACT(r, l);
    const void *x = r->lm.resid[l];
    const size_t D = r->D, F = r->F, BT = r->lm.BT, es = r->lm.es;
    const int eager = r->eager, gqa = r->K < r->H;
    const fsdp_mem_category_t ACTV = FSDP_MEM_ACTIVATION, TMP = FSDP_MEM_TEMPORARY;
    void *qo = NULL, *ko = NULL, *vo = NULL, *ho = NULL, *kr = NULL; /* eager GEMM outputs */
    fsdp_kernel_t d = {.kind = FSDP_K_ATTENTION_FWD};
    fsdp_status_t status = FSDP_OK;

    for (int i = 0; !eager && i < A_COUNT && status == FSDP_OK; i++) {
        if (need & FUSED_ACT & BIT(i))
            status =
                fsdp_mem_alloc(r->lm.mem, act_bytes(r, i), FSDP_MEM_ACTIVATION, r->lm.s, &a[i]);
    }
    if (status == FSDP_OK && eager && (need & BIT(A_N1)))
        status = eager_rmsnorm(r, &a[A_U1], &a[A_RSTD1], &a[A_HB1], &a[A_N1]);
    if (status == FSDP_OK && (need & BIT(A_N1)))
        status = norm_gather(r, x, P(u, FSDP_LLAMA_LN1), a[A_N1], a[A_RSTD1]);
    if (eager) {
        if (status == FSDP_OK && (need & BIT(A_Q)))
            status = ealloc(r, BT * r->qw * es, TMP, &qo);
        if (status == FSDP_OK && (need & BIT(A_K)))
            status = ealloc(r, BT * r->kw * es, TMP, &ko);
        if (status == FSDP_OK && (need & BIT(A_V)))
            status = gqa ? ealloc(r, BT * r->kw * es, TMP, &vo)
                         : ealloc(r, BT * r->kw * es, ACTV, &a[A_V]);
        if (!gqa)
            vo = a[A_V];
    } else {
        qo = a[A_Q], ko = a[A_K], vo = a[A_V];
    }
    if (status == FSDP_OK && (need & BIT(A_Q)))
        status = linear_fwd(r, a[A_N1], D, P(u, FSDP_LLAMA_Q), r->qw, qo, r->qw);
    if (status == FSDP_OK && (need & BIT(A_K)))
        status = linear_fwd(r, a[A_N1], D, P(u, FSDP_LLAMA_K), r->kw, ko, r->kw);
    if (status == FSDP_OK && (need & BIT(A_V)))
        status = linear_fwd(r, a[A_N1], D, P(u, FSDP_LLAMA_V), r->kw, vo, r->kw);
    if (status == FSDP_OK && eager && (need & BIT(A_Q)))
        status = eager_rope(r, r->H, ACTV, &a[A_Q]);
    if (eager)
        FREE(r, qo);
    if (status == FSDP_OK && (need & BIT(A_Q)))
        status = rope(r, FSDP_K_ROPE_FWD, a[A_Q], r->H, r->qw);
    if (status == FSDP_OK && eager && (need & BIT(A_K)))
        status = eager_rope(r, r->K, gqa ? TMP : ACTV, gqa ? &kr : &a[A_K]);
    if (eager)
        FREE(r, ko);
    if (status == FSDP_OK && (need & BIT(A_K)))
        status = rope(r, FSDP_K_ROPE_FWD, gqa && eager ? kr : a[A_K], r->K, r->kw);
    if (eager && gqa) { /* repeat_kv: k and v copied to every query head, SDPA saves the copies */
        if (status == FSDP_OK && (need & BIT(A_K)))
            status = ealloc(r, BT * r->qw * es, ACTV, &a[A_K]);
        FREE(r, kr);
        if (status == FSDP_OK && (need & BIT(A_V)))
            status = ealloc(r, BT * r->qw * es, ACTV, &a[A_V]);
        FREE(r, vo);
    }
    if (status == FSDP_OK && eager && (need & BIT(A_O)))
        status = ealloc(r, act_bytes(r, A_O), ACTV, &a[A_O]);
    if (status == FSDP_OK && eager && (need & BIT(A_LSE)))
        status = ealloc(r, act_bytes(r, A_LSE), ACTV, &a[A_LSE]);
    if (status == FSDP_OK && (need & BIT(A_O))) {
        ATTENTION_ARGS(d.u.attention_fwd, r, a);
        status = launch(r, &d);
    }
    /* o_proj, then the residual add into the mid residual */
    if (!eager)
        ho = a[A_H];
    else if (status == FSDP_OK && (need & BIT(A_H))) /* tp: the reduce-scatter's output */
        status = ealloc(r, r->lm.rows * D * es, TMP, &ho);
    if (status == FSDP_OK && (need & BIT(A_H)) && r->lm.tp > 1)
        status = row_parallel_fwd(r, a[A_O], r->qw, P(u, FSDP_LLAMA_O), ho);
    else if (status == FSDP_OK && (need & BIT(A_H)))
        status = linear_fwd(r, a[A_O], r->qw, P(u, FSDP_LLAMA_O), D, ho, D);
    if (status == FSDP_OK && eager && (need & BIT(A_H)))
        status = ealloc(r, act_bytes(r, A_H), ACTV, &a[A_H]);
    if (status == FSDP_OK && (need & BIT(A_H)))
        status = add(r, a[A_H], ho, x, r->lm.rows * D);
    if (eager)
        FREE(r, ho);
    if (status == FSDP_OK && eager && (need & BIT(A_N2)))
        status = eager_rmsnorm(r, &a[A_U2], &a[A_RSTD2], &a[A_HB2], &a[A_N2]);
    if (status == FSDP_OK && (need & BIT(A_N2)))
        status = norm_gather(r, a[A_H], P(u, FSDP_LLAMA_LN2), a[A_N2], a[A_RSTD2]);
    /* the MLP: gate, silu(gate) (eager: its own tensor, saved by the product), up, the product */
    if (status == FSDP_OK && eager && (need & BIT(A_GATE)))
        status = ealloc(r, act_bytes(r, A_GATE), ACTV, &a[A_GATE]);
    if (status == FSDP_OK && (need & BIT(A_GATE)))
        status = linear_fwd(r, a[A_N2], D, P(u, FSDP_LLAMA_GATE), F, a[A_GATE], F);
    if (status == FSDP_OK && eager && (need & BIT(A_SILU)))
        status = ealloc(r, BT * F * es, ACTV, &a[A_SILU]);
    if (status == FSDP_OK && eager && (need & BIT(A_UP)))
        status = ealloc(r, act_bytes(r, A_UP), ACTV, &a[A_UP]);
    if (status == FSDP_OK && (need & BIT(A_UP)))
        status = linear_fwd(r, a[A_N2], D, P(u, FSDP_LLAMA_UP), F, a[A_UP], F);
    if (status == FSDP_OK && eager && (need & BIT(A_ACT)))
        status = ealloc(r, act_bytes(r, A_ACT), ACTV, &a[A_ACT]);
    if (status == FSDP_OK && (need & BIT(A_ACT))) {
        fsdp_kernel_t g = {.kind = FSDP_K_SWIGLU_FWD};
        g.u.swiglu_fwd.y = a[A_ACT];
        g.u.swiglu_fwd.gate = a[A_GATE];
        g.u.swiglu_fwd.up = a[A_UP];
        g.u.swiglu_fwd.n = BT * F;
        g.u.swiglu_fwd.dtype = r->lm.dt;
        status = launch(r, &g);
    }
    if (status == FSDP_OK && output) {
        /* down_proj, then the residual add into the layer's output */
        if (eager)
            status = ealloc(r, r->lm.rows * D * es, TMP, &ho);
        if (status == FSDP_OK)
            status = alloc_a(r, r->lm.rows * D, FSDP_MEM_ACTIVATION, &r->lm.resid[l + 1]);
        if (!eager)
            ho = r->lm.resid[l + 1];
        if (status == FSDP_OK && r->lm.tp > 1)
            status = row_parallel_fwd(r, a[A_ACT], F, P(u, FSDP_LLAMA_DOWN), ho);
        else if (status == FSDP_OK)
            status = linear_fwd(r, a[A_ACT], F, P(u, FSDP_LLAMA_DOWN), D, ho, D);
        if (status == FSDP_OK)
            status = add(r, r->lm.resid[l + 1], ho, a[A_H], r->lm.rows * D);
        if (eager)
            FREE(r, ho);
    }
    /* eager: the mid residual is not saved (RMSNorm saved its f32 upcast) */
    if (eager && r->upcast)
        FREE(r, a[A_H]);
    return status;
}

static fsdp_status_t attention_bwd(llama_run_t *r, void **a, const void *dout, void *dqkv,
                                   float *delta)
{
    fsdp_kernel_t d = {.kind = FSDP_K_ATTENTION_BWD};
    d.u.attention_bwd.dq = dqkv;
    d.u.attention_bwd.dk = AT(r, dqkv, r->lm.BT * r->qw);
    d.u.attention_bwd.dv = AT(r, dqkv, r->lm.BT * (r->qw + r->kw));
    d.u.attention_bwd.delta = delta;
    d.u.attention_bwd.dout = dout;
    ATTENTION_ARGS(d.u.attention_bwd, r, a);
    return launch(r, &d);
}

/* Layer l's backward: r->lm.dres holds the gradient of its output and becomes that of its input.
 * With eager memory, each saved tensor is freed once the backward of the last op that saved it
 * has run, and eager autograd's own gradients are allocated beside the fused kernels' (SwiGLU's
 * three products, FlashAttention-2's f32 dq accumulator, repeat_kv's per-head dk and dv, the
 * rotary embedding's and RMSNorm's). */
static fsdp_status_t layer_bwd(llama_run_t *r, int l)
{
    fsdp_unit_t *u = r->m->lm.layers[l];
    void **a = ACT(r, l), *g[FSDP_LLAMA_LAYER_NPARAMS];
    void **dact = &r->lm.tmp[0], **dn = &r->lm.tmp[1], **dqkv = &r->lm.tmp[2],
         **delta = &r->lm.tmp[3];
    void *dq, *dk, *dv; /* dq [BT, H hd], dk and dv [BT, K hd], one after another in *dqkv */
    void *ds = NULL, *du = NULL, *dg = NULL, *acc = NULL, *dkv = NULL; /* eager */
    void *dy = NULL; /* dres, or under tensor parallelism dres all-gathered */
    const size_t D = r->D, F = r->F, BT = r->lm.BT, es = r->lm.es;
    const int eager = r->eager, gqa = r->K < r->H;
    const fsdp_mem_category_t TMP = FSDP_MEM_TEMPORARY;
    fsdp_status_t status = FSDP_OK;

    for (int i = 0; i < FSDP_LLAMA_LAYER_NPARAMS && status == FSDP_OK; i++)
        status = fsdp_unit_grad(u, i, &g[i]);
    /* MLP: dact = dres W_down; swiglu's backward into gate and up (in place); dn2 */
    if (status == FSDP_OK)
        status = alloc_a(r, BT * F, FSDP_MEM_TEMPORARY, dact);
    if (status == FSDP_OK)
        status = gather_dres(r, &dy);
    if (status == FSDP_OK)
        status = linear_bwd(r, a[A_ACT], F, P(u, FSDP_LLAMA_DOWN), D, dy, D, g[FSDP_LLAMA_DOWN],
                            *dact, 0);
    if (dy != r->lm.dres)
        FREE(r, dy);
    if (eager) { /* the product's gradients, silu's input's; dgate and dup are new tensors */
        FREE(r, a[A_ACT]);
        if (status == FSDP_OK)
            status = ealloc(r, BT * F * es, TMP, &ds);
        if (status == FSDP_OK)
            status = ealloc(r, BT * F * es, TMP, &du);
        FREE(r, *dact);
        FREE(r, a[A_SILU]);
        if (status == FSDP_OK)
            status = ealloc(r, BT * F * es, TMP, &dg);
        FREE(r, ds);
    }
    if (status == FSDP_OK) {
        fsdp_kernel_t k = {.kind = FSDP_K_SWIGLU_BWD};
        k.u.swiglu_bwd.dgate = eager ? dg : a[A_GATE];
        k.u.swiglu_bwd.dup = eager ? du : a[A_UP];
        k.u.swiglu_bwd.dy = *dact;
        k.u.swiglu_bwd.gate = a[A_GATE];
        k.u.swiglu_bwd.up = a[A_UP];
        k.u.swiglu_bwd.n = BT * F;
        k.u.swiglu_bwd.dtype = r->lm.dt;
        status = launch(r, &k);
    }
    FREE(r, *dact);
    if (eager) {
        FREE(r, a[A_UP]);
        FREE(r, a[A_GATE]);
    }
    if (status == FSDP_OK)
        status = alloc_a(r, BT * D, FSDP_MEM_TEMPORARY, dn);
    if (status == FSDP_OK)
        status = linear_bwd(r, a[A_N2], D, P(u, FSDP_LLAMA_GATE), F, eager ? dg : a[A_GATE], F,
                            g[FSDP_LLAMA_GATE], *dn, 0);
    if (status == FSDP_OK)
        status = linear_bwd(r, a[A_N2], D, P(u, FSDP_LLAMA_UP), F, eager ? du : a[A_UP], F,
                            g[FSDP_LLAMA_UP], *dn, 1);
    if (eager) {
        FREE(r, dg);
        FREE(r, du);
        FREE(r, a[A_N2]);
    }
    /* the mid residual: dres += post_attention_layernorm's input gradient */
    if (status == FSDP_OK)
        status = norm_scatter_bwd(r, *dn, eager && r->upcast ? a[A_U2] : a[A_H], a[A_RSTD2],
                                  P(u, FSDP_LLAMA_LN2), g[FSDP_LLAMA_LN2]);
    if (status == FSDP_OK && eager)
        status = eager_rmsnorm_bwd(r, &a[A_U2], &a[A_HB2], &a[A_RSTD2]);
    /* attention: dout = dres W_o, then the fused backward into dq dk dv, rotated back */
    if (status == FSDP_OK)
        status = alloc_a(r, BT * r->qw, FSDP_MEM_TEMPORARY, dact);
    if (status == FSDP_OK)
        status = gather_dres(r, &dy);
    if (status == FSDP_OK)
        status =
            linear_bwd(r, a[A_O], r->qw, P(u, FSDP_LLAMA_O), D, dy, D, g[FSDP_LLAMA_O], *dact, 0);
    if (dy != r->lm.dres)
        FREE(r, dy);
    if (status == FSDP_OK)
        status = alloc_a(r, BT * r->w, FSDP_MEM_TEMPORARY, dqkv);
    if (status == FSDP_OK)
        status = alloc_f(r, r->lm.B * r->H * r->lm.T, FSDP_MEM_TEMPORARY, delta);
    if (status == FSDP_OK && eager && gqa) /* dk and dv of every query head */
        status = ealloc(r, 2 * BT * r->qw * es, TMP, &dkv);
    if (status == FSDP_OK && eager)
        status = ealloc(r, BT * r->qw * 4, TMP, &acc);
    if (status == FSDP_OK)
        status = attention_bwd(r, a, *dact, *dqkv, *delta);
    FREE(r, acc);
    FREE(r, *delta);
    FREE(r, *dact);
    if (eager) { /* SDPA's saved q k v, output and log-sum-exp; repeat_kv's sums into dqkv */
        for (int i = A_Q; i <= A_LSE; i++)
            FREE(r, a[i]);
        FREE(r, dkv);
    }
    dq = *dqkv;
    dk = AT(r, dq, BT * r->qw);
    dv = AT(r, dk, BT * r->kw);
    if (status == FSDP_OK && eager)
        status = eager_rope_bwd(r, r->H);
    if (status == FSDP_OK)
        status = rope(r, FSDP_K_ROPE_BWD, dq, r->H, r->qw);
    if (status == FSDP_OK && eager)
        status = eager_rope_bwd(r, r->K);
    if (status == FSDP_OK)
        status = rope(r, FSDP_K_ROPE_BWD, dk, r->K, r->kw);
    if (status == FSDP_OK)
        status = linear_bwd(r, a[A_N1], D, P(u, FSDP_LLAMA_Q), r->qw, dq, r->qw, g[FSDP_LLAMA_Q],
                            *dn, 0);
    if (status == FSDP_OK)
        status = linear_bwd(r, a[A_N1], D, P(u, FSDP_LLAMA_K), r->kw, dk, r->kw, g[FSDP_LLAMA_K],
                            *dn, 1);
    if (status == FSDP_OK)
        status = linear_bwd(r, a[A_N1], D, P(u, FSDP_LLAMA_V), r->kw, dv, r->kw, g[FSDP_LLAMA_V],
                            *dn, 1);
    FREE(r, *dqkv);
    if (eager)
        FREE(r, a[A_N1]);
    /* the layer's input: dres += input_layernorm's input gradient */
    if (status == FSDP_OK)
        status = norm_scatter_bwd(r, *dn, eager && r->upcast ? a[A_U1] : r->lm.resid[l], a[A_RSTD1],
                                  P(u, FSDP_LLAMA_LN1), g[FSDP_LLAMA_LN1]);
    if (status == FSDP_OK && eager)
        status = eager_rmsnorm_bwd(r, &a[A_U1], &a[A_HB1], &a[A_RSTD1]);
    FREE(r, *dn);
    return status;
}

static llama_run_t *run_of(fsdp_lm_run_t *lr)
{
    return (llama_run_t *)lr;
}

/* The rotary tables for positions 0..T-1 on the device: the angle p inv_freq is one f32 product
 * (HF's f32 matmul of the positions by inv_freq), its cos and sin rounded to f32. The host copy
 * lives until the end of the step, which synchronizes, so the copy needs no wait of its own. */
static fsdp_status_t rope_tables(fsdp_lm_run_t *lr)
{
    llama_run_t *r = run_of(lr);
    const size_t half = r->hd / 2, n = r->lm.T * half;
    float *host, *inv;
    fsdp_status_t status;

    if (r->eager) { /* HF's position embeddings: cos and sin [B, T, hd] in the compute dtype */
        status = ealloc(r, r->lm.BT * r->hd * r->lm.es, FSDP_MEM_ACTIVATION, (void **)&r->cos);
        if (status == FSDP_OK)
            status = ealloc(r, r->lm.BT * r->hd * r->lm.es, FSDP_MEM_ACTIVATION, (void **)&r->sin);
        return status;
    }
    status = alloc_f(r, n, FSDP_MEM_ACTIVATION, (void **)&r->cos);
    if (status == FSDP_OK)
        status = alloc_f(r, n, FSDP_MEM_ACTIVATION, (void **)&r->sin);
    if (status != FSDP_OK || r->lm.dev->no_data)
        return status; /* shape mode: nothing to copy */
    host = r->host_rope = malloc(2 * n * sizeof(float));
    inv = malloc(half * sizeof(float));
    if (host == NULL || inv == NULL) {
        free(inv);
        return FSDP_ERR_NO_MEMORY;
    }
    fsdp_llama_inv_freq(&r->m->cfg, inv);
    for (size_t p = 0; p < r->lm.T; p++)
        for (size_t i = 0; i < half; i++) {
            float angle = (float)p * inv[i];
            host[p * half + i] = (float)cos((double)angle);
            host[n + p * half + i] = (float)sin((double)angle);
        }
    status = fsdp_dev_memcpy_async(r->lm.dev, r->cos, host, n * sizeof(float), r->lm.s);
    if (status == FSDP_OK)
        status = fsdp_dev_memcpy_async(r->lm.dev, r->sin, host + n, n * sizeof(float), r->lm.s);
    free(inv);
    return status;
}

/* the LM head's weight: lm_head, or the embedding when tied */
static int head_index(const llama_run_t *r)
{
    return r->m->cfg.tie_word_embeddings ? FSDP_LLAMA_EMBED : FSDP_LLAMA_LM_HEAD;
}

/* What a layer keeps or recomputes: the fused kernels' buffers, or eager PyTorch's. */
static unsigned all_act(const llama_run_t *r)
{
    return r->eager ? ALL_ACT : FUSED_ACT;
}

/* What layer l's backward recomputes, by its checkpointing policy. */
static unsigned recomputed(const llama_run_t *r, int l)
{
    const fsdp_llama_t *m = r->m;
    return m->lm.checkpoint[l] == FSDP_LM_CKPT_FULL           ? all_act(r)
           : m->lm.checkpoint[l] == FSDP_LM_CKPT_SELECTIVE_OP ? all_act(r) & ~SAVED_OP
                                                              : 0u;
}

static fsdp_status_t embed_fwd(fsdp_lm_run_t *lr)
{
    return fsdp_lm_embed_fwd(lr, P(lr->lm->root, FSDP_LLAMA_EMBED), NULL);
}

static fsdp_status_t layer_fwd_all(fsdp_lm_run_t *lr, int l)
{
    return layer_fwd(run_of(lr), l, all_act(run_of(lr)), 1);
}

/* After layer l's forward and its post-forward hook: frees what its backward recomputes. Eager
 * PyTorch also frees the layer's input as the layer returns, unless a checkpoint keeps it: what
 * backward reads of it is RMSNorm's f32 upcast (in f32, the input itself). */
static void layer_forget(fsdp_lm_run_t *lr, int l)
{
    llama_run_t *r = run_of(lr);

    free_act(r, l, recomputed(r, l));
    if (r->eager && r->upcast && r->m->lm.checkpoint[l] == FSDP_LM_CKPT_NONE)
        FREE(r, lr->resid[l]);
}

/* the final norm (eager: its upcast and product saved, the last layer's output freed) */
static fsdp_status_t norm_fwd(fsdp_lm_run_t *lr)
{
    llama_run_t *r = run_of(lr);
    const int L = lr->lm->n_layer;
    void *rstd = lr->rstdf;
    fsdp_status_t status = FSDP_OK;

    if (r->eager)
        status = eager_rmsnorm(r, &r->uf, &rstd, &r->hbf, &lr->nf);
    if (status == FSDP_OK)
        status = rmsnorm_fwd(r, lr->resid[L], P(lr->lm->root, FSDP_LLAMA_NORM), lr->nf, lr->rstdf);
    if (r->eager && r->upcast)
        FREE(r, lr->resid[L]);
    return status;
}

/* Eager: HF's loss, logits.float() (a copy unless f32) into log_softmax, whose output
 * cross_entropy's nll_loss and its own backward save; the copy and the model's logits are
 * freed as the forward returns (nothing saved them). */
static fsdp_status_t loss_fwd(fsdp_lm_run_t *lr)
{
    llama_run_t *r = run_of(lr);
    const size_t n = lr->BT * lr->V;
    void *lf = NULL;
    fsdp_status_t status = FSDP_OK;

    if (!r->eager)
        return FSDP_OK;
    if (r->upcast)
        status = ealloc(r, 4 * n, FSDP_MEM_TEMPORARY, &lf);
    if (status == FSDP_OK)
        status = ealloc(r, 4 * n, FSDP_MEM_ACTIVATION, &r->logsm);
    FREE(r, lf);
    FREE(r, lr->logits);
    return status;
}

/* Eager: the loss's backward, nll_loss_backward's f32 gradient (zeros, then the targets'),
 * _log_softmax_backward_data's, then (unless f32) .float()'s back to the compute dtype: the
 * logits' gradient the head's backward reads. */
static fsdp_status_t loss_bwd(fsdp_lm_run_t *lr)
{
    llama_run_t *r = run_of(lr);
    const size_t n = lr->BT * lr->V;
    void *gn = NULL, *gl = NULL;
    fsdp_status_t status;

    if (!r->eager)
        return FSDP_OK;
    status = ealloc(r, 4 * n, FSDP_MEM_TEMPORARY, &gn);
    if (status == FSDP_OK)
        status = ealloc(r, 4 * n, FSDP_MEM_TEMPORARY, &gl);
    FREE(r, gn);
    FREE(r, r->logsm);
    if (!r->upcast) {
        lr->logits = gl;
        return status;
    }
    if (status == FSDP_OK)
        status = ealloc(r, n * lr->es, FSDP_MEM_TEMPORARY, &lr->logits);
    FREE(r, gl);
    return status;
}

/* the head: logits = norm(x) W_head^T; W_head's version lets the backend keep it packed while
 * it does not change (micro-batches of an accumulated step) */
static fsdp_status_t head_fwd(fsdp_lm_run_t *lr)
{
    llama_run_t *r = run_of(lr);
    void *part = NULL;
    fsdp_status_t status;

    if (lr->tp <= 1)
        return gemm_v(r, 0, 1, r->lm.BT, lr->V, r->D, lr->nf, r->D, P(lr->lm->root, head_index(r)),
                      r->D, 0.0f, lr->logits, lr->V, fsdp_unit_param_version(lr->lm->root));
    /* ColwiseParallel on the all-gathered norm: this rank's vocabulary columns of the logits,
     * all-gathered (output Replicate) */
    status = alloc_a(r, lr->BT * lr->vl, FSDP_MEM_TEMPORARY, &part);
    if (status == FSDP_OK)
        status =
            gemm_v(r, 0, 1, r->lm.BT, lr->vl, r->D, lr->nff, r->D, P(lr->lm->root, head_index(r)),
                   r->D, 0.0f, part, lr->vl, fsdp_unit_param_version(lr->lm->root));
    if (status == FSDP_OK)
        status = fsdp_lm_tp_gather_cols(lr, part, lr->logits);
    FREE(r, part);
    return status;
}

/* dW_head += dlogits^T nf, dnf = dlogits W_head; under tensor parallelism from this rank's
 * vocabulary columns of the logits' gradient and the all-gathered nf, dnf partial over tp and
 * reduce-scattered to the shard */
static fsdp_status_t head_bwd(fsdp_lm_run_t *lr, void **g, void *dnf)
{
    llama_run_t *r = run_of(lr);
    void *part = NULL;
    fsdp_status_t status;

    if (lr->tp <= 1)
        return linear_bwd(r, lr->nf, r->D, P(lr->lm->root, head_index(r)), lr->V, lr->logits, lr->V,
                          g[head_index(r)], dnf, 0);
    status = alloc_a(r, lr->BT * r->D, FSDP_MEM_TEMPORARY, &part);
    if (status == FSDP_OK)
        status = linear_bwd(r, lr->nff, r->D, P(lr->lm->root, head_index(r)), lr->vl,
                            AT(r, lr->logits, lr->v0), lr->V, g[head_index(r)], part, 0);
    if (status == FSDP_OK)
        status = fsdp_lm_sp_scatter(lr, part, dnf, r->D);
    FREE(r, part);
    return status;
}

static fsdp_status_t norm_bwd(fsdp_lm_run_t *lr, void **g, const void *dnf)
{
    llama_run_t *r = run_of(lr);
    void *rstd = NULL; /* lm.c frees the final norm's */
    fsdp_status_t status =
        rmsnorm_bwd(r, dnf, r->eager && r->upcast ? r->uf : lr->resid[lr->lm->n_layer],
                    lr->rstdf, P(lr->lm->root, FSDP_LLAMA_NORM), lr->dres, 0, g[FSDP_LLAMA_NORM]);

    if (status == FSDP_OK && r->eager)
        status = eager_rmsnorm_bwd(r, &r->uf, &r->hbf, &rstd);
    return status;
}

static fsdp_status_t layer_recompute(fsdp_lm_run_t *lr, int l)
{
    unsigned need = recomputed(run_of(lr), l);
    return need != 0 ? layer_fwd(run_of(lr), l, need, 0) : FSDP_OK;
}

static fsdp_status_t layer_bwd_of(fsdp_lm_run_t *lr, int l)
{
    return layer_bwd(run_of(lr), l);
}

static void layer_free(fsdp_lm_run_t *lr, int l)
{
    free_act(run_of(lr), l, ALL_ACT);
}

/* the embedding rows (on top of the tied head's) */
static fsdp_status_t embed_bwd(fsdp_lm_run_t *lr, void **g)
{
    return fsdp_lm_embed_bwd(lr, g[FSDP_LLAMA_EMBED], NULL);
}

/* the rotary tables, after the step's other buffers */
static void cleanup(fsdp_lm_run_t *lr)
{
    llama_run_t *r = run_of(lr);

    FREE(r, r->cos);
    FREE(r, r->sin);
    FREE(r, r->uf);
    FREE(r, r->hbf);
    FREE(r, r->logsm);
    free(r->host_rope);
    r->host_rope = NULL;
}

static const fsdp_lm_ops_t llama_ops = {
    .layer_acts = sizeof(void *[A_COUNT]),
    .norm_mean = 0,
    .prepare = rope_tables,
    .embed_fwd = embed_fwd,
    .layer_fwd = layer_fwd_all,
    .layer_forget = layer_forget,
    .norm_fwd = norm_fwd,
    .head_fwd = head_fwd,
    .loss_fwd = loss_fwd,
    .loss_bwd = loss_bwd,
    .head_bwd = head_bwd,
    .norm_bwd = norm_bwd,
    .layer_recompute = layer_recompute,
    .layer_bwd = layer_bwd_of,
    .layer_free = layer_free,
    .embed_bwd = embed_bwd,
    .cleanup = cleanup,
};

fsdp_status_t fsdp_llama_forward_backward(fsdp_lm_t *lm, const int32_t *inputs,
                                          const int32_t *targets, size_t batch, size_t seq,
                                          float *loss_p)
{
    fsdp_llama_t *model = fsdp_llama_of(lm);
    const fsdp_llama_config_t *cfg = &model->cfg;
    llama_run_t run;
    size_t count = 0;
    /* the largest buffers, logits [B*T, V] and the MLP's, per token */
    fsdp_status_t status = fsdp_lm_check_batch(&model->lm, cfg->max_seq, "seq", cfg->vocab_size,
                                               (double)cfg->vocab_size + 8.0 * cfg->ffn_dim, inputs,
                                               targets, batch, seq, &count);

    if (status != FSDP_OK)
        return status;
    memset(&run, 0, sizeof(run));
    status = fsdp_lm_run_init(&run.lm, &model->lm, batch, seq, (size_t)cfg->dim,
                              (size_t)cfg->vocab_size);
    if (status != FSDP_OK)
        return status;
    run.m = model;
    /* this rank's heads, kv heads and ffn columns (all of them without tensor parallelism) */
    run.D = (size_t)cfg->dim;
    run.H = (size_t)model->local.n_head;
    run.K = (size_t)model->local.n_kv_head;
    run.hd = (size_t)fsdp_llama_head_dim(cfg);
    run.F = (size_t)model->local.ffn_dim;
    run.qw = run.H * run.hd;
    run.kw = run.K * run.hd;
    run.w = run.qw + 2 * run.kw;
    run.eager = model->eager_memory;
    run.upcast = run.lm.dt != FSDP_DTYPE_F32;
    return fsdp_lm_run_step(&run.lm, &llama_ops, inputs, targets, count, loss_p);
}
