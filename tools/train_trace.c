/* fsdp-train's trace database and step accounting, for its training loop (train_loop.c). */
#include "train_trace.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "progress.h"

fsdp_status_t train_trace_open(const char *path, const train_launch_t *launch,
                               const fsdp_config_t *cfg, const char *model, int argc, char **argv,
                               fsdp_trace_t **trace_p)
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
             cfg->forward_prefetch, cfg->limit_all_gathers, cfg->cpu_offload, cfg->ranks_per_node,
             cfg->mixed_precision.param_dtype == FSDP_DTYPE_UNSET
                 ? "f32"
                 : fsdp_dtype_name(cfg->mixed_precision.param_dtype),
             cfg->mixed_precision.reduce_dtype == FSDP_DTYPE_UNSET
                 ? "default"
                 : fsdp_dtype_name(cfg->mixed_precision.reduce_dtype));
    if (cfg->api == FSDP_API_FSDP2) {
        /* which API ran; an fsdp1 run's config stays as it was */
        size_t n = strlen(config) - 1;
        snprintf(config + n, sizeof(config) - n,
                 ", \"api\": \"fsdp2\", \"reshard_after_forward\": %d}",
                 cfg->reshard_after_forward);
    }
    if (cfg->api == FSDP_API_FSDP2 && cfg->mixed_precision.output_dtype != FSDP_DTYPE_UNSET) {
        size_t n = strlen(config) - 1;
        snprintf(config + n, sizeof(config) - n, ", \"output_dtype\": \"%s\"}",
                 fsdp_dtype_name(cfg->mixed_precision.output_dtype));
    }
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
    /* the runs table names the api beside the strategy for fully_shard: fsdp2 full_shard */
    info.strategy = cfg->api != FSDP_API_FSDP2                ? fsdp_strategy_name(cfg->strategy)
                    : cfg->strategy == FSDP_HYBRID_SHARD ? "fsdp2 hybrid_shard"
                                                         : "fsdp2 full_shard";
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

double train_wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Step lines held until the trace has committed their step (without a trace: printed at once),
 * so that a killed run's database holds every step it printed. */
typedef struct held_line {
    struct held_line *next;
    int64_t step;
    char text[];
} held_line_t;

static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;
static held_line_t *held_head, **held_tail = &held_head;

/* Prints the held lines of steps up to `upto`, in order, above the progress bar. Under
 * held_lock. */
static void print_held(int64_t upto)
{
    while (held_head != NULL && held_head->step <= upto) {
        held_line_t *l = held_head;

        progress_printf("%s", l->text);
        held_head = l->next;
        free(l);
    }
    if (held_head == NULL)
        held_tail = &held_head;
}

void train_print_rest(void)
{
    pthread_mutex_lock(&held_lock);
    print_held(INT64_MAX);
    pthread_mutex_unlock(&held_lock);
}


void train_step_line(fsdp_trace_t *trace, const train_launch_t *launch, int64_t step,
                     double loss, const char *unit, double items_per_s, double step_time,
                     size_t peak_allocated)
{
    char text[256];
    held_line_t *l;
    int n = snprintf(text, sizeof(text), "step %lld loss %.9g %s %.0f %s %.3f peak_mib %.2f",
                     (long long)step, loss, unit, items_per_s,
                     launch->backend == TRAIN_BACKEND_GPU ? "step_ms" : "sim_step_ms",
                     step_time * 1e3, (double)peak_allocated / 1048576.0);

    l = n >= 0 ? malloc(sizeof(*l) + strlen(text) + 1) : NULL;
    if (l == NULL)
        return;
    strcpy(l->text, text);
    l->step = step;
    l->next = NULL;
    pthread_mutex_lock(&held_lock);
    *held_tail = l;
    held_tail = &l->next;
    /* a trace that stopped (it said why and which steps it holds) commits nothing more */
    print_held(trace != NULL && fsdp_trace_status(trace) == FSDP_OK
                   ? fsdp_trace_committed_step(trace)
                   : INT64_MAX);
    pthread_mutex_unlock(&held_lock);
}

void train_report_totals(const train_launch_t *launch, const train_totals_t *t)
{
    if (t->steps_run <= 0)
        return;
    printf("trained %.0f %s in %.2f s: %.0f %s/s\n", t->items, t->unit, t->wall_s,
           t->wall_s > 0.0 ? t->items / t->wall_s : 0.0, t->unit);
    if (launch->backend == TRAIN_BACKEND_GPU)
        printf("loss %.4f -> %.4f over %lld steps; step time %.3f ms on the gpu backend\n",
               t->first_loss, t->last_loss, (long long)t->steps_run,
               t->step_time_sum / (double)t->steps_run * 1e3);
    else
        printf("loss %.4f -> %.4f over %lld steps; simulated step time %.3f ms on %s\n",
               t->first_loss, t->last_loss, (long long)t->steps_run,
               t->step_time_sum / (double)t->steps_run * 1e3, t->profile_name);
}

void train_report_outputs(const char *ckpt_dir, const char *trace_path)
{
    if (ckpt_dir != NULL)
        printf("checkpoint %s\n", ckpt_dir);
    if (trace_path != NULL)
        printf("trace %s (fsdp-trace summary %s)\n", trace_path, trace_path);
}

void train_step_begin(fsdp_dev_t *dev, train_step_clock_t *clock)
{
    clock->start = fsdp_dev_host_time(dev);
}

double train_step_end(fsdp_dev_t *dev, fsdp_t *fs, train_step_clock_t *clock, int64_t step,
                      double loss)
{
    double dt = fsdp_dev_host_time(dev) - clock->start;
    if (fsdp_trace_enabled(dev)) {
        fsdp_mem_stats_t st;
        fsdp_mem_get_stats(fsdp_memory(fs), &st);
        fsdp_trace_step(dev, step, loss, dt, &st);
    }
    return dt;
}
