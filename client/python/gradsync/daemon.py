"""Finding, starting and stopping a local gradsyncd.

Used by the launcher (``python3 -m gradsync.run``), the tests and the
benchmarks, so that all of them start the daemon the same way: on a private
socket and shared-memory prefix, with its log in a file, waiting until the
socket accepts connections, and stopping it with SIGTERM (which makes the
daemon remove its segments and socket) before resorting to SIGKILL.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from typing import IO, List, Optional, Sequence

from ._lib import REPO_ROOT
from .errors import GradsyncError

__all__ = ["DAEMON_ENV", "DEFAULT_SOCKET", "find_daemon", "socket_answers", "LocalDaemon",
           "per_user_socket"]

DAEMON_ENV = "GRADSYNC_DAEMON"
# Copies of kSystemSocketPath and kSocketFileName (common/defaults.h) and of
# common/default_socket.cc's rules; tests/python/test_defaults.py checks that
# they agree. DEFAULT_SOCKET is a system-wide daemon's socket (systemd's
# RuntimeDirectory=gradsync, the Kubernetes sidecar's volume).
DEFAULT_SOCKET = "/run/gradsync/gradsyncd.sock"
SOCKET_FILE_NAME = "gradsyncd.sock"


def per_user_socket() -> str:
    """A daemon's own socket when it is told none (outside systemd): in
    $XDG_RUNTIME_DIR/gradsync, else /tmp/gradsync-<euid>, a directory the
    daemon creates 0700."""
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    directory = f"{xdg}/gradsync" if xdg.startswith("/") else f"/tmp/gradsync-{os.geteuid()}"
    return f"{directory}/{SOCKET_FILE_NAME}"


def default_socket() -> str:
    """The socket a trainer's Client uses when given none: $GRADSYNC_SOCKET,
    else DEFAULT_SOCKET when a system-wide daemon's socket is there, else
    per_user_socket()."""
    env = os.environ.get("GRADSYNC_SOCKET")
    if env:
        return env
    try:
        if stat.S_ISSOCK(os.lstat(DEFAULT_SOCKET).st_mode):
            return DEFAULT_SOCKET
    except OSError:
        pass
    return per_user_socket()


def find_daemon() -> str:
    """Path of the gradsyncd binary: ``$GRADSYNC_DAEMON``, Bazel's output in
    this source tree (``bazel-bin/daemon/gradsyncd``), or ``gradsyncd`` on PATH."""
    env = os.environ.get(DAEMON_ENV)
    if env:
        if not (os.path.isfile(env) and os.access(env, os.X_OK)):
            raise GradsyncError(f"${DAEMON_ENV} is set to {env!r}, which is not an executable")
        return env
    built = REPO_ROOT / "bazel-bin" / "daemon" / "gradsyncd"
    if built.is_file() and os.access(built, os.X_OK):
        return str(built)
    on_path = shutil.which("gradsyncd")
    if on_path:
        return on_path
    raise GradsyncError(
        f"cannot find gradsyncd: set ${DAEMON_ENV}, build it with `bazel build "
        f"//daemon:gradsyncd` (looked for {built}), or put it on PATH")


def socket_answers(path: str, timeout_s: float = 0.5) -> bool:
    """True if something accepts connections on the unix socket ``path``."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout_s)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def die_with_parent(sig: int):
    """A ``preexec_fn`` making the child receive ``sig`` when the thread that
    started it exits (Linux PR_SET_PDEATHSIG): a launcher or test that is
    killed, even by SIGKILL, leaves no daemon or trainer behind."""
    def set_pdeathsig() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, sig, 0, 0, 0)  # PR_SET_PDEATHSIG
        except Exception:  # not Linux: best effort
            pass
    return set_pdeathsig


def _has_flag(args: Sequence[str], flag: str) -> bool:
    """Whether ``--flag`` (or ``--flag=...``, dashes or underscores) is in args."""
    names = {flag, flag.replace("-", "_")}
    for a in args:
        key = a.split("=", 1)[0]
        if key in names:
            return True
    return False


class LocalDaemon:
    """A gradsyncd child process.

    Args:
        socket_path: unix socket (< 100 bytes, the daemon checks).
        local_size: trainers on this node.
        args: extra daemon flags (``--bucket-cap-mb=1``...). Flags given here
            override the ones this class would add (--listen, --shm-prefix).
        shm_prefix: shared-memory name prefix, letters and digits; None: a
            unique one from this process's pid.
        binary: the gradsyncd path (None: ``find_daemon()``).
        log_path: where its stdout+stderr go (None: discarded).
    """

    _counter = 0

    def __init__(self, socket_path: str, local_size: int, args: Sequence[str] = (), *,
                 shm_prefix: Optional[str] = None, binary: Optional[str] = None,
                 log_path: Optional[str] = None) -> None:
        LocalDaemon._counter += 1
        self.socket_path = socket_path
        self.local_size = local_size
        self.shm_prefix = shm_prefix or f"gsd{os.getpid()}n{LocalDaemon._counter}x"
        self.binary = binary or find_daemon()
        self.log_path = log_path
        self.args: List[str] = list(args)
        self.process: Optional[subprocess.Popen] = None
        self._log: Optional[IO[bytes]] = None

    def command(self) -> List[str]:
        cmd = [self.binary, f"--socket={self.socket_path}"]
        if not _has_flag(self.args, "--local-size"):
            cmd.append(f"--local-size={self.local_size}")
        if not _has_flag(self.args, "--listen"):
            cmd.append("--listen=127.0.0.1:0")  # never collide on the default port
        if not _has_flag(self.args, "--shm-prefix"):
            cmd.append(f"--shm-prefix={self.shm_prefix}")
        return cmd + self.args

    def start(self, ready_timeout_s: float = 30.0, *, new_session: bool = True,
              stop_with_parent: bool = True) -> "LocalDaemon":
        """Starts the daemon and waits until its socket accepts connections.

        ``new_session``: the daemon gets its own session, so a Ctrl-C in the
        terminal reaches only our process, which stops the trainers first and
        the daemon last. ``stop_with_parent``: the daemon gets SIGTERM when
        the *thread* calling start() exits (so call it from a long-lived one).
        """
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self._log = out if self.log_path else None
        self.process = subprocess.Popen(
            self.command(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=new_session,
            preexec_fn=die_with_parent(signal.SIGTERM) if stop_with_parent else None)
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise GradsyncError(
                    f"gradsyncd exited with code {self.process.returncode} during startup"
                    + self._log_tail())
            if os.path.exists(self.socket_path) and socket_answers(self.socket_path):
                return self
            time.sleep(0.01)
        self.stop()
        raise GradsyncError(f"gradsyncd did not answer on {self.socket_path} within "
                            f"{ready_timeout_s:g} s" + self._log_tail())

    def _log_tail(self, lines: int = 20) -> str:
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, "rb") as f:
            tail = f.read().decode("utf-8", "replace").splitlines()[-lines:]
        return "\n--- gradsyncd log (" + self.log_path + ") ---\n" + "\n".join(tail)

    def log(self) -> str:
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    @property
    def pid(self) -> Optional[int]:
        return self.process.pid if self.process else None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 10.0) -> Optional[int]:
        """SIGTERM (the daemon cleans up), then SIGKILL after ``timeout_s``.
        Returns the exit code (None if it was never started)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout_s)
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.process.returncode

    def __enter__(self) -> "LocalDaemon":
        if self.process is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
