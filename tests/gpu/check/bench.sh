#!/usr/bin/env bash
# gpu-check: the benchmark (tests/gpu/check/bench.py), every contender with 2
# NCCL ranks on this one GPU: gradsync (2 nodes x 1 trainer) vs torch DDP
# (NCCL) vs plain ncclAllReduce, for 4 KB, 25 MB and 100 MB of gradients.
# Prints the table (and writes it as JSON to $GPU_CHECK_ITEM_DIR/bench.json
# when set); asserts nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/two_nodes.sh"
out=$(mktemp -d /tmp/gs-bench.XXXXXX)
trap 'rm -rf "$out"' EXIT
PY=${PYTHON:-python3}
SIZES=(4096 26214400 104857600)
mkdir "$out/results"
# torch first: its numbers are the reference the gradsync rows are read against.
port=$(gs_free_port)
pids=()
for r in 0 1; do
  NCCL_HOSTID=gradsync-check-node$r NCCL_SOCKET_IFNAME=lo MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 "$PY" "$here/bench.py" torch "$out/results/torch.json" "${SIZES[@]}" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
[ $rc -eq 0 ] || echo "bench: the torch ranks failed (exit $rc)"
for size in "${SIZES[@]}"; do
  gs_two_nodes "$out" "bench$size" 1 "$here/bench.py" gradsync "$out/results/gradsync.$size.json" "$size" ||
    echo "bench: gradsync at $size bytes failed"
done
"$PY" "$here/bench.py" table "$out/results" "${GPU_CHECK_ITEM_DIR:+$GPU_CHECK_ITEM_DIR/bench.json}"
