/* libfsdp: Llama, as Hugging Face's LlamaForCausalLM computes it, trained with FSDP.
 *
 * Token embedding; n_layer decoder layers of RMSNorm, grouped-query causal self-attention with
 * rotary embeddings (HF's rotate_half convention, rope_theta, optionally Llama 3.1's "llama3"
 * frequency scaling), a residual add, RMSNorm, a SwiGLU MLP down(silu(gate(x)) * up(x)) and a
 * residual add; a final RMSNorm; the LM head (its own weight, or the embedding's when tied); mean
 * cross-entropy over the next tokens. No biases, no dropout. Attention is one fused kernel
 * (FlashAttention's contract, kernel.h): a layer keeps O(seq) activations, no [seq, seq] tensor.
 * This header holds what is Llama's own: its configurations, its units and HF's names; the
 * model, once created, is an fsdp_lm_t (lm.h), as every language model is.
 *
 * Units: the root "model" owns model.embed_tokens.weight, model.norm.weight and lm_head.weight
 * (absent when tied) and keeps them unsharded from forward to backward, as PyTorch's root does;
 * every decoder layer "model.layers.<i>" is a unit, as fsdp_auto_wrap with
 * ModuleWrapPolicy({LlamaDecoderLayer}) decides over HF's module tree. Parameters carry HF's names
 * and nn.Linear's [out, in] layout, so a FULL checkpoint (checkpoint.h) is an HF state dict.
 */
#ifndef FSDP_LLAMA_H
#define FSDP_LLAMA_H

#include <fsdp/api.h>

#include <fsdp/lm.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_llama_config {
    int n_layer;       /* decoder layers */
    int n_head;        /* query heads */
    int n_kv_head;     /* key/value heads; divides n_head */
    int dim;           /* hidden_size D */
    int ffn_dim;       /* intermediate_size F */
    int head_dim;      /* 0: dim / n_head */
    int max_seq;       /* max_position_embeddings: the longest sequence */
    int vocab_size;    /* rows of the embedding and the logits */
    double rope_theta; /* 10000 (Llama 2), 500000 (Llama 3) */
    float rms_norm_eps;
    float initializer_range; /* 0.02: std of the normal init */
    int tie_word_embeddings; /* 1: the LM head is the embedding */
    /* rope_scaling {"rope_type": "llama3", ...} when rope_scaling is 1 */
    int rope_scaling;
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_seq; /* original_max_position_embeddings */
} fsdp_llama_config_t;

typedef struct fsdp_llama_preset {
    const char *name; /* "llama-tiny", "llama2-7b", ... */
    fsdp_llama_config_t cfg;
    uint64_t params;         /* the published parameter count */
    const char *description; /* where the numbers come from */
} fsdp_llama_preset_t;

/* The presets: llama-tiny (tests and the demo), llama2-7b, llama2-13b, llama2-70b, llama3-8b,
 * llama3-70b, llama3.1-405b, llama3.2-1b, llama3.2-3b (their HF config.json). */
FSDP_API const fsdp_llama_preset_t *fsdp_llama_presets(int *count_p);
FSDP_API const char *fsdp_llama_preset_names(void);

/* 1 when spec names a Llama model (a preset or "llama:..."), whether or not it parses. */
FSDP_API int fsdp_llama_spec_is_llama(const char *spec);
/* A preset name, or "llama:layers=L,heads=H,kv_heads=K,dim=D,ffn=F,seq=T,vocab=V,rope_theta=X,
 * eps=E[,tie=1][,rope_scaling=llama3][,rope_factor=F][,head_dim=hd]", any subset, the others from
 * llama-tiny (rope_scaling=llama3 takes Llama 3.1's factor 8, frequency factors 1 and 4 and
 * original context 8192). Errors are FSDP_ERR_INVALID_PARAM, logged with what is allowed. */
FSDP_API fsdp_status_t fsdp_llama_config_parse(const char *spec, fsdp_llama_config_t *cfg_p);
/* head_dim, or dim / n_head when it is 0 */
FSDP_API int fsdp_llama_head_dim(const fsdp_llama_config_t *cfg);
/* V D (tied ? 1 : 2) + L (D (H + 2K) hd + H hd D + 3 D F + 2 D) + D */
FSDP_API uint64_t fsdp_llama_num_params(const fsdp_llama_config_t *cfg);

/* ---- the model on one rank (lm.h) ---- */

/* Creates the units on fs (see above); the rest is lm.h's. fsdp_lm_init_params is HF's
 * _init_weights: every Linear and the embedding N(0, initializer_range), RMSNorm weights 1.
 * Activation checkpointing takes every FSDP_LM_CKPT_* policy. */
FSDP_API fsdp_status_t fsdp_llama_create(fsdp_t *fs, const fsdp_llama_config_t *cfg,
                                         fsdp_lm_t **lm_p);

/* Parameter indexes within a layer unit and within the root (HF's named_parameters order). */
enum {
    FSDP_LLAMA_Q = 0,
    FSDP_LLAMA_K,
    FSDP_LLAMA_V,
    FSDP_LLAMA_O,
    FSDP_LLAMA_GATE,
    FSDP_LLAMA_UP,
    FSDP_LLAMA_DOWN,
    FSDP_LLAMA_LN1, /* input_layernorm */
    FSDP_LLAMA_LN2, /* post_attention_layernorm */
    FSDP_LLAMA_LAYER_NPARAMS
};
enum { FSDP_LLAMA_EMBED = 0, FSDP_LLAMA_NORM, FSDP_LLAMA_LM_HEAD, FSDP_LLAMA_ROOT_NPARAMS };

/* Shape mode only: allocates, instead of the fused kernels' buffers, the tensors HF's eager
 * LlamaForCausalLM and autograd hold (docs/costs.md, "The memory of eager autograd"): the f32
 * upcasts and bf16 products RMSNorm saves, the rotary embedding's intermediates, SiLU's output,
 * repeat_kv's copies of k and v, the f32 logits and log-softmax of the loss and the logits'
 * f32 gradients, each freed when eager PyTorch frees it; the kernels launched are the same.
 * FSDP_ERR_UNSUPPORTED on a device that holds data (the fused kernels read what eager PyTorch
 * would have freed), FSDP_ERR_INVALID_PARAM for a model of another family. Off by default. */
FSDP_API fsdp_status_t fsdp_llama_set_eager_memory(fsdp_lm_t *lm, int on);

/* ---- Hugging Face checkpoints (safetensors) ---- */

/* Opens an HF Llama checkpoint and checks it against a configuration, for fsdp_lm_load_weights
 * (closed by fsdp_lm_weights_close). `path` is a .safetensors file, HF's multi-file index
 * (model.safetensors.index.json: {"weight_map": {name: file}}, the files beside it), or a
 * directory holding either. Files are mapped, not read: a rank's load reads only its shard.
 * Names are LlamaForCausalLM's (the units above), in nn.Linear's [out, in] layout and HF's
 * rotate_half order of the q and k rows: HF's conversion of Meta's checkpoints permutes those
 * rows once, so HF files load as they are, and Meta's own consolidated.*.pth files are not read.
 * lm_head.weight is not needed when tied (and ignored if present); the rotary inv_freq buffers
 * some files carry are skipped. F32, BF16 and F16 tensors are read (widened to f32). A
 * missing, duplicated or unexpected tensor, or a shape or dtype mismatch, is FSDP_ERR_FORMAT
 * with one logged line naming the tensor and its file. fsdp_lm_save_weights writes one HF
 * model.safetensors, without lm_head.weight when tied. */
FSDP_API fsdp_status_t fsdp_llama_weights_open(const char *path, const fsdp_llama_config_t *cfg,
                                               fsdp_lm_weights_t **weights_p);

#ifdef __cplusplus
}
#endif
#endif
