/* The caching allocator's free-block index (lib/mem_index.c) against a plain model: every
 * best-fit answer is the block a scan of all free blocks picks (smallest size at or above the
 * request, then lowest segment number, then lowest offset), through random inserts and removes
 * over few sizes and many blocks per size, as a pool of a large model holds them. */
#include "alloc/mem_index.h"

#include <stdint.h>
#include <stdlib.h>

#include "test_util.h"

#define N_NODES 700

typedef struct model {
    fsdp_atree_node_t nodes[N_NODES];
    int present[N_NODES];
    int n_present;
} model_t;

static int key_less(const fsdp_atree_node_t *a, const fsdp_atree_node_t *b)
{
    if (a->size != b->size)
        return a->size < b->size;
    if (a->seq != b->seq)
        return a->seq < b->seq;
    return a->offset < b->offset;
}

/* The scan: the least key among present nodes of size >= size. */
static const fsdp_atree_node_t *scan_best_fit(const model_t *m, size_t size)
{
    const fsdp_atree_node_t *best = NULL;

    for (int i = 0; i < N_NODES; i++) {
        if (m->present[i] && m->nodes[i].size >= size &&
            (best == NULL || key_less(&m->nodes[i], best)))
            best = &m->nodes[i];
    }
    return best;
}

typedef struct order_check {
    const fsdp_atree_node_t *prev;
    int n;
    int out_of_order;
} order_check_t;

static int visit(fsdp_atree_node_t *node, void *arg)
{
    order_check_t *c = arg;

    if (c->prev != NULL && !key_less(c->prev, node))
        c->out_of_order = 1;
    c->prev = node;
    c->n++;
    return 0;
}

/* Unique keys: sizes from a short list (many ties), segment numbers and offsets shuffled so that
 * insertion order says nothing about key order. */
static void make_nodes(model_t *m, const size_t *sizes, int n_sizes, unsigned *seed)
{
    for (int i = 0; i < N_NODES; i++) {
        fsdp_atree_node_t *n = &m->nodes[i];
        n->size = sizes[rand_r(seed) % n_sizes];
        n->seq = (uint64_t)(rand_r(seed) % 97);
        n->offset = (size_t)i * 512;
        m->present[i] = 0;
    }
    m->n_present = 0;
}

static void run_random(const size_t *sizes, int n_sizes, unsigned seed, int steps)
{
    static model_t m;
    fsdp_atree_t tree = {0};
    int mismatches = 0, check_failures = 0, walk_failures = 0;

    make_nodes(&m, sizes, n_sizes, &seed);
    CU_ASSERT_EQUAL_FATAL(fsdp_atree_reserve(&tree, N_NODES), FSDP_OK);
    for (int step = 0; step < steps; step++) {
        int i = rand_r(&seed) % N_NODES;
        /* lean towards a full tree, then drain it, so sizes appear and vanish */
        int fill = (step / 2000) % 2 == 0 ? 3 : 1;

        if (!m.present[i] && rand_r(&seed) % 4 < fill) {
            fsdp_atree_insert(&tree, &m.nodes[i]);
            m.present[i] = 1;
            m.n_present++;
        } else if (m.present[i]) {
            fsdp_atree_remove(&tree, &m.nodes[i]);
            m.present[i] = 0;
            m.n_present--;
        }
        /* a best fit taken out of the tree, as the allocator does */
        if (rand_r(&seed) % 3 == 0) {
            size_t want = sizes[rand_r(&seed) % n_sizes] - (size_t)(rand_r(&seed) % 2);
            const fsdp_atree_node_t *expect = scan_best_fit(&m, want);
            fsdp_atree_node_t *got = fsdp_atree_lower_bound(&tree, want);

            if (got != expect)
                mismatches++;
            if (got != NULL && got == expect) {
                int k = (int)(got - m.nodes);
                fsdp_atree_remove(&tree, got);
                m.present[k] = 0;
                m.n_present--;
            }
        }
        if (fsdp_atree_check(&tree) != NULL)
            check_failures++;
        if (step % 97 == 0) {
            order_check_t c = {0};
            fsdp_atree_walk(&tree, visit, &c);
            if (c.out_of_order || c.n != m.n_present)
                walk_failures++;
        }
    }
    CU_ASSERT_EQUAL(mismatches, 0);
    CU_ASSERT_EQUAL(check_failures, 0);
    CU_ASSERT_EQUAL(walk_failures, 0);
    /* beyond the largest size nothing fits */
    CU_ASSERT_PTR_NULL(fsdp_atree_lower_bound(&tree, sizes[n_sizes - 1] + 1));
    fsdp_atree_destroy(&tree);
}

/* Eleven sizes, as the GPT-3 run's large pool holds, some far apart. */
static void test_few_sizes(void)
{
    static const size_t sizes[] = {2 << 20,  3 << 20,  4 << 20,   6 << 20,   12 << 20, 24 << 20,
                                   48 << 20, 96 << 20, 144 << 20, 288 << 20, 576 << 20};

    run_random(sizes, (int)(sizeof(sizes) / sizeof(sizes[0])), 1, 30000);
}

/* One size: every choice is made by (segment, offset) alone. */
static void test_one_size(void)
{
    static const size_t sizes[] = {1 << 20};

    run_random(sizes, 1, 2, 20000);
}

/* Many sizes: mostly one block each, sizes appearing and going all the time. */
static void test_many_sizes(void)
{
    size_t sizes[400];

    for (int i = 0; i < 400; i++)
        sizes[i] = (size_t)(i + 1) * 512;
    run_random(sizes, 400, 3, 30000);
}

/* The first block of a size moves to the next one of that size when it goes, and the size goes
 * with its last block. */
static void test_first_of_size(void)
{
    fsdp_atree_node_t a = {.size = 4096, .seq = 2, .offset = 0};
    fsdp_atree_node_t b = {.size = 4096, .seq = 1, .offset = 512};
    fsdp_atree_node_t c = {.size = 4096, .seq = 1, .offset = 1024};
    fsdp_atree_node_t d = {.size = 8192, .seq = 0, .offset = 0};
    fsdp_atree_t tree = {0};

    CU_ASSERT_EQUAL_FATAL(fsdp_atree_reserve(&tree, 4), FSDP_OK);
    fsdp_atree_insert(&tree, &a);
    fsdp_atree_insert(&tree, &d);
    fsdp_atree_insert(&tree, &c);
    fsdp_atree_insert(&tree, &b);
    CU_ASSERT_PTR_NULL(fsdp_atree_check(&tree));
    CU_ASSERT_PTR_EQUAL(fsdp_atree_lower_bound(&tree, 1), &b);
    CU_ASSERT_PTR_EQUAL(fsdp_atree_lower_bound(&tree, 4097), &d);
    fsdp_atree_remove(&tree, &b);
    CU_ASSERT_PTR_EQUAL(fsdp_atree_lower_bound(&tree, 4096), &c);
    fsdp_atree_remove(&tree, &c);
    CU_ASSERT_PTR_EQUAL(fsdp_atree_lower_bound(&tree, 4096), &a);
    fsdp_atree_remove(&tree, &a);
    CU_ASSERT_PTR_EQUAL(fsdp_atree_lower_bound(&tree, 4096), &d);
    CU_ASSERT_EQUAL(tree.n_sizes, 1);
    fsdp_atree_remove(&tree, &d);
    CU_ASSERT_PTR_NULL(fsdp_atree_lower_bound(&tree, 1));
    CU_ASSERT_EQUAL(tree.n_sizes, 0);
    CU_ASSERT_PTR_NULL(fsdp_atree_check(&tree));
    fsdp_atree_destroy(&tree);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"the first block of a size", test_first_of_size},
        {"best fit over few sizes against a scan", test_few_sizes},
        {"best fit within one size against a scan", test_one_size},
        {"best fit over many sizes against a scan", test_many_sizes},
        {NULL, NULL},
    };
    return fsdp_test_run("mem_index", tests);
}
