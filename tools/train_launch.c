/* fsdp-train's two ways of running ranks (see train_launch.h). */
#include "train_launch.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

int train_backend_parse(const char *s, train_backend_t *backend_p)
{
    if (strcmp(s, "sim") == 0)
        *backend_p = TRAIN_BACKEND_SIM;
    else if (strcmp(s, "gpu") == 0)
        *backend_p = TRAIN_BACKEND_GPU;
    else
        return -1;
    return 0;
}

const char *train_backend_name(train_backend_t backend)
{
    return backend == TRAIN_BACKEND_GPU ? "gpu" : "sim";
}

int train_launch_prepare(train_launch_t *l, train_backend_t backend, int world_arg,
                         double timeout_s, const fsdp_sim_profile_t *profile)
{
    char found[1024];

    memset(l, 0, sizeof(*l));
    l->backend = backend;
    l->timeout_s = timeout_s;
    l->profile = profile;
    if (backend == TRAIN_BACKEND_SIM) {
        l->world = world_arg > 0 ? world_arg : 4;
        return 0;
    }
    if (!fsdp_gpu_built()) {
        /* module missing (the paths tried), a library it needs missing (named), or not ours */
        cli_error("--backend gpu: %s; use --backend sim without it", fsdp_gpu_load_error());
        return -1;
    }
    /* driver, runtime and library versions, the devices, or why there is none (said here, so
     * the count below does not log it again) */
    fsdp_gpu_describe(found, sizeof(found));
    if (fsdp_gpu_device_count() == 0) {
        const char *visible = getenv("CUDA_VISIBLE_DEVICES");
        cli_error("--backend gpu: no CUDA device is visible to this process "
                  "(CUDA_VISIBLE_DEVICES=%s; %s); use --backend sim without one",
                  visible != NULL ? visible : "unset", found);
        return -1;
    }
    if (fsdp_launch_env(&l->info) != FSDP_OK)
        return -1; /* the library named the variable and what is allowed */
    if (world_arg > 0 && world_arg != l->info.world_size) {
        cli_error("--world %d, but the launcher (%s) started %d rank%s: with --backend gpu the "
                  "world is one process per rank; leave --world out or make them agree",
                  world_arg, l->info.launcher, l->info.world_size,
                  l->info.world_size == 1 ? "" : "s");
        return -1;
    }
    l->world = l->info.world_size;
    l->rank = l->info.rank;
    if (l->rank == 0) {
        printf("fsdp-train: %s\n", found);
        fflush(stdout);
    }
    return 0;
}

int train_launch_reports(const train_launch_t *l)
{
    return l->backend == TRAIN_BACKEND_SIM || l->rank == 0;
}

static fsdp_status_t run_gpu(const train_launch_t *l, fsdp_rank_func_t func, void *arg)
{
    fsdp_dev_t *dev = NULL;
    fsdp_status_t status;

    status = fsdp_gpu_init_launched(&l->info, l->timeout_s, &dev);
    if (status != FSDP_OK)
        return status;
    status = func(dev, arg);
    fsdp_gpu_finalize(dev);
    return status;
}

void train_launch_sim_profile(const train_launch_t *l, fsdp_sim_profile_t *profile_p)
{
    int per_node = l->ranks_per_node;

    if (l->profile != NULL) {
        *profile_p = *l->profile;
    } else {
        fsdp_sim_params_t defaults;
        fsdp_sim_params_init(&defaults);
        *profile_p = defaults.profile;
    }
    if (per_node <= 0 || l->world % per_node != 0) {
        per_node = profile_p->gpus_per_node;
        if (per_node <= 0 || l->world < per_node || l->world % per_node != 0)
            per_node = l->world;
    }
    profile_p->gpus_per_node = per_node;
    profile_p->nodes = l->world / per_node;
}

/* The bytes a model's parameters, gradients and optimizer state take at least (no activations,
 * no buffers): 4 + 4 a parameter, and AdamW's 8 or SGD's 4 with momentum. */
static double host_need(uint64_t params, const fsdp_optim_config_t *optim)
{
    double state = optim->kind == FSDP_OPTIM_ADAMW ? 8.0 : optim->momentum != 0.0f ? 4.0 : 0.0;
    return (double)params * (8.0 + state);
}

/* --host-memory, or the library's default (90% of the memory available). */
static size_t host_limit(const train_launch_t *l)
{
    return l->host_memory != 0 ? l->host_memory : fsdp_sim_host_memory_default();
}

int train_launch_check_host(const train_launch_t *l, const char *model, uint64_t params,
                            const fsdp_optim_config_t *optim)
{
    double need = host_need(params, optim);
    size_t limit;

    if (l->backend != TRAIN_BACKEND_SIM)
        return 0;
    limit = host_limit(l);
    if (need <= (double)limit)
        return 0;
    cli_error("%s: its %.4g parameters, their gradients and %s state alone take %.3g GiB, and "
              "the simulator holds every rank's memory in this machine's, which may give it "
              "%.3g GiB (--host-memory; default 90%% of the memory available). Plan it with "
              "fsdp-plan --model %s, which needs no memory for the model, or train a smaller "
              "model",
              model, (double)params, optim->kind == FSDP_OPTIM_ADAMW ? "AdamW's" : "SGD's",
              need / (1 << 30), (double)limit / (1 << 30), model);
    return -1;
}

size_t train_launch_data_bytes(const train_launch_t *l, uint64_t params,
                               const fsdp_optim_config_t *optim)
{
    size_t limit = host_limit(l);
    double need = l->backend == TRAIN_BACKEND_SIM ? host_need(params, optim) : 0.0;

    if (limit == SIZE_MAX)
        return SIZE_MAX;
    return need < (double)limit ? limit - (size_t)need : 0;
}

static int online_cpus(void)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return cpus > 0 ? (int)(cpus < 4096 ? cpus : 4096) : 1;
}

fsdp_status_t train_launch_run(const train_launch_t *l, fsdp_rank_func_t func, void *arg)
{
    fsdp_sim_params_t sim;

    if (l->backend == TRAIN_BACKEND_GPU)
        return run_gpu(l, func, arg);
    fsdp_sim_params_init(&sim);
    sim.world_size = l->world;
    sim.timeout_s = l->timeout_s;
    /* --threads bounds the whole run: a world of more ranks than that runs its ranks as fibers
     * on that many worker threads (the same results, bit for bit); a smaller one gives each rank
     * its share of them for its kernels */
    sim.threads = l->threads > 0 ? l->threads : online_cpus();
    if (l->world > sim.threads) {
        sim.fibers = 1;
        sim.workers = sim.threads;
    }
    sim.host_memory = l->host_memory;
    sim.no_pack_cache = l->no_pack_cache;
    train_launch_sim_profile(l, &sim.profile);
    sim.ranks_per_node = sim.profile.gpus_per_node;
    return fsdp_sim_launch(&sim, func, arg, NULL);
}

const char *train_launch_trace_path(const train_launch_t *l, const char *path, char *buf,
                                    size_t size)
{
    if (path == NULL || l->backend == TRAIN_BACKEND_SIM || l->world == 1)
        return path;
    snprintf(buf, size, "%s.rank%d", path, l->rank);
    return buf;
}
