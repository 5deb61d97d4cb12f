/* Llama internals shared by llama.c (configurations, units, init) and llama_run.c (forward,
 * backward). */
#ifndef FSDP_NN_LLAMA_INT_H
#define FSDP_NN_LLAMA_INT_H

#include <fsdp/llama.h>

#include "nn/lm_int.h"

#define FSDP_LLAMA_MAX_LAYERS 1024

struct fsdp_llama {
    fsdp_lm_t lm; /* root: embed_tokens, norm, lm_head (untied); checkpoint: FSDP_LLAMA_CKPT_* */
    fsdp_llama_config_t cfg;
    int eager_memory; /* fsdp_llama_set_eager_memory */
};

/* HF's name of a layer parameter without "model.layers.<i>." and of a root parameter, by
 * FSDP_LLAMA_* index. */
const char *fsdp_llama_layer_param_name(int index);
const char *fsdp_llama_root_param_name(int index);
/* The shape of parameter `index` of layer `layer` (-1: the root), [out, in]. */
void fsdp_llama_param_shape(const fsdp_llama_config_t *cfg, int layer, int index, int *ndim_p,
                            int64_t shape[2]);

#endif
