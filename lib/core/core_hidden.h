/* The core, hidden: the runtime's and the units' state beyond the user API, and the shard math:
 * read by lib/nn (the optimizer, checkpoints) and the sim's symmetry classes.
 *
 * libfsdp.so exports only the user API of include/fsdp/ (DESIGN.md, "Layers"); these functions are
 * declared here instead, for the rest of the library and for the tests and benchmarks that link
 * the library's parts statically (FSDP_INTERNAL_LIBS in common.am). */
#ifndef FSDP_CORE_HIDDEN_H
#define FSDP_CORE_HIDDEN_H

#include <fsdp/core.h>

/* ---- shard arithmetic (docs/runtime.md, section 4) ---- */

/* S = ceil(T / W), the chunk each rank holds (padded). W >= 1. */
size_t fsdp_shard_numel(size_t total, int world);
/* Elements of the flat parameter rank r holds, and the padding it adds. */
void fsdp_shard_extent(size_t total, int world, int rank, size_t *numel_p, size_t *pad_p);
/* Gradient division factors for a reduction over D ranks: pre before, post after. */
void fsdp_divide_factors(int d, double *pre_p, double *post_p);

/* ---- the runtime ---- */

/* The effective strategy (NO_SHARD when the shard group has one rank, as PyTorch forces). */
fsdp_strategy_t fsdp_strategy(const fsdp_t *fs);
/* The group parameters are sharded over. */
fsdp_group_t *fsdp_shard_group(fsdp_t *fs);
/* The group sharded gradients are all-reduced over (hybrid strategies), else NULL. */
fsdp_group_t *fsdp_replicate_group(fsdp_t *fs);
/* Tensor parallelism's group (fsdp_config_t.tp_size > 1), else NULL. */
fsdp_group_t *fsdp_tp_group(fsdp_t *fs);
/* fsdp_config_t.tp_loss_parallel, under tensor parallelism; else 0. */
int fsdp_tp_loss_parallel(const fsdp_t *fs);
/* fsdp_set_sync_gradients' setting. */
int fsdp_sync_gradients(const fsdp_t *fs);
fsdp_training_state_t fsdp_training_state(const fsdp_t *fs);
/* Bytes of pinned host memory held for CPU offload. */
size_t fsdp_host_pinned_bytes(const fsdp_t *fs);

/* ---- units ---- */

int fsdp_num_units(const fsdp_t *fs);
fsdp_unit_t *fsdp_unit_at(fsdp_t *fs, int index); /* creation order */
fsdp_unit_t *fsdp_root(fsdp_t *fs);
const char *fsdp_unit_name(const fsdp_unit_t *u);
int fsdp_unit_has_params(const fsdp_unit_t *u);
int fsdp_unit_num_params(const fsdp_unit_t *u);
/* S, the shard numel (fsdp_unit_flat_numel). */
size_t fsdp_unit_shard_numel(const fsdp_unit_t *u);
fsdp_handle_state_t fsdp_unit_handle_state(const fsdp_unit_t *u);
fsdp_training_state_t fsdp_unit_training_state(const fsdp_unit_t *u);
/* 1 when the unit's shard and gradient live in host memory (CPU offload). */
int fsdp_unit_offloaded(const fsdp_unit_t *u);

/* Ignored parameters (fsdp_unit_ignored_param): how many, each one's name and shape, and this
 * rank's host values (numel floats) copied into parameter `index`. */
int fsdp_unit_num_ignored_params(const fsdp_unit_t *u);
fsdp_status_t fsdp_unit_ignored_param_info(const fsdp_unit_t *u, int index,
                                           fsdp_param_info_t *info_p);
fsdp_status_t fsdp_unit_set_ignored_param(fsdp_unit_t *u, int index, const float *host_values);

/* Module buffers (fsdp_unit_buffer): how many, and each one's name, ndim, shape and numel. */
int fsdp_unit_num_buffers(const fsdp_unit_t *u);
fsdp_status_t fsdp_unit_buffer_info(const fsdp_unit_t *u, int index, fsdp_param_info_t *info_p);

/* Sets this rank's part of parameter `index` alone: host_values are its numel_in_shard floats
 * from intra_start (fsdp_unit_param_info); nothing is read when it has no part in the shard.
 * Not a collective, so sync_module_states does not apply: each rank reads its own part (a
 * checkpoint loaded without any rank holding the whole parameter). Call while the unit is idle. */
fsdp_status_t fsdp_unit_set_param_shard(fsdp_unit_t *u, int index, const float *host_values);
/* As fsdp_unit_gather_full, for any buffer laid out as the unit's shard (S floats where the
 * shard lives), e.g. an optimizer state. A collective. */
fsdp_status_t fsdp_unit_gather_buffer(fsdp_unit_t *u, const float *shard, float *host_out);
/* Inside fsdp_summon_full_params with with_grads: the full gradient of parameter `index` (f32),
 * or NULL without one. */
float *fsdp_unit_full_grad(fsdp_unit_t *u, int index);

/* ---- FSDP2's MixedPrecisionPolicy at a unit's boundaries (docs/runtime.md section 6) ---- */

/* A tensor handed across a unit's boundary: numel elements of dtype at data (device memory). */
typedef struct fsdp_act {
    void *data;
    fsdp_dtype_t dtype;
    size_t numel;
} fsdp_act_t;

/* Replaces *a by a new block of `category` holding its elements cast to `to`, by one cast
 * kernel on the compute stream; the old block stays the caller's. Nothing when a is already of
 * `to` or not floating (torch's _cast_fp_tensor). */
fsdp_status_t fsdp_act_cast(fsdp_t *fs, fsdp_act_t *a, fsdp_dtype_t to,
                            fsdp_mem_category_t category);
/* fsdp_pre_forward with the unit's n forward inputs: under FSDP2 with cast_forward_inputs and a
 * param_dtype, each floating one not of param_dtype is replaced by its cast (FSDP_MEM_ACTIVATION),
 * after the pre-forward's hook and before its all-gather (semantics 2 B.3). */
fsdp_status_t fsdp_pre_forward_io(fsdp_unit_t *u, fsdp_act_t *inputs, int n);
/* fsdp_post_forward with the unit's n forward outputs: under FSDP2 with an output_dtype, each
 * floating one of another dtype is replaced by its cast, after the reshard (semantics 2 C.4). */
fsdp_status_t fsdp_post_forward_io(fsdp_unit_t *u, fsdp_act_t *outputs, int n);
/* The dtypes those casts give a floating tensor of dtype `have` (`have` when none). */
fsdp_dtype_t fsdp_unit_input_dtype(const fsdp_unit_t *u, fsdp_dtype_t have);
fsdp_dtype_t fsdp_unit_output_dtype(const fsdp_unit_t *u, fsdp_dtype_t have);

/* The API a runtime follows, by name ("fsdp1", "fsdp2"); parse returns -1 for another. */
fsdp_api_t fsdp_api(const fsdp_t *fs);
const char *fsdp_api_name(fsdp_api_t api);
int fsdp_api_parse(const char *s, fsdp_api_t *api_p);

#endif
