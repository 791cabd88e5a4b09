#!/bin/bash
# `make lint` (scripts/lint) can fail, and names what it fails on: run on a throwaway tree (a temp
# dir holding the repo's scripts/lint, .clang-format and .clang-tidy, and a compile database of its
# own) it passes a clean file, and fails a file off .clang-format and a file that writes
# ABSL_GUARDED_BY state without its mutex -- the check `make test-thread-safety` makes with a whole
# clang build, which CI gets from clang-tidy's -Wthread-safety instead -- naming FILE:LINE.
# Skipped (77) without clang-format-14 / clang-tidy-14.
# usage: lint_test.sh [SOURCE_DIR]
set -u
src=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
for t in clang-format-14 run-clang-tidy-14; do
  command -v "$t" >/dev/null || { echo "SKIP: $t not installed (apt-get install clang-format-14 clang-tidy-14)"; exit 77; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/scripts" "$tmp/src" "$tmp/build/lint"
cp "$src/scripts/lint" "$tmp/scripts/"
cp "$src/.clang-format" "$src/.clang-tidy" "$tmp/"

cat >"$tmp/src/good.cc" <<'CC'
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

class Counter {
 public:
  void Bump() {
    absl::MutexLock l(&mu_);
    ++n_;
  }

 private:
  absl::Mutex mu_;
  int n_ ABSL_GUARDED_BY(mu_) = 0;
};

void Use() { Counter().Bump(); }
CC
# Formatted, tidy, but Bump() writes n_ without mu_ (line 6).
cat >"$tmp/src/unguarded.cc" <<'CC'
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

class Counter {
 public:
  void Bump() { ++n_; }

 private:
  absl::Mutex mu_;
  int n_ ABSL_GUARDED_BY(mu_) = 0;
};

void Use() { Counter().Bump(); }
CC
printf 'int  Badly ( ) {return 1 ;}\n' >"$tmp/src/unformatted.cc"
{
  echo '['
  for f in good unguarded unformatted; do
    echo "{\"directory\": \"$tmp\", \"file\": \"$tmp/src/$f.cc\","
    echo " \"command\": \"c++ -std=c++20 -c src/$f.cc -o /dev/null\"}$([[ $f == unformatted ]] || echo ,)"
  done
  echo ']'
} >"$tmp/build/lint/compile_commands.json"

lint() { (cd "$tmp" && LINT_FILES="$*" BUILD=build JOBS=2 scripts/lint 2>&1); }
failed=0
out=$(lint src/good.cc) || { echo "FAIL: a clean file fails lint:"; echo "$out"; failed=1; }

out=$(lint src/unguarded.cc src/unformatted.cc)
rc=$?
if ((rc == 0)); then
  echo "FAIL: lint passed a thread-safety violation and an unformatted file"
  failed=1
fi
grep -q "src/unguarded.cc:6:.*requires holding mutex 'mu_'.*thread-safety" <<<"$out" ||
  { echo "FAIL: lint does not name the unguarded write (src/unguarded.cc:6)"; failed=1; }
grep -q "^  src/unformatted.cc$" <<<"$out" ||
  { echo "FAIL: lint does not name the unformatted file"; failed=1; }
grep -q "good.cc\|src/unformatted.cc:\|^  src/unguarded.cc$" <<<"$out" &&
  { echo "FAIL: lint reports what it was not asked about"; failed=1; }
((failed)) && { echo "--- lint's output (rc $rc):"; echo "$out"; }
((failed)) || echo "lint fails the planted violations, naming them; passes the clean file"
exit $failed
