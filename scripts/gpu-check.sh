#!/usr/bin/env bash
# Proves gradsync's GPU path on a GPU node, from a bundle made by
# scripts/gpu-bundle.sh, in one command that ends within its own budget
# (default 330 s, so that a run and one rerun fit 15 minutes of borrowed GPU
# time with the machine's start):
#
#   scripts/gpu-check.sh BUNDLE            # or, from the bundle itself: ./gpu-check.sh
#   scripts/gpu-check.sh --dry-run [BUNDLE]   # (or GPU_CHECK_PLAN_ONLY=1) no GPU needed:
#                                             # prints the plan, runs the budget logic
#
# Items, in this order (each with its own limit; an item gets min(its
# limit, time left), one that cannot get GPU_CHECK_MIN_START_S is reported
# SKIPPED-BUDGET):
#   preflight  python3 has torch and the nvidia-nccl-cu13 wheel (where
#              libnccl.so.2 is), compute mode Default (Exclusive_Process
#              breaks every multi-process test), MIG off; driver, CUDA,
#              NCCL, torch, glibc versions; ldd of every shipped ELF file;
#              GLIBCXX offered vs needed (read from the files by python3,
#              no `strings` needed)                       -- stops all if it fails
#   canary     one daemon, one trainer, one iteration    -- stops all if it fails
#   unit:*     the GPU unit tests (bin/*_test but cuda_path_test); cuda_device
#              includes the local-sum kernel's non-finite flag
#   cabi       C ABI equivalence: 1, 2, 4 trainers sharing the GPU; flat and
#              user pointer; fp32 and bf16
#   cabi:event-pool  pooled readiness events: 4 trainers x 5,000 tensors
#              (1,024 IPC events opened, not 20,000); an event re-recorded
#              on a second stream
#   two-nodes: 2 gradsyncd "nodes" x 2 trainers on the one GPU (distinct
#              NCCL_HOSTID, NCCL_SOCKET_IFNAME=lo: two real NCCL ranks):
#              equivalence; a node that never joins -> TIMEOUT, then a fresh
#              generation; a node skipping a collective -> both fail naming it
#   torch      PyTorch, 2 nodes x 1 trainer: DistributedOptimizer and the
#              DDP hook equal single-process training
#   killed     a trainer SIGKILLed mid-iteration, named to its peer; an Inf
#              from one trainer fails both, naming it (--nonfinite=error)
#   broadcast  gs_broadcast of a 64 MiB device buffer: 2 trainers sharing
#              the GPU, then 2 "nodes" x 2 trainers (ncclBroadcast)
#   elastic    3 "nodes" x 2 trainers, --min-nodes 2: node 2 SIGKILLed while
#              the others wait for it inside NCCL; they abort, create new
#              communicators (2 ranks) and redo the step from kept sums;
#              then a trainer SIGKILLed mid-backward leaves its node in
#              (every node redoes the step without it, its node's survivor
#              from device copies of its inputs);
#              one SIGKILLed before its first / after its last mark of a
#              step leaves its node in (5 trainers average on, nobody
#              re-forms); then 2 "nodes" + a joiner (--max-nodes 3): node 2
#              joins the running job, all re-create communicators (3 ranks)
#              and its trainers catch up by gs_broadcast of a device buffer;
#              a trainer SIGKILLed before its first mark and restarted takes
#              back its local rank and catches up the same way; node 2
#              SIGKILLed inside step 2's last collective after node 0
#              completed it and before node 1 did (a test hook holds node
#              1): node 0 ncclBroadcasts the step's kept result, node 1
#              commits it (7 tests: 29 s in all on an H100 on 2026-11-28,
#              the first run; the limit is three times that)
#   bench      gradsync vs torch DDP vs plain ncclAllReduce, 2 ranks each
# Ends with one table (item, result, seconds); with $OUT set, writes
# $OUT/gpu-check.log (everything printed) and $OUT/gpu-check.json.
#
# Environment: GPU_CHECK_BUDGET_S (330), GPU_CHECK_MIN_START_S (10),
# GPU_CHECK_ONLY (a regex of item names to run; the others are NOT-SELECTED),
# PYTHON (python3), NCCL_LIB. Plan mode only: GPU_CHECK_PLAN_ITEM_S (how long
# each item is taken to last; default its whole grant, the worst case) and
# GPU_CHECK_PLAN_FAIL (an item name that is taken to fail).
# Exit status: 0 every item passed; 1 an item failed or timed out; 2 this
# node cannot run the checks (no GPU, bad bundle, preflight or canary
# failed); 3 all that ran passed but some were skipped for the budget.
set -uo pipefail
export PYTHONUNBUFFERED=1
SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")

# ---- The items: NAME LIMIT_S FATAL FUNCTION NEEDS (bundle files) -----------
ITEMS=(
  "preflight            40 fatal item_preflight  bin/gradsyncd"
  "canary               45 fatal item_canary     bin/gradsyncd,bin/cuda_trainer"
  "unit:nccl_loader     15 -     item_unit       bin/nccl_loader_test"
  "unit:cuda_status     15 -     item_unit       bin/cuda_status_test"
  "unit:cuda_device_switch 15 -  item_unit       bin/cuda_device_switch_test"
  "unit:nccl_collectives 60 -    item_unit       bin/nccl_collectives_test"
  "unit:cuda_device     45 -     item_unit       bin/cuda_device_test,bin/cuda_device_helper"
  "cabi                 90 -     item_gtest      bin/cuda_path_test,bin/cuda_trainer"
  "cabi:event-pool      60 -     item_gtest      bin/cuda_path_test,bin/cuda_trainer"
  "two-nodes:equivalence 60 -    item_gtest      bin/cuda_path_test,bin/cuda_trainer"
  "two-nodes:never-joins 60 -    item_gtest      bin/cuda_path_test,bin/cuda_trainer"
  "two-nodes:skip       50 -     item_gtest      bin/cuda_path_test,bin/cuda_trainer"
  "torch                90 -     item_check      check/torch_job.sh,check/torch_equivalence.py,check/two_nodes.sh"
  "killed               40 -     item_gtest      bin/cuda_path_test,bin/cuda_trainer"
  "broadcast            45 -     item_gtest      bin/cuda_path_test,bin/cuda_trainer"
  "elastic              90 -     item_gtest      bin/cuda_path_test,bin/cuda_trainer"
  "bench               120 -     item_check      check/bench.sh,check/bench.py,check/two_nodes.sh"
)
# The gtest filter of each item_gtest item.
gtest_filter() {
  case $1 in
    cabi) echo 'SharingOneGpu/CudaPathTest.*' ;;
    cabi:event-pool) echo 'CudaPathPoolTest.*' ;;
    two-nodes:equivalence) echo 'OneGpu/CudaTwoNodesTest.*' ;;
    two-nodes:never-joins) echo 'CudaTwoNodesFaultTest.NodeThatNeverJoins*' ;;
    two-nodes:skip) echo 'CudaTwoNodesFaultTest.NodeSkippingACollective*' ;;
    killed) echo 'CudaPathFaultTest.*' ;;
    broadcast) echo 'CudaBroadcastTest.*' ;;
    elastic) echo 'CudaElasticTest.*' ;;
  esac
}

say() { echo "gpu-check: $*"; }
now_s() { local u; read -r u _ < /proc/uptime; echo "${u%.*}"; }  # monotonic, whole seconds

# ---- Item bodies (run as `gpu-check.sh --item NAME`, under `timeout`) -------

item_unit() {  # unit:X -> bin/X_test
  "$BUNDLE/bin/${1#unit:}_test" --gtest_brief=1
}

item_gtest() {
  "$BUNDLE/bin/cuda_path_test" --gtest_brief=1 --gtest_filter="$(gtest_filter "$1")"
}

item_check() {
  local script=$1
  [ "$1" = torch ] && script=torch_job
  bash "$BUNDLE/check/$script.sh"
}

item_preflight() {
  local bad=0 f
  echo "-- bundle"
  cat "$BUNDLE/MANIFEST"
  echo "-- python: $(command -v "$PY")"
  if ! "$PY" - <<'PY'
import os, sys
print("python", sys.version.split()[0], sys.executable)
try:
    import torch
except Exception as e:
    sys.exit(f"gpu-check: {sys.executable} has no torch ({e}): run with PYTHON=<the python that has it>")
try:
    torch_nccl = torch.cuda.nccl.version()
except Exception as e:  # a CPU-only build has none
    torch_nccl = f"none ({e})"
print("torch", torch.__version__, "built for CUDA", torch.version.cuda,
      "cuda available", torch.cuda.is_available(), "torch's NCCL", torch_nccl)
if not torch.cuda.is_available():
    sys.exit(f"gpu-check: {sys.executable}'s torch sees no CUDA device (a CPU-only build?)")
try:
    import nvidia.nccl as n
except Exception as e:
    sys.exit(f"gpu-check: {sys.executable} has no nvidia-nccl-cu13 wheel (import nvidia.nccl: {e})")
lib = os.path.join(list(n.__path__)[0], "lib", "libnccl.so.2")
if not os.path.exists(lib):
    sys.exit(f"gpu-check: the nvidia-nccl wheel has no {lib}")
import ctypes
v = ctypes.c_int(0)
ctypes.CDLL(lib).ncclGetVersion(ctypes.byref(v))
print(f"libnccl.so.2: {lib} (NCCL {v.value // 10000}.{v.value // 100 % 100}.{v.value % 100})")
PY
  then bad=1; fi

  echo "-- GPU"
  nvidia-smi -L
  local q
  q=$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode,mig.mode.current \
        --format=csv,noheader 2>&1 | head -1)
  echo "name, driver, memory, compute mode, MIG: $q"
  echo "CUDA (driver): $(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: *[0-9.]*' | head -1)"
  command -v nvcc >/dev/null && echo "nvcc: $(nvcc --version | tail -1)"
  case "$q" in
    *Exclusive_Process*|*Exclusive_Thread*|*Prohibited*)
      say "the GPU's compute mode is not Default ($q): every multi-process test would fail; nvidia-smi -c DEFAULT"; bad=1 ;;
  esac
  case "$q" in
    *", Enabled"*) say "MIG is enabled ($q): NCCL and CUDA IPC need the whole GPU; nvidia-smi -mig 0"; bad=1 ;;
  esac

  echo "-- C/C++ runtime"
  ldd --version 2>&1 | head -1
  local elves=() libstdcxx=""
  for f in "$BUNDLE"/bin/* "$BUNDLE"/lib/* "$BUNDLE"/python/gradsync/lib/*.so; do
    [ -f "$f" ] && elves+=("$f")
  done
  for f in "${elves[@]}"; do
    libstdcxx=$(ldd "$f" 2>/dev/null | awk '/libstdc\+\+\.so/ && $3 ~ /^\// {print $3; exit}')
    [ -n "$libstdcxx" ] && break
  done
  echo "libstdc++ the binaries load: ${libstdcxx:-none (none of them loads one)}"
  echo "-- ldd of every shipped ELF file"
  for f in "${elves[@]}"; do
    echo "$f:"
    ldd "$f" 2>&1 | sed 's/^/    /'
    if ldd "$f" 2>&1 | grep -q "not found"; then
      say "NOT FOUND: $f needs a library this node lacks: $(ldd "$f" 2>&1 | grep 'not found' | tr -s ' \t' ' ')"
      bad=1
    fi
  done
  # Versions needed (the binaries' version references) vs offered (the
  # libraries' version names), read as bytes: no binutils needed.
  if ! "$PY" - "${libstdcxx:-}" "${elves[@]}" <<'PY'
import re, subprocess, sys
def versions(path, prefix):
    with open(path, "rb") as f:
        data = f.read()
    return {tuple(int(x) for x in m.split(b"_")[1].split(b"."))
            for m in re.findall(prefix + rb"_[0-9]+(?:\.[0-9]+)+", data)}
def show(v):
    return ".".join(map(str, v)) if v else "none"
libstdcxx, files = sys.argv[1], sys.argv[2:]
need_cxx = max((v for f in files for v in versions(f, rb"GLIBCXX")), default=None)
need_c = max((v for f in files for v in versions(f, rb"GLIBC")), default=None)
have_cxx = max(versions(libstdcxx, rb"GLIBCXX"), default=None) if libstdcxx else None
print(f"GLIBCXX: the bundle needs up to {show(need_cxx)}, {libstdcxx or 'libstdc++'} offers up to {show(have_cxx)}")
print(f"GLIBC: the bundle needs up to {show(need_c)}")
if need_cxx and libstdcxx and (have_cxx is None or have_cxx < need_cxx):
    sys.exit("gpu-check: this node's libstdc++ is older than the bundle needs (shipping one would "
             "clash with torch's): build the bundle with an older compiler")
PY
  then bad=1; fi

  echo "-- gradsync's NCCL probe"
  [ -x "$BUNDLE/bin/nccl_probe" ] && { "$BUNDLE/bin/nccl_probe" || bad=1; }
  return $bad
}

item_canary() {
  local dir sock pid rc=0 i
  dir=$(mktemp -d /tmp/gs-canary.XXXXXX)
  sock=$dir/gradsyncd.sock
  "$BUNDLE/bin/gradsyncd" --socket="$sock" --listen=127.0.0.1:0 --local-size=1 \
    --shm-prefix="gscanary$$" --backend=nccl --timeout-s=10 > "$dir/daemon.log" 2>&1 &
  pid=$!
  for i in $(seq 100); do [ -S "$sock" ] && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  if [ ! -S "$sock" ]; then
    say "canary: gradsyncd did not start"; cat "$dir/daemon.log"; kill -9 $pid 2>/dev/null
    rm -rf "$dir"; return 1
  fi
  LOCAL_RANK=0 "$BUNDLE/bin/cuda_trainer" --socket="$sock" --steps=1 || rc=$?
  kill -TERM $pid 2>/dev/null
  wait $pid 2>/dev/null
  if ! grep -q "backend=gpu-cuda" "$dir/daemon.log"; then
    say "canary: the daemon never ran the CUDA path"; [ $rc -ne 0 ] || rc=1
  fi
  echo "---- canary daemon log"; cat "$dir/daemon.log"
  rm -rf "$dir"
  return $rc
}

# ---- Arguments, mode, environment ------------------------------------------

PLAN_ONLY=${GPU_CHECK_PLAN_ONLY:-0}
ITEM=""
ARGS=()
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run|--plan) PLAN_ONLY=1 ;;
    --item) ITEM=$2; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$SELF" | sed '$d'; exit 0 ;;
    *) ARGS+=("$1") ;;
  esac
  shift
done
[ "$PLAN_ONLY" = 1 ] || PLAN_ONLY=0
BUNDLE=${ARGS[0]:-}
if [ -z "$BUNDLE" ] && [ -f "$(dirname "$SELF")/MANIFEST" ]; then BUNDLE=$(dirname "$SELF"); fi
PY=${PYTHON:-python3}
export PYTHON=$PY

if [ -n "$ITEM" ]; then  # one item's body, in the environment main() exported
  for line in "${ITEMS[@]}"; do
    read -r name _ _ fn _ <<< "$line"
    [ "$name" = "$ITEM" ] && { "$fn" "$name"; exit $?; }
  done
  echo "gpu-check: no item $ITEM" >&2
  exit 2
fi

if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  exec > >(tee "$OUT/gpu-check.log") 2>&1
  TEE_PID=$!
fi
finish() {  # finish CODE: lets tee write the whole log, then exits
  if [ -n "${TEE_PID:-}" ]; then exec >&- 2>&-; wait "$TEE_PID" 2>/dev/null; fi
  exit "$1"
}

if [ -n "$BUNDLE" ]; then
  if [ ! -f "$BUNDLE/MANIFEST" ] || [ ! -d "$BUNDLE/bin" ]; then
    say "'$BUNDLE' is not a bundle (no MANIFEST, bin/): make one with scripts/gpu-bundle.sh" >&2
    exit 2
  fi
  BUNDLE=$(cd "$BUNDLE" && pwd)
elif [ $PLAN_ONLY = 0 ]; then
  say "usage: gpu-check.sh BUNDLE (a folder made by scripts/gpu-bundle.sh); --dry-run for the plan" >&2
  exit 2
fi

BUDGET=${GPU_CHECK_BUDGET_S:-330}
MIN_START=${GPU_CHECK_MIN_START_S:-10}
KILL_GRACE=5  # timeout -k: what a stuck item may overrun its grant by
case "$BUDGET$MIN_START" in *[!0-9]*) say "GPU_CHECK_BUDGET_S and GPU_CHECK_MIN_START_S are whole seconds" >&2; exit 2 ;; esac

if [ $PLAN_ONLY = 0 ]; then
  # Fail fast without a GPU: seconds, not the budget.
  if ! gpus=$(timeout 20 nvidia-smi -L 2>/dev/null) || [ -z "$gpus" ]; then
    say "no NVIDIA GPU is visible on this machine (nvidia-smi lists none): these checks need one; nothing was run" >&2
    exit 2
  fi
  # This is a GPU node: a GPU test that skips for want of a GPU fails here.
  export GRADSYNC_REQUIRE_GPU=1
  if [ -z "${NCCL_LIB:-}" ]; then
    NCCL_LIB=$("$PY" -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null || true)
  fi
  if [ -n "${NCCL_LIB:-}" ] && [ -e "$NCCL_LIB/libnccl.so.2" ]; then export NCCL_LIB; else unset NCCL_LIB; fi
  export GRADSYNC_DAEMON="$BUNDLE/bin/gradsyncd"
  export GRADSYNC_LIB="$BUNDLE/python/gradsync/lib/libgradsync.so"
  export PYTHONPATH="$BUNDLE/python${PYTHONPATH:+:$PYTHONPATH}"
  export GRADSYNC_BUNDLE="$BUNDLE"
  # The GPU tests find gradsyncd and their helper programs as runfiles.
  export TEST_SRCDIR="$BUNDLE/runfiles" TEST_WORKSPACE=gradsync
  # Daemons started by the check scripts: short timeouts.
  export GS_CHECK_DAEMON_TIMEOUT_S=20
fi

# ---- The run ---------------------------------------------------------------

START=$(now_s)
CLOCK=0  # plan mode: the simulated seconds spent
elapsed() { if [ $PLAN_ONLY = 1 ]; then echo $CLOCK; else echo $(($(now_s) - START)); fi; }
RESULTS=()   # "name|result|seconds|limit|granted|detail"
STOPPED=""   # set once a fatal item failed
failed=0 skipped=0
ITEM_DIRS=$(mktemp -d /tmp/gs-check-items.XXXXXX)

# Kills what an item left running (daemons started in their own session),
# found by the tag in their environment: nothing else on the node.
reap() {
  local tag=$1 p
  for p in /proc/[0-9]*; do
    [ "${p#/proc/}" = "$$" ] && continue
    # The redirection comes first: a process gone meanwhile is not an error.
    if tr '\0' '\n' 2>/dev/null < "$p/environ" | grep -qx "GPU_CHECK_TAG=$tag"; then
      kill -9 "${p#/proc/}" 2>/dev/null
    fi
  done
}

if [ $PLAN_ONLY = 1 ]; then
  say "PLAN ONLY: nothing runs; budget $BUDGET s, an item needs $MIN_START s to start," \
      "each item taken to last ${GPU_CHECK_PLAN_ITEM_S:-its whole grant}"
else
  say "budget $BUDGET s (GPU_CHECK_BUDGET_S), bundle $BUNDLE, python $PY"
fi

for line in "${ITEMS[@]}"; do
  read -r name limit fatal fn needs <<< "$line"
  detail=""
  t0=$(elapsed)
  left=$((BUDGET - t0 - KILL_GRACE))
  granted=$((limit < left ? limit : left))
  [ $granted -lt 0 ] && granted=0
  if [ -n "$STOPPED" ]; then
    result=NOT-RUN detail="$STOPPED failed"
  elif [ -n "${GPU_CHECK_ONLY:-}" ] && ! [[ $name =~ ^(${GPU_CHECK_ONLY})$ ]]; then
    result=NOT-SELECTED
  elif [ $granted -lt "$MIN_START" ]; then
    result=SKIPPED-BUDGET detail="${left}s left"
    skipped=$((skipped + 1))
  else
    missing=""
    if [ -n "$BUNDLE" ]; then
      for f in ${needs//,/ }; do [ -e "$BUNDLE/$f" ] || missing="$missing $f"; done
    fi
    echo
    echo "== $name (limit ${limit}s, granted ${granted}s, $(elapsed)s of ${BUDGET}s spent)"
    if [ -n "$missing" ]; then
      say "$name: the bundle lacks$missing"
      rc=1 detail="bundle lacks$missing"
    elif [ $PLAN_ONLY = 1 ]; then
      echo "would run: $fn $name${needs:+ (needs ${needs//,/ })}"
      [ "$fn" = item_gtest ] && echo "  gtest filter: $(gtest_filter "$name")"
      rc=0
      [ "${GPU_CHECK_PLAN_FAIL:-}" = "$name" ] && rc=1 detail="failure simulated"
      CLOCK=$((CLOCK + ${GPU_CHECK_PLAN_ITEM_S:-$granted}))
    else
      tag="$$-${name//[^a-z0-9]/-}"
      mkdir -p "$ITEM_DIRS/$tag"
      GPU_CHECK_TAG=$tag GPU_CHECK_ITEM_DIR="$ITEM_DIRS/$tag" \
        timeout -k $KILL_GRACE "$granted" bash "$SELF" --item "$name" "$BUNDLE"
      rc=$?
      reap "$tag"
      [ -f "$ITEM_DIRS/$tag/bench.json" ] && cp "$ITEM_DIRS/$tag/bench.json" "$ITEM_DIRS/bench.json"
    fi
    if [ $rc -eq 0 ]; then
      result=$([ $PLAN_ONLY = 1 ] && echo PLANNED || echo PASS)
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
      result=TIMEOUT detail="over its ${granted}s"
      failed=$((failed + 1))
    else
      result=FAIL detail=${detail:-"exit $rc"}
      failed=$((failed + 1))
    fi
    if [ "$result" != PASS ] && [ "$result" != PLANNED ] && [ "$fatal" = fatal ]; then
      STOPPED=$name
      say "$name failed: stopping here (nothing after it can be trusted)"
    fi
    echo "-- $name: $result ($(($(elapsed) - t0)) s)${detail:+: $detail}"
  fi
  RESULTS+=("$name|$result|$(($(elapsed) - t0))|$limit|$granted|$detail")
done

# ---- Summary ---------------------------------------------------------------

total=$(elapsed)
echo
echo "== summary ($total s of a ${BUDGET} s budget$([ $PLAN_ONLY = 1 ] && echo ', plan only'))"
printf '%-24s %-15s %8s  %s\n' item result seconds detail
for r in "${RESULTS[@]}"; do
  IFS='|' read -r name result secs _ _ detail <<< "$r"
  printf '%-24s %-15s %8s  %s\n' "$name" "$result" "$secs" "$detail"
done

if [ -n "${OUT:-}" ]; then
  json_str() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; printf '"%s"' "$s"; }
  {
    echo "{"
    echo "  \"plan_only\": $([ $PLAN_ONLY = 1 ] && echo true || echo false),"
    echo "  \"budget_s\": $BUDGET, \"total_s\": $total,"
    echo "  \"bundle\": $(json_str "$BUNDLE"),"
    echo "  \"items\": ["
    n=0
    for r in "${RESULTS[@]}"; do
      IFS='|' read -r name result secs limit granted detail <<< "$r"
      n=$((n + 1))
      printf '    {"item": %s, "result": %s, "seconds": %s, "limit_s": %s, "granted_s": %s, "detail": %s}%s\n' \
        "$(json_str "$name")" "$(json_str "$result")" "$secs" "$limit" "$granted" \
        "$(json_str "$detail")" "$([ $n -lt ${#RESULTS[@]} ] && echo ,)"
    done
    echo "  ],"
    if [ -f "$ITEM_DIRS/bench.json" ]; then echo "  \"bench\": $(cat "$ITEM_DIRS/bench.json")"; else echo "  \"bench\": null"; fi
    echo "}"
  } > "$OUT/gpu-check.json"
  say "wrote $OUT/gpu-check.log and $OUT/gpu-check.json"
fi
rm -rf "$ITEM_DIRS"

if [ -n "$STOPPED" ]; then finish 2; fi
if [ $failed -gt 0 ]; then finish 1; fi
if [ $skipped -gt 0 ]; then finish 3; fi
finish 0
