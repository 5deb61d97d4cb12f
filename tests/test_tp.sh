#!/bin/sh
# --tp N from the command line: refused with fsdp1, with hybrid sharding, for a tp that divides
# neither the world nor a node, for models without a tensor-parallel layout, and for what tensor
# parallelism does not support; fsdp-train at --tp 2 prints the losses of --tp 1; its checkpoints
# resume at other layouts; fsdp-plan plans with --tp and its fully_shard sweep tries tp 1, 2, 4, 8
# (full and hybrid sharding, Llama and GPT, where tp divides the model).
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
refuse "a local tp 2 checkpoint at --tp 4" "loads only at the same tp" \
    $train $llama --steps 4 --api fsdp2 --tp 4 --resume "$tmp/local"

# full and sharded checkpoints saved at --tp 2 on 4 ranks (dp 2) resume at tp 1 on 2 ranks, at
# tp 4 on 4, under fsdp1 on 3 ranks and at tp 2 again, with the steps of the run without a stop:
# the same losses within 1e-6 (each layout sums in its own order; test_tp.c checks that the
# checkpoints themselves hold one process's bytes); the sharded one consolidates to the full
# one's model.safetensors, byte for byte
gpt="--model gpt2:heads=4 --batch 6 --seq 32"
$train $gpt --world 4 --api fsdp2 --tp 2 --steps 4 2>&1 | grep '^step [34] ' | awk '{print $4}' \
    >"$tmp/w.l"
for sd in full sharded; do
    $train $gpt --world 4 --api fsdp2 --tp 2 --steps 2 --save-checkpoint "$tmp/$sd" \
        --state-dict $sd >/dev/null 2>&1 || fail=1
    for at in "--world 2 --api fsdp2" "--world 4 --api fsdp2 --tp 4" "--world 3" \
        "--world 4 --api fsdp2 --tp 2"; do
        $train $gpt $at --steps 4 --resume "$tmp/$sd" 2>&1 | grep '^step [34] ' |
            awk '{print $4}' >"$tmp/r.l"
        if [ "$(grep -c . "$tmp/r.l")" -eq 2 ] && awk 'NR==FNR{a[FNR]=$1;next}
            {d=a[FNR]-$1; if(d<0)d=-d; if(d>1e-6)exit 1}' "$tmp/w.l" "$tmp/r.l"; then
            echo "ok: a $sd checkpoint of --tp 2 resumes at $at: $(tr '\n' ' ' <"$tmp/r.l")"
        else
            echo "FAILED: a $sd checkpoint of --tp 2 at $at"; cat "$tmp/w.l" "$tmp/r.l"; fail=1
        fi
    done
done
# under HSDP x tp the first replica writes the pieces: the checkpoint holds each element once
hs="--model gpt2:heads=4 --batch 8 --seq 32"
$train $hs --world 8 --api fsdp2 --tp 2 --strategy hybrid_shard --ranks-per-node 4 --steps 2 \
    --save-checkpoint "$tmp/hsdp" --state-dict sharded >/dev/null 2>&1 || fail=1
if $train $hs --world 2 --api fsdp2 --steps 3 --resume "$tmp/hsdp" >"$tmp/res" 2>&1 &&
    grep -q '^step 3 ' "$tmp/res"; then
    echo "ok: a sharded checkpoint of HSDP x tp 2 resumes on 2 ranks"
else
    echo "FAILED: a sharded checkpoint of HSDP x tp 2"; cat "$tmp/res"; fail=1
fi
if $train --consolidate "$tmp/sharded" --save "$tmp/cons.safetensors" >/dev/null 2>&1 &&
    cmp -s "$tmp/cons.safetensors" "$tmp/full/step-00000002/model.safetensors"; then
    echo "ok: the sharded checkpoint of --tp 2 consolidates to the full one's bytes"
else
    echo "FAILED: consolidating the sharded checkpoint of --tp 2"; fail=1
fi

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
    [ "$(grep -c '^full_shard tp[248] ' "$tmp/sweep")" -eq 3 ] &&
    [ "$(grep -c '^hybrid_shard tp[248] ' "$tmp/sweep")" -eq 3 ]; then
    echo "ok: the fully_shard sweep tries tp 2, 4 and 8, fully sharded and hybrid (HSDP x tp)"
else
    echo "FAILED: the sweep's tp rows"; cat "$tmp/sweep"; fail=1
fi
# a GPT whose vocabulary and heads tp divides: tp 2 and 4, not 8 (4 heads), and no row fails
if $plan --model gpt2:layers=2,heads=4,dim=256,seq=256,vocab=50304 --api fsdp2 --world 16 \
    --sweep --mixed-precision bf16 --reshard-after-forward true --backward-prefetch explicit \
    >"$tmp/gsweep" 2>&1 && [ "$(grep -c '^full_shard tp[24] ' "$tmp/gsweep")" -eq 4 ] &&
    [ "$(grep -c '^hybrid_shard tp[24] ' "$tmp/gsweep")" -eq 4 ] &&
    ! grep -q 'tp8\|failed\|error' "$tmp/gsweep"; then
    echo "ok: the fully_shard sweep of a GPT tries the tp that divide its heads and vocabulary"
else
    echo "FAILED: the sweep's tp rows of a GPT"; cat "$tmp/gsweep"; fail=1
fi
if $plan --model gpt2 --api fsdp2 --world 16 --sweep --mixed-precision bf16 \
    --reshard-after-forward true --backward-prefetch explicit >"$tmp/g50257" 2>&1 &&
    ! grep -q ' tp[0-9]' "$tmp/g50257"; then
    echo "ok: GPT-2's vocabulary of 50257 sweeps no tp"
else
    echo "FAILED: the sweep of GPT-2 with a vocabulary no tp divides"; cat "$tmp/g50257"; fail=1
fi
exit $fail
