/* The trace writer's own types, shared by its three files: what a rank's thread emits into
 * (writer_rank.c), what the writer thread inserts into SQLite (writer_thread.c), and the
 * trace's open, flush and close (writer.c). The design is described in writer.c. Nothing here
 * is installed. */
#ifndef FSDP_TRACE_WRITER_H
#define FSDP_TRACE_WRITER_H

#include "io/lock.h"
#include "trace/trace_int.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define TRACE_CHUNK_EVENTS 256
#define TRACE_CHUNK_ARENA (16u * 1024u)
#define TRACE_NO_STR UINT32_MAX
#define TRACE_INSERT_ROWS 16 /* rows per INSERT: 1 + 16 x 15 parameters, under SQLite's 999 */
/* Chunks kept for reuse instead of freed (bounds the idle memory of a big world). */
#define TRACE_FREE_CHUNKS_MAX 256
/* Warn once when this many chunks wait for the writer (the writer cannot keep up). */
#define TRACE_QUEUE_WARN 16384
/* After the first chunk of a batch arrives, the writer waits this long (or for this many
 * chunks) before it commits, so the step boundaries of all ranks, which come close together,
 * share one commit: a commit costs far more than a row. A flush does not wait. */
#define TRACE_BATCH_DELAY_NS 2000000
#define TRACE_BATCH_CHUNKS 64
/* The writer's nice value: on a machine the ranks keep busy, it yields to them and catches up
 * while they wait, instead of stretching their steps. */
#define TRACE_WRITER_NICE 10

typedef struct trace_rec {
    uint64_t seq;
    double host_time, start, end;
    uint64_t bytes, count, allocated, reserved;
    uint32_t name, unit, stream, group; /* arena offsets or TRACE_NO_STR */
    int32_t kind, dtype;
} trace_rec_t;

typedef struct trace_step_rec {
    int64_t step;
    double loss, step_time;
    uint64_t seq_end;
    uint64_t peak_allocated, peak_reserved;
    uint64_t peak[FSDP_MEM_CATEGORY_COUNT], at_peak[FSDP_MEM_CATEGORY_COUNT];
} trace_step_rec_t;

/* The writer's copy of the strings table: text -> id, open addressing. */
typedef struct trace_str {
    uint64_t hash;
    int64_t id; /* 0: an empty slot */
    char *text;
} trace_str_t;

typedef struct trace_chunk {
    struct trace_chunk *next;
    int rank;
    int n;        /* records used */
    int has_step; /* the chunk ends a step: `step` is valid */
    int n_timed;  /* records whose device times are still to be resolved */
    uint32_t arena_used;
    const struct fsdp_trace_rank *rank_row; /* the rank's row of the ranks table, or NULL */
    trace_step_rec_t step;
    trace_rec_t recs[TRACE_CHUNK_EVENTS];
    fsdp_trace_timing_t *timing[TRACE_CHUNK_EVENTS]; /* valid for i < n; NULL: times known */
    char arena[TRACE_CHUNK_ARENA];
} trace_chunk_t;

struct fsdp_trace_rank {
    fsdp_trace_t *trace;
    int rank;
    int attached;         /* under trace->lock */
    pthread_mutex_t lock; /* guards cur and seq: the rank's thread, or a flush */
    uint64_t seq;
    trace_chunk_t *cur;
    const char *unit;                 /* the rank's own thread only */
    const fsdp_mem_pool_stats_t *mem; /* live allocator counters; the rank's own thread only */
    /* the ranks table's row, set at the first attach and read by the writer from the chunk
     * that carries it (row_pending: not handed over yet; under lock) */
    int stands_for;
    char *members;
    int row_pending;
};

struct fsdp_trace {
    char *path;
    fsdp_lock_t *file_lock; /* path.lock: one writing run at a time (NULL: not lockable) */
    sqlite3 *db;
    int64_t run_id;
    sqlite3_stmt *ins_event, *ins_events, *ins_step; /* one row, TRACE_INSERT_ROWS rows */
    sqlite3_stmt *ins_rank;
    sqlite3_stmt *ins_str, *sel_str;
    /* the writer thread's own: interned texts, and the ids of the kinds and dtypes (0: not
     * looked up yet) */
    trace_str_t *strs;
    size_t n_strs, cap_strs;
    int64_t kind_id[FSDP_EV_KIND_COUNT], dtype_id[FSDP_DTYPE_COUNT], invalid_kind_id;
    /* the writer thread's own: its first failing SQLite call, for the one line it prints */
    int fail_rc, fail_errno;
    char fail_msg[160];

    pthread_mutex_t lock; /* everything below */
    pthread_cond_t work;  /* the writer waits for chunks */
    pthread_cond_t done;  /* flushers wait for the writer */
    trace_chunk_t *head, *tail;
    size_t queued;
    uint64_t submitted, written; /* chunks */
    trace_chunk_t *free_list;
    size_t n_free;
    int stop;
    int flushing; /* threads waiting in fsdp_trace_flush */
    int warned_queue;
    fsdp_status_t error; /* the writer's first error */
    uint64_t n_events, n_steps, n_commits, n_dropped;
    fsdp_trace_rank_t **ranks;
    int n_ranks;
    int64_t *rank_step; /* per rank of the run: its last step row committed, -1 before one */
    int world;

    pthread_t writer;
};

/* writer_thread.c: the writer thread's body (pthread_create's start routine, arg the trace):
 * takes the queue a batch at a time and commits it, until the trace stops and the queue is
 * empty. */
void *fsdp_trace_writer_main(void *arg);

/* writer_rank.c: with r->lock held, queues the rank's current chunk (if it holds anything) and,
 * when `replace`, gives the rank a fresh one; returns 0 if no memory was left for it. */
int fsdp_trace_rank_handover(fsdp_trace_rank_t *r, int replace);

#endif
