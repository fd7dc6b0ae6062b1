"""One version everywhere: gradsync.h's GS_VERSION_* (which scripts/install.sh
puts in gradsync.pc and the library's file name), gs_version() of the built
library, the Python package and its wheel (pyproject.toml)."""
from __future__ import annotations

import re

import gradsync
from gradsync import _lib

from conftest import PY_PACKAGE, REPO_ROOT


def header_version() -> tuple:
    text = (REPO_ROOT / "client" / "gradsync.h").read_text()
    return tuple(int(re.search(rf"^#define GS_VERSION_{part} (\d+)$", text, re.M).group(1))
                 for part in ("MAJOR", "MINOR", "PATCH"))


def test_library_package_and_wheel_share_the_headers_version() -> None:
    major, minor, patch = header_version()
    assert _lib.load_library().gs_version() == major * 10000 + minor * 100 + patch
    assert gradsync.__version__ == f"{major}.{minor}.{patch}"
    pyproject = (PY_PACKAGE / "pyproject.toml").read_text()
    assert re.search(r'^version = "(.*)"$', pyproject, re.M).group(1) == gradsync.__version__
