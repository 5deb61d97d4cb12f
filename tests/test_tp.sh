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
refuse "--tp 3 on 4 ranks" "does not divide" $train $llama --api fsdp2 --tp 3
refuse "--tp 0" "not a number of ranks" $train $llama --api fsdp2 --tp 0
refuse "--tp-loss-parallel without --tp" "give --tp N > 1" $train $llama --api fsdp2 --tp-loss-parallel
refuse "--tp for an mlp" "gpt and llama models only" $train --model mlp:16,32,4 --world 2 --api fsdp2 --tp 2
refuse "--tp 2 over one gpt2 head" "must divide heads" \
    $train --model gpt2:heads=1 --world 2 --api fsdp2 --tp 2
refuse "--tp with a sharded --save-checkpoint" "needs --state-dict local" \
    $train $llama --api fsdp2 --tp 2 --save-checkpoint "$tmp/ckpt"
refuse "--tp larger than a node" "must divide the 2 GPUs per node" \
    $plan --model llama3-8b --api fsdp2 --tp 4 --profile h100:nodes=2,gpus_per_node=2
refuse "--tp for an mlp plan" "gpt and llama models only" $plan --model mlp:64,64 --api fsdp2 --tp 2

# the same losses (printed to 4 decimals) at tp 1, 2 and 4, and with the vocabulary-parallel loss
$train $llama --api fsdp2 2>&1 | grep '^loss ' | sed 's/;.*//' >"$tmp/want"
for tp in 2 4 "4 --tp-loss-parallel" "2 --strategy hybrid_shard --ranks-per-node 2"; do
    $train $llama --api fsdp2 --tp $tp 2>&1 | grep '^loss ' | sed 's/;.*//' >"$tmp/got"
    if [ -s "$tmp/want" ] && cmp -s "$tmp/want" "$tmp/got"; then
        echo "ok: --tp $tp trains to the losses of --tp 1: $(cat "$tmp/got")"
    else
        echo "FAILED: --tp $tp: losses differ from --tp 1"; cat "$tmp/want" "$tmp/got"; fail=1
    fi
done

# the batch is split over the dp ranks, not the world: 2 rows on 4 ranks at tp 2 are the 2 rows of
# 2 ranks at tp 1
small="--model llama:kv_heads=4 --batch 2 --seq 32 --steps 3 --api fsdp2"
$train $small --world 2 2>&1 | grep '^loss ' | sed 's/;.*//' >"$tmp/want"
$train $small --world 4 --tp 2 2>&1 | grep '^loss ' | sed 's/;.*//' >"$tmp/got"
if [ -s "$tmp/want" ] && cmp -s "$tmp/want" "$tmp/got"; then
    echo "ok: a batch of 2 on 4 ranks at --tp 2 trains as on 2 ranks: $(cat "$tmp/got")"
else
    echo "FAILED: a batch of 2 on 4 ranks at --tp 2"; cat "$tmp/want" "$tmp/got"; fail=1
fi
refuse "--batch 3 over 2 dp ranks" "not divisible by the 2 dp ranks (--world 4 / --tp 2)" \
    $train $small --world 4 --tp 2 --batch 3

# the run's header names the mesh under --tp, and only there
header() { # the pattern the header holds, fsdp-train arguments...
    want=$1
    shift
    if $train $llama --steps 1 "$@" 2>&1 | head -n 1 | grep -q "$want"; then
        echo "ok: the header of $*: $want"
    else
        echo "FAILED: the header of $* lacks $want"; fail=1
    fi
}
header "global batch 4 x 32 on 4 ranks, full_shard$" --api fsdp2
header "global batch 4 x 32 on 4 ranks (dp 2 x tp 2), full_shard$" --api fsdp2 --tp 2
header "on 4 ranks (replicate 2 x shard 1 x tp 2), hybrid_shard$" --api fsdp2 --tp 2 \
    --strategy hybrid_shard --ranks-per-node 2

# a local checkpoint at --tp 2 resumes to the steps of a run without one, and only at --tp 2
$train $llama --steps 4 --api fsdp2 --tp 2 2>&1 | grep '^step [34]' | sed 's/ tok.*//' >"$tmp/want"
$train $llama --steps 2 --api fsdp2 --tp 2 --save-checkpoint "$tmp/local" --state-dict local \
    >/dev/null 2>&1 || fail=1
$train $llama --steps 4 --api fsdp2 --tp 2 --resume "$tmp/local" 2>&1 | grep '^step [34]' |
    sed 's/ tok.*//' >"$tmp/got"
if [ -s "$tmp/want" ] && cmp -s "$tmp/want" "$tmp/got"; then
    echo "ok: a local checkpoint at --tp 2 resumes to the same steps: $(tr '\n' ' ' <"$tmp/got")"
else
    echo "FAILED: resuming at --tp 2"; cat "$tmp/want" "$tmp/got"; fail=1
fi
refuse "a tp 2 checkpoint at --tp 4" "loads only at the same tp" \
    $train $llama --steps 4 --api fsdp2 --tp 4 --resume "$tmp/local"

# fsdp-plan --tp 2, and the sweep's tp rows
if $plan --model llama3-8b --api fsdp2 --world 16 --local-batch 1 --seq 2048 --tp 2 \
    --mixed-precision bf16 >"$tmp/plan" 2>&1 && grep -q "per dp rank of 8 (tp 2" "$tmp/plan" &&
    grep -q "^cluster h100: 16 ranks (dp 8 x tp 2), 8 per node " "$tmp/plan"; then
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
