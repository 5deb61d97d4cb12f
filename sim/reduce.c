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

/* Floating-point elements are reduced a block at a time, one send buffer after another: each
 * element still sees the operations described above in the same order (rank 0's value, then
 * ranks 1..n-1, then the average's divide), so the results are the same to the bit, but the
 * loops run over contiguous memory and vectorize. */
#define REDUCE_BLOCK 2048

/* acc[j] = reduction over every member of element in + j of its send buffer, j < len. */
static void reduce_block_f32(fsdp_sim_call_t *const *calls, int n, size_t in, size_t len,
                             float *acc)
{
    fsdp_dtype_t dtype = calls[0]->dtype;
    fsdp_reduce_op_t op = calls[0]->op;

    for (int r = 0; r < n; r++) {
        const void *send = calls[r]->send;
        if (r == 0 && dtype == FSDP_DTYPE_F32) {
            memcpy(acc, (const float *)send + in, len * sizeof(float));
        } else if (r == 0) {
            for (size_t j = 0; j < len; j++)
                acc[j] = fsdp_kb_load(send, dtype, in + j);
        } else if (dtype == FSDP_DTYPE_F32 && op != FSDP_REDUCE_MAX) {
            const float *s = (const float *)send + in;
            size_t j = 0;
            /* whole groups of 8 first: a fixed trip count the compiler vectorizes */
            for (; j + 8 <= len; j += 8)
                for (size_t l = 0; l < 8; l++)
                    acc[j + l] += s[j + l];
            for (; j < len; j++)
                acc[j] += s[j];
        } else {
            for (size_t j = 0; j < len; j++) {
                float v = fsdp_kb_load(send, dtype, in + j);
                if (op == FSDP_REDUCE_MAX)
                    acc[j] = (v > acc[j] || isnan(v)) ? v : acc[j]; /* NaN wins, as torch.max */
                else
                    acc[j] += v;
            }
        }
    }
    if (op == FSDP_REDUCE_AVG) {
        for (size_t j = 0; j < len; j++)
            acc[j] /= (float)n;
    }
}

/* Reduces elements [in, in + len) of every send buffer into [out, out + len) of the receive
 * buffers of members [d0, d1). */
static void reduce_range(fsdp_sim_call_t *const *calls, int n, size_t in, size_t len, int d0,
                         int d1, size_t out)
{
    fsdp_dtype_t dtype = calls[0]->dtype;
    float acc[REDUCE_BLOCK];

    if (dtype == FSDP_DTYPE_I32) {
        for (size_t j = 0; j < len; j++) {
            int32_t v = reduce_i32(calls, n, in + j);
            for (int d = d0; d < d1; d++)
                ((int32_t *)calls[d]->recv)[out + j] = v;
        }
        return;
    }
    for (size_t b = 0; b < len; b += REDUCE_BLOCK) {
        size_t m = len - b < REDUCE_BLOCK ? len - b : REDUCE_BLOCK;
        /* every input of the block is read before any of its outputs is written: in-place
         * calls stay safe */
        reduce_block_f32(calls, n, in + b, m, acc);
        for (int d = d0; d < d1; d++) {
            if (dtype == FSDP_DTYPE_F32) {
                memcpy((float *)calls[d]->recv + out + b, acc, m * sizeof(float));
            } else {
                for (size_t j = 0; j < m; j++)
                    fsdp_kb_store(calls[d]->recv, dtype, out + b + j, acc[j]);
            }
        }
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
        for (int d = 0; d < n; d++)
            reduce_range(calls, n, (size_t)d * count, count, d, d + 1, 0);
        break;
    case FSDP_SIM_COLL_ALL_REDUCE:
        reduce_range(calls, n, 0, count, 0, n, 0);
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
