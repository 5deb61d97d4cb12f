#!/bin/sh
# --api fsdp2 (fully_shard) from the command line: the FSDP1-only options refused with their
# FSDP2 form named, every model trained with the losses of fsdp1, checkpoints across the two
# APIs, the trace's config, and fsdp-plan's plan and sweep.
set -u
bin="${top_builddir:-..}/tools"
[ -x "$bin/fsdp-train" ] || bin=../tools
train="$bin/fsdp-train"
plan="$bin/fsdp-plan"
src="${top_srcdir:-..}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

check() { # description, command...
    desc=$1
    shift
    if "$@"; then echo "ok: $desc"; else echo "FAILED: $desc"; fail=1; fi
}

# one error line naming what to give instead, and a non-zero exit
refuse() { # description, pattern the line holds, tool, arguments...
    desc=$1
    want=$2
    shift 2
    "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$(grep -c . "$tmp/err")" -eq 1 ] && grep -q "error: .*$want" "$tmp/err" &&
        [ ! -s "$tmp/out" ]; then
        echo "ok: refuses $desc: $(cat "$tmp/err")"
    else
        echo "FAILED: $desc (exit $rc, stderr:)"; cat "$tmp/err"; fail=1
    fi
}

mlp="--model mlp:16,30,20,4 --world 3 --batch 30 --optim sgd --lr 0.1 --momentum 0.9"
refuse "the limiter under fsdp2" "no all-gather rate limiter" $train $mlp --api fsdp2 --limit-all-gathers
refuse "an fsdp1 backward prefetch under fsdp2" "backward-prefetch explicit" \
    $train $mlp --api fsdp2 --backward-prefetch post
refuse "shard_grad_op under fsdp2" "reshard-after-forward false" \
    $train $mlp --api fsdp2 --strategy shard_grad_op --reshard-after-forward false
refuse "no_shard under fsdp2" "ranks-per-node 1" $train $mlp --api fsdp2 --strategy no_shard
refuse "--reshard-after-forward under fsdp1" "api fsdp2" $train $mlp --reshard-after-forward true
refuse "--backward-prefetch explicit under fsdp1" "api fsdp2" $train $mlp --backward-prefetch explicit
refuse "--output-dtype under fsdp1" "api fsdp2" $train $mlp --output-dtype f32
refuse "fsdp-plan: --output-dtype under fsdp1" "api fsdp2" \
    $plan --model gpt2 --world 8 --output-dtype f32
refuse "an --output-dtype that is no float dtype" "float dtype" \
    $train $mlp --api fsdp2 --output-dtype i32
refuse "an unknown api" "fsdp1, fsdp2" $train $mlp --api fsdp3
refuse "a reshard group that does not divide the world" "divides" \
    $train $mlp --api fsdp2 --reshard-after-forward 2
refuse "fsdp-plan: the limiter under fsdp2" "rate limiter" \
    $plan --model gpt2 --world 8 --api fsdp2 --no-limit-all-gathers

# every model trains under fsdp2 with fsdp1's losses to the printed precision
losses() { grep '^step' "$1" | awk '{print $4}'; }
close() { # file, file: relative difference at most 1e-6
    losses "$1" >"$1.l"
    losses "$2" >"$2.l"
    test -s "$1.l" && awk 'NR==FNR{a[FNR]=$1;next}{d=a[FNR]-$1; if(d<0)d=-d; if(d>1e-6*(1+$1))exit 1}' "$1.l" "$2.l"
}
text="--data $src/data/sqlite3-h.txt"
for m in "mlp:16,30,20,4 --batch 30" "gpt2-tiny --batch 3 --seq 16 $text" \
    "llama-tiny --batch 3 --seq 16 $text"; do
    name=${m%%:*}
    name=${name%% *}
    for api in fsdp1 fsdp2; do
        # shellcheck disable=SC2086
        $train --model $m --world 3 --steps 3 --api $api >"$tmp/$name.$api" 2>"$tmp/$name.$api.err"
    done
    check "$name: fsdp2 trains with fsdp1's losses" close "$tmp/$name.fsdp1" "$tmp/$name.fsdp2"
    check "$name: nothing on stderr" test ! -s "$tmp/$name.fsdp2.err"
done

same_losses() { # file, file: the same losses, as printed
    losses "$1" >"$1.l"
    losses "$2" >"$2.l"
    test -s "$1.l" && cmp -s "$1.l" "$2.l"
}
# output_dtype f32 under bf16 parameters: the casts at every layer's boundary are exact (a bf16
# value is an f32 one, and back), so the losses are the same to the bit
for m in "mlp:16,30,20,4 --batch 30" "gpt2-tiny --batch 3 --seq 16 $text" \
    "llama-tiny --batch 3 --seq 16 $text"; do
    name=${m%%:*}
    name=${name%% *}
    for od in "" "--output-dtype f32"; do
        # shellcheck disable=SC2086
        $train --model $m --world 3 --steps 3 --api fsdp2 --mixed-precision bf16 $od \
            >"$tmp/$name.od${od##* }" 2>&1
    done
    check "$name: output_dtype f32 under bf16 gives the same losses" \
        same_losses "$tmp/$name.od" "$tmp/$name.odf32"
done

# reshard after forward false keeps the parameters: more memory, the same losses
$train $mlp --api fsdp2 --reshard-after-forward false --steps 3 >"$tmp/noraf" 2>&1
$train $mlp --api fsdp2 --steps 3 >"$tmp/raf" 2>&1
check "reshard-after-forward false: the same losses" close "$tmp/raf" "$tmp/noraf"
check "reshard-after-forward false: a higher peak" awk '/^rank 0 peak/{p[FILENAME]=$5} END{exit !(p[ARGV[2]] > p[ARGV[1]])}' "$tmp/raf" "$tmp/noraf"
$train $mlp --api fsdp2 --forward-prefetch --backward-prefetch explicit --steps 3 >"$tmp/expl" 2>&1
check "explicit prefetch: the same losses" close "$tmp/raf" "$tmp/expl"
$train --model mlp:16,30,20,4 --world 4 --batch 32 --optim sgd --lr 0.1 --api fsdp2 \
    --strategy hybrid_shard --ranks-per-node 2 --grad-accum 2 --steps 3 >"$tmp/hsdp" 2>&1
$train --model mlp:16,30,20,4 --world 4 --batch 32 --optim sgd --lr 0.1 --steps 3 >"$tmp/fs" 2>&1
check "HSDP with accumulation: fsdp1's losses" close "$tmp/fs" "$tmp/hsdp"

# checkpoints: full and sharded ones resume under the other api with the losses of one run; a
# local one only under its own
$train $mlp --steps 6 >"$tmp/whole" 2>&1
resumed() { # file: its steps 4 to 6 within 1e-6 of the run without a stop
    grep '^step [456] ' "$tmp/whole" | awk '{print $4}' >"$tmp/w.l"
    grep '^step [456] ' "$1" | awk '{print $4}' >"$tmp/r.l"
    test "$(grep -c . "$tmp/r.l")" -eq 3 &&
        awk 'NR==FNR{a[FNR]=$1;next}{d=a[FNR]-$1; if(d<0)d=-d; if(d>1e-6)exit 1}' "$tmp/w.l" "$tmp/r.l"
}
for sd in full sharded local; do
    for api in fsdp1 fsdp2; do
        other=fsdp2
        [ $api = fsdp2 ] && other=fsdp1
        $train $mlp --steps 3 --api $api --save-checkpoint "$tmp/ck-$api-$sd" --state-dict $sd \
            >/dev/null 2>&1
        if [ $sd = local ]; then
            refuse "a local $api checkpoint under $other" "saved under api $api" \
                $train $mlp --steps 6 --api $other --resume "$tmp/ck-$api-$sd"
            other=$api
        fi
        $train $mlp --steps 6 --api $other --resume "$tmp/ck-$api-$sd" >"$tmp/res" 2>&1
        check "a $sd $api checkpoint resumes under $other with the losses of one run" \
            resumed "$tmp/res"
    done
done

# the trace says which api ran, and names fully_shard's streams
$train $mlp --api fsdp2 --steps 1 --trace "$tmp/t.db" >/dev/null 2>&1
if command -v sqlite3 >/dev/null 2>&1; then
    check "the trace's config names the api" \
        sh -c "sqlite3 '$tmp/t.db' 'select config from runs' | grep -q '\"api\": \"fsdp2\"'"
    check "fsdp-trace summary names it" \
        sh -c "'$bin/fsdp-trace' summary '$tmp/t.db' | head -n 1 | grep -q 'strategy fsdp2 full_shard'"
    check "the trace names the copy-in stream" test "$(sqlite3 "$tmp/t.db" \
        "select count(*) from events where stream = 'all_gather_copy_in'")" -gt 0
    # a group_copy a unit for each copy-out (forward and backward) and chunk-cat: 3 x 3 a rank
    check "the trace holds one group_copy a unit for each copy-out and chunk-cat" test \
        "$(sqlite3 "$tmp/t.db" "select group_concat(n) from (select count(*) as n from events \
            where name = 'group_copy' and stream = 'compute' group by rank)")" = "9,9,9"
    check "the trace holds no copy kernel per parameter" test \
        "$(sqlite3 "$tmp/t.db" "select count(*) from events where name = 'chunk_copy'")" = 0
else
    echo "skipped: the trace's rows (no sqlite3 command)"
fi

# the Perfetto export shows the copy-in stream and the copy-outs
"$bin/fsdp-trace" export --chrome "$tmp/t.json" "$tmp/t.db" >/dev/null 2>&1
check "the Chrome trace has the copy-in stream and the group_copy kernels" \
    sh -c "grep -q 'all_gather_copy_in' '$tmp/t.json' && grep -q 'group_copy' '$tmp/t.json'"
# fsdp-trace diff of an fsdp1 and an fsdp2 run of one job lists what differs by unit
$train $mlp --steps 1 --trace "$tmp/t1.db" >/dev/null 2>&1
"$bin/fsdp-trace" diff "$tmp/t1.db" "$tmp/t.db" >"$tmp/diff" 2>&1
check "fsdp-trace diff fsdp1 fsdp2: per unit, the copy-outs on B's side" \
    grep -q '^  layers.0 kernel group_copy  *0  *9  ' "$tmp/diff"

# fsdp-plan: the config line, and a sweep over fully_shard's settings
$plan --model gpt2 --world 8 --local-batch 2 --seq 512 --api fsdp2 >"$tmp/plan" 2>&1
check "fsdp-plan --api fsdp2 names fully_shard's settings" \
    grep -q '^config api fsdp2 (fully_shard), reshard after forward default' "$tmp/plan"
check "fsdp-plan --api fsdp2 plans a step" grep -q '^step time [0-9.]* ms' "$tmp/plan"
$plan --model mlp:256,1024,256 --world 4 --api fsdp2 --sweep --mixed-precision bf16 >"$tmp/sweep" 2>&1
check "fsdp-plan --api fsdp2 --sweep: 4 configurations, none failed" \
    sh -c "grep -q '^sweeping 4 configurations' '$tmp/sweep' && ! grep -q failed '$tmp/sweep'"

exit $fail
