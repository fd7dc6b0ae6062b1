"""One packed buffer for a fixed list of tensors broadcast again and again.

DDP's ``broadcast_buffers`` broadcasts the same tensors (BatchNorm's
running statistics) before every forward. Laying them out once, in one
buffer with a view per tensor, makes each broadcast one ``gs_broadcast``
and one copy per tensor, with no allocation and no per-tensor slicing or
reshaping on the step's path (the packing used to cost about as much as
the daemon's round trips: docs/PERFORMANCE.md, buffers_bench).
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from ..client import Client

_ALIGN = 16  # each tensor at an offset aligned for any dtype


class CoalescedBroadcast:
    """``tensors`` (the same list, shapes and dtypes on every trainer)
    packed into one buffer: on ``device`` when every tensor lives there (a
    job's GPU: broadcast device to device), else in host memory."""

    def __init__(self, tensors: Sequence[torch.Tensor], device: Optional[torch.device]) -> None:
        # The tensors themselves (not detached aliases): a parameter whose
        # .data is reassigned later is still the one copied.
        self._tensors = list(tensors)
        self._on_device = (device is not None and bool(self._tensors)
                           and all(t.device == device for t in self._tensors))
        self._device = device if self._on_device else None
        offsets, total = [], 0
        for t in self._tensors:
            offsets.append(total)
            total += (t.numel() * t.element_size() + _ALIGN - 1) // _ALIGN * _ALIGN
        self._buffer = torch.empty(total, dtype=torch.uint8,
                                   device=self._device if self._on_device else "cpu")
        # Tensors of no elements have nothing to carry (and no view to take).
        self._pairs = []
        for t, offset in zip(self._tensors, offsets):
            n = t.numel() * t.element_size()
            if n:
                view = self._buffer[offset:offset + n].view(t.dtype).view(t.shape)
                self._pairs.append((t, view))

    def __call__(self, client: Client, root_rank: int,
                 timeout_s: Optional[float] = None) -> None:
        """Copies the root rank's values into the tensors, in place."""
        root = client.rank == root_rank
        with torch.no_grad():
            if root:
                for t, view in self._pairs:
                    view.copy_(t)
            if self._on_device:
                # gs_broadcast copies on the client's stream: torch's work on
                # the buffer (the root's packing, the last call's unpacking)
                # first.
                torch.cuda.current_stream(self._device).synchronize()
            # A device buffer comes back with its bytes in device memory (the
            # client synchronized its copies), so torch's streams may read it.
            client.broadcast(self._buffer.data_ptr(), self._buffer.numel(), root_rank, timeout_s)
            if not root:
                for t, view in self._pairs:
                    t.copy_(view)


def job_device(client: Client) -> Optional[torch.device]:
    """The GPU of the job's gradients (one per trainer), or None for a CPU
    job: device buffers can be broadcast only there."""
    devices = {s.device for s in client.specs}
    if len(devices) != 1 or min(devices) < 0:
        return None
    return torch.device("cuda", min(devices))


def broadcast_once(tensors: List[torch.Tensor], client: Client, root_rank: int,
                   timeout_s: Optional[float]) -> None:
    CoalescedBroadcast(tensors, job_device(client))(client, root_rank, timeout_s)
