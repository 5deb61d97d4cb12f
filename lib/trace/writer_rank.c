/* The trace writer's rank side (writer.h): what a rank's thread does. Events are copied into
 * the rank's current chunk under the rank's own mutex; a full chunk, or one that ends a step,
 * is handed to the writer's queue; attach and detach give a rank its writer and its row of the
 * ranks table. */
#include "base/strbuf.h"
#include "trace/writer.h"

#include <fsdp/log.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Fills in the device times an emitter left to resolve, before the chunk leaves its rank. */
static void chunk_resolve(trace_chunk_t *c)
{
    for (int i = 0; c->n_timed > 0 && i < c->n; i++) {
        fsdp_trace_timing_t *timing = c->timing[i];
        if (timing == NULL)
            continue;
        c->timing[i] = NULL;
        c->n_timed--;
        timing->resolve(timing, &c->recs[i].start, &c->recs[i].end);
    }
}

int fsdp_trace_rank_handover(fsdp_trace_rank_t *r, int replace)
{
    fsdp_trace_t *t = r->trace;
    trace_chunk_t *c = r->cur, *fresh = NULL;

    if (c != NULL && c->n == 0 && !c->has_step)
        return 1; /* nothing to hand over: keep it */
    if (c != NULL)
        chunk_resolve(c);
    pthread_mutex_lock(&t->lock);
    if (c != NULL) {
        c->next = NULL;
        if (r->row_pending) {
            c->rank_row = r;
            r->row_pending = 0;
        }
        if (t->tail != NULL)
            t->tail->next = c;
        else
            t->head = c;
        t->tail = c;
        t->queued++;
        t->submitted++;
        if (t->queued >= TRACE_QUEUE_WARN && !t->warned_queue) {
            t->warned_queue = 1;
            fsdp_warn("trace '%s': %zu chunks wait for the writer: the database is slower than "
                      "the ranks, memory grows",
                      t->path, t->queued);
        }
        pthread_cond_signal(&t->work);
    }
    if (replace && t->free_list != NULL) {
        fresh = t->free_list;
        t->free_list = fresh->next;
        t->n_free--;
    }
    pthread_mutex_unlock(&t->lock);
    r->cur = NULL;
    if (!replace)
        return 1;
    if (fresh == NULL) {
        fresh = malloc(sizeof(*fresh));
        if (fresh == NULL)
            return 0;
    }
    fresh->next = NULL;
    fresh->rank = r->rank;
    fresh->n = 0;
    fresh->has_step = 0;
    fresh->n_timed = 0;
    fresh->arena_used = 0;
    fresh->rank_row = NULL;
    r->cur = fresh;
    return 1;
}

static size_t str_room(const char *s)
{
    return s == NULL ? 0 : strnlen(s, FSDP_TRACE_STR_MAX) + 1;
}

static uint32_t chunk_str(trace_chunk_t *c, const char *s)
{
    uint32_t off = c->arena_used;
    size_t n;

    if (s == NULL)
        return TRACE_NO_STR;
    n = strnlen(s, FSDP_TRACE_STR_MAX);
    memcpy(c->arena + off, s, n);
    c->arena[off + n] = '\0';
    c->arena_used += (uint32_t)(n + 1);
    return off;
}

void fsdp_trace_set_unit(fsdp_dev_t *dev, const char *unit)
{
    if (dev != NULL && dev->trace != NULL)
        dev->trace->unit = unit;
}

void fsdp_trace_set_memory(fsdp_dev_t *dev, const fsdp_mem_pool_stats_t *mem)
{
    if (dev != NULL && dev->trace != NULL)
        dev->trace->mem = mem;
}

void fsdp_trace_emit(fsdp_dev_t *dev, const fsdp_trace_event_t *ev)
{
    fsdp_trace_emit_timed(dev, ev, NULL);
}

void fsdp_trace_emit_timed(fsdp_dev_t *dev, const fsdp_trace_event_t *ev,
                           fsdp_trace_timing_t *timing)
{
    fsdp_trace_rank_t *r;
    trace_chunk_t *c;
    trace_rec_t *rec;
    const char *unit;
    size_t room;

    if (dev == NULL || (r = dev->trace) == NULL || ev == NULL) {
        if (timing != NULL) {
            double start = 0.0, end = 0.0;
            timing->resolve(timing, &start, &end); /* nothing to time: release it */
        }
        return;
    }
    unit = ev->unit != NULL ? ev->unit : r->unit;
    room = str_room(ev->name != NULL ? ev->name : "") + str_room(unit) + str_room(ev->stream) +
           str_room(ev->group);
    pthread_mutex_lock(&r->lock);
    c = r->cur;
    if (c == NULL || c->n == TRACE_CHUNK_EVENTS || c->arena_used + room > TRACE_CHUNK_ARENA) {
        if (!fsdp_trace_rank_handover(r, 1)) {
            /* Out of host memory: the event is lost, but its number is kept so the gap shows. */
            r->seq++;
            pthread_mutex_unlock(&r->lock);
            fsdp_error("rank %d: no memory for a trace chunk: event dropped", r->rank);
            if (timing != NULL) {
                double start = ev->start, end = ev->end;
                timing->resolve(timing, &start, &end);
            }
            return;
        }
        c = r->cur;
    }
    c->timing[c->n] = timing;
    c->n_timed += timing != NULL;
    rec = &c->recs[c->n++];
    rec->seq = r->seq++;
    rec->kind = (int32_t)ev->kind;
    rec->dtype = ev->dtype;
    rec->host_time = ev->host_time;
    rec->start = ev->start;
    rec->end = ev->end;
    rec->bytes = ev->bytes;
    rec->count = ev->count;
    rec->allocated = ev->allocated;
    rec->reserved = ev->reserved;
    if (r->mem != NULL && ev->allocated == 0 && ev->reserved == 0) {
        rec->allocated = r->mem->allocated_bytes.current;
        rec->reserved = r->mem->reserved_bytes.current;
    }
    rec->name = chunk_str(c, ev->name != NULL ? ev->name : "");
    rec->unit = chunk_str(c, unit);
    rec->stream = chunk_str(c, ev->stream);
    rec->group = chunk_str(c, ev->group);
    pthread_mutex_unlock(&r->lock);
}

void fsdp_trace_step(fsdp_dev_t *dev, int64_t step, double loss, double step_time,
                     const fsdp_mem_stats_t *mem)
{
    fsdp_trace_rank_t *r;
    trace_step_rec_t *s;

    if (dev == NULL || (r = dev->trace) == NULL)
        return;
    pthread_mutex_lock(&r->lock);
    if (r->cur == NULL && !fsdp_trace_rank_handover(r, 1)) {
        pthread_mutex_unlock(&r->lock);
        fsdp_error("rank %d: no memory for a trace chunk: step %" PRId64 " dropped", r->rank, step);
        return;
    }
    s = &r->cur->step;
    memset(s, 0, sizeof(*s));
    s->step = step;
    s->loss = loss;
    s->step_time = step_time;
    s->seq_end = r->seq;
    if (mem != NULL) {
        s->peak_allocated = mem->peak_allocated;
        s->peak_reserved = mem->peak_reserved;
        for (int k = 0; k < FSDP_MEM_CATEGORY_COUNT; k++) {
            s->peak[k] = mem->peak_by_category[k];
            s->at_peak[k] = mem->at_peak_by_category[k];
        }
    }
    r->cur->has_step = 1;
    fsdp_trace_rank_handover(r, 0); /* the next emit takes a fresh chunk */
    pthread_mutex_unlock(&r->lock);
}

/* Appends the members of a progression (first a, last b, step s, n ranks) to the list. */
static void members_item(fsdp_strbuf_t *b, int a, int last, int step, int n)
{
    const char *sep = b->len > 0 ? "," : "";

    if (n == 1)
        fsdp_strbuf_printf(b, "%s%d", sep, a);
    else if (step == 1)
        fsdp_strbuf_printf(b, "%s%d-%d", sep, a, last);
    else if (n == 2)
        fsdp_strbuf_printf(b, "%s%d,%d", sep, a, last);
    else
        fsdp_strbuf_printf(b, "%s%d-%d:%d", sep, a, last, step);
}

/* The ranks table's members of the rank dev stands for ("0-6", "8-16376:8,16379"), and how many
 * they are: from dev->represent, the rank alone without it. NULL when out of memory. */
static char *rank_members(const fsdp_dev_t *dev, int *count_p)
{
    fsdp_strbuf_t b = {0};
    int a = 0, last = 0, step = 0, n = 0, count = 0;

    if (dev->represent == NULL) {
        fsdp_strbuf_printf(&b, "%d", dev->rank);
        count = 1;
    }
    for (int x = 0; dev->represent != NULL && x < dev->world_size; x++) {
        if (dev->represent[x] != dev->rank)
            continue;
        count++;
        if (n == 0) {
            a = last = x;
            n = 1;
        } else if (n == 1) {
            step = x - a;
            last = x;
            n = 2;
        } else if (x - last == step) {
            last = x;
            n++;
        } else if (n == 2 && step != 1) {
            /* a pair that no third rank continues: its second rank may start the next */
            members_item(&b, a, a, 1, 1);
            a = last;
            step = x - a;
            last = x;
        } else {
            members_item(&b, a, last, step, n);
            a = last = x;
            n = 1;
        }
    }
    if (n > 0)
        members_item(&b, a, last, step, n);
    if (b.failed || b.s == NULL) {
        fsdp_strbuf_free(&b);
        return NULL;
    }
    *count_p = count;
    return b.s;
}

fsdp_status_t fsdp_trace_attach(fsdp_trace_t *t, fsdp_dev_t *dev)
{
    fsdp_trace_rank_t *r = NULL;
    fsdp_status_t status = FSDP_OK;

    if (t == NULL || dev == NULL) {
        fsdp_error("fsdp_trace_attach: %s is NULL", t == NULL ? "the trace" : "the device");
        return FSDP_ERR_INVALID_PARAM;
    }
    if (dev->rank < 0) {
        fsdp_error("fsdp_trace_attach: rank %d is invalid", dev->rank);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (dev->trace != NULL) {
        fsdp_error("rank %d: fsdp_trace_attach: the device is already tracing", dev->rank);
        return FSDP_ERR_INVALID_PARAM;
    }
    pthread_mutex_lock(&t->lock);
    if (dev->rank >= t->n_ranks) {
        int n = t->n_ranks == 0 ? 64 : t->n_ranks;
        while (n <= dev->rank)
            n *= 2;
        fsdp_trace_rank_t **ranks = realloc(t->ranks, (size_t)n * sizeof(*ranks));
        if (ranks == NULL) {
            status = FSDP_ERR_NO_MEMORY;
            goto out;
        }
        memset(ranks + t->n_ranks, 0, (size_t)(n - t->n_ranks) * sizeof(*ranks));
        t->ranks = ranks;
        t->n_ranks = n;
    }
    r = t->ranks[dev->rank];
    if (r == NULL) {
        r = calloc(1, sizeof(*r));
        if (r == NULL || pthread_mutex_init(&r->lock, NULL) != 0) {
            free(r);
            status = FSDP_ERR_NO_MEMORY;
            goto out;
        }
        r->trace = t;
        r->rank = dev->rank;
        r->members = rank_members(dev, &r->stands_for);
        if (r->members == NULL) {
            pthread_mutex_destroy(&r->lock);
            free(r);
            status = FSDP_ERR_NO_MEMORY;
            goto out;
        }
        r->row_pending = 1;
        t->ranks[dev->rank] = r;
    } else if (r->attached) {
        fsdp_error("rank %d: fsdp_trace_attach: the rank is already attached to another device",
                   dev->rank);
        status = FSDP_ERR_INVALID_PARAM;
        goto out;
    }
    r->attached = 1;
    dev->trace = r;
out:
    pthread_mutex_unlock(&t->lock);
    if (status == FSDP_ERR_NO_MEMORY)
        fsdp_error("rank %d: fsdp_trace_attach: out of host memory", dev->rank);
    return status;
}

void fsdp_trace_detach(fsdp_dev_t *dev)
{
    fsdp_trace_rank_t *r;

    if (dev == NULL || (r = dev->trace) == NULL)
        return;
    pthread_mutex_lock(&r->lock);
    fsdp_trace_rank_handover(r, 0);
    pthread_mutex_unlock(&r->lock);
    pthread_mutex_lock(&r->trace->lock);
    r->attached = 0;
    pthread_mutex_unlock(&r->trace->lock);
    dev->trace = NULL;
}

