#!/bin/bash
# scripts/check-paths (make lint's rule against paths of the development machines) can fail, and
# names what it fails on: in a throwaway git tree it fails a planted absolute path under the
# workspace root and a planted path to the folder beside the checkout, naming FILE:LINE, in tracked
# and in untracked files; it passes look-alikes (/scheduler/workload, /workspace/, ../shared_ptr),
# ignored files and binary files. Then the real tree passes it.
# usage: paths_test.sh [SOURCE_DIR]
set -u
src=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
fail() {
  echo "FAIL: $*"
  failed=1
}
# The planted paths are built from pieces so that this file passes the rule itself.
root="/wo""rk"
beside="../sha""red"
mkdir -p "$tmp/scripts" "$tmp/docs" "$tmp/build"
cp "$src/scripts/check-paths" "$tmp/scripts/"
git -C "$tmp" init -q
printf 'build/\n' >"$tmp/.gitignore"
cat >"$tmp/docs/clean.md" <<MD
GET /scheduler/workload answers the classes; torchrun /workspace/train.py;
std::shared_ptr in ../shared_ptr.h; ../sharedlib/x; ${root}ers/x; ${root}load
MD
printf 'a\0b %s/shared/x\n' "$root" >"$tmp/docs/blob.bin" # binary: skipped
printf '%s/.gocache\n' "$root" >"$tmp/build/ignored.txt"  # ignored: skipped
git -C "$tmp" add -A
check() { (cd "$tmp" && scripts/check-paths 2>&1); }

out=$(check) || fail "the clean tree fails the rule: $out"

printf 'line one\ncache=%s/.gocache/mod\n' "$root" >"$tmp/docs/tracked.sh"
git -C "$tmp" add docs/tracked.sh
printf 'x\ny\nsee `%s/DESIGN.md`\n' "$beside" >"$tmp/docs/untracked.md"
out=$(check)
rc=$?
((rc == 1)) || fail "exit $rc (want 1) with two planted paths"
grep -q "^  docs/tracked.sh:2:cache=${root}/.gocache/mod$" <<<"$out" ||
  fail "the planted workspace path (tracked file, line 2) is not named"
grep -qF "  docs/untracked.md:3:see \`${beside}/DESIGN.md\`" <<<"$out" ||
  fail "the planted path beside the checkout (untracked file, line 3) is not named"
grep -q "clean.md\|blob.bin\|ignored.txt" <<<"$out" && fail "look-alikes, binary or ignored files flagged"
grep -q "2 line(s)" <<<"$out" || fail "the count is not 2"
((failed)) && { echo "--- its output:"; echo "$out"; }

out=$(cd "$src" && scripts/check-paths 2>&1) || fail "the source tree names a path of ours: $out"
((failed)) || echo "check-paths fails planted paths of ours, naming FILE:LINE; passes look-alikes and the tree"
exit $failed
