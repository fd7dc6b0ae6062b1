"""Python's copy of the default socket path equals the C++ one.

Python cannot include common/defaults.h, so gradsync.daemon keeps a copy of
kDefaultSocketPath; this test keeps the two from drifting: against the
header, and against the default the built gradsyncd reports.
"""
from __future__ import annotations

import re
import subprocess

from conftest import GRADSYNCD, REPO_ROOT

import gradsync.daemon


def _cxx_constant(name: str) -> str:
    header = (REPO_ROOT / "common" / "defaults.h").read_text()
    match = re.search(r'constexpr char %s\[\] = "([^"]*)";' % name, header)
    assert match, f"{name} not found in common/defaults.h"
    return match.group(1)


def test_default_socket_matches_the_header():
    assert gradsync.daemon.DEFAULT_SOCKET == _cxx_constant("kDefaultSocketPath")


def test_default_socket_matches_the_daemon():
    usage = subprocess.run([str(GRADSYNCD), "--helpfull"], capture_output=True, text=True,
                           timeout=30).stdout
    assert f'default: "{gradsync.daemon.DEFAULT_SOCKET}"' in usage
