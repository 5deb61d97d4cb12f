/* The trace, hidden: the events the core and the allocator record, and the pieces of the readers
 * that the tests check.
 *
 * libfsdp.so exports only the user API of include/fsdp/ (DESIGN.md, "Layers"); these functions are
 * declared here instead, for the rest of the library and for the tests and benchmarks that link
 * the library's parts statically (FSDP_INTERNAL_LIBS in common.am). */
#ifndef FSDP_TRACE_HIDDEN_H
#define FSDP_TRACE_HIDDEN_H

#include <fsdp/backend/trace.h>
#include <fsdp/trace.h>

/* ---- from <fsdp/trace.h> ---- */

/* "hook", "alloc", ...; "invalid" for anything else. Never NULL. */
const char *fsdp_event_kind_name(fsdp_event_kind_t kind);

/* Parses a kind name; returns 0 on success, -1 if unknown. */
int fsdp_event_kind_parse(const char *s, fsdp_event_kind_t *kind_p);

/* Zeroes *ev and sets kind, name and dtype = -1. */
void fsdp_trace_event_init(fsdp_trace_event_t *ev, fsdp_event_kind_t kind, const char *name);

/* Appends one event to the rank's trace and gives it the rank's next sequence number (0, 1,
 * ...). A no-op when dev->trace is NULL. Never blocks on the database. */
void fsdp_trace_emit(fsdp_dev_t *dev, const fsdp_trace_event_t *ev);

/* The FSDP unit this rank's next events belong to when they name none (NULL: none). The name
 * must stay valid until the next call. The runtime sets it in its hooks. */
void fsdp_trace_set_unit(fsdp_dev_t *dev, const char *unit);

/* The live counters (fsdp_mem_counters of the runtime's allocator) whose allocated and reserved
 * bytes every event of this rank records when its emitter leaves both 0 (NULL: zeros). The
 * writer reads them and never calls the allocator. */
void fsdp_trace_set_memory(fsdp_dev_t *dev, const fsdp_mem_pool_stats_t *counters);

/* Waits until everything emitted so far (by every attached rank) is committed. Returns the
 * first error the writer met, if any. */
fsdp_status_t fsdp_trace_flush(fsdp_trace_t *t);

void fsdp_trace_get_stats(fsdp_trace_t *t, fsdp_trace_stats_t *stats_p);

/* The text of traces/schema.sql, as built into the library. */
const char *fsdp_trace_schema(void);

/* The strings stay valid until the next call on the reader. */
fsdp_status_t fsdp_trace_reader_run(fsdp_trace_reader_t *reader, int64_t run,
                                    fsdp_trace_run_row_t *row_p);

/* Which traced rank stands for each rank of the run's world: rep[r] (world_size entries) is the
 * rank whose events are r's (a symmetric plan's simulated rank standing for its class, from the
 * ranks table; r itself for a rank traced on its own), or -1 when no rank of the run stands
 * for r. *traced_p (may be NULL): the ranks with events or steps of their own. A ranks table
 * that does not add up is FSDP_ERR_FORMAT. */
fsdp_status_t fsdp_trace_reader_represent(fsdp_trace_reader_t *reader, int64_t run, int *rep,
                                          int *traced_p);

/* In (rank, step) order; rank -1: every rank. */
fsdp_status_t fsdp_trace_reader_steps(fsdp_trace_reader_t *reader, int64_t run, int rank,
                                      fsdp_trace_step_func_t func, void *arg);

const char *fsdp_trace_divergence_name(fsdp_trace_divergence_t d);

/* fsdp_trace_plot_svg_ex of the whole run; max_ranks: how many ranks to draw (0: 8). */
fsdp_status_t fsdp_trace_plot_svg(const char *path, int64_t run, int max_ranks,
                                  const char *out_path);

/* ---- from <fsdp/backend/trace.h> ---- */

/* As fsdp_trace_emit, with ev->start and ev->end filled in later by timing (NULL: now). */
void fsdp_trace_emit_timed(fsdp_dev_t *dev, const fsdp_trace_event_t *ev,
                           fsdp_trace_timing_t *timing);

#endif
