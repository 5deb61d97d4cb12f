/* The core's private header: the per-rank fsdp_t, its units and their flat-parameter
 * handles. Only lib/ includes this. */
#ifndef FSDP_LIB_CORE_INT_H
#define FSDP_LIB_CORE_INT_H

#include "alloc/alloc_hidden.h"
#include "alloc/mem_index.h"
#include "core/core_hidden.h"
#include "trace/trace_hidden.h"

#include <fsdp/core.h>
#include <fsdp/log.h>

#include <stdio.h>

typedef struct fsdp_handle fsdp_handle_t;

/* FSDP2's per-parameter layout of one parameter of a group (docs/runtime.md section 6): dim-0
 * rows chunked over W ranks, S = ceil(d0 / W) rows a rank, each rank's chunk padded to S rows. */
typedef struct fsdp_pparam {
    size_t rows;      /* d0 */
    size_t rest;      /* elements per row */
    size_t chunk;     /* S * rest: one rank's padded slot */
    size_t slot;      /* where the slot starts in the shard (and in each rank's block of O) */
    void *unsharded;  /* U: W * chunk elements of the compute dtype, NULL when resharded */
    void *grad;       /* the autograd gradient, numel of the compute dtype, NULL when none */
    float *accum;     /* sync off under mixed precision: the gradient accumulated in f32 */
    /* reshard_after_forward = N: this rank's W / N chunks of U, from the post-forward to the
     * backward's copy-out (the N-group all-gathers them) */
    void *post_forward;
    size_t gslot; /* the reduce in progress: where its chunk sits in a rank's row of I */
    int reduced;  /* the reduce in progress includes it (it has a gradient) */
    int tp_partial; /* its gradient is summed over the tp group first (tp_partial_grad) */
} fsdp_pparam_t;

/* One unit's flat parameter (PyTorch's FlatParamHandle). Names follow docs/runtime.md
 * section 2: LS local shard, FP padded unsharded parameter, G unsharded gradient, SGS sharded
 * gradient kept for the optimizer. */
struct fsdp_handle {
    fsdp_unit_t *unit;
    int nparams;
    fsdp_param_info_t *params; /* names owned */
    size_t numel;              /* T */
    size_t shard_numel;        /* S */
    int world;                 /* W of the shard group */
    int rank;                  /* in the shard group */
    size_t numel_in_shard;     /* c_r */
    size_t shard_pad;          /* S - c_r */

    fsdp_dtype_t compute_dtype; /* param_dtype under mixed precision, else f32 */
    fsdp_dtype_t reduce_dtype;  /* gradient communication */
    int offload;                /* CPU offload: LS and CG in pinned host memory */

    float *local_shard;      /* LS: S f32 (SHARDED_PARAM, or pinned host with offload) */
    void *full_param_padded; /* FP: S*W compute dtype (UNSHARDED_PARAM), NULL when freed */
    void *mp_shard;          /* MPS: S (T for NO_SHARD) compute dtype (LOW_PREC_SHARD) */
    void *h2d_shard;      /* offload: device copy of LS, S f32, between pre-unshard and unshard */
    void *unsharded_grad; /* G: T compute dtype (GRADIENT), NULL outside backward */
    float *saved_grad_shard; /* SGS: S f32 (GRADIENT) */
    void *low_grad;          /* keep_low_precision_grads: SGS cast to the compute dtype (S) */
    float *cpu_grad;         /* CG: S f32 pinned host (offload) */
    int has_cpu_grad;        /* CG holds this step's gradient */
    float *summon_param;     /* summon_full_params: T f32 (device or host) */
    float *summon_grad;      /* summon with_grads: T f32 */
    int summon_on_host;
    int uses_unsharded_view; /* parameters currently point into FP (or LS for NO_SHARD) */
    /* What fsdp_unit_param_version reports (fsdp_handle_new_version numbers): LS's contents,
     * renewed at every write into LS and at every handout of a pointer that may write it; FP's,
     * renewed at every all-gather into it. */
    uint64_t shard_version;
    uint64_t gather_version;

    fsdp_handle_state_t state;
    int prefetched;
    int needs_pre_backward_unshard;
    int needs_pre_forward_unshard;
    int post_backward_called;
    int ran_pre_backward_hook;
    int pre_forward_order_index; /* -1 until recorded */
    int post_forward_index;      /* -1 until recorded this iteration */

    /* FSDP2 (fs->cfg.api): the per-parameter group in place of the flat parameter. Then
     * shard_numel is A, the padded slots of all parameters, local_shard holds them in parameter
     * order (pads zero) and saved_grad_shard the reduced gradient in the same layout. */
    fsdp_pparam_t *pp;          /* nparams; a tied parameter repeats its target's slot */
    void *ag_out;               /* O: W * A of the compute dtype, from copy-in to copy-out */
    fsdp_event_t *post_forward_event;  /* the post-forward copies, for the backward copy-in */
    int ag_blocks;                     /* blocks of ag_out: W, or N from the post-forward */
    size_t reduced_numel;              /* the reduce in progress: its R <= A elements a rank */
    int reshard_after_backward; /* 1 by default */
    int grads_pending;          /* sync off left unreduced gradients */
    fsdp_event_t *post_reduce_event;
    fsdp_unit_t **prefetch[2];  /* explicit lists: [0] forward, [1] backward */
    int nprefetch[2];
    int has_prefetch[2];        /* a list was set (an empty backward list still replaces) */
};

/* A parameter the unit does not manage (ignored_states): whole on every rank. */
typedef struct fsdp_ignored_param {
    fsdp_param_info_t info; /* name owned; offset 0, whole "shard" */
    float *value;           /* numel f32, device */
    float *grad;            /* numel f32, device */
} fsdp_ignored_param_t;

/* A module buffer: whole on every rank, f32 until lazy init casts it to buffer_dtype. */
typedef struct fsdp_buffer {
    fsdp_param_info_t info; /* name owned */
    void *data;             /* numel elements of dtype, device */
    fsdp_dtype_t dtype;
} fsdp_buffer_t;

struct fsdp_unit {
    fsdp_summon_options_t summon; /* of the summon this unit is in */
    fsdp_unit_t *summon_owner;    /* the unit fsdp_summon_full_params was called on */
    fsdp_t *fs;
    char *name;
    fsdp_unit_t *parent;
    int index;
    int is_root;
    fsdp_handle_t *handle; /* NULL when the unit owns no parameters */
    fsdp_training_state_t state;
    fsdp_strategy_t strategy; /* effective, this unit's */
    int reshard_after_forward; /* FSDP2: resolved to 1, 0 or N >= 2 */
    double divide_factor;      /* FSDP2: fsdp_unit_options_t.gradient_divide_factor */
    int force_sum;             /* FSDP2: fsdp_unit_options_t.force_sum_reduction */
    fsdp_group_t *post_forward_pg; /* FSDP2, N >= 2: the group of N this rank is in (shared) */
    fsdp_group_t *pg;         /* this unit's shard group */
    fsdp_group_t *replicate;  /* hybrid: this unit's inter-node group, else NULL */
    fsdp_ignored_param_t *ignored;
    int nignored;
    fsdp_buffer_t *buffers;
    int nbuffers;
};

#define FSDP_LIMITER_MAX_INFLIGHT 2

struct fsdp {
    fsdp_dev_t *dev;
    fsdp_config_t cfg;
    fsdp_strategy_t strategy; /* effective */
    fsdp_group_t *pg;         /* shard group */
    fsdp_group_t *replicate;  /* hybrid: the inter-node group, else NULL */
    fsdp_group_t *tp;         /* tensor parallelism's group (owned), else NULL */
    int owns_groups;          /* made by fsdp_create: destroyed with it */
    /* default hybrid groups made for hybrid units of a non-hybrid config (owned) */
    fsdp_group_t *unit_hybrid_pg, *unit_hybrid_replicate;
    int any_hybrid;           /* some unit is hybrid: the all-reduce stream exists */
    fsdp_dtype_t param_dtype; /* effective mixed precision */
    fsdp_dtype_t reduce_dtype;
    size_t host_pinned_bytes;
    fsdp_mem_t *mem;

    fsdp_stream_t *compute;       /* C */
    fsdp_stream_t *unshard;       /* U */
    fsdp_stream_t *pre_unshard;   /* P */
    fsdp_stream_t *post_backward; /* R */
    fsdp_stream_t *all_reduce;    /* A (== C unless hybrid) */

    fsdp_unit_t **units;
    int nunits, cap_units;
    fsdp_unit_t *root;
    /* parameter names of all units by hash (value: a name owned by its handle), so that a
     * new unit's names are checked against the model's in O(1) each, not O(parameters) */
    fsdp_ptrmap_t param_names;

    int lazy_init_done;
    int first_iter_done;
    int sync_gradients;
    int post_backward_callback_queued;

    /* execution order (docs/runtime.md section 2: recorded in the first iteration) */
    int forward_position; /* handles pre-forwarded so far this iteration */
    int order_change_warned;
    fsdp_handle_t **pre_forward_order;
    int n_pre_forward;
    fsdp_handle_t **post_forward_order;
    int n_post_forward, post_forward_cap;

    /* FSDP2: the last forward all-gather's output and its copy-out event, released by the next
     * group's copy-out or the root's post-forward; the last reduce-scatter input and its event,
     * released before the next group's reduce or in the final callback */
    /* FSDP2's groups of N ranks for reshard_after_forward = N, one per (shard group, N) */
    struct fsdp_raf_group {
        fsdp_group_t *parent, *group;
        int n;
    } *raf_groups;
    int n_raf_groups;
    void *ag_state_buf;
    fsdp_event_t *ag_state_event;
    void *rs_state_buf;
    fsdp_event_t *rs_state_event;

    /* rate limiter: free events of reshards, oldest first */
    fsdp_event_t *limiter_events[FSDP_LIMITER_MAX_INFLIGHT + 1];
    int n_limiter_events;

    const char *cur_unit;  /* the unit trace events are attributed to */
    const char *cur_phase; /* the hook running, for out-of-memory reports */
    char last_error[512];
};

/* Records an error message for fsdp_last_error and logs it. Returns `status`. */
fsdp_status_t fsdp_fail(fsdp_t *fs, fsdp_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* fsdp_fail for a status that a call below the core returned (a backend op, the allocator, a
 * core helper that logs its errors). That call logged the error where it found it, so the
 * message is recorded for fsdp_last_error and not logged again; except for the two statuses
 * that come with no line of this rank's: FSDP_ERR_RANK_FAILED (another rank failed and said
 * so; this line says where this rank stopped, and the tools fold such lines into one) and
 * FSDP_ERR_NO_MEMORY (a host allocation failed). */
fsdp_status_t fsdp_fail_below(fsdp_t *fs, fsdp_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static inline int fsdp_strategy_is_hybrid(fsdp_strategy_t s)
{
    return s == FSDP_HYBRID_SHARD || s == FSDP_HYBRID_SHARD_ZERO2;
}

static inline int fsdp_strategy_is_sharded(fsdp_strategy_t s)
{
    return s != FSDP_NO_SHARD;
}

/* FULL_SHARD and HYBRID_SHARD free the unsharded parameter after forward. */
static inline int fsdp_strategy_reshards_after_forward(fsdp_strategy_t s)
{
    return s == FSDP_FULL_SHARD || s == FSDP_HYBRID_SHARD;
}

/* hook_ctx.c: the hook context. fsdp_trace_hook: `hook` starts on u (may be NULL), the phase
 * out-of-memory reports name, and the hook's trace event when the rank traces;
 * fsdp_trace_unit_swap: later events and allocations are the unit's, and the previous unit is
 * returned to restore. */
void fsdp_trace_hook(fsdp_t *fs, const char *hook, const fsdp_unit_t *u);
const char *fsdp_trace_unit_swap(fsdp_t *fs, const char *unit);

/* groups.c: the intra-node shard group and the inter-node replicate group of hybrid sharding */
fsdp_status_t fsdp_groups_make_hybrid(fsdp_t *fs, fsdp_group_t **pg_p, fsdp_group_t **replicate_p);
/* The 2-D mesh of tensor parallelism (fsdp_config_t.tp_size): the tp group of consecutive ranks
 * and the dp group parameters are sharded over. Collective over the world. */
fsdp_status_t fsdp_groups_make_tp(fsdp_t *fs, fsdp_group_t **dp_p, fsdp_group_t **tp_p);

/* names.c: the model's names by hash */
fsdp_status_t fsdp_names_add_unit(fsdp_t *fs, const fsdp_unit_t *u);
int fsdp_name_taken(const fsdp_t *fs, const char *name);

/* sync.c: rank 0's numel values into host_out on every rank (a collective over the world) */
fsdp_status_t fsdp_broadcast_from_rank0(fsdp_t *fs, const float *host_values, size_t numel,
                                        float *host_out);

/* buffers.c */
fsdp_status_t fsdp_buffers_create(fsdp_t *fs, fsdp_unit_t *u, const fsdp_unit_options_t *o,
                                  const fsdp_param_spec_t *params, int nparams);
void fsdp_buffers_free(fsdp_t *fs, fsdp_unit_t *u);
fsdp_status_t fsdp_cast_buffers(fsdp_t *fs, fsdp_dtype_t dtype);

/* ignored.c: splits a unit's specs into its ignored parameters and *managed_p */
fsdp_status_t fsdp_ignored_split(fsdp_t *fs, fsdp_unit_t *u, const fsdp_param_spec_t *params,
                                 int nparams, fsdp_param_spec_t **managed_p, int *nmanaged_p);
void fsdp_ignored_free(fsdp_t *fs, fsdp_unit_t *u);

/* limiter.c: wait before an all-gather; record after a freeing reshard; drop all events */
fsdp_status_t fsdp_limiter_wait(fsdp_t *fs);
fsdp_status_t fsdp_limiter_record(fsdp_t *fs);
void fsdp_limiter_clear(fsdp_t *fs);

/* exec_order.c: the forward order of the first iteration and each iteration's post-forward
 * order; the prefetch targets they give (NULL: none) */
fsdp_status_t fsdp_exec_order_init(fsdp_t *fs);
void fsdp_exec_order_destroy(fsdp_t *fs);
fsdp_status_t fsdp_validate_forward_order(fsdp_t *fs, fsdp_handle_t *h);
void fsdp_exec_order_record_pre_forward(fsdp_t *fs, fsdp_handle_t *h);
fsdp_status_t fsdp_exec_order_record_post_forward(fsdp_t *fs, fsdp_handle_t *h);
fsdp_handle_t *fsdp_exec_order_forward_next(const fsdp_t *fs, const fsdp_handle_t *h);
fsdp_handle_t *fsdp_exec_order_backward_next(const fsdp_t *fs, const fsdp_handle_t *h);

/* handle.c */
fsdp_status_t fsdp_check_param_spec(fsdp_t *fs, const char *unit, const fsdp_param_spec_t *params,
                                    int nparams, int i);
fsdp_status_t fsdp_handle_create(fsdp_unit_t *u, const fsdp_param_spec_t *params, int nparams,
                                 fsdp_handle_t **h_p);
void fsdp_handle_destroy(fsdp_t *fs, fsdp_handle_t *h);
fsdp_status_t fsdp_handle_unshard(fsdp_t *fs, fsdp_handle_t *h);
fsdp_status_t fsdp_handle_reshard(fsdp_t *fs, fsdp_handle_t *h, int free_unsharded);
fsdp_status_t fsdp_handle_reduce_grad(fsdp_t *fs, fsdp_handle_t *h);
fsdp_status_t fsdp_handle_alloc_grad(fsdp_t *fs, fsdp_handle_t *h);
fsdp_status_t fsdp_handle_keep_low_precision_grad(fsdp_t *fs, fsdp_handle_t *h);
const void *fsdp_handle_shard_source(const fsdp_handle_t *h);
/* A number no handle of this process has had before: a buffer's contents, renewed */
uint64_t fsdp_handle_new_version(void);
fsdp_status_t fsdp_shard_alloc(fsdp_t *fs, fsdp_handle_t *h, size_t numel, void **ptr_p);
void fsdp_shard_free(fsdp_t *fs, fsdp_handle_t *h, void *ptr, size_t numel);

/* param_group.c: FSDP2's per-parameter groups (docs/runtime.md section 6) */
static inline int fsdp_is_fsdp2(const fsdp_t *fs)
{
    return fs->cfg.api == FSDP_API_FSDP2;
}
fsdp_status_t fsdp_pgroup_layout(fsdp_t *fs, fsdp_handle_t *h);
void fsdp_pgroup_free(fsdp_t *fs, fsdp_handle_t *h);
fsdp_status_t fsdp_pgroup_unshard(fsdp_t *fs, fsdp_handle_t *h, fsdp_stream_t *copy_in,
                                  fsdp_stream_t *gather);
fsdp_status_t fsdp_pgroup_wait_for_unshard(fsdp_t *fs, fsdp_handle_t *h, int retain);
fsdp_status_t fsdp_pgroup_release_ag_state(fsdp_t *fs);
fsdp_status_t fsdp_pgroup_reshard(fsdp_t *fs, fsdp_handle_t *h);
fsdp_status_t fsdp_pgroup_post_forward(fsdp_t *fs, fsdp_handle_t *h);
fsdp_status_t fsdp_pgroup_post_backward(fsdp_t *fs, fsdp_handle_t *h);
fsdp_status_t fsdp_pgroup_finalize(fsdp_t *fs);
int fsdp_pgroup_has_grads(const fsdp_handle_t *h);
fsdp_status_t fsdp_pgroup_grad(fsdp_t *fs, fsdp_handle_t *h, int index, void **grad_p);
/* fully_shard.c: the config's explicit prefetch lists, at lazy init */
fsdp_status_t fsdp_fully_shard_lazy_init(fsdp_t *fs);
/* The unit's shard (A elements, slots of S rows) gathered into host_out as T unpadded values */
fsdp_status_t fsdp_pgroup_gather(fsdp_t *fs, fsdp_handle_t *h, const float *shard,
                                 float *host_out);

/* Kernel launch helpers over the backend's kernel slot. */
fsdp_status_t fsdp_k_fill(fsdp_t *fs, fsdp_stream_t *s, void *x, fsdp_dtype_t dtype, size_t n,
                          double value);
fsdp_status_t fsdp_k_div(fsdp_t *fs, fsdp_stream_t *s, void *x, fsdp_dtype_t dtype, size_t n,
                         float divisor);
fsdp_status_t fsdp_k_cast(fsdp_t *fs, fsdp_stream_t *s, void *dst, fsdp_dtype_t dst_dtype,
                          const void *src, fsdp_dtype_t src_dtype, size_t n);
fsdp_status_t fsdp_k_axpy(fsdp_t *fs, fsdp_stream_t *s, float *y, const float *x, size_t n,
                          float alpha);

#endif
