/* A model's full parameters as one safetensors file, the way the built-in models write HF
 * checkpoints: each unit is gathered in turn (a collective) and rank 0 keeps the values and
 * writes them, F32, under the names the model gives; under tensor parallelism each unit's
 * tensors are also all-gathered over the tp group and put together into the full ones. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp/safetensors.h>

#include "core/core_hidden.h"
#include "nn/nn_int.h"

typedef struct save_entry {
    char name[128];
    int64_t shape[2];
    float *data; /* under tensor parallelism, the full tensor put together */
} save_entry_t;

fsdp_status_t fsdp_nn_tp_gather(fsdp_t *fs, const float *flat, size_t n, float *all)
{
    fsdp_dev_t *dev = fsdp_device(fs);
    fsdp_group_t *g = fsdp_tp_group(fs);
    fsdp_stream_t *s = fsdp_compute_stream(fs);
    void *send = NULL, *recv = NULL;
    fsdp_status_t status =
        fsdp_mem_alloc(fsdp_memory(fs), n * sizeof(float), FSDP_MEM_TEMPORARY, s, &send);

    if (status == FSDP_OK)
        status = fsdp_mem_alloc(fsdp_memory(fs), (size_t)g->size * n * sizeof(float),
                                FSDP_MEM_TEMPORARY, s, &recv);
    if (status == FSDP_OK)
        status = fsdp_dev_memcpy_async(dev, send, flat, n * sizeof(float), s);
    if (status == FSDP_OK)
        status = fsdp_dev_all_gather(dev, g, send, recv, n, FSDP_DTYPE_F32, s);
    if (status == FSDP_OK)
        status = fsdp_dev_memcpy_async(dev, all, recv, (size_t)g->size * n * sizeof(float), s);
    if (status == FSDP_OK)
        status = fsdp_dev_stream_synchronize(dev, s);
    fsdp_mem_free(fsdp_memory(fs), recv);
    fsdp_mem_free(fsdp_memory(fs), send);
    return status;
}

fsdp_status_t fsdp_nn_tp_assemble(const fsdp_param_info_t *pi, const float *all, size_t n, int tp,
                                  int parts, float **data_p, int64_t shape[2])
{
    const size_t numel = pi->numel, cols = pi->ndim > 1 ? (size_t)pi->shape[1] : numel;
    float *d = malloc((parts != 0 ? numel * (size_t)tp : numel) * sizeof(float) + 1);

    if (d == NULL)
        return FSDP_ERR_NO_MEMORY;
    shape[0] = pi->shape[0] * (parts < 0 || (parts > 0 && pi->ndim == 1) ? tp : 1);
    shape[1] = pi->ndim > 1 ? pi->shape[1] * (parts > 0 ? tp : 1) : 0;
    for (int t = 0; t < (parts != 0 ? tp : 1); t++) {
        const float *src = all + (size_t)t * n + pi->offset;
        if (parts <= 0) {
            memcpy(d + (size_t)t * numel, src, numel * sizeof(float));
            continue;
        }
        for (size_t e = 0, w = cols / (size_t)parts; e < numel; e += w) /* a block of a row */
            memcpy(d + e / cols * cols * (size_t)tp + e % cols / w * w * (size_t)tp + (size_t)t * w,
                   src + e, w * sizeof(float));
    }
    *data_p = d;
    return FSDP_OK;
}

static fsdp_status_t save_units(fsdp_t *fs, fsdp_unit_t *root, fsdp_unit_t *const *layers,
                                int nlayers, int rank, const char *path, fsdp_nn_name_func_t name,
                                fsdp_nn_slice_func_t slice, void *arg)
{
    const int tp = fs != NULL && fsdp_tp_group(fs) != NULL ? fsdp_tp_group(fs)->size : 1;
    const int nunits = nlayers + 1;
    float **full = calloc((size_t)nunits, sizeof(*full));
    fsdp_st_entry_t *entries = NULL;
    save_entry_t *meta = NULL;
    fsdp_status_t status = FSDP_OK;
    int nent = 0, e = 0;

    for (int k = 0; k < nunits; k++)
        nent += fsdp_unit_num_params(k == 0 ? root : layers[k - 1]);
    entries = calloc((size_t)nent + 1, sizeof(*entries));
    meta = calloc((size_t)nent + 1, sizeof(*meta));
    if (full == NULL || entries == NULL || meta == NULL) {
        status = FSDP_ERR_NO_MEMORY;
        goto out;
    }
    for (int k = 0; k < nunits && status == FSDP_OK; k++) {
        fsdp_unit_t *u = k == 0 ? root : layers[k - 1];
        full[k] = malloc(fsdp_unit_flat_numel(u) * sizeof(float) + 1);
        if (full[k] == NULL) {
            status = FSDP_ERR_NO_MEMORY;
            break;
        }
        /* a collective: every rank gathers, rank 0 keeps the values and writes */
        status = fsdp_unit_gather_full(u, full[k]);
        if (status == FSDP_OK && tp > 1) { /* and the tp ranks' slices */
            size_t n = fsdp_unit_flat_numel(u);
            float *all = malloc((size_t)tp * n * sizeof(float) + 1);
            status = all != NULL ? fsdp_nn_tp_gather(fs, full[k], n, all) : FSDP_ERR_NO_MEMORY;
            free(full[k]);
            full[k] = all;
        }
        if (rank != 0) {
            free(full[k]);
            full[k] = NULL;
            continue;
        }
        for (int i = 0; i < fsdp_unit_num_params(u) && status == FSDP_OK; i++, e++) {
            fsdp_param_info_t pi;
            status = fsdp_unit_param_info(u, i, &pi);
            name(arg, k, i, &pi, meta[e].name, sizeof(meta[e].name));
            meta[e].shape[0] = pi.shape[0];
            meta[e].shape[1] = pi.ndim > 1 ? pi.shape[1] : 0;
            entries[e].name = meta[e].name;
            entries[e].dtype = "F32";
            entries[e].ndim = pi.ndim;
            entries[e].shape = meta[e].shape;
            entries[e].data = full[k] + pi.offset;
            if (status == FSDP_OK && tp > 1) {
                status = fsdp_nn_tp_assemble(&pi, full[k], fsdp_unit_flat_numel(u), tp,
                                             slice(arg, k, i), &meta[e].data, meta[e].shape);
                entries[e].data = meta[e].data;
            }
        }
    }
    if (status == FSDP_OK && rank == 0) {
        static const char *const kv[] = {"format", "pt"};
        status = fsdp_st_write(path, entries, nent, kv, 1);
    }
out:
    for (int k = 0; full != NULL && k < nunits; k++)
        free(full[k]);
    for (int i = 0; meta != NULL && i < nent; i++)
        free(meta[i].data);
    free(full);
    free(entries);
    free(meta);
    return status;
}

fsdp_status_t fsdp_nn_save_units(fsdp_unit_t *root, fsdp_unit_t *const *layers, int nlayers,
                                 int rank, const char *path, fsdp_nn_name_func_t name, void *arg)
{
    return save_units(NULL, root, layers, nlayers, rank, path, name, NULL, arg);
}

fsdp_status_t fsdp_nn_save_units_tp(fsdp_t *fs, fsdp_unit_t *root, fsdp_unit_t *const *layers,
                                    int nlayers, const char *path, fsdp_nn_name_func_t name,
                                    fsdp_nn_slice_func_t slice, void *arg)
{
    return save_units(fs, root, layers, nlayers, fsdp_device(fs)->rank, path, name, slice, arg);
}
