"""gradsync.trainer_malloc: the heap settings gradsync.run gives trainers
make a freed large block come back without page faults, in a real process
with this machine's glibc (a step frees and reallocates the same 16 MB
gradient temporaries; each fault cost 14-17 us on the 2-core VM)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List

from conftest import PY_PACKAGE
from gradsync import trainer_malloc

# Allocates, touches and frees argv[1] MiB twice (glibc adapts its
# thresholds on the first free), then once more and prints that round's
# page faults. argv[2], if given, first sets the heap up in the process:
# "mallopt" (keep_freed_memory_in_process) or a daemon socket to connect a
# gradsync.Client to (local rank 0), as a trainer torchrun started would.
REALLOCATE = textwrap.dedent('''
    import ctypes, resource, sys
    if len(sys.argv) > 2 and sys.argv[2] == "mallopt":
        from gradsync import trainer_malloc
        print("applied" if trainer_malloc.keep_freed_memory_in_process() else "skipped")
    elif len(sys.argv) > 2:
        import gradsync
        client = gradsync.Client(sys.argv[2], local_rank=0)
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    size = int(sys.argv[1]) << 20
    def touch_and_free():
        p = libc.malloc(size)
        ctypes.memset(p, 1, size)
        libc.free(p)
    touch_and_free()
    touch_and_free()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    touch_and_free()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
''')


def pages(mib: int) -> int:
    return (mib << 20) // 4096


def run_reallocate(env: Dict[str, str], mib: int, *setup: str) -> List[str]:
    out = subprocess.run([sys.executable, "-c", REALLOCATE, str(mib), *setup], env=env,
                         check=True, capture_output=True, text=True, timeout=60).stdout
    return out.split()


def last_round_faults(env: Dict[str, str], mib: int, *setup: str) -> int:
    return int(run_reallocate(env, mib, *setup)[-1])


def clean_env() -> Dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(PY_PACKAGE))
    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES",
                 "LD_PRELOAD"):
        env.pop(name, None)
    return env


def test_a_freed_block_comes_back_without_faults() -> None:
    env = clean_env()
    # glibc's defaults: a 64 MiB block (past the largest adaptive mmap
    # threshold, 32 MiB) is mapped afresh, every page faults again.
    assert last_round_faults(env, 64) >= pages(64)
    env.update(trainer_malloc.steady_heap_env(env))
    assert last_round_faults(env, 64) < pages(64) // 100


def test_one_variable_alone_is_worse_than_none() -> None:
    """Why both are set or neither: glibc's defaults reuse a freed 16 MiB
    block (the adaptive threshold rose to it), but the trim threshold alone
    switches that adaptation off, so the block is mapped afresh each time."""
    env = clean_env()
    assert last_round_faults(env, 16) < pages(16) // 100
    env["MALLOC_TRIM_THRESHOLD_"] = str(4 << 30)
    assert last_round_faults(env, 16) >= pages(16)


def test_the_users_choice_stands() -> None:
    assert trainer_malloc.steady_heap_env({}) == {
        "MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(4 << 30)}
    for env in ({"MALLOC_MMAP_THRESHOLD_": "1"}, {"MALLOC_TRIM_THRESHOLD_": "1"},
                {"GLIBC_TUNABLES": "glibc.rtld.nns=2:glibc.malloc.trim_threshold=1"},
                {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}):
        assert trainer_malloc.steady_heap_env(env) == {}, env
    assert trainer_malloc.steady_heap_env({"GLIBC_TUNABLES": "glibc.rtld.nns=2"}) != {}
    assert trainer_malloc.steady_heap_env({"GRADSYNC_GLIBC_MALLOC_DEFAULTS": "1"}) == {}
    assert trainer_malloc.steady_heap_env({"GRADSYNC_GLIBC_MALLOC_DEFAULTS": "0"}) != {}


def test_mallopt_gives_a_process_started_without_the_variables_the_steady_heap() -> None:
    env = clean_env()
    applied, faults = run_reallocate(env, 64, "mallopt")
    assert applied == "applied"
    assert int(faults) < pages(64) // 100
    # The user's choice stands: opted out, glibc's defaults map it afresh.
    env.update(trainer_malloc.opt_out_env())
    applied, faults = run_reallocate(env, 64, "mallopt")
    assert applied == "skipped"
    assert int(faults) >= pages(64)


def test_a_trainer_another_launcher_started_gets_the_steady_heap_when_it_connects(
        workdir: Path, gradsyncd) -> None:
    env = clean_env()
    assert last_round_faults(env, 64, gradsyncd(1).socket) < pages(64) // 100
    env.update(trainer_malloc.opt_out_env())
    assert last_round_faults(env, 64, gradsyncd(1).socket) >= pages(64)
