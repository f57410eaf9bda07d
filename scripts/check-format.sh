#!/usr/bin/env bash
# Checks that every tracked C and C++ file is formatted with the project's
# .clang-format; `--fix` formats them in place instead. Run by ctest as
# "format.clang-format: ..." and usable by hand before a commit.
#
# The style is pinned to clang-format 14 (Debian 12's, which
# scripts/install-deps.sh installs): other versions format some constructs
# differently, so with another version (or outside a git checkout) the check
# skips, saying why (exit 77, ctest's skip code here).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

fix=0
case "${1:-}" in
  --fix) fix=1 ;;
  "") ;;
  *) echo "usage: scripts/check-format.sh [--fix]" >&2; exit 64 ;;
esac

clang_format="${CLANG_FORMAT:-clang-format}"
if ! command -v "$clang_format" >/dev/null 2>&1; then
  echo "skipped: $clang_format is not installed (scripts/install-deps.sh installs clang-format)"
  exit 77
fi
version="$("$clang_format" --version | sed -n 's/.*clang-format version \([0-9]*\).*/\1/p')"
if [[ "$version" != "14" ]]; then
  echo "skipped: the style is checked with clang-format 14 and this is version ${version:-unknown};" \
       "set CLANG_FORMAT to a clang-format 14"
  exit 77
fi
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "skipped: not a git checkout, so there is no list of tracked files to check"
  exit 77
fi

mapfile -t files < <(git ls-files -- '*.c' '*.h' '*.cpp' '*.hpp' '*.cu' '*.cuh')
if [[ $fix -eq 1 ]]; then
  "$clang_format" -i -- "${files[@]}"
  echo "formatted ${#files[@]} files"
  exit 0
fi
report="$(mktemp)"
trap 'rm -f "$report"' EXIT
if ! "$clang_format" --dry-run --Werror -- "${files[@]}" 2>"$report"; then
  sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: error: .*/not formatted: \1/p' "$report" | sort -u
  echo "fix: scripts/check-format.sh --fix (then review and commit the changes)"
  exit 1
fi
echo "all ${#files[@]} tracked C and C++ files are formatted"
