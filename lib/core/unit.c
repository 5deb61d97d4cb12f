/* Units: creation with their strategy and groups (fsdp_unit_create), and each unit's parameters,
 * gradients and flat-parameter state seen from outside. */
#include "core/core_int.h"

#include <fsdp/trace.h>

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void fsdp_unit_options_init(fsdp_unit_options_t *opts)
{
    memset(opts, 0, sizeof(*opts));
    opts->strategy = FSDP_STRATEGY_DEFAULT;
    opts->process_group = NULL;
    opts->replicate_group = NULL;
    opts->reshard_after_forward = FSDP_RESHARD_INHERIT;
}

/* reshard_after_forward = N: the shard group's ranks in groups of N consecutive ones, made
 * once per (shard group, N) by a split of the shard group (a collective over it). */
static fsdp_status_t post_forward_group(fsdp_t *fs, const char *name, int n, fsdp_unit_t *u)
{
    struct fsdp_raf_group *g;
    fsdp_status_t status;

    u->reshard_after_forward = n;
    for (int i = 0; i < fs->n_raf_groups; i++) {
        if (fs->raf_groups[i].parent == u->pg && fs->raf_groups[i].n == n) {
            u->post_forward_pg = fs->raf_groups[i].group;
            return FSDP_OK;
        }
    }
    g = realloc(fs->raf_groups, sizeof(*g) * (size_t)(fs->n_raf_groups + 1));
    if (g == NULL)
        return FSDP_ERR_NO_MEMORY;
    fs->raf_groups = g;
    g = &g[fs->n_raf_groups];
    status = fsdp_dev_group_split(fs->dev, u->pg, u->pg->rank / n, u->pg->rank, &g->group);
    if (status != FSDP_OK)
        return fsdp_fail_below(fs, status,
                               "unit '%s': cannot make the groups of %d ranks that "
                               "reshard_after_forward %d reshards to",
                               name, n, n);
    g->parent = u->pg;
    g->n = n;
    fs->n_raf_groups++;
    u->post_forward_pg = g->group;
    return FSDP_OK;
}

/* FSDP2's reshard_after_forward, resolved for the unit (semantics 2 C): None frees the
 * parameters after forward except on the root; an int N is False at 1 and True at W. */
static fsdp_status_t unit_reshard(fsdp_t *fs, const char *name, const fsdp_unit_options_t *o,
                                  fsdp_unit_t *u)
{
    int raf = o->reshard_after_forward == FSDP_RESHARD_INHERIT ? fs->cfg.reshard_after_forward
                                                               : o->reshard_after_forward;

    if (raf == FSDP_RESHARD_DEFAULT)
        u->reshard_after_forward = !u->is_root;
    else if (raf == FSDP_RESHARD_TRUE || raf == u->pg->size)
        u->reshard_after_forward = 1;
    else if (raf == FSDP_RESHARD_FALSE || raf == 1)
        u->reshard_after_forward = 0;
    else if (raf < 0 || u->pg->size % raf != 0)
        return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                         "unit '%s': reshard_after_forward %d is not allowed: give true, false, "
                         "the default, or a group size that divides the shard group's %d ranks",
                         name, raf, u->pg->size);
    else
        return post_forward_group(fs, name, raf, u);
    return FSDP_OK;
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
                         "FSDP_STRATEGY_DEFAULT for the config's",
                         name, (int)o->strategy);
    if (o->replicate_group != NULL && !fsdp_strategy_is_hybrid(s))
        return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                         "unit '%s': a replicate group is only for hybrid_shard and "
                         "hybrid_shard_zero2, not %s",
                         name, fsdp_strategy_name(s));
    if (fsdp_strategy_is_hybrid(s) && (o->process_group == NULL) != (o->replicate_group == NULL))
        return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                         "unit '%s': %s needs both a shard group and a replicate group, or "
                         "neither",
                         name, fsdp_strategy_name(s));
    u->strategy = s;
    u->replicate = NULL;
    if (!fsdp_strategy_is_hybrid(s)) {
        u->pg = o->process_group                            ? o->process_group
                : fsdp_strategy_is_hybrid(fs->cfg.strategy) ? fsdp_dev_group_world(dev)
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
            status = fsdp_groups_make_hybrid(fs, &fs->unit_hybrid_pg, &fs->unit_hybrid_replicate);
            if (status != FSDP_OK)
                return fsdp_fail_below(fs, status,
                                       "unit '%s': cannot make the default hybrid groups", name);
        }
        u->pg = fs->unit_hybrid_pg;
        u->replicate = fs->unit_hybrid_replicate;
    }
    return FSDP_OK;
}

fsdp_status_t fsdp_unit_create(fsdp_t *fs, const char *name, fsdp_unit_t *parent,
                               const fsdp_param_spec_t *params, int nparams, fsdp_unit_t **unit_p)
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
        if (params[i].name != NULL && fsdp_name_taken(fs, params[i].name))
            return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                             "unit '%s': parameter name '%s' is already used by another unit", name,
                             params[i].name);
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
    if (status == FSDP_OK && fsdp_is_fsdp2(fs))
        status = unit_reshard(fs, u->name, opts, u);
    if (status == FSDP_OK && !(opts->gradient_divide_factor >= 0.0))
        status = fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                           "unit '%s': gradient_divide_factor %g is not allowed: give 0 (unset) "
                           "or a positive factor",
                           u->name, opts->gradient_divide_factor);
    u->divide_factor = opts->gradient_divide_factor;
    u->force_sum = opts->force_sum_reduction != 0;
    if (status != FSDP_OK)
        goto err_free_name;
    status = fsdp_ignored_split(fs, u, params, nparams, &managed, &nmanaged);
    if (status != FSDP_OK)
        goto err_free_name;
    status = fsdp_buffers_create(fs, u, opts, params, nparams);
    if (status != FSDP_OK) {
        free(managed);
        fsdp_ignored_free(fs, u);
        goto err_free_name;
    }
    if (nmanaged > 0)
        status = fsdp_handle_create(u, managed, nmanaged, &u->handle);
    free(managed);
    if (status != FSDP_OK) {
        fsdp_buffers_free(fs, u);
        fsdp_ignored_free(fs, u);
        goto err_free_name;
    }
    status = fsdp_names_add_unit(fs, u);
    if (status != FSDP_OK)
        goto err_free_all;
    fs->units[fs->nunits++] = u;
    if (u->is_root)
        fs->root = u;
    *unit_p = u;
    return FSDP_OK;

err_free_all:
    fsdp_handle_destroy(fs, u->handle);
    fsdp_buffers_free(fs, u);
    fsdp_ignored_free(fs, u);
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
    if (u->handle == NULL)
        return NULL;
    u->handle->shard_version = fsdp_handle_new_version(); /* the caller may write through it */
    return u->handle->local_shard;
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
        return fsdp_fail(u->fs, FSDP_ERR_STATE,
                         "unit '%s': %s needs the unit idle, not in "
                         "forward or backward",
                         u->name, what);
    return FSDP_OK;
}

/* Copies the part of a parameter in this rank's shard (numel_in_shard values) into it. */
static fsdp_status_t set_shard_part(fsdp_unit_t *u, const fsdp_param_info_t *pi, const float *part)
{
    fsdp_t *fs = u->fs;
    fsdp_dev_t *dev = fs->dev;
    fsdp_status_t status;

    if (!pi->in_shard)
        return FSDP_OK;
    u->handle->shard_version = fsdp_handle_new_version();
    status = fsdp_dev_memcpy_async(dev, u->handle->local_shard + pi->offset_in_shard, part,
                                   pi->numel_in_shard * sizeof(float), fs->compute);
    if (status == FSDP_OK) /* the caller's buffer may go away on return */
        status = fsdp_dev_stream_synchronize(dev, fs->compute);
    return status;
}

/* sync_module_states for a parameter: rank 0's values, then each rank keeps its part. */
static fsdp_status_t set_param_from_rank0(fsdp_unit_t *u, const fsdp_param_info_t *pi,
                                          const float *host_values)
{
    fsdp_t *fs = u->fs;
    float *full = malloc(pi->numel * sizeof(float) + 1);
    fsdp_status_t status;

    if (full == NULL)
        return FSDP_ERR_NO_MEMORY;
    status = fsdp_broadcast_from_rank0(fs, host_values, pi->numel, full);
    if (status == FSDP_OK)
        status = set_shard_part(u, pi, full + pi->intra_start);
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
    return set_shard_part(u, pi, host_values + pi->intra_start);
}

fsdp_status_t fsdp_unit_set_param_reads(const fsdp_unit_t *u, int index, size_t *first_p,
                                        size_t *count_p)
{
    const fsdp_param_info_t *pi;

    if (u->handle == NULL || index < 0 || index >= u->handle->nparams || first_p == NULL ||
        count_p == NULL)
        return fsdp_fail(u->fs, FSDP_ERR_INVALID_PARAM,
                         "unit '%s': no parameter %d (it has %d), or no first_p and count_p",
                         u->name, index, fsdp_unit_num_params(u));
    pi = &u->handle->params[index];
    *first_p = 0;
    *count_p = 0;
    if (u->fs->cfg.sync_module_states && !u->fs->dev->no_data) { /* set_param_from_rank0 */
        *count_p = pi->numel;
    } else if (pi->in_shard) { /* set_shard_part */
        *first_p = pi->intra_start;
        *count_p = pi->numel_in_shard;
    }
    return FSDP_OK;
}

fsdp_status_t fsdp_unit_set_param_shard(fsdp_unit_t *u, int index, const float *host_values)
{
    fsdp_status_t status;

    if (u->handle == NULL || index < 0 || index >= u->handle->nparams ||
        (host_values == NULL && u->handle->params[index].in_shard))
        return fsdp_fail(u->fs, FSDP_ERR_INVALID_PARAM,
                         "unit '%s': no parameter %d to set (it has %d)", u->name, index,
                         fsdp_unit_num_params(u));
    status = require_idle(u, "setting a parameter");
    if (status != FSDP_OK)
        return status;
    return set_shard_part(u, &u->handle->params[index], host_values);
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
    if (fsdp_is_fsdp2(fs)) {
        return fsdp_pgroup_gather(fs, h, shard, host_out);
    } else if (!fsdp_strategy_is_sharded(u->strategy)) {
        status =
            fsdp_dev_memcpy_async(dev, host_out, shard, h->numel * sizeof(float), fs->compute);
    } else {
        const void *src = shard;
        status = fsdp_mem_alloc(fs->mem, h->shard_numel * (size_t)h->world * sizeof(float),
                                FSDP_MEM_TEMPORARY, fs->compute, &full);
        if (status == FSDP_OK && h->offload) {
            /* collectives read device memory: stage the host shard */
            status = fsdp_mem_alloc(fs->mem, h->shard_numel * sizeof(float), FSDP_MEM_TEMPORARY,
                                    fs->compute, &staged);
            if (status == FSDP_OK)
                status = fsdp_dev_memcpy_async(dev, staged, shard, h->shard_numel * sizeof(float),
                                               fs->compute);
            src = staged;
        }
        if (status == FSDP_OK)
            status = fsdp_dev_all_gather(dev, u->pg, src, full, h->shard_numel, FSDP_DTYPE_F32,
                                         fs->compute);
        if (status == FSDP_OK)
            status =
                fsdp_dev_memcpy_async(dev, host_out, full, h->numel * sizeof(float), fs->compute);
    }
    if (status == FSDP_OK)
        status = fsdp_dev_stream_synchronize(dev, fs->compute);
    fsdp_mem_free(fs->mem, staged);
    fsdp_mem_free(fs->mem, full);
    return status;
}

fsdp_status_t fsdp_unit_gather_full(fsdp_unit_t *u, float *host_out)
{
    return fsdp_unit_gather_buffer(u, u->handle ? u->handle->local_shard : NULL, host_out);
}

uint64_t fsdp_unit_param_version(const fsdp_unit_t *u)
{
    const fsdp_handle_t *h = u->handle;

    if (h == NULL || !h->uses_unsharded_view || u->state == FSDP_STATE_SUMMON_FULL_PARAMS ||
        u->fs->dev->no_data)
        return 0;
    /* NO_SHARD's parameters are LS itself, or a cast or copy of it made at unshard; FSDP2's
     * are always a copy-out */
    return fsdp_strategy_is_sharded(u->strategy) || fsdp_is_fsdp2(u->fs) ? h->gather_version
                                                                        : h->shard_version;
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
    if (h->pp != NULL)
        return h->pp[index].unsharded;
    base = fsdp_strategy_is_sharded(u->strategy) ? (char *)h->full_param_padded
                                                 : (char *)fsdp_handle_shard_source(h);
    return base + h->params[index].offset * fsdp_dtype_size(h->compute_dtype);
}

fsdp_status_t fsdp_unit_grad(fsdp_unit_t *u, int index, void **grad_p)
{
    fsdp_handle_t *h = u->handle;
    fsdp_status_t status;

    if (h == NULL || index < 0 || index >= h->nparams)
        return fsdp_fail(u->fs, FSDP_ERR_INVALID_PARAM, "unit '%s': no parameter %d (it has %d)",
                         u->name, index, fsdp_unit_num_params(u));
    if (!h->params[index].requires_grad)
        return fsdp_fail(u->fs, FSDP_ERR_INVALID_PARAM,
                         "rank %d: unit '%s': parameter '%s' is frozen (requires_grad=0) and "
                         "has no gradient",
                         u->fs->dev->rank, u->name, h->params[index].name);
    if (h->state != FSDP_HANDLE_BACKWARD_PRE)
        return fsdp_fail(u->fs, FSDP_ERR_STATE,
                         "rank %d: unit '%s': gradients are written between its pre- and "
                         "post-backward hooks",
                         u->fs->dev->rank, u->name);
    if (h->pp != NULL)
        return fsdp_pgroup_grad(u->fs, h, index, grad_p);
    status = fsdp_handle_alloc_grad(u->fs, h);
    if (status != FSDP_OK)
        return status;
    *grad_p =
        (char *)h->unsharded_grad + h->params[index].offset * fsdp_dtype_size(h->compute_dtype);
    return FSDP_OK;
}
