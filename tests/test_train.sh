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

# what a run prints but the wall clock: no rows/s, no "trained" line
sim_only() { # file
    sed -e 's| rows/s [0-9]*||' -e '/^trained /d' "$1"
}
same_sim() { # file, file
    sim_only "$1" >"$1.sim" && sim_only "$2" >"$2.sim" && cmp -s "$1.sim" "$2.sim"
}
other_losses() { # file, file
    grep '^step' "$1" | cut -d' ' -f1-4 >"$1.loss"
    grep '^step' "$2" | cut -d' ' -f1-4 >"$2.loss"
    ! cmp -s "$1.loss" "$2.loss"
}

# the documented main run
"$train" --model mlp:16,32,4 --world 4 --strategy full_shard --optim adamw --lr 1e-2 \
    --steps 10 --trace "$tmp/mr.db" --save-checkpoint "$tmp/mrck" >"$tmp/run" 2>"$tmp/err"
check "trains and exits 0" test $? -eq 0
check "prints 10 step lines as gpt2 does: loss, rows/s, simulated step time, peak" \
    test "$(grep -c '^step [0-9]* loss [0-9.e+-]* rows/s [0-9]* sim_step_ms [0-9.]* peak_mib [0-9.]*$' "$tmp/run")" -eq 10
check "prints rows/s" grep -q '^trained 320 rows in [0-9.]* s: [0-9]* rows/s$' "$tmp/run"
check "prints the losses and the simulated step time" \
    grep -q '^loss [0-9.]* -> [0-9.]* over 10 steps; simulated step time [0-9.]* ms on h100$' "$tmp/run"
check "prints 4 peak lines" test "$(grep -c '^rank [0-3] peak allocated [0-9]* bytes$' "$tmp/run")" -eq 4
check "says where the checkpoint and the trace went" \
    sh -c "tail -n 2 '$tmp/run' | head -n 1 | grep -qx 'checkpoint $tmp/mrck' &&
           tail -n 1 '$tmp/run' | grep -qx 'trace $tmp/mr.db (fsdp-trace summary $tmp/mr.db)'"
check "loss falls" awk '/^step 1 /{a=$4} /^step 10 /{b=$4} END{exit !(b < a)}' "$tmp/run"
check "nothing on stderr" test ! -s "$tmp/err"

# deterministic: two runs print the same, but for the wall clock's rates
"$train" --model mlp:16,32,4 --world 4 --steps 10 --lr 1e-2 >"$tmp/run2" 2>&1
"$train" --model mlp:16,32,4 --world 4 --steps 10 --lr 1e-2 >"$tmp/run3" 2>&1
check "deterministic" same_sim "$tmp/run2" "$tmp/run3"

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
"$train" --model mlp:6,10,2 --world 2 --optim sgd --lr 0.05 --steps 6 | grep '^step' \
    | cut -d' ' -f1-4 >"$tmp/six"
"$train" --model mlp:6,10,2 --world 2 --optim sgd --lr 0.05 --steps 3 --save "$tmp/c.safetensors" >/dev/null
"$train" --model mlp:6,10,2 --world 2 --optim sgd --lr 0.05 --steps 3 --init "$tmp/c.safetensors" \
    | grep '^step' | awk '{print "step", $2 + 3, "loss", $4}' >"$tmp/three"
check "continuing from --save reproduces the uninterrupted losses" \
    sh -c "tail -n 3 '$tmp/six' | cmp -s - '$tmp/three'"

# checkpoints: a resumed run continues with exactly the losses of an uninterrupted one
for sd in full sharded; do
    "$train" --model mlp:6,10,2 --world 2 --steps 6 --lr 1e-2 | grep '^step' | cut -d' ' -f1-4 \
        >"$tmp/u6"
    "$train" --model mlp:6,10,2 --world 2 --steps 3 --lr 1e-2 --save-checkpoint "$tmp/ck-$sd" \
        --state-dict $sd >/dev/null
    "$train" --model mlp:6,10,2 --world 2 --steps 6 --lr 1e-2 --resume "$tmp/ck-$sd" \
        | grep '^step' | cut -d' ' -f1-4 >"$tmp/r6"
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
check "bf16 mixed precision computes in bf16" other_losses "$tmp/bf16" "$tmp/run2"
"$train" --model mlp:8,12,3 --world 2 --batch 8 --steps 3 --strategy shard_grad_op \
    --mixed-precision param=float16,reduce=float32 >"$tmp/fp16" 2>&1
check "fp16 mixed precision with PyTorch's names trains" test "$(grep -c '^step' "$tmp/fp16")" -eq 3
# the short form is MixedPrecision(param_dtype=D): reduce_dtype and buffer_dtype at their defaults
"$train" --model mlp:8,12,3 --world 2 --batch 8 --steps 3 --mixed-precision bf16 >"$tmp/mp_short" 2>&1
"$train" --model mlp:8,12,3 --world 2 --batch 8 --steps 3 --mixed-precision param=bf16 >"$tmp/mp_long" 2>&1
check "--mixed-precision bf16 is param=bf16" same_sim "$tmp/mp_short" "$tmp/mp_long"
check "--mixed-precision bf16 trains" test "$(grep -c '^step' "$tmp/mp_short")" -eq 3
refuse "a mixed precision that is no float dtype" --mixed-precision int8
# --batch is the global batch, --local-batch each rank's
"$train" --model mlp:8,12,3 --world 4 --local-batch 2 --steps 3 >"$tmp/lb" 2>&1
"$train" --model mlp:8,12,3 --world 4 --batch 8 --steps 3 >"$tmp/gb" 2>&1
check "--local-batch 2 on 4 ranks is --batch 8" same_sim "$tmp/lb" "$tmp/gb"
refuse "--batch and --local-batch that disagree" --world 4 --batch 8 --local-batch 4

# ---- GPT-2 ----
tiny="gpt2:layers=1,heads=2,dim=16,seq=16,vocab=256"
"$train" --model gpt2-tiny --world 2 --batch 4 --steps 3 --lr 3e-3 >"$tmp/gpt" 2>"$tmp/err"
check "gpt2-tiny trains on the default corpus and exits 0" test $? -eq 0
check "gpt2: nothing on stderr" test ! -s "$tmp/err"
check "gpt2: prints 3 loss lines" test "$(grep -c '^step [0-9]* loss ' "$tmp/gpt")" -eq 3
check "gpt2: prints tokens/s" grep -q '^trained 768 tokens in [0-9.]* s: [0-9]* tokens/s$' "$tmp/gpt"
check "gpt2: prints 2 peak lines" test "$(grep -c '^rank [01] peak allocated [0-9]* bytes$' "$tmp/gpt")" -eq 2
# the fused attention trains to the eager losses within f32 rounding, with less memory
"$train" --model gpt2-tiny --world 2 --batch 4 --steps 3 --lr 3e-3 --attention fused \
    >"$tmp/gpt_fused" 2>"$tmp/err"
check "gpt2 --attention fused trains and exits 0" test $? -eq 0
check "gpt2 --attention fused: the eager losses within 1e-5" \
    awk 'NR==FNR{if($1=="step")a[$2]=$4;next} $1=="step"{n++; d=a[$2]-$4; if(d<0)d=-d; if(d>1e-5*$4)exit 1} END{exit n!=3}' \
    "$tmp/gpt" "$tmp/gpt_fused"
check "gpt2 --attention fused: a lower peak" \
    awk 'NR==FNR{if($3=="peak")a[$2]=$5;next} $3=="peak"{n++; if(!($5<a[$2]))exit 1} END{exit n!=2}' \
    "$tmp/gpt" "$tmp/gpt_fused"
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
# micro-batches of 64 rows: wte packed once a step from the second on (the log says so), read by
# the two micro-batches after
FSDP_LOG_LEVEL=debug "$train" --model "$tiny" --world 1 --batch 4 --steps 3 --grad-accum 4 \
    2>"$tmp/pc1.err" | awk '/^step/{print $1, $2, $3, $4, $7, $8, $9, $10}' >"$tmp/pc1"
FSDP_LOG_LEVEL=debug "$train" --model "$tiny" --world 1 --batch 4 --steps 3 --grad-accum 4 \
    --no-pack-cache 2>"$tmp/pc2.err" | awk '/^step/{print $1, $2, $3, $4, $7, $8, $9, $10}' >"$tmp/pc2"
check "gpt2: the kept packed LM head changes no loss, time or memory" \
    sh -c "test -s '$tmp/pc1' && cmp -s '$tmp/pc1' '$tmp/pc2' &&
        grep -q 'pack cache: .* packed' '$tmp/pc1.err' &&
        ! grep -q 'pack cache' '$tmp/pc2.err'"

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
# Llama 3's shards: uint32 tokens (magic 20240801, version 7)
shard32() { # path ntokens first-token
    { le32 20240801; le32 7; le32 "$2"; head -c 1012 /dev/zero
      i=0; while [ $i -lt "$2" ]; do le32 $((($3 + i * 37) % 256 + $3 / 256 * 256)); i=$((i + 1)); done
    } >"$1"
}
shard32 "$tmp/tok32.bin" 300 0
shard32 "$tmp/big32.bin" 300 128000
"$train" --model llama-tiny --world 2 --batch 4 --seq 32 --steps 3 --tokens "$tmp/tok32.bin" \
    >"$tmp/lk" 2>&1
check "llama on an llm.c uint32 shard" test "$(grep -c '^step' "$tmp/lk")" -eq 3
check "llama names the uint32 shard" grep -q "data: llm.c shard $tmp/tok32.bin, 300 tokens" "$tmp/lk"

# HF weights: --save writes them, --init reads them back, across world sizes
"$train" --model "$tiny" --world 2 --batch 6 --steps 2 --save "$tmp/g.safetensors" >/dev/null 2>&1
check "gpt2: save writes a file" test -s "$tmp/g.safetensors"
check "gpt2: save writes HF's config.json beside it" \
    grep -q '"model_type": "gpt2"' "$tmp/config.json"
check "gpt2: config.json has the model's shape" \
    sh -c "grep -q '\"n_layer\": ' '$tmp/config.json' && grep -q '\"activation_function\": \"gelu_new\"' '$tmp/config.json'"
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

# resuming says which step it loaded; a checkpoint at or past --steps is nothing to train
"$train" --model "$tiny" --world 2 --batch 4 --steps 6 --resume "$tmp/gck" >"$tmp/res" 2>&1
check "gpt2: resuming says which step it loaded" grep -q "^resumed from $tmp/gck at step 3$" "$tmp/res"
"$train" --model "$tiny" --world 2 --batch 4 --steps 2 --resume "$tmp/gck" >"$tmp/res" 2>"$tmp/err"
check "gpt2: resuming past --steps exits non-zero" test $? -ne 0
check "gpt2: and says why" \
    grep -q '^fsdp-train: error: --resume .* at step 3 and --steps is 2: nothing to train' "$tmp/err"
"$train" --model mlp:8,12,3 --world 2 --steps 3 --save-checkpoint "$tmp/mck" >/dev/null 2>&1
"$train" --model mlp:8,12,3 --world 2 --steps 3 --resume "$tmp/mck" >"$tmp/res" 2>"$tmp/err"
check "mlp: resuming at --steps exits non-zero" test $? -ne 0
check "mlp: and says why in one line" \
    sh -c "test \$(grep -c . '$tmp/err') -eq 1 && grep -q 'nothing to train' '$tmp/err'"
# FSDP_LOG_LEVEL that names no level is said at once
FSDP_LOG_LEVEL=verbose "$train" --model mlp:8,12,3 --world 2 --steps 1 >/dev/null 2>"$tmp/err"
check "FSDP_LOG_LEVEL=verbose is said in one line" \
    grep -q "^fsdp-train: warning: FSDP_LOG_LEVEL='verbose' is not one of" "$tmp/err"
# the trace records the command as typed, not libtool's binary under .libs/
"$train" --model mlp:8,12,3 --world 2 --steps 1 --trace "$tmp/cl.db" --data "$tmp/no such.st" \
    >/dev/null 2>&1
"$train" --model mlp:8,12,3 --world 2 --steps 1 --trace "$tmp/cl.db" >/dev/null 2>&1
"$(dirname "$train")/fsdp-trace" summary "$tmp/cl.db" >"$tmp/cl" 2>&1
check "the trace's command line is the program called, not libtool's binary under .libs/" \
    grep -q "^command: [^ ]*tools/fsdp-train --model mlp:8,12,3 --world 2 --steps 1 --trace $tmp/cl.db\$" "$tmp/cl"
# the demo's corpus is fixed, so the README's first loss reproduces
"$train" --model gpt2-tiny --world 4 --strategy full_shard --optim adamw --lr 3e-3 --no-decay-1d \
    --clip-grad-norm 1.0 --batch 32 --steps 1 --data "${top_srcdir:-..}/data/sqlite3-h.txt" \
    >"$tmp/demo" 2>&1
check "the demo's first step prints the README's loss" \
    grep -q "^step 1 loss 5.53065491 .* sim_step_ms 1.614 peak_mib 6.37$" "$tmp/demo"
# (on a fixed text: the default corpus, the sources, changes with every commit)
check "gpt2: the first loss is about ln 256" awk '/^step 1 /{exit !($4 > 5.2 && $4 < 5.8)}' "$tmp/demo"
# --ops: eager PyTorch's op sequences (the preset's) take longer than one fused kernel each
"$train" --model gpt2-tiny --world 2 --steps 2 --ops eager >"$tmp/ops_e" 2>&1
"$train" --model gpt2-tiny --world 2 --steps 2 --ops fused >"$tmp/ops_f" 2>&1
"$train" --model gpt2-tiny --world 2 --steps 2 >"$tmp/ops_d" 2>&1
ops_ms() { sed -n 's/.*simulated step time \([0-9.]*\) ms.*/\1/p' "$1"; }
check "--ops fused prices a shorter step than eager, the same losses" \
    awk -v e="$(ops_ms "$tmp/ops_e")" -v f="$(ops_ms "$tmp/ops_f")" 'BEGIN { exit !(f > 0 && f < e) }'
check "--ops eager is the preset's" test "$(ops_ms "$tmp/ops_e")" = "$(ops_ms "$tmp/ops_d")"
check "--ops leaves the losses" test "$(grep '^loss' "$tmp/ops_e" | cut -d';' -f1)" = "$(grep '^loss' "$tmp/ops_f" | cut -d';' -f1)"
refuse "an unknown --ops" --model gpt2-tiny --ops compiled
refuse "an unknown gpt preset" --model gpt2-huge
refuse "an unknown backend" --backend tpu
# without a device (or without the gpu module) this is refused for that; with one, for a
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
# ---- Llama ----
"$train" --model llama-tiny --world 2 --batch 4 --steps 3 --lr 3e-3 >"$tmp/ll" 2>"$tmp/err"
check "llama-tiny trains on the default corpus and exits 0" test $? -eq 0
check "llama: nothing on stderr" test ! -s "$tmp/err"
check "llama: prints its parameters" grep -q '^model llama-tiny: 125248 parameters (layers=2 heads=4 kv_heads=2 dim=64 ffn=176 seq=64 vocab=256)' "$tmp/ll"
check "llama: the first loss is about ln 256" awk '/^step 1 /{exit !($4 > 5.2 && $4 < 5.8)}' "$tmp/ll"
lt="llama:layers=2,heads=4,kv_heads=2,dim=32,ffn=48,seq=16,vocab=256"
for s in full_shard shard_grad_op no_shard hybrid_shard hybrid_shard_zero2; do
    "$train" --model "$lt" --world 4 --ranks-per-node 2 --batch 8 --steps 4 --lr 1e-2 \
        --data "$tmp/fox.txt" --strategy $s | grep '^step' | awk '{print $4}' >"$tmp/lloss.$s"
done
for s in full_shard shard_grad_op hybrid_shard hybrid_shard_zero2; do
    check "llama: $s and no_shard agree" awk 'NR==FNR{a[FNR]=$1;next}{d=a[FNR]-$1; if(d<0)d=-d; if(d>1e-5*$1)exit 1} END{exit !(FNR == 4)}' "$tmp/lloss.$s" "$tmp/lloss.no_shard"
done
"$train" --model "$lt" --world 2 --batch 4 --steps 4 --lr 1e-2 --data "$tmp/fox.txt" \
    | grep '^step' | cut -d' ' -f1-4 >"$tmp/l1"
for ac in --checkpoint-activations "--activation-checkpointing full" \
    "--activation-checkpointing selective-layer" "--activation-checkpointing selective-layer:1" \
    "--activation-checkpointing selective-op"; do
    # shellcheck disable=SC2086
    "$train" --model "$lt" --world 2 --batch 4 --steps 4 --lr 1e-2 --data "$tmp/fox.txt" $ac \
        | grep '^step' | cut -d' ' -f1-4 >"$tmp/l2"
    check "llama: $ac changes no loss" cmp -s "$tmp/l1" "$tmp/l2"
done
"$train" --model llama-tiny --world 2 --batch 4 --steps 20 --lr 3e-3 --data "$tmp/fox.txt" \
    --mixed-precision param=bf16,reduce=fp32 --cpu-offload >"$tmp/lbf16" 2>"$tmp/err"
check "llama bf16 with CPU offload trains and exits 0" test $? -eq 0
check "llama bf16: nothing on stderr" test ! -s "$tmp/err"
check "llama bf16: the loss falls over 20 steps" \
    awk '/^step 1 /{a=$4} /^step 20 /{b=$4} END{exit !(b < a - 1.0)}' "$tmp/lbf16"
"$train" --model "$lt" --world 2 --batch 4 --steps 2 --lr 1e-2 --data "$tmp/fox.txt" \
    --save-checkpoint "$tmp/llck" --state-dict sharded >/dev/null 2>&1
"$train" --model "$lt" --world 2 --batch 4 --steps 4 --lr 1e-2 --data "$tmp/fox.txt" \
    --resume "$tmp/llck" | grep '^step' | cut -d' ' -f1-4 >"$tmp/l3"
check "llama: resume from a sharded checkpoint continues the loss sequence exactly" \
    sh -c "tail -n 2 '$tmp/l1' | cmp -s - '$tmp/l3'"
"$train" --model "$lt,tie=1" --world 2 --batch 4 --steps 1 --data "$tmp/fox.txt" \
    --save-checkpoint "$tmp/llfull" >/dev/null 2>&1
grep -a -o '"[a-z_.0-9]*weight"' "$tmp/llfull/step-00000001/model.safetensors" | sort >"$tmp/llnames"
check "llama: a full checkpoint holds HF's 20 tensor names, no lm_head when tied" sh -c \
    "test \$(wc -l <'$tmp/llnames') -eq 20 && grep -q '\"model.layers.1.self_attn.k_proj.weight\"' '$tmp/llnames' && grep -q '\"model.norm.weight\"' '$tmp/llnames' && ! grep -q lm_head '$tmp/llnames'"
# --consolidate: a sharded checkpoint as one file, the bytes of a full checkpoint's model
"$train" --model "$lt" --world 2 --batch 4 --steps 2 --lr 1e-2 --data "$tmp/fox.txt" \
    --save-checkpoint "$tmp/llck-full" >/dev/null 2>&1
"$train" --consolidate "$tmp/llck" --save "$tmp/llcons.safetensors" >"$tmp/cons" 2>"$tmp/err"
check "llama: --consolidate of a sharded checkpoint says what it wrote" \
    sh -c "test ! -s '$tmp/err' && grep -qx 'consolidated $tmp/llck (step 2) into $tmp/llcons.safetensors' '$tmp/cons'"
check "llama: the consolidated file is a full checkpoint's model.safetensors" \
    cmp -s "$tmp/llcons.safetensors" "$tmp/llck-full/step-00000002/model.safetensors"
for sd in sharded full; do
    "$train" --model "$tiny" --world 4 --batch 4 --steps 2 --save-checkpoint "$tmp/gcons-$sd" \
        --state-dict $sd >/dev/null 2>&1
done
"$train" --consolidate "$tmp/gcons-sharded" --save "$tmp/gcons.safetensors" >/dev/null 2>&1
check "gpt2: the consolidated file is a full checkpoint's model.safetensors (HF names)" \
    sh -c "cmp -s '$tmp/gcons.safetensors' '$tmp/gcons-full/step-00000002/model.safetensors' &&
           grep -aq '\"transformer.h.0.attn.c_attn.weight\"' '$tmp/gcons.safetensors'"
"$train" --consolidate "$tmp/gcons-full" --save "$tmp/gcons2.safetensors" >/dev/null 2>&1
check "gpt2: consolidating a full checkpoint writes its model.safetensors" \
    cmp -s "$tmp/gcons2.safetensors" "$tmp/gcons-full/step-00000002/model.safetensors"
for sd in sharded full; do
    "$train" --model mlp:8,12,3 --world 3 --batch 12 --steps 2 --strategy shard_grad_op \
        --save-checkpoint "$tmp/mcons-$sd" --state-dict $sd >/dev/null 2>&1
done
"$train" --consolidate "$tmp/mcons-sharded" --save "$tmp/mcons.safetensors" >/dev/null 2>&1
check "mlp: the consolidated file is a full checkpoint's model.safetensors" \
    cmp -s "$tmp/mcons.safetensors" "$tmp/mcons-full/step-00000002/model.safetensors"
"$train" --model mlp:8,12,3 --world 2 --steps 1 --save-checkpoint "$tmp/mcons-local" \
    --state-dict local >/dev/null 2>&1
refuse "consolidating a local checkpoint" --consolidate "$tmp/mcons-local" --save "$tmp/x.st"
refuse "--consolidate without --save" --consolidate "$tmp/mcons-sharded"
refuse "--consolidate with --resume" --consolidate "$tmp/mcons-sharded" --save "$tmp/x.st" \
    --resume "$tmp/mcons-sharded"
refuse "--consolidate of no checkpoint" --consolidate "$tmp/nothing here" --save "$tmp/x.st"
refuse "an unknown llama preset" --model llama-huge
refuse "kv heads that do not divide the heads" --model "llama:heads=4,kv_heads=3"
refuse "an unknown activation checkpointing policy" --model llama-tiny --activation-checkpointing some
refuse "selective-op checkpointing of a gpt" --model "$tiny" --activation-checkpointing selective-op
# --save and --init: HF's model.safetensors, saved on 4 ranks and loaded on 2; with lr 0 the
# loaded weights come out as they went in, and a checkpoint of another shape is refused
"$train" --model "$lt" --world 4 --batch 4 --steps 2 --lr 1e-2 --data "$tmp/fox.txt" \
    --save "$tmp/llhf.safetensors" >/dev/null 2>&1
"$train" --model "$lt" --world 2 --batch 4 --steps 1 --lr 0 --data "$tmp/fox.txt" \
    --init "$tmp/llhf.safetensors" --save "$tmp/llhf2.safetensors" >"$tmp/llinit" 2>"$tmp/err"
check "llama: --init of an HF checkpoint trains and exits 0" test $? -eq 0
check "llama: --save -> --init -> --save round trip" \
    cmp -s "$tmp/llhf.safetensors" "$tmp/llhf2.safetensors"
check "llama: --save writes LlamaConfig's config.json beside it" sh -c \
    "grep -q '\"model_type\": \"llama\"' '$tmp/config.json' && grep -q '\"num_key_value_heads\": 2,' '$tmp/config.json'"
refuse "--init of another llama's checkpoint" --model "$lt,ffn=40" --init "$tmp/llhf.safetensors"
refuse "a sequence longer than the positions" --model "$tiny" --seq 17
# a default batch the world does not divide is rounded up, and that is said
"$train" --model "$tiny" --world 3 --steps 1 >"$tmp/w3" 2>"$tmp/err"
check "gpt2 on 3 ranks: the default batch rounded up, with a note" \
    sh -c "grep -q 'global batch 9 x ' '$tmp/w3' && test \$(grep -c . '$tmp/err') -eq 1 &&
           grep -q '^fsdp-train: note: global batch 9 sequences: the default 8 rounded up' '$tmp/err'"
"$train" --model mlp:8,12,3 --world 3 --steps 1 >"$tmp/w3m" 2>"$tmp/err"
check "mlp on 3 ranks: the default batch rounded up, with a note" \
    grep -q '^fsdp-train: note: global batch 33 rows: the default 32 rounded up' "$tmp/err"
refuse "llm.c tokens for an mlp" --tokens "$tmp/tok.bin"
refuse "text and tokens together" --model "$tiny" --data "$tmp/text.txt" --tokens "$tmp/tok.bin"
refuse "an llm.c shard with a bad magic" --model "$tiny" --tokens "$tmp/badmagic.bin"
refuse "an llm.c shard shorter than its count" --model "$tiny" --tokens "$tmp/short.bin"
refuse "token ids beyond the vocabulary" --model "$tiny" --tokens "$tmp/big.bin"
refuse "uint32 token ids beyond the vocabulary" --model llama-tiny --tokens "$tmp/big32.bin"
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
refuse "a repeated llama key" --model llama:layers=2,layers=3
check "  naming it" grep -q "layers is given twice" "$tmp/err"
refuse "llama: without keys" --model llama:
refuse "an eps that is no float" --model llama:eps=1e300
check "  naming the key and what is allowed" \
    grep -q "eps needs a finite number >= 0 (a float), not '1e300'" "$tmp/err"
refuse "a repeated mixed-precision key" --mixed-precision param=bf16,param=fp16
refuse "an empty mixed-precision item" --mixed-precision ,
refuse "--version with an argument" --version extra
refuse "--world without a value" --world
check "  saying it needs a value" grep -q "'--world' needs a value" "$tmp/err"
# output paths are checked before the first step
refuse "--save-checkpoint onto /dev/null" --save-checkpoint /dev/null
refuse "--save-checkpoint onto a regular file" --save-checkpoint "$tmp/a.safetensors"
refuse "--save into a missing directory" --save "$tmp/none/a.safetensors"
# a checkpoint period past the last step would never save: refused before any work
refuse "--checkpoint-every past --steps" --steps 3 --checkpoint-every 4 \
    --save-checkpoint "$tmp/every"
check "  saying so" grep -q "checkpoint-every 4 is more than --steps 3" "$tmp/err"
check "  creating nothing" test ! -e "$tmp/every"
"$train" --model mlp:8,12,3 --steps 3 --checkpoint-every 3 --save-checkpoint "$tmp/every" \
    >/dev/null 2>&1
check "--checkpoint-every equal to --steps is accepted" test -s "$tmp/every/latest"
# a model too large for the machine's memory (every simulated rank's memory is this process's):
# refused at once, naming fsdp-plan, not killed by the kernel halfway through its first step
refuse "llama3.2-1b with 1 GiB of host memory" --model llama3.2-1b --world 2 --host-memory 1G
check "  saying what it needs and what to run" \
    grep -q "llama3.2-1b: its 1.236e+09 parameters, their gradients and AdamW's state alone take 18.4 GiB.* 1 GiB (--host-memory.*fsdp-plan --model llama3.2-1b" "$tmp/err"
refuse "an mlp of 4.3e9 parameters with 1 GiB" --model mlp:65536,65536 --host-memory 1G
# past the up-front bound, the simulator's own: the rank that crosses it fails, the run ends
"$train" --model gpt2-tiny --world 2 --steps 2 --host-memory 3M >"$tmp/out" 2>"$tmp/err"
rc=$?
check "a run past --host-memory fails with the rank's line" sh -c "test $rc -eq 1 &&
    grep -q \"error: rank [01]: data mode holds every simulated rank's memory in this machine's: [0-9]* more bytes would take the world's [0-9]* past the 3145728\" '$tmp/err'"
# the ranks that stopped only because a peer failed: the first says so, the rest in one line
"$train" --model gpt2-tiny --world 8 --steps 2 --host-memory 12M >"$tmp/out" 2>"$tmp/err"
check "eight ranks, one failing: one line of a peer's failure and a count of the rest" sh -c \
    "test \$(grep -c 'a peer rank failed\$' '$tmp/err') -eq 1 &&
     grep -q '^fsdp-train: error: [0-9]* more ranks stopped the same way (a peer rank failed)\$' '$tmp/err'"

exit $fail
