/* The CPU rate limiter (docs/runtime.md section 2 B.3 and C.4): the events recorded after each
 * reshard that frees an unsharded parameter, oldest first; with two outstanding, the host waits
 * for the oldest before issuing another all-gather. */
#include "core/core_int.h"

#include <string.h>

/* Takes the oldest event off the queue, waits for it and destroys it. */
static fsdp_status_t wait_oldest(fsdp_t *fs)
{
    fsdp_event_t *ev = fs->limiter_events[0];
    fsdp_status_t status;

    memmove(&fs->limiter_events[0], &fs->limiter_events[1],
            sizeof(ev) * (size_t)(fs->n_limiter_events - 1));
    fs->n_limiter_events--;
    status = fsdp_dev_event_synchronize(fs->dev, ev);
    fsdp_dev_event_destroy(fs->dev, ev);
    return status;
}

fsdp_status_t fsdp_limiter_wait(fsdp_t *fs)
{
    if (!fs->cfg.limit_all_gathers || fs->n_limiter_events < FSDP_LIMITER_MAX_INFLIGHT)
        return FSDP_OK;
    return wait_oldest(fs);
}

fsdp_status_t fsdp_limiter_record(fsdp_t *fs)
{
    fsdp_event_t *ev;
    fsdp_status_t status;

    /* bounded: each unshard waits for one; if the queue ever fills, wait for the oldest now,
     * which only makes the limiter stricter */
    if (fs->n_limiter_events == FSDP_LIMITER_MAX_INFLIGHT + 1) {
        status = wait_oldest(fs);
        if (status != FSDP_OK)
            return status;
    }
    status = fsdp_dev_event_create(fs->dev, &ev);
    if (status != FSDP_OK)
        return status;
    status = fsdp_dev_event_record(fs->dev, ev, fs->compute);
    if (status != FSDP_OK) {
        fsdp_dev_event_destroy(fs->dev, ev);
        return status;
    }
    fs->limiter_events[fs->n_limiter_events++] = ev;
    return FSDP_OK;
}

void fsdp_limiter_clear(fsdp_t *fs)
{
    for (int i = 0; i < fs->n_limiter_events; i++)
        fsdp_dev_event_destroy(fs->dev, fs->limiter_events[i]);
    fs->n_limiter_events = 0;
}
