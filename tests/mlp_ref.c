/* The MLP of the runtime tests: its single-process reference and its FSDP run (mlp_ref.h). */
#include "mlp_ref.h"
#include "core/core_hidden.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const int dims[NL + 1] = {5, 7, 6, 3}; /* flat sizes 42, 48, 21: not multiples of W */

float xs[MAXB_ALL * 5], ys[MAXB_ALL * 3];
int ref_batch = MAXB;

/* ---------------- single-process reference, independent of the library ---------------- */

typedef struct ref_model {
    double *w[NL], *b[NL];
    double *mw[NL], *vw[NL], *mb[NL], *vb[NL]; /* AdamW moments or SGD momentum (m only) */
} ref_model_t;

void make_batch(void)
{
    fsdp_rng_t rng;
    fsdp_rng_seed(&rng, 1234);
    for (int i = 0; i < MAXB * dims[0]; i++)
        xs[i] = fsdp_rng_normal(&rng);
    for (int i = 0; i < MAXB * dims[NL]; i++)
        ys[i] = fsdp_rng_uniform(&rng, -1.0f, 1.0f);
    /* the rows past MAXB after them, so that the first MAXB stay what they always were */
    for (int i = MAXB * dims[0]; i < MAXB_ALL * dims[0]; i++)
        xs[i] = fsdp_rng_normal(&rng);
    for (int i = MAXB * dims[NL]; i < MAXB_ALL * dims[NL]; i++)
        ys[i] = fsdp_rng_uniform(&rng, -1.0f, 1.0f);
}

/* One forward and backward over the whole batch, in double. */
static void ref_grads(const ref_model_t *m, double *gw[NL], double *gb[NL])
{
    double *act[NL + 1], *dy, *dx;
    int B = ref_batch;

    act[0] = malloc(sizeof(double) * (size_t)(B * dims[0]));
    for (int i = 0; i < B * dims[0]; i++)
        act[0][i] = xs[i];
    for (int l = 0; l < NL; l++) {
        int in = dims[l], out = dims[l + 1];
        act[l + 1] = malloc(sizeof(double) * (size_t)(B * out));
        for (int r = 0; r < B; r++) {
            for (int o = 0; o < out; o++) {
                double s = m->b[l][o];
                for (int i = 0; i < in; i++)
                    s += act[l][r * in + i] * m->w[l][o * in + i];
                act[l + 1][r * out + o] = (l < NL - 1 && s < 0) ? 0.0 : s;
            }
        }
    }
    int out = dims[NL];
    dy = malloc(sizeof(double) * (size_t)(B * out));
    for (int i = 0; i < B * out; i++)
        dy[i] = 2.0 * (act[NL][i] - ys[i]) / (double)(B * out);
    for (int l = NL - 1; l >= 0; l--) {
        int in = dims[l], o2 = dims[l + 1];
        for (int o = 0; o < o2; o++) {
            gb[l][o] = 0;
            for (int r = 0; r < B; r++)
                gb[l][o] += dy[r * o2 + o];
            for (int i = 0; i < in; i++) {
                double s = 0;
                for (int r = 0; r < B; r++)
                    s += dy[r * o2 + o] * act[l][r * in + i];
                gw[l][o * in + i] = s;
            }
        }
        dx = malloc(sizeof(double) * (size_t)(B * in));
        for (int r = 0; r < B; r++) {
            for (int i = 0; i < in; i++) {
                double s = 0;
                for (int o = 0; o < o2; o++)
                    s += dy[r * o2 + o] * m->w[l][o * in + i];
                dx[r * in + i] = (l > 0 && act[l][r * in + i] <= 0) ? 0.0 : s;
            }
        }
        free(dy);
        dy = dx;
    }
    free(dy);
    for (int l = 0; l <= NL; l++)
        free(act[l]);
}

/* torch.optim.AdamW and torch.optim.SGD, written from their documented formulas. */
void ref_update(const fsdp_optim_config_t *o, int step, double *p, const double *g, double *m,
                double *v, int n, int decay)
{
    double wd = decay ? o->weight_decay : 0.0;
    for (int i = 0; i < n; i++) {
        if (o->kind == FSDP_OPTIM_ADAMW) {
            double bc1 = 1.0 - pow(o->beta1, step), bc2 = 1.0 - pow(o->beta2, step);
            p[i] *= 1.0 - o->lr * wd;
            m[i] = o->beta1 * m[i] + (1.0 - o->beta1) * g[i];
            v[i] = o->beta2 * v[i] + (1.0 - o->beta2) * g[i] * g[i];
            p[i] -= o->lr / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + o->eps);
        } else {
            double d = g[i] + wd * p[i];
            if (o->momentum != 0.0) {
                m[i] = step == 1 ? d : o->momentum * m[i] + (1.0 - o->dampening) * d;
                d = o->nesterov ? d + o->momentum * m[i] : m[i];
            }
            p[i] -= o->lr * d;
        }
    }
}

double ref_last_norm;

void ref_train(const run_cfg_t *cfg, const float *init, double *final_out)
{
    ref_model_t m;
    double *gw[NL], *gb[NL];
    size_t off = 0;

    for (int l = 0; l < NL; l++) {
        int nw = dims[l] * dims[l + 1], nb = dims[l + 1];
        m.w[l] = calloc((size_t)nw, sizeof(double));
        m.b[l] = calloc((size_t)nb, sizeof(double));
        m.mw[l] = calloc((size_t)nw, sizeof(double));
        m.vw[l] = calloc((size_t)nw, sizeof(double));
        m.mb[l] = calloc((size_t)nb, sizeof(double));
        m.vb[l] = calloc((size_t)nb, sizeof(double));
        gw[l] = calloc((size_t)nw, sizeof(double));
        gb[l] = calloc((size_t)nb, sizeof(double));
        for (int i = 0; i < nw; i++)
            m.w[l][i] = init[off++];
        for (int i = 0; i < nb; i++)
            m.b[l][i] = init[off++];
    }
    for (int step = 1; step <= cfg->steps; step++) {
        ref_grads(&m, gw, gb);
        if (cfg->clip_max > 0) {
            double total = 0;
            for (int l = 0; l < NL; l++) {
                for (int i = 0; i < dims[l] * dims[l + 1] + dims[l + 1]; i++) {
                    double g = fabs(i < dims[l] * dims[l + 1] ? gw[l][i]
                                                              : gb[l][i - dims[l] * dims[l + 1]]);
                    total = isinf(cfg->clip_type) ? fmax(total, g) : total + pow(g, cfg->clip_type);
                }
            }
            if (!isinf(cfg->clip_type))
                total = pow(total, 1.0 / cfg->clip_type);
            ref_last_norm = total;
            double coef = cfg->clip_max / (total + 1e-6);
            for (int l = 0; l < NL && coef < 1.0; l++) {
                for (int i = 0; i < dims[l] * dims[l + 1]; i++)
                    gw[l][i] *= coef;
                for (int i = 0; i < dims[l + 1]; i++)
                    gb[l][i] *= coef;
            }
        }
        for (int l = 0; l < NL; l++) {
            ref_update(&cfg->optim, step, m.w[l], gw[l], m.mw[l], m.vw[l], dims[l] * dims[l + 1],
                       1);
            ref_update(&cfg->optim, step, m.b[l], gb[l], m.mb[l], m.vb[l], dims[l + 1], 1);
        }
    }
    off = 0;
    for (int l = 0; l < NL; l++) {
        for (int i = 0; i < dims[l] * dims[l + 1]; i++)
            final_out[off++] = m.w[l][i];
        for (int i = 0; i < dims[l + 1]; i++)
            final_out[off++] = m.b[l][i];
        free(m.w[l]), free(m.b[l]), free(m.mw[l]), free(m.vw[l]), free(m.mb[l]), free(m.vb[l]);
        free(gw[l]), free(gb[l]);
    }
}

/* ---------------- FSDP runs, with collectives counted per rank ---------------- */

typedef struct run_ctx {
    const run_cfg_t *cfg;
    run_result_t *res;
} run_ctx_t;

fsdp_status_t gather_all(fsdp_mlp_t *mlp, float *out, size_t *total_p)
{
    size_t off = 0;
    for (int l = 0; l < NL; l++) {
        fsdp_unit_t *u = fsdp_mlp_layer(mlp, l);
        fsdp_status_t status = fsdp_unit_gather_full(u, out + off);
        if (status != FSDP_OK)
            return status;
        off += fsdp_unit_flat_numel(u);
    }
    *total_p = off;
    return FSDP_OK;
}

static fsdp_status_t fsdp_run_rank(fsdp_dev_t *dev, void *arg)
{
    run_ctx_t *ctx = arg;
    const run_cfg_t *cfg = ctx->cfg;
    fsdp_backend_ops_t wrapped;
    fsdp_config_t fc;
    fsdp_t *fs;
    fsdp_mlp_t *mlp = NULL;
    fsdp_optim_t *opt = NULL;
    size_t rows = (size_t)ref_batch / (size_t)cfg->world, total;
    float init[512];
    fsdp_status_t status;

    wrap_ops(dev, &wrapped);
    fsdp_config_init(&fc);
    fc.strategy = cfg->strategy;
    fc.backward_prefetch = cfg->prefetch;
    fc.ranks_per_node = cfg->ranks_per_node;
    fc.cpu_offload = cfg->cpu_offload;
    fc.forward_prefetch = cfg->forward_prefetch;
    fc.limit_all_gathers = !cfg->no_limiter;
    if (cfg->fsdp2) {
        fc.api = FSDP_API_FSDP2;
        fc.reshard_after_forward = cfg->raf_set ? cfg->raf : FSDP_RESHARD_DEFAULT;
        fc.explicit_forward_prefetch = cfg->explicit_fwd;
        fc.explicit_backward_prefetch = cfg->explicit_bwd;
    }
    status = fsdp_create(dev, &fc, &fs);
    if (status != FSDP_OK)
        return status;
    status = fsdp_mlp_create(fs, dims, NL, &mlp);
    if (status == FSDP_OK)
        status = fsdp_mlp_init_params(mlp, 7);
    if (status == FSDP_OK)
        status = gather_all(mlp, init, &total);
    if (status == FSDP_OK)
        status = fsdp_optim_create(fs, &cfg->optim, &opt);
    int micro = cfg->micro > 0 ? cfg->micro : 1;
    size_t mrows = rows / (size_t)micro;
    fsdp_mlp_set_loss_scale(mlp, 1.0f / (float)micro);
    for (int step = 0; step < cfg->steps && status == FSDP_OK; step++) {
        memset(&tl_counts, 0, sizeof(tl_counts));
        for (int k = 0; k < micro && status == FSDP_OK; k++) {
            size_t row0 = (size_t)dev->rank * rows + (size_t)k * mrows;
            float loss;
            status = fsdp_set_sync_gradients(fs, cfg->micro > 0 ? cfg->sync[k] : 1);
            if (status == FSDP_OK)
                status = fsdp_mlp_forward_backward(mlp, xs + row0 * (size_t)dims[0],
                                                   ys + row0 * (size_t)dims[NL], mrows, &loss);
        }
        if (status == FSDP_OK && cfg->clip_max > 0) {
            double norm;
            status = fsdp_clip_grad_norm(fs, cfg->clip_max, cfg->clip_type, &norm);
            if (dev->rank == 0)
                ctx->res->last_norm = norm;
        }
        if (status == FSDP_OK)
            status = fsdp_optim_step(opt);
        fsdp_zero_grad(fs);
    }
    counts_t all = tl_counts;
    float final_params[512];
    if (status == FSDP_OK)
        status = gather_all(mlp, final_params, &total);
    if (status == FSDP_OK && dev->rank == 0) {
        memcpy(ctx->res->final_params, final_params, sizeof(float) * total);
        memcpy(ctx->res->init, init, sizeof(float) * total);
        ctx->res->total = total;
        ctx->res->effective = fsdp_strategy(fs);
    }
    if (dev->rank < 8) {
        fsdp_mem_stats_t st;
        fsdp_mem_get_stats(fsdp_memory(fs), &st);
        ctx->res->bwd[dev->rank] = all;
        ctx->res->sharded_param_bytes[dev->rank] = st.by_category[FSDP_MEM_SHARDED_PARAM];
        ctx->res->pinned_bytes[dev->rank] = fsdp_host_pinned_bytes(fs);
    }
    fsdp_optim_destroy(opt);
    fsdp_mlp_destroy(mlp);
    fsdp_destroy(fs);
    return status;
}

void run_fsdp(const run_cfg_t *cfg, run_result_t *res)
{
    fsdp_sim_params_t p;
    run_ctx_t ctx = {cfg, res};
    fsdp_sim_params_init(&p);
    p.world_size = cfg->world;
    memset(res, 0, sizeof(*res));
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_launch(&p, fsdp_run_rank, &ctx, NULL), FSDP_OK);
}

double run_fsdp_against_ref(const run_cfg_t *cfg, run_result_t *res)
{
    double ref[512], maxdiff = 0.0;

    run_fsdp(cfg, res);
    ref_train(cfg, res->init, ref);
    for (size_t i = 0; i < res->total; i++)
        maxdiff = fmax(maxdiff, fabs((double)res->final_params[i] - ref[i]));
    return maxdiff;
}
