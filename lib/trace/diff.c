/* fsdp-trace diff: two runs compared structure first, then timing and memory.
 *
 * Structure. For each rank, the events of both runs are split by stream (host events form their
 * own track) and aligned by sequence. Two events are the same op when kind, name, unit and group
 * agree, and equal when bytes, count and dtype agree too. At the first position where a stream's
 * events differ, a longest-common-subsequence alignment of a window of what follows classifies
 * the change: an op of A that B lacks (missing), one that B adds (extra), the same op removed
 * here and found elsewhere (reordered), the same op with another size (resized) or dtype. When
 * every stream agrees, the rank's issue order across streams is compared as well. The reported
 * divergence is the one of the lowest rank with the lowest sequence number in A; only it is
 * classified, so a 1024-rank diff stays cheap.
 *
 * Symmetric plans. A trace of a symmetric plan holds one simulated rank per class, each
 * standing for its members (the ranks table). Every rank of the world is compared through the
 * rank that stands for it on each side (itself, in a trace of every rank), once per distinct
 * pair of such ranks. Two different ranks' events name their groups differently (a split's
 * name carries its color: rank 5's node is world/split(1) where rank 1's is world/split(0)),
 * so they are compared up to a renaming of the groups: each side's groups are numbered in the
 * order the rank first uses them. A rank compared with itself is compared by name.
 *
 * Timing and memory: totals per kind and per unit from SQL aggregates, printed as B / A; a
 * simulated rank's events and steps count as many times as the ranks it stands for.
 */
#include "trace/trace_int.h"

#include <fsdp/log.h>

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define DIFF_WINDOW 1024 /* events aligned by LCS after the first difference */
#define DIFF_CONTEXT 3   /* events shown on each side of the divergence */

/* ---- Interned strings: equal strings are one pointer, so comparing events is cheap. ------ */

typedef struct strpool {
    char **slots;
    size_t cap, n;
    int failed;
} strpool_t;

static uint64_t str_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static const char *pool_intern(strpool_t *p, const char *s)
{
    size_t i;

    if (s == NULL)
        return NULL;
    if ((p->n + 1) * 2 > p->cap) {
        size_t cap = p->cap == 0 ? 256 : p->cap * 2;
        char **slots = calloc(cap, sizeof(*slots));
        if (slots == NULL) {
            p->failed = 1;
            return "";
        }
        for (size_t k = 0; k < p->cap; k++) {
            if (p->slots[k] == NULL)
                continue;
            for (i = str_hash(p->slots[k]) & (cap - 1); slots[i] != NULL; i = (i + 1) & (cap - 1))
                ;
            slots[i] = p->slots[k];
        }
        free(p->slots);
        p->slots = slots;
        p->cap = cap;
    }
    for (i = str_hash(s) & (p->cap - 1); p->slots[i] != NULL; i = (i + 1) & (p->cap - 1)) {
        if (strcmp(p->slots[i], s) == 0)
            return p->slots[i];
    }
    p->slots[i] = strdup(s);
    if (p->slots[i] == NULL) {
        p->failed = 1;
        return "";
    }
    p->n++;
    return p->slots[i];
}

static void pool_free(strpool_t *p)
{
    for (size_t k = 0; k < p->cap; k++)
        free(p->slots[k]);
    free(p->slots);
}

/* ---- One rank's events of one run ------------------------------------------------------- */

typedef struct diff_ev {
    uint64_t seq;
    const char *kind, *name, *unit, *stream, *group; /* interned */
    const char *dtype;                               /* interned, NULL if none */
    const char *grp_cmp; /* the group as compared: group, or its number in the rank's order */
    double host_time, start, end;
    uint64_t bytes, count;
} diff_ev_t;

typedef struct ev_list {
    diff_ev_t *ev;
    size_t n, cap;
} ev_list_t;

/* A view of some events of a list (one stream, or all of them), by index. */
typedef struct ev_view {
    const diff_ev_t **ev;
    size_t n, cap;
} ev_view_t;

typedef struct diff_side {
    const char *path;
    sqlite3 *db;
    int64_t run;
    fsdp_trace_run_row_t info;
    sqlite3_stmt *load; /* the events of one rank */
    ev_list_t list;
    int loaded;   /* the rank in list, -1 for none */
    int *rep;     /* [world]: the rank whose events stand for each rank, or -1 */
    int traced;   /* ranks with events of their own */
    int weighted; /* the file has a ranks table: aggregates weigh ranks by stands_for */
} diff_side_t;

static int op_eq(const diff_ev_t *a, const diff_ev_t *b)
{
    return a->kind == b->kind && a->name == b->name && a->unit == b->unit &&
           a->grp_cmp == b->grp_cmp;
}

static int ev_eq(const diff_ev_t *a, const diff_ev_t *b)
{
    return op_eq(a, b) && a->bytes == b->bytes && a->count == b->count && a->dtype == b->dtype;
}

static fsdp_status_t side_load_rank(diff_side_t *s, strpool_t *pool, int rank)
{
    sqlite3_stmt *st = s->load;
    int rc;

    if (s->loaded == rank)
        return FSDP_OK;
    s->list.n = 0;
    s->loaded = -1;
    if (rank < 0)
        return FSDP_OK; /* nothing stands for the rank here: no events */
    sqlite3_reset(st);
    sqlite3_bind_int(st, 2, rank);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        diff_ev_t *e;
        if (s->list.n == s->list.cap) {
            size_t cap = s->list.cap == 0 ? 1024 : s->list.cap * 2;
            diff_ev_t *ev = realloc(s->list.ev, cap * sizeof(*ev));
            if (ev == NULL) {
                fsdp_error("diff: out of host memory for rank %d of '%s'", rank, s->path);
                return FSDP_ERR_NO_MEMORY;
            }
            s->list.ev = ev;
            s->list.cap = cap;
        }
        e = &s->list.ev[s->list.n++];
        e->seq = (uint64_t)sqlite3_column_int64(st, 1);
        e->kind = pool_intern(pool, fsdp_trace_col_text(st, 2));
        e->name = pool_intern(pool, fsdp_trace_col_text(st, 3));
        e->unit = pool_intern(pool, fsdp_trace_col_text(st, 4));
        e->stream = pool_intern(pool, fsdp_trace_col_text(st, 5));
        e->host_time = sqlite3_column_double(st, 6);
        e->start = sqlite3_column_double(st, 7);
        e->end = sqlite3_column_double(st, 8);
        e->bytes = (uint64_t)sqlite3_column_int64(st, 9);
        e->count = (uint64_t)sqlite3_column_int64(st, 10);
        e->dtype = pool_intern(pool, fsdp_trace_col_text(st, 11));
        e->group = pool_intern(pool, fsdp_trace_col_text(st, 12));
        e->grp_cmp = e->group;
    }
    sqlite3_reset(st);
    if (pool->failed) {
        fsdp_error("diff: out of host memory for rank %d of '%s'", rank, s->path);
        return FSDP_ERR_NO_MEMORY;
    }
    if (rc == SQLITE_DONE)
        s->loaded = rank;
    return FSDP_SQLITE_CALL(s->db, rc);
}

/* The groups of a rank's events as compared: by name, or (`renamed`) by their number in the
 * order the rank first uses them ("\001" and the number, which no group name is). */
static fsdp_status_t list_groups(ev_list_t *l, strpool_t *pool, int renamed)
{
    const char *seen[64];
    int nseen = 0;

    for (size_t i = 0; i < l->n; i++) {
        diff_ev_t *e = &l->ev[i];
        char name[16];
        int k;

        e->grp_cmp = e->group;
        if (!renamed || e->group == NULL)
            continue;
        for (k = 0; k < nseen && seen[k] != e->group; k++)
            ;
        if (k == nseen && nseen < (int)(sizeof(seen) / sizeof(seen[0])))
            seen[nseen++] = e->group;
        if (k == (int)(sizeof(seen) / sizeof(seen[0])))
            continue; /* past the first 64 groups: by name */
        snprintf(name, sizeof(name), "\001%d", k);
        e->grp_cmp = pool_intern(pool, name);
    }
    if (pool->failed) {
        fsdp_error("diff: out of host memory");
        return FSDP_ERR_NO_MEMORY;
    }
    return FSDP_OK;
}

static int view_push(ev_view_t *v, const diff_ev_t *e)
{
    if (v->n == v->cap) {
        size_t cap = v->cap == 0 ? 256 : v->cap * 2;
        const diff_ev_t **ev = realloc(v->ev, cap * sizeof(*ev));
        if (ev == NULL)
            return -1;
        v->ev = ev;
        v->cap = cap;
    }
    v->ev[v->n++] = e;
    return 0;
}

/* The events of `stream` (a pointer of the pool; NULL: host events), or all if all_streams. */
static int view_select(ev_view_t *v, const ev_list_t *l, const char *stream, int all_streams)
{
    v->n = 0;
    for (size_t i = 0; i < l->n; i++) {
        if ((all_streams || l->ev[i].stream == stream) && view_push(v, &l->ev[i]) != 0)
            return -1;
    }
    return 0;
}

/* The first index where the views differ; min(na, nb) when one is a prefix of the other. */
static size_t view_first_diff(const ev_view_t *a, const ev_view_t *b)
{
    size_t n = a->n < b->n ? a->n : b->n, i;
    for (i = 0; i < n; i++) {
        if (!ev_eq(a->ev[i], b->ev[i]))
            break;
    }
    return i;
}

/* ---- Classifying the first difference --------------------------------------------------- */

typedef struct divergence {
    fsdp_trace_divergence_t what;
    size_t ia, ib;          /* the diverging positions in the views (n when at the end) */
    const diff_ev_t *a;     /* the event of A or NULL */
    const diff_ev_t *b;     /* the event of B or NULL */
    const diff_ev_t *moved; /* reordered: the op found elsewhere */
} divergence_t;

/* LCS of a[i..i+wa) and b[i..i+wb); walks the alignment and classifies its first edit. */
static fsdp_status_t classify_lcs(const ev_view_t *a, const ev_view_t *b, size_t i, divergence_t *d)
{
    size_t wa = a->n - i, wb = b->n - i;
    int truncated = 0;
    uint16_t *L;
    size_t x, y, last_match_x = 0, last_match_y = 0;
    int any_match = 0;
    /* edits in walk order */
    size_t *del, *ins, ndel = 0, nins = 0;

    if (wa > DIFF_WINDOW) {
        wa = DIFF_WINDOW;
        truncated = 1;
    }
    if (wb > DIFF_WINDOW) {
        wb = DIFF_WINDOW;
        truncated = 1;
    }
    L = calloc((wa + 1) * (wb + 1), sizeof(*L));
    del = malloc((wa + 1) * sizeof(*del));
    ins = malloc((wb + 1) * sizeof(*ins));
    if (L == NULL || del == NULL || ins == NULL) {
        free(L);
        free(del);
        free(ins);
        fsdp_error("diff: out of host memory");
        return FSDP_ERR_NO_MEMORY;
    }
#define LCS(x_, y_) L[(x_) * (wb + 1) + (y_)]
    for (x = wa; x-- > 0;) {
        for (y = wb; y-- > 0;) {
            if (ev_eq(a->ev[i + x], b->ev[i + y]))
                LCS(x, y) = (uint16_t)(LCS(x + 1, y + 1) + 1);
            else
                LCS(x, y) = LCS(x + 1, y) >= LCS(x, y + 1) ? LCS(x + 1, y) : LCS(x, y + 1);
        }
    }
    x = y = 0;
    while (x < wa || y < wb) {
        if (x < wa && y < wb && ev_eq(a->ev[i + x], b->ev[i + y])) {
            x++;
            y++;
            last_match_x = x;
            last_match_y = y;
            any_match = 1;
        } else if (y == wb || (x < wa && LCS(x + 1, y) >= LCS(x, y + 1))) {
            del[ndel++] = x++; /* ties go to a deletion: an op of A is missing */
        } else {
            ins[nins++] = y++;
        }
    }
#undef LCS
    /* Edits after the last match of a cut window are artefacts of the cut. */
    if (truncated && any_match) {
        while (ndel > 0 && del[ndel - 1] >= last_match_x)
            ndel--;
        while (nins > 0 && ins[nins - 1] >= last_match_y)
            nins--;
    }

    d->ia = i;
    d->ib = i;
    d->a = i < a->n ? a->ev[i] : NULL;
    d->b = i < b->n ? b->ev[i] : NULL;
    int a0_deleted = ndel > 0 && del[0] == 0;
    int b0_inserted = nins > 0 && ins[0] == 0;
    if (a0_deleted) {
        for (size_t k = 0; k < nins; k++) {
            if (ev_eq(b->ev[i + ins[k]], d->a)) {
                d->what = FSDP_TRACE_DIV_REORDERED;
                d->moved = d->a;
                goto out;
            }
        }
    }
    if (b0_inserted) {
        for (size_t k = 0; k < ndel; k++) {
            if (ev_eq(a->ev[i + del[k]], d->b)) {
                d->what = FSDP_TRACE_DIV_REORDERED;
                d->moved = d->b;
                goto out;
            }
        }
    }
    if (a0_deleted && b0_inserted)
        d->what = FSDP_TRACE_DIV_CHANGED;
    else if (a0_deleted)
        d->what = FSDP_TRACE_DIV_MISSING;
    else
        d->what = FSDP_TRACE_DIV_EXTRA;
out:
    free(L);
    free(del);
    free(ins);
    return FSDP_OK;
}

static fsdp_status_t classify(const ev_view_t *a, const ev_view_t *b, size_t i, divergence_t *d)
{
    memset(d, 0, sizeof(*d));
    d->ia = d->ib = i;
    d->a = i < a->n ? a->ev[i] : NULL;
    d->b = i < b->n ? b->ev[i] : NULL;
    if (d->a == NULL) {
        d->what = FSDP_TRACE_DIV_EXTRA;
        return FSDP_OK;
    }
    if (d->b == NULL) {
        d->what = FSDP_TRACE_DIV_MISSING;
        return FSDP_OK;
    }
    if (op_eq(d->a, d->b)) {
        d->what = d->a->dtype != d->b->dtype ? FSDP_TRACE_DIV_DTYPE : FSDP_TRACE_DIV_RESIZED;
        return FSDP_OK;
    }
    return classify_lcs(a, b, i, d);
}

/* ---- Report ------------------------------------------------------------------------------ */

static void fmt_ev(char *buf, size_t size, const diff_ev_t *e)
{
    snprintf(
        buf, size, "seq %" PRIu64 " %s %s%s%s%s%s%s%s bytes=%" PRIu64 " count=%" PRIu64 " dtype=%s",
        e->seq, e->kind, e->name, e->unit != NULL ? " unit=" : "", e->unit != NULL ? e->unit : "",
        e->stream != NULL ? " stream=" : "", e->stream != NULL ? e->stream : "",
        e->group != NULL ? " group=" : "", e->group != NULL ? e->group : "", e->bytes, e->count,
        e->dtype != NULL ? e->dtype : "-");
}

static void print_context(FILE *out, const char *label, const ev_view_t *v, size_t at)
{
    size_t from = at > DIFF_CONTEXT ? at - DIFF_CONTEXT : 0;
    size_t to = at + DIFF_CONTEXT + 1 < v->n ? at + DIFF_CONTEXT + 1 : v->n;
    char line[1024];

    fprintf(out, "  %s:\n", label);
    if (from > 0)
        fprintf(out, "       ...\n");
    for (size_t k = from; k < to; k++) {
        fmt_ev(line, sizeof(line), v->ev[k]);
        fprintf(out, "    %s %s\n", k == at ? "=>" : "  ", line);
    }
    if (at >= v->n)
        fprintf(out, "    => (end: no more events)\n");
    else if (to < v->n)
        fprintf(out, "       ...\n");
}

static void describe(fsdp_trace_diff_t *res, const divergence_t *d, int rank, const char *where)
{
    char ea[512] = "", eb[512] = "";

    if (d->a != NULL)
        fmt_ev(ea, sizeof(ea), d->a);
    if (d->b != NULL)
        fmt_ev(eb, sizeof(eb), d->b);
    switch (d->what) {
    case FSDP_TRACE_DIV_MISSING:
        snprintf(res->message, sizeof(res->message), "rank %d, %s: missing op: A has [%s], B not",
                 rank, where, ea);
        break;
    case FSDP_TRACE_DIV_EXTRA:
        snprintf(res->message, sizeof(res->message), "rank %d, %s: extra op: B has [%s], A not",
                 rank, where, eb);
        break;
    case FSDP_TRACE_DIV_REORDERED:
        snprintf(res->message, sizeof(res->message),
                 "rank %d, %s: reordered ops: A has [%s] where B has [%s]", rank, where, ea, eb);
        break;
    case FSDP_TRACE_DIV_RESIZED:
        snprintf(res->message, sizeof(res->message),
                 "rank %d, %s: resized op: A [%s], B bytes=%" PRIu64 " count=%" PRIu64, rank, where,
                 ea, d->b->bytes, d->b->count);
        break;
    case FSDP_TRACE_DIV_DTYPE:
        snprintf(res->message, sizeof(res->message), "rank %d, %s: changed dtype: A [%s], B %s",
                 rank, where, ea, d->b->dtype != NULL ? d->b->dtype : "-");
        break;
    default:
        snprintf(res->message, sizeof(res->message), "rank %d, %s: changed op: A [%s], B [%s]",
                 rank, where, ea, eb);
        break;
    }
}

/* ---- Per rank ------------------------------------------------------------------------------ */

typedef struct rank_diff {
    int found;
    int issue_order;    /* the streams agree, the interleaving does not */
    const char *stream; /* the diverging stream (pool pointer), NULL for host events */
    size_t index;       /* in that stream's views */
    uint64_t key;       /* A's sequence number at the divergence, for "first" */
} rank_diff_t;

typedef struct diff_ctx {
    strpool_t pool;
    diff_side_t side[2];
    ev_view_t va, vb;
    const char **streams;
    size_t nstreams, cap_streams;
} diff_ctx_t;

static int ctx_add_stream(diff_ctx_t *c, const char *s)
{
    for (size_t k = 0; k < c->nstreams; k++) {
        if (c->streams[k] == s)
            return 0;
    }
    if (c->nstreams == c->cap_streams) {
        size_t cap = c->cap_streams == 0 ? 16 : c->cap_streams * 2;
        const char **v = realloc(c->streams, cap * sizeof(*v));
        if (v == NULL)
            return -1;
        c->streams = v;
        c->cap_streams = cap;
    }
    c->streams[c->nstreams++] = s;
    return 0;
}

static uint64_t div_key(const ev_view_t *a, size_t i)
{
    if (i < a->n)
        return a->ev[i]->seq;
    return a->n > 0 ? a->ev[a->n - 1]->seq + 1 : 0;
}

/* Finds the rank's first divergence (no classification). */
static fsdp_status_t diff_rank(diff_ctx_t *c, rank_diff_t *rd)
{
    const ev_list_t *la = &c->side[0].list, *lb = &c->side[1].list;

    memset(rd, 0, sizeof(*rd));
    c->nstreams = 0;
    for (size_t i = 0; i < la->n; i++) {
        if (ctx_add_stream(c, la->ev[i].stream) != 0)
            goto err_no_memory;
    }
    for (size_t i = 0; i < lb->n; i++) {
        if (ctx_add_stream(c, lb->ev[i].stream) != 0)
            goto err_no_memory;
    }
    for (size_t k = 0; k < c->nstreams; k++) {
        size_t i;
        uint64_t key;
        if (view_select(&c->va, la, c->streams[k], 0) != 0 ||
            view_select(&c->vb, lb, c->streams[k], 0) != 0)
            goto err_no_memory;
        i = view_first_diff(&c->va, &c->vb);
        if (i == c->va.n && i == c->vb.n)
            continue;
        key = div_key(&c->va, i);
        if (!rd->found || key < rd->key) {
            rd->found = 1;
            rd->stream = c->streams[k];
            rd->index = i;
            rd->key = key;
        }
    }
    if (!rd->found) {
        /* Same ops per stream: the issue order across streams can still differ. */
        if (view_select(&c->va, la, NULL, 1) != 0 || view_select(&c->vb, lb, NULL, 1) != 0)
            goto err_no_memory;
        size_t i = view_first_diff(&c->va, &c->vb);
        if (i < c->va.n || i < c->vb.n) {
            rd->found = 1;
            rd->issue_order = 1;
            rd->index = i;
            rd->key = div_key(&c->va, i);
        }
    }
    return FSDP_OK;

err_no_memory:
    fsdp_error("diff: out of host memory");
    return FSDP_ERR_NO_MEMORY;
}

/* Classifies and reports the divergence found by diff_rank for `rank` (loaded). */
static fsdp_status_t report_rank(diff_ctx_t *c, int rank, const rank_diff_t *rd, FILE *out,
                                 fsdp_trace_diff_t *res)
{
    const ev_list_t *la = &c->side[0].list, *lb = &c->side[1].list;
    divergence_t d;
    fsdp_status_t status;
    char where[128];

    if (view_select(&c->va, la, rd->stream, rd->issue_order) != 0 ||
        view_select(&c->vb, lb, rd->stream, rd->issue_order) != 0) {
        fsdp_error("diff: out of host memory");
        return FSDP_ERR_NO_MEMORY;
    }
    if (rd->issue_order) {
        memset(&d, 0, sizeof(d));
        d.what = FSDP_TRACE_DIV_REORDERED;
        d.ia = d.ib = rd->index;
        d.a = rd->index < c->va.n ? c->va.ev[rd->index] : NULL;
        d.b = rd->index < c->vb.n ? c->vb.ev[rd->index] : NULL;
        snprintf(where, sizeof(where), "issue order across streams");
    } else {
        status = classify(&c->va, &c->vb, rd->index, &d);
        if (status != FSDP_OK)
            return status;
        snprintf(where, sizeof(where), "stream %s", rd->stream != NULL ? rd->stream : "(host)");
    }
    res->what = d.what;
    res->rank = rank;
    snprintf(res->stream, sizeof(res->stream), "%s",
             rd->issue_order || rd->stream == NULL ? "" : rd->stream);
    res->seq_a = d.a != NULL ? (int64_t)d.a->seq : -1;
    res->seq_b = d.b != NULL ? (int64_t)d.b->seq : -1;
    describe(res, &d, rank, where);
    if (out != NULL) {
        fprintf(out, "first divergence: %s\n", res->message);
        print_context(out, "A", &c->va, d.ia);
        print_context(out, "B", &c->vb, d.ib);
    }
    return FSDP_OK;
}

/* ---- Timing and memory ratios ---------------------------------------------------------- */

typedef struct agg_row {
    char *key;
    double count, time, bytes;
} agg_row_t;

typedef struct agg {
    agg_row_t *rows;
    size_t n, cap;
} agg_t;

static void agg_free(agg_t *g)
{
    for (size_t i = 0; i < g->n; i++)
        free(g->rows[i].key);
    free(g->rows);
    memset(g, 0, sizeof(*g));
}

/* Rows of (key, count, time, bytes) sorted by key (the query's ORDER BY). */
static fsdp_status_t agg_query(diff_side_t *s, const char *sql, agg_t *g)
{
    sqlite3_stmt *st;
    fsdp_status_t status;
    int rc;

    status = fsdp_trace_db_prepare(s->db, sql, &st);
    if (status != FSDP_OK)
        return status;
    sqlite3_bind_int64(st, 1, s->run);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *key = fsdp_trace_col_text(st, 0);
        if (g->n == g->cap) {
            size_t cap = g->cap == 0 ? 32 : g->cap * 2;
            agg_row_t *rows = realloc(g->rows, cap * sizeof(*rows));
            if (rows == NULL)
                goto err_no_memory;
            g->rows = rows;
            g->cap = cap;
        }
        g->rows[g->n].key = strdup(key != NULL ? key : "-");
        if (g->rows[g->n].key == NULL)
            goto err_no_memory;
        g->rows[g->n].count = sqlite3_column_double(st, 1);
        g->rows[g->n].time = sqlite3_column_double(st, 2);
        g->rows[g->n].bytes = sqlite3_column_double(st, 3);
        g->n++;
    }
    status = FSDP_SQLITE_CALL(s->db, rc);
    sqlite3_finalize(st);
    return status;

err_no_memory:
    sqlite3_finalize(st);
    fsdp_error("diff: out of host memory");
    return FSDP_ERR_NO_MEMORY;
}

static void print_ratio(FILE *out, double a, double b)
{
    if (a > 0)
        fprintf(out, " %8.3f", b / a);
    else
        fprintf(out, " %8s", b > 0 ? "inf" : "-");
}

/* Merges A's and B's rows by key and prints count, time and bytes with B / A. */
static void agg_print(FILE *out, const char *title, const agg_t *ga, const agg_t *gb)
{
    size_t i = 0, j = 0;

    fprintf(out, "\n%s\n  %-40s %10s %10s %12s %12s %8s %14s %14s %8s\n", title, "", "count A",
            "count B", "time A (s)", "time B (s)", "B/A", "bytes A", "bytes B", "B/A");
    while (i < ga->n || j < gb->n) {
        int cmp = i == ga->n ? 1 : j == gb->n ? -1 : strcmp(ga->rows[i].key, gb->rows[j].key);
        agg_row_t zero = {NULL, 0, 0, 0};
        const agg_row_t *a = cmp <= 0 ? &ga->rows[i] : &zero;
        const agg_row_t *b = cmp >= 0 ? &gb->rows[j] : &zero;
        fprintf(out, "  %-40s %10.0f %10.0f %12.6g %12.6g", cmp <= 0 ? a->key : b->key, a->count,
                b->count, a->time, b->time);
        print_ratio(out, a->time, b->time);
        fprintf(out, " %14.0f %14.0f", a->bytes, b->bytes);
        print_ratio(out, a->bytes, b->bytes);
        fprintf(out, "\n");
        if (cmp <= 0)
            i++;
        if (cmp >= 0)
            j++;
    }
}

/* The run's events and steps for the aggregates, each row with its weight w: the ranks its
 * rank stands for. */
#define AGG_EVENTS(weighted)                                                                       \
    ((weighted) ? "(SELECT e.*, max(coalesce(k.stands_for, 1), 1) AS w FROM events e LEFT JOIN "   \
                  "ranks k ON k.run = e.run AND k.rank = e.rank WHERE e.run = ?1)"                 \
                : "(SELECT *, 1 AS w FROM events WHERE run = ?1)")
#define AGG_STEPS(weighted)                                                                        \
    ((weighted) ? "(SELECT s.*, max(coalesce(k.stands_for, 1), 1) AS w FROM steps s LEFT JOIN "    \
                  "ranks k ON k.run = s.run AND k.rank = s.rank WHERE s.run = ?1)"                 \
                : "(SELECT *, 1 AS w FROM steps WHERE run = ?1)")

/* The query with E and S (a word of their own after "FROM ") put in as subqueries, not as a
 * common table expression, which SQLite would materialize in a temporary table. */
static void agg_sql(char *buf, size_t size, const char *query, int weighted)
{
    size_t n = 0;

    for (const char *q = query; *q != '\0' && n + 1 < size; q++) {
        const char *sub = NULL;
        if (q - query >= 5 && strncmp(q - 5, "FROM ", 5) == 0 && (q[0] == 'E' || q[0] == 'S') &&
            (q[1] == ' ' || q[1] == '\0'))
            sub = q[0] == 'E' ? AGG_EVENTS(weighted) : AGG_STEPS(weighted);
        if (sub == NULL) {
            buf[n++] = *q;
            continue;
        }
        n += (size_t)snprintf(buf + n, size - n, "%s", sub);
        if (n >= size)
            n = size - 1;
    }
    buf[n] = '\0';
}

static fsdp_status_t print_ratios(diff_ctx_t *c, FILE *out)
{
    /* E: the events, S: the steps (AGG_EVENTS, AGG_STEPS) */
    static const char *const queries[][2] = {
        {"timing per kind",
         "SELECT kind, sum(w), sum(w * (end_time - start_time)), sum(w * bytes) FROM E "
         "GROUP BY kind ORDER BY kind"},
        {"timing per op (kernels, copies, collectives, over all units)",
         "SELECT kind || ' ' || name, sum(w), sum(w * (end_time - start_time)), sum(w * bytes) "
         "FROM E WHERE kind IN ('kernel', 'copy', 'collective') GROUP BY kind, name ORDER BY 1"},
        {"timing per unit (kernels, copies, collectives)",
         "SELECT coalesce(unit, '-') || ' ' || kind || ' ' || name, sum(w), "
         "sum(w * (end_time - start_time)), sum(w * bytes) FROM E "
         "WHERE kind IN ('kernel', 'copy', 'collective') "
         "GROUP BY unit, kind, name ORDER BY 1"},
        {"memory and steps (count: rows; time: seconds; bytes: maximum over ranks)",
         "SELECT 'steps', sum(w), sum(w * step_time), max(peak_allocated) FROM S "
         "UNION ALL "
         "SELECT 'steps peak reserved', sum(w), 0, max(peak_reserved) FROM S "
         "UNION ALL "
         "SELECT 'events max allocated', sum(w), max(end_time) - min(start_time), "
         "max(allocated) FROM E UNION ALL "
         "SELECT 'events max reserved', sum(w), 0, max(reserved) FROM E "
         "ORDER BY 1"},
    };
    fsdp_status_t status = FSDP_OK;

    for (size_t q = 0; q < sizeof(queries) / sizeof(queries[0]) && status == FSDP_OK; q++) {
        agg_t ga = {0}, gb = {0};
        char sql[2][4096];
        for (int k = 0; k < 2; k++)
            agg_sql(sql[k], sizeof(sql[k]), queries[q][1], c->side[k].weighted);
        status = agg_query(&c->side[0], sql[0], &ga);
        if (status == FSDP_OK)
            status = agg_query(&c->side[1], sql[1], &gb);
        if (status == FSDP_OK)
            agg_print(out, queries[q][0], &ga, &gb);
        agg_free(&ga);
        agg_free(&gb);
    }
    return status;
}

/* ---- Entry point ------------------------------------------------------------------------- */

/* A pair of ranks that stand for `count` ranks of the world, the lowest `rank`: A's rep[0] and
 * B's rep[1] (-1: none). */
typedef struct diff_pair {
    int rep[2];
    int key[2]; /* the order compared in: first the side with fewer ranks traced, whose events
                 * then load once per rank */
    int rank, count;
} diff_pair_t;

static int pair_cmp(const void *pa, const void *pb)
{
    const diff_pair_t *a = pa, *b = pb;

    if (a->key[0] != b->key[0])
        return a->key[0] < b->key[0] ? -1 : 1;
    if (a->key[1] != b->key[1])
        return a->key[1] < b->key[1] ? -1 : 1;
    return (a->rank > b->rank) - (a->rank < b->rank);
}

/* Loads the pair's events (each side keeps its last rank) and finds their first divergence;
 * two different ranks are compared up to a renaming of their groups. */
static fsdp_status_t diff_pair(diff_ctx_t *c, const diff_pair_t *p, rank_diff_t *rd)
{
    int renamed = p->rep[0] != p->rep[1];
    fsdp_status_t status;

    status = side_load_rank(&c->side[0], &c->pool, p->rep[0]);
    if (status == FSDP_OK)
        status = side_load_rank(&c->side[1], &c->pool, p->rep[1]);
    if (status == FSDP_OK)
        status = list_groups(&c->side[0].list, &c->pool, renamed);
    if (status == FSDP_OK)
        status = list_groups(&c->side[1].list, &c->pool, renamed);
    if (status == FSDP_OK)
        status = diff_rank(c, rd);
    return status;
}

static fsdp_status_t side_open(diff_side_t *s, const char *path, int64_t run,
                               fsdp_trace_reader_t **reader_p)
{
    fsdp_status_t status;

    s->path = path;
    status = fsdp_trace_reader_open(path, reader_p);
    if (status != FSDP_OK)
        return status;
    s->db = fsdp_trace_reader_db(*reader_p);
    status = fsdp_trace_reader_find_run(*reader_p, run, &s->run);
    if (status != FSDP_OK)
        return status;
    status = fsdp_trace_reader_run(*reader_p, s->run, &s->info);
    if (status != FSDP_OK)
        return status;
    status = fsdp_trace_db_prepare(s->db,
                                   "SELECT " FSDP_TRACE_EVENT_COLUMNS " FROM events "
                                   "WHERE run = ?1 AND rank = ?2 ORDER BY seq",
                                   &s->load);
    if (status == FSDP_OK)
        sqlite3_bind_int64(s->load, 1, s->run);
    return status;
}

fsdp_status_t fsdp_trace_diff(const char *path_a, int64_t run_a, const char *path_b, int64_t run_b,
                              FILE *out, fsdp_trace_diff_t *result_p)
{
    fsdp_trace_reader_t *reader[2] = {NULL, NULL};
    fsdp_trace_diff_t res;
    diff_ctx_t c;
    fsdp_status_t status;
    diff_pair_t *pairs = NULL;
    size_t npairs = 0;
    long first = -1;
    int nranks[2], n;

    memset(&c, 0, sizeof(c));
    c.side[0].loaded = c.side[1].loaded = -1;
    memset(&res, 0, sizeof(res));
    res.what = FSDP_TRACE_DIV_NONE;
    res.rank = -1;
    res.seq_a = res.seq_b = -1;
    if (path_a == NULL || path_b == NULL) {
        fsdp_error("fsdp_trace_diff: a database path is NULL");
        return FSDP_ERR_INVALID_PARAM;
    }
    /* One file and no runs named: the previous run against the latest. */
    if (strcmp(path_a, path_b) == 0 && run_a == 0 && run_b == 0)
        run_a = -1;
    status = side_open(&c.side[0], path_a, run_a, &reader[0]);
    if (status != FSDP_OK)
        goto out;
    status = side_open(&c.side[1], path_b, run_b, &reader[1]);
    if (status != FSDP_OK)
        goto out;
    if (out != NULL)
        fprintf(out, "A: %s run %" PRId64 " (%s, world %d)\nB: %s run %" PRId64 " (%s, world %d)\n",
                path_a, c.side[0].run, c.side[0].info.backend, c.side[0].info.world_size, path_b,
                c.side[1].run, c.side[1].info.backend, c.side[1].info.world_size);
    if (c.side[0].info.world_size != c.side[1].info.world_size) {
        res.what = FSDP_TRACE_DIV_WORLD;
        snprintf(res.message, sizeof(res.message), "world size differs: A %d, B %d",
                 c.side[0].info.world_size, c.side[1].info.world_size);
        if (out != NULL)
            fprintf(out, "first divergence: %s\n", res.message);
    }
    nranks[0] = c.side[0].info.world_size; /* checked by fsdp_trace_reader_run */
    nranks[1] = c.side[1].info.world_size;
    n = nranks[0] > nranks[1] ? nranks[0] : nranks[1];
    for (int k = 0; k < 2; k++) {
        c.side[k].rep = malloc((size_t)nranks[k] * sizeof(int));
        if (c.side[k].rep == NULL) {
            fsdp_error("diff: out of host memory for %d ranks", nranks[k]);
            status = FSDP_ERR_NO_MEMORY;
            goto out;
        }
        status = fsdp_trace_db_represent(c.side[k].db, c.side[k].path, c.side[k].run, nranks[k],
                                         c.side[k].rep, &c.side[k].traced);
        if (status != FSDP_OK)
            goto out;
        c.side[k].weighted = fsdp_trace_db_has_ranks(c.side[k].db);
        if (out != NULL && c.side[k].traced < nranks[k])
            fprintf(out, "%s: %d rank%s traced, standing for the world's %d\n", k == 0 ? "A" : "B",
                    c.side[k].traced, c.side[k].traced == 1 ? "" : "s", nranks[k]);
    }
    /* every rank either side stands for, through its pair of ranks that stand for it; each
     * distinct pair compared once, and the first divergence that of the lowest rank */
    pairs = malloc((size_t)n * sizeof(*pairs));
    if (pairs == NULL) {
        fsdp_error("diff: out of host memory for %d ranks", n);
        status = FSDP_ERR_NO_MEMORY;
        goto out;
    }
    for (int r = 0; r < n; r++) {
        int ra = r < nranks[0] ? c.side[0].rep[r] : -1, rb = r < nranks[1] ? c.side[1].rep[r] : -1;
        if (ra < 0 && rb < 0)
            continue;
        int swap = c.side[1].traced < c.side[0].traced;
        pairs[npairs].rep[0] = ra;
        pairs[npairs].rep[1] = rb;
        pairs[npairs].key[0] = swap ? rb : ra;
        pairs[npairs].key[1] = swap ? ra : rb;
        pairs[npairs].rank = r;
        pairs[npairs].count = 1;
        npairs++;
    }
    qsort(pairs, (size_t)npairs, sizeof(*pairs), pair_cmp);
    {
        size_t m = 0;
        for (size_t i = 0; i < npairs; i++) {
            if (m > 0 && pairs[m - 1].rep[0] == pairs[i].rep[0] &&
                pairs[m - 1].rep[1] == pairs[i].rep[1]) {
                pairs[m - 1].count++; /* sorted by rank within a pair: the first is the lowest */
                continue;
            }
            pairs[m++] = pairs[i];
        }
        npairs = m;
    }
    for (size_t i = 0; i < npairs; i++) {
        rank_diff_t rd;

        status = diff_pair(&c, &pairs[i], &rd);
        if (status != FSDP_OK)
            goto out;
        if (!rd.found)
            continue;
        res.ranks_diverging += pairs[i].count;
        if (first < 0 || pairs[i].rank < pairs[first].rank)
            first = (long)i;
    }
    if (first >= 0 && res.what == FSDP_TRACE_DIV_NONE) {
        const diff_pair_t *p = &pairs[first];
        rank_diff_t rd;

        status = diff_pair(&c, p, &rd);
        if (status == FSDP_OK)
            status = report_rank(&c, p->rank, &rd, out, &res);
        if (status != FSDP_OK)
            goto out;
        if (out != NULL && (p->rep[0] != p->rank || p->rep[1] != p->rank))
            fprintf(out,
                    "  (rank %d is compared through rank %d of A and rank %d of B, which "
                    "stand for it; groups up to renaming)\n",
                    p->rank, p->rep[0], p->rep[1]);
    }
    if (out != NULL) {
        if (res.what == FSDP_TRACE_DIV_NONE)
            fprintf(out, "structure: identical (%d ranks)\n", n);
        else
            fprintf(out, "structure: %d of %d ranks differ\n", res.ranks_diverging, n);
        status = print_ratios(&c, out);
    }
out:
    free(pairs);
    for (int s = 0; s < 2; s++) {
        free(c.side[s].rep);
        sqlite3_finalize(c.side[s].load);
        free(c.side[s].list.ev);
        fsdp_trace_reader_close(reader[s]);
    }
    free(c.va.ev);
    free(c.vb.ev);
    free(c.streams);
    pool_free(&c.pool);
    if (status == FSDP_OK && result_p != NULL)
        *result_p = res;
    return status;
}
