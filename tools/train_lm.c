/* fsdp-train --model gpt2... or llama...: a language model (lm.h), GPT-2 or Llama, as
 * train_loop.c drives it, on byte-level text (--data, or the project's own sources by default)
 * or an llm.c token shard (--tokens). The two families differ here only in their configuration,
 * their --init checkpoints and their HF config.json.
 *
 * Every rank reads only its rows of each global batch (include/fsdp/data.h); the loss printed
 * per step is the mean over the global batch. A checkpoint or an HF file is read once, on the
 * main thread, so that a bad one is reported once; the ranks share it read-only. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "corpus.h"
#include "train_loop.h"

typedef struct lm_shared {
    const train_args_t *args;
    fsdp_tokens_t *tokens;
    fsdp_lm_weights_t *weights; /* --init, or NULL */
} lm_shared_t;

/* A rank's model and its rows of each step. */
typedef struct lm_rank {
    const lm_shared_t *sh;
    fsdp_lm_t *lm;
    fsdp_batch_spec_t spec;
    size_t micro, seq;         /* rows of a micro-batch, tokens per row */
    int32_t *inputs, *targets; /* the rank's rows of the step */
} lm_rank_t;

static fsdp_status_t lm_create(const void *shared, fsdp_t *fs, void **model_p)
{
    const lm_shared_t *sh = shared;
    const train_args_t *a = sh->args;
    /* the tp ranks of one dp rank read the same rows */
    const size_t rows = (size_t)a->batch / (size_t)a->dp, T = (size_t)a->seq;
    const int tp = a->fsdp.tp_size > 1 ? a->fsdp.tp_size : 1;
    const int every = a->checkpoint_activations;
    lm_rank_t *r = calloc(1, sizeof(*r));
    fsdp_status_t status;

    *model_p = r;
    if (r == NULL)
        return FSDP_ERR_NO_MEMORY;
    r->sh = sh;
    r->spec = (fsdp_batch_spec_t){(size_t)a->batch, T, fsdp_device(fs)->rank / tp, a->dp, a->seed};
    r->micro = rows / (size_t)a->grad_accum;
    r->seq = T;
    r->inputs = malloc(rows * T * sizeof(int32_t));
    r->targets = malloc(rows * T * sizeof(int32_t));
    if (r->inputs == NULL || r->targets == NULL)
        return FSDP_ERR_NO_MEMORY;
    status = a->llama ? fsdp_llama_create(fs, &a->llama_cfg, &r->lm)
                      : fsdp_gpt2_create(fs, &a->gpt_cfg, &r->lm);
    if (status == FSDP_OK && every == CLI_AC_SELECTIVE_OP) /* llama only (checked) */
        status = fsdp_lm_set_checkpointing(r->lm, -1, FSDP_LM_CKPT_SELECTIVE_OP);
    /* every K-th layer, as torchtitan's selective layer checkpointing counts them (1-based) */
    for (int l = every - 1; status == FSDP_OK && every > 0 && l < fsdp_lm_num_layers(r->lm);
         l += every)
        status = fsdp_lm_set_checkpointing(r->lm, l, FSDP_LM_CKPT_FULL);
    if (status == FSDP_OK)
        status = sh->weights != NULL ? fsdp_lm_load_weights(r->lm, sh->weights)
                                     : fsdp_lm_init_params(r->lm, a->seed);
    return status;
}

static void lm_set_loss_scale(void *model, float scale)
{
    fsdp_lm_set_loss_scale(((lm_rank_t *)model)->lm, scale);
}

static fsdp_status_t lm_batch(void *model, int64_t step)
{
    lm_rank_t *r = model;
    return fsdp_tokens_batch(r->sh->tokens, &r->spec, step, r->inputs, r->targets);
}

static fsdp_status_t lm_forward_backward(void *model, int k, int n, float *loss_p)
{
    lm_rank_t *r = model;
    size_t first = (size_t)k * r->micro * r->seq;

    (void)n;
    return fsdp_lm_forward_backward(r->lm, r->inputs + first, r->targets + first, r->micro, r->seq,
                                    loss_p);
}

static fsdp_status_t lm_save(void *model, const char *path)
{
    return fsdp_lm_save_weights(((lm_rank_t *)model)->lm, path);
}

static void lm_destroy(void *model)
{
    lm_rank_t *r = model;
    if (r == NULL)
        return;
    fsdp_lm_destroy(r->lm);
    free(r->inputs);
    free(r->targets);
    free(r);
}

/* GPT2Config's fields for this shape, the rest its defaults (no dropout here, but HF's defaults
 * are what a fine-tune expects). */
static void write_gpt2_config(FILE *f, const fsdp_gpt2_config_t *c)
{
    fprintf(f,
            "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
            "  \"vocab_size\": %d,\n  \"n_positions\": %d,\n  \"n_ctx\": %d,\n"
            "  \"n_embd\": %d,\n  \"n_layer\": %d,\n  \"n_head\": %d,\n  \"n_inner\": null,\n"
            "  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": %g,\n"
            "  \"initializer_range\": %g,\n  \"resid_pdrop\": 0.1,\n  \"embd_pdrop\": 0.1,\n"
            "  \"attn_pdrop\": 0.1,\n  \"scale_attn_weights\": true,\n"
            "  \"tie_word_embeddings\": true,\n  \"bos_token_id\": %d,\n"
            "  \"eos_token_id\": %d,\n  \"torch_dtype\": \"float32\"\n}\n",
            c->vocab_size, c->n_positions, c->n_positions, c->n_embd, c->n_layer, c->n_head,
            (double)c->layer_norm_eps, (double)c->initializer_range, c->vocab_size - 1,
            c->vocab_size - 1);
}

/* LlamaConfig's fields for this shape (HF's defaults for the token ids). */
static void write_llama_config(FILE *f, const fsdp_llama_config_t *c)
{
    fprintf(f,
            "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
            "  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n"
            "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n"
            "  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n"
            "  \"max_position_embeddings\": %d,\n  \"hidden_act\": \"silu\",\n"
            "  \"rms_norm_eps\": %g,\n  \"rope_theta\": %.17g,\n  \"initializer_range\": %g,\n"
            "  \"attention_bias\": false,\n  \"mlp_bias\": false,\n"
            "  \"tie_word_embeddings\": %s,\n  \"torch_dtype\": \"float32\",\n",
            c->vocab_size, c->dim, c->ffn_dim, c->n_layer, c->n_head, c->n_kv_head,
            fsdp_llama_head_dim(c), c->max_seq, (double)c->rms_norm_eps, c->rope_theta,
            (double)c->initializer_range, c->tie_word_embeddings ? "true" : "false");
    if (c->rope_scaling)
        fprintf(f,
                "  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": %.17g, "
                "\"low_freq_factor\": %.17g, \"high_freq_factor\": %.17g, "
                "\"original_max_position_embeddings\": %d}\n}\n",
                c->rope_factor, c->rope_low_freq_factor, c->rope_high_freq_factor,
                c->rope_original_max_seq);
    else
        fprintf(f, "  \"rope_scaling\": null\n}\n");
}

/* HF's config.json beside saved weights, so that GPT2LMHeadModel or LlamaForCausalLM's
 * from_pretrained(DIR) reads a directory whose weights are DIR/model.safetensors. */
static int write_hf_config(const train_args_t *o, char *out, size_t n)
{
    const char *slash = strrchr(o->save_path, '/');
    FILE *f;

    if (slash == NULL)
        snprintf(out, n, "config.json");
    else
        snprintf(out, n, "%.*s/config.json", (int)(slash - o->save_path), o->save_path);
    f = fopen(out, "w");
    if (f == NULL)
        return -1;
    if (o->llama)
        write_llama_config(f, &o->llama_cfg);
    else
        write_gpt2_config(f, &o->gpt_cfg);
    return fclose(f) == 0 ? 0 : -1;
}

/* HF's config.json beside the saved weights, and the report's line. */
static int lm_report_save(const train_args_t *a)
{
    char cfg_path[4096];

    if (write_hf_config(a, cfg_path, sizeof(cfg_path)) != 0) {
        cli_error("cannot write %s beside %s", cfg_path, a->save_path);
        return 1;
    }
    printf("saved %s (HF config %s)\n", a->save_path, cfg_path);
    return 0;
}

static const train_model_ops_t lm_ops = {
    .create = lm_create,
    .set_loss_scale = lm_set_loss_scale,
    .batch = lm_batch,
    .forward_backward = lm_forward_backward,
    .save = lm_save,
    .destroy = lm_destroy,
    .report_save = lm_report_save,
};

/* The token source the options name: --tokens, --data, or the default corpus. */
static fsdp_status_t open_tokens(const train_args_t *a, char **argv, uint64_t params,
                                 fsdp_tokens_t **t_p)
{
    size_t max_bytes = train_launch_data_bytes(&a->launch, params, &a->optim);

    if (a->tokens_path != NULL)
        return fsdp_tokens_open_llmc(a->tokens_path, max_bytes, t_p);
    if (a->data_path != NULL)
        return fsdp_tokens_open_text(a->data_path, max_bytes, t_p);
    return corpus_open_default(argv[0], t_p);
}

/* The line that opens the run: the model's shape, the data and the batch. */
static void print_model(const train_args_t *a, const fsdp_tokens_t *tokens)
{
    fsdp_sim_profile_t cluster;
    char mesh[64];
    int per_node = a->launch.info.local_size > 0 ? a->launch.info.local_size : a->world;

    if (a->launch.backend == TRAIN_BACKEND_SIM) {
        train_launch_sim_profile(&a->launch, &cluster);
        per_node = cluster.gpus_per_node;
    }
    cli_mesh(mesh, sizeof(mesh), a->world, per_node, &a->fsdp);
    if (a->llama) {
        const fsdp_llama_config_t *c = &a->llama_cfg;
        printf("model %s: %llu parameters (layers=%d heads=%d kv_heads=%d dim=%d ffn=%d seq=%d "
               "vocab=%d%s%s); data: %s, %zu tokens; global batch %d x %d on %d ranks%s, %s\n",
               a->model_name, (unsigned long long)fsdp_llama_num_params(c), c->n_layer, c->n_head,
               c->n_kv_head, c->dim, c->ffn_dim, c->max_seq, c->vocab_size,
               c->tie_word_embeddings ? " tied" : "", c->rope_scaling ? " rope_scaling=llama3" : "",
               fsdp_tokens_source(tokens), fsdp_tokens_count(tokens), a->batch, a->seq, a->world,
               mesh, fsdp_strategy_name(a->fsdp.strategy));
    } else {
        const fsdp_gpt2_config_t *c = &a->gpt_cfg;
        printf("model %s: %llu parameters (layers=%d heads=%d dim=%d seq=%d vocab=%d); data: %s, "
               "%zu tokens; global batch %d x %d on %d ranks%s, %s\n",
               a->model_name, (unsigned long long)fsdp_gpt2_num_params(c), c->n_layer, c->n_head,
               c->n_embd, c->n_positions, c->vocab_size, fsdp_tokens_source(tokens),
               fsdp_tokens_count(tokens), a->batch, a->seq, a->world, mesh,
               fsdp_strategy_name(a->fsdp.strategy));
    }
    fflush(stdout);
}

int train_lm_main(const train_args_t *a, int argc, char **argv)
{
    lm_shared_t sh = {.args = a};
    train_model_t m = {.ops = &lm_ops,
                       .shared = &sh,
                       .name = a->model_name,
                       .unit = "tokens",
                       .rate = "tok/s",
                       .step_items = (double)a->batch * (double)a->seq};
    const int vocab = a->llama ? a->llama_cfg.vocab_size : a->gpt_cfg.vocab_size;
    fsdp_batch_spec_t spec = {(size_t)a->batch, (size_t)a->seq, 0, a->dp, a->seed};
    const uint64_t params =
        a->llama ? fsdp_llama_num_params(&a->llama_cfg) : fsdp_gpt2_num_params(&a->gpt_cfg);
    int rc = 2;

    if (train_launch_check_host(&a->launch, a->model_name, params, &a->optim) != 0)
        return 1;
    if (open_tokens(a, argv, params, &sh.tokens) != FSDP_OK)
        return 2; /* the library said why */
    if (fsdp_tokens_max_id(sh.tokens) >= (uint32_t)vocab) {
        cli_error("%s: token ids reach %u, beyond the model's vocabulary of %d "
                  "(set vocab=%u or more, e.g. --model %s)",
                  fsdp_tokens_source(sh.tokens), fsdp_tokens_max_id(sh.tokens), vocab,
                  fsdp_tokens_max_id(sh.tokens) + 1,
                  a->llama ? "llama3-8b for Llama 3's tokenizer" : "gpt2 for GPT-2's tokenizer");
        goto out;
    }
    if (fsdp_tokens_check_spec(sh.tokens, &spec) != FSDP_OK)
        goto out;
    if (a->init_path != NULL &&
        (a->llama ? fsdp_llama_weights_open(a->init_path, &a->llama_cfg, &sh.weights)
                  : fsdp_gpt2_weights_open(a->init_path, &a->gpt_cfg, &sh.weights)) != FSDP_OK)
        goto out;
    if (!a->quiet && train_launch_reports(&a->launch))
        print_model(a, sh.tokens);
    rc = train_loop_run(a, &m, argc, argv);
out:
    fsdp_lm_weights_close(sh.weights);
    fsdp_tokens_close(sh.tokens);
    return rc;
}
