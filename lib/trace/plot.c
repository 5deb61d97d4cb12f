/* fsdp-trace plot --svg: one picture of a run. Per rank, memory over time stacked by category
 * (the running sums of alloc and free events, with reserved as a dashed line) above a timeline
 * of the host and of each stream. Everything is reduced to the plot's pixel columns while it is
 * read, so the picture stays small for any trace: per column, memory keeps its highest point and
 * adjacent spans of one kind merge. A window of steps or of time draws its events alone; the
 * events before it still run the memory sums, so that memory starts where they left it. */
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
#define PLOT_X_TICKS 8 /* at most this many intervals between time ticks */
#define PLOT_Y_TICKS 4

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
    char label[128]; /* "rank 0", or what it stands for */
    int have_mem;
    uint64_t seq_lo, seq_hi; /* a step window: the events with seq_lo <= seq < seq_hi */
    double start[PLOT_NCAT]; /* memory by category when the window opens */
    double start_reserved;
    double col_total[PLOT_W];      /* the highest total seen in each column, -1 if none */
    double col[PLOT_W][PLOT_NCAT]; /* the categories at that point */
    double col_reserved[PLOT_W];
    double cur[PLOT_NCAT]; /* running sums */
    plot_lane_t lanes[PLOT_MAX_LANES];
    int nlanes;
} plot_rank_t;

typedef struct plot_ctx {
    double t0, t1; /* time range, seconds */
    int step_window, time_window;
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
    int before = 0, after = 0;

    (void)rank;
    if (p->step_window) {
        if (seq >= r->seq_hi)
            return 1; /* past the window: nothing more to read */
        before = seq < r->seq_lo;
    }
    if (ev->kind == FSDP_EV_ALLOC || ev->kind == FSDP_EV_FREE) {
        int c = plot_cat(ev->name), x;
        double total = 0;
        r->cur[c] += ev->kind == FSDP_EV_ALLOC ? (double)ev->bytes : -(double)ev->bytes;
        if (r->cur[c] < 0)
            r->cur[c] = 0;
        r->have_mem = 1;
        if (p->time_window) {
            before = ev->host_time < p->t0;
            after = ev->host_time > p->t1;
        }
        if (before) {
            memcpy(r->start, r->cur, sizeof(r->cur));
            r->start_reserved = (double)ev->reserved;
            return 0;
        }
        if (after)
            return 0;
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
        return 0;
    }
    double t_start = ev->end > ev->start || ev->stream != NULL ? ev->start : ev->host_time;
    double t_end = ev->end > ev->start ? ev->end : t_start;
    if (p->time_window) {
        before = t_end < p->t0;
        after = t_start > p->t1;
    }
    if (before || after)
        return 0;
    plot_lane_t *lane = plot_lane(p, ev->stream);
    if (lane == NULL)
        return 1;
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

/* An axis with ticks at round values: 1, 2 or 5 times a power of ten of `unit`. */
typedef struct plot_axis {
    const char *unit; /* "ms", "MiB", ... */
    double scale;     /* seconds or bytes per unit */
    double step;      /* in units */
    int decimals;     /* what a label needs to show the step */
} plot_axis_t;

/* The round step that cuts `span` units into at most `pieces`. */
static void plot_axis_step(plot_axis_t *a, double span, int pieces)
{
    double raw = span / pieces, p = pow(10, floor(log10(raw))), m = raw / p;
    int k = (int)floor(log10(raw));

    if (m > 5) {
        m = 1;
        p *= 10;
        k++;
    } else {
        m = m > 2 ? 5 : m > 1 ? 2 : 1;
    }
    a->step = m * p;
    a->decimals = k < 0 ? -k : 0;
}

/* Time in s, ms, us (as µs) or ns: the largest unit of which a step is at least a tenth. */
static plot_axis_t plot_time_axis(double span)
{
    static const struct {
        const char *name;
        double scale;
    } units[] = {{"s", 1}, {"ms", 1e-3}, {"\xc2\xb5s", 1e-6}, {"ns", 1e-9}};
    plot_axis_t a;
    size_t u = 0;

    while (u + 1 < sizeof(units) / sizeof(units[0]) && span / PLOT_X_TICKS < units[u].scale / 10)
        u++;
    a.unit = units[u].name;
    a.scale = units[u].scale;
    plot_axis_step(&a, span / a.scale, PLOT_X_TICKS);
    return a;
}

/* Bytes in B, KiB, MiB or GiB, by the largest; whole bytes at least. */
static plot_axis_t plot_mem_axis(double max)
{
    static const char *const names[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    plot_axis_t a;
    int u = 0;

    while (u < 4 && max >= 1024.0 * (double)(1ull << (10 * u)))
        u++;
    a.unit = names[u];
    a.scale = (double)(1ull << (10 * u));
    plot_axis_step(&a, max > 0 ? max / a.scale : 1, PLOT_Y_TICKS);
    if (u == 0 && a.step < 1) {
        a.step = 1;
        a.decimals = 0;
    }
    return a;
}

/* Stacked areas: category c fills between the running sums of 0..c-1 and 0..c. */
static void plot_memory(FILE *f, const plot_rank_t *r, double y0, double mem_top)
{
    double(*cum)[PLOT_W] = malloc((PLOT_NCAT + 1) * sizeof(*cum));
    double state[PLOT_NCAT], reserved = r->start_reserved;
    double scale = mem_top > 0 ? PLOT_MEM_H / mem_top : 0;

    if (cum == NULL)
        return; /* the picture loses its memory chart, nothing else */

    memcpy(state, r->start, sizeof(state));
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

/* Labels are at most this wide per character, at the picture's font size. */
#define PLOT_CHAR_W 7

/* The time axis under a rank's lanes (grid lines from y_top), its last label kept inside. */
static void plot_x_ticks(FILE *f, const plot_ctx_t *p, const plot_axis_t *a, double y_top,
                         double y_axis, int width)
{
    double first = ceil(p->t0 / a->scale / a->step - 1e-9);
    double last = floor(p->t1 / a->scale / a->step + 1e-9);
    char label[64];

    for (double i = first; i <= last; i++) {
        double v = i == 0 ? 0 : i * a->step, x = PLOT_LEFT + plot_x(p, v * a->scale); /* no -0 */
        int len = snprintf(label, sizeof(label), "%.*f %s", a->decimals, v, a->unit);
        const char *anchor = "middle";
        if (x + len * PLOT_CHAR_W / 2.0 > width - 2)
            anchor = "end";
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n"
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#555\"/>\n"
                "<text class=\"xtick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" fill=\"#555\">"
                "%s</text>\n",
                x, y_top, x, y_axis, x, y_axis, x, y_axis + 4, x, y_axis + 15, anchor, label);
    }
}

/* The memory axis left of a rank's chart, with grid lines across it. */
static void plot_y_ticks(FILE *f, const plot_axis_t *a, double top, double y0)
{
    double scale = top > 0 ? PLOT_MEM_H / top : 0;

    for (double i = 0; i * a->step <= top / a->scale + 1e-9; i++) {
        double v = i * a->step, y = y0 + PLOT_MEM_H - v * a->scale * scale;
        fprintf(f,
                "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n"
                "<text class=\"ytick\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\" fill=\"#555\">"
                "%.*f %s</text>\n",
                PLOT_LEFT - 3, y, PLOT_LEFT + PLOT_W, y, PLOT_LEFT - 5, y + 4, a->decimals, v,
                a->unit);
        if (top <= 0)
            break;
    }
}

static void plot_write(FILE *f, const plot_ctx_t *p, const plot_rank_t *ranks, int n,
                       const fsdp_trace_run_row_t *info, const fsdp_trace_plot_options_t *opts,
                       int simulated)
{
    double mem_max = 0, mem_top, height = PLOT_TOP, y;
    int width = PLOT_LEFT + PLOT_W + PLOT_RIGHT, lx;
    plot_axis_t ta = plot_time_axis(p->t1 - p->t0), ma;

    for (int i = 0; i < n; i++) {
        double start = ranks[i].start_reserved, total = 0;
        height += plot_panel_h(&ranks[i]);
        for (int c = 0; c < PLOT_NCAT; c++)
            total += ranks[i].start[c];
        mem_max = fmax(mem_max, fmax(start, total));
        for (int x = 0; x < PLOT_W; x++) {
            if (ranks[i].col_total[x] > mem_max)
                mem_max = ranks[i].col_total[x];
            if (ranks[i].col_reserved[x] > mem_max)
                mem_max = ranks[i].col_reserved[x];
        }
    }
    ma = plot_mem_axis(mem_max);
    mem_top = mem_max > 0 ? ceil(mem_max / ma.scale / ma.step - 1e-9) * ma.step * ma.scale : 0;
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%.0f\" "
            "viewBox=\"0 0 %d %.0f\" font-family=\"sans-serif\" font-size=\"11\">\n",
            width, height, width, height);
    fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%.0f\" fill=\"white\"/>\n", width,
            height);
    fprintf(f, "<text x=\"10\" y=\"18\" font-size=\"14\">run %" PRId64 ": ", info->id);
    xml_text(f, info->backend);
    fprintf(f, ", world %d", info->world_size);
    if (simulated > 0)
        fprintf(f, " (%d ranks simulated, each standing for a class)", simulated);
    fputs(", ", f);
    xml_text(f, info->strategy != NULL ? info->strategy : "-");
    if (p->step_window && opts->first_step == opts->last_step)
        fprintf(f, "; step %" PRId64, opts->first_step);
    else if (p->step_window)
        fprintf(f, "; steps %" PRId64 "-%" PRId64, opts->first_step, opts->last_step);
    fprintf(f, "; %.6g ms from %.6g ms</text>\n", (p->t1 - p->t0) * 1e3, p->t0 * 1e3);
    /* legend: the memory categories and reserved, then the kinds of spans */
    lx = 10;
    for (int c = 0; c < PLOT_NCAT; c++) {
        fprintf(f,
                "<rect x=\"%d\" y=\"28\" width=\"10\" height=\"10\" fill=\"%s\"/>"
                "<text x=\"%d\" y=\"37\">%s</text>\n",
                lx, plot_cat_colors[c], lx + 14, plot_cat_names[c]);
        lx += 14 + PLOT_CHAR_W * (int)strlen(plot_cat_names[c]) + 10;
    }
    fprintf(f,
            "<line x1=\"%d\" y1=\"33\" x2=\"%d\" y2=\"33\" stroke=\"#333\" "
            "stroke-dasharray=\"4,3\"/><text class=\"legend\" x=\"%d\" y=\"37\">reserved</text>\n",
            lx, lx + 20, lx + 24);
    for (int k = 0, slot = 0; k < FSDP_EV_KIND_COUNT; k++) {
        lx = 10 + slot * 110;
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
        double ly = y + PLOT_MEM_H + 8;
        fprintf(f,
                "<g id=\"rank%d\">\n<text x=\"10\" y=\"%.1f\" font-weight=\"bold\">rank %d"
                "</text>\n",
                r->rank, y + 12, r->rank);
        if (strchr(r->label, '(') != NULL) {
            /* what the rank stands for, in the gap above its panel */
            fprintf(f, "<text x=\"%d\" y=\"%.1f\" fill=\"#555\">", PLOT_LEFT, y - 5);
            xml_text(f, r->label);
            fputs("</text>\n", f);
        }
        plot_x_ticks(f, p, &ta, y, ly + r->nlanes * PLOT_LANE_H, width);
        plot_y_ticks(f, &ma, mem_top, y);
        fprintf(f,
                "<rect x=\"%d\" y=\"%.1f\" width=\"%d\" height=\"%d\" fill=\"none\" "
                "stroke=\"#ccc\"/>\n",
                PLOT_LEFT, y, PLOT_W, PLOT_MEM_H);
        if (r->have_mem)
            plot_memory(f, r, y, mem_top);
        for (int k = 0; k < r->nlanes; k++, ly += PLOT_LANE_H) {
            const plot_lane_t *lane = &r->lanes[k];
            fputs("<text class=\"lane\" x=\"10\" y=\"", f);
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
        fputs("</g>\n", f);
        y += plot_panel_h(r);
    }
    fputs("</svg>\n", f);
}

/* Per rank, the events of the step window: after the row of the last step before it, up to the
 * row of its last step. */
typedef struct plot_steps {
    const fsdp_trace_plot_options_t *opts;
    plot_rank_t *ranks;
    int nranks;
    int64_t min_step, max_step;
    int in_window;
} plot_steps_t;

static int plot_step_row(void *arg, const fsdp_trace_step_row_t *row)
{
    plot_steps_t *s = arg;

    if (row->step < s->min_step)
        s->min_step = row->step;
    if (row->step > s->max_step)
        s->max_step = row->step;
    if (row->step >= s->opts->first_step && row->step <= s->opts->last_step)
        s->in_window = 1;
    plot_rank_t *r = NULL;
    for (int i = 0; i < s->nranks && r == NULL; i++) {
        if (s->ranks[i].rank == row->rank)
            r = &s->ranks[i];
    }
    if (r == NULL)
        return 0; /* a rank not drawn */
    if (row->step < s->opts->first_step && row->seq_end > r->seq_lo)
        r->seq_lo = row->seq_end;
    if (row->step <= s->opts->last_step && row->seq_end > r->seq_hi)
        r->seq_hi = row->seq_end;
    return 0;
}

static fsdp_status_t plot_step_window(fsdp_trace_reader_t *reader, int64_t run,
                                      const fsdp_trace_plot_options_t *opts, plot_rank_t *ranks,
                                      int nranks)
{
    plot_steps_t s = {opts, ranks, nranks, INT64_MAX, INT64_MIN, 0};
    fsdp_status_t status;

    status = fsdp_trace_reader_steps(reader, run, -1, plot_step_row, &s);
    if (status != FSDP_OK)
        return status;
    if (s.max_step < s.min_step) {
        fsdp_error("plot: steps %" PRId64 "-%" PRId64 ": the run has no step rows",
                   opts->first_step, opts->last_step);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (!s.in_window) {
        fsdp_error("plot: steps %" PRId64 "-%" PRId64 ": the run has steps %" PRId64 "-%" PRId64,
                   opts->first_step, opts->last_step, s.min_step, s.max_step);
        return FSDP_ERR_INVALID_PARAM;
    }
    return FSDP_OK;
}

/* The time the drawn events span: every event of the drawn ranks, or the step window's. */
static fsdp_status_t plot_time_range(sqlite3 *db, int64_t run, const plot_rank_t *ranks, int nranks,
                                     plot_ctx_t *p)
{
    sqlite3_stmt *st;
    fsdp_status_t status;
    int rc = SQLITE_DONE, any = 0;

    status = fsdp_trace_db_prepare(db,
                                   "SELECT min(min(host_time, start_time)), "
                                   "max(max(host_time, end_time)) FROM events "
                                   "WHERE run = ?1 AND rank = ?2 AND seq >= ?3 AND seq < ?4",
                                   &st);
    if (status != FSDP_OK)
        return status;
    for (int i = 0; i < nranks; i++) {
        sqlite3_bind_int64(st, 1, run);
        sqlite3_bind_int(st, 2, ranks[i].rank);
        sqlite3_bind_int64(st, 3, p->step_window ? (int64_t)ranks[i].seq_lo : 0);
        sqlite3_bind_int64(st, 4, p->step_window ? (int64_t)ranks[i].seq_hi : INT64_MAX);
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL) {
            double t0 = sqlite3_column_double(st, 0), t1 = sqlite3_column_double(st, 1);
            p->t0 = any && p->t0 < t0 ? p->t0 : t0;
            p->t1 = any && p->t1 > t1 ? p->t1 : t1;
            any = 1;
        }
        if (rc != SQLITE_ROW && rc != SQLITE_DONE)
            break;
        rc = SQLITE_DONE;
        sqlite3_reset(st);
    }
    status = FSDP_SQLITE_CALL(db, rc);
    sqlite3_finalize(st);
    if (!(p->t1 > p->t0) || !isfinite(p->t1 - p->t0))
        p->t1 = p->t0 + 1e-6; /* an empty or instant run still draws */
    return status;
}

void fsdp_trace_plot_options_init(fsdp_trace_plot_options_t *opts)
{
    memset(opts, 0, sizeof(*opts));
    opts->max_ranks = 8;
    opts->first_step = -1;
    opts->last_step = -1;
}

static fsdp_status_t plot_check_options(const fsdp_trace_plot_options_t *o)
{
    int steps = o->first_step != -1 || o->last_step != -1;
    int times = o->start_time != 0 || o->end_time != 0;

    if (steps && (o->first_step < 0 || o->last_step < o->first_step)) {
        fsdp_error("plot: steps %" PRId64 "-%" PRId64 ": a window of steps is A-B with "
                   "0 <= A <= B",
                   o->first_step, o->last_step);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (times && !(o->start_time >= 0 && o->end_time > o->start_time && isfinite(o->end_time))) {
        fsdp_error("plot: time window %g-%g s: it is A-B seconds with 0 <= A < B", o->start_time,
                   o->end_time);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (steps && times) {
        fsdp_error("plot: a window of steps or of time, not both");
        return FSDP_ERR_INVALID_PARAM;
    }
    return FSDP_OK;
}

fsdp_status_t fsdp_trace_plot_svg_ex(const char *path, int64_t run,
                                     const fsdp_trace_plot_options_t *opts, const char *out_path)
{
    fsdp_trace_plot_options_t defaults;
    fsdp_trace_reader_t *reader = NULL;
    fsdp_trace_run_row_t info;
    plot_rank_t *ranks = NULL;
    fsdp_trace_rank_class_t *classes = NULL;
    plot_ctx_t p;
    fsdp_status_t status;
    int64_t id;
    int nranks = 0, max_ranks, world = 0, symmetric = 0, simulated = 0, *which = NULL;
    FILE *f;

    memset(&p, 0, sizeof(p));
    if (opts == NULL) {
        fsdp_trace_plot_options_init(&defaults);
        opts = &defaults;
    }
    if (out_path == NULL) {
        fsdp_error("plot: no output file given");
        return FSDP_ERR_INVALID_PARAM;
    }
    status = plot_check_options(opts);
    if (status != FSDP_OK)
        return status;
    max_ranks = opts->max_ranks > 0 ? opts->max_ranks : 8;
    p.step_window = opts->first_step != -1;
    p.time_window = opts->end_time > 0;
    status = fsdp_trace_reader_open(path, &reader);
    if (status != FSDP_OK)
        return status;
    status = fsdp_trace_reader_find_run(reader, run, &id);
    if (status == FSDP_OK)
        status = fsdp_trace_db_num_ranks(fsdp_trace_reader_db(reader), path, id, &world);
    if (status == FSDP_OK)
        status = fsdp_trace_db_rank_classes(fsdp_trace_reader_db(reader), id, world, &classes,
                                            &symmetric);
    if (status != FSDP_OK)
        goto out;
    /* the ranks drawn: the first ones, or of a symmetric run the first simulated ones */
    which = malloc((size_t)(world > 0 ? world : 1) * sizeof(*which));
    if (which == NULL)
        goto err_no_memory;
    for (int r = 0; r < world; r++) {
        if (!symmetric || classes[r].stands_for > 0)
            which[nranks++] = r;
    }
    if (symmetric)
        simulated = nranks;
    if (nranks > max_ranks)
        nranks = max_ranks;
    ranks = calloc((size_t)(nranks > 0 ? nranks : 1), sizeof(*ranks));
    if (ranks == NULL)
        goto err_no_memory;
    for (int i = 0; i < nranks; i++) {
        ranks[i].rank = which[i];
        fsdp_trace_rank_label(classes, which[i], ranks[i].label, sizeof(ranks[i].label));
        ranks[i].seq_hi = UINT64_MAX;
        for (int x = 0; x < PLOT_W; x++)
            ranks[i].col_total[x] = -1;
    }
    if (p.step_window) {
        for (int i = 0; i < nranks; i++)
            ranks[i].seq_hi = 0;
        status = plot_step_window(reader, id, opts, ranks, nranks);
        if (status != FSDP_OK)
            goto out;
    }
    if (p.time_window) {
        p.t0 = opts->start_time;
        p.t1 = opts->end_time;
    } else {
        status = plot_time_range(fsdp_trace_reader_db(reader), id, ranks, nranks, &p);
        if (status != FSDP_OK)
            goto out;
    }
    for (int i = 0; i < nranks; i++) {
        plot_lane(&(plot_ctx_t){.r = &ranks[i]}, NULL); /* the host lane comes first */
        p.r = &ranks[i];
        status = fsdp_trace_reader_events(reader, id, ranks[i].rank, plot_event, &p);
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
    plot_write(f, &p, ranks, nranks, &info, opts, simulated);
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
    free(which);
    fsdp_trace_rank_classes_free(classes, world);
    fsdp_trace_reader_close(reader);
    return status;
}

fsdp_status_t fsdp_trace_plot_svg(const char *path, int64_t run, int max_ranks,
                                  const char *out_path)
{
    fsdp_trace_plot_options_t opts;

    fsdp_trace_plot_options_init(&opts);
    opts.max_ranks = max_ranks;
    return fsdp_trace_plot_svg_ex(path, run, &opts, out_path);
}
