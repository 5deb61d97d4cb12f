/* Internals shared by the trace writer, reader and tools (lib/trace*.c): the SQLite boundary
 * and small helpers. Nothing here is installed; no SQLite type reaches include/. */
#ifndef FSDP_TRACE_INT_H
#define FSDP_TRACE_INT_H

#include "trace/trace_hidden.h"

#include <fsdp/backend/trace.h>
#include <fsdp/trace.h>

#include <sqlite3.h>
#include <stddef.h>

/* db.c: converts an SQLite result code at the boundary: SQLITE_OK, SQLITE_ROW and SQLITE_DONE are
 * FSDP_OK; anything else is logged once, with the failing call and SQLite's own message, and
 * mapped to an fsdp_status_t. `db` may be NULL. */
#define FSDP_SQLITE_CALL(db, call)                                                                 \
    fsdp_sqlite_status((db), (call), #call, __FILE__, __LINE__, __func__)

fsdp_status_t fsdp_sqlite_status(sqlite3 *db, int rc, const char *what, const char *file, int line,
                                 const char *func);
/* The fsdp_status_t of an SQLite result code, logging nothing. */
fsdp_status_t fsdp_sqlite_map(int rc);

/* db_open.c: opens `path` for the trace module: read-only (the file must exist) or read-write
 * (created if missing), with a busy timeout, and checks its schema version. Writable: WAL and
 * synchronous=NORMAL, the schema created when older. Read-only: the tables must exist. */
fsdp_status_t fsdp_trace_db_open(const char *path, int writable, sqlite3 **db_p);

/* db.c: runs a statement without results. */
fsdp_status_t fsdp_trace_db_exec(sqlite3 *db, const char *sql);

/* A prepared statement, logged on failure. */
fsdp_status_t fsdp_trace_db_prepare(sqlite3 *db, const char *sql, sqlite3_stmt **stmt_p);
/* The writer's insert of `rows` events at once (FSDP_TRACE_EVENT_COLUMNS after the run): the run
 * is ?1, row r's columns are ?(2 + 15 r) .. ?(16 + 15 r). */
fsdp_status_t fsdp_trace_db_prepare_event_insert(sqlite3 *db, int rows, sqlite3_stmt **stmt_p);

/* Column text or NULL. */
static inline const char *fsdp_trace_col_text(sqlite3_stmt *st, int col)
{
    return (const char *)sqlite3_column_text(st, col);
}

/* read.c: the reader's connection (for the tools in lib/). */
sqlite3 *fsdp_trace_reader_db(fsdp_trace_reader_t *reader);
const char *fsdp_trace_reader_path(const fsdp_trace_reader_t *reader);

/* db_runs.c: resolves a run id as fsdp_trace_reader_find_run does. */
fsdp_status_t fsdp_trace_db_find_run(sqlite3 *db, const char *path, int64_t run, int64_t *run_p);

/* Readers accept runs of at most this many ranks: as many as a world may have. */
#define FSDP_TRACE_MAX_RANKS FSDP_MAX_WORLD

/* The number of ranks a run has: its world_size, checked to be in [1, FSDP_TRACE_MAX_RANKS]
 * with every event and step row's rank in [0, world_size); else one line naming the file and
 * the field, and FSDP_ERR_FORMAT. */
fsdp_status_t fsdp_trace_db_num_ranks(sqlite3 *db, const char *path, int64_t run, int *n_p);

/* The lowest rank above `after` that has events or step rows in the run, or -1: readers visit
 * the ranks present, not every rank up to the highest. */
fsdp_status_t fsdp_trace_db_next_rank(sqlite3 *db, const char *path, int64_t run, int after,
                                      int *rank_p);

/* What a traced rank stands for (the ranks table): stands_for 0 when the run has no row for
 * the rank (a file older than version 3, or a rank not traced), members set only when
 * stands_for > 1. */
typedef struct fsdp_trace_rank_class {
    int stands_for;
    char *members;
} fsdp_trace_rank_class_t;

/* nranks entries (fsdp_trace_db_num_ranks), freed with fsdp_trace_rank_classes_free;
 * *symmetric_p = 1 when some rank stands for others. */
fsdp_status_t fsdp_trace_db_rank_classes(sqlite3 *db, int64_t run, int nranks,
                                         fsdp_trace_rank_class_t **classes_p, int *symmetric_p);
void fsdp_trace_rank_classes_free(fsdp_trace_rank_class_t *classes, int nranks);

/* 1 when the file has a ranks table (version 3 and up), else 0. */
int fsdp_trace_db_has_ranks(sqlite3 *db);

/* Which traced rank's events stand for each of the world's ranks: rep[r] (world entries) is
 * the rank of the run whose ranks-table members list r (a symmetric plan's simulated rank
 * standing for its class), r itself for a rank with events or step rows and no such row, or
 * -1 for a rank nothing in the run stands for. *traced_p: the ranks with events or rows of
 * their own (may be NULL). A members list that does not parse, names a rank outside the world,
 * disagrees with its count or claims a rank another row claims is FSDP_ERR_FORMAT, with one
 * line naming the file. */
fsdp_status_t fsdp_trace_db_represent(sqlite3 *db, const char *path, int64_t run, int world,
                                      int *rep, int *traced_p);

/* The characters of a class's members a label shows. */
#define FSDP_TRACE_MEMBERS_SHOWN 40
/* "rank 3", or "rank 0 (stands for 7 ranks: 0-6)" for a rank that stands for others; classes may
 * be NULL. buf: at least 96 bytes for the whole label. */
const char *fsdp_trace_rank_label(const fsdp_trace_rank_class_t *classes, int rank, char *buf,
                                  size_t size);

/* Step-row column names from the category table ("peak_sharded_param", ...). */
#define FSDP_TRACE_PEAK_COL_(name, str) ", peak_" str
#define FSDP_TRACE_AT_PEAK_COL_(name, str) ", at_peak_" str
#define FSDP_TRACE_STEP_COLUMNS                                                                    \
    "rank, step, loss, step_time, seq_end, peak_allocated, "                                       \
    "peak_reserved" FSDP_FOREACH_MEM_CATEGORY(FSDP_TRACE_PEAK_COL_)                                \
        FSDP_FOREACH_MEM_CATEGORY(FSDP_TRACE_AT_PEAK_COL_)
#define FSDP_TRACE_STEP_NCOLS (7 + 2 * FSDP_MEM_CATEGORY_COUNT)

#define FSDP_TRACE_EVENT_COLUMNS                                                                   \
    "rank, seq, kind, name, unit, stream, host_time, start_time, end_time, bytes, count, dtype, "  \
    "grp, allocated, reserved"
#define FSDP_TRACE_EVENT_NCOLS 15

/* db_rows.c: fills *ev (and rank, seq) from a row selected with FSDP_TRACE_EVENT_COLUMNS starting
 * at column 0. The strings point into the statement's row. */
void fsdp_trace_row_event(sqlite3_stmt *st, int *rank_p, uint64_t *seq_p, fsdp_trace_event_t *ev);

/* Fills a step row selected with FSDP_TRACE_STEP_COLUMNS starting at column 0. */
void fsdp_trace_row_step(sqlite3_stmt *st, fsdp_trace_step_row_t *row);

#endif
