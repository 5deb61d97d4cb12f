/* The SQLite boundary of the trace module: error conversion, opening a database with its schema
 * version checked (docs/formats.md section 5), run lookup, row decoding, and the small name tables
 * of trace.h. */
#include "trace/trace_int.h"

#include <fsdp/kernel.h>
#include <fsdp/log.h>
#include <fsdp/version.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* traces/schema.sql as one C string, generated at build time (lib/Makefile.am). */
static const char trace_schema_sql[] =
#include "trace_schema.inc"
    ;

const char *fsdp_trace_schema(void)
{
    return trace_schema_sql;
}

static const char *const event_kind_names[] = {
#define FSDP_EV_NAME_(name, str) str,
    FSDP_FOREACH_EVENT_KIND(FSDP_EV_NAME_)
#undef FSDP_EV_NAME_
};

const char *fsdp_event_kind_name(fsdp_event_kind_t kind)
{
    if ((unsigned)kind >= FSDP_EV_KIND_COUNT)
        return "invalid";
    return event_kind_names[kind];
}

int fsdp_event_kind_parse(const char *s, fsdp_event_kind_t *kind_p)
{
    if (s == NULL)
        return -1;
    for (int k = 0; k < FSDP_EV_KIND_COUNT; k++) {
        if (strcmp(s, event_kind_names[k]) == 0) {
            *kind_p = (fsdp_event_kind_t)k;
            return 0;
        }
    }
    return -1;
}

static const char *const divergence_names[] = {
#define FSDP_DIV_NAME_(name, str) str,
    FSDP_FOREACH_TRACE_DIVERGENCE(FSDP_DIV_NAME_)
#undef FSDP_DIV_NAME_
};

const char *fsdp_trace_divergence_name(fsdp_trace_divergence_t d)
{
    if ((unsigned)d >= FSDP_TRACE_DIV_COUNT)
        return "invalid";
    return divergence_names[d];
}

fsdp_status_t fsdp_sqlite_map(int rc)
{
    fsdp_status_t status;

    switch (rc & 0xff) {
    case SQLITE_OK:
    case SQLITE_ROW:
    case SQLITE_DONE:
        return FSDP_OK;
    case SQLITE_NOMEM:
        status = FSDP_ERR_NO_MEMORY;
        break;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
    case SQLITE_ERROR: /* SQL error: a table or column our schema should have is missing */
    case SQLITE_SCHEMA:
    case SQLITE_MISMATCH:
    case SQLITE_CONSTRAINT:
        status = FSDP_ERR_FORMAT;
        break;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        status = FSDP_ERR_TIMEOUT;
        break;
    case SQLITE_MISUSE:
    case SQLITE_RANGE:
        status = FSDP_ERR_INTERNAL;
        break;
    default: /* IOERR, FULL, CANTOPEN, READONLY, PERM, ... */
        status = FSDP_ERR_IO;
        break;
    }
    return status;
}

fsdp_status_t fsdp_sqlite_status(sqlite3 *db, int rc, const char *what, const char *file, int line,
                                 const char *func)
{
    fsdp_status_t status = fsdp_sqlite_map(rc);

    if (status == FSDP_OK)
        return FSDP_OK;
    if (FSDP_LOG_ERROR <= fsdp_log_level()) {
        const char *msg = db != NULL ? sqlite3_errmsg(db) : sqlite3_errstr(rc);

        /* a call is named; a result code carried in a variable is not worth naming */
        if (strchr(what, '(') != NULL || strchr(what, ' ') != NULL)
            fsdp_log_emit(FSDP_LOG_ERROR, file, line, func, "sqlite: %s failed: %s (code %d)", what,
                          msg, rc);
        else
            fsdp_log_emit(FSDP_LOG_ERROR, file, line, func, "sqlite: %s (code %d)", msg, rc);
    }
    return status;
}

fsdp_status_t fsdp_trace_db_exec(sqlite3 *db, const char *sql)
{
    char *err = NULL;
    int rc = sqlite3_exec(db, sql, NULL, NULL, &err);

    if (rc != SQLITE_OK) {
        fsdp_status_t status = fsdp_sqlite_status(NULL, rc, sql, __FILE__, __LINE__, __func__);
        if (err != NULL)
            fsdp_error("sqlite: %s", err);
        sqlite3_free(err);
        return status;
    }
    return FSDP_OK;
}

fsdp_status_t fsdp_trace_db_prepare(sqlite3 *db, const char *sql, sqlite3_stmt **stmt_p)
{
    *stmt_p = NULL;
    return FSDP_SQLITE_CALL(db, sqlite3_prepare_v2(db, sql, -1, stmt_p, NULL));
}

/* "INSERT OR FAIL INTO event_rows (run, ...) VALUES (?1, ?2, ..., ?16), (?1, ?17, ...), ...": OR
 * FAIL spares SQLite the statement journal a multi-row INSERT needs to undo its own rows on an
 * error; the writer rolls its batch back as a whole then anyway. */
fsdp_status_t fsdp_trace_db_prepare_event_insert(sqlite3 *db, int rows, sqlite3_stmt **stmt_p)
{
    char sql[8192];
    size_t len;
    int p = 2;

    len = (size_t)snprintf(sql, sizeof(sql),
                           "INSERT OR FAIL INTO event_rows (run, " FSDP_TRACE_EVENT_COLUMNS
                           ") VALUES ");
    for (int r = 0; r < rows && len < sizeof(sql); r++) {
        len += (size_t)snprintf(sql + len, sizeof(sql) - len, "%s(?1", r > 0 ? ", " : "");
        for (int k = 0; k < FSDP_TRACE_EVENT_NCOLS && len < sizeof(sql); k++)
            len += (size_t)snprintf(sql + len, sizeof(sql) - len, ", ?%d", p++);
        if (len < sizeof(sql))
            len += (size_t)snprintf(sql + len, sizeof(sql) - len, ")");
    }
    if (len >= sizeof(sql))
        return FSDP_ERR_INTERNAL;
    return fsdp_trace_db_prepare(db, sql, stmt_p);
}

static fsdp_status_t db_get_int(sqlite3 *db, const char *sql, int64_t *value_p, int *found_p)
{
    sqlite3_stmt *st;
    fsdp_status_t status;
    int rc;

    status = fsdp_trace_db_prepare(db, sql, &st);
    if (status != FSDP_OK)
        return status;
    rc = sqlite3_step(st);
    status = FSDP_SQLITE_CALL(db, rc);
    if (status == FSDP_OK && rc == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL) {
        *value_p = sqlite3_column_int64(st, 0);
        if (found_p != NULL)
            *found_p = 1;
    } else if (found_p != NULL) {
        *found_p = 0;
    }
    sqlite3_finalize(st);
    return status;
}

/* A file SQLite does not recognise fails on its first read, not on open. */
static fsdp_status_t db_user_version(sqlite3 *db, const char *path, int64_t *version_p)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL);

    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *version_p = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
        return FSDP_OK;
    }
    sqlite3_finalize(st);
    if (rc == SQLITE_NOTADB || rc == SQLITE_CORRUPT) {
        fsdp_error("'%s' is not a trace database: %s", path, sqlite3_errstr(rc));
        return FSDP_ERR_FORMAT;
    }
    return FSDP_SQLITE_CALL(db, rc);
}

static fsdp_status_t db_check_newer(const char *path, int64_t version)
{
    if (version > FSDP_TRACE_SCHEMA_VERSION) {
        fsdp_error("trace database '%s' has schema version %" PRId64 ", newer than version %d "
                   "of this libfsdp (%s): use a newer libfsdp or another file",
                   path, version, FSDP_TRACE_SCHEMA_VERSION, fsdp_version_string());
        return FSDP_ERR_FORMAT;
    }
    return FSDP_OK;
}

/* Version 1 kept the texts in every event row: its rows move to event_rows with their texts
 * interned, and the view takes the table's place. Run inside the writer's creating
 * transaction. */
static fsdp_status_t db_migrate_v1(sqlite3 *db, const char *path)
{
#define V1_ID_(col) "(SELECT id FROM strings WHERE text = v." col ")"
    static const char *const steps[] = {
        "ALTER TABLE events RENAME TO events_v1",
        "DROP INDEX IF EXISTS events_collectives",
        NULL, /* the schema */
        "INSERT OR IGNORE INTO strings (text) SELECT kind FROM events_v1 UNION "
        "SELECT name FROM events_v1 UNION SELECT unit FROM events_v1 WHERE unit IS NOT NULL UNION "
        "SELECT stream FROM events_v1 WHERE stream IS NOT NULL UNION "
        "SELECT dtype FROM events_v1 WHERE dtype IS NOT NULL UNION "
        "SELECT grp FROM events_v1 WHERE grp IS NOT NULL",
        "INSERT INTO event_rows SELECT v.run, v.rank, v.seq, " V1_ID_("kind") ", " V1_ID_(
            "name") ", " V1_ID_("unit") ", " V1_ID_("stream") ", v.host_time, v.start_time, "
                                                              "v.end_time, v.bytes, "
                                                              "v.count, " V1_ID_(
                                                                  "dtype") ", " V1_ID_("grp") ", "
                                                                                              "v."
                                                                                              "allo"
                                                                                              "cate"
                                                                                              "d, "
                                                                                              "v."
                                                                                              "rese"
                                                                                              "rved"
                                                                                              " FRO"
                                                                                              "M "
                                                                                              "even"
                                                                                              "ts_"
                                                                                              "v1 "
                                                                                              "v",
        "DROP TABLE events_v1",
    };
#undef V1_ID_
    fsdp_status_t status = FSDP_OK;

    fsdp_info("trace database '%s': converting schema version 1 to %d", path,
              FSDP_TRACE_SCHEMA_VERSION);
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]) && status == FSDP_OK; i++)
        status = fsdp_trace_db_exec(db, steps[i] != NULL ? steps[i] : trace_schema_sql);
    return status;
}

/* Version 2 had no ranks table: the schema adds it, and the old runs, without rows there, read
 * as runs of ranks that each stand for themselves. */
static fsdp_status_t db_migrate_v2(sqlite3 *db, const char *path)
{
    fsdp_info("trace database '%s': converting schema version 2 to %d", path,
              FSDP_TRACE_SCHEMA_VERSION);
    return fsdp_trace_db_exec(db, trace_schema_sql);
}

/* One line naming the file for a writer's failing setup call: "no space left on device" when
 * that is the reason, SQLite's message otherwise. */
static fsdp_status_t db_setup_failed(sqlite3 *db, const char *path, int rc)
{
    int full = (rc & 0xff) == SQLITE_FULL;

#if SQLITE_VERSION_NUMBER >= 3012000
    full |= sqlite3_system_errno(db) == ENOSPC;
#endif
    if (full)
        fsdp_error("cannot write trace database '%s': no space left on device", path);
    else
        fsdp_error("cannot write trace database '%s': %s", path, sqlite3_errmsg(db));
    return fsdp_sqlite_map(rc);
}

static fsdp_status_t db_setup_exec(sqlite3 *db, const char *path, const char *sql)
{
    int rc = sqlite3_exec(db, sql, NULL, NULL, NULL);

    return rc == SQLITE_OK ? FSDP_OK : db_setup_failed(db, path, rc);
}

static fsdp_status_t db_setup_writer(sqlite3 *db, const char *path)
{
    const char *mode;
    sqlite3_stmt *st;
    fsdp_status_t status;
    int64_t version;
    int rc;

    /* WAL: the rank threads' data is durable once its commit record is in the -wal file, and
     * readers (fsdp-trace on a live run) do not block the writer. */
    rc = sqlite3_prepare_v2(db, "PRAGMA journal_mode = WAL", -1, &st, NULL);
    if (rc != SQLITE_OK)
        return db_setup_failed(db, path, rc);
    rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        sqlite3_finalize(st);
        return db_setup_failed(db, path, rc);
    }
    mode = fsdp_trace_col_text(st, 0);
    if (mode == NULL || strcmp(mode, "wal") != 0)
        fsdp_warn("trace database '%s': journal mode is %s, not wal: a killed run may lose more "
                  "and readers block the writer",
                  path, mode != NULL ? mode : "?");
    sqlite3_finalize(st);
    status = db_setup_exec(db, path, "PRAGMA synchronous = NORMAL");
    if (status != FSDP_OK)
        return status;
    /* A big world inserts at one point of the table per rank: keep those pages cached. */
    status = db_setup_exec(db, path, "PRAGMA cache_size = -32768");
    if (status != FSDP_OK)
        return status;

    /* Create under a write lock, so two processes opening a new file do not both create. */
    status = db_setup_exec(db, path, "BEGIN IMMEDIATE");
    if (status != FSDP_OK)
        return status;
    status = db_user_version(db, path, &version);
    if (status == FSDP_OK)
        status = db_check_newer(path, version);
    if (status == FSDP_OK && version == 1)
        status = db_migrate_v1(db, path);
    else if (status == FSDP_OK && version == 2)
        status = db_migrate_v2(db, path);
    else if (status == FSDP_OK && version < FSDP_TRACE_SCHEMA_VERSION)
        status = db_setup_exec(db, path, trace_schema_sql);
    if (status == FSDP_OK)
        status = db_setup_exec(db, path, "COMMIT");
    if (status != FSDP_OK && !sqlite3_get_autocommit(db))
        sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    return status;
}

/* How a reader opens a database it cannot write. */
enum {
    DB_OPEN_PLAIN,     /* SQLite's own locks and shared-memory file */
    DB_OPEN_IMMUTABLE, /* a "file:...?immutable=1" URI: no locks, and any -wal file unseen */
    /* no locks (the unix-none VFS) and, in exclusive locking mode, the WAL index kept in this
     * connection's memory: the -wal file is read without a -shm file */
    DB_OPEN_WAL_PRIVATE,
};

/* Opens path with flags in the given way and reads one page, so that a database this
 * connection cannot read fails here, quietly, for the caller to try another way. */
static int db_try_open(const char *path, int flags, int how, sqlite3 **db_p)
{
    char uri[4200];
    size_t len = (size_t)snprintf(uri, sizeof(uri), "file:");
    const char *vfs = NULL;
    sqlite3_stmt *st = NULL;
    int rc;

    *db_p = NULL;
    if (how == DB_OPEN_IMMUTABLE) {
        for (const char *c = path; *c != '\0' && len + 16 < sizeof(uri); c++)
            len +=
                (size_t)(*c == '?' || *c == '#' || *c == '%'
                             ? snprintf(uri + len, sizeof(uri) - len, "%%%02X", (unsigned char)*c)
                             : snprintf(uri + len, sizeof(uri) - len, "%c", *c));
        if (len + 16 >= sizeof(uri))
            return SQLITE_CANTOPEN;
        snprintf(uri + len, sizeof(uri) - len, "?immutable=1");
        flags |= SQLITE_OPEN_URI;
    } else if (how == DB_OPEN_WAL_PRIVATE) {
        vfs = "unix-none";
        if (sqlite3_vfs_find(vfs) == NULL)
            return SQLITE_CANTOPEN;
    }
    rc = sqlite3_open_v2(how == DB_OPEN_IMMUTABLE ? uri : path, db_p, flags | SQLITE_OPEN_NOMUTEX,
                         vfs);
    /* before the first read, which would look for the shared-memory file */
    if (rc == SQLITE_OK && how == DB_OPEN_WAL_PRIVATE)
        rc = sqlite3_exec(*db_p, "PRAGMA locking_mode = EXCLUSIVE", NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v2(*db_p, "SELECT count(*) FROM sqlite_master", -1, &st, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st) == SQLITE_ROW ? SQLITE_OK : sqlite3_errcode(*db_p);
    sqlite3_finalize(st);
    return rc;
}

/* 1 when path's -wal file exists and is not empty: it may hold committed transactions that the
 * database file does not. */
static int db_has_wal(const char *path)
{
    size_t len = strlen(path);
    char *wal = malloc(len + 5);
    struct stat sb;
    int has;

    if (wal == NULL)
        return 1; /* the cautious answer */
    memcpy(wal, path, len);
    memcpy(wal + len, "-wal", 5);
    has = stat(wal, &sb) == 0 && sb.st_size > 0;
    free(wal);
    return has;
}

fsdp_status_t fsdp_trace_db_open(const char *path, int writable, sqlite3 **db_p)
{
    sqlite3 *db = NULL;
    fsdp_status_t status;
    struct stat sb;
    int64_t version;
    int rc, exists;

    if (path == NULL || *path == '\0') {
        fsdp_error("trace database path is %s: give a file name", path == NULL ? "NULL" : "empty");
        return FSDP_ERR_INVALID_PARAM;
    }
    exists = stat(path, &sb) == 0;
    if (!exists && (!writable || errno != ENOENT)) {
        fsdp_error("cannot open trace database '%s': %s", path, strerror(errno));
        return errno == ENOENT ? FSDP_ERR_NOT_FOUND : FSDP_ERR_IO;
    }
    if (exists && !S_ISREG(sb.st_mode)) {
        /* SQLite would block on a FIFO and call a directory a disk I/O error */
        fsdp_error("trace database '%s' is %s, not a regular file", path,
                   S_ISDIR(sb.st_mode)    ? "a directory"
                   : S_ISFIFO(sb.st_mode) ? "a FIFO"
                                          : "a special file");
        return FSDP_ERR_INVALID_PARAM;
    }
    /* A connection is used by one thread at a time (the writer's is handed to its thread at
     * creation), so SQLite's own mutexes are pure cost. */
    if (writable) {
        rc = db_try_open(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, DB_OPEN_PLAIN, &db);
    } else {
        /* A reader opens read-write when it can, so it may run the recovery that a killed writer
         * left to do; it never creates a file. Read-only, SQLite reads a -wal file through an
         * existing -shm file (a killed writer leaves both). In a read-only directory or file
         * system without a -shm file, SQLite cannot open a WAL database: one with a non-empty
         * -wal file (a killed writer's, whose -shm file is gone, or a copy of the two) is read
         * with the WAL index in this connection's memory, taking no locks (no writer can be
         * running: a writer keeps a -shm file); one without is read as immutable. */
        rc = db_try_open(path, SQLITE_OPEN_READWRITE, DB_OPEN_PLAIN, &db);
        if (rc != SQLITE_OK && (rc & 0xff) != SQLITE_NOTADB && (rc & 0xff) != SQLITE_CORRUPT) {
            sqlite3_close(db);
            rc = db_try_open(path, SQLITE_OPEN_READONLY, DB_OPEN_PLAIN, &db);
        }
        if (rc != SQLITE_OK && (rc & 0xff) != SQLITE_NOTADB && (rc & 0xff) != SQLITE_CORRUPT) {
            int wal = db_has_wal(path);

            sqlite3_close(db);
            rc = db_try_open(path, SQLITE_OPEN_READONLY,
                             wal ? DB_OPEN_WAL_PRIVATE : DB_OPEN_IMMUTABLE, &db);
            if (rc == SQLITE_OK)
                fsdp_debug("'%s' cannot be written: read %s", path,
                           wal ? "with its -wal file, without locks" : "as immutable");
            else if (wal && (rc & 0xff) != SQLITE_NOTADB && (rc & 0xff) != SQLITE_CORRUPT &&
                     (rc & 0xff) != SQLITE_NOMEM) {
                /* never the database file alone: it lacks the -wal file's steps */
                fsdp_error("cannot read trace database '%s' here: its -wal file may hold rows the "
                           "database file does not, and SQLite cannot read them in this "
                           "read-only place (%s); copy '%s' and '%s-wal' to a writable directory",
                           path, db != NULL ? sqlite3_errmsg(db) : sqlite3_errstr(rc), path, path);
                sqlite3_close(db);
                return FSDP_ERR_IO;
            }
        }
    }
    if ((rc & 0xff) == SQLITE_NOTADB || (rc & 0xff) == SQLITE_CORRUPT) {
        fsdp_error("'%s' is not a trace database: %s", path, sqlite3_errstr(rc));
        sqlite3_close(db);
        return FSDP_ERR_FORMAT;
    }
    if (rc != SQLITE_OK) {
        fsdp_error("cannot open trace database '%s': %s", path,
                   db != NULL ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
        sqlite3_close(db);
        return rc == SQLITE_NOMEM ? FSDP_ERR_NO_MEMORY : FSDP_ERR_IO;
    }
    sqlite3_busy_timeout(db, 10000);
    sqlite3_extended_result_codes(db, 1);

    status = db_user_version(db, path, &version);
    if (status != FSDP_OK)
        goto err_close;
    status = db_check_newer(path, version);
    if (status != FSDP_OK)
        goto err_close;
    if (writable) {
        status = db_setup_writer(db, path);
        if (status != FSDP_OK)
            goto err_close;
    } else if (version < 1) {
        /* version 1 reads as it is: its events table has the view's columns */
        fsdp_error("'%s' is not a libfsdp trace database (schema version %" PRId64 ", "
                   "expected 1 to %d)",
                   path, version, FSDP_TRACE_SCHEMA_VERSION);
        status = FSDP_ERR_FORMAT;
        goto err_close;
    }
    *db_p = db;
    return FSDP_OK;

err_close:
    sqlite3_close(db);
    return status;
}

fsdp_status_t fsdp_trace_db_find_run(sqlite3 *db, const char *path, int64_t run, int64_t *run_p)
{
    char sql[160];
    fsdp_status_t status;
    int64_t id = 0;
    int found = 0;

    if (run > 0)
        snprintf(sql, sizeof(sql), "SELECT id FROM runs WHERE id = %" PRId64, run);
    else
        snprintf(sql, sizeof(sql), "SELECT id FROM runs ORDER BY id DESC LIMIT 1 OFFSET %" PRId64,
                 -run);
    status = db_get_int(db, sql, &id, &found);
    if (status != FSDP_OK)
        return status;
    if (!found) {
        if (run > 0)
            fsdp_error("trace database '%s' has no run %" PRId64, path, run);
        else if (run == 0)
            fsdp_error("trace database '%s' holds no run", path);
        else
            fsdp_error("trace database '%s' has no run %" PRId64 " before the latest", path, -run);
        return FSDP_ERR_NOT_FOUND;
    }
    *run_p = id;
    return FSDP_OK;
}

/* The rank selected by sql (one row, or none), which must be an integer: SQLite orders NULL
 * first and texts and blobs last, so the lowest and the highest rank show any that is not. */
static fsdp_status_t db_get_rank(sqlite3 *db, const char *sql, const char *path, int64_t run,
                                 const char *table, int64_t *rank_p, int *found_p)
{
    sqlite3_stmt *st;
    fsdp_status_t status;
    int rc;

    *found_p = 0;
    status = fsdp_trace_db_prepare(db, sql, &st);
    if (status != FSDP_OK)
        return status;
    rc = sqlite3_step(st);
    status = FSDP_SQLITE_CALL(db, rc);
    if (status == FSDP_OK && rc == SQLITE_ROW) {
        if (sqlite3_column_type(st, 0) != SQLITE_INTEGER) {
            fsdp_error("trace database '%s': run %" PRId64 ": %s.rank = '%.32s' is not an integer",
                       path, run, table, (const char *)sqlite3_column_text(st, 0));
            status = FSDP_ERR_FORMAT;
        } else {
            *rank_p = sqlite3_column_int64(st, 0);
            *found_p = 1;
        }
    }
    sqlite3_finalize(st);
    return status;
}

/* The lowest (desc 0) or highest rank of a run's rows in table, through its key (run, rank, ..). */
static fsdp_status_t db_edge_rank(sqlite3 *db, const char *path, const char *table, int64_t run,
                                  int desc, int64_t *rank_p, int *found_p)
{
    char sql[160];

    snprintf(sql, sizeof(sql),
             "SELECT rank FROM %s WHERE run = %" PRId64 " ORDER BY rank %s LIMIT 1", table, run,
             desc ? "DESC" : "ASC");
    return db_get_rank(db, sql, path, run, table, rank_p, found_p);
}

fsdp_status_t fsdp_trace_db_num_ranks(sqlite3 *db, const char *path, int64_t run, int *n_p)
{
    static const char *const tables[] = {"events", "steps"};
    char sql[160];
    fsdp_status_t status;
    int64_t world = 0;
    int found = 0;

    snprintf(sql, sizeof(sql), "SELECT world_size FROM runs WHERE id = %" PRId64, run);
    status = db_get_int(db, sql, &world, &found);
    if (status != FSDP_OK)
        return status;
    if (!found) {
        fsdp_error("trace database '%s': run %" PRId64 ": runs.world_size is missing", path, run);
        return FSDP_ERR_FORMAT;
    }
    if (world < 1 || world > FSDP_TRACE_MAX_RANKS) {
        fsdp_error("trace database '%s': run %" PRId64 ": runs.world_size = %" PRId64
                   " is out of range [1, %d]",
                   path, run, world, FSDP_TRACE_MAX_RANKS);
        return FSDP_ERR_FORMAT;
    }
    /* every row's rank in [0, world_size): a corrupted rank cannot make a reader loop or index
     * past the ranks the run has */
    for (int t = 0; t < 2; t++) {
        for (int desc = 0; desc < 2; desc++) {
            int64_t rank = 0;

            status = db_edge_rank(db, path, tables[t], run, desc, &rank, &found);
            if (status != FSDP_OK)
                return status;
            if (found && (rank < 0 || rank >= world)) {
                fsdp_error("trace database '%s': run %" PRId64 ": %s.rank = %" PRId64
                           " is out of range [0, %" PRId64 ") (runs.world_size)",
                           path, run, tables[t], rank, world);
                return FSDP_ERR_FORMAT;
            }
        }
    }
    *n_p = (int)world;
    return FSDP_OK;
}

fsdp_status_t fsdp_trace_db_rank_classes(sqlite3 *db, int64_t run, int nranks,
                                         fsdp_trace_rank_class_t **classes_p, int *symmetric_p)
{
    fsdp_trace_rank_class_t *c;
    sqlite3_stmt *st;
    fsdp_status_t status;
    int64_t have = 0;
    int rc = SQLITE_DONE;

    *classes_p = NULL;
    *symmetric_p = 0;
    c = calloc((size_t)(nranks > 0 ? nranks : 1), sizeof(*c));
    if (c == NULL) {
        fsdp_error("out of host memory for the ranks of run %" PRId64, run);
        return FSDP_ERR_NO_MEMORY;
    }
    /* a file of version 2 or older, read as it is, has no ranks table */
    status = db_get_int(db,
                        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND "
                        "name = 'ranks'",
                        &have, NULL);
    if (status == FSDP_OK && have > 0) {
        status = fsdp_trace_db_prepare(
            db, "SELECT rank, stands_for, members FROM ranks WHERE run = ?1 ORDER BY rank", &st);
        if (status == FSDP_OK) {
            sqlite3_bind_int64(st, 1, run);
            while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                int r = sqlite3_column_int(st, 0);
                const char *m = fsdp_trace_col_text(st, 2);
                if (r < 0 || r >= nranks)
                    continue;
                c[r].stands_for = sqlite3_column_int(st, 1);
                if (c[r].stands_for > 1) {
                    *symmetric_p = 1;
                    if (m != NULL && (c[r].members = strdup(m)) == NULL) {
                        rc = SQLITE_NOMEM;
                        break;
                    }
                }
            }
            status = FSDP_SQLITE_CALL(db, rc);
            sqlite3_finalize(st);
        }
    }
    if (status != FSDP_OK) {
        fsdp_trace_rank_classes_free(c, nranks);
        *symmetric_p = 0;
        return status;
    }
    *classes_p = c;
    return FSDP_OK;
}

void fsdp_trace_rank_classes_free(fsdp_trace_rank_class_t *classes, int nranks)
{
    for (int r = 0; classes != NULL && r < nranks; r++)
        free(classes[r].members);
    free(classes);
}

const char *fsdp_trace_rank_label(const fsdp_trace_rank_class_t *classes, int rank, char *buf,
                                  size_t size)
{
    const fsdp_trace_rank_class_t *c = classes != NULL ? &classes[rank] : NULL;

    if (c == NULL || c->stands_for <= 1) {
        snprintf(buf, size, "rank %d", rank);
    } else {
        /* a long list of members is cut: the ranks table has it whole */
        const char *m = c->members != NULL ? c->members : "?";
        int cut = strlen(m) > FSDP_TRACE_MEMBERS_SHOWN;
        snprintf(buf, size, "rank %d (stands for %d ranks: %.*s%s)", rank, c->stands_for,
                 FSDP_TRACE_MEMBERS_SHOWN, m, cut ? "..." : "");
    }
    return buf;
}

int fsdp_trace_db_has_ranks(sqlite3 *db)
{
    int64_t have = 0;

    return db_get_int(db,
                      "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND "
                      "name = 'ranks'",
                      &have, NULL) == FSDP_OK &&
           have > 0;
}

/* Sets rep[m] = rank for every m of a members list ("0-6", "8-16376:8,16379"); their number,
 * or -1 when the list does not parse, leaves [0, world) or names a rank already claimed. */
static long members_claim(const char *m, int world, int rank, int *rep)
{
    long n = 0;

    while (*m != '\0') {
        char *end;
        long a, b, step = 1;

        a = strtol(m, &end, 10);
        if (end == m || a < 0)
            return -1;
        b = a;
        m = end;
        if (*m == '-') {
            b = strtol(m + 1, &end, 10);
            if (end == m + 1 || b < a)
                return -1;
            m = end;
            if (*m == ':') {
                step = strtol(m + 1, &end, 10);
                if (end == m + 1 || step < 1)
                    return -1;
                m = end;
            }
        }
        if (b >= world || (b - a) % step != 0)
            return -1;
        for (long x = a; x <= b; x += step) {
            if (rep[x] >= 0 && rep[x] != rank)
                return -1;
            rep[x] = rank;
            n++;
        }
        if (*m == ',')
            m++;
        else if (*m != '\0')
            return -1;
    }
    return n;
}

fsdp_status_t fsdp_trace_db_represent(sqlite3 *db, const char *path, int64_t run, int world,
                                      int *rep, int *traced_p)
{
    fsdp_status_t status = FSDP_OK;
    int traced = 0;

    for (int r = 0; r < world; r++)
        rep[r] = -1;
    if (fsdp_trace_db_has_ranks(db)) {
        sqlite3_stmt *st;
        int rc = SQLITE_DONE;

        status = fsdp_trace_db_prepare(
            db, "SELECT rank, stands_for, members FROM ranks WHERE run = ?1 ORDER BY rank", &st);
        if (status != FSDP_OK)
            return status;
        sqlite3_bind_int64(st, 1, run);
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
            int64_t r = sqlite3_column_int64(st, 0), count = sqlite3_column_int64(st, 1);
            const char *m = fsdp_trace_col_text(st, 2);
            long n;

            if (r < 0 || r >= world) {
                fsdp_error("trace database '%s', run %" PRId64 ": the ranks table names rank "
                           "%" PRId64 ", outside the world of %d",
                           path, run, r, world);
                status = FSDP_ERR_FORMAT;
                break;
            }
            if (count <= 1 && (rep[r] < 0 || rep[r] == (int)r)) {
                rep[r] = (int)r;
                continue;
            }
            n = count > 1 && m != NULL ? members_claim(m, world, (int)r, rep) : -1;
            if (n != count || rep[r] != (int)r) {
                fsdp_error("trace database '%s', run %" PRId64 ": rank %" PRId64 " stands for "
                           "%" PRId64 " ranks, but its members '%s' are not that many ranks of "
                           "the world of %d, itself among them, that no other rank stands for",
                           path, run, r, count, m != NULL ? m : "", world);
                status = FSDP_ERR_FORMAT;
                break;
            }
        }
        if (status == FSDP_OK)
            status = FSDP_SQLITE_CALL(db, rc);
        sqlite3_finalize(st);
        if (status != FSDP_OK)
            return status;
    }
    /* the ranks with events or steps of their own: themselves, unless claimed */
    for (int r = -1;;) {
        status = fsdp_trace_db_next_rank(db, path, run, r, &r);
        if (status != FSDP_OK || r < 0)
            break;
        if (r >= world) {
            fsdp_error("trace database '%s', run %" PRId64 ": rank %d is outside the world of %d",
                       path, run, r, world);
            return FSDP_ERR_FORMAT;
        }
        if (rep[r] >= 0 && rep[r] != r) {
            fsdp_error("trace database '%s', run %" PRId64 ": rank %d has events of its own, "
                       "but rank %d stands for it",
                       path, run, r, rep[r]);
            return FSDP_ERR_FORMAT;
        }
        rep[r] = r;
        traced++;
    }
    if (traced_p != NULL)
        *traced_p = traced;
    return status;
}

fsdp_status_t fsdp_trace_db_next_rank(sqlite3 *db, const char *path, int64_t run, int after,
                                      int *rank_p)
{
    static const char *const tables[] = {"events", "steps"};
    int64_t next = -1;

    for (int t = 0; t < 2; t++) {
        char sql[200];
        int64_t rank;
        int found = 0;
        fsdp_status_t status;

        snprintf(sql, sizeof(sql),
                 "SELECT rank FROM %s WHERE run = %" PRId64 " AND rank > %d ORDER BY rank LIMIT 1",
                 tables[t], run, after);
        /* a rank that is not an integer (1.5 after 1) would not move the caller on */
        status = db_get_rank(db, sql, path, run, tables[t], &rank, &found);
        if (status != FSDP_OK)
            return status;
        if (found && (next < 0 || rank < next))
            next = rank;
    }
    *rank_p = next > INT32_MAX ? INT32_MAX : (int)next;
    return FSDP_OK;
}

void fsdp_trace_row_event(sqlite3_stmt *st, int *rank_p, uint64_t *seq_p, fsdp_trace_event_t *ev)
{
    fsdp_event_kind_t kind = FSDP_EV_KIND_COUNT;
    fsdp_dtype_t dtype;
    const char *dt;

    *rank_p = sqlite3_column_int(st, 0);
    *seq_p = (uint64_t)sqlite3_column_int64(st, 1);
    if (fsdp_event_kind_parse(fsdp_trace_col_text(st, 2), &kind) != 0)
        kind = FSDP_EV_KIND_COUNT; /* written by a newer library */
    ev->kind = kind;
    ev->name = fsdp_trace_col_text(st, 3);
    if (ev->name == NULL)
        ev->name = "";
    ev->unit = fsdp_trace_col_text(st, 4);
    ev->stream = fsdp_trace_col_text(st, 5);
    ev->host_time = sqlite3_column_double(st, 6);
    ev->start = sqlite3_column_double(st, 7);
    ev->end = sqlite3_column_double(st, 8);
    ev->bytes = (uint64_t)sqlite3_column_int64(st, 9);
    ev->count = (uint64_t)sqlite3_column_int64(st, 10);
    dt = fsdp_trace_col_text(st, 11);
    ev->dtype = (dt != NULL && fsdp_dtype_parse(dt, &dtype)) ? (int)dtype : -1;
    ev->group = fsdp_trace_col_text(st, 12);
    ev->allocated = (uint64_t)sqlite3_column_int64(st, 13);
    ev->reserved = (uint64_t)sqlite3_column_int64(st, 14);
}

void fsdp_trace_row_step(sqlite3_stmt *st, fsdp_trace_step_row_t *row)
{
    int col = 7;

    row->rank = sqlite3_column_int(st, 0);
    row->step = sqlite3_column_int64(st, 1);
    row->loss = sqlite3_column_double(st, 2);
    row->step_time = sqlite3_column_double(st, 3);
    row->seq_end = (uint64_t)sqlite3_column_int64(st, 4);
    row->peak_allocated = (uint64_t)sqlite3_column_int64(st, 5);
    row->peak_reserved = (uint64_t)sqlite3_column_int64(st, 6);
    for (int c = 0; c < FSDP_MEM_CATEGORY_COUNT; c++)
        row->peak_by_category[c] = (uint64_t)sqlite3_column_int64(st, col++);
    for (int c = 0; c < FSDP_MEM_CATEGORY_COUNT; c++)
        row->at_peak_by_category[c] = (uint64_t)sqlite3_column_int64(st, col++);
}
