/* Tensor parallelism of Llama under FSDP2 (fsdp_config_t.tp_size, lib/nn/lm_tp.c):
 * - f32 training at tp = 2 and 4 with dp = 1 and 2 (and HSDP's 2 x 2 x tp 2) equals one
 *   process's losses and weights,
 *   within the summation orders that tensor parallelism changes (the bound is below);
 * - the collectives of one layer's forward and backward: op, size, group and order;
 * - the sharded parameters, gradients and optimizer state per rank are the TP shards' sizes,
 *   and the activations follow sequence parallelism's sizes (docs/costs.md), in closed form;
 * - GPT-2 likewise (c_attn split by heads into q, k, v columns, the c_proj's row-parallel);
 * - the vocabulary-parallel loss: the same training, its collectives, its memory;
 * - bf16 stays within its roundoff of f32 under tp;
 * - full and sharded checkpoints: whole tensors, one process's bytes, loaded at any tp and dp;
 * - refusals: fsdp1, a tp that does not divide a node or the model.
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
    int gpt2; /* gcfg's GPT-2 instead of cfg's Llama */
    fsdp_gpt2_config_t gcfg;
    int world, tp, steps;
    size_t batch, seq; /* the global batch */
    fsdp_tokens_t *tokens;
    int bf16, shape;
    int loss_parallel; /* fsdp_config_t.tp_loss_parallel */
    int per_node;      /* > 0: hybrid_shard (HSDP x tp) over nodes of per_node ranks */
    double clip;       /* > 0: fsdp_clip_grad_norm to it each step, the norms into norms */
    const char *load;  /* an HF file to start from instead of init_params(3) */
    const char *save;  /* an HF file the first values are saved to */
    int fsdp1;         /* at tp 1: FSDP1 instead of fully_shard */
    /* a checkpoint directory loaded (model and AdamW state) before the steps, and one saved
     * after them as step 2, of type ckpt_type */
    const char *ckpt_load, *ckpt_save;
    fsdp_state_dict_type_t ckpt_type;
    double norms[MAX_STEPS];
    float losses[MAX_STEPS][MAX_W];
    float *params; /* every full parameter, canonical order (root, then layers) */
    fsdp_mem_stats_t mem[MAX_W];
    fsdp_trace_t *trace;
    char tp_group[64]; /* rank 0's tp group's name */
} job_t;

/* How a parameter is cut over tp (the models' layouts, llama.h, gpt2_int.h): 0 whole, -1 its
 * rows, P > 0 the columns of P blocks of each row (q, k, v of GPT-2's c_attn: 3). */
static int slice_of(int gpt2, int root, int i)
{
    if (gpt2 && root)
        return i == FSDP_GPT2_WTE ? -1 : 0;
    if (gpt2)
        return i == FSDP_GPT2_ATTN_W || i == FSDP_GPT2_ATTN_B           ? 3
               : i == FSDP_GPT2_FC_W || i == FSDP_GPT2_FC_B             ? 1
               : i == FSDP_GPT2_ATTN_PROJ_W || i == FSDP_GPT2_FC_PROJ_W ? -1
                                                                        : 0;
    if (root)
        return i == FSDP_LLAMA_NORM ? 0 : -1;
    return i == FSDP_LLAMA_O || i == FSDP_LLAMA_DOWN ? 1 : i >= FSDP_LLAMA_LN1 ? 0 : -1;
}

/* Writes unit u's full parameters (flat, gathered over dp) as tp rank t's slices into out at
 * *off, where one process keeps the full tensors. */
static void put_slices(fsdp_unit_t *u, int gpt2, int root, const float *flat, int tp, int t,
                       float *out, size_t *off)
{
    for (int i = 0; i < fsdp_unit_num_params(u); i++) {
        fsdp_param_info_t pi;
        int parts;
        fsdp_unit_param_info(u, i, &pi);
        parts = tp > 1 ? slice_of(gpt2, root, i) : 0;
        for (size_t e = 0; e < pi.numel && (parts != 0 || t == 0); e++) {
            size_t cols = pi.ndim == 2 ? (size_t)pi.shape[1] : pi.numel, w, f;
            if (parts < 0) {
                f = (size_t)t * pi.numel + e;
            } else if (parts == 0) {
                f = e;
            } else {
                w = cols / (size_t)parts;
                f = e / cols * cols * (size_t)tp + e % cols / w * w * (size_t)tp + (size_t)t * w +
                    e % w;
            }
            out[*off + f] = flat[pi.offset + e];
        }
        *off += parts == 0 ? pi.numel : pi.numel * (size_t)tp;
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
    fc.api = j->fsdp1 ? FSDP_API_FSDP1 : FSDP_API_FSDP2;
    fc.tp_size = j->tp;
    fc.ranks_per_node = j->per_node > 0 ? j->per_node : j->world;
    if (j->per_node > 0)
        fc.strategy = FSDP_HYBRID_SHARD;
    fc.tp_loss_parallel = j->loss_parallel;
    if (j->bf16)
        fc.mixed_precision.param_dtype = FSDP_DTYPE_BF16;
    if (st == FSDP_OK)
        st = fsdp_create(dev, &fc, &fs);
    if (st == FSDP_OK && dev->rank == 0 && fsdp_tp_group(fs) != NULL)
        snprintf(j->tp_group, sizeof(j->tp_group), "%s", fsdp_tp_group(fs)->name);
    if (st == FSDP_OK)
        st = j->gpt2 ? fsdp_gpt2_create(fs, &j->gcfg, &m) : fsdp_llama_create(fs, &j->cfg, &m);
    if (st == FSDP_OK && j->load != NULL) {
        fsdp_lm_weights_t *w = NULL;
        st = j->gpt2 ? fsdp_gpt2_weights_open(j->load, &j->gcfg, &w)
                     : fsdp_llama_weights_open(j->load, &j->cfg, &w);
        if (st == FSDP_OK)
            st = fsdp_lm_load_weights(m, w);
        fsdp_lm_weights_close(w);
    } else if (st == FSDP_OK) {
        st = fsdp_lm_init_params(m, 3);
    }
    if (st == FSDP_OK && j->save != NULL)
        st = fsdp_lm_save_weights(m, j->save);
    fsdp_optim_config_init(&oc, FSDP_OPTIM_ADAMW);
    oc.lr = 1e-3f;
    if (st == FSDP_OK)
        st = fsdp_optim_create(fs, &oc, &opt);
    if (st == FSDP_OK && j->ckpt_load != NULL)
        st = fsdp_checkpoint_load(fs, opt, j->ckpt_load, NULL);
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
        if (st == FSDP_OK && j->clip > 0.0) /* every rank's norm is the same: rank 0 keeps it */
            st = fsdp_clip_grad_norm(fs, j->clip, 2.0, dev->rank == 0 ? &j->norms[s] : NULL);
        if (st == FSDP_OK)
            st = fsdp_optim_step(opt);
        fsdp_zero_grad(fs);
    }
    if (st == FSDP_OK && j->ckpt_save != NULL)
        st = fsdp_checkpoint_save(fs, opt, j->ckpt_save, j->ckpt_type, 2);
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
                off +=
                    j->tp > 1 && slice_of(j->gpt2, q == 0, i) ? pi.numel * (size_t)j->tp : pi.numel;
            }
        }
        if (st == FSDP_OK && dev->rank < j->tp)
            put_slices(u, j->gpt2, k == 0, flat, j->tp, dev->rank, j->params, &off);
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

/* j against the one process ref: *dl_p the largest relative difference of the step losses (the
 * mean over the ranks, each dp rank's own rows: the global batch's), the return value the
 * parameters' relative difference (total of them). Prints both under `what`. */
static double compare_runs(const job_t *ref, const job_t *j, size_t total, const char *what,
                           double *dl_p)
{
    double dl = 0.0, dp = lm_test_rel_diff(j->params, ref->params, total);

    for (int s = 0; s < j->steps; s++) {
        double mean = 0.0;
        for (int r = 0; r < j->world; r++)
            mean += j->losses[s][r] / j->world;
        dl = fmax(dl, fabs(mean - ref->losses[s][0]) / ref->losses[s][0]);
    }
    fprintf(stderr, "\n  %s tp %d dp %d: losses within %.2g, parameters within %.2g", what, j->tp,
            j->world / j->tp, dl, dp);
    *dl_p = dl;
    return dp;
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
    /* world, tp, the vocabulary-parallel loss, HSDP's ranks per node (0: full_shard) */
    static const int runs[][4] = {{2, 2, 0, 0}, {4, 2, 0, 0}, {4, 4, 0, 0}, {8, 4, 0, 0},
                                  {4, 2, 1, 0}, {4, 4, 1, 0}, {8, 2, 0, 4}};
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
        double dl, dp;
        memset(j->params, 0, total * sizeof(float));
        job_init(j, t, runs[i][0], runs[i][1]);
        j->loss_parallel = runs[i][2];
        j->per_node = runs[i][3];
        CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
        dp = compare_runs(ref, j, total,
                          j->loss_parallel ? "loss parallel"
                          : j->per_node    ? "HSDP 2 x 2"
                                           : "llama",
                          &dl);
        CU_ASSERT(dl <= 1e-5);
        CU_ASSERT(dp <= 1e-5);
    }
    free(ref->params);
    free(j->params);
    free(ref);
    free(j);
    fsdp_tokens_close(t);
}

/* GPT-2 (4 heads of 16, tied wte, eager and fused attention) at tp 2 and 4 with dp 1 and 2, as
 * Llama: c_attn's q, k and v columns of this rank's heads with their bias, c_fc's columns,
 * both c_proj's rows with the bias divided by tp on every rank (DTensor's Replicate -> Partial)
 * and summed by the reduce-scatter, the layernorms and wpe on sequence shards. The same bound
 * and for the same reasons as Llama's. */
static void test_gpt2_parity(void)
{
    static const int runs[][4] = {{2, 2, 0, 0},
                                  {4, 2, 0, 0},
                                  {4, 4, 0, 0},
                                  {4, 2, 1, 0},
                                  {4, 2, 0, 1}}; /* world, tp, fused, loss parallel */
    fsdp_tokens_t *t = lm_test_parity_tokens();
    job_t *ref = calloc(1, sizeof(*ref)), *j = calloc(1, sizeof(*j));
    size_t total;

    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
        double dl, dp;
        job_init(ref, t, 1, 1);
        job_init(j, t, runs[i][0], runs[i][1]);
        ref->gpt2 = j->gpt2 = 1;
        CU_ASSERT_EQUAL_FATAL(
            fsdp_gpt2_config_parse(runs[i][2] ? "gpt2:heads=4,attention=fused" : "gpt2:heads=4",
                                   &j->gcfg),
            FSDP_OK);
        ref->gcfg = j->gcfg;
        j->loss_parallel = runs[i][3];
        total = fsdp_gpt2_root_params(&j->gcfg) +
                (size_t)j->gcfg.n_layer * fsdp_gpt2_block_params(&j->gcfg);
        ref->params = calloc(total, sizeof(float));
        j->params = calloc(total, sizeof(float));
        CU_ASSERT_EQUAL_FATAL(job_run(ref), FSDP_OK);
        CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
        dp = compare_runs(ref, j, total,
                          runs[i][2]   ? "gpt2 fused"
                          : runs[i][3] ? "gpt2 loss parallel"
                                       : "gpt2",
                          &dl);
        CU_ASSERT(ref->losses[3][0] < ref->losses[0][0] - 0.05f);
        CU_ASSERT(dl <= 1e-5);
        CU_ASSERT(dp <= 1e-5);
        free(ref->params);
        free(j->params);
        ref->params = j->params = NULL;
    }
    free(ref);
    free(j);
    fsdp_tokens_close(t);
}

/* clip_grad_norm at tp 2 and 4 (dp 1, 2) clips as one process does: the norm counts every tp
 * rank's slices of the sharded parameters and the replicated ones (the norms, tp_partial_grad)
 * once, as torch's norm of DTensors does; a max_norm of 0.05 clips every step. */
static void test_clip(void)
{
    static const int runs[][2] = {{2, 2}, {4, 2}, {4, 4}};
    fsdp_tokens_t *t = lm_test_parity_tokens();
    job_t *ref = calloc(1, sizeof(*ref)), *j = calloc(1, sizeof(*j));
    size_t total;

    job_init(ref, t, 1, 1);
    ref->clip = 0.05;
    total = fsdp_llama_num_params(&ref->cfg);
    ref->params = calloc(total, sizeof(float));
    j->params = calloc(total, sizeof(float));
    CU_ASSERT_EQUAL_FATAL(job_run(ref), FSDP_OK);
    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
        double dn = 0.0, dp;
        job_init(j, t, runs[i][0], runs[i][1]);
        j->clip = 0.05;
        CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
        for (int s = 0; s < 4; s++) {
            CU_ASSERT(ref->norms[s] > 0.05); /* it clipped */
            dn = fmax(dn, fabs(j->norms[s] - ref->norms[s]) / ref->norms[s]);
        }
        dp = lm_test_rel_diff(j->params, ref->params, total);
        fprintf(stderr, "\n  tp %d dp %d: norms within %.2g, parameters within %.2g", j->tp,
                j->world / j->tp, dn, dp);
        CU_ASSERT(dn <= 1e-5);
        CU_ASSERT(dp <= 1e-5);
    }
    free(ref->params);
    free(j->params);
    free(ref);
    free(j);
    fsdp_tokens_close(t);
}

/* The bytes of a file (*n_p of them), or NULL. */
static char *file_bytes(const char *path, size_t *n_p)
{
    FILE *f = fopen(path, "rb");
    char *b = NULL;
    long n;

    if (f != NULL && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 &&
        fseek(f, 0, SEEK_SET) == 0 && (b = malloc((size_t)n)) != NULL &&
        fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    if (f != NULL)
        fclose(f);
    *n_p = b != NULL ? (size_t)n : 0;
    return b;
}

/* Initialization and HF weights under tp, Llama and GPT-2: at tp 2 and 4 (dp 1 and 2) every
 * rank's slices hold one process's values bit for bit, whether drawn by init_params (Llama:
 * each run of a slice from the generator skipped to its place; GPT-2: the whole tensor drawn,
 * the polar method cannot skip) or loaded from an HF file one process saved (each slice read
 * from its place in the full tensor); and the HF file saved under tp (every tp rank's slices
 * all-gathered and put together on rank 0) is one process's, byte for byte. */
static void test_init_and_load(void)
{
    static const int runs[][2] = {{2, 2}, {4, 2}, {4, 4}};
    char path[] = "/tmp/fsdp-tp-hf-XXXXXX", saved[] = "/tmp/fsdp-tp-hf2-XXXXXX";
    job_t *ref = calloc(1, sizeof(*ref)), *j = calloc(1, sizeof(*j));
    int fd = mkstemp(path), fd2 = mkstemp(saved);

    CU_ASSERT_FATAL(fd >= 0 && fd2 >= 0);
    close(fd);
    close(fd2);
    for (int gpt2 = 0; gpt2 <= 1; gpt2++) {
        size_t total, n_ref, n_got;
        char *want, *got;
        job_init(ref, NULL, 1, 1);
        ref->gpt2 = gpt2;
        CU_ASSERT_EQUAL_FATAL(fsdp_gpt2_config_parse("gpt2:heads=4", &ref->gcfg), FSDP_OK);
        ref->steps = 0;
        ref->save = path;
        total = gpt2 ? fsdp_gpt2_root_params(&ref->gcfg) +
                           (size_t)ref->gcfg.n_layer * fsdp_gpt2_block_params(&ref->gcfg)
                     : fsdp_llama_num_params(&ref->cfg);
        ref->params = calloc(total, sizeof(float));
        j->params = calloc(total, sizeof(float));
        CU_ASSERT_EQUAL_FATAL(job_run(ref), FSDP_OK);
        want = file_bytes(path, &n_ref);
        for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
            for (int load = 0; load <= 1; load++) {
                memset(j->params, 0xff, total * sizeof(float));
                job_init(j, NULL, runs[i][0], runs[i][1]);
                j->gpt2 = gpt2;
                j->gcfg = ref->gcfg;
                j->steps = 0;
                j->load = load ? path : NULL;
                j->save = saved;
                CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
                got = file_bytes(saved, &n_got);
                if (memcmp(j->params, ref->params, total * sizeof(float)) != 0 || n_got != n_ref ||
                    got == NULL || want == NULL || memcmp(got, want, n_ref) != 0)
                    fprintf(stderr, "\n  %s tp %d dp %d %s: not one process's values",
                            gpt2 ? "gpt2" : "llama", j->tp, j->world / j->tp,
                            load ? "loaded" : "initialized");
                CU_ASSERT(memcmp(j->params, ref->params, total * sizeof(float)) == 0);
                CU_ASSERT(want != NULL && got != NULL && n_got == n_ref &&
                          memcmp(got, want, n_ref) == 0);
                free(got);
            }
        }
        free(want);
        free(ref->params);
        free(j->params);
        ref->params = j->params = NULL;
    }
    unlink(path);
    unlink(saved);
    free(ref);
    free(j);
}

/* Whether the files `name` of checkpoint directories a and b (their step 2) hold the same
 * bytes; prints what differs under `what`. */
static int same_file(const char *a, const char *b, const char *name, const char *what)
{
    char pa[300], pb[300];
    size_t na, nb;
    char *x, *y;
    int same;

    snprintf(pa, sizeof(pa), "%s/step-00000002/%s", a, name);
    snprintf(pb, sizeof(pb), "%s/step-00000002/%s", b, name);
    x = file_bytes(pa, &na);
    y = file_bytes(pb, &nb);
    same = x != NULL && y != NULL && na == nb && memcmp(x, y, na) == 0;
    if (!same)
        fprintf(stderr, "\n  %s: %s is not one process's", what, name);
    free(x);
    free(y);
    return same;
}

/* Full and sharded checkpoints under tp, Llama and GPT-2, with AdamW's state after 2 steps of
 * one process: loaded at tp 2 and 4 (dp 1 and 2), at dp 2 and 3 without tp and under FSDP1,
 * and saved again full, they are that process's model.safetensors and optimizer.safetensors
 * byte for byte (the whole tensors, put together over dp and tp); saved sharded at each layout
 * (2-d pieces for the column slices), each loads at the next layout and saves full to the same
 * bytes, and consolidates to the same model.safetensors. A local checkpoint at tp 2 is refused
 * at tp 4. */
static void test_checkpoints(void)
{
    /* world, tp, fsdp1 */
    static const int runs[][3] = {{4, 2, 0}, {4, 4, 0}, {2, 2, 0}, {3, 1, 1}, {2, 1, 0}};
    const int nruns = (int)(sizeof(runs) / sizeof(runs[0]));
    char top[] = "/tmp/fsdp-tp-ckpt-XXXXXX", one[64], full[64], sh[8][64], cons[80], want_rm[80];
    job_t *j = calloc(1, sizeof(*j));

    CU_ASSERT_FATAL(mkdtemp(top) != NULL);
    snprintf(one, sizeof(one), "%s/one", top);
    snprintf(full, sizeof(full), "%s/full", top);
    snprintf(cons, sizeof(cons), "%s/consolidated.safetensors", top);
    for (int gpt2 = 0; gpt2 <= 1; gpt2++) {
        const char *model = gpt2 ? "gpt2" : "llama";
        char want[300], what[64];
        size_t n_want, n_got;
        char *wb, *gb;
        job_init(j, NULL, 1, 1);
        j->gpt2 = gpt2;
        CU_ASSERT_EQUAL_FATAL(fsdp_gpt2_config_parse("gpt2:heads=4", &j->gcfg), FSDP_OK);
        j->tokens = lm_test_parity_tokens();
        j->steps = 2;
        j->ckpt_save = one;
        j->ckpt_type = FSDP_STATE_DICT_FULL;
        CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
        fsdp_tokens_close(j->tokens);
        j->tokens = NULL;
        j->steps = 0;
        j->ckpt_load = one;
        for (int i = 0; i < nruns; i++) {
            j->world = runs[i][0];
            j->tp = runs[i][1];
            j->fsdp1 = runs[i][2];
            snprintf(what, sizeof(what), "%s world %d tp %d%s", model, j->world, j->tp,
                     j->fsdp1 ? " fsdp1" : "");
            j->ckpt_load = one;
            j->ckpt_save = full;
            j->ckpt_type = FSDP_STATE_DICT_FULL;
            CU_ASSERT_EQUAL(job_run(j), FSDP_OK);
            CU_ASSERT(same_file(one, full, "model.safetensors", what));
            CU_ASSERT(same_file(one, full, "optimizer.safetensors", what));
            snprintf(sh[i], sizeof(sh[i]), "%s/sharded-%s-%d", top, model, i);
            j->ckpt_save = sh[i];
            j->ckpt_type = FSDP_STATE_DICT_SHARDED;
            CU_ASSERT_EQUAL(job_run(j), FSDP_OK);
        }
        snprintf(want, sizeof(want), "%s/step-00000002/model.safetensors", one);
        wb = file_bytes(want, &n_want);
        for (int i = 0; i < nruns; i++) {
            const int k = (i + 1) % nruns;
            j->world = runs[k][0];
            j->tp = runs[k][1];
            j->fsdp1 = runs[k][2];
            snprintf(what, sizeof(what), "%s sharded of layout %d at world %d tp %d", model, i,
                     j->world, j->tp);
            j->ckpt_load = sh[i];
            j->ckpt_save = full;
            j->ckpt_type = FSDP_STATE_DICT_FULL;
            CU_ASSERT_EQUAL(job_run(j), FSDP_OK);
            CU_ASSERT(same_file(one, full, "model.safetensors", what));
            CU_ASSERT(same_file(one, full, "optimizer.safetensors", what));
            CU_ASSERT_EQUAL(fsdp_checkpoint_consolidate(sh[i], cons, NULL), FSDP_OK);
            gb = file_bytes(cons, &n_got);
            CU_ASSERT(wb != NULL && gb != NULL && n_got == n_want && memcmp(wb, gb, n_want) == 0);
            free(gb);
        }
        free(wb);
    }
    /* a local checkpoint holds tp slices: another tp is refused */
    j->world = 4;
    j->tp = 2;
    j->fsdp1 = 0;
    j->ckpt_load = NULL;
    j->ckpt_save = full;
    j->ckpt_type = FSDP_STATE_DICT_LOCAL;
    CU_ASSERT_EQUAL(job_run(j), FSDP_OK);
    j->tp = 4;
    j->ckpt_load = full;
    j->ckpt_save = NULL;
    fsdp_log_set_level(FSDP_LOG_OFF);
    CU_ASSERT_EQUAL(job_run(j), FSDP_ERR_FORMAT);
    fsdp_log_set_level(FSDP_LOG_WARN);
    snprintf(want_rm, sizeof(want_rm), "rm -rf '%s'", top);
    CU_ASSERT_EQUAL(system(want_rm), 0);
    free(j);
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

/* One traced step of 2 x 32 tokens at tp 2, dp 1 (the vocabulary-parallel loss when lp): rank
 * 0's events through fn into s, whose group is then the tp group. */
static void traced_step(int lp, fsdp_trace_event_func_t fn, seen_t *s)
{
    char path[] = "/tmp/fsdp-tp-trace-XXXXXX";
    fsdp_trace_run_info_t info = {.backend = "sim", .world_size = 2};
    fsdp_tokens_t *t = lm_test_parity_tokens();
    job_t *j = calloc(1, sizeof(*j));
    fsdp_trace_reader_t *rd;
    int64_t run = 0;
    int fd = mkstemp(path);

    CU_ASSERT_FATAL(fd >= 0);
    close(fd);
    unlink(path);
    job_init(j, t, 2, 2);
    j->batch = 2;
    j->steps = 1;
    j->loss_parallel = lp;
    CU_ASSERT_EQUAL_FATAL(fsdp_trace_open(path, &info, &j->trace), FSDP_OK);
    CU_ASSERT_EQUAL(job_run(j), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_trace_close(j->trace), FSDP_OK);
    s->group = j->tp_group;
    CU_ASSERT_EQUAL_FATAL(fsdp_trace_reader_open(path, &rd), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_trace_reader_find_run(rd, 0, &run), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_trace_reader_events(rd, run, 0, fn, s), FSDP_OK);
    fsdp_trace_reader_close(rd);
    unlink(path);
    free(j);
    fsdp_tokens_close(t);
}

/* tp 2, dp 1, f32, a batch of 2 x 32: the tp group's collectives of layer 0, in order. Forward
 * (torchtitan's plan): all-gather of the attention norm's [B T / 2, D] shard, reduce-scatter of
 * o's partial [B T, D], the same around the MLP; backward: all-gather of the output gradient
 * before down's backward, reduce-scatter of the MLP input's gradient, then attention's; in the
 * post-backward hook, before FSDP's reduce-scatter, the two norms' gradients all-reduced over tp
 * (FSDPParam's redistribution of their partial gradients). Counts are elements per rank. */
static void test_layer_collectives(void)
{
    seen_t *s = calloc(1, sizeof(*s));
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

    traced_step(0, collect, s);
    if (s->n != (int)(sizeof(want) / sizeof(want[0])))
        for (int i = 0; i < s->n; i++)
            fprintf(stderr, "\n  event %d: '%s'", i, s->ev[i]);
    CU_ASSERT_EQUAL(s->n, (int)(sizeof(want) / sizeof(want[0])));
    for (int i = 0; i < s->n && i < (int)(sizeof(want) / sizeof(want[0])); i++) {
        if (strcmp(s->ev[i], want[i]) != 0)
            fprintf(stderr, "\n  event %d: got '%s', want '%s'", i, s->ev[i], want[i]);
        CU_ASSERT_STRING_EQUAL(s->ev[i], want[i]);
    }
    free(s);
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
 * shard, its output (all-gathered under tp: [BT, D]) and the logits, all-gathered [BT, V], or
 * this rank's [BT, V / t] under the vocabulary-parallel loss (lp). */
static size_t act_peak(const fsdp_llama_config_t *c, size_t B, size_t T, size_t t, int lp)
{
    const size_t D = (size_t)c->dim, hd = (size_t)fsdp_llama_head_dim(c), V = (size_t)c->vocab_size;
    const size_t BT = B * T, rows = BT / t, H = (size_t)c->n_head / t, K = (size_t)c->n_kv_head / t;
    const size_t F = (size_t)c->ffn_dim / t, L = (size_t)c->n_layer;
    size_t layer = 2 * r512(BT * D * 4) + 2 * r512(rows * 4) + 2 * r512(BT * H * hd * 4) +
                   2 * r512(BT * K * hd * 4) + r512(B * H * T * 4) + r512(rows * D * 4) +
                   3 * r512(BT * F * 4);
    size_t batch = (t > 1 ? 3 : 2) * r512(BT * 4) + 2 * r512(T * hd / 2 * 4);

    return batch + (L + 1) * r512(rows * D * 4) + L * layer + r512(rows * 4) + r512(BT * D * 4) +
           r512(BT * (lp ? V / t : V) * 4);
}

/* Shape mode, one AdamW step of a batch of 2 x 64 per dp rank: the sharded parameters and the
 * optimizer state (two tensors per unit) are the closed form's shards, the activations' peak
 * is act_peak, at tp 1, 2, 4 with dp 1 and at tp 2 with dp 2. */
static void test_memory_closed_form(void)
{
    static const int runs[][3] = {{1, 1, 0}, {2, 2, 0}, {4, 4, 0}, {4, 2, 0}, {4, 4, 1}};
    job_t *j = calloc(1, sizeof(*j));

    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
        const size_t t = (size_t)runs[i][1], d = (size_t)(runs[i][0] / runs[i][1]);
        size_t params = 0, act;
        job_init(j, NULL, runs[i][0], runs[i][1]);
        j->loss_parallel = runs[i][2];
        CU_ASSERT_EQUAL_FATAL(fsdp_llama_config_parse("llama:kv_heads=4,ffn=128", &j->cfg),
                              FSDP_OK);
        j->shape = 1;
        j->steps = 1;
        j->batch = 2 * d;
        j->seq = 64;
        CU_ASSERT_EQUAL_FATAL(job_run(j), FSDP_OK);
        for (int l = -1; l < j->cfg.n_layer; l++)
            params += r512(shard_numel(&j->cfg, l, t, d) * 4);
        act = act_peak(&j->cfg, 2, 64, t, j->loss_parallel);
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

enum { R_FSDP1, R_GROUP, R_NODE, R_HEADS, R_SEQ, R_GPT2, R_COUNT };

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
    fc.process_group = fsdp_dev_group_world(dev); /* the groups are tp_size's to make */
    got[R_GROUP] = try_config(dev, &fc);
    fc.process_group = NULL;
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
    fsdp_lm_destroy(m);
    fsdp_destroy(fs);
    fs = NULL;
    m = NULL;
    if (fsdp_create(dev, &fc, &fs) != FSDP_OK)
        return FSDP_ERR_INTERNAL;
    fsdp_gpt2_config_parse("gpt2:heads=1", &gc); /* tp 2 does not divide 1 head */
    got[R_GPT2] = fsdp_gpt2_create(fs, &gc, &m);
    fsdp_lm_destroy(m);
    fsdp_destroy(fs);
    return FSDP_OK;
}

/* fsdp1, a process group given with tp, a tp larger than a node, and a tp that does not divide
 * Llama's kv heads, the sequence or GPT-2's heads are refused, each with its line. */
static void test_refusals(void)
{
    static const fsdp_status_t want[R_COUNT] = {FSDP_ERR_INVALID_PARAM, FSDP_ERR_INVALID_PARAM,
                                                FSDP_ERR_INVALID_PARAM, FSDP_ERR_INVALID_PARAM,
                                                FSDP_ERR_INVALID_PARAM, FSDP_ERR_INVALID_PARAM};
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

/* Between the root's post-forward and pre-backward hooks: the loss's collectives over tp. */
static int collect_loss(void *arg, int rank, uint64_t seq, const fsdp_trace_event_t *ev)
{
    seen_t *s = arg;
    (void)rank, (void)seq;
    if (ev->kind == FSDP_EV_HOOK && ev->unit != NULL && strcmp(ev->unit, "model") == 0)
        s->in_layer = strcmp(ev->name, "post_forward") == 0;
    else if (ev->kind == FSDP_EV_COLLECTIVE && s->in_layer && ev->group != NULL &&
             strcmp(ev->group, s->group) == 0 && s->n < MAX_EV)
        snprintf(s->ev[s->n++], sizeof(s->ev[0]), "%s %llu %s", ev->name,
                 (unsigned long long)ev->count, fsdp_dtype_name((fsdp_dtype_t)ev->dtype));
    return 0;
}

/* The vocabulary-parallel loss at tp 2, 2 x 32 tokens: torch's loss_parallel all-reduces the
 * rows' maximum, their sums of exponentials and their targets' logits (64 f32 each), in that
 * order; without it the loss runs no collective (the logits came all-gathered). */
static void test_loss_parallel_collectives(void)
{
    for (int lp = 0; lp <= 1; lp++) {
        seen_t *s = calloc(1, sizeof(*s));
        traced_step(lp, collect_loss, s);
        CU_ASSERT_EQUAL(s->n, lp ? 3 : 0);
        for (int i = 0; i < s->n; i++)
            CU_ASSERT_STRING_EQUAL(s->ev[i], "all_reduce 64 f32");
        free(s);
    }
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"f32 at tp 2 and 4, dp 1 and 2, equals one process within summation order", test_parity},
        {"GPT-2 at tp 2 and 4, dp 1 and 2, equals one process within summation order",
         test_gpt2_parity},
        {"clip_grad_norm under tp clips as one process", test_clip},
        {"init, HF load and HF save under tp: one process's values, bit for bit",
         test_init_and_load},
        {"one layer's tp collectives: op, size, group, order", test_layer_collectives},
        {"the vocabulary-parallel loss's collectives", test_loss_parallel_collectives},
        {"memory per rank: TP's shards and SP's activations in closed form",
         test_memory_closed_form},
        {"bf16 at tp 2 within bf16's roundoff of f32", test_bf16},
        {"full and sharded checkpoints under tp: one process's bytes, any layout from any other",
         test_checkpoints},
        {"refusals: fsdp1, a given group, a node, heads, seq", test_refusals},
        {NULL, NULL},
    };
    fsdp_log_set_level(FSDP_LOG_WARN);
    return fsdp_test_run("tp", tests);
}
