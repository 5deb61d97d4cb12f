#!/bin/sh
# fsdp-plan on real jobs: every Llama preset on the h100 and a100 profiles, FULL_SHARD and
# HYBRID_SHARD in bf16, at the node counts such a run uses; each plan answers whether it fits
# and prints its tokens/s per GPU and PaLM's MFU. One simulated step each, to stay fast.
set -u
plan="${top_builddir:-..}/tools/fsdp-plan"
[ -x "$plan" ] || plan=../tools/fsdp-plan
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

check() { # description, command...
    desc=$1
    shift
    if "$@"; then echo "ok: $desc"; else echo "FAILED: $desc"; fail=1; fi
}

# preset, nodes of 8 GPUs, activation checkpointing: 128 and 256 GPUs for 70B and 405B, whose
# FSDP runs checkpoint every layer
for job in "llama-tiny 2 none" "llama3.2-1b 2 none" "llama3.2-3b 2 none" "llama2-7b 8 none" \
    "llama3-8b 8 none" "llama2-13b 8 none" "llama2-70b 16 full" "llama3-70b 16 full" \
    "llama3.1-405b 32 full"; do
    set -- $job
    for prof in h100 a100; do
        for strat in full_shard hybrid_shard; do
            out="$tmp/$1-$prof-$strat"
            "$plan" --model "$1" --profile "$prof:nodes=$2" --strategy "$strat" \
                --mixed-precision bf16 --activation-checkpointing "$3" --steps 1 >"$out" 2>"$tmp/err"
            rc=$?
            if [ "$rc" -eq 0 ] && [ ! -s "$tmp/err" ] && grep -q "^fits: \(yes\|no\): " "$out" &&
                grep -q "^[0-9][0-9]* tokens/s per GPU " "$out" &&
                grep -q "^MFU by PaLM's definition [0-9.]*% " "$out"; then
                echo "ok: $1 on $2 $prof nodes, $strat: $(grep -h "^fits" "$out" | cut -c1-40)," \
                    "$(grep -h "tokens/s per GPU" "$out" | cut -d'(' -f1)"
            else
                echo "FAILED: $1 on $2 $prof nodes, $strat (exit $rc):"
                cat "$out" "$tmp/err"
                fail=1
            fi
        done
    done
done

# what is known of these jobs: the 7B-13B models and, checkpointed, the 70B ones train fully
# sharded on these clusters; a 70B or 405B model's AdamW state alone (16 bytes a parameter)
# overflows 8 GPUs of 80 GB, so hybrid sharding within a node cannot hold them
for m in llama2-7b llama3-8b llama2-13b llama2-70b llama3-70b; do
    for prof in h100 a100; do
        check "$m fits fully sharded on $prof" grep -q "^fits: yes" "$tmp/$m-$prof-full_shard"
    done
done
for m in llama2-70b llama3-70b llama3.1-405b; do
    check "$m does not fit sharded within a node" grep -q "^fits: no" "$tmp/$m-h100-hybrid_shard"
done
check "an A100 is slower than an H100" \
    awk 'FNR==1{f++} /tokens\/s per GPU/{t[f]=$1} END{exit !(t[1] < t[2])}' \
    "$tmp/llama3-8b-a100-full_shard" "$tmp/llama3-8b-h100-full_shard"
exit $fail
