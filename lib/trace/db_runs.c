/* What runs and ranks a trace database holds: a run found by its id or its age, its ranks
 * counted and checked against its world, and what each traced rank stands for (the ranks
 * table). */
#include "trace/trace_int.h"

#include <fsdp/log.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
