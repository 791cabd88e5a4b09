#!/bin/bash
# Runs every shell block of README.md and docs/*.md that is marked runnable, exactly as printed, so
# the docs stay true. A block is runnable when the line before its opening fence is
#   <!-- tour -->            every command in it must exit 0
#   <!-- tour exit=N -->     its last command must exit N, the others 0
# Each block runs in a fresh temporary directory laid out like the source tree (build/, examples/
# and data/ linked in), with /tmp/ in the commands pointing into that directory, so a test run
# touches nothing outside it. Background jobs a block leaves running are killed.
# usage: doc_commands_test.sh SOURCE_DIR BUILD_DIR [FILE...]
set -u
src=$(cd "$1" && pwd); build=$(cd "$2" && pwd); shift 2
files=("$@")
[ ${#files[@]} -gt 0 ] || files=("$src/README.md" "$src"/docs/*.md)
[ -x "$build/bin/gpulet" ] || { echo "SKIP: $build/bin/gpulet is not built"; exit 0; }

# Prints the blocks as records: "FILE:LINE<TAB>EXPECTED_EXIT" then the block's lines, then a line
# holding only "\f".
extract() {
  awk -v F="$1" '
    /^<!-- tour( exit=[0-9]+)? -->$/ { mark = 0; if (match($0, /exit=[0-9]+/)) mark = substr($0, RSTART + 5, RLENGTH - 5); armed = NR; next }
    /^```/ && !inside { if (armed == NR - 1) { inside = 1; printf "%s:%d\t%s\n", F, NR, mark } ; armed = 0; next }
    /^```/ && inside { inside = 0; print "\f"; next }
    inside { print }
  ' "$1"
}

failed=0; blocks=0
for f in "${files[@]}"; do
  rel=${f#"$src"/}
  block=""; where=""; want=0
  while IFS= read -r line; do
    if [ -z "$where" ]; then where=${line%%$'\t'*}; want=${line#*$'\t'}; block=""; continue; fi
    if [ "$line" != $'\f' ]; then block+="$line"$'\n'; continue; fi
    blocks=$((blocks + 1))
    work=$(mktemp -d "${TMPDIR:-/tmp}/gpulet-doc-XXXXXX")
    mkdir -p "$work/repo" "$work/tmp"
    ln -s "$build" "$work/repo/build"
    ln -s "$src/examples" "$work/repo/examples"
    ln -s "$src/data" "$work/repo/data"
    script=${block//\/tmp\//$work/tmp/}
    # Each command's status is checked (ERR trap); the last one's is compared with exit=N.
    {
      printf 'export TMPDIR=%q\ncd %q\nfails=0\nwant=%q\n' "$work/tmp" "$work/repo" "$want"
      cat <<'HEAD'
trap 'rc=$?; [ "$want" != 0 ] && [ "$rc" = "$want" ] || { echo "  exit $rc: $BASH_COMMAND"; fails=$((fails+1)); }' ERR
HEAD
      printf '%s' "$script"   # verbatim: the block's own $VARIABLES expand when it runs
      cat <<'TAIL'
trap - ERR
for j in $(jobs -p); do kill $j 2>/dev/null; done
wait 2>/dev/null
exit $fails
TAIL
    } > "$work/run.sh"
    out=$(timeout 240 bash "$work/run.sh" 2>&1)
    rc=$?
    if [ $rc -ne 0 ]; then
      failed=$((failed + 1))
      echo "FAIL ${where#"$src"/}: $rc command(s) failed"
      echo "$out" | grep '^  exit ' || echo "$out" | tail -20
    else
      echo "ok   ${where#"$src"/}"
    fi
    rm -rf "$work"
    where=""
  done < <(extract "$f")
done
echo "$blocks blocks, $failed failed"
[ "$blocks" -gt 0 ] || { echo "FAIL: no <!-- tour --> block found"; exit 1; }
[ "$failed" -eq 0 ]
