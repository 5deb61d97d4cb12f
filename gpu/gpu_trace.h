/* The gpu backend's trace events (trace.c; never installed). Read by gcc only: trace.h is C. */
#ifndef FSDP_GPU_TRACE_H
#define FSDP_GPU_TRACE_H

#include "gpu.h"

#include <fsdp/backend/trace.h>

/* The events of traced ops, with device times from CUDA events (see trace.c). */
fsdp_status_t fsdp_gpu_trace_init(fsdp_gpu_dev_t *gdev);
void fsdp_gpu_trace_fini(fsdp_gpu_dev_t *gdev);
/* Before enqueueing a traced op on stream: records its start (instant: nothing yet). NULL when
 * the dev does not trace or timing failed (the event then keeps host times). */
fsdp_gpu_timer_t *fsdp_gpu_trace_begin(fsdp_gpu_dev_t *gdev, cudaStream_t stream, int instant);
/* After the op was enqueued: records its end and emits op, whose start and end are the host
 * times kept when the device's cannot be read. Accepts a NULL timer. */
void fsdp_gpu_trace_end(fsdp_gpu_dev_t *gdev, fsdp_gpu_timer_t *timer, cudaStream_t stream,
                        const fsdp_trace_op_t *op);
/* The op failed: the timer goes back unused. Accepts NULL. */
void fsdp_gpu_trace_cancel(fsdp_gpu_timer_t *timer);
/* A host event (a synchronization, a barrier) from host to now. */
void fsdp_gpu_trace_host(fsdp_gpu_dev_t *gdev, fsdp_event_kind_t kind, const char *name,
                         const fsdp_gpu_stream_t *stream, double host, const char *group);
/* "h2d", "d2h", "d2d" or "h2h", as the simulator names copies. */
const char *fsdp_gpu_copy_name(const void *dst, const void *src);

#endif
