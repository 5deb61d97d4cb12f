#!/bin/sh
# fsdp-plan's symmetric ranks: the printed figures are those of the run of every rank, across
# strategies, with uneven padding, at 8, 64 and 512 ranks; classes split where shards differ;
# the same under --api fsdp2 (fully_shard's per-parameter rows) and under --tp (its dp x tp and
# replicate x shard x tp meshes), where the trace's rows of the simulated ranks are also those of
# the plan of every rank.
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

# fully_shard (--api fsdp2): every rank keeps padded slots of S = ceil(d0 / W) rows of each
# parameter, and ranks differ in the rows they own (S, the rest, none); the classes follow them.
# The same figures, and fewer ranks simulated than the world.
fewer() { # description, world: the last same() simulated fewer ranks than world
    if [ -n "$n" ] && [ "$n" -lt "$2" ]; then
        echo "ok: $1: $n of $2 ranks simulated"
    else
        echo "FAILED: $1: not fewer ranks simulated than $2 (${n:-all})"; fail=1
    fi
}
for w in 8 64 512; do
    same "fsdp2 full_shard on $w ranks" --model $mlp --world $w --gpus-per-node 8 --api fsdp2
    fewer "fsdp2 full_shard on $w ranks" $w
done
same "fsdp2 hybrid_shard on 4 nodes of 4" --model $mlp --world 16 --gpus-per-node 4 \
    --strategy hybrid_shard --api fsdp2
fewer "fsdp2 hybrid_shard on 4 nodes of 4" 16
same "fsdp2 hybrid_shard on 8 nodes of 8" --model $mlp --world 64 --gpus-per-node 8 \
    --strategy hybrid_shard --api fsdp2
same "fsdp2 gpt2-tiny bf16 with checkpointing, 24 ranks" --model gpt2-tiny --world 24 \
    --mixed-precision bf16 --checkpoint-activations --api fsdp2
same "fsdp2 llama-tiny, reshard after forward false, 24 ranks" --model llama-tiny --world 24 \
    --api fsdp2 --reshard-after-forward false
fewer "fsdp2 llama-tiny, reshard after forward false, 24 ranks" 24
same "fsdp2 a sweep on 16 ranks" --model $mlp --world 16 --api fsdp2 --sweep
# mlp:1,5 on 8 ranks: S = 1 row, ranks 0-4 own one of each parameter, ranks 5-7 none
"$plan" --model mlp:1,5 --world 8 --api fsdp2 >"$tmp/out" 2>&1
if grep -q '^ranks simulated: 2 of 8' "$tmp/out"; then
    echo "ok: fsdp2 classes split where the rows owned differ: $(grep '^ranks simulated' "$tmp/out")"
else
    echo "FAILED: fsdp2 classes not split at the rows owned"; cat "$tmp/out"; fail=1
fi
same "fsdp2 the split classes" --model mlp:1,5 --world 8 --api fsdp2

# Tensor parallelism (--tp: a dp x tp mesh, under hybrid_shard replicate x shard x tp): the
# classes are products of the dp group's ranks of one tp index (alike rows owned), of runs of tp
# indices and, under hybrid sharding, of runs of nodes (the last of each apart). The same figures
# at tp 2, 4 and 8, with fewer ranks simulated than the world, on dp groups whose rows pad (24
# ranks), and with the vocabulary-parallel loss.
tpl=llama:layers=2,heads=8,kv_heads=8,dim=64,ffn=128,vocab=256,seq=64
tpg=gpt2:layers=2,heads=8,dim=64,vocab=256,seq=64
for tp in 2 4 8; do
    same "llama tp $tp on 32 ranks" --model $tpl --world 32 --gpus-per-node 8 --api fsdp2 --tp $tp
    fewer "llama tp $tp on 32 ranks" 32
    same "llama tp $tp hybrid_shard on 4 nodes of 8" --model $tpl --world 32 --gpus-per-node 8 \
        --api fsdp2 --tp $tp --strategy hybrid_shard
    fewer "llama tp $tp hybrid_shard on 4 nodes of 8" 32
    same "gpt2 tp $tp bf16 with checkpointing, 16 ranks" --model $tpg --world 16 \
        --gpus-per-node 8 --api fsdp2 --tp $tp --mixed-precision bf16 --checkpoint-activations
    fewer "gpt2 tp $tp bf16 with checkpointing, 16 ranks" 16
done
same "llama tp 2 on 24 ranks, rows that pad" --model $tpl --world 24 --gpus-per-node 8 --api fsdp2 \
    --tp 2 --tp-loss-parallel
fewer "llama tp 2 on 24 ranks, rows that pad" 24
same "llama tp 4 hybrid_shard, reshard after forward false, on 3 nodes of 8" --model $tpl --world 24 --gpus-per-node 8 \
    --api fsdp2 --tp 4 --strategy hybrid_shard --reshard-after-forward false

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

# fsdp-trace diff of a symmetric and a --no-symmetry trace of one plan: no structural
# difference, each way, and every timing and memory ratio 1 (the simulated ranks' events
# counted for the ranks they stand for); calibrate refuses the symmetric trace by name.
ratios_one() { # diff output: every B/A column is 1.000 or -
    awk '/^$/ {table = 0} table && (($NF != "1.000" && $NF != "-") ||
        ($(NF - 3) != "1.000" && $(NF - 3) != "-")) {bad = 1; print "  ratio not 1: " $0}
        $NF == "B/A" {table = 1} END {exit bad}' "$1"
}
diff_same() { # description, fsdp-plan arguments...
    desc=$1
    shift
    rm -f "$tmp/ds.db" "$tmp/da.db"
    "$plan" "$@" --trace "$tmp/ds.db" >/dev/null 2>&1
    "$plan" "$@" --no-symmetry --trace "$tmp/da.db" >/dev/null 2>&1
    "$trace" diff "$tmp/ds.db" "$tmp/da.db" >"$tmp/d1" 2>&1
    rc1=$?
    "$trace" diff "$tmp/da.db" "$tmp/ds.db" >"$tmp/d2" 2>&1
    rc2=$?
    if [ $rc1 = 0 ] && [ $rc2 = 0 ] && grep -q '^structure: identical' "$tmp/d1" &&
        grep -q '^A: [0-9]* ranks traced, standing for' "$tmp/d1" &&
        grep -q '^B: [0-9]* ranks traced, standing for' "$tmp/d2" &&
        ratios_one "$tmp/d1" && ratios_one "$tmp/d2"; then
        echo "ok: diff of $desc with and without symmetry: identical ($(sed -n 's/^A: \([0-9]*\) ranks traced.*/\1/p' "$tmp/d1") ranks simulated)"
    else
        echo "FAILED: diff of $desc with and without symmetry (exit $rc1, $rc2)"
        cat "$tmp/d1" "$tmp/d2"; fail=1
    fi
}
diff_same "full_shard on 64 ranks" --model $mlp --world 64 --gpus-per-node 8
diff_same "hybrid_shard on 4 nodes of 4" --model $mlp --world 16 --gpus-per-node 4 \
    --strategy hybrid_shard
diff_same "hybrid_shard_zero2 on 8 nodes of 8" --model $mlp --world 64 --gpus-per-node 8 \
    --strategy hybrid_shard_zero2
diff_same "gpt2-tiny full_shard bf16 with checkpointing, 64 ranks" --model gpt2-tiny --world 64 \
    --mixed-precision bf16 --checkpoint-activations
diff_same "the split classes" --model mlp:1,5 --world 8
diff_same "fsdp2 full_shard on 64 ranks" --model $mlp --world 64 --gpus-per-node 8 --api fsdp2
diff_same "fsdp2 hybrid_shard on 4 nodes of 4" --model $mlp --world 16 --gpus-per-node 4 \
    --strategy hybrid_shard --api fsdp2

diff_same "llama tp 2 on 32 ranks" --model $tpl --world 32 --gpus-per-node 8 --api fsdp2 --tp 2
diff_same "llama tp 8 hybrid_shard on 4 nodes of 8" --model $tpl --world 32 --gpus-per-node 8 \
    --api fsdp2 --tp 8 --strategy hybrid_shard

# Under --tp the trace's rows of each simulated rank (its events and steps) are those of the
# same rank in the trace of every rank.
if command -v sqlite3 >/dev/null 2>&1; then
    for args in "--tp 4" "--tp 2 --strategy hybrid_shard"; do
        rm -f "$tmp/ds.db" "$tmp/da.db"
        "$plan" --model $tpl --world 32 --gpus-per-node 8 --api fsdp2 $args \
            --trace "$tmp/ds.db" >/dev/null 2>&1
        "$plan" --model $tpl --world 32 --gpus-per-node 8 --api fsdp2 $args --no-symmetry \
            --trace "$tmp/da.db" >/dev/null 2>&1
        ranks=$(sqlite3 "$tmp/ds.db" "SELECT group_concat(rank) FROM ranks")
        for db in ds da; do
            sqlite3 "$tmp/$db.db" "SELECT rank, seq, kind, name, unit, stream, host_time,
                start_time, end_time, bytes, count, dtype, grp, allocated, reserved FROM events
                WHERE rank IN ($ranks) ORDER BY rank, seq" >"$tmp/$db.rows"
            sqlite3 "$tmp/$db.db" "SELECT * FROM steps WHERE rank IN ($ranks) ORDER BY rank, step" |
                cut -d'|' -f2- >>"$tmp/$db.rows"
        done
        if [ -n "$ranks" ] && [ "$(echo "$ranks" | tr ',' '\n' | wc -l)" -lt 32 ] &&
            [ -s "$tmp/ds.rows" ] && cmp -s "$tmp/ds.rows" "$tmp/da.rows"; then
            echo "ok: $args: the trace's rows of the simulated ranks $ranks are every rank's plan's ($(wc -l <"$tmp/ds.rows") rows)"
        else
            echo "FAILED: $args: the trace's rows of the simulated ranks $ranks differ"
            diff "$tmp/ds.rows" "$tmp/da.rows" | head -5; fail=1
        fi
    done
else
    echo "skipped: no sqlite3 to read the trace's rows under --tp"
fi

# a real difference is still caught: another prefetch policy, symmetric against every rank
rm -f "$tmp/ds.db" "$tmp/dp.db"
"$plan" --model $mlp --world 16 --gpus-per-node 4 --strategy hybrid_shard \
    --trace "$tmp/ds.db" >/dev/null 2>&1
"$plan" --model $mlp --world 16 --gpus-per-node 4 --strategy hybrid_shard \
    --backward-prefetch post --no-symmetry --trace "$tmp/dp.db" >/dev/null 2>&1
"$trace" diff "$tmp/ds.db" "$tmp/dp.db" >"$tmp/d1" 2>&1
rc=$?
if [ $rc = 1 ] && grep -q '^first divergence: rank 0, ' "$tmp/d1" &&
    grep -q '^structure: 16 of 16 ranks differ' "$tmp/d1"; then
    echo "ok: diff catches another prefetch policy through a symmetric trace"
else
    echo "FAILED: diff of another prefetch policy (exit $rc)"; cat "$tmp/d1"; fail=1
fi

# calibrate refuses a symmetric trace, naming why; a trace of every rank calibrates
"$trace" calibrate "$tmp/ds.db" >/dev/null 2>"$tmp/err"
rc=$?
"$trace" calibrate "$tmp/dp.db" >/dev/null 2>&1
rc_all=$?
if [ $rc = 2 ] && grep -q 'is a symmetric plan: its 4 simulated ranks stand for 12 more' "$tmp/err" &&
    grep -q -- '--no-symmetry' "$tmp/err" && [ $rc_all = 0 ]; then
    echo "ok: calibrate refuses a symmetric trace by name"
else
    echo "FAILED: calibrate of a symmetric trace (exit $rc, every rank's $rc_all)"; cat "$tmp/err"
    fail=1
fi

# A symmetric trace whose classes are wrong (rank 0 standing for all 8 where ranks 5-7 hold
# no shard): the ranks it wrongly stands for differ from the trace of every rank.
if command -v sqlite3 >/dev/null 2>&1; then
    rm -f "$tmp/ds.db" "$tmp/da.db"
    "$plan" --model mlp:1,5 --world 8 --trace "$tmp/ds.db" >/dev/null 2>&1
    "$plan" --model mlp:1,5 --world 8 --no-symmetry --trace "$tmp/da.db" >/dev/null 2>&1
    sqlite3 "$tmp/ds.db" "DELETE FROM event_rows WHERE rank <> 0; DELETE FROM steps WHERE rank <> 0;
        DELETE FROM ranks WHERE rank <> 0; UPDATE ranks SET stands_for = 8, members = '0-7'"
    "$trace" diff "$tmp/ds.db" "$tmp/da.db" >"$tmp/d1" 2>&1
    rc=$?
    if [ $rc = 1 ] && grep -q '^A: 1 rank traced, standing for the world.s 8' "$tmp/d1" &&
        grep -q '^first divergence: rank [1-7], ' "$tmp/d1" &&
        grep -q 'compared through rank 0 of A' "$tmp/d1"; then
        echo "ok: diff catches ranks a symmetric trace wrongly stands for: $(grep '^structure' "$tmp/d1")"
    else
        echo "FAILED: diff of wrong classes (exit $rc)"; cat "$tmp/d1"; fail=1
    fi
else
    echo "skipped: no sqlite3 to make a trace with wrong classes"
fi

exit $fail
