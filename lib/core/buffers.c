/* Module buffers: whole on every rank, cast to buffer_dtype at lazy init, read and written from
 * the host (MixedPrecision.buffer_dtype, sync_module_states). */
#include "core/core_int.h"

#include <fsdp/trace.h>

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void fsdp_buffers_free(fsdp_t *fs, fsdp_unit_t *u)
{
    for (int i = 0; i < u->nbuffers; i++) {
        fsdp_mem_free(fs->mem, u->buffers[i].data);
        free((char *)u->buffers[i].info.name);
    }
    free(u->buffers);
    u->buffers = NULL;
    u->nbuffers = 0;
}

/* The unit's module buffers: checked, then zeroed f32 device memory each. */
fsdp_status_t fsdp_buffers_create(fsdp_t *fs, fsdp_unit_t *u, const fsdp_unit_options_t *o,
                                  const fsdp_param_spec_t *params, int nparams)
{
    fsdp_status_t status = FSDP_OK;

    if (o->nbuffers < 0 || (o->nbuffers > 0 && o->buffers == NULL))
        return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                         "unit '%s': buffers must hold nbuffers (>= 0) specs", u->name);
    for (int i = 0; i < o->nbuffers; i++) {
        const fsdp_buffer_spec_t *b = &o->buffers[i];
        int taken = 0;
        if (b->name == NULL || b->name[0] == '\0')
            return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM, "unit '%s': buffer %d has no name",
                             u->name, i);
        for (int j = 0; j < nparams; j++)
            taken |= strcmp(params[j].name, b->name) == 0;
        for (int j = 0; j < i; j++)
            taken |= strcmp(o->buffers[j].name, b->name) == 0;
        if (taken || fsdp_name_taken(fs, b->name))
            return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                             "unit '%s': buffer name '%s' is already used by a parameter or "
                             "buffer",
                             u->name, b->name);
        if (b->ndim < 0 || b->ndim > FSDP_MAX_DIMS)
            return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                             "unit '%s': buffer '%s' has %d dimensions; 0 to %d are allowed",
                             u->name, b->name, b->ndim, FSDP_MAX_DIMS);
        for (int d = 0; d < b->ndim; d++) {
            if (b->shape[d] < 0)
                return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM,
                                 "unit '%s': buffer '%s' has negative dimension %lld", u->name,
                                 b->name, (long long)b->shape[d]);
        }
    }
    u->buffers = calloc((size_t)o->nbuffers + 1, sizeof(*u->buffers));
    if (u->buffers == NULL)
        return FSDP_ERR_NO_MEMORY;
    for (int i = 0; i < o->nbuffers && status == FSDP_OK; i++) {
        fsdp_buffer_t *b = &u->buffers[i];
        size_t numel = 1;
        b->info.name = strdup(o->buffers[i].name);
        if (b->info.name == NULL) {
            status = FSDP_ERR_NO_MEMORY;
            break;
        }
        u->nbuffers++;
        b->info.ndim = o->buffers[i].ndim;
        for (int d = 0; d < b->info.ndim; d++) {
            b->info.shape[d] = o->buffers[i].shape[d];
            numel *= (size_t)b->info.shape[d];
        }
        b->info.numel = b->info.numel_in_shard = numel;
        b->info.tied_to = -1;
        b->info.in_shard = numel > 0;
        b->dtype = FSDP_DTYPE_F32;
        status = fsdp_mem_alloc(fs->mem, numel * sizeof(float), FSDP_MEM_UNSHARDED_PARAM,
                                fs->compute, &b->data);
        if (status == FSDP_OK)
            status = fsdp_k_fill(fs, fs->compute, b->data, FSDP_DTYPE_F32, numel, 0.0);
    }
    if (status != FSDP_OK)
        fsdp_buffers_free(fs, u);
    return status;
}

/* Casts one buffer's storage to `dtype` on the compute stream. */
static fsdp_status_t cast_buffer(fsdp_t *fs, fsdp_buffer_t *b, fsdp_dtype_t dtype)
{
    void *to = NULL;
    fsdp_status_t status;

    if (b->dtype == dtype)
        return FSDP_OK;
    status = fsdp_mem_alloc(fs->mem, b->info.numel * fsdp_dtype_size(dtype),
                            FSDP_MEM_UNSHARDED_PARAM, fs->compute, &to);
    if (status == FSDP_OK)
        status = fsdp_k_cast(fs, fs->compute, to, dtype, b->data, b->dtype, b->info.numel);
    if (status != FSDP_OK) {
        fsdp_mem_free(fs->mem, to);
        return status;
    }
    fsdp_mem_free(fs->mem, b->data);
    b->data = to;
    b->dtype = dtype;
    return FSDP_OK;
}

fsdp_status_t fsdp_cast_buffers(fsdp_t *fs, fsdp_dtype_t dtype)
{
    fsdp_status_t status = FSDP_OK;

    for (int i = 0; i < fs->nunits && status == FSDP_OK; i++) {
        for (int j = 0; j < fs->units[i]->nbuffers && status == FSDP_OK; j++)
            status = cast_buffer(fs, &fs->units[i]->buffers[j], dtype);
    }
    return status;
}

static fsdp_buffer_t *buffer_at(const fsdp_unit_t *u, int index)
{
    return index >= 0 && index < u->nbuffers ? &u->buffers[index] : NULL;
}

int fsdp_unit_num_buffers(const fsdp_unit_t *u)
{
    return u->nbuffers;
}

fsdp_status_t fsdp_unit_buffer_info(const fsdp_unit_t *u, int index, fsdp_param_info_t *info_p)
{
    const fsdp_buffer_t *b = buffer_at(u, index);
    if (b == NULL)
        return FSDP_ERR_INVALID_PARAM;
    *info_p = b->info;
    return FSDP_OK;
}

void *fsdp_unit_buffer(fsdp_unit_t *u, int index, fsdp_dtype_t *dtype_p)
{
    const fsdp_buffer_t *b = buffer_at(u, index);
    if (dtype_p != NULL)
        *dtype_p = b ? b->dtype : FSDP_DTYPE_F32;
    return b ? b->data : NULL;
}

/* Copies numel f32 between host and a buffer of any dtype, through a device f32 staging copy
 * when the buffer is in low precision. */
static fsdp_status_t buffer_copy(fsdp_t *fs, fsdp_buffer_t *b, float *host, int to_host)
{
    fsdp_dev_t *dev = fs->dev;
    size_t bytes = b->info.numel * sizeof(float);
    void *f32 = b->data;
    fsdp_status_t status = FSDP_OK;

    if (b->dtype != FSDP_DTYPE_F32)
        status = fsdp_mem_alloc(fs->mem, bytes, FSDP_MEM_TEMPORARY, fs->compute, &f32);
    if (status == FSDP_OK && to_host && f32 != b->data)
        status =
            fsdp_k_cast(fs, fs->compute, f32, FSDP_DTYPE_F32, b->data, b->dtype, b->info.numel);
    if (status == FSDP_OK)
        status = to_host ? fsdp_dev_memcpy_async(dev, host, f32, bytes, fs->compute)
                         : fsdp_dev_memcpy_async(dev, f32, host, bytes, fs->compute);
    if (status == FSDP_OK && !to_host && f32 != b->data)
        status =
            fsdp_k_cast(fs, fs->compute, b->data, b->dtype, f32, FSDP_DTYPE_F32, b->info.numel);
    if (status == FSDP_OK)
        status = fsdp_dev_stream_synchronize(dev, fs->compute);
    if (f32 != b->data)
        fsdp_mem_free(fs->mem, f32);
    return status;
}

fsdp_status_t fsdp_unit_get_buffer(fsdp_unit_t *u, int index, float *host_out)
{
    fsdp_buffer_t *b = buffer_at(u, index);

    if (b == NULL || host_out == NULL)
        return fsdp_fail(u->fs, FSDP_ERR_INVALID_PARAM,
                         "unit '%s': no buffer %d to read (it has %d)", u->name, index,
                         u->nbuffers);
    return buffer_copy(u->fs, b, host_out, 1);
}

fsdp_status_t fsdp_unit_set_buffer(fsdp_unit_t *u, int index, const float *host_values)
{
    fsdp_t *fs = u->fs;
    fsdp_buffer_t *b = buffer_at(u, index);
    float *vals;
    fsdp_status_t status = FSDP_OK;

    if (b == NULL || host_values == NULL)
        return fsdp_fail(fs, FSDP_ERR_INVALID_PARAM, "unit '%s': no buffer %d to set (it has %d)",
                         u->name, index, u->nbuffers);
    if (u->state != FSDP_STATE_IDLE)
        return fsdp_fail(fs, FSDP_ERR_STATE,
                         "unit '%s': setting a buffer needs the unit idle, "
                         "not in forward or backward",
                         u->name);
    vals = malloc(b->info.numel * sizeof(float) + 1);
    if (vals == NULL)
        return FSDP_ERR_NO_MEMORY;
    if (fs->cfg.sync_module_states && !fs->dev->no_data)
        status = fsdp_broadcast_from_rank0(fs, host_values, b->info.numel, vals);
    else
        memcpy(vals, host_values, b->info.numel * sizeof(float));
    if (status == FSDP_OK)
        status = buffer_copy(fs, b, vals, 0);
    free(vals);
    return status;
}
