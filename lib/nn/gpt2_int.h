/* GPT-2 internals shared by gpt2.c (units, init), gpt2_run.c (forward, backward) and
 * gpt2_hf.c (HF checkpoints). */
#ifndef FSDP_NN_GPT2_INT_H
#define FSDP_NN_GPT2_INT_H

#include <fsdp/gpt2.h>

#include "nn/lm_int.h"

#define FSDP_GPT2_MAX_LAYERS 1024

struct fsdp_gpt2 {
    fsdp_lm_t lm; /* root: wte, wpe, ln_f; layers: the blocks; checkpoint: 1 recomputes */
    fsdp_gpt2_config_t cfg;
};

/* HF's name of a parameter without "transformer." (e.g. "ln_1.weight" of a block, "wte.weight"
 * of the root), by FSDP_GPT2_* index. */
const char *fsdp_gpt2_block_param_name(int index);
const char *fsdp_gpt2_root_param_name(int index);
/* The shape of parameter `index` of block `block` (-1: the root). */
void fsdp_gpt2_param_shape(const fsdp_gpt2_config_t *cfg, int block, int index, int *ndim_p,
                           int64_t shape[2]);

#endif
