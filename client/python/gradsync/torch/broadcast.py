"""Replicas that start equal: Horovod's ``broadcast_parameters`` and
``broadcast_optimizer_state``, over ``gs_broadcast``.

    opt = gst.DistributedOptimizer(torch.optim.Adam(model.parameters()),
                                   model.named_parameters(), module=model)
    if rank == 0:
        opt.load_state_dict(torch.load("checkpoint.pt"))   # rank 0 only
    gst.broadcast_parameters(model.state_dict(), root_rank=0)
    gst.broadcast_optimizer_state(opt, root_rank=0)

Both run between iterations on every trainer of the job (every trainer
calls them, at the same point of its loop). Tensors of any dtype travel as
bytes, packed into one buffer: one ``gs_broadcast`` per call. CUDA tensors
on the job's GPU (a job whose gradients are CUDA tensors) are packed into
a device buffer and broadcast device to device (gradsyncd's device staging
and ncclBroadcast), never through host memory; CPU tensors, or CUDA tensors
in a CPU job or on another GPU, through a host buffer. Which client they
use: the one passed, else the process's registered one (the
DistributedOptimizer's or the AllreduceHookState's).
"""
from __future__ import annotations

import io
import weakref
from typing import Any, Iterable, List, Mapping, Optional, Tuple, Union

import torch

from ..client import Client
from ..errors import InvalidArgumentError, StateError
from .coalesced import broadcast_once, job_device

__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_tensors"]

# The client the last DistributedOptimizer / AllreduceHookState of this
# process registered (weakly: closing it is not prevented).
_current: Optional["weakref.ReferenceType[Client]"] = None


def set_current_client(client: Client) -> None:
    """Makes ``client`` the one the broadcasts use by default."""
    global _current
    _current = weakref.ref(client)


def _client(client: Optional[Client]) -> Client:
    if client is not None:
        return client
    c = _current() if _current is not None else None
    if c is None:
        raise StateError("no gradsync client in this process: build the DistributedOptimizer "
                         "(or AllreduceHookState) first, or pass client=",
                         operation="gs_broadcast")
    return c


Params = Union[Mapping[str, Any], Iterable[Tuple[str, Any]]]


def _named_tensors(params: Params) -> List[Tuple[str, torch.Tensor]]:
    """Horovod's order: a mapping (state_dict) sorted by name; pairs
    (named_parameters) as given. Non-tensor entries (a module's extra state)
    are skipped."""
    items = sorted(params.items()) if isinstance(params, Mapping) else list(params)
    out = []
    for item in items:
        if not (isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str)):
            raise InvalidArgumentError(
                "params must be a state_dict or (name, tensor) pairs such as "
                f"model.named_parameters(), got an item of type {type(item).__name__}",
                operation="broadcast_parameters")
        if isinstance(item[1], torch.Tensor):
            out.append((item[0], item[1]))
    return out


def broadcast_tensors(tensors: List[torch.Tensor], root_rank: int = 0, *,
                      client: Optional[Client] = None,
                      timeout_s: Optional[float] = None) -> None:
    """Copies the root rank's values into ``tensors`` in place, on every
    trainer (the same list, same shapes and dtypes, everywhere). All on
    the job's GPU: device to device; else through a host buffer."""
    c = _client(client)
    broadcast_once(tensors, c, root_rank, timeout_s)


def broadcast_parameters(params: Params, root_rank: int = 0, *,
                         client: Optional[Client] = None,
                         timeout_s: Optional[float] = None) -> None:
    """Horovod's ``broadcast_parameters``: every tensor of ``params`` (a
    ``state_dict``, e.g. ``model.state_dict()`` with buffers, or
    ``model.named_parameters()``) takes the root rank's value, in place.
    Every trainer passes the same names, shapes and dtypes (a different
    total size fails the job with MismatchError)."""
    broadcast_tensors([t for _, t in _named_tensors(params)], root_rank, client=client,
                      timeout_s=timeout_s)


def broadcast_object(obj: Any, root_rank: int = 0, *, client: Optional[Client] = None,
                     timeout_s: Optional[float] = None) -> Any:
    """The root's ``obj`` on every trainer (pickled by ``torch.save``; the
    size goes first, so only the root needs to know it)."""
    c = _client(client)
    root = c.rank == root_rank
    payload = b""
    if root:
        stream = io.BytesIO()
        torch.save(obj, stream)
        payload = stream.getvalue()
    size = torch.tensor([len(payload)], dtype=torch.int64)
    c.broadcast(size.data_ptr(), 8, root_rank, timeout_s)
    buf = torch.empty(int(size.item()), dtype=torch.uint8)
    if root:
        buf.copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
    c.broadcast(buf.data_ptr(), buf.numel(), root_rank, timeout_s)
    if root:
        return obj
    return torch.load(io.BytesIO(buf.numpy().tobytes()), map_location="cpu")


# Where a tensor of the root's optimizer state goes: (_SLOT, index, shape,
# dtype name, on a GPU). Its bytes travel apart from the pickled structure,
# on the GPU when they live there. Plain values only, which torch.load's
# weights_only mode accepts.
_SLOT = "__gradsync_broadcast_tensor__"


def _is_slot(obj: Any) -> bool:
    return type(obj) is tuple and len(obj) == 5 and obj[0] == _SLOT


def _take_tensors(obj: Any, out: List[torch.Tensor]) -> Any:
    """``obj`` with every tensor replaced by a slot; the tensors in ``out``."""
    if isinstance(obj, torch.Tensor):
        out.append(obj)
        return (_SLOT, len(out) - 1, list(obj.shape), str(obj.dtype).split(".")[-1], obj.is_cuda)
    if isinstance(obj, dict):
        return {k: _take_tensors(v, out) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(_take_tensors(v, out) for v in obj)
    return obj


def _put_tensors(obj: Any, tensors: List[torch.Tensor]) -> Any:
    if _is_slot(obj):
        return tensors[obj[1]]
    if isinstance(obj, dict):
        return {k: _put_tensors(v, tensors) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(_put_tensors(v, tensors) for v in obj)
    return obj


def _slots(obj: Any, out: List[tuple]) -> List[tuple]:
    if _is_slot(obj):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _slots(v, out)
    elif type(obj) in (list, tuple):
        for v in obj:
            _slots(v, out)
    return out


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0, *,
                              client: Optional[Client] = None,
                              timeout_s: Optional[float] = None) -> None:
    """Horovod's ``broadcast_optimizer_state``: the root rank's whole
    optimizer state (every tensor and scalar of ``state`` and
    ``param_groups``: Adam's moments and step, learning rates...) becomes
    every trainer's, including state that exists only on the root (a
    checkpoint loaded on rank 0 only). Works on a DistributedOptimizer or
    the optimizer it wraps; ``load_state_dict`` puts each tensor on its
    parameter's device. The structure travels pickled; the tensors' bytes
    with broadcast_tensors, CUDA ones device to device."""
    c = _client(client)
    root = c.rank == root_rank
    tensors: List[torch.Tensor] = []
    skeleton = _take_tensors(optimizer.state_dict(), tensors) if root else None
    skeleton = broadcast_object(skeleton, root_rank, client=c, timeout_s=timeout_s)
    slots = sorted(_slots(skeleton, []), key=lambda t: t[1])
    if not root:
        device = job_device(c) or torch.device("cpu")
        tensors = [torch.empty(shape, dtype=getattr(torch, dtype), device=device if cuda else "cpu")
                   for _, _, shape, dtype, cuda in slots]
    # CUDA state and host state apart, so the CUDA bytes stay on the GPU.
    for on_gpu in (True, False):
        group = [tensors[t[1]] for t in slots if t[4] == on_gpu]
        if group:
            broadcast_tensors(group, root_rank, client=c, timeout_s=timeout_s)
    if not root:
        optimizer.load_state_dict(_put_tensors(skeleton, tensors))
