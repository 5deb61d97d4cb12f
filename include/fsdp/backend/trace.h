/* libfsdp for backends: building a backend op's trace event.
 *
 * What a backend (the sim, the gpu module) calls in the core to record what it executes, apart
 * from the user's trace.h: both backends emit every op through fsdp_trace_op, so their traces
 * hold the same fields and diff op by op. A program that only trains and reads traces needs
 * none of this.
 */
#ifndef FSDP_BACKEND_TRACE_H
#define FSDP_BACKEND_TRACE_H

#include <fsdp/api.h>

#include <fsdp/backend.h>
#include <fsdp/kernel.h>
#include <fsdp/trace.h>

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* An event whose device times are known only later (a GPU's timing events). The emitter embeds
 * this first in its own record; resolve() writes the start and end times (leaving them as they
 * were when it cannot tell) and releases the record. It is called exactly once per emission,
 * before the event's chunk goes to the writer: when the chunk fills, at a step boundary, at
 * detach, or in fsdp_trace_flush (from the flushing thread), and at once when the event is
 * dropped. It may wait for the device but must not emit. */
typedef struct fsdp_trace_timing fsdp_trace_timing_t;
struct fsdp_trace_timing {
    void (*resolve)(fsdp_trace_timing_t *timing, double *start_p, double *end_p);
};

/* One op of a backend, built into an event and emitted (a no-op when the device does not
 * trace): stream NULL for a host event, dtype -1 and group NULL where they do not apply.
 * Both backends emit every op through this, so their traces hold the same fields. */
typedef struct fsdp_trace_op {
    fsdp_event_kind_t kind;
    const char *name;
    const char *stream;
    double host, start, end;
    uint64_t bytes, count;
    int dtype;
    const char *group;
} fsdp_trace_op_t;
FSDP_API void fsdp_trace_op(fsdp_dev_t *dev, const fsdp_trace_op_t *op,
                            fsdp_trace_timing_t *timing);

/* The name, bytes, count and dtype a kernel descriptor's event carries, as every backend records
 * them: fsdp_kernel_name(), bytes = the bytes it moves and count = its FLOPs (the cost model's,
 * fsdp_kernel_cost, rounded to the nearest integer), dtype = the operands' dtype of a GEMM and
 * -1 otherwise. */
FSDP_API void fsdp_trace_kernel_fields(const fsdp_kernel_t *k, fsdp_trace_op_t *op);

/* The bytes a collective's event carries, as NCCL counts them: count elements of dtype, times
 * the group size for an all-gather or reduce-scatter (their full buffer). name: "all_gather",
 * "reduce_scatter", "all_reduce", "broadcast". */
FSDP_API uint64_t fsdp_trace_coll_bytes(const char *name, uint64_t count, fsdp_dtype_t dtype,
                                        int group_size);

#ifdef __cplusplus
}
#endif
#endif
