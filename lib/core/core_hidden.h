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

/* The API a runtime follows, by name ("fsdp1", "fsdp2"); parse returns -1 for another. */
fsdp_api_t fsdp_api(const fsdp_t *fs);
const char *fsdp_api_name(fsdp_api_t api);
int fsdp_api_parse(const char *s, fsdp_api_t *api_p);

#endif
