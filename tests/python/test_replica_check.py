"""gradsyncd ``--check-replicas-every``: DistributedOptimizer hashes its
parameters after the steps the daemon checks, and a replica that drifted is
named instead of trained on.

Real gradsyncd and real trainer processes: equal replicas pass every check
(the daemon logs each); one trainer that perturbs fc2.weight after step 3
makes the check after iteration 4 fail every trainer with MismatchError
naming the tensor and both trainers.
"""
from __future__ import annotations

import gs_testlib  # noqa: F401  (the forkserver preloads it)

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
