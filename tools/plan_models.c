/* fsdp-plan's models (plan.h): the MLP, GPT-2 / GPT-3 and Llama families, built and stepped
 * in shape mode, and the table of their names. */
#include "plan.h"

#include <stdlib.h>
#include <string.h>

#include "cli.h"

static int mlp_parse(const char *spec, model_cfg_t *cfg)
{
    cfg->nlayers = fsdp_mlp_parse_spec(spec, cfg->dims, MAX_DIMS);
    return cfg->nlayers >= 1 ? 0 : -1;
}

static fsdp_status_t mlp_create(fsdp_t *fs, const model_cfg_t *cfg, void **model_p)
{
    /* shape mode: no initial values to set */
    return fsdp_mlp_create(fs, cfg->dims, cfg->nlayers, (fsdp_mlp_t **)model_p);
}

static fsdp_status_t mlp_step(void *model, size_t batch, size_t seq)
{
    float loss;
    (void)seq;
    /* shape mode moves no data: there is no batch in host memory */
    return fsdp_mlp_forward_backward(model, NULL, NULL, batch, &loss);
}

static void mlp_phase_hook(void *model, fsdp_phase_func_t func, void *arg)
{
    fsdp_mlp_set_phase_hook(model, func, arg);
}

static void mlp_destroy(void *model)
{
    fsdp_mlp_destroy(model);
}

static double mlp_params(const model_cfg_t *cfg)
{
    return (double)fsdp_mlp_num_params(cfg->dims, cfg->nlayers);
}

static int mlp_units(const model_cfg_t *cfg)
{
    return cfg->nlayers;
}

static const model_ops_t mlp_ops = {mlp_parse,   mlp_create, mlp_step,  mlp_phase_hook,
                                    mlp_destroy, mlp_params, mlp_units, NULL};

/* GPT-3 175B's shape (96 blocks of 12 x 12288^2 = 1.81e9 parameters) as an MLP: 96 Linear
 * units alternating 12288 -> 147456 -> 12288, 1.74e11 parameters. */
static int mlp_175b_parse(const char *spec, model_cfg_t *cfg)
{
    (void)spec;
    cfg->nlayers = 96;
    for (int i = 0; i <= cfg->nlayers; i++)
        cfg->dims[i] = i % 2 ? 12 * 12288 : 12288;
    return 0;
}

static const model_ops_t mlp_175b_ops = {mlp_175b_parse, mlp_create, mlp_step,  mlp_phase_hook,
                                         mlp_destroy,    mlp_params, mlp_units, NULL};

/* GPT-2 and the GPT-3 family (include/fsdp/gpt2.h): a preset name or gpt2:layers=...,
 * sequences of n_positions tokens, or --seq. */
static int gpt_parse(const char *spec, model_cfg_t *cfg)
{
    return fsdp_gpt2_config_parse(spec, &cfg->gpt) == FSDP_OK ? 0 : -1;
}

static fsdp_status_t gpt_create(fsdp_t *fs, const model_cfg_t *cfg, void **model_p)
{
    fsdp_status_t st = fsdp_gpt2_create(fs, &cfg->gpt, (fsdp_lm_t **)model_p);
    if (st == FSDP_OK && cfg->checkpoint_activations)
        st = fsdp_lm_set_checkpointing(*model_p, -1, FSDP_LM_CKPT_FULL);
    return st;
}

static fsdp_status_t gpt_step(void *model, size_t batch, size_t seq)
{
    int32_t *tokens;
    float loss;
    fsdp_status_t st;

    /* shape mode reads no tokens: zeros stand for the batch */
    tokens = calloc(batch * seq, sizeof(*tokens));
    if (tokens == NULL)
        return FSDP_ERR_NO_MEMORY;
    st = fsdp_lm_forward_backward(model, tokens, tokens, batch, seq, &loss);
    free(tokens);
    return st;
}

/* GPT-2's and Llama's: an fsdp_lm_t (lm.h) */
static void lm_destroy(void *model)
{
    fsdp_lm_destroy(model);
}

static double gpt_params(const model_cfg_t *cfg)
{
    return (double)fsdp_gpt2_num_params(&cfg->gpt);
}

static int gpt_units(const model_cfg_t *cfg)
{
    return cfg->gpt.n_layer + 1;
}

static double gpt_palm_flops(const model_cfg_t *cfg)
{
    const fsdp_gpt2_config_t *g = &cfg->gpt;
    double embed = ((double)g->vocab_size + g->n_positions) * g->n_embd; /* wte, wpe */
    return 6.0 * (gpt_params(cfg) - embed) + 12.0 * g->n_layer * g->n_embd * (double)cfg->seq;
}

static const model_ops_t gpt_ops = {gpt_parse,  gpt_create, gpt_step,  NULL,
                                    lm_destroy, gpt_params, gpt_units, gpt_palm_flops};

/* Llama (include/fsdp/llama.h): a preset name or llama:layers=..., sequences of the model's
 * length, or of 8192 tokens (Llama 3's training context) for the 128K-context presets, or
 * --seq. */
static int llama_parse(const char *spec, model_cfg_t *cfg)
{
    return fsdp_llama_config_parse(spec, &cfg->llama) == FSDP_OK ? 0 : -1;
}

static fsdp_status_t llama_create(fsdp_t *fs, const model_cfg_t *cfg, void **model_p)
{
    fsdp_status_t st = fsdp_llama_create(fs, &cfg->llama, (fsdp_lm_t **)model_p);
    int every = cfg->checkpoint_activations;
    if (st == FSDP_OK && every == CLI_AC_SELECTIVE_OP)
        st = fsdp_lm_set_checkpointing(*model_p, -1, FSDP_LM_CKPT_SELECTIVE_OP);
    for (int l = every - 1; st == FSDP_OK && every > 0 && l < cfg->llama.n_layer; l += every)
        st = fsdp_lm_set_checkpointing(*model_p, l, FSDP_LM_CKPT_FULL);
    if (st == FSDP_OK && cfg->eager_memory)
        st = fsdp_llama_set_eager_memory(*model_p, 1);
    return st;
}

static size_t llama_seq(const fsdp_llama_config_t *cfg)
{
    return cfg->max_seq < 8192 ? (size_t)cfg->max_seq : 8192;
}

static fsdp_status_t llama_step(void *model, size_t batch, size_t seq)
{
    float loss;
    /* shape mode reads no tokens */
    return fsdp_lm_forward_backward(model, NULL, NULL, batch, seq, &loss);
}

static double llama_params(const model_cfg_t *cfg)
{
    return (double)fsdp_llama_num_params(&cfg->llama);
}

static int llama_units(const model_cfg_t *cfg)
{
    return cfg->llama.n_layer + 1;
}

/* N leaves out embed_tokens only, as torchtitan counts it: an untied head is a matmul. */
static double llama_palm_flops(const model_cfg_t *cfg)
{
    const fsdp_llama_config_t *l = &cfg->llama;
    double embed = (double)l->vocab_size * l->dim;
    return 6.0 * (llama_params(cfg) - embed) +
           12.0 * l->n_layer * l->n_head * fsdp_llama_head_dim(l) * (double)cfg->seq;
}

static const model_ops_t llama_ops = {llama_parse, llama_create, llama_step,  NULL,
                                      lm_destroy,  llama_params, llama_units, llama_palm_flops};

static const model_entry_t models[] = {
    {"mlp:", NULL, "mlp:D0,D1,...,DL: a Linear/ReLU stack, one unit per Linear", &mlp_ops, MODEL_MLP, 8},
    {"mlp-175b", NULL, "GPT-3 175B's parameter and unit count as an MLP (96 units of 1.81e9)",
     &mlp_175b_ops, MODEL_MLP, 2048},
    {"gpt", fsdp_gpt2_spec_is_gpt,
     "a GPT-2 / GPT-3 preset (--list-models) or gpt2:layers=L,heads=H,dim=D,seq=T,vocab=V; "
     "--batch counts sequences, one per rank by default",
     &gpt_ops, MODEL_GPT, 0},
    {"llama", fsdp_llama_spec_is_llama,
     "a Llama preset (--list-models) or llama:layers=L,heads=H,kv_heads=K,dim=D,ffn=F,seq=T,"
     "vocab=V,...; sequences of at most 8192 tokens, one a rank by default",
     &llama_ops, MODEL_LLAMA, 0},
};
#define N_MODELS (sizeof(models) / sizeof(models[0]))

const model_entry_t *plan_model_find(const char *spec)
{
    for (size_t i = 0; i < N_MODELS; i++) {
        size_t n = strlen(models[i].name);
        if (models[i].match != NULL        ? models[i].match(spec)
            : models[i].name[n - 1] == ':' ? strncmp(spec, models[i].name, n) == 0
                                           : strcmp(spec, models[i].name) == 0)
            return &models[i];
    }
    return NULL;
}

const model_entry_t *plan_models(size_t *count_p)
{
    *count_p = N_MODELS;
    return models;
}

size_t plan_model_positions(const model_entry_t *m, const model_cfg_t *cfg, size_t *default_p)
{
    size_t n = 1;
    if (m->family == MODEL_LLAMA)
        n = (size_t)cfg->llama.max_seq;
    else if (m->family == MODEL_GPT)
        n = (size_t)cfg->gpt.n_positions;
    *default_p = m->family == MODEL_LLAMA ? llama_seq(&cfg->llama) : n;
    return n;
}
