"""Failure paths of the torch integration: they end in a clear exception,
never in a hang."""
from __future__ import annotations

import signal
import time

import pytest
import torch

import gradsync
import gradsync.torch as gst
import gs_testlib as lib
from conftest import wait_until

PEER_FAILED_EXIT = 10 + int(gradsync.Status.PEER_FAILED)  # trainer_worker's convention
TIMEOUT_EXIT = 10 + int(gradsync.Status.TIMEOUT)


def wait_for_daemon_log(cluster, text: str, timeout_s: float) -> None:
    """Waits on the daemon's state (a log event) instead of a delay."""
    if not wait_until(lambda: text in cluster.daemon.log(), timeout_s):
        pytest.fail(f"gradsyncd never logged {text!r}\n" + cluster.logs())


def test_no_daemon_raises_at_construction(workdir) -> None:
    model = lib.make_model("mlp", torch.float32)
    sock = str(workdir / "nobody.sock")
    start = time.monotonic()
    with pytest.raises(gradsync.UnavailableError) as e:
        gst.DistributedOptimizer(lib.make_sgd(model), model.named_parameters(),
                                 socket_path=sock, connect_timeout_s=0.5)
    assert time.monotonic() - start < 20
    assert sock in str(e.value) and "is the daemon running" in str(e.value)
    with pytest.raises(gradsync.UnavailableError):
        gst.AllreduceHookState(model, socket_path=sock, connect_timeout_s=0.5)
    # The gradients were left alone.
    assert all(p.grad is None for p in model.parameters())


def test_killed_trainer_makes_the_others_raise(gradsyncd) -> None:
    """3 trainers; trainer 2 stops before step 3 and is SIGKILLed while the
    others wait in step(). They must raise PeerFailedError, long before the
    daemon's timeout (120 s here): the death itself is detected."""
    cluster = gradsyncd(3, "--timeout-s=120", "--stall-threshold-s=1")
    args = ["--model=mlp", "--steps=10", "--hang-at=3", "--hang-rank=2"]
    trainers = [cluster.start(r, args) for r in range(3)]
    trainers[2].wait_for_output("HANG", timeout_s=60)
    # The others are in step 3's wait once the daemon reports the stall.
    wait_for_daemon_log(cluster, "event=stall", timeout_s=60)
    trainers[2].kill()
    start = time.monotonic()
    codes = cluster.wait(trainers[:2], timeout_s=30)
    assert time.monotonic() - start < 30
    assert codes == [PEER_FAILED_EXIT] * 2, cluster.logs()
    for t in trainers[:2]:
        assert "GRADSYNC_ERROR PeerFailedError" in t.log()
        assert "died" in t.log(), t.log()  # the daemon names what happened


def test_killed_daemon_makes_trainers_raise(gradsyncd) -> None:
    cluster = gradsyncd(2, "--timeout-s=120", "--stall-threshold-s=1")
    args = ["--model=mlp", "--steps=10", "--hang-at=3", "--hang-rank=1"]
    trainers = [cluster.start(r, args) for r in range(2)]
    trainers[1].wait_for_output("HANG", timeout_s=60)
    # Trainer 0 is in step 3's wait once the daemon reports the stall.
    wait_for_daemon_log(cluster, "event=stall", timeout_s=60)
    cluster.daemon.process.send_signal(signal.SIGKILL)
    codes = cluster.wait(trainers[:1], timeout_s=30)
    assert codes == [PEER_FAILED_EXIT], cluster.logs()
    assert "GRADSYNC_ERROR PeerFailedError" in trainers[0].log()


def test_wait_timeout_is_an_error(gradsyncd) -> None:
    """A trainer that stops marking: the others' step() raises
    GradsyncTimeoutError after wait_timeout_s."""
    cluster = gradsyncd(2, "--timeout-s=120")
    args = ["--model=mlp", "--steps=10", "--hang-at=2", "--hang-rank=1", "--wait-timeout-s=1"]
    trainers = [cluster.start(r, args) for r in range(2)]
    codes = cluster.wait(trainers[:1], timeout_s=60)
    assert codes == [TIMEOUT_EXIT], cluster.logs()
    assert "GRADSYNC_ERROR GradsyncTimeoutError" in trainers[0].log()
    assert "other trainers have not marked" in trainers[0].log()


def test_marking_twice_without_no_sync_is_explained(gradsyncd) -> None:
    """Two backward passes in one iteration outside no_sync(): a clear error
    from backward(), not a hang or silent double counting."""
    cluster = gradsyncd(1)
    torch.set_num_threads(1)
    model = lib.make_model("mlp", torch.float32)
    opt = gst.DistributedOptimizer(lib.make_sgd(model), model.named_parameters(),
                                   socket_path=cluster.socket, local_rank=0,
                                   connect_timeout_s=10, wait_timeout_s=10)
    try:
        x, y = lib.batch(0, 0, 4, torch.float32)
        torch.nn.functional.mse_loss(model(x, 0), y).backward()
        with pytest.raises(gradsync.StateError, match="backward_passes_per_step"):
            torch.nn.functional.mse_loss(model(x, 0), y).backward()
    finally:
        opt.close()
    # After close() the gradients are private tensors, still usable.
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
