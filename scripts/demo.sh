#!/usr/bin/env bash
# The gradsync demo, from a fresh machine: installs what is needed, builds,
# starts a gradsyncd, runs two trainers doing real synced training (a
# hand-written C++ MLP over the C ABI, then a PyTorch MLP through the Python
# package when torch is available), and prints the daemon's stats and who
# the straggler was.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup
echo "== building (bazel build //...)"
bazel build --color=no --curses=no //... 2>&1 | tail -n 1

echo
echo "== GPU probe"
if [ -x bazel-bin/daemon/backends/nccl_probe ]; then
  # Exit 2 = no GPU here (fine for the CPU path); see gpu/probe_exit.h.
  bazel-bin/daemon/backends/nccl_probe || echo "(nccl_probe exit status $?)"
else
  echo "no CUDA toolkit with NCCL found: the GPU backend is not built"
fi

work=$(mktemp -d /tmp/gradsync-demo.XXXXXX)
socket="$work/gradsyncd.sock"
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
daemon_pid=""
cleanup() {
  [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

echo
echo "== starting gradsyncd (2 trainers on this node) on $socket, control on 127.0.0.1:$port"
bazel-bin/daemon/gradsyncd --socket "$socket" --listen "127.0.0.1:$port" --local-size 2 \
  --bucket-cap-mb 0.001 --first-bucket-cap-mb 0.0005 --shm-prefix "gsdemo$$" \
  >"$work/daemon.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 100); do [ -S "$socket" ] && break; sleep 0.05; done

echo
echo "== 2 C++ trainers (examples/mlp_trainer), each on half of every batch of 64"
# Trainer 1 is the same model from the test trainer (tests/testing/fault_trainer),
# told to sleep 20 ms in every backward: the straggler gradsyncctl names below.
LOCAL_RANK=0 bazel-bin/examples/mlp_trainer --socket "$socket" --steps 30 --fp64 \
  --out "$work/weights0.txt" >"$work/trainer0.log" 2>&1 &
LOCAL_RANK=1 bazel-bin/tests/testing/fault_trainer --socket "$socket" --steps 30 --fp64 \
  --sleep-ms 20 --out "$work/weights1.txt" >"$work/trainer1.log" 2>&1 &
wait %2 %3
grep -E "step +(0|5|10|15|20|25|29) " "$work/trainer0.log"
grep -h "checksum" "$work"/trainer*.log
bazel-bin/examples/mlp_trainer --single --steps 30 --fp64 --quiet --out "$work/single.txt"
if cmp -s "$work/weights0.txt" "$work/weights1.txt"; then
  echo "trainers 0 and 1 hold identical weights"
fi
/usr/bin/python3 - "$work" <<'PY'
import sys
d = sys.argv[1]
load = lambda p: [float(l.split()[1]) for l in open(p)]
a, ref = load(d + "/weights0.txt"), load(d + "/single.txt")
diff = max(abs(x - y) for x, y in zip(a, ref)) / max(abs(y) for y in ref)
print(f"vs one process on the whole batch: max relative difference {diff:.2e}")
PY

echo
echo "== gradsyncctl stragglers (trainer 1 slept 20 ms in every backward)"
bazel-bin/tools/gradsyncctl/gradsyncctl --addr "127.0.0.1:$port" stragglers

if [ -d client/python/gradsync ] && /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo
  echo "== 2 PyTorch trainers (examples/train_mlp.py) through gradsync.run and DistributedOptimizer"
  GRADSYNC_SOCKET="$socket" PYTHONPATH=client/python \
    /usr/bin/python3 -m gradsync.run --nproc 2 --socket "$socket" examples/train_mlp.py
fi

echo
echo "== gradsyncctl stats"
bazel-bin/tools/gradsyncctl/gradsyncctl --addr "127.0.0.1:$port" stats
