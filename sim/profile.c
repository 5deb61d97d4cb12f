/* Cluster profiles: the built-in presets, JSON in and out, and range checks.
 *
 * Every number of a preset, with its unit and source, is listed in traces/profiles/README.md;
 * traces/profiles/<name>.json is the same preset as JSON (test_simtime checks they agree).
 * Units are SI base units throughout: seconds, bytes, bytes/s, FLOP/s.
 */
#include "sim.h"

#include <fsdp/log.h>

#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

const char *fsdp_sim_algo_name(fsdp_sim_algo_t algo)
{
    static const char *const names[FSDP_SIM_ALGO_COUNT] = {"ring", "tree", "nvls", "nvls_tree",
                                                           "pat"};

    return (unsigned)algo < FSDP_SIM_ALGO_COUNT ? names[algo] : "invalid";
}

const char *fsdp_sim_proto_name(fsdp_sim_proto_t proto)
{
    static const char *const names[FSDP_SIM_PROTO_COUNT] = {"ll", "ll128", "simple"};

    return (unsigned)proto < FSDP_SIM_PROTO_COUNT ? names[proto] : "invalid";
}

/* ---- presets ------------------------------------------------------------------------------ */

/* Numbers are written as decimal literals in SI units (6.6e-6 s, not 6.6 * 1e-6), so that
 * the JSON files, which hold the same literals, parse to the very same doubles. */
#define GIB ((size_t)1 << 30)
#define MIB ((size_t)1 << 20)
#define ALGO_NAMES "ring, tree, nvls, nvls_tree, pat"

/* The per-call floor: nccl-tests' time of the smallest all-reduce on 8 GPUs of one node
 * (1 KiB; Azure ND H100 v5 and ND A100 v4, NCCL 2.18.5) less what NCCL's latency and the one
 * channel such a call runs on give (docs/costs.md, "The floor"). */
#define H100_CALL_FLOOR_S 10.3e-6
#define A100_CALL_FLOOR_S 29.5e-6

/* NCCL's latency tables, v2.30.7 src/graph/tuning.cc ncclTunerConstantsDefaults (the same for
 * every GPU generation), [algorithm][LL, LL128, Simple]. */
static void nccl_latencies(fsdp_sim_nccl_profile_t *nc)
{
    static const double base[FSDP_SIM_ALGO_COUNT][FSDP_SIM_PROTO_COUNT] = {
        {6.6e-6, 14.0e-6, 8.4e-6}, /* ring */
        {6.8e-6, 14.0e-6, 8.4e-6}, /* tree */
        {0.0, 0.0, 0.0},           /* nvls */
        {0.0, 0.0, 0.0},           /* nvls_tree */
        {8.0e-6, 8.0e-6, 8.0e-6},  /* pat */
    };
    static const double nvlink[FSDP_SIM_ALGO_COUNT][FSDP_SIM_PROTO_COUNT] = {
        {0.6e-6, 1.9e-6, 3.4e-6}, {0.6e-6, 1.25e-6, 4.0e-6}, {0.0, 0.0, 25.0e-6},
        {0.0, 0.0, 25.0e-6},      {0.0, 0.0, 4.0e-6},
    };
    static const double net[FSDP_SIM_ALGO_COUNT][FSDP_SIM_PROTO_COUNT] = {
        {2.7e-6, 4.0e-6, 14.0e-6}, {5.0e-6, 8.5e-6, 14.0e-6}, {0.0, 0.0, 18.0e-6},
        {0.0, 0.0, 20.9e-6},       {0.0, 0.0, 14.0e-6},
    };
    /* treeCorrectionFactor, powers of two of nBytes/64 from 64 B to 256 MiB */
    static const double corr[FSDP_SIM_PROTO_COUNT][FSDP_SIM_TREE_SIZES] = {
        {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7,  .7,  .7,  .6, .5,
         .4,  .4,  .5,  .6,  .7, .8, .9, 1.0, 1.0, 1.0, 1.0},
        {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7,  .6, .6,
         .6,  .6,  .6,  .6,  .8,  .9, .9, .9, .9, 1.0, 1.0},
        {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5,
         .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9},
    };

    for (int a = 0; a < FSDP_SIM_ALGO_COUNT; a++) {
        for (int pr = 0; pr < FSDP_SIM_PROTO_COUNT; pr++) {
            nc->base_latency_s[a][pr] = base[a][pr];
            nc->intra_latency_s[a][pr] = nvlink[a][pr];
            nc->inter_latency_s[a][pr] = net[a][pr];
        }
    }
    memcpy(nc->tree_correction, corr, sizeof(corr));
    nc->protocols =
        1u << FSDP_SIM_PROTO_LL | 1u << FSDP_SIM_PROTO_LL128 | 1u << FSDP_SIM_PROTO_SIMPLE;
    nc->ring_plateau_factor = 1.4; /* sm80 and later */
    nc->net_latency_s = 0.0;
    /* nt x threadThreshold of src/enqueue.cc topoGetAlgoInfo: LL 512 threads x 8 B (the ring's
     * x nranks), LL128 640 x 8 B, Simple 512 x 64 B (NCCL_*_THREAD_THRESHOLD, device.h) */
    nc->channel_bytes[FSDP_SIM_PROTO_LL] = 4096.0;
    nc->channel_bytes[FSDP_SIM_PROTO_LL128] = 5120.0;
    nc->channel_bytes[FSDP_SIM_PROTO_SIMPLE] = 32768.0;
    nc->pat_bandwidth_factor = 0.75;
    /* a channel is one thread block (src/enqueue.cc: the kernel's grid is its channels) */
    nc->sms_per_channel = 1;
}

static void set3(double *v, double a, double b, double c)
{
    v[0] = a;
    v[1] = b;
    v[2] = c;
}

/* DGX H100: 8x H100 SXM5 80GB on NVLink 4 / NVSwitch, Intel Xeon hosts, 8x 400 Gb/s NICs. */
static void preset_h100(fsdp_sim_profile_t *p)
{
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "h100");
    p->nodes = 1;
    p->gpus_per_node = 8;
    snprintf(p->gpu.model, sizeof(p->gpu.model), "NVIDIA H100 SXM5 80GB");
    p->gpu.memory_bytes = 80 * GIB;
    p->gpu.matmul_flops_per_s[FSDP_DTYPE_F32] = 66.9e12;
    p->gpu.matmul_flops_per_s[FSDP_DTYPE_BF16] = 989.4e12;
    p->gpu.matmul_flops_per_s[FSDP_DTYPE_F16] = 989.4e12;
    p->gpu.tf32_flops_per_s = 494.7e12;
    p->gpu.vector_flops_per_s = 66.9e12;
    p->gpu.hbm_bytes_per_s = 3350e9;
    p->gpu.compute_efficiency = 0.70;
    p->gpu.memory_efficiency = 0.87;
    p->gpu.kernel_latency_s = 1.2e-6;
    p->gpu.gemm_efficiency = 0.80;      /* H200 measurement: 0.79-0.83 after quantization */
    /* cuBLAS on an H200, bf16: 87-118 TFLOP/s with a leading dimension of 50257, 665-778 at
     * 50304 (docs/costs.md) */
    p->gpu.gemm_unaligned_efficiency = 0.14;
    p->gpu.attention_efficiency = 0.26; /* PyTorch SDPA (FlashAttention-2) on an H200 */
    /* PyTorch's non-vectorized element-wise kernels on an H200 (the H100's SMs and clocks):
     * 0.23-0.37 x 10^12 elements/s (tools/reference/eager_ops.py) */
    p->gpu.strided_elements_per_s = 0.30e12;
    p->gpu.sms = 132;                   /* H100 SXM5 */
    p->ops = FSDP_SIM_OPS_EAGER;
    p->host.launch_overhead_s = 5.0e-6;
    p->host.launch_latency_s = 5.0e-6;
    p->host.h2d_bytes_per_s = 51e9;
    p->host.d2h_bytes_per_s = 51e9;
    nccl_latencies(&p->nccl);
    p->nccl.algorithms = 1u << FSDP_SIM_ALGO_RING | 1u << FSDP_SIM_ALGO_TREE |
                         1u << FSDP_SIM_ALGO_NVLS | 1u << FSDP_SIM_ALGO_NVLS_TREE |
                         1u << FSDP_SIM_ALGO_PAT;
    p->nccl.channels = 32;
    p->nccl.intra_bus_bytes_per_s = 370e9;
    p->nccl.nic_bytes_per_s = 47e9;
    p->nccl.nics_per_node = 8;
    p->nccl.net_overhead_s = 1.0e-6; /* Intel hosts */
    set3(p->nccl.ll_max_bytes_per_s, 141e9, 39e9, 20.4e9);
    set3(p->nccl.ring_ll128_channel_bytes_per_s, 36.7e9, 36.7e9, 36.7e9);
    set3(p->nccl.tree_channel_bytes_per_s, 38.7e9, 41.4e9, 36e9);
    set3(p->nccl.tree_ll128_channel_bytes_per_s, 36.7e9, 36.7e9, 29.0e9);
    p->nccl.nvls_bus_bytes_per_s = 480e9;
    p->nccl.nvls_channels = 16;
    set3(p->nccl.nvls_tree_channel_bytes_per_s, 0.0, 57.7e9, 45.5e9);
    p->nccl.call_floor_s = H100_CALL_FLOOR_S;
}

/* DGX A100: 8x A100 SXM4 80GB on NVLink 3 / NVSwitch, AMD EPYC hosts, 8x 200 Gb/s NICs. */
static void preset_a100(fsdp_sim_profile_t *p)
{
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "a100");
    p->nodes = 1;
    p->gpus_per_node = 8;
    snprintf(p->gpu.model, sizeof(p->gpu.model), "NVIDIA A100 SXM4 80GB");
    p->gpu.memory_bytes = 80 * GIB;
    p->gpu.matmul_flops_per_s[FSDP_DTYPE_F32] = 19.5e12;
    p->gpu.matmul_flops_per_s[FSDP_DTYPE_BF16] = 312e12;
    p->gpu.matmul_flops_per_s[FSDP_DTYPE_F16] = 312e12;
    p->gpu.tf32_flops_per_s = 156e12;
    p->gpu.vector_flops_per_s = 19.5e12;
    p->gpu.hbm_bytes_per_s = 2039e9;
    p->gpu.compute_efficiency = 0.82;
    p->gpu.memory_efficiency = 0.79;
    p->gpu.kernel_latency_s = 1.2e-6;
    p->gpu.gemm_efficiency = 0.82;      /* cuBLASLt 8k-16k: 253.7-256.5 of 312, q 0.998 */
    p->gpu.gemm_unaligned_efficiency = 0.14; /* the H200's, not measured on an A100 */
    p->gpu.attention_efficiency = 0.50; /* FlashAttention-2 on A100: the low end of 50-73% */
    /* the H100's rate scaled by SMs x boost clock (108 x 1.41 GHz of 132 x 1.98 GHz): the
     * kernels are bound by their per-element instructions (docs/costs.md) */
    p->gpu.strided_elements_per_s = 0.175e12;
    p->gpu.sms = 108;
    p->ops = FSDP_SIM_OPS_EAGER;
    p->host.launch_overhead_s = 5.0e-6;
    p->host.launch_latency_s = 5.0e-6;
    p->host.h2d_bytes_per_s = 26.28e9;
    p->host.d2h_bytes_per_s = 26.28e9;
    nccl_latencies(&p->nccl);
    p->nccl.algorithms =
        1u << FSDP_SIM_ALGO_RING | 1u << FSDP_SIM_ALGO_TREE | 1u << FSDP_SIM_ALGO_PAT;
    p->nccl.channels = 24;
    p->nccl.intra_bus_bytes_per_s = 231.58e9;
    p->nccl.nic_bytes_per_s = 24e9;
    p->nccl.nics_per_node = 8;
    p->nccl.net_overhead_s = 2.0e-6; /* AMD hosts */
    set3(p->nccl.ll_max_bytes_per_s, 87.7e9, 22.5e9, 19.0e9);
    set3(p->nccl.ring_ll128_channel_bytes_per_s, 20e9, 20e9, 20e9);
    set3(p->nccl.tree_channel_bytes_per_s, 24e9, 23.6e9, 17.8e9);
    set3(p->nccl.tree_ll128_channel_bytes_per_s, 20e9, 20e9, 20e9);
    p->nccl.nvls_bus_bytes_per_s = 0.0;
    p->nccl.call_floor_s = A100_CALL_FLOOR_S;
}

/* An HGX H200 node: H100 SXM's compute (same SMs and clocks) with 141 GB of HBM3e at 4.8 TB/s
 * (NVIDIA H200 datasheet), on NVLink 4 as the H100's. */
static void preset_h200(fsdp_sim_profile_t *p)
{
    preset_h100(p);
    snprintf(p->name, sizeof(p->name), "h200");
    snprintf(p->gpu.model, sizeof(p->gpu.model), "NVIDIA H200");
    p->gpu.memory_bytes = 143771 * MIB; /* nvidia-smi's 143771 MiB */
    p->gpu.hbm_bytes_per_s = 4.8e12;
}

typedef struct preset {
    const char *name;
    void (*fill)(fsdp_sim_profile_t *p);
} preset_t;

static const preset_t presets[] = {
    {"h100", preset_h100},
    {"a100", preset_a100},
    {"h200", preset_h200},
};
#define N_PRESETS (sizeof(presets) / sizeof(presets[0]))

const char *fsdp_sim_profile_presets(void)
{
    return "h100, a100, h200";
}

static const preset_t *preset_find(const char *name, size_t len)
{
    for (size_t i = 0; i < N_PRESETS; i++) {
        if (strlen(presets[i].name) == len && strncmp(presets[i].name, name, len) == 0)
            return &presets[i];
    }
    return NULL;
}

/* Applies "nodes=N,gpus_per_node=G" (opts may be empty) to p. */
static fsdp_status_t apply_shape(const char *what, const char *opts, fsdp_sim_profile_t *p)
{
    const char *s = opts;
    int *seen[2] = {NULL, NULL};

    if (*s == '\0' || s[strlen(s) - 1] == ',') {
        fsdp_error("profile '%s': %s option after '%s'; allowed: nodes=N, gpus_per_node=G", what,
                   *s == '\0' ? "no" : "an empty", *s == '\0' ? ":" : ",");
        return FSDP_ERR_INVALID_PARAM;
    }
    while (*s != '\0') {
        const char *end = strchr(s, ',');
        size_t len = end ? (size_t)(end - s) : strlen(s);
        const char *eq = memchr(s, '=', len);
        char *num_end;
        long v;
        int *field = NULL;

        if (eq != NULL && (size_t)(eq - s) == 5 && strncmp(s, "nodes", 5) == 0)
            field = &p->nodes;
        else if (eq != NULL && (size_t)(eq - s) == 13 && strncmp(s, "gpus_per_node", 13) == 0)
            field = &p->gpus_per_node;
        if (field == NULL) {
            fsdp_error("profile '%s': unknown option '%.*s'; allowed: nodes=N, gpus_per_node=G",
                       what, (int)len, s);
            return FSDP_ERR_INVALID_PARAM;
        }
        if (seen[0] == field || seen[1] == field) {
            fsdp_error("profile '%s': '%.*s' is given twice", what, (int)(eq - s), s);
            return FSDP_ERR_INVALID_PARAM;
        }
        seen[seen[0] != NULL] = field;
        v = strtol(eq + 1, &num_end, 10);
        if (num_end == eq + 1 || num_end != s + len || v < 1 || v > 1000000) {
            fsdp_error("profile '%s': '%.*s' needs an integer from 1 to 1000000", what, (int)len,
                       s);
            return FSDP_ERR_INVALID_PARAM;
        }
        *field = (int)v;
        s += len;
        if (*s == ',')
            s++;
    }
    return FSDP_OK;
}

fsdp_status_t fsdp_sim_profile_preset(const char *spec, fsdp_sim_profile_t *profile_p)
{
    fsdp_sim_profile_t p;
    const preset_t *pr;
    const char *colon;
    size_t len;
    fsdp_status_t status;

    if (spec == NULL || profile_p == NULL) {
        fsdp_error("fsdp_sim_profile_preset: spec and profile_p must not be NULL");
        return FSDP_ERR_INVALID_PARAM;
    }
    colon = strchr(spec, ':');
    len = colon ? (size_t)(colon - spec) : strlen(spec);
    pr = preset_find(spec, len);
    if (pr == NULL) {
        fsdp_error("unknown cluster profile '%.*s'; the presets are %s (optionally "
                   "':nodes=N,gpus_per_node=G'), or give a JSON file",
                   (int)len, spec, fsdp_sim_profile_presets());
        return FSDP_ERR_INVALID_PARAM;
    }
    pr->fill(&p);
    status = colon != NULL ? apply_shape(spec, colon + 1, &p) : FSDP_OK;
    if (status != FSDP_OK)
        return status;
    *profile_p = p;
    return FSDP_OK;
}

/* ---- checks ------------------------------------------------------------------------------ */

static int bad_double(double v, double lo, double hi)
{
    return !isfinite(v) || v < lo || v > hi;
}

#define CHECK_RANGE(expr, lo, hi, field_, what_)                                                   \
    do {                                                                                           \
        if (bad_double((expr), (lo), (hi))) {                                                      \
            fsdp_error("cluster profile '%s': %s is %g; it must be %s", p->name, (field_),         \
                       (double)(expr), (what_));                                                   \
            return FSDP_ERR_INVALID_PARAM;                                                         \
        }                                                                                          \
    } while (0)

#define BIG 1e30

fsdp_status_t fsdp_sim_profile_check(const fsdp_sim_profile_t *p)
{
    const fsdp_sim_nccl_profile_t *nc;

    if (p == NULL) {
        fsdp_error("cluster profile is NULL");
        return FSDP_ERR_INVALID_PARAM;
    }
    nc = &p->nccl;
    if (p->nodes < 1 || p->gpus_per_node < 1) {
        fsdp_error("cluster profile '%s': nodes %d and gpus_per_node %d must be at least 1",
                   p->name, p->nodes, p->gpus_per_node);
        return FSDP_ERR_INVALID_PARAM;
    }
    for (int d = 0; d < FSDP_DTYPE_COUNT; d++)
        CHECK_RANGE(p->gpu.matmul_flops_per_s[d], 0, BIG, "gpu.matmul_flops_per_s",
                    "a FLOP/s rate >= 0 (0: free)");
    CHECK_RANGE(p->gpu.tf32_flops_per_s, 0, BIG, "gpu.matmul_flops_per_s.tf32", ">= 0");
    CHECK_RANGE(p->gpu.vector_flops_per_s, 0, BIG, "gpu.vector_flops_per_s", ">= 0");
    CHECK_RANGE(p->gpu.hbm_bytes_per_s, 0, BIG, "gpu.hbm_bytes_per_s", ">= 0");
    CHECK_RANGE(p->gpu.compute_efficiency, 1e-6, 1, "gpu.compute_efficiency", "in (0, 1]");
    CHECK_RANGE(p->gpu.memory_efficiency, 1e-6, 1, "gpu.memory_efficiency", "in (0, 1]");
    CHECK_RANGE(p->gpu.kernel_latency_s, 0, 1, "gpu.kernel_latency_s", "seconds in [0, 1]");
    CHECK_RANGE(p->gpu.gemm_efficiency, 1e-6, 1, "gpu.gemm_efficiency", "in (0, 1]");
    CHECK_RANGE(p->gpu.attention_efficiency, 1e-6, 1, "gpu.attention_efficiency", "in (0, 1]");
    CHECK_RANGE(p->gpu.gemm_unaligned_efficiency, 1e-6, 1, "gpu.gemm_unaligned_efficiency",
                "in (0, 1]");
    CHECK_RANGE(p->gpu.strided_elements_per_s, 0, BIG, "gpu.strided_elements_per_s",
                ">= 0 (0: bytes alone)");
    CHECK_RANGE(p->gpu.sms, 0, 100000, "gpu.sms", "an integer in [0, 100000] (0: no quantization)");
    if (p->ops != FSDP_SIM_OPS_FUSED && p->ops != FSDP_SIM_OPS_EAGER) {
        fsdp_error("cluster profile '%s': ops must be eager or fused", p->name);
        return FSDP_ERR_INVALID_PARAM;
    }
    CHECK_RANGE(p->host.launch_overhead_s, 0, 1, "host.launch_overhead_s", "seconds in [0, 1]");
    CHECK_RANGE(p->host.event_overhead_s, 0, 1, "host.event_overhead_s", "seconds in [0, 1]");
    CHECK_RANGE(p->host.launch_latency_s, 0, 1, "host.launch_latency_s", "seconds in [0, 1]");
    CHECK_RANGE(p->host.h2d_bytes_per_s, 0, BIG, "host.h2d_bytes_per_s", ">= 0");
    CHECK_RANGE(p->host.d2h_bytes_per_s, 0, BIG, "host.d2h_bytes_per_s", ">= 0");
    if (!(nc->algorithms & (1u << FSDP_SIM_ALGO_RING)) ||
        nc->algorithms >= (1u << FSDP_SIM_ALGO_COUNT)) {
        fsdp_error("cluster profile '%s': nccl.algorithms must include ring (all-gather and "
                   "reduce-scatter need it); allowed: " ALGO_NAMES,
                   p->name);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (nc->protocols == 0 || nc->protocols >= (1u << FSDP_SIM_PROTO_COUNT)) {
        fsdp_error("cluster profile '%s': nccl.protocols must name at least one of ll, ll128, "
                   "simple",
                   p->name);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (nc->channels < 1 || nc->channels > 1024 || nc->nics_per_node < 1 ||
        nc->nics_per_node > 1024) {
        fsdp_error("cluster profile '%s': nccl.channels %d and nccl.nics_per_node %d must be in "
                   "[1, 1024]",
                   p->name, nc->channels, nc->nics_per_node);
        return FSDP_ERR_INVALID_PARAM;
    }
    for (int a = 0; a < FSDP_SIM_ALGO_COUNT; a++) {
        for (int pr = 0; pr < FSDP_SIM_PROTO_COUNT; pr++) {
            CHECK_RANGE(nc->base_latency_s[a][pr], 0, 1, "nccl.base_latency_s", "in [0, 1] s");
            CHECK_RANGE(nc->intra_latency_s[a][pr], 0, 1, "nccl.intra_latency_s", "in [0, 1] s");
            CHECK_RANGE(nc->inter_latency_s[a][pr], 0, 1, "nccl.inter_latency_s", "in [0, 1] s");
            if (a == 0)
                for (int i = 0; i < FSDP_SIM_TREE_SIZES; i++)
                    CHECK_RANGE(nc->tree_correction[pr][i], 1e-6, 1, "nccl.tree_correction",
                                "a factor in (0, 1]");
        }
    }
    CHECK_RANGE(nc->intra_bus_bytes_per_s, 1e-30, BIG, "nccl.intra_bus_bytes_per_s",
                "a bandwidth > 0");
    CHECK_RANGE(nc->nic_bytes_per_s, 0, BIG, "nccl.nic_bytes_per_s", ">= 0 (0: no limit)");
    CHECK_RANGE(nc->net_overhead_s, 0, 1, "nccl.net_overhead_s", "in [0, 1] s");
    CHECK_RANGE(nc->net_latency_s, 0, 1, "nccl.net_latency_s", "in [0, 1] s");
    for (int i = 0; i < FSDP_SIM_NODE_CLASSES; i++) {
        CHECK_RANGE(nc->ll_max_bytes_per_s[i], 0, BIG, "nccl.ll_max_bytes_per_s",
                    ">= 0 (0: no cap)");
        CHECK_RANGE(nc->ring_ll128_channel_bytes_per_s[i], 0, BIG,
                    "nccl.ring_ll128_channel_bytes_per_s", ">= 0 (0: no cap)");
        CHECK_RANGE(nc->tree_channel_bytes_per_s[i], 0, BIG, "nccl.tree_channel_bytes_per_s",
                    ">= 0 (0: no cap)");
        CHECK_RANGE(nc->tree_ll128_channel_bytes_per_s[i], 0, BIG,
                    "nccl.tree_ll128_channel_bytes_per_s", ">= 0 (0: no cap)");
    }
    CHECK_RANGE(nc->ring_plateau_factor, 1e-6, 100, "nccl.ring_plateau_factor", "in (0, 100]");
    CHECK_RANGE(nc->nvls_bus_bytes_per_s, 0, BIG, "nccl.nvls_bus_bytes_per_s", ">= 0 (0: no NVLS)");
    CHECK_RANGE(nc->call_floor_s, 0, 1, "nccl.call_floor_s", "in [0, 1] s");
    CHECK_RANGE(nc->net_floor_s, 0, 1, "nccl.net_floor_s", "in [0, 1] s");
    for (int pr = 0; pr < FSDP_SIM_PROTO_COUNT; pr++)
        CHECK_RANGE(nc->channel_bytes[pr], 0, BIG, "nccl.channel_bytes",
                    ">= 0 bytes (0: every call on all channels)");
    for (int i = 0; i < FSDP_SIM_NODE_CLASSES; i++)
        CHECK_RANGE(nc->nvls_tree_channel_bytes_per_s[i], 0, BIG,
                    "nccl.nvls_tree_channel_bytes_per_s", ">= 0 (0: no cap)");
    CHECK_RANGE(nc->pat_bandwidth_factor, 0, 1, "nccl.pat_bandwidth_factor",
                "in [0, 1] (0: no PAT)");
    if (nc->sms_per_channel < 0 || nc->sms_per_channel > 8) {
        fsdp_error("cluster profile '%s': nccl.sms_per_channel %d must be in [0, 8] (0: "
                   "collectives take no SMs from compute)",
                   p->name, nc->sms_per_channel);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (nc->nvls_channels < 0 || nc->nvls_channels > 1024) {
        fsdp_error(
            "cluster profile '%s': nccl.nvls_channels %d must be in [0, 1024] (0: the ring's)",
            p->name, nc->nvls_channels);
        return FSDP_ERR_INVALID_PARAM;
    }
    return FSDP_OK;
}

/* ---- JSON -------------------------------------------------------------------------------- */

typedef enum {
    F_INT,     /* int */
    F_SIZE,    /* size_t, a non-negative integer */
    F_DOUBLE,  /* double */
    F_BOOL,    /* int 0/1 */
    F_STRING,  /* char[64] */
    F_CLASSES, /* double[3]: one node, two nodes, three or more */
    F_PROTO3,  /* double[PROTO]: [ll, ll128, simple] */
    F_TABLE,   /* double[ALGO][PROTO]: {"ring": [ll, ll128, simple], ...} */
    F_FLOPS,   /* the gpu's matmul rates: {"f32":, "tf32":, "bf16":, "f16":} */
    F_ALGOS,   /* unsigned bitmask: ["ring", "tree"] */
    F_PROTOS,  /* unsigned bitmask: ["ll", "simple"] */
    F_TREECORR, /* double[PROTO][23]: {"ll": [...], "ll128": [...], "simple": [...]} */
    F_OPS       /* fsdp_sim_ops_t: "eager" or "fused" */
} field_type_t;

typedef struct field {
    const char *section; /* "" for the top level */
    const char *key;
    field_type_t type;
    size_t offset;
    int required; /* without a base preset */
} field_t;

#define FLD(sec, key, type, member, req)                                                           \
    {                                                                                              \
        sec, key, type, offsetof(fsdp_sim_profile_t, member), req                                  \
    }

static const field_t fields[] = {
    FLD("", "name", F_STRING, name, 0),
    FLD("", "nodes", F_INT, nodes, 1),
    FLD("", "gpus_per_node", F_INT, gpus_per_node, 1),
    FLD("", "ops", F_OPS, ops, 0),
    FLD("gpu", "model", F_STRING, gpu.model, 0),
    FLD("gpu", "memory_bytes", F_SIZE, gpu.memory_bytes, 1),
    FLD("gpu", "matmul_flops_per_s", F_FLOPS, gpu, 1),
    FLD("gpu", "allow_tf32", F_BOOL, gpu.allow_tf32, 0),
    FLD("gpu", "vector_flops_per_s", F_DOUBLE, gpu.vector_flops_per_s, 1),
    FLD("gpu", "hbm_bytes_per_s", F_DOUBLE, gpu.hbm_bytes_per_s, 1),
    FLD("gpu", "compute_efficiency", F_DOUBLE, gpu.compute_efficiency, 0),
    FLD("gpu", "memory_efficiency", F_DOUBLE, gpu.memory_efficiency, 0),
    FLD("gpu", "kernel_latency_s", F_DOUBLE, gpu.kernel_latency_s, 0),
    FLD("gpu", "gemm_efficiency", F_DOUBLE, gpu.gemm_efficiency, 0),
    FLD("gpu", "gemm_unaligned_efficiency", F_DOUBLE, gpu.gemm_unaligned_efficiency, 0),
    FLD("gpu", "attention_efficiency", F_DOUBLE, gpu.attention_efficiency, 0),
    FLD("gpu", "strided_elements_per_s", F_DOUBLE, gpu.strided_elements_per_s, 0),
    FLD("gpu", "sms", F_INT, gpu.sms, 0),
    FLD("host", "launch_overhead_s", F_DOUBLE, host.launch_overhead_s, 0),
    FLD("host", "event_overhead_s", F_DOUBLE, host.event_overhead_s, 0),
    FLD("host", "launch_latency_s", F_DOUBLE, host.launch_latency_s, 0),
    FLD("host", "h2d_bytes_per_s", F_DOUBLE, host.h2d_bytes_per_s, 1),
    FLD("host", "d2h_bytes_per_s", F_DOUBLE, host.d2h_bytes_per_s, 1),
    FLD("nccl", "algorithms", F_ALGOS, nccl.algorithms, 0),
    FLD("nccl", "protocols", F_PROTOS, nccl.protocols, 0),
    FLD("nccl", "channels", F_INT, nccl.channels, 0),
    FLD("nccl", "base_latency_s", F_TABLE, nccl.base_latency_s, 0),
    FLD("nccl", "intra_latency_s", F_TABLE, nccl.intra_latency_s, 0),
    FLD("nccl", "inter_latency_s", F_TABLE, nccl.inter_latency_s, 0),
    FLD("nccl", "intra_bus_bytes_per_s", F_DOUBLE, nccl.intra_bus_bytes_per_s, 1),
    FLD("nccl", "nic_bytes_per_s", F_DOUBLE, nccl.nic_bytes_per_s, 0),
    FLD("nccl", "nics_per_node", F_INT, nccl.nics_per_node, 0),
    FLD("nccl", "net_overhead_s", F_DOUBLE, nccl.net_overhead_s, 0),
    FLD("nccl", "net_latency_s", F_DOUBLE, nccl.net_latency_s, 0),
    FLD("nccl", "ll_max_bytes_per_s", F_CLASSES, nccl.ll_max_bytes_per_s, 0),
    FLD("nccl", "ring_ll128_channel_bytes_per_s", F_CLASSES, nccl.ring_ll128_channel_bytes_per_s,
        0),
    FLD("nccl", "tree_channel_bytes_per_s", F_CLASSES, nccl.tree_channel_bytes_per_s, 0),
    FLD("nccl", "tree_ll128_channel_bytes_per_s", F_CLASSES, nccl.tree_ll128_channel_bytes_per_s,
        0),
    FLD("nccl", "tree_correction", F_TREECORR, nccl.tree_correction, 0),
    FLD("nccl", "ring_plateau_factor", F_DOUBLE, nccl.ring_plateau_factor, 0),
    FLD("nccl", "nvls_bus_bytes_per_s", F_DOUBLE, nccl.nvls_bus_bytes_per_s, 0),
    FLD("nccl", "call_floor_s", F_DOUBLE, nccl.call_floor_s, 0),
    FLD("nccl", "net_floor_s", F_DOUBLE, nccl.net_floor_s, 0),
    FLD("nccl", "channel_bytes", F_PROTO3, nccl.channel_bytes, 0),
    FLD("nccl", "nvls_channels", F_INT, nccl.nvls_channels, 0),
    FLD("nccl", "nvls_tree_channel_bytes_per_s", F_CLASSES, nccl.nvls_tree_channel_bytes_per_s, 0),
    FLD("nccl", "pat_bandwidth_factor", F_DOUBLE, nccl.pat_bandwidth_factor, 0),
    FLD("nccl", "sms_per_channel", F_INT, nccl.sms_per_channel, 0),
};
#define N_FIELDS (sizeof(fields) / sizeof(fields[0]))

static const char *const sections[] = {"gpu", "host", "nccl"};

/* What a profile without a base starts from: neutral values (no latency, no correction, no cap,
 * efficiency 1, NCCL's ring with the Simple protocol only). */
static void profile_neutral(fsdp_sim_profile_t *p)
{
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "custom");
    p->gpu.compute_efficiency = 1.0;
    p->gpu.memory_efficiency = 1.0;
    p->gpu.gemm_efficiency = 1.0;
    p->gpu.gemm_unaligned_efficiency = 1.0;
    p->gpu.attention_efficiency = 1.0;
    p->ops = FSDP_SIM_OPS_FUSED;
    p->nccl.algorithms = 1u << FSDP_SIM_ALGO_RING;
    p->nccl.protocols = 1u << FSDP_SIM_PROTO_SIMPLE;
    p->nccl.channels = 1;
    p->nccl.nics_per_node = 1;
    p->nccl.ring_plateau_factor = 1.0;
    for (int pr = 0; pr < FSDP_SIM_PROTO_COUNT; pr++)
        for (int i = 0; i < FSDP_SIM_TREE_SIZES; i++)
            p->nccl.tree_correction[pr][i] = 1.0;
}

typedef struct parse_ctx {
    const char *source; /* file name or "(text)" */
    int quiet;          /* no logging (to_json's round trip) */
    char path[96];      /* the member being read, "gpu.hbm_bytes_per_s" */
} parse_ctx_t;

static fsdp_status_t bad(parse_ctx_t *c, const char *what)
{
    if (!c->quiet)
        fsdp_error("cluster profile %s: %s %s", c->source, c->path, what);
    return FSDP_ERR_INVALID_PARAM;
}

static fsdp_status_t get_number(parse_ctx_t *c, json_t *v, double lo, double *out)
{
    double d;

    if (!json_is_number(v))
        return bad(c, "must be a number");
    d = json_number_value(v);
    if (!isfinite(d) || d < lo || d > BIG) {
        char msg[96];
        snprintf(msg, sizeof(msg), "is %g; it must be a number >= %g", d, lo);
        return bad(c, msg);
    }
    *out = d;
    return FSDP_OK;
}

static fsdp_status_t get_numbers(parse_ctx_t *c, json_t *v, size_t n, double *out)
{
    char msg[64];

    if (!json_is_array(v) || json_array_size(v) != n) {
        snprintf(msg, sizeof(msg), "must be an array of %zu numbers", n);
        return bad(c, msg);
    }
    for (size_t i = 0; i < n; i++) {
        fsdp_status_t st = get_number(c, json_array_get(v, i), 0.0, &out[i]);
        if (st != FSDP_OK)
            return st;
    }
    return FSDP_OK;
}

/* A bitmask from an array of names. */
static fsdp_status_t get_names(parse_ctx_t *c, json_t *v, const char *(*name)(int), int n,
                               const char *allowed, unsigned *out)
{
    unsigned mask = 0;
    char msg[160];

    snprintf(msg, sizeof(msg), "must be an array of names among %s", allowed);
    if (!json_is_array(v))
        return bad(c, msg);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const char *s = json_string_value(json_array_get(v, i));
        int k;
        if (s == NULL)
            return bad(c, msg);
        for (k = 0; k < n && strcmp(s, name(k)) != 0; k++)
            ;
        if (k == n) {
            snprintf(msg, sizeof(msg), "names '%s'; allowed: %s", s, allowed);
            return bad(c, msg);
        }
        mask |= 1u << k;
    }
    *out = mask;
    return FSDP_OK;
}

static const char *algo_name_i(int i)
{
    return fsdp_sim_algo_name((fsdp_sim_algo_t)i);
}

static const char *proto_name_i(int i)
{
    return fsdp_sim_proto_name((fsdp_sim_proto_t)i);
}

/* An object keyed by the names name(0..n-1), each value an array of m numbers, into rows of
 * `stride` doubles. Missing keys leave their rows alone. */
static fsdp_status_t get_keyed_rows(parse_ctx_t *c, json_t *v, const char *(*name)(int), int n,
                                    size_t m, double *rows, size_t stride)
{
    const char *key;
    json_t *val;
    size_t base_len = strlen(c->path);

    if (!json_is_object(v))
        return bad(c, "must be an object");
    json_object_foreach (v, key, val) {
        fsdp_status_t st;
        int k;
        for (k = 0; k < n && strcmp(key, name(k)) != 0; k++)
            ;
        snprintf(c->path + base_len, sizeof(c->path) - base_len, ".%s", key);
        if (k == n) {
            char msg[128];
            snprintf(msg, sizeof(msg), "is not a known member; allowed: %s, %s%s%s", name(0),
                     name(1), n > 2 ? ", " : "", n > 2 ? name(2) : "");
            return bad(c, msg);
        }
        st = get_numbers(c, val, m, rows + (size_t)k * stride);
        if (st != FSDP_OK)
            return st;
        c->path[base_len] = '\0';
    }
    return FSDP_OK;
}

static fsdp_status_t get_flops(parse_ctx_t *c, json_t *v, fsdp_sim_gpu_profile_t *gpu, int *has_f32)
{
    const char *key;
    json_t *val;
    size_t base_len = strlen(c->path);

    if (!json_is_object(v))
        return bad(c, "must be an object {\"f32\": ..., \"tf32\": ..., \"bf16\": ..., "
                      "\"f16\": ...}");
    json_object_foreach (v, key, val) {
        double *dst = NULL;
        fsdp_status_t st;
        fsdp_dtype_t dt;
        snprintf(c->path + base_len, sizeof(c->path) - base_len, ".%s", key);
        if (strcmp(key, "tf32") == 0)
            dst = &gpu->tf32_flops_per_s;
        else if (fsdp_dtype_parse(key, &dt) && fsdp_dtype_is_float(dt))
            dst = &gpu->matmul_flops_per_s[dt];
        if (dst == NULL)
            return bad(c, "is not a known member; allowed: f32, tf32, bf16, f16");
        st = get_number(c, val, 0.0, dst);
        if (st != FSDP_OK)
            return st;
        if (dst == &gpu->matmul_flops_per_s[FSDP_DTYPE_F32])
            *has_f32 = 1;
        c->path[base_len] = '\0';
    }
    return FSDP_OK;
}

static fsdp_status_t get_field(parse_ctx_t *c, const field_t *f, json_t *v, fsdp_sim_profile_t *p,
                               int *has_f32)
{
    char *addr = (char *)p + f->offset;
    double d;
    fsdp_status_t st;

    switch (f->type) {
    case F_INT:
    case F_SIZE:
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            (f->type == F_INT && json_integer_value(v) > 1000000))
            return bad(c, f->type == F_INT ? "must be an integer from 0 to 1000000"
                                           : "must be a non-negative integer");
        if (f->type == F_INT)
            *(int *)addr = (int)json_integer_value(v);
        else
            *(size_t *)addr = (size_t)json_integer_value(v);
        return FSDP_OK;
    case F_DOUBLE:
        st = get_number(c, v, 0.0, &d);
        if (st == FSDP_OK)
            *(double *)addr = d;
        return st;
    case F_BOOL:
        if (!json_is_boolean(v))
            return bad(c, "must be true or false");
        *(int *)addr = json_is_true(v);
        return FSDP_OK;
    case F_STRING:
        if (!json_is_string(v) || json_string_length(v) >= 64)
            return bad(c, "must be a string of fewer than 64 bytes");
        memset(addr, 0, 64);
        snprintf(addr, 64, "%s", json_string_value(v));
        return FSDP_OK;
    case F_CLASSES:
        return get_numbers(c, v, FSDP_SIM_NODE_CLASSES, (double *)addr);
    case F_PROTO3:
        return get_numbers(c, v, FSDP_SIM_PROTO_COUNT, (double *)addr);
    case F_TABLE:
        return get_keyed_rows(c, v, algo_name_i, FSDP_SIM_ALGO_COUNT, FSDP_SIM_PROTO_COUNT,
                              (double *)addr, FSDP_SIM_PROTO_COUNT);
    case F_TREECORR:
        return get_keyed_rows(c, v, proto_name_i, FSDP_SIM_PROTO_COUNT, FSDP_SIM_TREE_SIZES,
                              (double *)addr, FSDP_SIM_TREE_SIZES);
    case F_FLOPS:
        return get_flops(c, v, &p->gpu, has_f32);
    case F_ALGOS:
        return get_names(c, v, algo_name_i, FSDP_SIM_ALGO_COUNT, ALGO_NAMES, (unsigned *)addr);
    case F_PROTOS:
        return get_names(c, v, proto_name_i, FSDP_SIM_PROTO_COUNT, "ll, ll128, simple",
                         (unsigned *)addr);
    case F_OPS:
        if (json_is_string(v) && strcmp(json_string_value(v), "eager") == 0)
            *(fsdp_sim_ops_t *)addr = FSDP_SIM_OPS_EAGER;
        else if (json_is_string(v) && strcmp(json_string_value(v), "fused") == 0)
            *(fsdp_sim_ops_t *)addr = FSDP_SIM_OPS_FUSED;
        else
            return bad(c, "must be \"eager\" or \"fused\"");
        return FSDP_OK;
    }
    return FSDP_ERR_INTERNAL;
}

static const field_t *field_find(const char *section, const char *key)
{
    for (size_t i = 0; i < N_FIELDS; i++) {
        if (strcmp(fields[i].section, section) == 0 && strcmp(fields[i].key, key) == 0)
            return &fields[i];
    }
    return NULL;
}

static void list_keys(const char *section, char *buf, size_t n)
{
    size_t off = 0;

    buf[0] = '\0';
    for (size_t i = 0; i < N_FIELDS && off < n; i++) {
        if (strcmp(fields[i].section, section) == 0)
            off += (size_t)snprintf(buf + off, n - off, "%s%s", off ? ", " : "", fields[i].key);
    }
}

/* Reads the members of one object (the top level, or a section). */
static fsdp_status_t parse_object(parse_ctx_t *c, const char *section, json_t *obj,
                                  fsdp_sim_profile_t *p, unsigned char *seen, int *has_f32)
{
    const char *key;
    json_t *val;

    json_object_foreach (obj, key, val) {
        const field_t *f;
        fsdp_status_t st;
        int is_section = 0;

        snprintf(c->path, sizeof(c->path), "%s%s%s", section, *section ? "." : "", key);
        /* documentation members: "description" and anything starting with '_' */
        if (key[0] == '_' || strcmp(key, "description") == 0 ||
            (*section == '\0' && strcmp(key, "base") == 0))
            continue;
        for (size_t i = 0; *section == '\0' && i < sizeof(sections) / sizeof(sections[0]); i++)
            is_section |= strcmp(key, sections[i]) == 0;
        if (is_section) {
            if (!json_is_object(val))
                return bad(c, "must be an object");
            st = parse_object(c, key, val, p, seen, has_f32);
            if (st != FSDP_OK)
                return st;
            continue;
        }
        f = field_find(section, key);
        if (f == NULL) {
            char allowed[600];
            char msg[700];
            list_keys(section, allowed, sizeof(allowed));
            snprintf(msg, sizeof(msg), "is not a known member; allowed here: %s%s", allowed,
                     *section ? "" : ", base, description, gpu, host, nccl");
            return bad(c, msg);
        }
        st = get_field(c, f, val, p, has_f32);
        if (st != FSDP_OK)
            return st;
        seen[f - fields] = 1;
    }
    return FSDP_OK;
}

/* quiet: nothing is logged and the ranges are not checked (to_json's round trip). */
static fsdp_status_t profile_from_json(json_t *root, const char *source, int quiet,
                                       fsdp_sim_profile_t *profile_p)
{
    parse_ctx_t c = {.source = source, .quiet = quiet};
    unsigned char seen[N_FIELDS] = {0};
    fsdp_sim_profile_t p;
    json_t *base;
    int has_f32 = 0;
    fsdp_status_t st;

    if (!json_is_object(root)) {
        if (!quiet)
            fsdp_error("cluster profile %s: the top level must be a JSON object", source);
        return FSDP_ERR_FORMAT;
    }
    base = quiet ? NULL : json_object_get(root, "base");
    if (base != NULL) {
        if (!json_is_string(base)) {
            fsdp_error("cluster profile %s: base must be the name of a preset (%s)", source,
                       fsdp_sim_profile_presets());
            return FSDP_ERR_INVALID_PARAM;
        }
        st = fsdp_sim_profile_preset(json_string_value(base), &p);
        if (st != FSDP_OK)
            return st;
    } else {
        profile_neutral(&p);
    }
    st = parse_object(&c, "", root, &p, seen, &has_f32);
    if (st != FSDP_OK)
        return st;
    if (base == NULL) {
        for (size_t i = 0; i < N_FIELDS; i++) {
            if (!fields[i].required || seen[i])
                continue;
            if (fields[i].type == F_FLOPS && has_f32)
                continue;
            if (quiet)
                return FSDP_ERR_INVALID_PARAM;
            fsdp_error("cluster profile %s: %s%s%s%s is required (or start from a preset with "
                       "\"base\": one of %s)",
                       source, fields[i].section, *fields[i].section ? "." : "", fields[i].key,
                       fields[i].type == F_FLOPS ? ".f32" : "", fsdp_sim_profile_presets());
            return FSDP_ERR_INVALID_PARAM;
        }
        if (!has_f32) {
            if (!quiet)
                fsdp_error("cluster profile %s: gpu.matmul_flops_per_s.f32 is required", source);
            return FSDP_ERR_INVALID_PARAM;
        }
    }
    st = quiet ? FSDP_OK : fsdp_sim_profile_check(&p);
    if (st != FSDP_OK)
        return st;
    *profile_p = p;
    return FSDP_OK;
}

fsdp_status_t fsdp_sim_profile_parse(const char *text, fsdp_sim_profile_t *profile_p)
{
    json_error_t err;
    json_t *root;
    fsdp_status_t st;

    if (text == NULL || profile_p == NULL) {
        fsdp_error("fsdp_sim_profile_parse: text and profile_p must not be NULL");
        return FSDP_ERR_INVALID_PARAM;
    }
    root = json_loads(text, JSON_REJECT_DUPLICATES, &err);
    if (root == NULL) {
        fsdp_error("cluster profile (text): malformed JSON at line %d, column %d: %s", err.line,
                   err.column, err.text);
        return FSDP_ERR_FORMAT;
    }
    st = profile_from_json(root, "(text)", 0, profile_p);
    json_decref(root);
    return st;
}

fsdp_status_t fsdp_sim_profile_load(const char *path, fsdp_sim_profile_t *profile_p)
{
    json_error_t err;
    json_t *root;
    FILE *f;
    fsdp_status_t st;

    if (path == NULL || profile_p == NULL) {
        fsdp_error("fsdp_sim_profile_load: path and profile_p must not be NULL");
        return FSDP_ERR_INVALID_PARAM;
    }
    f = fopen(path, "rb");
    if (f == NULL) {
        fsdp_error("cluster profile %s: cannot open it", path);
        return FSDP_ERR_NOT_FOUND;
    }
    root = json_loadf(f, JSON_REJECT_DUPLICATES, &err);
    fclose(f);
    if (root == NULL) {
        fsdp_error("cluster profile %s: malformed JSON at line %d, column %d: %s", path, err.line,
                   err.column, err.text);
        return FSDP_ERR_FORMAT;
    }
    st = profile_from_json(root, path, 0, profile_p);
    json_decref(root);
    return st;
}

fsdp_status_t fsdp_sim_profile_from_arg(const char *arg, fsdp_sim_profile_t *profile_p)
{
    const char *slash, *colon;
    char *name;
    size_t len;
    struct stat sb;
    fsdp_status_t st;
    int is_file;

    if (arg == NULL || profile_p == NULL) {
        fsdp_error("fsdp_sim_profile_from_arg: arg and profile_p must not be NULL");
        return FSDP_ERR_INVALID_PARAM;
    }
    slash = strrchr(arg, '/');
    colon = strchr(slash ? slash : arg, ':');
    len = colon ? (size_t)(colon - arg) : strlen(arg);
    name = strndup(arg, len);
    if (name == NULL)
        return FSDP_ERR_NO_MEMORY;
    is_file = (len > 5 && strcmp(name + len - 5, ".json") == 0) ||
              (stat(name, &sb) == 0 && S_ISREG(sb.st_mode));
    if (!is_file) {
        free(name);
        return fsdp_sim_profile_preset(arg, profile_p);
    }
    {
        fsdp_sim_profile_t p;
        st = fsdp_sim_profile_load(name, &p);
        if (st == FSDP_OK && colon != NULL)
            st = apply_shape(arg, colon + 1, &p);
        if (st == FSDP_OK)
            *profile_p = p;
    }
    free(name);
    return st;
}

/* ---- to JSON ------------------------------------------------------------------------------ */

static json_t *numbers_json(const double *v, int n)
{
    json_t *a = json_array();

    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_real(v[i]));
    return a;
}

static json_t *classes_json(const double *v)
{
    return numbers_json(v, FSDP_SIM_NODE_CLASSES);
}

static json_t *rows_json(const double *rows, const char *(*name)(int), int n, size_t m,
                         size_t stride)
{
    json_t *o = json_object();

    for (int k = 0; k < n; k++) {
        json_t *a = json_array();
        for (size_t i = 0; i < m; i++)
            json_array_append_new(a, json_real(rows[(size_t)k * stride + i]));
        json_object_set_new(o, name(k), a);
    }
    return o;
}

static json_t *names_json(unsigned mask, const char *(*name)(int), int n)
{
    json_t *a = json_array();

    for (int k = 0; k < n; k++) {
        if (mask & (1u << k))
            json_array_append_new(a, json_string(name(k)));
    }
    return a;
}

static size_t field_size(const field_t *f)
{
    switch (f->type) {
    case F_INT:
    case F_BOOL:
        return sizeof(int);
    case F_SIZE:
        return sizeof(size_t);
    case F_DOUBLE:
        return sizeof(double);
    case F_STRING:
        return 64;
    case F_CLASSES:
        return FSDP_SIM_NODE_CLASSES * sizeof(double);
    case F_PROTO3:
        return FSDP_SIM_PROTO_COUNT * sizeof(double);
    case F_TABLE:
        return FSDP_SIM_ALGO_COUNT * FSDP_SIM_PROTO_COUNT * sizeof(double);
    case F_TREECORR:
        return FSDP_SIM_PROTO_COUNT * FSDP_SIM_TREE_SIZES * sizeof(double);
    case F_ALGOS:
    case F_PROTOS:
        return sizeof(unsigned);
    case F_OPS:
        return sizeof(fsdp_sim_ops_t);
    case F_FLOPS:
        return 0; /* compared member by member */
    }
    return 0;
}

static int profile_equal(const fsdp_sim_profile_t *a, const fsdp_sim_profile_t *b)
{
    for (size_t i = 0; i < N_FIELDS; i++) {
        const field_t *f = &fields[i];
        const char *x = (const char *)a + f->offset, *y = (const char *)b + f->offset;
        if (f->type == F_STRING ? strncmp(x, y, 64) != 0 : memcmp(x, y, field_size(f)) != 0)
            return 0;
    }
    return memcmp(a->gpu.matmul_flops_per_s, b->gpu.matmul_flops_per_s,
                  sizeof(a->gpu.matmul_flops_per_s)) == 0 &&
           a->gpu.tf32_flops_per_s == b->gpu.tf32_flops_per_s;
}

static json_t *field_json(const fsdp_sim_profile_t *p, const field_t *f)
{
    const char *addr = (const char *)p + f->offset;
    json_t *v = NULL;

    switch (f->type) {
    case F_INT:
        v = json_integer(*(const int *)addr);
        break;
    case F_SIZE:
        v = json_integer((json_int_t) * (const size_t *)addr);
        break;
    case F_DOUBLE:
        v = json_real(*(const double *)addr);
        break;
    case F_BOOL:
        v = json_boolean(*(const int *)addr);
        break;
    case F_STRING:
        v = json_string(addr);
        break;
    case F_CLASSES:
        v = classes_json((const double *)addr);
        break;
    case F_PROTO3:
        v = numbers_json((const double *)addr, FSDP_SIM_PROTO_COUNT);
        break;
    case F_TABLE:
        v = rows_json((const double *)addr, algo_name_i, FSDP_SIM_ALGO_COUNT, FSDP_SIM_PROTO_COUNT,
                      FSDP_SIM_PROTO_COUNT);
        break;
    case F_TREECORR:
        v = rows_json((const double *)addr, proto_name_i, FSDP_SIM_PROTO_COUNT, FSDP_SIM_TREE_SIZES,
                      FSDP_SIM_TREE_SIZES);
        break;
    case F_FLOPS:
        v = json_object();
        json_object_set_new(v, "f32", json_real(p->gpu.matmul_flops_per_s[FSDP_DTYPE_F32]));
        json_object_set_new(v, "tf32", json_real(p->gpu.tf32_flops_per_s));
        json_object_set_new(v, "bf16", json_real(p->gpu.matmul_flops_per_s[FSDP_DTYPE_BF16]));
        json_object_set_new(v, "f16", json_real(p->gpu.matmul_flops_per_s[FSDP_DTYPE_F16]));
        break;
    case F_ALGOS:
        v = names_json(*(const unsigned *)addr, algo_name_i, FSDP_SIM_ALGO_COUNT);
        break;
    case F_PROTOS:
        v = names_json(*(const unsigned *)addr, proto_name_i, FSDP_SIM_PROTO_COUNT);
        break;
    case F_OPS:
        v = json_string(*(const fsdp_sim_ops_t *)addr == FSDP_SIM_OPS_EAGER ? "eager" : "fused");
        break;
    }
    return v;
}

static char *profile_dump(const fsdp_sim_profile_t *p, int precision)
{
    json_t *root = json_object();
    char *text;

    for (size_t i = 0; i < N_FIELDS; i++) {
        const field_t *f = &fields[i];
        json_t *obj = root;
        if (*f->section != '\0') {
            obj = json_object_get(root, f->section);
            if (obj == NULL) {
                obj = json_object();
                json_object_set_new(root, f->section, obj);
            }
        }
        json_object_set_new(obj, f->key, field_json(p, f));
    }
    text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(precision));
    json_decref(root);
    return text;
}

char *fsdp_sim_profile_to_json(const fsdp_sim_profile_t *p)
{
    fsdp_sim_profile_t back;
    json_t *root;
    char *text = profile_dump(p, 15);
    int same = 0;

    /* 15 digits read well ("0.7", not "0.69999999999999996"); 17 when they do not read back
     * to the same doubles */
    if (text == NULL)
        return NULL;
    root = json_loads(text, 0, NULL);
    if (root != NULL) {
        same =
            profile_from_json(root, "(round trip)", 1, &back) == FSDP_OK && profile_equal(p, &back);
        json_decref(root);
    }
    if (same)
        return text;
    free(text);
    return profile_dump(p, 17);
}
