/* Per-rank device memory accounting over the backend's raw segments.
 *
 * Requests are rounded to 512 bytes as PyTorch's caching allocator rounds them, so `allocated`
 * counts what the allocator would. Each live block is tagged with its category and stream.
 * This version takes one backend segment per block (reserved == allocated); the caching policy
 * (pools, splitting, stream-aware reuse) replaces the segment step without changing the API.
 */
#include <fsdp/log.h>
#include <fsdp/memory.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct mem_block {
    void *ptr; /* NULL marks an empty slot, (void *)1 a tombstone */
    size_t size;
    size_t requested;
    fsdp_mem_category_t category;
    fsdp_stream_t *stream;
} mem_block_t;

struct fsdp_mem {
    fsdp_dev_t *dev;
    size_t capacity;
    fsdp_mem_stats_t stats;
    mem_block_t *table; /* open addressing on the pointer */
    size_t table_size;  /* power of two */
    size_t table_used;  /* live + tombstones */
};

#define MEM_TOMBSTONE ((void *)1)

static size_t ptr_hash(const void *p)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x;
}

size_t fsdp_mem_round_size(size_t bytes)
{
    if (bytes < FSDP_MEM_MIN_BLOCK)
        return FSDP_MEM_MIN_BLOCK;
    return (bytes + FSDP_MEM_MIN_BLOCK - 1) / FSDP_MEM_MIN_BLOCK * FSDP_MEM_MIN_BLOCK;
}

fsdp_status_t fsdp_mem_create(fsdp_dev_t *dev, size_t capacity, fsdp_mem_t **mem_p)
{
    fsdp_mem_t *mem = calloc(1, sizeof(*mem));
    if (mem == NULL)
        return FSDP_ERR_NO_MEMORY;
    mem->table_size = 256;
    mem->table = calloc(mem->table_size, sizeof(*mem->table));
    if (mem->table == NULL) {
        free(mem);
        return FSDP_ERR_NO_MEMORY;
    }
    mem->dev = dev;
    mem->capacity = capacity;
    *mem_p = mem;
    return FSDP_OK;
}

void fsdp_mem_destroy(fsdp_mem_t *mem)
{
    if (mem == NULL)
        return;
    for (size_t i = 0; i < mem->table_size; i++) {
        mem_block_t *b = &mem->table[i];
        if (b->ptr != NULL && b->ptr != MEM_TOMBSTONE)
            mem->dev->ops->segment_free(mem->dev, FSDP_MEMKIND_DEVICE, b->ptr);
    }
    free(mem->table);
    free(mem);
}

static mem_block_t *table_find(fsdp_mem_t *mem, const void *ptr)
{
    size_t mask = mem->table_size - 1;
    for (size_t i = ptr_hash(ptr) & mask;; i = (i + 1) & mask) {
        mem_block_t *b = &mem->table[i];
        if (b->ptr == NULL)
            return NULL;
        if (b->ptr == ptr)
            return b;
    }
}

static fsdp_status_t table_grow(fsdp_mem_t *mem)
{
    size_t old_size = mem->table_size;
    mem_block_t *old = mem->table;
    size_t new_size = old_size * 2;
    mem_block_t *table = calloc(new_size, sizeof(*table));

    if (table == NULL)
        return FSDP_ERR_NO_MEMORY;
    mem->table = table;
    mem->table_size = new_size;
    mem->table_used = 0;
    for (size_t i = 0; i < old_size; i++) {
        if (old[i].ptr == NULL || old[i].ptr == MEM_TOMBSTONE)
            continue;
        size_t mask = new_size - 1, j = ptr_hash(old[i].ptr) & mask;
        while (table[j].ptr != NULL)
            j = (j + 1) & mask;
        table[j] = old[i];
        mem->table_used++;
    }
    free(old);
    return FSDP_OK;
}

static fsdp_status_t table_insert(fsdp_mem_t *mem, const mem_block_t *blk)
{
    if ((mem->table_used + 1) * 2 > mem->table_size) {
        fsdp_status_t status = table_grow(mem);
        if (status != FSDP_OK)
            return status;
    }
    size_t mask = mem->table_size - 1, i = ptr_hash(blk->ptr) & mask;
    while (mem->table[i].ptr != NULL && mem->table[i].ptr != MEM_TOMBSTONE)
        i = (i + 1) & mask;
    if (mem->table[i].ptr == NULL)
        mem->table_used++;
    mem->table[i] = *blk;
    return FSDP_OK;
}

static void log_oom(const fsdp_mem_t *mem, size_t rounded, fsdp_mem_category_t category)
{
    char breakdown[512];
    size_t off = 0;

    breakdown[0] = '\0';
    for (int c = 0; c < FSDP_MEM_CATEGORY_COUNT && off < sizeof(breakdown); c++) {
        if (mem->stats.by_category[c] == 0)
            continue;
        off += (size_t)snprintf(breakdown + off, sizeof(breakdown) - off, "%s%s %zu",
                                off ? ", " : "", fsdp_mem_category_name((fsdp_mem_category_t)c),
                                mem->stats.by_category[c]);
    }
    fsdp_error("rank %d: out of device memory: tried to allocate %zu bytes (%s) with %zu of %zu "
               "bytes allocated (%s)",
               mem->dev->rank, rounded, fsdp_mem_category_name(category), mem->stats.allocated,
               mem->capacity, off ? breakdown : "nothing");
}

fsdp_status_t fsdp_mem_alloc(fsdp_mem_t *mem, size_t bytes, fsdp_mem_category_t category,
                             fsdp_stream_t *stream, void **ptr_p)
{
    fsdp_mem_stats_t *st = &mem->stats;
    mem_block_t blk;
    fsdp_status_t status;
    size_t rounded;

    if ((unsigned)category >= FSDP_MEM_CATEGORY_COUNT) {
        fsdp_error("invalid memory category %d", (int)category);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (bytes == 0) {
        *ptr_p = NULL;
        return FSDP_OK;
    }
    rounded = fsdp_mem_round_size(bytes);
    if (rounded < bytes || (mem->capacity != 0 && rounded > mem->capacity - st->allocated)) {
        st->num_ooms++;
        log_oom(mem, rounded, category);
        return FSDP_ERR_OUT_OF_MEMORY;
    }
    blk.size = rounded;
    blk.requested = bytes;
    blk.category = category;
    blk.stream = stream;
    status = mem->dev->ops->segment_alloc(mem->dev, FSDP_MEMKIND_DEVICE, rounded, &blk.ptr);
    if (status != FSDP_OK)
        return status;
    status = table_insert(mem, &blk);
    if (status != FSDP_OK) {
        mem->dev->ops->segment_free(mem->dev, FSDP_MEMKIND_DEVICE, blk.ptr);
        return status;
    }

    st->num_allocs++;
    st->allocated += rounded;
    st->reserved += rounded;
    st->requested += bytes;
    st->by_category[category] += rounded;
    if (st->by_category[category] > st->peak_by_category[category])
        st->peak_by_category[category] = st->by_category[category];
    if (st->allocated > st->peak_allocated) {
        st->peak_allocated = st->allocated;
        memcpy(st->at_peak_by_category, st->by_category, sizeof(st->by_category));
    }
    if (st->reserved > st->peak_reserved)
        st->peak_reserved = st->reserved;
    *ptr_p = blk.ptr;
    return FSDP_OK;
}

void fsdp_mem_free(fsdp_mem_t *mem, void *ptr)
{
    mem_block_t *b;

    if (ptr == NULL)
        return;
    b = table_find(mem, ptr);
    if (b == NULL) {
        fsdp_error("rank %d: free of %p, which this allocator does not own", mem->dev->rank, ptr);
        return;
    }
    mem->stats.num_frees++;
    mem->stats.allocated -= b->size;
    mem->stats.reserved -= b->size;
    mem->stats.requested -= b->requested;
    mem->stats.by_category[b->category] -= b->size;
    mem->dev->ops->segment_free(mem->dev, FSDP_MEMKIND_DEVICE, ptr);
    b->ptr = MEM_TOMBSTONE;
}

fsdp_status_t fsdp_mem_record_stream(fsdp_mem_t *mem, void *ptr, fsdp_stream_t *stream)
{
    if (ptr == NULL)
        return FSDP_OK;
    if (table_find(mem, ptr) == NULL) {
        fsdp_error("rank %d: record_stream on %p, which this allocator does not own",
                   mem->dev->rank, ptr);
        return FSDP_ERR_INVALID_PARAM;
    }
    /* Segments are returned to the backend at free, and the sim executes eagerly, so there
     * is no reuse to delay yet; the caching policy honours this. */
    (void)stream;
    return FSDP_OK;
}

void fsdp_mem_get_stats(const fsdp_mem_t *mem, fsdp_mem_stats_t *stats_p)
{
    *stats_p = mem->stats;
}

void fsdp_mem_reset_peaks(fsdp_mem_t *mem)
{
    fsdp_mem_stats_t *st = &mem->stats;
    st->peak_allocated = st->allocated;
    st->peak_reserved = st->reserved;
    memcpy(st->peak_by_category, st->by_category, sizeof(st->by_category));
    memcpy(st->at_peak_by_category, st->by_category, sizeof(st->by_category));
}
