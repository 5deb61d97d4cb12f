"""fsdp-plan against every published run of docs/fidelity.md: plans each row's job with the
command the doc gives, and prints (or writes into the doc) every table the doc holds.

    python3 tools/reference/fidelity.py [--plan PATH] [--jobs N] [--write docs/fidelity.md]
                                        [--table NAME ...]

Each table of docs/fidelity.md follows a line `<!-- fidelity.py: NAME -->`; --write replaces
the table under each such line with the one this script makes, and leaves every other line of
the file as it is. Without --write the tables are printed, each after its marker line. The
tables:

- runs: the 1D rows (FSDP1, fsdp-plan's default), the plan with --ops fused and eager, and the
  flat roofline of commit 81a8da1 (a column kept as it was published, not rerun);
- fsdp2: torchtitan's runs planned again with --api fsdp2, as they ran, beside FSDP1's plan,
  with the published and planned memory;
- 2d: every published FSDP + TP run found, planned with --api fsdp2 --tp N where fsdp-plan can
  express it (the others listed, unplanned);
- memory: the peak allocated / reserved per GPU of the 1D rows, eager and fused, and whether
  they fit;
- by-gpu, by-count: the median and worst error by GPU type and by GPU count (MPT's runs in a
  column of their own and in the totals);
- time: where each run's planned step goes (compute, exposed communication, what collectives
  take from compute beside them);
- kernels: the planned kernel time by kind of the H200 measurement's job, beside its kernel
  trace (traces/measured/h200-llama-4layer-flash-kernels.json, figures as docs/fidelity.md
  gives them);
- mpt, mpt-by, mpt-stack, mpt-scale: MosaicML's MPT runs (llm-foundry's benchmark tables),
  planned as they ran (--ops fused, on the -2023 presets of the software they used) and with
  --ops eager, and on today's presets beside; their median and worst error by sequence length,
  model size and checkpointing, on both; the same job at several GPU counts.

Nothing here is fitted: the profiles are the presets, changed only where a source states a
cluster fact (docs/fidelity.md, "The runs"). Plans run in parallel (--jobs, default 2).
"""
import argparse
import concurrent.futures
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

# torchtitan's Grand Teton H100s: 96 GB of HBM2e at 2.4 TB/s, a 500 W limit that puts the peak
# between the SXM's and the NVL's (835 TFLOP/s bf16): both bounds are planned
GT_GPU = '"model": "NVIDIA H100 96GB HBM2e", "hbm_bytes_per_s": 2.4e12, "memory_bytes": 103079215104'
NVL_PEAK = '"matmul_flops_per_s": {"f32": 60e12, "tf32": 417.5e12, "bf16": 835e12, "f16": 835e12}'
PROFILES = {
    # IBM's clusters: one NIC a node of the 400 and 800 Gb/s the post states
    "a100-400g": '{"base": "a100", "nccl": {"nics_per_node": 1, "nic_bytes_per_s": 47e9}}',
    "h100-800g": '{"base": "h100-2024", "nccl": {"nics_per_node": 1, "nic_bytes_per_s": 94e9}}',
    "h100-gt": '{"base": "h100-2024", "gpu": {%s}}' % GT_GPU,
    "h100-gt-nvl": '{"base": "h100-2024", "gpu": {%s, %s}}' % (GT_GPU, NVL_PEAK),
    # the same GPUs under the software of 2025 (NCCL 2.23 and later, with PAT)
    "h100-gt-2025": '{"base": "h100", "gpu": {%s}}' % GT_GPU,
    "h100-gt-2025-nvl": '{"base": "h100", "gpu": {%s, %s}}' % (GT_GPU, NVL_PEAK),
    # MosaicML's A100 40GB nodes: the a100 preset with the 40 GB SXM4's memory and HBM2
    # bandwidth (NVIDIA A100 datasheet: 40 GB, 1,555 GB/s); 8 x 200 Gb/s is the 1600 Gb/s a node
    "a100-40g": '{"base": "a100", "gpu": {"model": "NVIDIA A100 SXM4 40GB", '
                '"memory_bytes": 42949672960, "hbm_bytes_per_s": 1.555e12}}',
    # ... under the software those runs used (PyTorch 1.13.1, CUDA 11.7, Triton FlashAttention)
    "a100-40g-2023": '{"base": "a100-2023", "gpu": {"model": "NVIDIA A100 SXM4 40GB", '
                     '"memory_bytes": 42949672960, "hbm_bytes_per_s": 1.555e12}}',
}
MP = ["--mixed-precision", "param=bf16,reduce=fp32"]
TT = ["--profile", "a100:nodes=8"] + MP
TT2 = ["--model", "llama3-8b"] + MP + ["--local-batch", "2", "--seq", "8192",
                                       "--activation-checkpointing", "selective-op"]
IBM_A = ["--profile", "@a100-400g:nodes=16", "--mixed-precision", "bf16", "--local-batch", "2"]
IBM_H = ["--profile", "@h100-800g:nodes=12", "--mixed-precision", "bf16", "--local-batch", "2"]
CL34 = "llama:layers=48,heads=64,kv_heads=8,dim=8192,ffn=22016,seq=4096,vocab=32000"
M4 = ("llama:layers=4,heads=32,kv_heads=32,dim=4096,ffn=11008,seq=4096,vocab=32000,"
      "rope_theta=10000,eps=1e-5")
W1 = ["--world", "1"] + MP


def ac(mode):
    return ["--activation-checkpointing", mode]


def peaks(args, sxm, nvl, nodes):
    """TT2's GPUs at both bounds of their peak: the SXM's and the NVL's"""
    return [("SXM", args + ["--profile", "@%s:nodes=%d" % (sxm, nodes)]),
            ("NVL", args + ["--profile", "@%s:nodes=%d" % (nvl, nodes)])]


class Run:
    """A published run: what the tables show of it, and the fsdp-plan command(s) of its job.
    variants: (label, options) for each bound planned (TT2's peaks), or one with label ''.
    api: how it ran (fsdp1, fsdp2); modes: the --ops it is planned with as it ran."""

    def __init__(self, src, model, gpus, gpu, count, batch, ckpt, published, variants,
                 flat=None, api="fsdp1", modes=("eager",), mem=None, ran=None, **extra):
        self.src, self.model, self.gpus, self.gpu, self.count = src, model, gpus, gpu, count
        self.batch, self.ckpt, self.published, self.flat = batch, ckpt, published, flat
        if variants and isinstance(variants[0], tuple):
            self.variants = variants
        else:
            self.variants = [("", variants)] if variants else []
        self.api, self.modes, self.mem, self.ran = api, modes, mem, ran
        self.extra = extra


TT_RUNS = [
    Run("TT", "Llama 3 8B", "64 A100", "A100", 64, "1 x 8192", "selective layer", 2904,
        ["--model", "llama3-8b"] + TT + ["--local-batch", "1"] + ac("selective-layer"),
        flat=4034, api="fsdp2", mem="not published"),
    Run("TT", "Llama 3 8B", "64 A100", "A100", 64, "1 x 8192", "selective op", 2973,
        ["--model", "llama3-8b"] + TT + ["--local-batch", "1"] + ac("selective-op"),
        flat=4082, api="fsdp2", mem="not published"),
    Run("TT", "Llama 3 70B", "64 A100", "A100", 64, "1 x 8192", "full", 331,
        ["--model", "llama3-70b"] + TT + ["--local-batch", "1"] + ac("full"),
        flat=436, api="fsdp2", mem="not published"),
    Run("TT", "Llama 2 13B", "64 A100", "A100", 64, "2 x 4096", "none", 2162,
        ["--model", "llama2-13b"] + TT + ["--local-batch", "2"],
        flat=2919, api="fsdp2", mem="not published"),
    Run("TT", "Llama 2 13B", "64 A100", "A100", 64, "2 x 4096", "selective layer", 1914,
        ["--model", "llama2-13b"] + TT + ["--local-batch", "2"] + ac("selective-layer"),
        flat=2585, api="fsdp2", mem="not published"),
    Run("TT", "Llama 2 13B", "64 A100", "A100", 64, "2 x 4096", "selective op", 1904,
        ["--model", "llama2-13b"] + TT + ["--local-batch", "2"] + ac("selective-op"),
        flat=2594, api="fsdp2", mem="not published"),
    Run("TT", "Llama 2 70B", "64 A100", "A100", 64, "1 x 4096", "selective op", 355,
        ["--model", "llama2-70b"] + TT + ["--local-batch", "1"] + ac("selective-op"),
        flat=506, api="fsdp2", mem="not published"),
    Run("TT", "Llama 2 70B", "64 A100", "A100", 64, "2 x 4096", "full", 353,
        ["--model", "llama2-70b"] + TT + ["--local-batch", "2"] + ac("full"),
        flat=460, api="fsdp2", mem="not published"),
    # the job torchtitan's footnote says ran out of memory: no throughput, not in the runs table
    Run("TT", "Llama 2 70B", "64 A100", "A100", 64, "2 x 4096", "selective op", None,
        ["--model", "llama2-70b"] + TT + ["--local-batch", "2"] + ac("selective-op"),
        api="fsdp2", mem="out of memory", ran="out of memory"),
]
TT2_RUNS = [
    Run("TT2", "Llama 3.1 8B", "8 H100 (96 GB, 500 W)", "H100", 8, "2 x 8192", "selective op",
        5762, peaks(TT2, "h100-gt", "h100-gt-nvl", 1), api="fsdp2", mem="82.4"),
    Run("TT2", "Llama 3.1 8B", "128 H100 (96 GB, 500 W)", "H100", 128, "2 x 8192",
        "selective op", 5605, peaks(TT2, "h100-gt", "h100-gt-nvl", 16), api="fsdp2", mem="67.0"),
]
IBM_A_RUNS = [
    Run("IBM", "Llama 2 7B (HSDP)", "128 A100", "A100", 128, "2 x 4096", "none", 3700,
        ["--model", "llama2-7b"] + IBM_A + ["--strategy", "hybrid_shard"], flat=5497),
    Run("IBM", "Llama 2 13B", "128 A100", "A100", 128, "2 x 4096", "every 2nd layer", 1800,
        ["--model", "llama2-13b"] + IBM_A + ac("selective-layer:2"), flat=2563),
    Run("IBM", "34B (CodeLlama shape)", "128 A100", "A100", 128, "2 x 4096", "full", 700,
        ["--model", CL34] + IBM_A + ac("full"), flat=924),
    Run("IBM", "Llama 2 70B", "128 A100", "A100", 128, "2 x 4096", "full", 370,
        ["--model", "llama2-70b"] + IBM_A + ac("full"), flat=459),
]
IBM_H_RUNS = [
    Run("IBM", "Llama 2 7B (HSDP)", "96 H100", "H100", 96, "2 x 4096", "none", 7500,
        ["--model", "llama2-7b"] + IBM_H + ["--strategy", "hybrid_shard"], flat=14370),
    Run("IBM", "Llama 2 13B", "96 H100", "H100", 96, "2 x 4096", "every 2nd layer", 3800,
        ["--model", "llama2-13b"] + IBM_H + ac("selective-layer:2"), flat=6736),
    Run("IBM", "34B (CodeLlama shape)", "96 H100", "H100", 96, "2 x 4096", "full", 1550,
        ["--model", CL34] + IBM_H + ac("full"), flat=2447),
    Run("IBM", "Llama 2 70B", "96 H100", "H100", 96, "2 x 4096", "full", 800,
        ["--model", "llama2-70b"] + IBM_H + ac("full"), flat=1220),
]
M_RUNS = [
    Run("M", "Llama 2 7B shape, 4 layers", "1 H200", "H200", 1, "2 x 4096", "none", 67032,
        ["--model", M4, "--profile", "h200", "--local-batch", "2"] + W1, flat=95386,
        mem="ran (140 GiB)", key="m-h200"),
    Run("M", "Llama 2 7B shape, 4 layers", "1 H100", "H100", 1, "2 x 4096", "none", 62350,
        ["--model", M4, "--profile", "h100", "--local-batch", "2"] + W1, mem="ran (80 GiB)"),
    Run("M", "Llama 2 7B shape, 4 layers", "1 H200", "H200", 1, "2 x 4096", "full", 55933,
        ["--model", M4, "--profile", "h200", "--local-batch", "2"] + W1 + ac("full"),
        mem="ran (140 GiB)"),
    Run("M", "GPT-2 124M, HF eager attention", "1 H200", "H200", 1, "8 x 1024", "none", 132967,
        ["--model", "gpt2", "--profile", "h200", "--local-batch", "8"] + W1,
        mem="ran (140 GiB)"),
    Run("M", "GPT-2 124M, HF eager attention", "1 H200", "H200", 1, "8 x 1024", "full", 95695,
        ["--model", "gpt2", "--profile", "h200", "--local-batch", "8"] + W1 + ac("full"),
        mem="ran (140 GiB)"),
    Run("M", "GPT-2 124M, SDPA", "1 H200", "H200", 1, "8 x 1024", "none", 171450,
        ["--model", "gpt2", "--profile", "h200", "--local-batch", "8", "--attention", "fused"]
        + W1, mem="ran (140 GiB)"),
]
RUNS_1D = TT_RUNS + IBM_A_RUNS + TT2_RUNS + IBM_H_RUNS + M_RUNS


# [MPT] MosaicML's llm-foundry, scripts/train/benchmarking/README.md at 061f2c7 (2023-10-17):
# MPT models under Composer's FSDP (FULL_SHARD), every row of its four tables as published:
# model, tokens a sequence, GPUs, micro-batch, gradient accumulation, tokens/s per GPU,
# precision, Composer's FSDP mixed precision, activation checkpointing, NumParams. The shapes
# are scripts/train/yamls/pretrain/mpt-*.yaml's (layers, heads, width; expansion ratio 4,
# vocabulary 50368, biases, learned positions of max_seq_len, tied embedding): a GPT-2.
MPT_SHAPES = {"125m": (12, 12, 768), "350m": (24, 16, 1024), "760m": (24, 12, 1536),
              "1b": (24, 16, 2048), "3b": (32, 20, 2560), "7b": (32, 32, 4096),
              "13b": (40, 40, 5120), "30b": (48, 56, 7168), "70b": (80, 64, 8192)}
MPT_VOCAB = 50368
# each table: its title, the GPUs, their type, the profile it is planned on, the stack the runs
# used (PyTorch 1.13.1 and 2.0.1 on CUDA 11.7 and 11.8, MPT's Triton FlashAttention: the -2023
# presets; None: not expressible), and the same GPUs under today's presets, planned beside them
MPT_TABLES = {
    "h100": ("H100 80GB BF16", "H100 80GB", "H100", "h100-2023", "h100-2024"),
    "h100-fp8": ("H100 80GB FP8", "H100 80GB", "H100", None, None),
    "a100-80": ("A100 80GB", "A100 80GB", "A100", "a100-2023", "a100"),
    "a100-40": ("A100 40GB", "A100 40GB", "A100", "@a100-40g-2023", "@a100-40g"),
}
MPT_ROWS = {
    "h100": """
        70b 2048 64 8 4 1039 amp_bf16 DEFAULT True 64862437376
        70b 2048 32 2 16 882 amp_bf16 DEFAULT True 64862437376
        30b 8192 8 1 21 1384 amp_bf16 DEFAULT True 30019254272
        30b 4096 8 1 21 1802 amp_bf16 DEFAULT True 29989894144
        30b 2048 32 14 3 2308 amp_bf16 DEFAULT True 29975214080
        30b 2048 16 10 3 2263 amp_bf16 DEFAULT True 29975214080
        30b 2048 8 3 21 2002 amp_bf16 DEFAULT True 29975214080
        30b 1024 8 6 21 2084 amp_bf16 DEFAULT True 29967874048
        13b 32768 8 1 3 1976 amp_bf16 DEFAULT True 13011240960
        13b 16384 8 3 3 2985 amp_bf16 DEFAULT True 12927354880
        13b 4096 8 10 3 4717 amp_bf16 DEFAULT True 12864440320
        13b 2048 64 2 1 4800 amp_bf16 DEFAULT False 12853954560
        13b 2048 32 2 1 4811 amp_bf16 DEFAULT False 12853954560
        13b 2048 16 2 1 4767 amp_bf16 DEFAULT False 12853954560
        13b 2048 8 2 1 4792 amp_bf16 DEFAULT False 12853954560
        13b 1024 8 40 3 5502 amp_bf16 DEFAULT True 12848711680
        7b 65536 8 1 2 1956 amp_bf16 DEFAULT True 6918905856
        7b 32768 8 2 2 3318 amp_bf16 DEFAULT True 6784688128
        7b 8192 8 8 2 6935 amp_bf16 DEFAULT True 6684024832
        7b 4096 8 16 2 8611 amp_bf16 DEFAULT True 6667247616
        7b 2048 8 6 1 10643 amp_bf16 DEFAULT False 6658859008
        7b 1024 8 64 2 10203 amp_bf16 DEFAULT True 6654664704
        3b 65536 8 1 2 3262 amp_bf16 DEFAULT True 2814366720
        3b 32768 8 3 6 5873 amp_bf16 DEFAULT True 2730480640
        3b 16384 8 1 6 11152 amp_bf16 DEFAULT False 2688537600
        3b 8192 8 3 6 16578 amp_bf16 DEFAULT False 2667566080
        3b 4096 8 5 6 20964 amp_bf16 DEFAULT False 2657080320
        3b 2048 64 6 3 22525 amp_bf16 DEFAULT False 2651837440
        3b 2048 32 6 3 23021 amp_bf16 DEFAULT False 2651837440
        3b 2048 16 10 3 24142 amp_bf16 DEFAULT False 2651837440
        3b 1024 8 20 6 27046 amp_bf16 DEFAULT False 2649216000
        3b 512 8 40 6 27965 amp_bf16 DEFAULT False 2647905280
        1b 65536 8 1 2 5506 amp_bf16 DEFAULT True 1445974016
        1b 32768 8 1 4 12025 amp_bf16 DEFAULT False 1378865152
        1b 16384 8 2 4 19649 amp_bf16 DEFAULT False 1345310720
        1b 8192 8 3 4 29157 amp_bf16 DEFAULT False 1328533504
        1b 4096 8 7 4 38535 amp_bf16 DEFAULT False 1320144896
        1b 2048 64 20 1 44402 amp_bf16 DEFAULT False 1315950592
        1b 2048 32 20 1 45130 amp_bf16 DEFAULT False 1315950592
        1b 2048 16 20 1 46037 amp_bf16 DEFAULT False 1315950592
        1b 2048 8 14 1 45455 amp_bf16 DEFAULT False 1315950592
        1b 1024 8 18 4 48910 amp_bf16 DEFAULT False 1313853440
        1b 512 8 56 4 52275 amp_bf16 DEFAULT False 1312804864
        760m 32768 8 1 2 16291 amp_bf16 DEFAULT False 807656448
        760m 16384 8 3 2 27815 amp_bf16 DEFAULT False 782490624
        760m 8192 8 6 2 41825 amp_bf16 DEFAULT False 769907712
        760m 4096 8 12 2 55459 amp_bf16 DEFAULT False 763616256
        760m 2048 32 24 1 67971 amp_bf16 DEFAULT False 760470528
        760m 2048 16 24 1 68551 amp_bf16 DEFAULT False 760470528
        760m 2048 8 24 2 63147 amp_bf16 DEFAULT False 760470528
        760m 1024 8 48 2 78581 amp_bf16 DEFAULT False 758897664
        760m 512 8 96 2 83749 amp_bf16 DEFAULT False 758111232
    """,
    "h100-fp8": """
        3b 32768 8 3 6 5856 amp_fp8 DEFAULT True 2730480640
        3b 8192 8 3 6 19146 amp_fp8 DEFAULT False 2667566080
        3b 2048 8 10 6 30586 amp_fp8 DEFAULT False 2651837440
        3b 512 8 40 6 36527 amp_fp8 DEFAULT False 2647905280
        1b 32768 8 1 4 12580 amp_fp8 DEFAULT False 1378865152
        1b 8192 8 2 4 32010 amp_fp8 DEFAULT False 1328533504
        1b 512 8 56 4 70315 amp_fp8 DEFAULT False 1312804864
        350m 32768 8 1 4 24439 amp_fp8 DEFAULT False 387442688
        350m 16384 8 2 4 42929 amp_fp8 DEFAULT False 370665472
        350m 512 8 56 4 154420 amp_fp8 DEFAULT False 354412544
    """,
    "a100-80": """
        70b 2048 64 8 4 410 bf16 PURE True 64862437376
        70b 2048 32 2 16 373 bf16 PURE True 64862437376
        30b 8192 8 1 21 574 amp_bf16 DEFAULT True 30019254272
        30b 4096 8 1 21 814 amp_bf16 DEFAULT True 29989894144
        30b 2048 8 3 21 916 amp_bf16 DEFAULT True 29975214080
        30b 1024 8 6 21 946 amp_bf16 DEFAULT True 29967874048
        30b 512 8 12 21 967 amp_bf16 DEFAULT True 29964204032
        13b 32768 8 1 3 1016 amp_bf16 DEFAULT True 13011240960
        13b 16384 8 3 3 1431 amp_bf16 DEFAULT True 12927354880
        13b 8192 8 5 3 1795 amp_bf16 DEFAULT True 12885411840
        13b 4096 8 10 3 2060 amp_bf16 DEFAULT True 12864440320
        13b 2048 8 2 3 2262 amp_bf16 DEFAULT False 12853954560
        13b 1024 8 40 3 2330 amp_bf16 DEFAULT True 12848711680
        7b 65536 8 1 2 1013 amp_bf16 DEFAULT True 6918905856
        7b 32768 8 2 2 1672 amp_bf16 DEFAULT True 6784688128
        7b 16384 8 4 2 2453 amp_bf16 DEFAULT True 6717579264
        7b 8192 8 8 2 3206 amp_bf16 DEFAULT True 6684024832
        7b 4096 8 16 2 3684 amp_bf16 DEFAULT True 6667247616
        7b 2048 8 6 2 4641 amp_bf16 DEFAULT False 6658859008
        7b 1024 8 64 2 4357 amp_bf16 DEFAULT True 6654664704
        3b 65536 8 1 2 1767 amp_bf16 DEFAULT True 2814366720
        3b 32768 8 3 6 3029 amp_bf16 DEFAULT True 2730480640
        3b 16384 8 1 6 5529 amp_bf16 DEFAULT False 2688537600
        3b 8192 8 3 6 7695 amp_bf16 DEFAULT False 2667566080
        3b 4096 8 5 6 9457 amp_bf16 DEFAULT False 2657080320
        3b 2048 8 10 2 10811 amp_bf16 DEFAULT False 2651837440
        3b 1024 8 20 6 11580 amp_bf16 DEFAULT False 2649216000
        3b 512 8 40 6 12127 amp_bf16 DEFAULT False 2647905280
        1b 65536 8 1 2 3044 amp_bf16 DEFAULT True 1445974016
        1b 32768 8 1 4 6275 amp_bf16 DEFAULT False 1378865152
        1b 16384 8 2 4 9956 amp_bf16 DEFAULT False 1345310720
        1b 8192 8 3 4 13814 amp_bf16 DEFAULT False 1328533504
        1b 4096 8 7 4 17807 amp_bf16 DEFAULT False 1320144896
        1b 2048 8 14 4 20513 amp_bf16 DEFAULT False 1315950592
        1b 1024 8 18 4 22112 amp_bf16 DEFAULT False 1313853440
        1b 512 8 56 4 23148 amp_bf16 DEFAULT False 1312804864
        760m 65536 8 1 2 4143 amp_bf16 DEFAULT True 857988096
        760m 32768 8 1 2 8802 amp_bf16 DEFAULT False 807656448
        760m 16384 8 3 2 14274 amp_bf16 DEFAULT False 782490624
        760m 8192 8 6 2 20933 amp_bf16 DEFAULT False 769907712
        760m 4096 8 12 2 27351 amp_bf16 DEFAULT False 763616256
        760m 2048 8 24 2 32434 amp_bf16 DEFAULT False 760470528
        760m 1024 8 48 2 29765 amp_bf16 DEFAULT False 758897664
        760m 512 8 96 2 29446 amp_bf16 DEFAULT False 758111232
        350m 65536 8 1 2 7524 amp_bf16 DEFAULT False 420997120
        350m 32768 8 2 2 13652 amp_bf16 DEFAULT False 387442688
        350m 16384 8 4 2 23559 amp_bf16 DEFAULT False 370665472
        350m 8192 8 8 2 36569 amp_bf16 DEFAULT False 362276864
        350m 4096 8 16 2 49555 amp_bf16 DEFAULT False 358082560
        350m 2048 8 32 2 58782 amp_bf16 DEFAULT False 355985408
        350m 1024 8 64 2 64813 amp_bf16 DEFAULT False 354936832
        350m 512 8 128 2 69330 amp_bf16 DEFAULT False 354412544
        125m 65536 8 1 2 20368 amp_bf16 DEFAULT False 174070272
        125m 32768 8 2 2 36407 amp_bf16 DEFAULT False 148904448
        125m 16384 8 4 2 60040 amp_bf16 DEFAULT False 136321536
        125m 8192 8 8 2 90392 amp_bf16 DEFAULT False 130030080
        125m 4096 8 16 2 118396 amp_bf16 DEFAULT False 126884352
        125m 2048 8 40 2 142830 amp_bf16 DEFAULT False 125311488
        125m 2048 8 32 2 141737 amp_bf16 DEFAULT False 125311488
        125m 1024 8 64 2 156468 amp_bf16 DEFAULT False 124525056
        125m 512 8 128 2 165681 amp_bf16 DEFAULT False 124131840
    """,
    "a100-40": """
        70b 2048 128 4 1 376 bf16 PURE True 64862437376
        70b 2048 64 2 1 276 bf16 PURE True 64862437376
        30b 2048 128 6 1 865 bf16 PURE True 29975214080
        30b 2048 32 4 1 857 bf16 PURE True 29975214080
        13b 8192 8 1 16 1407 bf16 PURE True 12885411840
        13b 4096 8 2 16 1603 bf16 PURE True 12864440320
        13b 2048 128 16 1 1972 bf16 PURE True 12853954560
        13b 2048 64 16 1 1976 bf16 PURE True 12853954560
        13b 2048 32 14 1 1998 bf16 PURE True 12853954560
        13b 2048 16 10 1 1993 bf16 PURE True 12853954560
        13b 2048 8 4 16 1668 bf16 PURE True 12853954560
        13b 1024 8 8 16 1727 bf16 PURE True 12848711680
        13b 512 8 16 16 1763 bf16 PURE True 12846090240
        7b 16384 8 1 4 2249 bf16 PURE True 6717579264
        7b 8192 8 3 4 2887 bf16 PURE True 6684024832
        7b 4096 8 6 4 3366 bf16 PURE True 6667247616
        7b 2048 128 18 1 3623 bf16 PURE True 6658859008
        7b 2048 64 18 1 3665 bf16 PURE True 6658859008
        7b 2048 32 18 1 3725 bf16 PURE True 6658859008
        7b 2048 16 16 1 3645 bf16 PURE True 6658859008
        7b 2048 8 12 4 3679 bf16 PURE True 6658859008
        7b 1024 8 24 4 3854 bf16 PURE True 6654664704
        7b 512 8 48 4 3895 bf16 PURE True 6652567552
        3b 32768 8 1 4 2955 bf16 PURE True 2730480640
        3b 16384 8 2 8 4465 bf16 PURE True 2688537600
        3b 8192 8 1 8 7149 bf16 PURE False 2667566080
        3b 4096 8 2 8 8777 bf16 PURE False 2657080320
        3b 2048 128 6 1 9538 bf16 PURE False 2651837440
        3b 2048 64 6 1 9736 bf16 PURE False 2651837440
        3b 2048 32 6 1 9914 bf16 PURE False 2651837440
        3b 2048 16 5 1 9750 bf16 PURE False 2651837440
        3b 2048 8 5 8 10065 bf16 PURE False 2651837440
        3b 1024 8 10 8 10731 bf16 PURE False 2649216000
        3b 512 8 20 8 11324 bf16 PURE False 2647905280
        1b 32768 8 1 4 5095 bf16 PURE True 1378865152
        1b 16384 8 1 8 9715 bf16 PURE False 1345310720
        1b 8192 8 2 8 13474 bf16 PURE False 1328533504
        1b 4096 8 4 8 16856 bf16 PURE False 1320144896
        1b 2048 128 10 1 18647 bf16 PURE False 1315950592
        1b 2048 64 10 1 19001 bf16 PURE False 1315950592
        1b 2048 32 10 1 15555 bf16 PURE False 1315950592
        1b 2048 16 8 1 19085 bf16 PURE False 1315950592
        1b 2048 8 8 8 19271 bf16 PURE False 1315950592
        1b 1024 8 16 8 20959 bf16 PURE False 1313853440
        1b 512 8 32 8 21782 bf16 PURE False 1312804864
        760m 32768 8 1 4 7183 bf16 PURE True 807656448
        760m 16384 8 1 4 13914 bf16 PURE False 782490624
        760m 8192 8 3 4 20106 bf16 PURE False 769907712
        760m 4096 8 6 4 25863 bf16 PURE False 763616256
        760m 2048 128 12 1 28940 bf16 PURE False 760470528
        760m 2048 64 12 1 29344 bf16 PURE False 760470528
        760m 2048 32 12 1 29648 bf16 PURE False 760470528
        760m 2048 16 12 1 29607 bf16 PURE False 760470528
        760m 2048 8 12 4 30173 bf16 PURE False 760470528
        760m 1024 8 24 4 33422 bf16 PURE False 758897664
        760m 512 8 48 4 34938 bf16 PURE False 758111232
        350m 32768 8 1 4 13416 bf16 PURE False 387442688
        350m 16384 8 2 4 22896 bf16 PURE False 370665472
        350m 8192 8 4 4 34933 bf16 PURE False 362276864
        350m 4096 8 8 4 46833 bf16 PURE False 358082560
        350m 2048 128 18 1 51934 bf16 PURE False 355985408
        350m 2048 64 18 1 52689 bf16 PURE False 355985408
        350m 2048 32 18 1 53811 bf16 PURE False 355985408
        350m 2048 16 18 1 55413 bf16 PURE False 355985408
        350m 2048 8 16 4 55995 bf16 PURE False 355985408
        350m 1024 8 32 4 62523 bf16 PURE False 354936832
        350m 512 8 64 4 66284 bf16 PURE False 354412544
        125m 32768 8 1 4 32651 bf16 PURE False 148904448
        125m 16384 8 2 3 55484 bf16 PURE False 136321536
        125m 8192 8 5 3 86858 bf16 PURE False 130030080
        125m 4096 8 13 3 115162 bf16 PURE False 126884352
        125m 2048 128 26 1 123936 bf16 PURE False 125311488
        125m 2048 64 26 1 125234 bf16 PURE False 125311488
        125m 2048 32 26 1 127122 bf16 PURE False 125311488
        125m 2048 16 26 1 130535 bf16 PURE False 125311488
        125m 2048 8 26 3 136334 bf16 PURE False 125311488
        125m 1024 8 52 3 148289 bf16 PURE False 124525056
        125m 512 8 104 3 156735 bf16 PURE False 124131840
    """,
}


def mpt_params(name, seq):
    """NumParams of the source: wte, wpe of seq positions, L blocks of 12 D^2 weights and 13 D
    biases and layernorm parameters, the final layernorm"""
    layers, _, d = MPT_SHAPES[name]
    return MPT_VOCAB * d + seq * d + layers * (12 * d * d + 13 * d) + 2 * d


def mpt_job(name, seq, profile, count, micro, ckpt):
    layers, heads, d = MPT_SHAPES[name]
    spec = "gpt2:layers=%d,heads=%d,dim=%d,seq=%d,vocab=%d" % (layers, heads, d, seq, MPT_VOCAB)
    return (["--model", spec, "--attention", "fused", "--profile",
             "%s:nodes=%d" % (profile, count // 8), "--mixed-precision", "bf16",
             "--local-batch", str(micro), "--backward-prefetch", "post"]
            + (ac("full") if ckpt else []))


def mpt_runs():
    runs = []
    for table, text in MPT_ROWS.items():
        _, gpus, gpu, profile, today = MPT_TABLES[table]
        for line in text.split("\n"):
            f = line.split()
            if not f:
                continue
            name, (seq, count, micro, accum, tps) = f[0], map(int, f[1:6])
            prec, mp, ckpt, params = f[6], f[7], f[8] == "True", int(f[9])
            if mpt_params(name, seq) != params:
                sys.exit("MPT-%s at %d tokens: %d parameters, the source says %d" % (
                    name, seq, mpt_params(name, seq), params))
            job = mpt_job(name, seq, profile, count, micro, ckpt) if profile else []
            today_job = mpt_job(name, seq, today, count, micro, ckpt) if today else []
            runs.append(Run("MPT", "MPT-" + name.upper(), "%d %s" % (count, gpus),
                            gpu, count, "%d x %d" % (micro, seq), "full" if ckpt else "none", tps,
                            job, modes=("fused",), table=table, accum=accum, seq=seq,
                            prec="%s, %s" % (prec, mp), name=name, today=today_job,
                            expressible="yes" if profile else "no: float8 (Transformer Engine)"))
    return runs


MPT_RUNS = mpt_runs()


def tp_job(model, tp, profile_sxm, profile_nvl, nodes, batch, ckpt):
    args = ["--api", "fsdp2", "--tp", str(tp), "--model", model] + MP + [
        "--local-batch", str(batch), "--seq", "8192"] + ac(ckpt)
    if profile_nvl is None:
        return args + ["--profile", "%s:nodes=%d" % (profile_sxm, nodes)]
    return peaks(args, profile_sxm, profile_nvl, nodes)


def r2d(src, model, gpus, count, mesh, batch, ckpt, prec, compile_, async_, published, mem,
        expressible, job=None, modes=("fused",)):
    return Run(src, model, gpus, "H100", count, batch, ckpt, published, job or [],
               api="fsdp2", modes=modes, mem=mem, mesh=mesh, prec=prec, compile=compile_,
               async_tp=async_, expressible=expressible)


TT405 = tp_job("llama3.1-405b", 8, "h100-gt", "h100-gt-nvl", 16, 2, "full")
TTA70 = tp_job("llama3-70b", 8, "h100-gt-2025", "h100-gt-2025-nvl", 32, 16, "full")
TTA8 = tp_job("llama3-8b", 8, "h100-gt-2025", "h100-gt-2025-nvl", 8, 12, "selective-op")
WL = tp_job("llama3-8b", 4, "h100-2024", None, 1, 4, "full")
GT = tp_job("llama3-8b", 2, "h100", None, 1, 1, "selective-op")
GT_FULL = tp_job("llama3-8b", 2, "h100", None, 1, 1, "full")
G95 = "128 H100 (95 GB, lower TDP)"
G96 = "256 H100 (96 GB, 500 W)"
G64 = "64 H100 (96 GB, 500 W)"
FP8, ATP = "no: float8", "no: async TP"
FA = "no: float8, async TP"
RUNS_2D = [
    r2d("TT405", "Llama 3.1 405B", G95, 128, "16 x 8", "2 x 8192", "full", "bf16", "not stated",
        "not stated", 109, "", "yes", TT405, modes=("eager", "fused")),
    r2d("TT405", "Llama 3.1 405B", "128 H100 (95 GB)", 128, "16 x 8", "2 x 8192", "full",
        "float8", "not stated", "no", 177, "", FP8),
    r2d("TT405", "Llama 3.1 405B", "128 H100 (95 GB)", 128, "16 x 8", "2 x 8192", "full",
        "float8", "not stated", "yes", 185, "", FA),
    r2d("TTB", "Llama 3.1 70B", G96, 256, "32 x 8", "16 x 8192", "full", "float8", "yes", "no",
        829, "71.9", FP8),
    r2d("TTB", "Llama 3.1 70B", G96, 256, "32 x 8", "16 x 8192", "full", "float8", "yes", "yes",
        876, "67.6", FA),
    r2d("TTB", "Llama 3.1 405B", "512 H100", 512, "8 x 8 x pp 8, 1F1B", "32 x 8192", "full",
        "float8", "yes", "yes", 100, "82.5", "no: PP"),
    r2d("TTB", "Llama 3.1 405B", "512 H100", 512, "8 x 8 x pp 8, interleaved 1F1B", "32 x 8192",
        "full", "float8", "yes", "yes", 128, "72.7", "no: PP"),
    r2d("TTB", "Llama 3.1 405B", "512 H100", 512, "8 x 8 x pp 8, cp 1", "8 x 32768", "full",
        "float8", "yes", "yes", 76, "75.3", "no: PP"),
    r2d("TTB", "Llama 3.1 405B", "512 H100", 512, "4 x 8 x pp 8, cp 2", "8 x 65536", "full",
        "float8", "yes", "yes", 47, "75.9", "no: PP, CP"),
    r2d("TTB", "Llama 3.1 405B", "512 H100", 512, "2 x 8 x pp 8, cp 4", "8 x 131072", "full",
        "float8", "yes", "yes", 31, "77.1", "no: PP, CP"),
    r2d("TTB", "Llama 3.1 405B", "512 H100", 512, "1 x 8 x pp 8, cp 8", "8 x 262144", "full",
        "float8", "yes", "yes", 16, "84.9", "no: PP, CP"),
    r2d("TTA", "Llama 3.1 70B", G96, 256, "32 x 8", "16 x 8192", "full", "bf16", "yes", "no",
        597.3, "", "yes", TTA70),
    r2d("TTA", "Llama 3.1 70B", G96, 256, "32 x 8", "16 x 8192", "full", "bf16", "yes", "yes",
        652.4, "", ATP),
    r2d("TTA", "Llama 3.1 70B", G96, 256, "32 x 8", "16 x 8192", "full", "float8 tensorwise",
        "yes", "no", 809.8, "", FP8),
    r2d("TTA", "Llama 3.1 70B", G96, 256, "32 x 8", "16 x 8192", "full", "float8 tensorwise",
        "yes", "yes", 942.4, "", FA),
    r2d("TTA", "Llama 3.1 70B", G96, 256, "32 x 8", "16 x 8192", "full", "float8 rowwise",
        "yes", "no", 599.6, "", FP8),
    r2d("TTA", "Llama 3.1 70B", G96, 256, "32 x 8", "16 x 8192", "full", "float8 rowwise",
        "yes", "yes", 624.8, "", FA),
    r2d("TTA", "Llama 3.1 8B", G64, 64, "8 x 8", "12 x 8192", "selective op", "bf16", "yes",
        "no", 4378, "", "yes", TTA8),
    r2d("TTA", "Llama 3.1 8B", G64, 64, "8 x 8", "12 x 8192", "selective op", "bf16", "yes",
        "yes", 4809.4, "", ATP),
    r2d("TTA", "Llama 3.1 8B", G64, 64, "8 x 8", "12 x 8192", "selective op",
        "float8 tensorwise", "yes", "no", 5078.1, "", FP8),
    r2d("TTA", "Llama 3.1 8B", G64, 64, "8 x 8", "12 x 8192", "selective op",
        "float8 tensorwise", "yes", "yes", 5570.1, "", FA),
    r2d("TTA", "Llama 3.1 8B", G64, 64, "8 x 8", "12 x 8192", "selective op", "float8 rowwise",
        "yes", "no", 3708.5, "", FP8),
    r2d("TTA", "Llama 3.1 8B", G64, 64, "8 x 8", "12 x 8192", "selective op", "float8 rowwise",
        "yes", "yes", 3914.9, "", FA),
    r2d("WL", "Llama 3 8B", "8 H100", 8, "2 x 4", "4 x 8192", "full", "bf16", "no (default)",
        "no", 3825, "", "yes", WL, modes=("eager",)),
    r2d("GT", "Llama 3.1 8B", "8 H100", 8, "4 x 2", "1 x 8192",
        "`default` policy: the config's selective op (assumed)", "bf16", "yes (graph_trainer)",
        "no", 6607, "30.92", "yes", GT),
    r2d("GT", "Llama 3.1 8B", "8 H100", 8, "4 x 2", "1 x 8192", "full (`full` policy)", "bf16",
        "yes (graph_trainer)", "no", 5933, "20.70", "yes", GT_FULL),
    r2d("GT", "Llama 3.1 8B", "8 H100", 8, "4 x 2", "1 x 8192",
        "selective op, main at `14f6a75`'s parent", "bf16", "yes (graph_trainer)", "no", 6538,
        "30.92", "yes", GT),
    r2d("GT", "Llama 3.1 8B", "8 H100", 8, "4 x 2", "1 x 8192",
        "selective op, RMSNorm fused (`14f6a75`)", "bf16", "yes (graph_trainer)", "no", 6600,
        "30.92", "yes", GT),
]

# The H200 measurement's kernel trace (llama_step.py --sdpa flash --kernels --ops), ms a step,
# as docs/fidelity.md reads it from traces/measured/h200-llama-4layer-flash-*.json
MEASURED_KERNELS = [
    ("GEMMs", ["gemm"], "59.0 (`aten::mm`)"),
    ("attention forward + backward, with its layout copies", ["attention_fwd", "attention_bwd"],
     "16.3 (FlashAttention-2 15.1, three [B, T, H, hd] copies a layer 1.2)"),
    ("AdamW, fills", ["adamw", "fill"], "9.1 (fused AdamW 9.0: 3.3 TB/s)"),
    ("casts of master weights and gradients", ["cast"], "4.8"),
    ("- RMSNorm, residual adds", ["rmsnorm_fwd", "rmsnorm_bwd", "add"], "16.1 (by difference)"),
    ("- rotary embeddings", ["rope_fwd", "rope_bwd"], "9.9"),
    ("- SwiGLU", ["swiglu_fwd", "swiglu_bwd"], "2.4"),
    ("- cross-entropy, embedding", ["cross_entropy", "embedding_fwd", "embedding_bwd"], "3.7"),
]
MEASURED_ELEMENTWISE = "32.1"
MEASURED_STEP = "122.2 (122.5 in the traced run)"


class Plan:
    def __init__(self, out):
        self.out = out
        m = re.search(r"^([0-9.]+) tokens/s per GPU", out, re.M)
        self.tps = float(m.group(1)) if m else None
        self.alloc = self.reserved = 0.0
        self.fits = None
        inmem = False
        for line in out.splitlines():
            if line.startswith("memory per rank"):
                inmem = True
                continue
            if line.startswith("peaks by phase"):
                inmem = False
            f = line.split()
            if inmem and f and f[0] in ("rank", "ranks"):
                self.alloc = max(self.alloc, float(f[2]))
                self.reserved = max(self.reserved, float(f[3]))
            if line.startswith("fits: "):
                self.fits = line.split()[1].rstrip(":")

        def num(pattern):
            m = re.search(pattern, out, re.M)
            return float(m.group(1)) if m else 0.0

        self.step = num(r"^step time ([0-9.]+) ms")
        self.compute = num(r"^step time [0-9.]+ ms, compute ([0-9.]+) ms")
        self.exposed = num(r"exposed communication ([0-9.]+) ms")
        self.sm_held = num(r"^GEMMs and attention beside collectives: ([0-9.]+) ms")
        self.hbm_held = num(r"^memory-bound kernels beside collectives: ([0-9.]+) ms")


class Planner:
    def __init__(self, plan, jobs, profdir):
        self.plan, self.jobs, self.profdir = plan, jobs, profdir
        self.cache = {}

    def resolve(self, args):
        out = []
        for a in args:
            if a.startswith("@"):
                name, _, shape = a[1:].partition(":")
                a = os.path.join(self.profdir, name + ".json") + (":" + shape if shape else "")
            out.append(a)
        return out

    def run(self, args, trace=None):
        cmd = [self.plan] + self.resolve(args) + (["--trace", trace] if trace else [])
        res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             check=False)
        return Plan(res.stdout)

    def want(self, args):
        self.cache.setdefault(tuple(args), None)

    def go(self):
        todo = [k for k, v in self.cache.items() if v is None]
        with concurrent.futures.ThreadPoolExecutor(self.jobs) as ex:
            for key, plan in zip(todo, ex.map(lambda k: self.run(list(k)), todo)):
                self.cache[key] = plan

    def get(self, args):
        return self.cache[tuple(args)]


def options(run, variant, api, mode):
    args = list(variant[1])
    if api == "fsdp2" and "--api" not in args:
        args = ["--api", "fsdp2"] + args
    return args + ["--ops", mode]


def plans(pl, run, api, mode):
    return [pl.get(options(run, v, api, mode)) for v in run.variants]


def err(got, published):
    return (got / published - 1.0) * 100.0


def fmt_err(e, digits=0):
    return "%+.*f%%" % (digits, e)


def joined(values):
    return " / ".join(values)


def tps_cells(ps, published, digits=0):
    tps = joined("%d" % p.tps if p.tps else "failed" for p in ps)
    if published is None or any(p.tps is None for p in ps):
        return tps, ""
    return tps, joined(fmt_err(err(p.tps, published), digits) for p in ps)


def mem_cell(ps, with_fits=False):
    cells = []
    for p in ps:
        c = "%.2f / %.2f" % (p.alloc, p.reserved)
        if with_fits and p.fits == "no":
            c += ", no"
        cells.append(c)
    return cells[0] if len(set(cells)) == 1 else joined(cells)


def row(cells):
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table_runs(pl):
    out = [row(["source", "model", "GPUs", "local batch x seq", "checkpointing",
                "published tokens/s/GPU", "flat roofline (`81a8da1`)", "error", "--ops fused",
                "error", "fsdp-plan (eager)", "error"]),
           "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in RUNS_1D:
        if r.published is None:
            continue
        flat = ("%d" % r.flat, fmt_err(err(r.flat, r.published))) if r.flat else ("", "")
        fused = tps_cells(plans(pl, r, "fsdp1", "fused"), r.published)
        eager = tps_cells(plans(pl, r, "fsdp1", "eager"), r.published)
        out.append(row([r.src, r.model, r.gpus, r.batch, r.ckpt, r.published, *flat, *fused,
                        *eager]))
    return out


def table_fsdp2(pl):
    out = [row(["source", "model", "GPUs", "local batch x seq", "checkpointing",
                "published tokens/s/GPU", "FSDP1 plan", "error", "FSDP2 plan", "error",
                "published memory, GiB", "FSDP1 memory", "FSDP2 memory"]),
           "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in TT_RUNS + TT2_RUNS:
        p1, p2 = plans(pl, r, "fsdp1", "eager"), plans(pl, r, "fsdp2", "eager")
        out.append(row([r.src, r.model, r.gpus, r.batch, r.ckpt,
                        r.published if r.published else r.ran,
                        *tps_cells(p1, r.published, 1), *tps_cells(p2, r.published, 1), r.mem,
                        mem_cell(p1, True), mem_cell(p2, True)]))
    return out


def table_2d(pl):
    out = [row(["source", "model", "GPUs", "dp x tp (x pp, cp)", "local batch x seq",
                "checkpointing", "precision", "compile", "async TP", "published tokens/s/GPU",
                "published memory, GiB", "expressible", "fsdp-plan", "error",
                "planned memory, GiB"]),
           "|---|---|---|---|---|---|---|---|---|---:|---:|---|---:|---:|---:|"]
    for r in RUNS_2D:
        x = r.extra
        tps = errs = mem = ""
        if x["expressible"] == "yes":
            t, e, m = [], [], []
            for mode in r.modes:
                ps = plans(pl, r, "fsdp2", mode)
                a, b = tps_cells(ps, r.published)
                tag = " (%s)" % mode if len(r.modes) > 1 else ""
                t.append(a + tag)
                e.append(b + tag)
                m.append(mem_cell(ps) + tag + ("" if ps[0].fits != "no" else ": does not fit"))
            tps, errs, mem = "; ".join(t), "; ".join(e), "; ".join(m)
        out.append(row([r.src, r.model, r.gpus, x["mesh"], r.batch, r.ckpt, x["prec"],
                        x["compile"], x["async_tp"], r.published, r.mem, x["expressible"], tps,
                        errs, mem]))
    return out


def table_memory(pl):
    out = [row(["source", "model", "GPUs", "local batch", "checkpointing", "eager", "fused",
                "fits (eager)", "published"]),
           "|---|---|---|---|---|---:|---:|---|---|"]
    for r in TT_RUNS + IBM_A_RUNS + IBM_H_RUNS + TT2_RUNS + M_RUNS[:1]:
        pe, pf = plans(pl, r, "fsdp1", "eager"), plans(pl, r, "fsdp1", "fused")
        fits = pe[0].fits or "?"
        if fits == "yes" and pe[0].reserved >= float(pl.capacity.get(r.gpus, 1e9)) - 0.01:
            fits = "yes, at the limit"
        pub = r.mem if r.mem not in (None, "not published") else "ran"
        if r.src == "TT2":
            pub = "ran: %s GiB" % r.mem
        out.append(row([r.src, r.model, r.gpus.replace(", 500 W", ""), r.batch.split(" x ")[0],
                        r.ckpt, mem_cell(pe), mem_cell(pf), fits, pub]))
    return out


def points(pl):
    """(run, error, as_ran, kind) for every plan with a published throughput: kind 1d, mpt (the
    1D runs of llm-foundry) or 2d; as_ran: the plan of the API and ops the run used (each bound
    of an unknown peak or compile counted)"""
    pts = []
    for r in RUNS_1D:
        if r.published is None:
            continue
        for api in ("fsdp1", "fsdp2") if r.api == "fsdp2" else ("fsdp1",):
            for p in plans(pl, r, api, "eager"):
                if p.tps:
                    pts.append((r, err(p.tps, r.published), api == r.api, "1d"))
    for r in RUNS_2D:
        if r.extra["expressible"] != "yes":
            continue
        for mode in r.modes:
            for p in plans(pl, r, "fsdp2", mode):
                if p.tps:
                    pts.append((r, err(p.tps, r.published), True, "2d"))
    for r in mpt_planned():
        p = mpt_plan(pl, r)
        if p.tps:
            pts.append((r, err(p.tps, r.published), True, "mpt"))
    return pts


def stat(errs):
    if not errs:
        return ""
    worst = max(errs, key=abs)
    return "%+.1f%% / %+.1f%% (%d)" % (statistics.median(errs), worst, len(errs))


def table_by(pl, key, keys, label, summary=False):
    pts = points(pl)
    out = [row([label, "1D, as they ran", "MPT (llm-foundry), as they ran", "2D (FSDP2 + TP)",
                "1D and 2D, as they ran", "every plan (1D as FSDP1 too)"]),
           "|---|---:|---:|---:|---:|---:|"]
    for k in keys + ["all"]:
        sel = [p for p in pts if k == "all" or key(p[0]) == k]
        if not sel:
            continue
        out.append(row([k if isinstance(k, str) else "%d GPUs" % k if k > 1 else "1 GPU",
                        stat([e for r, e, ran, kind in sel if ran and kind == "1d"]),
                        stat([e for r, e, ran, kind in sel if kind == "mpt"]),
                        stat([e for r, e, ran, kind in sel if kind == "2d"]),
                        stat([e for r, e, ran, kind in sel if ran]),
                        stat([e for r, e, ran, kind in sel])]))
    ran = [e for r, e, a, k in pts if a]
    if not summary:
        return out
    out.append("")
    out.append("As they ran: %d of %d plans within 10%%, %d slower than measured by more than "
               "5%%; every plan: %d of %d within 10%%; without MPT's, as they ran: %d of %d "
               "within 10%%." % (
                   sum(abs(e) <= 10 for e in ran), len(ran), sum(e < -5 for e in ran),
                   sum(abs(e) <= 10 for r, e, a, k in pts), len(pts),
                   sum(abs(e) <= 10 for r, e, a, k in pts if a and k != "mpt"),
                   sum(1 for r, e, a, k in pts if a and k != "mpt")))
    return out


def mpt_planned():
    return [r for r in MPT_RUNS if r.extra["expressible"] == "yes"]


def mpt_plan(pl, r, mode="fused", today=False):
    """the plan of the run on the stack it ran (the -2023 presets), or on today's presets"""
    return pl.get(mpt_options(r, mode, today))


def mpt_options(r, mode, today=False):
    return options(r, ("", r.extra["today"]) if today else r.variants[0], "fsdp1", mode)


def table_mpt(pl):
    out = [row(["table", "model", "tokens", "GPUs", "micro-batch x accumulation",
                "checkpointing", "precision, MP mode", "published tokens/s/GPU",
                "fsdp-plan (fused)", "error", "today's presets (fused)", "error",
                "exposed communication", "planned memory, GiB", "--ops eager (HF GPT-2's ops)",
                "error"]),
           "|---|---|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in MPT_RUNS:
        x = r.extra
        cells = [MPT_TABLES[x["table"]][0], r.model, x["seq"], r.count,
                 "%s x %d" % (r.batch.split(" x ")[0], x["accum"]), r.ckpt, x["prec"],
                 r.published]
        if x["expressible"] != "yes":
            out.append(row(cells + [x["expressible"], "", "", "", "", "", "", ""]))
            continue
        pf, pe = mpt_plan(pl, r), mpt_plan(pl, r, "eager")
        mem = "%.1f" % pf.reserved + (", does not fit" if pf.fits == "no" else "")
        out.append(row(cells + [*tps_cells([pf], r.published, 1),
                                *tps_cells([mpt_plan(pl, r, today=True)], r.published, 1),
                                "%.1f%%" % (100 * pf.exposed / pf.step), mem,
                                *tps_cells([pe], r.published, 1)]))
    return out


MPT_BANDS = [
    ("512-2048 tokens", lambda r: r.extra["seq"] <= 2048),
    ("4096-8192 tokens", lambda r: 4096 <= r.extra["seq"] <= 8192),
    ("16384-65536 tokens", lambda r: r.extra["seq"] >= 16384),
    ("MPT-125M to 760M", lambda r: r.extra["name"][-1] == "m"),
    ("MPT-1B, 3B", lambda r: r.extra["name"] in ("1b", "3b")),
    ("MPT-7B, 13B", lambda r: r.extra["name"] in ("7b", "13b")),
    ("MPT-30B, 70B", lambda r: r.extra["name"] in ("30b", "70b")),
    ("no checkpointing", lambda r: r.ckpt == "none"),
    ("full checkpointing", lambda r: r.ckpt == "full"),
    ("all", lambda r: True),
]


def table_mpt_by(pl):
    tables = [t for t in MPT_TABLES if MPT_TABLES[t][3]]
    out = [row(["rows"] + [MPT_TABLES[t][0] for t in tables] + ["all"]),
           "|---|" + "---:|" * (len(tables) + 1)]
    for label, sel in MPT_BANDS:
        cells = []
        for t in tables + [None]:
            cells.append(stat([err(mpt_plan(pl, r).tps, r.published) for r in mpt_planned()
                               if sel(r) and t in (None, r.extra["table"])]))
        out.append(row([label] + cells))
    return out


def table_mpt_stack(pl):
    """the median / worst error of each band on the stack the runs used and on today's presets"""
    tables = [t for t in MPT_TABLES if MPT_TABLES[t][3]]
    out = [row(["rows"] + ["%s, %s" % (MPT_TABLES[t][0] if t else "all", w)
                           for t in tables + [None] for w in ("2023 stack", "today's presets")]),
           "|---|" + "---:|" * (2 * len(tables) + 2)]
    for label, sel in MPT_BANDS:
        cells = []
        for t in tables + [None]:
            for today in (False, True):
                e = [err(mpt_plan(pl, r, today=today).tps, r.published) for r in mpt_planned()
                     if sel(r) and t in (None, r.extra["table"])]
                cells.append(stat(e).rsplit(" (", 1)[0])
        out.append(row([label] + cells))
    return out


def table_mpt_scale(pl):
    """the same model and sequence at several GPU counts, and the change of tokens/s per GPU
    from the fewest GPUs on more than one node (16) to the most"""
    out = [row(["table", "model", "tokens", "GPUs", "micro-batch x accumulation",
                "published tokens/s/GPU", "planned", "published, 16 GPUs or more: fewest to most",
                "planned, the same"]),
           "|---|---|---:|---|---|---|---|---:|---:|"]
    jobs = {}
    for r in mpt_planned():
        jobs.setdefault((r.extra["table"], r.model, r.extra["seq"]), []).append(r)
    for (table, model, seq), rs in jobs.items():
        if len({r.count for r in rs}) < 2:
            continue
        rs.sort(key=lambda r: r.count)
        tps = [mpt_plan(pl, r).tps for r in rs]
        multi = [(r, t) for r, t in zip(rs, tps) if r.count >= 16]
        change = ("", "")
        if len(multi) > 1:
            (a, ta), (b, tb) = multi[0], multi[-1]
            change = (fmt_err(err(b.published, a.published), 1), fmt_err(err(tb, ta), 1))
        out.append(row([MPT_TABLES[table][0], model, seq, joined(str(r.count) for r in rs),
                        joined("%s x %d" % (r.batch.split(" x ")[0], r.extra["accum"])
                               for r in rs),
                        joined(str(r.published) for r in rs), joined("%d" % t for t in tps),
                        *change]))
    return out


def as_ran_options(r):
    """(tag, options) of each plan of the run as it ran: each bound, each mode"""
    out = []
    for mode in r.modes:
        for v in r.variants:
            tag = ", ".join(t for t in (v[0], mode if len(r.modes) > 1 else "") if t)
            out.append((tag, options(r, v, r.api, mode)))
    return out


def published_runs():
    return [r for r in RUNS_1D if r.published] + [
        r for r in RUNS_2D if r.extra["expressible"] == "yes"]


def table_time(pl):
    out = [row(["source", "model", "GPUs", "checkpointing", "planned as", "step, ms",
                "compute, ms", "exposed communication", "GEMMs and attention on the SMs "
                "collectives leave", "the HBM bandwidth collectives take", "error"]),
           "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    seen = set()
    for r in published_runs():
        for tag, args in as_ran_options(r):
            p = pl.get(args)
            key = (tuple(args), r.published)
            if key in seen or not p.step:
                continue
            seen.add(key)
            how = r.api + (", tp %s" % r.extra["mesh"].split(" x ")[1] if "mesh" in r.extra
                           else "") + (" (%s)" % tag if tag else "")
            out.append(row([r.src, r.model, r.gpus, r.ckpt, how, "%.1f" % p.step,
                            "%.1f" % p.compute, "%.1f%%" % (100 * p.exposed / p.step),
                            "%.1f%%" % (100 * p.sm_held / p.step),
                            "%.1f%%" % (100 * p.hbm_held / p.step),
                            fmt_err(err(p.tps, r.published), 1)]))
    return out


def kernel_times(db):
    """ms by kernel name over the last step of rank 0's last run"""
    con = sqlite3.connect(db)
    run = con.execute("SELECT max(id) FROM runs").fetchone()[0]
    ends = [s for (s,) in con.execute(
        "SELECT seq_end FROM steps WHERE run = ? AND rank = 0 ORDER BY step", (run,))]
    step = con.execute("SELECT step_time FROM steps WHERE run = ? AND rank = 0 ORDER BY step "
                       "DESC LIMIT 1", (run,)).fetchone()[0]
    lo = ends[-2] if len(ends) > 1 else 0
    by = {}
    for name, t in con.execute(
            "SELECT name, sum(end_time - start_time) FROM events WHERE run = ? AND rank = 0 AND "
            "kind = 'kernel' AND seq >= ? AND seq < ? GROUP BY name", (run, lo, ends[-1])):
        by[name] = t * 1e3
    con.close()
    return by, step * 1e3


def table_kernels(pl):
    r = M_RUNS[0]
    with tempfile.TemporaryDirectory() as d:
        db = os.path.join(d, "m.db")
        pl.run(options(r, r.variants[0], "fsdp1", "eager"), trace=db)
        by, step = kernel_times(db)
    out = [row(["", "plan (eager)", "measured (kernel trace)"]), "|---|---:|---:|"]
    used = set()
    elementwise = []
    for label, names, measured in MEASURED_KERNELS:
        ms = sum(by.get(n, 0.0) for n in names)
        used.update(names)
        if label.startswith("- "):
            if not elementwise:
                elementwise.append(len(out))
                out.append(None)
            elementwise.append(ms)
        out.append(row([label, "%.1f" % ms, measured]))
    out[elementwise[0]] = row(["element-wise work of the model:", "%.1f" % sum(elementwise[1:]),
                               MEASURED_ELEMENTWISE])
    rest = sum(v for k, v in by.items() if k not in used)
    if rest >= 0.05:
        out.append(row(["other kernels (%s)" % ", ".join(sorted(k for k in by if k not in used)),
                        "%.1f" % rest, ""]))
    out.append(row(["step", "%.1f" % step, MEASURED_STEP]))
    return out


TABLES = {
    "runs": table_runs,
    "fsdp2": table_fsdp2,
    "2d": table_2d,
    "memory": table_memory,
    "by-gpu": lambda pl: table_by(pl, lambda r: r.gpu, ["A100", "H100", "H200"], "GPU"),
    "by-count": lambda pl: table_by(pl, lambda r: r.count,
                                    sorted({r.count for r in RUNS_1D + RUNS_2D + MPT_RUNS}),
                                    "GPUs",
                                    summary=True),
    "time": table_time,
    "kernels": table_kernels,
    "mpt": table_mpt,
    "mpt-by": table_mpt_by,
    "mpt-stack": table_mpt_stack,
    "mpt-scale": table_mpt_scale,
}
MARK = re.compile(r"^<!-- fidelity\.py: ([a-z0-9-]+) -->$")


def write(path, tables):
    lines = open(path, encoding="utf-8").read().split("\n")
    out, i, done = [], 0, set()
    while i < len(lines):
        out.append(lines[i])
        m = MARK.match(lines[i])
        i += 1
        if m and m.group(1) in tables:
            # the table under the marker, and a line of text right below it made by the table
            while i < len(lines) and lines[i].startswith("|"):
                i += 1
            if i + 1 < len(lines) and lines[i] == "" and lines[i + 1].startswith("As they ran:"):
                i += 2
            out.extend(tables[m.group(1)])
            done.add(m.group(1))
    open(path, "w", encoding="utf-8").write("\n".join(out))
    missing = set(tables) - done
    if missing:
        sys.exit("%s: no marker for %s" % (path, ", ".join(sorted(missing))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plan", default=os.path.join(HERE, "..", "fsdp-plan"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--write", metavar="FILE")
    ap.add_argument("--table", action="append", choices=sorted(TABLES))
    a = ap.parse_args()
    names = a.table or list(TABLES)
    with tempfile.TemporaryDirectory() as d:
        for name, text in PROFILES.items():
            with open(os.path.join(d, name + ".json"), "w", encoding="utf-8") as f:
                f.write(text + "\n")
        pl = Planner(a.plan, a.jobs, d)
        pl.capacity = {}
        for r in RUNS_1D:
            for v in r.variants:
                for mode in ("eager", "fused"):
                    pl.want(options(r, v, "fsdp1", mode))
                if r.api == "fsdp2":
                    pl.want(options(r, v, "fsdp2", "eager"))
        for r in RUNS_2D:
            if r.extra["expressible"] == "yes":
                for v in r.variants:
                    for mode in r.modes:
                        pl.want(options(r, v, "fsdp2", mode))
        for r in mpt_planned():
            for mode in ("fused", "eager"):
                pl.want(mpt_options(r, mode))
            pl.want(mpt_options(r, "fused", today=True))
        pl.go()
        for r in RUNS_1D:
            m = re.search(r"\(.*, ([0-9.]+) GiB each\)", pl.get(options(
                r, r.variants[0], "fsdp1", "eager")).out)
            if m:
                pl.capacity[r.gpus] = m.group(1)
        tables = {n: TABLES[n](pl) for n in names}
    if a.write:
        write(a.write, tables)
        return
    for n in names:
        print("<!-- fidelity.py: %s -->" % n)
        print("\n".join(tables[n]))
        print()


if __name__ == "__main__":
    main()
