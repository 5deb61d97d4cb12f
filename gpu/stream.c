/* Device and pinned segments, streams, events, copies and the host clock slot; every host wait
 * goes through the watchdog (watch.c). */
#include "config.h"

#include "gpu_trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

double fsdp_gpu_host_time(fsdp_dev_t *dev)
{
    (void)dev;
    return fsdp_gpu_now();
}

/* The calling thread's current device is per thread in CUDA: make it this rank's before any call
 * that creates something or enqueues work. */
static fsdp_status_t use_device(fsdp_gpu_dev_t *gdev)
{
    return FSDP_CUDA_CALL(cudaSetDevice(gdev->device));
}

fsdp_status_t fsdp_gpu_segment_alloc(fsdp_dev_t *dev, fsdp_memkind_t kind, size_t bytes,
                                     void **ptr_p)
{
    fsdp_gpu_dev_t *gdev = fsdp_gpu_dev_of(dev);
    fsdp_status_t status;
    void *ptr = NULL;

    if (ptr_p == NULL || (kind != FSDP_MEMKIND_DEVICE && kind != FSDP_MEMKIND_HOST_PINNED)) {
        fsdp_error("rank %d: segment_alloc: invalid %s (memkind %d; 0 device, 1 host pinned)",
                   dev->rank, ptr_p == NULL ? "ptr_p NULL" : "memkind", (int)kind);
        return FSDP_ERR_INVALID_PARAM;
    }
    status = use_device(gdev);
    if (status != FSDP_OK)
        return status;
    if (kind == FSDP_MEMKIND_DEVICE)
        status = FSDP_CUDA_CALL(cudaMalloc(&ptr, bytes));
    else
        status = FSDP_CUDA_CALL(cudaHostAlloc(&ptr, bytes, cudaHostAllocDefault));
    if (status != FSDP_OK)
        return status;
    *ptr_p = ptr;
    return FSDP_OK;
}

/* cudaFree and cudaFreeHost synchronize the whole device: a collective that never completes
 * would hang them. Its wait is bounded first; past the timeout the communicators are aborted,
 * which ends NCCL's kernels, and the free then returns. */
static void before_free(fsdp_gpu_dev_t *gdev)
{
    if (gdev->ring.count > 0)
        (void)fsdp_gpu_watch_drain(gdev);
}

void fsdp_gpu_segment_free(fsdp_dev_t *dev, fsdp_memkind_t kind, void *ptr)
{
    if (ptr == NULL)
        return;
    if (use_device(fsdp_gpu_dev_of(dev)) != FSDP_OK)
        return;
    before_free(fsdp_gpu_dev_of(dev));
    if (kind == FSDP_MEMKIND_HOST_PINNED)
        (void)FSDP_CUDA_CALL(cudaFreeHost(ptr));
    else
        (void)FSDP_CUDA_CALL(cudaFree(ptr));
}

fsdp_status_t fsdp_gpu_stream_init(fsdp_gpu_dev_t *gdev, fsdp_gpu_stream_t *s, int id,
                                   const char *name, int priority)
{
    int prio = priority;
    fsdp_status_t status;

    /* CUDA: lower is higher priority; [greatest, least], e.g. [-5, 0]. */
    if (prio < gdev->prio_greatest)
        prio = gdev->prio_greatest;
    if (prio > gdev->prio_least)
        prio = gdev->prio_least;
    memset(s, 0, sizeof(*s));
    /* Non-blocking: no implicit synchronization with the legacy default stream, as PyTorch's
     * side streams; all ordering is explicit through events. */
    status = FSDP_CUDA_CALL(cudaStreamCreateWithPriority(&s->cu, cudaStreamNonBlocking, prio));
    if (status != FSDP_OK)
        return status;
    s->super.id = id;
    s->super.priority = prio;
    /* unnamed streams are named as the simulator names them */
    if (name != NULL)
        snprintf(s->super.name, sizeof(s->super.name), "%s", name);
    else
        snprintf(s->super.name, sizeof(s->super.name), "stream%d", id);
    return FSDP_OK;
}

void fsdp_gpu_stream_fini(fsdp_gpu_stream_t *s)
{
    if (s->cublas != NULL) /* synchronizes the device */
        (void)FSDP_CUBLAS_CALL(cublasDestroy(s->cublas));
    if (s->scratch != NULL)
        (void)FSDP_CUDA_CALL(cudaFree(s->scratch)); /* waits for the work that uses it */
    s->cublas = NULL;
    if (s->cu != NULL)
        (void)FSDP_CUDA_CALL(cudaStreamDestroy(s->cu));
    s->scratch = NULL;
    s->cu = NULL;
}

fsdp_stream_t *fsdp_gpu_compute_stream(fsdp_dev_t *dev)
{
    return &fsdp_gpu_dev_of(dev)->compute.super;
}

fsdp_status_t fsdp_gpu_stream_create(fsdp_dev_t *dev, const char *name, int priority,
                                     fsdp_stream_t **stream_p)
{
    fsdp_gpu_dev_t *gdev = fsdp_gpu_dev_of(dev);
    fsdp_gpu_stream_t *s;
    fsdp_status_t status;

    if (stream_p == NULL) {
        fsdp_error("rank %d: stream_create: stream_p is NULL", dev->rank);
        return FSDP_ERR_INVALID_PARAM;
    }
    status = use_device(gdev);
    if (status != FSDP_OK)
        return status;
    s = malloc(sizeof(*s));
    if (s == NULL)
        return FSDP_ERR_NO_MEMORY;
    status = fsdp_gpu_stream_init(gdev, s, gdev->next_stream_id, name, priority);
    if (status != FSDP_OK) {
        free(s);
        return status;
    }
    gdev->next_stream_id++;
    *stream_p = &s->super;
    return FSDP_OK;
}

void fsdp_gpu_stream_destroy(fsdp_dev_t *dev, fsdp_stream_t *stream)
{
    fsdp_gpu_dev_t *gdev = fsdp_gpu_dev_of(dev);
    fsdp_gpu_stream_t *s = (fsdp_gpu_stream_t *)stream;

    if (s == NULL || s == &gdev->compute)
        return;
    (void)use_device(gdev);
    if (s->scratch != NULL || s->cublas != NULL)
        before_free(gdev);
    fsdp_gpu_stream_fini(s);
    free(s);
}

fsdp_status_t fsdp_gpu_stream_synchronize(fsdp_dev_t *dev, fsdp_stream_t *stream)
{
    fsdp_gpu_dev_t *gdev = fsdp_gpu_dev_of(dev);
    fsdp_gpu_stream_t *s = fsdp_gpu_stream_of(gdev, stream);
    double host = fsdp_gpu_now();
    fsdp_status_t status;
    char what[48];

    snprintf(what, sizeof(what), "stream '%s'", s->super.name);
    status = fsdp_gpu_host_wait(gdev, NULL, s->cu, what);
    if (status == FSDP_OK && fsdp_trace_enabled(dev))
        fsdp_gpu_trace_host(gdev, FSDP_EV_SYNC, "stream_synchronize", s, host, NULL);
    return status;
}

fsdp_status_t fsdp_gpu_event_create(fsdp_dev_t *dev, fsdp_event_t **event_p)
{
    fsdp_gpu_dev_t *gdev = fsdp_gpu_dev_of(dev);
    fsdp_event_t *ev;
    fsdp_status_t status;

    if (event_p == NULL) {
        fsdp_error("rank %d: event_create: event_p is NULL", dev->rank);
        return FSDP_ERR_INVALID_PARAM;
    }
    status = use_device(gdev);
    if (status != FSDP_OK)
        return status;
    ev = calloc(1, sizeof(*ev));
    if (ev == NULL)
        return FSDP_ERR_NO_MEMORY;
    /* synchronization only: an event without timing records and waits faster */
    status = FSDP_CUDA_CALL(cudaEventCreateWithFlags(&ev->cu, cudaEventDisableTiming));
    if (status != FSDP_OK) {
        free(ev);
        return status;
    }
    *event_p = ev;
    return FSDP_OK;
}

void fsdp_gpu_event_destroy(fsdp_dev_t *dev, fsdp_event_t *event)
{
    (void)dev;
    if (event == NULL)
        return;
    (void)FSDP_CUDA_CALL(cudaEventDestroy(event->cu));
    free(event);
}

/* The trace event of an event record or a stream's wait (status: the call's), timed by an event
 * recorded on the stream right after it. */
static fsdp_status_t traced_instant(fsdp_gpu_dev_t *gdev, fsdp_gpu_stream_t *s,
                                    fsdp_event_kind_t kind, const char *name, uint64_t record_id,
                                    fsdp_status_t status)
{
    double host = fsdp_gpu_now();
    fsdp_trace_op_t op = {.kind = kind,
                          .name = name,
                          .stream = s->super.name,
                          .host = host,
                          .start = host,
                          .end = host,
                          .count = record_id,
                          .dtype = -1};

    if (status != FSDP_OK || !fsdp_trace_enabled(&gdev->super))
        return status;
    fsdp_gpu_trace_end(gdev, fsdp_gpu_trace_begin(gdev, s->cu, 1), s->cu, &op);
    return FSDP_OK;
}

fsdp_status_t fsdp_gpu_event_record(fsdp_dev_t *dev, fsdp_event_t *event, fsdp_stream_t *stream)
{
    fsdp_gpu_dev_t *gdev = fsdp_gpu_dev_of(dev);
    fsdp_gpu_stream_t *s = fsdp_gpu_stream_of(gdev, stream);

    if (event == NULL) {
        fsdp_error("rank %d: event_record: event is NULL", dev->rank);
        return FSDP_ERR_INVALID_PARAM;
    }
    event->record_id = ++gdev->records;
    return traced_instant(gdev, s, FSDP_EV_RECORD, "record", event->record_id,
                          FSDP_CUDA_CALL(cudaEventRecord(event->cu, s->cu)));
}

fsdp_status_t fsdp_gpu_stream_wait_event(fsdp_dev_t *dev, fsdp_stream_t *stream,
                                         fsdp_event_t *event)
{
    fsdp_gpu_dev_t *gdev = fsdp_gpu_dev_of(dev);
    fsdp_gpu_stream_t *s = fsdp_gpu_stream_of(gdev, stream);

    if (event == NULL) {
        fsdp_error("rank %d: stream_wait_event: event is NULL", dev->rank);
        return FSDP_ERR_INVALID_PARAM;
    }
    return traced_instant(
        gdev, s, FSDP_EV_WAIT, "wait", event->record_id,
        FSDP_CUDA_CALL(cudaStreamWaitEvent(s->cu, event->cu, cudaEventWaitDefault)));
}

fsdp_status_t fsdp_gpu_event_query(fsdp_dev_t *dev, fsdp_event_t *event, int *done_p)
{
    fsdp_gpu_dev_t *gdev = fsdp_gpu_dev_of(dev);
    fsdp_status_t status;
    cudaError_t err;

    if (event == NULL || done_p == NULL) {
        fsdp_error("rank %d: event_query: %s is NULL", dev->rank,
                   event == NULL ? "event" : "done_p");
        return FSDP_ERR_INVALID_PARAM;
    }
    err = cudaEventQuery(event->cu);
    if (err == cudaSuccess) {
        /* the limiter's poll ends here: what has finished leaves the watchdog's ring */
        if (gdev->ring.count > 0 && gdev->failed == FSDP_OK) {
            status = fsdp_gpu_watch_retire(gdev);
            if (status != FSDP_OK)
                return status;
        }
        *done_p = 1;
        return FSDP_OK;
    }
    status = FSDP_CUDA_CALL(err);
    if (status != FSDP_OK)
        return status;
    /* A caller that polls (the rate limiter) must also learn that a collective hung. */
    if (gdev->ring.count > 0 || gdev->failed != FSDP_OK) {
        status = fsdp_gpu_watchdog(gdev);
        if (status != FSDP_OK)
            return status;
    }
    *done_p = 0;
    return FSDP_OK;
}

fsdp_status_t fsdp_gpu_event_synchronize(fsdp_dev_t *dev, fsdp_event_t *event)
{
    fsdp_status_t status;
    double host;

    if (event == NULL) {
        fsdp_error("rank %d: event_synchronize: event is NULL", dev->rank);
        return FSDP_ERR_INVALID_PARAM;
    }
    host = fsdp_gpu_now();
    status = fsdp_gpu_host_wait(fsdp_gpu_dev_of(dev), event->cu, NULL, "event");
    if (status == FSDP_OK && fsdp_trace_enabled(dev))
        fsdp_gpu_trace_host(fsdp_gpu_dev_of(dev), FSDP_EV_SYNC, "event_synchronize", NULL, host,
                            NULL);
    return status;
}

/* Host memory that is neither pinned nor managed (malloc, the stack). */
static int pageable(const void *ptr)
{
    struct cudaPointerAttributes a;

    if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeUnregistered;
}

fsdp_status_t fsdp_gpu_memcpy_async(fsdp_dev_t *dev, void *dst, const void *src, size_t bytes,
                                    fsdp_stream_t *stream)
{
    fsdp_gpu_dev_t *gdev = fsdp_gpu_dev_of(dev);
    fsdp_gpu_stream_t *s = fsdp_gpu_stream_of(gdev, stream);
    fsdp_trace_op_t op = {.kind = FSDP_EV_COPY, .stream = s->super.name, .bytes = bytes,
                          .count = bytes, .dtype = -1};
    fsdp_gpu_timer_t *timer;
    fsdp_status_t status;

    if (bytes > 0 && (dst == NULL || src == NULL)) {
        fsdp_error("rank %d: memcpy_async of %zu bytes: %s is NULL", dev->rank, bytes,
                   dst == NULL ? "dst" : "src");
        return FSDP_ERR_INVALID_PARAM;
    }
    status = use_device(gdev);
    if (status != FSDP_OK)
        return status;
    /* A copy from or to pageable memory waits on the host for the work before it on the stream
     * (CUDA's API synchronization rules: a stream sync before a pageable H2D, completion before
     * a D2H returns). Behind a collective that never completes it would hang the host, so the
     * stream is polled empty first, within the collective timeout. */
    if (bytes > 0 && dst != src && gdev->ring.count > 0 && (pageable(dst) || pageable(src))) {
        status = fsdp_gpu_host_wait(gdev, NULL, s->cu, "the stream before a pageable copy");
        if (status != FSDP_OK)
            return status;
    }
    op.host = op.start = op.end = fsdp_gpu_now();
    timer = fsdp_gpu_trace_begin(gdev, s->cu, 0);
    /* Unified addressing: the runtime tells host from device by the pointers. A copy onto itself
     * is undefined for cudaMemcpyAsync: none is made, but the op is traced as the sim traces it
     * (with the time of nothing). */
    if (bytes > 0 && dst != src)
        status = FSDP_CUDA_CALL(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s->cu));
    if (status != FSDP_OK) {
        fsdp_gpu_trace_cancel(timer);
        return status;
    }
    if (fsdp_trace_enabled(dev)) {
        op.name = dst != NULL && src != NULL ? fsdp_gpu_copy_name(dst, src) : "h2h";
        fsdp_gpu_trace_end(gdev, timer, s->cu, &op);
    }
    return FSDP_OK;
}
