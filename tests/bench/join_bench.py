#!/usr/bin/python3
"""join_bench: a job's start-up, from starting the daemons to the first
completed iteration, with 16 daemons on loopback against 2.

Each run starts N real gradsyncd on loopback (node 0 leads) and, at the
same moment, one real trainer per daemon (bench_trainer: one 4 KB fp32
tensor, one iteration, no warm-up; gs_connect retries until its daemon
listens). The figure is the time from just before the first daemon is
started to the last trainer's first gs_wait returning (each trainer prints
that moment on the monotonic clock): daemon and trainer process start-up,
the rendezvous, the layout agreement, the Gloo workers' connect and one
collective. Beside it: when every daemon's socket existed (polled every
2 ms), the part that is process start-up alone.

The daemon counts alternate within each round (2 and 16 with --quick,
2, 4, 8 and 16 otherwise; 5 rounds with --quick, else 9), so the machine's
drift hits all alike; each figure is the median of the rounds with their
min-max and every round's value, and the ratio to 2 daemons is also given
per round. Everything shares the machine's cores (16 daemons, 16 Gloo
workers and 16 trainers on 2 cores here).

Where Debian's etcd is installed (/usr/bin/etcd), each round also runs 16
daemons with their rendezvous in etcd (--rendezvous etcd://..., one etcd
member on loopback started once for the whole run, a key prefix per run),
alternated with 16 on the embedded leader: the "16 daemons on etcd vs the
embedded leader" table. `--etcd` runs that comparison alone.

$GRADSYNC_BENCH_REFERENCE_DAEMON (a gradsyncd path, e.g. one built from
the integration branch) adds that binary to every round, alternated with
this build's at each daemon count: a before/after in one run.
$GRADSYNC_BENCH_REFERENCE_TRAINER (that build's bench_trainer) runs with it,
so the trainers' own start-up is compared too; without it both builds
start this build's bench_trainer.

Prints markdown tables; writes bench-results/join_bench.json. Not a test:
asserts nothing.

Run from the repository root after `bazel build //daemon:gradsyncd
//tests/bench:bench_trainer`:
  /usr/bin/python3 tests/bench/join_bench.py [--quick] [--etcd]
"""
from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import bench_report
import sync_bench

DAEMON = sync_bench.DAEMON
TRAINER = sync_bench.TRAINER
QUICK = bench_report.quick()
ETCD_ONLY = "--etcd" in sys.argv[1:]
NODES = () if ETCD_ONLY else (2, 16) if QUICK else (2, 4, 8, 16)
ROUNDS = 5 if QUICK else 9
ETCD = "/usr/bin/etcd"
ETCD_NODES = 16


def start_etcd(tmp: str) -> tuple:
    """One etcd member on loopback ports (its data under tmp): (the
    process, its client URL's HOST:PORT), once it answers a write."""
    client, peer = sync_bench.free_port_number(), sync_bench.free_port_number()
    proc = subprocess.Popen(
        [ETCD, "--name=bench", f"--data-dir={tmp}/etcd",
         f"--listen-client-urls=http://127.0.0.1:{client}",
         f"--advertise-client-urls=http://127.0.0.1:{client}",
         f"--listen-peer-urls=http://127.0.0.1:{peer}",
         f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
         f"--initial-cluster=bench=http://127.0.0.1:{peer}"],
        stdout=subprocess.DEVNULL, stderr=open(f"{tmp}/etcd.log", "w"))
    endpoint = f"127.0.0.1:{client}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        put = subprocess.run(["/usr/bin/etcdctl", f"--endpoints={endpoint}", "put", "ready", "1"],
                             env={**os.environ, "ETCDCTL_API": "3"}, capture_output=True)
        if put.returncode == 0:
            return proc, endpoint
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"etcd did not start: {open(f'{tmp}/etcd.log').read()[-1500:]}")


def run_join(nodes: int, daemon: str = DAEMON, etcd: str | None = None,
             trainer: str | None = None) -> tuple:
    """(seconds to every trainer's first gs_wait, seconds to every daemon's
    socket existing), both from just before the first daemon started.
    `etcd` (HOST:PORT): every daemon rendezvouses there instead of on node 0.
    `trainer`: a bench_trainer other than this build's."""
    tmp = tempfile.mkdtemp(prefix="gsbj.", dir="/tmp")
    port = sync_bench.free_port_number()
    token_file = f"{tmp}/token"
    with open(os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write("join-bench-token\n")  # multi-node daemons need one (mode 0600)
    daemons, trainers = [], []
    try:
        start = time.monotonic()
        for n in range(nodes):
            where = [f"--listen=127.0.0.1:{port}"] if n == 0 else [
                f"--leader=127.0.0.1:{port}", "--listen=127.0.0.1:0"]
            if etcd:  # a key prefix of its own: every run is a fresh job
                where = [f"--rendezvous=etcd://{etcd}/{os.path.basename(tmp)}",
                         "--listen=127.0.0.1:0"]
            daemons.append(subprocess.Popen(
                [daemon, f"--socket={tmp}/s{n}", f"--num-nodes={nodes}", f"--node-rank={n}",
                 "--local-size=1", f"--shm-prefix=gsbj{os.getpid()}x{n}", "--timeout-s=120",
                 f"--job-token-file={token_file}", *where],
                stdout=open(f"{tmp}/d{n}.log", "w"), stderr=subprocess.STDOUT))  # logs: stdout
        for n in range(nodes):
            trainers.append(subprocess.Popen(
                [trainer or TRAINER, f"--socket={tmp}/s{n}", "--bytes=4096", "--tensors=1",
                 "--iters=1", "--warmup=0", "--connect-timeout-ms=120000"],
                env={**os.environ, "LOCAL_RANK": "0"}, stdout=subprocess.PIPE, text=True))
        listening = None
        while listening is None and time.monotonic() - start < 120:
            if all(os.path.exists(f"{tmp}/s{n}") for n in range(nodes)):
                listening = time.monotonic() - start
            elif any(t.poll() not in (None, 0) for t in trainers):
                break
            else:
                time.sleep(0.002)
        done = []
        for t in trainers:
            out, _ = t.communicate(timeout=300)
            m = re.search(r"first_done_mono_us=([\d.]+)", out)
            if t.returncode != 0 or not m:
                logs = "".join(open(f"{tmp}/d{n}.log").read()[-1500:] for n in range(min(2, nodes)))
                raise RuntimeError(f"bench_trainer failed with {nodes} daemons: {out}\n{logs}")
            done.append(float(m.group(1)) / 1e6)
        return max(done) - start, listening
    finally:
        for t in trainers:
            if t.poll() is None:
                t.kill()
                t.wait()
        sync_bench.stop_daemons(daemons)
        shutil.rmtree(tmp, ignore_errors=True)


def summary_rows(first: dict, listen: dict) -> list:
    """One row per daemon count: median, min-max, every round, listening, ratios."""
    rows = []
    base = NODES[0]
    for nodes in NODES:
        v = first[nodes]
        up = [u for u in listen[nodes] if u is not None]
        # The part after process start-up: the trainers' connect, the join,
        # the agreement, the Gloo mesh and the first iteration.
        after = [s - u for s, u in zip(v, listen[nodes]) if u is not None]
        rows.append([nodes, statistics.median(v), f"{min(v):.3f}-{max(v):.3f}",
                     " ".join(f"{s:.3f}" for s in v),
                     statistics.median(up) if up else None,
                     statistics.median(after) if after else None,
                     f"{min(after):.3f}-{max(after):.3f}" if after else None,
                     statistics.median(v) / statistics.median(first[base]),
                     " ".join(f"{a / b:.2f}" for a, b in zip(v, first[base]))])
    return rows


def main() -> int:
    for path in (DAEMON, TRAINER):
        if not os.path.exists(path):
            print(f"missing {path}: run bazel build //daemon:gradsyncd //tests/bench:bench_trainer")
            return 1
    if ETCD_ONLY:
        if not os.path.exists(ETCD):
            print(f"missing {ETCD}: scripts/setup installs etcd-server")
            return 1
        report = bench_report.Report("join_bench")
        etcd_table(report)
        report.write()
        return 0
    reference = os.environ.get("GRADSYNC_BENCH_REFERENCE_DAEMON")
    ref_trainer = os.environ.get("GRADSYNC_BENCH_REFERENCE_TRAINER", TRAINER)
    builds = [("this build", DAEMON, TRAINER)] + (
        [("reference", reference, ref_trainer)] if reference else [])
    report = bench_report.Report("join_bench")
    progress = bench_report.Progress("join_bench", ROUNDS * len(NODES) * len(builds))
    first = {b: {n: [] for n in NODES} for b, _, _ in builds}
    listen = {b: {n: [] for n in NODES} for b, _, _ in builds}
    for rnd in range(ROUNDS):
        for nodes in NODES:
            for build, binary, trainer in builds:
                progress.step(f"round {rnd + 1}: {nodes} daemons, {build}")
                secs, up = run_join(nodes, binary, trainer=trainer)
                first[build][nodes].append(secs)
                listen[build][nodes].append(up)
    columns = ["daemons", "start -> every first gs_wait s", "min-max s", "per round s",
               "start -> every daemon listening s", "every daemon listening -> every first "
               "gs_wait s", "min-max s", f"vs {NODES[0]} daemons", "per-round ratios"]
    report.table(
        f"Join + first iteration: N daemons on loopback x 1 trainer, 4 KB layout "
        f"(seconds, median of {ROUNDS} alternated rounds)",
        columns, summary_rows(first["this build"], listen["this build"]),
        note="From just before the first daemon is started (trainers started at the same time) "
             "to the last trainer's first gs_wait returning. Target for 16 daemons: < 0.5 s. "
             "Daemons, Gloo workers and trainers all share the machine's cores.")
    if reference:
        report.table(f"The same, reference gradsyncd {reference} and trainer {ref_trainer} "
                     f"(alternated with this build)",
                     columns, summary_rows(first["reference"], listen["reference"]))

        def after_listen(build: str, n: int) -> list:
            return [s - u for s, u in zip(first[build][n], listen[build][n]) if u is not None]

        rows = []
        for n in NODES:
            new, ref = first["this build"][n], first["reference"][n]
            new_after, ref_after = after_listen("this build", n), after_listen("reference", n)
            rows.append([n, statistics.median(new) / statistics.median(ref),
                         " ".join(f"{a / b:.2f}" for a, b in zip(new, ref)),
                         statistics.median(new_after) / statistics.median(ref_after)
                         if new_after and ref_after else None])
        report.table("This build / reference, per daemon count (medians; every round's ratio)",
                     ["daemons", "start -> every first gs_wait", "per-round ratios",
                      "every daemon listening -> every first gs_wait"], rows)
    if os.path.exists(ETCD) and (ETCD_ONLY or not reference):
        etcd_table(report)
    progress.finish()
    report.write()
    return 0


def etcd_table(report) -> None:
    """16 daemons on etcd vs the embedded leader, alternated each round."""
    tmp = tempfile.mkdtemp(prefix="gsbje.", dir="/tmp")
    proc, endpoint = start_etcd(tmp)
    progress = bench_report.Progress("join_bench etcd", ROUNDS * 2)
    runs = {"embedded leader": [], "etcd": []}
    try:
        for rnd in range(ROUNDS):
            for kind in runs:
                progress.step(f"round {rnd + 1}: {ETCD_NODES} daemons, {kind}")
                secs, _ = run_join(ETCD_NODES, DAEMON, endpoint if kind == "etcd" else None)
                runs[kind].append(secs)
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    leader = statistics.median(runs["embedded leader"])
    rows = [[kind, ETCD_NODES, statistics.median(v), f"{min(v):.3f}-{max(v):.3f}",
             " ".join(f"{x:.3f}" for x in v), statistics.median(v) / leader]
            for kind, v in runs.items()]
    report.table(
        f"Join + first iteration, {ETCD_NODES} daemons on etcd vs the embedded leader "
        f"(seconds, median of {ROUNDS} alternated rounds)",
        ["rendezvous", "daemons", "start -> every first gs_wait s", "min-max s", "per round s",
         "vs the embedded leader"], rows,
        note="etcd: one member on loopback (started before the rounds, not timed), every "
             "daemon given --rendezvous etcd://...; the embedded leader: node 0's daemon. "
             "Daemons, Gloo workers, trainers and etcd share the machine's cores.")


if __name__ == "__main__":
    sys.exit(main())
