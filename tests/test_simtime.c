/* The sim's virtual time and the planner's memory arithmetic, in closed form.
 *
 * The simulator is deterministic and the profile below makes every cost a dyadic rational
 * (rates are powers of two, latencies 0), so the times of a step are compared with the closed
 * forms of FSDP's overlap with ==, not with a tolerance:
 *  - forward: the first all-gather, then only compute, when each all-gather is shorter than the
 *    compute it hides behind;
 *  - backward with BACKWARD_PRE: only the first all-gather and the last reduce-scatter show;
 *  - backward without prefetch: every all-gather waits behind the previous reduce-scatter on
 *    the communicator (NCCL runs one collective at a time), so both are exposed per unit.
 * Then the rate limiter against CPU run-ahead, persistent model-state memory (16 bytes per
 * parameter over N ranks, plus the 512-byte rounding), NCCL's formula against hand-computed
 * numbers from the tables of docs/allocator.md part 2, profile errors, and determinism. */
#include <fsdp/fsdp.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "alloc/alloc_hidden.h"
#include "sim_hidden.h"
#include "test_util.h"

#define MAXU 8
#define MAXW 8

/* 2^30 FLOP/s for GEMMs; everything else free; a 4-rank ring all-gather moves 2^30 B/s of
 * algorithm bandwidth (busBw 3 * 2^28 B/s x 4/3). */
static const char closed_form_json[] =
    "{\"name\": \"closed-form\", \"nodes\": 1, \"gpus_per_node\": 4,"
    " \"gpu\": {\"memory_bytes\": 1099511627776, \"matmul_flops_per_s\": {\"f32\": 1073741824},"
    "  \"vector_flops_per_s\": 0, \"hbm_bytes_per_s\": 0},"
    " \"host\": {\"h2d_bytes_per_s\": 0, \"d2h_bytes_per_s\": 0},"
    " \"nccl\": {\"intra_bus_bytes_per_s\": 805306368}}";

#define P2(e) ldexp(1.0, (e)) /* 2^e */

/* ---- captured log lines ---- */

static char last_log[1024];

static void capture(fsdp_log_level_t level, const char *file, int line, const char *func,
                    const char *msg, void *arg)
{
    (void)level, (void)file, (void)line, (void)func, (void)arg;
    snprintf(last_log, sizeof(last_log), "%s", msg);
}

static void capture_start(void)
{
    last_log[0] = '\0';
    fsdp_log_set_handler(capture, NULL);
}

static void capture_end(void)
{
    fsdp_log_set_handler(NULL, NULL);
}

/* ---- one step of a hand-made model through the hooks ---- */

typedef struct sim_case {
    fsdp_sim_profile_t profile;
    fsdp_sim_mode_t mode;
    int world;
    fsdp_config_t cfg;
    int nunits;
    size_t numel[MAXU];     /* one 1-d parameter per unit */
    double fwd_flops[MAXU]; /* one GEMM per unit and pass */
    double bwd_flops[MAXU];
    int sync_after_forward; /* the host waits for the forward (loss.item()) */
    int optim;              /* then an AdamW step */
    fsdp_trace_t *trace;    /* every rank traces into it, when set */
    /* per rank */
    double t_fwd[MAXW], t_bwd[MAXW];
    int max_live[MAXW]; /* unsharded-parameter blocks allocated or awaiting a stream */
    fsdp_mem_stats_t mem[MAXW];
    fsdp_sim_time_stats_t ts[MAXW];
    fsdp_status_t status[MAXW];
} sim_case_t;

static void case_init(sim_case_t *c, int world, int nunits)
{
    memset(c, 0, sizeof(*c));
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_parse(closed_form_json, &c->profile), FSDP_OK);
    c->mode = FSDP_SIM_SHAPE;
    c->world = world;
    c->nunits = nunits;
    fsdp_config_init(&c->cfg);
}

static void count_live(const fsdp_mem_segment_info_t *seg, const fsdp_mem_block_info_t *b,
                       void *arg)
{
    (void)seg;
    if (b->state != FSDP_MEM_BLOCK_FREE && b->category == FSDP_MEM_UNSHARDED_PARAM)
        (*(int *)arg)++;
}

static void note_live(fsdp_t *fs, int *max_live)
{
    int n = 0;
    fsdp_mem_snapshot(fsdp_memory(fs), count_live, &n);
    if (n > *max_live)
        *max_live = n;
}

/* One GEMM of `flops` FLOPs (m = n = 1, k = flops / 2) on the compute stream. */
static fsdp_status_t gemm(fsdp_dev_t *dev, fsdp_t *fs, void *a, void *c, double flops)
{
    fsdp_kernel_t k = {.kind = FSDP_K_GEMM};

    k.u.gemm.m = 1;
    k.u.gemm.n = 1;
    k.u.gemm.k = (size_t)(flops / 2.0);
    k.u.gemm.alpha = 1.0f;
    k.u.gemm.a = a;
    k.u.gemm.lda = k.u.gemm.k;
    k.u.gemm.b = a;
    k.u.gemm.ldb = k.u.gemm.k;
    k.u.gemm.c = c;
    k.u.gemm.ldc = 1;
    return fsdp_dev_kernel(dev, fsdp_compute_stream(fs), &k);
}

static fsdp_status_t case_rank(fsdp_dev_t *dev, void *arg)
{
    sim_case_t *c = arg;
    int r = dev->rank;
    fsdp_unit_t *root = NULL, *u[MAXU];
    fsdp_optim_t *opt = NULL;
    fsdp_t *fs = NULL;
    fsdp_status_t st;
    double t0, t1;

    if (c->trace != NULL && (st = fsdp_trace_attach(c->trace, dev)) != FSDP_OK)
        return st;
    st = fsdp_create(dev, &c->cfg, &fs);
    if (st != FSDP_OK)
        return st;
    st = fsdp_unit_create(fs, "root", NULL, NULL, 0, &root);
    for (int i = 0; i < c->nunits && st == FSDP_OK; i++) {
        char uname[16], pname[24];
        fsdp_param_spec_t spec;
        memset(&spec, 0, sizeof(spec));
        snprintf(uname, sizeof(uname), "u%d", i);
        snprintf(pname, sizeof(pname), "u%d.w", i);
        spec.name = pname;
        spec.ndim = 1;
        spec.shape[0] = (int64_t)c->numel[i];
        spec.requires_grad = 1;
        spec.tied_to = -1;
        st = fsdp_unit_create(fs, uname, root, &spec, 1, &u[i]);
    }
    if (st == FSDP_OK && c->optim) {
        fsdp_optim_config_t oc;
        fsdp_optim_config_init(&oc, FSDP_OPTIM_ADAMW);
        st = fsdp_optim_create(fs, &oc, &opt);
    }
    if (st == FSDP_OK)
        st = fsdp_dev_stream_synchronize(dev, NULL);
    if (st != FSDP_OK)
        goto out;
    fsdp_sim_time_reset(dev);
    t0 = fsdp_dev_host_time(dev);

    st = fsdp_pre_forward(root);
    for (int i = 0; i < c->nunits && st == FSDP_OK; i++) {
        st = fsdp_pre_forward(u[i]);
        if (st != FSDP_OK)
            break;
        note_live(fs, &c->max_live[r]);
        st = gemm(dev, fs, fsdp_unit_param(u[i], 0), fsdp_unit_param(u[i], 0), c->fwd_flops[i]);
        if (st == FSDP_OK)
            st = fsdp_post_forward(u[i]);
    }
    if (st == FSDP_OK)
        st = fsdp_post_forward(root);
    if (st == FSDP_OK && c->sync_after_forward)
        st = fsdp_dev_stream_synchronize(dev, NULL);
    if (st != FSDP_OK)
        goto out;
    t1 = fsdp_dev_host_time(dev);
    c->t_fwd[r] = t1 - t0;

    st = fsdp_pre_backward(root);
    for (int i = c->nunits - 1; i >= 0 && st == FSDP_OK; i--) {
        void *g = NULL;
        st = fsdp_pre_backward(u[i]);
        if (st != FSDP_OK)
            break;
        note_live(fs, &c->max_live[r]);
        st = fsdp_unit_grad(u[i], 0, &g);
        if (st == FSDP_OK)
            st = gemm(dev, fs, fsdp_unit_param(u[i], 0), g, c->bwd_flops[i]);
        if (st == FSDP_OK)
            st = fsdp_post_backward(u[i]);
    }
    if (st == FSDP_OK)
        st = fsdp_post_backward(root);
    if (st == FSDP_OK)
        st = fsdp_final_callback(fs);
    if (st == FSDP_OK)
        st = fsdp_dev_stream_synchronize(dev, NULL);
    if (st != FSDP_OK)
        goto out;
    c->t_bwd[r] = fsdp_dev_host_time(dev) - t1;
    st = fsdp_sim_time_stats(dev, &c->ts[r]);
    if (st == FSDP_OK && opt != NULL) {
        st = fsdp_optim_step(opt);
        if (st == FSDP_OK)
            st = fsdp_dev_stream_synchronize(dev, NULL);
    }
    fsdp_mem_get_stats(fsdp_memory(fs), &c->mem[r]);
out:
    fsdp_optim_destroy(opt);
    fsdp_destroy(fs);
    fsdp_trace_detach(dev);
    return st;
}

static void run_case(sim_case_t *c)
{
    fsdp_sim_params_t p;

    fsdp_sim_params_init(&p);
    p.world_size = c->world;
    p.mode = c->mode;
    p.timeout_s = 20.0;
    p.profile = c->profile;
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_launch(&p, case_rank, c, c->status), FSDP_OK);
    /* every rank does the same: the same times */
    for (int r = 1; r < c->world; r++) {
        CU_ASSERT_EQUAL(c->t_fwd[r], c->t_fwd[0]);
        CU_ASSERT_EQUAL(c->t_bwd[r], c->t_bwd[0]);
    }
}

/* all-gather (= reduce-scatter) time of a unit of numel f32 elements over W = 4 ranks */
static double ag_time(size_t numel)
{
    return (double)(4 * numel) / P2(30);
}

/* Four units of 2^20 elements: every collective takes a = 2^-8 s. */
static void four_units(sim_case_t *c)
{
    static const double fwd[4] = {4, 3, 8, 4}; /* units of 2^-9 s */
    static const double bwd[4] = {8, 4, 12, 8};

    case_init(c, 4, 4);
    for (int i = 0; i < 4; i++) {
        c->numel[i] = (size_t)1 << 20;
        /* time = flops / 2^30: flops = t * 2^30 */
        c->fwd_flops[i] = fwd[i] * P2(-9) * P2(30);
        c->bwd_flops[i] = bwd[i] * P2(-9) * P2(30);
    }
    c->sync_after_forward = 1;
}

static double sum_s(const double *flops, int n)
{
    double t = 0.0;
    for (int i = 0; i < n; i++)
        t += flops[i] / P2(30);
    return t;
}

static void test_forward_overlap(void)
{
    sim_case_t c;
    double a;

    for (int limit = 0; limit <= 1; limit++) {
        four_units(&c);
        c.cfg.limit_all_gathers = limit;
        run_case(&c);
        a = ag_time(c.numel[0]);
        /* each all-gather (2^-8 s) is shorter than the compute before it (>= 3 * 2^-9 s) */
        CU_ASSERT_EQUAL(c.t_fwd[0], a + sum_s(c.fwd_flops, 4));
    }
    /* an all-gather longer than the compute it hides behind shows through by the difference:
     * unit 1's all-gather (2^-6 s) outlasts unit 0's compute (2 * 2^-9 s) */
    four_units(&c);
    c.numel[1] = (size_t)1 << 22;
    c.fwd_flops[0] = 2 * P2(-9) * P2(30);
    run_case(&c);
    CU_ASSERT_EQUAL(c.t_fwd[0], ag_time(c.numel[0]) + ag_time(c.numel[1]) +
                                    (c.fwd_flops[1] + c.fwd_flops[2] + c.fwd_flops[3]) / P2(30));
}

static void test_backward_prefetch_pre(void)
{
    sim_case_t c;
    double a;

    four_units(&c);
    c.cfg.backward_prefetch = FSDP_BACKWARD_PREFETCH_PRE;
    run_case(&c);
    a = ag_time(c.numel[0]);
    /* only the first all-gather and the last reduce-scatter are exposed */
    CU_ASSERT_EQUAL(c.t_bwd[0], a + sum_s(c.bwd_flops, 4) + a);
    /* the accounting agrees: of the step's communication, exactly those two show */
    CU_ASSERT_EQUAL(c.ts[0].exposed_comm_s, a + a + a); /* + the forward's first all-gather */
    CU_ASSERT_EQUAL(c.ts[0].compute_s, sum_s(c.fwd_flops, 4) + sum_s(c.bwd_flops, 4));
    /* the root owns no parameters: every unit is gathered again for backward */
    CU_ASSERT_EQUAL(c.ts[0].n_colls, 4 + 4 + 4);
    CU_ASSERT_EQUAL(c.ts[0].coll_bytes, 12.0 * 4 * (double)c.numel[0]);
}

static void test_backward_no_prefetch(void)
{
    sim_case_t c;
    double a, expect;

    four_units(&c);
    c.cfg.backward_prefetch = FSDP_BACKWARD_PREFETCH_NONE;
    run_case(&c);
    a = ag_time(c.numel[0]);
    /* unit 3 all-gathers then computes; every later unit's all-gather waits for the previous
     * unit's reduce-scatter on the communicator, and its compute for the all-gather */
    expect = a + c.bwd_flops[3] / P2(30);
    for (int i = 2; i >= 0; i--)
        expect += a + a + c.bwd_flops[i] / P2(30);
    expect += a;
    CU_ASSERT_EQUAL(c.t_bwd[0], expect);

    /* BACKWARD_POST sits in between: the next all-gather is issued before the reduce-scatter,
     * but after the current compute has been issued */
    {
        sim_case_t post;
        four_units(&post);
        post.cfg.backward_prefetch = FSDP_BACKWARD_PREFETCH_POST;
        run_case(&post);
        CU_ASSERT(post.t_bwd[0] < c.t_bwd[0]);
        CU_ASSERT(post.t_bwd[0] >= 2 * a + sum_s(post.bwd_flops, 4));
    }
}

/* Without the limiter the host, far ahead of a slow GPU, issues every all-gather at once: their
 * buffers are all allocated or waiting for the compute stream, and the cache grows to hold
 * them. The limiter keeps at most two freed-but-busy buffers in flight. */
static void test_limiter_bounds_memory(void)
{
    sim_case_t with, without;
    size_t unit_bytes = 4 * ((size_t)1 << 22);

    for (int limit = 0; limit <= 1; limit++) {
        sim_case_t *c = limit ? &with : &without;
        case_init(c, 4, 8);
        for (int i = 0; i < 8; i++) {
            c->numel[i] = (size_t)1 << 22; /* 16 MiB unsharded: its own 16 MiB segment */
            c->fwd_flops[i] = P2(30);      /* 1 s each: the GPU is far behind the host */
            c->bwd_flops[i] = 2 * P2(30);
        }
        c->cfg.limit_all_gathers = limit;
        run_case(c);
    }
    /* the same step time with and without the limiter: the host only waits earlier (the
     * forward's host time differs, the step's end does not); every collective is hidden but
     * the first all-gather and the last reduce-scatter */
    CU_ASSERT_EQUAL(with.t_fwd[0] + with.t_bwd[0], without.t_fwd[0] + without.t_bwd[0]);
    CU_ASSERT_EQUAL(with.t_fwd[0] + with.t_bwd[0], 24.0 + 2 * ag_time(with.numel[0]));
    CU_ASSERT_EQUAL(without.t_fwd[0], 0.0); /* the host never waited in forward */
    /* live unsharded buffers: without the limiter the host never waits, so every buffer of
     * forward and backward is still allocated or awaited by the compute stream; with it, at
     * most 3 (the one in use, the one being gathered, the one the compute stream still reads) */
    CU_ASSERT_EQUAL(without.max_live[0], 16);
    CU_ASSERT(with.max_live[0] <= 3);
    /* that is what the cache must reserve */
    CU_ASSERT(without.mem[0].peak_reserved >= 16 * unit_bytes);
    CU_ASSERT(with.mem[0].peak_reserved < without.mem[0].peak_reserved);
    /* the allocated bytes of unsharded parameters (freed at CPU time, as PyTorch counts them)
     * are the same: the difference is in blocks waiting for the GPU */
    CU_ASSERT_EQUAL(with.mem[0].peak_by_category[FSDP_MEM_UNSHARDED_PARAM],
                    without.mem[0].peak_by_category[FSDP_MEM_UNSHARDED_PARAM]);
}

/* ---- the trace: every op with its virtual interval ---- */

typedef struct trace_check {
    char streams[8][24];
    double last_end[8];
    int n_streams;
    int overlaps, early, n_ag, n_rs, n_gemm;
    double gemm_s;
} trace_check_t;

static int check_event(void *arg, int rank, uint64_t seq, const fsdp_trace_event_t *ev)
{
    trace_check_t *t = arg;
    int i;

    (void)rank, (void)seq;
    if (ev->stream == NULL ||
        (ev->kind != FSDP_EV_KERNEL && ev->kind != FSDP_EV_COPY && ev->kind != FSDP_EV_COLLECTIVE))
        return 0;
    for (i = 0; i < t->n_streams && strcmp(t->streams[i], ev->stream) != 0; i++)
        ;
    if (i == t->n_streams && i < 8)
        snprintf(t->streams[t->n_streams++], sizeof(t->streams[0]), "%s", ev->stream);
    if (i < 8) {
        /* a stream runs its work in issue order, one op at a time */
        t->overlaps += ev->start < t->last_end[i];
        t->last_end[i] = ev->end;
    }
    t->early += ev->start < ev->host_time || ev->end < ev->start;
    t->n_ag += ev->kind == FSDP_EV_COLLECTIVE && strcmp(ev->name, "all_gather") == 0;
    t->n_rs += ev->kind == FSDP_EV_COLLECTIVE && strcmp(ev->name, "reduce_scatter") == 0;
    if (ev->kind == FSDP_EV_KERNEL && strcmp(ev->name, "gemm") == 0) {
        t->n_gemm++;
        t->gemm_s += ev->end - ev->start;
    }
    return 0;
}

static void test_trace_intervals(void)
{
    char path[] = "/tmp/fsdp-simtime-XXXXXX";
    fsdp_trace_run_info_t info = {.backend = "sim", .world_size = 4, .strategy = "full_shard"};
    fsdp_trace_reader_t *rd;
    trace_check_t t;
    sim_case_t c;
    int64_t run = 0;
    char *profile;
    int fd = mkstemp(path);

    CU_ASSERT_FATAL(fd >= 0);
    close(fd);
    unlink(path);
    four_units(&c);
    profile = fsdp_sim_profile_to_json(&c.profile);
    info.profile_json = profile;
    CU_ASSERT_EQUAL_FATAL(fsdp_trace_open(path, &info, &c.trace), FSDP_OK);
    run_case(&c);
    CU_ASSERT_EQUAL(fsdp_trace_close(c.trace), FSDP_OK);
    free(profile);
    memset(&t, 0, sizeof(t));
    CU_ASSERT_EQUAL_FATAL(fsdp_trace_reader_open(path, &rd), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_trace_reader_find_run(rd, 0, &run), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_trace_reader_events(rd, run, 0, check_event, &t), FSDP_OK);
    fsdp_trace_reader_close(rd);
    unlink(path);
    CU_ASSERT(t.n_streams >= 3); /* compute, unshard, post_backward */
    CU_ASSERT_EQUAL(t.overlaps, 0);
    CU_ASSERT_EQUAL(t.early, 0);
    CU_ASSERT_EQUAL(t.n_ag, 8);
    CU_ASSERT_EQUAL(t.n_rs, 4);
    CU_ASSERT_EQUAL(t.n_gemm, 8);
    CU_ASSERT_EQUAL(t.gemm_s, sum_s(c.fwd_flops, 4) + sum_s(c.bwd_flops, 4));
}

/* ---- persistent model state ---- */

static size_t round512(size_t b)
{
    return (b + 511) / 512 * 512;
}

static void test_model_state_memory(void)
{
    static const size_t numels[][3] = {
        {1 << 20, 1 << 18, 3 << 16}, /* multiples of 128 * N: exactly 16 psi / N */
        {1000, 777, 4099},           /* padding and rounding */
    };
    static const int worlds[] = {2, 4, 8};

    for (size_t m = 0; m < sizeof(numels) / sizeof(numels[0]); m++) {
        for (size_t w = 0; w < sizeof(worlds) / sizeof(worlds[0]); w++) {
            for (int strat = 0; strat < 2; strat++) {
                sim_case_t c;
                size_t psi = 0, expect = 0, got;
                int n = worlds[w];
                case_init(&c, n, 3);
                c.cfg.strategy = strat ? FSDP_NO_SHARD : FSDP_FULL_SHARD;
                c.optim = 1;
                for (int i = 0; i < 3; i++) {
                    size_t s = strat ? numels[m][i] : (numels[m][i] + n - 1) / n;
                    c.numel[i] = numels[m][i];
                    c.fwd_flops[i] = c.bwd_flops[i] = 2.0;
                    psi += numels[m][i];
                    /* f32 shard + f32 sharded grad + AdamW exp_avg and exp_avg_sq */
                    expect += 4 * round512(4 * s);
                }
                run_case(&c);
                for (int r = 0; r < n; r++) {
                    const size_t *cat = c.mem[r].by_category;
                    got = cat[FSDP_MEM_SHARDED_PARAM] + cat[FSDP_MEM_GRADIENT] +
                          cat[FSDP_MEM_OPTIMIZER_STATE];
                    CU_ASSERT_EQUAL(got, expect);
                    CU_ASSERT_EQUAL(cat[FSDP_MEM_OPTIMIZER_STATE], expect / 2);
                }
                if (m == 0) /* no padding: ZeRO-3's 16 psi / N and plain replication's 16 psi */
                    CU_ASSERT_EQUAL(expect, strat ? 16 * psi : 16 * psi / (size_t)n);
            }
        }
    }
}

/* ---- NCCL's formula against the worked examples of docs/allocator.md section 2.5 ---- */

static void close_to(double got, double want, double rel)
{
    CU_ASSERT(fabs(got - want) <= rel * fabs(want));
    if (!(fabs(got - want) <= rel * fabs(want)))
        fprintf(stderr, "got %.12g, want %.12g\n", got, want);
}

static void test_nccl_formula(void)
{
    fsdp_sim_profile_t h100, a100, ring;
    fsdp_sim_coll_cost_t cc;
    double gib = P2(30), mib = P2(20), t;

    CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_preset("h100", &h100), FSDP_OK);
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_preset("a100", &a100), FSDP_OK);

    /* 8xH100 ring all-gather, Simple, 1 GiB: 8.4 + 7 x 3.4 us, algBw = 370 x 8/7 GB/s, on all 32
     * channels, after the 10.3 us floor: 2,581 us */
    t = fsdp_sim_coll_time(&h100, FSDP_SIM_COLL_ALL_GATHER, 8, 1, gib, &cc);
    CU_ASSERT_EQUAL(cc.algo, FSDP_SIM_ALGO_RING);
    CU_ASSERT_EQUAL(cc.proto, FSDP_SIM_PROTO_SIMPLE);
    CU_ASSERT_EQUAL(cc.channels, 32);
    close_to(cc.latency_s, 32.2e-6, 1e-12);
    close_to(cc.floor_s, 10.3e-6, 1e-12);
    close_to(cc.algo_bytes_per_s, 370e9 * 8 / 7, 1e-12);
    close_to(t, 10.3e-6 + 32.2e-6 + gib / (370e9 * 8 / 7), 1e-12);
    CU_ASSERT(fabs(t - 2581e-6) < 1e-6);
    /* 1 MiB: LL wins, 6.6 + 7 x 0.6 us and min(141, 370/2) x 8/7 GB/s on 1 MiB / (4096 B x 8
     * ranks) = 32 channels: 10.3 + 17.3 us */
    t = fsdp_sim_coll_time(&h100, FSDP_SIM_COLL_ALL_GATHER, 8, 1, mib, &cc);
    CU_ASSERT_EQUAL(cc.proto, FSDP_SIM_PROTO_LL);
    CU_ASSERT_EQUAL(cc.channels, 32);
    close_to(cc.latency_s, 10.8e-6, 1e-12);
    close_to(t, 10.3e-6 + 10.8e-6 + mib / (141e9 * 8 / 7), 1e-12);
    CU_ASSERT(fabs(t - 27.6e-6) < 0.05e-6);

    /* 2 nodes x 8 GPUs, ring all-reduce, Simple, Intel hosts: 8.4 + 28 x 3.4 + 2 x 14 us
     * = 131.6 us, x 1.4 on the plateau = 184.24 us */
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_parse("{\"base\": \"h100\", \"nccl\": {\"algorithms\":"
                                                 " [\"ring\"], \"protocols\": [\"simple\"]}}",
                                                 &ring),
                          FSDP_OK);
    t = fsdp_sim_coll_time(&ring, FSDP_SIM_COLL_ALL_REDUCE, 16, 2, 16.0, &cc);
    close_to(cc.latency_s, 131.6e-6, 1e-12);
    t = fsdp_sim_coll_time(&ring, FSDP_SIM_COLL_ALL_REDUCE, 16, 2, gib, &cc);
    close_to(cc.latency_s, 131.6e-6 * 1.4, 1e-12);
    /* across nodes the ring runs at the slower of NVLink (370) and 8 NICs x 47 GB/s */
    close_to(cc.algo_bytes_per_s, 370e9 * 16 / 30, 1e-12);
    t = fsdp_sim_coll_time(&ring, FSDP_SIM_COLL_ALL_REDUCE, 4, 4, gib, &cc); /* 1 GPU/node */
    close_to(cc.algo_bytes_per_s, 47e9 * 4 / 6, 1e-12);
    /* one rank per node pays the tree's network latency per step: 8.4 + 6 x 14 us, x 1.4 */
    close_to(cc.latency_s, (8.4e-6 + 6 * 14e-6) * 1.4, 1e-12);

    /* measured busbw at 8 GB (nccl-tests, Azure): A100 231.58 GB/s (ring), H100 ~480 (NVLS) */
    t = fsdp_sim_coll_time(&a100, FSDP_SIM_COLL_ALL_REDUCE, 8, 1, 8e9, &cc);
    CU_ASSERT_EQUAL(cc.algo, FSDP_SIM_ALGO_RING);
    close_to(cc.algo_bytes_per_s * 14 / 8, 231.58e9, 1e-12);
    close_to(8e9 / t * 14 / 8, 231.58e9, 2e-3); /* the floor and latency: 86 of 64,998 us */
    t = fsdp_sim_coll_time(&h100, FSDP_SIM_COLL_ALL_REDUCE, 8, 1, 8e9, &cc);
    CU_ASSERT_EQUAL(cc.algo, FSDP_SIM_ALGO_NVLS);
    close_to(8e9 / t * 14 / 8, 480e9, 2e-3);
    /* tree all-reduce across 4 nodes: 8.4 + 2 x (7 x 4.0 + log2(4) x 14) us */
    {
        fsdp_sim_profile_t tree;
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_parse("{\"base\": \"h100\", \"nccl\": "
                                                     "{\"algorithms\": [\"ring\", \"tree\"], "
                                                     "\"protocols\": [\"simple\"]}}",
                                                     &tree),
                              FSDP_OK);
        t = fsdp_sim_coll_time(&tree, FSDP_SIM_COLL_ALL_REDUCE, 32, 4, 4096.0, &cc);
        CU_ASSERT_EQUAL(cc.algo, FSDP_SIM_ALGO_TREE);
        close_to(cc.latency_s, 8.4e-6 + 2 * (7 * 4.0e-6 + 2 * 14e-6), 1e-12);
    }
    /* a group of one rank copies its buffer */
    t = fsdp_sim_coll_time(&h100, FSDP_SIM_COLL_ALL_GATHER, 1, 1, gib, &cc);
    close_to(t, 2 * gib / (3350e9 * 0.87) + 1.2e-6, 1e-12);
    /* kernels by roofline */
    {
        fsdp_kernel_t k = {.kind = FSDP_K_GEMM};
        k.u.gemm.m = k.u.gemm.n = k.u.gemm.k = 8192;
        /* 32 x 64 tiles of 128 x 256 on 132 SMs: 16 waves, 2,048 of 2,112 slots busy */
        close_to(fsdp_sim_kernel_time(&h100, &k),
                 2.0 * 8192 * 8192 * 8192 / (66.9e12 * 0.80 * 2048 / 2112) + 1.2e-6, 1e-12);
        h100.gpu.allow_tf32 = 1;
        close_to(fsdp_sim_kernel_time(&h100, &k),
                 2.0 * 8192 * 8192 * 8192 / (494.7e12 * 0.80 * 2048 / 2112) + 1.2e-6, 1e-12);
        k.kind = FSDP_K_FILL; /* memory-bound */
        k.u.fill.n = 1 << 28;
        k.u.fill.dtype = FSDP_DTYPE_F32;
        close_to(fsdp_sim_kernel_time(&h100, &k), 4.0 * (1 << 28) / (3350e9 * 0.87) + 1.2e-6,
                 1e-12);
        close_to(fsdp_sim_copy_time(&h100, FSDP_SIM_COPY_H2D, gib), gib / 51e9 + 1.2e-6, 1e-12);
        /* FSDP2's group_copy: one memory-bound launch of its parts' bytes summed (2^27 f32
         * copied, 2^26 bf16 widened to f32), one latency for the group */
        fsdp_copy_part_t parts[2] = {{.rows = 1,
                                      .cols = 1 << 27,
                                      .src_n = SIZE_MAX,
                                      .dst_dtype = FSDP_DTYPE_F32,
                                      .src_dtype = FSDP_DTYPE_F32},
                                     {.rows = 2,
                                      .cols = 1 << 25,
                                      .src_ld = 1 << 25,
                                      .src_n = SIZE_MAX,
                                      .first = 1 << 27,
                                      .dst_dtype = FSDP_DTYPE_F32,
                                      .src_dtype = FSDP_DTYPE_BF16}};
        k.kind = FSDP_K_GROUP_COPY;
        k.u.group_copy.parts = parts;
        k.u.group_copy.nparts = 2;
        close_to(fsdp_sim_kernel_time(&h100, &k),
                 (8.0 * (1 << 27) + 6.0 * (1 << 26)) / (3350e9 * 0.87) + 1.2e-6, 1e-12);
    }
}

/* The compute model's terms by hand: tile and wave quantization, fused attention's blocks, and
 * an eager kernel's ops (docs/costs.md). */
static void test_compute_model(void)
{
    fsdp_sim_profile_t h100;
    fsdp_kernel_t k;
    double bw = 3350e9 * 0.87;
    /* eager element-wise ops reach 0.81 of the H100's bandwidth, not a copy's 0.87
     * (elementwise_memory_efficiency) */
    double ew = 3350e9 * 0.81;
    int ops;

    CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_preset("h100", &h100), FSDP_OK);
    /* 8192 x 4096 on 132 SMs: 32 x 32 whole tiles, 1,024 of them in 8 waves of 132 */
    close_to(fsdp_sim_gemm_quantization(8192, 4096, 1, 132), 1024.0 / 1056.0, 1e-15);
    close_to(fsdp_sim_gemm_quantization(4096, 8192, 1, 132), 1024.0 / 1056.0, 1e-15);
    /* 100 x 300 on 4 SMs: 2 tiles of 128 x 256 and 3 of 128 x 128 leave SMs idle, 64 x 128 is
     * 2 x 3 = 6 tiles, 30,000 of 49,152 elements, in 2 waves of 4: 6 of 8 slots */
    close_to(fsdp_sim_gemm_quantization(100, 300, 1, 4), 30000.0 / 49152.0 * 0.75, 1e-15);
    /* 100 x 300 on 132 SMs: no tile fills them, 64 x 64 is 2 x 5 = 10 tiles of 64 x 64 */
    close_to(fsdp_sim_gemm_quantization(100, 300, 1, 132),
             30000.0 / (10 * 4096.0) * 10.0 / 132.0, 1e-15);
    /* 3 products of one whole tile on 2 SMs: 2 waves, 3 of 4 slots */
    close_to(fsdp_sim_gemm_quantization(128, 256, 3, 2), 0.75, 1e-15);
    close_to(fsdp_sim_gemm_quantization(100, 300, 1, 0), 1.0, 0);
    /* attention: 2 x 32 heads x 32 blocks of 128 queries on 132 SMs; 200 queries are 2 blocks,
     * 200 of 256 rows */
    close_to(fsdp_sim_attention_quantization(2, 32, 4096, 132), 2048.0 / 2112.0, 1e-15);
    close_to(fsdp_sim_attention_quantization(1, 1, 200, 1), 200.0 / 256.0, 1e-15);
    /* an H100 bf16 GEMM: 8192 x 11008 x 4096 is 64 x 43 whole tiles, 2,752 in 21 waves */
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_GEMM;
    k.u.gemm.m = 8192;
    k.u.gemm.n = 11008;
    k.u.gemm.k = 4096;
    k.u.gemm.a_dtype = k.u.gemm.b_dtype = k.u.gemm.c_dtype = FSDP_DTYPE_BF16;
    close_to(fsdp_sim_kernel_time(&h100, &k),
             2.0 * 8192 * 11008 * 4096 / (989.4e12 * 0.80 * 2752.0 / 2772.0) + 1.2e-6, 1e-12);
    /* GPT-2's LM head, [8192, 768] x [768, 50257] into logits with rows of 50,257 bf16: not a
     * multiple of 16 bytes, so at 0.14 of the aligned rate; padded to 50,304 it is aligned; in
     * f32 (CUDA cores) alignment does not count */
    k.u.gemm.m = 8192;
    k.u.gemm.n = 50257;
    k.u.gemm.k = 768;
    k.u.gemm.trans_b = 1;
    k.u.gemm.lda = 768;
    k.u.gemm.ldb = 768;
    k.u.gemm.ldc = 50257;
    close_to(fsdp_sim_kernel_time(&h100, &k),
             2.0 * 8192 * 50257 * 768 /
                     (989.4e12 * 0.80 * fsdp_sim_gemm_quantization(8192, 50257, 1, 132) * 0.14) +
                 1.2e-6,
             1e-12);
    k.u.gemm.n = k.u.gemm.ldc = 50304;
    close_to(fsdp_sim_kernel_time(&h100, &k),
             2.0 * 8192 * 50304 * 768 /
                     (989.4e12 * 0.80 * fsdp_sim_gemm_quantization(8192, 50304, 1, 132)) +
                 1.2e-6,
             1e-12);
    k.u.gemm.n = k.u.gemm.ldc = 50257;
    k.u.gemm.a_dtype = k.u.gemm.b_dtype = k.u.gemm.c_dtype = FSDP_DTYPE_F32;
    close_to(fsdp_sim_kernel_time(&h100, &k),
             2.0 * 8192 * 50257 * 768 /
                     (66.9e12 * 0.80 * fsdp_sim_gemm_quantization(8192, 50257, 1, 132)) +
                 1.2e-6,
             1e-12);
    /* an odd leading dimension of A (a column block of a wider matrix) counts as well */
    k.u.gemm.a_dtype = k.u.gemm.b_dtype = k.u.gemm.c_dtype = FSDP_DTYPE_BF16;
    k.u.gemm.n = k.u.gemm.ldc = 50304;
    k.u.gemm.lda = 769;
    close_to(fsdp_sim_kernel_time(&h100, &k),
             2.0 * 8192 * 50304 * 768 /
                     (989.4e12 * 0.80 * fsdp_sim_gemm_quantization(8192, 50304, 1, 132) * 0.14) +
                 1.2e-6,
             1e-12);
    /* causal attention forward, 2 x 32 heads of 128, 4,096 tokens: 4 hd B H T (T + 1) / 2 */
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_ATTENTION_FWD;
    k.u.attention_fwd.batch = 2;
    k.u.attention_fwd.seq = 4096;
    k.u.attention_fwd.heads = k.u.attention_fwd.kv_heads = 32;
    k.u.attention_fwd.head_dim = 128;
    k.u.attention_fwd.causal = 1;
    k.u.attention_fwd.dtype = FSDP_DTYPE_BF16;
    /* eager: and the output's copy from SDPA's [B, H, T, hd] layout, n = 2^25 elements on the
     * non-vectorized path: 2^25 / 0.3e12 s, longer than its 4 x 2^25 bytes / (3.35e12 x 0.87) */
    close_to(fsdp_sim_kernel_time(&h100, &k),
             4.0 * 128 * 2 * 32 * 4096.0 * 4097 / 2 / (989.4e12 * 0.26 * 2048 / 2112) + 1.2e-6 +
                 33554432.0 / 0.3e12 + 1.2e-6,
             1e-12);
    CU_ASSERT_EQUAL(fsdp_sim_kernel_launches(&h100, &k), 2);
    /* its backward copies two such tensors */
    k.kind = FSDP_K_ATTENTION_BWD;
    CU_ASSERT_EQUAL(fsdp_sim_kernel_launches(&h100, &k), 3);
    h100.ops = FSDP_SIM_OPS_FUSED;
    CU_ASSERT_EQUAL(fsdp_sim_kernel_launches(&h100, &k), 1);
    h100.ops = FSDP_SIM_OPS_EAGER;

    /* HF's RMSNorm forward on 8 rows of 64 bf16 (n = 512), eager: to(f32) 2n + 4n, pow 4n + 4n,
     * mean 4n + 4r, + eps 4r + 4r, rsqrt 4r + 4r, * rstd 4n + 4r + 4n, to(bf16) 4n + 2n,
     * weight * 2n + 2c + 2n: 36 n + 24 r + 2 c = 18,752 bytes in 8 kernels */
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_RMSNORM_FWD;
    k.u.rmsnorm_fwd.rows = 8;
    k.u.rmsnorm_fwd.cols = 64;
    k.u.rmsnorm_fwd.dtype = FSDP_DTYPE_BF16;
    close_to(fsdp_sim_eager_bytes(&k, &ops), 18752.0, 0);
    CU_ASSERT_EQUAL(ops, 8);
    CU_ASSERT_EQUAL(fsdp_sim_kernel_launches(&h100, &k), 8);
    /* to(f32), * rstd and weight * take the non-vectorized path (a conversion, two
     * broadcasts): each n / 0.3e12 s, longer than their 6n, 8n + 4r and 4n + 2c bytes
     * (9,376 B); the other five are their bytes (9,376 B) */
    close_to(fsdp_sim_kernel_time(&h100, &k), 9376.0 / ew + 3 * 512 / 0.3e12 + 8 * 1.2e-6,
             1e-12);
    /* without that rate, every op is its bytes */
    h100.gpu.strided_elements_per_s = 0.0;
    close_to(fsdp_sim_kernel_time(&h100, &k), 18752.0 / ew + 8 * 1.2e-6, 1e-12);
    /* and with elementwise_memory_efficiency 0, at a copy's memory_efficiency */
    h100.gpu.elementwise_memory_efficiency = 0.0;
    close_to(fsdp_sim_kernel_time(&h100, &k), 18752.0 / bw + 8 * 1.2e-6, 1e-12);
    h100.gpu.elementwise_memory_efficiency = 0.81;
    h100.gpu.strided_elements_per_s = 0.3e12;
    /* fused: x, y, weight, rstd in one kernel: 2 x 2n + 2c + 4r */
    h100.ops = FSDP_SIM_OPS_FUSED;
    CU_ASSERT_EQUAL(fsdp_sim_kernel_launches(&h100, &k), 1);
    close_to(fsdp_sim_kernel_time(&h100, &k), (4.0 * 512 + 128 + 32) / bw + 1.2e-6, 1e-12);
    h100.ops = FSDP_SIM_OPS_EAGER;
    /* SwiGLU's backward on 1,000 bf16: three multiplies of two tensors into one, 9 e n */
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_SWIGLU_BWD;
    k.u.swiglu_bwd.n = 1000;
    k.u.swiglu_bwd.dtype = FSDP_DTYPE_BF16;
    close_to(fsdp_sim_eager_bytes(&k, &ops), 18000.0, 0);
    CU_ASSERT_EQUAL(ops, 3);
    /* HF's gelu_new on 1,000 bf16: 8 ops forward (18 e n bytes), 11 backward (28 e n) */
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_GELU_FWD;
    k.u.gelu_fwd.n = 1000;
    k.u.gelu_fwd.dtype = FSDP_DTYPE_BF16;
    close_to(fsdp_sim_eager_bytes(&k, &ops), 36000.0, 0);
    CU_ASSERT_EQUAL(ops, 8);
    close_to(fsdp_sim_kernel_time(&h100, &k), 36000.0 / ew + 8 * 1.2e-6, 1e-12);
    k.kind = FSDP_K_GELU_BWD;
    k.u.gelu_bwd.n = 1000;
    k.u.gelu_bwd.dtype = FSDP_DTYPE_BF16;
    close_to(fsdp_sim_eager_bytes(&k, &ops), 56000.0, 0);
    CU_ASSERT_EQUAL(ops, 11);
    /* GPT-2's eager attention scores, 2 x 1024 x 1024 bf16 (n = 2^21), causal: the scaling and
     * the softmax by their bytes (2 e n each), the mask add broadcast, n / 0.3e12 s */
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_SOFTMAX_FWD;
    k.u.softmax_fwd.rows = 2048;
    k.u.softmax_fwd.cols = 1024;
    k.u.softmax_fwd.causal = 1;
    k.u.softmax_fwd.dtype = FSDP_DTYPE_BF16;
    CU_ASSERT_EQUAL(fsdp_sim_kernel_launches(&h100, &k), 3);
    close_to(fsdp_sim_kernel_time(&h100, &k),
             2 * 4.0 * 2097152 / ew + 2097152 / 0.3e12 + 3 * 1.2e-6, 1e-12);
    k.u.softmax_fwd.causal = 0;
    CU_ASSERT_EQUAL(fsdp_sim_kernel_launches(&h100, &k), 2);
    /* with the head size (2 heads of 64, n = 2048 x 64 = 131,072 elements of q, k, v), four
     * strided copies between the layouts: each n / 0.3e12 s, longer than its 4n bytes */
    k.u.softmax_fwd.causal = 1;
    k.u.softmax_fwd.head_dim = 64;
    CU_ASSERT_EQUAL(fsdp_sim_kernel_launches(&h100, &k), 7);
    close_to(fsdp_sim_kernel_time(&h100, &k),
             2 * 4.0 * 2097152 / ew + 2097152 / 0.3e12 + 3 * 1.2e-6 +
                 4 * (131072 / 0.3e12 + 1.2e-6),
             1e-12);
    /* its backward: grad * output, the softmax's kernel and the scaling's backward by their
     * bytes (6, 6 and 4 e n), then three such copies and the cat of the three gradients (3n) */
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_SOFTMAX_BWD;
    k.u.softmax_bwd.rows = 2048;
    k.u.softmax_bwd.cols = 1024;
    k.u.softmax_bwd.causal = 1;
    k.u.softmax_bwd.dtype = FSDP_DTYPE_BF16;
    CU_ASSERT_EQUAL(fsdp_sim_kernel_launches(&h100, &k), 3);
    close_to(fsdp_sim_kernel_time(&h100, &k), 16.0 * 2097152 / ew + 3 * 1.2e-6, 1e-12);
    k.u.softmax_bwd.head_dim = 64;
    CU_ASSERT_EQUAL(fsdp_sim_kernel_launches(&h100, &k), 7);
    close_to(fsdp_sim_kernel_time(&h100, &k),
             16.0 * 2097152 / ew + 3 * 1.2e-6 + 3 * (131072 / 0.3e12 + 1.2e-6) +
                 3 * 131072 / 0.3e12 + 1.2e-6,
             1e-12);
    h100.ops = FSDP_SIM_OPS_FUSED;
    CU_ASSERT_EQUAL(fsdp_sim_kernel_launches(&h100, &k), 1);
    h100.ops = FSDP_SIM_OPS_EAGER;
    /* an f32 RMSNorm has no casts: 6 kernels */
    memset(&k, 0, sizeof(k));
    k.kind = FSDP_K_RMSNORM_FWD;
    k.u.rmsnorm_fwd.rows = 8;
    k.u.rmsnorm_fwd.cols = 64;
    k.u.rmsnorm_fwd.dtype = FSDP_DTYPE_F32;
    fsdp_sim_eager_bytes(&k, &ops);
    CU_ASSERT_EQUAL(ops, 6);
}

/* The terms beyond NCCL's tuning model (docs/costs.md), each in closed form. */
static void test_nccl_terms(void)
{
    fsdp_sim_profile_t h100, a100, p;
    fsdp_sim_coll_cost_t cc;
    double t, ll, ll128, simple, s;

    CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_preset("h100", &h100), FSDP_OK);
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_preset("a100", &a100), FSDP_OK);

    /* the floor at 8 B: ring LL (6.6 + 14 x 0.6 us) on one channel after the 10.3 us floor */
    t = fsdp_sim_coll_time(&h100, FSDP_SIM_COLL_ALL_REDUCE, 8, 1, 8.0, &cc);
    CU_ASSERT_EQUAL(cc.algo, FSDP_SIM_ALGO_RING);
    CU_ASSERT_EQUAL(cc.proto, FSDP_SIM_PROTO_LL);
    CU_ASSERT_EQUAL(cc.channels, 1);
    close_to(cc.floor_s, 10.3e-6, 1e-12);
    close_to(cc.latency_s, 15.0e-6, 1e-12);
    close_to(t, 10.3e-6 + 15.0e-6 + 8.0 / (141e9 * 8 / 14 / 32), 1e-12);
    t = fsdp_sim_coll_time(&a100, FSDP_SIM_COLL_ALL_REDUCE, 8, 1, 8.0, &cc);
    close_to(cc.floor_s, 29.5e-6, 1e-12);
    /* across nodes the network floor adds */
    p = h100;
    p.nccl.net_floor_s = 20e-6;
    fsdp_sim_coll_time(&p, FSDP_SIM_COLL_ALL_REDUCE, 16, 2, 8.0, &cc);
    close_to(cc.floor_s, 30.3e-6, 1e-12);
    fsdp_sim_coll_time(&p, FSDP_SIM_COLL_ALL_REDUCE, 8, 1, 8.0, &cc);
    close_to(cc.floor_s, 10.3e-6, 1e-12);

    /* channels around the thresholds: Simple drops one below channels x 32 KiB, ring LL below
     * channels x 4 KiB x nranks, LL128 below channels x 5 KiB */
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_parse("{\"base\": \"h100\", \"nccl\": {\"algorithms\":"
                                                 " [\"ring\"], \"protocols\": [\"simple\"]}}",
                                                 &p),
                          FSDP_OK);
    fsdp_sim_coll_time(&p, FSDP_SIM_COLL_ALL_GATHER, 8, 1, 5 * 32768.0 - 1, &cc);
    CU_ASSERT_EQUAL(cc.channels, 4);
    fsdp_sim_coll_time(&p, FSDP_SIM_COLL_ALL_GATHER, 8, 1, 5 * 32768.0, &cc);
    CU_ASSERT_EQUAL(cc.channels, 5);
    close_to(cc.algo_bytes_per_s, 370e9 * 8 / 7 * 5 / 32, 1e-12);
    fsdp_sim_coll_time(&p, FSDP_SIM_COLL_ALL_GATHER, 8, 1, 32 * 32768.0 - 1, &cc);
    CU_ASSERT_EQUAL(cc.channels, 31);
    fsdp_sim_coll_time(&p, FSDP_SIM_COLL_ALL_GATHER, 8, 1, 32 * 32768.0, &cc);
    CU_ASSERT_EQUAL(cc.channels, 32);
    fsdp_sim_coll_time(&p, FSDP_SIM_COLL_ALL_GATHER, 8, 1, 100.0, &cc);
    CU_ASSERT_EQUAL(cc.channels, 1);
    p.nccl.protocols = 1u << FSDP_SIM_PROTO_LL;
    fsdp_sim_coll_time(&p, FSDP_SIM_COLL_ALL_GATHER, 8, 1, 3 * 32768.0 - 1, &cc);
    CU_ASSERT_EQUAL(cc.channels, 2);
    fsdp_sim_coll_time(&p, FSDP_SIM_COLL_ALL_GATHER, 16, 2, 3 * 65536.0, &cc);
    CU_ASSERT_EQUAL(cc.channels, 3);
    p.nccl.protocols = 1u << FSDP_SIM_PROTO_LL128;
    fsdp_sim_coll_time(&p, FSDP_SIM_COLL_ALL_GATHER, 8, 1, 7 * 5120.0 - 1, &cc);
    CU_ASSERT_EQUAL(cc.channels, 6);
    fsdp_sim_coll_time(&p, FSDP_SIM_COLL_ALL_GATHER, 8, 1, 7 * 5120.0, &cc);
    CU_ASSERT_EQUAL(cc.channels, 7);

    /* protocol switch points of an 8xH100 all-gather, where NCCL's tuning times cross:
     * LL 10.8 us + S / 161.1 GB/s, LL128 27.3 us + S / (0.92 x 370 x 8/7), Simple 32.2 us + S /
     * (370 x 8/7) */
    ll = 141e9 * 8 / 7;
    ll128 = 0.92 * 370e9 * 8 / 7;
    simple = 370e9 * 8 / 7;
    s = (27.3e-6 - 10.8e-6) / (1 / ll - 1 / ll128);
    fsdp_sim_coll_time(&h100, FSDP_SIM_COLL_ALL_GATHER, 8, 1, 0.99 * s, &cc);
    CU_ASSERT_EQUAL(cc.proto, FSDP_SIM_PROTO_LL);
    fsdp_sim_coll_time(&h100, FSDP_SIM_COLL_ALL_GATHER, 8, 1, 1.01 * s, &cc);
    CU_ASSERT_EQUAL(cc.proto, FSDP_SIM_PROTO_LL128);
    s = (32.2e-6 - 27.3e-6) / (1 / ll128 - 1 / simple);
    fsdp_sim_coll_time(&h100, FSDP_SIM_COLL_ALL_GATHER, 8, 1, 0.99 * s, &cc);
    CU_ASSERT_EQUAL(cc.proto, FSDP_SIM_PROTO_LL128);
    fsdp_sim_coll_time(&h100, FSDP_SIM_COLL_ALL_GATHER, 8, 1, 1.01 * s, &cc);
    CU_ASSERT_EQUAL(cc.proto, FSDP_SIM_PROTO_SIMPLE);
    /* algorithm switch: ring LL (15 us, 141 x 8/14) to NVLS (25 us, 480 x 8/14) */
    s = (25e-6 - 15e-6) / (1 / (141e9 * 8 / 14) - 1 / (480e9 * 8 / 14));
    fsdp_sim_coll_time(&h100, FSDP_SIM_COLL_ALL_REDUCE, 8, 1, 0.99 * s, &cc);
    CU_ASSERT_EQUAL(cc.algo, FSDP_SIM_ALGO_RING);
    fsdp_sim_coll_time(&h100, FSDP_SIM_COLL_ALL_REDUCE, 8, 1, 1.01 * s, &cc);
    CU_ASSERT_EQUAL(cc.algo, FSDP_SIM_ALGO_NVLS);
    /* NVLS runs on its 16 channels at any size, on and off */
    t = fsdp_sim_coll_time(&h100, FSDP_SIM_COLL_ALL_REDUCE, 8, 1, 64.0 * P2(20), &cc);
    CU_ASSERT_EQUAL(cc.algo, FSDP_SIM_ALGO_NVLS);
    CU_ASSERT_EQUAL(cc.channels, 16);
    close_to(t, 10.3e-6 + 25e-6 + 64.0 * P2(20) / (480e9 * 8 / 14), 1e-12);
    p = h100;
    p.nccl.nvls_bus_bytes_per_s = 0.0;
    fsdp_sim_coll_time(&p, FSDP_SIM_COLL_ALL_REDUCE, 8, 1, 64.0 * P2(20), &cc);
    CU_ASSERT_EQUAL(cc.algo, FSDP_SIM_ALGO_RING);
    fsdp_sim_coll_time(&p, FSDP_SIM_COLL_ALL_REDUCE, 16, 2, P2(30), &cc);
    CU_ASSERT(cc.algo != FSDP_SIM_ALGO_NVLS_TREE);
    fsdp_sim_coll_time(&a100, FSDP_SIM_COLL_ALL_REDUCE, 16, 2, P2(30), &cc);
    CU_ASSERT(cc.algo != FSDP_SIM_ALGO_NVLS_TREE && cc.algo != FSDP_SIM_ALGO_NVLS);
    /* NVLS needs two ranks or more on a node: not for one rank per node */
    fsdp_sim_coll_time(&h100, FSDP_SIM_COLL_ALL_REDUCE, 16, 16, P2(30), &cc);
    CU_ASSERT(cc.algo != FSDP_SIM_ALGO_NVLS_TREE && cc.algo != FSDP_SIM_ALGO_NVLS);

    /* across nodes: NVLS-tree for a large all-reduce of 2 x 8 H100, 25 + 2 x log2(2) x 20.9 us,
     * busBw min(480, 8 NICs x 47, 16 x 57.7) = 376 GB/s x 16/30 */
    t = fsdp_sim_coll_time(&h100, FSDP_SIM_COLL_ALL_REDUCE, 16, 2, P2(30), &cc);
    CU_ASSERT_EQUAL(cc.algo, FSDP_SIM_ALGO_NVLS_TREE);
    close_to(cc.latency_s, 66.8e-6, 1e-12);
    close_to(t, 10.3e-6 + 66.8e-6 + P2(30) / (376e9 * 16 / 30), 1e-12);
    /* PAT: all-gather and reduce-scatter, one rank per node, 8 + log2(16) x 14 / 3.5 + 2.8 x 16
     * us at 0.75 of one NIC; not with two ranks per node, not for all-reduce */
    t = fsdp_sim_coll_time(&h100, FSDP_SIM_COLL_REDUCE_SCATTER, 16, 16, P2(20), &cc);
    CU_ASSERT_EQUAL(cc.algo, FSDP_SIM_ALGO_PAT);
    close_to(cc.latency_s, 68.8e-6, 1e-12);
    close_to(t, 10.3e-6 + 68.8e-6 + P2(20) / (47e9 * 0.75), 1e-12);
    /* h100-2024 (NCCL 2.19-2.21, before PAT) is the h100 preset but its name, its stack and
     * PAT: the same reduce-scatter runs as a ring there, at the time of h100 without PAT */
    {
        fsdp_sim_profile_t old_stack, no_pat = h100;
        fsdp_sim_coll_cost_t c2;
        double t2;

        CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_preset("h100-2024", &old_stack), FSDP_OK);
        CU_ASSERT_STRING_EQUAL(old_stack.name, "h100-2024");
        CU_ASSERT(strstr(old_stack.stack, "NCCL 2.19-2.21") != NULL);
        CU_ASSERT(strstr(h100.stack, "PyTorch 2.11") != NULL);
        no_pat.nccl.algorithms &= ~(1u << FSDP_SIM_ALGO_PAT);
        t2 = fsdp_sim_coll_time(&old_stack, FSDP_SIM_COLL_REDUCE_SCATTER, 16, 16, P2(20), &c2);
        CU_ASSERT_NOT_EQUAL(c2.algo, FSDP_SIM_ALGO_PAT);
        CU_ASSERT(t2 > t);
        close_to(t2, fsdp_sim_coll_time(&no_pat, FSDP_SIM_COLL_REDUCE_SCATTER, 16, 16, P2(20), &c2),
                 0);
        memcpy(no_pat.name, old_stack.name, sizeof(no_pat.name));
        memcpy(no_pat.stack, old_stack.stack, sizeof(no_pat.stack));
        CU_ASSERT_EQUAL(memcmp(&no_pat, &old_stack, sizeof(no_pat)), 0);
    }
    fsdp_sim_coll_time(&h100, FSDP_SIM_COLL_ALL_GATHER, 32, 16, P2(20), &cc);
    CU_ASSERT(cc.algo != FSDP_SIM_ALGO_PAT);
    fsdp_sim_coll_time(&h100, FSDP_SIM_COLL_ALL_REDUCE, 16, 16, P2(20), &cc);
    CU_ASSERT(cc.algo != FSDP_SIM_ALGO_PAT);
    /* ... and the ring takes over once bandwidth counts: 47 x 16/15 beats 47 x 0.75 */
    fsdp_sim_coll_time(&h100, FSDP_SIM_COLL_ALL_GATHER, 16, 16, P2(30), &cc);
    CU_ASSERT_EQUAL(cc.algo, FSDP_SIM_ALGO_RING);
    p = h100;
    p.nccl.pat_bandwidth_factor = 0.0;
    fsdp_sim_coll_time(&p, FSDP_SIM_COLL_REDUCE_SCATTER, 16, 16, P2(20), &cc);
    CU_ASSERT(cc.algo != FSDP_SIM_ALGO_PAT);

    /* NICs shared by a node's ranks: 8 groups of one rank per node (hybrid sharding's replicate
     * groups) on nodes of one NIC each have an eighth of it; with a NIC per rank (the preset),
     * or a group that holds the node's ranks, or a node to itself, nothing changes */
    p = h100;
    p.nccl.nics_per_node = 1;
    p.nccl.algorithms = 1u << FSDP_SIM_ALGO_RING;
    p.nccl.protocols = 1u << FSDP_SIM_PROTO_SIMPLE;
    {
        double alone, shared, lat;
        alone = fsdp_sim_coll_time(&p, FSDP_SIM_COLL_ALL_REDUCE, 16, 16, P2(30), &cc);
        lat = cc.floor_s + cc.latency_s;
        /* 2 (n - 1) / n of the buffer through one NIC */
        close_to(alone, lat + P2(30) / (47e9 * 16 / 30), 1e-12);
        shared = fsdp_sim_coll_time_shared(&p, FSDP_SIM_COLL_ALL_REDUCE, 16, 16, 8, P2(30), &cc);
        close_to(shared, lat + P2(30) / (47e9 / 8 * 16 / 30), 1e-12);
        /* two ranks per node of eight: a quarter of the NIC */
        shared = fsdp_sim_coll_time_shared(&p, FSDP_SIM_COLL_ALL_REDUCE, 32, 16, 8, P2(30), &cc);
        close_to(shared - cc.floor_s - cc.latency_s, P2(30) / (47e9 / 4 * 32 / 62), 1e-12);
        /* the whole node in the group, or node_ranks no more than the group's: unshared */
        CU_ASSERT_EQUAL(fsdp_sim_coll_time_shared(&p, FSDP_SIM_COLL_ALL_REDUCE, 128, 16, 8,
                                                  P2(30), NULL),
                        fsdp_sim_coll_time(&p, FSDP_SIM_COLL_ALL_REDUCE, 128, 16, P2(30), NULL));
        CU_ASSERT_EQUAL(fsdp_sim_coll_time_shared(&p, FSDP_SIM_COLL_ALL_REDUCE, 16, 16, 1, P2(30),
                                                  NULL),
                        alone);
        /* eight NICs a node: each rank of a node drives its own */
        CU_ASSERT_EQUAL(fsdp_sim_coll_time_shared(&h100, FSDP_SIM_COLL_ALL_REDUCE, 16, 16, 8,
                                                  P2(30), NULL),
                        fsdp_sim_coll_time(&h100, FSDP_SIM_COLL_ALL_REDUCE, 16, 16, P2(30), NULL));
        /* one node: no NIC to share */
        CU_ASSERT_EQUAL(fsdp_sim_coll_time_shared(&p, FSDP_SIM_COLL_ALL_REDUCE, 4, 1, 8, P2(30),
                                                  NULL),
                        fsdp_sim_coll_time(&p, FSDP_SIM_COLL_ALL_REDUCE, 4, 1, P2(30), NULL));
    }
}

#define ALL_REDUCE_K FSDP_SIM_COLL_ALL_REDUCE
#define ALL_GATHER_K FSDP_SIM_COLL_ALL_GATHER
#define REDUCE_SCATTER_K FSDP_SIM_COLL_REDUCE_SCATTER

/* The model's time for stored calls against the formulas of docs/costs.md, evaluated apart
 * (floor + latency + bytes / (algorithm bandwidth x channels / all channels)). */
static void test_nccl_table(void)
{
    static const struct {
        const char *profile;
        fsdp_sim_coll_kind_t kind;
        int n, nodes;
        double bytes;
        fsdp_sim_algo_t algo;
        fsdp_sim_proto_t proto;
        int channels;
        double time_s;
    } rows[] = {
        {"h100", ALL_REDUCE_K, 8, 1, 8.0, FSDP_SIM_ALGO_RING, FSDP_SIM_PROTO_LL, 1, 25.303177e-6},
        {"h100", ALL_REDUCE_K, 8, 1, 65536.0, FSDP_SIM_ALGO_RING, FSDP_SIM_PROTO_LL, 2,
         38.314241e-6},
        {"h100", ALL_REDUCE_K, 8, 1, 16777216.0, FSDP_SIM_ALGO_NVLS, FSDP_SIM_PROTO_SIMPLE, 16,
         96.466933e-6},
        {"h100", ALL_GATHER_K, 8, 1, 1048576.0, FSDP_SIM_ALGO_RING, FSDP_SIM_PROTO_LL, 32,
         27.607121e-6},
        {"h100", ALL_GATHER_K, 8, 1, 65536.0, FSDP_SIM_ALGO_RING, FSDP_SIM_PROTO_LL, 2,
         27.607121e-6},
        {"h100", REDUCE_SCATTER_K, 8, 1, 268435456.0, FSDP_SIM_ALGO_RING, FSDP_SIM_PROTO_SIMPLE, 32,
         677.313578e-6},
        {"h100", ALL_REDUCE_K, 16, 2, 1073741824.0, FSDP_SIM_ALGO_NVLS_TREE, FSDP_SIM_PROTO_SIMPLE,
         16, 5431.530638e-6},
        {"h100", ALL_GATHER_K, 16, 16, 1048576.0, FSDP_SIM_ALGO_PAT, FSDP_SIM_PROTO_SIMPLE, 32,
         108.846837e-6},
        {"h100", ALL_GATHER_K, 16, 2, 268435456.0, FSDP_SIM_ALGO_RING, FSDP_SIM_PROTO_SIMPLE, 32,
         760.457405e-6},
        {"a100", ALL_REDUCE_K, 8, 1, 1024.0, FSDP_SIM_ALGO_RING, FSDP_SIM_PROTO_LL, 1,
         44.990399e-6},
        {"a100", ALL_REDUCE_K, 8, 1, 1073741824.0, FSDP_SIM_ALGO_RING, FSDP_SIM_PROTO_SIMPLE, 24,
         8199.534856e-6},
        {"a100", ALL_GATHER_K, 8, 1, 4194304.0, FSDP_SIM_ALGO_RING, FSDP_SIM_PROTO_LL128, 24,
         74.025787e-6},
    };

    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        fsdp_sim_profile_t p;
        fsdp_sim_coll_cost_t cc;
        double t;
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_preset(rows[i].profile, &p), FSDP_OK);
        t = fsdp_sim_coll_time(&p, rows[i].kind, rows[i].n, rows[i].nodes, rows[i].bytes, &cc);
        CU_ASSERT_EQUAL(cc.algo, rows[i].algo);
        CU_ASSERT_EQUAL(cc.proto, rows[i].proto);
        CU_ASSERT_EQUAL(cc.channels, rows[i].channels);
        close_to(t, rows[i].time_s, 1e-3);
    }
}

/* NCCL 2.18.5's tuning (nccl.version 21805, docs/costs.md "NCCL 2.18"), in closed form: ring LL
 * at a quarter of the bus for an all-reduce and a third for an all-gather on one node, NVLS's
 * base latency, 2 x nodes network steps of an all-reduce ring, the ring's own network row and
 * LL128 at 0.7 with one rank per node, NVLS-tree over 2 (nodes - 1) steps; version 0 (the
 * presets) is 2.30's, and only the -nccl2.18 presets write the member. */
static void test_nccl_218(void)
{
    fsdp_sim_profile_t a, a30, h;
    fsdp_sim_coll_cost_t cc;
    double t;
    char *json;

    CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_preset("a100-nccl2.18", &a), FSDP_OK);
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_preset("a100", &a30), FSDP_OK);
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_preset("h100-nccl2.18", &h), FSDP_OK);
    CU_ASSERT_EQUAL(a.nccl.version, 21805);
    CU_ASSERT_EQUAL(a30.nccl.version, 0);
    CU_ASSERT_EQUAL(a.nccl.algorithms & (1u << FSDP_SIM_ALGO_PAT), 0u);
    /* 1 KiB: the table's 44.8 us, the floor's own row */
    t = fsdp_sim_coll_time(&a, ALL_REDUCE_K, 8, 1, 1024.0, &cc);
    CU_ASSERT_EQUAL(cc.algo, FSDP_SIM_ALGO_RING);
    CU_ASSERT_EQUAL(cc.proto, FSDP_SIM_PROTO_LL);
    close_to(t, 29.1e-6 + 15.0e-6 + 1024.0 / (231.58e9 / 4 * 8 / 14 / 24), 1e-9);
    /* 1 MiB all-reduce: ring LL at min(bus / 4, 87.7 GB/s), all 24 channels */
    fsdp_sim_coll_time(&a, ALL_REDUCE_K, 8, 1, P2(20), &cc);
    CU_ASSERT_EQUAL(cc.proto, FSDP_SIM_PROTO_LL);
    close_to(cc.algo_bytes_per_s, 231.58e9 / 4 * 8 / 14, 1e-6);
    /* ... an all-gather on one node at a third; 2.30: a half, capped at 87.7 */
    fsdp_sim_coll_time(&a, ALL_GATHER_K, 8, 1, 4096.0 * 8, &cc);
    close_to(cc.algo_bytes_per_s, 231.58e9 / 3 * 8 / 7 / 24, 1e-6);
    fsdp_sim_coll_time(&a30, ALL_GATHER_K, 8, 1, 4096.0 * 8, &cc);
    close_to(cc.algo_bytes_per_s, 87.7e9 * 8 / 7 / 24, 1e-6);
    /* 2 nodes of 8, Simple all-reduce latency: 2 x 2 network steps of 14 us, 26 NVLink steps
     * raised to 3 x the AMD hosts' 2 us, x 1.4 */
    {
        fsdp_sim_profile_t r = a;
        r.nccl.algorithms = 1u << FSDP_SIM_ALGO_RING;
        r.nccl.protocols = 1u << FSDP_SIM_PROTO_SIMPLE;
        fsdp_sim_coll_time(&r, ALL_REDUCE_K, 16, 2, P2(30), &cc);
        close_to(cc.latency_s, (8.4e-6 + 26 * 6.0e-6 + 4 * 14.0e-6) * 1.4, 1e-9);
        /* one rank per node: the ring's network row (2.7 us LL), LL128 at 0.7 of one NIC */
        r.nccl.protocols = 1u << FSDP_SIM_PROTO_LL;
        fsdp_sim_coll_time(&r, ALL_GATHER_K, 4, 4, 4096.0, &cc);
        close_to(cc.latency_s, 6.6e-6 + 3 * 2.7e-6, 1e-9);
        r.nccl.protocols = 1u << FSDP_SIM_PROTO_LL128;
        fsdp_sim_coll_time(&r, ALL_GATHER_K, 4, 4, P2(30), &cc);
        close_to(cc.algo_bytes_per_s, 0.7 * 24e9 * 4 / 3, 1e-6);
    }
    /* NVLS on one node: the 23 us base; NVLS-tree on 4 nodes: 23 + 2 x 3 x 19 us */
    fsdp_sim_coll_time(&h, ALL_REDUCE_K, 8, 1, P2(30), &cc);
    CU_ASSERT_EQUAL(cc.algo, FSDP_SIM_ALGO_NVLS);
    close_to(cc.latency_s, 23.0e-6, 1e-12);
    {
        fsdp_sim_profile_t r = h;
        r.nccl.algorithms = 1u << FSDP_SIM_ALGO_RING | 1u << FSDP_SIM_ALGO_NVLS_TREE;
        r.nccl.base_latency_s[FSDP_SIM_ALGO_RING][FSDP_SIM_PROTO_SIMPLE] = 1.0;
        r.nccl.protocols = 1u << FSDP_SIM_PROTO_SIMPLE;
        fsdp_sim_coll_time(&r, ALL_REDUCE_K, 32, 4, P2(30), &cc);
        CU_ASSERT_EQUAL(cc.algo, FSDP_SIM_ALGO_NVLS_TREE);
        close_to(cc.latency_s, 23.0e-6 + 6 * 19.0e-6, 1e-9);
    }
    /* the member is written where it is set, and range-checked */
    json = fsdp_sim_profile_to_json(&a30);
    CU_ASSERT(strstr(json, "\"version\"") == NULL);
    free(json);
    json = fsdp_sim_profile_to_json(&a);
    CU_ASSERT(strstr(json, "\"version\": 21805") != NULL);
    free(json);
    a.nccl.version = 218;
    capture_start();
    CU_ASSERT_EQUAL(fsdp_sim_profile_check(&a), FSDP_ERR_INVALID_PARAM);
    capture_end();
    CU_ASSERT(strstr(last_log, "nccl.version 218") != NULL);
}

/* A causal bf16 fused-attention descriptor of either direction (their operand structs differ). */
static fsdp_kernel_t causal_attention(fsdp_kernel_kind_t kind, size_t batch, size_t seq,
                                      size_t heads, size_t head_dim)
{
    fsdp_kernel_t k;

    memset(&k, 0, sizeof(k));
    k.kind = kind;
#define SET_(u)                                                                                    \
    do {                                                                                           \
        (u).batch = batch;                                                                         \
        (u).seq = seq;                                                                             \
        (u).heads = (u).kv_heads = heads;                                                          \
        (u).head_dim = head_dim;                                                                   \
        (u).causal = 1;                                                                            \
        (u).dtype = FSDP_DTYPE_BF16;                                                               \
    } while (0)
    if (kind == FSDP_K_ATTENTION_FWD)
        SET_(k.u.attention_fwd);
    else
        SET_(k.u.attention_bwd);
#undef SET_
    return k;
}

/* The 2023 stacks (a100-2023, h100-2023), in closed form: fused attention at the Triton
 * FlashAttention's efficiency for its sequence length and head_dim (FlashAttention-2's paper,
 * Figure 4), linear in log2(seq) between 512, 1024, ..., 16384 tokens and held outside them;
 * NCCL 2.18.5's tuning; everything else the a100 and h100-2024 presets'. */
static void test_stack_2023(void)
{
    fsdp_sim_profile_t a, a23, h24, h23, q;
    fsdp_kernel_t k;
    double flops = 4.0 * 128 * 4 * 16 * 2048.0 * 2049 / 2,
           qa = fsdp_sim_attention_quantization(4, 16, 2048, 108);
    char *json;

    CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_preset("a100", &a), FSDP_OK);
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_preset("a100-2023", &a23), FSDP_OK);
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_preset("h100-2024", &h24), FSDP_OK);
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_preset("h100-2023", &h23), FSDP_OK);
    CU_ASSERT(strstr(a23.stack, "CUDA 11.7-11.8") != NULL);
    CU_ASSERT(strstr(h23.stack, "CUDA 11.8") != NULL);
    CU_ASSERT_EQUAL(a23.nccl.version, 21805);
    CU_ASSERT_EQUAL(h23.nccl.version, 21805);

    /* causal forward, 4 x 16 heads of 128, 2,048 tokens, fused: 0.218 of 312 TFLOP/s, where
     * a100 runs FlashAttention-2 at 0.50 */
    a.ops = a23.ops = h23.ops = h24.ops = FSDP_SIM_OPS_FUSED;
    k = causal_attention(FSDP_K_ATTENTION_FWD, 4, 2048, 16, 128);
    close_to(fsdp_sim_kernel_time(&a23, &k), flops / (312e12 * 0.218 * qa) + 1.2e-6, 1e-12);
    close_to(fsdp_sim_kernel_time(&a, &k), flops / (312e12 * 0.50 * qa) + 1.2e-6, 1e-12);
    /* backward: the same efficiency, 10 hd a pair */
    k = causal_attention(FSDP_K_ATTENTION_BWD, 4, 2048, 16, 128);
    close_to(fsdp_sim_kernel_time(&a23, &k), 2.5 * flops / (312e12 * 0.218 * qa) + 1.2e-6, 1e-12);
    /* head_dim 64 (32 heads, the same FLOPs): the other row, 0.254 */
    k = causal_attention(FSDP_K_ATTENTION_BWD, 4, 2048, 32, 64);
    close_to(fsdp_sim_kernel_time(&a23, &k),
             2.5 * flops / (312e12 * 0.254 * fsdp_sim_attention_quantization(4, 32, 2048, 108)) +
                 1.2e-6,
             1e-12);
    /* between two points, linear in log2(seq): 3,000 tokens, 0.218 + log2(3000 / 2048) x
     * (0.238 - 0.218), and on the H100 0.111 + the same x (0.128 - 0.111) */
    k = causal_attention(FSDP_K_ATTENTION_FWD, 4, 3000, 16, 128);
    {
        double x = log2(3000.0 / 2048), f = 4.0 * 128 * 4 * 16 * 3000.0 * 3001 / 2;
        double e = 0.218 + x * (0.238 - 0.218), eh = 0.111 + x * (0.128 - 0.111);
        close_to(fsdp_sim_kernel_time(&a23, &k),
                 f / (312e12 * e * fsdp_sim_attention_quantization(4, 16, 3000, 108)) + 1.2e-6,
                 1e-12);
        close_to(fsdp_sim_kernel_time(&h23, &k),
                 f / (989.4e12 * eh * fsdp_sim_attention_quantization(4, 16, 3000, 132)) + 1.2e-6,
                 1e-12);
        /* h100-2024: PyTorch 2.11's FlashAttention-2, 0.26 at every length */
        close_to(fsdp_sim_kernel_time(&h24, &k),
                 f / (989.4e12 * 0.26 * fsdp_sim_attention_quantization(4, 16, 3000, 132)) + 1.2e-6,
                 1e-12);
    }
    /* outside the figure's lengths, its end points: 65,536 tokens at 16,384's, 256 at 512's */
    k = causal_attention(FSDP_K_ATTENTION_FWD, 1, 65536, 16, 128);
    close_to(fsdp_sim_kernel_time(&a23, &k),
             4.0 * 128 * 16 * 65536.0 * 65537 / 2 /
                     (312e12 * 0.257 * fsdp_sim_attention_quantization(1, 16, 65536, 108)) +
                 1.2e-6,
             1e-12);
    k = causal_attention(FSDP_K_ATTENTION_FWD, 1, 256, 16, 128);
    close_to(fsdp_sim_kernel_time(&h23, &k),
             4.0 * 128 * 16 * 256.0 * 257 / 2 /
                     (989.4e12 * 0.093 * fsdp_sim_attention_quantization(1, 16, 256, 132)) +
                 1.2e-6,
             1e-12);

    /* but for the table, the name and the stack, a100-2023 is a100-nccl2.18 and h100-2023 is
     * h100-2024 with NCCL 2.18.5's tuning (h100-nccl2.18 less PAT, which it has not either) */
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_preset("a100-nccl2.18", &q), FSDP_OK);
    q.ops = FSDP_SIM_OPS_FUSED;
    memcpy(q.name, a23.name, sizeof(q.name));
    memcpy(q.stack, a23.stack, sizeof(q.stack));
    memcpy(q.gpu.attention_seq_efficiency, a23.gpu.attention_seq_efficiency,
           sizeof(q.gpu.attention_seq_efficiency));
    CU_ASSERT_EQUAL(memcmp(&q, &a23, sizeof(q)), 0);
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_preset("h100-nccl2.18", &q), FSDP_OK);
    q.ops = FSDP_SIM_OPS_FUSED;
    memcpy(q.name, h23.name, sizeof(q.name));
    memcpy(q.stack, h23.stack, sizeof(q.stack));
    memcpy(q.gpu.attention_seq_efficiency, h23.gpu.attention_seq_efficiency,
           sizeof(q.gpu.attention_seq_efficiency));
    CU_ASSERT_EQUAL(memcmp(&q, &h23, sizeof(q)), 0);

    /* the table is written where it is set, read back, and range-checked as a whole */
    json = fsdp_sim_profile_to_json(&a);
    CU_ASSERT(strstr(json, "attention_seq_efficiency") == NULL);
    free(json);
    json = fsdp_sim_profile_to_json(&a23);
    CU_ASSERT(strstr(json, "\"hd128\"") != NULL);
    CU_ASSERT_EQUAL(fsdp_sim_profile_parse(json, &q), FSDP_OK);
    CU_ASSERT_EQUAL(memcmp(q.gpu.attention_seq_efficiency, a23.gpu.attention_seq_efficiency,
                           sizeof(q.gpu.attention_seq_efficiency)),
                    0);
    free(json);
    capture_start();
    CU_ASSERT_EQUAL(fsdp_sim_profile_parse("{\"base\": \"a100\", \"gpu\": "
                                           "{\"attention_seq_efficiency\": {\"hd128\": "
                                           "[0.1, 0.2, 0.2, 0.2, 0.2, 0.2]}}}",
                                           &q),
                    FSDP_ERR_INVALID_PARAM);
    CU_ASSERT(strstr(last_log, "6 of its 12 entries") != NULL);
    CU_ASSERT_EQUAL(fsdp_sim_profile_parse("{\"base\": \"a100-2023\", \"gpu\": "
                                           "{\"attention_seq_efficiency\": {\"hd64\": "
                                           "[0.1, 0.2, 0.2, 0.2, 0.2, 1.5]}}}",
                                           &q),
                    FSDP_ERR_INVALID_PARAM);
    CU_ASSERT(strstr(last_log, "gpu.attention_seq_efficiency is 1.5") != NULL);
    capture_end();
}

/* ---- profiles ---- */

static void expect_error(fsdp_status_t got, fsdp_status_t want, const char *needle)
{
    CU_ASSERT_EQUAL(got, want);
    CU_ASSERT(strstr(last_log, needle) != NULL);
    if (strstr(last_log, needle) == NULL)
        fprintf(stderr, "log '%s' lacks '%s'\n", last_log, needle);
}

static void test_profile_errors(void)
{
    fsdp_sim_profile_t p;

    capture_start();
    expect_error(fsdp_sim_profile_preset("h300", &p), FSDP_ERR_INVALID_PARAM, "h100, h100-2024, a100, h200");
    expect_error(fsdp_sim_profile_preset("h100:gpus=4", &p), FSDP_ERR_INVALID_PARAM,
                 "allowed: nodes=N, gpus_per_node=G");
    expect_error(fsdp_sim_profile_preset("h100:nodes=0", &p), FSDP_ERR_INVALID_PARAM, "'nodes=0'");
    expect_error(fsdp_sim_profile_parse("{\"base\": \"h100\",", &p), FSDP_ERR_FORMAT,
                 "malformed JSON at line 1");
    expect_error(fsdp_sim_profile_parse("[1, 2]", &p), FSDP_ERR_FORMAT, "JSON object");
    expect_error(fsdp_sim_profile_parse("{\"base\": \"h100\", \"gpu\": {\"hbm\": 1}}", &p),
                 FSDP_ERR_INVALID_PARAM, "gpu.hbm is not a known member; allowed here:");
    expect_error(fsdp_sim_profile_parse("{\"base\": \"h100\", \"nodes\": \"two\"}", &p),
                 FSDP_ERR_INVALID_PARAM, "nodes must be an integer");
    expect_error(fsdp_sim_profile_parse("{\"base\": \"h100\", \"gpu\": {\"hbm_bytes_per_s\": "
                                        "-1}}",
                                        &p),
                 FSDP_ERR_INVALID_PARAM, "gpu.hbm_bytes_per_s is -1");
    expect_error(fsdp_sim_profile_parse("{\"base\": \"h100\", \"gpu\": {\"compute_efficiency\":"
                                        " 1.5}}",
                                        &p),
                 FSDP_ERR_INVALID_PARAM, "gpu.compute_efficiency is 1.5; it must be in (0, 1]");
    expect_error(fsdp_sim_profile_parse("{\"base\": \"h100\", \"nccl\": {\"algorithms\": "
                                        "[\"tree\"]}}",
                                        &p),
                 FSDP_ERR_INVALID_PARAM, "must include ring");
    expect_error(fsdp_sim_profile_parse("{\"base\": \"h100\", \"nccl\": {\"protocols\": "
                                        "[\"ll256\"]}}",
                                        &p),
                 FSDP_ERR_INVALID_PARAM, "names 'll256'; allowed: ll, ll128, simple");
    expect_error(fsdp_sim_profile_parse("{\"base\": \"h100\", \"nccl\": {\"base_latency_s\": "
                                        "{\"ring\": [1, 2]}}}",
                                        &p),
                 FSDP_ERR_INVALID_PARAM, "nccl.base_latency_s.ring must be an array of 3");
    expect_error(fsdp_sim_profile_parse("{\"base\": \"x100\"}", &p), FSDP_ERR_INVALID_PARAM,
                 "unknown cluster profile 'x100'");
    expect_error(fsdp_sim_profile_parse("{\"nodes\": 1, \"gpus_per_node\": 2}", &p),
                 FSDP_ERR_INVALID_PARAM, "is required");
    expect_error(fsdp_sim_profile_load("/nonexistent/profile.json", &p), FSDP_ERR_NOT_FOUND,
                 "cannot open");
    expect_error(fsdp_sim_profile_from_arg("missing.json", &p), FSDP_ERR_NOT_FOUND, "missing.json");
    /* a positive rate too small for a time to stay finite (1e-308 made a step's time NaN) is
     * refused naming its field; 0 (free, no cap) and 1 per second are rates */
    {
        static const char *const tiny[][2] = {
            {"gpu", "hbm_bytes_per_s"},        {"gpu", "vector_flops_per_s"},
            {"gpu", "strided_elements_per_s"}, {"host", "h2d_bytes_per_s"},
            {"host", "d2h_bytes_per_s"},       {"nccl", "nic_bytes_per_s"},
            {"nccl", "intra_bus_bytes_per_s"}, {"nccl", "nvls_bus_bytes_per_s"},
        };
        char json[256], field[64];
        for (size_t i = 0; i < sizeof(tiny) / sizeof(tiny[0]); i++) {
            snprintf(json, sizeof(json), "{\"base\": \"h100\", \"%s\": {\"%s\": 1e-308}}",
                     tiny[i][0], tiny[i][1]);
            snprintf(field, sizeof(field), "%s.%s is 1e-308; it must be", tiny[i][0], tiny[i][1]);
            expect_error(fsdp_sim_profile_parse(json, &p), FSDP_ERR_INVALID_PARAM, field);
        }
        expect_error(fsdp_sim_profile_parse("{\"base\": \"h100\", \"gpu\": "
                                            "{\"matmul_flops_per_s\": {\"bf16\": 0.5}}}",
                                            &p),
                     FSDP_ERR_INVALID_PARAM, "gpu.matmul_flops_per_s.bf16 is 0.5");
        expect_error(fsdp_sim_profile_parse("{\"base\": \"h100\", \"nccl\": "
                                            "{\"ll_max_bytes_per_s\": [1e-300, 0, 0]}}",
                                            &p),
                     FSDP_ERR_INVALID_PARAM, "nccl.ll_max_bytes_per_s is 1e-300");
        CU_ASSERT_EQUAL(fsdp_sim_profile_parse("{\"base\": \"h100\", \"gpu\": "
                                               "{\"hbm_bytes_per_s\": 0, "
                                               "\"vector_flops_per_s\": 1}}",
                                               &p),
                        FSDP_OK);
    }
    /* a launch with a bad profile names the bad field */
    {
        fsdp_sim_params_t sp;
        fsdp_sim_params_init(&sp);
        sp.profile.host.h2d_bytes_per_s = 1e-308;
        expect_error(fsdp_sim_launch(&sp, case_rank, NULL, NULL), FSDP_ERR_INVALID_PARAM,
                     "host.h2d_bytes_per_s");
    }
    {
        fsdp_sim_params_t sp;
        fsdp_sim_params_init(&sp);
        sp.profile.gpu.memory_efficiency = 0.0;
        expect_error(fsdp_sim_launch(&sp, case_rank, NULL, NULL), FSDP_ERR_INVALID_PARAM,
                     "gpu.memory_efficiency");
    }
    capture_end();

    /* the shape options */
    CU_ASSERT_EQUAL(fsdp_sim_profile_preset("a100:nodes=4,gpus_per_node=2", &p), FSDP_OK);
    CU_ASSERT_EQUAL(p.nodes, 4);
    CU_ASSERT_EQUAL(p.gpus_per_node, 2);
    CU_ASSERT_STRING_EQUAL(p.name, "a100");
}

/* The presets read back from their JSON, and the JSON files under traces/profiles are them. */
static void test_profile_json(void)
{
    const char *names[] = {"h100",          "h100-2024",     "a100",      "h200",
                           "a100-nccl2.18", "h100-nccl2.18", "a100-2023", "h100-2023"};
    const char *srcdir = getenv("srcdir");

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        fsdp_sim_profile_t p, q;
        char *a, *b, path[1024];
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_preset(names[i], &p), FSDP_OK);
        a = fsdp_sim_profile_to_json(&p);
        CU_ASSERT_PTR_NOT_NULL_FATAL(a);
        CU_ASSERT(strstr(a, "0.69999") == NULL); /* short numbers where they read back */
        CU_ASSERT_EQUAL(fsdp_sim_profile_parse(a, &q), FSDP_OK);
        b = fsdp_sim_profile_to_json(&q);
        CU_ASSERT_STRING_EQUAL(a, b);
        free(b);
        snprintf(path, sizeof(path), "%s/../traces/profiles/%s.json", srcdir ? srcdir : ".",
                 names[i]);
        CU_ASSERT_EQUAL(fsdp_sim_profile_load(path, &q), FSDP_OK);
        b = fsdp_sim_profile_to_json(&q);
        CU_ASSERT_STRING_EQUAL(a, b);
        free(a);
        free(b);
    }
    /* a custom profile round-trips too, with the long form where 15 digits are not enough */
    {
        fsdp_sim_profile_t p, q;
        char *a, *b;
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_parse(closed_form_json, &p), FSDP_OK);
        p.gpu.kernel_latency_s = 1.0 / 3.0;
        a = fsdp_sim_profile_to_json(&p);
        CU_ASSERT_EQUAL(fsdp_sim_profile_parse(a, &q), FSDP_OK);
        CU_ASSERT_EQUAL(q.gpu.kernel_latency_s, 1.0 / 3.0);
        b = fsdp_sim_profile_to_json(&q);
        CU_ASSERT_STRING_EQUAL(a, b);
        free(a);
        free(b);
    }
}

/* ---- determinism, and shape mode running the same code as data mode ---- */

typedef struct mlp_case {
    fsdp_sim_mode_t mode;
    int world;
    double step_time[MAXW][2];
    double host_end[MAXW];
    fsdp_sim_time_stats_t ts[MAXW];
    fsdp_mem_stats_t mem[MAXW];
    float loss[MAXW][2];
} mlp_case_t;

static fsdp_status_t mlp_rank(fsdp_dev_t *dev, void *arg)
{
    static const int dims[] = {24, 64, 48, 8};
    mlp_case_t *c = arg;
    int r = dev->rank;
    size_t rows = 8;
    fsdp_config_t cfg;
    fsdp_optim_config_t oc;
    fsdp_t *fs = NULL;
    fsdp_mlp_t *mlp = NULL;
    fsdp_optim_t *opt = NULL;
    float *x = NULL, *y = NULL;
    fsdp_status_t st;

    fsdp_config_init(&cfg);
    cfg.validate_exec_order = 0; /* a data-dependent check that shape mode skips */
    fsdp_optim_config_init(&oc, FSDP_OPTIM_ADAMW);
    st = fsdp_create(dev, &cfg, &fs);
    if (st != FSDP_OK)
        return st;
    st = fsdp_mlp_create(fs, dims, 3, &mlp);
    if (st == FSDP_OK) /* in shape mode: the same copies, without data */
        st = fsdp_mlp_init_params(mlp, 7);
    if (st == FSDP_OK)
        st = fsdp_optim_create(fs, &oc, &opt);
    if (st == FSDP_OK && c->mode == FSDP_SIM_DATA) {
        x = calloc(rows * (size_t)dims[0], sizeof(float));
        y = calloc(rows * (size_t)dims[3], sizeof(float));
        if (x == NULL || y == NULL)
            st = FSDP_ERR_NO_MEMORY;
        for (size_t i = 0; x != NULL && i < rows * (size_t)dims[0]; i++)
            x[i] = (float)((i * 7 + (size_t)r) % 13) / 13.0f - 0.5f;
    }
    for (int step = 0; step < 2 && st == FSDP_OK; step++) {
        double t0 = fsdp_dev_host_time(dev);
        /* shape mode: no host data at all */
        st = fsdp_mlp_forward_backward(mlp, x, y, rows, &c->loss[r][step]);
        if (st == FSDP_OK)
            st = fsdp_optim_step(opt);
        fsdp_zero_grad(fs);
        if (st == FSDP_OK)
            st = fsdp_dev_stream_synchronize(dev, NULL);
        c->step_time[r][step] = fsdp_dev_host_time(dev) - t0;
    }
    if (st == FSDP_OK)
        st = fsdp_sim_time_stats(dev, &c->ts[r]);
    c->host_end[r] = fsdp_dev_host_time(dev);
    fsdp_mem_get_stats(fsdp_memory(fs), &c->mem[r]);
    free(x);
    free(y);
    fsdp_optim_destroy(opt);
    fsdp_mlp_destroy(mlp);
    fsdp_destroy(fs);
    return st;
}

static void run_mlp(mlp_case_t *c, fsdp_sim_mode_t mode, int fibers)
{
    fsdp_sim_params_t p;

    memset(c, 0, sizeof(*c));
    c->mode = mode;
    c->world = 4;
    fsdp_sim_params_init(&p); /* the default profile: one 8xH100 node */
    p.world_size = c->world;
    p.mode = mode;
    p.fibers = fibers;
    p.workers = 2;
    p.timeout_s = 20.0;
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_launch(&p, mlp_rank, c, NULL), FSDP_OK);
}

static void same_times(const mlp_case_t *a, const mlp_case_t *b)
{
    for (int r = 0; r < a->world; r++) {
        CU_ASSERT_EQUAL(a->host_end[r], b->host_end[r]);
        CU_ASSERT_EQUAL(a->step_time[r][0], b->step_time[r][0]);
        CU_ASSERT_EQUAL(a->step_time[r][1], b->step_time[r][1]);
        CU_ASSERT_EQUAL(a->ts[r].exposed_comm_s, b->ts[r].exposed_comm_s);
        CU_ASSERT_EQUAL(a->ts[r].compute_s, b->ts[r].compute_s);
        CU_ASSERT_EQUAL(a->ts[r].gemm_flops, b->ts[r].gemm_flops);
        CU_ASSERT_EQUAL(a->ts[r].n_kernels, b->ts[r].n_kernels);
        CU_ASSERT_EQUAL(a->mem[r].peak_allocated, b->mem[r].peak_allocated);
        CU_ASSERT_EQUAL(a->mem[r].peak_reserved, b->mem[r].peak_reserved);
        CU_ASSERT(memcmp(a->mem[r].at_peak_by_category, b->mem[r].at_peak_by_category,
                         sizeof(a->mem[r].at_peak_by_category)) == 0);
    }
}

static void test_determinism(void)
{
    mlp_case_t *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));

    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    run_mlp(a, FSDP_SIM_DATA, 0);
    run_mlp(b, FSDP_SIM_DATA, 0);
    same_times(a, b);
    for (int r = 0; r < a->world; r++) {
        CU_ASSERT(a->step_time[r][0] > 0.0);
        CU_ASSERT(memcmp(a->loss[r], b->loss[r], sizeof(a->loss[r])) == 0);
    }
    /* shape mode runs the same code without data: the same times and memory */
    run_mlp(b, FSDP_SIM_SHAPE, 0);
    same_times(a, b);
    /* ranks as fibers on two workers (threads where sanitizers forbid fibers): the same again,
     * losses included */
    run_mlp(b, FSDP_SIM_DATA, 1);
    same_times(a, b);
    for (int r = 0; r < a->world; r++)
        CU_ASSERT(memcmp(a->loss[r], b->loss[r], sizeof(a->loss[r])) == 0);
    run_mlp(b, FSDP_SIM_SHAPE, 1);
    same_times(a, b);
    free(a);
    free(b);
}

/* ---- the query API ---- */

static fsdp_status_t query_rank(fsdp_dev_t *dev, void *arg)
{
    fsdp_stream_t *s = NULL;
    fsdp_event_t *ev = NULL;
    fsdp_kernel_t k = {.kind = FSDP_K_GEMM};
    fsdp_sim_time_stats_t ts;
    double kt;
    int *ok = arg;

    k.u.gemm.m = k.u.gemm.n = 1;
    k.u.gemm.k = (size_t)1 << 29; /* 2^30 FLOPs: 1 s at 2^30 FLOP/s */
    if (fsdp_dev_stream_create(dev, "side", 0, &s) != FSDP_OK || fsdp_dev_event_create(dev, &ev))
        return FSDP_ERR_INTERNAL;
    kt = fsdp_sim_kernel_time(fsdp_sim_rank_profile(dev), &k);
    /* two kernels on the side stream, one on compute after an event of the first */
    fsdp_dev_kernel(dev, s, &k);
    fsdp_dev_event_record(dev, ev, s);
    fsdp_dev_kernel(dev, s, &k);
    fsdp_dev_stream_wait_event(dev, NULL, ev);
    fsdp_dev_kernel(dev, NULL, &k);
    ok[dev->rank] = kt == 1.0 && fsdp_sim_stream_time(dev, s) == 2.0 &&
                    fsdp_sim_stream_time(dev, NULL) == 2.0 && fsdp_sim_device_time(dev) == 2.0 &&
                    fsdp_dev_host_time(dev) == 0.0;
    fsdp_dev_event_synchronize(dev, ev);
    ok[dev->rank] &= fsdp_dev_host_time(dev) == 1.0;
    fsdp_sim_time_stats(dev, &ts);
    ok[dev->rank] &= ts.kernel_s == 3.0 && ts.compute_s == 1.0 && ts.gemm_flops == 3 * P2(30) &&
                     ts.n_kernels == 3;
    fsdp_sim_time_reset(dev);
    fsdp_sim_time_stats(dev, &ts);
    ok[dev->rank] &= ts.kernel_s == 0.0 && ts.host_time == 1.0 && ts.device_time == 2.0;
    fsdp_dev_event_destroy(dev, ev);
    fsdp_dev_stream_destroy(dev, s);
    return FSDP_OK;
}

static void test_query_api(void)
{
    fsdp_sim_params_t p;
    int ok[2] = {0, 0};

    fsdp_sim_params_init(&p);
    p.world_size = 2;
    p.mode = FSDP_SIM_SHAPE;
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_parse(closed_form_json, &p.profile), FSDP_OK);
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_launch(&p, query_rank, ok, NULL), FSDP_OK);
    CU_ASSERT(ok[0] && ok[1]);
    /* not a sim rank */
    CU_ASSERT_EQUAL(fsdp_sim_stream_time(NULL, NULL), 0.0);
    CU_ASSERT_PTR_NULL(fsdp_sim_rank_profile(NULL));
}

/* ---- collectives take SMs from GEMMs ---- */

typedef struct sm_case {
    double ag_s, gemm_s, gemm_on3_s; /* the all-gather's time; the GEMM's on 4 and on 3 SMs */
    double end1, end2, end_before;   /* the compute stream after each GEMM */
    double held;                     /* the rank's sm_held_s */
} sm_case_t;

/* 12 tiles of 128 x 256: 3 waves on 4 SMs, 4 on 3, no quantization loss either way */
static fsdp_kernel_t sm_gemm(void)
{
    fsdp_kernel_t k = {.kind = FSDP_K_GEMM};

    k.u.gemm.m = 128;
    k.u.gemm.n = 12 * 256;
    k.u.gemm.k = 2048;
    k.u.gemm.alpha = 1.0f;
    return k;
}

static fsdp_status_t sm_rank(fsdp_dev_t *dev, void *arg)
{
    fsdp_group_t *world = fsdp_dev_group_world(dev);
    fsdp_kernel_t k = sm_gemm();
    fsdp_stream_t *side = NULL;
    sm_case_t *c = &((sm_case_t *)arg)[dev->rank]; /* each rank its own */
    fsdp_status_t st;

    if ((st = fsdp_dev_stream_create(dev, "side", 0, &side)) != FSDP_OK)
        return st;
    /* a GEMM issued before the all-gather runs on the whole GPU: the model sees a collective's
     * SMs only from the kernels issued after it (docs/costs.md) */
    st = fsdp_dev_kernel(dev, NULL, &k);
    if (st == FSDP_OK)
        st = fsdp_dev_all_gather(dev, world, NULL, NULL, (size_t)1 << 16, FSDP_DTYPE_F32, side);
    c->end_before = fsdp_sim_stream_time(dev, NULL);
    if (st == FSDP_OK)
        st = fsdp_dev_stream_synchronize(dev, NULL);
    /* the all-gather on the side stream, then at once a GEMM on the compute stream: the GEMM
     * shares the GPU with it until it ends, then has it to itself; a second GEMM after it */
    if (st == FSDP_OK)
        st = fsdp_dev_stream_synchronize(dev, side);
    if (st == FSDP_OK)
        st = fsdp_dev_all_gather(dev, world, NULL, NULL, (size_t)1 << 16, FSDP_DTYPE_F32, side);
    if (st == FSDP_OK)
        st = fsdp_dev_kernel(dev, NULL, &k);
    c->end1 = fsdp_sim_stream_time(dev, NULL) - c->end_before;
    c->ag_s = fsdp_sim_stream_time(dev, side) - c->end_before;
    if (st == FSDP_OK)
        st = fsdp_dev_kernel(dev, NULL, &k);
    c->end2 = fsdp_sim_stream_time(dev, NULL) - c->end_before;
    if (st == FSDP_OK) {
        fsdp_sim_time_stats_t ts;
        st = fsdp_sim_time_stats(dev, &ts);
        c->held = ts.sm_held_s;
    }
    fsdp_dev_stream_destroy(dev, side);
    return st;
}

/* the closed-form profile on a GPU of 4 SMs, its collectives on one channel */
static const char *sm_json(int per_channel)
{
    static char json[1024];

    snprintf(json, sizeof(json),
             "{\"name\": \"sm\", \"nodes\": 1, \"gpus_per_node\": 4,"
             " \"gpu\": {\"memory_bytes\": 1099511627776, \"matmul_flops_per_s\": "
             "{\"f32\": 1073741824}, \"vector_flops_per_s\": 0, \"hbm_bytes_per_s\": 0, "
             "\"sms\": 4},"
             " \"host\": {\"h2d_bytes_per_s\": 0, \"d2h_bytes_per_s\": 0},"
             " \"nccl\": {\"intra_bus_bytes_per_s\": 805306368, \"channels\": 1, "
             "\"sms_per_channel\": %d}}",
             per_channel);
    return json;
}

static void test_sm_contention(void)
{
    fsdp_sim_params_t p;
    fsdp_sim_profile_t h100;
    fsdp_kernel_t k = sm_gemm(), add = {.kind = FSDP_K_ADD};

    for (int per = 0; per <= 1; per++) {
        sm_case_t cs[4], c;
        double g, g3, a;

        fsdp_sim_params_init(&p);
        p.world_size = 4;
        p.mode = FSDP_SIM_SHAPE;
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_parse(sm_json(per), &p.profile), FSDP_OK);
        g = fsdp_sim_kernel_time(&p.profile, &k);
        g3 = fsdp_sim_kernel_time_on(&p.profile, &k, 3);
        /* 2^31 x 3 x 256 FLOPs at 2^30 FLOP/s on 4 SMs, 4/3 of that on 3 */
        CU_ASSERT_DOUBLE_EQUAL(g, 2.0 * 128 * 3072 * 2048 / P2(30), 1e-12);
        CU_ASSERT_DOUBLE_EQUAL(g3 / g, 4.0 / 3.0, 1e-12);
        CU_ASSERT_EQUAL(fsdp_sim_kernel_time_on(&p.profile, &k, 4), g);
        CU_ASSERT_EQUAL(fsdp_sim_kernel_time_on(&p.profile, &k, 99), g); /* at most all SMs */
        CU_ASSERT_EQUAL(fsdp_sim_kernel_time_on(&p.profile, &k, 0),
                        fsdp_sim_kernel_time_on(&p.profile, &k, 1)); /* at least one */
        memset(cs, 0, sizeof(cs));
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_launch(&p, sm_rank, cs, NULL), FSDP_OK);
        for (int r = 1; r < 4; r++) /* every rank alike */
            CU_ASSERT(memcmp(&cs[r], &cs[0], sizeof(cs[0])) == 0);
        c = cs[0];
        a = c.ag_s;
        CU_ASSERT(a > 0.0 && a < g);
        CU_ASSERT_EQUAL(c.end_before, g);
        /* what the GEMM lost is in the rank's accounting */
        CU_ASSERT_DOUBLE_EQUAL(c.held, c.end1 - g, 1e-12 * g);
        if (per == 0) {
            CU_ASSERT_EQUAL(c.end1, g);
            CU_ASSERT_EQUAL(c.held, 0.0);
        } else {
            /* over [0, a) it does a / g3 of its work, the rest at full speed */
            CU_ASSERT_DOUBLE_EQUAL(c.end1, a + (1.0 - a / g3) * g, 1e-12 * g);
            CU_ASSERT_DOUBLE_EQUAL(c.end1, g + a / 4.0, 1e-12 * g);
        }
        CU_ASSERT_DOUBLE_EQUAL(c.end2, c.end1 + g, 1e-12 * g);
    }
    /* memory-bound kernels keep their time; a GEMM on the presets loses its SMs' share */
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_preset("h100", &h100), FSDP_OK);
    CU_ASSERT_EQUAL(h100.nccl.sms_per_channel, 1);
    add.u.add.n = (size_t)1 << 24;
    add.u.add.dtype = FSDP_DTYPE_BF16;
    CU_ASSERT_EQUAL(fsdp_sim_kernel_time_on(&h100, &add, 100), fsdp_sim_kernel_time(&h100, &add));
    k.u.gemm.m = k.u.gemm.n = k.u.gemm.k = 8192;
    k.u.gemm.a_dtype = k.u.gemm.b_dtype = k.u.gemm.c_dtype = FSDP_DTYPE_BF16;
    /* 8192^2 / (128 x 256) = 2048 tiles: 16 waves on 132 SMs, 21 on 100 */
    CU_ASSERT_DOUBLE_EQUAL((fsdp_sim_kernel_time_on(&h100, &k, 100) - h100.gpu.kernel_latency_s) /
                               (fsdp_sim_kernel_time(&h100, &k) - h100.gpu.kernel_latency_s),
                           21.0 / 16.0, 1e-12);
}

/* ---- collectives take HBM bandwidth from memory-bound kernels ---- */

typedef struct hbm_case {
    double ag_s, add_s, end, held; /* the all-gather's time, the add's alone, its end, hbm_held_s */
} hbm_case_t;

static fsdp_kernel_t hbm_add(void)
{
    fsdp_kernel_t k = {.kind = FSDP_K_ADD};

    k.u.add.n = (size_t)1 << 22;
    k.u.add.dtype = FSDP_DTYPE_F32;
    return k;
}

/* an all-gather of 2^16 f32 a rank on a side stream, and at once an add on the compute stream */
static fsdp_status_t hbm_rank(fsdp_dev_t *dev, void *arg)
{
    fsdp_kernel_t k = hbm_add();
    fsdp_stream_t *side = NULL;
    hbm_case_t *c = &((hbm_case_t *)arg)[dev->rank];
    fsdp_sim_time_stats_t ts;
    fsdp_status_t st;
    double t0;

    if ((st = fsdp_dev_stream_create(dev, "side", 0, &side)) != FSDP_OK)
        return st;
    t0 = fsdp_sim_stream_time(dev, NULL);
    st = fsdp_dev_all_gather(dev, fsdp_dev_group_world(dev), NULL, NULL, (size_t)1 << 16,
                             FSDP_DTYPE_F32, side);
    if (st == FSDP_OK)
        st = fsdp_dev_kernel(dev, NULL, &k);
    c->ag_s = fsdp_sim_stream_time(dev, side) - t0;
    c->end = fsdp_sim_stream_time(dev, NULL) - t0;
    if (st == FSDP_OK && (st = fsdp_sim_time_stats(dev, &ts)) == FSDP_OK)
        c->held = ts.hbm_held_s;
    fsdp_dev_stream_destroy(dev, side);
    return st;
}

/* a GPU of 2^30 B/s of HBM, no SMs modelled, element-wise kernels fused (each at the HBM's
 * rate); collectives at 2^29 bus bytes/s on one channel, nccl.hbm_traffic_factor f */
static const char *hbm_json(double f)
{
    static char json[1024];

    snprintf(json, sizeof(json),
             "{\"name\": \"hbm\", \"nodes\": 1, \"gpus_per_node\": 4, \"ops\": \"fused\","
             " \"gpu\": {\"memory_bytes\": 1099511627776, \"matmul_flops_per_s\": "
             "{\"f32\": 1073741824}, \"vector_flops_per_s\": 0, \"hbm_bytes_per_s\": 1073741824, "
             "\"memory_efficiency\": 1, \"kernel_latency_s\": 0, \"sms\": 0},"
             " \"host\": {\"h2d_bytes_per_s\": 0, \"d2h_bytes_per_s\": 0},"
             " \"nccl\": {\"intra_bus_bytes_per_s\": 536870912, \"channels\": 1, "
             "\"hbm_traffic_factor\": %g}}",
             f);
    return json;
}

static void test_hbm_contention(void)
{
    fsdp_sim_params_t p;
    fsdp_sim_profile_t h100;
    fsdp_kernel_t k = hbm_add();

    for (int f = 0; f <= 3; f += 3) {
        hbm_case_t cs[4], c;
        double g, a, h, slow;

        fsdp_sim_params_init(&p);
        p.world_size = 4;
        p.mode = FSDP_SIM_SHAPE;
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_parse(hbm_json(f), &p.profile), FSDP_OK);
        CU_ASSERT_EQUAL(p.profile.nccl.hbm_traffic_factor, (double)f);
        /* 2^22 x 12 bytes at 2^30 B/s: 48 ms, the HBM's whole rate */
        g = fsdp_sim_kernel_time(&p.profile, &k);
        CU_ASSERT_DOUBLE_EQUAL(g, 12.0 * P2(22) / P2(30), 1e-15);
        memset(cs, 0, sizeof(cs));
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_launch(&p, hbm_rank, cs, NULL), FSDP_OK);
        for (int r = 1; r < 4; r++)
            CU_ASSERT(memcmp(&cs[r], &cs[0], sizeof(cs[0])) == 0);
        c = cs[0];
        a = c.ag_s;
        CU_ASSERT(a > 0.0 && a < g);
        /* the all-gather moves f x its bus bytes, 3 x 2^18 (a rank sends and receives 3 of the
         * 4 shards), over its time: while it runs the add gets 2^30 / (2^30 + h) of the HBM */
        h = f * 3.0 * P2(18) / a;
        slow = (P2(30) + h) / P2(30);
        if (f == 0) {
            CU_ASSERT_EQUAL(c.end, g);
            CU_ASSERT_EQUAL(c.held, 0.0);
        } else {
            /* over [0, a) it does a / (g x slow) of its work, the rest at the whole rate */
            CU_ASSERT_DOUBLE_EQUAL(c.end, a + (1.0 - a / (g * slow)) * g, 1e-12 * g);
            CU_ASSERT(c.end > g);
            CU_ASSERT_DOUBLE_EQUAL(c.held, c.end - g, 1e-12 * g);
        }
    }
    /* the presets: 3 HBM bytes a bus byte; 0 turns it off, out of [0, 8] is refused */
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_preset("h100", &h100), FSDP_OK);
    CU_ASSERT_EQUAL(h100.nccl.hbm_traffic_factor, 3.0);
    CU_ASSERT_EQUAL(fsdp_sim_profile_parse(hbm_json(9), &p.profile), FSDP_ERR_INVALID_PARAM);
}

/* A GEMM issued before the all-gather that overlaps it: priced on the whole GPU, unless a book
 * of an earlier run of the job (fsdp_sim_holds_t) says the all-gather ran beside it. */
static fsdp_status_t sm_before_rank(fsdp_dev_t *dev, void *arg)
{
    fsdp_kernel_t k = sm_gemm();
    fsdp_stream_t *side = NULL;
    double *end = arg;
    fsdp_status_t st;

    if ((st = fsdp_dev_stream_create(dev, "side", 0, &side)) != FSDP_OK)
        return st;
    st = fsdp_dev_kernel(dev, NULL, &k);
    if (st == FSDP_OK)
        st = fsdp_dev_all_gather(dev, fsdp_dev_group_world(dev), NULL, NULL, (size_t)1 << 16,
                                 FSDP_DTYPE_F32, side);
    end[2 * dev->rank] = fsdp_sim_stream_time(dev, NULL);
    end[2 * dev->rank + 1] = fsdp_sim_stream_time(dev, side);
    fsdp_dev_stream_destroy(dev, side);
    return st;
}

static void test_sm_book(void)
{
    fsdp_sim_params_t p;
    fsdp_sim_holds_t *book = fsdp_sim_holds_create(4);
    fsdp_kernel_t k = sm_gemm();
    double end[8], g, a;

    CU_ASSERT_PTR_NOT_NULL_FATAL(book);
    CU_ASSERT_PTR_NULL(fsdp_sim_holds_create(0));
    fsdp_sim_params_init(&p);
    p.world_size = 4;
    p.mode = FSDP_SIM_SHAPE;
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_parse(sm_json(1), &p.profile), FSDP_OK);
    g = fsdp_sim_kernel_time(&p.profile, &k);
    /* without a book, and in a book's first run: the GEMM has the GPU to itself */
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_launch(&p, sm_before_rank, end, NULL), FSDP_OK);
    CU_ASSERT_EQUAL(end[0], g);
    p.holds = book;
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_launch(&p, sm_before_rank, end, NULL), FSDP_OK);
    CU_ASSERT_EQUAL(end[0], g);
    CU_ASSERT_EQUAL(fsdp_sim_holds_count(book, 3), 1);
    CU_ASSERT_EQUAL(fsdp_sim_holds_count(book, 4), 0);
    a = end[1];
    CU_ASSERT(a > 0.0 && a < g);
    /* repeating that run: priced as it was, with no earlier holds */
    fsdp_sim_holds_repeat(book);
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_launch(&p, sm_before_rank, end, NULL), FSDP_OK);
    CU_ASSERT_EQUAL(end[0], g);
    CU_ASSERT_EQUAL(fsdp_sim_holds_count(book, 0), 1);
    fsdp_sim_holds_repeat(NULL);
    /* the next runs: the all-gather of the run before holds an SM of the GEMM's over [0, a) */
    for (int run = 0; run < 2; run++) {
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_launch(&p, sm_before_rank, end, NULL), FSDP_OK);
        for (int r = 0; r < 4; r++) {
            CU_ASSERT_DOUBLE_EQUAL(end[2 * r], g + a / 4.0, 1e-12 * g);
            CU_ASSERT_EQUAL(end[2 * r + 1], a);
        }
    }
    /* a book of another world is refused */
    p.world_size = 2;
    capture_start();
    CU_ASSERT_EQUAL(fsdp_sim_launch(&p, sm_before_rank, end, NULL), FSDP_ERR_INVALID_PARAM);
    capture_end();
    CU_ASSERT_PTR_NOT_NULL(strstr(last_log, "holds book is for a world of 4 ranks, not 2"));
    fsdp_sim_holds_destroy(book);
    fsdp_sim_holds_destroy(NULL);
}

/* A hold of the book is not counted by a kernel of the collective's own stream, which runs
 * before or after it: a kernel issued first, on the compute stream or on the all-gather's, and
 * the all-gather of 2^16 f32 a rank after it on "side" (each rank's clocks are its own). */
typedef struct own_case {
    fsdp_kernel_t k;
    int own;                /* the kernel on "side" */
    double end[4], ag_s[4]; /* the kernel's end, the all-gather's time */
} own_case_t;

static fsdp_status_t own_rank(fsdp_dev_t *dev, void *arg)
{
    own_case_t *c = arg;
    fsdp_stream_t *side = NULL;
    fsdp_status_t st;
    double t0;

    if ((st = fsdp_dev_stream_create(dev, "side", 0, &side)) != FSDP_OK)
        return st;
    t0 = fsdp_sim_stream_time(dev, NULL);
    st = fsdp_dev_kernel(dev, c->own ? side : NULL, &c->k);
    c->end[dev->rank] = fsdp_sim_stream_time(dev, c->own ? side : NULL) - t0;
    if (st == FSDP_OK)
        st = fsdp_dev_all_gather(dev, fsdp_dev_group_world(dev), NULL, NULL, (size_t)1 << 16,
                                 FSDP_DTYPE_F32, side);
    c->ag_s[dev->rank] = fsdp_sim_stream_time(dev, side) - t0 - (c->own ? c->end[dev->rank] : 0);
    fsdp_dev_stream_destroy(dev, side);
    return st;
}

static void test_own_stream(void)
{
    for (int hbm = 0; hbm < 2; hbm++) {
        fsdp_sim_params_t p;
        fsdp_sim_holds_t *book = fsdp_sim_holds_create(4);
        own_case_t c = {.k = hbm ? hbm_add() : sm_gemm()};
        double g, a, slowed;

        CU_ASSERT_PTR_NOT_NULL_FATAL(book);
        fsdp_sim_params_init(&p);
        p.world_size = 4;
        p.mode = FSDP_SIM_SHAPE;
        p.holds = book;
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_parse(hbm ? hbm_json(3) : sm_json(1), &p.profile),
                              FSDP_OK);
        g = fsdp_sim_kernel_time(&p.profile, &c.k);
        /* the book's first run: the kernel alone, the all-gather over [0, a) beside it */
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_launch(&p, own_rank, &c, NULL), FSDP_OK);
        CU_ASSERT_EQUAL(c.end[0], g);
        a = c.ag_s[0];
        CU_ASSERT(a > 0.0 && a < g);
        /* the next, on the compute stream: the all-gather of the run before holds an SM of the
         * GEMM's 4 over [0, a), or 3 x its 3 x 2^18 bus bytes of the add's HBM (as in
         * test_hbm_contention) */
        if (hbm) {
            double slow = (P2(30) + 9.0 * P2(18) / a) / P2(30);

            slowed = a + (1.0 - a / (g * slow)) * g;
        } else {
            slowed = g + a / 4.0;
        }
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_launch(&p, own_rank, &c, NULL), FSDP_OK);
        for (int r = 0; r < 4; r++)
            CU_ASSERT_DOUBLE_EQUAL(c.end[r], slowed, 1e-12 * g);
        CU_ASSERT(slowed > g);
        /* the same book on the all-gather's own stream: the kernel runs before it, not slowed */
        c.own = 1;
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_launch(&p, own_rank, &c, NULL), FSDP_OK);
        for (int r = 0; r < 4; r++) {
            CU_ASSERT_EQUAL(c.end[r], g);
            CU_ASSERT_EQUAL(c.ag_s[r], a);
        }
        fsdp_sim_holds_destroy(book);
    }
}

/* Hybrid sharding's replicate groups on nodes of one NIC: 8 groups of one rank per node on 2
 * nodes all-reduce at once and share each node's NIC (fsdp_sim_coll_time_shared with the
 * launch's 8 ranks a node); the shard groups, inside a node, do not use it. */
static fsdp_status_t nic_rank(fsdp_dev_t *dev, void *arg)
{
    const fsdp_sim_profile_t *p = fsdp_sim_rank_profile(dev);
    fsdp_group_t *rep = NULL;
    fsdp_stream_t *s = NULL;
    double *cost = arg, ready;
    fsdp_status_t st;

    st = fsdp_dev_group_split(dev, fsdp_dev_group_world(dev), dev->rank % 8, dev->rank, &rep);
    if (st == FSDP_OK)
        st = fsdp_dev_stream_create(dev, "rep", 0, &s);
    ready = fsdp_dev_host_time(dev) + p->host.launch_latency_s;
    if (st == FSDP_OK)
        st = fsdp_dev_all_reduce(dev, rep, NULL, NULL, (size_t)1 << 26, FSDP_DTYPE_F32,
                                 FSDP_REDUCE_SUM, s);
    cost[dev->rank] = fsdp_sim_stream_time(dev, s) - ready;
    fsdp_dev_stream_destroy(dev, s);
    fsdp_dev_group_destroy(dev, rep);
    return st;
}

static void test_nic_sharing(void)
{
    fsdp_sim_params_t p;
    double cost[16], shared, alone;

    fsdp_sim_params_init(&p);
    p.world_size = 16;
    p.ranks_per_node = 8;
    p.mode = FSDP_SIM_SHAPE;
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_preset("h100", &p.profile), FSDP_OK);
    p.profile.nccl.nics_per_node = 1;
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_launch(&p, nic_rank, cost, NULL), FSDP_OK);
    shared = fsdp_sim_coll_time_shared(&p.profile, FSDP_SIM_COLL_ALL_REDUCE, 2, 2, 8,
                                       4.0 * (1 << 26), NULL);
    alone = fsdp_sim_coll_time(&p.profile, FSDP_SIM_COLL_ALL_REDUCE, 2, 2, 4.0 * (1 << 26), NULL);
    CU_ASSERT(shared > 4.0 * alone); /* an eighth of the NIC: the bytes' part 8x longer */
    for (int r = 0; r < 16; r++)
        CU_ASSERT_DOUBLE_EQUAL(cost[r], shared, 1e-12 * shared);
}

/* ---- fibers: what fails a collective still fails it, never hangs ---- */

static fsdp_status_t fiber_fail_rank(fsdp_dev_t *dev, void *arg)
{
    fsdp_group_t *world = fsdp_dev_group_world(dev);
    int what = *(int *)arg;

    if (what == 0) /* rank 1 leaves early: a rank that can never arrive */
        return dev->rank == 1 ? FSDP_OK : fsdp_dev_barrier(dev, world);
    if (what == 1) /* different collectives */
        return dev->rank == 1 ? fsdp_dev_barrier(dev, world)
                              : fsdp_dev_all_reduce(dev, world, NULL, NULL, 1, FSDP_DTYPE_F32,
                                                    FSDP_REDUCE_SUM, NULL);
    /* rank 1 is slow (on the host, holding its worker): the others time out */
    if (dev->rank == 1) {
        struct timespec ts = {0, 600 * 1000 * 1000};
        nanosleep(&ts, NULL);
        return FSDP_OK;
    }
    return fsdp_dev_barrier(dev, world);
}

static void test_fiber_failures(void)
{
    static const fsdp_status_t want[3] = {FSDP_ERR_COLLECTIVE_MISMATCH,
                                          FSDP_ERR_COLLECTIVE_MISMATCH, FSDP_ERR_TIMEOUT};

    capture_start(); /* the errors are expected */
    for (int what = 0; what < 3; what++) {
        fsdp_sim_params_t p;
        fsdp_status_t st[4];
        fsdp_sim_params_init(&p);
        p.world_size = 4;
        p.mode = FSDP_SIM_SHAPE;
        p.fibers = 1;
        p.workers = 2;
        p.timeout_s = what == 2 ? 0.2 : 20.0;
        fsdp_sim_launch(&p, fiber_fail_rank, &what, st);
        CU_ASSERT_EQUAL(st[0], want[what]);
        CU_ASSERT_EQUAL(st[2], want[what]);
        CU_ASSERT_EQUAL(st[3], want[what]);
    }
    capture_end();
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"forward: first all-gather plus compute", test_forward_overlap},
        {"backward BACKWARD_PRE: first all-gather and last reduce-scatter",
         test_backward_prefetch_pre},
        {"backward without prefetch: all-gathers exposed", test_backward_no_prefetch},
        {"limiter bounds live unsharded buffers", test_limiter_bounds_memory},
        {"the trace: ops in stream order with their intervals", test_trace_intervals},
        {"model-state memory: 16 psi / N plus rounding", test_model_state_memory},
        {"NCCL formula against the reference tables", test_nccl_formula},
        {"compute model: quantization, attention, eager ops", test_compute_model},
        {"profile errors", test_profile_errors},
        {"profile JSON round trip and preset files", test_profile_json},
        {"NCCL terms: floor, channels, switch points, NVLS, tree, PAT", test_nccl_terms},
        {"NCCL model against stored times", test_nccl_table},
        {"NCCL 2.18.5's tuning formulas", test_nccl_218},
        {"the 2023 stacks: Triton FlashAttention by length, NCCL 2.18", test_stack_2023},
        {"determinism; shape mode and fibers equal data mode", test_determinism},
        {"stream, device and accounting queries", test_query_api},
        {"collectives take SMs from GEMMs", test_sm_contention},
        {"collectives take HBM bandwidth from memory-bound kernels", test_hbm_contention},
        {"a book of held SMs prices kernels issued before their collective", test_sm_book},
        {"a kernel does not count the holds of its own stream", test_own_stream},
        {"replicate groups share their nodes' NICs", test_nic_sharing},
        {"fibers: mismatches, early exits and timeouts fail, never hang", test_fiber_failures},
        {NULL, NULL},
    };
    return fsdp_test_run("simtime", tests);
}
