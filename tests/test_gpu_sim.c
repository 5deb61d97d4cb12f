/* The gpu backend against the simulator: the same per-rank code on both, compared.
 *
 *  - every collective (all-gather, reduce-scatter and all-reduce with sum, avg and max,
 *    broadcast; f32 and bf16) on min(devices, 4) ranks: the GPUs' results equal the
 *    simulator's within the dtype's rounding;
 *  - gpt2-tiny trained on one GPU and on one simulated rank from the same initial weights and
 *    batches: the losses of every step agree within f32 tolerance;
 *  - both runs traced: `fsdp-trace diff sim.db gpu.db` finds no structural difference (exit 0),
 *    and the caching allocator's `allocated` after every event is the same figure on both.
 *
 * Exits 77 (skipped) when the gpu backend module is not loaded or no device is visible, unless
 * FSDP_REQUIRE_GPU is set (make check-gpu): then that is a failure. */
#include <fsdp/fsdp.h>
#include <fsdp/gpu.h>
#include <fsdp/sim.h>
#include <fsdp/trace.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

#define MAX_RANKS 4
#define COUNT 1000 /* elements per rank */

/* ---- collectives ---- */

/* The cases every rank runs, in order; each leaves `count` (or count x ranks) f32 results. */
typedef enum {
    C_ALL_GATHER,
    C_RS_SUM,
    C_RS_AVG,
    C_RS_MAX,
    C_AR_SUM,
    C_AR_AVG,
    C_AR_MAX,
    C_BROADCAST,
    C_COUNT
} coll_case_t;

static const char *const case_names[C_COUNT] = {
    "all_gather",     "reduce_scatter sum", "reduce_scatter avg", "reduce_scatter max",
    "all_reduce sum", "all_reduce avg",     "all_reduce max",     "broadcast"};

/* [backend][dtype][case][rank]: the results as f32, COUNT x MAX_RANKS each */
static float results[2][2][C_COUNT][MAX_RANKS][COUNT * MAX_RANKS];
static int coll_backend; /* which results a run writes: 0 sim, 1 gpu */

/* k/8 with |k| <= 48: exact in bf16, and so are sums of four of them */
static float input(int rank, size_t i)
{
    return (float)((int)((rank * 131 + (int)i * 7) % 97) - 48) / 8.0f;
}

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16); /* exact for these inputs */
}

static float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static fsdp_status_t coll_rank(fsdp_dev_t *dev, void *arg)
{
    fsdp_group_t *w = fsdp_dev_group_world(dev);
    const int n = dev->world_size, r = dev->rank;
    const size_t big = (size_t)COUNT * (size_t)n;
    fsdp_stream_t *s = fsdp_dev_compute_stream(dev);
    void *send = NULL, *recv = NULL, *host = malloc(big * 4);
    fsdp_status_t st;

    (void)arg;
    if (host == NULL)
        return FSDP_ERR_NO_MEMORY;
    st = fsdp_dev_segment_alloc(dev, FSDP_MEMKIND_DEVICE, big * 4, &send);
    if (st == FSDP_OK)
        st = fsdp_dev_segment_alloc(dev, FSDP_MEMKIND_DEVICE, big * 4, &recv);
    for (int d = 0; d < 2 && st == FSDP_OK; d++) {
        fsdp_dtype_t dt = d == 0 ? FSDP_DTYPE_F32 : FSDP_DTYPE_BF16;
        size_t es = d == 0 ? 4 : 2;
        for (int c = 0; c < C_COUNT && st == FSDP_OK; c++) {
            size_t out = c == C_ALL_GATHER ? big : COUNT;
            size_t in = c >= C_RS_SUM && c <= C_RS_MAX ? big : COUNT;
            for (size_t i = 0; i < in; i++) {
                float v = input(r, i);
                if (d == 0)
                    ((float *)host)[i] = v;
                else
                    ((uint16_t *)host)[i] = to_bf16(v);
            }
            st = fsdp_dev_memcpy_async(dev, c == C_BROADCAST ? recv : send, host, in * es, s);
            if (st != FSDP_OK)
                break;
            switch (c) {
            case C_ALL_GATHER:
                st = fsdp_dev_all_gather(dev, w, send, recv, COUNT, dt, s);
                break;
            case C_RS_SUM:
            case C_RS_AVG:
            case C_RS_MAX:
                st = fsdp_dev_reduce_scatter(dev, w, send, recv, COUNT, dt,
                                             (fsdp_reduce_op_t)(FSDP_REDUCE_SUM + (c - C_RS_SUM)),
                                             s);
                break;
            case C_AR_SUM:
            case C_AR_AVG:
            case C_AR_MAX:
                st = fsdp_dev_all_reduce(dev, w, send, recv, COUNT, dt,
                                         (fsdp_reduce_op_t)(FSDP_REDUCE_SUM + (c - C_AR_SUM)), s);
                break;
            default:
                st = fsdp_dev_broadcast(dev, w, recv, COUNT, dt, n - 1, s);
                break;
            }
            if (st == FSDP_OK)
                st = fsdp_dev_memcpy_async(dev, host, recv, out * es, s);
            if (st == FSDP_OK)
                st = fsdp_dev_stream_synchronize(dev, s);
            for (size_t i = 0; st == FSDP_OK && i < out; i++)
                results[coll_backend][d][c][r][i] =
                    d == 0 ? ((float *)host)[i] : from_bf16(((uint16_t *)host)[i]);
        }
    }
    fsdp_dev_segment_free(dev, FSDP_MEMKIND_DEVICE, send);
    fsdp_dev_segment_free(dev, FSDP_MEMKIND_DEVICE, recv);
    free(host);
    return st;
}

static void test_collectives(void)
{
    int n = fsdp_gpu_device_count() < MAX_RANKS ? fsdp_gpu_device_count() : MAX_RANKS;
    fsdp_sim_params_t sp;
    int bad = 0;

    fsdp_sim_params_init(&sp);
    sp.world_size = n;
    coll_backend = 0;
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_launch(&sp, coll_rank, NULL, NULL), FSDP_OK);
    coll_backend = 1;
    CU_ASSERT_EQUAL_FATAL(fsdp_gpu_launch_local(n, 60.0, coll_rank, NULL), FSDP_OK);
    for (int d = 0; d < 2; d++) {
        /* avg divides once: one rounding of the dtype; sums and max of these inputs are exact */
        double tol = d == 0 ? 1e-6 : 1.0 / 128.0;
        for (int c = 0; c < C_COUNT; c++) {
            size_t out = c == C_ALL_GATHER ? (size_t)COUNT * (size_t)n : COUNT;
            for (int r = 0; r < n; r++) {
                for (size_t i = 0; i < out; i++) {
                    double a = results[0][d][c][r][i], b = results[1][d][c][r][i];
                    if (fabs(a - b) > tol * (fabs(a) + 1.0)) {
                        if (bad++ < 5)
                            fprintf(stderr, "\n  %s %s rank %d [%zu]: sim %g, gpu %g",
                                    case_names[c], d == 0 ? "f32" : "bf16", r, i, a, b);
                    }
                }
            }
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* ---- gpt2-tiny on one rank of each backend ---- */

#define STEPS 5
#define ROWS 4

typedef struct gpt_run {
    const char *trace_path;
    fsdp_api_t api; /* FSDP1, or fully_shard (the copy-outs as chunk_copy kernels) */
    float losses[STEPS];
    size_t peak_allocated;
} gpt_run_t;

static fsdp_status_t gpt_rank(fsdp_dev_t *dev, void *arg)
{
    gpt_run_t *g = arg;
    fsdp_gpt2_config_t cfg;
    fsdp_optim_config_t oc;
    fsdp_config_t fc;
    fsdp_trace_t *trace = NULL;
    fsdp_trace_run_info_t info;
    fsdp_t *fs = NULL;
    fsdp_lm_t *m = NULL;
    fsdp_optim_t *opt = NULL;
    fsdp_mem_stats_t ms;
    int32_t *in = NULL, *tg = NULL;
    size_t T;
    fsdp_status_t st;

    fsdp_gpt2_config_parse("gpt2-tiny", &cfg);
    T = (size_t)cfg.n_positions;
    in = malloc(ROWS * T * sizeof(*in));
    tg = malloc(ROWS * T * sizeof(*tg));
    if (in == NULL || tg == NULL) {
        free(in);
        free(tg);
        return FSDP_ERR_NO_MEMORY;
    }
    memset(&info, 0, sizeof(info));
    info.backend = fsdp_dev_is_gpu(dev) ? "gpu" : "sim";
    info.world_size = 1;
    st = fsdp_trace_open(g->trace_path, &info, &trace);
    if (st == FSDP_OK)
        st = fsdp_trace_attach(trace, dev);
    fsdp_config_init(&fc);
    fc.api = g->api;
    fsdp_optim_config_init(&oc, FSDP_OPTIM_ADAMW);
    if (st == FSDP_OK)
        st = fsdp_create(dev, &fc, &fs);
    if (st == FSDP_OK)
        st = fsdp_gpt2_create(fs, &cfg, &m);
    if (st == FSDP_OK)
        st = fsdp_lm_init_params(m, 7);
    if (st == FSDP_OK)
        st = fsdp_optim_create(fs, &oc, &opt);
    for (int s = 0; s < STEPS && st == FSDP_OK; s++) {
        for (size_t i = 0; i < ROWS * T; i++) {
            in[i] = (int32_t)((i * 31 + (size_t)s * 17) % (size_t)cfg.vocab_size);
            tg[i] = (int32_t)((i * 31 + (size_t)s * 17 + 1) % (size_t)cfg.vocab_size);
        }
        st = fsdp_lm_forward_backward(m, in, tg, ROWS, T, &g->losses[s]);
        if (st == FSDP_OK)
            st = fsdp_optim_step(opt);
        fsdp_zero_grad(fs);
        if (st == FSDP_OK)
            st = fsdp_dev_stream_synchronize(dev, NULL);
        if (st == FSDP_OK) {
            fsdp_mem_get_stats(fsdp_memory(fs), &ms);
            fsdp_trace_step(dev, s + 1, g->losses[s], 0.0, &ms);
        }
    }
    if (fs != NULL) {
        fsdp_mem_get_stats(fsdp_memory(fs), &ms);
        g->peak_allocated = ms.peak_allocated;
    }
    fsdp_optim_destroy(opt);
    fsdp_lm_destroy(m);
    fsdp_destroy(fs);
    fsdp_trace_detach(dev);
    if (fsdp_trace_close(trace) != FSDP_OK && st == FSDP_OK)
        st = FSDP_ERR_IO;
    free(in);
    free(tg);
    return st;
}

static char tmpdir[256];
static gpt_run_t sim_run, gpu_run;
static char sim_db[512], gpu_db[512];

static void test_gpt2_losses(void)
{
    fsdp_sim_params_t sp;

    snprintf(sim_db, sizeof(sim_db), "%s/sim.db", tmpdir);
    snprintf(gpu_db, sizeof(gpu_db), "%s/gpu.db", tmpdir);
    sim_run.trace_path = sim_db;
    gpu_run.trace_path = gpu_db;
    fsdp_sim_params_init(&sp);
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_launch(&sp, gpt_rank, &sim_run, NULL), FSDP_OK);
    CU_ASSERT_EQUAL_FATAL(fsdp_gpu_launch_local(1, 60.0, gpt_rank, &gpu_run), FSDP_OK);
    for (int s = 0; s < STEPS; s++) {
        /* f32 throughout; GEMMs sum in another order on the GPU: relative drift, small */
        double a = sim_run.losses[s], b = gpu_run.losses[s];
        if (!(fabs(a - b) <= 2e-3 * fabs(a)))
            fprintf(stderr, "\n  step %d: sim loss %.7g, gpu loss %.7g", s + 1, a, b);
        CU_ASSERT(fabs(a - b) <= 2e-3 * fabs(a));
    }
    CU_ASSERT(sim_run.losses[STEPS - 1] < sim_run.losses[0]); /* it trains */
}

/* The same under fully_shard: the gpu backend's copy-in, chunk_copy copy-outs and chunk-cat
 * against the sim's, and against FSDP1's losses. */
static void test_gpt2_losses_fsdp2(void)
{
    fsdp_sim_params_t sp;
    gpt_run_t sim2 = {.api = FSDP_API_FSDP2}, gpu2 = {.api = FSDP_API_FSDP2};
    char db[2][512];

    snprintf(db[0], sizeof(db[0]), "%s/sim2.db", tmpdir);
    snprintf(db[1], sizeof(db[1]), "%s/gpu2.db", tmpdir);
    sim2.trace_path = db[0];
    gpu2.trace_path = db[1];
    fsdp_sim_params_init(&sp);
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_launch(&sp, gpt_rank, &sim2, NULL), FSDP_OK);
    CU_ASSERT_EQUAL_FATAL(fsdp_gpu_launch_local(1, 60.0, gpt_rank, &gpu2), FSDP_OK);
    for (int s = 0; s < STEPS; s++) {
        double a = sim2.losses[s], b = gpu2.losses[s];
        if (!(fabs(a - b) <= 2e-3 * fabs(a)))
            fprintf(stderr, "\n  fsdp2 step %d: sim loss %.7g, gpu loss %.7g", s + 1, a, b);
        CU_ASSERT(fabs(a - b) <= 2e-3 * fabs(a));
        /* one rank: the same values as FSDP1's, to the bit on the sim */
        CU_ASSERT_EQUAL(sim2.losses[s], sim_run.losses[s]);
    }
    CU_ASSERT_EQUAL(sim2.peak_allocated > 0, 1);
}

static const char *tool_path(void)
{
    static char buf[1024];
    const char *top = getenv("top_builddir");
    snprintf(buf, sizeof(buf), "%s/tools/fsdp-trace", top != NULL ? top : "..");
    return access(buf, X_OK) == 0 ? buf : NULL;
}

static void test_trace_diff(void)
{
    char cmd[2048];
    fsdp_trace_diff_t d;
    int rc;

    CU_ASSERT_PTR_NOT_NULL_FATAL(tool_path());
    snprintf(cmd, sizeof(cmd), "%s diff '%s' '%s' >/dev/null", tool_path(), sim_db, gpu_db);
    rc = system(cmd);
    CU_ASSERT(WIFEXITED(rc) && WEXITSTATUS(rc) == 0);
    CU_ASSERT_EQUAL_FATAL(fsdp_trace_diff(sim_db, 0, gpu_db, 0, NULL, &d), FSDP_OK);
    if (d.what != FSDP_TRACE_DIV_NONE)
        fprintf(stderr, "\n  %s", d.message);
    CU_ASSERT_EQUAL(d.what, FSDP_TRACE_DIV_NONE);
}

/* Every event's `allocated`, in (rank, seq) order. */
typedef struct alloc_list {
    uint64_t *v;
    size_t n, cap;
} alloc_list_t;

static int collect_allocated(void *arg, int rank, uint64_t seq, const fsdp_trace_event_t *ev)
{
    alloc_list_t *l = arg;

    (void)rank, (void)seq;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 1024;
        uint64_t *v = realloc(l->v, cap * sizeof(*v));
        if (v == NULL)
            return 1;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = ev->allocated;
    return 0;
}

static void read_allocated(const char *path, alloc_list_t *l)
{
    fsdp_trace_reader_t *rd = NULL;
    int64_t run = 0;

    CU_ASSERT_EQUAL_FATAL(fsdp_trace_reader_open(path, &rd), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_trace_reader_find_run(rd, 0, &run), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_trace_reader_events(rd, run, -1, collect_allocated, l), FSDP_OK);
    fsdp_trace_reader_close(rd);
}

static void test_allocated(void)
{
    alloc_list_t a = {0}, b = {0};
    size_t first = 0;

    read_allocated(sim_db, &a);
    read_allocated(gpu_db, &b);
    CU_ASSERT(a.n > 0);
    CU_ASSERT_EQUAL(a.n, b.n);
    while (first < a.n && first < b.n && a.v[first] == b.v[first])
        first++;
    if (first < a.n || first < b.n)
        fprintf(stderr, "\n  allocated differs from event %zu on", first);
    CU_ASSERT(first == a.n && first == b.n);
    CU_ASSERT_EQUAL(sim_run.peak_allocated, gpu_run.peak_allocated);
    free(a.v);
    free(b.v);
}

static const fsdp_test_case_t tests[] = {
    {"collectives against the simulator", test_collectives},
    {"gpt2-tiny losses against the simulator", test_gpt2_losses},
    {"gpt2-tiny under fully_shard against the simulator", test_gpt2_losses_fsdp2},
    {"structural trace diff against the simulator", test_trace_diff},
    {"allocated against the simulator", test_allocated},
    {NULL, NULL},
};

static int skip(const char *why)
{
    return fsdp_test_skip_gpu("test_gpu_sim", why);
}

int main(void)
{
    int rc;

    fsdp_test_gpu_banner("test_gpu_sim");
    if (!fsdp_gpu_built())
        return skip(fsdp_gpu_load_error());
    if (fsdp_gpu_device_count() == 0)
        return skip("no CUDA device visible");
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/fsdp_test_gpu_sim.XXXXXX");
    if (mkdtemp(tmpdir) == NULL) {
        perror("mkdtemp");
        return 99;
    }
    rc = fsdp_test_run("gpu against sim", tests);
    for (const char *db = sim_db; db != NULL; db = db == sim_db ? gpu_db : NULL) {
        char p[600];
        remove(db);
        snprintf(p, sizeof(p), "%s-wal", db);
        remove(p);
        snprintf(p, sizeof(p), "%s-shm", db);
        remove(p);
    }
    rmdir(tmpdir);
    return rc;
}
