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
  bench local_reduce_bench
  bench gloo_allreduce_bench --nodes=2
  py_bench sync_bench.py //daemon:gradsyncd //tests/bench:bench_trainer //tests/bench:gloo_allreduce_bench
  py_bench torch_step_bench.py //daemon:gradsyncd //client:libgradsync.so
  py_bench link_bench.py //daemon:gradsyncd //client:libgradsync.so //tests/bench:bench_trainer
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

# Python drivers (Debian's /usr/bin/python3 has torch): `py_bench FILE TARGETS...`.
py_bench() {
  local file=$1
  shift
  local name=${file%.py}
  if [ ${#selected[@]} -gt 0 ] && [[ ! " ${selected[*]} " == *" ${name} "* ]]; then
    return 0
  fi
  [ -f "tests/bench/${file}" ] || return 0
  echo "== tests/bench/${file}"
  bazel build "${BAZEL_FLAGS[@]}" "$@" 2>&1 | tail -n 1
  /usr/bin/python3 "tests/bench/${file}"
  echo
}

benches
