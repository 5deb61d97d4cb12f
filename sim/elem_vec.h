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

/* Runs indices [b, e) of pass `pass` of the checked Llama kernel k with vectors and returns 1:
 * attention's rows with their 32 lanes in vectors (lanes_vec_tmpl.h), rmsnorm's rows and column
 * blocks, swiglu's and rope's elements (rows_vec_tmpl.h); returns 0, having written nothing, for
 * an ISA, dtype, shape or layout of buffers it has no loop for (the caller runs the bodies'
 * loops, fsdp_sim_pass_range). The same bytes as those loops. */
int fsdp_sim_pass_vec(const fsdp_kernel_t *k, int pass, size_t b, size_t e);

/* The attention backward's passes 1 and 2 as one walk over units (a batch row and a kv head:
 * the dq rows of its query heads, the dk and dv rows of its keys), each (query, key) pair's
 * score and probability computed once (lanes_vec_tmpl.h): for pass 1 of a checked attention_bwd
 * kernel that the vector rows take, with outputs apart from its inputs, the number of units,
 * which fsdp_sim_attn_bwd_run runs in place of passes 1 and 2 (after pass 0), any cut of them into
 * ranges on any threads; 0 otherwise (the passes run). The same bytes as the passes. */
size_t fsdp_sim_attn_bwd_units(const fsdp_kernel_t *k, int pass);
void fsdp_sim_attn_bwd_run(const fsdp_kernel_t *k, size_t u0, size_t u1);

/* Runs rows [r0, r1) of the checked row kernel k (layernorm_fwd, layernorm_bwd's input gradient,
 * softmax_fwd, softmax_bwd, cross_entropy; ce_scale: fsdp_kb_prep_t's) with its 32 lanes in
 * vectors, or column blocks [b0, b1) of the column sums of bias_grad or layernorm_bwd, and
 * returns 1; returns 0, having written nothing, where it has no loop (the caller runs
 * fsdp_sim_rows_range, fsdp_sim_colsum_range). The same bytes as those. */
int fsdp_sim_rows_vec(const fsdp_kernel_t *k, float ce_scale, size_t r0, size_t r1);
int fsdp_sim_colsum_vec(const fsdp_kernel_t *k, size_t b0, size_t b1);

/* The scalar loop of k's element-wise kind over elements [begin, end) (elem_range.c): the
 * one compiled copy of it, which the scalar path and the vector loops share. */
void fsdp_sim_elem_range(const fsdp_kernel_t *k, const fsdp_kb_prep_t *p, size_t begin, size_t end);

/* Indices [begin, end) of pass `pass` of the checked Llama kernel k by the bodies' host loops
 * (elem_range.c): the one compiled copy of them, which the scalar path and the vector lanes'
 * rows with NaNs share. */
void fsdp_sim_pass_range(const fsdp_kernel_t *k, int pass, size_t begin, size_t end);

/* Rows [r0, r1) of a checked row kernel, column blocks [b0, b1) of the column sums of a checked
 * kernel, by the bodies' host loops (elem_range.c, fsdp_kb_nn_rows_range, fsdp_kb_colsum_range):
 * their one compiled copy, which the scalar path and the vector rows with NaNs share. */
void fsdp_sim_rows_range(const fsdp_kernel_t *k, float ce_scale, size_t r0, size_t r1);
void fsdp_sim_colsum_range(const fsdp_kernel_t *k, size_t b0, size_t b1);

#endif
