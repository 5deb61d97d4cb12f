/* libfsdp: safetensors files (docs/formats.md section 1).
 *
 * The reader enforces every rule of the format: header size limits, UTF-8 JSON that starts with
 * '{', no duplicate keys, string-only __metadata__, known dtypes, contiguous non-overlapping
 * data offsets starting at 0, sizes equal to the product of the shape (overflow-checked) and a
 * buffer that is exactly indexed. Errors are FSDP_ERR_FORMAT (or FSDP_ERR_IO) with one logged
 * line naming the file and the rule broken.
 *
 * The writer follows the reference writer's conventions (tensors by descending alignment, then
 * by name; header padded with spaces to 8 bytes; __metadata__ first) and is atomic: it writes a
 * temporary file, fsyncs it and renames it over the target.
 */
#ifndef FSDP_SAFETENSORS_H
#define FSDP_SAFETENSORS_H

#include <fsdp/api.h>

#include <fsdp/status.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FSDP_ST_MAX_DIMS 8
#define FSDP_ST_MAX_HEADER 100000000ull

typedef struct fsdp_st_tensor {
    const char *name;
    const char *dtype; /* "F32", "BF16", ... */
    int ndim;
    int64_t shape[FSDP_ST_MAX_DIMS];
    uint64_t numel;
    uint64_t nbytes;
    /* Into the file's buffer (little-endian, row-major); valid until fsdp_st_close. Aligned to
     * the element size when fsdp_st_open reads a file laid out as fsdp_st_write lays it out;
     * other files (or buffers) may leave it unaligned: memcpy before typed access. */
    const void *data;
} fsdp_st_tensor_t;

typedef struct fsdp_st_file fsdp_st_file_t;

/* Maps the file read-only (no copy; pages load on first touch). A missing file, a directory or
 * a failed read is FSDP_ERR_IO; a file shorter than 8 bytes (an empty one too) or breaking any
 * other rule is FSDP_ERR_FORMAT. Another process truncating the file while it is open makes
 * access to the lost pages fault (SIGBUS), as with any mapping: replace files by rename, as
 * fsdp_st_write does. An open file is read-only: any number of threads may read it. */
FSDP_API fsdp_status_t fsdp_st_open(const char *path, fsdp_st_file_t **file_p);
/* Accepts NULL. */
FSDP_API void fsdp_st_close(fsdp_st_file_t *file);

FSDP_API int fsdp_st_num_tensors(const fsdp_st_file_t *file);
/* In file (offset) order; NULL out of range. The format allows an empty name: a reader
 * accepts it, the writer refuses it. */
FSDP_API const fsdp_st_tensor_t *fsdp_st_tensor_at(const fsdp_st_file_t *file, int index);
/* NULL if absent. */
FSDP_API const fsdp_st_tensor_t *fsdp_st_find(const fsdp_st_file_t *file, const char *name);
/* FSDP_OK when every element of a floating-point tensor (F64, F32, F16, BF16) is finite, and
 * for other dtypes; else FSDP_ERR_FORMAT with one line naming `label` (the file), the tensor and
 * the first NaN or Inf. Loaders of weights and data call it: a NaN would only surface as a NaN
 * loss steps later. */
FSDP_API fsdp_status_t fsdp_st_check_finite(const fsdp_st_tensor_t *t, const char *label);

typedef struct fsdp_st_entry {
    const char *name;
    const char *dtype;
    int ndim;
    const int64_t *shape;
    const void *data; /* product(shape) * bits / 8 bytes */
} fsdp_st_entry_t;

/* Writes `n` tensors and `nmeta` metadata pairs (meta[2i] = key, meta[2i+1] = value).
 *
 * Inputs are checked before any file is touched (FSDP_ERR_INVALID_PARAM): names non-empty,
 * unique, UTF-8 and not "__metadata__"; known dtypes; 0..FSDP_ST_MAX_DIMS non-negative dims
 * whose bits fill whole bytes; data non-NULL unless the tensor is empty; metadata keys unique,
 * keys and values UTF-8. Tensors go by descending element alignment, then by name (strcmp).
 * The file is written as `<path>.tmp.<pid>`, fsynced and renamed over `path`; on failure
 * (FSDP_ERR_IO) the temporary file is removed and an existing `path` is untouched. Only a
 * failure to fsync the directory after the rename returns FSDP_ERR_IO with the new file in
 * place. Concurrent writers of the same path in one process are not supported. */
FSDP_API fsdp_status_t fsdp_st_write(const char *path, const fsdp_st_entry_t *entries, int n,
                                     const char *const *meta, int nmeta);

#ifdef __cplusplus
}
#endif
#endif
