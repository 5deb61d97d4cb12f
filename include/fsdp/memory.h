/* libfsdp: device memory as the core sees it.
 *
 * Every allocation of the runtime and of the built-in models goes through a per-rank fsdp_mem_t:
 * PyTorch's CUDA caching allocator policy (docs/allocator.md part 1) over the backend's raw
 * segments, so the sim and the gpu backends make the same decisions and report the same
 * `allocated` bytes. Requests are rounded to 512 bytes; requests of up to 1 MiB come from 2 MiB
 * segments of the small pool, larger ones from the large pool (20 MiB segments below 10 MiB, else
 * the request rounded up to 2 MiB); a free block is reused, best fit, only by requests on the
 * stream it was allocated on; blocks are split and merged inside a segment, and a plain free never
 * returns a segment to the backend. Each block is tagged with a category; statistics are kept as
 * torch.cuda.memory_stats() keeps them, plus per category.
 *
 * One fsdp_mem_t belongs to one rank and is used by that rank's thread only.
 */
#ifndef FSDP_MEMORY_H
#define FSDP_MEMORY_H

#include <fsdp/api.h>

#include <fsdp/backend.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FSDP_MEM_MIN_BLOCK 512u                     /* kMinBlockSize: sizes are multiples */
#define FSDP_MEM_SMALL_SIZE ((size_t)1 << 20)       /* kSmallSize: largest small-pool request */
#define FSDP_MEM_SMALL_BUFFER ((size_t)2 << 20)     /* kSmallBuffer: small-pool segment */
#define FSDP_MEM_MIN_LARGE_ALLOC ((size_t)10 << 20) /* kMinLargeAlloc */
#define FSDP_MEM_LARGE_BUFFER ((size_t)20 << 20)    /* kLargeBuffer: segment below 10 MiB */
#define FSDP_MEM_ROUND_LARGE ((size_t)2 << 20)      /* kRoundLarge: larger segments round to it */

typedef struct fsdp_mem fsdp_mem_t;

/* Statistics are kept for all blocks and per pool, as memory_stats()'s "all", "small_pool"
 * and "large_pool"; a block's pool is the pool of its segment. */
typedef enum {
    FSDP_MEM_POOL_ALL = 0,
    FSDP_MEM_POOL_SMALL = 1,
    FSDP_MEM_POOL_LARGE = 2,
    FSDP_MEM_POOL_COUNT
} fsdp_mem_pool_t;

/* One statistic as PyTorch keeps it. */
typedef struct fsdp_mem_stat {
    uint64_t current;
    uint64_t peak;      /* max of current since creation or the last fsdp_mem_reset_peaks */
    uint64_t allocated; /* sum of all increases */
    uint64_t freed;     /* sum of all decreases */
} fsdp_mem_stat_t;

typedef struct fsdp_mem_pool_stats {
    fsdp_mem_stat_t allocation;      /* blocks the program holds */
    fsdp_mem_stat_t segment;         /* segments held from the backend */
    fsdp_mem_stat_t active;          /* allocated blocks plus freed ones waiting on recorded
                                      * streams (fsdp_mem_record_stream) */
    fsdp_mem_stat_t inactive_split;  /* free blocks of split segments (fragmentation) */
    fsdp_mem_stat_t allocated_bytes; /* sizes of allocated blocks: rounding and unsplit slack
                                      * included */
    fsdp_mem_stat_t reserved_bytes;  /* sizes of segments */
    fsdp_mem_stat_t active_bytes;
    fsdp_mem_stat_t inactive_split_bytes;
    fsdp_mem_stat_t requested_bytes; /* unrounded sizes asked for, of active blocks */
} fsdp_mem_pool_stats_t;

typedef struct fsdp_mem_stats {
    /* Shorthands of pool[FSDP_MEM_POOL_ALL]. */
    size_t allocated;      /* allocated_bytes.current */
    size_t peak_allocated; /* allocated_bytes.peak */
    size_t reserved;       /* reserved_bytes.current */
    size_t peak_reserved;  /* reserved_bytes.peak */
    size_t requested;      /* requested_bytes.current */
    /* Allocated bytes per category (a block's category is the one it was allocated with). */
    size_t by_category[FSDP_MEM_CATEGORY_COUNT];
    size_t peak_by_category[FSDP_MEM_CATEGORY_COUNT]; /* each category's own maximum */
    /* by_category at the moment of peak_allocated */
    size_t at_peak_by_category[FSDP_MEM_CATEGORY_COUNT];
    uint64_t num_allocs, num_frees, num_ooms;

    fsdp_mem_pool_stats_t pool[FSDP_MEM_POOL_COUNT];
    uint64_t num_alloc_retries;    /* allocations retried after releasing the cache */
    uint64_t num_sync_all_streams; /* releases of the cache that waited on every event */
    uint64_t num_device_alloc;     /* segments taken from the backend */
    uint64_t num_device_free;      /* segments returned to the backend */
} fsdp_mem_stats_t;

/* Requests of 0 bytes return NULL with FSDP_OK. A NULL stream is the compute stream. When no
 * segment can be had, the cached free segments are released and the allocation retried once;
 * failing again returns FSDP_ERR_OUT_OF_MEMORY and logs the request and the breakdown of
 * allocated bytes by category. */
FSDP_API fsdp_status_t fsdp_mem_alloc(fsdp_mem_t *mem, size_t bytes, fsdp_mem_category_t category,
                                      fsdp_stream_t *stream, void **ptr_p);
/* Accepts NULL. The block becomes reusable at once by its stream, or, after
 * fsdp_mem_record_stream, at the first allocation after the recorded streams pass the free. */
FSDP_API void fsdp_mem_free(fsdp_mem_t *mem, void *ptr);
/* The block may still be in use by work on `stream` issued before its free. */
FSDP_API fsdp_status_t fsdp_mem_record_stream(fsdp_mem_t *mem, void *ptr, fsdp_stream_t *stream);

FSDP_API void fsdp_mem_get_stats(const fsdp_mem_t *mem, fsdp_mem_stats_t *stats_p);
/* Every peak becomes its current value (reset_peak_memory_stats). */
FSDP_API void fsdp_mem_reset_peaks(fsdp_mem_t *mem);

/* ---- introspection (memory_snapshot) ---- */

typedef enum {
    FSDP_MEM_BLOCK_FREE = 0,      /* in the pool, reusable by its stream */
    FSDP_MEM_BLOCK_ALLOCATED = 1, /* held by the program */
    FSDP_MEM_BLOCK_PENDING = 2    /* freed, waiting for recorded streams */
} fsdp_mem_block_state_t;

typedef struct fsdp_mem_segment_info {
    void *base;
    size_t size;
    fsdp_stream_t *stream; /* the stream its blocks are reusable by */
    fsdp_mem_pool_t pool;
    size_t n_blocks;
    size_t allocated_bytes;
    size_t active_bytes;
} fsdp_mem_segment_info_t;

typedef struct fsdp_mem_block_info {
    void *ptr;
    size_t size;
    size_t requested; /* 0 when free */
    fsdp_mem_block_state_t state;
    fsdp_mem_category_t category; /* meaningless when free */
} fsdp_mem_block_info_t;

typedef void (*fsdp_mem_visit_func_t)(const fsdp_mem_segment_info_t *seg,
                                      const fsdp_mem_block_info_t *block, void *arg);

#ifdef __cplusplus
}
#endif
#endif
