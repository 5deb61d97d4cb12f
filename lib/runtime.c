/* The FSDP runtime: configuration, units, and the hooks with their training-state machines
 * (docs/runtime.md sections 2 and 3). */
#include "runtime.h"

#include <fsdp/trace.h>

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

fsdp_status_t fsdp_fail(fsdp_t *fs, fsdp_status_t status, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(fs->last_error, sizeof(fs->last_error), fmt, ap);
    va_end(ap);
    fsdp_error("%s", fs->last_error);
    return status;
}

const char *fsdp_last_error(const fsdp_t *fs)
{
    return fs ? fs->last_error : "";
}

void fsdp_config_init(fsdp_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->strategy = FSDP_FULL_SHARD;
    cfg->backward_prefetch = FSDP_BACKWARD_PREFETCH_PRE;
    cfg->forward_prefetch = 0;
    cfg->limit_all_gathers = 1;
    cfg->process_group = NULL;
    cfg->replicate_group = NULL;
    cfg->ranks_per_node = 0;
    cfg->validate_exec_order = 1;
    cfg->mixed_precision.param_dtype = FSDP_DTYPE_UNSET;
    cfg->mixed_precision.reduce_dtype = FSDP_DTYPE_UNSET;
    cfg->mixed_precision.buffer_dtype = FSDP_DTYPE_UNSET;
    cfg->cpu_offload = 0;
    cfg->device_capacity = 0;
}

static fsdp_status_t check_mixed_precision(fsdp_dev_t *dev, const fsdp_mixed_precision_t *mp)
{
    const fsdp_dtype_t dts[3] = {mp->param_dtype, mp->reduce_dtype, mp->buffer_dtype};
    static const char *const names[3] = {"param_dtype", "reduce_dtype", "buffer_dtype"};

    for (int i = 0; i < 3; i++) {
        if (dts[i] != FSDP_DTYPE_UNSET && !fsdp_dtype_is_float(dts[i])) {
            fsdp_error("rank %d: mixed precision %s %d is not a floating dtype; allowed: f32, "
                       "bf16, f16, or unset", dev->rank, names[i], (int)dts[i]);
            return FSDP_ERR_INVALID_PARAM;
        }
    }
    if (mp->keep_low_precision_grads) {
        fsdp_error("rank %d: keep_low_precision_grads is not supported yet: gradients are "
                   "handed to the optimizer in f32", dev->rank);
        return FSDP_ERR_UNSUPPORTED;
    }
    return FSDP_OK;
}

static void destroy_groups(fsdp_t *fs)
{
    if (!fs->owns_groups)
        return;
    if (fs->pg != NULL)
        fs->dev->ops->group_destroy(fs->dev, fs->pg);
    if (fs->replicate != NULL)
        fs->dev->ops->group_destroy(fs->dev, fs->replicate);
    fs->pg = fs->replicate = NULL;
    fs->owns_groups = 0;
}

/* PyTorch's default hybrid groups: shard within a node, replicate across nodes over the ranks
 * that share a local rank. Collective over the world. */
static fsdp_status_t make_hybrid_groups(fsdp_t *fs)
{
    fsdp_dev_t *dev = fs->dev;
    fsdp_group_t *world = dev->ops->group_world(dev);
    int per_node = fs->cfg.ranks_per_node > 0 ? fs->cfg.ranks_per_node : dev->local_size;
    fsdp_status_t status;

    if (per_node < 1 || world->size % per_node != 0) {
        fsdp_error("rank %d: ranks per node %d must divide the world size %d", dev->rank,
                   per_node, world->size);
        return FSDP_ERR_INVALID_PARAM;
    }
    fs->owns_groups = 1;
    status = dev->ops->group_split(dev, world, world->rank / per_node, world->rank, &fs->pg);
    if (status == FSDP_OK)
        status = dev->ops->group_split(dev, world, world->rank % per_node, world->rank,
                                       &fs->replicate);
    if (status != FSDP_OK) {
        fsdp_error("rank %d: cannot make the hybrid shard and replicate groups: %s", dev->rank,
                   fsdp_status_string(status));
        destroy_groups(fs);
    }
    return status;
}

fsdp_status_t fsdp_create(fsdp_dev_t *dev, const fsdp_config_t *cfg, fsdp_t **fs_p)
{
    fsdp_config_t defaults;
    fsdp_status_t status;
    fsdp_t *fs;

    if (dev == NULL || fs_p == NULL) {
        fsdp_error("fsdp_create: dev and fs_p must not be NULL");
        return FSDP_ERR_INVALID_PARAM;
    }
    status = fsdp_backend_check(dev->ops);
    if (status != FSDP_OK)
        return status;
    if (cfg == NULL) {
        fsdp_config_init(&defaults);
        cfg = &defaults;
    }
    if ((unsigned)cfg->strategy >= FSDP_STRATEGY_COUNT) {
        fsdp_error("invalid sharding strategy %d; allowed: full_shard, shard_grad_op, no_shard, "
                   "hybrid_shard, hybrid_shard_zero2", (int)cfg->strategy);
        return FSDP_ERR_INVALID_PARAM;
    }
    if ((unsigned)cfg->backward_prefetch > FSDP_BACKWARD_PREFETCH_NONE) {
        fsdp_error("invalid backward prefetch %d; allowed: pre, post, none",
                   (int)cfg->backward_prefetch);
        return FSDP_ERR_INVALID_PARAM;
    }

    status = check_mixed_precision(dev, &cfg->mixed_precision);
    if (status != FSDP_OK)
        return status;
    if ((cfg->process_group == NULL) != (cfg->replicate_group == NULL) &&
        fsdp_strategy_is_hybrid(cfg->strategy)) {
        fsdp_error("rank %d: %s needs both a shard group and a replicate group, or neither",
                   dev->rank, fsdp_strategy_name(cfg->strategy));
        return FSDP_ERR_INVALID_PARAM;
    }
    if (cfg->replicate_group != NULL && !fsdp_strategy_is_hybrid(cfg->strategy)) {
        fsdp_error("rank %d: a replicate group is only for hybrid_shard and hybrid_shard_zero2",
                   dev->rank);
        return FSDP_ERR_INVALID_PARAM;
    }

    fs = calloc(1, sizeof(*fs));
    if (fs == NULL)
        return FSDP_ERR_NO_MEMORY;
    fs->dev = dev;
    fs->cfg = *cfg;
    fs->strategy = cfg->strategy;
    /* reduce_dtype defaults to param_dtype when only that is set (docs/runtime.md section 1) */
    {
        const fsdp_mixed_precision_t *mp = &cfg->mixed_precision;
        fs->param_dtype = mp->param_dtype == FSDP_DTYPE_UNSET ? FSDP_DTYPE_F32 : mp->param_dtype;
        fs->reduce_dtype = mp->reduce_dtype != FSDP_DTYPE_UNSET ? mp->reduce_dtype
                                                                : fs->param_dtype;
    }
    if (fsdp_strategy_is_hybrid(cfg->strategy) && cfg->process_group == NULL) {
        status = make_hybrid_groups(fs);
        if (status != FSDP_OK)
            goto err_free_fs;
    } else {
        fs->pg = cfg->process_group ? cfg->process_group : dev->ops->group_world(dev);
        fs->replicate = cfg->replicate_group;
    }
    /* PyTorch forces NO_SHARD on a single-rank group */
    if (fs->pg->size == 1 && !fsdp_strategy_is_hybrid(fs->strategy) &&
        fs->strategy != FSDP_NO_SHARD) {
        fsdp_info("rank %d: a shard group of one rank: using no_shard instead of %s",
                  dev->rank, fsdp_strategy_name(fs->strategy));
        fs->strategy = FSDP_NO_SHARD;
    }
    fs->sync_gradients = 1;
    fs->compute = dev->ops->compute_stream(dev);
    status = fsdp_mem_create(dev, cfg->device_capacity, &fs->mem);
    if (status != FSDP_OK)
        goto err_free_groups;
    fsdp_trace_set_memory(dev, fs->mem);
    *fs_p = fs;
    return FSDP_OK;

err_free_groups:
    destroy_groups(fs);
err_free_fs:
    free(fs);
    return status;
}

static void destroy_streams(fsdp_t *fs)
{
    fsdp_dev_t *dev = fs->dev;
    fsdp_stream_t *streams[] = {fs->unshard, fs->pre_unshard, fs->post_backward,
                                fs->all_reduce != fs->compute ? fs->all_reduce : NULL};
    for (size_t i = 0; i < sizeof(streams) / sizeof(streams[0]); i++) {
        if (streams[i] != NULL)
            dev->ops->stream_destroy(dev, streams[i]);
    }
    fs->unshard = fs->pre_unshard = fs->post_backward = fs->all_reduce = NULL;
}

void fsdp_destroy(fsdp_t *fs)
{
    if (fs == NULL)
        return;
    for (int i = 0; i < fs->n_limiter_events; i++)
        fs->dev->ops->event_destroy(fs->dev, fs->limiter_events[i]);
    /* each unit's frees are its own; none names a unit already freed */
    for (int i = 0; i < fs->nunits; i++) {
        fsdp_trace_unit_swap(fs, fs->units[i]->name);
        fsdp_handle_destroy(fs, fs->units[i]->handle);
        fsdp_trace_unit_swap(fs, NULL);
        free(fs->units[i]->name);
        free(fs->units[i]);
    }
    free(fs->units);
    fsdp_ptrmap_destroy(&fs->param_names);
    free(fs->pre_forward_order);
    free(fs->post_forward_order);
    destroy_streams(fs);
    fsdp_trace_set_memory(fs->dev, NULL);
    fsdp_mem_destroy(fs->mem);
    destroy_groups(fs);
    free(fs);
}

fsdp_dev_t *fsdp_device(fsdp_t *fs)
{
    return fs->dev;
}

fsdp_mem_t *fsdp_memory(fsdp_t *fs)
{
    return fs->mem;
}

fsdp_stream_t *fsdp_compute_stream(fsdp_t *fs)
{
    return fs->compute;
}

fsdp_strategy_t fsdp_strategy(const fsdp_t *fs)
{
    return fs->strategy;
}

fsdp_group_t *fsdp_shard_group(fsdp_t *fs)
{
    return fs->pg;
}

fsdp_group_t *fsdp_replicate_group(fsdp_t *fs)
{
    return fs->replicate;
}

fsdp_status_t fsdp_set_sync_gradients(fsdp_t *fs, int sync)
{
    if (fs->post_backward_callback_queued ||
        (fs->root != NULL && fs->root->state != FSDP_STATE_IDLE))
        return fsdp_fail(fs, FSDP_ERR_STATE,
                         "rank %d: gradient sync can change only between iterations",
                         fs->dev->rank);
    fs->sync_gradients = sync != 0;
    return FSDP_OK;
}

int fsdp_sync_gradients(const fsdp_t *fs)
{
    return fs->sync_gradients;
}

fsdp_training_state_t fsdp_training_state(const fsdp_t *fs)
{
    return fs->root ? fs->root->state : FSDP_STATE_IDLE;
}

/* ---- units ---- */

/* FNV-1a, never 0 (the index's empty key). */
static uintptr_t name_hash(const char *name)
{
    uint64_t h = 14695981039346656037ull;

    for (const unsigned char *c = (const unsigned char *)name; *c != '\0'; c++)
        h = (h ^ *c) * 1099511628211ull;
    return (uintptr_t)h != 0 ? (uintptr_t)h : 1;
}

static int param_name_taken(const fsdp_t *fs, const char *name)
{
    const char *hit = fsdp_ptrmap_get(&fs->param_names, name_hash(name));

    if (hit == NULL)
        return 0;
    if (strcmp(hit, name) == 0)
        return 1;
    /* two names share a hash (the index holds the first): look at every name */
    for (int i = 0; i < fs->nunits; i++) {
        const fsdp_handle_t *h = fs->units[i]->handle;
        for (int j = 0; h && j < h->nparams; j++) {
            if (strcmp(h->params[j].name, name) == 0)
                return 1;
        }
    }
    return 0;
}

fsdp_status_t fsdp_unit_create(fsdp_t *fs, const char *name, fsdp_unit_t *parent,
                               const fsdp_param_spec_t *params, int nparams,
                               fsdp_unit_t **unit_p)
{
    fsdp_unit_t *u;
    fsdp_status_t status;

    if (name == NULL || nparams < 0 || (nparams > 0 && params == NULL))
        return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                         "fsdp_unit_create: a name is required and params must hold nparams "
                         "(>= 0) specs");
    if (fs->lazy_init_done)
        return fsdp_fail(fs, FSDP_ERR_STATE,
                         "unit '%s': units must be created before the first forward", name);
    if (parent == NULL && fs->root != NULL)
        return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                         "unit '%s': the model already has a root ('%s'); give a parent", name,
                         fs->root->name);
    if (parent != NULL && parent->fs != fs)
        return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                         "unit '%s': its parent belongs to another fsdp_t", name);
    for (int i = 0; i < nparams; i++) {
        if (params[i].name != NULL && param_name_taken(fs, params[i].name))
            return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                             "unit '%s': parameter name '%s' is already used by another unit",
                             name, params[i].name);
    }
    if (fs->nunits == fs->cap_units) {
        int cap = fs->cap_units ? fs->cap_units * 2 : 16;
        fsdp_unit_t **units = realloc(fs->units, sizeof(*units) * (size_t)cap);
        if (units == NULL)
            return FSDP_ERR_NO_MEMORY;
        fs->units = units;
        fs->cap_units = cap;
    }
    u = calloc(1, sizeof(*u));
    if (u == NULL)
        return FSDP_ERR_NO_MEMORY;
    u->name = strdup(name);
    if (u->name == NULL) {
        status = FSDP_ERR_NO_MEMORY;
        goto err_free_u;
    }
    u->fs = fs;
    u->parent = parent;
    u->index = fs->nunits;
    u->is_root = parent == NULL;
    u->state = FSDP_STATE_IDLE;
    if (nparams > 0) {
        status = fsdp_handle_create(u, params, nparams, &u->handle);
        if (status != FSDP_OK)
            goto err_free_name;
    }
    if (u->handle != NULL) {
        status = fsdp_ptrmap_reserve(&fs->param_names,
                                     fs->param_names.count + (size_t)u->handle->nparams);
        if (status != FSDP_OK)
            goto err_free_handle;
        for (int i = 0; i < u->handle->nparams; i++) {
            const char *pn = u->handle->params[i].name;
            uintptr_t key = name_hash(pn);
            if (fsdp_ptrmap_get(&fs->param_names, key) == NULL)
                fsdp_ptrmap_put(&fs->param_names, key, (void *)pn);
        }
    }
    fs->units[fs->nunits++] = u;
    if (u->is_root)
        fs->root = u;
    *unit_p = u;
    return FSDP_OK;

err_free_handle:
    fsdp_handle_destroy(fs, u->handle);
err_free_name:
    free(u->name);
err_free_u:
    free(u);
    return status;
}

int fsdp_num_units(const fsdp_t *fs)
{
    return fs->nunits;
}

fsdp_unit_t *fsdp_unit_at(fsdp_t *fs, int index)
{
    return index >= 0 && index < fs->nunits ? fs->units[index] : NULL;
}

fsdp_unit_t *fsdp_root(fsdp_t *fs)
{
    return fs->root;
}

const char *fsdp_unit_name(const fsdp_unit_t *u)
{
    return u->name;
}

int fsdp_unit_has_params(const fsdp_unit_t *u)
{
    return u->handle != NULL;
}

int fsdp_unit_num_params(const fsdp_unit_t *u)
{
    return u->handle ? u->handle->nparams : 0;
}

fsdp_status_t fsdp_unit_param_info(const fsdp_unit_t *u, int index, fsdp_param_info_t *info_p)
{
    if (u->handle == NULL || index < 0 || index >= u->handle->nparams)
        return FSDP_ERR_INVALID_PARAM;
    *info_p = u->handle->params[index];
    return FSDP_OK;
}

size_t fsdp_unit_flat_numel(const fsdp_unit_t *u)
{
    return u->handle ? u->handle->numel : 0;
}

size_t fsdp_unit_shard_numel(const fsdp_unit_t *u)
{
    return u->handle ? u->handle->shard_numel : 0;
}

fsdp_handle_state_t fsdp_unit_handle_state(const fsdp_unit_t *u)
{
    return u->handle ? u->handle->state : FSDP_HANDLE_IDLE;
}

fsdp_training_state_t fsdp_unit_training_state(const fsdp_unit_t *u)
{
    return u->state;
}

float *fsdp_unit_local_shard(fsdp_unit_t *u)
{
    return u->handle ? u->handle->local_shard : NULL;
}

float *fsdp_unit_sharded_grad(fsdp_unit_t *u)
{
    fsdp_handle_t *h = u->handle;
    if (h == NULL)
        return NULL;
    if (h->offload)
        return h->has_cpu_grad ? h->cpu_grad : NULL;
    return h->saved_grad_shard;
}

int fsdp_unit_offloaded(const fsdp_unit_t *u)
{
    return u->handle ? u->handle->offload : 0;
}

fsdp_dtype_t fsdp_unit_compute_dtype(const fsdp_unit_t *u)
{
    return u->handle ? u->handle->compute_dtype : u->fs->param_dtype;
}

size_t fsdp_host_pinned_bytes(const fsdp_t *fs)
{
    return fs->host_pinned_bytes;
}

void fsdp_zero_grad(fsdp_t *fs)
{
    for (int i = 0; i < fs->nunits; i++) {
        fsdp_handle_t *h = fs->units[i]->handle;
        if (h != NULL) {
            fsdp_mem_free(fs->mem, h->saved_grad_shard);
            h->saved_grad_shard = NULL;
            h->has_cpu_grad = 0;
        }
    }
}

static fsdp_status_t require_idle(fsdp_unit_t *u, const char *what)
{
    if (u->state != FSDP_STATE_IDLE || (u->handle && u->handle->state != FSDP_HANDLE_IDLE))
        return fsdp_fail(u->fs, FSDP_ERR_STATE, "unit '%s': %s needs the unit idle, not in "
                         "forward or backward", u->name, what);
    return FSDP_OK;
}

/* sync_module_states: rank 0's values, broadcast over the world in buckets, then each rank
 * keeps its part (docs/runtime.md section 4: 250 MiB buckets). A collective. */
static fsdp_status_t set_param_from_rank0(fsdp_unit_t *u, const fsdp_param_info_t *pi,
                                          const float *host_values)
{
    fsdp_t *fs = u->fs;
    fsdp_dev_t *dev = fs->dev;
    fsdp_group_t *world = dev->ops->group_world(dev);
    size_t bucket = fs->cfg.sync_bucket_bytes ? fs->cfg.sync_bucket_bytes : (size_t)250 << 20;
    size_t per = bucket / sizeof(float) ? bucket / sizeof(float) : 1;
    float *full = malloc(pi->numel * sizeof(float) + 1);
    void *d = NULL;
    fsdp_status_t status;

    if (full == NULL)
        return FSDP_ERR_NO_MEMORY;
    status = fsdp_mem_alloc(fs->mem, (pi->numel < per ? pi->numel : per) * sizeof(float) + 4,
                            FSDP_MEM_COMM_BUFFER, fs->compute, &d);
    for (size_t off = 0; off < pi->numel && status == FSDP_OK; off += per) {
        size_t n = pi->numel - off < per ? pi->numel - off : per;
        status = dev->ops->memcpy_async(dev, d, host_values + off, n * sizeof(float),
                                        fs->compute);
        if (status == FSDP_OK)
            status = dev->ops->broadcast(dev, world, d, n, FSDP_DTYPE_F32, 0, fs->compute);
        if (status == FSDP_OK)
            status = dev->ops->memcpy_async(dev, full + off, d, n * sizeof(float), fs->compute);
        if (status == FSDP_OK)
            status = dev->ops->stream_synchronize(dev, fs->compute);
    }
    if (status == FSDP_OK && pi->in_shard) {
        status = dev->ops->memcpy_async(dev, u->handle->local_shard + pi->offset_in_shard,
                                        full + pi->intra_start,
                                        pi->numel_in_shard * sizeof(float), fs->compute);
        if (status == FSDP_OK)
            status = dev->ops->stream_synchronize(dev, fs->compute);
    }
    fsdp_mem_free(fs->mem, d);
    free(full);
    return status;
}

fsdp_status_t fsdp_unit_set_param(fsdp_unit_t *u, int index, const float *host_values)
{
    fsdp_t *fs = u->fs;
    fsdp_dev_t *dev = fs->dev;
    const fsdp_param_info_t *pi;
    fsdp_status_t status;

    if (u->handle == NULL || index < 0 || index >= u->handle->nparams || host_values == NULL)
        return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                         "unit '%s': no parameter %d to set (it has %d)", u->name, index,
                         fsdp_unit_num_params(u));
    status = require_idle(u, "setting a parameter");
    if (status != FSDP_OK)
        return status;
    pi = &u->handle->params[index];
    if (fs->cfg.sync_module_states && !dev->no_data)
        return set_param_from_rank0(u, pi, host_values);
    if (!pi->in_shard)
        return FSDP_OK;
    status = dev->ops->memcpy_async(dev, u->handle->local_shard + pi->offset_in_shard,
                                    host_values + pi->intra_start,
                                    pi->numel_in_shard * sizeof(float), fs->compute);
    if (status == FSDP_OK) /* the caller's buffer may go away on return */
        status = dev->ops->stream_synchronize(dev, fs->compute);
    return status;
}

fsdp_status_t fsdp_unit_gather_buffer(fsdp_unit_t *u, const float *shard, float *host_out)
{
    fsdp_t *fs = u->fs;
    fsdp_dev_t *dev = fs->dev;
    fsdp_handle_t *h = u->handle;
    void *full = NULL, *staged = NULL;
    fsdp_status_t status;

    if (h == NULL)
        return FSDP_OK;
    status = require_idle(u, "gathering the full parameters");
    if (status != FSDP_OK)
        return status;
    if (!fsdp_strategy_is_sharded(fs->strategy)) {
        status = dev->ops->memcpy_async(dev, host_out, shard, h->numel * sizeof(float),
                                        fs->compute);
    } else {
        const void *src = shard;
        status = fsdp_mem_alloc(fs->mem, h->shard_numel * (size_t)h->world * sizeof(float),
                                FSDP_MEM_TEMPORARY, fs->compute, &full);
        if (status == FSDP_OK && h->offload) {
            /* collectives read device memory: stage the host shard */
            status = fsdp_mem_alloc(fs->mem, h->shard_numel * sizeof(float),
                                    FSDP_MEM_TEMPORARY, fs->compute, &staged);
            if (status == FSDP_OK)
                status = dev->ops->memcpy_async(dev, staged, shard,
                                                h->shard_numel * sizeof(float), fs->compute);
            src = staged;
        }
        if (status == FSDP_OK)
            status = dev->ops->all_gather(dev, fs->pg, src, full, h->shard_numel,
                                          FSDP_DTYPE_F32, fs->compute);
        if (status == FSDP_OK)
            status = dev->ops->memcpy_async(dev, host_out, full, h->numel * sizeof(float),
                                            fs->compute);
    }
    if (status == FSDP_OK)
        status = dev->ops->stream_synchronize(dev, fs->compute);
    fsdp_mem_free(fs->mem, staged);
    fsdp_mem_free(fs->mem, full);
    return status;
}

fsdp_status_t fsdp_unit_gather_full(fsdp_unit_t *u, float *host_out)
{
    return fsdp_unit_gather_buffer(u, u->handle ? u->handle->local_shard : NULL, host_out);
}

void *fsdp_unit_param(fsdp_unit_t *u, int index)
{
    fsdp_handle_t *h = u->handle;
    char *base;

    if (h == NULL || index < 0 || index >= h->nparams ||
        (!h->uses_unsharded_view && u->state != FSDP_STATE_SUMMON_FULL_PARAMS))
        return NULL;
    if (u->state == FSDP_STATE_SUMMON_FULL_PARAMS)
        return h->summon_param ? h->summon_param + h->params[index].offset : NULL;
    base = fsdp_strategy_is_sharded(u->fs->strategy) ? (char *)h->full_param_padded
                                                     : (char *)fsdp_handle_shard_source(h);
    return base + h->params[index].offset * fsdp_dtype_size(h->compute_dtype);
}

fsdp_status_t fsdp_unit_grad(fsdp_unit_t *u, int index, void **grad_p)
{
    fsdp_handle_t *h = u->handle;
    fsdp_status_t status;

    if (h == NULL || index < 0 || index >= h->nparams)
        return fsdp_fail(u->fs, FSDP_ERR_INVALID_PARAM,
                         "unit '%s': no parameter %d (it has %d)", u->name, index,
                         fsdp_unit_num_params(u));
    if (!h->params[index].requires_grad)
        return fsdp_fail(u->fs, FSDP_ERR_INVALID_PARAM,
                         "rank %d: unit '%s': parameter '%s' is frozen (requires_grad=0) and "
                         "has no gradient", u->fs->dev->rank, u->name, h->params[index].name);
    if (h->state != FSDP_HANDLE_BACKWARD_PRE)
        return fsdp_fail(u->fs, FSDP_ERR_STATE,
                         "rank %d: unit '%s': gradients are written between its pre- and "
                         "post-backward hooks", u->fs->dev->rank, u->name);
    status = fsdp_handle_alloc_grad(u->fs, h);
    if (status != FSDP_OK)
        return status;
    *grad_p = (char *)h->unsharded_grad + h->params[index].offset * fsdp_dtype_size(h->compute_dtype);
    return FSDP_OK;
}
