"""Fixtures of the gradsync Python tests: real daemons, real trainer processes.

Assumes `bazel build //client:libgradsync.so //daemon:gradsyncd` has run
(scripts/test.sh does it); stops the session with a clear message if not.
Every wait is bounded; every daemon and trainer started here is killed at
the end of its test; sockets live in short /tmp directories and every
daemon gets its own shared-memory prefix.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent.parent
PY_PACKAGE = REPO_ROOT / "client" / "python"
GRADSYNCD = REPO_ROOT / "bazel-bin" / "daemon" / "gradsyncd"
LIBGRADSYNC = REPO_ROOT / "bazel-bin" / "client" / "libgradsync.so"

sys.path.insert(0, str(PY_PACKAGE))
# Tests and their children use exactly this checkout's build.
os.environ["GRADSYNC_LIB"] = str(LIBGRADSYNC)
os.environ["GRADSYNC_DAEMON"] = str(GRADSYNCD)

TEST_DEADLINE_S = 150  # a watchdog per test, on top of every wait's own timeout
# Imported once by the forkserver the trainers are forked from.
_PRELOAD = ["torch", "torch.distributed", "torch.nn.parallel", "gradsync.torch", "gs_testlib",
            "trainer_worker"]
_mp_context = None


def wait_until(pred: Callable[[], object], timeout_s: float) -> bool:
    """How a test waits for a daemon or a trainer instead of sleeping: polls
    ``pred``, a read of observable state (a log, a file, a scrape), until it
    is true or ``timeout_s`` has passed on the monotonic clock. Returns
    whether it held (``pred`` runs at least once, every few milliseconds)."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True



def listen_port(cluster, timeout_s: float = 20) -> int:
    """The --listen port a daemon started with --listen=HOST:0 chose, read
    from its `event=started` log line once it is there (the daemon writes it
    after binding, so a test that reads the log at once can find nothing)."""
    def port():
        return re.search(r"event=started .*listen_port=(\d+)", cluster.daemon.log())
    if wait_until(port, timeout_s):
        return int(port().group(1))
    pytest.fail("no listen_port in the daemon's log\n" + cluster.logs())

def mp_context():
    """multiprocessing with a forkserver that imported torch once: a trainer
    then starts in milliseconds instead of seconds. The forkserver imports
    modules only (no torch ops, no gradsync connection), so forking it is safe
    (no OpenMP pool, no gRPC threads yet)."""
    global _mp_context
    if _mp_context is None:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        _mp_context = ctx
    return _mp_context


def pytest_sessionstart(session: pytest.Session) -> None:
    missing = [str(p) for p in (GRADSYNCD, LIBGRADSYNC) if not p.exists()]
    if missing:
        pytest.exit("gradsync binaries are missing: " + ", ".join(missing) +
                    "\nbuild them first: cd " + str(REPO_ROOT) +
                    " && bazel build //client:libgradsync.so //daemon:gradsyncd", returncode=2)


@pytest.fixture(autouse=True)
def _watchdog() -> Iterator[None]:
    """Turns a hung test into a failure (pytest-timeout is not installed)."""
    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"test exceeded its {TEST_DEADLINE_S} s deadline")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(TEST_DEADLINE_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A short fresh directory (unix socket paths must stay < 108 bytes)."""
    d = tempfile.mkdtemp(prefix="gsp.", dir="/tmp")
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(autouse=True)
def _traces_in_workdir(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every daemon a test starts writes its stall and timeout traces
    ($LOGS_DIRECTORY, else /tmp/gradsync) into the test's own directory."""
    monkeypatch.setenv("LOGS_DIRECTORY", str(workdir))


class Trainer:
    """One trainer process (trainer_worker.main); output in a log file,
    results in ``out``."""

    def __init__(self, process: "multiprocessing.process.BaseProcess", log_path: Path,
                 out: Path) -> None:
        self.process = process
        self.log_path = log_path
        self.out = out

    @property
    def pid(self) -> Optional[int]:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def result(self) -> dict:
        import torch
        return torch.load(self.out)

    def exit_code(self, timeout_s: float) -> Optional[int]:
        """Exit code (negative: killed by that signal); None if still running."""
        self.process.join(timeout_s)
        return self.process.exitcode

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(10)

    def wait_for_output(self, text: str, timeout_s: float) -> None:
        wait_until(lambda: text in self.log() or not self.process.is_alive(), timeout_s)
        if text not in self.log():
            pytest.fail(f"trainer never printed {text!r}:\n{self.log()}")


def shm_entries(prefix: str) -> List[str]:
    """Names under /dev/shm of the form ``<prefix>.<anything>``: what
    gradsyncd --shm-prefix=PREFIX created (the dot keeps prefix gspy1n1x
    from matching another cluster's gspy1n1x2.)."""
    return [n for n in os.listdir("/dev/shm") if n.startswith(prefix + ".")]


def remove_shm_entries(prefix: str) -> None:
    """Unlinks every shm_entries(prefix): a daemon killed with SIGKILL
    cannot remove its segments, and no later daemon sweeps a test's prefix."""
    for name in shm_entries(prefix):
        try:
            os.unlink(os.path.join("/dev/shm", name))
        except FileNotFoundError:
            pass


def _trainer_child(argv: List[str], env: Dict[str, str], log_path: str) -> None:
    import trainer_worker
    trainer_worker.child(argv, env, log_path)


class Cluster:
    """A gradsyncd on a private socket plus the trainers started against it."""

    _count = 0

    def __init__(self, workdir: Path, local_size: int, daemon_args: Sequence[str]) -> None:
        from gradsync.daemon import LocalDaemon
        Cluster._count += 1
        self.workdir = workdir
        self.name = f"d{Cluster._count}"
        self.socket = str(workdir / f"{self.name}.sock")
        self.shm_prefix = f"gspy{os.getpid()}n{Cluster._count}x"
        for arg in daemon_args:  # the daemon's own: the last --shm-prefix wins there too
            if arg.startswith("--shm-prefix="):
                self.shm_prefix = arg.split("=", 1)[1]
        self.daemon = LocalDaemon(self.socket, local_size, ["--timeout-s=30", *daemon_args],
                                  shm_prefix=self.shm_prefix,
                                  log_path=str(workdir / f"{self.name}.log"))
        # Same session as pytest: a Ctrl-C stops the daemons too.
        self.daemon.start(ready_timeout_s=20, new_session=False)
        self.trainers: List[Trainer] = []

    def start(self, local_rank: int, args: Sequence[str] = ()) -> Trainer:
        n = len(self.trainers)
        log = self.workdir / f"{self.name}.t{local_rank}.{n}.log"
        out = self.workdir / f"{self.name}.t{local_rank}.{n}.pt"
        env = {"LOCAL_RANK": str(local_rank), "GRADSYNC_SOCKET": self.socket}
        p = mp_context().Process(target=_trainer_child,
                                 args=(["--out", str(out), *args], env, str(log)), daemon=True)
        p.start()
        t = Trainer(p, log, out)
        self.trainers.append(t)
        return t

    def wait(self, trainers: Sequence[Trainer], timeout_s: float) -> List[int]:
        """Exit codes; kills everything and fails the test on timeout."""
        deadline = time.monotonic() + timeout_s
        codes = []
        for t in trainers:
            code = t.exit_code(max(0.0, deadline - time.monotonic()))
            if code is None:
                self.kill_trainers()
                pytest.fail(f"trainers did not finish within {timeout_s} s\n" + self.logs())
            codes.append(code)
        return codes

    def run(self, n: int, args: Sequence[str] = (), timeout_s: float = 90) -> List[dict]:
        """Runs n trainers to completion; their results, by local rank."""
        trainers = [self.start(r, args) for r in range(n)]
        codes = self.wait(trainers, timeout_s)
        if any(codes):
            pytest.fail(f"trainer exit codes {codes}\n" + self.logs())
        return [t.result() for t in trainers]

    def logs(self) -> str:
        parts = [f"--- trainer {t.log_path.name} ---\n{t.log()}" for t in self.trainers]
        parts.append(f"--- gradsyncd ---\n{self.daemon.log()[-6000:]}")
        return "\n".join(parts)

    def kill_trainers(self) -> None:
        for t in self.trainers:
            t.kill()

    def close(self) -> None:
        try:
            self.kill_trainers()
            self.daemon.stop(timeout_s=10)
        finally:
            remove_shm_entries(self.shm_prefix)


@pytest.fixture
def gradsyncd(workdir: Path):
    """Factory: ``gradsyncd(local_size, *daemon_args) -> Cluster``."""
    clusters: List[Cluster] = []

    def start(local_size: int, *daemon_args: str) -> Cluster:
        c = Cluster(workdir, local_size, daemon_args)
        clusters.append(c)
        return c

    yield start
    with contextlib.ExitStack() as closing:  # every cluster closes, even after one raised
        for c in clusters:
            closing.callback(c.close)


def run_standalone_trainers(script: Path, workdir: Path, env: Dict[str, str], count: int,
                            cwd: Optional[Path] = None) -> List[Tuple[int, str]]:
    """Runs ``count`` copies of standalone_trainer.py (``script``, writing
    into ``workdir``) as plain subprocesses, LOCAL_RANK and RANK 0..count-1
    added to ``env``, as a launcher would; their exit codes and outputs."""
    trainers = [subprocess.Popen([sys.executable, str(script), str(workdir)], cwd=cwd,
                                 env={**env, "LOCAL_RANK": str(r), "RANK": str(r)},
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                for r in range(count)]
    results = []
    for t in trainers:
        out, _ = t.communicate(timeout=90)
        results.append((t.returncode, out.decode()))
    return results
