/* The trace writer.
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
#include "trace/trace_int.h"

#include <fsdp/log.h>
#include <fsdp/version.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__linux__)
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

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

/* ---- The writer thread ------------------------------------------------------------------- */

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

static void *trace_writer_main(void *arg)
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

/* ---- Rank side --------------------------------------------------------------------------- */

/* Fills in the device times an emitter left to resolve, before the chunk leaves its rank. */
static void chunk_resolve(trace_chunk_t *c)
{
    for (int i = 0; c->n_timed > 0 && i < c->n; i++) {
        fsdp_trace_timing_t *timing = c->timing[i];
        if (timing == NULL)
            continue;
        c->timing[i] = NULL;
        c->n_timed--;
        timing->resolve(timing, &c->recs[i].start, &c->recs[i].end);
    }
}

/* Called with r->lock held. Queues the rank's current chunk (if it holds anything) and, when
 * `replace`, gives the rank a fresh one; returns 0 if no memory was left for it. */
static int rank_handover(fsdp_trace_rank_t *r, int replace)
{
    fsdp_trace_t *t = r->trace;
    trace_chunk_t *c = r->cur, *fresh = NULL;

    if (c != NULL && c->n == 0 && !c->has_step)
        return 1; /* nothing to hand over: keep it */
    if (c != NULL)
        chunk_resolve(c);
    pthread_mutex_lock(&t->lock);
    if (c != NULL) {
        c->next = NULL;
        if (r->row_pending) {
            c->rank_row = r;
            r->row_pending = 0;
        }
        if (t->tail != NULL)
            t->tail->next = c;
        else
            t->head = c;
        t->tail = c;
        t->queued++;
        t->submitted++;
        if (t->queued >= TRACE_QUEUE_WARN && !t->warned_queue) {
            t->warned_queue = 1;
            fsdp_warn("trace '%s': %zu chunks wait for the writer: the database is slower than "
                      "the ranks, memory grows",
                      t->path, t->queued);
        }
        pthread_cond_signal(&t->work);
    }
    if (replace && t->free_list != NULL) {
        fresh = t->free_list;
        t->free_list = fresh->next;
        t->n_free--;
    }
    pthread_mutex_unlock(&t->lock);
    r->cur = NULL;
    if (!replace)
        return 1;
    if (fresh == NULL) {
        fresh = malloc(sizeof(*fresh));
        if (fresh == NULL)
            return 0;
    }
    fresh->next = NULL;
    fresh->rank = r->rank;
    fresh->n = 0;
    fresh->has_step = 0;
    fresh->n_timed = 0;
    fresh->arena_used = 0;
    fresh->rank_row = NULL;
    r->cur = fresh;
    return 1;
}

static size_t str_room(const char *s)
{
    return s == NULL ? 0 : strnlen(s, FSDP_TRACE_STR_MAX) + 1;
}

static uint32_t chunk_str(trace_chunk_t *c, const char *s)
{
    uint32_t off = c->arena_used;
    size_t n;

    if (s == NULL)
        return TRACE_NO_STR;
    n = strnlen(s, FSDP_TRACE_STR_MAX);
    memcpy(c->arena + off, s, n);
    c->arena[off + n] = '\0';
    c->arena_used += (uint32_t)(n + 1);
    return off;
}

void fsdp_trace_set_unit(fsdp_dev_t *dev, const char *unit)
{
    if (dev != NULL && dev->trace != NULL)
        dev->trace->unit = unit;
}

void fsdp_trace_set_memory(fsdp_dev_t *dev, const fsdp_mem_pool_stats_t *mem)
{
    if (dev != NULL && dev->trace != NULL)
        dev->trace->mem = mem;
}

void fsdp_trace_emit(fsdp_dev_t *dev, const fsdp_trace_event_t *ev)
{
    fsdp_trace_emit_timed(dev, ev, NULL);
}

void fsdp_trace_emit_timed(fsdp_dev_t *dev, const fsdp_trace_event_t *ev,
                           fsdp_trace_timing_t *timing)
{
    fsdp_trace_rank_t *r;
    trace_chunk_t *c;
    trace_rec_t *rec;
    const char *unit;
    size_t room;

    if (dev == NULL || (r = dev->trace) == NULL || ev == NULL) {
        if (timing != NULL) {
            double start = 0.0, end = 0.0;
            timing->resolve(timing, &start, &end); /* nothing to time: release it */
        }
        return;
    }
    unit = ev->unit != NULL ? ev->unit : r->unit;
    room = str_room(ev->name != NULL ? ev->name : "") + str_room(unit) + str_room(ev->stream) +
           str_room(ev->group);
    pthread_mutex_lock(&r->lock);
    c = r->cur;
    if (c == NULL || c->n == TRACE_CHUNK_EVENTS || c->arena_used + room > TRACE_CHUNK_ARENA) {
        if (!rank_handover(r, 1)) {
            /* Out of host memory: the event is lost, but its number is kept so the gap shows. */
            r->seq++;
            pthread_mutex_unlock(&r->lock);
            fsdp_error("rank %d: no memory for a trace chunk: event dropped", r->rank);
            if (timing != NULL) {
                double start = ev->start, end = ev->end;
                timing->resolve(timing, &start, &end);
            }
            return;
        }
        c = r->cur;
    }
    c->timing[c->n] = timing;
    c->n_timed += timing != NULL;
    rec = &c->recs[c->n++];
    rec->seq = r->seq++;
    rec->kind = (int32_t)ev->kind;
    rec->dtype = ev->dtype;
    rec->host_time = ev->host_time;
    rec->start = ev->start;
    rec->end = ev->end;
    rec->bytes = ev->bytes;
    rec->count = ev->count;
    rec->allocated = ev->allocated;
    rec->reserved = ev->reserved;
    if (r->mem != NULL && ev->allocated == 0 && ev->reserved == 0) {
        rec->allocated = r->mem->allocated_bytes.current;
        rec->reserved = r->mem->reserved_bytes.current;
    }
    rec->name = chunk_str(c, ev->name != NULL ? ev->name : "");
    rec->unit = chunk_str(c, unit);
    rec->stream = chunk_str(c, ev->stream);
    rec->group = chunk_str(c, ev->group);
    pthread_mutex_unlock(&r->lock);
}

void fsdp_trace_step(fsdp_dev_t *dev, int64_t step, double loss, double step_time,
                     const fsdp_mem_stats_t *mem)
{
    fsdp_trace_rank_t *r;
    trace_step_rec_t *s;

    if (dev == NULL || (r = dev->trace) == NULL)
        return;
    pthread_mutex_lock(&r->lock);
    if (r->cur == NULL && !rank_handover(r, 1)) {
        pthread_mutex_unlock(&r->lock);
        fsdp_error("rank %d: no memory for a trace chunk: step %" PRId64 " dropped", r->rank, step);
        return;
    }
    s = &r->cur->step;
    memset(s, 0, sizeof(*s));
    s->step = step;
    s->loss = loss;
    s->step_time = step_time;
    s->seq_end = r->seq;
    if (mem != NULL) {
        s->peak_allocated = mem->peak_allocated;
        s->peak_reserved = mem->peak_reserved;
        for (int k = 0; k < FSDP_MEM_CATEGORY_COUNT; k++) {
            s->peak[k] = mem->peak_by_category[k];
            s->at_peak[k] = mem->at_peak_by_category[k];
        }
    }
    r->cur->has_step = 1;
    rank_handover(r, 0); /* the next emit takes a fresh chunk */
    pthread_mutex_unlock(&r->lock);
}

/* Appends the members of a progression (first a, last b, step s, n ranks) to the list. */
static void members_item(fsdp_strbuf_t *b, int a, int last, int step, int n)
{
    const char *sep = b->len > 0 ? "," : "";

    if (n == 1)
        fsdp_strbuf_printf(b, "%s%d", sep, a);
    else if (step == 1)
        fsdp_strbuf_printf(b, "%s%d-%d", sep, a, last);
    else if (n == 2)
        fsdp_strbuf_printf(b, "%s%d,%d", sep, a, last);
    else
        fsdp_strbuf_printf(b, "%s%d-%d:%d", sep, a, last, step);
}

/* The ranks table's members of the rank dev stands for ("0-6", "8-16376:8,16379"), and how many
 * they are: from dev->represent, the rank alone without it. NULL when out of memory. */
static char *rank_members(const fsdp_dev_t *dev, int *count_p)
{
    fsdp_strbuf_t b = {0};
    int a = 0, last = 0, step = 0, n = 0, count = 0;

    if (dev->represent == NULL) {
        fsdp_strbuf_printf(&b, "%d", dev->rank);
        count = 1;
    }
    for (int x = 0; dev->represent != NULL && x < dev->world_size; x++) {
        if (dev->represent[x] != dev->rank)
            continue;
        count++;
        if (n == 0) {
            a = last = x;
            n = 1;
        } else if (n == 1) {
            step = x - a;
            last = x;
            n = 2;
        } else if (x - last == step) {
            last = x;
            n++;
        } else if (n == 2 && step != 1) {
            /* a pair that no third rank continues: its second rank may start the next */
            members_item(&b, a, a, 1, 1);
            a = last;
            step = x - a;
            last = x;
        } else {
            members_item(&b, a, last, step, n);
            a = last = x;
            n = 1;
        }
    }
    if (n > 0)
        members_item(&b, a, last, step, n);
    if (b.failed || b.s == NULL) {
        fsdp_strbuf_free(&b);
        return NULL;
    }
    *count_p = count;
    return b.s;
}

fsdp_status_t fsdp_trace_attach(fsdp_trace_t *t, fsdp_dev_t *dev)
{
    fsdp_trace_rank_t *r = NULL;
    fsdp_status_t status = FSDP_OK;

    if (t == NULL || dev == NULL) {
        fsdp_error("fsdp_trace_attach: %s is NULL", t == NULL ? "the trace" : "the device");
        return FSDP_ERR_INVALID_PARAM;
    }
    if (dev->rank < 0) {
        fsdp_error("fsdp_trace_attach: rank %d is invalid", dev->rank);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (dev->trace != NULL) {
        fsdp_error("rank %d: fsdp_trace_attach: the device is already tracing", dev->rank);
        return FSDP_ERR_INVALID_PARAM;
    }
    pthread_mutex_lock(&t->lock);
    if (dev->rank >= t->n_ranks) {
        int n = t->n_ranks == 0 ? 64 : t->n_ranks;
        while (n <= dev->rank)
            n *= 2;
        fsdp_trace_rank_t **ranks = realloc(t->ranks, (size_t)n * sizeof(*ranks));
        if (ranks == NULL) {
            status = FSDP_ERR_NO_MEMORY;
            goto out;
        }
        memset(ranks + t->n_ranks, 0, (size_t)(n - t->n_ranks) * sizeof(*ranks));
        t->ranks = ranks;
        t->n_ranks = n;
    }
    r = t->ranks[dev->rank];
    if (r == NULL) {
        r = calloc(1, sizeof(*r));
        if (r == NULL || pthread_mutex_init(&r->lock, NULL) != 0) {
            free(r);
            status = FSDP_ERR_NO_MEMORY;
            goto out;
        }
        r->trace = t;
        r->rank = dev->rank;
        r->members = rank_members(dev, &r->stands_for);
        if (r->members == NULL) {
            pthread_mutex_destroy(&r->lock);
            free(r);
            status = FSDP_ERR_NO_MEMORY;
            goto out;
        }
        r->row_pending = 1;
        t->ranks[dev->rank] = r;
    } else if (r->attached) {
        fsdp_error("rank %d: fsdp_trace_attach: the rank is already attached to another device",
                   dev->rank);
        status = FSDP_ERR_INVALID_PARAM;
        goto out;
    }
    r->attached = 1;
    dev->trace = r;
out:
    pthread_mutex_unlock(&t->lock);
    if (status == FSDP_ERR_NO_MEMORY)
        fsdp_error("rank %d: fsdp_trace_attach: out of host memory", dev->rank);
    return status;
}

void fsdp_trace_detach(fsdp_dev_t *dev)
{
    fsdp_trace_rank_t *r;

    if (dev == NULL || (r = dev->trace) == NULL)
        return;
    pthread_mutex_lock(&r->lock);
    rank_handover(r, 0);
    pthread_mutex_unlock(&r->lock);
    pthread_mutex_lock(&r->trace->lock);
    r->attached = 0;
    pthread_mutex_unlock(&r->trace->lock);
    dev->trace = NULL;
}

/* ---- Open, flush, close ------------------------------------------------------------------ */

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
    rc = pthread_create(&t->writer, NULL, trace_writer_main, t);
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
        rank_handover(r, 0);
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
