/* Flat-parameter handles: flattening, shard metadata, unshard, reshard and gradient reduction
 * (fsdp-semantics.md sections 2 B, C, G and 4). */
#include "runtime.h"

#include <stdlib.h>
#include <string.h>

static fsdp_status_t check_spec(fsdp_t *fs, const char *unit, const fsdp_param_spec_t *params,
                                int nparams, int i)
{
    const fsdp_param_spec_t *p = &params[i];

    if (p->name == NULL || p->name[0] == '\0')
        return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                         "unit '%s': parameter %d has no name", unit, i);
    if (p->ndim < 0 || p->ndim > FSDP_MAX_DIMS)
        return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                         "unit '%s': parameter '%s' has %d dimensions; 0 to %d are allowed",
                         unit, p->name, p->ndim, FSDP_MAX_DIMS);
    for (int d = 0; d < p->ndim; d++) {
        if (p->shape[d] < 0)
            return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                             "unit '%s': parameter '%s' has negative dimension %lld", unit,
                             p->name, (long long)p->shape[d]);
    }
    for (int j = 0; j < i; j++) {
        if (strcmp(params[j].name, p->name) == 0)
            return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                             "unit '%s': parameter name '%s' appears twice", unit, p->name);
    }
    if (p->tied_to >= 0) {
        const fsdp_param_spec_t *t;
        if (p->tied_to >= i || p->tied_to >= nparams || params[p->tied_to].tied_to >= 0)
            return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                             "unit '%s': parameter '%s' is tied to index %d; it must name an "
                             "earlier, untied parameter of the same unit",
                             unit, p->name, p->tied_to);
        t = &params[p->tied_to];
        if (t->ndim != p->ndim || memcmp(t->shape, p->shape, sizeof(int64_t) * (size_t)p->ndim))
            return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                             "unit '%s': tied parameters '%s' and '%s' differ in shape", unit,
                             p->name, t->name);
    }
    return FSDP_OK;
}

/* Per-parameter shard info for a parameter at [ps, ps + numel) of the flat parameter and a
 * rank whose unsharded interval is [s, s + S) (section 4, with half-open intervals). */
static void shard_info(fsdp_param_info_t *pi, size_t s, size_t shard_numel)
{
    size_t ps = pi->offset, pe = pi->offset + pi->numel; /* [ps, pe) */
    size_t e = s + shard_numel;                          /* [s, e) */

    pi->in_shard = pi->numel > 0 && s < pe && e > ps;
    pi->offset_in_shard = 0;
    pi->intra_start = 0;
    pi->numel_in_shard = 0;
    if (!pi->in_shard)
        return;
    if (s <= ps) {
        pi->offset_in_shard = ps - s;
        pi->intra_start = 0;
    } else {
        pi->offset_in_shard = 0;
        pi->intra_start = s - ps;
    }
    pi->numel_in_shard = (pe < e ? pe : e) - ps - pi->intra_start;
}

fsdp_status_t fsdp_handle_create(fsdp_unit_t *u, const fsdp_param_spec_t *params, int nparams,
                                 fsdp_handle_t **h_p)
{
    fsdp_t *fs = u->fs;
    fsdp_handle_t *h;
    fsdp_status_t status;
    size_t total = 0;
    int nfrozen = 0;

    for (int i = 0; i < nparams; i++) {
        status = check_spec(fs, u->name, params, nparams, i);
        if (status != FSDP_OK)
            return status;
        nfrozen += !params[i].requires_grad;
    }
    if (nfrozen > 0) {
        char names[256] = "";
        size_t off = 0;
        for (int i = 0; i < nparams && off < sizeof(names); i++) {
            if (!params[i].requires_grad)
                off += (size_t)snprintf(names + off, sizeof(names) - off, "%s'%s'",
                                        off ? ", " : "", params[i].name);
        }
        return fsdp_fail(fs, FSDP_ERR_UNSUPPORTED,
                         "unit '%s': frozen parameters (requires_grad=0: %s) are not supported "
                         "in a flat parameter; wrap them in a unit of their own or leave them "
                         "out of FSDP",
                         u->name, names);
    }

    h = calloc(1, sizeof(*h));
    if (h == NULL)
        return FSDP_ERR_NO_MEMORY;
    h->params = calloc((size_t)nparams, sizeof(*h->params));
    if (h->params == NULL) {
        status = FSDP_ERR_NO_MEMORY;
        goto err_free_h;
    }
    h->unit = u;
    h->nparams = nparams;
    h->pre_forward_order_index = -1;
    h->post_forward_index = -1;

    /* flatten in declaration order; a tied parameter is stored once, at its target */
    for (int i = 0; i < nparams; i++) {
        fsdp_param_info_t *pi = &h->params[i];
        size_t numel = 1;
        pi->name = strdup(params[i].name);
        if (pi->name == NULL) {
            status = FSDP_ERR_NO_MEMORY;
            goto err_free_params;
        }
        pi->ndim = params[i].ndim;
        for (int d = 0; d < pi->ndim; d++) {
            pi->shape[d] = params[i].shape[d];
            numel *= (size_t)params[i].shape[d];
        }
        pi->numel = numel;
        pi->tied_to = params[i].tied_to;
        if (pi->tied_to >= 0) {
            pi->offset = h->params[pi->tied_to].offset;
        } else {
            pi->offset = total;
            total += numel;
        }
    }
    h->numel = total;
    if (fsdp_strategy_is_sharded(fs->strategy)) {
        h->world = fs->pg->size;
        h->rank = fs->pg->rank;
    } else {
        h->world = 1;
        h->rank = 0;
    }
    h->shard_numel = fsdp_shard_numel(total, h->world);
    fsdp_shard_extent(total, h->world, h->rank, &h->numel_in_shard, &h->shard_pad);
    for (int i = 0; i < nparams; i++)
        shard_info(&h->params[i], (size_t)h->rank * h->shard_numel, h->shard_numel);

    status = fsdp_mem_alloc(fs->mem, h->shard_numel * sizeof(float), FSDP_MEM_SHARDED_PARAM,
                            fs->compute, (void **)&h->local_shard);
    if (status != FSDP_OK)
        goto err_free_params;
    /* the padding tail must hold zeros: it is all-gathered and reduced with the rest */
    status = fsdp_k_fill(fs, fs->compute, h->local_shard, FSDP_DTYPE_F32, h->shard_numel, 0.0);
    if (status != FSDP_OK)
        goto err_free_shard;
    *h_p = h;
    return FSDP_OK;

err_free_shard:
    fsdp_mem_free(fs->mem, h->local_shard);
err_free_params:
    for (int i = 0; i < nparams; i++)
        free((char *)h->params[i].name);
    free(h->params);
err_free_h:
    free(h);
    return status;
}

void fsdp_handle_destroy(fsdp_t *fs, fsdp_handle_t *h)
{
    if (h == NULL)
        return;
    fsdp_mem_free(fs->mem, h->full_param_padded);
    fsdp_mem_free(fs->mem, h->unsharded_grad);
    fsdp_mem_free(fs->mem, h->saved_grad_shard);
    fsdp_mem_free(fs->mem, h->local_shard);
    for (int i = 0; i < h->nparams; i++)
        free((char *)h->params[i].name);
    free(h->params);
    free(h);
}

/* The CPU rate limiter (section 2 B.3): with two reshard-free events outstanding, wait for
 * the oldest before issuing another all-gather. */
static fsdp_status_t limiter_dequeue_if_needed(fsdp_t *fs)
{
    fsdp_event_t *ev;
    fsdp_status_t status;

    if (!fs->cfg.limit_all_gathers || fs->n_limiter_events < FSDP_LIMITER_MAX_INFLIGHT)
        return FSDP_OK;
    ev = fs->limiter_events[0];
    memmove(&fs->limiter_events[0], &fs->limiter_events[1],
            sizeof(ev) * (size_t)(fs->n_limiter_events - 1));
    fs->n_limiter_events--;
    status = fs->dev->ops->event_synchronize(fs->dev, ev);
    fs->dev->ops->event_destroy(fs->dev, ev);
    return status;
}

static fsdp_status_t limiter_enqueue(fsdp_t *fs)
{
    fsdp_event_t *ev;
    fsdp_status_t status;

    /* bounded: each unshard dequeues one; if the queue ever fills, wait for the oldest now,
     * which only makes the limiter stricter */
    if (fs->n_limiter_events == FSDP_LIMITER_MAX_INFLIGHT + 1) {
        ev = fs->limiter_events[0];
        memmove(&fs->limiter_events[0], &fs->limiter_events[1],
                sizeof(ev) * (size_t)(fs->n_limiter_events - 1));
        fs->n_limiter_events--;
        status = fs->dev->ops->event_synchronize(fs->dev, ev);
        fs->dev->ops->event_destroy(fs->dev, ev);
        if (status != FSDP_OK)
            return status;
    }
    status = fs->dev->ops->event_create(fs->dev, &ev);
    if (status != FSDP_OK)
        return status;
    status = fs->dev->ops->event_record(fs->dev, ev, fs->compute);
    if (status != FSDP_OK) {
        fs->dev->ops->event_destroy(fs->dev, ev);
        return status;
    }
    fs->limiter_events[fs->n_limiter_events++] = ev;
    return FSDP_OK;
}

fsdp_status_t fsdp_handle_unshard(fsdp_t *fs, fsdp_handle_t *h)
{
    fsdp_dev_t *dev = fs->dev;
    fsdp_status_t status;

    /* B.1-2: pre-unshard has nothing to do without mixed precision or CPU offload */
    status = limiter_dequeue_if_needed(fs);
    if (status != FSDP_OK)
        return status;
    /* B.4: NO_SHARD, or an unsharded parameter kept since forward: a pointer switch */
    if (!fsdp_strategy_is_sharded(fs->strategy) || h->full_param_padded != NULL) {
        h->uses_unsharded_view = 1;
        return FSDP_OK;
    }
    status = fsdp_mem_alloc(fs->mem, h->shard_numel * (size_t)h->world * sizeof(float),
                            FSDP_MEM_UNSHARDED_PARAM, fs->unshard, &h->full_param_padded);
    if (status != FSDP_OK)
        return fsdp_fail(fs, status, "rank %d: unit '%s': cannot allocate its unsharded "
                         "parameter (%zu elements)", dev->rank, h->unit->name,
                         h->shard_numel * (size_t)h->world);
    status = dev->ops->all_gather(dev, fs->pg, h->local_shard, h->full_param_padded,
                                  h->shard_numel, FSDP_DTYPE_F32, fs->unshard);
    if (status != FSDP_OK)
        return fsdp_fail(fs, status, "rank %d: unit '%s': all-gather failed: %s", dev->rank,
                         h->unit->name, fsdp_status_string(status));
    h->uses_unsharded_view = 1;
    return FSDP_OK;
}

fsdp_status_t fsdp_handle_reshard(fsdp_t *fs, fsdp_handle_t *h, int free_unsharded)
{
    fsdp_status_t status = FSDP_OK;

    h->uses_unsharded_view = 0; /* C.1: parameters point at the local shard again */
    if (free_unsharded && h->full_param_padded != NULL) {
        /* C.2: the compute stream may still read it */
        status = fsdp_mem_record_stream(fs->mem, h->full_param_padded, fs->compute);
        fsdp_mem_free(fs->mem, h->full_param_padded);
        h->full_param_padded = NULL;
        if (status == FSDP_OK && fs->cfg.limit_all_gathers)
            status = limiter_enqueue(fs); /* C.4 */
    }
    h->prefetched = 0;
    return status;
}

fsdp_status_t fsdp_handle_alloc_grad(fsdp_t *fs, fsdp_handle_t *h)
{
    fsdp_status_t status;

    if (h->unsharded_grad != NULL)
        return FSDP_OK;
    /* autograd's AccumulateGrad allocates the gradient on the compute stream */
    status = fsdp_mem_alloc(fs->mem, h->numel * sizeof(float), FSDP_MEM_GRADIENT, fs->compute,
                            &h->unsharded_grad);
    if (status != FSDP_OK)
        return fsdp_fail(fs, status, "rank %d: unit '%s': cannot allocate its gradient",
                         fs->dev->rank, h->unit->name);
    return fsdp_k_fill(fs, fs->compute, h->unsharded_grad, FSDP_DTYPE_F32, h->numel, 0.0);
}

/* Adds a reduced gradient shard into the one kept for the optimizer, or keeps it (G.5). */
static fsdp_status_t accumulate_grad(fsdp_t *fs, fsdp_handle_t *h, float **grad,
                                     fsdp_stream_t *stream)
{
    fsdp_status_t status;

    if (h->saved_grad_shard == NULL) {
        h->saved_grad_shard = *grad;
        *grad = NULL;
        return FSDP_OK;
    }
    status = fsdp_k_axpy(fs, stream, h->saved_grad_shard, *grad, h->shard_numel, 1.0f);
    fsdp_mem_free(fs->mem, *grad);
    *grad = NULL;
    return status;
}

fsdp_status_t fsdp_handle_reduce_grad(fsdp_t *fs, fsdp_handle_t *h)
{
    fsdp_dev_t *dev = fs->dev;
    fsdp_stream_t *r = fs->post_backward;
    float *grad = h->unsharded_grad;
    void *padded = NULL;
    float *reduced = NULL;
    double pre, post;
    fsdp_status_t status;

    /* D counts every rank the gradient is averaged over: W, or W * R for hybrid */
    fsdp_divide_factors(fs->pg->size * (fs->replicate ? fs->replicate->size : 1), &pre, &post);
    /* G.4: the post-backward stream waits for the gradient computation */
    status = fsdp_stream_wait_stream(dev, r, fs->compute);
    if (status != FSDP_OK)
        return status;

    if (!fsdp_strategy_is_sharded(fs->strategy)) {
        /* G.6: all-reduce the whole gradient in place */
        status = fsdp_k_div(fs, r, grad, FSDP_DTYPE_F32, h->numel, (float)pre);
        if (status == FSDP_OK)
            status = dev->ops->all_reduce(dev, fs->pg, grad, grad, h->numel, FSDP_DTYPE_F32,
                                          FSDP_REDUCE_SUM, r);
        if (status == FSDP_OK)
            status = fsdp_k_div(fs, r, grad, FSDP_DTYPE_F32, h->numel, (float)post);
        if (status != FSDP_OK)
            return fsdp_fail(fs, status, "rank %d: unit '%s': gradient all-reduce failed: %s",
                             dev->rank, h->unit->name, fsdp_status_string(status));
        h->unsharded_grad = NULL;
        status = fsdp_mem_record_stream(fs->mem, grad, r);
        if (status == FSDP_OK)
            status = accumulate_grad(fs, h, &grad, r);
        fsdp_mem_free(fs->mem, grad);
        return status;
    }

    /* G.5: pad to S*W when T is not a multiple of W */
    size_t padded_numel = h->shard_numel * (size_t)h->world;
    const void *input = grad;
    if (padded_numel > h->numel) {
        status = fsdp_mem_alloc(fs->mem, padded_numel * sizeof(float), FSDP_MEM_COMM_BUFFER, r,
                                &padded);
        if (status != FSDP_OK)
            goto out;
        status = dev->ops->memcpy_async(dev, padded, grad, h->numel * sizeof(float), r);
        if (status == FSDP_OK)
            status = fsdp_k_fill(fs, r, (float *)padded + h->numel, FSDP_DTYPE_F32,
                                 padded_numel - h->numel, 0.0);
        if (status != FSDP_OK)
            goto out;
        input = padded;
    }
    status = fsdp_mem_alloc(fs->mem, h->shard_numel * sizeof(float), FSDP_MEM_GRADIENT, r,
                            (void **)&reduced);
    if (status != FSDP_OK)
        goto out;
    status = fsdp_k_div(fs, r, (void *)input, FSDP_DTYPE_F32, padded_numel, (float)pre);
    if (status != FSDP_OK)
        goto out;
    status = dev->ops->reduce_scatter(dev, fs->pg, input, reduced, h->shard_numel,
                                      FSDP_DTYPE_F32, FSDP_REDUCE_SUM, r);
    if (status != FSDP_OK) {
        fsdp_fail(fs, status, "rank %d: unit '%s': gradient reduce-scatter failed: %s",
                  dev->rank, h->unit->name, fsdp_status_string(status));
        goto out;
    }
    if (fs->replicate != NULL) {
        /* hybrid: all-reduce the shard across replicas on the all-reduce stream */
        fsdp_stream_t *a = fs->all_reduce;
        status = fsdp_stream_wait_stream(dev, a, r);
        if (status == FSDP_OK)
            status = fsdp_mem_record_stream(fs->mem, reduced, a);
        if (status == FSDP_OK)
            status = dev->ops->all_reduce(dev, fs->replicate, reduced, reduced, h->shard_numel,
                                          FSDP_DTYPE_F32, FSDP_REDUCE_SUM, a);
        if (status != FSDP_OK) {
            fsdp_fail(fs, status, "rank %d: unit '%s': inter-node gradient all-reduce failed: %s",
                      dev->rank, h->unit->name, fsdp_status_string(status));
            goto out;
        }
        r = a;
    }
    status = fsdp_k_div(fs, r, reduced, FSDP_DTYPE_F32, h->shard_numel, (float)post);
    if (status == FSDP_OK)
        status = accumulate_grad(fs, h, &reduced, r);
    if (status != FSDP_OK)
        goto out;
    /* G.7: the gradient was produced on C and consumed on R */
    status = fsdp_mem_record_stream(fs->mem, grad, r);
out:
    fsdp_mem_free(fs->mem, reduced);
    fsdp_mem_free(fs->mem, padded);
    fsdp_mem_free(fs->mem, h->unsharded_grad);
    h->unsharded_grad = NULL;
    return status;
}
