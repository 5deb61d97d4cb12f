#!/bin/sh
# Faults from outside the program, each bounded to a few seconds: kill -9 during a traced run
# and during checkpoint saves, traces on a read-only directory, FIFOs and directories given as
# files.
set -u
bin="${top_builddir:-..}/tools"
[ -x "$bin/fsdp-train" ] || bin=../tools
train="$bin/fsdp-train"
ftrace="$bin/fsdp-trace"
tmp=$(mktemp -d)
full=""
trap '[ -n "$full" ] && umount "$full" 2>/dev/null; chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
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

# waits until file has n lines matching pattern, or s seconds pass
wait_lines() { # file, pattern, n, seconds
    i=0
    while [ $i -lt $(($4 * 20)) ]; do
        got=$(grep -c "$2" "$1" 2>/dev/null)
        [ "${got:-0}" -ge "$3" ] && return 0
        sleep 0.05
        i=$((i + 1))
    done
}

# kill -9 during a traced run: the database opens and holds, for every rank, every step the run
# printed (a step's line is printed once its rows are committed)
if command -v sqlite3 >/dev/null 2>&1; then
    for n in 5 40 120; do
        rm -f "$tmp/k.db" "$tmp/k.db-wal" "$tmp/k.db-shm"
        : >"$tmp/kout"
        "$train" --model mlp:32,256,256,8 --world 4 --steps 100000 --trace "$tmp/k.db" \
            >"$tmp/kout" 2>&1 &
        pid=$!
        wait_lines "$tmp/kout" '^step ' $n 10
        kill -9 $pid
        wait $pid 2>/dev/null
        printed=$(grep '^step ' "$tmp/kout" | tail -n 1 | awk '{print $2}')
        check "killed after $printed printed steps: the database is intact" \
            test "$(sqlite3 "$tmp/k.db" 'PRAGMA integrity_check')" = ok
        held=$(sqlite3 "$tmp/k.db" "SELECT count(*) FROM steps WHERE step <= ${printed:-0}")
        check "  and holds all 4 ranks' rows of the $printed printed steps ($held rows)" \
            test "${held:-0}" -eq $((4 * ${printed:-1}))
    done
else
    echo "skipped: no sqlite3 to read the killed run's database"
fi

# a killed writer's trace in a read-only directory is read with its -wal file (which holds the
# steps the database file does not yet): as the kill left it (with its -shm file), and as a copy
# of the database and its -wal file alone (SQLite cannot open that read-only by itself; immutable
# would show the database file's steps only)
if command -v sqlite3 >/dev/null 2>&1; then
    mkdir "$tmp/wk" "$tmp/wcopy" "$tmp/wref"
    "$train" --model mlp:32,256,256,8 --world 2 --steps 100000 --trace "$tmp/wk/w.db" \
        >"$tmp/kout" 2>&1 &
    pid=$!
    wait_lines "$tmp/kout" '^step ' 30 10
    kill -9 $pid
    wait $pid 2>/dev/null
    cp "$tmp/wk/w.db" "$tmp/wk/w.db-wal" "$tmp/wcopy/"
    cp "$tmp/wk/w.db" "$tmp/wk/w.db-wal" "$tmp/wref/"
    steps=$(sqlite3 "$tmp/wref/w.db" 'SELECT max(step) FROM steps WHERE rank = 0')
    check "a killed writer left a -wal file with its steps (database: ${steps:-none})" \
        sh -c "test -s '$tmp/wk/w.db-wal' && test '${steps:-0}' -ge 30"
    for d in wk wcopy; do
        [ $d = wk ] && what="as the kill left it" || what="copied without its -shm file"
        read_only "$tmp/$d" sh -c "'$ftrace' summary '$tmp/$d/w.db' >'$tmp/sum' 2>'$tmp/err'"
        rc=$?
        if [ $rc -eq 77 ]; then
            echo "skipped: no way to make a read-only directory here"
            break
        fi
        check "a killed run's trace in a read-only directory, $what, is read" test $rc -eq 0
        check "  with all its $steps steps" grep -q "^ *$steps steps," "$tmp/sum"
        check "  and nothing on stderr" test ! -s "$tmp/err"
    done
    check "  and the copy is left as it was" test ! -e "$tmp/wcopy/w.db-shm"
else
    echo "skipped: no sqlite3 to count the killed run's steps"
fi

# kill -9 during checkpoint saves (one every step, most of the run's time): the checkpoint left
# loads, and --resume from it prints the uninterrupted run's losses exactly
ck="--model mlp:32,256,256,8 --world 2 --optim adamw --lr 1e-2 --steps 300"
"$train" $ck 2>&1 | grep '^step ' | cut -d' ' -f1-4 >"$tmp/ref"
for n in 3 30 90; do
    rm -rf "$tmp/ck"
    : >"$tmp/kout"
    "$train" $ck --state-dict sharded --checkpoint-every 1 --save-checkpoint "$tmp/ck" \
        >"$tmp/kout" 2>&1 &
    pid=$!
    wait_lines "$tmp/kout" '^step ' $n 10
    kill -9 $pid
    wait $pid 2>/dev/null
    "$train" $ck --resume "$tmp/ck" >"$tmp/resumed" 2>"$tmp/err"
    check "killed while saving after $(grep -c '^step ' "$tmp/kout") steps: --resume runs" \
        test $? -eq 0
    # the step and loss of each line (the rest, rows/s, is the wall clock's)
    grep '^step ' "$tmp/resumed" | cut -d' ' -f1-4 >"$tmp/resumed_steps"
    check "  resumes at step $(head -n 1 "$tmp/resumed_steps" | awk '{print $2}') with the exact losses" \
        sh -c "test -s '$tmp/resumed_steps' && grep -c -x -F -f '$tmp/resumed_steps' '$tmp/ref' |
            grep -qx $(wc -l <"$tmp/resumed_steps")"
done

# A full disk: a small tmpfs (mounting one needs root; anything else skips, saying why), the
# step lines without their rows/s (the wall clock's)
steps_of() { grep '^step ' "$1" | cut -d' ' -f1-4; }
if [ "$(id -u)" -ne 0 ]; then
    echo "skipped: the full-disk tests mount a small tmpfs, which needs root"
elif ! { mkdir "$tmp/full" && mount -t tmpfs -o size=256k tmpfs "$tmp/full" 2>"$tmp/err"; }; then
    echo "skipped: the full-disk tests cannot mount a tmpfs here: $(head -n 1 "$tmp/err")"
else
    full="$tmp/full"

    # a traced run whose trace fills the file system: one error line naming the file, "no space
    # left" and the last step the database holds; the run goes on (every step line printed) and
    # exits 1; the database opens and holds every rank's row of every step up to the one named
    "$train" --model mlp:32,256,256,8 --world 2 --steps 150 --trace "$full/t.db" \
        >"$tmp/out" 2>"$tmp/err" &
    pid=$!
    # bounded: a hang is a failure, not a stuck make check
    (sleep 30 && kill -9 $pid 2>/dev/null) &
    guard=$!
    wait $pid
    rc=$?
    kill $guard 2>/dev/null
    check "a trace filling its file system: the run exits 1 (not a crash or a hang)" test $rc -eq 1
    check "  with one error line" test "$(wc -l <"$tmp/err")" -eq 1
    check "  naming the file and saying no space is left" \
        grep -q "^fsdp-train: error: trace '$full/t.db': no space left on device: tracing stopped" \
        "$tmp/err"
    check "  printing every step" test "$(grep -c '^step ' "$tmp/out")" -eq 150
    "$train" --model mlp:32,256,256,8 --world 2 --steps 150 2>&1 | steps_of /dev/stdin >"$tmp/ref"
    steps_of "$tmp/out" >"$tmp/got"
    check "  with the untraced run's losses" cmp -s "$tmp/ref" "$tmp/got"
    held=$(sed -n 's/.*the database holds every step up to \([0-9]*\),.*/\1/p' "$tmp/err")
    check "  naming the last step held (${held:-none})" test "${held:-0}" -ge 1
    "$ftrace" summary "$full/t.db" >"$tmp/sum" 2>"$tmp/serr"
    check "  the database opens" test $? -eq 0
    check "  with every step up to $held" grep -q "^ *${held:-x} steps," "$tmp/sum"
    if command -v sqlite3 >/dev/null 2>&1; then
        check "  and is intact" test "$(sqlite3 "$full/t.db" 'PRAGMA integrity_check')" = ok
        check "  and holds both ranks' rows of those steps" \
            test "$(sqlite3 "$full/t.db" "SELECT count(*) FROM steps WHERE step <= ${held:-0}")" \
            -eq $((2 * ${held:-1}))
    fi
    rm -f "$full"/*

    # --save-checkpoint onto a file system that fills: the save that does not fit fails with a
    # line naming the file and the disk's error, leaves no partial files behind, the previous
    # checkpoint stays latest and loads, and --resume from it gives the uninterrupted run's losses
    fk="--model mlp:16,64,64,4 --world 2 --optim adamw --lr 1e-2 --steps 40"
    "$train" $fk 2>&1 | steps_of /dev/stdin >"$tmp/fref"
    timeout 30 "$train" $fk --state-dict sharded --checkpoint-every 5 \
        --save-checkpoint "$full/ck" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    latest=$(cat "$full/ck/latest" 2>/dev/null)
    check "a checkpoint save onto a full file system fails (exit $rc, latest ${latest:-none})" \
        sh -c "test $rc -eq 1 && test -n '$latest' && test '$latest' != step-00000040"
    check "  with lines naming the files and saying no space is left" \
        grep -q "safetensors.*No space left on device" "$tmp/err"
    check "  and one saying the checkpoint kept" grep -q "checkpoint .* not saved.*latest" "$tmp/err"
    check "  leaving no partial save behind" \
        test -z "$(find "$full/ck" -name '*.tmp*' 2>/dev/null)"
    "$train" $fk --resume "$full/ck" >"$tmp/resumed" 2>"$tmp/rerr"
    check "  the previous checkpoint ($latest) loads: --resume runs" test $? -eq 0
    steps_of "$tmp/resumed" >"$tmp/resumed_steps"
    check "  resuming at step $(head -n 1 "$tmp/resumed_steps" | awk '{print $2}') with the exact losses" \
        sh -c "test -s '$tmp/resumed_steps' && grep -c -x -F -f '$tmp/resumed_steps' '$tmp/fref' |
            grep -qx $(wc -l <"$tmp/resumed_steps")"
    umount "$full" && full=""
fi

exit $fail
