/* What the gpu benchmarks share (bench_gpu.h). */
#include "bench_gpu.h"

#include <stdio.h>
#include <string.h>

int bench_gpu_setup(const char *name, int argc, char **argv, bench_gpu_args_t *a)
{
    const char *profile_arg = NULL;
    fsdp_sim_params_t defaults;

    memset(a, 0, sizeof(*a));
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            a->quick = 1;
        } else if (strcmp(argv[i], "--profile") == 0 && i + 1 < argc) {
            profile_arg = argv[++i];
        } else if (strcmp(argv[i], "--isa") == 0 && i + 1 < argc) {
            i++; /* bench_gemm's */
        } else {
            fprintf(stderr, "usage: %s [--quick] [--profile P]\n", name);
            return 2;
        }
    }
    {
        char found[1024]; /* what the tables were measured on */
        fsdp_gpu_describe(found, sizeof(found));
        printf("%s: %s\n", name, found);
    }
    if (!fsdp_gpu_built()) {
        printf("%s: skipped: %s\n", name, fsdp_gpu_load_error());
        return 0;
    }
    if (fsdp_gpu_device_count() == 0) {
        printf("%s: skipped: no CUDA device is visible\n", name);
        return 0;
    }
    fsdp_sim_params_init(&defaults);
    a->profile = defaults.profile;
    if (profile_arg != NULL && fsdp_sim_profile_from_arg(profile_arg, &a->profile) != FSDP_OK)
        return 2; /* the library said what is wrong */
    if (fsdp_launch_env(&a->info) != FSDP_OK)
        return 2;
    return -1;
}
