/* A language model on one rank (lm.h, lm_int.h): lm.h's functions, the same for every family,
 * which call the family's own where it differs; and HF's module tree, cut by a wrap policy into
 * a root unit and one unit per layer, and the per-layer settings the models keep with them. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include <fsdp/log.h>

#include "nn/lm_int.h"

fsdp_lm_t *fsdp_lm_of_family(fsdp_lm_t *lm, const char *family, const char *what)
{
    if (strcmp(lm->family->name, family) == 0)
        return lm;
    fsdp_error("%s: needs a %s model, not %s", what, family, lm->family->name);
    return NULL;
}

/* ---- lm.h: the same for every family ---- */

void fsdp_lm_destroy(fsdp_lm_t *lm)
{
    if (lm == NULL)
        return;
    free(lm->layers);
    free(lm->checkpoint);
    free(lm); /* the family's model, of which lm is the first member */
}

int fsdp_lm_num_layers(const fsdp_lm_t *lm)
{
    return lm->n_layer;
}

fsdp_unit_t *fsdp_lm_root(fsdp_lm_t *lm)
{
    return lm->root;
}

fsdp_unit_t *fsdp_lm_layer(fsdp_lm_t *lm, int layer)
{
    return layer >= 0 && layer < lm->n_layer ? lm->layers[layer] : NULL;
}

fsdp_status_t fsdp_lm_init_params(fsdp_lm_t *lm, uint64_t seed)
{
    return lm->family->init_params(lm, seed);
}

fsdp_status_t fsdp_lm_set_checkpointing(fsdp_lm_t *lm, int layer, int policy)
{
    if (layer < -1 || layer >= lm->n_layer) {
        fsdp_error("%s: no %s %d to checkpoint (%ss 0..%d, or -1 for all)", lm->family->name,
                   lm->family->layer, layer, lm->family->layer, lm->n_layer - 1);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (policy != FSDP_LM_CKPT_NONE && (policy < 0 || policy > lm->family->max_checkpoint))
        policy = FSDP_LM_CKPT_FULL;
    for (int l = 0; l < lm->n_layer; l++) {
        if (layer < 0 || l == layer)
            lm->checkpoint[l] = policy;
    }
    return FSDP_OK;
}

void fsdp_lm_set_loss_scale(fsdp_lm_t *lm, float scale)
{
    lm->loss_scale = scale;
}

fsdp_status_t fsdp_lm_forward_backward(fsdp_lm_t *lm, const int32_t *inputs, const int32_t *targets,
                                       size_t batch, size_t seq, float *loss_p)
{
    return lm->family->forward_backward(lm, inputs, targets, batch, seq, loss_p);
}

void fsdp_lm_weights_close(fsdp_lm_weights_t *weights)
{
    if (weights != NULL)
        weights->close(weights);
}

fsdp_status_t fsdp_lm_load_weights(fsdp_lm_t *lm, const fsdp_lm_weights_t *weights)
{
    if (strcmp(weights->family, lm->family->name) != 0) {
        fsdp_error("%s: weights of a %s checkpoint do not fit a %s model", lm->family->name,
                   weights->family, lm->family->name);
        return FSDP_ERR_INVALID_PARAM;
    }
    return lm->family->load_weights(lm, weights);
}

fsdp_status_t fsdp_lm_save_weights(fsdp_lm_t *lm, const char *path)
{
    return lm->family->save_weights(lm, path);
}

float *fsdp_lm_param_buffer(fsdp_lm_t *lm)
{
    size_t max_numel = 1;

    for (int k = -1; k < (lm->n_layer > 0 ? 1 : 0); k++) {
        fsdp_unit_t *u = k < 0 ? lm->root : lm->layers[0];
        for (int i = 0; i < fsdp_unit_num_params(u); i++) {
            fsdp_param_info_t info;
            fsdp_unit_param_info(u, i, &info);
            if (info.numel > max_numel)
                max_numel = info.numel;
        }
    }
    return malloc(max_numel * sizeof(float));
}

/* ---- the module tree ---- */

fsdp_status_t fsdp_lm_tree_alloc(fsdp_lm_tree_t *t, int nmods, int nparams)
{
    memset(t, 0, sizeof(*t));
    t->mods = calloc((size_t)nmods, sizeof(*t->mods));
    t->mnames = calloc((size_t)nmods, sizeof(*t->mnames));
    t->first = calloc((size_t)nmods, sizeof(*t->first));
    t->count = calloc((size_t)nmods, sizeof(*t->count));
    t->params = calloc((size_t)nparams, sizeof(*t->params));
    t->pnames = calloc((size_t)nparams, sizeof(*t->pnames));
    if (!t->mods || !t->mnames || !t->first || !t->count || !t->params || !t->pnames) {
        fsdp_lm_tree_free(t);
        return FSDP_ERR_NO_MEMORY;
    }
    return FSDP_OK;
}

void fsdp_lm_tree_free(fsdp_lm_tree_t *t)
{
    free(t->mods);
    free(t->mnames);
    free(t->first);
    free(t->count);
    free(t->params);
    free(t->pnames);
    memset(t, 0, sizeof(*t));
}

int fsdp_lm_tree_module(fsdp_lm_tree_t *t, const char *name, const char *type, int parent)
{
    int m = t->nmods++;
    size_t n = strlen(name);

    if (n > FSDP_LM_NAME_LEN - 1)
        n = FSDP_LM_NAME_LEN - 1; /* never: the longest is some forty bytes */
    memcpy(t->mnames[m], name, n);
    t->mnames[m][n] = '\0';
    t->first[m] = t->nparams;
    t->count[m] = 0;
    t->mods[m].name = t->mnames[m];
    t->mods[m].type = type;
    t->mods[m].own_numel = 0;
    t->mods[m].parent = parent;
    return m;
}

char *fsdp_lm_tree_param(fsdp_lm_tree_t *t, int ndim, const int64_t shape[2])
{
    fsdp_module_desc_t *mod = &t->mods[t->nmods - 1];
    fsdp_param_spec_t *sp = &t->params[t->nparams];
    char *name = t->pnames[t->nparams++];

    memset(sp, 0, sizeof(*sp));
    sp->name = name;
    sp->ndim = ndim;
    sp->shape[0] = shape[0];
    if (ndim == 2)
        sp->shape[1] = shape[1];
    sp->requires_grad = 1;
    sp->tied_to = -1;
    t->count[t->nmods - 1]++;
    mod->own_numel += (size_t)shape[0] * (ndim == 2 ? (size_t)shape[1] : 1);
    return name;
}

/* The units of ModuleWrapPolicy({wrap_type}) over the tree: the root, and one per layer into
 * lm->layers, each flattening its modules' parameters in named_parameters order. */
static fsdp_status_t create_units(fsdp_lm_t *lm, const fsdp_lm_tree_t *t, const char *wrap_type)
{
    const char *wrap_types[] = {wrap_type};
    fsdp_wrap_policy_t policy;
    fsdp_param_spec_t *specs = calloc((size_t)t->nparams + 1, sizeof(*specs));
    int *unit_of = calloc((size_t)t->nmods, sizeof(*unit_of));
    fsdp_unit_t **unit_at = calloc((size_t)t->nmods, sizeof(*unit_at));
    fsdp_status_t status;
    int nlayers = 0;

    fsdp_wrap_policy_init(&policy, FSDP_WRAP_BY_TYPE);
    policy.types = wrap_types;
    policy.ntypes = 1;
    status = specs && unit_of && unit_at ? fsdp_auto_wrap(&policy, t->mods, t->nmods, unit_of)
                                         : FSDP_ERR_NO_MEMORY;
    for (int w = 0; w < t->nmods && status == FSDP_OK; w++) {
        int n = 0;
        if (unit_of[w] != w)
            continue;
        for (int i = w; i < t->nmods; i++) {
            if (unit_of[i] != w)
                continue;
            memcpy(specs + n, t->params + t->first[i], sizeof(*specs) * (size_t)t->count[i]);
            n += t->count[i];
        }
        status = fsdp_unit_create(lm->fs, t->mods[w].name,
                                  w == 0 ? NULL : unit_at[unit_of[t->mods[w].parent]], specs, n,
                                  &unit_at[w]);
        if (status != FSDP_OK)
            break;
        if (w == 0)
            lm->root = unit_at[w];
        else if (nlayers < lm->n_layer)
            lm->layers[nlayers++] = unit_at[w];
    }
    if (status == FSDP_OK && nlayers != lm->n_layer) {
        fsdp_error("%s: the wrap policy made %d %s units for %d layers", lm->family->name, nlayers,
                   lm->family->layer, lm->n_layer);
        status = FSDP_ERR_INTERNAL;
    }
    free(specs);
    free(unit_of);
    free(unit_at);
    return status;
}

fsdp_status_t fsdp_lm_create(fsdp_t *fs, const fsdp_lm_family_t *family, int n_layer,
                             const void *cfg, fsdp_lm_t **lm_p)
{
    fsdp_lm_tree_t tree;
    fsdp_lm_t *lm = calloc(1, family->size);
    fsdp_status_t status = FSDP_OK;

    if (lm == NULL)
        return FSDP_ERR_NO_MEMORY;
    lm->family = family;
    lm->fs = fs;
    lm->n_layer = n_layer;
    lm->loss_scale = 1.0f;
    lm->layers = calloc((size_t)n_layer, sizeof(*lm->layers));
    lm->checkpoint = calloc((size_t)n_layer, sizeof(*lm->checkpoint));
    if (lm->layers == NULL || lm->checkpoint == NULL)
        status = FSDP_ERR_NO_MEMORY;
    if (status == FSDP_OK)
        status = family->build(&tree, cfg);
    if (status == FSDP_OK) {
        status = create_units(lm, &tree, family->wrap_type);
        fsdp_lm_tree_free(&tree);
    }
    if (status != FSDP_OK) {
        fsdp_lm_destroy(lm);
        return status;
    }
    *lm_p = lm;
    return FSDP_OK;
}
