/* The caching-allocator policy: PyTorch's CUDA caching allocator (docs/allocator.md part 1,
 * whose section numbers the comments below cite) over the backend's raw segments, one
 * fsdp_mem_t per rank.
 *
 * malloc: process completed record_stream events (1.6); round to 512 and pick the pool (1.2);
 * best fit among the free blocks of the requesting stream (1.3); else a new segment, else
 * release every cached unsplit free segment and retry once, else out of memory (1.7); split the
 * block when enough remains (1.4). free: merge with free neighbours and go back to the pool, or
 * wait for the events of the streams recorded on the block (1.5, 1.6). Segments go back to the
 * backend only when the cache is released (OOM path, fsdp_mem_empty_cache).
 *
 * Everything is host bookkeeping; a block's address is its segment's base plus its offset, so
 * shape mode's fake addresses work unchanged. Equal-size free blocks are ordered by segment
 * creation, then offset, rather than by raw address: the same as PyTorch wherever the backend
 * hands out rising addresses (the sim's shape mode does), and a decision that does not depend
 * on where malloc or cudaMalloc happened to place a segment, so runs are reproducible.
 */
#include <fsdp/log.h>
#include <fsdp/trace.h>

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc_int.h"

#define BLOCKS_PER_SLAB 256

/* ---- statistics ------------------------------------------------------------------------ */

static void stat_inc(fsdp_mem_stat_t *s, uint64_t n)
{
    s->current += n;
    s->allocated += n;
    if (s->current > s->peak)
        s->peak = s->current;
}

static void stat_dec(fsdp_mem_stat_t *s, uint64_t n)
{
    s->current -= n;
    s->freed += n;
}

/* Every statistic moves for "all" and for the block's pool. */
#define STAT_INC(mem, pool_, field, n)                                                             \
    do {                                                                                           \
        stat_inc(&(mem)->stats.pool[FSDP_MEM_POOL_ALL].field, (n));                                \
        stat_inc(&(mem)->stats.pool[(pool_)].field, (n));                                          \
    } while (0)
#define STAT_DEC(mem, pool_, field, n)                                                             \
    do {                                                                                           \
        stat_dec(&(mem)->stats.pool[FSDP_MEM_POOL_ALL].field, (n));                                \
        stat_dec(&(mem)->stats.pool[(pool_)].field, (n));                                          \
    } while (0)

/* ---- sizes ----------------------------------------------------------------------------- */

size_t fsdp_mem_round_size(size_t bytes)
{
    if (bytes < FSDP_MEM_MIN_BLOCK)
        return FSDP_MEM_MIN_BLOCK;
    if (bytes > SIZE_MAX - (FSDP_MEM_MIN_BLOCK - 1))
        return 0;
    return (bytes + FSDP_MEM_MIN_BLOCK - 1) / FSDP_MEM_MIN_BLOCK * FSDP_MEM_MIN_BLOCK;
}

static fsdp_mem_pool_t pool_of(size_t rounded)
{
    return rounded <= FSDP_MEM_SMALL_SIZE ? FSDP_MEM_POOL_SMALL : FSDP_MEM_POOL_LARGE;
}

/* The size of a new segment for a request (1.2.3); 0 when none can be that large. */
static size_t segment_size(size_t rounded)
{
    if (rounded == 0)
        return 0;
    if (rounded <= FSDP_MEM_SMALL_SIZE)
        return FSDP_MEM_SMALL_BUFFER;
    if (rounded < FSDP_MEM_MIN_LARGE_ALLOC)
        return FSDP_MEM_LARGE_BUFFER;
    if (rounded > SIZE_MAX - (FSDP_MEM_ROUND_LARGE - 1))
        return 0;
    return (rounded + FSDP_MEM_ROUND_LARGE - 1) / FSDP_MEM_ROUND_LARGE * FSDP_MEM_ROUND_LARGE;
}

/* 1.4: small pool splits when at least one minimal block remains (>=), the large pool only
 * when more than 1 MiB remains (>), so large blocks keep up to 1 MiB of slack. */
static int should_split(fsdp_mem_pool_t pool, size_t remaining)
{
    if (pool == FSDP_MEM_POOL_SMALL)
        return remaining >= FSDP_MEM_MIN_BLOCK;
    return remaining > FSDP_MEM_SMALL_SIZE;
}

/* ---- host structures ------------------------------------------------------------------- */

static fsdp_status_t reserve_blocks(fsdp_mem_t *mem, size_t n)
{
    while (mem->n_spare_blocks < n) {
        mem_block_t *slab;

        if (mem->n_slabs == mem->cap_slabs) {
            size_t cap = mem->cap_slabs ? mem->cap_slabs * 2 : 16;
            void **slabs = realloc(mem->slabs, cap * sizeof(*slabs));
            if (slabs == NULL)
                return FSDP_ERR_NO_MEMORY;
            mem->slabs = slabs;
            mem->cap_slabs = cap;
        }
        slab = calloc(BLOCKS_PER_SLAB, sizeof(*slab));
        if (slab == NULL)
            return FSDP_ERR_NO_MEMORY;
        mem->slabs[mem->n_slabs++] = slab;
        for (size_t i = 0; i < BLOCKS_PER_SLAB; i++) {
            slab[i].next = mem->spare_blocks;
            mem->spare_blocks = &slab[i];
        }
        mem->n_spare_blocks += BLOCKS_PER_SLAB;
    }
    return FSDP_OK;
}

/* Callers reserve first, so this never fails. The stream-use buffer is kept for reuse. */
static mem_block_t *block_get(fsdp_mem_t *mem, mem_segment_t *seg, size_t offset, size_t size)
{
    mem_block_t *b = mem->spare_blocks;
    fsdp_stream_t **uses = b->uses;
    int cap_uses = b->cap_uses;

    mem->spare_blocks = b->next;
    mem->n_spare_blocks--;
    mem->streams[seg->sidx].n_blocks[seg->pool]++;
    memset(b, 0, sizeof(*b));
    b->uses = uses;
    b->cap_uses = cap_uses;
    b->seg = seg;
    b->offset = offset;
    b->size = size;
    b->state = FSDP_MEM_BLOCK_FREE;
    return b;
}

static void block_put(fsdp_mem_t *mem, mem_block_t *b)
{
    mem->streams[b->seg->sidx].n_blocks[b->seg->pool]--;
    b->next = mem->spare_blocks;
    mem->spare_blocks = b;
    mem->n_spare_blocks++;
}

static fsdp_status_t event_get(fsdp_mem_t *mem, fsdp_event_t **event_p)
{
    if (mem->n_spare_events > 0) {
        *event_p = mem->spare_events[--mem->n_spare_events];
        return FSDP_OK;
    }
    return fsdp_dev_event_create(mem->dev, event_p);
}

static void event_put(fsdp_mem_t *mem, fsdp_event_t *event)
{
    if (mem->n_spare_events == mem->cap_spare_events) {
        size_t cap = mem->cap_spare_events ? mem->cap_spare_events * 2 : 16;
        fsdp_event_t **events = realloc(mem->spare_events, cap * sizeof(*events));
        if (events == NULL) {
            fsdp_dev_event_destroy(mem->dev, event);
            return;
        }
        mem->spare_events = events;
        mem->cap_spare_events = cap;
    }
    mem->spare_events[mem->n_spare_events++] = event;
}

/* The index of stream's slot, made on first use. A rank has a handful of streams. */
static fsdp_status_t stream_slot(fsdp_mem_t *mem, fsdp_stream_t *stream, int *sidx_p)
{
    mem_stream_t *s;

    for (int i = 0; i < mem->n_streams; i++) {
        if (mem->streams[i].stream == stream) {
            *sidx_p = i;
            return FSDP_OK;
        }
    }
    if (mem->n_streams == mem->cap_streams) {
        int cap = mem->cap_streams ? mem->cap_streams * 2 : 8;
        mem_stream_t *streams = realloc(mem->streams, (size_t)cap * sizeof(*streams));
        if (streams == NULL)
            return FSDP_ERR_NO_MEMORY;
        mem->streams = streams;
        mem->cap_streams = cap;
    }
    s = &mem->streams[mem->n_streams];
    memset(s, 0, sizeof(*s));
    s->stream = stream;
    *sidx_p = mem->n_streams++;
    return FSDP_OK;
}

static fsdp_stream_t *normalize_stream(fsdp_mem_t *mem, fsdp_stream_t *stream)
{
    return stream != NULL ? stream : fsdp_dev_compute_stream(mem->dev);
}

/* ---- free pools ------------------------------------------------------------------------ */

static fsdp_atree_t *pool_tree(fsdp_mem_t *mem, const mem_block_t *b)
{
    return &mem->streams[b->seg->sidx].free_tree[b->seg->pool];
}

static void pool_insert(fsdp_mem_t *mem, mem_block_t *b)
{
    b->node.size = b->size;
    b->node.seq = b->seg->seq;
    b->node.offset = b->offset;
    fsdp_atree_insert(pool_tree(mem, b), &b->node);
}

static void pool_remove(fsdp_mem_t *mem, mem_block_t *b)
{
    fsdp_atree_remove(pool_tree(mem, b), &b->node);
}

/* 1.3: the smallest free block of the stream that fits, lowest position on ties. */
static mem_block_t *get_free_block(fsdp_mem_t *mem, int sidx, fsdp_mem_pool_t pool, size_t rounded)
{
    fsdp_atree_node_t *node = fsdp_atree_lower_bound(&mem->streams[sidx].free_tree[pool], rounded);
    mem_block_t *b;

    if (node == NULL)
        return NULL;
    b = (mem_block_t *)((char *)node - offsetof(mem_block_t, node));
    pool_remove(mem, b);
    return b;
}

/* Absorbs the free neighbour src into dst; returns the bytes absorbed. */
static size_t merge_blocks(fsdp_mem_t *mem, mem_block_t *dst, mem_block_t *src)
{
    size_t subsumed = src->size;

    pool_remove(mem, src);
    if (src == dst->prev) {
        dst->offset = src->offset;
        dst->prev = src->prev;
        if (dst->prev != NULL)
            dst->prev->next = dst;
        else
            dst->seg->head = dst;
    } else {
        dst->next = src->next;
        if (dst->next != NULL)
            dst->next->prev = dst;
    }
    dst->size += subsumed;
    block_put(mem, src);
    return subsumed;
}

/* 1.5 free_block: an allocated or pending block becomes free, merged with free neighbours. */
static void free_block(fsdp_mem_t *mem, mem_block_t *b)
{
    fsdp_mem_pool_t pool = b->seg->pool;
    mem_block_t *neighbours[2] = {b->prev, b->next};
    size_t orig_size = b->size, requested = b->requested;
    int64_t net_count = 0, net_bytes = 0;

    for (int i = 0; i < 2; i++) {
        if (neighbours[i] != NULL && neighbours[i]->state == FSDP_MEM_BLOCK_FREE) {
            net_bytes -= (int64_t)merge_blocks(mem, b, neighbours[i]);
            net_count--; /* the neighbour was a free piece of a split segment */
        }
    }
    b->state = FSDP_MEM_BLOCK_FREE;
    b->requested = 0;
    b->n_uses = 0;
    pool_insert(mem, b);
    if (mem_block_is_split(b)) {
        net_count++;
        net_bytes += (int64_t)b->size;
    }
    if (net_count > 0)
        STAT_INC(mem, pool, inactive_split, (uint64_t)net_count);
    else if (net_count < 0)
        STAT_DEC(mem, pool, inactive_split, (uint64_t)-net_count);
    if (net_bytes > 0)
        STAT_INC(mem, pool, inactive_split_bytes, (uint64_t)net_bytes);
    else if (net_bytes < 0)
        STAT_DEC(mem, pool, inactive_split_bytes, (uint64_t)-net_bytes);
    STAT_DEC(mem, pool, active, 1);
    STAT_DEC(mem, pool, active_bytes, orig_size);
    STAT_DEC(mem, pool, requested_bytes, requested);
}

/* ---- segments -------------------------------------------------------------------------- */

/* 1.7.4: a new segment holding one free block (not yet in the pool). Fails as cudaMalloc
 * would, without calling the backend, when it would take reserved past the capacity. */
static fsdp_status_t alloc_block(fsdp_mem_t *mem, int sidx, fsdp_mem_pool_t pool, size_t size,
                                 int is_retry, mem_block_t **block_p)
{
    size_t reserved = mem->stats.pool[FSDP_MEM_POOL_ALL].reserved_bytes.current;
    mem_segment_t *seg;
    fsdp_status_t status;
    void *ptr = NULL;

    if (is_retry)
        mem->stats.num_alloc_retries++;
    if (size == 0 || (mem->capacity != 0 && size > mem->capacity - reserved))
        return FSDP_ERR_OUT_OF_MEMORY;
    seg = calloc(1, sizeof(*seg));
    if (seg == NULL)
        return FSDP_ERR_NO_MEMORY;
    status = fsdp_dev_segment_alloc(mem->dev, FSDP_MEMKIND_DEVICE, size, &ptr);
    if (status == FSDP_OK && ptr == NULL) {
        fsdp_error("rank %d: the %s backend returned a NULL segment of %zu bytes", mem->dev->rank,
                   mem->dev->ops->name, size);
        status = FSDP_ERR_BACKEND;
    }
    if (status != FSDP_OK) {
        free(seg);
        return status;
    }
    seg->base = (uintptr_t)ptr;
    seg->size = size;
    seg->seq = mem->next_seq++;
    seg->pool = pool;
    seg->sidx = sidx;
    seg->prev = mem->seg_last;
    if (mem->seg_last != NULL)
        mem->seg_last->next = seg;
    else
        mem->seg_first = seg;
    mem->seg_last = seg;
    seg->head = block_get(mem, seg, 0, size);
    STAT_INC(mem, pool, segment, 1);
    STAT_INC(mem, pool, reserved_bytes, size);
    mem->stats.num_device_alloc++;
    *block_p = seg->head;
    return FSDP_OK;
}

static void release_segment(fsdp_mem_t *mem, mem_segment_t *seg)
{
    pool_remove(mem, seg->head);
    fsdp_dev_segment_free(mem->dev, FSDP_MEMKIND_DEVICE, (void *)seg->base);
    STAT_DEC(mem, seg->pool, segment, 1);
    STAT_DEC(mem, seg->pool, reserved_bytes, seg->size);
    mem->stats.num_device_free++;
    if (seg->prev != NULL)
        seg->prev->next = seg->next;
    else
        mem->seg_first = seg->next;
    if (seg->next != NULL)
        seg->next->prev = seg->prev;
    else
        mem->seg_last = seg->prev;
    block_put(mem, seg->head);
    free(seg);
}

/* ---- record_stream events -------------------------------------------------------------- */

static fsdp_status_t event_push(mem_stream_t *s, fsdp_event_t *event, mem_block_t *b)
{
    if (s->ev_tail == s->ev_cap) {
        if (s->ev_head > 0) {
            memmove(s->events, s->events + s->ev_head,
                    (s->ev_tail - s->ev_head) * sizeof(*s->events));
            s->ev_tail -= s->ev_head;
            s->ev_head = 0;
        } else {
            size_t cap = s->ev_cap ? s->ev_cap * 2 : 16;
            mem_event_entry_t *events = realloc(s->events, cap * sizeof(*events));
            if (events == NULL)
                return FSDP_ERR_NO_MEMORY;
            s->events = events;
            s->ev_cap = cap;
        }
    }
    s->events[s->ev_tail].event = event;
    s->events[s->ev_tail].block = b;
    s->ev_tail++;
    return FSDP_OK;
}

/* One event recorded on `stream` now, for b. */
static fsdp_status_t insert_event(fsdp_mem_t *mem, mem_block_t *b, fsdp_stream_t *stream)
{
    fsdp_event_t *event = NULL;
    fsdp_status_t status;
    int sidx;

    status = stream_slot(mem, stream, &sidx);
    if (status == FSDP_OK)
        status = event_get(mem, &event);
    if (status != FSDP_OK)
        return status;
    status = fsdp_dev_event_record(mem->dev, event, stream);
    if (status == FSDP_OK)
        status = event_push(&mem->streams[sidx], event, b);
    if (status != FSDP_OK) {
        fsdp_dev_event_destroy(mem->dev, event);
        return status;
    }
    b->event_count++;
    return FSDP_OK;
}

/* 1.6 insert_events: the freed block waits, still active, for every recorded stream to pass
 * this point. Without an event for a stream (host memory ran out), the host waits for the
 * stream instead, which is as safe. */
static void insert_events(fsdp_mem_t *mem, mem_block_t *b)
{
    for (int i = 0; i < b->n_uses; i++) {
        fsdp_status_t status = insert_event(mem, b, b->uses[i]);

        if (status == FSDP_OK)
            continue;
        fsdp_warn("rank %d: cannot record an event for a freed block (%s); waiting for stream "
                  "'%s' instead",
                  mem->dev->rank, fsdp_status_string(status), b->uses[i]->name);
        status = fsdp_dev_stream_synchronize(mem->dev, b->uses[i]);
        if (status != FSDP_OK)
            fsdp_error("rank %d: stream '%s' failed to synchronize (%s); reusing the block anyway",
                       mem->dev->rank, b->uses[i]->name, fsdp_status_string(status));
    }
    b->n_uses = 0;
    if (b->event_count == 0) {
        free_block(mem, b);
        return;
    }
    b->state = FSDP_MEM_BLOCK_PENDING;
    mem->n_pending++;
}

static void event_done(fsdp_mem_t *mem, mem_stream_t *s)
{
    mem_event_entry_t *e = &s->events[s->ev_head++];

    if (s->ev_head == s->ev_tail)
        s->ev_head = s->ev_tail = 0;
    event_put(mem, e->event);
    if (--e->block->event_count == 0) {
        mem->n_pending--;
        free_block(mem, e->block);
    }
}

/* 1.6 process_events: per stream, in order, until the first event not yet complete. */
static fsdp_status_t process_events(fsdp_mem_t *mem)
{
    for (int i = 0; i < mem->n_streams; i++) {
        mem_stream_t *s = &mem->streams[i];

        while (s->ev_head < s->ev_tail) {
            int done = 0;
            fsdp_status_t status =
                fsdp_dev_event_query(mem->dev, s->events[s->ev_head].event, &done);

            if (status != FSDP_OK) {
                fsdp_error("rank %d: querying a record_stream event on stream '%s' failed: %s",
                           mem->dev->rank, s->stream->name, fsdp_status_string(status));
                return status;
            }
            if (!done)
                break;
            event_done(mem, s);
        }
    }
    return FSDP_OK;
}

/* The host waits for every outstanding event, freeing their blocks. */
static fsdp_status_t synchronize_and_free_events(fsdp_mem_t *mem)
{
    mem->stats.num_sync_all_streams++;
    for (int i = 0; i < mem->n_streams; i++) {
        mem_stream_t *s = &mem->streams[i];

        while (s->ev_head < s->ev_tail) {
            fsdp_status_t status =
                fsdp_dev_event_synchronize(mem->dev, s->events[s->ev_head].event);

            if (status != FSDP_OK) {
                fsdp_error("rank %d: waiting for a record_stream event on stream '%s' failed: %s",
                           mem->dev->rank, s->stream->name, fsdp_status_string(status));
                return status;
            }
            event_done(mem, s);
        }
    }
    return FSDP_OK;
}

/* 1.7.6 release_cached_blocks: every free block that is a whole segment, on every stream and
 * in both pools, goes back to the backend. */
static fsdp_status_t release_cached_blocks(fsdp_mem_t *mem)
{
    fsdp_status_t status = synchronize_and_free_events(mem);
    mem_segment_t *seg, *next;

    if (status != FSDP_OK)
        return status;
    /* newest first: a backend that keeps its segments sorted by address (the simulator)
     * then mostly drops its last entry, not its first */
    for (seg = mem->seg_last; seg != NULL; seg = next) {
        next = seg->prev;
        if (seg->head->state == FSDP_MEM_BLOCK_FREE && seg->head->next == NULL)
            release_segment(mem, seg);
    }
    return FSDP_OK;
}

/* ---- create and destroy ---------------------------------------------------------------- */

fsdp_status_t fsdp_mem_create(fsdp_dev_t *dev, size_t capacity, fsdp_mem_t **mem_p)
{
    fsdp_mem_t *mem;

    if (dev == NULL || mem_p == NULL) {
        fsdp_error("fsdp_mem_create: dev and mem_p must not be NULL");
        return FSDP_ERR_INVALID_PARAM;
    }
    mem = calloc(1, sizeof(*mem));
    if (mem == NULL)
        return FSDP_ERR_NO_MEMORY;
    mem->dev = dev;
    mem->capacity = capacity;
    *mem_p = mem;
    return FSDP_OK;
}

void fsdp_mem_destroy(fsdp_mem_t *mem)
{
    mem_segment_t *seg, *next;

    if (mem == NULL)
        return;
    if (mem->stats.pool[FSDP_MEM_POOL_ALL].allocation.current != 0)
        fsdp_debug("rank %d: destroying the allocator with %llu live blocks", mem->dev->rank,
                   (unsigned long long)mem->stats.pool[FSDP_MEM_POOL_ALL].allocation.current);
    for (int i = 0; i < mem->n_streams; i++) {
        mem_stream_t *s = &mem->streams[i];
        for (size_t j = s->ev_head; j < s->ev_tail; j++)
            fsdp_dev_event_destroy(mem->dev, s->events[j].event);
        free(s->events);
        for (int p = 0; p < FSDP_MEM_POOL_COUNT; p++)
            fsdp_atree_destroy(&s->free_tree[p]);
    }
    free(mem->streams);
    for (size_t i = 0; i < mem->n_spare_events; i++)
        fsdp_dev_event_destroy(mem->dev, mem->spare_events[i]);
    free(mem->spare_events);
    /* newest first, as in release_cached_blocks: a backend that keeps its segments sorted by
     * address then drops its last entry each time, not its first */
    for (seg = mem->seg_last; seg != NULL; seg = next) {
        next = seg->prev;
        fsdp_dev_segment_free(mem->dev, FSDP_MEMKIND_DEVICE, (void *)seg->base);
        free(seg);
    }
    for (size_t i = 0; i < mem->n_slabs; i++) {
        mem_block_t *slab = mem->slabs[i];
        for (size_t j = 0; j < BLOCKS_PER_SLAB; j++)
            free(slab[j].uses);
        free(slab);
    }
    free(mem->slabs);
    fsdp_ptrmap_destroy(&mem->live);
    free(mem);
}

/* ---- malloc ---------------------------------------------------------------------------- */

static void log_oom(const fsdp_mem_t *mem, size_t bytes, size_t seg_size,
                    fsdp_mem_category_t category, const fsdp_stream_t *stream)
{
    const fsdp_mem_pool_stats_t *all = &mem->stats.pool[FSDP_MEM_POOL_ALL];
    char breakdown[512], capacity[48];
    size_t off = 0;

    breakdown[0] = '\0';
    for (int c = 0; c < FSDP_MEM_CATEGORY_COUNT; c++) {
        int n;

        if (mem->stats.by_category[c] == 0)
            continue;
        n = snprintf(breakdown + off, sizeof(breakdown) - off, "%s%s %zu", off ? ", " : "",
                     fsdp_mem_category_name((fsdp_mem_category_t)c), mem->stats.by_category[c]);
        if (n < 0 || (size_t)n >= sizeof(breakdown) - off)
            break;
        off += (size_t)n;
    }
    if (mem->capacity != 0)
        snprintf(capacity, sizeof(capacity), "%zu", mem->capacity);
    else
        snprintf(capacity, sizeof(capacity), "unlimited");
    fsdp_error("rank %d: out of device memory: tried to allocate %zu bytes (a segment for %zu "
               "bytes of %s on stream '%s', unit '%s', in %s); allocated %llu bytes (%s), "
               "reserved %llu, capacity %s",
               mem->dev->rank, seg_size != 0 ? seg_size : bytes, bytes,
               fsdp_mem_category_name(category), stream->name, mem->ctx_unit ? mem->ctx_unit : "-",
               mem->ctx_phase ? mem->ctx_phase : "setup",
               (unsigned long long)all->allocated_bytes.current, off ? breakdown : "nothing",
               (unsigned long long)all->reserved_bytes.current, capacity);
}

/* 1.4 alloc_found_block: the front of b goes to the caller, a large enough tail stays free. */
static void alloc_found_block(fsdp_mem_t *mem, mem_block_t *b, size_t rounded, size_t bytes,
                              fsdp_mem_category_t category)
{
    fsdp_mem_stats_t *st = &mem->stats;
    fsdp_mem_pool_t pool = b->seg->pool;
    size_t remaining = b->size - rounded;
    int already_split = mem_block_is_split(b);

    if (should_split(pool, remaining)) {
        mem_block_t *tail = block_get(mem, b->seg, b->offset + rounded, remaining);

        tail->prev = b;
        tail->next = b->next;
        if (b->next != NULL)
            b->next->prev = tail;
        b->next = tail;
        b->size = rounded;
        pool_insert(mem, tail);
        if (already_split) {
            /* a free piece of a split segment shrinks by what the caller takes */
            STAT_DEC(mem, pool, inactive_split_bytes, rounded);
        } else {
            STAT_INC(mem, pool, inactive_split_bytes, remaining);
            STAT_INC(mem, pool, inactive_split, 1);
        }
    } else if (already_split) {
        STAT_DEC(mem, pool, inactive_split_bytes, b->size);
        STAT_DEC(mem, pool, inactive_split, 1);
    }
    b->state = FSDP_MEM_BLOCK_ALLOCATED;
    b->requested = bytes;
    b->category = category;
    b->n_uses = 0;
    b->event_count = 0;

    st->num_allocs++;
    st->by_category[category] += b->size;
    if (st->by_category[category] > st->peak_by_category[category])
        st->peak_by_category[category] = st->by_category[category];
    STAT_INC(mem, pool, allocation, 1);
    if (st->pool[FSDP_MEM_POOL_ALL].allocated_bytes.current + b->size >
        st->pool[FSDP_MEM_POOL_ALL].allocated_bytes.peak)
        memcpy(st->at_peak_by_category, st->by_category, sizeof(st->by_category));
    STAT_INC(mem, pool, allocated_bytes, b->size);
    STAT_INC(mem, pool, active, 1);
    STAT_INC(mem, pool, active_bytes, b->size);
    STAT_INC(mem, pool, requested_bytes, bytes);
    fsdp_ptrmap_put(&mem->live, mem_block_addr(b), b);
}

/* An allocation or free in the rank's event trace, with the bytes held after it. */
static void trace_mem(fsdp_mem_t *mem, fsdp_event_kind_t kind, fsdp_mem_category_t category,
                      size_t size, fsdp_stream_t *stream)
{
    fsdp_trace_event_t ev;
    if (!fsdp_trace_enabled(mem->dev))
        return;
    fsdp_trace_event_init(&ev, kind, fsdp_mem_category_name(category));
    ev.stream = stream != NULL ? stream->name : NULL;
    ev.host_time = fsdp_dev_host_time(mem->dev);
    ev.start = ev.end = ev.host_time;
    ev.bytes = size;
    ev.count = 1;
    fsdp_trace_emit(mem->dev, &ev);
}

fsdp_status_t fsdp_mem_alloc(fsdp_mem_t *mem, size_t bytes, fsdp_mem_category_t category,
                             fsdp_stream_t *stream, void **ptr_p)
{
    mem_block_t *b = NULL;
    fsdp_mem_pool_t pool;
    size_t rounded, seg_size;
    fsdp_status_t status;
    int sidx;

    if (mem == NULL || ptr_p == NULL) {
        fsdp_error("fsdp_mem_alloc: mem and ptr_p must not be NULL");
        return FSDP_ERR_INVALID_PARAM;
    }
    if ((unsigned)category >= FSDP_MEM_CATEGORY_COUNT) {
        fsdp_error("rank %d: invalid memory category %d; allowed: 0..%d", mem->dev->rank,
                   (int)category, FSDP_MEM_CATEGORY_COUNT - 1);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (bytes == 0) {
        *ptr_p = NULL;
        return FSDP_OK;
    }
    stream = normalize_stream(mem, stream);
    status = process_events(mem);
    if (status != FSDP_OK)
        return status;
    rounded = fsdp_mem_round_size(bytes);
    pool = pool_of(rounded != 0 ? rounded : SIZE_MAX);
    seg_size = segment_size(rounded);

    /* host structures first, so that nothing below fails half-way for want of them */
    status = stream_slot(mem, stream, &sidx);
    if (status == FSDP_OK)
        status = reserve_blocks(mem, 2);
    /* up to two new blocks below (a segment, a split): each may bring a new free size */
    if (status == FSDP_OK)
        status = fsdp_atree_reserve(&mem->streams[sidx].free_tree[pool],
                                    mem->streams[sidx].n_blocks[pool] + 2);
    if (status == FSDP_OK)
        status = fsdp_ptrmap_reserve(&mem->live, mem->live.count + 1);
    if (status != FSDP_OK)
        return status;

    if (rounded != 0)
        b = get_free_block(mem, sidx, pool, rounded);
    if (b == NULL) {
        status = alloc_block(mem, sidx, pool, seg_size, 0, &b);
        if (status == FSDP_ERR_OUT_OF_MEMORY) {
            status = release_cached_blocks(mem);
            if (status == FSDP_OK)
                status = alloc_block(mem, sidx, pool, seg_size, 1, &b);
        }
        if (status == FSDP_ERR_OUT_OF_MEMORY) {
            mem->stats.num_ooms++;
            log_oom(mem, bytes, seg_size, category, stream);
        }
        if (status != FSDP_OK)
            return status;
    }
    alloc_found_block(mem, b, rounded, bytes, category);
    *ptr_p = (void *)mem_block_addr(b);
    trace_mem(mem, FSDP_EV_ALLOC, category, b->size, stream);
    return FSDP_OK;
}

/* ---- free and record_stream ------------------------------------------------------------ */

void fsdp_mem_free(fsdp_mem_t *mem, void *ptr)
{
    fsdp_mem_stats_t *st;
    fsdp_mem_pool_t pool;
    mem_block_t *b;

    if (ptr == NULL)
        return;
    b = fsdp_ptrmap_remove(&mem->live, (uintptr_t)ptr);
    if (b == NULL) {
        fsdp_error("rank %d: free of %p, which is not a live block of this allocator",
                   mem->dev->rank, ptr);
        return;
    }
    st = &mem->stats;
    pool = b->seg->pool;
    st->num_frees++;
    st->by_category[b->category] -= b->size;
    STAT_DEC(mem, pool, allocation, 1);
    STAT_DEC(mem, pool, allocated_bytes, b->size);
    trace_mem(mem, FSDP_EV_FREE, b->category, b->size, mem->streams[b->seg->sidx].stream);
    if (b->n_uses > 0)
        insert_events(mem, b);
    else
        free_block(mem, b);
}

fsdp_status_t fsdp_mem_record_stream(fsdp_mem_t *mem, void *ptr, fsdp_stream_t *stream)
{
    mem_block_t *b;

    if (ptr == NULL)
        return FSDP_OK;
    b = fsdp_ptrmap_get(&mem->live, (uintptr_t)ptr);
    if (b == NULL) {
        fsdp_error("rank %d: record_stream on %p, which is not a live block of this allocator",
                   mem->dev->rank, ptr);
        return FSDP_ERR_INVALID_PARAM;
    }
    stream = normalize_stream(mem, stream);
    /* uses on the allocation stream need no event: its own work is ordered */
    if (stream == mem->streams[b->seg->sidx].stream)
        return FSDP_OK;
    for (int i = 0; i < b->n_uses; i++) {
        if (b->uses[i] == stream)
            return FSDP_OK;
    }
    if (b->n_uses == b->cap_uses) {
        int cap = b->cap_uses ? b->cap_uses * 2 : 2;
        fsdp_stream_t **uses = realloc(b->uses, (size_t)cap * sizeof(*uses));
        if (uses == NULL)
            return FSDP_ERR_NO_MEMORY;
        b->uses = uses;
        b->cap_uses = cap;
    }
    b->uses[b->n_uses++] = stream;
    return FSDP_OK;
}

/* ---- statistics and cache -------------------------------------------------------------- */

void fsdp_mem_set_context(fsdp_mem_t *mem, const char *unit, const char *phase)
{
    mem->ctx_unit = unit;
    mem->ctx_phase = phase;
}

void fsdp_mem_current(const fsdp_mem_t *mem, size_t *allocated_p, size_t *reserved_p)
{
    const fsdp_mem_pool_stats_t *all = &mem->stats.pool[FSDP_MEM_POOL_ALL];
    *allocated_p = (size_t)all->allocated_bytes.current;
    *reserved_p = (size_t)all->reserved_bytes.current;
}

const fsdp_mem_pool_stats_t *fsdp_mem_counters(const fsdp_mem_t *mem)
{
    return &mem->stats.pool[FSDP_MEM_POOL_ALL];
}

void fsdp_mem_get_stats(const fsdp_mem_t *mem, fsdp_mem_stats_t *stats_p)
{
    const fsdp_mem_pool_stats_t *all = &mem->stats.pool[FSDP_MEM_POOL_ALL];

    *stats_p = mem->stats;
    stats_p->allocated = (size_t)all->allocated_bytes.current;
    stats_p->peak_allocated = (size_t)all->allocated_bytes.peak;
    stats_p->reserved = (size_t)all->reserved_bytes.current;
    stats_p->peak_reserved = (size_t)all->reserved_bytes.peak;
    stats_p->requested = (size_t)all->requested_bytes.current;
}

static void reset_pool_peaks(fsdp_mem_pool_stats_t *p)
{
    fsdp_mem_stat_t *stats[] = {
        &p->allocation,      &p->segment,        &p->active,       &p->inactive_split,
        &p->allocated_bytes, &p->reserved_bytes, &p->active_bytes, &p->inactive_split_bytes,
        &p->requested_bytes};

    for (size_t i = 0; i < sizeof(stats) / sizeof(stats[0]); i++)
        stats[i]->peak = stats[i]->current;
}

void fsdp_mem_reset_peaks(fsdp_mem_t *mem)
{
    fsdp_mem_stats_t *st = &mem->stats;

    for (int p = 0; p < FSDP_MEM_POOL_COUNT; p++)
        reset_pool_peaks(&st->pool[p]);
    memcpy(st->peak_by_category, st->by_category, sizeof(st->by_category));
    memcpy(st->at_peak_by_category, st->by_category, sizeof(st->by_category));
}

fsdp_status_t fsdp_mem_empty_cache(fsdp_mem_t *mem)
{
    return release_cached_blocks(mem);
}

size_t fsdp_mem_block_size(const fsdp_mem_t *mem, const void *ptr)
{
    const mem_block_t *b = fsdp_ptrmap_get(&mem->live, (uintptr_t)ptr);

    return b != NULL ? b->size : 0;
}
