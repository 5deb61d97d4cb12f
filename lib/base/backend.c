/* Checks on backend ops tables, and helpers built only from their slots. */
#include <fsdp/backend.h>
#include <fsdp/log.h>

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

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

void fsdp_group_split_name(char name[FSDP_GROUP_NAME_SIZE], const char *parent, unsigned round,
                           int color)
{
    char full[FSDP_GROUP_NAME_SIZE + 64];
    uint64_t h = 14695981039346656037ull; /* FNV-1a, 64 bits */
    int n;

    if (round <= 1)
        n = snprintf(full, sizeof(full), "%s/split(%d)", parent, color);
    else
        n = snprintf(full, sizeof(full), "%s/split%u(%d)", parent, round, color);
    if (n >= 0 && (size_t)n < FSDP_GROUP_NAME_SIZE) {
        memcpy(name, full, (size_t)n + 1);
        return;
    }
    /* too long for the field (a parent name is at most FSDP_GROUP_NAME_SIZE - 1 bytes, so
     * `full` held all of it) */
    for (const unsigned char *p = (const unsigned char *)full; *p != '\0'; p++) {
        h ^= *p;
        h *= 1099511628211ull;
    }
    snprintf(name, FSDP_GROUP_NAME_SIZE, "g:%016" PRIx64, h);
}
