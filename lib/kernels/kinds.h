/* Lookups by kernel kind, generated from the list of kinds (FSDP_FOREACH_KERNEL, kernel.h):
 * how a backend runs a kind, how the simulator prices it, the dtype of its tensors. Host side;
 * a launch looks a kind up once, never per element. */
#ifndef FSDP_KERNELS_KINDS_H
#define FSDP_KERNELS_KINDS_H

#include <stddef.h>
#include <string.h>

#include <fsdp/kernel.h>

/* The list's exec column. */
typedef enum {
    FSDP_KX_ELEMS,  /* independent elements: fsdp_kb_elem over i < n, cut anywhere */
    FSDP_KX_PARTS,  /* column sums, rows, a reduction, elements (kernel_elem.h) */
    FSDP_KX_PASSES, /* the passes of llama_bodies.h */
    FSDP_KX_GEMM    /* the backend's own matrix product */
} fsdp_kb_exec_t;

/* The list's cost column. */
typedef enum {
    FSDP_KC_VECTOR,   /* a roofline on CUDA cores */
    FSDP_KC_MATMUL,   /* tensor cores at the GEMM's efficiency */
    FSDP_KC_ATTENTION /* tensor cores at the fused attention's */
} fsdp_kb_cost_class_t;

static inline fsdp_kb_exec_t fsdp_kb_exec(fsdp_kernel_kind_t kind)
{
    static const unsigned char exec[FSDP_K_COUNT] = {
#define FSDP_KB_EXEC_(NAME, name, member, dtypes, exec, cost, vec) FSDP_KX_##exec,
        FSDP_FOREACH_KERNEL(FSDP_KB_EXEC_)
#undef FSDP_KB_EXEC_
    };
    return (unsigned)kind < FSDP_K_COUNT ? (fsdp_kb_exec_t)exec[kind] : FSDP_KX_PARTS;
}

static inline fsdp_kb_cost_class_t fsdp_kb_cost_class(fsdp_kernel_kind_t kind)
{
    static const unsigned char cost[FSDP_K_COUNT] = {
#define FSDP_KB_COST_(NAME, name, member, dtypes, exec, cost, vec) FSDP_KC_##cost,
        FSDP_FOREACH_KERNEL(FSDP_KB_COST_)
#undef FSDP_KB_COST_
    };
    return (unsigned)kind < FSDP_K_COUNT ? (fsdp_kb_cost_class_t)cost[kind] : FSDP_KC_VECTOR;
}

/* Where a kind of the dtypes ONE keeps its dtype (0: another kind). */
#define FSDP_KB_DTYPE_AT_ONE(member) offsetof(fsdp_kernel_t, u.member.dtype)
#define FSDP_KB_DTYPE_AT_MIXED(member) 0
#define FSDP_KB_DTYPE_AT_F32(member) 0

/* The dtype of the tensors of a kind of the dtypes ONE; f32 for the others. */
static inline fsdp_dtype_t fsdp_kb_dtype(const fsdp_kernel_t *k)
{
    static const size_t at[FSDP_K_COUNT] = {
#define FSDP_KB_DTYPE_(NAME, name, member, dtypes, exec, cost, vec)                                \
    FSDP_KB_DTYPE_AT_##dtypes(member),
        FSDP_FOREACH_KERNEL(FSDP_KB_DTYPE_)
#undef FSDP_KB_DTYPE_
    };
    fsdp_dtype_t dt;

    if ((unsigned)k->kind >= FSDP_K_COUNT || at[k->kind] == 0)
        return FSDP_DTYPE_F32;
    memcpy(&dt, (const char *)k + at[k->kind], sizeof(dt));
    return dt;
}

#endif
