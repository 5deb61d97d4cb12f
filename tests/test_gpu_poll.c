/* The gpu backend's polling (gpu/poll.h), which needs no CUDA: how long each kind of poll
 * spins, yields and naps. A collective's enqueue never naps within its first millisecond; a host
 * wait never naps longer than tens of microseconds; init, split and finalize nap from 1 us up to
 * 1 ms. */
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

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"an enqueue yields for 1 ms before it naps", test_enqueue_yields_first},
        {"a wait spins, then naps of tens of microseconds", test_wait_naps_stay_short},
        {"init, split, finalize: naps from 1 us to 1 ms", test_comm_naps_grow},
        {NULL, NULL},
    };
    return fsdp_test_run("gpu_poll", tests);
}
