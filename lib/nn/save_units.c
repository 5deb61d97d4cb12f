/* A model's full parameters as one safetensors file, the way the built-in models write HF
 * checkpoints: each unit is gathered in turn (a collective) and rank 0 keeps the values and
 * writes them, F32, under the names the model gives. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>

#include <fsdp/safetensors.h>

#include "nn/nn_int.h"

typedef struct save_entry {
    char name[128];
    int64_t shape[2];
} save_entry_t;

fsdp_status_t fsdp_nn_save_units(fsdp_unit_t *root, fsdp_unit_t *const *layers, int nlayers,
                                 int rank, const char *path, fsdp_nn_name_func_t name, void *arg)
{
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
        }
    }
    if (status == FSDP_OK && rank == 0) {
        static const char *const kv[] = {"format", "pt"};
        status = fsdp_st_write(path, entries, nent, kv, 1);
    }
out:
    for (int k = 0; full != NULL && k < nunits; k++)
        free(full[k]);
    free(full);
    free(entries);
    free(meta);
    return status;
}
