"""Exceptions raised by the gradsync Python client.

Every non-OK ``gs_status`` returned by ``libgradsync`` becomes an exception
carrying the daemon's own message (``gs_last_error``), so a Python trainer
sees *why* an iteration failed (which peer died, which tensor was never
marked, which layout entry differs) instead of a bare error code.

The classes also derive from the closest built-in exception where one
exists (``ValueError``, ``ConnectionError``, ``TimeoutError``), so generic
``except TimeoutError`` code keeps working.
"""
from __future__ import annotations

import enum
from typing import Optional

__all__ = [
    "Status",
    "GradsyncError",
    "InvalidArgumentError",
    "UnavailableError",
    "MismatchError",
    "PeerFailedError",
    "GradsyncTimeoutError",
    "StateError",
    "InternalError",
    "ResourceExhaustedError",
    "LibraryNotFoundError",
    "error_for_status",
]


class Status(enum.IntEnum):
    """``gs_status`` from client/gradsync.h (same numbers as gradsync.v1.Code)."""

    OK = 0
    INVALID_ARGUMENT = 1
    UNAVAILABLE = 2
    MISMATCH = 3
    PEER_FAILED = 4
    TIMEOUT = 5
    STATE = 6
    INTERNAL = 7
    RESOURCE_EXHAUSTED = 8


class GradsyncError(RuntimeError):
    """Base class of every gradsync failure.

    Attributes:
        status: the ``Status`` the C ABI returned (None for errors raised by
            the Python layer itself, e.g. a missing library).
        message: the daemon's / client library's message.
        operation: the C function (or Python operation) that failed.
    """

    status: Optional[Status] = None

    def __init__(self, message: str, *, status: Optional[Status] = None,
                 operation: str = "") -> None:
        self.message = message
        self.operation = operation
        if status is not None:
            self.status = status
        prefix = f"{operation}: " if operation else ""
        code = f" [{self.status.name}]" if self.status is not None else ""
        super().__init__(f"{prefix}{message}{code}")


class InvalidArgumentError(GradsyncError, ValueError):
    """A bad argument or layout (bad index, tensor marked twice, bad dtype)."""

    status = Status.INVALID_ARGUMENT


class UnavailableError(GradsyncError, ConnectionError):
    """The daemon cannot be reached (not running, wrong socket)."""

    status = Status.UNAVAILABLE


class MismatchError(GradsyncError):
    """Trainers or nodes registered different gradient layouts."""

    status = Status.MISMATCH


class PeerFailedError(GradsyncError):
    """Another trainer, the daemon or another node failed: the job is over."""

    status = Status.PEER_FAILED


class GradsyncTimeoutError(GradsyncError, TimeoutError):
    """A wait passed its deadline; the message names what was missing."""

    status = Status.TIMEOUT


class StateError(GradsyncError):
    """The call is not valid now (e.g. mark before register, client closed)."""

    status = Status.STATE


class InternalError(GradsyncError):
    """A bug or a corrupted shared-memory segment."""

    status = Status.INTERNAL


class ResourceExhaustedError(GradsyncError):
    """The node ran short of something (room in /dev/shm, file descriptors):
    free it or ask for less, then retry."""

    status = Status.RESOURCE_EXHAUSTED


class LibraryNotFoundError(GradsyncError, OSError):
    """libgradsync.so could not be found or loaded."""


_BY_STATUS = {
    Status.INVALID_ARGUMENT: InvalidArgumentError,
    Status.UNAVAILABLE: UnavailableError,
    Status.MISMATCH: MismatchError,
    Status.PEER_FAILED: PeerFailedError,
    Status.TIMEOUT: GradsyncTimeoutError,
    Status.STATE: StateError,
    Status.INTERNAL: InternalError,
    Status.RESOURCE_EXHAUSTED: ResourceExhaustedError,
}


def error_for_status(code: int, message: str, operation: str = "") -> GradsyncError:
    """The exception for a non-OK ``gs_status`` code (unknown codes -> InternalError)."""
    try:
        status = Status(code)
    except ValueError:
        return InternalError(f"unknown gs_status {code}: {message}", operation=operation)
    cls = _BY_STATUS.get(status, InternalError)
    return cls(message or f"gradsync call failed with {status.name}", status=status,
               operation=operation)
