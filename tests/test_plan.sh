#!/bin/sh
# fsdp-plan from the command line: what it prints, the sweep, the profile, bad input.
set -u
plan="${top_builddir:-..}/tools/fsdp-plan"
[ -x "$plan" ] || plan=../tools/fsdp-plan
srcdir="${srcdir:-.}"
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

"$plan" --model mlp:256,1024,1024,256 --profile h100:nodes=2 --batch 64 >"$tmp/run" 2>"$tmp/err"
check "plans and exits 0" test $? -eq 0
check "nothing on stderr" test ! -s "$tmp/err"
check "16 ranks on 2 nodes" grep -q "^cluster h100: 16 ranks, 8 per node" "$tmp/run"
check "a step time, exposed communication" grep -q "^step time [0-9.]* ms, compute [0-9.]* ms, exposed communication [0-9.]* ms" "$tmp/run"
check "an MFU" grep -q "^MFU [0-9.]*% " "$tmp/run"
check "memory by category, ranks folded" grep -q "^  ranks 0-15 .*[0-9]" "$tmp/run"
check "peaks by phase" grep -q "setup *forward *backward *optimizer" "$tmp/run"
check "it fits" grep -q "^fits: yes" "$tmp/run"
"$plan" --model mlp:256,1024,1024,256 --profile h100:nodes=2 --batch 64 >"$tmp/run2" 2>&1
check "deterministic" cmp -s "$tmp/run" "$tmp/run2"

"$plan" --model mlp:256,1024,1024,256 --world 4 --capacity 1M >"$tmp/small" 2>"$tmp/err"
check "a device too small is an answer, not an error" test $? -eq 0
check "says it does not fit" grep -q "^fits: no: needs" "$tmp/small"
check "no out-of-memory noise" test ! -s "$tmp/err"

"$plan" --model mlp:512,2048,512 --world 8 --batch 32 --sweep >"$tmp/sweep" 2>"$tmp/err"
check "sweeps" test $? -eq 0
check "18 configurations on one node" test "$(grep -c '^\(full_shard\|shard_grad_op\|no_shard\) ' "$tmp/sweep")" -eq 18
check "names the fastest that fits" grep -q "^fastest that fits: " "$tmp/sweep"

"$plan" --print-profile >"$tmp/h100.json"
check "--print-profile is the shipped preset" cmp -s "$tmp/h100.json" "$srcdir/../traces/profiles/h100.json"
"$plan" --model mlp:64,64 --world 2 --profile "$srcdir/../traces/profiles/a100.json" >"$tmp/a100" 2>&1
check "a JSON profile file" grep -q "^cluster a100: 2 ranks" "$tmp/a100"
"$plan" --help >"$tmp/help"
check "--help" grep -q "^usage: fsdp-plan" "$tmp/help"

# GPT-2 under bf16 mixed precision: 2-byte activations (half of f32's, within 2%) and the bf16
# FLOP rate
"$plan" --model gpt2 >"$tmp/g32" 2>&1
"$plan" --model gpt2 --mixed-precision bf16 >"$tmp/gbf16" 2>"$tmp/err"
check "gpt2 bf16 plans and exits 0" test $? -eq 0
check "gpt2 bf16: nothing on stderr" test ! -s "$tmp/err"
check "gpt2 bf16: MFU against the bf16 peak" grep -q "^MFU .* bf16 peak)$" "$tmp/gbf16"
check "gpt2 bf16: activation memory half of f32's" \
    awk 'FNR==1{f++} /^  ranks 0-7 /&&!(f in a){a[f]=$10} END{r=a[2]/a[1]; exit !(r > 0.48 && r < 0.52)}' \
    "$tmp/g32" "$tmp/gbf16"
check "gpt2 bf16: a shorter step than f32" \
    awk 'FNR==1{f++} /^step time /{t[f]=$3} END{exit !(t[2] < t[1])}' "$tmp/g32" "$tmp/gbf16"

# --trace: the simulated run's events, readable by fsdp-trace
"$plan" --model mlp:8,16,4 --world 4 --trace "$tmp/plan.db" >/dev/null 2>&1
check "the plan's trace has the run's collectives" \
    sh -c "'$(dirname "$plan")/fsdp-trace' summary '$tmp/plan.db' | grep -q reduce_scatter"

refuse "no model" --world 2
refuse "an unknown model" --model resnet
refuse "an unknown profile" --model mlp:4,4 --profile h200
refuse "an unknown profile option" --model mlp:4,4 --profile h100:gpus=2
refuse "a missing profile file" --model mlp:4,4 --profile "$tmp/none.json"
printf '{"base": "h100", "gpu": {"hbm": 1}}' >"$tmp/bad.json"
refuse "an unknown profile member" --model mlp:4,4 --profile "$tmp/bad.json"
printf '{"base": ' >"$tmp/broken.json"
refuse "malformed profile JSON" --model mlp:4,4 --profile "$tmp/broken.json"
refuse "a world that is not whole nodes" --model mlp:4,4 --world 12
refuse "a bad capacity" --model mlp:4,4 --capacity lots
refuse "an unknown flag" --model mlp:4,4 --no-such-flag
refuse "a repeated profile option" --model mlp:4,4 --profile h100:nodes=2,nodes=3
refuse "a trailing comma in a profile" --model mlp:4,4 --profile h100:nodes=2,
refuse "a profile with an empty option list" --model mlp:4,4 --profile h100:
refuse "--version with an argument" --version extra
refuse "--world without a value" --model mlp:4,4 --world
refuse "--trace into a missing directory" --model mlp:4,4 --trace "$tmp/none/x.db"

exit $fail
