/* The caching allocator's host structures, shared by memory.c (the policy) and memory_check.c
 * (snapshot and invariant checks). Never installed.
 *
 * A segment is one backend allocation; its blocks tile it in address order through prev/next.
 * Addresses are segment base + offset, computed and never dereferenced (shape mode hands out
 * fake ones). A free block sits in the AVL tree of its stream and pool; a live one in the
 * address map; a pending one (freed after record_stream) only in the event queues.
 */
#ifndef FSDP_LIB_MEMORY_IMPL_H
#define FSDP_LIB_MEMORY_IMPL_H

#include <fsdp/memory.h>

#include "alloc/alloc_hidden.h"
#include "alloc/mem_index.h"
#include "trace/trace_hidden.h"

typedef struct mem_segment mem_segment_t;

typedef struct mem_block {
    fsdp_atree_node_t node; /* while free: key (size, segment seq, offset) in its pool tree */
    mem_segment_t *seg;
    struct mem_block *prev, *next; /* neighbours in the segment, by address */
    size_t offset;                 /* from the segment base */
    size_t size;
    size_t requested; /* unrounded request, while allocated or pending */
    fsdp_mem_category_t category;
    fsdp_mem_block_state_t state;
    int event_count;      /* pending: events not yet seen complete */
    int n_uses, cap_uses; /* recorded streams other than the allocation stream */
    fsdp_stream_t **uses;
} mem_block_t;

struct mem_segment {
    uintptr_t base;
    size_t size;
    uint64_t seq;         /* creation number: orders equal-size free blocks deterministically */
    fsdp_mem_pool_t pool; /* SMALL or LARGE */
    int sidx;             /* index of its stream in fsdp_mem.streams */
    mem_block_t *head;    /* the block at offset 0 */
    mem_segment_t *prev, *next; /* all segments, in creation order */
};

typedef struct mem_event_entry {
    fsdp_event_t *event;
    mem_block_t *block;
} mem_event_entry_t;

/* What the allocator keeps per stream: its free blocks, per pool, and the events recorded on
 * it for blocks freed while in use there (a FIFO, polled in order). */
typedef struct mem_stream {
    fsdp_stream_t *stream;
    fsdp_atree_t free_tree[FSDP_MEM_POOL_COUNT]; /* [SMALL] and [LARGE] */
    /* blocks of this stream's segments, free or not, per pool: the most distinct free sizes
     * its tree can hold, whose room fsdp_mem_alloc reserves */
    size_t n_blocks[FSDP_MEM_POOL_COUNT];
    mem_event_entry_t *events;
    size_t ev_head, ev_tail, ev_cap;
} mem_stream_t;

struct fsdp_mem {
    fsdp_dev_t *dev;
    size_t capacity;
    const char *ctx_unit;  /* who is asking, for the out-of-memory report */
    const char *ctx_phase;
    fsdp_mem_stats_t stats; /* the flat shorthands are filled in by fsdp_mem_get_stats */
    mem_stream_t *streams;
    int n_streams, cap_streams;
    mem_segment_t *seg_first, *seg_last;
    uint64_t next_seq;
    fsdp_ptrmap_t live; /* address -> allocated block */
    size_t n_pending;   /* blocks waiting on events */
    /* recycled host structures */
    mem_block_t *spare_blocks; /* linked through next */
    size_t n_spare_blocks;
    void **slabs;
    size_t n_slabs, cap_slabs;
    fsdp_event_t **spare_events;
    size_t n_spare_events, cap_spare_events;
};

static inline uintptr_t mem_block_addr(const mem_block_t *b)
{
    return b->seg->base + b->offset;
}

static inline int mem_block_is_split(const mem_block_t *b)
{
    return b->prev != NULL || b->next != NULL;
}

#endif
