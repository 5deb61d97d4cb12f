#!/bin/sh
# The progress bar under a pseudo-terminal (util-linux script): every step line and table row
# reads cleanly on the screen, the bar shows before the first step and is gone at the end, and
# there is no bar when stderr is not a terminal.
set -u
tools="${top_builddir:-..}/tools"
[ -x "$tools/fsdp-train" ] || tools=../tools
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

if ! command -v script >/dev/null 2>&1 || ! script -qec true /dev/null </dev/null >/dev/null 2>&1; then
    echo "skip: no util-linux script to run a pseudo-terminal"
    exit 77
fi

check() { # description, command...
    desc=$1
    shift
    if "$@"; then echo "ok: $desc"; else echo "FAILED: $desc"; fail=1; fi
}

# What a terminal shows of each line of the raw output: a carriage return moves to column 0,
# ESC [ K erases to the end of the line, text overwrites.
render() { # raw file, screen file
    awk '
    function put(buf, col, t) { return substr(buf, 1, col) t substr(buf, col + length(t) + 1) }
    {
        n = split($0, segs, "\r"); buf = ""
        for (i = 1; i <= n; i++) {
            seg = segs[i]; col = 0
            while ((k = index(seg, "\033[K")) > 0) {
                buf = put(buf, col, substr(seg, 1, k - 1)); col += k - 1
                buf = substr(buf, 1, col); seg = substr(seg, k + 3)
            }
            buf = put(buf, col, seg)
        }
        print buf
    }' "$1" >"$2"
}

onterm() { # name, command line
    script -qec "$2" /dev/null </dev/null >"$tmp/$1.raw" 2>&1
    echo $? >"$tmp/$1.rc"
    render "$tmp/$1.raw" "$tmp/$1.screen"
}

# every line that names a step is exactly a step line
clean_steps() { # screen file, step line pattern, steps
    test "$(grep -c '^step ' "$1")" -eq "$3" &&
        ! grep 'step [0-9]' "$1" | grep -v "$2" | grep -q . &&
        ! grep -q '\] [0-9]*/' "$1"
}

gpt_line='^step [0-9]* loss [0-9.e+-]* tok/s [0-9]* sim_step_ms [0-9.]* peak_mib [0-9.]*$'
onterm gpt "$tools/fsdp-train --model gpt2-tiny --world 2 --batch 4 --steps 5"
check "gpt2-tiny under a terminal exits 0" test "$(cat "$tmp/gpt.rc")" -eq 0
check "gpt2-tiny: every step line is clean, no bar left" clean_steps "$tmp/gpt.screen" "$gpt_line" 5
check "gpt2-tiny: a bar before the first step" \
    sh -c "grep -a 'step 1 loss' '$tmp/gpt.raw' | grep -q 'setting up | elapsed'"
check "gpt2-tiny: the bar counts steps with a rate, elapsed time and ETA" \
    grep -aq '\] 2/5 | elapsed [0-9]*:[0-9][0-9] eta [0-9]*:[0-9][0-9] | [0-9.]* s\(teps/s\|/step\)' "$tmp/gpt.raw"
check "gpt2-tiny: the summary follows" grep -q '^trained [0-9]* tokens' "$tmp/gpt.screen"

onterm mlp "$tools/fsdp-train --model mlp:16,32,4 --world 2 --steps 4"
check "mlp: every step line is clean, no bar left" \
    clean_steps "$tmp/mlp.screen" \
    '^step [0-9]* loss [0-9.e+-]* rows/s [0-9]* sim_step_ms [0-9.]* peak_mib [0-9.]*$' 4
check "mlp: a bar" grep -aq '\] 3/4 |' "$tmp/mlp.raw"

onterm sweep "$tools/fsdp-plan --model mlp:64,64 --world 2 --sweep"
check "fsdp-plan --sweep under a terminal exits 0" test "$(cat "$tmp/sweep.rc")" -eq 0
check "fsdp-plan --sweep: a bar" grep -aq '\] 1/[0-9]* |' "$tmp/sweep.raw"
check "fsdp-plan --sweep: every row is clean" \
    sh -c "! grep -v '^\(model\|cluster\|software\|batch\|strategy\|sweeping\|fastest\|nothing\|ranks\) ' '$tmp/sweep.screen' |
           grep -v '^\(full_shard\|shard_grad_op\|no_shard\) .* \(yes\|no\)$' | grep -q ."

# stdout on the terminal, stderr not: no bar anywhere
script -qec "$tools/fsdp-train --model mlp:16,32,4 --world 2 --steps 3 2>$tmp/err" /dev/null \
    </dev/null >"$tmp/noterm.raw" 2>&1
check "stderr not a terminal: no bar" test ! -s "$tmp/err"
check "stderr not a terminal: no control characters" sh -c "! grep -aq \"\$(printf '\033')\" '$tmp/noterm.raw'"

exit $fail
