/* What both of fsdp-train's paths share: the trace database and the per-step report. */
#ifndef FSDP_TOOLS_TRAIN_TRACE_H
#define FSDP_TOOLS_TRAIN_TRACE_H

#include <fsdp/fsdp.h>
#include <fsdp/trace.h>

/* Opens --trace FILE for a run of backend "sim" or "gpu" (NULL path: *trace_p = NULL). Reports
 * errors itself. */
fsdp_status_t train_trace_open(const char *path, const char *backend, const fsdp_config_t *cfg,
                               int world, const char *model, int argc, char **argv,
                               fsdp_trace_t **trace_p);

/* Per-rank step accounting: the (simulated, or on a GPU wall) time of a step and the rank's peak memory. */
typedef struct train_step_clock {
    double start; /* host clock at the step's start */
} train_step_clock_t;

void train_step_begin(fsdp_dev_t *dev, train_step_clock_t *clock);
/* Ends a step: the rank's simulated step time in seconds (host clock after the step's work,
 * which the loss reduction has synchronized), and a step row in the trace when tracing. */
double train_step_end(fsdp_dev_t *dev, fsdp_t *fs, train_step_clock_t *clock, int64_t step,
                      double loss);

/* A progress bar on stderr when it is a terminal (nothing otherwise). */
void train_progress(int64_t step, int64_t steps, double loss);

#endif
