/* libfsdp: the gpu backend (CUDA streams, events and memory; NCCL collectives).
 *
 * One process per rank, each driving one CUDA device. The ranks of a job share an NCCL unique
 * id: rank 0 makes it with fsdp_gpu_unique_id() and hands the same bytes to every rank (through
 * the launcher, a file, MPI, ...); each rank then calls fsdp_gpu_init() with its rank, and gets
 * the dev it hands to the core. A world of one needs no exchange.
 *
 * The backend's CUDA and NCCL code is a module, libfsdp-gpu.so, that libfsdp loads on the first
 * call that needs it (libfsdp itself links no CUDA or NCCL library, so the simulator runs
 * without them). It is looked for at the path in the environment variable FSDP_GPU_MODULE when
 * that is set (and then only there); for a libfsdp run from its build tree, in that tree only;
 * else in fsdp/ beside the running libfsdp, then in the install directory ($(libdir)/fsdp).
 * Without a loadable module (none was built, none is installed, or a CUDA or NCCL library it
 * needs is missing), fsdp_gpu_built() is 0, fsdp_gpu_device_count() is 0, fsdp_gpu_init() and
 * fsdp_gpu_unique_id() return FSDP_ERR_UNSUPPORTED, logging fsdp_gpu_load_error()'s line, and
 * every slot of fsdp_gpu_backend() returns FSDP_ERR_UNSUPPORTED.
 *
 * No CUDA or NCCL header is needed to use this one.
 */
#ifndef FSDP_GPU_H
#define FSDP_GPU_H

#include <fsdp/api.h>

#include <fsdp/backend.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the gpu backend module is loaded. The first call of this, or of a function below that
 * needs the module, loads it: once per process, thread-safe. */
FSDP_API int fsdp_gpu_built(void);
/* Why the module is not loaded, in one line: "gpu backend module missing: ..." with the paths
 * tried, "gpu backend module PATH: a library it needs is missing: ..." naming it, or "gpu
 * backend module PATH cannot be loaded: ...". "" when it is loaded. Never NULL. */
FSDP_API const char *fsdp_gpu_load_error(void);
/* The path of the loaded module, or NULL. */
FSDP_API const char *fsdp_gpu_module_path(void);
/* Number of CUDA devices visible to this process (0 without the module, a driver or a device). */
FSDP_API int fsdp_gpu_device_count(void);
/* What the gpu backend finds here, in one line for a banner or a log, written into buf (at most
 * size bytes, always terminated): "gpu: driver 13.0, runtime 13.0, NCCL 2.28.9, cuBLAS 13.0.0;
 * 1 device: 0 NVIDIA H100 80GB HBM3 (sm_90, 79.2 GiB)", with the reason where there is no
 * device ("no device: cudaGetDeviceCount: ... (cudaErrorInsufficientDriver)"), or "gpu: "
 * followed by fsdp_gpu_load_error()'s line without the module. A cause other than "no device"
 * is logged once per process at warning level, by fsdp_gpu_device_count() or fsdp_gpu_init(),
 * unless this line, which says it, came first. */
FSDP_API void fsdp_gpu_describe(char *buf, size_t size);
/* The gpu ops table (every slot returns FSDP_ERR_UNSUPPORTED without the module). */
FSDP_API const fsdp_backend_ops_t *fsdp_gpu_backend(void);

/* Size of an NCCL unique id (NCCL_UNIQUE_ID_BYTES). */
#define FSDP_GPU_UNIQUE_ID_BYTES 128

/* The bytes every rank of a job must share to make the world communicator. */
typedef struct {
    unsigned char bytes[FSDP_GPU_UNIQUE_ID_BYTES];
} fsdp_gpu_unique_id_t;

/* Makes a new unique id (on rank 0: it opens the bootstrap listener the other ranks connect to
 * at init). */
FSDP_API fsdp_status_t fsdp_gpu_unique_id(fsdp_gpu_unique_id_t *id_p);

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

FSDP_API void fsdp_gpu_params_init(fsdp_gpu_params_t *params);

/* Selects the device, creates the compute stream, the cuBLAS handle and the world communicator
 * (a collective over all ranks: it waits for every rank's init, up to the timeout).
 * FSDP_ERR_NO_DEVICE without a usable device, FSDP_ERR_INVALID_PARAM for inconsistent params,
 * FSDP_ERR_TIMEOUT when the other ranks do not join in time, FSDP_ERR_UNSUPPORTED without the
 * module. params NULL: the defaults (fsdp_gpu_params_init). */
FSDP_API fsdp_status_t fsdp_gpu_init(const fsdp_gpu_params_t *params, fsdp_dev_t **dev_p);

/* Waits for outstanding collectives (up to the timeout), destroys the groups, streams and
 * communicators this dev still owns, and frees it. Streams and events made by the core must be
 * destroyed before. Accepts NULL. */
FSDP_API void fsdp_gpu_finalize(fsdp_dev_t *dev);

/* 1 when the dev belongs to the gpu backend. */
FSDP_API int fsdp_dev_is_gpu(const fsdp_dev_t *dev);

/* ---- Launch environment and rendezvous (in libfsdp, built with or without CUDA; need no GPU nor
 * the module) ---- */

/* Longest master address kept (a host name or a numeric IPv4/IPv6 address), with its NUL. */
#define FSDP_LAUNCH_ADDR_MAX 256
/* Default rendezvous port where the launcher names none (torchrun's default). */
#define FSDP_LAUNCH_DEFAULT_PORT 29500
/* Largest blob fsdp_rendezvous() hands out, and longest job token it accepts. */
#define FSDP_RENDEZVOUS_BLOB_MAX 4096
#define FSDP_RENDEZVOUS_TOKEN_MAX 1024

/* Where this process sits in the job, as its launcher says. */
typedef struct fsdp_launch_info {
    const char *launcher; /* "torchrun", "openmpi", "slurm" or "single" (a static string) */
    int rank;             /* 0 <= rank < world_size */
    int world_size;       /* >= 1 */
    int local_rank;       /* rank within its node */
    int local_size;       /* ranks on its node; 0 when the launcher does not say */
    char master_addr[FSDP_LAUNCH_ADDR_MAX]; /* where rank 0 listens */
    int master_port;                        /* 1..65535 */
} fsdp_launch_info_t;

/* Reads rank, world size, local rank, local size and the master address and port from the
 * launcher's environment, the first that is present winning:
 *  - torchrun (RANK set): RANK, WORLD_SIZE, LOCAL_RANK (default RANK), LOCAL_WORLD_SIZE
 *    (optional), MASTER_ADDR and MASTER_PORT (required when WORLD_SIZE > 1);
 *  - Open MPI (OMPI_COMM_WORLD_RANK set): OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE,
 *    MASTER_ADDR and MASTER_PORT (required when the size is > 1);
 *  - Slurm (SLURM_PROCID set): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE
 *    or this node's count in SLURM_TASKS_PER_NODE ("2(x3),1"); the master is MASTER_ADDR or
 *    else the first host of SLURM_JOB_NODELIST ("node[3-5,7],gpu01" -> "node3"), the port
 *    MASTER_PORT or else FSDP_LAUNCH_DEFAULT_PORT;
 *  - none of these: a single process, rank 0 of 1, master 127.0.0.1 (MASTER_ADDR and
 *    MASTER_PORT still apply when set).
 * A malformed or inconsistent value (not a number, rank >= world size, local rank >= local
 * size, a missing master for a world > 1) is FSDP_ERR_INVALID_PARAM, logged with the variable
 * and what is allowed. *info_p is written only on success. */
FSDP_API fsdp_status_t fsdp_launch_env(fsdp_launch_info_t *info_p);

/* Host number index (from 0) of a Slurm host list such as "node[3-5,7],gpu[01-02]-ib" (ranges
 * keep their zero padding; several bracket groups in one name expand as a product), written
 * into host (size bytes with the NUL). FSDP_ERR_NOT_FOUND when the list has index hosts or
 * fewer, FSDP_ERR_INVALID_PARAM for a malformed list or a name that does not fit. */
FSDP_API fsdp_status_t fsdp_hostlist_get(const char *list, int index, char *host, size_t size);

/* Hands blob (blob_size bytes, 1..FSDP_RENDEZVOUS_BLOB_MAX; typically the NCCL unique id rank 0
 * made with fsdp_gpu_unique_id()) from rank 0 to every rank over TCP, at
 * info->master_addr:info->master_port. Rank 0 listens there (SO_REUSEADDR; on the loopback
 * address when the master address is a loopback one, else on every interface, IPv6 and IPv4)
 * and answers once all world_size - 1 other ranks have joined; the others connect, retrying
 * while rank 0 is not up yet, and receive the blob into the same buffer. A collective: it
 * returns on every rank when all have joined, or FSDP_ERR_TIMEOUT after timeout_s seconds
 * (> 0), with the ranks that arrived and those missing logged.
 *
 * token (NULL or "" = none, else at most FSDP_RENDEZVOUS_TOKEN_MAX bytes; typically the
 * FSDP_JOB_TOKEN environment variable, the same on every rank) is the job's shared secret:
 * rank 0 refuses a rank whose token differs. Rank 0 also refuses a rank out of range or
 * already joined, a different world size or blob size and a different protocol version
 * (the refused rank gets FSDP_ERR_INVALID_PARAM with the reason), and drops malformed
 * connections, then goes on waiting for the real ranks. A world of one returns at once. */
FSDP_API fsdp_status_t fsdp_rendezvous(const fsdp_launch_info_t *info, const char *token,
                                       double timeout_s, void *blob, size_t blob_size);

/* This process as one rank of the job its launcher describes (info from fsdp_launch_env): for a
 * world of more than one, rank 0 makes the NCCL unique id and fsdp_rendezvous hands it to every
 * rank (token: the FSDP_JOB_TOKEN environment variable, or none); then fsdp_gpu_init opens the
 * device of the local rank, with timeout_s as the collective timeout. Errors as those calls'. */
FSDP_API fsdp_status_t fsdp_gpu_init_launched(const fsdp_launch_info_t *info, double timeout_s,
                                              fsdp_dev_t **dev_p);

/* Runs func on `world` ranks of this process, one thread and one device each (rank r on device
 * r, sharing one unique id), as fsdp_sim_launch runs them on the simulator; each dev is
 * finalized after its func returns. FSDP_OK when every rank's func and init succeeded, else the
 * first failure in rank order. world must be 1..fsdp_gpu_device_count(). */
FSDP_API fsdp_status_t fsdp_gpu_launch_local(int world, double timeout_s,
                                             fsdp_status_t (*func)(fsdp_dev_t *dev, void *arg),
                                             void *arg);

#ifdef __cplusplus
}
#endif
#endif
