/* fsdp-train's training loop, for every model (train_loop.h): on each rank the model, the
 * optimizer and --resume's state, then per step the micro-batches of gradient accumulation, the
 * clip, the optimizer step, the checkpoint and the loss averaged over the ranks; on the host the
 * trace, the launch of the ranks and the report. The model's own part is train_model_ops_t. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "io/lock.h"
#include "progress.h"
#include "train_launch.h"
#include "train_loop.h"
#include "train_trace.h"

typedef struct loop_shared {
    const train_args_t *a;
    const train_model_t *m;
    size_t *peak;                 /* per rank */
    int64_t steps_run;            /* rank 0's: steps trained in this process */
    int64_t resumed_step;         /* rank 0's: the step --resume loaded */
    fsdp_trace_t *trace;          /* --trace, or NULL */
    double first_loss, last_loss; /* rank 0's */
    double step_time_sum;         /* rank 0's step times, seconds */
} loop_shared_t;

/* The mean of every rank's value (each rank counts the same number of rows or targets). */
static fsdp_status_t global_mean(fsdp_dev_t *dev, fsdp_t *fs, float *dbuf, float *value)
{
    fsdp_stream_t *s = fsdp_compute_stream(fs);
    fsdp_status_t status = fsdp_dev_memcpy_async(dev, dbuf, value, sizeof(float), s);
    if (status == FSDP_OK)
        status = fsdp_dev_all_reduce(dev, fsdp_dev_group_world(dev), dbuf, dbuf, 1,
                                      FSDP_DTYPE_F32, FSDP_REDUCE_AVG, s);
    if (status == FSDP_OK)
        status = fsdp_dev_memcpy_async(dev, value, dbuf, sizeof(float), s);
    if (status == FSDP_OK)
        status = fsdp_dev_stream_synchronize(dev, s);
    return status;
}

static fsdp_status_t train_rank(fsdp_dev_t *dev, void *arg)
{
    loop_shared_t *sh = arg;
    const train_args_t *a = sh->a;
    const train_model_ops_t *ops = sh->m->ops;
    fsdp_t *fs = NULL;
    void *model = NULL;
    fsdp_optim_t *opt = NULL;
    float *dloss = NULL;
    int64_t first_step = 0;
    fsdp_mem_stats_t st;
    fsdp_status_t status;

    status = sh->trace != NULL ? fsdp_trace_attach(sh->trace, dev) : FSDP_OK;
    if (status == FSDP_OK)
        status = fsdp_create(dev, &a->fsdp, &fs);
    if (status == FSDP_OK)
        status = ops->create(sh->m->shared, fs, &model);
    if (status == FSDP_OK)
        status = fsdp_optim_create(fs, &a->optim, &opt);
    if (status == FSDP_OK)
        status = fsdp_mem_alloc(fsdp_memory(fs), sizeof(float), FSDP_MEM_TEMPORARY,
                                fsdp_compute_stream(fs), (void **)&dloss);
    if (status == FSDP_OK && a->resume_dir != NULL) {
        status = fsdp_checkpoint_load(fs, opt, a->resume_dir, &first_step);
        if (status == FSDP_OK && dev->rank == 0) {
            sh->resumed_step = first_step;
            train_resumed(dev, a->resume_dir, first_step, a->quiet);
        }
    }
    if (status == FSDP_OK)
        ops->set_loss_scale(model, 1.0f / (float)a->grad_accum);
    for (int64_t step = first_step; step < a->steps && status == FSDP_OK; step++) {
        float loss = 0.0f;
        train_step_clock_t clock;
        double wall0 = train_wall_now();
        train_step_begin(dev, &clock);
        if (ops->batch != NULL)
            status = ops->batch(model, step);
        /* gradient accumulation: the first micro-batches under no_sync, the last syncs */
        for (int k = 0; k < a->grad_accum && status == FSDP_OK; k++) {
            float micro_loss = 0.0f;
            status = fsdp_set_sync_gradients(fs, k == a->grad_accum - 1);
            if (status == FSDP_OK)
                status = ops->forward_backward(model, k, a->grad_accum, &micro_loss);
            loss += micro_loss / (float)a->grad_accum;
        }
        if (status == FSDP_OK && a->clip_grad_norm > 0.0)
            status = fsdp_clip_grad_norm(fs, a->clip_grad_norm, 2.0, NULL);
        if (status == FSDP_OK)
            status = fsdp_optim_step(opt);
        fsdp_zero_grad(fs);
        if (status == FSDP_OK && a->ckpt_dir != NULL &&
            ((a->ckpt_every > 0 && (step + 1) % a->ckpt_every == 0) || step + 1 == a->steps))
            status = fsdp_checkpoint_save(fs, opt, a->ckpt_dir, a->state_dict, step + 1);
        if (status == FSDP_OK)
            status = global_mean(dev, fs, dloss, &loss);
        double step_time = status == FSDP_OK ? train_step_end(dev, fs, &clock, step + 1, loss) : 0;
        if (status == FSDP_OK && dev->rank == 0) {
            double wall = train_wall_now() - wall0;
            fsdp_mem_get_stats(fsdp_memory(fs), &st);
            if (sh->steps_run == 0)
                sh->first_loss = loss;
            sh->last_loss = loss;
            sh->steps_run++;
            sh->step_time_sum += step_time;
            if (!a->quiet) {
                char note[32];
                train_step_line(sh->trace, &a->launch, step + 1, (double)loss, sh->m->rate,
                                wall > 0 ? sh->m->step_items / wall : 0.0, step_time,
                                st.peak_allocated);
                snprintf(note, sizeof(note), "loss %.4f", (double)loss);
                progress_update(step + 1, note);
            }
        }
    }
    if (status == FSDP_OK && a->save_path != NULL)
        status = ops->save(model, a->save_path);
    if (fs != NULL) {
        fsdp_mem_get_stats(fsdp_memory(fs), &st);
        sh->peak[dev->rank] = st.peak_allocated;
        fsdp_mem_free(fsdp_memory(fs), dloss);
    }
    fsdp_optim_destroy(opt);
    ops->destroy(model);
    fsdp_destroy(fs);
    fsdp_trace_detach(dev);
    return status;
}

/* --save-checkpoint DIR is this run's alone until it ends: DIR (created if needed) is locked by
 * DIR/lock, so that a second run saving there is refused at once, naming this one's pid, instead
 * of replacing this run's checkpoints with its own. *created_p says whether DIR was made here. */
static int lock_checkpoint_dir(const char *dir, fsdp_lock_t **lock_p, int *created_p)
{
    char path[4096], what[4200];

    *lock_p = NULL;
    *created_p = 0;
    if (dir == NULL)
        return 0;
    if (snprintf(path, sizeof(path), "%s/lock", dir) >= (int)sizeof(path)) {
        cli_error("--save-checkpoint: the path '%s' is too long", dir);
        return -1;
    }
    if (mkdir(dir, 0755) == 0) {
        *created_p = 1;
    } else if (errno != EEXIST) {
        cli_error("--save-checkpoint %s: cannot create the directory: %s", dir, strerror(errno));
        return -1;
    }
    snprintf(what, sizeof(what), "checkpoint directory '%s'", dir);
    if (fsdp_lock_take(path, what, 0, lock_p) == FSDP_OK)
        return 0;
    if (*created_p)
        rmdir(dir);
    return -1; /* it said why */
}

/* Drops the lock, and the directory when this run made it and saved nothing into it. */
static void unlock_checkpoint_dir(const char *dir, fsdp_lock_t *lock, int created)
{
    fsdp_lock_release(lock);
    if (created)
        rmdir(dir); /* fails, as it should, once it holds a checkpoint */
}

int train_loop_run(const train_args_t *a, const train_model_t *m, int argc, char **argv)
{
    loop_shared_t sh = {.a = a, .m = m};
    const int report = train_launch_reports(&a->launch);
    char trace_buf[4096];
    const char *trace_path =
        train_launch_trace_path(&a->launch, a->trace_path, trace_buf, sizeof(trace_buf));
    fsdp_lock_t *ckpt_lock = NULL;
    fsdp_status_t status;
    double t0, dt;
    int rc = 1, ckpt_created = 0;

    sh.peak = calloc((size_t)a->world, sizeof(size_t));
    if (sh.peak == NULL) {
        cli_error("out of host memory");
        return 2;
    }
    /* the process that reports is the one that commits checkpoints (rank 0) */
    if (report && lock_checkpoint_dir(a->ckpt_dir, &ckpt_lock, &ckpt_created) != 0) {
        free(sh.peak);
        return 2;
    }
    if (train_trace_open(trace_path, &a->launch, &a->fsdp, m->name, argc, argv, &sh.trace) !=
        FSDP_OK) {
        unlock_checkpoint_dir(a->ckpt_dir, ckpt_lock, ckpt_created);
        free(sh.peak);
        return 2; /* it said why */
    }
    t0 = train_wall_now();
    if (!a->quiet && report)
        progress_start(a->steps, "step", "setting up");
    status = train_launch_run(&a->launch, train_rank, &sh);
    progress_end();
    dt = train_wall_now() - t0;
    if (fsdp_trace_close(sh.trace) != FSDP_OK && status == FSDP_OK)
        status = FSDP_ERR_IO;
    train_print_rest();
    /* on failure the failing rank logged why; its peers only saw it fail */
    if (status != FSDP_OK ||
        (report && train_resume_past_end(a->resume_dir, sh.resumed_step, a->steps)))
        goto out;
    if (report) {
        train_totals_t t = {.unit = m->unit,
                            .items = (double)sh.steps_run * m->step_items,
                            .wall_s = dt,
                            .steps_run = sh.steps_run,
                            .first_loss = sh.first_loss,
                            .last_loss = sh.last_loss,
                            .step_time_sum = sh.step_time_sum,
                            .profile_name = a->profile.name};
        train_report_totals(&a->launch, &t);
    }
    /* on the gpu backend each process knows its own rank's peak */
    for (int r = 0; r < a->world; r++) {
        if (a->launch.backend == TRAIN_BACKEND_SIM || r == a->launch.rank)
            printf("rank %d peak allocated %zu bytes\n", r, sh.peak[r]);
    }
    if (a->save_path != NULL && report && m->ops->report_save(a) != 0)
        goto out;
    train_report_outputs(report ? a->ckpt_dir : NULL, trace_path);
    rc = 0;
out:
    unlock_checkpoint_dir(a->ckpt_dir, ckpt_lock, ckpt_created);
    free(sh.peak);
    return rc;
}
