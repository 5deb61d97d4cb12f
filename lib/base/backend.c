/* Checks on backend ops tables, and helpers built only from their slots. */
#include <fsdp/backend.h>
#include <fsdp/log.h>

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* The slot list covers the struct: after `size` and `name`, the slots and nothing else. */
#define FSDP_COUNT_SLOT_(slot) +1
_Static_assert(sizeof(fsdp_backend_ops_t) ==
                   offsetof(fsdp_backend_ops_t, segment_alloc) +
                       (0 FSDP_BACKEND_SLOTS(FSDP_COUNT_SLOT_)) * sizeof(void (*)(void)),
               "fsdp_backend_ops_t has a slot that FSDP_BACKEND_SLOTS does not list");
#undef FSDP_COUNT_SLOT_

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
    FSDP_BACKEND_SLOTS(FSDP_CHECK_SLOT_)
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
