/* libFuzzer: the pieces of a sharded checkpoint as a load and --consolidate read them. Rank 0's
 * file is fixed and valid; the input is rank 1's file (rank-00001.safetensors). Whatever it
 * holds, a read that succeeds must have filled every element of its range from exactly one
 * piece, with that piece's value (checked against the pieces themselves); a bad file is refused
 * with a line, never a crash. */
#include "../../lib/nn/checkpoint_load.c"

#include <sys/stat.h>
#include <unistd.h>

/* The parameters of checkpoint.json and the elements of each that rank 0 holds, [0, held). */
static const struct {
    const char *name;
    size_t numel, held;
} params[] = {{"a.weight", 24, 12}, {"a.bias", 6, 3}, {"state.a.weight.exp_avg_sq", 24, 12}};
#define NPARAMS (sizeof(params) / sizeof(params[0]))

static char dir[64], rank1_path[128];

static int write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");

    if (f == NULL)
        return -1;
    fputs(text, f);
    return fclose(f);
}

/* The fixed part: latest, checkpoint.json and rank 0's pieces (and a module buffer). */
static int write_checkpoint(void)
{
    static const char meta[] =
        "{\"format\": \"libfsdp-checkpoint\", \"version\": 1, \"type\": \"sharded\", "
        "\"step\": 1, \"world_size\": 2, \"strategy\": \"full_shard\", \"params\": {"
        "\"a.weight\": {\"shape\": [6, 4], \"numel\": 24}, "
        "\"a.bias\": {\"shape\": [6], \"numel\": 6}}}";
    static float values[32];
    static int64_t shapes[NPARAMS + 1];
    static char names[NPARAMS][64];
    fsdp_st_entry_t e[NPARAMS + 1];
    char path[160];

    for (int i = 0; i < 32; i++)
        values[i] = (float)i + 0.5f;
    for (size_t i = 0; i < NPARAMS; i++) {
        snprintf(names[i], sizeof(names[i]), "%s@0", params[i].name);
        shapes[i] = (int64_t)params[i].held;
        e[i] = (fsdp_st_entry_t){names[i], "F32", 1, &shapes[i], values};
    }
    shapes[NPARAMS] = 2;
    e[NPARAMS] = (fsdp_st_entry_t){"a.running_mean", "F32", 1, &shapes[NPARAMS], values};
    snprintf(path, sizeof(path), "%s/latest", dir);
    if (write_text(path, "step-00000001\n") != 0)
        return -1;
    snprintf(path, sizeof(path), "%s/step-00000001", dir);
    if (mkdir(path, 0700) != 0)
        return -1;
    snprintf(path, sizeof(path), "%s/step-00000001/checkpoint.json", dir);
    if (write_text(path, meta) != 0)
        return -1;
    snprintf(path, sizeof(path), "%s/step-00000001/rank-00000.safetensors", dir);
    return fsdp_st_write(path, e, (int)NPARAMS + 1, NULL, 0) == FSDP_OK ? 0 : -1;
}

static void remove_dir(void)
{
    char path[160];

    unlink(rank1_path);
    snprintf(path, sizeof(path), "%s/step-00000001/rank-00000.safetensors", dir);
    unlink(path);
    snprintf(path, sizeof(path), "%s/step-00000001/checkpoint.json", dir);
    unlink(path);
    snprintf(path, sizeof(path), "%s/step-00000001", dir);
    rmdir(path);
    snprintf(path, sizeof(path), "%s/latest", dir);
    unlink(path);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fsdp_log_set_level(FSDP_LOG_OFF);
    snprintf(dir, sizeof(dir), "/tmp/fuzz_ckpt_pieces.XXXXXX");
    if (mkdtemp(dir) == NULL || write_checkpoint() != 0) {
        fprintf(stderr, "fuzz_checkpoint_pieces: cannot set up %s\n", dir);
        exit(1);
    }
    snprintf(rank1_path, sizeof(rank1_path), "%s/step-00000001/rank-00001.safetensors", dir);
    atexit(remove_dir);
    return 0;
}

/* The oracle: element i of tensor `name` is held by exactly one well-formed piece of the open
 * rank files, whose value is *v_p. */
static int held_once(const load_ctx_t *lc, const char *name, size_t i, float *v_p)
{
    size_t plen = strlen(name);
    int count = 0;

    for (int r = 0; r < lc->nfiles; r++) {
        for (int t = 0; lc->files[r] != NULL && t < fsdp_st_num_tensors(lc->files[r]); t++) {
            const fsdp_st_tensor_t *ten = fsdp_st_tensor_at(lc->files[r], t);
            const char *at = ten->name + plen;
            size_t off = 0;
            if (strncmp(ten->name, name, plen) != 0 || *at != '@' || at[1] == '\0')
                continue;
            for (at++; *at >= '0' && *at <= '9' && off < ((size_t)1 << 40); at++)
                off = off * 10 + (size_t)(*at - '0');
            if (*at != '\0' || strcmp(ten->dtype, "F32") != 0 || ten->ndim != 1)
                continue;
            if (i >= off && i - off < ten->numel) {
                memcpy(v_p, (const char *)ten->data + (i - off) * sizeof(float), sizeof(float));
                count++;
            }
        }
    }
    return count == 1;
}

/* A read of [start, start + n) of a parameter that succeeded holds what the oracle says. */
static void check_range(load_ctx_t *lc, size_t p, size_t start, size_t n)
{
    float *got = NULL;

    if (read_sharded_range(lc, params[p].name, params[p].numel, start, n, &got) != FSDP_OK)
        return;
    for (size_t i = 0; i < n; i++) {
        float want;
        if (!held_once(lc, params[p].name, start + i, &want) ||
            memcmp(&want, &got[i], sizeof(float)) != 0)
            __builtin_trap();
    }
    free(got);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FILE *f = fopen(rank1_path, "wb");
    load_ctx_t lc;

    if (f == NULL)
        return 0;
    if (fwrite(data, 1, size, f) != size) {
        fclose(f);
        return 0;
    }
    fclose(f);
    memset(&lc, 0, sizeof(lc));
    if (read_meta(&lc, dir) != FSDP_OK)
        __builtin_trap(); /* the fixed part is valid */
    lc.nfiles = lc.old_world;
    lc.files = calloc((size_t)lc.nfiles, sizeof(*lc.files));
    if (lc.files == NULL)
        return 0;
    /* a load's ranges (two ranks, then three) and consolidation's whole tensors */
    for (size_t p = 0; p < NPARAMS; p++) {
        size_t numel = params[p].numel;
        check_range(&lc, p, 0, numel);
        check_range(&lc, p, 0, numel / 2);
        check_range(&lc, p, numel / 2, numel - numel / 2);
        check_range(&lc, p, numel / 3, numel / 3);
    }
    {
        entry_list_t l = {0};
        int ndims[NPARAMS + 64];
        fsdp_st_file_t *f0;
        if (open_file(&lc, 0, "rank-00000.safetensors", &f0) == FSDP_OK &&
            fsdp_st_num_tensors(f0) + NPARAMS < sizeof(ndims) / sizeof(ndims[0]))
            consolidate_sharded(&lc, &l, ndims);
        fsdp_ckpt_list_free(&l);
    }
    for (int i = 0; i < lc.nfiles; i++)
        fsdp_st_close(lc.files[i]);
    free(lc.files);
    json_decref(lc.meta);
    return 0;
}
