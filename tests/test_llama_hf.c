/* Llama's HF checkpoints (fsdp_llama_save_weights, fsdp_llama_weights_open and _load_weights):
 * HF's names and [out, in] shapes, lm_head.weight absent when tied, a save -> load round trip
 * across world sizes and strategies, a multi-file model.safetensors.index.json loaded on 4 ranks
 * equal to the single file, and what a bad checkpoint says. */
#include <fsdp/fsdp.h>
#include <fsdp/llama.h>
#include <fsdp/log.h>
#include <fsdp/safetensors.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/io_hidden.h"
#include "nn/nn_hidden.h"
#include "test_util.h"

typedef struct job {
    fsdp_llama_config_t cfg;
    fsdp_strategy_t strategy;
    int world, per_node;
    const char *save;                 /* init from seed and save here, or */
    const fsdp_lm_weights_t *load;    /* load these */
    float *params;                    /* rank 0: every parameter, units in order */
    size_t nparams;
} job_t;

static fsdp_status_t job_rank(fsdp_dev_t *dev, void *arg)
{
    job_t *j = arg;
    fsdp_config_t fc;
    fsdp_t *fs = NULL;
    fsdp_lm_t *m = NULL;
    fsdp_status_t st;
    size_t off = 0;

    fsdp_config_init(&fc);
    fc.strategy = j->strategy;
    st = fsdp_create(dev, &fc, &fs);
    if (st == FSDP_OK)
        st = fsdp_llama_create(fs, &j->cfg, &m);
    if (st == FSDP_OK)
        st = j->load != NULL ? fsdp_lm_load_weights(m, j->load) : fsdp_lm_init_params(m, 7);
    if (st == FSDP_OK && j->save != NULL)
        st = fsdp_lm_save_weights(m, j->save);
    for (int k = 0; k <= j->cfg.n_layer && st == FSDP_OK; k++) {
        fsdp_unit_t *u = k == 0 ? fsdp_lm_root(m) : fsdp_lm_layer(m, k - 1);
        size_t n = fsdp_unit_flat_numel(u);
        float *flat = malloc(n * sizeof(float));
        st = flat != NULL ? fsdp_unit_gather_full(u, flat) : FSDP_ERR_NO_MEMORY;
        if (st == FSDP_OK && dev->rank == 0 && off + n <= j->nparams)
            memcpy(j->params + off, flat, n * sizeof(float));
        off += n;
        free(flat);
    }
    fsdp_lm_destroy(m);
    fsdp_destroy(fs);
    return st;
}

static fsdp_status_t job_run(job_t *j)
{
    fsdp_sim_params_t p;
    fsdp_sim_params_init(&p);
    p.world_size = j->world;
    if (j->per_node > 0)
        p.ranks_per_node = j->per_node;
    p.mode = FSDP_SIM_DATA;
    return fsdp_sim_launch(&p, job_rank, j, NULL);
}

static char tmpdir[64];

static const char *tmp_path(const char *name)
{
    static char buf[4][256];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, 256, "%s/%s", tmpdir, name);
    return p;
}

/* Loads path on `world` ranks under `strategy` into a model of cfg; its parameters in out. */
static fsdp_status_t load_run(const char *path, const fsdp_llama_config_t *cfg, int world,
                              int per_node, fsdp_strategy_t strategy, float *out, size_t n)
{
    fsdp_lm_weights_t *w = NULL;
    fsdp_status_t st = fsdp_llama_weights_open(path, cfg, &w);
    job_t j = {*cfg, strategy, world, per_node, NULL, w, out, n};

    if (st == FSDP_OK)
        st = job_run(&j);
    fsdp_lm_weights_close(w);
    return st;
}

/* Splits the single file into three (the root, the even layers, the odd layers) and writes
 * HF's index over them, in the directory given. */
static void write_multi(const char *single, const char *dir)
{
    fsdp_st_file_t *f = NULL;
    char path[256];
    FILE *idx;
    int first = 1;
    static const char *const kv[] = {"format", "pt"};

    CU_ASSERT_FATAL(fsdp_st_open(single, &f) == FSDP_OK);
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    idx = fopen(path, "w");
    CU_ASSERT_FATAL(idx != NULL);
    fprintf(idx, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
    for (int part = 0; part < 3; part++) {
        int n = fsdp_st_num_tensors(f), m = 0;
        fsdp_st_entry_t *e = calloc((size_t)n, sizeof(*e));
        char file[64];
        CU_ASSERT_FATAL(e != NULL);
        snprintf(file, sizeof(file), "model-%05d-of-00003.safetensors", part + 1);
        for (int i = 0; i < n; i++) {
            const fsdp_st_tensor_t *t = fsdp_st_tensor_at(f, i);
            int layer = strncmp(t->name, "model.layers.", 13) == 0 ? atoi(t->name + 13) : -1;
            if ((layer < 0 ? 0 : 1 + layer % 2) != part)
                continue;
            e[m].name = t->name;
            e[m].dtype = t->dtype;
            e[m].ndim = t->ndim;
            e[m].shape = t->shape;
            e[m].data = t->data;
            fprintf(idx, "%s\"%s\": \"%s\"", first ? "" : ", ", t->name, file);
            first = 0;
            m++;
        }
        snprintf(path, sizeof(path), "%s/%s", dir, file);
        CU_ASSERT(fsdp_st_write(path, e, m, kv, 1) == FSDP_OK);
        free(e);
    }
    fprintf(idx, "}}\n");
    fclose(idx);
    fsdp_st_close(f);
}

static size_t total_params(const fsdp_llama_config_t *cfg)
{
    return (size_t)fsdp_llama_num_params(cfg);
}

static void round_trip(const char *spec)
{
    fsdp_llama_config_t cfg;
    size_t n;
    float *ref, *got;
    job_t save;
    fsdp_st_file_t *f = NULL;
    const fsdp_st_tensor_t *t;
    char dir[256], single[256];

    CU_ASSERT_FATAL(fsdp_llama_config_parse(spec, &cfg) == FSDP_OK);
    n = total_params(&cfg);
    ref = calloc(n, sizeof(float));
    got = calloc(n, sizeof(float));
    CU_ASSERT_FATAL(ref != NULL && got != NULL);
    snprintf(single, sizeof(single), "%s", tmp_path("single.safetensors"));
    save = (job_t){cfg, FSDP_FULL_SHARD, 2, 0, single, NULL, ref, n};
    CU_ASSERT_FATAL(job_run(&save) == FSDP_OK);

    /* HF's names and shapes */
    CU_ASSERT_FATAL(fsdp_st_open(save.save, &f) == FSDP_OK);
    t = fsdp_st_find(f, "model.layers.1.self_attn.k_proj.weight");
    CU_ASSERT(t != NULL && t->ndim == 2 &&
              t->shape[0] == cfg.n_kv_head * fsdp_llama_head_dim(&cfg) && t->shape[1] == cfg.dim);
    t = fsdp_st_find(f, "model.layers.0.mlp.down_proj.weight");
    CU_ASSERT(t != NULL && t->shape[0] == cfg.dim && t->shape[1] == cfg.ffn_dim);
    CU_ASSERT(fsdp_st_find(f, "model.norm.weight") != NULL);
    CU_ASSERT(fsdp_st_find(f, "model.layers.0.post_attention_layernorm.weight") != NULL);
    CU_ASSERT((fsdp_st_find(f, "lm_head.weight") == NULL) == cfg.tie_word_embeddings);
    CU_ASSERT(fsdp_st_num_tensors(f) == 9 * cfg.n_layer + 3 - cfg.tie_word_embeddings);
    CU_ASSERT_STRING_EQUAL(fsdp_st_metadata(f, "format"), "pt");
    fsdp_st_close(f);

    /* the single file on 1 and 3 ranks (uneven shards), and hybrid on 4 */
    CU_ASSERT(load_run(save.save, &cfg, 1, 0, FSDP_FULL_SHARD, got, n) == FSDP_OK);
    CU_ASSERT(memcmp(got, ref, n * sizeof(float)) == 0);
    memset(got, 0, n * sizeof(float));
    CU_ASSERT(load_run(save.save, &cfg, 3, 0, FSDP_FULL_SHARD, got, n) == FSDP_OK);
    CU_ASSERT(memcmp(got, ref, n * sizeof(float)) == 0);

    /* the multi-file index, by its path and by its directory, on 4 ranks */
    snprintf(dir, sizeof(dir), "%s", tmpdir);
    write_multi(save.save, dir);
    memset(got, 0, n * sizeof(float));
    CU_ASSERT(load_run(tmp_path("model.safetensors.index.json"), &cfg, 4, 0, FSDP_FULL_SHARD, got,
                       n) == FSDP_OK);
    CU_ASSERT(memcmp(got, ref, n * sizeof(float)) == 0);
    memset(got, 0, n * sizeof(float));
    CU_ASSERT(load_run(dir, &cfg, 4, 2, FSDP_HYBRID_SHARD, got, n) == FSDP_OK);
    CU_ASSERT(memcmp(got, ref, n * sizeof(float)) == 0);
    for (int p = 1; p <= 3; p++) {
        char name[64];
        snprintf(name, sizeof(name), "model-%05d-of-00003.safetensors", p);
        unlink(tmp_path(name));
    }
    unlink(tmp_path("model.safetensors.index.json"));
    unlink(save.save);
    free(ref);
    free(got);
}

static void test_round_trip_untied(void)
{
    round_trip("llama:layers=3,heads=4,kv_heads=2,dim=32,ffn=48,vocab=96");
}

static void test_round_trip_tied(void)
{
    round_trip("llama:layers=2,heads=4,kv_heads=1,dim=32,ffn=40,vocab=80,tie=1");
}

/* A bad checkpoint is an error naming the tensor: a missing one, another model's shape, a
 * name that is no Llama parameter, an index that names a tensor its file lacks. */
static void test_bad_checkpoints(void)
{
    fsdp_llama_config_t cfg, other;
    fsdp_lm_weights_t *w = NULL;
    char path[256];
    job_t save;
    FILE *idx;
    fsdp_st_entry_t e;
    static const int64_t shape[1] = {4};
    static const float four[4] = {1, 2, 3, 4};

    fsdp_llama_config_parse("llama:layers=2,heads=4,kv_heads=2,dim=32,ffn=48,vocab=64", &cfg);
    snprintf(path, sizeof(path), "%s", tmp_path("bad.safetensors"));
    save = (job_t){cfg, FSDP_FULL_SHARD, 1, 0, path, NULL, NULL, 0};
    CU_ASSERT_FATAL(job_run(&save) == FSDP_OK);
    fsdp_log_set_level(FSDP_LOG_OFF);
    other = cfg;
    other.ffn_dim = 40;
    CU_ASSERT(fsdp_llama_weights_open(save.save, &other, &w) == FSDP_ERR_FORMAT);
    other = cfg;
    other.n_layer = 3;
    CU_ASSERT(fsdp_llama_weights_open(save.save, &other, &w) == FSDP_ERR_FORMAT);
    other = cfg;
    other.n_layer = 1;
    CU_ASSERT(fsdp_llama_weights_open(save.save, &other, &w) == FSDP_ERR_FORMAT);
    e = (fsdp_st_entry_t){"model.layers.0.mlp.bias", "F32", 1, shape, four};
    CU_ASSERT(fsdp_st_write(tmp_path("odd.safetensors"), &e, 1, NULL, 0) == FSDP_OK);
    CU_ASSERT(fsdp_llama_weights_open(tmp_path("odd.safetensors"), &cfg, &w) == FSDP_ERR_FORMAT);
    idx = fopen(tmp_path("model.safetensors.index.json"), "w");
    CU_ASSERT_FATAL(idx != NULL);
    fprintf(idx, "{\"weight_map\": {\"model.norm.weight\": \"odd.safetensors\"}}");
    fclose(idx);
    CU_ASSERT(fsdp_llama_weights_open(tmp_path("model.safetensors.index.json"), &cfg, &w) ==
              FSDP_ERR_FORMAT);
    CU_ASSERT(fsdp_llama_weights_open(tmp_path("none.safetensors"), &cfg, &w) == FSDP_ERR_IO);
    fsdp_log_set_level(FSDP_LOG_WARN);
    CU_ASSERT(w == NULL);
    CU_ASSERT(fsdp_llama_weights_open(save.save, &cfg, &w) == FSDP_OK);
    fsdp_lm_weights_close(w);
    unlink(tmp_path("model.safetensors.index.json"));
    unlink(tmp_path("odd.safetensors"));
    unlink(save.save);
}

/* The last error logged. */
static char log_text[1024];

static void capture_log(fsdp_log_level_t level, const char *file, int line, const char *func,
                        const char *msg, void *arg)
{
    (void)file, (void)line, (void)func, (void)arg;
    if (level == FSDP_LOG_ERROR)
        snprintf(log_text, sizeof(log_text), "%s", msg);
}

/* Copies the checkpoint src to dst with element `at` of F32 tensor `name` set to v. */
static void write_poisoned(const char *src, const char *dst, const char *name, uint64_t at, float v)
{
    fsdp_st_file_t *f = NULL;
    fsdp_st_entry_t *e;
    float *bad = NULL;
    int n;

    CU_ASSERT_FATAL(fsdp_st_open(src, &f) == FSDP_OK);
    n = fsdp_st_num_tensors(f);
    e = calloc((size_t)n, sizeof(*e));
    CU_ASSERT_FATAL(e != NULL);
    for (int i = 0; i < n; i++) {
        const fsdp_st_tensor_t *t = fsdp_st_tensor_at(f, i);
        e[i] = (fsdp_st_entry_t){t->name, t->dtype, t->ndim, t->shape, t->data};
        if (strcmp(t->name, name) == 0) {
            CU_ASSERT_FATAL(strcmp(t->dtype, "F32") == 0 && at < t->numel);
            bad = malloc(t->nbytes);
            CU_ASSERT_FATAL(bad != NULL);
            memcpy(bad, t->data, t->nbytes);
            bad[at] = v;
            e[i].data = bad;
        }
    }
    CU_ASSERT_FATAL(bad != NULL);
    CU_ASSERT_FATAL(fsdp_st_write(dst, e, n, NULL, 0) == FSDP_OK);
    free(bad);
    free(e);
    fsdp_st_close(f);
}

/* Weights that are not finite are refused at the open, as GPT-2's are, naming the file, the
 * tensor and the first bad element: from a single file and from a shard of an index. */
static void test_not_finite(void)
{
    fsdp_llama_config_t cfg;
    fsdp_lm_weights_t *w = NULL;
    char good[256], bad[256], dir[256], shard[300];
    job_t save;

    fsdp_llama_config_parse("llama:layers=2,heads=4,kv_heads=2,dim=32,ffn=48,vocab=64", &cfg);
    snprintf(good, sizeof(good), "%s", tmp_path("good.safetensors"));
    snprintf(bad, sizeof(bad), "%s", tmp_path("nan.safetensors"));
    save = (job_t){cfg, FSDP_FULL_SHARD, 1, 0, good, NULL, NULL, 0};
    CU_ASSERT_FATAL(job_run(&save) == FSDP_OK);
    fsdp_log_set_handler(capture_log, NULL);

    write_poisoned(good, bad, "model.layers.1.mlp.up_proj.weight", 77, NAN);
    log_text[0] = '\0';
    CU_ASSERT(fsdp_llama_weights_open(bad, &cfg, &w) == FSDP_ERR_FORMAT);
    CU_ASSERT(w == NULL);
    CU_ASSERT_PTR_NOT_NULL(strstr(log_text, bad));
    CU_ASSERT_PTR_NOT_NULL(
        strstr(log_text, "tensor 'model.layers.1.mlp.up_proj.weight' holds NaN at element 77"));

    /* an index whose second shard holds an Inf */
    snprintf(dir, sizeof(dir), "%s/index", tmpdir);
    CU_ASSERT_FATAL(mkdir(dir, 0700) == 0);
    write_poisoned(good, bad, "model.layers.1.self_attn.o_proj.weight", 5, -INFINITY);
    write_multi(bad, dir);
    log_text[0] = '\0';
    CU_ASSERT(fsdp_llama_weights_open(dir, &cfg, &w) == FSDP_ERR_FORMAT);
    CU_ASSERT(w == NULL);
    snprintf(shard, sizeof(shard), "%s/model-00003-of-00003.safetensors", dir);
    CU_ASSERT_PTR_NOT_NULL(strstr(log_text, shard));
    CU_ASSERT_PTR_NOT_NULL(
        strstr(log_text, "tensor 'model.layers.1.self_attn.o_proj.weight' holds Inf at element 5"));
    fsdp_log_set_handler(NULL, NULL);

    CU_ASSERT(fsdp_llama_weights_open(good, &cfg, &w) == FSDP_OK);
    fsdp_lm_weights_close(w);
    for (int p = 1; p <= 3; p++) {
        snprintf(shard, sizeof(shard), "%s/model-%05d-of-00003.safetensors", dir, p);
        unlink(shard);
    }
    snprintf(shard, sizeof(shard), "%s/model.safetensors.index.json", dir);
    unlink(shard);
    rmdir(dir);
    unlink(bad);
    unlink(good);
}

/* An index that is a FIFO is refused at once, not waited on: by its path and from the
 * directory. */
static void test_index_fifo(void)
{
    fsdp_llama_config_t cfg;
    fsdp_lm_weights_t *w = NULL;
    char dir[256], path[300];

    fsdp_llama_config_parse("llama:layers=2,heads=4,kv_heads=2,dim=32,ffn=48,vocab=64", &cfg);
    snprintf(dir, sizeof(dir), "%s/fifo", tmpdir);
    CU_ASSERT_FATAL(mkdir(dir, 0700) == 0);
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    CU_ASSERT_FATAL(mkfifo(path, 0600) == 0);
    fsdp_log_set_handler(capture_log, NULL);
    log_text[0] = '\0';
    alarm(10); /* a blocking open would hang: fail instead */
    CU_ASSERT(fsdp_llama_weights_open(dir, &cfg, &w) == FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_PTR_NOT_NULL(strstr(log_text, "is a FIFO, not a regular file"));
    CU_ASSERT(fsdp_llama_weights_open(path, &cfg, &w) == FSDP_ERR_INVALID_PARAM);
    alarm(0);
    fsdp_log_set_handler(NULL, NULL);
    CU_ASSERT(w == NULL);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"HF names and shapes; save -> load on 1, 3 ranks; a 3-file index on 4 ranks (untied)",
         test_round_trip_untied},
        {"the same, tied: no lm_head.weight", test_round_trip_tied},
        {"a bad checkpoint is an error", test_bad_checkpoints},
        {"NaN or Inf in a single file or a shard is refused, naming tensor and element",
         test_not_finite},
        {"an index that is a FIFO is refused, not waited on", test_index_fifo},
        {NULL, NULL},
    };
    int rc;

    snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_llama_hf.XXXXXX");
    if (mkdtemp(tmpdir) == NULL)
        return 99;
    rc = fsdp_test_run("llama_hf", tests);
    rmdir(tmpdir);
    return rc;
}
