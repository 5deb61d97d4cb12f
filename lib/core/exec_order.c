/* The execution order (docs/runtime.md section 2: recorded in the first iteration): the order of
 * pre-forwards, which forward prefetch follows, checked across ranks in the first iteration;
 * and each iteration's post-forward order, which backward prefetch follows in reverse. */
#include "core/core_int.h"

#include <stdlib.h>

fsdp_status_t fsdp_exec_order_init(fsdp_t *fs)
{
    fs->pre_forward_order = calloc((size_t)fs->nunits, sizeof(*fs->pre_forward_order));
    /* a first size: a unit may run post-forward more than once per iteration (reused
     * modules), and fsdp_exec_order_record_post_forward grows the order as needed */
    fs->post_forward_cap = fs->nunits * 4 + 4;
    fs->post_forward_order = calloc((size_t)fs->post_forward_cap, sizeof(*fs->post_forward_order));
    if (fs->pre_forward_order == NULL || fs->post_forward_order == NULL)
        return fsdp_fail(fs, FSDP_ERR_NO_MEMORY, "rank %d: no memory for the execution order",
                         fs->dev->rank);
    return FSDP_OK;
}

void fsdp_exec_order_destroy(fsdp_t *fs)
{
    free(fs->pre_forward_order);
    free(fs->post_forward_order);
    fs->pre_forward_order = fs->post_forward_order = NULL;
}

/* First iteration: every rank must pre-forward the same unit at the same position. One int32
 * all-gather of the unit index per unit; a difference fails every rank alike (they all see
 * the same gathered indices) instead of hanging later in mismatched collectives. */
fsdp_status_t fsdp_validate_forward_order(fsdp_t *fs, fsdp_handle_t *h)
{
    fsdp_dev_t *dev = fs->dev;
    fsdp_group_t *world = fsdp_dev_group_world(dev);
    int32_t mine = h->unit->index, *seen = NULL;
    void *dsend = NULL, *drecv = NULL;
    size_t nbytes = sizeof(int32_t) * (size_t)world->size;
    fsdp_status_t status;

    if (world->size == 1 || dev->no_data)
        return FSDP_OK;
    seen = malloc(nbytes);
    if (seen == NULL)
        return FSDP_ERR_NO_MEMORY;
    status = fsdp_mem_alloc(fs->mem, sizeof(int32_t), FSDP_MEM_TEMPORARY, fs->compute, &dsend);
    if (status == FSDP_OK)
        status = fsdp_mem_alloc(fs->mem, nbytes, FSDP_MEM_TEMPORARY, fs->compute, &drecv);
    if (status == FSDP_OK)
        status = fsdp_dev_memcpy_async(dev, dsend, &mine, sizeof(mine), fs->compute);
    if (status == FSDP_OK)
        status = fsdp_dev_all_gather(dev, world, dsend, drecv, 1, FSDP_DTYPE_I32, fs->compute);
    if (status == FSDP_OK)
        status = fsdp_dev_memcpy_async(dev, seen, drecv, nbytes, fs->compute);
    if (status == FSDP_OK)
        status = fsdp_dev_stream_synchronize(dev, fs->compute);
    if (status != FSDP_OK) {
        fsdp_fail_below(fs, status, "rank %d: unit '%s': forward-order check failed: %s", dev->rank,
                        h->unit->name, fsdp_status_string(status));
    } else {
        for (int r = 1; r < world->size; r++) {
            if (seen[r] == seen[0])
                continue;
            status = fsdp_fail(
                fs, FSDP_ERR_COLLECTIVE_MISMATCH,
                "rank %d: forward order differs across ranks: at forward position %d rank %d "
                "runs unit '%s' but rank %d runs unit '%s'",
                dev->rank, fs->forward_position, world->ranks[0],
                seen[0] >= 0 && seen[0] < fs->nunits ? fs->units[seen[0]]->name : "?",
                world->ranks[r],
                seen[r] >= 0 && seen[r] < fs->nunits ? fs->units[seen[r]]->name : "?");
            break;
        }
    }
    fsdp_mem_free(fs->mem, drecv);
    fsdp_mem_free(fs->mem, dsend);
    free(seen);
    return status;
}

/* Records h's place in the first iteration's forward order; later, warns once when the order
 * changes (prefetching keeps following the first iteration's). */
void fsdp_exec_order_record_pre_forward(fsdp_t *fs, fsdp_handle_t *h)
{
    if (!fs->first_iter_done && h->pre_forward_order_index < 0) {
        h->pre_forward_order_index = fs->n_pre_forward;
        fs->pre_forward_order[fs->n_pre_forward++] = h;
    } else if (fs->first_iter_done && !fs->order_change_warned &&
               (fs->forward_position >= fs->n_pre_forward ||
                fs->pre_forward_order[fs->forward_position] != h)) {
        fs->order_change_warned = 1;
        fsdp_warn("rank %d: the forward order changed after the first iteration: unit '%s' ran "
                  "at position %d, where the first iteration ran '%s'; prefetching keeps "
                  "following the first iteration's order",
                  fs->dev->rank, h->unit->name, fs->forward_position,
                  fs->forward_position < fs->n_pre_forward
                      ? fs->pre_forward_order[fs->forward_position]->unit->name
                      : "nothing");
    }
    fs->forward_position++;
}

/* The unit that ran pre-forward after h in the first iteration, or NULL: forward prefetch's
 * target. */
fsdp_handle_t *fsdp_exec_order_forward_next(const fsdp_t *fs, const fsdp_handle_t *h)
{
    int next = h->pre_forward_order_index + 1;
    return next > 0 && next < fs->n_pre_forward ? fs->pre_forward_order[next] : NULL;
}

/* Appends h to this iteration's post-forward order, doubling the order when it is full. */
fsdp_status_t fsdp_exec_order_record_post_forward(fsdp_t *fs, fsdp_handle_t *h)
{
    if (fs->n_post_forward == fs->post_forward_cap) {
        int cap = 2 * fs->post_forward_cap;
        fsdp_handle_t **order = realloc(fs->post_forward_order, (size_t)cap * sizeof(*order));
        if (order == NULL)
            return fsdp_fail(fs, FSDP_ERR_NO_MEMORY,
                             "rank %d: cannot grow the post-forward order to %d entries",
                             fs->dev->rank, cap);
        fs->post_forward_order = order;
        fs->post_forward_cap = cap;
    }
    /* PyTorch's record_post_forward, with PyTorch's truthiness test: index 0 is re-indexed */
    if (h->post_forward_index <= 0)
        h->post_forward_index = fs->n_post_forward;
    fs->post_forward_order[fs->n_post_forward++] = h;
    return FSDP_OK;
}

/* The unit that ran post-forward just before h runs backward next, or NULL: backward
 * prefetch's target. */
fsdp_handle_t *fsdp_exec_order_backward_next(const fsdp_t *fs, const fsdp_handle_t *h)
{
    return h->post_forward_index > 0 ? fs->post_forward_order[h->post_forward_index - 1] : NULL;
}
