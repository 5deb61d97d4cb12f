/* clip_grad_norm over sharded gradients (FSDP.clip_grad_norm_): each rank reduces its shards,
 * the ranks of the shard group combine the partial results, and every gradient is scaled by
 * min(1, max_norm / (total + 1e-6)). */
#include "runtime.h"

#include <math.h>
#include <stdlib.h>

/* This rank's partial: sum of |g|^p over its shards (or max |g| for p = inf). p = 2 runs on
 * the device (sumsq); other norms read the gradients on the host. */
static fsdp_status_t local_partial(fsdp_t *fs, double p, double *partial_p)
{
    fsdp_dev_t *dev = fs->dev;
    double partial = 0.0;
    float *host = NULL, *d = NULL;
    size_t host_cap = 0;
    fsdp_status_t status = FSDP_OK;

    if (p == 2.0)
        status = fsdp_mem_alloc(fs->mem, sizeof(float), FSDP_MEM_TEMPORARY, fs->compute,
                                (void **)&d);
    for (int i = 0; i < fs->nunits && status == FSDP_OK; i++) {
        fsdp_unit_t *u = fs->units[i];
        float *g = fsdp_unit_sharded_grad(u);
        size_t n = u->handle ? u->handle->shard_numel : 0;
        if (g == NULL || n == 0)
            continue;
        if (p == 2.0) {
            fsdp_kernel_t k = {.kind = FSDP_K_SUMSQ};
            float sq = 0.0f;
            k.u.sumsq.out = d;
            k.u.sumsq.x = g;
            k.u.sumsq.dtype = FSDP_DTYPE_F32;
            k.u.sumsq.n = n;
            status = dev->ops->kernel(dev, fs->compute, &k);
            if (status == FSDP_OK)
                status = dev->ops->memcpy_async(dev, &sq, d, sizeof(sq), fs->compute);
            if (status == FSDP_OK)
                status = dev->ops->stream_synchronize(dev, fs->compute);
            partial += sq;
            continue;
        }
        if (n > host_cap) {
            float *grown = realloc(host, n * sizeof(float));
            if (grown == NULL) {
                status = FSDP_ERR_NO_MEMORY;
                break;
            }
            host = grown;
            host_cap = n;
        }
        status = dev->ops->memcpy_async(dev, host, g, n * sizeof(float), fs->compute);
        if (status == FSDP_OK)
            status = dev->ops->stream_synchronize(dev, fs->compute);
        for (size_t j = 0; j < n && status == FSDP_OK && !dev->no_data; j++) {
            double a = fabs((double)host[j]);
            if (isinf(p))
                partial = a > partial ? a : partial;
            else
                partial += pow(a, p);
        }
    }
    fsdp_mem_free(fs->mem, d);
    free(host);
    *partial_p = partial;
    return status;
}

fsdp_status_t fsdp_clip_grad_norm(fsdp_t *fs, double max_norm, double norm_type,
                                  double *total_norm_p)
{
    fsdp_dev_t *dev = fs->dev;
    double partial, total;
    float *d = NULL, f;
    fsdp_status_t status;

    if (!(norm_type > 0.0) || !(max_norm >= 0.0))
        return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                         "clip_grad_norm: norm_type %g and max_norm %g; norm_type must be > 0 "
                         "(inf for the max norm) and max_norm >= 0", norm_type, max_norm);
    if (fs->post_backward_callback_queued)
        return fsdp_fail(fs, FSDP_ERR_STATE, "rank %d: clip_grad_norm inside backward",
                         dev->rank);
    status = local_partial(fs, norm_type, &partial);
    if (status != FSDP_OK)
        return status;
    /* replicas (hybrid) hold the same shard: combine over the shard group only */
    if (fsdp_strategy_is_sharded(fs->strategy) && fs->pg->size > 1) {
        f = (float)partial;
        status = fsdp_mem_alloc(fs->mem, sizeof(float), FSDP_MEM_TEMPORARY, fs->compute,
                                (void **)&d);
        if (status == FSDP_OK)
            status = dev->ops->memcpy_async(dev, d, &f, sizeof(f), fs->compute);
        if (status == FSDP_OK)
            status = dev->ops->all_reduce(dev, fs->pg, d, d, 1, FSDP_DTYPE_F32,
                                          isinf(norm_type) ? FSDP_REDUCE_MAX : FSDP_REDUCE_SUM,
                                          fs->compute);
        if (status == FSDP_OK)
            status = dev->ops->memcpy_async(dev, &f, d, sizeof(f), fs->compute);
        if (status == FSDP_OK)
            status = dev->ops->stream_synchronize(dev, fs->compute);
        fsdp_mem_free(fs->mem, d);
        if (status != FSDP_OK)
            return status;
        partial = f;
    }
    total = isinf(norm_type) ? partial : pow(partial, 1.0 / norm_type);
    if (total_norm_p != NULL)
        *total_norm_p = total;
    /* torch clamps the coefficient at 1; multiplying by 1 changes nothing, so skip it */
    double coef = max_norm / (total + 1e-6);
    if (coef >= 1.0 || dev->no_data)
        return FSDP_OK;
    for (int i = 0; i < fs->nunits && status == FSDP_OK; i++) {
        fsdp_unit_t *u = fs->units[i];
        float *g = fsdp_unit_sharded_grad(u);
        fsdp_kernel_t k = {.kind = FSDP_K_SCALE};
        if (g == NULL)
            continue;
        k.u.scale.x = g;
        k.u.scale.dtype = FSDP_DTYPE_F32;
        k.u.scale.n = u->handle->shard_numel;
        k.u.scale.alpha = (float)coef;
        status = dev->ops->kernel(dev, fs->compute, &k);
    }
    return status;
}
