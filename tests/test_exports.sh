#!/bin/sh
# The library's public boundary: every function libfsdp.so exports is declared in include/fsdp/
# (with FSDP_API: the user's headers, and include/fsdp/backend/ for a backend), every function
# declared there is exported, and there are at most FSDP_MAX_EXPORTS of them: what only tests,
# benchmarks or the library itself call is declared in lib/*/*_hidden.h or sim/sim_hidden.h and
# linked statically (DESIGN.md, "Layers"). The declarations are read by the compiler itself
# (-aux-info over a file that includes every public header).
set -u
top_builddir="${top_builddir:-..}"
top_srcdir="${top_srcdir:-$(cd "${srcdir:-.}/.." && pwd)}"
CC="${CC:-cc}"
so="$top_builddir/.libs/libfsdp.so"
FSDP_MAX_EXPORTS=200
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ ! -f "$so" ]; then
    echo "skipped: no shared library at $so (built with --disable-shared)"
    exit 77
fi
command -v nm >/dev/null 2>&1 || { echo "skipped: nm not found"; exit 77; }

# every public header, the backend-facing ones included
for h in "$top_srcdir"/include/fsdp/*.h "$top_srcdir"/include/fsdp/backend/*.h; do
    [ -f "$h" ] && echo "#include <fsdp/${h#"$top_srcdir"/include/fsdp/}>"
done > "$tmp/all.c"
if ! $CC -std=gnu11 -I"$top_srcdir/include" -I"$top_builddir/include" -fsyntax-only \
    -aux-info "$tmp/aux" "$tmp/all.c" 2>"$tmp/cc.err"; then
    echo "FAILED: the public headers do not compile alone:"; cat "$tmp/cc.err"; exit 1
fi
grep '^/\* [^ ]*include/fsdp/' "$tmp/aux" | grep -v ' static ' |
    sed -n 's/^.*\*\/ extern [^(]*[ *]\(fsdp_[A-Za-z0-9_]*\) (.*/\1/p' | sort -u > "$tmp/declared"
nm -D --defined-only "$so" | awk '$2 ~ /^[TW]$/ {print $3}' | sort -u > "$tmp/exported"

fail=0
n_decl=$(wc -l < "$tmp/declared")
n_exp=$(wc -l < "$tmp/exported")
if [ "$n_decl" -lt 100 ]; then
    echo "FAILED: only $n_decl public declarations found: the header scan is broken"; exit 1
fi
comm -23 "$tmp/exported" "$tmp/declared" > "$tmp/undeclared"
comm -13 "$tmp/exported" "$tmp/declared" > "$tmp/unexported"
if [ -s "$tmp/undeclared" ]; then
    echo "FAILED: exported but declared in no public header:"; sed 's/^/  /' "$tmp/undeclared"
    fail=1
fi
if [ -s "$tmp/unexported" ]; then
    echo "FAILED: declared in include/fsdp/ but not exported (FSDP_API missing?):"
    sed 's/^/  /' "$tmp/unexported"
    fail=1
fi
if [ "$n_exp" -gt "$FSDP_MAX_EXPORTS" ]; then
    echo "FAILED: $n_exp exported functions, more than $FSDP_MAX_EXPORTS: declare what only the"
    echo "  library, tests or benchmarks call in a hidden header (lib/*/*_hidden.h) instead"
    fail=1
fi
[ "$fail" = 0 ] && echo "ok: $n_exp exported functions, each declared in include/fsdp/, and every one of the $n_decl declared is exported (at most $FSDP_MAX_EXPORTS)"
exit "$fail"
