"""Finding and loading libgradsync.so, and the ctypes prototypes of its C ABI.

The C ABI (client/gradsync.h) is the only interface to the daemon; this
module mirrors its structs and declares every function's argument and
result types so that ctypes converts values correctly (a missing prototype
would silently truncate 64-bit pointers to C ints).

Where the library is looked for, first match wins:
  1. ``$GRADSYNC_LIB`` (a path to the .so): an explicit choice always wins;
  2. ``gradsync/lib/libgradsync.so`` next to this package (a wheel or an
     install that bundles the library);
  3. Bazel's output in the source tree this package lives in
     (``<repo>/bazel-bin/client/libgradsync.so``), so the package works
     straight from a checkout after ``bazel build //client:libgradsync.so``;
  4. ``<sys.prefix>/lib/libgradsync.so`` and the dynamic loader's own search
     (``LD_LIBRARY_PATH``, ldconfig's cache) for system-wide installs.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
from pathlib import Path
from typing import List, Optional

from .errors import LibraryNotFoundError

LIB_ENV = "GRADSYNC_LIB"
LIB_NAME = "libgradsync.so"

_PACKAGE_DIR = Path(__file__).resolve().parent
# client/python/gradsync -> the repository root (three levels up).
REPO_ROOT = _PACKAGE_DIR.parent.parent.parent


class TensorSpecC(ctypes.Structure):
    """``gs_tensor_spec``."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_int),  # gs_dtype: a C enum, int-sized on every ABI we target
        ("numel", ctypes.c_uint64),
        ("device", ctypes.c_int),
        ("cuda_ptr", ctypes.c_void_p),
    ]


class ConnectOptionsC(ctypes.Structure):
    """``gs_connect_options``; ``size`` must be set to ``ctypes.sizeof`` of it
    (what ``GS_CONNECT_OPTIONS_INIT`` does in C)."""

    _fields_ = [
        ("socket_path", ctypes.c_char_p),
        ("local_rank", ctypes.c_int),
        ("timeout_ms", ctypes.c_int),
        ("size", ctypes.c_size_t),
    ]


class JobInfoC(ctypes.Structure):
    """``gs_job_info``; ``size`` must be set to ``ctypes.sizeof`` of it
    (what ``GS_JOB_INFO_INIT`` does in C)."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("iteration", ctypes.c_uint64),
        ("world_size", ctypes.c_int),
        ("rank", ctypes.c_int),
        ("check_replicas_due", ctypes.c_int),
        ("membership_changes", ctypes.c_uint64),
        ("nodes_joined", ctypes.c_uint64),
        ("joined_running_job", ctypes.c_int),
        ("trainers_joined", ctypes.c_uint64),
        ("catch_up_root", ctypes.c_int),
    ]


def candidate_paths() -> List[str]:
    """Where ``find_library`` looks, in order (for error messages and tests)."""
    paths: List[str] = []
    env = os.environ.get(LIB_ENV)
    if env:
        paths.append(env)
    paths.append(str(_PACKAGE_DIR / "lib" / LIB_NAME))
    paths.append(str(REPO_ROOT / "bazel-bin" / "client" / LIB_NAME))
    paths.append(os.path.join(sys.prefix, "lib", LIB_NAME))
    return paths


def find_library() -> str:
    """The path (or loader name) of libgradsync.so; raises LibraryNotFoundError.

    ``$GRADSYNC_LIB`` is authoritative: if it is set but wrong we fail rather
    than silently load some other build.
    """
    env = os.environ.get(LIB_ENV)
    if env:
        if not os.path.isfile(env):
            raise LibraryNotFoundError(
                f"${LIB_ENV} is set to {env!r}, which is not a file")
        return env
    for path in candidate_paths():
        if os.path.isfile(path):
            return path
    found = ctypes.util.find_library("gradsync")
    if found:
        return found
    raise LibraryNotFoundError(
        "cannot find libgradsync.so; looked at " + ", ".join(candidate_paths()) +
        " and the dynamic loader's path. Build it with "
        "`bazel build //client:libgradsync.so` in the gradsync repository, "
        f"or set ${LIB_ENV} to its path")


_lock = threading.Lock()
_cache: dict = {}


def load_library(path: Optional[str] = None) -> ctypes.CDLL:
    """Loads (once per path) the library and declares the C prototypes.

    ctypes.CDLL releases the GIL around every call, which matters: gs_wait
    and gs_register block, and other Python threads must keep running.
    """
    path = path or find_library()
    with _lock:
        lib = _cache.get(path)
        if lib is not None:
            return lib
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise LibraryNotFoundError(f"cannot load {path}: {e}") from e
        _declare(lib)
        _cache[path] = lib
        return lib


def _declare(lib: ctypes.CDLL) -> None:
    c_client_p = ctypes.c_void_p  # gs_client* is opaque: carried as an address
    status = ctypes.c_int
    protos = {
        "gs_connect": (status, [ctypes.POINTER(ConnectOptionsC), ctypes.POINTER(c_client_p)]),
        "gs_register": (status, [c_client_p, ctypes.POINTER(TensorSpecC), ctypes.c_size_t]),
        "gs_world": (status, [c_client_p, ctypes.POINTER(ctypes.c_int),
                              ctypes.POINTER(ctypes.c_int)]),
        "gs_grad_buffer": (ctypes.c_void_p, [c_client_p, ctypes.c_size_t]),
        "gs_mark_ready": (status, [c_client_p, ctypes.c_size_t]),
        "gs_mark_unused": (status, [c_client_p, ctypes.c_size_t]),
        "gs_wait": (status, [c_client_p, ctypes.c_int64]),
        "gs_set_sync": (status, [c_client_p, ctypes.c_int]),
        "gs_join": (status, [c_client_p, ctypes.c_int]),
        "gs_broadcast": (status, [c_client_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                  ctypes.c_int64]),
        "gs_get_job_info": (status, [c_client_p, ctypes.POINTER(JobInfoC)]),
        "gs_check_replicas": (status, [c_client_p, ctypes.POINTER(ctypes.c_uint64),
                                       ctypes.c_size_t]),
        "gs_set_cuda_stream": (status, [c_client_p, ctypes.c_void_p]),
        "gs_iteration_skipped": (ctypes.c_int, [c_client_p]),
        "gs_last_error": (ctypes.c_char_p, [c_client_p]),
        "gs_close": (None, [c_client_p]),
        "gs_version": (ctypes.c_int, []),
    }
    for name, (restype, argtypes) in protos.items():
        try:
            fn = getattr(lib, name)
        except AttributeError as e:
            raise LibraryNotFoundError(
                f"{lib._name} does not export {name}: not a gradsync client library "
                "or an incompatible version") from e
        fn.restype = restype
        fn.argtypes = argtypes
