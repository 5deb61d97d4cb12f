/* Tensor parallelism's collectives in a language model's step (lm_int.h): sequence parallelism's
 * all-gather and reduce-scatter of the residual stream over the tp group, with the permutations
 * between torch's Shard(1) of [B, T, width] and the collectives' rank-major buffers, and the
 * all-gather of vocabulary-sharded logits. They run on the compute stream, as DTensor's
 * redistributions run on the current stream, between the hooks of the unit whose code issues
 * them, so the trace names that unit and hook. */
#include "config.h"

#include <fsdp/log.h>

#include "core/core_hidden.h"
#include "nn/lm_int.h"

fsdp_status_t fsdp_lm_tp_init(fsdp_lm_run_t *r)
{
    fsdp_group_t *g = fsdp_tp_group(r->lm->fs);

    r->tpg = g;
    r->tp = g != NULL ? (size_t)g->size : 1;
    r->tp_rank = g != NULL ? (size_t)g->rank : 0;
    r->rows = r->BT / r->tp;
    r->vl = r->V / r->tp;
    r->v0 = r->tp_rank * r->vl;
    if (r->tp > 1 && r->T % r->tp != 0) {
        fsdp_error("%s: tp %zu must divide the sequence length %zu (sequence parallelism shards "
                   "every sequence)",
                   r->lm->family->name, r->tp, r->T);
        return FSDP_ERR_INVALID_PARAM;
    }
    return FSDP_OK;
}

/* blocks rows of cols elements, block i from src + i src_ld to dst + i dst_ld (elements) */
static fsdp_status_t copy_blocks(fsdp_lm_run_t *r, void *dst, size_t dst_ld, const void *src,
                                 size_t src_ld, size_t src_n, size_t rows, size_t cols)
{
    fsdp_kernel_t k = {.kind = FSDP_K_CHUNK_COPY};

    k.u.chunk_copy.dst = dst;
    k.u.chunk_copy.dst_dtype = r->dt;
    k.u.chunk_copy.dst_ld = dst_ld;
    k.u.chunk_copy.src = src;
    k.u.chunk_copy.src_dtype = r->dt;
    k.u.chunk_copy.src_ld = src_ld;
    k.u.chunk_copy.src_n = src_n;
    k.u.chunk_copy.rows = rows;
    k.u.chunk_copy.cols = cols;
    return fsdp_lm_launch(r, &k);
}

#define AT(r, p, i) ((char *)(p) + (size_t)(i) * (r)->es)

/* Between [tp, B, Ts, cols] (rank-major, the collective's) and [B, T, cols] (Shard(1)'s), Ts =
 * T / tp: to_seq copies rank t's [B, Ts, cols] block into rows t Ts.. of every sequence. */
static fsdp_status_t permute(fsdp_lm_run_t *r, void *dst, const void *src, size_t cols, int to_seq)
{
    const size_t ts = r->T / r->tp, block = ts * cols, n = r->BT * cols;
    fsdp_status_t status = FSDP_OK;

    for (size_t t = 0; t < r->tp && status == FSDP_OK; t++) {
        const size_t major = t * r->B * block, seq = t * block;
        status = to_seq ? copy_blocks(r, AT(r, dst, seq), r->T * cols, AT(r, src, major), block,
                                      n - major, r->B, block)
                        : copy_blocks(r, AT(r, dst, major), block, AT(r, src, seq), r->T * cols,
                                      n - seq, r->B, block);
    }
    return status;
}

fsdp_status_t fsdp_lm_sp_gather(fsdp_lm_run_t *r, const void *local, void *full, size_t cols)
{
    void *buf = NULL;
    fsdp_status_t status = fsdp_lm_alloc(r, r->BT * cols, FSDP_MEM_TEMPORARY, &buf);

    if (status == FSDP_OK)
        status = fsdp_dev_all_gather(r->dev, r->tpg, local, buf, r->rows * cols, r->dt, r->s);
    if (status == FSDP_OK)
        status = permute(r, full, buf, cols, 1);
    FSDP_LM_FREE(r, buf);
    return status;
}

fsdp_status_t fsdp_lm_sp_scatter(fsdp_lm_run_t *r, const void *full, void *local, size_t cols)
{
    void *buf = NULL;
    fsdp_status_t status = fsdp_lm_alloc(r, r->BT * cols, FSDP_MEM_TEMPORARY, &buf);

    if (status == FSDP_OK)
        status = permute(r, buf, full, cols, 0);
    if (status == FSDP_OK)
        status = fsdp_dev_reduce_scatter(r->dev, r->tpg, buf, local, r->rows * cols, r->dt,
                                         FSDP_REDUCE_SUM, r->s);
    FSDP_LM_FREE(r, buf);
    return status;
}

fsdp_status_t fsdp_lm_tp_gather_cols(fsdp_lm_run_t *r, const void *local, void *full)
{
    const size_t n = r->BT * r->vl;
    void *buf = NULL;
    fsdp_status_t status = fsdp_lm_alloc(r, n * r->tp, FSDP_MEM_TEMPORARY, &buf);

    if (status == FSDP_OK)
        status = fsdp_dev_all_gather(r->dev, r->tpg, local, buf, n, r->dt, r->s);
    /* rank t's [BT, vl] into columns t vl.. of every row */
    for (size_t t = 0; t < r->tp && status == FSDP_OK; t++)
        status = copy_blocks(r, AT(r, full, t * r->vl), r->V, AT(r, buf, t * n), r->vl,
                             n * (r->tp - t), r->BT, r->vl);
    FSDP_LM_FREE(r, buf);
    return status;
}
