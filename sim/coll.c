/* The sim's group and collective slots of the ops table: the calls they deposit in the
 * rendezvous (pg.c), and how the virtual clocks move around them (fsdp_dev_coll_check has
 * checked their arguments).
 *
 * Collectives on data are stream-ordered: one starts when the last member's stream is ready
 * for it, and the caller's stream continues after its end. barrier and group_split block the
 * host instead, so it is the host clocks that meet.
 */
#include "sim.h"

static fsdp_status_t group_get(fsdp_sim_dev_t *d, fsdp_group_t *group, const char *what,
                               fsdp_sim_group_t **group_p)
{
    fsdp_sim_group_t *h = (fsdp_sim_group_t *)group;

    if (h->dev != d)
        return fsdp_sim_errorf(d, FSDP_ERR_INVALID_PARAM,
                               "%s: the group belongs to another rank; pass one of this rank's "
                               "groups",
                               what);
    *group_p = h;
    return FSDP_OK;
}

fsdp_group_t *fsdp_sim_group_world(fsdp_dev_t *dev)
{
    return &((fsdp_sim_dev_t *)dev)->world_group->super;
}

fsdp_status_t fsdp_sim_group_split(fsdp_dev_t *dev, fsdp_group_t *parent, int color, int key,
                                   fsdp_group_t **group_p)
{
    fsdp_sim_dev_t *d = (fsdp_sim_dev_t *)dev;
    fsdp_sim_call_t call = {.kind = FSDP_SIM_COLL_SPLIT, .color = color, .key = key};
    fsdp_sim_group_t *h = NULL;
    fsdp_status_t status;

    status = group_get(d, parent, "group_split", &h);
    if (status != FSDP_OK)
        return status;
    /* Like a communicator split on hardware, this blocks the host. */
    call.ready = d->host_clock;
    status = fsdp_sim_coll_run(d, h, &call);
    if (status != FSDP_OK)
        return status;
    if (call.end > d->host_clock)
        d->host_clock = call.end;
    *group_p = call.new_group != NULL ? &call.new_group->super : NULL;
    return FSDP_OK;
}

void fsdp_sim_group_destroy(fsdp_dev_t *dev, fsdp_group_t *group)
{
    fsdp_sim_dev_t *d = (fsdp_sim_dev_t *)dev;
    fsdp_sim_group_t *h = (fsdp_sim_group_t *)group;

    if (h == NULL || h == d->world_group) /* the world belongs to the backend */
        return;
    if (h->dev != d) {
        fsdp_sim_errorf(d, FSDP_ERR_INVALID_PARAM,
                        "group_destroy: group %s belongs to another rank", h->super.name);
        return;
    }
    fsdp_sim_group_release(h);
}

/* The group and stream of a data collective, whose arguments fsdp_dev_coll_check has checked
 * (backend.h); on success the call is ready to deposit. */
static fsdp_status_t coll_prepare(fsdp_sim_dev_t *d, fsdp_group_t *group, fsdp_stream_t *stream,
                                  fsdp_sim_call_t *call, fsdp_sim_group_t **group_p,
                                  fsdp_sim_stream_t **stream_p)
{
    fsdp_sim_group_t *h = NULL;
    fsdp_status_t status;

    status = group_get(d, group, fsdp_sim_coll_name(call->kind), &h);
    if (status != FSDP_OK)
        return status;
    status = fsdp_sim_stream_get(d, stream, stream_p);
    if (status != FSDP_OK)
        return status;
    call->ready = fsdp_sim_stream_ready(d, *stream_p);
    *group_p = h;
    return FSDP_OK;
}

/* Runs a stream-ordered collective: the stream's later work starts after it ends. Launching
 * it costs the host what a kernel launch costs; the rank's thread may block in the rendezvous,
 * its virtual host clock does not. */
static fsdp_status_t coll_stream(fsdp_dev_t *dev, fsdp_group_t *group, fsdp_stream_t *stream,
                                 fsdp_sim_call_t *call)
{
    fsdp_sim_dev_t *d = (fsdp_sim_dev_t *)dev;
    fsdp_sim_group_t *h = NULL;
    fsdp_sim_stream_t *s = NULL;
    fsdp_status_t status;
    double host, nbytes;

    status = coll_prepare(d, group, stream, call, &h, &s);
    if (status != FSDP_OK)
        return status;
    host = d->host_clock;
    fsdp_sim_host_launch(d);
    status = fsdp_sim_coll_run(d, h, call);
    if (status == FSDP_OK)
        status = fsdp_sim_time_check(d, fsdp_sim_coll_name(call->kind), call->ready, call->end);
    if (status != FSDP_OK)
        return status;
    if (call->end > s->clock)
        s->clock = call->end;
    fsdp_sim_hold_sms(d, call, h->super.size, s);
    /* as NCCL counts bytes: the full buffer of an all-gather or reduce-scatter */
    nbytes = (double)call->count * (double)fsdp_dtype_size(call->dtype);
    if (call->kind == FSDP_SIM_COLL_ALL_GATHER || call->kind == FSDP_SIM_COLL_REDUCE_SCATTER)
        nbytes *= h->super.size;
    fsdp_sim_account_coll(d, s, call->kind, call->ready, call->end, nbytes);
    /* in the trace as on a GPU: from when the stream launched it (waiting for the peers
     * included) to its end */
    if (fsdp_trace_enabled(dev))
        fsdp_sim_trace_op(d, FSDP_EV_COLLECTIVE, fsdp_sim_coll_name(call->kind), s, host,
                          call->ready, call->end, nbytes, call->count, (int)call->dtype,
                          h->super.name);
    return FSDP_OK;
}

fsdp_status_t fsdp_sim_all_gather(fsdp_dev_t *dev, fsdp_group_t *group, const void *send,
                                  void *recv, size_t count, fsdp_dtype_t dtype,
                                  fsdp_stream_t *stream)
{
    fsdp_sim_call_t call = {.kind = FSDP_SIM_COLL_ALL_GATHER, .count = count, .dtype = dtype,
                            .send = send, .recv = recv};
    return coll_stream(dev, group, stream, &call);
}

fsdp_status_t fsdp_sim_reduce_scatter(fsdp_dev_t *dev, fsdp_group_t *group, const void *send,
                                      void *recv, size_t count, fsdp_dtype_t dtype,
                                      fsdp_reduce_op_t op, fsdp_stream_t *stream)
{
    fsdp_sim_call_t call = {.kind = FSDP_SIM_COLL_REDUCE_SCATTER, .count = count,
                            .dtype = dtype, .op = op, .send = send, .recv = recv};
    return coll_stream(dev, group, stream, &call);
}

fsdp_status_t fsdp_sim_all_reduce(fsdp_dev_t *dev, fsdp_group_t *group, const void *send,
                                  void *recv, size_t count, fsdp_dtype_t dtype,
                                  fsdp_reduce_op_t op, fsdp_stream_t *stream)
{
    fsdp_sim_call_t call = {.kind = FSDP_SIM_COLL_ALL_REDUCE, .count = count, .dtype = dtype,
                            .op = op, .send = send, .recv = recv};
    return coll_stream(dev, group, stream, &call);
}

fsdp_status_t fsdp_sim_broadcast(fsdp_dev_t *dev, fsdp_group_t *group, void *buf, size_t count,
                                 fsdp_dtype_t dtype, int root, fsdp_stream_t *stream)
{
    fsdp_sim_call_t call = {.kind = FSDP_SIM_COLL_BROADCAST, .count = count, .dtype = dtype,
                            .root = root, .recv = buf};
    return coll_stream(dev, group, stream, &call);
}

fsdp_status_t fsdp_sim_barrier(fsdp_dev_t *dev, fsdp_group_t *group)
{
    fsdp_sim_dev_t *d = (fsdp_sim_dev_t *)dev;
    fsdp_sim_call_t call = {.kind = FSDP_SIM_COLL_BARRIER};
    fsdp_sim_group_t *h = NULL;
    fsdp_status_t status;

    status = group_get(d, group, "barrier", &h);
    if (status != FSDP_OK)
        return status;
    /* Host-blocking: the hosts leave together, at the latest host's time. */
    call.ready = d->host_clock;
    status = fsdp_sim_coll_run(d, h, &call);
    if (status == FSDP_OK)
        status = fsdp_sim_time_check(d, "barrier", call.ready, call.end);
    if (status != FSDP_OK)
        return status;
    if (call.end > d->host_clock)
        d->host_clock = call.end;
    if (fsdp_trace_enabled(dev))
        fsdp_sim_trace_op(d, FSDP_EV_COLLECTIVE, "barrier", NULL, call.ready, call.ready,
                          call.end, 0.0, 0, -1, h->super.name);
    return FSDP_OK;
}
