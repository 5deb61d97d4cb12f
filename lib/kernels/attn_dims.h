/* The shape of a fused-attention descriptor, forward or backward (they share it), as doubles for
 * the cost models: lib/kernels/kernel.c's roofline and sim/cost.c's pricing. */
#ifndef FSDP_KERNELS_ATTN_DIMS_H
#define FSDP_KERNELS_ATTN_DIMS_H

#include <fsdp/kernel.h>

typedef struct fsdp_attn_dims {
    int fwd; /* 1: attention_fwd, 0: attention_bwd */
    double batch, seq, heads, kv_heads, head_dim;
    int causal;
    fsdp_dtype_t dtype;
} fsdp_attn_dims_t;

/* k is FSDP_K_ATTENTION_FWD or FSDP_K_ATTENTION_BWD. */
static inline fsdp_attn_dims_t fsdp_attn_dims(const fsdp_kernel_t *k)
{
    fsdp_attn_dims_t d;

    d.fwd = k->kind == FSDP_K_ATTENTION_FWD;
#define FSDP_ATTN_DIMS_(a)                                                                         \
    do {                                                                                           \
        d.batch = (double)(a).batch;                                                               \
        d.seq = (double)(a).seq;                                                                   \
        d.heads = (double)(a).heads;                                                               \
        d.kv_heads = (double)(a).kv_heads;                                                         \
        d.head_dim = (double)(a).head_dim;                                                         \
        d.causal = (a).causal;                                                                     \
        d.dtype = (a).dtype;                                                                       \
    } while (0)
    if (d.fwd)
        FSDP_ATTN_DIMS_(k->u.attention_fwd);
    else
        FSDP_ATTN_DIMS_(k->u.attention_bwd);
#undef FSDP_ATTN_DIMS_
    return d;
}

#endif
