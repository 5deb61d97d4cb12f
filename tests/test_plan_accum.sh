#!/bin/sh
# fsdp-plan --grad-accum K: K micro-batches of --local-batch per optimizer step, the first K-1
# under no_sync (fully_shard: gradient sync off), as fsdp-train runs them. K = 1 is the plan
# without it; the trace's collectives are fsdp-train's; the gradients every micro-batch after
# the first holds are the memory docs/runtime.md's formula gives ("Gradient accumulation").
set -u
tools="${top_builddir:-..}/tools"
[ -x "$tools/fsdp-plan" ] || tools=../tools
plan="$tools/fsdp-plan"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

check() { # description, command...
    desc=$1
    shift
    if "$@"; then echo "ok: $desc"; else echo "FAILED: $desc"; fail=1; fi
}

# one error line on stderr, nothing on stdout, exit 2
refuse() { # description, fsdp-plan arguments...
    desc=$1
    shift
    "$plan" "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    lines=$(grep -c . "$tmp/err")
    if [ "$rc" -eq 2 ] && [ "$lines" -eq 1 ] && grep -q "^fsdp-plan: error: " "$tmp/err" &&
        [ ! -s "$tmp/out" ]; then
        echo "ok: refuses $desc: $(cat "$tmp/err")"
    else
        echo "FAILED: $desc (exit $rc, stdout, stderr:)"; cat "$tmp/out" "$tmp/err"; fail=1
    fi
}

# (a) --grad-accum 1 is the plan without it, word for word: a plan, a language model under
# fully_shard and tp, a sweep
same() { # description, fsdp-plan arguments...
    desc=$1
    shift
    "$plan" "$@" >"$tmp/k0" 2>&1
    "$plan" "$@" --grad-accum 1 >"$tmp/k1" 2>&1
    check "--grad-accum 1 prints what no --grad-accum prints: $desc" cmp -s "$tmp/k0" "$tmp/k1"
}
same "an mlp" --model mlp:256,1024,256 --world 4 --local-batch 16
same "a gpt under fsdp2 and tp" --api fsdp2 --tp 2 --model gpt2-tiny --world 4 --local-batch 2 \
    --mixed-precision bf16
same "a sweep" --model mlp:64,128,64 --world 4 --sweep --strategy full_shard

# (b) the collectives of a step's last micro-batch: rank 0's counts in the trace's last step
# (fsdp-trace summary), the plan's against fsdp-train's, which runs the same micro-batches
# for real (it adds one all-reduce, of the loss)
counts() { # trace database -> "all_gather N reduce_scatter N all_reduce N"
    "$tools/fsdp-trace" summary "$1" | awk '
        /^time per op in rank 0/ { f = 1 }
        f && $1 == "collective" { n[$2] = $3 }
        END { printf "all_gather %d reduce_scatter %d all_reduce %d\n",
                     n["all_gather"], n["reduce_scatter"], n["all_reduce"] }'
}
field() { # counts, name -> N
    echo "$1" | awk -v k="$2" '{ for (i = 1; i < NF; i++) if ($i == k) print $(i + 1) }'
}
M=mlp:16,30,20,4 # 3 units, none the root's
for cfg in "full_shard" "shard_grad_op" "fsdp2"; do
    case $cfg in
    fsdp2) opts="--api fsdp2" ;;
    *) opts="--strategy $cfg" ;;
    esac
    for k in 1 2; do
        # shellcheck disable=SC2086
        "$plan" --model $M --world 2 --local-batch 4 $opts --grad-accum $k \
            --trace "$tmp/p$k.db" >/dev/null 2>&1
    done
    # shellcheck disable=SC2086
    "$tools/fsdp-train" --model $M --world 2 --batch 16 $opts --grad-accum 2 --steps 2 \
        --trace "$tmp/t.db" >/dev/null 2>&1
    p1=$(counts "$tmp/p1.db")
    p2=$(counts "$tmp/p2.db")
    t=$(counts "$tmp/t.db")
    echo "  $cfg: plan K=1: $p1; plan K=2: $p2; fsdp-train K=2: $t"
    check "$cfg --grad-accum 2: the all-gathers of fsdp-train --grad-accum 2" \
        test "$(field "$p2" all_gather)" -eq "$(field "$t" all_gather)"
    check "$cfg --grad-accum 2: its reduce-scatters" \
        test "$(field "$p2" reduce_scatter)" -eq "$(field "$t" reduce_scatter)"
    check "$cfg --grad-accum 2: a reduce-scatter a unit, once a step" \
        test "$(field "$p2" reduce_scatter)" -eq 3 -a "$(field "$p1" reduce_scatter)" -eq 3
    if [ "$cfg" = shard_grad_op ]; then
        # the parameters stay unsharded under no_sync: the next forward gathers nothing
        check "$cfg --grad-accum 2: all-gathers once a step, as K = 1" \
            test "$(field "$p2" all_gather)" -eq "$(field "$p1" all_gather)"
    else
        check "$cfg --grad-accum 2: all-gathers in both micro-batches, twice K = 1's" \
            test "$(field "$p2" all_gather)" -eq $((2 * $(field "$p1" all_gather)))
    fi
done
check "the trace has a step row a step, not a micro-batch" \
    sh -c "'$tools/fsdp-trace' summary '$tmp/p2.db' | grep -q '^    2 steps, step time'"

# (c) memory: from the second micro-batch's forward on, a rank holds every unit's unsharded
# gradient, sum over the units of T x e bytes (T the unit's parameters, e the bytes of the
# gradient kept: FSDP1's compute dtype, fully_shard's f32 accumulator). The forward's peak
# grows by exactly that; the step's peak by no more. 4 units, the weights and biases of
# 1024 -> 4096 -> 1024 -> 4096 -> 1024, a whole number of 512-byte blocks each.
M=mlp:1024,4096,1024,4096,1024
params=$(echo "$M" | awk -F'[:,]' '{ for (i = 2; i < NF; i++) s += ($i + 1) * $(i + 1); print s }')
check "the mlp has $params parameters" test "$params" -eq 16787456
# peak allocated, the forward's peak (MiB): the first line of the memory table and of the phases
peaks() {
    awk '/^memory per rank, MiB/ { m = 1 } /^peaks by phase, MiB/ { p = 1 }
         m == 1 && /^  ranks 0-/ { a = $3; m = 2 } p == 1 && /^  ranks 0-/ { f = $6; p = 2 }
         END { print a, f }' "$1"
}
for cfg in "fp32 4" "bf16 2" "fsdp2-bf16 4" "hybrid 4"; do
    set -- $cfg
    case $1 in
    fp32) opts="" ;;
    bf16) opts="--mixed-precision bf16" ;;
    fsdp2-bf16) opts="--api fsdp2 --mixed-precision bf16" ;;
    hybrid) opts="--strategy hybrid_shard --gpus-per-node 2" ;;
    esac
    grads=$(awk -v n="$params" -v e="$2" 'BEGIN { printf "%.4f", n * e / 1048576 }')
    for k in 1 2 3; do
        # shellcheck disable=SC2086
        "$plan" --model $M --world 4 --local-batch 64 $opts --grad-accum $k >"$tmp/m$k" 2>&1
    done
    set -- $(peaks "$tmp/m1") $(peaks "$tmp/m2") $(peaks "$tmp/m3")
    echo "  $cfg: unsharded gradients $grads MiB; peak, forward's peak: K=1 $1 $2, K=2 $3 $4, K=3 $5 $6"
    check "$cfg --grad-accum 2: the forward's peak grows by the unsharded gradients" \
        awk -v a="$2" -v b="$4" -v g="$grads" 'BEGIN { d = b - a - g; exit !(d > -0.011 && d < 0.011) }'
    check "$cfg --grad-accum 2: the step's peak grows, by no more than them" \
        awk -v a="$1" -v b="$3" -v g="$grads" 'BEGIN { exit !(b > a && b <= a + g + 0.011) }'
    check "$cfg --grad-accum 3: the memory of 2 (the gradients accumulate in place)" \
        test "$3 $4" = "$5 $6"
done

# time and tokens: a step of K micro-batches, one optimizer step; tokens count all K
"$plan" --model gpt2-tiny --world 4 --local-batch 2 >"$tmp/g1" 2>&1
"$plan" --model gpt2-tiny --world 4 --local-batch 2 --grad-accum 4 >"$tmp/g4" 2>&1
check "the header says the step's batch and its micro-batches" \
    grep -q "^batch 32 sequences a step, 4 micro-batches of 2 per rank (512 tokens per rank a step), adamw, 2 steps simulated" "$tmp/g4"
check "tokens per rank per step count every micro-batch" \
    grep -q "^[0-9]* tokens/s per GPU (512 tokens per rank per step)$" "$tmp/g4"
check "tokens/s: a step's tokens over the step time (printed to 1 us)" \
    awk '/^step time/ { t = $3 } /tokens\/s per GPU/ { r = $1 } END { x = 512 / (t / 1e3); exit !(r > x * 0.999 && r < x * 1.001) }' "$tmp/g4"
check "a step of 4 micro-batches: longer than 3 of one, shorter than 4 steps" \
    awk 'FNR == 1 { f++ } /^step time/ { t[f] = $3 } END { exit !(t[2] > 3 * t[1] && t[2] < 4 * t[1]) }' \
    "$tmp/g1" "$tmp/g4"
"$plan" --model gpt2-tiny --world 4 --batch 32 --grad-accum 4 >"$tmp/gb" 2>&1
check "--batch is a step's: --batch 32 --grad-accum 4 is --local-batch 2 on 4 ranks" \
    cmp -s "$tmp/g4" "$tmp/gb"
"$plan" --model mlp:64,64 --world 2 --grad-accum 3 >"$tmp/rows" 2>&1
check "an mlp's header counts rows" \
    grep -q "^batch 48 rows a step, 3 micro-batches of 8 per rank, adamw" "$tmp/rows"

# the sweep keeps K: each row is the plan of its configuration with the same K
"$plan" --model mlp:512,2048,512 --world 8 --local-batch 8 --grad-accum 2 --sweep \
    --backward-prefetch pre --limit-all-gathers --mixed-precision bf16 >"$tmp/sw" 2>&1
check "a sweep's header says its micro-batches" grep -q "^batch 128 rows a step, 2 micro-batches of 8 per rank" "$tmp/sw"
for s in full_shard shard_grad_op no_shard; do
    "$plan" --model mlp:512,2048,512 --world 8 --local-batch 8 --grad-accum 2 --strategy $s \
        --mixed-precision bf16 >"$tmp/one" 2>&1
    check "the sweep's $s row is the plan of $s with --grad-accum 2" \
        test "$(awk -v s=$s '$1 == s { print $6 }' "$tmp/sw")" = \
        "$(awk '/^step time/ { print $3 }' "$tmp/one")"
done

# (d) a bad K: one line
refuse "--grad-accum 0" --model mlp:4,4 --grad-accum 0
refuse "--grad-accum over 2^20" --model mlp:4,4 --grad-accum 1048577
refuse "--grad-accum that is no number" --model mlp:4,4 --grad-accum two
refuse "--grad-accum without a value" --model mlp:4,4 --grad-accum
refuse "--grad-accum that does not divide each rank's batch" --model mlp:4,4 --world 2 --batch 12 \
    --grad-accum 4
refuse "--batch and --local-batch that disagree with --grad-accum" --model mlp:4,4 --world 2 \
    --batch 16 --local-batch 4 --grad-accum 4
refuse "a step of more than 2^62 tokens" --model llama3-8b --local-batch 1073741824 \
    --grad-accum 1048576

# --local-batch means each rank's micro-batch in fsdp-train too: 4 rows on 2 ranks x 2
# micro-batches is a step of 16 rows, and --batch must agree with that product
"$tools/fsdp-train" --model mlp:4,4 --world 2 --local-batch 4 --grad-accum 2 --steps 1 \
    >"$tmp/tr" 2>&1
check "fsdp-train --local-batch 4 --grad-accum 2 on 2 ranks trains 16 rows a step" \
    grep -q "^trained 16 rows" "$tmp/tr"
"$tools/fsdp-train" --model mlp:4,4 --world 2 --local-batch 4 --batch 8 --grad-accum 2 \
    --steps 1 >"$tmp/tr" 2>&1
check "fsdp-train refuses --batch 8 against --local-batch 4 x 2 ranks x 2 micro-batches" \
    grep -q "disagree on 2 ranks x --grad-accum 2" "$tmp/tr"

exit $fail
