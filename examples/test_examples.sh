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

./gpt2_checkpoint "$dir/ckpt" "$top_srcdir/data/sqlite3-h.txt" > "$dir/gpt2.out"
cat "$dir/gpt2.out"
test -s "$dir/ckpt/step-00000020/model.safetensors"
test "$(cat "$dir/ckpt/latest")" = step-00000020
# the built-in text when none is given
./gpt2_checkpoint "$dir/ckpt2" > /dev/null
