/* The caching allocator (lib/memory.c) against docs/allocator.md part 1: rounding, pools, the
 * worked examples of section 1.10 byte for byte, split and merge, stream-aware reuse,
 * record_stream, the OOM path, statistics, and a randomized run against a model of its invariants.
 *
 * Each test drives an allocator over a real sim rank (world size 1). Checks in the rank thread
 * record the first failure, which the main thread asserts (no CUnit calls off the main thread).
 */
#include <fsdp/fsdp.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc_hidden.h"
#include "test_util.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* ---- harness ---------------------------------------------------------------------------- */

/* every check runs on the one rank (world size 1) */
static fsdp_test_failure_t failure;

#define CHECK(cond) FSDP_RANK_CHECK(&failure, 0, cond)
#define CHECK_EQ(a, b) FSDP_RANK_CHECK_EQ(&failure, 0, a, b)
#define CHECK_OK(call) CHECK_EQ((call), FSDP_OK)

typedef struct env {
    fsdp_dev_t *dev;
    fsdp_stream_t *s0, *s1, *s2; /* compute stream and two side streams */
} env_t;

typedef void (*body_func_t)(env_t *env);

typedef struct body {
    body_func_t func;
} body_t;

static fsdp_status_t rank_main(fsdp_dev_t *dev, void *arg)
{
    const body_t *body = arg;
    env_t env = {.dev = dev};

    env.s0 = fsdp_dev_compute_stream(dev);
    CHECK_OK(fsdp_dev_stream_create(dev, "side1", 0, &env.s1));
    CHECK_OK(fsdp_dev_stream_create(dev, "side2", 0, &env.s2));
    if (env.s1 != NULL && env.s2 != NULL)
        body->func(&env);
    fsdp_dev_stream_destroy(dev, env.s2);
    fsdp_dev_stream_destroy(dev, env.s1);
    return FSDP_OK;
}

static void run_mode(body_func_t func, fsdp_sim_mode_t mode)
{
    fsdp_sim_params_t p;
    body_t body = {func};
    fsdp_status_t st;

    fsdp_sim_params_init(&p);
    p.world_size = 1;
    p.mode = mode;
    st = fsdp_sim_launch(&p, rank_main, &body, NULL);
    CU_ASSERT_EQUAL(st, FSDP_OK);
    fsdp_test_failure_assert(&failure);
}

/* Shape mode: the sim hands out fake addresses, which the allocator must never dereference. */
static void run(body_func_t func)
{
    run_mode(func, FSDP_SIM_SHAPE);
}

/* Log capture (the handler is global; set only while no rank runs). */
static char last_error[2048];
static int n_errors;

static void capture_log(fsdp_log_level_t level, const char *file, int line, const char *func,
                        const char *msg, void *arg)
{
    (void)file, (void)line, (void)func, (void)arg;
    if (level == FSDP_LOG_ERROR) {
        n_errors++;
        snprintf(last_error, sizeof(last_error), "%s", msg);
    }
}

static void capture_begin(void)
{
    last_error[0] = '\0';
    n_errors = 0;
    fsdp_log_set_handler(capture_log, NULL);
}

static void capture_end(void)
{
    fsdp_log_set_handler(NULL, NULL);
}

static fsdp_mem_t *mem_new(env_t *env, size_t capacity)
{
    fsdp_mem_t *mem = NULL;

    CHECK_OK(fsdp_mem_create(env->dev, capacity, &mem));
    return mem;
}

static fsdp_mem_stats_t stats_of(const fsdp_mem_t *mem)
{
    fsdp_mem_stats_t st;

    fsdp_mem_get_stats(mem, &st);
    return st;
}

static void *alloc_on(fsdp_mem_t *mem, size_t bytes, fsdp_stream_t *stream)
{
    void *p = NULL;

    CHECK_OK(fsdp_mem_alloc(mem, bytes, FSDP_MEM_TEMPORARY, stream, &p));
    CHECK(p != NULL);
    return p;
}

static void *alloc_cat(fsdp_mem_t *mem, size_t bytes, fsdp_mem_category_t cat)
{
    void *p = NULL;

    CHECK_OK(fsdp_mem_alloc(mem, bytes, cat, NULL, &p));
    CHECK(p != NULL);
    return p;
}

static char *cp(void *p)
{
    return (char *)p;
}

#define ALL(st) ((st).pool[FSDP_MEM_POOL_ALL])
#define SMALL(st) ((st).pool[FSDP_MEM_POOL_SMALL])
#define LARGE(st) ((st).pool[FSDP_MEM_POOL_LARGE])

/* What a snapshot says. */
typedef struct census {
    size_t n_segments, reserved, n_blocks, n_free, n_pending, n_allocated, allocated;
    const void *last_base;
} census_t;

static void census_visit(const fsdp_mem_segment_info_t *seg, const fsdp_mem_block_info_t *b,
                         void *arg)
{
    census_t *c = arg;

    if (seg->base != c->last_base) {
        c->n_segments++;
        c->reserved += seg->size;
        c->last_base = seg->base;
    }
    c->n_blocks++;
    if (b->state == FSDP_MEM_BLOCK_FREE)
        c->n_free++;
    else if (b->state == FSDP_MEM_BLOCK_PENDING)
        c->n_pending++;
    else {
        c->n_allocated++;
        c->allocated += b->size;
    }
}

static census_t census(const fsdp_mem_t *mem)
{
    census_t c;

    memset(&c, 0, sizeof(c));
    fsdp_mem_snapshot(mem, census_visit, &c);
    return c;
}

/* ---- rounding and pools ------------------------------------------------------------------ */

static void body_rounding(env_t *env)
{
    fsdp_mem_t *mem = mem_new(env, 0);
    fsdp_mem_stats_t st;
    void *p = (void *)&p, *a, *b;

    CHECK_EQ(fsdp_mem_round_size(0), 512);
    CHECK_EQ(fsdp_mem_round_size(1), 512);
    CHECK_EQ(fsdp_mem_round_size(512), 512);
    CHECK_EQ(fsdp_mem_round_size(513), 1024);
    CHECK_EQ(fsdp_mem_round_size(700001), 700416);
    CHECK_EQ(fsdp_mem_round_size(716800), 716800);
    CHECK_EQ(fsdp_mem_round_size(SIZE_MAX), 0);

    /* 0 bytes: NULL, and nothing happens */
    CHECK_OK(fsdp_mem_alloc(mem, 0, FSDP_MEM_TEMPORARY, NULL, &p));
    CHECK(p == NULL);
    st = stats_of(mem);
    CHECK_EQ(st.num_allocs, 0);
    CHECK_EQ(st.reserved, 0);

    a = alloc_on(mem, 1, NULL);
    st = stats_of(mem);
    CHECK_EQ(st.allocated, 512);
    CHECK_EQ(st.requested, 1);
    CHECK_EQ(st.reserved, 2 * MiB);
    CHECK_EQ(fsdp_mem_block_size(mem, a), 512);

    b = alloc_on(mem, 700001, NULL);
    CHECK_EQ(fsdp_mem_block_size(mem, b), 700416);
    CHECK(cp(b) == cp(a) + 512);
    st = stats_of(mem);
    CHECK_EQ(st.allocated, 512 + 700416);
    CHECK_EQ(st.requested, 1 + 700001);
    CHECK_EQ(st.reserved, 2 * MiB);
    CHECK_EQ(ALL(st).segment.current, 1);

    /* a bad category is refused */
    capture_begin();
    CHECK_EQ(fsdp_mem_alloc(mem, 1, FSDP_MEM_CATEGORY_COUNT, NULL, &p), FSDP_ERR_INVALID_PARAM);
    capture_end();
    CHECK(strstr(last_error, "invalid memory category 8") != NULL);
    fsdp_mem_free(mem, a);
    fsdp_mem_free(mem, b);
    fsdp_mem_free(mem, NULL);
    CHECK_OK(fsdp_mem_check(mem));
    fsdp_mem_destroy(mem);
    fsdp_mem_destroy(NULL);
}

static void test_rounding(void)
{
    run(body_rounding);
}

static void body_pool_edge(env_t *env)
{
    fsdp_mem_t *mem = mem_new(env, 0);
    fsdp_mem_stats_t st;
    void *a, *b;

    /* exactly 1 MiB: small pool, a 2 MiB segment, 1 MiB tail split off (>= 512) */
    a = alloc_on(mem, MiB, NULL);
    st = stats_of(mem);
    CHECK_EQ(SMALL(st).reserved_bytes.current, 2 * MiB);
    CHECK_EQ(SMALL(st).allocated_bytes.current, MiB);
    CHECK_EQ(SMALL(st).inactive_split_bytes.current, MiB);
    CHECK_EQ(LARGE(st).reserved_bytes.current, 0);
    CHECK_EQ(fsdp_mem_block_size(mem, a), MiB);

    /* 1 MiB + 1: rounds to 1,049,088, large pool, a 20 MiB segment */
    b = alloc_on(mem, MiB + 1, NULL);
    st = stats_of(mem);
    CHECK_EQ(fsdp_mem_block_size(mem, b), 1049088);
    CHECK_EQ(LARGE(st).reserved_bytes.current, 20 * MiB);
    CHECK_EQ(LARGE(st).allocated_bytes.current, 1049088);
    CHECK_EQ(LARGE(st).inactive_split_bytes.current, 20 * MiB - 1049088);
    CHECK_EQ(SMALL(st).allocated_bytes.current, MiB);
    CHECK_EQ(ALL(st).reserved_bytes.current, 22 * MiB);
    CHECK_EQ(ALL(st).segment.current, 2);
    CHECK_EQ(SMALL(st).segment.current, 1);
    CHECK_EQ(LARGE(st).segment.current, 1);

    /* the small pool's 1 MiB tail does not serve a large request, nor the reverse */
    fsdp_mem_free(mem, b);
    b = alloc_on(mem, 1024 * KiB + 512, NULL);
    CHECK_EQ(stats_of(mem).reserved, 22 * MiB);
    fsdp_mem_free(mem, b);
    fsdp_mem_free(mem, a);
    CHECK_OK(fsdp_mem_check(mem));
    fsdp_mem_destroy(mem);
}

static void test_pool_edge(void)
{
    run(body_pool_edge);
}

/* ---- worked examples of section 1.10 ----------------------------------------------------- */

static void body_example_700k(env_t *env)
{
    fsdp_mem_t *mem = mem_new(env, 0);
    fsdp_mem_stats_t st;
    void *p1, *p2, *p3;

    p1 = alloc_on(mem, 716800, NULL);
    st = stats_of(mem);
    CHECK_EQ(ALL(st).reserved_bytes.current, 2097152);
    CHECK_EQ(ALL(st).allocated_bytes.current, 716800);
    CHECK_EQ(ALL(st).active_bytes.current, 716800);
    CHECK_EQ(ALL(st).requested_bytes.current, 716800);
    CHECK_EQ(ALL(st).inactive_split_bytes.current, 1380352);
    CHECK_EQ(ALL(st).inactive_split.current, 1);
    CHECK_EQ(SMALL(st).inactive_split_bytes.current, 1380352);
    CHECK_EQ(st.num_device_alloc, 1);

    /* the second takes the tail and splits it again, leaving 663,552 */
    p2 = alloc_on(mem, 716800, NULL);
    CHECK(cp(p2) == cp(p1) + 716800);
    st = stats_of(mem);
    CHECK_EQ(ALL(st).reserved_bytes.current, 2097152);
    CHECK_EQ(ALL(st).allocated_bytes.current, 2 * 716800);
    CHECK_EQ(ALL(st).inactive_split_bytes.current, 663552);
    CHECK_EQ(ALL(st).inactive_split.current, 1);

    /* the third needs a new 2 MiB segment */
    p3 = alloc_on(mem, 716800, NULL);
    CHECK(cp(p3) < cp(p1) || cp(p3) >= cp(p1) + 2097152);
    st = stats_of(mem);
    CHECK_EQ(ALL(st).reserved_bytes.current, 2 * 2097152);
    CHECK_EQ(ALL(st).segment.current, 2);
    CHECK_EQ(ALL(st).allocated_bytes.current, 3 * 716800);
    CHECK_EQ(ALL(st).inactive_split_bytes.current, 663552 + 1380352);
    CHECK_EQ(ALL(st).inactive_split.current, 2);
    CHECK_EQ(st.num_device_alloc, 2);
    CHECK_EQ(LARGE(st).reserved_bytes.current, 0);

    /* freeing everything merges each segment back into one block; nothing is returned */
    fsdp_mem_free(mem, p2);
    fsdp_mem_free(mem, p1);
    fsdp_mem_free(mem, p3);
    st = stats_of(mem);
    CHECK_EQ(ALL(st).allocated_bytes.current, 0);
    CHECK_EQ(ALL(st).active_bytes.current, 0);
    CHECK_EQ(ALL(st).requested_bytes.current, 0);
    CHECK_EQ(ALL(st).inactive_split.current, 0);
    CHECK_EQ(ALL(st).inactive_split_bytes.current, 0);
    CHECK_EQ(ALL(st).reserved_bytes.current, 2 * 2097152);
    CHECK_EQ(st.num_device_free, 0);
    CHECK_EQ(census(mem).n_blocks, 2);
    CHECK_OK(fsdp_mem_check(mem));
    fsdp_mem_destroy(mem);
}

static void test_example_700k(void)
{
    run(body_example_700k);
}

static void body_example_3m(env_t *env)
{
    fsdp_mem_t *mem = mem_new(env, 0);
    fsdp_mem_stats_t st;
    void *p[8];

    for (int i = 0; i < 6; i++) {
        p[i] = alloc_on(mem, 3 * MiB, NULL);
        if (i > 0)
            CHECK(cp(p[i]) == cp(p[i - 1]) + 3 * MiB);
        st = stats_of(mem);
        CHECK_EQ(ALL(st).reserved_bytes.current, 20 * MiB);
        CHECK_EQ(ALL(st).inactive_split_bytes.current, 20 * MiB - (size_t)(i + 1) * 3 * MiB);
        CHECK_EQ(ALL(st).inactive_split.current, 1);
    }
    /* the 6th left a 2 MiB tail (2 > 1, so it split); the 7th opens a second segment */
    p[6] = alloc_on(mem, 3 * MiB, NULL);
    st = stats_of(mem);
    CHECK_EQ(ALL(st).reserved_bytes.current, 40 * MiB);
    CHECK_EQ(LARGE(st).reserved_bytes.current, 40 * MiB);
    CHECK_EQ(ALL(st).segment.current, 2);
    CHECK_EQ(ALL(st).allocated_bytes.current, 21 * MiB);
    CHECK_EQ(ALL(st).inactive_split_bytes.current, 2 * MiB + 17 * MiB);
    CHECK_EQ(ALL(st).inactive_split.current, 2);
    CHECK(cp(p[6]) < cp(p[0]) || cp(p[6]) >= cp(p[0]) + 20 * MiB);

    /* a request of > 1 and <= 2 MiB on the same stream takes the 2 MiB tail whole (best fit;
     * 0.5 MiB left is not > 1 MiB, so no split) */
    p[7] = alloc_on(mem, 3 * MiB / 2, NULL);
    CHECK(cp(p[7]) == cp(p[5]) + 3 * MiB);
    CHECK_EQ(fsdp_mem_block_size(mem, p[7]), 2 * MiB);
    st = stats_of(mem);
    CHECK_EQ(ALL(st).allocated_bytes.current, 23 * MiB);
    CHECK_EQ(ALL(st).requested_bytes.current, 21 * MiB + 3 * MiB / 2);
    CHECK_EQ(ALL(st).inactive_split_bytes.current, 17 * MiB);
    CHECK_EQ(ALL(st).inactive_split.current, 1);
    CHECK_EQ(ALL(st).reserved_bytes.current, 40 * MiB);
    CHECK_OK(fsdp_mem_check(mem));
    for (int i = 0; i < 8; i++)
        fsdp_mem_free(mem, p[i]);
    CHECK_EQ(census(mem).n_blocks, 2);
    CHECK_OK(fsdp_mem_check(mem));
    fsdp_mem_destroy(mem);
}

static void test_example_3m(void)
{
    run(body_example_3m);
}

static void body_example_25m(env_t *env)
{
    fsdp_mem_t *mem = mem_new(env, 0);
    fsdp_mem_stats_t st;
    void *a, *b;

    /* a 26 MiB segment; 1,048,576 left is not > 1 MiB: no split, the slack is allocated */
    a = alloc_on(mem, 26214400, NULL);
    st = stats_of(mem);
    CHECK_EQ(ALL(st).reserved_bytes.current, 27262976);
    CHECK_EQ(ALL(st).allocated_bytes.current, 27262976);
    CHECK_EQ(ALL(st).active_bytes.current, 27262976);
    CHECK_EQ(ALL(st).requested_bytes.current, 26214400);
    CHECK_EQ(ALL(st).inactive_split.current, 0);
    CHECK_EQ(ALL(st).inactive_split_bytes.current, 0);
    CHECK_EQ(fsdp_mem_block_size(mem, a), 27262976);
    CHECK_EQ(census(mem).n_blocks, 1);
    fsdp_mem_free(mem, a);
    fsdp_mem_destroy(mem);

    /* a cached free 40 MiB block on the same stream is split instead: 15 MiB free tail */
    mem = mem_new(env, 0);
    a = alloc_on(mem, 40 * MiB, NULL);
    CHECK_EQ(stats_of(mem).reserved, 40 * MiB);
    CHECK_EQ(fsdp_mem_block_size(mem, a), 40 * MiB);
    fsdp_mem_free(mem, a);
    b = alloc_on(mem, 26214400, NULL);
    CHECK(b == a);
    st = stats_of(mem);
    CHECK_EQ(ALL(st).reserved_bytes.current, 40 * MiB);
    CHECK_EQ(st.num_device_alloc, 1);
    CHECK_EQ(ALL(st).allocated_bytes.current, 26214400);
    CHECK_EQ(ALL(st).inactive_split_bytes.current, 15 * MiB);
    CHECK_EQ(ALL(st).inactive_split.current, 1);
    fsdp_mem_free(mem, b);
    fsdp_mem_destroy(mem);

    /* a free 26 MiB block on another stream is ignored: a new segment */
    mem = mem_new(env, 0);
    a = alloc_on(mem, 26214400, env->s1);
    fsdp_mem_free(mem, a);
    b = alloc_on(mem, 26214400, env->s0);
    CHECK(b != a);
    st = stats_of(mem);
    CHECK_EQ(ALL(st).reserved_bytes.current, 2 * 27262976);
    CHECK_EQ(st.num_device_alloc, 2);
    CHECK_EQ(ALL(st).allocated_bytes.current, 27262976);
    fsdp_mem_free(mem, b);
    CHECK_OK(fsdp_mem_check(mem));
    fsdp_mem_destroy(mem);
}

static void test_example_25m(void)
{
    run(body_example_25m);
}

static void body_example_10m(env_t *env)
{
    fsdp_mem_t *mem = mem_new(env, 0);
    fsdp_mem_stats_t st;
    void *a, *b;

    /* exactly 10 MiB: a 10 MiB segment, no split */
    a = alloc_on(mem, 10 * MiB, NULL);
    st = stats_of(mem);
    CHECK_EQ(ALL(st).reserved_bytes.current, 10485760);
    CHECK_EQ(ALL(st).allocated_bytes.current, 10485760);
    CHECK_EQ(ALL(st).inactive_split.current, 0);
    CHECK_EQ(census(mem).n_blocks, 1);

    /* just below 10 MiB shares a 20 MiB segment (kLargeBuffer) */
    b = alloc_on(mem, 10 * MiB - 512, NULL);
    st = stats_of(mem);
    CHECK_EQ(ALL(st).reserved_bytes.current, 10485760 + 20 * MiB);
    CHECK_EQ(fsdp_mem_block_size(mem, b), 10 * MiB - 512);
    CHECK_EQ(ALL(st).inactive_split_bytes.current, 10 * MiB + 512);

    /* 11 MiB + 1 rounds its segment up to 12 MiB; 1 MiB - 512 of slack stays with it (on a
     * stream with no cached block) */
    fsdp_mem_free(mem, a);
    fsdp_mem_free(mem, b);
    a = alloc_on(mem, 11 * MiB + 1, env->s1);
    st = stats_of(mem);
    CHECK_EQ(fsdp_mem_block_size(mem, a), 12 * MiB);
    CHECK_EQ(ALL(st).reserved_bytes.current, 10485760 + 20 * MiB + 12 * MiB);
    fsdp_mem_free(mem, a);
    CHECK_OK(fsdp_mem_check(mem));
    fsdp_mem_destroy(mem);
}

static void test_example_10m(void)
{
    run(body_example_10m);
}

/* ---- split and merge ---------------------------------------------------------------------- */

static void body_split_merge(env_t *env)
{
    fsdp_mem_t *mem = mem_new(env, 0);
    fsdp_mem_stats_t st;
    void *q[4], *l[3];
    census_t c;

    /* four 512 KiB blocks tile one 2 MiB segment; the last takes the exact remainder */
    for (int i = 0; i < 4; i++) {
        q[i] = alloc_on(mem, 512 * KiB, NULL);
        st = stats_of(mem);
        CHECK_EQ(ALL(st).inactive_split_bytes.current, (size_t)(3 - i) * 512 * KiB);
        CHECK_EQ(ALL(st).inactive_split.current, i < 3 ? 1 : 0);
    }
    CHECK(cp(q[3]) == cp(q[0]) + 3 * 512 * KiB);
    CHECK_EQ(stats_of(mem).reserved, 2 * MiB);

    /* free the middle: one inactive piece */
    fsdp_mem_free(mem, q[1]);
    st = stats_of(mem);
    CHECK_EQ(ALL(st).inactive_split.current, 1);
    CHECK_EQ(ALL(st).inactive_split_bytes.current, 512 * KiB);
    /* then its right neighbour: merged into one piece */
    fsdp_mem_free(mem, q[2]);
    st = stats_of(mem);
    CHECK_EQ(ALL(st).inactive_split.current, 1);
    CHECK_EQ(ALL(st).inactive_split_bytes.current, MiB);
    CHECK_EQ(census(mem).n_blocks, 3);
    /* then its left neighbour: still one piece, of 1.5 MiB */
    fsdp_mem_free(mem, q[0]);
    st = stats_of(mem);
    CHECK_EQ(ALL(st).inactive_split.current, 1);
    CHECK_EQ(ALL(st).inactive_split_bytes.current, 3 * 512 * KiB);
    c = census(mem);
    CHECK_EQ(c.n_blocks, 2);
    CHECK_EQ(c.n_free, 1);
    /* a 1 MiB request splits the merged piece again, from the segment base */
    q[0] = alloc_on(mem, MiB, NULL);
    CHECK(cp(q[0]) == cp(q[3]) - 3 * 512 * KiB);
    st = stats_of(mem);
    CHECK_EQ(ALL(st).inactive_split.current, 1);
    CHECK_EQ(ALL(st).inactive_split_bytes.current, 512 * KiB);
    fsdp_mem_free(mem, q[0]);
    /* the last free makes the segment one unsplit free block again, still reserved */
    fsdp_mem_free(mem, q[3]);
    st = stats_of(mem);
    CHECK_EQ(ALL(st).inactive_split.current, 0);
    CHECK_EQ(ALL(st).inactive_split_bytes.current, 0);
    CHECK_EQ(ALL(st).reserved_bytes.current, 2 * MiB);
    CHECK_EQ(st.num_device_free, 0);
    c = census(mem);
    CHECK_EQ(c.n_blocks, 1);
    CHECK_EQ(c.n_free, 1);

    /* large pool: three 3 MiB blocks; free the middle (two inactive pieces), then the last
     * (it merges with both neighbours: one piece of 17 MiB) */
    for (int i = 0; i < 3; i++)
        l[i] = alloc_on(mem, 3 * MiB, NULL);
    fsdp_mem_free(mem, l[1]);
    st = stats_of(mem);
    CHECK_EQ(LARGE(st).inactive_split.current, 2);
    CHECK_EQ(LARGE(st).inactive_split_bytes.current, 3 * MiB + 11 * MiB);
    fsdp_mem_free(mem, l[2]);
    st = stats_of(mem);
    CHECK_EQ(LARGE(st).inactive_split.current, 1);
    CHECK_EQ(LARGE(st).inactive_split_bytes.current, 17 * MiB);
    CHECK_EQ(census(mem).n_blocks, 1 + 2);
    fsdp_mem_free(mem, l[0]);
    st = stats_of(mem);
    CHECK_EQ(LARGE(st).inactive_split.current, 0);
    CHECK_EQ(census(mem).n_blocks, 2);
    /* inactive_split's cumulative counters saw every change */
    CHECK(LARGE(st).inactive_split_bytes.allocated == LARGE(st).inactive_split_bytes.freed);
    CHECK_OK(fsdp_mem_check(mem));
    fsdp_mem_destroy(mem);
}

static void test_split_merge(void)
{
    run(body_split_merge);
}

/* ---- streams ------------------------------------------------------------------------------ */

static void body_stream_reuse(env_t *env)
{
    fsdp_mem_t *mem = mem_new(env, 0);
    void *a, *b, *c;

    a = alloc_on(mem, 3 * MiB, env->s1);
    fsdp_mem_free(mem, a);
    /* stream s2 may not use s1's free block */
    b = alloc_on(mem, 3 * MiB, env->s2);
    CHECK(b != a);
    CHECK_EQ(stats_of(mem).reserved, 40 * MiB);
    /* s1 gets its block back */
    c = alloc_on(mem, 3 * MiB, env->s1);
    CHECK(c == a);
    CHECK_EQ(stats_of(mem).reserved, 40 * MiB);
    fsdp_mem_free(mem, c);
    fsdp_mem_free(mem, b);

    /* same in the small pool; NULL is the compute stream */
    a = alloc_on(mem, 4096, NULL);
    fsdp_mem_free(mem, a);
    b = alloc_on(mem, 4096, env->s1);
    CHECK(b != a);
    c = alloc_on(mem, 4096, env->s0);
    CHECK(c == a);
    CHECK_EQ(stats_of(mem).pool[FSDP_MEM_POOL_SMALL].reserved_bytes.current, 4 * MiB);
    fsdp_mem_free(mem, b);
    fsdp_mem_free(mem, c);
    CHECK_OK(fsdp_mem_check(mem));
    fsdp_mem_destroy(mem);
}

static void test_stream_reuse(void)
{
    run(body_stream_reuse);
}

static void body_record_stream(env_t *env)
{
    fsdp_mem_t *mem = mem_new(env, 0);
    fsdp_mem_stats_t st;
    census_t c;
    void *x, *y;
    int dummy;

    x = alloc_on(mem, 716800, env->s0);
    CHECK_OK(fsdp_mem_record_stream(mem, x, env->s1));
    CHECK_OK(fsdp_mem_record_stream(mem, x, env->s1)); /* a set: recorded once */
    fsdp_mem_free(mem, x);
    /* freed: no longer allocated, but still active and out of the pool */
    st = stats_of(mem);
    CHECK_EQ(ALL(st).allocated_bytes.current, 0);
    CHECK_EQ(ALL(st).allocation.current, 0);
    CHECK_EQ(ALL(st).active_bytes.current, 716800);
    CHECK_EQ(ALL(st).active.current, 1);
    CHECK_EQ(ALL(st).requested_bytes.current, 716800);
    CHECK_EQ(ALL(st).inactive_split_bytes.current, 1380352);
    CHECK_EQ(st.by_category[FSDP_MEM_TEMPORARY], 0);
    c = census(mem);
    CHECK_EQ(c.n_pending, 1);
    CHECK_EQ(c.n_blocks, 2);
    CHECK_OK(fsdp_mem_check(mem));

    /* the next malloc first processes events: with eager execution the event is done, the
     * block goes back to the pool (merged with its tail), and the request reuses it */
    y = alloc_on(mem, 716800, env->s0);
    CHECK(y == x);
    st = stats_of(mem);
    CHECK_EQ(ALL(st).active_bytes.current, 716800);
    CHECK_EQ(ALL(st).active.current, 1);
    CHECK_EQ(ALL(st).reserved_bytes.current, 2 * MiB);
    CHECK_EQ(st.num_device_alloc, 1);
    CHECK_EQ(census(mem).n_pending, 0);

    /* a use on the allocation stream needs no event: freed at once */
    CHECK_OK(fsdp_mem_record_stream(mem, y, env->s0));
    CHECK_OK(fsdp_mem_record_stream(mem, y, NULL));
    fsdp_mem_free(mem, y);
    st = stats_of(mem);
    CHECK_EQ(ALL(st).active.current, 0);
    CHECK_EQ(census(mem).n_pending, 0);

    /* two streams: two events, and the block waits for both */
    x = alloc_on(mem, 716800, env->s0);
    CHECK_OK(fsdp_mem_record_stream(mem, x, env->s1));
    CHECK_OK(fsdp_mem_record_stream(mem, x, env->s2));
    fsdp_mem_free(mem, x);
    CHECK_EQ(census(mem).n_pending, 1);
    y = alloc_on(mem, 1024, env->s0);
    CHECK(y == x);
    CHECK_EQ(census(mem).n_pending, 0);
    fsdp_mem_free(mem, y);

    /* record_stream of NULL is fine; of a pointer that is not a live block, an error */
    CHECK_OK(fsdp_mem_record_stream(mem, NULL, env->s1));
    capture_begin();
    CHECK_EQ(fsdp_mem_record_stream(mem, &dummy, env->s1), FSDP_ERR_INVALID_PARAM);
    fsdp_mem_free(mem, y); /* double free: logged, ignored */
    capture_end();
    CHECK_EQ(n_errors, 2);
    CHECK(strstr(last_error, "not a live block") != NULL);
    CHECK_EQ(stats_of(mem).num_frees, 4);
    CHECK_OK(fsdp_mem_check(mem));
    fsdp_mem_destroy(mem);
}

static void test_record_stream(void)
{
    run(body_record_stream);
}

/* A wrapper dev over the sim rank whose events complete only when the test opens a gate, and
 * whose segments can be made to fail: what virtual time and a full device will do. */
typedef struct gate_dev {
    fsdp_dev_t super;
    fsdp_backend_ops_t ops;
    fsdp_dev_t *inner;
    int open;
    int fail_segments;
    int n_query, n_sync, n_segment_alloc, n_segment_free;
} gate_dev_t;

static fsdp_dev_t *inner_of(fsdp_dev_t *dev)
{
    return ((gate_dev_t *)dev)->inner;
}

static fsdp_status_t gate_segment_alloc(fsdp_dev_t *dev, fsdp_memkind_t kind, size_t bytes,
                                        void **ptr_p)
{
    gate_dev_t *g = (gate_dev_t *)dev;

    g->n_segment_alloc++;
    if (g->fail_segments)
        return FSDP_ERR_OUT_OF_MEMORY;
    return fsdp_dev_segment_alloc(g->inner, kind, bytes, ptr_p);
}

static void gate_segment_free(fsdp_dev_t *dev, fsdp_memkind_t kind, void *ptr)
{
    ((gate_dev_t *)dev)->n_segment_free++;
    inner_of(dev)->ops->segment_free(inner_of(dev), kind, ptr);
}

static fsdp_stream_t *gate_compute_stream(fsdp_dev_t *dev)
{
    return inner_of(dev)->ops->compute_stream(inner_of(dev));
}

static fsdp_status_t gate_stream_synchronize(fsdp_dev_t *dev, fsdp_stream_t *stream)
{
    return inner_of(dev)->ops->stream_synchronize(inner_of(dev), stream);
}

static fsdp_status_t gate_event_create(fsdp_dev_t *dev, fsdp_event_t **event_p)
{
    return inner_of(dev)->ops->event_create(inner_of(dev), event_p);
}

static void gate_event_destroy(fsdp_dev_t *dev, fsdp_event_t *event)
{
    inner_of(dev)->ops->event_destroy(inner_of(dev), event);
}

static fsdp_status_t gate_event_record(fsdp_dev_t *dev, fsdp_event_t *event, fsdp_stream_t *stream)
{
    return inner_of(dev)->ops->event_record(inner_of(dev), event, stream);
}

static fsdp_status_t gate_event_query(fsdp_dev_t *dev, fsdp_event_t *event, int *done_p)
{
    gate_dev_t *g = (gate_dev_t *)dev;
    fsdp_status_t status = fsdp_dev_event_query(g->inner, event, done_p);

    g->n_query++;
    if (status == FSDP_OK && !g->open)
        *done_p = 0;
    return status;
}

static fsdp_status_t gate_event_synchronize(fsdp_dev_t *dev, fsdp_event_t *event)
{
    ((gate_dev_t *)dev)->n_sync++;
    return inner_of(dev)->ops->event_synchronize(inner_of(dev), event);
}

static void gate_init(gate_dev_t *g, fsdp_dev_t *inner)
{
    memset(g, 0, sizeof(*g));
    g->super = *inner;
    g->inner = inner;
    g->ops = *inner->ops;
    g->ops.name = "gate";
    g->ops.segment_alloc = gate_segment_alloc;
    g->ops.segment_free = gate_segment_free;
    g->ops.compute_stream = gate_compute_stream;
    g->ops.stream_synchronize = gate_stream_synchronize;
    g->ops.event_create = gate_event_create;
    g->ops.event_destroy = gate_event_destroy;
    g->ops.event_record = gate_event_record;
    g->ops.event_query = gate_event_query;
    g->ops.event_synchronize = gate_event_synchronize;
    g->super.ops = &g->ops;
}

static void body_record_stream_not_ready(env_t *env)
{
    gate_dev_t g;
    fsdp_mem_t *mem = NULL;
    fsdp_mem_stats_t st;
    void *x, *y, *z;

    gate_init(&g, env->dev);
    CHECK_OK(fsdp_mem_create(&g.super, 0, &mem));
    x = alloc_on(mem, 3 * MiB, env->s0);
    CHECK_OK(fsdp_mem_record_stream(mem, x, env->s1));
    fsdp_mem_free(mem, x);
    /* the side stream has not passed the free: the block stays out of the pool */
    y = alloc_on(mem, 3 * MiB, env->s0);
    CHECK(g.n_query >= 1);
    CHECK(cp(y) == cp(x) + 3 * MiB);
    st = stats_of(mem);
    CHECK_EQ(ALL(st).allocated_bytes.current, 3 * MiB);
    CHECK_EQ(ALL(st).active_bytes.current, 6 * MiB);
    CHECK_EQ(census(mem).n_pending, 1);
    CHECK_OK(fsdp_mem_check(mem));
    /* now it has: the next malloc frees it first (best fit: its 3 MiB beats the 14 MiB tail) */
    g.open = 1;
    z = alloc_on(mem, 3 * MiB, env->s0);
    CHECK(z == x);
    CHECK_EQ(census(mem).n_pending, 0);
    CHECK_EQ(stats_of(mem).reserved, 20 * MiB);
    fsdp_mem_free(mem, y);
    fsdp_mem_free(mem, z);
    fsdp_mem_destroy(mem);

    /* the OOM path waits on outstanding events, then releases what they freed */
    gate_init(&g, env->dev);
    CHECK_OK(fsdp_mem_create(&g.super, 40 * MiB, &mem));
    x = alloc_on(mem, 25 * MiB, env->s0); /* a 26 MiB segment */
    CHECK_OK(fsdp_mem_record_stream(mem, x, env->s2));
    fsdp_mem_free(mem, x);
    y = alloc_on(mem, 20 * MiB, env->s1); /* 26 + 20 > 40: release, then retry */
    st = stats_of(mem);
    CHECK_EQ(g.n_sync, 1);
    CHECK_EQ(st.num_sync_all_streams, 1);
    CHECK_EQ(st.num_alloc_retries, 1);
    CHECK_EQ(st.num_ooms, 0);
    CHECK_EQ(st.num_device_free, 1);
    CHECK_EQ(g.n_segment_free, 1);
    CHECK_EQ(ALL(st).reserved_bytes.current, 20 * MiB);
    CHECK_EQ(ALL(st).active_bytes.current, 20 * MiB);
    CHECK_EQ(census(mem).n_pending, 0);
    fsdp_mem_free(mem, y);

    /* the backend's own out-of-memory answer takes the same path */
    g.fail_segments = 1;
    capture_begin();
    z = (void *)&z;
    CHECK_EQ(fsdp_mem_alloc(mem, 30 * MiB, FSDP_MEM_ACTIVATION, env->s0, &z),
             FSDP_ERR_OUT_OF_MEMORY);
    capture_end();
    CHECK(z == (void *)&z); /* outputs are written only on success */
    st = stats_of(mem);
    CHECK_EQ(st.num_alloc_retries, 2);
    CHECK_EQ(st.num_ooms, 1);
    CHECK_EQ(st.num_device_free, 2); /* y's segment was released before the retry */
    CHECK_EQ(ALL(st).reserved_bytes.current, 0);
    CHECK_EQ(n_errors, 1);
    CHECK(strstr(last_error, "out of device memory") != NULL);
    CHECK_OK(fsdp_mem_check(mem));
    fsdp_mem_destroy(mem);
}

static void test_record_stream_not_ready(void)
{
    run(body_record_stream_not_ready);
}

/* ---- out of memory ------------------------------------------------------------------------ */

static void body_oom(env_t *env)
{
    fsdp_mem_t *mem = mem_new(env, 40 * MiB);
    fsdp_mem_stats_t st;
    void *a, *x, *p;
    char want[128];

    /* two cached 20 MiB segments on two streams fill the capacity */
    a = alloc_on(mem, 3 * MiB, env->s0);
    fsdp_mem_free(mem, a);
    a = alloc_on(mem, 3 * MiB, env->s1);
    fsdp_mem_free(mem, a);
    CHECK_EQ(stats_of(mem).reserved, 40 * MiB);

    /* 25 MiB fits no free block; its 26 MiB segment would pass the capacity: the cache is
     * released (both segments, whatever their stream) and the allocation retried */
    CHECK_OK(fsdp_mem_alloc(mem, 25 * MiB, FSDP_MEM_UNSHARDED_PARAM, env->s0, &x));
    st = stats_of(mem);
    CHECK_EQ(st.num_alloc_retries, 1);
    CHECK_EQ(st.num_ooms, 0);
    CHECK_EQ(st.num_device_free, 2);
    CHECK_EQ(st.num_device_alloc, 3);
    CHECK_EQ(st.reserved, 27262976);
    CHECK_EQ(ALL(st).segment.current, 1);
    CHECK_EQ(st.peak_reserved, 40 * MiB);

    /* a real OOM: nothing to release; FSDP_ERR_OUT_OF_MEMORY, one error line */
    capture_begin();
    p = (void *)&p;
    CHECK_EQ(fsdp_mem_alloc(mem, 3 * MiB, FSDP_MEM_ACTIVATION, env->s1, &p),
             FSDP_ERR_OUT_OF_MEMORY);
    capture_end();
    CHECK(p == (void *)&p);
    st = stats_of(mem);
    CHECK_EQ(st.num_ooms, 1);
    CHECK_EQ(st.num_alloc_retries, 2);
    CHECK_EQ(st.num_allocs, 3);
    CHECK_EQ(st.allocated, 27262976);
    CHECK_EQ(st.reserved, 27262976);
    CHECK_EQ(n_errors, 1);
    CHECK(strstr(last_error, "rank 0") != NULL);
    CHECK(strstr(last_error, "out of device memory") != NULL);
    CHECK(strstr(last_error, "tried to allocate 20971520 bytes") != NULL);
    CHECK(strstr(last_error, "3145728 bytes of activation") != NULL);
    CHECK(strstr(last_error, "side1") != NULL);
    CHECK(strstr(last_error, "unsharded_param 27262976") != NULL);
    CHECK(strstr(last_error, "allocated 27262976") != NULL);
    CHECK(strstr(last_error, "reserved 27262976") != NULL);
    CHECK(strstr(last_error, "capacity 41943040") != NULL);
    snprintf(want, sizeof(want), "%s", fsdp_mem_category_name(FSDP_MEM_GRADIENT));
    CHECK(strstr(last_error, want) == NULL); /* categories holding nothing are left out */

    /* a request no segment can hold fails the same way */
    capture_begin();
    CHECK_EQ(fsdp_mem_alloc(mem, SIZE_MAX - 100, FSDP_MEM_TEMPORARY, NULL, &p),
             FSDP_ERR_OUT_OF_MEMORY);
    capture_end();
    CHECK_EQ(stats_of(mem).num_ooms, 2);

    /* after freeing, the same request succeeds: x's free segment (on another stream) is
     * released to make room */
    fsdp_mem_free(mem, x);
    CHECK_OK(fsdp_mem_alloc(mem, 3 * MiB, FSDP_MEM_ACTIVATION, env->s1, &p));
    st = stats_of(mem);
    CHECK_EQ(st.reserved, 20 * MiB);
    CHECK_EQ(st.num_alloc_retries, 4);
    CHECK_EQ(st.num_ooms, 2);
    fsdp_mem_free(mem, p);
    CHECK_OK(fsdp_mem_check(mem));
    fsdp_mem_destroy(mem);
}

static void test_oom(void)
{
    run(body_oom);
}

/* ---- statistics ----------------------------------------------------------------------------- */

static void body_category_peaks(env_t *env)
{
    fsdp_mem_t *mem = mem_new(env, 0);
    fsdp_mem_stats_t st;
    void *a, *b, *c, *d;

    a = alloc_cat(mem, MiB, FSDP_MEM_SHARDED_PARAM);
    b = alloc_cat(mem, 4 * MiB, FSDP_MEM_ACTIVATION);
    st = stats_of(mem);
    CHECK_EQ(st.peak_allocated, 5 * MiB);
    CHECK_EQ(st.at_peak_by_category[FSDP_MEM_SHARDED_PARAM], MiB);
    CHECK_EQ(st.at_peak_by_category[FSDP_MEM_ACTIVATION], 4 * MiB);
    fsdp_mem_free(mem, b);
    c = alloc_cat(mem, 2 * MiB, FSDP_MEM_GRADIENT);
    st = stats_of(mem);
    CHECK_EQ(st.allocated, 3 * MiB);
    CHECK_EQ(st.by_category[FSDP_MEM_ACTIVATION], 0);
    CHECK_EQ(st.by_category[FSDP_MEM_GRADIENT], 2 * MiB);
    CHECK_EQ(st.peak_by_category[FSDP_MEM_ACTIVATION], 4 * MiB);
    CHECK_EQ(st.at_peak_by_category[FSDP_MEM_ACTIVATION], 4 * MiB); /* peak not passed */
    CHECK_EQ(st.at_peak_by_category[FSDP_MEM_GRADIENT], 0);
    d = alloc_cat(mem, 3 * MiB, FSDP_MEM_GRADIENT);
    st = stats_of(mem);
    CHECK_EQ(st.peak_allocated, 6 * MiB);
    CHECK_EQ(st.at_peak_by_category[FSDP_MEM_SHARDED_PARAM], MiB);
    CHECK_EQ(st.at_peak_by_category[FSDP_MEM_GRADIENT], 5 * MiB);
    CHECK_EQ(st.at_peak_by_category[FSDP_MEM_ACTIVATION], 0);
    CHECK_EQ(st.peak_by_category[FSDP_MEM_GRADIENT], 5 * MiB);
    CHECK_EQ(st.peak_by_category[FSDP_MEM_ACTIVATION], 4 * MiB);
    CHECK_EQ(ALL(st).allocated_bytes.peak, 6 * MiB);
    CHECK_EQ(SMALL(st).allocated_bytes.peak, MiB);
    CHECK_EQ(LARGE(st).allocated_bytes.peak, 5 * MiB);

    /* reaching the same peak again keeps the first snapshot */
    fsdp_mem_free(mem, c);
    c = alloc_cat(mem, 2 * MiB, FSDP_MEM_ACTIVATION);
    st = stats_of(mem);
    CHECK_EQ(st.allocated, 6 * MiB);
    CHECK_EQ(st.peak_allocated, 6 * MiB);
    CHECK_EQ(st.at_peak_by_category[FSDP_MEM_GRADIENT], 5 * MiB);
    CHECK_EQ(st.at_peak_by_category[FSDP_MEM_ACTIVATION], 0);
    CHECK_EQ(st.peak_by_category[FSDP_MEM_GRADIENT], 5 * MiB);

    /* reset_peaks: every peak is its current value */
    fsdp_mem_free(mem, d);
    fsdp_mem_reset_peaks(mem);
    st = stats_of(mem);
    CHECK_EQ(st.peak_allocated, 3 * MiB);
    CHECK_EQ(st.peak_reserved, st.reserved);
    CHECK_EQ(st.peak_by_category[FSDP_MEM_GRADIENT], 0);
    CHECK_EQ(st.peak_by_category[FSDP_MEM_ACTIVATION], 2 * MiB);
    CHECK_EQ(st.at_peak_by_category[FSDP_MEM_ACTIVATION], 2 * MiB);
    CHECK_EQ(st.at_peak_by_category[FSDP_MEM_SHARDED_PARAM], MiB);
    for (int p = 0; p < FSDP_MEM_POOL_COUNT; p++) {
        CHECK_EQ(st.pool[p].allocated_bytes.peak, st.pool[p].allocated_bytes.current);
        CHECK_EQ(st.pool[p].active.peak, st.pool[p].active.current);
        CHECK_EQ(st.pool[p].inactive_split_bytes.peak, st.pool[p].inactive_split_bytes.current);
        CHECK_EQ(st.pool[p].segment.peak, st.pool[p].segment.current);
    }
    /* cumulative counters are not peaks: they stay */
    CHECK_EQ(ALL(st).allocation.allocated, 5);
    CHECK_EQ(ALL(st).allocation.freed, 3);
    CHECK_EQ(st.num_allocs, 5);
    CHECK_EQ(st.num_frees, 3);
    b = alloc_cat(mem, 512, FSDP_MEM_COMM_BUFFER);
    st = stats_of(mem);
    CHECK_EQ(st.peak_allocated, 3 * MiB + 512);
    CHECK_EQ(st.at_peak_by_category[FSDP_MEM_COMM_BUFFER], 512);
    fsdp_mem_free(mem, a);
    fsdp_mem_free(mem, b);
    fsdp_mem_free(mem, c);
    CHECK_OK(fsdp_mem_check(mem));
    fsdp_mem_destroy(mem);
}

static void test_category_peaks(void)
{
    run(body_category_peaks);
}

static void body_empty_cache(env_t *env)
{
    fsdp_mem_t *mem = mem_new(env, 0);
    fsdp_mem_stats_t st;
    void *s, *l, *h, *p;

    s = alloc_on(mem, 716800, NULL);   /* small segment, to be freed */
    l = alloc_on(mem, 3 * MiB, NULL);  /* 20 MiB segment, kept live: split, not releasable */
    h = alloc_on(mem, 25 * MiB, NULL); /* 26 MiB segment, to be freed */
    p = alloc_on(mem, 4096, env->s1);  /* small segment on s1, freed after record_stream */
    CHECK_OK(fsdp_mem_record_stream(mem, p, env->s2));
    fsdp_mem_free(mem, s);
    fsdp_mem_free(mem, h);
    fsdp_mem_free(mem, p);
    CHECK_EQ(census(mem).n_pending, 1);
    st = stats_of(mem);
    CHECK_EQ(st.reserved, 2 * MiB + 20 * MiB + 27262976 + 2 * MiB);
    CHECK_OK(fsdp_mem_empty_cache(mem));
    st = stats_of(mem);
    CHECK_EQ(st.reserved, 20 * MiB);
    CHECK_EQ(st.num_device_free, 3);
    CHECK_EQ(st.num_sync_all_streams, 1);
    CHECK_EQ(ALL(st).segment.current, 1);
    CHECK_EQ(SMALL(st).segment.current, 0);
    CHECK_EQ(ALL(st).active.current, 1);
    CHECK_EQ(st.peak_reserved, 2 * MiB + 20 * MiB + 27262976 + 2 * MiB);
    CHECK_EQ(census(mem).n_pending, 0);
    /* the live block is untouched; freeing it leaves one cached segment, then none */
    CHECK_EQ(fsdp_mem_block_size(mem, l), 3 * MiB);
    fsdp_mem_free(mem, l);
    CHECK_EQ(stats_of(mem).reserved, 20 * MiB);
    CHECK_OK(fsdp_mem_empty_cache(mem));
    st = stats_of(mem);
    CHECK_EQ(st.reserved, 0);
    CHECK_EQ(st.num_device_free, 4);
    CHECK_EQ(census(mem).n_segments, 0);
    CHECK_OK(fsdp_mem_empty_cache(mem)); /* nothing to do */
    CHECK_OK(fsdp_mem_check(mem));
    fsdp_mem_destroy(mem);
}

static void test_empty_cache(void)
{
    run(body_empty_cache);
}

/* ---- randomized run against a model --------------------------------------------------------- */

typedef struct live {
    char *ptr;
    size_t bytes, rounded;
    fsdp_mem_category_t cat;
    unsigned char tag;
} live_t;

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;

    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

static int live_cmp(const void *a, const void *b)
{
    const live_t *x = a, *y = b;
    return x->ptr < y->ptr ? -1 : x->ptr > y->ptr;
}

typedef struct stress_cfg {
    int ops;
    size_t capacity;
    size_t max_large;
    int data; /* write and verify a tag in every block */
    uint64_t seed;
} stress_cfg_t;

static size_t random_size(uint64_t *rng, size_t max_large)
{
    uint64_t r = rng_next(rng);

    switch (r % 8) {
    case 0:
        return 1 + (size_t)(rng_next(rng) % 512);
    case 1:
    case 2:
    case 3:
        return 1 + (size_t)(rng_next(rng) % MiB); /* small pool */
    case 4:
        return MiB + (size_t)(rng_next(rng) % 2048); /* at the pool edge */
    case 5:
    case 6:
        return MiB + 1 + (size_t)(rng_next(rng) % (9 * MiB)); /* 20 MiB segments */
    default:
        return 10 * MiB + (size_t)(rng_next(rng) % (max_large - 10 * MiB));
    }
}

static void check_model(fsdp_mem_t *mem, live_t *live, int n, const stress_cfg_t *cfg)
{
    fsdp_mem_stats_t st = stats_of(mem);
    size_t allocated = 0, requested = 0, by_cat[FSDP_MEM_CATEGORY_COUNT] = {0};
    census_t c = census(mem);

    CHECK_OK(fsdp_mem_check(mem));
    qsort(live, (size_t)n, sizeof(*live), live_cmp);
    for (int i = 0; i < n; i++) {
        size_t size = fsdp_mem_block_size(mem, live[i].ptr);

        /* slack only in the large pool, and at most 1 MiB (else it would have split) */
        CHECK(size >= live[i].rounded);
        if (live[i].rounded <= MiB)
            CHECK_EQ(size, live[i].rounded);
        else
            CHECK(size - live[i].rounded <= MiB);
        if (i + 1 < n)
            CHECK(live[i].ptr + size <= live[i + 1].ptr); /* no two live blocks overlap */
        allocated += size;
        requested += live[i].bytes;
        by_cat[live[i].cat] += size;
    }
    CHECK_EQ(st.allocated, allocated);
    CHECK(st.requested >= requested); /* plus blocks waiting on events */
    CHECK_EQ(ALL(st).allocation.current, (size_t)n);
    CHECK_EQ(c.n_allocated, (size_t)n);
    CHECK_EQ(c.allocated, allocated);
    CHECK_EQ(st.reserved, c.reserved);
    CHECK_EQ(ALL(st).segment.current, c.n_segments);
    CHECK(cfg->capacity == 0 || st.reserved <= cfg->capacity);
    CHECK(st.reserved >= ALL(st).active_bytes.current);
    CHECK(ALL(st).active_bytes.current >= st.allocated);
    for (int k = 0; k < FSDP_MEM_CATEGORY_COUNT; k++)
        CHECK_EQ(st.by_category[k], by_cat[k]);
    CHECK(st.peak_allocated >= st.allocated);
    CHECK(st.peak_reserved >= st.reserved);
}

static void stress(env_t *env, const stress_cfg_t *cfg)
{
    fsdp_mem_t *mem = mem_new(env, cfg->capacity);
    fsdp_stream_t *streams[3] = {env->s0, env->s1, env->s2};
    enum { MAX_LIVE = 256 };
    live_t live[MAX_LIVE];
    uint64_t rng = cfg->seed;
    int n = 0, ooms = 0, frees = 0, allocs = 0;

    for (int op = 0; op < cfg->ops && atomic_load(&failure.count) == 0; op++) {
        uint64_t r = rng_next(&rng) % 100;

        if (n > 0 && (r < 40 || n == MAX_LIVE)) {
            int i = (int)(rng_next(&rng) % (uint64_t)n);

            if (cfg->data) {
                CHECK(live[i].ptr[0] == (char)live[i].tag);
                CHECK(live[i].ptr[live[i].bytes - 1] == (char)live[i].tag);
                CHECK(live[i].ptr[live[i].bytes / 2] == (char)live[i].tag);
            }
            if (rng_next(&rng) % 4 == 0)
                CHECK_OK(fsdp_mem_record_stream(mem, live[i].ptr, streams[rng_next(&rng) % 3]));
            fsdp_mem_free(mem, live[i].ptr);
            live[i] = live[--n];
            frees++;
        } else if (r < 98) {
            live_t *l = &live[n];
            fsdp_status_t status;
            void *p = NULL;

            l->bytes = random_size(&rng, cfg->max_large);
            l->rounded = fsdp_mem_round_size(l->bytes);
            l->cat = (fsdp_mem_category_t)(rng_next(&rng) % FSDP_MEM_CATEGORY_COUNT);
            l->tag = (unsigned char)(op & 0xff);
            status = fsdp_mem_alloc(mem, l->bytes, l->cat, streams[rng_next(&rng) % 3], &p);
            if (status == FSDP_ERR_OUT_OF_MEMORY) {
                ooms++;
                CHECK(cfg->capacity != 0);
                continue;
            }
            CHECK_OK(status);
            if (p == NULL)
                continue;
            l->ptr = p;
            if (cfg->data) {
                memset(l->ptr, l->tag, l->bytes < 4096 ? l->bytes : 4096);
                l->ptr[l->bytes / 2] = (char)l->tag;
                l->ptr[l->bytes - 1] = (char)l->tag;
            }
            n++;
            allocs++;
        } else if (r < 99) {
            CHECK_OK(fsdp_mem_empty_cache(mem));
        } else {
            fsdp_mem_reset_peaks(mem);
        }
        check_model(mem, live, n, cfg);
    }
    CHECK(allocs > cfg->ops / 3);
    CHECK(frees > cfg->ops / 4);
    CHECK(cfg->capacity == 0 || ooms > 0);
    while (n > 0)
        fsdp_mem_free(mem, live[--n].ptr);
    check_model(mem, live, 0, cfg);
    CHECK_OK(fsdp_mem_empty_cache(mem));
    CHECK_EQ(stats_of(mem).reserved, 0);
    CHECK_EQ(stats_of(mem).num_device_alloc, stats_of(mem).num_device_free);
    fsdp_mem_destroy(mem);
}

static void body_stress_shape(env_t *env)
{
    stress_cfg_t unlimited = {.ops = 6000, .max_large = 48 * MiB, .seed = 0x9e3779b97f4a7c15ull};
    stress_cfg_t tight = {
        .ops = 6000, .capacity = 1024 * MiB, .max_large = 48 * MiB, .seed = 0x243f6a8885a308d3ull};

    capture_begin(); /* OOM lines of the tight run */
    stress(env, &unlimited);
    stress(env, &tight);
    capture_end();
}

static void test_stress_shape(void)
{
    run(body_stress_shape);
}

static void body_stress_data(env_t *env)
{
    stress_cfg_t cfg = {.ops = 2000,
                        .capacity = 256 * MiB,
                        .max_large = 16 * MiB,
                        .data = 1,
                        .seed = 0x13198a2e03707344ull};

    capture_begin();
    stress(env, &cfg);
    capture_end();
}

/* Data mode: real host memory; every block is written and read back, so an overlap or an
 * address outside the segment would show (and trip ASan). */
static void test_stress_data(void)
{
    run_mode(body_stress_data, FSDP_SIM_DATA);
}

/* Many live blocks: the sizes of a big model's step, in shape mode. */
static void body_many_blocks(env_t *env)
{
    enum { N = 20000 };
    fsdp_mem_t *mem = mem_new(env, 0);
    void **p = calloc(N, sizeof(*p));
    uint64_t rng = 42;
    fsdp_mem_stats_t st;
    size_t allocated = 0;

    CHECK(p != NULL);
    if (p == NULL)
        return;
    for (int round = 0; round < 5; round++) {
        for (int i = 0; i < N; i++) {
            if (p[i] != NULL && rng_next(&rng) % 2 == 0) {
                fsdp_mem_free(mem, p[i]);
                p[i] = NULL;
            }
        }
        for (int i = 0; i < N; i++) {
            if (p[i] == NULL)
                CHECK_OK(fsdp_mem_alloc(mem, 512 + (size_t)(rng_next(&rng) % (4 * MiB)),
                                        FSDP_MEM_ACTIVATION, NULL, &p[i]));
        }
    }
    for (int i = 0; i < N; i++)
        allocated += fsdp_mem_block_size(mem, p[i]);
    st = stats_of(mem);
    CHECK_EQ(st.allocated, allocated);
    CHECK_EQ(ALL(st).allocation.current, N);
    CHECK_OK(fsdp_mem_check(mem));
    for (int i = 0; i < N; i++)
        fsdp_mem_free(mem, p[i]);
    CHECK_EQ(stats_of(mem).allocated, 0);
    CHECK_EQ(stats_of(mem).pool[FSDP_MEM_POOL_ALL].inactive_split.current, 0);
    CHECK_OK(fsdp_mem_check(mem));
    free(p);
    fsdp_mem_destroy(mem);
}

static void test_many_blocks(void)
{
    run(body_many_blocks);
}

/* Two runs of the same sequence make the same decisions (offsets and statistics), in data
 * mode too, where segment addresses differ from run to run. */
typedef struct trace_buf {
    uintptr_t base[64];
    size_t n;
    uint64_t sig;
} trace_buf_t;

static trace_buf_t traces[2];
static int trace_run;

static void sig_visit(const fsdp_mem_segment_info_t *seg, const fsdp_mem_block_info_t *b, void *arg)
{
    uint64_t *sig = arg;

    *sig = *sig * 1000003u + (uint64_t)((const char *)b->ptr - (const char *)seg->base);
    *sig = *sig * 1000003u + b->size + (uint64_t)b->state;
}

static void body_deterministic(env_t *env)
{
    fsdp_mem_t *mem = mem_new(env, 0);
    trace_buf_t *t = &traces[trace_run];
    uint64_t rng = 7;
    void *p[64] = {0};

    for (int op = 0; op < 2000; op++) {
        int i = (int)(rng_next(&rng) % 64);
        if (p[i] != NULL) {
            fsdp_mem_free(mem, p[i]);
            p[i] = NULL;
        } else {
            size_t bytes = 1 + (size_t)(rng_next(&rng) % (3 * MiB));
            CHECK_OK(fsdp_mem_alloc(mem, bytes, FSDP_MEM_TEMPORARY,
                                    (rng_next(&rng) & 1) ? env->s0 : env->s1, &p[i]));
        }
    }
    t->sig = 0;
    fsdp_mem_snapshot(mem, sig_visit, &t->sig);
    t->sig = t->sig * 31 + stats_of(mem).reserved + stats_of(mem).peak_allocated;
    for (int i = 0; i < 64; i++)
        fsdp_mem_free(mem, p[i]);
    fsdp_mem_destroy(mem);
}

static void test_deterministic(void)
{
    for (trace_run = 0; trace_run < 2; trace_run++)
        run_mode(body_deterministic, trace_run == 0 ? FSDP_SIM_DATA : FSDP_SIM_SHAPE);
    CU_ASSERT_EQUAL(traces[0].sig, traces[1].sig);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"rounding: 0 -> NULL, 1 -> 512, 700,001 -> 700,416", test_rounding},
        {"pool choice at the 1 MiB edge", test_pool_edge},
        {"1.10: 700 KiB x3", test_example_700k},
        {"1.10: 3 MiB x7", test_example_3m},
        {"1.10: 25 MiB, no split; cached 40 MiB; other stream", test_example_25m},
        {"1.10: exactly 10 MiB", test_example_10m},
        {"split and merge, inactive_split", test_split_merge},
        {"free blocks are reused only by their stream", test_stream_reuse},
        {"record_stream delays reuse to the next malloc", test_record_stream},
        {"record_stream with events not yet done; OOM path syncs", test_record_stream_not_ready},
        {"capacity: release and retry, then out of memory", test_oom},
        {"per-category peaks and reset_peaks", test_category_peaks},
        {"empty_cache", test_empty_cache},
        {"randomized against a model, shape mode", test_stress_shape},
        {"randomized against a model, data mode", test_stress_data},
        {"20,000 live blocks", test_many_blocks},
        {"same decisions in data and shape mode", test_deterministic},
        {NULL, NULL},
    };

    return fsdp_test_run("allocator", tests);
}
