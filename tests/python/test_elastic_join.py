"""A node joins a running elastic job (gradsyncd --max-nodes above
--num-nodes, the embedded leader) and DistributedOptimizer hands its
trainer the job's state by itself.

Real gradsyncd and real trainer processes: nodes 0 and 1 (one trainer
each, Adam and BatchNorm, every rank seeded differently) train; both wait
before step 2 until node 2's daemon and trainer are in and the leader's
grow entry reached both members. Node 2's trainer starts at the job's
iteration with the members' parameters, buffers and Adam state; every
trainer ends with the same parameters and optimizer state, bit for bit
(buffers are each rank's own after its last forward, as in DDP).
"""
from __future__ import annotations

import os

import torch

import gs_testlib  # noqa: F401  (the forkserver preloads it)
from conftest import listen_port, wait_until

STEPS = 8


def test_a_joining_node_gets_the_state_and_every_replica_ends_equal(gradsyncd, workdir) -> None:
    token = workdir / "token"
    token.write_text("s3cret")
    os.chmod(token, 0o600)
    common = ["--num-nodes=2", "--min-nodes=1", "--max-nodes=3", "--job-id=pyjoin",
              f"--job-token-file={token}"]
    node0 = gradsyncd(1, *common, "--node-rank=0", "--listen=127.0.0.1:0")
    port = listen_port(node0)
    node1 = gradsyncd(1, *common, "--node-rank=1", f"--leader=127.0.0.1:{port}")
    gate = workdir / "gate"
    args = ["--mode=elastic-join", f"--steps={STEPS}", f"--gate-file={gate}", "--gate-step=2"]
    members = [node0.start(0, args), node1.start(0, [*args, "--rank-offset=1"])]
    assert wait_until(lambda: "event=job_running" in node1.daemon.log(), 60), node1.logs()
    node2 = gradsyncd(1, *common, "--node-rank=2", f"--leader=127.0.0.1:{port}")
    joiner = node2.start(0, [*args, "--rank-offset=2"])
    logs = lambda: node0.logs() + node1.logs() + node2.logs()  # noqa: E731
    assert wait_until(lambda: "event=job_grow_published" in node0.daemon.log(), 60), logs()
    for node in (node0, node1):
        assert wait_until(lambda: "event=job_grow_read" in node.daemon.log(), 60), logs()
    gate.write_text("go")
    codes = node0.wait([*members, joiner], 120)
    assert codes == [0, 0, 0], logs()
    results = [t.result() for t in (*members, joiner)]
    start = results[2]["start_iteration"]
    assert results[2]["joined_running_job"], results[2]
    assert 2 < start < STEPS, (start, logs())
    assert [r["rank"] for r in results] == [0, 1, 2]
    for r in results[:2]:
        assert not r["joined_running_job"]
        assert r["nodes_joined"] == 1 and r["membership_changes"] == 1, r
    for r in results:
        assert r["world_size"] == 3, r
    first = results[0]
    for r in results[1:]:
        for name, value in first["final"].items():
            assert torch.equal(value, r["final"][name]), (r["rank"], name)
        for p, state in first["opt_state"]["state"].items():
            for key, value in state.items():
                assert torch.equal(torch.as_tensor(value),
                                   torch.as_tensor(r["opt_state"]["state"][p][key])), \
                    (r["rank"], p, key)


def test_a_restarted_trainer_rejoins_its_node_and_gets_the_state(gradsyncd, workdir) -> None:
    """A trainer restarted on a node that stayed rejoins the running job.

    Node 0 runs rank 0, node 1 ranks 1 and 2 (--min-nodes 1: elastic).
    Rank 2 SIGKILLs itself before step 2 (it marked nothing of it), so the
    job goes on over 2; a replacement with local rank 1 on node 1 registers
    while the others wait before step 2. Iteration 2's agreement announces
    it: it starts at iteration 3 with rank 2 and the state DistributedOptimizer
    hands it after step 2 (from rank 0, the catch-up root), and all three
    end with the same parameters and Adam state, bit for bit.
    """
    token = workdir / "token"
    token.write_text("s3cret")
    os.chmod(token, 0o600)
    common = ["--num-nodes=2", "--min-nodes=1", "--job-id=pyrejoin", f"--job-token-file={token}"]
    node0 = gradsyncd(1, *common, "--node-rank=0", "--listen=127.0.0.1:0")
    port = listen_port(node0)
    node1 = gradsyncd(2, *common, "--node-rank=1", f"--leader=127.0.0.1:{port}")
    gate = workdir / "gate"
    args = ["--mode=elastic-join", f"--steps={STEPS}", f"--gate-file={gate}", "--gate-step=2"]
    members = [node0.start(0, args), node1.start(0, [*args, "--rank-offset=1"])]
    victim = node1.start(1, [*args, "--rank-offset=1", "--die-at=2"])
    logs = lambda: node0.logs() + node1.logs()  # noqa: E731
    assert victim.exit_code(60) == -9, logs()
    assert wait_until(lambda: "event=trainer_departed" in node1.daemon.log(), 60), logs()
    replacement = node1.start(1, [*args, "--rank-offset=1"])
    assert wait_until(lambda: "event=register_rejoining" in node1.daemon.log(), 60), logs()
    gate.write_text("go")
    codes = node0.wait([*members, replacement], 120)
    assert codes == [0, 0, 0], logs()
    results = [t.result() for t in (*members, replacement)]
    joined = results[2]
    assert joined["joined_running_job"] and joined["start_iteration"] == 3, (joined, logs())
    assert joined["catch_up_root"] == 0, joined
    assert [r["rank"] for r in results] == [0, 1, 2]
    for r in results[:2]:
        assert not r["joined_running_job"]
        assert r["trainers_joined"] == 1 and r["nodes_joined"] == 0, r
        assert r["membership_changes"] == 0, r
    for r in results:
        assert r["world_size"] == 3, r
    first = results[0]
    for r in results[1:]:
        for name, value in first["final"].items():
            assert torch.equal(value, r["final"][name]), (r["rank"], name)
        for p, state in first["opt_state"]["state"].items():
            for key, value in state.items():
                assert torch.equal(torch.as_tensor(value),
                                   torch.as_tensor(r["opt_state"]["state"][p][key])), \
                    (r["rank"], p, key)
