/* libfsdp: checkpoints of a model and its optimizer.
 *
 * A checkpoint directory holds one subdirectory per saved step and a `latest` file naming the
 * newest complete one. A save writes into `step-N.tmp/`, then renames it to `step-N/` and
 * replaces `latest` atomically, so a crash during a save leaves the previous checkpoint
 * loadable; the `step-N.tmp/` a crash leaves is removed by the next save into the directory (one
 * run saves into a directory at a time: fsdp-train locks it). Both calls are collectives: every
 * rank calls them.
 *
 * FULL: `model.safetensors` holds the unsharded parameters under their plain names (tied
 * aliases once), readable by PyTorch and HF tools as it is; `optimizer.safetensors` holds the
 * optimizer state as `state.<param>.<buffer>` (torch's names: exp_avg, exp_avg_sq,
 * momentum_buffer). Written by rank 0 (PyTorch's rank0_only full state dict). Under tensor
 * parallelism each tensor is whole: gathered over dp, then its tp slices over tp, put together
 * by rank 0 as its placement says (fsdp_param_spec_t.tp_shard); the files are those of one
 * process holding the same values, byte for byte.
 * SHARDED: `rank-RRRRR.safetensors` per rank, each holding the pieces of every parameter (and
 * its optimizer state) in that rank's shard, each named for its place in the whole tensor
 * (torch DCP's chunk offsets): `<name>@<offset>`, a 1-D run of the flattened tensor, or
 * `<name>@<row>,<col>`, a 2-D block [rows, cols] at that row and column (a tp rank's column
 * slice, Shard(1), with FSDP's rows of it: one block a column block, so GPT-2's c_attn, q, k
 * and v of this rank's heads, is three). Each element is in exactly one piece: of ranks that
 * hold the same values (a tp-replicated parameter, hybrid sharding's replicas, NO_SHARD) the
 * first writes them. `checkpoint.json` gives each parameter's whole shape, so a checkpoint
 * loads into any world size, sharding strategy, api or tp.
 * LOCAL: `rank-RRRRR.safetensors` per rank holding each unit's flat shard as it is, padding
 * included (`<unit>.flat_param`, and `state.<unit>.flat_param.<buffer>`), as PyTorch's
 * LOCAL_STATE_DICT: it loads only into the same world size, sharding, api and tp.
 * Module buffers (fsdp_unit_options_t.buffers) are saved whole, in f32, under their names: in
 * model.safetensors (FULL), rank 0's file (SHARDED) or every rank's file (LOCAL). Ignored
 * parameters are not saved.
 */
#ifndef FSDP_CHECKPOINT_H
#define FSDP_CHECKPOINT_H

#include <fsdp/api.h>

#include <fsdp/nn.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FSDP_STATE_DICT_FULL = 0,
    FSDP_STATE_DICT_SHARDED = 1,
    FSDP_STATE_DICT_LOCAL = 2
} fsdp_state_dict_type_t;

/* "full", "sharded", "local" */
FSDP_API int fsdp_state_dict_type_parse(const char *s, fsdp_state_dict_type_t *type_p);

/* Saves the model's parameters and, when opt is not NULL, the optimizer state, as step `step`.
 * Creates dir if needed. */
FSDP_API fsdp_status_t fsdp_checkpoint_save(fsdp_t *fs, fsdp_optim_t *opt, const char *dir,
                                            fsdp_state_dict_type_t type, int64_t step);

/* Loads the newest complete checkpoint of dir into the model (and opt, when not NULL: its
 * state and step counts). *step_p (may be NULL) gets the saved step. A missing, truncated or
 * corrupted checkpoint is a clear error on every rank. */
FSDP_API fsdp_status_t fsdp_checkpoint_load(fsdp_t *fs, fsdp_optim_t *opt, const char *dir,
                                            int64_t *step_p);

/* Writes the model of dir's newest checkpoint, full or sharded, as one safetensors file: the
 * bytes of the model.safetensors a full checkpoint of that model holds (every parameter whole
 * under its name, HF's for the built-in GPT-2 and Llama, tied aliases once, module buffers in
 * f32; no optimizer state). Reads the files alone: no ranks and no model. A local checkpoint
 * holds unnamed flat shards and is refused. *step_p (may be NULL) gets the checkpoint's step. */
FSDP_API fsdp_status_t fsdp_checkpoint_consolidate(const char *dir, const char *out_path,
                                                   int64_t *step_p);

#ifdef __cplusplus
}
#endif
#endif
