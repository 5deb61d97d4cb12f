/* The hooks around each unit's forward and backward, and the final callback, in PyTorch FSDP's
 * order (docs/runtime.md section 2 A, D, E, G, H; state machines of section 3). */
#include "core/core_int.h"

#include <fsdp/trace.h>
#include <stdlib.h>
#include <string.h>

static const char *state_name(fsdp_training_state_t s)
{
    switch (s) {
    case FSDP_STATE_IDLE:
        return "idle";
    case FSDP_STATE_FORWARD_BACKWARD:
        return "forward_backward";
    case FSDP_STATE_SUMMON_FULL_PARAMS:
        return "summon_full_params";
    }
    return "invalid";
}

static const char *handle_state_name(fsdp_handle_state_t s)
{
    switch (s) {
    case FSDP_HANDLE_IDLE:
        return "idle";
    case FSDP_HANDLE_FORWARD:
        return "forward";
    case FSDP_HANDLE_BACKWARD_PRE:
        return "backward_pre";
    case FSDP_HANDLE_BACKWARD_POST:
        return "backward_post";
    case FSDP_HANDLE_SUMMON_FULL_PARAMS:
        return "summon_full_params";
    }
    return "invalid";
}

static fsdp_status_t bad_state(fsdp_unit_t *u, const char *hook, const char *expected)
{
    return fsdp_fail(u->fs, FSDP_ERR_STATE,
                     "rank %d: unit '%s': %s called in state %s (handle %s); it needs %s",
                     u->fs->dev->rank, u->name, hook, state_name(u->state),
                     u->handle ? handle_state_name(u->handle->state) : "none", expected);
}

static fsdp_status_t lazy_init(fsdp_t *fs)
{
    fsdp_dev_t *dev = fs->dev;
    fsdp_status_t status;

    if (fs->root->state != FSDP_STATE_IDLE)
        return bad_state(fs->root, "lazy init", "the root idle");
    /* high priority (-1) only for hybrid sharding with the limiter (section 2, notation);
     * FSDP2's copy-in, all-gather and reduce-scatter streams always (section 6) */
    int v2 = fsdp_is_fsdp2(fs);
    int prio = v2 || (fs->any_hybrid && fs->cfg.limit_all_gathers) ? -1 : 0;
    status = fsdp_dev_stream_create(dev, v2 ? "all_gather" : "unshard", prio, &fs->unshard);
    if (status == FSDP_OK)
        status = fsdp_dev_stream_create(dev, v2 ? "all_gather_copy_in" : "pre_unshard", prio,
                                         &fs->pre_unshard);
    if (status == FSDP_OK)
        status = fsdp_dev_stream_create(dev, v2 ? "reduce_scatter" : "post_backward", prio,
                                         &fs->post_backward);
    /* the all-reduce stream is the compute stream unless a unit is hybrid */
    fs->all_reduce = fs->compute;
    if (status == FSDP_OK && fs->any_hybrid)
        status = fsdp_dev_stream_create(dev, "all_reduce", 0, &fs->all_reduce);
    if (status != FSDP_OK)
        return fsdp_fail_below(fs, status, "rank %d: cannot create the fsdp streams", dev->rank);

    status = fsdp_exec_order_init(fs);
    if (status == FSDP_OK && v2)
        status = fsdp_fully_shard_lazy_init(fs);
    if (status != FSDP_OK)
        return status;
    /* buffers to buffer_dtype for the computation (section 2 A.1) */
    if (fs->cfg.mixed_precision.buffer_dtype != FSDP_DTYPE_UNSET) {
        status = fsdp_cast_buffers(fs, fs->cfg.mixed_precision.buffer_dtype);
        if (status != FSDP_OK)
            return status;
    }
    fs->lazy_init_done = 1;
    /* no unit can be added from here on: the name index has done its work */
    fsdp_ptrmap_destroy(&fs->param_names);
    fsdp_trace_set_memory(dev, fsdp_mem_counters(fs->mem));
    return FSDP_OK;
}

fsdp_status_t fsdp_root_pre_forward(fsdp_t *fs)
{
    fsdp_dev_t *dev = fs->dev;
    fsdp_status_t status;

    if (fs->root == NULL)
        return fsdp_fail(fs, FSDP_ERR_STATE, "forward before any unit was created");
    if (fs->post_backward_callback_queued)
        return fsdp_fail(fs, FSDP_ERR_STATE,
                         "rank %d: forward started before the previous backward's final "
                         "callback ran", dev->rank);
    if (!fs->lazy_init_done) {
        status = lazy_init(fs);
        if (status != FSDP_OK)
            return status;
    }
    fsdp_trace_hook(fs, "root_pre_forward", fs->root);
    /* a root without a flat parameter casts the buffers back to full precision at every
     * forward, as PyTorch's root does without a handle */
    if (fs->root->handle == NULL) {
        status = fsdp_cast_buffers(fs, FSDP_DTYPE_F32);
        if (status != FSDP_OK)
            return status;
    }
    fs->forward_position = 0;
    if (fs->cfg.forward_prefetch && !fsdp_is_fsdp2(fs)) {
        for (int i = 0; i < fs->nunits; i++) {
            fsdp_handle_t *h = fs->units[i]->handle;
            if (h != NULL) {
                h->needs_pre_forward_unshard = 1;
                h->prefetched = 0;
            }
        }
    }
    /* A.3: new all-gathers wait for the optimizer step enqueued on the compute stream */
    status = fsdp_stream_wait_stream(dev, fs->unshard, fs->compute);
    if (status == FSDP_OK)
        status = fsdp_stream_wait_stream(dev, fs->pre_unshard, fs->compute);
    return status;
}

/* Unshards a handle ahead of its use, without making the compute stream wait. */
static fsdp_status_t prefetch(fsdp_t *fs, fsdp_handle_t *target, fsdp_handle_state_t as)
{
    fsdp_handle_state_t prev = target->state;
    fsdp_status_t status;

    const char *unit = fsdp_trace_unit_swap(fs, target->unit->name);
    target->state = as;
    status = fsdp_handle_unshard(fs, target);
    target->state = prev;
    fsdp_trace_unit_swap(fs, unit);
    target->prefetched = 1;
    return status;
}

static fsdp_status_t backward_prefetch(fsdp_t *fs, fsdp_handle_t *h)
{
    fsdp_backward_prefetch_t want = h->state == FSDP_HANDLE_BACKWARD_PRE
                                        ? FSDP_BACKWARD_PREFETCH_PRE
                                        : FSDP_BACKWARD_PREFETCH_POST;
    fsdp_handle_t *target;

    if (fs->cfg.backward_prefetch != want)
        return FSDP_OK;
    target = fsdp_exec_order_backward_next(fs, h);
    if (target == NULL || !target->needs_pre_backward_unshard || target->prefetched)
        return FSDP_OK;
    return prefetch(fs, target, FSDP_HANDLE_BACKWARD_PRE);
}

/* FSDP2: issues the copy-in and all-gather of each target's group, no copy-out (semantics 2
 * B.5 and D.3-4); a group unsharded or already gathered is skipped. */
static fsdp_status_t prefetch_groups(fsdp_t *fs, fsdp_unit_t *const *targets, int n)
{
    fsdp_status_t status = FSDP_OK;

    for (int i = 0; i < n && status == FSDP_OK; i++) {
        fsdp_handle_t *t = targets[i]->handle;
        const char *unit;
        if (t == NULL || t->uses_unsharded_view || t->ag_out != NULL)
            continue;
        unit = fsdp_trace_unit_swap(fs, targets[i]->name);
        status = fsdp_pgroup_unshard(fs, t, fs->pre_unshard, fs->unshard);
        fsdp_trace_unit_swap(fs, unit);
        t->prefetched = 1;
    }
    return status;
}

/* FSDP2's pre-forward of a group (semantics 2 B.4-5): unshard, wait_for_unshard keeping the
 * all-gather output for the next group's copy-out, then the explicit forward prefetches. */
static fsdp_status_t pre_forward_group(fsdp_t *fs, fsdp_handle_t *h)
{
    fsdp_status_t status = fsdp_pgroup_unshard(fs, h, fs->pre_unshard, fs->unshard);

    if (status == FSDP_OK)
        status = fsdp_pgroup_wait_for_unshard(fs, h, 1);
    if (status == FSDP_OK)
        status = prefetch_groups(fs, h->prefetch[0], h->nprefetch[0]);
    return status;
}

/* FSDP2's pre-backward of a group (semantics 2 D.2-4): unshard, wait_for_unshard dropping the
 * all-gather output at once, then the explicit backward list or else the group before it in
 * post-forward order. */
static fsdp_status_t pre_backward_group(fsdp_t *fs, fsdp_handle_t *h)
{
    fsdp_status_t status = fsdp_pgroup_unshard(fs, h, fs->pre_unshard, fs->unshard);

    if (status == FSDP_OK)
        status = fsdp_pgroup_wait_for_unshard(fs, h, 0);
    if (status != FSDP_OK)
        return status;
    if (h->has_prefetch[1])
        return prefetch_groups(fs, h->prefetch[1], h->nprefetch[1]);
    fsdp_handle_t *target = fsdp_exec_order_backward_next(fs, h);
    return target != NULL ? prefetch_groups(fs, &target->unit, 1) : FSDP_OK;
}

fsdp_dtype_t fsdp_unit_input_dtype(const fsdp_unit_t *u, fsdp_dtype_t have)
{
    const fsdp_mixed_precision_t *mp = &u->fs->cfg.mixed_precision;

    if (!fsdp_is_fsdp2(u->fs) || mp->cast_forward_inputs == 0 ||
        mp->param_dtype == FSDP_DTYPE_UNSET || !fsdp_dtype_is_float(have))
        return have;
    return mp->param_dtype;
}

fsdp_dtype_t fsdp_unit_output_dtype(const fsdp_unit_t *u, fsdp_dtype_t have)
{
    const fsdp_mixed_precision_t *mp = &u->fs->cfg.mixed_precision;

    if (!fsdp_is_fsdp2(u->fs) || mp->output_dtype == FSDP_DTYPE_UNSET || !fsdp_dtype_is_float(have))
        return have;
    return mp->output_dtype;
}

fsdp_status_t fsdp_act_cast(fsdp_t *fs, fsdp_act_t *a, fsdp_dtype_t to,
                            fsdp_mem_category_t category)
{
    void *dst = NULL;
    fsdp_status_t status;

    if (a->dtype == to || !fsdp_dtype_is_float(a->dtype))
        return FSDP_OK;
    status = fsdp_mem_alloc(fs->mem, a->numel * fsdp_dtype_size(to), category, fs->compute, &dst);
    if (status == FSDP_OK)
        status = fsdp_k_cast(fs, fs->compute, dst, to, a->data, a->dtype, a->numel);
    if (status != FSDP_OK) {
        fsdp_mem_free(fs->mem, dst);
        return status;
    }
    a->data = dst;
    a->dtype = to;
    return FSDP_OK;
}

/* The pre-forward's cast of the floating forward inputs (semantics 2 B.3), between the hook
 * and the unshard. */
static fsdp_status_t cast_inputs(fsdp_unit_t *u, fsdp_act_t *inputs, int n)
{
    fsdp_status_t status = FSDP_OK;

    for (int i = 0; i < n && status == FSDP_OK; i++)
        status = fsdp_act_cast(u->fs, &inputs[i], fsdp_unit_input_dtype(u, inputs[i].dtype),
                               FSDP_MEM_ACTIVATION);
    return status;
}

fsdp_status_t fsdp_pre_forward(fsdp_unit_t *u)
{
    return fsdp_pre_forward_io(u, NULL, 0);
}

fsdp_status_t fsdp_pre_forward_io(fsdp_unit_t *u, fsdp_act_t *inputs, int n)
{
    fsdp_t *fs = u->fs;
    fsdp_handle_t *h = u->handle;
    fsdp_status_t status;

    if (u->is_root) {
        status = fsdp_root_pre_forward(fs);
        if (status != FSDP_OK)
            return status;
    } else if (!fs->lazy_init_done || fs->root->state != FSDP_STATE_FORWARD_BACKWARD) {
        return fsdp_fail(fs, FSDP_ERR_STATE,
                         "rank %d: unit '%s': pre-forward outside the root's forward (call "
                         "fsdp_pre_forward on the root '%s' first)",
                         fs->dev->rank, u->name, fs->root ? fs->root->name : "?");
    }
    if (u->state != FSDP_STATE_IDLE || (h && h->state != FSDP_HANDLE_IDLE))
        return bad_state(u, "pre-forward", "idle");
    fsdp_trace_hook(fs, "pre_forward", u);
    fsdp_trace_unit_swap(fs, u->name);

    if (h != NULL && !fs->first_iter_done && fs->cfg.validate_exec_order &&
        !fsdp_is_fsdp2(fs)) {
        status = fsdp_validate_forward_order(fs, h);
        if (status != FSDP_OK)
            return status;
    }
    u->state = FSDP_STATE_FORWARD_BACKWARD;
    status = cast_inputs(u, inputs, n);
    if (h == NULL || status != FSDP_OK)
        return status;
    fsdp_exec_order_record_pre_forward(fs, h);
    h->state = FSDP_HANDLE_FORWARD;
    if (fsdp_is_fsdp2(fs))
        return pre_forward_group(fs, h);
    if (!h->prefetched) {
        status = fsdp_handle_unshard(fs, h);
        if (status != FSDP_OK)
            return status;
    }
    h->needs_pre_forward_unshard = 0;
    status = fsdp_stream_wait_stream(fs->dev, fs->compute, fs->unshard);
    if (status != FSDP_OK)
        return status;
    /* D.2: forward prefetch is issued before this unit's compute */
    if (fs->cfg.forward_prefetch && fs->first_iter_done) {
        fsdp_handle_t *target = fsdp_exec_order_forward_next(fs, h);
        if (target != NULL && target->needs_pre_forward_unshard && !target->prefetched)
            status = prefetch(fs, target, FSDP_HANDLE_FORWARD);
    }
    return status;
}

fsdp_status_t fsdp_post_forward(fsdp_unit_t *u)
{
    fsdp_t *fs = u->fs;
    fsdp_handle_t *h = u->handle;
    fsdp_status_t status;

    if (u->state != FSDP_STATE_FORWARD_BACKWARD || (h && h->state != FSDP_HANDLE_FORWARD))
        return bad_state(u, "post-forward", "forward (after pre-forward)");
    fsdp_trace_hook(fs, "post_forward", u);
    if (h != NULL) {
        status = fsdp_exec_order_record_post_forward(fs, h);
        if (status != FSDP_OK)
            return status;
        /* D.4: the root keeps its parameters for backward, as do NO_RESHARD strategies;
         * FSDP2: as the unit's reshard_after_forward says */
        if (fsdp_is_fsdp2(fs))
            status = fsdp_pgroup_post_forward(fs, h);
        else
            status = fsdp_handle_reshard(
                fs, h, !u->is_root && fsdp_strategy_reshards_after_forward(u->strategy));
        if (status != FSDP_OK)
            return status;
        h->needs_pre_backward_unshard = 1;
        h->state = FSDP_HANDLE_IDLE;
    }
    u->state = FSDP_STATE_IDLE;
    fsdp_trace_unit_swap(fs, u->parent ? u->parent->name : NULL);
    /* FSDP2 C.3: the forward root lets the last all-gather output go */
    if (u->is_root && fsdp_is_fsdp2(fs))
        return fsdp_pgroup_release_ag_state(fs);
    return FSDP_OK;
}

fsdp_status_t fsdp_post_forward_io(fsdp_unit_t *u, fsdp_act_t *outputs, int n)
{
    fsdp_t *fs = u->fs;
    fsdp_status_t status = fsdp_post_forward(u);
    const char *unit;

    if (status != FSDP_OK || n == 0 || fs->cfg.mixed_precision.output_dtype == FSDP_DTYPE_UNSET)
        return status;
    /* C.4, the last of the post-forward: after the reshard and the root's release */
    unit = fsdp_trace_unit_swap(fs, u->name);
    for (int i = 0; i < n && status == FSDP_OK; i++)
        status = fsdp_act_cast(fs, &outputs[i], fsdp_unit_output_dtype(u, outputs[i].dtype),
                               FSDP_MEM_ACTIVATION);
    fsdp_trace_unit_swap(fs, unit);
    return status;
}

fsdp_status_t fsdp_pre_backward(fsdp_unit_t *u)
{
    fsdp_t *fs = u->fs;
    fsdp_handle_t *h = u->handle;
    fsdp_status_t status;

    if (h != NULL && h->ran_pre_backward_hook)
        return FSDP_OK; /* fires once per iteration, on the first output gradient */
    if (u->is_root) {
        if (!fs->post_backward_callback_queued) {
            if (u->state != FSDP_STATE_IDLE)
                return bad_state(u, "pre-backward", "idle (forward finished)");
            fs->post_backward_callback_queued = 1; /* E.1 */
        }
    } else {
        if (!fs->post_backward_callback_queued)
            return fsdp_fail(fs, FSDP_ERR_STATE,
                             "rank %d: unit '%s': pre-backward before the root's ('%s'), whose "
                             "gradient arrives first",
                             fs->dev->rank, u->name, fs->root->name);
        if (u->state != FSDP_STATE_IDLE)
            return bad_state(u, "pre-backward", "idle (forward finished)");
    }
    if (h != NULL && h->state != FSDP_HANDLE_IDLE)
        return bad_state(u, "pre-backward", "idle (forward finished)");

    fsdp_trace_hook(fs, "pre_backward", u);
    fsdp_trace_unit_swap(fs, u->name);
    u->state = FSDP_STATE_FORWARD_BACKWARD;
    if (h == NULL)
        return FSDP_OK;
    h->state = FSDP_HANDLE_BACKWARD_PRE;
    if (fsdp_is_fsdp2(fs)) {
        h->needs_pre_backward_unshard = 0;
        h->ran_pre_backward_hook = 1;
        return pre_backward_group(fs, h);
    }
    if (h->needs_pre_backward_unshard) {
        if (!h->prefetched) {
            status = fsdp_handle_unshard(fs, h);
            if (status != FSDP_OK)
                return status;
        }
        status = fsdp_stream_wait_stream(fs->dev, fs->compute, fs->unshard);
        if (status != FSDP_OK)
            return status;
    }
    h->needs_pre_backward_unshard = 0;
    status = backward_prefetch(fs, h); /* E.4, BACKWARD_PRE */
    h->ran_pre_backward_hook = 1;
    return status;
}

fsdp_status_t fsdp_post_backward(fsdp_unit_t *u)
{
    fsdp_t *fs = u->fs;
    fsdp_handle_t *h = u->handle;
    fsdp_status_t status;

    if (u->state != FSDP_STATE_FORWARD_BACKWARD)
        return bad_state(u, "post-backward", "forward_backward (after pre-backward)");
    if (h == NULL)
        return FSDP_OK; /* no flat parameter, no post-backward work */
    /* BACKWARD_POST -> BACKWARD_POST is allowed (reentrant checkpointing) */
    if (h->state != FSDP_HANDLE_BACKWARD_PRE && h->state != FSDP_HANDLE_BACKWARD_POST)
        return bad_state(u, "post-backward", "backward_pre (after pre-backward)");
    h->post_backward_called = 1;
    h->state = FSDP_HANDLE_BACKWARD_POST;
    fsdp_trace_hook(fs, "post_backward", u);
    fsdp_trace_unit_swap(fs, u->name);
    if (fsdp_is_fsdp2(fs)) {
        status = fsdp_pgroup_post_backward(fs, h);
        fsdp_trace_unit_swap(fs, u->parent ? u->parent->name : NULL);
        return status;
    }
    if (h->unsharded_grad == NULL)
        return FSDP_OK; /* G.1: no gradient reached this unit */

    status = fsdp_handle_reshard(fs, h, fsdp_strategy_is_sharded(u->strategy) &&
                                            (fs->sync_gradients ||
                                             fsdp_strategy_reshards_after_forward(u->strategy)));
    if (status == FSDP_OK)
        status = backward_prefetch(fs, h); /* G.3, BACKWARD_POST */
    if (status == FSDP_OK && fs->sync_gradients)
        status = fsdp_handle_reduce_grad(fs, h);
    fsdp_trace_unit_swap(fs, u->parent ? u->parent->name : NULL);
    return status;
}

/* FSDP2's final callback (semantics 2 F): the groups whose post-backward did not run, root
 * first, reduce now; then the waits and releases of the iteration's end. */
static fsdp_status_t finalize_groups(fsdp_t *fs)
{
    fsdp_status_t status = FSDP_OK;

    for (int i = 0; i < fs->nunits && status == FSDP_OK; i++) {
        fsdp_handle_t *h = fs->units[i]->handle;
        if (h == NULL || h->post_backward_called || h->state != FSDP_HANDLE_BACKWARD_PRE)
            continue;
        const char *unit = fsdp_trace_unit_swap(fs, fs->units[i]->name);
        status = fsdp_pgroup_post_backward(fs, h);
        fsdp_trace_unit_swap(fs, unit);
    }
    return status == FSDP_OK ? fsdp_pgroup_finalize(fs) : status;
}

fsdp_status_t fsdp_final_callback(fsdp_t *fs)
{
    fsdp_dev_t *dev = fs->dev;
    fsdp_status_t status = FSDP_OK;

    if (fs->root == NULL || !fs->post_backward_callback_queued)
        return fsdp_fail(fs, FSDP_ERR_STATE,
                         "rank %d: final callback without a backward (the root's pre-backward "
                         "queues it)", dev->rank);
    fsdp_trace_hook(fs, "final_callback", fs->root);
    fsdp_trace_unit_swap(fs, NULL);
    if (fsdp_is_fsdp2(fs)) {
        status = finalize_groups(fs);
        if (status != FSDP_OK)
            return status;
    } else if (fs->sync_gradients) {
        /* H.1: the optimizer reads what the post-backward stream wrote */
        status = fsdp_stream_wait_stream(dev, fs->compute, fs->post_backward);
        if (status == FSDP_OK && fs->all_reduce != fs->compute)
            status = fsdp_stream_wait_stream(dev, fs->compute, fs->all_reduce);
        if (status != FSDP_OK)
            return status;
    }
    if (fs->cfg.cpu_offload && fs->sync_gradients) {
        /* H.1: the host optimizer reads the offloaded gradients */
        status = fsdp_dev_stream_synchronize(dev, fs->compute);
        if (status == FSDP_OK)
            status = fsdp_dev_stream_synchronize(dev, fs->post_backward);
        if (status != FSDP_OK)
            return status;
    }
    fs->n_post_forward = 0; /* next_iter */
    fs->first_iter_done = 1;

    for (int i = 0; i < fs->nunits; i++) {
        fsdp_unit_t *u = fs->units[i];
        fsdp_handle_t *h = u->handle;
        if (h != NULL) {
            /* catch-all reshard for a unit whose post-backward did not run */
            if (h->uses_unsharded_view && !fsdp_is_fsdp2(fs)) {
                fsdp_status_t st = fsdp_handle_reshard(
                    fs, h, fsdp_strategy_is_sharded(u->strategy) &&
                               (fs->sync_gradients ||
                                fsdp_strategy_reshards_after_forward(u->strategy)));
                if (status == FSDP_OK)
                    status = st;
            }
            if (fs->sync_gradients && status == FSDP_OK && !fsdp_is_fsdp2(fs))
                status = fsdp_handle_keep_low_precision_grad(fs, h);
            if (h->offload && h->has_cpu_grad) {
                /* the device copy of an offloaded gradient goes only now (H.3) */
                fsdp_mem_free(fs->mem, h->saved_grad_shard);
                h->saved_grad_shard = NULL;
            }
            h->ran_pre_backward_hook = 0;
            h->needs_pre_backward_unshard = 0;
            h->post_forward_index = -1;
            h->post_backward_called = 0;
            h->state = FSDP_HANDLE_IDLE;
            h->prefetched = 0;
        }
        u->state = FSDP_STATE_IDLE;
    }
    fs->post_backward_callback_queued = 0;
    return status;
}
