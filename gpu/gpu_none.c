/* The gpu backend where the library was built without CUDA and NCCL: the same entry points,
 * no device, and an ops table whose every slot answers FSDP_ERR_UNSUPPORTED (no NULL slot). */
#include "config.h"

#include <fsdp/gpu.h>
#include <fsdp/log.h>

#include <time.h>

static fsdp_status_t none_segment_alloc(fsdp_dev_t *dev, fsdp_memkind_t kind, size_t bytes,
                                        void **ptr_p)
{
    return FSDP_ERR_UNSUPPORTED;
}

static void none_segment_free(fsdp_dev_t *dev, fsdp_memkind_t kind, void *ptr) {}

static fsdp_stream_t *none_compute_stream(fsdp_dev_t *dev)
{
    return NULL;
}

static fsdp_status_t none_stream_create(fsdp_dev_t *dev, const char *name, int priority,
                                        fsdp_stream_t **stream_p)
{
    return FSDP_ERR_UNSUPPORTED;
}

static void none_stream_destroy(fsdp_dev_t *dev, fsdp_stream_t *stream) {}

static fsdp_status_t none_stream_synchronize(fsdp_dev_t *dev, fsdp_stream_t *stream)
{
    return FSDP_ERR_UNSUPPORTED;
}

static fsdp_status_t none_event_create(fsdp_dev_t *dev, fsdp_event_t **event_p)
{
    return FSDP_ERR_UNSUPPORTED;
}

static void none_event_destroy(fsdp_dev_t *dev, fsdp_event_t *event) {}

static fsdp_status_t none_event_record(fsdp_dev_t *dev, fsdp_event_t *event, fsdp_stream_t *stream)
{
    return FSDP_ERR_UNSUPPORTED;
}

static fsdp_status_t none_stream_wait_event(fsdp_dev_t *dev, fsdp_stream_t *stream,
                                            fsdp_event_t *event)
{
    return FSDP_ERR_UNSUPPORTED;
}

static fsdp_status_t none_event_query(fsdp_dev_t *dev, fsdp_event_t *event, int *done_p)
{
    return FSDP_ERR_UNSUPPORTED;
}

static fsdp_status_t none_event_synchronize(fsdp_dev_t *dev, fsdp_event_t *event)
{
    return FSDP_ERR_UNSUPPORTED;
}

/* The host clock needs no device. */
static double none_host_time(fsdp_dev_t *dev)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static fsdp_status_t none_memcpy_async(fsdp_dev_t *dev, void *dst, const void *src, size_t bytes,
                                       fsdp_stream_t *stream)
{
    return FSDP_ERR_UNSUPPORTED;
}

static fsdp_group_t *none_group_world(fsdp_dev_t *dev)
{
    return NULL;
}

static fsdp_status_t none_group_split(fsdp_dev_t *dev, fsdp_group_t *parent, int color, int key,
                                      fsdp_group_t **group_p)
{
    return FSDP_ERR_UNSUPPORTED;
}

static void none_group_destroy(fsdp_dev_t *dev, fsdp_group_t *group) {}

static fsdp_status_t none_all_gather(fsdp_dev_t *dev, fsdp_group_t *group, const void *send,
                                     void *recv, size_t count, fsdp_dtype_t dtype,
                                     fsdp_stream_t *stream)
{
    return FSDP_ERR_UNSUPPORTED;
}

static fsdp_status_t none_reduce_scatter(fsdp_dev_t *dev, fsdp_group_t *group, const void *send,
                                         void *recv, size_t count, fsdp_dtype_t dtype,
                                         fsdp_reduce_op_t op, fsdp_stream_t *stream)
{
    return FSDP_ERR_UNSUPPORTED;
}

static fsdp_status_t none_all_reduce(fsdp_dev_t *dev, fsdp_group_t *group, const void *send,
                                     void *recv, size_t count, fsdp_dtype_t dtype,
                                     fsdp_reduce_op_t op, fsdp_stream_t *stream)
{
    return FSDP_ERR_UNSUPPORTED;
}

static fsdp_status_t none_broadcast(fsdp_dev_t *dev, fsdp_group_t *group, void *buf, size_t count,
                                    fsdp_dtype_t dtype, int root, fsdp_stream_t *stream)
{
    return FSDP_ERR_UNSUPPORTED;
}

static fsdp_status_t none_barrier(fsdp_dev_t *dev, fsdp_group_t *group)
{
    return FSDP_ERR_UNSUPPORTED;
}

static fsdp_status_t none_kernel(fsdp_dev_t *dev, fsdp_stream_t *stream, const fsdp_kernel_t *k)
{
    return FSDP_ERR_UNSUPPORTED;
}

static const fsdp_backend_ops_t none_ops = {
    .size = sizeof(fsdp_backend_ops_t),
    .name = "gpu (not built)",
    .segment_alloc = none_segment_alloc,
    .segment_free = none_segment_free,
    .compute_stream = none_compute_stream,
    .stream_create = none_stream_create,
    .stream_destroy = none_stream_destroy,
    .stream_synchronize = none_stream_synchronize,
    .event_create = none_event_create,
    .event_destroy = none_event_destroy,
    .event_record = none_event_record,
    .stream_wait_event = none_stream_wait_event,
    .event_query = none_event_query,
    .event_synchronize = none_event_synchronize,
    .host_time = none_host_time,
    .memcpy_async = none_memcpy_async,
    .group_world = none_group_world,
    .group_split = none_group_split,
    .group_destroy = none_group_destroy,
    .all_gather = none_all_gather,
    .reduce_scatter = none_reduce_scatter,
    .all_reduce = none_all_reduce,
    .broadcast = none_broadcast,
    .barrier = none_barrier,
    .kernel = none_kernel,
};

int fsdp_gpu_built(void)
{
    return 0;
}

int fsdp_gpu_device_count(void)
{
    return 0;
}

const fsdp_backend_ops_t *fsdp_gpu_backend(void)
{
    return &none_ops;
}

int fsdp_dev_is_gpu(const fsdp_dev_t *dev)
{
    return 0;
}

fsdp_status_t fsdp_gpu_unique_id(fsdp_gpu_unique_id_t *id_p)
{
    fsdp_error("fsdp_gpu_unique_id: libfsdp was built without the gpu backend (configure found "
               "no CUDA or NCCL)");
    return FSDP_ERR_UNSUPPORTED;
}

fsdp_status_t fsdp_gpu_init(const fsdp_gpu_params_t *params, fsdp_dev_t **dev_p)
{
    fsdp_error("fsdp_gpu_init: libfsdp was built without the gpu backend (configure found no "
               "CUDA or NCCL)");
    return FSDP_ERR_UNSUPPORTED;
}

void fsdp_gpu_finalize(fsdp_dev_t *dev) {}
