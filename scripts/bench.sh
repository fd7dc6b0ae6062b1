#!/usr/bin/env bash
# Builds and runs gradsync's benchmarks (//tests/bench): each prints a
# table comparing gradsync with the references of docs/PERFORMANCE.md,
# measured in the same run, and writes bench-results/<name>.json (every
# figure, the machine, the exact command) and, for the Python drivers,
# PNG plots (tests/bench/bench_report.py). Benchmarks, not tests: they
# assert nothing. Progress (which benchmark, how far, time left) on stderr.
# Usage: scripts/bench.sh [--quick] [NAME...]   (default: every benchmark below)
#   --quick  fewer sizes, caps and iterations (GRADSYNC_BENCH_QUICK=1): the
#            whole run in under 5 minutes on a 2-core machine
set -euo pipefail
cd "$(dirname "$0")/.."

BAZEL_FLAGS=(--color=no --curses=no)
if [ "${1:-}" = "--quick" ]; then
  export GRADSYNC_BENCH_QUICK=1
  shift
fi
quick() { [ "${GRADSYNC_BENCH_QUICK:-0}" = 1 ]; }

# One line per benchmark: `bench TARGET [ARGS...]` (TARGET in //tests/bench)
# or `py_bench FILE TARGETS...` (the bazel targets the driver runs).
benches() {
  bench ipc_bench
  bench local_reduce_bench
  bench gloo_allreduce_bench --nodes=2 $(quick && echo --iters=3 --rounds=2)
  py_bench half_conversion_bench.py //tests/bench:local_reduce_bench
  py_bench sync_bench.py //daemon:gradsyncd //tools/gradsyncctl //tests/bench:bench_trainer //tests/bench:gloo_allreduce_bench
  py_bench broadcast_bench.py //daemon:gradsyncd //tests/bench:bench_trainer //tests/bench:gloo_allreduce_bench
  py_bench join_bench.py //daemon:gradsyncd //tests/bench:bench_trainer
  py_bench elastic_recovery_bench.py //daemon:gradsyncd //examples:mlp_trainer
  py_bench elastic_goodput_bench.py //daemon:gradsyncd //tests/testing:fault_trainer
  py_bench torch_step_bench.py //daemon:gradsyncd //client:libgradsync.so
  py_bench buffers_bench.py //daemon:gradsyncd //client:libgradsync.so
  py_bench bucket_sweep_bench.py //daemon:gradsyncd //client:libgradsync.so
  py_bench autotune_bench.py //daemon:gradsyncd //client:libgradsync.so
  py_bench link_bench.py //daemon:gradsyncd //client:libgradsync.so //tests/bench:bench_trainer
}

selected=("$@")
# Two passes over benches(): the first collects the targets to build (one
# bazel build, not one per benchmark), the second runs them.
pass=collect
targets=()
done_count=0
start_s=$SECONDS
progress() {
  echo "[bench.sh] $1 (benchmark $((done_count + 1)), $((SECONDS - start_s))s elapsed)" >&2
  done_count=$((done_count + 1))
}

bench() {
  local target=$1
  shift
  if [ ${#selected[@]} -gt 0 ] && [[ ! " ${selected[*]} " == *" ${target} "* ]]; then
    return 0
  fi
  if [ "$pass" = collect ]; then
    targets+=("//tests/bench:${target}")
    return 0
  fi
  progress "//tests/bench:${target}"
  echo "== //tests/bench:${target} $*"
  # The wrapper passes the output through and keeps its tables as JSON.
  /usr/bin/python3 tests/bench/bench_report.py --wrap "${target}" \
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
  if [ "$pass" = collect ]; then
    targets+=("$@")
    return 0
  fi
  progress "tests/bench/${file}"
  echo "== tests/bench/${file}"
  /usr/bin/python3 "tests/bench/${file}"
  echo
}

benches
if [ ${#targets[@]} -gt 0 ]; then
  echo "[bench.sh] building ${#targets[@]} targets" >&2
  bazel build "${BAZEL_FLAGS[@]}" "${targets[@]}" 2>&1 | tail -n 1
fi
pass=run
benches
echo "[bench.sh] done in $((SECONDS - start_s))s; results in bench-results/" >&2
