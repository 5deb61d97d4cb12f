#!/bin/sh
# fsdp-plan against the published FSDP runs of docs/fidelity.md: each row's command, the
# published tokens/s per GPU, the plan's, the error ("+" is too fast), the plan's peak allocated
# and reserved memory per GPU (GiB) and whether it fits. torchtitan's runs (TT, TT2) used FSDP2:
# after every row under FullyShardedDataParallel (fsdp-plan's default) they are planned again
# with --api fsdp2 (fully_shard with its default reshard_after_forward), beside the FSDP1 rows.
#
#     tools/reference/fidelity.sh [path/to/fsdp-plan] [extra fsdp-plan options...]
#
# Extra options (say `--ops fused`) go to every row. The profiles of the IBM clusters are the
# presets with the network their post states (docs/fidelity.md, "The runs").
set -eu

plan=${1:-$(dirname "$0")/../fsdp-plan}
[ $# -gt 0 ] && shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
printf '{"base": "a100", "nccl": {"nics_per_node": 1, "nic_bytes_per_s": 47e9}}\n' >"$dir/a100-400g.json"
printf '{"base": "h100-2024", "nccl": {"nics_per_node": 1, "nic_bytes_per_s": 94e9}}\n' >"$dir/h100-800g.json"
# torchtitan's Grand Teton H100s: 96 GB of HBM2e at 2.4 TB/s, a 500 W limit that puts the peak
# between the SXM's and the NVL's (835 TFLOP/s bf16): both bounds are planned
gt='"model": "NVIDIA H100 96GB HBM2e", "hbm_bytes_per_s": 2.4e12, "memory_bytes": 103079215104'
printf '{"base": "h100-2024", "gpu": {%s}}\n' "$gt" >"$dir/h100-gt.json"
printf '{"base": "h100-2024", "gpu": {%s, "matmul_flops_per_s": {"f32": 60e12, "tf32": 417.5e12, "bf16": 835e12, "f16": 835e12}}}\n' \
    "$gt" >"$dir/h100-gt-nvl.json"

tt="--profile a100:nodes=8 --mixed-precision param=bf16,reduce=fp32"
tt2="--model llama3-8b --mixed-precision param=bf16,reduce=fp32 --local-batch 2 --seq 8192 --activation-checkpointing selective-op"
ibm_a="--profile $dir/a100-400g.json:nodes=16 --mixed-precision bf16 --local-batch 2"
ibm_h="--profile $dir/h100-800g.json:nodes=12 --mixed-precision bf16 --local-batch 2"
cl34="llama:layers=48,heads=64,kv_heads=8,dim=8192,ffn=22016,seq=4096,vocab=32000"
m4="llama:layers=4,heads=32,kv_heads=32,dim=4096,ffn=11008,seq=4096,vocab=32000,rope_theta=10000,eps=1e-5"

row() { # label, published tokens/s per GPU ("-": none, the run did not fit), fsdp-plan options
    label=$1
    published=$2
    shift 2
    out=$("$plan" "$@" 2>&1) || true
    got=$(printf '%s\n' "$out" | sed -n 's/^\([0-9.]*\) tokens\/s per GPU.*/\1/p')
    if [ -z "$got" ]; then
        printf '%-44s %8s %8s  fsdp-plan failed: %s\n' "$label" "$published" "-" "$*"
        return
    fi
    # the peaks of every class of ranks in the memory table, and the fits line
    mem=$(printf '%s\n' "$out" | awk '/^memory per rank/ { m = 1; next } /^peaks by phase/ { m = 0 }
        m && $1 ~ /^ranks?$/ { if ($3 > a) a = $3; if ($4 > r) r = $4 }
        /^fits: / { f = $2; sub(/:$/, "", f) } END { printf "%.2f %.2f %s", a, r, f }')
    # shellcheck disable=SC2086
    set -- $mem
    awk -v l="$label" -v p="$published" -v g="$got" -v a="$1" -v r="$2" -v f="$3" 'BEGIN {
        e = p == "-" ? "" : sprintf("%+6.1f%%", (g / p - 1) * 100)
        printf "%-44s %8s %8d %7s %7.2f %7.2f  %s\n", l, p, g, e, a, r, f }'
}

# torchtitan's runs: the rows of its performance docs, and the 70B job its footnote says ran out
# of memory at local batch 2 with selective op checkpointing
# shellcheck disable=SC2086
tt_rows() {
    row "TT Llama 3 8B, 64 A100, selective layer" 2904 --model llama3-8b $tt --local-batch 1 --activation-checkpointing selective-layer "$@"
    row "TT Llama 3 8B, 64 A100, selective op" 2973 --model llama3-8b $tt --local-batch 1 --activation-checkpointing selective-op "$@"
    row "TT Llama 3 70B, 64 A100, full" 331 --model llama3-70b $tt --local-batch 1 --activation-checkpointing full "$@"
    row "TT Llama 2 13B, 64 A100, none" 2162 --model llama2-13b $tt --local-batch 2 "$@"
    row "TT Llama 2 13B, 64 A100, selective layer" 1914 --model llama2-13b $tt --local-batch 2 --activation-checkpointing selective-layer "$@"
    row "TT Llama 2 13B, 64 A100, selective op" 1904 --model llama2-13b $tt --local-batch 2 --activation-checkpointing selective-op "$@"
    row "TT Llama 2 70B, 64 A100, b1 selective op" 355 --model llama2-70b $tt --local-batch 1 --activation-checkpointing selective-op "$@"
    row "TT Llama 2 70B, 64 A100, b2 full" 353 --model llama2-70b $tt --local-batch 2 --activation-checkpointing full "$@"
    row "TT Llama 2 70B, 64 A100, b2 selective op" - --model llama2-70b $tt --local-batch 2 --activation-checkpointing selective-op "$@"
}
# shellcheck disable=SC2086
tt2_rows() {
    row "TT2 Llama 3.1 8B, 8 H100 (SXM peak)" 5762 $tt2 --profile "$dir/h100-gt.json:nodes=1" "$@"
    row "TT2 Llama 3.1 8B, 8 H100 (NVL peak)" 5762 $tt2 --profile "$dir/h100-gt-nvl.json:nodes=1" "$@"
    row "TT2 Llama 3.1 8B, 128 H100 (SXM peak)" 5605 $tt2 --profile "$dir/h100-gt.json:nodes=16" "$@"
    row "TT2 Llama 3.1 8B, 128 H100 (NVL peak)" 5605 $tt2 --profile "$dir/h100-gt-nvl.json:nodes=16" "$@"
}

printf '%-44s %8s %8s %7s %7s %7s  %s\n' "run" "published" "plan" "error" "alloc" "reserved" "fits"
# shellcheck disable=SC2086
{
tt_rows "$@"
row "IBM Llama 2 7B HSDP, 128 A100, none" 3700 --model llama2-7b $ibm_a --strategy hybrid_shard "$@"
row "IBM Llama 2 13B, 128 A100, every 2nd layer" 1800 --model llama2-13b $ibm_a --activation-checkpointing selective-layer:2 "$@"
row "IBM 34B, 128 A100, full" 700 --model $cl34 $ibm_a --activation-checkpointing full "$@"
row "IBM Llama 2 70B, 128 A100, full" 370 --model llama2-70b $ibm_a --activation-checkpointing full "$@"
tt2_rows "$@"
row "IBM Llama 2 7B HSDP, 96 H100, none" 7500 --model llama2-7b $ibm_h --strategy hybrid_shard "$@"
row "IBM Llama 2 13B, 96 H100, every 2nd layer" 3800 --model llama2-13b $ibm_h --activation-checkpointing selective-layer:2 "$@"
row "IBM 34B, 96 H100, full" 1550 --model $cl34 $ibm_h --activation-checkpointing full "$@"
row "IBM Llama 2 70B, 96 H100, full" 800 --model llama2-70b $ibm_h --activation-checkpointing full "$@"
row "M Llama 2 7B shape, 4 layers, 1 H200" 67032 --model $m4 --profile h200 --world 1 --local-batch 2 --mixed-precision param=bf16,reduce=fp32 "$@"
row "M Llama 2 7B shape, 4 layers, 1 H100" 62350 --model $m4 --profile h100 --world 1 --local-batch 2 --mixed-precision param=bf16,reduce=fp32 "$@"
row "M Llama 2 7B shape, 4 layers, 1 H200, full AC" 55933 --model $m4 --profile h200 --world 1 --local-batch 2 --mixed-precision param=bf16,reduce=fp32 --activation-checkpointing full "$@"
row "M GPT-2 124M, 1 H200, eager attention" 132967 --model gpt2 --profile h200 --world 1 --local-batch 8 --mixed-precision param=bf16,reduce=fp32 "$@"
row "M GPT-2 124M, 1 H200, eager, full AC" 95695 --model gpt2 --profile h200 --world 1 --local-batch 8 --mixed-precision param=bf16,reduce=fp32 --activation-checkpointing full "$@"
row "M GPT-2 124M, 1 H200, SDPA" 171450 --model gpt2 --profile h200 --world 1 --local-batch 8 --mixed-precision param=bf16,reduce=fp32 --attention fused "$@"
}
echo "torchtitan's runs under fully_shard (--api fsdp2), as they ran:"
tt_rows --api fsdp2 "$@"
tt2_rows --api fsdp2 "$@"
