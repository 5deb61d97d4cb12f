#!/bin/sh
# The examples build against the installed library with pkg-config alone: the tree is installed
# into a temporary DESTDIR, and the installed sources are compiled with only what
# `pkg-config --cflags --libs libfsdp` says (PKG_CONFIG_SYSROOT_DIR maps its paths into DESTDIR).
set -e
command -v pkg-config > /dev/null || { echo "no pkg-config: skipped"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# a serial make of its own, outside the parallel make that runs this test
(cd "$top_builddir" && MAKEFLAGS= MFLAGS= ${MAKE:-make} install DESTDIR="$dir/root" > "$dir/install.log" 2>&1) ||
    { tail -n 30 "$dir/install.log"; exit 1; }
pc=$(find "$dir/root" -name libfsdp.pc -path '*/pkgconfig/*' | head -n 1)
test -n "$pc"
libdir=$(dirname "$(dirname "$pc")")
srcs=$(find "$dir/root" -type d -path '*/examples' | head -n 1)
test -f "$srcs/own_model.c" && test -f "$srcs/gpt2_checkpoint.c"

export PKG_CONFIG_PATH="$(dirname "$pc")" PKG_CONFIG_SYSROOT_DIR="$dir/root"
flags=$(pkg-config --cflags --libs libfsdp)
echo "pkg-config: $flags"
# a library built with sanitizers (configure --enable-asan, ...) needs its programs built with
# the same ones, as any program linking it would
san=
for f in ${BUILD_CFLAGS:-}; do
    case $f in -fsanitize=* | -fno-sanitize* | -fno-omit-frame-pointer) san="$san $f" ;; esac
done
for ex in own_model gpt2_checkpoint; do
    ${CC:-cc} $san "$srcs/$ex.c" $flags -o "$dir/$ex"
done
LD_LIBRARY_PATH="$libdir" "$dir/own_model" 2 20
LD_LIBRARY_PATH="$libdir" "$dir/gpt2_checkpoint" "$dir/ckpt"
test -s "$dir/ckpt/step-00000020/model.safetensors"
