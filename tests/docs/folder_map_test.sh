#!/bin/bash
# The folder maps stay true to the tree (issue 18): every folder of src/ (two levels), tests/,
# testing/ and bench/ is named in ARCHITECTURE.md's "Folder map" and CONTRIBUTING.md's "Layout", and
# every folder those sections name exists. tests/ mirrors src/ (each src/ component with code has its
# tests/ folder) and bench/ includes nothing from tests/ (shared helpers live in testing/).
# A folder P/X counts as named when the section holds "P/X/", or the section's entry for "P/" (a
# table row keyed by `P/`, or a layout line starting with P/ and its indented continuation lines)
# names "X/" or `X`, or, for tests/X and
# bench/X with a src/X, when the section holds the mirror entry "tests/<component>/" ("bench/...").
# usage: folder_map_test.sh [SOURCE_DIR]
set -u
src=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
cd "$src" || { echo "FAIL: cannot enter the source tree $src"; exit 1; }
failed=0
fail() {
  echo "FAIL: $*"
  failed=1
}

# The text of one section (from its heading to the next heading of the same level), one entry a line:
# continuation lines (indented) of CONTRIBUTING's code block are joined onto their entry.
section() {
  awk -v h="$2" '
    $0 == h { on = 1; next }
    on && /^## / { exit }
    on && /^  +[^ ]/ && prev != "" { prev = prev " " $0; next }
    on { if (prev != "") print prev; prev = $0 }
    END { if (prev != "") print prev }
  ' "$1"
}

# named FILE TEXT DIR: whether DIR (relative, no trailing slash) is named in TEXT.
named() {
  local text=$2 dir=$1 parent=${1%/*} base=${1##*/}
  grep -qF -- "$dir/" <<<"$text" && return 0
  if [[ $parent != "$dir" ]]; then
    # The entries whose key (a table row's first cell, a layout line's first word) is "P/", then
    # the base named there as a path ("X/") or in backquotes.
    awk -v p="$parent/" '{
        key = $1; if ($0 ~ /^\|/) { split($0, cell, "|"); key = cell[2] }
        gsub(/[` ]/, "", key); n = split(key, keys, ",")
        for (i = 1; i <= n; i++) if (keys[i] == p) { print; break }
      }' <<<"$text" | grep -qE -- "(^|[^A-Za-z0-9_/.-])$base/|\`$base\`" && return 0
  fi
  case $parent in
    tests | bench) [[ -d src/$base ]] && grep -qF -- "$parent/<component>/" <<<"$text" && return 0 ;;
  esac
  return 1
}

mapfile -t dirs < <(find src -mindepth 1 -maxdepth 2 -type d; find tests testing bench \
  -mindepth 1 -maxdepth 1 -type d | sort)
for doc in "ARCHITECTURE.md:## Folder map" "CONTRIBUTING.md:## Layout"; do
  file=${doc%%:*} heading=${doc#*:}
  text=$(section "$file" "$heading")
  if [[ -z $text ]]; then
    fail "$file: no section \"$heading\""
    continue
  fi
  for d in "${dirs[@]}"; do
    named "$d" "$text" || fail "$file ($heading): folder $d/ is not in the map"
  done
  # Every folder path the section names exists (file paths name their folder).
  while read -r p; do
    [[ -d $p ]] || fail "$file ($heading): names $p, which is not a folder of the tree"
  done < <(grep -oE '(^|[^A-Za-z0-9_./-])(proto|src|tests|testing|bench|deploy|docs)/([A-Za-z0-9_.-]+/)*' \
    <<<"$text" | sed -E 's#^[^a-z]##' | sort -u)
done

# tests/ mirrors src/: a component with code (.cc files) has its tests/ folder.
for d in src/*/ src/*/*/; do
  d=${d%/}
  [[ $d == src/cmd* ]] && continue # main()s only; their tests are end-to-end ones elsewhere
  # The NVML backend is tested through the GpuLayer conformance suite (tests/gpu/), as ARCHITECTURE.md says.
  [[ $d == src/gpu/nvml ]] && continue
  compgen -G "$d/*.cc" >/dev/null || continue
  [[ -d tests/${d#src/} ]] || fail "tests/ does not mirror src/: $d has code but no tests/${d#src/}/"
done

# bench/ includes nothing from tests/.
while IFS= read -r hit; do
  fail "bench/ includes from tests/ (move the helper to testing/): $hit"
done < <(grep -rnE '^#include "tests/' bench)

((failed)) || echo "folder maps match the tree"
exit $failed
