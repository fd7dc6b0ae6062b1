#!/usr/bin/env bash
# A network partition in an elastic job behaves like a node's death. Three
# hosts, each a network namespace whose veth pair ends on one bridge (in a
# namespace of its own), the leader (node 0) listening on its bridge
# address; 3 nodes x 2 trainers (tests/testing/fault_trainer, fp64),
# --min-nodes=2. Every trainer pauses mid-backward in iteration 2, then node
# 2's link goes down (no FIN, no RST) and the trainers resume.
#
# 1. Partition: the survivors (nodes 0 and 1) presume node 2 dead after its
#    silence, re-form without it, redo iteration 2 and finish with GS_OK,
#    equal weights, within 1e-12 of one process that averages iterations
#    0-1 over all 6 shards and 2-7 over ranks 0-3's (fault_trainer --single
#    --join-steps=8,8,8,8,2,2 --join-divide-by-active). Node 2's trainers
#    get PEER_FAILED naming the unreachable leader within the timeout, and
#    node 2's daemon stays up.
# 2. Heal: node 0's trainers are held (a longer timeout keeps that from
#    being a stall) so the survivors' generation still runs when node 2's
#    link comes back up and fresh trainers register on node 2's daemon.
#    Node 2's daemon joins the running job like a replacement: admitted at
#    an iteration boundary m, its trainers receive rank 0's state
#    (fault_trainer --catch-up), and all six end with the same weights,
#    within 1e-12 of the reference that takes ranks 4-5 back from m on
#    (--rejoin-at=m).
# Trainers stay in the root namespace: the daemons' unix sockets and
# /dev/shm are shared. Skips only when namespaces are not permitted.
set -euo pipefail

root=$(pwd)
daemon=$root/daemon/gradsyncd
trainer=$root/tests/testing/fault_trainer
tag=gse$$
nsb=${tag}x  # the bridge's namespace
bridge=${tag}br
net=10.$((RANDOM % 200 + 20)).$((RANDOM % 250))
port=$((20000 + RANDOM % 20000))
tmp=$(mktemp -d /tmp/gse.XXXXXX)  # short: unix socket paths
nodes=3 local_size=2 victim=2
steps=8 killed_step=2  # fault_trainer pauses in step 2 (--pause-at)
train_args=("--steps=$steps" --batch=60 --fp64)

# Node n: namespace ns_of n, interface if_of n (its bridge port: port_of n),
# address addr_of n.
ns_of() { echo "${tag}n$1"; }
if_of() { echo "${tag}i$1"; }
port_of() { echo "${tag}p$1"; }
addr_of() { echo "$net.$(($1 + 1))"; }

# This shell's children that still run (a reaped pid may be someone
# else's by now).
cleanup() {
  local pids=()
  for p in $(jobs -p); do
    [[ "$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -d' ' -f2)" == "$$" ]] && pids+=("$p")
  done
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  for n in $(seq 0 $((nodes - 1))); do ip netns del "$(ns_of "$n")" 2>/dev/null || true; done
  ip netns del "$nsb" 2>/dev/null || true
  rm -f /dev/shm/"$tag"* 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  for f in "$tmp"/*.log; do echo "---- $f"; cat "$f"; done
  exit 1
}

if ! ip netns add "$nsb" 2>"$tmp/netns.err"; then
  if grep -q "Operation not permitted" "$tmp/netns.err"; then
    echo "SKIP: ip netns add is not permitted here (EPERM): $(cat "$tmp/netns.err")"
    exit 0
  fi
  fail "ip netns add: $(cat "$tmp/netns.err")"
fi
# No STP: the ports forward at once.
ip -n "$nsb" link add "$bridge" type bridge stp_state 0 forward_delay 0
ip -n "$nsb" link set "$bridge" up
for n in $(seq 0 $((nodes - 1))); do
  ns=$(ns_of "$n")
  ip netns add "$ns"
  ip link add "$(if_of "$n")" type veth peer name "$(port_of "$n")"
  ip link set "$(if_of "$n")" netns "$ns"
  ip link set "$(port_of "$n")" netns "$nsb"
  ip -n "$nsb" link set "$(port_of "$n")" master "$bridge"
  ip -n "$nsb" link set "$(port_of "$n")" up
  ip -n "$ns" addr add "$(addr_of "$n")/24" dev "$(if_of "$n")"
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "$(if_of "$n")" up
done
echo elastic-token >"$tmp/token"
chmod 600 "$tmp/token"
leader=$(addr_of 0):$port

# Waits (up to $2 s) until file $1 contains $3 more than $4 times (default 0).
wait_for() {
  local deadline=$((SECONDS + $2))
  until (($(grep -c -- "$3" "$1" 2>/dev/null || true) > ${4:-0})); do
    ((SECONDS < deadline)) || return 1
    sleep 0.05
  done
}

# Starts the three daemons of job $1 (their files named $1) with
# --timeout-s=$2; their pids in dpids.
start_daemons() {
  local job=$1 timeout_s=$2
  local common=("--local-size=$local_size" "--num-nodes=$nodes" --min-nodes=2 "--max-nodes=$nodes"
                --job-id="$job" --job-token-file="$tmp/token" --timeout-s="$timeout_s"
                --stall-threshold-s=1 --bucket-cap-mb=0.001 --first-bucket-cap-mb=0.000001)
  dpids=()
  for n in $(seq 0 $((nodes - 1))); do
    local where=(--listen="$(addr_of "$n"):0" --leader="$leader")
    ((n == 0)) && where=(--listen="$leader")
    # LOGS_DIRECTORY: the stall traces go to $tmp, removed at the end.
    LOGS_DIRECTORY=$tmp ip netns exec "$(ns_of "$n")" "$daemon" "${common[@]}" --node-rank="$n" "${where[@]}" \
      --socket="$tmp/$job.d$n.sock" --shm-prefix="${tag}${job}n$n" \
      >"$tmp/$job.daemon$n.log" 2>&1 &
    dpids+=($!)
  done
  for n in $(seq 0 $((nodes - 1))); do
    wait_for "$tmp/$job.daemon$n.log" 30 "event=started" || fail "$job: daemon $n did not start"
  done
}

# The state letter of process $1 in /proc (T: stopped).
proc_state() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1; }

# Starts job $1's six trainers, each pausing mid-backward in iteration 2
# (fault_trainer --pause-at=backward; more flags after $1), and waits until
# all stopped there. Trainer i (node i / 2, local rank i % 2) has pid
# tpids[i].
start_paused_trainers() {
  local job=$1
  local extra=("${@:2}")
  tpids=()
  for n in $(seq 0 $((nodes - 1))); do
    for r in $(seq 0 $((local_size - 1))); do
      LOCAL_RANK=$r "$trainer" --socket="$tmp/$job.d$n.sock" "${train_args[@]}" \
        --pause-at=backward --print-loss "${extra[@]}" --out="$tmp/$job.w$n.$r.txt" \
        >"$tmp/$job.trainer$n.$r.log" 2>&1 &
        tpids+=($!)
    done
  done
  for i in "${!tpids[@]}"; do
    local log=$tmp/$job.trainer$((i / 2)).$((i % 2)).log
    wait_for "$log" 30 "mlp_trainer: paused at backward" || fail "$job: trainer $i never paused"
    local deadline=$((SECONDS + 30))
    until [[ "$(proc_state "${tpids[$i]}")" == T ]]; do
      ((SECONDS < deadline)) || fail "$job: trainer $i printed its pause but did not stop"
      sleep 0.05
    done
  done
}

resume_node() {
  for i in "${!tpids[@]}"; do
    ((i / 2 == $1)) && kill -CONT "${tpids[$i]}"
  done
  return 0
}

# Cuts node $1's link on its own side: its packets and those to it are
# dropped, nothing answers (no FIN, no RST).
cut_link() { ip -n "$(ns_of "$1")" link set "$(if_of "$1")" down; }
heal_link() { ip -n "$(ns_of "$1")" link set "$(if_of "$1")" up; }

# Waits (up to $2 s) for pid $1 and sets `code` to its exit status.
wait_exit() {
  local deadline=$((SECONDS + $2))
  while kill -0 "$1" 2>/dev/null && [[ "$(proc_state "$1")" != Z ]]; do
    ((SECONDS < deadline)) || return 1
    sleep 0.05
  done
  code=0
  wait "$1" || code=$?
}

# The normwise relative difference of two weights files ("name value" lines).
max_rel_diff() {
  paste "$1" "$2" | awk '{d = $2 - $4; if (d < 0) d = -d; if (d > m) m = d;
                           r = $4 < 0 ? -$4 : $4; if (r > n) n = r}
                          END {printf "%.3g\n", (n > 0 ? m / n : m)}'
}

# Iterations 0-1 over all six shards, 2-7 over ranks 0-3's: what the
# survivors of node 2's loss in iteration 2 must equal.
"$trainer" --single --quiet "${train_args[@]}" \
  --join-steps=$steps,$steps,$steps,$steps,$killed_step,$killed_step --join-divide-by-active \
  --out="$tmp/reference.txt" >"$tmp/reference.log" 2>&1 || fail "the reference did not run"

# Job $1's survivors (nodes 0 and 1) exit 0 within $2 s with the same
# weights, within 1e-12 of the reference, and both daemons logged node 2
# presumed dead (silent, not departed) and the re-formation.
expect_survivors_trained_like_the_reference() {
  local job=$1 bound=$2
  for i in 0 1 2 3; do
    wait_exit "${tpids[$i]}" "$bound" || fail "$job: survivor trainer $i still runs after ${bound} s"
    ((code == 0)) || fail "$job: survivor trainer $i exited $code: $(grep -h error= \
      "$tmp/$job.trainer$((i / 2)).$((i % 2)).log")"
    local out=$tmp/$job.w$((i / 2)).$((i % 2)).txt
    cmp -s "$out" "$tmp/$job.w0.0.txt" || fail "$job: survivor trainer $i ended with other weights"
    local d
    d=$(max_rel_diff "$out" "$tmp/reference.txt")
    awk -v d="$d" 'BEGIN {exit !(d <= 1e-12)}' || fail "$job: trainer $i differs by $d"
    grep -q "the job's members changed (1 times) by iteration $((killed_step + 1)): world size 4" \
      "$tmp/$job.trainer$((i / 2)).$((i % 2)).log" || fail "$job: trainer $i saw no change to 4"
  done
  for n in 0 1; do
    local log=$tmp/$job.daemon$n.log
    grep -q "event=node_presumed_dead generation=1 node_rank=2 host=$(addr_of 2)" "$log" ||
      fail "$job: node $n did not presume node 2 dead"
    grep -q "event=job_reformed" "$log" || fail "$job: node $n did not re-form"
    if grep -q "event=node_departed" "$log"; then fail "$job: node $n counted node 2 departed"; fi
  done
  echo "$job: the survivors' 4 trainers equal the reference that drops node 2 from iteration 2"
}

# Node 2's trainers (trainers 4 and 5) end within $2 s with PEER_FAILED
# naming the leader and the partition: node 2 cannot tell a partition from
# the leader's death, and either way its part of the job is over.
expect_cut_off_trainers_told_the_leader_is_unreachable() {
  local job=$1 bound=$2
  for i in 4 5; do
    local log=$tmp/$job.trainer2.$((i % 2)).log
    wait_exit "${tpids[$i]}" "$bound" || fail "$job: node 2's trainer $i still runs after ${bound} s"
    ((code == 14)) || fail "$job: node 2's trainer $i exited $code, want 14 (PEER_FAILED): $(cat "$log")"
    grep -q "the leader daemon at $leader is unreachable: the leader is dead or this node is cut off from it" \
      "$log" || fail "$job: node 2's trainer $i was not told it is cut off from the leader: $(cat "$log")"
    # Node 2's daemon stopped its own Gloo worker to abort: the abort's cause
    # is the error, not the worker's death.
    grep -q "gloo allreduce failed: the leader daemon at $leader is unreachable: .*(node_rank=2 generation=1 aborted during an allreduce of " \
      "$log" || fail "$job: node 2's trainer $i was not told the abort's cause first: $(cat "$log")"
    if grep -q "killed by signal" "$log"; then
      fail "$job: node 2's trainer $i was told of its daemon's abort as a killed worker: $(cat "$log")"
    fi
    # The cause once: neither the re-formation nor the scheduler restates it.
    local error causes
    error=$(grep -h "error=" "$log" | head -1)
    causes=$(grep -o "the leader daemon at $leader is unreachable" <<<"$error" | wc -l)
    ((causes == 1)) || fail "$job: node 2's trainer $i was told the cause $causes times: $error"
    echo "$error"
  done
}

# 1. The partition: every trainer resumes after node 2's link went down.
timeout_s=5
bound=$((2 * timeout_s + 20))  # a hang check: the timeout, the abort's travel, a loaded machine
start_daemons partition $timeout_s
start_paused_trainers partition
cut_link $victim
cut_at=$(date +%s.%N)
for n in 0 1 2; do resume_node "$n"; done
for r in 0 1; do
  wait_for "$tmp/partition.trainer2.$r.log" $bound "gs_wait failed" || fail "partition: node 2 hangs"
done
# Printed, not asserted (a loaded machine): a heartbeat's deadline and the
# explanation that follows it.
echo "partition: node 2's trainers were told $(echo "$(date +%s.%N) $cut_at" |
  awk '{printf "%.1f", $1 - $2}') s after the cut (--timeout-s=$timeout_s)"
expect_cut_off_trainers_told_the_leader_is_unreachable partition $bound
expect_survivors_trained_like_the_reference partition $bound
for n in 0 1 2; do kill -0 "${dpids[$n]}" || fail "partition: daemon $n died"; done
for p in "${dpids[@]}"; do kill -TERM "$p"; done
for p in "${dpids[@]}"; do wait_exit "$p" 30 || fail "partition: a daemon ignored SIGTERM"; done
heal_link $victim

# 2. The heal: node 0's trainers held until node 2 tried again.
timeout_s=30  # holding node 0's trainers is no stall; the heartbeat timeout stays 10 s
bound=$((2 * timeout_s + 20))
start_daemons heal $timeout_s
start_paused_trainers heal --catch-up
cut_link $victim
resume_node 1  # its collective waits for node 2, the leader aborts on its silence
resume_node 2
wait_for "$tmp/heal.daemon0.log" $bound "event=job_reformed" || fail "heal: node 0 never re-formed"
expect_cut_off_trainers_told_the_leader_is_unreachable heal $bound
heal_link $victim
for r in 0 1; do
  LOCAL_RANK=$r "$trainer" --socket="$tmp/heal.d2.sock" "${train_args[@]}" \
    --catch-up --out="$tmp/heal.healed$r.txt" >"$tmp/heal.healed$r.log" 2>&1 &
  healed[r]=$!
done
# The healed node joins: the leader holds its Join and publishes the grow
# entry; node 0's trainers go on once both members read it.
wait_for "$tmp/heal.daemon0.log" $bound "event=job_grow_published" || fail "heal: no grow entry"
for n in 0 1; do
  wait_for "$tmp/heal.daemon$n.log" $bound "event=job_grow_read" || fail "heal: node $n never read the grow entry"
done
resume_node 0
joined="mlp_trainer: joined the running job at iteration "
wait_for "$tmp/heal.healed0.log" $bound "$joined" || fail "heal: node 2's trainers never joined"
m=$(sed -n "s/^$joined\([0-9]*\):.*/\1/p" "$tmp/heal.healed0.log" | head -1)
((m > killed_step && m < steps)) || fail "heal: joined at iteration '$m', want one in ($killed_step, $steps)"
for r in 0 1; do
  grep -q "$joined$m: state from rank 0, world size 6, rank $((4 + r))" "$tmp/heal.healed$r.log" ||
    fail "heal: node 2's trainer $r did not start at $m with rank 0's state: $(cat "$tmp/heal.healed$r.log")"
done
"$trainer" --single --quiet "${train_args[@]}" \
  --join-steps=$steps,$steps,$steps,$steps,$killed_step,$killed_step --join-divide-by-active \
  --rejoin-at="$m" --out="$tmp/rejoin_reference.txt" >"$tmp/rejoin_reference.log" 2>&1 ||
  fail "the rejoin reference did not run"
outs=()
for i in 0 1 2 3; do
  wait_exit "${tpids[$i]}" "$bound" || fail "heal: survivor trainer $i still runs after ${bound} s"
  ((code == 0)) || fail "heal: survivor trainer $i exited $code: $(grep -h error= \
    "$tmp/heal.trainer$((i / 2)).$((i % 2)).log")"
  grep -q "the job's members changed (2 times) by iteration $m: world size 4" \
    "$tmp/heal.trainer$((i / 2)).$((i % 2)).log" || fail "heal: trainer $i did not see the death and the join"
  outs+=("$tmp/heal.w$((i / 2)).$((i % 2)).txt")
done
for r in 0 1; do
  wait_exit "${healed[$r]}" "$bound" || fail "heal: node 2's fresh trainer $r still runs"
  ((code == 0)) || fail "heal: node 2's fresh trainer $r exited $code: $(cat "$tmp/heal.healed$r.log")"
  outs+=("$tmp/heal.healed$r.txt")
done
for out in "${outs[@]}"; do
  cmp -s "$out" "${outs[0]}" || fail "heal: $out ended with other weights than ${outs[0]}"
  d=$(max_rel_diff "$out" "$tmp/rejoin_reference.txt")
  awk -v d="$d" 'BEGIN {exit !(d <= 1e-12)}' || fail "heal: $out differs by $d"
done
echo "heal: node 2 rejoined at iteration $m; all six trainers equal the reference"
for n in 0 1 2; do kill -0 "${dpids[$n]}" || fail "heal: daemon $n died"; done
echo "PASS"
