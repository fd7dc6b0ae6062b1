"""Models, data and the training loop shared by the trainer subprocesses
(trainer_worker.py) and the single-process references computed in the tests.

Data-parallel equivalence needs: identical initial weights (seeded
construction), identical global batches on every trainer (seeded by step),
and a per-shard *mean* loss, so that the average over trainers of the shard
gradients equals the gradient of the whole-batch mean loss.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

DIM = 8


def batch(step: int, micro: int, size: int,
          dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """Global micro-batch ``micro`` of step ``step`` (same on every trainer)."""
    g = torch.Generator().manual_seed(1000 * step + micro + 17)
    x = torch.randn(size, DIM, generator=g, dtype=torch.float64)
    y = torch.sin(x @ torch.linspace(-1, 1, DIM, dtype=torch.float64)).unsqueeze(1)
    return x.to(dtype), y.to(dtype)


class MLP(torch.nn.Module):
    """A plain MLP (the equivalence and no_sync tests)."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(DIM, hidden)
        self.fc2 = torch.nn.Linear(hidden, hidden)
        self.head = torch.nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
        return self.head(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))


class Mixed(torch.nn.Module):
    """Edge cases of the layout:

    - ``scale``: a 0-dim parameter (1 element);
    - ``big.weight``: 64 x 64 elements, larger than the bucket cap the tests
      give the daemon (10 KiB);
    - ``gate``: used only when the trainer's shard has a row with x0 > 1.2,
      and never on steps divisible by 3: unused on some trainers on some
      steps, on every trainer on others;
    - ``never``: never used (always marked unused);
    - ``frozen``: requires_grad=False (not registered).
    """

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(DIM, 64)
        self.big = torch.nn.Linear(64, 64)
        self.head = torch.nn.Linear(64, 1)
        self.scale = torch.nn.Parameter(torch.tensor(1.0))
        self.gate = torch.nn.Parameter(torch.full((4,), 0.5))
        self.never = torch.nn.Parameter(torch.ones(3))
        self.frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)

    def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
        h = torch.tanh(self.big(torch.tanh(self.fc1(x))))
        out = self.head(h) * self.scale
        mask = x[:, 0] > 1.2
        if step % 3 != 0 and bool(mask.any()):
            out = out + (mask.to(x.dtype) * (x[:, :4] @ self.gate)).unsqueeze(1)
        return out


MODELS: Dict[str, Callable[[], torch.nn.Module]] = {"mlp": MLP, "mixed": Mixed}


def make_model(name: str, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    return MODELS[name]().to(dtype)


def make_sgd(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD([p for p in model.parameters() if p.requires_grad],
                           lr=0.05, momentum=0.9)


def train(model: torch.nn.Module, opt, *, steps: int, global_batch: int, rank: int = 0,
          world: int = 1, accumulate: int = 1, dtype: torch.dtype = torch.float32,
          no_sync: Optional[Callable[[], contextlib.AbstractContextManager]] = None,
          on_step: Optional[Callable[[int], None]] = None) -> List[float]:
    """Trains ``steps`` optimizer steps on this trainer's shard.

    With ``accumulate`` = K, each step runs K micro-batches (the first K-1
    inside ``no_sync()``), each loss scaled by 1/K. The single-process
    reference passes world=1 (and, for accumulation, accumulate=1 with the
    K micro-batches concatenated: see ``reference``).
    """
    shard = global_batch // world
    losses = []
    for step in range(steps):
        opt.zero_grad()
        total = 0.0
        for micro in range(accumulate):
            x, y = batch(step, micro, global_batch, dtype)
            x, y = x[rank * shard:(rank + 1) * shard], y[rank * shard:(rank + 1) * shard]
            ctx = no_sync() if (no_sync is not None and micro < accumulate - 1) \
                else contextlib.nullcontext()
            with ctx:
                loss = F.mse_loss(model(x, step), y) / accumulate
                loss.backward()
            total += loss.item()
        opt.step()
        losses.append(total)
        if on_step is not None:
            on_step(step)
    return losses


def reference(model_name: str, dtype: torch.dtype, steps: int, global_batch: int,
              accumulate: int = 1, skip_steps: Sequence[int] = ()) -> Dict[str, torch.Tensor]:
    """Single-process training on the whole batch (all micro-batches of a
    step concatenated), gradients zeroed (never None) like gradsync's.
    Steps in ``skip_steps`` compute gradients but take no optimizer step
    (gradsyncd --nonfinite=skip)."""
    torch.set_num_threads(1)
    model = make_model(model_name, dtype)
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    opt = make_sgd(model)
    for step in range(steps):
        opt.zero_grad(set_to_none=False)
        parts = [batch(step, m, global_batch, dtype) for m in range(accumulate)]
        x = torch.cat([p[0] for p in parts])
        y = torch.cat([p[1] for p in parts])
        F.mse_loss(model(x, step), y).backward()
        if step not in skip_steps:
            opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
