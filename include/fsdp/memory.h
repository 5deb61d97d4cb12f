/* libfsdp: device memory as the core sees it.
 *
 * Every allocation of the runtime and of the built-in models goes through a per-rank
 * fsdp_mem_t, which rounds requests as PyTorch's caching allocator does (multiples of 512
 * bytes), tags each block with a category and a stream, and keeps current and peak statistics
 * per category. It runs over the backend's raw segments, so the sim and the gpu backends make
 * the same decisions and report the same `allocated` bytes.
 */
#ifndef FSDP_MEMORY_H
#define FSDP_MEMORY_H

#include <fsdp/backend.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FSDP_MEM_MIN_BLOCK 512u

typedef struct fsdp_mem fsdp_mem_t;

typedef struct fsdp_mem_stats {
    size_t allocated;      /* bytes of live blocks (rounded) */
    size_t peak_allocated; /* max of allocated since creation or the last reset */
    size_t reserved;       /* bytes of segments held from the backend */
    size_t peak_reserved;
    size_t requested;      /* bytes asked for (unrounded) */
    size_t by_category[FSDP_MEM_CATEGORY_COUNT];
    size_t peak_by_category[FSDP_MEM_CATEGORY_COUNT]; /* each category's own maximum */
    /* by_category at the moment of peak_allocated */
    size_t at_peak_by_category[FSDP_MEM_CATEGORY_COUNT];
    uint64_t num_allocs, num_frees, num_ooms;
} fsdp_mem_stats_t;

/* capacity: bytes the device may hold (0 = unlimited). */
fsdp_status_t fsdp_mem_create(fsdp_dev_t *dev, size_t capacity, fsdp_mem_t **mem_p);
void fsdp_mem_destroy(fsdp_mem_t *mem);

/* Requests of 0 bytes return NULL with FSDP_OK. Going past the capacity returns
 * FSDP_ERR_OUT_OF_MEMORY and logs the breakdown by category. */
fsdp_status_t fsdp_mem_alloc(fsdp_mem_t *mem, size_t bytes, fsdp_mem_category_t category,
                             fsdp_stream_t *stream, void **ptr_p);
/* Accepts NULL. */
void fsdp_mem_free(fsdp_mem_t *mem, void *ptr);
/* The block may still be in use by work on `stream` issued before its free. */
fsdp_status_t fsdp_mem_record_stream(fsdp_mem_t *mem, void *ptr, fsdp_stream_t *stream);

void fsdp_mem_get_stats(const fsdp_mem_t *mem, fsdp_mem_stats_t *stats_p);
void fsdp_mem_reset_peaks(fsdp_mem_t *mem);
/* Request size rounded as the allocator rounds it. */
size_t fsdp_mem_round_size(size_t bytes);

#ifdef __cplusplus
}
#endif
#endif
