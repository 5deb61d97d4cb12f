/* fsdp-train's command line: its options (train_args.c) and what they set. */
#ifndef FSDP_TOOLS_TRAIN_ARGS_H
#define FSDP_TOOLS_TRAIN_ARGS_H

#include <fsdp/fsdp.h>

#include <stdint.h>

#include "train_launch.h"

typedef struct train_args {
    int dims[FSDP_MLP_MAX_LAYERS + 1];
    int nlayers;
    int world;
    int dp; /* the data-parallel ranks, world / --tp: each reads its own rows of a batch */
    fsdp_config_t fsdp;
    fsdp_optim_config_t optim;
    int steps;
    int batch;
    uint64_t seed;
    double timeout_s;
    int threads; /* --threads: 0 = the online CPUs */
    const char *init_path;
    const char *save_path;
    const char *data_path;
    int quiet;
    int grad_accum;          /* micro-batches per step */
    double clip_grad_norm;   /* 0 = off */
    const char *ckpt_dir;    /* --save-checkpoint */
    int ckpt_every;          /* steps between checkpoints; 0 = at the end only */
    fsdp_state_dict_type_t state_dict;
    const char *resume_dir;
    const char *consolidate_dir; /* --consolidate: write its model as --save, train nothing */
    const char *trace_path;
    const char *profile_arg;       /* --profile, or NULL for the default */
    int ops;                       /* --ops: fsdp_sim_ops_t, or -1 for the profile's */
    fsdp_sim_profile_t profile;
    /* --model gpt2... or llama...: a language model (train_lm.c) */
    int gpt; /* either */
    int llama;
    const char *model_name;
    fsdp_gpt2_config_t gpt_cfg;
    fsdp_llama_config_t llama_cfg;
    const char *tokens_path;
    int seq; /* 0: the model's positions */
    int checkpoint_activations; /* 1: every layer, K: every K-th, or CLI_AC_SELECTIVE_OP */
    train_launch_t launch; /* --backend: how the ranks run */
} train_args_t;

/* Parses and checks the command line into *a: the model, the FSDP configuration, the optimizer,
 * the data and checkpoint paths and how the ranks run (train_launch_prepare). Dies with one
 * line (exit 2) on bad usage, and exits 0 after --version and --help. */
void train_parse_args(int argc, char **argv, train_args_t *a);

#endif
