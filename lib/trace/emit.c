/* Building trace events: the blank event every emitter starts from, and what both backends put
 * into an op's event: one builder, so that a simulated and a hardware run of the same program
 * write the same kinds, names, bytes, counts and dtypes, and differ only in their times. */

#include "trace/trace_hidden.h"

#include <fsdp/backend/trace.h>

#include <math.h>
#include <string.h>

void fsdp_trace_event_init(fsdp_trace_event_t *ev, fsdp_event_kind_t kind, const char *name)
{
    memset(ev, 0, sizeof(*ev));
    ev->kind = kind;
    ev->name = name;
    ev->dtype = -1;
}

void fsdp_trace_op(fsdp_dev_t *dev, const fsdp_trace_op_t *op, fsdp_trace_timing_t *timing)
{
    fsdp_trace_event_t ev;

    fsdp_trace_event_init(&ev, op->kind, op->name);
    ev.stream = op->stream;
    ev.host_time = op->host;
    ev.start = op->start;
    ev.end = op->end;
    ev.bytes = op->bytes;
    ev.count = op->count;
    ev.dtype = op->dtype;
    ev.group = op->group;
    fsdp_trace_emit_timed(dev, &ev, timing);
}

void fsdp_trace_kernel_fields(const fsdp_kernel_t *k, fsdp_trace_op_t *op)
{
    double flops, bytes;

    fsdp_kernel_cost(k, &flops, &bytes);
    op->kind = FSDP_EV_KERNEL;
    op->name = fsdp_kernel_name(k->kind);
    op->bytes = bytes > 0.0 ? (uint64_t)llround(bytes) : 0;
    op->count = flops > 0.0 ? (uint64_t)llround(flops) : 0; /* a kernel event's count: FLOPs */
    op->dtype = k->kind == FSDP_K_GEMM ? (int)k->u.gemm.a_dtype : -1;
    op->group = NULL;
}

uint64_t fsdp_trace_coll_bytes(const char *name, uint64_t count, fsdp_dtype_t dtype, int group_size)
{
    double bytes = (double)count * (double)fsdp_dtype_size(dtype);

    if (strcmp(name, "all_gather") == 0 || strcmp(name, "reduce_scatter") == 0)
        bytes *= group_size;
    return bytes > 0.0 ? (uint64_t)bytes : 0;
}
