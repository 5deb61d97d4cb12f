/* Groups and collectives over NCCL.
 *
 * Communicators are created non-blocking: ncclCommInitRankConfig, ncclCommSplit and even a
 * collective's enqueue may return ncclInProgress, and comm_ready() polls the communicator until
 * it settles or the timeout passes. Each collective is then handed to the watchdog (watch.c),
 * which bounds every later wait on it.
 */
#include "config.h"

#include "gpu_trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Polls a communicator until its pending operation settles: an enqueue (FSDP_GPU_POLL_ENQUEUE,
 * microseconds: yields), or init, split, finalize (FSDP_GPU_POLL_COMM: growing naps). */
static fsdp_status_t comm_ready(fsdp_gpu_dev_t *gdev, ncclComm_t comm, fsdp_gpu_poll_kind_t kind,
                                const char *what)
{
    double t0 = fsdp_gpu_now();
    fsdp_gpu_poll_t poll;
    fsdp_status_t status;
    ncclResult_t st;

    fsdp_gpu_poll_begin(&poll, kind);
    for (;;) {
        status = FSDP_NCCL_CALL(ncclCommGetAsyncError(comm, &st));
        if (status != FSDP_OK)
            return status;
        if (st == ncclSuccess)
            return FSDP_OK;
        if (st != ncclInProgress)
            return fsdp_gpu_nccl_status(st, what, __FILE__, __LINE__, __func__);
        if (fsdp_gpu_timed_out(gdev, t0)) {
            fsdp_error("rank %d: %s did not complete within %g s (collective timeout)",
                       gdev->super.rank, what, gdev->timeout_s);
            return FSDP_ERR_TIMEOUT;
        }
        fsdp_gpu_pause(&poll);
    }
}

static void comm_config(ncclConfig_t *config_p)
{
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    *config_p = config;
}

static void group_link(fsdp_gpu_dev_t *gdev, fsdp_gpu_group_t *g)
{
    g->next = gdev->groups;
    gdev->groups = g;
}

static void group_unlink(fsdp_gpu_dev_t *gdev, fsdp_gpu_group_t *g)
{
    for (fsdp_gpu_group_t **pp = &gdev->groups; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == g) {
            *pp = g->next;
            return;
        }
    }
}

/* Finalizes (or aborts) a group's communicator and frees the group. */
static void group_free(fsdp_gpu_dev_t *gdev, fsdp_gpu_group_t *g, int abort)
{
    char what[FSDP_GPU_WHAT_SIZE];

    if (g->comm != NULL) {
        snprintf(what, sizeof(what), "ncclCommFinalize(group %s)", g->super.name);
        if (abort || FSDP_NCCL_CALL(ncclCommFinalize(g->comm)) != FSDP_OK ||
            comm_ready(gdev, g->comm, FSDP_GPU_POLL_COMM, what) != FSDP_OK)
            (void)FSDP_NCCL_CALL(ncclCommAbort(g->comm));
        else
            (void)FSDP_NCCL_CALL(ncclCommDestroy(g->comm));
        g->comm = NULL;
    }
    free(g->ranks);
    free(g);
}

fsdp_status_t fsdp_gpu_world_create(fsdp_gpu_dev_t *gdev, const ncclUniqueId *id)
{
    int rank = gdev->super.rank, size = gdev->super.world_size;
    fsdp_gpu_group_t *g;
    ncclConfig_t config;
    fsdp_status_t status;

    g = calloc(1, sizeof(*g));
    if (g == NULL)
        return FSDP_ERR_NO_MEMORY;
    g->ranks = malloc((size_t)size * sizeof(*g->ranks));
    if (g->ranks == NULL) {
        free(g);
        return FSDP_ERR_NO_MEMORY;
    }
    for (int r = 0; r < size; r++)
        g->ranks[r] = r;
    g->dev = gdev;
    g->super.rank = rank;
    g->super.size = size;
    g->super.ranks = g->ranks;
    snprintf(g->super.name, sizeof(g->super.name), "world");

    comm_config(&config);
    status = FSDP_NCCL_CALL(ncclCommInitRankConfig(&g->comm, size, *id, rank, &config));
    /* NCCL sets the handle before it returns, even non-blocking (the split's child is the one
     * published later): a success without one is refused rather than used. */
    if (status == FSDP_OK && g->comm == NULL) {
        fsdp_error("rank %d: ncclCommInitRankConfig(world) succeeded without a communicator",
                   rank);
        status = FSDP_ERR_BACKEND;
    }
    if (status == FSDP_OK)
        status = comm_ready(gdev, g->comm, FSDP_GPU_POLL_COMM, "ncclCommInitRankConfig(world)");
    if (status != FSDP_OK) {
        if (g->comm != NULL)
            (void)FSDP_NCCL_CALL(ncclCommAbort(g->comm));
        free(g->ranks);
        free(g);
        return status;
    }
    group_link(gdev, g);
    gdev->world = g;
    return FSDP_OK;
}

void fsdp_gpu_groups_destroy(fsdp_gpu_dev_t *gdev, int abort)
{
    fsdp_gpu_group_t *g;

    /* The list is newest first: a split goes before the group it was made from, the world
     * last. */
    while ((g = gdev->groups) != NULL) {
        gdev->groups = g->next;
        group_free(gdev, g, abort);
    }
    gdev->world = NULL;
}

/* ---- collectives ---- */

static int nccl_dtype(fsdp_dtype_t dtype, ncclDataType_t *type_p)
{
    switch (dtype) {
    case FSDP_DTYPE_F32:
        *type_p = ncclFloat32;
        return 1;
    case FSDP_DTYPE_BF16:
        *type_p = ncclBfloat16;
        return 1;
    case FSDP_DTYPE_F16:
        *type_p = ncclFloat16;
        return 1;
    case FSDP_DTYPE_I32:
        *type_p = ncclInt32;
        return 1;
    default:
        return 0;
    }
}

static int nccl_op(fsdp_reduce_op_t op, ncclRedOp_t *op_p)
{
    switch (op) {
    case FSDP_REDUCE_SUM:
        *op_p = ncclSum;
        return 1;
    case FSDP_REDUCE_AVG:
        *op_p = ncclAvg;
        return 1;
    case FSDP_REDUCE_MAX:
        *op_p = ncclMax;
        return 1;
    default:
        return 0;
    }
}

/* Checks that the communicators still stand and makes room in the watch ring (the arguments
 * were checked by fsdp_dev_coll_check). */
static fsdp_status_t coll_begin(fsdp_gpu_dev_t *gdev, fsdp_group_t *group, const char *op,
                                fsdp_gpu_group_t **g_p)
{
    fsdp_gpu_group_t *g = (fsdp_gpu_group_t *)group;
    fsdp_gpu_poll_t poll;
    fsdp_status_t status;

    if (gdev->failed != FSDP_OK || g->comm == NULL) {
        fsdp_error("rank %d: %s on group %s: the communicators were aborted after an earlier "
                   "failure (%s)",
                   gdev->super.rank, op, g->super.name,
                   fsdp_status_name(gdev->failed != FSDP_OK ? gdev->failed : FSDP_ERR_BACKEND));
        return gdev->failed != FSDP_OK ? gdev->failed : FSDP_ERR_BACKEND;
    }
    status = FSDP_CUDA_CALL(cudaSetDevice(gdev->device));
    if (status != FSDP_OK)
        return status;
    fsdp_gpu_poll_begin(&poll, FSDP_GPU_POLL_WAIT);
    for (;;) {
        status = fsdp_gpu_watchdog(gdev);
        if (status != FSDP_OK || !fsdp_gpu_ring_full(&gdev->ring))
            break;
        fsdp_gpu_pause(&poll);
    }
    *g_p = g;
    return status;
}

/* NCCL runs the collectives of one communicator in the order they were enqueued, but promises
 * nothing across communicators: hybrid sharding's reduce-scatter (shard group, post-backward
 * stream) and all-reduce (replicate group, all-reduce stream) may then run at once, and where
 * two ranks start them in different orders, or the device cannot hold both kernels, each waits
 * for a peer stuck in the other (NCCL issues 195 and 574). So before it is enqueued, a
 * collective's stream waits for the collective enqueued just before it when that one belongs
 * to another communicator: every rank's collectives run in their host order, across its
 * communicators, as NCCL_LAUNCH_ORDER_IMPLICIT would make them, without the environment. */
static fsdp_status_t coll_order(fsdp_gpu_dev_t *gdev, const fsdp_gpu_group_t *g, cudaStream_t s)
{
    unsigned slot;

    if (!fsdp_gpu_ring_newest(&gdev->ring, &slot) || gdev->watch[slot].group == g)
        return FSDP_OK; /* none in flight, or NCCL orders them */
    return FSDP_CUDA_CALL(cudaStreamWaitEvent(s, gdev->watch[slot].done, cudaEventWaitDefault));
}

/* After the enqueue: converts its result, waits out ncclInProgress, and watches the collective
 * (waiting for it too when collectives are blocking). */
static fsdp_status_t coll_end(fsdp_gpu_dev_t *gdev, fsdp_gpu_group_t *g, cudaStream_t stream,
                              ncclResult_t res, const char *call, const char *what)
{
    fsdp_status_t status;

    status = fsdp_gpu_nccl_status(res, call, __FILE__, __LINE__, __func__);
    if (status == FSDP_OK && res == ncclInProgress)
        status = comm_ready(gdev, g->comm, FSDP_GPU_POLL_ENQUEUE, what);
    if (status != FSDP_OK) {
        fsdp_error("rank %d: %s failed: aborting the communicators", gdev->super.rank, what);
        fsdp_gpu_fail_all(gdev, status);
        return status;
    }
    return fsdp_gpu_watch_add(gdev, g, stream, what);
}

/* "all_gather(count 4096, bf16) on group world" */
static void coll_what(char *buf, size_t size, const char *op, size_t count, fsdp_dtype_t dtype,
                      const fsdp_gpu_group_t *g)
{
    snprintf(buf, size, "%s(count %zu, %s) on group %s", op, count, fsdp_dtype_name(dtype),
             g->super.name);
}

/* The collective's trace event (status: the enqueue's), as the simulator emits it. */
static fsdp_status_t coll_traced(fsdp_gpu_dev_t *gdev, fsdp_gpu_group_t *g,
                                 fsdp_gpu_stream_t *s, const char *name, size_t count,
                                 fsdp_dtype_t dtype, double host, fsdp_gpu_timer_t *timer,
                                 fsdp_status_t status)
{
    fsdp_trace_op_t op = {.kind = FSDP_EV_COLLECTIVE, .name = name, .stream = s->super.name,
                          .host = host, .start = host, .end = host, .count = count,
                          .dtype = (int)dtype, .group = g->super.name};

    if (status != FSDP_OK || !fsdp_trace_enabled(&gdev->super)) {
        fsdp_gpu_trace_cancel(timer);
        return status;
    }
    op.bytes = fsdp_trace_coll_bytes(name, count, dtype, g->super.size);
    fsdp_gpu_trace_end(gdev, timer, s->cu, &op);
    return FSDP_OK;
}

/* The stream-ordered collectives, as sim/coll.c has them: each ops slot fills in a call, and
 * coll_stream checks it, enqueues it, watches it and traces it. */
typedef enum {
    COLL_ALL_GATHER,
    COLL_REDUCE_SCATTER,
    COLL_ALL_REDUCE,
    COLL_BROADCAST,
} coll_kind_t;

typedef struct coll_call {
    coll_kind_t kind;
    const void *send;
    void *recv; /* broadcast: send and recv are its one buffer */
    size_t count;
    fsdp_dtype_t dtype;
    fsdp_reduce_op_t op; /* reduce_scatter, all_reduce */
    int root;            /* broadcast */
} coll_call_t;

/* Each kind's name (in messages and the trace) and its NCCL call's; `reduces`: it takes an op. */
static const struct {
    const char *name, *nccl;
    int reduces;
} coll_kinds[] = {
    [COLL_ALL_GATHER] = {"all_gather", "ncclAllGather", 0},
    [COLL_REDUCE_SCATTER] = {"reduce_scatter", "ncclReduceScatter", 1},
    [COLL_ALL_REDUCE] = {"all_reduce", "ncclAllReduce", 1},
    [COLL_BROADCAST] = {"broadcast", "ncclBroadcast", 0},
};

static ncclResult_t coll_enqueue(const coll_call_t *c, ncclDataType_t type, ncclRedOp_t op,
                                 ncclComm_t comm, cudaStream_t s)
{
    switch (c->kind) {
    case COLL_ALL_GATHER:
        return ncclAllGather(c->send, c->recv, c->count, type, comm, s);
    case COLL_REDUCE_SCATTER:
        return ncclReduceScatter(c->send, c->recv, c->count, type, op, comm, s);
    case COLL_ALL_REDUCE:
        return ncclAllReduce(c->send, c->recv, c->count, type, op, comm, s);
    case COLL_BROADCAST:
        return ncclBroadcast(c->send, c->recv, c->count, type, c->root, comm, s);
    }
    return ncclInvalidArgument;
}

/* Runs a collective on a stream, its arguments checked by fsdp_dev_coll_check before the
 * backend is called: a count of 0 returns (traced); then it is ordered after another communicator's
 * collective (coll_order), timed on its stream, enqueued, watched (coll_end) and traced. */
static fsdp_status_t coll_stream(fsdp_dev_t *dev, fsdp_group_t *group, fsdp_stream_t *stream,
                                 const coll_call_t *c)
{
    fsdp_gpu_dev_t *gdev = fsdp_gpu_dev_of(dev);
    fsdp_gpu_stream_t *gs = fsdp_gpu_stream_of(gdev, stream);
    cudaStream_t s = gs->cu;
    double host = fsdp_gpu_now();
    const char *name = coll_kinds[c->kind].name;
    fsdp_gpu_timer_t *timer;
    ncclResult_t res;
    fsdp_gpu_group_t *g;
    ncclDataType_t type;
    ncclRedOp_t nop = ncclSum;
    fsdp_status_t status;
    char what[FSDP_GPU_WHAT_SIZE];

    status = coll_begin(gdev, group, name, &g);
    if (status != FSDP_OK)
        return status;
    /* the op, the root, the dtype and the buffers were checked by fsdp_dev_coll_check */
    if (coll_kinds[c->kind].reduces && !nccl_op(c->op, &nop))
        return FSDP_ERR_INTERNAL;
    if (c->count == 0)
        return coll_traced(gdev, g, gs, name, 0, c->dtype, host, NULL, FSDP_OK);
    if (!nccl_dtype(c->dtype, &type))
        return FSDP_ERR_INTERNAL;
    coll_what(what, sizeof(what), name, c->count, c->dtype, g);
    status = coll_order(gdev, g, s);
    if (status != FSDP_OK)
        return status;
    timer = fsdp_gpu_trace_begin(gdev, s, 0);
    res = coll_enqueue(c, type, nop, g->comm, s);
    status = coll_end(gdev, g, s, res, coll_kinds[c->kind].nccl, what);
    return coll_traced(gdev, g, gs, name, c->count, c->dtype, host, timer, status);
}

fsdp_status_t fsdp_gpu_all_gather(fsdp_dev_t *dev, fsdp_group_t *group, const void *send,
                                  void *recv, size_t count, fsdp_dtype_t dtype,
                                  fsdp_stream_t *stream)
{
    coll_call_t call = {.kind = COLL_ALL_GATHER, .send = send, .recv = recv, .count = count,
                        .dtype = dtype};
    return coll_stream(dev, group, stream, &call);
}

fsdp_status_t fsdp_gpu_reduce_scatter(fsdp_dev_t *dev, fsdp_group_t *group, const void *send,
                                      void *recv, size_t count, fsdp_dtype_t dtype,
                                      fsdp_reduce_op_t op, fsdp_stream_t *stream)
{
    coll_call_t call = {.kind = COLL_REDUCE_SCATTER, .send = send, .recv = recv, .count = count,
                        .dtype = dtype, .op = op};
    return coll_stream(dev, group, stream, &call);
}

fsdp_status_t fsdp_gpu_all_reduce(fsdp_dev_t *dev, fsdp_group_t *group, const void *send,
                                  void *recv, size_t count, fsdp_dtype_t dtype, fsdp_reduce_op_t op,
                                  fsdp_stream_t *stream)
{
    coll_call_t call = {.kind = COLL_ALL_REDUCE, .send = send, .recv = recv, .count = count,
                        .dtype = dtype, .op = op};
    return coll_stream(dev, group, stream, &call);
}

fsdp_status_t fsdp_gpu_broadcast(fsdp_dev_t *dev, fsdp_group_t *group, void *buf, size_t count,
                                 fsdp_dtype_t dtype, int root, fsdp_stream_t *stream)
{
    coll_call_t call = {.kind = COLL_BROADCAST, .send = buf, .recv = buf, .count = count,
                        .dtype = dtype, .root = root};
    return coll_stream(dev, group, stream, &call);
}

/* A one-element all-reduce on the internal stream, waited for by the host. */
fsdp_status_t fsdp_gpu_barrier(fsdp_dev_t *dev, fsdp_group_t *group)
{
    fsdp_gpu_dev_t *gdev = fsdp_gpu_dev_of(dev);
    fsdp_gpu_group_t *g;
    fsdp_status_t status;
    double host = fsdp_gpu_now();
    char what[FSDP_GPU_WHAT_SIZE];

    status = coll_begin(gdev, group, "barrier", &g);
    if (status != FSDP_OK)
        return status;
    snprintf(what, sizeof(what), "barrier on group %s", g->super.name);
    status = coll_order(gdev, g, gdev->aux);
    if (status != FSDP_OK)
        return status;
    status =
        coll_end(gdev, g, gdev->aux,
                 ncclAllReduce(gdev->dbuf, gdev->dbuf, 1, ncclInt32, ncclSum, g->comm, gdev->aux),
                 "ncclAllReduce(barrier)", what);
    if (status != FSDP_OK)
        return status;
    status = fsdp_gpu_host_wait(gdev, NULL, gdev->aux, what);
    if (status == FSDP_OK && fsdp_trace_enabled(dev))
        fsdp_gpu_trace_host(gdev, FSDP_EV_COLLECTIVE, "barrier", NULL, host, g->super.name);
    return status;
}

/* ---- groups ---- */

fsdp_group_t *fsdp_gpu_group_world(fsdp_dev_t *dev)
{
    fsdp_gpu_dev_t *gdev = fsdp_gpu_dev_of(dev);
    return gdev->world != NULL ? &gdev->world->super : NULL;
}

/* Every member's (color, key), gathered over the parent on the internal stream. */
static fsdp_status_t split_exchange(fsdp_gpu_dev_t *gdev, fsdp_gpu_group_t *parent, int color,
                                    int key, int *all)
{
    int mine[2] = {color, key};
    size_t n = (size_t)parent->super.size;
    fsdp_status_t status;
    char what[FSDP_GPU_WHAT_SIZE];

    snprintf(what, sizeof(what), "group_split (color/key exchange) on group %s",
             parent->super.name);
    status = FSDP_CUDA_CALL(
        cudaMemcpyAsync(gdev->dbuf, mine, sizeof(mine), cudaMemcpyHostToDevice, gdev->aux));
    if (status == FSDP_OK)
        status = coll_order(gdev, parent, gdev->aux);
    if (status != FSDP_OK)
        return status;
    status =
        coll_end(gdev, parent, gdev->aux,
                 ncclAllGather(gdev->dbuf, gdev->dbuf + 2, 2, ncclInt32, parent->comm, gdev->aux),
                 "ncclAllGather(split)", what);
    if (status != FSDP_OK)
        return status;
    /* `all` is pageable: a copy into it returns only once done, so it would block the host on
     * the all-gather beyond the timeout. The gather is waited for first, by polling. */
    status = fsdp_gpu_host_wait(gdev, NULL, gdev->aux, what);
    if (status != FSDP_OK)
        return status;
    status = FSDP_CUDA_CALL(cudaMemcpyAsync(all, gdev->dbuf + 2, 2 * n * sizeof(int),
                                            cudaMemcpyDeviceToHost, gdev->aux));
    if (status != FSDP_OK)
        return status;
    return fsdp_gpu_host_wait(gdev, NULL, gdev->aux, what);
}

/* The split layer of poll.h over NCCL. */
typedef struct split_ctx {
    fsdp_gpu_dev_t *gdev;
    ncclComm_t *child; /* written by NCCL's thread */
    ncclResult_t res;  /* why the state failed */
} split_ctx_t;

static int split_state(void *ctx, void *comm)
{
    split_ctx_t *c = ctx;
    ncclResult_t res, st = ncclSuccess;

    res = ncclCommGetAsyncError((ncclComm_t)comm, &st);
    if (res != ncclSuccess) {
        c->res = res;
        return -1;
    }
    if (st == ncclInProgress)
        return 1;
    c->res = st;
    return st == ncclSuccess ? 0 : -1;
}

static void *split_published(void *ctx)
{
    split_ctx_t *c = ctx;
    return __atomic_load_n(c->child, __ATOMIC_ACQUIRE);
}

static void split_abort_all(void *ctx, int why)
{
    split_ctx_t *c = ctx;
    fsdp_gpu_fail_all(
        c->gdev, why == FSDP_GPU_SPLIT_TIMED_OUT
                     ? FSDP_ERR_TIMEOUT
                     : fsdp_gpu_nccl_status(c->res, "ncclCommSplit", __FILE__, __LINE__, __func__));
}

static void split_abort(void *ctx, void *comm)
{
    (void)ctx;
    (void)FSDP_NCCL_CALL(ncclCommAbort((ncclComm_t)comm));
}

static double split_now(void *ctx)
{
    (void)ctx;
    return fsdp_gpu_now();
}

static void split_pause(void *ctx, fsdp_gpu_poll_t *p)
{
    (void)ctx;
    fsdp_gpu_pause(p);
}

/* Waits for ncclCommSplit to settle (poll.h); on a failure or the timeout every communicator
 * is aborted, the child too even when NCCL publishes it only after the split was seen pending.
 * *unseen_p: 1 when a child was due but never seen, so NCCL's thread may still write *comm_p. */
static fsdp_status_t split_settle(fsdp_gpu_dev_t *gdev, fsdp_gpu_group_t *p, ncclComm_t *comm_p,
                                  int child, const char *what, int *unseen_p)
{
    split_ctx_t ctx = {gdev, comm_p, ncclSuccess};
    const fsdp_gpu_split_layer_t layer = {
        split_state, split_published, split_abort_all, split_abort, split_now, split_pause, &ctx};
    void *aborted = NULL;
    int rc;

    rc = fsdp_gpu_split_settle(&layer, p->comm, child, gdev->timeout_s, &aborted);
    *unseen_p = rc != 0 && child && aborted == NULL;
    if (rc == 0)
        return FSDP_OK;
    if (rc == FSDP_GPU_SPLIT_TIMED_OUT)
        fsdp_error("rank %d: %s did not complete within %g s (collective timeout)%s",
                   gdev->super.rank, what, gdev->timeout_s,
                   aborted != NULL ? ": the new communicator is aborted too" : "");
    else
        fsdp_error("rank %d: %s failed", gdev->super.rank, what);
    return gdev->failed != FSDP_OK ? gdev->failed : FSDP_ERR_BACKEND;
}

fsdp_status_t fsdp_gpu_group_split(fsdp_dev_t *dev, fsdp_group_t *parent, int color, int key,
                                   fsdp_group_t **group_p)
{
    fsdp_gpu_dev_t *gdev = fsdp_gpu_dev_of(dev);
    fsdp_gpu_group_t *p, *g = NULL;
    int *all = NULL, n, members = 0, me = -1, nccl_rank = -1, nccl_count = -1, unseen = 0;
    ncclComm_t comm = NULL, *slot = NULL; /* slot: where NCCL's thread publishes the child */
    ncclConfig_t config;
    fsdp_status_t status;
    ncclResult_t res;
    char what[FSDP_GPU_WHAT_SIZE];

    status = coll_begin(gdev, parent, "group_split", &p);
    if (status != FSDP_OK)
        return status;
    n = p->super.size;
    all = malloc(2 * (size_t)n * sizeof(*all));
    if (all == NULL)
        return FSDP_ERR_NO_MEMORY;
    p->splits++; /* every member counts the round, whatever its color or outcome */
    status = split_exchange(gdev, p, color < 0 ? -1 : color, key, all);
    if (status != FSDP_OK)
        goto out;

    snprintf(what, sizeof(what), "ncclCommSplit(group %s, color %d)", p->super.name, color);
    comm_config(&config);
    slot = calloc(1, sizeof(*slot));
    if (slot == NULL) {
        status = FSDP_ERR_NO_MEMORY;
        goto out;
    }
    res = ncclCommSplit(p->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, slot, &config);
    status = fsdp_gpu_nccl_status(res, what, __FILE__, __LINE__, __func__);
    /* Settled even when the call said ncclSuccess: on a non-blocking parent NCCL may publish the
     * child later (seen with NCCL 2.28.3, a world of one: ncclSuccess, *slot still NULL). */
    if (status == FSDP_OK)
        status = split_settle(gdev, p, slot, color >= 0, what, &unseen);
    else if (status != FSDP_OK)
        fsdp_gpu_fail_all(gdev, status);
    if (status != FSDP_OK) {
        if (unseen)
            slot = NULL; /* left to NCCL's thread, which may still publish into it */
        goto out;        /* the child, if seen, was aborted with every other communicator */
    }
    comm = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (color < 0) {
        *group_p = NULL;
        goto out;
    }

    g = calloc(1, sizeof(*g));
    if (g != NULL)
        g->ranks = malloc((size_t)n * sizeof(*g->ranks));
    if (g == NULL || g->ranks == NULL) {
        status = FSDP_ERR_NO_MEMORY;
        goto out;
    }
    /* Members ordered by (key, rank in the parent), as NCCL and the sim order them. Insertion
     * keeps it simple: groups are small and splits rare. */
    for (int j = 0; j < n; j++) {
        int pos;
        if (all[2 * j] != color)
            continue;
        for (pos = members; pos > 0 && all[2 * g->ranks[pos - 1] + 1] > all[2 * j + 1]; pos--)
            g->ranks[pos] = g->ranks[pos - 1];
        g->ranks[pos] = j; /* parent rank for now */
        members++;
    }
    for (int i = 0; i < members; i++) {
        if (g->ranks[i] == p->super.rank)
            me = i;
        g->ranks[i] = p->super.ranks[g->ranks[i]];
    }
    status = FSDP_NCCL_CALL(ncclCommUserRank(comm, &nccl_rank));
    if (status == FSDP_OK)
        status = FSDP_NCCL_CALL(ncclCommCount(comm, &nccl_count));
    if (status != FSDP_OK)
        goto out;
    if (me < 0 || nccl_rank != me || nccl_count != members) {
        fsdp_error("rank %d: %s: NCCL made rank %d of %d, the exchange says %d of %d", dev->rank,
                   what, nccl_rank, nccl_count, me, members);
        status = FSDP_ERR_INTERNAL;
        goto out;
    }
    g->dev = gdev;
    g->comm = comm;
    comm = NULL;
    g->super.rank = me;
    g->super.size = members;
    g->super.ranks = g->ranks;
    fsdp_group_split_name(g->super.name, p->super.name, p->splits, color);
    group_link(gdev, g);
    *group_p = &g->super;
    g = NULL;

out:
    if (comm != NULL)
        (void)FSDP_NCCL_CALL(ncclCommAbort(comm));
    free(slot);
    if (g != NULL) {
        free(g->ranks);
        free(g);
    }
    free(all);
    return status;
}

void fsdp_gpu_group_destroy(fsdp_dev_t *dev, fsdp_group_t *group)
{
    fsdp_gpu_dev_t *gdev = fsdp_gpu_dev_of(dev);
    fsdp_gpu_group_t *g = (fsdp_gpu_group_t *)group;

    if (g == NULL || g == gdev->world)
        return; /* the world belongs to the backend */
    (void)FSDP_CUDA_CALL(cudaSetDevice(gdev->device));
    /* Its collectives must be done before NCCL frees the communicator. */
    (void)fsdp_gpu_watch_drain(gdev);
    group_unlink(gdev, g);
    group_free(gdev, g, gdev->failed != FSDP_OK);
}
