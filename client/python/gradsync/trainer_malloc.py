"""The heap settings ``gradsync.run`` gives CPU trainers: keep freed memory.

A training step allocates and frees the same large temporaries every time
(autograd's gradient of a Linear is a fresh 16 MB tensor, added into the
registered gradient and freed). glibc's malloc, by default, serves blocks
this large with a fresh ``mmap`` or gives the top of its heap back to the
kernel once enough is free (a threshold that adapts up to 32 MiB, and
trims at twice that). Either way the next step faults the same memory in
again, page by page: 1,300 to 3,000 page faults per step for the 25.2M MLP
of tests/bench/torch_step_bench.py, 6 to 24 ms of kernel time per trainer
on the 2-core VM where a fault cost 14-17 us. How many faults a step takes
depends on where the trim threshold happens to sit, so it differs from
step to step and from process to process; in a synchronized job every
step waits for the slowest trainer, so that jitter costs far more than
in one process alone (docs/PERFORMANCE.md, "The training step and the
trainers' heap").

``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` (glibc's own
environment settings) make every step reuse the memory the previous step
freed: blocks under 1 GiB come from the heap, and the heap is trimmed only
past 4 GiB free. The cost: a trainer's resident memory stays at its
high-water mark, as with jemalloc or tcmalloc, which PyTorch's CPU tuning
guide recommends for the same reason.

Both are set or neither: setting one of them alone switches off glibc's
adaptive threshold and leaves the other at its small static default,
which faulted 10x more in the measurement above. Nothing is set where the
user already chose (either variable, a ``glibc.malloc`` tunable, or
another allocator in ``LD_PRELOAD``) or opted out
(``GRADSYNC_GLIBC_MALLOC_DEFAULTS=1``, what ``--glibc-malloc-defaults``
sets).

Trainers that another launcher starts (torchrun, a scheduler's own) get
the same settings when they connect (``gradsync.Client``): glibc's
``mallopt`` sets the same two thresholds at run time, the trim threshold
capped at 2 GiB (``mallopt`` takes an int). Memory freed before that
point is not affected; every step after it is.
"""
from __future__ import annotations

import ctypes
import os
from typing import Dict, Mapping, Optional

MMAP_THRESHOLD_BYTES = 1 << 30
TRIM_THRESHOLD_BYTES = 4 << 30

# mallopt's value is an int: the largest trim threshold it can set.
MALLOPT_TRIM_THRESHOLD_BYTES = (1 << 31) - 1

OPT_OUT_VARIABLE = "GRADSYNC_GLIBC_MALLOC_DEFAULTS"

_PRELOADED_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")

# glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def user_chose_allocator(env: Mapping[str, str]) -> bool:
    """True when ``env`` already configures malloc (glibc's or another) or
    asks for glibc's defaults."""
    if env.get(OPT_OUT_VARIABLE, "") not in ("", "0"):
        return True
    if "MALLOC_MMAP_THRESHOLD_" in env or "MALLOC_TRIM_THRESHOLD_" in env:
        return True
    if "glibc.malloc." in env.get("GLIBC_TUNABLES", ""):
        return True
    preload = env.get("LD_PRELOAD", "")
    return any(name in preload for name in _PRELOADED_ALLOCATORS)


def steady_heap_env(env: Mapping[str, str]) -> Dict[str, str]:
    """The variables to add to a trainer's ``env`` (empty if the user chose)."""
    if user_chose_allocator(env):
        return {}
    return {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD_BYTES),
            "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD_BYTES)}


def opt_out_env() -> Dict[str, str]:
    """What a launcher adds to a trainer's environment to keep glibc's defaults."""
    return {OPT_OUT_VARIABLE: "1"}


def _glibc_mallopt() -> Optional[ctypes._CFuncPtr]:
    """glibc's mallopt in this process, or None under another C library."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # pylint: disable=pointless-statement
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt


def keep_freed_memory_in_process(env: Optional[Mapping[str, str]] = None) -> bool:
    """Gives this process the steady heap at run time (for trainers no
    ``gradsync.run`` started). Returns whether it did: not where the user
    chose (see ``user_chose_allocator``), not under another C library."""
    if user_chose_allocator(os.environ if env is None else env):
        return False
    mallopt = _glibc_mallopt()
    if mallopt is None:
        return False
    # The mmap threshold first: set alone, the trim threshold would keep
    # glibc's adaptive mmap threshold, which sends large blocks to mmap.
    if mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) != 1:
        return False
    return mallopt(_M_TRIM_THRESHOLD, MALLOPT_TRIM_THRESHOLD_BYTES) == 1
