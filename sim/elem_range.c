/* The scalar loops of the element-wise kernels, of the row kernels and column sums, and of the
 * Llama kernels' passes: the one compiled copy of each, below both the scalar path (kernels.c)
 * and the vector loops (elem_vec.c), which run it over their last elements and over the vectors
 * (rows, column blocks) whose inputs hold a NaN. Every formula is a body of
 * lib/kernels/kernel_elem.h, nn_bodies.h or llama_bodies.h. */
#include "config.h"

#include "elem_vec.h"
#include "kernels/llama_bodies.h"

typedef void (*fsdp_sim_range_t)(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p, size_t begin,
                                 size_t end);

/* A loop per kind of the exec classes ELEMS and PARTS, generated from kernel.h's list, with
 * the kind a constant so that fsdp_kb_elem's switch folds (to nothing for a kind without
 * elements); none for GEMM and PASSES. The table's loops are never inlined, so that the scalar
 * path and the vector loops run the same instructions (which operand of an x86 + or * is first
 * decides which of two NaNs comes out, and each inlined copy of a body may order them its own
 * way). */
#define FSDP_SIM_RANGE_LOOP_(NAME, name)                                                           \
    static void fsdp_sim_range_##name(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p,             \
                                      size_t begin, size_t end)                                    \
    {                                                                                              \
        for (size_t i = begin; i < end; i++)                                                       \
            fsdp_kb_elem(FSDP_K_##NAME, k, p, i);                                                  \
    }
#define FSDP_SIM_RANGE_DEF_ELEMS(NAME, name) FSDP_SIM_RANGE_LOOP_(NAME, name)
#define FSDP_SIM_RANGE_DEF_PARTS(NAME, name) FSDP_SIM_RANGE_LOOP_(NAME, name)
#define FSDP_SIM_RANGE_DEF_PASSES(NAME, name)
#define FSDP_SIM_RANGE_DEF_GEMM(NAME, name)
#define FSDP_SIM_RANGE_DEF_(NAME, name, member, dtypes, exec, cost, vec)                           \
    FSDP_SIM_RANGE_DEF_##exec(NAME, name)
FSDP_FOREACH_KERNEL(FSDP_SIM_RANGE_DEF_)

#define FSDP_SIM_RANGE_ELEMS(name) fsdp_sim_range_##name
#define FSDP_SIM_RANGE_PARTS(name) fsdp_sim_range_##name
#define FSDP_SIM_RANGE_PASSES(name) NULL
#define FSDP_SIM_RANGE_GEMM(name) NULL

static const fsdp_sim_range_t fsdp_sim_ranges[FSDP_K_COUNT] = {
#define FSDP_SIM_RANGE_(NAME, name, member, dtypes, exec, cost, vec) FSDP_SIM_RANGE_##exec(name),
    FSDP_FOREACH_KERNEL(FSDP_SIM_RANGE_)
#undef FSDP_SIM_RANGE_
};

#if defined(__GNUC__)
__attribute__((noinline))
#endif
void fsdp_sim_elem_range(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p, size_t begin, size_t end)
{
    fsdp_sim_range_t range = (unsigned)k->kind < FSDP_K_COUNT ? fsdp_sim_ranges[k->kind] : NULL;

    if (range != NULL)
        range(k, p, begin, end);
}

#if defined(__GNUC__)
__attribute__((noinline))
#endif
void fsdp_sim_pass_range(const fsdp_kernel_t *k, int pass, size_t begin, size_t end)
{
    fsdp_kb_llama_host_range(k, pass, begin, end);
}

#if defined(__GNUC__)
__attribute__((noinline))
#endif
void fsdp_sim_rows_range(const fsdp_kernel_t *k, float ce_scale, size_t r0, size_t r1)
{
    fsdp_kb_nn_rows_range(k, ce_scale, r0, r1);
}

#if defined(__GNUC__)
__attribute__((noinline))
#endif
void fsdp_sim_colsum_range(const fsdp_kernel_t *k, size_t b0, size_t b1)
{
    fsdp_kb_colsum_range(k, b0, b1);
}
