"""``python3 -m gradsync.run``: start N local trainers against a gradsyncd.

    python3 -m gradsync.run --nproc 2 [--socket PATH] [--daemon-arg=--bucket-cap-mb=50 ...]
                            SCRIPT [ARGS...]

* If no daemon answers on the socket (``--socket``, else ``$GRADSYNC_SOCKET``,
  else the daemon's default socket) one is started with ``--local-size N`` plus the
  ``--daemon-arg`` flags, and stopped (SIGTERM) when the trainers are done.
  A daemon that already answers is used as it is and left running.
* Each trainer runs ``python3 SCRIPT ARGS`` (``-m``: ``python3 -m SCRIPT``)
  with ``LOCAL_RANK``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
  ``GRADSYNC_SOCKET`` set (and ``MASTER_ADDR``/``MASTER_PORT`` for scripts that
  also create a torch.distributed process group), and can ``import gradsync``.
  With torch and CUDA available, each trainer's current CUDA device is set
  to ``LOCAL_RANK % device_count()`` before its script starts.
* Each trainer keeps the heap memory it frees for the next step
  (``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_``, see
  gradsync.trainer_malloc), unless the environment already configures
  malloc or ``--glibc-malloc-defaults`` is given.
* SIGINT, SIGTERM and SIGHUP are forwarded to the trainers. When a trainer
  fails, the others normally fail within moments (the daemon reports the
  peer failure to them); any still running after ``--grace-s`` are
  terminated.
* The exit code is the first non-zero trainer exit code (128 + N for a
  trainer killed by signal N), else 0.
"""
from __future__ import annotations

import argparse
import os
import queue
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

from . import daemon as _daemon
from . import trainer_malloc

_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_POLL_S = 0.05


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python3 -m gradsync.run",
        description="Runs N trainers of a data-parallel job against a local gradsyncd "
                    "(started if none answers on the socket).")
    # torchrun's spellings too (--nproc_per_node, --node_rank), so that a
    # torchrun command line works with gradsync.run in its place.
    p.add_argument("--nproc", "--nproc-per-node", "--nproc_per_node", dest="nproc", type=int,
                   required=True,
                   help="trainers to start on this node")
    p.add_argument("--socket", default=None,
                   help="the daemon's unix socket (default: $GRADSYNC_SOCKET, else "
                        f"{_daemon.DEFAULT_SOCKET} if a system daemon runs, else "
                        f"{_daemon.per_user_socket()})")
    p.add_argument("--daemon-arg", action="append", default=[], metavar="ARG",
                   help="extra gradsyncd flag for a daemon started here, e.g. "
                        "--daemon-arg=--bucket-cap-mb=50 (repeatable; shell-split)")
    p.add_argument("--daemon", default=None,
                   help="gradsyncd binary (default: $GRADSYNC_DAEMON, the repository's "
                        "bazel-bin/daemon/gradsyncd, or gradsyncd on PATH)")
    p.add_argument("--daemon-log", default=None,
                   help="log file of a daemon started here (default: a temporary file)")
    p.add_argument("--nnodes", type=int, default=1,
                   help="nodes in the job (sets WORLD_SIZE/RANK; a daemon started here gets "
                        "--num-nodes, and needs --daemon-arg=--job-token-file=F (mode 0600) "
                        "on every node and --daemon-arg=--leader=... on other nodes)")
    p.add_argument("--node-rank", "--node_rank", dest="node_rank", type=int, default=0,
                   help="this node's rank")
    p.add_argument("--grace-s", type=float, default=30.0,
                   help="after a trainer fails (or a signal), how long the others may take "
                        "to exit before they are terminated")
    p.add_argument("--start-timeout-s", type=float, default=30.0,
                   help="how long a started daemon may take to answer")
    p.add_argument("--glibc-malloc-defaults", action="store_true",
                   help="leave the trainers' malloc as glibc sets it (by default they keep "
                        "freed heap memory for the next step: see gradsync.trainer_malloc)")
    p.add_argument("-m", "--module", action="store_true",
                   help="SCRIPT is a module name (python3 -m SCRIPT)")
    p.add_argument("script", metavar="SCRIPT")
    p.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS")
    args = p.parse_args(argv)
    if args.nproc < 1:
        p.error("--nproc must be >= 1")
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        p.error("need --nnodes >= 1 and 0 <= --node-rank < --nnodes")
    args.daemon_arg = [a for chunk in args.daemon_arg for a in shlex.split(chunk)]
    return args


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exit_code(returncode: int) -> int:
    """Shell convention: a child killed by signal N reports 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _say(message: str) -> None:
    print(f"gradsync.run: {message}", file=sys.stderr, flush=True)


class _Launcher:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.socket = args.socket or _daemon.default_socket()
        self.daemon: Optional[_daemon.LocalDaemon] = None
        self.trainers: List[subprocess.Popen] = []
        self.signal_received: Optional[int] = None
        self.tmpdir: Optional[str] = None

    # -- daemon ---------------------------------------------------------------

    def ensure_daemon(self) -> None:
        if _daemon.socket_answers(self.socket):
            _say(f"using the gradsyncd answering on {self.socket}")
            return
        args = list(self.args.daemon_arg)
        if self.args.nnodes > 1:
            args += [f"--num-nodes={self.args.nnodes}", f"--node-rank={self.args.node_rank}"]
        log_path = self.args.daemon_log
        if log_path is None:
            self.tmpdir = tempfile.mkdtemp(prefix="gsrun.", dir="/tmp")
            log_path = os.path.join(self.tmpdir, "gradsyncd.log")
        self.daemon = _daemon.LocalDaemon(self.socket, self.args.nproc, args,
                                          shm_prefix=f"gsrun{os.getpid()}",
                                          binary=self.args.daemon, log_path=log_path)
        self.daemon.start(self.args.start_timeout_s)
        _say(f"started gradsyncd (pid {self.daemon.pid}) on {self.socket}, log {log_path}")

    def stop_daemon(self) -> None:
        if self.daemon is not None and self.daemon.running():
            self.daemon.stop()

    # -- trainers -------------------------------------------------------------

    def trainer_env(self, local_rank: int, master_port: int) -> Dict[str, str]:
        env = dict(os.environ)
        nproc = self.args.nproc
        env.update({
            "LOCAL_RANK": str(local_rank),
            "RANK": str(self.args.node_rank * nproc + local_rank),
            "WORLD_SIZE": str(self.args.nnodes * nproc),
            "LOCAL_WORLD_SIZE": str(nproc),
            "GRADSYNC_SOCKET": self.socket,
        })
        if self.args.glibc_malloc_defaults:
            env.update(trainer_malloc.opt_out_env())  # or gradsync.Client would set them
        else:
            env.update(trainer_malloc.steady_heap_env(env))
        env.setdefault("MASTER_ADDR", "127.0.0.1")
        env.setdefault("MASTER_PORT", str(master_port))
        # The trainers import the same gradsync package as this launcher.
        paths = [_PACKAGE_PARENT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        return env

    def start_trainers(self) -> None:
        # Through gradsync._trainer_main, which sets the trainer's CUDA device
        # from LOCAL_RANK (when torch and a GPU are there) before the script runs.
        cmd = [sys.executable, "-m", "gradsync._trainer_main"] + \
              (["-m"] if self.args.module else []) + \
              [self.args.script] + list(self.args.script_args)
        port = _free_port()
        for r in range(self.args.nproc):
            # Own session: a terminal Ctrl-C reaches the launcher only, which
            # forwards it once (no double delivery).
            self.trainers.append(subprocess.Popen(
                cmd, env=self.trainer_env(r, port), start_new_session=True,
                preexec_fn=_daemon.die_with_parent(signal.SIGKILL)))

    def forward(self, sig: int) -> None:
        for p in self.trainers:
            if p.poll() is None:
                try:
                    p.send_signal(sig)
                except ProcessLookupError:
                    pass

    def on_signal(self, sig: int, _frame: object) -> None:
        if self.signal_received is None:
            self.signal_received = sig
        self.forward(sig)

    def supervise(self) -> int:
        """Waits for every trainer; returns the first non-zero exit code.

        One waiter thread per trainer records exits in the order they happen
        (polling could see two exits in one pass and misorder them: the
        trainer that failed first is the interesting one, the others usually
        fail *because* of it).
        """
        exits: "queue.Queue[Tuple[int, int]]" = queue.Queue()

        def waiter(rank: int, p: subprocess.Popen) -> None:
            exits.put((rank, p.wait()))

        for r, p in enumerate(self.trainers):
            threading.Thread(target=waiter, args=(r, p), daemon=True).start()
        first_failure: Optional[int] = None
        trouble_since: Optional[float] = None  # a failure or a signal
        terminated_at: Optional[float] = None
        remaining = len(self.trainers)
        while remaining:
            try:
                rank, returncode = exits.get(timeout=_POLL_S)
            except queue.Empty:
                pass
            else:
                remaining -= 1
                code = _exit_code(returncode)
                if code != 0 and first_failure is None:
                    first_failure = code
                    _say(f"trainer {rank} (pid {self.trainers[rank].pid}) exited with code {code}")
            now = time.monotonic()
            if trouble_since is None and (first_failure is not None or self.signal_received):
                trouble_since = now
            if trouble_since is not None and remaining:
                if terminated_at is None and now - trouble_since > self.args.grace_s:
                    _say(f"terminating the trainers still running after {self.args.grace_s:g} s")
                    self.forward(signal.SIGTERM)
                    terminated_at = now
                elif terminated_at is not None and now - terminated_at > 10:
                    self.forward(signal.SIGKILL)
        if first_failure is None and self.signal_received:
            return 128 + self.signal_received
        return first_failure or 0

    def run(self) -> int:
        previous = {s: signal.signal(s, self.on_signal) for s in _FORWARDED}
        code = 1
        try:
            try:
                self.ensure_daemon()
            except Exception as e:
                _say(f"cannot start gradsyncd: {e}")
                return code
            if self.signal_received:
                code = 128 + self.signal_received
                return code
            self.start_trainers()
            code = self.supervise()
            return code
        finally:
            for p in self.trainers:  # only if supervise() was interrupted
                if p.poll() is None:
                    p.kill()
                    p.wait()
            self.stop_daemon()
            for s, h in previous.items():
                signal.signal(s, h)
            if self.tmpdir:
                if code == 0:
                    shutil.rmtree(self.tmpdir, ignore_errors=True)
                else:
                    _say(f"the daemon's log is kept in {self.tmpdir}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    return _Launcher(args).run()


if __name__ == "__main__":
    sys.exit(main())
