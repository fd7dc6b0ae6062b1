#!/usr/bin/python3
"""elastic_recovery_bench: what a node's death costs an elastic job, against
restarting everything from the last checkpoint.

The job: 3 real gradsyncd on loopback (node 0 leads) x 2 real trainers each
(examples/mlp_trainer, fp64, --checkpoint every step on rank 0,
--timestamps: rank 0 prints when each step completed on the monotonic
clock), every daemon with --min-nodes=2 --max-nodes=3. Each round starts a
fresh job, lets it train --warm-steps steps, then:

  elastic, SIGKILL      node 2's daemon (its process group: the Gloo
                        worker too) and its 2 trainers SIGKILLed; the
                        figure is the time from the kill to rank 0's
                        completion of the iteration the survivors redo
                        (node 0's `event=job_reforming iteration=I`):
                        detection, re-formation and the redone iteration.
  elastic, SIGTERM      the same with SIGTERM to node 2's daemon and
                        trainers (how Kubernetes stops a Pod when a
                        StatefulSet scales down).
  restart everything    every daemon and trainer SIGKILLed, then all
                        restarted at once (new daemons, a new rendezvous)
                        and the trainers resume from the checkpoint rank 0
                        wrote after its last completed step; the figure is
                        the time from the kill to rank 0's first completed
                        step. Generous to the baseline: no step is lost
                        (a checkpoint every step) and a "replacement node"
                        costs nothing to provision.

Modes alternate within each round so the machine's drift hits all alike;
each figure is the median of the rounds with their min-max; a round whose
job failed instead of recovering is counted and its error shown. Beside
it the job's steady iteration time (the median gap between rank 0's steps
before the kill). Prints one markdown table, writes
bench-results/elastic_recovery_bench.json. Not a test: asserts nothing.

Run from the repository root after
`bazel build //daemon:gradsyncd //examples:mlp_trainer`:
    /usr/bin/python3 tests/bench/elastic_recovery_bench.py [--quick] [--rounds 5]
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional

import bench_report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DAEMON = os.path.join(ROOT, "bazel-bin/daemon/gradsyncd")
TRAINER = os.path.join(ROOT, "bazel-bin/examples/mlp_trainer")
NODES, LOCAL, VICTIM = 3, 2, 2
MODES = ("elastic, SIGKILL", "elastic, SIGTERM", "restart everything")
# A bound on every wait (a hang check, not a measurement).
WAIT_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StepClock:
    """Reads rank 0's stdout: when each step completed (monotonic seconds)."""

    _LINE = re.compile(r"^step\s+(\d+)\s.*mono_us=(\d+)")

    def __init__(self, process: subprocess.Popen) -> None:
        self.steps: Dict[int, float] = {}
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            m = self._LINE.match(line)
            if m:
                with self._cv:
                    self.steps[int(m.group(1))] = int(m.group(2)) / 1e6
                    self._cv.notify_all()
        with self._cv:
            self._cv.notify_all()

    def wait_for(self, pred, timeout_s: float) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: pred(self.steps), timeout=timeout_s)


class Job:
    """3 daemons x 2 trainers of one job, in `tmp`."""

    def __init__(self, tmp: str, tag: str, checkpoint: str, steps: int) -> None:
        self.tmp, self.tag, self.checkpoint, self.steps = tmp, tag, checkpoint, steps
        self.daemons: List[subprocess.Popen] = []
        self.trainers: List[List[subprocess.Popen]] = []
        self.clock: Optional[StepClock] = None

    def daemon_log(self, n: int) -> str:
        return os.path.join(self.tmp, f"{self.tag}.d{n}.log")

    def start(self) -> None:
        port = free_port()
        token = os.path.join(self.tmp, "token")
        for n in range(NODES):
            where = ([f"--listen=127.0.0.1:{port}"] if n == 0 else
                     [f"--leader=127.0.0.1:{port}", "--listen=127.0.0.1:0"])
            self.daemons.append(subprocess.Popen(
                [DAEMON, f"--socket={self.tmp}/{self.tag}.s{n}", f"--num-nodes={NODES}",
                 f"--node-rank={n}", f"--local-size={LOCAL}", "--min-nodes=2",
                 f"--max-nodes={NODES}", f"--shm-prefix=gser{os.getpid()}{self.tag}n{n}",
                 "--timeout-s=30", "--job-id=recovery", f"--job-token-file={token}", *where],
                stdout=open(self.daemon_log(n), "w"), stderr=subprocess.STDOUT,
                start_new_session=True))  # its own group: the Gloo worker dies with it
        for n in range(NODES):
            node = []
            for r in range(LOCAL):
                first = n == 0 and r == 0
                node.append(subprocess.Popen(
                    [TRAINER, f"--socket={self.tmp}/{self.tag}.s{n}", f"--steps={self.steps}",
                     "--batch=60", "--fp64", "--timestamps", f"--checkpoint={self.checkpoint}"],
                    env={**os.environ, "LOCAL_RANK": str(r)},
                    stdout=subprocess.PIPE if first else subprocess.DEVNULL,
                    stderr=open(os.path.join(self.tmp, f"{self.tag}.t{n}{r}.log"), "w"),
                    text=True))
            self.trainers.append(node)
        self.clock = StepClock(self.trainers[0][0])

    def signal_node(self, n: int, sig: int) -> None:
        for t in self.trainers[n]:
            if t.poll() is None:
                t.send_signal(sig)
        try:
            os.killpg(self.daemons[n].pid, sig)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        for n in range(len(self.daemons)):
            self.signal_node(n, signal.SIGKILL)
        for p in self.daemons + [t for node in self.trainers for t in node]:
            p.wait(timeout=30)
        for seg in glob.glob(f"/dev/shm/gser{os.getpid()}{self.tag}n*"):
            os.unlink(seg)

    def failure(self) -> str:
        """Rank 0's error, for a round that did not recover: the leader's
        explanation when there is one (the part that names the cause)."""
        log = open(os.path.join(self.tmp, f"{self.tag}.t00.log")).read()
        if "error=" not in log:
            return "no step completed within the bound"
        error = log.strip().splitlines()[-1]
        at = error.find("the leader reports:")
        return (error[at:] if at >= 0 else error)[:200].rstrip('"')


def steady_step_s(steps: Dict[int, float], before: float) -> float:
    times = sorted(t for t in steps.values() if t < before)[-50:]
    return statistics.median(b - a for a, b in zip(times, times[1:]))


def redone_iteration(log_path: str) -> Optional[int]:
    m = re.search(r"event=job_reforming .*?iteration=(\d+)", open(log_path).read())
    return int(m.group(1)) if m else None


def elastic_round(tmp: str, tag: str, sig: int, warm: int) -> dict:
    job = Job(tmp, tag, os.path.join(tmp, f"{tag}.ckpt"), 10**9)
    job.start()
    try:
        if not job.clock.wait_for(lambda s: len(s) >= warm, WAIT_S):
            raise RuntimeError(f"the job did not train: {job.failure()}")
        killed = time.monotonic()
        job.signal_node(VICTIM, sig)
        redone = None
        deadline = killed + WAIT_S
        while redone is None and time.monotonic() < deadline:
            redone = redone_iteration(job.daemon_log(0))
            if redone is None and job.trainers[0][0].poll() is not None:
                break
            time.sleep(0.01)
        if redone is None or not job.clock.wait_for(lambda s: redone in s, WAIT_S):
            return {"failed": job.failure()}
        return {"recovery_s": job.clock.steps[redone] - killed,
                "steady_s": steady_step_s(job.clock.steps, killed)}
    finally:
        job.stop()


def restart_round(tmp: str, tag: str, warm: int) -> dict:
    checkpoint = os.path.join(tmp, f"{tag}.ckpt")
    job = Job(tmp, tag + "a", checkpoint, 10**9)
    job.start()
    try:
        if not job.clock.wait_for(lambda s: len(s) >= warm, WAIT_S):
            raise RuntimeError(f"the job did not train: {job.failure()}")
        killed = time.monotonic()
        job.stop()
        steady = steady_step_s(job.clock.steps, killed)
    except BaseException:
        job.stop()
        raise
    again = Job(tmp, tag + "b", checkpoint, 10**9)
    again.start()
    try:
        if not again.clock.wait_for(lambda s: len(s) >= 1, WAIT_S):
            return {"failed": again.failure()}
        return {"recovery_s": min(again.clock.steps.values()) - killed, "steady_s": steady}
    finally:
        again.stop()


def torch_import_s() -> float:
    """How long `import torch` takes here: a floor on restarting a PyTorch
    trainer, which the C trainer above does not pay."""
    start = time.monotonic()
    subprocess.run(["/usr/bin/python3", "-c", "import torch"], check=True)
    return time.monotonic() - start


def main() -> int:
    quick = bench_report.quick()
    ap = argparse.ArgumentParser(description="elastic recovery vs restart-everything")
    ap.add_argument("--rounds", type=int, default=3 if quick else 5)
    ap.add_argument("--warm-steps", type=int, default=50)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="gser.", dir="/tmp")
    with open(os.open(os.path.join(tmp, "token"), os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write("elastic-recovery-bench-token\n")
    runs: Dict[str, List[dict]] = {m: [] for m in MODES}
    imports: List[float] = []
    progress = bench_report.Progress("elastic_recovery_bench", args.rounds * len(MODES))
    try:
        for rnd in range(args.rounds):
            for i, mode in enumerate(MODES):
                progress.step(f"round {rnd + 1}/{args.rounds}: {mode}")
                tag = f"r{rnd}m{i}"
                if mode == "restart everything":
                    runs[mode].append(restart_round(tmp, tag, args.warm_steps))
                else:
                    sig = signal.SIGKILL if "SIGKILL" in mode else signal.SIGTERM
                    runs[mode].append(elastic_round(tmp, tag, sig, args.warm_steps))
            imports.append(torch_import_s())
    finally:
        progress.finish()
        shutil.rmtree(tmp, ignore_errors=True)

    baseline = [r["recovery_s"] for r in runs["restart everything"] if "recovery_s" in r]
    rows = []
    for mode in MODES:
        ok = [r for r in runs[mode] if "recovery_s" in r]
        failed = [r["failed"] for r in runs[mode] if "failed" in r]
        if ok:
            rec = [r["recovery_s"] for r in ok]
            med = statistics.median(rec)
            rows.append([mode, len(ok), med, f"{min(rec):.2f}-{max(rec):.2f}",
                         " ".join(f"{v:.2f}" for v in rec),
                         statistics.median(baseline) / med if baseline else "",
                         statistics.median(r["steady_s"] for r in ok) * 1e3,
                         f"{len(failed)}: {failed[0]}" if failed else "0"])
        else:
            rows.append([mode, 0, "", "", "", "", "", f"{len(failed)}: {failed[0]}"])
    rows.append(["(for scale) `python3 -c 'import torch'`, once per round", "",
                 statistics.median(imports), f"{min(imports):.2f}-{max(imports):.2f}",
                 " ".join(f"{v:.2f}" for v in imports), "", "", ""])
    report = bench_report.Report("elastic_recovery_bench")
    report.table(
        f"A node's death: {NODES} nodes x {LOCAL} trainers (examples/mlp_trainer, fp64), "
        f"--min-nodes 2, on loopback (median of {args.rounds} alternated rounds)",
        ["what", "rounds recovered", "kill -> next completed iteration, median (s)",
         "min-max (s)", "every round (s)", "restart / this", "steady iteration (ms)",
         "rounds failed: first error"],
        rows,
        note=f"{os.cpu_count()} cores shared by {NODES} daemons, their Gloo workers and "
             f"{NODES * LOCAL} trainers; {args.warm_steps} steps before each kill; "
             "restart everything: every daemon and trainer SIGKILLed, restarted at once, "
             "trainers resume from rank 0's checkpoint of the last completed step (no work "
             "lost, no node to provision).")
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
