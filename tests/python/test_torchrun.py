"""Trainers started by torchrun (torch.distributed.run, which sets LOCAL_RANK,
RANK, WORLD_SIZE, LOCAL_WORLD_SIZE) work unchanged against a running
gradsyncd: no torch.distributed initialization, gradsync's ranks are
torchrun's, and training matches the single-process reference."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from conftest import PY_PACKAGE, TESTS_DIR, run_standalone_trainers

import standalone_trainer


def test_torchrun_trainers_train_against_a_running_daemon(workdir: Path, gradsyncd) -> None:
    cluster = gradsyncd(2)
    env = {**os.environ, "GRADSYNC_SOCKET": cluster.socket, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(PY_PACKAGE)}
    # --redirects/--tee 1: Debian 12's torch 1.13 under Python 3.11 crashes on
    # their default "0" (Std.from_str finds no member: 3.11's Flag iteration
    # skips the 0 value), before starting any trainer.
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "--redirects=1", "--tee=1",
         str(TESTS_DIR / "standalone_trainer.py"), str(workdir)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    assert run.returncode == 0, run.stdout.decode() + "\n" + cluster.logs()
    expected = standalone_trainer.reference(2)
    for rank in range(2):
        result = json.loads((workdir / f"result.{rank}").read_text())
        assert result["env"] == {"LOCAL_RANK": str(rank), "RANK": str(rank), "WORLD_SIZE": "2",
                                 "LOCAL_WORLD_SIZE": "2"}, result["env"]
        assert result["world_size"] == 2
        np.testing.assert_allclose(result["w"], expected, rtol=1e-12)


def test_launcher_world_size_that_gradsync_does_not_have_is_refused(workdir: Path,
                                                                   gradsyncd) -> None:
    """What ``torchrun --nnodes 2`` against two daemons that were not joined
    into one job gives each trainer: WORLD_SIZE 4, a gradsync world of 2.
    Averaging over half the job must not go unnoticed."""
    cluster = gradsyncd(2)
    env = {**os.environ, "GRADSYNC_SOCKET": cluster.socket, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(PY_PACKAGE), "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}
    script = TESTS_DIR / "standalone_trainer.py"
    for code, text in run_standalone_trainers(script, workdir, env, 2):
        assert code != 0, text
        assert "InvalidArgumentError: gs_register: $WORLD_SIZE is 4" in text, text
        assert "gradsync job has 2 trainers" in text, text
        assert "[INVALID_ARGUMENT]" in text, text
    assert not list(workdir.glob("result.*"))
