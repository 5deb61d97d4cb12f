/* Ignored parameters (ignored_states): whole on every rank, outside the flat parameter, with
 * their own value and gradient. */
#include "core/core_int.h"

#include <fsdp/trace.h>

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void fsdp_ignored_free(fsdp_t *fs, fsdp_unit_t *u)
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
fsdp_status_t fsdp_ignored_split(fsdp_t *fs, fsdp_unit_t *u, const fsdp_param_spec_t *params,
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
            status = fsdp_mem_alloc(fs->mem, numel * sizeof(float), FSDP_MEM_GRADIENT, fs->compute,
                                    (void **)&ip->grad);
        if (status == FSDP_OK)
            status = fsdp_k_fill(fs, fs->compute, ip->value, FSDP_DTYPE_F32, numel, 0.0);
        if (status == FSDP_OK)
            status = fsdp_k_fill(fs, fs->compute, ip->grad, FSDP_DTYPE_F32, numel, 0.0);
    }
out:
    free(index_of);
    if (status != FSDP_OK) {
        free(managed);
        fsdp_ignored_free(fs, u);
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
    status = fsdp_dev_memcpy_async(fs->dev, ip->value, host_values, ip->info.numel * sizeof(float),
                                   fs->compute);
    if (status == FSDP_OK)
        status = fsdp_dev_stream_synchronize(fs->dev, fs->compute);
    return status;
}
