#!/usr/bin/python3
"""broadcast_bench: gs_broadcast of 100 MB against its physical references.

One node: a real gradsyncd with 2 real trainer processes (bench_trainer
--op=broadcast, root rank 0) times single gs_broadcast calls of 100 MB,
against a memcpy of the same bytes between two page-populated buffers in
one process (bench_trainer --op=memcpy): on one node the bytes go root ->
staging slot -> every other trainer, two copies, pipelined in 4 MiB pieces.

Across nodes: 2 daemons on loopback x 1 trainer each, the same call, against
plain Gloo's gloo::broadcast of the same bytes from node 0
(gloo_allreduce_bench --op=broadcast; its GlooBackend and Gloo-worker rows,
what the daemon runs per piece, beside it).

Every figure is the same statistic: the p50 of single calls (gradsync: one
gs_broadcast as a trainer sees it, median over the trainers; memcpy: one
memcpy; plain Gloo: one gloo::broadcast on node 0), with the p10-p90 spread.
The variants alternate round by round (3 rounds with --quick, else 5), so
the machine's drift hits all alike; each figure is the median of its
rounds' p50s (spread: the median p10 and p90), and the ratios are also
given per round.

Prints markdown tables; writes bench-results/broadcast_bench.json. Not a
test: asserts nothing.

Run from the repository root after `bazel build //daemon:gradsyncd
//tests/bench:bench_trainer //tests/bench:gloo_allreduce_bench`:
  /usr/bin/python3 tests/bench/broadcast_bench.py [--quick]
"""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import bench_report
import sync_bench

ROOT = sync_bench.ROOT
DAEMON = sync_bench.DAEMON
TRAINER = sync_bench.TRAINER
GLOO_BENCH = os.path.join(ROOT, "bazel-bin/tests/bench/gloo_allreduce_bench")
QUICK = bench_report.quick()
NBYTES = 100 << 20
WARMUP, ITERS, ROUNDS = (2, 10, 3) if QUICK else (3, 30, 5)
STATS = ("p50", "p10", "p90")


def trainer(socket: str | None, op: str, local_rank: int = 0) -> subprocess.Popen:
    return subprocess.Popen(
        [TRAINER, f"--op={op}", f"--bytes={NBYTES}", f"--iters={ITERS}", f"--warmup={WARMUP}"]
        + ([f"--socket={socket}"] if socket else []),
        env={**os.environ, "LOCAL_RANK": str(local_rank)}, stdout=subprocess.PIPE, text=True)


def run_memcpy() -> dict:
    return sync_bench.collect([trainer(None, "memcpy")])


def run_one_node() -> dict:
    """One daemon, 2 trainers, gs_broadcast from rank 0."""
    tmp = tempfile.mkdtemp(prefix="gsbb.", dir="/tmp")
    sock = os.path.join(tmp, "s")
    daemon = subprocess.Popen(
        [DAEMON, f"--socket={sock}", f"--listen=127.0.0.1:{sync_bench.free_port_number()}",
         "--local-size=2", f"--shm-prefix=gsbb{os.getpid()}", "--timeout-s=120"],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "daemon.log"), "w"))
    try:
        return sync_bench.collect([trainer(sock, "broadcast", r) for r in range(2)])
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


def run_two_nodes() -> dict:
    """2 daemons on loopback x 1 trainer, gs_broadcast from rank 0 (node 0)."""
    tmp = tempfile.mkdtemp(prefix="gsbbn.", dir="/tmp")
    daemons = []
    try:
        daemons = sync_bench.start_daemons(2, tmp, "gsbbn", [])
        return sync_bench.collect([trainer(f"{tmp}/s{n}", "broadcast") for n in range(2)])
    finally:
        sync_bench.stop_daemons(daemons)
        shutil.rmtree(tmp, ignore_errors=True)


def run_gloo() -> dict:
    """gloo_allreduce_bench --op=broadcast, one round: {impl: {p50, p10, p90}} µs."""
    out = subprocess.run([GLOO_BENCH, "--op=broadcast", "--nodes=2", f"--sizes_mb={NBYTES / 1e6}",
                          f"--warmup={WARMUP}", f"--iters={ITERS}", "--rounds=1"],
                         capture_output=True, text=True, timeout=600)
    rows, header = {}, []
    for line in out.stdout.splitlines():
        f = line.split()
        if f and f[0] == "nodes":
            header = f
        elif header and len(f) >= 4 and f[2] in ("plain_gloo", "gradsync", "worker_copy"):
            col = dict(zip(header[-3:], f[-3:]))  # the reference's vs_plain is empty
            rows[f[2]] = {k: float(col[f"{k}_ms"]) * 1000 for k in STATS}
    if out.returncode != 0 or "plain_gloo" not in rows:
        raise RuntimeError(f"gloo_allreduce_bench --op=broadcast failed: {out.stdout}"
                           f"{out.stderr[-2000:]}")
    return rows


def median_of(runs: list) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in STATS}


def row(label: str, runs: list, ref_runs: list | None) -> list:
    m = median_of(runs)
    ratio = per_round = None
    if ref_runs:
        ratio = m["p50"] / median_of(ref_runs)["p50"]
        per_round = " ".join(f"{a['p50'] / b['p50']:.2f}" for a, b in zip(runs, ref_runs))
    return [label, m["p50"] / 1000, f"{m['p10'] / 1000:.1f}-{m['p90'] / 1000:.1f}",
            NBYTES / (m["p50"] / 1e6) / 1e9, ratio, per_round]


def main() -> int:
    for path in (DAEMON, TRAINER, GLOO_BENCH):
        if not os.path.exists(path):
            print(f"missing {path}: run bazel build //daemon:gradsyncd "
                  "//tests/bench:bench_trainer //tests/bench:gloo_allreduce_bench")
            return 1
    report = bench_report.Report("broadcast_bench")
    progress = bench_report.Progress("broadcast_bench", 4 * ROUNDS)
    runs = {k: [] for k in ("memcpy", "local", "nodes", "plain_gloo", "gradsync", "worker_copy")}
    for rnd in range(ROUNDS):
        progress.step(f"round {rnd + 1}: memcpy")
        runs["memcpy"].append(run_memcpy())
        progress.step(f"round {rnd + 1}: gs_broadcast, one node x 2 trainers")
        runs["local"].append(run_one_node())
        progress.step(f"round {rnd + 1}: gs_broadcast, 2 daemons x 1 trainer")
        runs["nodes"].append(run_two_nodes())
        progress.step(f"round {rnd + 1}: plain Gloo broadcast, 2 processes")
        for impl, r in run_gloo().items():
            runs[impl].append(r)
    cols = ["what", "p50 ms", "p10-p90 ms", "GB/s (bytes / p50)", "p50 / reference p50",
            "per-round ratios"]
    report.table(
        f"Broadcast of 100 MB on one node: gs_broadcast, 2 trainers, vs memcpy "
        f"(median of {ROUNDS} alternated rounds of {ITERS} calls)", cols,
        [row("memcpy 100 MB, 1 thread (reference)", runs["memcpy"], None),
         row("gs_broadcast, 1 daemon x 2 trainers", runs["local"], runs["memcpy"])],
        note="gradsync: one gs_broadcast call from root rank 0 as each trainer sees it (median "
             "over the trainers); memcpy: one memcpy between two page-populated buffers. The "
             "broadcast copies every byte twice (root -> staging slot -> the other trainer), "
             "pipelined in 4 MiB pieces.")
    report.table(
        f"Broadcast of 100 MB across 2 daemons on loopback x 1 trainer vs plain Gloo's "
        f"broadcast (median of {ROUNDS} alternated rounds of {ITERS} calls)", cols,
        [row("plain Gloo gloo::broadcast, 2 processes (reference)", runs["plain_gloo"], None),
         row("gs_broadcast, 2 daemons x 1 trainer", runs["nodes"], runs["plain_gloo"]),
         row("GlooBackend::Broadcast in-process (one call)", runs["gradsync"],
             runs["plain_gloo"]),
         row("GlooWorkerBackend::Broadcast, copied in/out (one call)", runs["worker_copy"],
             runs["plain_gloo"])],
        note="gradsync: one gs_broadcast call as each trainer sees it (median over the trainers: "
             "agreement, 4 MiB pieces each through the node's staging slot and the Gloo worker); "
             "plain Gloo and the backend rows: one 100 MB broadcast call timed on node 0 "
             "(gloo_allreduce_bench --op=broadcast).")
    progress.finish()
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
