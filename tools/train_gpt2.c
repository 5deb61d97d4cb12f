/* fsdp-train --model gpt2... or llama...: trains GPT-2 or Llama on simulated ranks (or GPUs), on
 * byte-level text (--data, or the project's own sources by default) or an llm.c token shard
 * (--tokens). The two models differ here only in the calls of lm_* below.
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
#include "progress.h"
#include "train_gpt2.h"
#include "train_launch.h"
#include "train_trace.h"

typedef struct gpt2_shared {
    const gpt2_train_opts_t *o;
    fsdp_tokens_t *tokens;
    fsdp_gpt2_weights_t *weights; /* --init, or NULL */
    fsdp_llama_weights_t *llama_weights;
    size_t *peak;                 /* per rank */
    int64_t steps_run;            /* rank 0's, for tokens/s */
    int64_t resumed_step;         /* rank 0's: the step --resume loaded */
    fsdp_trace_t *trace;          /* --trace, or NULL */
    double first_loss, last_loss; /* rank 0's */
    double sim_time;              /* rank 0's simulated seconds over the steps run */
} gpt2_shared_t;

/* The model of the run: GPT-2 or Llama. */
typedef struct lm {
    fsdp_gpt2_t *gpt;
    fsdp_llama_t *llama;
} lm_t;

static fsdp_status_t lm_create(const gpt2_train_opts_t *o, fsdp_t *fs, lm_t *m)
{
    fsdp_status_t status = o->llama ? fsdp_llama_create(fs, &o->llama_model, &m->llama)
                                    : fsdp_gpt2_create(fs, &o->model, &m->gpt);
    int layers = o->llama ? o->llama_model.n_layer : o->model.n_layer;
    int every = o->checkpoint_activations;

    if (status == FSDP_OK && every == CLI_AC_SELECTIVE_OP) /* llama only (checked) */
        status = fsdp_llama_set_checkpointing(m->llama, -1, FSDP_LLAMA_CKPT_SELECTIVE_OP);
    /* every K-th layer, as torchtitan's selective layer checkpointing counts them (1-based) */
    for (int l = every - 1; status == FSDP_OK && every > 0 && l < layers; l += every)
        status = o->llama ? fsdp_llama_set_checkpointing(m->llama, l, FSDP_LLAMA_CKPT_FULL)
                          : fsdp_gpt2_set_checkpointing(m->gpt, l, 1);
    return status;
}

static void lm_destroy(lm_t *m)
{
    fsdp_gpt2_destroy(m->gpt);
    fsdp_llama_destroy(m->llama);
}

static int lm_vocab(const gpt2_train_opts_t *o)
{
    return o->llama ? o->llama_model.vocab_size : o->model.vocab_size;
}

/* The mean of every rank's value (each rank counts the same number of targets). */
static fsdp_status_t global_mean(fsdp_dev_t *dev, fsdp_t *fs, float *dbuf, float *value)
{
    fsdp_stream_t *s = fsdp_compute_stream(fs);
    fsdp_status_t status = fsdp_dev_memcpy_async(dev, dbuf, value, sizeof(float), s);
    if (status == FSDP_OK)
        status = fsdp_dev_all_reduce(dev, fsdp_dev_group_world(dev), dbuf, dbuf, 1, FSDP_DTYPE_F32,
                                     FSDP_REDUCE_AVG, s);
    if (status == FSDP_OK)
        status = fsdp_dev_memcpy_async(dev, value, dbuf, sizeof(float), s);
    if (status == FSDP_OK)
        status = fsdp_dev_stream_synchronize(dev, s);
    return status;
}

static fsdp_status_t gpt2_rank(fsdp_dev_t *dev, void *arg)
{
    gpt2_shared_t *sh = arg;
    const gpt2_train_opts_t *o = sh->o;
    const size_t rows = (size_t)o->batch / (size_t)o->world, T = (size_t)o->seq;
    const size_t micro = rows / (size_t)o->grad_accum;
    fsdp_batch_spec_t spec = {(size_t)o->batch, T, dev->rank, o->world, o->seed};
    int32_t *inputs = malloc(rows * T * sizeof(int32_t));
    int32_t *targets = malloc(rows * T * sizeof(int32_t));
    fsdp_t *fs = NULL;
    lm_t m = {NULL, NULL};
    fsdp_optim_t *opt = NULL;
    float *dloss = NULL;
    int64_t first_step = 0;
    fsdp_mem_stats_t st;
    fsdp_status_t status;

    if (inputs == NULL || targets == NULL) {
        free(inputs);
        free(targets);
        return FSDP_ERR_NO_MEMORY;
    }
    status = sh->trace != NULL ? fsdp_trace_attach(sh->trace, dev) : FSDP_OK;
    if (status == FSDP_OK)
        status = fsdp_create(dev, &o->fsdp, &fs);
    if (status == FSDP_OK)
        status = lm_create(o, fs, &m);
    if (status == FSDP_OK)
        status = sh->llama_weights != NULL ? fsdp_llama_load_weights(m.llama, sh->llama_weights)
                 : o->llama                ? fsdp_llama_init_params(m.llama, o->seed)
                 : sh->weights != NULL     ? fsdp_gpt2_load_weights(m.gpt, sh->weights)
                                           : fsdp_gpt2_init_params(m.gpt, o->seed);
    if (status == FSDP_OK)
        status = fsdp_optim_create(fs, &o->optim, &opt);
    if (status == FSDP_OK)
        status = fsdp_mem_alloc(fsdp_memory(fs), sizeof(float), FSDP_MEM_TEMPORARY,
                                fsdp_compute_stream(fs), (void **)&dloss);
    if (status == FSDP_OK && o->resume_dir != NULL) {
        status = fsdp_checkpoint_load(fs, opt, o->resume_dir, &first_step);
        if (status == FSDP_OK && dev->rank == 0) {
            sh->resumed_step = first_step;
            train_resumed(dev, o->resume_dir, first_step, o->quiet);
        }
    }
    if (m.gpt != NULL)
        fsdp_gpt2_set_loss_scale(m.gpt, 1.0f / (float)o->grad_accum);
    if (m.llama != NULL)
        fsdp_llama_set_loss_scale(m.llama, 1.0f / (float)o->grad_accum);
    for (int64_t step = first_step; step < o->steps && status == FSDP_OK; step++) {
        float loss = 0.0f;
        train_step_clock_t clock;
        double wall0 = train_wall_now();
        train_step_begin(dev, &clock);
        status = fsdp_tokens_batch(sh->tokens, &spec, step, inputs, targets);
        /* gradient accumulation: no_sync for all micro-batches but the last */
        for (int k = 0; k < o->grad_accum && status == FSDP_OK; k++) {
            float micro_loss = 0.0f;
            status = fsdp_set_sync_gradients(fs, k == o->grad_accum - 1);
            if (status == FSDP_OK && o->llama)
                status = fsdp_llama_forward_backward(m.llama, inputs + (size_t)k * micro * T,
                                                     targets + (size_t)k * micro * T, micro, T,
                                                     &micro_loss);
            else if (status == FSDP_OK)
                status = fsdp_gpt2_forward_backward(m.gpt, inputs + (size_t)k * micro * T,
                                                    targets + (size_t)k * micro * T, micro, T,
                                                    &micro_loss);
            loss += micro_loss / (float)o->grad_accum;
        }
        if (status == FSDP_OK && o->clip_grad_norm > 0.0)
            status = fsdp_clip_grad_norm(fs, o->clip_grad_norm, 2.0, NULL);
        if (status == FSDP_OK)
            status = fsdp_optim_step(opt);
        fsdp_zero_grad(fs);
        if (status == FSDP_OK && o->ckpt_dir != NULL &&
            ((o->ckpt_every > 0 && (step + 1) % o->ckpt_every == 0) || step + 1 == o->steps))
            status = fsdp_checkpoint_save(fs, opt, o->ckpt_dir, o->state_dict, step + 1);
        if (status == FSDP_OK)
            status = global_mean(dev, fs, dloss, &loss);
        double sim_dt = status == FSDP_OK ? train_step_end(dev, fs, &clock, step + 1, loss) : 0;
        if (status == FSDP_OK && dev->rank == 0) {
            double wall = train_wall_now() - wall0;
            fsdp_mem_get_stats(fsdp_memory(fs), &st);
            if (sh->steps_run == 0)
                sh->first_loss = loss;
            sh->last_loss = loss;
            sh->steps_run++;
            sh->sim_time += sim_dt;
            if (!o->quiet) {
                char note[32];
                train_step_line(sh->trace, o->launch, step + 1, (double)loss, "tok/s",
                                wall > 0 ? (double)o->batch * (double)T / wall : 0.0, sim_dt,
                                st.peak_allocated);
                snprintf(note, sizeof(note), "loss %.4f", (double)loss);
                progress_update(step + 1, note);
            }
        }
    }
    if (status == FSDP_OK && o->save_path != NULL)
        status = o->llama ? fsdp_llama_save_weights(m.llama, o->save_path)
                          : fsdp_gpt2_save_weights(m.gpt, o->save_path, FSDP_GPT2_SAVE_PREFIXED);
    if (fs != NULL) {
        fsdp_mem_get_stats(fsdp_memory(fs), &st);
        sh->peak[dev->rank] = st.peak_allocated;
        fsdp_mem_free(fsdp_memory(fs), dloss);
    }
    fsdp_optim_destroy(opt);
    lm_destroy(&m);
    fsdp_destroy(fs);
    fsdp_trace_detach(dev);
    free(inputs);
    free(targets);
    return status;
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
static int write_hf_config(const gpt2_train_opts_t *o, char *out, size_t n)
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
        write_llama_config(f, &o->llama_model);
    else
        write_gpt2_config(f, &o->model);
    return fclose(f) == 0 ? 0 : -1;
}

/* The token source the options name: --tokens, --data, or the default corpus. */

static fsdp_status_t open_tokens(const gpt2_train_opts_t *o, fsdp_tokens_t **t_p)
{
    if (o->tokens_path != NULL)
        return fsdp_tokens_open_llmc(o->tokens_path, t_p);
    if (o->data_path != NULL)
        return fsdp_tokens_open_text(o->data_path, t_p);
    return corpus_open_default(o->argv0, t_p);
}

int gpt2_train_main(const gpt2_train_opts_t *o)
{
    gpt2_shared_t sh = {.o = o};
    const int report = train_launch_reports(o->launch);
    char trace_buf[4096];
    const char *trace_path = train_launch_trace_path(o->launch, o->trace_path, trace_buf,
                                                     sizeof(trace_buf));
    fsdp_batch_spec_t spec = {(size_t)o->batch, (size_t)o->seq, 0, o->world, o->seed};
    fsdp_status_t status;
    double t0, dt;
    int rc = 2;

    if (train_launch_check_host(o->launch, o->model_name,
                                o->llama ? fsdp_llama_num_params(&o->llama_model)
                                         : fsdp_gpt2_num_params(&o->model),
                                &o->optim) != 0)
        return 1;
    if (open_tokens(o, &sh.tokens) != FSDP_OK)
        return 2; /* the library said why */
    if (fsdp_tokens_max_id(sh.tokens) >= (uint32_t)lm_vocab(o)) {
        cli_error("%s: token ids reach %u, beyond the model's vocabulary of %d "
                  "(set vocab=%u or more, e.g. --model %s)",
                  fsdp_tokens_source(sh.tokens), fsdp_tokens_max_id(sh.tokens), lm_vocab(o),
                  fsdp_tokens_max_id(sh.tokens) + 1,
                  o->llama ? "llama3-8b for Llama 3's tokenizer" : "gpt2 for GPT-2's tokenizer");
        goto out;
    }
    if (fsdp_tokens_check_spec(sh.tokens, &spec) != FSDP_OK)
        goto out;
    if (o->init_path != NULL &&
        (o->llama ? fsdp_llama_weights_open(o->init_path, &o->llama_model, &sh.llama_weights)
                  : fsdp_gpt2_weights_open(o->init_path, &o->model, &sh.weights)) != FSDP_OK)
        goto out;
    sh.peak = calloc((size_t)o->world, sizeof(size_t));
    if (sh.peak == NULL) {
        cli_error("out of host memory");
        goto out;
    }
    if (!o->quiet && report && o->llama) {
        const fsdp_llama_config_t *c = &o->llama_model;
        printf("model %s: %llu parameters (layers=%d heads=%d kv_heads=%d dim=%d ffn=%d seq=%d "
               "vocab=%d%s%s); data: %s, %zu tokens; global batch %d x %d on %d ranks, %s\n",
               o->model_name, (unsigned long long)fsdp_llama_num_params(c), c->n_layer, c->n_head,
               c->n_kv_head, c->dim, c->ffn_dim, c->max_seq, c->vocab_size,
               c->tie_word_embeddings ? " tied" : "", c->rope_scaling ? " rope_scaling=llama3" : "",
               fsdp_tokens_source(sh.tokens), fsdp_tokens_count(sh.tokens), o->batch, o->seq,
               o->world, fsdp_strategy_name(o->fsdp.strategy));
        fflush(stdout);
    } else if (!o->quiet && report) {
        printf("model %s: %llu parameters (layers=%d heads=%d dim=%d seq=%d vocab=%d); data: %s, "
               "%zu tokens; global batch %d x %d on %d ranks, %s\n",
               o->model_name, (unsigned long long)fsdp_gpt2_num_params(&o->model), o->model.n_layer,
               o->model.n_head, o->model.n_embd, o->model.n_positions, o->model.vocab_size,
               fsdp_tokens_source(sh.tokens), fsdp_tokens_count(sh.tokens), o->batch, o->seq,
               o->world, fsdp_strategy_name(o->fsdp.strategy));
        fflush(stdout);
    }
    if (train_trace_open(trace_path, o->launch, &o->fsdp, o->model_name, o->argc, o->argv,
                         &sh.trace) != FSDP_OK)
        goto out;
    t0 = train_wall_now();
    if (!o->quiet && report)
        progress_start(o->steps, "step", "setting up");
    status = train_launch_run(o->launch, gpt2_rank, &sh);
    progress_end();
    dt = train_wall_now() - t0;
    if (fsdp_trace_close(sh.trace) != FSDP_OK && status == FSDP_OK)
        status = FSDP_ERR_IO;
    sh.trace = NULL;
    train_print_rest();
    if (status != FSDP_OK || /* the failing rank logged why; its peers only saw it fail */
        (report && train_resume_past_end(o->resume_dir, sh.resumed_step, o->steps))) {
        rc = 1;
        goto out;
    }
    if (report) {
        train_totals_t t = {.unit = "tokens",
                            .items = (double)sh.steps_run * (double)o->batch * (double)o->seq,
                            .wall_s = dt,
                            .steps_run = sh.steps_run,
                            .first_loss = sh.first_loss,
                            .last_loss = sh.last_loss,
                            .step_time_sum = sh.sim_time,
                            .profile_name = o->profile->name};
        train_report_totals(o->launch, &t);
    }
    /* on the gpu backend each process knows its own rank's peak */
    for (int r = 0; r < o->world; r++) {
        if (o->launch->backend == TRAIN_BACKEND_SIM || r == o->launch->rank)
            printf("rank %d peak allocated %zu bytes\n", r, sh.peak[r]);
    }
    if (o->save_path != NULL && report) {
        char cfg_path[4096];
        if (write_hf_config(o, cfg_path, sizeof(cfg_path)) != 0) {
            cli_error("cannot write %s beside %s", cfg_path, o->save_path);
            rc = 1;
            goto out;
        }
        printf("saved %s (HF config %s)\n", o->save_path, cfg_path);
    }
    train_report_outputs(report ? o->ckpt_dir : NULL, trace_path);
    rc = 0;
out:
    fsdp_trace_close(sh.trace);
    free(sh.peak);
    fsdp_gpt2_weights_close(sh.weights);
    fsdp_llama_weights_close(sh.llama_weights);
    fsdp_tokens_close(sh.tokens);
    return rc;
}
