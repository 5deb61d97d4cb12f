/* fsdp-train's training loop (train_loop.c), one for every model, and the models it drives: the
 * MLP (train_mlp.c) and the language models, GPT-2 and Llama (train_lm.c). */
#ifndef FSDP_TOOLS_TRAIN_LOOP_H
#define FSDP_TOOLS_TRAIN_LOOP_H

#include <fsdp/fsdp.h>

#include <stdint.h>

#include "train_args.h"

/* A model as the loop drives it. On each rank, in this order: create, set_loss_scale, then per
 * step batch and forward_backward per micro-batch, save, destroy; `shared` is what the ranks
 * share, read-only (the data, the weights to load), `model` what create made for one rank. */
typedef struct train_model_ops {
    /* the model on fs with its first values (initialized, or --init's) and what the rank reads
     * its rows from; on failure *model_p is what destroy releases, or NULL */
    fsdp_status_t (*create)(const void *shared, fsdp_t *fs, void **model_p);
    void (*set_loss_scale)(void *model, float scale);
    /* the rank's rows of step `step`, before its micro-batches; NULL: the same every step */
    fsdp_status_t (*batch)(void *model, int64_t step);
    /* one forward and backward of micro-batch k of n, the rank's rows cut in n */
    fsdp_status_t (*forward_backward)(void *model, int k, int n, float *loss_p);
    /* --save: gathers the full parameters (a collective), rank 0 writes them */
    fsdp_status_t (*save)(void *model, const char *path);
    void (*destroy)(void *model); /* accepts NULL */
    /* on the host after a run that saved, the report's line for --save; 0, or the exit status */
    int (*report_save)(const train_args_t *a);
} train_model_ops_t;

typedef struct train_model {
    const train_model_ops_t *ops;
    const void *shared;
    const char *name;  /* the trace's model: "mlp", or --model's */
    const char *unit;  /* what a step trains: "rows", "tokens" */
    const char *rate;  /* their rate in the step lines: "rows/s", "tok/s" */
    double step_items; /* rows or tokens of one global batch */
} train_model_t;

/* Trains m on the ranks as the options say (optimizer, gradient accumulation, clipping,
 * checkpoints, --resume, --trace, --save) and prints "step N loss X" per step (X the mean over
 * the global batch, rank 0 only), the totals and each rank's peak allocated bytes (on the gpu
 * backend, each process its own rank's). Returns the exit status: 0, 1 when a rank failed
 * (it logged why), 2 when the trace could not be opened (reported). */
int train_loop_run(const train_args_t *a, const train_model_t *m, int argc, char **argv);

/* The models: each prepares its data and first values on the host, then runs the loop; they
 * return its exit status (2 for bad input, reported). */
int train_mlp_main(train_args_t *a, int argc, char **argv);
int train_lm_main(const train_args_t *a, int argc, char **argv);

#endif
