/* The SQLite boundary of the trace module: SQLite's result codes converted to statuses and
 * logged once, where the call failed (FSDP_SQLITE_CALL), and statements run and prepared. */
#include "trace/trace_int.h"

#include <fsdp/log.h>

#include <stdio.h>
#include <string.h>

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
