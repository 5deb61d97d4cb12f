#!/bin/sh
# Builds the libFuzzer harnesses of this folder with clang, ASan and UBSan (the library too,
# out of tree, in $FUZZ_BUILD), then runs each for FUZZ_SECONDS (default 20) from its seed corpus
# in corpus/<name>/. Without clang or libFuzzer it says so and exits 0: a skip, not a failure.
#   tests/fuzz/run.sh [harness...]      (default: all)
# A crash leaves its input as $FUZZ_BUILD/fuzz/<name>-crash-* and fails the run.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=${FUZZ_BUILD:-$src/_build-fuzz}
seconds=${FUZZ_SECONDS:-20}
jobs=${FUZZ_JOBS:-2}
harnesses=${*:-safetensors tokens profile hostlist rendezvous checkpoint_json checkpoint_pieces model_spec
    llama_index trace}
cc=${FUZZ_CC:-clang}
sanitize="-fsanitize=address,undefined -fno-sanitize-recover=all"

if ! command -v "$cc" >/dev/null 2>&1; then
    echo "fuzz: skipped: no $cc (libFuzzer needs clang)"
    exit 0
fi
probe=$(mktemp -d)
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return 0; }\n' \
    >"$probe/p.c"
if ! "$cc" -fsanitize=fuzzer $sanitize "$probe/p.c" -o "$probe/p" >/dev/null 2>&1; then
    rm -rf "$probe"
    echo "fuzz: skipped: $cc cannot link -fsanitize=fuzzer (install libFuzzer)"
    exit 0
fi
rm -rf "$probe"

# the library, instrumented for coverage, static, without the gpu backend; out of tree, or from
# a copy of the sources when the source tree is configured itself (autoconf refuses both)
mkdir -p "$build"
top=$src
if [ -f "$src/config.status" ]; then
    command -v git >/dev/null 2>&1 && git -C "$src" rev-parse >/dev/null 2>&1 ||
        { echo "fuzz: $src is configured and not a git checkout: run make distclean"; exit 1; }
    top=$build/src
    mkdir -p "$top"
    # the files changed since the last run (cp -u), so that make rebuilds only what changed
    (cd "$src" && git ls-files -z --cached --others --exclude-standard |
        xargs -0 cp -u --parents -t "$top")
fi
# a build configured from the other tree (the copy, or the sources themselves) starts over
if [ -f "$build/config.status" ] && ! grep -q "$top/configure" "$build/config.status"; then
    find "$build" -mindepth 1 -maxdepth 1 ! -name src -exec rm -rf {} +
fi
if [ ! -f "$build/config.status" ]; then
    [ -x "$top/configure" ] || (cd "$top" && ./bootstrap) >"$build/configure.log" 2>&1
    (cd "$build" && "$top/configure" -q CC="$cc" --enable-static --disable-shared --without-cuda \
        CFLAGS="-g -O1 -fsanitize=fuzzer-no-link $sanitize") >>"$build/configure.log" 2>&1 ||
        { echo "fuzz: configure failed: see $build/configure.log"; exit 1; }
fi
make -C "$build" -j"$jobs" >"$build/make.log" 2>&1 ||
    { echo "fuzz: build failed: see $build/make.log"; exit 1; }
libs="$build/.libs/libfsdp.a $(pkg-config --libs jansson sqlite3 2>/dev/null || echo -ljansson -lsqlite3) -lpthread -lm"

# the trace harness changes one cell of a small, valid database
if [ ! -f "$build/fuzz/seed.db" ]; then
    mkdir -p "$build/fuzz"
    "$build/tools/fsdp-train" --model mlp:8,12,3 --world 2 --steps 2 \
        --trace "$build/fuzz/seed.db" >/dev/null
    # run 2: a plan whose rank 0 stands for ranks 0-2 (the ranks table's members)
    "$build/tools/fsdp-plan" --model mlp:8,12,3 --nodes 2 --gpus-per-node 2 --steps 1 \
        --trace "$build/fuzz/seed.db" >/dev/null
fi
export FUZZ_TRACE_DB="$build/fuzz/seed.db"

fail=0
for h in $harnesses; do
    bin="$build/fuzz/fuzz_$h"
    "$cc" -g -O1 -D_GNU_SOURCE -fsanitize=fuzzer $sanitize -I"$top/include" -I"$build/include" -I"$build" \
        -I"$top/lib" -I"$top" "$top/tests/fuzz/fuzz_$h.c" $libs -o "$bin" ||
        { echo "fuzz: $h: build failed"; fail=1; continue; }
    mkdir -p "$build/fuzz/$h"
    # the corpus grows in the build tree; the seeds in the source tree stay as they are
    if "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$build/fuzz/$h-" "$build/fuzz/$h" "$here/corpus/$h" \
        >"$build/fuzz/$h.log" 2>&1; then
        echo "fuzz: $h: $(grep -o 'Done [0-9]* runs' "$build/fuzz/$h.log" | tr -dc 0-9) runs in ${seconds} s, no failure"
    else
        echo "fuzz: $h: FAILED (see $build/fuzz/$h.log; the input is $build/fuzz/$h-crash-*)"
        tail -n 30 "$build/fuzz/$h.log"
        fail=1
    fi
done
exit $fail
