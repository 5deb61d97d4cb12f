/* fsdp-train's trace database and step accounting, shared by the MLP and GPT-2 paths. */
#include "train_trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "progress.h"

fsdp_status_t train_trace_open(const char *path, const train_launch_t *launch,
                               const fsdp_config_t *cfg, const char *model, int argc,
                               char **argv, fsdp_trace_t **trace_p)
{
    char config[512], cmd[2048];
    fsdp_trace_run_info_t info;
    char *profile_json = NULL;
    fsdp_status_t status;

    *trace_p = NULL;
    if (path == NULL)
        return FSDP_OK;
    cli_command_line(argc, argv, cmd, sizeof(cmd));
    snprintf(config, sizeof(config),
             "{\"model\": \"%s\", \"strategy\": \"%s\", \"backward_prefetch\": %d, "
             "\"forward_prefetch\": %d, \"limit_all_gathers\": %d, \"cpu_offload\": %d, "
             "\"ranks_per_node\": %d, \"param_dtype\": \"%s\", \"reduce_dtype\": \"%s\"}",
             model, fsdp_strategy_name(cfg->strategy), (int)cfg->backward_prefetch,
             cfg->forward_prefetch, cfg->limit_all_gathers, cfg->cpu_offload,
             cfg->ranks_per_node,
             cfg->mixed_precision.param_dtype == FSDP_DTYPE_UNSET
                 ? "f32" : fsdp_dtype_name(cfg->mixed_precision.param_dtype),
             cfg->mixed_precision.reduce_dtype == FSDP_DTYPE_UNSET
                 ? "default" : fsdp_dtype_name(cfg->mixed_precision.reduce_dtype));
    memset(&info, 0, sizeof(info));
    if (launch->backend == TRAIN_BACKEND_SIM) {
        fsdp_sim_profile_t profile;
        train_launch_sim_profile(launch, &profile);
        profile_json = fsdp_sim_profile_to_json(&profile);
        if (profile_json == NULL) {
            cli_error("--trace: out of host memory");
            return FSDP_ERR_OUT_OF_MEMORY;
        }
    }
    info.backend = train_backend_name(launch->backend);
    info.world_size = launch->world;
    info.strategy = fsdp_strategy_name(cfg->strategy);
    info.config_json = config;
    info.profile_json = profile_json;
    info.command_line = cmd;
    status = fsdp_trace_open(path, &info, trace_p);
    free(profile_json);
    return status;
}

void train_resumed(const fsdp_dev_t *dev, const char *dir, int64_t step, int quiet)
{
    if (dev->rank == 0 && !quiet)
        progress_printf("resumed from %s at step %lld", dir, (long long)step);
}

int train_resume_past_end(const char *dir, int64_t step, int64_t steps)
{
    if (dir == NULL || step < steps)
        return 0;
    cli_error("--resume %s: the checkpoint is at step %lld and --steps is %lld: nothing to train "
              "(--steps is the total, counted from step 0; give more than %lld to continue)",
              dir, (long long)step, (long long)steps, (long long)step);
    return 1;
}

void train_step_begin(fsdp_dev_t *dev, train_step_clock_t *clock)
{
    clock->start = dev->ops->host_time(dev);
}

double train_step_end(fsdp_dev_t *dev, fsdp_t *fs, train_step_clock_t *clock, int64_t step,
                      double loss)
{
    double dt = dev->ops->host_time(dev) - clock->start;
    if (fsdp_trace_enabled(dev)) {
        fsdp_mem_stats_t st;
        fsdp_mem_get_stats(fsdp_memory(fs), &st);
        fsdp_trace_step(dev, step, loss, dt, &st);
    }
    return dt;
}
