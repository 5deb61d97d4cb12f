#!/bin/sh
# The gpu backend as a module: libfsdp links no CUDA or NCCL library, the simulator runs without
# the module, and `--backend gpu` says in one line why the gpu backend cannot run (the module is
# missing, a library it needs is missing, it is not a module, no device).
set -u
top="${top_builddir:-..}"
train="$top/tools/fsdp-train"
lib="$top/.libs/libfsdp.so"
mod="$top/gpu/.libs/libfsdp-gpu.so"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
built=0
grep -q '^#define FSDP_HAVE_GPU 1' "$top/config.h" && built=1

check() { # description, command...
    desc=$1
    shift
    if "$@"; then echo "ok: $desc"; else echo "FAILED: $desc"; fail=1; fi
}

# `fsdp-train --backend gpu` under the environment given (VAR=value ...) exits non-zero with one
# line on stderr that matches the pattern (a grep -E expression)
refuse_gpu() { # description, pattern, VAR=value...
    desc=$1
    pattern=$2
    shift 2
    env "$@" "$train" --backend gpu --model mlp:8,12,3 --steps 1 >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$(grep -c . "$tmp/err")" -eq 1 ] &&
        grep -Eq "^fsdp-train: error: --backend gpu: $pattern" "$tmp/err" && [ ! -s "$tmp/out" ]; then
        echo "ok: $desc: $(cat "$tmp/err")"
    else
        echo "FAILED: $desc (exit $rc, stderr:)"
        cat "$tmp/err"
        fail=1
    fi
}

# (a) libfsdp.so needs no CUDA or NCCL library and has no run path into the CUDA tree
if command -v readelf >/dev/null 2>&1 && [ -f "$lib" ]; then
    readelf -d "$lib" >"$tmp/dynamic"
    check "libfsdp.so has dynamic entries" grep -q NEEDED "$tmp/dynamic"
    check "libfsdp.so has no CUDA or NCCL NEEDED entry" \
        sh -c "! grep NEEDED '$tmp/dynamic' | grep -Eiq 'cuda|cublas|nccl|nvrtc|curand'"
    check "libfsdp.so has no run path into the CUDA tree" \
        sh -c "! grep -E 'RPATH|RUNPATH' '$tmp/dynamic' | grep -iq cuda"
    if [ $built -eq 1 ]; then
        # the module's one exported symbol: its entry table
        check "the module exports only fsdp_gpu_module_v2" \
            test "$(nm -D --defined-only "$mod" 2>/dev/null | awk '{print $3}')" = fsdp_gpu_module_v2
    fi
else
    echo "skipped: readelf or $lib not available, NEEDED entries unchecked"
fi

# (b) the module missing: --backend gpu names where it looked; the simulator runs regardless
missing="$tmp/nowhere/libfsdp-gpu.so"
refuse_gpu "module missing (FSDP_GPU_MODULE)" "gpu backend module missing: no file at FSDP_GPU_MODULE=$missing" \
    FSDP_GPU_MODULE="$missing"
env FSDP_GPU_MODULE="$missing" LD_LIBRARY_PATH= "$train" --model mlp:8,12,3 --world 2 --steps 3 \
    >"$tmp/sim" 2>"$tmp/err"
check "the simulator trains without the module" test $? -eq 0
check "the simulator prints its 3 loss lines" test "$(grep -c '^step [0-9]* loss ' "$tmp/sim")" -eq 3
check "the simulator writes nothing on stderr" test ! -s "$tmp/err"
# fsdp_gpu_init fails cleanly and the gpu tests skip
FSDP_GPU_MODULE="$missing" ./test_gpu >"$tmp/out" 2>&1
check "test_gpu skips without the module (exit 77)" test $? -eq 77
check "test_gpu says the module is missing" grep -q "skipped: gpu backend module missing" "$tmp/out"
if [ $built -eq 0 ]; then
    refuse_gpu "no module built: the paths tried" \
        "gpu backend module missing: no libfsdp-gpu.so \(tried .*\); this libfsdp was built without CUDA and NCCL"
fi

# (c) a module that cannot be loaded: not a shared object, not a module, a library missing
printf 'not a shared object\n' >"$tmp/text.so"
refuse_gpu "not a shared object" "gpu backend module $tmp/text.so cannot be loaded: .*" \
    FSDP_GPU_MODULE="$tmp/text.so"
if [ -f "$lib" ]; then
    refuse_gpu "a shared object that is no module" \
        "gpu backend module .*libfsdp.so cannot be loaded: it has no fsdp_gpu_module_v2" \
        FSDP_GPU_MODULE="$lib"
fi
if [ $built -eq 1 ]; then
    # a copy of the module whose CUDA runtime is renamed to a library that exists nowhere
    cudart=$(readelf -d "$mod" 2>/dev/null | sed -n 's/.*NEEDED.*\[\(libcudart[^]]*\)\].*/\1/p')
    if [ -n "$cudart" ] && command -v perl >/dev/null 2>&1; then
        absent=$(echo "$cudart" | sed 's/^libcudart/libfsdpno/')
        perl -0777 -pe "s/\Q$cudart\E/$absent/g" "$mod" >"$tmp/libfsdp-gpu.so"
        refuse_gpu "a library the module needs is missing" \
            "gpu backend module $tmp/libfsdp-gpu.so: a library it needs is missing: $absent" \
            FSDP_GPU_MODULE="$tmp/libfsdp-gpu.so"
    else
        echo "skipped: no perl or no libcudart entry, the missing-library case unchecked"
    fi
    # (d) it loads on any NCCL >= 2.18 (gpu.h's floor), whichever NCCL it was built with: every
    # NCCL function it needs outright is in 2.18's API; a newer one is a weak reference, looked
    # for at run time (ncclCommRevoke, 2.28)
    if command -v nm >/dev/null 2>&1; then
        nccl218='ncclAllGather ncclAllReduce ncclBroadcast ncclCommAbort ncclCommCount
            ncclCommDestroy ncclCommFinalize ncclCommGetAsyncError ncclCommInitRankConfig
            ncclCommSplit ncclCommUserRank ncclGetErrorString ncclGetLastError ncclGetUniqueId
            ncclGetVersion ncclReduceScatter ncclSend ncclRecv ncclGroupStart ncclGroupEnd
            ncclCommInitRank ncclCommInitAll ncclCommCuDevice ncclReduce ncclRedOpCreatePreMulSum
            ncclRedOpDestroy'
        newer=$(nm -D --undefined-only "$mod" | awk '$1 == "U" && $2 ~ /^nccl/ {print $2}' |
            while read -r f; do
                case " $(echo $nccl218) " in *" $f "*) ;; *) echo "$f" ;; esac
            done)
        check "the module needs no NCCL function newer than 2.18 outright${newer:+ (needs: $newer)}" \
            test -z "$newer"
    else
        echo "skipped: no nm, the module's NCCL references unchecked"
    fi
    # the module found in the build tree, no device visible
    # with why, and the driver and runtime versions
    refuse_gpu "no device" "no CUDA device is visible .*driver .*runtime [0-9]+\.[0-9]+, NCCL" \
        CUDA_VISIBLE_DEVICES=
fi

exit $fail
