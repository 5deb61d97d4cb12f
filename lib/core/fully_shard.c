/* FSDP2's per-unit controls, FSDPModule's methods (semantics 2, "API"): explicit prefetch
 * lists, reshard_after_backward, and unshard and reshard outside forward and backward. */
#include "core/core_int.h"

#include <stdlib.h>
#include <string.h>

static fsdp_status_t require_fsdp2(fsdp_unit_t *u, const char *what)
{
    if (u == NULL)
        return FSDP_ERR_INVALID_PARAM;
    if (!fsdp_is_fsdp2(u->fs))
        return fsdp_fail(u->fs, FSDP_ERR_INVALID_PARAM,
                         "unit '%s': %s is fully_shard's (api fsdp2); this model runs api fsdp1",
                         u->name, what);
    if (u->state != FSDP_STATE_IDLE)
        return fsdp_fail(u->fs, FSDP_ERR_STATE,
                         "unit '%s': %s needs the unit idle, not in forward or backward", u->name,
                         what);
    return FSDP_OK;
}

static fsdp_status_t set_list(fsdp_unit_t *u, int backward, fsdp_unit_t *const *targets, int n)
{
    fsdp_handle_t *h = u->handle;
    fsdp_unit_t **list = NULL;

    if (h == NULL)
        return FSDP_OK; /* a unit without parameters has no group to prefetch from */
    if (n > 0) {
        list = malloc(sizeof(*list) * (size_t)n);
        if (list == NULL)
            return FSDP_ERR_NO_MEMORY;
        memcpy(list, targets, sizeof(*list) * (size_t)n);
    }
    free(h->prefetch[backward]);
    h->prefetch[backward] = list;
    h->nprefetch[backward] = n;
    h->has_prefetch[backward] = 1;
    return FSDP_OK;
}

fsdp_status_t fsdp_unit_set_prefetch(fsdp_unit_t *u, int backward, fsdp_unit_t *const *targets,
                                     int n)
{
    fsdp_status_t status = require_fsdp2(u, backward ? "set_modules_to_backward_prefetch"
                                                     : "set_modules_to_forward_prefetch");

    if (status != FSDP_OK)
        return status;
    if (n < 0 || (n > 0 && targets == NULL))
        return fsdp_fail(u->fs, FSDP_ERR_INVALID_PARAM,
                         "unit '%s': a prefetch list needs n >= 0 targets", u->name);
    for (int i = 0; i < n; i++) {
        if (targets[i] == NULL || targets[i]->fs != u->fs || targets[i] == u)
            return fsdp_fail(u->fs, FSDP_ERR_INVALID_PARAM,
                             "unit '%s': prefetch target %d is not another unit of this model",
                             u->name, i);
    }
    return set_list(u, backward != 0, targets, n);
}

fsdp_status_t fsdp_unit_set_reshard_after_backward(fsdp_unit_t *u, int reshard)
{
    fsdp_status_t status = require_fsdp2(u, "set_reshard_after_backward");

    if (status == FSDP_OK && u->handle != NULL)
        u->handle->reshard_after_backward = reshard != 0;
    return status;
}

fsdp_status_t fsdp_unit_unshard(fsdp_unit_t *u)
{
    fsdp_status_t status = require_fsdp2(u, "unshard");
    fsdp_t *fs;

    if (status != FSDP_OK || u->handle == NULL)
        return status;
    fs = u->fs;
    if (!fs->lazy_init_done)
        return fsdp_fail(fs, FSDP_ERR_STATE,
                         "unit '%s': unshard before the first forward; run one first, as "
                         "fully_shard's lazy init needs",
                         u->name);
    /* outside forward and backward the copy-in and all-gather run on the compute stream */
    status = fsdp_pgroup_unshard(fs, u->handle, fs->compute, fs->compute);
    if (status == FSDP_OK)
        status = fsdp_pgroup_wait_for_unshard(fs, u->handle, 0);
    return status;
}

fsdp_status_t fsdp_unit_reshard(fsdp_unit_t *u)
{
    fsdp_status_t status = require_fsdp2(u, "reshard");

    if (status != FSDP_OK || u->handle == NULL)
        return status;
    return fsdp_pgroup_reshard(u->fs, u->handle);
}

/* The config's explicit lists, for the units below the root in creation order: each unit's
 * forward list is the next, its backward list the previous; a list the user set stays. */
fsdp_status_t fsdp_fully_shard_lazy_init(fsdp_t *fs)
{
    fsdp_unit_t **units = fs->units + 1;
    int n = fs->nunits - 1;
    fsdp_status_t status = FSDP_OK;

    for (int i = 0; i < n && status == FSDP_OK; i++) {
        fsdp_handle_t *h = units[i]->handle;
        if (h == NULL)
            continue;
        if (fs->cfg.explicit_forward_prefetch && !h->has_prefetch[0])
            status = set_list(units[i], 0, &units[i + 1], i + 1 < n ? 1 : 0);
        if (status == FSDP_OK && fs->cfg.explicit_backward_prefetch && !h->has_prefetch[1])
            status = set_list(units[i], 1, &units[i - 1], i > 0 ? 1 : 0);
    }
    return status;
}
