/* The trace writer's thread (writer.h): the only one that touches SQLite while the run goes
 * on. It interns strings, binds each chunk's records into multi-row INSERTs and commits a batch
 * of chunks per transaction; its first failure is kept, said once, and stops the writing. */
#include "trace/writer.h"

#include <fsdp/log.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__linux__)
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* The status of one of the writer's SQLite calls. A failure is not logged here: its code,
 * message and errno are kept for the one line the writer prints when it stops. */
static fsdp_status_t writer_rc(fsdp_trace_t *t, int rc)
{
    fsdp_status_t status = fsdp_sqlite_map(rc);

    if (status != FSDP_OK && t->fail_rc == SQLITE_OK) {
        t->fail_rc = rc;
#if SQLITE_VERSION_NUMBER >= 3012000
        t->fail_errno = sqlite3_system_errno(t->db);
#endif
        snprintf(t->fail_msg, sizeof(t->fail_msg), "%s", sqlite3_errmsg(t->db));
    }
    return status;
}

/* Says, once, why the writer stopped and which steps the database holds. Under t->lock. */
static void writer_stopped(fsdp_trace_t *t, fsdp_status_t status)
{
    int64_t upto = INT64_MAX;
    char why[256];

    if ((t->fail_rc & 0xff) == SQLITE_FULL || t->fail_errno == ENOSPC)
        snprintf(why, sizeof(why), "no space left on device");
    else if (t->fail_rc != SQLITE_OK && t->fail_errno != 0)
        snprintf(why, sizeof(why), "writing failed: %s (%s)", t->fail_msg, strerror(t->fail_errno));
    else if (t->fail_rc != SQLITE_OK)
        snprintf(why, sizeof(why), "writing failed: %s", t->fail_msg);
    else
        snprintf(why, sizeof(why), "writing failed: %s", fsdp_status_string(status));
    for (int r = 0; r < t->n_ranks && r < t->world; r++)
        if (t->ranks[r] != NULL && t->rank_step[r] < upto)
            upto = t->rank_step[r];
    if (upto == INT64_MAX || upto < 0)
        fsdp_error("trace '%s': %s: tracing stopped before any step was committed; the run's "
                   "events are dropped, the run goes on",
                   t->path, why);
    else
        fsdp_error("trace '%s': %s: tracing stopped; the database holds every step up to %" PRId64
                   ", later events are dropped, the run goes on",
                   t->path, why, upto);
}

static uint64_t str_hash(const char *s)
{
    uint64_t h = 14695981039346656037ull; /* FNV-1a */

    for (; *s != '\0'; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

/* The slot of `text` in the table, or the empty slot where it goes. */
static trace_str_t *str_slot(const fsdp_trace_t *t, const char *text, uint64_t h)
{
    size_t mask = t->cap_strs - 1, i = (size_t)h & mask;

    while (t->strs[i].id != 0 && (t->strs[i].hash != h || strcmp(t->strs[i].text, text) != 0))
        i = (i + 1) & mask;
    return &t->strs[i];
}

static fsdp_status_t str_grow(fsdp_trace_t *t)
{
    size_t cap = t->cap_strs != 0 ? 2 * t->cap_strs : 256;
    trace_str_t *old = t->strs, *strs = calloc(cap, sizeof(*strs));
    size_t old_cap = t->cap_strs;

    if (strs == NULL)
        return FSDP_ERR_NO_MEMORY;
    t->strs = strs;
    t->cap_strs = cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].id != 0)
            *str_slot(t, old[i].text, old[i].hash) = old[i];
    free(old);
    return FSDP_OK;
}

/* The id of `text` in the strings table, inserted (in the writer's open transaction) when new.
 * 0 on an error. A text's id never changes once committed; one whose transaction fails stays
 * cached, but then the writer writes nothing more. */
static int64_t str_id(fsdp_trace_t *t, const char *text)
{
    uint64_t h = str_hash(text);
    trace_str_t *slot;
    int64_t id = 0;
    char *copy;

    if (t->cap_strs != 0) {
        slot = str_slot(t, text, h);
        if (slot->id != 0)
            return slot->id;
    }
    if ((2 * (t->n_strs + 1) > t->cap_strs && str_grow(t) != FSDP_OK) ||
        (copy = strdup(text)) == NULL) {
        fsdp_error("trace '%s': out of host memory for the strings table", t->path);
        return 0;
    }
    sqlite3_bind_text(t->ins_str, 1, text, -1, SQLITE_STATIC);
    sqlite3_bind_text(t->sel_str, 1, text, -1, SQLITE_STATIC);
    if (writer_rc(t, sqlite3_step(t->ins_str)) == FSDP_OK && sqlite3_step(t->sel_str) == SQLITE_ROW)
        id = sqlite3_column_int64(t->sel_str, 0);
    sqlite3_reset(t->ins_str);
    sqlite3_reset(t->sel_str);
    if (id == 0) {
        free(copy);
        return 0;
    }
    slot = str_slot(t, text, h);
    slot->hash = h;
    slot->id = id;
    slot->text = copy;
    t->n_strs++;
    return id;
}

/* Binds a text column as its id; 0 on an error. */
static int bind_str(fsdp_trace_t *t, sqlite3_stmt *st, int col, const trace_chunk_t *c,
                    uint32_t off)
{
    int64_t id;

    if (off == TRACE_NO_STR) {
        sqlite3_bind_null(st, col);
        return 1;
    }
    id = str_id(t, c->arena + off);
    sqlite3_bind_int64(st, col, id);
    return id != 0;
}

/* Binds a kind or dtype through its cached id; 0 on an error. */
static int bind_enum(fsdp_trace_t *t, sqlite3_stmt *st, int col, int64_t *id, const char *text)
{
    if (*id == 0)
        *id = str_id(t, text);
    sqlite3_bind_int64(st, col, *id);
    return *id != 0;
}

/* Binds one record at parameters first .. first + 14 (the run is ?1, bound once); 0 when a
 * text could not be interned. */
static int bind_event(fsdp_trace_t *t, sqlite3_stmt *st, int first, const trace_chunk_t *c,
                      const trace_rec_t *r)
{
    int ok = 1;

    sqlite3_bind_int(st, first, c->rank);
    sqlite3_bind_int64(st, first + 1, (sqlite3_int64)r->seq);
    if ((unsigned)r->kind < FSDP_EV_KIND_COUNT)
        ok &= bind_enum(t, st, first + 2, &t->kind_id[r->kind],
                        fsdp_event_kind_name((fsdp_event_kind_t)r->kind));
    else
        ok &= bind_enum(t, st, first + 2, &t->invalid_kind_id, "invalid");
    ok &= bind_str(t, st, first + 3, c, r->name);
    ok &= bind_str(t, st, first + 4, c, r->unit);
    ok &= bind_str(t, st, first + 5, c, r->stream);
    sqlite3_bind_double(st, first + 6, r->host_time);
    sqlite3_bind_double(st, first + 7, r->start);
    sqlite3_bind_double(st, first + 8, r->end);
    sqlite3_bind_int64(st, first + 9, (sqlite3_int64)r->bytes);
    sqlite3_bind_int64(st, first + 10, (sqlite3_int64)r->count);
    if (r->dtype >= 0 && r->dtype < FSDP_DTYPE_COUNT)
        ok &= bind_enum(t, st, first + 11, &t->dtype_id[r->dtype],
                        fsdp_dtype_name((fsdp_dtype_t)r->dtype));
    else
        sqlite3_bind_null(st, first + 11);
    ok &= bind_str(t, st, first + 12, c, r->group);
    sqlite3_bind_int64(st, first + 13, (sqlite3_int64)r->allocated);
    sqlite3_bind_int64(st, first + 14, (sqlite3_int64)r->reserved);
    return ok;
}

static fsdp_status_t write_chunk(fsdp_trace_t *t, const trace_chunk_t *c)
{
    sqlite3_stmt *st;
    fsdp_status_t status;
    int i = 0;

    /* Rows go in groups of TRACE_INSERT_ROWS per statement: one step of the virtual machine
     * for many rows halves the writer's time per event. */
    while (i < c->n) {
        int rows = c->n - i >= TRACE_INSERT_ROWS ? TRACE_INSERT_ROWS : 1, ok = 1;
        st = rows > 1 ? t->ins_events : t->ins_event;
        for (int k = 0; k < rows; k++)
            ok &= bind_event(t, st, 2 + k * FSDP_TRACE_EVENT_NCOLS, c, &c->recs[i + k]);
        if (!ok)
            return FSDP_ERR_IO;
        status = writer_rc(t, sqlite3_step(st));
        sqlite3_reset(st);
        if (status != FSDP_OK)
            return status;
        i += rows;
    }
    if (c->rank_row != NULL) {
        st = t->ins_rank;
        sqlite3_bind_int(st, 2, c->rank);
        sqlite3_bind_int(st, 3, c->rank_row->stands_for);
        sqlite3_bind_text(st, 4, c->rank_row->members, -1, SQLITE_STATIC);
        status = writer_rc(t, sqlite3_step(st));
        sqlite3_reset(st);
        if (status != FSDP_OK)
            return status;
    }
    if (c->has_step) {
        const trace_step_rec_t *s = &c->step;
        int col = 2;
        st = t->ins_step;
        sqlite3_bind_int(st, col++, c->rank);
        sqlite3_bind_int64(st, col++, s->step);
        sqlite3_bind_double(st, col++, s->loss);
        sqlite3_bind_double(st, col++, s->step_time);
        sqlite3_bind_int64(st, col++, (sqlite3_int64)s->seq_end);
        sqlite3_bind_int64(st, col++, (sqlite3_int64)s->peak_allocated);
        sqlite3_bind_int64(st, col++, (sqlite3_int64)s->peak_reserved);
        for (int k = 0; k < FSDP_MEM_CATEGORY_COUNT; k++)
            sqlite3_bind_int64(st, col++, (sqlite3_int64)s->peak[k]);
        for (int k = 0; k < FSDP_MEM_CATEGORY_COUNT; k++)
            sqlite3_bind_int64(st, col++, (sqlite3_int64)s->at_peak[k]);
        status = writer_rc(t, sqlite3_step(st));
        sqlite3_reset(st);
        if (status != FSDP_OK)
            return status;
    }
    return FSDP_OK;
}

static fsdp_status_t write_batch(fsdp_trace_t *t, const trace_chunk_t *batch)
{
    fsdp_status_t status;

    /* the write lock up front */
    status = writer_rc(t, sqlite3_exec(t->db, "BEGIN IMMEDIATE", NULL, NULL, NULL));
    if (status != FSDP_OK)
        return status;
    for (const trace_chunk_t *c = batch; c != NULL && status == FSDP_OK; c = c->next)
        status = write_chunk(t, c);
    if (status == FSDP_OK)
        status = writer_rc(t, sqlite3_exec(t->db, "COMMIT", NULL, NULL, NULL));
    /* a failed statement or COMMIT (SQLITE_FULL, say) may leave the transaction open */
    if (status != FSDP_OK && !sqlite3_get_autocommit(t->db))
        sqlite3_exec(t->db, "ROLLBACK", NULL, NULL, NULL);
    return status;
}

void *fsdp_trace_writer_main(void *arg)
{
    fsdp_trace_t *t = arg;

#if defined(__linux__)
    /* Linux gives each thread its own nice value; failure only costs the ranks some time. */
    (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), TRACE_WRITER_NICE);
#endif
    pthread_mutex_lock(&t->lock);
    for (;;) {
        trace_chunk_t *batch, *c, *next;
        fsdp_status_t status = FSDP_OK;
        uint64_t n = 0;

        while (t->head == NULL && !t->stop)
            pthread_cond_wait(&t->work, &t->lock);
        if (t->head == NULL)
            break; /* stopping and drained */
        if (!t->stop && !t->flushing && t->queued < TRACE_BATCH_CHUNKS) {
            struct timespec deadline;
            clock_gettime(CLOCK_MONOTONIC, &deadline);
            deadline.tv_nsec += TRACE_BATCH_DELAY_NS;
            if (deadline.tv_nsec >= 1000000000) {
                deadline.tv_sec++;
                deadline.tv_nsec -= 1000000000;
            }
            while (!t->stop && !t->flushing && t->queued < TRACE_BATCH_CHUNKS) {
                if (pthread_cond_timedwait(&t->work, &t->lock, &deadline) != 0)
                    break; /* timed out */
            }
        }
        batch = t->head;
        t->head = t->tail = NULL;
        t->queued = 0;
        if (t->error == FSDP_OK) {
            pthread_mutex_unlock(&t->lock);
            status = write_batch(t, batch);
            pthread_mutex_lock(&t->lock);
            if (status != FSDP_OK && t->error == FSDP_OK) {
                writer_stopped(t, status);
                t->error = status;
            }
        }
        /* After an error the chunks are dropped: the ranks must not pile up memory. */
        if (status == FSDP_OK && t->error == FSDP_OK)
            t->n_commits++;
        for (c = batch; c != NULL; c = next) {
            next = c->next;
            n++;
            if (status == FSDP_OK && t->error == FSDP_OK) {
                t->n_events += (uint64_t)c->n;
                t->n_steps += (uint64_t)c->has_step;
                if (c->has_step && c->rank >= 0 && c->rank < t->world &&
                    c->step.step > t->rank_step[c->rank])
                    t->rank_step[c->rank] = c->step.step;
            } else {
                t->n_dropped += (uint64_t)c->n;
            }
            if (t->n_free < TRACE_FREE_CHUNKS_MAX) {
                c->next = t->free_list;
                t->free_list = c;
                t->n_free++;
            } else {
                free(c);
            }
        }
        t->written += n;
        pthread_cond_broadcast(&t->done);
    }
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

