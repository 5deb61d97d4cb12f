/* The sim backend's ops table apart from collectives: rank contexts, segments in data and
 * shape mode, streams, events, copies, the kernel slot in shape mode, and errors.
 *
 * Rank functions record the first failed check (test_util.h); the main thread asserts it. */
#include <fsdp/fsdp.h>
#include <fsdp/gpt2.h>
#include <fsdp/llama.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core_hidden.h"
#include "nn/nn_hidden.h"
#include "sim_hidden.h"
#include "test_util.h"

static fsdp_test_failure_t failure;

static void quiet(fsdp_log_level_t level, const char *file, int line, const char *func,
                  const char *msg, void *arg)
{
    (void)level, (void)file, (void)line, (void)func, (void)msg, (void)arg;
}

static void launch_ok(int world, int per_node, fsdp_sim_mode_t mode, fsdp_rank_func_t func)
{
    fsdp_sim_params_t p;
    fsdp_status_t st;

    fsdp_sim_params_init(&p);
    p.world_size = world;
    p.ranks_per_node = per_node;
    p.mode = mode;
    p.timeout_s = 20.0;
    st = fsdp_sim_launch(&p, func, NULL, NULL);
    CU_ASSERT_EQUAL(st, FSDP_OK);
    fsdp_test_failure_assert(&failure);
}

static void test_ops_table(void)
{
    CU_ASSERT_EQUAL(fsdp_backend_check(fsdp_sim_backend()), FSDP_OK);
    CU_ASSERT_STRING_EQUAL(fsdp_sim_backend()->name, "sim");
    CU_ASSERT_EQUAL(fsdp_sim_backend()->size, sizeof(fsdp_backend_ops_t));
    CU_ASSERT_FALSE(fsdp_dev_is_sim(NULL));
}

static fsdp_status_t rank_dev(fsdp_dev_t *dev, void *arg)
{
    (void)arg;
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                          fsdp_dev_is_sim(dev) && dev->ops == fsdp_sim_backend(), "not a sim dev");
    FSDP_RANK_REQUIRE_MSG(
        &failure, dev->rank,
        dev->world_size == 6 && dev->local_size == 3 && dev->local_rank == dev->rank % 3,
        "world %d, local %d of %d", dev->world_size, dev->local_rank, dev->local_size);
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, strcmp(fsdp_sim_last_error(dev), "") == 0,
                          "fresh rank has an error");
    return FSDP_OK;
}

static void test_ranks(void)
{
    launch_ok(6, 3, FSDP_SIM_DATA, rank_dev);
}

static fsdp_status_t rank_segments(fsdp_dev_t *dev, void *arg)
{
    size_t sizes[] = {0, 1, 63, 64, 1000, 1 << 20};
    void *p[6];
    (void)arg;

    for (int i = 0; i < 6; i++) {
        FSDP_RANK_REQUIRE_OK(
            &failure, dev,
            fsdp_dev_segment_alloc(dev, i % 2 ? FSDP_MEMKIND_HOST_PINNED : FSDP_MEMKIND_DEVICE,
                                   sizes[i], &p[i]));
        FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, p[i] != NULL && (uintptr_t)p[i] % 64 == 0,
                              "segment %d at %p", i, p[i]);
        for (size_t j = 0; j < sizes[i]; j++)
            FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, ((unsigned char *)p[i])[j] == 0,
                                  "segment %d byte %zu not zero", i, j);
        memset(p[i], 0xff, sizes[i]);
    }
    for (int i = 0; i < 6; i++) {
        for (int j = 0; j < i; j++)
            FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, p[i] != p[j],
                                  "segments %d and %d share an address", i, j);
        fsdp_dev_segment_free(dev, i % 2 ? FSDP_MEMKIND_HOST_PINNED : FSDP_MEMKIND_DEVICE, p[i]);
    }
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                          fsdp_dev_segment_alloc(dev, (fsdp_memkind_t)9, 8, &p[0]) ==
                              FSDP_ERR_INVALID_PARAM,
                          "a bad memkind was accepted");
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                          strstr(fsdp_sim_last_error(dev), "segment_alloc") != NULL &&
                              strncmp(fsdp_sim_last_error(dev), "rank ", 5) == 0,
                          "last error is '%s'", fsdp_sim_last_error(dev));
    return FSDP_OK;
}

static fsdp_status_t rank_shape_segments(fsdp_dev_t *dev, void *arg)
{
    fsdp_kernel_t k = {.kind = FSDP_K_FILL};
    uintptr_t p[4];
    (void)arg;

    /* never touched, so terabytes are fine; ranges must not overlap */
    for (int i = 0; i < 4; i++) {
        void *v = NULL;
        FSDP_RANK_REQUIRE_OK(&failure, dev,
                             fsdp_dev_segment_alloc(dev, FSDP_MEMKIND_DEVICE, (size_t)1 << 40, &v));
        p[i] = (uintptr_t)v;
        FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, p[i] != 0, "shape segment is NULL");
        for (int j = 0; j < i; j++)
            FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                                  p[i] >= p[j] + ((size_t)1 << 40) ||
                                      p[j] >= p[i] + ((size_t)1 << 40),
                                  "shape segments %d and %d overlap", i, j);
    }
    for (int i = 0; i < 4; i++)
        fsdp_dev_segment_free(dev, FSDP_MEMKIND_DEVICE, (void *)p[i]);
    /* shape mode runs no kernel and copies nothing: the pointers are fake */
    k.u.fill.x = (void *)p[0];
    k.u.fill.dtype = FSDP_DTYPE_F32;
    k.u.fill.n = 1000;
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_dev_kernel(dev, NULL, &k));
    FSDP_RANK_REQUIRE_OK(&failure, dev,
                         fsdp_dev_memcpy_async(dev, (void *)p[1], (void *)p[2], 4096, NULL));
    return FSDP_OK;
}

static void test_segments(void)
{
    fsdp_log_set_handler(quiet, NULL); /* the refusals are expected */
    launch_ok(3, 0, FSDP_SIM_DATA, rank_segments);
    fsdp_log_set_handler(NULL, NULL);
    launch_ok(4, 0, FSDP_SIM_SHAPE, rank_shape_segments);
}

/* host_memory bounds the world's segments together: rank 0's third MiB-and-a-half fails while
 * rank 1 holds its own, with a line naming the bound, and fits once rank 1 freed it */
#define HOST_MEMORY_BOUND ((size_t)4 << 20)
static fsdp_status_t rank_host_memory(fsdp_dev_t *dev, void *arg)
{
    fsdp_group_t *w = fsdp_dev_group_world(dev);
    const size_t part = (size_t)3 << 19; /* 1.5 MiB */
    void *mine = NULL, *more = NULL;
    (void)arg;

    FSDP_RANK_REQUIRE_OK(
        &failure, dev,
        fsdp_dev_segment_alloc(dev, dev->rank ? FSDP_MEMKIND_HOST_PINNED : FSDP_MEMKIND_DEVICE,
                               part, &mine));
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_dev_barrier(dev, w));
    if (dev->rank == 0) {
        FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                              fsdp_dev_segment_alloc(dev, FSDP_MEMKIND_DEVICE, part, &more) ==
                                  FSDP_ERR_NO_MEMORY,
                              "a segment past the world's host memory was made");
        FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                              strstr(fsdp_sim_last_error(dev),
                                     "1572864 more bytes would take the world's 3145728 past "
                                     "the 4194304 it may use") != NULL,
                              "last error is '%s'", fsdp_sim_last_error(dev));
    }
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_dev_barrier(dev, w));
    if (dev->rank == 1)
        fsdp_dev_segment_free(dev, FSDP_MEMKIND_HOST_PINNED, mine);
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_dev_barrier(dev, w));
    if (dev->rank == 0) {
        FSDP_RANK_REQUIRE_OK(&failure, dev,
                             fsdp_dev_segment_alloc(dev, FSDP_MEMKIND_DEVICE, part, &more));
        fsdp_dev_segment_free(dev, FSDP_MEMKIND_DEVICE, more);
        fsdp_dev_segment_free(dev, FSDP_MEMKIND_DEVICE, mine);
    }
    return FSDP_OK;
}

static void test_host_memory(void)
{
    fsdp_sim_params_t p;

    fsdp_sim_params_init(&p);
    CU_ASSERT_EQUAL(p.host_memory, 0);
    CU_ASSERT(fsdp_sim_host_memory_default() > 0);
    p.world_size = 2;
    p.timeout_s = 20.0;
    p.host_memory = HOST_MEMORY_BOUND;
    fsdp_log_set_handler(quiet, NULL); /* the refusal is expected */
    CU_ASSERT_EQUAL(fsdp_sim_launch(&p, rank_host_memory, NULL, NULL), FSDP_OK);
    fsdp_log_set_handler(NULL, NULL);
    fsdp_test_failure_assert(&failure);
}

static fsdp_status_t rank_streams(fsdp_dev_t *dev, void *arg)
{
    fsdp_stream_t *compute = fsdp_dev_compute_stream(dev), *s1, *s2;
    fsdp_event_t *ev;
    fsdp_kernel_t k = {.kind = FSDP_K_FILL};
    char src[100], dst[100];
    float x[5] = {0};
    int done = 0;
    (void)arg;

    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                          compute->id == 0 && strcmp(compute->name, "compute") == 0,
                          "compute stream is %d '%s'", compute->id, compute->name);
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_dev_stream_create(dev, "unshard", -1, &s1));
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_dev_stream_create(dev, "post_backward", 0, &s2));
    FSDP_RANK_REQUIRE_MSG(
        &failure, dev->rank,
        s1->id == 1 && s2->id == 2 && s1->priority == -1 && strcmp(s1->name, "unshard") == 0 &&
            strcmp(s2->name, "post_backward") == 0,
        "streams %d '%s' %d, %d '%s'", s1->id, s1->name, s1->priority, s2->id, s2->name);

    for (int i = 0; i < 100; i++)
        src[i] = (char)(i + dev->rank);
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_dev_memcpy_async(dev, dst, src, sizeof(src), s1));
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_dev_memcpy_async(dev, dst, dst, 0, s1));
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, memcmp(dst, src, sizeof(src)) == 0,
                          "memcpy_async did not copy");
    /* onto itself: no data moves (a device copy onto itself is undefined), but the copy is
     * still issued, priced and traced */
    {
        double before = fsdp_dev_host_time(dev);
        FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_dev_memcpy_async(dev, dst, dst, sizeof(dst), s1));
        FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                              memcmp(dst, src, sizeof(src)) == 0 &&
                                  fsdp_dev_host_time(dev) > before,
                              "a copy onto itself changed the data or was not issued");
    }

    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_dev_event_create(dev, &ev));
    FSDP_RANK_REQUIRE_OK(&failure, dev,
                         fsdp_dev_event_query(dev, ev, &done)); /* never recorded: complete */
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, done == 1, "unrecorded event not complete");
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_dev_event_record(dev, ev, s1));
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_dev_stream_wait_event(dev, s2, ev));
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_dev_stream_wait_event(dev, NULL, ev));
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_stream_wait_stream(dev, compute, s2));
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_dev_event_synchronize(dev, ev));
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_dev_event_query(dev, ev, &done));
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, done == 1, "event not complete after synchronize");
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_dev_stream_synchronize(dev, s2));
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_dev_stream_synchronize(dev, NULL));
    /* launches cost the host time (the default profile's launch overhead) */
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, fsdp_dev_host_time(dev) > 0.0, "host time %g",
                          fsdp_dev_host_time(dev));
    fsdp_dev_event_destroy(dev, ev);
    fsdp_dev_stream_destroy(dev, s2);
    fsdp_dev_stream_destroy(dev, s1);
    fsdp_dev_stream_destroy(dev, compute); /* the backend's: ignored */
    fsdp_dev_stream_destroy(dev, NULL);
    fsdp_dev_event_destroy(dev, NULL);
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, fsdp_dev_compute_stream(dev)->id == 0,
                          "compute stream gone");
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                          fsdp_dev_event_record(dev, NULL, NULL) == FSDP_ERR_INVALID_PARAM,
                          "NULL event accepted");
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                          fsdp_dev_kernel(dev, NULL, NULL) == FSDP_ERR_INVALID_PARAM,
                          "NULL kernel accepted");

    /* data mode runs the kernel now, on this thread */
    k.u.fill.x = x;
    k.u.fill.dtype = FSDP_DTYPE_F32;
    k.u.fill.n = 4;
    k.u.fill.value = 2.5;
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_dev_kernel(dev, fsdp_dev_compute_stream(dev), &k));
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, x[0] == 2.5f && x[3] == 2.5f && x[4] == 0.0f,
                          "fill gave %g %g %g", (double)x[0], (double)x[3], (double)x[4]);
    k.u.fill.x = NULL; /* malformed: the executor refuses it and the rank remembers */
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                          fsdp_dev_kernel(dev, NULL, &k) == FSDP_ERR_INVALID_PARAM,
                          "a NULL fill was accepted");
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                          strstr(fsdp_sim_last_error(dev), "kernel fill failed") != NULL,
                          "last error '%s'", fsdp_sim_last_error(dev));
    return FSDP_OK;
}

static void test_streams_events(void)
{
    fsdp_log_set_handler(quiet, NULL); /* the refusals are expected */
    launch_ok(2, 0, FSDP_SIM_DATA, rank_streams);
    fsdp_log_set_handler(NULL, NULL);
}

static fsdp_status_t rank_bad_args(fsdp_dev_t *dev, void *arg)
{
    fsdp_group_t *w = fsdp_dev_group_world(dev);
    float x[4] = {0};
    (void)arg;

    /* bad arguments are refused on the calling rank, before any rendezvous */
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                          fsdp_dev_all_reduce(dev, NULL, x, x, 4, FSDP_DTYPE_F32, FSDP_REDUCE_SUM,
                                              NULL) == FSDP_ERR_INVALID_PARAM,
                          "NULL group accepted");
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                          fsdp_dev_all_reduce(dev, w, x, x, 4, FSDP_DTYPE_I32, FSDP_REDUCE_AVG,
                                              NULL) == FSDP_ERR_INVALID_PARAM,
                          "i32 avg accepted");
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                          fsdp_dev_all_reduce(dev, w, x, x, 4, (fsdp_dtype_t)17, FSDP_REDUCE_SUM,
                                              NULL) == FSDP_ERR_INVALID_PARAM,
                          "dtype 17 accepted");
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                          fsdp_dev_reduce_scatter(dev, w, x, x, 1, FSDP_DTYPE_F32,
                                                  (fsdp_reduce_op_t)9,
                                                  NULL) == FSDP_ERR_INVALID_PARAM,
                          "op 9 accepted");
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                          fsdp_dev_broadcast(dev, w, x, 4, FSDP_DTYPE_F32, w->size, NULL) ==
                              FSDP_ERR_INVALID_PARAM,
                          "root %d accepted", w->size);
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                          fsdp_dev_all_gather(dev, w, NULL, x, 1, FSDP_DTYPE_F32, NULL) ==
                              FSDP_ERR_INVALID_PARAM,
                          "NULL send accepted");
    /* and the group still works afterwards: nothing was deposited */
    FSDP_RANK_REQUIRE_OK(
        &failure, dev, fsdp_dev_all_reduce(dev, w, x, x, 4, FSDP_DTYPE_F32, FSDP_REDUCE_SUM, NULL));
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_dev_barrier(dev, w));
    return FSDP_OK;
}

/* How many refusals said what was wrong with an i32 avg (fsdp_dev_coll_check logs them). */
static int avg_refusals;

static void count_avg_refusals(fsdp_log_level_t level, const char *file, int line, const char *func,
                               const char *msg, void *arg)
{
    (void)level, (void)file, (void)line, (void)func, (void)arg;
    if (strncmp(msg, "rank ", 5) == 0 && strstr(msg, "avg needs a floating-point dtype") != NULL)
        __atomic_fetch_add(&avg_refusals, 1, __ATOMIC_RELAXED);
}

static void test_bad_args(void)
{
    avg_refusals = 0;
    fsdp_log_set_handler(count_avg_refusals, NULL); /* the refusals are expected */
    launch_ok(3, 0, FSDP_SIM_DATA, rank_bad_args);
    fsdp_log_set_handler(NULL, NULL);
    CU_ASSERT_EQUAL(avg_refusals, 3);
}

/* ---- symmetric ranks: the classes against a rank-by-rank derivation ----------------------- */

/* FSDP2's piece of a parameter on group rank x of a group of g, from the formulas of
 * docs/runtime.md section 6: its elements in the rows x owns of S = ceil(d0 / g), and its kind
 * where it owns any. */
static void ref_rows(const fsdp_param_info_t *pi, int g, int x, size_t piece[3])
{
    size_t d0 = (size_t)pi->shape[0], rest = 1, s = (d0 + (size_t)g - 1) / (size_t)g, own;

    for (int d = 1; d < pi->ndim; d++)
        rest *= (size_t)pi->shape[d];
    own = (size_t)x * s >= d0 ? 0 : d0 - (size_t)x * s < s ? d0 - (size_t)x * s : s;
    piece[0] = own * rest;
    piece[1] = 0; /* every rank's slot is at the same place */
    piece[2] = piece[0] != 0
                   ? (size_t)((pi->ndim <= 1) | (!pi->requires_grad) << 1 | (pi->tied_to >= 0) << 2)
                   : 0;
}

/* Group ranks x and y of a group of g hold alike shards of every unit: the same size and
 * padding, and of each parameter the same piece (size, place, kind), compared rank by rank.
 * Under FSDP2 the pieces are the rows each owns (ref_rows), the padded slots being alike. */
static int ref_alike(fsdp_t *fs, int g, int x, int y)
{
    int pp = fsdp_api(fs) == FSDP_API_FSDP2;

    for (int i = 0; i < fsdp_num_units(fs); i++) {
        fsdp_unit_t *u = fsdp_unit_at(fs, i);
        size_t total = fsdp_unit_flat_numel(u), s = fsdp_shard_numel(total, g), nx, px, ny, py;

        if (!fsdp_unit_has_params(u))
            continue;
        fsdp_shard_extent(total, g, x, &nx, &px);
        fsdp_shard_extent(total, g, y, &ny, &py);
        if (!pp && (nx != ny || px != py))
            return 0;
        for (int j = 0; j < fsdp_unit_num_params(u); j++) {
            fsdp_param_info_t pi;
            size_t piece[2][3];
            int r[2] = {x, y};

            fsdp_unit_param_info(u, j, &pi);
            for (int k = 0; k < 2 && pp; k++)
                ref_rows(&pi, g, r[k], piece[k]);
            for (int k = 0; k < 2 && !pp; k++) {
                size_t lo = (size_t)r[k] * s, hi = lo + s;
                size_t a = pi.offset > lo ? pi.offset : lo;
                size_t b = pi.offset + pi.numel < hi ? pi.offset + pi.numel : hi;
                piece[k][0] = a < b ? b - a : 0;
                piece[k][1] = a < b ? a - lo : 0;
                piece[k][2] = a < b ? (size_t)((pi.ndim <= 1) | (!pi.requires_grad) << 1 |
                                               (pi.tied_to >= 0) << 2)
                                    : 0;
            }
            if (memcmp(piece[0], piece[1], sizeof(piece[0])) != 0)
                return 0;
        }
    }
    return 1;
}

/* first[x]: the first group rank alike with x, rank by rank; the number of classes. */
static int ref_classes(fsdp_t *fs, int g, int *first)
{
    int *rep = malloc((size_t)g * sizeof(*rep)), n = 0;

    for (int x = 0; x < g; x++) {
        int k = 0;
        while (k < n && !ref_alike(fs, g, rep[k], x))
            k++;
        if (k == n)
            rep[n++] = x;
        first[x] = rep[k];
    }
    free(rep);
    return n;
}

/* The hybrid classes of a world from first[x], the first place in the node alike with place x:
 * products of places and runs of nodes, the last place and the last node apart. Under tensor
 * parallelism (tp > 1, hybrid or not) first[x] is of the shard group's ranks, a node's (hybrid)
 * or the world's of one tp index, and the classes products of those (the last apart), of runs of
 * nodes (hybrid) and of runs of tp indices (the last apart). */
static void mesh_classes(int world, int per_node, int tp, int hybrid, int *first, int *want)
{
    int span = hybrid ? per_node : world, nodes = world / span, g = span / tp;

    if (g > 1 && (hybrid || tp > 1))
        first[g - 1] = g - 1;
    for (int r = 0; r < world; r++)
        want[r] = (r / span == nodes - 1 ? nodes - 1 : 0) * span + first[r % span / tp] * tp +
                  (r % tp == tp - 1 ? tp - 1 : 0);
}

/* fsdp_symmetric_ranks's classes of fs against the rank-by-rank ones, over the world and,
 * for the hybrid strategies, the node (the last place and the last node apart). */
static int check_classes(int rank, fsdp_t *fs, const char *what)
{
    static const int worlds[] = {1,  2,  3,  4,   5,   6,    7,    8,    12,   16,
                                 24, 40, 64, 100, 512, 1000, 4096, 8192, 65536};

    for (size_t w = 0; w < sizeof(worlds) / sizeof(worlds[0]); w++) {
        int world = worlds[w], per_node = world % 8 == 0 ? 8 : world % 4 == 0 ? 4 : world;
        int *got = malloc((size_t)world * sizeof(*got)),
            *want = malloc((size_t)world * sizeof(*want));
        int *first = malloc((size_t)per_node * sizeof(*first));

        int ok = FSDP_RANK_CHECK(&failure, rank, got != NULL && want != NULL && first != NULL);

        for (int hybrid = 0; hybrid < 2 && ok; hybrid++) {
            int n, m = 0;

            if (hybrid) {
                ref_classes(fs, per_node, first);
                mesh_classes(world, per_node, 1, 1, first, want);
            } else {
                ref_classes(fs, world, want);
            }
            n = fsdp_symmetric_ranks(fs, world, per_node,
                                     hybrid ? FSDP_HYBRID_SHARD : FSDP_FULL_SHARD, got);
            for (int r = 0; r < world; r++)
                m += want[r] == r;
            ok = FSDP_RANK_CHECK_MSG(&failure, rank, n == m, "%s on %d ranks%s: %d classes, not %d",
                                     what, world, hybrid ? " (hybrid)" : "", n, m);
            for (int r = 0; r < world && ok; r++)
                ok = FSDP_RANK_CHECK_MSG(&failure, rank, got[r] == want[r],
                                         "%s on %d ranks%s: rank %d stands with %d, not %d", what,
                                         world, hybrid ? " (hybrid)" : "", r, got[r], want[r]);
        }
        free(got);
        free(want);
        free(first);
        if (!ok)
            return 0;
    }
    return 1;
}

/* Model m of the symmetry tests: three MLPs, GPT-2 (a tied parameter) and Llama. */
static int symmetry_model(fsdp_t *fs, int m, fsdp_mlp_t **mlp, fsdp_lm_t **lm)
{
    static const int dims[][4] = {{1000, 3001, 7, 0}, {1, 5, 0, 0}, {3, 64, 64, 3}};
    static const int nlayers[] = {2, 1, 3};

    if (m < 3)
        return fsdp_mlp_create(fs, dims[m], nlayers[m], mlp);
    return m == 3 ? fsdp_gpt2_create(fs, &fsdp_gpt2_preset_find("gpt2-tiny")->cfg, lm)
                  : fsdp_llama_create(fs, &fsdp_llama_preset_find("llama-tiny")->cfg, lm);
}

static fsdp_status_t rank_classes(fsdp_dev_t *dev, void *arg)
{
    fsdp_config_t cfg;
    fsdp_t *fs;
    (void)arg;

    fsdp_config_init(&cfg);
    for (int m = 0; m < 10; m++) {
        char what[64];
        fsdp_mlp_t *mlp = NULL;
        fsdp_lm_t *lm = NULL;
        int ok;

        cfg.api = m < 5 ? FSDP_API_FSDP1 : FSDP_API_FSDP2;
        FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_create(dev, &cfg, &fs));
        ok = FSDP_RANK_CHECK_EQ(&failure, dev->rank, symmetry_model(fs, m % 5, &mlp, &lm), FSDP_OK);
        snprintf(what, sizeof(what), "%s model %d", fsdp_api_name(cfg.api), m % 5);
        ok = ok && check_classes(dev->rank, fs, what);
        fsdp_lm_destroy(lm);
        fsdp_mlp_destroy(mlp);
        fsdp_destroy(fs);
        if (!ok)
            return FSDP_ERR_INTERNAL;
    }
    return FSDP_OK;
}

/* The classes, derived from the boundaries of the shards and the parameters without visiting
 * every rank, are those a rank-by-rank comparison finds, on worlds from 1 to 65,536. */
static void test_symmetric_classes(void)
{
    launch_ok(1, 0, FSDP_SIM_SHAPE, rank_classes);
}

/* ---- FSDP2's classes against each rank's own layout ------------------------------------- */

#define OWNED_MAX 256 /* parameters of a model here */

/* One launch of rank_owned: a model (rank_classes's) under fully_shard with strategy and tp
 * (tensor parallelism, 1: none), each rank's tuple of what it holds of every parameter
 * (fsdp_unit_param_info's numel_in_shard and in_shard). */
typedef struct owned_case {
    int model;
    fsdp_strategy_t strategy;
    int tp;
    size_t (*tuple)[OWNED_MAX]; /* a row a rank */
    int n;                      /* entries of a row */
    int classes;                /* of the shard group's ranks, by their tuples */
} owned_case_t;

/* Every rank records its tuple; rank 0 then derives the classes rank by rank from the tuples
 * (ranks alike when their tuples are, within the node under hybrid sharding, of tp index 0 under
 * tensor parallelism, with the last place, node and tp index apart) and holds
 * fsdp_symmetric_ranks to them, and every rank of a class to its representative's tuple (under
 * tensor parallelism, of another tp index too). */
static fsdp_status_t rank_owned(fsdp_dev_t *dev, void *arg)
{
    owned_case_t *c = arg;
    int world = dev->world_size, hybrid = c->strategy == FSDP_HYBRID_SHARD;
    int g = (hybrid ? dev->local_size : world) / c->tp, n = 0, ok;
    fsdp_config_t cfg;
    fsdp_mlp_t *mlp = NULL;
    fsdp_lm_t *lm = NULL;
    fsdp_t *fs = NULL;

    fsdp_config_init(&cfg);
    cfg.api = FSDP_API_FSDP2;
    cfg.strategy = c->strategy;
    cfg.tp_size = c->tp;
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_create(dev, &cfg, &fs));
    ok = FSDP_RANK_CHECK_EQ(&failure, dev->rank, symmetry_model(fs, c->model, &mlp, &lm), FSDP_OK);
    for (int i = 0; i < fsdp_num_units(fs) && ok; i++) {
        fsdp_unit_t *u = fsdp_unit_at(fs, i);
        for (int j = 0; j < fsdp_unit_num_params(u) && ok; j++) {
            fsdp_param_info_t pi;
            ok = FSDP_RANK_CHECK(&failure, dev->rank, n < OWNED_MAX) &&
                 FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_unit_param_info(u, j, &pi), FSDP_OK);
            if (ok)
                c->tuple[dev->rank][n++] = pi.numel_in_shard * 2 + (pi.in_shard != 0);
        }
    }
    if (dev->rank == 0)
        c->n = n;
    if (dev->ops->barrier(dev, dev->ops->group_world(dev)) != FSDP_OK)
        ok = 0;
    if (ok && dev->rank == 0) {
        int *got = malloc((size_t)world * sizeof(*got)),
            *want = malloc((size_t)world * sizeof(*want));
        int *first = malloc((size_t)g * sizeof(*first)), m = 0;
        size_t row = (size_t)n * sizeof(c->tuple[0][0]);

        ok = FSDP_RANK_CHECK(&failure, 0, got != NULL && want != NULL && first != NULL);
        c->classes = 0;
        for (int x = 0; x < g && ok; x++) { /* group rank x: rank x tp of block 0 */
            int y = 0;
            while (memcmp(c->tuple[y * c->tp], c->tuple[x * c->tp], row) != 0)
                y++;
            first[x] = y;
            c->classes += y == x;
        }
        if (ok && (hybrid || c->tp > 1))
            mesh_classes(world, dev->local_size, c->tp, hybrid, first, want);
        else if (ok)
            memcpy(want, first, (size_t)world * sizeof(*want));
        for (int r = 0; r < world && ok; r++)
            m += want[r] == r;
        if (ok)
            ok = FSDP_RANK_CHECK_MSG(
                &failure, 0,
                fsdp_symmetric_ranks(fs, world, dev->local_size, c->strategy, got) == m,
                "model %d on %d ranks (%s, tp %d): not %d classes", c->model, world,
                fsdp_strategy_name(c->strategy), c->tp, m);
        for (int r = 0; r < world && ok; r++)
            ok = FSDP_RANK_CHECK_MSG(
                &failure, 0, got[r] == want[r] && memcmp(c->tuple[r], c->tuple[got[r]], row) == 0,
                "model %d on %d ranks (%s, tp %d): rank %d stands with %d, not %d", c->model, world,
                fsdp_strategy_name(c->strategy), c->tp, r, got[r], want[r]);
        free(got);
        free(want);
        free(first);
    }
    fsdp_lm_destroy(lm);
    fsdp_mlp_destroy(mlp);
    fsdp_destroy(fs);
    return ok ? FSDP_OK : FSDP_ERR_INTERNAL;
}

/* FSDP2's classes are those of the rows every rank owns, read from each rank's own layout on
 * worlds that pad (3, 5, 6, 7) and under HSDP (2 nodes of 3, 2 of 4), for MLPs, GPT-2 (a tied
 * parameter) and Llama; under tensor parallelism (tp 2) for GPT-2 and Llama, on dp groups that
 * pad (3, 5) and under HSDP x tp (2 nodes of 4, 2 nodes of 6 whose shard groups of 3 pad). */
static void test_symmetric_classes_fsdp2(void)
{
    static const int worlds[][3] = {{3, 0, 1}, {5, 0, 1}, {6, 0, 1},   {7, 0, 1}, {6, 3, 1},
                                    {8, 4, 1}, {6, 6, 2}, {10, 10, 2}, {8, 4, 2}, {12, 6, 2}};
    size_t(*tuple)[OWNED_MAX] = malloc(16 * sizeof(*tuple));
    int split = 0;

    CU_ASSERT_PTR_NOT_NULL_FATAL(tuple);
    for (size_t w = 0; w < sizeof(worlds) / sizeof(worlds[0]); w++) {
        for (int m = worlds[w][2] > 1 ? 3 : 0; m < 5; m++) {
            int hybrid = worlds[w][1] && worlds[w][1] < worlds[w][0];
            owned_case_t c = {
                m, hybrid ? FSDP_HYBRID_SHARD : FSDP_FULL_SHARD, worlds[w][2], tuple, 0, 0};
            fsdp_sim_params_t p;

            fsdp_sim_params_init(&p);
            p.world_size = worlds[w][0];
            p.ranks_per_node = worlds[w][1];
            p.mode = FSDP_SIM_SHAPE;
            p.timeout_s = 20.0;
            CU_ASSERT_EQUAL(fsdp_sim_launch(&p, rank_owned, &c, NULL), FSDP_OK);
            fsdp_test_failure_assert(&failure);
            /* neither one class nor every rank */
            split += c.classes > 1 && c.classes < (worlds[w][1] ? worlds[w][1] : worlds[w][0]);
        }
    }
    CU_ASSERT(split > 0);
    free(tuple);
}

/* A launch of mlp 1,5 under fully_shard standing ranks for others; each simulated rank's
 * fsdp_symmetry_check. */
static fsdp_status_t checked[7];

static fsdp_status_t rank_check(fsdp_dev_t *dev, void *arg)
{
    fsdp_config_t cfg;
    fsdp_mlp_t *mlp = NULL;
    fsdp_t *fs = NULL;
    int ok;

    fsdp_config_init(&cfg);
    cfg.api = FSDP_API_FSDP2;
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_create(dev, &cfg, &fs));
    ok = FSDP_RANK_CHECK_EQ(&failure, dev->rank, symmetry_model(fs, 1, &mlp, NULL), FSDP_OK);
    if (ok)
        checked[dev->rank] = fsdp_symmetry_check(fs, arg);
    fsdp_mlp_destroy(mlp);
    fsdp_destroy(fs);
    return FSDP_OK;
}

/* fsdp_symmetry_check under FSDP2: of mlp 1,5 on 7 ranks, ranks 0-4 own a row of each
 * parameter and ranks 5-6 none. The classes ({0-4}, {5-6}) pass on both representatives; rank 0
 * standing for 6 ranks, or for all 7, is refused. */
static void test_symmetry_check_fsdp2(void)
{
    static const int right[7] = {0, 0, 0, 0, 0, 5, 5},
                     wrong[][7] = {{0, 0, 0, 0, 0, 0, 6}, {0, 0, 0, 0, 0, 0, 0}};
    fsdp_sim_params_t p;

    fsdp_sim_params_init(&p);
    p.world_size = 7;
    p.mode = FSDP_SIM_SHAPE;
    p.timeout_s = 20.0;
    p.represent = right;
    checked[0] = checked[5] = FSDP_ERR_INTERNAL;
    CU_ASSERT_EQUAL(fsdp_sim_launch(&p, rank_check, (void *)right, NULL), FSDP_OK);
    fsdp_test_failure_assert(&failure);
    CU_ASSERT_EQUAL(checked[0], FSDP_OK);
    CU_ASSERT_EQUAL(checked[5], FSDP_OK);
    fsdp_log_set_handler(quiet, NULL); /* the refusals are expected */
    for (int k = 0; k < 2; k++) {
        p.represent = wrong[k];
        checked[0] = FSDP_OK;
        CU_ASSERT_EQUAL(fsdp_sim_launch(&p, rank_check, (void *)wrong[k], NULL), FSDP_OK);
        fsdp_test_failure_assert(&failure);
        CU_ASSERT_EQUAL(checked[0], FSDP_ERR_UNSUPPORTED);
    }
    fsdp_log_set_handler(NULL, NULL);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"ops_table", test_ops_table},
        {"ranks", test_ranks},
        {"segments", test_segments},
        {"host_memory", test_host_memory},
        {"streams_events", test_streams_events},
        {"bad_args", test_bad_args},
        {"symmetric_classes", test_symmetric_classes},
        {"symmetric_classes_fsdp2", test_symmetric_classes_fsdp2},
        {"symmetry_check_fsdp2", test_symmetry_check_fsdp2},
        {NULL, NULL},
    };
    return fsdp_test_run("sim", tests);
}
