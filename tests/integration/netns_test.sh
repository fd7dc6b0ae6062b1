#!/usr/bin/env bash
# Multi-node over a real interface: two hosts in network
# namespaces joined by a veth pair, the leader listening on its veth address
# only. Checks: a 2x2 job trains exactly like one process; a partition
# (link down on one side: no FIN, no RST) ends every waiting trainer with
# PEER_FAILED naming the other side (node 0's: node_rank=1 stopped
# heart-beating; node 1's: the leader daemon is unreachable), within the
# timeout, and both daemons stay up; after link up fresh trainers train
# exactly; and so they do over a tbf-limited link (100 Mbit/s, 50 ms).
# Trainers stay in the root namespace: the daemons' unix sockets and
# /dev/shm are shared. Skips only when namespaces are not permitted.
set -euo pipefail

root=$(pwd)
daemon=$root/daemon/gradsyncd
trainer=$root/tests/testing/fault_trainer
tag=gsn$$
ns0=${tag}a ns1=${tag}b
if0=${tag}0 if1=${tag}1
net=10.$((RANDOM % 200 + 20)).$((RANDOM % 250))
a=$net.1 b=$net.2
port=$((20000 + RANDOM % 20000))
tmp=$(mktemp -d /tmp/gsn.XXXXXX)  # short: unix socket paths
timeout_s=5
pids=()

cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  ip netns del "$ns0" 2>/dev/null || true
  ip netns del "$ns1" 2>/dev/null || true
  rm -f /dev/shm/"$tag"* 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  for f in "$tmp"/*.log; do echo "---- $f"; cat "$f"; done
  exit 1
}

if ! ip netns add "$ns0" 2>"$tmp/netns.err"; then
  if grep -q "Operation not permitted" "$tmp/netns.err"; then
    echo "SKIP: ip netns add is not permitted here (EPERM): $(cat "$tmp/netns.err")"
    exit 0
  fi
  fail "ip netns add: $(cat "$tmp/netns.err")"
fi
ip netns add "$ns1"
ip link add "$if0" type veth peer name "$if1"
ip link set "$if0" netns "$ns0"
ip link set "$if1" netns "$ns1"
ip -n "$ns0" addr add "$a/24" dev "$if0"
ip -n "$ns1" addr add "$b/24" dev "$if1"
for ns in "$ns0" "$ns1"; do ip -n "$ns" link set lo up; done
ip -n "$ns0" link set "$if0" up
ip -n "$ns1" link set "$if1" up

echo netns-token > "$tmp/token"
chmod 600 "$tmp/token"
common=(--local-size=2 --num-nodes=2 --job-id=netns --job-token-file="$tmp/token"
        --timeout-s=$timeout_s --bucket-cap-mb=0.001 --first-bucket-cap-mb=0.0001)
ip netns exec "$ns0" "$daemon" "${common[@]}" --node-rank=0 --socket="$tmp/d0.sock" \
  --shm-prefix="${tag}n0" --listen="$a:$port" >"$tmp/daemon0.log" 2>&1 &
pids+=($!)
daemon0=$!
ip netns exec "$ns1" "$daemon" "${common[@]}" --node-rank=1 --socket="$tmp/d1.sock" \
  --shm-prefix="${tag}n1" --listen="$b:0" --leader="$a:$port" >"$tmp/daemon1.log" 2>&1 &
pids+=($!)
daemon1=$!

# Waits (up to $2 s) until file $1 contains $3 more than $4 times (default 0).
wait_for() {
  local deadline=$((SECONDS + $2))
  until (($(grep -c -- "$3" "$1" 2>/dev/null || true) > ${4:-0})); do
    ((SECONDS < deadline)) || return 1
    sleep 0.05
  done
}
for n in 0 1; do wait_for "$tmp/daemon$n.log" 30 "event=started" || fail "daemon $n did not start"; done
# Bound to the veth address only: not reachable on loopback.
if ip netns exec "$ns0" bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null; then
  fail "the leader answers on 127.0.0.1:$port although it listens on $a only"
fi

args=(--batch=64 --fp64 --quiet)
"$trainer" --single "${args[@]}" --steps=10 --out="$tmp/reference.txt" >"$tmp/reference.log" 2>&1

# The normwise relative difference of two weights files ("name value" lines).
max_rel_diff() {
  paste "$1" "$2" | awk '{d = $2 - $4; if (d < 0) d = -d; if (d > m) m = d;
                           r = $4 < 0 ? -$4 : $4; if (r > n) n = r}
                          END {printf "%.3g\n", (n > 0 ? m / n : m)}'
}

# Runs one 2x2 job of $1 steps with the extra trainer flags $3...; $2 names it.
# Leaves the trainers' pids in tpids and their exit codes in codes.
run_job() {
  local steps=$1 name=$2
  shift 2
  tpids=()
  for n in 0 1; do
    for r in 0 1; do
      LOCAL_RANK=$r "$trainer" --socket="$tmp/d$n.sock" "${args[@]}" --steps="$steps" "$@" \
        --out="$tmp/$name.$n.$r.txt" >"$tmp/$name.trainer$n.$r.log" 2>&1 &
      tpids+=($!)
    done
  done
}
collect() {
  codes=()
  for p in "${tpids[@]}"; do
    local c=0
    wait "$p" || c=$?
    codes+=("$c")
  done
}
check_exact() {
  local name=$1
  for n in 0 1; do
    for r in 0 1; do
      local d
      d=$(max_rel_diff "$tmp/$name.$n.$r.txt" "$tmp/reference.txt")
      awk -v d="$d" 'BEGIN {exit !(d <= 1e-12)}' || fail "$name: trainer $n.$r differs by $d"
    done
  done
  echo "$name: 4 trainers equal the single-process reference"
}

# 1. Training across the veth link is exact.
run_job 10 plain
collect
[[ "${codes[*]}" == "0 0 0 0" ]] || fail "plain job exit codes: ${codes[*]}"
check_exact plain

# 2. A partition while the job runs (the trainers are mid-run: slow steps).
# Both nodes finished iteration 0 of this job (its plan decision).
decided=()
for n in 0 1; do decided+=("$(grep -c "event=plan_decided" "$tmp/daemon$n.log" || true)"); done
run_job 1000 partition --sleep-ms=20
for n in 0 1; do
  wait_for "$tmp/daemon$n.log" 30 "event=plan_decided" "${decided[$n]}" || fail "node $n: the job never ran"
done
ip -n "$ns1" link set "$if1" down
start=$SECONDS
collect
took=$((SECONDS - start))
echo "partition: trainers exited with ${codes[*]} after ${took} s"
for i in 0 1 2 3; do
  n=$((i / 2)) r=$((i % 2))
  log=$tmp/partition.trainer$n.$r.log
  [[ "${codes[$i]}" == 14 ]] || fail "trainer $n.$r: exit ${codes[$i]}, want 14 (PEER_FAILED)"
  if ((n == 0)); then
    grep -q "node_rank=1" "$log" || fail "trainer 0.$r was not told node_rank=1: $(cat "$log")"
  else
    grep -q "the leader daemon" "$log" || fail "trainer 1.$r was not told the leader: $(cat "$log")"
  fi
  grep -h "error=" "$log" | head -1
done
((took <= 4 * timeout_s)) || fail "the partition took ${took} s to surface (hang check: 4 x timeout)"
kill -0 "$daemon0" && kill -0 "$daemon1" || fail "a daemon died in the partition"

# 3. Link up: fresh trainers train exactly.
ip -n "$ns1" link set "$if1" up
run_job 10 healed
collect
[[ "${codes[*]}" == "0 0 0 0" ]] || fail "after link up: exit codes ${codes[*]}"
check_exact healed

# 4. Over a tbf-limited link: still exact.
ip netns exec "$ns0" tc qdisc add dev "$if0" root tbf rate 100mbit burst 64kb latency 50ms
ip netns exec "$ns1" tc qdisc add dev "$if1" root tbf rate 100mbit burst 64kb latency 50ms
run_job 10 tbf
collect
[[ "${codes[*]}" == "0 0 0 0" ]] || fail "over tbf: exit codes ${codes[*]}"
check_exact tbf
echo "PASS"
