#!/bin/sh
# Faults from outside the program, each bounded to a few seconds: kill -9 during a traced run
# and during checkpoint saves, traces on a read-only directory (a killed run's among them), FIFOs
# and directories given as files. A full disk is test_full_disk.sh.
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

# every file read is a regular file, opened without blocking (lib/io/fs.c): FIFOs inside a
# checkpoint, an HF index and a profile are refused at once (timeout: an open that blocks fails
# the check instead of hanging the suite)
"$train" --model mlp:6,10,2 --steps 1 --save-checkpoint "$tmp/ck" >/dev/null 2>&1
step=$(cat "$tmp/ck/latest")
mkdir "$tmp/ckl" "$tmp/ckj" "$tmp/ckj/$step"
mkfifo "$tmp/ckl/latest" "$tmp/ckj/$step/checkpoint.json"
cp "$tmp/ck/latest" "$tmp/ckj/latest"
for d in ckl ckj; do
    [ $d = ckl ] && what=latest || what=checkpoint.json
    timeout 10 "$train" --model mlp:6,10,2 --steps 2 --resume "$tmp/$d" >/dev/null 2>"$tmp/err"
    check "--resume with a FIFO $what is refused" test $? -eq 1
    check "  saying it is a FIFO" grep -q "$what: is a FIFO, not a regular file" "$tmp/err"
    timeout 10 "$train" --consolidate "$tmp/$d" --save "$tmp/c.safetensors" >/dev/null 2>"$tmp/err"
    check "--consolidate with a FIFO $what is refused" test $? -eq 2
    check "  saying it is a FIFO" grep -q "$what: is a FIFO, not a regular file" "$tmp/err"
done
mkdir "$tmp/hf"
mkfifo "$tmp/hf/model.safetensors.index.json"
timeout 10 "$train" --model llama-tiny --init "$tmp/hf" --steps 1 >/dev/null 2>"$tmp/err"
check "--init DIR with a FIFO index is refused" test $? -eq 2
check "  saying it is a FIFO" grep -q "index.json: is a FIFO, not a regular file" "$tmp/err"
mkfifo "$tmp/profile.json"
timeout 10 "$train" --model mlp:6,10,2 --steps 1 --profile "$tmp/profile.json" >/dev/null \
    2>"$tmp/err"
check "--profile FIFO is refused" test $? -ne 0
check "  saying it is a FIFO" grep -q "profile.json: is a FIFO, not a regular file" "$tmp/err"

# --data and --tokens read a regular file only, and no more of it than the host memory allows
timeout 10 "$train" --model gpt2-tiny --data "$tmp/fifo" --steps 1 >/dev/null 2>"$tmp/err"
check "--data FIFO is refused" test $? -eq 2
check "  saying it is a FIFO" grep -q "is a FIFO, not a regular file" "$tmp/err"
timeout 10 "$train" --model gpt2-tiny --data /dev/null --steps 1 >/dev/null 2>"$tmp/err"
check "--data /dev/null is refused as a device" grep -q "is a device, not a regular file" "$tmp/err"
# /dev/zero never ends: bounded by ulimit too where the build allows it (a sanitizer's does not)
if (ulimit -v 4194304 && "$train" --version) >/dev/null 2>&1; then
    (ulimit -v 4194304 && timeout 10 "$train" --model gpt2-tiny --data /dev/zero --steps 1) \
        >/dev/null 2>"$tmp/err"
    check "--data /dev/zero is refused as a device" grep -q "is a device, not a regular file" \
        "$tmp/err"
fi
truncate -s 1G "$tmp/sparse.txt"
timeout 60 "$train" --model gpt2-tiny --data "$tmp/sparse.txt" --steps 1 --host-memory 256M \
    >/dev/null 2>"$tmp/err"
check "--data of 1 GiB (sparse) past --host-memory 256M is refused" test $? -eq 2
check "  naming its size" grep -q "sparse.txt: 1073741824 bytes are more than" "$tmp/err"
timeout 60 "$train" --model gpt2-tiny --tokens "$tmp/sparse.txt" --steps 1 --host-memory 256M \
    >/dev/null 2>"$tmp/err"
check "--tokens of 1 GiB past --host-memory 256M is refused by its size" \
    grep -q "sparse.txt: 1073741824 bytes are more than" "$tmp/err"
rm -f "$tmp/sparse.txt"
# the MLP's --data: x [2M, 6] and y [2M, 2] F32 (64 MiB, sparse) past --host-memory 32M
hdr='{"x":{"dtype":"F32","shape":[2097152,6],"data_offsets":[0,50331648]},"y":{"dtype":"F32","shape":[2097152,2],"data_offsets":[50331648,67108864]}}'
i=0
while [ $i -lt 8 ]; do # the header's length, 8 bytes little-endian
    printf "\\$(printf %03o $(((${#hdr} >> (8 * i)) & 255)))"
    i=$((i + 1))
done >"$tmp/big.safetensors"
printf "%s" "$hdr" >>"$tmp/big.safetensors"
truncate -s $((8 + ${#hdr} + 67108864)) "$tmp/big.safetensors"
timeout 60 "$train" --model mlp:6,10,2 --data "$tmp/big.safetensors" --steps 1 \
    --host-memory 32M >/dev/null 2>"$tmp/err"
check "MLP --data of 64 MiB past --host-memory 32M is refused" test $? -ne 0
check "  naming its size" grep -q "take 67108864 bytes, more than" "$tmp/err"
rm -f "$tmp/big.safetensors"

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
        wait_lines "$tmp/kout" '^step ' $n 60
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
    : >"$tmp/kout" # emptied first: the run's own redirection may come after wait_lines' first look
    "$train" --model mlp:32,256,256,8 --world 2 --steps 100000 --trace "$tmp/wk/w.db" \
        >"$tmp/kout" 2>&1 &
    pid=$!
    wait_lines "$tmp/kout" '^step ' 30 60
    kill -9 $pid
    wait $pid 2>/dev/null
    if [ ! -f "$tmp/wk/w.db" ]; then # say what the run did, for a failure below
        echo "note: the killed run left no database; its first lines:"
        head -n 5 "$tmp/kout"
    fi
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
    # one whose -wal file cannot be read (here a directory in its place) is refused, not shown
    # without it
    mkdir "$tmp/wbad"
    cp "$tmp/wref/w.db" "$tmp/wbad/"
    mkdir "$tmp/wbad/w.db-wal"
    read_only "$tmp/wbad" sh -c "'$ftrace' summary '$tmp/wbad/w.db' >'$tmp/sum' 2>'$tmp/err'"
    rc=$?
    if [ $rc -ne 77 ]; then
        check "a read-only trace whose -wal file cannot be read is refused" test $rc -ne 0
        check "  with one line saying to copy it and its -wal file" \
            sh -c "test \$(wc -l <'$tmp/err') -eq 1 && grep -q 'copy .* to a writable directory' '$tmp/err'"
        check "  and no summary" test ! -s "$tmp/sum"
    fi
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
    wait_lines "$tmp/kout" '^step ' $n 60
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


# two runs at once on one checkpoint directory or one trace: the second is refused at once,
# naming the first's pid, and writes nothing there; the lock dies with its holder
rm -rf "$tmp/one" "$tmp/one.db"*
: >"$tmp/kout"
"$train" --model mlp:32,256,256,8 --world 2 --steps 100000 --checkpoint-every 100000 \
    --save-checkpoint "$tmp/one" --trace "$tmp/one.db" >"$tmp/kout" 2>&1 &
pid=$!
wait_lines "$tmp/kout" '^step ' 1 60
timeout 20 "$train" --model mlp:8,8,2 --steps 2 --save-checkpoint "$tmp/one" >"$tmp/out2" 2>"$tmp/err"
check "a second run saving into a checkpoint directory in use is refused" test $? -ne 0
check "  naming the first run's pid" \
    grep -q "checkpoint directory '$tmp/one' is in use by another run (pid $pid on " "$tmp/err"
check "  in one line, before any step" \
    sh -c "test \$(wc -l <'$tmp/err') -eq 1 && ! grep -q '^step ' '$tmp/out2'"
check "  and saves nothing there" test ! -e "$tmp/one/latest"
timeout 20 "$train" --model mlp:8,8,2 --steps 2 --trace "$tmp/one.db" >"$tmp/out2" 2>"$tmp/err"
rc=$?
check "a second run on a trace in use is refused at open" \
    sh -c "test $rc -ne 0 && ! grep -q '^step ' '$tmp/out2'"
check "  naming the first run's pid" \
    grep -q "trace '$tmp/one.db' is in use by another run (pid $pid on " "$tmp/err"
kill -9 $pid
wait $pid 2>/dev/null
"$train" --model mlp:8,8,2 --steps 2 --save-checkpoint "$tmp/one" --trace "$tmp/one.db" \
    >/dev/null 2>"$tmp/err"
check "once the first run is killed, the next saves and traces there" test $? -eq 0
check "  and leaves no lock file" sh -c "test ! -e '$tmp/one/lock' && test ! -e '$tmp/one.db.lock'"

exit $fail
