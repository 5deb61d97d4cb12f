/* A Linear/ReLU stack with MSE loss: every Linear its own FSDP unit under a parameter-less
 * root. The forward and backward call only backend kernels and the FSDP hooks.
 *
 * Under mixed precision the model computes in the units' compute dtype (param_dtype), as a
 * PyTorch module under FSDP's MixedPrecision does: the input is cast to it at the root
 * (cast_root_forward_inputs), weights, activations and their gradients are in it, GEMMs sum in
 * f32 and round their output once (a Linear's bias is added before that rounding, as addmm
 * does, and its ReLU rounds nothing more: the epilogue of kernel.h), element-wise kernels
 * compute in f32 and round on store. The
 * target stays f32 and the loss is f32; its gradient is rounded to the compute dtype, and the
 * weight gradients are written in it (FSDP casts them to reduce_dtype). */
#include <fsdp/log.h>
#include <fsdp/nn.h>

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/nn_int.h"

struct fsdp_mlp {
    fsdp_t *fs;
    int nlayers;
    int dims[FSDP_MLP_MAX_LAYERS + 1];
    float loss_scale;
    fsdp_phase_func_t phase_fn;
    void *phase_arg;
    fsdp_unit_t *root;
    fsdp_unit_t *layers[FSDP_MLP_MAX_LAYERS];
};

void fsdp_mlp_set_phase_hook(fsdp_mlp_t *mlp, fsdp_phase_func_t func, void *arg)
{
    mlp->phase_fn = func;
    mlp->phase_arg = arg;
}

static void phase(fsdp_mlp_t *mlp, fsdp_phase_t p)
{
    if (mlp->phase_fn != NULL)
        mlp->phase_fn(p, mlp->phase_arg);
}

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

uint64_t fsdp_mlp_num_params(const int *dims, int nlayers)
{
    uint64_t n = 0;

    for (int i = 0; i < nlayers; i++)
        n += ((uint64_t)dims[i] + 1) * (uint64_t)dims[i + 1];
    return n;
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
    fsdp_dtype_t dt;                    /* compute dtype of activations and their gradients */
    void *act[FSDP_MLP_MAX_LAYERS + 1]; /* act[0] = x; act[i+1] = output of layer i */
    /* FSDP2's MixedPrecisionPolicy: the dtype layer i's input arrived in before its
     * pre-forward cast it to dt, and the dtype its output left in after its post-forward; the
     * root's output before its own cast (dt where nothing was cast) */
    fsdp_dtype_t in_dt[FSDP_MLP_MAX_LAYERS], root_out_dt;
} mlp_run_t;

static fsdp_status_t kernel(mlp_run_t *r, const fsdp_kernel_t *k)
{
    return fsdp_dev_kernel(r->dev, r->c, k);
}

static fsdp_status_t linear_forward(mlp_run_t *r, int i)
{
    fsdp_unit_t *u = r->mlp->layers[i];
    size_t in = (size_t)r->mlp->dims[i], out = (size_t)r->mlp->dims[i + 1];
    const void *w = fsdp_unit_param(u, 0), *b = fsdp_unit_param(u, 1);
    fsdp_kernel_t k = {.kind = FSDP_K_GEMM};

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
    k.u.gemm.a_dtype = k.u.gemm.b_dtype = k.u.gemm.c_dtype = r->dt;
    /* nn.Linear's addmm, then the ReLU module (not after the last layer) */
    k.u.gemm.epilogue.bias = b;
    k.u.gemm.epilogue.bias_dtype = r->dt;
    k.u.gemm.epilogue.act = i < r->mlp->nlayers - 1 ? FSDP_ACT_RELU : FSDP_ACT_NONE;
    return fsdp_nn_gemm(r->dev, r->c, &k);
}

/* dy: gradient of layer i's output [B, out]; dx (NULL for the first layer) receives the
 * gradient of its input [B, in], already passed back through the previous ReLU. */
static fsdp_status_t linear_backward(mlp_run_t *r, int i, const void *dy, void *dx)
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
    k.u.gemm.a_dtype = k.u.gemm.b_dtype = k.u.gemm.c_dtype = r->dt;
    k.u.gemm.epilogue.accumulate = 1; /* autograd: the new gradient rounded, then the sum */
    status = kernel(r, &k);
    if (status != FSDP_OK)
        return status;
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_BIAS_GRAD;
    k.u.bias_grad.dbias = db;
    k.u.bias_grad.dy = dy;
    k.u.bias_grad.rows = r->batch;
    k.u.bias_grad.cols = out;
    k.u.bias_grad.dbias_dtype = k.u.bias_grad.dy_dtype = r->dt;
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
    k.u.gemm.a_dtype = k.u.gemm.b_dtype = k.u.gemm.c_dtype = r->dt;
    status = kernel(r, &k);
    if (status != FSDP_OK)
        return status;
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_RELU_BWD;
    k.u.relu_bwd.dx = dx;
    k.u.relu_bwd.dy = dx;
    k.u.relu_bwd.y = r->act[i];
    k.u.relu_bwd.n = r->batch * in;
    k.u.relu_bwd.dx_dtype = k.u.relu_bwd.dy_dtype = k.u.relu_bwd.y_dtype = r->dt;
    return kernel(r, &k);
}

/* An activation (or activation gradient) of numel elements of the compute dtype. */
static fsdp_status_t alloc_act(mlp_run_t *r, size_t numel, void **p)
{
    return fsdp_mem_alloc(r->mem, numel * fsdp_dtype_size(r->dt), FSDP_MEM_ACTIVATION, r->c, p);
}

/* The compute dtype every layer shares (one config, one param_dtype); an error if they differ,
 * which would need casts between units that this model does not make. */
static fsdp_status_t compute_dtype(fsdp_mlp_t *mlp, fsdp_dtype_t *dt_p)
{
    fsdp_dtype_t dt = fsdp_unit_compute_dtype(mlp->layers[0]);

    for (int i = 1; i < mlp->nlayers; i++) {
        if (fsdp_unit_compute_dtype(mlp->layers[i]) != dt) {
            fsdp_error("mlp: layer %d computes in %s, layer 0 in %s; all layers need one dtype", i,
                       fsdp_dtype_name(fsdp_unit_compute_dtype(mlp->layers[i])),
                       fsdp_dtype_name(dt));
            return FSDP_ERR_UNSUPPORTED;
        }
    }
    *dt_p = dt;
    return FSDP_OK;
}

/* A unit's boundary (docs/runtime.md section 6): the runtime's cast of the input, then the
 * model's own when the input is still not of the compute dtype (FSDP1's
 * cast_root_forward_inputs, or FSDP2 without cast_forward_inputs). *a becomes the unit's
 * input; the tensor it was stays the caller's. */
static fsdp_status_t enter(mlp_run_t *r, fsdp_unit_t *u, fsdp_act_t *a)
{
    fsdp_status_t status = fsdp_pre_forward_io(u, a, 1);

    if (status == FSDP_OK)
        status = fsdp_act_cast(r->mlp->fs, a, r->dt, FSDP_MEM_ACTIVATION);
    return status;
}

/* A gradient *g of a tensor that a cast made from one of dtype `to`: the cast's backward, into a
 * new block; the old one is freed. */
static fsdp_status_t cast_back(mlp_run_t *r, fsdp_act_t *g, fsdp_dtype_t to)
{
    void *old = g->data;
    fsdp_status_t status = fsdp_act_cast(r->mlp->fs, g, to, FSDP_MEM_ACTIVATION);

    if (status == FSDP_OK && g->data != old)
        fsdp_mem_free(r->mem, old);
    return status;
}

/* Layer i's forward: its input (act[i], arrived as *cur) cast at the pre-forward, its output
 * act[i + 1] cast at the post-forward; *cur becomes the output as the layer hands it on. */
static fsdp_status_t layer_forward(mlp_run_t *r, int i, fsdp_act_t *cur)
{
    fsdp_mlp_t *mlp = r->mlp;
    fsdp_act_t in = *cur, out;
    fsdp_status_t status;

    status = alloc_act(r, r->batch * (size_t)mlp->dims[i + 1], &r->act[i + 1]);
    if (status == FSDP_OK)
        status = enter(r, mlp->layers[i], &in);
    if (status != FSDP_OK)
        return status;
    /* the layer saves the cast input for its backward; the caller's copy lives until the
     * layer returns */
    r->in_dt[i] = cur->dtype;
    r->act[i] = in.data;
    status = linear_forward(r, i);
    out = (fsdp_act_t){r->act[i + 1], r->dt, r->batch * (size_t)mlp->dims[i + 1]};
    if (status == FSDP_OK)
        status = fsdp_post_forward_io(mlp->layers[i], &out, 1);
    if (in.data != cur->data)
        fsdp_mem_free(r->mem, cur->data);
    if (out.data != r->act[i + 1]) { /* nothing saved the output before its cast */
        fsdp_mem_free(r->mem, r->act[i + 1]);
        r->act[i + 1] = out.data;
    }
    *cur = out;
    return status;
}

fsdp_status_t fsdp_mlp_forward_backward(fsdp_mlp_t *mlp, const float *x, const float *y,
                                        size_t batch, float *loss_p)
{
    fsdp_t *fs = mlp->fs;
    mlp_run_t run = {.mlp = mlp, .dev = fsdp_device(fs), .c = fsdp_compute_stream(fs),
                     .mem = fsdp_memory(fs), .batch = batch};
    int L = mlp->nlayers;
    size_t in_numel = batch * (size_t)mlp->dims[0], out_numel = batch * (size_t)mlp->dims[L];
    void *x32 = NULL, *target = NULL, *dy = NULL, *dx = NULL;
    float *loss = NULL;
    fsdp_kernel_t k = {.kind = FSDP_K_MSE_LOSS};
    fsdp_act_t cur, g;
    fsdp_status_t status;
    float host_loss = 0.0f;

    if (batch == 0) {
        fsdp_error("an mlp step needs at least one row of data on every rank");
        return FSDP_ERR_INVALID_PARAM;
    }
    status = compute_dtype(mlp, &run.dt);
    if (status != FSDP_OK)
        return status;
    phase(mlp, FSDP_PHASE_FORWARD);
    /* inputs and targets move to the device on the compute stream (A.4); in f32 the input is
     * act[0] itself, else an f32 copy that the root casts */
    status = fsdp_mem_alloc(run.mem, in_numel * sizeof(float), FSDP_MEM_ACTIVATION, run.c, &x32);
    if (status == FSDP_OK)
        status = fsdp_dev_memcpy_async(run.dev, x32, x, in_numel * sizeof(float), run.c);
    if (status == FSDP_OK)
        status =
            fsdp_mem_alloc(run.mem, out_numel * sizeof(float), FSDP_MEM_ACTIVATION, run.c, &target);
    if (status == FSDP_OK)
        status = fsdp_dev_memcpy_async(run.dev, target, y, out_numel * sizeof(float), run.c);
    if (status != FSDP_OK)
        goto out;

    /* forward; the root casts the input to the compute dtype (A.4) */
    cur = (fsdp_act_t){x32, FSDP_DTYPE_F32, in_numel};
    status = enter(&run, mlp->root, &cur);
    run.act[0] = cur.data;
    if (cur.data != x32)
        fsdp_mem_free(run.mem, x32);
    x32 = NULL;
    for (int i = 0; i < L && status == FSDP_OK; i++)
        status = layer_forward(&run, i, &cur);
    run.root_out_dt = cur.dtype;
    if (status == FSDP_OK)
        status = fsdp_post_forward_io(mlp->root, &cur, 1);
    if (status == FSDP_OK && cur.data != run.act[L]) {
        fsdp_mem_free(run.mem, run.act[L]);
        run.act[L] = cur.data;
    }

    /* loss: mean over this rank's rows and outputs */
    if (status == FSDP_OK)
        status = fsdp_mem_alloc(run.mem, sizeof(float), FSDP_MEM_TEMPORARY, run.c,
                                (void **)&loss);
    if (status == FSDP_OK)
        status = fsdp_mem_alloc(run.mem, out_numel * fsdp_dtype_size(cur.dtype),
                                FSDP_MEM_ACTIVATION, run.c, &dy);
    if (status != FSDP_OK)
        goto out;
    k.u.mse.loss = loss;
    k.u.mse.dy = dy;
    k.u.mse.y = run.act[L];
    k.u.mse.t = target;
    k.u.mse.n = out_numel;
    k.u.mse.y_dtype = k.u.mse.dy_dtype = cur.dtype; /* the target and the loss stay f32 */
    k.u.mse.t_dtype = FSDP_DTYPE_F32;
    /* the scale divides the denominator: loss and gradient both carry it */
    k.u.mse.denom = (double)out_numel / (double)mlp->loss_scale;
    status = kernel(&run, &k);

    /* backward: the root's gradient arrives first, then the units in reverse */
    if (status == FSDP_OK)
        phase(mlp, FSDP_PHASE_BACKWARD);
    /* the backward of a cast comes before the hook on the tensor it cast, and after the
     * post-backward of the unit whose input it cast (semantics 2 C.2, B.4) */
    g = (fsdp_act_t){dy, cur.dtype, out_numel};
    if (status == FSDP_OK)
        status = cast_back(&run, &g, run.root_out_dt);
    if (status == FSDP_OK)
        status = fsdp_pre_backward(mlp->root);
    for (int i = L - 1; i >= 0 && status == FSDP_OK; i--) {
        status = cast_back(&run, &g, run.dt); /* the output's cast */
        dy = g.data;
        if (i > 0 && status == FSDP_OK)
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
        g = (fsdp_act_t){dy, run.dt, batch * (size_t)mlp->dims[i]};
        if (i > 0 && status == FSDP_OK) /* the input's cast, from in_dt[i] */
            status = cast_back(&run, &g, run.in_dt[i]);
        dy = g.data;
    }
    if (status == FSDP_OK)
        status = fsdp_post_backward(mlp->root);
    if (status == FSDP_OK)
        status = fsdp_final_callback(fs);
    if (status == FSDP_OK)
        status = fsdp_dev_memcpy_async(run.dev, &host_loss, loss, sizeof(float), run.c);
    if (status == FSDP_OK)
        status = fsdp_dev_stream_synchronize(run.dev, run.c);
    if (status == FSDP_OK)
        *loss_p = host_loss / mlp->loss_scale;
out:
    fsdp_mem_free(run.mem, x32);
    fsdp_mem_free(run.mem, dx);
    fsdp_mem_free(run.mem, dy);
    fsdp_mem_free(run.mem, loss);
    fsdp_mem_free(run.mem, target);
    for (int i = 0; i <= L; i++)
        fsdp_mem_free(run.mem, run.act[i]);
    return status;
}
