#!/usr/bin/env bash
# The gradsync demo from a fresh machine: installs what is needed, builds,
# prints the GPU probe, starts a gradsyncd and trainers doing real synced
# training, then shows the daemon's stats.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup
bazel build --color=no --curses=no //... 2>&1 | tail -n 2

echo "== GPU probe"
if [ -x bazel-bin/daemon/backends/nccl_probe ]; then
  bazel-bin/daemon/backends/nccl_probe
else
  echo "no CUDA toolkit with NCCL found: the GPU backend is not built"
fi
