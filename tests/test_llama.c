/* Llama (lib/nn/llama*.c) against references:
 * - a double-precision LlamaForCausalLM written here, independent of the library (its backward
 *   checked against finite differences of its forward): the model's loss and every gradient, for
 *   grouped-query and multi-head attention, with and without llama3 rope scaling, tied and
 *   untied; full and selective op activation checkpointing give the same bits;
 * - FSDP: FULL_SHARD, SHARD_GRAD_OP and NO_SHARD on 1, 2 and 4 simulated ranks train as one
 *   process does; bf16 within its roundoff of f32;
 * - shape mode: the activations grow linearly in the sequence (fused attention keeps no T x T);
 * - the presets' parameter counts are the published ones; specs parse or are refused.
 */
#include <fsdp/fsdp.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lm_test.h"
#include "nn/nn_hidden.h"
#include "sim_hidden.h"
#include "test_util.h"

#define NL FSDP_LLAMA_LAYER_NPARAMS

static uint64_t rng_state = 9;

static double urand(double lo, double hi)
{
    return lm_test_urand(&rng_state, lo, hi);
}

/* ---------------- a double-precision Llama, independent of the library ---------------- */

typedef struct ref_cfg {
    int L, H, K, D, F, hd, V, tie;
    double theta, eps;
    int scaling; /* llama3 with factor, low 1, high 4, original context orig */
    double factor;
    int orig;
} ref_cfg_t;

typedef struct ref_model {
    ref_cfg_t c;
    double *root[3]; /* embed [V, D], norm [D], head [V, D] (NULL when tied) */
    double **layer;  /* [L * NL], HF's [out, in] */
} ref_model_t;

static size_t ref_numel(const ref_cfg_t *c, int l, int i)
{
    size_t D = (size_t)c->D, q = (size_t)c->H * c->hd, kv = (size_t)c->K * c->hd, F = (size_t)c->F;
    if (l < 0)
        return i == FSDP_LLAMA_NORM ? D : (size_t)c->V * D;
    switch (i) {
    case FSDP_LLAMA_Q:
    case FSDP_LLAMA_O:
        return q * D;
    case FSDP_LLAMA_K:
    case FSDP_LLAMA_V:
        return kv * D;
    case FSDP_LLAMA_GATE:
    case FSDP_LLAMA_UP:
    case FSDP_LLAMA_DOWN:
        return F * D;
    default:
        return D;
    }
}

static int root_count(const ref_cfg_t *c)
{
    return c->tie ? 2 : 3;
}

static double *ref_param(const ref_model_t *m, int l, int i)
{
    return l < 0 ? m->root[i] : m->layer[l * NL + i];
}

static void ref_alloc(ref_model_t *m, const ref_cfg_t *c)
{
    memset(m, 0, sizeof(*m));
    m->c = *c;
    for (int i = 0; i < root_count(c); i++)
        m->root[i] = calloc(ref_numel(c, -1, i), sizeof(double));
    m->layer = calloc((size_t)c->L * NL, sizeof(double *));
    for (int l = 0; l < c->L; l++)
        for (int i = 0; i < NL; i++)
            m->layer[l * NL + i] = calloc(ref_numel(c, l, i), sizeof(double));
}

static void ref_free(ref_model_t *m)
{
    for (int i = 0; i < 3; i++)
        free(m->root[i]);
    for (int l = 0; l < m->c.L * NL; l++)
        free(m->layer[l]);
    free(m->layer);
}

/* y[n, out] = x[n, in] W^T, W [out, in] */
static void mm(const double *x, const double *W, double *y, int n, int in, int out)
{
    for (int r = 0; r < n; r++)
        for (int o = 0; o < out; o++) {
            double s = 0.0;
            for (int i = 0; i < in; i++)
                s += x[(size_t)r * in + i] * W[(size_t)o * in + i];
            y[(size_t)r * out + o] = s;
        }
}

/* dx += dy W (dx NULL: skipped), dW += dy^T x */
static void mm_bwd(const double *x, const double *W, const double *dy, double *dx, double *dW,
                   int n, int in, int out)
{
    for (int r = 0; r < n; r++)
        for (int o = 0; o < out; o++) {
            double d = dy[(size_t)r * out + o];
            for (int i = 0; i < in; i++) {
                if (dx != NULL)
                    dx[(size_t)r * in + i] += d * W[(size_t)o * in + i];
                dW[(size_t)o * in + i] += d * x[(size_t)r * in + i];
            }
        }
}

static void rms(const double *x, const double *w, double *y, double *rs, int n, int D, double eps)
{
    for (int r = 0; r < n; r++) {
        double ss = 0.0;
        for (int c = 0; c < D; c++)
            ss += x[(size_t)r * D + c] * x[(size_t)r * D + c];
        rs[r] = 1.0 / sqrt(ss / D + eps);
        for (int c = 0; c < D; c++)
            y[(size_t)r * D + c] = x[(size_t)r * D + c] * rs[r] * w[c];
    }
}

/* dx += the input gradient, dw += */
static void rms_bwd(const double *dy, const double *x, const double *w, const double *rs,
                    double *dx, double *dw, int n, int D)
{
    for (int r = 0; r < n; r++) {
        double dot = 0.0;
        for (int c = 0; c < D; c++) {
            double xh = x[(size_t)r * D + c] * rs[r];
            dot += dy[(size_t)r * D + c] * w[c] * xh;
            dw[c] += dy[(size_t)r * D + c] * xh;
        }
        for (int c = 0; c < D; c++)
            dx[(size_t)r * D + c] +=
                rs[r] * (dy[(size_t)r * D + c] * w[c] - x[(size_t)r * D + c] * rs[r] * dot / D);
    }
}

/* HF's inverse frequencies in double, with llama3 scaling */
static double inv_freq(const ref_cfg_t *c, int i)
{
    double f = pow(c->theta, -2.0 * i / c->hd), wl = 2.0 * M_PI / f;
    if (!c->scaling || wl < c->orig / 4.0)
        return f;
    if (wl > c->orig / 1.0)
        return f / c->factor;
    double s = (c->orig / wl - 1.0) / (4.0 - 1.0);
    return (1.0 - s) * f / c->factor + s * f;
}

/* x [n, heads * hd] rotated at positions r % T (sign -1: the inverse, the backward) */
static void rot(const ref_cfg_t *c, double *x, int n, int heads, int T, double sign)
{
    int h2 = c->hd / 2;
    for (int r = 0; r < n; r++)
        for (int h = 0; h < heads; h++)
            for (int i = 0; i < h2; i++) {
                double a = (r % T) * inv_freq(c, i), cs = cos(a), sn = sign * sin(a);
                double *p = x + (size_t)r * heads * c->hd + h * c->hd;
                double x1 = p[i], x2 = p[i + h2];
                p[i] = x1 * cs - x2 * sn;
                p[i + h2] = x2 * cs + x1 * sn;
            }
}

static double silu(double g)
{
    return g / (1.0 + exp(-g));
}

typedef struct ref_layer_act {
    double *x, *n1, *rs1, *q, *k, *v, *p, *o, *h, *n2, *rs2, *gt, *up, *act;
} ref_act_t;

/* Mean cross-entropy of the next tokens; with g, every gradient (g zeroed first). */
static double ref_run(const ref_model_t *m, ref_model_t *g, const int32_t *in, const int32_t *tg,
                      int B, int T)
{
    const ref_cfg_t *c = &m->c;
    const int n = B * T, D = c->D, F = c->F, q = c->H * c->hd, kv = c->K * c->hd, V = c->V;
    const int grp = c->H / c->K;
    const double scale = 1.0 / sqrt((double)c->hd);
    ref_act_t *a = calloc((size_t)c->L, sizeof(*a));
    double *x = calloc((size_t)n * D, sizeof(double)), *nf = calloc((size_t)n * D, sizeof(double));
    double *rsf = calloc((size_t)n, sizeof(double)), *lg = calloc((size_t)n * V, sizeof(double));
    const double *head = c->tie ? m->root[FSDP_LLAMA_EMBED] : m->root[FSDP_LLAMA_LM_HEAD];
    double loss = 0.0;
    int count = 0;

    for (int r = 0; r < n; r++)
        memcpy(x + (size_t)r * D, m->root[0] + (size_t)in[r] * D, (size_t)D * sizeof(double));
    for (int l = 0; l < c->L; l++) {
        ref_act_t *A = &a[l];
#define W(i) ref_param(m, l, i)
#define NEW(cnt) calloc((size_t)(cnt), sizeof(double))
        A->x = x;
        A->n1 = NEW(n * D), A->rs1 = NEW(n), A->q = NEW(n * q), A->k = NEW(n * kv);
        A->v = NEW(n * kv), A->p = NEW((size_t)B * c->H * T * T), A->o = NEW(n * q);
        A->h = NEW(n * D), A->n2 = NEW(n * D), A->rs2 = NEW(n), A->gt = NEW(n * F);
        A->up = NEW(n * F), A->act = NEW(n * F);
        rms(x, W(FSDP_LLAMA_LN1), A->n1, A->rs1, n, D, c->eps);
        mm(A->n1, W(FSDP_LLAMA_Q), A->q, n, D, q);
        mm(A->n1, W(FSDP_LLAMA_K), A->k, n, D, kv);
        mm(A->n1, W(FSDP_LLAMA_V), A->v, n, D, kv);
        rot(c, A->q, n, c->H, T, 1.0);
        rot(c, A->k, n, c->K, T, 1.0);
        for (int b = 0; b < B; b++)
            for (int h = 0; h < c->H; h++)
                for (int t = 0; t < T; t++) {
                    double *p = A->p + (((size_t)b * c->H + h) * T + t) * T, mx = -INFINITY, s = 0;
                    for (int j = 0; j <= t; j++) {
                        double d = 0.0;
                        for (int e = 0; e < c->hd; e++)
                            d += A->q[(size_t)(b * T + t) * q + h * c->hd + e] *
                                 A->k[(size_t)(b * T + j) * kv + (h / grp) * c->hd + e];
                        p[j] = d * scale;
                        mx = fmax(mx, p[j]);
                    }
                    for (int j = 0; j <= t; j++)
                        s += (p[j] = exp(p[j] - mx));
                    for (int j = 0; j <= t; j++) {
                        p[j] /= s;
                        for (int e = 0; e < c->hd; e++)
                            A->o[(size_t)(b * T + t) * q + h * c->hd + e] +=
                                p[j] * A->v[(size_t)(b * T + j) * kv + (h / grp) * c->hd + e];
                    }
                }
        mm(A->o, W(FSDP_LLAMA_O), A->h, n, q, D);
        for (int e = 0; e < n * D; e++)
            A->h[e] += x[e];
        rms(A->h, W(FSDP_LLAMA_LN2), A->n2, A->rs2, n, D, c->eps);
        mm(A->n2, W(FSDP_LLAMA_GATE), A->gt, n, D, F);
        mm(A->n2, W(FSDP_LLAMA_UP), A->up, n, D, F);
        for (int e = 0; e < n * F; e++)
            A->act[e] = silu(A->gt[e]) * A->up[e];
        x = NEW(n * D);
        mm(A->act, W(FSDP_LLAMA_DOWN), x, n, F, D);
        for (int e = 0; e < n * D; e++)
            x[e] += A->h[e];
    }
    rms(x, m->root[FSDP_LLAMA_NORM], nf, rsf, n, D, c->eps);
    mm(nf, head, lg, n, D, V);
    for (int r = 0; r < n; r++)
        count += tg[r] >= 0;
    for (int r = 0; r < n; r++) {
        double *row = lg + (size_t)r * V, mx = -INFINITY, s = 0.0;
        for (int v = 0; v < V; v++)
            mx = fmax(mx, row[v]);
        for (int v = 0; v < V; v++)
            s += exp(row[v] - mx);
        if (tg[r] >= 0)
            loss += (mx + log(s) - row[tg[r]]) / count;
        for (int v = 0; v < V; v++) /* the logits' gradient, in place */
            row[v] = tg[r] < 0 ? 0.0 : (exp(row[v] - mx) / s - (v == tg[r])) / count;
    }
    if (g != NULL) {
        double *dx = NEW(n * D), *dnf = NEW(n * D);
        for (int i = 0; i < root_count(c); i++)
            memset(g->root[i], 0, ref_numel(c, -1, i) * sizeof(double));
        mm_bwd(nf, head, lg, dnf, c->tie ? g->root[FSDP_LLAMA_EMBED] : g->root[FSDP_LLAMA_LM_HEAD],
               n, D, V);
        rms_bwd(dnf, x, m->root[FSDP_LLAMA_NORM], rsf, dx, g->root[FSDP_LLAMA_NORM], n, D);
        for (int l = c->L - 1; l >= 0; l--) {
            ref_act_t *A = &a[l];
            double *dact = NEW(n * F), *dgt = NEW(n * F), *dup = NEW(n * F), *dn = NEW(n * D);
            double *dO = NEW(n * q), *dq = NEW(n * q), *dk = NEW(n * kv), *dv = NEW(n * kv);
#define G(i) ref_param(g, l, i)
            for (int i = 0; i < NL; i++)
                memset(G(i), 0, ref_numel(c, l, i) * sizeof(double));
            mm_bwd(A->act, W(FSDP_LLAMA_DOWN), dx, dact, G(FSDP_LLAMA_DOWN), n, F, D);
            for (int e = 0; e < n * F; e++) {
                double s = 1.0 / (1.0 + exp(-A->gt[e]));
                dup[e] = dact[e] * silu(A->gt[e]);
                dgt[e] = dact[e] * A->up[e] * s * (1.0 + A->gt[e] * (1.0 - s));
            }
            mm_bwd(A->n2, W(FSDP_LLAMA_GATE), dgt, dn, G(FSDP_LLAMA_GATE), n, D, F);
            mm_bwd(A->n2, W(FSDP_LLAMA_UP), dup, dn, G(FSDP_LLAMA_UP), n, D, F);
            rms_bwd(dn, A->h, W(FSDP_LLAMA_LN2), A->rs2, dx, G(FSDP_LLAMA_LN2), n, D);
            mm_bwd(A->o, W(FSDP_LLAMA_O), dx, dO, G(FSDP_LLAMA_O), n, q, D);
            for (int b = 0; b < B; b++)
                for (int h = 0; h < c->H; h++)
                    for (int t = 0; t < T; t++) {
                        const double *p = A->p + (((size_t)b * c->H + h) * T + t) * T;
                        double dp[64], dot = 0.0;
                        int kvo = (h / grp) * c->hd;
                        for (int j = 0; j <= t; j++) {
                            dp[j] = 0.0;
                            for (int e = 0; e < c->hd; e++)
                                dp[j] += dO[(size_t)(b * T + t) * q + h * c->hd + e] *
                                         A->v[(size_t)(b * T + j) * kv + kvo + e];
                            dot += p[j] * dp[j];
                        }
                        for (int j = 0; j <= t; j++) {
                            double ds = p[j] * (dp[j] - dot) * scale;
                            for (int e = 0; e < c->hd; e++) {
                                size_t qi = (size_t)(b * T + t) * q + h * c->hd + e;
                                size_t ki = (size_t)(b * T + j) * kv + kvo + e;
                                dq[qi] += ds * A->k[ki];
                                dk[ki] += ds * A->q[qi];
                                dv[ki] += p[j] * dO[qi];
                            }
                        }
                    }
            rot(c, dq, n, c->H, T, -1.0);
            rot(c, dk, n, c->K, T, -1.0);
            memset(dn, 0, (size_t)n * D * sizeof(double));
            mm_bwd(A->n1, W(FSDP_LLAMA_Q), dq, dn, G(FSDP_LLAMA_Q), n, D, q);
            mm_bwd(A->n1, W(FSDP_LLAMA_K), dk, dn, G(FSDP_LLAMA_K), n, D, kv);
            mm_bwd(A->n1, W(FSDP_LLAMA_V), dv, dn, G(FSDP_LLAMA_V), n, D, kv);
            rms_bwd(dn, A->x, W(FSDP_LLAMA_LN1), A->rs1, dx, G(FSDP_LLAMA_LN1), n, D);
            free(dact), free(dgt), free(dup), free(dn), free(dO), free(dq), free(dk), free(dv);
#undef G
        }
        for (int r = 0; r < n; r++)
            for (int e = 0; e < D; e++)
                g->root[FSDP_LLAMA_EMBED][(size_t)in[r] * D + e] += dx[(size_t)r * D + e];
        free(dx);
        free(dnf);
    }
#undef W
#undef NEW
    for (int l = 0; l < c->L; l++) {
        ref_act_t *A = &a[l];
        free(A->x), free(A->n1), free(A->rs1), free(A->q), free(A->k), free(A->v), free(A->p);
        free(A->o), free(A->h), free(A->n2), free(A->rs2), free(A->gt), free(A->up), free(A->act);
    }
    free(a);
    free(x);
    free(nf);
    free(rsf);
    free(lg);
    return loss;
}

/* ---------------- the library's model on simulated ranks ---------------- */

#define MAX_STEPS 8
#define MAX_W 8

typedef struct job {
    fsdp_llama_config_t cfg;
    fsdp_strategy_t strategy;
    int world;
    int checkpoint;
    int eager; /* fsdp_llama_set_eager_memory */
    const float *init; /* canonical order (root, then layers); NULL: init_params(seed) */
    uint64_t seed;
    const int32_t *inputs, *targets; /* one global batch, or */
    fsdp_tokens_t *tokens;
    size_t batch, seq;
    int steps; /* 0: one forward-backward */
    fsdp_optim_config_t optim;
    int use_mp;
    fsdp_mixed_precision_t mp;
    int shape;
    float losses[MAX_STEPS][MAX_W];
    float *params; /* canonical, after training */
    float *grads;  /* canonical, world 1, steps 0 */
    size_t act_peak[MAX_W];
    /* gradient accumulation: micro-batches per step (0 or 1: none), no_sync for all but the
     * last; the sim's packed operand off (no_pack_cache), and its counts on each rank */
    int accum, no_pack_cache;
    uint64_t pack_hits[MAX_W], pack_packs[MAX_W];
} job_t;

static fsdp_status_t job_rank(fsdp_dev_t *dev, void *arg)
{
    job_t *j = arg;
    fsdp_config_t fc;
    fsdp_t *fs = NULL;
    fsdp_lm_t *m = NULL;
    fsdp_optim_t *opt = NULL;
    size_t rows = j->batch / (size_t)dev->world_size;
    int32_t *in = malloc(rows * j->seq * sizeof(int32_t));
    int32_t *tg = malloc(rows * j->seq * sizeof(int32_t));
    fsdp_status_t st;

    fsdp_config_init(&fc);
    fc.strategy = j->strategy;
    if (j->use_mp)
        fc.mixed_precision = j->mp;
    st = fsdp_create(dev, &fc, &fs);
    if (st == FSDP_OK)
        st = fsdp_llama_create(fs, &j->cfg, &m);
    if (st == FSDP_OK && j->checkpoint)
        st = fsdp_lm_set_checkpointing(m, -1, j->checkpoint);
    if (st == FSDP_OK && j->eager)
        st = fsdp_llama_set_eager_memory(m, 1);
    if (st == FSDP_OK && j->init != NULL) {
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
    if (st == FSDP_OK && j->params != NULL)
        st = lm_test_gather_params(m, dev->rank, j->params);
    if (fs != NULL)
        j->act_peak[dev->rank] = lm_test_act_peak(fs);
    free(in);
    free(tg);
    fsdp_optim_destroy(opt);
    fsdp_lm_destroy(m);
    fsdp_destroy(fs);
    fsdp_sim_pack_cache_stats(dev, &j->pack_hits[dev->rank], &j->pack_packs[dev->rank]);
    return st;
}

static fsdp_status_t job_run(job_t *j)
{
    return j->no_pack_cache ? lm_test_launch_packing(j->world, 1, job_rank, j)
                            : lm_test_launch(j->world, j->shape, job_rank, j);
}

static void cfg_of(fsdp_llama_config_t *cfg, const ref_cfg_t *c)
{
    fsdp_llama_config_parse("llama-tiny", cfg);
    cfg->n_layer = c->L;
    cfg->n_head = c->H;
    cfg->n_kv_head = c->K;
    cfg->dim = c->D;
    cfg->ffn_dim = c->F;
    cfg->head_dim = c->hd;
    cfg->max_seq = 16;
    cfg->vocab_size = c->V;
    cfg->tie_word_embeddings = c->tie;
    cfg->rope_theta = c->theta;
    cfg->rms_norm_eps = (float)c->eps;
    cfg->rope_scaling = c->scaling;
    cfg->rope_factor = c->factor;
    cfg->rope_low_freq_factor = 1.0;
    cfg->rope_high_freq_factor = 4.0;
    cfg->rope_original_max_seq = c->orig;
}

/* random parameters (norm weights around 1), in the reference and in canonical order */
static float *random_params(const ref_cfg_t *c, ref_model_t *ref, size_t *total_p)
{
    size_t total = 0, off = 0;
    float *v;
    for (int k = -1; k < c->L; k++)
        for (int i = 0; i < (k < 0 ? root_count(c) : NL); i++)
            total += ref_numel(c, k, i);
    v = malloc(total * sizeof(float));
    for (int k = -1; k < c->L; k++)
        for (int i = 0; i < (k < 0 ? root_count(c) : NL); i++) {
            int norm = k < 0 ? i == FSDP_LLAMA_NORM : i >= FSDP_LLAMA_LN1;
            for (size_t e = 0; e < ref_numel(c, k, i); e++, off++) {
                v[off] = (float)(norm ? urand(0.5, 1.5) : urand(-0.5, 0.5));
                ref_param(ref, k, i)[e] = v[off];
            }
        }
    *total_p = total;
    return v;
}

/* max over tensors of max |a - b| / max |b| (canonical order) */
static double max_rel_diff(const ref_model_t *g, const float *a)
{
    const ref_cfg_t *c = &g->c;
    size_t off = 0;
    double worst = 0.0;
    for (int k = -1; k < c->L; k++)
        for (int i = 0; i < (k < 0 ? root_count(c) : NL); i++) {
            const double *b = ref_param(g, k, i);
            size_t n = ref_numel(c, k, i);
            double scale = 1e-12, d = 0.0;
            for (size_t e = 0; e < n; e++) {
                scale = fmax(scale, fabs(b[e]));
                d = fmax(d, fabs((double)a[off + e] - b[e]));
            }
            worst = fmax(worst, d / scale);
            off += n;
        }
    return worst;
}

#define SB 2
#define ST 7

static void small_batch(const ref_cfg_t *c, int32_t *in, int32_t *tg)
{
    for (int i = 0; i < SB * ST; i++) {
        in[i] = (int32_t)urand(0, c->V - 0.01);
        tg[i] = (int32_t)urand(0, c->V - 0.01);
    }
    tg[4] = -1; /* ignored */
}

/* GQA untied unscaled; MHA tied with llama3 scaling (a short original context, so that every
 * band of the scaling is used); MQA untied scaled with head_dim != dim / heads */
static const ref_cfg_t cases[] = {
    {2, 4, 2, 16, 24, 4, 13, 0, 10000.0, 1e-5, 0, 0.0, 0},
    {2, 2, 2, 12, 20, 6, 11, 1, 10000.0, 1e-6, 1, 4.0, 16},
    {1, 4, 1, 12, 16, 8, 9, 0, 500000.0, 1e-5, 1, 8.0, 12},
};

static void test_reference_self_check(void)
{
    const ref_cfg_t *c = &cases[1];
    ref_model_t p, g;
    int32_t in[SB * ST], tg[SB * ST];
    size_t total;
    int bad = 0;

    ref_alloc(&p, c);
    ref_alloc(&g, c);
    free(random_params(c, &p, &total));
    small_batch(c, in, tg);
    ref_run(&p, &g, in, tg, SB, ST);
    for (int trial = 0; trial < 60; trial++) {
        int k = (int)urand(-1, c->L - 0.01);
        int i = (int)urand(0, (k < 0 ? root_count(c) : NL) - 0.01);
        size_t e = (size_t)urand(0, (double)ref_numel(c, k, i) - 0.01);
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

static void test_against_reference(void)
{
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const ref_cfg_t *c = &cases[ci];
        ref_model_t p, g;
        int32_t in[SB * ST], tg[SB * ST];
        job_t *j = calloc(1, sizeof(*j));
        size_t total;
        float *init, *first;
        double loss, d;

        ref_alloc(&p, c);
        ref_alloc(&g, c);
        init = random_params(c, &p, &total);
        small_batch(c, in, tg);
        loss = ref_run(&p, &g, in, tg, SB, ST);
        cfg_of(&j->cfg, c);
        CU_ASSERT_EQUAL(fsdp_llama_num_params(&j->cfg), total);
        j->strategy = FSDP_FULL_SHARD;
        j->world = 1;
        j->init = init;
        j->inputs = in;
        j->targets = tg;
        j->batch = SB;
        j->seq = ST;
        j->grads = malloc(total * sizeof(float));
        CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
        d = max_rel_diff(&g, j->grads);
        fprintf(stderr,
                "\n  H=%d K=%d tie=%d scaling=%d: loss %.9g, reference %.9g; gradients "
                "within %.3g",
                c->H, c->K, c->tie, c->scaling, (double)j->losses[0][0], loss, d);
        CU_ASSERT(fabs(j->losses[0][0] - loss) <= 1e-5 * loss);
        CU_ASSERT(d <= 1e-4);
        /* full and selective op checkpointing recompute the same activations: the same bits */
        first = malloc(total * sizeof(float));
        memcpy(first, j->grads, total * sizeof(float));
        for (int policy = FSDP_LM_CKPT_FULL; policy <= FSDP_LM_CKPT_SELECTIVE_OP; policy++) {
            float loss0 = j->losses[0][0];
            j->checkpoint = policy;
            CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
            CU_ASSERT(memcmp(first, j->grads, total * sizeof(float)) == 0);
            CU_ASSERT(j->losses[0][0] == loss0);
        }
        free(first);
        free(j->grads);
        free(j);
        free(init);
        ref_free(&p);
        ref_free(&g);
    }
}

/* ---------------- FSDP parity ---------------- */

static void parity_job(job_t *j, fsdp_tokens_t *t, fsdp_strategy_t s, int world)
{
    float *params = j->params;
    memset(j, 0, sizeof(*j));
    j->params = params;
    fsdp_llama_config_parse("llama-tiny", &j->cfg);
    j->strategy = s;
    j->world = world;
    j->seed = 3;
    j->tokens = t;
    j->batch = 4;
    j->seq = 32;
    j->steps = 4;
    fsdp_optim_config_init(&j->optim, FSDP_OPTIM_ADAMW);
    j->optim.lr = 1e-3f;
}

static void test_fsdp_parity(void)
{
    static const fsdp_strategy_t strategies[] = {FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP,
                                                 FSDP_NO_SHARD};
    static const int worlds[] = {1, 2, 4};
    fsdp_tokens_t *t = lm_test_parity_tokens();
    job_t *ref = calloc(1, sizeof(*ref)), *j = calloc(1, sizeof(*j));
    fsdp_llama_config_t cfg;
    size_t total;

    fsdp_llama_config_parse("llama-tiny", &cfg);
    total = fsdp_llama_num_params(&cfg);
    ref->params = malloc(total * sizeof(float));
    j->params = malloc(total * sizeof(float));
    parity_job(ref, t, FSDP_NO_SHARD, 1);
    CU_ASSERT_EQUAL_FATAL(job_run(ref), FSDP_OK);
    CU_ASSERT(ref->losses[3][0] < ref->losses[0][0] - 0.05f); /* it trained */
    for (size_t s = 0; s < 3; s++) {
        for (size_t w = 0; w < 3; w++) {
            double dl = 0.0, dp;
            parity_job(j, t, strategies[s], worlds[w]);
            CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
            for (int step = 0; step < 4; step++) {
                double mean = 0.0;
                for (int r = 0; r < worlds[w]; r++)
                    mean += j->losses[step][r] / worlds[w];
                dl = fmax(dl, fabs(mean - ref->losses[step][0]) / ref->losses[step][0]);
            }
            dp = lm_test_rel_diff(j->params, ref->params, total);
            fprintf(stderr, "\n  %s W=%d: losses within %.2g, parameters within %.2g",
                    fsdp_strategy_name(strategies[s]), worlds[w], dl, dp);
            CU_ASSERT(dl <= 1e-5);
            CU_ASSERT(dp <= 1e-5);
        }
    }
    free(ref->params);
    free(j->params);
    free(ref);
    free(j);
    fsdp_tokens_close(t);
}

/* fsdp_lm_init_params of Llama on 3 and 5 ranks gives every rank's part the values of one process,
 * bit for bit: each rank skips the generator to its part and past the rest. */
static void test_init_sharded(void)
{
    fsdp_tokens_t *t = lm_test_parity_tokens();
    job_t *ref = calloc(1, sizeof(*ref)), *j = calloc(1, sizeof(*j));
    size_t total;

    CU_ASSERT_FATAL(ref != NULL && j != NULL);
    parity_job(ref, t, FSDP_NO_SHARD, 1);
    total = fsdp_llama_num_params(&ref->cfg);
    ref->params = malloc(total * sizeof(float));
    j->params = malloc(total * sizeof(float));
    CU_ASSERT_FATAL(ref->params != NULL && j->params != NULL);
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

/* The LM head's packed weight (the sim's pack cache) over accumulated micro-batches: the same
 * bits with it and without it; the untied lm_head (and the tied embedding) kept between
 * micro-batches is packed by the second of each step after the first and read by the later
 * ones. */
static void test_pack_cache_accumulation(void)
{
    static const struct {
        fsdp_strategy_t strategy;
        int world, tied, mp;
    } runs[] = {{FSDP_NO_SHARD, 1, 0, 0}, {FSDP_SHARD_GRAD_OP, 2, 1, 1}};
    const int steps = 3, accum = 4;
    fsdp_tokens_t *t = lm_test_parity_tokens();
    job_t *on = calloc(1, sizeof(*on)), *off = calloc(1, sizeof(*off));
    size_t total;

    CU_ASSERT_FATAL(on != NULL && off != NULL);
    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
        job_t *j[2] = {on, off};
        for (int c = 0; c < 2; c++) {
            parity_job(j[c], t, runs[i].strategy, runs[i].world);
            j[c]->cfg.tie_word_embeddings = runs[i].tied;
            total = fsdp_llama_num_params(&j[c]->cfg);
            free(j[c]->params);
            j[c]->params = malloc(total * sizeof(float));
            CU_ASSERT_FATAL(j[c]->params != NULL);
            j[c]->batch = 8 * (size_t)runs[i].world; /* micro-batches of 2 x 32 tokens */
            j[c]->steps = steps;
            j[c]->accum = accum;
            j[c]->no_pack_cache = c;
            if (runs[i].mp) {
                j[c]->use_mp = 1;
                j[c]->mp.param_dtype = FSDP_DTYPE_BF16;
                j[c]->mp.reduce_dtype = FSDP_DTYPE_F32;
                j[c]->mp.buffer_dtype = FSDP_DTYPE_UNSET;
            }
            CU_ASSERT_EQUAL_FATAL(job_run(j[c]), FSDP_OK);
        }
        fprintf(stderr, "\n  %s W=%d%s%s: the head's weight packed %llu times, read packed %llu "
                "times",
                fsdp_strategy_name(runs[i].strategy), runs[i].world, runs[i].tied ? " tied" : "",
                runs[i].mp ? " bf16" : "", (unsigned long long)on->pack_packs[0],
                (unsigned long long)on->pack_hits[0]);
        CU_ASSERT(memcmp(on->losses, off->losses, sizeof(on->losses)) == 0);
        CU_ASSERT(memcmp(on->params, off->params, total * sizeof(float)) == 0);
        CU_ASSERT(on->losses[steps - 1][0] < on->losses[0][0]); /* it trained */
        for (int r = 0; r < runs[i].world; r++) {
            CU_ASSERT_EQUAL(off->pack_packs[r], 0);
            CU_ASSERT_EQUAL(on->pack_packs[r], (uint64_t)(steps - 1));
            CU_ASSERT_EQUAL(on->pack_hits[r], (uint64_t)((steps - 1) * (accum - 2)));
        }
    }
    free(on->params);
    free(off->params);
    free(on);
    free(off);
    fsdp_tokens_close(t);
}

/* bf16 (reduce f32) against f32: FULL_SHARD on 2 ranks, the losses within bf16's roundoff
 * carried through a few layers, and still learning */
static void test_bf16_against_f32(void)
{
    fsdp_tokens_t *t = lm_test_parity_tokens();
    job_t *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
    double worst = 0.0;

    parity_job(a, t, FSDP_FULL_SHARD, 2);
    parity_job(b, t, FSDP_FULL_SHARD, 2);
    b->use_mp = 1;
    b->mp.param_dtype = FSDP_DTYPE_BF16;
    b->mp.reduce_dtype = FSDP_DTYPE_F32;
    b->mp.buffer_dtype = FSDP_DTYPE_F32;
    CU_ASSERT_EQUAL_FATAL(job_run(a), FSDP_OK);
    CU_ASSERT_EQUAL_FATAL(job_run(b), FSDP_OK);
    for (int s = 0; s < 4; s++)
        worst = fmax(worst, fabs(b->losses[s][0] - a->losses[s][0]) / a->losses[s][0]);
    fprintf(stderr, "\n  bf16 losses within %.3g of f32", worst);
    CU_ASSERT(worst < 0x1p-9 * 16); /* 16 units of bf16's roundoff */
    CU_ASSERT(b->losses[3][0] < b->losses[0][0]);
    free(a);
    free(b);
    fsdp_tokens_close(t);
}

/* ---------------- shape mode ---------------- */

/* A Llama-3-shaped model in shape mode at T and 2T: every activation is O(T) with fused
 * attention, so the activation peak doubles (within the allocator's rounding); GPT-2's eager
 * attention, with its [T, T] probabilities per head, would more than double it. */
static void test_shape_activations_linear(void)
{
    job_t *j = calloc(1, sizeof(*j));
    size_t peak[2];
    double ratio;

    CU_ASSERT_EQUAL_FATAL(fsdp_llama_config_parse("llama:layers=4,heads=16,kv_heads=4,dim=1024,"
                                                  "ffn=2816,seq=8192,vocab=32000",
                                                  &j->cfg),
                          FSDP_OK);
    for (int i = 0; i < 2; i++) {
        j->strategy = FSDP_FULL_SHARD;
        j->world = 2;
        j->shape = 1;
        j->batch = 2;
        j->seq = (size_t)2048 << i;
        CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
        peak[i] = j->act_peak[0];
    }
    ratio = (double)peak[1] / (double)peak[0];
    fprintf(stderr, "\n  activation peak at T = 2048: %zu bytes, T = 4096: %zu (ratio %.4f)",
            peak[0], peak[1], ratio);
    CU_ASSERT(ratio > 1.9 && ratio < 2.05);
    /* O(T): under 16 widths a token a layer plus the logits and their gradient, where one layer's
     * [H, T, T] probabilities alone would be 16 x 4096 x 4096 x 4 bytes (1 GiB) */
    CU_ASSERT(peak[1] < (size_t)4096 * 4 * (4 * 16 * 1024 + 2 * 32000));
    free(j);
}

/* Shape mode: selective op checkpointing keeps less than none and more than full (Llama 3 8B's
 * widths, two layers of 2048 tokens): per layer and token, none keeps 2 D + (H + 2K) hd + H hd +
 * D + 3 F elements and the rstds, selective op H hd + K hd + H hd + F and the lse, full nothing
 * beyond the layer's input. */
static void test_shape_selective_op(void)
{
    job_t *j = calloc(1, sizeof(*j));
    size_t peak[3];

    CU_ASSERT_EQUAL_FATAL(fsdp_llama_config_parse("llama:layers=2,heads=32,kv_heads=8,dim=4096,"
                                                  "ffn=14336,seq=2048,vocab=128256",
                                                  &j->cfg),
                          FSDP_OK);
    for (int policy = 0; policy < 3; policy++) {
        j->strategy = FSDP_FULL_SHARD;
        j->world = 2;
        j->shape = 1;
        j->batch = 2;
        j->seq = 2048;
        j->checkpoint = policy == 0   ? FSDP_LM_CKPT_NONE
                        : policy == 1 ? FSDP_LM_CKPT_SELECTIVE_OP
                                      : FSDP_LM_CKPT_FULL;
        CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
        peak[policy] = j->act_peak[0];
    }
    fprintf(stderr, "\n  activation peak: none %zu, selective op %zu, full %zu bytes", peak[0],
            peak[1], peak[2]);
    CU_ASSERT(peak[2] < peak[1] && peak[1] < peak[0]);
    free(j);
}

/* Shape mode, eager memory: a layer keeps what HF's eager model and autograd save, each tensor
 * counted once (docs/costs.md, "The memory of eager autograd"), in bf16 compute (N = B T tokens,
 * e = 2):
 *   input_layernorm: x.to(f32) 4 N D, rsqrt 4 N, the bf16 product 2 N D, its output 2 N D
 *     (saved by q, k and v's Linears);
 *   attention: q and k rotated, k and v copied to every query head (repeat_kv), SDPA's output,
 *     each e N H hd; the log-sum-exp 4 B H T;
 *   post_attention_layernorm: as input_layernorm;
 *   MLP: gate, silu(gate), up, their product, each e N F.
 * The activation peak (at the end of the forward: every layer's, the final norm's, the logits
 * and their log-softmax) grows by exactly that sum a layer: the sizes are multiples of the
 * allocator's 512 bytes. Fused memory is unchanged by the switch, and data mode refuses it. */
static void test_shape_eager_memory(void)
{
    job_t *j = calloc(1, sizeof(*j));
    const size_t B = 2, T = 256, N = B * T, D = 256, H = 4, hd = 64, F = 512;
    const size_t rms = 4 * N * D + 4 * N + 2 * N * D + 2 * N * D;
    const size_t per_layer = 2 * rms + 4 * 2 * N * H * hd + 4 * B * H * T + 4 * 2 * N * F;
    size_t peak[2], fused[2];

    for (int eager = 0; eager < 2; eager++) {
        for (int i = 0; i < 2; i++) {
            CU_ASSERT_EQUAL_FATAL(fsdp_llama_config_parse("llama:heads=4,kv_heads=2,dim=256,"
                                                          "ffn=512,seq=256,vocab=1024",
                                                          &j->cfg),
                                  FSDP_OK);
            j->cfg.n_layer = 2 + i;
            j->strategy = FSDP_FULL_SHARD;
            j->world = 1;
            j->shape = 1;
            j->batch = B;
            j->seq = T;
            j->use_mp = 1;
            j->mp.param_dtype = FSDP_DTYPE_BF16;
            j->mp.reduce_dtype = FSDP_DTYPE_F32;
            j->mp.buffer_dtype = FSDP_DTYPE_UNSET;
            j->eager = eager;
            CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
            (eager ? peak : fused)[i] = j->act_peak[0];
        }
    }
    fprintf(stderr, "\n  a layer's activations: eager %zu bytes (saved-tensor list: %zu), fused %zu",
            peak[1] - peak[0], per_layer, fused[1] - fused[0]);
    CU_ASSERT_EQUAL(peak[1] - peak[0], per_layer);
    CU_ASSERT(fused[1] - fused[0] < per_layer);

    /* f32 compute: .to(f32) is the tensor itself, the residual stream is what RMSNorm saves */
    j->use_mp = 0;
    j->eager = 1;
    j->checkpoint = FSDP_LM_CKPT_SELECTIVE_OP;
    CU_ASSERT_EQUAL(job_run(j), FSDP_OK);
    j->checkpoint = FSDP_LM_CKPT_FULL;
    CU_ASSERT_EQUAL(job_run(j), FSDP_OK);
    /* data mode: the fused kernels read what eager PyTorch frees */
    j->shape = 0;
    j->checkpoint = 0;
    CU_ASSERT_EQUAL(job_run(j), FSDP_ERR_UNSUPPORTED);
    free(j);
}

/* ---------------- presets and specs ---------------- */

static void test_presets_and_specs(void)
{
    static const struct {
        const char *name;
        uint64_t params; /* the published counts */
    } published[] = {
        {"llama2-7b", 6738415616ull},   {"llama2-13b", 13015864320ull},
        {"llama2-70b", 68976648192ull}, {"llama3-8b", 8030261248ull},
        {"llama3-70b", 70553706496ull}, {"llama3.1-405b", 405853388800ull},
        {"llama3.2-1b", 1235814400ull}, {"llama3.2-3b", 3212749824ull},
    };
    static const char *const bad[] = {
        "llama:heads=4,kv_heads=3",
        "llama:dim=63",
        "llama:layers=0",
        "llama:rope_scaling=yarn",
        "llama:tie=2",
        "llama:foo=1",
        "llama:heads=4,",
        "llama:rope_theta=abc",
        "llama:head_dim=7",
        "llama-huge",
        /* one key twice, no key, values that overflow the field's type (eps is a float) */
        "llama:layers=2,layers=3",
        "llama:",
        "llama:,layers=2",
        "llama:layers=2,,heads=4",
        "llama:eps=1e300",
        "llama:eps=1e39",
        "llama:eps=inf",
        "llama:rope_theta=1e400",
        "llama:rope_factor=nan",
        "llama:vocab=4294967297",
        "llama:layers=99999999999999999999",
        "llama:layers=",
    };
    fsdp_llama_config_t cfg;
    int n;
    const fsdp_llama_preset_t *ps = fsdp_llama_presets(&n);

    CU_ASSERT_EQUAL(n, 9);
    for (int i = 0; i < n; i++) /* each preset carries its published count */
        CU_ASSERT_EQUAL(fsdp_llama_num_params(&ps[i].cfg), ps[i].params);
    for (size_t i = 0; i < sizeof(published) / sizeof(published[0]); i++) {
        CU_ASSERT_EQUAL_FATAL(fsdp_llama_config_parse(published[i].name, &cfg), FSDP_OK);
        CU_ASSERT_EQUAL(fsdp_llama_num_params(&cfg), published[i].params);
    }
    CU_ASSERT_EQUAL(fsdp_llama_config_parse("llama3.2-1b", &cfg), FSDP_OK);
    CU_ASSERT(cfg.tie_word_embeddings && cfg.rope_scaling && cfg.rope_factor == 32.0);
    CU_ASSERT_EQUAL(fsdp_llama_config_parse("llama:layers=3,heads=8,kv_heads=2,dim=256,ffn=512,"
                                            "seq=128,vocab=1000,rope_theta=500000,eps=1e-6,tie=1,"
                                            "rope_scaling=llama3,head_dim=64",
                                            &cfg),
                    FSDP_OK);
    CU_ASSERT(cfg.n_layer == 3 && cfg.n_head == 8 && cfg.n_kv_head == 2 && cfg.dim == 256 &&
              cfg.ffn_dim == 512 && cfg.max_seq == 128 && cfg.vocab_size == 1000 &&
              cfg.rope_theta == 500000.0 && fabsf(cfg.rms_norm_eps - 1e-6f) < 1e-12f &&
              cfg.tie_word_embeddings == 1 && cfg.rope_scaling == 1 && cfg.rope_factor == 8.0 &&
              fsdp_llama_head_dim(&cfg) == 64);
    CU_ASSERT(fsdp_llama_spec_is_llama("llama3-8b") && !fsdp_llama_spec_is_llama("gpt2"));
    fsdp_log_set_level(FSDP_LOG_OFF);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (fsdp_llama_config_parse(bad[i], &cfg) != FSDP_ERR_INVALID_PARAM)
            fprintf(stderr, "\n  '%s' was accepted", bad[i]);
        CU_ASSERT_EQUAL(fsdp_llama_config_parse(bad[i], &cfg), FSDP_ERR_INVALID_PARAM);
    }
    /* a config built by hand is held to the same: no infinite eps, theta or factor */
    fsdp_llama_config_parse("llama-tiny", &cfg);
    cfg.rms_norm_eps = INFINITY;
    CU_ASSERT_EQUAL(fsdp_llama_config_check(&cfg), FSDP_ERR_INVALID_PARAM);
    fsdp_llama_config_parse("llama3.1-405b", &cfg);
    cfg.rope_factor = INFINITY;
    CU_ASSERT_EQUAL(fsdp_llama_config_check(&cfg), FSDP_ERR_INVALID_PARAM);
    fsdp_log_set_level(FSDP_LOG_WARN);
    /* eps=1e-50 is a float too (0) */
    CU_ASSERT_EQUAL(fsdp_llama_config_parse("llama:eps=1e-50,rope_factor=2", &cfg), FSDP_OK);
    CU_ASSERT(cfg.rms_norm_eps == 0.0f && !cfg.rope_scaling && cfg.rope_factor == 2.0);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"presets have the published parameter counts; specs parse or are refused",
         test_presets_and_specs},
        {"the double reference's backward against finite differences", test_reference_self_check},
        {"loss and gradients against the double reference (GQA, MHA, MQA; rope scaling; tied), "
         "checkpointing the same",
         test_against_reference},
        {"FSDP strategies and W = 1, 2, 4 equal single-process training", test_fsdp_parity},
        {"init on 3 and 5 ranks: each rank's part holds one process's values, bit for bit",
         test_init_sharded},
        {"bf16 within its roundoff of f32", test_bf16_against_f32},
        {"the LM head's packed weight over accumulated micro-batches: the same bits, packed once "
         "a step where it is kept",
         test_pack_cache_accumulation},
        {"shape mode: activations grow linearly in T", test_shape_activations_linear},
        {"shape mode: selective op checkpointing keeps between none and full",
         test_shape_selective_op},
        {"shape mode, eager memory: a layer keeps eager autograd's saved tensors",
         test_shape_eager_memory},
        {NULL, NULL},
    };
    return fsdp_test_run("llama", tests);
}
