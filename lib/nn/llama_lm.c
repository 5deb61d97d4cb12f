/* Llama as a language model of lm.h: its family's functions, which lm.h's call, and the model's
 * creation. Above llama.c, llama_run.c and llama_hf.c, which it names and which do not name it. */
#include "config.h"

#include <fsdp/log.h>

#include "core/core_hidden.h"
#include "nn/llama_int.h"

static const fsdp_lm_family_t llama_family = {
    .name = "llama",
    .layer = "layer",
    /* ModuleWrapPolicy({LlamaDecoderLayer}): the root holds the embedding, the norm and an untied
     * LM head */
    .wrap_type = "LlamaDecoderLayer",
    .size = sizeof(fsdp_llama_t),
    .max_checkpoint = FSDP_LM_CKPT_SELECTIVE_OP,
    .build = fsdp_llama_tree_build,
    .init_params = fsdp_llama_init_params,
    .forward_backward = fsdp_llama_forward_backward,
    .load_weights = fsdp_llama_load_weights,
    .save_weights = fsdp_llama_save_weights,
};

fsdp_status_t fsdp_llama_create(fsdp_t *fs, const fsdp_llama_config_t *cfg, fsdp_lm_t **lm_p)
{
    fsdp_group_t *tp = fsdp_tp_group(fs);
    fsdp_llama_config_t local;
    fsdp_status_t status = fsdp_llama_config_check(cfg);

    if (status == FSDP_OK)
        status = fsdp_llama_tp_config(cfg, tp != NULL ? tp->size : 1, &local);
    if (status == FSDP_OK)
        status = fsdp_lm_create(fs, &llama_family, cfg->n_layer, &local, lm_p);
    if (status == FSDP_OK) {
        fsdp_llama_t *m = fsdp_llama_of(*lm_p);
        m->cfg = *cfg;
        m->local = local;
        m->tp = tp != NULL ? tp->size : 1;
        m->tp_rank = tp != NULL ? tp->rank : 0;
    }
    return status;
}
