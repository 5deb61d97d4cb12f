/* The sim ops table: segments, streams, events, copies and kernels of one rank, over its clocks
 * and accounting (rank.c); groups and collectives are in coll.c and pg.c.
 *
 * Data mode executes every op eagerly on the calling thread, in issue order, so whatever the
 * streams and events say, memory effects are already ordered; the clocks report when the op
 * would have run. Shape mode touches no memory at all.
 */
#include "sim.h"
#include "sim_kernels.h"

#include <fsdp/log.h>
#include <fsdp/trace.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Data-mode segments are aligned like a cache line (the spec of segment_alloc); shape-mode
 * fake addresses like cudaMalloc's, so the allocator above sees realistic pointers. */
#define SIM_DATA_ALIGN 64
#define SIM_SHAPE_ALIGN 512
/* Data-mode segments of this size and more are mapped from the kernel. */
#define SIM_MMAP_MIN ((size_t)1 << 20)

/* ---- errors ---------------------------------------------------------------------------- */

const char *fsdp_sim_last_error(fsdp_dev_t *dev)
{
    fsdp_sim_dev_t *sdev = fsdp_sim_dev(dev);

    if (sdev == NULL || sdev->last_error == NULL)
        return "";
    return sdev->last_error;
}

/* ---- clocks ---------------------------------------------------------------------------- */

static double sim_host_time(fsdp_dev_t *dev)
{
    return ((fsdp_sim_dev_t *)dev)->host_clock;
}

/* ---- segments -------------------------------------------------------------------------- */

static fsdp_status_t seg_insert(fsdp_sim_dev_t *dev, void *ptr, size_t size, fsdp_memkind_t kind)
{
    uintptr_t base = (uintptr_t)ptr;
    size_t i;

    if (dev->n_segs == dev->cap_segs) {
        size_t cap = dev->cap_segs ? dev->cap_segs * 2 : 64;
        fsdp_sim_segment_t *v = realloc(dev->segs, cap * sizeof(*v));
        if (v == NULL)
            return FSDP_ERR_NO_MEMORY;
        dev->segs = v;
        dev->cap_segs = cap;
    }
    i = fsdp_sim_seg_search(dev, base);
    memmove(&dev->segs[i + 1], &dev->segs[i], (dev->n_segs - i) * sizeof(*dev->segs));
    dev->segs[i].base = base;
    dev->segs[i].end = base + size;
    dev->segs[i].kind = kind;
    dev->n_segs++;
    return FSDP_OK;
}

/* Forgets the segment at ptr; returns its size (0 if unknown). */
static size_t seg_remove(fsdp_sim_dev_t *dev, void *ptr)
{
    size_t i = fsdp_sim_seg_search(dev, (uintptr_t)ptr), size;

    if (i == 0 || dev->segs[i - 1].base != (uintptr_t)ptr)
        return 0;
    i--;
    size = dev->segs[i].end - dev->segs[i].base;
    memmove(&dev->segs[i], &dev->segs[i + 1], (dev->n_segs - i - 1) * sizeof(*dev->segs));
    dev->n_segs--;
    return size;
}

/* Data mode: counts size more bytes of the world's segments against params.host_memory; 0
 * (nothing counted, *held_p what the world held) when they would pass it, even once the rank's
 * packed GEMM operand, which only saves time, is freed. */
static int host_reserve(fsdp_sim_dev_t *sdev, size_t size, size_t *held_p)
{
    fsdp_sim_world_t *w = sdev->world;

    if (fsdp_sim_host_reserve(&w->host_held, w->params.host_memory, size, held_p))
        return 1;
    if (sdev->pack_cache.packed == NULL)
        return 0;
    fsdp_sim_pack_cache_drop(&sdev->pack_cache);
    return fsdp_sim_host_reserve(&w->host_held, w->params.host_memory, size, held_p);
}

static void host_release(fsdp_sim_dev_t *sdev, size_t size)
{
    fsdp_sim_host_release(&sdev->world->host_held, size);
}

static fsdp_status_t sim_segment_alloc(fsdp_dev_t *dev, fsdp_memkind_t kind, size_t bytes,
                                       void **ptr_p)
{
    fsdp_sim_dev_t *sdev = (fsdp_sim_dev_t *)dev;
    size_t align = fsdp_sim_is_shape(sdev) ? SIM_SHAPE_ALIGN : SIM_DATA_ALIGN;
    size_t size, held;
    void *ptr;

    if (ptr_p == NULL || (kind != FSDP_MEMKIND_DEVICE && kind != FSDP_MEMKIND_HOST_PINNED))
        return fsdp_sim_errorf(sdev, FSDP_ERR_INVALID_PARAM,
                               "segment_alloc: kind %d (device 0 or host_pinned 1) and a "
                               "non-NULL ptr_p are required", (int)kind);
    /* Zero bytes still get a unique address, so every segment can be told apart. */
    if (bytes > SIZE_MAX - align) {
        fsdp_debug("rank %d: segment_alloc of %zu bytes is too large", dev->rank, bytes);
        return FSDP_ERR_OUT_OF_MEMORY;
    }
    size = (bytes + align - 1) / align * align;
    if (size == 0)
        size = align;

    if (fsdp_sim_is_shape(sdev)) {
        /* Fake addresses are never dereferenced; each segment gets its own range (plus a gap)
         * in this rank's slice of the address space, so pointer arithmetic inside a segment
         * never reaches another one. */
        if (size > sdev->shape_end - sdev->shape_next ||
            sdev->shape_end - sdev->shape_next - size < SIM_SHAPE_ALIGN) {
            fsdp_debug("rank %d: shape-mode address space exhausted allocating %zu bytes",
                       dev->rank, bytes);
            return FSDP_ERR_OUT_OF_MEMORY;
        }
        if (seg_insert(sdev, (void *)sdev->shape_next, size, kind) != FSDP_OK)
            return FSDP_ERR_NO_MEMORY;
        *ptr_p = (void *)sdev->shape_next;
        sdev->shape_next += size + SIM_SHAPE_ALIGN;
        return FSDP_OK;
    }

    /* every rank's segments are this machine's memory: past the world's bound, an error
     * before any page is touched, not the kernel's out-of-memory kill halfway through */
    if (!host_reserve(sdev, size, &held)) {
        return fsdp_sim_errorf(
            sdev, FSDP_ERR_NO_MEMORY,
            "data mode holds every simulated rank's memory in this machine's: %zu more bytes "
            "would take the world's %zu past the %zu it may use (host_memory, fsdp-train "
            "--host-memory; default 90%% of the memory available at launch). Plan a job this "
            "large in shape mode (fsdp-plan), or run fewer ranks or a smaller model",
            size, held, sdev->world->params.host_memory);
    }
    /* Out of memory is a normal answer here (the caching allocator frees its cache and
     * retries), so it is reported at debug level only. Segments start zeroed, so that nothing
     * depends on what memory held before: large ones come zeroed from the kernel, page by page
     * as they are touched (W simulated ranks hold W unsharded copies: no extra pass over
     * them); small ones are cleared here. */
    if (size >= SIM_MMAP_MIN) {
        ptr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (ptr == MAP_FAILED)
            ptr = NULL;
    } else {
        ptr = aligned_alloc(align, size);
        if (ptr != NULL)
            memset(ptr, 0, size);
    }
    if (ptr == NULL) {
        host_release(sdev, size);
        fsdp_debug("rank %d: segment_alloc of %zu bytes failed", dev->rank, bytes);
        return FSDP_ERR_OUT_OF_MEMORY;
    }
    if (seg_insert(sdev, ptr, size, kind) != FSDP_OK) {
        host_release(sdev, size);
        if (size >= SIM_MMAP_MIN)
            munmap(ptr, size);
        else
            free(ptr);
        return FSDP_ERR_NO_MEMORY;
    }
    *ptr_p = ptr;
    return FSDP_OK;
}

static void sim_segment_free(fsdp_dev_t *dev, fsdp_memkind_t kind, void *ptr)
{
    fsdp_sim_dev_t *sdev = (fsdp_sim_dev_t *)dev;
    size_t size;

    (void)kind;
    if (ptr == NULL)
        return;
    size = seg_remove(sdev, ptr);
    if (fsdp_sim_is_shape(sdev))
        return;
    host_release(sdev, size);
    if (size >= SIM_MMAP_MIN)
        munmap(ptr, size);
    else
        free(ptr);
}

/* ---- streams --------------------------------------------------------------------------- */

static fsdp_stream_t *sim_compute_stream(fsdp_dev_t *dev)
{
    return &((fsdp_sim_dev_t *)dev)->compute.super;
}

static fsdp_status_t sim_stream_create(fsdp_dev_t *dev, const char *name, int priority,
                                       fsdp_stream_t **stream_p)
{
    fsdp_sim_dev_t *sdev = (fsdp_sim_dev_t *)dev;
    fsdp_sim_stream_t *s = NULL;

    if (stream_p == NULL)
        return fsdp_sim_errorf(sdev, FSDP_ERR_INVALID_PARAM, "stream_create: stream_p is NULL");
    s = calloc(1, sizeof(*s));
    if (s == NULL)
        return fsdp_sim_errorf(sdev, FSDP_ERR_NO_MEMORY, "stream_create: out of host memory");
    s->dev = sdev;
    s->super.id = sdev->next_stream_id++;
    s->super.priority = priority;
    if (name != NULL)
        snprintf(s->super.name, sizeof(s->super.name), "%s", name);
    else
        snprintf(s->super.name, sizeof(s->super.name), "stream%d", s->super.id);
    /* A new stream has no work: it is ready from the host's present on. */
    s->clock = sdev->host_clock;
    s->next = sdev->streams;
    sdev->streams = s;
    *stream_p = &s->super;
    return FSDP_OK;
}

static void sim_stream_destroy(fsdp_dev_t *dev, fsdp_stream_t *stream)
{
    fsdp_sim_dev_t *sdev = (fsdp_sim_dev_t *)dev;
    fsdp_sim_stream_t *s = (fsdp_sim_stream_t *)stream;

    if (s == NULL || s == &sdev->compute || s->dev != sdev)
        return;
    for (fsdp_sim_stream_t **pp = &sdev->streams; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    }
    free(s);
}

static fsdp_status_t sim_stream_synchronize(fsdp_dev_t *dev, fsdp_stream_t *stream)
{
    fsdp_sim_dev_t *sdev = (fsdp_sim_dev_t *)dev;
    fsdp_sim_stream_t *s = NULL;
    fsdp_status_t status;
    double host;

    status = fsdp_sim_stream_get(sdev, stream, &s);
    if (status != FSDP_OK)
        return status;
    host = sdev->host_clock;
    sdev->host_clock = fsdp_sim_max2(sdev->host_clock, s->clock);
    if (fsdp_trace_enabled(dev))
        fsdp_sim_trace_op(sdev, FSDP_EV_SYNC, "stream_synchronize", s, host, host,
                          sdev->host_clock, 0.0, 0, -1, NULL);
    return FSDP_OK;
}

/* ---- events ---------------------------------------------------------------------------- */

static fsdp_status_t sim_event_get(fsdp_sim_dev_t *dev, fsdp_event_t *event,
                                   fsdp_sim_event_t **event_p)
{
    fsdp_sim_event_t *ev = (fsdp_sim_event_t *)event;

    if (ev == NULL || ev->dev != dev)
        return fsdp_sim_errorf(dev, FSDP_ERR_INVALID_PARAM,
                               "event %s; pass an event this rank created",
                               ev == NULL ? "is NULL" : "belongs to another rank");
    *event_p = ev;
    return FSDP_OK;
}

static fsdp_status_t sim_event_create(fsdp_dev_t *dev, fsdp_event_t **event_p)
{
    fsdp_sim_dev_t *sdev = (fsdp_sim_dev_t *)dev;
    fsdp_sim_event_t *ev = NULL;

    if (event_p == NULL)
        return fsdp_sim_errorf(sdev, FSDP_ERR_INVALID_PARAM, "event_create: event_p is NULL");
    ev = calloc(1, sizeof(*ev));
    if (ev == NULL)
        return fsdp_sim_errorf(sdev, FSDP_ERR_NO_MEMORY, "event_create: out of host memory");
    ev->dev = sdev;
    *event_p = (fsdp_event_t *)ev;
    return FSDP_OK;
}

static void sim_event_destroy(fsdp_dev_t *dev, fsdp_event_t *event)
{
    fsdp_sim_event_t *ev = (fsdp_sim_event_t *)event;

    if (ev != NULL && ev->dev == (fsdp_sim_dev_t *)dev)
        free(ev);
}

static fsdp_status_t sim_event_record(fsdp_dev_t *dev, fsdp_event_t *event,
                                      fsdp_stream_t *stream)
{
    fsdp_sim_dev_t *sdev = (fsdp_sim_dev_t *)dev;
    fsdp_sim_event_t *ev = NULL;
    fsdp_sim_stream_t *s = NULL;
    fsdp_status_t status;

    status = sim_event_get(sdev, event, &ev);
    if (status != FSDP_OK)
        return status;
    status = fsdp_sim_stream_get(sdev, stream, &s);
    if (status != FSDP_OK)
        return status;
    /* The event completes when the stream has done the work issued before it, or at once on
     * an idle stream; it does not hold the stream up. */
    ev->time = fsdp_sim_max2(s->clock, sdev->host_clock);
    ev->recorded = 1;
    ev->record_id = ++sdev->records;
    if (fsdp_trace_enabled(dev))
        fsdp_sim_trace_op(sdev, FSDP_EV_RECORD, "record", s, sdev->host_clock, ev->time, ev->time,
                          0.0, ev->record_id, -1, NULL);
    sdev->host_clock += sdev->profile->host.event_overhead_s;
    return FSDP_OK;
}

static fsdp_status_t sim_stream_wait_event(fsdp_dev_t *dev, fsdp_stream_t *stream,
                                           fsdp_event_t *event)
{
    fsdp_sim_dev_t *sdev = (fsdp_sim_dev_t *)dev;
    fsdp_sim_event_t *ev = NULL;
    fsdp_sim_stream_t *s = NULL;
    fsdp_status_t status;

    status = sim_event_get(sdev, event, &ev);
    if (status != FSDP_OK)
        return status;
    status = fsdp_sim_stream_get(sdev, stream, &s);
    if (status != FSDP_OK)
        return status;
    /* Folding the event into the stream clock makes every later op on the stream start after
     * it. An event never recorded is complete, as in CUDA. */
    if (ev->recorded)
        s->clock = fsdp_sim_max2(s->clock, ev->time);
    if (fsdp_trace_enabled(dev))
        fsdp_sim_trace_op(sdev, FSDP_EV_WAIT, "wait", s, sdev->host_clock, s->clock, s->clock, 0.0,
                          ev->recorded ? ev->record_id : 0, -1, NULL);
    sdev->host_clock += sdev->profile->host.event_overhead_s;
    return FSDP_OK;
}

static fsdp_status_t sim_event_query(fsdp_dev_t *dev, fsdp_event_t *event, int *done_p)
{
    fsdp_sim_dev_t *sdev = (fsdp_sim_dev_t *)dev;
    fsdp_sim_event_t *ev = NULL;
    fsdp_status_t status;

    status = sim_event_get(sdev, event, &ev);
    if (status != FSDP_OK)
        return status;
    if (done_p == NULL)
        return fsdp_sim_errorf(sdev, FSDP_ERR_INVALID_PARAM, "event_query: done_p is NULL");
    *done_p = !ev->recorded || ev->time <= sdev->host_clock;
    return FSDP_OK;
}

static fsdp_status_t sim_event_synchronize(fsdp_dev_t *dev, fsdp_event_t *event)
{
    fsdp_sim_dev_t *sdev = (fsdp_sim_dev_t *)dev;
    fsdp_sim_event_t *ev = NULL;
    fsdp_status_t status;
    double host;

    status = sim_event_get(sdev, event, &ev);
    if (status != FSDP_OK)
        return status;
    /* The host jumps to the event's time: how CPU run-ahead is bounded. */
    host = sdev->host_clock;
    if (ev->recorded)
        sdev->host_clock = fsdp_sim_max2(sdev->host_clock, ev->time);
    if (fsdp_trace_enabled(dev))
        fsdp_sim_trace_op(sdev, FSDP_EV_SYNC, "event_synchronize", NULL, host, host,
                          sdev->host_clock, 0.0, 0, -1, NULL);
    return FSDP_OK;
}

/* ---- copies and kernels ---------------------------------------------------------------- */

static fsdp_status_t sim_memcpy_async(fsdp_dev_t *dev, void *dst, const void *src, size_t bytes,
                                      fsdp_stream_t *stream)
{
    fsdp_sim_dev_t *sdev = (fsdp_sim_dev_t *)dev;
    fsdp_sim_op_t op = {.kind = FSDP_SIM_OP_MEMCPY, .dst = dst, .src = src, .bytes = bytes};
    fsdp_sim_stream_t *s = NULL;
    fsdp_status_t status;

    status = fsdp_sim_stream_get(sdev, stream, &s);
    if (status != FSDP_OK)
        return status;
    /* shape mode moves no data: host buffers may be absent */
    if (bytes > 0 && (dst == NULL || src == NULL) && !fsdp_sim_is_shape(sdev))
        return fsdp_sim_errorf(sdev, FSDP_ERR_INVALID_PARAM,
                               "memcpy_async of %zu bytes with a NULL %s", bytes,
                               dst == NULL ? "destination" : "source");
    if (!fsdp_sim_is_shape(sdev) && bytes > 0 && dst != src)
        memmove(dst, src, bytes);
    return fsdp_sim_stream_issue(sdev, s, &op);
}

static fsdp_status_t sim_kernel(fsdp_dev_t *dev, fsdp_stream_t *stream, const fsdp_kernel_t *k)
{
    fsdp_sim_dev_t *sdev = (fsdp_sim_dev_t *)dev;
    fsdp_sim_op_t op = {.kind = FSDP_SIM_OP_KERNEL, .kernel = k};
    fsdp_sim_stream_t *s = NULL;
    fsdp_status_t status;

    status = fsdp_sim_stream_get(sdev, stream, &s);
    if (status != FSDP_OK)
        return status;
    if (k == NULL)
        return fsdp_sim_errorf(sdev, FSDP_ERR_INVALID_PARAM, "kernel: descriptor is NULL");
    if (!fsdp_sim_is_shape(sdev)) {
        /* The rank's workers start with its first kernel worth splitting. */
        if (sdev->pool == NULL && sdev->threads > 1 && fsdp_sim_kernel_wants_pool(k)) {
            sdev->pool = fsdp_sim_pool_create(sdev->threads);
            if (sdev->pool == NULL || fsdp_sim_pool_threads(sdev->pool) < sdev->threads)
                fsdp_info("rank %d: running kernels on %d thread%s of %d", dev->rank,
                          fsdp_sim_pool_threads(sdev->pool),
                          fsdp_sim_pool_threads(sdev->pool) == 1 ? "" : "s", sdev->threads);
            if (sdev->pool == NULL)
                sdev->threads = 1; /* do not try again */
        }
        /* The executor logs its own errors; the rank only remembers the failure. */
        status = fsdp_sim_kernel_exec_par(k, sdev->pool, &sdev->pack_cache);
        if (status != FSDP_OK) {
            char msg[160];
            snprintf(msg, sizeof(msg), "rank %d: kernel %s failed: %s", dev->rank,
                     fsdp_kernel_name(k->kind), fsdp_status_string(status));
            fsdp_sim_set_error(sdev, msg);
            return status;
        }
    }
    return fsdp_sim_stream_issue(sdev, s, &op);
}

/* ---- virtual time queries ---------------------------------------------------------------- */

double fsdp_sim_stream_time(fsdp_dev_t *dev, fsdp_stream_t *stream)
{
    fsdp_sim_dev_t *sdev = fsdp_sim_dev(dev);
    fsdp_sim_stream_t *s = NULL;

    if (sdev == NULL || fsdp_sim_stream_get(sdev, stream, &s) != FSDP_OK)
        return 0.0;
    return s->clock;
}

double fsdp_sim_device_time(fsdp_dev_t *dev)
{
    fsdp_sim_dev_t *sdev = fsdp_sim_dev(dev);
    double t;

    if (sdev == NULL)
        return 0.0;
    t = fsdp_sim_max2(sdev->host_clock, sdev->compute.clock);
    for (const fsdp_sim_stream_t *s = sdev->streams; s != NULL; s = s->next)
        t = fsdp_sim_max2(t, s->clock);
    return t;
}

const fsdp_sim_profile_t *fsdp_sim_rank_profile(fsdp_dev_t *dev)
{
    fsdp_sim_dev_t *sdev = fsdp_sim_dev(dev);

    return sdev != NULL ? sdev->profile : NULL;
}

void fsdp_sim_pack_cache_stats(fsdp_dev_t *dev, uint64_t *hits_p, uint64_t *packs_p)
{
    fsdp_sim_dev_t *sdev = fsdp_sim_dev(dev);

    if (hits_p != NULL)
        *hits_p = sdev != NULL ? sdev->pack_cache.hits : 0;
    if (packs_p != NULL)
        *packs_p = sdev != NULL ? sdev->pack_cache.packs : 0;
}

fsdp_status_t fsdp_sim_time_stats(fsdp_dev_t *dev, fsdp_sim_time_stats_t *stats_p)
{
    fsdp_sim_dev_t *sdev = fsdp_sim_dev(dev);
    fsdp_sim_time_stats_t st;

    if (sdev == NULL || stats_p == NULL) {
        fsdp_error("fsdp_sim_time_stats: needs a rank of the sim backend and stats_p");
        return FSDP_ERR_INVALID_PARAM;
    }
    st = sdev->acct;
    st.host_time = sdev->host_clock;
    st.device_time = fsdp_sim_device_time(dev);
    fsdp_sim_acct_spans(sdev, &st);
    *stats_p = st;
    return FSDP_OK;
}

void fsdp_sim_time_reset(fsdp_dev_t *dev)
{
    fsdp_sim_dev_t *sdev = fsdp_sim_dev(dev);

    if (sdev == NULL)
        return;
    memset(&sdev->acct, 0, sizeof(sdev->acct));
    sdev->compute_spans.n = 0;
    sdev->comm_spans.n = 0;
    sdev->acct_oom = 0;
}

/* ---- the table ------------------------------------------------------------------------- */

static const fsdp_backend_ops_t sim_ops = {
    .size = sizeof(fsdp_backend_ops_t),
    .name = "sim",
    .segment_alloc = sim_segment_alloc,
    .segment_free = sim_segment_free,
    .compute_stream = sim_compute_stream,
    .stream_create = sim_stream_create,
    .stream_destroy = sim_stream_destroy,
    .stream_synchronize = sim_stream_synchronize,
    .event_create = sim_event_create,
    .event_destroy = sim_event_destroy,
    .event_record = sim_event_record,
    .stream_wait_event = sim_stream_wait_event,
    .event_query = sim_event_query,
    .event_synchronize = sim_event_synchronize,
    .host_time = sim_host_time,
    .memcpy_async = sim_memcpy_async,
    .group_world = fsdp_sim_group_world,
    .group_split = fsdp_sim_group_split,
    .group_destroy = fsdp_sim_group_destroy,
    .all_gather = fsdp_sim_all_gather,
    .reduce_scatter = fsdp_sim_reduce_scatter,
    .all_reduce = fsdp_sim_all_reduce,
    .broadcast = fsdp_sim_broadcast,
    .barrier = fsdp_sim_barrier,
    .kernel = sim_kernel,
};

const fsdp_backend_ops_t *fsdp_sim_backend(void)
{
    return &sim_ops;
}

int fsdp_dev_is_sim(const fsdp_dev_t *dev)
{
    return dev != NULL && dev->ops == &sim_ops;
}
