/* The gpu backend's polling (gpu/poll.h), which needs no CUDA: how long each kind of poll
 * spins, yields and naps. A collective's enqueue never naps within its first millisecond; a host
 * wait never naps longer than tens of microseconds; init, split and finalize nap from 1 us up to
 * 1 ms. The watchdog's ring retires finished collectives oldest first, and only those. A split
 * that times out or fails aborts every communicator and then the child that NCCL published
 * late, over a stub communicator layer. */
#include "poll.h"

#include "test_util.h"

static void test_enqueue_yields_first(void)
{
    fsdp_gpu_poll_t p;
    long pause;

    fsdp_gpu_poll_start(&p, FSDP_GPU_POLL_ENQUEUE, 100.0);
    for (double t = 100.0; t < 100.0 + 0.999e-3; t += 1e-6)
        CU_ASSERT_EQUAL_FATAL(fsdp_gpu_poll_pause(&p, t), FSDP_GPU_POLL_YIELD);
    /* past the yield phase: naps, growing to 1 ms and no further */
    pause = fsdp_gpu_poll_pause(&p, 100.0 + 1.5e-3);
    CU_ASSERT_EQUAL(pause, FSDP_GPU_POLL_NAP_NS);
    for (int i = 0; i < 40; i++)
        pause = fsdp_gpu_poll_pause(&p, 101.0);
    CU_ASSERT_EQUAL(pause, FSDP_GPU_POLL_NAP_MAX_NS);
}

static void test_wait_naps_stay_short(void)
{
    fsdp_gpu_poll_t p;
    long pause, last = 0;

    fsdp_gpu_poll_start(&p, FSDP_GPU_POLL_WAIT, 0.0);
    for (unsigned i = 0; i < FSDP_GPU_POLL_SPINS; i++)
        CU_ASSERT_EQUAL_FATAL(fsdp_gpu_poll_pause(&p, 0.0), FSDP_GPU_POLL_AGAIN);
    for (int i = 0; i < 1000; i++) {
        pause = fsdp_gpu_poll_pause(&p, 1.0 + i);
        CU_ASSERT_FATAL(pause > 0 && pause <= FSDP_GPU_POLL_WAIT_NAP_MAX_NS);
        CU_ASSERT_FATAL(pause >= last); /* never shrinks */
        last = pause;
    }
    CU_ASSERT_EQUAL(last, FSDP_GPU_POLL_WAIT_NAP_MAX_NS);
    CU_ASSERT(FSDP_GPU_POLL_WAIT_NAP_MAX_NS <= 50000); /* tens of microseconds */
}

static void test_comm_naps_grow(void)
{
    fsdp_gpu_poll_t p;
    long pause, want = FSDP_GPU_POLL_NAP_NS;

    fsdp_gpu_poll_start(&p, FSDP_GPU_POLL_COMM, 0.0);
    for (int i = 0; i < 30; i++) {
        pause = fsdp_gpu_poll_pause(&p, 0.0);
        CU_ASSERT_EQUAL_FATAL(pause, want);
        want = want >= FSDP_GPU_POLL_NAP_MAX_NS / 2 ? FSDP_GPU_POLL_NAP_MAX_NS : 2 * want;
    }
    CU_ASSERT_EQUAL(pause, FSDP_GPU_POLL_NAP_MAX_NS);
}

/* A stub of the device: which slots' collectives have ended, and one that failed. */
typedef struct stub_device {
    int ended[8];
    int failed_slot;
    unsigned queries;
} stub_device_t;

static int stub_done(void *ctx, unsigned slot)
{
    stub_device_t *d = ctx;

    d->queries++;
    if ((int)slot == d->failed_slot)
        return -1;
    return d->ended[slot];
}

static void test_ring_retires_oldest_first(void)
{
    stub_device_t d = {.failed_slot = -1};
    fsdp_gpu_ring_t r;
    unsigned slot = 99;

    fsdp_gpu_ring_init(&r, 8);
    CU_ASSERT_FALSE(fsdp_gpu_ring_newest(&r, &slot));
    for (unsigned i = 0; i < 8; i++)
        CU_ASSERT_EQUAL(fsdp_gpu_ring_push(&r), i);
    CU_ASSERT_TRUE(fsdp_gpu_ring_full(&r));
    CU_ASSERT_TRUE(fsdp_gpu_ring_newest(&r, &slot));
    CU_ASSERT_EQUAL(slot, 7);

    /* 0, 1 ended, 2 not, 3 ended: 0 and 1 retire, 3 waits behind 2 */
    d.ended[0] = d.ended[1] = d.ended[3] = 1;
    CU_ASSERT_EQUAL(fsdp_gpu_ring_retire(&r, stub_done, &d, &slot), 0);
    CU_ASSERT_EQUAL(r.count, 6);
    CU_ASSERT_EQUAL(r.head, 2);
    CU_ASSERT_EQUAL(d.queries, 3);

    /* two more wrap around the end of the slots */
    CU_ASSERT_EQUAL(fsdp_gpu_ring_push(&r), 0);
    CU_ASSERT_EQUAL(fsdp_gpu_ring_push(&r), 1);
    d.ended[0] = d.ended[1] = 0;
    CU_ASSERT_TRUE(fsdp_gpu_ring_newest(&r, &slot));
    CU_ASSERT_EQUAL(slot, 1);

    /* everything ended: the ring empties, a wait would take the fast path */
    for (unsigned i = 0; i < 8; i++)
        d.ended[i] = 1;
    CU_ASSERT_EQUAL(fsdp_gpu_ring_retire(&r, stub_done, &d, &slot), 0);
    CU_ASSERT_EQUAL(r.count, 0);
    CU_ASSERT_EQUAL(r.head, 2);
}

static void test_ring_stops_at_a_failure(void)
{
    stub_device_t d = {.failed_slot = 2};
    fsdp_gpu_ring_t r;
    unsigned slot = 99;

    fsdp_gpu_ring_init(&r, 8);
    for (unsigned i = 0; i < 4; i++)
        (void)fsdp_gpu_ring_push(&r);
    for (unsigned i = 0; i < 8; i++)
        d.ended[i] = 1;
    CU_ASSERT_EQUAL(fsdp_gpu_ring_retire(&r, stub_done, &d, &slot), -1);
    CU_ASSERT_EQUAL(slot, 2); /* the failed one, left in place to be named */
    CU_ASSERT_EQUAL(r.count, 2);
    fsdp_gpu_ring_clear(&r);
    CU_ASSERT_EQUAL(r.count, 0);
}

/* A stub communicator layer: a parent and a child that NCCL's thread publishes at a given poll,
 * or only while the parent is being aborted; time advances 1 ms per pause. */
typedef struct stub_split {
    int parent, child;    /* the two communicators (their addresses) */
    int publish_at;       /* the poll at which the child is published; -1 never by itself */
    int publish_on_abort; /* published while every communicator is aborted */
    int child_state;      /* the child's state once published */
    int polls, aborted_all, why, child_aborted, published;
    double t;
} stub_split_t;

static int stub_state(void *ctx, void *comm)
{
    stub_split_t *st = ctx;

    st->polls++;
    if (st->publish_at >= 0 && st->polls >= st->publish_at)
        st->published = 1;
    return comm == &st->child ? st->child_state : 1; /* the parent stays in progress */
}

static void *stub_published(void *ctx)
{
    stub_split_t *st = ctx;
    return st->published ? &st->child : NULL;
}

static void stub_abort_all(void *ctx, int why)
{
    stub_split_t *st = ctx;

    st->aborted_all++;
    st->why = why;
    if (st->publish_on_abort)
        st->published = 1; /* NCCL's thread finished the child meanwhile */
}

static void stub_abort(void *ctx, void *comm)
{
    stub_split_t *st = ctx;
    if (comm == &st->child)
        st->child_aborted++;
}

static double stub_now(void *ctx)
{
    return ((stub_split_t *)ctx)->t;
}

static void stub_pause(void *ctx, fsdp_gpu_poll_t *p)
{
    (void)p;
    ((stub_split_t *)ctx)->t += 1e-3;
}

static int stub_settle(stub_split_t *st, int child, double timeout_s, void **aborted_p)
{
    const fsdp_gpu_split_layer_t layer = {
        stub_state, stub_published, stub_abort_all, stub_abort, stub_now, stub_pause, st};
    return fsdp_gpu_split_settle(&layer, &st->parent, child, timeout_s, aborted_p);
}

static void test_split_timeout_aborts_late_child(void)
{
    stub_split_t st = {.publish_at = -1, .publish_on_abort = 1, .child_state = 1};
    void *aborted = NULL;

    CU_ASSERT_EQUAL(stub_settle(&st, 1, 0.05, &aborted), FSDP_GPU_SPLIT_TIMED_OUT);
    CU_ASSERT_EQUAL(st.aborted_all, 1);
    CU_ASSERT_EQUAL(st.why, FSDP_GPU_SPLIT_TIMED_OUT);
    CU_ASSERT_EQUAL(st.child_aborted, 1); /* published after the code saw NULL: aborted too */
    CU_ASSERT_PTR_EQUAL(aborted, &st.child);
    CU_ASSERT(st.t > 0.05 && st.t < 0.06);
}

static void test_split_timeout_without_child(void)
{
    stub_split_t st = {.publish_at = -1, .child_state = 1};
    void *aborted = &st;

    CU_ASSERT_EQUAL(stub_settle(&st, 1, 0.01, &aborted), FSDP_GPU_SPLIT_TIMED_OUT);
    CU_ASSERT_EQUAL(st.aborted_all, 1);
    CU_ASSERT_EQUAL(st.child_aborted, 0);
    CU_ASSERT_PTR_NULL(aborted); /* never seen: the caller leaves NCCL its slot */
}

static void test_split_child_published_then_settles(void)
{
    stub_split_t st = {.publish_at = 5, .child_state = 0};
    void *aborted = &st;

    CU_ASSERT_EQUAL(stub_settle(&st, 1, 1.0, &aborted), 0);
    CU_ASSERT_EQUAL(st.aborted_all, 0);
    CU_ASSERT_EQUAL(st.child_aborted, 0);
    CU_ASSERT_PTR_NULL(aborted);
    CU_ASSERT_EQUAL(st.polls, 6); /* published during the 5th poll: the 6th, its first, settles */
}

static void test_split_child_fails(void)
{
    stub_split_t st = {.publish_at = 2, .child_state = -1};
    void *aborted = NULL;

    CU_ASSERT_EQUAL(stub_settle(&st, 1, 0.0, &aborted), FSDP_GPU_SPLIT_FAILED);
    CU_ASSERT_EQUAL(st.aborted_all, 1);
    CU_ASSERT_EQUAL(st.why, FSDP_GPU_SPLIT_FAILED);
    CU_ASSERT_EQUAL(st.child_aborted, 1);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"an enqueue yields for 1 ms before it naps", test_enqueue_yields_first},
        {"a wait spins, then naps of tens of microseconds", test_wait_naps_stay_short},
        {"init, split, finalize: naps from 1 us to 1 ms", test_comm_naps_grow},
        {"the ring retires ended collectives, oldest first", test_ring_retires_oldest_first},
        {"the ring stops at a collective that failed", test_ring_stops_at_a_failure},
        {"a split that times out aborts the child published late",
         test_split_timeout_aborts_late_child},
        {"a split that times out with no child aborts the rest", test_split_timeout_without_child},
        {"a split settles on its child once published", test_split_child_published_then_settles},
        {"a split whose child fails aborts it", test_split_child_fails},
        {NULL, NULL},
    };
    return fsdp_test_run("gpu_poll", tests);
}
