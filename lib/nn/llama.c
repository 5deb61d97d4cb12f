/* Llama: configurations and presets, the rotary frequencies, the units and their parameters,
 * HF's initialization. The forward and backward are in llama_run.c, the HF checkpoints in
 * llama_hf.c, the model as an fsdp_lm_t in llama_lm.c. */
#include "config.h"

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp/llama.h>
#include <fsdp/log.h>
#include <fsdp/nn.h>

#include "nn/llama_int.h"

/* ---- presets ---- */

#define LLAMA2_VOCAB 32000
#define LLAMA3_VOCAB 128256

/* name, layers, heads, kv heads, width, ffn, context, vocab, theta, tied, scaling factor (0:
 * none), published parameters */
#define LLAMA_PRESET(name, l, h, k, d, f, ctx, v, theta, tie, factor, params, what)                \
    {                                                                                              \
        name, {l,     h,     k,   d,          f,      0,   ctx, v,   theta,                        \
               1e-5f, 0.02f, tie, factor > 0, factor, 1.0, 4.0, 8192},                             \
            params, what                                                                           \
    }

static const fsdp_llama_preset_t presets[] = {
    LLAMA_PRESET("llama-tiny", 2, 4, 2, 64, 176, 64, 256, 10000.0, 0, 0.0, 125248ull,
                 "byte-level toy for tests and the demo (GQA, 4 heads of 16, 2 kv heads)"),
    LLAMA_PRESET("llama2-7b", 32, 32, 32, 4096, 11008, 4096, LLAMA2_VOCAB, 10000.0, 0, 0.0,
                 6738415616ull, "meta-llama/Llama-2-7b-hf"),
    LLAMA_PRESET("llama2-13b", 40, 40, 40, 5120, 13824, 4096, LLAMA2_VOCAB, 10000.0, 0, 0.0,
                 13015864320ull, "meta-llama/Llama-2-13b-hf"),
    LLAMA_PRESET("llama2-70b", 80, 64, 8, 8192, 28672, 4096, LLAMA2_VOCAB, 10000.0, 0, 0.0,
                 68976648192ull, "meta-llama/Llama-2-70b-hf"),
    LLAMA_PRESET("llama3-8b", 32, 32, 8, 4096, 14336, 8192, LLAMA3_VOCAB, 500000.0, 0, 0.0,
                 8030261248ull, "meta-llama/Meta-Llama-3-8B"),
    LLAMA_PRESET("llama3-70b", 80, 64, 8, 8192, 28672, 8192, LLAMA3_VOCAB, 500000.0, 0, 0.0,
                 70553706496ull, "meta-llama/Meta-Llama-3-70B"),
    LLAMA_PRESET("llama3.1-405b", 126, 128, 8, 16384, 53248, 131072, LLAMA3_VOCAB, 500000.0, 0, 8.0,
                 405853388800ull, "meta-llama/Llama-3.1-405B (rope_scaling llama3, factor 8)"),
    LLAMA_PRESET("llama3.2-1b", 16, 32, 8, 2048, 8192, 131072, LLAMA3_VOCAB, 500000.0, 1, 32.0,
                 1235814400ull, "meta-llama/Llama-3.2-1B (tied, rope_scaling llama3, factor 32)"),
    LLAMA_PRESET("llama3.2-3b", 28, 24, 8, 3072, 8192, 131072, LLAMA3_VOCAB, 500000.0, 1, 32.0,
                 3212749824ull, "meta-llama/Llama-3.2-3B (tied, rope_scaling llama3, factor 32)"),
};

#define NPRESETS ((int)(sizeof(presets) / sizeof(presets[0])))

const fsdp_llama_preset_t *fsdp_llama_presets(int *count_p)
{
    *count_p = NPRESETS;
    return presets;
}

const fsdp_llama_preset_t *fsdp_llama_preset_find(const char *name)
{
    for (int i = 0; name != NULL && i < NPRESETS; i++) {
        if (strcmp(presets[i].name, name) == 0)
            return &presets[i];
    }
    return NULL;
}

const char *fsdp_llama_preset_names(void)
{
    return "llama-tiny, llama2-7b, llama2-13b, llama2-70b, llama3-8b, llama3-70b, llama3.1-405b, "
           "llama3.2-1b, llama3.2-3b";
}

int fsdp_llama_spec_is_llama(const char *spec)
{
    return spec != NULL && strncmp(spec, "llama", 5) == 0;
}

int fsdp_llama_head_dim(const fsdp_llama_config_t *cfg)
{
    return cfg->head_dim > 0 ? cfg->head_dim : cfg->n_head > 0 ? cfg->dim / cfg->n_head : 0;
}

fsdp_status_t fsdp_llama_config_check(const fsdp_llama_config_t *cfg)
{
    const int hd = fsdp_llama_head_dim(cfg);
    const char *bad = NULL;

    if (cfg->n_layer < 1 || cfg->n_layer > FSDP_LLAMA_MAX_LAYERS)
        bad = "layers must be in [1, 1024]";
    else if (cfg->n_head < 1 || cfg->n_kv_head < 1 || cfg->n_head % cfg->n_kv_head != 0)
        bad = "kv_heads must divide heads";
    else if (cfg->dim < 1 || cfg->dim > (1 << 20) || cfg->ffn_dim < 1 || cfg->ffn_dim > (1 << 22))
        bad = "dim must be in [1, 2^20] and ffn in [1, 2^22]";
    else if (cfg->head_dim == 0 && cfg->dim % cfg->n_head != 0)
        bad = "heads must divide dim (or give head_dim)";
    else if (hd < 2 || hd % 2 != 0 || hd > 256)
        bad = "head_dim must be even and in [2, 256]";
    else if (cfg->max_seq < 1 || cfg->max_seq > (1 << 24))
        bad = "seq must be in [1, 2^24]";
    else if (cfg->vocab_size < 1 || cfg->vocab_size > (1 << 24))
        bad = "vocab must be in [1, 2^24]";
    else if (!(cfg->rope_theta > 1.0) || !isfinite(cfg->rope_theta) ||
             !(cfg->rms_norm_eps >= 0.0f) || !isfinite(cfg->rms_norm_eps) ||
             !(cfg->initializer_range >= 0.0f) || !isfinite(cfg->initializer_range))
        bad = "rope_theta must be finite and > 1, eps and initializer_range finite and >= 0";
    else if (cfg->rope_scaling &&
             (!(cfg->rope_factor >= 1.0) || !(cfg->rope_low_freq_factor > 0.0) ||
              !(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor) ||
              !isfinite(cfg->rope_factor) || !isfinite(cfg->rope_high_freq_factor) ||
              cfg->rope_original_max_seq < 1))
        bad = "rope scaling needs factor >= 1, 0 < low < high frequency factors and an original "
              "context >= 1";
    if (bad != NULL) {
        fsdp_error("llama config layers=%d heads=%d kv_heads=%d dim=%d ffn=%d head_dim=%d seq=%d "
                   "vocab=%d: %s",
                   cfg->n_layer, cfg->n_head, cfg->n_kv_head, cfg->dim, cfg->ffn_dim, cfg->head_dim,
                   cfg->max_seq, cfg->vocab_size, bad);
        return FSDP_ERR_INVALID_PARAM;
    }
    return FSDP_OK;
}

#define LLAMA_SPEC_FORM                                                                            \
    "llama:layers=L,heads=H,kv_heads=K,dim=D,ffn=F,seq=T,vocab=V,rope_theta=X,eps=E[,tie=1][,"     \
    "rope_scaling=llama3][,rope_factor=F][,head_dim=hd]"

static const char *const rope_types[] = {"none", "llama3", NULL};

#define LLAMA_KEY(key, type, field, lo, hi)                                                        \
    {                                                                                              \
        key, FSDP_NN_SPEC_##type, offsetof(fsdp_llama_config_t, field), lo, hi, NULL               \
    }

/* the ranges of fsdp_llama_config_check, where one key alone decides them */
static const fsdp_nn_spec_key_t llama_keys[] = {
    LLAMA_KEY("layers", INT, n_layer, 1, FSDP_LLAMA_MAX_LAYERS),
    LLAMA_KEY("heads", INT, n_head, 1, 1 << 24),
    LLAMA_KEY("kv_heads", INT, n_kv_head, 1, 1 << 24),
    LLAMA_KEY("dim", INT, dim, 1, 1 << 20),
    LLAMA_KEY("ffn", INT, ffn_dim, 1, 1 << 22),
    LLAMA_KEY("seq", INT, max_seq, 1, 1 << 24),
    LLAMA_KEY("vocab", INT, vocab_size, 1, 1 << 24),
    LLAMA_KEY("rope_theta", DOUBLE, rope_theta, 0, DBL_MAX),
    LLAMA_KEY("eps", FLOAT, rms_norm_eps, 0, FLT_MAX),
    LLAMA_KEY("tie", INT, tie_word_embeddings, 0, 1),
    {"rope_scaling", FSDP_NN_SPEC_CHOICE, offsetof(fsdp_llama_config_t, rope_scaling), 0, 0,
     rope_types},
    LLAMA_KEY("rope_factor", DOUBLE, rope_factor, 1, DBL_MAX),
    LLAMA_KEY("head_dim", INT, head_dim, 2, 256),
};

fsdp_status_t fsdp_llama_config_parse(const char *spec, fsdp_llama_config_t *cfg_p)
{
    const fsdp_llama_preset_t *preset = fsdp_llama_preset_find(spec);
    fsdp_llama_config_t cfg = presets[0].cfg;

    if (preset != NULL) {
        *cfg_p = preset->cfg;
        return FSDP_OK;
    }
    if (spec == NULL || strncmp(spec, "llama:", 6) != 0) {
        fsdp_error("model '%s' is not a llama model: expected one of %s, or " LLAMA_SPEC_FORM,
                   spec ? spec : "(null)", fsdp_llama_preset_names());
        return FSDP_ERR_INVALID_PARAM;
    }
    if (fsdp_nn_spec_parse(spec, LLAMA_SPEC_FORM, llama_keys,
                           (int)(sizeof(llama_keys) / sizeof(llama_keys[0])), &cfg) != FSDP_OK)
        return FSDP_ERR_INVALID_PARAM;
    /* rope_scaling=llama3 without rope_factor (llama-tiny's 0; a given one is >= 1) is Llama
     * 3.1's factor 8 */
    if (cfg.rope_scaling && cfg.rope_factor == 0.0)
        cfg.rope_factor = 8.0;
    if (fsdp_llama_config_check(&cfg) != FSDP_OK)
        return FSDP_ERR_INVALID_PARAM;
    *cfg_p = cfg;
    return FSDP_OK;
}

uint64_t fsdp_llama_layer_params(const fsdp_llama_config_t *cfg)
{
    uint64_t d = (uint64_t)cfg->dim, hd = (uint64_t)fsdp_llama_head_dim(cfg);
    uint64_t h = (uint64_t)cfg->n_head, k = (uint64_t)cfg->n_kv_head, f = (uint64_t)cfg->ffn_dim;
    return d * (h + 2 * k) * hd + h * hd * d + 3 * d * f + 2 * d;
}

uint64_t fsdp_llama_num_params(const fsdp_llama_config_t *cfg)
{
    uint64_t d = (uint64_t)cfg->dim, v = (uint64_t)cfg->vocab_size;
    return v * d * (cfg->tie_word_embeddings ? 1 : 2) +
           (uint64_t)cfg->n_layer * fsdp_llama_layer_params(cfg) + d;
}

/* HF's _compute_default_rope_parameters and _compute_llama3_parameters: inv_freq = theta^(-2i/hd)
 * as torch computes it in f32; with llama3 scaling, wavelengths above orig / low are divided by
 * factor, those below orig / high kept, and those between blended. */
void fsdp_llama_inv_freq(const fsdp_llama_config_t *cfg, float *inv_freq)
{
    const int hd = fsdp_llama_head_dim(cfg);

    for (int i = 0; i < hd / 2; i++) {
        double f = (double)(float)(1.0 / pow(cfg->rope_theta, (double)(2 * i) / hd));
        if (cfg->rope_scaling) {
            const double orig = cfg->rope_original_max_seq, factor = cfg->rope_factor;
            const double low = cfg->rope_low_freq_factor, high = cfg->rope_high_freq_factor;
            const double wavelen = 2.0 * M_PI / f;
            if (wavelen > orig / low) {
                f = f / factor;
            } else if (!(wavelen < orig / high)) {
                double s = (orig / wavelen - low) / (high - low);
                f = (1.0 - s) * f / factor + s * f;
            }
        }
        inv_freq[i] = (float)f;
    }
}

/* ---- HF's LlamaForCausalLM as a module tree (lm_int.h) ---- */

static const char *const layer_names[FSDP_LLAMA_LAYER_NPARAMS] = {
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "mlp.gate_proj.weight",    "mlp.up_proj.weight",
    "mlp.down_proj.weight",    "input_layernorm.weight",  "post_attention_layernorm.weight"};

static const char *const root_names[FSDP_LLAMA_ROOT_NPARAMS] = {
    "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"};

const char *fsdp_llama_layer_param_name(int index)
{
    return layer_names[index];
}

const char *fsdp_llama_root_param_name(int index)
{
    return root_names[index];
}

void fsdp_llama_param_shape(const fsdp_llama_config_t *cfg, int layer, int index, int *ndim_p,
                            int64_t shape[2])
{
    const int64_t d = cfg->dim, hd = fsdp_llama_head_dim(cfg), f = cfg->ffn_dim;
    const int64_t h = cfg->n_head, k = cfg->n_kv_head;

    *ndim_p = 2;
    shape[1] = d;
    if (layer < 0) {
        *ndim_p = index == FSDP_LLAMA_NORM ? 1 : 2;
        shape[0] = index == FSDP_LLAMA_NORM ? d : cfg->vocab_size;
        return;
    }
    switch (index) {
    case FSDP_LLAMA_Q:
        shape[0] = h * hd;
        break;
    case FSDP_LLAMA_K:
    case FSDP_LLAMA_V:
        shape[0] = k * hd;
        break;
    case FSDP_LLAMA_O:
        shape[0] = d;
        shape[1] = h * hd;
        break;
    case FSDP_LLAMA_GATE:
    case FSDP_LLAMA_UP:
        shape[0] = f;
        break;
    case FSDP_LLAMA_DOWN:
        shape[0] = d;
        shape[1] = f;
        break;
    default: /* the norms */
        *ndim_p = 1;
        shape[0] = d;
        break;
    }
}

/* Adds module `name` of `type` under `parent`, owning np parameters of layer `layer` (-1: the
 * root's) from index pi0 on. Returns its index. */
static int tree_add(fsdp_lm_tree_t *t, const fsdp_llama_config_t *cfg, const char *name,
                    const char *type, int parent, int layer, int pi0, int np)
{
    int m = fsdp_lm_tree_module(t, name, type, parent);

    for (int i = pi0; i < pi0 + np; i++) {
        int nd;
        int64_t shape[2];
        char *pn;
        fsdp_llama_param_shape(cfg, layer, i, &nd, shape);
        pn = fsdp_lm_tree_param(t, nd, shape);
        /* the norms' weights: replicated over tp, applied to sequence shards */
        t->params[t->nparams - 1].tp_partial_grad = nd == 1;
        t->params[t->nparams - 1].tp_shard = fsdp_llama_slice_parts(layer, i);
        if (layer < 0)
            snprintf(pn, FSDP_LM_NAME_LEN, "%s", root_names[i]);
        else
            snprintf(pn, FSDP_LM_NAME_LEN, "model.layers.%d.%s", layer, layer_names[i]);
    }
    return m;
}

fsdp_status_t fsdp_llama_tp_config(const fsdp_llama_config_t *cfg, int tp,
                                   fsdp_llama_config_t *local_p)
{
    fsdp_llama_config_t local = *cfg;

    if (tp <= 1) {
        *local_p = local;
        return FSDP_OK;
    }
    if (cfg->n_head % tp != 0 || cfg->n_kv_head % tp != 0 || cfg->ffn_dim % tp != 0 ||
        cfg->vocab_size % tp != 0) {
        fsdp_error("llama: tp %d must divide heads %d, kv_heads %d, ffn %d and vocab %d (the "
                   "column-parallel q, k, v, gate, up and the vocabulary-parallel embedding and "
                   "head split them)",
                   tp, cfg->n_head, cfg->n_kv_head, cfg->ffn_dim, cfg->vocab_size);
        return FSDP_ERR_INVALID_PARAM;
    }
    local.head_dim = fsdp_llama_head_dim(cfg);
    local.n_head /= tp;
    local.n_kv_head /= tp;
    local.ffn_dim /= tp;
    local.vocab_size /= tp;
    *local_p = local;
    return FSDP_OK;
}

/* HF's LlamaForCausalLM in named_modules order; the root is named "model" here. */
fsdp_status_t fsdp_llama_tree_build(fsdp_lm_tree_t *t, const void *cfg_v)
{
    const fsdp_llama_config_t *cfg = cfg_v;
    int list;
    fsdp_status_t status =
        fsdp_lm_tree_alloc(t, 5 + 12 * cfg->n_layer, 3 + FSDP_LLAMA_LAYER_NPARAMS * cfg->n_layer);

    if (status != FSDP_OK)
        return status;
    tree_add(t, cfg, "model", "LlamaForCausalLM", -1, -1, 0, 0);
    tree_add(t, cfg, "model.embed_tokens", "Embedding", 0, -1, FSDP_LLAMA_EMBED, 1);
    list = tree_add(t, cfg, "model.layers", "ModuleList", 0, -1, 0, 0);
    for (int l = 0; l < cfg->n_layer; l++) {
        static const char *const lin[] = {
            "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
        char n[FSDP_LM_NAME_LEN], s[FSDP_LM_NAME_LEN];
        int layer, attn, mlp;
        snprintf(n, sizeof(n), "model.layers.%d", l);
        layer = tree_add(t, cfg, n, "LlamaDecoderLayer", list, l, 0, 0);
        snprintf(s, sizeof(s), "%s.self_attn", n);
        attn = tree_add(t, cfg, s, "LlamaAttention", layer, l, 0, 0);
        for (int i = FSDP_LLAMA_Q; i <= FSDP_LLAMA_O; i++) {
            snprintf(s, sizeof(s), "%s.%s", n, lin[i]);
            tree_add(t, cfg, s, "Linear", attn, l, i, 1);
        }
        snprintf(s, sizeof(s), "%s.mlp", n);
        mlp = tree_add(t, cfg, s, "LlamaMLP", layer, l, 0, 0);
        for (int i = FSDP_LLAMA_GATE; i <= FSDP_LLAMA_DOWN; i++) {
            snprintf(s, sizeof(s), "%s.%s", n, lin[i]);
            tree_add(t, cfg, s, "Linear", mlp, l, i, 1);
        }
        snprintf(s, sizeof(s), "%s.input_layernorm", n);
        tree_add(t, cfg, s, "LlamaRMSNorm", layer, l, FSDP_LLAMA_LN1, 1);
        snprintf(s, sizeof(s), "%s.post_attention_layernorm", n);
        tree_add(t, cfg, s, "LlamaRMSNorm", layer, l, FSDP_LLAMA_LN2, 1);
    }
    tree_add(t, cfg, "model.norm", "LlamaRMSNorm", 0, -1, FSDP_LLAMA_NORM, 1);
    if (!cfg->tie_word_embeddings)
        tree_add(t, cfg, "lm_head", "Linear", 0, -1, FSDP_LLAMA_LM_HEAD, 1);
    return FSDP_OK;
}

/* ---- the model ---- */

fsdp_status_t fsdp_llama_set_eager_memory(fsdp_lm_t *lm, int on)
{
    if (fsdp_lm_of_family(lm, "llama", "fsdp_llama_set_eager_memory") == NULL)
        return FSDP_ERR_INVALID_PARAM;
    if (on && !fsdp_device(lm->fs)->no_data) {
        fsdp_error("llama: eager memory is for shape mode (a device without data)");
        return FSDP_ERR_UNSUPPORTED;
    }
    fsdp_llama_of(lm)->eager_memory = on != 0;
    return FSDP_OK;
}

/* ---- initialization ---- */

/* How a parameter is cut over tp ranks: whole (replicated), its rows (column-parallel, the
 * vocabulary-parallel tables) or its columns (row-parallel). */
enum { SLICE_WHOLE, SLICE_ROWS, SLICE_COLS };

/* the slice of parameter `index` of a layer (layer >= 0) or of the root */
static int param_slice(int layer, int index)
{
    if (layer < 0)
        return index == FSDP_LLAMA_NORM ? SLICE_WHOLE : SLICE_ROWS;
    return index == FSDP_LLAMA_O || index == FSDP_LLAMA_DOWN ? SLICE_COLS
           : index >= FSDP_LLAMA_LN1                         ? SLICE_WHOLE
                                                             : SLICE_ROWS;
}

int fsdp_llama_slice_parts(int layer, int index)
{
    const int slice = param_slice(layer, index);
    return slice == SLICE_ROWS ? -1 : slice == SLICE_COLS ? 1 : 0;
}

size_t fsdp_llama_slice_run(const fsdp_llama_t *m, int layer, int index, size_t numel, size_t cols,
                            size_t i, size_t end, size_t *full_p)
{
    const int slice = m->tp > 1 ? param_slice(layer, index) : SLICE_WHOLE;
    const size_t tp = (size_t)m->tp, t = (size_t)m->tp_rank;

    *full_p = slice == SLICE_ROWS   ? t * numel + i
              : slice == SLICE_COLS ? (i / cols) * cols * tp + t * cols + i % cols
                                    : i;
    return slice == SLICE_COLS && end - i > cols - i % cols ? cols - i % cols : end - i;
}

/* One parameter: normal of std (ones when std < 0), through buf. Each normal takes two draws,
 * so a rank skips to the values it keeps (fsdp_unit_set_param_reads) and past the rest. Under
 * tensor parallelism the values are those of this rank's slice of the full tensor, as one
 * process draws the full tensor: each run of elements contiguous in the full tensor is drawn
 * from the generator skipped to its place, and the generator moves past the full tensor. */
static fsdp_status_t init_param(const fsdp_llama_t *m, int layer, int index, float std,
                                fsdp_rng_t *rng, float *buf)
{
    fsdp_unit_t *u = layer < 0 ? m->lm.root : m->lm.layers[layer];
    fsdp_param_info_t info;
    size_t first, count, cols, f, run;
    const fsdp_rng_t base = *rng;
    fsdp_status_t status = fsdp_unit_param_info(u, index, &info);

    if (status == FSDP_OK)
        status = fsdp_unit_set_param_reads(u, index, &first, &count);
    if (status != FSDP_OK)
        return status;
    cols = info.ndim == 2 ? (size_t)info.shape[1] : info.numel;
    for (size_t i = first; i < first + count; i += run) {
        fsdp_rng_t g = base;
        run = fsdp_llama_slice_run(m, layer, index, info.numel, cols, i, first + count, &f);
        if (std >= 0.0f)
            fsdp_rng_skip(&g, 2 * (uint64_t)f);
        for (size_t j = i; j < i + run; j++)
            buf[j] = std < 0.0f ? 1.0f : std * fsdp_rng_normal(&g);
    }
    /* past the full tensor: every rank's slices of it */
    if (std >= 0.0f)
        fsdp_rng_skip(rng, 2 * (uint64_t)(m->tp > 1 && param_slice(layer, index) != SLICE_WHOLE
                                              ? info.numel * (size_t)m->tp
                                              : info.numel));
    return fsdp_unit_set_param(u, index, buf);
}

fsdp_status_t fsdp_llama_init_params(fsdp_lm_t *lm, uint64_t seed)
{
    fsdp_llama_t *model = fsdp_llama_of(lm);
    const fsdp_llama_config_t *cfg = &model->cfg;
    const float std = cfg->initializer_range;
    const int nroot = cfg->tie_word_embeddings ? 2 : 3;
    fsdp_status_t status = FSDP_OK;
    fsdp_rng_t rng;
    float *buf;

    if (fsdp_device(model->lm.fs)->no_data)
        return FSDP_OK; /* shape mode: no values to set */
    buf = fsdp_lm_param_buffer(&model->lm);
    if (buf == NULL)
        return FSDP_ERR_NO_MEMORY;
    fsdp_rng_seed(&rng, seed);
    for (int i = 0; i < nroot && status == FSDP_OK; i++)
        status = init_param(model, -1, i, i == FSDP_LLAMA_NORM ? -1.0f : std, &rng, buf);
    for (int l = 0; l < cfg->n_layer && status == FSDP_OK; l++) {
        for (int i = 0; i < FSDP_LLAMA_LAYER_NPARAMS && status == FSDP_OK; i++)
            status = init_param(model, l, i, i >= FSDP_LLAMA_LN1 ? -1.0f : std, &rng, buf);
    }
    free(buf);
    return status;
}
