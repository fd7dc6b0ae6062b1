"""DistributedOptimizer as a torch optimizer, in this process, with one
trainer (a daemon with --local-size 1; the average over one trainer is its
own gradient, so results equal plain local training exactly)."""
from __future__ import annotations

from typing import List

import pytest
import torch
import torch.nn.functional as F

import gradsync
import gradsync.torch as gst
import gs_testlib as lib


def local_training(steps: int) -> dict:
    return lib.reference("mlp", torch.float32, steps=steps, global_batch=8)


def make(cluster, model: torch.nn.Module, **kwargs) -> gst.DistributedOptimizer:
    return gst.DistributedOptimizer(lib.make_sgd(model), model.named_parameters(),
                                    socket_path=cluster.socket, local_rank=0,
                                    connect_timeout_s=10, wait_timeout_s=10, **kwargs)


@pytest.fixture
def one_trainer(gradsyncd):
    torch.set_num_threads(1)
    return gradsyncd(1)


def test_is_a_torch_optimizer_sharing_the_wrapped_state(one_trainer) -> None:
    model = lib.make_model("mlp", torch.float32)
    opt = make(one_trainer, model)
    try:
        assert isinstance(opt, torch.optim.Optimizer)
        assert opt.param_groups is opt.optimizer.param_groups
        assert (opt.rank, opt.world_size) == (0, 1)
        # Zero copy: each .grad lives in the daemon's arena slot.
        for i, p in enumerate(model.parameters()):
            assert p.grad.data_ptr() == opt.client.buffer_address(i)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        lib.train(model, opt, steps=2, global_batch=8, on_step=lambda s: sched.step())
        assert opt.optimizer.param_groups[0]["lr"] == pytest.approx(0.05 / 4)
        state = opt.state_dict()
        assert state["state"] and state == opt.optimizer.state_dict()
        with pytest.raises(gradsync.StateError, match="layout is fixed"):
            opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(1))]})
        # set_to_none=False zeroes the views in place.
        ptrs = [p.grad.data_ptr() for p in model.parameters()]
        opt.zero_grad(set_to_none=False)
        assert [p.grad.data_ptr() for p in model.parameters()] == ptrs
        assert all(not p.grad.any() for p in model.parameters())
        # The default drops them; the next backward refills the arena, and
        # .grad is its view again, holding the average after the step.
        opt.zero_grad()
        assert all(p.grad is None for p in model.parameters())
        lib.train(model, opt, steps=1, global_batch=8)
        assert [p.grad.data_ptr() for p in model.parameters()] == ptrs
    finally:
        opt.close()
    assert all(p.grad is not None for p in model.parameters())  # private copies now
    opt.zero_grad()  # the wrapped optimizer's, after close()
    with pytest.raises(gradsync.StateError, match="closed"):
        opt.step()


def test_post_accumulate_grad_hook_branch(one_trainer, monkeypatch) -> None:
    """torch >= 2.1 path (Tensor.register_post_accumulate_grad_hook), emulated
    on torch 1.13 so that it runs here: the hook receives the parameter."""
    calls: List[torch.Tensor] = []
    if not hasattr(torch.Tensor, "register_post_accumulate_grad_hook"):
        keep = []

        def emulated(self: torch.Tensor, hook):
            node = self.expand_as(self).grad_fn.next_functions[0][0]
            keep.append(node)
            calls.append(self)
            return node.register_hook(lambda grad_inputs, grad_outputs: hook(self))

        monkeypatch.setattr(torch.Tensor, "register_post_accumulate_grad_hook", emulated,
                            raising=False)
    model = lib.make_model("mlp", torch.float32)
    opt = make(one_trainer, model)
    try:
        lib.train(model, opt, steps=5, global_batch=8)
        assert opt.unused_parameters == ()  # every hook fired and marked
    finally:
        opt.close()
    if calls:
        assert len(calls) == len(list(model.parameters()))
    ref = local_training(5)
    for k, v in model.state_dict().items():
        assert torch.equal(v, ref[k]), k


def test_grad_set_to_none_or_replaced_is_adopted(one_trainer) -> None:
    """torch 2.x's model.zero_grad() sets .grad to None; an out-of-place
    update replaces it: the next gradient still reaches the arena."""
    model = lib.make_model("mlp", torch.float32)
    opt = make(one_trainer, model)
    try:
        views = [p.grad for p in model.parameters()]

        def disturb(step: int) -> None:
            for j, p in enumerate(model.parameters()):
                p.grad = None if (step + j) % 2 else torch.zeros_like(p)

        lib.train(model, opt, steps=6, global_batch=8, on_step=disturb)
        for p, v in zip(model.parameters(), views):
            opt.zero_grad(set_to_none=False)
            assert p.grad is v
    finally:
        opt.close()
    ref = local_training(6)
    for k, v in model.state_dict().items():
        assert torch.equal(v, ref[k]), k


def test_backward_passes_per_step(one_trainer) -> None:
    """Two backward passes per step (half the batch each, loss / 2) equal one
    pass over the whole batch."""
    model = lib.make_model("mlp", torch.float32)
    opt = make(one_trainer, model, backward_passes_per_step=2)
    try:
        for step in range(4):
            opt.zero_grad()
            x, y = lib.batch(step, 0, 8, torch.float32)
            for half in (slice(0, 4), slice(4, 8)):
                (F.mse_loss(model(x[half], step), y[half]) / 2).backward()
            opt.step()
    finally:
        opt.close()
    ref = local_training(4)
    for k, v in model.state_dict().items():
        assert torch.allclose(v, ref[k], rtol=1e-5, atol=1e-7), k


def test_parameters_missing_from_named_parameters_are_refused() -> None:
    model = lib.make_model("mlp", torch.float32)
    named = [(n, p) for n, p in model.named_parameters() if not n.startswith("head")]
    with pytest.raises(gradsync.InvalidArgumentError, match="not in named_parameters"):
        gst.DistributedOptimizer(lib.make_sgd(model), named)
    with pytest.raises(gradsync.InvalidArgumentError, match="named_parameters must yield"):
        gst.DistributedOptimizer(lib.make_sgd(model), model.parameters())
    odd = torch.nn.Parameter(torch.ones(2, dtype=torch.complex64))
    with pytest.raises(gradsync.InvalidArgumentError, match="complex64"):
        gst.DistributedOptimizer(torch.optim.SGD([odd], lr=0.1), [("odd", odd)])
