#!/usr/bin/env bash
# gpu-check: PyTorch jobs on 2 gradsync nodes x 1 trainer sharing this GPU
# (two real NCCL ranks, see two_nodes.sh), started by `python3 -m gradsync.run`
# (which starts each node's gradsyncd from the bundle): DistributedOptimizer,
# then DDP with gradsync's communication hook; both must equal
# single-process training. Needs what gpu-check.sh exports: GRADSYNC_DAEMON,
# GRADSYNC_LIB, PYTHONPATH.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/two_nodes.sh"
out=$(mktemp -d /tmp/gs-torch.XXXXXX)
trap 'rm -rf "$out"' EXIT
PY=${PYTHON:-python3}
gs_two_nodes "$out" optimizer 1 "$here/torch_equivalence.py" trainer "$out"
gs_two_nodes "$out" ddp 1 "$here/torch_equivalence.py" trainer-ddp "$out"
"$PY" "$here/torch_equivalence.py" reference "$out"
"$PY" "$here/torch_equivalence.py" compare "$out"
