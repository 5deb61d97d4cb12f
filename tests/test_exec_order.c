/* The execution order the runtime records: a forward order that differs across ranks fails
 * on every rank, and the orders that choose prefetch targets hold every unit of the forward,
 * however often a unit runs in it. */
#include <fsdp/fsdp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime_test.h"

/* A rank whose forward order differs fails on every rank, naming the first differing rank and
 * unit, rather than hanging; a later change of order only warns. */
typedef struct order_ctx {
    int swap_rank;  /* this rank runs b before a in the first iteration; -1: nobody */
    int swap_later; /* every rank swaps in the second iteration */
    fsdp_status_t status[4];
    char message[4][512];
} order_ctx_t;

static _Thread_local char tl_warning[512];

static void capture_log(fsdp_log_level_t level, const char *file, int line, const char *func,
                        const char *msg, void *arg)
{
    (void)file, (void)line, (void)func, (void)arg;
    if (level == FSDP_LOG_WARN)
        snprintf(tl_warning, sizeof(tl_warning), "%s", msg);
}

static fsdp_status_t order_rank(fsdp_dev_t *dev, void *arg)
{
    order_ctx_t *oc = arg;
    fsdp_param_spec_t sa = {
        .name = "a.w", .ndim = 1, .shape = {6}, .requires_grad = 1, .tied_to = -1};
    fsdp_param_spec_t sb = {
        .name = "b.w", .ndim = 1, .shape = {6}, .requires_grad = 1, .tied_to = -1};
    fsdp_unit_t *root, *kids[2];
    fsdp_t *fs;
    fsdp_status_t status;

    if (!FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_create(dev, NULL, &fs), FSDP_OK))
        return FSDP_ERR_INTERNAL;
    fsdp_unit_create(fs, "root", NULL, NULL, 0, &root);
    fsdp_unit_create(fs, "a", root, &sa, 1, &kids[0]);
    fsdp_unit_create(fs, "b", root, &sb, 1, &kids[1]);
    tl_warning[0] = '\0';
    for (int iter = 0; iter < 2; iter++) {
        int swap = iter == 0 ? dev->rank == oc->swap_rank : oc->swap_later;
        status = fsdp_pre_forward(root);
        for (int k = 0; k < 2 && status == FSDP_OK; k++) {
            fsdp_unit_t *u = kids[swap ? 1 - k : k];
            status = fsdp_pre_forward(u);
            if (status == FSDP_OK)
                status = fsdp_post_forward(u);
        }
        if (status == FSDP_OK)
            status = fsdp_post_forward(root);
        if (status == FSDP_OK)
            status = fsdp_pre_backward(root);
        if (status == FSDP_OK)
            status = fsdp_post_backward(root);
        if (status == FSDP_OK)
            status = fsdp_final_callback(fs);
        if (status != FSDP_OK)
            break;
    }
    oc->status[dev->rank] = status;
    snprintf(oc->message[dev->rank], sizeof(oc->message[0]), "%s",
             status != FSDP_OK ? fsdp_last_error(fs) : tl_warning);
    fsdp_destroy(fs);
    return FSDP_OK;
}

static void test_forward_order(void)
{
    fsdp_sim_params_t p;
    order_ctx_t oc = {.swap_rank = 2};
    fsdp_sim_params_init(&p);
    p.world_size = 4;
    p.timeout_s = 20;
    fsdp_log_set_handler(capture_log, NULL);
    CU_ASSERT_EQUAL(launch_checked(&p, order_rank, &oc), FSDP_OK);
    for (int r = 0; r < 4; r++) {
        CU_ASSERT_EQUAL(oc.status[r], FSDP_ERR_COLLECTIVE_MISMATCH);
        CU_ASSERT(strstr(oc.message[r], "forward order differs across ranks") != NULL);
        CU_ASSERT(strstr(oc.message[r], "rank 2 runs unit 'b'") != NULL);
    }
    memset(&oc, 0, sizeof(oc));
    oc.swap_rank = -1;
    oc.swap_later = 1;
    CU_ASSERT_EQUAL(launch_checked(&p, order_rank, &oc), FSDP_OK);
    for (int r = 0; r < 4; r++) {
        CU_ASSERT_EQUAL(oc.status[r], FSDP_OK);
        CU_ASSERT(strstr(oc.message[r], "forward order changed after the first iteration") != NULL);
    }
    fsdp_log_set_handler(NULL, NULL);
}

/* ---------------- prefetch targets of a model with a reused unit ---------------- */

/* A parameter-less root, a unit "shared" run RU_REUSES times at the start of every forward (a
 * layer reused, as a tied block), then RU_UNITS units run once each: the post-forward order
 * holds RU_REUSES + RU_UNITS entries, more than four per unit. Every unit's shard size differs
 * (W = 2), so the all-gathers a hook issues name the units it unshards. */
#define RU_WORLD 2
#define RU_UNITS 6
#define RU_REUSES 100
#define RU_ITERS 2
#define RU_SHARED_SHARD 10
#define RU_MAX_AG 4

/* the shard size of unit k (k = -1: "shared") */
static size_t ru_shard(int k)
{
    return (size_t)(RU_SHARED_SHARD + 1 + k);
}

typedef struct ru_seen {
    int n;
    size_t shard[RU_MAX_AG];
} ru_seen_t;

typedef struct ru_ctx {
    /* the all-gathers of each unit's first pre-forward and of its pre-backward */
    ru_seen_t fwd[RU_WORLD][RU_ITERS][RU_UNITS + 1], bwd[RU_WORLD][RU_ITERS][RU_UNITS + 1];
} ru_ctx_t;

/* Runs one hook of unit k (k = -1: "shared") and keeps the all-gathers it issued. */
static fsdp_status_t ru_hook(fsdp_status_t (*hook)(fsdp_unit_t *), fsdp_unit_t *u, ru_seen_t *seen)
{
    fsdp_status_t status;

    tl_nlog = 0;
    status = hook(u);
    if (seen == NULL)
        return status;
    seen->n = 0;
    for (int i = 0; i < tl_nlog; i++) {
        if (tl_log[i].kind == C_AG && seen->n < RU_MAX_AG)
            seen->shard[seen->n++] = tl_log[i].n;
    }
    return status;
}

static fsdp_status_t reuse_rank(fsdp_dev_t *dev, void *arg)
{
    ru_ctx_t *rc = arg;
    fsdp_backend_ops_t wrapped;
    fsdp_unit_t *root, *shared, *u[RU_UNITS];
    fsdp_param_spec_t spec = {.name = NULL, .ndim = 1, .requires_grad = 1, .tied_to = -1};
    fsdp_config_t fc;
    fsdp_t *fs;
    char pname[RU_UNITS + 1][16];
    fsdp_status_t status;
    int r = dev->rank;
    void *g;

    wrap_ops(dev, &wrapped);
    fsdp_config_init(&fc);
    fc.strategy = FSDP_FULL_SHARD;
    fc.backward_prefetch = FSDP_BACKWARD_PREFETCH_PRE;
    fc.forward_prefetch = 1;
    if (!FSDP_RANK_CHECK_EQ(&failure, r, fsdp_create(dev, &fc, &fs), FSDP_OK))
        return FSDP_ERR_INTERNAL;
    status = fsdp_unit_create(fs, "root", NULL, NULL, 0, &root);
    for (int k = -1; k < RU_UNITS && status == FSDP_OK; k++) {
        char uname[16];
        snprintf(uname, sizeof(uname), k < 0 ? "shared" : "u%d", k);
        snprintf(pname[k + 1], sizeof(pname[0]), "%s.w", uname);
        spec.name = pname[k + 1];
        spec.shape[0] = (int64_t)(RU_WORLD * ru_shard(k));
        status = fsdp_unit_create(fs, uname, root, &spec, 1, k < 0 ? &shared : &u[k]);
    }
    for (int it = 0; it < RU_ITERS && status == FSDP_OK; it++) {
        status = fsdp_pre_forward(root);
        for (int j = 0; j < RU_REUSES && status == FSDP_OK; j++) {
            status = ru_hook(fsdp_pre_forward, shared, j == 0 ? &rc->fwd[r][it][0] : NULL);
            if (status == FSDP_OK)
                status = fsdp_post_forward(shared);
        }
        for (int k = 0; k < RU_UNITS && status == FSDP_OK; k++) {
            status = ru_hook(fsdp_pre_forward, u[k], &rc->fwd[r][it][k + 1]);
            if (status == FSDP_OK)
                status = fsdp_post_forward(u[k]);
        }
        if (status == FSDP_OK)
            status = fsdp_post_forward(root);
        if (status == FSDP_OK)
            status = fsdp_pre_backward(root);
        for (int k = RU_UNITS - 1; k >= -1 && status == FSDP_OK; k--) {
            fsdp_unit_t *unit = k < 0 ? shared : u[k];
            status = ru_hook(fsdp_pre_backward, unit, &rc->bwd[r][it][k + 1]);
            if (status == FSDP_OK)
                status = fsdp_unit_grad(unit, 0, &g);
            if (status == FSDP_OK)
                status = fsdp_post_backward(unit);
        }
        if (status == FSDP_OK)
            status = fsdp_post_backward(root);
        if (status == FSDP_OK)
            status = fsdp_final_callback(fs);
    }
    FSDP_RANK_CHECK_MSG(&failure, r, status == FSDP_OK, "%s: %s", fsdp_status_name(status),
                        fsdp_last_error(fs));
    fsdp_destroy(fs);
    return status;
}

/* Checks what one hook gathered: `own` (0: nothing of its own), then `target` (0: nothing). */
static void ru_expect(const ru_seen_t *seen, size_t own, size_t target, const char *what, int k)
{
    size_t want[2];
    int n = 0;

    if (own > 0)
        want[n++] = own;
    if (target > 0)
        want[n++] = target;
    if (seen->n != n || (n > 0 && seen->shard[0] != want[0]) ||
        (n > 1 && seen->shard[1] != want[1]))
        fprintf(stderr, "\n  %s of unit %d: %d all-gathers (shards %zu %zu), want %d (%zu %zu)\n",
                what, k, seen->n, seen->n > 0 ? seen->shard[0] : 0,
                seen->n > 1 ? seen->shard[1] : 0, n, n > 0 ? want[0] : 0, n > 1 ? want[1] : 0);
    CU_ASSERT_EQUAL(seen->n, n);
    for (int i = 0; i < n && i < seen->n; i++)
        CU_ASSERT_EQUAL(seen->shard[i], want[i]);
}

/* Every unit's prefetch target follows the recorded orders, however many times "shared" ran:
 * BACKWARD_PRE prefetches, from each unit's pre-backward, the unit that ran post-forward just
 * before it (u[k - 1], and "shared" for u[0]); forward prefetch, from the second iteration on,
 * the unit that ran pre-forward after it for the first time. */
static void test_prefetch_targets_reused_unit(void)
{
    ru_ctx_t *rc = calloc(1, sizeof(*rc));
    fsdp_sim_params_t p;

    CU_ASSERT_PTR_NOT_NULL_FATAL(rc);
    fsdp_sim_params_init(&p);
    p.world_size = RU_WORLD;
    CU_ASSERT_EQUAL_FATAL(launch_checked(&p, reuse_rank, rc), FSDP_OK);
    for (int r = 0; r < RU_WORLD; r++) {
        for (int it = 0; it < RU_ITERS; it++) {
            /* backward: u[last] gathers itself and prefetches u[last - 1]; every other unit
             * was prefetched and prefetches the unit before it */
            for (int k = RU_UNITS - 1; k >= 0; k--)
                ru_expect(&rc->bwd[r][it][k + 1], k == RU_UNITS - 1 ? ru_shard(k) : 0,
                          ru_shard(k - 1), "pre-backward", k);
            /* "shared" was prefetched by u[0]; its own target is itself, already unsharded */
            ru_expect(&rc->bwd[r][it][0], 0, 0, "pre-backward", -1);
            /* forward: nothing is prefetched in the first iteration; from the second, the
             * first run of "shared" prefetches u[0], and each u[k] was prefetched and
             * prefetches u[k + 1] */
            ru_expect(&rc->fwd[r][it][0], ru_shard(-1), it > 0 ? ru_shard(0) : 0, "pre-forward",
                      -1);
            for (int k = 0; k < RU_UNITS; k++)
                ru_expect(&rc->fwd[r][it][k + 1], it > 0 ? 0 : ru_shard(k),
                          it > 0 && k + 1 < RU_UNITS ? ru_shard(k + 1) : 0, "pre-forward", k);
        }
    }
    free(rc);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"forward order validated across ranks", test_forward_order},
        {"prefetch targets of a unit run many times per forward",
         test_prefetch_targets_reused_unit},
        {NULL, NULL},
    };
    return fsdp_test_run("exec order", tests);
}
