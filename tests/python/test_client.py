"""gradsync.Client (the ctypes layer) against a real daemon.

Two trainers as two threads of this process, each with its own Client and
local rank: the blocking calls release the GIL, so they run concurrently.
"""
from __future__ import annotations

import threading
from typing import Callable, List

import numpy as np
import pytest
import torch

import gradsync
from gradsync import DType, TensorSpec


def run_ranks(fn: Callable[[int], object], n: int, timeout_s: float = 30) -> List[object]:
    """Runs fn(rank) in n threads; returns results or the exceptions raised."""
    results: List[object] = [None] * n

    def body(rank: int) -> None:
        try:
            results[rank] = fn(rank)
        except BaseException as e:  # handed to the test
            results[rank] = e

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
        assert not t.is_alive(), "a rank thread hung"
    return results


def raise_errors(results: List[object]) -> List[object]:
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


LAYOUT = [TensorSpec("w32", DType.FLOAT32, 1000), TensorSpec("w64", DType.FLOAT64, 1),
          ("w16", "float16", 33), ("wbf16", "bfloat16", 7)]
TORCH_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def test_average_every_dtype_and_unused(gradsyncd) -> None:
    cluster = gradsyncd(2)

    def rank_main(rank: int) -> list:
        with gradsync.Client(cluster.socket, rank, connect_timeout_s=10) as c:
            c.register(LAYOUT)
            assert (c.rank, c.world_size, c.num_tensors) == (rank, 2, 4)
            views = [torch.frombuffer(c.buffer(i), dtype=dt) for i, dt in enumerate(TORCH_DTYPES)]
            assert [v.numel() for v in views] == [1000, 1, 33, 7]
            seen = []
            for it in range(3):
                for i, v in enumerate(views):
                    v.fill_(float(4 * rank + it + i))
                for i in reversed(range(4)):
                    if it == 2 and rank == 1 and i == 0:
                        c.mark_unused(i)  # contributes zeros
                    else:
                        c.mark_ready(i)
                c.wait(timeout_s=10)
                seen.append([v.double().tolist() for v in views])
            return seen

    a, b = raise_errors(run_ranks(rank_main, 2))
    assert a == b  # both trainers hold the same average
    for it in range(3):
        for i in range(4):
            mine, other = float(it + i), float(4 + it + i)
            want = mine / 2 if (it == 2 and i == 0) else (mine + other) / 2
            assert a[it][i] == [want] * len(a[it][i]), (it, i)


def test_set_sync_false_accumulates(gradsyncd) -> None:
    cluster = gradsyncd(2)

    def rank_main(rank: int) -> list:
        with gradsync.Client(cluster.socket, rank, connect_timeout_s=10) as c:
            c.register([("g", "float64", 5)])
            g = np.frombuffer(c.buffer(0), dtype=np.float64)
            g[:] = 0
            c.set_sync(False)
            for micro in range(3):  # posts nothing: no peer needed
                g += rank + 1
                c.mark_ready(0)
                c.wait(timeout_s=5)
            c.set_sync(True)
            g += 10 * (rank + 1)
            c.mark_ready(0)
            c.wait(timeout_s=10)
            return g.tolist()

    a, b = raise_errors(run_ranks(rank_main, 2))
    assert a == b == [(13 + 26) / 2] * 5


def test_errors_carry_the_daemons_message(gradsyncd) -> None:
    cluster = gradsyncd(2, "--timeout-s=5")
    timed_out = threading.Barrier(2, timeout=20)  # rank 1 closes only after that

    def rank_main(rank: int) -> list:
        errors = []
        c = gradsync.Client(cluster.socket, rank, connect_timeout_s=10)
        with pytest.raises(gradsync.StateError):
            c.mark_ready(0)  # before register
        c.register([("first", "float32", 3), ("second", "float32", 3)])
        with pytest.raises(gradsync.InvalidArgumentError, match="out of range") as e:
            c.mark_ready(5)
        assert isinstance(e.value, ValueError)
        assert e.value.status is gradsync.Status.INVALID_ARGUMENT
        c.mark_ready(0)
        with pytest.raises(gradsync.InvalidArgumentError, match="'first' is already marked"):
            c.mark_ready(0)
        with pytest.raises(gradsync.StateError, match="between iterations"):
            c.set_sync(False)
        if rank == 0:
            # Rank 0 never marks "second": its wait times out, naming it.
            with pytest.raises(gradsync.GradsyncTimeoutError, match="not marked second") as t:
                c.wait(timeout_s=0.3)
            assert isinstance(t.value, TimeoutError)
            errors.append(str(t.value))
        timed_out.wait()
        c.close()
        c.close()  # idempotent
        with pytest.raises(gradsync.StateError, match="closed"):
            c.wait()
        return errors

    raise_errors(run_ranks(rank_main, 2))


def test_mismatched_layouts_raise_mismatch(gradsyncd) -> None:
    cluster = gradsyncd(2)

    def rank_main(rank: int) -> object:
        with gradsync.Client(cluster.socket, rank, connect_timeout_s=10) as c:
            c.register([("a", "float32", 4), ("b", "float32", 4 + rank)])

    results = run_ranks(rank_main, 2)
    for r in results:
        assert isinstance(r, gradsync.MismatchError), r
        assert "layout mismatch" in str(r) and "b" in str(r)


def test_resource_exhausted_has_its_own_status_and_exception() -> None:
    # GS_ERR_RESOURCE_EXHAUSTED (a /dev/shm too small for the job, a daemon
    # out of file descriptors): a code the caller can act on, not INTERNAL.
    e = gradsync.errors.error_for_status(8, "segment gs.1.j1.r0 needs 10 bytes", "gs_register")
    assert isinstance(e, gradsync.ResourceExhaustedError)
    assert e.status is gradsync.Status.RESOURCE_EXHAUSTED
    assert "segment gs.1.j1.r0 needs 10 bytes" in str(e) and "[RESOURCE_EXHAUSTED]" in str(e)


def test_no_daemon_is_a_clear_error(workdir) -> None:
    missing = str(workdir / "nobody.sock")
    with pytest.raises(gradsync.UnavailableError) as e:
        gradsync.Client(missing, 0, connect_timeout_s=0.5)
    assert missing in str(e.value) and "is the daemon running" in str(e.value)
    assert isinstance(e.value, ConnectionError)


def test_library_lookup(monkeypatch, workdir) -> None:
    from gradsync import _lib
    monkeypatch.setenv("GRADSYNC_LIB", str(workdir / "missing.so"))
    with pytest.raises(gradsync.LibraryNotFoundError, match="GRADSYNC_LIB"):
        gradsync.find_library()
    monkeypatch.delenv("GRADSYNC_LIB")
    # From a checkout: Bazel's output next to the package.
    assert gradsync.find_library() == str(_lib.REPO_ROOT / "bazel-bin/client/libgradsync.so")


def test_dtype_parsing() -> None:
    assert DType.parse("bf16") is DType.BFLOAT16 and DType.parse("torch.float64") is DType.FLOAT64
    assert TensorSpec("x", DType.FLOAT16, 3).nbytes == 6
    with pytest.raises(gradsync.InvalidArgumentError):
        DType.parse("int8")


# Regressions: Client::MarkUnused used to zero the buffer before validating
# the call, and to wipe gradients accumulated in no_sync iterations.

def test_rejected_mark_unused_leaves_the_gradient_alone(gradsyncd) -> None:
    cluster = gradsyncd(2)
    marked = threading.Barrier(2, timeout=10)

    def rank_main(rank: int) -> list:
        with gradsync.Client(cluster.socket, rank, connect_timeout_s=10) as c:
            c.register([("g", "float32", 4)])
            g = np.frombuffer(c.buffer(0), dtype=np.float32)
            if rank == 0:
                g[:] = 1
                c.mark_ready(0)
                with pytest.raises(gradsync.InvalidArgumentError, match="already marked"):
                    c.mark_unused(0)
                marked.wait()
            else:
                marked.wait()  # rank 0's bad call happened before the reduction
                g[:] = 3
                c.mark_ready(0)
            c.wait(timeout_s=10)
            result = g.tolist()
            marked.wait()
            return result

    a, b = raise_errors(run_ranks(rank_main, 2))
    assert a == b == [2.0] * 4  # (1 + 3) / 2; the bug gives (0 + 3) / 2


def test_mark_unused_while_accumulating_keeps_the_accumulation(gradsyncd) -> None:
    cluster = gradsyncd(2)
    done = threading.Barrier(2, timeout=10)

    def rank_main(rank: int) -> list:
        with gradsync.Client(cluster.socket, rank, connect_timeout_s=10) as c:
            c.register([("g", "float32", 2)])
            g = np.frombuffer(c.buffer(0), dtype=np.float32)
            g[:] = 0
            c.set_sync(False)
            g += 4
            c.mark_ready(0)
            c.wait(timeout_s=5)  # micro-batch 1: gradient 4
            c.mark_unused(0)
            c.wait(timeout_s=5)  # micro-batch 2: no gradient
            c.set_sync(True)
            g += 2
            c.mark_ready(0)
            c.wait(timeout_s=10)  # synced: reduces the accumulation
            result = g.tolist()
            done.wait()
            return result

    a, b = raise_errors(run_ranks(rank_main, 2))
    assert a == b == [6.0] * 2  # 4 + 0 + 2 on both trainers; the bug gives 2
