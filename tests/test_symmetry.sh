#!/bin/sh
# fsdp-plan's symmetric ranks: the printed figures are those of the run of every rank, across
# strategies, with uneven padding, at 8, 64 and 512 ranks; classes split where shards differ.
set -u
plan="${top_builddir:-..}/tools/fsdp-plan"
[ -x "$plan" ] || plan=../tools/fsdp-plan
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

# every line but the one that says how many ranks ran
same() { # description, fsdp-plan arguments...
    desc=$1
    shift
    "$plan" "$@" >"$tmp/sym" 2>&1
    "$plan" "$@" --no-symmetry >"$tmp/all" 2>&1
    n=$(sed -n 's/^ranks simulated: \([0-9]*\) .*/\1/p' "$tmp/sym")
    if grep -v '^ranks simulated' "$tmp/sym" >"$tmp/a" && grep -v '^ranks simulated' "$tmp/all" >"$tmp/b" &&
        cmp -s "$tmp/a" "$tmp/b" && grep -q '^step time\|^fastest' "$tmp/a" && grep -q '^ranks simulated: all' "$tmp/all"; then
        echo "ok: $desc: the same figures (${n:-all} ranks simulated)"
    else
        echo "FAILED: $desc"; diff "$tmp/sym" "$tmp/all"; fail=1
    fi
}

# 1000 x 3001 + 3001 and 3001 x 7 + 7: no world here divides a unit evenly
mlp=mlp:1000,3001,7
for s in full_shard shard_grad_op no_shard hybrid_shard hybrid_shard_zero2; do
    for w in 8 64 512; do
        same "$s on $w ranks" --model $mlp --world $w --gpus-per-node 8 --strategy $s
    done
done
same "gpt2-tiny full_shard bf16 with checkpointing, 64 ranks" --model gpt2-tiny --world 64 \
    --mixed-precision bf16 --checkpoint-activations
same "hybrid_shard on 4 nodes of 4" --model $mlp --world 16 --gpus-per-node 4 \
    --strategy hybrid_shard --backward-prefetch post
same "a sweep on 16 ranks" --model $mlp --world 16 --sweep

# A unit of 10 elements on 8 ranks: ranks 0-4 hold 2, rank 5 and up none; naive symmetry (one
# class, or the last rank apart) would price ranks 5-6 as rank 0. The classes split there.
"$plan" --model mlp:1,5 --world 8 >"$tmp/out" 2>&1
if grep -q '^ranks simulated: [3-8] of 8' "$tmp/out"; then
    echo "ok: classes split where the shards differ: $(grep '^ranks simulated' "$tmp/out")"
else
    echo "FAILED: classes not split"; cat "$tmp/out"; fail=1
fi
same "the split classes" --model mlp:1,5 --world 8

# A trace of a symmetric plan: the simulated ranks, each with the ranks it stands for, their
# counts summing to the world; the plan prints what it prints without a trace.
trace="${top_builddir:-..}/tools/fsdp-trace"
[ -x "$trace" ] || trace=../tools/fsdp-trace
args="--model $mlp --world 16 --gpus-per-node 4 --strategy hybrid_shard"
"$plan" $args >"$tmp/plain" 2>&1
"$plan" $args --trace "$tmp/t.db" >"$tmp/traced" 2>&1
"$trace" summary "$tmp/t.db" >"$tmp/summary" 2>&1
n=$(sed -n 's/^ranks simulated: \([0-9]*\) of 16.*/\1/p' "$tmp/traced")
if [ -n "$n" ] && cmp -s "$tmp/plain" "$tmp/traced" &&
    grep -q "^simulated ranks: $n, standing for 16 " "$tmp/summary" &&
    grep -q '^  rank 0 (stands for [0-9]* ranks: 0-' "$tmp/summary"; then
    echo "ok: a symmetric plan's trace holds its $n simulated ranks, standing for 16"
else
    echo "FAILED: a symmetric plan's trace"; cat "$tmp/traced" "$tmp/summary"; fail=1
fi

exit $fail
