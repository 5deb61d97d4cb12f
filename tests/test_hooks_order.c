/* The hooks' order: illegal transitions are refused, the trace shows the hooks in PyTorch's
 * order with allocations attributed to their units, and the peak of one iteration equals the
 * allocation order of docs/runtime.md section 2 replayed by hand. */
#include <fsdp/fsdp.h>
#include <fsdp/trace.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core_hidden.h"
#include "mlp_ref.h"

/* ---------------- illegal transitions ---------------- */

static fsdp_status_t states_rank(fsdp_dev_t *dev, void *arg)
{
    fsdp_param_spec_t s = {.name = "w", .ndim = 1, .shape = {6}, .requires_grad = 1, .tied_to = -1};
    fsdp_param_spec_t s2 = {
        .name = "v", .ndim = 1, .shape = {3}, .requires_grad = 1, .tied_to = -1};
    fsdp_param_spec_t frozen[2] = {
        {.name = "f1", .ndim = 1, .shape = {2}, .requires_grad = 1, .tied_to = -1},
        {.name = "f2", .ndim = 1, .shape = {2}, .requires_grad = 0, .tied_to = -1}};
    fsdp_unit_t *root, *u, *late;
    fsdp_t *fs;
    void *g;
    (void)arg;

    if (!FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_create(dev, NULL, &fs), FSDP_OK))
        return FSDP_ERR_INTERNAL;
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_unit_create(fs, "root", NULL, NULL, 0, &root),
                       FSDP_OK);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_unit_create(fs, "u", root, &s, 1, &u), FSDP_OK);
    /* a name reused across units, a second root, frozen parameters mixed in */
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_unit_create(fs, "dup", root, &s, 1, &late),
                       FSDP_ERR_INVALID_PARAM);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_unit_create(fs, "root2", NULL, NULL, 0, &late),
                       FSDP_ERR_INVALID_PARAM);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_unit_create(fs, "frz", root, frozen, 2, &late),
                       FSDP_ERR_INVALID_PARAM);
    FSDP_RANK_CHECK(&failure, dev->rank, strstr(fsdp_last_error(fs), "f2") != NULL);

    /* a child before the root; post-forward without pre-forward; backward before forward */
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_pre_forward(u), FSDP_ERR_STATE);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_post_forward(root), FSDP_ERR_STATE);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_final_callback(fs), FSDP_ERR_STATE);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_pre_backward(u), FSDP_ERR_STATE);

    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_pre_forward(root), FSDP_OK);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_unit_create(fs, "late", root, &s2, 1, &late),
                       FSDP_ERR_STATE);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_pre_forward(u), FSDP_OK);
    /* twice */
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_pre_forward(u), FSDP_ERR_STATE);
    /* not in backward */
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_unit_grad(u, 0, &g), FSDP_ERR_STATE);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_post_backward(u), FSDP_ERR_STATE);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_post_forward(u), FSDP_OK);
    /* resharded: no unsharded view */
    FSDP_RANK_CHECK(&failure, dev->rank, fsdp_unit_param(u, 0) == NULL);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_post_forward(root), FSDP_OK);

    /* before the root's */
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_pre_backward(u), FSDP_ERR_STATE);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_pre_backward(root), FSDP_OK);
    /* forward before final callback */
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_pre_forward(root), FSDP_ERR_STATE);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_pre_backward(u), FSDP_OK);
    /* fires once; a second call is a no-op */
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_pre_backward(u), FSDP_OK);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_unit_grad(u, 0, &g), FSDP_OK);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_post_backward(u), FSDP_OK);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_post_backward(root), FSDP_OK);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_final_callback(fs), FSDP_OK);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_final_callback(fs), FSDP_ERR_STATE);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_training_state(fs), FSDP_STATE_IDLE);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_unit_handle_state(u), FSDP_HANDLE_IDLE);
    FSDP_RANK_CHECK(&failure, dev->rank, fsdp_unit_sharded_grad(u) != NULL);
    fsdp_destroy(fs);
    return FSDP_OK;
}

static void test_illegal_transitions(void)
{
    launch_quiet(2, FSDP_SIM_DATA, states_rank);
}

/* The runtime's events in the trace: hooks in PyTorch's order, allocations attributed to the
 * unit whose hook made them, memory after each event. */
typedef struct trace_ctx {
    fsdp_trace_t *trace;
    double comm[2], exposed[2]; /* the simulator's own accounting, per rank */
} trace_ctx_t;

static fsdp_status_t traced_rank(fsdp_dev_t *dev, void *arg)
{
    trace_ctx_t *tc = arg;
    fsdp_t *fs;
    fsdp_mlp_t *mlp;
    float loss;
    size_t rows = MAXB / 2;

    if (!FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_trace_attach(tc->trace, dev), FSDP_OK))
        return FSDP_ERR_INTERNAL;
    if (!FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_create(dev, NULL, &fs), FSDP_OK))
        return FSDP_ERR_INTERNAL;
    if (!FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_mlp_create(fs, dims, NL, &mlp), FSDP_OK))
        return FSDP_ERR_INTERNAL;
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_mlp_init_params(mlp, 1), FSDP_OK);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank,
                       fsdp_mlp_forward_backward(mlp, xs + (size_t)dev->rank * rows * 5,
                                                 ys + (size_t)dev->rank * rows * 3, rows, &loss),
                       FSDP_OK);
    fsdp_sim_time_stats_t ts;
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_sim_time_stats(dev, &ts), FSDP_OK);
    tc->comm[dev->rank] = ts.comm_s;
    tc->exposed[dev->rank] = ts.exposed_comm_s;
    fsdp_mlp_destroy(mlp);
    fsdp_destroy(fs);
    fsdp_trace_detach(dev);
    return FSDP_OK;
}

typedef struct hook_seen {
    char hooks[64][48];
    int nhooks;
    int unsharded_allocs[NL];
    int bad_memory;
} hook_seen_t;

static int collect_event(void *arg, int rank, uint64_t seq, const fsdp_trace_event_t *ev)
{
    hook_seen_t *hs = arg;
    (void)rank, (void)seq;
    if (ev->kind == FSDP_EV_HOOK && hs->nhooks < 64)
        snprintf(hs->hooks[hs->nhooks++], sizeof(hs->hooks[0]), "%s %s", ev->name,
                 ev->unit ? ev->unit : "-");
    if (ev->kind == FSDP_EV_ALLOC && strcmp(ev->name, "unsharded_param") == 0 && ev->unit &&
        strncmp(ev->unit, "layers.", 7) == 0)
        hs->unsharded_allocs[ev->unit[7] - '0']++;
    if (ev->kind == FSDP_EV_ALLOC && ev->allocated < ev->bytes)
        hs->bad_memory++;
    return 0;
}

static void test_trace_events(void)
{
    static const char *const want[] = {
        "root_pre_forward root",  "pre_forward root",       "pre_forward layers.0",
        "post_forward layers.0",  "pre_forward layers.1",   "post_forward layers.1",
        "pre_forward layers.2",   "post_forward layers.2",  "post_forward root",
        "pre_backward root",      "pre_backward layers.2",  "post_backward layers.2",
        "pre_backward layers.1",  "post_backward layers.1", "pre_backward layers.0",
        "post_backward layers.0", "final_callback root"};
    char path[] = "/tmp/fsdp-trace-test-XXXXXX";
    fsdp_trace_run_info_t info = {.backend = "sim", .world_size = 2, .strategy = "full_shard"};
    trace_ctx_t tc;
    fsdp_sim_params_t p;
    fsdp_trace_reader_t *rd;
    hook_seen_t *hs = calloc(1, sizeof(*hs));
    int fd = mkstemp(path);

    make_batch();
    CU_ASSERT_FATAL(fd >= 0);
    close(fd);
    unlink(path);
    CU_ASSERT_EQUAL_FATAL(fsdp_trace_open(path, &info, &tc.trace), FSDP_OK);
    fsdp_sim_params_init(&p);
    p.world_size = 2;
    CU_ASSERT_EQUAL(launch_checked(&p, traced_rank, &tc), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_trace_close(tc.trace), FSDP_OK);
    CU_ASSERT_EQUAL_FATAL(fsdp_trace_reader_open(path, &rd), FSDP_OK);
    int64_t run = 0;
    CU_ASSERT_EQUAL(fsdp_trace_reader_find_run(rd, 0, &run), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_trace_reader_events(rd, run, 1, collect_event, hs), FSDP_OK);
    fsdp_trace_reader_close(rd);
    CU_ASSERT_EQUAL(hs->nhooks, (int)(sizeof(want) / sizeof(want[0])));
    for (int i = 0; i < hs->nhooks && i < (int)(sizeof(want) / sizeof(want[0])); i++) {
        if (strcmp(hs->hooks[i], want[i]) != 0)
            fprintf(stderr, "\n  hook %d: got '%s', want '%s'\n", i, hs->hooks[i], want[i]);
        CU_ASSERT_STRING_EQUAL(hs->hooks[i], want[i]);
    }
    /* FULL_SHARD, parameter-less root: each unit gathers in forward and again in backward */
    for (int l = 0; l < NL; l++)
        CU_ASSERT_EQUAL(hs->unsharded_allocs[l], 2);
    CU_ASSERT_EQUAL(hs->bad_memory, 0);

    /* the summary's exposed communication, from the trace, equals the simulator's account */
    char *text = NULL;
    size_t len = 0;
    FILE *mf = open_memstream(&text, &len);
    CU_ASSERT_EQUAL(fsdp_trace_summary(path, 0, mf), FSDP_OK);
    fclose(mf);
    const char *sec = text ? strstr(text, "exposed communication (") : NULL;
    CU_ASSERT_PTR_NOT_NULL_FATAL(sec);
    double comm = -1, compute = -1, exposed = -1;
    const char *line = strstr(sec, "    communication ");
    CU_ASSERT_PTR_NOT_NULL_FATAL(line);
    CU_ASSERT_EQUAL(sscanf(line, " communication %lf s, compute %lf s, exposed communication %lf",
                           &comm, &compute, &exposed),
                    3);
    CU_ASSERT(tc.comm[0] > 0 && fabs(comm - tc.comm[0]) <= 1e-5 * tc.comm[0]);
    CU_ASSERT(fabs(exposed - tc.exposed[0]) <= 1e-5 * tc.comm[0]);
    CU_ASSERT(exposed <= comm);
    free(text);
    unlink(path);
    free(hs);
}

/* Peak allocated of one iteration equals the peak of the allocation order of section 2,
 * replayed by hand: units a (1000 elements) and b (3000) under a parameter-less root, W = 2,
 * BACKWARD_PRE, one iteration. Every size rounds to 512 bytes as the allocator does. */
static size_t r512(size_t bytes)
{
    return (bytes + 511) / 512 * 512;
}

typedef struct peak_ctx {
    fsdp_strategy_t strategy;
    size_t peak[2];
} peak_ctx_t;

static fsdp_status_t peak_rank(fsdp_dev_t *dev, void *arg)
{
    peak_ctx_t *pc = arg;
    fsdp_param_spec_t sa = {
        .name = "a.w", .ndim = 1, .shape = {1000}, .requires_grad = 1, .tied_to = -1};
    fsdp_param_spec_t sb = {
        .name = "b.w", .ndim = 1, .shape = {3000}, .requires_grad = 1, .tied_to = -1};
    fsdp_config_t fc;
    fsdp_unit_t *root, *a, *b;
    fsdp_mem_stats_t st;
    fsdp_t *fs;
    void *g;

    fsdp_config_init(&fc);
    fc.strategy = pc->strategy;
    fc.validate_exec_order = 0; /* its small temporaries are not part of section 2 */
    if (!FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_create(dev, &fc, &fs), FSDP_OK))
        return FSDP_ERR_INTERNAL;
    fsdp_unit_create(fs, "root", NULL, NULL, 0, &root);
    fsdp_unit_create(fs, "a", root, &sa, 1, &a);
    fsdp_unit_create(fs, "b", root, &sb, 1, &b);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_pre_forward(root), FSDP_OK);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_pre_forward(a), FSDP_OK);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_post_forward(a), FSDP_OK);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_pre_forward(b), FSDP_OK);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_post_forward(b), FSDP_OK);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_post_forward(root), FSDP_OK);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_pre_backward(root), FSDP_OK);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_pre_backward(b), FSDP_OK);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_unit_grad(b, 0, &g), FSDP_OK);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_post_backward(b), FSDP_OK);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_pre_backward(a), FSDP_OK);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_unit_grad(a, 0, &g), FSDP_OK);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_post_backward(a), FSDP_OK);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_post_backward(root), FSDP_OK);
    FSDP_RANK_CHECK_EQ(&failure, dev->rank, fsdp_final_callback(fs), FSDP_OK);
    fsdp_mem_get_stats(fsdp_memory(fs), &st);
    pc->peak[dev->rank] = st.peak_allocated;
    fsdp_destroy(fs);
    return FSDP_OK;
}

/* Replays a list of +bytes / -bytes and returns the highest running total. */
static size_t replay(const long *ops, int n)
{
    long cur = 0, peak = 0;
    for (int i = 0; i < n; i++) {
        cur += ops[i];
        peak = cur > peak ? cur : peak;
    }
    return (size_t)peak;
}

static void test_peak_by_hand(void)
{
    const long Ta = 1000, Tb = 3000, Sa = 500, Sb = 1500; /* W = 2: no padding */
    const long LSa = (long)r512(Sa * 4), LSb = (long)r512(Sb * 4);
    const long FPa = (long)r512(2 * Sa * 4), FPb = (long)r512(2 * Sb * 4);
    const long Ga = (long)r512(Ta * 4), Gb = (long)r512(Tb * 4);
    const long Gsa = (long)r512(Sa * 4), Gsb = (long)r512(Sb * 4);
    /* FULL_SHARD: forward frees each FP; backward gathers b, prefetches a (BACKWARD_PRE),
     * b's gradient, b resharded, its shard reduced into Gs (kept as the sharded gradient),
     * G freed; then a alike. */
    const long full[] = {LSa, LSb,  FPa, -FPa, FPb, -FPb, FPb, FPa,
                         Gb,  -FPb, Gsb, -Gb,  Ga,  -FPa, Gsa, -Ga};
    /* SHARD_GRAD_OP: FP kept from forward; backward gathers nothing; freed in post-backward */
    const long zero2[] = {LSa, LSb, FPa, FPb, Gb, -FPb, Gsb, -Gb, Ga, -FPa, Gsa, -Ga};
    /* NO_SHARD: the shard is the whole parameter; the all-reduced gradient is kept */
    const long noshard[] = {(long)r512(Ta * 4), (long)r512(Tb * 4), Gb, Ga};
    static const fsdp_strategy_t strategies[] = {FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP,
                                                 FSDP_NO_SHARD};
    const size_t want[] = {replay(full, 16), replay(zero2, 12), replay(noshard, 4)};
    fsdp_sim_params_t p;
    fsdp_sim_params_init(&p);
    p.world_size = 2;
    for (int s = 0; s < 3; s++) {
        peak_ctx_t pc = {.strategy = strategies[s]};
        CU_ASSERT_EQUAL_FATAL(launch_checked(&p, peak_rank, &pc), FSDP_OK);
        for (int r = 0; r < 2; r++) {
            if (pc.peak[r] != want[s])
                fprintf(stderr, "\n  %s rank %d: peak %zu, by hand %zu\n",
                        fsdp_strategy_name(strategies[s]), r, pc.peak[r], want[s]);
            CU_ASSERT_EQUAL(pc.peak[r], want[s]);
        }
    }
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"illegal hook transitions", test_illegal_transitions},
        {"runtime events in the trace", test_trace_events},
        {"peak allocated equals the allocation order by hand", test_peak_by_hand},
        {NULL, NULL},
    };
    return fsdp_test_run("hooks order", tests);
}
