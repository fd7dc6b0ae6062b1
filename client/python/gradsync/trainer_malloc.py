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
another allocator in ``LD_PRELOAD``).
"""
from __future__ import annotations

from typing import Dict, Mapping

MMAP_THRESHOLD_BYTES = 1 << 30
TRIM_THRESHOLD_BYTES = 4 << 30

_PRELOADED_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")


def user_chose_allocator(env: Mapping[str, str]) -> bool:
    """True when ``env`` already configures malloc (glibc's or another)."""
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
