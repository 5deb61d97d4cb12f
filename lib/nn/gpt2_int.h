/* GPT-2 internals shared by gpt2.c (configurations, units, init), gpt2_run.c (forward,
 * backward), gpt2_hf.c (HF checkpoints) and gpt2_lm.c (the family of lm.h that they make). */
#ifndef FSDP_NN_GPT2_INT_H
#define FSDP_NN_GPT2_INT_H

#include <fsdp/gpt2.h>

#include "nn/lm_int.h"

#define FSDP_GPT2_MAX_LAYERS 1024

typedef struct fsdp_gpt2 {
    fsdp_lm_t lm; /* first; root: wte, wpe, ln_f; layers: the blocks; checkpoint: 1 recomputes */
    fsdp_gpt2_config_t cfg;
} fsdp_gpt2_t;

/* The GPT-2 model that lm is (lm's family is GPT-2's). */
static inline fsdp_gpt2_t *fsdp_gpt2_of(fsdp_lm_t *lm)
{
    return (fsdp_gpt2_t *)lm;
}

/* HF's name of a parameter without "transformer." (e.g. "ln_1.weight" of a block, "wte.weight"
 * of the root), by FSDP_GPT2_* index. */
const char *fsdp_gpt2_block_param_name(int index);
const char *fsdp_gpt2_root_param_name(int index);
/* The shape of parameter `index` of block `block` (-1: the root). */
void fsdp_gpt2_param_shape(const fsdp_gpt2_config_t *cfg, int block, int index, int *ndim_p,
                           int64_t shape[2]);

/* The family's functions (lm_int.h), by file: HF's module tree of a configuration and the
 * initialization (gpt2.c), one forward and backward (gpt2_run.c), HF's checkpoints
 * (gpt2_hf.c). */
fsdp_status_t fsdp_gpt2_tree_build(fsdp_lm_tree_t *t, const void *cfg);
fsdp_status_t fsdp_gpt2_init_params(fsdp_lm_t *lm, uint64_t seed);
fsdp_status_t fsdp_gpt2_forward_backward(fsdp_lm_t *lm, const int32_t *inputs,
                                         const int32_t *targets, size_t batch, size_t seq,
                                         float *loss_p);
fsdp_status_t fsdp_gpt2_load_weights(fsdp_lm_t *lm, const fsdp_lm_weights_t *weights);
fsdp_status_t fsdp_gpt2_save_hf(fsdp_lm_t *lm, const char *path);

#endif
