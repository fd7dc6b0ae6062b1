#!/usr/bin/env bash
# gpu-check: the benchmark table (tests/gpu/check/bench.py): gradsync with
# 1 and 2 trainers on this GPU vs torch DDP (NCCL) and plain ncclAllReduce,
# for 4 KB, 25 MB and 100 MB of gradients. Prints the table; asserts nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d /tmp/gs-bench.XXXXXX)
trap 'rm -rf "$out"' EXIT
PY=${PYTHON:-python3}
for size in 4096 26214400 104857600; do
  for n in 1 2; do
    "$PY" -m gradsync.run --nproc "$n" --socket "$out/gradsyncd.sock" --daemon-arg=--backend=auto \
      "$here/bench.py" gradsync "$out/gradsync.$size.$n.json" "$size"
  done
  "$PY" "$here/bench.py" torch "$out/torch.$size.json" "$size"
done
"$PY" "$here/bench.py" table "$out"
