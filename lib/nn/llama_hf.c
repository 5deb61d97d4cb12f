/* Llama weights in Hugging Face's safetensors checkpoints: one model.safetensors, or the files a
 * model.safetensors.index.json maps the names to. HF's names and nn.Linear's [out, in] layout are
 * the units' own (llama.c), so a tensor is copied as it is; each rank reads only the elements of
 * its shard out of the mapped files, and rank 0 alone writes a whole checkpoint. */
#include "config.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <fsdp/llama.h>
#include <fsdp/log.h>
#include <fsdp/safetensors.h>

#include "io/fs.h"
#include "nn/llama_int.h"
#include "nn/nn_int.h"

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

typedef struct llama_weights {
    fsdp_lm_weights_t base; /* first: fsdp_lm_weights_t hands out &base */
    fsdp_st_file_t **files;
    char **file_names; /* for messages */
    int nfiles;
    fsdp_llama_config_t cfg;
    const fsdp_st_tensor_t *root[FSDP_LLAMA_ROOT_NPARAMS];
    const fsdp_st_tensor_t **layers; /* [n_layer][FSDP_LLAMA_LAYER_NPARAMS] */
} llama_weights_t;

enum { NAME_PARAM = 1, NAME_SKIP = 2, NAME_TIED_HEAD = 3 };

/* Where a checkpoint name goes: *layer_p = -1 for the root, else the layer, and *index_p the
 * parameter; NAME_SKIP for a buffer, NAME_TIED_HEAD for lm_head.weight of a tied model, 0 for a
 * name that is none of these. */
static int classify(const fsdp_llama_config_t *cfg, const char *name, int *layer_p, int *index_p)
{
    const char *pre = "model.layers.";
    char *end;
    long layer;

    for (int i = 0; i < FSDP_LLAMA_ROOT_NPARAMS; i++) {
        if (strcmp(name, fsdp_llama_root_param_name(i)) == 0) {
            *layer_p = -1;
            *index_p = i;
            return i == FSDP_LLAMA_LM_HEAD && cfg->tie_word_embeddings ? NAME_TIED_HEAD
                                                                       : NAME_PARAM;
        }
    }
    if (strncmp(name, pre, strlen(pre)) != 0)
        return 0;
    name += strlen(pre);
    if (name[0] < '0' || name[0] > '9')
        return 0;
    layer = strtol(name, &end, 10);
    if (*end != '.' || layer >= cfg->n_layer || (name[0] == '0' && end != name + 1))
        return 0;
    *layer_p = (int)layer;
    if (strcmp(end + 1, "self_attn.rotary_emb.inv_freq") == 0)
        return NAME_SKIP; /* a buffer older transformers saved; recomputed from the config */
    for (int i = 0; i < FSDP_LLAMA_LAYER_NPARAMS; i++) {
        if (strcmp(end + 1, fsdp_llama_layer_param_name(i)) == 0) {
            *index_p = i;
            return NAME_PARAM;
        }
    }
    return 0;
}

static fsdp_status_t check_tensor(const fsdp_llama_config_t *cfg, const char *file,
                                  const fsdp_st_tensor_t *t, int layer, int index)
{
    int ndim;
    int64_t shape[2];

    fsdp_llama_param_shape(cfg, layer, index, &ndim, shape);
    if (strcmp(t->dtype, "F32") != 0 && strcmp(t->dtype, "BF16") != 0 &&
        strcmp(t->dtype, "F16") != 0) {
        fsdp_error("%s: tensor '%s' has dtype %s; F32, BF16 or F16 is required", file, t->name,
                   t->dtype);
        return FSDP_ERR_FORMAT;
    }
    if (t->ndim != ndim || t->shape[0] != shape[0] || (ndim == 2 && t->shape[1] != shape[1])) {
        fsdp_error("%s: tensor '%s' has %d dimensions [%lld, %lld]; this model (layers=%d "
                   "heads=%d kv_heads=%d dim=%d ffn=%d vocab=%d) needs [%lld%s%lld]",
                   file, t->name, t->ndim, (long long)t->shape[0],
                   (long long)(t->ndim > 1 ? t->shape[1] : 0), cfg->n_layer, cfg->n_head,
                   cfg->n_kv_head, cfg->dim, cfg->ffn_dim, cfg->vocab_size, (long long)shape[0],
                   ndim == 2 ? ", " : "", ndim == 2 ? (long long)shape[1] : 0LL);
        return FSDP_ERR_FORMAT;
    }
    return FSDP_OK;
}

/* Puts tensor t (named `name`, from file `file`) in its slot. */
static fsdp_status_t place(llama_weights_t *w, const char *file, const char *name,
                           const fsdp_st_tensor_t *t)
{
    const int NL = FSDP_LLAMA_LAYER_NPARAMS;
    const fsdp_st_tensor_t **slot;
    int layer = -1, index = 0;
    int kind = classify(&w->cfg, name, &layer, &index);
    fsdp_status_t status;

    if (kind == 0) {
        fsdp_error("%s: unexpected tensor '%s' for a %d-layer llama (expected HF "
                   "LlamaForCausalLM names, e.g. 'model.layers.0.self_attn.q_proj.weight')",
                   file, name, w->cfg.n_layer);
        return FSDP_ERR_FORMAT;
    }
    if (kind == NAME_SKIP || kind == NAME_TIED_HEAD)
        return FSDP_OK;
    slot = layer < 0 ? &w->root[index] : &w->layers[(size_t)layer * NL + (size_t)index];
    if (*slot != NULL) {
        fsdp_error("%s: tensor '%s' appears twice", file, name);
        return FSDP_ERR_FORMAT;
    }
    *slot = t;
    status = check_tensor(&w->cfg, file, t, layer, index);
    return status == FSDP_OK ? fsdp_st_check_finite(t, file) : status;
}

/* Maps one more file: w->files[w->nfiles - 1]. */
static fsdp_status_t open_file(llama_weights_t *w, const char *path)
{
    char **names = realloc(w->file_names, (size_t)(w->nfiles + 1) * sizeof(*names));
    fsdp_st_file_t **files;

    if (names == NULL)
        return FSDP_ERR_NO_MEMORY;
    w->file_names = names;
    files = realloc(w->files, (size_t)(w->nfiles + 1) * sizeof(*files));
    if (files == NULL)
        return FSDP_ERR_NO_MEMORY;
    w->files = files;
    names[w->nfiles] = strdup(path);
    files[w->nfiles] = NULL;
    if (names[w->nfiles] == NULL)
        return FSDP_ERR_NO_MEMORY;
    w->nfiles++;
    return fsdp_st_open(path, &files[w->nfiles - 1]);
}

/* The index: every name in its weight_map is looked up in the file it names (opened once). */
static fsdp_status_t open_index(llama_weights_t *w, const char *index_path)
{
    const char *slash = strrchr(index_path, '/');
    int dir_len = slash != NULL ? (int)(slash - index_path + 1) : 0;
    json_error_t jerr;
    json_t *root, *map;
    const char *name;
    json_t *v;
    FILE *in;
    fsdp_status_t status = fsdp_fs_fopen_read(index_path, 0, &in);

    if (status != FSDP_OK)
        return status;
    root = json_loadf(in, 0, &jerr);
    fclose(in);
    if (root == NULL) {
        fsdp_error("%s: not a safetensors index: %s (line %d)", index_path, jerr.text, jerr.line);
        return FSDP_ERR_FORMAT;
    }
    map = json_object_get(root, "weight_map");
    if (!json_is_object(map)) {
        fsdp_error("%s: no \"weight_map\" object of tensor names to files", index_path);
        json_decref(root);
        return FSDP_ERR_FORMAT;
    }
    json_object_foreach (map, name, v) {
        const char *file = json_string_value(v);
        const fsdp_st_tensor_t *t;
        char path[4096];
        int f;

        if (file == NULL || file[0] == '\0' || file[0] == '/' || strstr(file, "..") != NULL) {
            fsdp_error("%s: tensor '%s' maps to no file beside the index", index_path, name);
            status = FSDP_ERR_FORMAT;
            break;
        }
        snprintf(path, sizeof(path), "%.*s%s", dir_len, index_path, file);
        for (f = 0; f < w->nfiles && strcmp(w->file_names[f], path) != 0; f++)
            ;
        if (f == w->nfiles && (status = open_file(w, path)) != FSDP_OK)
            break;
        t = fsdp_st_find(w->files[f], name);
        if (t == NULL) {
            fsdp_error("%s: no tensor '%s', which %s maps to it", path, name, index_path);
            status = FSDP_ERR_FORMAT;
            break;
        }
        status = place(w, path, name, t);
        if (status != FSDP_OK)
            break;
    }
    json_decref(root);
    return status;
}

static void weights_close(fsdp_lm_weights_t *base)
{
    llama_weights_t *weights = (llama_weights_t *)base;

    for (int i = 0; i < weights->nfiles; i++) {
        fsdp_st_close(weights->files[i]);
        free(weights->file_names[i]);
    }
    free(weights->files);
    free(weights->file_names);
    free(weights->layers);
    free(weights);
}

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

fsdp_status_t fsdp_llama_weights_open(const char *path, const fsdp_llama_config_t *cfg,
                                      fsdp_lm_weights_t **weights_p)
{
    const int L = cfg->n_layer, NL = FSDP_LLAMA_LAYER_NPARAMS;
    llama_weights_t *w;
    char buf[4096];
    fsdp_status_t status = fsdp_llama_config_check(cfg);

    if (status != FSDP_OK)
        return status;
    w = calloc(1, sizeof(*w));
    if (w == NULL)
        return FSDP_ERR_NO_MEMORY;
    w->base.family = "llama";
    w->base.close = weights_close;
    w->cfg = *cfg;
    w->layers = calloc((size_t)L * (size_t)NL, sizeof(*w->layers));
    if (w->layers == NULL) {
        status = FSDP_ERR_NO_MEMORY;
        goto err_close;
    }
    if (is_dir(path)) {
        struct stat st;
        snprintf(buf, sizeof(buf), "%s/%s", path, INDEX_NAME);
        if (stat(buf, &st) != 0)
            snprintf(buf, sizeof(buf), "%s/%s", path, SINGLE_NAME);
        path = buf;
    }
    if (ends_with(path, ".json")) {
        status = open_index(w, path);
    } else {
        status = open_file(w, path);
        for (int i = 0; status == FSDP_OK && i < fsdp_st_num_tensors(w->files[0]); i++) {
            const fsdp_st_tensor_t *t = fsdp_st_tensor_at(w->files[0], i);
            status = place(w, path, t->name, t);
        }
    }
    if (status != FSDP_OK)
        goto err_close;
    for (int k = -1; k < L; k++) {
        int np = k < 0 ? (cfg->tie_word_embeddings ? 2 : 3) : NL;
        for (int i = 0; i < np; i++) {
            if ((k < 0 ? w->root[i] : w->layers[(size_t)k * NL + (size_t)i]) != NULL)
                continue;
            if (k < 0)
                fsdp_error("%s: no tensor '%s'", path, fsdp_llama_root_param_name(i));
            else
                fsdp_error("%s: no tensor 'model.layers.%d.%s'", path, k,
                           fsdp_llama_layer_param_name(i));
            status = FSDP_ERR_FORMAT;
            goto err_close;
        }
    }
    *weights_p = &w->base;
    return FSDP_OK;

err_close:
    weights_close(&w->base);
    return status;
}

/* One unit's parameters: each rank converts and sets only the elements in its shard. */
static fsdp_status_t load_unit(fsdp_unit_t *u, const fsdp_st_tensor_t *const *tensors, int np,
                               float *buf)
{
    fsdp_status_t status = FSDP_OK;

    for (int i = 0; i < np && status == FSDP_OK; i++) {
        fsdp_param_info_t pi;
        status = fsdp_unit_param_info(u, i, &pi);
        if (status != FSDP_OK || !pi.in_shard)
            continue;
        status = fsdp_st_read_f32(tensors[i], pi.intra_start, pi.numel_in_shard, buf);
        if (status == FSDP_OK)
            status = fsdp_unit_set_param_shard(u, i, buf);
    }
    return status;
}

fsdp_status_t fsdp_llama_load_weights(fsdp_lm_t *lm, const fsdp_lm_weights_t *base)
{
    const fsdp_llama_t *model = fsdp_llama_of(lm);
    const llama_weights_t *weights = (const llama_weights_t *)base;
    const fsdp_llama_config_t *c = &model->cfg, *wc = &weights->cfg;
    size_t max_shard = 0;
    fsdp_status_t status;
    float *buf;

    if (model->tp > 1) {
        fsdp_error("llama: loading HF weights under tensor parallelism (tp %d) is not supported",
                   model->tp);
        return FSDP_ERR_UNSUPPORTED;
    }

    if (c->n_layer != wc->n_layer || c->dim != wc->dim || c->ffn_dim != wc->ffn_dim ||
        c->n_head != wc->n_head || c->n_kv_head != wc->n_kv_head ||
        fsdp_llama_head_dim(c) != fsdp_llama_head_dim(wc) || c->vocab_size != wc->vocab_size ||
        c->tie_word_embeddings != wc->tie_word_embeddings) {
        fsdp_error("llama: weights opened for another model shape than this one's");
        return FSDP_ERR_INVALID_PARAM;
    }
    if (fsdp_device(model->lm.fs)->no_data)
        return FSDP_OK;
    for (int k = -1; k < c->n_layer; k++) {
        size_t n = fsdp_unit_shard_numel(k < 0 ? model->lm.root : model->lm.layers[k]);
        if (n > max_shard)
            max_shard = n;
    }
    buf = malloc(max_shard * sizeof(float) + 1);
    if (buf == NULL)
        return FSDP_ERR_NO_MEMORY;
    status = load_unit(model->lm.root, weights->root, fsdp_unit_num_params(model->lm.root), buf);
    for (int l = 0; l < c->n_layer && status == FSDP_OK; l++)
        status =
            load_unit(model->lm.layers[l], weights->layers + (size_t)l * FSDP_LLAMA_LAYER_NPARAMS,
                      FSDP_LLAMA_LAYER_NPARAMS, buf);
    free(buf);
    return status;
}

/* ---- saving ---- */

static void hf_name(void *arg, int unit, int index, const fsdp_param_info_t *pi, char *buf,
                    size_t len)
{
    (void)arg, (void)unit, (void)index;
    snprintf(buf, len, "%s", pi->name); /* the units' names are HF's */
}

fsdp_status_t fsdp_llama_save_weights(fsdp_lm_t *lm, const char *path)
{
    if (fsdp_llama_of(lm)->tp > 1) {
        fsdp_error("llama: saving HF weights under tensor parallelism (tp %d) is not supported",
                   fsdp_llama_of(lm)->tp);
        return FSDP_ERR_UNSUPPORTED;
    }
    return fsdp_nn_save_units(lm->root, lm->layers, lm->n_layer, fsdp_device(lm->fs)->rank, path,
                              hf_name, NULL);
}
