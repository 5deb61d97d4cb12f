/* The execution order the runtime records: a forward order that differs across ranks fails
 * on every rank, and the orders that choose prefetch targets hold every unit of the forward,
 * however often a unit runs in it. */
#include <fsdp/fsdp.h>
#include <stdio.h>
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

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"forward order validated across ranks", test_forward_order},
        {NULL, NULL},
    };
    return fsdp_test_run("exec order", tests);
}
