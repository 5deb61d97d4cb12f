/* Each rank's collectives per iteration equal PyTorch's (docs/runtime.md section 5), with a
 * parameter-less root and with a root that owns parameters; world size 1 is NO_SHARD. */
#include <fsdp/fsdp.h>
#include <stdlib.h>
#include <string.h>

#include "mlp_ref.h"

/* Per iteration, PyTorch's counts (docs/runtime.md section 5): with a parameter-less root, N
 * forward and N backward all-gathers for FULL_SHARD, none in backward for SHARD_GRAD_OP, N
 * reduce-scatters; NO_SHARD: N all-reduces and no all-gather. The MLP has N = 3 units with
 * parameters. */
static void test_collective_counts_mlp(void)
{
    make_batch();
    for (int w = 2; w <= 4; w += 2) {
        run_cfg_t cfg = {.world = w, .steps = 2, .prefetch = FSDP_BACKWARD_PREFETCH_PRE};
        run_result_t *res = calloc(1, sizeof(*res));
        fsdp_optim_config_init(&cfg.optim, FSDP_OPTIM_SGD);

        cfg.strategy = FSDP_FULL_SHARD;
        run_fsdp(&cfg, res);
        for (int r = 0; r < w; r++) {
            CU_ASSERT_EQUAL(res->bwd[r].all_gather, 2 * NL);
            CU_ASSERT_EQUAL(res->bwd[r].reduce_scatter, NL);
            CU_ASSERT_EQUAL(res->bwd[r].all_reduce, 0);
        }
        cfg.strategy = FSDP_SHARD_GRAD_OP;
        run_fsdp(&cfg, res);
        for (int r = 0; r < w; r++) {
            CU_ASSERT_EQUAL(res->bwd[r].all_gather, NL);
            CU_ASSERT_EQUAL(res->bwd[r].reduce_scatter, NL);
            CU_ASSERT_EQUAL(res->bwd[r].all_reduce, 0);
        }
        cfg.strategy = FSDP_NO_SHARD;
        run_fsdp(&cfg, res);
        for (int r = 0; r < w; r++) {
            CU_ASSERT_EQUAL(res->bwd[r].all_gather, 0);
            CU_ASSERT_EQUAL(res->bwd[r].reduce_scatter, 0);
            CU_ASSERT_EQUAL(res->bwd[r].all_reduce, NL);
        }
        free(res);
    }
}

/* World size 1 forces NO_SHARD, as PyTorch does. */
static void test_world_one_is_no_shard(void)
{
    run_cfg_t cfg = {.strategy = FSDP_FULL_SHARD, .world = 1, .steps = 1};
    run_result_t *res = calloc(1, sizeof(*res));
    make_batch();
    fsdp_optim_config_init(&cfg.optim, FSDP_OPTIM_SGD);
    run_fsdp(&cfg, res);
    CU_ASSERT_EQUAL(res->effective, FSDP_NO_SHARD);
    CU_ASSERT_EQUAL(res->bwd[0].all_gather, 0);
    free(res);
}

/* ---------------- a model whose root owns parameters ---------------- */

typedef struct phase_counts {
    counts_t fwd[4], bwd[4];
    fsdp_strategy_t strategy;
    fsdp_backward_prefetch_t prefetch;
} phase_counts_t;

/* root (params "scale" [8]) with two children of [16] and [5] elements; the "compute" just
 * touches parameters and writes gradients through the hook API. */
static fsdp_status_t root_model_rank(fsdp_dev_t *dev, void *arg)
{
    phase_counts_t *pc = arg;
    fsdp_backend_ops_t wrapped;
    fsdp_param_spec_t sroot = {
        .name = "scale", .ndim = 1, .shape = {8}, .requires_grad = 1, .tied_to = -1};
    fsdp_param_spec_t sa = {
        .name = "a.weight", .ndim = 2, .shape = {4, 4}, .requires_grad = 1, .tied_to = -1};
    fsdp_param_spec_t sb = {
        .name = "b.weight", .ndim = 1, .shape = {5}, .requires_grad = 1, .tied_to = -1};
    fsdp_config_t fc;
    fsdp_unit_t *root, *kids[2];
    fsdp_t *fs;
    fsdp_status_t status;

    wrap_ops(dev, &wrapped);
    fsdp_config_init(&fc);
    fc.strategy = pc->strategy;
    fc.backward_prefetch = pc->prefetch;
    status = fsdp_create(dev, &fc, &fs);
    if (status != FSDP_OK)
        return status;
    status = fsdp_unit_create(fs, "root", NULL, &sroot, 1, &root);
    if (status == FSDP_OK)
        status = fsdp_unit_create(fs, "a", root, &sa, 1, &kids[0]);
    if (status == FSDP_OK)
        status = fsdp_unit_create(fs, "b", root, &sb, 1, &kids[1]);
    for (int iter = 0; iter < 2 && status == FSDP_OK; iter++) {
        memset(&tl_counts, 0, sizeof(tl_counts));
        status = fsdp_pre_forward(root);
        FSDP_RANK_CHECK(&failure, dev->rank, fsdp_unit_param(root, 0) != NULL);
        for (int k = 0; k < 2 && status == FSDP_OK; k++) {
            status = fsdp_pre_forward(kids[k]);
            FSDP_RANK_CHECK(&failure, dev->rank, fsdp_unit_param(kids[k], 0) != NULL);
            if (status == FSDP_OK)
                status = fsdp_post_forward(kids[k]);
        }
        if (status == FSDP_OK)
            status = fsdp_post_forward(root);
        if (dev->rank < 4)
            pc->fwd[dev->rank] = tl_counts;
        memset(&tl_counts, 0, sizeof(tl_counts));
        if (status == FSDP_OK)
            status = fsdp_pre_backward(root);
        for (int k = 1; k >= 0 && status == FSDP_OK; k--) {
            void *g;
            status = fsdp_pre_backward(kids[k]);
            if (status == FSDP_OK)
                status = fsdp_unit_grad(kids[k], 0, &g);
            if (status == FSDP_OK)
                status = fsdp_post_backward(kids[k]);
        }
        void *g;
        if (status == FSDP_OK)
            status = fsdp_unit_grad(root, 0, &g);
        if (status == FSDP_OK)
            status = fsdp_post_backward(root);
        if (status == FSDP_OK)
            status = fsdp_final_callback(fs);
        if (dev->rank < 4)
            pc->bwd[dev->rank] = tl_counts;
        fsdp_zero_grad(fs);
    }
    fsdp_destroy(fs);
    return status;
}

static void test_collective_counts_root_params(void)
{
    static const fsdp_backward_prefetch_t prefetches[] = {
        FSDP_BACKWARD_PREFETCH_PRE, FSDP_BACKWARD_PREFETCH_POST, FSDP_BACKWARD_PREFETCH_NONE};
    fsdp_sim_params_t p;
    fsdp_sim_params_init(&p);
    p.world_size = 4;
    for (int i = 0; i < 3; i++) {
        phase_counts_t pc = {.strategy = FSDP_FULL_SHARD, .prefetch = prefetches[i]};
        CU_ASSERT_EQUAL_FATAL(launch_checked(&p, root_model_rank, &pc), FSDP_OK);
        for (int r = 0; r < 4; r++) {
            CU_ASSERT_EQUAL(pc.fwd[r].all_gather, 3);     /* N */
            CU_ASSERT_EQUAL(pc.bwd[r].all_gather, 2);     /* N - 1: the root kept its own */
            CU_ASSERT_EQUAL(pc.bwd[r].reduce_scatter, 3); /* N */
            CU_ASSERT_EQUAL(pc.fwd[r].reduce_scatter + pc.fwd[r].all_reduce, 0);
        }
        pc.strategy = FSDP_SHARD_GRAD_OP;
        CU_ASSERT_EQUAL_FATAL(launch_checked(&p, root_model_rank, &pc), FSDP_OK);
        for (int r = 0; r < 4; r++) {
            CU_ASSERT_EQUAL(pc.fwd[r].all_gather, 3);
            CU_ASSERT_EQUAL(pc.bwd[r].all_gather, 0);
            CU_ASSERT_EQUAL(pc.bwd[r].reduce_scatter, 3);
        }
    }
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"collective counts, parameter-less root", test_collective_counts_mlp},
        {"collective counts, root owns parameters", test_collective_counts_root_params},
        {"world size 1 is no_shard", test_world_one_is_no_shard},
        {NULL, NULL},
    };
    return fsdp_test_run("collective counts", tests);
}
