/* libfsdp: the device a rank runs on, its streams, events and communication groups.
 *
 * A program picks a backend (fsdp_sim_launch, fsdp_gpu_init) and gets each rank's device
 * context, fsdp_dev_t; it drives the device through the fsdp_dev_* calls of <fsdp/backend.h>
 * and hands it to the core (fsdp_create). What a backend fills in is <fsdp/backend/ops.h>.
 */
#ifndef FSDP_DEVICE_H
#define FSDP_DEVICE_H

#include <fsdp/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_backend_ops fsdp_backend_ops_t;
typedef struct fsdp_event fsdp_event_t;           /* opaque, backend-defined */
typedef struct fsdp_trace_rank fsdp_trace_rank_t; /* a rank's event-trace writer (trace.h) */

/* The most ranks a world may have: the simulator's and fsdp-plan's bound, and a trace that names
 * more is refused as corrupt. Above the largest clusters built; per-rank tables stay small. */
#define FSDP_MAX_WORLD (1 << 20)

/* Per-rank device context. Backends embed it as their first member, named `super`. */
typedef struct fsdp_dev {
    const fsdp_backend_ops_t *ops;
    int rank;                 /* global rank */
    int world_size;           /* global world size */
    int local_rank;           /* rank within its node */
    int local_size;           /* ranks per node */
    fsdp_trace_rank_t *trace; /* NULL: not tracing; set by fsdp_trace_attach */
    int no_data; /* 1 when buffers hold no data (sim shape mode): skip data-dependent checks */
    /* How many ranks this one stands for: 1 (0 reads as 1), or more for the sim's symmetric
     * ranks in shape mode (fsdp_sim_params_t.represent), whose runs are theirs too. */
    int stands_for;
    /* NULL, or world_size entries: represent[r] is the rank whose run is rank r's (the sim's
     * fsdp_sim_params_t.represent), so that a trace can say which ranks this one stands for. */
    const int *represent;
} fsdp_dev_t;

/* A stream. Backends embed it first. */
typedef struct fsdp_stream {
    int id;       /* per-rank, 0 = the default compute stream */
    int priority; /* lower is higher priority, as CUDA */
    char name[24];
} fsdp_stream_t;

#define FSDP_GROUP_NAME_SIZE 48

/* A communication group (the world, or a sub-group made by group_split). Backends embed it
 * first. */
typedef struct fsdp_group {
    int rank;                        /* this rank's index in the group */
    int size;                        /* number of ranks in the group */
    const int *ranks;                /* global ranks of the members, in group-rank order */
    char name[FSDP_GROUP_NAME_SIZE]; /* "world", or a split's name (fsdp_group_split_name) */
} fsdp_group_t;

typedef enum {
    FSDP_MEMKIND_DEVICE = 0,     /* device memory (sim: host memory) */
    FSDP_MEMKIND_HOST_PINNED = 1 /* page-locked host memory for async copies */
} fsdp_memkind_t;

#ifdef __cplusplus
}
#endif
#endif
