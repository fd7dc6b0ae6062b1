#!/usr/bin/env bash
# Builds and runs gradsync's benchmarks (//tests/bench): each prints a
# table comparing gradsync with the references of docs/PERFORMANCE.md,
# measured in the same run. Benchmarks, not tests: they assert nothing.
# Usage: scripts/bench.sh [NAME...]   (default: every benchmark below)
set -euo pipefail
cd "$(dirname "$0")/.."

BAZEL_FLAGS=(--color=no --curses=no)

# One line per benchmark: `bench TARGET [ARGS...]` (TARGET in //tests/bench).
benches() {
  bench ipc_bench
}

selected=("$@")
bench() {
  local target=$1
  shift
  if [ ${#selected[@]} -gt 0 ] && [[ ! " ${selected[*]} " == *" ${target} "* ]]; then
    return 0
  fi
  echo "== //tests/bench:${target} $*"
  bazel build "${BAZEL_FLAGS[@]}" "//tests/bench:${target}" 2>&1 | tail -n 1
  "bazel-bin/tests/bench/${target}" "$@"
  echo
}

benches
