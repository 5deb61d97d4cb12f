#!/bin/sh
# A full disk under a traced run and under checkpoint saves, each bounded to a few seconds: a
# small tmpfs, mounted in a mount namespace of this script's own (unshare -m as root, unshare -r -m
# in a user namespace otherwise), so a killed test leaves no mount behind. Where neither works
# (a container without CAP_SYS_ADMIN and without user namespaces), root mounts it directly; else
# the test is skipped (77), saying why.
set -u
bin="${top_builddir:-..}/tools"
[ -x "$bin/fsdp-train" ] || bin=../tools
train="$bin/fsdp-train"
ftrace="$bin/fsdp-trace"

if [ -z "${FSDP_FULL_DISK_NS:-}" ] && command -v unshare >/dev/null 2>&1; then
    export FSDP_FULL_DISK_NS=1
    if [ "$(id -u)" -eq 0 ]; then ns="-m"; else ns="-r -m"; fi
    # shellcheck disable=SC2086
    if unshare $ns true 2>/dev/null; then
        exec unshare $ns sh "$0" "$@"
    fi
fi

tmp=$(mktemp -d)
full=""
trap '[ -n "$full" ] && umount "$full" 2>/dev/null; rm -rf "$tmp"' EXIT
fail=0

check() { # description, command...
    desc=$1
    shift
    if "$@"; then echo "ok: $desc"; else echo "FAILED: $desc"; fail=1; fi
}

mkdir "$tmp/full"
if ! mount -t tmpfs -o size=256k tmpfs "$tmp/full" 2>"$tmp/err"; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "skipped: mounting a small tmpfs needs root or a user namespace, and neither is here" \
            "($(head -n 1 "$tmp/err"))"
    else
        echo "skipped: cannot mount a small tmpfs here: $(head -n 1 "$tmp/err")"
    fi
    exit 77
fi
full="$tmp/full"

# the step lines without their rows/s (the wall clock's)
steps_of() { grep '^step ' "$1" | cut -d' ' -f1-4; }

# a traced run whose trace fills the file system: one error line naming the file, "no space
# left" and the last step the database holds; the run goes on (every step line printed) and
# exits 1; the database opens and holds every rank's row of every step up to the one named
# (bounded: a hang is a failure, not a stuck make check)
timeout -s KILL 30 "$train" --model mlp:32,256,256,8 --world 2 --steps 150 --trace "$full/t.db" \
    >"$tmp/out" 2>"$tmp/err"
rc=$?
check "a trace filling its file system: the run exits 1 (not a crash or a hang)" test $rc -eq 1
check "  with one error line" test "$(wc -l <"$tmp/err")" -eq 1
check "  naming the file and saying no space is left" \
    grep -q "^fsdp-train: error: trace '$full/t.db': no space left on device: tracing stopped" \
    "$tmp/err"
check "  printing every step" test "$(grep -c '^step ' "$tmp/out")" -eq 150
"$train" --model mlp:32,256,256,8 --world 2 --steps 150 2>&1 | steps_of /dev/stdin >"$tmp/ref"
steps_of "$tmp/out" >"$tmp/got"
check "  with the untraced run's losses" cmp -s "$tmp/ref" "$tmp/got"
# (a writer far behind may have had no step committed when the disk filled: it says so)
held=$(sed -n 's/.*the database holds every step up to \([0-9]*\),.*/\1/p' "$tmp/err")
grep -q "tracing stopped before any step was committed" "$tmp/err" && held=0
check "  naming the last step held (${held:-none})" test -n "$held"
"$ftrace" summary "$full/t.db" >"$tmp/sum" 2>"$tmp/serr"
check "  the database opens" test $? -eq 0
[ "${held:-0}" -eq 0 ] ||
    check "  with every step up to $held" grep -q "^ *$held steps," "$tmp/sum"
if command -v sqlite3 >/dev/null 2>&1; then
    check "  and is intact" test "$(sqlite3 "$full/t.db" 'PRAGMA integrity_check')" = ok
    check "  and holds both ranks' rows of those steps" \
        test "$(sqlite3 "$full/t.db" "SELECT count(*) FROM steps WHERE step <= ${held:-0}")" \
        -eq $((2 * ${held:-0}))
    check "  and its run is not marked finished" \
        test "$(sqlite3 "$full/t.db" 'SELECT finished FROM runs')" = 0
fi
rm -f "$full"/*

# a trace that cannot even be created on the full file system: one line before the first step
dd if=/dev/zero of="$full/fill" bs=4096 2>/dev/null
timeout -s KILL 30 "$train" --model mlp:8,12,3 --world 2 --steps 3 --trace "$full/t.db" \
    >"$tmp/out" 2>"$tmp/err"
check "a trace on an already full file system is refused" test $? -ne 0
check "  with one line naming it and saying no space is left" sh -c "test \$(wc -l <'$tmp/err') -eq 1 &&
    grep -q \"cannot write trace database '$full/t.db': no space left on device\" '$tmp/err'"
check "  before the first step" test "$(grep -c '^step ' "$tmp/out")" -eq 0
rm -f "$full"/*

# --save-checkpoint onto a file system that fills: the save that does not fit fails with a
# line naming the file and the disk's error, leaves no partial files behind, the previous
# checkpoint stays latest and loads, and --resume from it gives the uninterrupted run's losses
fk="--model mlp:16,64,64,4 --world 2 --optim adamw --lr 1e-2 --steps 40"
"$train" $fk 2>&1 | steps_of /dev/stdin >"$tmp/fref"
timeout -s KILL 30 "$train" $fk --state-dict sharded --checkpoint-every 5 \
    --save-checkpoint "$full/ck" >"$tmp/out" 2>"$tmp/err"
rc=$?
latest=$(cat "$full/ck/latest" 2>/dev/null)
check "a checkpoint save onto a full file system fails (exit $rc, latest ${latest:-none})" \
    sh -c "test $rc -eq 1 && test -n '$latest' && test '$latest' != step-00000040"
check "  with lines naming the files and saying no space is left" \
    grep -q "safetensors.*No space left on device" "$tmp/err"
check "  and one saying which checkpoint is still latest" \
    grep -q "^fsdp-train: error: $full/ck: the checkpoint of step [0-9]* is not saved; latest is still ${latest:-x}\$" \
    "$tmp/err"
check "  leaving no partial save behind" \
    test -z "$(find "$full/ck" -name '*.tmp*' 2>/dev/null)"
"$train" $fk --resume "$full/ck" >"$tmp/resumed" 2>"$tmp/rerr"
check "  the previous checkpoint ($latest) loads: --resume runs" test $? -eq 0
steps_of "$tmp/resumed" >"$tmp/resumed_steps"
check "  resuming at step $(head -n 1 "$tmp/resumed_steps" | awk '{print $2}') with the exact losses" \
    sh -c "test -s '$tmp/resumed_steps' && grep -c -x -F -f '$tmp/resumed_steps' '$tmp/fref' |
        grep -qx $(wc -l <"$tmp/resumed_steps")"

exit $fail
