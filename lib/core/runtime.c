/* The FSDP runtime's lifecycle: configuration, fsdp_create (streams, allocator, the default and
 * hybrid groups), fsdp_destroy, and what the whole runtime reports (docs/runtime.md section 2). */
#include "core/core_int.h"

#include <fsdp/trace.h>

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

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
    cfg->api = FSDP_API_FSDP1;
    cfg->reshard_after_forward = FSDP_RESHARD_DEFAULT;
}

static const char *const api_names[FSDP_API_COUNT] = {"fsdp1", "fsdp2"};

const char *fsdp_api_name(fsdp_api_t api)
{
    return (unsigned)api < FSDP_API_COUNT ? api_names[api] : "invalid";
}

int fsdp_api_parse(const char *s, fsdp_api_t *api_p)
{
    for (int i = 0; s != NULL && i < FSDP_API_COUNT; i++) {
        if (strcmp(s, api_names[i]) == 0) {
            *api_p = (fsdp_api_t)i;
            return 0;
        }
    }
    return -1;
}

fsdp_api_t fsdp_api(const fsdp_t *fs)
{
    return fs->cfg.api;
}

/* What fully_shard has no counterpart of is refused, naming what it offers instead. */
static fsdp_status_t check_fsdp2(fsdp_dev_t *dev, const fsdp_config_t *cfg)
{
    const fsdp_mixed_precision_t *mp = &cfg->mixed_precision;
    const char *why = NULL;

    if ((unsigned)cfg->api >= FSDP_API_COUNT) {
        fsdp_error("rank %d: invalid api %d; allowed: fsdp1, fsdp2", dev->rank, (int)cfg->api);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (cfg->tp_size < 0 || cfg->tp_size > FSDP_MAX_WORLD) {
        fsdp_error("rank %d: tp_size %d must be in [0, %d]", dev->rank, cfg->tp_size,
                   FSDP_MAX_WORLD);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (cfg->api != FSDP_API_FSDP2) {
        if (cfg->tp_size <= 1)
            return FSDP_OK;
        fsdp_error("rank %d: tp_size %d needs api fsdp2: tensor parallelism composes with "
                   "fully_shard's per-parameter shards, not with fsdp1's flat parameters",
                   dev->rank, cfg->tp_size);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (cfg->strategy == FSDP_SHARD_GRAD_OP || cfg->strategy == FSDP_HYBRID_SHARD_ZERO2)
        why = "its strategy is reshard_after_forward=false (with a 2-D mesh for HSDP): use "
              "full_shard or hybrid_shard and set reshard_after_forward";
    else if (cfg->strategy == FSDP_NO_SHARD)
        why = "no_shard has no fully_shard form: use hybrid_shard with one rank per shard group "
              "(ranks_per_node 1) to replicate";
    else if (mp->buffer_dtype != FSDP_DTYPE_UNSET || mp->keep_low_precision_grads)
        why = "MixedPrecisionPolicy has no buffer_dtype or keep_low_precision_grads";
    else if (cfg->reshard_after_forward < FSDP_RESHARD_TRUE)
        why = "reshard_after_forward must be FSDP_RESHARD_DEFAULT, _TRUE, _FALSE or a group size";
    else if (cfg->tp_size > 1 && fsdp_strategy_is_hybrid(cfg->strategy))
        why = "tensor parallelism shards over the dp group only: hybrid_shard (HSDP x tp) is not "
              "supported; use full_shard";
    else if (cfg->tp_size > 1 && cfg->process_group != NULL)
        why = "with tensor parallelism the dp and tp groups are made from tp_size: leave "
              "process_group unset";
    if (why == NULL)
        return FSDP_OK;
    fsdp_error("rank %d: api fsdp2 (fully_shard): %s", dev->rank, why);
    return FSDP_ERR_INVALID_PARAM;
}

static fsdp_status_t check_mixed_precision(fsdp_dev_t *dev, const fsdp_config_t *cfg)
{
    const fsdp_mixed_precision_t *mp = &cfg->mixed_precision;
    const fsdp_dtype_t dts[3] = {mp->param_dtype, mp->reduce_dtype, mp->buffer_dtype};
    static const char *const names[3] = {"param_dtype", "reduce_dtype", "buffer_dtype"};

    for (int i = 0; i < 3; i++) {
        if (dts[i] != FSDP_DTYPE_UNSET && !fsdp_dtype_is_float(dts[i])) {
            fsdp_error("rank %d: mixed precision %s %d is not a floating dtype; allowed: f32, "
                       "bf16, f16, or unset",
                       dev->rank, names[i], (int)dts[i]);
            return FSDP_ERR_INVALID_PARAM;
        }
    }
    if (mp->keep_low_precision_grads && cfg->cpu_offload && mp->param_dtype != FSDP_DTYPE_UNSET &&
        mp->param_dtype != FSDP_DTYPE_F32) {
        fsdp_error("rank %d: keep_low_precision_grads with cpu_offload is not supported: the "
                   "host optimizer steps on f32 gradients; drop one of the two",
                   dev->rank);
        return FSDP_ERR_UNSUPPORTED;
    }
    return FSDP_OK;
}

static void destroy_groups(fsdp_t *fs)
{
    for (int i = 0; i < fs->n_raf_groups; i++)
        fsdp_dev_group_destroy(fs->dev, fs->raf_groups[i].group);
    free(fs->raf_groups);
    fs->raf_groups = NULL;
    fs->n_raf_groups = 0;
    if (fs->unit_hybrid_pg != NULL)
        fsdp_dev_group_destroy(fs->dev, fs->unit_hybrid_pg);
    if (fs->unit_hybrid_replicate != NULL)
        fsdp_dev_group_destroy(fs->dev, fs->unit_hybrid_replicate);
    fs->unit_hybrid_pg = fs->unit_hybrid_replicate = NULL;
    if (!fs->owns_groups)
        return;
    if (fs->pg != NULL)
        fsdp_dev_group_destroy(fs->dev, fs->pg);
    if (fs->replicate != NULL)
        fsdp_dev_group_destroy(fs->dev, fs->replicate);
    if (fs->tp != NULL)
        fsdp_dev_group_destroy(fs->dev, fs->tp);
    fs->pg = fs->replicate = fs->tp = NULL;
    fs->owns_groups = 0;
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
                   "hybrid_shard, hybrid_shard_zero2",
                   (int)cfg->strategy);
        return FSDP_ERR_INVALID_PARAM;
    }
    if ((unsigned)cfg->backward_prefetch > FSDP_BACKWARD_PREFETCH_NONE) {
        fsdp_error("invalid backward prefetch %d; allowed: pre, post, none",
                   (int)cfg->backward_prefetch);
        return FSDP_ERR_INVALID_PARAM;
    }

    status = check_mixed_precision(dev, cfg);
    if (status == FSDP_OK)
        status = check_fsdp2(dev, cfg);
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
        /* FSDP2 reduces in the gradients' own dtype, f32, unless told (torch 2.15) */
        fs->reduce_dtype = mp->reduce_dtype != FSDP_DTYPE_UNSET ? mp->reduce_dtype
                           : cfg->api == FSDP_API_FSDP2     ? FSDP_DTYPE_F32
                                                            : fs->param_dtype;
    }
    if (cfg->tp_size > 1) {
        status = fsdp_groups_make_tp(fs, &fs->pg, &fs->tp);
        if (status != FSDP_OK)
            goto err_free_fs;
        fs->owns_groups = 1;
    } else if (fsdp_strategy_is_hybrid(cfg->strategy) && cfg->process_group == NULL) {
        status = fsdp_groups_make_hybrid(fs, &fs->pg, &fs->replicate);
        if (status != FSDP_OK)
            goto err_free_fs;
        fs->owns_groups = 1;
    } else {
        fs->pg = cfg->process_group ? cfg->process_group : fsdp_dev_group_world(dev);
        fs->replicate = cfg->replicate_group;
    }
    /* PyTorch forces NO_SHARD on a single-rank group (FSDP1; fully_shard shards over one) */
    if (fs->pg->size == 1 && !fsdp_strategy_is_hybrid(fs->strategy) && cfg->api != FSDP_API_FSDP2 &&
        fs->strategy != FSDP_NO_SHARD) {
        fsdp_info("rank %d: a shard group of one rank: using no_shard instead of %s", dev->rank,
                  fsdp_strategy_name(fs->strategy));
        fs->strategy = FSDP_NO_SHARD;
    }
    fs->sync_gradients = 1;
    fs->compute = fsdp_dev_compute_stream(dev);
    status = fsdp_mem_create(dev, cfg->device_capacity, &fs->mem);
    if (status != FSDP_OK)
        goto err_free_groups;
    fsdp_trace_set_memory(dev, fsdp_mem_counters(fs->mem));
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
            fsdp_dev_stream_destroy(dev, streams[i]);
    }
    fs->unshard = fs->pre_unshard = fs->post_backward = fs->all_reduce = NULL;
}

void fsdp_destroy(fsdp_t *fs)
{
    if (fs == NULL)
        return;
    fsdp_limiter_clear(fs);
    /* each unit's frees are its own; none names a unit already freed */
    for (int i = 0; i < fs->nunits; i++) {
        fsdp_trace_unit_swap(fs, fs->units[i]->name);
        fsdp_handle_destroy(fs, fs->units[i]->handle);
        fsdp_ignored_free(fs, fs->units[i]);
        fsdp_buffers_free(fs, fs->units[i]);
        fsdp_trace_unit_swap(fs, NULL);
        free(fs->units[i]->name);
        free(fs->units[i]);
    }
    free(fs->units);
    fsdp_ptrmap_destroy(&fs->param_names);
    fsdp_exec_order_destroy(fs);
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

fsdp_group_t *fsdp_tp_group(fsdp_t *fs)
{
    return fs->tp;
}

int fsdp_tp_loss_parallel(const fsdp_t *fs)
{
    return fs->tp != NULL && fs->cfg.tp_loss_parallel;
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
