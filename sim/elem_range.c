/* The scalar loop of the element-wise kernels: the one compiled copy of it, below both the
 * scalar path (kernels.c, kernels_nn.c) and the vector loops (elem_vec.c), which run it over
 * their last elements and over the vectors whose inputs hold a NaN. Every formula is a body of
 * lib/kernels/kernel_elem.h. */
#include "config.h"

#include "elem_vec.h"

/* The element-wise loop over [begin, end), with the kind a constant so that fsdp_kb_elem's
 * switch folds. */
#define FSDP_SIM_ELEM_LOOP(KIND, k, prep, begin, end)                                              \
    do {                                                                                           \
        for (size_t i_ = (begin); i_ < (end); i_++)                                                \
            fsdp_kb_elem(KIND, (k), (prep), i_);                                                   \
    } while (0)

/* The one compiled copy of every kind's scalar loop: the scalar path runs it over all of a
 * kernel, the vector loops of elem_vec.c over their last elements and over the vectors whose
 * inputs hold a NaN. Never inlined, so that both run the same instructions (which operand of
 * an x86 + or * is first decides which of two NaNs comes out, and each inlined copy of a body
 * may order them its own way). */
#if defined(__GNUC__)
__attribute__((noinline))
#endif
void fsdp_sim_elem_range(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p, size_t begin, size_t end)
{
    switch (k->kind) {
    case FSDP_K_FILL:
        FSDP_SIM_ELEM_LOOP(FSDP_K_FILL, k, p, begin, end);
        break;
    case FSDP_K_CAST:
        FSDP_SIM_ELEM_LOOP(FSDP_K_CAST, k, p, begin, end);
        break;
    case FSDP_K_SCALE:
        FSDP_SIM_ELEM_LOOP(FSDP_K_SCALE, k, p, begin, end);
        break;
    case FSDP_K_DIV:
        FSDP_SIM_ELEM_LOOP(FSDP_K_DIV, k, p, begin, end);
        break;
    case FSDP_K_AXPY:
        FSDP_SIM_ELEM_LOOP(FSDP_K_AXPY, k, p, begin, end);
        break;
    case FSDP_K_BIAS_ADD:
        FSDP_SIM_ELEM_LOOP(FSDP_K_BIAS_ADD, k, p, begin, end);
        break;
    case FSDP_K_RELU_FWD:
        FSDP_SIM_ELEM_LOOP(FSDP_K_RELU_FWD, k, p, begin, end);
        break;
    case FSDP_K_RELU_BWD:
        FSDP_SIM_ELEM_LOOP(FSDP_K_RELU_BWD, k, p, begin, end);
        break;
    case FSDP_K_MSE_LOSS:
        FSDP_SIM_ELEM_LOOP(FSDP_K_MSE_LOSS, k, p, begin, end);
        break;
    case FSDP_K_ADAMW:
        FSDP_SIM_ELEM_LOOP(FSDP_K_ADAMW, k, p, begin, end);
        break;
    case FSDP_K_SGD:
        FSDP_SIM_ELEM_LOOP(FSDP_K_SGD, k, p, begin, end);
        break;
    case FSDP_K_GELU_FWD:
        FSDP_SIM_ELEM_LOOP(FSDP_K_GELU_FWD, k, p, begin, end);
        break;
    case FSDP_K_GELU_BWD:
        FSDP_SIM_ELEM_LOOP(FSDP_K_GELU_BWD, k, p, begin, end);
        break;
    case FSDP_K_EMBEDDING_FWD:
        FSDP_SIM_ELEM_LOOP(FSDP_K_EMBEDDING_FWD, k, p, begin, end);
        break;
    case FSDP_K_ADD:
        FSDP_SIM_ELEM_LOOP(FSDP_K_ADD, k, p, begin, end);
        break;
    default:
        break;
    }
}
