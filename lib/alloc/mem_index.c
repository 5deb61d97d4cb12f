/* The caching allocator's host-side indexes: an AVL tree of free blocks and a hash map from
 * address to live block (mem_index.h). */
#include "alloc/mem_index.h"

#include <stdlib.h>
#include <string.h>

/* ---- AVL tree -------------------------------------------------------------------------- */

static int key_cmp(const fsdp_atree_node_t *a, const fsdp_atree_node_t *b)
{
    if (a->size != b->size)
        return a->size < b->size ? -1 : 1;
    if (a->seq != b->seq)
        return a->seq < b->seq ? -1 : 1;
    if (a->offset != b->offset)
        return a->offset < b->offset ? -1 : 1;
    return 0;
}

static int height(const fsdp_atree_node_t *n)
{
    return n != NULL ? n->height : 0;
}

static void fix_height(fsdp_atree_node_t *n)
{
    int hl = height(n->left), hr = height(n->right);
    n->height = 1 + (hl > hr ? hl : hr);
}

static fsdp_atree_node_t *rotate_right(fsdp_atree_node_t *y)
{
    fsdp_atree_node_t *x = y->left;

    y->left = x->right;
    x->right = y;
    fix_height(y);
    fix_height(x);
    return x;
}

static fsdp_atree_node_t *rotate_left(fsdp_atree_node_t *x)
{
    fsdp_atree_node_t *y = x->right;

    x->right = y->left;
    y->left = x;
    fix_height(x);
    fix_height(y);
    return y;
}

static fsdp_atree_node_t *rebalance(fsdp_atree_node_t *n)
{
    int balance;

    fix_height(n);
    balance = height(n->left) - height(n->right);
    if (balance > 1) {
        if (height(n->left->left) < height(n->left->right))
            n->left = rotate_left(n->left);
        return rotate_right(n);
    }
    if (balance < -1) {
        if (height(n->right->right) < height(n->right->left))
            n->right = rotate_right(n->right);
        return rotate_left(n);
    }
    return n;
}

/* After a child subtree changed: when it kept its root and its height, nothing above it
 * changes either (heights and balances are as they were), so the walk back up stops reading
 * the siblings, which are cold in the cache. */
static fsdp_atree_node_t *after_child(fsdp_atree_node_t *root, const fsdp_atree_node_t *old_child,
                                      int old_height, const fsdp_atree_node_t *child)
{
    if (child == old_child && height(child) == old_height)
        return root;
    return rebalance(root);
}

/* Recursion depth is the tree height, under 1.45 log2(n): about 30 for 10^9 nodes. */
static fsdp_atree_node_t *insert_at(fsdp_atree_node_t *root, fsdp_atree_node_t *node)
{
    fsdp_atree_node_t *child;
    int h;

    if (root == NULL) {
        node->left = node->right = NULL;
        node->height = 1;
        return node;
    }
    if (key_cmp(node, root) < 0) {
        child = root->left;
        h = height(child);
        root->left = insert_at(child, node);
        return after_child(root, child, h, root->left);
    }
    child = root->right;
    h = height(child);
    root->right = insert_at(child, node);
    return after_child(root, child, h, root->right);
}

static fsdp_atree_node_t *remove_min(fsdp_atree_node_t *n, fsdp_atree_node_t **min_p)
{
    fsdp_atree_node_t *child;
    int h;

    if (n->left == NULL) {
        *min_p = n;
        return n->right;
    }
    child = n->left;
    h = height(child);
    n->left = remove_min(child, min_p);
    return after_child(n, child, h, n->left);
}

/* Removes node from the subtree at root; *succ_p becomes node's successor in key order when
 * it lies in that subtree, and is left alone otherwise (the caller passes the nearest ancestor
 * it went left at). */
static fsdp_atree_node_t *remove_at(fsdp_atree_node_t *root, fsdp_atree_node_t *node,
                                    fsdp_atree_node_t **succ_p)
{
    fsdp_atree_node_t *min, *right, *child;
    int c, h;

    if (root == NULL)
        return NULL; /* not in the tree: the caller's bookkeeping check catches it */
    c = key_cmp(node, root);
    if (c < 0) {
        *succ_p = root;
        child = root->left;
        h = height(child);
        root->left = remove_at(child, node, succ_p);
        return after_child(root, child, h, root->left);
    }
    if (c > 0) {
        child = root->right;
        h = height(child);
        root->right = remove_at(child, node, succ_p);
        return after_child(root, child, h, root->right);
    }
    if (root->right == NULL)
        return root->left;
    right = remove_min(root->right, &min);
    *succ_p = min;
    min->right = right;
    min->left = root->left;
    return rebalance(min);
}

static int walk_nodes(fsdp_atree_node_t *root, int (*func)(fsdp_atree_node_t *node, void *arg),
                      void *arg)
{
    int rc;

    if (root == NULL)
        return 0;
    rc = walk_nodes(root->left, func, arg);
    if (rc == 0)
        rc = func(root, arg);
    if (rc == 0)
        rc = walk_nodes(root->right, func, arg);
    return rc;
}

/* ---- the sizes --------------------------------------------------------------------------- */

/* The index of the first entry whose size is >= size (n_sizes when none is). */
static size_t size_index(const fsdp_atree_t *t, size_t size)
{
    size_t lo = 0, hi = t->n_sizes;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->sizes[mid].size < size)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

fsdp_status_t fsdp_atree_reserve(fsdp_atree_t *t, size_t n)
{
    size_t cap = t->cap_sizes ? t->cap_sizes : 16;
    fsdp_atree_size_t *sizes;

    if (n <= t->cap_sizes)
        return FSDP_OK;
    while (cap < n)
        cap *= 2;
    sizes = realloc(t->sizes, cap * sizeof(*sizes));
    if (sizes == NULL)
        return FSDP_ERR_NO_MEMORY;
    t->sizes = sizes;
    t->cap_sizes = cap;
    return FSDP_OK;
}

void fsdp_atree_insert(fsdp_atree_t *t, fsdp_atree_node_t *node)
{
    size_t i = size_index(t, node->size);
    fsdp_atree_size_t *e = t->sizes + i;

    if (i < t->n_sizes && e->size == node->size) {
        e->root = insert_at(e->root, node);
        if (key_cmp(node, e->first) < 0)
            e->first = node;
        return;
    }
    /* A new size, in the room the caller reserved: nothing can be reported from here. */
    if (t->n_sizes == t->cap_sizes)
        abort();
    memmove(e + 1, e, (t->n_sizes - i) * sizeof(*e));
    e->size = node->size;
    e->root = insert_at(NULL, node);
    e->first = node;
    t->n_sizes++;
}

void fsdp_atree_remove(fsdp_atree_t *t, fsdp_atree_node_t *node)
{
    size_t i = size_index(t, node->size);
    fsdp_atree_size_t *e = t->sizes + i;
    fsdp_atree_node_t *succ = NULL;

    if (i == t->n_sizes || e->size != node->size)
        return; /* not in the tree: the caller's bookkeeping check catches it */
    e->root = remove_at(e->root, node, &succ);
    node->left = node->right = NULL;
    node->height = 0;
    if (e->root == NULL) {
        t->n_sizes--;
        memmove(e, e + 1, (t->n_sizes - i) * sizeof(*e));
    } else if (e->first == node) {
        e->first = succ; /* node was the lowest of its size, and not the only one */
    }
}

fsdp_atree_node_t *fsdp_atree_lower_bound(const fsdp_atree_t *t, size_t size)
{
    size_t i = size_index(t, size);

    return i < t->n_sizes ? t->sizes[i].first : NULL;
}

int fsdp_atree_walk(const fsdp_atree_t *t, int (*func)(fsdp_atree_node_t *node, void *arg),
                    void *arg)
{
    int rc = 0;

    for (size_t i = 0; i < t->n_sizes && rc == 0; i++)
        rc = walk_nodes(t->sizes[i].root, func, arg);
    return rc;
}

static const fsdp_atree_node_t *walk_first(const fsdp_atree_node_t *n)
{
    while (n->left != NULL)
        n = n->left;
    return n;
}

static int height_ok(const fsdp_atree_node_t *n)
{
    int hl, hr;

    if (n == NULL)
        return 0;
    hl = height_ok(n->left);
    hr = height_ok(n->right);
    if (hl < 0 || hr < 0 || hl - hr > 1 || hr - hl > 1 || n->height != 1 + (hl > hr ? hl : hr))
        return -1;
    return n->height;
}

typedef struct order_walk {
    size_t size;
    const fsdp_atree_node_t *prev;
    const char *error;
} order_walk_t;

static int check_node(fsdp_atree_node_t *node, void *arg)
{
    order_walk_t *w = arg;

    if (node->size != w->size)
        w->error = "a free block sits in the tree of another size";
    else if (w->prev != NULL && key_cmp(w->prev, node) >= 0)
        w->error = "a free tree is out of order";
    w->prev = node;
    return w->error != NULL;
}

const char *fsdp_atree_check(const fsdp_atree_t *t)
{
    if (t->n_sizes > t->cap_sizes)
        return "a free tree holds more sizes than its room";
    for (size_t i = 0; i < t->n_sizes; i++) {
        const fsdp_atree_size_t *e = &t->sizes[i];
        order_walk_t w = {.size = e->size};

        if (i > 0 && t->sizes[i - 1].size >= e->size)
            return "a free tree's sizes are out of order";
        if (e->root == NULL)
            return "a free tree keeps a size with no blocks";
        if (height_ok(e->root) < 0)
            return "a free tree is out of balance";
        walk_nodes(e->root, check_node, &w);
        if (w.error != NULL)
            return w.error;
        if (w.prev == NULL || e->first != walk_first(e->root))
            return "a free tree's first block of a size is not its lowest";
    }
    return NULL;
}

void fsdp_atree_destroy(fsdp_atree_t *t)
{
    free(t->sizes);
    t->sizes = NULL;
    t->n_sizes = t->cap_sizes = 0;
}

/* ---- pointer map ----------------------------------------------------------------------- */

static size_t ptr_hash(uintptr_t key)
{
    uint64_t x = (uint64_t)key;

    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x;
}

static void place(fsdp_ptrmap_slot_t *slots, size_t cap, uintptr_t key, void *val)
{
    size_t mask = cap - 1, i = ptr_hash(key) & mask;

    while (slots[i].key != 0)
        i = (i + 1) & mask;
    slots[i].key = key;
    slots[i].val = val;
}

fsdp_status_t fsdp_ptrmap_reserve(fsdp_ptrmap_t *map, size_t n)
{
    size_t cap = map->cap ? map->cap : 64;
    fsdp_ptrmap_slot_t *slots;

    while (n > cap / 2) /* load factor at most 1/2 */
        cap *= 2;
    if (cap == map->cap)
        return FSDP_OK;
    /* Written before the first probe reads it: calloc's fresh pages would map the shared zero
     * page on that read, and the first put into each would then fault again and flush the
     * other threads' TLBs. (The empty asm keeps the compiler from making malloc and memset a
     * calloc again.) */
    slots = malloc(cap * sizeof(*slots));
    if (slots == NULL)
        return FSDP_ERR_NO_MEMORY;
    __asm__ volatile("" : "+r"(slots));
    memset(slots, 0, cap * sizeof(*slots));
    for (size_t i = 0; i < map->cap; i++) {
        if (map->slots[i].key != 0)
            place(slots, cap, map->slots[i].key, map->slots[i].val);
    }
    free(map->slots);
    map->slots = slots;
    map->cap = cap;
    return FSDP_OK;
}

void fsdp_ptrmap_put(fsdp_ptrmap_t *map, uintptr_t key, void *val)
{
    place(map->slots, map->cap, key, val);
    map->count++;
}

static size_t find_slot(const fsdp_ptrmap_t *map, uintptr_t key, int *found_p)
{
    size_t mask = map->cap - 1, i = ptr_hash(key) & mask;

    *found_p = 0;
    while (map->slots[i].key != 0) {
        if (map->slots[i].key == key) {
            *found_p = 1;
            break;
        }
        i = (i + 1) & mask;
    }
    return i;
}

void *fsdp_ptrmap_get(const fsdp_ptrmap_t *map, uintptr_t key)
{
    int found;
    size_t i;

    if (map->cap == 0 || key == 0)
        return NULL;
    i = find_slot(map, key, &found);
    return found ? map->slots[i].val : NULL;
}

void *fsdp_ptrmap_remove(fsdp_ptrmap_t *map, uintptr_t key)
{
    size_t mask, i, j, home;
    void *val;
    int found;

    if (map->cap == 0 || key == 0)
        return NULL;
    i = find_slot(map, key, &found);
    if (!found)
        return NULL;
    val = map->slots[i].val;
    mask = map->cap - 1;
    /* Backward shift: move later entries of the probe run into the hole unless their home
     * slot lies cyclically in (i, j], where they must stay. */
    for (j = (i + 1) & mask; map->slots[j].key != 0; j = (j + 1) & mask) {
        home = ptr_hash(map->slots[j].key) & mask;
        if (i <= j ? (home > i && home <= j) : (home > i || home <= j))
            continue;
        map->slots[i] = map->slots[j];
        i = j;
    }
    map->slots[i].key = 0;
    map->slots[i].val = NULL;
    map->count--;
    return val;
}

void fsdp_ptrmap_destroy(fsdp_ptrmap_t *map)
{
    free(map->slots);
    map->slots = NULL;
    map->cap = map->count = 0;
}
