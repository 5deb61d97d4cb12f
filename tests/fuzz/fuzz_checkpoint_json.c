/* libFuzzer: checkpoint.json as a resume reads it (every field checked before use). */
#include "../../lib/nn/checkpoint_load.c"

#include <sys/stat.h>

static char dir[64], json_path[128];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char path[128];
    FILE *f;

    (void)argc, (void)argv;
    fsdp_log_set_level(FSDP_LOG_OFF);
    snprintf(dir, sizeof(dir), "/tmp/fuzz_ckpt.XXXXXX");
    if (mkdtemp(dir) == NULL)
        return 1;
    snprintf(path, sizeof(path), "%s/latest", dir);
    f = fopen(path, "w");
    if (f == NULL)
        return 1;
    fputs("step-00000001\n", f);
    fclose(f);
    snprintf(path, sizeof(path), "%s/step-00000001", dir);
    mkdir(path, 0700);
    snprintf(json_path, sizeof(json_path), "%s/checkpoint.json", path);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const names[] = {"layers.0.weight", "layers.1.bias", "wte", ""};
    load_ctx_t lc;
    FILE *f = fopen(json_path, "wb");

    if (f == NULL)
        return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    memset(&lc, 0, sizeof(lc));
    if (read_meta(&lc, dir) == FSDP_OK) {
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
            int64_t step;
            int has_buffer;

            if (meta_opt_step(&lc, names[i], &step, &has_buffer) == FSDP_OK &&
                (step < 0 || step > CKPT_STEP_MAX || (has_buffer != 0 && has_buffer != 1)))
                __builtin_trap();
        }
        if (lc.step < 0 || lc.step > CKPT_STEP_MAX || lc.old_world < 1)
            __builtin_trap();
    }
    json_decref(lc.meta);
    return 0;
}
