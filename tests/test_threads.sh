#!/bin/sh
# fsdp-train --threads: a rank's GEMMs and large kernels of every kind (element-wise, the rows
# and column sums of the transformer's, the Llama passes) split across worker threads by a fixed
# partition of their outputs, so the losses (printed to the float's full
# precision) and the final weights (the safetensors bytes) are the same with 1, 2 and 3 threads,
# for GPT-2 and Llama, on one rank and on two ranks sharing the threads; and four ranks on fewer
# threads than ranks run as fibers on that many workers, with the same results.
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

# --threads bounds the whole run: 4 ranks on 1 or 2 threads run as fibers on that many workers
# (FSDP_LOG_LEVEL=debug names how the launch ran them), with the losses and weights of 4 ranks
# on threads of their own (a build with sanitizers runs threads instead, and says so)
for t in 4 1 2; do
    if ! FSDP_LOG_LEVEL=debug "$train" --model llama-tiny --world 4 --batch 8 --seq 64 --steps 3 \
        --threads "$t" --save "$tmp/w4t$t.safetensors" >"$tmp/w4t$t.out" 2>"$tmp/w4t$t.err"; then
        echo "FAILED: llama-tiny --world 4 --threads $t: exit $?"; cat "$tmp/w4t$t.err"; fail=1
        continue
    fi
    grep '^step' "$tmp/w4t$t.out" | cut -d' ' -f1-4 >"$tmp/w4t$t.loss"
    case $t in
    4) want='4 ranks, a thread each, with at most 1 kernel thread each' ;;
    1) want='4 ranks as fibers on 1 worker thread' ;;
    *) want="4 ranks as fibers on $t worker threads" ;;
    esac
    if grep -q "$want" "$tmp/w4t$t.err" ||
        { [ "$t" != 4 ] && grep -q 'fibers are not available in this build' "$tmp/w4t$t.err"; }; then
        echo "ok: --world 4 --threads $t: $want"
    else
        echo "FAILED: --world 4 --threads $t: no line '$want'"; grep fsdp_sim_launch "$tmp/w4t$t.err"
        fail=1
    fi
    if [ "$t" != 4 ]; then
        if [ "$(grep -c . "$tmp/w4t$t.loss")" -eq 3 ] && cmp -s "$tmp/w4t4.loss" "$tmp/w4t$t.loss" &&
            cmp -s "$tmp/w4t4.safetensors" "$tmp/w4t$t.safetensors"; then
            echo "ok: --world 4 --threads $t gives the losses and weights of --threads 4 ($(tail -n 1 "$tmp/w4t$t.loss"))"
        else
            echo "FAILED: --world 4 --threads $t differs from --threads 4"
            diff "$tmp/w4t4.loss" "$tmp/w4t$t.loss"; fail=1
        fi
    fi
done

"$train" --threads 0 >/dev/null 2>&1 && { echo "FAILED: --threads 0 accepted"; fail=1; }
echo "ok: --threads 0 refused"
exit $fail
