#!/bin/sh
# The backends consume what the core hands them (DESIGN.md, "Layers"): no object built from sim/
# or gpu/ refers to the core's units or shard arithmetic (fsdp_unit_*, fsdp_num_units,
# fsdp_shard_*); what depends on the units' layout, as the classes of symmetric ranks, is derived
# in lib/core. Read from the built objects with nm, so that a call through a macro or an inline
# function counts too. And no source of sim/ or gpu/ includes the umbrella header fsdp/fsdp.h:
# each includes the headers it uses.
set -u
top_builddir="${top_builddir:-..}"
top_srcdir="${top_srcdir:-$(cd "${srcdir:-.}/.." && pwd)}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

command -v nm >/dev/null 2>&1 || { echo "skipped: nm not found"; exit 77; }

fail=0
n=0
for dir in sim gpu; do
    find "$top_builddir/$dir" -name '*.o' >"$tmp/objects"
    while read -r o; do
        # only the objects of sources still in the tree: a removed source's object may linger
        base=$(basename "$o" .o)
        base=${base#*_la-}
        [ -f "$top_srcdir/$dir/$base.c" ] || [ -f "$top_srcdir/$dir/$base.cu" ] || continue
        n=$((n + 1))
        nm "$o" | awk '{print $NF}' | grep -E '^(fsdp_unit_|fsdp_num_units$|fsdp_shard_)' |
            sort -u >"$tmp/names"
        if [ -s "$tmp/names" ]; then
            echo "FAILED: $dir/$base names the core's units: $(tr '\n' ' ' <"$tmp/names")"
            fail=1
        fi
    done <"$tmp/objects"
done
if [ "$n" -lt 10 ]; then
    echo "FAILED: only $n objects of sim/ and gpu/ found under $top_builddir: the scan is broken"
    exit 1
fi
[ "$fail" = 0 ] && echo "ok: none of the $n objects of sim/ and gpu/ names fsdp_unit_*, fsdp_num_units or fsdp_shard_*"

grep -l '#include <fsdp/fsdp.h>' "$top_srcdir"/sim/*.[ch] "$top_srcdir"/gpu/*.[ch] \
    "$top_srcdir"/gpu/*.cu >"$tmp/umbrella" 2>/dev/null
if [ -s "$tmp/umbrella" ]; then
    echo "FAILED: the umbrella header included by: $(sed "s|^$top_srcdir/||" "$tmp/umbrella" | tr '\n' ' ')"
    fail=1
else
    echo "ok: no source of sim/ or gpu/ includes the umbrella header fsdp/fsdp.h"
fi
exit "$fail"
