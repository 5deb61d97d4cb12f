/* fsdp-train's trace database and step accounting, shared by the MLP and GPT-2 paths. */
#include "train_trace.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

fsdp_status_t train_trace_open(const char *path, const train_launch_t *launch,
                               const fsdp_config_t *cfg, const char *model, int argc, char **argv,
                               fsdp_trace_t **trace_p)
{
    char config[512], cmd[2048];
    size_t off = 0;
    fsdp_trace_run_info_t info;
    char *profile_json = NULL;
    fsdp_status_t status;

    *trace_p = NULL;
    if (path == NULL)
        return FSDP_OK;
    cmd[0] = '\0';
    for (int i = 0; i < argc && off < sizeof(cmd); i++)
        off += (size_t)snprintf(cmd + off, sizeof(cmd) - off, "%s%s", i ? " " : "", argv[i]);
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
    memset(&info, 0, sizeof(info));
    if (launch->backend == TRAIN_BACKEND_SIM) {
        fsdp_sim_profile_t profile;
        train_launch_sim_profile(launch, &profile);
        profile_json = fsdp_sim_profile_to_json(&profile);
        if (profile_json == NULL) {
            fprintf(stderr, "fsdp-train: error: --trace: out of host memory\n");
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

typedef struct held_line {
    struct held_line *next;
    int64_t step;
    char text[];
} held_line_t;

static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;
static held_line_t *held_head, **held_tail = &held_head;

/* Prints the held lines of steps up to `upto`, in order. Under held_lock. */
static void print_held(int64_t upto)
{
    int printed = 0;

    while (held_head != NULL && held_head->step <= upto) {
        held_line_t *l = held_head;

        fputs(l->text, stdout);
        held_head = l->next;
        free(l);
        printed = 1;
    }
    if (held_head == NULL)
        held_tail = &held_head;
    if (printed)
        fflush(stdout);
}

void train_print_step(fsdp_trace_t *trace, int64_t step, const char *fmt, ...)
{
    va_list ap;
    held_line_t *l;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    l = n >= 0 ? malloc(sizeof(*l) + (size_t)n + 1) : NULL;
    if (l == NULL)
        return;
    va_start(ap, fmt);
    vsnprintf(l->text, (size_t)n + 1, fmt, ap);
    va_end(ap);
    l->step = step;
    l->next = NULL;
    pthread_mutex_lock(&held_lock);
    *held_tail = l;
    held_tail = &l->next;
    print_held(trace != NULL ? fsdp_trace_committed_step(trace) : INT64_MAX);
    pthread_mutex_unlock(&held_lock);
}

void train_print_rest(void)
{
    pthread_mutex_lock(&held_lock);
    print_held(INT64_MAX);
    pthread_mutex_unlock(&held_lock);
}

void train_progress(int64_t step, int64_t steps, double loss)
{
    enum { WIDTH = 30 };
    char bar[WIDTH + 1];
    int filled;

    if (steps <= 0 || !isatty(STDERR_FILENO))
        return;
    filled = (int)(WIDTH * step / steps);
    for (int i = 0; i < WIDTH; i++)
        bar[i] = i < filled ? '#' : '.';
    bar[WIDTH] = '\0';
    fprintf(stderr, "\r[%s] %lld/%lld loss %.4f", bar, (long long)step, (long long)steps, loss);
    if (step == steps)
        fputc('\n', stderr);
    fflush(stderr);
}
