/* libFuzzer: an HF multi-file Llama checkpoint's index (model.safetensors.index.json) as
 * --init reads it, beside two valid shard files of llama-tiny. The input is the index; the
 * loader must refuse a bad one with a line (never a file outside its directory, never a crash)
 * and accept a good one. */
#include <fsdp/llama.h>
#include <fsdp/log.h>
#include <fsdp/safetensors.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static fsdp_llama_config_t cfg;
static char dir[64], index_path[128];

/* The tensors of llama-tiny, HF's names, split over two files as HF shards them. */
static int write_shards(void)
{
    const int D = cfg.dim, H = cfg.n_head, K = cfg.n_kv_head, F = cfg.ffn_dim, V = cfg.vocab_size;
    const int hd = fsdp_llama_head_dim(&cfg);
    static const char *const names[] = {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                        "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                                        "mlp.gate_proj.weight",    "mlp.up_proj.weight",
                                        "mlp.down_proj.weight",    "input_layernorm.weight",
                                        "post_attention_layernorm.weight"};
    const int64_t shapes[9][2] = {{H * hd, D}, {K * hd, D}, {K * hd, D}, {D, H * hd}, {F, D},
                                  {F, D},      {D, F},      {D, 0},      {D, 0}};
    char tnames[2 + 9 * 8][64], path[128];
    int64_t root_shapes[3][2] = {{V, D}, {D, 0}, {V, D}};
    fsdp_st_entry_t e[2 + 9 * 8];
    float *zeros = calloc((size_t)V * (size_t)(D > F ? D : F) + (size_t)F * D, sizeof(float));
    int n[2] = {0, 0}, ok = zeros != NULL;

    for (int file = 0; file < 2 && ok; file++) {
        fsdp_st_entry_t *f = e;
        int k = 0;
        if (file == 0) { /* the embedding and the first half of the layers */
            snprintf(tnames[k], 64, "model.embed_tokens.weight");
            f[k] = (fsdp_st_entry_t){tnames[k], "F32", 2, root_shapes[0], zeros};
            k++;
        } else {
            snprintf(tnames[k], 64, "model.norm.weight");
            f[k] = (fsdp_st_entry_t){tnames[k], "F32", 1, root_shapes[1], zeros};
            k++;
            snprintf(tnames[k], 64, "lm_head.weight");
            f[k] = (fsdp_st_entry_t){tnames[k], "F32", 2, root_shapes[2], zeros};
            k++;
        }
        for (int l = 0; l < cfg.n_layer; l++) {
            if ((l < (cfg.n_layer + 1) / 2) != (file == 0))
                continue;
            for (int i = 0; i < 9; i++, k++) {
                snprintf(tnames[k], 64, "model.layers.%d.%s", l, names[i]);
                f[k] = (fsdp_st_entry_t){tnames[k], "F32", shapes[i][1] ? 2 : 1, shapes[i], zeros};
            }
        }
        n[file] = k;
        snprintf(path, sizeof(path), "%s/model-0000%d-of-00002.safetensors", dir, file + 1);
        ok = fsdp_st_write(path, f, k, NULL, 0) == FSDP_OK;
    }
    free(zeros);
    return ok ? 0 : -1;
}

static void remove_dir(void)
{
    char path[160];

    for (int i = 1; i <= 2; i++) {
        snprintf(path, sizeof(path), "%s/model-0000%d-of-00002.safetensors", dir, i);
        unlink(path);
    }
    unlink(index_path);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fsdp_log_set_level(FSDP_LOG_OFF);
    snprintf(dir, sizeof(dir), "/tmp/fuzz_llama_index.%d", (int)getpid());
    snprintf(index_path, sizeof(index_path), "%s/model.safetensors.index.json", dir);
    if (fsdp_llama_config_parse("llama-tiny", &cfg) != FSDP_OK || cfg.tie_word_embeddings ||
        (mkdir(dir, 0700) != 0 && access(dir, W_OK) != 0) || write_shards() != 0) {
        fprintf(stderr, "fuzz_llama_index: cannot set up %s\n", dir);
        exit(1);
    }
    atexit(remove_dir);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FILE *f = fopen(index_path, "wb");
    fsdp_lm_weights_t *w = NULL;

    if (f == NULL)
        return 0;
    if (fwrite(data, 1, size, f) != size) {
        fclose(f);
        return 0;
    }
    fclose(f);
    if (fsdp_llama_weights_open(index_path, &cfg, &w) == FSDP_OK)
        fsdp_lm_weights_close(w);
    return 0;
}
