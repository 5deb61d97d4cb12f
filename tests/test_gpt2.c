/* GPT-2 (lib/nn/gpt2*.c) against references:
 *  - the loss and every gradient against a plain double-precision GPT-2 written here,
 *    independently of the model code (its own backward checked by finite differences), with
 *    and without activation checkpointing;
 *  - the fused attention against the same reference, and its memory in shape mode;
 *  - FSDP training (full_shard, shard_grad_op, no_shard; W = 1, 2, 4) against single-process
 *    training over 5 AdamW steps, the fused attention's too;
 *  - HF checkpoints: a save/load round trip across world sizes, the hub's layout (bare names,
 *    attn.bias buffers, the tied lm_head, 16-bit tensors) computing what the double reference
 *    computes from the same tensors read as Conv1D [in, out], and clear errors;
 *  - learning: the loss falls by a stated margin over 200 steps on the default corpus.
 */
#include <fsdp/fsdp.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "corpus.h"
#include "io/io_hidden.h"
#include "lm_test.h"
#include "nn/nn_hidden.h"
#include "sim_hidden.h"
#include "test_util.h"

#define NB FSDP_GPT2_BLOCK_NPARAMS
#define NR FSDP_GPT2_ROOT_NPARAMS

static uint64_t rng_state = 7;

static double urand(double lo, double hi)
{
    return lm_test_urand(&rng_state, lo, hi);
}

/* ---------------- a double-precision GPT-2, independent of the library ---------------- */

typedef struct ref_cfg {
    int L, H, C, P, V;
} ref_cfg_t;

/* parameters or gradients, HF layout: root[NR], blk[l * NB + i] */
typedef struct ref_model {
    ref_cfg_t c;
    double *root[NR];
    double **blk;
} ref_model_t;

static size_t ref_numel(const ref_cfg_t *c, int block, int i)
{
    const size_t C = (size_t)c->C;
    if (block < 0) {
        const size_t n[NR] = {(size_t)c->V * C, (size_t)c->P * C, C, C};
        return n[i];
    }
    const size_t n[NB] = {C, C, C * 3 * C, 3 * C, C * C, C, C, C, C * 4 * C, 4 * C, 4 * C * C, C};
    return n[i];
}

static double *ref_param(const ref_model_t *m, int block, int i)
{
    return block < 0 ? m->root[i] : m->blk[(size_t)block * NB + (size_t)i];
}

static void ref_alloc(ref_model_t *m, const ref_cfg_t *c)
{
    m->c = *c;
    m->blk = calloc((size_t)c->L * NB, sizeof(double *));
    for (int i = 0; i < NR; i++)
        m->root[i] = calloc(ref_numel(c, -1, i), sizeof(double));
    for (int l = 0; l < c->L; l++)
        for (int i = 0; i < NB; i++)
            m->blk[l * NB + i] = calloc(ref_numel(c, l, i), sizeof(double));
}

static void ref_free(ref_model_t *m)
{
    for (int i = 0; i < NR; i++)
        free(m->root[i]);
    for (int l = 0; l < m->c.L * NB; l++)
        free(m->blk[l]);
    free(m->blk);
}

/* The rounding points of a low-precision run, for the forward of the reference: every tensor a
 * kernel writes is rounded to the compute dtype (identity: the plain double reference). */
static double ref_exact(double x)
{
    return x;
}

static double ref_round_bf16(double x)
{
    return (double)fsdp_bf16_to_f32(fsdp_f32_to_bf16((float)x));
}

static double ref_round_f16(double x)
{
    return (double)fsdp_f16_to_f32(fsdp_f32_to_f16((float)x));
}

static double (*ref_rnd)(double) = ref_exact;

static void ref_ln(const double *x, const double *w, const double *b, double *y, double *xhat,
                   double *rstd, int n, int C)
{
    for (int r = 0; r < n; r++) {
        double mean = 0.0, var = 0.0;
        for (int c = 0; c < C; c++)
            mean += x[r * C + c];
        mean /= C;
        for (int c = 0; c < C; c++)
            var += (x[r * C + c] - mean) * (x[r * C + c] - mean);
        rstd[r] = 1.0 / sqrt(var / C + 1e-5);
        for (int c = 0; c < C; c++) {
            xhat[r * C + c] = (x[r * C + c] - mean) * rstd[r];
            y[r * C + c] = ref_rnd(xhat[r * C + c] * w[c] + b[c]);
        }
    }
}

/* dx += the input gradient; dw, db += */
static void ref_ln_bwd(const double *dy, const double *xhat, const double *rstd, const double *w,
                       double *dx, double *dw, double *db, int n, int C)
{
    for (int r = 0; r < n; r++) {
        double mg = 0.0, mgx = 0.0;
        for (int c = 0; c < C; c++) {
            mg += dy[r * C + c] * w[c];
            mgx += dy[r * C + c] * w[c] * xhat[r * C + c];
        }
        mg /= C;
        mgx /= C;
        for (int c = 0; c < C; c++) {
            dx[r * C + c] += rstd[r] * (dy[r * C + c] * w[c] - mg - xhat[r * C + c] * mgx);
            dw[c] += dy[r * C + c] * xhat[r * C + c];
            db[c] += dy[r * C + c];
        }
    }
}

/* y[n, M] = x[n, K] W[K, M] + b (Conv1D) */
static void ref_mm(const double *x, const double *W, const double *b, double *y, int n, int K,
                   int M)
{
    for (int r = 0; r < n; r++)
        for (int m = 0; m < M; m++) {
            double s = 0.0;
            for (int k = 0; k < K; k++)
                s += x[r * K + k] * W[k * M + m];
            y[r * M + m] = ref_rnd(s + b[m]); /* addmm: the bias added before the rounding */
        }
}

/* dW, db += ; dx = (NULL: skipped) */
static void ref_mm_bwd(const double *x, const double *W, const double *dy, double *dx, double *dW,
                       double *db, int n, int K, int M)
{
    for (int r = 0; r < n; r++)
        for (int m = 0; m < M; m++) {
            db[m] += dy[r * M + m];
            for (int k = 0; k < K; k++)
                dW[k * M + m] += x[r * K + k] * dy[r * M + m];
        }
    for (int r = 0; dx != NULL && r < n; r++)
        for (int k = 0; k < K; k++) {
            double s = 0.0;
            for (int m = 0; m < M; m++)
                s += dy[r * M + m] * W[k * M + m];
            dx[r * K + k] = s;
        }
}

static double gelu_d(double x)
{
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

static double gelu_grad_d(double x)
{
    double k = sqrt(2.0 / M_PI), t = tanh(k * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

#define QKV(b, t, part, h, d) qkv[((size_t)(b)*T + (t)) * 3 * C + (part)*C + (h)*hs + (d)]

static void ref_attn(const double *qkv, double *att, double *y, int B, int T, int C, int H)
{
    const int hs = C / H;
    const double div = ref_rnd(sqrt((double)hs)); /* HF's divisor, a tensor of the dtype */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                double *p = att + (((size_t)b * H + h) * T + t) * T, mx = -INFINITY, sum = 0.0;
                for (int j = 0; j <= t; j++) {
                    double s = 0.0;
                    for (int d = 0; d < hs; d++)
                        s += QKV(b, t, 0, h, d) * QKV(b, j, 1, h, d);
                    p[j] = ref_rnd(ref_rnd(s) / div); /* the scores' GEMM, then the division */
                    mx = fmax(mx, p[j]);
                }
                for (int j = 0; j <= t; j++)
                    sum += (p[j] = exp(p[j] - mx));
                for (int j = 0; j < T; j++)
                    p[j] = j <= t ? ref_rnd(p[j] / sum) : 0.0;
                for (int d = 0; d < hs; d++) {
                    double s = 0.0;
                    for (int j = 0; j <= t; j++)
                        s += p[j] * QKV(b, j, 2, h, d);
                    y[((size_t)b * T + t) * C + h * hs + d] = ref_rnd(s);
                }
            }
}

#define DQKV(b, t, part, h, d) dqkv[((size_t)(b)*T + (t)) * 3 * C + (part)*C + (h)*hs + (d)]

static void ref_attn_bwd(const double *qkv, const double *att, const double *dy, double *dqkv,
                         int B, int T, int C, int H)
{
    const int hs = C / H;
    const double sc = 1.0 / sqrt((double)hs);
    double *dp = malloc(sizeof(double) * (size_t)T);
    memset(dqkv, 0, sizeof(double) * (size_t)B * T * 3 * C);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                const double *p = att + (((size_t)b * H + h) * T + t) * T;
                const double *g = dy + ((size_t)b * T + t) * C + h * hs;
                double dot = 0.0;
                for (int j = 0; j <= t; j++) {
                    dp[j] = 0.0;
                    for (int d = 0; d < hs; d++) {
                        dp[j] += g[d] * QKV(b, j, 2, h, d);
                        DQKV(b, j, 2, h, d) += p[j] * g[d];
                    }
                    dot += p[j] * dp[j];
                }
                for (int j = 0; j <= t; j++) {
                    double ds = p[j] * (dp[j] - dot) * sc;
                    for (int d = 0; d < hs; d++) {
                        DQKV(b, t, 0, h, d) += ds * QKV(b, j, 1, h, d);
                        DQKV(b, j, 1, h, d) += ds * QKV(b, t, 0, h, d);
                    }
                }
            }
    free(dp);
}

/* Mean cross-entropy of the next tokens; with g, every gradient (g zeroed first). */
static double ref_run(const ref_model_t *p, ref_model_t *g, const int32_t *in, const int32_t *tg,
                      int B, int T)
{
    const int L = p->c.L, C = p->c.C, H = p->c.H, V = p->c.V, n = B * T;
    enum { X1, RS1, LN1, QKVB, ATT, Y, XMID, X2, RS2, LN2, HH, GG, NC };
    const size_t sizes[NC] = {(size_t)n * C,
                              (size_t)n,
                              (size_t)n * C,
                              (size_t)n * 3 * C,
                              (size_t)B * H * T * T,
                              (size_t)n * C,
                              (size_t)n * C,
                              (size_t)n * C,
                              (size_t)n,
                              (size_t)n * C,
                              (size_t)n * 4 * C,
                              (size_t)n * 4 * C};
    double **x = calloc((size_t)L + 1, sizeof(double *)),
           ***cache = calloc((size_t)L, sizeof(double **));
    double *xhf = malloc(sizeof(double) * (size_t)n * C), *rsf = malloc(sizeof(double) * (size_t)n);
    double *lnf = malloc(sizeof(double) * (size_t)n * C),
           *logits = malloc(sizeof(double) * (size_t)n * V);
    double loss = 0.0;
    int count = 0;

    for (int l = 0; l <= L; l++)
        x[l] = calloc((size_t)n * C, sizeof(double));
    for (int r = 0; r < n; r++)
        for (int c = 0; c < C; c++)
            x[0][r * C + c] = ref_rnd(p->root[FSDP_GPT2_WTE][in[r] * C + c] +
                                      p->root[FSDP_GPT2_WPE][(r % T) * C + c]);
    for (int l = 0; l < L; l++) {
        double **a = cache[l] = calloc(NC, sizeof(double *));
        for (int i = 0; i < NC; i++)
            a[i] = calloc(sizes[i], sizeof(double));
#define W(i) ref_param(p, l, i)
        ref_ln(x[l], W(0), W(1), a[LN1], a[X1], a[RS1], n, C);
        ref_mm(a[LN1], W(2), W(3), a[QKVB], n, C, 3 * C);
        ref_attn(a[QKVB], a[ATT], a[Y], B, T, C, H);
        ref_mm(a[Y], W(4), W(5), a[XMID], n, C, C);
        for (int i = 0; i < n * C; i++)
            a[XMID][i] = ref_rnd(a[XMID][i] + x[l][i]);
        ref_ln(a[XMID], W(6), W(7), a[LN2], a[X2], a[RS2], n, C);
        ref_mm(a[LN2], W(8), W(9), a[HH], n, C, 4 * C);
        for (int i = 0; i < n * 4 * C; i++)
            a[GG][i] = ref_rnd(gelu_d(a[HH][i]));
        ref_mm(a[GG], W(10), W(11), x[l + 1], n, 4 * C, C);
        for (int i = 0; i < n * C; i++)
            x[l + 1][i] = ref_rnd(x[l + 1][i] + a[XMID][i]);
    }
    ref_ln(x[L], p->root[FSDP_GPT2_LNF_W], p->root[FSDP_GPT2_LNF_B], lnf, xhf, rsf, n, C);
    for (int r = 0; r < n; r++)
        for (int v = 0; v < V; v++) {
            double s = 0.0;
            for (int c = 0; c < C; c++)
                s += lnf[r * C + c] * p->root[FSDP_GPT2_WTE][v * C + c];
            logits[r * V + v] = ref_rnd(s);
        }
    for (int r = 0; r < n; r++) { /* logits become the loss's gradient wrt them */
        double mx = -INFINITY, sum = 0.0;
        double *lr = logits + (size_t)r * V;
        for (int v = 0; v < V; v++)
            mx = fmax(mx, lr[v]);
        for (int v = 0; v < V; v++)
            sum += exp(lr[v] - mx);
        if (tg[r] >= 0) {
            loss += mx + log(sum) - lr[tg[r]];
            count++;
        }
        for (int v = 0; v < V; v++)
            lr[v] = tg[r] < 0 ? 0.0 : exp(lr[v] - mx) / sum - (v == tg[r]);
    }
    loss /= count;

    if (g != NULL) {
        double *dx = calloc((size_t)n * C, sizeof(double)),
               *d1 = calloc((size_t)n * C, sizeof(double));
        double *dh = calloc((size_t)n * 4 * C, sizeof(double));
        double *dq = calloc((size_t)n * 3 * C, sizeof(double));
        for (int i = 0; i < NR; i++)
            memset(g->root[i], 0, sizeof(double) * ref_numel(&p->c, -1, i));
        for (int l = 0; l < L; l++)
            for (int i = 0; i < NB; i++)
                memset(ref_param(g, l, i), 0, sizeof(double) * ref_numel(&p->c, l, i));
        for (int i = 0; i < n * V; i++)
            logits[i] /= count;
        for (int r = 0; r < n; r++)
            for (int c = 0; c < C; c++) {
                double s = 0.0;
                for (int v = 0; v < V; v++) {
                    s += logits[r * V + v] * p->root[FSDP_GPT2_WTE][v * C + c];
                    g->root[FSDP_GPT2_WTE][v * C + c] += logits[r * V + v] * lnf[r * C + c];
                }
                d1[r * C + c] = s;
            }
        ref_ln_bwd(d1, xhf, rsf, p->root[FSDP_GPT2_LNF_W], dx, g->root[FSDP_GPT2_LNF_W],
                   g->root[FSDP_GPT2_LNF_B], n, C);
        for (int l = L - 1; l >= 0; l--) {
            double **a = cache[l];
#define G(i) ref_param(g, l, i)
            ref_mm_bwd(a[GG], W(10), dx, dh, G(10), G(11), n, 4 * C, C);
            for (int i = 0; i < n * 4 * C; i++)
                dh[i] *= gelu_grad_d(a[HH][i]);
            ref_mm_bwd(a[LN2], W(8), dh, d1, G(8), G(9), n, C, 4 * C);
            ref_ln_bwd(d1, a[X2], a[RS2], W(6), dx, G(6), G(7), n, C);
            ref_mm_bwd(a[Y], W(4), dx, d1, G(4), G(5), n, C, C);
            ref_attn_bwd(a[QKVB], a[ATT], d1, dq, B, T, C, H);
            ref_mm_bwd(a[LN1], W(2), dq, d1, G(2), G(3), n, C, 3 * C);
            ref_ln_bwd(d1, a[X1], a[RS1], W(0), dx, G(0), G(1), n, C);
#undef G
        }
        for (int r = 0; r < n; r++)
            for (int c = 0; c < C; c++) {
                g->root[FSDP_GPT2_WTE][in[r] * C + c] += dx[r * C + c];
                g->root[FSDP_GPT2_WPE][(r % T) * C + c] += dx[r * C + c];
            }
        free(dx), free(d1), free(dh), free(dq);
    }
#undef W
    for (int l = 0; l < L; l++) {
        for (int i = 0; i < NC; i++)
            free(cache[l][i]);
        free(cache[l]);
    }
    for (int l = 0; l <= L; l++)
        free(x[l]);
    free(x), free(cache), free(xhf), free(rsf), free(lnf), free(logits);
    return loss;
}

/* ---------------- the library's model on simulated ranks ---------------- */

#define MAX_STEPS 200
#define LEARN_MARGIN 2.0 /* nats over 200 steps: the run goes from 5.44 to 2.68 */
#define MAX_W 8

typedef struct job {
    fsdp_gpt2_config_t cfg;
    fsdp_strategy_t strategy;
    int world;
    int checkpoint;        /* 1: every block */
    const float *init;     /* canonical order; NULL: fsdp_lm_init_params(seed) */
    const char *init_file; /* an HF checkpoint to load instead */
    uint64_t seed;
    /* data: fixed inputs and targets of one rank-0 batch, or a token source */
    const int32_t *inputs, *targets;
    fsdp_tokens_t *tokens;
    size_t batch, seq; /* global rows, tokens per row */
    int steps;         /* 0: one forward-backward, no optimizer */
    fsdp_optim_config_t optim;
    const char *save_path; /* after training */
    fsdp_gpt2_save_names_t save_names;
    /* results */
    float losses[MAX_STEPS][MAX_W];
    float *params; /* canonical order, after training */
    float *grads;  /* canonical order, world 1 and steps 0 */
    /* mixed precision (use_mp), shape mode, and what the ranks saw */
    int use_mp;
    fsdp_mixed_precision_t mp;
    int shape;                                     /* FSDP_SIM_SHAPE: no data, no inputs */
    unsigned ag_dtypes[MAX_W], rs_dtypes[MAX_W];   /* 1 << dtype of each all-gather, ... */
    unsigned gemm_dtypes[MAX_W], nn_dtypes[MAX_W]; /* ... of each GEMM's A, each nn kernel */
    size_t act_peak[MAX_W];                        /* bytes of FSDP_MEM_ACTIVATION at peak */
    /* gradient accumulation: micro-batches per step (0 or 1: none), no_sync for all but the
     * last; CPU offload; the sim's packed operand off (no_pack_cache), and its counts on each
     * rank */
    int accum, offload, no_pack_cache;
    uint64_t pack_hits[MAX_W], pack_packs[MAX_W];
} job_t;

/* ---- per-rank interposers on the backend's ops: which dtypes the collectives and kernels of a
 * step ran in ---- */

static _Thread_local const fsdp_backend_ops_t *tl_inner;
static _Thread_local unsigned tl_ag, tl_rs, tl_gemm, tl_nn;

static fsdp_status_t spy_all_gather(fsdp_dev_t *dev, fsdp_group_t *g, const void *s, void *r,
                                    size_t n, fsdp_dtype_t dt, fsdp_stream_t *st)
{
    if (dt != FSDP_DTYPE_I32) /* the first iteration's order check gathers i32 */
        tl_ag |= 1u << dt;
    return tl_inner->all_gather(dev, g, s, r, n, dt, st);
}

static fsdp_status_t spy_reduce_scatter(fsdp_dev_t *dev, fsdp_group_t *g, const void *s, void *r,
                                        size_t n, fsdp_dtype_t dt, fsdp_reduce_op_t op,
                                        fsdp_stream_t *st)
{
    tl_rs |= 1u << dt;
    return tl_inner->reduce_scatter(dev, g, s, r, n, dt, op, st);
}

static fsdp_status_t spy_kernel(fsdp_dev_t *dev, fsdp_stream_t *st, const fsdp_kernel_t *k)
{
    if (k->kind == FSDP_K_GEMM)
        tl_gemm |= 1u << k->u.gemm.a_dtype;
    else if (k->kind == FSDP_K_LAYERNORM_FWD)
        tl_nn |= 1u << k->u.layernorm_fwd.dtype;
    else if (k->kind == FSDP_K_SOFTMAX_FWD)
        tl_nn |= 1u << k->u.softmax_fwd.dtype;
    else if (k->kind == FSDP_K_CROSS_ENTROPY)
        tl_nn |= 1u << k->u.cross_entropy.dtype;
    else if (k->kind == FSDP_K_EMBEDDING_BWD)
        tl_nn |= 1u << k->u.embedding_bwd.dtype;
    return tl_inner->kernel(dev, st, k);
}

static fsdp_status_t job_rank(fsdp_dev_t *dev, void *arg)
{
    job_t *j = arg;
    fsdp_config_t fc;
    fsdp_t *fs = NULL;
    fsdp_lm_t *m = NULL;
    fsdp_optim_t *opt = NULL;
    fsdp_lm_weights_t *w = NULL;
    size_t rows = j->batch / (size_t)dev->world_size;
    int32_t *in = malloc(rows * j->seq * sizeof(int32_t));
    int32_t *tg = malloc(rows * j->seq * sizeof(int32_t));
    fsdp_status_t st;

    fsdp_backend_ops_t spy = *dev->ops;

    tl_inner = dev->ops;
    tl_ag = tl_rs = tl_gemm = tl_nn = 0;
    spy.all_gather = spy_all_gather;
    spy.reduce_scatter = spy_reduce_scatter;
    spy.kernel = spy_kernel;
    dev->ops = &spy;
    fsdp_config_init(&fc);
    fc.strategy = j->strategy;
    fc.cpu_offload = j->offload;
    if (j->use_mp)
        fc.mixed_precision = j->mp;
    st = fsdp_create(dev, &fc, &fs);
    if (st == FSDP_OK)
        st = fsdp_gpt2_create(fs, &j->cfg, &m);
    if (st == FSDP_OK && j->checkpoint)
        st = fsdp_lm_set_checkpointing(m, -1, 1);
    if (st == FSDP_OK && j->init_file != NULL) {
        st = fsdp_gpt2_weights_open(j->init_file, &j->cfg, &w);
        if (st == FSDP_OK)
            st = fsdp_lm_load_weights(m, w);
        fsdp_lm_weights_close(w);
    } else if (st == FSDP_OK && j->init != NULL) {
        st = lm_test_set_params(m, j->init);
    } else if (st == FSDP_OK) {
        st = fsdp_lm_init_params(m, j->seed);
    }
    if (st == FSDP_OK && j->steps > 0)
        st = fsdp_optim_create(fs, &j->optim, &opt);
    for (int s = 0; s < (j->steps > 0 ? j->steps : 1) && st == FSDP_OK; s++) {
        float loss = 0.0f;
        if (j->shape) {
            free(in), free(tg);
            in = tg = NULL;
        } else {
            st = lm_test_rank_batch(j->tokens, j->inputs, j->targets, j->batch, j->seq, j->seed,
                                    dev->rank, dev->world_size, s, in, tg);
        }
        if (st == FSDP_OK && j->accum > 1) {
            fsdp_lm_set_loss_scale(m, 1.0f / (float)j->accum);
            st = lm_test_accumulate(fs, m, j->accum, in, tg, rows, j->seq, &loss);
        } else if (st == FSDP_OK) {
            st = fsdp_lm_forward_backward(m, in, tg, rows, j->seq, &loss);
        }
        j->losses[s][dev->rank] = loss;
        if (st == FSDP_OK && j->steps == 0 && dev->world_size == 1 && j->grads != NULL)
            lm_test_grads(m, j->grads);
        if (st == FSDP_OK && opt != NULL)
            st = fsdp_optim_step(opt);
        fsdp_zero_grad(fs);
    }
    /* the training's collectives and kernels, before the gathers of the full parameters */
    j->ag_dtypes[dev->rank] = tl_ag;
    j->rs_dtypes[dev->rank] = tl_rs;
    j->gemm_dtypes[dev->rank] = tl_gemm;
    j->nn_dtypes[dev->rank] = tl_nn;
    if (st == FSDP_OK && j->params != NULL)
        st = lm_test_gather_params(m, dev->rank, j->params);
    if (st == FSDP_OK && j->save_path != NULL)
        st = fsdp_gpt2_save_weights(m, j->save_path, j->save_names);
    if (fs != NULL)
        j->act_peak[dev->rank] = lm_test_act_peak(fs);
    free(in);
    free(tg);
    fsdp_optim_destroy(opt);
    fsdp_lm_destroy(m);
    fsdp_destroy(fs);
    dev->ops = tl_inner;
    fsdp_sim_pack_cache_stats(dev, &j->pack_hits[dev->rank], &j->pack_packs[dev->rank]);
    return st;
}

static fsdp_status_t job_run(job_t *j)
{
    return j->no_pack_cache ? lm_test_launch_packing(j->world, 1, job_rank, j)
                            : lm_test_launch(j->world, j->shape, job_rank, j);
}

static void cfg_of(fsdp_gpt2_config_t *cfg, const ref_cfg_t *c)
{
    fsdp_gpt2_config_init(cfg);
    cfg->n_layer = c->L;
    cfg->n_head = c->H;
    cfg->n_embd = c->C;
    cfg->n_positions = c->P;
    cfg->vocab_size = c->V;
}

/* random parameters of a larger scale than HF's init, so that every path carries signal */
static float *random_params(const ref_cfg_t *c, ref_model_t *ref)
{
    size_t total = 0, off = 0;
    float *v;
    for (int k = -1; k < c->L; k++)
        for (int i = 0; i < (k < 0 ? NR : NB); i++)
            total += ref_numel(c, k, i);
    v = malloc(total * sizeof(float));
    for (int k = -1; k < c->L; k++)
        for (int i = 0; i < (k < 0 ? NR : NB); i++) {
            int is_ln_w =
                k < 0 ? i == FSDP_GPT2_LNF_W : i == FSDP_GPT2_LN1_W || i == FSDP_GPT2_LN2_W;
            for (size_t e = 0; e < ref_numel(c, k, i); e++, off++) {
                v[off] = (float)(is_ln_w ? urand(0.5, 1.5) : urand(-0.5, 0.5));
                ref_param(ref, k, i)[e] = v[off];
            }
        }
    return v;
}

/* max over elements of |a - b| / (max |b| of the tensor), per tensor of the canonical order */
static double max_rel_diff(const ref_cfg_t *c, const float *a, const double *const *b_tensors)
{
    size_t off = 0;
    double worst = 0.0;
    int t = 0;
    for (int k = -1; k < c->L; k++)
        for (int i = 0; i < (k < 0 ? NR : NB); i++, t++) {
            size_t n = ref_numel(c, k, i);
            double scale = 1e-12, d = 0.0;
            for (size_t e = 0; e < n; e++)
                scale = fmax(scale, fabs(b_tensors[t][e]));
            for (size_t e = 0; e < n; e++)
                d = fmax(d, fabs((double)a[off + e] - b_tensors[t][e]));
            worst = fmax(worst, d / scale);
            off += n;
        }
    return worst;
}

static const double **ref_tensors(const ref_model_t *m)
{
    const double **t = malloc(sizeof(double *) * (size_t)(NR + m->c.L * NB));
    int n = 0;
    for (int k = -1; k < m->c.L; k++)
        for (int i = 0; i < (k < 0 ? NR : NB); i++)
            t[n++] = ref_param(m, k, i);
    return t;
}

static const ref_cfg_t small = {2, 2, 8, 8, 11}; /* T = 6 < P: unused wpe rows */
#define SB 2
#define ST 6

static void small_batch(int32_t *in, int32_t *tg)
{
    for (int i = 0; i < SB * ST; i++) {
        in[i] = (int32_t)(urand(0, small.V - 0.01));
        tg[i] = (int32_t)(urand(0, small.V - 0.01));
    }
    tg[3] = -1; /* ignored */
}

/* the presets have the published sizes, and model specs parse or are refused */
static void test_presets_and_specs(void)
{
    static const struct {
        const char *name;
        uint64_t params; /* docs/formats.md section 2 (tied, without the mask buffers) */
    } hf[] = {{"gpt2", 124439808ull},
              {"gpt2-medium", 354823168ull},
              {"gpt2-large", 774030080ull},
              {"gpt2-xl", 1557611200ull}};
    static const struct {
        const char *name;
        double billions; /* Brown et al. 2020, table 2.1 */
    } gpt3[] = {{"gpt3-small", 0.125}, {"gpt3-medium", 0.350}, {"gpt3-large", 0.760},
                {"gpt3-xl", 1.3},      {"gpt3-2.7b", 2.7},     {"gpt3-6.7b", 6.7},
                {"gpt3-13b", 13.0},    {"gpt3-175b", 175.0}};
    static const char *const bad[] = {"gpt2-huge",    "gpt2:layers=0",  "gpt2:heads=3,dim=16",
                                      "gpt2:depth=2", "gpt2:layers=2,", "gpt2:dim=x",
                                      "gpt",
                                      /* one key twice, no key, an int's overflow */
                                      "gpt2:", "gpt2:layers=2,layers=3", "gpt2:,dim=16",
                                      "gpt2:dim=16,,heads=2", "gpt2:attention=sdpa",
                                      "gpt2:vocab=4294967297"};
    fsdp_gpt2_config_t cfg;
    int n;

    for (size_t i = 0; i < sizeof(hf) / sizeof(hf[0]); i++) {
        CU_ASSERT_EQUAL_FATAL(fsdp_gpt2_config_parse(hf[i].name, &cfg), FSDP_OK);
        CU_ASSERT_EQUAL(fsdp_gpt2_num_params(&cfg), hf[i].params);
        CU_ASSERT_EQUAL(cfg.n_embd / cfg.n_head, 64);
    }
    for (size_t i = 0; i < sizeof(gpt3) / sizeof(gpt3[0]); i++) {
        double p;
        CU_ASSERT_EQUAL_FATAL(fsdp_gpt2_config_parse(gpt3[i].name, &cfg), FSDP_OK);
        p = (double)fsdp_gpt2_num_params(&cfg) / 1e9;
        if (fabs(p / gpt3[i].billions - 1.0) > 0.03)
            fprintf(stderr, "\n  %s: %.3fB parameters", gpt3[i].name, p);
        CU_ASSERT(fabs(p / gpt3[i].billions - 1.0) <= 0.03);
        CU_ASSERT_EQUAL(cfg.n_positions, 2048);
    }
    CU_ASSERT(fsdp_gpt2_presets(&n) != NULL && n == 13);
    CU_ASSERT(fsdp_gpt2_preset_find("gpt2-tiny") != NULL);
    CU_ASSERT_EQUAL(fsdp_gpt2_config_parse("gpt2:layers=3,heads=4,dim=32,seq=16,vocab=300", &cfg),
                    FSDP_OK);
    CU_ASSERT(cfg.n_layer == 3 && cfg.n_head == 4 && cfg.n_embd == 32 && cfg.n_positions == 16 &&
              cfg.vocab_size == 300);
    CU_ASSERT_EQUAL(fsdp_gpt2_config_parse("gpt2:dim=32", &cfg), FSDP_OK); /* the rest: tiny */
    CU_ASSERT(cfg.n_layer == 2 && cfg.n_head == 2 && cfg.n_embd == 32 && cfg.vocab_size == 256);
    fsdp_log_set_level(FSDP_LOG_OFF);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        CU_ASSERT_EQUAL(fsdp_gpt2_config_parse(bad[i], &cfg), FSDP_ERR_INVALID_PARAM);
    fsdp_log_set_level(FSDP_LOG_ERROR);
    CU_ASSERT(fsdp_gpt2_spec_is_gpt("gpt2-medium") && !fsdp_gpt2_spec_is_gpt("mlp:4,4"));
    /* 6 N per token for training, give or take the attention: 2 N forward */
    fsdp_gpt2_config_parse("gpt2", &cfg);
    CU_ASSERT(fabs(fsdp_gpt2_flops_per_token(&cfg, 1024) / (2.0 * 124e6) - 1.0) < 0.25);
}

/* the reference's own backward against finite differences of its forward */
static void test_reference_self_check(void)
{
    ref_model_t p, g;
    int32_t in[SB * ST], tg[SB * ST];
    int bad = 0;

    rng_state = 11;
    ref_alloc(&p, &small);
    ref_alloc(&g, &small);
    free(random_params(&small, &p));
    small_batch(in, tg);
    ref_run(&p, &g, in, tg, SB, ST);
    for (int trial = 0; trial < 60; trial++) {
        int k = (int)urand(-1, small.L - 0.01), i = (int)urand(0, (k < 0 ? NR : NB) - 0.01);
        size_t e = (size_t)urand(0, (double)ref_numel(&small, k, i) - 0.01);
        double *v = ref_param(&p, k, i) + e, keep = *v, lp, lm, fd, an;
        *v = keep + 1e-6;
        lp = ref_run(&p, NULL, in, tg, SB, ST);
        *v = keep - 1e-6;
        lm = ref_run(&p, NULL, in, tg, SB, ST);
        *v = keep;
        fd = (lp - lm) / 2e-6;
        an = ref_param(&g, k, i)[e];
        if (fabs(fd - an) > 1e-6 + 1e-5 * fabs(an)) {
            fprintf(stderr, "\n  reference grad (%d, %d)[%zu]: %g vs fd %g\n", k, i, e, an, fd);
            bad++;
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
    ref_free(&p);
    ref_free(&g);
}

/* the model's loss and gradients (W = 1) against the double reference */
/* one forward-backward of the small model on one rank from init, its gradients kept */
static void small_job(job_t *j, const float *init, const int32_t *in, const int32_t *tg,
                      size_t total)
{
    cfg_of(&j->cfg, &small);
    j->strategy = FSDP_FULL_SHARD;
    j->world = 1;
    j->init = init;
    j->inputs = in;
    j->targets = tg;
    j->batch = SB;
    j->seq = ST;
    j->grads = malloc(total * sizeof(float));
}

static void test_against_reference(void)
{
    ref_model_t p, g;
    int32_t in[SB * ST], tg[SB * ST];
    job_t *j = calloc(1, sizeof(*j));
    size_t total = fsdp_gpt2_num_params(&(fsdp_gpt2_config_t){2, 2, 8, 8, 11, 1e-5f, 0.02f, 0});
    float *grads_ckpt = malloc(total * sizeof(float));
    double loss;
    const double **gt;

    rng_state = 11;
    ref_alloc(&p, &small);
    ref_alloc(&g, &small);
    float *init = random_params(&small, &p);
    small_batch(in, tg);
    loss = ref_run(&p, &g, in, tg, SB, ST);

    small_job(j, init, in, tg, total);
    CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
    fprintf(stderr, "\n  loss %.9g, reference %.9g\n", (double)j->losses[0][0], loss);
    CU_ASSERT(fabs(j->losses[0][0] - loss) <= 1e-5 * loss);
    gt = ref_tensors(&g);
    double d = max_rel_diff(&small, j->grads, gt);
    fprintf(stderr, "  gradients: max |model - reference| / max |reference| per tensor %.3g\n", d);
    CU_ASSERT(d <= 1e-4);

    /* activation checkpointing recomputes the same activations: the same bits */
    memcpy(grads_ckpt, j->grads, total * sizeof(float));
    j->checkpoint = 1;
    CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
    CU_ASSERT(memcmp(grads_ckpt, j->grads, total * sizeof(float)) == 0);

    /* the fused attention: the same math within f32 rounding, checkpointed to the same bits */
    j->checkpoint = 0;
    j->cfg.fused_attention = 1;
    CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
    fprintf(stderr, "  fused attention: loss %.9g; ", (double)j->losses[0][0]);
    CU_ASSERT(fabs(j->losses[0][0] - loss) <= 1e-5 * loss);
    d = max_rel_diff(&small, j->grads, gt);
    fprintf(stderr, "gradients within %.3g\n", d);
    CU_ASSERT(d <= 1e-4);
    CU_ASSERT(memcmp(grads_ckpt, j->grads, total * sizeof(float)) != 0); /* not the eager path */
    memcpy(grads_ckpt, j->grads, total * sizeof(float));
    j->checkpoint = 1;
    CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
    CU_ASSERT(memcmp(grads_ckpt, j->grads, total * sizeof(float)) == 0);

    free(gt);
    free(grads_ckpt);
    free(j->grads);
    free(j);
    free(init);
    ref_free(&p);
    ref_free(&g);
}

/* ---------------- FSDP parity ---------------- */

static void parity_job(job_t *j, fsdp_tokens_t *t, fsdp_strategy_t s, int world)
{
    float *params = j->params;
    memset(j, 0, sizeof(*j));
    j->params = params;
    fsdp_gpt2_config_parse("gpt2-tiny", &j->cfg);
    j->strategy = s;
    j->world = world;
    j->seed = 3;
    j->tokens = t;
    j->batch = 4;
    j->seq = 32;
    j->steps = 5;
    fsdp_optim_config_init(&j->optim, FSDP_OPTIM_ADAMW);
    j->optim.lr = 1e-3f;
}

/* ||a - b|| / ||b|| per parameter tensor (canonical order), the worst of them; the K third of
 * every c_attn.bias apart: its exact gradient is 0 (softmax is invariant to adding q.b_k to a
 * whole row of scores), so it moves only by rounding noise, which AdamW's normalization
 * amplifies to O(lr * noise / eps) and which no two summation orders share. *k_bias_p gets the
 * largest |value| of those K biases, in either run. */
static double tensor_diff(const fsdp_gpt2_config_t *cfg, const float *a, const float *b,
                          double *k_bias_p)
{
    const ref_cfg_t c = {cfg->n_layer, cfg->n_head, cfg->n_embd, cfg->n_positions, cfg->vocab_size};
    size_t off = 0;
    double worst = 0.0;

    *k_bias_p = 0.0;
    for (int k = -1; k < c.L; k++)
        for (int i = 0; i < (k < 0 ? NR : NB); i++) {
            size_t n = ref_numel(&c, k, i);
            double nd = 0.0, nb = 0.0;
            for (size_t e = 0; e < n; e++) {
                double x = a[off + e], y = b[off + e];
                if (k >= 0 && i == FSDP_GPT2_ATTN_B && e >= (size_t)c.C && e < 2 * (size_t)c.C) {
                    *k_bias_p = fmax(*k_bias_p, fmax(fabs(x), fabs(y)));
                    continue;
                }
                nd += (x - y) * (x - y);
                nb += y * y;
            }
            if (nb > 0.0)
                worst = fmax(worst, sqrt(nd / nb));
            off += n;
        }
    return worst;
}

static void test_fsdp_parity(void)
{
    static const fsdp_strategy_t strategies[] = {FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP,
                                                 FSDP_NO_SHARD};
    static const int worlds[] = {1, 2, 4};
    fsdp_tokens_t *t = lm_test_parity_tokens();
    job_t *ref = calloc(1, sizeof(*ref)), *j = calloc(1, sizeof(*j));
    fsdp_gpt2_config_t cfg;
    size_t total;

    fsdp_gpt2_config_parse("gpt2-tiny", &cfg);
    total = fsdp_gpt2_num_params(&cfg);
    ref->params = malloc(total * sizeof(float));
    j->params = malloc(total * sizeof(float));
    parity_job(ref, t, FSDP_NO_SHARD, 1); /* single process */
    CU_ASSERT_EQUAL_FATAL(job_run(ref), FSDP_OK);
    CU_ASSERT(ref->losses[4][0] < ref->losses[0][0] - 0.1f); /* it trained */
    for (size_t s = 0; s < 3; s++) {
        for (size_t w = 0; w < 3; w++) {
            int world = worlds[w];
            double dl = 0.0, dp, kb;
            parity_job(j, t, strategies[s], world);
            CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
            for (int step = 0; step < 5; step++) {
                double mean = 0.0;
                for (int r = 0; r < world; r++) /* every rank counts the same targets */
                    mean += j->losses[step][r] / world;
                dl = fmax(dl, fabs(mean - ref->losses[step][0]) / ref->losses[step][0]);
            }
            dp = tensor_diff(&cfg, j->params, ref->params, &kb);
            fprintf(stderr,
                    "\n  %s W=%d: losses within %.2g, parameters within %.2g (per "
                    "tensor, norm), |K bias| <= %.2g",
                    fsdp_strategy_name(strategies[s]), world, dl, dp, kb);
            CU_ASSERT(dl <= 1e-5);
            CU_ASSERT(dp <= 1e-5);
            CU_ASSERT(kb <= 1e-4); /* 5 steps of lr 1e-3 move a real gradient's 5e-3 */
        }
    }
    /* the fused attention: FULL_SHARD on 2 and 4 ranks equals its own single process */
    parity_job(ref, t, FSDP_NO_SHARD, 1);
    ref->cfg.fused_attention = 1;
    CU_ASSERT_EQUAL_FATAL(job_run(ref), FSDP_OK);
    for (int world = 2; world <= 4; world += 2) {
        double dl = 0.0, dp, kb;
        parity_job(j, t, FSDP_FULL_SHARD, world);
        j->cfg.fused_attention = 1;
        CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
        for (int step = 0; step < 5; step++) {
            double mean = 0.0;
            for (int r = 0; r < world; r++)
                mean += j->losses[step][r] / world;
            dl = fmax(dl, fabs(mean - ref->losses[step][0]) / ref->losses[step][0]);
        }
        dp = tensor_diff(&cfg, j->params, ref->params, &kb);
        fprintf(stderr,
                "\n  fused attention, full_shard W=%d: losses within %.2g, parameters within %.2g",
                world, dl, dp);
        CU_ASSERT(dl <= 1e-5);
        CU_ASSERT(dp <= 1e-5);
        CU_ASSERT(kb <= 1e-4);
    }
    free(ref->params);
    free(j->params);
    free(ref);
    free(j);
    fsdp_tokens_close(t);
}

/* ---------------- HF checkpoints ---------------- */

static char tmpdir[] = "/tmp/test_gpt2.XXXXXX";

static void path_in_tmp(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%s/%s", tmpdir, name);
}

/* Log lines, captured to check that an error names its tensor. */
static char log_buf[4096];

static void log_capture(fsdp_log_level_t level, const char *file, int line, const char *func,
                        const char *msg, void *arg)
{
    (void)level, (void)file, (void)line, (void)func, (void)arg;
    snprintf(log_buf + strlen(log_buf), sizeof(log_buf) - strlen(log_buf), "%s\n", msg);
}

/* HF's name of canonical tensor (k, i): k = -1 the root */
static void hf_name(char *out, size_t len, const char *prefix, int k, int i)
{
    static const char *const root[NR] = {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"};
    static const char *const blk[NB] = {
        "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
        "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
        "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
    if (k < 0)
        snprintf(out, len, "%s%s", prefix, root[i]);
    else
        snprintf(out, len, "%sh.%d.%s", prefix, k, blk[i]);
}

static void hf_shape(const ref_cfg_t *c, int k, int i, int *ndim, int64_t *shape)
{
    const int64_t C = c->C;
    *ndim = 1;
    shape[0] = (int64_t)ref_numel(c, k, i);
    if (k < 0 && i < 2) {
        *ndim = 2;
        shape[0] = i == 0 ? c->V : c->P;
        shape[1] = C;
    } else if (k >= 0 && (i == 2 || i == 4 || i == 8 || i == 10)) {
        *ndim = 2;
        shape[0] = i == 10 ? 4 * C : C;
        shape[1] = i == 2 ? 3 * C : i == 8 ? 4 * C : C;
    }
}

/* a full checkpoint of `values` (canonical order) in the hub's style; mutate(entries, &n) may
 * change it. Returns the status of the write. */
typedef void (*mutate_func_t)(fsdp_st_entry_t *e, int *n, int64_t (*shapes)[4]);

static fsdp_status_t write_hub(const char *path, const ref_cfg_t *c, const float *values,
                               const char *prefix, int with_buffers, mutate_func_t mutate)
{
    const int nmax = NR + c->L * NB + 2 * c->L + 4;
    fsdp_st_entry_t *e = calloc((size_t)nmax, sizeof(*e));
    char(*names)[64] = calloc((size_t)nmax, sizeof(*names));
    int64_t(*shapes)[4] = calloc((size_t)nmax, sizeof(*shapes));
    float *mask = calloc((size_t)c->P * c->P, sizeof(float)), minus = -1e4f;
    size_t off = 0;
    int n = 0;
    fsdp_status_t st;

    for (int r = 0; r < c->P; r++)
        for (int q = 0; q <= r; q++)
            mask[r * c->P + q] = 1.0f;
    for (int k = -1; k < c->L; k++)
        for (int i = 0; i < (k < 0 ? NR : NB); i++, n++) {
            hf_name(names[n], sizeof(names[n]), prefix, k, i);
            hf_shape(c, k, i, &e[n].ndim, shapes[n]);
            e[n].name = names[n];
            e[n].dtype = "F32";
            e[n].shape = shapes[n];
            e[n].data = values + off;
            off += ref_numel(c, k, i);
        }
    for (int l = 0; with_buffers && l < c->L; l++) {
        snprintf(names[n], sizeof(names[n]), "%sh.%d.attn.bias", prefix, l);
        e[n].name = names[n];
        e[n].dtype = "F32";
        e[n].ndim = 4;
        shapes[n][0] = shapes[n][1] = 1;
        shapes[n][2] = shapes[n][3] = c->P;
        e[n].shape = shapes[n];
        e[n].data = mask;
        n++;
        snprintf(names[n], sizeof(names[n]), "%sh.%d.attn.masked_bias", prefix, l);
        e[n].name = names[n];
        e[n].dtype = "F32";
        e[n].ndim = 0;
        e[n].shape = shapes[n];
        e[n].data = &minus;
        n++;
    }
    if (with_buffers) { /* the tied head, as some exports keep it */
        e[n] = e[0];
        e[n].name = "lm_head.weight";
        n++;
    }
    if (mutate != NULL)
        mutate(e, &n, shapes);
    static const char *const meta[] = {"format", "pt"};
    st = fsdp_st_write(path, e, n, meta, 1);
    free(e), free(names), free(shapes), free(mask);
    return st;
}

static void test_hf_round_trip(void)
{
    job_t *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
    int32_t in[SB * ST], tg[SB * ST];
    char path[256], bare[256];
    fsdp_st_file_t *f;
    const fsdp_st_tensor_t *t;
    size_t total;

    rng_state = 5;
    small_batch(in, tg);
    path_in_tmp(path, sizeof(path), "a.safetensors");
    path_in_tmp(bare, sizeof(bare), "bare.safetensors");
    cfg_of(&a->cfg, &small);
    total = fsdp_gpt2_num_params(&a->cfg);
    a->params = malloc(total * sizeof(float));
    a->strategy = FSDP_FULL_SHARD;
    a->world = 2;
    a->seed = 9;
    a->inputs = in;
    a->targets = tg;
    a->batch = SB;
    a->seq = ST;
    a->save_path = path;
    CU_ASSERT_EQUAL_FATAL(job_run(a), FSDP_OK);

    /* HF's names, Conv1D layouts, no tied head, no buffers */
    CU_ASSERT_EQUAL_FATAL(fsdp_st_open(path, &f), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_st_num_tensors(f), NR + small.L * NB);
    t = fsdp_st_find(f, "transformer.h.1.attn.c_attn.weight");
    CU_ASSERT(t != NULL && t->ndim == 2 && t->shape[0] == small.C && t->shape[1] == 3 * small.C);
    t = fsdp_st_find(f, "transformer.h.0.mlp.c_proj.weight");
    CU_ASSERT(t != NULL && t->ndim == 2 && t->shape[0] == 4 * small.C && t->shape[1] == small.C);
    t = fsdp_st_find(f, "transformer.wte.weight");
    CU_ASSERT(t != NULL && strcmp(t->dtype, "F32") == 0 && t->shape[0] == small.V);
    CU_ASSERT(fsdp_st_find(f, "lm_head.weight") == NULL);
    CU_ASSERT(fsdp_st_find(f, "transformer.h.0.attn.bias") == NULL);
    CU_ASSERT(fsdp_st_metadata(f, "format") != NULL &&
              strcmp(fsdp_st_metadata(f, "format"), "pt") == 0);
    fsdp_st_close(f);
    /* the shape can be read back from the tensors (heads are not in them) */
    fsdp_gpt2_config_t inferred;
    fsdp_gpt2_config_init(&inferred);
    inferred.n_head = small.H;
    CU_ASSERT_EQUAL_FATAL(fsdp_gpt2_weights_infer_config(path, &inferred), FSDP_OK);
    CU_ASSERT(inferred.n_layer == small.L && inferred.n_embd == small.C &&
              inferred.n_positions == small.P && inferred.vocab_size == small.V &&
              inferred.n_head == small.H);

    /* loads into other world sizes and strategies: the same values; saves without prefix */
    *b = *a;
    b->params = malloc(total * sizeof(float));
    b->init_file = path;
    b->save_path = bare;
    b->save_names = FSDP_GPT2_SAVE_BARE;
    for (int w = 1; w <= 2; w++) {
        b->world = w;
        b->strategy = w == 1 ? FSDP_NO_SHARD : FSDP_SHARD_GRAD_OP;
        CU_ASSERT_EQUAL_FATAL(job_run(b), FSDP_OK);
        CU_ASSERT(memcmp(a->params, b->params, total * sizeof(float)) == 0);
    }
    CU_ASSERT_EQUAL_FATAL(fsdp_st_open(bare, &f), FSDP_OK);
    CU_ASSERT(fsdp_st_find(f, "h.1.ln_2.bias") != NULL && fsdp_st_find(f, "wpe.weight") != NULL);
    CU_ASSERT(fsdp_st_find(f, "transformer.wpe.weight") == NULL);
    fsdp_st_close(f);
    b->init_file = bare; /* and the bare names load back too */
    b->save_path = NULL;
    CU_ASSERT_EQUAL_FATAL(job_run(b), FSDP_OK);
    CU_ASSERT(memcmp(a->params, b->params, total * sizeof(float)) == 0);
    free(a->params), free(b->params), free(a), free(b);
}

/* 16-bit tensors: rounded here as the writer stores them */
static uint16_t to_bf16(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static uint16_t *bf16_wte;

static void make_wte_bf16(fsdp_st_entry_t *e, int *n, int64_t (*shapes)[4])
{
    (void)n, (void)shapes;
    e[0].dtype = "BF16";
    e[0].data = bf16_wte;
}

/* The hub's file (bare names, mask buffers, the tied head, a BF16 tensor) gives the model the
 * loss and gradients the double reference computes from the same tensors read as Conv1D. */
static void test_hf_hub_layout(void)
{
    ref_model_t p, g;
    int32_t in[SB * ST], tg[SB * ST];
    job_t *j = calloc(1, sizeof(*j));
    char path[256];
    const double **gt;
    double loss;
    size_t total, nwte = (size_t)small.V * small.C;
    float *values;

    rng_state = 23;
    ref_alloc(&p, &small);
    ref_alloc(&g, &small);
    values = random_params(&small, &p);
    bf16_wte = malloc(nwte * sizeof(uint16_t));
    for (size_t i = 0; i < nwte; i++) { /* the reference sees the rounded values */
        uint32_t u;
        bf16_wte[i] = to_bf16(values[i]);
        u = (uint32_t)bf16_wte[i] << 16;
        memcpy(&values[i], &u, 4);
        p.root[FSDP_GPT2_WTE][i] = values[i];
    }
    small_batch(in, tg);
    loss = ref_run(&p, &g, in, tg, SB, ST);
    path_in_tmp(path, sizeof(path), "hub.safetensors");
    CU_ASSERT_EQUAL_FATAL(write_hub(path, &small, values, "", 1, make_wte_bf16), FSDP_OK);

    cfg_of(&j->cfg, &small);
    total = fsdp_gpt2_num_params(&j->cfg);
    j->strategy = FSDP_FULL_SHARD;
    j->world = 1;
    j->init_file = path;
    j->inputs = in;
    j->targets = tg;
    j->batch = SB;
    j->seq = ST;
    j->grads = malloc(total * sizeof(float));
    CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
    CU_ASSERT(fabs(j->losses[0][0] - loss) <= 1e-5 * loss);
    gt = ref_tensors(&g);
    CU_ASSERT(max_rel_diff(&small, j->grads, gt) <= 1e-4);
    free(gt), free(j->grads), free(j), free(values), free(bf16_wte);
    ref_free(&p);
    ref_free(&g);
}

/* one defect per file, each refused with a line that names the tensor */
static void transpose_fc(fsdp_st_entry_t *e, int *n, int64_t (*shapes)[4])
{
    for (int i = 0; i < *n; i++)
        if (strcmp(e[i].name, "h.1.mlp.c_fc.weight") == 0) { /* nn.Linear's [out, in] */
            int64_t r = shapes[i][0];
            shapes[i][0] = shapes[i][1];
            shapes[i][1] = r;
        }
}

static void int_bias(fsdp_st_entry_t *e, int *n, int64_t (*shapes)[4])
{
    (void)shapes;
    for (int i = 0; i < *n; i++)
        if (strcmp(e[i].name, "ln_f.bias") == 0)
            e[i].dtype = "I32";
}

static void drop_ln2_bias(fsdp_st_entry_t *e, int *n, int64_t (*shapes)[4])
{
    (void)shapes;
    for (int i = 0; i < *n; i++)
        if (strcmp(e[i].name, "h.0.ln_2.bias") == 0)
            e[i] = e[--*n];
}

static void extra_layer(fsdp_st_entry_t *e, int *n, int64_t (*shapes)[4])
{
    (void)shapes;
    e[*n] = e[NR]; /* h.0.ln_1.weight as h.2 */
    e[*n].name = "h.2.ln_1.weight";
    ++*n;
}

static void both_prefixes(fsdp_st_entry_t *e, int *n, int64_t (*shapes)[4])
{
    (void)shapes;
    e[*n] = e[1];
    e[*n].name = "transformer.wpe.weight";
    ++*n;
}

static void test_hf_errors(void)
{
    static const struct {
        mutate_func_t mutate;
        const char *named;
    } cases[] = {
        {transpose_fc, "'h.1.mlp.c_fc.weight' has shape [32, 8]"},
        {int_bias, "'ln_f.bias' has dtype I32"},
        {drop_ln2_bias, "h.0.ln_2.bias"},
        {extra_layer, "unexpected tensor 'h.2.ln_1.weight'"},
        {both_prefixes, "'transformer.wpe.weight' and 'wpe.weight' are the same parameter"}};
    fsdp_gpt2_config_t cfg;
    float *values;
    size_t total;
    char path[256];

    cfg_of(&cfg, &small);
    total = fsdp_gpt2_num_params(&cfg);
    values = calloc(total, sizeof(float));
    path_in_tmp(path, sizeof(path), "bad.safetensors");
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        fsdp_lm_weights_t *w = NULL;
        CU_ASSERT_EQUAL_FATAL(write_hub(path, &small, values, "", 0, cases[c].mutate), FSDP_OK);
        log_buf[0] = '\0';
        fsdp_log_set_handler(log_capture, NULL);
        CU_ASSERT_EQUAL(fsdp_gpt2_weights_open(path, &cfg, &w), FSDP_ERR_FORMAT);
        fsdp_log_set_handler(NULL, NULL);
        CU_ASSERT(w == NULL);
        if (strstr(log_buf, cases[c].named) == NULL)
            fprintf(stderr, "\n  expected '%s' in: %s", cases[c].named, log_buf);
        CU_ASSERT(strstr(log_buf, cases[c].named) != NULL);
    }
    /* a model of other dimensions is told which tensor does not fit */
    CU_ASSERT_EQUAL_FATAL(write_hub(path, &small, values, "transformer.", 0, NULL), FSDP_OK);
    cfg.n_positions = 16;
    log_buf[0] = '\0';
    fsdp_log_set_handler(log_capture, NULL);
    fsdp_lm_weights_t *w = NULL;
    CU_ASSERT_EQUAL(fsdp_gpt2_weights_open(path, &cfg, &w), FSDP_ERR_FORMAT);
    fsdp_log_set_handler(NULL, NULL);
    CU_ASSERT(strstr(log_buf, "'transformer.wpe.weight' has shape [8, 8]") != NULL);
    free(values);
}

/* ---------------- learning ---------------- */

static void test_learns_default_corpus(void)
{
    job_t *j = calloc(1, sizeof(*j));
    fsdp_tokens_t *t = NULL;
    double first, last = 0.0;

    CU_ASSERT_EQUAL_FATAL(corpus_open_default(NULL, &t), FSDP_OK);
    CU_ASSERT_EQUAL_FATAL(
        fsdp_gpt2_config_parse("gpt2:layers=1,heads=2,dim=32,seq=32,vocab=256", &j->cfg), FSDP_OK);
    j->strategy = FSDP_FULL_SHARD;
    j->world = 2;
    j->seed = 1;
    j->tokens = t;
    j->batch = 8;
    j->seq = 32;
    j->steps = 200;
    fsdp_optim_config_init(&j->optim, FSDP_OPTIM_ADAMW);
    j->optim.lr = 1e-2f;
    CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
    first = (j->losses[0][0] + j->losses[0][1]) / 2.0;
    for (int s = 190; s < 200; s++)
        last += (j->losses[s][0] + j->losses[s][1]) / 20.0;
    fprintf(stderr, "\n  loss %.4f at step 1, %.4f over steps 191-200", first, last);
    CU_ASSERT(fabs(first - log(256.0)) < 0.25); /* uniform over the bytes at init */
    CU_ASSERT(last < first - LEARN_MARGIN);
    fsdp_tokens_close(t);
    free(j);
}

/* ---------------- mixed precision ---------------- */

static void mp_of(job_t *j, fsdp_dtype_t param, fsdp_dtype_t reduce)
{
    j->use_mp = 1;
    j->mp.param_dtype = param;
    j->mp.reduce_dtype = reduce;
    j->mp.buffer_dtype = FSDP_DTYPE_UNSET;
    j->mp.cast_forward_inputs = 1;
}

static void sgd_of(job_t *j)
{
    fsdp_optim_config_init(&j->optim, FSDP_OPTIM_SGD);
    j->optim.lr = 0.3f;
}

/* Unit roundoff of the 16-bit dtypes: half the spacing at 1 (8 and 11 significant bits). */
#define U_BF16 0x1p-9
#define U_F16 0x1p-12

/* The small model of test_against_reference in bf16 and in f16 against the same model in f32
 * (itself within 1e-5 of the double reference). Every kernel rounds its output once, so each
 * activation carries a relative error of a few u; through 2 blocks (about 12 rounded tensors a
 * block on the path of the loss, each adding its u, some amplified by layernorm's rstd) the
 * loss stays within 30 u relative, and each gradient tensor (about 25 more roundings on the way
 * back, and weight gradients summed from rounded products) within 150 u of its largest value;
 * the bounds are checked to be tight enough to tell the dtypes apart: f16's errors are smaller
 * than bf16's. The double reference run with the rounding points of HF's model under torch
 * (every op's output rounded once to the dtype, the weights too: a Conv1D's bias added before
 * its rounding, the attention scores divided by sqrt(head size) held in the dtype) gives the
 * model's loss within 1e-3 u (measured: 6e-7 u in bf16, 4e-5 u in f16): what is left is f32
 * arithmetic against double inside each op. */
static void test_mp_against_f32(void)
{
    static const fsdp_dtype_t dts[] = {FSDP_DTYPE_BF16, FSDP_DTYPE_F16};
    static const double us[] = {U_BF16, U_F16};
    ref_model_t p, g;
    int32_t in[SB * ST], tg[SB * ST];
    job_t *j = calloc(1, sizeof(*j));
    size_t total = fsdp_gpt2_num_params(&(fsdp_gpt2_config_t){2, 2, 8, 8, 11, 1e-5f, 0.02f, 0});
    float *grads32 = malloc(total * sizeof(float)), loss32;
    double dl[2], dg[2], de[2];

    rng_state = 11;
    ref_alloc(&p, &small);
    ref_alloc(&g, &small);
    float *init = random_params(&small, &p);
    small_batch(in, tg);
    small_job(j, init, in, tg, total);
    CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
    loss32 = j->losses[0][0];
    memcpy(grads32, j->grads, total * sizeof(float));
    for (int d = 0; d < 2; d++) {
        double *gt_d = malloc(total * sizeof(double));
        const double **gt = malloc(sizeof(double *) * (size_t)(NR + small.L * NB));
        size_t off = 0;
        int t = 0;
        mp_of(j, dts[d], FSDP_DTYPE_F32);
        CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
        CU_ASSERT(j->gemm_dtypes[0] == 1u << dts[d]); /* every GEMM in the compute dtype */
        CU_ASSERT(j->nn_dtypes[0] == 1u << dts[d]);
        for (size_t e = 0; e < total; e++)
            gt_d[e] = grads32[e];
        for (int k = -1; k < small.L; k++)
            for (int i = 0; i < (k < 0 ? NR : NB); i++) {
                gt[t++] = gt_d + off;
                off += ref_numel(&small, k, i);
            }
        dl[d] = fabs((double)j->losses[0][0] - loss32) / loss32;
        dg[d] = max_rel_diff(&small, j->grads, gt);
        {
            /* the double reference rounding where the model rounds, from the rounded weights */
            ref_model_t pr;
            double le;
            ref_alloc(&pr, &small);
            ref_rnd = d == 0 ? ref_round_bf16 : ref_round_f16;
            for (int k = -1; k < small.L; k++)
                for (int i = 0; i < (k < 0 ? NR : NB); i++)
                    for (size_t e = 0; e < ref_numel(&small, k, i); e++)
                        ref_param(&pr, k, i)[e] = ref_rnd(ref_param(&p, k, i)[e]);
            le = ref_run(&pr, NULL, in, tg, SB, ST);
            ref_rnd = ref_exact;
            de[d] = fabs((double)j->losses[0][0] - le) / le;
            fprintf(stderr, "\n  %s: loss %.7g, the reference rounding as it does %.7g (%.2g u)",
                    fsdp_dtype_name(dts[d]), (double)j->losses[0][0], le, de[d] / us[d]);
            ref_free(&pr);
        }
        fprintf(stderr,
                "\n  %s: loss %.7g vs f32 %.7g (%.2f u); gradients within %.3g of each "
                "tensor's largest (%.1f u)",
                fsdp_dtype_name(dts[d]), (double)j->losses[0][0], (double)loss32, dl[d] / us[d],
                dg[d], dg[d] / us[d]);
        CU_ASSERT(dl[d] <= 30.0 * us[d]);
        CU_ASSERT(de[d] <= 1e-3 * us[d]); /* the rounding points are torch's */
        CU_ASSERT(dg[d] <= 150.0 * us[d]);
        CU_ASSERT(dg[d] > 0.0); /* it really rounds */
        {
            /* checkpointed blocks recompute the same low-precision activations */
            float *g0 = malloc(total * sizeof(float));
            memcpy(g0, j->grads, total * sizeof(float));
            j->checkpoint = 1;
            CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
            j->checkpoint = 0;
            CU_ASSERT(memcmp(g0, j->grads, total * sizeof(float)) == 0);
            free(g0);
        }
        free(gt);
        free(gt_d);
    }
    CU_ASSERT(dg[1] < dg[0]); /* f16 has 3 more bits */
    free(grads32);
    free(j->grads);
    free(j);
    free(init);
    ref_free(&p);
    ref_free(&g);
}

/* FSDP parity in bf16 (reduce_dtype f32): W = 2 ranks under FULL_SHARD against 2 ranks under
 * NO_SHARD, and against one process (NO_SHARD, W = 1), 5 AdamW steps of gpt2-tiny.
 * - FULL_SHARD and NO_SHARD at W = 2 run the same rows per rank through the same kernels and
 *   reduce the same bf16 gradients in f32 in rank order: the same bits, losses and parameters.
 * - One process runs both halves of the batch at once: its weight gradients are summed over all
 *   rows before their one rounding to bf16, where each of 2 ranks rounds its half and the
 *   halves add in f32. The gradients then differ by about u_bf16 relative. The runs use SGD,
 *   whose update is linear in the gradient, so the parameters move apart by about lr * u |g| a
 *   step (AdamW normalizes every element by its own size, and an element whose gradient is
 *   within roundoff of 0 moves by +-lr whichever way the roundoff falls). The zero-initialized
 *   biases are all update, so relative to their norm they inherit the gradients' 1-2 u
 *   difference a step, plus the forward's own once the weights differ: the asserted bounds
 *   are parameters within 10 u of their norm per tensor, mean losses within 20 u relative.
 * The collectives: every all-gather of the step in bf16 (param_dtype), every reduce-scatter in
 * f32 (reduce_dtype), and with reduce_dtype bf16 the reduce-scatter in bf16. */
static void test_mp_parity(void)
{
    fsdp_tokens_t *t = lm_test_parity_tokens();
    job_t *ref = calloc(1, sizeof(*ref)), *ns = calloc(1, sizeof(*ns)),
          *fs = calloc(1, sizeof(*fs));
    fsdp_gpt2_config_t cfg;
    size_t total;
    double dl = 0.0, dp, kb;

    fsdp_gpt2_config_parse("gpt2-tiny", &cfg);
    total = fsdp_gpt2_num_params(&cfg);
    ref->params = malloc(total * sizeof(float));
    ns->params = malloc(total * sizeof(float));
    fs->params = malloc(total * sizeof(float));
    parity_job(ref, t, FSDP_NO_SHARD, 1);
    parity_job(ns, t, FSDP_NO_SHARD, 2);
    parity_job(fs, t, FSDP_FULL_SHARD, 2);
    sgd_of(ref);
    sgd_of(ns);
    sgd_of(fs);
    mp_of(ref, FSDP_DTYPE_BF16, FSDP_DTYPE_F32);
    mp_of(ns, FSDP_DTYPE_BF16, FSDP_DTYPE_F32);
    mp_of(fs, FSDP_DTYPE_BF16, FSDP_DTYPE_F32);
    CU_ASSERT_EQUAL_FATAL(job_run(ref), FSDP_OK);
    CU_ASSERT_EQUAL_FATAL(job_run(ns), FSDP_OK);
    CU_ASSERT_EQUAL_FATAL(job_run(fs), FSDP_OK);
    CU_ASSERT(ref->losses[4][0] < ref->losses[0][0] - 0.1f); /* it trained */
    CU_ASSERT(memcmp(ns->losses, fs->losses, sizeof(fs->losses)) == 0);
    CU_ASSERT(memcmp(ns->params, fs->params, total * sizeof(float)) == 0);
    for (int step = 0; step < 5; step++) {
        double mean = (fs->losses[step][0] + fs->losses[step][1]) / 2.0;
        dl = fmax(dl, fabs(mean - ref->losses[step][0]) / ref->losses[step][0]);
    }
    dp = tensor_diff(&cfg, fs->params, ref->params, &kb);
    fprintf(stderr,
            "\n  bf16 FULL_SHARD W=2 vs one process: losses within %.2g (%.1f u), "
            "parameters within %.2g",
            dl, dl / U_BF16, dp);
    CU_ASSERT(dl <= 20.0 * U_BF16);
    CU_ASSERT(dp <= 10.0 * U_BF16);
    for (int r = 0; r < 2; r++) {
        CU_ASSERT_EQUAL(fs->ag_dtypes[r], 1u << FSDP_DTYPE_BF16);
        CU_ASSERT_EQUAL(fs->rs_dtypes[r], 1u << FSDP_DTYPE_F32);
        CU_ASSERT_EQUAL(fs->gemm_dtypes[r], 1u << FSDP_DTYPE_BF16);
    }
    /* reduce_dtype bf16: the gradients travel in bf16 */
    parity_job(fs, t, FSDP_FULL_SHARD, 2);
    fs->steps = 1;
    mp_of(fs, FSDP_DTYPE_BF16, FSDP_DTYPE_BF16);
    CU_ASSERT_EQUAL_FATAL(job_run(fs), FSDP_OK);
    for (int r = 0; r < 2; r++) {
        CU_ASSERT_EQUAL(fs->ag_dtypes[r], 1u << FSDP_DTYPE_BF16);
        CU_ASSERT_EQUAL(fs->rs_dtypes[r], 1u << FSDP_DTYPE_BF16);
    }
    free(ref->params);
    free(ns->params);
    free(fs->params);
    free(ref);
    free(ns);
    free(fs);
    fsdp_tokens_close(t);
}

/* Shape mode (no data) prices the same step: GPT-2 124M, 2 ranks of 2 x 256 tokens. In bf16
 * every saved activation is 2 bytes instead of 4; only the f32 layernorm statistics and the
 * token ids (8 bytes a token a layernorm, 8 a token) keep their size, under 0.1% of the total
 * here, so the activation peak is half of f32's within 1% (the caching allocator rounds blocks
 * to its size classes, and which blocks share a segment differs with the sizes). */
static void test_mp_shape_activations(void)
{
    job_t *j = calloc(1, sizeof(*j));
    size_t f32_peak;
    double ratio;

    fsdp_gpt2_config_parse("gpt2", &j->cfg);
    j->strategy = FSDP_FULL_SHARD;
    j->world = 2;
    j->shape = 1;
    j->batch = 4;
    j->seq = 256;
    CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
    f32_peak = j->act_peak[0];
    mp_of(j, FSDP_DTYPE_BF16, FSDP_DTYPE_F32);
    CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
    ratio = (double)j->act_peak[0] / (double)f32_peak;
    fprintf(stderr, "\n  activation peak: f32 %zu bytes, bf16 %zu bytes (ratio %.4f)", f32_peak,
            j->act_peak[0], ratio);
    CU_ASSERT(f32_peak > (size_t)2 * 256 * 768 * 4 * 12); /* at least a width a layer */
    CU_ASSERT(ratio >= 0.49 && ratio <= 0.51);
    CU_ASSERT_EQUAL(j->act_peak[1], j->act_peak[0]);
    CU_ASSERT_EQUAL(j->gemm_dtypes[0], 1u << FSDP_DTYPE_BF16);
    free(j);
}

/* Shape mode: the fused attention keeps a [B, H, T] f32 log-sum-exp a block where the eager one
 * keeps the [B, H, T, T] probabilities, and nothing else changes in the activations. The shapes
 * make every large activation a whole number of 2 MiB (2 x 256 rows of width 1024: 2 MiB a
 * width; the probabilities 8 MiB) and the vocabulary 4096 (the logits 8 MiB), so that the
 * caching allocator's blocks are the requests and the peaks differ by exactly that. */
static void test_fused_attention_memory(void)
{
    job_t *j = calloc(1, sizeof(*j));
    const size_t L = 4, H = 16, T = 256;
    size_t eager_peak, rows, per_block;

    CU_ASSERT_EQUAL_FATAL(
        fsdp_gpt2_config_parse("gpt2:layers=4,heads=16,dim=1024,seq=256,vocab=4096", &j->cfg),
        FSDP_OK);
    j->strategy = FSDP_FULL_SHARD;
    j->world = 2;
    j->shape = 1;
    j->batch = 4;
    j->seq = (int)T;
    CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
    eager_peak = j->act_peak[0];
    j->cfg.fused_attention = 1;
    CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
    rows = j->batch / (size_t)j->world;
    per_block = rows * H * T * T * 4 - rows * H * T * 4;
    fprintf(stderr, "\n  activation peak: eager %zu bytes, fused %zu bytes", eager_peak,
            j->act_peak[0]);
    CU_ASSERT_EQUAL(eager_peak - j->act_peak[0], L * per_block);
    CU_ASSERT_EQUAL(j->act_peak[1], j->act_peak[0]);
    free(j);
}

/* fsdp_lm_init_params of GPT-2 on 3 and 5 ranks (shards that end inside a parameter, inside a pair
 * of the polar method's values) gives every rank's part the values of one process, bit for bit:
 * each rank computes only its part of the stream it draws whole. */
static void test_init_sharded(void)
{
    fsdp_tokens_t *t = lm_test_parity_tokens();
    job_t *ref = calloc(1, sizeof(*ref)), *j = calloc(1, sizeof(*j));
    fsdp_gpt2_config_t cfg;
    size_t total;

    CU_ASSERT_FATAL(ref != NULL && j != NULL);
    fsdp_gpt2_config_parse("gpt2-tiny", &cfg);
    total = fsdp_gpt2_num_params(&cfg);
    ref->params = malloc(total * sizeof(float));
    j->params = malloc(total * sizeof(float));
    CU_ASSERT_FATAL(ref->params != NULL && j->params != NULL);
    parity_job(ref, t, FSDP_NO_SHARD, 1);
    ref->steps = 0; /* one forward-backward, no step: the parameters as initialized */
    ref->batch = 15;
    CU_ASSERT_EQUAL_FATAL(job_run(ref), FSDP_OK);
    for (int world = 3; world <= 5; world += 2) {
        parity_job(j, t, FSDP_FULL_SHARD, world);
        j->steps = 0;
        j->batch = 15;
        CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
        CU_ASSERT(memcmp(j->params, ref->params, total * sizeof(float)) == 0);
    }
    free(ref->params);
    free(j->params);
    free(ref);
    free(j);
    fsdp_tokens_close(t);
}

/* The LM head's packed wte (the sim's pack cache) over accumulated micro-batches: training is
 * the same bits with it and without it, on every strategy, under mixed precision and with CPU
 * offload. Where wte's unsharded value is kept between micro-batches (NO_SHARD: the shard
 * itself, or a cast or a copy of it; SHARD_GRAD_OP under no_sync), from the second step on (the
 * first foretells four micro-batches) the second micro-batch of a step packs it and the later
 * ones read it; where each micro-batch gathers it anew (FULL_SHARD), it is never packed. */
static void test_pack_cache_accumulation(void)
{
    static const struct {
        fsdp_strategy_t strategy;
        int world, mp, offload;
    } runs[] = {{FSDP_NO_SHARD, 1, 0, 0},   {FSDP_NO_SHARD, 2, 0, 0},
                {FSDP_NO_SHARD, 2, 1, 0},   {FSDP_NO_SHARD, 2, 0, 1},
                {FSDP_FULL_SHARD, 2, 0, 0}, {FSDP_SHARD_GRAD_OP, 2, 0, 0}};
    const int steps = 3, accum = 4;
    fsdp_tokens_t *t = lm_test_parity_tokens();
    job_t *on = calloc(1, sizeof(*on)), *off = calloc(1, sizeof(*off));
    fsdp_gpt2_config_t cfg;
    size_t total;

    fsdp_gpt2_config_parse("gpt2-tiny", &cfg);
    total = fsdp_gpt2_num_params(&cfg);
    CU_ASSERT_FATAL(on != NULL && off != NULL);
    on->params = malloc(total * sizeof(float));
    off->params = malloc(total * sizeof(float));
    CU_ASSERT_FATAL(on->params != NULL && off->params != NULL);
    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
        job_t *j[2] = {on, off};
        for (int c = 0; c < 2; c++) {
            parity_job(j[c], t, runs[i].strategy, runs[i].world);
            j[c]->batch = 8 * (size_t)runs[i].world; /* micro-batches of 2 x 32 tokens */
            j[c]->steps = steps;
            j[c]->accum = accum;
            j[c]->no_pack_cache = c;
            if (runs[i].mp)
                mp_of(j[c], FSDP_DTYPE_BF16, FSDP_DTYPE_F32);
            j[c]->offload = runs[i].offload;
            CU_ASSERT_EQUAL_FATAL(job_run(j[c]), FSDP_OK);
        }
        fprintf(stderr, "\n  %s W=%d%s%s: wte packed %llu times, read packed %llu times",
                fsdp_strategy_name(runs[i].strategy), runs[i].world, runs[i].mp ? " bf16" : "",
                runs[i].offload ? " offload" : "", (unsigned long long)on->pack_packs[0],
                (unsigned long long)on->pack_hits[0]);
        CU_ASSERT(memcmp(on->losses, off->losses, sizeof(on->losses)) == 0);
        CU_ASSERT(memcmp(on->params, off->params, total * sizeof(float)) == 0);
        CU_ASSERT(on->losses[steps - 1][0] < on->losses[0][0]); /* it trained */
        for (int r = 0; r < runs[i].world; r++) {
            int kept = runs[i].strategy != FSDP_FULL_SHARD;
            CU_ASSERT_EQUAL(off->pack_packs[r], 0);
            CU_ASSERT_EQUAL(on->pack_packs[r], kept ? (uint64_t)(steps - 1) : 0);
            CU_ASSERT_EQUAL(on->pack_hits[r], kept ? (uint64_t)((steps - 1) * (accum - 2)) : 0);
        }
    }
    free(on->params);
    free(off->params);
    free(on);
    free(off);
    fsdp_tokens_close(t);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"presets have the published sizes; specs parse or are refused", test_presets_and_specs},
        {"the double reference's backward against finite differences", test_reference_self_check},
        {"loss and gradients against the double reference, checkpointing the same",
         test_against_reference},
        {"FSDP strategies and W = 1, 2, 4 equal single-process training", test_fsdp_parity},
        {"init on 3 and 5 ranks: each rank's part holds one process's values, bit for bit",
         test_init_sharded},
        {"the LM head's packed wte over accumulated micro-batches: the same bits, packed once a "
         "step where wte is kept",
         test_pack_cache_accumulation},
        {"bf16 and f16 loss and gradients against f32 within their roundoff, checkpointing the "
         "same",
         test_mp_against_f32},
        {"bf16: FULL_SHARD equals NO_SHARD; one process within roundoff; collective dtypes",
         test_mp_parity},
        {"shape mode: bf16 activations take half the bytes of f32", test_mp_shape_activations},
        {"shape mode: the fused attention keeps O(T) a block, not the probabilities",
         test_fused_attention_memory},
        {"HF names round trip across world sizes, with and without the prefix", test_hf_round_trip},
        {"the hub's layout, buffers and BF16 computed as the reference", test_hf_hub_layout},
        {"malformed checkpoints refused, naming the tensor", test_hf_errors},
        {"200 steps on the default corpus lower the loss by the margin",
         test_learns_default_corpus},
        {NULL, NULL},
    };
    int rc;
    if (mkdtemp(tmpdir) == NULL)
        return 99;
    rc = fsdp_test_run("gpt2", tests);
    {
        char cmd[64];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
        if (system(cmd) != 0)
            rc = rc ? rc : 99;
    }
    return rc;
}
