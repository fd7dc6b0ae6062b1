"""``python3 -m gradsync.run``: the launcher, as a real subprocess starting
real trainers (small scripts using gradsync.Client, no torch, so they start
fast) and, when none answers, a real gradsyncd."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

from conftest import PY_PACKAGE, REPO_ROOT, remove_shm_entries, wait_until
from gradsync.daemon import socket_answers

# The prefix of the daemons these launchers start.
LAUNCHER_SHM_PREFIX = f"gspyrun{os.getpid()}"

JOB = textwrap.dedent('''
    import json, os, signal, sys, time
    import numpy as np
    import gradsync

    out, mode = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    keys = ["LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GRADSYNC_SOCKET",
            "MASTER_ADDR", "MASTER_PORT", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"]
    with open(os.path.join(out, f"env.{rank}"), "w") as f:
        json.dump({k: os.environ.get(k) for k in keys}, f)
    c = gradsync.Client(connect_timeout_s=10)   # socket and local rank from the env
    c.register([("w", "float32", 4)])
    w = np.frombuffer(c.buffer(0), dtype=np.float32)
    if mode == "fail" and rank == 1:
        os._exit(7)  # a crash: no goodbye to the daemon
    if mode == "sleep":
        def on_term(sig, frame):
            open(os.path.join(out, f"term.{rank}"), "w").close()
            sys.exit(3)
        signal.signal(signal.SIGTERM, on_term)
        open(os.path.join(out, f"ready.{rank}"), "w").close()
        time.sleep(60)
        sys.exit(0)
    for it in range(3):
        w[:] = rank + it
        c.mark_ready(0)
        c.wait(timeout_s=10)
    with open(os.path.join(out, f"result.{rank}"), "w") as f:
        json.dump(w.tolist(), f)
    c.close()
''')


@pytest.fixture(autouse=True)
def _no_launcher_segments_left() -> Iterator[None]:
    """The launchers' daemons share this process's prefix; one whose launcher
    was killed cannot remove its segments, and no later daemon sweeps it."""
    yield
    remove_shm_entries(LAUNCHER_SHM_PREFIX)


def launch(workdir: Path, nproc: int, script_args: List[str], *extra: str,
           script: str = "", env_extra: Optional[Dict[str, str]] = None) -> subprocess.Popen:
    if not script:
        script = str(workdir / "job.py")
        Path(script).write_text(JOB)
    env = dict(os.environ, PYTHONPATH=str(PY_PACKAGE))
    for name in ("GRADSYNC_SOCKET", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        env.pop(name, None)
    env.update(env_extra or {})
    cmd = [sys.executable, "-m", "gradsync.run", "--nproc", str(nproc),
           "--socket", str(workdir / "run.sock"), f"--daemon-arg=--shm-prefix={LAUNCHER_SHM_PREFIX}", f"--daemon-log={workdir / 'daemon.log'}", *extra, script,
           *script_args]
    return subprocess.Popen(cmd, cwd=str(REPO_ROOT), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(p: subprocess.Popen, timeout_s: float = 60) -> Tuple[int, str, str]:
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"the launcher did not finish in {timeout_s} s\n{out}\n{err}")
    return p.returncode, out, err


def started_daemon_pid(stderr: str) -> int:
    m = re.search(r"started gradsyncd \(pid (\d+)\)", stderr)
    assert m, stderr
    return int(m.group(1))


def assert_gone(pid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped by the launcher: not even a zombie


def test_runs_trainers_and_stops_the_daemon_it_started(workdir: Path) -> None:
    code, out, err = finish(launch(workdir, 2, [str(workdir), "ok"]))
    assert code == 0, err
    pid = started_daemon_pid(err)
    assert_gone(pid)
    assert not socket_answers(str(workdir / "run.sock"))
    for rank in range(2):
        env = json.loads((workdir / f"env.{rank}").read_text())
        assert env["LOCAL_RANK"] == env["RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2"
        assert env["GRADSYNC_SOCKET"] == str(workdir / "run.sock")
        assert env["MASTER_ADDR"] and env["MASTER_PORT"]
        # Freed heap memory is kept for the next step (gradsync.trainer_malloc).
        assert env["MALLOC_MMAP_THRESHOLD_"] == str(1 << 30)
        assert env["MALLOC_TRIM_THRESHOLD_"] == str(4 << 30)
        # Last iteration: (0 + 2 + 1 + 2) / 2 = 2.5 on both trainers.
        assert json.loads((workdir / f"result.{rank}").read_text()) == [2.5] * 4


@pytest.mark.parametrize("extra,env_extra,expected", [
    # The user's own malloc setting stands: neither variable is added (one
    # alone would switch off glibc's adaptive threshold).
    ((), {"MALLOC_TRIM_THRESHOLD_": "1000000"}, (None, "1000000")),
    ((), {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}, (None, None)),
    (("--glibc-malloc-defaults",), {}, (None, None)),
])
def test_leaves_malloc_alone_when_told_or_already_set(workdir: Path, extra, env_extra,
                                                      expected) -> None:
    code, out, err = finish(launch(workdir, 1, [str(workdir), "ok"], *extra,
                                   env_extra=env_extra))
    assert code == 0, err
    env = json.loads((workdir / "env.0").read_text())
    assert (env["MALLOC_MMAP_THRESHOLD_"], env["MALLOC_TRIM_THRESHOLD_"]) == expected


def test_returns_the_first_failure(workdir: Path) -> None:
    """Trainer 1 exits with 7; trainer 0 then fails with PeerFailedError
    (exit code 1): the launcher returns 7, stops the daemon, does not hang."""
    code, out, err = finish(launch(workdir, 2, [str(workdir), "fail"], "--grace-s=20"))
    assert code == 7, err
    assert "trainer 1" in err and "code 7" in err
    assert_gone(started_daemon_pid(err))


def test_uses_a_running_daemon_and_leaves_it_running(gradsyncd, workdir: Path) -> None:
    cluster = gradsyncd(2)
    (workdir / "job.py").write_text(JOB)
    cmd = [sys.executable, "-m", "gradsync.run", "--nproc", "2", "--socket", cluster.socket,
           str(workdir / "job.py"), str(workdir), "ok"]
    p = subprocess.Popen(cmd, env=dict(os.environ, PYTHONPATH=str(PY_PACKAGE)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    code, out, err = finish(p)
    assert code == 0, err
    assert "using the gradsyncd answering on" in err and "started gradsyncd" not in err
    assert cluster.daemon.running()
    assert json.loads((workdir / "result.1").read_text()) == [2.5] * 4


def test_forwards_sigterm(workdir: Path) -> None:
    p = launch(workdir, 2, [str(workdir), "sleep"], "--grace-s=20")
    def ready() -> bool:
        return all((workdir / f"ready.{r}").exists() for r in range(2))
    wait_until(lambda: ready() or p.poll() is not None, 60)
    if not ready():
        p.kill()
        pytest.fail("trainers never got ready:\n" + "\n".join(p.communicate()))
    p.send_signal(signal.SIGTERM)
    code, out, err = finish(p, timeout_s=30)
    assert code == 3, err  # the trainers' own exit code on SIGTERM
    assert all((workdir / f"term.{r}").exists() for r in range(2))
    assert_gone(started_daemon_pid(err))


def test_bad_usage_is_reported(workdir: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "gradsync.run", "--nproc", "0", "x.py"],
                       env=dict(os.environ, PYTHONPATH=str(PY_PACKAGE)), capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 2 and "--nproc must be >= 1" in p.stderr


def test_train_mlp_example(workdir: Path) -> None:
    """examples/train_mlp.py through the launcher: the loss falls and both
    replicas end with the same weights."""
    code, out, err = finish(launch(workdir, 2, ["--steps=60", "--log-every=20"],
                                   script=str(REPO_ROOT / "examples" / "train_mlp.py")),
                            timeout_s=120)
    assert code == 0, err
    losses = [float(x) for x in re.findall(r"eval loss ([\d.]+)", out)]
    assert len(losses) == 4 and losses[-1] < 0.7 * losses[0], out
    sums = set(re.findall(r"weights checksum (\S+)", out))
    assert len(re.findall(r"weights checksum", out)) == 2 and len(sums) == 1, out


def test_accepts_torchruns_spellings(gradsyncd, workdir: Path) -> None:
    """A torchrun command line's options, with gradsync.run in torchrun's place."""
    cluster = gradsyncd(2)
    (workdir / "job.py").write_text(JOB)
    cmd = [sys.executable, "-m", "gradsync.run", "--nproc_per_node=2", "--nnodes=1",
           "--node_rank=0", "--socket", cluster.socket, str(workdir / "job.py"), str(workdir),
           "ok"]
    p = subprocess.Popen(cmd, env=dict(os.environ, PYTHONPATH=str(PY_PACKAGE)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    code, out, err = finish(p)
    assert code == 0, err
    for rank in range(2):
        env = json.loads((workdir / f"env.{rank}").read_text())
        assert env["LOCAL_RANK"] == env["RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2"
        assert json.loads((workdir / f"result.{rank}").read_text()) == [2.5] * 4
