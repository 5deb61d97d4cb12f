/* A model of your own, trained with FSDP on simulated ranks through the public API alone.
 *
 * The model is y = W2 relu(W1 x + b1) + b2, fit to a fixed linear map by mean squared error.
 * Each Linear is an FSDP unit ("fc1", "fc2") under a root ("model") that owns no parameters,
 * as fsdp_auto_wrap would wrap a two-Linear module. There is no autograd in C, so the program
 * calls the hooks around its own forward and backward (docs/api.md draws their order), launches
 * its kernels on the compute stream, and steps AdamW on the sharded parameters.
 *
 * Build against an installed libfsdp:
 *     cc own_model.c $(pkg-config --cflags --libs libfsdp) -o own_model
 * Run: ./own_model [world] [steps]      (default 4 ranks, 60 steps)
 */
#include <fsdp/fsdp.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { IN = 8, HIDDEN = 32, OUT = 4, ROWS = 16 /* per rank and step */ };

typedef struct job {
    int steps;
    fsdp_api_t api; /* FSDP1 (FullyShardedDataParallel) or FSDP2 (fully_shard): the same hooks */
    float first_loss, last_loss; /* rank 0's, averaged over the ranks */
} job_t;

typedef struct model {
    fsdp_t *fs;
    fsdp_unit_t *root, *fc1, *fc2;
} model_t;

/* The units and their parameters, nn.Linear's layout ([out, in] weight, [out] bias). */
static fsdp_status_t model_create(fsdp_t *fs, model_t *m)
{
    fsdp_param_spec_t fc1[2] = {
        {.name = "fc1.weight", .ndim = 2, .shape = {HIDDEN, IN}, .requires_grad = 1, .tied_to = -1},
        {.name = "fc1.bias", .ndim = 1, .shape = {HIDDEN}, .requires_grad = 1, .tied_to = -1}};
    fsdp_param_spec_t fc2[2] = {
        {.name = "fc2.weight",
         .ndim = 2,
         .shape = {OUT, HIDDEN},
         .requires_grad = 1,
         .tied_to = -1},
        {.name = "fc2.bias", .ndim = 1, .shape = {OUT}, .requires_grad = 1, .tied_to = -1}};
    fsdp_status_t status;

    m->fs = fs;
    status = fsdp_unit_create(fs, "model", NULL, NULL, 0, &m->root);
    if (status == FSDP_OK)
        status = fsdp_unit_create(fs, "fc1", m->root, fc1, 2, &m->fc1);
    if (status == FSDP_OK)
        status = fsdp_unit_create(fs, "fc2", m->root, fc2, 2, &m->fc2);
    return status;
}

/* Every rank sets the same full values; each keeps the part in its shard. */
static fsdp_status_t model_init(model_t *m)
{
    fsdp_unit_t *units[2] = {m->fc1, m->fc2};
    float buf[HIDDEN * IN];
    fsdp_rng_t rng;
    fsdp_status_t status = FSDP_OK;

    fsdp_rng_seed(&rng, 1234);
    for (int u = 0; u < 2 && status == FSDP_OK; u++) {
        for (int p = 0; p < 2 && status == FSDP_OK; p++) {
            fsdp_param_info_t info;

            status = fsdp_unit_param_info(units[u], p, &info);
            for (size_t i = 0; status == FSDP_OK && i < info.numel; i++)
                buf[i] = fsdp_rng_uniform(&rng, -0.3f, 0.3f);
            if (status == FSDP_OK)
                status = fsdp_unit_set_param(units[u], p, buf);
        }
    }
    return status;
}

/* y[rows, out] = x[rows, in] @ W^T + b, then relu when asked: one kernel with an epilogue. */
static fsdp_status_t linear_forward(fsdp_dev_t *dev, fsdp_stream_t *s, fsdp_unit_t *u,
                                    const float *x, float *y, size_t in, size_t out, int relu)
{
    fsdp_kernel_t k = {.kind = FSDP_K_GEMM};

    k.u.gemm.trans_b = 1;
    k.u.gemm.m = ROWS;
    k.u.gemm.n = out;
    k.u.gemm.k = in;
    k.u.gemm.alpha = 1.0f;
    k.u.gemm.a = x;
    k.u.gemm.lda = in;
    k.u.gemm.b = fsdp_unit_param(u, 0); /* valid between the unit's pre- and post-hook */
    k.u.gemm.ldb = in;
    k.u.gemm.c = y;
    k.u.gemm.ldc = out;
    k.u.gemm.epilogue.bias = fsdp_unit_param(u, 1);
    k.u.gemm.epilogue.act = relu ? FSDP_ACT_RELU : FSDP_ACT_NONE;
    return fsdp_dev_kernel(dev, s, &k);
}

/* Given dy [rows, out]: dW += dy^T x, db += column sums of dy, and dx = dy @ W (when dx is not
 * NULL), passed back through the relu whose output x was. */
static fsdp_status_t linear_backward(fsdp_dev_t *dev, fsdp_stream_t *s, fsdp_unit_t *u,
                                     const float *x, const float *dy, float *dx, size_t in,
                                     size_t out)
{
    fsdp_kernel_t k = {.kind = FSDP_K_GEMM};
    void *dw, *db;
    fsdp_status_t status;

    status = fsdp_unit_grad(u, 0, &dw);
    if (status == FSDP_OK)
        status = fsdp_unit_grad(u, 1, &db);
    if (status != FSDP_OK)
        return status;
    k.u.gemm.trans_a = 1;
    k.u.gemm.m = out;
    k.u.gemm.n = in;
    k.u.gemm.k = ROWS;
    k.u.gemm.alpha = 1.0f;
    k.u.gemm.a = dy;
    k.u.gemm.lda = out;
    k.u.gemm.b = x;
    k.u.gemm.ldb = in;
    k.u.gemm.beta = 1.0f; /* gradients accumulate, as autograd's */
    k.u.gemm.c = dw;
    k.u.gemm.ldc = in;
    status = fsdp_dev_kernel(dev, s, &k);
    if (status != FSDP_OK)
        return status;
    k = (fsdp_kernel_t){.kind = FSDP_K_BIAS_GRAD};
    k.u.bias_grad.dbias = db;
    k.u.bias_grad.dy = dy;
    k.u.bias_grad.rows = ROWS;
    k.u.bias_grad.cols = out;
    status = fsdp_dev_kernel(dev, s, &k);
    if (status != FSDP_OK || dx == NULL)
        return status;
    k = (fsdp_kernel_t){.kind = FSDP_K_GEMM};
    k.u.gemm.m = ROWS;
    k.u.gemm.n = in;
    k.u.gemm.k = out;
    k.u.gemm.alpha = 1.0f;
    k.u.gemm.a = dy;
    k.u.gemm.lda = out;
    k.u.gemm.b = fsdp_unit_param(u, 0);
    k.u.gemm.ldb = in;
    k.u.gemm.c = dx;
    k.u.gemm.ldc = in;
    status = fsdp_dev_kernel(dev, s, &k);
    if (status != FSDP_OK)
        return status;
    k = (fsdp_kernel_t){.kind = FSDP_K_RELU_BWD};
    k.u.relu_bwd.dx = dx;
    k.u.relu_bwd.dy = dx;
    k.u.relu_bwd.y = x;
    k.u.relu_bwd.n = ROWS * in;
    return fsdp_dev_kernel(dev, s, &k);
}

/* This rank's rows of a step: x uniform, y = a fixed linear map of x (what the model learns). */
static void make_batch(int rank, int step, float *x, float *y)
{
    fsdp_rng_t rng;

    fsdp_rng_seed(&rng, (uint64_t)step * 1000 + (uint64_t)rank);
    for (int r = 0; r < ROWS; r++) {
        for (int i = 0; i < IN; i++)
            x[r * IN + i] = fsdp_rng_uniform(&rng, -1.0f, 1.0f);
        for (int o = 0; o < OUT; o++) {
            float sum = 0.0f;
            for (int i = 0; i < IN; i++)
                sum += x[r * IN + i] * (float)((o + 2 * i) % 5 - 2) * 0.25f;
            y[r * OUT + o] = sum;
        }
    }
}

/* One forward and backward. Device buffers come from the rank's caching allocator; on the sim
 * in data mode they are host memory, but the program still moves data with memcpy_async, so
 * the same code runs on the gpu backend. */
static fsdp_status_t train_step(fsdp_dev_t *dev, model_t *m, const float *hx, const float *hy,
                                float *loss_p)
{
    fsdp_stream_t *s = fsdp_compute_stream(m->fs);
    fsdp_mem_t *mem = fsdp_memory(m->fs);
    float *x = NULL, *t = NULL, *h = NULL, *y = NULL, *dy = NULL, *dh = NULL, *loss = NULL;
    fsdp_kernel_t k = {.kind = FSDP_K_MSE_LOSS};
    fsdp_status_t status;

#define ALLOC(p, n, cat)                                                                           \
    if (status == FSDP_OK)                                                                         \
    status = fsdp_mem_alloc(mem, (n) * sizeof(float), cat, s, (void **)&(p))
    status = FSDP_OK;
    ALLOC(x, ROWS * IN, FSDP_MEM_ACTIVATION);
    ALLOC(t, ROWS * OUT, FSDP_MEM_ACTIVATION);
    ALLOC(h, ROWS * HIDDEN, FSDP_MEM_ACTIVATION);
    ALLOC(y, ROWS * OUT, FSDP_MEM_ACTIVATION);
    ALLOC(dy, ROWS * OUT, FSDP_MEM_ACTIVATION);
    ALLOC(dh, ROWS * HIDDEN, FSDP_MEM_ACTIVATION);
    ALLOC(loss, 1, FSDP_MEM_TEMPORARY);
#undef ALLOC
    if (status == FSDP_OK)
        status = fsdp_dev_memcpy_async(dev, x, hx, ROWS * IN * sizeof(float), s);
    if (status == FSDP_OK)
        status = fsdp_dev_memcpy_async(dev, t, hy, ROWS * OUT * sizeof(float), s);

    /* forward: the children's hooks nest inside the root's */
    if (status == FSDP_OK)
        status = fsdp_pre_forward(m->root); /* lazy init on the first step */
    if (status == FSDP_OK)
        status = fsdp_pre_forward(m->fc1); /* all-gathers fc1's parameters */
    if (status == FSDP_OK)
        status = linear_forward(dev, s, m->fc1, x, h, IN, HIDDEN, 1);
    if (status == FSDP_OK)
        status = fsdp_post_forward(m->fc1); /* frees them again (FULL_SHARD) */
    if (status == FSDP_OK)
        status = fsdp_pre_forward(m->fc2);
    if (status == FSDP_OK)
        status = linear_forward(dev, s, m->fc2, h, y, HIDDEN, OUT, 0);
    if (status == FSDP_OK)
        status = fsdp_post_forward(m->fc2);
    if (status == FSDP_OK)
        status = fsdp_post_forward(m->root);

    /* the loss and its gradient, then backward: the root first, the units in reverse */
    k.u.mse.loss = loss;
    k.u.mse.dy = dy;
    k.u.mse.y = y;
    k.u.mse.t = t;
    k.u.mse.n = ROWS * OUT;
    k.u.mse.denom = ROWS * OUT;
    if (status == FSDP_OK)
        status = fsdp_dev_kernel(dev, s, &k);
    if (status == FSDP_OK)
        status = fsdp_pre_backward(m->root);
    if (status == FSDP_OK)
        status = fsdp_pre_backward(m->fc2); /* all-gathers again, prefetches fc1 */
    if (status == FSDP_OK)
        status = linear_backward(dev, s, m->fc2, h, dy, dh, HIDDEN, OUT);
    if (status == FSDP_OK)
        status = fsdp_post_backward(m->fc2); /* reduce-scatters fc2's gradient */
    if (status == FSDP_OK)
        status = fsdp_pre_backward(m->fc1);
    if (status == FSDP_OK)
        status = linear_backward(dev, s, m->fc1, x, dh, NULL, IN, HIDDEN);
    if (status == FSDP_OK)
        status = fsdp_post_backward(m->fc1);
    if (status == FSDP_OK)
        status = fsdp_post_backward(m->root);
    if (status == FSDP_OK)
        status = fsdp_final_callback(m->fs); /* sharded gradients ready */

    /* the mean loss over the ranks, back to the host */
    if (status == FSDP_OK)
        status = fsdp_dev_all_reduce(dev, fsdp_dev_group_world(dev), loss, loss, 1, FSDP_DTYPE_F32,
                                     FSDP_REDUCE_AVG, s);
    if (status == FSDP_OK)
        status = fsdp_dev_memcpy_async(dev, loss_p, loss, sizeof(float), s);
    if (status == FSDP_OK)
        status = fsdp_dev_stream_synchronize(dev, s);
    fsdp_mem_free(mem, loss);
    fsdp_mem_free(mem, dh);
    fsdp_mem_free(mem, dy);
    fsdp_mem_free(mem, y);
    fsdp_mem_free(mem, h);
    fsdp_mem_free(mem, t);
    fsdp_mem_free(mem, x);
    return status;
}

/* What every rank runs, on its own thread. */
static fsdp_status_t rank_main(fsdp_dev_t *dev, void *arg)
{
    job_t *job = arg;
    fsdp_config_t cfg;
    fsdp_optim_config_t ocfg;
    fsdp_optim_t *opt = NULL;
    model_t m = {0};
    fsdp_t *fs = NULL;
    float hx[ROWS * IN], hy[ROWS * OUT], loss = 0.0f;
    fsdp_status_t status;

    fsdp_config_init(&cfg); /* FULL_SHARD, BACKWARD_PRE prefetch, the rate limiter on */
    cfg.api = job->api;
    status = fsdp_create(dev, &cfg, &fs);
    if (status != FSDP_OK)
        return status;
    status = model_create(fs, &m);
    if (status == FSDP_OK)
        status = model_init(&m);
    fsdp_optim_config_init(&ocfg, FSDP_OPTIM_ADAMW);
    ocfg.lr = 1e-2f;
    if (status == FSDP_OK)
        status = fsdp_optim_create(fs, &ocfg, &opt);
    for (int step = 0; step < job->steps && status == FSDP_OK; step++) {
        make_batch(dev->rank, step, hx, hy);
        status = train_step(dev, &m, hx, hy, &loss);
        if (status == FSDP_OK)
            status = fsdp_optim_step(opt);
        fsdp_zero_grad(fs);
        if (status == FSDP_OK && dev->rank == 0) {
            if (step == 0)
                job->first_loss = loss;
            job->last_loss = loss;
            if (step % 10 == 0 || step == job->steps - 1)
                printf("step %d loss %.6f\n", step + 1, loss);
        }
    }
    if (status != FSDP_OK)
        fprintf(stderr, "rank %d: %s: %s\n", dev->rank, fsdp_status_string(status),
                fsdp_last_error(fs));
    fsdp_optim_destroy(opt);
    fsdp_destroy(fs);
    return status;
}

int main(int argc, char **argv)
{
    fsdp_sim_params_t params;
    job_t job = {.steps = argc > 2 ? atoi(argv[2]) : 60, .api = FSDP_API_FSDP1};
    fsdp_status_t status;

    fsdp_sim_params_init(&params);
    params.world_size = argc > 1 ? atoi(argv[1]) : 4;
    if (argc > 3 && strcmp(argv[3], "fsdp2") == 0)
        job.api = FSDP_API_FSDP2;
    if (params.world_size < 1 || job.steps < 1 ||
        (argc > 3 && strcmp(argv[3], "fsdp1") != 0 && strcmp(argv[3], "fsdp2") != 0)) {
        fprintf(stderr, "usage: %s [world >= 1] [steps >= 1] [fsdp1|fsdp2]\n", argv[0]);
        return 2;
    }
    status = fsdp_sim_launch(&params, rank_main, &job, NULL);
    if (status != FSDP_OK) {
        fprintf(stderr, "own_model: %s\n", fsdp_status_string(status));
        return 1;
    }
    printf("loss %.4f -> %.4f over %d steps on %d simulated ranks\n", job.first_loss, job.last_loss,
           job.steps, params.world_size);
    /* the loss must fall: the exit status says whether it learned */
    return job.last_loss < 0.5f * job.first_loss ? 0 : 1;
}
