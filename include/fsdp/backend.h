/* libfsdp: driving a device.
 *
 * The calls a program, a model and the core make on a rank's device (<fsdp/device.h>): memory
 * segments, streams, events, copies, groups, collectives and kernels. Each fsdp_dev_* call is
 * one slot of the backend's ops table (<fsdp/backend/ops.h>, which says what each does), called
 * through an inline wrapper, as libfabric's fi_* calls are; the collectives check their
 * arguments first, once for every backend (fsdp_dev_coll_check). Nobody but a backend
 * forwarding to another one calls dev->ops directly.
 */
#ifndef FSDP_BACKEND_H
#define FSDP_BACKEND_H

#include <fsdp/api.h>

#include <fsdp/backend/ops.h>
#include <fsdp/device.h>
#include <fsdp/kernel.h>
#include <fsdp/status.h>
#include <fsdp/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- memory ---- */

static inline fsdp_status_t fsdp_dev_segment_alloc(fsdp_dev_t *dev, fsdp_memkind_t kind,
                                                   size_t bytes, void **ptr_p)
{
    return dev->ops->segment_alloc(dev, kind, bytes, ptr_p);
}

static inline void fsdp_dev_segment_free(fsdp_dev_t *dev, fsdp_memkind_t kind, void *ptr)
{
    dev->ops->segment_free(dev, kind, ptr);
}

/* ---- streams, events, the host clock ---- */

static inline fsdp_stream_t *fsdp_dev_compute_stream(fsdp_dev_t *dev)
{
    return dev->ops->compute_stream(dev);
}

static inline fsdp_status_t fsdp_dev_stream_create(fsdp_dev_t *dev, const char *name, int priority,
                                                   fsdp_stream_t **stream_p)
{
    return dev->ops->stream_create(dev, name, priority, stream_p);
}

static inline void fsdp_dev_stream_destroy(fsdp_dev_t *dev, fsdp_stream_t *stream)
{
    dev->ops->stream_destroy(dev, stream);
}

static inline fsdp_status_t fsdp_dev_stream_synchronize(fsdp_dev_t *dev, fsdp_stream_t *stream)
{
    return dev->ops->stream_synchronize(dev, stream);
}

static inline fsdp_status_t fsdp_dev_event_create(fsdp_dev_t *dev, fsdp_event_t **event_p)
{
    return dev->ops->event_create(dev, event_p);
}

static inline void fsdp_dev_event_destroy(fsdp_dev_t *dev, fsdp_event_t *event)
{
    dev->ops->event_destroy(dev, event);
}

static inline fsdp_status_t fsdp_dev_event_record(fsdp_dev_t *dev, fsdp_event_t *event,
                                                  fsdp_stream_t *stream)
{
    return dev->ops->event_record(dev, event, stream);
}

static inline fsdp_status_t fsdp_dev_stream_wait_event(fsdp_dev_t *dev, fsdp_stream_t *stream,
                                                       fsdp_event_t *event)
{
    return dev->ops->stream_wait_event(dev, stream, event);
}

static inline fsdp_status_t fsdp_dev_event_query(fsdp_dev_t *dev, fsdp_event_t *event, int *done_p)
{
    return dev->ops->event_query(dev, event, done_p);
}

static inline fsdp_status_t fsdp_dev_event_synchronize(fsdp_dev_t *dev, fsdp_event_t *event)
{
    return dev->ops->event_synchronize(dev, event);
}

static inline double fsdp_dev_host_time(fsdp_dev_t *dev)
{
    return dev->ops->host_time(dev);
}

/* Convenience: X.wait_stream(Y) as PyTorch spells it, through a temporary event. */
FSDP_API fsdp_status_t fsdp_stream_wait_stream(fsdp_dev_t *dev, fsdp_stream_t *waiter,
                                               fsdp_stream_t *waitee);

/* ---- copies and kernels ---- */

static inline fsdp_status_t fsdp_dev_memcpy_async(fsdp_dev_t *dev, void *dst, const void *src,
                                                  size_t bytes, fsdp_stream_t *stream)
{
    return dev->ops->memcpy_async(dev, dst, src, bytes, stream);
}

static inline fsdp_status_t fsdp_dev_kernel(fsdp_dev_t *dev, fsdp_stream_t *stream,
                                            const fsdp_kernel_t *k)
{
    return dev->ops->kernel(dev, stream, k);
}

/* ---- groups and collectives ---- */

typedef enum {
    FSDP_COLL_ALL_GATHER,
    FSDP_COLL_REDUCE_SCATTER,
    FSDP_COLL_ALL_REDUCE,
    FSDP_COLL_BROADCAST,
    FSDP_COLL_BARRIER,
    FSDP_COLL_GROUP_SPLIT
} fsdp_coll_kind_t;

/* What every backend would check of a collective's arguments, checked once before its slot is
 * called: a group (a split's parent), and for the data collectives a dtype of types.h, a reduce
 * op of fsdp_reduce_op_t (avg for floating-point dtypes only), a broadcast root among the group
 * ranks, a count whose largest buffer has a size, and no NULL buffer when count > 0 and the
 * device holds data. null_buf: a buffer is NULL (for a split: its group_p, refused whatever
 * the count). Logs what was wrong and returns FSDP_ERR_INVALID_PARAM, or FSDP_OK. */
FSDP_API fsdp_status_t fsdp_dev_coll_check(const fsdp_dev_t *dev, fsdp_coll_kind_t kind,
                                           const fsdp_group_t *group, int null_buf, size_t count,
                                           fsdp_dtype_t dtype, fsdp_reduce_op_t op, int root);

static inline fsdp_group_t *fsdp_dev_group_world(fsdp_dev_t *dev)
{
    return dev->ops->group_world(dev);
}

static inline fsdp_status_t fsdp_dev_group_split(fsdp_dev_t *dev, fsdp_group_t *parent, int color,
                                                 int key, fsdp_group_t **group_p)
{
    fsdp_status_t status = fsdp_dev_coll_check(dev, FSDP_COLL_GROUP_SPLIT, parent, group_p == NULL,
                                               0, FSDP_DTYPE_F32, FSDP_REDUCE_SUM, 0);
    return status != FSDP_OK ? status : dev->ops->group_split(dev, parent, color, key, group_p);
}

static inline void fsdp_dev_group_destroy(fsdp_dev_t *dev, fsdp_group_t *group)
{
    dev->ops->group_destroy(dev, group);
}

static inline fsdp_status_t fsdp_dev_all_gather(fsdp_dev_t *dev, fsdp_group_t *group,
                                                const void *send, void *recv, size_t count,
                                                fsdp_dtype_t dtype, fsdp_stream_t *stream)
{
    fsdp_status_t status =
        fsdp_dev_coll_check(dev, FSDP_COLL_ALL_GATHER, group, send == NULL || recv == NULL, count,
                            dtype, FSDP_REDUCE_SUM, 0);
    return status != FSDP_OK ? status
                             : dev->ops->all_gather(dev, group, send, recv, count, dtype, stream);
}

static inline fsdp_status_t fsdp_dev_reduce_scatter(fsdp_dev_t *dev, fsdp_group_t *group,
                                                    const void *send, void *recv, size_t count,
                                                    fsdp_dtype_t dtype, fsdp_reduce_op_t op,
                                                    fsdp_stream_t *stream)
{
    fsdp_status_t status = fsdp_dev_coll_check(dev, FSDP_COLL_REDUCE_SCATTER, group,
                                               send == NULL || recv == NULL, count, dtype, op, 0);
    return status != FSDP_OK
               ? status
               : dev->ops->reduce_scatter(dev, group, send, recv, count, dtype, op, stream);
}

static inline fsdp_status_t fsdp_dev_all_reduce(fsdp_dev_t *dev, fsdp_group_t *group,
                                                const void *send, void *recv, size_t count,
                                                fsdp_dtype_t dtype, fsdp_reduce_op_t op,
                                                fsdp_stream_t *stream)
{
    fsdp_status_t status = fsdp_dev_coll_check(dev, FSDP_COLL_ALL_REDUCE, group,
                                               send == NULL || recv == NULL, count, dtype, op, 0);
    return status != FSDP_OK
               ? status
               : dev->ops->all_reduce(dev, group, send, recv, count, dtype, op, stream);
}

static inline fsdp_status_t fsdp_dev_broadcast(fsdp_dev_t *dev, fsdp_group_t *group, void *buf,
                                               size_t count, fsdp_dtype_t dtype, int root,
                                               fsdp_stream_t *stream)
{
    fsdp_status_t status = fsdp_dev_coll_check(dev, FSDP_COLL_BROADCAST, group, buf == NULL, count,
                                               dtype, FSDP_REDUCE_SUM, root);
    return status != FSDP_OK ? status
                             : dev->ops->broadcast(dev, group, buf, count, dtype, root, stream);
}

static inline fsdp_status_t fsdp_dev_barrier(fsdp_dev_t *dev, fsdp_group_t *group)
{
    fsdp_status_t status = fsdp_dev_coll_check(dev, FSDP_COLL_BARRIER, group, 0, 0, FSDP_DTYPE_F32,
                                               FSDP_REDUCE_SUM, 0);
    return status != FSDP_OK ? status : dev->ops->barrier(dev, group);
}

#ifdef __cplusplus
}
#endif
#endif
