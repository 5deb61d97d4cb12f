#!/bin/sh
# The tools' standard output on /dev/full (a full disk, as far as a writer can tell): every tool
# and verb that prints exits 2 with one line naming the standard output and the reason, never 0
# with its output cut short; the same commands into /dev/null exit 0, saying nothing.
set -u
bin="${top_builddir:-..}/tools"
[ -x "$bin/fsdp-train" ] || bin=../tools
train="$bin/fsdp-train"
ftrace="$bin/fsdp-trace"
plan="$bin/fsdp-plan"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

check() { # description, command...
    desc=$1
    shift
    if "$@"; then echo "ok: $desc"; else echo "FAILED: $desc"; fail=1; fi
}

if ! [ -c /dev/full ] || (echo x >/dev/full) 2>/dev/null; then
    echo "skipped: no /dev/full here (a device whose writes fail with ENOSPC)"
    exit 77
fi

"$train" --model mlp:8,12,3 --world 2 --steps 2 --trace "$tmp/t.db" >/dev/null 2>&1
"$train" --model mlp:8,12,3 --world 2 --steps 2 --trace "$tmp/u.db" >/dev/null 2>&1

# tool (for the message), then the command; its stderr's other lines (calibrate's fit report)
# are its own, so the one error line is counted among the tool's error lines. The reason is the
# write's own (ENOSPC) when stdio still holds what failed, and "a write to it failed" when the
# write that failed was a long one that stdio made at once
full() {
    tool=$1
    shift
    "$@" >/dev/full 2>"$tmp/err"
    rc=$?
    check "$tool $2 >/dev/full: exit 2 (got $rc)" test $rc -eq 2
    check "  with one error line" test "$(grep -c ': error: ' "$tmp/err")" -eq 1
    check "  naming the standard output and why" grep -Eq "^$tool: error: cannot write the \
standard output: (no space left on device|a write to it failed) \(what it holds is cut short\)$" \
        "$tmp/err"
    "$@" >/dev/null 2>"$tmp/err"
    check "  and into /dev/null: exit 0" test $? -eq 0
}

full fsdp-trace "$ftrace" calibrate "$tmp/t.db"
full fsdp-trace "$ftrace" summary "$tmp/t.db"
full fsdp-trace "$ftrace" diff "$tmp/t.db" "$tmp/u.db"
full fsdp-trace "$ftrace" --help
full fsdp-plan "$plan" --print-profile
full fsdp-plan "$plan" --model llama3-8b --world 64 --local-batch 1 --seq 2048
full fsdp-plan "$plan" --list-models
full fsdp-train "$train" --model mlp:8,12,3 --world 2 --steps 2
full fsdp-train "$train" --help

# an error that stops the tool first keeps its own status and line, the write error after it
"$ftrace" summary "$tmp/none.db" >/dev/full 2>"$tmp/err"
check "a failing verb on /dev/full still exits 2" test $? -eq 2

# stdout closed by the caller, nothing written: no failure (a tool that prints nothing here)
"$ftrace" export --chrome "$tmp/c.json" "$tmp/t.db" >&- 2>"$tmp/err"
check "stdout closed and nothing written: exit 0" test $? -eq 0
check "  saying nothing" test ! -s "$tmp/err"

exit $fail
