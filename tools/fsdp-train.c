/* fsdp-train: trains a built-in model with FSDP on simulated ranks, or on GPUs (--backend gpu:
 * one process per rank, as a launcher starts them; train_launch.c).
 *
 *   fsdp-train --model mlp:16,32,4 --world 4 --strategy full_shard --optim adamw --lr 1e-2
 *              --steps 10
 *
 * Prints "step N loss X" per step (X as %.9g, the mean over the global batch; rank 0 only) and
 * each rank's peak allocated bytes (on the gpu backend, each process its own rank's). */
#include <fsdp/fsdp.h>

#include "cli.h"
#include "progress.h"
#include "train_trace.h"

#include "train_args.h"
#include "train_gpt2.h"
#include "train_launch.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct train_shared {
    const train_args_t *args;
    float *x, *y;          /* the global batch */
    float **init_weights;  /* per layer [out*in], or NULL */
    float **init_biases;   /* per layer [out], or NULL */
    size_t *peak;          /* per rank */
    float *losses;         /* per step (rank 0 writes) */
    int64_t steps_run;     /* rank 0's: steps trained in this process */
    double step_time_sum;  /* rank 0's step times, seconds */
    fsdp_trace_t *trace;   /* --trace, or NULL */
    int64_t resumed_step;  /* rank 0's: the step --resume loaded */
} train_shared_t;

/* ---- data and weights ---- */

static const fsdp_st_tensor_t *need_tensor(fsdp_st_file_t *f, const char *path, const char *name,
                                           int64_t d0, int64_t d1, int ndim)
{
    const fsdp_st_tensor_t *t = fsdp_st_find(f, name);
    if (t == NULL)
        cli_die("%s: no tensor '%s'", path, name);
    if (strcmp(t->dtype, "F32") != 0)
        cli_die("%s: tensor '%s' is %s; F32 is required", path, name, t->dtype);
    if (t->ndim != ndim || t->shape[0] != d0 || (ndim == 2 && t->shape[1] != d1)) {
        if (ndim == 2)
            cli_die("%s: tensor '%s' must have shape [%lld, %lld] for this model", path, name,
                    (long long)d0, (long long)d1);
        cli_die("%s: tensor '%s' must have shape [%lld] for this model", path, name, (long long)d0);
    }
    if (fsdp_st_check_finite(t, path) != FSDP_OK)
        cli_fail_quietly(); /* the library named the tensor and the element */
    return t;
}

static float *copy_tensor(const fsdp_st_tensor_t *t)
{
    float *p = malloc(t->nbytes ? t->nbytes : 1);
    if (p == NULL)
        cli_die("out of host memory");
    memcpy(p, t->data, t->nbytes);
    return p;
}

static void load_init(const train_args_t *a, train_shared_t *sh)
{
    fsdp_st_file_t *f;
    int expected = 2 * a->nlayers;

    if (fsdp_st_open(a->init_path, &f) != FSDP_OK)
        cli_fail_quietly();
    sh->init_weights = calloc((size_t)a->nlayers, sizeof(float *));
    sh->init_biases = calloc((size_t)a->nlayers, sizeof(float *));
    if (sh->init_weights == NULL || sh->init_biases == NULL)
        cli_die("out of host memory");
    for (int i = 0; i < a->nlayers; i++) {
        char name[64];
        snprintf(name, sizeof(name), "layers.%d.weight", i);
        sh->init_weights[i] = copy_tensor(
            need_tensor(f, a->init_path, name, a->dims[i + 1], a->dims[i], 2));
        snprintf(name, sizeof(name), "layers.%d.bias", i);
        sh->init_biases[i] = copy_tensor(need_tensor(f, a->init_path, name, a->dims[i + 1], 0, 1));
    }
    if (fsdp_st_num_tensors(f) != expected) {
        for (int i = 0; i < fsdp_st_num_tensors(f); i++) {
            const char *name = fsdp_st_tensor_at(f, i)->name;
            int layer, n = -1;
            char kind[16];
            if (sscanf(name, "layers.%d.%15[a-z]%n", &layer, kind, &n) != 2 ||
                (size_t)n != strlen(name) || layer < 0 || layer >= a->nlayers ||
                (strcmp(kind, "weight") && strcmp(kind, "bias")))
                cli_die("%s: unexpected tensor '%s' for a %d-layer mlp", a->init_path, name,
                        a->nlayers);
        }
    }
    fsdp_st_close(f);
}

static void load_data(const train_args_t *a, train_shared_t *sh)
{
    fsdp_st_file_t *f;
    const fsdp_st_tensor_t *x, *y;

    if (fsdp_st_open(a->data_path, &f) != FSDP_OK)
        cli_fail_quietly();
    x = fsdp_st_find(f, "x");
    if (x == NULL || x->ndim != 2)
        cli_die("%s: needs a 2-d tensor 'x' [B, %d]", a->data_path, a->dims[0]);
    need_tensor(f, a->data_path, "x", x->shape[0], a->dims[0], 2);
    y = need_tensor(f, a->data_path, "y", x->shape[0], a->dims[a->nlayers], 2);
    if (x->shape[0] % a->world != 0)
        cli_die("%s: the batch of %lld rows is not divisible by --world %d", a->data_path,
                (long long)x->shape[0], a->world);
    ((train_args_t *)a)->batch = (int)x->shape[0];
    sh->x = copy_tensor(x);
    sh->y = copy_tensor(y);
    fsdp_st_close(f);
}

/* Synthetic regression: x ~ N(0, 1), y = tanh(x @ A) with a seeded random A. */
static void make_data(const train_args_t *a, train_shared_t *sh)
{
    size_t b = (size_t)a->batch, din = (size_t)a->dims[0], dout = (size_t)a->dims[a->nlayers];
    float *proj = malloc(din * dout * sizeof(float));
    fsdp_rng_t rng;

    sh->x = malloc(b * din * sizeof(float));
    sh->y = malloc(b * dout * sizeof(float));
    if (proj == NULL || sh->x == NULL || sh->y == NULL)
        cli_die("out of host memory");
    fsdp_rng_seed(&rng, a->seed ^ 0x5eedda7aull);
    for (size_t i = 0; i < din * dout; i++)
        proj[i] = fsdp_rng_normal(&rng) / sqrtf((float)din);
    for (size_t i = 0; i < b * din; i++)
        sh->x[i] = fsdp_rng_normal(&rng);
    for (size_t r = 0; r < b; r++) {
        for (size_t o = 0; o < dout; o++) {
            double s = 0.0;
            for (size_t i = 0; i < din; i++)
                s += (double)sh->x[r * din + i] * proj[i * dout + o];
            sh->y[r * dout + o] = (float)tanh(s);
        }
    }
    free(proj);
}

/* ---- the rank's work ---- */

static fsdp_status_t save_weights(const train_args_t *a, fsdp_mlp_t *mlp, int rank)
{
    float **full = calloc((size_t)a->nlayers, sizeof(float *));
    fsdp_st_entry_t *entries = calloc((size_t)a->nlayers * 2, sizeof(*entries));
    int64_t (*shapes)[2] = calloc((size_t)a->nlayers * 2, sizeof(*shapes));
    char (*names)[64] = calloc((size_t)a->nlayers * 2, sizeof(*names));
    fsdp_status_t status = FSDP_OK;

    if (full == NULL || entries == NULL || shapes == NULL || names == NULL) {
        status = FSDP_ERR_NO_MEMORY;
        goto out;
    }
    for (int i = 0; i < a->nlayers && status == FSDP_OK; i++) {
        fsdp_unit_t *u = fsdp_mlp_layer(mlp, i);
        full[i] = malloc(fsdp_unit_flat_numel(u) * sizeof(float));
        if (full[i] == NULL) {
            status = FSDP_ERR_NO_MEMORY;
            break;
        }
        /* a collective: every rank gathers, rank 0 writes */
        status = fsdp_unit_gather_full(u, full[i]);
        for (int j = 0; j < 2 && status == FSDP_OK; j++) {
            fsdp_param_info_t pi;
            fsdp_st_entry_t *e = &entries[2 * i + j];
            fsdp_unit_param_info(u, j, &pi);
            snprintf(names[2 * i + j], sizeof(names[0]), "%s", pi.name);
            shapes[2 * i + j][0] = pi.shape[0];
            shapes[2 * i + j][1] = pi.ndim > 1 ? pi.shape[1] : 0;
            e->name = names[2 * i + j];
            e->dtype = "F32";
            e->ndim = pi.ndim;
            e->shape = shapes[2 * i + j];
            e->data = full[i] + pi.offset;
        }
    }
    if (status == FSDP_OK && rank == 0) {
        static const char *const meta[] = {"format", "pt"};
        status = fsdp_st_write(a->save_path, entries, a->nlayers * 2, meta, 1);
    }
out:
    for (int i = 0; full && i < a->nlayers; i++)
        free(full[i]);
    free(full);
    free(entries);
    free(shapes);
    free(names);
    return status;
}

static fsdp_status_t train_rank(fsdp_dev_t *dev, void *arg)
{
    train_shared_t *sh = arg;
    const train_args_t *a = sh->args;
    size_t rows = (size_t)a->batch / (size_t)a->world;
    size_t din = (size_t)a->dims[0], dout = (size_t)a->dims[a->nlayers];
    const float *x = sh->x + (size_t)dev->rank * rows * din;
    const float *y = sh->y + (size_t)dev->rank * rows * dout;
    fsdp_group_t *world = fsdp_dev_group_world(dev);
    fsdp_t *fs = NULL;
    fsdp_mlp_t *mlp = NULL;
    fsdp_optim_t *opt = NULL;
    float *dloss = NULL;
    fsdp_mem_stats_t st;
    fsdp_status_t status;

    status = sh->trace != NULL ? fsdp_trace_attach(sh->trace, dev) : FSDP_OK;
    if (status == FSDP_OK)
        status = fsdp_create(dev, &a->fsdp, &fs);
    if (status != FSDP_OK) {
        fsdp_trace_detach(dev);
        return status;
    }
    status = fsdp_mlp_create(fs, a->dims, a->nlayers, &mlp);
    if (status != FSDP_OK)
        goto out;
    if (sh->init_weights) {
        for (int i = 0; i < a->nlayers && status == FSDP_OK; i++) {
            status = fsdp_unit_set_param(fsdp_mlp_layer(mlp, i), 0, sh->init_weights[i]);
            if (status == FSDP_OK)
                status = fsdp_unit_set_param(fsdp_mlp_layer(mlp, i), 1, sh->init_biases[i]);
        }
    } else {
        status = fsdp_mlp_init_params(mlp, a->seed);
    }
    if (status == FSDP_OK)
        status = fsdp_optim_create(fs, &a->optim, &opt);
    if (status == FSDP_OK)
        status = fsdp_mem_alloc(fsdp_memory(fs), sizeof(float), FSDP_MEM_TEMPORARY,
                                fsdp_compute_stream(fs), (void **)&dloss);
    int64_t first_step = 0;
    if (status == FSDP_OK && a->resume_dir != NULL) {
        status = fsdp_checkpoint_load(fs, opt, a->resume_dir, &first_step);
        if (status == FSDP_OK && dev->rank == 0) {
            sh->resumed_step = first_step;
            train_resumed(dev, a->resume_dir, first_step, a->quiet);
        }
    }
    size_t micro_rows = rows / (size_t)a->grad_accum;
    fsdp_mlp_set_loss_scale(mlp, 1.0f / (float)a->grad_accum);
    for (int step = (int)first_step; step < a->steps && status == FSDP_OK; step++) {
        float loss = 0.0f;
        train_step_clock_t clock;
        double wall0 = train_wall_now(), step_time = 0;
        train_step_begin(dev, &clock);
        /* gradient accumulation: the first micro-batches under no_sync, the last syncs */
        for (int k = 0; k < a->grad_accum && status == FSDP_OK; k++) {
            float micro_loss = 0.0f;
            status = fsdp_set_sync_gradients(fs, k == a->grad_accum - 1);
            if (status == FSDP_OK)
                status = fsdp_mlp_forward_backward(mlp, x + (size_t)k * micro_rows * din,
                                                   y + (size_t)k * micro_rows * dout, micro_rows,
                                                   &micro_loss);
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
        /* the global mean: every rank holds the same number of rows */
        if (status == FSDP_OK)
            status =
                fsdp_dev_memcpy_async(dev, dloss, &loss, sizeof(float), fsdp_compute_stream(fs));
        if (status == FSDP_OK)
            status = fsdp_dev_all_reduce(dev, world, dloss, dloss, 1, FSDP_DTYPE_F32,
                                         FSDP_REDUCE_AVG, fsdp_compute_stream(fs));
        if (status == FSDP_OK)
            status =
                fsdp_dev_memcpy_async(dev, &loss, dloss, sizeof(float), fsdp_compute_stream(fs));
        if (status == FSDP_OK)
            status = fsdp_dev_stream_synchronize(dev, fsdp_compute_stream(fs));
        if (status == FSDP_OK)
            step_time = train_step_end(dev, fs, &clock, step + 1, loss);
        if (status == FSDP_OK && dev->rank == 0) {
            double wall = train_wall_now() - wall0;
            sh->losses[step] = loss;
            sh->steps_run++;
            sh->step_time_sum += step_time;
            if (!a->quiet) {
                char note[32];
                fsdp_mem_get_stats(fsdp_memory(fs), &st);
                train_step_line(sh->trace, &a->launch, step + 1, (double)loss, "rows/s",
                                wall > 0 ? (double)a->batch / wall : 0.0, step_time,
                                st.peak_allocated);
                snprintf(note, sizeof(note), "loss %.4f", (double)loss);
                progress_update(step + 1, note);
            }
        }
    }
    if (status == FSDP_OK && a->save_path)
        status = save_weights(a, mlp, dev->rank);
    fsdp_mem_get_stats(fsdp_memory(fs), &st);
    sh->peak[dev->rank] = st.peak_allocated;
out:
    fsdp_mem_free(fsdp_memory(fs), dloss);
    fsdp_optim_destroy(opt);
    fsdp_mlp_destroy(mlp);
    fsdp_destroy(fs);
    fsdp_trace_detach(dev);
    return status;
}

/* --consolidate DIR --save FILE: a file conversion, no ranks and no model. */
static int consolidate(const train_args_t *a)
{
    int64_t step;

    if (a->save_path == NULL)
        cli_die("--consolidate %s: name the file to write with --save FILE", a->consolidate_dir);
    if (a->resume_dir != NULL || a->ckpt_dir != NULL || a->init_path != NULL)
        cli_die("--consolidate trains nothing: it takes --save FILE, not --resume, "
                "--save-checkpoint or --init");
    if (fsdp_checkpoint_consolidate(a->consolidate_dir, a->save_path, &step) != FSDP_OK)
        cli_fail_quietly(); /* the library said why */
    printf("consolidated %s (step %lld) into %s\n", a->consolidate_dir, (long long)step,
           a->save_path);
    return 0;
}

/* The GPT-2 path: the options train_gpt2.c takes. */
static int train_gpt2(const train_args_t *a, int argc, char **argv)
{
    const char *argv0 = argv[0];
    gpt2_train_opts_t o;

    memset(&o, 0, sizeof(o));
    o.model_name = a->model_name;
    o.model = a->gpt_cfg;
    o.llama = a->llama;
    o.llama_model = a->llama_cfg;
    o.world = a->world;
    o.fsdp = a->fsdp;
    o.optim = a->optim;
    o.steps = a->steps;
    o.batch = a->batch;
    o.seq = a->seq;
    o.grad_accum = a->grad_accum;
    o.seed = a->seed;
    o.timeout_s = a->timeout_s;
    o.clip_grad_norm = a->clip_grad_norm;
    o.checkpoint_activations = a->checkpoint_activations;
    o.init_path = a->init_path;
    o.save_path = a->save_path;
    o.data_path = a->data_path;
    o.tokens_path = a->tokens_path;
    o.ckpt_dir = a->ckpt_dir;
    o.ckpt_every = a->ckpt_every;
    o.state_dict = a->state_dict;
    o.resume_dir = a->resume_dir;
    o.quiet = a->quiet;
    o.argv0 = argv0;
    o.trace_path = a->trace_path;
    o.profile = &a->profile;
    o.launch = &a->launch;
    o.argc = argc;
    o.argv = argv;
    return gpt2_train_main(&o);
}

int main(int argc, char **argv)
{
    train_args_t args;
    train_shared_t sh;
    fsdp_status_t status;
    char trace_buf[4096];
    const char *trace_path;
    double t0;

    cli_init("fsdp-train");
    train_parse_args(argc, argv, &args);
    if (args.consolidate_dir != NULL)
        return consolidate(&args);
    if (args.gpt)
        return train_gpt2(&args, argc, argv);
    memset(&sh, 0, sizeof(sh));
    sh.args = &args;
    if (train_launch_check_host(&args.launch,
                                args.model_name != NULL ? args.model_name : "mlp:16,32,4",
                                fsdp_mlp_num_params(args.dims, args.nlayers), &args.optim) != 0)
        return 1;
    if (args.init_path)
        load_init(&args, &sh);
    if (args.data_path)
        load_data(&args, &sh);
    else
        make_data(&args, &sh);
    sh.peak = calloc((size_t)args.world, sizeof(size_t));
    sh.losses = calloc((size_t)args.steps + 1, sizeof(float));
    if (sh.peak == NULL || sh.losses == NULL)
        cli_die("out of host memory");

    trace_path = train_launch_trace_path(&args.launch, args.trace_path, trace_buf,
                                         sizeof(trace_buf));
    if (train_trace_open(trace_path, &args.launch, &args.fsdp, "mlp", argc, argv, &sh.trace) !=
        FSDP_OK)
        cli_fail_quietly();
    if (!args.quiet && train_launch_reports(&args.launch))
        progress_start(args.steps, "step", "setting up");
    t0 = train_wall_now();
    status = train_launch_run(&args.launch, train_rank, &sh);
    progress_end();
    t0 = train_wall_now() - t0;
    if (fsdp_trace_close(sh.trace) != FSDP_OK && status == FSDP_OK)
        status = FSDP_ERR_IO;
    train_print_rest();
    if (status == FSDP_OK && train_launch_reports(&args.launch) &&
        train_resume_past_end(args.resume_dir, sh.resumed_step, args.steps))
        status = FSDP_ERR_INVALID_PARAM;
    /* on failure the failing rank logged why; peers only saw it fail. On the gpu backend each
     * process knows its own rank's peak. */
    if (status == FSDP_OK && train_launch_reports(&args.launch) && sh.steps_run > 0) {
        int64_t first = sh.resumed_step;
        train_totals_t t = {.unit = "rows",
                            .items = (double)sh.steps_run * (double)args.batch,
                            .wall_s = t0,
                            .steps_run = sh.steps_run,
                            .first_loss = sh.losses[first],
                            .last_loss = sh.losses[first + sh.steps_run - 1],
                            .step_time_sum = sh.step_time_sum,
                            .profile_name = args.profile.name};
        train_report_totals(&args.launch, &t);
    }
    for (int r = 0; status == FSDP_OK && r < args.world; r++) {
        if (args.launch.backend == TRAIN_BACKEND_SIM || r == args.launch.rank)
            printf("rank %d peak allocated %zu bytes\n", r, sh.peak[r]);
    }
    if (status == FSDP_OK && args.save_path && train_launch_reports(&args.launch))
        printf("saved %s\n", args.save_path);
    if (status == FSDP_OK)
        train_report_outputs(train_launch_reports(&args.launch) ? args.ckpt_dir : NULL, trace_path);

    for (int i = 0; sh.init_weights && i < args.nlayers; i++) {
        free(sh.init_weights[i]);
        free(sh.init_biases[i]);
    }
    free(sh.init_weights);
    free(sh.init_biases);
    free(sh.x);
    free(sh.y);
    free(sh.peak);
    free(sh.losses);
    return status == FSDP_OK ? 0 : 1;
}
