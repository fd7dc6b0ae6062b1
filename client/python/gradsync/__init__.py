"""gradsync: Python client of the gradsync gradient-synchronization daemon.

- ``gradsync.Client``: a thin ctypes layer over the C ABI (client/gradsync.h).
- ``gradsync.torch``: ``DistributedOptimizer`` (Horovod-style, zero copy on
  CPU) and ``allreduce_hook`` (a DDP communication hook). Imported on demand
  so that this package works without torch.
- ``python3 -m gradsync.run --nproc N SCRIPT ARGS``: the launcher.

See docs/DESIGN.md in the repository for the daemon's design.
"""
from __future__ import annotations

from ._lib import find_library, load_library
from .client import Client, DType, JobInfo, TensorSpec
from .errors import (
    GradsyncError,
    GradsyncTimeoutError,
    InternalError,
    InvalidArgumentError,
    LibraryNotFoundError,
    MismatchError,
    PeerFailedError,
    ResourceExhaustedError,
    StateError,
    Status,
    UnavailableError,
)

__version__ = "0.1.0"

__all__ = [
    "Client",
    "DType",
    "JobInfo",
    "TensorSpec",
    "Status",
    "GradsyncError",
    "InvalidArgumentError",
    "UnavailableError",
    "MismatchError",
    "PeerFailedError",
    "ResourceExhaustedError",
    "GradsyncTimeoutError",
    "StateError",
    "InternalError",
    "LibraryNotFoundError",
    "find_library",
    "load_library",
]
