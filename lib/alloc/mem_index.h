/* The caching allocator's host-side indexes (never installed).
 *
 * - fsdp_atree: the free blocks of one stream and pool, ordered by (size, seq, offset), where
 *   seq is the creation number of the block's segment and offset its place in it. A pool holds
 *   many free blocks of few sizes (GPT-3 in shape mode: about a thousand of eleven sizes), so
 *   it is a sorted array of the distinct sizes, each with an intrusive AVL tree of its blocks
 *   by (seq, offset) and its lowest block at hand. Best fit (the first block at or after
 *   (size, 0, 0)) is a binary search of that array, a few cache lines; insert and remove walk
 *   one size's tree, not one of every free block, whose nodes are cold in the cache.
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

typedef struct fsdp_atree_size {
    size_t size;
    fsdp_atree_node_t *root;  /* the blocks of this size, by (seq, offset) */
    fsdp_atree_node_t *first; /* the lowest of them */
} fsdp_atree_size_t;

typedef struct fsdp_atree {
    fsdp_atree_size_t *sizes; /* the distinct sizes present, ascending */
    size_t n_sizes, cap_sizes;
} fsdp_atree_t;

/* Makes room for `n` distinct sizes in all. */
fsdp_status_t fsdp_atree_reserve(fsdp_atree_t *tree, size_t n);
/* Inserts node (its key fields set, its key not yet in the tree). A size not yet present takes
 * room reserved before: the caller keeps room for as many sizes as nodes it may insert. */
void fsdp_atree_insert(fsdp_atree_t *tree, fsdp_atree_node_t *node);
/* Removes node, which must be in the tree. */
void fsdp_atree_remove(fsdp_atree_t *tree, fsdp_atree_node_t *node);
/* The smallest node whose size is >= size (lowest seq, then offset, on ties), or NULL. */
fsdp_atree_node_t *fsdp_atree_lower_bound(const fsdp_atree_t *tree, size_t size);
/* Calls func on every node in key order; stops early when func returns nonzero. */
int fsdp_atree_walk(const fsdp_atree_t *tree, int (*func)(fsdp_atree_node_t *node, void *arg),
                    void *arg);
/* Checks order, balance and the sizes' first nodes: NULL when sound, else what is wrong. */
const char *fsdp_atree_check(const fsdp_atree_t *tree);
void fsdp_atree_destroy(fsdp_atree_t *tree);

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
