/* fsdp-trace summary: what each rank did, from SQL aggregates (nothing is loaded whole). Ranks
 * whose lines are identical are printed once, as "ranks 0-3", which keeps a 1024-rank summary
 * readable. */
#include "base/strbuf.h"
#include "trace/trace_int.h"

#include <fsdp/log.h>

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* "1.50 MiB", "512 B": into buf (at least 32 bytes). */
static const char *fmt_bytes(uint64_t bytes, char *buf, size_t size)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;

    if (bytes < 1024) {
        snprintf(buf, size, "%" PRIu64 " B", bytes);
        return buf;
    }
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, size, "%.2f %s", v, units[u]);
    return buf;
}

typedef struct summary {
    sqlite3 *db;
    int64_t run;
    int nranks;
    fsdp_trace_rank_class_t *classes; /* what each rank stands for */
    fsdp_strbuf_t *blocks;            /* one per rank */
    FILE *out;
} summary_t;

typedef void (*summary_row_func_t)(fsdp_strbuf_t *b, sqlite3_stmt *st, int first);

static int summary_stands_for_others(const summary_t *s, int r)
{
    return s->classes[r].stands_for > 1;
}

/* Prints the per-rank blocks, folding runs of consecutive ranks with identical text; a rank that
 * stands for others is printed alone, with them. */
static void summary_print_folded(summary_t *s, const char *title)
{
    int any = 0;

    fprintf(s->out, "\n%s\n", title);
    for (int r = 0; r < s->nranks;) {
        int last = r;
        if (s->blocks[r].len == 0) {
            r++;
            continue;
        }
        while (!summary_stands_for_others(s, r) && last + 1 < s->nranks &&
               !summary_stands_for_others(s, last + 1) &&
               s->blocks[last + 1].len == s->blocks[r].len &&
               memcmp(s->blocks[last + 1].s, s->blocks[r].s, s->blocks[r].len) == 0)
            last++;
        if (last == r) {
            char label[128];
            fprintf(s->out, "  %s:\n%s", fsdp_trace_rank_label(s->classes, r, label, sizeof(label)),
                    s->blocks[r].s);
        } else
            fprintf(s->out, "  ranks %d-%d:\n%s", r, last, s->blocks[r].s);
        any = 1;
        r = last + 1;
    }
    if (!any)
        fprintf(s->out, "  (none)\n");
}

/* Runs a query whose first column is the rank and whose ?1 is the run, appending each row to
 * its rank's block; then prints the section. */
static fsdp_status_t summary_section(summary_t *s, const char *title, const char *sql,
                                     summary_row_func_t func, int end_line)
{
    sqlite3_stmt *st;
    fsdp_status_t status;
    int rc, prev = -1;

    for (int r = 0; r < s->nranks; r++)
        fsdp_strbuf_reset(&s->blocks[r]);
    status = fsdp_trace_db_prepare(s->db, sql, &st);
    if (status != FSDP_OK)
        return status;
    sqlite3_bind_int64(st, 1, s->run);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int rank = sqlite3_column_int(st, 0);
        if (rank < 0 || rank >= s->nranks)
            continue;
        func(&s->blocks[rank], st, rank != prev);
        prev = rank;
    }
    status = FSDP_SQLITE_CALL(s->db, rc);
    sqlite3_finalize(st);
    for (int r = 0; r < s->nranks && end_line; r++) {
        if (s->blocks[r].len > 0)
            fsdp_strbuf_printf(&s->blocks[r], "\n");
    }
    if (status == FSDP_OK)
        summary_print_folded(s, title);
    return status;
}

static void row_kinds(fsdp_strbuf_t *b, sqlite3_stmt *st, int first)
{
    fsdp_strbuf_printf(b, "%s%s %" PRId64, first ? "    " : ", ", fsdp_trace_col_text(st, 1),
                       (int64_t)sqlite3_column_int64(st, 2));
}

static void row_collectives(fsdp_strbuf_t *b, sqlite3_stmt *st, int first)
{
    char bytes[32];
    fsdp_strbuf_printf(b, "    %-16s %8" PRId64 " calls %14s\n", fsdp_trace_col_text(st, 1),
                       (int64_t)sqlite3_column_int64(st, 2),
                       fmt_bytes((uint64_t)sqlite3_column_int64(st, 3), bytes, sizeof(bytes)));
}

static void row_units(fsdp_strbuf_t *b, sqlite3_stmt *st, int first)
{
    char lo[32], hi[32], total[32];
    uint64_t min = (uint64_t)sqlite3_column_int64(st, 4);
    uint64_t max = (uint64_t)sqlite3_column_int64(st, 5);
    const char *dtypes = fsdp_trace_col_text(st, 7);

    fmt_bytes(min, lo, sizeof(lo));
    fmt_bytes(max, hi, sizeof(hi));
    fsdp_strbuf_printf(b, "    %-20s %-15s %6" PRId64 " x %s%s%s  (%s total) %s\n",
                       fsdp_trace_col_text(st, 1), fsdp_trace_col_text(st, 2),
                       (int64_t)sqlite3_column_int64(st, 3), lo, min != max ? " .. " : "",
                       min != max ? hi : "",
                       fmt_bytes((uint64_t)sqlite3_column_int64(st, 6), total, sizeof(total)),
                       dtypes != NULL ? dtypes : "");
}

static void row_steps(fsdp_strbuf_t *b, sqlite3_stmt *st, int first)
{
    fsdp_strbuf_printf(b,
                       "    %" PRId64 " steps, step time mean %.6g s (min %.6g, max %.6g), "
                       "loss %.6g -> %.6g\n",
                       (int64_t)sqlite3_column_int64(st, 1), sqlite3_column_double(st, 2),
                       sqlite3_column_double(st, 3), sqlite3_column_double(st, 4),
                       sqlite3_column_double(st, 5), sqlite3_column_double(st, 6));
}

static void row_ops(fsdp_strbuf_t *b, sqlite3_stmt *st, int first)
{
    fsdp_strbuf_printf(b, "    %-28s %8" PRId64 " %12.3f\n", fsdp_trace_col_text(st, 1),
                       (int64_t)sqlite3_column_int64(st, 2), 1e3 * sqlite3_column_double(st, 3));
}

static const char *const mem_cat_names[] = {
#define SUMMARY_CAT_NAME_(name, str) str,
    FSDP_FOREACH_MEM_CATEGORY(SUMMARY_CAT_NAME_)
#undef SUMMARY_CAT_NAME_
};

static void row_memory(fsdp_strbuf_t *b, sqlite3_stmt *st, int first)
{
    char v[32], w[32];
    int col = 3;

    fsdp_strbuf_printf(b, "    peak allocated %s, peak reserved %s\n",
                       fmt_bytes((uint64_t)sqlite3_column_int64(st, 1), v, sizeof(v)),
                       fmt_bytes((uint64_t)sqlite3_column_int64(st, 2), w, sizeof(w)));
    fsdp_strbuf_printf(b, "    %-18s %14s %14s\n", "category", "own peak", "at peak");
    for (int c = 0; c < FSDP_MEM_CATEGORY_COUNT; c++, col++) {
        uint64_t peak = (uint64_t)sqlite3_column_int64(st, col);
        uint64_t at = (uint64_t)sqlite3_column_int64(st, col + FSDP_MEM_CATEGORY_COUNT);
        if (peak == 0 && at == 0)
            continue;
        fsdp_strbuf_printf(b, "    %-18s %14s %14s\n", mem_cat_names[c],
                           fmt_bytes(peak, v, sizeof(v)), fmt_bytes(at, w, sizeof(w)));
    }
}

static void row_event_memory(fsdp_strbuf_t *b, sqlite3_stmt *st, int first)
{
    char v[32], w[32];
    fsdp_strbuf_printf(b, "    max allocated %s, max reserved %s (from events)\n",
                       fmt_bytes((uint64_t)sqlite3_column_int64(st, 1), v, sizeof(v)),
                       fmt_bytes((uint64_t)sqlite3_column_int64(st, 2), w, sizeof(w)));
}

/* The memory section: the highest of each peak over the steps; the at-peak columns come from
 * the step with the highest peak_allocated (SQLite takes bare columns from the row of the one
 * max() aggregate, so every other maximum is a subquery). */
static void memory_sql(char *sql, size_t size)
{
    size_t len = (size_t)snprintf(sql, size,
                                  "SELECT rank, max(peak_allocated), (SELECT max(peak_reserved) "
                                  "FROM steps s2 WHERE s2.run = steps.run AND "
                                  "s2.rank = steps.rank)");
    for (int c = 0; c < FSDP_MEM_CATEGORY_COUNT && len < size; c++)
        len += (size_t)snprintf(sql + len, size - len,
                                ", (SELECT max(peak_%s) FROM steps s2 "
                                "WHERE s2.run = steps.run AND s2.rank = steps.rank)",
                                mem_cat_names[c]);
    for (int c = 0; c < FSDP_MEM_CATEGORY_COUNT && len < size; c++)
        len += (size_t)snprintf(sql + len, size - len, ", at_peak_%s", mem_cat_names[c]);
    if (len < size)
        snprintf(sql + len, size - len, " FROM steps WHERE run = ?1 GROUP BY rank ORDER BY rank");
}

/* ---- exposed communication: collective time not hidden behind compute-stream work ---- */

typedef struct interval {
    double a, b;
} interval_t;

typedef struct interval_list {
    interval_t *v;
    size_t n, cap;
} interval_list_t;

static int interval_push(interval_list_t *l, double a, double b)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 256;
        interval_t *v = realloc(l->v, cap * sizeof(*v));
        if (v == NULL)
            return 0;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n].a = a;
    l->v[l->n].b = b;
    l->n++;
    return 1;
}

static int interval_cmp(const void *x, const void *y)
{
    const interval_t *p = x, *q = y;
    return p->a < q->a ? -1 : p->a > q->a ? 1 : (p->b < q->b ? -1 : p->b > q->b);
}

/* Sorts and merges in place; returns the length of the union. */
static double interval_union(interval_list_t *l)
{
    size_t k = 0;
    double len = 0.0;

    if (l->n == 0)
        return 0.0;
    qsort(l->v, l->n, sizeof(*l->v), interval_cmp);
    for (size_t i = 1; i < l->n; i++) {
        if (l->v[i].a <= l->v[k].b) {
            if (l->v[i].b > l->v[k].b)
                l->v[k].b = l->v[i].b;
        } else {
            l->v[++k] = l->v[i];
        }
    }
    l->n = k + 1;
    for (size_t i = 0; i < l->n; i++)
        len += l->v[i].b - l->v[i].a;
    return len;
}

/* Length of the intersection of two merged interval lists. */
static double interval_overlap(const interval_list_t *x, const interval_list_t *y)
{
    size_t i = 0, j = 0;
    double len = 0.0;

    while (i < x->n && j < y->n) {
        double a = x->v[i].a > y->v[j].a ? x->v[i].a : y->v[j].a;
        double b = x->v[i].b < y->v[j].b ? x->v[i].b : y->v[j].b;
        if (b > a)
            len += b - a;
        if (x->v[i].b < y->v[j].b)
            i++;
        else
            j++;
    }
    return len;
}

static fsdp_status_t summary_exposed(summary_t *s)
{
    interval_list_t comm = {0}, compute = {0};
    sqlite3_stmt *st;
    fsdp_status_t status;
    int rc, rank = -1;

    for (int r = 0; r < s->nranks; r++)
        fsdp_strbuf_reset(&s->blocks[r]);
    status = fsdp_trace_db_prepare(
        s->db,
        "SELECT rank, kind = 'collective', start_time, end_time FROM events "
        "WHERE run = ?1 AND end_time > start_time AND (kind = 'collective' OR "
        "(kind IN ('kernel', 'copy') AND stream = 'compute')) ORDER BY rank",
        &st);
    if (status != FSDP_OK)
        return status;
    sqlite3_bind_int64(st, 1, s->run);
    for (;;) {
        rc = sqlite3_step(st);
        int r = rc == SQLITE_ROW ? sqlite3_column_int(st, 0) : -1;
        if (r != rank && rank >= 0 && rank < s->nranks) {
            /* the previous rank is complete */
            double c = interval_union(&comm), k = interval_union(&compute);
            double hidden = interval_overlap(&comm, &compute);
            fsdp_strbuf_printf(&s->blocks[rank],
                               "    communication %.6g s, compute %.6g s, exposed communication "
                               "%.6g s (%.1f%% of the communication)\n",
                               c, k, c - hidden, c > 0 ? 100.0 * (c - hidden) / c : 0.0);
            comm.n = compute.n = 0;
        }
        if (rc != SQLITE_ROW)
            break;
        rank = r;
        if (!interval_push(sqlite3_column_int(st, 1) ? &comm : &compute,
                           sqlite3_column_double(st, 2), sqlite3_column_double(st, 3))) {
            rc = SQLITE_NOMEM;
            break;
        }
    }
    status = FSDP_SQLITE_CALL(s->db, rc);
    sqlite3_finalize(st);
    free(comm.v);
    free(compute.v);
    if (status == FSDP_OK)
        summary_print_folded(s, "exposed communication (collectives not overlapped by compute)");
    return status;
}

/* A symmetric run's simulated ranks, each with every rank it stands for. */
static void summary_classes(const summary_t *s)
{
    int n = 0, world = 0;

    for (int r = 0; r < s->nranks; r++) {
        n += s->classes[r].stands_for > 0;
        world += s->classes[r].stands_for;
    }
    fprintf(s->out,
            "\nsimulated ranks: %d, standing for %d (each runs as the ranks it stands "
            "for)\n",
            n, world);
    for (int r = 0; r < s->nranks; r++) {
        const fsdp_trace_rank_class_t *c = &s->classes[r];
        if (c->stands_for > 1)
            fprintf(s->out, "  rank %d stands for %d ranks: %s\n", r, c->stands_for,
                    c->members != NULL ? c->members : "?");
        else if (c->stands_for == 1)
            fprintf(s->out, "  rank %d stands for itself\n", r);
    }
}

fsdp_status_t fsdp_trace_summary(const char *path, int64_t run, FILE *out)
{
    fsdp_trace_reader_t *reader = NULL;
    fsdp_trace_run_row_t info;
    summary_t s;
    fsdp_status_t status;
    char sql[4096];
    int symmetric = 0;

    memset(&s, 0, sizeof(s));
    s.out = out != NULL ? out : stdout;
    status = fsdp_trace_reader_open(path, &reader);
    if (status != FSDP_OK)
        return status;
    status = fsdp_trace_reader_find_run(reader, run, &s.run);
    if (status != FSDP_OK)
        goto out;
    status = fsdp_trace_reader_run(reader, s.run, &info);
    if (status != FSDP_OK)
        goto out;
    fprintf(s.out, "run %" PRId64 ": backend %s, world %d, strategy %s, libfsdp %s, created %s%s\n",
            info.id, info.backend != NULL ? info.backend : "?", info.world_size,
            info.strategy != NULL ? info.strategy : "-", info.version != NULL ? info.version : "?",
            info.created != NULL ? info.created : "?",
            info.finished ? ""
                          : " (not finished: the writer was stopped, failed or is still running)");
    if (info.command_line != NULL)
        fprintf(s.out, "command: %s\n", info.command_line);

    s.db = fsdp_trace_reader_db(reader);
    status = fsdp_trace_db_num_ranks(s.db, path, s.run, &s.nranks);
    if (status != FSDP_OK)
        goto out;
    status = fsdp_trace_db_rank_classes(s.db, s.run, s.nranks, &s.classes, &symmetric);
    if (status != FSDP_OK)
        goto out;
    s.blocks = calloc((size_t)(s.nranks > 0 ? s.nranks : 1), sizeof(*s.blocks));
    if (s.blocks == NULL) {
        status = FSDP_ERR_NO_MEMORY;
        fsdp_error("summary of '%s': out of host memory", path);
        goto out;
    }
    if (symmetric)
        summary_classes(&s);

    status = summary_section(&s, "events per kind",
                             "SELECT rank, kind, count(*) FROM events WHERE run = ?1 "
                             "GROUP BY rank, kind ORDER BY rank, kind",
                             row_kinds, 1);
    if (status != FSDP_OK)
        goto out;
    status = summary_section(&s, "collectives (calls, bytes)",
                             "SELECT rank, name, count(*), sum(bytes) FROM events "
                             "WHERE run = ?1 AND kind = 'collective' "
                             "GROUP BY rank, name ORDER BY rank, name",
                             row_collectives, 0);
    if (status != FSDP_OK)
        goto out;
    status = summary_section(&s, "all-gather and reduce-scatter per unit (calls x bytes per call)",
                             "SELECT rank, coalesce(unit, '-'), name, count(*), min(bytes), "
                             "max(bytes), sum(bytes), group_concat(DISTINCT dtype) FROM events "
                             "WHERE run = ?1 AND kind = 'collective' "
                             "AND name IN ('all_gather', 'reduce_scatter') "
                             "GROUP BY rank, unit, name ORDER BY rank, unit, name",
                             row_units, 0);
    if (status != FSDP_OK)
        goto out;
    status = summary_section(&s, "steps",
                             "SELECT rank, count(*), avg(step_time), min(step_time), "
                             "max(step_time), "
                             "(SELECT loss FROM steps s2 WHERE s2.run = steps.run AND "
                             "s2.rank = steps.rank ORDER BY step LIMIT 1), "
                             "(SELECT loss FROM steps s2 WHERE s2.run = steps.run AND "
                             "s2.rank = steps.rank ORDER BY step DESC LIMIT 1) "
                             "FROM steps WHERE run = ?1 GROUP BY rank ORDER BY rank",
                             row_steps, 0);
    if (status != FSDP_OK)
        goto out;
    status = summary_exposed(&s);
    if (status != FSDP_OK)
        goto out;
    /* what a step spent where: rank 0's last step, whose op times compare with a profiler's
     * kernel table (every rank's would not fold: their times differ) */
    status = summary_section(
        &s, "time per op in rank 0's last step (kernels, copies, collectives: calls, ms)",
        "SELECT e.rank, e.kind || ' ' || e.name, count(*), sum(e.end_time - e.start_time) "
        "FROM events e, (SELECT max(step) AS last FROM steps WHERE run = ?1 AND rank = 0) l, "
        "steps s1 WHERE e.run = ?1 AND e.rank = 0 AND e.kind IN ('kernel', 'copy', 'collective') "
        "AND s1.run = ?1 AND s1.rank = 0 AND s1.step = l.last AND e.seq < s1.seq_end "
        "AND e.seq >= coalesce((SELECT max(seq_end) FROM steps WHERE run = ?1 AND rank = 0 "
        "AND step < l.last), 0) "
        "GROUP BY e.kind, e.name ORDER BY 4 DESC, 2",
        row_ops, 0);
    if (status != FSDP_OK)
        goto out;
    memory_sql(sql, sizeof(sql));
    status = summary_section(&s, "peak memory (from steps)", sql, row_memory, 0);
    if (status != FSDP_OK)
        goto out;
    status = summary_section(&s, "memory (from events)",
                             "SELECT rank, max(allocated), max(reserved) FROM events "
                             "WHERE run = ?1 GROUP BY rank ORDER BY rank",
                             row_event_memory, 0);
out:
    if (s.blocks != NULL) {
        for (int r = 0; r < s.nranks; r++)
            fsdp_strbuf_free(&s.blocks[r]);
        free(s.blocks);
    }
    fsdp_trace_rank_classes_free(s.classes, s.nranks);
    fsdp_trace_reader_close(reader);
    return status;
}
