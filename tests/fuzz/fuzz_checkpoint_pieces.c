/* libFuzzer: the pieces of a sharded checkpoint as a load and --consolidate read them, 1-d runs
 * of the flattened tensor (<name>@<offset>) and 2-d blocks of rows and columns
 * (<name>@<row>,<col>, a tensor-parallel column slice's). Rank 0's file is fixed and valid; the
 * input is rank 1's file (rank-00001.safetensors). Whatever it holds, a read that succeeds must
 * have filled every element of its range from exactly one piece, with that piece's value
 * (checked against the pieces themselves); a bad file is refused with a line, never a crash. */
#include "../../lib/nn/checkpoint_load.c"

#include <sys/stat.h>
#include <unistd.h>

/* The parameters of checkpoint.json (cols: the columns of a 2-d one, 0 for a 1-d one) and the
 * elements of each that rank 0 holds: [0, held) of the flattened tensor, or for b.weight its
 * columns [0, held) of every row, as one 2-d piece. */
static const struct {
    const char *name;
    size_t numel, cols, held;
} params[] = {{"a.weight", 24, 4, 12},
              {"a.bias", 6, 0, 3},
              {"state.a.weight.exp_avg_sq", 24, 4, 12},
              {"b.weight", 24, 6, 3}};
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
        "\"a.bias\": {\"shape\": [6], \"numel\": 6}, "
        "\"b.weight\": {\"shape\": [4, 6], \"numel\": 24}}}";
    static float values[32];
    static int64_t shapes[NPARAMS + 1][2];
    static char names[NPARAMS][64];
    fsdp_st_entry_t e[NPARAMS + 1];
    char path[160];

    for (int i = 0; i < 32; i++)
        values[i] = (float)i + 0.5f;
    for (size_t i = 0; i < NPARAMS; i++) {
        const int two_d = strcmp(params[i].name, "b.weight") == 0;
        snprintf(names[i], sizeof(names[i]), two_d ? "%s@0,0" : "%s@0", params[i].name);
        shapes[i][0] =
            two_d ? (int64_t)(params[i].numel / params[i].cols) : (int64_t)params[i].held;
        shapes[i][1] = (int64_t)params[i].held;
        e[i] = (fsdp_st_entry_t){names[i], "F32", two_d ? 2 : 1, shapes[i], values};
    }
    shapes[NPARAMS][0] = 2;
    e[NPARAMS] = (fsdp_st_entry_t){"a.running_mean", "F32", 1, shapes[NPARAMS], values};
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

/* The oracle: element i of tensor `name` (cols columns, 0 when 1-d) is held by exactly one
 * well-formed piece of the open rank files, whose value is *v_p: a 1-d <name>@<offset> holds
 * flattened elements [offset, offset + numel), a 2-d <name>@<row>,<col> of shape [h, w] rows
 * [row, row + h) of columns [col, col + w). */
static int held_once(const load_ctx_t *lc, const char *name, size_t cols, size_t i, float *v_p)
{
    size_t plen = strlen(name);
    int count = 0;

    for (int r = 0; r < lc->nfiles; r++) {
        for (int t = 0; lc->files[r] != NULL && t < fsdp_st_num_tensors(lc->files[r]); t++) {
            const fsdp_st_tensor_t *ten = fsdp_st_tensor_at(lc->files[r], t);
            const char *at = ten->name + plen;
            size_t place[2] = {0, 0}, at_elem;
            int k = 0;
            if (strncmp(ten->name, name, plen) != 0 || *at != '@')
                continue;
            for (at++; k < 2; k++) {
                if (*at < '0' || *at > '9')
                    break;
                for (; *at >= '0' && *at <= '9' && place[k] < ((size_t)1 << 40); at++)
                    place[k] = place[k] * 10 + (size_t)(*at - '0');
                if (*at != ',' || k == 1)
                    break;
                at++;
            }
            if (*at != '\0' || k + 1 != ten->ndim || strcmp(ten->dtype, "F32") != 0)
                continue;
            if (ten->ndim == 1) {
                if (i < place[0] || i - place[0] >= ten->numel)
                    continue;
                at_elem = i - place[0];
            } else {
                const size_t row = cols ? i / cols : 0, col = cols ? i % cols : 0;
                if (cols == 0 || row < place[0] || row - place[0] >= (size_t)ten->shape[0] ||
                    col < place[1] || col - place[1] >= (size_t)ten->shape[1])
                    continue;
                at_elem = (row - place[0]) * (size_t)ten->shape[1] + (col - place[1]);
            }
            memcpy(v_p, (const char *)ten->data + at_elem * sizeof(float), sizeof(float));
            count++;
        }
    }
    return count == 1;
}

/* A read of [start, start + n) of a parameter that succeeded holds what the oracle says. */
static void check_range(load_ctx_t *lc, size_t p, size_t start, size_t n)
{
    float *got = NULL;

    if (read_sharded_range(lc, params[p].name, params[p].numel, params[p].cols, start, n, &got) !=
        FSDP_OK)
        return;
    for (size_t i = 0; i < n; i++) {
        float want;
        if (!held_once(lc, params[p].name, params[p].cols, start + i, &want) ||
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
