/* fsdp-trace calibrate (tools/trace_calibrate.c): a sim run under a known profile that differs
 * from its preset, traced; the profile fitted from the trace must recover the known numbers
 * within 1%.
 *
 * The run: 8 ranks, 4 per node (2 nodes), shape mode. Collectives of several sizes on the
 * world (8 ranks, 2 nodes), on each node (4 ranks, 1 node), across nodes with 2 ranks per
 * node (4 ranks, 2 nodes) and with 1 rank per node (2 ranks, 2 nodes), so that every step
 * count and link is seen; memory-bound kernels of several sizes, compute-bound element-wise
 * ones (gelu_fwd under a low vector rate), and GEMMs of three dtypes from memory-bound to
 * compute-bound sizes. */
#include <fsdp/fsdp.h>
#include <fsdp/trace.h>

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sim_hidden.h"
#include "test_util.h"
#include <fsdp/calibrate.h>

#define WORLD 8
#define PER_NODE 4

static char failure[512];
static pthread_mutex_t fail_lock = PTHREAD_MUTEX_INITIALIZER;

static fsdp_status_t rank_fail(fsdp_dev_t *dev, const char *what, fsdp_status_t st)
{
    pthread_mutex_lock(&fail_lock);
    if (failure[0] == '\0')
        snprintf(failure, sizeof(failure), "rank %d: %s: %s", dev->rank, what,
                 fsdp_status_string(st));
    pthread_mutex_unlock(&fail_lock);
    return st;
}

#define TRY(what, call)                                                                            \
    do {                                                                                           \
        fsdp_status_t st_ = (call);                                                                \
        if (st_ != FSDP_OK)                                                                        \
            return rank_fail(dev, what, st_);                                                      \
    } while (0)

/* The ring / Simple profile of the run, and the numbers it changes from its preset. */
static void ring_simple(fsdp_sim_profile_t *p)
{
    CU_ASSERT_FATAL(fsdp_sim_profile_preset("h100", p) == FSDP_OK);
    p->nccl.algorithms = 1u << FSDP_SIM_ALGO_RING;
    p->nccl.protocols = 1u << FSDP_SIM_PROTO_SIMPLE;
}

static void known_profile(fsdp_sim_profile_t *p)
{
    ring_simple(p);
    p->nccl.call_floor_s = 7e-6;
    p->nccl.net_floor_s = 19e-6;
    p->nccl.intra_latency_s[FSDP_SIM_ALGO_RING][FSDP_SIM_PROTO_SIMPLE] = 2.5e-6;
    p->nccl.inter_latency_s[FSDP_SIM_ALGO_RING][FSDP_SIM_PROTO_SIMPLE] = 21e-6;
    p->nccl.inter_latency_s[FSDP_SIM_ALGO_TREE][FSDP_SIM_PROTO_SIMPLE] = 33e-6;
    p->nccl.net_overhead_s = 1.3e-6; /* x3 = 3.9 us > 2.5 us: binds on multi-node rings */
    p->nccl.intra_bus_bytes_per_s = 290e9;
    p->nccl.nic_bytes_per_s = 38e9;
    p->gpu.kernel_latency_s = 2.1e-6;
    p->gpu.hbm_bytes_per_s = 2.6e12;
    p->gpu.matmul_flops_per_s[FSDP_DTYPE_F32] = 52e12;
    p->gpu.matmul_flops_per_s[FSDP_DTYPE_BF16] = 760e12;
    p->gpu.matmul_flops_per_s[FSDP_DTYPE_F16] = 690e12;
    /* low enough that gelu_fwd (20 FLOPs per 8 bytes) is compute-bound, axpy and relu not */
    p->gpu.vector_flops_per_s = 4e12;
    /* a trace's kernel events carry FLOPs, not shapes: calibration cannot undo the tile and
     * wave quantization, so the known profile has none */
    p->gpu.sms = 0;
    /* one kernel an event, as the gpu backend runs them (an eager run is the next test's) */
    p->ops = FSDP_SIM_OPS_FUSED;
}

/* A GEMM of m x k by k x n in `dtype`: compute-bound from a few hundred rows on, memory-bound
 * below (both kinds must be told apart). */
static fsdp_status_t gemm(fsdp_dev_t *dev, size_t m, size_t n, size_t k, fsdp_dtype_t dtype)
{
    fsdp_kernel_t g;

    memset(&g, 0, sizeof(g));
    g.kind = FSDP_K_GEMM;
    g.u.gemm.m = m;
    g.u.gemm.n = n;
    g.u.gemm.k = k;
    g.u.gemm.lda = k;
    g.u.gemm.ldb = n;
    g.u.gemm.ldc = n;
    g.u.gemm.alpha = 1.0f;
    g.u.gemm.a_dtype = g.u.gemm.b_dtype = g.u.gemm.c_dtype = dtype;
    return fsdp_dev_kernel(dev, NULL, &g);
}

static fsdp_status_t issue(fsdp_dev_t *dev, fsdp_group_t *g, size_t count)
{

    TRY("all_gather", fsdp_dev_all_gather(dev, g, NULL, NULL, count, FSDP_DTYPE_BF16, NULL));
    TRY("reduce_scatter",
        fsdp_dev_reduce_scatter(dev, g, NULL, NULL, count, FSDP_DTYPE_F32, FSDP_REDUCE_SUM, NULL));
    TRY("all_reduce",
        fsdp_dev_all_reduce(dev, g, NULL, NULL, count, FSDP_DTYPE_F32, FSDP_REDUCE_SUM, NULL));
    return FSDP_OK;
}

static fsdp_status_t calib_rank(fsdp_dev_t *dev, void *arg)
{
    fsdp_group_t *world = fsdp_dev_group_world(dev), *node = NULL, *cross2 = NULL, *cross1 = NULL;
    static const size_t counts[] = {256, 4096, 65536, 1u << 20, 3u << 20};

    TRY("attach", fsdp_trace_attach(arg, dev));
    TRY("split node", fsdp_dev_group_split(dev, world, dev->rank / PER_NODE, dev->rank, &node));
    TRY("split cross2", fsdp_dev_group_split(dev, world, 10 + dev->rank % 2, dev->rank, &cross2));
    TRY("split cross1",
        fsdp_dev_group_split(dev, world, 20 + dev->rank % PER_NODE, dev->rank, &cross1));
    for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
        fsdp_kernel_t k;
        TRY("world", issue(dev, world, counts[i]));
        TRY("node", issue(dev, node, counts[i]));
        TRY("cross2", issue(dev, cross2, counts[i]));
        TRY("cross1", issue(dev, cross1, counts[i]));
        memset(&k, 0, sizeof(k));
        k.kind = FSDP_K_AXPY;
        k.u.axpy.y_dtype = k.u.axpy.x_dtype = FSDP_DTYPE_F32;
        k.u.axpy.n = counts[i] * 3;
        k.u.axpy.alpha = 1.0f;
        TRY("axpy", fsdp_dev_kernel(dev, NULL, &k));
        memset(&k, 0, sizeof(k));
        k.kind = FSDP_K_RELU_FWD;
        k.u.relu_fwd.y_dtype = k.u.relu_fwd.x_dtype = FSDP_DTYPE_BF16;
        k.u.relu_fwd.n = counts[i] * 5;
        TRY("relu", fsdp_dev_kernel(dev, NULL, &k));
        memset(&k, 0, sizeof(k));
        k.kind = FSDP_K_GELU_FWD;
        k.u.gelu_fwd.n = counts[i] * 2;
        TRY("gelu", fsdp_dev_kernel(dev, NULL, &k));
    }
    for (size_t s = 32; s <= 4096; s *= 4) {
        TRY("gemm f32", gemm(dev, s, 2 * s, s, FSDP_DTYPE_F32));
        TRY("gemm bf16", gemm(dev, s, s, 3 * s, FSDP_DTYPE_BF16));
        TRY("gemm f16", gemm(dev, 2 * s, s, s, FSDP_DTYPE_F16));
    }
    TRY("sync", fsdp_dev_stream_synchronize(dev, NULL));
    fsdp_dev_group_destroy(dev, cross1);
    fsdp_dev_group_destroy(dev, cross2);
    fsdp_dev_group_destroy(dev, node);
    fsdp_trace_detach(dev);
    return FSDP_OK;
}

static int close_rel_quiet(double got, double want)
{
    return fabs(got - want) <= 0.01 * fabs(want);
}

static int close_rel(double got, double want)
{
    int ok = fabs(got - want) <= 0.01 * fabs(want);
    if (!ok)
        fprintf(stderr, "\n  fitted %.6g, known %.6g\n", got, want);
    return ok;
}

/* The sweep of calib_rank simulated with the profile `params` holds, traced into path. */
static void sweep(const char *path, fsdp_sim_params_t *params)
{
    fsdp_sim_profile_t prof = params->profile;
    fsdp_trace_run_info_t info = {"sim", WORLD, NULL, "{\"ranks_per_node\": 4}", NULL,
                                  "test_calibrate"};
    fsdp_trace_t *t = NULL;
    char *json;

    remove(path);
    fsdp_sim_params_init(params);
    params->world_size = WORLD;
    params->ranks_per_node = PER_NODE;
    params->mode = FSDP_SIM_SHAPE;
    params->profile = prof;
    params->profile.gpus_per_node = PER_NODE; /* the run row describes the simulated cluster */
    params->profile.nodes = WORLD / PER_NODE;
    json = fsdp_sim_profile_to_json(&params->profile);
    info.profile_json = json;
    CU_ASSERT_FATAL(fsdp_trace_open(path, &info, &t) == FSDP_OK);
    free(json);
    CU_ASSERT(fsdp_sim_launch(params, calib_rank, t, NULL) == FSDP_OK);
    if (failure[0] != '\0')
        fprintf(stderr, "\n  %s\n", failure);
    CU_ASSERT_FATAL(failure[0] == '\0');
    CU_ASSERT_FATAL(fsdp_trace_close(t) == FSDP_OK);
}

static void test_recovers_profile(void)
{
    char path[256];
    fsdp_sim_params_t params;
    fsdp_sim_profile_t base, fitted, back;
    fsdp_calib_options_t opts = {0, 0};
    const fsdp_sim_nccl_profile_t *k, *f;
    const int R = FSDP_SIM_ALGO_RING, T = FSDP_SIM_ALGO_TREE, S = FSDP_SIM_PROTO_SIMPLE;
    FILE *rep = getenv("FSDP_TEST_VERBOSE") != NULL ? stderr : NULL;
    char *json;

    snprintf(path, sizeof(path), "/tmp/test_calibrate.%d.db", (int)getpid());
    known_profile(&params.profile);
    sweep(path, &params);

    /* the base: the preset, with the run's algorithm and protocol (NCCL_ALGO, NCCL_PROTO) */
    ring_simple(&base);
    CU_ASSERT_FATAL(fsdp_trace_calibrate(path, &opts, &base, &fitted, rep) == FSDP_OK);
    k = &params.profile.nccl;
    f = &fitted.nccl;
    CU_ASSERT(close_rel(f->call_floor_s, k->call_floor_s));
    CU_ASSERT(close_rel(f->net_floor_s, k->net_floor_s));
    /* NCCL's base latency is a tuning constant, kept: it and the floor are both once a call */
    CU_ASSERT_EQUAL(f->base_latency_s[R][S], base.nccl.base_latency_s[R][S]);
    CU_ASSERT(!close_rel_quiet(base.nccl.call_floor_s, k->call_floor_s));
    CU_ASSERT(close_rel(f->intra_latency_s[R][S], k->intra_latency_s[R][S]));
    CU_ASSERT(close_rel(f->inter_latency_s[R][S], k->inter_latency_s[R][S]));
    CU_ASSERT(close_rel(f->inter_latency_s[T][S], k->inter_latency_s[T][S]));
    CU_ASSERT(close_rel(f->net_overhead_s, k->net_overhead_s));
    CU_ASSERT(close_rel(f->intra_bus_bytes_per_s, k->intra_bus_bytes_per_s));
    CU_ASSERT(close_rel(f->nic_bytes_per_s, k->nic_bytes_per_s));
    CU_ASSERT(close_rel(fitted.gpu.kernel_latency_s, params.profile.gpu.kernel_latency_s));
    CU_ASSERT(close_rel(fitted.gpu.hbm_bytes_per_s, params.profile.gpu.hbm_bytes_per_s));
    /* the FLOP rates the profile prices kernels with: GEMMs per dtype, element-wise kinds */
    for (int dt = FSDP_DTYPE_F32; dt <= FSDP_DTYPE_F16; dt++)
        CU_ASSERT(close_rel(fitted.gpu.matmul_flops_per_s[dt],
                            params.profile.gpu.matmul_flops_per_s[dt]));
    CU_ASSERT(close_rel(fitted.gpu.vector_flops_per_s, params.profile.gpu.vector_flops_per_s));
    /* (the base's differ by far more than 1%: the fit is not the base kept) */
    CU_ASSERT(!close_rel_quiet(base.gpu.matmul_flops_per_s[FSDP_DTYPE_BF16],
                               params.profile.gpu.matmul_flops_per_s[FSDP_DTYPE_BF16]));
    CU_ASSERT(!close_rel_quiet(base.gpu.vector_flops_per_s,
                               params.profile.gpu.vector_flops_per_s));
    CU_ASSERT_EQUAL(fitted.nodes, 2);
    CU_ASSERT_EQUAL(fitted.gpus_per_node, PER_NODE);
    /* and the fitted model prices the calls as the run did */
    for (int n = 2; n <= 8; n *= 2)
        for (double b = 1e3; b < 1e9; b *= 37.0) {
            int nodes = n <= PER_NODE ? 1 : 2;
            CU_ASSERT(close_rel(
                fsdp_sim_coll_time(&fitted, FSDP_SIM_COLL_ALL_GATHER, n, nodes, b, NULL),
                fsdp_sim_coll_time(&params.profile, FSDP_SIM_COLL_ALL_GATHER, n, nodes, b,
                                   NULL)));
        }
    /* what fsdp-trace calibrate prints parses back to the same profile */
    json = fsdp_sim_profile_to_json(&fitted);
    CU_ASSERT_FATAL(json != NULL);
    CU_ASSERT(fsdp_sim_profile_parse(json, &back) == FSDP_OK);
    CU_ASSERT(close_rel(back.nccl.nic_bytes_per_s, k->nic_bytes_per_s));
    free(json);

    /* a missing trace */
    CU_ASSERT_EQUAL(fsdp_trace_calibrate("/nonexistent/x.db", &opts, &base, &fitted, NULL),
                    FSDP_ERR_NOT_FOUND);
    remove(path);
}

/* A run simulated with eager ops: the kinds it priced as op sequences (gelu among them) are left
 * out of the kernel fits, whose vector rate stays the base's rather than one fitted to sums of
 * ops; the GEMMs, one kernel each either way, are still recovered. */
static void test_eager_run(void)
{
    char path[64];
    fsdp_sim_params_t params;
    fsdp_sim_profile_t base, fitted;
    fsdp_calib_options_t opts = {0, 0};

    snprintf(path, sizeof(path), "/tmp/test_calibrate_eager.%d.db", (int)getpid());
    known_profile(&params.profile);
    params.profile.ops = FSDP_SIM_OPS_EAGER;
    CU_ASSERT_FATAL(fsdp_sim_kind_eager(FSDP_K_GELU_FWD));
    CU_ASSERT(!fsdp_sim_kind_eager(FSDP_K_GEMM));
    sweep(path, &params);
    ring_simple(&base);
    CU_ASSERT_FATAL(fsdp_trace_calibrate(path, &opts, &base, &fitted, NULL) == FSDP_OK);
    CU_ASSERT_EQUAL(fitted.gpu.vector_flops_per_s, base.gpu.vector_flops_per_s);
    for (int dt = FSDP_DTYPE_F32; dt <= FSDP_DTYPE_F16; dt++)
        CU_ASSERT(close_rel(fitted.gpu.matmul_flops_per_s[dt],
                            params.profile.gpu.matmul_flops_per_s[dt]));
    remove(path);
}

static void test_lsq(void)
{
    /* y = 2 + 3 x, with a duplicated column that must be reported unidentified */
    double x[5 * 3], y[5], th[3];
    int used[3];

    for (int i = 0; i < 5; i++) {
        x[3 * i] = 1.0;
        x[3 * i + 1] = i * 1e6;
        x[3 * i + 2] = 2.0; /* = 2 x column 0 */
        y[i] = 2.0 + 3e-6 * (i * 1e6);
    }
    CU_ASSERT_EQUAL(fsdp_calib_lsq(x, y, 5, 3, th, used), 2);
    CU_ASSERT(used[0] && used[1] && !used[2]);
    CU_ASSERT(fabs(th[0] - 2.0) < 1e-9 && fabs(th[1] - 3e-6) < 1e-15);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"least squares", test_lsq},
        {"calibrate recovers a known profile", test_recovers_profile},
        {"an eager run's op sequences are left out", test_eager_run},
        {NULL, NULL},
    };
    return fsdp_test_run("calibrate", tests);
}
