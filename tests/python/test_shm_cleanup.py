"""The gradsyncd fixture's teardown leaves nothing in /dev/shm under the
test's prefix, even after a SIGKILLed daemon and trainers (no later daemon
sweeps a test's private prefix): a real daemon, trainers and shared memory."""
import signal
from pathlib import Path

from conftest import Cluster, shm_entries, wait_until


def test_a_sigkilled_daemon_and_its_trainers_leave_no_segment_after_close(workdir: Path) -> None:
    cluster = Cluster(workdir, 2, [])
    try:
        hung = cluster.start(0, ["--hang-at=2", "--hang-rank=0"])
        cluster.start(1, ["--hang-at=2", "--hang-rank=0"])
        hung.wait_for_output("HANG", 60)
        cluster.daemon.process.send_signal(signal.SIGKILL)
        cluster.daemon.process.wait(30)
        cluster.kill_trainers()
        # The kills left the node segment, one per trainer and the
        # broadcast's staging segment behind...
        left = shm_entries(cluster.shm_prefix)
        assert len(left) >= 3, left
    finally:
        cluster.close()
    # ...and closing the cluster removed every one of them.
    assert shm_entries(cluster.shm_prefix) == []


def test_close_keeps_the_segments_of_a_cluster_whose_prefix_extends_its_own(
        workdir: Path) -> None:
    killed = Cluster(workdir, 1, [])
    live = Cluster(workdir, 1, [f"--shm-prefix={killed.shm_prefix}0"])
    live_prefix = live.shm_prefix
    try:
        assert wait_until(lambda: len(shm_entries(live_prefix)) == 1, 10), shm_entries(live_prefix)
        before = shm_entries(live_prefix)
        killed.daemon.process.send_signal(signal.SIGKILL)
        killed.daemon.process.wait(30)
        assert len(shm_entries(killed.shm_prefix)) == 1  # its node segment, left by the kill
        killed.close()
        assert shm_entries(killed.shm_prefix) == []
        assert shm_entries(live_prefix) == before
        assert live.daemon.running()
    finally:
        live.close()
        killed.close()
    assert shm_entries(live_prefix) == []
