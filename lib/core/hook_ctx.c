/* The hook context: the unit and the hook that trace events and out-of-memory reports are
 * attributed to, set as the hooks run. The bottom of the core, with error recording (error.c):
 * it calls no other core file. */
#include "core/core_int.h"

#include <fsdp/trace.h>

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
