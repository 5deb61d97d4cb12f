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

/* The scalar loop of k's element-wise kind over elements [begin, end) (elem_range.c): the
 * one compiled copy of it, which the scalar path and the vector loops share. */
void fsdp_sim_elem_range(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p, size_t begin,
                         size_t end);

#endif
