/* Llama internals shared by llama.c (configurations, units, init), llama_run.c (forward,
 * backward), llama_hf.c (HF checkpoints) and llama_lm.c (the family of lm.h that they make). */
#ifndef FSDP_NN_LLAMA_INT_H
#define FSDP_NN_LLAMA_INT_H

#include <fsdp/llama.h>

#include "nn/lm_int.h"

#define FSDP_LLAMA_MAX_LAYERS 1024

typedef struct fsdp_llama {
    fsdp_lm_t
        lm; /* first; root: embed_tokens, norm, lm_head (untied); checkpoint: FSDP_LM_CKPT_* */
    fsdp_llama_config_t cfg;
    /* Tensor parallelism over tp ranks (1: none), this rank tp_rank: the shapes of this rank's
     * tensors, cfg with heads, kv heads, ffn and vocab divided by tp (head_dim given) */
    fsdp_llama_config_t local;
    int tp, tp_rank;
    int eager_memory; /* fsdp_llama_set_eager_memory */
} fsdp_llama_t;

/* The Llama model that lm is (lm's family is Llama's). */
static inline fsdp_llama_t *fsdp_llama_of(fsdp_lm_t *lm)
{
    return (fsdp_llama_t *)lm;
}

/* HF's name of a layer parameter without "model.layers.<i>." and of a root parameter, by
 * FSDP_LLAMA_* index. */
const char *fsdp_llama_layer_param_name(int index);
const char *fsdp_llama_root_param_name(int index);
/* The shape of parameter `index` of layer `layer` (-1: the root), [out, in]. */
void fsdp_llama_param_shape(const fsdp_llama_config_t *cfg, int layer, int index, int *ndim_p,
                            int64_t shape[2]);

/* The family's functions (lm_int.h), by file: HF's module tree of a configuration and the
 * initialization (llama.c), one forward and backward (llama_run.c), HF's checkpoints
 * (llama_hf.c). */
fsdp_status_t fsdp_llama_tree_build(fsdp_lm_tree_t *t, const void *cfg);
/* The configuration of one rank's tensors under tensor parallelism over tp ranks (Megatron's
 * layout, torchtitan's plan): q, k, v, gate and up column-parallel (heads, kv heads and ffn
 * rows split), o and down row-parallel, the embedding and the LM head split over the vocabulary,
 * the norms replicated. A tp that does not divide heads, kv heads, ffn or vocab is
 * FSDP_ERR_INVALID_PARAM, logged naming the values. */
fsdp_status_t fsdp_llama_tp_config(const fsdp_llama_config_t *cfg, int tp,
                                   fsdp_llama_config_t *local_p);
fsdp_status_t fsdp_llama_init_params(fsdp_lm_t *lm, uint64_t seed);
fsdp_status_t fsdp_llama_forward_backward(fsdp_lm_t *lm, const int32_t *inputs,
                                          const int32_t *targets, size_t batch, size_t seq,
                                          float *loss_p);
fsdp_status_t fsdp_llama_load_weights(fsdp_lm_t *lm, const fsdp_lm_weights_t *weights);
fsdp_status_t fsdp_llama_save_weights(fsdp_lm_t *lm, const char *path);

#endif
