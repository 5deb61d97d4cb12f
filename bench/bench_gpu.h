/* What the gpu benchmarks (bench_coll, bench_train) share: their options, the reasons to skip,
 * the cluster profile their predictions come from and the launcher's environment. */
#ifndef FSDP_BENCH_GPU_H
#define FSDP_BENCH_GPU_H

#include <fsdp/fsdp.h>
#include <fsdp/gpu.h>
#include <fsdp/sim.h>

typedef struct bench_gpu_args {
    int quick;                  /* --quick */
    fsdp_sim_profile_t profile; /* --profile P, default the simulator's */
    fsdp_launch_info_t info;    /* rank and world from the launcher */
} bench_gpu_args_t;

/* Reads `name [--quick] [--profile P]` (--isa X, bench_gemm's, is accepted and ignored, so that
 * `make bench BENCH_FLAGS=...` serves every benchmark), then says why it skips where there is no
 * gpu backend or no device. Returns -1 to go on, else the status main returns: 0 when skipped,
 * 2 for bad options or environment (said on stderr). */
int bench_gpu_setup(const char *name, int argc, char **argv, bench_gpu_args_t *a);

#endif
