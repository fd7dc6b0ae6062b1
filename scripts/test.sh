#!/usr/bin/env bash
# Runs gradsync's tests from a fresh machine: installs the system packages,
# checks the format and function lengths, builds everything, runs the Bazel
# tests (C++ unit + multi-process integration tests), then the Python tests
# with Debian's /usr/bin/python3.
#
#   scripts/test.sh         the above: what a change needs before review
#   scripts/test.sh --all   also clang's thread-safety build, ASan+UBSan,
#                           TSan and fuzzing (what CI runs: .ci/run)
#
# Exits non-zero on any failure and prints the summary.
set -uo pipefail
cd "$(dirname "$0")/.."

ALL=0
case "${1:-}" in
  "") ;;
  --all) ALL=1 ;;
  *) echo "usage: scripts/test.sh [--all]" >&2; exit 2 ;;
esac

scripts/setup || { echo "scripts/test.sh: setup failed"; exit 1; }

# What the run leaves in /dev/shm is reported, never failed on: other
# users' daemons and other runs at the same time have entries there too.
# Counted: names that appeared during the run and are still there, and of
# those, how many record a creator pid ("<prefix>.<pid>.…") that is gone:
# leaked for good, unless a daemon of the same prefix sweeps them.
SHM_BEFORE="$(mktemp)"
shm_names() { ls -1 /dev/shm 2>/dev/null | LC_ALL=C sort; }
shm_names >"$SHM_BEFORE"
report_shm_leftovers() {
  local name pid new=0 dead=0
  local -A families=()
  while IFS= read -r name; do
    [ -n "$name" ] || continue
    new=$((new + 1))
    pid="${name#*.}"
    pid="${pid%%.*}"
    if [[ "$pid" =~ ^[0-9]+$ ]] && [ ! -e "/proc/$pid" ]; then
      dead=$((dead + 1))
      families[${name%%[0-9.]*}]=$((${families[${name%%[0-9.]*}]:-0} + 1))
    fi
  done < <(shm_names | LC_ALL=C comm -13 "$SHM_BEFORE" -)
  rm -f "$SHM_BEFORE"
  local by_prefix="" f
  for f in "${!families[@]}"; do by_prefix+=" ${f:-?}=${families[$f]}"; done
  echo "== /dev/shm left by this run (and others running meanwhile): new_entries=$new" \
    "creator_gone=$dead${by_prefix:+ creator_gone_by_prefix:$by_prefix}"
}

BAZEL_FLAGS=(--color=no --curses=no)
[ "${CI:-}" = "true" ] && BAZEL_FLAGS+=(--show_progress_rate_limit=30)
# Builds in other output bases (thread-safety, sanitizers, fuzz) make no
# bazel-* symlinks: repointed at their base, bazel-bin would no longer be
# the gcc build's, and `//...` would walk into the foreign bazel-<dir> tree.
OTHER_BASE_FLAGS=("${BAZEL_FLAGS[@]}" --symlink_prefix=/)

status=0
# A format or function-length finding fails the run but does not stop the
# tests.
echo "== format (scripts/check-format.sh)"
format_status=0
scripts/check-format.sh || format_status=1
echo "== function length (scripts/check-function-length.py)"
scripts/check-function-length.py || format_status=1

echo "== bazel build //..."
bazel build "${BAZEL_FLAGS[@]}" //... || status=1

if [ $status -eq 0 ]; then
  echo "== bazel test //..."
  bazel test "${BAZEL_FLAGS[@]}" //... || status=1
fi

if [ $status -eq 0 ] && [ -d tests/python ] && ls tests/python/test_*.py >/dev/null 2>&1; then
  echo "== python tests (/usr/bin/python3 -m pytest tests/python)"
  # As .bazelrc does for bazel test: the daemons these tests start keep
  # Abseil's lock-order check on.
  export GRADSYNC_MUTEX_DEADLOCK_CHECK=1
  bazel build "${BAZEL_FLAGS[@]}" //client:libgradsync.so //daemon:gradsyncd || status=1
  if [ $status -eq 0 ]; then
    /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/python || status=1
  fi
fi

# The rest is --all: each stage builds in an output base of its own.
if [ $ALL -eq 0 ]; then
  report_shm_leftovers
  [ $format_status -ne 0 ] && status=1
  [ $status -eq 0 ] && echo "== scripts/test.sh: passed (scripts/test.sh --all adds thread-safety, sanitizers, fuzzing)"
  [ $status -ne 0 ] && echo "== scripts/test.sh: FAILED"
  exit $status
fi

# clang's thread-safety analysis (-Werror=thread-safety, see .bazelrc) over
# the libraries and binaries, tests excluded. Its own output base keeps the
# gcc build's cache; only compiles (no linking): the analysis is a compile step.
TSA_TARGETS=(//common/... //ipc/... //client/... //daemon/... //gpu/...)
if [ $status -eq 0 ]; then
  echo "== clang thread-safety build"
  bazel --output_base="${HOME}/.cache/gradsync-tsa" build "${OTHER_BASE_FLAGS[@]}" \
    --config=thread_safety --output_groups=compilation_outputs "${TSA_TARGETS[@]}" || status=1
  bazel --output_base="${HOME}/.cache/gradsync-tsa" shutdown >/dev/null 2>&1
fi

# Sanitizers and fuzzing with Debian's clang (see .bazelrc's asan, tsan and
# fuzz configs), each in its own output base like the thread-safety build.
# Every stage prints its duration (stage=... seconds=...).
stage() {  # stage NAME COMMAND...: runs it, times it, fails the run on error
  local name=$1 start=$SECONDS
  shift
  echo "== $name"
  "$@" || status=1
  echo "stage=$name seconds=$((SECONDS - start))"
}

# ASan+UBSan: the unit tests and the core integration tests once more, the
# daemons and trainers they spawn included (the instrumented binaries). Not
# all of //...: building everything under ASan alone took ~27 min on the
# shared 2-core machine; this set's tests run in ~2 min once built.
ASAN_BASE="${HOME}/.cache/gradsync-asan"
ASAN_TARGETS=(//tests:abi_contract_test //tests/daemon/... //tests/ipc/... //tests/engine/...
  //tests/control/... //tests/integration:equivalence_test //tests/integration:fault_test)
if [ $status -eq 0 ]; then
  stage asan_ubsan bazel --output_base="$ASAN_BASE" test "${OTHER_BASE_FLAGS[@]}" --config=asan \
    "${ASAN_TARGETS[@]}"
  bazel --output_base="$ASAN_BASE" shutdown >/dev/null 2>&1
fi

# TSan: the threaded tests whose threads meet only through what TSan sees
# (std::atomic, pthreads): the flight recorder's lock-free log, and the
# rings and doorbell (their own code instrumented; the peer process is not
# seen). The system absl/gRPC are not instrumented, so tests synchronizing
# through absl::Mutex would report races that are not there: left out.
# truncation_guard_test is left out too: TSan defers signals, and the
# guard's SIGBUS rescue (a handler that must run on the faulting access)
# then hangs or dies inside TSan.
TSAN_BASE="${HOME}/.cache/gradsync-tsan"
TSAN_TARGETS=(//tests/control:flight_recorder_test //tests/ipc:spsc_ring_test
  //tests/ipc:ring_stress_test //tests/ipc:doorbell_test)
if [ $status -eq 0 ]; then
  stage tsan bazel --output_base="$TSAN_BASE" test "${OTHER_BASE_FLAGS[@]}" --config=tsan "${TSAN_TARGETS[@]}"
  bazel --output_base="$TSAN_BASE" shutdown >/dev/null 2>&1
fi

# libFuzzer: replay each committed corpus (tests/fuzz/corpus/<target>), then
# fuzz each target for FUZZ_SECONDS from a scratch copy of it, so the
# committed corpus only changes by hand (corpus/make_seeds.py).
FUZZ_BASE="${HOME}/.cache/gradsync-fuzz"
FUZZ_TARGETS=(ring_entry_fuzz segment_header_fuzz layout_fuzz rendezvous_records_fuzz
  rendezvous_service_fuzz)
FUZZ_SECONDS="${FUZZ_SECONDS:-20}"
run_fuzzers() {
  local bin scratch t rc=0 package=//tests/fuzz:
  bazel --output_base="$FUZZ_BASE" build "${OTHER_BASE_FLAGS[@]}" --config=fuzz \
    "${FUZZ_TARGETS[@]/#/$package}" || return 1
  bin="$(bazel --output_base="$FUZZ_BASE" info --config=fuzz bazel-bin 2>/dev/null)/tests/fuzz"
  scratch="$(mktemp -d)"
  for t in "${FUZZ_TARGETS[@]}"; do
    echo "-- $t: corpus replay, then ${FUZZ_SECONDS}s of fuzzing"
    "$bin/$t" -runs=0 -artifact_prefix="$scratch/$t-" "tests/fuzz/corpus/$t" 2>&1 | tail -n 3 || rc=1
    cp -r "tests/fuzz/corpus/$t" "$scratch/$t"
    (cd "$scratch" && "$bin/$t" -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 \
      -artifact_prefix="$scratch/$t-" "$scratch/$t" 2>&1 | tail -n 12) || rc=1
  done
  ls "$scratch"/*-crash-* "$scratch"/*-leak-* "$scratch"/*-timeout-* 2>/dev/null &&
    echo "fuzz findings kept in $scratch" && return 1
  rm -rf "$scratch"
  return $rc
}
if [ $status -eq 0 ]; then
  stage fuzz run_fuzzers
  bazel --output_base="$FUZZ_BASE" shutdown >/dev/null 2>&1
fi

report_shm_leftovers
[ $format_status -ne 0 ] && status=1
if [ $status -eq 0 ]; then
  echo "== scripts/test.sh: all tests passed"
else
  echo "== scripts/test.sh: FAILED"
fi
exit $status
