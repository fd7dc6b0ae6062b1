"""Replicas that start equal and stay equal (gradsync.torch's broadcasts),
with a real gradsyncd and two real trainer processes.

- Unseeded replicas (a different seed per rank) under DistributedOptimizer
  end where plain DDP ends, parameters and BatchNorm buffers, rank by rank:
  the constructor broadcasts rank 0's parameters and buffers as DDP's does,
  and broadcast_buffers=True re-broadcasts the buffers before each
  synchronized forward as DDP does; on one node (2 trainers) and across
  two nodes of two trainers each.
- broadcast_buffers gives every forward rank 0's buffers of every kind
  (dtypes, a 0-dim counter, empty and non-contiguous ones), step after step.
- broadcast_optimizer_state after a checkpoint loaded on rank 0 only makes
  Adam's state (moments, step, learning rate) equal everywhere, and the
  next steps equal on every rank.
"""
from __future__ import annotations

import os

import torch

from conftest import listen_port

STEPS = 6


def _max_diff(a: dict, b: dict, k: str) -> float:
    return (a[k].double() - b[k].double()).abs().max().item()


def _check_replicas(results: list) -> None:
    a, b = (results[i]["initial"] for i in (0, 1))
    assert not torch.equal(a["fc1.weight"], b["fc1.weight"])  # they started apart
    for r in results:
        plain, ours = r["plain"], r["gradsync"]
        assert set(plain) == set(ours)
        for k in plain:
            # Parameters and buffers (bn.running_mean/var, num_batches_tracked).
            assert torch.allclose(ours[k].double(), plain[k].double(), rtol=1e-5, atol=1e-6), (
                f"rank {r['rank']}: {k}: max |diff| {_max_diff(ours, plain, k):.3g}")
    first = results[0]["gradsync"]
    for r in results[1:]:
        for k in first:
            if "running" not in k and "num_batches" not in k:
                assert torch.equal(first[k], r["gradsync"][k]), (r["rank"], k)


def test_unseeded_replicas_end_equal_to_plain_ddp(gradsyncd, workdir) -> None:
    cluster = gradsyncd(2)
    _check_replicas(cluster.run(2, ["--mode=replicas", f"--steps={STEPS}", "--world=2",
                                    f"--store={workdir / 'store'}"]))


def test_unseeded_replicas_across_two_nodes_end_equal_to_plain_ddp(gradsyncd, workdir) -> None:
    """Two daemons (nodes), two trainers each: rank 0's state reaches node 1
    through the daemons' cross-node broadcast."""
    token = workdir / "token"
    token.write_text("s3cret")
    os.chmod(token, 0o600)
    common = ["--num-nodes=2", "--job-id=pyreplicas", f"--job-token-file={token}"]
    node0 = gradsyncd(2, *common, "--node-rank=0", "--listen=127.0.0.1:0")
    port = listen_port(node0)
    node1 = gradsyncd(2, *common, "--node-rank=1", f"--leader=127.0.0.1:{port}")
    args = ["--mode=replicas", f"--steps={STEPS}", "--world=4", f"--store={workdir / 'store'}"]
    trainers = [node0.start(r, args) for r in range(2)]
    trainers += [node1.start(r, [*args, "--rank-offset=2"]) for r in range(2)]
    codes = node0.wait(trainers, timeout_s=120)
    assert codes == [0, 0, 0, 0], node0.logs() + node1.logs()
    results = [t.result() for t in trainers]
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    _check_replicas(results)


def test_broadcast_buffers_gives_every_forward_rank_0s_buffers_of_every_dtype(gradsyncd) -> None:
    """The packed buffer laid out once (several dtypes, a 0-dim counter, an
    empty and a non-contiguous buffer): each rank overwrites its buffers with
    values of its own before every forward, and every forward sees rank 0's,
    step after step (back-to-back one-call broadcasts through the daemon's
    alternating staging slots)."""
    results = gradsyncd(2).run(2, ["--mode=buffers", "--steps=8"])
    by_rank = {r["rank"]: r for r in results}
    root = by_rank[0]
    for step in range(8):
        assert any(not torch.equal(root["set"][step][k], by_rank[1]["set"][step][k])
                   for k in root["set"][step]), step  # the ranks set different values
        for r in results:
            seen = r["seen"][step]
            for k, want in root["set"][step].items():
                assert seen[k].dtype == want.dtype and torch.equal(seen[k], want), (
                    r["rank"], step, k)


def test_broadcast_optimizer_state_after_a_checkpoint_on_rank_0_only(gradsyncd, workdir) -> None:
    cluster = gradsyncd(2)
    results = cluster.run(2, ["--mode=optimizer-state", "--steps=3"])
    for r in results:
        want = r["checkpoint"]["opt"]
        got = r["after_broadcast"]
        assert got["param_groups"] == want["param_groups"], r["rank"]
        assert set(got["state"]) == set(want["state"]) and want["state"], r["rank"]
        for i, state in want["state"].items():
            for name, value in state.items():
                mine = got["state"][i][name]
                if isinstance(value, torch.Tensor):
                    assert torch.equal(mine, value), (r["rank"], i, name)
                else:
                    assert mine == value, (r["rank"], i, name)
    f0, f1 = (r["final"] for r in results)
    for k in f0:
        if "running" not in k and "num_batches" not in k:
            assert torch.equal(f0[k], f1[k]), k
