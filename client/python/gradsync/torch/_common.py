"""What DistributedOptimizer and the DDP hook share: dtype mapping, views of
the daemon's gradient buffers (shared memory on CPU, device memory on CUDA),
the stream readiness is recorded on, the "gradient is final" hook, and
collecting named parameters."""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from ..client import Client, DType, TensorSpec
from ..errors import InvalidArgumentError

_TO_GS: Dict[torch.dtype, DType] = {
    torch.float32: DType.FLOAT32,
    torch.float64: DType.FLOAT64,
    torch.float16: DType.FLOAT16,
    torch.bfloat16: DType.BFLOAT16,
}


def gs_dtype(dtype: torch.dtype, name: str = "") -> DType:
    """The gradsync dtype of a torch dtype; a clear error for unsupported ones."""
    try:
        return _TO_GS[dtype]
    except KeyError:
        raise InvalidArgumentError(
            f"parameter {name!r} has dtype {dtype}: gradsync synchronizes float32, float64, "
            "float16 and bfloat16 gradients") from None


def tensor_spec(name: str, p: torch.Tensor, cuda_ptr: Optional[int] = None) -> TensorSpec:
    """The layout entry of parameter ``p``'s gradient."""
    device = -1 if p.device.type == "cpu" else (p.device.index or 0)
    if p.device.type not in ("cpu", "cuda"):
        raise InvalidArgumentError(f"parameter {name!r} is on {p.device}: gradsync supports "
                                   "CPU and CUDA tensors")
    return TensorSpec(name, gs_dtype(p.dtype, name), p.numel(), device, cuda_ptr)


def arena_tensor(client: Client, index: int, dtype: torch.dtype,
                 shape: Sequence[int]) -> torch.Tensor:
    """A tensor viewing CPU gradient ``index``'s shared-memory slot (zero copy).

    torch.frombuffer keeps the ctypes buffer object alive, and that object
    keeps the Client alive: the mapping cannot disappear under the tensor
    through garbage collection (only through an explicit ``close()``).
    """
    return torch.frombuffer(client.buffer(index), dtype=dtype).view(tuple(shape))


# __cuda_array_interface__ type strings; bf16 has none, so it is viewed as
# int16 and reinterpreted (same size, no conversion).
_CUDA_TYPESTR: Dict[torch.dtype, Tuple[str, Optional[torch.dtype]]] = {
    torch.float32: ("<f4", None),
    torch.float64: ("<f8", None),
    torch.float16: ("<f2", None),
    torch.bfloat16: ("<i2", torch.bfloat16),
}


class _DeviceRange:
    """A range of device memory exposed through ``__cuda_array_interface__``
    (version 3), so that ``torch.as_tensor`` views it without copying.

    torch keeps this object alive as long as a tensor views it, and this
    object keeps the Client alive: the daemon's flat buffer stays mapped
    under every such tensor until an explicit ``close()``. ``stream`` is None
    because the memory needs no synchronization to be viewed.
    """

    def __init__(self, client: Client, address: int, numel: int, typestr: str) -> None:
        self._gradsync_client = client
        self.__cuda_array_interface__ = {
            "shape": (numel,), "typestr": typestr, "data": (address, False),
            "strides": None, "stream": None, "version": 3,
        }


def device_tensor(client: Client, index: int, dtype: torch.dtype, shape: Sequence[int],
                  device: torch.device) -> torch.Tensor:
    """A tensor viewing CUDA gradient ``index``'s device buffer (zero copy):
    the daemon's flat buffer, laid out so every bucket is one range."""
    numel = 1
    for d in shape:
        numel *= int(d)
    typestr, reinterpret = _CUDA_TYPESTR[dtype]
    flat = torch.as_tensor(_DeviceRange(client, client.buffer_address(index), numel, typestr),
                           device=device)
    if reinterpret is not None:
        flat = flat.view(reinterpret)
    return flat.view(tuple(shape))


def grad_tensor(client: Client, index: int, p: torch.Tensor,
                shape: Optional[Sequence[int]] = None) -> torch.Tensor:
    """The registered gradient buffer of parameter ``p`` as a tensor: a view
    of the shared-memory arena (CPU) or of the daemon's device buffer (CUDA)."""
    shape = tuple(p.shape) if shape is None else tuple(shape)
    if p.device.type == "cuda":
        return device_tensor(client, index, p.dtype, shape, p.device)
    return arena_tensor(client, index, p.dtype, shape)


class StreamFollower:
    """Tells the client which CUDA stream to record readiness events on:
    torch's current stream on the gradient's device at the time it is marked
    (autograd runs a parameter's backward on the stream its forward used, so
    its last write to ``.grad`` is queued there). Calls into the C library
    only when the stream changes."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._current: Optional[int] = None

    def before_mark(self, device: torch.device) -> None:
        if device.type != "cuda":
            return
        stream = torch.cuda.current_stream(device).cuda_stream
        if stream != self._current:
            self._client.set_cuda_stream(stream)
            self._current = stream


class _AccumulateGradHook:
    """A hook on a parameter's AccumulateGrad node (torch < 2.1).

    Holds the node itself: the parameter only references its AccumulateGrad
    node weakly, so without this reference the node (and the hook on it)
    would be freed after the first backward and recreated without the hook.
    """

    def __init__(self, p: torch.Tensor, fn: Callable[[], None]) -> None:
        with torch.enable_grad():  # expand_as records no grad_fn under no_grad
            self.node = p.expand_as(p).grad_fn.next_functions[0][0]
        # Post-hook: runs after the node accumulated into p.grad.
        self.handle = self.node.register_hook(lambda grad_inputs, grad_outputs: fn())

    def remove(self) -> None:
        self.handle.remove()
        self.node = None


def register_grad_ready_hook(p: torch.Tensor, fn: Callable[[], None]):
    """Calls ``fn()`` each time autograd has finished accumulating into ``p.grad``.

    torch >= 2.1 has ``Tensor.register_post_accumulate_grad_hook`` for exactly
    this; older versions get the equivalent post-hook on the AccumulateGrad
    node (what Horovod does). Returns a handle with ``remove()``.
    """
    if not p.requires_grad or not p.is_leaf:
        raise InvalidArgumentError("gradsync hooks need leaf tensors that require grad")
    if hasattr(p, "register_post_accumulate_grad_hook"):
        return p.register_post_accumulate_grad_hook(lambda param: fn())
    return _AccumulateGradHook(p, fn)


def unique_named_parameters(
        named: Iterable[Tuple[str, torch.Tensor]]) -> List[Tuple[str, torch.Tensor]]:
    """(name, parameter) pairs, each parameter once (shared weights keep their
    first name), names checked for uniqueness: the daemon identifies tensors
    by name in its errors, and every trainer must list them identically."""
    out: List[Tuple[str, torch.Tensor]] = []
    seen_params = set()
    seen_names = set()
    for item in named:
        if not (isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str)):
            raise InvalidArgumentError(
                f"named_parameters must yield (name, parameter) pairs, got "
                f"{type(item).__name__} (pass model.named_parameters())")
        name, p = item
        if id(p) in seen_params:
            continue
        if name in seen_names:
            raise InvalidArgumentError(f"parameter name {name!r} appears twice")
        seen_params.add(id(p))
        seen_names.add(name)
        out.append((name, p))
    return out
