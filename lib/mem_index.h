/* The caching allocator's host-side indexes (never installed).
 *
 * - fsdp_atree: an intrusive AVL tree of free blocks ordered by (size, seq, offset), where seq is
 *   the creation number of the block's segment and offset its place in it. Best fit is the first
 *   node at or after (size, 0, 0): O(log n) for insert, remove and lookup.
 * - fsdp_ptrmap: an open-addressing hash map from a block's address to its block, for free()
 *   and record_stream(); linear probing with backward-shift deletion, so no tombstones pile up
 *   over millions of malloc/free pairs.
 *
 * Both keep only host pointers and integers: a device address is a key, never dereferenced.
 */
#ifndef FSDP_LIB_MEM_INDEX_H
#define FSDP_LIB_MEM_INDEX_H

#include <fsdp/status.h>

#include <stddef.h>
#include <stdint.h>

typedef struct fsdp_atree_node {
    struct fsdp_atree_node *left, *right;
    size_t size; /* key, in this order */
    uint64_t seq;
    size_t offset;
    int height; /* of the subtree; a leaf is 1 */
} fsdp_atree_node_t;

/* Inserts node (its key fields set, its key not yet in the tree). */
void fsdp_atree_insert(fsdp_atree_node_t **root, fsdp_atree_node_t *node);
/* Removes node, which must be in the tree. */
void fsdp_atree_remove(fsdp_atree_node_t **root, fsdp_atree_node_t *node);
/* The smallest node whose size is >= size (lowest seq, then offset, on ties), or NULL. */
fsdp_atree_node_t *fsdp_atree_lower_bound(fsdp_atree_node_t *root, size_t size);
/* Calls func on every node in key order; stops early when func returns nonzero. */
int fsdp_atree_walk(fsdp_atree_node_t *root, int (*func)(fsdp_atree_node_t *node, void *arg),
                    void *arg);

typedef struct fsdp_ptrmap_slot {
    uintptr_t key; /* 0 = empty */
    void *val;
} fsdp_ptrmap_slot_t;

typedef struct fsdp_ptrmap {
    fsdp_ptrmap_slot_t *slots; /* key and value side by side: one cache line per probe */
    size_t cap;                /* power of two, or 0 before the first reserve */
    size_t count;
} fsdp_ptrmap_t;

/* Makes room for `n` entries in all, so that the next puts up to that many cannot fail. */
fsdp_status_t fsdp_ptrmap_reserve(fsdp_ptrmap_t *map, size_t n);
/* key != 0, not present, and room reserved. */
void fsdp_ptrmap_put(fsdp_ptrmap_t *map, uintptr_t key, void *val);
void *fsdp_ptrmap_get(const fsdp_ptrmap_t *map, uintptr_t key);
/* Removes key and returns its value (NULL when absent). */
void *fsdp_ptrmap_remove(fsdp_ptrmap_t *map, uintptr_t key);
void fsdp_ptrmap_destroy(fsdp_ptrmap_t *map);

#endif
