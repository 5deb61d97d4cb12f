/* One sim rank's own books, below its ops table (backend.c) and its collectives (coll.c): the
 * last error, the virtual clocks of its host and streams (with the SMs its collectives hold
 * from its GEMMs), the accounting of what ran and when, and the trace row of each op.
 */
#include "sim.h"

#include "kernels/kinds.h"

#include <fsdp/log.h>
#include <fsdp/trace.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors ---------------------------------------------------------------------------- */

void fsdp_sim_set_error(fsdp_sim_dev_t *dev, const char *msg)
{
    char *copy = strdup(msg);

    /* Out of host memory: keep the previous message rather than lose the rank's state. */
    if (copy == NULL)
        return;
    free(dev->last_error);
    dev->last_error = copy;
}

fsdp_status_t fsdp_sim_error_at(fsdp_sim_dev_t *dev, fsdp_status_t status, const char *file,
                                int line, const char *func, const char *fmt, ...)
{
    char msg[1024];
    int n;
    va_list ap;

    n = snprintf(msg, sizeof(msg), "rank %d: ", dev->super.rank);
    va_start(ap, fmt);
    vsnprintf(msg + n, sizeof(msg) - (size_t)n, fmt, ap);
    va_end(ap);
    fsdp_sim_set_error(dev, msg);
    if (fsdp_log_level() >= FSDP_LOG_ERROR)
        fsdp_log_emit(FSDP_LOG_ERROR, file, line, func, "%s", msg);
    return status;
}

/* ---- accounting ------------------------------------------------------------------------ */

/* Appends [start, end) to a span list; with merge, joins it to the last span it touches (lists
 * whose spans come in time order). */
static void spans_add(fsdp_sim_dev_t *dev, fsdp_sim_spans_t *l, double start, double end, int merge)
{
    if (!(end > start))
        return;
    if (merge && l->n > 0 && start <= l->v[l->n - 1].end) {
        l->v[l->n - 1].end = fsdp_sim_max2(l->v[l->n - 1].end, end);
        return;
    }
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        fsdp_sim_span_t *v = realloc(l->v, cap * sizeof(*v));
        if (v == NULL) {
            dev->acct_oom = 1; /* accounting only: the simulation goes on */
            return;
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n].start = start;
    l->v[l->n].end = end;
    l->n++;
}

static int span_cmp(const void *a, const void *b)
{
    const fsdp_sim_span_t *x = a, *y = b;

    if (x->start != y->start)
        return x->start < y->start ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Sorts and merges a span list in place. */
static void spans_normalize(fsdp_sim_spans_t *l)
{
    size_t w = 0;

    if (l->n < 2)
        return;
    qsort(l->v, l->n, sizeof(*l->v), span_cmp);
    for (size_t i = 1; i < l->n; i++) {
        if (l->v[i].start <= l->v[w].end)
            l->v[w].end = fsdp_sim_max2(l->v[w].end, l->v[i].end);
        else
            l->v[++w] = l->v[i];
    }
    l->n = w + 1;
}

static double spans_total(const fsdp_sim_spans_t *l)
{
    double t = 0.0;

    for (size_t i = 0; i < l->n; i++)
        t += l->v[i].end - l->v[i].start;
    return t;
}

/* Length of the intersection of two sorted, merged span lists. */
static double spans_overlap(const fsdp_sim_spans_t *a, const fsdp_sim_spans_t *b)
{
    size_t i = 0, j = 0;
    double t = 0.0;

    while (i < a->n && j < b->n) {
        double lo = fsdp_sim_max2(a->v[i].start, b->v[j].start);
        double hi = a->v[i].end < b->v[j].end ? a->v[i].end : b->v[j].end;
        if (hi > lo)
            t += hi - lo;
        if (a->v[i].end < b->v[j].end)
            i++;
        else
            j++;
    }
    return t;
}

void fsdp_sim_account_coll(fsdp_sim_dev_t *dev, const fsdp_sim_stream_t *stream,
                           fsdp_sim_coll_kind_t kind, double ready, double end, double nccl_bytes)
{
    fsdp_sim_spans_t *l = &dev->comm_spans;

    (void)stream;
    if ((unsigned)kind <= FSDP_SIM_COLL_SPLIT)
        dev->acct.coll_s[kind] += end - ready;
    dev->acct.coll_bytes += nccl_bytes;
    dev->acct.n_colls++;
    /* keep the list short: collectives of several streams interleave, but most touch */
    if (l->n == l->cap && l->n >= 4096)
        spans_normalize(l);
    spans_add(dev, l, ready, end, 1);
}

/* Accounts a kernel (of `flops`, as priced) or copy that ran on stream over [start, end). */
static void account_op(fsdp_sim_dev_t *dev, const fsdp_sim_stream_t *stream,
                       const fsdp_sim_op_t *op, double flops, double start, double end)
{
    if (op->kind == FSDP_SIM_OP_KERNEL) {
        dev->acct.kernel_s += end - start;
        dev->acct.flops += flops;
        dev->acct.n_kernels++;
        /* matrix products, fused attention's included (what MFU counts) */
        if (op->kernel->kind == FSDP_K_GEMM || op->kernel->kind == FSDP_K_ATTENTION_FWD ||
            op->kernel->kind == FSDP_K_ATTENTION_BWD) {
            dev->acct.gemm_s += end - start;
            dev->acct.gemm_flops += flops;
        }
    } else if (op->kind == FSDP_SIM_OP_MEMCPY) {
        dev->acct.copy_s[fsdp_sim_copy_kind(dev, op->dst, op->src)] += end - start;
        dev->acct.n_copies++;
    } else {
        return;
    }
    if (stream == &dev->compute)
        spans_add(dev, &dev->compute_spans, start, end, 1);
}

void fsdp_sim_acct_cleanup(fsdp_sim_dev_t *dev)
{
    free(dev->compute_spans.v);
    free(dev->comm_spans.v);
    free(dev->sm_holds);
    free(dev->segs);
    memset(&dev->compute_spans, 0, sizeof(dev->compute_spans));
    memset(&dev->comm_spans, 0, sizeof(dev->comm_spans));
    dev->segs = NULL;
    dev->n_segs = dev->cap_segs = 0;
    dev->sm_holds = NULL;
    dev->n_sm_holds = dev->cap_sm_holds = 0;
}

void fsdp_sim_acct_spans(fsdp_sim_dev_t *dev, fsdp_sim_time_stats_t *stats)
{
    spans_normalize(&dev->comm_spans);
    stats->compute_s = spans_total(&dev->compute_spans);
    stats->comm_s = spans_total(&dev->comm_spans);
    stats->exposed_comm_s = stats->comm_s - spans_overlap(&dev->comm_spans, &dev->compute_spans);
    if (stats->exposed_comm_s < 0.0)
        stats->exposed_comm_s = 0.0;
}

/* ---- clocks ---------------------------------------------------------------------------- */

double fsdp_sim_stream_ready(const fsdp_sim_dev_t *dev, const fsdp_sim_stream_t *stream)
{
    return fsdp_sim_max2(dev->host_clock + dev->profile->host.launch_latency_s, stream->clock);
}

void fsdp_sim_host_launch(fsdp_sim_dev_t *dev)
{
    dev->host_clock += dev->profile->host.launch_overhead_s;
}

/* 1 when two records are of the same collective (their holds aside) */
static int same_collective(const fsdp_sim_hold_rec_t *a, const fsdp_sim_hold_rec_t *b)
{
    return a->kind == b->kind && a->dtype == b->dtype && a->group_size == b->group_size &&
           a->count == b->count;
}

/* The bytes a rank of a group of n sends or receives over its links in the collective `call`
 * (nccl-tests' bus bytes: busbw x time): (n - 1)/n of the full buffer for an all-gather or a
 * reduce-scatter, twice that for an all-reduce, the buffer for a broadcast. */
static double bus_bytes(const fsdp_sim_call_t *call, int n)
{
    double b = (double)call->count * (double)fsdp_dtype_size(call->dtype);

    if (n < 2)
        return 0.0;
    switch (call->kind) {
    case FSDP_SIM_COLL_ALL_GATHER:
    case FSDP_SIM_COLL_REDUCE_SCATTER:
        return b * (n - 1); /* count is a rank's shard */
    case FSDP_SIM_COLL_ALL_REDUCE:
        return 2.0 * b * (n - 1) / n;
    case FSDP_SIM_COLL_BROADCAST:
        return b;
    default:
        return 0.0;
    }
}

/* A stream's key in the holds, the same in every run of a job: a hash of its name (FNV-1a) */
static unsigned stream_key(const fsdp_sim_stream_t *stream)
{
    unsigned h = 2166136261u;

    for (const char *c = stream != NULL ? stream->super.name : NULL; c != NULL && *c; c++)
        h = (h ^ (unsigned char)*c) * 16777619u;
    return h;
}

void fsdp_sim_hold_sms(fsdp_sim_dev_t *dev, const fsdp_sim_call_t *call, int group_size,
                       const fsdp_sim_stream_t *stream)
{
    fsdp_sim_holds_t *book = dev->world->params.holds;
    double start = call->start, end = call->end;
    int sms = dev->profile->gpu.sms > 0 ? call->sms : 0;
    double bus = dev->profile->nccl.hbm_traffic_factor * bus_bytes(call, group_size);
    double hbm = end > start ? bus / (end - start) : 0.0;
    fsdp_sim_hold_rec_t rec = {{start, end, sms, hbm, stream_key(stream)},
                               (int)call->kind,
                               (int)call->dtype,
                               group_size,
                               call->count};
    size_t kept = 0;

    if ((sms <= 0 && !(hbm > 0.0)) || !(end > start))
        return;
    /* the book: this hold for the next run; the earlier run's holds stop counting once this
     * rank's collectives are no longer theirs */
    if (book != NULL && fsdp_sim_holds_record(book, dev->super.rank, &rec) != 0)
        dev->acct_oom = 1;
    if (dev->prior != NULL &&
        (dev->n_issued >= dev->n_prior || !same_collective(&dev->prior[dev->n_issued], &rec)))
        dev->prior = NULL;
    /* the earlier run's later holds, moved by how much later this one started than it did then */
    if (dev->prior != NULL)
        dev->prior_shift = start - dev->prior[dev->n_issued].hold.start;
    dev->n_issued++;
    /* a kernel issued from now on starts at the host clock or later: holds that end before it
     * can no longer overlap one */
    for (size_t i = 0; i < dev->n_sm_holds; i++)
        if (dev->sm_holds[i].end > dev->host_clock)
            dev->sm_holds[kept++] = dev->sm_holds[i];
    dev->n_sm_holds = kept;
    if (dev->n_sm_holds == dev->cap_sm_holds) {
        size_t cap = dev->cap_sm_holds ? dev->cap_sm_holds * 2 : 16;
        fsdp_sim_sm_hold_t *v = realloc(dev->sm_holds, cap * sizeof(*v));
        if (v == NULL) {
            dev->acct_oom = 1; /* the kernels beside it run as if it held none */
            return;
        }
        dev->sm_holds = v;
        dev->cap_sm_holds = cap;
    }
    dev->sm_holds[dev->n_sm_holds++] = rec.hold;
}

/* Adds the SMs and the HBM bandwidth the hold h, moved by `shift` seconds, holds at time t to
 * *held and *hbm, and moves *next to its next start or end after t; a hold of the kernel's own
 * stream (`own`) runs before or after it, never beside it. */
static void hold_at(const fsdp_sim_sm_hold_t *h, double shift, double t, unsigned own, int *held,
                    double *hbm, double *next)
{
    double start = h->start + shift, end = h->end + shift;

    if (h->stream == own)
        return;
    if (start <= t && t < end) {
        *held += h->sms;
        *hbm += h->hbm;
        *next = fsdp_sim_min2(*next, end);
    } else if (start > t) {
        *next = fsdp_sim_min2(*next, start);
    }
}

/* The collectives of the earlier run (params.holds) that a kernel issued now may meet: the next
 * ones this rank will issue. A kernel runs beside the few collectives the host issues while the
 * GPU is behind it (FSDP's limiter keeps that to a unit or two), not beside ones dozens ahead. */
#define PRIOR_WINDOW 64

/* The time a memory-bound kernel that moves its HBM bytes at `rate` bytes/s alone takes, over
 * `full` seconds alone, beside collectives that move `hbm` bytes/s: while the two ask for more
 * than HBM sustains (a large copy's rate, gpu.memory_efficiency x hbm_bytes_per_s), each gets
 * its share of it in proportion to what it asks (docs/costs.md, "Collectives take HBM
 * bandwidth"). */
static double hbm_shared_time(const fsdp_sim_profile_t *p, double rate, double full, double hbm)
{
    double cap = p->gpu.hbm_bytes_per_s * p->gpu.memory_efficiency;

    /* HBM of rate 0 is free (rate_time): nothing to share */
    return cap > 0.0 && rate > 0.0 && rate + hbm > cap ? full * (rate + hbm) / cap : full;
}

/* The end of a kernel that starts at `start` and takes `full` seconds on the whole GPU, run
 * beside the collectives that hold SMs and HBM bandwidth (those issued, and those of the earlier
 * run not issued yet): over each stretch between a hold's start or end, it does the part of its
 * work that what they leave it allows: a GEMM or fused attention its time on the SMs left
 * (fsdp_sim_kernel_time_on), a memory-bound kernel (rate > 0: its HBM bytes/s alone) its time
 * on the HBM bandwidth left (hbm_shared_time). */
static double contended_end(const fsdp_sim_dev_t *dev, const fsdp_kernel_t *k, unsigned own,
                            double start, double full, double rate)
{
    const fsdp_sim_profile_t *p = dev->profile;
    double t = start, left = 1.0; /* the fraction of the kernel's work still to do */
    size_t lo = dev->n_issued, hi = 0;

    if (dev->prior != NULL && lo < dev->n_prior)
        hi = dev->n_prior - lo > PRIOR_WINDOW ? lo + PRIOR_WINDOW : dev->n_prior;
    for (;;) {
        double next = INFINITY, on, hbm = 0.0;
        int held = 0;

        for (size_t i = 0; i < dev->n_sm_holds; i++)
            hold_at(&dev->sm_holds[i], 0.0, t, own, &held, &hbm, &next);
        for (size_t i = lo; i < hi; i++)
            hold_at(&dev->prior[i].hold, dev->prior_shift, t, own, &held, &hbm, &next);
        /* at least one SM stays the kernel's (fsdp_sim_kernel_time_on) */
        if (rate > 0.0)
            on = hbm_shared_time(p, rate, full, hbm);
        else
            on = held == 0 ? full : fsdp_sim_kernel_time_on(p, k, p->gpu.sms - held);
        if (!(on > 0.0) || t + left * on <= next)
            return t + left * on;
        left -= (next - t) / on;
        t = next;
    }
}

void fsdp_sim_trace_op(fsdp_sim_dev_t *dev, fsdp_event_kind_t kind, const char *name,
                       const fsdp_sim_stream_t *stream, double host, double start, double end,
                       double bytes, uint64_t count, int dtype, const char *group)
{
    fsdp_trace_op_t op = {.kind = kind,
                          .name = name,
                          .stream = stream != NULL ? stream->super.name : NULL,
                          .host = host,
                          .start = start,
                          .end = end,
                          .bytes = bytes > 0.0 ? (uint64_t)bytes : 0,
                          .count = count,
                          .dtype = dtype,
                          .group = group};

    fsdp_trace_op(&dev->super, &op, NULL);
}

fsdp_status_t fsdp_sim_time_check(fsdp_sim_dev_t *dev, const char *what, double start, double end)
{
    if (isfinite(end) && end >= start)
        return FSDP_OK;
    return fsdp_sim_errorf(dev, FSDP_ERR_INVALID_PARAM,
                           "the simulated time of %s is %g s, not a finite time: cluster "
                           "profile '%s' prices it out of range",
                           what, end - start, dev->profile->name);
}

fsdp_status_t fsdp_sim_stream_issue(fsdp_sim_dev_t *dev, fsdp_sim_stream_t *stream,
                                    const fsdp_sim_op_t *op)
{
    double host = dev->host_clock, start = fsdp_sim_stream_ready(dev, stream), flops, end;
    fsdp_status_t status;

    int launches = op->kind == FSDP_SIM_OP_KERNEL
                       ? fsdp_sim_kernel_launches(dev->profile, op->kernel)
                       : 1;

    end = start + fsdp_sim_op_cost_flops(dev, op, &flops);
    /* the stream's clock stays finite: an op it cannot price fails the rank */
    status = fsdp_sim_time_check(
        dev, op->kind == FSDP_SIM_OP_KERNEL ? fsdp_kernel_name(op->kernel->kind) : "a copy", start,
        end);
    if (status != FSDP_OK)
        return status;
    stream->clock = end;
    if ((dev->n_sm_holds > 0 || dev->prior != NULL) && op->kind == FSDP_SIM_OP_KERNEL) {
        double whole = stream->clock;

        if (op->kernel->kind == FSDP_K_GEMM || op->kernel->kind == FSDP_K_ATTENTION_FWD ||
            op->kernel->kind == FSDP_K_ATTENTION_BWD) {
            stream->clock =
                contended_end(dev, op->kernel, stream_key(stream), start, whole - start, 0.0);
            dev->acct.sm_held_s += stream->clock - whole;
        } else if (fsdp_kb_cost_class(op->kernel->kind) == FSDP_KC_VECTOR && whole > start) {
            double rate = fsdp_sim_kernel_hbm_bytes(dev->profile, op->kernel) / (whole - start);

            stream->clock =
                contended_end(dev, op->kernel, stream_key(stream), start, whole - start, rate);
            dev->acct.hbm_held_s += stream->clock - whole;
        }
    }
    /* a kernel run as several eager ops: the host launches each; the last cannot start before
     * its launch (the device time is spread evenly over the ops for this bound) */
    if (launches > 1)
        stream->clock = fsdp_sim_max2(stream->clock,
                                      host + dev->profile->host.launch_latency_s +
                                          (launches - 1) * dev->profile->host.launch_overhead_s +
                                          (stream->clock - start) / launches);
    account_op(dev, stream, op, flops, start, stream->clock);
    for (int i = 0; i < launches; i++)
        fsdp_sim_host_launch(dev);
    if (fsdp_trace_enabled(&dev->super)) {
        if (op->kind == FSDP_SIM_OP_KERNEL) {
            fsdp_trace_op_t ev = {
                .stream = stream->super.name, .host = host, .start = start, .end = stream->clock};
            fsdp_trace_kernel_fields(op->kernel, &ev);
            fsdp_trace_op(&dev->super, &ev, NULL);
        } else if (op->kind == FSDP_SIM_OP_MEMCPY) {
            fsdp_sim_trace_op(dev, FSDP_EV_COPY,
                              fsdp_sim_copy_name(fsdp_sim_copy_kind(dev, op->dst, op->src)), stream,
                              host, start, stream->clock, (double)op->bytes, op->bytes, -1, NULL);
        }
    }
    return FSDP_OK;
}

fsdp_status_t fsdp_sim_stream_get(fsdp_sim_dev_t *dev, fsdp_stream_t *stream,
                                  fsdp_sim_stream_t **stream_p)
{
    fsdp_sim_stream_t *s = (fsdp_sim_stream_t *)stream;

    if (s == NULL) {
        *stream_p = &dev->compute;
        return FSDP_OK;
    }
    if (s->dev != dev)
        return fsdp_sim_errorf(dev, FSDP_ERR_INVALID_PARAM,
                               "stream '%s' belongs to another rank; use one of this rank's "
                               "streams or NULL for the compute stream",
                               s->super.name);
    *stream_p = s;
    return FSDP_OK;
}
