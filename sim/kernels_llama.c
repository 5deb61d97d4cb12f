/* Host execution of the Llama kernels (rmsnorm .. attention of kernel.h), data mode.
 *
 * Only the check and the dispatch are here: the descriptor is checked by the check the gpu backend
 * uses too, and each pass of lib/kernels/llama_bodies.h runs its indices in order through
 * fsdp_kb_llama_host_pass, every lane of a row (or of a column block) in the body's loops: the
 * code the gpu backend launches with a thread, a warp or a block per index. */
#include "config.h"

#include <fsdp/log.h>

#include "kernels/llama_bodies.h"
#include "sim_kernels.h"

int fsdp_sim_llama_kernel(fsdp_kernel_kind_t kind)
{
    return fsdp_kb_llama_kind(kind);
}

/* The loops of one pass, with the kind a constant so that the dispatch folds. */
#define LLAMA_LOOP(KIND, k, pass) fsdp_kb_llama_host_pass(KIND, (k), (pass))

fsdp_status_t fsdp_sim_llama_kernel_exec(const fsdp_kernel_t *k)
{
    const char *bad = fsdp_kb_llama_check(k);

    if (bad != NULL) {
        fsdp_error("kernel %s: %s", fsdp_kernel_name(k->kind), bad);
        return FSDP_ERR_INVALID_PARAM;
    }
    for (int pass = 0; pass < fsdp_kb_llama_passes(k); pass++) {
        switch (k->kind) {
        case FSDP_K_RMSNORM_FWD:
            LLAMA_LOOP(FSDP_K_RMSNORM_FWD, k, pass);
            break;
        case FSDP_K_RMSNORM_BWD:
            LLAMA_LOOP(FSDP_K_RMSNORM_BWD, k, pass);
            break;
        case FSDP_K_ROPE_FWD:
            LLAMA_LOOP(FSDP_K_ROPE_FWD, k, pass);
            break;
        case FSDP_K_ROPE_BWD:
            LLAMA_LOOP(FSDP_K_ROPE_BWD, k, pass);
            break;
        case FSDP_K_SWIGLU_FWD:
            LLAMA_LOOP(FSDP_K_SWIGLU_FWD, k, pass);
            break;
        case FSDP_K_SWIGLU_BWD:
            LLAMA_LOOP(FSDP_K_SWIGLU_BWD, k, pass);
            break;
        case FSDP_K_ATTENTION_FWD:
            LLAMA_LOOP(FSDP_K_ATTENTION_FWD, k, pass);
            break;
        case FSDP_K_ATTENTION_BWD:
            LLAMA_LOOP(FSDP_K_ATTENTION_BWD, k, pass);
            break;
        default:
            break;
        }
    }
    return FSDP_OK;
}
