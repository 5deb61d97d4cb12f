/* fsdp-train's trace database and its per-step report, for its training loop (train_loop.c). */
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

/* The host's monotonic clock in seconds: the wall time of steps and of the run. */
double train_wall_now(void);

/* A step line, the same for every model: the loss, this process's items (tokens or rows) per
 * second, the step time (the simulated device's; on a GPU, the host's wall clock over the
 * step) and the rank's peak allocated memory. Printed above the progress bar: at once without
 * a trace; with one, once every rank's row for the step is committed (without waiting for it:
 * the lines follow the writer), so that a killed run's database holds every step it printed. */
void train_step_line(fsdp_trace_t *trace, const train_launch_t *launch, int64_t step,
                     double loss, const char *unit, double items_per_s, double step_time,
                     size_t peak_allocated);
/* The step lines still held, after the trace is closed (or failed). */
void train_print_rest(void);

/* What a run trained, after its last step: items (tokens or rows) and their rate over the wall
 * time, the first and last loss and the mean step time (step_time_sum over steps_run). */
typedef struct train_totals {
    const char *unit; /* "tokens", "rows" */
    double items, wall_s;
    int64_t steps_run;
    double first_loss, last_loss, step_time_sum;
    const char *profile_name; /* the simulator's cluster */
} train_totals_t;

void train_report_totals(const train_launch_t *launch, const train_totals_t *t);
/* Where the run's files went: the checkpoint directory and the trace (either may be NULL). */
void train_report_outputs(const char *ckpt_dir, const char *trace_path);

/* --resume: rank 0 says which step it loaded (a line above the progress bar; none when quiet). */
void train_resumed(const fsdp_dev_t *dev, const char *dir, int64_t step, int quiet);
/* After the run: a checkpoint at or past --steps left nothing to train, which is an error the
 * tool reports; returns non-zero then. */
int train_resume_past_end(const char *dir, int64_t step, int64_t steps);

#endif
