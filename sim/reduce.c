/* The data of the sim's collectives: what a completed round writes into every member's
 * buffers. The completing rank runs this for all members at once, in group-rank order.
 *
 * Floating-point reductions load each element as f32 (fsdp_kb_load), accumulate in f32 in
 * group-rank order 0..n-1 and round once into the dtype (fsdp_kb_store, nearest even), as
 * backend.h promises; avg divides the f32 sum by the group size before that one rounding.
 * i32 sums wrap like two's-complement int32 arithmetic.
 *
 * In-place calls are safe because each output element is written only after every input
 * element it depends on has been read, and no other output depends on the overwritten input:
 * all_reduce with send == recv, reduce_scatter with recv = send + rank * count, all_gather
 * with send = recv + rank * count.
 */
#include "sim.h"

#include <math.h>
#include <string.h>

#include "kernels/elementwise.h"

static float reduce_f32(fsdp_sim_call_t *const *calls, int n, size_t i)
{
    fsdp_dtype_t dtype = calls[0]->dtype;
    fsdp_reduce_op_t op = calls[0]->op;
    float acc = fsdp_kb_load(calls[0]->send, dtype, i);

    for (int r = 1; r < n; r++) {
        float v = fsdp_kb_load(calls[r]->send, dtype, i);
        if (op == FSDP_REDUCE_MAX)
            acc = (v > acc || isnan(v)) ? v : acc; /* NaN wins, as torch.max */
        else
            acc += v;
    }
    if (op == FSDP_REDUCE_AVG)
        acc /= (float)n;
    return acc;
}

static int32_t reduce_i32(fsdp_sim_call_t *const *calls, int n, size_t i)
{
    int32_t v = ((const int32_t *)calls[0]->send)[i];
    uint32_t sum = (uint32_t)v;
    int32_t max = v;

    for (int r = 1; r < n; r++) {
        v = ((const int32_t *)calls[r]->send)[i];
        sum += (uint32_t)v;
        max = v > max ? v : max;
    }
    if (calls[0]->op == FSDP_REDUCE_MAX)
        return max;
    return (int32_t)sum; /* wraps: the value NCCL's int32 sum gives */
}

/* Reduces element `in` of every send buffer into element `out` of the receive buffers of
 * members [d0, d1). */
static void reduce_elem(fsdp_sim_call_t *const *calls, int n, size_t in, int d0, int d1,
                        size_t out)
{
    fsdp_dtype_t dtype = calls[0]->dtype;

    if (dtype == FSDP_DTYPE_I32) {
        int32_t v = reduce_i32(calls, n, in);
        for (int d = d0; d < d1; d++)
            ((int32_t *)calls[d]->recv)[out] = v;
    } else {
        float v = reduce_f32(calls, n, in);
        for (int d = d0; d < d1; d++)
            fsdp_kb_store(calls[d]->recv, dtype, out, v);
    }
}

void fsdp_sim_coll_compute(fsdp_sim_call_t *const *calls, int n)
{
    const fsdp_sim_call_t *c = calls[0];
    size_t count = c->count;
    size_t bytes = count * fsdp_dtype_size(c->dtype);

    if (count == 0)
        return;
    switch (c->kind) {
    case FSDP_SIM_COLL_ALL_GATHER:
        for (int d = 0; d < n; d++) {
            for (int r = 0; r < n; r++) {
                char *dst = (char *)calls[d]->recv + (size_t)r * bytes;
                if (dst != calls[r]->send)
                    memmove(dst, calls[r]->send, bytes);
            }
        }
        break;
    case FSDP_SIM_COLL_REDUCE_SCATTER:
        for (int d = 0; d < n; d++) {
            for (size_t i = 0; i < count; i++)
                reduce_elem(calls, n, (size_t)d * count + i, d, d + 1, i);
        }
        break;
    case FSDP_SIM_COLL_ALL_REDUCE:
        for (size_t i = 0; i < count; i++)
            reduce_elem(calls, n, i, 0, n, i);
        break;
    case FSDP_SIM_COLL_BROADCAST:
        for (int d = 0; d < n; d++) {
            if (calls[d]->recv != calls[c->root]->recv)
                memmove(calls[d]->recv, calls[c->root]->recv, bytes);
        }
        break;
    case FSDP_SIM_COLL_BARRIER:
    case FSDP_SIM_COLL_SPLIT:
        break;
    }
}
