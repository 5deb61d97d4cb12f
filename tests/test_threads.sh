#!/bin/sh
# fsdp-train --threads: a rank's GEMMs and large kernels of every kind (element-wise, the rows
# and column sums of the transformer's, the Llama passes) split across worker threads by a fixed
# partition of their outputs, so the losses (printed to the float's full
# precision) and the final weights (the safetensors bytes) are the same with 1, 2 and 3 threads,
# for GPT-2 and Llama, on one rank and on two ranks sharing the threads.
set -u
train="${top_builddir:-..}/tools/fsdp-train"
[ -x "$train" ] || train=../tools/fsdp-train
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

# model, world, extra arguments...
same_for_threads() {
    model=$1
    world=$2
    shift 2
    for t in 1 2 3; do
        if ! "$train" --model "$model" --world "$world" --batch 8 --seq 64 --steps 3 --threads "$t" \
            --save "$tmp/$t.safetensors" "$@" >"$tmp/$t.out" 2>"$tmp/$t.err"; then
            echo "FAILED: $model --world $world --threads $t $*: exit $?"; cat "$tmp/$t.err"; fail=1
            return
        fi
        grep '^step' "$tmp/$t.out" | cut -d' ' -f1-4 >"$tmp/$t.loss"
    done
    if [ "$(grep -c . "$tmp/1.loss")" -ne 3 ]; then
        echo "FAILED: $model: expected 3 step lines"; cat "$tmp/1.out"; fail=1
        return
    fi
    for t in 2 3; do
        if cmp -s "$tmp/1.loss" "$tmp/$t.loss" && cmp -s "$tmp/1.safetensors" "$tmp/$t.safetensors"; then
            echo "ok: $model --world $world $*: --threads $t gives the losses and weights of --threads 1 ($(tail -n 1 "$tmp/$t.loss"))"
        else
            echo "FAILED: $model --world $world $*: --threads $t differs from --threads 1"
            diff "$tmp/1.loss" "$tmp/$t.loss"
            cmp "$tmp/1.safetensors" "$tmp/$t.safetensors"
            fail=1
        fi
    done
}

same_for_threads gpt2-tiny 1
same_for_threads llama-tiny 1
same_for_threads llama-tiny 1 --mixed-precision bf16
same_for_threads llama:layers=1,heads=4,kv_heads=2,dim=128,ffn=256,seq=64,vocab=256 1
same_for_threads gpt2-tiny 1 --attention fused
same_for_threads gpt2-tiny 1 --mixed-precision bf16
same_for_threads gpt2-tiny 2

"$train" --threads 0 >/dev/null 2>&1 && { echo "FAILED: --threads 0 accepted"; fail=1; }
echo "ok: --threads 0 refused"
exit $fail
