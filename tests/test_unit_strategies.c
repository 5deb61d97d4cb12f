/* Per-unit sharding strategies: NO_SHARD, FULL_SHARD, HYBRID_SHARD and SHARD_GRAD_OP units in
 * one model train as the closed-form reference says, each with its own collectives; bad unit
 * options are refused. */
#include <fsdp/fsdp.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core_hidden.h"
#include "runtime_test.h"

/* A model of four units, each parameter w with loss 0.5 |w - t_r|^2 on rank r: the averaged
 * gradient is w - mean_r t_r, so SGD has a closed-form reference. The root is NO_SHARD, its
 * children FULL_SHARD, HYBRID_SHARD and SHARD_GRAD_OP; flat sizes give distinct shard sizes. */
#define MX_WORLD 4
#define MX_UNITS 4
#define MX_STEPS 4
#define MX_LR 0.3f

static const int mx_numel[MX_UNITS] = {6, 10, 9, 26};
static const fsdp_strategy_t mx_strategy[MX_UNITS] = {FSDP_NO_SHARD, FSDP_FULL_SHARD,
                                                      FSDP_HYBRID_SHARD, FSDP_SHARD_GRAD_OP};
static const char *const mx_names[MX_UNITS] = {"root", "full", "hybrid", "zero2"};

typedef struct mx_ctx {
    fsdp_strategy_t config_strategy;
    float final[MX_UNITS][32];
    float init[MX_UNITS][32];
    coll_t log[MX_WORLD][MAX_LOG]; /* the last iteration's collectives */
    int nlog[MX_WORLD];
    fsdp_strategy_t effective[MX_WORLD][MX_UNITS];
    int shard_group_size[MX_WORLD][MX_UNITS], replicate_size[MX_WORLD][MX_UNITS];
} mx_ctx_t;

static float mx_target(int r, int u, int i)
{
    return sinf((float)(i + 3 * u + 7 * r));
}

static float mx_init(int u, int i)
{
    return cosf((float)(i + 5 * u)) * 0.5f;
}

/* The gradient of unit k: w - t_r, read from the unsharded parameter. */
static fsdp_status_t mx_backward(fsdp_unit_t *unit, int k, int r)
{
    void *g;
    const float *w = fsdp_unit_param(unit, 0);
    fsdp_status_t status;

    if (w == NULL)
        return FSDP_ERR_STATE;
    status = fsdp_unit_grad(unit, 0, &g);
    for (int i = 0; i < mx_numel[k] && status == FSDP_OK; i++)
        ((float *)g)[i] = w[i] - mx_target(r, k, i);
    return status;
}

static fsdp_status_t mx_rank(fsdp_dev_t *dev, void *arg)
{
    mx_ctx_t *mc = arg;
    fsdp_backend_ops_t wrapped;
    fsdp_unit_t *units[MX_UNITS];
    fsdp_optim_config_t oc;
    fsdp_optim_t *opt = NULL;
    fsdp_config_t fc;
    fsdp_t *fs;
    fsdp_status_t status;
    int r = dev->rank;

    wrap_ops(dev, &wrapped);
    fsdp_config_init(&fc);
    fc.strategy = mc->config_strategy;
    fc.ranks_per_node = 2;
    status = fsdp_create(dev, &fc, &fs);
    if (status != FSDP_OK)
        return status;
    for (int k = 0; k < MX_UNITS && status == FSDP_OK; k++) {
        fsdp_param_spec_t spec = {
            .name = NULL, .ndim = 1, .shape = {mx_numel[k]}, .requires_grad = 1, .tied_to = -1};
        fsdp_unit_options_t uo;
        char pname[32];
        snprintf(pname, sizeof(pname), "%s.w", mx_names[k]);
        spec.name = pname;
        fsdp_unit_options_init(&uo);
        uo.strategy = mx_strategy[k];
        status =
            fsdp_unit_create_ex(fs, mx_names[k], k ? units[0] : NULL, &spec, 1, &uo, &units[k]);
        float v[32];
        for (int i = 0; i < mx_numel[k]; i++)
            v[i] = mx_init(k, i);
        if (status == FSDP_OK)
            status = fsdp_unit_set_param(units[k], 0, v);
        if (r == 0)
            memcpy(mc->init[k], v, sizeof(float) * (size_t)mx_numel[k]);
        if (status == FSDP_OK) {
            mc->effective[r][k] = fsdp_unit_strategy(units[k]);
            mc->shard_group_size[r][k] = fsdp_unit_shard_group(units[k])->size;
            mc->replicate_size[r][k] =
                fsdp_unit_replicate_group(units[k]) ? fsdp_unit_replicate_group(units[k])->size : 0;
        }
    }
    fsdp_optim_config_init(&oc, FSDP_OPTIM_SGD);
    oc.lr = MX_LR;
    if (status == FSDP_OK)
        status = fsdp_optim_create(fs, &oc, &opt);
    for (int step = 0; step < MX_STEPS && status == FSDP_OK; step++) {
        tl_nlog = 0;
        status = fsdp_pre_forward(units[0]);
        for (int k = 1; k < MX_UNITS && status == FSDP_OK; k++) {
            status = fsdp_pre_forward(units[k]);
            if (status == FSDP_OK && fsdp_unit_param(units[k], 0) == NULL)
                status = FSDP_ERR_STATE;
            if (status == FSDP_OK)
                status = fsdp_post_forward(units[k]);
        }
        if (status == FSDP_OK)
            status = fsdp_post_forward(units[0]);
        if (status == FSDP_OK)
            status = fsdp_pre_backward(units[0]);
        for (int k = MX_UNITS - 1; k >= 1 && status == FSDP_OK; k--) {
            status = fsdp_pre_backward(units[k]);
            if (status == FSDP_OK)
                status = mx_backward(units[k], k, r);
            if (status == FSDP_OK)
                status = fsdp_post_backward(units[k]);
        }
        if (status == FSDP_OK)
            status = mx_backward(units[0], 0, r);
        if (status == FSDP_OK)
            status = fsdp_post_backward(units[0]);
        if (status == FSDP_OK)
            status = fsdp_final_callback(fs);
        if (status == FSDP_OK)
            status = fsdp_optim_step(opt);
        fsdp_zero_grad(fs);
    }
    memcpy(mc->log[r], tl_log, sizeof(coll_t) * (size_t)tl_nlog);
    mc->nlog[r] = tl_nlog;
    for (int k = 0; k < MX_UNITS && status == FSDP_OK; k++) {
        float full[32];
        status = fsdp_unit_gather_full(units[k], full);
        if (status == FSDP_OK && r == 0)
            memcpy(mc->final[k], full, sizeof(float) * (size_t)mx_numel[k]);
    }
    fsdp_optim_destroy(opt);
    fsdp_destroy(fs);
    return status;
}

static void check_mixed_model(fsdp_strategy_t config_strategy)
{
    mx_ctx_t *mc = calloc(1, sizeof(*mc));
    fsdp_sim_params_t p;
    double maxdiff = 0.0, moved = 0.0;

    fsdp_sim_params_init(&p);
    p.world_size = MX_WORLD;
    mc->config_strategy = config_strategy;
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_launch(&p, mx_rank, mc, NULL), FSDP_OK);
    /* reference: w <- w - lr (w - mean_r t_r), in double */
    for (int k = 0; k < MX_UNITS; k++) {
        for (int i = 0; i < mx_numel[k]; i++) {
            double w = mc->init[k][i], tbar = 0.0;
            for (int r = 0; r < MX_WORLD; r++)
                tbar += mx_target(r, k, i);
            tbar /= MX_WORLD;
            for (int s = 0; s < MX_STEPS; s++)
                w -= (double)MX_LR * (w - tbar);
            maxdiff = fmax(maxdiff, fabs(mc->final[k][i] - w));
            moved += fabs(mc->final[k][i] - mc->init[k][i]);
        }
    }
    CU_ASSERT(maxdiff <= 1e-6);
    CU_ASSERT(moved > 1.0);
    for (int r = 0; r < MX_WORLD; r++) {
        const coll_t *log = mc->log[r];
        int n = mc->nlog[r];
        int hybrid_rs = 0, inter_ar = 0;
        for (int k = 0; k < MX_UNITS; k++) {
            CU_ASSERT_EQUAL(mc->effective[r][k], mx_strategy[k]);
            CU_ASSERT_EQUAL(mc->shard_group_size[r][k], k == 2 ? 2 : MX_WORLD);
            CU_ASSERT_EQUAL(mc->replicate_size[r][k], k == 2 ? 2 : 0);
        }
        /* root, NO_SHARD: one all-reduce of its 6 elements over the world, no all-gather */
        CU_ASSERT_EQUAL(count_colls(log, n, C_AR, 6, 4), 1);
        CU_ASSERT_EQUAL(count_colls(log, n, C_AG, 6, 4), 0);
        /* FULL_SHARD, T = 10 over 4 ranks (S = 3): gathered in forward and in backward */
        CU_ASSERT_EQUAL(count_colls(log, n, C_AG, 3, 4), 2);
        CU_ASSERT_EQUAL(count_colls(log, n, C_RS, 3, 4), 1);
        /* HYBRID_SHARD, T = 9 over the 2 ranks of a node (S = 5), all-reduced across nodes */
        CU_ASSERT_EQUAL(count_colls(log, n, C_AG, 5, 2), 2);
        CU_ASSERT_EQUAL(count_colls(log, n, C_RS, 5, 2), 1);
        CU_ASSERT_EQUAL(count_colls(log, n, C_AR, 5, 2), 1);
        /* SHARD_GRAD_OP, T = 26 over 4 ranks (S = 7): gathered once, kept for backward */
        CU_ASSERT_EQUAL(count_colls(log, n, C_AG, 7, 4), 1);
        CU_ASSERT_EQUAL(count_colls(log, n, C_RS, 7, 4), 1);
        /* nothing else */
        CU_ASSERT_EQUAL(n, 1 + 3 + 4 + 2);
        /* as many inter-node all-reduces as reduce-scatters of hybrid handles */
        for (int i = 0; i < n; i++) {
            hybrid_rs += log[i].kind == C_RS && log[i].group_size == 2;
            inter_ar += log[i].kind == C_AR && log[i].group_size == 2;
        }
        CU_ASSERT_EQUAL(inter_ar, hybrid_rs);
    }
    free(mc);
}

/* A mixed model whatever the config's strategy is: every unit states its own. */
static void test_mixed_strategies(void)
{
    check_mixed_model(FSDP_FULL_SHARD);
    check_mixed_model(FSDP_HYBRID_SHARD);
    check_mixed_model(FSDP_NO_SHARD);
}

static fsdp_status_t bad_options_rank(fsdp_dev_t *dev, void *arg)
{
    fsdp_param_spec_t spec = {
        .name = "w", .ndim = 1, .shape = {4}, .requires_grad = 1, .tied_to = -1};
    fsdp_unit_options_t uo;
    fsdp_unit_t *u;
    fsdp_t *fs;
    int bad = 0;

    (void)arg;
    if (fsdp_create(dev, NULL, &fs) != FSDP_OK)
        return FSDP_ERR_INTERNAL;
    fsdp_unit_options_init(&uo);
    uo.strategy = (fsdp_strategy_t)42;
    bad += fsdp_unit_create_ex(fs, "root", NULL, &spec, 1, &uo, &u) == FSDP_ERR_INVALID_PARAM;
    bad += strstr(fsdp_last_error(fs), "full_shard") != NULL;
    fsdp_unit_options_init(&uo);
    uo.strategy = FSDP_FULL_SHARD;
    uo.replicate_group = fsdp_dev_group_world(dev);
    bad += fsdp_unit_create_ex(fs, "root", NULL, &spec, 1, &uo, &u) == FSDP_ERR_INVALID_PARAM;
    uo.strategy = FSDP_HYBRID_SHARD;
    bad += fsdp_unit_create_ex(fs, "root", NULL, &spec, 1, &uo, &u) == FSDP_ERR_INVALID_PARAM;
    bad += strstr(fsdp_last_error(fs), "both") != NULL;
    /* refused units leave no trace: a valid one is still the root */
    bad += fsdp_unit_create_ex(fs, "root", NULL, &spec, 1, NULL, &u) == FSDP_OK;
    bad += fsdp_num_units(fs) == 1;
    fsdp_destroy(fs);
    return bad == 7 ? FSDP_OK : FSDP_ERR_INTERNAL;
}

static void test_unit_options_refused(void)
{
    CU_ASSERT_EQUAL(run_ranks(2, bad_options_rank, NULL), FSDP_OK);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"mixed_strategies", test_mixed_strategies},
        {"unit_options_refused", test_unit_options_refused},
        {NULL, NULL},
    };
    return fsdp_test_run("unit strategies", tests);
}
