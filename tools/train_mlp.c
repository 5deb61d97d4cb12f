/* fsdp-train --model mlp:...: the MLP as train_loop.c drives it. Its data is one global batch,
 * a safetensors file's (--data) or a synthetic regression's, each rank training on its rows of
 * it every step; its first values are fsdp_mlp_init_params's or --init's. */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "train_launch.h"
#include "train_loop.h"

typedef struct mlp_shared {
    const train_args_t *args;
    float *x, *y;         /* the global batch */
    float **init_weights; /* per layer [out*in], or NULL */
    float **init_biases;  /* per layer [out], or NULL */
} mlp_shared_t;

/* A rank's model and its rows of the batch. */
typedef struct mlp_rank {
    const mlp_shared_t *sh;
    fsdp_mlp_t *mlp;
    int rank;
    const float *x, *y; /* the rank's rows */
    size_t micro_rows;  /* rows of a micro-batch */
} mlp_rank_t;

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

static void load_init(const train_args_t *a, mlp_shared_t *sh)
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
        sh->init_weights[i] =
            copy_tensor(need_tensor(f, a->init_path, name, a->dims[i + 1], a->dims[i], 2));
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

static void load_data(train_args_t *a, mlp_shared_t *sh, size_t max_bytes)
{
    fsdp_st_file_t *f;
    const fsdp_st_tensor_t *x, *y;

    if (fsdp_st_open(a->data_path, &f) != FSDP_OK)
        cli_fail_quietly();
    x = fsdp_st_find(f, "x");
    if (x == NULL || x->ndim != 2)
        cli_die("%s: needs a 2-d tensor 'x' [B, %d]", a->data_path, a->dims[0]);
    y = fsdp_st_find(f, "y");
    if (x->nbytes + (y != NULL ? y->nbytes : 0) > max_bytes) /* before a byte of them is read */
        cli_die("%s: tensors 'x' and 'y' take %llu bytes, more than the %zu bytes of host memory "
                "the data may take (--host-memory, default 90%% of the memory available)",
                a->data_path, (unsigned long long)(x->nbytes + (y != NULL ? y->nbytes : 0)),
                max_bytes);
    need_tensor(f, a->data_path, "x", x->shape[0], a->dims[0], 2);
    y = need_tensor(f, a->data_path, "y", x->shape[0], a->dims[a->nlayers], 2);
    if (x->shape[0] % a->world != 0)
        cli_die("%s: the batch of %lld rows is not divisible by --world %d", a->data_path,
                (long long)x->shape[0], a->world);
    a->batch = (int)x->shape[0];
    sh->x = copy_tensor(x);
    sh->y = copy_tensor(y);
    fsdp_st_close(f);
}

/* Synthetic regression: x ~ N(0, 1), y = tanh(x @ A) with a seeded random A. */
static void make_data(const train_args_t *a, mlp_shared_t *sh)
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

static fsdp_status_t save_weights(const train_args_t *a, fsdp_mlp_t *mlp, int rank,
                                  const char *path)
{
    float **full = calloc((size_t)a->nlayers, sizeof(float *));
    fsdp_st_entry_t *entries = calloc((size_t)a->nlayers * 2, sizeof(*entries));
    int64_t(*shapes)[2] = calloc((size_t)a->nlayers * 2, sizeof(*shapes));
    char(*names)[64] = calloc((size_t)a->nlayers * 2, sizeof(*names));
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
        status = fsdp_st_write(path, entries, a->nlayers * 2, meta, 1);
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

static fsdp_status_t mlp_create(const void *shared, fsdp_t *fs, void **model_p)
{
    const mlp_shared_t *sh = shared;
    const train_args_t *a = sh->args;
    const size_t rows = (size_t)a->batch / (size_t)a->world;
    const size_t din = (size_t)a->dims[0], dout = (size_t)a->dims[a->nlayers];
    mlp_rank_t *r = calloc(1, sizeof(*r));
    fsdp_status_t status;

    *model_p = r;
    if (r == NULL)
        return FSDP_ERR_NO_MEMORY;
    r->sh = sh;
    r->rank = fsdp_device(fs)->rank;
    r->x = sh->x + (size_t)r->rank * rows * din;
    r->y = sh->y + (size_t)r->rank * rows * dout;
    r->micro_rows = rows / (size_t)a->grad_accum;
    status = fsdp_mlp_create(fs, a->dims, a->nlayers, &r->mlp);
    if (status != FSDP_OK || sh->init_weights == NULL)
        return status == FSDP_OK ? fsdp_mlp_init_params(r->mlp, a->seed) : status;
    for (int i = 0; i < a->nlayers && status == FSDP_OK; i++) {
        status = fsdp_unit_set_param(fsdp_mlp_layer(r->mlp, i), 0, sh->init_weights[i]);
        if (status == FSDP_OK)
            status = fsdp_unit_set_param(fsdp_mlp_layer(r->mlp, i), 1, sh->init_biases[i]);
    }
    return status;
}

static void mlp_set_loss_scale(void *model, float scale)
{
    fsdp_mlp_set_loss_scale(((mlp_rank_t *)model)->mlp, scale);
}

static fsdp_status_t mlp_forward_backward(void *model, int k, int n, float *loss_p)
{
    mlp_rank_t *r = model;
    const train_args_t *a = r->sh->args;
    const size_t din = (size_t)a->dims[0], dout = (size_t)a->dims[a->nlayers];

    (void)n;
    return fsdp_mlp_forward_backward(r->mlp, r->x + (size_t)k * r->micro_rows * din,
                                     r->y + (size_t)k * r->micro_rows * dout, r->micro_rows,
                                     loss_p);
}

static fsdp_status_t mlp_save(void *model, const char *path)
{
    mlp_rank_t *r = model;
    return save_weights(r->sh->args, r->mlp, r->rank, path);
}

static void mlp_destroy(void *model)
{
    mlp_rank_t *r = model;
    if (r == NULL)
        return;
    fsdp_mlp_destroy(r->mlp);
    free(r);
}

static int mlp_report_save(const train_args_t *a)
{
    printf("saved %s\n", a->save_path);
    return 0;
}

static const train_model_ops_t mlp_ops = {
    .create = mlp_create,
    .set_loss_scale = mlp_set_loss_scale,
    .forward_backward = mlp_forward_backward,
    .save = mlp_save,
    .destroy = mlp_destroy,
    .report_save = mlp_report_save,
};

int train_mlp_main(train_args_t *a, int argc, char **argv)
{
    mlp_shared_t sh = {.args = a};
    train_model_t m = {
        .ops = &mlp_ops, .shared = &sh, .name = "mlp", .unit = "rows", .rate = "rows/s"};
    int rc;

    if (train_launch_check_host(&a->launch, a->model_name != NULL ? a->model_name : "mlp:16,32,4",
                                fsdp_mlp_num_params(a->dims, a->nlayers), &a->optim) != 0)
        return 1;
    if (a->init_path)
        load_init(a, &sh);
    if (a->data_path) /* the batch is the file's */
        load_data(a, &sh,
                  train_launch_data_bytes(&a->launch, fsdp_mlp_num_params(a->dims, a->nlayers),
                                          &a->optim));
    else
        make_data(a, &sh);
    m.step_items = (double)a->batch;
    rc = train_loop_run(a, &m, argc, argv);
    for (int i = 0; sh.init_weights && i < a->nlayers; i++) {
        free(sh.init_weights[i]);
        free(sh.init_biases[i]);
    }
    free(sh.init_weights);
    free(sh.init_biases);
    free(sh.x);
    free(sh.y);
    return rc;
}
