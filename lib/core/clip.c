/* clip_grad_norm over sharded gradients (FSDP.clip_grad_norm_): each rank reduces its shards,
 * the ranks of the shard group combine the partial results, and every gradient is scaled by
 * min(1, max_norm / (total + 1e-6)). */
#include "core/core_int.h"

#include <math.h>
#include <stdlib.h>

/* A unit's shard group for the norm: NULL for a NO_SHARD unit, whose every rank holds the
 * whole gradient. */
static fsdp_group_t *norm_group(const fsdp_unit_t *u)
{
    return fsdp_strategy_is_sharded(u->strategy) && u->pg->size > 1 ? u->pg : NULL;
}

static double host_abs(const void *x, fsdp_dtype_t dtype, size_t j)
{
    switch (dtype) {
    case FSDP_DTYPE_BF16:
        return fabs((double)fsdp_bf16_to_f32(((const uint16_t *)x)[j]));
    case FSDP_DTYPE_F16:
        return fabs((double)fsdp_f16_to_f32(((const uint16_t *)x)[j]));
    default:
        return fabs((double)((const float *)x)[j]);
    }
}

/* The elements [*start, *start + *n) of a unit's shard this rank counts, range k of them (0
 * when k is past the last; then 0 is returned): the whole shard, or under tensor parallelism on
 * tp ranks other than the first the slots of the parameters that are not replicated over tp
 * (tp_partial_grad), since every tp rank holds the same replicated gradients and torch's norm
 * of a Replicate DTensor counts them once. */
static int count_range(const fsdp_t *fs, const fsdp_unit_t *u, int k, size_t *start, size_t *n)
{
    const fsdp_handle_t *h = u->handle;
    int seen = 0;

    if (fs->tp == NULL || fs->tp->rank == 0) {
        *start = 0;
        *n = h->shard_numel;
        return k == 0;
    }
    for (int i = 0; i < h->nparams; i++) {
        if (h->params[i].tied_to >= 0 || h->pp[i].tp_partial)
            continue;
        if (seen++ == k) {
            *start = h->pp[i].slot;
            *n = h->pp[i].chunk;
            return 1;
        }
    }
    return 0;
}

/* This rank's partial over the units whose norm group is `group`: sum of |g|^p over their
 * shards (or max |g| for p = inf), over count_range's ranges. p = 2 runs on the device (sumsq);
 * other norms read the gradients on the host. */
static fsdp_status_t local_partial(fsdp_t *fs, const fsdp_group_t *group, double p,
                                   double *partial_p)
{
    fsdp_dev_t *dev = fs->dev;
    double partial = 0.0;
    float *d = NULL;
    void *host = NULL;
    size_t host_cap = 0;
    fsdp_status_t status = FSDP_OK;

    if (p == 2.0)
        status = fsdp_mem_alloc(fs->mem, sizeof(float), FSDP_MEM_TEMPORARY, fs->compute,
                                (void **)&d);
    for (int i = 0, range = 0; i < fs->nunits && status == FSDP_OK; range++) {
        fsdp_unit_t *u = fs->units[i];
        fsdp_dtype_t dtype;
        void *g = fsdp_unit_sharded_grad_data(u, &dtype);
        size_t start = 0, n = 0, bytes;
        if (g == NULL || u->handle == NULL || norm_group(u) != group ||
            !count_range(fs, u, range, &start, &n)) {
            i++, range = -1; /* the next unit */
            continue;
        }
        g = (char *)g + start * fsdp_dtype_size(dtype);
        bytes = n * fsdp_dtype_size(dtype);
        if (n == 0)
            continue;
        if (p == 2.0) {
            fsdp_kernel_t k = {.kind = FSDP_K_SUMSQ};
            float sq = 0.0f;
            k.u.sumsq.out = d;
            k.u.sumsq.x = g;
            k.u.sumsq.dtype = dtype;
            k.u.sumsq.n = n;
            status = fsdp_dev_kernel(dev, fs->compute, &k);
            if (status == FSDP_OK)
                status = fsdp_dev_memcpy_async(dev, &sq, d, sizeof(sq), fs->compute);
            if (status == FSDP_OK)
                status = fsdp_dev_stream_synchronize(dev, fs->compute);
            partial += sq;
            continue;
        }
        if (bytes > host_cap) {
            void *grown = realloc(host, bytes);
            if (grown == NULL) {
                status = FSDP_ERR_NO_MEMORY;
                break;
            }
            host = grown;
            host_cap = bytes;
        }
        status = fsdp_dev_memcpy_async(dev, host, g, bytes, fs->compute);
        if (status == FSDP_OK)
            status = fsdp_dev_stream_synchronize(dev, fs->compute);
        for (size_t j = 0; j < n && status == FSDP_OK && !dev->no_data; j++) {
            double a = host_abs(host, dtype, j);
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

/* Combines a partial over the ranks of `group` (sum, or max for p = inf). A collective. */
static fsdp_status_t combine(fsdp_t *fs, fsdp_group_t *group, double p, double *partial_p)
{
    fsdp_dev_t *dev = fs->dev;
    float *d = NULL, f = (float)*partial_p;
    fsdp_status_t status;

    status = fsdp_mem_alloc(fs->mem, sizeof(float), FSDP_MEM_TEMPORARY, fs->compute,
                            (void **)&d);
    if (status == FSDP_OK)
        status = fsdp_dev_memcpy_async(dev, d, &f, sizeof(f), fs->compute);
    if (status == FSDP_OK)
        status = fsdp_dev_all_reduce(dev, group, d, d, 1, FSDP_DTYPE_F32,
                                     isinf(p) ? FSDP_REDUCE_MAX : FSDP_REDUCE_SUM, fs->compute);
    if (status == FSDP_OK)
        status = fsdp_dev_memcpy_async(dev, &f, d, sizeof(f), fs->compute);
    if (status == FSDP_OK)
        status = fsdp_dev_stream_synchronize(dev, fs->compute);
    fsdp_mem_free(fs->mem, d);
    *partial_p = f;
    return status;
}

fsdp_status_t fsdp_clip_grad_norm(fsdp_t *fs, double max_norm, double norm_type,
                                  double *total_norm_p)
{
    fsdp_dev_t *dev = fs->dev;
    double partial = 0.0, total;
    fsdp_status_t status = FSDP_OK;

    if (!(norm_type > 0.0) || !(max_norm >= 0.0))
        return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                         "clip_grad_norm: norm_type %g and max_norm %g; norm_type must be > 0 "
                         "(inf for the max norm) and max_norm >= 0", norm_type, max_norm);
    if (fs->post_backward_callback_queued)
        return fsdp_fail(fs, FSDP_ERR_STATE, "rank %d: clip_grad_norm inside backward",
                         dev->rank);
    /* one partial per shard group, in unit creation order (the same on every rank), combined
     * over that group; replicas (hybrid) hold the same shard, so the shard group suffices;
     * NO_SHARD units (group NULL) need no combining */
    for (int i = 0; i <= fs->nunits && status == FSDP_OK; i++) {
        fsdp_group_t *group = i < fs->nunits ? norm_group(fs->units[i]) : NULL;
        double part;
        int seen = 0;
        if (i < fs->nunits && group == NULL)
            continue;
        for (int j = 0; j < i && i < fs->nunits; j++)
            seen |= norm_group(fs->units[j]) == group;
        if (seen)
            continue;
        status = local_partial(fs, group, norm_type, &part);
        if (status == FSDP_OK && group != NULL)
            status = combine(fs, group, norm_type, &part);
        if (isinf(norm_type))
            partial = part > partial ? part : partial;
        else
            partial += part;
    }
    /* tensor parallelism: the tp ranks' shards are other slices of the same parameters */
    if (status == FSDP_OK && fs->tp != NULL)
        status = combine(fs, fs->tp, norm_type, &partial);
    if (status != FSDP_OK)
        return status;
    total = isinf(norm_type) ? partial : pow(partial, 1.0 / norm_type);
    if (total_norm_p != NULL)
        *total_norm_p = total;
    /* torch clamps the coefficient at 1; multiplying by 1 changes nothing, so skip it */
    double coef = max_norm / (total + 1e-6);
    if (coef >= 1.0 || dev->no_data)
        return FSDP_OK;
    for (int i = 0; i < fs->nunits && status == FSDP_OK; i++) {
        fsdp_unit_t *u = fs->units[i];
        fsdp_dtype_t dtype;
        void *g = fsdp_unit_sharded_grad_data(u, &dtype);
        fsdp_kernel_t k = {.kind = FSDP_K_SCALE};
        if (g == NULL)
            continue;
        k.u.scale.x = g;
        k.u.scale.dtype = dtype;
        k.u.scale.n = u->handle->shard_numel;
        k.u.scale.alpha = (float)coef;
        status = fsdp_dev_kernel(dev, fs->compute, &k);
    }
    return status;
}
