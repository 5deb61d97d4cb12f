#!/bin/sh
# --tp N from the command line: refused with fsdp1, with hybrid sharding, for a tp that divides
# neither the world nor a node, for models without a tensor-parallel layout, and for what tensor
# parallelism does not support; fsdp-train at --tp 2 prints the losses of --tp 1; fsdp-plan plans
# with --tp and its fully_shard sweep tries tp 1, 2, 4, 8.
set -u
bin="${top_builddir:-..}/tools"
[ -x "$bin/fsdp-train" ] || bin=../tools
train="$bin/fsdp-train"
plan="$bin/fsdp-plan"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

# one error line naming the problem, and a non-zero exit
refuse() { # description, pattern the line holds, tool, arguments...
    desc=$1
    want=$2
    shift 2
    "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$(grep -c . "$tmp/err")" -eq 1 ] && grep -q "error: .*$want" "$tmp/err"; then
        echo "ok: refuses $desc: $(cat "$tmp/err")"
    else
        echo "FAILED: $desc (exit $rc, stderr:)"; cat "$tmp/err"; fail=1
    fi
}

llama="--model llama:kv_heads=4 --world 4 --batch 4 --seq 32 --steps 3"
refuse "--tp with fsdp1" "needs --api fsdp2" $train $llama --tp 2
refuse "--tp with hybrid_shard" "HSDP x tp" $train $llama --api fsdp2 --tp 2 --strategy hybrid_shard
refuse "--tp 3 on 4 ranks" "does not divide" $train $llama --api fsdp2 --tp 3
refuse "--tp 0" "not a number of ranks" $train $llama --api fsdp2 --tp 0
refuse "--tp for gpt" "llama models only" $train --model gpt2-tiny --world 2 --api fsdp2 --tp 2
refuse "--tp with --clip-grad-norm" "not supported under tensor parallelism" \
    $train $llama --api fsdp2 --tp 2 --clip-grad-norm 1
refuse "--tp larger than a node" "must divide the 2 GPUs per node" \
    $plan --model llama3-8b --api fsdp2 --tp 4 --profile h100:nodes=2,gpus_per_node=2
refuse "--tp for an mlp plan" "llama models only" $plan --model mlp:64,64 --api fsdp2 --tp 2

# the same losses (printed to 4 decimals) at tp 1, 2 and 4
for tp in 1 2 4; do
    $train $llama --api fsdp2 --tp $tp 2>&1 | grep '^loss ' | sed 's/;.*//' >"$tmp/loss$tp" || fail=1
done
if cmp -s "$tmp/loss1" "$tmp/loss2" && cmp -s "$tmp/loss1" "$tmp/loss4"; then
    echo "ok: --tp 1, 2, 4 train to the same losses: $(cat "$tmp/loss2")"
else
    echo "FAILED: losses differ across tp"; cat "$tmp/loss1" "$tmp/loss2" "$tmp/loss4"; fail=1
fi

# fsdp-plan --tp 2, and the sweep's tp rows
if $plan --model llama3-8b --api fsdp2 --world 16 --local-batch 1 --seq 2048 --tp 2 \
    --mixed-precision bf16 >"$tmp/plan" 2>&1 && grep -q "per dp rank of 8 (tp 2" "$tmp/plan"; then
    echo "ok: fsdp-plan --tp 2 plans 8 dp ranks of tp 2"
else
    echo "FAILED: fsdp-plan --tp 2"; cat "$tmp/plan"; fail=1
fi
if $plan --model llama3-8b --api fsdp2 --world 16 --local-batch 1 --seq 2048 --sweep \
    --mixed-precision bf16 --activation-checkpointing none --reshard-after-forward true \
    --backward-prefetch explicit >"$tmp/sweep" 2>&1 &&
    [ "$(grep -c '^full_shard tp[248] ' "$tmp/sweep")" -eq 3 ]; then
    echo "ok: the fully_shard sweep tries tp 2, 4 and 8"
else
    echo "FAILED: the sweep's tp rows"; cat "$tmp/sweep"; fail=1
fi
exit $fail
