/* Vectorized host loops of the element-wise kernels (elem_vec.c): the same bytes as the scalar
 * bodies of lib/kernels/, a vector of elements at a time. */
#ifndef FSDP_SIM_ELEM_VEC_H
#define FSDP_SIM_ELEM_VEC_H

#include "kernels/kernel_elem.h"
#include "sim_kernels.h"

/* Runs elements [begin, end) of the element-wise part of the checked descriptor k (prepared
 * into *p) with the vector loop of its kind and returns 1; returns 0, having written nothing,
 * when there is none for this kind, these dtypes or this layout of buffers (the caller runs the
 * scalar loop). */
int fsdp_sim_elem_vec(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p, size_t begin, size_t end);

/* Runs rows [r0, r1) of pass `pass` of the checked attention kernel k (attention_fwd, or a pass
 * of attention_bwd) with its 32 lanes in vectors (lanes_vec_tmpl.h) and returns 1; returns 0,
 * having written nothing, for another kind, an ISA, dtype or head_dim it has no loop for (the
 * caller runs the bodies' rows). The same bytes as fsdp_kb_llama_row's rows. */
int fsdp_sim_lanes_vec(const fsdp_kernel_t *k, int pass, size_t r0, size_t r1);

/* The scalar loop of k's element-wise kind over elements [begin, end) (elem_range.c): the
 * one compiled copy of it, which the scalar path and the vector loops share. */
void fsdp_sim_elem_range(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p, size_t begin, size_t end);

/* Indices [begin, end) of pass `pass` of the checked Llama kernel k by the bodies' host loops
 * (elem_range.c): the one compiled copy of them, which the scalar path and the vector lanes'
 * rows with NaNs share. */
void fsdp_sim_pass_range(const fsdp_kernel_t *k, int pass, size_t begin, size_t end);

#endif
