#!/bin/sh
# fsdp-trace export --chrome over a traced gpt2-tiny run on 4 ranks: every track's slices nest
# (host waits on the host track, times rounded before durations), and each stream wait has its
# arrow from the record it waits for. Then fsdp-trace's error lines.
set -u
tools="${top_builddir:-..}/tools"
[ -x "$tools/fsdp-train" ] || tools=../tools
check_json="${top_builddir:-..}/tests/chrome_check"
[ -x "$check_json" ] || check_json=./chrome_check
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

check() { # description, command...
    desc=$1
    shift
    if "$@"; then echo "ok: $desc"; else echo "FAILED: $desc"; fail=1; fi
}

"$tools/fsdp-train" --model gpt2-tiny --world 4 --batch 8 --steps 3 --trace "$tmp/run.db" \
    >/dev/null 2>"$tmp/err"
check "a traced gpt2-tiny run on 4 ranks" test $? -eq 0
"$tools/fsdp-trace" export --chrome "$tmp/run.json" "$tmp/run.db" 2>"$tmp/err"
check "exports" test $? -eq 0
"$check_json" "$tmp/run.json" >"$tmp/counts" 2>"$tmp/err"
check "every track nests, host waits on the host track, flows pair up: $(cat "$tmp/counts" "$tmp/err")" \
    test $? -eq 0
check "four ranks' tracks" awk '{exit !($4 >= 4 * 4)}' "$tmp/counts"
check "an arrow per stream wait" awk '{exit !($7 > 0)}' "$tmp/counts"
check "arrows from records to waits" \
    test "$(grep -c '"ph":"s"' "$tmp/run.json")" -eq "$(grep -c '"ph":"f","bp":"e"' "$tmp/run.json")"

# fsdp-trace's errors, its own and the library's, are one line each as the other tools': a
# "fsdp-trace: error: " prefix and exit status 2
echo "not a trace" >"$tmp/text.db"
for args in "summary $tmp/text.db" "export --chrome $tmp/x.json $tmp/missing.db" "plot $tmp/run.db" \
    "frobnicate"; do
    # shellcheck disable=SC2086 # the words of args are the arguments
    "$tools/fsdp-trace" $args >/dev/null 2>"$tmp/err"
    rc=$?
    check "fsdp-trace $args: one error line: $(head -n 1 "$tmp/err")" sh -c \
        "test $rc -eq 2 && test \$(grep -c . '$tmp/err') -eq 1 && grep -q '^fsdp-trace: error: ' '$tmp/err'"
done

exit $fail
