/* libfsdp: the FSDP runtime.
 *
 * One fsdp_t per rank holds the configuration, the streams, the units and their flat-parameter
 * handles. A model is a tree of units; each unit owns the parameters of its layers that no
 * child unit owns, flattened into one handle (or none). A C model has no autograd, so the hooks
 * are explicit: a unit's forward is wrapped as
 *
 *     fsdp_pre_forward(u); ...layers of u...; fsdp_post_forward(u);
 *
 * with children nested inside their parent, and the backward walks the units in reverse:
 *
 *     fsdp_pre_backward(u); ...gradients of u's layers...; fsdp_post_backward(u);
 *
 * then fsdp_final_callback(fs). The order of collectives, waits, allocations and frees inside
 * the hooks is PyTorch FSDP's (docs/runtime.md section 2).
 */
#ifndef FSDP_CORE_H
#define FSDP_CORE_H

#include <fsdp/api.h>

#include <fsdp/backend.h>
#include <fsdp/memory.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FSDP_MAX_DIMS 4

typedef enum {
    FSDP_FULL_SHARD = 0,
    FSDP_SHARD_GRAD_OP = 1,
    FSDP_NO_SHARD = 2,
    FSDP_HYBRID_SHARD = 3,
    FSDP_HYBRID_SHARD_ZERO2 = 4,
    FSDP_STRATEGY_COUNT
} fsdp_strategy_t;

/* In fsdp_unit_options_t: the unit takes the config's strategy. */
#define FSDP_STRATEGY_DEFAULT FSDP_STRATEGY_COUNT

FSDP_API const char *fsdp_strategy_name(fsdp_strategy_t s); /* "full_shard", ... */
FSDP_API int fsdp_strategy_parse(const char *s, fsdp_strategy_t *s_p);

typedef enum {
    FSDP_BACKWARD_PREFETCH_PRE = 0, /* BACKWARD_PRE (default) */
    FSDP_BACKWARD_PREFETCH_POST = 1,
    FSDP_BACKWARD_PREFETCH_NONE = 2
} fsdp_backward_prefetch_t;

/* "pre", "post", "none" (PyTorch's BackwardPrefetch names also accepted: BACKWARD_PRE...). */
FSDP_API int fsdp_backward_prefetch_parse(const char *s, fsdp_backward_prefetch_t *p_p);

/* Which of PyTorch's two FSDP APIs the runtime follows. FSDP1 (FullyShardedDataParallel): one
 * flat parameter per unit, sharded as one vector. FSDP2 (fully_shard): every parameter sharded
 * on dim 0 by itself, one all-gather and one reduce-scatter per unit through a copy-in and a
 * copy-out (docs/runtime.md section 6). The hooks a model calls are the same for both. */
typedef enum { FSDP_API_FSDP1 = 0, FSDP_API_FSDP2 = 1, FSDP_API_COUNT } fsdp_api_t;


/* FSDP2's reshard_after_forward: FSDP_RESHARD_DEFAULT is fully_shard's None (the root keeps
 * its parameters after forward, every other unit frees them), FSDP_RESHARD_TRUE and
 * FSDP_RESHARD_FALSE are True and False; an int N >= 2 dividing the shard group's size
 * reshards to groups of N consecutive ranks, whose all-gather the backward then runs (N = 1
 * is False, N = W is True, as torch; the groups are made by a split at unit creation). In
 * fsdp_unit_options_t, FSDP_RESHARD_INHERIT takes the config's. */
#define FSDP_RESHARD_FALSE 0
#define FSDP_RESHARD_DEFAULT (-1)
#define FSDP_RESHARD_TRUE (-2)
#define FSDP_RESHARD_INHERIT (-3)

/* A dtype left unset in fsdp_mixed_precision_t. */
#define FSDP_DTYPE_UNSET FSDP_DTYPE_COUNT

/* PyTorch's MixedPrecision (FSDP1) and MixedPrecisionPolicy (FSDP2). Parameters are kept in f32;
 * param_dtype is the dtype of the low-precision shard, the all-gather and the compute;
 * reduce_dtype that of gradient communication (default: FSDP1 param_dtype when only that is
 * set, else f32; FSDP2 f32, the gradients' own dtype, as torch 2.15). FSDP2 has no
 * buffer_dtype or keep_low_precision_grads. */
typedef struct fsdp_mixed_precision {
    fsdp_dtype_t param_dtype;  /* FSDP_DTYPE_UNSET = full precision */
    fsdp_dtype_t reduce_dtype; /* FSDP_DTYPE_UNSET */
    /* FSDP_DTYPE_UNSET. The units' buffers are cast to it at lazy init (the first root
     * pre-forward) and stay in it, except that a root without parameters casts them back to
     * f32 (their dtype) at every pre-forward, as PyTorch; state dicts hold them in f32. */
    fsdp_dtype_t buffer_dtype;
    /* 1: after backward the sharded gradient is handed to the optimizer in param_dtype (it is
     * reduced and accumulated as without it, then cast in the final callback); read it with
     * fsdp_unit_sharded_grad_data. No effect without param_dtype. 0 by default. */
    int keep_low_precision_grads;
    /* Floating-point forward inputs cast to param_dtype at each unit's pre-forward. -1 (the
     * default): the API's default, FSDP1's MixedPrecision 0, FSDP2's MixedPrecisionPolicy 1.
     * Under FSDP1 the runtime casts nothing (docs/runtime.md section 1); under FSDP2 a built-in
     * model's unit boundaries are cast (section 6). */
    int cast_forward_inputs;
    /* FSDP2's MixedPrecisionPolicy.output_dtype: floating-point forward outputs cast to it at
     * each unit's post-forward, their gradients cast back in backward (FSDP_DTYPE_UNSET: no
     * cast). FSDP1, whose MixedPrecision has none, ignores it (a struct built before it
     * existed, zeroed, still runs there as it did). */
    fsdp_dtype_t output_dtype;
} fsdp_mixed_precision_t;

typedef struct fsdp_config {
    fsdp_strategy_t strategy;                  /* FSDP_FULL_SHARD */
    fsdp_backward_prefetch_t backward_prefetch; /* FSDP_BACKWARD_PREFETCH_PRE */
    int forward_prefetch;                      /* 0 */
    int limit_all_gathers;                     /* 1 */
    /* The group parameters are sharded over; NULL = the world, or for hybrid strategies the
     * ranks of this node (PyTorch's default intra-node group). */
    fsdp_group_t *process_group;
    /* Hybrid strategies: the group gradients are all-reduced over; NULL = the ranks with this
     * rank's local rank on every node (PyTorch's default inter-node group). Set both groups
     * or neither. */
    fsdp_group_t *replicate_group;
    /* Hybrid strategies without explicit groups: ranks per node; 0 = the backend's
     * local_size. Must divide the world size. */
    int ranks_per_node;
    /* In the first iteration, check across ranks that every rank runs the units' forwards in
     * the same order (one small all-gather per unit), failing every rank with the first
     * difference instead of hanging in a mismatched collective. 1 by default. */
    int validate_exec_order;
    fsdp_mixed_precision_t mixed_precision; /* all unset: full precision */
    /* PyTorch's CPUOffload(offload_params=True): sharded parameters and gradients live in
     * pinned host memory; the optimizer steps on the host. 0 by default. */
    int cpu_offload;
    /* PyTorch's use_orig_params: parameters keep their own identity inside the flat
     * parameter, so a unit may mix frozen (requires_grad = 0) and trainable parameters; frozen
     * ones get no gradient and the optimizer skips them. 0 by default. */
    int use_orig_params;
    /* sync_module_states: fsdp_unit_set_param takes rank 0's values on every rank, broadcast
     * in buckets of sync_bucket_bytes (0 = 250 MiB, PyTorch's bucket). 0 by default. */
    int sync_module_states;
    size_t sync_bucket_bytes;
    size_t device_capacity; /* bytes, 0 = unlimited */
    /* FSDP_API_FSDP1 by default. Under FSDP_API_FSDP2 every unit is fully_shard'ed (strategy
     * full_shard, or hybrid_shard for HSDP's 2-D mesh of replicate_group x process_group);
     * backward_prefetch, forward_prefetch, limit_all_gathers, validate_exec_order,
     * use_orig_params and the FSDP1-only mixed-precision fields do not apply. */
    fsdp_api_t api;
    /* FSDP2: fully_shard's reshard_after_forward for every unit (FSDP_RESHARD_DEFAULT). */
    int reshard_after_forward;
    /* FSDP2: explicit prefetch lists for every unit but the root, in creation order: each
     * unit's forward list is the next unit (set_modules_to_forward_prefetch), and its backward
     * list the previous one (set_modules_to_backward_prefetch), which replaces the implicit
     * backward prefetch. fsdp_unit_set_prefetch sets any other lists. 0 by default. */
    int explicit_forward_prefetch;
    int explicit_backward_prefetch;
    /* FSDP2: tensor parallelism of tp_size ranks (0 or 1: none), a 2-D mesh of dp x tp with
     * W = dp tp: each tensor-parallel group is tp_size consecutive ranks of one node (tp_size
     * divides ranks_per_node, or the backend's local_size), and parameters are sharded over the
     * dp group of the ranks with this rank's tp index, both groups made by fsdp_create
     * (torchtitan's mesh). The models place their tensors on the tp group (Megatron's column
     * and row parallel layers with sequence parallelism, lm.h). With hybrid_shard the mesh is
     * HSDP's 3-D (replicate across nodes x shard within the node x tp). process_group and
     * replicate_group are refused with it. 0 by default. */
    int tp_size;
    /* With tp_size > 1: the language models keep their logits sharded over the vocabulary and
     * compute the loss across the tp group (torch's loss_parallel) instead of all-gathering
     * them. 0 by default. */
    int tp_loss_parallel;
} fsdp_config_t;

FSDP_API void fsdp_config_init(fsdp_config_t *cfg);

typedef struct fsdp fsdp_t;
typedef struct fsdp_unit fsdp_unit_t;

typedef struct fsdp_param_spec {
    const char *name; /* full name, e.g. "layers.0.weight"; copied */
    int ndim;         /* 0..FSDP_MAX_DIMS; 0 is a scalar */
    int64_t shape[FSDP_MAX_DIMS];
    /* 0: frozen. A unit mixing frozen and trainable parameters needs use_orig_params. */
    int requires_grad;
    int tied_to;       /* -1, or the index of an earlier spec of the same unit to share with */
    /* 1: PyTorch's ignored_states. The parameter is not flattened or sharded: every rank keeps
     * it whole, no collective touches it, FSDP reduces no gradient for it and it is not in
     * FSDP's state dicts; it is the caller's (fsdp_unit_ignored_param). Its index counts among
     * the unit's ignored parameters, the others' among the flattened ones. 0 by default. */
    int ignored;
    /* 1: under tensor parallelism (fsdp_config_t.tp_size > 1) the parameter is replicated over
     * the tp group and each tp rank's gradient is a partial sum (a norm's weight applied to
     * sequence shards): FSDP2 all-reduces the unsharded gradient over the tp group before its
     * reduce-scatter, as torch's FSDPParam redistributes a gradient to its parameter's
     * placement. No effect without tensor parallelism. 0 by default. */
    int tp_partial_grad;
} fsdp_param_spec_t;

/* Where a parameter sits in its handle's flat parameter and in this rank's shard
 * (docs/runtime.md section 4). */
typedef struct fsdp_param_info {
    const char *name;
    int ndim;
    int64_t shape[FSDP_MAX_DIMS];
    size_t numel;
    size_t offset;          /* start in the unsharded flat parameter */
    int tied_to;            /* -1, or the index it shares storage with */
    int requires_grad;
    int in_shard;           /* 1 if part of it lies in this rank's shard */
    size_t offset_in_shard; /* where that part starts in the shard */
    size_t intra_start;     /* first element of the parameter in the shard */
    size_t numel_in_shard;
} fsdp_param_info_t;

typedef enum {
    FSDP_STATE_IDLE = 0,
    FSDP_STATE_FORWARD_BACKWARD = 1,
    FSDP_STATE_SUMMON_FULL_PARAMS = 2
} fsdp_training_state_t;

typedef enum {
    FSDP_HANDLE_IDLE = 0,
    FSDP_HANDLE_FORWARD = 1,
    FSDP_HANDLE_BACKWARD_PRE = 2,
    FSDP_HANDLE_BACKWARD_POST = 3,
    FSDP_HANDLE_SUMMON_FULL_PARAMS = 4
} fsdp_handle_state_t;

/* ---- the runtime ---- */

FSDP_API fsdp_status_t fsdp_create(fsdp_dev_t *dev, const fsdp_config_t *cfg, fsdp_t **fs_p);
FSDP_API void fsdp_destroy(fsdp_t *fs);

FSDP_API fsdp_dev_t *fsdp_device(fsdp_t *fs);

FSDP_API fsdp_mem_t *fsdp_memory(fsdp_t *fs);
FSDP_API fsdp_stream_t *fsdp_compute_stream(fsdp_t *fs);

/* PyTorch's no_sync(): with sync off, backward keeps each unit's unsharded gradient and
 * accumulates into it, with no communication; the next iteration with sync on reduces the sum.
 * Call on every rank, outside forward and backward. */
FSDP_API fsdp_status_t fsdp_set_sync_gradients(fsdp_t *fs, int sync);

/* Clips the sharded gradients of every unit so that their total norm (over all ranks) is at
 * most max_norm, as torch.nn.utils.clip_grad_norm_ / FSDP.clip_grad_norm_. norm_type > 0, or
 * INFINITY for the max norm. A collective. *total_norm_p (may be NULL) gets the norm before
 * clipping. */
FSDP_API fsdp_status_t fsdp_clip_grad_norm(fsdp_t *fs, double max_norm, double norm_type,
                                           double *total_norm_p);

/* Creates a unit. The first unit created with parent NULL is the root; every other unit needs
 * a parent created before it. Parameter names must be unique across the model. */
FSDP_API fsdp_status_t fsdp_unit_create(fsdp_t *fs, const char *name, fsdp_unit_t *parent,
                                        const fsdp_param_spec_t *params, int nparams,
                                        fsdp_unit_t **unit_p);

/* A module buffer (non-trainable state: running statistics, masks), f32 when created. */
typedef struct fsdp_buffer_spec {
    const char *name; /* full name, unique among parameters and buffers; copied */
    int ndim;         /* 0..FSDP_MAX_DIMS */
    int64_t shape[FSDP_MAX_DIMS];
} fsdp_buffer_spec_t;

/* Arguments PyTorch takes per FullyShardedDataParallel instance. */
typedef struct fsdp_unit_options {
    /* FSDP_STRATEGY_DEFAULT: the config's. Units of one model may mix strategies, hybrid and
     * not; each uses its own strategy's collectives, groups and divide factors. */
    fsdp_strategy_t strategy;
    /* The unit's shard group; NULL: for hybrid strategies the config's hybrid groups (or the
     * default intra-node ones), else the config's process_group when the config is not
     * hybrid, else the world. */
    fsdp_group_t *process_group;
    /* Hybrid only: the unit's replicate group; set both groups or neither. */
    fsdp_group_t *replicate_group;
    /* The module buffers of the unit's layers: not sharded, whole on every rank, zero when
     * created (fsdp_unit_set_buffer); none by default. */
    const fsdp_buffer_spec_t *buffers;
    int nbuffers;
    /* FSDP2: this unit's reshard_after_forward (FSDP_RESHARD_INHERIT: the config's). */
    int reshard_after_forward;
    /* FSDP2: set_gradient_divide_factor(f) (0: unset, the gradients averaged over the W x R
     * ranks they are reduced over): f32 and bf16 reduce-scatter with AVG when f = W, else
     * multiplied by 1 / f before a SUM (NCCL's PREMUL_SUM), the HSDP all-reduce with SUM;
     * other dtypes SUM with pre- and post-divide factors of f. */
    double gradient_divide_factor;
    /* FSDP2: set_force_sum_reduction_for_comms(True): SUM collectives, the whole division
     * after them. 0 by default. */
    int force_sum_reduction;
} fsdp_unit_options_t;

FSDP_API void fsdp_unit_options_init(fsdp_unit_options_t *opts); /* everything from the config */

/* fsdp_unit_create with per-unit options (NULL: the config's). A collective over the world
 * when the unit is the first hybrid one without explicit groups in a model whose config is not
 * hybrid: the default hybrid groups are made then. */
FSDP_API fsdp_status_t fsdp_unit_create_ex(fsdp_t *fs, const char *name, fsdp_unit_t *parent,
                                           const fsdp_param_spec_t *params, int nparams,
                                           const fsdp_unit_options_t *opts, fsdp_unit_t **unit_p);

FSDP_API fsdp_status_t fsdp_unit_param_info(const fsdp_unit_t *u, int index,
                                            fsdp_param_info_t *info_p);
/* T: flat numel (tied parameters once), S: shard numel, W: shard-group size. */
FSDP_API size_t fsdp_unit_flat_numel(const fsdp_unit_t *u);
/* The unit's effective strategy (NO_SHARD on a one-rank shard group) and groups. */
FSDP_API fsdp_strategy_t fsdp_unit_strategy(const fsdp_unit_t *u);
FSDP_API fsdp_group_t *fsdp_unit_shard_group(const fsdp_unit_t *u);
FSDP_API fsdp_group_t *fsdp_unit_replicate_group(const fsdp_unit_t *u); /* NULL unless hybrid */

/* This rank's sharded flat parameter (S elements, f32; pinned host memory with CPU offload,
 * else device memory), to read or to write (the optimizer) while the unit is idle; each call
 * renews fsdp_unit_param_version under NO_SHARD, so write before the next forward. */
FSDP_API float *fsdp_unit_local_shard(fsdp_unit_t *u);
/* The dtype parameters have between the hooks, and gradients are written in. */
FSDP_API fsdp_dtype_t fsdp_unit_compute_dtype(const fsdp_unit_t *u);
/* This rank's sharded gradient after the final callback (S elements, f32), NULL when none or
 * when it is kept in low precision (keep_low_precision_grads). */
FSDP_API float *fsdp_unit_sharded_grad(fsdp_unit_t *u);
/* The sharded gradient in whatever dtype it has (f32, or param_dtype with
 * keep_low_precision_grads), NULL when none; *dtype_p (may be NULL) gets the dtype. */
FSDP_API void *fsdp_unit_sharded_grad_data(fsdp_unit_t *u, fsdp_dtype_t *dtype_p);
/* Drops the sharded gradients of every unit (optimizer.zero_grad(set_to_none=True)). */
FSDP_API void fsdp_zero_grad(fsdp_t *fs);

/* Ignored parameters (fsdp_param_spec_t.ignored), indexed in spec order among themselves.
 * Each is whole on every rank: value and gradient are numel f32 in device memory, the gradient
 * zero at creation. FSDP never reads or writes them after that: no collective, no gradient
 * reduction, no broadcast under sync_module_states, no fsdp_zero_grad, no optimizer step, no
 * state dict or checkpoint; the caller owns them. */
FSDP_API float *fsdp_unit_ignored_param(fsdp_unit_t *u, int index);
FSDP_API float *fsdp_unit_ignored_grad(fsdp_unit_t *u, int index);

/* Module buffers (fsdp_unit_options_t.buffers), in spec order. fsdp_unit_buffer: the buffer in
 * device memory as the model computes with it, in *dtype_p (f32, or buffer_dtype after lazy
 * init). */
FSDP_API void *fsdp_unit_buffer(fsdp_unit_t *u, int index, fsdp_dtype_t *dtype_p);
/* Sets buffer `index` from numel f32 host values (stored in the buffer's present dtype). With
 * sync_module_states, rank 0's values, broadcast over the world (a collective), as PyTorch
 * broadcasts module buffers. Call while the unit is idle. */
FSDP_API fsdp_status_t fsdp_unit_set_buffer(fsdp_unit_t *u, int index, const float *host_values);
/* The buffer in full precision (f32), as state dicts hold it, into numel host floats. */
FSDP_API fsdp_status_t fsdp_unit_get_buffer(fsdp_unit_t *u, int index, float *host_out);

/* Sets parameter `index` from its full value (numel floats in host memory, the same on every
 * rank); each rank keeps the part in its shard. Call while the unit is idle. */
FSDP_API fsdp_status_t fsdp_unit_set_param(fsdp_unit_t *u, int index, const float *host_values);
/* The elements of host_values that fsdp_unit_set_param reads on this rank: *count_p from
 * *first_p, this rank's part of the shard (none when it has no part), or all numel under
 * sync_module_states. So an initializer need only compute those (the others may hold
 * anything). */
FSDP_API fsdp_status_t fsdp_unit_set_param_reads(const fsdp_unit_t *u, int index, size_t *first_p,
                                                 size_t *count_p);
/* Gathers the full flat parameter to host memory (T floats, unpadded) on every rank of the
 * shard group. A collective: every rank must call it. */
FSDP_API fsdp_status_t fsdp_unit_gather_full(fsdp_unit_t *u, float *host_out);

/* ---- during compute ---- */

/* The unsharded value of parameter `index`, valid between the unit's pre- and post-hooks, in
 * the unit's compute dtype (f32, or mixed precision's param_dtype). NULL outside. */
FSDP_API void *fsdp_unit_param(fsdp_unit_t *u, int index);
/* A nonzero number naming the values fsdp_unit_param gives now, or 0 outside that window,
 * during summon_full_params and in the sim's shape mode. While the number stays the same, so
 * do the values: it is renewed by every all-gather into the unsharded parameters and, where
 * they are the shard itself or made from it (NO_SHARD), by every write into the shard that the
 * library makes and by every call of fsdp_unit_local_shard (a pointer that may write it). The
 * compute only reads its parameters (as autograd refuses in-place writes to a leaf that
 * requires grad); a pointer from fsdp_unit_local_shard is for writes before the next forward.
 * Kernel descriptors carry it (kernel.h's gemm b_version) so a backend may reuse work. */
FSDP_API uint64_t fsdp_unit_param_version(const fsdp_unit_t *u);
/* The unsharded gradient of parameter `index`, in the compute dtype, for the backward compute to
 * accumulate into (zero on first use in an iteration). Valid between pre- and post-backward. */
FSDP_API fsdp_status_t fsdp_unit_grad(fsdp_unit_t *u, int index, void **grad_p);

/* ---- hooks ---- */

/* Lazy init on the first call; then orders the next all-gathers after the optimizer step.
 * fsdp_pre_forward of the root calls it. */
FSDP_API fsdp_status_t fsdp_root_pre_forward(fsdp_t *fs);
FSDP_API fsdp_status_t fsdp_pre_forward(fsdp_unit_t *u);
FSDP_API fsdp_status_t fsdp_post_forward(fsdp_unit_t *u);
FSDP_API fsdp_status_t fsdp_pre_backward(fsdp_unit_t *u);
FSDP_API fsdp_status_t fsdp_post_backward(fsdp_unit_t *u);
FSDP_API fsdp_status_t fsdp_final_callback(fsdp_t *fs);

/* ---- FSDP2 (fully_shard) per-unit controls ---- */

/* set_modules_to_forward_prefetch and set_modules_to_backward_prefetch: after its own
 * all-gather, unit u's pre-forward (pre-backward) issues the all-gathers of `targets`, in list
 * order; a backward list replaces the implicit backward prefetch for u. n = 0 clears a list.
 * FSDP2 only; before the first forward. */
FSDP_API fsdp_status_t fsdp_unit_set_prefetch(fsdp_unit_t *u, int backward,
                                              fsdp_unit_t *const *targets, int n);
/* set_reshard_after_backward: 0 keeps the unsharded parameters after the unit's post-backward
 * (the next forward needs no all-gather; reshard with fsdp_unit_reshard before the optimizer
 * steps). FSDP2 only. */
FSDP_API fsdp_status_t fsdp_unit_set_reshard_after_backward(fsdp_unit_t *u, int reshard);
/* FSDPModule.unshard() and reshard(), outside forward and backward: the all-gather (copy-in
 * and collective on the compute stream) and copy-out, or the free of the unsharded parameters.
 * FSDP2 only; each a collective over the unit's shard group for unshard. */
FSDP_API fsdp_status_t fsdp_unit_unshard(fsdp_unit_t *u);
FSDP_API fsdp_status_t fsdp_unit_reshard(fsdp_unit_t *u);

/* ---- summon_full_params ---- */

typedef struct fsdp_summon_options {
    int recurse;        /* 1: the unit and every unit below it; 0: the unit alone */
    int writeback;      /* 1: changes to the full parameters go back to the shards */
    int rank0_only;     /* 0: every rank gets the full parameters; 1: only rank 0 */
    int offload_to_cpu; /* 0: full parameters in device memory; 1: in host memory */
    int with_grads;     /* 0: 1 also gathers the sharded gradients (fsdp_unit_full_grad) */
} fsdp_summon_options_t;

FSDP_API void fsdp_summon_options_init(fsdp_summon_options_t *opts); /* PyTorch's defaults */

/* FSDP.summon_full_params: between this and fsdp_summon_end, fsdp_unit_param of the units in
 * scope returns full-precision (f32) full parameters. Refused (as PyTorch refuses them):
 * writeback with rank0_only, offload_to_cpu with NO_SHARD, with_grads with CPU offload,
 * inside forward/backward, and nested summons. A collective over the shard group. */
FSDP_API fsdp_status_t fsdp_summon_full_params(fsdp_unit_t *u, const fsdp_summon_options_t *opts);
FSDP_API fsdp_status_t fsdp_summon_end(fsdp_unit_t *u);

/* ---- symmetric ranks (lib/core/symmetry.c) ----
 *
 * In an FSDP job every rank runs the same program on its own shard; ranks differ only where
 * their shards differ (the padding of the last shards; under FSDP2 the rows of each parameter
 * they own), and in where they sit in the node and in the groups. fsdp_symmetric_ranks derives
 * classes of ranks that provably run alike from the layout of the units, for the sim's shape
 * mode (fsdp_sim_params_t.represent), which runs one rank of each class. */

/* Fills represent (world_size entries; represent[r] is the rank whose run is rank r's) for FSDP
 * over world_size ranks, ranks_per_node to a node, with strategy's default groups (the world;
 * for hybrid strategies the node and the ranks of one place across the nodes; under fs's tensor
 * parallelism, fsdp_config_t.tp_size, the groups of its mesh) and the units of fs (built on any
 * rank: their parameters' layout is the same on every rank). Returns the number of ranks that
 * run, or -1 (logged) when an argument is out of range or memory runs out. */
FSDP_API int fsdp_symmetric_ranks(fsdp_t *fs, int world_size, int ranks_per_node,
                                  fsdp_strategy_t strategy, int *represent);
/* On a rank of a launch with represent: FSDP_OK when every unit of fs shards alike on each
 * rank this one stands for (the same padding and pieces at their places in their groups); else
 * FSDP_ERR_UNSUPPORTED, logged, and the job must run those ranks apart. */
FSDP_API fsdp_status_t fsdp_symmetry_check(fsdp_t *fs, const int *represent);

/* Message of the last error (for tools), "" if none. */
FSDP_API const char *fsdp_last_error(const fsdp_t *fs);

#ifdef __cplusplus
}
#endif
#endif
