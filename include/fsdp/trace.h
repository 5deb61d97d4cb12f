/* libfsdp: event traces.
 *
 * Both backends log what a rank does (hooks, allocations, copies, kernels, collectives, event
 * records and waits, synchronizations) to one SQLite database, so a simulated run and a hardware
 * run can be diffed op by op. The schema is traces/schema.sql (fsdp_trace_schema()).
 *
 * Writing. fsdp_trace_open() creates a run row; each rank attaches its fsdp_dev_t and emits
 * events. Emitting never touches SQLite: an event is copied into the rank's current chunk, whole
 * chunks go to one writer thread through a short mutex-protected queue, and the writer inserts
 * them in batched transactions. fsdp_trace_step() hands the rank's chunk over with the step row,
 * so every completed step is committed soon after it ends and survives a killed process.
 * Emission is a no-op for a device without a trace (dev->trace == NULL). A backend builds the
 * events of the ops it executes with fsdp/backend/trace.h.
 *
 * Reading. A reader iterates the rows of a run; fsdp_trace_summary(), fsdp_trace_diff(),
 * fsdp_trace_export_chrome() and fsdp_trace_plot_svg() are what the fsdp-trace tool runs.
 *
 * Threads: fsdp_trace_emit/step/attach/detach are called by rank threads, concurrently for
 * different ranks; a device is used by one thread at a time. fsdp_trace_flush may be called
 * from any thread at any time. fsdp_trace_close must come after every rank has stopped
 * emitting; a device still attached must not emit after it.
 */
#ifndef FSDP_TRACE_H
#define FSDP_TRACE_H

#include <fsdp/api.h>

#include <fsdp/backend.h>
#include <fsdp/memory.h>
#include <fsdp/status.h>

#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Version of the schema this library writes (PRAGMA user_version). */
#define FSDP_TRACE_SCHEMA_VERSION 3

/* X(name, "name"): the kinds of event; the name is what the database stores. */
#define FSDP_FOREACH_EVENT_KIND(X)                                                                 \
    X(HOOK, "hook")             /* a runtime hook ran (name: "pre_forward", ...) */                \
    X(ALLOC, "alloc")           /* a block was allocated (name: its memory category) */            \
    X(FREE, "free")             /* a block was freed (name: its memory category) */                \
    X(COPY, "copy")             /* memcpy_async (name: "h2d", "d2h", "d2d") */                     \
    X(KERNEL, "kernel")         /* a kernel (name: fsdp_kernel_name()) */                          \
    X(COLLECTIVE, "collective") /* name: "all_gather", "reduce_scatter", ... */                    \
    X(RECORD, "record")         /* an event was recorded on a stream */                            \
    X(WAIT, "wait")             /* a stream waits for an event */                                  \
    X(SYNC, "sync")             /* the host waited (event or stream synchronize, barrier) */

typedef enum {
#define FSDP_EV_ENUM_(name, str) FSDP_EV_##name,
    FSDP_FOREACH_EVENT_KIND(FSDP_EV_ENUM_)
#undef FSDP_EV_ENUM_
        FSDP_EV_KIND_COUNT
} fsdp_event_kind_t;

typedef struct fsdp_trace_event {
    fsdp_event_kind_t kind;
    const char *name;   /* "pre_forward", "all_gather", "gemm", a memory category, ...; copied */
    const char *unit;   /* FSDP unit name or NULL; copied */
    const char *stream; /* stream name or NULL (a host event); copied */
    double host_time;   /* seconds, the rank's host clock when issued */
    double start, end;  /* seconds, device (or virtual) execution interval; equal for instant
                         * events */
    uint64_t bytes, count;
    int dtype;                    /* fsdp_dtype_t, or -1 */
    const char *group;            /* group name or NULL; copied */
    uint64_t allocated, reserved; /* after the event */
} fsdp_trace_event_t;

/* Strings longer than this many bytes are stored truncated. */
#define FSDP_TRACE_STR_MAX 1024

typedef struct fsdp_trace fsdp_trace_t; /* one database, one run */

typedef struct fsdp_trace_run_info {
    const char *backend; /* "sim", "gpu" */
    int world_size;
    const char *strategy;     /* "full_shard", ... or NULL */
    const char *config_json;  /* every option, as JSON text, or NULL */
    const char *profile_json; /* the cluster profile, as JSON text, or NULL */
    const char *command_line; /* or NULL */
} fsdp_trace_run_info_t;

/* Opens (creating if needed) the database at `path` and starts a new run in it. A database
 * whose schema version is newer than FSDP_TRACE_SCHEMA_VERSION is refused with
 * FSDP_ERR_FORMAT; one without our tables gets them. `info` may be NULL. */
FSDP_API fsdp_status_t fsdp_trace_open(const char *path, const fsdp_trace_run_info_t *info,
                                       fsdp_trace_t **trace_p);
/* The id of the run this trace writes (the runs table's id). */
FSDP_API int64_t fsdp_trace_run_id(const fsdp_trace_t *t);

/* Starts tracing dev->rank into t: sets dev->trace. Attaching a rank again after
 * fsdp_trace_detach continues its sequence numbers. A rank attached to two devices at once is
 * FSDP_ERR_INVALID_PARAM. */
FSDP_API fsdp_status_t fsdp_trace_attach(fsdp_trace_t *t, fsdp_dev_t *dev);
/* Hands the rank's pending events to the writer and sets dev->trace = NULL. Accepts a device
 * that is not tracing. */
FSDP_API void fsdp_trace_detach(fsdp_dev_t *dev);

/* 1 when the device is tracing: emitters can skip building events otherwise. */
static inline int fsdp_trace_enabled(const fsdp_dev_t *dev)
{
    return dev != NULL && dev->trace != NULL;
}

/* The rank's step row (loss, step time, peak memory by category from `mem`, which may be NULL)
 * and a step boundary: the rank's pending events are handed to the writer, which commits them
 * together with the row. */
FSDP_API void fsdp_trace_step(fsdp_dev_t *dev, int64_t step, double loss, double step_time,
                              const fsdp_mem_stats_t *mem);

/* Flushes, marks the run finished, stops the writer and closes the database. Accepts NULL.
 * Returns the first error the writer met, if any. */
FSDP_API fsdp_status_t fsdp_trace_close(fsdp_trace_t *t);

/* The highest step whose step row every rank attached to this trace has committed, -1 before
 * that. A program that prints a line per step prints step S's once S is committed, so
 * that a killed run's database holds every step it printed (fsdp-train does). */
FSDP_API int64_t fsdp_trace_committed_step(fsdp_trace_t *t);
/* FSDP_OK while the writer writes; else the error that stopped it. A writer that fails (its
 * file system full, say) says once why and up to which step the database holds every step,
 * then drops every later event: nothing more is committed, so a program holding its step lines
 * for fsdp_trace_committed_step() prints them at once from then on. */
FSDP_API fsdp_status_t fsdp_trace_status(fsdp_trace_t *t);

/* What the writer has done so far. */
typedef struct fsdp_trace_stats {
    uint64_t events;     /* event rows committed */
    uint64_t steps;      /* step rows committed */
    uint64_t commits;    /* transactions */
    uint64_t dropped;    /* events lost after a writer error */
    double writer_cpu_s; /* CPU time of the writer thread */
} fsdp_trace_stats_t;

/* ---- Reading ------------------------------------------------------------------------------ */

typedef struct fsdp_trace_reader fsdp_trace_reader_t;

/* Opens a trace database for reading (it writes nothing, but may run the recovery a killed
 * writer left to do, as any SQLite connection would). A file that is not a trace database, or
 * one of a newer
 * schema version, is FSDP_ERR_FORMAT; a missing file is FSDP_ERR_NOT_FOUND. */
FSDP_API fsdp_status_t fsdp_trace_reader_open(const char *path, fsdp_trace_reader_t **reader_p);
FSDP_API void fsdp_trace_reader_close(fsdp_trace_reader_t *reader);

/* run > 0: checks that the run exists (FSDP_ERR_NOT_FOUND otherwise); run == 0: the latest run;
 * run < 0: the run before the latest one by -run (-1: the one before the latest). */
FSDP_API fsdp_status_t fsdp_trace_reader_find_run(fsdp_trace_reader_t *reader, int64_t run,
                                                  int64_t *run_p);

typedef struct fsdp_trace_run_row {
    int64_t id;
    const char *created; /* ISO 8601, UTC */
    const char *backend;
    int world_size;
    const char *strategy, *config_json, *profile_json, *version, *command_line; /* or NULL */
    int finished; /* 1 when fsdp_trace_close ran */
} fsdp_trace_run_row_t;

/* Called for each event of a run, in (rank, seq) order; the strings are valid during the call.
 * A non-zero return stops the iteration (and is not an error). */
typedef int (*fsdp_trace_event_func_t)(void *arg, int rank, uint64_t seq,
                                       const fsdp_trace_event_t *ev);
/* rank >= 0: only that rank; -1: every rank. */
FSDP_API fsdp_status_t fsdp_trace_reader_events(fsdp_trace_reader_t *reader, int64_t run, int rank,
                                                fsdp_trace_event_func_t func, void *arg);

typedef struct fsdp_trace_step_row {
    int rank;
    int64_t step;
    double loss, step_time;
    uint64_t seq_end; /* the rank's events with seq < seq_end were emitted before this row */
    uint64_t peak_allocated, peak_reserved;
    uint64_t peak_by_category[FSDP_MEM_CATEGORY_COUNT];    /* each category's own maximum */
    uint64_t at_peak_by_category[FSDP_MEM_CATEGORY_COUNT]; /* at the moment of peak_allocated */
} fsdp_trace_step_row_t;

typedef int (*fsdp_trace_step_func_t)(void *arg, const fsdp_trace_step_row_t *row);

/* ---- What fsdp-trace does ----------------------------------------------------------------- */

/* Per rank (ranks with identical lines folded together): counts and bytes per collective, per
 * unit all-gather and reduce-scatter sizes, step times and peak memory by category. run as
 * fsdp_trace_reader_find_run. */
FSDP_API fsdp_status_t fsdp_trace_summary(const char *path, int64_t run, FILE *out);

/* X(name, "name") */
#define FSDP_FOREACH_TRACE_DIVERGENCE(X)                                                           \
    X(NONE, "identical")                                                                           \
    X(WORLD, "world size differs")                                                                 \
    X(MISSING, "missing op")      /* in A, not in B */                                             \
    X(EXTRA, "extra op")          /* in B, not in A */                                             \
    X(REORDERED, "reordered ops") /* the same ops in another order */                              \
    X(RESIZED, "resized op")      /* same op, other bytes or count */                              \
    X(DTYPE, "changed dtype")     /* same op, other dtype */                                       \
    X(CHANGED, "changed op")      /* another op in its place */

typedef enum {
#define FSDP_TRACE_DIV_ENUM_(name, str) FSDP_TRACE_DIV_##name,
    FSDP_FOREACH_TRACE_DIVERGENCE(FSDP_TRACE_DIV_ENUM_)
#undef FSDP_TRACE_DIV_ENUM_
        FSDP_TRACE_DIV_COUNT
} fsdp_trace_divergence_t;

typedef struct fsdp_trace_diff {
    fsdp_trace_divergence_t what; /* the first structural divergence; NONE if identical */
    int rank;                     /* where it is (-1 for a run-level difference) */
    char stream[64];              /* "" for host events or the rank's issue order */
    int64_t seq_a, seq_b;         /* the diverging events' sequence numbers, -1 where none */
    int ranks_diverging;          /* how many ranks differ structurally */
    char message[512];            /* one line saying what differs */
} fsdp_trace_diff_t;

/* Compares run_a of path_a with run_b of path_b (runs as fsdp_trace_reader_find_run; when the
 * paths are equal and both runs are 0, the previous run against the latest). Structure first:
 * per rank and stream, events aligned by sequence, compared by kind, name, unit, group, bytes,
 * count and dtype; then each rank's issue order across streams. The report written to `out`
 * (may be NULL) gives the first divergence with a few events of context, then timing and memory
 * ratios (B / A) per kind and per unit. */
FSDP_API fsdp_status_t fsdp_trace_diff(const char *path_a, int64_t run_a, const char *path_b,
                                       int64_t run_b, FILE *out, fsdp_trace_diff_t *result_p);

/* Chrome trace JSON for Perfetto (docs/formats.md section 4): one process per rank, one thread per
 * stream plus a host thread, memory as counter tracks, timestamps in microseconds. */
FSDP_API fsdp_status_t fsdp_trace_export_chrome(const char *path, int64_t run,
                                                const char *out_path);

/* What fsdp_trace_plot_svg_ex draws. */
typedef struct fsdp_trace_plot_options {
    int max_ranks;                 /* ranks drawn, from rank 0 (default 8) */
    int64_t first_step, last_step; /* a window of steps, inclusive, as the steps table numbers
                                      them: per rank, the events after the row of the step
                                      before first_step up to the row of last_step (default
                                      -1, -1: no step window) */
    double start_time, end_time;   /* a window of time, seconds (default 0, 0: none) */
} fsdp_trace_plot_options_t;

FSDP_API void fsdp_trace_plot_options_init(fsdp_trace_plot_options_t *opts);

/* An SVG picture: per rank, memory over time stacked by category (reserved as a dashed line)
 * and a timeline per stream, on a time axis with ticks at round values and a memory axis with
 * ticks in binary units. A window (of steps or of time, not both) draws only its events, memory
 * starting from what the events before it left; a step window names steps the run has. opts may
 * be NULL (the defaults). */
FSDP_API fsdp_status_t fsdp_trace_plot_svg_ex(const char *path, int64_t run,
                                              const fsdp_trace_plot_options_t *opts,
                                              const char *out_path);

#ifdef __cplusplus
}
#endif
#endif
