/* Safetensors, hidden: the parts of the reader that the library and the tests use.
 *
 * libfsdp.so exports only the user API of include/fsdp/ (DESIGN.md, "Layers"); these functions are
 * declared here instead, for the rest of the library and for the tests and benchmarks that link
 * the library's parts statically (FSDP_INTERNAL_LIBS in common.am). */
#ifndef FSDP_IO_HIDDEN_H
#define FSDP_IO_HIDDEN_H

#include <fsdp/safetensors.h>

/* ---- from <fsdp/safetensors.h> ---- */

/* Bits per element of a safetensors dtype name, 0 if unknown. */
unsigned fsdp_st_dtype_bits(const char *dtype);

/* Same rules, over a buffer the caller keeps alive while the file is open. `label` names it in
 * messages ("<buffer>" if NULL); buf may be NULL when len is 0. */
fsdp_status_t fsdp_st_open_buffer(const void *buf, size_t len, const char *label,
                                  fsdp_st_file_t **file_p);

/* Value of a __metadata__ key, NULL if absent. */
const char *fsdp_st_metadata(const fsdp_st_file_t *file, const char *key);

/* Elements [start, start + n) of a F32, BF16 or F16 tensor (row-major), widened to f32 into
 * out: only those bytes of the file are read. FSDP_ERR_INVALID_PARAM for another dtype or a
 * range past the tensor's end. */
fsdp_status_t fsdp_st_read_f32(const fsdp_st_tensor_t *t, uint64_t start, uint64_t n, float *out);

/* The finiteness check of every loader of weights (fsdp_st_check_finite, and the checkpoint
 * reader on the ranges it reads): FSDP_OK when p[0..n) are finite, else FSDP_ERR_FORMAT with one
 * line naming `label` (the file or directory), tensor `name` and its first NaN or Inf, counted
 * from `first` (p's offset in the tensor). */
fsdp_status_t fsdp_st_check_finite_f32(const char *label, const char *name, const float *p,
                                       uint64_t n, uint64_t first);

#endif
