/* clip_grad_norm across shards: the total norm and the clipped training equal the
 * single-process reference (mlp_ref.h). */
#include <fsdp/fsdp.h>
#include <math.h>
#include <stdlib.h>

#include "mlp_ref.h"

/* clip_grad_norm across shards, for norms 1, 2, 3 and inf, every strategy: the total norm and
 * the clipped update equal the single-process ones. */
static void test_clip_grad_norm(void)
{
    static const double types[] = {2.0, 1.0, 3.0, INFINITY};
    static const fsdp_strategy_t strategies[] = {FSDP_FULL_SHARD, FSDP_NO_SHARD, FSDP_HYBRID_SHARD};
    make_batch();
    for (size_t t = 0; t < 4; t++) {
        for (size_t s = 0; s < 3; s++) {
            run_cfg_t cfg = {.strategy = strategies[s],
                             .world = 4,
                             .steps = 3,
                             .ranks_per_node = 2,
                             .clip_max = 0.05,
                             .clip_type = types[t],
                             .cpu_offload = t == 1};
            run_result_t *res = calloc(1, sizeof(*res));
            double maxdiff;
            fsdp_optim_config_init(&cfg.optim, FSDP_OPTIM_SGD);
            cfg.optim.lr = 0.5f;
            maxdiff = run_fsdp_against_ref(&cfg, res);
            CU_ASSERT(maxdiff <= 1e-6);
            CU_ASSERT(fabs(res->last_norm - ref_last_norm) <= 1e-5 * ref_last_norm);
            CU_ASSERT(ref_last_norm > 0.05); /* clipping really happened */
            free(res);
        }
    }
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"clip_grad_norm across shards", test_clip_grad_norm},
        {NULL, NULL},
    };
    return fsdp_test_run("clip", tests);
}
