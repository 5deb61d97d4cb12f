/* Opening a trace database: the file checked before SQLite sees it, the ways a reader opens
 * one it cannot write, the schema version checked (docs/formats.md section 5), and a writer's
 * setup (WAL, the schema created, or an older version's converted). */
#include "trace/trace_int.h"

#include <fsdp/log.h>
#include <fsdp/version.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* traces/schema.sql as one C string, generated at build time (lib/Makefile.am). */
static const char trace_schema_sql[] =
#include "trace_schema.inc"
    ;

const char *fsdp_trace_schema(void)
{
    return trace_schema_sql;
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
