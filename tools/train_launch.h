/* How fsdp-train runs its ranks: every rank a thread of this process on the simulator, or this
 * process one rank of a job on the gpu backend. Both call the same per-rank function. */
#ifndef FSDP_TOOLS_TRAIN_LAUNCH_H
#define FSDP_TOOLS_TRAIN_LAUNCH_H

#include <fsdp/fsdp.h>
#include <fsdp/gpu.h>
#include <fsdp/sim.h>

typedef enum { TRAIN_BACKEND_SIM = 0, TRAIN_BACKEND_GPU = 1 } train_backend_t;

typedef struct train_launch {
    train_backend_t backend;
    int world;      /* every rank of the run */
    int rank;       /* gpu: this process's rank; sim: 0 (it runs them all) */
    double timeout_s;
    const fsdp_sim_profile_t *profile; /* sim: the cluster its times come from */
    int ranks_per_node; /* sim: GPUs per simulated node (--ranks-per-node), 0 = the profile's */
    int threads;        /* sim: CPU threads of the whole world (--threads), 0 = online CPUs */
    size_t host_memory; /* sim: host bytes the world's memory may take (--host-memory; 0 = the
                         * library's default, SIZE_MAX = no bound) */
    int no_pack_cache;  /* sim: no packed LM-head weight kept (--no-pack-cache) */
    fsdp_launch_info_t info;           /* gpu: what the launcher said */
} train_launch_t;

/* "sim" or "gpu" into *backend_p; -1 for anything else. */
int train_backend_parse(const char *s, train_backend_t *backend_p);
const char *train_backend_name(train_backend_t backend);

/* gpu: checks that the library has the gpu backend and that this process sees a device, and
 * reads rank and world from the launcher's environment (fsdp_launch_env); world_arg (> 0 when
 * --world was given) must then agree with it. sim: the world is world_arg. Reports what is
 * wrong on stderr and returns non-zero. */
int train_launch_prepare(train_launch_t *l, train_backend_t backend, int world_arg,
                         double timeout_s, const fsdp_sim_profile_t *profile);

/* 1 when this process prints the run's report (sim: always; gpu: rank 0). */
int train_launch_reports(const train_launch_t *l);

/* sim: refuses, with one line and -1, a model whose parameters, gradients and optimizer state
 * alone (4 + 4 + 8 bytes a parameter for AdamW, 4 + 4 (+ 4 with momentum) for SGD: less than
 * the run holds) exceed the host memory the simulated world may take, before anything is
 * allocated, and names fsdp-plan, which plans it without the memory. 0 otherwise, and on the
 * gpu backend. */
int train_launch_check_host(const train_launch_t *l, const char *model, uint64_t params,
                            const fsdp_optim_config_t *optim);

/* The host bytes the run's data (--data, --tokens) may take: what --host-memory (default 90% of
 * the memory available; SIZE_MAX unbounded) leaves after, on the simulator, the least that
 * train_launch_check_host counts for the model. The data lives in this process's memory on
 * either backend. */
size_t train_launch_data_bytes(const train_launch_t *l, uint64_t params,
                               const fsdp_optim_config_t *optim);

/* Runs func on the ranks: sim: all of them, as threads; gpu: this process's one, after the
 * NCCL id went from rank 0 to every rank (fsdp_rendezvous, token FSDP_JOB_TOKEN) and
 * fsdp_gpu_init chose the device by local rank. */
fsdp_status_t train_launch_run(const train_launch_t *l, fsdp_rank_func_t func, void *arg);

/* sim: the cluster the run simulates: the profile with its nodes and GPUs per node set to the
 * run's topology: ranks_per_node GPUs per node when set (hybrid sharding's node, as PyTorch's
 * default groups take one node), else the profile's GPUs per node when the world is whole nodes
 * of it, else one node of every rank. */
void train_launch_sim_profile(const train_launch_t *l, fsdp_sim_profile_t *profile_p);

/* The trace database this process writes for --trace path: path itself, or on the gpu backend
 * with more than one rank "path.rank<N>" (each process writes its own rank's events). */
const char *train_launch_trace_path(const train_launch_t *l, const char *path, char *buf,
                                    size_t size);

#endif
