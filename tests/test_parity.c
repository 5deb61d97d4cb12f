/* W-rank FSDP training of the MLP equals single-process training (mlp_ref.h), for every
 * strategy, optimizer, prefetch policy and hybrid layout, with PyTorch's collective counts. */
#include <fsdp/fsdp.h>
#include <math.h>
#include <stdlib.h>

#include "mlp_ref.h"

static void check_parity(fsdp_optim_kind_t kind)
{
    static const fsdp_strategy_t strategies[] = {FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP,
                                                 FSDP_NO_SHARD};
    make_batch();
    for (size_t s = 0; s < 3; s++) {
        for (int w = 1; w <= 4; w++) {
            run_cfg_t cfg = {.strategy = strategies[s],
                             .world = w,
                             .steps = 5,
                             .prefetch = FSDP_BACKWARD_PREFETCH_PRE};
            run_result_t *res = calloc(1, sizeof(*res));
            double maxdiff;
            fsdp_optim_config_init(&cfg.optim, kind);
            if (kind == FSDP_OPTIM_ADAMW) {
                cfg.optim.lr = 1e-2f;
            } else {
                cfg.optim.lr = 5e-2f;
                cfg.optim.momentum = 0.9f;
                cfg.optim.dampening = 0.1f;
                cfg.optim.weight_decay = 1e-3f;
            }
            maxdiff = run_fsdp_against_ref(&cfg, res);
            CU_ASSERT_EQUAL(res->total, 42 + 48 + 21);
            if (maxdiff > 1e-6)
                fprintf(stderr, "\n  %s W=%d: max |fsdp - reference| = %g\n",
                        fsdp_strategy_name(strategies[s]), w, maxdiff);
            CU_ASSERT(maxdiff <= 1e-6);
            /* training moved the parameters: the comparison is not vacuous */
            double moved = 0.0;
            for (size_t i = 0; i < res->total; i++)
                moved += fabs((double)res->final_params[i] - res->init[i]);
            CU_ASSERT(moved > 1e-2);
            free(res);
        }
    }
}

static void test_parity_adamw(void)
{
    check_parity(FSDP_OPTIM_ADAMW);
}

static void test_parity_sgd_momentum(void)
{
    check_parity(FSDP_OPTIM_SGD);
}

/* Parity for every prefetch policy, with and without forward prefetch and the limiter; the
 * collective counts do not change. */
static void test_prefetch_policies(void)
{
    static const fsdp_strategy_t strategies[] = {FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP,
                                                 FSDP_HYBRID_SHARD};
    make_batch();
    for (size_t s = 0; s < 3; s++) {
        for (int p = 0; p < 3; p++) {
            for (int fwd = 0; fwd < 2; fwd++) {
                run_cfg_t cfg = {.strategy = strategies[s],
                                 .world = 4,
                                 .steps = 3,
                                 .prefetch = (fsdp_backward_prefetch_t)p,
                                 .ranks_per_node = 2,
                                 .forward_prefetch = fwd,
                                 .no_limiter = fwd};
                run_result_t *res = calloc(1, sizeof(*res));
                double maxdiff;
                fsdp_optim_config_init(&cfg.optim, FSDP_OPTIM_ADAMW);
                cfg.optim.lr = 1e-2f;
                maxdiff = run_fsdp_against_ref(&cfg, res);
                CU_ASSERT(maxdiff <= 1e-6);
                for (int r = 0; r < 4; r++) {
                    int keeps = strategies[s] == FSDP_SHARD_GRAD_OP;
                    CU_ASSERT_EQUAL(res->bwd[r].all_gather, keeps ? NL : 2 * NL);
                    CU_ASSERT_EQUAL(res->bwd[r].reduce_scatter, NL);
                }
                free(res);
            }
        }
    }
}

/* Hybrid sharding: shard within a node, all-reduce across nodes (W = 4, 2 ranks per node). */
static void test_hybrid_parity_and_counts(void)
{
    make_batch();
    for (int zero2 = 0; zero2 < 2; zero2++) {
        for (int rpn = 1; rpn <= 4; rpn *= 2) {
            run_cfg_t cfg = {.strategy = zero2 ? FSDP_HYBRID_SHARD_ZERO2 : FSDP_HYBRID_SHARD,
                             .world = 4,
                             .steps = 4,
                             .prefetch = FSDP_BACKWARD_PREFETCH_PRE,
                             .ranks_per_node = rpn};
            run_result_t *res = calloc(1, sizeof(*res));
            double maxdiff;
            fsdp_optim_config_init(&cfg.optim, FSDP_OPTIM_ADAMW);
            cfg.optim.lr = 1e-2f;
            maxdiff = run_fsdp_against_ref(&cfg, res);
            CU_ASSERT(maxdiff <= 1e-6);
            for (int r = 0; r < 4; r++) {
                /* one inter-node all-reduce per reduce-scatter, one per hybrid handle */
                CU_ASSERT_EQUAL(res->bwd[r].reduce_scatter, NL);
                CU_ASSERT_EQUAL(res->bwd[r].all_reduce, NL);
                CU_ASSERT_EQUAL(res->bwd[r].all_gather, zero2 ? NL : 2 * NL);
            }
            free(res);
        }
    }
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"parity with single-process training, adamw", test_parity_adamw},
        {"parity with single-process training, sgd momentum", test_parity_sgd_momentum},
        {"prefetch policies, forward prefetch, limiter", test_prefetch_policies},
        {"hybrid sharding: parity and counts", test_hybrid_parity_and_counts},
        {NULL, NULL},
    };
    return fsdp_test_run("parity", tests);
}
