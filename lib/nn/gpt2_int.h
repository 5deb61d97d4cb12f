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
    int tp, tp_rank; /* tensor parallelism over tp ranks (1: none), this rank's place */
} fsdp_gpt2_t;

/* What a rank's module tree is built from (fsdp_gpt2_tree_build): the configuration and the
 * tensor-parallel degree of its tensors' shapes. */
typedef struct fsdp_gpt2_shape {
    const fsdp_gpt2_config_t *cfg;
    int tp;
} fsdp_gpt2_shape_t;

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
/* The same, of one rank's tensor under tensor parallelism over tp ranks (Megatron's layout of
 * Conv1D [in, out] weights): c_attn's columns of this rank's heads of q, k and v each, with their
 * bias, and c_fc's columns (column-parallel); the two c_proj's rows (row-parallel, their bias
 * whole); wte's vocabulary rows; the layernorms and wpe whole. */
void fsdp_gpt2_param_shape_tp(const fsdp_gpt2_config_t *cfg, int tp, int block, int index,
                              int *ndim_p, int64_t shape[2]);
/* How those tensors are cut over tp, as fsdp_nn_slice_func_t says: 0 whole, -1 by rows, P > 0
 * by the columns of P blocks (c_attn's q, k and v: 3). */
int fsdp_gpt2_slice_parts(int block, int index);

/* The family's functions (lm_int.h), by file: HF's module tree of a configuration and the
 * initialization (gpt2.c), one forward and backward (gpt2_run.c), HF's checkpoints
 * (gpt2_hf.c). */
fsdp_status_t fsdp_gpt2_tree_build(fsdp_lm_tree_t *t, const void *shape); /* fsdp_gpt2_shape_t */
fsdp_status_t fsdp_gpt2_init_params(fsdp_lm_t *lm, uint64_t seed);
fsdp_status_t fsdp_gpt2_forward_backward(fsdp_lm_t *lm, const int32_t *inputs,
                                         const int32_t *targets, size_t batch, size_t seq,
                                         float *loss_p);
fsdp_status_t fsdp_gpt2_load_weights(fsdp_lm_t *lm, const fsdp_lm_weights_t *weights);
fsdp_status_t fsdp_gpt2_save_hf(fsdp_lm_t *lm, const char *path);

#endif
