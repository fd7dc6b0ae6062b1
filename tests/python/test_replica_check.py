"""gradsyncd ``--check-replicas-every``: DistributedOptimizer hashes its
parameters after the steps the daemon checks, and a replica that drifted is
named instead of trained on.

Real gradsyncd and real trainer processes: equal replicas pass every check
(the daemon logs each); one trainer that perturbs fc2.weight after step 3
makes the check after iteration 4 fail every trainer with MismatchError
naming the tensor and both trainers; the same across two nodes.
"""
from __future__ import annotations

import os
import re

import gs_testlib  # noqa: F401  (the forkserver preloads it)
from conftest import listen_port

MISMATCH_EXIT = 10 + 3  # trainer_worker: 10 + gs_status


def test_equal_replicas_pass_every_check(gradsyncd) -> None:
    cluster = gradsyncd(2, "--check-replicas-every=2")
    cluster.run(2, ["--model=mlp", "--steps=6"])
    assert cluster.daemon.log().count("event=replicas_equal") == 3, cluster.logs()


def test_drifted_replica_is_named(gradsyncd) -> None:
    cluster = gradsyncd(2, "--check-replicas-every=2")
    trainers = [cluster.start(r, ["--model=mlp", "--steps=8", "--drift-rank=1",
                                  "--drift-at=3"]) for r in range(2)]
    codes = cluster.wait(trainers, 90)
    assert codes == [MISMATCH_EXIT, MISMATCH_EXIT], cluster.logs()
    for t in trainers:
        log = t.log()
        assert "GRADSYNC_ERROR MismatchError" in log, log
        assert "replicas differ after iteration 4: tensor 'fc2.weight'" in log, log
        assert "rank 0 (local 0, pid" in log and "rank 1 (local 1, pid" in log, log
    assert cluster.daemon.log().count("event=replicas_equal") == 1, cluster.logs()


def _two_nodes(gradsyncd, workdir, job_id: str):
    token = workdir / "token"
    token.write_text("s3cret")
    os.chmod(token, 0o600)
    common = ["--num-nodes=2", f"--job-id={job_id}", f"--job-token-file={token}",
              "--check-replicas-every=2"]
    node0 = gradsyncd(2, *common, "--node-rank=0", "--listen=127.0.0.1:0")
    port = listen_port(node0)
    node1 = gradsyncd(2, *common, "--node-rank=1", f"--leader=127.0.0.1:{port}")
    return node0, node1


def _start(node0, node1, args):
    return ([node0.start(r, args) for r in range(2)]
            + [node1.start(r, [*args, "--rank-offset=2"]) for r in range(2)])


def test_equal_replicas_pass_every_check_across_two_nodes(gradsyncd, workdir) -> None:
    node0, node1 = _two_nodes(gradsyncd, workdir, "pycheck")
    trainers = _start(node0, node1, ["--model=mlp", "--steps=6"])
    assert node0.wait(trainers, 90) == [0, 0, 0, 0], node0.logs() + node1.logs()
    for node in (node0, node1):
        assert node.daemon.log().count("event=replicas_equal") == 3, node.logs()
        assert node.daemon.log().count("nodes=2") >= 3, node.logs()


def test_replica_drifted_on_node_1_is_named_on_both_nodes(gradsyncd, workdir) -> None:
    node0, node1 = _two_nodes(gradsyncd, workdir, "pydrift")
    trainers = _start(node0, node1, ["--model=mlp", "--steps=8", "--drift-rank=3",
                                     "--drift-at=3"])
    codes = node0.wait(trainers, 90)
    assert codes == [MISMATCH_EXIT] * 4, node0.logs() + node1.logs()
    for t in trainers:
        log = t.log()
        assert "GRADSYNC_ERROR MismatchError" in log, log
        assert "replicas differ after iteration 4: tensor 'fc2.weight'" in log, log
        assert re.search(r"on rank 0 \(local 0, pid \d+\) on node 0 but 0x[0-9a-f]+ on "
                         r"rank 3 \(local 1, pid \d+\) on node 1;", log), log
