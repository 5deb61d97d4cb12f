/* fsdp-trace plot --svg: one picture of a run. Per rank, memory over time stacked by category
 * (the running sums of alloc and free events, with reserved as a dashed line) above a timeline
 * of the host and of each stream. Everything is reduced to the plot's pixel columns while it is
 * read, so the picture stays small for any trace: per column, memory keeps its highest point and
 * adjacent spans of one kind merge. */
#include "trace/trace_int.h"

#include <fsdp/log.h>

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PLOT_W 1000   /* pixel columns of the time axis */
#define PLOT_LEFT 110 /* room for lane labels */
#define PLOT_RIGHT 20
#define PLOT_MEM_H 120 /* memory chart height */
#define PLOT_LANE_H 14
#define PLOT_PANEL_GAP 36
#define PLOT_TOP 70 /* title and legend */
#define PLOT_NCAT (FSDP_MEM_CATEGORY_COUNT + 1)
#define PLOT_MAX_LANES 32

static const char *const plot_cat_names[PLOT_NCAT] = {
#define PLOT_CAT_NAME_(name, str) str,
    FSDP_FOREACH_MEM_CATEGORY(PLOT_CAT_NAME_)
#undef PLOT_CAT_NAME_
        "other"};
static const char *const plot_cat_colors[PLOT_NCAT] = {"#4e79a7", "#f28e2b", "#e15759",
                                                       "#76b7b2", "#59a14f", "#edc948",
                                                       "#b07aa1", "#ff9da7", "#9c755f"};
static const char *const plot_kind_colors[FSDP_EV_KIND_COUNT + 1] = {
    "#888888", "#aaaaaa", "#aaaaaa", "#17becf", "#1f77b4",
    "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#444444"};

typedef struct plot_rect {
    float x0, x1;
    int kind;
} plot_rect_t;

typedef struct plot_lane {
    char *name; /* NULL: the host */
    plot_rect_t *rects;
    size_t n, cap;
} plot_lane_t;

typedef struct plot_rank {
    int rank;
    int have_mem;
    double col_total[PLOT_W];      /* the highest total seen in each column, -1 if none */
    double col[PLOT_W][PLOT_NCAT]; /* the categories at that point */
    double col_reserved[PLOT_W];
    double cur[PLOT_NCAT]; /* running sums */
    plot_lane_t lanes[PLOT_MAX_LANES];
    int nlanes;
} plot_rank_t;

typedef struct plot_ctx {
    double t0, t1; /* time range, seconds */
    plot_rank_t *r;
    int failed;
} plot_ctx_t;

static double plot_x(const plot_ctx_t *p, double t)
{
    double x = (t - p->t0) / (p->t1 - p->t0) * PLOT_W;
    return x < 0 ? 0 : x > PLOT_W ? PLOT_W : x;
}

static int plot_cat(const char *name)
{
    for (int c = 0; c < FSDP_MEM_CATEGORY_COUNT; c++) {
        if (strcmp(name, plot_cat_names[c]) == 0)
            return c;
    }
    return FSDP_MEM_CATEGORY_COUNT;
}

static plot_lane_t *plot_lane(plot_ctx_t *p, const char *stream)
{
    plot_rank_t *r = p->r;
    int k;

    for (k = 0; k < r->nlanes; k++) {
        if ((stream == NULL && r->lanes[k].name == NULL) ||
            (stream != NULL && r->lanes[k].name != NULL && strcmp(stream, r->lanes[k].name) == 0))
            return &r->lanes[k];
    }
    if (r->nlanes == PLOT_MAX_LANES)
        return &r->lanes[PLOT_MAX_LANES - 1]; /* more streams than lanes: share the last */
    k = r->nlanes;
    if (stream != NULL && (r->lanes[k].name = strdup(stream)) == NULL) {
        p->failed = 1;
        return NULL;
    }
    r->nlanes++;
    return &r->lanes[k];
}

static int plot_event(void *arg, int rank, uint64_t seq, const fsdp_trace_event_t *ev)
{
    plot_ctx_t *p = arg;
    plot_rank_t *r = p->r;

    if (ev->kind == FSDP_EV_ALLOC || ev->kind == FSDP_EV_FREE) {
        int c = plot_cat(ev->name), x;
        double total = 0;
        r->cur[c] += ev->kind == FSDP_EV_ALLOC ? (double)ev->bytes : -(double)ev->bytes;
        if (r->cur[c] < 0)
            r->cur[c] = 0;
        for (int k = 0; k < PLOT_NCAT; k++)
            total += r->cur[k];
        x = (int)plot_x(p, ev->host_time);
        if (x >= PLOT_W)
            x = PLOT_W - 1;
        if (total >= r->col_total[x]) {
            r->col_total[x] = total;
            memcpy(r->col[x], r->cur, sizeof(r->cur));
        }
        if ((double)ev->reserved > r->col_reserved[x])
            r->col_reserved[x] = (double)ev->reserved;
        r->have_mem = 1;
        return 0;
    }
    plot_lane_t *lane = plot_lane(p, ev->stream);
    if (lane == NULL)
        return 1;
    double t_start = ev->end > ev->start || ev->stream != NULL ? ev->start : ev->host_time;
    double t_end = ev->end > ev->start ? ev->end : t_start;
    float x0 = (float)plot_x(p, t_start), x1 = (float)plot_x(p, t_end);
    int kind = (unsigned)ev->kind < FSDP_EV_KIND_COUNT ? (int)ev->kind : FSDP_EV_KIND_COUNT;
    if (x1 - x0 < 0.6f)
        x1 = x0 + 0.6f; /* instants and short ops stay visible */
    if (lane->n > 0) {
        plot_rect_t *last = &lane->rects[lane->n - 1];
        if (last->kind == kind && x0 <= last->x1 + 0.5f && x0 >= last->x0) {
            if (x1 > last->x1)
                last->x1 = x1;
            return 0;
        }
    }
    if (lane->n == lane->cap) {
        size_t cap = lane->cap == 0 ? 64 : lane->cap * 2;
        plot_rect_t *v = realloc(lane->rects, cap * sizeof(*v));
        if (v == NULL) {
            p->failed = 1;
            return 1;
        }
        lane->rects = v;
        lane->cap = cap;
    }
    lane->rects[lane->n].x0 = x0;
    lane->rects[lane->n].x1 = x1;
    lane->rects[lane->n].kind = kind;
    lane->n++;
    return 0;
}

/* Text for XML: markup characters escaped, anything but printable ASCII as '?'. */
static void xml_text(FILE *f, const char *s)
{
    for (; s != NULL && *s; s++) {
        unsigned char ch = (unsigned char)*s;
        switch (ch) {
        case '&':
            fputs("&amp;", f);
            break;
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        case '\'':
            fputs("&apos;", f);
            break;
        default:
            fputc(ch >= 0x20 && ch < 0x7f ? ch : '?', f);
            break;
        }
    }
}

/* Stacked areas: category c fills between the running sums of 0..c-1 and 0..c. */
static void plot_memory(FILE *f, const plot_rank_t *r, double y0, double mem_max)
{
    double(*cum)[PLOT_W] = malloc((PLOT_NCAT + 1) * sizeof(*cum));
    double state[PLOT_NCAT] = {0}, reserved = 0;
    double scale = mem_max > 0 ? PLOT_MEM_H / mem_max : 0;

    if (cum == NULL)
        return; /* the picture loses its memory chart, nothing else */

    for (int x = 0; x < PLOT_W; x++) {
        if (r->col_total[x] >= 0)
            memcpy(state, r->col[x], sizeof(state));
        cum[0][x] = 0;
        for (int c = 0; c < PLOT_NCAT; c++)
            cum[c + 1][x] = cum[c][x] + state[c];
    }
    for (int c = 0; c < PLOT_NCAT; c++) {
        int any = 0;
        for (int x = 0; x < PLOT_W && !any; x++)
            any = cum[c + 1][x] > cum[c][x];
        if (!any)
            continue;
        fprintf(f, "<polygon fill=\"%s\" stroke=\"none\" points=\"", plot_cat_colors[c]);
        for (int x = 0; x < PLOT_W; x++) { /* upper edge, left to right, as steps */
            if (x == 0 || cum[c + 1][x] != cum[c + 1][x - 1]) {
                double yy = y0 + PLOT_MEM_H - cum[c + 1][x] * scale;
                if (x > 0)
                    fprintf(f, "%d,%.1f ", PLOT_LEFT + x,
                            y0 + PLOT_MEM_H - cum[c + 1][x - 1] * scale);
                fprintf(f, "%d,%.1f ", PLOT_LEFT + x, yy);
            }
        }
        fprintf(f, "%d,%.1f ", PLOT_LEFT + PLOT_W,
                y0 + PLOT_MEM_H - cum[c + 1][PLOT_W - 1] * scale);
        fprintf(f, "%d,%.1f ", PLOT_LEFT + PLOT_W, y0 + PLOT_MEM_H - cum[c][PLOT_W - 1] * scale);
        for (int x = PLOT_W - 1; x >= 0; x--) { /* lower edge, right to left */
            if (x == 0 || cum[c][x] != cum[c][x - 1]) {
                fprintf(f, "%d,%.1f ", PLOT_LEFT + x, y0 + PLOT_MEM_H - cum[c][x] * scale);
                if (x > 0)
                    fprintf(f, "%d,%.1f ", PLOT_LEFT + x, y0 + PLOT_MEM_H - cum[c][x - 1] * scale);
            }
        }
        fputs("\"/>\n", f);
    }
    /* reserved, carried forward */
    fputs("<polyline fill=\"none\" stroke=\"#333\" stroke-dasharray=\"4,3\" points=\"", f);
    for (int x = 0; x < PLOT_W; x++) {
        if (r->col_reserved[x] > 0)
            reserved = r->col_reserved[x];
        fprintf(f, "%d,%.1f ", PLOT_LEFT + x, y0 + PLOT_MEM_H - reserved * scale);
    }
    fputs("\"/>\n", f);
    free(cum);
}

static double plot_panel_h(const plot_rank_t *r)
{
    return PLOT_MEM_H + 8 + r->nlanes * PLOT_LANE_H + PLOT_PANEL_GAP;
}

static void plot_write(FILE *f, const plot_ctx_t *p, const plot_rank_t *ranks, int n,
                       const fsdp_trace_run_row_t *info)
{
    double mem_max = 0, height = PLOT_TOP, y;
    int width = PLOT_LEFT + PLOT_W + PLOT_RIGHT;
    char buf[32];

    for (int i = 0; i < n; i++) {
        height += plot_panel_h(&ranks[i]);
        for (int x = 0; x < PLOT_W; x++) {
            if (ranks[i].col_total[x] > mem_max)
                mem_max = ranks[i].col_total[x];
            if (ranks[i].col_reserved[x] > mem_max)
                mem_max = ranks[i].col_reserved[x];
        }
    }
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%.0f\" "
            "viewBox=\"0 0 %d %.0f\" font-family=\"sans-serif\" font-size=\"11\">\n",
            width, height, width, height);
    fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%.0f\" fill=\"white\"/>\n", width,
            height);
    fprintf(f, "<text x=\"10\" y=\"18\" font-size=\"14\">run %" PRId64 ": ", info->id);
    xml_text(f, info->backend);
    fprintf(f, ", world %d, ", info->world_size);
    xml_text(f, info->strategy != NULL ? info->strategy : "-");
    fprintf(f, "; %.6g ms; memory scale %s</text>\n", (p->t1 - p->t0) * 1e3,
            fsdp_trace_fmt_bytes((uint64_t)mem_max, buf, sizeof(buf)));
    for (int c = 0; c < PLOT_NCAT; c++) {
        int lx = 10 + c * 120;
        fprintf(f,
                "<rect x=\"%d\" y=\"28\" width=\"10\" height=\"10\" fill=\"%s\"/>"
                "<text x=\"%d\" y=\"37\">%s</text>\n",
                lx, plot_cat_colors[c], lx + 14, plot_cat_names[c]);
    }
    for (int k = 0, slot = 0; k < FSDP_EV_KIND_COUNT; k++) {
        int lx = 10 + slot * 110;
        if (k == FSDP_EV_ALLOC || k == FSDP_EV_FREE)
            continue; /* drawn as memory, not as spans */
        slot++;
        fprintf(f,
                "<rect x=\"%d\" y=\"46\" width=\"10\" height=\"10\" fill=\"%s\"/>"
                "<text x=\"%d\" y=\"55\">%s</text>\n",
                lx, plot_kind_colors[k], lx + 14, fsdp_event_kind_name((fsdp_event_kind_t)k));
    }
    y = PLOT_TOP;
    for (int i = 0; i < n; i++) {
        const plot_rank_t *r = &ranks[i];
        fprintf(f,
                "<g id=\"rank%d\">\n<text x=\"10\" y=\"%.1f\" font-weight=\"bold\">rank %d"
                "</text>\n",
                r->rank, y + 12, r->rank);
        fprintf(f,
                "<rect x=\"%d\" y=\"%.1f\" width=\"%d\" height=\"%d\" fill=\"none\" "
                "stroke=\"#ccc\"/>\n",
                PLOT_LEFT, y, PLOT_W, PLOT_MEM_H);
        fprintf(f, "<text x=\"10\" y=\"%.1f\">%s</text>\n", y + 28,
                fsdp_trace_fmt_bytes((uint64_t)mem_max, buf, sizeof(buf)));
        if (r->have_mem)
            plot_memory(f, r, y, mem_max);
        double ly = y + PLOT_MEM_H + 8;
        for (int k = 0; k < r->nlanes; k++, ly += PLOT_LANE_H) {
            const plot_lane_t *lane = &r->lanes[k];
            fputs("<text x=\"10\" y=\"", f);
            fprintf(f, "%.1f\">", ly + 10);
            xml_text(f, lane->name != NULL ? lane->name : "host");
            fputs("</text>\n", f);
            for (size_t j = 0; j < lane->n; j++)
                fprintf(f,
                        "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%d\" "
                        "fill=\"%s\"/>\n",
                        PLOT_LEFT + lane->rects[j].x0, ly + 1,
                        lane->rects[j].x1 - lane->rects[j].x0, PLOT_LANE_H - 2,
                        plot_kind_colors[lane->rects[j].kind]);
        }
        /* time axis: five ticks in milliseconds */
        for (int t = 0; t <= 4; t++) {
            double tx = PLOT_LEFT + PLOT_W * t / 4.0;
            fprintf(f,
                    "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#555\">"
                    "%.4g ms</text>\n",
                    tx, ly + 12, (p->t0 + (p->t1 - p->t0) * t / 4.0) * 1e3);
        }
        fputs("</g>\n", f);
        y += plot_panel_h(r);
    }
    fputs("</svg>\n", f);
}

static fsdp_status_t plot_time_range(sqlite3 *db, int64_t run, int nranks, plot_ctx_t *p)
{
    sqlite3_stmt *st;
    fsdp_status_t status;
    int rc;

    status = fsdp_trace_db_prepare(db,
                                   "SELECT min(min(host_time, start_time)), "
                                   "max(max(host_time, end_time)) FROM events "
                                   "WHERE run = ?1 AND rank < ?2",
                                   &st);
    if (status != FSDP_OK)
        return status;
    sqlite3_bind_int64(st, 1, run);
    sqlite3_bind_int(st, 2, nranks);
    rc = sqlite3_step(st);
    p->t0 = 0;
    p->t1 = 0;
    if (rc == SQLITE_ROW) {
        p->t0 = sqlite3_column_double(st, 0);
        p->t1 = sqlite3_column_double(st, 1);
    }
    status = FSDP_SQLITE_CALL(db, rc);
    sqlite3_finalize(st);
    if (!(p->t1 > p->t0) || !isfinite(p->t1 - p->t0))
        p->t1 = p->t0 + 1e-6; /* an empty or instant run still draws */
    return status;
}

fsdp_status_t fsdp_trace_plot_svg(const char *path, int64_t run, int max_ranks,
                                  const char *out_path)
{
    fsdp_trace_reader_t *reader = NULL;
    fsdp_trace_run_row_t info;
    plot_rank_t *ranks = NULL;
    plot_ctx_t p;
    fsdp_status_t status;
    int64_t id;
    int nranks = 0;
    FILE *f;

    memset(&p, 0, sizeof(p));
    if (out_path == NULL) {
        fsdp_error("plot: no output file given");
        return FSDP_ERR_INVALID_PARAM;
    }
    if (max_ranks <= 0)
        max_ranks = 8;
    status = fsdp_trace_reader_open(path, &reader);
    if (status != FSDP_OK)
        return status;
    status = fsdp_trace_reader_find_run(reader, run, &id);
    if (status == FSDP_OK)
        status = fsdp_trace_db_num_ranks(fsdp_trace_reader_db(reader), path, id, &nranks);
    if (status != FSDP_OK)
        goto out;
    if (nranks > max_ranks)
        nranks = max_ranks;
    status = plot_time_range(fsdp_trace_reader_db(reader), id, nranks, &p);
    if (status != FSDP_OK)
        goto out;
    ranks = calloc((size_t)(nranks > 0 ? nranks : 1), sizeof(*ranks));
    if (ranks == NULL)
        goto err_no_memory;
    for (int i = 0; i < nranks; i++) {
        ranks[i].rank = i;
        for (int x = 0; x < PLOT_W; x++)
            ranks[i].col_total[x] = -1;
        plot_lane(&(plot_ctx_t){.r = &ranks[i]}, NULL); /* the host lane comes first */
        p.r = &ranks[i];
        status = fsdp_trace_reader_events(reader, id, i, plot_event, &p);
        if (status != FSDP_OK)
            goto out;
        if (p.failed)
            goto err_no_memory;
    }
    status = fsdp_trace_reader_run(reader, id, &info);
    if (status != FSDP_OK)
        goto out;
    f = fopen(out_path, "w");
    if (f == NULL) {
        fsdp_error("plot: cannot create '%s': %s", out_path, strerror(errno));
        status = FSDP_ERR_IO;
        goto out;
    }
    plot_write(f, &p, ranks, nranks, &info);
    if (ferror(f) | fclose(f)) {
        fsdp_error("plot: cannot write '%s': %s", out_path, strerror(errno));
        remove(out_path);
        status = FSDP_ERR_IO;
    }
    goto out;

err_no_memory:
    fsdp_error("plot: out of host memory");
    status = FSDP_ERR_NO_MEMORY;
out:
    for (int i = 0; ranks != NULL && i < nranks; i++) {
        for (int k = 0; k < ranks[i].nlanes; k++) {
            free(ranks[i].lanes[k].name);
            free(ranks[i].lanes[k].rects);
        }
    }
    free(ranks);
    fsdp_trace_reader_close(reader);
    return status;
}
