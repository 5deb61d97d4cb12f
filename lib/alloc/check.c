/* The caching allocator seen from outside: a snapshot of segments and blocks (as
 * torch.cuda.memory_snapshot) and a check of its invariants against its own statistics. */
#include <fsdp/log.h>

#include <string.h>

#include "alloc/alloc_int.h"

static void segment_info(const mem_segment_t *seg, const fsdp_mem_t *mem,
                         fsdp_mem_segment_info_t *info)
{
    memset(info, 0, sizeof(*info));
    info->base = (void *)seg->base;
    info->size = seg->size;
    info->stream = mem->streams[seg->sidx].stream;
    info->pool = seg->pool;
    for (const mem_block_t *b = seg->head; b != NULL; b = b->next) {
        info->n_blocks++;
        if (b->state == FSDP_MEM_BLOCK_ALLOCATED)
            info->allocated_bytes += b->size;
        if (b->state != FSDP_MEM_BLOCK_FREE)
            info->active_bytes += b->size;
    }
}

void fsdp_mem_snapshot(const fsdp_mem_t *mem, fsdp_mem_visit_func_t func, void *arg)
{
    for (const mem_segment_t *seg = mem->seg_first; seg != NULL; seg = seg->next) {
        fsdp_mem_segment_info_t info;

        segment_info(seg, mem, &info);
        for (const mem_block_t *b = seg->head; b != NULL; b = b->next) {
            fsdp_mem_block_info_t bi = {
                .ptr = (void *)mem_block_addr(b),
                .size = b->size,
                .requested = b->state != FSDP_MEM_BLOCK_FREE ? b->requested : 0,
                .state = b->state,
                .category = b->category,
            };
            func(&info, &bi, arg);
        }
    }
}

/* What the blocks say the statistics should be. */
typedef struct expect {
    uint64_t allocation, segment, active, inactive_split;
    uint64_t allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes, requested_bytes;
} expect_t;

typedef struct tree_count {
    const fsdp_mem_t *mem;
    int sidx;
    fsdp_mem_pool_t pool;
    size_t n;
    const char *error;
} tree_count_t;

static int count_node(fsdp_atree_node_t *node, void *arg)
{
    tree_count_t *tc = arg;
    const mem_block_t *b = (const mem_block_t *)((const char *)node - offsetof(mem_block_t, node));

    tc->n++;
    if (b->state != FSDP_MEM_BLOCK_FREE)
        tc->error = "a block in a free tree is not free";
    else if (b->seg->sidx != tc->sidx || b->seg->pool != tc->pool)
        tc->error = "a free block is in the tree of another stream or pool";
    else if (node->size != b->size || node->seq != b->seg->seq || node->offset != b->offset)
        tc->error = "a free block's tree key is stale";
    return tc->error != NULL;
}

static const char *check_stats(const fsdp_mem_pool_stats_t *p, const expect_t *e)
{
    if (p->allocation.current != e->allocation)
        return "allocation";
    if (p->segment.current != e->segment)
        return "segment";
    if (p->active.current != e->active)
        return "active";
    if (p->inactive_split.current != e->inactive_split)
        return "inactive_split";
    if (p->allocated_bytes.current != e->allocated_bytes)
        return "allocated_bytes";
    if (p->reserved_bytes.current != e->reserved_bytes)
        return "reserved_bytes";
    if (p->active_bytes.current != e->active_bytes)
        return "active_bytes";
    if (p->inactive_split_bytes.current != e->inactive_split_bytes)
        return "inactive_split_bytes";
    if (p->requested_bytes.current != e->requested_bytes)
        return "requested_bytes";
    return NULL;
}

static void add_block(expect_t *e, const mem_block_t *b)
{
    if (b->state == FSDP_MEM_BLOCK_ALLOCATED) {
        e->allocation++;
        e->allocated_bytes += b->size;
    }
    if (b->state != FSDP_MEM_BLOCK_FREE) {
        e->active++;
        e->active_bytes += b->size;
        e->requested_bytes += b->requested;
    } else if (mem_block_is_split(b)) {
        e->inactive_split++;
        e->inactive_split_bytes += b->size;
    }
}

static void sum_pools(expect_t e[FSDP_MEM_POOL_COUNT])
{
    const expect_t *s = &e[FSDP_MEM_POOL_SMALL], *l = &e[FSDP_MEM_POOL_LARGE];
    expect_t *a = &e[FSDP_MEM_POOL_ALL];

    a->allocation = s->allocation + l->allocation;
    a->segment = s->segment + l->segment;
    a->active = s->active + l->active;
    a->inactive_split = s->inactive_split + l->inactive_split;
    a->allocated_bytes = s->allocated_bytes + l->allocated_bytes;
    a->reserved_bytes = s->reserved_bytes + l->reserved_bytes;
    a->active_bytes = s->active_bytes + l->active_bytes;
    a->inactive_split_bytes = s->inactive_split_bytes + l->inactive_split_bytes;
    a->requested_bytes = s->requested_bytes + l->requested_bytes;
}

static const char *check_blocks(const fsdp_mem_t *mem, expect_t expect[FSDP_MEM_POOL_COUNT],
                                size_t by_category[FSDP_MEM_CATEGORY_COUNT], size_t *n_free_p,
                                size_t *n_pending_p)
{
    for (const mem_segment_t *seg = mem->seg_first; seg != NULL; seg = seg->next) {
        size_t offset = 0;

        if (seg->sidx < 0 || seg->sidx >= mem->n_streams)
            return "a segment names no known stream";
        if (seg->head == NULL || seg->head->prev != NULL)
            return "a segment's head is not its first block";
        if ((seg->next == NULL) != (seg == mem->seg_last))
            return "the segment list is broken";
        expect[seg->pool].segment++;
        expect[seg->pool].reserved_bytes += seg->size;
        for (const mem_block_t *b = seg->head; b != NULL; b = b->next) {
            if (b->seg != seg || b->offset != offset || b->size == 0 ||
                (b->next != NULL && b->next->prev != b))
                return "the blocks of a segment do not tile it";
            if (b->size % FSDP_MEM_MIN_BLOCK != 0)
                return "a block size is not a multiple of 512";
            offset += b->size;
            if (b->state == FSDP_MEM_BLOCK_FREE && b->next != NULL &&
                b->next->state == FSDP_MEM_BLOCK_FREE)
                return "two free neighbours were not merged";
            if (b->state == FSDP_MEM_BLOCK_ALLOCATED) {
                if (fsdp_ptrmap_get(&mem->live, mem_block_addr(b)) != b)
                    return "an allocated block is missing from the address map";
                by_category[b->category] += b->size;
            } else if (fsdp_ptrmap_get(&mem->live, mem_block_addr(b)) != NULL) {
                return "a block that is not allocated is in the address map";
            }
            if (b->state == FSDP_MEM_BLOCK_FREE)
                (*n_free_p)++;
            if (b->state == FSDP_MEM_BLOCK_PENDING) {
                (*n_pending_p)++;
                if (b->event_count <= 0)
                    return "a pending block waits on no event";
            }
            add_block(&expect[seg->pool], b);
        }
        if (offset != seg->size)
            return "the blocks of a segment do not add up to its size";
    }
    return NULL;
}

fsdp_status_t fsdp_mem_check(const fsdp_mem_t *mem)
{
    expect_t expect[FSDP_MEM_POOL_COUNT];
    size_t by_category[FSDP_MEM_CATEGORY_COUNT];
    size_t n_free = 0, n_pending = 0, n_tree = 0, n_events = 0;
    const char *what;

    memset(expect, 0, sizeof(expect));
    memset(by_category, 0, sizeof(by_category));
    what = check_blocks(mem, expect, by_category, &n_free, &n_pending);
    if (what != NULL)
        goto fail;
    for (int i = 0; i < mem->n_streams; i++) {
        const mem_stream_t *s = &mem->streams[i];

        for (int p = FSDP_MEM_POOL_SMALL; p <= FSDP_MEM_POOL_LARGE; p++) {
            tree_count_t tc = {.mem = mem, .sidx = i, .pool = (fsdp_mem_pool_t)p};

            tc.error = fsdp_atree_check(&s->free_tree[p]);
            if (tc.error == NULL)
                fsdp_atree_walk(&s->free_tree[p], count_node, &tc);
            if (tc.error == NULL && s->free_tree[p].cap_sizes < s->n_blocks[p])
                tc.error = "a free tree has less room for sizes than its stream has blocks";
            if (tc.error != NULL) {
                what = tc.error;
                goto fail;
            }
            n_tree += tc.n;
        }
        for (size_t j = s->ev_head; j < s->ev_tail; j++) {
            if (s->events[j].block->state != FSDP_MEM_BLOCK_PENDING) {
                what = "an event waits for a block that is not pending";
                goto fail;
            }
            n_events++;
        }
    }
    if (n_tree != n_free) {
        what = "the free trees do not hold exactly the free blocks";
        goto fail;
    }
    if (n_pending != mem->n_pending || n_events < n_pending) {
        what = "the pending blocks and their events disagree";
        goto fail;
    }
    sum_pools(expect);
    if (mem->live.count != expect[FSDP_MEM_POOL_ALL].allocation) {
        what = "the address map holds blocks that are not allocated";
        goto fail;
    }
    for (int p = 0; p < FSDP_MEM_POOL_COUNT; p++) {
        what = check_stats(&mem->stats.pool[p], &expect[p]);
        if (what != NULL) {
            fsdp_error("rank %d: allocator check failed: statistic %s of pool %d disagrees with "
                       "the blocks",
                       mem->dev->rank, what, p);
            return FSDP_ERR_INTERNAL;
        }
    }
    if (memcmp(by_category, mem->stats.by_category, sizeof(by_category)) != 0) {
        what = "allocated bytes by category disagree with the blocks";
        goto fail;
    }
    if (mem->capacity != 0 && expect[FSDP_MEM_POOL_ALL].reserved_bytes > mem->capacity) {
        what = "reserved bytes exceed the capacity";
        goto fail;
    }
    return FSDP_OK;

fail:
    fsdp_error("rank %d: allocator check failed: %s", mem->dev->rank, what);
    return FSDP_ERR_INTERNAL;
}
