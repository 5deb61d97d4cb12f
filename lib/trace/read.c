/* Reading a trace database: runs, events and step rows, each through a callback so a run of any
 * size streams through in (rank, seq) order without being held in memory. */
#include "trace/trace_int.h"

#include <fsdp/log.h>

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

struct fsdp_trace_reader {
    char *path;
    sqlite3 *db;
    sqlite3_stmt *run_row; /* keeps the strings of the last fsdp_trace_reader_run alive */
};

fsdp_status_t fsdp_trace_reader_open(const char *path, fsdp_trace_reader_t **reader_p)
{
    fsdp_trace_reader_t *r;
    fsdp_status_t status;

    if (reader_p == NULL) {
        fsdp_error("fsdp_trace_reader_open: reader_p is NULL");
        return FSDP_ERR_INVALID_PARAM;
    }
    r = calloc(1, sizeof(*r));
    if (r == NULL || path == NULL || (r->path = strdup(path)) == NULL) {
        free(r);
        if (path == NULL) {
            fsdp_error("fsdp_trace_reader_open: path is NULL");
            return FSDP_ERR_INVALID_PARAM;
        }
        fsdp_error("fsdp_trace_reader_open: out of host memory");
        return FSDP_ERR_NO_MEMORY;
    }
    status = fsdp_trace_db_open(path, 0, &r->db);
    if (status != FSDP_OK) {
        free(r->path);
        free(r);
        return status;
    }
    *reader_p = r;
    return FSDP_OK;
}

void fsdp_trace_reader_close(fsdp_trace_reader_t *r)
{
    if (r == NULL)
        return;
    sqlite3_finalize(r->run_row);
    sqlite3_close(r->db);
    free(r->path);
    free(r);
}

sqlite3 *fsdp_trace_reader_db(fsdp_trace_reader_t *r)
{
    return r->db;
}

const char *fsdp_trace_reader_path(const fsdp_trace_reader_t *r)
{
    return r->path;
}

fsdp_status_t fsdp_trace_reader_find_run(fsdp_trace_reader_t *r, int64_t run, int64_t *run_p)
{
    return fsdp_trace_db_find_run(r->db, r->path, run, run_p);
}

fsdp_status_t fsdp_trace_reader_represent(fsdp_trace_reader_t *r, int64_t run, int *rep,
                                          int *traced_p)
{
    fsdp_status_t status;
    int world;

    if (r == NULL || rep == NULL) {
        fsdp_error("fsdp_trace_reader_represent: a NULL argument");
        return FSDP_ERR_INVALID_PARAM;
    }
    status = fsdp_trace_db_num_ranks(r->db, r->path, run, &world);
    if (status != FSDP_OK)
        return status;
    return fsdp_trace_db_represent(r->db, r->path, run, world, rep, traced_p);
}

fsdp_status_t fsdp_trace_reader_run(fsdp_trace_reader_t *r, int64_t run,
                                    fsdp_trace_run_row_t *row_p)
{
    fsdp_status_t status;
    sqlite3_stmt *st;
    int rc;

    sqlite3_finalize(r->run_row);
    r->run_row = NULL;
    status = fsdp_trace_db_prepare(r->db,
                                   "SELECT id, created, backend, world_size, strategy, config, "
                                   "profile, version, command_line, finished FROM runs "
                                   "WHERE id = ?1",
                                   &st);
    if (status != FSDP_OK)
        return status;
    sqlite3_bind_int64(st, 1, run);
    rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        status = FSDP_SQLITE_CALL(r->db, rc);
        sqlite3_finalize(st);
        if (status == FSDP_OK) {
            fsdp_error("trace database '%s' has no run %" PRId64, r->path, run);
            status = FSDP_ERR_NOT_FOUND;
        }
        return status;
    }
    /* world_size and every row's rank checked once, here, for every reader */
    status = fsdp_trace_db_num_ranks(r->db, r->path, run, &row_p->world_size);
    if (status != FSDP_OK) {
        sqlite3_finalize(st);
        return status;
    }
    row_p->id = sqlite3_column_int64(st, 0);
    row_p->created = fsdp_trace_col_text(st, 1);
    row_p->backend = fsdp_trace_col_text(st, 2);
    row_p->strategy = fsdp_trace_col_text(st, 4);
    row_p->config_json = fsdp_trace_col_text(st, 5);
    row_p->profile_json = fsdp_trace_col_text(st, 6);
    row_p->version = fsdp_trace_col_text(st, 7);
    row_p->command_line = fsdp_trace_col_text(st, 8);
    row_p->finished = sqlite3_column_int(st, 9);
    r->run_row = st;
    return FSDP_OK;
}

fsdp_status_t fsdp_trace_reader_events(fsdp_trace_reader_t *r, int64_t run, int rank,
                                       fsdp_trace_event_func_t func, void *arg)
{
    fsdp_status_t status;
    sqlite3_stmt *st;
    int rc;

    status = fsdp_trace_db_prepare(
        r->db,
        rank >= 0 ? "SELECT " FSDP_TRACE_EVENT_COLUMNS " FROM events WHERE run = ?1 AND rank = ?2 "
                    "ORDER BY seq"
                  : "SELECT " FSDP_TRACE_EVENT_COLUMNS " FROM events WHERE run = ?1 "
                    "ORDER BY rank, seq",
        &st);
    if (status != FSDP_OK)
        return status;
    sqlite3_bind_int64(st, 1, run);
    if (rank >= 0)
        sqlite3_bind_int(st, 2, rank);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        fsdp_trace_event_t ev;
        uint64_t seq;
        int ev_rank;
        fsdp_trace_row_event(st, &ev_rank, &seq, &ev);
        if (func(arg, ev_rank, seq, &ev) != 0) {
            rc = SQLITE_DONE;
            break;
        }
    }
    status = FSDP_SQLITE_CALL(r->db, rc);
    sqlite3_finalize(st);
    return status;
}

fsdp_status_t fsdp_trace_reader_steps(fsdp_trace_reader_t *r, int64_t run, int rank,
                                      fsdp_trace_step_func_t func, void *arg)
{
    fsdp_status_t status;
    sqlite3_stmt *st;
    int rc;

    status = fsdp_trace_db_prepare(
        r->db,
        rank >= 0 ? "SELECT " FSDP_TRACE_STEP_COLUMNS " FROM steps WHERE run = ?1 AND rank = ?2 "
                    "ORDER BY step"
                  : "SELECT " FSDP_TRACE_STEP_COLUMNS " FROM steps WHERE run = ?1 "
                    "ORDER BY rank, step",
        &st);
    if (status != FSDP_OK)
        return status;
    sqlite3_bind_int64(st, 1, run);
    if (rank >= 0)
        sqlite3_bind_int(st, 2, rank);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        fsdp_trace_step_row_t row;
        fsdp_trace_row_step(st, &row);
        if (func(arg, &row) != 0) {
            rc = SQLITE_DONE;
            break;
        }
    }
    status = FSDP_SQLITE_CALL(r->db, rc);
    sqlite3_finalize(st);
    return status;
}
