"""``gradsync.torch.join``: uneven inputs, like DDP's ``Join`` context.

    with gradsync.torch.join(optimizer):
        for batch in my_shard:          # shards of different lengths
            loss(model(batch)).backward()
            optimizer.step()
            optimizer.zero_grad()

When this trainer's loop ends, the block's exit tells the daemon it joined:
the other trainers keep iterating while it contributes zeros, and the exit
returns once every trainer of the job has joined. An exception inside the
block propagates without joining (the job then fails for the others as
usual). Unlike DDP, the joined trainer's model is not refreshed from the
last one to join: its parameters stay where its last step left them, and
``broadcast_buffers`` is paused inside the block (buffers stay local).
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from .optimizer import DistributedOptimizer


@contextlib.contextmanager
def join(optimizer: DistributedOptimizer,
         divide_by_initial_world_size: bool = True) -> Iterator[None]:
    """Args:
        optimizer: the trainer's ``DistributedOptimizer``.
        divide_by_initial_world_size: DDP's argument: True divides every
            average by the world size, False by the trainers still active in
            that iteration; every trainer must pass the same.
    """
    # A joined trainer takes part in no broadcast (DDP's Join shadows them;
    # gradsync does not yet): broadcast_buffers pauses inside the block, on
    # every trainer alike since all enter it.
    paused = optimizer._buffers_paused
    optimizer._buffers_paused = True
    try:
        yield
        optimizer.join(divide_by_initial_world_size)
    finally:
        optimizer._buffers_paused = paused
