/* Error recording (fsdp_fail, fsdp_last_error) and the hook context every core file stamps on
 * trace events and out-of-memory reports: the bottom of the core, calling no other core file. */
#include "core/core_int.h"

#include <fsdp/trace.h>

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

fsdp_status_t fsdp_fail(fsdp_t *fs, fsdp_status_t status, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(fs->last_error, sizeof(fs->last_error), fmt, ap);
    va_end(ap);
    fsdp_error("%s", fs->last_error);
    return status;
}

const char *fsdp_last_error(const fsdp_t *fs)
{
    return fs ? fs->last_error : "";
}

void fsdp_trace_hook(fsdp_t *fs, const char *hook, const fsdp_unit_t *u)
{
    fsdp_trace_event_t ev;
    /* the phase an out-of-memory report names */
    fs->cur_phase = hook;
    fsdp_mem_set_context(fs->mem, u != NULL ? u->name : NULL, hook);
    if (!fsdp_trace_enabled(fs->dev))
        return;
    fsdp_trace_event_init(&ev, FSDP_EV_HOOK, hook);
    ev.unit = u != NULL ? u->name : NULL;
    ev.host_time = fsdp_dev_host_time(fs->dev);
    ev.start = ev.end = ev.host_time;
    fsdp_trace_emit(fs->dev, &ev);
}

const char *fsdp_trace_unit_swap(fsdp_t *fs, const char *unit)
{
    const char *prev = fs->cur_unit;
    fs->cur_unit = unit;
    fsdp_trace_set_unit(fs->dev, unit);
    fsdp_mem_set_context(fs->mem, unit, fs->cur_phase);
    return prev;
}
