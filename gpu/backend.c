/* The gpu backend: its ops table, making and finalizing a rank's device context, and the entry
 * table through which libfsdp reaches them (module.h): the module's one exported symbol. */
#include "config.h"

#include "gpu_trace.h"
#include "module.h"

#include <fsdp/version.h>

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(ncclUniqueId) == FSDP_GPU_UNIQUE_ID_BYTES,
               "FSDP_GPU_UNIQUE_ID_BYTES must be NCCL_UNIQUE_ID_BYTES");

static const fsdp_backend_ops_t gpu_ops = {
    .size = sizeof(fsdp_backend_ops_t),
    .name = "gpu",
    .segment_alloc = fsdp_gpu_segment_alloc,
    .segment_free = fsdp_gpu_segment_free,
    .compute_stream = fsdp_gpu_compute_stream,
    .stream_create = fsdp_gpu_stream_create,
    .stream_destroy = fsdp_gpu_stream_destroy,
    .stream_synchronize = fsdp_gpu_stream_synchronize,
    .event_create = fsdp_gpu_event_create,
    .event_destroy = fsdp_gpu_event_destroy,
    .event_record = fsdp_gpu_event_record,
    .stream_wait_event = fsdp_gpu_stream_wait_event,
    .event_query = fsdp_gpu_event_query,
    .event_synchronize = fsdp_gpu_event_synchronize,
    .host_time = fsdp_gpu_host_time,
    .memcpy_async = fsdp_gpu_memcpy_async,
    .group_world = fsdp_gpu_group_world,
    .group_split = fsdp_gpu_group_split,
    .group_destroy = fsdp_gpu_group_destroy,
    .all_gather = fsdp_gpu_all_gather,
    .reduce_scatter = fsdp_gpu_reduce_scatter,
    .all_reduce = fsdp_gpu_all_reduce,
    .broadcast = fsdp_gpu_broadcast,
    .barrier = fsdp_gpu_barrier,
    .kernel = fsdp_gpu_kernel,
};

/* Whether why there is no device has been said: once per process, at warning level or in
 * describe()'s line, whichever comes first (a one-line refusal that prints that line says it). */
static atomic_int no_device_said;

static int device_count(void)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);

    if (err != cudaSuccess) {
        /* A machine without a device simply has none; any other cause (a driver older than the
         * runtime, a broken install) is what the user must see. */
        if (err == cudaErrorNoDevice || atomic_exchange(&no_device_said, 1))
            fsdp_debug("no CUDA device: cudaGetDeviceCount: %s (%s)", cudaGetErrorString(err),
                       cudaGetErrorName(err));
        else
            fsdp_warn("no CUDA device usable: cudaGetDeviceCount: %s (%s)", cudaGetErrorString(err),
                      cudaGetErrorName(err));
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

/* Appends to buf at *len, as snprintf, never past size. */
static void append(char *buf, size_t size, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t size, size_t *len, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (*len + 1 >= size)
        return;
    va_start(ap, fmt);
    n = vsnprintf(buf + *len, size - *len, fmt, ap);
    va_end(ap);
    if (n > 0)
        *len = *len + (size_t)n < size ? *len + (size_t)n : size - 1;
}

/* "driver 13.0, runtime 13.0, NCCL 2.28.9, cuBLAS 13.0.0; 1 device: 0 NAME (sm_90, 79.2 GiB)" */
static void describe(char *buf, size_t size)
{
    int drv = 0, rt = 0, nccl = 0, cb[3] = {0, 0, 0}, n = 0;
    size_t len = 0;
    cudaError_t err;

    buf[0] = '\0';
    if (cudaDriverGetVersion(&drv) != cudaSuccess)
        drv = 0;
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess)
        rt = 0;
    if (ncclGetVersion(&nccl) != ncclSuccess)
        nccl = 0;
    (void)cublasGetProperty(MAJOR_VERSION, &cb[0]);
    (void)cublasGetProperty(MINOR_VERSION, &cb[1]);
    (void)cublasGetProperty(PATCH_LEVEL, &cb[2]);
    if (drv > 0)
        append(buf, size, &len, "driver %d.%d", drv / 1000, drv % 1000 / 10);
    else
        append(buf, size, &len, "driver none");
    append(buf, size, &len, ", runtime %d.%d, NCCL %d.%d.%d, cuBLAS %d.%d.%d", rt / 1000,
           rt % 1000 / 10, nccl / 10000, nccl % 10000 / 100, nccl % 100, cb[0], cb[1], cb[2]);
    err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        atomic_store(&no_device_said, 1);
        append(buf, size, &len, "; no device: cudaGetDeviceCount: %s (%s)", cudaGetErrorString(err),
               cudaGetErrorName(err));
        (void)cudaGetLastError();
        return;
    }
    append(buf, size, &len, "; %d device%s", n, n == 1 ? "" : "s");
    for (int i = 0; i < n; i++) {
        struct cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
            (void)cudaGetLastError();
            append(buf, size, &len, "%s %d (no properties)", i == 0 ? ":" : ",", i);
            continue;
        }
        append(buf, size, &len, "%s %d %s (sm_%d%d, %.1f GiB)", i == 0 ? ":" : ",", i, prop.name,
               prop.major, prop.minor, (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    }
}

static fsdp_status_t unique_id(fsdp_gpu_unique_id_t *id_p)
{
    ncclUniqueId id;
    fsdp_status_t status;

    if (id_p == NULL) {
        fsdp_error("fsdp_gpu_unique_id: id_p is NULL");
        return FSDP_ERR_INVALID_PARAM;
    }
    status = FSDP_NCCL_CALL(ncclGetUniqueId(&id));
    if (status != FSDP_OK)
        return status;
    memcpy(id_p->bytes, &id, sizeof(id));
    return FSDP_OK;
}

/* Frees what init made, in reverse order; accepts a partly made dev. */
static void dev_free(fsdp_gpu_dev_t *gdev)
{
    fsdp_gpu_trace_fini(gdev);
    for (int i = 0; i < FSDP_GPU_WATCH_SLOTS; i++) {
        if (gdev->watch[i].done != NULL)
            (void)FSDP_CUDA_CALL(cudaEventDestroy(gdev->watch[i].done));
    }
    if (gdev->dbuf != NULL)
        (void)FSDP_CUDA_CALL(cudaFree(gdev->dbuf));
    if (gdev->aux != NULL)
        (void)FSDP_CUDA_CALL(cudaStreamDestroy(gdev->aux));
    fsdp_gpu_stream_fini(&gdev->compute);
    free(gdev);
}

static fsdp_status_t check_params(const fsdp_gpu_params_t *p)
{
    if (p->world_size < 1 || p->rank < 0 || p->rank >= p->world_size) {
        fsdp_error("fsdp_gpu_init: rank %d of world size %d (needs 0 <= rank < world_size)",
                   p->rank, p->world_size);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (p->local_size < 0 || p->local_rank < 0 ||
        (p->local_size > 0 && p->local_rank >= p->local_size)) {
        fsdp_error("rank %d: fsdp_gpu_init: local rank %d of local size %d (needs 0 <= "
                   "local_rank < local_size, local_size 0 for world_size)",
                   p->rank, p->local_rank, p->local_size);
        return FSDP_ERR_INVALID_PARAM;
    }
    return FSDP_OK;
}

static int id_is_zero(const fsdp_gpu_unique_id_t *id)
{
    for (size_t i = 0; i < sizeof(id->bytes); i++) {
        if (id->bytes[i] != 0)
            return 0;
    }
    return 1;
}

static fsdp_status_t init(const fsdp_gpu_params_t *params, fsdp_dev_t **dev_p)
{
    fsdp_gpu_unique_id_t uid;
    fsdp_gpu_dev_t *gdev;
    fsdp_status_t status;
    ncclUniqueId id;
    int ndev = 0, device;

    if (params == NULL || dev_p == NULL) {
        fsdp_error("fsdp_gpu_init: %s is NULL", params == NULL ? "params" : "dev_p");
        return FSDP_ERR_INVALID_PARAM;
    }
    status = check_params(params);
    if (status != FSDP_OK)
        return status;
    fsdp_gpu_set_log_rank(params->rank);

    status = FSDP_CUDA_CALL(cudaGetDeviceCount(&ndev));
    if (status != FSDP_OK)
        return status == FSDP_ERR_BACKEND ? FSDP_ERR_NO_DEVICE : status;
    device = params->device >= 0 ? params->device : params->local_rank;
    if (ndev == 0 || device >= ndev) {
        const char *visible = getenv("CUDA_VISIBLE_DEVICES");
        fsdp_error("rank %d: fsdp_gpu_init: device %d does not exist: %d visible "
                   "(CUDA_VISIBLE_DEVICES=%s)",
                   params->rank, device, ndev, visible != NULL ? visible : "unset");
        return ndev == 0 ? FSDP_ERR_NO_DEVICE : FSDP_ERR_INVALID_PARAM;
    }

    uid = params->unique_id;
    if (id_is_zero(&uid)) {
        if (params->world_size > 1) {
            fsdp_error("rank %d: fsdp_gpu_init: params.unique_id is unset: rank 0 makes one "
                       "with fsdp_gpu_unique_id() and every rank passes the same bytes",
                       params->rank);
            return FSDP_ERR_INVALID_PARAM;
        }
        status = unique_id(&uid);
        if (status != FSDP_OK)
            return status;
    }
    memcpy(&id, uid.bytes, sizeof(id));

    status = FSDP_CUDA_CALL(cudaSetDevice(device));
    if (status != FSDP_OK)
        return status;
    gdev = calloc(1, sizeof(*gdev));
    if (gdev == NULL)
        return FSDP_ERR_NO_MEMORY;
    gdev->super.ops = &gpu_ops;
    gdev->super.rank = params->rank;
    gdev->super.world_size = params->world_size;
    gdev->super.local_rank = params->local_rank;
    gdev->super.local_size = params->local_size > 0 ? params->local_size : params->world_size;
    gdev->device = device;
    gdev->timeout_s = params->timeout_s;
    gdev->blocking_collectives = params->blocking_collectives != 0;
    gdev->failed = FSDP_OK;
    fsdp_gpu_ring_init(&gdev->ring, FSDP_GPU_WATCH_SLOTS);

    status =
        FSDP_CUDA_CALL(cudaDeviceGetStreamPriorityRange(&gdev->prio_least, &gdev->prio_greatest));
    if (status != FSDP_OK)
        goto err_free;
    status = fsdp_gpu_stream_init(gdev, &gdev->compute, 0, "compute", 0);
    if (status != FSDP_OK)
        goto err_free;
    gdev->next_stream_id = 1;
    status = FSDP_CUDA_CALL(cudaStreamCreateWithFlags(&gdev->aux, cudaStreamNonBlocking));
    if (status != FSDP_OK)
        goto err_free;
    status = fsdp_gpu_stream_cublas(&gdev->compute, &(cublasHandle_t){NULL});
    if (status != FSDP_OK)
        goto err_free;
    /* Barrier word, then room for the (color, key) exchange of a split of the world. */
    status = FSDP_CUDA_CALL(
        cudaMalloc((void **)&gdev->dbuf, (2 + 2 * (size_t)params->world_size) * sizeof(int)));
    if (status != FSDP_OK)
        goto err_free;
    /* On aux, where the barrier and the split read and write it: a plain cudaMemset runs on the
     * legacy default stream, which a non-blocking stream is not ordered after. */
    status = FSDP_CUDA_CALL(cudaMemsetAsync(gdev->dbuf, 0, sizeof(int), gdev->aux));
    if (status != FSDP_OK)
        goto err_free;
    for (int i = 0; i < FSDP_GPU_WATCH_SLOTS; i++) {
        status =
            FSDP_CUDA_CALL(cudaEventCreateWithFlags(&gdev->watch[i].done, cudaEventDisableTiming));
        if (status != FSDP_OK)
            goto err_free;
    }
    /* Every kernel loaded now, on an idle device, never at a first launch behind a collective
     * (kernels.cu, kernels_llama.cu); cuBLAS's at least for one shape per dtype pair. */
    status = fsdp_gpu_load_kernels();
    if (status == FSDP_OK)
        status = fsdp_gpu_load_llama_kernels();
    if (status == FSDP_OK)
        status = fsdp_gpu_load_gemms(gdev);
    if (status != FSDP_OK)
        goto err_free;
    status = fsdp_gpu_trace_init(gdev);
    if (status != FSDP_OK)
        goto err_free;
    status = fsdp_gpu_world_create(gdev, &id);
    if (status != FSDP_OK)
        goto err_free;

    fsdp_debug("rank %d: gpu backend on device %d (world %d, local rank %d of %d, timeout %g s)",
               gdev->super.rank, device, gdev->super.world_size, gdev->super.local_rank,
               gdev->super.local_size, gdev->timeout_s);
    *dev_p = &gdev->super;
    return FSDP_OK;

err_free:
    dev_free(gdev);
    return status;
}

static void finalize(fsdp_dev_t *dev)
{
    fsdp_gpu_dev_t *gdev;

    if (dev == NULL)
        return;
    gdev = fsdp_gpu_dev_of(dev);
    /* Events still in the trace hold this dev's timers: resolved and handed over now. */
    fsdp_trace_detach(dev);
    (void)FSDP_CUDA_CALL(cudaSetDevice(gdev->device));
    /* Work still queued must not outlive the buffers and communicators it uses; every wait is
     * bounded by the timeout, after which the communicators are aborted. */
    if (fsdp_gpu_watch_drain(gdev) == FSDP_OK) {
        (void)fsdp_gpu_host_wait(gdev, NULL, gdev->compute.cu, "compute stream at finalize");
        (void)fsdp_gpu_host_wait(gdev, NULL, gdev->aux, "internal stream at finalize");
    }
    fsdp_gpu_groups_destroy(gdev, gdev->failed != FSDP_OK);
    dev_free(gdev);
}

static const fsdp_gpu_module_t gpu_module = {
    .size = sizeof(fsdp_gpu_module_t),
    .abi = FSDP_GPU_MODULE_ABI,
    .version = FSDP_VERSION_STRING,
    .ops = &gpu_ops,
    .device_count = device_count,
    .unique_id = unique_id,
    .init = init,
    .finalize = finalize,
    .set_log_rank = fsdp_gpu_set_log_rank,
    .log_rank = fsdp_gpu_log_rank,
    .describe = describe,
};

const fsdp_gpu_module_t *fsdp_gpu_module_v2(void)
{
    return &gpu_module;
}
