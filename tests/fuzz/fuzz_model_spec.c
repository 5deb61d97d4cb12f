/* libFuzzer: model specs as --model takes them ("llama:layers=2,heads=4,...", "gpt2:...", a
 * preset, "mlp:8,12,3"). A spec that parses must pass its model's check, its parameter count
 * must equal the formula in double precision (no 64-bit wrap), its numbers must be finite in
 * their own type (a float eps) and its rotary frequencies must be finite. */
#include <fsdp/gpt2.h>
#include <fsdp/llama.h>
#include <fsdp/log.h>
#include <fsdp/nn.h>

#include "nn/nn_hidden.h" /* the configs' checks */

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fsdp_log_set_level(FSDP_LOG_OFF);
    return 0;
}

static void llama(const char *spec)
{
    fsdp_llama_config_t cfg;
    float *inv_freq;
    int hd;
    double d, h, k, expect;

    if (fsdp_llama_config_parse(spec, &cfg) != FSDP_OK)
        return;
    if (fsdp_llama_config_check(&cfg) != FSDP_OK)
        __builtin_trap(); /* parse accepted what check refuses */
    if (!isfinite(cfg.rms_norm_eps) || !isfinite(cfg.rope_theta) || !isfinite(cfg.rope_factor))
        __builtin_trap();
    hd = fsdp_llama_head_dim(&cfg);
    if (hd < 2 || hd % 2 != 0)
        __builtin_trap();
    d = cfg.dim, h = cfg.n_head, k = cfg.n_kv_head;
    expect =
        (double)cfg.vocab_size * d * (cfg.tie_word_embeddings ? 1 : 2) +
        (double)cfg.n_layer * (d * (h + 2 * k) * hd + h * hd * d + 3 * d * cfg.ffn_dim + 2 * d) + d;
    if (fabs((double)fsdp_llama_num_params(&cfg) - expect) > 1e-9 * expect)
        __builtin_trap();
    inv_freq = malloc((size_t)hd / 2 * sizeof(*inv_freq));
    if (inv_freq == NULL)
        return;
    fsdp_llama_inv_freq(&cfg, inv_freq);
    for (int i = 0; i < hd / 2; i++)
        if (!isfinite(inv_freq[i]) || inv_freq[i] < 0.0f)
            __builtin_trap();
    free(inv_freq);
}

static void gpt(const char *spec)
{
    fsdp_gpt2_config_t cfg;
    double c, expect;

    if (fsdp_gpt2_config_parse(spec, &cfg) != FSDP_OK)
        return;
    if (fsdp_gpt2_config_check(&cfg) != FSDP_OK || !isfinite(cfg.layer_norm_eps))
        __builtin_trap();
    c = cfg.n_embd;
    expect = ((double)cfg.vocab_size + cfg.n_positions) * c + 2 * c +
             (double)cfg.n_layer * (12 * c * c + 13 * c);
    if (fabs((double)fsdp_gpt2_num_params(&cfg) - expect) > 1e-9 * expect)
        __builtin_trap();
    (void)fsdp_gpt2_flops_per_token(&cfg, 1);
}

static void mlp(const char *spec)
{
    int dims[64], n = fsdp_mlp_parse_spec(spec, dims, 64); /* layers: n + 1 widths */

    for (int i = 0; i <= n; i++)
        if (dims[i] < 1)
            __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *spec = malloc(size + 1);

    if (spec == NULL)
        return 0;
    memcpy(spec, data, size);
    spec[size] = '\0';
    llama(spec);
    gpt(spec);
    mlp(spec);
    free(spec);
    return 0;
}
