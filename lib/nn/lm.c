/* One forward and backward of a language model (GPT-2, Llama) on one rank (lm_int.h): the batch's
 * checks and its token ids on the device, the FSDP hooks around the root and every layer, the
 * loss and the order in which the buffers of the step are allocated and freed. The kernels are
 * the model's (fsdp_lm_ops_t); this order is what both models share, and what their traces and
 * memory peaks show. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include <fsdp/log.h>

#include "nn/lm_int.h"

fsdp_status_t fsdp_lm_check_batch(const fsdp_lm_t *lm, int max_seq, const char *seq_what, int vocab,
                                  double per_token, const int32_t *inputs, const int32_t *targets,
                                  size_t batch, size_t seq, size_t *count_p)
{
    size_t count = 0, n;

    if (batch == 0 || seq == 0 || seq > (size_t)max_seq) {
        fsdp_error("%s: a batch needs at least one row and 1 to %d tokens per row (the "
                   "model's %s), not %zu x %zu",
                   lm->family->name, max_seq, seq_what, batch, seq);
        return FSDP_ERR_INVALID_PARAM;
    }
    if ((double)batch * (double)seq * per_token * 4.0 > 0x1p60) {
        fsdp_error("%s: a batch of %zu x %zu is too large", lm->family->name, batch, seq);
        return FSDP_ERR_INVALID_PARAM;
    }
    n = batch * seq;
    if (inputs == NULL || targets == NULL) {
        if (!fsdp_device(lm->fs)->no_data) {
            fsdp_error("%s: inputs and targets are NULL (allowed in shape mode only)",
                       lm->family->name);
            return FSDP_ERR_INVALID_PARAM;
        }
        *count_p = n;
        return FSDP_OK;
    }
    for (size_t i = 0; i < n; i++) {
        if (inputs[i] < 0 || inputs[i] >= vocab) {
            fsdp_error("%s: input token %d at row %zu position %zu is outside the vocabulary "
                       "[0, %d)",
                       lm->family->name, (int)inputs[i], i / seq, i % seq, vocab);
            return FSDP_ERR_INVALID_PARAM;
        }
        if (targets[i] >= vocab) {
            fsdp_error("%s: target token %d at row %zu position %zu is outside the vocabulary "
                       "[0, %d) (negative targets are ignored)",
                       lm->family->name, (int)targets[i], i / seq, i % seq, vocab);
            return FSDP_ERR_INVALID_PARAM;
        }
        count += targets[i] >= 0;
    }
    if (count == 0) {
        fsdp_error("%s: every target of the batch is ignored: no loss to compute",
                   lm->family->name);
        return FSDP_ERR_INVALID_PARAM;
    }
    *count_p = count;
    return FSDP_OK;
}

fsdp_status_t fsdp_lm_run_init(fsdp_lm_run_t *r, fsdp_lm_t *lm, size_t batch, size_t seq,
                               size_t width, size_t vocab)
{
    memset(r, 0, sizeof(*r));
    r->lm = lm;
    r->dev = fsdp_device(lm->fs);
    r->s = fsdp_compute_stream(lm->fs);
    r->mem = fsdp_memory(lm->fs);
    r->B = batch;
    r->T = seq;
    r->BT = batch * seq;
    r->width = width;
    r->V = vocab;
    r->dt = fsdp_unit_compute_dtype(lm->root);
    r->es = fsdp_dtype_size(r->dt);
    for (int l = 0; l < lm->n_layer; l++) {
        if (fsdp_unit_compute_dtype(lm->layers[l]) != r->dt) {
            fsdp_error("%s: %s %d computes in %s, the root in %s; the model needs one compute "
                       "dtype",
                       lm->family->name, lm->family->layer, l,
                       fsdp_dtype_name(fsdp_unit_compute_dtype(lm->layers[l])),
                       fsdp_dtype_name(r->dt));
            return FSDP_ERR_INVALID_PARAM;
        }
    }
    return fsdp_lm_tp_init(r);
}

/* The batch on the device: n token ids and n target ids, copied from the host into ACTIVATION
 * blocks (freed at the end of the step). */
static fsdp_status_t batch_to_device(fsdp_lm_run_t *r, const int32_t *inputs,
                                     const int32_t *targets)
{
    const size_t bytes = r->BT * sizeof(int32_t);
    fsdp_status_t status;

    status = fsdp_mem_alloc(r->mem, bytes, FSDP_MEM_ACTIVATION, r->s, (void **)&r->tokens);
    if (status == FSDP_OK)
        status = fsdp_mem_alloc(r->mem, bytes, FSDP_MEM_ACTIVATION, r->s, (void **)&r->targets);
    if (status == FSDP_OK)
        status = fsdp_dev_memcpy_async(r->dev, r->tokens, inputs, bytes, r->s);
    if (status == FSDP_OK)
        status = fsdp_dev_memcpy_async(r->dev, r->targets, targets, bytes, r->s);
    if (status == FSDP_OK && r->tp > 1)
        status = fsdp_mem_alloc(r->mem, bytes, FSDP_MEM_ACTIVATION, r->s, (void **)&r->ltokens);
    if (status == FSDP_OK && r->tp > 1 && inputs != NULL) {
        /* the vocabulary-parallel embedding's ids: rows of this rank's slice, -1 outside */
        int32_t *host = malloc(bytes);
        if (host == NULL)
            return FSDP_ERR_NO_MEMORY;
        for (size_t i = 0; i < r->BT; i++)
            host[i] = (size_t)inputs[i] >= r->v0 && (size_t)inputs[i] < r->v0 + r->vl
                          ? (int32_t)((size_t)inputs[i] - r->v0)
                          : -1;
        status = fsdp_dev_memcpy_async(r->dev, r->ltokens, host, bytes, r->s);
        if (status == FSDP_OK)
            status = fsdp_dev_stream_synchronize(r->dev, r->s);
        free(host);
    }
    return status;
}

/* The forward up to the logits, inside the root's forward hooks. */
static fsdp_status_t forward(fsdp_lm_run_t *r, const fsdp_lm_ops_t *ops)
{
    fsdp_lm_t *lm = r->lm;
    const int L = lm->n_layer;
    fsdp_status_t status = fsdp_pre_forward(lm->root);

    if (status == FSDP_OK)
        status = fsdp_lm_alloc(r, r->rows * r->width, FSDP_MEM_ACTIVATION, &r->resid[0]);
    if (status == FSDP_OK)
        status = ops->embed_fwd(r);
    for (int l = 0; l < L && status == FSDP_OK; l++) {
        status = fsdp_pre_forward(lm->layers[l]);
        if (status == FSDP_OK)
            status = ops->layer_fwd(r, l);
        if (status == FSDP_OK)
            status = fsdp_post_forward(lm->layers[l]);
        ops->layer_forget(r, l);
    }
    /* the final norm, then the head (under tensor parallelism on its input all-gathered, which
     * the head keeps instead of the norm's sequence shard) */
    if (status == FSDP_OK)
        status = fsdp_lm_alloc(r, r->rows * r->width, FSDP_MEM_ACTIVATION, &r->nf);
    if (status == FSDP_OK && ops->norm_mean)
        status = fsdp_lm_alloc_f(r, r->rows, FSDP_MEM_ACTIVATION, &r->meanf);
    if (status == FSDP_OK)
        status = fsdp_lm_alloc_f(r, r->rows, FSDP_MEM_ACTIVATION, &r->rstdf);
    if (status == FSDP_OK)
        status = ops->norm_fwd(r);
    if (status == FSDP_OK && r->tp > 1) {
        status = fsdp_lm_alloc(r, r->BT * r->width, FSDP_MEM_ACTIVATION, &r->nff);
        if (status == FSDP_OK)
            status = fsdp_lm_sp_gather(r, r->nf, r->nff, r->width);
        FSDP_LM_FREE(r, r->nf);
    }
    if (status == FSDP_OK)
        status = fsdp_lm_alloc(r, r->BT * r->V, FSDP_MEM_ACTIVATION, &r->logits);
    if (status == FSDP_OK)
        status = ops->head_fwd(r);
    if (status == FSDP_OK && ops->loss_fwd != NULL)
        status = ops->loss_fwd(r);
    if (status == FSDP_OK)
        status = fsdp_post_forward(lm->root);
    return status;
}

/* The loss and the logits' gradient (in place), then the backward through every unit, the root's
 * first: its head's gradient arrives first, its embedding's last. */
static fsdp_status_t backward(fsdp_lm_run_t *r, const fsdp_lm_ops_t *ops, double denom)
{
    fsdp_lm_t *lm = r->lm;
    const int L = lm->n_layer;
    fsdp_kernel_t d = {.kind = FSDP_K_CROSS_ENTROPY};
    void *g[FSDP_LM_MAX_ROOT_PARAMS] = {NULL};
    fsdp_status_t status;

    status = fsdp_lm_alloc_f(r, r->BT, FSDP_MEM_TEMPORARY, &r->losses);
    if (status == FSDP_OK)
        status = fsdp_lm_alloc_f(r, 1, FSDP_MEM_TEMPORARY, &r->loss);
    if (status == FSDP_OK && ops->loss_bwd != NULL)
        status = ops->loss_bwd(r);
    if (status != FSDP_OK)
        return status;
    d.u.cross_entropy.loss = r->loss;
    d.u.cross_entropy.losses = r->losses;
    d.u.cross_entropy.dlogits = r->logits;
    d.u.cross_entropy.logits = r->logits;
    d.u.cross_entropy.targets = r->targets;
    d.u.cross_entropy.rows = r->BT;
    d.u.cross_entropy.vocab = r->V;
    d.u.cross_entropy.denom = denom;
    d.u.cross_entropy.dtype = r->dt;
    status = fsdp_lm_launch(r, &d);

    if (status == FSDP_OK)
        status = fsdp_pre_backward(lm->root);
    for (int i = 0; i < fsdp_unit_num_params(lm->root) && status == FSDP_OK; i++)
        status = fsdp_unit_grad(lm->root, i, &g[i]);
    /* the head, then the final norm into dres */
    if (status == FSDP_OK)
        status = fsdp_lm_alloc(r, r->rows * r->width, FSDP_MEM_TEMPORARY, &r->tmp[0]);
    if (status == FSDP_OK)
        status = ops->head_bwd(r, g, r->tmp[0]);
    FSDP_LM_FREE(r, r->logits);
    FSDP_LM_FREE(r, r->nff);
    if (status == FSDP_OK)
        status = fsdp_lm_alloc(r, r->rows * r->width, FSDP_MEM_TEMPORARY, &r->dres);
    if (status == FSDP_OK)
        status = ops->norm_bwd(r, g, r->tmp[0]);
    FSDP_LM_FREE(r, r->tmp[0]);
    FSDP_LM_FREE(r, r->nf);
    FSDP_LM_FREE(r, r->meanf);
    FSDP_LM_FREE(r, r->rstdf);
    FSDP_LM_FREE(r, r->resid[L]);

    for (int l = L - 1; l >= 0 && status == FSDP_OK; l--) {
        status = fsdp_pre_backward(lm->layers[l]);
        if (status == FSDP_OK)
            status = ops->layer_recompute(r, l);
        if (status == FSDP_OK)
            status = ops->layer_bwd(r, l);
        if (status == FSDP_OK)
            status = fsdp_post_backward(lm->layers[l]);
        ops->layer_free(r, l);
        if (l > 0)
            FSDP_LM_FREE(r, r->resid[l]);
    }
    FSDP_LM_FREE(r, r->resid[0]);

    if (status == FSDP_OK)
        status = ops->embed_bwd(r, g);
    FSDP_LM_FREE(r, r->dres);
    if (status == FSDP_OK)
        status = fsdp_post_backward(lm->root);
    if (status == FSDP_OK)
        status = fsdp_final_callback(lm->fs);
    return status;
}

/* The device's f32 loss, copied to the host once the stream is done, undivided by the loss
 * scale. */
static fsdp_status_t loss_to_host(fsdp_lm_run_t *r, float *loss_p)
{
    float host = 0.0f;
    fsdp_status_t status = fsdp_dev_memcpy_async(r->dev, &host, r->loss, sizeof(float), r->s);

    if (status == FSDP_OK)
        status = fsdp_dev_stream_synchronize(r->dev, r->s);
    if (status == FSDP_OK)
        *loss_p = host / r->lm->loss_scale;
    return status;
}

static void run_cleanup(fsdp_lm_run_t *r, const fsdp_lm_ops_t *ops)
{
    const int L = r->lm->n_layer;

    for (int l = 0; r->acts != NULL && l < L; l++)
        ops->layer_free(r, l);
    for (int l = 0; r->resid != NULL && l <= L; l++)
        FSDP_LM_FREE(r, r->resid[l]);
    for (int i = 0; i < (int)(sizeof(r->tmp) / sizeof(r->tmp[0])); i++)
        FSDP_LM_FREE(r, r->tmp[i]);
    FSDP_LM_FREE(r, r->dres);
    FSDP_LM_FREE(r, r->logits);
    FSDP_LM_FREE(r, r->losses);
    FSDP_LM_FREE(r, r->loss);
    FSDP_LM_FREE(r, r->nf);
    FSDP_LM_FREE(r, r->meanf);
    FSDP_LM_FREE(r, r->rstdf);
    FSDP_LM_FREE(r, r->nff);
    if (ops->cleanup != NULL)
        ops->cleanup(r);
    FSDP_LM_FREE(r, r->tokens);
    FSDP_LM_FREE(r, r->targets);
    FSDP_LM_FREE(r, r->ltokens);
    free(r->acts);
    free(r->resid);
    r->acts = NULL;
    r->resid = NULL;
}

fsdp_status_t fsdp_lm_run_step(fsdp_lm_run_t *r, const fsdp_lm_ops_t *ops, const int32_t *inputs,
                               const int32_t *targets, size_t count, float *loss_p)
{
    const size_t L = (size_t)r->lm->n_layer;
    fsdp_status_t status = FSDP_OK;

    r->resid = calloc(L + 1, sizeof(*r->resid));
    r->acts = calloc(L, ops->layer_acts);
    if (r->resid == NULL || r->acts == NULL)
        status = FSDP_ERR_NO_MEMORY;
    if (status == FSDP_OK)
        status = batch_to_device(r, inputs, targets);
    if (status == FSDP_OK && ops->prepare != NULL)
        status = ops->prepare(r);
    if (status == FSDP_OK)
        status = forward(r, ops);
    /* the scale divides the denominator: the loss and every gradient carry it */
    if (status == FSDP_OK)
        status = backward(r, ops, (double)count / (double)r->lm->loss_scale);
    if (status == FSDP_OK)
        status = loss_to_host(r, loss_p);
    run_cleanup(r, ops);
    return status;
}

/* Under tensor parallelism the embedding is vocabulary-parallel (torchtitan's RowwiseParallel
 * of tok_embeddings): each rank looks up the tokens of its rows, zeros for the others (torch's
 * masked lookup), into a partial [BT, width] that is reduce-scattered to sequence shards. */
fsdp_status_t fsdp_lm_embed_fwd(fsdp_lm_run_t *r, const void *wte, const void *wpe)
{
    fsdp_kernel_t d = {.kind = FSDP_K_EMBEDDING_FWD};
    void *full = NULL;
    fsdp_status_t status = FSDP_OK;

    if (r->tp > 1)
        status = fsdp_lm_alloc(r, r->BT * r->width, FSDP_MEM_TEMPORARY, &full);
    d.u.embedding_fwd.y = r->tp > 1 ? full : r->resid[0];
    d.u.embedding_fwd.tokens = r->tp > 1 ? r->ltokens : r->tokens;
    d.u.embedding_fwd.wte = wte;
    d.u.embedding_fwd.wpe = wpe;
    d.u.embedding_fwd.rows = r->BT;
    d.u.embedding_fwd.cols = r->width;
    d.u.embedding_fwd.seq = r->T;
    d.u.embedding_fwd.vocab = r->vl;
    d.u.embedding_fwd.zero_outside = r->tp > 1;
    d.u.embedding_fwd.dtype = r->dt;
    if (status == FSDP_OK)
        status = fsdp_lm_launch(r, &d);
    if (status == FSDP_OK && r->tp > 1)
        status = fsdp_lm_sp_scatter(r, full, r->resid[0], r->width);
    FSDP_LM_FREE(r, full);
    return status;
}

/* Under tensor parallelism from dres all-gathered (the reduce-scatter's backward), into this
 * rank's vocabulary rows. */
fsdp_status_t fsdp_lm_embed_bwd(fsdp_lm_run_t *r, void *dwte, void *dwpe)
{
    fsdp_kernel_t e = {.kind = FSDP_K_EMBEDDING_BWD};
    void *full = NULL;
    fsdp_status_t status = FSDP_OK;

    if (r->tp > 1) {
        status = fsdp_lm_alloc(r, r->BT * r->width, FSDP_MEM_TEMPORARY, &full);
        if (status == FSDP_OK)
            status = fsdp_lm_sp_gather(r, r->dres, full, r->width);
    }
    e.u.embedding_bwd.dwte = dwte;
    e.u.embedding_bwd.dwpe = dwpe;
    e.u.embedding_bwd.dy = r->tp > 1 ? full : r->dres;
    e.u.embedding_bwd.tokens = r->tp > 1 ? r->ltokens : r->tokens;
    e.u.embedding_bwd.rows = r->BT;
    e.u.embedding_bwd.cols = r->width;
    e.u.embedding_bwd.seq = r->T;
    e.u.embedding_bwd.vocab = r->vl;
    e.u.embedding_bwd.dtype = r->dt;
    if (status == FSDP_OK)
        status = fsdp_lm_launch(r, &e);
    FSDP_LM_FREE(r, full);
    return status;
}
