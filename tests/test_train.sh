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

# mixed precision: bf16 compute trains, and its losses are not the f32 ones (it really rounds)
"$train" --model mlp:16,32,4 --world 4 --steps 10 --lr 1e-2 \
    --mixed-precision param=bf16,reduce=fp32,buffer=fp32 >"$tmp/bf16" 2>"$tmp/err"
check "bf16 mixed precision trains and exits 0" test $? -eq 0
check "bf16 mixed precision: nothing on stderr" test ! -s "$tmp/err"
check "bf16 mixed precision: loss falls" \
    awk '/^step 1 /{a=$4} /^step 10 /{b=$4} END{exit !(b < 0.9 * a)}' "$tmp/bf16"
check "bf16 mixed precision computes in bf16" sh -c "! cmp -s '$tmp/bf16' '$tmp/run2'"
"$train" --model mlp:8,12,3 --world 2 --batch 8 --steps 3 --strategy shard_grad_op \
    --mixed-precision param=float16,reduce=float32 >"$tmp/fp16" 2>&1
check "fp16 mixed precision with PyTorch's names trains" test "$(grep -c '^step' "$tmp/fp16")" -eq 3

# ---- GPT-2 ----
tiny="gpt2:layers=1,heads=2,dim=16,seq=16,vocab=256"
"$train" --model gpt2-tiny --world 2 --batch 4 --steps 3 --lr 3e-3 >"$tmp/gpt" 2>"$tmp/err"
check "gpt2-tiny trains on the default corpus and exits 0" test $? -eq 0
check "gpt2: nothing on stderr" test ! -s "$tmp/err"
check "gpt2: prints 3 loss lines" test "$(grep -c '^step [0-9]* loss ' "$tmp/gpt")" -eq 3
check "gpt2: prints tokens/s" grep -q '^trained 768 tokens in [0-9.]* s: [0-9]* tokens/s$' "$tmp/gpt"
check "gpt2: prints 2 peak lines" test "$(grep -c '^rank [01] peak allocated [0-9]* bytes$' "$tmp/gpt")" -eq 2
check "gpt2: the first loss is about ln 256" \
    awk '/^step 1 /{exit !($4 > 5.2 && $4 < 5.8)}' "$tmp/gpt"
for s in full_shard shard_grad_op no_shard; do
    "$train" --model "$tiny" --world 2 --batch 4 --steps 4 --lr 1e-2 --strategy $s \
        | grep '^step' | awk '{print $4}' >"$tmp/gloss.$s"
done
check "gpt2: full_shard and no_shard agree" awk 'NR==FNR{a[FNR]=$1;next}{d=a[FNR]-$1; if(d<0)d=-d; if(d>1e-5*$1)exit 1}' "$tmp/gloss.full_shard" "$tmp/gloss.no_shard"
check "gpt2: shard_grad_op and no_shard agree" awk 'NR==FNR{a[FNR]=$1;next}{d=a[FNR]-$1; if(d<0)d=-d; if(d>1e-5*$1)exit 1}' "$tmp/gloss.shard_grad_op" "$tmp/gloss.no_shard"
"$train" --model "$tiny" --world 2 --batch 4 --steps 4 --lr 1e-2 | grep '^step' | cut -d' ' -f1-4,7-8 >"$tmp/g1"
"$train" --model "$tiny" --world 2 --batch 4 --steps 4 --lr 1e-2 | grep '^step' | cut -d' ' -f1-4,7-8 >"$tmp/g2"
check "gpt2: deterministic" cmp -s "$tmp/g1" "$tmp/g2"
"$train" --model "$tiny" --world 2 --batch 4 --steps 4 --lr 1e-2 --checkpoint-activations \
    | grep '^step' | cut -d' ' -f1-4 >"$tmp/g3"
check "gpt2: activation checkpointing changes nothing" sh -c "cut -d' ' -f1-4 '$tmp/g1' | cmp -s - '$tmp/g3'"
"$train" --model "$tiny" --world 2 --batch 4 --steps 4 --lr 1e-2 --grad-accum 2 --no-decay-1d \
    --clip-grad-norm 1.0 >"$tmp/g4" 2>&1
check "gpt2: grad-accum, no-decay-1d and clipping train" test "$(grep -c '^step' "$tmp/g4")" -eq 4
"$train" --model "$tiny" --world 2 --batch 8 --steps 3 --lr 1e-2 | awk '/^step/{print $4}' >"$tmp/ga1"
"$train" --model "$tiny" --world 2 --batch 8 --steps 3 --lr 1e-2 --grad-accum 2 \
    | awk '/^step/{print $4}' >"$tmp/ga2"
check "gpt2: grad-accum 2 matches the whole batch" awk 'NR==FNR{a[FNR]=$1;next}{d=a[FNR]-$1; if(d<0)d=-d; if(d>1e-5*$1)exit 1}' "$tmp/ga1" "$tmp/ga2"

# text from any file, and llm.c token shards
awk 'BEGIN{for(i=0;i<400;i++) print "the quick brown fox jumps over the lazy dog " i}' >"$tmp/text.txt"
"$train" --model "$tiny" --world 2 --batch 4 --steps 3 --data "$tmp/text.txt" >"$tmp/gt" 2>&1
check "gpt2 on a text file" test "$(grep -c '^step' "$tmp/gt")" -eq 3
check "gpt2 names its data" grep -q "data: text $tmp/text.txt, [0-9]* tokens" "$tmp/gt"
le32() { # a 32-bit little-endian integer
    printf "$(printf '\\%03o\\%03o\\%03o\\%03o' $(($1 & 255)) $(($1 >> 8 & 255)) \
        $(($1 >> 16 & 255)) $(($1 >> 24 & 255)))"
}
shard() { # path magic version count ntokens first-token
    { le32 "$2"; le32 "$3"; le32 "$4"; head -c 1012 /dev/zero
      i=0; while [ $i -lt "$5" ]; do t=$((($6 + i * 37) % 256 + ($6 >= 256) * 256))
          printf "$(printf '\\%03o\\%03o' $((t & 255)) $((t >> 8)))"; i=$((i + 1)); done
    } >"$1"
}
shard "$tmp/tok.bin" 20240520 1 300 300 0
"$train" --model "$tiny" --world 2 --batch 4 --steps 3 --tokens "$tmp/tok.bin" >"$tmp/gk" 2>&1
check "gpt2 on an llm.c shard" test "$(grep -c '^step' "$tmp/gk")" -eq 3
shard "$tmp/badmagic.bin" 20240521 1 300 300 0
shard "$tmp/short.bin" 20240520 1 301 300 0
shard "$tmp/big.bin" 20240520 1 300 300 256

# HF weights: --save writes them, --init reads them back, across world sizes
"$train" --model "$tiny" --world 2 --batch 6 --steps 2 --save "$tmp/g.safetensors" >/dev/null 2>&1
check "gpt2: save writes a file" test -s "$tmp/g.safetensors"
"$train" --model "$tiny" --world 3 --batch 6 --steps 0 --init "$tmp/g.safetensors" \
    --save "$tmp/h.safetensors" >/dev/null 2>&1
check "gpt2: init then save round-trips the bytes (W=2 to W=3)" \
    cmp -s "$tmp/g.safetensors" "$tmp/h.safetensors"
# a checkpoint resumes the loss sequence exactly (the sampler is a function of the step)
"$train" --model "$tiny" --world 2 --batch 4 --steps 6 --lr 1e-2 | grep '^step' | cut -d' ' -f1-4 >"$tmp/gsix"
"$train" --model "$tiny" --world 2 --batch 4 --steps 3 --lr 1e-2 \
    --save-checkpoint "$tmp/gck" >/dev/null 2>&1
"$train" --model "$tiny" --world 2 --batch 4 --steps 6 --lr 1e-2 --resume "$tmp/gck" \
    | grep '^step' | cut -d' ' -f1-4 >"$tmp/gthree"
check "gpt2: resume from a checkpoint continues the loss sequence exactly" \
    sh -c "tail -n 3 '$tmp/gsix' | cmp -s - '$tmp/gthree'"

refuse "an unknown gpt preset" --model gpt2-huge
refuse "an unknown backend" --backend tpu
# without a device (or a library built without CUDA) this is refused for that; with one, for a
# --world the launcher (none: a single process) contradicts
refuse "a gpu world the launcher did not start" --backend gpu --world 3
refuse "a gpt spec with a zero" --model "gpt2:layers=0"
refuse "heads that do not divide the width" --model "gpt2:heads=3,dim=16"
# GPT-2 under bf16 mixed precision: it computes in bf16 (other losses than f32's) and learns.
# A fixed text, not the default corpus (the sources, which change with every edit of them).
i=0
while [ $i -lt 300 ]; do
    echo "line $i: the quick brown fox jumps over the lazy dog, and the dog sleeps on."
    i=$((i + 1))
done >"$tmp/fox.txt"
"$train" --model gpt2-tiny --world 2 --batch 4 --steps 20 --lr 3e-3 --data "$tmp/fox.txt" \
    --mixed-precision param=bf16 >"$tmp/gbf16" 2>"$tmp/err"
check "gpt2 bf16 mixed precision trains and exits 0" test $? -eq 0
check "gpt2 bf16: nothing on stderr" test ! -s "$tmp/err"
check "gpt2 bf16: the loss falls over 20 steps" \
    awk '/^step 1 /{a=$4} /^step 20 /{b=$4} END{exit !(b < a - 1.0)}' "$tmp/gbf16"
"$train" --model gpt2-tiny --world 2 --batch 4 --steps 20 --lr 3e-3 --data "$tmp/fox.txt" \
    >"$tmp/gf32" 2>&1
check "gpt2 bf16 computes in bf16 (its losses are not f32's)" \
    sh -c "! cmp -s '$tmp/gbf16' '$tmp/gf32'"
check "gpt2 bf16 ends within 0.3 nats of f32" \
    awk 'NR==FNR{if(/^step 20 /)a=$4;next} /^step 20 /{d=a-$4; if(d<0)d=-d; exit !(d < 0.3)}' \
    "$tmp/gbf16" "$tmp/gf32"
check "gpt2 bf16 peaks lower than f32" \
    awk 'NR==FNR{if(/^rank 0 peak/)a=$5;next} /^rank 0 peak/{exit !(a < $5)}' \
    "$tmp/gbf16" "$tmp/gf32"
refuse "a sequence longer than the positions" --model "$tiny" --seq 17
refuse "llm.c tokens for an mlp" --tokens "$tmp/tok.bin"
refuse "text and tokens together" --model "$tiny" --data "$tmp/text.txt" --tokens "$tmp/tok.bin"
refuse "an llm.c shard with a bad magic" --model "$tiny" --tokens "$tmp/badmagic.bin"
refuse "an llm.c shard shorter than its count" --model "$tiny" --tokens "$tmp/short.bin"
refuse "token ids beyond the vocabulary" --model "$tiny" --tokens "$tmp/big.bin"
refuse "a batch larger than an llm.c shard" --model "$tiny" --tokens "$tmp/tok.bin" --batch 20
refuse "an mlp checkpoint as gpt2 weights" --model "$tiny" --init "$tmp/a.safetensors"
refuse "gpt2 weights of another width" --model "gpt2:layers=1,heads=2,dim=8,seq=16,vocab=256" \
    --init "$tmp/g.safetensors"
refuse "a missing text file" --model "$tiny" --data "$tmp/none.txt"

refuse "a grad-accum that does not divide the rows" --world 2 --batch 8 --grad-accum 3
refuse "a state-dict without a checkpoint dir" --state-dict sharded
refuse "an unknown state-dict" --save-checkpoint "$tmp/x" --state-dict bogus
refuse "ranks per node not dividing the world" --world 4 --strategy hybrid_shard --ranks-per-node 3
refuse "resuming from nothing" --resume "$tmp/no-such-dir"
# --trace writes a database fsdp-trace reads; two identical runs diff as identical
ftrace="$(dirname "$train")/fsdp-trace"
"$train" --model mlp:8,12,3 --world 2 --steps 2 --trace "$tmp/t1.db" >/dev/null 2>&1
"$train" --model mlp:8,12,3 --world 2 --steps 2 --trace "$tmp/t2.db" >/dev/null 2>&1
check "the trace summary reads the run" sh -c "'$ftrace' summary '$tmp/t1.db' | grep -q 'reduce_scatter'"
check "two identical runs diff as identical" \
    sh -c "'$ftrace' diff '$tmp/t1.db' '$tmp/t2.db' >/dev/null"
"$train" --model mlp:8,12,3 --world 2 --steps 2 --strategy no_shard --trace "$tmp/t3.db" \
    >/dev/null 2>&1
"$ftrace" diff "$tmp/t1.db" "$tmp/t3.db" >/dev/null 2>&1
check "another strategy diffs as different" test $? -eq 1
# the run row holds the simulated cluster: 16 ranks on the default profile are two nodes of 8,
# and calibrate takes its topology from there; --ranks-per-node 4 makes four nodes of 4
"$train" --model mlp:8,12,3 --world 16 --batch 32 --steps 1 --trace "$tmp/t16.db" >/dev/null 2>&1
check "calibrate reads two nodes of 8 from a 16-rank run" \
    sh -c "'$ftrace' calibrate '$tmp/t16.db' 2>&1 >/dev/null | grep -q '16 ranks, 8 per node'"
"$train" --model mlp:8,12,3 --world 16 --batch 32 --steps 1 --strategy hybrid_shard \
    --ranks-per-node 4 --trace "$tmp/t16h.db" >/dev/null 2>&1
check "calibrate reads --ranks-per-node 4 as the simulated node" \
    sh -c "'$ftrace' calibrate '$tmp/t16h.db' 2>&1 >/dev/null | grep -q '16 ranks, 4 per node'"

refuse "an unknown cluster profile" --profile nosuch
refuse "an unknown flag" --no-such-flag
refuse "a malformed model" --model mlp:16,,4
refuse "a model of one width" --model mlp:16
refuse "world size 0" --world 0
refuse "a batch not divisible by the world" --world 3 --batch 32
refuse "an unknown strategy" --strategy zero3
refuse "a negative learning rate" --lr -1
refuse "nesterov without momentum" --optim sgd --nesterov
refuse "a mixed-precision dtype that is not a float" --mixed-precision param=int8
refuse "an unknown mixed-precision key" --mixed-precision params=bf16
refuse "a mixed-precision item without a dtype" --mixed-precision param
refuse "a missing init file" --init "$tmp/none.safetensors"
printf 'not a safetensors file' >"$tmp/bad.safetensors"
refuse "a malformed init file" --init "$tmp/bad.safetensors"
refuse "init weights of the wrong shape" --model mlp:6,11,2 --init "$tmp/a.safetensors"
refuse "data of the wrong width" --model mlp:7,10,2 --data "$tmp/a.safetensors"
# a NaN in the first weight: refused, naming the tensor
cp "$tmp/a.safetensors" "$tmp/nan.safetensors"
hlen=$(od -An -t u8 -N 8 "$tmp/nan.safetensors" | tr -d ' ')
printf '\000\000\300\177' | dd of="$tmp/nan.safetensors" bs=1 seek=$((8 + hlen)) conv=notrunc 2>/dev/null
refuse "init weights holding a NaN" --model mlp:6,10,2 --init "$tmp/nan.safetensors"
check "  naming the tensor" grep -q "tensor 'layers\.[01]\.[a-z]*' holds NaN" "$tmp/err"
# loose specs and command lines
refuse "a repeated gpt2 key" --model gpt2:layers=2,layers=3
refuse "gpt2: without keys" --model gpt2:
refuse "a trailing comma in a gpt2 spec" --model gpt2:layers=2,
refuse "a repeated mixed-precision key" --mixed-precision param=bf16,param=fp16
refuse "an empty mixed-precision item" --mixed-precision ,
refuse "--version with an argument" --version extra
refuse "--world without a value" --world
check "  saying it needs a value" grep -q "'--world' needs a value" "$tmp/err"
# output paths are checked before the first step
refuse "--save-checkpoint onto /dev/null" --save-checkpoint /dev/null
refuse "--save-checkpoint onto a regular file" --save-checkpoint "$tmp/a.safetensors"
refuse "--save into a missing directory" --save "$tmp/none/a.safetensors"

exit $fail
