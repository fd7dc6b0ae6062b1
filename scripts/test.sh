#!/usr/bin/env bash
# Runs every gradsync test from a fresh machine: installs the system packages,
# builds everything, runs the Bazel tests (C++ unit + multi-process
# integration tests), then the Python tests with Debian's /usr/bin/python3.
# Exits non-zero on any failure and prints the summary.
set -uo pipefail
cd "$(dirname "$0")/.."

scripts/setup || { echo "scripts/test.sh: setup failed"; exit 1; }

BAZEL_FLAGS=(--color=no --curses=no)
[ "${CI:-}" = "true" ] && BAZEL_FLAGS+=(--show_progress_rate_limit=30)

status=0
echo "== bazel build //..."
bazel build "${BAZEL_FLAGS[@]}" //... || status=1

if [ $status -eq 0 ]; then
  echo "== bazel test //..."
  bazel test "${BAZEL_FLAGS[@]}" //... || status=1
fi

# clang's thread-safety analysis (-Werror=thread-safety, see .bazelrc) over
# the libraries and binaries, tests excluded. Its own output base keeps the
# gcc build's cache; only compiles (no linking): the analysis is a compile step.
TSA_TARGETS=(//common/... //ipc/... //client/... //daemon/... //gpu/...)
if [ $status -eq 0 ]; then
  echo "== clang thread-safety build"
  bazel --output_base="${HOME}/.cache/gradsync-tsa" build "${BAZEL_FLAGS[@]}" \
    --config=thread_safety --output_groups=compilation_outputs "${TSA_TARGETS[@]}" || status=1
  bazel --output_base="${HOME}/.cache/gradsync-tsa" shutdown >/dev/null 2>&1
fi

if [ $status -eq 0 ] && [ -d tests/python ] && ls tests/python/test_*.py >/dev/null 2>&1; then
  echo "== python tests (/usr/bin/python3 -m pytest tests/python)"
  bazel build "${BAZEL_FLAGS[@]}" //client:libgradsync.so //daemon:gradsyncd || status=1
  if [ $status -eq 0 ]; then
    /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/python || status=1
  fi
fi

if [ $status -eq 0 ]; then
  echo "== scripts/test.sh: all tests passed"
else
  echo "== scripts/test.sh: FAILED"
fi
exit $status
