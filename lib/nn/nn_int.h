/* What the built-in models share: kernel launches and writing their weights (what only the
 * language models share is in lm_int.h). */
#ifndef FSDP_NN_NN_INT_H
#define FSDP_NN_NN_INT_H

#include "core/core_hidden.h"
#include "io/io_hidden.h"
#include "nn/nn_hidden.h"

#include <fsdp/backend.h>
#include <fsdp/core.h>
#include <fsdp/memory.h>

#include <stdint.h>

/* Launches the GEMM descriptor k (its epilogue included) on stream s. With a 16-bit C the
 * epilogue is fused, so that each of its stages rounds once, where torch's op rounds
 * (kernel.h). With an f32 C, where no stage rounds, it runs as the separate launches it equals
 * bit for bit (gemm, then bias_add, relu_fwd or gelu_fwd, add), the kernels an f32 model has
 * always launched, so f32 traces and their costs compare across versions. */
fsdp_status_t fsdp_nn_gemm(fsdp_dev_t *dev, fsdp_stream_t *s, const fsdp_kernel_t *k);

/* The checkpoint name of parameter `index` (info pi) of unit `unit` (0 the root, l + 1 layer l),
 * into buf of len bytes. */
typedef void (*fsdp_nn_name_func_t)(void *arg, int unit, int index, const fsdp_param_info_t *pi,
                                    char *buf, size_t len);
/* Gathers the full parameters of the root and then of layers[0..nlayers), one unit at a time (a
 * collective: every rank calls it), and on rank 0 (`rank` is the caller's) writes them as one
 * F32 safetensors file at path, named by name(), metadata {"format": "pt"} (save_units.c). */
fsdp_status_t fsdp_nn_save_units(fsdp_unit_t *root, fsdp_unit_t *const *layers, int nlayers,
                                 int rank, const char *path, fsdp_nn_name_func_t name, void *arg);
/* How parameter `index` of unit `unit` is cut over a tp group: 0 whole (replicated), -1 by its
 * rows (tp rank t's are rows t r.. of the full tensor), P > 0 by the columns of P equal blocks
 * of each row (tp rank t's are columns t w.. of each block of w tp). */
typedef int (*fsdp_nn_slice_func_t)(void *arg, int unit, int index);
/* Where element e of tp rank t's slice (numel elements, rows of cols) of a tensor cut as `parts`
 * says sits in the full tensor. */
static inline size_t fsdp_nn_slice_index(size_t e, size_t numel, size_t cols, int parts, int tp,
                                         int t)
{
    size_t w;

    if (parts == 0)
        return e;
    if (parts < 0)
        return (size_t)t * numel + e;
    w = cols / (size_t)parts;
    return e / cols * cols * (size_t)tp + e % cols / w * w * (size_t)tp + (size_t)t * w + e % w;
}
/* The same under tensor parallelism (fs's tp group): each unit is gathered over dp, then its
 * tp ranks' tensors over tp, and rank 0 writes the full tensors that slice() says they are
 * slices of. Without a tp group, fsdp_nn_save_units. */
fsdp_status_t fsdp_nn_save_units_tp(fsdp_t *fs, fsdp_unit_t *root, fsdp_unit_t *const *layers,
                                    int nlayers, const char *path, fsdp_nn_name_func_t name,
                                    fsdp_nn_slice_func_t slice, void *arg);
/* The tp ranks' flat buffers of one unit (n floats each, this rank's at flat) all-gathered over
 * fs's tp group into tp n floats at all, on the host, through the device. A collective over tp
 * (save_units.c). */
fsdp_status_t fsdp_nn_tp_gather(fsdp_t *fs, const float *flat, size_t n, float *all);
/* Parameter pi's whole tensor from the tp ranks' flat buffers all (tp of n floats, pi at
 * pi->offset in each): its slices cut as `parts` says (fsdp_nn_slice_func_t), into *data_p
 * (malloc'd) with its shape (shape[1] 0 for a 1-d tensor). */
fsdp_status_t fsdp_nn_tp_assemble(const fsdp_param_info_t *pi, const float *all, size_t n, int tp,
                                  int parts, float **data_p, int64_t shape[2]);

#endif
