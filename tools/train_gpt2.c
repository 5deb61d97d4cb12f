/* fsdp-train --model gpt2...: trains GPT-2 on simulated ranks, on byte-level text (--data, or
 * the project's own sources by default) or an llm.c token shard (--tokens).
 *
 * Every rank reads only its rows of each global batch (include/fsdp/data.h); the loss printed
 * per step is the mean over the global batch. A checkpoint or an HF file is read once, on the
 * main thread, so that a bad one is reported once; the ranks share it read-only. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "train_gpt2.h"
#include "train_launch.h"
#include "train_trace.h"

typedef struct gpt2_shared {
    const gpt2_train_opts_t *o;
    fsdp_tokens_t *tokens;
    fsdp_gpt2_weights_t *weights; /* --init, or NULL */
    size_t *peak;                 /* per rank */
    int64_t steps_run;            /* rank 0's, for tokens/s */
    fsdp_trace_t *trace;          /* --trace, or NULL */
    double first_loss, last_loss; /* rank 0's */
    double sim_time;              /* rank 0's simulated seconds over the steps run */
} gpt2_shared_t;

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The mean of every rank's value (each rank counts the same number of targets). */
static fsdp_status_t global_mean(fsdp_dev_t *dev, fsdp_t *fs, float *dbuf, float *value)
{
    fsdp_stream_t *s = fsdp_compute_stream(fs);
    fsdp_status_t status = dev->ops->memcpy_async(dev, dbuf, value, sizeof(float), s);
    if (status == FSDP_OK)
        status = dev->ops->all_reduce(dev, dev->ops->group_world(dev), dbuf, dbuf, 1,
                                      FSDP_DTYPE_F32, FSDP_REDUCE_AVG, s);
    if (status == FSDP_OK)
        status = dev->ops->memcpy_async(dev, value, dbuf, sizeof(float), s);
    if (status == FSDP_OK)
        status = dev->ops->stream_synchronize(dev, s);
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
    fsdp_gpt2_t *m = NULL;
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
        status = fsdp_gpt2_create(fs, &o->model, &m);
    if (status == FSDP_OK && o->checkpoint_activations)
        status = fsdp_gpt2_set_checkpointing(m, -1, 1);
    if (status == FSDP_OK)
        status = sh->weights != NULL ? fsdp_gpt2_load_weights(m, sh->weights)
                                     : fsdp_gpt2_init_params(m, o->seed);
    if (status == FSDP_OK)
        status = fsdp_optim_create(fs, &o->optim, &opt);
    if (status == FSDP_OK)
        status = fsdp_mem_alloc(fsdp_memory(fs), sizeof(float), FSDP_MEM_TEMPORARY,
                                fsdp_compute_stream(fs), (void **)&dloss);
    if (status == FSDP_OK && o->resume_dir != NULL)
        status = fsdp_checkpoint_load(fs, opt, o->resume_dir, &first_step);
    if (m != NULL)
        fsdp_gpt2_set_loss_scale(m, 1.0f / (float)o->grad_accum);
    for (int64_t step = first_step; step < o->steps && status == FSDP_OK; step++) {
        float loss = 0.0f;
        train_step_clock_t clock;
        double wall0 = wall_now();
        train_step_begin(dev, &clock);
        status = fsdp_tokens_batch(sh->tokens, &spec, step, inputs, targets);
        /* gradient accumulation: no_sync for all micro-batches but the last */
        for (int k = 0; k < o->grad_accum && status == FSDP_OK; k++) {
            float micro_loss = 0.0f;
            status = fsdp_set_sync_gradients(fs, k == o->grad_accum - 1);
            if (status == FSDP_OK)
                status = fsdp_gpt2_forward_backward(m, inputs + (size_t)k * micro * T,
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
            double wall = wall_now() - wall0;
            fsdp_mem_get_stats(fsdp_memory(fs), &st);
            if (sh->steps_run == 0)
                sh->first_loss = loss;
            sh->last_loss = loss;
            sh->steps_run++;
            sh->sim_time += sim_dt;
            if (!o->quiet) {
                /* tokens/s: this process's wall time; the step time: the simulated device's
                 * (on a GPU, the host's wall clock over the step) */
                train_print_step(
                    sh->trace, step + 1, "step %lld loss %.9g tok/s %.0f %s %.3f peak_mib %.2f\n",
                    (long long)step + 1, (double)loss,
                    wall > 0 ? (double)o->batch * (double)T / wall : 0.0,
                    o->launch->backend == TRAIN_BACKEND_GPU ? "step_ms" : "sim_step_ms",
                    sim_dt * 1e3, (double)st.peak_allocated / 1048576.0);
                train_progress(step + 1, o->steps, loss);
            }
        }
    }
    if (status == FSDP_OK && o->save_path != NULL)
        status = fsdp_gpt2_save_weights(m, o->save_path, FSDP_GPT2_SAVE_PREFIXED);
    if (fs != NULL) {
        fsdp_mem_get_stats(fsdp_memory(fs), &st);
        sh->peak[dev->rank] = st.peak_allocated;
        fsdp_mem_free(fsdp_memory(fs), dloss);
    }
    fsdp_optim_destroy(opt);
    fsdp_gpt2_destroy(m);
    fsdp_destroy(fs);
    fsdp_trace_detach(dev);
    free(inputs);
    free(targets);
    return status;
}

/* The token source the options name: --tokens, --data, or the default corpus. */
static fsdp_status_t open_tokens(const gpt2_train_opts_t *o, fsdp_tokens_t **t_p)
{
    if (o->tokens_path != NULL)
        return fsdp_tokens_open_llmc(o->tokens_path, t_p);
    if (o->data_path != NULL)
        return fsdp_tokens_open_text(o->data_path, t_p);
    return fsdp_tokens_open_default(o->argv0, t_p);
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

    if (open_tokens(o, &sh.tokens) != FSDP_OK)
        return 2; /* the library said why */
    if (fsdp_tokens_max_id(sh.tokens) >= (uint32_t)o->model.vocab_size) {
        fprintf(stderr,
                "fsdp-train: error: %s: token ids reach %u, beyond the model's vocabulary of %d "
                "(set vocab=%u or more, e.g. --model gpt2 for GPT-2's tokenizer)\n",
                fsdp_tokens_source(sh.tokens), fsdp_tokens_max_id(sh.tokens), o->model.vocab_size,
                fsdp_tokens_max_id(sh.tokens) + 1);
        goto out;
    }
    if (fsdp_tokens_check_spec(sh.tokens, &spec) != FSDP_OK)
        goto out;
    if (o->init_path != NULL &&
        fsdp_gpt2_weights_open(o->init_path, &o->model, &sh.weights) != FSDP_OK)
        goto out;
    sh.peak = calloc((size_t)o->world, sizeof(size_t));
    if (sh.peak == NULL) {
        fprintf(stderr, "fsdp-train: error: out of host memory\n");
        goto out;
    }
    if (!o->quiet && report) {
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
    t0 = wall_now();
    status = train_launch_run(o->launch, gpt2_rank, &sh);
    dt = wall_now() - t0;
    if (fsdp_trace_close(sh.trace) != FSDP_OK && status == FSDP_OK)
        status = FSDP_ERR_IO;
    sh.trace = NULL;
    train_print_rest();
    if (status != FSDP_OK) { /* the failing rank logged why; its peers only saw it fail */
        rc = 1;
        goto out;
    }
    if (sh.steps_run > 0 && report) {
        double tokens = (double)sh.steps_run * (double)o->batch * (double)o->seq;
        printf("trained %.0f tokens in %.2f s: %.0f tokens/s\n", tokens, dt,
               dt > 0.0 ? tokens / dt : 0.0);
        if (o->launch->backend == TRAIN_BACKEND_GPU)
            printf("loss %.4f -> %.4f over %lld steps; step time %.3f ms on the gpu backend\n",
                   sh.first_loss, sh.last_loss, (long long)sh.steps_run,
                   sh.sim_time / (double)sh.steps_run * 1e3);
        else
            printf("loss %.4f -> %.4f over %lld steps; simulated step time %.3f ms on %s\n",
                   sh.first_loss, sh.last_loss, (long long)sh.steps_run,
                   sh.sim_time / (double)sh.steps_run * 1e3, o->profile->name);
    }
    /* on the gpu backend each process knows its own rank's peak */
    for (int r = 0; r < o->world; r++) {
        if (o->launch->backend == TRAIN_BACKEND_SIM || r == o->launch->rank)
            printf("rank %d peak allocated %zu bytes\n", r, sh.peak[r]);
    }
    if (o->save_path != NULL && report)
        printf("saved %s\n", o->save_path);
    if (o->ckpt_dir != NULL && report)
        printf("checkpoint %s\n", o->ckpt_dir);
    if (trace_path != NULL)
        printf("trace %s (fsdp-trace summary %s)\n", trace_path, trace_path);
    rc = 0;
out:
    fsdp_trace_close(sh.trace);
    free(sh.peak);
    fsdp_gpt2_weights_close(sh.weights);
    fsdp_tokens_close(sh.tokens);
    return rc;
}
