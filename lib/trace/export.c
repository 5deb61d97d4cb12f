/* fsdp-trace export --chrome: Chrome trace JSON for Perfetto and chrome://tracing
 * (docs/formats.md section 4).
 *
 * Mapping: one process per rank (pid rank + 1, named "rank N", sorted by rank), one thread per
 * stream in order of first use plus a "host" thread for events without a stream and for the
 * host's waits (a stream or event synchronize is the host's time, not the stream's); tids are
 * unique across processes, since importers treat a tid as a system-wide thread. An event with a
 * duration is a complete event (X) at its device interval; ops on one stream are serial, so X
 * events nest, and so that rounding cannot break that, start and end are rounded to whole
 * nanoseconds first and dur is their difference. Instant events (i, thread scope) mark records,
 * waits and zero-length ops; a flow (s to f) joins each wait to the record it waits for. Memory
 * is counter tracks on the rank's process at the host time of each allocation and free:
 * "allocated" and "reserved" as separate counters (one contains the other, and the series of one
 * counter are drawn stacked), and "memory by category", whose series are disjoint and stack.
 * Timestamps are microseconds. The file is written as it is read, so a trace of any size fits.
 */
#include "trace/trace_int.h"

#include <fsdp/log.h>

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT_TID_STRIDE 1000 /* tid = pid * stride + thread index */
#define EXPORT_NCAT (FSDP_MEM_CATEGORY_COUNT + 1)

static const char *const export_cat_names[EXPORT_NCAT] = {
#define EXPORT_CAT_NAME_(name, str) str,
    FSDP_FOREACH_MEM_CATEGORY(EXPORT_CAT_NAME_)
#undef EXPORT_CAT_NAME_
        "other"};

/* JSON string contents: quotes, backslashes and control characters escaped; bytes that are not
 * UTF-8 become '?', so any name yields valid JSON. */
static void json_str(FILE *f, const char *s)
{
    const unsigned char *p = (const unsigned char *)(s != NULL ? s : "");

    fputc('"', f);
    while (*p) {
        unsigned char ch = *p;
        int len = ch < 0x80           ? 1
                  : (ch >> 5) == 0x6  ? 2
                  : (ch >> 4) == 0xe  ? 3
                  : (ch >> 3) == 0x1e ? 4
                                      : 0;
        if (ch == '"' || ch == '\\') {
            fputc('\\', f);
            fputc(ch, f);
        } else if (ch < 0x20) {
            fprintf(f, "\\u%04x", ch);
        } else if (len == 1) {
            fputc(ch, f);
        } else {
            int ok = len > 0;
            for (int k = 1; k < len && ok; k++)
                ok = (p[k] & 0xc0) == 0x80;
            if (!ok) {
                fputc('?', f);
                p++;
                continue;
            }
            fwrite(p, 1, (size_t)len, f);
            p += len;
            continue;
        }
        p++;
    }
    fputc('"', f);
}

/* Where a record was drawn, for the flows of the waits on it: a slot of an open-addressing
 * table keyed by the record's number (0: an empty slot), so that memory follows the records a
 * rank holds, not the largest number a damaged trace names. */
typedef struct export_record {
    uint64_t id;
    long long ts_ns;
    int tid_index;
} export_record_t;

typedef struct export_rank {
    int rank;
    char **streams; /* thread index k + 1 <-> streams[k]; index 0 is the host */
    int nstreams, cap;
    int64_t cat[EXPORT_NCAT];
    export_record_t *records; /* records_cap slots (a power of two), nrecords of them used */
    size_t nrecords, records_cap;
} export_rank_t;

typedef struct export_ctx {
    FILE *f;
    int first; /* no event written yet (commas) */
    int io_error;
    export_rank_t cur; /* the rank being written */
    int have_rank;
    uint64_t flows; /* flow ids given so far */
    fsdp_trace_rank_class_t *classes; /* what each rank stands for, nranks entries */
    int nranks;
} export_ctx_t;

static void export_sep(export_ctx_t *x)
{
    fputs(x->first ? "\n" : ",\n", x->f);
    x->first = 0;
}

static int export_pid(int rank)
{
    return rank + 1;
}

static long long export_tid(int rank, int index)
{
    return (long long)export_pid(rank) * EXPORT_TID_STRIDE + index;
}

static void export_thread_meta(export_ctx_t *x, int rank, int index, const char *name)
{
    export_sep(x);
    fprintf(x->f,
            "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%lld,\"args\":{"
            "\"name\":",
            export_pid(rank), export_tid(rank, index));
    json_str(x->f, name);
    fputs("}}", x->f);
    export_sep(x);
    fprintf(x->f,
            "{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":%d,\"tid\":%lld,"
            "\"args\":{\"sort_index\":%d}}",
            export_pid(rank), export_tid(rank, index), index);
}

static void export_rank_reset(export_ctx_t *x, int rank)
{
    export_rank_t *r = &x->cur;
    char label[128];

    for (int k = 0; k < r->nstreams; k++)
        free(r->streams[k]);
    r->nstreams = 0;
    r->nrecords = 0;
    if (r->records != NULL)
        memset(r->records, 0, r->records_cap * sizeof(*r->records));
    memset(r->cat, 0, sizeof(r->cat));
    r->rank = rank;
    x->have_rank = 1;
    export_sep(x);
    fprintf(x->f,
            "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":%lld,\"args\":{"
            "\"name\":",
            export_pid(rank), export_tid(rank, 0));
    json_str(x->f, fsdp_trace_rank_label(rank < x->nranks ? x->classes : NULL, rank, label,
                                         sizeof(label)));
    fputs("}}", x->f);
    export_sep(x);
    fprintf(x->f,
            "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,\"tid\":%lld,"
            "\"args\":{\"sort_index\":%d}}",
            export_pid(rank), export_tid(rank, 0), rank);
    export_thread_meta(x, rank, 0, "host");
}

/* The thread index of a stream (0: host), naming it on first use; -1 if out of memory. */
static int export_stream(export_ctx_t *x, const char *stream)
{
    export_rank_t *r = &x->cur;

    if (stream == NULL)
        return 0;
    for (int k = 0; k < r->nstreams; k++) {
        if (strcmp(r->streams[k], stream) == 0)
            return k + 1;
    }
    if (r->nstreams + 1 >= EXPORT_TID_STRIDE)
        return 0; /* absurdly many streams: fold the rest into the host thread */
    if (r->nstreams == r->cap) {
        int cap = r->cap == 0 ? 8 : r->cap * 2;
        char **v = realloc(r->streams, (size_t)cap * sizeof(*v));
        if (v == NULL)
            return -1;
        r->streams = v;
        r->cap = cap;
    }
    r->streams[r->nstreams] = strdup(stream);
    if (r->streams[r->nstreams] == NULL)
        return -1;
    r->nstreams++;
    export_thread_meta(x, r->rank, r->nstreams, stream);
    return r->nstreams;
}

static int export_cat_index(const char *name)
{
    for (int c = 0; c < FSDP_MEM_CATEGORY_COUNT; c++) {
        if (strcmp(name, export_cat_names[c]) == 0)
            return c;
    }
    return FSDP_MEM_CATEGORY_COUNT;
}

static void export_counters(export_ctx_t *x, int rank, const fsdp_trace_event_t *ev)
{
    export_rank_t *r = &x->cur;
    int c = export_cat_index(ev->name);
    double ts = ev->host_time * 1e6;

    /* saturated both ways: a corrupted size must not overflow the counter */
    if (ev->kind == FSDP_EV_ALLOC)
        r->cat[c] = ev->bytes > (uint64_t)(INT64_MAX - r->cat[c]) ? INT64_MAX
                                                                  : r->cat[c] + (int64_t)ev->bytes;
    else /* a free whose alloc came before tracing began leaves 0 */
        r->cat[c] = ev->bytes >= (uint64_t)r->cat[c] ? 0 : r->cat[c] - (int64_t)ev->bytes;
    export_sep(x);
    fprintf(x->f,
            "{\"ph\":\"C\",\"name\":\"allocated\",\"ts\":%.3f,\"pid\":%d,\"tid\":%lld,"
            "\"args\":{\"bytes\":%" PRIu64 "}}",
            ts, export_pid(rank), export_tid(rank, 0), ev->allocated);
    export_sep(x);
    fprintf(x->f,
            "{\"ph\":\"C\",\"name\":\"reserved\",\"ts\":%.3f,\"pid\":%d,\"tid\":%lld,"
            "\"args\":{\"bytes\":%" PRIu64 "}}",
            ts, export_pid(rank), export_tid(rank, 0), ev->reserved);
    export_sep(x);
    fprintf(x->f,
            "{\"ph\":\"C\",\"name\":\"memory by category\",\"ts\":%.3f,\"pid\":%d,"
            "\"tid\":%lld,\"args\":{",
            ts, export_pid(rank), export_tid(rank, 0));
    for (int k = 0; k < EXPORT_NCAT; k++)
        fprintf(x->f, "%s\"%s\":%" PRId64, k > 0 ? "," : "", export_cat_names[k], r->cat[k]);
    fputs("}}", x->f);
}

/* Seconds as whole nanoseconds: every time is rounded once, before any difference. A damaged
 * trace's time is taken as 0 when it is not a number and within +-1e9 s otherwise, so that the
 * difference of two always fits. */
static long long export_ns(double seconds)
{
    if (isnan(seconds))
        return 0;
    if (seconds > 1e9)
        seconds = 1e9;
    else if (seconds < -1e9)
        seconds = -1e9;
    return llround(seconds * 1e9);
}

/* Nanoseconds as the format's microseconds, exactly. */
static void export_us(FILE *f, long long ns)
{
    fprintf(f, "%s%lld.%03lld", ns < 0 ? "-" : "", llabs(ns) / 1000, llabs(ns) % 1000);
}

/* The slot of record number id (nonzero): its own, or the empty one where it would go. */
static export_record_t *export_record_slot(const export_rank_t *r, uint64_t id)
{
    size_t mask = r->records_cap - 1, i = (size_t)(id * 0x9e3779b97f4a7c15ull) & mask;

    while (r->records[i].id != 0 && r->records[i].id != id)
        i = (i + 1) & mask;
    return &r->records[i];
}

/* Remembers where record number id was drawn (a record without a number, from an older trace,
 * or one that finds no memory: its waits get no arrow). A number seen again is drawn where it
 * was seen last. */
static void export_note_record(export_ctx_t *x, uint64_t id, long long ts_ns, int tid_index)
{
    export_rank_t *r = &x->cur;
    export_record_t *slot;

    if (id == 0)
        return;
    if (2 * (r->nrecords + 1) > r->records_cap) { /* at most half full */
        size_t cap = r->records_cap ? 2 * r->records_cap : 1024;
        export_record_t *old = r->records, *v = calloc(cap, sizeof(*v));
        size_t old_cap = r->records_cap;

        if (v == NULL)
            return;
        r->records = v;
        r->records_cap = cap;
        for (size_t k = 0; k < old_cap; k++)
            if (old[k].id != 0)
                *export_record_slot(r, old[k].id) = old[k];
        free(old);
    }
    slot = export_record_slot(r, id);
    if (slot->id == 0)
        r->nrecords++;
    slot->id = id;
    slot->ts_ns = ts_ns;
    slot->tid_index = tid_index;
}

/* The arrow from record number id to the wait at (ts_ns, tid_index): a flow start at the record
 * and its end bound to the wait. */
static void export_flow(export_ctx_t *x, int rank, uint64_t id, long long ts_ns, int tid_index)
{
    const export_record_t *rec;
    uint64_t flow;

    if (id == 0 || x->cur.nrecords == 0 || (rec = export_record_slot(&x->cur, id))->id == 0)
        return;
    flow = ++x->flows;
    export_sep(x);
    fprintf(
        x->f,
        "{\"name\":\"event\",\"cat\":\"dependency\",\"ph\":\"s\",\"id\":%" PRIu64 ",\"ts\":", flow);
    export_us(x->f, rec->ts_ns);
    fprintf(x->f, ",\"pid\":%d,\"tid\":%lld}", export_pid(rank), export_tid(rank, rec->tid_index));
    export_sep(x);
    fprintf(x->f,
            "{\"name\":\"event\",\"cat\":\"dependency\",\"ph\":\"f\",\"bp\":\"e\",\"id\":%" PRIu64
            ",\"ts\":",
            flow);
    export_us(x->f, ts_ns);
    fprintf(x->f, ",\"pid\":%d,\"tid\":%lld}", export_pid(rank), export_tid(rank, tid_index));
}

static int export_event(void *arg, int rank, uint64_t seq, const fsdp_trace_event_t *ev)
{
    export_ctx_t *x = arg;
    int tid_index;
    long long ts, end;

    if (!x->have_rank || rank != x->cur.rank)
        export_rank_reset(x, rank);
    if (ev->kind == FSDP_EV_ALLOC || ev->kind == FSDP_EV_FREE) {
        export_counters(x, rank, ev);
        return ferror(x->f) ? (x->io_error = 1) : 0;
    }
    /* the host waiting on a stream is the host's time */
    tid_index = export_stream(x, ev->kind == FSDP_EV_SYNC ? NULL : ev->stream);
    if (tid_index < 0) {
        x->io_error = 2;
        return 1;
    }
    if (ev->end > ev->start) {
        ts = export_ns(ev->start);
        end = export_ns(ev->end);
    } else {
        ts = export_ns(ev->stream != NULL && ev->kind != FSDP_EV_SYNC ? ev->start : ev->host_time);
        end = -1;
    }
    if (ev->kind == FSDP_EV_RECORD)
        export_note_record(x, ev->count, ts, tid_index);
    export_sep(x);
    fputs("{\"name\":", x->f);
    if (ev->unit != NULL) {
        char buf[2 * FSDP_TRACE_STR_MAX + 8];
        snprintf(buf, sizeof(buf), "%s [%s]", ev->name, ev->unit);
        json_str(x->f, buf);
    } else {
        json_str(x->f, ev->name);
    }
    fprintf(x->f, ",\"cat\":\"%s\",", fsdp_event_kind_name(ev->kind));
    fputs(end >= 0 ? "\"ph\":\"X\",\"ts\":" : "\"ph\":\"i\",\"s\":\"t\",\"ts\":", x->f);
    export_us(x->f, ts);
    if (end >= 0) {
        fputs(",\"dur\":", x->f);
        export_us(x->f, end - ts);
    }
    fprintf(x->f, ",\"pid\":%d,\"tid\":%lld,\"args\":{\"seq\":%" PRIu64 ",\"host_time_us\":%.3f",
            export_pid(rank), export_tid(rank, tid_index), seq, ev->host_time * 1e6);
    if (ev->kind == FSDP_EV_SYNC && ev->stream != NULL) {
        fputs(",\"stream\":", x->f);
        json_str(x->f, ev->stream);
    }
    if (ev->kind == FSDP_EV_RECORD || ev->kind == FSDP_EV_WAIT)
        fprintf(x->f, ",\"record\":%" PRIu64, ev->count);
    if (ev->unit != NULL) {
        fputs(",\"unit\":", x->f);
        json_str(x->f, ev->unit);
    }
    if (ev->group != NULL) {
        fputs(",\"group\":", x->f);
        json_str(x->f, ev->group);
    }
    if ((ev->bytes != 0 || ev->count != 0) && ev->kind != FSDP_EV_RECORD &&
        ev->kind != FSDP_EV_WAIT)
        fprintf(x->f, ",\"bytes\":%" PRIu64 ",\"count\":%" PRIu64, ev->bytes, ev->count);
    if (ev->dtype >= 0)
        fprintf(x->f, ",\"dtype\":\"%s\"", fsdp_dtype_name((fsdp_dtype_t)ev->dtype));
    fputs("}}", x->f);
    if (ev->kind == FSDP_EV_WAIT)
        export_flow(x, rank, ev->count, ts, tid_index);
    if (ferror(x->f)) {
        x->io_error = 1;
        return 1;
    }
    return 0;
}

fsdp_status_t fsdp_trace_export_chrome(const char *path, int64_t run, const char *out_path)
{
    fsdp_trace_reader_t *reader = NULL;
    fsdp_trace_run_row_t info;
    export_ctx_t x;
    fsdp_status_t status;
    int64_t id;
    int symmetric = 0;

    memset(&x, 0, sizeof(x));
    x.first = 1;
    if (out_path == NULL) {
        fsdp_error("export: no output file given");
        return FSDP_ERR_INVALID_PARAM;
    }
    status = fsdp_trace_reader_open(path, &reader);
    if (status != FSDP_OK)
        return status;
    status = fsdp_trace_reader_find_run(reader, run, &id);
    if (status == FSDP_OK)
        status = fsdp_trace_db_num_ranks(fsdp_trace_reader_db(reader), path, id, &x.nranks);
    if (status == FSDP_OK)
        status = fsdp_trace_db_rank_classes(fsdp_trace_reader_db(reader), id, x.nranks, &x.classes,
                                            &symmetric);
    if (status == FSDP_OK)
        status = fsdp_trace_reader_run(reader, id, &info);
    if (status != FSDP_OK)
        goto err_close_reader;
    x.f = fopen(out_path, "w");
    if (x.f == NULL) {
        fsdp_error("export: cannot create '%s': %s", out_path, strerror(errno));
        status = FSDP_ERR_IO;
        goto err_close_reader;
    }
    fprintf(x.f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"run\":%" PRId64 ",\"backend\":", id);
    json_str(x.f, info.backend);
    fprintf(x.f, ",\"world_size\":%d,\"strategy\":", info.world_size);
    json_str(x.f, info.strategy != NULL ? info.strategy : "");
    fputs(",\"version\":", x.f);
    json_str(x.f, info.version);
    fputs("},\"traceEvents\":[", x.f);
    status = fsdp_trace_reader_events(reader, id, -1, export_event, &x);
    fputs("\n]}\n", x.f);
    if (status == FSDP_OK && x.io_error == 2) {
        fsdp_error("export: out of host memory");
        status = FSDP_ERR_NO_MEMORY;
    }
    if (fclose(x.f) != 0 || x.io_error == 1) {
        if (status == FSDP_OK) {
            fsdp_error("export: cannot write '%s': %s", out_path, strerror(errno));
            status = FSDP_ERR_IO;
        }
    }
    if (status != FSDP_OK)
        remove(out_path);
    for (int k = 0; k < x.cur.nstreams; k++)
        free(x.cur.streams[k]);
    free(x.cur.streams);
    free(x.cur.records);

err_close_reader:
    fsdp_trace_rank_classes_free(x.classes, x.nranks);
    fsdp_trace_reader_close(reader);
    return status;
}
