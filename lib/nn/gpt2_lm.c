/* GPT-2 as a language model of lm.h: its family's functions, which lm.h's call, and the model's
 * creation. Above gpt2.c, gpt2_run.c and gpt2_hf.c, which it names and which do not name it. */
#include "config.h"

#include <fsdp/log.h>

#include "core/core_hidden.h"
#include "nn/gpt2_int.h"

static const fsdp_lm_family_t gpt2_family = {
    .name = "gpt2",
    .layer = "block",
    /* ModuleWrapPolicy({GPT2Block}): the root holds wte, wpe and ln_f; a block is recomputed
     * whole, or not at all */
    .wrap_type = "GPT2Block",
    .size = sizeof(fsdp_gpt2_t),
    .max_checkpoint = FSDP_LM_CKPT_FULL,
    .build = fsdp_gpt2_tree_build,
    .init_params = fsdp_gpt2_init_params,
    .forward_backward = fsdp_gpt2_forward_backward,
    .load_weights = fsdp_gpt2_load_weights,
    .save_weights = fsdp_gpt2_save_hf,
};

fsdp_status_t fsdp_gpt2_create(fsdp_t *fs, const fsdp_gpt2_config_t *cfg, fsdp_lm_t **lm_p)
{
    fsdp_status_t status = fsdp_gpt2_config_check(cfg);

    if (status == FSDP_OK && fsdp_tp_group(fs) != NULL) {
        fsdp_error("gpt2: tensor parallelism (tp %d) is planned for llama models only",
                   fsdp_tp_group(fs)->size);
        return FSDP_ERR_UNSUPPORTED;
    }
    if (status == FSDP_OK)
        status = fsdp_lm_create(fs, &gpt2_family, cfg->n_layer, cfg, lm_p);
    if (status == FSDP_OK)
        fsdp_gpt2_of(*lm_p)->cfg = *cfg;
    return status;
}
