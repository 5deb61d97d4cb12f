/* Cluster profiles: the built-in presets and range checks (profile_json.c reads and writes
 * them as JSON, and takes a command line's preset or file).
 *
 * Every number of a preset, with its unit and source, is listed in traces/profiles/README.md;
 * traces/profiles/<name>.json is the same preset as JSON (test_simtime checks they agree).
 * Units are SI base units throughout: seconds, bytes, bytes/s, FLOP/s.
 */
#include "sim.h"

#include <fsdp/log.h>

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    /* the receive buffer written and read back, the user buffer read or written: 3 bytes of
     * HBM a bus byte (NVIDIA/nccl issue 1428) */
    nc->hbm_traffic_factor = 3.0;
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
    snprintf(p->stack, sizeof(p->stack), "PyTorch 2.11 (CUDA 13.0), NCCL 2.30 tables");
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
    /* vectorized eager ops of 134-1082 MB on an H100: median 2.72 of 3.35 TB/s
     * (traces/measured/h100-eager-ops.json) */
    p->gpu.elementwise_memory_efficiency = 0.81;
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
    snprintf(p->stack, sizeof(p->stack), "Azure HPC benchmarks (CUDA 12.5), NCCL 2.30 tables");
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
    /* vectorized eager ops of 134-1082 MB on an H200: median 3.67 of 4.8 TB/s
     * (traces/measured/h200-eager-ops.json) */
    p->gpu.elementwise_memory_efficiency = 0.76;
}

/* The h100 preset with the software of the published 2024 H100 runs (docs/fidelity.md): PyTorch
 * 2.2 to 2.6 on CUDA 12.1 to 12.4, whose wheels pin NCCL 2.19.3 (2.2) to 2.21.5 (2.5, 2.6).
 * What a source says differs from today's stack: NCCL before 2.23 has no PAT. cuBLAS 12.1's
 * best bf16 GEMM on an H100 SXM, 792.1 TFLOP/s (0.80 of the peak), and FlashAttention-2 are
 * no slower in their sources than the h100 preset's PyTorch 2.11 figures, which it keeps
 * (traces/profiles/README.md, "h100-2024"). */
static void preset_h100_2024(fsdp_sim_profile_t *p)
{
    preset_h100(p);
    snprintf(p->name, sizeof(p->name), "h100-2024");
    snprintf(p->stack, sizeof(p->stack), "PyTorch 2.2-2.6 (CUDA 12.1-12.4), NCCL 2.19-2.21");
    p->nccl.algorithms &= ~(1u << FSDP_SIM_ALGO_PAT);
}

/* NCCL 2.18.5's tuning (src/graph/tuning.cc at v2.18.5-1, lines 56-106), over a preset's 2.30
 * tables: the latencies, no Simple base for the tree, NVLS's 23 us as a base, llMaxBws' 87.7
 * GB/s on one node of Ampere or Hopper, no NVLS-tree cap (perChMaxNVLSTree came later) and no
 * PAT (2.23); the formulas that differ follow nccl.version (docs/costs.md, "NCCL 2.18"). The
 * per-channel caps of Ampere and Hopper are 2.30's. The call floor is the preset's rule
 * applied to this model: the 1 KiB row of the same table less latency and bytes. */
static void nccl_2_18(fsdp_sim_nccl_profile_t *nc, double call_floor_s)
{
    static const double base[FSDP_SIM_ALGO_COUNT][FSDP_SIM_PROTO_COUNT] = {
        {6.6e-6, 14.0e-6, 8.4e-6}, /* ring */
        {6.8e-6, 14.0e-6, 0.0},    /* tree */
        {0.0, 0.0, 23.0e-6},       /* nvls */
        {0.0, 0.0, 23.0e-6},       /* nvls_tree */
        {0.0, 0.0, 0.0},           /* pat: none */
    };
    static const double nvlink[FSDP_SIM_ALGO_COUNT][FSDP_SIM_PROTO_COUNT] = {
        {0.6e-6, 1.9e-6, 3.4e-6}, {0.6e-6, 1.25e-6, 4.0e-6}, {0.0, 0.0, 0.0},
        {0.0, 0.0, 0.0},          {0.0, 0.0, 0.0},
    };
    static const double net[FSDP_SIM_ALGO_COUNT][FSDP_SIM_PROTO_COUNT] = {
        {2.7e-6, 4.0e-6, 14.0e-6}, {5.0e-6, 8.5e-6, 14.0e-6}, {0.0, 0.0, 18.0e-6},
        {0.0, 0.0, 19.0e-6},       {0.0, 0.0, 0.0},
    };

    memcpy(nc->base_latency_s, base, sizeof(base));
    memcpy(nc->intra_latency_s, nvlink, sizeof(nvlink));
    memcpy(nc->inter_latency_s, net, sizeof(net));
    nc->ll_max_bytes_per_s[0] = 87.7e9;
    set3(nc->nvls_tree_channel_bytes_per_s, 0.0, 0.0, 0.0);
    nc->algorithms &= ~(1u << FSDP_SIM_ALGO_PAT);
    nc->version = 21805;
    nc->call_floor_s = call_floor_s;
}

/* The a100 preset with the NCCL of the Azure ND A100 v4 table it takes its floor and bus
 * bandwidth from (NCCL 2.18.5): 44.8 us at 1 KiB less ring LL's 15.0 us and 1 KiB on one of
 * 24 channels at a quarter of the bus, 0.74 us. */
static void preset_a100_nccl218(fsdp_sim_profile_t *p)
{
    preset_a100(p);
    snprintf(p->name, sizeof(p->name), "a100-nccl2.18");
    snprintf(p->stack, sizeof(p->stack), "Azure HPC benchmarks (CUDA 12.5), NCCL 2.18.5");
    nccl_2_18(&p->nccl, 29.1e-6);
}

/* The h100 preset with NCCL 2.18.5, the NCCL of the Azure ND H100 v5 table of its floor: 25.6
 * us at 1 KiB less ring LL's 15.0 us and 1 KiB on one of 32 channels at 87.7 GB/s, 0.65 us. */
static void preset_h100_nccl218(fsdp_sim_profile_t *p)
{
    preset_h100(p);
    snprintf(p->name, sizeof(p->name), "h100-nccl2.18");
    snprintf(p->stack, sizeof(p->stack), "PyTorch 2.11 (CUDA 13.0), NCCL 2.18.5");
    nccl_2_18(&p->nccl, 9.9e-6);
}

/* The Triton FlashAttention kernel of 2023 (flash-attn's flash_attn_triton, which MosaicML's
 * attn_impl triton ran), causal, by sequence length (512 to 16384 tokens) and head_dim (64,
 * 128): FlashAttention-2's paper (arXiv 2307.08691), Figure 4 (c) and (d), forward + backward on
 * an A100 80GB SXM4, the "FlashAttention Triton" bars, 59 75 79 76 79 80 (head_dim 64) and 50 61
 * 68 74 78 80 TFLOP/s (128), each over 312 TFLOP/s x the benchmark's wave quantization (16k tokens
 * a batch, 2048 wide: 2048 or 4096 blocks of 128 queries on 108 SMs, 0.998; docs/costs.md). */
static const double a100_triton_attention[2][FSDP_SIM_ATTN_SEQ_POINTS] = {
    {0.189, 0.241, 0.254, 0.244, 0.254, 0.257},
    {0.161, 0.196, 0.218, 0.238, 0.250, 0.257},
};

/* The same kernel on an H100 SXM5, which the figure has no bar of: FlashAttention's CUDA kernel on
 * an H100 (the paper's H100 figure, causal: 104 123 136 138 149 156 and 98 109 108 126 135 137
 * TFLOP/s) times the Triton kernel's rate over it on the A100 (Figure 4: 59/58 ... 80/97 and
 * 50/55 ... 80/83), over 989.4 TFLOP/s x 0.970 (the same blocks on 132 SMs). */
static const double h100_triton_attention[2][FSDP_SIM_ATTN_SEQ_POINTS] = {
    {0.110, 0.137, 0.145, 0.126, 0.133, 0.134},
    {0.093, 0.112, 0.111, 0.128, 0.137, 0.138},
};

/* The a100 preset with the software of MosaicML's 2023 runs (docs/fidelity.md): PyTorch 1.13.1
 * (CUDA 11.7) and 2.0.1 (CUDA 11.8), whose wheels carry NCCL 2.14.3, and MPT's Triton
 * FlashAttention. Its attention is that kernel's, by sequence length; its NCCL the 2.18.5 tables
 * and formulas, the oldest the model has (2.14's differ further: docs/costs.md); its GEMMs the
 * a100 preset's, since no measurement of cuBLAS 11.10/11.11 was found. */
static void preset_a100_2023(fsdp_sim_profile_t *p)
{
    preset_a100(p);
    snprintf(p->name, sizeof(p->name), "a100-2023");
    snprintf(p->stack, sizeof(p->stack),
             "PyTorch 1.13-2.0 (CUDA 11.7-11.8), Triton FA, NCCL 2.18 tables");
    nccl_2_18(&p->nccl, 29.1e-6);
    memcpy(p->gpu.attention_seq_efficiency, a100_triton_attention, sizeof(a100_triton_attention));
}

/* The h100-2024 preset with the same software: PyTorch 2.0.1 (CUDA 11.8), MPT's Triton
 * FlashAttention on a Triton built for sm_90, NCCL 2.18.5's tuning as for a100-2023. */
static void preset_h100_2023(fsdp_sim_profile_t *p)
{
    preset_h100_2024(p);
    snprintf(p->name, sizeof(p->name), "h100-2023");
    snprintf(p->stack, sizeof(p->stack), "PyTorch 2.0 (CUDA 11.8), Triton FA, NCCL 2.18 tables");
    nccl_2_18(&p->nccl, 9.9e-6);
    memcpy(p->gpu.attention_seq_efficiency, h100_triton_attention, sizeof(h100_triton_attention));
}

typedef struct preset {
    const char *name;
    void (*fill)(fsdp_sim_profile_t *p);
} preset_t;

static const preset_t presets[] = {
    {"h100", preset_h100},
    {"h100-2024", preset_h100_2024},
    {"a100", preset_a100},
    {"h200", preset_h200},
    {"a100-nccl2.18", preset_a100_nccl218},
    {"h100-nccl2.18", preset_h100_nccl218},
    {"a100-2023", preset_a100_2023},
    {"h100-2023", preset_h100_2023},
};
#define N_PRESETS (sizeof(presets) / sizeof(presets[0]))

const char *fsdp_sim_profile_presets(void)
{
    return "h100, h100-2024, a100, h200, a100-nccl2.18, h100-nccl2.18, a100-2023, h100-2023";
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
fsdp_status_t fsdp_sim_profile_apply_shape(const char *what, const char *opts,
                                           fsdp_sim_profile_t *p)
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
    status = colon != NULL ? fsdp_sim_profile_apply_shape(spec, colon + 1, &p) : FSDP_OK;
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

/* A rate (FLOP/s, bytes/s, elements/s) is 0 where zero says what 0 means (free, no cap; NULL:
 * 0 is not allowed), or in [FSDP_SIM_PROFILE_MIN_RATE, FSDP_SIM_PROFILE_BIG] (sim.h): no op's
 * time, its work divided by the rate, overflows. 1 (logged) when v is none of these. */
static int bad_rate(const fsdp_sim_profile_t *p, double v, const char *field, const char *zero)
{
    if ((v == 0.0 && zero != NULL) ||
        !bad_double(v, FSDP_SIM_PROFILE_MIN_RATE, FSDP_SIM_PROFILE_BIG))
        return 0;
    fsdp_error("cluster profile '%s': %s is %g; it must be %s%s%sa rate per second in [%g, %g] "
               "(a smaller one makes simulated times overflow)",
               p->name, field, v, zero != NULL ? "0 (" : "", zero != NULL ? zero : "",
               zero != NULL ? ") or " : "", FSDP_SIM_PROFILE_MIN_RATE, FSDP_SIM_PROFILE_BIG);
    return 1;
}

#define CHECK_RATE(expr, field_, zero_)                                                            \
    do {                                                                                           \
        if (bad_rate(p, (expr), (field_), (zero_)))                                                \
            return FSDP_ERR_INVALID_PARAM;                                                         \
    } while (0)

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
    for (int d = 0; d < FSDP_DTYPE_COUNT; d++) {
        char field[64];
        snprintf(field, sizeof(field), "gpu.matmul_flops_per_s.%s",
                 fsdp_dtype_name((fsdp_dtype_t)d));
        CHECK_RATE(p->gpu.matmul_flops_per_s[d], field, "free");
    }
    CHECK_RATE(p->gpu.tf32_flops_per_s, "gpu.matmul_flops_per_s.tf32", "free");
    CHECK_RATE(p->gpu.vector_flops_per_s, "gpu.vector_flops_per_s", "free");
    CHECK_RATE(p->gpu.hbm_bytes_per_s, "gpu.hbm_bytes_per_s", "free");
    CHECK_RANGE(p->gpu.compute_efficiency, 1e-6, 1, "gpu.compute_efficiency", "in (0, 1]");
    CHECK_RANGE(p->gpu.memory_efficiency, 1e-6, 1, "gpu.memory_efficiency", "in (0, 1]");
    CHECK_RANGE(p->gpu.kernel_latency_s, 0, 1, "gpu.kernel_latency_s", "seconds in [0, 1]");
    CHECK_RANGE(p->gpu.gemm_efficiency, 1e-6, 1, "gpu.gemm_efficiency", "in (0, 1]");
    CHECK_RANGE(p->gpu.attention_efficiency, 1e-6, 1, "gpu.attention_efficiency", "in (0, 1]");
    CHECK_RANGE(p->gpu.gemm_unaligned_efficiency, 1e-6, 1, "gpu.gemm_unaligned_efficiency",
                "in (0, 1]");
    {
        const double *e = &p->gpu.attention_seq_efficiency[0][0];
        int set = 0, n = 2 * FSDP_SIM_ATTN_SEQ_POINTS;
        for (int i = 0; i < n; i++) {
            CHECK_RANGE(e[i], 0, 1, "gpu.attention_seq_efficiency", "in (0, 1], or all 0");
            set += e[i] != 0.0;
        }
        if (set != 0 && set != n) {
            fsdp_error("cluster profile '%s': gpu.attention_seq_efficiency has %d of its %d "
                       "entries set; give both rows (hd64, hd128) in full, or none "
                       "(attention_efficiency at every length)",
                       p->name, set, n);
            return FSDP_ERR_INVALID_PARAM;
        }
    }
    CHECK_RATE(p->gpu.strided_elements_per_s, "gpu.strided_elements_per_s", "bytes alone");
    CHECK_RANGE(p->gpu.elementwise_memory_efficiency, 0, 1, "gpu.elementwise_memory_efficiency",
                "in [0, 1] (0: memory_efficiency)");
    CHECK_RANGE(p->gpu.sms, 0, 100000, "gpu.sms", "an integer in [0, 100000] (0: no quantization)");
    if (p->ops != FSDP_SIM_OPS_FUSED && p->ops != FSDP_SIM_OPS_EAGER) {
        fsdp_error("cluster profile '%s': ops must be eager or fused", p->name);
        return FSDP_ERR_INVALID_PARAM;
    }
    CHECK_RANGE(p->host.launch_overhead_s, 0, 1, "host.launch_overhead_s", "seconds in [0, 1]");
    CHECK_RANGE(p->host.event_overhead_s, 0, 1, "host.event_overhead_s", "seconds in [0, 1]");
    CHECK_RANGE(p->host.launch_latency_s, 0, 1, "host.launch_latency_s", "seconds in [0, 1]");
    CHECK_RATE(p->host.h2d_bytes_per_s, "host.h2d_bytes_per_s", "free");
    CHECK_RATE(p->host.d2h_bytes_per_s, "host.d2h_bytes_per_s", "free");
    if (!(nc->algorithms & (1u << FSDP_SIM_ALGO_RING)) ||
        nc->algorithms >= (1u << FSDP_SIM_ALGO_COUNT)) {
        fsdp_error("cluster profile '%s': nccl.algorithms must include ring (all-gather and "
                   "reduce-scatter need it); allowed: " FSDP_SIM_ALGO_NAMES,
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
    CHECK_RATE(nc->intra_bus_bytes_per_s, "nccl.intra_bus_bytes_per_s", NULL);
    CHECK_RATE(nc->nic_bytes_per_s, "nccl.nic_bytes_per_s", "no limit");
    CHECK_RANGE(nc->net_overhead_s, 0, 1, "nccl.net_overhead_s", "in [0, 1] s");
    CHECK_RANGE(nc->net_latency_s, 0, 1, "nccl.net_latency_s", "in [0, 1] s");
    for (int i = 0; i < FSDP_SIM_NODE_CLASSES; i++) {
        CHECK_RATE(nc->ll_max_bytes_per_s[i], "nccl.ll_max_bytes_per_s", "no cap");
        CHECK_RATE(nc->ring_ll128_channel_bytes_per_s[i], "nccl.ring_ll128_channel_bytes_per_s",
                   "no cap");
        CHECK_RATE(nc->tree_channel_bytes_per_s[i], "nccl.tree_channel_bytes_per_s", "no cap");
        CHECK_RATE(nc->tree_ll128_channel_bytes_per_s[i], "nccl.tree_ll128_channel_bytes_per_s",
                   "no cap");
    }
    CHECK_RANGE(nc->ring_plateau_factor, 1e-6, 100, "nccl.ring_plateau_factor", "in (0, 100]");
    CHECK_RATE(nc->nvls_bus_bytes_per_s, "nccl.nvls_bus_bytes_per_s", "no NVLS");
    CHECK_RANGE(nc->call_floor_s, 0, 1, "nccl.call_floor_s", "in [0, 1] s");
    CHECK_RANGE(nc->net_floor_s, 0, 1, "nccl.net_floor_s", "in [0, 1] s");
    for (int pr = 0; pr < FSDP_SIM_PROTO_COUNT; pr++)
        CHECK_RANGE(nc->channel_bytes[pr], 0, FSDP_SIM_PROFILE_BIG, "nccl.channel_bytes",
                    ">= 0 bytes (0: every call on all channels)");
    for (int i = 0; i < FSDP_SIM_NODE_CLASSES; i++)
        CHECK_RATE(nc->nvls_tree_channel_bytes_per_s[i], "nccl.nvls_tree_channel_bytes_per_s",
                   "no cap");
    CHECK_RANGE(nc->pat_bandwidth_factor, 0, 1, "nccl.pat_bandwidth_factor",
                "in [0, 1] (0: no PAT)");
    CHECK_RANGE(nc->hbm_traffic_factor, 0, 8, "nccl.hbm_traffic_factor",
                "in [0, 8] (0: collectives take no HBM bandwidth)");
    if (nc->sms_per_channel < 0 || nc->sms_per_channel > 8) {
        fsdp_error("cluster profile '%s': nccl.sms_per_channel %d must be in [0, 8] (0: "
                   "collectives take no SMs from compute)",
                   p->name, nc->sms_per_channel);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (nc->version != 0 && (nc->version < 20000 || nc->version > 99999)) {
        fsdp_error("cluster profile '%s': nccl.version %d must be 0 (NCCL 2.30's tuning) or an "
                   "NCCL version code, 21805 for 2.18.5",
                   p->name, nc->version);
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
