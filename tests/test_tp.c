/* Tensor parallelism of Llama under FSDP2 (fsdp_config_t.tp_size, lib/nn/lm_tp.c):
 * - f32 training at tp = 2 and 4 with dp = 1 and 2 equals one process's losses and weights,
 *   within the summation orders that tensor parallelism changes (the bound is below);
 * - the collectives of one layer's forward and backward: op, size, group and order;
 * - the sharded parameters, gradients and optimizer state per rank are the TP shards' sizes,
 *   and the activations follow sequence parallelism's sizes (docs/costs.md), in closed form;
 * - bf16 stays within its roundoff of f32 under tp;
 * - refusals: fsdp1, hybrid sharding, a tp that does not divide a node or the model, GPT-2.
 */
#include <fsdp/fsdp.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core_hidden.h"
#include "lm_test.h"
#include "nn/nn_hidden.h"
#include "test_util.h"

#define MAX_STEPS 4
#define MAX_W 8

typedef struct job {
    fsdp_llama_config_t cfg;
    int world, tp, steps;
    size_t batch, seq; /* the global batch */
    fsdp_tokens_t *tokens;
    int bf16, shape;
    float losses[MAX_STEPS][MAX_W];
    float *params; /* every full parameter, canonical order (root, then layers) */
    fsdp_mem_stats_t mem[MAX_W];
    fsdp_trace_t *trace;
    char tp_group[64]; /* rank 0's tp group's name */
} job_t;

/* How a parameter is cut over tp (the model's layout, llama.h): 0 whole, 1 rows, 2 columns. */
static int slice_of(int root, int i)
{
    if (root)
        return i == FSDP_LLAMA_NORM ? 0 : 1;
    return i == FSDP_LLAMA_O || i == FSDP_LLAMA_DOWN ? 2 : i >= FSDP_LLAMA_LN1 ? 0 : 1;
}

/* Writes unit u's full parameters (flat, gathered over dp) as tp rank t's slices into out at
 * *off, where one process keeps the full tensors. */
static void put_slices(fsdp_unit_t *u, int root, const float *flat, int tp, int t, float *out,
                       size_t *off)
{
    for (int i = 0; i < fsdp_unit_num_params(u); i++) {
        fsdp_param_info_t pi;
        int s;
        fsdp_unit_param_info(u, i, &pi);
        s = tp > 1 ? slice_of(root, i) : 0;
        if (s == 0 && t == 0) {
            memcpy(out + *off, flat + pi.offset, pi.numel * sizeof(float));
        } else if (s == 1) {
            memcpy(out + *off + (size_t)t * pi.numel, flat + pi.offset, pi.numel * sizeof(float));
        } else if (s == 2) {
            size_t r = (size_t)pi.shape[0], c = (size_t)pi.shape[1];
            for (size_t k = 0; k < r; k++)
                memcpy(out + *off + k * c * (size_t)tp + (size_t)t * c, flat + pi.offset + k * c,
                       c * sizeof(float));
        }
        *off += s == 0 ? pi.numel : pi.numel * (size_t)tp;
    }
}

static fsdp_status_t job_rank(fsdp_dev_t *dev, void *arg)
{
    job_t *j = arg;
    const int dp = j->world / j->tp;
    const size_t rows = j->batch / (size_t)dp;
    fsdp_config_t fc;
    fsdp_t *fs = NULL;
    fsdp_lm_t *m = NULL;
    fsdp_optim_t *opt = NULL;
    fsdp_optim_config_t oc;
    int32_t *in = malloc(rows * j->seq * sizeof(int32_t));
    int32_t *tg = malloc(rows * j->seq * sizeof(int32_t));
    fsdp_status_t st = j->trace != NULL ? fsdp_trace_attach(j->trace, dev) : FSDP_OK;

    fsdp_config_init(&fc);
    fc.api = FSDP_API_FSDP2;
    fc.tp_size = j->tp;
    fc.ranks_per_node = j->world;
    if (j->bf16)
        fc.mixed_precision.param_dtype = FSDP_DTYPE_BF16;
    if (st == FSDP_OK)
        st = fsdp_create(dev, &fc, &fs);
    if (st == FSDP_OK && dev->rank == 0 && fsdp_tp_group(fs) != NULL)
        snprintf(j->tp_group, sizeof(j->tp_group), "%s", fsdp_tp_group(fs)->name);
    if (st == FSDP_OK)
        st = fsdp_llama_create(fs, &j->cfg, &m);
    if (st == FSDP_OK)
        st = fsdp_lm_init_params(m, 3);
    fsdp_optim_config_init(&oc, FSDP_OPTIM_ADAMW);
    oc.lr = 1e-3f;
    if (st == FSDP_OK)
        st = fsdp_optim_create(fs, &oc, &opt);
    for (int s = 0; s < j->steps && st == FSDP_OK; s++) {
        /* the tp ranks of a dp rank read the same rows */
        fsdp_batch_spec_t spec = {j->batch, j->seq, dev->rank / j->tp, dp, 5};
        float loss = 0.0f;
        if (!j->shape)
            st = fsdp_tokens_batch(j->tokens, &spec, s, in, tg);
        if (st == FSDP_OK)
            st = fsdp_lm_forward_backward(m, j->shape ? NULL : in, j->shape ? NULL : tg, rows,
                                          j->seq, &loss);
        j->losses[s][dev->rank] = loss;
        if (st == FSDP_OK)
            st = fsdp_optim_step(opt);
        fsdp_zero_grad(fs);
    }
    if (fs != NULL)
        fsdp_mem_get_stats(fsdp_memory(fs), &j->mem[dev->rank]);
    for (int k = 0; st == FSDP_OK && j->params != NULL && k <= fsdp_lm_num_layers(m); k++) {
        fsdp_unit_t *u = k == 0 ? fsdp_lm_root(m) : fsdp_lm_layer(m, k - 1);
        float *flat = malloc(fsdp_unit_flat_numel(u) * sizeof(float));
        size_t off = 0;
        st = fsdp_unit_gather_full(u, flat);
        /* the ranks of dp index 0 write their slices; one unit after another in the output */
        for (int q = 0; q < k; q++) {
            fsdp_unit_t *v = q == 0 ? fsdp_lm_root(m) : fsdp_lm_layer(m, q - 1);
            for (int i = 0; i < fsdp_unit_num_params(v); i++) {
                fsdp_param_info_t pi;
                fsdp_unit_param_info(v, i, &pi);
                off += j->tp > 1 && slice_of(q == 0, i) ? pi.numel * (size_t)j->tp : pi.numel;
            }
        }
        if (st == FSDP_OK && dev->rank < j->tp)
            put_slices(u, k == 0, flat, j->tp, dev->rank, j->params, &off);
        free(flat);
    }
    free(in);
    free(tg);
    fsdp_optim_destroy(opt);
    fsdp_lm_destroy(m);
    fsdp_destroy(fs);
    if (j->trace != NULL)
        fsdp_trace_detach(dev);
    return st;
}

static fsdp_status_t job_run(job_t *j)
{
    return lm_test_launch(j->world, j->shape, job_rank, j);
}

/* heads 4, kv heads 4, ffn 176, vocab 256: tp 2 and 4 divide them */
static void job_init(job_t *j, fsdp_tokens_t *t, int world, int tp)
{
    float *params = j->params;
    memset(j, 0, sizeof(*j));
    j->params = params;
    CU_ASSERT_EQUAL_FATAL(fsdp_llama_config_parse("llama:kv_heads=4", &j->cfg), FSDP_OK);
    j->world = world;
    j->tp = tp;
    j->steps = 4;
    j->batch = 4;
    j->seq = 32;
    j->tokens = t;
}

static double rel_diff(const float *a, const float *b, size_t n)
{
    double nd = 0.0, nb = 0.0;
    for (size_t e = 0; e < n; e++) {
        nd += ((double)a[e] - b[e]) * ((double)a[e] - b[e]);
        nb += (double)b[e] * b[e];
    }
    return sqrt(nd / nb);
}

/* f32 at tp = 2, 4 and dp = 1, 2 against one process, 4 AdamW steps. What differs is the order
 * of f32 sums: a row-parallel GEMM (o, down) sums its k in tp partial sums that the reduce-scatter
 * adds, the column-parallel layers' input gradients and the head's likewise, and a norm weight's
 * gradient sums its sequence shards and then the tp ranks; FSDP's average over dp is another
 * order again. Each is a few f32 roundings (1e-7 relative) per sum; AdamW divides by
 * sqrt(v) + eps, which turns the relative noise of a near-zero gradient into a step of up to
 * lr (1e-3) times it, so after 4 steps the parameters agree within 1e-5 (relative L2 norm) and
 * the losses within 1e-5 (relative), as FSDP's own parity tests bound them (test_llama.c). */
static void test_parity(void)
{
    static const int runs[][2] = {{2, 2}, {4, 2}, {4, 4}, {8, 4}}; /* world, tp */
    fsdp_tokens_t *t = lm_test_parity_tokens();
    job_t *ref = calloc(1, sizeof(*ref)), *j = calloc(1, sizeof(*j));
    size_t total;

    job_init(ref, t, 1, 1);
    total = fsdp_llama_num_params(&ref->cfg);
    ref->params = calloc(total, sizeof(float));
    j->params = calloc(total, sizeof(float));
    CU_ASSERT_EQUAL_FATAL(job_run(ref), FSDP_OK);
    CU_ASSERT(ref->losses[3][0] < ref->losses[0][0] - 0.05f); /* it trained */
    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
        double dl = 0.0, dp;
        memset(j->params, 0, total * sizeof(float));
        job_init(j, t, runs[i][0], runs[i][1]);
        CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
        for (int s = 0; s < 4; s++) {
            for (int r = 0; r < j->world; r++) /* every rank: its dp rank's loss */
                dl = fmax(dl, fabs((double)j->losses[s][r] - ref->losses[s][0] * 1.0) /
                                  ref->losses[s][0]);
        }
        /* the mean over dp ranks is the global loss: with dp 2 each half of the batch differs,
         * so compare the mean */
        if (j->world / j->tp > 1) {
            dl = 0.0;
            for (int s = 0; s < 4; s++) {
                double mean = 0.0;
                for (int r = 0; r < j->world; r++)
                    mean += j->losses[s][r] / j->world;
                dl = fmax(dl, fabs(mean - ref->losses[s][0]) / ref->losses[s][0]);
            }
        }
        dp = rel_diff(j->params, ref->params, total);
        fprintf(stderr, "\n  tp %d dp %d: losses within %.2g, parameters within %.2g", j->tp,
                j->world / j->tp, dl, dp);
        CU_ASSERT(dl <= 1e-5);
        CU_ASSERT(dp <= 1e-5);
    }
    free(ref->params);
    free(j->params);
    free(ref);
    free(j);
    fsdp_tokens_close(t);
}

/* ---------------- the collectives of one layer ---------------- */

#define MAX_EV 64

typedef struct seen {
    const char *group;
    int in_layer; /* in model.layers.0's forward (1) or backward (2) */
    int n;
    char ev[MAX_EV][96];
} seen_t;

static int collect(void *arg, int rank, uint64_t seq, const fsdp_trace_event_t *ev)
{
    seen_t *s = arg;
    (void)rank, (void)seq;
    if (ev->kind == FSDP_EV_HOOK) {
        int ours = ev->unit != NULL && strcmp(ev->unit, "model.layers.0") == 0;
        /* from layer 0's pre-forward to its post-forward, from its pre-backward through its
         * post-backward hook's work (up to the next hook) */
        s->in_layer = !ours                                   ? 0
                      : strcmp(ev->name, "post_forward") == 0 ? 0
                      : strcmp(ev->name, "pre_forward") == 0  ? 1
                                                              : 2;
        if (ours && s->n < MAX_EV)
            snprintf(s->ev[s->n++], sizeof(s->ev[0]), "%s", ev->name);
        return 0;
    }
    if (ev->kind == FSDP_EV_COLLECTIVE && s->in_layer && ev->group != NULL &&
        strcmp(ev->group, s->group) == 0 && ev->unit != NULL &&
        strcmp(ev->unit, "model.layers.0") == 0 && s->n < MAX_EV)
        snprintf(s->ev[s->n++], sizeof(s->ev[0]), "%s %s %llu %s", ev->name,
                 ev->unit ? ev->unit : "-", (unsigned long long)ev->count,
                 fsdp_dtype_name((fsdp_dtype_t)ev->dtype));
    return 0;
}

/* tp 2, dp 1, f32, a batch of 2 x 32: the tp group's collectives of layer 0, in order. Forward
 * (torchtitan's plan): all-gather of the attention norm's [B T / 2, D] shard, reduce-scatter of
 * o's partial [B T, D], the same around the MLP; backward: all-gather of the output gradient
 * before down's backward, reduce-scatter of the MLP input's gradient, then attention's; in the
 * post-backward hook, before FSDP's reduce-scatter, the two norms' gradients all-reduced over tp
 * (FSDPParam's redistribution of their partial gradients). Counts are elements per rank. */
static void test_layer_collectives(void)
{
    char path[] = "/tmp/fsdp-tp-trace-XXXXXX";
    fsdp_trace_run_info_t info = {.backend = "sim", .world_size = 2};
    fsdp_tokens_t *t = lm_test_parity_tokens();
    job_t *j = calloc(1, sizeof(*j));
    seen_t *s = calloc(1, sizeof(*s));
    fsdp_trace_reader_t *rd;
    int64_t run = 0;
    int fd = mkstemp(path);
    /* rows 2 x 32 / 2 = 32 of D = 64 */
    static const char *const want[] = {
        "pre_forward",
        "all_gather model.layers.0 2048 f32",
        "reduce_scatter model.layers.0 2048 f32",
        "all_gather model.layers.0 2048 f32",
        "reduce_scatter model.layers.0 2048 f32",
        "post_forward",
        "pre_backward",
        "all_gather model.layers.0 2048 f32",
        "reduce_scatter model.layers.0 2048 f32",
        "all_gather model.layers.0 2048 f32",
        "reduce_scatter model.layers.0 2048 f32",
        "post_backward",
        "all_reduce model.layers.0 64 f32",
        "all_reduce model.layers.0 64 f32",
    };

    CU_ASSERT_FATAL(fd >= 0);
    close(fd);
    unlink(path);
    job_init(j, t, 2, 2);
    j->batch = 2;
    j->steps = 1;
    CU_ASSERT_EQUAL_FATAL(fsdp_trace_open(path, &info, &j->trace), FSDP_OK);
    CU_ASSERT_EQUAL(job_run(j), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_trace_close(j->trace), FSDP_OK);
    s->group = j->tp_group;
    CU_ASSERT_EQUAL_FATAL(fsdp_trace_reader_open(path, &rd), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_trace_reader_find_run(rd, 0, &run), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_trace_reader_events(rd, run, 0, collect, s), FSDP_OK);
    fsdp_trace_reader_close(rd);
    if (s->n != (int)(sizeof(want) / sizeof(want[0])))
        for (int i = 0; i < s->n; i++)
            fprintf(stderr, "\n  event %d: '%s'", i, s->ev[i]);
    CU_ASSERT_EQUAL(s->n, (int)(sizeof(want) / sizeof(want[0])));
    for (int i = 0; i < s->n && i < (int)(sizeof(want) / sizeof(want[0])); i++) {
        if (strcmp(s->ev[i], want[i]) != 0)
            fprintf(stderr, "\n  event %d: got '%s', want '%s'", i, s->ev[i], want[i]);
        CU_ASSERT_STRING_EQUAL(s->ev[i], want[i]);
    }
    unlink(path);
    free(s);
    free(j);
    fsdp_tokens_close(t);
}

/* ---------------- memory per rank, in closed form (docs/costs.md) ---------------- */

static size_t r512(size_t bytes)
{
    return (bytes + 511) / 512 * 512;
}

/* one fully_shard group's shard: every parameter's dim-0 chunk over d ranks, padded */
static size_t chunk(size_t rows, size_t cols, size_t d)
{
    return (rows + d - 1) / d * cols;
}

/* The elements of a unit's shard (A): the root (layer < 0) or a layer, at tp t and dp d. */
static size_t shard_numel(const fsdp_llama_config_t *c, int layer, size_t t, size_t d)
{
    const size_t D = (size_t)c->dim, hd = (size_t)fsdp_llama_head_dim(c), V = (size_t)c->vocab_size;
    const size_t q = (size_t)c->n_head / t * hd, kv = (size_t)c->n_kv_head / t * hd;
    const size_t F = (size_t)c->ffn_dim / t;

    if (layer < 0) /* embedding and head by vocabulary rows, the norm whole */
        return 2 * chunk(V / t, D, d) + chunk(D, 1, d);
    return chunk(q, D, d) + 2 * chunk(kv, D, d) + chunk(D, q, d) + 2 * chunk(F, D, d) +
           chunk(D, F, d) + 2 * chunk(D, 1, d);
}

/* FSDP_MEM_ACTIVATION's peak, f32, at the end of the forward: the batch (tokens, targets and,
 * under tp, the vocabulary-local ids), the rotary tables, the residual stream's L + 1 sequence
 * shards [BT / t, D], each layer's saved tensors (its norms' outputs all-gathered [BT, D] and
 * their rstd on the shard, q k v o of its H / t and K / t heads, the log-sum-exp, the mid
 * residual's shard, gate, up and their product of F / t columns), the final norm's rstd on the
 * shard, its output (all-gathered under tp: [BT, D]) and the logits, all-gathered [BT, V]. */
static size_t act_peak(const fsdp_llama_config_t *c, size_t B, size_t T, size_t t)
{
    const size_t D = (size_t)c->dim, hd = (size_t)fsdp_llama_head_dim(c), V = (size_t)c->vocab_size;
    const size_t BT = B * T, rows = BT / t, H = (size_t)c->n_head / t, K = (size_t)c->n_kv_head / t;
    const size_t F = (size_t)c->ffn_dim / t, L = (size_t)c->n_layer;
    size_t layer = 2 * r512(BT * D * 4) + 2 * r512(rows * 4) + 2 * r512(BT * H * hd * 4) +
                   2 * r512(BT * K * hd * 4) + r512(B * H * T * 4) + r512(rows * D * 4) +
                   3 * r512(BT * F * 4);
    size_t batch = (t > 1 ? 3 : 2) * r512(BT * 4) + 2 * r512(T * hd / 2 * 4);

    return batch + (L + 1) * r512(rows * D * 4) + L * layer + r512(rows * 4) + r512(BT * D * 4) +
           r512(BT * V * 4);
}

/* Shape mode, one AdamW step of a batch of 2 x 64 per dp rank: the sharded parameters and the
 * optimizer state (two tensors per unit) are the closed form's shards, the activations' peak
 * is act_peak, at tp 1, 2, 4 with dp 1 and at tp 2 with dp 2. */
static void test_memory_closed_form(void)
{
    static const int runs[][2] = {{1, 1}, {2, 2}, {4, 4}, {4, 2}}; /* world, tp */
    job_t *j = calloc(1, sizeof(*j));

    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
        const size_t t = (size_t)runs[i][1], d = (size_t)(runs[i][0] / runs[i][1]);
        size_t params = 0, act;
        job_init(j, NULL, runs[i][0], runs[i][1]);
        CU_ASSERT_EQUAL_FATAL(fsdp_llama_config_parse("llama:kv_heads=4,ffn=128", &j->cfg),
                              FSDP_OK);
        j->shape = 1;
        j->steps = 1;
        j->batch = 2 * d;
        j->seq = 64;
        CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
        for (int l = -1; l < j->cfg.n_layer; l++)
            params += r512(shard_numel(&j->cfg, l, t, d) * 4);
        act = act_peak(&j->cfg, 2, 64, t);
        fprintf(stderr, "\n  tp %zu dp %zu: sharded parameters %zu bytes, activations %zu", t, d,
                j->mem[0].by_category[FSDP_MEM_SHARDED_PARAM],
                j->mem[0].peak_by_category[FSDP_MEM_ACTIVATION]);
        for (int r = 0; r < j->world; r++) {
            CU_ASSERT_EQUAL(j->mem[r].by_category[FSDP_MEM_SHARDED_PARAM], params);
            CU_ASSERT_EQUAL(j->mem[r].by_category[FSDP_MEM_OPTIMIZER_STATE], 2 * params);
            CU_ASSERT_EQUAL(j->mem[r].peak_by_category[FSDP_MEM_ACTIVATION], act);
        }
    }
    free(j);
}

/* ---------------- bf16 ---------------- */

/* bf16 (MixedPrecisionPolicy(param_dtype=bf16), f32 reduce) at tp 2: a row-parallel Linear's
 * partial output is rounded to bf16 on each rank (the matmul's output dtype) before the
 * reduce-scatter sums the partials and rounds once more, as torch's bf16 reduce_scatter_tensor of
 * DTensor's Partial -> Shard(1) does (the sim sums a collective in f32 and rounds once, its rule
 * for every bf16 reduction); the norms' partial gradients are summed over tp in bf16 likewise.
 * So tp 2 rounds more often than tp 1: the losses stay within bf16's roundoff of f32's. */
static void test_bf16(void)
{
    fsdp_tokens_t *t = lm_test_parity_tokens();
    job_t *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b)), *c = calloc(1, sizeof(*c));
    double worst = 0.0, worst1 = 0.0;

    job_init(a, t, 1, 1);
    job_init(b, t, 2, 2);
    job_init(c, t, 1, 1);
    b->bf16 = c->bf16 = 1;
    CU_ASSERT_EQUAL_FATAL(job_run(a), FSDP_OK);
    CU_ASSERT_EQUAL_FATAL(job_run(b), FSDP_OK);
    CU_ASSERT_EQUAL_FATAL(job_run(c), FSDP_OK);
    for (int s = 0; s < 4; s++) {
        worst = fmax(worst, fabs(b->losses[s][0] - a->losses[s][0]) / a->losses[s][0]);
        worst1 = fmax(worst1, fabs(c->losses[s][0] - a->losses[s][0]) / a->losses[s][0]);
    }
    fprintf(stderr, "\n  bf16 losses within %.3g of f32 at tp 2 (%.3g at tp 1)", worst, worst1);
    CU_ASSERT(worst < 0x1p-9 * 16); /* 16 units of bf16's roundoff, as test_llama.c */
    CU_ASSERT(b->losses[0][0] == b->losses[0][1]); /* the tp ranks agree */
    CU_ASSERT(b->losses[3][0] < b->losses[0][0]);
    free(a);
    free(b);
    free(c);
    fsdp_tokens_close(t);
}

/* ---------------- refusals ---------------- */

enum { R_FSDP1, R_HYBRID, R_NODE, R_HEADS, R_SEQ, R_GPT2, R_SAVE, R_COUNT };

typedef struct refusals {
    fsdp_status_t got[MAX_W][R_COUNT];
} refusals_t;

static fsdp_status_t try_config(fsdp_dev_t *dev, fsdp_config_t *fc)
{
    fsdp_t *fs = NULL;
    fsdp_status_t st = fsdp_create(dev, fc, &fs);
    fsdp_destroy(fs);
    return st;
}

static fsdp_status_t refusal_rank(fsdp_dev_t *dev, void *arg)
{
    fsdp_status_t *got = ((refusals_t *)arg)->got[dev->rank];
    fsdp_config_t fc;
    fsdp_llama_config_t lc;
    fsdp_gpt2_config_t gc;
    fsdp_t *fs = NULL;
    fsdp_lm_t *m = NULL;
    int32_t tok[2 * 33] = {0};
    float loss;

    fsdp_config_init(&fc);
    fc.tp_size = 2;
    got[R_FSDP1] = try_config(dev, &fc); /* fsdp1 */
    fc.api = FSDP_API_FSDP2;
    fc.strategy = FSDP_HYBRID_SHARD;
    got[R_HYBRID] = try_config(dev, &fc);
    fc.strategy = FSDP_FULL_SHARD;
    fc.tp_size = 4;
    fc.ranks_per_node = 2; /* tp 4 does not fit a node of 2 */
    got[R_NODE] = try_config(dev, &fc);
    fc.tp_size = 2;
    fc.ranks_per_node = 0;
    if (fsdp_create(dev, &fc, &fs) != FSDP_OK)
        return FSDP_ERR_INTERNAL;
    fsdp_llama_config_parse("llama:kv_heads=1", &lc); /* tp 2 does not divide 1 kv head */
    got[R_HEADS] = fsdp_llama_create(fs, &lc, &m);
    fsdp_lm_destroy(m);
    m = NULL;
    fsdp_destroy(fs);
    fs = NULL;
    if (fsdp_create(dev, &fc, &fs) != FSDP_OK)
        return FSDP_ERR_INTERNAL;
    fsdp_llama_config_parse("llama-tiny", &lc);
    if (fsdp_llama_create(fs, &lc, &m) != FSDP_OK)
        return FSDP_ERR_INTERNAL;
    got[R_SEQ] = fsdp_lm_forward_backward(m, tok, tok, 2, 33, &loss); /* 33 tokens over tp 2 */
    got[R_SAVE] = fsdp_lm_save_weights(m, "/nonexistent/model.safetensors");
    fsdp_lm_destroy(m);
    fsdp_destroy(fs);
    fs = NULL;
    m = NULL;
    if (fsdp_create(dev, &fc, &fs) != FSDP_OK)
        return FSDP_ERR_INTERNAL;
    fsdp_gpt2_config_parse("gpt2-tiny", &gc);
    got[R_GPT2] = fsdp_gpt2_create(fs, &gc, &m);
    fsdp_lm_destroy(m);
    fsdp_destroy(fs);
    return FSDP_OK;
}

/* fsdp1, HSDP x tp, a tp larger than a node, a tp that does not divide the kv heads or the
 * sequence, GPT-2 and saving HF weights under tp are refused, each with its line. */
static void test_refusals(void)
{
    static const fsdp_status_t want[R_COUNT] = {FSDP_ERR_INVALID_PARAM, FSDP_ERR_INVALID_PARAM,
                                                FSDP_ERR_INVALID_PARAM, FSDP_ERR_INVALID_PARAM,
                                                FSDP_ERR_INVALID_PARAM, FSDP_ERR_UNSUPPORTED,
                                                FSDP_ERR_UNSUPPORTED};
    refusals_t *r = calloc(1, sizeof(*r));

    fsdp_log_set_level(FSDP_LOG_OFF);
    CU_ASSERT_EQUAL(lm_test_launch(4, 0, refusal_rank, r), FSDP_OK);
    fsdp_log_set_level(FSDP_LOG_WARN);
    for (int rank = 0; rank < 4; rank++)
        for (int i = 0; i < R_COUNT; i++) {
            if (r->got[rank][i] != want[i])
                fprintf(stderr, "\n  rank %d case %d: %s", rank, i,
                        fsdp_status_name(r->got[rank][i]));
            CU_ASSERT_EQUAL(r->got[rank][i], want[i]);
        }
    free(r);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"f32 at tp 2 and 4, dp 1 and 2, equals one process within summation order", test_parity},
        {"one layer's tp collectives: op, size, group, order", test_layer_collectives},
        {"memory per rank: TP's shards and SP's activations in closed form",
         test_memory_closed_form},
        {"bf16 at tp 2 within bf16's roundoff of f32", test_bf16},
        {"refusals: fsdp1, HSDP x tp, a node, heads, seq, gpt2, HF save", test_refusals},
        {NULL, NULL},
    };
    fsdp_log_set_level(FSDP_LOG_WARN);
    return fsdp_test_run("tp", tests);
}
