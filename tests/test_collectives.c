/* The sim backend's collectives: exact results for every collective, dtype and reduce op on
 * worlds of 1 to 8 ranks (and a 1024-rank smoke test), sub-groups made by group_split, and
 * results that do not depend on thread timing.
 *
 * Rank functions run on their own threads, where CUnit's asserts must not be used: they record
 * the first failed check in the shared context (test_util.h) and return FSDP_ERR_INTERNAL, and
 * the main thread asserts on that. */
#include <fsdp/fsdp.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base_hidden.h"
#include "test_util.h"

static const int worlds[] = {1, 2, 3, 4, 8};
/* 5000: more than two of the sim's reduction blocks, the last one partial */
static const size_t counts[] = {0, 1, 7, 13, 1000, 5000};
static const fsdp_dtype_t dtypes[] = {FSDP_DTYPE_F32, FSDP_DTYPE_BF16, FSDP_DTYPE_F16,
                                      FSDP_DTYPE_I32};
#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

typedef struct ctx {
    fsdp_test_failure_t fail; /* the ranks' first failed check */
    uint8_t *out[8];          /* test_determinism: each rank's result */
    size_t out_bytes;
    int jitter; /* sleep a little, differently per rank and run */
    unsigned seed;
} ctx_t;

static void ctx_init(ctx_t *c)
{
    memset(c, 0, sizeof(*c));
}

static void launch_ok(int world, fsdp_rank_func_t func, ctx_t *c)
{
    fsdp_sim_params_t p;
    fsdp_status_t st;

    fsdp_sim_params_init(&p);
    p.world_size = world;
    p.timeout_s = 20.0;
    st = fsdp_sim_launch(&p, func, c, NULL);
    if (st != FSDP_OK || atomic_load(&c->fail.count) != 0)
        fprintf(stderr, "\n  world %d: %s\n", world, fsdp_status_name(st));
    CU_ASSERT_EQUAL(st, FSDP_OK);
    fsdp_test_failure_assert(&c->fail);
}

/* ---- values and expected results, computed here independently of the backend ---------- */

/* Input element j of rank r, exactly representable in dtype. For bf16 and f16 the values
 * 1 + m/128 make sums that need rounding, so the test sees whether it happens once. */
static float input(fsdp_dtype_t dt, int r, size_t j)
{
    switch (dt) {
    case FSDP_DTYPE_BF16:
    case FSDP_DTYPE_F16:
        return 1.0f + (float)((r * 29 + (int)(j % 97) * 7) % 128) / 128.0f;
    case FSDP_DTYPE_I32:
        return (float)((r * 37 + (int)(j % 101) * 11) % 61 - 30);
    default:
        return (float)r * 0.37f + (float)(j % 1009) * 0.013f - 3.0f;
    }
}

static void put(void *p, fsdp_dtype_t dt, size_t i, float v)
{
    switch (dt) {
    case FSDP_DTYPE_F32:
        ((float *)p)[i] = v;
        break;
    case FSDP_DTYPE_BF16:
        ((uint16_t *)p)[i] = fsdp_f32_to_bf16(v);
        break;
    case FSDP_DTYPE_F16:
        ((uint16_t *)p)[i] = fsdp_f32_to_f16(v);
        break;
    default:
        ((int32_t *)p)[i] = (int32_t)v;
        break;
    }
}

/* Element j (in the send layout) reduced over ranks 0..world-1, stored into `out` slot 0:
 * f32 accumulation in rank order, one rounding at the end. */
static void expect_reduce(fsdp_dtype_t dt, fsdp_reduce_op_t op, int world, size_t j, void *out)
{
    if (dt == FSDP_DTYPE_I32) {
        int32_t acc = (int32_t)input(dt, 0, j);
        for (int r = 1; r < world; r++) {
            int32_t v = (int32_t)input(dt, r, j);
            acc = op == FSDP_REDUCE_MAX ? (v > acc ? v : acc) : acc + v;
        }
        ((int32_t *)out)[0] = acc;
        return;
    }
    float acc = input(dt, 0, j);
    for (int r = 1; r < world; r++) {
        float v = input(dt, r, j);
        acc = op == FSDP_REDUCE_MAX ? (v > acc ? v : acc) : acc + v;
    }
    if (op == FSDP_REDUCE_AVG)
        acc /= (float)world;
    put(out, dt, 0, acc);
}

static int same_elem(const void *a, size_t i, const void *b, size_t j, size_t es)
{
    return memcmp((const char *)a + i * es, (const char *)b + j * es, es) == 0;
}

static void *dev_alloc(fsdp_dev_t *dev, size_t bytes)
{
    void *p = NULL;
    if (fsdp_dev_segment_alloc(dev, FSDP_MEMKIND_DEVICE, bytes, &p) != FSDP_OK)
        return NULL;
    return p;
}

static void dev_free(fsdp_dev_t *dev, void *p)
{
    fsdp_dev_segment_free(dev, FSDP_MEMKIND_DEVICE, p);
}

/* ---- the collectives on the world ------------------------------------------------------ */

static fsdp_status_t rank_all_gather(fsdp_dev_t *dev, void *arg)
{
    ctx_t *c = arg;
    fsdp_group_t *g = fsdp_dev_group_world(dev);
    int W = g->size;

    for (size_t ci = 0; ci < N_ELEMS(counts); ci++) {
        for (size_t di = 0; di < N_ELEMS(dtypes); di++) {
            size_t n = counts[ci], es = fsdp_dtype_size(dtypes[di]);
            fsdp_dtype_t dt = dtypes[di];
            uint8_t *send = dev_alloc(dev, n * es), *recv = dev_alloc(dev, n * es * W);
            uint8_t want[4];
            FSDP_RANK_REQUIRE_MSG(&c->fail, dev->rank, send && recv, "segment_alloc failed");
            for (size_t i = 0; i < n; i++)
                put(send, dt, i, input(dt, dev->rank, i));
            memset(recv, 0xa5, n * es * W);
            FSDP_RANK_REQUIRE_OK(&c->fail, dev,
                                 fsdp_dev_all_gather(dev, g, send, recv, n, dt, NULL));
            for (int r = 0; r < W; r++) {
                for (size_t i = 0; i < n; i++) {
                    put(want, dt, 0, input(dt, r, i));
                    FSDP_RANK_REQUIRE_MSG(&c->fail, dev->rank,
                                          same_elem(recv, r * n + i, want, 0, es),
                                          "all_gather %s count %zu: element %zu of rank %d wrong",
                                          fsdp_dtype_name(dt), n, i, r);
                }
            }
            /* in place: the send buffer is this rank's slot of recv */
            memset(recv, 0, n * es * W);
            for (size_t i = 0; i < n; i++)
                put(recv + dev->rank * n * es, dt, i, input(dt, dev->rank, i));
            FSDP_RANK_REQUIRE_OK(
                &c->fail, dev,
                fsdp_dev_all_gather(dev, g, recv + dev->rank * n * es, recv, n, dt, NULL));
            for (int r = 0; r < W; r++) {
                for (size_t i = 0; i < n; i++) {
                    put(want, dt, 0, input(dt, r, i));
                    FSDP_RANK_REQUIRE_MSG(
                        &c->fail, dev->rank, same_elem(recv, r * n + i, want, 0, es),
                        "in-place all_gather %s count %zu: element %zu of rank %d",
                        fsdp_dtype_name(dt), n, i, r);
                }
            }
            dev_free(dev, send);
            dev_free(dev, recv);
        }
    }
    return FSDP_OK;
}

static const fsdp_reduce_op_t ops_all[] = {FSDP_REDUCE_SUM, FSDP_REDUCE_AVG, FSDP_REDUCE_MAX};

/* i32 has no avg (backend.h: i32 for sum and max) */
static int op_applies(fsdp_dtype_t dt, fsdp_reduce_op_t op)
{
    return !(dt == FSDP_DTYPE_I32 && op == FSDP_REDUCE_AVG);
}

static fsdp_status_t rank_reduce_scatter(fsdp_dev_t *dev, void *arg)
{
    ctx_t *c = arg;
    fsdp_group_t *g = fsdp_dev_group_world(dev);
    int W = g->size, me = g->rank;

    for (size_t ci = 0; ci < N_ELEMS(counts); ci++) {
        for (size_t di = 0; di < N_ELEMS(dtypes); di++) {
            for (size_t oi = 0; oi < N_ELEMS(ops_all); oi++) {
                size_t n = counts[ci], es = fsdp_dtype_size(dtypes[di]);
                fsdp_dtype_t dt = dtypes[di];
                fsdp_reduce_op_t op = ops_all[oi];
                uint8_t *send, *recv, want[4];
                if (!op_applies(dt, op))
                    continue;
                send = dev_alloc(dev, n * es * W);
                recv = dev_alloc(dev, n * es);
                FSDP_RANK_REQUIRE_MSG(&c->fail, dev->rank, send && recv, "segment_alloc failed");
                for (size_t j = 0; j < n * W; j++)
                    put(send, dt, j, input(dt, dev->rank, j));
                FSDP_RANK_REQUIRE_OK(&c->fail, dev,
                                     fsdp_dev_reduce_scatter(dev, g, send, recv, n, dt, op, NULL));
                for (size_t i = 0; i < n; i++) {
                    expect_reduce(dt, op, W, me * n + i, want);
                    FSDP_RANK_REQUIRE_MSG(&c->fail, dev->rank, same_elem(recv, i, want, 0, es),
                                          "reduce_scatter %s %s count %zu: element %zu wrong",
                                          fsdp_dtype_name(dt), fsdp_reduce_op_name(op), n, i);
                }
                /* in place: recv is this rank's chunk of send */
                FSDP_RANK_REQUIRE_OK(
                    &c->fail, dev,
                    fsdp_dev_reduce_scatter(dev, g, send, send + me * n * es, n, dt, op, NULL));
                for (size_t i = 0; i < n; i++) {
                    FSDP_RANK_REQUIRE_MSG(&c->fail, dev->rank,
                                          same_elem(send, me * n + i, recv, i, es),
                                          "in-place reduce_scatter %s %s count %zu: element %zu",
                                          fsdp_dtype_name(dt), fsdp_reduce_op_name(op), n, i);
                }
                dev_free(dev, send);
                dev_free(dev, recv);
            }
        }
    }
    return FSDP_OK;
}

static fsdp_status_t rank_all_reduce(fsdp_dev_t *dev, void *arg)
{
    ctx_t *c = arg;
    fsdp_group_t *g = fsdp_dev_group_world(dev);
    int W = g->size;

    for (size_t ci = 0; ci < N_ELEMS(counts); ci++) {
        for (size_t di = 0; di < N_ELEMS(dtypes); di++) {
            for (size_t oi = 0; oi < N_ELEMS(ops_all); oi++) {
                size_t n = counts[ci], es = fsdp_dtype_size(dtypes[di]);
                fsdp_dtype_t dt = dtypes[di];
                fsdp_reduce_op_t op = ops_all[oi];
                uint8_t *send, *recv, want[4];
                if (!op_applies(dt, op))
                    continue;
                send = dev_alloc(dev, n * es);
                recv = dev_alloc(dev, n * es);
                FSDP_RANK_REQUIRE_MSG(&c->fail, dev->rank, send && recv, "segment_alloc failed");
                for (size_t i = 0; i < n; i++)
                    put(send, dt, i, input(dt, dev->rank, i));
                FSDP_RANK_REQUIRE_OK(&c->fail, dev,
                                     fsdp_dev_all_reduce(dev, g, send, recv, n, dt, op, NULL));
                /* in place */
                FSDP_RANK_REQUIRE_OK(&c->fail, dev,
                                     fsdp_dev_all_reduce(dev, g, send, send, n, dt, op, NULL));
                for (size_t i = 0; i < n; i++) {
                    expect_reduce(dt, op, W, i, want);
                    FSDP_RANK_REQUIRE_MSG(&c->fail, dev->rank,
                                          same_elem(recv, i, want, 0, es) &&
                                              same_elem(send, i, want, 0, es),
                                          "all_reduce %s %s count %zu: element %zu wrong",
                                          fsdp_dtype_name(dt), fsdp_reduce_op_name(op), n, i);
                }
                dev_free(dev, send);
                dev_free(dev, recv);
            }
        }
    }
    return FSDP_OK;
}

static fsdp_status_t rank_broadcast(fsdp_dev_t *dev, void *arg)
{
    ctx_t *c = arg;
    fsdp_group_t *g = fsdp_dev_group_world(dev);

    for (int root = 0; root < g->size; root++) {
        for (size_t ci = 0; ci < N_ELEMS(counts); ci++) {
            for (size_t di = 0; di < N_ELEMS(dtypes); di++) {
                size_t n = counts[ci], es = fsdp_dtype_size(dtypes[di]);
                fsdp_dtype_t dt = dtypes[di];
                uint8_t *buf = dev_alloc(dev, n * es), want[4];
                FSDP_RANK_REQUIRE_MSG(&c->fail, dev->rank, buf, "segment_alloc failed");
                for (size_t i = 0; i < n; i++)
                    put(buf, dt, i, input(dt, g->rank == root ? root : 100 + g->rank, i));
                FSDP_RANK_REQUIRE_OK(&c->fail, dev,
                                     fsdp_dev_broadcast(dev, g, buf, n, dt, root, NULL));
                for (size_t i = 0; i < n; i++) {
                    put(want, dt, 0, input(dt, root, i));
                    FSDP_RANK_REQUIRE_MSG(&c->fail, dev->rank, same_elem(buf, i, want, 0, es),
                                          "broadcast %s count %zu from %d: element %zu wrong",
                                          fsdp_dtype_name(dt), n, root, i);
                }
                dev_free(dev, buf);
            }
        }
        FSDP_RANK_REQUIRE_OK(&c->fail, dev, fsdp_dev_barrier(dev, g));
    }
    return FSDP_OK;
}

static void run_on_worlds(fsdp_rank_func_t func)
{
    for (size_t w = 0; w < N_ELEMS(worlds); w++) {
        ctx_t c;
        ctx_init(&c);
        launch_ok(worlds[w], func, &c);
    }
}

static void test_all_gather(void)
{
    run_on_worlds(rank_all_gather);
}

static void test_reduce_scatter(void)
{
    run_on_worlds(rank_reduce_scatter);
}

static void test_all_reduce(void)
{
    run_on_worlds(rank_all_reduce);
}

static void test_broadcast(void)
{
    run_on_worlds(rank_broadcast);
}

/* ---- sub-groups ------------------------------------------------------------------------ */

/* Checks a sub-group against the members it must have, in group-rank order. */
static fsdp_status_t check_group(ctx_t *c, fsdp_dev_t *dev, const fsdp_group_t *g,
                                 const int *members, int n, const char *name)
{
    FSDP_RANK_REQUIRE_MSG(&c->fail, dev->rank, g != NULL, "no group %s", name);
    FSDP_RANK_REQUIRE_MSG(&c->fail, dev->rank, g->size == n, "group %s has %d ranks, want %d", name,
                          g->size, n);
    FSDP_RANK_REQUIRE_MSG(&c->fail, dev->rank, strcmp(g->name, name) == 0,
                          "group named '%s', want '%s'", g->name, name);
    for (int i = 0; i < n; i++)
        FSDP_RANK_REQUIRE_MSG(&c->fail, dev->rank, g->ranks[i] == members[i],
                              "group %s rank %d is global %d, want %d", name, i, g->ranks[i],
                              members[i]);
    FSDP_RANK_REQUIRE_MSG(&c->fail, dev->rank, g->ranks[g->rank] == dev->rank,
                          "group rank %d maps to %d", g->rank, g->ranks[g->rank]);
    return FSDP_OK;
}

/* all_reduce(sum) and all_gather of the global ranks over g: checks the order of members. */
static fsdp_status_t check_group_collectives(ctx_t *c, fsdp_dev_t *dev, fsdp_group_t *g)
{
    int32_t me = dev->rank, sum = 0, all[8];
    float f = (float)dev->rank + 0.5f;

    FSDP_RANK_REQUIRE_OK(&c->fail, dev,
                         fsdp_dev_all_gather(dev, g, &me, all, 1, FSDP_DTYPE_I32, NULL));
    for (int i = 0; i < g->size; i++) {
        FSDP_RANK_REQUIRE_MSG(&c->fail, dev->rank, all[i] == g->ranks[i],
                              "all_gather on %s slot %d holds %d, want %d", g->name, i, all[i],
                              g->ranks[i]);
        sum += g->ranks[i];
    }
    FSDP_RANK_REQUIRE_OK(
        &c->fail, dev,
        fsdp_dev_all_reduce(dev, g, &me, &me, 1, FSDP_DTYPE_I32, FSDP_REDUCE_SUM, NULL));
    FSDP_RANK_REQUIRE_MSG(&c->fail, dev->rank, me == sum, "sum over %s is %d, want %d", g->name, me,
                          sum);
    FSDP_RANK_REQUIRE_OK(&c->fail, dev,
                         fsdp_dev_broadcast(dev, g, &f, 1, FSDP_DTYPE_F32, g->size - 1, NULL));
    FSDP_RANK_REQUIRE_MSG(&c->fail, dev->rank, f == (float)g->ranks[g->size - 1] + 0.5f,
                          "broadcast on %s gave %g", g->name, (double)f);
    return FSDP_OK;
}

static fsdp_status_t rank_split(fsdp_dev_t *dev, void *arg)
{
    ctx_t *c = arg;
    fsdp_group_t *world = fsdp_dev_group_world(dev), *par, *pair, *rev, *none, *nested;
    int W = dev->world_size, r = dev->rank, members[8], n;
    char name[48];
    fsdp_status_t st;

    FSDP_RANK_REQUIRE_MSG(
        &c->fail, r, strcmp(world->name, "world") == 0 && world->size == W && world->rank == r,
        "world group is %s (%d ranks, rank %d)", world->name, world->size, world->rank);

    /* parity: evens and odds, ordered by global rank */
    FSDP_RANK_REQUIRE_OK(&c->fail, dev, fsdp_dev_group_split(dev, world, r % 2, r, &par));
    n = 0;
    for (int i = r % 2; i < W; i += 2)
        members[n++] = i;
    snprintf(name, sizeof(name), "world/split(%d)", r % 2);
    if ((st = check_group(c, dev, par, members, n, name)) != FSDP_OK)
        return st;

    /* pairs {0,1}, {2,3}, ... */
    FSDP_RANK_REQUIRE_OK(&c->fail, dev, fsdp_dev_group_split(dev, world, r / 2, 0, &pair));
    n = 0;
    for (int i = r / 2 * 2; i < W && i < r / 2 * 2 + 2; i++)
        members[n++] = i;
    snprintf(name, sizeof(name), "world/split2(%d)", r / 2); /* world's second split */
    if ((st = check_group(c, dev, pair, members, n, name)) != FSDP_OK)
        return st;

    /* one group whose order the keys reverse */
    FSDP_RANK_REQUIRE_OK(&c->fail, dev, fsdp_dev_group_split(dev, world, 7, W - r, &rev));
    for (int i = 0; i < W; i++)
        members[i] = W - 1 - i;
    if ((st = check_group(c, dev, rev, members, W, "world/split3(7)")) != FSDP_OK)
        return st;

    /* a negative color leaves the rank out */
    FSDP_RANK_REQUIRE_OK(&c->fail, dev,
                         fsdp_dev_group_split(dev, world, r == 0 ? -1 : 0, 0, &none));
    if (r == 0) {
        FSDP_RANK_REQUIRE_MSG(&c->fail, dev->rank, none == NULL, "a negative color gave a group");
    } else {
        for (int i = 1; i < W; i++)
            members[i - 1] = i;
        if ((st = check_group(c, dev, none, members, W - 1, "world/split4(0)")) != FSDP_OK)
            return st;
    }

    /* collectives interleaved over the sub-groups and the world */
    for (int round = 0; round < 3; round++) {
        if ((st = check_group_collectives(c, dev, par)) != FSDP_OK ||
            (st = check_group_collectives(c, dev, pair)) != FSDP_OK ||
            (st = check_group_collectives(c, dev, rev)) != FSDP_OK ||
            (none != NULL && (st = check_group_collectives(c, dev, none)) != FSDP_OK) ||
            (st = check_group_collectives(c, dev, world)) != FSDP_OK)
            return st;
    }
    FSDP_RANK_REQUIRE_OK(&c->fail, dev, fsdp_dev_barrier(dev, par));

    /* a split of a split: within the parity group, halves by group rank */
    FSDP_RANK_REQUIRE_OK(&c->fail, dev,
                         fsdp_dev_group_split(dev, par, par->rank / 2, par->rank, &nested));
    n = 0;
    for (int i = par->rank / 2 * 2; i < par->size && i < par->rank / 2 * 2 + 2; i++)
        members[n++] = par->ranks[i];
    snprintf(name, sizeof(name), "world/split(%d)/split(%d)", r % 2, par->rank / 2);
    if ((st = check_group(c, dev, nested, members, n, name)) != FSDP_OK ||
        (st = check_group_collectives(c, dev, nested)) != FSDP_OK)
        return st;

    fsdp_dev_group_destroy(dev, nested);
    fsdp_dev_group_destroy(dev, none);
    fsdp_dev_group_destroy(dev, rev);
    fsdp_dev_group_destroy(dev, pair);
    fsdp_dev_group_destroy(dev, world); /* the backend's: a no-op */
    /* a group stays usable by the others after one member destroyed its handle */
    if ((st = check_group_collectives(c, dev, par)) != FSDP_OK)
        return st;
    fsdp_dev_group_destroy(dev, par);
    return check_group_collectives(c, dev, world);
}

static void test_split(void)
{
    run_on_worlds(rank_split);
}

/* ---- group names ----------------------------------------------------------------------- */

#define NAMES_WORLD 8
#define NAMES_DEPTH 6
#define NAMES_SLOTS (4 + NAMES_DEPTH)

/* Each rank's groups, by the split call (slot) that made them: name and member set. */
typedef struct names_ctx {
    ctx_t c; /* first: rank functions get a ctx_t */
    char name[NAMES_WORLD][NAMES_SLOTS][FSDP_GROUP_NAME_SIZE];
    unsigned members[NAMES_WORLD][NAMES_SLOTS]; /* bit r: global rank r */
} names_ctx_t;

static void names_record(names_ctx_t *nc, fsdp_dev_t *dev, int slot, const fsdp_group_t *g)
{
    snprintf(nc->name[dev->rank][slot], FSDP_GROUP_NAME_SIZE, "%s", g->name);
    for (int i = 0; i < g->size; i++)
        nc->members[dev->rank][slot] |= 1u << g->ranks[i];
}

/* Splits of two parents with the same colors, a parent split twice with the same colors, a
 * split that keeps every member, and a chain of splits deep enough that its names outgrow the
 * name field. */
static fsdp_status_t rank_names(fsdp_dev_t *dev, void *arg)
{
    names_ctx_t *nc = arg;
    ctx_t *c = &nc->c;
    fsdp_group_t *world = fsdp_dev_group_world(dev), *g[NAMES_SLOTS];
    int r = dev->rank;

    FSDP_RANK_REQUIRE_OK(&c->fail, dev,
                         fsdp_dev_group_split(dev, world, r / 4, r, &g[0])); /* by node */
    FSDP_RANK_REQUIRE_OK(&c->fail, dev,
                         fsdp_dev_group_split(dev, world, r % 4, r, &g[1])); /* across nodes */
    FSDP_RANK_REQUIRE_OK(&c->fail, dev, fsdp_dev_group_split(dev, g[0], g[0]->rank % 2, 0, &g[2]));
    FSDP_RANK_REQUIRE_OK(&c->fail, dev,
                         fsdp_dev_group_split(dev, g[1], 0, 0, &g[3])); /* = g[1]'s members */
    for (int d = 0; d < NAMES_DEPTH; d++)
        FSDP_RANK_REQUIRE_OK(&c->fail, dev,
                             fsdp_dev_group_split(dev, d == 0 ? g[0] : g[3 + d], 0, 0, &g[4 + d]));
    for (int s = 0; s < NAMES_SLOTS; s++)
        names_record(nc, dev, s, g[s]);
    for (int s = NAMES_SLOTS - 1; s >= 0; s--)
        fsdp_dev_group_destroy(dev, g[s]);
    return FSDP_OK;
}

static void test_split_names(void)
{
    static names_ctx_t a, b;
    int hashed = 0;

    ctx_init(&a.c);
    launch_ok(NAMES_WORLD, rank_names, &a.c);
    ctx_init(&b.c);
    launch_ok(NAMES_WORLD, rank_names, &b.c);
    /* the same run names its groups the same */
    CU_ASSERT(memcmp(a.name, b.name, sizeof(a.name)) == 0);
    /* one name per group: the same split call and members, whatever the rank asking */
    for (int r = 0; r < NAMES_WORLD; r++)
        for (int s = 0; s < NAMES_SLOTS; s++)
            for (int r2 = 0; r2 < NAMES_WORLD; r2++)
                for (int s2 = 0; s2 < NAMES_SLOTS; s2++) {
                    int same = s == s2 && a.members[r][s] == a.members[r2][s2];
                    int named = strcmp(a.name[r][s], a.name[r2][s2]) == 0;
                    if (same != named)
                        fprintf(stderr, "\n  rank %d slot %d '%s', rank %d slot %d '%s'\n", r, s,
                                a.name[r][s], r2, s2, a.name[r2][s2]);
                    CU_ASSERT_EQUAL(same, named);
                }
    /* the rule itself: the parent's name, the round of its splits, the color */
    CU_ASSERT_STRING_EQUAL(a.name[5][0], "world/split(1)");
    CU_ASSERT_STRING_EQUAL(a.name[5][1], "world/split2(1)");
    CU_ASSERT_STRING_EQUAL(a.name[5][2], "world/split(1)/split(1)");
    CU_ASSERT_STRING_EQUAL(a.name[5][3], "world/split2(1)/split(0)");
    CU_ASSERT_STRING_EQUAL(a.name[5][4], "world/split(1)/split2(0)");
    for (int s = 0; s < NAMES_SLOTS; s++) {
        CU_ASSERT(strlen(a.name[0][s]) < FSDP_GROUP_NAME_SIZE);
        hashed += strncmp(a.name[0][s], "g:", 2) == 0;
    }
    CU_ASSERT(hashed > 0); /* the deep chain outgrew the field */
}

/* ---- determinism ----------------------------------------------------------------------- */

/* bf16 sums of 8 ranks, with each rank arriving after a different random delay per run: the
 * bits must be the same every time. */
static fsdp_status_t rank_determinism(fsdp_dev_t *dev, void *arg)
{
    ctx_t *c = arg;
    fsdp_group_t *g = fsdp_dev_group_world(dev);
    size_t n = 333, es = 2;
    uint8_t *send = dev_alloc(dev, n * es * g->size), *recv = dev_alloc(dev, n * es);
    unsigned seed = c->seed * 131u + (unsigned)dev->rank;

    FSDP_RANK_REQUIRE_MSG(&c->fail, dev->rank, send && recv, "segment_alloc failed");
    for (size_t j = 0; j < n * g->size; j++)
        put(send, FSDP_DTYPE_BF16, j, input(FSDP_DTYPE_F32, dev->rank, j));
    for (int k = 0; k < 4; k++) {
        if (c->jitter)
            usleep(rand_r(&seed) % 2000);
        FSDP_RANK_REQUIRE_OK(&c->fail, dev,
                             fsdp_dev_reduce_scatter(dev, g, send, recv, n, FSDP_DTYPE_BF16,
                                                     k % 2 ? FSDP_REDUCE_AVG : FSDP_REDUCE_SUM,
                                                     NULL));
        FSDP_RANK_REQUIRE_OK(&c->fail, dev,
                             fsdp_dev_all_gather(dev, g, recv, send, n, FSDP_DTYPE_BF16, NULL));
    }
    memcpy(c->out[dev->rank], send, n * es * g->size);
    dev_free(dev, send);
    dev_free(dev, recv);
    return FSDP_OK;
}

static void test_determinism(void)
{
    ctx_t first, again;
    size_t bytes = 333 * 2 * 8;

    ctx_init(&first);
    for (int r = 0; r < 8; r++)
        first.out[r] = calloc(1, bytes);
    launch_ok(8, rank_determinism, &first);
    for (int run = 1; run <= 4; run++) {
        ctx_init(&again);
        again.jitter = 1;
        again.seed = (unsigned)run;
        for (int r = 0; r < 8; r++)
            again.out[r] = calloc(1, bytes);
        launch_ok(8, rank_determinism, &again);
        for (int r = 0; r < 8; r++) {
            CU_ASSERT(memcmp(first.out[r], again.out[r], bytes) == 0);
            /* every rank holds the same gathered tensor */
            CU_ASSERT(memcmp(again.out[0], again.out[r], bytes) == 0);
        }
        for (int r = 0; r < 8; r++)
            free(again.out[r]);
    }
    for (int r = 0; r < 8; r++)
        free(first.out[r]);
}

/* ---- a large world, shape mode --------------------------------------------------------- */

static fsdp_status_t rank_large(fsdp_dev_t *dev, void *arg)
{
    ctx_t *c = arg;
    fsdp_group_t *world = fsdp_dev_group_world(dev), *node;
    void *buf = NULL;

    FSDP_RANK_REQUIRE_MSG(&c->fail, dev->rank,
                          dev->local_size == 8 && dev->local_rank == dev->rank % 8,
                          "local rank %d of %d", dev->local_rank, dev->local_size);
    FSDP_RANK_REQUIRE_OK(&c->fail, dev,
                         fsdp_dev_segment_alloc(dev, FSDP_MEMKIND_DEVICE, 1u << 30, &buf));
    FSDP_RANK_REQUIRE_MSG(&c->fail, dev->rank, buf != NULL, "shape-mode segment is NULL");
    /* shape mode: no data moves, fake pointers are never touched */
    FSDP_RANK_REQUIRE_OK(
        &c->fail, dev, fsdp_dev_all_gather(dev, world, buf, buf, 1u << 20, FSDP_DTYPE_BF16, NULL));
    FSDP_RANK_REQUIRE_OK(&c->fail, dev,
                         fsdp_dev_group_split(dev, world, dev->rank / 8, dev->rank, &node));
    FSDP_RANK_REQUIRE_MSG(&c->fail, dev->rank, node->size == 8 && node->rank == dev->local_rank,
                          "node group %d/%d", node->rank, node->size);
    FSDP_RANK_REQUIRE_OK(
        &c->fail, dev,
        fsdp_dev_reduce_scatter(dev, node, buf, buf, 1000, FSDP_DTYPE_F32, FSDP_REDUCE_AVG, NULL));
    FSDP_RANK_REQUIRE_OK(&c->fail, dev, fsdp_dev_barrier(dev, world));
    fsdp_dev_group_destroy(dev, node);
    fsdp_dev_segment_free(dev, FSDP_MEMKIND_DEVICE, buf);
    return FSDP_OK;
}

static void test_large_world(void)
{
    fsdp_sim_params_t p;
    ctx_t c;
    fsdp_status_t st;

    ctx_init(&c);
    fsdp_sim_params_init(&p);
    p.world_size = 1024;
    p.ranks_per_node = 8;
    p.mode = FSDP_SIM_SHAPE;
    st = fsdp_sim_launch(&p, rank_large, &c, NULL);
    CU_ASSERT_EQUAL(st, FSDP_OK);
    fsdp_test_failure_assert(&c.fail);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"all_gather", test_all_gather},
        {"reduce_scatter", test_reduce_scatter},
        {"all_reduce", test_all_reduce},
        {"broadcast", test_broadcast},
        {"split", test_split},
        {"split names", test_split_names},
        {"determinism", test_determinism},
        {"large_world", test_large_world},
        {NULL, NULL},
    };
    return fsdp_test_run("collectives", tests);
}
