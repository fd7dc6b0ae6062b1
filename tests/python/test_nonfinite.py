"""DistributedOptimizer under gradsyncd --nonfinite=skip: a NaN in one
trainer's gradients makes every trainer skip that optimizer step, so every
replica equals single-process training that skipped it; the default
(--nonfinite=error) fails every trainer naming the culprit.

Real gradsyncd, real trainer processes (trainer_worker.py).
"""
from __future__ import annotations

import pytest
import torch

import gs_testlib as lib

NAN_AT = 3
ARGS = ["--model=mlp", "--dtype=float64", "--steps=6", "--batch=24", f"--nan-at={NAN_AT}",
        "--nan-rank=1"]


def test_skip_mode_skips_the_step_on_every_trainer(gradsyncd) -> None:
    cluster = gradsyncd(2, "--nonfinite=skip")
    results = cluster.run(2, ARGS)
    ref = lib.reference("mlp", torch.float64, steps=6, global_batch=24, skip_steps=(NAN_AT,))
    applied = lib.reference("mlp", torch.float64, steps=6, global_batch=24)
    first = results[0]["state"]
    for r in results:
        assert r["skipped_steps"] == 1, r["rank"]
        for k, want in ref.items():
            assert torch.equal(r["state"][k], first[k]), f"rank {r['rank']}: {k} differs"
            assert torch.allclose(r["state"][k], want, rtol=1e-10, atol=1e-12), k
    assert any(not torch.allclose(first[k], applied[k], rtol=1e-6, atol=1e-9) for k in applied)
    logs = cluster.logs()
    assert logs.count("skipped an optimizer step") == 2, logs  # once per trainer
    assert f"event=nonfinite_step_skipped iteration={NAN_AT}" in logs, logs


def test_error_mode_fails_every_trainer_naming_the_culprit(gradsyncd) -> None:
    cluster = gradsyncd(2)
    trainers = [cluster.start(r, ARGS) for r in range(2)]
    codes = cluster.wait(trainers, 90)
    assert codes == [11, 11], cluster.logs()  # 10 + GS_ERR_INVALID_ARGUMENT
    for t in trainers:
        log = t.log()
        assert "non-finite gradient from rank 1 (local 1, pid " in log, log
        assert f"iteration {NAN_AT}:" in log, log
