/* A Linear/ReLU stack with MSE loss: every Linear its own FSDP unit under a parameter-less
 * root. The forward and backward call only backend kernels and the FSDP hooks. */
#include <fsdp/log.h>
#include <fsdp/nn.h>

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fsdp_mlp {
    fsdp_t *fs;
    int nlayers;
    int dims[FSDP_MLP_MAX_LAYERS + 1];
    float loss_scale;
    fsdp_unit_t *root;
    fsdp_unit_t *layers[FSDP_MLP_MAX_LAYERS];
};

int fsdp_mlp_parse_spec(const char *spec, int *dims, int max_dims)
{
    const char *p = spec;
    int n = 0;

    if (spec == NULL)
        return -1;
    if (strncmp(p, "mlp:", 4) == 0)
        p += 4;
    while (*p) {
        char *end;
        long v;
        if (!isdigit((unsigned char)*p))
            return -1;
        v = strtol(p, &end, 10);
        if (v < 1 || v > (1L << 24) || n == max_dims)
            return -1;
        dims[n++] = (int)v;
        p = end;
        if (*p == ',')
            p++;
        else if (*p != '\0')
            return -1;
        if (*p == '\0' && end[0] == ',')
            return -1; /* trailing comma */
    }
    return n >= 2 ? n - 1 : -1;
}

fsdp_status_t fsdp_mlp_create(fsdp_t *fs, const int *dims, int nlayers, fsdp_mlp_t **mlp_p)
{
    fsdp_mlp_t *mlp;
    fsdp_status_t status;

    if (nlayers < 1 || nlayers > FSDP_MLP_MAX_LAYERS) {
        fsdp_error("an mlp needs 1 to %d layers, not %d", FSDP_MLP_MAX_LAYERS, nlayers);
        return FSDP_ERR_INVALID_PARAM;
    }
    for (int i = 0; i <= nlayers; i++) {
        if (dims[i] < 1) {
            fsdp_error("mlp width %d of layer boundary %d must be positive", dims[i], i);
            return FSDP_ERR_INVALID_PARAM;
        }
    }
    mlp = calloc(1, sizeof(*mlp));
    if (mlp == NULL)
        return FSDP_ERR_NO_MEMORY;
    mlp->fs = fs;
    mlp->nlayers = nlayers;
    mlp->loss_scale = 1.0f;
    memcpy(mlp->dims, dims, sizeof(int) * (size_t)(nlayers + 1));

    status = fsdp_unit_create(fs, "root", NULL, NULL, 0, &mlp->root);
    if (status != FSDP_OK)
        goto err_free_mlp;
    for (int i = 0; i < nlayers; i++) {
        char uname[32], wname[48], bname[48];
        fsdp_param_spec_t specs[2];
        memset(specs, 0, sizeof(specs));
        snprintf(uname, sizeof(uname), "layers.%d", i);
        snprintf(wname, sizeof(wname), "layers.%d.weight", i);
        snprintf(bname, sizeof(bname), "layers.%d.bias", i);
        specs[0].name = wname;
        specs[0].ndim = 2;
        specs[0].shape[0] = dims[i + 1];
        specs[0].shape[1] = dims[i];
        specs[0].requires_grad = 1;
        specs[0].tied_to = -1;
        specs[1].name = bname;
        specs[1].ndim = 1;
        specs[1].shape[0] = dims[i + 1];
        specs[1].requires_grad = 1;
        specs[1].tied_to = -1;
        status = fsdp_unit_create(fs, uname, mlp->root, specs, 2, &mlp->layers[i]);
        if (status != FSDP_OK)
            goto err_free_mlp;
    }
    *mlp_p = mlp;
    return FSDP_OK;

err_free_mlp:
    free(mlp); /* units belong to fs and go with it */
    return status;
}

void fsdp_mlp_destroy(fsdp_mlp_t *mlp)
{
    free(mlp);
}

void fsdp_mlp_set_loss_scale(fsdp_mlp_t *mlp, float scale)
{
    mlp->loss_scale = scale;
}

int fsdp_mlp_num_layers(const fsdp_mlp_t *mlp)
{
    return mlp->nlayers;
}

const int *fsdp_mlp_dims(const fsdp_mlp_t *mlp)
{
    return mlp->dims;
}

fsdp_unit_t *fsdp_mlp_layer(fsdp_mlp_t *mlp, int layer)
{
    return layer >= 0 && layer < mlp->nlayers ? mlp->layers[layer] : NULL;
}

fsdp_status_t fsdp_mlp_init_params(fsdp_mlp_t *mlp, uint64_t seed)
{
    fsdp_rng_t rng;
    fsdp_status_t status = FSDP_OK;
    size_t max_numel = 0;
    float *buf;

    for (int i = 0; i < mlp->nlayers; i++) {
        size_t n = (size_t)mlp->dims[i] * (size_t)mlp->dims[i + 1];
        if (n > max_numel)
            max_numel = n;
    }
    buf = malloc(max_numel * sizeof(float));
    if (buf == NULL)
        return FSDP_ERR_NO_MEMORY;
    fsdp_rng_seed(&rng, seed);
    for (int i = 0; i < mlp->nlayers && status == FSDP_OK; i++) {
        size_t in = (size_t)mlp->dims[i], out = (size_t)mlp->dims[i + 1];
        float bound = 1.0f / sqrtf((float)in);
        for (size_t j = 0; j < in * out; j++)
            buf[j] = fsdp_rng_uniform(&rng, -bound, bound);
        status = fsdp_unit_set_param(mlp->layers[i], 0, buf);
        if (status != FSDP_OK)
            break;
        for (size_t j = 0; j < out; j++)
            buf[j] = fsdp_rng_uniform(&rng, -bound, bound);
        status = fsdp_unit_set_param(mlp->layers[i], 1, buf);
    }
    free(buf);
    return status;
}

/* ---- forward and backward ---- */

typedef struct mlp_run {
    fsdp_mlp_t *mlp;
    fsdp_dev_t *dev;
    fsdp_stream_t *c;
    fsdp_mem_t *mem;
    size_t batch;
    float *act[FSDP_MLP_MAX_LAYERS + 1]; /* act[0] = x; act[i+1] = output of layer i */
} mlp_run_t;

static fsdp_status_t kernel(mlp_run_t *r, const fsdp_kernel_t *k)
{
    return r->dev->ops->kernel(r->dev, r->c, k);
}

static fsdp_status_t linear_forward(mlp_run_t *r, int i)
{
    fsdp_unit_t *u = r->mlp->layers[i];
    size_t in = (size_t)r->mlp->dims[i], out = (size_t)r->mlp->dims[i + 1];
    const float *w = fsdp_unit_param(u, 0), *b = fsdp_unit_param(u, 1);
    fsdp_kernel_t k = {.kind = FSDP_K_GEMM};
    fsdp_status_t status;

    /* y[B, out] = x[B, in] @ W^T, W is [out, in] as nn.Linear stores it */
    k.u.gemm.trans_a = 0;
    k.u.gemm.trans_b = 1;
    k.u.gemm.m = r->batch;
    k.u.gemm.n = out;
    k.u.gemm.k = in;
    k.u.gemm.alpha = 1.0f;
    k.u.gemm.a = r->act[i];
    k.u.gemm.lda = in;
    k.u.gemm.b = w;
    k.u.gemm.ldb = in;
    k.u.gemm.beta = 0.0f;
    k.u.gemm.c = r->act[i + 1];
    k.u.gemm.ldc = out;
    status = kernel(r, &k);
    if (status != FSDP_OK)
        return status;
    k.kind = FSDP_K_BIAS_ADD;
    k.u.bias_add.y = r->act[i + 1];
    k.u.bias_add.bias = b;
    k.u.bias_add.rows = r->batch;
    k.u.bias_add.cols = out;
    status = kernel(r, &k);
    if (status != FSDP_OK || i == r->mlp->nlayers - 1)
        return status;
    k.kind = FSDP_K_RELU_FWD;
    k.u.relu_fwd.y = r->act[i + 1];
    k.u.relu_fwd.x = r->act[i + 1];
    k.u.relu_fwd.n = r->batch * out;
    return kernel(r, &k);
}

/* dy: gradient of layer i's output [B, out]; dx (NULL for the first layer) receives the
 * gradient of its input [B, in], already passed back through the previous ReLU. */
static fsdp_status_t linear_backward(mlp_run_t *r, int i, const float *dy, float *dx)
{
    fsdp_unit_t *u = r->mlp->layers[i];
    size_t in = (size_t)r->mlp->dims[i], out = (size_t)r->mlp->dims[i + 1];
    fsdp_kernel_t k = {.kind = FSDP_K_GEMM};
    void *dw, *db;
    fsdp_status_t status;

    status = fsdp_unit_grad(u, 0, &dw);
    if (status == FSDP_OK)
        status = fsdp_unit_grad(u, 1, &db);
    if (status != FSDP_OK)
        return status;
    /* dW[out, in] += dy^T[out, B] @ x[B, in] */
    k.u.gemm.trans_a = 1;
    k.u.gemm.trans_b = 0;
    k.u.gemm.m = out;
    k.u.gemm.n = in;
    k.u.gemm.k = r->batch;
    k.u.gemm.alpha = 1.0f;
    k.u.gemm.a = dy;
    k.u.gemm.lda = out;
    k.u.gemm.b = r->act[i];
    k.u.gemm.ldb = in;
    k.u.gemm.beta = 1.0f;
    k.u.gemm.c = dw;
    k.u.gemm.ldc = in;
    status = kernel(r, &k);
    if (status != FSDP_OK)
        return status;
    k.kind = FSDP_K_BIAS_GRAD;
    k.u.bias_grad.dbias = db;
    k.u.bias_grad.dy = dy;
    k.u.bias_grad.rows = r->batch;
    k.u.bias_grad.cols = out;
    status = kernel(r, &k);
    if (status != FSDP_OK || dx == NULL)
        return status;
    /* dx[B, in] = dy[B, out] @ W[out, in], then through the ReLU that produced x */
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_GEMM;
    k.u.gemm.m = r->batch;
    k.u.gemm.n = in;
    k.u.gemm.k = out;
    k.u.gemm.alpha = 1.0f;
    k.u.gemm.a = dy;
    k.u.gemm.lda = out;
    k.u.gemm.b = fsdp_unit_param(u, 0);
    k.u.gemm.ldb = in;
    k.u.gemm.beta = 0.0f;
    k.u.gemm.c = dx;
    k.u.gemm.ldc = in;
    status = kernel(r, &k);
    if (status != FSDP_OK)
        return status;
    k.kind = FSDP_K_RELU_BWD;
    k.u.relu_bwd.dx = dx;
    k.u.relu_bwd.dy = dx;
    k.u.relu_bwd.y = r->act[i];
    k.u.relu_bwd.n = r->batch * in;
    return kernel(r, &k);
}

static fsdp_status_t alloc_act(mlp_run_t *r, size_t numel, float **p)
{
    return fsdp_mem_alloc(r->mem, numel * sizeof(float), FSDP_MEM_ACTIVATION, r->c, (void **)p);
}

fsdp_status_t fsdp_mlp_forward_backward(fsdp_mlp_t *mlp, const float *x, const float *y,
                                        size_t batch, float *loss_p)
{
    fsdp_t *fs = mlp->fs;
    mlp_run_t run = {.mlp = mlp, .dev = fsdp_device(fs), .c = fsdp_compute_stream(fs),
                     .mem = fsdp_memory(fs), .batch = batch};
    int L = mlp->nlayers;
    size_t out_numel = batch * (size_t)mlp->dims[L];
    float *target = NULL, *loss = NULL, *dy = NULL, *dx = NULL;
    fsdp_kernel_t k = {.kind = FSDP_K_MSE_LOSS};
    fsdp_status_t status;
    float host_loss = 0.0f;

    if (batch == 0) {
        fsdp_error("an mlp step needs at least one row of data on every rank");
        return FSDP_ERR_INVALID_PARAM;
    }
    /* inputs and targets move to the device on the compute stream (A.4) */
    status = alloc_act(&run, batch * (size_t)mlp->dims[0], &run.act[0]);
    if (status == FSDP_OK)
        status = run.dev->ops->memcpy_async(run.dev, run.act[0], x,
                                            batch * (size_t)mlp->dims[0] * sizeof(float), run.c);
    if (status == FSDP_OK)
        status = alloc_act(&run, out_numel, &target);
    if (status == FSDP_OK)
        status = run.dev->ops->memcpy_async(run.dev, target, y, out_numel * sizeof(float), run.c);
    if (status != FSDP_OK)
        goto out;

    /* forward */
    status = fsdp_pre_forward(mlp->root);
    for (int i = 0; i < L && status == FSDP_OK; i++) {
        status = alloc_act(&run, batch * (size_t)mlp->dims[i + 1], &run.act[i + 1]);
        if (status == FSDP_OK)
            status = fsdp_pre_forward(mlp->layers[i]);
        if (status == FSDP_OK)
            status = linear_forward(&run, i);
        if (status == FSDP_OK)
            status = fsdp_post_forward(mlp->layers[i]);
    }
    if (status == FSDP_OK)
        status = fsdp_post_forward(mlp->root);

    /* loss: mean over this rank's rows and outputs */
    if (status == FSDP_OK)
        status = fsdp_mem_alloc(run.mem, sizeof(float), FSDP_MEM_TEMPORARY, run.c,
                                (void **)&loss);
    if (status == FSDP_OK)
        status = alloc_act(&run, out_numel, &dy);
    if (status != FSDP_OK)
        goto out;
    k.u.mse.loss = loss;
    k.u.mse.dy = dy;
    k.u.mse.y = run.act[L];
    k.u.mse.t = target;
    k.u.mse.n = out_numel;
    /* the scale divides the denominator: loss and gradient both carry it */
    k.u.mse.denom = (double)out_numel / (double)mlp->loss_scale;
    status = kernel(&run, &k);

    /* backward: the root's gradient arrives first, then the units in reverse */
    if (status == FSDP_OK)
        status = fsdp_pre_backward(mlp->root);
    for (int i = L - 1; i >= 0 && status == FSDP_OK; i--) {
        if (i > 0)
            status = alloc_act(&run, batch * (size_t)mlp->dims[i], &dx);
        if (status == FSDP_OK)
            status = fsdp_pre_backward(mlp->layers[i]);
        if (status == FSDP_OK)
            status = linear_backward(&run, i, dy, dx);
        if (status == FSDP_OK)
            status = fsdp_post_backward(mlp->layers[i]);
        fsdp_mem_free(run.mem, dy);
        fsdp_mem_free(run.mem, run.act[i + 1]);
        run.act[i + 1] = NULL;
        dy = dx;
        dx = NULL;
    }
    if (status == FSDP_OK)
        status = fsdp_post_backward(mlp->root);
    if (status == FSDP_OK)
        status = fsdp_final_callback(fs);
    if (status == FSDP_OK)
        status = run.dev->ops->memcpy_async(run.dev, &host_loss, loss, sizeof(float), run.c);
    if (status == FSDP_OK)
        status = run.dev->ops->stream_synchronize(run.dev, run.c);
    if (status == FSDP_OK)
        *loss_p = host_loss / mlp->loss_scale;
out:
    fsdp_mem_free(run.mem, dx);
    fsdp_mem_free(run.mem, dy);
    fsdp_mem_free(run.mem, loss);
    fsdp_mem_free(run.mem, target);
    for (int i = 0; i <= L; i++)
        fsdp_mem_free(run.mem, run.act[i]);
    return status;
}
