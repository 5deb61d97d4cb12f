/* Checkpoints: FULL and SHARDED round trips, resharding to other world sizes and strategies,
 * resuming with the exact loss sequence, atomic saves, corrupted files refused. */
#include <fsdp/fsdp.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/io_hidden.h"
#include "nn/nn_hidden.h"
#include "test_util.h"

#define NL 2
static const int dims[NL + 1] = {6, 11, 3}; /* flat sizes 77 and 36 */
#define B 24
#define MAXP 128

static float xs[B * 6], ys[B * 3];
static char tmpdir[256];

typedef struct job {
    int world;
    fsdp_strategy_t strategy;
    int per_node; /* fsdp_config_t.ranks_per_node (hybrid_shard), 0: the default */
    fsdp_optim_kind_t optim;
    int cpu_offload;
    int load;  /* load the checkpoint of `dir` first */
    int steps; /* then train */
    int save;  /* then save */
    int64_t save_step;
    fsdp_state_dict_type_t type;
    const char *dir;
    /* out */
    float params[MAXP * 2];
    float losses[16];
    int64_t loaded_step;
    fsdp_status_t status[8];
} job_t;

static fsdp_status_t gather(fsdp_mlp_t *mlp, float *out)
{
    size_t off = 0;
    for (int l = 0; l < NL; l++) {
        fsdp_unit_t *u = fsdp_mlp_layer(mlp, l);
        fsdp_status_t status = fsdp_unit_gather_full(u, out + off);
        if (status != FSDP_OK)
            return status;
        off += fsdp_unit_flat_numel(u);
    }
    return FSDP_OK;
}

static fsdp_status_t job_rank(fsdp_dev_t *dev, void *arg)
{
    job_t *j = arg;
    fsdp_config_t fc;
    fsdp_optim_config_t oc;
    fsdp_t *fs;
    fsdp_mlp_t *mlp = NULL;
    fsdp_optim_t *opt = NULL;
    size_t rows = B / (size_t)j->world;
    float params[MAXP * 2] = {0};
    fsdp_status_t status;

    fsdp_config_init(&fc);
    fc.strategy = j->strategy;
    fc.ranks_per_node = j->per_node;
    fc.cpu_offload = j->cpu_offload;
    fsdp_optim_config_init(&oc, j->optim);
    oc.lr = j->optim == FSDP_OPTIM_ADAMW ? 1e-2f : 5e-2f;
    oc.momentum = j->optim == FSDP_OPTIM_SGD ? 0.9f : 0.0f;
    status = fsdp_create(dev, &fc, &fs);
    if (status != FSDP_OK)
        return status;
    status = fsdp_mlp_create(fs, dims, NL, &mlp);
    if (status == FSDP_OK)
        status = fsdp_mlp_init_params(mlp, 3);
    if (status == FSDP_OK)
        status = fsdp_optim_create(fs, &oc, &opt);
    int64_t loaded = -1;
    if (status == FSDP_OK && j->load)
        status = fsdp_checkpoint_load(fs, opt, j->dir, &loaded);
    if (dev->rank == 0)
        j->loaded_step = loaded;
    for (int s = 0; s < j->steps && status == FSDP_OK; s++) {
        float loss, *dloss = NULL;
        status = fsdp_mlp_forward_backward(mlp, xs + (size_t)dev->rank * rows * 6,
                                           ys + (size_t)dev->rank * rows * 3, rows, &loss);
        if (status == FSDP_OK)
            status = fsdp_optim_step(opt);
        fsdp_zero_grad(fs);
        /* the global loss */
        if (status == FSDP_OK)
            status = fsdp_mem_alloc(fsdp_memory(fs), 4, FSDP_MEM_TEMPORARY, fsdp_compute_stream(fs),
                                    (void **)&dloss);
        if (status == FSDP_OK) {
            *dloss = loss;
            status = fsdp_dev_all_reduce(dev, fsdp_dev_group_world(dev), dloss, dloss, 1,
                                         FSDP_DTYPE_F32, FSDP_REDUCE_AVG, fsdp_compute_stream(fs));
            if (dev->rank == 0)
                j->losses[s] = *dloss;
        }
        fsdp_mem_free(fsdp_memory(fs), dloss);
    }
    if (status == FSDP_OK && j->save)
        status = fsdp_checkpoint_save(fs, opt, j->dir, j->type, j->save_step);
    if (status == FSDP_OK)
        status = gather(mlp, params);
    if (status == FSDP_OK && dev->rank == 0)
        memcpy(j->params, params, sizeof(params));
    j->status[dev->rank] = status;
    fsdp_optim_destroy(opt);
    fsdp_mlp_destroy(mlp);
    fsdp_destroy(fs);
    return status;
}

static fsdp_status_t run(job_t *j)
{
    fsdp_sim_params_t p;
    fsdp_sim_params_init(&p);
    p.world_size = j->world;
    p.timeout_s = 20;
    return fsdp_sim_launch(&p, job_rank, j, NULL);
}

static void setup(void)
{
    fsdp_rng_t rng;
    fsdp_rng_seed(&rng, 99);
    for (int i = 0; i < B * 6; i++)
        xs[i] = fsdp_rng_normal(&rng);
    for (int i = 0; i < B * 3; i++)
        ys[i] = fsdp_rng_uniform(&rng, -1, 1);
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/fsdp-ckpt-XXXXXX");
    if (mkdtemp(tmpdir) == NULL) {
        perror("mkdtemp");
        exit(99);
    }
}

static void cleanup(void)
{
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", tmpdir);
}

/* Save after 3 steps, resume in a fresh run: the next 3 losses and the final parameters equal
 * those of an uninterrupted 6-step run, bit for bit; and the checkpoint loads into every other
 * world size and strategy with the same parameters. */
static void check_resume(fsdp_state_dict_type_t type, fsdp_optim_kind_t optim, int offload)
{
    static const int worlds[] = {1, 2, 3, 4, 8};
    static const fsdp_strategy_t strategies[] = {FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP,
                                                 FSDP_NO_SHARD};
    char dir[300];
    job_t *full = calloc(1, sizeof(job_t)), *first = calloc(1, sizeof(job_t)),
          *second = calloc(1, sizeof(job_t));

    snprintf(dir, sizeof(dir), "%s/%s-%d-%d", tmpdir, fsdp_state_dict_type_name(type), optim,
             offload);
    *full = (job_t){.world = 4,
                    .strategy = FSDP_FULL_SHARD,
                    .optim = optim,
                    .steps = 6,
                    .cpu_offload = offload};
    CU_ASSERT_EQUAL_FATAL(run(full), FSDP_OK);
    *first = *full;
    first->steps = 3;
    first->save = 1;
    first->save_step = 3;
    first->type = type;
    first->dir = dir;
    CU_ASSERT_EQUAL_FATAL(run(first), FSDP_OK);
    *second = *full;
    second->steps = 3;
    second->load = 1;
    second->dir = dir;
    CU_ASSERT_EQUAL_FATAL(run(second), FSDP_OK);
    CU_ASSERT_EQUAL(second->loaded_step, 3);
    CU_ASSERT(memcmp(second->losses, full->losses + 3, 3 * sizeof(float)) == 0);
    CU_ASSERT(memcmp(second->params, full->params, sizeof(full->params)) == 0);

    /* resharding: any world size and strategy sees the saved parameters exactly */
    for (size_t w = 0; w < sizeof(worlds) / sizeof(worlds[0]); w++) {
        for (size_t s = 0; s < 3; s++) {
            job_t *j = calloc(1, sizeof(job_t));
            *j = (job_t){.world = worlds[w],
                         .strategy = strategies[s],
                         .optim = optim,
                         .load = 1,
                         .dir = dir,
                         .cpu_offload = offload};
            CU_ASSERT_EQUAL(run(j), FSDP_OK);
            CU_ASSERT(memcmp(j->params, first->params, sizeof(j->params)) == 0);
            /* and it trains on from there like the uninterrupted run, up to summation order */
            j->steps = 3;
            j->load = 1;
            if (worlds[w] <= 4 && B % worlds[w] == 0) {
                double maxdiff = 0;
                CU_ASSERT_EQUAL(run(j), FSDP_OK);
                for (int i = 0; i < 77 + 36; i++)
                    maxdiff = fmax(maxdiff, fabs((double)j->params[i] - full->params[i]));
                CU_ASSERT(maxdiff < 1e-5);
            }
            free(j);
        }
    }
    free(full);
    free(first);
    free(second);
}

static void test_sharded_adamw(void)
{
    check_resume(FSDP_STATE_DICT_SHARDED, FSDP_OPTIM_ADAMW, 0);
}

static void test_full_adamw(void)
{
    check_resume(FSDP_STATE_DICT_FULL, FSDP_OPTIM_ADAMW, 0);
}

static void test_sharded_sgd_offload(void)
{
    check_resume(FSDP_STATE_DICT_SHARDED, FSDP_OPTIM_SGD, 1);
}

/* A sharded checkpoint of ranks that hold the same shard (NO_SHARD's every rank, hybrid
 * sharding's replicas) has each piece once, from the first of them: it loads elsewhere with the
 * saved parameters. */
static void test_sharded_replicas(void)
{
    static const struct {
        fsdp_strategy_t strategy;
        int per_node;
    } saves[] = {{FSDP_NO_SHARD, 0}, {FSDP_HYBRID_SHARD, 2}, {FSDP_HYBRID_SHARD_ZERO2, 1}};
    char dir[300];

    for (size_t i = 0; i < sizeof(saves) / sizeof(saves[0]); i++) {
        job_t *first = calloc(1, sizeof(job_t)), *j = calloc(1, sizeof(job_t));
        snprintf(dir, sizeof(dir), "%s/replicas-%zu", tmpdir, i);
        *first = (job_t){.world = 4,
                         .strategy = saves[i].strategy,
                         .per_node = saves[i].per_node,
                         .optim = FSDP_OPTIM_ADAMW,
                         .steps = 2,
                         .save = 1,
                         .save_step = 2,
                         .type = FSDP_STATE_DICT_SHARDED,
                         .dir = dir};
        CU_ASSERT_EQUAL_FATAL(run(first), FSDP_OK);
        *j = (job_t){.world = 2,
                     .strategy = FSDP_FULL_SHARD,
                     .optim = FSDP_OPTIM_ADAMW,
                     .load = 1,
                     .dir = dir};
        CU_ASSERT_EQUAL(run(j), FSDP_OK);
        CU_ASSERT(memcmp(j->params, first->params, sizeof(j->params)) == 0);
        free(first);
        free(j);
    }
}

/* LOCAL: resumes exactly on the same world and sharding, and refuses any other. */
static void test_local(void)
{
    char dir[300];
    job_t *full = calloc(1, sizeof(job_t)), *first = calloc(1, sizeof(job_t)),
          *second = calloc(1, sizeof(job_t));
    fsdp_log_level_t lvl = fsdp_log_level();

    snprintf(dir, sizeof(dir), "%s/local", tmpdir);
    *full = (job_t){.world = 4, .strategy = FSDP_FULL_SHARD, .optim = FSDP_OPTIM_ADAMW, .steps = 6};
    CU_ASSERT_EQUAL_FATAL(run(full), FSDP_OK);
    *first = *full;
    first->steps = 3;
    first->save = 1;
    first->save_step = 3;
    first->type = FSDP_STATE_DICT_LOCAL;
    first->dir = dir;
    CU_ASSERT_EQUAL_FATAL(run(first), FSDP_OK);
    *second = *full;
    second->steps = 3;
    second->load = 1;
    second->dir = dir;
    CU_ASSERT_EQUAL_FATAL(run(second), FSDP_OK);
    CU_ASSERT(memcmp(second->losses, full->losses + 3, 3 * sizeof(float)) == 0);
    CU_ASSERT(memcmp(second->params, full->params, sizeof(full->params)) == 0);
    /* another world size or strategy is refused on every rank */
    fsdp_log_set_level(FSDP_LOG_OFF);
    *second = (job_t){
        .world = 2, .strategy = FSDP_FULL_SHARD, .optim = FSDP_OPTIM_ADAMW, .load = 1, .dir = dir};
    CU_ASSERT_NOT_EQUAL(run(second), FSDP_OK);
    CU_ASSERT(second->status[0] != FSDP_OK && second->status[1] != FSDP_OK);
    *second = (job_t){
        .world = 4, .strategy = FSDP_NO_SHARD, .optim = FSDP_OPTIM_ADAMW, .load = 1, .dir = dir};
    CU_ASSERT_NOT_EQUAL(run(second), FSDP_OK);
    fsdp_log_set_level(lvl);
    free(full);
    free(first);
    free(second);
}

/* The FULL checkpoint's model file holds plain names and nn.Linear shapes. */
static void test_full_file_names(void)
{
    char dir[300], path[400];
    job_t *j = calloc(1, sizeof(job_t));
    fsdp_st_file_t *f;
    const fsdp_st_tensor_t *t;

    snprintf(dir, sizeof(dir), "%s/names", tmpdir);
    *j = (job_t){.world = 3,
                 .strategy = FSDP_FULL_SHARD,
                 .optim = FSDP_OPTIM_ADAMW,
                 .steps = 1,
                 .save = 1,
                 .save_step = 7,
                 .type = FSDP_STATE_DICT_FULL,
                 .dir = dir};
    CU_ASSERT_EQUAL_FATAL(run(j), FSDP_OK);
    snprintf(path, sizeof(path), "%s/step-00000007/model.safetensors", dir);
    CU_ASSERT_EQUAL_FATAL(fsdp_st_open(path, &f), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_st_num_tensors(f), 4);
    t = fsdp_st_find(f, "layers.0.weight");
    CU_ASSERT(t != NULL && t->ndim == 2 && t->shape[0] == 11 && t->shape[1] == 6);
    CU_ASSERT(t != NULL && memcmp(t->data, j->params, 66 * sizeof(float)) == 0);
    t = fsdp_st_find(f, "layers.1.bias");
    CU_ASSERT(t != NULL && t->ndim == 1 && t->shape[0] == 3);
    CU_ASSERT_STRING_EQUAL(fsdp_st_metadata(f, "format"), "pt");
    fsdp_st_close(f);
    snprintf(path, sizeof(path), "%s/step-00000007/optimizer.safetensors", dir);
    CU_ASSERT_EQUAL_FATAL(fsdp_st_open(path, &f), FSDP_OK);
    CU_ASSERT_PTR_NOT_NULL(fsdp_st_find(f, "state.layers.0.weight.exp_avg_sq"));
    fsdp_st_close(f);
    free(j);
}

/* A save killed before its commit leaves the previous checkpoint as `latest`. */
static void test_killed_save(void)
{
    char dir[300], tmp_save[320];
    struct stat st;
    job_t *j = calloc(1, sizeof(job_t)), *k;
    pid_t pid;
    int wstatus;

    snprintf(dir, sizeof(dir), "%s/killed", tmpdir);
    *j = (job_t){.world = 2,
                 .strategy = FSDP_FULL_SHARD,
                 .optim = FSDP_OPTIM_ADAMW,
                 .steps = 2,
                 .save = 1,
                 .save_step = 2,
                 .type = FSDP_STATE_DICT_SHARDED,
                 .dir = dir};
    CU_ASSERT_EQUAL_FATAL(run(j), FSDP_OK);
    fflush(NULL);
    pid = fork();
    if (pid == 0) {
        job_t *c = calloc(1, sizeof(job_t));
        *c = *j;
        c->save_step = 4;
        setenv("FSDP_TEST_CRASH_IN_CHECKPOINT_SAVE", "1", 1);
        run(c);
        _exit(0); /* not reached: the save kills the process */
    }
    CU_ASSERT_FATAL(pid > 0);
    CU_ASSERT_EQUAL(waitpid(pid, &wstatus, 0), pid);
    CU_ASSERT(WIFSIGNALED(wstatus));
    k = calloc(1, sizeof(job_t));
    *k = (job_t){
        .world = 2, .strategy = FSDP_FULL_SHARD, .optim = FSDP_OPTIM_ADAMW, .load = 1, .dir = dir};
    CU_ASSERT_EQUAL(run(k), FSDP_OK);
    CU_ASSERT_EQUAL(k->loaded_step, 2);
    CU_ASSERT(memcmp(k->params, j->params, sizeof(j->params)) == 0);
    /* the killed save's step-4.tmp is removed by the next save into the directory */
    snprintf(tmp_save, sizeof(tmp_save), "%s/step-00000004.tmp", dir);
    CU_ASSERT_EQUAL(stat(tmp_save, &st), 0);
    k->save = 1;
    k->save_step = 3;
    CU_ASSERT_EQUAL(run(k), FSDP_OK);
    CU_ASSERT_NOT_EQUAL(stat(tmp_save, &st), 0);
    free(j);
    free(k);
}

static void corrupt(const char *path, long truncate_to, long flip_at)
{
    if (truncate_to >= 0)
        CU_ASSERT_EQUAL(truncate(path, truncate_to), 0);
    if (flip_at >= 0) {
        FILE *f = fopen(path, "r+b");
        CU_ASSERT_PTR_NOT_NULL_FATAL(f);
        fseek(f, flip_at, SEEK_SET);
        int c = fgetc(f);
        fseek(f, flip_at, SEEK_SET);
        fputc(c ^ 0x5a, f);
        fclose(f);
    }
}

/* A sharded AdamW checkpoint of one step in tmpdir/name, and j set to load it and train a step. */
static void saved_job(job_t *j, char *dir, size_t len, const char *name)
{
    snprintf(dir, len, "%s/%s", tmpdir, name);
    *j = (job_t){.world = 2,
                 .strategy = FSDP_FULL_SHARD,
                 .optim = FSDP_OPTIM_ADAMW,
                 .steps = 1,
                 .save = 1,
                 .save_step = 1,
                 .type = FSDP_STATE_DICT_SHARDED,
                 .dir = dir};
    CU_ASSERT_EQUAL_FATAL(run(j), FSDP_OK);
    j->save = 0;
    j->load = 1;
}

static void test_corrupted(void)
{
    char dir[300], path[400];
    job_t *j = calloc(1, sizeof(job_t));
    fsdp_log_level_t lvl = fsdp_log_level();

    saved_job(j, dir, sizeof(dir), "corrupt");
    j->steps = 0;
    fsdp_log_set_level(FSDP_LOG_OFF);
    /* a truncated rank file */
    snprintf(path, sizeof(path), "%s/step-00000001/rank-00001.safetensors", dir);
    corrupt(path, 100, -1);
    CU_ASSERT_NOT_EQUAL(run(j), FSDP_OK);
    CU_ASSERT(j->status[0] != FSDP_OK && j->status[1] != FSDP_OK);
    /* a damaged index */
    j->dir = dir;
    snprintf(path, sizeof(path), "%s/step-00000001/checkpoint.json", dir);
    corrupt(path, -1, 0);
    CU_ASSERT_NOT_EQUAL(run(j), FSDP_OK);
    /* no checkpoint at all */
    snprintf(path, sizeof(path), "%s/none", tmpdir);
    j->dir = path;
    CU_ASSERT_NOT_EQUAL(run(j), FSDP_OK);
    CU_ASSERT_EQUAL(j->status[0], FSDP_ERR_NOT_FOUND);
    fsdp_log_set_level(lvl);
    free(j);
}

/* ---- checkpoint.json's fields, each checked with a line naming the file and the field ---- */

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_text[4096];

static void capture_log(fsdp_log_level_t level, const char *file, int line, const char *func,
                        const char *msg, void *arg)
{
    (void)file, (void)line, (void)func, (void)arg;
    pthread_mutex_lock(&log_lock);
    if (level <= FSDP_LOG_ERROR && strlen(log_text) + strlen(msg) + 2 < sizeof(log_text)) {
        strcat(log_text, msg);
        strcat(log_text, "\n");
    }
    pthread_mutex_unlock(&log_lock);
}

/* Sets checkpoint.json's field at the dotted path (the last part the key; value NULL deletes
 * it), loads, expects the load refused naming `says`, and puts the file back. */
static void field_refused(job_t *j, const char *json_path, const char *const *keys, json_t *value,
                          const char *says)
{
    json_t *meta = json_load_file(json_path, 0, NULL), *obj;
    char *orig = NULL;
    int k;

    CU_ASSERT_PTR_NOT_NULL_FATAL(meta);
    orig = json_dumps(meta, JSON_INDENT(1) | JSON_SORT_KEYS);
    obj = meta;
    for (k = 0; keys[k + 1] != NULL; k++)
        obj = json_object_get(obj, keys[k]);
    CU_ASSERT_PTR_NOT_NULL_FATAL(obj);
    if (value != NULL)
        json_object_set_new(obj, keys[k], value);
    else
        json_object_del(obj, keys[k]);
    CU_ASSERT_EQUAL_FATAL(json_dump_file(meta, json_path, JSON_INDENT(1)), 0);
    log_text[0] = '\0';
    fsdp_log_set_handler(capture_log, NULL);
    CU_ASSERT_EQUAL(run(j), FSDP_ERR_FORMAT);
    fsdp_log_set_handler(NULL, NULL);
    if (strstr(log_text, says) == NULL || strstr(log_text, "checkpoint.json") == NULL)
        fprintf(stderr, "\n  expected '%s' in: %s", says, log_text);
    CU_ASSERT_PTR_NOT_NULL(strstr(log_text, says));
    CU_ASSERT_PTR_NOT_NULL(strstr(log_text, "checkpoint.json"));
    FILE *f = fopen(json_path, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs(orig, f);
    fclose(f);
    free(orig);
    json_decref(meta);
}

static void test_fields(void)
{
    char dir[300], path[400];
    job_t *j = calloc(1, sizeof(job_t));
    const char *step[] = {"step", NULL};
    const char *world[] = {"world_size", NULL};
    const char *nsteps[] = {"optimizer_num_steps", NULL};
    const char *pstep[] = {"optimizer_steps", "layers.0.weight", "step", NULL};
    const char *pbuf[] = {"optimizer_steps", "layers.0.weight", "has_buffer", NULL};
    const char *pentry[] = {"optimizer_steps", "layers.0.weight", NULL};

    saved_job(j, dir, sizeof(dir), "fields");
    snprintf(path, sizeof(path), "%s/step-00000001/checkpoint.json", dir);
    field_refused(j, path, step, json_integer(-1), "step is -1");
    field_refused(j, path, step, json_integer(INT64_MAX), "step is 9223372036854775807");
    field_refused(j, path, step, NULL, "step is missing");
    field_refused(j, path, step, json_string("3"), "step is not an integer");
    field_refused(j, path, world, json_integer(0), "world_size is 0");
    field_refused(j, path, nsteps, json_integer(-5), "optimizer_num_steps is -5");
    field_refused(j, path, pstep, json_integer(-1), "optimizer_steps.layers.0.weight.step is -1");
    field_refused(j, path, pstep, json_integer(INT64_MAX),
                  "optimizer_steps.layers.0.weight.step is 9223372036854775807");
    field_refused(j, path, pstep, NULL, "optimizer_steps.layers.0.weight.step is missing");
    field_refused(j, path, pbuf, json_integer(1), "has_buffer is not a boolean");
    field_refused(j, path, pentry, NULL, "no entry for 'layers.0.weight'");
    /* a NaN in a saved weight is refused, naming the tensor */
    {
        char rank_file[400], saved[4];
        fsdp_st_file_t *f;
        const fsdp_st_tensor_t *t;
        long off;
        FILE *fp;
        const unsigned char nan_bytes[4] = {0x00, 0x00, 0xc0, 0x7f};

        snprintf(rank_file, sizeof(rank_file), "%s/step-00000001/rank-00000.safetensors", dir);
        CU_ASSERT_EQUAL_FATAL(fsdp_st_open(rank_file, &f), FSDP_OK);
        t = fsdp_st_tensor_at(f, 0);
        for (int i = 0; i < fsdp_st_num_tensors(f); i++)
            if (strncmp(fsdp_st_tensor_at(f, i)->name, "layers.0.weight@", 16) == 0)
                t = fsdp_st_tensor_at(f, i);
        CU_ASSERT_FATAL(strncmp(t->name, "layers.0.weight@", 16) == 0);
        {
            uint64_t hlen = 0;
            FILE *h = fopen(rank_file, "rb");
            CU_ASSERT_FATAL(h != NULL && fread(&hlen, 8, 1, h) == 1);
            fclose(h);
            /* the data of tensor t starts 8 + hlen + its offset in the buffer */
            off = 8 + (long)hlen +
                  (long)((const char *)t->data - (const char *)fsdp_st_tensor_at(f, 0)->data);
        }
        fsdp_st_close(f);
        fp = fopen(rank_file, "r+b");
        CU_ASSERT_FATAL(fp != NULL);
        fseek(fp, off, SEEK_SET);
        CU_ASSERT_FATAL(fread(saved, 1, 4, fp) == 4);
        fseek(fp, off, SEEK_SET);
        fwrite(nan_bytes, 1, 4, fp);
        fclose(fp);
        log_text[0] = '\0';
        fsdp_log_set_handler(capture_log, NULL);
        CU_ASSERT_EQUAL(run(j), FSDP_ERR_FORMAT);
        fsdp_log_set_handler(NULL, NULL);
        CU_ASSERT_PTR_NOT_NULL(strstr(log_text, "tensor 'layers.0.weight' holds NaN"));
        fp = fopen(rank_file, "r+b");
        CU_ASSERT_FATAL(fp != NULL);
        fseek(fp, off, SEEK_SET);
        fwrite(saved, 1, 4, fp);
        fclose(fp);
    }
    /* the file put back loads */
    CU_ASSERT_EQUAL(run(j), FSDP_OK);
    CU_ASSERT_EQUAL(j->loaded_step, 1);
    free(j);
}

/* ---- sharded pieces: each element of each tensor in exactly one piece ---- */

/* Rewrites the safetensors file at path with tensor `from` renamed `to` and, when index >= 0,
 * its element `index` (F32) set to value. */
static void rewrite_tensor(const char *path, const char *from, const char *to, long index,
                           float value)
{
    fsdp_st_file_t *f;
    fsdp_st_entry_t *e;
    float *copy = NULL;
    int n;

    CU_ASSERT_EQUAL_FATAL(fsdp_st_open(path, &f), FSDP_OK);
    n = fsdp_st_num_tensors(f);
    e = calloc((size_t)n, sizeof(*e));
    CU_ASSERT_PTR_NOT_NULL_FATAL(e);
    for (int i = 0; i < n; i++) {
        const fsdp_st_tensor_t *t = fsdp_st_tensor_at(f, i);
        e[i] = (fsdp_st_entry_t){t->name, t->dtype, t->ndim, t->shape, t->data};
        if (strcmp(t->name, from) != 0)
            continue;
        e[i].name = to;
        if (index >= 0) {
            CU_ASSERT_FATAL((uint64_t)index < t->numel && strcmp(t->dtype, "F32") == 0);
            copy = malloc(t->nbytes);
            CU_ASSERT_PTR_NOT_NULL_FATAL(copy);
            memcpy(copy, t->data, t->nbytes);
            copy[index] = value;
            e[i].data = copy;
        }
    }
    /* written to a temporary and renamed: the mapping of the old file stays valid */
    CU_ASSERT_EQUAL(fsdp_st_write(path, e, n, NULL, 0), FSDP_OK);
    fsdp_st_close(f);
    free(copy);
    free(e);
}

/* The name of the first tensor of the file at path that starts with prefix (into out). */
static void find_tensor(const char *path, const char *prefix, char *out, size_t len)
{
    fsdp_st_file_t *f;

    out[0] = '\0';
    CU_ASSERT_EQUAL_FATAL(fsdp_st_open(path, &f), FSDP_OK);
    for (int i = 0; i < fsdp_st_num_tensors(f) && out[0] == '\0'; i++)
        if (strncmp(fsdp_st_tensor_at(f, i)->name, prefix, strlen(prefix)) == 0)
            snprintf(out, len, "%s", fsdp_st_tensor_at(f, i)->name);
    fsdp_st_close(f);
    CU_ASSERT_FATAL(out[0] != '\0');
}

/* Runs j (or, when j is NULL, consolidates dir) and expects FSDP_ERR_FORMAT with `says` in the
 * errors logged. */
static void refused_saying(job_t *j, const char *dir, const char *says)
{
    char out[400];

    log_text[0] = '\0';
    fsdp_log_set_handler(capture_log, NULL);
    if (j != NULL) {
        CU_ASSERT_EQUAL(run(j), FSDP_ERR_FORMAT);
    } else {
        snprintf(out, sizeof(out), "%s/consolidated.safetensors", tmpdir);
        CU_ASSERT_EQUAL(fsdp_checkpoint_consolidate(dir, out, NULL), FSDP_ERR_FORMAT);
    }
    fsdp_log_set_handler(NULL, NULL);
    if (strstr(log_text, says) == NULL)
        fprintf(stderr, "\n  expected '%s' in: %s", says, log_text);
    CU_ASSERT_PTR_NOT_NULL(strstr(log_text, says));
}

/* Two pieces that overlap, their sizes adding up to the tensor's (so that part of it is in no
 * piece), are refused by a load (into one rank, whose range is the whole tensor) and by
 * consolidation, naming the tensor and the elements; so is a piece past the tensor's end. */
static void test_overlapping_pieces(void)
{
    char dir[300], rank1[400], piece[128], moved[160], up[160], says[300];
    job_t *j = calloc(1, sizeof(job_t));
    long off;

    saved_job(j, dir, sizeof(dir), "overlap");
    snprintf(rank1, sizeof(rank1), "%s/step-00000001/rank-00001.safetensors", dir);
    find_tensor(rank1, "layers.0.weight@", piece, sizeof(piece));
    off = atol(piece + strlen("layers.0.weight@"));
    CU_ASSERT_FATAL(off >= 2 && off < 66);
    /* rank 1's piece of layers.0.weight moved 2 elements down: [off - 2, off) twice, the last
     * 2 elements nowhere */
    snprintf(moved, sizeof(moved), "layers.0.weight@%ld", off - 2);
    rewrite_tensor(rank1, piece, moved, -1, 0.0f);
    j->world = 1;
    j->steps = 0;
    snprintf(says, sizeof(says),
             "tensor 'layers.0.weight': elements [%ld, %ld) are in two pieces (of "
             "rank-00000.safetensors and rank-00001.safetensors)",
             off - 2, off);
    refused_saying(j, NULL, says);
    refused_saying(NULL, dir, says);
    /* 2 elements up instead: past the end of the 66 */
    snprintf(up, sizeof(up), "layers.0.weight@%ld", off + 2);
    rewrite_tensor(rank1, moved, up, -1, 0.0f);
    snprintf(says, sizeof(says),
             "rank-00001.safetensors: piece 'layers.0.weight@%ld' holds elements [%ld, %ld + %ld) "
             "of tensor 'layers.0.weight', which has 66",
             off + 2, off + 2, off + 2, 66 - off);
    refused_saying(j, NULL, says);
    refused_saying(NULL, dir, says);
    /* put back, it loads and consolidates */
    rewrite_tensor(rank1, up, piece, -1, 0.0f);
    CU_ASSERT_EQUAL(run(j), FSDP_OK);
    snprintf(says, sizeof(says), "%s/consolidated.safetensors", tmpdir);
    CU_ASSERT_EQUAL(fsdp_checkpoint_consolidate(dir, says, NULL), FSDP_OK);
    free(j);
}

/* Rewrites the safetensors file at path with the 1-d piece `name`@0 of a [rows, 6] tensor as
 * two 2-d pieces of its columns, [0, 3) at column 0 and [3, 6) named for column col2 (3 in
 * place), and the second moved down `down` rows in name. */
static void as_column_blocks(const char *path, const char *name, int rows, int col2, int down)
{
    char from[128], n0[128], n1[128];
    fsdp_st_file_t *f;
    fsdp_st_entry_t *e;
    float *blk[2];
    int64_t shape[2] = {rows, 3};
    int n, k = 0;

    snprintf(from, sizeof(from), "%s@0", name);
    snprintf(n0, sizeof(n0), "%s@0,0", name);
    snprintf(n1, sizeof(n1), "%s@%d,%d", name, down, col2);
    CU_ASSERT_EQUAL_FATAL(fsdp_st_open(path, &f), FSDP_OK);
    n = fsdp_st_num_tensors(f);
    e = calloc((size_t)n + 1, sizeof(*e));
    blk[0] = malloc((size_t)rows * 6 * sizeof(float));
    blk[1] = blk[0] + (size_t)rows * 3;
    CU_ASSERT_FATAL(e != NULL && blk[0] != NULL);
    for (int i = 0; i < n; i++) {
        const fsdp_st_tensor_t *t = fsdp_st_tensor_at(f, i);
        if (strcmp(t->name, from) != 0) {
            e[k++] = (fsdp_st_entry_t){t->name, t->dtype, t->ndim, t->shape, t->data};
            continue;
        }
        CU_ASSERT_FATAL(t->numel == (uint64_t)rows * 6);
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < 6; c++)
                memcpy(&blk[c / 3][r * 3 + c % 3], (const float *)t->data + r * 6 + c,
                       sizeof(float));
        e[k++] = (fsdp_st_entry_t){n0, "F32", 2, shape, blk[0]};
        e[k++] = (fsdp_st_entry_t){n1, "F32", 2, shape, blk[1]};
    }
    CU_ASSERT_EQUAL(fsdp_st_write(path, e, k, NULL, 0), FSDP_OK);
    fsdp_st_close(f);
    free(blk[0]);
    free(e);
}

/* 2-d pieces (<name>@<row>,<col>, as tensor parallelism's column slices are saved): a tensor
 * held as two blocks of columns loads into another world and consolidates with the saved
 * values; a block over the other's columns is refused naming the elements in two pieces, and one
 * past the last row naming its rows and columns. */
static void test_2d_pieces(void)
{
    char dir[300], rank0[400], out[400], says[400];
    job_t *j = calloc(1, sizeof(job_t)), *saved = calloc(1, sizeof(job_t));

    snprintf(dir, sizeof(dir), "%s/blocks", tmpdir);
    *saved = (job_t){.world = 1,
                     .strategy = FSDP_FULL_SHARD,
                     .optim = FSDP_OPTIM_ADAMW,
                     .steps = 1,
                     .save = 1,
                     .save_step = 1,
                     .type = FSDP_STATE_DICT_SHARDED,
                     .dir = dir};
    CU_ASSERT_EQUAL_FATAL(run(saved), FSDP_OK);
    snprintf(rank0, sizeof(rank0), "%s/step-00000001/rank-00000.safetensors", dir);
    as_column_blocks(rank0, "layers.0.weight", 11, 3, 0);
    as_column_blocks(rank0, "state.layers.0.weight.exp_avg", 11, 3, 0);
    *j = (job_t){
        .world = 3, .strategy = FSDP_FULL_SHARD, .optim = FSDP_OPTIM_ADAMW, .load = 1, .dir = dir};
    CU_ASSERT_EQUAL(run(j), FSDP_OK);
    CU_ASSERT(memcmp(j->params, saved->params, sizeof(j->params)) == 0);
    snprintf(out, sizeof(out), "%s/blocks.safetensors", tmpdir);
    CU_ASSERT_EQUAL(fsdp_checkpoint_consolidate(dir, out, NULL), FSDP_OK);
    /* the second block at column 2: element 2 of each row twice, element 5 nowhere */
    rewrite_tensor(rank0, "layers.0.weight@0,3", "layers.0.weight@0,2", -1, 0.0f);
    snprintf(says, sizeof(says),
             "tensor 'layers.0.weight': elements [2, 3) are in two pieces (of "
             "rank-00000.safetensors and rank-00000.safetensors)");
    refused_saying(j, NULL, says);
    refused_saying(NULL, dir, says);
    /* one row down: past the 11 rows */
    rewrite_tensor(rank0, "layers.0.weight@0,2", "layers.0.weight@1,3", -1, 0.0f);
    snprintf(says, sizeof(says),
             "rank-00000.safetensors: piece 'layers.0.weight@1,3' holds rows [1, 1 + 11) and "
             "columns [3, 3 + 3) of tensor 'layers.0.weight', which has 11 rows of 6");
    refused_saying(j, NULL, says);
    refused_saying(NULL, dir, says);
    free(j);
    free(saved);
}

/* A negative exp_avg_sq (AdamW's mean of squares) is refused on load, naming the tensor, from
 * sharded, full and local checkpoints. */
static void test_negative_exp_avg_sq(void)
{
    static const fsdp_state_dict_type_t types[] = {FSDP_STATE_DICT_SHARDED, FSDP_STATE_DICT_FULL,
                                                   FSDP_STATE_DICT_LOCAL};
    char dir[300], file[400], name[128], says[300];
    job_t *j = calloc(1, sizeof(job_t));

    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        saved_job(j, dir, sizeof(dir), fsdp_state_dict_type_name(types[i]));
        j->save = 1;
        j->load = 0;
        j->type = types[i];
        j->save_step = 2;
        CU_ASSERT_EQUAL_FATAL(run(j), FSDP_OK);
        j->save = 0;
        j->load = 1;
        j->steps = 0;
        snprintf(file, sizeof(file), "%s/step-00000002/%s", dir,
                 types[i] == FSDP_STATE_DICT_FULL ? "optimizer.safetensors"
                                                  : "rank-00000.safetensors");
        find_tensor(file,
                    types[i] == FSDP_STATE_DICT_LOCAL ? "state.layers.0.flat_param.exp_avg_sq"
                                                      : "state.layers.0.weight.exp_avg_sq",
                    name, sizeof(name));
        rewrite_tensor(file, name, name, 5, -0.25f);
        snprintf(says, sizeof(says), "tensor '%.*s' holds -0.25 at element 5",
                 (int)strcspn(name, "@"), name);
        refused_saying(j, NULL, says);
        /* -0 is a square's mean too */
        rewrite_tensor(file, name, name, 5, -0.0f);
        CU_ASSERT_EQUAL(run(j), FSDP_OK);
    }
    free(j);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"sharded checkpoint, adamw: resume and reshard", test_sharded_adamw},
        {"full checkpoint, adamw: resume and reshard", test_full_adamw},
        {"sharded checkpoint, sgd, cpu offload", test_sharded_sgd_offload},
        {"sharded checkpoint of replicas: each piece once", test_sharded_replicas},
        {"full checkpoint file names", test_full_file_names},
        {"local checkpoint: same world only", test_local},
        {"a killed save leaves the old checkpoint", test_killed_save},
        {"corrupted checkpoints refused", test_corrupted},
        {"checkpoint.json fields checked", test_fields},
        {"overlapping pieces refused", test_overlapping_pieces},
        {"2-d pieces: read, and refused overlapping or past the end", test_2d_pieces},
        {"negative exp_avg_sq refused", test_negative_exp_avg_sq},
        {NULL, NULL},
    };
    int rc;
    setup();
    rc = fsdp_test_run("checkpoint", tests);
    cleanup();
    return rc;
}
