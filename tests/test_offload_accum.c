/* Gradient accumulation (with and without no_sync) and CPU offload: training equals the
 * single-process reference (mlp_ref.h), with the expected collectives and placement. */
#include <fsdp/fsdp.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlp_ref.h"

/* Gradient accumulation over micro-batches, with no_sync or without, in any interleaving,
 * equals one step over the concatenated batch (docs/runtime.md section 5), for every strategy
 * and prefetch policy. */
static void test_grad_accumulation(void)
{
    static const fsdp_strategy_t strategies[] = {FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP, FSDP_NO_SHARD,
                                                 FSDP_HYBRID_SHARD, FSDP_HYBRID_SHARD_ZERO2};
    static const struct {
        int micro, sync[MAX_MICRO];
    } patterns[] = {{2, {0, 1}}, {2, {1, 1}}, {3, {0, 0, 1}}, {3, {1, 0, 1}}, {3, {0, 1, 1}}};
    make_batch();
    for (size_t s = 0; s < 5; s++) {
        for (size_t p = 0; p < 5; p++) {
            run_cfg_t cfg = {.strategy = strategies[s],
                             .world = 2,
                             .steps = 3,
                             .prefetch = (fsdp_backward_prefetch_t)(p % 3),
                             .ranks_per_node = 1,
                             .micro = patterns[p].micro};
            run_result_t *res = calloc(1, sizeof(*res));
            double maxdiff;
            memcpy(cfg.sync, patterns[p].sync, sizeof(cfg.sync));
            fsdp_optim_config_init(&cfg.optim, FSDP_OPTIM_ADAMW);
            cfg.optim.lr = 1e-2f;
            maxdiff = run_fsdp_against_ref(&cfg, res);
            if (maxdiff > 1e-6)
                fprintf(stderr, "\n  %s, pattern %zu: max |fsdp - reference| = %g\n",
                        fsdp_strategy_name(strategies[s]), p, maxdiff);
            CU_ASSERT(maxdiff <= 1e-6);
            if (p == 0) {
                /* no_sync then sync: one reduction per unit; SHARD_GRAD_OP keeps the unsharded
                 * parameters through no_sync, so the second forward gathers nothing */
                int sharded = strategies[s] != FSDP_NO_SHARD;
                int keeps =
                    strategies[s] == FSDP_SHARD_GRAD_OP || strategies[s] == FSDP_HYBRID_SHARD_ZERO2;
                int hybrid = strategies[s] >= FSDP_HYBRID_SHARD;
                for (int r = 0; r < 2; r++) {
                    CU_ASSERT_EQUAL(res->bwd[r].reduce_scatter, sharded ? NL : 0);
                    CU_ASSERT_EQUAL(res->bwd[r].all_reduce, sharded ? (hybrid ? NL : 0) : NL);
                    CU_ASSERT_EQUAL(res->bwd[r].all_gather, !sharded ? 0 : keeps ? NL : 4 * NL);
                }
            }
            free(res);
        }
    }
}

/* CPU offload: parity with single-process training for every strategy and prefetch policy;
 * the shard lives in pinned host memory, not on the device. */
static void test_cpu_offload(void)
{
    static const fsdp_strategy_t strategies[] = {FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP, FSDP_NO_SHARD,
                                                 FSDP_HYBRID_SHARD};
    make_batch();
    for (size_t s = 0; s < 4; s++) {
        for (int p = 0; p < 3; p++) {
            run_cfg_t cfg = {.strategy = strategies[s],
                             .world = 3,
                             .steps = 3,
                             .prefetch = (fsdp_backward_prefetch_t)p,
                             .ranks_per_node = 1,
                             .cpu_offload = 1};
            run_result_t *res = calloc(1, sizeof(*res));
            double maxdiff;
            fsdp_optim_config_init(&cfg.optim, FSDP_OPTIM_SGD);
            cfg.optim.lr = 5e-2f;
            cfg.optim.momentum = 0.9f;
            maxdiff = run_fsdp_against_ref(&cfg, res);
            CU_ASSERT(maxdiff <= 1e-6);
            for (int r = 0; r < 3; r++) {
                /* between steps no sharded parameter is on the device */
                CU_ASSERT_EQUAL(res->sharded_param_bytes[r], 0);
                CU_ASSERT(res->pinned_bytes[r] > 0);
            }
            free(res);
        }
    }
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"gradient accumulation with and without no_sync", test_grad_accumulation},
        {"cpu offload: parity and placement", test_cpu_offload},
        {NULL, NULL},
    };
    return fsdp_test_run("offload and accumulation", tests);
}
