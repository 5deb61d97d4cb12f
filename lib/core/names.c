/* The model's names (parameters, ignored parameters and buffers of every unit) by hash, so that a
 * new unit's names are checked for duplicates in O(1) each. */
#include "core/core_int.h"

#include <fsdp/trace.h>

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* FNV-1a, never 0 (the index's empty key). */
static uintptr_t name_hash(const char *name)
{
    uint64_t h = 14695981039346656037ull;

    for (const unsigned char *c = (const unsigned char *)name; *c != '\0'; c++)
        h = (h ^ *c) * 1099511628211ull;
    return (uintptr_t)h != 0 ? (uintptr_t)h : 1;
}

static void index_name(fsdp_t *fs, const char *name)
{
    uintptr_t key = name_hash(name);

    if (fsdp_ptrmap_get(&fs->param_names, key) == NULL)
        fsdp_ptrmap_put(&fs->param_names, key, (void *)name);
}

/* Adds a new unit's names (parameters, ignored parameters, buffers) to the model's index. */
fsdp_status_t fsdp_names_add_unit(fsdp_t *fs, const fsdp_unit_t *u)
{
    int nparams = u->handle != NULL ? u->handle->nparams : 0;
    fsdp_status_t status = fsdp_ptrmap_reserve(
        &fs->param_names, fs->param_names.count + (size_t)(nparams + u->nignored + u->nbuffers));

    if (status != FSDP_OK)
        return status;
    for (int i = 0; i < nparams; i++)
        index_name(fs, u->handle->params[i].name);
    for (int i = 0; i < u->nignored; i++)
        index_name(fs, u->ignored[i].info.name);
    for (int i = 0; i < u->nbuffers; i++)
        index_name(fs, u->buffers[i].info.name);
    return FSDP_OK;
}

int fsdp_name_taken(const fsdp_t *fs, const char *name)
{
    const char *hit = fsdp_ptrmap_get(&fs->param_names, name_hash(name));

    if (hit == NULL)
        return 0;
    if (strcmp(hit, name) == 0)
        return 1;
    /* two names share a hash (the index holds the first): look at every name */
    for (int i = 0; i < fs->nunits; i++) {
        const fsdp_unit_t *u = fs->units[i];
        const fsdp_handle_t *h = u->handle;
        for (int j = 0; h && j < h->nparams; j++) {
            if (strcmp(h->params[j].name, name) == 0)
                return 1;
        }
        for (int j = 0; j < u->nignored; j++) {
            if (strcmp(u->ignored[j].info.name, name) == 0)
                return 1;
        }
        for (int j = 0; j < u->nbuffers; j++) {
            if (strcmp(u->buffers[j].info.name, name) == 0)
                return 1;
        }
    }
    return 0;
}
