/* libfsdp: the gpu backend (CUDA streams, events and memory; NCCL collectives).
 *
 * One process per rank, each driving one CUDA device. The ranks of a job share an NCCL unique
 * id: rank 0 makes it with fsdp_gpu_unique_id() and hands the same bytes to every rank (through
 * the launcher, a file, MPI, ...); each rank then calls fsdp_gpu_init() with its rank, and gets
 * the dev it hands to the core. A world of one needs no exchange.
 *
 * Always declared; when the library was built without CUDA and NCCL, fsdp_gpu_built() is 0,
 * fsdp_gpu_device_count() is 0, fsdp_gpu_init() and fsdp_gpu_unique_id() return
 * FSDP_ERR_UNSUPPORTED, and every slot of fsdp_gpu_backend() returns FSDP_ERR_UNSUPPORTED.
 *
 * No CUDA or NCCL header is needed to use this one.
 */
#ifndef FSDP_GPU_H
#define FSDP_GPU_H

#include <fsdp/backend.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when this library was built with the gpu backend. */
int fsdp_gpu_built(void);
/* Number of CUDA devices visible to this process (0 without a driver or device). */
int fsdp_gpu_device_count(void);
/* The gpu ops table (every slot returns FSDP_ERR_UNSUPPORTED when not built). */
const fsdp_backend_ops_t *fsdp_gpu_backend(void);

/* Size of an NCCL unique id (NCCL_UNIQUE_ID_BYTES). */
#define FSDP_GPU_UNIQUE_ID_BYTES 128

/* The bytes every rank of a job must share to make the world communicator. */
typedef struct {
    unsigned char bytes[FSDP_GPU_UNIQUE_ID_BYTES];
} fsdp_gpu_unique_id_t;

/* Makes a new unique id (on rank 0: it opens the bootstrap listener the other ranks connect to
 * at init). */
fsdp_status_t fsdp_gpu_unique_id(fsdp_gpu_unique_id_t *id_p);

typedef struct fsdp_gpu_params {
    int rank;       /* global rank, 0 <= rank < world_size; default 0 */
    int world_size; /* >= 1; default 1 */
    int local_rank; /* rank within its node; default 0 */
    int local_size; /* ranks per node; 0 (default) = world_size */
    int device;     /* CUDA device ordinal; -1 (default) = local_rank */
    /* From fsdp_gpu_unique_id() on rank 0, the same on every rank. May stay all zero when
     * world_size is 1 (init makes one). Default: all zero. */
    fsdp_gpu_unique_id_t unique_id;
    /* Wall seconds a collective, or communicator creation, may take before the rank gives up:
     * the communicators are aborted and the wait returns FSDP_ERR_TIMEOUT. <= 0 waits forever.
     * Default 600 (PyTorch's NCCL default). */
    double timeout_s;
    /* 1: the host waits for every collective to finish, as TORCH_NCCL_BLOCKING_WAIT (slow; for
     * debugging hangs). 0 (default): collectives run asynchronously on their stream and the
     * timeout is enforced whenever the host waits (event and stream synchronization, barrier,
     * event queries, finalize) and when new collectives are enqueued. */
    int blocking_collectives;
} fsdp_gpu_params_t;

void fsdp_gpu_params_init(fsdp_gpu_params_t *params);

/* Selects the device, creates the compute stream, the cuBLAS handle and the world communicator
 * (a collective over all ranks: it waits for every rank's init, up to the timeout).
 * FSDP_ERR_NO_DEVICE without a usable device, FSDP_ERR_INVALID_PARAM for inconsistent params,
 * FSDP_ERR_TIMEOUT when the other ranks do not join in time. */
fsdp_status_t fsdp_gpu_init(const fsdp_gpu_params_t *params, fsdp_dev_t **dev_p);

/* Waits for outstanding collectives (up to the timeout), destroys the groups, streams and
 * communicators this dev still owns, and frees it. Streams and events made by the core must be
 * destroyed before. Accepts NULL. */
void fsdp_gpu_finalize(fsdp_dev_t *dev);

/* 1 when the dev belongs to the gpu backend. */
int fsdp_dev_is_gpu(const fsdp_dev_t *dev);

#ifdef __cplusplus
}
#endif
#endif
