#!/usr/bin/env bash
# Checks that every C, C++ and CUDA file of the project is formatted as
# .clang-format says (Debian's clang-format). Prints the files that are not
# and exits 1; `scripts/check-format.sh --fix` rewrites them in place.
set -euo pipefail
cd "$(dirname "$0")/.."

fix=0
[ "${1:-}" = "--fix" ] && fix=1

mapfile -t files < <(git ls-files '*.cc' '*.h' '*.c' '*.cu' | grep -v '^third_party/')
if [ $fix -eq 1 ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format "$f" | cmp -s - "$f" || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  printf 'not formatted (scripts/check-format.sh --fix): %s\n' "${bad[@]}"
  exit 1
fi
echo "format: ${#files[@]} files as .clang-format says"
