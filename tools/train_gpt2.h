/* fsdp-train's language-model path (train_gpt2.c), GPT-2 or Llama: fsdp-train.c parses the
 * command line, this file runs the training. */
#ifndef FSDP_TOOLS_TRAIN_GPT2_H
#define FSDP_TOOLS_TRAIN_GPT2_H

#include <fsdp/fsdp.h>

#include "train_launch.h"

typedef struct gpt2_train_opts {
    const char *model_name; /* as given to --model, for the log */
    fsdp_gpt2_config_t model; /* GPT-2, unless llama */
    int llama;
    fsdp_llama_config_t llama_model;
    int world;
    fsdp_config_t fsdp;
    fsdp_optim_config_t optim;
    int steps;
    int batch; /* global rows */
    int seq;   /* tokens per row, <= model.n_positions */
    int grad_accum;
    uint64_t seed;
    double timeout_s;
    double clip_grad_norm; /* 0 = off */
    int checkpoint_activations; /* 1: every layer; K > 1: every K-th; CLI_AC_SELECTIVE_OP */
    const char *init_path;   /* HF safetensors */
    const char *save_path;   /* HF safetensors */
    const char *data_path;   /* text */
    const char *tokens_path; /* llm.c shard */
    const char *ckpt_dir;
    int ckpt_every;
    fsdp_state_dict_type_t state_dict;
    const char *resume_dir;
    int quiet;
    const char *argv0; /* to find the default corpus */
    const char *trace_path; /* --trace, or NULL */
    const fsdp_sim_profile_t *profile; /* the cluster the simulated times come from */
    const train_launch_t *launch;      /* how the ranks run (sim threads or this gpu rank) */
    int argc;               /* the command line, for the trace's run row */
    char **argv;
} gpt2_train_opts_t;

/* Trains and prints "step N loss X" per step, then tokens/s and each rank's peak memory.
 * Returns the exit status (0, 1 when a rank failed, 2 for bad input, already reported). */
int gpt2_train_main(const gpt2_train_opts_t *o);

#endif
