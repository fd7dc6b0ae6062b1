"""PyTorch integration of gradsync.

- ``DistributedOptimizer(optimizer, named_parameters)``: Horovod-style data
  parallelism; on CPU the ``.grad`` tensors are views of the daemon's
  shared-memory arena (zero copy).
- ``broadcast_parameters(params, root_rank=0)`` and
  ``broadcast_optimizer_state(optimizer, root_rank=0)``: Horovod's calls of
  the same names (every replica takes the root rank's values).
- ``join(optimizer)``: uneven inputs (DDP's ``Join``): a trainer that runs
  out of data contributes zeros until every trainer has joined.
- ``allreduce_hook`` with ``AllreduceHookState``: a DDP communication hook
  for users who keep ``torch.nn.parallel.DistributedDataParallel``.
"""
from __future__ import annotations

import importlib.util

# `torch` here is the real PyTorch (absolute imports), not this package.
if importlib.util.find_spec("torch") is None:  # pragma: no cover - environment
    raise ImportError("gradsync.torch needs PyTorch: install torch (Debian: python3-torch, "
                      "for /usr/bin/python3)")

from .broadcast import broadcast_optimizer_state, broadcast_parameters
from .ddp_hook import AllreduceHookState, allreduce_hook
from .join import join
from .optimizer import DistributedOptimizer

__all__ = ["DistributedOptimizer", "AllreduceHookState", "allreduce_hook", "join",
           "broadcast_parameters", "broadcast_optimizer_state"]
