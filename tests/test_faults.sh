#!/bin/sh
# Faults from outside the program, each bounded to a few seconds: traces on a read-only
# directory, FIFOs and directories given as files.
set -u
bin="${top_builddir:-..}/tools"
[ -x "$bin/fsdp-train" ] || bin=../tools
train="$bin/fsdp-train"
ftrace="$bin/fsdp-trace"
tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
fail=0

check() { # description, command...
    desc=$1
    shift
    if "$@"; then echo "ok: $desc"; else echo "FAILED: $desc"; fail=1; fi
}

# runs a command with $1 read-only: chmod for a user, a read-only bind mount for root (which
# chmod does not stop); status 77 when neither is possible here
read_only() { # directory, command...
    dir=$1
    shift
    if [ "$(id -u)" -ne 0 ]; then
        chmod a-w "$dir" && "$@"
        rc=$?
        chmod u+w "$dir"
        return $rc
    fi
    command -v unshare >/dev/null 2>&1 || return 77
    unshare -m true 2>/dev/null || return 77
    unshare -m sh -c 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" || exit 77
        exec "$@"' "$dir" "$@"
}

# a WAL trace in a read-only directory is read (it cannot get its -shm file there)
mkdir "$tmp/ro"
"$train" --model mlp:8,12,3 --world 2 --steps 3 --trace "$tmp/ro/t.db" >/dev/null 2>&1
read_only "$tmp/ro" sh -c "'$ftrace' summary '$tmp/ro/t.db' >'$tmp/sum' 2>'$tmp/err'"
rc=$?
if [ $rc -eq 77 ]; then
    echo "skipped: no way to make a read-only directory here"
else
    check "a trace in a read-only directory is read" test $rc -eq 0
    check "  with its steps" grep -q "3 steps" "$tmp/sum"
    check "  and nothing on stderr" test ! -s "$tmp/err"
fi

# FIFOs and directories are refused with one line, at once
mkfifo "$tmp/fifo"
timeout 10 "$ftrace" summary "$tmp/fifo" >/dev/null 2>"$tmp/err"
check "fsdp-trace summary FIFO is refused" test $? -ne 0
check "  saying it is a FIFO" grep -q "is a FIFO, not a regular file" "$tmp/err"
timeout 10 "$ftrace" summary "$tmp" >/dev/null 2>"$tmp/err"
check "fsdp-trace summary DIR says it is a directory" grep -q "is a directory, not a regular file" "$tmp/err"
timeout 10 "$train" --model gpt2-tiny --tokens "$tmp/fifo" --steps 1 >/dev/null 2>"$tmp/err"
check "--tokens FIFO is refused" test $? -ne 0
check "  saying it is a FIFO" grep -q "is a FIFO, not a regular file" "$tmp/err"
timeout 10 "$train" --model gpt2-tiny --tokens "$tmp" --steps 1 >/dev/null 2>"$tmp/err"
check "--tokens DIR says it is a directory" grep -q "is a directory, not a regular file" "$tmp/err"

exit $fail
