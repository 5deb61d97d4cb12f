/* GPT-2 training steps on the gpu backend next to the simulator's prediction of the same run.
 *
 *     bench_train [--quick] [--profile P]
 *
 * gpt2-tiny (8 rows per rank) and gpt2 124M (4 rows per rank), sequences of the model's
 * positions, FULL_SHARD, AdamW, f32, zeros for tokens (the step's work does not depend on them).
 * Ranks: this process alone, or one process per GPU as a launcher started them (the environment
 * fsdp_launch_env reads, as fsdp-train --backend gpu). One step warms up (allocator, cuBLAS), then
 * the mean step over `steps` (10, --quick 3) is timed on the host from a synchronized device to a
 * synchronized device.
 *
 * Reported per model (rank 0):
 *   tokens/s  global tokens per step (ranks x rows x seq) / step time;
 *   MFU       6 x parameters x tokens/s / (ranks x the profile's dense f32 GEMM peak FLOP/s:
 *             the models compute in f32, with TF32 off as in PyTorch by default), the usual
 *             6N FLOPs per token of forward and backward, attention left out;
 *   memory    rank 0's peak allocated and reserved bytes of the caching allocator;
 * and the same from the simulator (shape mode: no data, the profile's costs, each kernel priced
 * as one, as the gpu backend runs it: ops fused) for the same world,
 * ranks per node and configuration, with measured / simulated ratios. Without the gpu backend or
 * a device it says why and exits 0 (make bench goes on). */
#include "config.h"

#include <fsdp/fsdp.h>
#include <fsdp/gpu.h>
#include <fsdp/sim.h>

#include "bench_gpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct run {
    fsdp_gpt2_config_t cfg;
    size_t rows, seq; /* per rank */
    int steps;
    /* rank 0's results */
    double step_s;
    size_t peak_allocated, peak_reserved;
} run_t;

/* The per-rank body both backends run. */
static fsdp_status_t train_rank(fsdp_dev_t *dev, void *arg)
{
    run_t *r = arg;
    int32_t *tokens = calloc(r->rows * r->seq, sizeof(*tokens));
    fsdp_optim_config_t oc;
    fsdp_config_t fc;
    fsdp_t *fs = NULL;
    fsdp_lm_t *m = NULL;
    fsdp_optim_t *opt = NULL;
    fsdp_mem_stats_t ms;
    fsdp_status_t st;
    double t0 = 0.0;

    if (tokens == NULL)
        return FSDP_ERR_NO_MEMORY;
    fsdp_config_init(&fc);
    fsdp_optim_config_init(&oc, FSDP_OPTIM_ADAMW);
    st = fsdp_create(dev, &fc, &fs);
    if (st == FSDP_OK)
        st = fsdp_gpt2_create(fs, &r->cfg, &m);
    if (st == FSDP_OK && !dev->no_data)
        st = fsdp_lm_init_params(m, 1);
    if (st == FSDP_OK)
        st = fsdp_optim_create(fs, &oc, &opt);
    /* step 0 warms up */
    for (int s = 0; s <= r->steps && st == FSDP_OK; s++) {
        float loss;
        if (s == 1) {
            st = fsdp_dev_stream_synchronize(dev, NULL);
            t0 = fsdp_dev_host_time(dev);
        }
        if (st == FSDP_OK)
            st = fsdp_lm_forward_backward(m, tokens, tokens, r->rows, r->seq, &loss);
        if (st == FSDP_OK)
            st = fsdp_optim_step(opt);
        fsdp_zero_grad(fs);
    }
    if (st == FSDP_OK)
        st = fsdp_dev_stream_synchronize(dev, NULL);
    if (st == FSDP_OK && dev->rank == 0) {
        r->step_s = (fsdp_dev_host_time(dev) - t0) / r->steps;
        fsdp_mem_get_stats(fsdp_memory(fs), &ms);
        r->peak_allocated = ms.peak_allocated;
        r->peak_reserved = ms.peak_reserved;
    }
    fsdp_optim_destroy(opt);
    fsdp_lm_destroy(m);
    fsdp_destroy(fs);
    free(tokens);
    return st;
}

static double ratio(double a, double b)
{
    return b > 0.0 ? a / b : 0.0;
}

/* The same run on the simulator, shape mode, the job's world and ranks per node. */
static fsdp_status_t sim_predict(run_t *sim, const fsdp_launch_info_t *info,
                                 const fsdp_sim_profile_t *profile)
{
    fsdp_sim_params_t sp;

    fsdp_sim_params_init(&sp);
    sp.world_size = info->world_size;
    sp.ranks_per_node = info->local_size > 0 ? info->local_size : info->world_size;
    sp.mode = FSDP_SIM_SHAPE;
    sp.profile = *profile;
    sp.profile.ops = FSDP_SIM_OPS_FUSED; /* the gpu backend runs each kernel as one */
    return fsdp_sim_launch(&sp, train_rank, sim, NULL);
}

static int bench_model(const char *name, size_t rows, int steps, const fsdp_launch_info_t *info,
                       const fsdp_sim_profile_t *profile)
{
    run_t gpu, sim;
    fsdp_dev_t *dev = NULL;
    fsdp_status_t st;
    double tokens, params, peak, gpu_tps, sim_tps;

    memset(&gpu, 0, sizeof(gpu));
    if (fsdp_gpt2_config_parse(name, &gpu.cfg) != FSDP_OK)
        return 1;
    gpu.rows = rows;
    gpu.seq = (size_t)gpu.cfg.n_positions;
    gpu.steps = steps;
    sim = gpu;

    st = fsdp_gpu_init_launched(info, 600.0, &dev);
    if (st == FSDP_OK)
        st = train_rank(dev, &gpu);
    fsdp_gpu_finalize(dev);
    if (st != FSDP_OK)
        return 1;
    if (info->rank != 0)
        return 0;

    if (sim_predict(&sim, info, profile) != FSDP_OK)
        return 1;

    tokens = (double)info->world_size * (double)gpu.rows * (double)gpu.seq;
    params = (double)fsdp_gpt2_num_params(&gpu.cfg);
    peak = (double)info->world_size * fsdp_sim_profile_matmul_flops(profile, FSDP_DTYPE_F32);
    gpu_tps = tokens / gpu.step_s;
    sim_tps = tokens / sim.step_s;
    printf("%s (%.0f parameters), %d rank%s, %zu x %zu tokens per rank, full_shard:\n", name,
           params, info->world_size, info->world_size > 1 ? "s" : "", gpu.rows, gpu.seq);
    printf("  %-14s %14s %14s %10s\n", "", "gpu", "sim", "gpu/sim");
    printf("  %-14s %14.3f %14.3f %10.3f\n", "step (ms)", gpu.step_s * 1e3, sim.step_s * 1e3,
           ratio(gpu.step_s, sim.step_s));
    printf("  %-14s %14.0f %14.0f %10.3f\n", "tokens/s", gpu_tps, sim_tps,
           ratio(gpu_tps, sim_tps));
    printf("  %-14s %13.2f%% %13.2f%% %10.3f\n", "MFU", 100.0 * 6.0 * params * gpu_tps / peak,
           100.0 * 6.0 * params * sim_tps / peak, ratio(gpu_tps, sim_tps));
    printf("  %-14s %14zu %14zu %10.3f\n", "peak alloc (B)", gpu.peak_allocated,
           sim.peak_allocated, ratio((double)gpu.peak_allocated, (double)sim.peak_allocated));
    printf("  %-14s %14zu %14zu %10.3f\n", "peak resv (B)", gpu.peak_reserved, sim.peak_reserved,
           ratio((double)gpu.peak_reserved, (double)sim.peak_reserved));
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    bench_gpu_args_t a;
    int rc = bench_gpu_setup("bench_train", argc, argv, &a);

    if (rc >= 0)
        return rc;
    if (a.info.rank == 0)
        printf("simulated: profile %s\n", a.profile.name);
    rc = bench_model("gpt2-tiny", 8, a.quick ? 3 : 10, &a.info, &a.profile);
    if (rc == 0)
        rc = bench_model("gpt2", 4, a.quick ? 3 : 10, &a.info, &a.profile);
    return rc;
}
