#!/usr/bin/env bash
# gpu-check: a PyTorch job (DistributedOptimizer on a CUDA model) with 2
# trainers sharing this node's GPU, started by `python3 -m gradsync.run`
# (which starts gradsyncd from the bundle), equals single-process training.
# Needs what gpu-check.sh exports: GRADSYNC_DAEMON, GRADSYNC_LIB, PYTHONPATH.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d /tmp/gs-torch.XXXXXX)
sock=$out/gradsyncd.sock
trap 'rm -rf "$out"' EXIT
PY=${PYTHON:-python3}
"$PY" -m gradsync.run --nproc 2 --socket "$sock" --daemon-arg=--backend=auto \
  "$here/torch_equivalence.py" trainer "$out"
"$PY" "$here/torch_equivalence.py" reference "$out"
"$PY" "$here/torch_equivalence.py" compare "$out"
