# Sourced by the gpu-check scripts: two gradsync "nodes" on this one GPU.
# NCCL tells hosts apart by NCCL_HOSTID, so two daemons with distinct values
# (over NCCL_SOCKET_IFNAME=lo) are two NCCL ranks with real kernels on both.
#
#   gs_two_nodes DIR TAG NPROC SCRIPT ARGS...   # node 0 leads, node 1 joins it
#
# Runs `python3 -m gradsync.run --nnodes 2` once per node, in parallel, each
# starting its own gradsyncd (log DIR/TAG.nodeN.log, short --timeout-s from
# $GS_CHECK_DAEMON_TIMEOUT_S); returns the first non-zero exit status and
# prints both daemons' logs then.
gs_free_port() {
  "${PYTHON:-python3}" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

gs_two_nodes() {
  local dir=$1 tag=$2 nproc=$3
  shift 3
  local port master n rc=0 pids=()
  port=$(gs_free_port)
  master=$(gs_free_port)
  [ -f "$dir/token" ] || (umask 077 && echo "gpu-check-$RANDOM$RANDOM" > "$dir/token")
  for n in 0 1; do
    local where=--daemon-arg=--leader=127.0.0.1:$port
    [ $n -eq 0 ] && where=--daemon-arg=--listen=127.0.0.1:$port
    NCCL_HOSTID=gradsync-check-node$n NCCL_SOCKET_IFNAME=lo MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$master "${PYTHON:-python3}" -m gradsync.run --nproc "$nproc" --nnodes 2 \
      --node-rank $n --socket "$dir/$tag.node$n.sock" --daemon-log "$dir/$tag.node$n.log" \
      --grace-s 10 --start-timeout-s 20 --daemon-arg=--backend=nccl \
      --daemon-arg=--timeout-s="${GS_CHECK_DAEMON_TIMEOUT_S:-20}" \
      --daemon-arg=--job-id="check-$tag" --daemon-arg=--job-token-file="$dir/token" "$where" \
      "$@" &
    pids+=($!)
  done
  for n in 0 1; do
    wait "${pids[$n]}" || { local r=$?; [ $rc -ne 0 ] || rc=$r; }
  done
  if [ $rc -ne 0 ]; then
    for n in 0 1; do echo "---- $tag: node $n's gradsyncd log"; cat "$dir/$tag.node$n.log" 2>/dev/null; done
  fi
  return $rc
}
