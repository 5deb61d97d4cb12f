/* How the gpu backend paces its polls, and the ring of collectives in flight: plain C, no CUDA,
 * so that tests/test_gpu_poll.c runs it on any machine (never installed).
 *
 * Every host wait of the backend is a poll, so that a collective that never completes cannot
 * hang the host (watch.c). What a poll does between two queries depends on what it waits for:
 *
 * - FSDP_GPU_POLL_ENQUEUE: a collective's enqueue on a non-blocking communicator. NCCL hands the
 *   launch to a thread of its own and returns ncclInProgress; it settles within microseconds.
 *   A nap would cost the kernel's timer slack (50 us by default) on every collective, so the
 *   poll yields the CPU for up to FSDP_GPU_POLL_YIELD_S before it naps (PyTorch's fix of the
 *   same cost, pytorch#142291).
 * - FSDP_GPU_POLL_WAIT: the host waiting for the device (an event, a stream, a collective's end).
 *   A few polls back to back, then naps that grow to FSDP_GPU_POLL_WAIT_NAP_MAX_NS only: a wait
 *   ends at most a few tens of microseconds after its work.
 * - FSDP_GPU_POLL_COMM: init, split and finalize of a communicator, which take milliseconds to
 *   seconds: naps from 1 us, doubling up to FSDP_GPU_POLL_NAP_MAX_NS.
 *
 * The ring (fsdp_gpu_ring_t) orders the watchdog's collectives in flight, oldest first.
 */
#ifndef FSDP_GPU_POLL_H
#define FSDP_GPU_POLL_H

#include <stddef.h>

typedef enum fsdp_gpu_poll_kind {
    FSDP_GPU_POLL_ENQUEUE,
    FSDP_GPU_POLL_WAIT,
    FSDP_GPU_POLL_COMM,
} fsdp_gpu_poll_kind_t;

/* An enqueue yields this long (seconds) before its first nap. */
#define FSDP_GPU_POLL_YIELD_S 1e-3
/* A wait polls this many times back to back before its first nap. */
#define FSDP_GPU_POLL_SPINS 64u
/* A wait's naps: from 2 us, doubling up to 20 us. */
#define FSDP_GPU_POLL_WAIT_NAP_NS 2000L
#define FSDP_GPU_POLL_WAIT_NAP_MAX_NS 20000L
/* Every other nap: from 1 us, doubling up to 1 ms. */
#define FSDP_GPU_POLL_NAP_NS 1000L
#define FSDP_GPU_POLL_NAP_MAX_NS 1000000L

/* What a poll does after finding its operation still pending. */
#define FSDP_GPU_POLL_AGAIN 0L  /* poll again at once */
#define FSDP_GPU_POLL_YIELD -1L /* sched_yield() first */
/* > 0: nap that many nanoseconds first */

typedef struct fsdp_gpu_poll {
    fsdp_gpu_poll_kind_t kind;
    double t0;      /* when the poll began (seconds, any monotonic clock) */
    unsigned polls; /* pending polls so far */
    long nap_ns;    /* the next nap */
} fsdp_gpu_poll_t;

static inline void fsdp_gpu_poll_start(fsdp_gpu_poll_t *p, fsdp_gpu_poll_kind_t kind, double now)
{
    p->kind = kind;
    p->t0 = now;
    p->polls = 0;
    p->nap_ns = kind == FSDP_GPU_POLL_WAIT ? FSDP_GPU_POLL_WAIT_NAP_NS : FSDP_GPU_POLL_NAP_NS;
}

/* The pause after a poll that found the operation pending at time `now`: FSDP_GPU_POLL_AGAIN,
 * FSDP_GPU_POLL_YIELD, or a nap in nanoseconds. */
static inline long fsdp_gpu_poll_pause(fsdp_gpu_poll_t *p, double now)
{
    long nap, max = FSDP_GPU_POLL_NAP_MAX_NS;

    p->polls++;
    switch (p->kind) {
    case FSDP_GPU_POLL_ENQUEUE:
        if (now - p->t0 < FSDP_GPU_POLL_YIELD_S)
            return FSDP_GPU_POLL_YIELD;
        break;
    case FSDP_GPU_POLL_WAIT:
        if (p->polls <= FSDP_GPU_POLL_SPINS)
            return FSDP_GPU_POLL_AGAIN;
        max = FSDP_GPU_POLL_WAIT_NAP_MAX_NS;
        break;
    case FSDP_GPU_POLL_COMM:
        break;
    }
    nap = p->nap_ns;
    p->nap_ns = nap >= max / 2 ? max : 2 * nap;
    return nap;
}

/* The watchdog's ring of collectives in flight: slot indexes only, the caller holds the
 * entries. Oldest first; a collective is retired once its end is seen, oldest first, since a
 * later one of the same communicator cannot end before it. */
typedef struct fsdp_gpu_ring {
    unsigned head, count, slots;
} fsdp_gpu_ring_t;

static inline void fsdp_gpu_ring_init(fsdp_gpu_ring_t *r, unsigned slots)
{
    r->head = 0;
    r->count = 0;
    r->slots = slots;
}

/* The slot of the i-th oldest entry (i < count). */
static inline unsigned fsdp_gpu_ring_at(const fsdp_gpu_ring_t *r, unsigned i)
{
    return (r->head + i) % r->slots;
}

static inline int fsdp_gpu_ring_full(const fsdp_gpu_ring_t *r)
{
    return r->count == r->slots;
}

/* The slot for a new entry (the ring is not full), which then counts as in flight. */
static inline unsigned fsdp_gpu_ring_push(fsdp_gpu_ring_t *r)
{
    unsigned slot = fsdp_gpu_ring_at(r, r->count);
    r->count++;
    return slot;
}

/* The slot of the newest entry: 1, or 0 when the ring is empty. */
static inline int fsdp_gpu_ring_newest(const fsdp_gpu_ring_t *r, unsigned *slot_p)
{
    if (r->count == 0)
        return 0;
    *slot_p = fsdp_gpu_ring_at(r, r->count - 1);
    return 1;
}

/* done(ctx, slot): 1 when the entry's collective has ended, 0 when not yet, < 0 on an error. */
typedef int (*fsdp_gpu_ring_done_func_t)(void *ctx, unsigned slot);

/* Retires entries from the oldest while done() says 1. Returns 0, or done()'s negative result,
 * its entry left in place; *slot_p is then that entry's slot. */
static inline int fsdp_gpu_ring_retire(fsdp_gpu_ring_t *r, fsdp_gpu_ring_done_func_t done,
                                       void *ctx, unsigned *slot_p)
{
    while (r->count > 0) {
        int d = done(ctx, r->head);
        if (d < 0) {
            *slot_p = r->head;
            return d;
        }
        if (d == 0)
            break;
        r->head = (r->head + 1) % r->slots;
        r->count--;
    }
    return 0;
}

static inline void fsdp_gpu_ring_clear(fsdp_gpu_ring_t *r)
{
    r->count = 0;
}

/* A split of a non-blocking communicator, as fsdp_gpu_split_settle sees it: NCCL's (coll.c), or
 * a test's stub. NCCL publishes the child communicator from a thread of its own, possibly after
 * the split returned, so it is read through published() each time. */
typedef struct fsdp_gpu_split_layer {
    /* the communicator's state: 0 settled, 1 still in progress, < 0 failed */
    int (*state)(void *ctx, void *comm);
    /* the child as NCCL has published it so far, or NULL */
    void *(*published)(void *ctx);
    /* aborts every communicator of the rank, the parent among them; why is
     * FSDP_GPU_SPLIT_FAILED or FSDP_GPU_SPLIT_TIMED_OUT */
    void (*abort_all)(void *ctx, int why);
    void (*abort)(void *ctx, void *comm);
    double (*now)(void *ctx);
    void (*pause)(void *ctx, fsdp_gpu_poll_t *p);
    void *ctx;
} fsdp_gpu_split_layer_t;

#define FSDP_GPU_SPLIT_FAILED -1
#define FSDP_GPU_SPLIT_TIMED_OUT -2

/* Waits for a split to settle, polling the child once it is published and the parent before
 * (timeout_s <= 0: no timeout); a rank outside every new group (child 0) waits for the parent
 * only. Returns 0, FSDP_GPU_SPLIT_FAILED or FSDP_GPU_SPLIT_TIMED_OUT.
 * On failure every communicator is aborted, and then the child too if NCCL has published it
 * by then (a child published after the first look would otherwise leak); *aborted_p is then
 * that child, or NULL. */
static inline int fsdp_gpu_split_settle(const fsdp_gpu_split_layer_t *l, void *parent, int child,
                                        double timeout_s, void **aborted_p)
{
    fsdp_gpu_poll_t poll;
    void *comm;
    int st, why;

    *aborted_p = NULL;
    fsdp_gpu_poll_start(&poll, FSDP_GPU_POLL_COMM, l->now(l->ctx));
    for (;;) {
        comm = l->published(l->ctx);
        st = l->state(l->ctx, comm != NULL ? comm : parent);
        if (st == 0 && (comm != NULL || !child))
            return 0;
        if (st < 0) {
            why = FSDP_GPU_SPLIT_FAILED;
            break;
        }
        /* the parent settled but no child yet (NCCL has not published it): keep polling */
        if (timeout_s > 0 && l->now(l->ctx) - poll.t0 > timeout_s) {
            why = FSDP_GPU_SPLIT_TIMED_OUT;
            break;
        }
        l->pause(l->ctx, &poll);
    }
    l->abort_all(l->ctx, why);
    comm = l->published(l->ctx);
    if (comm != NULL) {
        l->abort(l->ctx, comm);
        *aborted_p = comm;
    }
    return why;
}

#endif
