/* Trace events of the gpu backend: the same events the simulator emits (lib/trace_emit.c), with
 * device times from CUDA events.
 *
 * Each traced op on a stream gets a timer, a pair of timing-enabled events recorded around it
 * (one event for an instant: an event record or a stream's wait). The event is emitted at once,
 * so its sequence number and memory figures are those of its place in the rank's order, with
 * host times standing in for the device's; the trace resolves the timer when it hands the
 * event's chunk to its writer (a full chunk, a step boundary, detach, flush). Resolving waits for
 * the op's end event (polling, bounded by the collective timeout), reads both events against a
 * reference event recorded at init on an idle stream with the host clock beside it, and puts the
 * timer back into the dev's pool. So the device is never synchronized per op: at most once per
 * chunk of events, and at step ends.
 *
 * Absolute device times are a reference's host time plus cudaEventElapsedTime from that
 * reference, a float of milliseconds whose resolution falls as the span grows (0.25 ms an hour
 * from one reference). So the reference is renewed every FSDP_GPU_ANCHOR_S seconds: an op is
 * timed from the newest reference when it was issued, a span of seconds, 0.5 us of resolution
 * at most, as CUDA's events have. A reference stays while timers use it. An op's duration is
 * measured between its own two events. */
#include "config.h"

#include "gpu_trace.h"

#include <stdlib.h>

/* Seconds between two references: float milliseconds of spans below 8.19 s resolve 0.49 us. */
#define FSDP_GPU_ANCHOR_S 4.0

/* A reference event, recorded on the idle internal stream, and the host time beside it. */
struct fsdp_gpu_anchor {
    cudaEvent_t ev;
    double host;
    unsigned users; /* timers that will read it (under timer_lock) */
    struct fsdp_gpu_anchor *next;
};

struct fsdp_gpu_timer {
    fsdp_trace_timing_t super;
    fsdp_gpu_dev_t *gdev;
    fsdp_gpu_anchor_t *anchor; /* the reference of its times */
    cudaEvent_t start, end;
    int instant;                /* only `end` was recorded */
    struct fsdp_gpu_timer *next; /* the free list */
    struct fsdp_gpu_timer *all;  /* every timer of the dev, to free them */
};

/* A new reference on the internal stream, which must be idle so that the event completes
 * almost as it is recorded; the list then drops the old ones no timer reads any more. On the
 * rank's thread. */
static fsdp_status_t anchor_new(fsdp_gpu_dev_t *gdev)
{
    fsdp_gpu_anchor_t *a, **pp;
    fsdp_status_t status;

    a = calloc(1, sizeof(*a));
    if (a == NULL)
        return FSDP_ERR_NO_MEMORY;
    status = FSDP_CUDA_CALL(cudaEventCreateWithFlags(&a->ev, cudaEventDefault));
    if (status != FSDP_OK) {
        free(a);
        return status;
    }
    a->host = fsdp_gpu_now();
    status = FSDP_CUDA_CALL(cudaEventRecord(a->ev, gdev->aux));
    if (status != FSDP_OK) {
        (void)FSDP_CUDA_CALL(cudaEventDestroy(a->ev));
        free(a);
        return status;
    }
    pthread_mutex_lock(&gdev->timer_lock);
    a->next = gdev->anchor;
    gdev->anchor = a;
    for (pp = &a->next; *pp != NULL;) {
        fsdp_gpu_anchor_t *old = *pp;
        if (old->users > 0) {
            pp = &old->next;
            continue;
        }
        *pp = old->next;
        (void)FSDP_CUDA_CALL(cudaEventDestroy(old->ev));
        free(old);
    }
    pthread_mutex_unlock(&gdev->timer_lock);
    return FSDP_OK;
}

fsdp_status_t fsdp_gpu_trace_init(fsdp_gpu_dev_t *gdev)
{
    if (pthread_mutex_init(&gdev->timer_lock, NULL) != 0)
        return FSDP_ERR_NO_MEMORY;
    gdev->timer_lock_init = 1;
    /* aux has only zeroed the barrier word */
    return anchor_new(gdev);
}

void fsdp_gpu_trace_fini(fsdp_gpu_dev_t *gdev)
{
    fsdp_gpu_timer_t *t, *next;

    for (t = gdev->timers_all; t != NULL; t = next) {
        next = t->all;
        (void)FSDP_CUDA_CALL(cudaEventDestroy(t->start));
        (void)FSDP_CUDA_CALL(cudaEventDestroy(t->end));
        free(t);
    }
    gdev->timers_all = gdev->timers_free = NULL;
    while (gdev->anchor != NULL) {
        fsdp_gpu_anchor_t *a = gdev->anchor;
        gdev->anchor = a->next;
        (void)FSDP_CUDA_CALL(cudaEventDestroy(a->ev));
        free(a);
    }
    if (gdev->timer_lock_init)
        pthread_mutex_destroy(&gdev->timer_lock);
    gdev->timer_lock_init = 0;
}

static void timer_put(fsdp_gpu_timer_t *t)
{
    fsdp_gpu_dev_t *gdev = t->gdev;

    pthread_mutex_lock(&gdev->timer_lock);
    if (t->anchor != NULL)
        t->anchor->users--;
    t->anchor = NULL;
    t->next = gdev->timers_free;
    gdev->timers_free = t;
    pthread_mutex_unlock(&gdev->timer_lock);
}

/* Whether resolving has given up waiting, after setting it when `now`. */
static int gave_up(fsdp_gpu_dev_t *gdev, int now)
{
    int v;

    pthread_mutex_lock(&gdev->timer_lock);
    if (now && gdev->trace_gave_up == 0)
        gdev->trace_gave_up = 1;
    v = gdev->trace_gave_up != 0;
    pthread_mutex_unlock(&gdev->timer_lock);
    return v;
}

/* 1 the first time only, once given up: the warning is said once. */
static int first_give_up(fsdp_gpu_dev_t *gdev)
{
    int first;

    pthread_mutex_lock(&gdev->timer_lock);
    first = gdev->trace_gave_up == 1;
    gdev->trace_gave_up = 2;
    pthread_mutex_unlock(&gdev->timer_lock);
    return first;
}

/* Polls until the op's end event is done: 1; 0 when it is not within the collective timeout, or
 * after an earlier one was not (a hung collective: the communicators' failure is the watchdog's
 * to report, on the rank's own thread). Touches no state of the rank but trace_gave_up, so a
 * flush on another thread may call it. */
static int end_done(fsdp_gpu_dev_t *gdev, cudaEvent_t ev)
{
    double t0 = fsdp_gpu_now();
    fsdp_gpu_poll_t poll;
    cudaError_t err;

    fsdp_gpu_poll_begin(&poll, FSDP_GPU_POLL_WAIT);
    for (;;) {
        err = cudaEventQuery(ev);
        if (err == cudaSuccess)
            return 1;
        if (err != cudaErrorNotReady) {
            (void)fsdp_gpu_cuda_status(err, "cudaEventQuery(end)", __FILE__, __LINE__, __func__);
            return 0;
        }
        if (gave_up(gdev, gdev->timeout_s > 0 && fsdp_gpu_now() - t0 > gdev->timeout_s)) {
            if (first_give_up(gdev))
                fsdp_warn("rank %d: a traced op did not finish within %g s: the trace keeps "
                          "host times for the ops not done",
                          gdev->super.rank, gdev->timeout_s);
            return 0;
        }
        fsdp_gpu_pause(&poll);
    }
}

/* Called by the trace, from the rank's thread or a flushing one. */
static void timer_resolve(fsdp_trace_timing_t *timing, double *start_p, double *end_p)
{
    fsdp_gpu_timer_t *t = (fsdp_gpu_timer_t *)timing;
    fsdp_gpu_dev_t *gdev = t->gdev;
    cudaEvent_t start = t->instant ? t->end : t->start;
    float from_ref = 0.0f, span = 0.0f;
    fsdp_status_t status;

    status = end_done(gdev, t->end) ? FSDP_OK : FSDP_ERR_TIMEOUT;
    if (status == FSDP_OK)
        status = FSDP_CUDA_CALL(cudaEventElapsedTime(&from_ref, t->anchor->ev, start));
    if (status == FSDP_OK && !t->instant)
        status = FSDP_CUDA_CALL(cudaEventElapsedTime(&span, t->start, t->end));
    if (status == FSDP_OK) {
        *start_p = t->anchor->host + 1e-3 * (double)from_ref;
        *end_p = *start_p + 1e-3 * (double)span;
    }
    timer_put(t);
}

static fsdp_gpu_timer_t *timer_get(fsdp_gpu_dev_t *gdev)
{
    fsdp_gpu_timer_t *t;

    pthread_mutex_lock(&gdev->timer_lock);
    t = gdev->timers_free;
    if (t != NULL)
        gdev->timers_free = t->next;
    pthread_mutex_unlock(&gdev->timer_lock);
    if (t != NULL)
        return t;
    /* events belong to the current device: make it this rank's (a caller such as event_record
     * has not) */
    if (FSDP_CUDA_CALL(cudaSetDevice(gdev->device)) != FSDP_OK)
        return NULL;
    t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    if (FSDP_CUDA_CALL(cudaEventCreateWithFlags(&t->start, cudaEventDefault)) != FSDP_OK) {
        free(t);
        return NULL;
    }
    if (FSDP_CUDA_CALL(cudaEventCreateWithFlags(&t->end, cudaEventDefault)) != FSDP_OK) {
        (void)FSDP_CUDA_CALL(cudaEventDestroy(t->start));
        free(t);
        return NULL;
    }
    t->super.resolve = timer_resolve;
    t->gdev = gdev;
    pthread_mutex_lock(&gdev->timer_lock);
    t->all = gdev->timers_all;
    gdev->timers_all = t;
    pthread_mutex_unlock(&gdev->timer_lock);
    return t;
}

fsdp_gpu_timer_t *fsdp_gpu_trace_begin(fsdp_gpu_dev_t *gdev, cudaStream_t stream, int instant)
{
    fsdp_gpu_timer_t *t;

    if (!fsdp_trace_enabled(&gdev->super))
        return NULL;
    /* a reference of seconds ago, renewed when the internal stream is idle (it nearly always
     * is: only barriers and splits use it) */
    if (gdev->anchor == NULL || (fsdp_gpu_now() - gdev->anchor->host > FSDP_GPU_ANCHOR_S &&
                                 cudaStreamQuery(gdev->aux) == cudaSuccess))
        (void)anchor_new(gdev);
    if (gdev->anchor == NULL)
        return NULL;
    t = timer_get(gdev);
    if (t == NULL)
        return NULL; /* the event keeps its host times */
    pthread_mutex_lock(&gdev->timer_lock);
    t->anchor = gdev->anchor;
    t->anchor->users++;
    pthread_mutex_unlock(&gdev->timer_lock);
    t->instant = instant;
    if (!instant && FSDP_CUDA_CALL(cudaEventRecord(t->start, stream)) != FSDP_OK) {
        timer_put(t);
        return NULL;
    }
    return t;
}

void fsdp_gpu_trace_cancel(fsdp_gpu_timer_t *timer)
{
    if (timer != NULL)
        timer_put(timer);
}

void fsdp_gpu_trace_end(fsdp_gpu_dev_t *gdev, fsdp_gpu_timer_t *timer, cudaStream_t stream,
                        const fsdp_trace_op_t *op)
{
    if (!fsdp_trace_enabled(&gdev->super)) {
        fsdp_gpu_trace_cancel(timer);
        return;
    }
    if (timer != NULL && FSDP_CUDA_CALL(cudaEventRecord(timer->end, stream)) != FSDP_OK) {
        timer_put(timer);
        timer = NULL;
    }
    fsdp_trace_op(&gdev->super, op, timer != NULL ? &timer->super : NULL);
}

void fsdp_gpu_trace_host(fsdp_gpu_dev_t *gdev, fsdp_event_kind_t kind, const char *name,
                         const fsdp_gpu_stream_t *stream, double host, const char *group)
{
    fsdp_trace_op_t op = {.kind = kind,
                          .name = name,
                          .stream = stream != NULL ? stream->super.name : NULL,
                          .host = host,
                          .start = host,
                          .end = fsdp_gpu_now(),
                          .dtype = -1,
                          .group = group};

    fsdp_trace_op(&gdev->super, &op, NULL);
}

const char *fsdp_gpu_copy_name(const void *dst, const void *src)
{
    struct cudaPointerAttributes a;
    int d = 0, s = 0;

    /* Unregistered host memory is cudaMemoryTypeUnregistered, not an error (CUDA >= 11). */
    if (FSDP_CUDA_CALL(cudaPointerGetAttributes(&a, dst)) == FSDP_OK)
        d = a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
    if (FSDP_CUDA_CALL(cudaPointerGetAttributes(&a, src)) == FSDP_OK)
        s = a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
    if (d && s)
        return "d2d";
    if (d)
        return "h2d";
    return s ? "d2h" : "h2h";
}
