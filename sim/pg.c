/* The sim's fake process group: communicators, the rendezvous of a collective, each rank's run
 * of its function and its exit, and the detection of everything that would make a real job hang.
 *
 * A collective is a round of a communicator: every member deposits its call and the last one
 * to arrive checks that the calls match and computes the results for all of them, in group-rank
 * order (reduce.c), so nothing depends on which thread came last. One world mutex guards all
 * rendezvous state; each rank sleeps on its own condition variable and is woken by whoever ends
 * its round, so the buffers the completing thread wrote are published through the mutex.
 *
 * A round can also end in an error, on every member at once:
 *  - the calls differ (kind, count, dtype, op, root): FSDP_ERR_COLLECTIVE_MISMATCH;
 *  - a member has failed: FSDP_ERR_RANK_FAILED, as soon as both are known;
 *  - a member has finished: FSDP_ERR_COLLECTIVE_MISMATCH, since it can never arrive;
 *  - every rank still alive waits in a collective (no round can complete, or the last arrival
 *    would have completed it): a deadlock, FSDP_ERR_COLLECTIVE_MISMATCH on every waiting rank;
 *  - otherwise a member waited timeout_s wall seconds: FSDP_ERR_TIMEOUT.
 * A communicator whose round failed stays failed: its later calls return the same error at once,
 * which is how ranks that arrive after the failure learn of it.
 */
#include "sim.h"
#include "sim_kernels.h"

#include <fsdp/log.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Above this many ranks, runs of consecutive ranks in the same state are listed as one range
 * ("ranks 4-1023 finished") so a message stays readable. */
#define SIM_LIST_RANGE_MIN 32

const char *fsdp_sim_coll_name(fsdp_sim_coll_kind_t kind)
{
    switch (kind) {
    case FSDP_SIM_COLL_ALL_GATHER:
        return "all_gather";
    case FSDP_SIM_COLL_REDUCE_SCATTER:
        return "reduce_scatter";
    case FSDP_SIM_COLL_ALL_REDUCE:
        return "all_reduce";
    case FSDP_SIM_COLL_BROADCAST:
        return "broadcast";
    case FSDP_SIM_COLL_BARRIER:
        return "barrier";
    case FSDP_SIM_COLL_SPLIT:
        return "split";
    }
    return "invalid";
}

/* ---- messages -------------------------------------------------------------------------- */

static void call_describe(const fsdp_sim_call_t *c, char *buf, size_t n)
{
    const char *name = fsdp_sim_coll_name(c->kind);
    const char *dt = fsdp_dtype_name(c->dtype);

    switch (c->kind) {
    case FSDP_SIM_COLL_ALL_GATHER:
        snprintf(buf, n, "%s(count=%zu, %s)", name, c->count, dt);
        break;
    case FSDP_SIM_COLL_REDUCE_SCATTER:
    case FSDP_SIM_COLL_ALL_REDUCE:
        snprintf(buf, n, "%s(count=%zu, %s, %s)", name, c->count, dt,
                 fsdp_reduce_op_name(c->op));
        break;
    case FSDP_SIM_COLL_BROADCAST:
        snprintf(buf, n, "%s(count=%zu, %s, root=%d)", name, c->count, dt, c->root);
        break;
    case FSDP_SIM_COLL_BARRIER:
        snprintf(buf, n, "%s()", name);
        break;
    case FSDP_SIM_COLL_SPLIT:
        snprintf(buf, n, "%s(color=%d, key=%d)", name, c->color, c->key);
        break;
    }
}

/* What a rank that is not (or no longer) in a given round is doing. */
static void rank_describe(const fsdp_sim_dev_t *d, char *buf, size_t n)
{
    char call[160];

    if (d->failed) {
        snprintf(buf, n, "failed");
    } else if (d->phase == FSDP_SIM_RANK_EXITED) {
        snprintf(buf, n, "finished");
    } else if (d->phase == FSDP_SIM_RANK_BLOCKED) {
        call_describe(d->waiting, call, sizeof(call));
        snprintf(buf, n, "%s on group %s (call #%llu)", call, d->waiting_comm->name,
                 (unsigned long long)d->waiting_comm->seq + 1);
    } else {
        snprintf(buf, n, "running");
    }
}

/* A "; "-separated list of "rank R <what>" items, merging runs for large groups. */
typedef struct sim_list {
    FILE *f;
    int ranges;
    int first, last, items;
    char what[256];
} sim_list_t;

static void list_flush(sim_list_t *l)
{
    if (l->first < 0)
        return;
    if (l->first == l->last)
        fprintf(l->f, "%srank %d %s", l->items ? "; " : "", l->first, l->what);
    else
        fprintf(l->f, "%sranks %d-%d %s", l->items ? "; " : "", l->first, l->last, l->what);
    l->items++;
    l->first = -1;
}

static void list_add(sim_list_t *l, int rank, const char *what)
{
    if (l->ranges && l->first >= 0 && rank == l->last + 1 && strcmp(what, l->what) == 0) {
        l->last = rank;
        return;
    }
    list_flush(l);
    l->first = l->last = rank;
    snprintf(l->what, sizeof(l->what), "%s", what);
}

/* Opens a message; NULL when out of host memory. */
static FILE *msg_open(char **buf_p, size_t *len_p)
{
    *buf_p = NULL;
    return open_memstream(buf_p, len_p);
}

/* Closes it; never NULL. */
static char *msg_close(FILE *f, char *const *buf_p)
{
    if (f == NULL || fclose(f) != 0 || *buf_p == NULL)
        return strdup("(out of host memory describing the error)");
    return *buf_p;
}

/* "<headline> on group G (N ranks) at call #S: rank A <call>; rank B did not arrive (...)" */
static char *comm_message_locked(const fsdp_sim_comm_t *comm, const char *headline)
{
    const fsdp_sim_world_t *w = comm->world;
    sim_list_t l = {.ranges = comm->size > SIM_LIST_RANGE_MIN, .first = -1};
    char *buf;
    size_t len;

    l.f = msg_open(&buf, &len);
    if (l.f != NULL) {
        fprintf(l.f, "%s on group %s (%d ranks) at call #%llu: ", headline, comm->name,
                comm->size, (unsigned long long)comm->seq + 1);
        for (int m = 0; m < comm->nsim; m++) {
            const fsdp_sim_dev_t *d = fsdp_sim_world_dev(w, comm->ranks[comm->members[m]]);
            char what[256], state[200];
            if (comm->calls[m] != NULL) {
                call_describe(comm->calls[m], state, sizeof(state));
                snprintf(what, sizeof(what), "%s%s", d->failed ? "failed in " : "", state);
            } else {
                rank_describe(d, state, sizeof(state));
                if (d->phase == FSDP_SIM_RANK_EXITED || d->failed)
                    snprintf(what, sizeof(what), "%s", state);
                else
                    snprintf(what, sizeof(what), "did not arrive (%s)", state);
            }
            list_add(&l, d->super.rank, what);
        }
        list_flush(&l);
    }
    return msg_close(l.f, &buf);
}

/* ---- communicators --------------------------------------------------------------------- */

static void comm_free(fsdp_sim_comm_t *comm)
{
    if (comm == NULL)
        return;
    if (comm->handles != NULL) {
        for (int m = 0; m < comm->nsim; m++)
            free(comm->handles[m]);
    }
    free(comm->handles);
    free(comm->calls);
    free(comm->members);
    free(comm->ranks);
    free(comm->error);
    free(comm);
}

/* A communicator with a handle for each member, not yet linked into the world. */
static fsdp_status_t comm_create(fsdp_sim_world_t *w, const char *name, int size,
                                 const int *ranks, fsdp_sim_comm_t **comm_p)
{
    fsdp_sim_comm_t *comm;

    comm = calloc(1, sizeof(*comm));
    if (comm == NULL)
        return FSDP_ERR_NO_MEMORY;
    comm->world = w;
    comm->size = size;
    comm->failed = FSDP_OK;
    if ((size_t)snprintf(comm->name, sizeof(comm->name), "%s", name) >= sizeof(comm->name))
        memcpy(comm->name + sizeof(comm->name) - 4, "...", 4);
    comm->ranks = malloc((size_t)size * sizeof(*comm->ranks));
    comm->members = malloc((size_t)size * sizeof(*comm->members));
    if (comm->ranks == NULL || comm->members == NULL)
        goto err_free_comm;
    memcpy(comm->ranks, ranks, (size_t)size * sizeof(*comm->ranks));
    for (int g = 0; g < size; g++) {
        if (fsdp_sim_world_dev(w, ranks[g]) != NULL)
            comm->members[comm->nsim++] = g;
    }
    comm->live = comm->nsim;
    comm->handles = calloc((size_t)comm->nsim, sizeof(*comm->handles));
    comm->calls = calloc((size_t)comm->nsim, sizeof(*comm->calls));
    if (comm->handles == NULL || comm->calls == NULL)
        goto err_free_comm;
    comm->nodes = fsdp_sim_count_nodes(ranks, size, w->params.ranks_per_node);
    for (int m = 0; m < comm->nsim; m++) {
        fsdp_sim_group_t *h = calloc(1, sizeof(*h));
        int g = comm->members[m];
        if (h == NULL)
            goto err_free_comm;
        h->super.rank = g;
        h->super.size = size;
        h->super.ranks = comm->ranks;
        memcpy(h->super.name, comm->name, sizeof(h->super.name));
        h->dev = fsdp_sim_world_dev(w, ranks[g]);
        h->comm = comm;
        h->member = m;
        comm->handles[m] = h;
    }
    *comm_p = comm;
    return FSDP_OK;

err_free_comm:
    comm_free(comm);
    return FSDP_ERR_NO_MEMORY;
}

static void comm_link_locked(fsdp_sim_world_t *w, fsdp_sim_comm_t *comm)
{
    comm->next = w->comms;
    w->comms = comm;
}

static void comm_unlink_locked(fsdp_sim_world_t *w, fsdp_sim_comm_t *comm)
{
    for (fsdp_sim_comm_t **p = &w->comms; *p != NULL; p = &(*p)->next) {
        if (*p == comm) {
            *p = comm->next;
            return;
        }
    }
}

static int comm_member(const fsdp_sim_comm_t *comm, int rank)
{
    for (int g = 0; g < comm->size; g++) {
        if (comm->ranks[g] == rank)
            return 1;
    }
    return 0;
}

fsdp_status_t fsdp_sim_pg_init(fsdp_sim_world_t *w)
{
    int size = w->params.world_size;
    fsdp_sim_comm_t *comm = NULL;
    fsdp_status_t status;
    int *ranks;

    ranks = calloc((size_t)size, sizeof(*ranks));
    if (ranks == NULL)
        goto err_no_memory;
    for (int r = 0; r < size; r++)
        ranks[r] = r;
    status = comm_create(w, "world", size, ranks, &comm);
    free(ranks);
    if (status != FSDP_OK)
        goto err_no_memory;
    comm_link_locked(w, comm); /* no thread runs yet */
    for (int m = 0; m < comm->nsim; m++)
        w->devs[m].world_group = comm->handles[m];
    return FSDP_OK;

err_no_memory:
    fsdp_error("fsdp_sim_launch: out of host memory creating the world group of %d ranks", size);
    return FSDP_ERR_NO_MEMORY;
}

void fsdp_sim_pg_cleanup(fsdp_sim_world_t *w)
{
    while (w->comms != NULL) {
        fsdp_sim_comm_t *comm = w->comms;
        w->comms = comm->next;
        comm_free(comm);
    }
}

/* ---- ending rounds --------------------------------------------------------------------- */

/* Ends every deposited call of the round in progress and wakes the ranks that wait in it. */
static void comm_round_end_locked(fsdp_sim_comm_t *comm, fsdp_status_t status, double end)
{
    fsdp_sim_world_t *w = comm->world;

    for (int m = 0; m < comm->nsim; m++) {
        fsdp_sim_call_t *c = comm->calls[m];
        if (c == NULL)
            continue;
        c->done = 1;
        c->status = status;
        c->end = end;
        comm->calls[m] = NULL;
        /* The rank counts as running from now on, not from when its thread wakes up, so the
         * deadlock check never sees a rank that is about to run as stuck. */
        if (c->dev->phase == FSDP_SIM_RANK_BLOCKED) {
            c->dev->phase = FSDP_SIM_RANK_RUNNING;
            c->dev->waiting = NULL;
            c->dev->waiting_comm = NULL;
            w->n_running++;
            if (w->params.fibers)
                fsdp_sim_fiber_wake_locked(c->dev);
            else
                pthread_cond_signal(&c->dev->cond);
        }
    }
    comm->arrived = 0;
}

/* Fails the round in progress and every later call of the communicator; takes msg. */
static void comm_fail_locked(fsdp_sim_comm_t *comm, fsdp_status_t status, char *msg)
{
    if (comm->failed == FSDP_OK) {
        comm->failed = status;
        comm->error = msg;
    } else {
        free(msg);
    }
    comm_round_end_locked(comm, comm->failed, 0.0);
}

/* A round that waits for a failed or finished member can never complete: fail it now. Returns
 * 1 when it did. */
static int comm_check_members_locked(fsdp_sim_comm_t *comm)
{
    const fsdp_sim_world_t *w = comm->world;
    int failed = 0, finished = 0;
    char *msg;

    for (int m = 0; m < comm->nsim; m++) {
        const fsdp_sim_dev_t *d = fsdp_sim_world_dev(w, comm->ranks[comm->members[m]]);
        if (d->failed)
            failed = 1;
        else if (comm->calls[m] == NULL && d->phase == FSDP_SIM_RANK_EXITED)
            finished = 1;
    }
    if (!failed && !finished)
        return 0;
    msg = comm_message_locked(comm, failed ? "rank failure" : "collective mismatch");
    fsdp_error("%s", msg);
    comm_fail_locked(comm, failed ? FSDP_ERR_RANK_FAILED : FSDP_ERR_COLLECTIVE_MISMATCH, msg);
    return 1;
}

/* Called when rank d died (failed or finished): rounds in progress that need it fail. */
static void world_rank_died_locked(fsdp_sim_world_t *w, const fsdp_sim_dev_t *d)
{
    for (fsdp_sim_comm_t *comm = w->comms; comm != NULL; comm = comm->next) {
        if (comm->arrived > 0 && comm->failed == FSDP_OK && comm_member(comm, d->super.rank))
            comm_check_members_locked(comm);
    }
}

/* No rank runs: each is either gone or waits in a round that cannot complete (the last
 * arrival of a round completes it on the spot). Fail all the waiting ranks. */
static void world_deadlock_locked(fsdp_sim_world_t *w)
{
    int size = w->n_devs;
    sim_list_t l = {.ranges = size > SIM_LIST_RANGE_MIN, .first = -1};
    char *buf, *msg;
    size_t len;
    int blocked = 0;

    for (int r = 0; r < size; r++)
        blocked += w->devs[r].phase == FSDP_SIM_RANK_BLOCKED;
    if (blocked == 0)
        return;

    l.f = msg_open(&buf, &len);
    if (l.f != NULL) {
        fputs("collective deadlock, no rank can make progress: ", l.f);
        for (int r = 0; r < size; r++) {
            char what[256];
            rank_describe(&w->devs[r], what, sizeof(what));
            list_add(&l, w->devs[r].super.rank, what);
        }
        list_flush(&l);
    }
    msg = msg_close(l.f, &buf);
    fsdp_error("%s", msg);
    for (fsdp_sim_comm_t *comm = w->comms; comm != NULL; comm = comm->next) {
        if (comm->arrived > 0)
            comm_fail_locked(comm, FSDP_ERR_COLLECTIVE_MISMATCH, strdup(msg));
    }
    free(msg);
}

void fsdp_sim_comm_timeout_locked(fsdp_sim_comm_t *comm)
{
    char headline[64];
    char *msg;

    snprintf(headline, sizeof(headline), "collective timeout after %g s",
             comm->world->params.timeout_s);
    msg = comm_message_locked(comm, headline);
    fsdp_error("%s", msg);
    comm_fail_locked(comm, FSDP_ERR_TIMEOUT, msg);
}

static int rank_is_dead(const fsdp_sim_dev_t *d)
{
    return d->failed || d->phase == FSDP_SIM_RANK_EXITED;
}

void fsdp_sim_pg_rank_exit(fsdp_sim_dev_t *d, int failed)
{
    fsdp_sim_world_t *w = d->world;

    pthread_mutex_lock(&w->lock);
    if (!rank_is_dead(d))
        w->n_dead++;
    if (failed)
        d->failed = 1;
    d->phase = FSDP_SIM_RANK_EXITED;
    w->n_running--;
    world_rank_died_locked(w, d);
    if (w->n_running == 0)
        world_deadlock_locked(w);
    pthread_mutex_unlock(&w->lock);
}

void fsdp_sim_rank_body(fsdp_sim_dev_t *dev)
{
    fsdp_sim_world_t *world = dev->world;

    dev->status = world->func(&dev->super, world->arg);
    fsdp_sim_pool_destroy(dev->pool); /* the rank's workers end with it */
    dev->pool = NULL;
    fsdp_sim_pack_cache_drop(&dev->pack_cache);
    if (dev->status != FSDP_OK)
        fsdp_debug("rank %d: rank function returned %s", dev->super.rank,
                   fsdp_status_name(dev->status));
    fsdp_sim_pg_rank_exit(dev, dev->status != FSDP_OK);
}

void fsdp_sim_pg_rank_fail(fsdp_sim_dev_t *d)
{
    fsdp_sim_world_t *w = d->world;

    pthread_mutex_lock(&w->lock);
    if (!d->failed) {
        if (!rank_is_dead(d))
            w->n_dead++;
        d->failed = 1;
        fsdp_info("rank %d: marked failed", d->super.rank);
        world_rank_died_locked(w, d);
    }
    pthread_mutex_unlock(&w->lock);
}

/* ---- completing rounds ----------------------------------------------------------------- */

static int calls_match(const fsdp_sim_call_t *a, const fsdp_sim_call_t *b)
{
    if (a->kind != b->kind)
        return 0;
    switch (a->kind) {
    case FSDP_SIM_COLL_BARRIER:
    case FSDP_SIM_COLL_SPLIT:
        return 1;
    case FSDP_SIM_COLL_ALL_GATHER:
        return a->count == b->count && a->dtype == b->dtype;
    case FSDP_SIM_COLL_REDUCE_SCATTER:
    case FSDP_SIM_COLL_ALL_REDUCE:
        return a->count == b->count && a->dtype == b->dtype && a->op == b->op;
    case FSDP_SIM_COLL_BROADCAST:
        return a->count == b->count && a->dtype == b->dtype && a->root == b->root;
    }
    return 0;
}

typedef struct sim_split_item {
    int color, key, grank;
} sim_split_item_t;

static int split_item_cmp(const void *pa, const void *pb)
{
    const sim_split_item_t *a = pa, *b = pb;

    if (a->color != b->color)
        return a->color < b->color ? -1 : 1;
    if (a->key != b->key)
        return a->key < b->key ? -1 : 1;
    return (a->grank > b->grank) - (a->grank < b->grank);
}

/* The laws of the rank a symmetric split's colors may follow: what every rank would pass,
 * computed from its own rank as the simulated ones computed theirs (lib/core/groups.c): one
 * color, the node, the place in the node; under tensor parallelism (tp_size) the mesh's: the tp
 * group of consecutive ranks, the dp group of a tp index, and hybrid sharding's node's ranks of a
 * tp index. */
enum { SPLIT_ONE = 0, SPLIT_NODE, SPLIT_LOCAL, SPLIT_TP, SPLIT_DP, SPLIT_NODE_TP, SPLIT_LAWS };

typedef struct split_mesh {
    int world, per_node, tp, one; /* one: the color of SPLIT_ONE */
} split_mesh_t;

static int split_law(int law, int rank, const split_mesh_t *m)
{
    switch (law) {
    case SPLIT_NODE:
        return rank / m->per_node;
    case SPLIT_LOCAL:
        return rank % m->per_node;
    case SPLIT_TP:
        return rank / m->tp;
    case SPLIT_DP:
        return rank % m->tp;
    case SPLIT_NODE_TP:
        return rank / m->per_node * m->tp + rank % m->tp;
    }
    return m->one;
}

/* How many groups law makes of the world; each has world / that many ranks. */
static int split_groups(int law, const split_mesh_t *m)
{
    int nodes = m->world / m->per_node;

    return law == SPLIT_NODE      ? nodes
           : law == SPLIT_LOCAL   ? m->per_node
           : law == SPLIT_TP      ? m->world / m->tp
           : law == SPLIT_DP      ? m->tp
           : law == SPLIT_NODE_TP ? nodes * m->tp
                                  : 1;
}

/* The i-th rank, in rank order, of the group of color c under law (c one of its colors). */
static int split_member(int law, int c, int i, const split_mesh_t *m)
{
    switch (law) {
    case SPLIT_NODE:
        return c * m->per_node + i;
    case SPLIT_LOCAL:
        return i * m->per_node + c;
    case SPLIT_TP:
        return c * m->tp + i;
    case SPLIT_DP:
        return i * m->tp + c;
    case SPLIT_NODE_TP:
        return c / m->tp * m->per_node + i * m->tp + c % m->tp;
    }
    return i;
}

/* Laws a and b group the world alike (the same groups, whatever their colors): as many groups,
 * and each of a's within one of b's. */
static int split_laws_alike(int a, int b, const split_mesh_t *m)
{
    int ngroups = split_groups(a, m), gsize = m->world / ngroups;

    if (split_groups(b, m) != ngroups)
        return 0;
    for (int c = 0; c < ngroups; c++) {
        int cb = split_law(b, split_member(a, c, 0, m), m);
        for (int i = 1; i < gsize; i++)
            if (split_law(b, split_member(a, c, i, m), m) != cb)
                return 0;
    }
    return 1;
}

/* Symmetric ranks: a split of the world whose colors follow one law of the rank. Every rank's
 * group is then known; the groups holding a simulated rank are made, and each must look, rank
 * by rank, like every group whose ranks it stands for (checked here over the whole world, so
 * that a collective waiting for its simulated members waits for every class it holds). */
static fsdp_status_t comm_split_symmetric_locked(fsdp_sim_comm_t *parent)
{
    fsdp_sim_world_t *w = parent->world;
    const int *rep = w->params.represent;
    const split_mesh_t mesh = {w->params.world_size, w->params.ranks_per_node,
                               w->params.tp_size > 1 ? w->params.tp_size : 1,
                               parent->calls[0]->color};
    int world = mesh.world, law = -1, ngroups, gsize;
    fsdp_sim_comm_t *made = NULL, *comm;
    fsdp_status_t status = FSDP_OK;
    int keys_rank = 1, keys_one = 1, *ranks = NULL;

    if (parent->size != world) {
        fsdp_error("symmetric ranks: a split of group %s, not of the world, is not supported",
                   parent->name);
        return FSDP_ERR_UNSUPPORTED;
    }
    for (int m = 0; m < parent->nsim; m++) {
        keys_rank &= parent->calls[m]->key == parent->ranks[parent->members[m]];
        keys_one &= parent->calls[m]->key == parent->calls[0]->key;
    }
    if (!keys_rank && !keys_one) {
        fsdp_error("symmetric ranks: the keys of a split of %s are neither the rank nor one "
                   "value; run every rank",
                   parent->name);
        return FSDP_ERR_UNSUPPORTED;
    }
    /* the law the simulated ranks' colors fit; laws that group alike on this world are one */
    for (int l = 0; l < SPLIT_LAWS; l++) {
        int fits = l < SPLIT_TP || mesh.tp > 1;
        for (int m = 0; m < parent->nsim && fits; m++) {
            const fsdp_sim_call_t *c = parent->calls[m];
            int r = parent->ranks[parent->members[m]];
            fits = c->color == split_law(l, r, &mesh);
        }
        if (!fits || (law >= 0 && split_laws_alike(law, l, &mesh)))
            continue;
        if (law >= 0) {
            fsdp_error("symmetric ranks: the colors of a split of %s fit more than one law of "
                       "the rank on the simulated ranks; simulate more ranks",
                       parent->name);
            return FSDP_ERR_UNSUPPORTED;
        }
        law = l;
    }
    if (law < 0 || mesh.one < 0) {
        if (law == SPLIT_ONE && mesh.one < 0) { /* nobody joins a group */
            for (int m = 0; m < parent->nsim; m++)
                parent->calls[m]->new_group = NULL;
            parent->splits++;
            return FSDP_OK;
        }
        fsdp_error("symmetric ranks: the colors of a split of %s follow no law of the rank "
                   "(one color, the node, the rank in the node%s); run every rank",
                   parent->name, mesh.tp > 1 ? ", the tp mesh's" : "");
        return FSDP_ERR_UNSUPPORTED;
    }
    ngroups = split_groups(law, &mesh);
    gsize = world / ngroups;
    ranks = malloc((size_t)gsize * sizeof(*ranks));
    if (ranks == NULL) {
        status = FSDP_ERR_NO_MEMORY;
        goto out;
    }
    /* group color c's i-th rank, ordered by rank as the keys (the rank, or one value) say */
    for (int c = 0; c < ngroups; c++) {
        int ref = rep[split_member(law, c, 0, &mesh)], rc = split_law(law, ref, &mesh);
        for (int i = 0; i < gsize; i++) {
            int r = split_member(law, c, i, &mesh);
            /* alike rank by rank with the group of its first rank's representative, and the
             * representative of each class it holds in that group */
            if (rep[r] != rep[split_member(law, rc, i, &mesh)] ||
                split_law(law, rep[r], &mesh) != rc) {
                fsdp_error("symmetric ranks: rank %d (in group %d of a split of %s) is "
                           "represented by rank %d, whose group differs; simulate them apart",
                           r, c, parent->name, rep[r]);
                status = FSDP_ERR_UNSUPPORTED;
                goto out;
            }
        }
    }
    parent->splits++;
    for (int m = 0; m < parent->nsim; m++)
        parent->calls[m]->new_group = NULL;
    for (int m = 0; m < parent->nsim; m++) {
        int r = parent->ranks[parent->members[m]], c = split_law(law, r, &mesh), k = 0;
        char name[FSDP_GROUP_NAME_SIZE];
        if (parent->calls[m]->new_group != NULL)
            continue; /* its group is made */
        for (int i = 0; i < gsize; i++)
            ranks[i] = split_member(law, c, i, &mesh);
        fsdp_group_split_name(name, parent->name, parent->splits, c);
        status = comm_create(w, name, gsize, ranks, &comm);
        if (status != FSDP_OK)
            goto out;
        comm->next = made;
        made = comm;
        for (int j = m; j < parent->nsim; j++) {
            int rj = parent->ranks[parent->members[j]];
            if (split_law(law, rj, &mesh) == c)
                parent->calls[j]->new_group = comm->handles[k++];
        }
    }
    while (made != NULL) {
        comm = made;
        made = made->next;
        comm_link_locked(w, comm);
    }
out:
    while (made != NULL) {
        comm = made;
        made = made->next;
        comm_free(comm);
    }
    free(ranks);
    return status;
}

/* Makes the new communicators of a split round and hands each member its handle. All of them
 * or none: out of memory fails the round on every member. */
static fsdp_status_t comm_split_locked(fsdp_sim_comm_t *parent)
{
    fsdp_sim_world_t *w = parent->world;
    int n = parent->size, n_items = 0;
    fsdp_sim_comm_t *made = NULL, *comm;
    sim_split_item_t *items;
    fsdp_status_t status = FSDP_OK;
    int *ranks;

    items = malloc((size_t)n * sizeof(*items));
    ranks = malloc((size_t)n * sizeof(*ranks));
    if (items == NULL || ranks == NULL) {
        status = FSDP_ERR_NO_MEMORY;
        goto out;
    }
    if (w->slot != NULL) {
        status = comm_split_symmetric_locked(parent);
        goto out;
    }
    for (int g = 0; g < n; g++) {
        parent->calls[g]->new_group = NULL;
        if (parent->calls[g]->color >= 0) {
            items[n_items].color = parent->calls[g]->color;
            items[n_items].key = parent->calls[g]->key;
            items[n_items].grank = g;
            n_items++;
        }
    }
    /* Members of a color are ordered by (key, rank in the parent), as MPI_Comm_split does. */
    qsort(items, (size_t)n_items, sizeof(*items), split_item_cmp);
    parent->splits++;
    for (int i = 0, j; i < n_items; i = j) {
        char name[FSDP_GROUP_NAME_SIZE];
        for (j = i; j < n_items && items[j].color == items[i].color; j++)
            ranks[j - i] = parent->ranks[items[j].grank];
        fsdp_group_split_name(name, parent->name, parent->splits, items[i].color);
        status = comm_create(w, name, j - i, ranks, &comm);
        if (status != FSDP_OK)
            goto out;
        comm->next = made;
        made = comm;
        for (int k = i; k < j; k++)
            parent->calls[items[k].grank]->new_group = comm->handles[k - i];
    }
    while (made != NULL) {
        comm = made;
        made = made->next;
        comm_link_locked(w, comm);
    }

out:
    while (made != NULL) {
        comm = made;
        made = made->next;
        comm_free(comm);
    }
    free(ranks);
    free(items);
    return status;
}

/* The last member arrived: check, compute, and wake everybody. */
static void comm_complete_locked(fsdp_sim_comm_t *comm)
{
    fsdp_sim_call_t *first = comm->calls[0];
    fsdp_sim_op_t op = {.kind = FSDP_SIM_OP_COLLECTIVE, .coll = first->kind, .comm = comm};
    double start = first->ready;
    fsdp_status_t status;
    char *msg;

    for (int g = 1; g < comm->nsim; g++) {
        if (!calls_match(first, comm->calls[g])) {
            msg = comm_message_locked(comm, "collective mismatch");
            fsdp_error("%s", msg);
            comm_fail_locked(comm, FSDP_ERR_COLLECTIVE_MISMATCH, msg);
            return;
        }
        if (comm->calls[g]->ready > start)
            start = comm->calls[g]->ready;
    }
    if (first->kind == FSDP_SIM_COLL_SPLIT) {
        status = comm_split_locked(comm);
        if (status != FSDP_OK) {
            msg = comm_message_locked(comm, status == FSDP_ERR_NO_MEMORY
                                                ? "out of host memory splitting"
                                                : "a split symmetric ranks cannot follow");
            fsdp_error("%s", msg);
            comm_fail_locked(comm, status, msg);
            return;
        }
    } else if (first->kind != FSDP_SIM_COLL_BARRIER && !fsdp_sim_is_shape(first->dev)) {
        fsdp_sim_coll_compute(comm->calls, comm->size);
    }
    op.bytes = first->count * fsdp_dtype_size(first->dtype);
    /* NCCL runs a communicator's collectives one at a time, in call order, whatever streams
     * they were issued on (PyTorch: "contend for the same per-device NCCL stream"). */
    if (first->kind != FSDP_SIM_COLL_SPLIT && comm->busy_until > start)
        start = comm->busy_until;
    for (int m = 0; m < comm->nsim; m++)
        comm->calls[m]->start = start;
    /* Priced from group rank 0's view, so the result does not depend on who came last. */
    comm->seq++;
    if (first->kind != FSDP_SIM_COLL_SPLIT) {
        int sms = 0;
        comm->busy_until = start + fsdp_sim_coll_op_cost(first->dev, &op, &sms);
        for (int m = 0; m < comm->nsim; m++)
            comm->calls[m]->sms = sms;
    }
    comm_round_end_locked(comm, FSDP_OK,
                          first->kind != FSDP_SIM_COLL_SPLIT ? comm->busy_until : start);
}

/* ---- the rendezvous -------------------------------------------------------------------- */

static struct timespec deadline_after(double seconds)
{
    struct timespec ts;
    double whole;

    /* Far beyond any run, and keeps the conversion to time_t defined. */
    if (seconds > 1e9)
        seconds = 1e9;
    whole = (double)(time_t)seconds;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += (time_t)whole;
    ts.tv_nsec += (long)((seconds - whole) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

fsdp_status_t fsdp_sim_coll_run(fsdp_sim_dev_t *d, fsdp_sim_group_t *h, fsdp_sim_call_t *call)
{
    fsdp_sim_world_t *w = d->world;
    fsdp_sim_comm_t *comm = h->comm;
    fsdp_status_t status;
    struct timespec deadline;

    call->dev = d;
    call->grank = h->super.rank;
    call->done = 0;
    pthread_mutex_lock(&w->lock);
    if (comm->failed != FSDP_OK) {
        status = comm->failed;
        goto out;
    }
    call->member = h->member;
    comm->calls[call->member] = call;
    comm->arrived++;
    if (w->n_dead > 0 && comm_check_members_locked(comm)) {
        /* failed on arrival */
    } else if (comm->arrived == comm->nsim) {
        comm_complete_locked(comm);
    } else {
        d->phase = FSDP_SIM_RANK_BLOCKED;
        d->waiting = call;
        d->waiting_comm = comm;
        w->n_running--;
        if (w->n_running == 0)
            world_deadlock_locked(w);
        deadline = deadline_after(w->params.timeout_s);
        if (w->params.fibers) {
            /* the fiber gives its worker up; the launcher fires its timeout */
            d->deadline = deadline;
            fsdp_sim_fiber_wait_locked(d, call);
        }
        while (!call->done) {
            int rc = pthread_cond_timedwait(&d->cond, &w->lock, &deadline);
            if (rc == ETIMEDOUT && !call->done)
                fsdp_sim_comm_timeout_locked(comm);
        }
    }
    status = call->status;
out:
    if (status != FSDP_OK)
        fsdp_sim_set_error(d, comm->error != NULL ? comm->error : fsdp_status_string(status));
    pthread_mutex_unlock(&w->lock);
    return status;
}

void fsdp_sim_group_release(fsdp_sim_group_t *h)
{
    fsdp_sim_comm_t *comm = h->comm;
    fsdp_sim_world_t *w = comm->world;

    pthread_mutex_lock(&w->lock);
    comm->handles[h->member] = NULL;
    if (--comm->live == 0)
        comm_unlink_locked(w, comm);
    else
        comm = NULL;
    pthread_mutex_unlock(&w->lock);
    free(h);
    comm_free(comm);
}
