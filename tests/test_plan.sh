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

"$plan" --model mlp:256,1024,1024,256 --profile h100:nodes=2 --local-batch 64 >"$tmp/run" 2>"$tmp/err"
check "plans and exits 0" test $? -eq 0
check "nothing on stderr" test ! -s "$tmp/err"
check "16 ranks on 2 nodes" grep -q "^cluster h100: 16 ranks, 8 per node" "$tmp/run"
check "a step time, exposed communication" grep -q "^step time [0-9.]* ms, compute [0-9.]* ms, exposed communication [0-9.]* ms" "$tmp/run"
check "an MFU" grep -q "^MFU [0-9.]*% " "$tmp/run"
check "the HBM bandwidth collectives take" grep -q "^memory-bound kernels beside collectives: [0-9.]* ms longer on the HBM bandwidth the collectives take ([0-9.]*% of the step)$" "$tmp/run"
printf '{"base": "h100", "nccl": {"hbm_traffic_factor": 0}}\n' >"$tmp/nohbm.json"
"$plan" --model mlp:256,1024,1024,256 --profile "$tmp/nohbm.json:nodes=2" --local-batch 64 >"$tmp/nohbm" 2>&1
check "no HBM line where collectives take none" \
    sh -c 'grep -q "^step time" "$1" && ! grep -q "^memory-bound kernels" "$1"' sh "$tmp/nohbm"
check "memory by category, ranks folded" grep -q "^  ranks 0-15 .*[0-9]" "$tmp/run"
check "peaks by phase" grep -q "setup *forward *backward *optimizer" "$tmp/run"
check "it fits" grep -q "^fits: yes" "$tmp/run"
check "the batch, global and per rank" grep -q "^batch 1024 rows, 64 per rank, adamw" "$tmp/run"
"$plan" --model mlp:256,1024,1024,256 --profile h100:nodes=2 --batch 1024 >"$tmp/run2" 2>&1
check "deterministic, and --batch is the global batch" cmp -s "$tmp/run" "$tmp/run2"
"$plan" --model gpt2-tiny --world 4 --batch 8 >"$tmp/gb" 2>&1
check "a GPT's batch counts sequences" \
    grep -q "^batch 8 sequences, 2 per rank (128 tokens per rank)" "$tmp/gb"
"$plan" --model mlp:64,64 --world 2 --mixed-precision bf16 >"$tmp/mp_short" 2>&1
"$plan" --model mlp:64,64 --world 2 --mixed-precision param=bf16 >"$tmp/mp_long" 2>&1
check "--mixed-precision bf16 is param=bf16" cmp -s "$tmp/mp_short" "$tmp/mp_long"
check "--mixed-precision bf16 plans in bf16" grep -q "param_dtype bf16" "$tmp/mp_short"
"$plan" --model mlp:64,64 --world 2 --mixed-precision param=bf16,reduce=fp32 >"$tmp/mp_red" 2>&1
check "--mixed-precision takes PyTorch's fields" grep -q "^fits: yes" "$tmp/mp_red"

"$plan" --model mlp:256,1024,1024,256 --world 4 --capacity 1M >"$tmp/small" 2>"$tmp/err"
check "a device too small is an answer, not an error" test $? -eq 0
check "says it does not fit" grep -q "^fits: no: needs" "$tmp/small"
check "no out-of-memory noise" test ! -s "$tmp/err"

"$plan" --model mlp:512,2048,512 --world 8 --batch 32 --sweep >"$tmp/sweep" 2>"$tmp/err"
check "sweeps" test $? -eq 0
check "36 configurations on one node (strategy, prefetch, limiter, fp32 and bf16)" test "$(grep -c '^\(full_shard\|shard_grad_op\|no_shard\) ' "$tmp/sweep")" -eq 36
check "names the fastest that fits" grep -q "^fastest that fits: " "$tmp/sweep"
check "readable column headers" grep -q "^strategy  *bwd prefetch  *limiter  *act ckpt  *precision  *step ms" "$tmp/sweep"
"$plan" --model gpt2-tiny --world 2 >"$tmp/cats" 2>&1
check "memory categories named whole" \
    grep -q "sharded_param unsharded_param low_prec_shard  *gradient optimizer_state activation comm_buffer" "$tmp/cats"
"$plan" --model gpt2-tiny --world 4 --sweep --strategy no_shard --backward-prefetch pre \
    --no-limit-all-gathers >"$tmp/gsweep" 2>&1
check "a GPT sweep tries activation checkpointing and bf16, the settings given fixed" \
    test "$(grep -c '^no_shard  *pre  *off  *\(on\|off\)  *\(fp32\|bf16\) ' "$tmp/gsweep")" -eq 4

# --fit-status: 0 fits, 3 does not (plan and sweep)
"$plan" --model mlp:256,1024,1024,256 --world 4 --capacity 1M --fit-status >/dev/null 2>&1
check "--fit-status: 3 when the plan does not fit" test $? -eq 3
"$plan" --model mlp:64,64 --world 2 --fit-status >/dev/null 2>&1
check "--fit-status: 0 when it fits" test $? -eq 0
"$plan" --model mlp:256,1024,1024,256 --world 4 --capacity 1M --sweep --strategy full_shard \
    --fit-status >"$tmp/nofit" 2>&1
check "--fit-status: 3 when no configuration of a sweep fits" test $? -eq 3
check "a sweep says nothing fits" grep -q "^nothing fits in " "$tmp/nofit"

# GPT-3 175B on 1024 H100s fits only with activation checkpointing (in bf16; fp32 without it
# does not fit either): the sweep is narrowed to those two configurations, a few seconds each.
"$plan" --model gpt3-175b --profile h100:nodes=128 --steps 1 --sweep --strategy full_shard \
    --backward-prefetch pre --limit-all-gathers --mixed-precision bf16 --fit-status \
    >"$tmp/g3" 2>"$tmp/err"
check "gpt3-175b on 1024 H100s: a configuration fits" test $? -eq 0
check "gpt3-175b: not without activation checkpointing" \
    grep -q "^full_shard  *pre  *on  *off  *bf16 .* no$" "$tmp/g3"
check "gpt3-175b: the fastest that fits checkpoints activations in bf16" \
    grep -q "^fastest that fits: full_shard, .*activation checkpointing on, bf16: " "$tmp/g3"

"$plan" --print-profile >"$tmp/h100.json"
check "--print-profile is the shipped preset" cmp -s "$tmp/h100.json" "$srcdir/../traces/profiles/h100.json"
"$plan" --model mlp:64,64 --world 2 --profile "$srcdir/../traces/profiles/a100.json" >"$tmp/a100" 2>&1
check "a JSON profile file" grep -q "^cluster a100: 2 ranks" "$tmp/a100"
# a rate so small that a step's time would be NaN: refused at load, naming the field
for f in gpu.hbm_bytes_per_s host.h2d_bytes_per_s nccl.nic_bytes_per_s; do
    printf '{"base": "h100", "%s": {"%s": 1e-308}}\n' "${f%%.*}" "${f#*.}" >"$tmp/tiny.json"
    refuse "a profile with $f 1e-308" --model llama3-8b --world 16 --local-batch 1 \
        --cpu-offload --profile "$tmp/tiny.json"
    check "  naming the field" grep -q "$f is 1e-308; it must be" "$tmp/err"
done
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

# --plot: the last step drawn from a temporary trace, which is gone afterwards
mkdir "$tmp/ptmp"
TMPDIR="$tmp/ptmp" "$plan" --model mlp:8,16,4 --world 4 --steps 3 --plot "$tmp/plan.svg" \
    >"$tmp/plot" 2>"$tmp/err"
check "--plot exits 0 with nothing on stderr" test $? -eq 0 -a ! -s "$tmp/err"
check "--plot says where the picture went" grep -q "^plot: $tmp/plan.svg (step 3, one rank of each class)" "$tmp/plot"
check "the plot is an SVG" sh -c "grep -q '^<svg' '$tmp/plan.svg' && tail -n 1 '$tmp/plan.svg' | grep -qx '</svg>'"
for name in sharded_param unsharded_param gradient optimizer_state activation comm_buffer reserved \
    compute collective; do
    check "the plot names $name" grep -q ">$name</text>" "$tmp/plan.svg"
done
check "the plot draws one rank of each class" \
    sh -c "grep -q '>rank 0 (stands for 3 ranks: 0-2)</text>' '$tmp/plan.svg' && grep -q '>rank 3</text>' '$tmp/plan.svg'"
check "the plot shows only the last step" \
    sh -c "grep -q '; step 3; ' '$tmp/plan.svg' && ! grep -q ' from 0 ms<' '$tmp/plan.svg'"
check "the temporary trace is removed" test -z "$(ls -A "$tmp/ptmp")"
"$plan" --model mlp:8,16,4 --world 4 --no-symmetry --plot "$tmp/all.svg" --trace "$tmp/plot.db" \
    >"$tmp/plot" 2>&1
check "--plot --no-symmetry draws rank 0" sh -c "grep -q '^plot: .* (step 2, rank 0)' '$tmp/plot' &&
    grep -q '>rank 0</text>' '$tmp/all.svg' && ! grep -q '>rank 1</text>' '$tmp/all.svg'"
check "--plot with --trace keeps the trace" \
    sh -c "'$(dirname "$plan")/fsdp-trace' summary '$tmp/plot.db' | grep -q reduce_scatter"

# --trace: the simulated run's events, readable by fsdp-trace
"$plan" --model mlp:8,16,4 --world 4 --trace "$tmp/plan.db" >/dev/null 2>&1
check "the plan's trace has the run's collectives" \
    sh -c "'$(dirname "$plan")/fsdp-trace' summary '$tmp/plan.db' | grep -q reduce_scatter"

# Llama: the presets' published parameter counts, and plans of real jobs in shape mode
"$plan" --list-models >"$tmp/models"
for pc in "llama2-7b 6738415616" "llama2-13b 13015864320" "llama2-70b 68976648192" \
    "llama3-8b 8030261248" "llama3-70b 70553706496" "llama3.1-405b 405853388800" \
    "llama3.2-1b 1235814400" "llama3.2-3b 3212749824"; do
    set -- $pc
    check "--list-models: $1 has $2 parameters" grep -q "^  $1 *$2 parameters" "$tmp/models"
done
"$plan" --model llama3-8b --profile h100:nodes=8 --mixed-precision bf16 >"$tmp/l8" 2>"$tmp/err"
check "llama3-8b on 64 H100s plans and exits 0" test $? -eq 0
check "llama3-8b: nothing on stderr" test ! -s "$tmp/err"
check "llama3-8b: 33 units, its parameters" grep -q "^model llama3-8b: 33 units, 8.03e+09 parameters" "$tmp/l8"
check "llama3-8b: one 8192-token sequence per rank, it fits" sh -c "grep -q '^batch 64 sequences, 1 per rank (8192 tokens per rank)' '$tmp/l8' && grep -q '^fits: yes' '$tmp/l8'"
"$plan" --model llama3-8b --profile h100:nodes=8 --mixed-precision bf16 \
    --activation-checkpointing full >"$tmp/l8ac" 2>&1
"$plan" --model llama3-8b --profile h100:nodes=8 --mixed-precision bf16 \
    --activation-checkpointing selective-layer:2 >"$tmp/l8sel" 2>&1
act() { awk '/^  ranks 0-63 /{print $10; exit}' "$1"; }
check "llama3-8b: selective-layer checkpointing keeps less than none, more than full" \
    awk -v n="$(act "$tmp/l8")" -v s="$(act "$tmp/l8sel")" -v f="$(act "$tmp/l8ac")" \
    'BEGIN{exit !(f < s && s < n)}'
"$plan" --model llama3-8b --profile h100:nodes=8 --mixed-precision bf16 \
    --activation-checkpointing selective-op >"$tmp/l8op" 2>&1
check "llama3-8b: selective-op checkpointing keeps less than none, more than full" \
    awk -v n="$(act "$tmp/l8")" -v s="$(act "$tmp/l8op")" -v f="$(act "$tmp/l8ac")" \
    'BEGIN{exit !(f < s && s < n)}'
check "llama3-8b: selective-op recomputes less than full: a shorter step" \
    awk 'FNR==1{f++} /^step time /{t[f]=$3} END{exit !(t[1] < t[2])}' "$tmp/l8op" "$tmp/l8ac"
"$plan" --model llama3-70b --profile h100:nodes=8 --mixed-precision bf16 \
    --activation-checkpointing full >"$tmp/l70" 2>"$tmp/err"
check "llama3-70b on 64 H100s plans" grep -q "^fits: " "$tmp/l70"
check "llama3-8b: tokens/s per GPU, a line to grep" \
    grep -q "^[0-9][0-9]* tokens/s per GPU (8192 tokens per rank per step)$" "$tmp/l8"
# PaLM: 6 N + 12 L H hd T, N = 8030261248 - 128256 x 4096, T = 8192: 5.7911e10 FLOP a token
check "llama3-8b: PaLM's FLOPs per token" grep -q "^MFU by PaLM's definition [0-9.]*% (.* = 5.791e+10 FLOP per token" "$tmp/l8"
check "llama3-8b: PaLM's MFU is tokens/s x FLOPs per token / peak" \
    awk '/tokens\/s per GPU/{t=$1} /^MFU by PaLM/{m=$5+0} END{r=t*5.7911e10/989.4e12*100; exit !(m > r - 0.1 && m < r + 0.1)}' "$tmp/l8"
"$plan" --model llama3-8b --profile h100:nodes=8 --mixed-precision bf16 --local-batch 2 \
    --seq 2048 --capacity 0 >"$tmp/l8s" 2>"$tmp/err"
check "--seq and --local-batch: 2 sequences of 2048 tokens per rank" \
    grep -q "^batch 128 sequences, 2 per rank (4096 tokens per rank)" "$tmp/l8s"
check "--capacity 0 is unlimited" grep -q "^fits: yes: .* of unlimited per GPU" "$tmp/l8s"
check "a shorter sequence: fewer attention FLOPs per token" \
    grep -q "^MFU by PaLM's definition [0-9.]*% (.* = 4.825e+10 FLOP per token" "$tmp/l8s"
"$plan" --model mlp:64,64 --world 2 >"$tmp/mlp_tok" 2>&1
check "an mlp has no tokens/s" sh -c "! grep -q 'tokens/s' '$tmp/mlp_tok'"
# GPT-2 with the fused attention in bf16: less memory than the eager [B, H, T, T]
# probabilities, and the attention priced by its causal FLOPs
"$plan" --model gpt2 --local-batch 4 --mixed-precision bf16 >"$tmp/g_eager" 2>&1
"$plan" --model gpt2 --local-batch 4 --mixed-precision bf16 --attention fused >"$tmp/g_fused" 2>&1
"$plan" --model "gpt2:layers=12,heads=12,dim=768,seq=1024,vocab=50257,attention=fused" \
    --local-batch 4 --mixed-precision bf16 >"$tmp/g_spec" 2>&1
check "gpt2 --attention fused: a smaller peak than eager" \
    awk 'FNR == 1 {f++} /^  ranks 0-7 / && !p[f]++ {a[f] = $3 + 0} END {exit !(a[2] < a[1] - 1)}' \
    "$tmp/g_eager" "$tmp/g_fused"
check "gpt2 --attention fused: a faster bf16 step than eager" \
    awk 'FNR == 1 {f++} /^step time/ {t[f] = $3 + 0} END {exit !(t[2] < t[1])}' \
    "$tmp/g_eager" "$tmp/g_fused"
check "attention=fused in the spec is --attention fused" \
    test "$(grep '^step time' "$tmp/g_fused")" = "$(grep '^step time' "$tmp/g_spec")"
refuse "an unknown attention" --model gpt2 --attention flash
refuse "eager attention for a llama" --model llama-tiny --attention eager
refuse "attention for an mlp" --model mlp:4,4 --attention fused
refuse "an unknown attention in a gpt2 spec" --model "gpt2:attention=sdpa"
refuse "--seq beyond the model's positions" --model llama2-7b --seq 8192
refuse "--seq for an mlp" --model mlp:4,4 --seq 16
refuse "a llama spec with heads that kv heads do not divide" --model "llama:heads=4,kv_heads=3"
refuse "an unknown activation checkpointing policy" --model llama-tiny --activation-checkpointing op
refuse "selective-op checkpointing of a gpt" --model gpt2 --activation-checkpointing selective-op
refuse "no model" --world 2
refuse "an unknown model" --model resnet
refuse "an unknown profile" --model mlp:4,4 --profile h300
refuse "an unknown profile option" --model mlp:4,4 --profile h100:gpus=2
refuse "a missing profile file" --model mlp:4,4 --profile "$tmp/none.json"
printf '{"base": "h100", "gpu": {"hbm": 1}}' >"$tmp/bad.json"
refuse "an unknown profile member" --model mlp:4,4 --profile "$tmp/bad.json"
printf '{"base": ' >"$tmp/broken.json"
refuse "malformed profile JSON" --model mlp:4,4 --profile "$tmp/broken.json"
refuse "a world that is not whole nodes" --model mlp:4,4 --world 12
refuse "a bad capacity" --model mlp:4,4 --capacity lots
refuse "an unknown flag" --model mlp:4,4 --no-such-flag
refuse "a batch the world does not divide" --model mlp:4,4 --world 4 --batch 10
refuse "--batch and --local-batch that disagree" --model mlp:4,4 --world 4 --batch 8 --local-batch 4
refuse "a mixed precision that is no float dtype" --model mlp:4,4 --mixed-precision int8
refuse "a repeated profile option" --model mlp:4,4 --profile h100:nodes=2,nodes=3
refuse "a trailing comma in a profile" --model mlp:4,4 --profile h100:nodes=2,
refuse "a profile with an empty option list" --model mlp:4,4 --profile h100:
refuse "--version with an argument" --version extra
refuse "--world without a value" --model mlp:4,4 --world
refuse "--trace into a missing directory" --model mlp:4,4 --trace "$tmp/none/x.db"
refuse "--plot into a missing directory" --model mlp:4,4 --plot "$tmp/none/x.svg"
refuse "--plot onto a directory" --model mlp:4,4 --plot "$tmp"
refuse "--plot with --sweep" --model mlp:4,4 --sweep --plot "$tmp/sweep.svg"
refuse "--plot and --trace into one file" --model mlp:4,4 --plot "$tmp/same" --trace "$tmp/same"

# each tool's --help names every option of the other: its own, or one it has not and why
train="${top_builddir:-..}/tools/fsdp-train"
[ -x "$train" ] || train=../tools/fsdp-train
"$plan" --help >"$tmp/plan_help" && "$train" --help >"$tmp/train_help"
options() { grep -o '^  --[a-z0-9-]*\(, --[a-z0-9-]*\)*' "$1" | grep -o -- '--[a-z0-9-]*' | sort -u; }
unnamed() { # options of help $1 that help $2 does not name
    for o in $(options "$1"); do
        grep -q -- "$o\([^a-z0-9-]\|\$\)" "$2" || printf '%s ' "$o"
    done
}
check "fsdp-plan --help names every fsdp-train option (unnamed: $(unnamed "$tmp/train_help" "$tmp/plan_help"))" \
    test -z "$(unnamed "$tmp/train_help" "$tmp/plan_help")"
check "fsdp-train --help names every fsdp-plan option (unnamed: $(unnamed "$tmp/plan_help" "$tmp/train_help"))" \
    test -z "$(unnamed "$tmp/plan_help" "$tmp/train_help")"

exit $fail
