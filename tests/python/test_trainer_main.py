"""``gradsync._trainer_main``: how the launcher starts each trainer. It must
run a script exactly as ``python3 SCRIPT ARGS`` / ``python3 -m MODULE ARGS``
would (argv, ``__name__``, the script's directory first on sys.path, the exit
code), after choosing the trainer's CUDA device when there is one."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import PY_PACKAGE

PROBE = textwrap.dedent('''
    import json, sys
    out = sys.argv[1]
    info = {"argv": sys.argv, "name": __name__, "path0": sys.path[0]}
    try:
        import torch
        if torch.cuda.is_available():
            info["device"] = torch.cuda.current_device()
    except ImportError:
        pass
    with open(out, "w") as f:
        json.dump(info, f)
    sys.exit(int(sys.argv[2]))
''')


def _run(args, tmp_path: Path, local_rank: str = "0") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(PY_PACKAGE), LOCAL_RANK=local_rank)
    return subprocess.run([sys.executable, "-m", "gradsync._trainer_main"] + args,
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_runs_a_script_as_python_would(tmp_path: Path) -> None:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "probe.py").write_text(PROBE)
    out = tmp_path / "out.json"
    r = _run([str(scripts / "probe.py"), str(out), "0", "--flag"], tmp_path)
    assert r.returncode == 0, r.stderr
    info = json.loads(out.read_text())
    assert info["argv"] == [str(scripts / "probe.py"), str(out), "0", "--flag"]
    assert info["name"] == "__main__"
    assert info["path0"] == str(scripts)


def test_keeps_the_scripts_exit_code(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    r = _run(["probe.py", str(tmp_path / "out.json"), "7"], tmp_path)
    assert r.returncode == 7, r.stderr


def test_runs_a_module_as_python_minus_m_would(tmp_path: Path) -> None:
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "probe.py").write_text(PROBE)
    out = tmp_path / "out.json"
    env_path = f"{tmp_path}{os.pathsep}{PY_PACKAGE}"
    r = subprocess.run([sys.executable, "-m", "gradsync._trainer_main", "-m", "mypkg.probe",
                        str(out), "0"], cwd=tmp_path, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=env_path), timeout=120)
    assert r.returncode == 0, r.stderr
    info = json.loads(out.read_text())
    assert info["name"] == "__main__"
    assert info["argv"][1:] == [str(out), "0"]
    assert info["argv"][0].endswith(os.path.join("mypkg", "probe.py"))


def test_refuses_to_run_nothing(tmp_path: Path) -> None:
    r = _run([], tmp_path)
    assert r.returncode != 0
    assert "usage: python3 -m gradsync._trainer_main" in r.stderr


def test_sets_the_cuda_device_from_the_local_rank(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        # A GPU node (scripts/gpu-check.sh) sets GRADSYNC_REQUIRE_GPU=1: there a
        # missing device is a failure, not a skip.
        if os.environ.get("GRADSYNC_REQUIRE_GPU", "0") not in ("", "0"):
            pytest.fail("GRADSYNC_REQUIRE_GPU=1 but torch sees no CUDA device")
        pytest.skip("no CUDA device on this machine")
    (tmp_path / "probe.py").write_text(PROBE)
    out = tmp_path / "out.json"
    r = _run(["probe.py", str(out), "0"], tmp_path, local_rank="1")
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["device"] == 1 % torch.cuda.device_count()
