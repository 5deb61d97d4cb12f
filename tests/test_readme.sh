#!/bin/sh
# README.md's fsdp-plan examples print what README.md shows. Each "$ tools/fsdp-plan ..." line
# of a fenced block (with its "\" continuations) is run, and every line shown after it, up to
# the next "$" line or the block's end, must be in its output as written; a line with "..." in
# it is an abridgement and is skipped. A change to the cost model that moves a figure fails
# here until README.md shows the new one.
set -u
top="${top_builddir:-..}"
srcdir="${srcdir:-.}"
readme="$srcdir/../README.md"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

# cmd.N: the command (continuations joined), exp.N: the lines shown after it
awk -v dir="$tmp" '
    function end_with_backslash(s) { return s ~ /\\$/ }
    /^```/ { inblock = !inblock; cur = 0; cont = 0; next }
    !inblock { next }
    cont {
        line = $0
        more = end_with_backslash(line)
        if (more) sub(/\\$/, "", line)
        cmd = cmd " " line
        if (!more) { cont = 0; print cmd > (dir "/cmd." n); cur = n }
        next
    }
    /^\$ tools\/fsdp-plan / {
        n++
        cmd = substr($0, 3)
        cur = 0
        if (end_with_backslash(cmd)) { sub(/\\$/, "", cmd); cont = 1 }
        else { print cmd > (dir "/cmd." n); cur = n }
        next
    }
    /^\$ / { cur = 0; next }
    cur { print > (dir "/exp." cur) }
    ' "$readme"

count=0
for c in "$tmp"/cmd.*; do
    [ -e "$c" ] || break
    i=${c##*.}
    count=$((count + 1))
    cmd=$(sed "s|^tools/|$top/tools/|" "$c")
    # shellcheck disable=SC2086
    sh -c "$cmd" >"$tmp/out.$i" 2>&1
    [ -e "$tmp/exp.$i" ] || continue
    shown=0
    while IFS= read -r line; do
        case $line in *...*|'') continue ;; esac
        shown=$((shown + 1))
        if grep -Fqx -- "$line" "$tmp/out.$i"; then :; else
            echo "FAILED: README shows, after '$(cat "$c")':"
            echo "    $line"
            echo "  the command prints instead:"
            sed 's/^/    /' "$tmp/out.$i"
            fail=1
        fi
    done <"$tmp/exp.$i"
    echo "ok: $(cat "$c") ($shown lines compared)"
done
if [ "$count" -lt 3 ]; then
    echo "FAILED: found $count fsdp-plan examples in $readme, expected at least 3"
    fail=1
fi
exit $fail
