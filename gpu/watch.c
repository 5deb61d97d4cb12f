/* The watchdog of collectives in flight, and every host wait bounded by the collective timeout:
 * the clock, naps between polls, draining the ring, polling an event or a stream.
 *
 * Each collective records an event into the dev's ring (gdev->watch); fsdp_gpu_watchdog()
 * retires the finished ones, and fails the oldest once it is older than the timeout, or any
 * communicator that reports an asynchronous error: then every communicator of the rank is
 * revoked, then aborted (ncclCommAbort ends NCCL kernels that wait for a peer that will never
 * come), and later collectives fail at once with the same status. Below streams, collectives
 * and traces, which all wait through here. */
#include "config.h"

#include "gpu.h"

#include <sched.h>
#include <stdio.h>
#include <time.h>

double fsdp_gpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void fsdp_gpu_poll_begin(fsdp_gpu_poll_t *p, fsdp_gpu_poll_kind_t kind)
{
    fsdp_gpu_poll_start(p, kind, fsdp_gpu_now());
}

void fsdp_gpu_pause(fsdp_gpu_poll_t *p)
{
    long ns = fsdp_gpu_poll_pause(p, fsdp_gpu_now());

    if (ns == FSDP_GPU_POLL_YIELD) {
        sched_yield();
    } else if (ns > 0) {
        struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
        nanosleep(&ts, NULL); /* a signal only shortens the nap */
    }
}

int fsdp_gpu_timed_out(const fsdp_gpu_dev_t *gdev, double t0)
{
    return gdev->timeout_s > 0.0 && fsdp_gpu_now() - t0 > gdev->timeout_s;
}

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
/* Weak: a module built against NCCL 2.28's headers still loads on the NCCL >= 2.18 that a system
 * has (null then, and each communicator is only aborted). */
#pragma weak ncclCommRevoke
#endif

/* ncclCommAbort is synchronous, and with splitShare = 0 each split communicator has an abort
 * flag of its own: aborting one communicator can block behind a kernel of another that still
 * spins for a peer. ncclCommRevoke (NCCL 2.28) stops a communicator's operations in flight
 * without blocking, so where the loaded NCCL has it every communicator is revoked first, then
 * each is aborted. */
void fsdp_gpu_fail_all(fsdp_gpu_dev_t *gdev, fsdp_status_t status)
{
    if (gdev->failed == FSDP_OK)
        gdev->failed = status;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    for (fsdp_gpu_group_t *g = gdev->groups; g != NULL && ncclCommRevoke != NULL; g = g->next) {
        if (g->comm != NULL)
            (void)FSDP_NCCL_CALL(ncclCommRevoke(g->comm, NCCL_REVOKE_DEFAULT));
    }
#endif
    for (fsdp_gpu_group_t *g = gdev->groups; g != NULL; g = g->next) {
        if (g->comm != NULL) {
            (void)FSDP_NCCL_CALL(ncclCommAbort(g->comm));
            g->comm = NULL;
        }
    }
    fsdp_gpu_ring_clear(&gdev->ring);
}

fsdp_status_t fsdp_gpu_watch_add(fsdp_gpu_dev_t *gdev, fsdp_gpu_group_t *g, cudaStream_t stream,
                                 const char *what)
{
    fsdp_gpu_watch_t *w;
    fsdp_status_t status;

    w = &gdev->watch[fsdp_gpu_ring_at(&gdev->ring, gdev->ring.count)];
    status = FSDP_CUDA_CALL(cudaEventRecord(w->done, stream));
    if (status != FSDP_OK)
        return status;
    w->t0 = fsdp_gpu_now();
    w->group = g;
    snprintf(w->what, sizeof(w->what), "%s", what);
    (void)fsdp_gpu_ring_push(&gdev->ring);
    if (gdev->blocking_collectives)
        return fsdp_gpu_host_wait(gdev, w->done, NULL, what);
    return FSDP_OK;
}

/* The ring's done(): the collective's end event, queried. */
typedef struct retire_ctx {
    fsdp_gpu_dev_t *gdev;
    cudaError_t err;
} retire_ctx_t;

static int watch_done(void *ctx, unsigned slot)
{
    retire_ctx_t *c = ctx;

    c->err = cudaEventQuery(c->gdev->watch[slot].done);
    if (c->err == cudaSuccess)
        return 1;
    return c->err == cudaErrorNotReady ? 0 : -1;
}

fsdp_status_t fsdp_gpu_watch_retire(fsdp_gpu_dev_t *gdev)
{
    retire_ctx_t ctx = {gdev, cudaSuccess};
    fsdp_status_t status;
    unsigned slot = 0;

    if (fsdp_gpu_ring_retire(&gdev->ring, watch_done, &ctx, &slot) == 0)
        return FSDP_OK;
    status = fsdp_gpu_cuda_status(ctx.err, "cudaEventQuery(collective done)", __FILE__, __LINE__,
                                  __func__);
    fsdp_error("rank %d: %s failed on the device", gdev->super.rank, gdev->watch[slot].what);
    fsdp_gpu_fail_all(gdev, status);
    return status;
}

fsdp_status_t fsdp_gpu_watchdog(fsdp_gpu_dev_t *gdev)
{
    fsdp_status_t status;
    ncclResult_t st;

    if (gdev->failed != FSDP_OK)
        return gdev->failed;
    for (fsdp_gpu_group_t *g = gdev->groups; g != NULL; g = g->next) {
        if (g->comm == NULL)
            continue;
        status = FSDP_NCCL_CALL(ncclCommGetAsyncError(g->comm, &st));
        if (status == FSDP_OK && st != ncclSuccess && st != ncclInProgress) {
            const char *what = "no collective in flight";
            for (unsigned i = 0; i < gdev->ring.count; i++) {
                const fsdp_gpu_watch_t *w = &gdev->watch[fsdp_gpu_ring_at(&gdev->ring, i)];
                if (w->group == g) {
                    what = w->what;
                    break;
                }
            }
            fsdp_error("rank %d: asynchronous NCCL error on group %s (oldest collective in "
                       "flight: %s)",
                       gdev->super.rank, g->super.name, what);
            status =
                fsdp_gpu_nccl_status(st, "ncclCommGetAsyncError", __FILE__, __LINE__, __func__);
        }
        if (status != FSDP_OK) {
            fsdp_gpu_fail_all(gdev, status);
            return status;
        }
    }
    status = fsdp_gpu_watch_retire(gdev);
    if (status != FSDP_OK)
        return status;
    if (gdev->ring.count > 0 && fsdp_gpu_timed_out(gdev, gdev->watch[gdev->ring.head].t0)) {
        fsdp_gpu_watch_t *w = &gdev->watch[gdev->ring.head];
        fsdp_error("rank %d: %s did not complete within %g s (collective timeout): aborting the "
                   "communicators",
                   gdev->super.rank, w->what, gdev->timeout_s);
        fsdp_gpu_fail_all(gdev, FSDP_ERR_TIMEOUT);
        return FSDP_ERR_TIMEOUT;
    }
    return FSDP_OK;
}

fsdp_status_t fsdp_gpu_watch_drain(fsdp_gpu_dev_t *gdev)
{
    fsdp_gpu_poll_t poll;
    fsdp_status_t status;

    fsdp_gpu_poll_begin(&poll, FSDP_GPU_POLL_WAIT);
    for (;;) {
        status = fsdp_gpu_watchdog(gdev);
        if (status != FSDP_OK || gdev->ring.count == 0)
            return status;
        fsdp_gpu_pause(&poll);
    }
}

/* The host waits by polling, so that a collective that never completes cannot hang it: a short
 * spin first (most waits are short), then naps of tens of microseconds (poll.h). A wait that
 * succeeds retires the collectives it has seen end, so that the next one takes the fast path,
 * a plain synchronization, once none is left in flight. */
fsdp_status_t fsdp_gpu_host_wait(fsdp_gpu_dev_t *gdev, cudaEvent_t ev, cudaStream_t stream,
                                 const char *what)
{
    fsdp_gpu_poll_t poll;
    fsdp_status_t status;
    cudaError_t err;

    if (gdev->ring.count > 0 && gdev->failed == FSDP_OK) {
        status = fsdp_gpu_watch_retire(gdev);
        if (status != FSDP_OK)
            return status;
    }
    if (gdev->ring.count == 0 && gdev->failed == FSDP_OK) {
        /* No collective in flight: nothing this wait depends on can hang. */
        if (ev != NULL)
            return FSDP_CUDA_CALL(cudaEventSynchronize(ev));
        return FSDP_CUDA_CALL(cudaStreamSynchronize(stream));
    }
    fsdp_gpu_poll_begin(&poll, FSDP_GPU_POLL_WAIT);
    for (;;) {
        err = ev != NULL ? cudaEventQuery(ev) : cudaStreamQuery(stream);
        if (err == cudaSuccess)
            return gdev->failed == FSDP_OK ? fsdp_gpu_watch_retire(gdev) : FSDP_OK;
        if (err != cudaErrorNotReady)
            return fsdp_gpu_cuda_status(
                err, ev != NULL ? "cudaEventQuery(ev)" : "cudaStreamQuery(stream)", __FILE__,
                __LINE__, __func__);
        status = fsdp_gpu_watchdog(gdev);
        if (status != FSDP_OK) {
            fsdp_error("rank %d: wait for %s abandoned: %s", gdev->super.rank, what,
                       fsdp_status_string(status));
            return status;
        }
        fsdp_gpu_pause(&poll);
    }
}
