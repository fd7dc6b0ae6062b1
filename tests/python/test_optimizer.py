"""DistributedOptimizer against single-process training on the whole batch.

Real gradsyncd, real trainer processes (trainer_worker.py), real shared
memory. Each trainer trains on its shard; after the steps every trainer's
parameters must equal what one process computes on the whole batch.
"""
from __future__ import annotations

import pytest
import torch

import gs_testlib as lib

DTYPES = {"float32": torch.float32, "float64": torch.float64}
# fp32: rtol 1e-5 (atol 1e-6 for elements near zero, where only an absolute
# bound makes sense: gradsync sums shard means, one process sums rows).
TOLERANCE = {"float32": dict(rtol=1e-5, atol=1e-6), "float64": dict(rtol=1e-10, atol=1e-12)}


def assert_matches(state: dict, ref: dict, dtype: str, who: str) -> None:
    assert state.keys() == ref.keys()
    for k, want in ref.items():
        got = state[k]
        assert got.dtype == want.dtype, k
        assert torch.allclose(got, want, **TOLERANCE[dtype]), (
            f"{who}: {k} differs from single-process training: max |diff| "
            f"{(got - want).abs().max().item():.3g}, max |ref| {want.abs().max().item():.3g}")


def assert_replicas_identical(results: list) -> None:
    first = results[0]["state"]
    for r in results[1:]:
        for k, v in first.items():
            assert torch.equal(r["state"][k], v), f"rank {r['rank']}: {k} differs from rank 0"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("world", [2, 3])
def test_sgd_momentum_matches_single_process(gradsyncd, world: int, dtype: str) -> None:
    """20 steps of SGD+momentum on N shards == 20 steps on the whole batch."""
    cluster = gradsyncd(world)
    results = cluster.run(world, ["--model=mlp", f"--dtype={dtype}", "--steps=20", "--batch=24"])
    ref = lib.reference("mlp", DTYPES[dtype], steps=20, global_batch=24)
    for r in results:
        assert r["world"] == world
        # Zero copy: every .grad is a view of the daemon's arena, the same
        # tensor from the first step to the last.
        assert r["grads_in_arena"] and r["views_kept"]
        assert_matches(r["state"], ref, dtype, f"rank {r['rank']}")
    assert_replicas_identical(results)
    assert sorted(r["rank"] for r in results) == list(range(world))


def expected_unused(step: int, rank: int, world: int, global_batch: int) -> set:
    """What Mixed leaves without a gradient on this trainer at this step."""
    x, _ = lib.batch(step, 0, global_batch, torch.float32)
    shard = global_batch // world
    gate_used = step % 3 != 0 and bool((x[rank * shard:(rank + 1) * shard, 0] > 1.2).any())
    return {"never"} | (set() if gate_used else {"gate"})


@pytest.mark.parametrize("world,dtype", [(3, "float32"), (2, "float64")])
def test_unused_tiny_and_oversized_parameters(gradsyncd, world: int, dtype: str) -> None:
    """A parameter unused on some trainers on some steps (and on all trainers
    on others), one never used, a 0-dim (1-element) parameter, a parameter
    larger than the daemon's bucket cap (10 KiB here), a frozen parameter,
    and `p.grad = None` in the middle of training: same result as one
    process (whose gradients are zeroed, not None, like gradsync's)."""
    steps, batch = 20, 24
    cluster = gradsyncd(world, "--bucket-cap-mb=0.01", "--first-bucket-cap-mb=0.005")
    results = cluster.run(world, ["--model=mixed", f"--dtype={dtype}", f"--steps={steps}",
                                  f"--batch={batch}", "--set-grad-none-at=7"])
    ref = lib.reference("mixed", DTYPES[dtype], steps=steps, global_batch=batch)
    bytes_per = torch.finfo(DTYPES[dtype]).bits // 8
    assert ref["big.weight"].numel() * bytes_per > 0.01 * 2 ** 20  # really over the cap
    rank_dependent = False
    for r in results:
        assert "frozen" not in r["names"] and "scale" in r["names"]
        assert r["views_kept"]
        assert_matches(r["state"], ref, dtype, f"rank {r['rank']}")
        # find_unused_parameters: the unused ones are reported by name.
        for step, reported in enumerate(r["unused"]):
            want = expected_unused(step, r["rank"], world, batch)
            assert set(reported) == want, f"rank {r['rank']} step {step}"
    for step in range(steps):
        sets = {frozenset(r["unused"][step]) for r in results}
        rank_dependent |= len(sets) > 1
    assert rank_dependent, "the data never left `gate` unused on only some trainers"
    assert_replicas_identical(results)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_no_sync_accumulation_equals_concatenated_batch(gradsyncd, dtype: str) -> None:
    """3 micro-batches under no_sync() + 1 synchronized, 2 trainers ==
    one step on the 4 global micro-batches concatenated, for 6 steps."""
    cluster = gradsyncd(2)
    results = cluster.run(2, ["--model=mlp", f"--dtype={dtype}", "--steps=6", "--batch=8",
                              "--accumulate=4"])
    ref = lib.reference("mlp", DTYPES[dtype], steps=6, global_batch=8, accumulate=4)
    for r in results:
        assert_matches(r["state"], ref, dtype, f"rank {r['rank']}")
    assert_replicas_identical(results)
