/* The FSDP runtime: configuration, units, and the hooks with their training-state machines
 * (docs/runtime.md sections 2 and 3). */
#include "core/runtime.h"

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

static fsdp_status_t check_mixed_precision(fsdp_dev_t *dev, const fsdp_config_t *cfg)
{
    const fsdp_mixed_precision_t *mp = &cfg->mixed_precision;
    const fsdp_dtype_t dts[3] = {mp->param_dtype, mp->reduce_dtype, mp->buffer_dtype};
    static const char *const names[3] = {"param_dtype", "reduce_dtype", "buffer_dtype"};

    for (int i = 0; i < 3; i++) {
        if (dts[i] != FSDP_DTYPE_UNSET && !fsdp_dtype_is_float(dts[i])) {
            fsdp_error("rank %d: mixed precision %s %d is not a floating dtype; allowed: f32, "
                       "bf16, f16, or unset", dev->rank, names[i], (int)dts[i]);
            return FSDP_ERR_INVALID_PARAM;
        }
    }
    if (mp->keep_low_precision_grads && cfg->cpu_offload && mp->param_dtype != FSDP_DTYPE_UNSET &&
        mp->param_dtype != FSDP_DTYPE_F32) {
        fsdp_error("rank %d: keep_low_precision_grads with cpu_offload is not supported: the "
                   "host optimizer steps on f32 gradients; drop one of the two", dev->rank);
        return FSDP_ERR_UNSUPPORTED;
    }
    return FSDP_OK;
}

static void destroy_groups(fsdp_t *fs)
{
    if (fs->unit_hybrid_pg != NULL)
        fs->dev->ops->group_destroy(fs->dev, fs->unit_hybrid_pg);
    if (fs->unit_hybrid_replicate != NULL)
        fs->dev->ops->group_destroy(fs->dev, fs->unit_hybrid_replicate);
    fs->unit_hybrid_pg = fs->unit_hybrid_replicate = NULL;
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
static fsdp_status_t make_hybrid_groups(fsdp_t *fs, fsdp_group_t **pg_p,
                                        fsdp_group_t **replicate_p)
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
    status = dev->ops->group_split(dev, world, world->rank / per_node, world->rank, pg_p);
    if (status == FSDP_OK)
        status = dev->ops->group_split(dev, world, world->rank % per_node, world->rank,
                                       replicate_p);
    if (status != FSDP_OK) {
        fsdp_error("rank %d: cannot make the hybrid shard and replicate groups: %s", dev->rank,
                   fsdp_status_string(status));
        if (*pg_p != NULL)
            dev->ops->group_destroy(dev, *pg_p);
        *pg_p = NULL;
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

    status = check_mixed_precision(dev, cfg);
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
        status = make_hybrid_groups(fs, &fs->pg, &fs->replicate);
        if (status != FSDP_OK)
            goto err_free_fs;
        fs->owns_groups = 1;
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

static void free_ignored(fsdp_t *fs, fsdp_unit_t *u);
static void free_buffers(fsdp_t *fs, fsdp_unit_t *u);

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
        free_ignored(fs, fs->units[i]);
        free_buffers(fs, fs->units[i]);
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

static void index_name(fsdp_t *fs, const char *name)
{
    uintptr_t key = name_hash(name);

    if (fsdp_ptrmap_get(&fs->param_names, key) == NULL)
        fsdp_ptrmap_put(&fs->param_names, key, (void *)name);
}

/* Adds a new unit's names (parameters, ignored parameters, buffers) to the model's index. */
static fsdp_status_t index_unit_names(fsdp_t *fs, const fsdp_unit_t *u)
{
    int nparams = u->handle != NULL ? u->handle->nparams : 0;
    fsdp_status_t status = fsdp_ptrmap_reserve(
        &fs->param_names, fs->param_names.count + (size_t)(nparams + u->nignored + u->nbuffers));

    if (status != FSDP_OK)
        return status;
    for (int i = 0; i < nparams; i++)
        index_name(fs, u->handle->params[i].name);
    for (int i = 0; i < u->nignored; i++)
        index_name(fs, u->ignored[i].info.name);
    for (int i = 0; i < u->nbuffers; i++)
        index_name(fs, u->buffers[i].info.name);
    return FSDP_OK;
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
        const fsdp_unit_t *u = fs->units[i];
        const fsdp_handle_t *h = u->handle;
        for (int j = 0; h && j < h->nparams; j++) {
            if (strcmp(h->params[j].name, name) == 0)
                return 1;
        }
        for (int j = 0; j < u->nignored; j++) {
            if (strcmp(u->ignored[j].info.name, name) == 0)
                return 1;
        }
        for (int j = 0; j < u->nbuffers; j++) {
            if (strcmp(u->buffers[j].info.name, name) == 0)
                return 1;
        }
    }
    return 0;
}

/* sync_module_states: rank 0's n values of `host_values`, broadcast over the world in buckets
 * (docs/runtime.md section 4: 250 MiB), into host_out on every rank. A collective. */
static fsdp_status_t broadcast_from_rank0(fsdp_t *fs, const float *host_values, size_t numel,
                                          float *host_out)
{
    fsdp_dev_t *dev = fs->dev;
    fsdp_group_t *world = dev->ops->group_world(dev);
    size_t bucket = fs->cfg.sync_bucket_bytes ? fs->cfg.sync_bucket_bytes : (size_t)250 << 20;
    size_t per = bucket / sizeof(float) ? bucket / sizeof(float) : 1;
    void *d = NULL;
    fsdp_status_t status;

    status = fsdp_mem_alloc(fs->mem, (numel < per ? numel : per) * sizeof(float) + 4,
                            FSDP_MEM_COMM_BUFFER, fs->compute, &d);
    for (size_t off = 0; off < numel && status == FSDP_OK; off += per) {
        size_t n = numel - off < per ? numel - off : per;
        status = dev->ops->memcpy_async(dev, d, host_values + off, n * sizeof(float),
                                        fs->compute);
        if (status == FSDP_OK)
            status = dev->ops->broadcast(dev, world, d, n, FSDP_DTYPE_F32, 0, fs->compute);
        if (status == FSDP_OK)
            status = dev->ops->memcpy_async(dev, host_out + off, d, n * sizeof(float),
                                            fs->compute);
        if (status == FSDP_OK)
            status = dev->ops->stream_synchronize(dev, fs->compute);
    }
    fsdp_mem_free(fs->mem, d);
    return status;
}

static void free_buffers(fsdp_t *fs, fsdp_unit_t *u)
{
    for (int i = 0; i < u->nbuffers; i++) {
        fsdp_mem_free(fs->mem, u->buffers[i].data);
        free((char *)u->buffers[i].info.name);
    }
    free(u->buffers);
    u->buffers = NULL;
    u->nbuffers = 0;
}

/* The unit's module buffers: checked, then zeroed f32 device memory each. */
static fsdp_status_t create_buffers(fsdp_t *fs, fsdp_unit_t *u, const fsdp_unit_options_t *o,
                                    const fsdp_param_spec_t *params, int nparams)
{
    fsdp_status_t status = FSDP_OK;

    if (o->nbuffers < 0 || (o->nbuffers > 0 && o->buffers == NULL))
        return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                         "unit '%s': buffers must hold nbuffers (>= 0) specs", u->name);
    for (int i = 0; i < o->nbuffers; i++) {
        const fsdp_buffer_spec_t *b = &o->buffers[i];
        int taken = 0;
        if (b->name == NULL || b->name[0] == '\0')
            return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM, "unit '%s': buffer %d has no name",
                             u->name, i);
        for (int j = 0; j < nparams; j++)
            taken |= strcmp(params[j].name, b->name) == 0;
        for (int j = 0; j < i; j++)
            taken |= strcmp(o->buffers[j].name, b->name) == 0;
        if (taken || param_name_taken(fs, b->name))
            return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                             "unit '%s': buffer name '%s' is already used by a parameter or "
                             "buffer", u->name, b->name);
        if (b->ndim < 0 || b->ndim > FSDP_MAX_DIMS)
            return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                             "unit '%s': buffer '%s' has %d dimensions; 0 to %d are allowed",
                             u->name, b->name, b->ndim, FSDP_MAX_DIMS);
        for (int d = 0; d < b->ndim; d++) {
            if (b->shape[d] < 0)
                return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                                 "unit '%s': buffer '%s' has negative dimension %lld", u->name,
                                 b->name, (long long)b->shape[d]);
        }
    }
    u->buffers = calloc((size_t)o->nbuffers + 1, sizeof(*u->buffers));
    if (u->buffers == NULL)
        return FSDP_ERR_NO_MEMORY;
    for (int i = 0; i < o->nbuffers && status == FSDP_OK; i++) {
        fsdp_buffer_t *b = &u->buffers[i];
        size_t numel = 1;
        b->info.name = strdup(o->buffers[i].name);
        if (b->info.name == NULL) {
            status = FSDP_ERR_NO_MEMORY;
            break;
        }
        u->nbuffers++;
        b->info.ndim = o->buffers[i].ndim;
        for (int d = 0; d < b->info.ndim; d++) {
            b->info.shape[d] = o->buffers[i].shape[d];
            numel *= (size_t)b->info.shape[d];
        }
        b->info.numel = b->info.numel_in_shard = numel;
        b->info.tied_to = -1;
        b->info.in_shard = numel > 0;
        b->dtype = FSDP_DTYPE_F32;
        status = fsdp_mem_alloc(fs->mem, numel * sizeof(float), FSDP_MEM_UNSHARDED_PARAM,
                                fs->compute, &b->data);
        if (status == FSDP_OK)
            status = fsdp_k_fill(fs, fs->compute, b->data, FSDP_DTYPE_F32, numel, 0.0);
    }
    if (status != FSDP_OK)
        free_buffers(fs, u);
    return status;
}

/* Casts one buffer's storage to `dtype` on the compute stream. */
static fsdp_status_t cast_buffer(fsdp_t *fs, fsdp_buffer_t *b, fsdp_dtype_t dtype)
{
    void *to = NULL;
    fsdp_status_t status;

    if (b->dtype == dtype)
        return FSDP_OK;
    status = fsdp_mem_alloc(fs->mem, b->info.numel * fsdp_dtype_size(dtype),
                            FSDP_MEM_UNSHARDED_PARAM, fs->compute, &to);
    if (status == FSDP_OK)
        status = fsdp_k_cast(fs, fs->compute, to, dtype, b->data, b->dtype, b->info.numel);
    if (status != FSDP_OK) {
        fsdp_mem_free(fs->mem, to);
        return status;
    }
    fsdp_mem_free(fs->mem, b->data);
    b->data = to;
    b->dtype = dtype;
    return FSDP_OK;
}

fsdp_status_t fsdp_cast_buffers(fsdp_t *fs, fsdp_dtype_t dtype)
{
    fsdp_status_t status = FSDP_OK;

    for (int i = 0; i < fs->nunits && status == FSDP_OK; i++) {
        for (int j = 0; j < fs->units[i]->nbuffers && status == FSDP_OK; j++)
            status = cast_buffer(fs, &fs->units[i]->buffers[j], dtype);
    }
    return status;
}

static fsdp_buffer_t *buffer_at(const fsdp_unit_t *u, int index)
{
    return index >= 0 && index < u->nbuffers ? &u->buffers[index] : NULL;
}

int fsdp_unit_num_buffers(const fsdp_unit_t *u)
{
    return u->nbuffers;
}

fsdp_status_t fsdp_unit_buffer_info(const fsdp_unit_t *u, int index, fsdp_param_info_t *info_p)
{
    const fsdp_buffer_t *b = buffer_at(u, index);
    if (b == NULL)
        return FSDP_ERR_INVALID_PARAM;
    *info_p = b->info;
    return FSDP_OK;
}

void *fsdp_unit_buffer(fsdp_unit_t *u, int index, fsdp_dtype_t *dtype_p)
{
    const fsdp_buffer_t *b = buffer_at(u, index);
    if (dtype_p != NULL)
        *dtype_p = b ? b->dtype : FSDP_DTYPE_F32;
    return b ? b->data : NULL;
}

/* Copies numel f32 between host and a buffer of any dtype, through a device f32 staging copy
 * when the buffer is in low precision. */
static fsdp_status_t buffer_copy(fsdp_t *fs, fsdp_buffer_t *b, float *host, int to_host)
{
    fsdp_dev_t *dev = fs->dev;
    size_t bytes = b->info.numel * sizeof(float);
    void *f32 = b->data;
    fsdp_status_t status = FSDP_OK;

    if (b->dtype != FSDP_DTYPE_F32)
        status = fsdp_mem_alloc(fs->mem, bytes, FSDP_MEM_TEMPORARY, fs->compute, &f32);
    if (status == FSDP_OK && to_host && f32 != b->data)
        status = fsdp_k_cast(fs, fs->compute, f32, FSDP_DTYPE_F32, b->data, b->dtype,
                             b->info.numel);
    if (status == FSDP_OK)
        status = to_host ? dev->ops->memcpy_async(dev, host, f32, bytes, fs->compute)
                         : dev->ops->memcpy_async(dev, f32, host, bytes, fs->compute);
    if (status == FSDP_OK && !to_host && f32 != b->data)
        status = fsdp_k_cast(fs, fs->compute, b->data, b->dtype, f32, FSDP_DTYPE_F32,
                             b->info.numel);
    if (status == FSDP_OK)
        status = dev->ops->stream_synchronize(dev, fs->compute);
    if (f32 != b->data)
        fsdp_mem_free(fs->mem, f32);
    return status;
}

fsdp_status_t fsdp_unit_get_buffer(fsdp_unit_t *u, int index, float *host_out)
{
    fsdp_buffer_t *b = buffer_at(u, index);

    if (b == NULL || host_out == NULL)
        return fsdp_fail(u->fs, FSDP_ERR_INVALID_PARAM,
                         "unit '%s': no buffer %d to read (it has %d)", u->name, index,
                         u->nbuffers);
    return buffer_copy(u->fs, b, host_out, 1);
}

fsdp_status_t fsdp_unit_set_buffer(fsdp_unit_t *u, int index, const float *host_values)
{
    fsdp_t *fs = u->fs;
    fsdp_buffer_t *b = buffer_at(u, index);
    float *vals;
    fsdp_status_t status = FSDP_OK;

    if (b == NULL || host_values == NULL)
        return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                         "unit '%s': no buffer %d to set (it has %d)", u->name, index,
                         u->nbuffers);
    if (u->state != FSDP_STATE_IDLE)
        return fsdp_fail(fs, FSDP_ERR_STATE, "unit '%s': setting a buffer needs the unit idle, "
                         "not in forward or backward", u->name);
    vals = malloc(b->info.numel * sizeof(float) + 1);
    if (vals == NULL)
        return FSDP_ERR_NO_MEMORY;
    if (fs->cfg.sync_module_states && !fs->dev->no_data)
        status = broadcast_from_rank0(fs, host_values, b->info.numel, vals);
    else
        memcpy(vals, host_values, b->info.numel * sizeof(float));
    if (status == FSDP_OK)
        status = buffer_copy(fs, b, vals, 0);
    free(vals);
    return status;
}

static void free_ignored(fsdp_t *fs, fsdp_unit_t *u)
{
    for (int i = 0; i < u->nignored; i++) {
        fsdp_mem_free(fs->mem, u->ignored[i].value);
        fsdp_mem_free(fs->mem, u->ignored[i].grad);
        free((char *)u->ignored[i].info.name);
    }
    free(u->ignored);
    u->ignored = NULL;
    u->nignored = 0;
}

/* Splits a unit's specs: ignored ones get their own whole, zeroed value and gradient; the
 * others go to *managed_p (tied_to renumbered among them) for the flat parameter. */
static fsdp_status_t split_ignored(fsdp_t *fs, fsdp_unit_t *u, const fsdp_param_spec_t *params,
                                   int nparams, fsdp_param_spec_t **managed_p, int *nmanaged_p)
{
    fsdp_param_spec_t *managed;
    int *index_of, nmanaged = 0, nignored = 0;
    fsdp_status_t status = FSDP_OK;

    for (int i = 0; i < nparams; i++) {
        status = fsdp_check_param_spec(fs, u->name, params, nparams, i);
        if (status != FSDP_OK)
            return status;
        nignored += params[i].ignored != 0;
    }
    managed = calloc((size_t)nparams + 1, sizeof(*managed));
    index_of = calloc((size_t)nparams + 1, sizeof(*index_of));
    u->ignored = calloc((size_t)nignored + 1, sizeof(*u->ignored));
    if (managed == NULL || index_of == NULL || u->ignored == NULL) {
        status = FSDP_ERR_NO_MEMORY;
        goto out;
    }
    for (int i = 0; i < nparams && status == FSDP_OK; i++) {
        fsdp_ignored_param_t *ip;
        size_t numel = 1;
        if (!params[i].ignored) {
            index_of[i] = nmanaged;
            managed[nmanaged] = params[i];
            if (params[i].tied_to >= 0)
                managed[nmanaged].tied_to = index_of[params[i].tied_to];
            nmanaged++;
            continue;
        }
        ip = &u->ignored[u->nignored];
        for (int d = 0; d < params[i].ndim; d++) {
            ip->info.shape[d] = params[i].shape[d];
            numel *= (size_t)params[i].shape[d];
        }
        ip->info.name = strdup(params[i].name);
        if (ip->info.name == NULL) {
            status = FSDP_ERR_NO_MEMORY;
            break;
        }
        u->nignored++;
        ip->info.ndim = params[i].ndim;
        ip->info.numel = ip->info.numel_in_shard = numel;
        ip->info.tied_to = -1;
        ip->info.requires_grad = params[i].requires_grad != 0;
        ip->info.in_shard = numel > 0;
        status = fsdp_mem_alloc(fs->mem, numel * sizeof(float), FSDP_MEM_UNSHARDED_PARAM,
                                fs->compute, (void **)&ip->value);
        if (status == FSDP_OK)
            status = fsdp_mem_alloc(fs->mem, numel * sizeof(float), FSDP_MEM_GRADIENT,
                                    fs->compute, (void **)&ip->grad);
        if (status == FSDP_OK)
            status = fsdp_k_fill(fs, fs->compute, ip->value, FSDP_DTYPE_F32, numel, 0.0);
        if (status == FSDP_OK)
            status = fsdp_k_fill(fs, fs->compute, ip->grad, FSDP_DTYPE_F32, numel, 0.0);
    }
out:
    free(index_of);
    if (status != FSDP_OK) {
        free(managed);
        free_ignored(fs, u);
        return status;
    }
    *managed_p = managed;
    *nmanaged_p = nmanaged;
    return FSDP_OK;
}

int fsdp_unit_num_ignored_params(const fsdp_unit_t *u)
{
    return u->nignored;
}

static const fsdp_ignored_param_t *ignored_at(const fsdp_unit_t *u, int index)
{
    return index >= 0 && index < u->nignored ? &u->ignored[index] : NULL;
}

fsdp_status_t fsdp_unit_ignored_param_info(const fsdp_unit_t *u, int index,
                                           fsdp_param_info_t *info_p)
{
    const fsdp_ignored_param_t *ip = ignored_at(u, index);
    if (ip == NULL)
        return FSDP_ERR_INVALID_PARAM;
    *info_p = ip->info;
    return FSDP_OK;
}

float *fsdp_unit_ignored_param(fsdp_unit_t *u, int index)
{
    const fsdp_ignored_param_t *ip = ignored_at(u, index);
    return ip ? ip->value : NULL;
}

float *fsdp_unit_ignored_grad(fsdp_unit_t *u, int index)
{
    const fsdp_ignored_param_t *ip = ignored_at(u, index);
    return ip ? ip->grad : NULL;
}

fsdp_status_t fsdp_unit_set_ignored_param(fsdp_unit_t *u, int index, const float *host_values)
{
    fsdp_t *fs = u->fs;
    const fsdp_ignored_param_t *ip = ignored_at(u, index);
    fsdp_status_t status;

    if (ip == NULL || host_values == NULL)
        return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                         "unit '%s': no ignored parameter %d to set (it has %d)", u->name, index,
                         u->nignored);
    status = fs->dev->ops->memcpy_async(fs->dev, ip->value, host_values,
                                        ip->info.numel * sizeof(float), fs->compute);
    if (status == FSDP_OK)
        status = fs->dev->ops->stream_synchronize(fs->dev, fs->compute);
    return status;
}

void fsdp_unit_options_init(fsdp_unit_options_t *opts)
{
    memset(opts, 0, sizeof(*opts));
    opts->strategy = FSDP_STRATEGY_DEFAULT;
    opts->process_group = NULL;
    opts->replicate_group = NULL;
}

/* The unit's strategy and groups (fsdp_unit_options_t), with PyTorch's NO_SHARD on a one-rank
 * shard group. */
static fsdp_status_t unit_groups(fsdp_t *fs, const char *name, const fsdp_unit_options_t *o,
                                 fsdp_unit_t *u)
{
    fsdp_dev_t *dev = fs->dev;
    fsdp_strategy_t s = o->strategy == FSDP_STRATEGY_DEFAULT ? fs->cfg.strategy : o->strategy;
    fsdp_status_t status;

    if ((unsigned)s >= FSDP_STRATEGY_COUNT)
        return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                         "unit '%s': invalid sharding strategy %d; allowed: full_shard, "
                         "shard_grad_op, no_shard, hybrid_shard, hybrid_shard_zero2, or "
                         "FSDP_STRATEGY_DEFAULT for the config's", name, (int)o->strategy);
    if (o->replicate_group != NULL && !fsdp_strategy_is_hybrid(s))
        return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                         "unit '%s': a replicate group is only for hybrid_shard and "
                         "hybrid_shard_zero2, not %s", name, fsdp_strategy_name(s));
    if (fsdp_strategy_is_hybrid(s) && (o->process_group == NULL) != (o->replicate_group == NULL))
        return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                         "unit '%s': %s needs both a shard group and a replicate group, or "
                         "neither", name, fsdp_strategy_name(s));
    u->strategy = s;
    u->replicate = NULL;
    if (!fsdp_strategy_is_hybrid(s)) {
        u->pg = o->process_group             ? o->process_group
                : fsdp_strategy_is_hybrid(fs->cfg.strategy) ? dev->ops->group_world(dev)
                                                            : fs->pg;
        if (u->pg->size == 1 && s != FSDP_NO_SHARD)
            u->strategy = FSDP_NO_SHARD;
        return FSDP_OK;
    }
    fs->any_hybrid = 1;
    if (o->process_group != NULL) {
        u->pg = o->process_group;
        u->replicate = o->replicate_group;
    } else if (fsdp_strategy_is_hybrid(fs->cfg.strategy)) {
        u->pg = fs->pg;
        u->replicate = fs->replicate;
    } else {
        if (fs->unit_hybrid_pg == NULL) {
            status = make_hybrid_groups(fs, &fs->unit_hybrid_pg, &fs->unit_hybrid_replicate);
            if (status != FSDP_OK)
                return fsdp_fail(fs, status, "unit '%s': cannot make the default hybrid "
                                 "groups", name);
        }
        u->pg = fs->unit_hybrid_pg;
        u->replicate = fs->unit_hybrid_replicate;
    }
    return FSDP_OK;
}

fsdp_status_t fsdp_unit_create(fsdp_t *fs, const char *name, fsdp_unit_t *parent,
                               const fsdp_param_spec_t *params, int nparams,
                               fsdp_unit_t **unit_p)
{
    return fsdp_unit_create_ex(fs, name, parent, params, nparams, NULL, unit_p);
}

fsdp_status_t fsdp_unit_create_ex(fsdp_t *fs, const char *name, fsdp_unit_t *parent,
                                  const fsdp_param_spec_t *params, int nparams,
                                  const fsdp_unit_options_t *opts, fsdp_unit_t **unit_p)
{
    fsdp_unit_options_t defaults;
    fsdp_param_spec_t *managed = NULL;
    int nmanaged = 0;
    fsdp_unit_t *u;
    fsdp_status_t status;

    if (opts == NULL) {
        fsdp_unit_options_init(&defaults);
        opts = &defaults;
    }

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
    status = unit_groups(fs, u->name, opts, u);
    if (status != FSDP_OK)
        goto err_free_name;
    status = split_ignored(fs, u, params, nparams, &managed, &nmanaged);
    if (status != FSDP_OK)
        goto err_free_name;
    status = create_buffers(fs, u, opts, params, nparams);
    if (status != FSDP_OK) {
        free(managed);
        free_ignored(fs, u);
        goto err_free_name;
    }
    if (nmanaged > 0)
        status = fsdp_handle_create(u, managed, nmanaged, &u->handle);
    free(managed);
    if (status != FSDP_OK) {
        free_buffers(fs, u);
        free_ignored(fs, u);
        goto err_free_name;
    }
    status = index_unit_names(fs, u);
    if (status != FSDP_OK)
        goto err_free_all;
    fs->units[fs->nunits++] = u;
    if (u->is_root)
        fs->root = u;
    *unit_p = u;
    return FSDP_OK;

err_free_all:
    fsdp_handle_destroy(fs, u->handle);
    free_buffers(fs, u);
    free_ignored(fs, u);
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

fsdp_strategy_t fsdp_unit_strategy(const fsdp_unit_t *u)
{
    return u->strategy;
}

fsdp_group_t *fsdp_unit_shard_group(const fsdp_unit_t *u)
{
    return u->pg;
}

fsdp_group_t *fsdp_unit_replicate_group(const fsdp_unit_t *u)
{
    return u->replicate;
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

void *fsdp_unit_sharded_grad_data(fsdp_unit_t *u, fsdp_dtype_t *dtype_p)
{
    fsdp_handle_t *h = u->handle;
    int low = h != NULL && h->low_grad != NULL;

    if (dtype_p != NULL)
        *dtype_p = low ? h->compute_dtype : FSDP_DTYPE_F32;
    return low ? h->low_grad : fsdp_unit_sharded_grad(u);
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
            fsdp_mem_free(fs->mem, h->low_grad);
            h->saved_grad_shard = NULL;
            h->low_grad = NULL;
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

/* sync_module_states for a parameter: rank 0's values, then each rank keeps its part. */
static fsdp_status_t set_param_from_rank0(fsdp_unit_t *u, const fsdp_param_info_t *pi,
                                          const float *host_values)
{
    fsdp_t *fs = u->fs;
    fsdp_dev_t *dev = fs->dev;
    float *full = malloc(pi->numel * sizeof(float) + 1);
    fsdp_status_t status;

    if (full == NULL)
        return FSDP_ERR_NO_MEMORY;
    status = broadcast_from_rank0(fs, host_values, pi->numel, full);
    if (status == FSDP_OK && pi->in_shard) {
        status = dev->ops->memcpy_async(dev, u->handle->local_shard + pi->offset_in_shard,
                                        full + pi->intra_start,
                                        pi->numel_in_shard * sizeof(float), fs->compute);
        if (status == FSDP_OK)
            status = dev->ops->stream_synchronize(dev, fs->compute);
    }
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
    if (!fsdp_strategy_is_sharded(u->strategy)) {
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
            status = dev->ops->all_gather(dev, u->pg, src, full, h->shard_numel,
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
    base = fsdp_strategy_is_sharded(u->strategy) ? (char *)h->full_param_padded
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
