/* Checks on backend ops tables, and helpers built only from their slots. */
#include <fsdp/backend.h>
#include <fsdp/log.h>

#include <stddef.h>

fsdp_status_t fsdp_backend_check(const fsdp_backend_ops_t *ops)
{
    if (ops == NULL) {
        fsdp_error("backend ops table is NULL");
        return FSDP_ERR_INVALID_PARAM;
    }
    if (ops->size != sizeof(*ops)) {
        fsdp_error("backend '%s' was built with an ops table of %zu bytes, this library expects "
                   "%zu", ops->name ? ops->name : "?", ops->size, sizeof(*ops));
        return FSDP_ERR_INVALID_PARAM;
    }
#define FSDP_CHECK_SLOT_(slot)                                                                     \
    if (ops->slot == NULL) {                                                                       \
        fsdp_error("backend '%s' leaves slot '%s' of its ops table NULL",                          \
                   ops->name ? ops->name : "?", #slot);                                            \
        return FSDP_ERR_INVALID_PARAM;                                                             \
    }
    FSDP_CHECK_SLOT_(segment_alloc)
    FSDP_CHECK_SLOT_(segment_free)
    FSDP_CHECK_SLOT_(compute_stream)
    FSDP_CHECK_SLOT_(stream_create)
    FSDP_CHECK_SLOT_(stream_destroy)
    FSDP_CHECK_SLOT_(stream_synchronize)
    FSDP_CHECK_SLOT_(event_create)
    FSDP_CHECK_SLOT_(event_destroy)
    FSDP_CHECK_SLOT_(event_record)
    FSDP_CHECK_SLOT_(stream_wait_event)
    FSDP_CHECK_SLOT_(event_query)
    FSDP_CHECK_SLOT_(event_synchronize)
    FSDP_CHECK_SLOT_(host_time)
    FSDP_CHECK_SLOT_(memcpy_async)
    FSDP_CHECK_SLOT_(group_world)
    FSDP_CHECK_SLOT_(group_split)
    FSDP_CHECK_SLOT_(group_destroy)
    FSDP_CHECK_SLOT_(all_gather)
    FSDP_CHECK_SLOT_(reduce_scatter)
    FSDP_CHECK_SLOT_(all_reduce)
    FSDP_CHECK_SLOT_(broadcast)
    FSDP_CHECK_SLOT_(barrier)
    FSDP_CHECK_SLOT_(kernel)
#undef FSDP_CHECK_SLOT_
    return FSDP_OK;
}

fsdp_status_t fsdp_stream_wait_stream(fsdp_dev_t *dev, fsdp_stream_t *waiter,
                                      fsdp_stream_t *waitee)
{
    fsdp_event_t *ev;
    fsdp_status_t status;

    if (waiter == waitee)
        return FSDP_OK;
    status = dev->ops->event_create(dev, &ev);
    if (status != FSDP_OK)
        return status;
    status = dev->ops->event_record(dev, ev, waitee);
    if (status == FSDP_OK)
        status = dev->ops->stream_wait_event(dev, waiter, ev);
    dev->ops->event_destroy(dev, ev);
    return status;
}
