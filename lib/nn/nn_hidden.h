/* The built-in models, optimizers and data, hidden: their parts and counters that only the tests
 * read.
 *
 * libfsdp.so exports only the user API of include/fsdp/ (DESIGN.md, "Layers"); these functions are
 * declared here instead, for the rest of the library and for the tests and benchmarks that link
 * the library's parts statically (FSDP_INTERNAL_LIBS in common.am). */
#ifndef FSDP_NN_HIDDEN_H
#define FSDP_NN_HIDDEN_H

#include <fsdp/checkpoint.h>
#include <fsdp/data.h>
#include <fsdp/gpt2.h>
#include <fsdp/llama.h>
#include <fsdp/nn.h>

/* ---- from <fsdp/gpt2.h> ---- */

/* HF's GPT2Config defaults (the 124M model). */
void fsdp_gpt2_config_init(fsdp_gpt2_config_t *cfg);

/* Checks the ranges (every size >= 1, n_head divides n_embd, ...), logging what is wrong. */
fsdp_status_t fsdp_gpt2_config_check(const fsdp_gpt2_config_t *cfg);

/* Parameters of one block, and of the root (wte, wpe, ln_f). */
uint64_t fsdp_gpt2_block_params(const fsdp_gpt2_config_t *cfg);
uint64_t fsdp_gpt2_root_params(const fsdp_gpt2_config_t *cfg);

/* Forward FLOPs per token at sequence length seq (matrix products, attention included, with
 * the causal mask not exploited), the usual 2 x parameters + attention; training is about 3x. */
double fsdp_gpt2_flops_per_token(const fsdp_gpt2_config_t *cfg, int seq);

/* Reads a config's shape from a checkpoint's tensors (layers, width, vocab, positions; heads
 * are not in the tensors and are kept from *cfg). */
fsdp_status_t fsdp_gpt2_weights_infer_config(const char *path, fsdp_gpt2_config_t *cfg);

/* ---- from <fsdp/llama.h> ---- */

const fsdp_llama_preset_t *fsdp_llama_preset_find(const char *name);

fsdp_status_t fsdp_llama_config_check(const fsdp_llama_config_t *cfg);

uint64_t fsdp_llama_layer_params(const fsdp_llama_config_t *cfg);

/* The rotary inverse frequencies inv_freq[i], i < head_dim / 2, as HF computes them (scaled
 * when rope_scaling), in f32. */
void fsdp_llama_inv_freq(const fsdp_llama_config_t *cfg, float *inv_freq);


/* ---- from <fsdp/nn.h> ---- */

int64_t fsdp_optim_num_steps(const fsdp_optim_t *opt);

void fsdp_optim_set_num_steps(fsdp_optim_t *opt, int64_t steps);

const fsdp_optim_config_t *fsdp_optim_config(const fsdp_optim_t *opt);

/* With `allocate`, creates the (zeroed) state first, e.g. to load a checkpoint into it. */
fsdp_status_t fsdp_optim_unit_state_view(fsdp_optim_t *opt, fsdp_unit_t *u, int allocate,
                                         fsdp_optim_state_view_t *view_p);

/* step in [0, FSDP_OPTIM_STEP_MAX], else FSDP_ERR_INVALID_PARAM with a message. */
fsdp_status_t fsdp_optim_set_unit_step(fsdp_optim_t *opt, fsdp_unit_t *u, int64_t step,
                                       int has_buffer);

int fsdp_mlp_num_layers(const fsdp_mlp_t *mlp);

const int *fsdp_mlp_dims(const fsdp_mlp_t *mlp);

uint64_t fsdp_rng_next(fsdp_rng_t *rng);

/* Moves on as n calls of fsdp_rng_next would, in constant time. */
void fsdp_rng_skip(fsdp_rng_t *rng, uint64_t n);

/* n normal values of standard deviation std (Marsaglia's polar method: two values per accepted
 * pair of draws, one log, no trigonometry), of which only out[first .. first + count) are
 * computed and stored (the pairs that touch them); the generator moves past all n, as the
 * rejections take a variable number of draws. */
void fsdp_rng_normal_polar(fsdp_rng_t *rng, float *out, size_t n, float std, size_t first,
                           size_t count);

/* ---- from <fsdp/checkpoint.h> ---- */

const char *fsdp_state_dict_type_name(fsdp_state_dict_type_t type);

/* ---- from <fsdp/data.h> ---- */

uint32_t fsdp_tokens_at(const fsdp_tokens_t *tokens, size_t i); /* i < count */

fsdp_tokens_order_t fsdp_tokens_order(const fsdp_tokens_t *tokens);

/* SEQUENTIAL order: the position of global batch `step`'s window of B*T + 1 tokens. */
size_t fsdp_tokens_window(const fsdp_tokens_t *tokens, size_t batch, size_t seq, int64_t step);

#endif
