"""Python's copy of the default socket rules equals the C++ one.

Python cannot include common/defaults.h or call common/default_socket.cc,
so gradsync.daemon keeps copies; this test keeps them from drifting: against
the header, and against the default the built gradsyncd reports for a
given environment (it resolves it at start, like the client library).
"""
from __future__ import annotations

import os
import re
import subprocess

from conftest import GRADSYNCD, REPO_ROOT

import gradsync.daemon


def _cxx_constant(name: str) -> str:
    header = (REPO_ROOT / "common" / "defaults.h").read_text()
    match = re.search(r'constexpr char %s\[\] = "([^"]*)";' % name, header)
    assert match, f"{name} not found in common/defaults.h"
    return match.group(1)


def _daemon_default(env: dict) -> str:
    usage = subprocess.run([str(GRADSYNCD), "--helpfull"], capture_output=True, text=True,
                           timeout=30, env=env).stdout
    match = re.search(r'--socket \(.*?\);\s+default: "([^"]*)"', usage, re.S)
    assert match, usage
    return match.group(1)


def test_system_socket_matches_the_header():
    assert gradsync.daemon.DEFAULT_SOCKET == _cxx_constant("kSystemSocketPath")
    assert gradsync.daemon.SOCKET_FILE_NAME == _cxx_constant("kSocketFileName")


def test_per_user_socket_matches_the_daemon(monkeypatch):
    base = {k: v for k, v in os.environ.items()
            if k not in ("XDG_RUNTIME_DIR", "RUNTIME_DIRECTORY")}
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    assert gradsync.daemon.per_user_socket() == f"/tmp/gradsync-{os.geteuid()}/gradsyncd.sock"
    assert _daemon_default(base) == gradsync.daemon.per_user_socket()
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/4242")
    assert gradsync.daemon.per_user_socket() == "/run/user/4242/gradsync/gradsyncd.sock"
    assert _daemon_default(dict(base, XDG_RUNTIME_DIR="/run/user/4242")) == \
        gradsync.daemon.per_user_socket()


def test_systemd_runtime_directory_holds_the_daemon_socket():
    env = dict(os.environ, RUNTIME_DIRECTORY="/run/gradsync")
    assert _daemon_default(env) == gradsync.daemon.DEFAULT_SOCKET


def test_client_default_prefers_the_environment(monkeypatch):
    monkeypatch.setenv("GRADSYNC_SOCKET", "/tmp/elsewhere.sock")
    assert gradsync.daemon.default_socket() == "/tmp/elsewhere.sock"
