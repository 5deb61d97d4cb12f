/* libfsdp: a language model on one rank, trained with FSDP, whichever its family: GPT-2
 * (gpt2.h) or Llama (llama.h).
 *
 * A family's create function (fsdp_gpt2_create, fsdp_llama_create) makes the model's units on
 * an fsdp_t from its configuration and hands back an fsdp_lm_t; what follows is the same for
 * every family, and is this header: the first values (the family's initialization, or an HF
 * checkpoint opened by the family's fsdp_*_weights_open), activation checkpointing, the loss
 * scale of gradient accumulation, one forward and backward, and saving as an HF checkpoint.
 *
 * Units: a root, which owns the embedding, the final norm and the LM head and keeps them
 * unsharded from forward to backward, as PyTorch's root does; and one unit per layer, as
 * fsdp_auto_wrap with ModuleWrapPolicy({the family's layer class}) decides over HF's module
 * tree. Parameters carry HF's names, so a FULL checkpoint (checkpoint.h) is an HF state dict.
 * The model computes in the units' compute dtype: f32, or a mixed-precision param_dtype (bf16,
 * f16), with activations and their gradients in it and the loss in f32. Forward and backward
 * are written only against backend kernels (kernel.h) and the FSDP hooks, so the same code runs
 * on the sim and on GPUs.
 */
#ifndef FSDP_LM_H
#define FSDP_LM_H

#include <fsdp/api.h>

#include <fsdp/core.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_lm fsdp_lm_t;

/* Frees the model; its units belong to the fsdp_t and go with it. Accepts NULL. */
FSDP_API void fsdp_lm_destroy(fsdp_lm_t *lm);

/* The layers, the root unit, and layer `layer`'s unit (NULL out of range). */
FSDP_API int fsdp_lm_num_layers(const fsdp_lm_t *lm);
FSDP_API fsdp_unit_t *fsdp_lm_root(fsdp_lm_t *lm);
FSDP_API fsdp_unit_t *fsdp_lm_layer(fsdp_lm_t *lm, int layer);

/* HF's _init_weights for the family (gpt2.h, llama.h), from a deterministic generator seeded
 * with `seed`, the same on every rank and world size; each rank computes only its part. Nothing
 * to do in shape mode. */
FSDP_API fsdp_status_t fsdp_lm_init_params(fsdp_lm_t *lm, uint64_t seed);

/* Activation checkpointing policies of a layer, torchtitan's. */
enum {
    FSDP_LM_CKPT_NONE = 0, /* the layer keeps what its backward reads */
    FSDP_LM_CKPT_FULL = 1, /* it keeps only its input; backward recomputes its forward */
    /* torchtitan's selective op policy (Llama; another family runs FULL instead): the layer
     * keeps the outputs of the expensive ops, the fused attention's (output and log-sum-exp)
     * and every other matmul's, counted in forward order (q, v and gate saved; k, o and up
     * recomputed; down's output is the layer's), and backward recomputes the others and the
     * cheap ops (RMSNorm, rotary embedding of k, SwiGLU, the mid residual). q is kept rotated,
     * the same bytes as its matmul output. */
    FSDP_LM_CKPT_SELECTIVE_OP = 2
};
/* Activation checkpointing of layer `layer` (-1: every layer) by one of the policies above (any
 * other non-zero `policy` is FULL); recomputation runs after the pre-backward hook, and the
 * forward hooks are not re-run. Off by default. The loss and gradients are the same under every
 * policy. A layer out of range is FSDP_ERR_INVALID_PARAM, logged with the range. */
FSDP_API fsdp_status_t fsdp_lm_set_checkpointing(fsdp_lm_t *lm, int layer, int policy);
/* Scales the loss that backward differentiates (1/K for K accumulation micro-batches); the
 * reported loss stays the plain mean. Default 1. */
FSDP_API void fsdp_lm_set_loss_scale(fsdp_lm_t *lm, float scale);

/* One forward and backward on this rank's batch: inputs and targets [batch, seq] token ids in
 * host memory (seq at most the model's positions; inputs in [0, vocab); a target < 0 is ignored,
 * as torch's ignore_index; NULL inputs and targets in shape mode). Runs every FSDP hook and the
 * final callback, leaving the sharded gradients for the optimizer. *loss_p: the mean
 * cross-entropy over this rank's counted targets. */
FSDP_API fsdp_status_t fsdp_lm_forward_backward(fsdp_lm_t *lm, const int32_t *inputs,
                                                const int32_t *targets, size_t batch, size_t seq,
                                                float *loss_p);

/* ---- Hugging Face checkpoints (safetensors) ---- */

/* An HF checkpoint of one family, opened and checked against a configuration by the family's
 * fsdp_*_weights_open, shared read-only by the ranks that load it. */
typedef struct fsdp_lm_weights fsdp_lm_weights_t;

/* Accepts NULL. */
FSDP_API void fsdp_lm_weights_close(fsdp_lm_weights_t *weights);
/* Sets every parameter of the model from the checkpoint (call on every rank, units idle; no
 * collective; nothing to do in shape mode). Weights of another family, or opened for another
 * shape, are FSDP_ERR_INVALID_PARAM. */
FSDP_API fsdp_status_t fsdp_lm_load_weights(fsdp_lm_t *lm, const fsdp_lm_weights_t *weights);
/* Gathers the full parameters (a collective: every rank calls it) and writes them on rank 0 as
 * the model.safetensors of HF's save_pretrained: F32, HF's names and layouts, a tied LM head
 * once, metadata {"format": "pt"}. */
FSDP_API fsdp_status_t fsdp_lm_save_weights(fsdp_lm_t *lm, const char *path);

#ifdef __cplusplus
}
#endif
#endif
