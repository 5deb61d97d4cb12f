/* sync_module_states: rank 0's values of a parameter or buffer, broadcast to every rank. */
#include "core/core_int.h"

#include <fsdp/trace.h>

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* sync_module_states: rank 0's n values of `host_values`, broadcast over the world in buckets
 * (docs/runtime.md section 4: 250 MiB), into host_out on every rank. A collective. */
fsdp_status_t fsdp_broadcast_from_rank0(fsdp_t *fs, const float *host_values, size_t numel,
                                        float *host_out)
{
    fsdp_dev_t *dev = fs->dev;
    fsdp_group_t *world = fsdp_dev_group_world(dev);
    size_t bucket = fs->cfg.sync_bucket_bytes ? fs->cfg.sync_bucket_bytes : (size_t)250 << 20;
    size_t per = bucket / sizeof(float) ? bucket / sizeof(float) : 1;
    void *d = NULL;
    fsdp_status_t status;

    status = fsdp_mem_alloc(fs->mem, (numel < per ? numel : per) * sizeof(float) + 4,
                            FSDP_MEM_COMM_BUFFER, fs->compute, &d);
    for (size_t off = 0; off < numel && status == FSDP_OK; off += per) {
        size_t n = numel - off < per ? numel - off : per;
        status = fsdp_dev_memcpy_async(dev, d, host_values + off, n * sizeof(float), fs->compute);
        if (status == FSDP_OK)
            status = fsdp_dev_broadcast(dev, world, d, n, FSDP_DTYPE_F32, 0, fs->compute);
        if (status == FSDP_OK)
            status = fsdp_dev_memcpy_async(dev, host_out + off, d, n * sizeof(float), fs->compute);
        if (status == FSDP_OK)
            status = fsdp_dev_stream_synchronize(dev, fs->compute);
    }
    fsdp_mem_free(fs->mem, d);
    return status;
}
