"""DistributedOptimizer's view of the job: ``iteration``, ``world_size`` and
``rank`` after every step, and the ``on_world_change`` callback.

Real gradsyncd and real trainer processes. Trainers run out of data at
different steps (gradsync.torch.join): dividing by the active trainers, the
world each remaining trainer sees shrinks and its callback fires exactly
then; dividing by the initial world size it never changes.
"""
from __future__ import annotations

import pytest

import gs_testlib  # noqa: F401  (the forkserver preloads it)

STEPS = [5, 4, 2]  # per rank: steps before it joins


def expected_jobs(rank: int, divide_by_active: bool) -> list:
    world = len(STEPS)
    jobs = [(0, world, rank)]
    for k in range(1, STEPS[rank] + 1):
        active = sum(1 for n in STEPS if n >= k)
        jobs.append((k, active if divide_by_active else world, rank))
    return jobs


@pytest.mark.parametrize("divide_by_active", [False, True])
def test_iteration_world_size_rank_and_callback(gradsyncd, divide_by_active: bool) -> None:
    cluster = gradsyncd(len(STEPS))
    args = ["--model=mlp", "--batch=24", "--join-steps=" + ",".join(str(n) for n in STEPS)]
    if divide_by_active:
        args.append("--join-divide-by-active")
    results = {r["rank"]: r for r in cluster.run(len(STEPS), args)}
    for rank in range(len(STEPS)):
        jobs = expected_jobs(rank, divide_by_active)
        assert results[rank]["jobs"] == jobs, (rank, results[rank]["jobs"])
        # One call per change, after the iteration that changed it.
        changes = [(jobs[i][0], jobs[i - 1][1], jobs[i][1], rank)
                   for i in range(1, len(jobs)) if jobs[i][1] != jobs[i - 1][1]]
        assert results[rank]["world_changes"] == changes, (rank, results[rank]["world_changes"])
        # Trainers that ran out of data shrink the world, not the members.
        assert results[rank]["membership_changes"] == 0, (rank, results[rank])
    if divide_by_active:
        # The test would pass vacuously if nothing changed.
        assert results[0]["world_changes"] == [(3, 3, 2, 0), (5, 2, 1, 0)]


def test_no_sync_iterations_are_not_counted(gradsyncd) -> None:
    cluster = gradsyncd(2)
    results = {r["rank"]: r for r in cluster.run(2, ["--steps=3", "--accumulate=2"])}
    for rank in range(2):
        assert results[rank]["jobs"] == [(i, 2, rank) for i in range(4)]
        assert results[rank]["world_changes"] == []
