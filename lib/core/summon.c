/* summon_full_params: full-precision full parameters outside forward and backward, with
 * writeback to the shards (FSDP.summon_full_params, and PyTorch's rules for what it refuses). */
#include "core/core_int.h"

#include <stdlib.h>
#include <string.h>

void fsdp_summon_options_init(fsdp_summon_options_t *opts)
{
    opts->recurse = 1;
    opts->writeback = 1;
    opts->rank0_only = 0;
    opts->offload_to_cpu = 0;
    opts->with_grads = 0;
}

static int in_scope(const fsdp_unit_t *top, const fsdp_unit_t *u, int recurse)
{
    if (u == top)
        return 1;
    if (!recurse)
        return 0;
    for (const fsdp_unit_t *p = u->parent; p != NULL; p = p->parent) {
        if (p == top)
            return 1;
    }
    return 0;
}

/* Gathers a shard-layout buffer into a full T-element f32 buffer that stays allocated. */
static fsdp_status_t gather_kept(fsdp_unit_t *u, const float *shard, int keep, int on_host,
                                 float **out_p)
{
    fsdp_t *fs = u->fs;
    fsdp_handle_t *h = u->handle;
    size_t bytes = h->numel * sizeof(float);
    float *host = NULL;
    fsdp_status_t status;

    *out_p = NULL;
    host = malloc(bytes ? bytes : 1);
    if (host == NULL)
        return FSDP_ERR_NO_MEMORY;
    /* every rank takes part in the gather, even those that keep nothing */
    status = fsdp_unit_gather_buffer(u, shard, host);
    if (status != FSDP_OK || !keep) {
        free(host);
        return status;
    }
    if (on_host) {
        *out_p = host;
        return FSDP_OK;
    }
    status = fsdp_mem_alloc(fs->mem, bytes, FSDP_MEM_UNSHARDED_PARAM, fs->compute,
                            (void **)out_p);
    if (status == FSDP_OK)
        status = fsdp_dev_memcpy_async(fs->dev, *out_p, host, bytes, fs->compute);
    if (status == FSDP_OK)
        status = fsdp_dev_stream_synchronize(fs->dev, fs->compute);
    free(host);
    return status;
}

static void release(fsdp_t *fs, fsdp_handle_t *h)
{
    float **bufs[2] = {&h->summon_param, &h->summon_grad};
    for (int i = 0; i < 2; i++) {
        if (*bufs[i] == NULL)
            continue;
        if (h->summon_on_host)
            free(*bufs[i]);
        else
            fsdp_mem_free(fs->mem, *bufs[i]);
        *bufs[i] = NULL;
    }
}

fsdp_status_t fsdp_summon_full_params(fsdp_unit_t *top, const fsdp_summon_options_t *opts)
{
    fsdp_t *fs = top->fs;
    fsdp_summon_options_t o;
    fsdp_status_t status = FSDP_OK;
    int keep;

    if (opts == NULL)
        fsdp_summon_options_init(&o);
    else
        o = *opts;
    if (fsdp_is_fsdp2(fs))
        return fsdp_fail(fs, FSDP_ERR_UNSUPPORTED,
                         "summon_full_params is FSDP1's; fully_shard (api fsdp2) has none: "
                         "gather a unit's parameters with fsdp_unit_gather_full, or unshard it "
                         "with fsdp_unit_unshard");
    if (o.writeback && o.rank0_only)
        return fsdp_fail(fs, FSDP_ERR_UNSUPPORTED,
                         "summon_full_params: writeback with rank0_only is not supported (as "
                         "in PyTorch): the other ranks would keep stale shards");
    if (o.with_grads && fs->cfg.cpu_offload)
        return fsdp_fail(fs, FSDP_ERR_UNSUPPORTED,
                         "summon_full_params: with_grads is not supported with CPU offload (as "
                         "in PyTorch)");
    for (int i = 0; i < fs->nunits; i++) {
        fsdp_unit_t *u = fs->units[i];
        if (!in_scope(top, u, o.recurse))
            continue;
        if (o.offload_to_cpu && u->handle != NULL && !fsdp_strategy_is_sharded(u->strategy))
            return fsdp_fail(fs, FSDP_ERR_UNSUPPORTED,
                             "summon_full_params: offload_to_cpu is not supported with no_shard "
                             "(as in PyTorch; unit '%s' is no_shard)", u->name);
        if (u->state == FSDP_STATE_SUMMON_FULL_PARAMS)
            return fsdp_fail(fs, FSDP_ERR_STATE,
                             "rank %d: unit '%s': summon_full_params inside another summon",
                             fs->dev->rank, u->name);
        if (u->state != FSDP_STATE_IDLE || fs->post_backward_callback_queued ||
            (u->handle && u->handle->state != FSDP_HANDLE_IDLE))
            return fsdp_fail(fs, FSDP_ERR_STATE,
                             "rank %d: unit '%s': summon_full_params during forward or "
                             "backward", fs->dev->rank, u->name);
    }
    for (int i = 0; i < fs->nunits && status == FSDP_OK; i++) {
        fsdp_unit_t *u = fs->units[i];
        fsdp_handle_t *h = u->handle;
        if (!in_scope(top, u, o.recurse))
            continue;
        keep = !o.rank0_only || u->pg->rank == 0;
        if (h != NULL) {
            /* gathered while still idle; then the unit enters the summon state */
            h->summon_on_host = o.offload_to_cpu;
            status = gather_kept(u, h->local_shard, keep, o.offload_to_cpu, &h->summon_param);
            if (status == FSDP_OK && o.with_grads && fsdp_unit_sharded_grad(u) != NULL)
                status = gather_kept(u, fsdp_unit_sharded_grad(u), keep, o.offload_to_cpu,
                                     &h->summon_grad);
            h->state = FSDP_HANDLE_SUMMON_FULL_PARAMS;
        }
        u->state = FSDP_STATE_SUMMON_FULL_PARAMS;
        u->summon = o;
        u->summon_owner = top;
    }
    if (status != FSDP_OK)
        fsdp_summon_end(top);
    return status;
}

fsdp_status_t fsdp_summon_end(fsdp_unit_t *top)
{
    fsdp_t *fs = top->fs;
    fsdp_dev_t *dev = fs->dev;
    fsdp_status_t status = FSDP_OK;

    if (top->state != FSDP_STATE_SUMMON_FULL_PARAMS || top->summon_owner != top)
        return fsdp_fail(fs, FSDP_ERR_STATE,
                         "rank %d: unit '%s': summon end without its summon_full_params",
                         dev->rank, top->name);
    for (int i = 0; i < fs->nunits; i++) {
        fsdp_unit_t *u = fs->units[i];
        fsdp_handle_t *h = u->handle;
        if (u->summon_owner != top)
            continue;
        if (h != NULL && u->summon.writeback && h->summon_param != NULL &&
            h->numel_in_shard > 0 && status == FSDP_OK) {
            /* this rank's part of the (possibly changed) full parameter back into its shard */
            h->shard_version = fsdp_handle_new_version();
            status = fsdp_dev_memcpy_async(dev, h->local_shard,
                                           h->summon_param + (size_t)h->rank * h->shard_numel,
                                           h->numel_in_shard * sizeof(float), fs->compute);
            if (status == FSDP_OK)
                status = fsdp_dev_stream_synchronize(dev, fs->compute);
        }
        if (h != NULL) {
            release(fs, h);
            h->state = FSDP_HANDLE_IDLE;
        }
        u->state = FSDP_STATE_IDLE;
        u->summon_owner = NULL;
    }
    return status;
}

float *fsdp_unit_full_grad(fsdp_unit_t *u, int index)
{
    fsdp_handle_t *h = u->handle;
    if (h == NULL || index < 0 || index >= h->nparams || h->summon_grad == NULL ||
        u->state != FSDP_STATE_SUMMON_FULL_PARAMS)
        return NULL;
    return h->summon_grad + h->params[index].offset;
}
