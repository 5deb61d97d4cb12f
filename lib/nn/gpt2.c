/* GPT-2: configurations and presets, the units and their parameters, HF's initialization.
 * The forward and backward are in gpt2_run.c, the HF checkpoints in gpt2_hf.c, the model as an
 * fsdp_lm_t in gpt2_lm.c. */
#include "config.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp/gpt2.h>
#include <fsdp/log.h>
#include <fsdp/nn.h>

#include "nn/gpt2_int.h"

/* ---- presets ---- */

#define GPT2_VOCAB 50257 /* HF's GPT-2 tokenizer; GPT-3 used the same BPE */

/* name, layers, heads, width, positions, vocab */
#define GPT2_PRESET(name, l, h, c, p, v, what)                                                     \
    {                                                                                              \
        name, {l, h, c, p, v, 1e-5f, 0.02f, 0}, what                                               \
    }

static const fsdp_gpt2_preset_t presets[] = {
    GPT2_PRESET("gpt2-tiny", 2, 2, 64, 64, 256,
                "byte-level toy for tests and the demo, 120,576 parameters"),
    GPT2_PRESET("gpt2", 12, 12, 768, 1024, GPT2_VOCAB, "HF gpt2, 124M"),
    GPT2_PRESET("gpt2-medium", 24, 16, 1024, 1024, GPT2_VOCAB, "HF gpt2-medium, 355M"),
    GPT2_PRESET("gpt2-large", 36, 20, 1280, 1024, GPT2_VOCAB, "HF gpt2-large, 774M"),
    GPT2_PRESET("gpt2-xl", 48, 25, 1600, 1024, GPT2_VOCAB, "HF gpt2-xl, 1.56B"),
    /* Brown et al. 2020, "Language Models are Few-Shot Learners", table 2.1; context 2048. The
     * table's XL row (24 heads of 128 at width 2048) and 13B width (5140 with 40 heads of 128)
     * do not multiply out: XL takes 16 heads of 128, 13B width 5120. GPT-3 alternates dense and
     * banded sparse attention; these are dense, which changes no parameter count. */
    GPT2_PRESET("gpt3-small", 12, 12, 768, 2048, GPT2_VOCAB, "GPT-3 Small, 125M"),
    GPT2_PRESET("gpt3-medium", 24, 16, 1024, 2048, GPT2_VOCAB, "GPT-3 Medium, 350M"),
    GPT2_PRESET("gpt3-large", 24, 16, 1536, 2048, GPT2_VOCAB, "GPT-3 Large, 760M"),
    GPT2_PRESET("gpt3-xl", 24, 16, 2048, 2048, GPT2_VOCAB, "GPT-3 XL, 1.3B"),
    GPT2_PRESET("gpt3-2.7b", 32, 32, 2560, 2048, GPT2_VOCAB, "GPT-3 2.7B"),
    GPT2_PRESET("gpt3-6.7b", 32, 32, 4096, 2048, GPT2_VOCAB, "GPT-3 6.7B"),
    GPT2_PRESET("gpt3-13b", 40, 40, 5120, 2048, GPT2_VOCAB, "GPT-3 13B"),
    GPT2_PRESET("gpt3-175b", 96, 96, 12288, 2048, GPT2_VOCAB, "GPT-3 175B"),
};

#define NPRESETS ((int)(sizeof(presets) / sizeof(presets[0])))

const fsdp_gpt2_preset_t *fsdp_gpt2_presets(int *count_p)
{
    *count_p = NPRESETS;
    return presets;
}

const fsdp_gpt2_preset_t *fsdp_gpt2_preset_find(const char *name)
{
    for (int i = 0; name != NULL && i < NPRESETS; i++) {
        if (strcmp(presets[i].name, name) == 0)
            return &presets[i];
    }
    return NULL;
}

const char *fsdp_gpt2_preset_names(void)
{
    return "gpt2-tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl, gpt3-small, gpt3-medium, "
           "gpt3-large, gpt3-xl, gpt3-2.7b, gpt3-6.7b, gpt3-13b, gpt3-175b";
}

void fsdp_gpt2_config_init(fsdp_gpt2_config_t *cfg)
{
    *cfg = presets[1].cfg;
}

int fsdp_gpt2_spec_is_gpt(const char *spec)
{
    return spec != NULL && strncmp(spec, "gpt", 3) == 0;
}

fsdp_status_t fsdp_gpt2_config_check(const fsdp_gpt2_config_t *cfg)
{
    const char *bad = NULL;

    if (cfg->n_layer < 1 || cfg->n_layer > FSDP_GPT2_MAX_LAYERS)
        bad = "layers must be in [1, 1024]";
    else if (cfg->n_head < 1 || cfg->n_embd < 1 || cfg->n_embd % cfg->n_head != 0)
        bad = "heads must divide the width";
    else if (cfg->n_embd > (1 << 20))
        bad = "the width must be at most 2^20";
    else if (cfg->n_positions < 1 || cfg->n_positions > (1 << 20))
        bad = "seq (positions) must be in [1, 2^20]";
    else if (cfg->vocab_size < 1 || cfg->vocab_size > (1 << 24))
        bad = "vocab must be in [1, 2^24]";
    else if (!(cfg->layer_norm_eps >= 0.0f) || !isfinite(cfg->layer_norm_eps) ||
             !(cfg->initializer_range >= 0.0f) || !isfinite(cfg->initializer_range))
        bad = "layer_norm_eps and initializer_range must be finite and >= 0";
    else if (cfg->fused_attention != 0 && cfg->fused_attention != 1)
        bad = "fused_attention must be 0 (eager) or 1 (fused)";
    else if (cfg->fused_attention && cfg->n_embd / cfg->n_head > 256)
        bad = "the fused attention takes heads of at most 256 (width / heads)";
    if (bad != NULL) {
        fsdp_error("gpt2 config layers=%d heads=%d dim=%d seq=%d vocab=%d: %s", cfg->n_layer,
                   cfg->n_head, cfg->n_embd, cfg->n_positions, cfg->vocab_size, bad);
        return FSDP_ERR_INVALID_PARAM;
    }
    return FSDP_OK;
}

#define GPT2_SPEC_FORM "gpt2:layers=L,heads=H,dim=D,seq=T,vocab=V,attention=eager|fused"

static const char *const attentions[] = {"eager", "fused", NULL};

#define GPT2_KEY(key, field, lo, hi)                                                               \
    {                                                                                              \
        key, FSDP_NN_SPEC_INT, offsetof(fsdp_gpt2_config_t, field), lo, hi, NULL                   \
    }

/* the ranges of fsdp_gpt2_config_check, where one key alone decides them */
static const fsdp_nn_spec_key_t gpt2_keys[] = {
    GPT2_KEY("layers", n_layer, 1, FSDP_GPT2_MAX_LAYERS),
    GPT2_KEY("heads", n_head, 1, 1 << 20),
    GPT2_KEY("dim", n_embd, 1, 1 << 20),
    GPT2_KEY("seq", n_positions, 1, 1 << 20),
    GPT2_KEY("vocab", vocab_size, 1, 1 << 24),
    {"attention", FSDP_NN_SPEC_CHOICE, offsetof(fsdp_gpt2_config_t, fused_attention), 0, 0,
     attentions},
};

fsdp_status_t fsdp_gpt2_config_parse(const char *spec, fsdp_gpt2_config_t *cfg_p)
{
    const fsdp_gpt2_preset_t *preset = fsdp_gpt2_preset_find(spec);
    fsdp_gpt2_config_t cfg = presets[0].cfg;

    if (preset != NULL) {
        *cfg_p = preset->cfg;
        return FSDP_OK;
    }
    if (spec == NULL || strncmp(spec, "gpt2:", 5) != 0) {
        fsdp_error("model '%s' is not a gpt model: expected one of %s, or " GPT2_SPEC_FORM,
                   spec ? spec : "(null)", fsdp_gpt2_preset_names());
        return FSDP_ERR_INVALID_PARAM;
    }
    if (fsdp_nn_spec_parse(spec, GPT2_SPEC_FORM, gpt2_keys,
                           (int)(sizeof(gpt2_keys) / sizeof(gpt2_keys[0])), &cfg) != FSDP_OK ||
        fsdp_gpt2_config_check(&cfg) != FSDP_OK)
        return FSDP_ERR_INVALID_PARAM;
    *cfg_p = cfg;
    return FSDP_OK;
}

uint64_t fsdp_gpt2_block_params(const fsdp_gpt2_config_t *cfg)
{
    uint64_t c = (uint64_t)cfg->n_embd;
    return 12 * c * c + 13 * c;
}

uint64_t fsdp_gpt2_root_params(const fsdp_gpt2_config_t *cfg)
{
    uint64_t c = (uint64_t)cfg->n_embd;
    return ((uint64_t)cfg->vocab_size + (uint64_t)cfg->n_positions) * c + 2 * c;
}

uint64_t fsdp_gpt2_num_params(const fsdp_gpt2_config_t *cfg)
{
    return fsdp_gpt2_root_params(cfg) + (uint64_t)cfg->n_layer * fsdp_gpt2_block_params(cfg);
}

double fsdp_gpt2_flops_per_token(const fsdp_gpt2_config_t *cfg, int seq)
{
    double c = cfg->n_embd, l = cfg->n_layer;
    /* 2 flops per weight of every product (the LM head included), and QK^T and att V */
    return 2.0 * (12.0 * l * c * c + (double)cfg->vocab_size * c) + 4.0 * l * (double)seq * c;
}

/* ---- the model ---- */

/* HF's names of a block's parameters, in FSDP_GPT2_* order. */
static const char *const block_names[FSDP_GPT2_BLOCK_NPARAMS] = {
    "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};

static const char *const root_names[FSDP_GPT2_ROOT_NPARAMS] = {"wte.weight", "wpe.weight",
                                                               "ln_f.weight", "ln_f.bias"};

const char *fsdp_gpt2_block_param_name(int index)
{
    return block_names[index];
}

const char *fsdp_gpt2_root_param_name(int index)
{
    return root_names[index];
}

void fsdp_gpt2_param_shape(const fsdp_gpt2_config_t *cfg, int block, int index, int *ndim_p,
                           int64_t shape[2])
{
    fsdp_gpt2_param_shape_tp(cfg, 1, block, index, ndim_p, shape);
}

void fsdp_gpt2_param_shape_tp(const fsdp_gpt2_config_t *cfg, int tp, int block, int index,
                              int *ndim_p, int64_t shape[2])
{
    const int64_t c = cfg->n_embd, cl = c / tp; /* cl: this rank's columns of the heads */

    if (block < 0) {
        static const int nd[FSDP_GPT2_ROOT_NPARAMS] = {2, 2, 1, 1};
        *ndim_p = nd[index];
        shape[0] = index == FSDP_GPT2_WTE   ? cfg->vocab_size / tp
                   : index == FSDP_GPT2_WPE ? cfg->n_positions
                                            : c;
        shape[1] = c;
        return;
    }
    switch (index) {
    case FSDP_GPT2_ATTN_W:
        *ndim_p = 2;
        shape[0] = c;
        shape[1] = 3 * cl;
        break;
    case FSDP_GPT2_ATTN_B:
        *ndim_p = 1;
        shape[0] = 3 * cl;
        break;
    case FSDP_GPT2_ATTN_PROJ_W:
        *ndim_p = 2;
        shape[0] = cl;
        shape[1] = c;
        break;
    case FSDP_GPT2_FC_W:
        *ndim_p = 2;
        shape[0] = c;
        shape[1] = 4 * cl;
        break;
    case FSDP_GPT2_FC_B:
        *ndim_p = 1;
        shape[0] = 4 * cl;
        break;
    case FSDP_GPT2_FC_PROJ_W:
        *ndim_p = 2;
        shape[0] = 4 * cl;
        shape[1] = c;
        break;
    default:
        *ndim_p = 1;
        shape[0] = c;
        break; /* layernorms and the width-C biases */
    }
}

/* ---- HF's GPT2Model as a module tree (lm_int.h) ---- */

/* Appends src to out[*len..cap), truncating, always terminated. */
static void name_append(char *out, size_t cap, size_t *len, const char *src)
{
    size_t n = strlen(src);

    if (n > cap - 1 - *len)
        n = cap - 1 - *len;
    memcpy(out + *len, src, n);
    *len += n;
    out[*len] = '\0';
}

/* "transformer.h.<block>.<suffix>" into out (cap bytes), without the ".<suffix>" when suffix
 * is NULL, "transformer.<suffix>" when block < 0. The tree holds some two thousand names for
 * GPT-3, built by every rank: this is what snprintf would write, without its format parsing. */
static const char *block_name(char *out, size_t cap, int block, const char *suffix)
{
    char digits[12];
    size_t len = 0;
    int nd = 0;

    out[0] = '\0';
    if (block < 0) {
        name_append(out, cap, &len, "transformer.");
        name_append(out, cap, &len, suffix);
        return out;
    }
    name_append(out, cap, &len, "transformer.h.");
    do {
        digits[nd++] = (char)('0' + block % 10);
        block /= 10;
    } while (block > 0);
    for (int i = 0; i < nd / 2; i++) {
        char c = digits[i];
        digits[i] = digits[nd - 1 - i];
        digits[nd - 1 - i] = c;
    }
    digits[nd] = '\0';
    name_append(out, cap, &len, digits);
    if (suffix != NULL) {
        name_append(out, cap, &len, ".");
        name_append(out, cap, &len, suffix);
    }
    return out;
}

/* Adds module `name` of `type` under `parent`, owning `np` parameters: block `block` (or the
 * root's, -1) parameters of FSDP_GPT2_* index `pi0` onward. Returns its index. */
static int tree_add(fsdp_lm_tree_t *t, const fsdp_gpt2_shape_t *sh, const char *name,
                    const char *type, int parent, int block, int pi0, int np)
{
    int m = fsdp_lm_tree_module(t, name, type, parent);

    for (int i = pi0; i < pi0 + np; i++) {
        int nd;
        int64_t shape[2];
        fsdp_gpt2_param_shape_tp(sh->cfg, sh->tp, block, i, &nd, shape);
        block_name(fsdp_lm_tree_param(t, nd, shape), FSDP_LM_NAME_LEN, block,
                   block < 0 ? root_names[i] : block_names[i]);
        /* replicated over tp and applied to sequence shards: the layernorms and wpe */
        t->params[t->nparams - 1].tp_partial_grad =
            block < 0 ? i != FSDP_GPT2_WTE
                      : i == FSDP_GPT2_LN1_W || i == FSDP_GPT2_LN1_B || i == FSDP_GPT2_LN2_W ||
                            i == FSDP_GPT2_LN2_B;
        t->params[t->nparams - 1].tp_shard = fsdp_gpt2_slice_parts(block, i);
    }
    return m;
}

/* "transformer.h.<l>.<suffix>" into n (FSDP_LM_NAME_LEN bytes). */
static const char *sub_name(char *n, int l, const char *suffix)
{
    return block_name(n, FSDP_LM_NAME_LEN, l, suffix);
}

fsdp_status_t fsdp_gpt2_tree_build(fsdp_lm_tree_t *t, const void *shape_v)
{
    const fsdp_gpt2_shape_t *sh = shape_v;
    const fsdp_gpt2_config_t *cfg = sh->cfg;
    int list;
    fsdp_status_t status = fsdp_lm_tree_alloc(
        t, 5 + 10 * cfg->n_layer, FSDP_GPT2_ROOT_NPARAMS + FSDP_GPT2_BLOCK_NPARAMS * cfg->n_layer);

    if (status != FSDP_OK)
        return status;
    tree_add(t, sh, "transformer", "GPT2Model", -1, -1, 0, 0);
    tree_add(t, sh, "transformer.wte", "Embedding", 0, -1, FSDP_GPT2_WTE, 1);
    tree_add(t, sh, "transformer.wpe", "Embedding", 0, -1, FSDP_GPT2_WPE, 1);
    list = tree_add(t, sh, "transformer.h", "ModuleList", 0, -1, 0, 0);
    for (int l = 0; l < cfg->n_layer; l++) {
        char n[FSDP_LM_NAME_LEN];
        int blk, attn, mlp;
        block_name(n, sizeof(n), l, NULL);
        blk = tree_add(t, sh, n, "GPT2Block", list, l, 0, 0);
        tree_add(t, sh, sub_name(n, l, "ln_1"), "LayerNorm", blk, l, FSDP_GPT2_LN1_W, 2);
        attn = tree_add(t, sh, sub_name(n, l, "attn"), "GPT2Attention", blk, l, 0, 0);
        tree_add(t, sh, sub_name(n, l, "attn.c_attn"), "Conv1D", attn, l, FSDP_GPT2_ATTN_W, 2);
        tree_add(t, sh, sub_name(n, l, "attn.c_proj"), "Conv1D", attn, l, FSDP_GPT2_ATTN_PROJ_W, 2);
        tree_add(t, sh, sub_name(n, l, "ln_2"), "LayerNorm", blk, l, FSDP_GPT2_LN2_W, 2);
        mlp = tree_add(t, sh, sub_name(n, l, "mlp"), "GPT2MLP", blk, l, 0, 0);
        tree_add(t, sh, sub_name(n, l, "mlp.c_fc"), "Conv1D", mlp, l, FSDP_GPT2_FC_W, 2);
        tree_add(t, sh, sub_name(n, l, "mlp.c_proj"), "Conv1D", mlp, l, FSDP_GPT2_FC_PROJ_W, 2);
    }
    tree_add(t, sh, "transformer.ln_f", "LayerNorm", 0, -1, FSDP_GPT2_LNF_W, 2);
    return FSDP_OK;
}

/* ---- initialization ---- */

int fsdp_gpt2_slice_parts(int block, int index)
{
    if (block < 0)
        return index == FSDP_GPT2_WTE ? -1 : 0;
    return index == FSDP_GPT2_ATTN_W || index == FSDP_GPT2_ATTN_B           ? 3
           : index == FSDP_GPT2_FC_W || index == FSDP_GPT2_FC_B             ? 1
           : index == FSDP_GPT2_ATTN_PROJ_W || index == FSDP_GPT2_FC_PROJ_W ? -1
                                                                            : 0;
}

/* kind 0: normal (HF's normal_(std), the polar method), 1: ones, 2: zeros, of parameter
 * `index` of block `block` (-1: the root). Under tensor parallelism a sliced normal tensor is
 * drawn whole, as one process draws it (the polar method cannot skip), and this rank keeps its
 * slice. */
static fsdp_status_t init_param(fsdp_gpt2_t *m, int block, int index, int kind, float std,
                                fsdp_rng_t *rng, float *buf)
{
    fsdp_unit_t *u = block < 0 ? m->lm.root : m->lm.layers[block];
    const int parts = fsdp_gpt2_slice_parts(block, index);
    fsdp_param_info_t info;
    size_t first, count, cols;
    float *full;
    fsdp_status_t status = fsdp_unit_param_info(u, index, &info);

    if (status == FSDP_OK)
        status = fsdp_unit_set_param_reads(u, index, &first, &count);
    if (status != FSDP_OK)
        return status;
    if (kind == 0 && m->tp > 1 && parts != 0) {
        full = malloc(info.numel * (size_t)m->tp * sizeof(float));
        if (full == NULL)
            return FSDP_ERR_NO_MEMORY;
        fsdp_rng_normal_polar(rng, full, info.numel * (size_t)m->tp, std, 0,
                              info.numel * (size_t)m->tp);
        cols = info.ndim == 2 ? (size_t)info.shape[1] : info.numel;
        for (size_t i = first; i < first + count; i++)
            buf[i] = full[fsdp_nn_slice_index(i, info.numel, cols, parts, m->tp, m->tp_rank)];
        free(full);
    } else if (kind == 0) { /* every rank draws the whole stream, and computes only its part */
        fsdp_rng_normal_polar(rng, buf, info.numel, std, first, count);
    }
    for (size_t i = first; kind != 0 && i < first + count; i++)
        buf[i] = kind == 1 ? 1.0f : 0.0f;
    return fsdp_unit_set_param(u, index, buf);
}

fsdp_status_t fsdp_gpt2_init_params(fsdp_lm_t *lm, uint64_t seed)
{
    fsdp_gpt2_t *model = fsdp_gpt2_of(lm);
    const fsdp_gpt2_config_t *cfg = &model->cfg;
    const float std = cfg->initializer_range;
    const float proj_std = std / sqrtf(2.0f * (float)cfg->n_layer);
    fsdp_status_t status = FSDP_OK;
    fsdp_rng_t rng;
    float *buf;

    if (fsdp_device(model->lm.fs)->no_data)
        return FSDP_OK; /* shape mode: no values to set */
    buf = fsdp_lm_param_buffer(&model->lm);
    if (buf == NULL)
        return FSDP_ERR_NO_MEMORY;
    fsdp_rng_seed(&rng, seed);
    /* kind 0: normal, 1: ones, 2: zeros */
    status = init_param(model, -1, FSDP_GPT2_WTE, 0, std, &rng, buf);
    if (status == FSDP_OK)
        status = init_param(model, -1, FSDP_GPT2_WPE, 0, std, &rng, buf);
    if (status == FSDP_OK)
        status = init_param(model, -1, FSDP_GPT2_LNF_W, 1, 0.0f, &rng, buf);
    if (status == FSDP_OK)
        status = init_param(model, -1, FSDP_GPT2_LNF_B, 2, 0.0f, &rng, buf);
    for (int l = 0; l < cfg->n_layer && status == FSDP_OK; l++) {
        for (int i = 0; i < FSDP_GPT2_BLOCK_NPARAMS && status == FSDP_OK; i++) {
            int kind = 2;
            float s = std;
            if (i == FSDP_GPT2_LN1_W || i == FSDP_GPT2_LN2_W)
                kind = 1;
            else if (i == FSDP_GPT2_ATTN_W || i == FSDP_GPT2_FC_W)
                kind = 0;
            else if (i == FSDP_GPT2_ATTN_PROJ_W || i == FSDP_GPT2_FC_PROJ_W)
                kind = 0, s = proj_std;
            status = init_param(model, l, i, kind, s, &rng, buf);
        }
    }
    free(buf);
    return status;
}
