/* What both of fsdp-train's paths share: the trace database and the per-step report. */
#ifndef FSDP_TOOLS_TRAIN_TRACE_H
#define FSDP_TOOLS_TRAIN_TRACE_H

#include <fsdp/fsdp.h>
#include <fsdp/trace.h>

#include "train_launch.h"

/* Opens --trace FILE for the run launch describes (NULL path: *trace_p = NULL): its backend,
 * world, options and, on the simulator, the cluster profile with the simulated topology (what
 * `fsdp-trace calibrate` reads nodes and GPUs per node from). Reports errors itself. */
fsdp_status_t train_trace_open(const char *path, const train_launch_t *launch,
                               const fsdp_config_t *cfg, const char *model, int argc, char **argv,
                               fsdp_trace_t **trace_p);

/* Per-rank step accounting: the (simulated, or on a GPU wall) time of a step and the rank's peak
 * memory. */
typedef struct train_step_clock {
    double start; /* host clock at the step's start */
} train_step_clock_t;

void train_step_begin(fsdp_dev_t *dev, train_step_clock_t *clock);
/* Ends a step: the rank's simulated step time in seconds (host clock after the step's work,
 * which the loss reduction has synchronized), and a step row in the trace when tracing. */
double train_step_end(fsdp_dev_t *dev, fsdp_t *fs, train_step_clock_t *clock, int64_t step,
                      double loss);

/* Rank 0's line for a step, on stdout: at once without a trace; with one, once every rank's
 * row for the step is committed (without waiting for it: the lines follow the writer), so that
 * a killed run's database holds every step it printed. */
void train_print_step(fsdp_trace_t *trace, int64_t step, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The lines still held, after the trace is closed (or failed). */
void train_print_rest(void);

/* A progress bar on stderr when it is a terminal (nothing otherwise). */
void train_progress(int64_t step, int64_t steps, double loss);

#endif
