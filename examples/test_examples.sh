#!/bin/sh
# The examples, built against this tree's library: each trains and says so in its exit status.
set -e
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

./own_model 4 60 > "$dir/own.out"
cat "$dir/own.out"
grep -q '^step 60 loss ' "$dir/own.out"
# one rank (NO_SHARD, as PyTorch forces it) and an odd world train as well
./own_model 1 20 > /dev/null
./own_model 3 20 > /dev/null
# under fully_shard (FSDP2) the same program, unchanged but for the config's api, learns the same
./own_model 3 20 fsdp1 > "$dir/own1.out"
./own_model 3 20 fsdp2 > "$dir/own2.out"
awk 'NR==FNR{a[FNR]=$4;next} /^step/{d=a[FNR]-$4; if(d<0)d=-d; if(d>1e-5)exit 1}' \
    "$dir/own1.out" "$dir/own2.out"

./gpt2_checkpoint "$dir/ckpt" "$top_srcdir/data/sqlite3-h.txt" > "$dir/gpt2.out"
cat "$dir/gpt2.out"
test -s "$dir/ckpt/step-00000020/model.safetensors"
test "$(cat "$dir/ckpt/latest")" = step-00000020
# the built-in text when none is given
./gpt2_checkpoint "$dir/ckpt2" > /dev/null
