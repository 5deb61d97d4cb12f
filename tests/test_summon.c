/* summon_full_params: full f32 parameters, writeback, rank0_only, offload_to_cpu, with_grads,
 * recurse, and the combinations PyTorch refuses. */
#include <fsdp/fsdp.h>
#include <string.h>

#include "core/core_hidden.h"
#include "mlp_ref.h"

/* summon_full_params: full f32 parameters, writeback, rank0_only, offload_to_cpu, with_grads,
 * recurse, and the combinations PyTorch refuses. */
static fsdp_status_t summon_rank(fsdp_dev_t *dev, void *arg)
{
    fsdp_strategy_t strategy = *(fsdp_strategy_t *)arg;
    fsdp_config_t fc;
    fsdp_t *fs;
    fsdp_mlp_t *mlp;
    fsdp_summon_options_t o;
    float before[64], after[64], loss, grads[64];
    size_t rows = MAXB / 4;
    int sharded = strategy != FSDP_NO_SHARD;

    fsdp_config_init(&fc);
    fc.strategy = strategy;
    if (!FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_create(dev, &fc, &fs), FSDP_OK))
        return FSDP_ERR_INTERNAL;
    if (!FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_mlp_create(fs, dims, NL, &mlp), FSDP_OK))
        return FSDP_ERR_INTERNAL;
    if (!FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_mlp_init_params(mlp, 5), FSDP_OK))
        return FSDP_ERR_INTERNAL;
    fsdp_unit_t *root = fsdp_root(fs), *l0 = fsdp_mlp_layer(mlp, 0);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_unit_gather_full(l0, before), FSDP_OK);

    /* default: every rank sees the full parameters; a change is written back */
    fsdp_summon_options_init(&o);
    if (!FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_summon_full_params(root, &o), FSDP_OK))
        return FSDP_ERR_INTERNAL;
    float *w = fsdp_unit_param(l0, 0);
    if (!FSDP_RANK_CHECK(&failure, dev->rank, w != NULL))
        return FSDP_ERR_INTERNAL;
    FSDP_RANK_CHECK(&failure, dev->rank, memcmp(w, before, sizeof(float) * 35) == 0);
    w[3] += 1.0f;
    fsdp_log_set_level(FSDP_LOG_OFF);
    /* nested */
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_summon_full_params(root, &o), FSDP_ERR_STATE);
    /* not the summoned unit */
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_summon_end(l0), FSDP_ERR_STATE);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_pre_forward(root), FSDP_ERR_STATE);
    fsdp_log_set_level(FSDP_LOG_WARN);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_summon_end(root), FSDP_OK);
    FSDP_RANK_CHECK(&failure, dev->rank, fsdp_unit_param(l0, 0) == NULL);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_unit_gather_full(l0, after), FSDP_OK);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, after[3], before[3] + 1.0f);

    /* without writeback the change is dropped; on the host; rank 0 only */
    o.writeback = 0;
    o.offload_to_cpu = sharded;
    o.rank0_only = 1;
    if (!FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_summon_full_params(root, &o), FSDP_OK))
        return FSDP_ERR_INTERNAL;
    w = fsdp_unit_param(l0, 0);
    FSDP_RANK_CHECK(&failure, dev->rank, (w != NULL) == (fsdp_shard_group(fs)->rank == 0));
    if (w != NULL)
        w[0] = 1234.0f;
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_summon_end(root), FSDP_OK);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_unit_gather_full(l0, before), FSDP_OK);
    FSDP_RANK_CHECK(&failure, dev->rank, memcmp(before, after, sizeof(float) * 42) == 0);

    /* not recursive: the root alone (which has no parameters) */
    fsdp_summon_options_init(&o);
    o.recurse = 0;
    if (!FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_summon_full_params(root, &o), FSDP_OK))
        return FSDP_ERR_INTERNAL;
    FSDP_RANK_CHECK(&failure, dev->rank, fsdp_unit_param(l0, 0) == NULL);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_summon_end(root), FSDP_OK);

    /* with gradients: the full gradient equals the gathered sharded one */
    FSDP_RANK_CHECK_EQ(&failure, dev->rank,
                       fsdp_mlp_forward_backward(mlp, xs + (size_t)dev->rank * rows * 5,
                                                 ys + (size_t)dev->rank * rows * 3, rows, &loss),
                       FSDP_OK);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank,
                       fsdp_unit_gather_buffer(l0, fsdp_unit_sharded_grad(l0), grads), FSDP_OK);
    fsdp_summon_options_init(&o);
    o.with_grads = 1;
    if (!FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_summon_full_params(l0, &o), FSDP_OK))
        return FSDP_ERR_INTERNAL;
    if (!FSDP_RANK_CHECK(&failure, dev->rank, fsdp_unit_full_grad(l0, 1) != NULL))
        return FSDP_ERR_INTERNAL;
    FSDP_RANK_CHECK(&failure, dev->rank,
                    memcmp(fsdp_unit_full_grad(l0, 0), grads, sizeof(float) * 42) == 0);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_summon_end(l0), FSDP_OK);

    /* refused combinations */
    fsdp_log_set_level(FSDP_LOG_OFF);
    fsdp_summon_options_init(&o);
    o.rank0_only = 1;
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_summon_full_params(root, &o),
                       FSDP_ERR_UNSUPPORTED);
    fsdp_summon_options_init(&o);
    o.offload_to_cpu = 1;
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_summon_full_params(root, &o),
                       sharded ? FSDP_OK : FSDP_ERR_UNSUPPORTED);
    if (sharded)
        FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_summon_end(root), FSDP_OK);
    fsdp_log_set_level(FSDP_LOG_WARN);
    fsdp_mlp_destroy(mlp);
    fsdp_destroy(fs);
    return FSDP_OK;
}

static void test_summon_full_params(void)
{
    static const fsdp_strategy_t strategies[] = {FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP,
                                                 FSDP_NO_SHARD};
    fsdp_sim_params_t p;
    make_batch();
    fsdp_sim_params_init(&p);
    p.world_size = 4;
    for (int s = 0; s < 3; s++) {
        fsdp_strategy_t st = strategies[s];
        CU_ASSERT_EQUAL(launch_checked(&p, summon_rank, &st), FSDP_OK);
    }
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"summon_full_params", test_summon_full_params},
        {NULL, NULL},
    };
    return fsdp_test_run("summon", tests);
}
