/* FSDP2's per-parameter groups (fully_shard's FSDPParamGroup), the second kind of handle: every
 * parameter sharded on dim 0 by itself, one all-gather per group through a copy-in and a
 * copy-out, one reduce-scatter from a padded, chunk-concatenated input, frees ordered by events
 * instead of record_stream (docs/runtime.md section 6). The hooks (hooks.c) call these where
 * they call the flat parameter's handle.c under FSDP1. */
#include "core/core_int.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

fsdp_status_t fsdp_pgroup_layout(fsdp_t *fs, fsdp_handle_t *h)
{
    size_t a = 0, held = 0;

    h->pp = calloc((size_t)h->nparams, sizeof(*h->pp));
    if (h->pp == NULL)
        return FSDP_ERR_NO_MEMORY;
    for (int i = 0; i < h->nparams; i++) {
        fsdp_param_info_t *pi = &h->params[i];
        fsdp_pparam_t *p = &h->pp[i];
        size_t own, pad;

        if (pi->ndim == 0) {
            free(h->pp);
            h->pp = NULL;
            return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                             "unit '%s': parameter '%s' is a scalar; fully_shard (api fsdp2) "
                             "shards every parameter on dim 0 and refuses scalars: give it "
                             "shape [1]",
                             h->unit->name, pi->name);
        }
        if (pi->tied_to >= 0) { /* stored once, at its target (an earlier index) */
            const fsdp_param_info_t *t = &h->params[pi->tied_to];
            *p = h->pp[pi->tied_to];
            pi->in_shard = t->in_shard;
            pi->offset_in_shard = t->offset_in_shard;
            pi->intra_start = t->intra_start;
            pi->numel_in_shard = t->numel_in_shard;
            continue;
        }
        p->rows = (size_t)pi->shape[0];
        p->rest = 1;
        for (int d = 1; d < pi->ndim; d++)
            p->rest *= (size_t)pi->shape[d];
        /* S = ceil(d0 / W); rank r owns rows [r S, min((r + 1) S, d0)): high ranks may own
         * none (torch.chunk's arithmetic, as a flat shard's; the classes of symmetric ranks
         * count on it, lib/core/symmetry.c) */
        fsdp_shard_extent(p->rows, h->world, h->rank, &own, &pad);
        p->chunk = (own + pad) * p->rest;
        p->slot = a;
        a += p->chunk;
        pi->in_shard = own > 0 && p->rest > 0;
        pi->offset_in_shard = p->slot;
        pi->intra_start = pi->in_shard ? (size_t)h->rank * p->chunk : 0;
        pi->numel_in_shard = pi->in_shard ? own * p->rest : 0;
        held += pi->numel_in_shard;
    }
    h->shard_numel = a;
    h->numel_in_shard = held;
    h->shard_pad = a - held;
    h->reshard_after_backward = 1;
    return FSDP_OK;
}

void fsdp_pgroup_free(fsdp_t *fs, fsdp_handle_t *h)
{
    if (h->pp == NULL)
        return;
    for (int i = 0; i < h->nparams; i++) {
        if (h->params[i].tied_to >= 0)
            continue;
        fsdp_mem_free(fs->mem, h->pp[i].unsharded);
        fsdp_mem_free(fs->mem, h->pp[i].grad);
        fsdp_mem_free(fs->mem, h->pp[i].accum);
        fsdp_mem_free(fs->mem, h->pp[i].post_forward);
    }
    fsdp_mem_free(fs->mem, h->ag_out);
    if (h->post_forward_event != NULL)
        fsdp_dev_event_destroy(fs->dev, h->post_forward_event);
    if (h->post_reduce_event != NULL)
        fsdp_dev_event_destroy(fs->dev, h->post_reduce_event);
    free(h->prefetch[0]);
    free(h->prefetch[1]);
    free(h->pp);
    h->pp = NULL;
}

/* Elements of a parameter's rows that fall in rank j's chunk (the rest of the chunk is pad). */
static size_t chunk_valid(const fsdp_pparam_t *p, size_t j)
{
    size_t numel = p->rows * p->rest, start = j * p->chunk;
    return numel > start ? (numel - start < p->chunk ? numel - start : p->chunk) : 0;
}

/* One chunk_copy launch on stream s: rows blocks of cols elements (kernel.h). */
static fsdp_status_t chunk_copy(fsdp_t *fs, fsdp_stream_t *s, void *dst, fsdp_dtype_t dt,
                                size_t dst_ld, const void *src, fsdp_dtype_t st, size_t src_ld,
                                size_t src_n, size_t rows, size_t cols)
{
    fsdp_kernel_t k = {.kind = FSDP_K_CHUNK_COPY};

    k.u.chunk_copy.dst = dst;
    k.u.chunk_copy.dst_dtype = dt;
    k.u.chunk_copy.dst_ld = dst_ld;
    k.u.chunk_copy.src = src;
    k.u.chunk_copy.src_dtype = st;
    k.u.chunk_copy.src_ld = src_ld;
    k.u.chunk_copy.src_n = src_n;
    k.u.chunk_copy.rows = rows;
    k.u.chunk_copy.cols = cols;
    return fsdp_dev_kernel(fs->dev, s, &k);
}

/* CPU offload: a device copy of the host shard (A f32), by a copy on stream s. */
static fsdp_status_t stage_shard(fsdp_t *fs, fsdp_handle_t *h, fsdp_stream_t *s, void **staged_p)
{
    size_t bytes = h->shard_numel * sizeof(float);
    fsdp_status_t status = fsdp_mem_alloc(fs->mem, bytes, FSDP_MEM_SHARDED_PARAM, s, staged_p);

    if (status == FSDP_OK)
        status = fsdp_dev_memcpy_async(fs->dev, *staged_p, h->local_shard, bytes, s);
    return status;
}

/* The all-gather input of this rank: its shard (cast to the compute dtype under mixed
 * precision, through a temporary of A elements), or under reshard_after_forward = N its
 * post-forward copies, each at its slot scaled by W / N. */
static fsdp_status_t copy_in(fsdp_t *fs, fsdp_handle_t *h, void *in, fsdp_stream_t *s)
{
    fsdp_dev_t *dev = fs->dev;
    fsdp_dtype_t c = h->compute_dtype;
    size_t a = h->shard_numel, esz = fsdp_dtype_size(c);
    void *tmp = NULL;
    fsdp_status_t status = FSDP_OK;

    if (h->ag_blocks < h->world) {
        size_t f = (size_t)(h->world / h->ag_blocks);
        status = fsdp_dev_stream_wait_event(dev, s, h->post_forward_event);
        for (int i = 0; i < h->nparams && status == FSDP_OK; i++) {
            const fsdp_pparam_t *p = &h->pp[i];
            if (h->params[i].tied_to < 0)
                status = fsdp_dev_memcpy_async(dev, (char *)in + f * p->slot * esz, p->post_forward,
                                               f * p->chunk * esz, s);
        }
        return status;
    }
    const void *src = h->local_shard;
    void *staged = NULL;
    if (h->offload) /* CPUOffloadPolicy: the host shard to the device first */
        status = stage_shard(fs, h, s, &staged);
    src = staged != NULL ? staged : src;
    if (status == FSDP_OK && c == FSDP_DTYPE_F32) {
        status = fsdp_dev_memcpy_async(dev, in, src, a * esz, s);
    } else if (status == FSDP_OK) {
        status = fsdp_mem_alloc(fs->mem, a * esz, FSDP_MEM_LOW_PREC_SHARD, s, &tmp);
        if (status == FSDP_OK)
            status = fsdp_k_cast(fs, s, tmp, c, src, FSDP_DTYPE_F32, a);
        if (status == FSDP_OK)
            status = fsdp_dev_memcpy_async(dev, in, tmp, a * esz, s);
        fsdp_mem_free(fs->mem, tmp);
    }
    fsdp_mem_free(fs->mem, staged);
    return status;
}

/* foreach_all_gather (semantics 1, "AG input"): O of W * A elements on the copy-in stream, this
 * rank's input into its block, then the in-place all-gather on the all-gather stream: over the
 * shard group, or over the group of N after a post-forward reshard to N (semantics 1, "int
 * reshard_after_forward"). A no-op when the group is unsharded or its all-gather is already
 * issued, and at W = 1, where the copy-out copies the shard itself. */
fsdp_status_t fsdp_pgroup_unshard(fsdp_t *fs, fsdp_handle_t *h, fsdp_stream_t *copy_in_s,
                                  fsdp_stream_t *gather)
{
    fsdp_dev_t *dev = fs->dev;
    fsdp_dtype_t c = h->compute_dtype;
    fsdp_group_t *g = h->unit->pg;
    size_t a = h->shard_numel, esz = fsdp_dtype_size(c), block;
    void *out = NULL, *in;
    fsdp_status_t status;

    if (h->uses_unsharded_view || h->ag_out != NULL || h->world == 1)
        return FSDP_OK;
    h->ag_blocks = h->world;
    if (h->post_forward_event != NULL) {
        g = h->unit->post_forward_pg;
        h->ag_blocks = g->size;
    }
    block = (size_t)(h->world / h->ag_blocks) * a;
    status =
        fsdp_mem_alloc(fs->mem, (size_t)h->world * a * esz, FSDP_MEM_COMM_BUFFER, copy_in_s, &out);
    if (status != FSDP_OK)
        return fsdp_fail_below(fs, status,
                               "rank %d: unit '%s': cannot allocate its all-gather output "
                               "(%zu elements)",
                               dev->rank, h->unit->name, (size_t)h->world * a);
    in = (char *)out + (size_t)g->rank * block * esz;
    status = copy_in(fs, h, in, copy_in_s);
    if (status == FSDP_OK && gather != copy_in_s)
        status = fsdp_stream_wait_stream(dev, gather, copy_in_s);
    if (status == FSDP_OK)
        status = fsdp_dev_all_gather(dev, g, in, out, block, c, gather);
    if (status != FSDP_OK) {
        fsdp_mem_free(fs->mem, out);
        return fsdp_fail_below(fs, status, "rank %d: unit '%s': all-gather failed: %s", dev->rank,
                               h->unit->name, fsdp_status_string(status));
    }
    h->ag_out = out;
    h->gather_version = fsdp_handle_new_version();
    return FSDP_OK;
}

/* The held forward all-gather output goes once both all-gather streams wait on its copy-out. */
fsdp_status_t fsdp_pgroup_release_ag_state(fsdp_t *fs)
{
    fsdp_dev_t *dev = fs->dev;
    fsdp_status_t status;

    if (fs->ag_state_buf == NULL)
        return FSDP_OK;
    status = fsdp_dev_stream_wait_event(dev, fs->pre_unshard, fs->ag_state_event);
    if (status == FSDP_OK)
        status = fsdp_dev_stream_wait_event(dev, fs->unshard, fs->ag_state_event);
    fsdp_dev_event_destroy(dev, fs->ag_state_event);
    fsdp_mem_free(fs->mem, fs->ag_state_buf);
    fs->ag_state_buf = NULL;
    fs->ag_state_event = NULL;
    return status;
}

/* One parameter's copy-out on the compute stream: U, then rank j's chunk from block j of O. */
static fsdp_status_t copy_out_param(fsdp_t *fs, fsdp_handle_t *h, fsdp_pparam_t *p)
{
    fsdp_stream_t *cs = fs->compute;
    fsdp_dtype_t c = h->compute_dtype;
    size_t esz = fsdp_dtype_size(c), w = (size_t)h->world, f;
    fsdp_status_t status;

    status =
        fsdp_mem_alloc(fs->mem, w * p->chunk * esz, FSDP_MEM_UNSHARDED_PARAM, cs, &p->unsharded);
    if (status != FSDP_OK)
        return fsdp_fail_below(fs, status,
                               "rank %d: unit '%s': cannot allocate an unsharded "
                               "parameter (%zu elements)",
                               fs->dev->rank, h->unit->name, w * p->chunk);
    if (h->ag_out == NULL) { /* W = 1: the shard is the whole parameter */
        void *staged = NULL;
        if (h->offload)
            status = stage_shard(fs, h, cs, &staged);
        if (status == FSDP_OK)
            status = chunk_copy(fs, cs, p->unsharded, c, p->chunk,
                                (staged != NULL ? (float *)staged : h->local_shard) + p->slot,
                                FSDP_DTYPE_F32, p->chunk, p->chunk, 1, p->chunk);
        fsdp_mem_free(fs->mem, staged);
        return status;
    }
    /* split_with_sizes_copy: O as (blocks, W / blocks * A), this parameter's columns */
    f = w / (size_t)h->ag_blocks;
    return chunk_copy(fs, cs, p->unsharded, c, f * p->chunk, (char *)h->ag_out + f * p->slot * esz,
                      c, f * h->shard_numel, SIZE_MAX, (size_t)h->ag_blocks, f * p->chunk);
}

/* wait_for_unshard: the compute stream waits for the all-gather, copies out into each
 * parameter's unsharded buffer, and records the copy-out. A forward keeps O until the next
 * group's copy-out (retain), so that copy-out overlaps this all-gather's successor; otherwise
 * the all-gather streams wait on the copy-out and O goes at once. */
fsdp_status_t fsdp_pgroup_wait_for_unshard(fsdp_t *fs, fsdp_handle_t *h, int retain)
{
    fsdp_dev_t *dev = fs->dev;
    fsdp_event_t *ev = NULL;
    fsdp_status_t status = FSDP_OK;

    if (h->uses_unsharded_view)
        return FSDP_OK; /* kept since forward (or backward) */
    if (h->ag_out != NULL) {
        status = fsdp_pgroup_release_ag_state(fs);
        if (status == FSDP_OK)
            status = fsdp_stream_wait_stream(dev, fs->compute, fs->unshard);
    }
    for (int i = 0; i < h->nparams && status == FSDP_OK; i++) {
        if (h->params[i].tied_to < 0)
            status = copy_out_param(fs, h, &h->pp[i]);
    }
    for (int i = 0; i < h->nparams; i++) {
        if (h->params[i].tied_to >= 0)
            h->pp[i].unsharded = h->pp[h->params[i].tied_to].unsharded;
    }
    if (status != FSDP_OK)
        return status;
    h->uses_unsharded_view = 1;
    if (h->post_forward_event != NULL && h->ag_out != NULL) {
        /* the post-forward copies were gathered: the compute stream, which waited on the
         * all-gather, is past their copy-in */
        for (int i = 0; i < h->nparams; i++) {
            if (h->params[i].tied_to < 0)
                fsdp_mem_free(fs->mem, h->pp[i].post_forward);
            h->pp[i].post_forward = NULL;
        }
        fsdp_dev_event_destroy(dev, h->post_forward_event);
        h->post_forward_event = NULL;
    }
    if (h->ag_out == NULL) {
        h->gather_version = fsdp_handle_new_version();
        return FSDP_OK;
    }
    status = fsdp_dev_event_create(dev, &ev);
    if (status == FSDP_OK)
        status = fsdp_dev_event_record(dev, ev, fs->compute);
    if (status == FSDP_OK && retain) {
        fs->ag_state_buf = h->ag_out;
        fs->ag_state_event = ev;
        h->ag_out = NULL;
        return FSDP_OK;
    }
    if (status == FSDP_OK)
        status = fsdp_dev_stream_wait_event(dev, fs->pre_unshard, ev);
    if (status == FSDP_OK)
        status = fsdp_dev_stream_wait_event(dev, fs->unshard, ev);
    if (ev != NULL)
        fsdp_dev_event_destroy(dev, ev);
    fsdp_mem_free(fs->mem, h->ag_out);
    h->ag_out = NULL;
    return status;
}

/* to_sharded: the unsharded buffers go. They were allocated and read on the compute stream,
 * so no stream needs to be recorded. */
fsdp_status_t fsdp_pgroup_reshard(fsdp_t *fs, fsdp_handle_t *h)
{
    for (int i = 0; i < h->nparams; i++) {
        if (h->params[i].tied_to < 0)
            fsdp_mem_free(fs->mem, h->pp[i].unsharded);
        h->pp[i].unsharded = NULL;
    }
    h->uses_unsharded_view = 0;
    h->prefetched = 0;
    return FSDP_OK;
}

/* reshard_after_forward = N (semantics 1): each parameter keeps the N-th part of U that is
 * this rank's place in its group of N, copied on the compute stream, and U goes; an event
 * orders the backward's copy-in after the copies. */
static fsdp_status_t reshard_to_group(fsdp_t *fs, fsdp_handle_t *h)
{
    fsdp_dev_t *dev = fs->dev;
    size_t esz = fsdp_dtype_size(h->compute_dtype);
    size_t f = (size_t)(h->world / h->unit->post_forward_pg->size);
    size_t j = (size_t)h->unit->post_forward_pg->rank;
    fsdp_status_t status = FSDP_OK;

    for (int i = 0; i < h->nparams && status == FSDP_OK; i++) {
        fsdp_pparam_t *p = &h->pp[i];
        if (h->params[i].tied_to >= 0 || p->unsharded == NULL)
            continue;
        status = fsdp_mem_alloc(fs->mem, f * p->chunk * esz, FSDP_MEM_UNSHARDED_PARAM, fs->compute,
                                &p->post_forward);
        if (status == FSDP_OK)
            status = fsdp_dev_memcpy_async(dev, p->post_forward,
                                           (char *)p->unsharded + j * f * p->chunk * esz,
                                           f * p->chunk * esz, fs->compute);
    }
    if (status == FSDP_OK && h->post_forward_event == NULL)
        status = fsdp_dev_event_create(dev, &h->post_forward_event);
    if (status == FSDP_OK)
        status = fsdp_dev_event_record(dev, h->post_forward_event, fs->compute);
    if (status != FSDP_OK)
        return status;
    return fsdp_pgroup_reshard(fs, h);
}

/* FSDPParamGroup.post_forward's reshard: free U (1), keep it (0), or reshard to N. */
fsdp_status_t fsdp_pgroup_post_forward(fsdp_t *fs, fsdp_handle_t *h)
{
    if (h->unit->reshard_after_forward == 0)
        return FSDP_OK;
    if (h->unit->reshard_after_forward == 1 || h->world == 1 || !h->uses_unsharded_view)
        return fsdp_pgroup_reshard(fs, h);
    return reshard_to_group(fs, h);
}

int fsdp_pgroup_has_grads(const fsdp_handle_t *h)
{
    for (int i = 0; i < h->nparams; i++) {
        if (h->pp[i].grad != NULL || h->pp[i].accum != NULL)
            return 1;
    }
    return 0;
}

fsdp_status_t fsdp_pgroup_grad(fsdp_t *fs, fsdp_handle_t *h, int index, void **grad_p)
{
    int t = h->params[index].tied_to >= 0 ? h->params[index].tied_to : index;
    fsdp_pparam_t *p = &h->pp[t];
    size_t numel;
    fsdp_status_t status;

    numel = h->params[t].numel;
    if (p->grad == NULL) {
        /* autograd's AccumulateGrad: one gradient per parameter, on the compute stream */
        status = fsdp_mem_alloc(fs->mem, numel * fsdp_dtype_size(h->compute_dtype),
                                FSDP_MEM_GRADIENT, fs->compute, &p->grad);
        if (status == FSDP_OK)
            status = fsdp_k_fill(fs, fs->compute, p->grad, h->compute_dtype, numel, 0.0);
        if (status != FSDP_OK)
            return fsdp_fail_below(fs, status,
                                   "rank %d: unit '%s': cannot allocate the gradient of "
                                   "'%s'",
                                   fs->dev->rank, h->unit->name, h->params[t].name);
    }
    *grad_p = p->grad;
    return FSDP_OK;
}

/* y (f32) += x (f32 or 16-bit), computed in f32, on stream s. */
static fsdp_status_t add_into(fsdp_t *fs, fsdp_stream_t *s, float *y, const void *x,
                              fsdp_dtype_t xt, size_t n)
{
    fsdp_kernel_t k = {.kind = FSDP_K_AXPY};

    k.u.axpy.y = y;
    k.u.axpy.y_dtype = FSDP_DTYPE_F32;
    k.u.axpy.x = x;
    k.u.axpy.x_dtype = xt;
    k.u.axpy.n = n;
    k.u.axpy.alpha = 1.0f;
    return fsdp_dev_kernel(fs->dev, s, &k);
}

/* Sync off under mixed precision (semantics 4): each gradient joins an f32 accumulation at the
 * post-backward, so that micro-batches sum in the gradients' own dtype. In f32 the gradient
 * itself stays and autograd accumulates into it. */
static fsdp_status_t accumulate_unsharded(fsdp_t *fs, fsdp_handle_t *h)
{
    fsdp_status_t status = FSDP_OK;

    if (h->compute_dtype == FSDP_DTYPE_F32)
        return FSDP_OK;
    for (int i = 0; i < h->nparams && status == FSDP_OK; i++) {
        fsdp_pparam_t *p = &h->pp[i];
        size_t numel = h->params[i].numel;
        if (h->params[i].tied_to >= 0 || p->grad == NULL)
            continue;
        if (p->accum == NULL) {
            status = fsdp_mem_alloc(fs->mem, numel * sizeof(float), FSDP_MEM_GRADIENT, fs->compute,
                                    (void **)&p->accum);
            if (status == FSDP_OK)
                status = fsdp_k_cast(fs, fs->compute, p->accum, FSDP_DTYPE_F32, p->grad,
                                     h->compute_dtype, numel);
        } else {
            status = add_into(fs, fs->compute, p->accum, p->grad, h->compute_dtype, numel);
        }
        fsdp_mem_free(fs->mem, p->grad);
        p->grad = NULL;
    }
    return status;
}

/* The reduce's layout (semantics 1, "RS input/output"): only the parameters with a gradient
 * take part, their chunks concatenated in parameter order; R elements a rank (A when every
 * parameter has one). */
static size_t reduce_layout(fsdp_handle_t *h)
{
    size_t r = 0;

    for (int i = 0; i < h->nparams; i++) {
        fsdp_pparam_t *p = &h->pp[i];
        p->reduced = h->params[i].tied_to < 0 && (p->grad != NULL || p->accum != NULL);
        p->gslot = r;
        r += p->reduced ? p->chunk : 0;
    }
    h->reduced_numel = r;
    return r;
}

/* foreach_reduce_scatter_copy_in (torch's chunk_cat): row j of I (W x R, reduce dtype) is the
 * concatenation over the reduced parameters of rank j's chunk of each gradient, zero-padded,
 * cast in the same pass. */
static fsdp_status_t chunk_cat(fsdp_t *fs, fsdp_handle_t *h, void *in)
{
    fsdp_stream_t *cs = fs->compute;
    fsdp_dtype_t rd = h->reduce_dtype;
    size_t esz = fsdp_dtype_size(rd), r = h->reduced_numel, w = (size_t)h->world;
    fsdp_status_t status = FSDP_OK;

    for (int i = 0; i < h->nparams && status == FSDP_OK; i++) {
        fsdp_pparam_t *p = &h->pp[i];
        void *src = p->accum != NULL ? (void *)p->accum : p->grad;
        fsdp_dtype_t st = p->accum != NULL ? FSDP_DTYPE_F32 : h->compute_dtype;
        if (!p->reduced)
            continue;
        if (p->accum != NULL && p->grad != NULL) /* the last micro-batch joins the sum */
            status = add_into(fs, cs, p->accum, p->grad, h->compute_dtype, h->params[i].numel);
        /* a partial sum per tp rank to its parameter's placement, Replicate: FSDPParam's
         * _get_grad_inner_tensor redistributes it (an all-reduce over tp) in post_backward,
         * on the current stream, before foreach_reduce */
        if (status == FSDP_OK && p->tp_partial)
            status = fsdp_dev_all_reduce(fs->dev, fs->tp, src, src, h->params[i].numel, st,
                                         FSDP_REDUCE_SUM, cs);
        /* rank j's chunk of the gradient to row j; past its end zeros */
        if (status == FSDP_OK)
            status = chunk_copy(fs, cs, (char *)in + p->gslot * esz, rd, r, src, st, p->chunk,
                                h->params[i].numel, w, p->chunk);
    }
    return status;
}

/* The reduce op and the factors a gradient is divided by before and after, over d ranks (W x R)
 * of a shard group of w (semantics 1, "Reduce dtype, op, divide factors"). f32 and bf16: AVG
 * (SUM on one rank); with a divide factor f, AVG when f = w, else a SUM of the inputs
 * multiplied by 1 / f first (*premul_p: NCCL's PREMUL_SUM) and a SUM all-reduce (*ar_op_p);
 * forced sums divide by f or d after. Other dtypes: SUM with FSDP1's pre- and post-divide
 * factors of f or d. */
static fsdp_reduce_op_t reduce_op(const fsdp_handle_t *h, int w, int d, double *pre_p,
                                  double *post_p, double *premul_p, fsdp_reduce_op_t *ar_op_p)
{
    fsdp_dtype_t rd = h->reduce_dtype;
    double f = h->unit->divide_factor > 0.0 ? h->unit->divide_factor : (double)d;

    *pre_p = *post_p = *premul_p = 1.0;
    *ar_op_p = FSDP_REDUCE_SUM;
    if (h->unit->force_sum) { /* SUM collectives, the whole division after */
        *post_p = f;
        return FSDP_REDUCE_SUM;
    }
    if (rd != FSDP_DTYPE_F32 && rd != FSDP_DTYPE_BF16) {
        fsdp_divide_factors((int)f, pre_p, post_p);
        if ((double)(int)f != f) { /* a factor that is not whole: all of it after */
            *pre_p = 1.0;
            *post_p = f;
        }
        return FSDP_REDUCE_SUM;
    }
    if (h->unit->divide_factor > 0.0) {
        if (h->unit->divide_factor == (double)w)
            return FSDP_REDUCE_AVG;
        *premul_p = 1.0 / h->unit->divide_factor;
        return FSDP_REDUCE_SUM;
    }
    *ar_op_p = FSDP_REDUCE_AVG;
    return d == 1 ? FSDP_REDUCE_SUM : FSDP_REDUCE_AVG;
}

/* The reduce-scatter stream's part of foreach_reduce: out, pre-divide, the reduce-scatter (a
 * copy at W = 1), its event; then the HSDP all-reduce on the all-reduce stream. *post_p is the
 * stream the reduced gradient is finished on. */
static fsdp_status_t reduce_scatter(fsdp_t *fs, fsdp_handle_t *h, void *in, void **out_p,
                                    fsdp_event_t **rs_event_p, fsdp_stream_t **post_p,
                                    double *post_div_p)
{
    fsdp_dev_t *dev = fs->dev;
    fsdp_unit_t *u = h->unit;
    fsdp_stream_t *r = fs->post_backward;
    fsdp_dtype_t rd = h->reduce_dtype;
    size_t n = h->reduced_numel, esz = fsdp_dtype_size(rd), all = (size_t)h->world * n;
    int d = u->pg->size * (u->replicate ? u->replicate->size : 1);
    double pre, premul;
    fsdp_reduce_op_t ar_op, op = reduce_op(h, u->pg->size, d, &pre, post_div_p, &premul, &ar_op);
    fsdp_status_t status;

    status = fsdp_stream_wait_stream(dev, r, fs->compute);
    if (status == FSDP_OK)
        status = fsdp_mem_alloc(fs->mem, n * esz, FSDP_MEM_GRADIENT, r, out_p);
    if (status == FSDP_OK && pre > 1.0)
        status = fsdp_k_div(fs, r, in, rd, all, (float)pre);
    if (status == FSDP_OK && premul != 1.0) { /* PREMUL_SUM's multiply, before the sum */
        fsdp_kernel_t k = {.kind = FSDP_K_SCALE};
        k.u.scale.x = in;
        k.u.scale.dtype = rd;
        k.u.scale.n = all;
        k.u.scale.alpha = (float)premul;
        status = fsdp_dev_kernel(dev, r, &k);
    }
    if (status != FSDP_OK)
        return status;
    if (h->world > 1)
        status = fsdp_dev_reduce_scatter(dev, u->pg, in, *out_p, n, rd, op, r);
    else /* one rank: the reduce-scatter is a copy */
        status = fsdp_dev_memcpy_async(dev, *out_p, in, n * esz, r);
    if (status != FSDP_OK)
        return fsdp_fail_below(fs, status, "rank %d: unit '%s': gradient reduce-scatter failed: %s",
                               dev->rank, u->name, fsdp_status_string(status));
    status = fsdp_dev_event_create(dev, rs_event_p);
    if (status == FSDP_OK)
        status = fsdp_dev_event_record(dev, *rs_event_p, r);
    *post_p = r;
    if (status != FSDP_OK || u->replicate == NULL)
        return status;
    /* HSDP: the all-reduce stream waits on the reduce-scatter, then reduces over replicas */
    status = fsdp_stream_wait_stream(dev, fs->all_reduce, r);
    if (status == FSDP_OK)
        status = fsdp_mem_record_stream(fs->mem, *out_p, fs->all_reduce);
    if (status == FSDP_OK)
        status = fsdp_dev_all_reduce(
            dev, u->replicate, *out_p, *out_p, n, rd,
            u->replicate->size > 1 && op != FSDP_REDUCE_SUM ? ar_op : FSDP_REDUCE_SUM,
            fs->all_reduce);
    if (status != FSDP_OK)
        return fsdp_fail_below(fs, status, "rank %d: unit '%s': replicate all-reduce failed: %s",
                               dev->rank, u->name, fsdp_status_string(status));
    *post_p = fs->all_reduce;
    return FSDP_OK;
}

/* CPUOffloadPolicy: the reduced gradient goes to pinned host memory, where the host optimizer
 * reads it after the final callback's wait; the device copy goes once the copy is enqueued (the
 * stream that allocated it runs the copy). */
static fsdp_status_t offload_grad(fsdp_t *fs, fsdp_handle_t *h, void *grad, fsdp_stream_t *s)
{
    size_t a = h->shard_numel;
    fsdp_status_t status = FSDP_OK;

    if (h->has_cpu_grad)
        status = fsdp_fail(fs, FSDP_ERR_UNSUPPORTED,
                           "rank %d: unit '%s': accumulating gradients across iterations without "
                           "set_requires_gradient_sync(False) is not supported with CPU offload; "
                           "turn gradient sync off for the accumulation steps",
                           fs->dev->rank, h->unit->name);
    if (status == FSDP_OK && h->cpu_grad == NULL)
        status = fsdp_shard_alloc(fs, h, a, (void **)&h->cpu_grad);
    if (status == FSDP_OK)
        status = fsdp_dev_memcpy_async(fs->dev, h->cpu_grad, grad, a * sizeof(float), s);
    if (status == FSDP_OK && s != fs->post_backward)
        status = fsdp_mem_record_stream(fs->mem, grad, s);
    fsdp_mem_free(fs->mem, grad);
    h->has_cpu_grad = status == FSDP_OK;
    return status;
}

/* On the post-reduce stream: post-divide, the f32 sharded gradient (a cast when reduced in
 * 16 bits), += into an existing one, and the post-reduce event. */
static fsdp_status_t post_reduce(fsdp_t *fs, fsdp_handle_t *h, void *out, fsdp_stream_t *s,
                                 double post)
{
    fsdp_dev_t *dev = fs->dev;
    fsdp_dtype_t rd = h->reduce_dtype;
    size_t a = h->shard_numel, n = h->reduced_numel;
    void *grad = out;
    fsdp_status_t status = FSDP_OK;

    if (post != 1.0)
        status = fsdp_k_div(fs, s, out, rd, n, (float)post);
    if (status == FSDP_OK && (rd != FSDP_DTYPE_F32 || n != a)) {
        /* to f32, and to the shard's layout when some parameter had no gradient (zeros
         * there: frozen parameters, which the optimizer skips) */
        grad = NULL;
        status = fsdp_mem_alloc(fs->mem, a * sizeof(float), FSDP_MEM_GRADIENT, s, &grad);
        if (status == FSDP_OK && n == a) /* one run of one dtype: one cast */
            status = fsdp_k_cast(fs, s, grad, FSDP_DTYPE_F32, out, rd, a);
        else if (status == FSDP_OK)
            status = fsdp_k_fill(fs, s, grad, FSDP_DTYPE_F32, a, 0.0);
        for (int i = 0; i < h->nparams && status == FSDP_OK && n != a; i++) {
            const fsdp_pparam_t *p = &h->pp[i];
            if (p->reduced)
                status = chunk_copy(fs, s, (float *)grad + p->slot, FSDP_DTYPE_F32, p->chunk,
                                    (const char *)out + p->gslot * fsdp_dtype_size(rd), rd,
                                    p->chunk, p->chunk, 1, p->chunk);
        }
        if (status == FSDP_OK && s != fs->post_backward)
            status = fsdp_mem_record_stream(fs->mem, out, s);
        fsdp_mem_free(fs->mem, out);
    }
    if (status == FSDP_OK && h->offload) {
        status = offload_grad(fs, h, grad, s);
    } else if (status == FSDP_OK && h->saved_grad_shard != NULL) {
        status = add_into(fs, s, h->saved_grad_shard, grad, FSDP_DTYPE_F32, a);
        if (status == FSDP_OK && s != fs->post_backward)
            status = fsdp_mem_record_stream(fs->mem, grad, s);
        fsdp_mem_free(fs->mem, grad);
    } else if (status == FSDP_OK) {
        h->saved_grad_shard = grad;
    } else {
        fsdp_mem_free(fs->mem, grad);
    }
    if (status == FSDP_OK && h->post_reduce_event == NULL)
        status = fsdp_dev_event_create(dev, &h->post_reduce_event);
    if (status == FSDP_OK)
        status = fsdp_dev_event_record(dev, h->post_reduce_event, s);
    return status;
}

/* The oldest retained reduce-scatter input goes once the compute stream waits on its
 * reduce-scatter (K = 1 retained: set_reduce_scatter_max_input_buffers' default). */
static fsdp_status_t release_rs_state(fsdp_t *fs)
{
    fsdp_dev_t *dev = fs->dev;
    fsdp_status_t status;

    if (fs->rs_state_buf == NULL)
        return FSDP_OK;
    status = fsdp_dev_stream_wait_event(dev, fs->compute, fs->rs_state_event);
    fsdp_dev_event_destroy(dev, fs->rs_state_event);
    fsdp_mem_free(fs->mem, fs->rs_state_buf);
    fs->rs_state_buf = NULL;
    fs->rs_state_event = NULL;
    return status;
}

static fsdp_status_t wait_post_reduce(fsdp_t *fs, fsdp_handle_t *h)
{
    fsdp_status_t status;

    if (h->post_reduce_event == NULL)
        return FSDP_OK;
    status = fsdp_dev_stream_wait_event(fs->dev, fs->compute, h->post_reduce_event);
    fsdp_dev_event_destroy(fs->dev, h->post_reduce_event);
    h->post_reduce_event = NULL;
    return status;
}

/* FSDPParamGroup.post_backward (semantics 2 E). */
fsdp_status_t fsdp_pgroup_post_backward(fsdp_t *fs, fsdp_handle_t *h)
{
    size_t esz = fsdp_dtype_size(h->reduce_dtype);
    void *in = NULL, *out = NULL;
    fsdp_event_t *rs_event = NULL;
    fsdp_stream_t *post = NULL;
    double post_div = 1.0;
    int has_grads = fsdp_pgroup_has_grads(h);
    fsdp_status_t status = FSDP_OK;

    if (!fs->sync_gradients) { /* E.1 */
        status = accumulate_unsharded(fs, h);
        h->grads_pending |= has_grads;
        if (status == FSDP_OK && h->reshard_after_backward)
            status = fsdp_pgroup_reshard(fs, h);
        return status;
    }
    if (h->reshard_after_backward)
        status = fsdp_pgroup_reshard(fs, h);
    if (status == FSDP_OK)
        status = release_rs_state(fs);
    if (status != FSDP_OK || !has_grads)
        return status;
    status = wait_post_reduce(fs, h);
    if (status == FSDP_OK)
        status = fsdp_mem_alloc(fs->mem, (size_t)h->world * reduce_layout(h) * esz,
                                FSDP_MEM_COMM_BUFFER, fs->compute, &in);
    if (status == FSDP_OK)
        status = chunk_cat(fs, h, in);
    for (int i = 0; i < h->nparams; i++) { /* the unsharded gradients are dropped */
        if (h->params[i].tied_to < 0) {
            fsdp_mem_free(fs->mem, h->pp[i].grad);
            fsdp_mem_free(fs->mem, h->pp[i].accum);
        }
        h->pp[i].grad = NULL;
        h->pp[i].accum = NULL;
    }
    h->grads_pending = 0;
    if (status == FSDP_OK)
        status = reduce_scatter(fs, h, in, &out, &rs_event, &post, &post_div);
    if (status == FSDP_OK) {
        status = post_reduce(fs, h, out, post, post_div);
        out = NULL;
    }
    fsdp_mem_free(fs->mem, out);
    if (status != FSDP_OK) {
        if (rs_event != NULL)
            fsdp_dev_event_destroy(fs->dev, rs_event);
        fsdp_mem_free(fs->mem, in);
        return status;
    }
    /* the input stays until the next group's reduce, or the final callback */
    fs->rs_state_buf = in;
    fs->rs_state_event = rs_event;
    return FSDP_OK;
}

/* The root's final callback after every post-backward (semantics 2 F.2): the compute stream
 * waits on each group's post-reduce event, the held all-gather output and reduce-scatter input
 * go. */
fsdp_status_t fsdp_pgroup_finalize(fsdp_t *fs)
{
    fsdp_status_t status = FSDP_OK;

    for (int i = 0; i < fs->nunits && status == FSDP_OK; i++) {
        if (fs->units[i]->handle != NULL)
            status = wait_post_reduce(fs, fs->units[i]->handle);
    }
    if (status == FSDP_OK && fs->cfg.cpu_offload && fs->sync_gradients) {
        /* the host optimizer reads the offloaded gradients: the host waits for their copies */
        status = fsdp_dev_stream_synchronize(fs->dev, fs->post_backward);
        if (status == FSDP_OK && fs->all_reduce != fs->compute)
            status = fsdp_dev_stream_synchronize(fs->dev, fs->all_reduce);
    }
    if (status == FSDP_OK)
        status = fsdp_pgroup_release_ag_state(fs);
    if (status == FSDP_OK)
        status = release_rs_state(fs);
    return status;
}

/* All-gathers the A-element shards of the group (f32) and lays each parameter's rows out whole,
 * unpadded, at its offset in host_out (T values). A collective over the shard group. */
fsdp_status_t fsdp_pgroup_gather(fsdp_t *fs, fsdp_handle_t *h, const float *shard, float *host_out)
{
    fsdp_dev_t *dev = fs->dev;
    size_t a = h->shard_numel, w = (size_t)h->world;
    void *full = NULL, *staged = NULL;
    float *host = malloc(w * a * sizeof(float) + 1);
    fsdp_status_t status;

    if (host == NULL)
        return FSDP_ERR_NO_MEMORY;
    status = fsdp_mem_alloc(fs->mem, w * a * sizeof(float), FSDP_MEM_TEMPORARY, fs->compute, &full);
    if (status == FSDP_OK && h->offload) { /* collectives read device memory */
        status =
            fsdp_mem_alloc(fs->mem, a * sizeof(float), FSDP_MEM_TEMPORARY, fs->compute, &staged);
        if (status == FSDP_OK)
            status = fsdp_dev_memcpy_async(dev, staged, shard, a * sizeof(float), fs->compute);
        shard = staged;
    }
    if (status == FSDP_OK && w > 1)
        status = fsdp_dev_all_gather(dev, h->unit->pg, shard, full, a, FSDP_DTYPE_F32, fs->compute);
    else if (status == FSDP_OK)
        status = fsdp_dev_memcpy_async(dev, full, shard, a * sizeof(float), fs->compute);
    if (status == FSDP_OK)
        status = fsdp_dev_memcpy_async(dev, host, full, w * a * sizeof(float), fs->compute);
    if (status == FSDP_OK)
        status = fsdp_dev_stream_synchronize(dev, fs->compute);
    for (int i = 0; i < h->nparams && status == FSDP_OK && !dev->no_data; i++) {
        const fsdp_pparam_t *p = &h->pp[i];
        if (h->params[i].tied_to >= 0)
            continue;
        for (size_t j = 0; j < w; j++)
            memcpy(host_out + h->params[i].offset + j * p->chunk, host + j * a + p->slot,
                   chunk_valid(p, j) * sizeof(float));
    }
    fsdp_mem_free(fs->mem, staged);
    fsdp_mem_free(fs->mem, full);
    free(host);
    return status;
}
