#!/bin/sh
# fsdp-train from the command line: output format, bad input, safetensors round trips.
set -u
train="${top_builddir:-..}/tools/fsdp-train"
[ -x "$train" ] || train=../tools/fsdp-train
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

check() { # description, command...
    desc=$1
    shift
    if "$@"; then echo "ok: $desc"; else echo "FAILED: $desc"; fail=1; fi
}

# one error line and a non-zero exit
refuse() { # description, fsdp-train arguments...
    desc=$1
    shift
    "$train" "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    lines=$(grep -c . "$tmp/err")
    if [ "$rc" -ne 0 ] && [ "$lines" -ge 1 ] && grep -q "^fsdp-train: error: " "$tmp/err" && [ ! -s "$tmp/out" ]; then
        echo "ok: refuses $desc: $(head -n 1 "$tmp/err")"
    else
        echo "FAILED: $desc (exit $rc, stderr:)"; cat "$tmp/err"; fail=1
    fi
    [ "$lines" -eq 1 ] || { echo "FAILED: $desc printed $lines error lines"; fail=1; }
}

# the documented main run
"$train" --model mlp:16,32,4 --world 4 --strategy full_shard --optim adamw --lr 1e-2 \
    --steps 10 >"$tmp/run" 2>"$tmp/err"
check "trains and exits 0" test $? -eq 0
check "prints 10 loss lines" test "$(grep -c '^step [0-9]* loss ' "$tmp/run")" -eq 10
check "prints 4 peak lines" test "$(grep -c '^rank [0-3] peak allocated [0-9]* bytes$' "$tmp/run")" -eq 4
check "loss falls" awk '/^step 1 /{a=$4} /^step 10 /{b=$4} END{exit !(b < a)}' "$tmp/run"
check "nothing on stderr" test ! -s "$tmp/err"

# deterministic: two runs print the same
"$train" --model mlp:16,32,4 --world 4 --steps 10 --lr 1e-2 >"$tmp/run2" 2>&1
"$train" --model mlp:16,32,4 --world 4 --steps 10 --lr 1e-2 >"$tmp/run3" 2>&1
check "deterministic" cmp -s "$tmp/run2" "$tmp/run3"

# every strategy gives the same losses to the printed precision
for s in full_shard shard_grad_op no_shard; do
    "$train" --model mlp:8,12,3 --world 3 --batch 12 --strategy $s --optim sgd --lr 0.1 \
        --momentum 0.9 --steps 5 | grep '^step' | awk '{print $4}' >"$tmp/loss.$s"
done
check "full_shard and no_shard agree" awk 'NR==FNR{a[FNR]=$1;next}{d=a[FNR]-$1; if(d<0)d=-d; if(d>1e-6*(1+$1))exit 1}' "$tmp/loss.full_shard" "$tmp/loss.no_shard"
check "shard_grad_op and no_shard agree" awk 'NR==FNR{a[FNR]=$1;next}{d=a[FNR]-$1; if(d<0)d=-d; if(d>1e-6*(1+$1))exit 1}' "$tmp/loss.shard_grad_op" "$tmp/loss.no_shard"

# --save writes safetensors that --init reads back: training 0 steps re-saves the same bytes
"$train" --model mlp:6,10,2 --world 2 --steps 3 --save "$tmp/a.safetensors" >/dev/null 2>&1
check "save writes a file" test -s "$tmp/a.safetensors"
"$train" --model mlp:6,10,2 --world 3 --batch 12 --steps 0 --init "$tmp/a.safetensors" \
    --save "$tmp/b.safetensors" >/dev/null 2>&1
check "init then save round-trips the bytes (W=2 to W=3)" cmp -s "$tmp/a.safetensors" "$tmp/b.safetensors"
# resuming from saved weights continues the loss sequence of SGD without momentum
"$train" --model mlp:6,10,2 --world 2 --optim sgd --lr 0.05 --steps 6 | grep '^step' >"$tmp/six"
"$train" --model mlp:6,10,2 --world 2 --optim sgd --lr 0.05 --steps 3 --save "$tmp/c.safetensors" >/dev/null
"$train" --model mlp:6,10,2 --world 2 --optim sgd --lr 0.05 --steps 3 --init "$tmp/c.safetensors" \
    | grep '^step' | awk '{print "step", $2 + 3, "loss", $4}' >"$tmp/three"
check "continuing from --save reproduces the uninterrupted losses" \
    sh -c "tail -n 3 '$tmp/six' | cmp -s - '$tmp/three'"

# checkpoints: a resumed run continues with exactly the losses of an uninterrupted one
for sd in full sharded; do
    "$train" --model mlp:6,10,2 --world 2 --steps 6 --lr 1e-2 | grep '^step' >"$tmp/u6"
    "$train" --model mlp:6,10,2 --world 2 --steps 3 --lr 1e-2 --save-checkpoint "$tmp/ck-$sd" \
        --state-dict $sd >/dev/null
    "$train" --model mlp:6,10,2 --world 2 --steps 6 --lr 1e-2 --resume "$tmp/ck-$sd" \
        | grep '^step' >"$tmp/r6"
    check "resume from a $sd checkpoint continues the loss sequence exactly" \
        sh -c "tail -n 3 '$tmp/u6' | cmp -s - '$tmp/r6'"
done
# gradient accumulation equals the whole batch; hybrid, offload and clipping train
"$train" --model mlp:8,12,3 --world 2 --batch 16 --steps 4 --optim sgd --lr 0.1 | grep '^step' \
    | awk '{print $4}' >"$tmp/acc1"
"$train" --model mlp:8,12,3 --world 2 --batch 16 --steps 4 --optim sgd --lr 0.1 --grad-accum 4 \
    | grep '^step' | awk '{print $4}' >"$tmp/acc4"
check "grad-accum 4 matches the whole batch" awk 'NR==FNR{a[FNR]=$1;next}{d=a[FNR]-$1; if(d<0)d=-d; if(d>1e-6)exit 1}' "$tmp/acc1" "$tmp/acc4"
"$train" --model mlp:8,12,3 --world 4 --strategy hybrid_shard --ranks-per-node 2 --cpu-offload \
    --clip-grad-norm 0.5 --steps 5 --lr 1e-2 >"$tmp/hyb" 2>&1
check "hybrid sharding with offload and clipping trains" \
    awk '/^step 1 /{a=$4} /^step 5 /{b=$4} END{exit !(b < a)}' "$tmp/hyb"

refuse "a grad-accum that does not divide the rows" --world 2 --batch 8 --grad-accum 3
refuse "a state-dict without a checkpoint dir" --state-dict sharded
refuse "an unknown state-dict" --save-checkpoint "$tmp/x" --state-dict local
refuse "ranks per node not dividing the world" --world 4 --strategy hybrid_shard --ranks-per-node 3
refuse "resuming from nothing" --resume "$tmp/no-such-dir"
refuse "an unknown flag" --no-such-flag
refuse "a malformed model" --model mlp:16,,4
refuse "a model of one width" --model mlp:16
refuse "world size 0" --world 0
refuse "a batch not divisible by the world" --world 3 --batch 32
refuse "an unknown strategy" --strategy zero3
refuse "a negative learning rate" --lr -1
refuse "nesterov without momentum" --optim sgd --nesterov
refuse "a missing init file" --init "$tmp/none.safetensors"
printf 'not a safetensors file' >"$tmp/bad.safetensors"
refuse "a malformed init file" --init "$tmp/bad.safetensors"
refuse "init weights of the wrong shape" --model mlp:6,11,2 --init "$tmp/a.safetensors"
refuse "data of the wrong width" --model mlp:7,10,2 --data "$tmp/a.safetensors"

exit $fail
