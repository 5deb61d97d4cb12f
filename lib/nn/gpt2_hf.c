/* GPT-2 weights in Hugging Face's safetensors checkpoints (docs/formats.md section 2): HF's names,
 * with or without the "transformer." prefix, and layouts (Conv1D weights [in, out], which is
 * also how the model stores them, so nothing is transposed); the hub's attention-mask buffers
 * are skipped and the tied lm_head.weight is neither needed nor written. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp/gpt2.h>
#include <fsdp/log.h>
#include <fsdp/safetensors.h>

#include "nn/gpt2_int.h"
#include "nn/nn_int.h"

#define PREFIX "transformer."

typedef struct gpt2_weights {
    fsdp_lm_weights_t base; /* first: fsdp_lm_weights_t hands out &base */
    fsdp_st_file_t *file;
    fsdp_gpt2_config_t cfg;
    const fsdp_st_tensor_t *root[FSDP_GPT2_ROOT_NPARAMS];
    const fsdp_st_tensor_t **blocks; /* [n_layer][FSDP_GPT2_BLOCK_NPARAMS] */
} gpt2_weights_t;

/* Where a checkpoint name goes: *block_p = -1 for the root, the layer for a block; *index_p
 * the parameter; or *skip_p = 1 for a buffer. Returns 0 for a name that is none of these. */
static int classify(const char *name, int *block_p, int *index_p, int *skip_p, int *lm_head_p)
{
    const char *n = name;
    char *end;
    long layer;

    *skip_p = *lm_head_p = 0;
    if (strcmp(n, "lm_head.weight") == 0) {
        *lm_head_p = 1;
        return 1;
    }
    if (strncmp(n, PREFIX, strlen(PREFIX)) == 0)
        n += strlen(PREFIX);
    for (int i = 0; i < FSDP_GPT2_ROOT_NPARAMS; i++) {
        if (strcmp(n, fsdp_gpt2_root_param_name(i)) == 0) {
            *block_p = -1;
            *index_p = i;
            return 1;
        }
    }
    if (strncmp(n, "h.", 2) != 0 || n[2] < '0' || n[2] > '9')
        return 0;
    layer = strtol(n + 2, &end, 10);
    if (*end != '.' || layer > FSDP_GPT2_MAX_LAYERS || (n[2] == '0' && end != n + 3))
        return 0;
    *block_p = (int)layer;
    if (strcmp(end + 1, "attn.bias") == 0 || strcmp(end + 1, "attn.masked_bias") == 0) {
        *skip_p = 1; /* the causal-mask buffers, not parameters */
        return 1;
    }
    for (int i = 0; i < FSDP_GPT2_BLOCK_NPARAMS; i++) {
        if (strcmp(end + 1, fsdp_gpt2_block_param_name(i)) == 0) {
            *index_p = i;
            return 1;
        }
    }
    return 0;
}

static int dtype_readable(const char *dtype)
{
    return strcmp(dtype, "F32") == 0 || strcmp(dtype, "BF16") == 0 || strcmp(dtype, "F16") == 0;
}

static void shape_str(char *buf, size_t len, int ndim, const int64_t *shape)
{
    size_t off = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (off < len)
        snprintf(buf + off, len - off, "]");
}

/* The tensor must have the shape of parameter `index` of `block` and a readable dtype. */
static fsdp_status_t check_tensor(const char *path, const fsdp_gpt2_config_t *cfg,
                                  const fsdp_st_tensor_t *t, int block, int index)
{
    int ndim;
    int64_t shape[2];
    char got[96], want[64];

    fsdp_gpt2_param_shape(cfg, block, index, &ndim, shape);
    if (!dtype_readable(t->dtype)) {
        fsdp_error("%s: tensor '%s' has dtype %s; F32, BF16 or F16 is required", path, t->name,
                   t->dtype);
        return FSDP_ERR_FORMAT;
    }
    if (t->ndim != ndim || t->shape[0] != shape[0] || (ndim == 2 && t->shape[1] != shape[1])) {
        shape_str(got, sizeof(got), t->ndim, t->shape);
        shape_str(want, sizeof(want), ndim, shape);
        fsdp_error("%s: tensor '%s' has shape %s; this model (layers=%d heads=%d dim=%d seq=%d "
                   "vocab=%d) needs %s",
                   path, t->name, got, cfg->n_layer, cfg->n_head, cfg->n_embd, cfg->n_positions,
                   cfg->vocab_size, want);
        return FSDP_ERR_FORMAT;
    }
    return FSDP_OK;
}

static void weights_close(fsdp_lm_weights_t *base)
{
    gpt2_weights_t *weights = (gpt2_weights_t *)base;

    fsdp_st_close(weights->file);
    free(weights->blocks);
    free(weights);
}

fsdp_status_t fsdp_gpt2_weights_open(const char *path, const fsdp_gpt2_config_t *cfg,
                                     fsdp_lm_weights_t **weights_p)
{
    const int L = cfg->n_layer, NB = FSDP_GPT2_BLOCK_NPARAMS;
    const fsdp_st_tensor_t *lm_head_t = NULL;
    gpt2_weights_t *w;
    fsdp_status_t status;

    status = fsdp_gpt2_config_check(cfg);
    if (status != FSDP_OK)
        return status;
    w = calloc(1, sizeof(*w));
    if (w == NULL)
        return FSDP_ERR_NO_MEMORY;
    w->base.family = "gpt2";
    w->base.close = weights_close;
    w->cfg = *cfg;
    w->blocks = calloc((size_t)L * (size_t)NB, sizeof(*w->blocks));
    if (w->blocks == NULL) {
        status = FSDP_ERR_NO_MEMORY;
        goto err_close;
    }
    status = fsdp_st_open(path, &w->file);
    if (status != FSDP_OK)
        goto err_close;
    for (int i = 0; i < fsdp_st_num_tensors(w->file); i++) {
        const fsdp_st_tensor_t *t = fsdp_st_tensor_at(w->file, i);
        const fsdp_st_tensor_t **slot;
        int block = -1, index = 0, skip, lm_head;

        if (!classify(t->name, &block, &index, &skip, &lm_head) || block >= L) {
            fsdp_error("%s: unexpected tensor '%s' for a %d-layer gpt2 (expected HF GPT-2 "
                       "names, e.g. 'transformer.h.0.attn.c_attn.weight' or 'h.0.ln_1.weight')",
                       path, t->name, L);
            status = FSDP_ERR_FORMAT;
            goto err_close;
        }
        if (skip)
            continue;
        if (lm_head) { /* tied to wte: only its shape is checked, and the values below */
            status = check_tensor(path, cfg, t, -1, FSDP_GPT2_WTE);
            if (status != FSDP_OK)
                goto err_close;
            lm_head_t = t;
            continue;
        }
        slot = block < 0 ? &w->root[index] : &w->blocks[(size_t)block * NB + (size_t)index];
        if (*slot != NULL) {
            fsdp_error("%s: tensors '%s' and '%s' are the same parameter", path, (*slot)->name,
                       t->name);
            status = FSDP_ERR_FORMAT;
            goto err_close;
        }
        status = check_tensor(path, cfg, t, block, index);
        if (status == FSDP_OK)
            status = fsdp_st_check_finite(t, path);
        if (status != FSDP_OK)
            goto err_close;
        *slot = t;
    }
    if (lm_head_t != NULL && w->root[FSDP_GPT2_WTE] != NULL &&
        (strcmp(lm_head_t->dtype, w->root[FSDP_GPT2_WTE]->dtype) != 0 ||
         memcmp(lm_head_t->data, w->root[FSDP_GPT2_WTE]->data, lm_head_t->nbytes) != 0))
        fsdp_warn("%s: 'lm_head.weight' differs from '%s'; GPT-2 ties them, and the model "
                  "uses the embedding for both",
                  path, w->root[FSDP_GPT2_WTE]->name);
    for (int i = 0; i < FSDP_GPT2_ROOT_NPARAMS; i++) {
        if (w->root[i] == NULL) {
            fsdp_error("%s: no tensor '%s%s' (with or without the prefix)", path, PREFIX,
                       fsdp_gpt2_root_param_name(i));
            status = FSDP_ERR_FORMAT;
            goto err_close;
        }
    }
    for (int l = 0; l < L; l++) {
        for (int i = 0; i < NB; i++) {
            if (w->blocks[(size_t)l * NB + (size_t)i] == NULL) {
                fsdp_error("%s: no tensor '%sh.%d.%s' (with or without the prefix)", path, PREFIX,
                           l, fsdp_gpt2_block_param_name(i));
                status = FSDP_ERR_FORMAT;
                goto err_close;
            }
        }
    }
    *weights_p = &w->base;
    return FSDP_OK;

err_close:
    weights_close(&w->base);
    return status;
}

/* Parameter `index` of block `block` (-1: the root) from tensor t, through buf (its numel
 * floats); under tensor parallelism this rank's slice of it, through full (t's numel). */
static fsdp_status_t set_param(const fsdp_gpt2_t *m, int block, int index,
                               const fsdp_st_tensor_t *t, float *buf, float *full)
{
    fsdp_unit_t *u = block < 0 ? m->lm.root : m->lm.layers[block];
    const int parts = m->tp > 1 ? fsdp_gpt2_slice_parts(block, index) : 0;
    fsdp_param_info_t pi;
    fsdp_status_t status = fsdp_unit_param_info(u, index, &pi);

    if (status == FSDP_OK)
        status = fsdp_st_read_f32(t, 0, t->numel, parts != 0 ? full : buf);
    for (size_t e = 0; status == FSDP_OK && parts != 0 && e < pi.numel; e++)
        buf[e] = full[fsdp_nn_slice_index(e, pi.numel, pi.ndim > 1 ? (size_t)pi.shape[1] : pi.numel,
                                          parts, m->tp, m->tp_rank)];
    return status == FSDP_OK ? fsdp_unit_set_param(u, index, buf) : status;
}

fsdp_status_t fsdp_gpt2_load_weights(fsdp_lm_t *lm, const fsdp_lm_weights_t *base)
{
    const fsdp_gpt2_t *model = fsdp_gpt2_of(lm);
    const gpt2_weights_t *weights = (const gpt2_weights_t *)base;
    const fsdp_gpt2_config_t *c = &model->cfg, *wc = &weights->cfg;
    fsdp_status_t status = FSDP_OK;
    uint64_t max_numel = 0;
    float *buf, *full = NULL;

    if (c->n_layer != wc->n_layer || c->n_embd != wc->n_embd || c->n_positions != wc->n_positions ||
        c->vocab_size != wc->vocab_size) {
        fsdp_error("gpt2: weights opened for layers=%d dim=%d seq=%d vocab=%d do not fit a model "
                   "of layers=%d dim=%d seq=%d vocab=%d",
                   wc->n_layer, wc->n_embd, wc->n_positions, wc->vocab_size, c->n_layer, c->n_embd,
                   c->n_positions, c->vocab_size);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (fsdp_device(model->lm.fs)->no_data)
        return FSDP_OK;
    for (int i = 0; i < FSDP_GPT2_ROOT_NPARAMS; i++)
        if (weights->root[i]->numel > max_numel)
            max_numel = weights->root[i]->numel;
    if ((uint64_t)4 * c->n_embd * c->n_embd > max_numel)
        max_numel = (uint64_t)4 * c->n_embd * c->n_embd;
    buf = malloc((size_t)max_numel * sizeof(float));
    if (model->tp > 1)
        full = malloc((size_t)max_numel * sizeof(float));
    if (buf == NULL || (model->tp > 1 && full == NULL)) {
        free(buf);
        return FSDP_ERR_NO_MEMORY;
    }
    for (int i = 0; i < FSDP_GPT2_ROOT_NPARAMS && status == FSDP_OK; i++)
        status = set_param(model, -1, i, weights->root[i], buf, full);
    for (int l = 0; l < c->n_layer && status == FSDP_OK; l++) {
        for (int i = 0; i < FSDP_GPT2_BLOCK_NPARAMS && status == FSDP_OK; i++)
            status = set_param(model, l, i,
                               weights->blocks[(size_t)l * FSDP_GPT2_BLOCK_NPARAMS + (size_t)i],
                               buf, full);
    }
    free(full);
    free(buf);
    return status;
}

fsdp_status_t fsdp_gpt2_weights_infer_config(const char *path, fsdp_gpt2_config_t *cfg)
{
    fsdp_gpt2_config_t c = *cfg;
    fsdp_st_file_t *f;
    int layers = 0, have_wte = 0, have_wpe = 0;
    fsdp_status_t status = fsdp_st_open(path, &f);

    if (status != FSDP_OK)
        return status;
    for (int i = 0; i < fsdp_st_num_tensors(f); i++) {
        const fsdp_st_tensor_t *t = fsdp_st_tensor_at(f, i);
        int block = -1, index = 0, skip, lm_head;
        if (!classify(t->name, &block, &index, &skip, &lm_head) || lm_head)
            continue;
        if (block >= layers)
            layers = block + 1;
        if (block < 0 && index == FSDP_GPT2_WTE && t->ndim == 2) {
            c.vocab_size = (int)t->shape[0];
            c.n_embd = (int)t->shape[1];
            have_wte = 1;
        } else if (block < 0 && index == FSDP_GPT2_WPE && t->ndim == 2) {
            c.n_positions = (int)t->shape[0];
            have_wpe = 1;
        }
    }
    fsdp_st_close(f);
    if (!have_wte || !have_wpe || layers == 0) {
        fsdp_error("%s: not a gpt2 checkpoint (needs wte.weight, wpe.weight and h.<i> tensors)",
                   path);
        return FSDP_ERR_FORMAT;
    }
    c.n_layer = layers;
    if (c.n_head < 1 || c.n_embd % c.n_head != 0)
        c.n_head = c.n_embd % 64 == 0 ? c.n_embd / 64 : 1; /* GPT-2's head width */
    *cfg = c;
    return FSDP_OK;
}

/* ---- saving ---- */

static void gpt2_name(void *arg, int unit, int index, const fsdp_param_info_t *pi, char *buf,
                      size_t len)
{
    const char *prefix = arg;
    (void)pi;
    if (unit == 0)
        snprintf(buf, len, "%s%s", prefix, fsdp_gpt2_root_param_name(index));
    else
        snprintf(buf, len, "%sh.%d.%s", prefix, unit - 1, fsdp_gpt2_block_param_name(index));
}

/* unit 0 the root, l + 1 block l */
static int gpt2_slice(void *arg, int unit, int index)
{
    (void)arg;
    return fsdp_gpt2_slice_parts(unit - 1, index);
}

fsdp_status_t fsdp_gpt2_save_weights(fsdp_lm_t *lm, const char *path, fsdp_gpt2_save_names_t names)
{
    if (fsdp_lm_of_family(lm, "gpt2", "fsdp_gpt2_save_weights") == NULL)
        return FSDP_ERR_INVALID_PARAM;
    if (fsdp_gpt2_of(lm)->tp > 1)
        return fsdp_nn_save_units_tp(lm->fs, lm->root, lm->layers, lm->n_layer, path, gpt2_name,
                                     gpt2_slice,
                                     (void *)(names == FSDP_GPT2_SAVE_BARE ? "" : PREFIX));
    return fsdp_nn_save_units(lm->root, lm->layers, lm->n_layer, fsdp_device(lm->fs)->rank, path,
                              gpt2_name, (void *)(names == FSDP_GPT2_SAVE_BARE ? "" : PREFIX));
}

fsdp_status_t fsdp_gpt2_save_hf(fsdp_lm_t *lm, const char *path)
{
    return fsdp_gpt2_save_weights(lm, path, FSDP_GPT2_SAVE_PREFIXED);
}
