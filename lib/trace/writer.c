/* The trace writer: its design, and the trace's open, flush and close.
 *
 * Rank threads never wait on SQLite. fsdp_trace_emit copies an event into the rank's current
 * chunk (a fixed array of records plus an arena for their strings) under the rank's own mutex,
 * which only a flush from another thread ever contends. A full chunk, or the chunk of a step
 * boundary, goes onto a queue under the trace's mutex (a pointer swap, nothing more), and one
 * writer thread takes the whole queue at once and inserts it in one transaction through prepared
 * statements. A chunk that carries a step row ends that rank's step, so every step is committed
 * together with all of its events, in the rank's order: a run killed at any point leaves a
 * database holding every step whose commit record reached the WAL (docs/formats.md section 5).
 *
 * Sequence numbers are per rank and counted at emission, so two identical runs write identical
 * rows whatever the threads' timing.
 */
#include "trace/writer.h"

#include <fsdp/log.h>
#include <fsdp/version.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- Open, flush, close (the rank side: writer_rank.c; the writer thread: writer_thread.c) -- */

int64_t fsdp_trace_run_id(const fsdp_trace_t *t)
{
    return t != NULL ? t->run_id : 0;
}

static void bind_opt_text(sqlite3_stmt *st, int col, const char *s)
{
    if (s != NULL)
        sqlite3_bind_text(st, col, s, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(st, col);
}

static fsdp_status_t trace_insert_run(fsdp_trace_t *t, const fsdp_trace_run_info_t *info)
{
    static const fsdp_trace_run_info_t no_info = {NULL, 0, NULL, NULL, NULL, NULL};
    sqlite3_stmt *st;
    fsdp_status_t status;
    char created[40];
    struct timespec now;
    struct tm tm;

    if (info == NULL)
        info = &no_info;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    strftime(created, sizeof(created), "%Y-%m-%dT%H:%M:%SZ", &tm);
    status = fsdp_trace_db_prepare(t->db,
                                   "INSERT INTO runs (created, backend, world_size, strategy, "
                                   "config, profile, version, command_line, finished) "
                                   "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 0)",
                                   &st);
    if (status != FSDP_OK)
        return status;
    sqlite3_bind_text(st, 1, created, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, info->backend != NULL ? info->backend : "unknown", -1,
                      SQLITE_TRANSIENT);
    sqlite3_bind_int(st, 3, info->world_size);
    bind_opt_text(st, 4, info->strategy);
    bind_opt_text(st, 5, info->config_json);
    bind_opt_text(st, 6, info->profile_json);
    sqlite3_bind_text(st, 7, fsdp_version_string(), -1, SQLITE_STATIC);
    bind_opt_text(st, 8, info->command_line);
    status = FSDP_SQLITE_CALL(t->db, sqlite3_step(st));
    sqlite3_finalize(st);
    if (status == FSDP_OK)
        t->run_id = sqlite3_last_insert_rowid(t->db);
    return status;
}

static fsdp_status_t trace_prepare(fsdp_trace_t *t)
{
    char sql[1024];
    size_t len;
    fsdp_status_t status;

    status = fsdp_trace_db_prepare_event_insert(t->db, 1, &t->ins_event);
    if (status == FSDP_OK)
        status = fsdp_trace_db_prepare_event_insert(t->db, TRACE_INSERT_ROWS, &t->ins_events);
    if (status != FSDP_OK)
        return status;
    /* A rank that repeats a step number (attached twice) keeps its latest row. */
    len = (size_t)snprintf(sql, sizeof(sql),
                           "INSERT OR REPLACE INTO steps (run, " FSDP_TRACE_STEP_COLUMNS
                           ") VALUES (?1");
    for (int i = 0; i < FSDP_TRACE_STEP_NCOLS && len < sizeof(sql); i++)
        len += (size_t)snprintf(sql + len, sizeof(sql) - len, ", ?%d", i + 2);
    if (len + 2 >= sizeof(sql))
        return FSDP_ERR_INTERNAL;
    strcat(sql, ")");
    status = fsdp_trace_db_prepare(t->db, sql, &t->ins_step);
    if (status == FSDP_OK)
        status = fsdp_trace_db_prepare(t->db,
                                       "INSERT OR REPLACE INTO ranks (run, rank, stands_for, "
                                       "members) VALUES (?1, ?2, ?3, ?4)",
                                       &t->ins_rank);
    if (status == FSDP_OK)
        status = fsdp_trace_db_prepare(t->db, "INSERT OR IGNORE INTO strings (text) VALUES (?1)",
                                       &t->ins_str);
    if (status == FSDP_OK)
        status =
            fsdp_trace_db_prepare(t->db, "SELECT id FROM strings WHERE text = ?1", &t->sel_str);
    if (status != FSDP_OK)
        return status;
    sqlite3_bind_int64(t->ins_event, 1, t->run_id);
    sqlite3_bind_int64(t->ins_events, 1, t->run_id);
    sqlite3_bind_int64(t->ins_step, 1, t->run_id);
    sqlite3_bind_int64(t->ins_rank, 1, t->run_id);
    return FSDP_OK;
}

static void trace_free(fsdp_trace_t *t)
{
    trace_chunk_t *c, *next;

    for (c = t->free_list; c != NULL; c = next) {
        next = c->next;
        free(c);
    }
    for (c = t->head; c != NULL; c = next) {
        next = c->next;
        free(c);
    }
    for (int i = 0; i < t->n_ranks; i++) {
        if (t->ranks[i] == NULL)
            continue;
        free(t->ranks[i]->cur);
        free(t->ranks[i]->members);
        pthread_mutex_destroy(&t->ranks[i]->lock);
        free(t->ranks[i]);
    }
    free(t->ranks);
    free(t->rank_step);
    sqlite3_finalize(t->ins_event);
    sqlite3_finalize(t->ins_events);
    sqlite3_finalize(t->ins_step);
    sqlite3_finalize(t->ins_rank);
    sqlite3_finalize(t->ins_str);
    sqlite3_finalize(t->sel_str);
    for (size_t i = 0; i < t->cap_strs; i++)
        free(t->strs[i].text);
    free(t->strs);
    sqlite3_close(t->db);
    fsdp_lock_release(t->file_lock);
    free(t->path);
    free(t);
}

/* The writer's batching deadline is an interval: a monotonic clock keeps it immune to clock
 * steps. */
static int trace_cond_init_monotonic(pthread_cond_t *cond)
{
    pthread_condattr_t attr;
    int rc = pthread_condattr_init(&attr);

    if (rc != 0)
        return rc;
    rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(cond, &attr);
    pthread_condattr_destroy(&attr);
    return rc;
}

/* One writing run per trace, refused here: two would interleave their rows, and SQLite would
 * answer one of them "database is locked" at some later step. */
static fsdp_status_t trace_lock(fsdp_trace_t *t)
{
    size_t len = strlen(t->path);
    char *lock_path, *what;
    fsdp_status_t status;

    if (len == 0)
        return FSDP_OK; /* refused by the open */
    lock_path = malloc(len + sizeof(".lock"));
    what = malloc(len + sizeof("trace ''"));
    if (lock_path == NULL || what == NULL) {
        free(lock_path);
        free(what);
        fsdp_error("fsdp_trace_open: out of host memory");
        return FSDP_ERR_NO_MEMORY;
    }
    sprintf(lock_path, "%s.lock", t->path);
    sprintf(what, "trace '%s'", t->path);
    status = fsdp_lock_take(lock_path, what, FSDP_LOCK_IF_WRITABLE, &t->file_lock);
    free(lock_path);
    free(what);
    return status;
}

fsdp_status_t fsdp_trace_open(const char *path, const fsdp_trace_run_info_t *info,
                              fsdp_trace_t **trace_p)
{
    fsdp_trace_t *t;
    fsdp_status_t status;
    int rc;

    if (trace_p == NULL) {
        fsdp_error("fsdp_trace_open: trace_p is NULL");
        return FSDP_ERR_INVALID_PARAM;
    }
    t = calloc(1, sizeof(*t));
    if (t == NULL || (t->path = strdup(path != NULL ? path : "")) == NULL) {
        free(t);
        fsdp_error("fsdp_trace_open: out of host memory");
        return FSDP_ERR_NO_MEMORY;
    }
    t->world = info != NULL && info->world_size > 0 && info->world_size <= FSDP_TRACE_MAX_RANKS
                   ? info->world_size
                   : 1;
    t->rank_step = malloc((size_t)t->world * sizeof(*t->rank_step));
    if (t->rank_step == NULL) {
        status = FSDP_ERR_NO_MEMORY;
        fsdp_error("fsdp_trace_open: out of host memory");
        goto err_free;
    }
    for (int r = 0; r < t->world; r++)
        t->rank_step[r] = -1;
    status = trace_lock(t);
    if (status != FSDP_OK)
        goto err_free;
    status = fsdp_trace_db_open(path, 1, &t->db);
    if (status != FSDP_OK)
        goto err_free;
    status = trace_insert_run(t, info);
    if (status != FSDP_OK)
        goto err_free;
    status = trace_prepare(t);
    if (status != FSDP_OK)
        goto err_free;
    if (pthread_mutex_init(&t->lock, NULL) != 0)
        goto err_no_memory;
    if (trace_cond_init_monotonic(&t->work) != 0)
        goto err_destroy_lock;
    if (pthread_cond_init(&t->done, NULL) != 0)
        goto err_destroy_work;
    rc = pthread_create(&t->writer, NULL, fsdp_trace_writer_main, t);
    if (rc != 0) {
        fsdp_error("trace '%s': cannot start the writer thread: %s", path, strerror(rc));
        status = FSDP_ERR_NO_MEMORY;
        goto err_destroy_done;
    }
    *trace_p = t;
    return FSDP_OK;

err_destroy_done:
    pthread_cond_destroy(&t->done);
err_destroy_work:
    pthread_cond_destroy(&t->work);
err_destroy_lock:
    pthread_mutex_destroy(&t->lock);
err_no_memory:
    if (status == FSDP_OK) {
        fsdp_error("fsdp_trace_open: out of host memory");
        status = FSDP_ERR_NO_MEMORY;
    }
err_free:
    trace_free(t);
    return status;
}

fsdp_status_t fsdp_trace_flush(fsdp_trace_t *t)
{
    fsdp_status_t status;
    uint64_t target;
    int n;

    if (t == NULL)
        return FSDP_OK;
    /* The rank table only grows, under t->lock; a rank struct lives as long as the trace. */
    pthread_mutex_lock(&t->lock);
    n = t->n_ranks;
    pthread_mutex_unlock(&t->lock);
    for (int i = 0; i < n; i++) {
        fsdp_trace_rank_t *r;
        pthread_mutex_lock(&t->lock);
        r = t->ranks[i];
        pthread_mutex_unlock(&t->lock);
        if (r == NULL)
            continue;
        pthread_mutex_lock(&r->lock);
        fsdp_trace_rank_handover(r, 0);
        pthread_mutex_unlock(&r->lock);
    }
    pthread_mutex_lock(&t->lock);
    target = t->submitted;
    t->flushing++;
    pthread_cond_signal(&t->work); /* a writer holding a batch open commits it now */
    while (t->written < target)
        pthread_cond_wait(&t->done, &t->lock);
    t->flushing--;
    status = t->error;
    pthread_mutex_unlock(&t->lock);
    return status;
}

void fsdp_trace_get_stats(fsdp_trace_t *t, fsdp_trace_stats_t *stats_p)
{
    clockid_t cid;
    struct timespec ts;

    memset(stats_p, 0, sizeof(*stats_p));
    if (t == NULL)
        return;
    pthread_mutex_lock(&t->lock);
    stats_p->events = t->n_events;
    stats_p->steps = t->n_steps;
    stats_p->commits = t->n_commits;
    stats_p->dropped = t->n_dropped;
    pthread_mutex_unlock(&t->lock);
    if (pthread_getcpuclockid(t->writer, &cid) == 0 && clock_gettime(cid, &ts) == 0)
        stats_p->writer_cpu_s = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

fsdp_status_t fsdp_trace_status(fsdp_trace_t *t)
{
    fsdp_status_t status;

    if (t == NULL)
        return FSDP_OK;
    pthread_mutex_lock(&t->lock);
    status = t->error;
    pthread_mutex_unlock(&t->lock);
    return status;
}

int64_t fsdp_trace_committed_step(fsdp_trace_t *t)
{
    int64_t step = INT64_MAX;

    if (t == NULL)
        return -1;
    pthread_mutex_lock(&t->lock);
    /* the ranks attached here: a process of a multi-process job traces its own */
    for (int r = 0; r < t->n_ranks && r < t->world; r++)
        if (t->ranks[r] != NULL)
            step = t->rank_step[r] < step ? t->rank_step[r] : step;
    pthread_mutex_unlock(&t->lock);
    return step == INT64_MAX ? -1 : step;
}

fsdp_status_t fsdp_trace_close(fsdp_trace_t *t)
{
    fsdp_status_t status;
    sqlite3_stmt *st;

    if (t == NULL)
        return FSDP_OK;
    fsdp_trace_flush(t);
    pthread_mutex_lock(&t->lock);
    t->stop = 1;
    pthread_cond_signal(&t->work);
    pthread_mutex_unlock(&t->lock);
    pthread_join(t->writer, NULL);
    status = t->error;

    /* a trace whose writer stopped is not marked finished: it lacks the run's end (and its
     * file system may have no room for even this row) */
    if (status != FSDP_OK) {
    } else if (fsdp_trace_db_prepare(t->db, "UPDATE runs SET finished = 1 WHERE id = ?1", &st) ==
               FSDP_OK) {
        sqlite3_bind_int64(st, 1, t->run_id);
        fsdp_status_t s = FSDP_SQLITE_CALL(t->db, sqlite3_step(st));
        if (status == FSDP_OK)
            status = s;
        sqlite3_finalize(st);
    } else {
        status = FSDP_ERR_IO;
    }
    pthread_cond_destroy(&t->done);
    pthread_cond_destroy(&t->work);
    pthread_mutex_destroy(&t->lock);
    trace_free(t);
    return status;
}
