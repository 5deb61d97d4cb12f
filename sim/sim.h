/* The sim backend's internal types, shared by the files of sim/ (never installed).
 *
 * A launch makes one world: world_size ranks, each a thread with its own fsdp_sim_dev_t.
 * Everything that ranks share (the process group's rendezvous state, the liveness of every
 * rank) is guarded by the one world mutex; everything else in a dev is touched only by its own
 * thread.
 *
 * Time is virtual. A rank has a host clock and each stream a clock (seconds). Every op is
 * priced in cost.c, the one place a cost model plugs in: an op issued on a stream starts at
 * max(host clock + launch latency, stream clock) (the stream clock already includes the events
 * it was told to wait for) and ends cost seconds later, where a GEMM or fused attention that
 * overlaps collectives runs on the SMs they leave; issuing it costs the host the launch
 * overhead. A collective starts when the last rank of the group is ready for it and the
 * communicator's previous collective has ended. Data mode runs each op eagerly
 * on the issuing thread, so the real order of memory effects is issue order and the clocks only
 * report time.
 */
#ifndef FSDP_SIM_SIM_H
#define FSDP_SIM_SIM_H

#include <fsdp/backend.h>
#include <fsdp/sim.h>
#include <fsdp/backend/trace.h>
#include <fsdp/trace.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <time.h>

#include "base/base_hidden.h"
#include "sim_hidden.h"
#include "sim_kernels.h"

typedef struct fsdp_sim_world fsdp_sim_world_t;
typedef struct fsdp_sim_dev fsdp_sim_dev_t;
typedef struct fsdp_sim_comm fsdp_sim_comm_t;
typedef struct fsdp_sim_fiber fsdp_sim_fiber_t;
typedef struct fsdp_sim_sched fsdp_sim_sched_t;

typedef struct fsdp_sim_stream {
    fsdp_stream_t super;
    fsdp_sim_dev_t *dev; /* owner */
    double clock;        /* virtual time at which the work issued so far ends */
    struct fsdp_sim_stream *next; /* the dev's created streams */
} fsdp_sim_stream_t;

/* fsdp_event_t is opaque in backend.h; the sim's event is this struct behind it. */
typedef struct fsdp_sim_event {
    fsdp_sim_dev_t *dev; /* owner */
    int recorded;
    double time;        /* when the work before the record ends */
    uint64_t record_id; /* its last record's number on the rank (the trace's record and wait) */
} fsdp_sim_event_t;

/* A rank's handle on a communicator. The members share one fsdp_sim_comm_t. */
typedef struct fsdp_sim_group {
    fsdp_group_t super;
    fsdp_sim_dev_t *dev; /* owner */
    fsdp_sim_comm_t *comm;
    int member; /* index in comm->handles */
} fsdp_sim_group_t;

/* One rank's call of a collective, deposited (by pointer, it lives on the caller's stack) in
 * the communicator until the round completes or fails. */
typedef struct fsdp_sim_call {
    fsdp_sim_coll_kind_t kind;
    size_t count;
    fsdp_dtype_t dtype;
    fsdp_reduce_op_t op;
    int root;
    int color, key; /* split */
    const void *send;
    void *recv; /* broadcast: the buffer */
    double ready; /* virtual time the caller's stream (host for barrier/split) reaches it */
    double start; /* written with `end`: when the round started (the latest `ready`) */
    fsdp_sim_dev_t *dev;
    int grank;  /* the caller's rank in the group */
    int member; /* its index among the group's simulated members (calls[], handles[]) */
    /* written by the rank that completes or fails the round, under the world lock */
    int done;
    fsdp_status_t status;
    double end;                  /* virtual end time */
    int sms;                     /* SMs the collective's kernel holds over [start, end) */
    fsdp_sim_group_t *new_group; /* split: the caller's new handle, NULL for a negative color */
} fsdp_sim_call_t;

/* A communicator, shared by the handles of its members; fields after `handles` are guarded by
 * the world lock. A round is one collective call of every member. */
struct fsdp_sim_comm {
    fsdp_sim_world_t *world;
    char name[FSDP_GROUP_NAME_SIZE];
    unsigned splits;            /* split rounds completed (names the next round's groups) */
    int size;
    int nodes;                  /* nodes its members are on (ranks_per_node of the launch) */
    int *ranks;                 /* global ranks in group-rank order (read-only) */
    int nsim;                   /* members simulated: all, or those that stand for the rest
                                 * (symmetric ranks, params.represent) */
    int *members;               /* their group ranks, ascending */
    fsdp_sim_group_t **handles; /* per simulated member; NULL once destroyed */
    fsdp_sim_comm_t *next;      /* in world->comms */
    int live;                   /* handles not yet destroyed */
    uint64_t seq;               /* rounds completed: the round in progress is call #seq+1 */
    int arrived;
    double busy_until;       /* end of the last round: NCCL runs a communicator's
                              * collectives one at a time, in call order */
    fsdp_sim_call_t **calls; /* per simulated member, NULL until it arrives */
    fsdp_status_t failed;    /* FSDP_OK, or why every later call fails at once */
    char *error;             /* the message that goes with `failed` */
};

/* What an op is, for the cost model. Fields that do not apply to a kind are 0/NULL. */
typedef enum {
    FSDP_SIM_OP_KERNEL,
    FSDP_SIM_OP_MEMCPY,
    FSDP_SIM_OP_EVENT_RECORD,
    FSDP_SIM_OP_COLLECTIVE
} fsdp_sim_op_kind_t;

typedef struct fsdp_sim_op {
    fsdp_sim_op_kind_t kind;
    const fsdp_kernel_t *kernel; /* KERNEL: price with fsdp_kernel_cost() */
    void *dst;                   /* MEMCPY */
    const void *src;
    size_t bytes; /* MEMCPY: bytes copied; COLLECTIVE: count * dtype size */
    fsdp_sim_coll_kind_t coll; /* COLLECTIVE */
    const fsdp_sim_comm_t *comm; /* COLLECTIVE: size and nodes (NVLink or network) */
} fsdp_sim_op_t;

/* A half-open busy interval [start, end) of virtual time. */
typedef struct fsdp_sim_span {
    double start, end;
} fsdp_sim_span_t;

/* A growable list of spans. */
typedef struct fsdp_sim_spans {
    fsdp_sim_span_t *v;
    size_t n, cap;
} fsdp_sim_spans_t;

/* The SMs a collective's kernel held on a rank: [start, end) in virtual seconds. */
typedef struct fsdp_sim_sm_hold {
    double start, end;
    int sms;
    double hbm;      /* bytes/s of HBM it moves (nccl.hbm_traffic_factor x its bus bytes / time) */
    unsigned stream; /* its stream (fsdp_sim_stream_key): a kernel of that stream never runs
                      * beside it */
} fsdp_sim_sm_hold_t;

/* A hold as a book records it, with what the collective was, to tell a changed job (holds.c). */
typedef struct fsdp_sim_hold_rec {
    fsdp_sim_sm_hold_t hold;
    int kind, dtype, group_size;
    size_t count;
} fsdp_sim_hold_rec_t;

/* A device segment or pinned host segment, for telling copies apart (h2d, d2h, d2d). */
typedef struct fsdp_sim_segment {
    uintptr_t base, end;
    fsdp_memkind_t kind;
} fsdp_sim_segment_t;

typedef enum {
    FSDP_SIM_RANK_RUNNING, /* executing its function (counts toward progress) */
    FSDP_SIM_RANK_BLOCKED, /* waiting in a collective */
    FSDP_SIM_RANK_EXITED   /* its function returned, or its thread never started */
} fsdp_sim_rank_phase_t;

struct fsdp_sim_dev {
    fsdp_dev_t super;
    fsdp_sim_world_t *world;
    /* owned by the rank's thread */
    double host_clock;
    fsdp_sim_stream_t compute;
    fsdp_sim_stream_t *streams; /* created ones, newest first */
    int next_stream_id;
    uint64_t records;                  /* event records issued, numbering them in the trace */
    const fsdp_sim_profile_t *profile; /* &world->params.profile */
    fsdp_sim_segment_t *segs;          /* live segments, sorted by base */
    size_t n_segs, cap_segs;
    /* accounting since the last fsdp_sim_time_reset */
    fsdp_sim_time_stats_t acct;
    fsdp_sim_spans_t compute_spans; /* sorted and merged (the compute stream runs in order) */
    fsdp_sim_spans_t comm_spans;    /* in issue order; merged on query */
    /* the collectives that hold SMs and may still overlap a kernel issued from now on (those
     * that end after the host clock), in issue order */
    fsdp_sim_sm_hold_t *sm_holds;
    size_t n_sm_holds, cap_sm_holds;
    /* params.holds: the earlier run's holds of this rank (NULL: none, or they stopped matching),
     * and how many holds this rank has issued in this run */
    const fsdp_sim_hold_rec_t *prior;
    size_t n_prior, n_issued;
    double prior_shift; /* this run's start of its last hold less the earlier run's */
    int acct_oom;                   /* host memory ran out: exposed_comm_s is a lower bound */
    uintptr_t shape_next; /* shape mode: next fake address */
    uintptr_t shape_end;
    char *last_error; /* heap, NULL = "" */
    fsdp_sim_group_t *world_group;
    int threads;                  /* data mode: threads its kernels may use (itself included) */
    struct fsdp_sim_pool *pool;   /* their workers, started by its first kernel; NULL: none */
    fsdp_sim_pack_cache_t pack_cache; /* data mode: its packed GEMM operand (pack_cache.c) */
    pthread_t thread;
    fsdp_status_t status; /* what the rank function returned */
    /* guarded by world->lock */
    pthread_cond_t cond;          /* signalled when the call it waits in is done (threads) */
    struct timespec deadline;     /* of that wait (fibers: the launcher fires timeouts) */
    fsdp_sim_fiber_t *fiber;      /* fiber mode */
    fsdp_sim_rank_phase_t phase;
    int failed;                   /* its function failed, or fsdp_sim_rank_fail */
    fsdp_sim_call_t *waiting;     /* while BLOCKED */
    fsdp_sim_comm_t *waiting_comm;
};

struct fsdp_sim_world {
    fsdp_sim_params_t params; /* validated, ranks_per_node resolved */
    fsdp_rank_func_t func;
    void *arg;
    fsdp_sim_dev_t *devs; /* n_devs entries, by rank */
    int n_devs;           /* the simulated ranks: world_size, or fewer with params.represent */
    int *slot;            /* with params.represent: the index in devs of each rank, -1 for a
                           * rank another stands for; NULL: rank r is devs[r] */
    pthread_mutex_t lock;
    /* guarded by lock */
    int n_running; /* ranks in phase RUNNING */
    fsdp_sim_sched_t *sched; /* fiber mode: the run queue and the workers */
    int n_dead;    /* ranks failed or exited */
    fsdp_sim_comm_t *comms; /* every live communicator, newest first */
    /* data mode: the host bytes the ranks' segments hold (atomic), and params.host_memory
     * resolved at launch */
    size_t host_held;
};

/* The stack of a rank's thread or fiber. Big worlds get small stacks: 1024 ranks at glibc's
 * 8 MiB default would reserve 8 GiB of address space for stacks alone, while a rank's own
 * frames are shallow. */
static inline size_t fsdp_sim_stack_size(int world_size)
{
    return world_size <= 64 ? (size_t)8 << 20 : (size_t)2 << 20;
}

/* The simulated rank `rank`, or NULL when another rank stands for it. */
static inline fsdp_sim_dev_t *fsdp_sim_world_dev(const fsdp_sim_world_t *w, int rank)
{
    if (w->slot == NULL)
        return &w->devs[rank];
    return w->slot[rank] >= 0 ? &w->devs[w->slot[rank]] : NULL;
}

/* Checked downcast: NULL when dev is not a sim rank. */
static inline fsdp_sim_dev_t *fsdp_sim_dev(fsdp_dev_t *dev)
{
    return fsdp_dev_is_sim(dev) ? (fsdp_sim_dev_t *)dev : NULL;
}

static inline int fsdp_sim_is_shape(const fsdp_sim_dev_t *dev)
{
    return dev->world->params.mode == FSDP_SIM_SHAPE;
}

static inline double fsdp_sim_max2(double a, double b)
{
    return a > b ? a : b;
}

static inline double fsdp_sim_min2(double a, double b)
{
    return a < b ? a : b;
}

/* The live segments, sorted by base: a copy's kind comes from where its pointers lie. The
 * index of the first segment whose base is above addr. */
static inline size_t fsdp_sim_seg_search(const fsdp_sim_dev_t *dev, uintptr_t addr)
{
    size_t lo = 0, hi = dev->n_segs;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (dev->segs[mid].base <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* profile.c, profile_json.c: the largest rate or size a profile may give, and the collective
 * algorithms' names as their messages list them. */
#define FSDP_SIM_PROFILE_BIG 1e30
/* ... and the smallest positive rate (FLOP/s, bytes/s, elements/s): an op's work over it, at
 * the least efficiency a profile may give, stays far below what a double holds, where a rate
 * of 1e-308 made every time inf and a step's time NaN. */
#define FSDP_SIM_PROFILE_MIN_RATE 1.0
#define FSDP_SIM_ALGO_NAMES "ring, tree, nvls, nvls_tree, pat"
/* profile.c: applies "nodes=N,gpus_per_node=G" (opts) to *p; `what` is the whole spec, for the
 * message. */
fsdp_status_t fsdp_sim_profile_apply_shape(const char *what, const char *opts,
                                           fsdp_sim_profile_t *p);

/* cost.c: seconds the op takes once started, on the whole GPU, and a kernel's FLOPs (0 for
 * other ops) into *flops_p: each op is priced once. The only place op costs come from. */
double fsdp_sim_op_cost_flops(const fsdp_sim_dev_t *dev, const fsdp_sim_op_t *op, double *flops_p);
/* A collective op's cost, and the SMs its kernel holds while it runs into *sms_p (may be NULL):
 * its channels x nccl.sms_per_channel, 0 for a group of one or a barrier. */
double fsdp_sim_coll_op_cost(const fsdp_sim_dev_t *dev, const fsdp_sim_op_t *op, int *sms_p);

/* cost.c: the HBM bytes a kernel moves as it runs under p (eager: its ops' bytes). */
double fsdp_sim_kernel_hbm_bytes(const fsdp_sim_profile_t *p, const fsdp_kernel_t *k);

/* cost.c: what a copy between dst and src is, from the rank's segments (memory outside
 * them is pageable host memory). */
fsdp_sim_copy_kind_t fsdp_sim_copy_kind(const fsdp_sim_dev_t *dev, const void *dst,
                                        const void *src);

/* cost.c: nodes spanned by `n` global ranks, per_node ranks to a node. */
int fsdp_sim_count_nodes(const int *ranks, int n, int per_node);

/* rank.c: the clocks. The earliest start of an op issued now on stream (host clock plus the
 * launch latency, or the stream's clock). */
double fsdp_sim_stream_ready(const fsdp_sim_dev_t *dev, const fsdp_sim_stream_t *stream);
/* The host pays for one launch (kernel, copy or collective). */
void fsdp_sim_host_launch(fsdp_sim_dev_t *dev);
/* The collective `call` of a group of group_size ranks held call->sms SMs and moved HBM bytes
 * (nccl.hbm_traffic_factor x its bus bytes) over [call->start, call->end): GEMMs and fused
 * attention issued later that overlap it run on the SMs left, memory-bound kernels share HBM
 * with it; the launch's book (params.holds) records it. */
void fsdp_sim_hold_sms(fsdp_sim_dev_t *dev, const fsdp_sim_call_t *call, int group_size,
                       const fsdp_sim_stream_t *stream);

/* holds.c: the book of params.holds. At a launch, the last run's records become the prior and
 * the records start empty (not thread-safe: before the ranks run). */
void fsdp_sim_holds_begin(fsdp_sim_holds_t *holds);
/* The world size it was made for. */
int fsdp_sim_holds_world(const fsdp_sim_holds_t *holds);
/* rank's prior records (*n_p of them; NULL when none). */
const fsdp_sim_hold_rec_t *fsdp_sim_holds_prior(const fsdp_sim_holds_t *holds, int rank,
                                                size_t *n_p);
/* Appends to rank's records; only rank's thread calls it. Returns -1 when out of memory (the
 * next run then sees fewer holds). */
int fsdp_sim_holds_record(fsdp_sim_holds_t *holds, int rank, const fsdp_sim_hold_rec_t *rec);
/* Accounts a collective that ran on stream over [ready, end) moving nccl_bytes. */
void fsdp_sim_account_coll(fsdp_sim_dev_t *dev, const fsdp_sim_stream_t *stream,
                           fsdp_sim_coll_kind_t kind, double ready, double end,
                           double nccl_bytes);
/* Writes an op to the rank's event trace (call only when fsdp_trace_enabled): host is the
 * host clock when it was issued, [start, end] when it ran. */
void fsdp_sim_trace_op(fsdp_sim_dev_t *dev, fsdp_event_kind_t kind, const char *name,
                       const fsdp_sim_stream_t *stream, double host, double start, double end,
                       double bytes, uint64_t count, int dtype, const char *group);
/* Frees the accounting state of a rank. */
void fsdp_sim_acct_cleanup(fsdp_sim_dev_t *dev);
/* Fills the span totals of stats (compute_s, comm_s, exposed_comm_s) from the rank's spans. */
void fsdp_sim_acct_spans(fsdp_sim_dev_t *dev, fsdp_sim_time_stats_t *stats);
/* Issues op on stream (start = ready time, end = start + cost); an op whose time is not finite
 * fails the rank (fsdp_sim_time_check) and leaves the stream as it was. */
fsdp_status_t fsdp_sim_stream_issue(fsdp_sim_dev_t *dev, fsdp_sim_stream_t *stream,
                                    const fsdp_sim_op_t *op);
/* FSDP_OK when an op that started at start and ends at end took a finite time >= 0; otherwise
 * the rank fails naming the op (what) and the profile. Every simulated time passes it. */
fsdp_status_t fsdp_sim_time_check(fsdp_sim_dev_t *dev, const char *what, double start,
                                  double end);
/* Maps NULL to the compute stream and checks that the stream belongs to dev. */
fsdp_status_t fsdp_sim_stream_get(fsdp_sim_dev_t *dev, fsdp_stream_t *stream,
                                  fsdp_sim_stream_t **stream_p);

/* rank.c: errors. Sets the rank's last error message (copying msg; no log). */
void fsdp_sim_set_error(fsdp_sim_dev_t *dev, const char *msg);
/* Formats "rank N: <message>", makes it the rank's last error, logs it (once, at the caller's
 * file and line) and returns status. */
#define fsdp_sim_errorf(dev, status, ...)                                                          \
    fsdp_sim_error_at((dev), (status), __FILE__, __LINE__, __func__, __VA_ARGS__)
fsdp_status_t fsdp_sim_error_at(fsdp_sim_dev_t *dev, fsdp_status_t status, const char *file,
                                int line, const char *func, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* pg.c: the process group. Called with the world lock NOT held. */
fsdp_status_t fsdp_sim_pg_init(fsdp_sim_world_t *world);
void fsdp_sim_pg_cleanup(fsdp_sim_world_t *world);
/* The rank's function returned (failed = it returned an error) or its thread never started. */
void fsdp_sim_pg_rank_exit(fsdp_sim_dev_t *dev, int failed);
void fsdp_sim_pg_rank_fail(fsdp_sim_dev_t *dev);
/* A rank's function, run on its own thread or fiber: calls it and reports its exit. */
void fsdp_sim_rank_body(fsdp_sim_dev_t *dev);
/* Deposits call (kind and arguments filled in, `ready` set) in the round in progress of the
 * group and returns when that round has ended, with its status; on success call->end is the
 * virtual end time (and call->new_group the result of a split). */
fsdp_status_t fsdp_sim_coll_run(fsdp_sim_dev_t *dev, fsdp_sim_group_t *group,
                                fsdp_sim_call_t *call);
/* Fails the round in progress of comm: a member waited past its deadline. */
void fsdp_sim_comm_timeout_locked(fsdp_sim_comm_t *comm);
/* Frees a rank's handle; the communicator goes with its last handle. */
void fsdp_sim_group_release(fsdp_sim_group_t *group);

/* fiber.c: ranks as fibers on a few worker threads (params.fibers). 1 when this build has
 * them (not under ASan or TSan, which do not follow stack switches unannotated). */
int fsdp_sim_fibers_available(void);
/* What the scheduler runs and fires, given by the launch: the process group's (pg.c), so that
 * the scheduler sits below it. */
typedef struct fsdp_sim_fiber_calls {
    void (*body)(fsdp_sim_dev_t *dev);             /* a rank's function, and its exit */
    void (*timeout_locked)(fsdp_sim_comm_t *comm); /* a round past a member's deadline */
} fsdp_sim_fiber_calls_t;
/* Runs every rank's body as a fiber and returns when all have exited; the calling thread fires
 * collective timeouts meanwhile. FSDP_ERR_NO_MEMORY when the fibers or workers cannot be set
 * up (nothing ran). */
fsdp_status_t fsdp_sim_fibers_run(fsdp_sim_world_t *world, const fsdp_sim_fiber_calls_t *calls);
/* With the world lock held: the fiber of d, whose call is not done, gives up its worker until
 * fsdp_sim_fiber_wake_locked(d); returns with the lock held. */
void fsdp_sim_fiber_wait_locked(fsdp_sim_dev_t *d, fsdp_sim_call_t *call);
void fsdp_sim_fiber_wake_locked(fsdp_sim_dev_t *d);

/* coll.c: the group and collective slots of the ops table. */
fsdp_group_t *fsdp_sim_group_world(fsdp_dev_t *dev);
fsdp_status_t fsdp_sim_group_split(fsdp_dev_t *dev, fsdp_group_t *parent, int color, int key,
                                   fsdp_group_t **group_p);
void fsdp_sim_group_destroy(fsdp_dev_t *dev, fsdp_group_t *group);
fsdp_status_t fsdp_sim_all_gather(fsdp_dev_t *dev, fsdp_group_t *group, const void *send,
                                  void *recv, size_t count, fsdp_dtype_t dtype,
                                  fsdp_stream_t *stream);
fsdp_status_t fsdp_sim_reduce_scatter(fsdp_dev_t *dev, fsdp_group_t *group, const void *send,
                                      void *recv, size_t count, fsdp_dtype_t dtype,
                                      fsdp_reduce_op_t op, fsdp_stream_t *stream);
fsdp_status_t fsdp_sim_all_reduce(fsdp_dev_t *dev, fsdp_group_t *group, const void *send,
                                  void *recv, size_t count, fsdp_dtype_t dtype,
                                  fsdp_reduce_op_t op, fsdp_stream_t *stream);
fsdp_status_t fsdp_sim_broadcast(fsdp_dev_t *dev, fsdp_group_t *group, void *buf, size_t count,
                                 fsdp_dtype_t dtype, int root, fsdp_stream_t *stream);
fsdp_status_t fsdp_sim_barrier(fsdp_dev_t *dev, fsdp_group_t *group);

/* reduce.c: the data of a completed round (data mode), for calls[0..n) in group-rank order,
 * which all match. Reads every send buffer and writes every receive buffer; results depend
 * only on the calls, never on which thread runs this. */
void fsdp_sim_coll_compute(fsdp_sim_call_t *const *calls, int n);

#endif
