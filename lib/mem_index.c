/* The caching allocator's host-side indexes: an AVL tree of free blocks and a hash map from
 * address to live block (mem_index.h). */
#include "mem_index.h"

#include <stdlib.h>

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

/* Recursion depth is the tree height, under 1.45 log2(n): about 30 for 10^9 nodes. */
static fsdp_atree_node_t *insert_at(fsdp_atree_node_t *root, fsdp_atree_node_t *node)
{
    if (root == NULL) {
        node->left = node->right = NULL;
        node->height = 1;
        return node;
    }
    if (key_cmp(node, root) < 0)
        root->left = insert_at(root->left, node);
    else
        root->right = insert_at(root->right, node);
    return rebalance(root);
}

static fsdp_atree_node_t *remove_min(fsdp_atree_node_t *n, fsdp_atree_node_t **min_p)
{
    if (n->left == NULL) {
        *min_p = n;
        return n->right;
    }
    n->left = remove_min(n->left, min_p);
    return rebalance(n);
}

static fsdp_atree_node_t *remove_at(fsdp_atree_node_t *root, fsdp_atree_node_t *node)
{
    fsdp_atree_node_t *min, *right;
    int c;

    if (root == NULL)
        return NULL; /* not in the tree: the caller's bookkeeping check catches it */
    c = key_cmp(node, root);
    if (c < 0) {
        root->left = remove_at(root->left, node);
    } else if (c > 0) {
        root->right = remove_at(root->right, node);
    } else {
        if (root->right == NULL)
            return root->left;
        right = remove_min(root->right, &min);
        min->right = right;
        min->left = root->left;
        return rebalance(min);
    }
    return rebalance(root);
}

void fsdp_atree_insert(fsdp_atree_node_t **root, fsdp_atree_node_t *node)
{
    *root = insert_at(*root, node);
}

void fsdp_atree_remove(fsdp_atree_node_t **root, fsdp_atree_node_t *node)
{
    *root = remove_at(*root, node);
    node->left = node->right = NULL;
    node->height = 0;
}

fsdp_atree_node_t *fsdp_atree_lower_bound(fsdp_atree_node_t *root, size_t size)
{
    fsdp_atree_node_t *best = NULL;

    while (root != NULL) {
        if (root->size >= size) {
            best = root;
            root = root->left;
        } else {
            root = root->right;
        }
    }
    return best;
}

int fsdp_atree_walk(fsdp_atree_node_t *root, int (*func)(fsdp_atree_node_t *node, void *arg),
                    void *arg)
{
    int rc;

    if (root == NULL)
        return 0;
    rc = fsdp_atree_walk(root->left, func, arg);
    if (rc == 0)
        rc = func(root, arg);
    if (rc == 0)
        rc = fsdp_atree_walk(root->right, func, arg);
    return rc;
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
    slots = calloc(cap, sizeof(*slots));
    if (slots == NULL)
        return FSDP_ERR_NO_MEMORY;
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
