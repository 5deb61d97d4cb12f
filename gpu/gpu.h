/* The gpu backend's internal types and error conversion (never installed).
 *
 * One process per rank: a fsdp_gpu_dev_t owns one CUDA device, its compute stream, a cuBLAS
 * handle and the NCCL communicators of its groups. Every CUDA, cuBLAS and NCCL call goes
 * through FSDP_CUDA_CALL, FSDP_CUBLAS_CALL or FSDP_NCCL_CALL, which turn the foreign result
 * into an fsdp_status_t and log the failing call with the library's own error string, once,
 * here at the boundary. No CUDA or NCCL type leaves gpu/.
 *
 * Communicators are non-blocking (ncclConfig_t.blocking = 0), so no NCCL call can hang the host:
 * every wait on NCCL is a poll bounded by the collective timeout (coll.c, watch.c). Collectives
 * are enqueued asynchronously; each one records an event into the dev's watchdog ring, and every
 * host wait (event and stream synchronization, barrier, finalize) polls the ring: a collective
 * older than the timeout, or an asynchronous NCCL error, aborts the communicators and fails the
 * wait with FSDP_ERR_TIMEOUT, FSDP_ERR_RANK_FAILED or FSDP_ERR_BACKEND naming the collective.
 *
 * This header is read by gcc (the .c files) and by nvcc (kernels.cu).
 */
#ifndef FSDP_GPU_GPU_H
#define FSDP_GPU_GPU_H

#include <fsdp/backend.h>
#include <fsdp/gpu.h>
#include <fsdp/log.h>

#include "poll.h"

#include <pthread.h>

/* The toolkit's headers are foreign code: they test undefined macros and declare "f()". */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wundef"
#ifndef __cplusplus
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#endif
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>
#pragma GCC diagnostic pop

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "the gpu backend needs NCCL >= 2.18 (ncclCommSplit, non-blocking communicators)"
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_gpu_dev fsdp_gpu_dev_t;
typedef struct fsdp_gpu_timer fsdp_gpu_timer_t;   /* trace.c */
typedef struct fsdp_gpu_anchor fsdp_gpu_anchor_t; /* trace.c */

/* Element-wise launches use this many threads per block (reductions: FSDP_KB_RED_LANES). */
#define FSDP_GPU_THREADS 256
/* Collectives the watchdog tracks at once; more wait for the oldest to finish. */
#define FSDP_GPU_WATCH_SLOTS 64

typedef struct fsdp_gpu_stream {
    fsdp_stream_t super;
    cudaStream_t cu;
    double *scratch; /* FSDP_KB_RED_MAX_BLOCKS partial sums (reductions), made on first use */
    /* The stream's own cuBLAS handle, bound to it, made by its first GEMM (the compute stream's
     * at init): a handle's workspace serves one stream at a time, so two streams running GEMMs
     * at once must not share one. */
    cublasHandle_t cublas;
} fsdp_gpu_stream_t;

/* fsdp_event_t is opaque in backend.h; the gpu's event is this struct behind it. It only orders
 * and synchronizes (cudaEventDisableTiming); traces time spans with events of their own. */
struct fsdp_event {
    cudaEvent_t cu;
    uint64_t record_id; /* its last record's number on the rank (the trace's record and wait) */
};

typedef struct fsdp_gpu_group {
    fsdp_group_t super;
    fsdp_gpu_dev_t *dev;
    ncclComm_t comm;             /* NULL once aborted or destroyed */
    int *ranks;                  /* super.ranks */
    unsigned splits;             /* group_split calls made on it (names their groups) */
    struct fsdp_gpu_group *next; /* the dev's list of live groups */
} fsdp_gpu_group_t;

/* A collective in flight: the watchdog fails it once it is older than the timeout. */
#define FSDP_GPU_WHAT_SIZE 160
typedef struct fsdp_gpu_watch {
    cudaEvent_t done; /* recorded after the collective */
    double t0;        /* host time of the enqueue */
    fsdp_gpu_group_t *group;
    char what[FSDP_GPU_WHAT_SIZE]; /* "all_gather(count 4096, bf16) on group world" */
} fsdp_gpu_watch_t;

struct fsdp_gpu_dev {
    fsdp_dev_t super;
    int device;
    double timeout_s; /* <= 0: wait forever */
    int blocking_collectives;
    int prio_least, prio_greatest; /* the device's stream priorities (greatest <= least) */
    int next_stream_id;
    uint64_t records; /* event records issued, numbering them in the trace */

    fsdp_gpu_stream_t compute; /* id 0 */
    cudaStream_t aux;          /* barrier and split bookkeeping */
    int *dbuf; /* device ints for barrier and split */

    fsdp_gpu_group_t *world;
    fsdp_gpu_group_t *groups; /* live groups, world included */
    fsdp_status_t failed;     /* FSDP_OK, or why the communicators were aborted */

    fsdp_gpu_watch_t watch[FSDP_GPU_WATCH_SLOTS]; /* collectives in flight, ordered by ring */
    fsdp_gpu_ring_t ring;

    /* Trace timing (trace.c): the reference events with their host times, and the timer pool
     * (a flush on another thread may resolve timers: the lock guards the lists and counts). */
    fsdp_gpu_anchor_t *anchor; /* the newest reference, first of the list of those in use */
    pthread_mutex_t timer_lock;
    int timer_lock_init;
    int trace_gave_up; /* an op's end did not come within the timeout (under timer_lock) */
    fsdp_gpu_timer_t *timers_free, *timers_all;
};

static inline fsdp_gpu_dev_t *fsdp_gpu_dev_of(fsdp_dev_t *dev)
{
    return (fsdp_gpu_dev_t *)dev;
}

/* A NULL stream is the compute stream. */
static inline fsdp_gpu_stream_t *fsdp_gpu_stream_of(fsdp_gpu_dev_t *gdev, fsdp_stream_t *stream)
{
    return stream != NULL ? (fsdp_gpu_stream_t *)stream : &gdev->compute;
}

/* error.c: the conversions behind the macros. Each logs "rank R: <call>: <message> (<name>)"
 * and returns FSDP_ERR_OUT_OF_MEMORY, FSDP_ERR_NO_DEVICE, FSDP_ERR_RANK_FAILED or
 * FSDP_ERR_BACKEND; FSDP_OK on success. cudaErrorNotReady is not an error. */
fsdp_status_t fsdp_gpu_cuda_status(cudaError_t err, const char *call, const char *file, int line,
                                   const char *func);
fsdp_status_t fsdp_gpu_cublas_status(cublasStatus_t st, const char *call, const char *file,
                                     int line, const char *func);
/* ncclInProgress is success here: the caller polls the communicator (coll.c). */
fsdp_status_t fsdp_gpu_nccl_status(ncclResult_t res, const char *call, const char *file, int line,
                                   const char *func);
/* The rank printed in front of every message of the calling thread (set by fsdp_gpu_init on the
 * rank's thread; -1, none, on any other). */
void fsdp_gpu_set_log_rank(int rank);
int fsdp_gpu_log_rank(void);

#define FSDP_CUDA_CALL(call) fsdp_gpu_cuda_status((call), #call, __FILE__, __LINE__, __func__)
#define FSDP_CUBLAS_CALL(call) fsdp_gpu_cublas_status((call), #call, __FILE__, __LINE__, __func__)
#define FSDP_NCCL_CALL(call) fsdp_gpu_nccl_status((call), #call, __FILE__, __LINE__, __func__)

/* watch.c: the clock, naps, and the watchdog every host wait runs while collectives are in
 * flight. */
double fsdp_gpu_now(void); /* CLOCK_MONOTONIC, seconds */
/* Starts a poll of the given kind now (poll.h). */
void fsdp_gpu_poll_begin(fsdp_gpu_poll_t *p, fsdp_gpu_poll_kind_t kind);
/* The pause between two polls that found the operation pending: nothing, a yield or a nap. */
void fsdp_gpu_pause(fsdp_gpu_poll_t *p);
/* 1 when more than the collective timeout has passed since t0 (never when it is <= 0). */
int fsdp_gpu_timed_out(const fsdp_gpu_dev_t *gdev, double t0);
/* Revokes, then aborts, every communicator of the rank and remembers why in gdev->failed. */
void fsdp_gpu_fail_all(fsdp_gpu_dev_t *gdev, fsdp_status_t status);
/* Watches a collective just enqueued on stream (the ring has room: the watchdog made it), and
 * waits for it when collectives are blocking. */
fsdp_status_t fsdp_gpu_watch_add(fsdp_gpu_dev_t *gdev, fsdp_gpu_group_t *g, cudaStream_t stream,
                                 const char *what);
/* Checks every communicator for asynchronous errors and the oldest collective in flight for
 * the timeout; retires the collectives that have finished. On failure every communicator is
 * aborted and the status is remembered in gdev->failed. */
fsdp_status_t fsdp_gpu_watchdog(fsdp_gpu_dev_t *gdev);
/* Retires the collectives that have finished, oldest first (no timeout, no communicator
 * check): a wait that succeeded calls it, so that later waits take the fast path once nothing
 * is in flight. On a device error every communicator is aborted. */
fsdp_status_t fsdp_gpu_watch_retire(fsdp_gpu_dev_t *gdev);
/* Waits (bounded by the timeout) until no collective is in flight. */
fsdp_status_t fsdp_gpu_watch_drain(fsdp_gpu_dev_t *gdev);
/* Polls until the event (or, with ev NULL, the stream) is done, running the watchdog between
 * polls while collectives are in flight. */
fsdp_status_t fsdp_gpu_host_wait(fsdp_gpu_dev_t *gdev, cudaEvent_t ev, cudaStream_t stream,
                                 const char *what);

/* stream.c */
fsdp_status_t fsdp_gpu_stream_init(fsdp_gpu_dev_t *gdev, fsdp_gpu_stream_t *s, int id,
                                   const char *name, int priority);
void fsdp_gpu_stream_fini(fsdp_gpu_stream_t *s);

/* coll.c */
fsdp_status_t fsdp_gpu_world_create(fsdp_gpu_dev_t *gdev, const ncclUniqueId *id);
/* Destroys every live group (the world last); aborts their communicators when `abort`. */
void fsdp_gpu_groups_destroy(fsdp_gpu_dev_t *gdev, int abort);

/* kernel.c / kernels.cu */
/* The stream's cuBLAS handle, made and bound to it on first use. */
fsdp_status_t fsdp_gpu_stream_cublas(fsdp_gpu_stream_t *s, cublasHandle_t *handle_p);
/* Loads every kernel of kernels.cu (cudaFuncGetAttributes), so no launch loads a module. */
fsdp_status_t fsdp_gpu_load_kernels(void);
/* Loads cuBLAS's kernels for each dtype pair of the GEMM slot by running one small GEMM of
 * each, plain and batched, on the compute stream, and waits for them; at init, before any
 * collective. */
fsdp_status_t fsdp_gpu_load_gemms(fsdp_gpu_dev_t *gdev);
fsdp_status_t fsdp_gpu_kernel(fsdp_dev_t *dev, fsdp_stream_t *stream, const fsdp_kernel_t *k);
/* Launches any kind but GEMM on the stream; the descriptor has been validated. */
fsdp_status_t fsdp_gpu_launch(fsdp_gpu_stream_t *stream, const fsdp_kernel_t *k);
/* The Llama kinds (lib/kernels/llama_bodies.h), kernels_llama.cu: a launch per pass. */
fsdp_status_t fsdp_gpu_launch_llama(fsdp_gpu_stream_t *stream, const fsdp_kernel_t *k);
/* Loads every kernel of kernels_llama.cu, as fsdp_gpu_load_kernels those of kernels.cu. */
fsdp_status_t fsdp_gpu_load_llama_kernels(void);
/* c[r * ldc + j] = beta == 0 ? 0 : beta * c[r * ldc + j] for r < rows, j < cols, computed in
 * f32 and stored in dtype. */
fsdp_status_t fsdp_gpu_scale_matrix(fsdp_gpu_stream_t *stream, void *c, fsdp_dtype_t dtype,
                                    size_t rows, size_t cols, size_t ldc, float beta);
/* The epilogue of the GEMM descriptor k (kernel.h), element by element through the shared body:
 * C[i, j] (of k's c_dtype and ldc) = epilogue(w[i * ldw + j]), w the product in f32 (C itself
 * when C is f32). */
fsdp_status_t fsdp_gpu_gemm_epilogue(fsdp_gpu_stream_t *stream, const fsdp_kernel_t *k,
                                     const float *w, size_t ldw);
/* w[i * n + j] = C[i * ldc + j] widened to f32, for i < m, j < n. */
fsdp_status_t fsdp_gpu_widen_matrix(fsdp_gpu_stream_t *stream, float *w, const void *c,
                                    fsdp_dtype_t dtype, size_t m, size_t n, size_t ldc);

/* The ops table's slots, by file. */
fsdp_status_t fsdp_gpu_segment_alloc(fsdp_dev_t *dev, fsdp_memkind_t kind, size_t bytes,
                                     void **ptr_p);
void fsdp_gpu_segment_free(fsdp_dev_t *dev, fsdp_memkind_t kind, void *ptr);
fsdp_stream_t *fsdp_gpu_compute_stream(fsdp_dev_t *dev);
fsdp_status_t fsdp_gpu_stream_create(fsdp_dev_t *dev, const char *name, int priority,
                                     fsdp_stream_t **stream_p);
void fsdp_gpu_stream_destroy(fsdp_dev_t *dev, fsdp_stream_t *stream);
fsdp_status_t fsdp_gpu_stream_synchronize(fsdp_dev_t *dev, fsdp_stream_t *stream);
fsdp_status_t fsdp_gpu_event_create(fsdp_dev_t *dev, fsdp_event_t **event_p);
void fsdp_gpu_event_destroy(fsdp_dev_t *dev, fsdp_event_t *event);
fsdp_status_t fsdp_gpu_event_record(fsdp_dev_t *dev, fsdp_event_t *event, fsdp_stream_t *stream);
fsdp_status_t fsdp_gpu_stream_wait_event(fsdp_dev_t *dev, fsdp_stream_t *stream,
                                         fsdp_event_t *event);
fsdp_status_t fsdp_gpu_event_query(fsdp_dev_t *dev, fsdp_event_t *event, int *done_p);
fsdp_status_t fsdp_gpu_event_synchronize(fsdp_dev_t *dev, fsdp_event_t *event);
double fsdp_gpu_host_time(fsdp_dev_t *dev);
fsdp_status_t fsdp_gpu_memcpy_async(fsdp_dev_t *dev, void *dst, const void *src, size_t bytes,
                                    fsdp_stream_t *stream);
fsdp_group_t *fsdp_gpu_group_world(fsdp_dev_t *dev);
fsdp_status_t fsdp_gpu_group_split(fsdp_dev_t *dev, fsdp_group_t *parent, int color, int key,
                                   fsdp_group_t **group_p);
void fsdp_gpu_group_destroy(fsdp_dev_t *dev, fsdp_group_t *group);
fsdp_status_t fsdp_gpu_all_gather(fsdp_dev_t *dev, fsdp_group_t *group, const void *send,
                                  void *recv, size_t count, fsdp_dtype_t dtype,
                                  fsdp_stream_t *stream);
fsdp_status_t fsdp_gpu_reduce_scatter(fsdp_dev_t *dev, fsdp_group_t *group, const void *send,
                                      void *recv, size_t count, fsdp_dtype_t dtype,
                                      fsdp_reduce_op_t op, fsdp_stream_t *stream);
fsdp_status_t fsdp_gpu_all_reduce(fsdp_dev_t *dev, fsdp_group_t *group, const void *send,
                                  void *recv, size_t count, fsdp_dtype_t dtype, fsdp_reduce_op_t op,
                                  fsdp_stream_t *stream);
fsdp_status_t fsdp_gpu_broadcast(fsdp_dev_t *dev, fsdp_group_t *group, void *buf, size_t count,
                                 fsdp_dtype_t dtype, int root, fsdp_stream_t *stream);
fsdp_status_t fsdp_gpu_barrier(fsdp_dev_t *dev, fsdp_group_t *group);

#ifdef __cplusplus
}
#endif
#endif
