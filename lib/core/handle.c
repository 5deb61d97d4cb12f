/* Flat-parameter handles: flattening, shard metadata, unshard, reshard and gradient reduction
 * (docs/runtime.md sections 2 B, C, G and 4). */
#include "core/core_int.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

uint64_t fsdp_handle_new_version(void)
{
    static atomic_uint_fast64_t last;
    return (uint64_t)atomic_fetch_add_explicit(&last, 1, memory_order_relaxed) + 1;
}

fsdp_status_t fsdp_check_param_spec(fsdp_t *fs, const char *unit,
                                    const fsdp_param_spec_t *params, int nparams, int i)
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
    if (p->tp_shard < -1 || (p->tp_shard < 0 && p->ndim < 1) ||
        (p->tp_shard > 0 &&
         (p->ndim < 1 || p->ndim > 2 || p->shape[p->ndim - 1] % p->tp_shard != 0)))
        return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                         "unit '%s': parameter '%s' has tp_shard %d; 0 (replicated), -1 (rows) "
                         "or P > 0 (P blocks of columns of a 1-d or 2-d tensor, P dividing the "
                         "last dimension) are allowed",
                         unit, p->name, p->tp_shard);
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
        if (p->ignored || t->ignored)
            return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                             "unit '%s': parameter '%s' is tied to '%s' and one of them is "
                             "ignored; tied parameters must both be managed", unit, p->name,
                             t->name);
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

/* A sharded-size f32 buffer: pinned host memory under CPU offload, else device memory. */
fsdp_status_t fsdp_shard_alloc(fsdp_t *fs, fsdp_handle_t *h, size_t numel, void **ptr_p)
{
    size_t bytes = numel * sizeof(float);
    fsdp_status_t status;

    if (!h->offload)
        return fsdp_mem_alloc(fs->mem, bytes, FSDP_MEM_SHARDED_PARAM, fs->compute, ptr_p);
    *ptr_p = NULL;
    if (bytes == 0)
        return FSDP_OK;
    status = fsdp_dev_segment_alloc(fs->dev, FSDP_MEMKIND_HOST_PINNED, bytes, ptr_p);
    if (status != FSDP_OK)
        return fsdp_fail(fs, status, "rank %d: unit '%s': cannot allocate %zu bytes of pinned "
                         "host memory", fs->dev->rank, h->unit->name, bytes);
    fs->host_pinned_bytes += bytes;
    return FSDP_OK;
}

void fsdp_shard_free(fsdp_t *fs, fsdp_handle_t *h, void *ptr, size_t numel)
{
    if (ptr == NULL)
        return;
    if (!h->offload) {
        fsdp_mem_free(fs->mem, ptr);
        return;
    }
    fsdp_dev_segment_free(fs->dev, FSDP_MEMKIND_HOST_PINNED, ptr);
    fs->host_pinned_bytes -= numel * sizeof(float);
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
        status = fsdp_check_param_spec(fs, u->name, params, nparams, i);
        if (status != FSDP_OK)
            return status;
        nfrozen += !params[i].requires_grad;
    }
    /* fully_shard keeps every parameter apart: frozen and trainable ones mix freely */
    if (nfrozen > 0 && nfrozen < nparams && !fs->cfg.use_orig_params && !fsdp_is_fsdp2(fs)) {
        char names[256] = "";
        size_t off = 0;
        for (int i = 0; i < nparams && off < sizeof(names); i++) {
            if (!params[i].requires_grad)
                off += (size_t)snprintf(names + off, sizeof(names) - off, "%s'%s'",
                                        off ? ", " : "", params[i].name);
        }
        return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                         "unit '%s' mixes frozen parameters (requires_grad=0: %s) with trainable "
                         "ones in one flat parameter; set use_orig_params, or put the frozen "
                         "ones in a unit of their own",
                         u->name, names);
    }
    for (int i = 0; i < nparams; i++) {
        if (params[i].tied_to >= 0 &&
            params[i].requires_grad != params[params[i].tied_to].requires_grad)
            return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                             "unit '%s': tied parameters '%s' and '%s' differ in requires_grad",
                             u->name, params[i].name, params[params[i].tied_to].name);
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
        pi->requires_grad = params[i].requires_grad != 0;
        pi->tp_shard = fs->tp != NULL ? params[i].tp_shard : 0;
        if (pi->tied_to >= 0) {
            pi->offset = h->params[pi->tied_to].offset;
        } else {
            pi->offset = total;
            total += numel;
        }
    }
    h->numel = total;
    if (fsdp_is_fsdp2(fs)) {
        /* fully_shard: every parameter on dim 0 over the shard group, one rank or many */
        h->world = h->unit->pg->size;
        h->rank = h->unit->pg->rank;
        status = fsdp_pgroup_layout(fs, h);
        if (status != FSDP_OK)
            goto err_free_params;
        for (int i = 0; i < nparams; i++)
            h->pp[i].tp_partial = fs->tp != NULL && params[i].tp_partial_grad;
    } else if (fsdp_strategy_is_sharded(h->unit->strategy)) {
        h->world = h->unit->pg->size;
        h->rank = h->unit->pg->rank;
    } else {
        h->world = 1;
        h->rank = 0;
    }
    if (!fsdp_is_fsdp2(fs)) {
        h->shard_numel = fsdp_shard_numel(total, h->world);
        fsdp_shard_extent(total, h->world, h->rank, &h->numel_in_shard, &h->shard_pad);
        for (int i = 0; i < nparams; i++)
            shard_info(&h->params[i], (size_t)h->rank * h->shard_numel, h->shard_numel);
    }

    h->compute_dtype = fs->param_dtype;
    h->reduce_dtype = fs->reduce_dtype;
    h->offload = fs->cfg.cpu_offload;
    status = fsdp_shard_alloc(fs, h, h->shard_numel, (void **)&h->local_shard);
    if (status != FSDP_OK)
        goto err_free_params;
    /* the padding tail must hold zeros: it is all-gathered and reduced with the rest */
    status = fsdp_k_fill(fs, fs->compute, h->local_shard, FSDP_DTYPE_F32, h->shard_numel, 0.0);
    if (status != FSDP_OK)
        goto err_free_shard;
    h->shard_version = fsdp_handle_new_version();
    *h_p = h;
    return FSDP_OK;

err_free_shard:
    fsdp_shard_free(fs, h, h->local_shard, h->shard_numel);
err_free_params:
    fsdp_pgroup_free(fs, h);
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
    fsdp_mem_free(fs->mem, h->mp_shard);
    fsdp_mem_free(fs->mem, h->h2d_shard);
    fsdp_mem_free(fs->mem, h->unsharded_grad);
    fsdp_mem_free(fs->mem, h->saved_grad_shard);
    fsdp_mem_free(fs->mem, h->low_grad);
    fsdp_shard_free(fs, h, h->cpu_grad, h->shard_numel);
    fsdp_shard_free(fs, h, h->local_shard, h->shard_numel);
    fsdp_pgroup_free(fs, h);
    for (int i = 0; i < h->nparams; i++)
        free((char *)h->params[i].name);
    free(h->params);
    free(h);
}

/* B.1 on the pre-unshard stream: the low-precision shard (cast of LS) under mixed precision,
 * or the device copy of an offloaded LS. *did_work_p: something was enqueued on P. */
static fsdp_status_t pre_unshard(fsdp_t *fs, fsdp_handle_t *h, int *did_work_p)
{
    fsdp_dev_t *dev = fs->dev;
    fsdp_stream_t *p = fs->pre_unshard;
    int mp = h->compute_dtype != FSDP_DTYPE_F32;
    size_t n = h->shard_numel, bytes = n * sizeof(float);
    const void *src = h->local_shard;
    void *staged = NULL;
    fsdp_status_t status;

    *did_work_p = 0;
    if (fsdp_strategy_is_sharded(h->unit->strategy) && !h->offload && h->full_param_padded != NULL)
        return FSDP_OK; /* unsharded since forward: nothing to prepare */
    if (!mp && !h->offload)
        return FSDP_OK;
    *did_work_p = 1;
    if (h->offload) {
        /* host-to-device copy of the shard on the pre-unshard stream */
        status = fsdp_mem_alloc(fs->mem, bytes, FSDP_MEM_SHARDED_PARAM, p, &staged);
        if (status == FSDP_OK)
            status = fsdp_dev_memcpy_async(dev, staged, h->local_shard, bytes, p);
        if (status != FSDP_OK) {
            fsdp_mem_free(fs->mem, staged);
            return status;
        }
        src = staged;
        if (!mp) {
            h->h2d_shard = staged;
            return FSDP_OK;
        }
    }
    status = fsdp_mem_alloc(fs->mem, n * fsdp_dtype_size(h->compute_dtype),
                            FSDP_MEM_LOW_PREC_SHARD, p, &h->mp_shard);
    if (status == FSDP_OK)
        status = fsdp_k_cast(fs, p, h->mp_shard, h->compute_dtype, src, FSDP_DTYPE_F32, n);
    /* the transient f32 copy of an offloaded shard is not needed past the cast */
    fsdp_mem_free(fs->mem, staged);
    return status;
}

/* What the all-gather reads, and what NO_SHARD parameters point at. */
const void *fsdp_handle_shard_source(const fsdp_handle_t *h)
{
    if (h->mp_shard != NULL)
        return h->mp_shard;
    if (h->h2d_shard != NULL)
        return h->h2d_shard;
    return h->local_shard;
}

fsdp_status_t fsdp_handle_unshard(fsdp_t *fs, fsdp_handle_t *h)
{
    fsdp_dev_t *dev = fs->dev;
    int did_work;
    fsdp_status_t status;

    status = pre_unshard(fs, h, &did_work);
    if (status == FSDP_OK && did_work)
        status = fsdp_stream_wait_stream(dev, fs->unshard, fs->pre_unshard); /* B.2 */
    if (status == FSDP_OK)
        status = fsdp_limiter_wait(fs); /* B.3 */
    if (status != FSDP_OK)
        return status;
    /* B.4: NO_SHARD, or an unsharded parameter kept since forward: a pointer switch */
    if (!fsdp_strategy_is_sharded(h->unit->strategy) || h->full_param_padded != NULL) {
        h->uses_unsharded_view = 1;
        if (fsdp_strategy_is_sharded(h->unit->strategy)) {
            /* a redundant staging copy (SHARD_GRAD_OP with offload) is dropped */
            fsdp_mem_free(fs->mem, h->h2d_shard);
            h->h2d_shard = NULL;
            status = fsdp_mem_record_stream(fs->mem, h->mp_shard, fs->unshard);
            fsdp_mem_free(fs->mem, h->mp_shard);
            h->mp_shard = NULL;
        }
        return status;
    }
    status = fsdp_mem_alloc(fs->mem,
                            h->shard_numel * (size_t)h->world * fsdp_dtype_size(h->compute_dtype),
                            FSDP_MEM_UNSHARDED_PARAM, fs->unshard, &h->full_param_padded);
    if (status != FSDP_OK)
        return fsdp_fail_below(fs, status,
                               "rank %d: unit '%s': cannot allocate its unsharded "
                               "parameter (%zu elements)",
                               dev->rank, h->unit->name, h->shard_numel * (size_t)h->world);
    status = fsdp_dev_all_gather(dev, h->unit->pg, fsdp_handle_shard_source(h),
                                  h->full_param_padded, h->shard_numel, h->compute_dtype,
                                  fs->unshard);
    if (status != FSDP_OK)
        return fsdp_fail_below(fs, status, "rank %d: unit '%s': all-gather failed: %s", dev->rank,
                               h->unit->name, fsdp_status_string(status));
    h->gather_version = fsdp_handle_new_version();
    h->uses_unsharded_view = 1;
    /* B.4 offload: the staged copy was read on U; B.5: so was the low-precision shard */
    status = fsdp_mem_record_stream(fs->mem, h->h2d_shard, fs->unshard);
    fsdp_mem_free(fs->mem, h->h2d_shard);
    h->h2d_shard = NULL;
    if (status == FSDP_OK)
        status = fsdp_mem_record_stream(fs->mem, h->mp_shard, fs->unshard);
    fsdp_mem_free(fs->mem, h->mp_shard);
    h->mp_shard = NULL;
    return status;
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
            status = fsdp_limiter_record(fs); /* C.4 */
    }
    /* C.3: NO_SHARD's low-precision (or staged) full parameter was read by compute */
    if (!fsdp_strategy_is_sharded(h->unit->strategy)) {
        void **bufs[2] = {&h->mp_shard, &h->h2d_shard};
        for (int i = 0; i < 2; i++) {
            fsdp_status_t st = fsdp_mem_record_stream(fs->mem, *bufs[i], fs->compute);
            if (status == FSDP_OK)
                status = st;
            fsdp_mem_free(fs->mem, *bufs[i]);
            *bufs[i] = NULL;
        }
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
    status = fsdp_mem_alloc(fs->mem, h->numel * fsdp_dtype_size(h->compute_dtype),
                            FSDP_MEM_GRADIENT, fs->compute, &h->unsharded_grad);
    if (status != FSDP_OK)
        return fsdp_fail_below(fs, status, "rank %d: unit '%s': cannot allocate its gradient",
                               fs->dev->rank, h->unit->name);
    return fsdp_k_fill(fs, fs->compute, h->unsharded_grad, h->compute_dtype, h->numel, 0.0);
}

/* Adds a reduced f32 gradient shard into the one kept for the optimizer, or keeps it (G.5). */
static fsdp_status_t accumulate_grad(fsdp_t *fs, fsdp_handle_t *h, void **grad,
                                     fsdp_stream_t *stream)
{
    fsdp_status_t status;

    if (h->low_grad != NULL) {
        /* keep_low_precision_grads: last step's low-precision gradient, back to f32 to
         * accumulate into (docs/runtime.md section 5) */
        status = fsdp_mem_alloc(fs->mem, h->shard_numel * sizeof(float), FSDP_MEM_GRADIENT,
                                stream, (void **)&h->saved_grad_shard);
        if (status == FSDP_OK)
            status = fsdp_k_cast(fs, stream, h->saved_grad_shard, FSDP_DTYPE_F32, h->low_grad,
                                 h->compute_dtype, h->shard_numel);
        if (status == FSDP_OK)
            status = fsdp_mem_record_stream(fs->mem, h->low_grad, stream);
        fsdp_mem_free(fs->mem, h->low_grad);
        h->low_grad = NULL;
        if (status != FSDP_OK)
            return status;
    }
    if (h->saved_grad_shard == NULL) {
        h->saved_grad_shard = *grad;
        *grad = NULL;
        return FSDP_OK;
    }
    if (h->offload)
        return fsdp_fail(fs, FSDP_ERR_UNSUPPORTED,
                         "rank %d: unit '%s': accumulating gradients across iterations without "
                         "no_sync is not supported with CPU offload (as in PyTorch); use "
                         "fsdp_set_sync_gradients(fs, 0) for the accumulation steps",
                         fs->dev->rank, h->unit->name);
    status = fsdp_k_axpy(fs, stream, h->saved_grad_shard, *grad, h->shard_numel, 1.0f);
    fsdp_mem_free(fs->mem, *grad);
    *grad = NULL;
    return status;
}

/* Brings a reduced gradient (n elements of the reduce dtype) to f32 for accumulation. */
static fsdp_status_t to_full_precision(fsdp_t *fs, fsdp_handle_t *h, void **grad, size_t n,
                                       fsdp_stream_t *stream)
{
    void *full = NULL;
    fsdp_status_t status;

    if (h->reduce_dtype == FSDP_DTYPE_F32)
        return FSDP_OK;
    status = fsdp_mem_alloc(fs->mem, n * sizeof(float), FSDP_MEM_GRADIENT, stream, &full);
    if (status == FSDP_OK)
        status = fsdp_k_cast(fs, stream, full, FSDP_DTYPE_F32, *grad, h->reduce_dtype, n);
    if (status == FSDP_OK)
        status = fsdp_mem_record_stream(fs->mem, *grad, stream);
    fsdp_mem_free(fs->mem, *grad);
    *grad = full;
    return status;
}

/* CPU offload: the reduced shard goes to pinned host memory for the host optimizer. */
static fsdp_status_t offload_grad(fsdp_t *fs, fsdp_handle_t *h, fsdp_stream_t *stream)
{
    fsdp_dev_t *dev = fs->dev;
    fsdp_status_t status = FSDP_OK;

    if (!h->offload)
        return FSDP_OK;
    if (h->cpu_grad == NULL)
        status = fsdp_shard_alloc(fs, h, h->shard_numel, (void **)&h->cpu_grad);
    if (status == FSDP_OK)
        status = fsdp_dev_memcpy_async(dev, h->cpu_grad, h->saved_grad_shard,
                                       h->shard_numel * sizeof(float), stream);
    if (status == FSDP_OK)
        status = fsdp_mem_record_stream(fs->mem, h->saved_grad_shard, stream);
    /* NO_SHARD's offload copy is blocking (G.6) */
    if (status == FSDP_OK && !fsdp_strategy_is_sharded(h->unit->strategy))
        status = fsdp_dev_stream_synchronize(dev, stream);
    h->has_cpu_grad = status == FSDP_OK;
    return status;
}

fsdp_status_t fsdp_handle_reduce_grad(fsdp_t *fs, fsdp_handle_t *h)
{
    fsdp_dev_t *dev = fs->dev;
    fsdp_stream_t *r = fs->post_backward;
    fsdp_dtype_t rd = h->reduce_dtype;
    size_t esz = fsdp_dtype_size(rd);
    size_t padded_numel = h->shard_numel * (size_t)h->world;
    void *grad = h->unsharded_grad, *low = NULL, *padded = NULL, *reduced = NULL;
    void *input;
    double pre, post;
    fsdp_status_t status = FSDP_OK;

    h->unsharded_grad = NULL;
    /* frozen parameters (use_orig_params) have no gradient: their region reduces as zeros */
    for (int i = 0; i < h->nparams && status == FSDP_OK; i++) {
        if (!h->params[i].requires_grad)
            status = fsdp_k_fill(fs, fs->compute,
                                 (char *)grad + h->params[i].offset *
                                                    fsdp_dtype_size(h->compute_dtype),
                                 h->compute_dtype, h->params[i].numel, 0.0);
    }
    /* D counts every rank the gradient is averaged over: W, or W * R for hybrid */
    fsdp_divide_factors(h->unit->pg->size * (h->unit->replicate ? h->unit->replicate->size : 1),
                        &pre, &post);
    /* G.4: the post-backward stream waits for the gradient computation */
    if (status == FSDP_OK)
        status = fsdp_stream_wait_stream(dev, r, fs->compute);
    if (status == FSDP_OK && h->compute_dtype != rd) {
        /* the gradient in the reduce dtype */
        status = fsdp_mem_alloc(fs->mem, h->numel * esz, FSDP_MEM_GRADIENT, r, &low);
        if (status == FSDP_OK)
            status = fsdp_k_cast(fs, r, low, rd, grad, h->compute_dtype, h->numel);
    }
    if (status != FSDP_OK)
        goto out;
    input = low != NULL ? low : grad;

    if (!fsdp_strategy_is_sharded(h->unit->strategy)) {
        /* G.6: all-reduce the whole gradient in place */
        status = fsdp_k_div(fs, r, input, rd, h->numel, (float)pre);
        if (status == FSDP_OK)
            status = fsdp_dev_all_reduce(dev, h->unit->pg, input, input, h->numel, rd,
                                         FSDP_REDUCE_SUM, r);
        if (status != FSDP_OK) {
            fsdp_fail_below(fs, status, "rank %d: unit '%s': gradient all-reduce failed: %s",
                            dev->rank, h->unit->name, fsdp_status_string(status));
            goto out;
        }
        status = fsdp_k_div(fs, r, input, rd, h->numel, (float)post);
        /* the reduced gradient becomes (or joins) the one kept for the optimizer */
        reduced = input;
        if (input == grad)
            grad = NULL;
        else
            low = NULL;
    } else {
        /* G.5: pad to S*W when T is not a multiple of W */
        if (padded_numel > h->numel) {
            status = fsdp_mem_alloc(fs->mem, padded_numel * esz, FSDP_MEM_COMM_BUFFER, r,
                                    &padded);
            if (status == FSDP_OK)
                status = fsdp_dev_memcpy_async(dev, padded, input, h->numel * esz, r);
            if (status == FSDP_OK)
                status = fsdp_k_fill(fs, r, (char *)padded + h->numel * esz, rd,
                                     padded_numel - h->numel, 0.0);
            input = padded;
        }
        if (status == FSDP_OK)
            status = fsdp_mem_alloc(fs->mem, h->shard_numel * esz, FSDP_MEM_GRADIENT, r,
                                    &reduced);
        if (status == FSDP_OK)
            status = fsdp_k_div(fs, r, input, rd, padded_numel, (float)pre);
        if (status != FSDP_OK)
            goto out;
        status = fsdp_dev_reduce_scatter(dev, h->unit->pg, input, reduced, h->shard_numel, rd,
                                         FSDP_REDUCE_SUM, r);
        if (status != FSDP_OK) {
            fsdp_fail_below(fs, status, "rank %d: unit '%s': gradient reduce-scatter failed: %s",
                            dev->rank, h->unit->name, fsdp_status_string(status));
            goto out;
        }
        if (h->unit->replicate != NULL) {
            /* hybrid: all-reduce the shard across replicas on the all-reduce stream */
            fsdp_stream_t *a = fs->all_reduce;
            status = fsdp_stream_wait_stream(dev, a, r);
            if (status == FSDP_OK)
                status = fsdp_mem_record_stream(fs->mem, reduced, a);
            if (status == FSDP_OK)
                status = fsdp_dev_all_reduce(dev, h->unit->replicate, reduced, reduced,
                                             h->shard_numel, rd, FSDP_REDUCE_SUM, a);
            if (status != FSDP_OK) {
                fsdp_fail_below(fs, status,
                                "rank %d: unit '%s': inter-node gradient all-reduce failed: %s",
                                dev->rank, h->unit->name, fsdp_status_string(status));
                goto out;
            }
            r = a;
        }
        status = fsdp_k_div(fs, r, reduced, rd, h->shard_numel, (float)post);
    }
    if (status == FSDP_OK)
        status = to_full_precision(fs, h, &reduced, h->shard_numel, r);
    if (status == FSDP_OK)
        status = accumulate_grad(fs, h, &reduced, r);
    if (status == FSDP_OK)
        status = offload_grad(fs, h, r);
    /* G.7: the gradient was produced on C and consumed on the post-backward stream */
    if (status == FSDP_OK && grad != NULL)
        status = fsdp_mem_record_stream(fs->mem, grad, fs->post_backward);
out:
    fsdp_mem_free(fs->mem, reduced);
    fsdp_mem_free(fs->mem, padded);
    fsdp_mem_free(fs->mem, low);
    fsdp_mem_free(fs->mem, grad);
    return status;
}

/* prepare_gradient_for_optim's keep_low_precision_grads cast (section 2 H.3): the f32 sharded
 * gradient becomes one in the compute dtype, on the compute stream the optimizer runs on. */
fsdp_status_t fsdp_handle_keep_low_precision_grad(fsdp_t *fs, fsdp_handle_t *h)
{
    fsdp_status_t status;

    if (!fs->cfg.mixed_precision.keep_low_precision_grads || h->offload ||
        h->compute_dtype == FSDP_DTYPE_F32 || h->saved_grad_shard == NULL)
        return FSDP_OK;
    status = fsdp_mem_alloc(fs->mem, h->shard_numel * fsdp_dtype_size(h->compute_dtype),
                            FSDP_MEM_GRADIENT, fs->compute, &h->low_grad);
    if (status == FSDP_OK)
        status = fsdp_k_cast(fs, fs->compute, h->low_grad, h->compute_dtype,
                             h->saved_grad_shard, FSDP_DTYPE_F32, h->shard_numel);
    if (status == FSDP_OK)
        status = fsdp_mem_record_stream(fs->mem, h->saved_grad_shard, fs->compute);
    fsdp_mem_free(fs->mem, h->saved_grad_shard);
    h->saved_grad_shard = NULL;
    return status;
}
