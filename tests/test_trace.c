/* Event traces: the writer (rank threads of the sim, world 4), the reader, the schema and its
 * version check, a writer killed mid-run, determinism, and the tools' logic (diff, summary,
 * Chrome export, SVG plot).
 *
 * Rank functions record the first failed check (test_util.h); the main thread asserts it. The
 * killed-writer test runs this binary again as a child process (fork and exec), so no thread of
 * the parent is duplicated. */
#include <fsdp/backend/trace.h>
#include <fsdp/fsdp.h>

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_util.h"
#include "trace/trace_hidden.h"

#define WORLD 4
#define CHILD_FLAG "--killed-writer-child"

static char tmpdir[256];
static fsdp_test_failure_t failure;

static const char *tpath(const char *name)
{
    static char buf[4][512];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, sizeof(buf[0]), "%s/%s", tmpdir, name);
    return p;
}

static void remove_db(const char *path)
{
    char buf[600];
    remove(path);
    snprintf(buf, sizeof(buf), "%s-wal", path);
    remove(buf);
    snprintf(buf, sizeof(buf), "%s-shm", path);
    remove(buf);
}

/* Captures library messages, so tests can check what was said. */
static char last_log[1024];
static void capture(fsdp_log_level_t level, const char *file, int line, const char *func,
                    const char *msg, void *arg)
{
    (void)level, (void)file, (void)line, (void)func, (void)arg;
    snprintf(last_log, sizeof(last_log), "%s", msg);
}

static fsdp_status_t launch(int world, fsdp_rank_func_t func, void *arg)
{
    fsdp_sim_params_t p;
    fsdp_sim_params_init(&p);
    p.world_size = world;
    p.timeout_s = 30;
    return fsdp_sim_launch(&p, func, arg, NULL);
}

/* ---- The round trip: every kind, every field -------------------------------------------- */

#define RT_EVENTS 700 /* a few chunks per rank */
static char long_name[3000];

/* The i-th event of a rank; strings come from static tables or long_name. */
static void rt_event(int rank, int i, fsdp_trace_event_t *ev)
{
    static const char *const names[] = {"pre_forward", "unsharded_param", "gradient", "h2d",
                                        "gemm",        "all_gather",      "rec",      "wait",
                                        "sync"};
    static const char *const units[] = {NULL, "layers.0", "layers.1", "emb\xc3\xa9\"<&>"};
    static const char *const streams[] = {NULL, "compute", "all_gather", "reduce_scatter"};
    static const char *const groups[] = {NULL, "world", "split(1)"};

    fsdp_trace_event_init(ev, (fsdp_event_kind_t)(i % FSDP_EV_KIND_COUNT),
                          names[i % FSDP_EV_KIND_COUNT]);
    if (i == 13)
        ev->name = long_name;
    ev->unit = units[(i / 3) % 4];
    ev->stream = streams[(i / 2 + rank) % 4];
    ev->group = groups[i % 3];
    ev->host_time = rank + i / 3.0;
    ev->start = ev->host_time + 1e-7 * i;
    ev->end = i % 5 == 0 ? ev->start : ev->start + 0.1 / (i + 1);
    ev->bytes = i == 7 ? UINT64_MAX - (uint64_t)rank : (uint64_t)i * 4096u + (uint64_t)rank;
    ev->count = (uint64_t)i * 1024u;
    ev->dtype = i % 6 == 5 ? -1 : i % FSDP_DTYPE_COUNT;
    ev->allocated = (uint64_t)i << 20;
    ev->reserved = ((uint64_t)i << 21) + 1;
}

static void rt_mem(int rank, int64_t step, fsdp_mem_stats_t *m)
{
    memset(m, 0, sizeof(*m));
    m->peak_allocated = 1000u * (size_t)(rank + 1) + (size_t)step;
    m->peak_reserved = 2000u * (size_t)(rank + 1) + (size_t)step;
    for (int c = 0; c < FSDP_MEM_CATEGORY_COUNT; c++) {
        m->peak_by_category[c] = (size_t)(c * 10 + rank);
        m->at_peak_by_category[c] = (size_t)(c * 5 + rank + step);
    }
}

static fsdp_status_t rt_rank(fsdp_dev_t *dev, void *arg)
{
    fsdp_trace_t *t = arg;
    fsdp_trace_event_t ev;
    fsdp_mem_stats_t m;

    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, dev->trace == NULL, "tracing before attach");
    fsdp_trace_event_init(&ev, FSDP_EV_HOOK, "ignored");
    fsdp_trace_emit(dev, &ev); /* not tracing: a no-op */
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, fsdp_trace_attach(t, dev) == FSDP_OK,
                          "attach failed");
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, fsdp_trace_enabled(dev), "not tracing after attach");
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, fsdp_trace_attach(t, dev) == FSDP_ERR_INVALID_PARAM,
                          "attached twice");
    for (int i = 0; i < RT_EVENTS; i++) {
        rt_event(dev->rank, i, &ev);
        fsdp_trace_emit(dev, &ev);
        if (i == RT_EVENTS / 2 || i == RT_EVENTS - 1) {
            rt_mem(dev->rank, i, &m);
            fsdp_trace_step(dev, i, 1.0 / (i + 1), 0.001 * i, &m);
        }
        if (i == 100) {
            /* detach and attach again: the sequence goes on */
            fsdp_trace_detach(dev);
            FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, dev->trace == NULL,
                                  "still tracing after detach");
            FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, fsdp_trace_attach(t, dev) == FSDP_OK,
                                  "re-attach");
        }
    }
    fsdp_trace_step(dev, RT_EVENTS, 0.5, 0.25, NULL); /* no memory stats */
    fsdp_trace_detach(dev);
    return FSDP_OK;
}

typedef struct rt_check {
    int n[WORLD];
    int bad;
    char what[256];
} rt_check_t;

static int str_eq(const char *a, const char *b)
{
    return (a == NULL && b == NULL) || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

static int rt_check_event(void *arg, int rank, uint64_t seq, const fsdp_trace_event_t *got)
{
    rt_check_t *c = arg;
    fsdp_trace_event_t ev;
    char name[FSDP_TRACE_STR_MAX + 1];

    if (rank < 0 || rank >= WORLD || seq != (uint64_t)c->n[rank]) {
        snprintf(c->what, sizeof(c->what), "rank %d seq %" PRIu64 " out of order", rank, seq);
        c->bad = 1;
        return 1;
    }
    rt_event(rank, c->n[rank]++, &ev);
    snprintf(name, sizeof(name), "%s", ev.name); /* stored truncated */
    if (got->kind != ev.kind || strcmp(got->name, name) != 0 || !str_eq(got->unit, ev.unit) ||
        !str_eq(got->stream, ev.stream) || !str_eq(got->group, ev.group) ||
        got->host_time != ev.host_time || got->start != ev.start || got->end != ev.end ||
        got->bytes != ev.bytes || got->count != ev.count || got->dtype != ev.dtype ||
        got->allocated != ev.allocated || got->reserved != ev.reserved) {
        snprintf(c->what, sizeof(c->what),
                 "rank %d seq %" PRIu64 " differs (%s/%s): got %s %s %s %.17g %.17g %.17g %" PRIu64
                 " %" PRIu64 " %d %" PRIu64 " %" PRIu64,
                 rank, seq, fsdp_event_kind_name(got->kind), got->name, got->unit ? got->unit : "-",
                 got->stream ? got->stream : "-", got->group ? got->group : "-", got->host_time,
                 got->start, got->end, got->bytes, got->count, got->dtype, got->allocated,
                 got->reserved);
        c->bad = 1;
        return 1;
    }
    return 0;
}

typedef struct step_check {
    int n;
    int bad;
} step_check_t;

static int rt_check_step(void *arg, const fsdp_trace_step_row_t *row)
{
    step_check_t *c = arg;
    int k = c->n % 3, rank = c->n / 3;
    int64_t steps[3] = {RT_EVENTS / 2, RT_EVENTS - 1, RT_EVENTS};
    uint64_t seq_end[3] = {RT_EVENTS / 2 + 1, RT_EVENTS, RT_EVENTS};
    fsdp_mem_stats_t m;

    c->n++;
    if (row->rank != rank || row->step != steps[k] || row->seq_end != seq_end[k]) {
        c->bad = 1;
        return 1;
    }
    if (k == 2) {
        c->bad |= row->loss != 0.5 || row->step_time != 0.25 || row->peak_allocated != 0;
        return c->bad;
    }
    rt_mem(rank, steps[k], &m);
    c->bad |= row->loss != 1.0 / (double)(steps[k] + 1) || row->step_time != 0.001 * steps[k];
    c->bad |= row->peak_allocated != m.peak_allocated || row->peak_reserved != m.peak_reserved;
    for (int i = 0; i < FSDP_MEM_CATEGORY_COUNT; i++)
        c->bad |= row->peak_by_category[i] != m.peak_by_category[i] ||
                  row->at_peak_by_category[i] != m.at_peak_by_category[i];
    return c->bad;
}

static void test_round_trip(void)
{
    const char *path = tpath("rt.db");
    fsdp_trace_run_info_t info = {
        "sim", WORLD, "full_shard", "{\"lr\": 0.01}", "{\"gpu\":\"x\"}", "fsdp-train --world 4"};
    fsdp_trace_t *t = NULL;
    fsdp_trace_reader_t *r = NULL;
    fsdp_trace_run_row_t row;
    rt_check_t c;
    step_check_t sc = {0, 0};
    int64_t run, id;

    memset(long_name, 'x', sizeof(long_name) - 1);
    remove_db(path);
    CU_ASSERT_FATAL(fsdp_trace_open(path, &info, &t) == FSDP_OK);
    run = fsdp_trace_run_id(t);
    CU_ASSERT(run > 0);
    fsdp_log_set_handler(capture, NULL); /* the double attach is logged */
    CU_ASSERT_EQUAL(launch(WORLD, rt_rank, t), FSDP_OK);
    fsdp_log_set_handler(NULL, NULL);
    fsdp_test_failure_assert(&failure);
    CU_ASSERT_EQUAL(fsdp_trace_flush(t), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_trace_close(t), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_trace_close(NULL), FSDP_OK);

    CU_ASSERT_FATAL(fsdp_trace_reader_open(path, &r) == FSDP_OK);
    CU_ASSERT(fsdp_trace_reader_find_run(r, 0, &id) == FSDP_OK && id == run);
    CU_ASSERT(fsdp_trace_reader_find_run(r, run, &id) == FSDP_OK && id == run);
    fsdp_log_set_handler(capture, NULL);
    CU_ASSERT_EQUAL(fsdp_trace_reader_find_run(r, run + 5, &id), FSDP_ERR_NOT_FOUND);
    fsdp_log_set_handler(NULL, NULL);
    CU_ASSERT_FATAL(fsdp_trace_reader_run(r, run, &row) == FSDP_OK);
    CU_ASSERT_STRING_EQUAL(row.backend, "sim");
    CU_ASSERT_EQUAL(row.world_size, WORLD);
    CU_ASSERT_STRING_EQUAL(row.strategy, "full_shard");
    CU_ASSERT_STRING_EQUAL(row.config_json, info.config_json);
    CU_ASSERT_STRING_EQUAL(row.profile_json, info.profile_json);
    CU_ASSERT_STRING_EQUAL(row.command_line, info.command_line);
    CU_ASSERT_STRING_EQUAL(row.version, fsdp_version_string());
    CU_ASSERT_EQUAL(row.finished, 1);

    memset(&c, 0, sizeof(c));
    CU_ASSERT(fsdp_trace_reader_events(r, run, -1, rt_check_event, &c) == FSDP_OK);
    if (c.bad)
        fprintf(stderr, "\n  %s\n", c.what);
    CU_ASSERT(!c.bad);
    for (int k = 0; k < WORLD; k++)
        CU_ASSERT_EQUAL(c.n[k], RT_EVENTS);
    /* one rank alone */
    memset(&c, 0, sizeof(c));
    c.n[2] = 0;
    CU_ASSERT(fsdp_trace_reader_events(r, run, 2, rt_check_event, &c) == FSDP_OK);
    CU_ASSERT(!c.bad && c.n[2] == RT_EVENTS && c.n[0] == 0);

    CU_ASSERT(fsdp_trace_reader_steps(r, run, -1, rt_check_step, &sc) == FSDP_OK);
    CU_ASSERT(!sc.bad);
    CU_ASSERT_EQUAL(sc.n, 3 * WORLD);
    fsdp_trace_reader_close(r);
    remove_db(path);
}

/* ---- Schema, kinds, versions ------------------------------------------------------------- */

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;

    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)n + 1);
    if (buf != NULL && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (buf != NULL)
        buf[n] = '\0';
    fclose(f);
    return buf;
}

static void test_schema_and_names(void)
{
    const char *srcdir = getenv("srcdir");
    char path[1024];
    char *text;
    fsdp_event_kind_t k;

    snprintf(path, sizeof(path), "%s/../traces/schema.sql", srcdir != NULL ? srcdir : ".");
    text = read_file(path);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    CU_ASSERT_STRING_EQUAL(fsdp_trace_schema(), text); /* the built-in copy is the file */
    free(text);
    CU_ASSERT_PTR_NOT_NULL(strstr(fsdp_trace_schema(), "PRAGMA user_version = 3;"));

    CU_ASSERT_STRING_EQUAL(fsdp_event_kind_name(FSDP_EV_HOOK), "hook");
    CU_ASSERT_STRING_EQUAL(fsdp_event_kind_name(FSDP_EV_COLLECTIVE), "collective");
    CU_ASSERT_STRING_EQUAL(fsdp_event_kind_name(FSDP_EV_SYNC), "sync");
    CU_ASSERT_STRING_EQUAL(fsdp_event_kind_name(FSDP_EV_KIND_COUNT), "invalid");
    for (int i = 0; i < FSDP_EV_KIND_COUNT; i++)
        CU_ASSERT(fsdp_event_kind_parse(fsdp_event_kind_name((fsdp_event_kind_t)i), &k) == 0 &&
                  (int)k == i);
    CU_ASSERT_EQUAL(fsdp_event_kind_parse("bogus", &k), -1);
    CU_ASSERT_STRING_EQUAL(fsdp_trace_divergence_name(FSDP_TRACE_DIV_NONE), "identical");
}

static int db_exec(const char *path, const char *sql)
{
    sqlite3 *db;
    int rc = sqlite3_open(path, &db);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
    sqlite3_close(db);
    return rc;
}

static int64_t db_int(const char *path, const char *sql)
{
    sqlite3 *db;
    sqlite3_stmt *st = NULL;
    int64_t v = -1;

    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK) {
        sqlite3_busy_timeout(db, 5000);
        if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK &&
            sqlite3_step(st) == SQLITE_ROW)
            v = sqlite3_column_int64(st, 0);
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

static void test_versions(void)
{
    const char *path = tpath("ver.db"), *junk = tpath("junk.db"), *empty = tpath("empty.db");
    fsdp_trace_t *t = NULL;
    fsdp_trace_reader_t *r = NULL;
    FILE *f;

    remove_db(path);
    CU_ASSERT_FATAL(fsdp_trace_open(path, NULL, &t) == FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_trace_close(t), FSDP_OK);
    CU_ASSERT_EQUAL(db_int(path, "PRAGMA user_version"), FSDP_TRACE_SCHEMA_VERSION);
    /* WAL is persistent (docs/formats.md section 5) */
    CU_ASSERT_EQUAL(db_int(path, "SELECT journal_mode = 'wal' FROM pragma_journal_mode"), 1);
    /* a second run in the same file */
    CU_ASSERT_FATAL(fsdp_trace_open(path, NULL, &t) == FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_trace_run_id(t), 2);
    CU_ASSERT_EQUAL(fsdp_trace_close(t), FSDP_OK);
    CU_ASSERT_EQUAL(db_int(path, "SELECT count(*) FROM runs"), 2);

    /* newer than ours: refused by the writer and the reader, with a message that says so */
    CU_ASSERT_EQUAL(db_exec(path, "PRAGMA user_version = 4"), SQLITE_OK);
    fsdp_log_set_handler(capture, NULL);
    last_log[0] = '\0';
    t = NULL;
    CU_ASSERT_EQUAL(fsdp_trace_open(path, NULL, &t), FSDP_ERR_FORMAT);
    CU_ASSERT_PTR_NULL(t);
    CU_ASSERT_PTR_NOT_NULL(strstr(last_log, "newer"));
    CU_ASSERT_PTR_NOT_NULL(strstr(last_log, "schema version 4"));
    CU_ASSERT_EQUAL(fsdp_trace_reader_open(path, &r), FSDP_ERR_FORMAT);
    CU_ASSERT_EQUAL(db_int(path, "SELECT count(*) FROM runs"), 2); /* untouched */

    /* not a database at all */
    f = fopen(junk, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    for (int i = 0; i < 200; i++)
        fputs("this is not an sqlite database\n", f);
    fclose(f);
    CU_ASSERT_EQUAL(fsdp_trace_open(junk, NULL, &t), FSDP_ERR_FORMAT);
    CU_ASSERT_EQUAL(fsdp_trace_reader_open(junk, &r), FSDP_ERR_FORMAT);
    CU_ASSERT_EQUAL(fsdp_trace_reader_open(tpath("missing.db"), &r), FSDP_ERR_NOT_FOUND);
    fsdp_log_set_handler(NULL, NULL);

    /* an SQLite file without our tables (user_version 0): the writer creates them */
    remove_db(empty);
    CU_ASSERT_EQUAL(db_exec(empty, "CREATE TABLE other (x); INSERT INTO other VALUES (1)"),
                    SQLITE_OK);
    CU_ASSERT_FATAL(fsdp_trace_open(empty, NULL, &t) == FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_trace_close(t), FSDP_OK);
    CU_ASSERT_EQUAL(db_int(empty, "PRAGMA user_version"), FSDP_TRACE_SCHEMA_VERSION);
    CU_ASSERT_EQUAL(db_int(empty, "SELECT count(*) FROM other"), 1);
    remove_db(path);
    remove_db(empty);
    remove(junk);
}

/* Version 1 kept the texts in the events table itself. */
static const char v1_events_sql[] =
    "DROP VIEW events; DROP TABLE event_rows; DROP TABLE strings; "
    "CREATE TABLE events (run INTEGER NOT NULL, rank INTEGER NOT NULL, seq INTEGER NOT NULL, "
    "kind TEXT NOT NULL, name TEXT NOT NULL, unit TEXT, stream TEXT, host_time REAL NOT NULL, "
    "start_time REAL NOT NULL, end_time REAL NOT NULL, bytes INTEGER NOT NULL, "
    "count INTEGER NOT NULL, dtype TEXT, grp TEXT, allocated INTEGER NOT NULL, "
    "reserved INTEGER NOT NULL, PRIMARY KEY (run, rank, seq)) WITHOUT ROWID; "
    "CREATE INDEX events_collectives ON events (run, name, unit, rank, bytes, dtype) "
    "WHERE kind = 'collective'; "
    "INSERT INTO runs (id, created, backend, world_size, version) "
    "VALUES (1, '2026-01-01T00:00:00Z', 'sim', 2, 'v1'); "
    "INSERT INTO events VALUES (1, 0, 0, 'collective', 'all_gather', 'layers.0', 'nccl', "
    "1.0, 1.5, 2.5, 4096, 1024, 'bf16', 'world', 8192, 16384); "
    "INSERT INTO events VALUES (1, 0, 1, 'kernel', 'gemm', 'layers.0', 'compute', "
    "2.0, 2.5, 3.0, 3072, 524288, 'f32', NULL, 8192, 16384); "
    "INSERT INTO events VALUES (1, 1, 0, 'hook', 'pre_forward', NULL, NULL, "
    "0.5, 0.5, 0.5, 0, 0, NULL, NULL, 0, 0); "
    "PRAGMA user_version = 1;";

typedef struct v1_seen {
    int n;
    char text[3][160];
} v1_seen_t;

static int v1_event(void *arg, int rank, uint64_t seq, const fsdp_trace_event_t *ev)
{
    v1_seen_t *v = arg;

    if (v->n < 3)
        snprintf(v->text[v->n], sizeof(v->text[0]), "%d %d %s %s %s %s %g %g %g %d %d %s %s %d %d",
                 rank, (int)seq, fsdp_event_kind_name(ev->kind), ev->name,
                 ev->unit ? ev->unit : "-", ev->stream ? ev->stream : "-", ev->host_time, ev->start,
                 ev->end, (int)ev->bytes, (int)ev->count,
                 ev->dtype >= 0 ? fsdp_dtype_name(ev->dtype) : "-", ev->group ? ev->group : "-",
                 (int)ev->allocated, (int)ev->reserved);
    v->n++;
    return 0;
}

/* A version 1 file reads as it is, and adding a run converts it without losing an event. */
static void test_version_1(void)
{
    static const char *const want[3] = {
        "0 0 collective all_gather layers.0 nccl 1 1.5 2.5 4096 1024 bf16 world 8192 16384",
        "0 1 kernel gemm layers.0 compute 2 2.5 3 3072 524288 f32 - 8192 16384",
        "1 0 hook pre_forward - - 0.5 0.5 0.5 0 0 - - 0 0"};
    const char *path = tpath("v1.db");
    fsdp_trace_t *t = NULL;
    fsdp_trace_reader_t *r = NULL;
    v1_seen_t seen;

    remove_db(path);
    CU_ASSERT_FATAL(db_exec(path, fsdp_trace_schema()) == SQLITE_OK);
    CU_ASSERT_FATAL(db_exec(path, v1_events_sql) == SQLITE_OK);
    CU_ASSERT_EQUAL(db_int(path, "PRAGMA user_version"), 1);
    for (int pass = 0; pass < 2; pass++) {
        memset(&seen, 0, sizeof(seen));
        CU_ASSERT_FATAL(fsdp_trace_reader_open(path, &r) == FSDP_OK);
        CU_ASSERT_EQUAL(fsdp_trace_reader_events(r, 1, -1, v1_event, &seen), FSDP_OK);
        fsdp_trace_reader_close(r);
        CU_ASSERT_EQUAL(seen.n, 3);
        for (int i = 0; i < 3; i++)
            CU_ASSERT_STRING_EQUAL(seen.text[i], want[i]);
        if (pass == 0) {
            /* the writer converts it, and its run goes after the old one */
            CU_ASSERT_FATAL(fsdp_trace_open(path, NULL, &t) == FSDP_OK);
            CU_ASSERT_EQUAL(fsdp_trace_run_id(t), 2);
            CU_ASSERT_EQUAL(fsdp_trace_close(t), FSDP_OK);
            CU_ASSERT_EQUAL(db_int(path, "PRAGMA user_version"), FSDP_TRACE_SCHEMA_VERSION);
            CU_ASSERT_EQUAL(db_int(path, "SELECT count(*) FROM event_rows"), 3);
            /* each text once */
            CU_ASSERT_EQUAL(db_int(path, "SELECT count(*) FROM strings WHERE text = 'layers.0'"),
                            1);
        }
    }
    remove_db(path);
}

/* ---- Symmetric ranks: what each simulated rank stands for ------------------------------- */

#define SYM_WORLD 12
/* classes: 0-2, 3-9:2, 4, 6-10:2, 11 */
static const int sym_represent[SYM_WORLD] = {0, 0, 0, 3, 4, 3, 6, 3, 6, 3, 6, 11};

static fsdp_status_t sym_rank(fsdp_dev_t *dev, void *arg)
{
    fsdp_trace_event_t ev;
    fsdp_status_t st = fsdp_trace_attach(arg, dev);

    if (st != FSDP_OK)
        return st;
    fsdp_trace_event_init(&ev, FSDP_EV_KERNEL, "gemm");
    ev.stream = "compute";
    ev.start = 1.0;
    ev.end = 2.0;
    fsdp_trace_emit(dev, &ev);
    fsdp_trace_step(dev, 1, 0.0, 1.0, NULL);
    fsdp_trace_detach(dev);
    return FSDP_OK;
}

static void sym_check_file(const char *path, const char *want)
{
    char *text = read_file(path);

    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    if (strstr(text, want) == NULL)
        fprintf(stderr, "\n'%s' lacks '%s'\n", path, want);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, want));
    free(text);
}

/* A symmetric launch's trace holds the simulated ranks, each with the ranks it stands for, and
 * the summary, export and plot say so. */
static void test_symmetric_ranks(void)
{
    const char *path = tpath("sym.db"), *out_path = tpath("sym.txt");
    fsdp_sim_params_t p;
    fsdp_trace_t *trace = NULL;
    fsdp_trace_run_info_t info = {.backend = "sim", .world_size = SYM_WORLD};
    FILE *out;

    remove_db(path);
    CU_ASSERT_EQUAL_FATAL(fsdp_trace_open(path, &info, &trace), FSDP_OK);
    fsdp_sim_params_init(&p);
    p.world_size = SYM_WORLD;
    p.mode = FSDP_SIM_SHAPE;
    p.timeout_s = 30;
    p.represent = sym_represent;
    CU_ASSERT_EQUAL(fsdp_sim_launch(&p, sym_rank, trace, NULL), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_trace_close(trace), FSDP_OK);
    CU_ASSERT_EQUAL(db_int(path, "SELECT count(*) FROM ranks"), 5);
    CU_ASSERT_EQUAL(db_int(path, "SELECT sum(stands_for) FROM ranks"), SYM_WORLD);
    CU_ASSERT_EQUAL(db_int(path, "SELECT count(DISTINCT rank) FROM events"), 5);
    CU_ASSERT_EQUAL(db_int(path, "SELECT count(*) FROM ranks WHERE (rank, stands_for, members) IN "
                                 "(VALUES (0, 3, '0-2'), (3, 4, '3-9:2'), (4, 1, '4'), "
                                 "(6, 3, '6-10:2'), (11, 1, '11'))"),
                    5);

    out = fopen(out_path, "w");
    CU_ASSERT_FATAL(out != NULL);
    CU_ASSERT_EQUAL(fsdp_trace_summary(path, 0, out), FSDP_OK);
    fclose(out);
    sym_check_file(out_path, "simulated ranks: 5, standing for 12");
    sym_check_file(out_path, "  rank 3 stands for 4 ranks: 3-9:2\n");
    sym_check_file(out_path, "  rank 0 (stands for 3 ranks: 0-2):\n");
    sym_check_file(out_path, "  rank 4:\n");
    CU_ASSERT_EQUAL(fsdp_trace_export_chrome(path, 0, out_path), FSDP_OK);
    sym_check_file(out_path, "\"name\":\"rank 6 (stands for 3 ranks: 6-10:2)\"");
    sym_check_file(out_path, "\"name\":\"rank 11\"");
    CU_ASSERT_EQUAL(fsdp_trace_plot_svg(path, 0, 0, out_path), FSDP_OK);
    sym_check_file(out_path, "world 12 (5 ranks simulated");
    sym_check_file(out_path, ">rank 3 (stands for 4 ranks: 3-9:2)<");
    sym_check_file(out_path, ">rank 11<");
    remove_db(path);
    remove(out_path);
}

static int count_event(void *arg, int rank, uint64_t seq, const fsdp_trace_event_t *ev)
{
    (void)rank, (void)seq, (void)ev;
    ++*(int *)arg;
    return 0;
}

/* Version 2 is version 3 without the ranks table: such a file reads as it is, its ranks each
 * standing for themselves, and adding a run converts it. */
static void test_version_2(void)
{
    const char *path = tpath("v2.db"), *out_path = tpath("v2.txt");
    fsdp_trace_t *t = NULL;
    fsdp_trace_reader_t *r = NULL;
    char *text;
    FILE *out;

    remove_db(path);
    CU_ASSERT_FATAL(db_exec(path, fsdp_trace_schema()) == SQLITE_OK);
    CU_ASSERT_FATAL(db_exec(path, "DROP TABLE ranks; PRAGMA user_version = 2; "
                                  "INSERT INTO runs (id, created, backend, world_size, version) "
                                  "VALUES (1, '2026-01-01T00:00:00Z', 'sim', 2, 'v2'); "
                                  "INSERT INTO strings (id, text) VALUES (1, 'kernel'), "
                                  "(2, 'gemm'), (3, 'compute'); "
                                  "INSERT INTO event_rows VALUES (1, 0, 0, 1, 2, NULL, 3, 0.5, "
                                  "1.0, 2.0, 64, 128, NULL, NULL, 0, 0), (1, 1, 0, 1, 2, NULL, "
                                  "3, 0.5, 1.0, 2.0, 64, 128, NULL, NULL, 0, 0);") == SQLITE_OK);
    for (int pass = 0; pass < 2; pass++) {
        int n = 0;
        CU_ASSERT_FATAL(fsdp_trace_reader_open(path, &r) == FSDP_OK);
        CU_ASSERT_EQUAL(fsdp_trace_reader_events(r, 1, -1, count_event, &n), FSDP_OK);
        fsdp_trace_reader_close(r);
        CU_ASSERT_EQUAL(n, 2);
        out = fopen(out_path, "w");
        CU_ASSERT_FATAL(out != NULL);
        CU_ASSERT_EQUAL(fsdp_trace_summary(path, 1, out), FSDP_OK);
        fclose(out);
        text = read_file(out_path);
        CU_ASSERT_PTR_NOT_NULL_FATAL(text);
        CU_ASSERT_PTR_NOT_NULL(strstr(text, "ranks 0-1:\n    kernel 1\n"));
        CU_ASSERT_PTR_NULL(strstr(text, "stands for"));
        free(text);
        CU_ASSERT_EQUAL(fsdp_trace_export_chrome(path, 1, out_path), FSDP_OK);
        CU_ASSERT_EQUAL(fsdp_trace_plot_svg(path, 1, 0, out_path), FSDP_OK);
        if (pass == 0) {
            CU_ASSERT_EQUAL(db_int(path, "PRAGMA user_version"), 2);
            CU_ASSERT_FATAL(fsdp_trace_open(path, NULL, &t) == FSDP_OK);
            CU_ASSERT_EQUAL(fsdp_trace_run_id(t), 2);
            CU_ASSERT_EQUAL(fsdp_trace_close(t), FSDP_OK);
            CU_ASSERT_EQUAL(db_int(path, "PRAGMA user_version"), FSDP_TRACE_SCHEMA_VERSION);
            CU_ASSERT_EQUAL(db_int(path, "SELECT count(*) FROM ranks"), 0);
        }
    }
    remove_db(path);
    remove(out_path);
}

/* ---- A workload shaped like a FULL_SHARD step, for determinism and the diff -------------- */

typedef enum {
    INJECT_NONE,
    INJECT_MISSING, /* rank 2, step 1: no reduce-scatter for layers.1 */
    INJECT_RESIZE,  /* rank 2, step 1: the forward all-gather of layers.0 is twice as big */
    INJECT_SWAP,    /* rank 2, step 1: gemm and relu of layers.1 swapped */
    INJECT_DTYPE,   /* rank 2, step 1: layers.0's reduce-scatter in bf16 */
    INJECT_CROSS,   /* rank 1, step 0: an all-gather issued before the kernel that preceded it */
    INJECT_STEP_STREAMS, /* every rank: step s's copy on a stream of its own, "step<s>" */
} inject_t;

typedef struct work {
    fsdp_trace_t *trace;
    inject_t inject;
    int steps;
} work_t;

#define NUNITS 3

typedef struct clk {
    fsdp_dev_t *dev;
    double t;
    uint64_t allocated;
} clk_t;

static void op(clk_t *c, fsdp_event_kind_t kind, const char *name, const char *unit,
               const char *stream, uint64_t bytes, int dtype, const char *group)
{
    fsdp_trace_event_t ev;

    fsdp_trace_event_init(&ev, kind, name);
    ev.unit = unit;
    ev.stream = stream;
    ev.group = group;
    ev.bytes = bytes;
    ev.count = dtype >= 0 ? bytes / fsdp_dtype_size((fsdp_dtype_t)dtype) : 0;
    ev.dtype = dtype;
    ev.host_time = c->t;
    ev.start = c->t + 2e-6;
    ev.end = kind == FSDP_EV_KERNEL || kind == FSDP_EV_COLLECTIVE || kind == FSDP_EV_COPY
                 ? ev.start + 1e-9 * (double)bytes + 1e-6
                 : ev.start;
    if (kind == FSDP_EV_ALLOC)
        c->allocated += bytes;
    else if (kind == FSDP_EV_FREE)
        c->allocated -= bytes;
    ev.allocated = c->allocated;
    ev.reserved = 4u << 20;
    c->t += 5e-6;
    fsdp_trace_emit(c->dev, &ev);
}

static fsdp_status_t work_rank(fsdp_dev_t *dev, void *arg)
{
    const work_t *w = arg;
    static const char *const units[NUNITS] = {"layers.0", "layers.1", "layers.2"};
    clk_t c = {dev, 0.0, 0};
    fsdp_mem_stats_t m;

    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, fsdp_trace_attach(w->trace, dev) == FSDP_OK,
                          "attach");
    op(&c, FSDP_EV_ALLOC, "sharded_param", NULL, "compute", 3 * 8192, -1, NULL);
    for (int s = 0; s < w->steps; s++) {
        int here = dev->rank == 2 && s == 1;
        double t0 = c.t;
        op(&c, FSDP_EV_HOOK, "root_pre_forward", NULL, NULL, 0, -1, NULL);
        for (int u = 0; u < NUNITS; u++) {
            uint64_t ag = (uint64_t)(u + 1) * 16384;
            int cross = w->inject == INJECT_CROSS && dev->rank == 1 && s == 0 && u == 1;
            if (w->inject == INJECT_RESIZE && here && u == 0)
                ag *= 2;
            op(&c, FSDP_EV_HOOK, "pre_forward", units[u], NULL, 0, -1, NULL);
            op(&c, FSDP_EV_ALLOC, "unsharded_param", units[u], "all_gather", ag, -1, NULL);
            if (cross)
                op(&c, FSDP_EV_KERNEL, "relu", units[u - 1], "compute", 4096, FSDP_DTYPE_F32, NULL);
            op(&c, FSDP_EV_COLLECTIVE, "all_gather", units[u], "all_gather", ag, FSDP_DTYPE_BF16,
               "world");
            op(&c, FSDP_EV_RECORD, "all_gather_done", units[u], "all_gather", 0, -1, NULL);
            op(&c, FSDP_EV_WAIT, "all_gather_done", units[u], "compute", 0, -1, NULL);
            if (w->inject == INJECT_SWAP && here && u == 1) {
                op(&c, FSDP_EV_KERNEL, "relu", units[u], "compute", 4096, FSDP_DTYPE_F32, NULL);
                op(&c, FSDP_EV_KERNEL, "gemm", units[u], "compute", 65536, FSDP_DTYPE_F32, NULL);
            } else {
                op(&c, FSDP_EV_KERNEL, "gemm", units[u], "compute", 65536, FSDP_DTYPE_F32, NULL);
                if (!(w->inject == INJECT_CROSS && dev->rank == 1 && s == 0 && u == 0))
                    op(&c, FSDP_EV_KERNEL, "relu", units[u], "compute", 4096, FSDP_DTYPE_F32, NULL);
            }
            op(&c, FSDP_EV_HOOK, "post_forward", units[u], NULL, 0, -1, NULL);
            op(&c, FSDP_EV_FREE, "unsharded_param", units[u], "all_gather", ag, -1, NULL);
        }
        for (int u = NUNITS - 1; u >= 0; u--) {
            uint64_t ag = (uint64_t)(u + 1) * 16384, rs = ag / 2;
            op(&c, FSDP_EV_HOOK, "pre_backward", units[u], NULL, 0, -1, NULL);
            op(&c, FSDP_EV_ALLOC, "unsharded_param", units[u], "all_gather", ag, -1, NULL);
            op(&c, FSDP_EV_COLLECTIVE, "all_gather", units[u], "all_gather", ag, FSDP_DTYPE_BF16,
               "world");
            op(&c, FSDP_EV_WAIT, "all_gather_done", units[u], "compute", 0, -1, NULL);
            op(&c, FSDP_EV_KERNEL, "gemm_bwd", units[u], "compute", 131072, FSDP_DTYPE_F32, NULL);
            op(&c, FSDP_EV_HOOK, "post_backward", units[u], NULL, 0, -1, NULL);
            op(&c, FSDP_EV_ALLOC, "gradient", units[u], "reduce_scatter", rs, -1, NULL);
            if (!(w->inject == INJECT_MISSING && here && u == 1))
                op(&c, FSDP_EV_COLLECTIVE, "reduce_scatter", units[u], "reduce_scatter", rs,
                   w->inject == INJECT_DTYPE && here && u == 0 ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32,
                   "world");
            op(&c, FSDP_EV_FREE, "unsharded_param", units[u], "all_gather", ag, -1, NULL);
            op(&c, FSDP_EV_FREE, "gradient", units[u], "reduce_scatter", rs, -1, NULL);
        }
        op(&c, FSDP_EV_SYNC, "final_callback", NULL, NULL, 0, -1, NULL);
        char copy_stream[16];
        snprintf(copy_stream, sizeof(copy_stream), "step%d", s);
        op(&c, FSDP_EV_COPY, "d2h", NULL,
           w->inject == INJECT_STEP_STREAMS ? copy_stream : "compute", 4, FSDP_DTYPE_F32, NULL);
        memset(&m, 0, sizeof(m));
        m.peak_allocated = 3 * 8192 + 3 * 16384;
        m.peak_reserved = 4u << 20;
        m.peak_by_category[FSDP_MEM_SHARDED_PARAM] = 3 * 8192;
        m.peak_by_category[FSDP_MEM_UNSHARDED_PARAM] = 3 * 16384;
        m.at_peak_by_category[FSDP_MEM_SHARDED_PARAM] = 3 * 8192;
        fsdp_trace_step(dev, s, 1.0 / (s + 1), c.t - t0, &m);
    }
    fsdp_trace_detach(dev);
    return FSDP_OK;
}

/* Writes one run of the workload; returns its id (0 on failure). */
static int64_t work_run(const char *path, inject_t inject, int world)
{
    fsdp_trace_run_info_t info = {"sim", world, "full_shard", "{}", NULL, "test_trace"};
    work_t w = {NULL, inject, 3};
    int64_t id;

    if (fsdp_trace_open(path, &info, &w.trace) != FSDP_OK)
        return 0;
    id = fsdp_trace_run_id(w.trace);
    if (launch(world, work_rank, &w) != FSDP_OK || atomic_load(&failure.count) != 0)
        id = 0;
    fsdp_test_failure_assert(&failure);
    if (fsdp_trace_close(w.trace) != FSDP_OK)
        id = 0;
    return id;
}

/* ---- Determinism ------------------------------------------------------------------------- */

typedef struct row_list {
    int n, cap;
    struct row {
        int rank;
        uint64_t seq;
        fsdp_trace_event_t ev;
        char s[4][64];
    } * rows;
} row_list_t;

static int collect(void *arg, int rank, uint64_t seq, const fsdp_trace_event_t *ev)
{
    row_list_t *l = arg;
    struct row *r;
    const char *s[4] = {ev->name, ev->unit, ev->stream, ev->group};

    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 256;
        l->rows = realloc(l->rows, (size_t)l->cap * sizeof(*l->rows));
        if (l->rows == NULL)
            return 1;
    }
    r = &l->rows[l->n++];
    memset(r, 0, sizeof(*r));
    r->rank = rank;
    r->seq = seq;
    r->ev = *ev;
    for (int k = 0; k < 4; k++)
        snprintf(r->s[k], sizeof(r->s[k]), "%s", s[k] != NULL ? s[k] : "(null)");
    r->ev.name = r->ev.unit = r->ev.stream = r->ev.group = NULL;
    return 0;
}

static void test_determinism(void)
{
    const char *path = tpath("det.db");
    fsdp_trace_reader_t *r;
    row_list_t a = {0, 0, NULL}, b = {0, 0, NULL};
    fsdp_trace_diff_t d;
    int64_t ra, rb;

    remove_db(path);
    ra = work_run(path, INJECT_NONE, WORLD);
    rb = work_run(path, INJECT_NONE, WORLD);
    CU_ASSERT_FATAL(ra > 0 && rb > 0 && ra != rb);
    CU_ASSERT_FATAL(fsdp_trace_reader_open(path, &r) == FSDP_OK);
    CU_ASSERT(fsdp_trace_reader_events(r, ra, -1, collect, &a) == FSDP_OK);
    CU_ASSERT(fsdp_trace_reader_events(r, rb, -1, collect, &b) == FSDP_OK);
    fsdp_trace_reader_close(r);
    CU_ASSERT(a.n > 100 * WORLD);
    CU_ASSERT_EQUAL_FATAL(a.n, b.n);
    /* rows ordered by (rank, seq), every column but the run */
    CU_ASSERT(memcmp(a.rows, b.rows, (size_t)a.n * sizeof(*a.rows)) == 0);

    CU_ASSERT_FATAL(fsdp_trace_diff(path, ra, path, rb, NULL, &d) == FSDP_OK);
    CU_ASSERT_EQUAL(d.what, FSDP_TRACE_DIV_NONE);
    CU_ASSERT_EQUAL(d.ranks_diverging, 0);
    /* one file, no runs named: the previous run against the latest */
    CU_ASSERT_FATAL(fsdp_trace_diff(path, 1, path, 1, NULL, &d) == FSDP_OK);
    CU_ASSERT_EQUAL(d.what, FSDP_TRACE_DIV_NONE);
    free(a.rows);
    free(b.rows);
    remove_db(path);
}

/* ---- A writer killed mid-run ------------------------------------------------------------- */

static volatile sig_atomic_t child_stop;

static fsdp_status_t child_rank(fsdp_dev_t *dev, void *arg)
{
    fsdp_trace_t *t = arg;
    clk_t c = {dev, 0.0, 0};
    struct timespec ts = {0, 1000000};

    if (fsdp_trace_attach(t, dev) != FSDP_OK)
        return FSDP_ERR_INTERNAL;
    /* Until killed (or 20 s, if the parent is gone). */
    for (int64_t s = 0; s < 20000 && !child_stop; s++) {
        for (int i = 0; i < 40; i++)
            op(&c, (fsdp_event_kind_t)(i % FSDP_EV_KIND_COUNT), "op", "layers.0", "compute",
               (uint64_t)i * 512, FSDP_DTYPE_F32, "world");
        fsdp_trace_step(dev, s, 1.0, 1e-3, NULL);
        nanosleep(&ts, NULL);
    }
    return FSDP_OK;
}

static int child_main(const char *path)
{
    fsdp_trace_run_info_t info = {"sim", 2, NULL, NULL, NULL, "killed writer"};
    fsdp_trace_t *t;

    if (fsdp_trace_open(path, &info, &t) != FSDP_OK)
        return 3;
    launch(2, child_rank, t);
    fsdp_trace_close(t);
    return 0;
}

static void test_killed_writer(void)
{
    const char *path = tpath("killed.db");
    fsdp_trace_reader_t *r;
    int64_t seen = 0, steps, bad, per_rank_min;
    pid_t pid;
    int wstatus;

    remove_db(path);
    pid = fork();
    CU_ASSERT_FATAL(pid >= 0);
    if (pid == 0) {
        execl("/proc/self/exe", "test_trace", CHILD_FLAG, path, (char *)NULL);
        _exit(127);
    }
    /* Wait until the child has committed some steps of its own accord (no flush). */
    for (int i = 0; i < 2000 && seen < 10; i++) {
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
        if (access(path, F_OK) == 0)
            seen = db_int(path, "SELECT count(*) FROM steps");
        if (waitpid(pid, &wstatus, WNOHANG) == pid) {
            pid = -1;
            break;
        }
    }
    CU_ASSERT_FATAL(pid > 0); /* the child must not have died by itself */
    kill(pid, SIGKILL);
    CU_ASSERT_FATAL(waitpid(pid, &wstatus, 0) == pid);
    CU_ASSERT(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL);
    CU_ASSERT(seen >= 10);

    /* The database opens, is intact and holds every step with all of its events. */
    CU_ASSERT_EQUAL(db_int(path, "SELECT count(*) FROM pragma_integrity_check "
                                 "WHERE integrity_check = 'ok'"),
                    1);
    steps = db_int(path, "SELECT count(*) FROM steps");
    CU_ASSERT(steps >= seen);
    per_rank_min = db_int(path, "SELECT min(n) FROM (SELECT count(*) AS n FROM steps "
                                "GROUP BY rank)");
    CU_ASSERT(per_rank_min >= 1);
    /* steps are 0..n-1 per rank, and each step's events (seq < seq_end) are all there */
    bad = db_int(path, "SELECT count(*) FROM steps s WHERE s.step != (SELECT count(*) FROM "
                       "steps p WHERE p.rank = s.rank AND p.step < s.step) OR s.seq_end != "
                       "(SELECT count(*) FROM events e WHERE e.run = s.run AND e.rank = s.rank "
                       "AND e.seq < s.seq_end)");
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(db_int(path, "SELECT finished FROM runs"), 0);
    CU_ASSERT_FATAL(fsdp_trace_reader_open(path, &r) == FSDP_OK);
    fsdp_trace_reader_close(r);
    remove_db(path);
}

/* ---- Flushing while ranks emit ----------------------------------------------------------- */

typedef struct flusher {
    fsdp_trace_t *t;
    atomic_int done;
    int calls, errors;
} flusher_t;

static void *flush_loop(void *arg)
{
    flusher_t *f = arg;
    while (!atomic_load(&f->done)) {
        if (fsdp_trace_flush(f->t) != FSDP_OK)
            f->errors++;
        f->calls++;
    }
    return NULL;
}

static fsdp_status_t busy_rank(fsdp_dev_t *dev, void *arg)
{
    flusher_t *f = arg;
    clk_t c = {dev, 0.0, 0};

    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank, fsdp_trace_attach(f->t, dev) == FSDP_OK, "attach");
    for (int i = 0; i < 5000; i++) {
        op(&c, FSDP_EV_KERNEL, "gemm", "layers.0", "compute", 1024, FSDP_DTYPE_F32, NULL);
        if (i % 1000 == 999)
            fsdp_trace_step(dev, i / 1000, 0, 0, NULL);
    }
    return FSDP_OK; /* no detach: close takes what is left */
}

static void test_flush_while_emitting(void)
{
    const char *path = tpath("flush.db");
    flusher_t f;
    pthread_t th;

    remove_db(path);
    memset(&f, 0, sizeof(f));
    CU_ASSERT_FATAL(fsdp_trace_open(path, NULL, &f.t) == FSDP_OK);
    CU_ASSERT_FATAL(pthread_create(&th, NULL, flush_loop, &f) == 0);
    CU_ASSERT_EQUAL(launch(8, busy_rank, &f), FSDP_OK);
    fsdp_test_failure_assert(&failure);
    atomic_store(&f.done, 1);
    pthread_join(th, NULL);
    CU_ASSERT_EQUAL(f.errors, 0);
    CU_ASSERT(f.calls > 0);
    CU_ASSERT_EQUAL(fsdp_trace_close(f.t), FSDP_OK);
    CU_ASSERT_EQUAL(db_int(path, "SELECT count(*) FROM events"), 8 * 5000);
    CU_ASSERT_EQUAL(db_int(path, "SELECT count(*) FROM steps"), 8 * 5);
    CU_ASSERT_EQUAL(db_int(path, "SELECT count(DISTINCT seq) FROM events"), 5000);
    remove_db(path);
}

/* ---- Diff -------------------------------------------------------------------------------- */

static const char *tool_path(void)
{
    static char buf[1024];
    const char *top = getenv("top_builddir");
    snprintf(buf, sizeof(buf), "%s/tools/fsdp-trace", top != NULL ? top : "..");
    return access(buf, X_OK) == 0 ? buf : NULL;
}

static int run_tool(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run_tool(const char *fmt, ...)
{
    char cmd[4096];
    int len, rc;
    va_list ap;

    len = snprintf(cmd, sizeof(cmd), "%s ", tool_path());
    va_start(ap, fmt);
    vsnprintf(cmd + len, sizeof(cmd) - (size_t)len, fmt, ap);
    va_end(ap);
    rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void test_diff(void)
{
    static const struct {
        inject_t inject;
        fsdp_trace_divergence_t what;
        int rank;
        const char *stream;
    } cases[] = {
        {INJECT_MISSING, FSDP_TRACE_DIV_MISSING, 2, "reduce_scatter"},
        {INJECT_RESIZE, FSDP_TRACE_DIV_RESIZED, 2, "all_gather"},
        {INJECT_SWAP, FSDP_TRACE_DIV_REORDERED, 2, "compute"},
        {INJECT_DTYPE, FSDP_TRACE_DIV_DTYPE, 2, "reduce_scatter"},
        {INJECT_CROSS, FSDP_TRACE_DIV_REORDERED, 1, ""},
    };
    const char *path = tpath("diff.db"), *other = tpath("diff_b.db");
    const char *out_path = tpath("diff.txt");
    fsdp_trace_diff_t d;
    int64_t base, same, ids[5], small;
    char *text;
    FILE *out;

    remove_db(path);
    remove_db(other);
    base = work_run(path, INJECT_NONE, WORLD);
    same = work_run(other, INJECT_NONE, WORLD);
    CU_ASSERT_FATAL(base > 0 && same > 0);
    for (int k = 0; k < 5; k++) {
        ids[k] = work_run(path, cases[k].inject, WORLD);
        CU_ASSERT_FATAL(ids[k] > 0);
    }
    small = work_run(path, INJECT_NONE, 2);
    CU_ASSERT_FATAL(small > 0);

    /* identical runs in two files */
    CU_ASSERT_FATAL(fsdp_trace_diff(path, base, other, 0, NULL, &d) == FSDP_OK);
    CU_ASSERT_EQUAL(d.what, FSDP_TRACE_DIV_NONE);

    for (int k = 0; k < 5; k++) {
        out = fopen(out_path, "w");
        CU_ASSERT_FATAL(out != NULL);
        CU_ASSERT_FATAL(fsdp_trace_diff(path, base, path, ids[k], out, &d) == FSDP_OK);
        fclose(out);
        if (d.what != cases[k].what || d.rank != cases[k].rank)
            fprintf(stderr, "\n  case %d: got %s at rank %d: %s\n", k,
                    fsdp_trace_divergence_name(d.what), d.rank, d.message);
        CU_ASSERT_EQUAL(d.what, cases[k].what);
        CU_ASSERT_EQUAL(d.rank, cases[k].rank);
        CU_ASSERT_STRING_EQUAL(d.stream, cases[k].stream);
        CU_ASSERT_EQUAL(d.ranks_diverging, 1);
        text = read_file(out_path);
        CU_ASSERT_PTR_NOT_NULL_FATAL(text);
        CU_ASSERT_PTR_NOT_NULL(strstr(text, "first divergence"));
        CU_ASSERT_PTR_NOT_NULL(strstr(text, "=>"));
        CU_ASSERT_PTR_NOT_NULL(strstr(text, "timing per kind"));
        CU_ASSERT_PTR_NOT_NULL(strstr(text, "timing per unit"));
        CU_ASSERT_PTR_NOT_NULL(strstr(text, "timing per op"));
        /* its rows are kind and name alone (a unit's rows start with the unit) */
        CU_ASSERT_PTR_NOT_NULL(strstr(text, "\n  kernel gemm "));
        free(text);
    }
    /* the missing op is the reduce-scatter of layers.1 in step 1 */
    CU_ASSERT_FATAL(fsdp_trace_diff(path, base, path, ids[0], NULL, &d) == FSDP_OK);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.message, "reduce_scatter unit=layers.1"));
    /* the other way round, it is an extra op */
    CU_ASSERT_FATAL(fsdp_trace_diff(path, ids[0], path, base, NULL, &d) == FSDP_OK);
    CU_ASSERT_EQUAL(d.what, FSDP_TRACE_DIV_EXTRA);
    /* another world size */
    CU_ASSERT_FATAL(fsdp_trace_diff(path, base, path, small, NULL, &d) == FSDP_OK);
    CU_ASSERT_EQUAL(d.what, FSDP_TRACE_DIV_WORLD);

    /* the tool: exit 0 identical, 1 different, 2 error */
    if (tool_path() != NULL) {
        CU_ASSERT_EQUAL(run_tool("diff %s %s --run-a %" PRId64 " > /dev/null", path, other, base),
                        0);
        CU_ASSERT_EQUAL(run_tool("diff %s %s --run-a %" PRId64 " --run-b %" PRId64 " > /dev/null",
                                 path, path, base, ids[1]),
                        1);
        CU_ASSERT_EQUAL(run_tool("diff %s %s > /dev/null 2>&1", path, tpath("nope.db")), 2);
        CU_ASSERT_EQUAL(run_tool("diff %s > /dev/null 2>&1", path), 2);
        CU_ASSERT_EQUAL(run_tool("summary %s --run %" PRId64 " > /dev/null", path, base), 0);
        CU_ASSERT_EQUAL(run_tool("frobnicate > /dev/null 2>&1"), 2);
    }
    remove_db(path);
    remove_db(other);
    remove(out_path);
}

/* ---- Summary, Chrome export, SVG --------------------------------------------------------- */

static void test_summary(void)
{
    const char *path = tpath("sum.db"), *out_path = tpath("sum.txt");
    int64_t id;
    char *text;
    FILE *out;

    remove_db(path);
    id = work_run(path, INJECT_NONE, WORLD);
    CU_ASSERT_FATAL(id > 0);
    out = fopen(out_path, "w");
    CU_ASSERT_FATAL(out != NULL);
    CU_ASSERT_EQUAL(fsdp_trace_summary(path, 0, out), FSDP_OK);
    fclose(out);
    text = read_file(out_path);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "ranks 0-3")); /* identical ranks folded */
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "all_gather"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "reduce_scatter"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "layers.2"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "3 steps"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "peak allocated 72.00 KiB"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "unsharded_param"));
    /* 18 all-gathers per rank per run: 3 steps x 3 units x (forward + backward) */
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "all_gather             18 calls"));
    /* rank 0's last step alone: its 6 all-gathers (3 units x forward and backward) */
    {
        const char *sec = strstr(text, "time per op in rank 0's last step");
        char want[64];
        snprintf(want, sizeof(want), "    %-28s %8d ", "collective all_gather", 6);
        CU_ASSERT_PTR_NOT_NULL_FATAL(sec);
        CU_ASSERT_PTR_NOT_NULL(strstr(sec, want));
    }
    free(text);
    fsdp_log_set_handler(capture, NULL);
    CU_ASSERT_EQUAL(fsdp_trace_summary(path, 99, NULL), FSDP_ERR_NOT_FOUND);
    fsdp_log_set_handler(NULL, NULL);
    remove_db(path);
    remove(out_path);
}

/* One corrupted cell at a time: every reader refuses it with one line naming the file and the
 * field (or, for sizes, reads it without overflowing), at once. */
static void corrupt_refused(const char *path, const char *sql, const char *restore,
                            const char *field)
{
    char msg[1024];

    CU_ASSERT_EQUAL_FATAL(db_exec(path, sql), SQLITE_OK);
    fsdp_log_set_handler(capture, NULL);
    last_log[0] = '\0';
    CU_ASSERT_EQUAL(fsdp_trace_summary(path, 0, NULL), FSDP_ERR_FORMAT);
    snprintf(msg, sizeof(msg), "%s", last_log);
    CU_ASSERT_EQUAL(fsdp_trace_diff(path, 1, path, 1, NULL, NULL), FSDP_ERR_FORMAT);
    CU_ASSERT_EQUAL(fsdp_trace_export_chrome(path, 0, tpath("corrupt.json")), FSDP_ERR_FORMAT);
    fsdp_log_set_handler(NULL, NULL);
    if (strstr(msg, field) == NULL || strstr(msg, path) == NULL)
        fprintf(stderr, "\n  expected '%s' and the path in: %s\n", field, msg);
    CU_ASSERT_PTR_NOT_NULL(strstr(msg, field));
    CU_ASSERT_PTR_NOT_NULL(strstr(msg, path));
    CU_ASSERT_EQUAL_FATAL(db_exec(path, restore), SQLITE_OK);
}

static void test_corrupt(void)
{
    char path[600];
    fsdp_trace_diff_t res;
    struct timespec t0, t1;
    struct rusage ru0, ru1;

    snprintf(path, sizeof(path), "%s", tpath("corrupt.db"));
    remove_db(path);
    CU_ASSERT_FATAL(work_run(path, INJECT_NONE, WORLD) > 0);
    corrupt_refused(path, "UPDATE runs SET world_size = 2147483647",
                    "UPDATE runs SET world_size = 4", "runs.world_size = 2147483647");
    corrupt_refused(path, "UPDATE runs SET world_size = 1048577", "UPDATE runs SET world_size = 4",
                    "runs.world_size = 1048577 is out of range");
    corrupt_refused(path, "UPDATE runs SET world_size = 0", "UPDATE runs SET world_size = 4",
                    "runs.world_size = 0");
    corrupt_refused(path, "UPDATE runs SET world_size = -9223372036854775808",
                    "UPDATE runs SET world_size = 4", "runs.world_size = -9223372036854775808");
    /* a steps row of rank 1,000,000 made diff visit every rank up to it */
    clock_gettime(CLOCK_MONOTONIC, &t0);
    corrupt_refused(path, "UPDATE steps SET rank = 1000000 WHERE rank = 3 AND step = 0",
                    "UPDATE steps SET rank = 3 WHERE rank = 1000000", "steps.rank = 1000000");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CU_ASSERT((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec) < 2.0);
    corrupt_refused(path, "UPDATE event_rows SET rank = 9223372036854775807 WHERE rank = 3",
                    "UPDATE event_rows SET rank = 3 WHERE rank = 9223372036854775807",
                    "events.rank = 9223372036854775807");
    corrupt_refused(path, "UPDATE steps SET rank = x'00' WHERE rank = 1 AND step = 1",
                    "UPDATE steps SET rank = 1 WHERE typeof(rank) = 'blob'", "steps.rank = ");
    /* a rank of 1.5 between the others: diff, which walks the ranks, must not stall on it */
    CU_ASSERT_EQUAL_FATAL(db_exec(path, "UPDATE event_rows SET rank = 1.5 WHERE rank = 1 AND "
                                        "seq = 3"),
                          SQLITE_OK);
    fsdp_log_set_handler(capture, NULL);
    CU_ASSERT_EQUAL(fsdp_trace_diff(path, 1, path, 1, NULL, NULL), FSDP_ERR_FORMAT);
    fsdp_log_set_handler(NULL, NULL);
    CU_ASSERT_PTR_NOT_NULL(strstr(last_log, "events.rank = '1.5' is not an integer"));
    CU_ASSERT_EQUAL_FATAL(db_exec(path, "UPDATE event_rows SET rank = 1 WHERE rank = 1.5"),
                          SQLITE_OK);
    corrupt_refused(path, "UPDATE event_rows SET rank = -1 WHERE rank = 0",
                    "UPDATE event_rows SET rank = 0 WHERE rank = -1", "events.rank = -1");
    /* sizes out of range are read without overflow (UBSan watches the counters) */
    CU_ASSERT_EQUAL_FATAL(db_exec(path, "UPDATE event_rows SET bytes = -9223372036854775808, "
                                        "allocated = -1 WHERE seq % 2 = 0"),
                          SQLITE_OK);
    CU_ASSERT_EQUAL(fsdp_trace_export_chrome(path, 0, tpath("corrupt.json")), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_trace_diff(path, 1, path, 1, NULL, &res), FSDP_OK);
    /* records numbered 50,000,003 and 2^62: export kept a table indexed by the number (800 MB
     * written for the first); it holds the records the trace has, whatever their numbers */
    CU_ASSERT_EQUAL_FATAL(
        db_exec(path, "UPDATE event_rows SET count = 50000003 WHERE rank = 0 AND seq = "
                      "(SELECT min(seq) FROM events WHERE rank = 0 AND kind = 'record')"),
        SQLITE_OK);
    CU_ASSERT_EQUAL_FATAL(
        db_exec(path, "UPDATE event_rows SET count = 4611686018427387904 WHERE rank = 1 AND seq "
                      "= (SELECT min(seq) FROM events WHERE rank = 1 AND kind = 'record')"),
        SQLITE_OK);
    getrusage(RUSAGE_SELF, &ru0);
    CU_ASSERT_EQUAL(fsdp_trace_export_chrome(path, 0, tpath("corrupt.json")), FSDP_OK);
    getrusage(RUSAGE_SELF, &ru1);
    CU_ASSERT(ru1.ru_maxrss - ru0.ru_maxrss < 256 * 1024); /* KiB */
    remove(tpath("corrupt.json"));
    remove_db(path);
}

/* Not a regular file: refused with a line, without blocking on a FIFO. */
static void test_not_a_file(void)
{
    const char *fifo = tpath("fifo.db");

    CU_ASSERT_FATAL(mkfifo(fifo, 0600) == 0);
    fsdp_log_set_handler(capture, NULL);
    CU_ASSERT_EQUAL(fsdp_trace_summary(fifo, 0, NULL), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_PTR_NOT_NULL(strstr(last_log, "a FIFO, not a regular file"));
    CU_ASSERT_EQUAL(fsdp_trace_summary(tmpdir, 0, NULL), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_PTR_NOT_NULL(strstr(last_log, "a directory, not a regular file"));
    fsdp_log_set_handler(NULL, NULL);
    remove(fifo);
}

static int json_num(const json_t *o, const char *key)
{
    return json_is_number(json_object_get(o, key));
}

static void test_export_chrome(void)
{
    const char *path = tpath("chrome.db"), *out_path = tpath("chrome.json");
    json_error_t err;
    json_t *root, *events, *e;
    size_t i;
    int n_x = 0, n_i = 0, n_c = 0, n_proc = 0, n_host = 0, n_cat = 0, bad = 0, found_gemm = 0;

    remove_db(path);
    CU_ASSERT_FATAL(work_run(path, INJECT_NONE, WORLD) > 0);
    CU_ASSERT_FATAL(fsdp_trace_export_chrome(path, 0, out_path) == FSDP_OK);
    root = json_load_file(out_path, 0, &err);
    if (root == NULL)
        fprintf(stderr, "\n  %s:%d: %s\n", out_path, err.line, err.text);
    CU_ASSERT_PTR_NOT_NULL_FATAL(root);
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(root, "displayTimeUnit")), "ms");
    events = json_object_get(root, "traceEvents");
    CU_ASSERT_FATAL(json_is_array(events));
    json_array_foreach (events, i, e) {
        const char *ph = json_string_value(json_object_get(e, "ph"));
        const char *name = json_string_value(json_object_get(e, "name"));
        json_t *args = json_object_get(e, "args");
        if (ph == NULL || name == NULL || !json_is_integer(json_object_get(e, "pid")) ||
            !json_is_integer(json_object_get(e, "tid"))) {
            bad++;
            continue;
        }
        if (strcmp(ph, "M") == 0) {
            const char *v = json_string_value(json_object_get(args, "name"));
            if (strcmp(name, "process_name") == 0 && v != NULL && strncmp(v, "rank ", 5) == 0)
                n_proc++;
            if (strcmp(name, "thread_name") == 0 && v != NULL && strcmp(v, "host") == 0)
                n_host++;
            continue;
        }
        if (!json_num(e, "ts")) {
            bad++;
            continue;
        }
        if (strcmp(ph, "X") == 0) {
            n_x++;
            bad += !json_num(e, "dur") || json_number_value(json_object_get(e, "dur")) < 0;
            /* rank 0's first gemm: issued after 7 ops of 5 us, started 2 us later */
            if (strcmp(name, "gemm [layers.0]") == 0 &&
                json_integer_value(json_object_get(e, "pid")) == 1 && !found_gemm) {
                found_gemm = 1;
                CU_ASSERT_DOUBLE_EQUAL(json_number_value(json_object_get(e, "ts")), 37.0, 1e-6);
                CU_ASSERT_DOUBLE_EQUAL(json_number_value(json_object_get(e, "dur")), 65.536 + 1.0,
                                       1e-6);
                CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(e, "cat")), "kernel");
                CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(args, "dtype")), "f32");
            }
        } else if (strcmp(ph, "i") == 0) {
            n_i++;
        } else if (strcmp(ph, "C") == 0) {
            const char *key;
            json_t *v;
            n_c++;
            if (!json_is_object(args) || json_object_size(args) == 0)
                bad++;
            json_object_foreach (args, key, v)
                bad += !json_is_number(v);
            if (strcmp(name, "memory by category") == 0 &&
                json_object_get(args, "unsharded_param") != NULL)
                n_cat++;
        } else {
            bad++;
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(n_proc, WORLD);
    CU_ASSERT_EQUAL(n_host, WORLD);
    CU_ASSERT(n_x > 0 && n_i > 0 && n_c > 0 && n_cat > 0);
    CU_ASSERT(found_gemm);
    json_decref(root);
    fsdp_log_set_handler(capture, NULL);
    CU_ASSERT_EQUAL(fsdp_trace_export_chrome(path, 0, tpath("no/such/dir.json")), FSDP_ERR_IO);
    fsdp_log_set_handler(NULL, NULL);
    remove_db(path);
    remove(out_path);
}

/* Well-formedness, enough for our writer: tags nest and close, quotes balance inside tags, and
 * every '&' starts an entity. */
static int xml_well_formed(const char *s, int *n_elements)
{
    const char *stack[64];
    size_t lens[64];
    int depth = 0, root_closed = 0;

    *n_elements = 0;
    for (const char *p = s; *p; p++) {
        if (*p == '&') {
            if (strncmp(p, "&amp;", 5) && strncmp(p, "&lt;", 4) && strncmp(p, "&gt;", 4) &&
                strncmp(p, "&quot;", 6) && strncmp(p, "&apos;", 6))
                return 0;
            continue;
        }
        if (*p == '>')
            return 0; /* outside a tag */
        if (*p != '<')
            continue;
        if (p[1] == '?') {
            const char *end = strstr(p, "?>");
            if (end == NULL || p != s)
                return 0;
            p = end + 1;
            continue;
        }
        const char *q = p + 1;
        int closing = *q == '/', quotes = 0;
        if (closing)
            q++;
        const char *name = q;
        while (*q && *q != ' ' && *q != '>' && *q != '/' && *q != '\n')
            q++;
        size_t len = (size_t)(q - name);
        if (len == 0 || root_closed)
            return 0;
        while (*q && (*q != '>' || quotes % 2))
            quotes += *q++ == '"';
        if (*q != '>' || quotes % 2)
            return 0;
        if (closing) {
            if (depth == 0 || lens[depth - 1] != len || strncmp(stack[depth - 1], name, len))
                return 0;
            depth--;
            root_closed = depth == 0;
        } else if (q[-1] != '/') {
            if (depth == 64)
                return 0;
            stack[depth] = name;
            lens[depth++] = len;
            (*n_elements)++;
        } else {
            (*n_elements)++;
        }
        p = q;
    }
    return depth == 0 && root_closed;
}

/* The tick labels of class `cls` ("xtick", "ytick") of the first rank drawn, in order. */
typedef struct svg_tick {
    double value, x;
    char unit[8];
    int end_anchored, len;
} svg_tick_t;

static int svg_ticks(const char *svg, const char *cls, svg_tick_t *t, int max)
{
    const char *group_end = strstr(svg, "</g>");
    char key[32];
    int n = 0;

    snprintf(key, sizeof(key), "class=\"%s\"", cls);
    for (const char *p = strstr(svg, key); p != NULL && p < group_end && n < max;
         p = strstr(p + 1, key)) {
        const char *x = strstr(p, " x=\""), *anchor = strstr(p, "text-anchor=\"");
        const char *text = strchr(p, '>');
        char *end;
        if (x == NULL || anchor == NULL || text == NULL || x > text || anchor > text)
            return -1;
        t[n].x = strtod(x + 4, NULL);
        t[n].end_anchored = strncmp(anchor + 13, "end\"", 4) == 0;
        t[n].value = strtod(text + 1, &end);
        if (end == text + 1 || *end != ' ' || sscanf(end + 1, "%7[^<]", t[n].unit) != 1)
            return -1;
        t[n].len = (int)(strchr(text, '<') - text - 1);
        n++;
    }
    return n;
}

static int one_of(const char *s, const char *const *list)
{
    for (; *list != NULL; list++) {
        if (strcmp(s, *list) == 0)
            return 1;
    }
    return 0;
}

/* Round ticks: one unit, equal steps of 1, 2 or 5 times a power of ten, each value a multiple
 * of the step. */
static int ticks_round(const svg_tick_t *t, int n, const char *const *units)
{
    double d, m;

    if (n < 2)
        return 0;
    d = t[1].value - t[0].value;
    m = d / pow(10, floor(log10(d)));
    if (!(fabs(m - 1) < 1e-6 || fabs(m - 2) < 1e-6 || fabs(m - 5) < 1e-6))
        return 0;
    for (int i = 0; i < n; i++) {
        double k = t[i].value / d;
        if (strcmp(t[i].unit, t[0].unit) != 0 || !one_of(t[i].unit, units) ||
            fabs(k - round(k)) > 1e-6 ||
            (i > 0 && fabs(t[i].value - t[i - 1].value - d) > 1e-6 * d))
            return 0;
    }
    return 1;
}

/* Every label inside the picture, at PLOT_CHAR_W (7) pixels a character at most. */
static int ticks_inside(const svg_tick_t *t, int n, double width)
{
    for (int i = 0; i < n; i++) {
        double right = t[i].end_anchored ? t[i].x : t[i].x + t[i].len * 7 / 2.0;
        if (right > width)
            return 0;
    }
    return 1;
}

static void test_plot_axes_and_windows(void)
{
    static const char *const time_units[] = {"s", "ms", "\xc2\xb5s", "ns", NULL};
    static const char *const mem_units[] = {"B", "KiB", "MiB", "GiB", NULL};
    const char *path = tpath("plotw.db"), *out_path = tpath("plotw.svg");
    fsdp_trace_plot_options_t o;
    svg_tick_t t[64];
    char *text;
    int n;

    remove_db(path);
    CU_ASSERT_FATAL(work_run(path, INJECT_STEP_STREAMS, WORLD) > 0);
    /* the whole run: round ticks with units, the reserved line named in the legend */
    CU_ASSERT_FATAL(fsdp_trace_plot_svg(path, 0, 1, out_path) == FSDP_OK);
    text = read_file(out_path);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    CU_ASSERT(xml_well_formed(text, &n));
    n = svg_ticks(text, "xtick", t, 64);
    CU_ASSERT(n >= 3 && n <= 9);
    CU_ASSERT(ticks_round(t, n, time_units));
    CU_ASSERT(ticks_inside(t, n, 1130));
    n = svg_ticks(text, "ytick", t, 64);
    CU_ASSERT(n >= 2 && n <= 6);
    CU_ASSERT(ticks_round(t, n, mem_units));
    CU_ASSERT(n > 0 && t[0].value == 0);
    /* the top covers reserved (4 MiB) */
    CU_ASSERT(n > 0 && strcmp(t[n - 1].unit, "MiB") == 0 && t[n - 1].value >= 4);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, ">reserved</text>"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "stroke-dasharray=\"4,3\"/><text"));
    for (int s = 0; s < 3; s++) {
        char lane[32];
        snprintf(lane, sizeof(lane), ">step%d</text>", s);
        CU_ASSERT_PTR_NOT_NULL(strstr(text, lane));
    }
    free(text);

    /* step 1 alone: only its events, memory starting from what step 0 left (sharded_param) */
    fsdp_trace_plot_options_init(&o);
    CU_ASSERT_EQUAL(o.max_ranks, 8);
    o.first_step = o.last_step = 1;
    CU_ASSERT_FATAL(fsdp_trace_plot_svg_ex(path, 0, &o, out_path) == FSDP_OK);
    text = read_file(out_path);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    CU_ASSERT(xml_well_formed(text, &n));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "; step 1;"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, ">step1</text>"));
    CU_ASSERT_PTR_NULL(strstr(text, ">step0</text>"));
    CU_ASSERT_PTR_NULL(strstr(text, ">step2</text>"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "<polygon fill=\"#4e79a7\"")); /* sharded_param */
    CU_ASSERT_PTR_NOT_NULL(strstr(text, ">rank 3<"));
    n = svg_ticks(text, "xtick", t, 64);
    CU_ASSERT(n >= 3 && ticks_round(t, n, time_units) && ticks_inside(t, n, 1130));
    /* the step's time: each step of the workload takes about 0.3 ms from its start */
    CU_ASSERT(n > 0 && strcmp(t[0].unit, "\xc2\xb5s") == 0);
    CU_ASSERT(n > 0 && t[0].value >= 250 && t[n - 1].value <= 650);
    free(text);
    /* steps 1-2, one rank */
    o.last_step = 2;
    o.max_ranks = 1;
    CU_ASSERT_FATAL(fsdp_trace_plot_svg_ex(path, 0, &o, out_path) == FSDP_OK);
    text = read_file(out_path);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "; steps 1-2;"));
    CU_ASSERT_PTR_NULL(strstr(text, ">step0</text>"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, ">step2</text>"));
    CU_ASSERT_PTR_NULL(strstr(text, ">rank 1<"));
    free(text);

    /* a time window ending on a round value: its last label drawn leftwards, inside */
    fsdp_trace_plot_options_init(&o);
    o.start_time = 0;
    o.end_time = 400e-6; /* step 0's copy is at 302 us, step 1's at 602 us */
    CU_ASSERT_FATAL(fsdp_trace_plot_svg_ex(path, 0, &o, out_path) == FSDP_OK);
    text = read_file(out_path);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, ">step0</text>"));
    CU_ASSERT_PTR_NULL(strstr(text, ">step1</text>"));
    n = svg_ticks(text, "xtick", t, 64);
    CU_ASSERT(n >= 3 && ticks_round(t, n, time_units) && ticks_inside(t, n, 1130));
    CU_ASSERT(n > 0 && t[n - 1].value == 400 && t[n - 1].end_anchored);
    free(text);

    /* windows that cannot be drawn */
    fsdp_trace_plot_options_init(&o);
    o.first_step = 5;
    o.last_step = 6;
    last_log[0] = '\0';
    fsdp_log_set_handler(capture, NULL);
    CU_ASSERT_EQUAL(fsdp_trace_plot_svg_ex(path, 0, &o, out_path), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_PTR_NOT_NULL(strstr(last_log, "the run has steps 0-2"));
    o.first_step = 2;
    o.last_step = 1;
    CU_ASSERT_EQUAL(fsdp_trace_plot_svg_ex(path, 0, &o, out_path), FSDP_ERR_INVALID_PARAM);
    o.last_step = 2;
    o.end_time = 1;
    CU_ASSERT_EQUAL(fsdp_trace_plot_svg_ex(path, 0, &o, out_path), FSDP_ERR_INVALID_PARAM);
    fsdp_log_set_handler(NULL, NULL);
    if (tool_path() != NULL) {
        CU_ASSERT_EQUAL(run_tool("plot --svg %s %s --steps 1-2 --ranks 2", out_path, path), 0);
        CU_ASSERT_EQUAL(run_tool("plot --svg %s %s --steps 1", out_path, path), 0);
        CU_ASSERT_EQUAL(run_tool("plot --svg %s %s --time 0.1-0.3", out_path, path), 0);
        CU_ASSERT_EQUAL(run_tool("plot --svg %s %s --steps 2-1 2>/dev/null", out_path, path), 2);
        CU_ASSERT_EQUAL(run_tool("plot --svg %s %s --steps 1.5 2>/dev/null", out_path, path), 2);
        CU_ASSERT_EQUAL(
            run_tool("plot --svg %s %s --steps 1 --time 0-1 2>/dev/null", out_path, path), 2);
        CU_ASSERT_EQUAL(run_tool("plot --svg %s %s --steps 7 2>/dev/null", out_path, path), 2);
    }
    remove_db(path);
    remove(out_path);
}

static void test_plot_svg(void)
{
    const char *path = tpath("plot.db"), *out_path = tpath("plot.svg");
    int n = 0;
    char *text;

    CU_ASSERT(!xml_well_formed("<svg><g></svg></g>", &n));
    CU_ASSERT(!xml_well_formed("<svg><text>a & b</text></svg>", &n));
    CU_ASSERT(xml_well_formed("<?xml version=\"1.0\"?>\n<svg><g a=\"x>y\"/></svg>\n", &n));
    remove_db(path);
    CU_ASSERT_FATAL(work_run(path, INJECT_NONE, WORLD) > 0);
    CU_ASSERT_FATAL(fsdp_trace_plot_svg(path, 0, 0, out_path) == FSDP_OK);
    text = read_file(out_path);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    CU_ASSERT(strncmp(text, "<?xml", 5) == 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
    CU_ASSERT(xml_well_formed(text, &n));
    CU_ASSERT(n > 50);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "<polygon")); /* the memory areas */
    CU_ASSERT_PTR_NOT_NULL(strstr(text, ">rank 3<"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, ">reduce_scatter<"));
    free(text);
    /* two ranks only */
    CU_ASSERT_FATAL(fsdp_trace_plot_svg(path, 0, 2, out_path) == FSDP_OK);
    text = read_file(out_path);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    CU_ASSERT(xml_well_formed(text, &n));
    CU_ASSERT_PTR_NULL(strstr(text, ">rank 2<"));
    free(text);
    if (tool_path() != NULL) {
        CU_ASSERT_EQUAL(run_tool("plot --svg %s %s", out_path, path), 0);
        CU_ASSERT_EQUAL(run_tool("export --chrome %s %s", tpath("tool.json"), path), 0);
        CU_ASSERT_EQUAL(run_tool("export %s > /dev/null 2>&1", path), 2);
        remove(tpath("tool.json"));
    }
    remove_db(path);
    remove(out_path);
}

/* ---- Device times resolved after emission ------------------------------------------------ */

#define TIMED_EVENTS 600 /* a few chunks per rank, with a step boundary between */

typedef struct timed {
    fsdp_trace_timing_t super;
    int rank, i;
    atomic_int resolved; /* times resolve() was called */
} timed_t;

static timed_t timed[2][TIMED_EVENTS + 1];

static double timed_start(int rank, int i)
{
    return 1000.0 + 10000.0 * rank + i;
}

static void timed_resolve(fsdp_trace_timing_t *timing, double *start_p, double *end_p)
{
    timed_t *t = (timed_t *)timing;

    atomic_fetch_add(&t->resolved, 1);
    *start_p = timed_start(t->rank, t->i);
    *end_p = *start_p + 0.25;
}

static fsdp_status_t timed_rank(fsdp_dev_t *dev, void *arg)
{
    fsdp_trace_t *trace = arg;
    fsdp_status_t status;

    for (int i = 0; i <= TIMED_EVENTS; i++) {
        timed[dev->rank][i].super.resolve = timed_resolve;
        timed[dev->rank][i].rank = dev->rank;
        timed[dev->rank][i].i = i;
        atomic_store(&timed[dev->rank][i].resolved, 0);
    }
    /* not tracing yet: the timing is released at once */
    {
        fsdp_trace_op_t op = {.kind = FSDP_EV_KERNEL, .name = "gemm", .dtype = -1};
        fsdp_trace_op(dev, &op, &timed[dev->rank][TIMED_EVENTS].super);
    }
    FSDP_RANK_REQUIRE_MSG(&failure, dev->rank,
                          atomic_load(&timed[dev->rank][TIMED_EVENTS].resolved) == 1,
                          "an untraced timed event was not released");
    status = fsdp_trace_attach(trace, dev);
    if (status != FSDP_OK)
        return status;
    for (int i = 0; i < TIMED_EVENTS; i++) {
        fsdp_trace_op_t op = {.kind = FSDP_EV_COLLECTIVE,
                              .name = "all_gather",
                              .stream = "all_gather",
                              .host = 1.0 * i,
                              .start = -1.0,
                              .end = -1.0,
                              .bytes = 64,
                              .count = 16,
                              .dtype = FSDP_DTYPE_F32,
                              .group = "world"};
        fsdp_trace_op(dev, &op, i % 3 == 2 ? NULL : &timed[dev->rank][i].super);
        if (i == TIMED_EVENTS / 2)
            fsdp_trace_step(dev, 0, 1.0, 0.0, NULL);
    }
    fsdp_trace_detach(dev);
    for (int i = 0; i < TIMED_EVENTS; i++)
        FSDP_RANK_REQUIRE_MSG(
            &failure, dev->rank, atomic_load(&timed[dev->rank][i].resolved) == (i % 3 == 2 ? 0 : 1),
            "event %d resolved %d times", i, atomic_load(&timed[dev->rank][i].resolved));
    return FSDP_OK;
}

static int timed_check(void *arg, int rank, uint64_t seq, const fsdp_trace_event_t *ev)
{
    int *n = arg;
    int i = (int)seq;
    double start = i % 3 == 2 ? -1.0 : timed_start(rank, i);

    (*n)++;
    /* read back on this thread; recorded as the ranks' checks are */
    return !FSDP_RANK_CHECK_MSG(&failure, rank,
                                ev->start == start &&
                                    ev->end == (i % 3 == 2 ? -1.0 : start + 0.25) &&
                                    ev->host_time == 1.0 * i,
                                "seq %d: start %g end %g host %g, expected start %g", i, ev->start,
                                ev->end, ev->host_time, start);
}

static void test_timed(void)
{
    const char *path = tpath("timed.db");
    fsdp_trace_reader_t *rd = NULL;
    fsdp_trace_t *trace = NULL;
    int64_t run = 0;
    int n = 0;

    remove_db(path);
    CU_ASSERT_EQUAL_FATAL(fsdp_trace_open(path, NULL, &trace), FSDP_OK);
    CU_ASSERT_EQUAL(launch(2, timed_rank, trace), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_trace_close(trace), FSDP_OK);
    fsdp_test_failure_assert(&failure);
    CU_ASSERT_EQUAL_FATAL(fsdp_trace_reader_open(path, &rd), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_trace_reader_find_run(rd, 0, &run), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_trace_reader_events(rd, run, -1, timed_check, &n), FSDP_OK);
    fsdp_test_failure_assert(&failure);
    CU_ASSERT_EQUAL(n, 2 * TIMED_EVENTS);
    fsdp_trace_reader_close(rd);
    remove_db(path);
}

int main(int argc, char **argv)
{
    static const fsdp_test_case_t tests[] = {
        {"schema and names", test_schema_and_names},
        {"round trip of every field", test_round_trip},
        {"schema versions", test_versions},
        {"schema version 1", test_version_1},
        {"schema version 2", test_version_2},
        {"symmetric ranks", test_symmetric_ranks},
        {"determinism", test_determinism},
        {"killed writer", test_killed_writer},
        {"flush while emitting", test_flush_while_emitting},
        {"diff", test_diff},
        {"summary", test_summary},
        {"corrupted cells refused", test_corrupt},
        {"not a regular file", test_not_a_file},
        {"chrome export", test_export_chrome},
        {"svg plot", test_plot_svg},
        {"svg plot: axes and windows", test_plot_axes_and_windows},
        {"device times resolved after emission", test_timed},
        {NULL, NULL},
    };
    int rc;

    if (argc == 3 && strcmp(argv[1], CHILD_FLAG) == 0)
        return child_main(argv[2]);
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/fsdp_test_trace.XXXXXX");
    if (mkdtemp(tmpdir) == NULL) {
        perror("mkdtemp");
        return 99;
    }
    rc = fsdp_test_run("trace", tests);
    rmdir(tmpdir);
    return rc;
}
