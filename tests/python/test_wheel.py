"""The wheel from scripts/build-wheel.sh bundles libgradsync.so: installed
with pip into a fresh directory (offline), it trains against a real gradsyncd
from outside the checkout, loading its own copy of the library."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO_ROOT, TESTS_DIR, run_standalone_trainers

import standalone_trainer


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    env = {**os.environ, "PYTHON": sys.executable}
    subprocess.run(["bash", str(REPO_ROOT / "scripts" / "build-wheel.sh"), str(out)],
                   check=True, env=env, timeout=300)
    wheels = list(out.glob("gradsync-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_is_a_platform_wheel_with_the_library(wheel: Path) -> None:
    assert not wheel.name.endswith("-any.whl"), wheel.name
    assert wheel.name.startswith("gradsync-0.1.0-py3-none-linux_"), wheel.name
    with zipfile.ZipFile(wheel) as z:
        assert "gradsync/lib/libgradsync.so" in z.namelist()


def test_installed_wheel_trains_outside_the_checkout(wheel: Path, workdir: Path,
                                                      gradsyncd) -> None:
    target = workdir / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index",
                    "--no-deps", "--target", str(target), str(wheel)],
                   check=True, timeout=120)
    script = target / "trainer.py"
    shutil.copy(TESTS_DIR / "standalone_trainer.py", script)
    cluster = gradsyncd(2)
    env = {k: v for k, v in os.environ.items()
           if k not in ("GRADSYNC_LIB", "PYTHONPATH", "LD_LIBRARY_PATH")}
    env.update(PYTHONPATH=str(target), GRADSYNC_SOCKET=cluster.socket, OMP_NUM_THREADS="1")
    for code, text in run_standalone_trainers(script, workdir, env, 2, cwd=target):
        assert code == 0, text + "\n" + cluster.logs()
    expected = standalone_trainer.reference(2)
    for rank in range(2):
        result = json.loads((workdir / f"result.{rank}").read_text())
        assert result["library"] == str(target / "gradsync" / "lib" / "libgradsync.so")
        assert result["package"].startswith(str(target)), result["package"]
        np.testing.assert_allclose(result["w"], expected, rtol=1e-12)
