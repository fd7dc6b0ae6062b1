#!/usr/bin/python3
"""elastic_goodput_bench: useful iterations per second of an elastic job
whose node 2 is killed periodically and replaced, as a fraction of the same
job without failures.

The job: 3 real gradsyncd on loopback (node 0 leads) x 2 real trainers each
(tests/testing/fault_trainer, fp64, --catch-up: a replacement's trainers
receive rank 0's weights and iteration count by gs_broadcast), every daemon
with --min-nodes=2 --max-nodes=3. Each round runs two jobs, alternated:

  failure-free          the job trains for --duration seconds;
  node 2 killed every   the same, but every --period seconds node 2's
  PERIOD s, replaced    daemon (its process group: the Gloo worker too)
                        and its 2 trainers are SIGKILLed and a fresh node 2
                        daemon and trainers are started at once; the
                        survivors re-form (about 2 s of silence proves the
                        death), redo the interrupted iteration, and admit
                        the replacement at an iteration boundary.

The figure is rank 0's completed iterations (node 0 is never killed: it
hosts the leader) within the window, per second, and the elastic job's as a
fraction of the failure-free job's in the same round (goodput). Every
iteration counts, including those averaged over the 4 survivors only: none
is lost or redone twice. For scale: torchft reports 81.2% at one failure a
minute over 30 replica groups. Prints one markdown table, writes
bench-results/elastic_goodput_bench.json. Not a test: asserts nothing.

Run from the repository root after
`bazel build //daemon:gradsyncd //tests/testing:fault_trainer`:
    /usr/bin/python3 tests/bench/elastic_goodput_bench.py [--quick] [--rounds 2]
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import List

import bench_report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DAEMON = os.path.join(ROOT, "bazel-bin/daemon/gradsyncd")
TRAINER = os.path.join(ROOT, "bazel-bin/tests/testing/fault_trainer")
NODES, LOCAL, VICTIM = 3, 2, 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StepCounter:
    """Reads rank 0's stdout ("step N  loss ..."): when each step completed,
    on this process's monotonic clock."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.times: List[float] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            if line.startswith("step "):
                with self._lock:
                    self.times.append(time.monotonic())

    def count_between(self, start: float, end: float) -> int:
        with self._lock:
            return sum(1 for t in self.times if start <= t < end)


class Job:
    """3 daemons x 2 trainers of one job, in `tmp`."""

    def __init__(self, tmp: str, tag: str) -> None:
        self.tmp, self.tag = tmp, tag
        self.port = free_port()
        self.daemons: List[subprocess.Popen] = [None] * NODES  # type: ignore
        self.trainers: List[List[subprocess.Popen]] = [[] for _ in range(NODES)]
        self.starts = [0] * NODES  # how many times each node was started
        self.counter: StepCounter = None  # type: ignore

    def start_node(self, n: int) -> None:
        k = self.starts[n]
        self.starts[n] += 1
        token = os.path.join(self.tmp, "token")
        where = ([f"--listen=127.0.0.1:{self.port}"] if n == 0 else
                 [f"--leader=127.0.0.1:{self.port}", "--listen=127.0.0.1:0"])
        sock = f"{self.tmp}/{self.tag}.s{n}.{k}"
        self.daemons[n] = subprocess.Popen(
            [DAEMON, f"--socket={sock}", f"--num-nodes={NODES}", f"--node-rank={n}",
             f"--local-size={LOCAL}", "--min-nodes=2", f"--max-nodes={NODES}",
             f"--shm-prefix=gsgp{os.getpid()}{self.tag}n{n}k{k}", "--timeout-s=30",
             "--job-id=goodput", f"--job-token-file={token}", *where],
            stdout=open(os.path.join(self.tmp, f"{self.tag}.d{n}.{k}.log"), "w"),
            stderr=subprocess.STDOUT, start_new_session=True)  # the Gloo worker dies with it
        self.trainers[n] = []
        for r in range(LOCAL):
            first = n == 0 and r == 0
            self.trainers[n].append(subprocess.Popen(
                [TRAINER, f"--socket={sock}", "--steps=100000000", "--batch=60", "--fp64",
                 "--quiet", "--catch-up", *(["--print-loss"] if first else [])],
                env={**os.environ, "LOCAL_RANK": str(r)},
                stdout=subprocess.PIPE if first else subprocess.DEVNULL,
                stderr=open(os.path.join(self.tmp, f"{self.tag}.t{n}{r}.{k}.log"), "w"),
                text=True))
        if n == 0:
            self.counter = StepCounter(self.trainers[0][0])

    def start(self) -> None:
        for n in range(NODES):
            self.start_node(n)

    def kill_node(self, n: int) -> None:
        for t in self.trainers[n]:
            if t.poll() is None:
                t.kill()
        try:
            os.killpg(self.daemons[n].pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for p in [self.daemons[n], *self.trainers[n]]:
            p.wait(timeout=30)

    def stop(self) -> None:
        for n in range(NODES):
            if self.daemons[n] is not None:
                self.kill_node(n)
        for seg in glob.glob(f"/dev/shm/gsgp{os.getpid()}{self.tag}n*"):
            os.unlink(seg)

    def rank0_alive(self) -> bool:
        return self.trainers[0][0].poll() is None

    def joins(self) -> int:
        """Replacements node 0 admitted (its `event=job_grown` lines)."""
        return open(os.path.join(self.tmp, f"{self.tag}.d0.0.log")).read().count(
            "event=job_grown")

    def rank0_error(self) -> str:
        log = open(os.path.join(self.tmp, f"{self.tag}.t00.0.log")).read().strip()
        return log.splitlines()[-1][:200] if log else "no output"


def run_job(tmp: str, tag: str, warm_s: float, duration_s: float, period_s: float) -> dict:
    """Iterations per second over the window; period_s 0: no failures."""
    job = Job(tmp, tag)
    job.start()
    try:
        deadline = time.monotonic() + 60
        while job.counter.count_between(0, float("inf")) < 20:
            if time.monotonic() > deadline or not job.rank0_alive():
                return {"failed": f"the job did not train: {job.rank0_error()}"}
            time.sleep(0.05)
        time.sleep(warm_s)
        start = time.monotonic()
        end = start + duration_s
        kills = 0
        next_kill = start + period_s if period_s > 0 else float("inf")
        while time.monotonic() < end:
            if not job.rank0_alive():
                return {"failed": job.rank0_error(), "kills": kills}
            if time.monotonic() >= next_kill:
                job.kill_node(VICTIM)
                job.start_node(VICTIM)
                kills += 1
                next_kill += period_s
            time.sleep(0.02)
        if not job.rank0_alive():
            return {"failed": job.rank0_error(), "kills": kills}
        return {"rate": job.counter.count_between(start, end) / duration_s, "kills": kills,
                "joins": job.joins()}
    finally:
        job.stop()


def main() -> int:
    quick = bench_report.quick()
    ap = argparse.ArgumentParser(description="goodput of an elastic job with periodic node kills")
    ap.add_argument("--rounds", type=int, default=1 if quick else 2)
    ap.add_argument("--duration", type=float, default=60 if quick else 120,
                    help="measured window per job (s)")
    ap.add_argument("--period", type=float, default=20 if quick else 30,
                    help="seconds between kills of node 2")
    ap.add_argument("--warm", type=float, default=2.0, help="seconds before the window")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="gsgp.", dir="/tmp")
    with open(os.open(os.path.join(tmp, "token"), os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write("elastic-goodput-bench-token\n")
    free, elastic = [], []
    progress = bench_report.Progress("elastic_goodput_bench", args.rounds * 2)
    try:
        for rnd in range(args.rounds):
            progress.step(f"round {rnd + 1}/{args.rounds}: failure-free")
            free.append(run_job(tmp, f"r{rnd}f", args.warm, args.duration, 0))
            progress.step(f"round {rnd + 1}/{args.rounds}: node 2 killed every {args.period} s")
            elastic.append(run_job(tmp, f"r{rnd}e", args.warm, args.duration, args.period))
    finally:
        progress.finish()
        shutil.rmtree(tmp, ignore_errors=True)

    rows = []
    for rnd, (f, e) in enumerate(zip(free, elastic)):
        goodput = (f"{100 * e['rate'] / f['rate']:.1f}%" if "rate" in f and "rate" in e else "")
        rows.append([rnd + 1, f.get("rate", f"failed: {f.get('failed')}"),
                     e.get("rate", f"failed: {e.get('failed')}"), e.get("kills", ""),
                     e.get("joins", ""), goodput])
    ok = [(f["rate"], e["rate"]) for f, e in zip(free, elastic) if "rate" in f and "rate" in e]
    if ok:
        rows.append(["median", statistics.median(f for f, _ in ok),
                     statistics.median(e for _, e in ok), "", "",
                     f"{100 * statistics.median(e / f for f, e in ok):.1f}%"])
    report = bench_report.Report("elastic_goodput_bench")
    report.table(
        f"Goodput: {NODES} nodes x {LOCAL} trainers (fault_trainer --catch-up, fp64), "
        f"--min-nodes 2 --max-nodes 3, node 2 SIGKILLed and replaced every {args.period:g} s "
        f"({args.duration:g} s windows, loopback)",
        ["round", "failure-free (it/s)", "with kills + replacements (it/s)", "kills",
         "replacements admitted (by the window's end)", "goodput"],
        rows,
        note=f"{os.cpu_count()} cores shared by {NODES} daemons, their Gloo workers and "
             f"{NODES * LOCAL} trainers; rank 0's completed iterations per second within the "
             "window; torchft reports 81.2% at one failure a minute (30 replica groups).")
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
