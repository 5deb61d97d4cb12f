/* A built-in model: GPT-2 (gpt2-tiny) trained on simulated ranks, then saved as a checkpoint.
 *
 * The library's GPT-2 runs every FSDP hook itself (fsdp_lm_forward_backward, lm.h); the program
 * picks the model, the data, the optimizer and what to save. The checkpoint is FULL: rank 0
 * writes DIR/step-N/model.safetensors under HF's GPT-2 names, which transformers reads.
 *
 * Build against an installed libfsdp:
 *     cc gpt2_checkpoint.c $(pkg-config --cflags --libs libfsdp) -o gpt2_checkpoint
 * Run: ./gpt2_checkpoint DIR [TEXT]     (default: a built-in text; 4 ranks, 20 steps)
 */
#include <fsdp/fsdp.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { WORLD = 4, STEPS = 20, BATCH = 8 /* global rows */, SEQ = 32 };

typedef struct job {
    const fsdp_tokens_t *tokens;
    const char *dir;
    float losses[STEPS];
} job_t;

static fsdp_status_t rank_main(fsdp_dev_t *dev, void *arg)
{
    job_t *job = arg;
    const size_t rows = BATCH / WORLD;
    fsdp_batch_spec_t spec = {
        .batch = BATCH, .seq = SEQ, .rank = dev->rank, .world = WORLD, .seed = 7};
    int32_t inputs[BATCH * SEQ], targets[BATCH * SEQ];
    fsdp_gpt2_config_t gcfg = fsdp_gpt2_preset_find("gpt2-tiny")->cfg;
    fsdp_config_t cfg;
    fsdp_optim_config_t ocfg;
    fsdp_t *fs = NULL;
    fsdp_lm_t *model = NULL;
    fsdp_optim_t *opt = NULL;
    fsdp_status_t status;

    fsdp_config_init(&cfg);
    status = fsdp_create(dev, &cfg, &fs);
    if (status != FSDP_OK)
        return status;
    status = fsdp_gpt2_create(fs, &gcfg, &model); /* the root and one unit per block */
    if (status == FSDP_OK)
        status = fsdp_lm_init_params(model, 42); /* HF's init, the same on every rank */
    fsdp_optim_config_init(&ocfg, FSDP_OPTIM_ADAMW);
    ocfg.lr = 3e-3f;
    ocfg.no_decay_1d = 1;
    if (status == FSDP_OK)
        status = fsdp_optim_create(fs, &ocfg, &opt);
    for (int step = 0; step < STEPS && status == FSDP_OK; step++) {
        float loss = 0.0f;

        status = fsdp_tokens_batch(job->tokens, &spec, step, inputs, targets);
        if (status == FSDP_OK)
            status = fsdp_lm_forward_backward(model, inputs, targets, rows, SEQ, &loss);
        if (status == FSDP_OK)
            status = fsdp_clip_grad_norm(fs, 1.0, 2.0, NULL);
        if (status == FSDP_OK)
            status = fsdp_optim_step(opt);
        fsdp_zero_grad(fs);
        if (dev->rank == 0)
            job->losses[step] = loss; /* rank 0's own rows */
    }
    /* a collective: every rank writes its part, rank 0 the model file */
    if (status == FSDP_OK)
        status = fsdp_checkpoint_save(fs, opt, job->dir, FSDP_STATE_DICT_FULL, STEPS);
    if (status != FSDP_OK)
        fprintf(stderr, "rank %d: %s: %s\n", dev->rank, fsdp_status_string(status),
                fsdp_last_error(fs));
    fsdp_optim_destroy(opt);
    fsdp_lm_destroy(model);
    fsdp_destroy(fs);
    return status;
}

static const char text[] =
    "It is a truth universally acknowledged, that a single man in possession of a good "
    "fortune, must be in want of a wife. However little known the feelings or views of such a "
    "man may be on his first entering a neighbourhood, this truth is so well fixed in the minds "
    "of the surrounding families, that he is considered the rightful property of some one or "
    "other of their daughters.";

int main(int argc, char **argv)
{
    fsdp_sim_params_t params;
    fsdp_tokens_t *tokens = NULL;
    job_t job = {0};
    fsdp_status_t status;

    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s DIR [TEXT]\n", argv[0]);
        return 2;
    }
    job.dir = argv[1];
    if (argc == 3) {
        status = fsdp_tokens_open_text(argv[2], SIZE_MAX, &tokens); /* byte-level: token = byte */
    } else {
        uint16_t ids[sizeof(text) - 1];

        for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++)
            ids[i] = (unsigned char)text[i];
        status = fsdp_tokens_from_array(ids, sizeof(ids) / sizeof(ids[0]), FSDP_TOKENS_RANDOM,
                                        "built-in text", &tokens);
    }
    if (status != FSDP_OK)
        return 1; /* the library has logged why */
    job.tokens = tokens;

    fsdp_sim_params_init(&params);
    params.world_size = WORLD;
    status = fsdp_sim_launch(&params, rank_main, &job, NULL);
    fsdp_tokens_close(tokens);
    if (status != FSDP_OK) {
        fprintf(stderr, "gpt2_checkpoint: %s\n", fsdp_status_string(status));
        return 1;
    }
    printf("gpt2-tiny on %d simulated ranks: loss %.4f -> %.4f over %d steps\n", WORLD,
           job.losses[0], job.losses[STEPS - 1], STEPS);
    printf("checkpoint %s/step-%08d/model.safetensors\n", job.dir, STEPS);
    return job.losses[STEPS - 1] < job.losses[0] ? 0 : 1;
}
