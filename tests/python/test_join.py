"""gradsync.torch.join (uneven inputs, DDP's Join) against a single-process
reference of DDP's definition.

Real gradsyncd, three real trainer processes with 10, 7 and 3 batches: each
step sums the shard gradients of the trainers still running and divides by
the world size (divide_by_initial_world_size=True, DDP's default) or by how
many still run. The trainer that ran longest must end where the reference
does.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import gs_testlib as lib

STEPS = [10, 7, 3]
BATCH = 24


def join_reference(steps_per_rank: list, divide_by_active: bool) -> dict:
    torch.set_num_threads(1)
    model = lib.make_model("mlp", torch.float32)
    opt = lib.make_sgd(model)
    world = len(steps_per_rank)
    shard = BATCH // world
    for step in range(max(steps_per_rank)):
        opt.zero_grad(set_to_none=False)
        x, y = lib.batch(step, 0, BATCH, torch.float32)
        active = [r for r in range(world) if steps_per_rank[r] > step]
        divisor = len(active) if divide_by_active else world
        total = sum(F.mse_loss(model(x[r * shard:(r + 1) * shard], step),
                               y[r * shard:(r + 1) * shard]) for r in active)
        (total / divisor).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("divide_by_active", [False, True])
def test_uneven_trainers_match_ddp_join(gradsyncd, divide_by_active: bool) -> None:
    cluster = gradsyncd(len(STEPS))
    args = ["--model=mlp", "--dtype=float32", f"--batch={BATCH}",
            "--join-steps=" + ",".join(str(n) for n in STEPS)]
    if divide_by_active:
        args.append("--join-divide-by-active")
    results = cluster.run(len(STEPS), args)
    ref = join_reference(STEPS, divide_by_active)
    longest = next(r for r in results if r["rank"] == 0)
    assert len(longest["losses"]) == STEPS[0]
    for k, want in ref.items():
        got = longest["state"][k]
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (
            f"{k} differs from DDP's Join: max |diff| {(got - want).abs().max().item():.3g}")
