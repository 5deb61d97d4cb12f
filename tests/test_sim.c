/* The sim backend's ops table apart from collectives: rank contexts, segments in data and
 * shape mode, streams, events, copies, the kernel slot in shape mode, and errors.
 *
 * Rank functions record the first failed check (test_util.h); the main thread asserts it. */
#include <fsdp/fsdp.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

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
    const fsdp_backend_ops_t *ops = dev->ops;
    size_t sizes[] = {0, 1, 63, 64, 1000, 1 << 20};
    void *p[6];
    (void)arg;

    for (int i = 0; i < 6; i++) {
        FSDP_RANK_REQUIRE_OK(
            &failure, dev,
            ops->segment_alloc(dev, i % 2 ? FSDP_MEMKIND_HOST_PINNED : FSDP_MEMKIND_DEVICE,
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
        ops->segment_free(dev, i % 2 ? FSDP_MEMKIND_HOST_PINNED : FSDP_MEMKIND_DEVICE, p[i]);
    }
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                          ops->segment_alloc(dev, (fsdp_memkind_t)9, 8, &p[0]) ==
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
    const fsdp_backend_ops_t *ops = dev->ops;
    fsdp_kernel_t k = {.kind = FSDP_K_FILL};
    uintptr_t p[4];
    (void)arg;

    /* never touched, so terabytes are fine; ranges must not overlap */
    for (int i = 0; i < 4; i++) {
        void *v = NULL;
        FSDP_RANK_REQUIRE_OK(&failure, dev,
                             ops->segment_alloc(dev, FSDP_MEMKIND_DEVICE, (size_t)1 << 40, &v));
        p[i] = (uintptr_t)v;
        FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, p[i] != 0, "shape segment is NULL");
        for (int j = 0; j < i; j++)
            FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                                  p[i] >= p[j] + ((size_t)1 << 40) ||
                                      p[j] >= p[i] + ((size_t)1 << 40),
                                  "shape segments %d and %d overlap", i, j);
    }
    for (int i = 0; i < 4; i++)
        ops->segment_free(dev, FSDP_MEMKIND_DEVICE, (void *)p[i]);
    /* shape mode runs no kernel and copies nothing: the pointers are fake */
    k.u.fill.x = (void *)p[0];
    k.u.fill.dtype = FSDP_DTYPE_F32;
    k.u.fill.n = 1000;
    FSDP_RANK_REQUIRE_OK(&failure, dev, ops->kernel(dev, NULL, &k));
    FSDP_RANK_REQUIRE_OK(&failure, dev,
                         ops->memcpy_async(dev, (void *)p[1], (void *)p[2], 4096, NULL));
    return FSDP_OK;
}

static void test_segments(void)
{
    fsdp_log_set_handler(quiet, NULL); /* the refusals are expected */
    launch_ok(3, 0, FSDP_SIM_DATA, rank_segments);
    fsdp_log_set_handler(NULL, NULL);
    launch_ok(4, 0, FSDP_SIM_SHAPE, rank_shape_segments);
}

static fsdp_status_t rank_streams(fsdp_dev_t *dev, void *arg)
{
    const fsdp_backend_ops_t *ops = dev->ops;
    fsdp_stream_t *compute = ops->compute_stream(dev), *s1, *s2;
    fsdp_event_t *ev;
    fsdp_kernel_t k = {.kind = FSDP_K_FILL};
    char src[100], dst[100];
    float x[5] = {0};
    int done = 0;
    (void)arg;

    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                          compute->id == 0 && strcmp(compute->name, "compute") == 0,
                          "compute stream is %d '%s'", compute->id, compute->name);
    FSDP_RANK_REQUIRE_OK(&failure, dev, ops->stream_create(dev, "unshard", -1, &s1));
    FSDP_RANK_REQUIRE_OK(&failure, dev, ops->stream_create(dev, "post_backward", 0, &s2));
    FSDP_RANK_REQUIRE_MSG(
        &failure, dev->rank,
        s1->id == 1 && s2->id == 2 && s1->priority == -1 && strcmp(s1->name, "unshard") == 0 &&
            strcmp(s2->name, "post_backward") == 0,
        "streams %d '%s' %d, %d '%s'", s1->id, s1->name, s1->priority, s2->id, s2->name);

    for (int i = 0; i < 100; i++)
        src[i] = (char)(i + dev->rank);
    FSDP_RANK_REQUIRE_OK(&failure, dev, ops->memcpy_async(dev, dst, src, sizeof(src), s1));
    FSDP_RANK_REQUIRE_OK(&failure, dev, ops->memcpy_async(dev, dst, dst, 0, s1));
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, memcmp(dst, src, sizeof(src)) == 0,
                          "memcpy_async did not copy");
    /* onto itself: no data moves (a device copy onto itself is undefined), but the copy is
     * still issued, priced and traced */
    {
        double before = ops->host_time(dev);
        FSDP_RANK_REQUIRE_OK(&failure, dev, ops->memcpy_async(dev, dst, dst, sizeof(dst), s1));
        FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                              memcmp(dst, src, sizeof(src)) == 0 && ops->host_time(dev) > before,
                              "a copy onto itself changed the data or was not issued");
    }

    FSDP_RANK_REQUIRE_OK(&failure, dev, ops->event_create(dev, &ev));
    FSDP_RANK_REQUIRE_OK(&failure, dev,
                         ops->event_query(dev, ev, &done)); /* never recorded: complete */
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, done == 1, "unrecorded event not complete");
    FSDP_RANK_REQUIRE_OK(&failure, dev, ops->event_record(dev, ev, s1));
    FSDP_RANK_REQUIRE_OK(&failure, dev, ops->stream_wait_event(dev, s2, ev));
    FSDP_RANK_REQUIRE_OK(&failure, dev, ops->stream_wait_event(dev, NULL, ev));
    FSDP_RANK_REQUIRE_OK(&failure, dev, fsdp_stream_wait_stream(dev, compute, s2));
    FSDP_RANK_REQUIRE_OK(&failure, dev, ops->event_synchronize(dev, ev));
    FSDP_RANK_REQUIRE_OK(&failure, dev, ops->event_query(dev, ev, &done));
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, done == 1, "event not complete after synchronize");
    FSDP_RANK_REQUIRE_OK(&failure, dev, ops->stream_synchronize(dev, s2));
    FSDP_RANK_REQUIRE_OK(&failure, dev, ops->stream_synchronize(dev, NULL));
    /* launches cost the host time (the default profile's launch overhead) */
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, ops->host_time(dev) > 0.0, "host time %g",
                          ops->host_time(dev));
    ops->event_destroy(dev, ev);
    ops->stream_destroy(dev, s2);
    ops->stream_destroy(dev, s1);
    ops->stream_destroy(dev, compute); /* the backend's: ignored */
    ops->stream_destroy(dev, NULL);
    ops->event_destroy(dev, NULL);
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, ops->compute_stream(dev)->id == 0,
                          "compute stream gone");
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                          ops->event_record(dev, NULL, NULL) == FSDP_ERR_INVALID_PARAM,
                          "NULL event accepted");
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                          ops->kernel(dev, NULL, NULL) == FSDP_ERR_INVALID_PARAM,
                          "NULL kernel accepted");

    /* data mode runs the kernel now, on this thread */
    k.u.fill.x = x;
    k.u.fill.dtype = FSDP_DTYPE_F32;
    k.u.fill.n = 4;
    k.u.fill.value = 2.5;
    FSDP_RANK_REQUIRE_OK(&failure, dev, ops->kernel(dev, ops->compute_stream(dev), &k));
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, x[0] == 2.5f && x[3] == 2.5f && x[4] == 0.0f,
                          "fill gave %g %g %g", (double)x[0], (double)x[3], (double)x[4]);
    k.u.fill.x = NULL; /* malformed: the executor refuses it and the rank remembers */
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, ops->kernel(dev, NULL, &k) == FSDP_ERR_INVALID_PARAM,
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
    const fsdp_backend_ops_t *ops = dev->ops;
    fsdp_group_t *w = ops->group_world(dev);
    float x[4] = {0};
    (void)arg;

    /* bad arguments are refused on the calling rank, before any rendezvous */
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                          ops->all_reduce(dev, NULL, x, x, 4, FSDP_DTYPE_F32, FSDP_REDUCE_SUM,
                                          NULL) == FSDP_ERR_INVALID_PARAM,
                          "NULL group accepted");
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                          ops->all_reduce(dev, w, x, x, 4, FSDP_DTYPE_I32, FSDP_REDUCE_AVG, NULL) ==
                              FSDP_ERR_INVALID_PARAM,
                          "i32 avg accepted");
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                          strstr(fsdp_sim_last_error(dev), "avg needs a floating-point dtype") !=
                              NULL,
                          "last error '%s'", fsdp_sim_last_error(dev));
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                          ops->all_reduce(dev, w, x, x, 4, (fsdp_dtype_t)17, FSDP_REDUCE_SUM,
                                          NULL) == FSDP_ERR_INVALID_PARAM,
                          "dtype 17 accepted");
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                          ops->reduce_scatter(dev, w, x, x, 1, FSDP_DTYPE_F32, (fsdp_reduce_op_t)9,
                                              NULL) == FSDP_ERR_INVALID_PARAM,
                          "op 9 accepted");
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                          ops->broadcast(dev, w, x, 4, FSDP_DTYPE_F32, w->size, NULL) ==
                              FSDP_ERR_INVALID_PARAM,
                          "root %d accepted", w->size);
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                          ops->all_gather(dev, w, NULL, x, 1, FSDP_DTYPE_F32, NULL) ==
                              FSDP_ERR_INVALID_PARAM,
                          "NULL send accepted");
    /* and the group still works afterwards: nothing was deposited */
    FSDP_RANK_REQUIRE_OK(&failure, dev,
                         ops->all_reduce(dev, w, x, x, 4, FSDP_DTYPE_F32, FSDP_REDUCE_SUM, NULL));
    FSDP_RANK_REQUIRE_OK(&failure, dev, ops->barrier(dev, w));
    return FSDP_OK;
}

static void test_bad_args(void)
{
    fsdp_log_set_handler(quiet, NULL); /* the refusals are expected */
    launch_ok(3, 0, FSDP_SIM_DATA, rank_bad_args);
    fsdp_log_set_handler(NULL, NULL);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"ops_table", test_ops_table}, {"ranks", test_ranks},
        {"segments", test_segments},   {"streams_events", test_streams_events},
        {"bad_args", test_bad_args},   {NULL, NULL},
    };
    return fsdp_test_run("sim", tests);
}
