/* libfsdp: GPT-2, as Hugging Face's GPT2LMHeadModel computes it, trained with FSDP.
 *
 * Token and learned position embeddings; n_layer pre-LayerNorm blocks (eps 1e-5) of causal
 * multi-head self-attention (scores divided by sqrt(head_dim), held in the compute dtype as
 * HF's eager attention holds it; in f32 multiplied by 1/sqrt(head_dim)) and a 4x MLP with
 * gelu_new;
 * a final LayerNorm; the LM head tied to the token embedding; mean cross-entropy over the next
 * tokens. No dropout (HF's dropouts at p = 0, or eval mode). This header holds what is GPT-2's
 * own: its configurations, its units and HF's names; the model, once created, is an fsdp_lm_t
 * (lm.h), as every language model is.
 *
 * Units: the root "transformer" owns wte, wpe and ln_f (its parameters stay unsharded from
 * forward to backward, as PyTorch's root does); every block "transformer.h.<i>" is a unit.
 * Parameters carry HF's names and layouts (docs/formats.md section 2):
 * "transformer.wte.weight" [vocab, C], "transformer.h.<i>.attn.c_attn.weight" [C, 3C] in Conv1D
 * [in, out] layout, ... so a FULL checkpoint (checkpoint.h) is an HF state dict. The LM head
 * is wte itself: stored once, its gradient the sum of both uses.
 */
#ifndef FSDP_GPT2_H
#define FSDP_GPT2_H

#include <fsdp/api.h>

#include <fsdp/lm.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_gpt2_config {
    int n_layer;             /* transformer blocks */
    int n_head;              /* attention heads; must divide n_embd */
    int n_embd;              /* width C */
    int n_positions;         /* rows of wpe: the longest sequence */
    int vocab_size;          /* rows of wte and logits */
    float layer_norm_eps;    /* 1e-5 */
    float initializer_range; /* 0.02: std of the normal init */
    /* 0: HF's eager attention (Q K^T, the causal softmax, att V; the [B, H, T, T] probabilities
     * kept for the backward), bit for bit; 1: one fused kernel with FlashAttention's contract
     * (kernel.h attention_fwd: only the output and the per-row log-sum-exp kept, the backward
     * recomputes), softmax(Q K^T / sqrt(hs)) V as torch's scaled_dot_product_attention computes
     * it, within f32 rounding of the eager result */
    int fused_attention;
} fsdp_gpt2_config_t;

/* A named configuration. */
typedef struct fsdp_gpt2_preset {
    const char *name; /* "gpt2-tiny", "gpt2", ..., "gpt3-175b" */
    fsdp_gpt2_config_t cfg;
    const char *description; /* where the numbers come from */
} fsdp_gpt2_preset_t;

/* The presets, in size order: gpt2-tiny (tests and the demo), gpt2, gpt2-medium, gpt2-large,
 * gpt2-xl (HF's checkpoints), and the GPT-3 family of Brown et al. 2020, table 2.1
 * (gpt3-small ... gpt3-175b), as dense-attention models for planning. *count_p gets their
 * number. */
FSDP_API const fsdp_gpt2_preset_t *fsdp_gpt2_presets(int *count_p);
/* The preset of that name, or NULL. */
FSDP_API const fsdp_gpt2_preset_t *fsdp_gpt2_preset_find(const char *name);
/* A comma-separated list of the preset names. Never NULL. */
FSDP_API const char *fsdp_gpt2_preset_names(void);

/* Parses a preset name, or "gpt2:layers=L,heads=H,dim=D,seq=T,vocab=V,attention=A" (any
 * subset, the others from gpt2-tiny; seq sets n_positions; A is eager (the default) or fused).
 * Errors are FSDP_ERR_INVALID_PARAM, logged with what is allowed. */
FSDP_API fsdp_status_t fsdp_gpt2_config_parse(const char *spec, fsdp_gpt2_config_t *cfg_p);
/* 1 when spec names a GPT model (a preset, or "gpt2:..."), whether or not it parses. */
FSDP_API int fsdp_gpt2_spec_is_gpt(const char *spec);
/* Parameters, tied weights once, without the attention-mask buffers (12 C^2 + 13 C per block,
 * plus (vocab + n_positions) C + 2 C). */
FSDP_API uint64_t fsdp_gpt2_num_params(const fsdp_gpt2_config_t *cfg);

/* ---- the model on one rank (lm.h) ---- */

/* Creates the units on fs: the root "transformer" (wte, wpe, ln_f) and n_layer blocks
 * "transformer.h.<i>", as fsdp_auto_wrap with ModuleWrapPolicy({GPT2Block}) decides over HF's
 * module tree; the rest is lm.h's. fsdp_lm_init_params is HF's _init_weights: weights
 * N(0, initializer_range), every c_proj weight N(0, initializer_range / sqrt(2 n_layer)),
 * biases 0, LayerNorm weights 1. Activation checkpointing is FSDP_LM_CKPT_FULL or none. */
FSDP_API fsdp_status_t fsdp_gpt2_create(fsdp_t *fs, const fsdp_gpt2_config_t *cfg,
                                        fsdp_lm_t **lm_p);

/* Parameter indexes within a block unit and within the root. */
enum {
    FSDP_GPT2_LN1_W = 0,
    FSDP_GPT2_LN1_B,
    FSDP_GPT2_ATTN_W,
    FSDP_GPT2_ATTN_B,
    FSDP_GPT2_ATTN_PROJ_W,
    FSDP_GPT2_ATTN_PROJ_B,
    FSDP_GPT2_LN2_W,
    FSDP_GPT2_LN2_B,
    FSDP_GPT2_FC_W,
    FSDP_GPT2_FC_B,
    FSDP_GPT2_FC_PROJ_W,
    FSDP_GPT2_FC_PROJ_B,
    FSDP_GPT2_BLOCK_NPARAMS
};
enum { FSDP_GPT2_WTE = 0, FSDP_GPT2_WPE, FSDP_GPT2_LNF_W, FSDP_GPT2_LNF_B, FSDP_GPT2_ROOT_NPARAMS };

/* ---- Hugging Face checkpoints (safetensors) ---- */

/* Opens an HF GPT-2 checkpoint and checks it against a configuration, for fsdp_lm_load_weights
 * (closed by fsdp_lm_weights_close). Names with or without the "transformer." prefix are
 * accepted; the "attn.bias" and "attn.masked_bias" buffers are ignored, and "lm_head.weight"
 * too when it has wte's shape (it is tied). F32, BF16 and F16 tensors are read (widened to
 * f32). A missing, duplicated or unexpected tensor, or a shape or dtype mismatch, is
 * FSDP_ERR_FORMAT with one logged line naming the tensor. */
FSDP_API fsdp_status_t fsdp_gpt2_weights_open(const char *path, const fsdp_gpt2_config_t *cfg,
                                              fsdp_lm_weights_t **weights_p);

typedef enum {
    FSDP_GPT2_SAVE_PREFIXED = 0, /* "transformer.h.0...", as GPT2LMHeadModel.save_pretrained */
    FSDP_GPT2_SAVE_BARE = 1      /* "h.0...", as the hub's model.safetensors */
} fsdp_gpt2_save_names_t;

/* fsdp_lm_save_weights (which writes the prefixed names) with a choice of names: no
 * lm_head.weight (tied) and no mask buffers. A model of another family is
 * FSDP_ERR_INVALID_PARAM. */
FSDP_API fsdp_status_t fsdp_gpt2_save_weights(fsdp_lm_t *lm, const char *path,
                                              fsdp_gpt2_save_names_t names);

#ifdef __cplusplus
}
#endif
#endif
