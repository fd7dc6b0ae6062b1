#!/usr/bin/env bash
# Runs gradsync's GPU checks on a GPU node from a bundle made by
# scripts/gpu-bundle.sh, and prints everything (one command, well inside
# 8 minutes on one GPU):
#
#   scripts/gpu-check.sh BUNDLE        # or, from the bundle itself: ./gpu-check.sh
#
# 1. the node: glibc / libstdc++ versions against what the bundle needs,
#    the GPU, the driver, NCCL (from $NCCL_LIB, Python's nvidia/nccl/lib, or
#    the system);
# 2. the GPU unit tests (every bin/*_test);
# 3. the end-to-end checks in BUNDLE/check/ (each prints its own result).
# Without a GPU it stops at once, saying so. Exit status: 0 when everything
# ran and passed, 1 when something failed, 2 when this node cannot run it.
set -uo pipefail
export PYTHONUNBUFFERED=1
# This is a GPU node: a GPU test that skips for want of a GPU fails here.
export GRADSYNC_REQUIRE_GPU=1

BUNDLE=${1:-$(dirname "$0")}
if [ ! -f "$BUNDLE/MANIFEST" ] || [ ! -d "$BUNDLE/bin" ]; then
  echo "gpu-check: '$BUNDLE' is not a bundle (no MANIFEST, bin/): make one with scripts/gpu-bundle.sh" >&2
  exit 2
fi
BUNDLE=$(cd "$BUNDLE" && pwd)
PY=${PYTHON:-python3}

echo "== the node"
cat "$BUNDLE/MANIFEST"
ldd --version 2>&1 | head -1
glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
need_glibc=$(sed -n 's/^needs: GLIBC \([0-9.]*\),.*/\1/p' "$BUNDLE/MANIFEST")
need_glibcxx=$(sed -n 's/.*GLIBCXX \([0-9.]*\).*/\1/p' "$BUNDLE/MANIFEST")
libstdcxx=$(ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}')
have_glibcxx=$(strings "${libstdcxx:-/nonexistent}" 2>/dev/null | grep -o '^GLIBCXX_3\.4\.[0-9]*$' | sort -uV | tail -1 | cut -d_ -f2)
echo "glibc $glibc (bundle needs $need_glibc); libstdc++ $libstdcxx offers GLIBCXX up to ${have_glibcxx:-unknown} (bundle needs $need_glibcxx)"
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1)" = "$2" ]; }
if [ -n "$glibc" ] && [ -n "$need_glibc" ] && ! version_ge "$glibc" "$need_glibc"; then
  echo "gpu-check: this node's glibc $glibc is older than the $need_glibc the bundle was built against: build the bundle on an older distribution" >&2
  exit 2
fi
if [ -n "$have_glibcxx" ] && [ -n "$need_glibcxx" ] && ! version_ge "$have_glibcxx" "$need_glibcxx"; then
  echo "gpu-check: this node's libstdc++ offers GLIBCXX_$have_glibcxx, the bundle needs GLIBCXX_$need_glibcxx (shipping a libstdc++ would clash with torch's): build the bundle with an older compiler" >&2
  exit 2
fi

gpus=$(nvidia-smi -L 2>/dev/null)
if [ -z "$gpus" ]; then
  echo "gpu-check: no NVIDIA GPU is visible on this machine (nvidia-smi lists none): these checks need one; nothing was run" >&2
  exit 2
fi
echo "$gpus"
nvidia-smi --query-gpu=driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1

# NCCL: $NCCL_LIB, then the wheel under this python, then the system.
if [ -z "${NCCL_LIB:-}" ]; then
  NCCL_LIB=$("$PY" -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null || true)
fi
if [ -n "${NCCL_LIB:-}" ] && [ -e "$NCCL_LIB/libnccl.so.2" ]; then
  export NCCL_LIB
  echo "NCCL: $NCCL_LIB/libnccl.so.2"
else
  unset NCCL_LIB
  echo "NCCL: not in \$NCCL_LIB nor under $PY's nvidia/nccl/lib; the system's libnccl.so.2 if any"
fi
export GRADSYNC_DAEMON="$BUNDLE/bin/gradsyncd"
export GRADSYNC_LIB="$BUNDLE/python/gradsync/lib/libgradsync.so"
export PYTHONPATH="$BUNDLE/python${PYTHONPATH:+:$PYTHONPATH}"
export GRADSYNC_BUNDLE="$BUNDLE"
# The GPU tests find gradsyncd and their helper programs as runfiles.
export TEST_SRCDIR="$BUNDLE/runfiles" TEST_WORKSPACE=gradsync
[ -x "$BUNDLE/bin/nccl_probe" ] && "$BUNDLE/bin/nccl_probe"

passed=0
failed=0
run() {  # run NAME CMD...: prints the output, counts the result
  local name=$1 start rc
  shift
  echo
  echo "== $name"
  start=$(date +%s)
  timeout 300 "$@"
  rc=$?
  if [ $rc -eq 0 ]; then passed=$((passed + 1)); echo "-- $name: ok ($(($(date +%s) - start)) s)"
  else failed=$((failed + 1)); echo "-- $name: FAILED (exit $rc, $(($(date +%s) - start)) s)"; fi
}

for t in "$BUNDLE"/bin/*_test; do
  [ -x "$t" ] || continue
  run "$(basename "$t")" "$t" --gtest_brief=1
done

# End-to-end checks shipped with the bundle (tests/gpu/check/*.sh).
if [ -d "$BUNDLE/check" ]; then
  for c in "$BUNDLE"/check/*.sh; do
    [ -f "$c" ] || continue
    run "check $(basename "$c" .sh)" bash "$c"
  done
fi

echo
echo "gpu-check: $passed passed, $failed failed"
[ $failed -eq 0 ]
