/* libfsdp for backends: the table a backend fills in.
 *
 * The core and programs drive a device only through this ops table, by the fsdp_dev_* calls of
 * <fsdp/backend.h>, which check the arguments every backend would check (a collective's group,
 * dtype, reduce op, root and buffers) before they call a slot: a slot may take them as checked.
 * A backend (sim/, gpu/) fills in every slot; an operation it cannot do points to a function
 * that returns FSDP_ERR_UNSUPPORTED, never NULL.
 *
 * Ordering model (as CUDA's): work on one stream runs in issue order; an event records the
 * point a stream has reached; stream_wait_event makes later work on a stream wait for it.
 * Collectives are enqueued on a stream and match across the ranks of a group by call order.
 */
#ifndef FSDP_BACKEND_OPS_H
#define FSDP_BACKEND_OPS_H

#include <fsdp/api.h>

#include <fsdp/device.h>
#include <fsdp/kernel.h>
#include <fsdp/status.h>
#include <fsdp/types.h>

#ifdef __cplusplus
extern "C" {
#endif

struct fsdp_backend_ops {
    size_t size; /* sizeof(fsdp_backend_ops_t) the backend was built with */
    const char *name;

    /* Raw segments. Returns FSDP_ERR_OUT_OF_MEMORY when the device cannot provide them. */
    fsdp_status_t (*segment_alloc)(fsdp_dev_t *dev, fsdp_memkind_t kind, size_t bytes,
                                   void **ptr_p);
    void (*segment_free)(fsdp_dev_t *dev, fsdp_memkind_t kind, void *ptr);

    /* Streams. The compute stream exists from the start; others are created by the core. */
    fsdp_stream_t *(*compute_stream)(fsdp_dev_t *dev);
    fsdp_status_t (*stream_create)(fsdp_dev_t *dev, const char *name, int priority,
                                   fsdp_stream_t **stream_p);
    void (*stream_destroy)(fsdp_dev_t *dev, fsdp_stream_t *stream);
    fsdp_status_t (*stream_synchronize)(fsdp_dev_t *dev, fsdp_stream_t *stream);

    /* Events. */
    fsdp_status_t (*event_create)(fsdp_dev_t *dev, fsdp_event_t **event_p);
    void (*event_destroy)(fsdp_dev_t *dev, fsdp_event_t *event);
    fsdp_status_t (*event_record)(fsdp_dev_t *dev, fsdp_event_t *event, fsdp_stream_t *stream);
    fsdp_status_t (*stream_wait_event)(fsdp_dev_t *dev, fsdp_stream_t *stream, fsdp_event_t *event);
    /* *done_p = 1 when all work before the record has finished. */
    fsdp_status_t (*event_query)(fsdp_dev_t *dev, fsdp_event_t *event, int *done_p);
    /* The host waits for the event. */
    fsdp_status_t (*event_synchronize)(fsdp_dev_t *dev, fsdp_event_t *event);
    /* Host clock of this rank, seconds (sim: virtual). */
    double (*host_time)(fsdp_dev_t *dev);

    /* Copies between any two buffers (device or host), ordered on the stream. */
    fsdp_status_t (*memcpy_async)(fsdp_dev_t *dev, void *dst, const void *src, size_t bytes,
                                  fsdp_stream_t *stream);

    /* Groups. The world group is owned by the backend. */
    fsdp_group_t *(*group_world)(fsdp_dev_t *dev);
    /* Collective over `parent`: ranks with the same color form a group, ordered by (key, rank).
     * A negative color gives *group_p = NULL. */
    fsdp_status_t (*group_split)(fsdp_dev_t *dev, fsdp_group_t *parent, int color, int key,
                                 fsdp_group_t **group_p);
    void (*group_destroy)(fsdp_dev_t *dev, fsdp_group_t *group);

    /* Collectives. `count` arguments are element counts.
     * all_gather: recv[r*count .. (r+1)*count) = send of group rank r.
     * reduce_scatter: recv (count) = reduction over ranks of send[rank*count ..).
     * all_reduce: recv (count) = reduction over ranks of send; send may equal recv.
     * broadcast: buf of `root` (a group rank) copied to every rank.
     * Floating-point sums accumulate in f32 in group-rank order and round once (the sim; NCCL
     * rounds 16-bit sums at every step of its own order: DESIGN.md, "Where the code differs"). */
    fsdp_status_t (*all_gather)(fsdp_dev_t *dev, fsdp_group_t *group, const void *send, void *recv,
                                size_t count, fsdp_dtype_t dtype, fsdp_stream_t *stream);
    fsdp_status_t (*reduce_scatter)(fsdp_dev_t *dev, fsdp_group_t *group, const void *send,
                                    void *recv, size_t count, fsdp_dtype_t dtype,
                                    fsdp_reduce_op_t op, fsdp_stream_t *stream);
    fsdp_status_t (*all_reduce)(fsdp_dev_t *dev, fsdp_group_t *group, const void *send, void *recv,
                                size_t count, fsdp_dtype_t dtype, fsdp_reduce_op_t op,
                                fsdp_stream_t *stream);
    fsdp_status_t (*broadcast)(fsdp_dev_t *dev, fsdp_group_t *group, void *buf, size_t count,
                               fsdp_dtype_t dtype, int root, fsdp_stream_t *stream);
    /* Host-blocking barrier over the group. */
    fsdp_status_t (*barrier)(fsdp_dev_t *dev, fsdp_group_t *group);

    /* Kernels (kernel.h), enqueued on the stream. */
    fsdp_status_t (*kernel)(fsdp_dev_t *dev, fsdp_stream_t *stream, const fsdp_kernel_t *k);
};

/* Every function slot of fsdp_backend_ops_t, in order: X(slot) for each. fsdp_backend_check
 * walks this list, and a static assertion there fails the build when the struct has a slot the
 * list lacks. */
#define FSDP_BACKEND_SLOTS(X)                                                                      \
    X(segment_alloc)                                                                               \
    X(segment_free)                                                                                \
    X(compute_stream)                                                                              \
    X(stream_create)                                                                               \
    X(stream_destroy)                                                                              \
    X(stream_synchronize)                                                                          \
    X(event_create)                                                                                \
    X(event_destroy)                                                                               \
    X(event_record)                                                                                \
    X(stream_wait_event)                                                                           \
    X(event_query)                                                                                 \
    X(event_synchronize)                                                                           \
    X(host_time)                                                                                   \
    X(memcpy_async)                                                                                \
    X(group_world)                                                                                 \
    X(group_split)                                                                                 \
    X(group_destroy)                                                                               \
    X(all_gather)                                                                                  \
    X(reduce_scatter)                                                                              \
    X(all_reduce)                                                                                  \
    X(broadcast)                                                                                   \
    X(barrier)                                                                                     \
    X(kernel)

/* Checks that an ops table is complete (size matches, no NULL slot). */
FSDP_API fsdp_status_t fsdp_backend_check(const fsdp_backend_ops_t *ops);

/* The name of the group that members of color `color` get from the `round`-th group_split of
 * the group named `parent` (rounds count from 1, per parent group, over every split call its
 * members make: each member makes the same calls in the same order, so all agree):
 * "<parent>/split(<color>)" for round 1, "<parent>/split<round>(<color>)" after. A name longer
 * than a group's name field is replaced by "g:" and 16 hex digits of a 64-bit FNV-1a hash of
 * it. Distinct groups of a run thus get distinct names (unless two long names collide in 64
 * bits), and the same run gives the same names. Every backend names its splits with it. */
FSDP_API void fsdp_group_split_name(char name[FSDP_GROUP_NAME_SIZE], const char *parent,
                                    unsigned round, int color);

#ifdef __cplusplus
}
#endif
#endif
