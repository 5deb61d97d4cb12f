/* The names of trace.h's enumerations: the event kinds, both ways, and the divergences that
 * fsdp-trace diff reports. */
#include "trace/trace_hidden.h"

#include <fsdp/trace.h>

#include <string.h>

static const char *const event_kind_names[] = {
#define FSDP_EV_NAME_(name, str) str,
    FSDP_FOREACH_EVENT_KIND(FSDP_EV_NAME_)
#undef FSDP_EV_NAME_
};

const char *fsdp_event_kind_name(fsdp_event_kind_t kind)
{
    if ((unsigned)kind >= FSDP_EV_KIND_COUNT)
        return "invalid";
    return event_kind_names[kind];
}

int fsdp_event_kind_parse(const char *s, fsdp_event_kind_t *kind_p)
{
    if (s == NULL)
        return -1;
    for (int k = 0; k < FSDP_EV_KIND_COUNT; k++) {
        if (strcmp(s, event_kind_names[k]) == 0) {
            *kind_p = (fsdp_event_kind_t)k;
            return 0;
        }
    }
    return -1;
}

static const char *const divergence_names[] = {
#define FSDP_DIV_NAME_(name, str) str,
    FSDP_FOREACH_TRACE_DIVERGENCE(FSDP_DIV_NAME_)
#undef FSDP_DIV_NAME_
};

const char *fsdp_trace_divergence_name(fsdp_trace_divergence_t d)
{
    if ((unsigned)d >= FSDP_TRACE_DIV_COUNT)
        return "invalid";
    return divergence_names[d];
}
